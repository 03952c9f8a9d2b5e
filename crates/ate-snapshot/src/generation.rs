//! A generation directory on the node: seal (archive + hash + manifest last), verify, extract.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ate_core::Fidelity;
use futures::{FutureExt, StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

use crate::archive;
use crate::error::{Error, Result};
use crate::manifest::{
    CHUNK_BYTES, FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest, is_memory_pages_file,
};

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
}

/// True when `gen_dir/manifest.json` exists (complete by definition; [`verify`] checks contents).
pub fn is_sealed(gen_dir: &Path) -> bool {
    gen_dir.join(MANIFEST_FILE).is_file()
}

/// Archives `upper_dir` (ROOTFS and MEMORY fidelity) and `volumes` into `gen_dir`, hashes every
/// file (including the CRIU images already in `gen_dir/criu` for MEMORY; memory images
/// `criu/pages-<N>.img` also get a BLAKE3 digest per 2 MiB chunk, from the same read), and writes
/// `manifest.json` last. A `criu/` dir left by a failed dump is not part of a ROOTFS/VOLUMES
/// generation and is left out of the manifest.
pub async fn seal_generation(
    gen_dir: &Path,
    meta: GenerationMeta,
    upper_dir: Option<&Path>,
    volumes: &[(String, PathBuf)],
) -> Result<Manifest> {
    seal_actor_generation(gen_dir, meta, upper_dir, &[], volumes).await
}

/// [`seal_generation`] of an actor with several containers: `upper_dir` is its first
/// container's, `containers` (name, upper dir) the others', archived as
/// `containers/<name>/rootfs.tar` at ROOTFS and MEMORY fidelity (ignored at VOLUMES).
pub async fn seal_actor_generation(
    gen_dir: &Path,
    meta: GenerationMeta,
    upper_dir: Option<&Path>,
    containers: &[(String, PathBuf)],
    volumes: &[(String, PathBuf)],
) -> Result<Manifest> {
    match (meta.fidelity, upper_dir) {
        (Fidelity::Memory | Fidelity::Rootfs, None) => {
            return Err(Error::InvalidInput(format!(
                "{} needs the rootfs upper dir",
                meta.fidelity
            )));
        }
        (Fidelity::Volumes, Some(_)) => {
            return Err(Error::InvalidInput(
                "FIDELITY_VOLUMES keeps no rootfs: pass no upper dir".into(),
            ));
        }
        _ => {}
    }
    for (name, _) in volumes.iter().chain(containers) {
        check_volume_name(name)?;
    }
    let gen_dir = gen_dir.to_path_buf();
    let upper = upper_dir.map(Path::to_path_buf);
    let containers = if upper.is_some() {
        containers.to_vec()
    } else {
        Vec::new()
    };
    let volumes = volumes.to_vec();
    let what = format!("seal {}", gen_dir.display());
    tokio::task::spawn_blocking(move || {
        seal_blocking(&gen_dir, meta, upper.as_deref(), &containers, &volumes)
    })
    .await
    .map_err(|e| Error::task(what, e))?
}

