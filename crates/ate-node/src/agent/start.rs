//! Run and Restore: the worker's Start, and for a restore the generation it starts from (the
//! node-local copy, else the durable copy downloaded whole or for a lazy restore, and a damaged
//! local copy replaced by the durable one).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ate_core::{DurableStatus, Fidelity};
use ate_proto::v1::{self, worker_service_client::WorkerServiceClient};
use tokio::sync::Mutex as AsyncMutex;
use tonic::{Response, Status};
use tracing::Instrument;

use super::{NodeAgent, obj_key};

impl NodeAgent {
    pub(super) async fn run_inner(
        &self,
        request_id: Option<&str>,
        req: v1::RunRequest,
    ) -> Result<v1::NodeReply, Status> {
        let begun = std::time::Instant::now();
        let workload = req
            .workload
            .ok_or_else(|| Status::invalid_argument("invalid workload: missing"))?;
        let (atespace, name) = obj_key(&workload)?;
        let worker = self.worker(&workload.worker_id)?;
        if let Some(actor) = &workload.actor {
            self.forget_frozen(actor, &workload.worker_id).await;
        }
        let start = v1::WorkerStartRequest {
            workload: Some(workload),
            generation_dir: String::new(),
            fidelity: 0,
        };
        let reply = worker_start(worker.client.clone(), start, request_id)
            .await?
            .into_inner();
        tracing::info!(actor = %format!("{atespace}/{name}"), worker = %worker.info.worker_id, ms = begun.elapsed().as_millis() as u64, "actor started (cold boot)");
        Ok(Self::reply(&worker, reply.epoch))
    }

