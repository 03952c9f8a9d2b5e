//! Tar archives of the overlay upper dir and volume dirs, faithful enough for overlayfs:
//! modes, owners, mtimes, symlinks, empty dirs, char-device whiteouts (0:0), fifos and the
//! `trusted.overlay.*` / `user.overlay.*` / `security.capability` xattrs (as PAX `SCHILY.xattr.*`).
//! Blocking code: callers run it in `spawn_blocking`.

use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use tar::{EntryType, Header, HeaderMode};

use crate::error::{Error, Result};

/// Xattrs that carry overlayfs state (opaque dirs, redirects, xattr whiteouts) or file
/// capabilities; everything else (e.g. SELinux labels of the host) is host-specific.
fn keep_xattr(name: &[u8]) -> bool {
    name.starts_with(b"trusted.overlay.")
        || name.starts_with(b"user.overlay.")
        || name == b"security.capability"
}

/// Archives the contents of `src` (not following symlinks) into a new file at `dst`. Not
/// fsynced: the seal makes the whole generation durable with one `syncfs` before its manifest.
pub(crate) fn create(src: &Path, dst: &Path) -> Result<()> {
    let file = File::create(dst).map_err(|e| Error::io("create", dst, e))?;
    let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, file));
    b.follow_symlinks(false);
    let root_meta = fs::symlink_metadata(src).map_err(|e| Error::io("stat", src, e))?;
    if !root_meta.is_dir() {
        return Err(Error::InvalidInput(format!(
            "{} is not a directory",
            src.display()
        )));
    }
    // The root entry carries the dir's own mode, owner and xattrs (an opaque upper root).
    append_entry(&mut b, src, Path::new("."), &root_meta, dst)?;
    walk(&mut b, src, Path::new(""), dst)?;
    let w = b.into_inner().map_err(|e| Error::io("write", dst, e))?;
    w.into_inner()
        .map_err(|e| Error::io("write", dst, e.into_error()))?;
    Ok(())
}

fn walk(b: &mut tar::Builder<BufWriter<File>>, root: &Path, rel: &Path, dst: &Path) -> Result<()> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| Error::io("read dir", &dir, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()
        .map_err(|e| Error::io("read dir", &dir, e))?;
    // Sorted so the same tree gives the same archive.
    names.sort();
    for name in names {
        let child_rel = rel.join(&name);
        let full = root.join(&child_rel);
        let meta = fs::symlink_metadata(&full).map_err(|e| Error::io("stat", &full, e))?;
        if meta.file_type().is_socket() {
            // Sockets cannot be archived and are recreated by whoever listens on them.
            tracing::debug!(path = %full.display(), "skipping socket");
            continue;
        }
        append_entry(b, &full, &child_rel, &meta, dst)?;
        if meta.is_dir() {
            walk(b, root, &child_rel, dst)?;
        }
    }
    Ok(())
}

fn append_entry(
    b: &mut tar::Builder<BufWriter<File>>,
    full: &Path,
    rel: &Path,
    meta: &fs::Metadata,
    dst: &Path,
) -> Result<()> {
    let werr = |e| Error::io("write", dst, e);
    let ft = meta.file_type();
    if !ft.is_symlink() {
        let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
        let names = xattr::list(full).map_err(|e| Error::io("list xattrs", full, e))?;
        for n in names {
            let bytes = n.as_bytes();
            if !keep_xattr(bytes) {
                continue;
            }
            if let Some(v) = xattr::get(full, &n).map_err(|e| Error::io("get xattr", full, e))? {
                pax.push((format!("SCHILY.xattr.{}", n.to_string_lossy()), v));
            }
        }
        if !pax.is_empty() {
            b.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
                .map_err(werr)?;
        }
    }
    let mut h = Header::new_gnu();
    h.set_metadata_in_mode(meta, HeaderMode::Complete);
    if ft.is_dir() {
        h.set_entry_type(EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, rel, io::empty()).map_err(werr)?;
    } else if ft.is_file() {
        let f = File::open(full).map_err(|e| Error::io("open", full, e))?;
        h.set_size(meta.len());
        // `append_data` copies exactly `size` bytes; a file that shrank under us is an error.
        b.append_data(&mut h, rel, f)
            .map_err(|e| Error::io("archive", full, e))?;
    } else if ft.is_symlink() {
        let target = fs::read_link(full).map_err(|e| Error::io("readlink", full, e))?;
        h.set_entry_type(EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, rel, &target).map_err(werr)?;
    } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() {
        h.set_entry_type(if ft.is_char_device() {
            EntryType::Char
        } else if ft.is_block_device() {
            EntryType::Block
        } else {
            EntryType::Fifo
        });
        h.set_size(0);
        let rdev = meta.rdev();
        h.set_device_major(major(rdev)).map_err(werr)?;
        h.set_device_minor(minor(rdev)).map_err(werr)?;
        b.append_data(&mut h, rel, io::empty()).map_err(werr)?;
    }
    Ok(())
}