fn seal_blocking(
    gen_dir: &Path,
    meta: GenerationMeta,
    upper: Option<&Path>,
    containers: &[(String, PathBuf)],
    volumes: &[(String, PathBuf)],
) -> Result<Manifest> {
    if is_sealed(gen_dir) {
        return Err(Error::AlreadySealed {
            dir: gen_dir.to_path_buf(),
        });
    }
    fs::create_dir_all(gen_dir).map_err(|e| Error::io("create dir", gen_dir, e))?;
    let criu = gen_dir.join(CRIU_DIR);
    if meta.fidelity == Fidelity::Memory && !dir_has_files(&criu)? {
        return Err(Error::InvalidInput(format!(
            "FIDELITY_MEMORY but {} holds no CRIU images",
            criu.display()
        )));
    }

    if let Some(upper) = upper {
        archive::create(upper, &gen_dir.join(ROOTFS_ARCHIVE))?;
    }
    for (name, src) in containers {
        let path = gen_dir.join(container_rootfs_path(name));
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
        }
        archive::create(src, &path)?;
    }
    if !volumes.is_empty() {
        let vdir = gen_dir.join(VOLUMES_DIR);
        fs::create_dir_all(&vdir).map_err(|e| Error::io("create dir", &vdir, e))?;
        for (name, src) in volumes {
            archive::create(src, &vdir.join(format!("{name}.tar")))?;
        }
    }

    let mut rel_files = Vec::new();
    if upper.is_some() {
        rel_files.push(ROOTFS_ARCHIVE.to_string());
    }
    for (name, _) in containers {
        rel_files.push(container_rootfs_path(name));
    }
    for (name, _) in volumes {
        rel_files.push(format!("{VOLUMES_DIR}/{name}.tar"));
    }
    if meta.fidelity == Fidelity::Memory {
        list_files(gen_dir, Path::new(CRIU_DIR), &mut rel_files)?;
    }
    rel_files.sort();

    let mut files = Vec::with_capacity(rel_files.len());
    for rel in rel_files {
        let chunked = is_memory_pages_file(&rel);
        // A memory image is pinned by its chunk digests alone (manifest format 3); an empty
        // one has no chunks and keeps its sha256.
        let hashed = hash_file(&gen_dir.join(&rel), chunked, !chunked)?;
        let hashed = if chunked && hashed.blake3_chunks.is_empty() {
            hash_file(&gen_dir.join(&rel), false, true)?
        } else {
            hashed
        };
        files.push(FileEntry {
            path: rel,
            size: hashed.size,
            sha256: hashed.sha256,
            blake3_chunks: hashed.blake3_chunks,
        });
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        atespace: meta.atespace,
        name: meta.name,
        generation: meta.generation,
        uuid: meta.uuid,
        fidelity: meta.fidelity,
        template: meta.template,
        sandbox_class: meta.sandbox_class,
        node: meta.node,
        boot_id: meta.boot_id,
        created_unix_ms: meta.created_unix_ms,
        reason: meta.reason,
        files,
    };
    manifest.validate()?;
    // Every file and directory of the generation reaches the disk before the manifest that
    // makes it valid: one syncfs of the filesystem instead of an fsync per file and directory
    // (~3.5 ms each on these disks, ~100 ms for a small actor's 27 files).
    sync_filesystem(gen_dir)?;
    write_manifest(gen_dir, &manifest.to_json())?;
    Ok(manifest)
}

/// Checks that the manifest is present and parses, and that every listed file exists with its
/// size and sha256 (and, for memory images, its chunk digests, from the same read). Files not
/// listed are ignored.
pub async fn verify(gen_dir: &Path) -> Result<Manifest> {
    Ok(verify_with_bytes(gen_dir, true).await?.0)
}

/// [`verify`], also returning the manifest's bytes as read (they are what gets uploaded). With
/// `hash` false only presence and sizes are checked (an upload hashes each file as it
/// compresses it and refuses a mismatch before the manifest goes up, so a second pass would
/// only cost CPU).
pub(crate) async fn verify_with_bytes(gen_dir: &Path, hash: bool) -> Result<(Manifest, Vec<u8>)> {
    let (manifest, bytes) = read_manifest_with_bytes(gen_dir).await?;
    let check = if hash { Check::Full } else { Check::SizeOnly };
    check_files(gen_dir, &manifest, check).await?;
    Ok((manifest, bytes))
}

/// The generation's manifest, read and validated, without looking at the files it lists (a
/// restore starts from it while [`verify_files`] hashes them).
pub async fn read_manifest(gen_dir: &Path) -> Result<Manifest> {
    Ok(read_manifest_with_bytes(gen_dir).await?.0)
}

/// The second half of [`verify`]: every file `manifest` lists exists in `gen_dir` with its size
/// and sha256, and every chunk digest a file has matches (one read of each file for both).
pub async fn verify_files(gen_dir: &Path, manifest: &Manifest) -> Result<()> {
    check_files(gen_dir, manifest, Check::Full).await
}