    pub(super) async fn restore_inner(
        &self,
        request_id: Option<&str>,
        req: v1::RestoreRequest,
    ) -> Result<v1::NodeReply, Status> {
        let begun = std::time::Instant::now();
        let workload = req
            .workload
            .ok_or_else(|| Status::invalid_argument("invalid workload: missing"))?;
        let (atespace, name) = obj_key(&workload)?;
        let snap = req
            .snapshot
            .ok_or_else(|| Status::invalid_argument("invalid snapshot: missing"))?;
        Fidelity::from_wire(req.fidelity).ok_or_else(|| {
            Status::invalid_argument(format!("invalid fidelity: {}", req.fidelity))
        })?;
        let worker = self.worker(&workload.worker_id)?;
        if let Some(actor) = &workload.actor {
            self.forget_frozen(actor, &workload.worker_id).await;
        }
        let start = |dir: &Path| {
            let start = v1::WorkerStartRequest {
                workload: Some(workload.clone()),
                generation_dir: dir.display().to_string(),
                fidelity: req.fidelity,
            };
            worker_start(worker.client.clone(), start, request_id)
        };
        // Fetching the generation from the durable store, when the node has no usable copy.
        let download = |kind: &'static str| {
            ate_tls::trace_span!("download", generation = snap.generation, kind)
        };
        // Memory on demand from the durable copy when the worker restores lazily and the
        // template does not ask for eager restores; else the whole generation first.
        let lazy = worker.info.can_restore_lazily
            && Fidelity::from_wire(req.fidelity) == Some(Fidelity::Memory)
            && !workload
                .spec
                .as_ref()
                .is_some_and(|s| s.eager_memory_restore);
        let (reply, from, dir) = match self.local_copy(&snap) {
            None if lazy => {
                let fetched = self
                    .fetch_for_lazy_restore(&snap)
                    .instrument(download("lazy"))
                    .await;
                let started = match fetched {
                    Ok(dir) => start(&dir).await.map(|r| (r, dir)),
                    Err(e) => Err(e),
                };
                match started {
                    Ok((reply, dir)) => (reply, "durable copy, memory on demand", dir),
                    Err(e) if says_nothing_about_the_generation(&e) => {
                        return Err(e);
                    }
                    Err(e) => {
                        tracing::warn!(actor = %format!("{atespace}/{name}"), generation = snap.generation, error = %e.message(), "lazy restore from the durable copy refused; fetching the whole generation");
                        let dir = self.fetch(&snap).instrument(download("whole")).await?;
                        (
                            start(&dir).await?,
                            "durable copy (whole, after a refused lazy restore)",
                            dir,
                        )
                    }
                }
            }
            None => {
                let dir = self.fetch(&snap).instrument(download("whole")).await?;
                (start(&dir).await?, "durable copy", dir)
            }
            Some(local) => match start(&local).await {
                Ok(reply) => (reply, "node-local copy", local),
                Err(refused) => {
                    let dir = self
                        .replace_damaged_local(&snap, &local, refused)
                        .instrument(download("replace_damaged"))
                        .await?;
                    (
                        start(&dir).await?,
                        "durable copy replacing a damaged local one",
                        dir,
                    )
                }
            },
        };
        self.remember_dir(&format!("{atespace}/{name}"), dir);
        tracing::info!(actor = %format!("{atespace}/{name}"), worker = %worker.info.worker_id, generation = snap.generation, from, ms = begun.elapsed().as_millis() as u64, "actor restored");
        Ok(Self::reply(&worker, reply.into_inner().epoch))
    }

    /// The node-local copy of the generation, when this node wrote it in this boot and it is
    /// still sealed (its contents are verified by the worker that restores it).
    fn local_copy(&self, snap: &v1::Snapshot) -> Option<PathBuf> {
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
        snap: &v1::Snapshot,
        suffix: &str,
    ) -> Result<(PathBuf, Arc<AsyncMutex<()>>), Status> {
        if snap.durable_uri.is_empty() {
            return Err(Status::failed_precondition(format!(
                "generation {} ({}) is not on node {} and has no durable copy",
                snap.generation, snap.uuid, self.inner.cfg.name
            )));
        }
        let uuid: String = snap
            .uuid
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if uuid.is_empty() {
            return Err(Status::invalid_argument("invalid snapshot.uuid: empty"));
        }
        let name = format!("{uuid}{suffix}");
        let lock = {
            let mut map = self
                .inner
                .downloads
                .lock()
                .map_err(|_| Status::internal("download lock poisoned"))?;
            map.entry(name.clone()).or_default().clone()
        };
        Ok((self.inner.cfg.cache_dir().join(name), lock))
    }

    /// What a lazy restore of `snap` needs before it starts, from the durable copy (cached):
    /// the small files and the memory chunks CRIU reads itself; the worker's page source
    /// fetches the rest as the actor touches it (`ate_snapshot::DurableSource`).
    async fn fetch_for_lazy_restore(&self, snap: &v1::Snapshot) -> Result<PathBuf, Status> {
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
            ate_worker::lazy::images::eager_chunk_files(&dir.join(ate_snapshot::CRIU_DIR))
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
        downloaded.map_err(|e| {
            Status::failed_precondition(format!(
                "cannot fetch generation {} from {} for a lazy restore: {e}",
                snap.generation, snap.durable_uri
            ))
        })?;
        tracing::info!(generation = snap.generation, uri = %snap.durable_uri, ms = begun.elapsed().as_millis() as u64, "generation fetched for a lazy restore (memory stays in the durable store)");
        crate::cache::touch(&target);
        Ok(target)
    }

    /// A (cached) download of the generation's durable copy, verified.
    async fn fetch(&self, snap: &v1::Snapshot) -> Result<PathBuf, Status> {
        let (target, lock) = self.cache_slot(snap, "")?;
        let _guard = lock.lock().await;
        if ate_snapshot::verify(&target).await.is_ok() {
            crate::cache::touch(&target);
            return Ok(target);
        }
        let _ = tokio::fs::remove_dir_all(&target).await;
        let begun = std::time::Instant::now();
        let downloaded = self
            .inner
            .durable
            .download(&snap.durable_uri, &target)
            .await;
        crate::metrics::downloaded(
            "whole",
            downloaded.is_ok(),
            snap.size_bytes,
            begun.elapsed(),
        );
        downloaded.map_err(|e| {
            Status::failed_precondition(format!(
                "cannot fetch generation {} from {}: {e}",
                snap.generation, snap.durable_uri
            ))
        })?;
        Ok(target)
    }

    /// The worker refused to start the actor from the node-local copy `local`. When that copy is
    /// damaged (it fails verification here too: a file's checksum or size, a missing file, an
    /// unreadable manifest — not an I/O error) and the generation has a COMPLETED durable copy,
    /// the local copy is moved aside for good and the durable copy is fetched (downloaded and
    /// verified) in its place: the returned directory. Otherwise the worker's error stands and
    /// the local copy is left as it is.
    ///
    /// The check runs only on this failure path, so a good local copy costs no second hashing
    /// pass (the worker verifies every generation it restores).
    async fn replace_damaged_local(
        &self,
        snap: &v1::Snapshot,
        local: &Path,
        refused: Status,
    ) -> Result<PathBuf, Status> {
        if says_nothing_about_the_generation(&refused) {
            return Err(refused);
        }
        let damage = match ate_snapshot::verify(local).await {
            Err(e) if e.is_corrupt() => e,
            _ => return Err(refused),
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
            snap.durable_status == DurableStatus::Completed.wire() && !snap.durable_uri.is_empty();
        if !durable {
            tracing::warn!(actor = %actor, generation = snap.generation, file = %bad_file, error = %damage, "node-local generation failed verification and has no COMPLETED durable copy; the restore fails");
            return Err(refused);
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
            Status::failed_precondition(format!(
                "{}; its durable copy could not replace it: {}",
                refused.message(),
                e.message()
            ))
        })
    }
}

