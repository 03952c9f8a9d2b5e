//! WorkerService over the worker's unix socket (a thin adapter: `convert` decodes requests
//! and encodes answers) and [`run`]: the whole worker process (runtime, atunnel, service, exit
//! watcher, shutdown). The socket's guards are in `socket.rs`; the node agent's client is
//! `ate-worker-client`.

use std::future::Future;
use std::sync::Arc;

use ate_proto::v1;
use ate_proto::v1::alarm_service_client::AlarmServiceClient;
use ate_proto::v1::identity_service_client::IdentityServiceClient;
use ate_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::config::WorkerConfig;
use crate::convert;
use crate::process::{self, wait_stop};
pub use crate::socket::peer_allowed;
use crate::socket::{authorized_incoming, bind_socket};
use crate::worker::{VerbError, Worker};

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
            ate_telemetry::trace_context::continue_grpc(&span, &req);
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
    let runtime = process::runc_runtime(&config).await?;
    process::configure_snapshot_keys(&config)?;
    if config.remove_leftovers {
        process::remove_leftovers(&config, runtime).await;
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
    let socket_id = process::file_id(&socket);
    let own_uid = nix::unistd::geteuid().as_raw();
    let peers = process::Peers::load(&config)?;
    let worker = process::build_worker(
        &config,
        runtime,
        peers.spiffe_id,
        reported,
        peers.router,
        peers.api,
    );
    crate::metrics::export_gauges(&worker);
    // Sandboxes an earlier process of this worker left running are taken back (their
    // ingress waits for the node's reconciliation with the api).
    worker.adopt_leftovers().await;
    let _image_sweep = process::spawn_image_sweep(config.image_cache_dir(), config.image_retention);
    process::log_worker_up(&config, &worker, bound, reported, &socket);

    let (stop_tx, stop_rx) = watch::channel(false);
    let tunnel_task = tokio::spawn(ate_atunnel::serve(
        listener,
        peers.tunnel_tls,
        worker.tunnels.clone(),
        wait_stop(stop_rx.clone()),
    ));
    let handoff_task =
        process::spawn_handoff(&config, &worker, reported, wait_stop(stop_rx.clone()));
    let watcher = process::spawn_exit_watcher(worker.clone(), wait_stop(stop_rx.clone()));
    // Weights for the actors' cgroups and their real use, every SAMPLE_PERIOD (crate::cpu).
    let cpu = Arc::new(crate::cpu::CpuMeter::new(
        config.actors_dir(),
        config.cpu_millis(),
    ));
    // Per-actor series on /metrics, capped (crate::actor_metrics).
    crate::actor_metrics::export(&worker, &cpu, config.actor_metrics_limit);
    let cpu_task = process::spawn_cpu_meter(cpu.clone(), wait_stop(stop_rx.clone()));
    let service = WorkerServiceImpl {
        worker: worker.clone(),
        cpu,
    };
    let stop = (&stop_tx, &stop_rx);
    let served = serve_until_stopped(service, unix, own_uid, &worker, shutdown, stop).await;

    let _ = tunnel_task.await;
    if let Some(task) = handoff_task {
        let _ = task.await;
    }
    let _ = watcher.await;
    let _ = cpu_task.await;
    worker.shutdown().await;
    process::remove_socket_if_ours(&socket, socket_id).await;
    tracing::info!(worker = %config.id, "worker stopped");
    served.map_err(WorkerError::from)
}

/// Serves WorkerService on the unix socket until `shutdown` resolves (after the drain) or the
/// server fails: either side ending stops everything (`stop`).
async fn serve_until_stopped(
    service: WorkerServiceImpl,
    unix: tokio::net::UnixListener,
    own_uid: u32,
    worker: &Worker,
    shutdown: impl Future<Output = ()> + Send,
    (stop_tx, stop_rx): (&watch::Sender<bool>, &watch::Receiver<bool>),
) -> Result<(), tonic::transport::Error> {
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
    served
}

/// Aborts a background task when dropped (the worker's `run` returning).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The api's services for the local actor API (`--api`): mTLS with this worker's certificate,
/// the api's SPIFFE ID pinned; plaintext without TLS material. Connects lazily.
pub(crate) fn api_clients(
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
