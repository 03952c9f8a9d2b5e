//! Replacing a generation's memory images in place, atomically: how an incremental generation
//! becomes a whole one once its images are flattened (docs/incremental-suspend.md).
//!
//! The new generation is built in a sibling directory: every file but the memory images is a
//! hard link of the old one (a sealed file stays valid: it is bound to the generation's final
//! name, which the new directory takes), the new images are sealed (or copied) in and hashed,
//! and the manifest, without its `parent`, is written last. Then `renameat2(RENAME_EXCHANGE)`
//! swaps the two directories in one step and the old one is removed. A crash before the swap
//! leaves the old generation as it was (and a `.<name>.flat-*` directory that
//! [`remove_leftovers`] clears); after it, the new one.
//!
//! Architecture invariant: a generation changes at most once in its life, from incremental to
//! whole, and only here; a reader that needs its files to hold still makes it whole first.

use std::fs;
use std::path::{Path, PathBuf};

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};

use super::{CRIU_DIR, fsync_dir, sync_filesystem, write_manifest};
use crate::error::{Error, Result};
use crate::manifest::{FileEntry, Manifest};

/// Tag of the temporary sibling a replacement is built in.
const FLAT_TAG: &str = "flat";

/// Replaces the memory images (`criu/…`) of the generation `gen_dir` with the plaintext images
/// under `plain/criu/`, and drops the manifest's `parent`: the generation stays sealed (with
/// this process's snapshot keys) if it was sealed, plaintext otherwise. Returns the new
/// manifest. Everything but the memory images is kept as it is.
pub async fn replace_memory(gen_dir: &Path, plain: &Path) -> Result<Manifest> {
    let old = super::read_manifest(gen_dir).await?;
    let sealed = super::sealed::is_encrypted(gen_dir);
    let (gen_dir, plain) = (gen_dir.to_path_buf(), plain.to_path_buf());
    let what = format!("replace the memory of {}", gen_dir.display());
    tokio::task::spawn_blocking(move || {
        let (_, tmp) = super::sibling(&gen_dir, FLAT_TAG)?;
        let built = build(&gen_dir, &tmp, &plain, old, sealed);
        let manifest = match built {
            Ok(m) => m,
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        if let Err(e) = renameat2(AT_FDCWD, &tmp, AT_FDCWD, &gen_dir, RenameFlags::RENAME_EXCHANGE)
        {
            let _ = fs::remove_dir_all(&tmp);
            return Err(Error::io(
                "exchange",
                &gen_dir,
                std::io::Error::from(e),
            ));
        }
        if let Some(parent) = gen_dir.parent() {
            fsync_dir(parent)?;
        }
        // `tmp` now holds the old generation.
        if let Err(e) = fs::remove_dir_all(&tmp) {
            tracing::warn!(dir = %tmp.display(), error = %e, "cannot remove a replaced generation; it is cleared with the next replacement");
        }
        Ok(manifest)
    })
    .await
    .map_err(|e| Error::task(what, e))?
}

/// Removes what replacements of `gen_dir` interrupted by a crash left beside it.
pub fn remove_leftovers(gen_dir: &Path) {
    let (Some(parent), Some(name)) = (gen_dir.parent(), gen_dir.file_name()) else {
        return;
    };
    let prefix = format!(".{}.{FLAT_TAG}-", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn build(
    gen_dir: &Path,
    tmp: &Path,
    plain: &Path,
    old: Manifest,
    sealed: bool,
) -> Result<Manifest> {
    fs::create_dir_all(tmp).map_err(|e| Error::io("create dir", tmp, e))?;
    let in_criu = |p: &str| p.starts_with(&format!("{CRIU_DIR}/"));
    let mut files: Vec<FileEntry> = Vec::with_capacity(old.files.len());
    for f in old.files.iter().filter(|f| !in_criu(&f.path)) {
        let (src, dst) = (gen_dir.join(&f.path), tmp.join(&f.path));
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
        }
        fs::hard_link(&src, &dst).map_err(|e| Error::io("link", &src, e))?;
        files.push(f.clone());
    }
    let mut images = Vec::new();
    super::seal::list_files(plain, Path::new(CRIU_DIR), &mut images)?;
    let keys = if sealed {
        Some(super::sealed::keys_for(gen_dir)?)
    } else {
        None
    };
    for rel in images {
        let src = plain.join(&rel);
        let entry = match keys {
            Some(keys) => super::sealed::seal_listed_file(keys, gen_dir, tmp, &src, rel)?,
            None => copy_listed_file(tmp, &src, rel)?,
        };
        files.push(entry);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let manifest = Manifest {
        files,
        parent: None,
        format_version: crate::FORMAT_VERSION,
        ..old
    };
    manifest.validate()?;
    sync_filesystem(tmp)?;
    match keys {
        Some(keys) => super::sealed::write_sealed_manifest(keys, gen_dir, tmp, &manifest)?,
        None => write_manifest(tmp, &manifest.to_json())?,
    }
    Ok(manifest)
}

/// Copies the plaintext `src` to `<tmp>/<rel>` and hashes the copy.
fn copy_listed_file(tmp: &Path, src: &Path, rel: String) -> Result<FileEntry> {
    let dst: PathBuf = tmp.join(&rel);
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io("create dir", parent, e))?;
    }
    fs::copy(src, &dst).map_err(|e| Error::io("copy", src, e))?;
    let hashed = super::seal::hash_entry(&dst, crate::manifest::is_memory_pages_file(&rel))?;
    Ok(super::seal::file_entry(rel, hashed))
}
