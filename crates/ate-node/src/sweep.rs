//! Background sweep of the durable store: deletes what uploads cut off by a dead node left
//! behind (objects under a key with no `manifest.json`, older than `--durable-gc-age`), and the
//! memory chunks no generation references any more (deleted generations leave their chunks,
//! which other generations may share). It runs
//! in a task of its own, so a slow or failing object store never holds up the node's other loops.

use std::time::Duration;

use ate_snapshot::DurableStore;
use tokio::sync::watch;

/// Path segments of a durable key: `<atespace>/<name>/<generation>-<uuid>` (see
/// [`durable_key`]).
pub(crate) const DURABLE_KEY_DEPTH: usize = 3;

/// Where the node uploads a generation; [`DURABLE_KEY_DEPTH`] segments.
pub(crate) fn durable_key(atespace: &str, name: &str, generation: u64, uuid: &str) -> String {
    format!("{atespace}/{name}/{generation}-{uuid}")
}

/// When the sweep runs. Random offsets keep the nodes of a fleet (often restarted together)
/// from listing the bucket at the same instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// The first sweep: this long after the start, plus up to `first_jitter`.
    pub first: Duration,
    pub first_jitter: Duration,
    /// Then every `every`, give or take `every_jitter`.
    pub every: Duration,
    pub every_jitter: Duration,
    /// A sweep still running after this is abandoned (deleting is idempotent; the next one
    /// starts over).
    pub timeout: Duration,
}

impl Schedule {
    /// One to five minutes after the start, then hourly (45 to 75 minutes apart).
    pub(crate) const DEFAULT: Schedule = Schedule {
        first: Duration::from_secs(60),
        first_jitter: Duration::from_secs(4 * 60),
        every: Duration::from_secs(3600),
        every_jitter: Duration::from_secs(15 * 60),
        timeout: Duration::from_secs(30 * 60),
    };

    /// Every `every` (`--durable-sweep-every`), give or take a quarter; the first one after
    /// one period.
    pub(crate) fn every(every: Duration) -> Schedule {
        Schedule {
            first: every,
            first_jitter: every / 4,
            every,
            every_jitter: every / 4,
            timeout: Schedule::DEFAULT
                .timeout
                .min(every.max(Duration::from_secs(60))),
        }
    }
}

/// Sweeps `store` on `schedule` until `stop` changes (or its sender is gone).
/// `sweeper` names this node in the store's sweep announcements.
pub(crate) async fn run(
    store: DurableStore,
    sweeper: String,
    schedule: Schedule,
    mut stop: watch::Receiver<bool>,
) {
    tracing::info!(
        store = store.url(),
        grace_s = store.partial_grace().as_secs(),
        "durable store: sweeping partial uploads in the background"
    );
    let mut wait = schedule.first + jitter(schedule.first_jitter);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        tokio::select! {
            _ = sweep_once(&store, &sweeper, schedule.timeout) => {}
            // Cut short at shutdown: what it did not delete, the next sweep will.
            _ = stop.changed() => return,
        }
        wait = schedule.every.saturating_sub(schedule.every_jitter)
            + jitter(schedule.every_jitter * 2);
    }
}

async fn sweep_once(store: &DurableStore, sweeper: &str, timeout: Duration) {
    sweep_partial_uploads(store, timeout).await;
    let chunks = tokio::time::timeout(timeout, store.sweep_unreferenced_chunks(sweeper));
    match chunks.await {
        Ok(Ok(n)) => tracing::debug!(
            store = store.url(),
            deleted = n,
            "durable store: unreferenced chunks swept"
        ),
        Ok(Err(e)) => {
            tracing::warn!(store = store.url(), error = %e, "durable store: sweep of unreferenced chunks failed")
        }
        Err(_) => tracing::warn!(
            store = store.url(),
            timeout_s = timeout.as_secs(),
            "durable store: sweep of unreferenced chunks did not finish in time; abandoned"
        ),
    }
}

