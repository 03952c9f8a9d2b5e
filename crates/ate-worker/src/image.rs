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

pub mod registry;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufReader, Read, Seek};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{IoContext, Result, SandboxError};

pub use registry::RegistryConfig;

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
            .ok_or_else(|| SandboxError::Image {
                reference: reference.to_string(),
                message: format!("only `{REF_PREFIX}<dir>[:<tag>]` references are supported"),
            })?;
        // A tag never contains '/', so a colon followed by a path segment belongs to the directory.
        let (dir, tag) = match rest.rsplit_once(':') {
            Some((d, t)) if !t.is_empty() && !t.contains('/') => (d, t),
            _ => (rest, "latest"),
        };
        if dir.is_empty() {
            return Err(SandboxError::Image {
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
            .map_err(|e| SandboxError::io("image unpack task", std::io::Error::other(e)))?
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

fn image_err(reference: &str, message: impl Into<String>) -> SandboxError {
    SandboxError::Image {
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

/// What [`sweep_unused`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepStats {
    pub entries_seen: usize,
    pub entries_removed: usize,
}

/// Removes unpacked images no sandbox uses: entries last used more than `retention` ago whose
/// rootfs is not the lower dir of any overlay mount. Each entry is checked and removed under its
/// lock; leftovers of interrupted unpacks (`.tmp-*`) older than `retention` go too. Blocking.
pub fn sweep_unused(cache: &Path, retention: Duration) -> Result<SweepStats> {
    let mut stats = SweepStats::default();
    let entries = match fs::read_dir(cache) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(stats),
        Err(e) => return Err(SandboxError::io(format!("read {}", cache.display()), e)),
    };
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .ctx(|| "read /proc/self/mountinfo".to_string())?;
    let now = SystemTime::now();
    let old = |path: &Path| {
        fs::metadata(path)
            .and_then(|m| m.modified())
            .map(|t| now.duration_since(t).unwrap_or(Duration::ZERO) > retention)
            .unwrap_or(false)
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(".tmp-") {
            if old(&path) {
                let _ = fs::remove_dir_all(&path);
            }
            continue;
        }
        if name.starts_with('.') || !path.is_dir() || digest_hex(&format!("sha256:{name}")).is_err()
        {
            continue;
        }
        stats.entries_seen += 1;
        let _lock = lock_entry(cache, &name)?;
        let mark = path.join(LAST_USED_FILE);
        let used = if mark.exists() {
            mark
        } else {
            path.join(CONFIG_FILE)
        };
        if !old(&used) {
            continue;
        }
        let rootfs = path.join("rootfs");
        if mounted_as_lower(&mountinfo, &rootfs) {
            continue;
        }
        fs::remove_dir_all(&path).ctx(|| format!("remove {}", path.display()))?;
        let _ = fs::remove_file(cache.join(format!(".{name}.lock")));
        stats.entries_removed += 1;
        tracing::info!(image = %name, "removed an unpacked image no actor used for {retention:?}");
    }
    Ok(stats)
}

/// Whether `rootfs` is a lower dir of an overlay mount in `mountinfo`.
fn mounted_as_lower(mountinfo: &str, rootfs: &Path) -> bool {
    let needle = rootfs.display().to_string();
    mountinfo.lines().any(|line| {
        line.split_once(" - ").is_some_and(|(_, right)| {
            right.starts_with("overlay ")
                && right
                    .split(',')
                    .filter_map(|o| o.split_once("lowerdir="))
                    .any(|(_, dirs)| dirs.split(':').any(|d| d == needle))
        })
    })
}

/// Takes the exclusive per-digest lock that serialises building one cache entry across threads
/// and processes (blocking).
pub(crate) fn lock_entry(cache: &Path, hex: &str) -> Result<Flock<File>> {
    fs::create_dir_all(cache).ctx(|| format!("create image cache {}", cache.display()))?;
    let lock_path = cache.join(format!(".{hex}.lock"));
    let lock_file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .ctx(|| format!("open {}", lock_path.display()))?;
    Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| SandboxError::io(format!("flock {}", lock_path.display()), e.into()))
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

/// Applies one verified layer file, naming the layer in I/O errors.
pub(crate) fn apply_verified_layer(path: &Path, digest: &str, rootfs: &Path) -> Result<()> {
    apply_layer(path, rootfs).map_err(|e| match e {
        SandboxError::Io { what, source } => SandboxError::Io {
            what: format!("layer {digest}: {what}"),
            source,
        },
        other => other,
    })
}

fn ensure_blocking(cache: &Path, reference: &str) -> Result<UnpackedImage> {
    let layout = LayoutRef::parse(reference)?;
    let index_path = layout.dir.join("index.json");
    let index_bytes = fs::read(&index_path).ctx(|| format!("read {}", index_path.display()))?;
    let index: Index = serde_json::from_slice(&index_bytes)
        .map_err(|e| image_err(reference, format!("index.json: {e}")))?;
    let mut desc = select_tagged(&index.manifests, &layout.tag).ok_or_else(|| {
        image_err(
            reference,
            format!("no manifest tagged {:?} in index.json", layout.tag),
        )
    })?;
    // A nested index (multi-platform image): descend to the linux/amd64 manifest.
    for _ in 0..4 {
        if desc.media_type != MEDIA_INDEX && desc.media_type != MEDIA_DOCKER_LIST {
            break;
        }
        let bytes = read_verified(&layout.dir, &desc)?;
        let nested: Index = serde_json::from_slice(&bytes)
            .map_err(|e| image_err(reference, format!("nested index: {e}")))?;
        desc = select_platform(&nested.manifests)
            .ok_or_else(|| image_err(reference, "nested index has no linux/amd64 manifest"))?;
    }
    let manifest_bytes = read_verified(&layout.dir, &desc)?;
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| image_err(reference, format!("manifest: {e}")))?;
    let hex = digest_hex(&desc.digest)?.to_string();

    if let Some(img) = cached(cache, reference, &desc.digest)? {
        return Ok(img);
    }
    let _lock = lock_entry(cache, &hex)?;
    if let Some(img) = cached_locked(cache, reference, &desc.digest)? {
        return Ok(img);
    }

    let build = EntryBuild::start(cache, &hex)?;
    let config_bytes = read_verified(&layout.dir, &manifest.config)?;
    let config = parse_config(reference, &config_bytes)?;
    let rootfs = build.rootfs();
    for layer in &manifest.layers {
        let path = blob_path(&layout.dir, &layer.digest)?;
        verify_file(&path, layer)?;
        apply_verified_layer(&path, &layer.digest, &rootfs)?;
    }
    build.finish(reference, &config)?;
    cached_locked(cache, reference, &desc.digest)?
        .ok_or_else(|| image_err(reference, "cache entry vanished after unpacking"))
}

fn select_tagged(manifests: &[Descriptor], tag: &str) -> Option<Descriptor> {
    let by_name = manifests.iter().find(|d| {
        d.annotations.get(REF_NAME_ANNOTATION).is_some_and(|n| {
            n == tag
                || n.rsplit_once(':')
                    .is_some_and(|(_, t)| t == tag && !t.contains('/'))
        })
    });
    if let Some(d) = by_name {
        return Some(d.clone());
    }
    // An untagged single-image layout answers to the default tag only.
    if tag == "latest"
        && manifests.len() == 1
        && !manifests[0].annotations.contains_key(REF_NAME_ANNOTATION)
    {
        return Some(manifests[0].clone());
    }
    None
}

pub(crate) fn select_platform(manifests: &[Descriptor]) -> Option<Descriptor> {
    manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .or_else(|| manifests.iter().find(|d| d.platform.is_none()))
        .cloned()
}

/// The hex part of a `sha256:` digest, validated so it can never form a path other than one file name.
pub(crate) fn digest_hex(digest: &str) -> Result<&str> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| SandboxError::Checksum {
            digest: digest.to_string(),
            actual: "(unsupported digest algorithm; only sha256)".to_string(),
        })?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(SandboxError::Checksum {
            digest: digest.to_string(),
            actual: "(malformed digest)".to_string(),
        });
    }
    Ok(hex)
}

fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    Ok(dir.join("blobs").join("sha256").join(digest_hex(digest)?))
}

/// Hashes a blob file and checks digest (and size, when the descriptor gives one).
fn verify_file(path: &Path, desc: &Descriptor) -> Result<()> {
    let expected = digest_hex(&desc.digest)?;
    let mut file = File::open(path).ctx(|| format!("open blob {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut len: u64 = 0;
    loop {
        let n = file
            .read(&mut buf)
            .ctx(|| format!("read blob {}", path.display()))?;
        if n == 0 {
            break;
        }
        len += n as u64;
        hasher.update(&buf[..n]);
    }
    let actual = hex::encode(hasher.finalize());
    if actual != expected {
        return Err(SandboxError::Checksum {
            digest: desc.digest.clone(),
            actual,
        });
    }
    if let Some(size) = desc.size
        && size != len
    {
        return Err(SandboxError::Checksum {
            digest: desc.digest.clone(),
            actual: format!("{actual} (size {len}, descriptor says {size})"),
        });
    }
    Ok(())
}

/// Reads a small blob (index, manifest, config) and verifies it.
fn read_verified(dir: &Path, desc: &Descriptor) -> Result<Vec<u8>> {
    let path = blob_path(dir, &desc.digest)?;
    let bytes = fs::read(&path).ctx(|| format!("read blob {}", path.display()))?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != digest_hex(&desc.digest)? {
        return Err(SandboxError::Checksum {
            digest: desc.digest.clone(),
            actual,
        });
    }
    Ok(bytes)
}

/// Opens a layer as a tar stream, gunzipping when it starts with the gzip magic (media types
/// are not trusted for this: docker and OCI spell them differently).
fn layer_reader(path: &Path) -> Result<Box<dyn Read>> {
    let mut file = File::open(path).ctx(|| format!("open {}", path.display()))?;
    let mut magic = [0u8; 2];
    let n = file
        .read(&mut magic)
        .ctx(|| format!("read {}", path.display()))?;
    file.rewind().ctx(|| format!("rewind {}", path.display()))?;
    let reader = BufReader::new(file);
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(flate2::read::GzDecoder::new(reader)))
    } else {
        Ok(Box::new(reader))
    }
}

