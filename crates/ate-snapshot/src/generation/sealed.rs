//! Node-local generations sealed at rest (docs/security.md, "Snapshots at rest").
//!
//! With snapshot keys configured ([`configure`]), a generation is written in plaintext only
//! into a **scratch** directory on a tmpfs (CRIU's dump, the archives), then every file is
//! hashed and sealed into the generation directory on disk, a memory image in one read
//! ([`seal_actor_generation_into`]), the sealed manifest last ([`seal_into`] seals a whole
//! plaintext generation, manifest included, the same way). To
//! use it, a worker (restore) or the node (upload) opens it into a scratch directory again
//! ([`open_into`]); CRIU, the page source and the uploader read that, and the scratch is
//! removed when they are done ([`Scratch`] removes itself when dropped). So memory and files
//! reach the disk only sealed.
//!
//! Each file is the object format of the durable store, bound to
//! `local:<atespace>/<name>/<generation dir>/<file>`: a file moved from another generation or
//! actor, a flipped bit, a truncated file, a file sealed under another data key and a plaintext
//! file all fail to open, named by [`Error::Unauthentic`] (damage, as a failed checksum).
//! The manifest is sealed the same way, so a swapped or rolled-back manifest is refused too.
//!
//! Generations written before (a plaintext `manifest.json`) are read as they are: they were
//! written by this node, whose root can read its keys anyway.
//!
//! Architecture invariant: the keys and the scratch root are the process's, set once at start
//! ([`configure`]); a process that never configures them writes and reads plaintext
//! generations, as before.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::crypto::file::{
    SealedError, SealedFile, looks_sealed, seal_file, seal_file_hashing, sealed_len,
};
use crate::crypto::{OpenError, SnapshotKeys};
use crate::error::{Error, Result};
use crate::manifest::{MANIFEST_FILE, Manifest};

use super::{fsync_dir, sync_filesystem, write_manifest};

/// Where plaintext passes unless configured otherwise: a tmpfs on every Debian machine.
pub const DEFAULT_SCRATCH: &str = "/dev/shm/ate-snapshots";
/// Threads that seal or open one file's frames at once.
const FRAME_THREADS: usize = 2;
/// `statfs` magic of tmpfs (and ramfs): memory, not a disk.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

struct Local {
    keys: Option<SnapshotKeys>,
    scratch: PathBuf,
}

static LOCAL: OnceLock<Local> = OnceLock::new();

/// Sets this process's snapshot keys (None: generations are written in plaintext) and scratch
/// root, once; false if they were set already. Says (a warning) when the scratch root is not
/// a tmpfs: plaintext would then pass through that disk.
pub fn configure(keys: Option<SnapshotKeys>, scratch: PathBuf) -> bool {
    if keys.is_some() && !is_memory_fs(&scratch) {
        tracing::warn!(scratch = %scratch.display(), "the snapshot scratch dir is not on a tmpfs: plaintext memory passes through its disk while a generation is sealed or opened (--snapshot-scratch)");
    }
    LOCAL.set(Local { keys, scratch }).is_ok()
}

/// The snapshot keys directory a node or worker uses: `explicit`, else `STATE_DIR/keys` when it
/// holds a data key; none when `off`.
pub fn keys_dir(explicit: Option<&Path>, off: bool, state_dir: &Path) -> Option<PathBuf> {
    if off {
        return None;
    }
    explicit.map(Path::to_path_buf).or_else(|| {
        let dir = state_dir.join("keys");
        dir.join(crate::crypto::DATA_KEY_FILE)
            .is_file()
            .then_some(dir)
    })
}

/// The keys generations are sealed with, if any.
pub fn keys() -> Option<&'static SnapshotKeys> {
    LOCAL.get().and_then(|l| l.keys.as_ref())
}

fn scratch_root() -> PathBuf {
    LOCAL
        .get()
        .map_or_else(|| PathBuf::from(DEFAULT_SCRATCH), |l| l.scratch.clone())
}

