//! Extraction of a generation's archives, each swapped in whole, and quarantine of a corrupt one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{
    ROOTFS_ARCHIVE, VOLUMES_DIR, check_volume_name, container_rootfs_path, fsync_dir,
    parent_and_name, sibling,
};
use crate::archive;
use crate::error::{Error, Result};

/// Where [`quarantine`] moves a generation directory: `<parent>/.<name>.corrupt`, beside it
/// (hidden, like every other non-generation sibling this crate writes).
pub fn quarantine_path(gen_dir: &Path) -> Result<PathBuf> {
    let (parent, name) = parent_and_name(gen_dir, "generation dir")?;
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
