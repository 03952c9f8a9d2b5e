//! Run and Restore: the worker's Start, and for a restore the generation it starts from (the
//! node-local copy, else the durable copy downloaded whole or for a lazy restore, and a damaged
//! local copy replaced by the durable one).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ate_core::template::MemoryRestore;
use ate_core::{DurableStatus, Fidelity};
use tokio::sync::Mutex as AsyncMutex;
use tracing::Instrument;

use super::types::{OnWorker, RestoreRequest};
use super::{AgentError, NodeAgent};
use crate::types::{CallCode, CallError, Snapshot, Workload};
use crate::worker_client::Start;

impl NodeAgent {
    /// Run: a cold boot of the workload on its worker.
    pub(super) async fn run_inner(
        &self,
        request_id: Option<&str>,
        workload: Workload,
    ) -> Result<OnWorker, AgentError> {
        let begun = std::time::Instant::now();
        let actor = workload.actor.clone();
        let worker = self.worker(&workload.worker_id)?;
        self.forget_frozen(&actor, &workload.worker_id).await;
        let start = Start {
            workload,
            generation_dir: None,
            fidelity: None,
        };
        let epoch = worker.client.start(start, request_id).await?;
        tracing::info!(actor = %actor, worker = %worker.info.worker_id, ms = begun.elapsed().as_millis() as u64, "actor started (cold boot)");
        Ok(Self::reply(&worker, epoch))
    }

