//! WorkerService over the worker's unix socket (a thin adapter: `convert` decodes requests
//! and encodes answers), the client constructor the node agent uses, and [`run`]: the whole
//! worker process (runtime, atunnel, service, exit watcher, shutdown). The socket's guards are
//! in `socket.rs`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ate_proto::v1;
use ate_proto::v1::alarm_service_client::AlarmServiceClient;
use ate_proto::v1::identity_service_client::IdentityServiceClient;
use ate_proto::v1::worker_service_client::WorkerServiceClient;
use ate_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::config::WorkerConfig;
use crate::convert;
use crate::image::ImageCache;
use crate::runc::{RuncConfig, RuncRuntime};
pub use crate::socket::peer_allowed;
use crate::socket::{authorized_incoming, bind_socket};
use crate::worker::{EXIT_POLL, Identity, VerbError, Worker};

/// Why the worker process could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid worker config: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sandbox runtime: {0}")]
    Runtime(#[from] crate::error::SandboxError),
    #[error("WorkerService: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("TLS: {0}")]
    Tls(#[from] ate_tls::TlsError),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkerError {
    let what = what.into();
    move |source| WorkerError::Io { what, source }
}

/// Runs a verb that changes a sandbox to its end even when its caller goes away (the node was
/// killed, its call timed out): tonic drops a handler whose caller is gone, and a checkpoint
/// dropped half way would leave the sandbox frozen with its ingress off. The node learns the
/// outcome when it asks again (the verbs are idempotent).
async fn to_completion<T: Send + 'static>(
    verb: impl Future<Output = Result<T, VerbError>> + Send + 'static,
) -> Result<T, VerbError> {
    tokio::spawn(verb)
        .await
        .map_err(|e| VerbError::Internal(format!("worker verb task failed: {e}")))?
}

/// The tonic service: a thin shell over [`Worker`]. Requests are decoded and answers encoded
/// here (`convert`); the worker's verbs see only its own types.
#[derive(Clone)]
pub struct WorkerServiceImpl {
    worker: Arc<Worker>,
    cpu: Arc<crate::cpu::CpuMeter>,
}

#[tonic::async_trait]
impl WorkerService for WorkerServiceImpl {
    type ExecStream = tokio_stream::wrappers::ReceiverStream<Result<v1::ExecOutput, Status>>;

