//! Images → a node-wide, content-addressed rootfs cache.
//!
//! Two kinds of reference:
//! - `oci-layout:<dir>[:<tag>]`, resolved through `<dir>/index.json` (tag matched on the
//!   `org.opencontainers.image.ref.name` annotation, default `latest`);
//! - a registry reference, `host[:port]/repo[:tag]` or `…@sha256:<hex>`, pulled with
//!   [`registry`] (oci-client): the tag is resolved to a manifest digest once per node and
//!   recorded; every blob is hashed and checked against its digest before it is unpacked.
//!
//! Every blob read (manifest, config, layers) is hashed and compared with its digest before use.
//! The unpacked rootfs lands in `<cache>/<manifest-hex>/rootfs` whatever the image came from; it is
//! built in a temporary directory and renamed into place under an exclusive `flock` per digest, so
//! concurrent callers (threads or processes) unpack once.
//!
//! The worker's image store: it starts actors on [`UnpackedImage`]s and sweeps the cache with
//! [`sweep_unused`].

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod error;
mod layer;
mod layout;
pub mod registry;
mod sweep;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;
use serde::{Deserialize, Serialize};

pub use crate::error::ImageError;
use crate::error::{IoContext, Result};

pub use registry::RegistryConfig;
pub use sweep::{SweepStats, sweep_unused};

pub(crate) use layer::apply_verified_layer;
use layout::ensure_blocking;
pub(crate) use layout::select_platform;

const REF_PREFIX: &str = "oci-layout:";
const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
pub(crate) const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MEDIA_DOCKER_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
const CONFIG_FILE: &str = "image-config.json";

/// The parts of an image config the runtime uses to build the process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `NAME=value` entries, in image order.
    pub env: Vec<String>,
    pub working_dir: String,
}

/// An image unpacked in the node cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpackedImage {
    /// `sha256:<hex>` of the manifest: the cache key.
    pub manifest_digest: String,
    /// Read-only lower directory for the actor overlays. Never write into it.
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

/// A parsed `oci-layout:<dir>[:<tag>]` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRef {
    pub dir: PathBuf,
    pub tag: String,
}

impl LayoutRef {
    pub fn parse(reference: &str) -> Result<Self> {
        let rest = reference
            .strip_prefix(REF_PREFIX)
            .ok_or_else(|| ImageError::Image {
                reference: reference.to_string(),
                message: format!("only `{REF_PREFIX}<dir>[:<tag>]` references are supported"),
            })?;
        // A tag never contains '/', so a colon followed by a path segment belongs to the directory.
        let (dir, tag) = match rest.rsplit_once(':') {
            Some((d, t)) if !t.is_empty() && !t.contains('/') => (d, t),
            _ => (rest, "latest"),
        };
        if dir.is_empty() {
            return Err(ImageError::Image {
                reference: reference.to_string(),
                message: "empty layout directory".into(),
            });
        }
        Ok(LayoutRef {
            dir: PathBuf::from(dir),
            tag: tag.to_string(),
        })
    }
}

/// The node's image cache.
#[derive(Debug, Clone)]
pub struct ImageCache {
    root: PathBuf,
    registry: std::sync::Arc<registry::Puller>,
}

