//! Sweeping unpacked images no actor has used within the retention and no overlay mounts.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::{CONFIG_FILE, LAST_USED_FILE, digest_hex, lock_entry};
use crate::error::{ImageError, IoContext, Result};

/// What [`sweep_unused`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepStats {
    pub entries_seen: usize,
    pub entries_removed: usize,
}

/// Removes unpacked images no sandbox uses: entries last used more than `retention` ago whose
/// rootfs is not the lower dir of any overlay mount. Each entry is checked and removed under its
/// lock; leftovers of interrupted unpacks (`.tmp-*`) older than `retention` go too. Blocking.
pub fn sweep_unused(cache: &Path, retention: Duration) -> Result<SweepStats> {
    let mut stats = SweepStats::default();
    let entries = match fs::read_dir(cache) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(stats),
        Err(e) => return Err(ImageError::io(format!("read {}", cache.display()), e)),
    };
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .ctx(|| "read /proc/self/mountinfo".to_string())?;
    let now = SystemTime::now();
    let old = |path: &Path| {
        fs::metadata(path)
            .and_then(|m| m.modified())
            .map(|t| now.duration_since(t).unwrap_or(Duration::ZERO) > retention)
            .unwrap_or(false)
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(".tmp-") {
            if old(&path) {
                let _ = fs::remove_dir_all(&path);
            }
            continue;
        }
        if name.starts_with('.') || !path.is_dir() || digest_hex(&format!("sha256:{name}")).is_err()
        {
            continue;
        }
        stats.entries_seen += 1;
        let _lock = lock_entry(cache, &name)?;
        let mark = path.join(LAST_USED_FILE);
        let used = if mark.exists() {
            mark
        } else {
            path.join(CONFIG_FILE)
        };
        if !old(&used) {
            continue;
        }
        let rootfs = path.join("rootfs");
        if mounted_as_lower(&mountinfo, &rootfs) {
            continue;
        }
        fs::remove_dir_all(&path).ctx(|| format!("remove {}", path.display()))?;
        let _ = fs::remove_file(cache.join(format!(".{name}.lock")));
        stats.entries_removed += 1;
        tracing::info!(image = %name, "removed an unpacked image no actor used for {retention:?}");
    }
    Ok(stats)
}

/// Whether `rootfs` is a lower dir of an overlay mount in `mountinfo`.
fn mounted_as_lower(mountinfo: &str, rootfs: &Path) -> bool {
    let needle = rootfs.display().to_string();
    mountinfo.lines().any(|line| {
        line.split_once(" - ").is_some_and(|(_, right)| {
            right.starts_with("overlay ")
                && right
                    .split(',')
                    .filter_map(|o| o.split_once("lowerdir="))
                    .any(|(_, dirs)| dirs.split(':').any(|d| d == needle))
        })
    })
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;
    use crate::cached;

    fn entry(cache: &Path, hex: &str, age: Duration) {
        let dir = cache.join(hex);
        fs::create_dir_all(dir.join("rootfs")).unwrap();
        let cfg = r#"{"entrypoint":[],"cmd":[],"env":[],"working_dir":""}"#;
        fs::write(dir.join(CONFIG_FILE), cfg).unwrap();
        let mark = dir.join(LAST_USED_FILE);
        fs::write(&mark, b"").unwrap();
        File::options()
            .write(true)
            .open(&mark)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    }

    #[test]
    fn sweep_removes_only_entries_unused_past_the_retention() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let (old, fresh) = ("a".repeat(64), "b".repeat(64));
        entry(cache, &old, Duration::from_secs(7200));
        entry(cache, &fresh, Duration::from_secs(60));
        fs::create_dir_all(cache.join("not-a-digest")).unwrap();
        let stats = sweep_unused(cache, Duration::from_secs(3600)).unwrap();
        assert_eq!(stats.entries_removed, 1);
        assert!(!cache.join(&old).exists());
        assert!(cache.join(&fresh).exists());
        assert!(
            cache.join("not-a-digest").exists(),
            "foreign directories are left alone"
        );
        // A use (what a start does) renews an entry.
        entry(cache, &old, Duration::from_secs(7200));
        let digest = format!("sha256:{old}");
        assert!(cached(cache, "ref", &digest).unwrap().is_some());
        let stats = sweep_unused(cache, Duration::from_secs(3600)).unwrap();
        assert_eq!(stats.entries_removed, 0);
        assert!(sweep_unused(&cache.join("missing"), Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn a_mounted_image_is_in_use() {
        let rootfs = Path::new("/var/lib/ate/images-cache/abc/rootfs");
        let info = "62 27 0:49 / /var/lib/ate/workers/w/actors/ns/a/rootfs rw,relatime - overlay overlay rw,lowerdir=/var/lib/ate/images-cache/abc/rootfs,upperdir=/x/upper,workdir=/x/work";
        assert!(mounted_as_lower(info, rootfs));
        assert!(!mounted_as_lower(
            info,
            Path::new("/var/lib/ate/images-cache/abd/rootfs")
        ));
        let two = "1 2 0:1 / /m rw - overlay overlay rw,lowerdir=/l1:/var/lib/ate/images-cache/abc/rootfs,upperdir=/u";
        assert!(mounted_as_lower(two, rootfs));
        assert!(!mounted_as_lower(
            "1 2 0:1 / /m rw - ext4 /dev/sda rw",
            rootfs
        ));
    }
}