    /// The stream's first message starts the command (`Worker::exec`); the rest are fed to it,
    /// and its output is sent back. Dropping the answer (the node went away) ends the session.
    async fn exec(
        &self,
        req: Request<tonic::Streaming<v1::PlacedExecRequest>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let mut inbound = req.into_inner();
        let first = inbound.message().await?;
        let start = convert::exec_start(first).map_err(convert::status)?;
        let (input_tx, input) = tokio::sync::mpsc::channel(16);
        let mut events = self
            .worker
            .exec(start, input)
            .await
            .map_err(convert::status)?;
        let feeder = tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(i) = convert::exec_input(m)
                    && input_tx.send(i).await.is_err()
                {
                    return;
                }
            }
        });
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            // The input's relay ends with the output's: its request stream held open would keep
            // the call below alive after its caller is gone.
            let _feeder = AbortOnDrop(feeder);
            loop {
                tokio::select! {
                    e = events.recv() => match e {
                        Some(e) => if tx.send(Ok(convert::exec_output(e))).await.is_err() { return },
                        None => return,
                    },
                    // The caller is gone: dropping `events` ends the session.
                    () = tx.closed() => {
                        tracing::info!("exec: the caller went away; ending the session");
                        return;
                    }
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn info(
        &self,
        _req: Request<v1::WorkerInfoRequest>,
    ) -> Result<Response<v1::WorkerInfo>, Status> {
        Ok(Response::new(convert::worker_info(&self.worker, &self.cpu)))
    }

    async fn start(
        &self,
        req: Request<v1::WorkerStartRequest>,
    ) -> Result<Response<v1::WorkerStartReply>, Status> {
        // Every line of the start carries the request id the node passed on (DESIGN §8).
        let span = {
            let request_id = ate_proto::request_id::of(&req).unwrap_or_default();
            let actor = req
                .get_ref()
                .workload
                .as_ref()
                .and_then(|w| w.actor.as_ref())
                .map(|a| format!("{}/{}", a.atespace, a.name))
                .unwrap_or_default();
            let span = tracing::info_span!(
                "start",
                request_id = %request_id,
                trace_id = tracing::field::Empty,
                actor = %actor
            );
            ate_tls::trace_context::continue_grpc(&span, &req);
            span
        };
        let req = req.into_inner();
        let kind = crate::metrics::start_kind(&req.generation_dir);
        let begun = std::time::Instant::now();
        // A request refused as malformed counts in the start metrics too.
        let result = match convert::start_request(req) {
            Ok(req) => {
                let worker = self.worker.clone();
                to_completion(async move { worker.start(req).instrument(span).await }).await
            }
            Err(e) => Err(e),
        };
        crate::metrics::started(kind, &result, begun);
        result
            .map(|r| Response::new(convert::start_reply(r)))
            .map_err(convert::status)
    }

    async fn checkpoint(
        &self,
        req: Request<v1::WorkerCheckpointRequest>,
    ) -> Result<Response<v1::WorkerCheckpointReply>, Status> {
        let begun = std::time::Instant::now();
        let result = match convert::checkpoint_request(req.into_inner()) {
            Ok(req) => {
                let worker = self.worker.clone();
                to_completion(async move { worker.checkpoint(req).await }).await
            }
            Err(e) => Err(e),
        };
        crate::metrics::checkpointed(&result, begun);
        result
            .map(|r| Response::new(convert::checkpoint_reply(r)))
            .map_err(convert::status)
    }

    async fn stop(
        &self,
        req: Request<v1::WorkerStopRequest>,
    ) -> Result<Response<v1::WorkerStopReply>, Status> {
        let req = convert::stop_request(req.into_inner()).map_err(convert::status)?;
        let worker = self.worker.clone();
        to_completion(async move { worker.stop(req).await })
            .await
            .map(|r| Response::new(convert::stop_reply(r)))
            .map_err(convert::status)
    }

    async fn activity(
        &self,
        req: Request<v1::WorkerActivityRequest>,
    ) -> Result<Response<v1::WorkerActivityReply>, Status> {
        let mut reply = convert::activity_reply(self.worker.activity());
        if !req.into_inner().with_usage {
            return Ok(Response::new(reply));
        }
        // What each running actor uses (`ate top actors`): the meter's last window, its
        // cgroup's memory now.
        let running: std::collections::HashMap<(String, String), (String, i64)> = self
            .worker
            .running_sandboxes()
            .into_iter()
            .map(|(actor, id, since)| ((actor.atespace, actor.name), (id, since)))
            .collect();
        for a in reply.actors.iter_mut().filter(|a| !a.exited) {
            let Some(r) = &a.actor else { continue };
            let Some((id, since)) = running.get(&(r.atespace.clone(), r.name.clone())) else {
                continue;
            };
            a.cpu_millis = self.cpu.sandbox_usage_millis(id).unwrap_or(0);
            a.memory_bytes = crate::cpu::memory_bytes(id).unwrap_or(0);
            a.active_since_unix_ms = *since;
        }
        Ok(Response::new(reply))
    }

    async fn renew_lease(
        &self,
        req: Request<v1::WorkerLeaseRequest>,
    ) -> Result<Response<v1::WorkerLeaseReply>, Status> {
        let valid_for = std::time::Duration::from_millis(req.into_inner().valid_for_ms);
        self.worker.renew_lease(valid_for);
        Ok(Response::new(v1::WorkerLeaseReply {}))
    }
}

/// A WorkerService client over the worker's unix socket.
pub async fn connect_worker(
    socket: &Path,
) -> Result<WorkerServiceClient<Channel>, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    let channel = Endpoint::from_static("http://worker.sock")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await?;
    Ok(WorkerServiceClient::new(channel))
}

/// A random non-zero epoch: a new one every process start. Kept below 2^63 because the stores
/// keep it in a signed 64-bit column.
fn new_epoch() -> u64 {
    loop {
        let e: u64 = rand::random::<u64>() >> 1;
        if e != 0 {
            return e;
        }
    }
}