/// `dir`'s file system is memory (tmpfs/ramfs); for a path that does not exist yet, its
/// nearest existing ancestor's.
pub fn is_memory_fs(dir: &Path) -> bool {
    let probe = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or_else(|| Path::new("/"));
    nix::sys::statfs::statfs(probe).is_ok_and(|s| {
        let t = s.filesystem_type().0;
        t == TMPFS_MAGIC || t == RAMFS_MAGIC
    })
}

/// True when the generation's manifest is sealed (and so is every file).
pub fn is_encrypted(gen_dir: &Path) -> bool {
    looks_sealed(&gen_dir.join(MANIFEST_FILE))
}

/// What every frame of `rel` in `gen_dir` is bound to: the generation directory's last three
/// components (`<atespace>/<name>/<generation>-<uuid>`) and the file.
fn binding(gen_dir: &Path, rel: &str) -> String {
    let tail: Vec<_> = gen_dir
        .components()
        .rev()
        .take(3)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let tail: Vec<_> = tail.into_iter().rev().collect();
    format!("local:{}/{rel}", tail.join("/"))
}

fn need_keys(gen_dir: &Path) -> Result<&'static SnapshotKeys> {
    keys().ok_or_else(|| {
        Error::Keys(format!(
            "generation {} is sealed and this process has no snapshot keys (--snapshot-keys)",
            gen_dir.display()
        ))
    })
}

fn refused(rel: &str, e: SealedError, path: &Path) -> Error {
    match e {
        SealedError::Io(io) if io.kind() == std::io::ErrorKind::NotFound => Error::MissingFile {
            file: rel.to_string(),
        },
        SealedError::Io(io) => Error::io("read", path, io),
        SealedError::Open(o @ OpenError::OtherKey { .. }) => Error::ForeignKey {
            key: rel.to_string(),
            message: o.to_string(),
        },
        SealedError::Open(o) => Error::Unauthentic {
            key: rel.to_string(),
            message: o.to_string(),
        },
    }
}

/// The manifest bytes of a sealed generation, opened (`stored` as read from disk).
pub(super) fn open_manifest(gen_dir: &Path, stored: &[u8]) -> Result<Vec<u8>> {
    let keys = need_keys(gen_dir)?;
    let path = binding(gen_dir, MANIFEST_FILE);
    let mut opener = crate::crypto::Opener::new(keys, &path);
    let opened = opener
        .push(stored)
        .and_then(|pieces| opener.finish().map(|()| pieces));
    match opened {
        Ok(pieces) => Ok(crate::crypto::join(pieces).to_vec()),
        Err(e @ OpenError::OtherKey { .. }) => Err(Error::ForeignKey {
            key: MANIFEST_FILE.into(),
            message: e.to_string(),
        }),
        Err(e) => Err(Error::Unauthentic {
            key: MANIFEST_FILE.into(),
            message: e.to_string(),
        }),
    }
}

/// A file of a sealed generation, open for reading its plaintext.
pub(super) fn open_file(gen_dir: &Path, rel: &str) -> Result<SealedFile> {
    open_file_with(need_keys(gen_dir)?, gen_dir, rel)
}

/// [`open_file`] with these keys.
pub(super) fn open_file_with(keys: &SnapshotKeys, gen_dir: &Path, rel: &str) -> Result<SealedFile> {
    let full = gen_dir.join(rel);
    let file = File::open(&full).map_err(|e| refused(rel, SealedError::Io(e), &full))?;
    SealedFile::open(keys, &binding(gen_dir, rel), file).map_err(|e| refused(rel, e, &full))
}

/// The size on disk of a sealed file of `plain` bytes.
pub(super) fn sealed_size(gen_dir: &Path, plain: u64) -> Result<u64> {
    Ok(sealed_len(need_keys(gen_dir)?, plain))
}