/// [`verify_files`] for a lazy restore: a file with chunk digests (a memory image) is only
/// checked for presence and size, since its chunks are checked as they are read
/// ([`read_verified_chunk_at`], [`verify_chunks`]); every other file is hashed in full.
pub async fn verify_files_except_chunked(gen_dir: &Path, manifest: &Manifest) -> Result<()> {
    check_files(gen_dir, manifest, Check::ExceptChunked).await
}

/// Reads chunk `index` of `file` (the file `entry` describes) into `buf`, resized to the chunk's
/// length, and checks it against the manifest's BLAKE3 digest. Blocking (a positioned read of up
/// to [`CHUNK_BYTES`]); for a page-source thread. See [`read_verified_chunk_at`] for an open file.
pub fn read_verified_chunk(
    file: &Path,
    entry: &FileEntry,
    index: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    // Arguments first: a bad index is the caller's mistake whatever is on disk.
    chunk_span(entry, index)?;
    let f = open_listed(file, entry)?;
    read_chunk(&f, file, entry, index, buf)
}

/// [`read_verified_chunk`] on a file already open (a page source keeps its images open). I/O
/// errors name `entry.path`. A file shorter than the chunk is a [`Error::SizeMismatch`]; a chunk
/// whose BLAKE3 differs is an [`Error::ChunkMismatch`] (both [`Error::is_corrupt`]). An index
/// past the end, or an entry without chunk digests, is an [`Error::InvalidInput`].
pub fn read_verified_chunk_at(
    file: &File,
    entry: &FileEntry,
    index: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    read_chunk(file, Path::new(&entry.path), entry, index, buf)
}

/// Checks the chunks `which` (`(path relative to gen_dir, chunk index)`) of the generation's
/// memory images against `manifest` (e.g. the chunks a restore reads eagerly). Blocking; each
/// file is opened once. A path the manifest does not list, a file without chunk digests or an
/// index past the end is an [`Error::InvalidInput`].
pub fn verify_chunks(gen_dir: &Path, manifest: &Manifest, which: &[(String, u64)]) -> Result<()> {
    let mut open: Vec<(&str, &FileEntry, File, PathBuf)> = Vec::new();
    let mut buf = Vec::new();
    for (rel, index) in which {
        let slot = match open.iter().position(|(p, ..)| *p == rel.as_str()) {
            Some(i) => i,
            None => {
                let entry = manifest.file(rel).ok_or_else(|| {
                    Error::InvalidInput(format!("{rel}: not listed in the manifest"))
                })?;
                chunk_span(entry, *index)?;
                let full = gen_dir.join(rel);
                let f = open_listed(&full, entry)?;
                open.push((rel.as_str(), entry, f, full));
                open.len() - 1
            }
        };
        let (_, entry, f, full) = &open[slot];
        read_chunk(f, full, entry, *index, &mut buf)?;
    }
    Ok(())
}

/// `(start, end, digest)` of chunk `index`, or why there is none.
fn chunk_span(entry: &FileEntry, index: u64) -> Result<(u64, u64, &str)> {
    if !entry.has_chunk_digests() {
        return Err(Error::InvalidInput(format!(
            "{}: the manifest has no chunk digests for it",
            entry.path
        )));
    }
    match (entry.chunk_range(index), entry.chunk_digest(index)) {
        (Some((start, end)), Some(digest)) => Ok((start, end, digest)),
        _ => Err(Error::InvalidInput(format!(
            "{}: chunk {index} is past the end ({} bytes, {} chunks)",
            entry.path,
            entry.size,
            entry.chunk_count()
        ))),
    }
}

