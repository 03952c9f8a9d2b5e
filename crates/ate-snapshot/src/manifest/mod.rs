//! `manifest.json`: what a generation is and every file it holds (size + sha256).
//!
//! Memory images (`criu/pages-<N>.img`, see [`is_memory_pages_file`]) also carry a BLAKE3 digest
//! per [`CHUNK_BYTES`] (2 MiB) chunk of the file, `blake3_chunks` (format version 2): a lazy
//! restore verifies each chunk when it first reads it instead of hashing the whole image before
//! the restore starts. The whole-file sha256 stays the reference for full verification and for
//! durable copies. Version 1 manifests (no chunk digests) are still read.
//!
//! Version 3 leaves out the whole-file sha256 of memory images that have chunk digests: the
//! chunk digests pin every byte already, and a sha256 of a 1 GiB image cost a suspend ~1.5 s
//! on these machines (sha256 runs at a fraction of BLAKE3's speed). Every other file keeps it.
//!
//! `entry.rs` holds [`FileEntry`] (one file, its chunk geometry and the checks on it); the
//! manifest as a whole and its validation are here.

mod entry;

use std::collections::HashSet;

use ate_core::Fidelity;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub use entry::{FileEntry, is_memory_pages_file};
use entry::{check_chunk_digests, check_rel_path, is_lower_hex_64};

/// Format this build writes; it reads every version from 1 up to this one.
/// Version 2 added `blake3_chunks` (version 1 manifests have no chunk digests); version 3 drops
/// `sha256` for files with `blake3_chunks`.
pub const FORMAT_VERSION: u32 = 3;
/// First format whose chunked files have no sha256.
const FORMAT_WITHOUT_CHUNKED_SHA256: u32 = 3;
/// Oldest format this build still reads.
pub(crate) const OLDEST_FORMAT_VERSION: u32 = 1;
/// Size of the chunks of a memory image that get their own BLAKE3 digest (the last chunk of a
/// file may be shorter).
pub const CHUNK_BYTES: u64 = 2 * 1024 * 1024;
/// File name of the manifest inside a generation directory (and under a durable key).
pub const MANIFEST_FILE: &str = "manifest.json";

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
    /// An incremental generation's parent: its memory images leave the pages not written since
    /// that generation to it (CRIU `PE_PARENT` entries). Absent for a whole generation, which is
    /// every generation but the seconds between an incremental suspend and its flatten
    /// (docs/incremental-suspend.md); a build that does not know the field refuses such a
    /// manifest rather than read half a memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentGeneration>,
}