/// The worker's identity, held: `<state>/workers/<id>/worker.lock` locked by this process
/// ([`lock_identity`]). Only with it may a process bind the worker's socket, adopt its sandboxes
/// or start new ones, so a worker id is never served by two processes at once; the lock ends
/// with the process (it is close-on-exec: no sandbox, runc or relay holds it).
#[derive(Debug)]
pub struct WorkerLock {
    _lock: ate_tls::process::InstanceLock,
}

/// After a SIGTERM, how long the worker looks whether its supervisor (which set a parent-death
/// signal) is dying before it takes the signal as a graceful stop.
const SUPERVISOR_EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long `--remove-leftovers` waits for a running process of the worker to exit before it
/// gives up (a normal start waits as long as it takes).
const LEFTOVERS_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Checks the config, then takes the worker's identity lock, waiting while an earlier process of
/// the same worker still runs (a restarted worker whose predecessor is finishing a checkpoint or
/// its drain): that one must exit before this one binds anything or touches a sandbox. Logs the
/// holder's pid at once and every few seconds. `--remove-leftovers` waits at most a minute.
pub async fn lock_identity(config: &WorkerConfig) -> Result<WorkerLock, WorkerError> {
    if !ate_core::names::is_label(&config.id) {
        return Err(WorkerError::Config(format!(
            "--id {:?} must be a DNS-1123 label (it names directories and the SPIFFE id)",
            config.id
        )));
    }
    // Before anything is created: a worker reporting an address no router can dial would
    // look healthy while every tunnel to it fails. Removing leftovers binds nothing.
    if !config.remove_leftovers {
        config.check_addresses()?;
    }
    let worker_dir = config.worker_dir();
    tokio::fs::create_dir_all(&worker_dir)
        .await
        .map_err(io_err(format!("create {}", worker_dir.display())))?;
    let path = config.lock_path();
    let what = format!("worker {}", config.id);
    let acquire = ate_tls::process::InstanceLock::acquire(&path, &what);
    let lock = if config.remove_leftovers {
        tokio::time::timeout(LEFTOVERS_LOCK_WAIT, acquire)
            .await
            .map_err(|_| {
                WorkerError::Config(format!(
                    "worker {} is still served by pid {} after {LEFTOVERS_LOCK_WAIT:?}: stop it before removing its leftovers",
                    config.id,
                    ate_tls::process::lock_holder(&path).unwrap_or_else(|| "unknown".into())
                ))
            })??
    } else {
        acquire.await?
    };
    Ok(WorkerLock { _lock: lock })
}