    /// Restore: the worker's Start from the generation's node-local copy, or from its durable
    /// copy (downloaded whole, or for a lazy restore).
    pub(super) async fn restore_inner(
        &self,
        request_id: Option<&str>,
        req: RestoreRequest,
    ) -> Result<OnWorker, AgentError> {
        let begun = std::time::Instant::now();
        let RestoreRequest {
            workload,
            snapshot: snap,
            fidelity,
        } = req;
        let actor = workload.actor.clone();
        let worker = self.worker(&workload.worker_id)?;
        self.forget_frozen(&actor, &workload.worker_id).await;
        let start = |dir: &Path| {
            let start = Start {
                workload: workload.clone(),
                generation_dir: Some(dir.display().to_string()),
                fidelity: Some(fidelity),
            };
            worker.client.start(start, request_id)
        };
        // Fetching the generation from the durable store, when the node has no usable copy.
        let download = |kind: &'static str| {
            ate_telemetry::trace_span!("download", generation = snap.generation, kind)
        };
        // Memory on demand from the durable copy when the worker restores lazily and the
        // template does not ask for eager restores; else the whole generation first.
        let lazy = worker.info.can_restore_lazily
            && fidelity == Fidelity::Memory
            && !workload
                .spec
                .as_ref()
                .is_some_and(|s| s.memory_restore == MemoryRestore::Eager);
        let (epoch, from, dir) = match self.local_copy(&snap) {
            None if lazy => {
                let fetched = self
                    .fetch_for_lazy_restore(&snap)
                    .instrument(download("lazy"))
                    .await;
                let started = match fetched {
                    Ok(dir) => start(&dir)
                        .await
                        .map(|epoch| (epoch, dir))
                        .map_err(AgentError::from),
                    Err(e) => Err(e),
                };
                match started {
                    Ok((epoch, dir)) => (epoch, "durable copy, memory on demand", dir),
                    Err(e) if says_nothing_about_the_generation(&e) => {
                        return Err(e);
                    }
                    Err(e) => {
                        tracing::warn!(actor = %actor, generation = snap.generation, error = %e, "lazy restore from the durable copy refused; fetching the whole generation");
                        let fetched = self.fetch(&snap).instrument(download("whole")).await?;
                        let (epoch, dir) = self.start_fetched(&snap, fetched, &start).await?;
                        (
                            epoch,
                            "durable copy (whole, after a refused lazy restore)",
                            dir,
                        )
                    }
                }
            }
            None => {
                let fetched = self.fetch(&snap).instrument(download("whole")).await?;
                let (epoch, dir) = self.start_fetched(&snap, fetched, &start).await?;
                (epoch, "durable copy", dir)
            }
            Some(local) => match start(&local).await {
                Ok(epoch) => (epoch, "node-local copy", local),
                Err(refused) => {
                    let fetched = self
                        .replace_damaged_local(&snap, &local, refused)
                        .instrument(download("replace_damaged"))
                        .await?;
                    let (epoch, dir) = self.start_fetched(&snap, fetched, &start).await?;
                    (epoch, "durable copy replacing a damaged local one", dir)
                }
            },
        };
        self.remember_dir(&actor.to_string(), dir);
        tracing::info!(actor = %actor, worker = %worker.info.worker_id, generation = snap.generation, from, ms = begun.elapsed().as_millis() as u64, "actor restored");
        Ok(Self::reply(&worker, epoch))
    }

    /// The node-local copy of the generation, when this node wrote it in this boot and it is
    /// still sealed (its contents are verified by the worker that restores it).
    fn local_copy(&self, snap: &Snapshot) -> Option<PathBuf> {
        let local = Path::new(&snap.local_path);
        (!snap.local_path.is_empty()
            && snap.node == self.inner.cfg.name
            && snap.boot_id == self.inner.fleet.boot_id
            && ate_snapshot::is_sealed(local))
        .then(|| local.to_path_buf())
    }

    /// Where the download of `snap` (`suffix` "" for a whole one, ".lazy" for a lazy
    /// restore's) is cached, and the lock that serialises making it.
    fn cache_slot(
        &self,
        snap: &Snapshot,
        suffix: &str,
    ) -> Result<(PathBuf, Arc<AsyncMutex<()>>), AgentError> {
        if snap.durable_uri.is_empty() {
            return Err(AgentError::NoDurableCopy {
                generation: snap.generation,
                uuid: snap.uuid.clone(),
                node: self.inner.cfg.name.clone(),
            });
        }
        let uuid: String = snap
            .uuid
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if uuid.is_empty() {
            return Err(AgentError::Invalid("invalid snapshot.uuid: empty".into()));
        }
        let name = format!("{uuid}{suffix}");
        let lock = {
            let mut map = self
                .inner
                .downloads
                .lock()
                .map_err(|_| AgentError::DownloadLockPoisoned)?;
            map.entry(name.clone()).or_default().clone()
        };
        // A lazy restore's download is plaintext (the page source reads it in place): with
        // snapshot keys it is kept on a tmpfs, never on the node's disk.
        let dir = match &self.inner.lazy_cache {
            Some(scratch) if suffix == ".lazy" => scratch.path().to_path_buf(),
            _ => self.inner.cfg.cache_dir(),
        };
        Ok((dir.join(name), lock))
    }

    /// What a lazy restore of `snap` needs before it starts, from the durable copy (cached):
    /// the small files and the memory chunks CRIU reads itself; the worker's page source
    /// fetches the rest as the actor touches it (`ate_snapshot::DurableSource`).
    async fn fetch_for_lazy_restore(&self, snap: &Snapshot) -> Result<PathBuf, AgentError> {
        let (target, lock) = self.cache_slot(snap, ".lazy")?;
        let _guard = lock.lock().await;
        if let Ok(manifest) = ate_snapshot::read_manifest(&target).await
            && ate_snapshot::verify_files_except_chunked(&target, &manifest)
                .await
                .is_ok()
        {
            crate::cache::touch(&target);
            return Ok(target);
        }
        let _ = tokio::fs::remove_dir_all(&target).await;
        let begun = std::time::Instant::now();
        let eager = |dir: &Path| {
            ate_generation::images::eager_chunk_files(&dir.join(ate_snapshot::CRIU_DIR))
                .map_err(|e| ate_snapshot::Error::InvalidInput(format!("memory images: {e}")))
        };
        let downloaded = self
            .inner
            .durable
            .download_for_lazy_restore(&snap.durable_uri, &target, eager)
            .await;
        let small_files: u64 = downloaded.as_ref().map_or(0, |m| {
            m.files
                .iter()
                .filter(|f| !f.has_chunk_digests())
                .map(|f| f.size)
                .sum()
        });
        crate::metrics::downloaded("lazy", downloaded.is_ok(), small_files, begun.elapsed());
        downloaded.map_err(|e| AgentError::Fetch {
            generation: snap.generation,
            uri: snap.durable_uri.clone(),
            for_what: " for a lazy restore",
            error: e.to_string(),
        })?;
        tracing::info!(generation = snap.generation, uri = %snap.durable_uri, ms = begun.elapsed().as_millis() as u64, "generation fetched for a lazy restore (memory stays in the durable store)");
        crate::cache::touch(&target);
        Ok(target)
    }

    /// A (cached) download of the generation's durable copy, verified. A durable copy whose
    /// content does not match its manifest is reported as damaged ([`AgentError::Damaged`]).
    ///
    /// On a node that seals its generations the download goes into a scratch dir on a tmpfs, and
    /// the worker starts from that plaintext (it hashes every file while it restores, as for any
    /// plaintext generation); the cache gets its sealed copy once the start is done
    /// ([`Fetched::finish`]), so a restore waits for neither the sealing nor a second opening.
    async fn fetch(&self, snap: &Snapshot) -> Result<Fetched, AgentError> {
        let (target, lock) = self.cache_slot(snap, "")?;
        let guard = lock.lock_owned().await;
        // A sealed cached copy is authenticated frame by frame by the worker that opens it:
        // here its manifest and sizes suffice. A plaintext one is hashed.
        let cached = if ate_snapshot::sealed::is_encrypted(&target) {
            ate_snapshot::sealed::check_sizes(&target).await.is_ok()
        } else {
            ate_snapshot::verify(&target).await.is_ok()
        };
        if cached {
            crate::cache::touch(&target);
            return Ok(Fetched::at(target));
        }
        let _ = tokio::fs::remove_dir_all(&target).await;
        let begun = std::time::Instant::now();
        let downloaded = if ate_snapshot::sealed::keys().is_some() {
            // Plaintext only on the tmpfs; the cache holds no plaintext either.
            match ate_snapshot::sealed::Scratch::new("download") {
                Ok(scratch) => {
                    let plain = scratch.path().join("generation");
                    self.inner
                        .durable
                        .download(&snap.durable_uri, &plain)
                        .await
                        .map(|_| Fetched {
                            dir: plain,
                            cached: target,
                            pending: Some(PendingSeal { scratch, guard }),
                        })
                }
                Err(e) => Err(e),
            }
        } else {
            self.inner
                .durable
                .download(&snap.durable_uri, &target)
                .await
                .map(|_| Fetched::at(target))
        };
        crate::metrics::downloaded(
            "whole",
            downloaded.is_ok(),
            snap.size_bytes,
            begun.elapsed(),
        );
        downloaded.map_err(|e| {
            // Content that does not match the manifest; an object missing from the store is
            // not counted (it may be back for the next attempt: nothing marks it for good).
            let missing = matches!(e, ate_snapshot::Error::MissingFile { .. });
            let damaged = (e.is_corrupt() && !missing).then(|| e.to_string());
            let fetch = AgentError::Fetch {
                generation: snap.generation,
                uri: snap.durable_uri.clone(),
                for_what: "",
                error: e.to_string(),
            };
            match damaged {
                Some(why) => {
                    tracing::warn!(generation = snap.generation, uri = %snap.durable_uri, error = %why, "the durable copy failed verification");
                    fetch.with_damage(snap, None, Some(why))
                }
                None => fetch,
            }
        })
    }

    /// Starts the actor from a whole download (`start` is the worker's Start for a directory).
    /// A cached copy the worker refuses is checked in full here: when it is damaged (a sealed
    /// cached copy is only checked by manifest and sizes before use, its frames when the worker
    /// opens them), it is removed and the generation downloaded and started once more, so a
    /// damaged cache entry never holds an actor back. Returns the epoch and the cache dir.
    async fn start_fetched<F, Fut>(
        &self,
        snap: &Snapshot,
        fetched: Fetched,
        start: &F,
    ) -> Result<(u64, PathBuf), AgentError>
    where
        F: Fn(&Path) -> Fut,
        Fut: std::future::Future<Output = Result<u64, CallError>>,
    {
        let from_cache = fetched.pending.is_none();
        let refused = match start(&fetched.dir).await {
            Ok(epoch) => return Ok((epoch, fetched.finish())),
            Err(refused) => refused,
        };
        let cached = fetched.finish();
        if !from_cache || call_says_nothing_about_the_generation(&refused) {
            return Err(refused.into());
        }
        {
            let (_, lock) = self.cache_slot(snap, "")?;
            let _guard = lock.lock().await;
            match ate_snapshot::verify(&cached).await {
                Err(e) if e.is_corrupt() => {
                    tracing::warn!(generation = snap.generation, dir = %cached.display(), error = %e, "a cached download of the durable copy is damaged; downloading it again");
                    let _ = tokio::fs::remove_dir_all(&cached).await;
                }
                _ => return Err(refused.into()),
            }
        }
        let fetched = self.fetch(snap).await?;
        let epoch = start(&fetched.dir).await?;
        Ok((epoch, fetched.finish()))
    }

    /// The worker refused to start the actor from the node-local copy `local`. When that copy is
    /// damaged (it fails verification here too: a file's checksum or size, a missing file, an
    /// unreadable manifest — not an I/O error) and the generation has a COMPLETED durable copy,
    /// the local copy is moved aside for good and the durable copy is fetched (downloaded and
    /// verified) in its place: the returned directory. Otherwise the worker's error stands and
    /// the local copy is left as it is. An error caused by damage carries it
    /// ([`AgentError::Damaged`]: the local copy, and the durable one if its download failed
    /// verification too), so the api marks those copies.
    ///
    /// The check runs only on this failure path, so a good local copy costs no second hashing
    /// pass (the worker verifies every generation it restores).
    async fn replace_damaged_local(
        &self,
        snap: &Snapshot,
        local: &Path,
        refused: CallError,
    ) -> Result<Fetched, AgentError> {
        if call_says_nothing_about_the_generation(&refused) {
            return Err(refused.into());
        }
        let damage = match ate_snapshot::verify(local).await {
            Err(e) if e.is_corrupt() => e,
            _ => return Err(refused.into()),
        };
        let bad_file = damage
            .corrupt_file()
            .map(|f| local.join(f).display().to_string())
            .unwrap_or_default();
        let actor = snap
            .actor
            .as_ref()
            .map(|a| format!("{}/{}", a.atespace, a.name))
            .unwrap_or_default();
        let durable =
            snap.durable_status == Some(DurableStatus::Completed) && !snap.durable_uri.is_empty();
        let local_damage = Some(damage.to_string());
        if !durable {
            tracing::warn!(actor = %actor, generation = snap.generation, file = %bad_file, error = %damage, "node-local generation failed verification and has no COMPLETED durable copy; the restore fails");
            return Err(AgentError::from(refused).with_damage(snap, local_damage, None));
        }
        tracing::warn!(actor = %actor, generation = snap.generation, file = %bad_file, error = %damage, uri = %snap.durable_uri, "node-local generation failed verification; discarding it and restoring the same generation from its durable copy");
        crate::metrics::local_replaced();
        match ate_snapshot::quarantine(local).await {
            Ok(Some(aside)) => {
                tracing::warn!(actor = %actor, generation = snap.generation, from = %local.display(), to = %aside.display(), "damaged node-local generation moved aside")
            }
            Ok(None) => {}
            // Still restorable from the durable copy; the next restore of this generation on
            // this node finds the damage again and retries the move.
            Err(e) => {
                tracing::warn!(actor = %actor, generation = snap.generation, dir = %local.display(), error = %e, "cannot move the damaged node-local generation aside")
            }
        }
        self.fetch(snap).await.map_err(|e| {
            let durable_damage = e.damage().and_then(|d| d.durable.clone());
            AgentError::NotReplaced {
                refused: refused.message,
                error: e.to_string(),
            }
            .with_damage(snap, local_damage, durable_damage)
        })
    }
}