/// [`Error::Unauthentic`] (or the I/O error) for a sealed file whose reading failed.
pub(super) fn reader_error(rel: &str, path: &Path, e: SealedError) -> Error {
    refused(rel, e, path)
}

/// A directory for plaintext under the scratch root (a tmpfs), 0700, removed with everything
/// in it when dropped. Named `<purpose>-<pid>-<random>`: [`sweep_scratch`] removes those whose
/// process is gone.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    pub fn new(purpose: &str) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let root = scratch_root();
        fs::create_dir_all(&root).map_err(|e| Error::io("create dir", &root, e))?;
        // Search only for others: a restored task in its user namespace reaches its images
        // through it (the entry itself is opened to that range's group only).
        fs::set_permissions(&root, fs::Permissions::from_mode(0o711))
            .map_err(|e| Error::io("chmod", &root, e))?;
        let path = root.join(format!(
            "{purpose}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        fs::create_dir(&path).map_err(|e| Error::io("create dir", &path, e))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("chmod", &path, e))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when `dir` lies in some scratch directory (of any process).
    pub fn contains(dir: &Path) -> bool {
        dir.starts_with(scratch_root())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.path.display(), error = %e, "cannot remove a snapshot scratch dir");
        }
    }
}

/// Removes scratch directories whose process is gone (a worker or node killed while sealing or
/// opening a generation). Returns how many.
pub fn sweep_scratch() -> usize {
    let root = scratch_root();
    let Ok(entries) = fs::read_dir(&root) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Seals the complete plaintext generation in `plain` (manifest and every file it lists) into
/// `gen_dir`, which must not be sealed yet: each file, then (after a sync) the manifest, last,
/// as [`super::seal_generation`] does. Returns the manifest.
pub async fn seal_into(plain: &Path, gen_dir: &Path) -> Result<Manifest> {
    let keys = need_keys(gen_dir)?.clone();
    let (plain, gen_dir) = (plain.to_path_buf(), gen_dir.to_path_buf());
    let what = format!("seal {}", gen_dir.display());
    tokio::task::spawn_blocking(move || seal_blocking(&keys, &plain, &gen_dir, true))
        .await
        .map_err(|e| Error::task(what, e))?
}

/// [`super::seal_actor_generation`] of what CRIU dumped into `write_dir` (a [`Scratch`]),
/// sealed straight into `gen_dir`, which must not be sealed yet: the archives are written into
/// the scratch and then hashed and sealed; each memory image is read once, its chunks hashed
/// and its frames sealed from the same read (a suspend's largest cost besides the dump); then,
/// after a sync, the sealed manifest, last. No plaintext manifest is written anywhere.
pub async fn seal_actor_generation_into(
    write_dir: &Path,
    gen_dir: &Path,
    meta: super::GenerationMeta,
    upper_dir: Option<&Path>,
    containers: &[(String, PathBuf)],
    volumes: &[(String, PathBuf)],
) -> Result<Manifest> {
    let keys = need_keys(gen_dir)?.clone();
    let containers = super::seal::checked_inputs(&meta, upper_dir, containers, volumes)?;
    let (write_dir, gen_dir) = (write_dir.to_path_buf(), gen_dir.to_path_buf());
    let upper = upper_dir.map(Path::to_path_buf);
    let volumes = volumes.to_vec();
    let what = format!("seal {}", gen_dir.display());
    tokio::task::spawn_blocking(move || {
        if super::is_sealed(&gen_dir) {
            return Err(Error::AlreadySealed {
                dir: gen_dir.to_path_buf(),
            });
        }
        let rel_files = super::seal::archive_and_list(
            &write_dir,
            &meta,
            upper.as_deref(),
            &containers,
            &volumes,
        )?;
        fs::create_dir_all(&gen_dir).map_err(|e| Error::io("create dir", &gen_dir, e))?;
        let mut files = Vec::with_capacity(rel_files.len());
        for rel in rel_files {
            let src = write_dir.join(&rel);
            files.push(seal_listed_file(&keys, &gen_dir, &gen_dir, &src, rel)?);
        }
        let manifest = super::seal::manifest_of(meta, files)?;
        sync_filesystem(&gen_dir)?;
        write_sealed_manifest(&keys, &gen_dir, &gen_dir, &manifest)?;
        Ok(manifest)
    })
    .await
    .map_err(|e| Error::task(what, e))?
}

/// Seals the plaintext `src` as the generation file `rel` into `write_to` (`<write_to>/<rel>`),
/// bound to the generation directory `bound_to` (where it will be read: the same directory,
/// or the one a finished temporary directory takes the place of), and returns its manifest
/// entry: a memory image hashed by chunks in the same read that seals it, any other file by
/// sha256.
pub(super) fn seal_listed_file(
    keys: &SnapshotKeys,
    bound_to: &Path,
    write_to: &Path,
    src: &Path,
    rel: String,
) -> Result<crate::manifest::FileEntry> {
    let dst = write_to.join(&rel);
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
    }
    let bound = binding(bound_to, &rel);
    let hashed = if crate::manifest::is_memory_pages_file(&rel) {
        let (size, digests) = seal_file_hashing(keys, &bound, src, &dst, FRAME_THREADS, true)
            .map_err(|e| Error::io("seal", &dst, e))?;
        if digests.is_empty() {
            super::seal::hash_entry(src, true)?
        } else {
            super::hash::Hashed {
                size,
                sha256: String::new(),
                blake3_chunks: digests,
            }
        }
    } else {
        let hashed = super::seal::hash_entry(src, false)?;
        seal_file(keys, &bound, src, &dst, FRAME_THREADS)
            .map_err(|e| Error::io("seal", &dst, e))?;
        hashed
    };
    Ok(super::seal::file_entry(rel, hashed))
}

