//! A generation directory on the node: seal (archive + hash + manifest last), verify, extract.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use ate_core::Fidelity;

use crate::error::{Error, Result};
use crate::manifest::MANIFEST_FILE;

/// CRIU images, written there directly by `runc checkpoint --image-path <gen>/criu`.
pub const CRIU_DIR: &str = "criu";
/// Archive of the overlay upper dir.
pub const ROOTFS_ARCHIVE: &str = "rootfs.tar";
/// `volumes/<name>.tar`, one per volume.
pub const VOLUMES_DIR: &str = "volumes";
/// `containers/<name>/rootfs.tar`: the upper dir of each container after an actor's first.
pub const CONTAINERS_DIR: &str = "containers";

/// Where a sidecar container's upper dir is archived in a generation.
pub fn container_rootfs_path(container: &str) -> String {
    format!("{CONTAINERS_DIR}/{container}/{ROOTFS_ARCHIVE}")
}

/// How many files are hashed at once by [`verify`].
const HASH_PARALLELISM: usize = 4;

mod chunk;
mod chunk_sink;
mod extract;
mod hash;
mod memory_file;
mod reseal;
mod seal;
pub mod sealed;
mod verify;

pub use chunk::{read_verified_chunk, read_verified_chunk_at, verify_chunk_bytes, verify_chunks};
pub use chunk_sink::{ChunkSink, PipeSink};
pub use extract::{
    extract_container_rootfs, extract_rootfs, extract_volume, quarantine, quarantine_path,
};
pub(crate) use memory_file::read_marker;
pub use memory_file::{MemoryFile, SEALED_SOURCE_FILE, SealedSource, sealed_source};
pub use reseal::{remove_leftovers, replace_memory};
pub use seal::{seal_actor_generation, seal_generation};
pub(crate) use verify::verify_with_bytes;
pub use verify::{read_manifest, verify, verify_files, verify_files_except_chunked};

/// What the caller knows about the generation; the file list is computed by [`seal_generation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationMeta {
    pub atespace: String,
    pub name: String,
    pub generation: u64,
    pub uuid: String,
    pub fidelity: Fidelity,
    pub template: String,
    pub sandbox_class: String,
    pub node: String,
    pub boot_id: String,
    pub created_unix_ms: i64,
    /// Why the fidelity is lower than asked for; empty when it is not.
    pub reason: String,
    /// The generation an incremental dump's memory images build on (see
    /// [`crate::Manifest::parent`]); `None` for a whole generation.
    pub parent: Option<crate::ParentGeneration>,
}

/// True when `gen_dir/manifest.json` exists (complete by definition; [`verify`] checks contents).
pub fn is_sealed(gen_dir: &Path) -> bool {
    gen_dir.join(MANIFEST_FILE).is_file()
}

/// `(<parent>, <parent>/.<name>.<tag>-<uuid>)`: same file system, so the final rename is atomic.
pub(crate) fn sibling(target: &Path, tag: &str) -> Result<(PathBuf, PathBuf)> {
    let (parent, name) = parent_and_name(target, "target")?;
    let tmp = parent.join(format!(
        ".{}.{tag}-{}",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ));
    Ok((parent, tmp))
}

/// `path`'s directory (`.` for a bare name) and its final component; `what` names `path` in
/// the error.
pub(crate) fn parent_and_name<'a>(
    path: &'a Path,
    what: &'static str,
) -> Result<(PathBuf, &'a std::ffi::OsStr)> {
    let name = path.file_name().ok_or_else(|| Error::InvalidName {
        what,
        value: path.display().to_string(),
        message: "has no final component".into(),
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

fn check_volume_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidName {
            what: "volume name",
            value: name.to_string(),
            message: "use [A-Za-z0-9._-], not '.' or '..'".into(),
        })
    }
}

/// tmp, fsync, rename, fsync dir: the manifest appears whole or not at all.
pub(crate) fn write_manifest(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let dst = dir.join(MANIFEST_FILE);
    let mut f = File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("write", &tmp, e));
    drop(f);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, &dst).map_err(|e| Error::io("rename", &tmp, e))?;
    fsync_dir(dir)
}

/// `syncfs(2)` on the filesystem holding `dir`: all of its dirty data and metadata is on disk
/// when this returns.
pub(crate) fn sync_filesystem(dir: &Path) -> Result<()> {
    let d = fs::File::open(dir).map_err(|e| Error::io("open dir", dir, e))?;
    nix::unistd::syncfs(&d).map_err(|e| Error::io("syncfs", dir, std::io::Error::from(e)))
}

pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync dir", dir, e))
}