/// Opens a listed file for reading; absent (or not a regular file) is [`Error::MissingFile`].
fn open_listed(full: &Path, entry: &FileEntry) -> Result<File> {
    match File::open(full) {
        Ok(f) => match f.metadata() {
            Ok(m) if m.is_file() => Ok(f),
            Ok(_) => Err(Error::MissingFile {
                file: entry.path.clone(),
            }),
            Err(e) => Err(Error::io("stat", full, e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::MissingFile {
            file: entry.path.clone(),
        }),
        Err(e) => Err(Error::io("open", full, e)),
    }
}

/// pread of chunk `index` into `buf`, then BLAKE3 against the manifest. `shown` names the file
/// in I/O errors.
fn read_chunk(
    f: &File,
    shown: &Path,
    entry: &FileEntry,
    index: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let (start, end, _) = chunk_span(entry, index)?;
    // A chunk is at most CHUNK_BYTES (2 MiB): fits usize.
    let len = (end - start) as usize;
    buf.resize(len, 0);
    match f.read_exact_at(buf, start) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            // Shorter than the manifest says: the image was truncated.
            let actual = f.metadata().map_err(|e| Error::io("stat", shown, e))?.len();
            return Err(Error::SizeMismatch {
                file: entry.path.clone(),
                expected: entry.size,
                actual,
            });
        }
        Err(e) => return Err(Error::io("read", shown, e)),
    }
    verify_chunk_bytes(entry, index, buf)
}

/// Checks `data` as chunk `index` of the file `entry` describes: its length and its BLAKE3
/// digest against the manifest (a chunk fetched from the durable store, or read from disk).
pub fn verify_chunk_bytes(entry: &FileEntry, index: u64, data: &[u8]) -> Result<()> {
    let (start, end, expected) = chunk_span(entry, index)?;
    let actual = blake3::hash(data).to_hex();
    if data.len() as u64 != end - start || actual.as_str() != expected {
        return Err(Error::ChunkMismatch {
            file: entry.path.clone(),
            chunk: index,
            start,
            end,
            expected: expected.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}

async fn read_manifest_with_bytes(gen_dir: &Path) -> Result<(Manifest, Vec<u8>)> {
    let path = gen_dir.join(MANIFEST_FILE);
    let bytes = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::Incomplete {
                dir: gen_dir.to_path_buf(),
            });
        }
        Err(e) => return Err(Error::io("read", path, e)),
    };
    let manifest = Manifest::from_json(&bytes)?;
    Ok((manifest, bytes))
}

/// How much of each listed file [`check_files`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Presence and size only.
    SizeOnly,
    /// Presence, size, sha256 and chunk digests.
    Full,
    /// [`Check::Full`], except presence and size only for a file with chunk digests.
    ExceptChunked,
}

async fn check_files(gen_dir: &Path, manifest: &Manifest, check: Check) -> Result<()> {
    // Built eagerly and boxed: a stream `map` closure here makes callers' futures fail rustc's
    // higher-ranked `Send` check (rust-lang/rust#102211).
    let checks: Vec<_> = manifest
        .files
        .iter()
        .cloned()
        .map(|f| {
            let full = gen_dir.join(&f.path);
            async move {
                let what = format!("hash {}", full.display());
                tokio::task::spawn_blocking(move || check_file(&full, &f, check))
                    .await
                    .map_err(|e| Error::task(what, e))?
            }
            .boxed()
        })
        .collect();
    futures::stream::iter(checks)
        .buffered(HASH_PARALLELISM)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn check_file(full: &Path, f: &FileEntry, check: Check) -> Result<()> {
    let meta = match fs::symlink_metadata(full) {
        Ok(m) if m.is_file() => m,
        Ok(_) => {
            return Err(Error::MissingFile {
                file: f.path.clone(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::MissingFile {
                file: f.path.clone(),
            });
        }
        Err(e) => return Err(Error::io("stat", full, e)),
    };
    // Size first: cheap, and a truncated file needs no hashing to be rejected.
    if meta.len() != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: meta.len(),
        });
    }
    match check {
        Check::SizeOnly => return Ok(()),
        Check::ExceptChunked if f.has_chunk_digests() => return Ok(()),
        Check::Full | Check::ExceptChunked => {}
    }
    let hashed = hash_file(full, f.has_chunk_digests(), !f.sha256.is_empty())?;
    if hashed.size != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: hashed.size,
        });
    }
    // The first damaged chunk first: it says where the damage is, the sha256 only that there
    // is some.
    for (index, (actual, expected)) in
        (0u64..).zip(hashed.blake3_chunks.iter().zip(&f.blake3_chunks))
    {
        if actual != expected {
            let (start, end) = f.chunk_range(index).unwrap_or((0, f.size));
            return Err(Error::ChunkMismatch {
                file: f.path.clone(),
                chunk: index,
                start,
                end,
                expected: expected.clone(),
                actual: actual.clone(),
            });
        }
    }
    if !f.sha256.is_empty() && hashed.sha256 != f.sha256 {
        return Err(Error::ChecksumMismatch {
            file: f.path.clone(),
            expected: f.sha256.clone(),
            actual: hashed.sha256,
        });
    }
    Ok(())
}

