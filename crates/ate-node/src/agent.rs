//! NodeService: Run / Restore / Checkpoint / Detach / Stop / DeleteSnapshots, on top of the
//! node's workers and its snapshot store.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ate_core::{DurableStatus, Fidelity};
use ate_proto::v1::worker_service_client::WorkerServiceClient;
use ate_proto::v1::{
    self, node_service_server::NodeService, node_service_server::NodeServiceServer,
};
use ate_snapshot::{DurableStore, UploadPriority};
use tokio::sync::Mutex as AsyncMutex;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::fleet::{Fleet, WorkerHandle};
use crate::{NodeConfig, NodeError};

#[derive(Clone)]
pub struct NodeAgent {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: NodeConfig,
    fleet: Arc<Fleet>,
    durable: DurableStore,
    durable_url: String,
    /// The node's identity (`--tls-*`); None: plaintext.
    tls: Option<ate_tls::CertSource>,
    /// One download at a time per generation uuid (tag snapshots are shared by many actors).
    downloads: std::sync::Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// Background (ASYNC suspend) uploads run at most this many at a time: hashing and
    /// compressing a burst of generations at once would take the cores that resumes need.
    background_uploads: Arc<tokio::sync::Semaphore>,
    /// Actor (`atespace/name`) → the worker that keeps it frozen in place after its last
    /// checkpoint. When the actor starts on another worker, that copy is stopped.
    frozen_on: std::sync::Mutex<HashMap<String, String>>,
    /// Actor (`atespace/name`) → the generation directories it last ran from or was
    /// checkpointed into on this node, newest last: the parents its next upload sends deltas
    /// against (`DurableStore::upload_with_parents`). Lost on restart: the first upload after
    /// one sends whole chunks.
    recent_dirs: std::sync::Mutex<HashMap<String, Vec<PathBuf>>>,
}

/// Generation directories remembered per actor as delta parents.
const RECENT_DIRS: usize = 2;
/// Actors whose directories are remembered at most (a bound on the map's memory).
const MAX_ACTORS_REMEMBERED: usize = 100_000;

/// Largest part of a log one ReadLog returns.
const MAX_LOG_READ: u32 = 1 << 20;

/// Up to `max` bytes of the file at `path` from `offset` (from 0 when the file is now shorter:
/// replaced or truncated); returns them and the offset after them.
async fn read_log_part(path: &Path, offset: u64, max: u64) -> std::io::Result<(Vec<u8>, u64)> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let from = if offset > len { 0 } else { offset };
    file.seek(std::io::SeekFrom::Start(from)).await?;
    let mut data = Vec::new();
    file.take(max).read_to_end(&mut data).await?;
    let next = from + data.len() as u64;
    Ok((data, next))
}

/// Concurrent background uploads per node.
const BACKGROUND_UPLOADS: usize = 2;

/// `(atespace, name)` of a request's actor, validated.
fn actor_key(a: Option<&v1::ObjectRef>) -> Result<(String, String), Status> {
    let a = a.ok_or_else(|| Status::invalid_argument("invalid actor: missing"))?;
    ate_core::validate_label("actor.atespace", &a.atespace)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    ate_core::validate_label("actor.name", &a.name)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((a.atespace.clone(), a.name.clone()))
}

/// Where every worker of this node appends an actor's output (the worker's `actor_logs_dir`).
fn actor_log_path(state_dir: &Path, atespace: &str, name: &str) -> std::path::PathBuf {
    state_dir
        .join("logs")
        .join("actors")
        .join(atespace)
        .join(format!("{name}.log"))
}

fn obj_key(w: &v1::Workload) -> Result<(String, String), Status> {
    let a = w
        .actor
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("invalid workload.actor: missing"))?;
    ate_core::validate_label("workload.actor.atespace", &a.atespace)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    ate_core::validate_label("workload.actor.name", &a.name)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((a.atespace.clone(), a.name.clone()))
}

/// Removes what [`ate_snapshot::quarantine`] set aside of a generation directory (its files
/// are kept for inspection until the generation itself is deleted).
async fn remove_quarantined(gen_dir: &Path) {
    let Ok(aside) = ate_snapshot::quarantine_path(gen_dir) else {
        return;
    };
    if let Err(e) = tokio::fs::remove_dir_all(&aside).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %aside.display(), error = %e, "cannot delete a quarantined generation");
    }
}