/// Entry path as plain relative components; `None` for anything with `..` (never applied).
fn clean_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    }
}

/// True when every directory between `root` and `rel`'s parent is a real directory, so a
/// deletion under it cannot be redirected outside the rootfs through a symlink.
fn parents_are_real_dirs(root: &Path, rel: &Path) -> bool {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.file_type().is_dir() => {}
                _ => return false,
            }
        }
    }
    true
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies one layer: whiteouts first (they only hide lower layers), then the layer's files via
/// `unpack_in`, which refuses entries escaping the rootfs.
fn apply_layer(path: &Path, rootfs: &Path) -> Result<()> {
    let mut archive = tar::Archive::new(layer_reader(path)?);
    for entry in archive.entries().ctx(|| "read tar entries")? {
        let entry = entry.ctx(|| "read tar entry")?;
        let raw = entry.path().ctx(|| "tar entry path")?.into_owned();
        let Some(rel) = clean_relative(&raw) else {
            continue;
        };
        let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(hidden) = name.strip_prefix(".wh.") else {
            continue;
        };
        if !parents_are_real_dirs(rootfs, &rel) {
            continue;
        }
        let parent = rootfs.join(rel.parent().unwrap_or(Path::new("")));
        if hidden == ".wh..opq" {
            // Opaque directory: drop everything the lower layers put in it.
            if let Ok(children) = fs::read_dir(&parent) {
                for child in children.flatten() {
                    remove_any(&child.path())
                        .ctx(|| format!("opaque whiteout in {}", parent.display()))?;
                }
            }
        } else {
            let target = parent.join(hidden);
            remove_any(&target).ctx(|| format!("whiteout {}", target.display()))?;
        }
    }

    let mut archive = tar::Archive::new(layer_reader(path)?);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    for entry in archive.entries().ctx(|| "read tar entries")? {
        let mut entry = entry.ctx(|| "read tar entry")?;
        let raw = entry.path().ctx(|| "tar entry path")?.into_owned();
        if raw
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".wh."))
        {
            continue;
        }
        entry
            .unpack_in(rootfs)
            .ctx(|| format!("unpack {}", raw.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    fn entry(cache: &Path, hex: &str, age: Duration) {
        let dir = cache.join(hex);
        fs::create_dir_all(dir.join("rootfs")).unwrap();
        let cfg = r#"{"entrypoint":[],"cmd":[],"env":[],"working_dir":""}"#;
        fs::write(dir.join(CONFIG_FILE), cfg).unwrap();
        let mark = dir.join(LAST_USED_FILE);
        fs::write(&mark, b"").unwrap();
        File::options()
            .write(true)
            .open(&mark)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    }

    #[test]
    fn sweep_removes_only_entries_unused_past_the_retention() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let (old, fresh) = ("a".repeat(64), "b".repeat(64));
        entry(cache, &old, Duration::from_secs(7200));
        entry(cache, &fresh, Duration::from_secs(60));
        fs::create_dir_all(cache.join("not-a-digest")).unwrap();
        let stats = sweep_unused(cache, Duration::from_secs(3600)).unwrap();
        assert_eq!(stats.entries_removed, 1);
        assert!(!cache.join(&old).exists());
        assert!(cache.join(&fresh).exists());
        assert!(
            cache.join("not-a-digest").exists(),
            "foreign directories are left alone"
        );
        // A use (what a start does) renews an entry.
        entry(cache, &old, Duration::from_secs(7200));
        let digest = format!("sha256:{old}");
        assert!(cached(cache, "ref", &digest).unwrap().is_some());
        let stats = sweep_unused(cache, Duration::from_secs(3600)).unwrap();
        assert_eq!(stats.entries_removed, 0);
        assert!(sweep_unused(&cache.join("missing"), Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn a_mounted_image_is_in_use() {
        let rootfs = Path::new("/var/lib/ate/images-cache/abc/rootfs");
        let info = "62 27 0:49 / /var/lib/ate/workers/w/actors/ns/a/rootfs rw,relatime - overlay overlay rw,lowerdir=/var/lib/ate/images-cache/abc/rootfs,upperdir=/x/upper,workdir=/x/work";
        assert!(mounted_as_lower(info, rootfs));
        assert!(!mounted_as_lower(
            info,
            Path::new("/var/lib/ate/images-cache/abd/rootfs")
        ));
        let two = "1 2 0:1 / /m rw - overlay overlay rw,lowerdir=/l1:/var/lib/ate/images-cache/abc/rootfs,upperdir=/u";
        assert!(mounted_as_lower(two, rootfs));
        assert!(!mounted_as_lower(
            "1 2 0:1 / /m rw - ext4 /dev/sda rw",
            rootfs
        ));
    }

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

    #[test]
    fn cleans_paths() {
        assert_eq!(
            clean_relative(Path::new("./a/b")),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(clean_relative(Path::new("/a/../b")), None);
        assert_eq!(clean_relative(Path::new(".")), None);
    }

    fn write_blob(layout: &Path, bytes: &[u8]) -> serde_json::Value {
        let hex = hex::encode(Sha256::digest(bytes));
        let dir = layout.join("blobs/sha256");
        fs::create_dir_all(&dir).expect("blob dir");
        fs::write(dir.join(&hex), bytes).expect("write blob");
        serde_json::json!({"digest": format!("sha256:{hex}"), "size": bytes.len()})
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_data(&mut h, path, data).expect("append");
    }

    /// Two layers (gzip, then plain tar) with a whiteout, an opaque dir and a `..` entry.
    #[test]
    fn applies_whiteouts_and_refuses_traversal() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = tmp.path().join("layout");

        let mut l1 = tar::Builder::new(Vec::new());
        file(&mut l1, "a/f1", b"1");
        file(&mut l1, "a/f2", b"2");
        file(&mut l1, "b/x", b"x");
        let l1 = l1.into_inner().expect("tar");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &l1).expect("gzip");
        let l1 = gz.finish().expect("gzip");

        let mut l2 = tar::Builder::new(Vec::new());
        file(&mut l2, "a/.wh.f1", b"");
        file(&mut l2, "b/.wh..wh..opq", b"");
        file(&mut l2, "b/y", b"y");
        // A raw header naming `../evil` (the builder's path setters refuse it).
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..7].copy_from_slice(b"../evil");
        h.set_size(4);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        l2.append(&h, &b"evil"[..]).expect("append raw");
        let l2 = l2.into_inner().expect("tar");

        let config = serde_json::json!({"config": {"Cmd": ["/bin/app"], "Env": ["A=1"], "WorkingDir": "/w"}});
        let cfg = write_blob(&layout, &serde_json::to_vec(&config).expect("json"));
        let d1 = write_blob(&layout, &l1);
        let d2 = write_blob(&layout, &l2);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg["digest"], "size": cfg["size"]},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d1["digest"], "size": d1["size"]},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d2["digest"], "size": d2["size"]}
            ]
        });
        let m = write_blob(&layout, &serde_json::to_vec(&manifest).expect("json"));
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m["digest"], "size": m["size"],
            "annotations": {REF_NAME_ANNOTATION: "v1"}
        }]});
        fs::write(
            layout.join("index.json"),
            serde_json::to_vec(&index).expect("json"),
        )
        .expect("index");

        let cache = tmp.path().join("cache");
        let reference = format!("oci-layout:{}:v1", layout.display());
        let img = ensure_blocking(&cache, &reference).expect("unpack");
        assert_eq!(img.config.cmd, vec!["/bin/app".to_string()]);
        assert_eq!(img.config.working_dir, "/w");
        assert!(!img.rootfs.join("a/f1").exists(), "whiteout ignored");
        assert!(img.rootfs.join("a/f2").is_file());
        assert!(
            !img.rootfs.join("b/x").exists(),
            "opaque dir kept lower content"
        );
        assert!(img.rootfs.join("b/y").is_file());
        assert!(
            !img.rootfs
                .parent()
                .map(|p| p.join("evil").exists())
                .unwrap_or(true),
            "traversal entry escaped"
        );
        assert!(!tmp.path().join("evil").exists());
        // Second call: served from the cache.
        assert_eq!(ensure_blocking(&cache, &reference).expect("cached"), img);
        assert!(
            ensure_blocking(&cache, &format!("oci-layout:{}", layout.display())).is_err(),
            "no latest tag"
        );
    }
}