/// Where [`quarantine`] moves a generation directory: `<parent>/.<name>.corrupt`, beside it
/// (hidden, like every other non-generation sibling this crate writes).
pub fn quarantine_path(gen_dir: &Path) -> Result<PathBuf> {
    let name = gen_dir.file_name().ok_or_else(|| Error::InvalidName {
        what: "generation dir",
        value: gen_dir.display().to_string(),
        message: "has no final component".into(),
    })?;
    let parent = match gen_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(parent.join(format!(".{}.corrupt", name.to_string_lossy())))
}

/// Moves a generation that failed verification out of the way, to [`quarantine_path`], so that
/// nothing takes it for a generation again while its files stay for inspection. One rename: the
/// directory is either still the generation or gone from its path, never half moved. A copy an
/// earlier quarantine of the same directory left is replaced. Idempotent: `Ok(None)` when
/// `gen_dir` is already gone.
pub async fn quarantine(gen_dir: &Path) -> Result<Option<PathBuf>> {
    let gen_dir = gen_dir.to_path_buf();
    let what = format!("quarantine {}", gen_dir.display());
    tokio::task::spawn_blocking(move || quarantine_blocking(&gen_dir))
        .await
        .map_err(|e| Error::task(what, e))?
}

fn quarantine_blocking(gen_dir: &Path) -> Result<Option<PathBuf>> {
    let aside = quarantine_path(gen_dir)?;
    match fs::symlink_metadata(gen_dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("stat", gen_dir, e)),
    }
    match fs::remove_dir_all(&aside) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("remove", &aside, e)),
    }
    fs::rename(gen_dir, &aside).map_err(|e| Error::io("rename", gen_dir, e))?;
    if let Some(parent) = aside.parent() {
        fsync_dir(parent)?;
    }
    Ok(Some(aside))
}

/// Replaces the contents of `target_upper` with the generation's `rootfs.tar`.
pub async fn extract_rootfs(gen_dir: &Path, target_upper: &Path) -> Result<()> {
    extract_to(gen_dir.join(ROOTFS_ARCHIVE), target_upper.to_path_buf()).await
}

/// Replaces the contents of `target_upper` with the generation's archive of the upper dir of
/// container `name` (an actor's second or later container).
pub async fn extract_container_rootfs(
    gen_dir: &Path,
    name: &str,
    target_upper: &Path,
) -> Result<()> {
    check_volume_name(name)?;
    extract_to(
        gen_dir.join(container_rootfs_path(name)),
        target_upper.to_path_buf(),
    )
    .await
}

/// Replaces the contents of `target` with the generation's `volumes/<name>.tar`.
pub async fn extract_volume(gen_dir: &Path, name: &str, target: &Path) -> Result<()> {
    check_volume_name(name)?;
    extract_to(
        gen_dir.join(VOLUMES_DIR).join(format!("{name}.tar")),
        target.to_path_buf(),
    )
    .await
}

async fn extract_to(archive_path: PathBuf, target: PathBuf) -> Result<()> {
    let what = format!("extract {}", archive_path.display());
    tokio::task::spawn_blocking(move || extract_blocking(&archive_path, &target))
        .await
        .map_err(|e| Error::task(what, e))?
}