impl NodeAgent {
    pub async fn new(cfg: NodeConfig, bound: SocketAddr) -> Result<Self, NodeError> {
        let durable_url = cfg.durable_url();
        // With `--durable-gc-age 0` this node does not sweep, but other nodes of the store may
        // (with the default age), so its uploads keep the default's time limit.
        let gc_age = match cfg.durable_gc_age() {
            age if age.is_zero() => ate_snapshot::DEFAULT_PARTIAL_GRACE,
            age => age,
        };
        let durable = DurableStore::from_url(&durable_url)
            .map_err(|e| NodeError::Durable(e.to_string()))?
            .with_partial_grace(gc_age);
        let tls = cfg.tls.load("node")?;
        let client_tls = match &tls {
            Some(src) => {
                let api = ate_tls::SpiffeId::api(cfg.tls.trust_domain())?;
                Some(Arc::new(ate_tls::client_config(
                    src,
                    ate_tls::ServerCheck::Pin(api),
                )?))
            }
            None => None,
        };
        // `--api` may list several replicas: the node fails over between them.
        let channel = ate_tls::replicas_channel_lazy(
            &cfg.api,
            client_tls,
            Duration::from_secs(2),
            // No call of the node's loops may hang on an api that stopped answering.
            |e| e.timeout(Duration::from_secs(30)),
        )
        .map_err(|e| NodeError::Config(format!("bad --api {:?}: {e}", cfg.api)))?;
        let advertise = cfg.advertise.clone().unwrap_or_else(|| bound.to_string());
        let fleet = Arc::new(Fleet::new(
            cfg.name.clone(),
            advertise,
            crate::boot_id(),
            cfg.workers_dir(),
            channel,
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                fleet,
                durable,
                durable_url,
                tls,
                downloads: Default::default(),
                background_uploads: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_UPLOADS)),
                frozen_on: std::sync::Mutex::new(HashMap::new()),
                recent_dirs: std::sync::Mutex::new(HashMap::new()),
            }),
        })
    }

    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let loops = tokio::spawn(self.inner.fleet.clone().run_loops(stop_rx.clone()));
        let sweeper = if self.inner.cfg.durable_gc_age().is_zero() {
            tracing::info!(
                "durable store: no sweep of partial uploads on this node (--durable-gc-age 0)"
            );
            None
        } else {
            Some(tokio::spawn(crate::sweep::run(
                self.inner.durable.clone(),
                self.inner.cfg.name.clone(),
                self.inner.cfg.durable_sweep_every.map_or(
                    crate::sweep::Schedule::DEFAULT,
                    crate::sweep::Schedule::every,
                ),
                stop_rx.clone(),
            )))
        };
        let ttl = self.inner.cfg.snapshot_cache_ttl();
        let evictor = (!ttl.is_zero()).then(|| {
            let inner = self.inner.clone();
            let lock_of: crate::cache::LockOf = Arc::new(move |name: &str| {
                inner
                    .downloads
                    .lock()
                    .ok()
                    .map(|mut m| m.entry(name.to_string()).or_default().clone())
            });
            tokio::spawn(crate::cache::run(
                self.inner.cfg.cache_dir(),
                ttl,
                lock_of,
                stop_rx.clone(),
            ))
        });
        let mut stop = stop_rx;
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let stopped = async move {
            let _ = stop.changed().await;
        };
        // Only the api may call NodeService.
        let server_tls = match &self.inner.tls {
            Some(src) => {
                let api = ate_tls::SpiffeId::api(self.inner.cfg.tls.trust_domain())?;
                let mut server = ate_tls::server_config(
                    src,
                    ate_tls::ClientAuth::Required {
                        allowed: ate_tls::AllowList::only([api]),
                    },
                )?;
                ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2]);
                Some(Arc::new(server))
            }
            None => None,
        };
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(NodeServiceServer::new(self));
        let result = match server_tls {
            Some(server) => {
                router
                    .serve_with_incoming_shutdown(
                        ate_tls::TlsIncoming::new(listener, server)?,
                        stopped,
                    )
                    .await
            }
            None => {
                router
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        stopped,
                    )
                    .await
            }
        };
        loops.abort();
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
        if let Some(evictor) = evictor {
            evictor.abort();
        }
        result.map_err(NodeError::from)
    }

    fn worker(&self, id: &str) -> Result<WorkerHandle, Status> {
        self.inner.fleet.worker(id).ok_or_else(|| {
            Status::unavailable(format!(
                "worker {id} is not running on node {}",
                self.inner.cfg.name
            ))
        })
    }

    /// Records `dir` as the actor's newest generation directory on this node and returns the
    /// ones before it (newest first): the delta parents of an upload of `dir`.
    fn remember_dir(&self, actor: &str, dir: PathBuf) -> Vec<PathBuf> {
        let mut recent = self
            .inner
            .recent_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if recent.len() >= MAX_ACTORS_REMEMBERED && !recent.contains_key(actor) {
            // A hint, not state: forgetting only costs whole chunks on some uploads.
            recent.clear();
        }
        let dirs = recent.entry(actor.to_string()).or_default();
        let parents: Vec<PathBuf> = dirs.iter().rev().filter(|d| **d != dir).cloned().collect();
        dirs.retain(|d| *d != dir);
        dirs.push(dir);
        if dirs.len() > RECENT_DIRS {
            dirs.remove(0);
        }
        parents
    }

    /// Where this node keeps an actor's generation.
    fn generation_dir(&self, atespace: &str, name: &str, generation: u64, uuid: &str) -> PathBuf {
        let short: String = uuid
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
        self.inner
            .cfg
            .snapshots_dir()
            .join(atespace)
            .join(name)
            .join(format!("{generation}-{short}"))
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

    /// Uploads the generation to the durable store. `Background` for an ASYNC suspend's copy:
    /// nobody waits for it, so its hashing and compression leave the cores to resumes.
    async fn upload(
        &self,
        atespace: &str,
        name: &str,
        snap: &v1::Snapshot,
        priority: UploadPriority,
        parents: &[PathBuf],
    ) -> Result<String, String> {
        let key = crate::sweep::durable_key(atespace, name, snap.generation, &snap.uuid);
        let begun = std::time::Instant::now();
        let uploaded = self
            .inner
            .durable
            .upload_with_parents(
                Path::new(&snap.local_path),
                &key,
                priority,
                parents,
                &|dir: &Path| ate_worker::lazy::images::memory_layout(dir).ok(),
            )
            .await
            .map(|(uri, _)| uri)
            .map_err(|e| e.to_string());
        crate::metrics::uploaded(priority, &uploaded, snap.size_bytes, begun);
        uploaded
    }

    async fn report(
        &self,
        actor: v1::ObjectRef,
        generation: u64,
        status: DurableStatus,
        uri: String,
        reason: String,
    ) {
        let req = v1::ReportSnapshotRequest {
            actor: Some(actor),
            generation,
            durable_status: status.wire(),
            durable_uri: uri,
            reason,
        };
        if let Err(e) = self
            .inner
            .fleet
            .fleet_api
            .clone()
            .report_snapshot(req)
            .await
        {
            tracing::warn!(generation, error = %e.message(), "snapshot report to the api failed");
        }
    }

    /// Keeps `ate_node_frozen_copies` current at every scrape while this agent lives.
    pub fn export_gauges(&self) {
        let inner = Arc::downgrade(&self.inner);
        ate_tls::telemetry::on_scrape(move || {
            let Some(inner) = inner.upgrade() else {
                return false;
            };
            let n = match inner.frozen_on.lock() {
                Ok(m) => m.len(),
                Err(poisoned) => poisoned.into_inner().len(),
            };
            crate::metrics::frozen_copies(n);
            true
        });
    }

    fn frozen_on(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        match self.inner.frozen_on.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The actor is starting on `worker_id`: a frozen copy of it on another worker of this node
    /// is stale now and is stopped first (it holds the actor's netns and cgroup names, which
    /// the new sandbox takes).
    async fn forget_frozen(&self, actor: &v1::ObjectRef, worker_id: &str) {
        let key = format!("{}/{}", actor.atespace, actor.name);
        let Some(holder) = self.frozen_on().remove(&key) else {
            return;
        };
        if holder == worker_id {
            return;
        }
        let Some(worker) = self.inner.fleet.worker(&holder) else {
            return;
        };
        let req = v1::WorkerStopRequest {
            actor: Some(actor.clone()),
            activation_at_most: 0,
        };
        if let Err(e) = worker.client.clone().stop(req).await {
            tracing::warn!(actor = %key, worker = %holder, error = %e.message(), "stopping a stale frozen copy");
        }
    }

    fn reply(worker: &WorkerHandle, epoch: u64) -> v1::NodeReply {
        v1::NodeReply {
            worker_id: worker.info.worker_id.clone(),
            epoch,
            addresses: worker.info.addresses.clone(),
        }
    }
}

/// The span of a Run or Restore (`call`): the request id the api passed on (DESIGN §8: on every
/// line of the request, in every component) and the actor.
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

fn start_span<T>(call: &str, req: &Request<T>, workload: Option<&v1::Workload>) -> tracing::Span {
    let actor = workload
        .and_then(|w| w.actor.as_ref())
        .map(|a| format!("{}/{}", a.atespace, a.name))
        .unwrap_or_default();
    let request_id = ate_proto::request_id::of(req).unwrap_or_default();
    let span = tracing::info_span!(
        "start",
        call,
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        actor = %actor
    );
    ate_tls::trace_context::continue_grpc(&span, req);
    span
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

/// Run, Restore and Checkpoint themselves; the NodeService methods below add their metrics.
impl NodeAgent {
    async fn run_inner(
        &self,
        req: Request<v1::RunRequest>,
    ) -> Result<Response<v1::NodeReply>, Status> {
        let begun = std::time::Instant::now();
        // Passed on to the worker's Start, as the api passed it here.
        let request_id = ate_proto::request_id::of(&req).map(str::to_owned);
        let workload = req
            .into_inner()
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
        let reply = worker_start(worker.client.clone(), start, request_id.as_deref())
            .await?
            .into_inner();
        tracing::info!(actor = %format!("{atespace}/{name}"), worker = %worker.info.worker_id, ms = begun.elapsed().as_millis() as u64, "actor started (cold boot)");
        Ok(Response::new(Self::reply(&worker, reply.epoch)))
    }

    async fn restore_inner(
        &self,
        req: Request<v1::RestoreRequest>,
    ) -> Result<Response<v1::NodeReply>, Status> {
        let begun = std::time::Instant::now();
        // Passed on to the worker's Start, as the api passed it here.
        let request_id = ate_proto::request_id::of(&req).map(str::to_owned);
        let req = req.into_inner();
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
            worker_start(worker.client.clone(), start, request_id.as_deref())
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
        Ok(Response::new(Self::reply(
            &worker,
            reply.into_inner().epoch,
        )))
    }

    async fn checkpoint_inner(
        &self,
        req: Request<v1::CheckpointRequest>,
    ) -> Result<Response<v1::CheckpointReply>, Status> {
        let req = req.into_inner();
        let workload = req
            .workload
            .ok_or_else(|| Status::invalid_argument("invalid workload: missing"))?;
        let (atespace, name) = obj_key(&workload)?;
        Fidelity::from_wire(req.fidelity).ok_or_else(|| {
            Status::invalid_argument(format!("invalid fidelity: {}", req.fidelity))
        })?;
        let worker = self.worker(&workload.worker_id)?;
        let dir = self.generation_dir(&atespace, &name, req.generation, &req.uuid);
        let template = workload.template.clone();
        let sandbox_class = worker.info.sandbox_class.clone();
        let reply = worker
            .client
            .clone()
            .checkpoint(v1::WorkerCheckpointRequest {
                workload: Some(workload),
                generation_dir: dir.display().to_string(),
                fidelity: req.fidelity,
                generation: req.generation,
                uuid: req.uuid.clone(),
                node: self.inner.cfg.name.clone(),
                boot_id: self.inner.fleet.boot_id.clone(),
                grace_ms: req.grace_ms,
            })
            .await?
            .into_inner();
        let actor = v1::ObjectRef {
            atespace: atespace.clone(),
            name: name.clone(),
        };
        let kept_frozen = reply.kept_frozen;
        {
            let key = format!("{atespace}/{name}");
            let mut frozen_on = self.frozen_on();
            if kept_frozen {
                frozen_on.insert(key, worker.info.worker_id.clone());
            } else {
                frozen_on.remove(&key);
            }
        }
        let parents = self.remember_dir(&format!("{atespace}/{name}"), dir.clone());
        let mut snapshot = v1::Snapshot {
            actor: Some(actor.clone()),
            generation: req.generation,
            uuid: req.uuid,
            fidelity: reply.fidelity,
            template,
            sandbox_class,
            node: self.inner.cfg.name.clone(),
            boot_id: self.inner.fleet.boot_id.clone(),
            local_path: dir.display().to_string(),
            durable_uri: String::new(),
            durable_status: DurableStatus::Pending.wire(),
            size_bytes: reply.size_bytes,
            checksum: reply.checksum,
            reason: reply.reason,
            create_time_unix_ms: 0,
        };
        if req.durable {
            match self
                .upload(
                    &atespace,
                    &name,
                    &snapshot,
                    UploadPriority::Normal,
                    &parents,
                )
                .await
            {
                Ok(uri) => {
                    snapshot.durable_uri = uri;
                    snapshot.durable_status = DurableStatus::Completed.wire();
                }
                Err(e) => {
                    // The local generation is kept and usable; only the durable copy failed.
                    snapshot.durable_status = DurableStatus::Failed.wire();
                    snapshot.reason = format!("durable upload failed: {e}");
                }
            }
        } else {
            let agent = self.clone();
            let snap = snapshot.clone();
            let queue = self.inner.background_uploads.clone();
            let mut queued = crate::metrics::BackgroundUpload::queued();
            tokio::spawn(async move {
                // Closed only if the agent is dropping; upload anyway then.
                let _permit = queue.acquire_owned().await.ok();
                queued.running();
                // Detached or deleted while queued: whoever did that owns its durable status.
                if !ate_snapshot::is_sealed(Path::new(&snap.local_path)) {
                    return;
                }
                let uploaded = agent
                    .upload(
                        &atespace,
                        &name,
                        &snap,
                        UploadPriority::Background,
                        &parents,
                    )
                    .await;
                let (status, uri, reason) = match uploaded {
                    Ok(uri) => (DurableStatus::Completed, uri, String::new()),
                    // Pruned (a newer generation replaced it) while it was being read: routine,
                    // and not "kept". Still reported, in case something else removed it.
                    Err(e) if !ate_snapshot::is_sealed(Path::new(&snap.local_path)) => {
                        tracing::debug!(actor = %format!("{atespace}/{name}"), generation = snap.generation, error = %e, "generation removed during its background upload");
                        (
                            DurableStatus::Failed,
                            String::new(),
                            format!(
                                "durable upload failed: the local copy was removed during the upload ({e})"
                            ),
                        )
                    }
                    Err(e) => {
                        tracing::warn!(actor = %format!("{atespace}/{name}"), generation = snap.generation, error = %e, "background upload failed; local copy kept");
                        (
                            DurableStatus::Failed,
                            String::new(),
                            format!("durable upload failed: {e}"),
                        )
                    }
                };
                agent
                    .report(actor, snap.generation, status, uri, reason)
                    .await;
            });
        }
        Ok(Response::new(v1::CheckpointReply {
            snapshot: Some(snapshot),
            epoch: reply.epoch,
            kept_frozen,
        }))
    }
}

#[tonic::async_trait]
impl NodeService for NodeAgent {
    async fn run(&self, req: Request<v1::RunRequest>) -> Result<Response<v1::NodeReply>, Status> {
        let span = start_span("run", &req, req.get_ref().workload.as_ref());
        let result = self.run_inner(req).instrument(span).await;
        crate::metrics::ran(&result);
        result
    }

    async fn restore(
        &self,
        req: Request<v1::RestoreRequest>,
    ) -> Result<Response<v1::NodeReply>, Status> {
        let begun = std::time::Instant::now();
        let span = start_span("restore", &req, req.get_ref().workload.as_ref());
        let result = self.restore_inner(req).instrument(span).await;
        crate::metrics::restored(&result, begun);
        result
    }

    async fn checkpoint(
        &self,
        req: Request<v1::CheckpointRequest>,
    ) -> Result<Response<v1::CheckpointReply>, Status> {
        let begun = std::time::Instant::now();
        let result = self.checkpoint_inner(req).await;
        crate::metrics::checkpointed(&result, begun);
        result
    }

    async fn detach(
        &self,
        req: Request<v1::DetachRequest>,
    ) -> Result<Response<v1::DetachReply>, Status> {
        let req = req.into_inner();
        let actor = req
            .actor
            .ok_or_else(|| Status::invalid_argument("invalid actor: missing"))?;
        let mut out = Vec::new();
        let parents = self
            .inner
            .recent_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&format!("{}/{}", actor.atespace, actor.name))
            .cloned()
            .unwrap_or_default();
        for mut snap in req.snapshots {
            if snap.durable_status != DurableStatus::Completed.wire() {
                match self
                    .upload(
                        &actor.atespace,
                        &actor.name,
                        &snap,
                        UploadPriority::Normal,
                        &parents,
                    )
                    .await
                {
                    Ok(uri) => {
                        snap.durable_uri = uri;
                        snap.durable_status = DurableStatus::Completed.wire();
                    }
                    Err(e) => {
                        snap.durable_status = DurableStatus::Failed.wire();
                        snap.reason = format!("durable upload failed: {e}");
                        out.push(snap);
                        continue;
                    }
                }
            }
            if !snap.local_path.is_empty() && snap.node == self.inner.cfg.name {
                let _ = tokio::fs::remove_dir_all(&snap.local_path).await;
                remove_quarantined(Path::new(&snap.local_path)).await;
            }
            snap.local_path.clear();
            out.push(snap);
        }
        Ok(Response::new(v1::DetachReply { snapshots: out }))
    }

    async fn stop(&self, req: Request<v1::StopRequest>) -> Result<Response<v1::NodeReply>, Status> {
        let req = req.into_inner();
        let worker = self.worker(&req.worker_id)?;
        if let Some(actor) = &req.actor {
            self.forget_frozen(actor, &req.worker_id).await;
        }
        let reply = worker
            .client
            .clone()
            .stop(v1::WorkerStopRequest {
                actor: req.actor,
                activation_at_most: 0,
            })
            .await?
            .into_inner();
        Ok(Response::new(Self::reply(&worker, reply.epoch)))
    }

    async fn forget_actor(
        &self,
        req: Request<v1::ForgetActorRequest>,
    ) -> Result<Response<v1::ForgetActorReply>, Status> {
        let (atespace, name) = actor_key(req.get_ref().actor.as_ref())?;
        let state = &self.inner.cfg.state_dir;
        // A sandbox of that name still running here (a re-created actor, or a copy the api
        // gave up on) keeps writing the log: it stays.
        let workers = std::fs::read_dir(state.join("workers"))
            .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        if workers
            .iter()
            .any(|w| ate_worker::sandbox_alive(&w.join("actors"), &atespace, &name))
        {
            return Ok(Response::new(v1::ForgetActorReply { log_removed: false }));
        }
        let path = actor_log_path(state, &atespace, &name);
        let removed = match tokio::fs::remove_file(&path).await {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot remove {}: {e}",
                    path.display()
                )));
            }
        };
        tracing::info!(actor = %format!("{atespace}/{name}"), log_removed = removed, "deleted actor forgotten");
        Ok(Response::new(v1::ForgetActorReply {
            log_removed: removed,
        }))
    }

    async fn read_log(
        &self,
        req: Request<v1::ReadLogRequest>,
    ) -> Result<Response<v1::ReadLogReply>, Status> {
        let req = req.into_inner();
        let (atespace, name) = actor_key(req.actor.as_ref())?;
        let path = actor_log_path(&self.inner.cfg.state_dir, &atespace, &name);
        let max = u64::from(req.max_bytes.clamp(1, MAX_LOG_READ));
        let read = read_log_part(&path, req.offset, max).await;
        match read {
            Ok((data, next_offset)) => Ok(Response::new(v1::ReadLogReply {
                data,
                next_offset,
                found: true,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Response::new(v1::ReadLogReply {
                    data: Vec::new(),
                    next_offset: 0,
                    found: false,
                }))
            }
            Err(e) => Err(Status::internal(format!(
                "cannot read {}: {e}",
                path.display()
            ))),
        }
    }

    async fn delete_snapshots(
        &self,
        req: Request<v1::DeleteSnapshotsRequest>,
    ) -> Result<Response<v1::DeleteSnapshotsReply>, Status> {
        for snap in req.into_inner().snapshots {
            let root = self.inner.cfg.snapshots_dir();
            // Only directories this node wrote, under its own snapshot root.
            if !snap.local_path.is_empty()
                && snap.node == self.inner.cfg.name
                && Path::new(&snap.local_path).starts_with(&root)
                && let Err(e) = tokio::fs::remove_dir_all(&snap.local_path).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Status::internal(format!(
                    "cannot delete {}: {e}",
                    snap.local_path
                )));
            }
            if !snap.local_path.is_empty()
                && snap.node == self.inner.cfg.name
                && Path::new(&snap.local_path).starts_with(&root)
            {
                remove_quarantined(Path::new(&snap.local_path)).await;
            }
            if !snap.durable_uri.is_empty() {
                self.inner
                    .durable
                    .delete(&snap.durable_uri)
                    .await
                    .map_err(|e| {
                        Status::unavailable(format!("cannot delete {}: {e}", snap.durable_uri))
                    })?;
            }
        }
        tracing::debug!(store = %self.inner.durable_url, "snapshots deleted");
        Ok(Response::new(v1::DeleteSnapshotsReply {}))
    }
}
