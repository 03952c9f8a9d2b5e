//! The phases of the worker process that [`crate::service::run_locked`] runs in order: the
//! runc runtime, the snapshot keys, the TLS identity and peers, the worker built and taken up,
//! its background tasks (handoff socket, exit watcher, CPU meter), and the socket removed at
//! the end.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::WorkerConfig;
use crate::runc::{RuncConfig, RuncRuntime};
use crate::service::{AbortOnDrop, WorkerError, api_clients};
use crate::worker::{ApiClients, EXIT_POLL, Identity, Worker};
use ate_image::ImageCache;

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

/// Resolves when the worker's stop is sent on `rx`.
pub(crate) async fn wait_stop(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The runc runtime: state `<state>/workers/<id>/runc`, the config's netns pool, log relay,
/// user namespaces, memory tracking and CRIU.
pub(crate) async fn runc_runtime(config: &WorkerConfig) -> Result<RuncRuntime, WorkerError> {
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
    Ok(runtime)
}

/// Generations are sealed at rest with the node's snapshot keys (docs/security.md); scratch
/// dirs of processes that are gone are removed.
pub(crate) fn configure_snapshot_keys(config: &WorkerConfig) -> Result<(), WorkerError> {
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
    Ok(())
}

/// `--remove-leftovers`: a worker with no address removes what earlier processes left.
pub(crate) async fn remove_leftovers(config: &WorkerConfig, runtime: RuncRuntime) {
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
}

/// Who the worker is to the others and who they are to it.
pub(crate) struct Peers {
    /// atunnel's identity: with TLS the certificate's SPIFFE ID (the router pins it from the
    /// assignment); without, the ID this worker would have, for the record.
    pub(crate) spiffe_id: String,
    /// atunnel's TLS (the router's certificate required), None without TLS.
    pub(crate) tunnel_tls: Option<Arc<ate_tls::rustls::ServerConfig>>,
    pub(crate) router: Option<ate_egress::RouterClient>,
    pub(crate) api: Option<ApiClients>,
}

impl Peers {
    pub(crate) fn load(config: &WorkerConfig) -> Result<Self, WorkerError> {
        let tls = config.tls.load("worker")?;
        let spiffe_id = match tls.as_ref().and_then(ate_tls::CertSource::id) {
            Some(id) => id.uri(),
            None => {
                ate_tls::SpiffeId::worker_instance(config.tls.trust_domain(), &config.id)?.uri()
            }
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
                ate_egress::RouterClient::new(addr, tls.as_ref(), config.tls.trust_domain())
                    .map_err(|e| WorkerError::Config(e.to_string()))?,
            ),
            None => None,
        };
        let api = match &config.api {
            Some(addrs) => Some(api_clients(addrs, tls.as_ref(), config.tls.trust_domain())?),
            None => None,
        };
        Ok(Self {
            spiffe_id,
            tunnel_tls,
            router,
            api,
        })
    }
}

/// The worker, with its identity (`reported`: the atunnel address the router dials) and
/// everything the config says about it.
pub(crate) fn build_worker(
    config: &WorkerConfig,
    runtime: RuncRuntime,
    spiffe_id: String,
    reported: SocketAddr,
    router: Option<ate_egress::RouterClient>,
    api: Option<ApiClients>,
) -> Arc<Worker> {
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
    Arc::new(
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
    )
}

/// The "worker up" line: who it is and where it listens.
pub(crate) fn log_worker_up(
    config: &WorkerConfig,
    worker: &Worker,
    bound: SocketAddr,
    reported: SocketAddr,
    socket: &Path,
) {
    let router_text = config
        .router
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".into());
    let deny_egress = config
        .deny_egress
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(worker = %config.id, epoch = worker.ident.epoch, atunnel = %bound, advertised = %reported, %deny_egress, router = %router_text, socket = %socket.display(), "worker up");
}

/// The same-machine fast path (handoff.rs): a router on this machine takes the actor's socket
/// from here instead of piping through atunnel. Without it, routers use the CONNECT path.
pub(crate) fn spawn_handoff(
    config: &WorkerConfig,
    worker: &Worker,
    reported: SocketAddr,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    match crate::handoff::bind(&config.handoff_dir(), &reported.to_string()) {
        Ok((listener, path)) => {
            tracing::info!(socket = %path.display(), "handoff socket for routers on this machine");
            Some(tokio::spawn(crate::handoff::serve(
                listener,
                worker.tunnels.clone(),
                stopped,
            )))
        }
        Err(e) => {
            tracing::warn!(dir = %config.handoff_dir().display(), error = %e, "no handoff socket: routers on this machine use CONNECT tunnels");
            None
        }
    }
}

/// Collects the actors' exits: every [`EXIT_POLL`], and at once on a SIGCHLD.
pub(crate) fn spawn_exit_watcher(
    worker: Arc<Worker>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(EXIT_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Container inits are the worker's children (subreaper): SIGCHLD means one may
        // have exited, so look at once rather than at the next tick.
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .map_err(|e| tracing::warn!(error = %e, "no SIGCHLD stream; exits found by polling"))
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
}

/// Weights for the actors' cgroups and their real use, every SAMPLE_PERIOD (crate::cpu).
pub(crate) fn spawn_cpu_meter(
    cpu: Arc<crate::cpu::CpuMeter>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
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
}

/// Removes the worker's socket at exit, only if `socket` still names the file this process
/// bound (`socket_id`), never one a later process bound at the same path.
pub(crate) async fn remove_socket_if_ours(socket: &Path, socket_id: Option<(u64, u64)>) {
    if socket_id.is_some() && file_id(socket) == socket_id {
        if let Err(e) = tokio::fs::remove_file(socket).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %socket.display(), error = %e, "remove socket");
        }
    } else {
        tracing::warn!(socket = %socket.display(), "the socket path names another file than the one this worker bound; left in place");
    }
}

/// Device and inode of the file at `path`, if there is one.
pub(crate) fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes unpacked images no sandbox used for `retention`, a few minutes after start and then
/// hourly (every worker of a node may sweep the shared cache: each entry is checked under its
/// lock). Aborted when the returned guard drops.
pub(crate) fn spawn_image_sweep(
    cache: PathBuf,
    retention: std::time::Duration,
) -> Option<AbortOnDrop> {
    if retention.is_zero() {
        return None;
    }
    let task = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(120)).await;
        loop {
            let (c, r) = (cache.clone(), retention);
            match tokio::task::spawn_blocking(move || ate_image::sweep_unused(&c, r)).await {
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
