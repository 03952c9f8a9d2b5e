//! `manifest.json`: what a generation is and every file it holds (size + sha256).

use std::collections::HashSet;
use std::path::{Component, Path};

use ate_core::Fidelity;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// File name of the manifest inside a generation directory (and under a durable key).
pub const MANIFEST_FILE: &str = "manifest.json";

/// One file of a generation, path relative to the generation directory (`/`-separated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// The same facts as the api's `SnapshotRecord`, plus the file list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub atespace: String,
    pub name: String,
    pub generation: u64,
    pub uuid: String,
    #[serde(with = "fidelity_text")]
    pub fidelity: Fidelity,
    /// Template the generation was captured under (`ns/name`).
    pub template: String,
    pub sandbox_class: String,
    pub node: String,
    pub boot_id: String,
    pub created_unix_ms: i64,
    /// Why the fidelity is lower than the template asked for; empty when it is not.
    #[serde(default)]
    pub reason: String,
    /// Sorted by path.
    pub files: Vec<FileEntry>,
}

/// `FIDELITY_MEMORY` etc. on the wire, the same text the store and CLI use.
mod fidelity_text {
    use ate_core::Fidelity;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(f: &Fidelity, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(f.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Fidelity, D::Error> {
        let text = String::deserialize(d)?;
        Fidelity::parse(&text).ok_or_else(|| D::Error::custom(format!("unknown fidelity {text:?}")))
    }
}

impl Manifest {
    /// Strict parse: unknown fields, an unknown `format_version`, unsafe paths, duplicate paths and
    /// malformed checksums are all errors (the file list decides where downloads write).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        // Version first, leniently, so a newer format gets a clear message rather than
        // "unknown field".
        #[derive(Deserialize)]
        struct Probe {
            format_version: Option<serde_json::Value>,
        }
        let probe: Probe = serde_json::from_slice(bytes)
            .map_err(|e| Error::InvalidManifest(format!("not a JSON object: {e}")))?;
        match probe.format_version {
            None => return Err(Error::InvalidManifest("format_version missing".into())),
            Some(v) => match v.as_u64() {
                Some(n) if n == u64::from(FORMAT_VERSION) => {}
                Some(n) => {
                    return Err(Error::UnsupportedFormat {
                        found: n,
                        supported: FORMAT_VERSION,
                    });
                }
                None => {
                    return Err(Error::InvalidManifest(format!(
                        "format_version {v} is not a number"
                    )));
                }
            },
        }
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| Error::InvalidManifest(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Pretty JSON with a trailing newline; deterministic for a given manifest.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain structs of strings and integers cannot fail.
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Sum of the listed files' sizes (uncompressed). A parsed manifest's sizes never overflow
    /// (`validate` refuses that); a hand-built one saturates rather than panics.
    pub fn total_size(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |sum, f| sum.saturating_add(f.size))
    }

    /// sha256 of [`Manifest::to_json`]: one checksum for the whole generation (the files are
    /// pinned by their own checksums inside it). Fits `SnapshotRecord::checksum`.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.to_json()))
    }

    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Names of the volumes archived in this generation.
    pub fn volumes(&self) -> Vec<String> {
        self.files
            .iter()
            .filter_map(|f| {
                f.path
                    .strip_prefix("volumes/")
                    .and_then(|n| n.strip_suffix(".tar"))
                    .filter(|n| !n.contains('/'))
                    .map(str::to_string)
            })
            .collect()
    }

    pub fn has_rootfs(&self) -> bool {
        self.file(crate::generation::ROOTFS_ARCHIVE).is_some()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.format_version != FORMAT_VERSION {
            return Err(Error::UnsupportedFormat {
                found: u64::from(self.format_version),
                supported: FORMAT_VERSION,
            });
        }
        let mut seen = HashSet::new();
        for f in &self.files {
            check_rel_path(&f.path)?;
            if f.path == MANIFEST_FILE {
                return Err(Error::InvalidManifest("manifest.json lists itself".into()));
            }
            if !seen.insert(f.path.as_str()) {
                return Err(Error::InvalidManifest(format!(
                    "duplicate file {:?}",
                    f.path
                )));
            }
            if f.sha256.len() != 64
                || !f
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(Error::InvalidManifest(format!(
                    "file {:?}: sha256 {:?} is not 64 lowercase hex digits",
                    f.path, f.sha256
                )));
            }
        }
        if self
            .files
            .iter()
            .try_fold(0u64, |sum, f| sum.checked_add(f.size))
            .is_none()
        {
            return Err(Error::InvalidManifest(
                "file sizes add up to more than 2^64 bytes".into(),
            ));
        }
        // A file and a directory of the same name cannot both exist on disk.
        for f in &self.files {
            let dir = format!("{}/", f.path);
            if self.files.iter().any(|g| g.path.starts_with(&dir)) {
                return Err(Error::InvalidManifest(format!(
                    "{:?} is both a file and a directory",
                    f.path
                )));
            }
        }
        Ok(())
    }
}

