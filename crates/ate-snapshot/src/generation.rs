//! A generation directory on the node: seal (archive + hash + manifest last), verify, extract.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use ate_core::Fidelity;
use futures::{FutureExt, StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

use crate::archive;
use crate::error::{Error, Result};
use crate::manifest::{FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest};

/// CRIU images, written there directly by `runc checkpoint --image-path <gen>/criu`.
pub const CRIU_DIR: &str = "criu";
/// Archive of the overlay upper dir.
pub const ROOTFS_ARCHIVE: &str = "rootfs.tar";
/// `volumes/<name>.tar`, one per volume.
pub const VOLUMES_DIR: &str = "volumes";

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
/// file (including the CRIU images already in `gen_dir/criu` for MEMORY), and writes
/// `manifest.json` last. A `criu/` dir left by a failed dump is not part of a ROOTFS/VOLUMES
/// generation and is left out of the manifest.
pub async fn seal_generation(
    gen_dir: &Path,
    meta: GenerationMeta,
    upper_dir: Option<&Path>,
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
    for (name, _) in volumes {
        check_volume_name(name)?;
    }
    let gen_dir = gen_dir.to_path_buf();
    let upper = upper_dir.map(Path::to_path_buf);
    let volumes = volumes.to_vec();
    let what = format!("seal {}", gen_dir.display());
    tokio::task::spawn_blocking(move || seal_blocking(&gen_dir, meta, upper.as_deref(), &volumes))
        .await
        .map_err(|e| Error::task(what, e))?
}

fn seal_blocking(
    gen_dir: &Path,
    meta: GenerationMeta,
    upper: Option<&Path>,
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
    for (name, _) in volumes {
        rel_files.push(format!("{VOLUMES_DIR}/{name}.tar"));
    }
    if meta.fidelity == Fidelity::Memory {
        list_files(gen_dir, Path::new(CRIU_DIR), &mut rel_files)?;
    }
    rel_files.sort();

    let mut files = Vec::with_capacity(rel_files.len());
    for rel in rel_files {
        let (size, sha256) = hash_file(&gen_dir.join(&rel))?;
        files.push(FileEntry {
            path: rel,
            size,
            sha256,
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
/// size and sha256. Files not listed are ignored.
pub async fn verify(gen_dir: &Path) -> Result<Manifest> {
    Ok(verify_with_bytes(gen_dir, true).await?.0)
}

/// [`verify`], also returning the manifest's bytes as read (they are what gets uploaded). With
/// `hash` false only presence and sizes are checked (an upload hashes each file as it
/// compresses it and refuses a mismatch before the manifest goes up, so a second pass would
/// only cost CPU).
pub(crate) async fn verify_with_bytes(gen_dir: &Path, hash: bool) -> Result<(Manifest, Vec<u8>)> {
    let (manifest, bytes) = read_manifest_with_bytes(gen_dir).await?;
    check_files(gen_dir, &manifest, hash).await?;
    Ok((manifest, bytes))
}

/// The generation's manifest, read and validated, without looking at the files it lists (a
/// restore starts from it while [`verify_files`] hashes them).
pub async fn read_manifest(gen_dir: &Path) -> Result<Manifest> {
    Ok(read_manifest_with_bytes(gen_dir).await?.0)
}

/// The second half of [`verify`]: every file `manifest` lists exists in `gen_dir` with its size
/// and sha256.
pub async fn verify_files(gen_dir: &Path, manifest: &Manifest) -> Result<()> {
    check_files(gen_dir, manifest, true).await
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

async fn check_files(gen_dir: &Path, manifest: &Manifest, hash: bool) -> Result<()> {
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
                tokio::task::spawn_blocking(move || check_file(&full, &f, hash))
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

fn check_file(full: &Path, f: &FileEntry, hash: bool) -> Result<()> {
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
    if !hash {
        return Ok(());
    }
    let (size, sha) = hash_file(full)?;
    if size != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: size,
        });
    }
    if sha != f.sha256 {
        return Err(Error::ChecksumMismatch {
            file: f.path.clone(),
            expected: f.sha256.clone(),
            actual: sha,
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

/// `(size, sha256 hex)` of a file.
pub(crate) fn hash_file(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("read", path, e)),
        };
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(h.finalize())))
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