/// Unpacks into a temp sibling, then swaps it in with renames, so the target is never half
/// written: it holds either the old contents or the archive's.
fn extract_blocking(archive_path: &Path, target: &Path) -> Result<()> {
    if !archive_path.is_file() {
        return Err(Error::MissingFile {
            file: archive_path.display().to_string(),
        });
    }
    let (parent, tmp) = sibling(target, "extract")?;
    fs::create_dir_all(&parent).map_err(|e| Error::io("create dir", &parent, e))?;
    fs::create_dir(&tmp).map_err(|e| Error::io("create dir", &tmp, e))?;
    // No fsync: the target is an actor's working copy, which a worker never reuses after a
    // crash (it removes leftover actor dirs at start; the generation is the truth).
    let unpacked = archive::extract(archive_path, &tmp);
    if let Err(e) = unpacked {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = match fs::symlink_metadata(target) {
        Ok(_) => {
            let (_, old) = sibling(target, "old")?;
            if let Err(e) = fs::rename(target, &old) {
                let _ = fs::remove_dir_all(&tmp);
                return Err(Error::io("rename", target, e));
            }
            Some(old)
        }
        Err(_) => None,
    };
    if let Err(e) = fs::rename(&tmp, target) {
        // Put the old contents back rather than leaving no target at all.
        if let Some(old) = &old {
            let _ = fs::rename(old, target);
        }
        let _ = fs::remove_dir_all(&tmp);
        return Err(Error::io("rename", &tmp, e));
    }
    if let Some(old) = old {
        fs::remove_dir_all(&old).map_err(|e| Error::io("remove", &old, e))?;
    }
    Ok(())
}

/// `(<parent>, <parent>/.<name>.<tag>-<uuid>)`: same file system, so the final rename is atomic.
pub(crate) fn sibling(target: &Path, tag: &str) -> Result<(PathBuf, PathBuf)> {
    let name = target.file_name().ok_or_else(|| Error::InvalidName {
        what: "target",
        value: target.display().to_string(),
        message: "has no final component".into(),
    })?;
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = parent.join(format!(
        ".{}.{tag}-{}",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ));
    Ok((parent, tmp))
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

fn dir_has_files(dir: &Path) -> Result<bool> {
    let mut out = Vec::new();
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        _ => return Ok(false),
    }
    list_files(dir.parent().unwrap_or(dir), Path::new(CRIU_DIR), &mut out)?;
    Ok(!out.is_empty())
}

/// Regular files under `base/rel`, as `/`-joined paths relative to `base`.
fn list_files(base: &Path, rel: &Path, out: &mut Vec<String>) -> Result<()> {
    let dir = base.join(rel);
    for entry in fs::read_dir(&dir).map_err(|e| Error::io("read dir", &dir, e))? {
        let entry = entry.map_err(|e| Error::io("read dir", &dir, e))?;
        let child = rel.join(entry.file_name());
        let ft = entry
            .file_type()
            .map_err(|e| Error::io("stat", entry.path(), e))?;
        if ft.is_dir() {
            list_files(base, &child, out)?;
        } else if ft.is_file() {
            let s = child.to_str().ok_or_else(|| Error::InvalidName {
                what: "file name",
                value: child.display().to_string(),
                message: "not UTF-8".into(),
            })?;
            out.push(s.to_string());
        } else {
            // CRIU writes only regular files; anything else would not survive a durable copy.
            return Err(Error::InvalidInput(format!(
                "{}: not a regular file or directory",
                entry.path().display()
            )));
        }
    }
    Ok(())
}

/// What one read of a file found.
struct Hashed {
    size: u64,
    /// Lowercase hex.
    sha256: String,
    /// BLAKE3 (lowercase hex) per [`CHUNK_BYTES`] chunk; empty unless asked for.
    blake3_chunks: Vec<String>,
}

/// Size and (when `sha256`) sha256 of a file and, when `chunked`, the BLAKE3 of each
/// [`CHUNK_BYTES`] chunk: one read of the file. The chunk digests are computed on a second
/// thread while this one reads (and feeds sha256); `sha256` is empty when not asked for.
fn hash_file(path: &Path, chunked: bool, sha256: bool) -> Result<Hashed> {
    let mut f = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut h = sha256.then(Sha256::new);
    // CHUNK_BYTES is 2 MiB: fits usize.
    let chunk = CHUNK_BYTES as usize;
    if !chunked {
        let mut buf = vec![0u8; chunk];
        let mut size = 0u64;
        loop {
            let n = read_full(&mut f, &mut buf).map_err(|e| Error::io("read", path, e))?;
            if let Some(h) = h.as_mut() {
                h.update(&buf[..n]);
            }
            size += n as u64;
            if n < buf.len() {
                break;
            }
        }
        return Ok(Hashed {
            size,
            sha256: h.map(|h| hex::encode(h.finalize())).unwrap_or_default(),
            blake3_chunks: Vec::new(),
        });
    }
    std::thread::scope(|scope| {
        // Filled chunks go to the BLAKE3 threads and come back empty. Two hashing threads: a
        // suspend waits for this, and one thread hashes a 1 GiB image in ~0.4 s here.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 2));
        let (to_blake3, filled) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(threads);
        let filled = std::sync::Arc::new(std::sync::Mutex::new(filled));
        let (give_back, empty) = std::sync::mpsc::channel::<Vec<u8>>();
        for _ in 0..2 * threads + 1 {
            let _ = give_back.send(vec![0u8; chunk]);
        }
        let hashers: Vec<_> = (0..threads)
            .map(|_| {
                let give_back = give_back.clone();
                let filled = filled.clone();
                scope.spawn(move || {
                    let mut digests = Vec::new();
                    loop {
                        let next = filled.lock().map(|rx| rx.recv());
                        let Ok(Ok((index, buf))) = next else {
                            break;
                        };
                        digests.push((index, blake3::hash(&buf).to_hex().to_string()));
                        // The reader may have stopped (error or end): nobody needs the buffer.
                        let _ = give_back.send(buf);
                    }
                    digests
                })
            })
            .collect();
        drop(give_back);
        let mut index = 0usize;
        let mut size = 0u64;
        let read = (|| -> Result<()> {
            loop {
                let Ok(mut buf) = empty.recv() else {
                    return Err(Error::io(
                        "hash",
                        path,
                        io::Error::other("chunk hashing thread ended"),
                    ));
                };
                buf.resize(chunk, 0);
                let n = read_full(&mut f, &mut buf).map_err(|e| Error::io("read", path, e))?;
                if n == 0 {
                    return Ok(());
                }
                buf.truncate(n);
                if let Some(h) = h.as_mut() {
                    h.update(&buf);
                }
                size += n as u64;
                index += 1;
                if to_blake3.send((index - 1, buf)).is_err() {
                    return Err(Error::io(
                        "hash",
                        path,
                        io::Error::other("chunk hashing thread ended"),
                    ));
                }
                if n < chunk {
                    // read_full stops short only at end of file.
                    return Ok(());
                }
            }
        })();
        drop(to_blake3);
        let mut indexed = Vec::new();
        for hasher in hashers {
            indexed.extend(hasher.join().map_err(|_| {
                Error::io(
                    "hash",
                    path,
                    io::Error::other("chunk hashing thread panicked"),
                )
            })?);
        }
        read?;
        indexed.sort_unstable_by_key(|(i, _)| *i);
        if indexed.len() != index || indexed.iter().enumerate().any(|(n, (i, _))| n != *i) {
            return Err(Error::io(
                "hash",
                path,
                io::Error::other("a chunk was not hashed"),
            ));
        }
        let digests = indexed.into_iter().map(|(_, d)| d).collect();
        Ok(Hashed {
            size,
            sha256: h.map(|h| hex::encode(h.finalize())).unwrap_or_default(),
            blake3_chunks: digests,
        })
    })
}

/// Fills `buf` from `f`, short only at end of file; returns how many bytes it read.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
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