/// A generation fetched whole from the durable store, to start from.
pub(super) struct Fetched {
    /// What the worker starts from: the cache dir, or a download still in plaintext.
    dir: PathBuf,
    /// The cache dir that holds (or will hold) the generation.
    cached: PathBuf,
    /// A plaintext download to seal into the cache once the worker is done reading it.
    pending: Option<PendingSeal>,
}

struct PendingSeal {
    scratch: ate_snapshot::sealed::Scratch,
    /// The cache slot's lock, held until the sealed copy is complete (or removed).
    guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Fetched {
    fn at(dir: PathBuf) -> Self {
        Fetched {
            dir: dir.clone(),
            cached: dir,
            pending: None,
        }
    }

    /// The worker has started from [`Fetched::dir`] (or refused to): a plaintext download is
    /// sealed into the cache in the background and its scratch dir removed. Returns the cache
    /// dir (the generation's copy on this node from now on, which the next upload takes deltas
    /// against).
    fn finish(self) -> PathBuf {
        let target = self.cached;
        if let Some(PendingSeal { scratch, guard }) = self.pending {
            let (plain, cached) = (self.dir, target.clone());
            tokio::spawn(async move {
                let _guard = guard;
                if let Err(e) = ate_snapshot::sealed::seal_into_cache(&plain, &cached).await {
                    tracing::warn!(dir = %cached.display(), error = %e, "cannot keep the downloaded generation in the cache");
                    let _ = tokio::fs::remove_dir_all(&cached).await;
                }
                drop(scratch);
            });
        }
        target
    }
}

/// A refused start that says nothing about the generation it was given: the worker is busy,
/// gone, or the call was cancelled or timed out. Any other refusal may be the copy's fault, and
/// another copy of the same generation is worth a try.
fn says_nothing_about_the_generation(refused: &AgentError) -> bool {
    match refused {
        AgentError::Worker(e) => call_says_nothing_about_the_generation(e),
        _ => false,
    }
}

fn call_says_nothing_about_the_generation(refused: &CallError) -> bool {
    matches!(
        refused.code,
        CallCode::Unavailable
            | CallCode::ResourceExhausted
            | CallCode::Aborted
            | CallCode::Cancelled
            | CallCode::DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{test_agent, test_workload};

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    #[test]
    fn refusals_that_say_nothing_about_the_generation() {
        for code in [
            CallCode::Unavailable,
            CallCode::ResourceExhausted,
            CallCode::Aborted,
            CallCode::Cancelled,
            CallCode::DeadlineExceeded,
        ] {
            let refused = CallError::new(code, "x");
            assert!(call_says_nothing_about_the_generation(&refused), "{code:?}");
            assert!(
                says_nothing_about_the_generation(&refused.into()),
                "{code:?}"
            );
        }
        for code in [
            CallCode::FailedPrecondition,
            CallCode::DataLoss,
            CallCode::Internal,
            CallCode::InvalidArgument,
            CallCode::NotFound,
            CallCode::Unknown,
        ] {
            let refused = CallError::new(code, "x");
            assert!(
                !call_says_nothing_about_the_generation(&refused),
                "{code:?}"
            );
            assert!(
                !says_nothing_about_the_generation(&refused.into()),
                "{code:?}"
            );
        }
        // The node's own errors on the way (a download that failed) are worth the whole copy.
        assert!(!says_nothing_about_the_generation(
            &AgentError::DownloadLockPoisoned
        ));
    }

    #[tokio::test]
    async fn cache_slot_names_the_download_by_uuid_and_suffix() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let snap = Snapshot {
            generation: 3,
            uuid: "ab/../cd-01".into(),
            durable_uri: "file:///d/x".into(),
            ..Default::default()
        };
        let cache = dir.path().join("snapshot-cache");
        let (whole, lock_whole) = agent
            .cache_slot(&snap, "")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(whole, cache.join("abcd-01"));
        let (lazy, lock_lazy) = agent
            .cache_slot(&snap, ".lazy")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lazy, cache.join("abcd-01.lazy"));
        assert!(!Arc::ptr_eq(&lock_whole, &lock_lazy));
        // One lock per download: a second call for the same one waits on the same lock.
        let (_, again) = agent
            .cache_slot(&snap, "")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(Arc::ptr_eq(&lock_whole, &again));
    }