// glibc's encoding of dev_t.
fn major(dev: u64) -> u32 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32
}
fn minor(dev: u64) -> u32 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32
}

/// `SCHILY.xattr.*` name → value pairs of one entry.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Unpacks `archive` into `dst` (an empty directory that only this call writes to).
/// Entries naming `..` or absolute paths are refused.
pub(crate) fn extract(archive: &Path, dst: &Path) -> Result<()> {
    let file = File::open(archive).map_err(|e| Error::io("open", archive, e))?;
    let mut ar = tar::Archive::new(io::BufReader::with_capacity(1 << 20, file));
    // Owners only as root (an unprivileged test run cannot chown).
    let root_owner = nix::unistd::geteuid().is_root();
    ar.set_preserve_permissions(true);
    ar.set_preserve_ownerships(root_owner);
    ar.set_preserve_mtime(true);
    ar.set_unpack_xattrs(true);
    ar.set_overwrite(true);
    let aerr = |entry: &str, message: String| Error::Archive {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        message,
    };
    let mut dirs = Vec::new();
    let mut root_entry: Option<(Header, Xattrs)> = None;
    for entry in ar
        .entries()
        .map_err(|e| aerr("", format!("read entries: {e}")))?
    {
        let mut entry = entry.map_err(|e| aerr("", format!("read entry: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| aerr("", format!("entry path: {e}")))?
            .into_owned();
        let name = raw.display().to_string();
        let rel = clean_rel(&raw).ok_or_else(|| aerr(&name, "path escapes the target".into()))?;
        let kind = entry.header().entry_type();
        if rel.as_os_str().is_empty() {
            if kind.is_dir() {
                root_entry = Some((entry.header().clone(), pax_xattrs(&mut entry)));
            }
            continue;
        }
        match kind {
            EntryType::Directory => {
                let xattrs = pax_xattrs(&mut entry);
                dirs.push((rel, entry, xattrs));
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let xattrs = pax_xattrs(&mut entry);
                make_special(dst, &rel, entry.header(), &xattrs, root_owner)
                    .map_err(|e| aerr(&name, e.to_string()))?;
            }
            _ => {
                entry
                    .unpack_in(dst)
                    .map_err(|e| aerr(&name, e.to_string()))?;
            }
        }
    }
    // Deepest first, so a read-only dir gets its mode after its children exist.
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    for (rel, mut entry, xattrs) in dirs {
        let name = rel.display().to_string();
        entry
            .unpack_in(dst)
            .map_err(|e| aerr(&name, e.to_string()))?;
        // `tar` sets xattrs on files only; overlayfs keeps opaque/redirect marks on dirs.
        let path = dst.join(&rel);
        for (k, v) in &xattrs {
            xattr::set(&path, std::ffi::OsStr::from_bytes(k), v)
                .map_err(|e| aerr(&name, format!("set xattr: {e}")))?;
        }
    }
    if let Some((h, xattrs)) = root_entry {
        apply_meta(dst, &h, &xattrs, root_owner, false).map_err(|e| aerr(".", e.to_string()))?;
    }
    Ok(())
}

fn pax_xattrs<R: io::Read>(entry: &mut tar::Entry<'_, R>) -> Xattrs {
    let Ok(Some(exts)) = entry.pax_extensions() else {
        return Vec::new();
    };
    exts.filter_map(|e| e.ok())
        .filter_map(|e| {
            e.key_bytes()
                .strip_prefix(b"SCHILY.xattr.")
                .map(|k| (k.to_vec(), e.value_bytes().to_vec()))
        })
        .collect()
}

/// Relative path with only normal components; `None` if it names `..` (or is otherwise odd).
fn clean_rel(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) | Component::ParentDir => return None,
        }
    }
    Some(out)
}

