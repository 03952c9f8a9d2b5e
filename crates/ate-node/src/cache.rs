//! Eviction of `<state>/snapshot-cache`: downloads of durable generations (`<uuid>`, and
//! `<uuid>.lazy` for lazy restores) are reused by later restores on this node, but without an
//! end they would fill the disk. Each use stamps the entry's mtime ([`touch`]) under the entry's
//! download lock; a loop removes entries unused for `--snapshot-cache-ttl`, each under the same
//! lock and after checking its age again, so a restore that just took an entry keeps it.
//! Temporary download directories a crash left behind (names starting with `.`) go once they
//! are [`LEFTOVER_AGE`] old.
//!
//! A restore needs its entry only while it runs (CRIU reads the images during the restore; a
//! page source opens its pages images then and keeps reading through its open descriptors), so
//! an entry stamped at the start of a restore outlives it by the whole TTL.

use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

/// How often the cache is checked.
const EVERY: Duration = Duration::from_secs(600);
/// Age after which a temporary download directory is a crash's leftover (no download takes
/// this long; its directory's mtime also moves with every file it writes).
pub(crate) const LEFTOVER_AGE: Duration = Duration::from_secs(6 * 3600);

/// The lock that serialises making and using one cache entry (by file name).
pub(crate) type EntryLock = std::sync::Arc<tokio::sync::Mutex<()>>;
/// The entry lock of a cache entry, by file name.
pub(crate) type LockOf = std::sync::Arc<dyn Fn(&str) -> Option<EntryLock> + Send + Sync>;

/// Marks `entry` as used now.
pub(crate) fn touch(entry: &Path) {
    if let Ok(dir) = std::fs::File::open(entry) {
        let _ = dir.set_modified(SystemTime::now());
    }
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_dir())
        .and_then(|m| m.modified().ok())
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|a| a > age)
}

/// Removes the entries of `cache_dir` last used more than `ttl` ago (each under its lock from
/// `lock_of`, skipped while a restore holds it) and leftover temporary download directories
/// older than [`LEFTOVER_AGE`]. Returns how many were removed.
pub(crate) fn evict(
    cache_dir: &Path,
    ttl: Duration,
    lock_of: &dyn Fn(&str) -> Option<EntryLock>,
) -> usize {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let leftover = name.starts_with('.');
        if !older_than(&path, if leftover { LEFTOVER_AGE.max(ttl) } else { ttl }) {
            continue;
        }
        let lock = if leftover { None } else { lock_of(&name) };
        let _held = match &lock {
            Some(l) => match l.try_lock() {
                Ok(g) => Some(g),
                Err(_) => continue, // a restore is using or making it
            },
            None => None,
        };
        // Looked at again under the lock: a restore may have taken it since the listing.
        if !leftover && !older_than(&path, ttl) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                removed += 1;
                tracing::info!(entry = %path.display(), "snapshot cache: removed an entry unused for longer than --snapshot-cache-ttl");
            }
            Err(err) => {
                tracing::warn!(entry = %path.display(), error = %err, "snapshot cache: cannot remove an unused entry");
            }
        }
    }
    removed
}

/// Evicts from each of `cache_dirs` every [`EVERY`] until `stop` changes.
pub(crate) async fn run(
    cache_dirs: Vec<std::path::PathBuf>,
    ttl: Duration,
    lock_of: LockOf,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.changed() => return,
        }
        let dirs = cache_dirs.clone();
        let lock_of = lock_of.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for dir in &dirs {
                evict(dir, ttl, &*lock_of);
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aged_dir(path: &Path, age: Duration) {
        std::fs::create_dir_all(path.join("criu")).expect("mkdir");
        std::fs::write(path.join("criu/pages-1.img"), b"pages").expect("write");
        std::fs::File::open(path)
            .expect("open")
            .set_modified(SystemTime::now() - age)
            .expect("mtime");
    }

    #[test]
    fn unused_entries_and_old_leftovers_go_used_ones_stay() {
        let cache = tempfile::tempdir().expect("tempdir");
        let hour = Duration::from_secs(3600);
        aged_dir(&cache.path().join("old-uuid"), 2 * hour);
        aged_dir(&cache.path().join("old-uuid.lazy"), 2 * hour);
        aged_dir(&cache.path().join(".x.download-1234"), 7 * hour);
        aged_dir(&cache.path().join(".y.download-5678"), 2 * hour); // may still be downloading
        aged_dir(&cache.path().join("in-use"), 2 * hour);
        aged_dir(&cache.path().join("fresh-uuid"), Duration::from_secs(60));
        aged_dir(&cache.path().join("used-again"), 2 * hour);
        touch(&cache.path().join("used-again"));
        std::fs::write(cache.path().join("a-file"), b"not an entry").expect("write");

        let in_use: EntryLock = Default::default();
        let guard = in_use.clone().try_lock_owned().expect("lock");
        let lock_of = |name: &str| (name == "in-use").then(|| in_use.clone());
        assert_eq!(evict(cache.path(), hour, &lock_of), 3);
        let mut left: Vec<String> = std::fs::read_dir(cache.path())
            .expect("read_dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".y.download-5678",
                "a-file",
                "fresh-uuid",
                "in-use",
                "used-again"
            ]
        );
        // Once the restore is done with it, the unused entry goes too.
        drop(guard);
        assert_eq!(evict(cache.path(), hour, &lock_of), 1);
        assert!(!cache.path().join("in-use").exists());
        // A missing cache dir is nothing to do.
        assert_eq!(evict(&cache.path().join("absent"), hour, &lock_of), 0);
    }
}