    #[tokio::test]
    async fn cache_slot_refuses_a_generation_without_a_durable_copy_or_uuid() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let mut snap = Snapshot {
            generation: 3,
            uuid: "u-1".into(),
            ..Default::default()
        };
        let err = agent.cache_slot(&snap, "").err();
        assert!(
            matches!(&err, Some(AgentError::NoDurableCopy { generation: 3, .. })),
            "{err:?}"
        );
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("generation 3 (u-1) is not on node node-t and has no durable copy")
        );
        snap.durable_uri = "file:///d/x".into();
        snap.uuid = "/./".into();
        let err = agent.cache_slot(&snap, "").err();
        assert!(
            matches!(&err, Some(AgentError::Invalid(m)) if m == "invalid snapshot.uuid: empty"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn local_copy_only_when_written_here_in_this_boot_and_sealed() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let gen_dir = dir
            .path()
            .join("snapshots")
            .join("ns")
            .join("a")
            .join("1-x");
        std::fs::create_dir_all(&gen_dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
        let ours = Snapshot {
            node: "node-t".into(),
            boot_id: crate::boot_id(),
            local_path: gen_dir.display().to_string(),
            ..Default::default()
        };
        // Not sealed (no manifest.json) yet.
        assert_eq!(agent.local_copy(&ours), None);
        std::fs::write(gen_dir.join("manifest.json"), b"{}")
            .unwrap_or_else(|e| panic!("write: {e}"));
        assert_eq!(agent.local_copy(&ours), Some(gen_dir.clone()));
        let other_node = Snapshot {
            node: "node-2".into(),
            ..ours.clone()
        };
        assert_eq!(agent.local_copy(&other_node), None);
        let other_boot = Snapshot {
            boot_id: "another-boot".into(),
            ..ours.clone()
        };
        assert_eq!(agent.local_copy(&other_boot), None);
        let no_path = Snapshot {
            local_path: String::new(),
            ..ours
        };
        assert_eq!(agent.local_copy(&no_path), None);
    }

    #[tokio::test]
    async fn run_and_restore_need_a_running_worker() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let workload = test_workload();
        let not_running = |r: Result<OnWorker, AgentError>| matches!(r, Err(AgentError::WorkerNotRunning { worker, node }) if worker == "w-1" && node == "node-t");
        assert!(not_running(agent.run_inner(None, workload.clone()).await));
        let restore = RestoreRequest {
            workload,
            snapshot: Snapshot::default(),
            fidelity: Fidelity::Memory,
        };
        assert!(not_running(agent.restore_inner(None, restore).await));
        // Nothing was remembered for a refused restore.
        assert!(agent.inner.recent_dirs.lock().is_ok_and(|m| m.is_empty()));
    }
}
