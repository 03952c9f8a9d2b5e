//! Overlay mounts for the actor's rootfs, and detaching them (also the leftovers of a CRIU
//! restore ended in the middle, found in mountinfo).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::error::{IoContext, Result, SandboxError};

pub(super) fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    nix::mount::mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::empty(),
        Some(opts.as_str()),
    )
    .ctx(|| format!("mount overlay at {} ({opts})", target.display()))
}

pub(super) fn unmount_if_mounted(target: &Path) -> Result<()> {
    // Loop: an earlier crash may have stacked mounts on the same point.
    for _ in 0..8 {
        match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => {
                return Err(SandboxError::io(
                    format!("unmount {}", target.display()),
                    e.into(),
                ));
            }
        }
    }
    Ok(())
}

/// Detaches every mount at or below `dir`, deepest first. A CRIU restore that was ended in the
/// middle (its page source gave up) leaves its cgroup yard (a tmpfs with cgroup mounts, in the
/// restore's work dir) and runc's `criu-root` overlay mounted; nothing else mounts there.
pub(super) fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        if let Err(e) = unmount_if_mounted(&p) {
            tracing::warn!(mount = %p.display(), error = %e, "leftover mount");
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(p: &str) -> String {
    let bytes = p.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/é\\134x"), "/é\\x");
        assert_eq!(unescape_mount_path("/end\\04"), "/end\\04");
    }
}