async fn sweep_partial_uploads(store: &DurableStore, timeout: Duration) {
    let swept = tokio::time::timeout(timeout, store.sweep_partial_uploads(DURABLE_KEY_DEPTH));
    match swept.await {
        Ok(Ok(s)) if s.keys_deleted > 0 || s.objects_deleted > 0 || s.keys_failed > 0 => {
            tracing::info!(
                store = store.url(),
                keys_deleted = s.keys_deleted,
                objects_deleted = s.objects_deleted,
                bytes_deleted = s.bytes_deleted,
                keys_failed = s.keys_failed,
                keys_young = s.keys_young,
                keys_seen = s.keys_seen,
                "durable store: partial uploads removed"
            );
        }
        Ok(Ok(s)) => {
            tracing::debug!(
                store = store.url(),
                keys_seen = s.keys_seen,
                keys_young = s.keys_young,
                "durable store: no partial uploads to remove"
            );
        }
        Ok(Err(e)) => {
            tracing::warn!(store = store.url(), error = %e, "durable store: sweep of partial uploads failed");
        }
        Err(_) => {
            tracing::warn!(
                store = store.url(),
                timeout_s = timeout.as_secs(),
                "durable store: sweep of partial uploads did not finish in time; abandoned"
            );
        }
    }
}

/// A random duration in `[0, max]`. `RandomState` is seeded at random per process (and varies
/// per call), which is all the spreading needs, without a `rand` dependency.
fn jitter(max: Duration) -> Duration {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    max.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;
    use std::time::SystemTime;

    use super::*;

    fn write_aged(path: &Path, age: Duration) {
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, b"object").expect("write");
        let file = fs::File::options().write(true).open(path).expect("open");
        file.set_modified(SystemTime::now() - age)
            .expect("set mtime");
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            assert!(jitter(Duration::from_secs(10)) <= Duration::from_secs(10));
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn keys_have_the_depth_the_sweep_expects() {
        let key = durable_key("default", "counter", 7, "5f0e0c4a");
        assert_eq!(key.split('/').count(), DURABLE_KEY_DEPTH);
    }

    /// The loop sweeps right away with a zero first delay, removes an old manifest-less key,
    /// keeps a complete generation and a young partial one, and ends on the stop signal.
    #[tokio::test]
    async fn background_sweep_removes_old_partial_uploads_and_stops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = Duration::from_secs(2 * 3600);
        let partial = dir.path().join(durable_key("default", "a", 1, "u1"));
        write_aged(&partial.join("criu/pages-1.img.zst"), old);
        write_aged(&partial.join("rootfs.tar.zst"), old);
        let complete = dir.path().join(durable_key("default", "b", 2, "u2"));
        write_aged(&complete.join("rootfs.tar.zst"), old);
        write_aged(&complete.join("manifest.json"), old);
        let young = dir.path().join(durable_key("default", "c", 3, "u3"));
        write_aged(&young.join("rootfs.tar.zst"), Duration::ZERO);

        let store = DurableStore::from_url(&format!("file://{}", dir.path().display()))
            .expect("store")
            .with_partial_grace(Duration::from_secs(3600));
        let (stop_tx, stop_rx) = watch::channel(false);
        let schedule = Schedule {
            first: Duration::ZERO,
            first_jitter: Duration::ZERO,
            every: Duration::from_secs(3600),
            every_jitter: Duration::ZERO,
            timeout: Duration::from_secs(60),
        };
        let task = tokio::spawn(run(store, "node-test".to_string(), schedule, stop_rx));
        // Bounded wait for the first sweep (no assertion on how long it takes).
        for _ in 0..600 {
            if !partial.join("rootfs.tar.zst").exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!partial.join("rootfs.tar.zst").exists());
        assert!(!partial.join("criu/pages-1.img.zst").exists());
        assert!(complete.join("rootfs.tar.zst").exists());
        assert!(complete.join("manifest.json").exists());
        assert!(young.join("rootfs.tar.zst").exists());

        stop_tx.send(true).expect("stop");
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the sweeper stops")
            .expect("join");
    }
}
