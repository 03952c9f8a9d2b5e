//! Applying a layer tar onto a rootfs: whiteouts, opaque dirs, paths kept inside the rootfs.

use std::fs::{self, File};
use std::io::{BufReader, Read, Seek};
use std::path::{Component, Path, PathBuf};

use crate::error::{ImageError, IoContext, Result};

/// Applies one verified layer file, naming the layer in I/O errors.
pub(crate) fn apply_verified_layer(path: &Path, digest: &str, rootfs: &Path) -> Result<()> {
    apply_layer(path, rootfs).map_err(|e| match e {
        ImageError::Io { what, source } => ImageError::Io {
            what: format!("layer {digest}: {what}"),
            source,
        },
        other => other,
    })
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
    use super::*;

    #[test]
    fn cleans_paths() {
        assert_eq!(
            clean_relative(Path::new("./a/b")),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(clean_relative(Path::new("/a/../b")), None);
        assert_eq!(clean_relative(Path::new(".")), None);
    }
}