/// Runs the worker until `shutdown` resolves: [`lock_identity`] (a shutdown while it waits ends
/// the run at once), then [`run_locked`].
pub async fn run(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WorkerError> {
    tokio::pin!(shutdown);
    let lock = tokio::select! {
        lock = lock_identity(&config) => lock?,
        () = &mut shutdown => return Ok(()),
    };
    run_locked(config, lock, shutdown).await
}

/// Runs the worker, its identity locked, until `shutdown` resolves: the runc runtime (state
/// `<state>/workers/<id>/runc`, actors under `<state>/workers/<id>/actors/<atespace>/<name>`),
/// atunnel on `config.listen`, WorkerService on `<state>/workers/<id>/worker.sock` (mode 0600).
/// On shutdown it first drains (its node asks the api to suspend every actor, up to
/// [`crate::worker::DRAIN_TIMEOUT`]), then stops accepting and removes the socket; sandboxes
/// still running are left for the next process to re-adopt (only a worker no node ever leased
/// stops them). A worker whose supervisor died (`ate up` killed: the SIGTERM is its parent-death
/// signal; the binary notes the supervisor with `ate_tls::process::note_supervisor`) does not
/// drain: no node or api of that supervisor is left to suspend anything, so it stops at once and
/// leaves every sandbox to the next process.
pub async fn run_locked(
    config: WorkerConfig,
    _lock: WorkerLock,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WorkerError> {
    let worker_dir = config.worker_dir();
    let defaults = RuncConfig::new(&worker_dir);
    let runtime = RuncRuntime::new(RuncConfig {
        spare_netns: config
            .spare_netns
            .min(usize::try_from(config.slots).unwrap_or(usize::MAX)),
        log_relay: config
            .log_relay
            .clone()
            .unwrap_or_else(|| defaults.log_relay.clone()),
        userns: config.userns,
        userns_claims_dir: config.userns_claims_dir.clone(),
        track_memory: config.track_memory,
        criu: config.criu.clone().or(defaults.criu.clone()),
        ..defaults
    })
    .await?;
    // Generations are sealed at rest with the node's snapshot keys (docs/security.md).
    let keys = match config.snapshot_keys_dir() {
        Some(dir) => Some(ate_snapshot::SnapshotKeys::load(&dir).map_err(|e| {
            WorkerError::Config(format!("snapshot keys in {}: {e}", dir.display()))
        })?),
        None => None,
    };
    match &keys {
        Some(k) => {
            tracing::info!(data_key = k.data_key_id(), scratch = %config.snapshot_scratch.display(), "generations are sealed at rest")
        }
        None => tracing::warn!(
            "no snapshot keys (--snapshot-keys): generations are written to the node's disk in plaintext"
        ),
    }
    ate_snapshot::sealed::configure(keys, config.snapshot_scratch.clone());
    let swept = ate_snapshot::sealed::sweep_scratch();
    if swept > 0 {
        tracing::info!(
            swept,
            "removed snapshot scratch dirs left by processes that are gone"
        );
    }
    if config.remove_leftovers {
        let worker = Worker::new(
            Identity {
                spiffe_id: String::new(),
                id: config.id.clone(),
                epoch: new_epoch(),
                addresses: Vec::new(),
                cpu_millis: config.cpu_millis(),
                memory_bytes: config.memory_bytes(),
                slots: config.slots,
                labels: config.label_map(),
            },
            Arc::new(runtime),
            ImageCache::new(config.image_cache_dir()),
            config.actors_dir(),
            config.actor_logs_dir(),
            config.faults.clone(),
        );
        worker.remove_leftovers().await;
        return Ok(());
    }
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(io_err(format!("atunnel bind {}", config.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(io_err("atunnel local address"))?;
    let reported = config.reported_address(bound);

    let socket = config.socket_path();
    // Only root (the node agent) or our own user may drive the worker: mode 0600 on the file,
    // peer credentials on every connection.
    let unix = bind_socket(&socket)?;
    // What `socket` names now: at exit only this file is removed, never one a later process
    // bound at the same path.
    let socket_id = file_id(&socket);
    let own_uid = nix::unistd::geteuid().as_raw();

    // atunnel's identity: with TLS the certificate's SPIFFE ID (the router pins it from the
    // assignment); without, the ID this worker would have, for the record.
    let tls = config.tls.load("worker")?;
    let spiffe_id = match tls.as_ref().and_then(ate_tls::CertSource::id) {
        Some(id) => id.uri(),
        None => ate_tls::SpiffeId::worker_instance(config.tls.trust_domain(), &config.id)?.uri(),
    };
    let tunnel_tls = match &tls {
        Some(src) => {
            let router = ate_tls::SpiffeId::router(config.tls.trust_domain())?;
            let mut server = ate_tls::server_config(
                src,
                ate_tls::ClientAuth::Required {
                    allowed: ate_tls::AllowList::only([router]),
                },
            )?;
            ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2]);
            Some(Arc::new(server))
        }
        None => None,
    };
    let router = match config.router.clone() {
        Some(addr) => Some(
            crate::egress::RouterClient::new(addr, tls.as_ref(), config.tls.trust_domain())
                .map_err(|e| WorkerError::Config(e.to_string()))?,
        ),
        None => None,
    };
    let api = match &config.api {
        Some(addrs) => Some(api_clients(addrs, tls.as_ref(), config.tls.trust_domain())?),
        None => None,
    };
    let router_text = config
        .router
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".into());
    let ident = Identity {
        spiffe_id,
        id: config.id.clone(),
        epoch: new_epoch(),
        addresses: vec![reported.to_string()],
        // What the scheduler books templates' CPU against: the machine's × --cpu-overcommit.
        cpu_millis: config.cpu_capacity_millis(),
        memory_bytes: config.memory_bytes(),
        slots: config.slots,
        labels: config.label_map(),
    };
    let worker = Arc::new(
        Worker::new(
            ident,
            Arc::new(runtime),
            ImageCache::new(config.image_cache_dir()),
            config.actors_dir(),
            config.actor_logs_dir(),
            config.faults.clone(),
        )
        .with_frozen_policy(config.frozen_policy())
        .with_egress_denied(config.deny_egress.clone())
        .with_external_volume_roots(config.external_volume_roots.clone())
        .with_router(router)
        .with_api(api)
        .with_suspend_grace(config.suspend_grace)
        .with_incremental_min_bytes(config.incremental_min_mib.saturating_mul(1 << 20))
        .with_page_source(match config.memory_restore {
            crate::config::MemoryRestore::Lazy => config.page_source.clone(),
            crate::config::MemoryRestore::Eager => None,
        }),
    );
    crate::metrics::export_gauges(&worker);
    // Sandboxes an earlier process of this worker left running are taken back (their
    // ingress waits for the node's reconciliation with the api).
    worker.adopt_leftovers().await;
    let _image_sweep = spawn_image_sweep(config.image_cache_dir(), config.image_retention);
    let deny_egress = config
        .deny_egress
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(worker = %config.id, epoch = worker.ident.epoch, atunnel = %bound, advertised = %reported, %deny_egress, router = %router_text, socket = %socket.display(), "worker up");

    let (stop_tx, stop_rx) = watch::channel(false);
    let wait_stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let tunnel_task = tokio::spawn(crate::atunnel::serve(
        listener,
        tunnel_tls,
        worker.tunnels.clone(),
        wait_stop(stop_rx.clone()),
    ));
    // The same-machine fast path (handoff.rs): a router on this machine takes the actor's socket
    // from here instead of piping through atunnel. Without it, routers use the CONNECT path.
    let handoff_task = match crate::handoff::bind(&config.handoff_dir(), &reported.to_string()) {
        Ok((listener, path)) => {
            tracing::info!(socket = %path.display(), "handoff socket for routers on this machine");
            Some(tokio::spawn(crate::handoff::serve(
                listener,
                worker.tunnels.clone(),
                wait_stop(stop_rx.clone()),
            )))
        }
        Err(e) => {
            tracing::warn!(dir = %config.handoff_dir().display(), error = %e, "no handoff socket: routers on this machine use CONNECT tunnels");
            None
        }
    };
    let watcher = {
        let worker = worker.clone();
        let stopped = wait_stop(stop_rx.clone());
        tokio::spawn(async move {
            tokio::pin!(stopped);
            let mut tick = tokio::time::interval(EXIT_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Container inits are the worker's children (subreaper): SIGCHLD means one may
            // have exited, so look at once rather than at the next tick.
            let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
                .map_err(
                    |e| tracing::warn!(error = %e, "no SIGCHLD stream; exits found by polling"),
                )
                .ok();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => worker.reap_exited().await,
                    Some(()) = async {
                        match sigchld.as_mut() {
                            Some(s) => s.recv().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        worker.collect_exits().await;
                        // Every command the worker runs ends with a SIGCHLD too: at most one
                        // pass per 20 ms (signals in between coalesce).
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                }
            }
        })
    };
    // Weights for the actors' cgroups and their real use, every SAMPLE_PERIOD (crate::cpu).
    let cpu = Arc::new(crate::cpu::CpuMeter::new(
        config.actors_dir(),
        config.cpu_millis(),
    ));
    let cpu_task = {
        let cpu = cpu.clone();
        let stopped = wait_stop(stop_rx.clone());
        tokio::spawn(async move {
            tokio::pin!(stopped);
            let mut tick = tokio::time::interval(crate::cpu::SAMPLE_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {
                        let cpu = cpu.clone();
                        let _ = tokio::task::spawn_blocking(move || cpu.pass()).await;
                    }
                }
            }
        })
    };
    let service = WorkerServiceImpl {
        worker: worker.clone(),
        cpu,
    };
    // Either side ending (the caller's shutdown, or the server failing) stops everything.
    let serve = async {
        let served = Server::builder()
            .add_service(WorkerServiceServer::new(service))
            .serve_with_incoming_shutdown(
                authorized_incoming(unix, own_uid),
                wait_stop(stop_rx.clone()),
            )
            .await;
        stop_tx.send_replace(true);
        served
    };
    let signal = async {
        tokio::select! {
            _ = shutdown => {
                if ate_tls::process::supervisor_gone(SUPERVISOR_EXIT_WAIT).await {
                    tracing::warn!(
                        supervisor_pid = ate_tls::process::supervisor_pid().unwrap_or_default(),
                        "the process that started this worker is gone (the stop is its parent-death signal): stopping at once without a drain; every sandbox keeps running for the next worker process"
                    );
                } else {
                    // A graceful stop keeps state: the node and the api suspend every actor
                    // while the worker still serves them (Activity reports it draining).
                    worker.drain(crate::worker::DRAIN_TIMEOUT).await;
                }
            }
            _ = wait_stop(stop_rx.clone()) => {}
        }
        stop_tx.send_replace(true);
    };
    let (served, ()) = tokio::join!(serve, signal);

    let _ = tunnel_task.await;
    if let Some(task) = handoff_task {
        let _ = task.await;
    }
    let _ = watcher.await;
    let _ = cpu_task.await;
    worker.shutdown().await;
    if socket_id.is_some() && file_id(&socket) == socket_id {
        if let Err(e) = tokio::fs::remove_file(&socket).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %socket.display(), error = %e, "remove socket");
        }
    } else {
        tracing::warn!(socket = %socket.display(), "the socket path names another file than the one this worker bound; left in place");
    }
    tracing::info!(worker = %config.id, "worker stopped");
    served.map_err(WorkerError::from)
}

/// Device and inode of the file at `path`, if there is one.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes unpacked images no sandbox used for `retention`, a few minutes after start and then
/// hourly (every worker of a node may sweep the shared cache: each entry is checked under its
/// lock). Aborted when the returned guard drops.
fn spawn_image_sweep(cache: PathBuf, retention: std::time::Duration) -> Option<AbortOnDrop> {
    if retention.is_zero() {
        return None;
    }
    let task = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(120)).await;
        loop {
            let (c, r) = (cache.clone(), retention);
            match tokio::task::spawn_blocking(move || crate::image::sweep_unused(&c, r)).await {
                Ok(Ok(stats)) if stats.entries_removed > 0 => {
                    tracing::info!(
                        removed = stats.entries_removed,
                        seen = stats.entries_seen,
                        "image cache swept"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "image cache sweep failed"),
                Err(e) => tracing::warn!(error = %e, "image cache sweep task failed"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    });
    Some(AbortOnDrop(task))
}

/// Aborts a background task when dropped (the worker's `run` returning).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The api's services for the local actor API (`--api`): mTLS with this worker's certificate,
/// the api's SPIFFE ID pinned; plaintext without TLS material. Connects lazily.
fn api_clients(
    addrs: &str,
    tls: Option<&ate_tls::CertSource>,
    trust_domain: &str,
) -> Result<crate::worker::ApiClients, WorkerError> {
    let config = match tls {
        Some(src) => Some(Arc::new(ate_tls::client_config(
            src,
            ate_tls::ServerCheck::Pin(ate_tls::SpiffeId::api(trust_domain)?),
        )?)),
        None => None,
    };
    let channel =
        ate_tls::replicas_channel_lazy(addrs, config, std::time::Duration::from_secs(5), |e| {
            e.timeout(std::time::Duration::from_secs(10))
        })
        .map_err(|e| WorkerError::Config(format!("bad --api {addrs:?}: {e}")))?;
    Ok(crate::worker::ApiClients {
        alarms: AlarmServiceClient::new(channel.clone()),
        identity: IdentityServiceClient::new(channel),
    })
}