impl ImageCache {
    /// A cache whose registry settings come from the environment ([`RegistryConfig::from_env`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_registry(root, RegistryConfig::from_env())
    }

    /// A cache with explicit registry settings.
    pub fn with_registry(root: impl Into<PathBuf>, config: RegistryConfig) -> Self {
        ImageCache {
            root: root.into(),
            registry: std::sync::Arc::new(registry::Puller::new(config)),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `reference` and makes sure its rootfs is unpacked; cheap when already cached
    /// (a layout: only index.json and the manifest are read and verified; a registry image whose
    /// digest is known on this node: no network at all).
    pub async fn ensure(&self, reference: &str) -> Result<UnpackedImage> {
        if !reference.starts_with(REF_PREFIX) {
            return self.registry.ensure(&self.root, reference).await;
        }
        let root = self.root.clone();
        let reference = reference.to_string();
        tokio::task::spawn_blocking(move || ensure_blocking(&root, &reference))
            .await
            .map_err(|e| ImageError::io("image unpack task", std::io::Error::other(e)))?
    }
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    #[serde(default)]
    pub(crate) size: Option<u64>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize, Clone)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
pub(crate) struct Manifest {
    pub(crate) config: Descriptor,
    #[serde(default)]
    pub(crate) layers: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
struct ConfigFile {
    #[serde(default)]
    config: Option<RawConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawConfig {
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
}

fn image_err(reference: &str, message: impl Into<String>) -> ImageError {
    ImageError::Image {
        reference: reference.to_string(),
        message: message.into(),
    }
}

/// The parts of an image config blob the runtime uses.
pub(crate) fn parse_config(reference: &str, bytes: &[u8]) -> Result<ImageConfig> {
    let raw: ConfigFile =
        serde_json::from_slice(bytes).map_err(|e| image_err(reference, format!("config: {e}")))?;
    let raw = raw.config.unwrap_or_default();
    Ok(ImageConfig {
        entrypoint: raw.entrypoint.unwrap_or_default(),
        cmd: raw.cmd.unwrap_or_default(),
        env: raw.env.unwrap_or_default(),
        working_dir: raw.working_dir.unwrap_or_default(),
    })
}

/// The complete cache entry of manifest `digest`, if there is one. Complete entries appear only
/// by rename, so the config file's existence means complete.
pub(crate) fn cached(cache: &Path, reference: &str, digest: &str) -> Result<Option<UnpackedImage>> {
    let hex = digest_hex(digest)?;
    if !cache.join(hex).join(CONFIG_FILE).is_file() {
        return Ok(None);
    }
    // Marks the entry used under its lock, so a sweep (which checks the mark under the same
    // lock) never removes an entry a start is about to mount.
    let _lock = lock_entry(cache, hex)?;
    cached_locked(cache, reference, digest)
}

/// [`cached`] for a caller that holds the entry's lock already (flock is per open file: taking
/// it again here would wait for ourselves).
pub(crate) fn cached_locked(
    cache: &Path,
    reference: &str,
    digest: &str,
) -> Result<Option<UnpackedImage>> {
    let dir = cache.join(digest_hex(digest)?);
    let cfg_path = dir.join(CONFIG_FILE);
    if !cfg_path.is_file() {
        return Ok(None);
    }
    let mark = dir.join(LAST_USED_FILE);
    fs::write(&mark, b"").ctx(|| format!("write {}", mark.display()))?;
    let bytes = fs::read(&cfg_path).ctx(|| format!("read {}", cfg_path.display()))?;
    let config: ImageConfig = serde_json::from_slice(&bytes)
        .map_err(|e| image_err(reference, format!("cached {}: {e}", cfg_path.display())))?;
    Ok(Some(UnpackedImage {
        manifest_digest: digest.to_string(),
        rootfs: dir.join("rootfs"),
        config,
    }))
}

/// Touched (under the entry's lock) each time a start uses a cache entry.
const LAST_USED_FILE: &str = "last-used";

/// Takes the exclusive per-digest lock that serialises building one cache entry across threads
/// and processes (blocking).
pub(crate) fn lock_entry(cache: &Path, hex: &str) -> Result<Flock<File>> {
    fs::create_dir_all(cache).ctx(|| format!("create image cache {}", cache.display()))?;
    crate::error::lock_exclusive(&cache.join(format!(".{hex}.lock")))
}

/// A cache entry being built in `<cache>/.tmp-<hex>-<pid>`; removed on drop unless
/// [`EntryBuild::finish`] renamed it into place. Only while holding [`lock_entry`].
pub(crate) struct EntryBuild {
    tmp: PathBuf,
    final_dir: PathBuf,
    done: bool,
}

impl EntryBuild {
    pub(crate) fn start(cache: &Path, hex: &str) -> Result<Self> {
        let tmp = cache.join(format!(".tmp-{hex}-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).ctx(|| format!("remove stale {}", tmp.display()))?;
        }
        let build = EntryBuild {
            final_dir: cache.join(hex),
            tmp,
            done: false,
        };
        let rootfs = build.rootfs();
        fs::create_dir_all(&rootfs).ctx(|| format!("create {}", rootfs.display()))?;
        Ok(build)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.tmp
    }

    pub(crate) fn rootfs(&self) -> PathBuf {
        self.tmp.join("rootfs")
    }

    /// Writes the config and renames the entry into place.
    pub(crate) fn finish(mut self, reference: &str, config: &ImageConfig) -> Result<()> {
        let cfg_json =
            serde_json::to_vec_pretty(config).map_err(|e| image_err(reference, e.to_string()))?;
        let cfg_path = self.tmp.join(CONFIG_FILE);
        fs::write(&cfg_path, cfg_json).ctx(|| format!("write {}", cfg_path.display()))?;
        if self.final_dir.exists() {
            // An incomplete leftover (no config file) from a crash before this code existed.
            fs::remove_dir_all(&self.final_dir)
                .ctx(|| format!("remove incomplete {}", self.final_dir.display()))?;
        }
        fs::rename(&self.tmp, &self.final_dir).ctx(|| {
            format!(
                "rename {} → {}",
                self.tmp.display(),
                self.final_dir.display()
            )
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for EntryBuild {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// The hex part of a `sha256:` digest, validated so it can never form a path other than one file name.
pub(crate) fn digest_hex(digest: &str) -> Result<&str> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| ImageError::Checksum {
            digest: digest.to_string(),
            actual: "(unsupported digest algorithm; only sha256)".to_string(),
        })?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ImageError::Checksum {
            digest: digest.to_string(),
            actual: "(malformed digest)".to_string(),
        });
    }
    Ok(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_references() {
        assert_eq!(
            LayoutRef::parse("oci-layout:/x/counter").ok(),
            Some(LayoutRef {
                dir: "/x/counter".into(),
                tag: "latest".into()
            })
        );
        assert_eq!(
            LayoutRef::parse("oci-layout:/x/counter:v2").ok(),
            Some(LayoutRef {
                dir: "/x/counter".into(),
                tag: "v2".into()
            })
        );
        assert_eq!(
            LayoutRef::parse("oci-layout:/x:y/counter").ok(),
            Some(LayoutRef {
                dir: "/x:y/counter".into(),
                tag: "latest".into()
            })
        );
        assert!(LayoutRef::parse("docker.io/library/busybox").is_err());
        assert!(LayoutRef::parse("oci-layout:").is_err());
    }

    #[test]
    fn rejects_bad_digests() {
        assert!(digest_hex("sha256:../../etc/passwd").is_err());
        assert!(digest_hex("md5:abc").is_err());
        assert!(digest_hex(&format!("sha256:{}", "a".repeat(64))).is_ok());
    }
}