/// A refused start that says nothing about the generation it was given: the worker is busy,
/// gone, or the call was cancelled or timed out. Any other refusal may be the copy's fault, and
/// another copy of the same generation is worth a try.
fn says_nothing_about_the_generation(refused: &Status) -> bool {
    use tonic::Code;
    matches!(
        refused.code(),
        Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Cancelled
            | Code::DeadlineExceeded
    )
}

/// The worker's Start for the request `request_id`, in a span of its own whose trace context
/// the worker continues.
fn worker_start(
    mut client: WorkerServiceClient<tonic::transport::Channel>,
    start: v1::WorkerStartRequest,
    request_id: Option<&str>,
) -> impl Future<Output = Result<Response<v1::WorkerStartReply>, Status>> + use<> {
    let span = ate_tls::trace_span!("worker_start", otel.kind = "client");
    let mut request = ate_proto::request_id::request(start, request_id);
    span.in_scope(|| ate_tls::trace_context::inject_grpc(&mut request));
    async move { client.start(request).await }.instrument(span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::test_agent;
    use tonic::Code;

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    #[test]
    fn refusals_that_say_nothing_about_the_generation() {
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Cancelled,
            Code::DeadlineExceeded,
        ] {
            assert!(
                says_nothing_about_the_generation(&Status::new(code, "x")),
                "{code:?}"
            );
        }
        for code in [
            Code::FailedPrecondition,
            Code::DataLoss,
            Code::Internal,
            Code::InvalidArgument,
            Code::NotFound,
            Code::Unknown,
        ] {
            assert!(
                !says_nothing_about_the_generation(&Status::new(code, "x")),
                "{code:?}"
            );
        }
    }

    #[tokio::test]
    async fn cache_slot_names_the_download_by_uuid_and_suffix() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let snap = v1::Snapshot {
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
        let mut snap = v1::Snapshot {
            generation: 3,
            uuid: "u-1".into(),
            ..Default::default()
        };
        let err = agent.cache_slot(&snap, "").err();
        assert_eq!(
            err.map(|s| (s.code(), s.message().to_string())),
            Some((
                Code::FailedPrecondition,
                "generation 3 (u-1) is not on node node-t and has no durable copy".to_string()
            ))
        );
        snap.durable_uri = "file:///d/x".into();
        snap.uuid = "/./".into();
        let err = agent.cache_slot(&snap, "").err();
        assert_eq!(
            err.map(|s| (s.code(), s.message().to_string())),
            Some((
                Code::InvalidArgument,
                "invalid snapshot.uuid: empty".to_string()
            ))
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
        let ours = v1::Snapshot {
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
        let other_node = v1::Snapshot {
            node: "node-2".into(),
            ..ours.clone()
        };
        assert_eq!(agent.local_copy(&other_node), None);
        let other_boot = v1::Snapshot {
            boot_id: "another-boot".into(),
            ..ours.clone()
        };
        assert_eq!(agent.local_copy(&other_boot), None);
        let no_path = v1::Snapshot {
            local_path: String::new(),
            ..ours
        };
        assert_eq!(agent.local_copy(&no_path), None);
    }

    #[tokio::test]
    async fn run_and_restore_validate_before_calling_a_worker() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let workload = v1::Workload {
            actor: Some(v1::ObjectRef {
                atespace: "ns".into(),
                name: "a".into(),
            }),
            worker_id: "w-1".into(),
            ..Default::default()
        };
        let code_msg =
            |r: Result<v1::NodeReply, Status>| r.err().map(|s| (s.code(), s.message().to_string()));
        let missing = agent
            .run_inner(None, v1::RunRequest { workload: None })
            .await;
        assert_eq!(
            code_msg(missing),
            Some((
                Code::InvalidArgument,
                "invalid workload: missing".to_string()
            ))
        );
        let no_worker = agent
            .run_inner(
                None,
                v1::RunRequest {
                    workload: Some(workload.clone()),
                },
            )
            .await;
        assert_eq!(
            code_msg(no_worker),
            Some((
                Code::Unavailable,
                "worker w-1 is not running on node node-t".to_string()
            ))
        );
        let no_snapshot = agent
            .restore_inner(
                None,
                v1::RestoreRequest {
                    workload: Some(workload.clone()),
                    snapshot: None,
                    fidelity: Fidelity::Memory.wire(),
                },
            )
            .await;
        assert_eq!(
            code_msg(no_snapshot),
            Some((
                Code::InvalidArgument,
                "invalid snapshot: missing".to_string()
            ))
        );
        let bad_fidelity = agent
            .restore_inner(
                None,
                v1::RestoreRequest {
                    workload: Some(workload),
                    snapshot: Some(v1::Snapshot::default()),
                    fidelity: 999,
                },
            )
            .await;
        assert_eq!(
            code_msg(bad_fidelity),
            Some((Code::InvalidArgument, "invalid fidelity: 999".to_string()))
        );
    }
}
