//! Sealing: archive the upper dirs and volumes, hash every file, write the manifest last.

use std::fs;
use std::path::{Path, PathBuf};

use ate_core::Fidelity;

use super::hash::{Hashed, hash_file};
use super::{
    CRIU_DIR, GenerationMeta, ROOTFS_ARCHIVE, VOLUMES_DIR, check_volume_name,
    container_rootfs_path, is_sealed, sync_filesystem, write_manifest,
};
use crate::archive;
use crate::error::{Error, Result};
use crate::manifest::{FORMAT_VERSION, FileEntry, Manifest, is_memory_pages_file};

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
    let containers = checked_inputs(&meta, upper_dir, containers, volumes)?;
    let gen_dir = gen_dir.to_path_buf();
    let upper = upper_dir.map(Path::to_path_buf);
    let volumes = volumes.to_vec();
    let what = format!("seal {}", gen_dir.display());
    tokio::task::spawn_blocking(move || {
        seal_blocking(&gen_dir, meta, upper.as_deref(), &containers, &volumes)
    })
    .await
    .map_err(|e| Error::task(what, e))?
}

/// The containers to archive, once the fidelity, upper dir and names are known to fit.
pub(super) fn checked_inputs(
    meta: &GenerationMeta,
    upper_dir: Option<&Path>,
    containers: &[(String, PathBuf)],
    volumes: &[(String, PathBuf)],
) -> Result<Vec<(String, PathBuf)>> {
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
    Ok(if upper_dir.is_some() {
        containers.to_vec()
    } else {
        Vec::new()
    })
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
    let rel_files = archive_and_list(gen_dir, &meta, upper, containers, volumes)?;
    let files = std::thread::scope(|scope| {
        // CRIU's dump and the archives sit in the page cache: the disk writes them while they
        // are hashed here, so the sync below has little left to do. On a thread of its own:
        // submitting a large file's writeback blocks while the disk's queue is full.
        scope.spawn(|| {
            for rel in &rel_files {
                if let Ok(f) = fs::File::open(gen_dir.join(rel)) {
                    crate::crypto::file::start_writeback(&f, 0, 0);
                }
            }
        });
        rel_files
            .iter()
            .map(|rel| {
                let hashed = hash_entry(&gen_dir.join(rel), is_memory_pages_file(rel))?;
                Ok(file_entry(rel.clone(), hashed))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let manifest = manifest_of(meta, files)?;
    // Every file and directory of the generation reaches the disk before the manifest that
    // makes it valid: one syncfs of the filesystem instead of an fsync per file and directory
    // (~3.5 ms each on these disks, ~100 ms for a small actor's 27 files).
    sync_filesystem(gen_dir)?;
    write_manifest(gen_dir, &manifest.to_json())?;
    Ok(manifest)
}

/// Checks what `gen_dir` (where CRIU dumped, for MEMORY) holds, writes the rootfs, container
/// and volume archives into it, and returns every file the generation is made of (relative,
/// sorted).
pub(super) fn archive_and_list(
    gen_dir: &Path,
    meta: &GenerationMeta,
    upper: Option<&Path>,
    containers: &[(String, PathBuf)],
    volumes: &[(String, PathBuf)],
) -> Result<Vec<String>> {
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
    Ok(rel_files)
}

/// The hashes a manifest pins a file by: a memory image (`chunked`) by its chunk digests alone
/// (manifest format 3; an empty one has no chunks and keeps its sha256), any other file by
/// its sha256.
pub(super) fn hash_entry(path: &Path, chunked: bool) -> Result<Hashed> {
    let hashed = hash_file(path, chunked, !chunked)?;
    if chunked && hashed.blake3_chunks.is_empty() {
        return hash_file(path, false, true);
    }
    Ok(hashed)
}

pub(super) fn file_entry(path: String, hashed: Hashed) -> FileEntry {
    FileEntry {
        path,
        size: hashed.size,
        sha256: hashed.sha256,
        blake3_chunks: hashed.blake3_chunks,
    }
}

/// The manifest of a generation of `files`, checked.
pub(super) fn manifest_of(meta: GenerationMeta, files: Vec<FileEntry>) -> Result<Manifest> {
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
        parent: meta.parent,
    };
    manifest.validate()?;
    Ok(manifest)
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
pub(super) fn list_files(base: &Path, rel: &Path, out: &mut Vec<String>) -> Result<()> {
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