/// mknod for whiteouts (char 0:0), fifos and device nodes; `tar` would write them as plain files.
fn make_special(
    dst: &Path,
    rel: &Path,
    h: &Header,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    root_owner: bool,
) -> io::Result<()> {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let kind = match h.entry_type() {
        EntryType::Char => SFlag::S_IFCHR,
        EntryType::Block => SFlag::S_IFBLK,
        _ => SFlag::S_IFIFO,
    };
    let (major, minor) = (
        h.device_major()?.unwrap_or(0),
        h.device_minor()?.unwrap_or(0),
    );
    // An actor's files hold no device but overlayfs whiteouts (0:0): an actor cannot make one,
    // and a node for a real device (/dev/userfaultfd, which an actor's device filter allows
    // CRIU to open) must never appear in its root from an archive someone altered.
    if kind != SFlag::S_IFIFO && (major, minor) != (0, 0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "archive entry {} is a device node ({major}:{minor}): only overlay whiteouts (0:0) are restored",
                rel.display()
            ),
        ));
    }
    // Parents must be real directories inside `dst`, never symlinks (an archive could plant a
    // symlink first and aim the node outside).
    let mut cur = dst.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(io::Error::other(format!(
                        "parent {} is not a directory",
                        cur.display()
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&cur)?,
                Err(e) => return Err(e),
            }
        }
    }
    let path = dst.join(rel);
    if fs::symlink_metadata(&path).is_ok() {
        fs::remove_file(&path)?;
    }
    let dev = makedev(u64::from(major), u64::from(minor));
    mknod(&path, kind, Mode::from_bits_truncate(0o600), dev).map_err(io::Error::from)?;
    apply_meta(&path, h, xattrs, root_owner, true)
}

/// Owner, mode, xattrs and mtime from a header onto an existing path.
fn apply_meta(
    path: &Path,
    h: &Header,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    root_owner: bool,
    set_mtime: bool,
) -> io::Result<()> {
    if root_owner {
        std::os::unix::fs::lchown(path, Some(h.uid()? as u32), Some(h.gid()? as u32))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(h.mode()? & 0o7777))?;
    for (k, v) in xattrs {
        xattr::set(path, std::ffi::OsStr::from_bytes(k), v)?;
    }
    if set_mtime {
        let t = nix::sys::time::TimeSpec::new(h.mtime()? as i64, 0);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            path,
            &t,
            &t,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .map_err(io::Error::from)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar holding one character device entry `major:minor` at `dev/x`.
    fn archive_with_device(dir: &Path, major: u32, minor: u32) -> PathBuf {
        let path = dir.join("rootfs.tar");
        let mut b = tar::Builder::new(File::create(&path).expect("create"));
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Char);
        h.set_path("dev/x").expect("path");
        h.set_mode(0o600);
        h.set_size(0);
        h.set_device_major(major).expect("major");
        h.set_device_minor(minor).expect("minor");
        h.set_cksum();
        b.append(&h, io::empty()).expect("append");
        b.finish().expect("finish");
        path
    }

    #[test]
    fn a_device_node_other_than_a_whiteout_is_refused_and_not_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tar = archive_with_device(dir.path(), 10, 257);
        let dst = dir.path().join("out");
        fs::create_dir(&dst).expect("mkdir");
        let err = extract(&tar, &dst).expect_err("a device node must be refused");
        let msg = err.to_string();
        assert!(msg.contains("dev/x") && msg.contains("10:257"), "{msg}");
        assert!(fs::symlink_metadata(dst.join("dev/x")).is_err());
    }
}