/// Writes `manifest`, sealed and bound to `bound_to`, into `write_to` (tmp, fsync, rename).
pub(super) fn write_sealed_manifest(
    keys: &SnapshotKeys,
    bound_to: &Path,
    write_to: &Path,
    manifest: &Manifest,
) -> Result<()> {
    let sealed =
        crate::crypto::seal_object(keys, &binding(bound_to, MANIFEST_FILE), &manifest.to_json())?;
    write_manifest(write_to, &sealed)
}

/// The process's snapshot keys, or an error naming `gen_dir` that needs them.
pub(super) fn keys_for(gen_dir: &Path) -> Result<&'static SnapshotKeys> {
    need_keys(gen_dir)
}

/// [`seal_into`] for a cache of the durable store (a download kept for the next restore): on a
/// thread of its own at the lowest CPU priority, so the resumes and suspends under way keep the
/// cores, and without a sync (a copy torn by a crash fails to open, frame by frame, and is
/// downloaded again; a sync would also write out every other file's dirty pages on that disk).
pub async fn seal_into_cache(plain: &Path, gen_dir: &Path) -> Result<Manifest> {
    let keys = need_keys(gen_dir)?.clone();
    let (plain, gen_dir) = (plain.to_path_buf(), gen_dir.to_path_buf());
    let what = format!("seal {} into the cache", gen_dir.display());
    crate::durable::run_at(
        crate::durable::UploadPriority::Background,
        what,
        move || seal_blocking(&keys, &plain, &gen_dir, false),
    )
    .await
}