/// A listed path must stay inside the generation: relative, `/`-separated plain names only.
fn check_rel_path(p: &str) -> Result<()> {
    let bad = |why: &str| Error::InvalidManifest(format!("file path {p:?}: {why}"));
    if p.is_empty() || p.len() > 4096 {
        return Err(bad("empty or too long"));
    }
    if p.contains('\0') || p.contains('\\') {
        return Err(bad("NUL or backslash"));
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(bad("empty, '.' or '..' segment"));
        }
    }
    if !Path::new(p)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(bad("not a plain relative path"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            atespace: "default".into(),
            name: "counter".into(),
            generation: 3,
            uuid: "0b6f3c1e-0000-4000-8000-000000000000".into(),
            fidelity: Fidelity::Memory,
            template: "default/counter".into(),
            sandbox_class: "runc".into(),
            node: "node-a".into(),
            boot_id: "b00t".into(),
            created_unix_ms: 1_700_000_000_000,
            reason: String::new(),
            files: vec![FileEntry {
                path: "criu/pages-1.img".into(),
                size: 4096,
                sha256: "a".repeat(64),
            }],
        }
    }

    #[test]
    fn round_trip_and_fidelity_text() {
        let m = sample();
        let json = m.to_json();
        assert!(String::from_utf8_lossy(&json).contains("\"FIDELITY_MEMORY\""));
        assert_eq!(Manifest::from_json(&json).expect("parse"), m);
        assert_eq!(m.checksum().len(), 64);
    }

    #[test]
    fn rejects_unknown_fields_and_versions() {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_json()).expect("json");
        v["extra"] = serde_json::json!(1);
        let err = Manifest::from_json(v.to_string().as_bytes()).expect_err("unknown field");
        assert!(err.to_string().contains("extra"), "{err}");

        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_json()).expect("json");
        v["format_version"] = serde_json::json!(2);
        let err = Manifest::from_json(v.to_string().as_bytes()).expect_err("v2");
        assert!(
            matches!(err, Error::UnsupportedFormat { found: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("unsupported format_version 2"));

        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_json()).expect("json");
        v["fidelity"] = serde_json::json!("FIDELITY_EVERYTHING");
        assert!(Manifest::from_json(v.to_string().as_bytes()).is_err());
    }

    #[test]
    fn rejects_unsafe_paths() {
        for p in [
            "../x",
            "/etc/passwd",
            "a/../../b",
            "a//b",
            "./a",
            "",
            "manifest.json",
        ] {
            let mut m = sample();
            m.files[0].path = p.into();
            let err = Manifest::from_json(&m.to_json()).expect_err(p);
            assert!(matches!(err, Error::InvalidManifest(_)), "{p}: {err}");
        }
        let mut m = sample();
        m.files.push(m.files[0].clone());
        assert!(Manifest::from_json(&m.to_json()).is_err(), "duplicate");
        let mut m = sample();
        m.files[0].sha256 = "A".repeat(64);
        assert!(Manifest::from_json(&m.to_json()).is_err(), "uppercase hex");
        let mut m = sample();
        m.files.push(FileEntry {
            path: "criu/pages-1.img/x".into(),
            size: 1,
            sha256: "b".repeat(64),
        });
        assert!(Manifest::from_json(&m.to_json()).is_err(), "file and dir");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = Manifest::from_json(&bytes);
        }

        #[test]
        fn mutated_manifests_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let mut json = sample().to_json();
            let i = pos.index(json.len());
            json[i] = byte;
            let _ = Manifest::from_json(&json);
            json.truncate(cut.index(json.len() + 1));
            let _ = Manifest::from_json(&json);
        }

        #[test]
        fn arbitrary_json_values_never_panic(s in "\\PC*") {
            let _ = Manifest::from_json(format!("{{\"format_version\":1,\"files\":[{{\"path\":{s:?},\"size\":1,\"sha256\":\"\"}}]}}").as_bytes());
        }
    }
}
