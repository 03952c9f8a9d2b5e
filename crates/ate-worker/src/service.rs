//! WorkerService over the worker's unix socket, the client constructor the node agent uses, and
//! [`run`]: the whole worker process (runtime, atunnel, service, exit watcher, shutdown).

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ate_proto::v1;
use ate_proto::v1::worker_service_client::WorkerServiceClient;
use ate_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use crate::config::WorkerConfig;
use crate::image::ImageCache;
use crate::runc::{RuncConfig, RuncRuntime};
use crate::worker::{EXIT_POLL, Identity, Worker};

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

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkerError {
    let what = what.into();
    move |source| WorkerError::Io { what, source }
}

/// The tonic service: a thin shell over [`Worker`].
#[derive(Clone)]
pub struct WorkerServiceImpl {
    worker: Arc<Worker>,
}

#[tonic::async_trait]
impl WorkerService for WorkerServiceImpl {
    async fn info(
        &self,
        _req: Request<v1::WorkerInfoRequest>,
    ) -> Result<Response<v1::WorkerInfo>, Status> {
        let w = &self.worker;
        let id = &w.ident;
        Ok(Response::new(v1::WorkerInfo {
            worker_id: id.id.clone(),
            epoch: id.epoch,
            addresses: id.addresses.clone(),
            capacity: Some(v1::Capacity {
                cpu_millis: id.cpu_millis,
                memory_bytes: id.memory_bytes,
                actor_slots: id.slots,
            }),
            labels: id.labels.clone().into_iter().collect(),
            sandbox_class: w.sandbox_class(),
            can_restore_memory: w.can_restore_memory(),
            identity: id.spiffe_id.clone(),
        }))
    }

    async fn start(
        &self,
        req: Request<v1::WorkerStartRequest>,
    ) -> Result<Response<v1::WorkerStartReply>, Status> {
        self.worker.start(req.into_inner()).await.map(Response::new)
    }

    async fn checkpoint(
        &self,
        req: Request<v1::WorkerCheckpointRequest>,
    ) -> Result<Response<v1::WorkerCheckpointReply>, Status> {
        self.worker
            .checkpoint(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn stop(
        &self,
        req: Request<v1::WorkerStopRequest>,
    ) -> Result<Response<v1::WorkerStopReply>, Status> {
        self.worker.stop(req.into_inner()).await.map(Response::new)
    }

    async fn activity(
        &self,
        _req: Request<v1::WorkerActivityRequest>,
    ) -> Result<Response<v1::WorkerActivityReply>, Status> {
        Ok(Response::new(self.worker.activity()))
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

/// Runs the worker until `shutdown` resolves: the runc runtime (state
/// `<state>/workers/<id>/runc`, actors under `<state>/workers/<id>/actors/<atespace>/<name>`),
/// atunnel on `config.listen`, WorkerService on `<state>/workers/<id>/worker.sock` (mode 0600).
/// On shutdown it stops accepting, stops every sandbox (no snapshot) and removes the socket.
pub async fn run(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WorkerError> {
    if !ate_core::names::is_label(&config.id) {
        return Err(WorkerError::Config(format!(
            "--id {:?} must be a DNS-1123 label (it names directories and the SPIFFE id)",
            config.id
        )));
    }
    let worker_dir = config.worker_dir();
    tokio::fs::create_dir_all(&worker_dir)
        .await
        .map_err(io_err(format!("create {}", worker_dir.display())))?;
    let runtime = RuncRuntime::new(RuncConfig::new(&worker_dir)).await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(io_err(format!("atunnel bind {}", config.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(io_err("atunnel local address"))?;

    let socket = config.socket_path();
    match tokio::fs::remove_file(&socket).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("remove stale {}", socket.display()))(e)),
    }
    let unix = UnixListener::bind(&socket).map_err(io_err(format!("bind {}", socket.display())))?;
    // Only root (the node agent) may drive the worker.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("chmod {}", socket.display())))?;

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
    let ident = Identity {
        spiffe_id,
        id: config.id.clone(),
        epoch: new_epoch(),
        addresses: vec![bound.to_string()],
        cpu_millis: config.cpu_millis(),
        memory_bytes: config.memory_bytes(),
        slots: config.slots,
        labels: config.label_map(),
    };
    let worker = Arc::new(Worker::new(
        ident,
        Arc::new(runtime),
        ImageCache::new(config.image_cache_dir()),
        config.actors_dir(),
        config.actor_logs_dir(),
        config.faults.clone(),
    )
    .with_frozen_policy(config.frozen_policy()));
    worker.clean_leftovers().await;
    tracing::info!(worker = %config.id, epoch = worker.ident.epoch, atunnel = %bound, socket = %socket.display(), "worker up");

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
    let watcher = {
        let worker = worker.clone();
        let stopped = wait_stop(stop_rx.clone());
        tokio::spawn(async move {
            tokio::pin!(stopped);
            let mut tick = tokio::time::interval(EXIT_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => worker.reap_exited().await,
                }
            }
        })
    };
    let service = WorkerServiceImpl {
        worker: worker.clone(),
    };
    // Either side ending (the caller's shutdown, or the server failing) stops everything.
    let serve = async {
        let served = Server::builder()
            .add_service(WorkerServiceServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(unix), wait_stop(stop_rx.clone()))
            .await;
        stop_tx.send_replace(true);
        served
    };
    let signal = async {
        tokio::select! {
            _ = shutdown => {}
            _ = wait_stop(stop_rx.clone()) => {}
        }
        stop_tx.send_replace(true);
    };
    let (served, ()) = tokio::join!(serve, signal);

    let _ = tunnel_task.await;
    let _ = watcher.await;
    worker.shutdown().await;
    if let Err(e) = tokio::fs::remove_file(&socket).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(socket = %socket.display(), error = %e, "remove socket");
    }
    tracing::info!(worker = %config.id, "worker stopped");
    served.map_err(WorkerError::from)
}