fn seal_blocking(
    keys: &SnapshotKeys,
    plain: &Path,
    gen_dir: &Path,
    synced: bool,
) -> Result<Manifest> {
    if super::is_sealed(gen_dir) {
        return Err(Error::AlreadySealed {
            dir: gen_dir.to_path_buf(),
        });
    }
    let manifest_path = plain.join(MANIFEST_FILE);
    let bytes = fs::read(&manifest_path).map_err(|e| Error::io("read", &manifest_path, e))?;
    let manifest = Manifest::from_json(&bytes)?;
    fs::create_dir_all(gen_dir).map_err(|e| Error::io("create dir", gen_dir, e))?;
    for f in &manifest.files {
        let src = plain.join(&f.path);
        let dst = gen_dir.join(&f.path);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
        }
        seal_file(keys, &binding(gen_dir, &f.path), &src, &dst, FRAME_THREADS)
            .map_err(|e| Error::io("seal", &dst, e))?;
    }
    if synced {
        sync_filesystem(gen_dir)?;
    }
    let sealed = crate::crypto::seal_object(keys, &binding(gen_dir, MANIFEST_FILE), &bytes)?;
    write_manifest(gen_dir, &sealed)?;
    Ok(manifest)
}

/// The sealed generation's manifest opens and every file it lists has the size it seals to:
/// what a node checks of a cached sealed copy before a worker opens it (which authenticates
/// every frame it reads). A plaintext generation gets the same size check.
pub async fn check_sizes(gen_dir: &Path) -> Result<Manifest> {
    super::verify_with_bytes(gen_dir, false)
        .await
        .map(|(manifest, _)| manifest)
}

/// Which files [`open_into`] opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Everything: an eager restore.
    All,
    /// Everything but the memory images, which [`super::MemoryFile`] reads chunk by chunk from
    /// the sealed generation (a [`super::SEALED_SOURCE_FILE`] in the scratch dir names it): an
    /// upload, and a parent an upload takes deltas from.
    Small,
    /// The CRIU images but the memory images, which are left as empty files: what CRIU opens
    /// of the parent of an incremental dump (it checks the pages it leaves to the parent
    /// against the parent's pagemaps, and opens, but does not read, its pages files).
    ParentOfDump,
    /// The CRIU images alone, memory images included: what a flatten merges (the archives
    /// of the generation are kept sealed as they are).
    Images,
}

/// Opens the sealed generation `gen_dir` into `plain` (a [`Scratch`]): the manifest, then the
/// files `which` selects, each checked to open whole (every frame authenticated) at the size the
/// manifest says. What it refuses names the file ([`Error::Unauthentic`], damage). Returns the
/// manifest. A plaintext generation (written before encryption) is refused: read it in place.
pub async fn open_into(gen_dir: &Path, plain: &Path, which: Opening) -> Result<Manifest> {
    let (gen_dir, plain) = (gen_dir.to_path_buf(), plain.to_path_buf());
    let what = format!("open {}", gen_dir.display());
    tokio::task::spawn_blocking(move || {
        let manifest = open_blocking(&gen_dir, &plain, which)?;
        if which == Opening::Small {
            super::memory_file::write_sealed_source(&plain, &source_of(&gen_dir))?;
        }
        Ok(manifest)
    })
    .await
    .map_err(|e| Error::task(what, e))?
}

fn source_of(gen_dir: &Path) -> super::SealedSource {
    super::SealedSource {
        generation: gen_dir.to_path_buf(),
        keys: keys().and_then(|k| k.dir()).map(Path::to_path_buf),
    }
}

/// True when this process's keys were loaded from a directory, which a page source can load
/// them from too: the condition for [`open_for_lazy_restore`].
pub fn can_open_lazily() -> bool {
    keys().is_some_and(|k| k.dir().is_some())
}