/// The generation an incremental generation's memory images build on: a sibling directory
/// (same actor, same node) named `dir`, holding generation `generation` with `uuid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentGeneration {
    pub dir: String,
    pub generation: u64,
    pub uuid: String,
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
                Some(n)
                    if (u64::from(OLDEST_FORMAT_VERSION)..=u64::from(FORMAT_VERSION))
                        .contains(&n) => {}
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

    /// Whether the upper dir of container `name` (not an actor's first) is archived here.
    pub fn has_container_rootfs(&self, name: &str) -> bool {
        self.file(&crate::generation::container_rootfs_path(name))
            .is_some()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&self.format_version) {
            return Err(Error::UnsupportedFormat {
                found: u64::from(self.format_version),
                supported: FORMAT_VERSION,
            });
        }
        if let Some(p) = &self.parent {
            let one_component = !p.dir.is_empty()
                && p.dir != "."
                && p.dir != ".."
                && !p.dir.contains('/')
                && !p.dir.contains('\0');
            if !one_component {
                return Err(Error::InvalidManifest(format!(
                    "parent dir {:?} is not the name of a sibling directory",
                    p.dir
                )));
            }
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
            let chunked_without_sha256 = f.sha256.is_empty()
                && f.has_chunk_digests()
                && self.format_version >= FORMAT_WITHOUT_CHUNKED_SHA256;
            if !chunked_without_sha256 && !is_lower_hex_64(&f.sha256) {
                return Err(Error::InvalidManifest(format!(
                    "file {:?}: sha256 {:?} is not 64 lowercase hex digits",
                    f.path, f.sha256
                )));
            }
            check_chunk_digests(self.format_version, f)?;
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
                blake3_chunks: vec!["c".repeat(64)],
            }],
            parent: None,
        }
    }

    #[test]
    fn only_chunked_files_of_format_3_may_leave_out_sha256() {
        let mut m = sample();
        m.files[0].sha256.clear();
        let json = m.to_json();
        assert!(!String::from_utf8_lossy(&json).contains("sha256"));
        assert_eq!(Manifest::from_json(&json).expect("format 3, chunked"), m);
        // Format 2 always had it.
        m.format_version = 2;
        let err = Manifest::from_json(&m.to_json()).expect_err("format 2 without sha256");
        assert!(err.to_string().contains("sha256"), "{err}");
        // A file without chunk digests needs it in every format.
        let mut m = sample();
        m.files[0].sha256.clear();
        m.files[0].blake3_chunks.clear();
        let err = Manifest::from_json(&m.to_json()).expect_err("no chunks, no sha256");
        assert!(err.to_string().contains("sha256"), "{err}");
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
        v["format_version"] = serde_json::json!(4);
        let err = Manifest::from_json(v.to_string().as_bytes()).expect_err("v4");
        assert!(
            matches!(
                err,
                Error::UnsupportedFormat {
                    found: 4,
                    supported: 3
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("unsupported format_version 4 (this build reads 1 to 3)"),
            "{err}"
        );
        for bad in [0, 4, 1000] {
            let mut v: serde_json::Value =
                serde_json::from_slice(&sample().to_json()).expect("json");
            v["format_version"] = serde_json::json!(bad);
            assert!(
                matches!(
                    Manifest::from_json(v.to_string().as_bytes()),
                    Err(Error::UnsupportedFormat { .. })
                ),
                "{bad}"
            );
        }

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
            blake3_chunks: Vec::new(),
        });
        assert!(Manifest::from_json(&m.to_json()).is_err(), "file and dir");
    }

    #[test]
    fn chunk_digests_are_validated() {
        let parse = |m: &Manifest| Manifest::from_json(&m.to_json());
        // Serialized only when present; a file without them has no such field.
        let mut m = sample();
        assert!(String::from_utf8_lossy(&m.to_json()).contains("blake3_chunks"));
        m.files[0].blake3_chunks.clear();
        assert!(!String::from_utf8_lossy(&m.to_json()).contains("blake3_chunks"));
        assert_eq!(parse(&m).expect("no chunks is fine"), m);

        let mut m = sample();
        m.files[0].blake3_chunks.push("d".repeat(64));
        let err = parse(&m).expect_err("two digests for one chunk");
        assert!(
            matches!(&err, Error::InvalidManifest(t) if t.contains("2 blake3_chunks for 4096 bytes, expected 1")),
            "{err}"
        );
        let mut m = sample();
        m.files[0].size = CHUNK_BYTES + 1;
        let err = parse(&m).expect_err("one digest for two chunks");
        assert!(err.to_string().contains("expected 2"), "{err}");

        for bad in [
            "C".repeat(64),
            "c".repeat(63),
            "c".repeat(65),
            "g".repeat(64),
            String::new(),
        ] {
            let mut m = sample();
            m.files[0].blake3_chunks = vec![bad.clone()];
            let err = parse(&m).expect_err(&bad);
            assert!(
                matches!(&err, Error::InvalidManifest(t) if t.contains("blake3_chunks[0]") && t.contains("\"criu/pages-1.img\"")),
                "{bad:?}: {err}"
            );
        }

        let mut m = sample();
        m.files[0].path = "criu/inventory.img".into();
        let err = parse(&m).expect_err("digests on a non-pages file");
        assert!(err.to_string().contains("not a memory image"), "{err}");

        let mut m = sample();
        m.files[0].size = 0;
        assert!(parse(&m).is_err(), "digests for an empty file");
    }

    #[test]
    fn version_1_manifests_still_parse() {
        let mut m = sample();
        m.files[0].blake3_chunks.clear();
        m.format_version = 1;
        let json = m.to_json();
        let parsed = Manifest::from_json(&json).expect("v1");
        assert_eq!(parsed.format_version, 1);
        assert_eq!(parsed, m);
        // Re-serialized unchanged: the record's checksum still matches.
        assert_eq!(parsed.to_json(), json);
        assert_eq!(parsed.checksum(), m.checksum());
        // A version 1 writer never wrote chunk digests.
        let mut m = sample();
        m.format_version = 1;
        let err = Manifest::from_json(&m.to_json()).expect_err("v1 with chunks");
        assert!(err.to_string().contains("version 2"), "{err}");
        // A literal version 1 manifest, as the previous build wrote it.
        let v1 = r#"{
  "format_version": 1,
  "atespace": "default",
  "name": "counter",
  "generation": 3,
  "uuid": "0b6f3c1e-0000-4000-8000-000000000000",
  "fidelity": "FIDELITY_MEMORY",
  "template": "default/counter",
  "sandbox_class": "runc",
  "node": "node-a",
  "boot_id": "b00t",
  "created_unix_ms": 1700000000000,
  "reason": "",
  "files": [
    {
      "path": "criu/pages-1.img",
      "size": 4096,
      "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    }
  ]
}
"#;
        let parsed = Manifest::from_json(v1.as_bytes()).expect("literal v1");
        assert!(!parsed.files[0].has_chunk_digests());
        // A reader can tell it cannot verify this image chunk by chunk.
        assert_eq!(parsed.files[0].chunk_count(), 0);
        assert_eq!(parsed.to_json(), v1.as_bytes());
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