/// Opens what a lazy restore of the sealed generation `gen_dir` needs before CRIU starts into
/// `plain`: every file but the memory images, and of those (sparse files of their full size)
/// only the chunks `eager` names (called with `plain` once the small files are in: the chunks
/// CRIU reads itself, as `(path, chunk index)`). The page source reads every other chunk from
/// the sealed files as it needs it ([`super::SEALED_SOURCE_FILE`]). Needs keys loaded from a
/// directory ([`can_open_lazily`]).
pub async fn open_for_lazy_restore<F>(gen_dir: &Path, plain: &Path, eager: F) -> Result<Manifest>
where
    F: FnOnce(&Path) -> Result<Vec<(String, u64)>> + Send + 'static,
{
    let (gen_dir, plain) = (gen_dir.to_path_buf(), plain.to_path_buf());
    let what = format!("open {}", gen_dir.display());
    tokio::task::spawn_blocking(move || {
        let source = source_of(&gen_dir);
        if source.keys.is_none() {
            return Err(Error::Keys(
                "a lazy restore of a sealed generation needs keys loaded from a directory (--snapshot-keys)".into(),
            ));
        }
        let manifest = open_blocking(&gen_dir, &plain, Opening::Small)?;
        let wanted = eager(&plain)?;
        let mut buf = Vec::new();
        for entry in manifest.files.iter().filter(|f| f.has_chunk_digests()) {
            let out = plain.join(&entry.path);
            if let Some(parent) = out.parent() {
                fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
            }
            let dst = File::create(&out).map_err(|e| Error::io("create", &out, e))?;
            dst.set_len(entry.size)
                .map_err(|e| Error::io("truncate", &out, e))?;
            let mut chunks = wanted
                .iter()
                .filter(|(p, _)| *p == entry.path)
                .map(|(_, i)| *i)
                .peekable();
            if chunks.peek().is_none() {
                continue;
            }
            let file = super::MemoryFile::open(&gen_dir, entry)?;
            for index in chunks {
                file.read_trusted_chunk(entry, index, &mut buf)?;
                let (start, _) = entry.chunk_range(index).unwrap_or((0, 0));
                std::os::unix::fs::FileExt::write_all_at(&dst, &buf, start)
                    .map_err(|e| Error::io("write", &out, e))?;
            }
        }
        super::memory_file::write_sealed_source(&plain, &source)?;
        Ok(manifest)
    })
    .await
    .map_err(|e| Error::task(what, e))?
}

fn open_blocking(gen_dir: &Path, plain: &Path, which: Opening) -> Result<Manifest> {
    let manifest_path = gen_dir.join(MANIFEST_FILE);
    let stored = match fs::read(&manifest_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Incomplete {
                dir: gen_dir.to_path_buf(),
            });
        }
        Err(e) => return Err(Error::io("read", &manifest_path, e)),
    };
    if !stored.starts_with(crate::crypto::MAGIC) {
        return Err(Error::InvalidInput(format!(
            "generation {} is not sealed",
            gen_dir.display()
        )));
    }
    let bytes = open_manifest(gen_dir, &stored)?;
    let manifest = Manifest::from_json(&bytes)?;
    fs::create_dir_all(plain).map_err(|e| Error::io("create dir", plain, e))?;
    for f in &manifest.files {
        if which == Opening::Small && f.has_chunk_digests() {
            continue;
        }
        let in_images = f.path.starts_with(&format!("{}/", super::CRIU_DIR));
        if which == Opening::Images && !in_images {
            continue;
        }
        if which == Opening::ParentOfDump {
            if !in_images {
                continue;
            }
            if crate::manifest::is_memory_pages_file(&f.path) {
                let out = plain.join(&f.path);
                if let Some(parent) = out.parent() {
                    fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
                }
                File::create(&out).map_err(|e| Error::io("create", &out, e))?;
                continue;
            }
        }
        let sealed = open_file(gen_dir, &f.path)?;
        if sealed.plain_len() != f.size {
            return Err(Error::SizeMismatch {
                file: f.path.clone(),
                expected: f.size,
                actual: sealed.plain_len(),
            });
        }
        let out = plain.join(&f.path);
        if let Some(parent) = out.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
        }
        sealed
            .open_into(&out, FRAME_THREADS)
            .map_err(|e| refused(&f.path, e, &gen_dir.join(&f.path)))?;
    }
    fs::write(plain.join(MANIFEST_FILE), &bytes)
        .map_err(|e| Error::io("write", plain.join(MANIFEST_FILE), e))?;
    fsync_dir(plain).ok();
    Ok(manifest)
}
