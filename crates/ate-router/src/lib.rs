//! atenet-router, the ingress of Agent Substrate (crates/ate-router/README.md: the request path and
//! request parking, Envoy dataplane behaviour plus the AgentGateway-style assignment cache).
//!
//! A request names its actor in `ate-target-actor`; the router finds the actor's worker (cache,
//! or one shared ResumeActor per actor, parking while no worker has room) and forwards the request
//! through a CONNECT tunnel to the worker's atunnel (docs/tunnel-protocol.md).
//!
//! Pieces, each tested on its own: [`actor_ref`] (header), [`cache`] (assignments),
//! [`single_flight`], [`parking`] (limit, places, backoff), [`error`] (status mapping),
//! [`resolve`] (the resolution state machine), [`tunnel`] (atunnel client), [`proxy`] (one
//! request), [`drain`] (relays the drain waits for), [`server`] (listeners, drain),
//! [`access_log`] (the optional JSON access log).
//!
//! Every request has an id (`x-request-id`: the client's if acceptable, else a new one), which
//! reaches the actor, comes back on the response, is a field of the request's tracing span and
//! goes to the api as gRPC metadata on ResumeActor.

pub mod access_log;
pub mod actor_ref;
pub mod api;
pub mod body;
pub mod cache;
pub mod config;
pub mod drain;
pub mod error;
pub mod handoff;
pub mod metrics;
pub mod parking;
pub mod proxy;
pub mod resolve;
pub mod server;
pub mod single_flight;
pub mod tunnel;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::net::TcpListener;

pub use crate::api::{GrpcResume, Resume, Resumed};
pub use crate::config::{RouterConfig, Tuning};
pub use crate::metrics::Stats;

use crate::access_log::AccessLog;
use crate::cache::AssignmentCache;
use crate::drain::Drain;
use crate::parking::ParkingLot;
use crate::proxy::{Proxy, ProxyConfig};
use crate::resolve::{ResolveConfig, Resolver};
use crate::server::{Ingress, ListenerConfig};
use crate::tunnel::{TunnelConfig, Tunnels};

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("api address {api:?}: {source}")]
    Api {
        api: String,
        source: ate_tls::TlsError,
    },
    #[error("TLS: {0}")]
    Tls(#[from] ate_tls::TlsError),
    #[error("--tls-listen needs the router's certificate (--tls-cert, --tls-key, --tls-ca)")]
    TlsListenWithoutCert,
    #[error("--access-log {target}: {source}")]
    AccessLog {
        target: String,
        source: std::io::Error,
    },
}

/// A router instance: its parts, shared by the listeners.
pub struct Router {
    config: RouterConfig,
    /// The router's identity (mTLS to the api and atunnel; the `--tls-listen` certificate).
    tls: Option<ate_tls::CertSource>,
    proxy: Arc<Proxy>,
    resolver: Arc<Resolver>,
    tunnels: Arc<Tunnels>,
    stats: Arc<Stats>,
}

impl Router {
    /// A router that asks the api at `config.api` (connected lazily). Call inside a tokio runtime.
    pub fn new(config: RouterConfig) -> Result<Self, RouterError> {
        let source = config.tls.load("router")?;
        let api_tls = match &source {
            Some(src) => {
                let api_id = ate_tls::SpiffeId::api(config.tls.trust_domain())?;
                Some(Arc::new(ate_tls::client_config(
                    src,
                    ate_tls::ServerCheck::Pin(api_id),
                )?))
            }
            None => None,
        };
        let api =
            GrpcResume::with_tls(&config.api, api_tls).map_err(|source| RouterError::Api {
                api: config.api.clone(),
                source,
            })?;
        Self::with_resume_tls(config, Arc::new(api), source)
    }

    /// A router over any [`Resume`] implementation.
    pub fn with_resume(config: RouterConfig, api: Arc<dyn Resume>) -> Result<Self, RouterError> {
        Self::with_resume_tls(config, api, None)
    }

    /// Like `with_resume`; with `tls`, tunnels to atunnel use mTLS with the router's identity and
    /// pin each worker's SPIFFE ID from its assignment. Fails only when `--access-log` names a
    /// file that cannot be opened.
    pub fn with_resume_tls(
        config: RouterConfig,
        api: Arc<dyn Resume>,
        tls: Option<ate_tls::CertSource>,
    ) -> Result<Self, RouterError> {
        let access_log = match &config.access_log {
            Some(target) => {
                Some(
                    AccessLog::open(target).map_err(|source| RouterError::AccessLog {
                        target: target.clone(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let stats = Arc::new(Stats::default());
        let t = &config.tuning;
        let resolver = Resolver::new(
            AssignmentCache::new(config.assignment_cache_ttl, t.cache_capacity),
            api,
            ParkingLot::new(config.parked_request_max, stats.clone()),
            ResolveConfig {
                budget: config.parked_request_budget,
                decision_grace: t.decision_grace,
                unparked_abort_window: t.unparked_abort_window,
                retry_initial: t.retry_initial,
            },
            stats.clone(),
        );
        let tunnels = Tunnels::new(
            TunnelConfig {
                idle_per_actor: config
                    .tunnel_idle_per_actor
                    .unwrap_or(t.tunnel_idle_per_actor),
                idle_timeout: t.tunnel_idle_timeout,
                connect_timeout: t.worker_connect_timeout,
                local_tunnels: config.local_tunnels.clone(),
            },
            tls.clone(),
            stats.clone(),
        );
        let proxy = Proxy::new(
            resolver.clone(),
            tunnels.clone(),
            Drain::new(),
            ProxyConfig {
                max_uri_len: t.max_uri_len,
                header_read_timeout: t.header_read_timeout,
                access_log,
            },
            stats.clone(),
        );
        Ok(Self {
            config,
            tls,
            proxy,
            resolver,
            tunnels,
            stats,
        })
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// A read-only view of the router's state that outlives [`Router::serve`]'s move.
    pub fn probe(&self) -> Probe {
        Probe {
            resolver: self.resolver.clone(),
            tunnels: self.tunnels.clone(),
            drain: self.proxy.drain().clone(),
        }
    }

    /// The `--tls-listen` listener: the router's certificate, ALPN h2 + http/1.1, and with
    /// `--ingress-allowed-spiffe-ids` a client certificate on that list required in the handshake.
    async fn tls_ingress(&self) -> Result<Option<ate_tls::TlsIncoming>, RouterError> {
        let Some(addr) = self.config.tls_listen else {
            return Ok(None);
        };
        let source = self.tls.as_ref().ok_or(RouterError::TlsListenWithoutCert)?;
        let client_auth = match &self.config.ingress_allowed_spiffe_ids {
            Some(list) => ate_tls::ClientAuth::Required {
                allowed: ate_tls::AllowList::parse_list(list)?,
            },
            None => ate_tls::ClientAuth::None,
        };
        let mut server = ate_tls::server_config(source, client_auth)?;
        ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2, ate_tls::Alpn::Http11]);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| RouterError::Bind { addr, source })?;
        let incoming = ate_tls::TlsIncoming::new(listener, Arc::new(server))
            .map_err(|source| RouterError::Bind { addr, source })?;
        tracing::info!(listen = %incoming.local_addr(), allowed = ?self.config.ingress_allowed_spiffe_ids, "TLS ingress serving");
        Ok(Some(incoming))
    }

    /// Serves on pre-bound listeners until `shutdown`, then drains (see [`Ingress::run`]).
    pub async fn serve(
        self,
        listener: TcpListener,
        metrics_listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RouterError> {
        let t = &self.config.tuning;
        let listener_cfg = ListenerConfig {
            header_read_timeout: t.header_read_timeout,
            max_header_bytes: t.max_header_bytes,
            drain_delay: self.config.drain_delay,
        };
        let tls_ingress = self.tls_ingress().await?;
        let draining = Arc::new(AtomicBool::new(false));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        crate::metrics::export_tunnel_stats(&self.stats);
        let ops = tokio::spawn(server::serve_operations(
            metrics_listener,
            draining.clone(),
            stop_rx.clone(),
        ));
        let tunnels = self.tunnels.clone();
        let mut reaper_stop = stop_rx;
        let reaper = tokio::spawn(async move {
            let period = (tunnels.idle_timeout() / 2).max(std::time::Duration::from_millis(100));
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = reaper_stop.wait_for(|s| *s) => return,
                    _ = tick.tick() => tunnels.reap_idle(),
                }
            }
        });
        tracing::info!(
            listen = ?listener.local_addr().ok(),
            budget = ?self.config.parked_request_budget,
            max = self.config.parked_request_max,
            ttl = ?self.config.assignment_cache_ttl,
            access_log = ?self.config.access_log,
            "router serving"
        );
        let drain_flag = draining.clone();
        let shutdown = async move {
            shutdown.await;
            drain_flag.store(true, std::sync::atomic::Ordering::Relaxed);
        };
        Ingress::new(self.proxy.clone(), &listener_cfg)
            .run(listener, tls_ingress, shutdown, listener_cfg.drain_delay)
            .await;
        let _ = stop_tx.send(true);
        let _ = ops.await;
        let _ = reaper.await;
        Ok(())
    }
}

/// Sizes of the router's bounded state, for tests and debugging.
#[derive(Clone)]
pub struct Probe {
    resolver: Arc<Resolver>,
    tunnels: Arc<Tunnels>,
    drain: Arc<Drain>,
}

impl Probe {
    /// Entries in the assignment cache.
    pub fn cached_assignments(&self) -> usize {
        self.resolver.cache.len()
    }

    /// Resolutions in flight.
    pub fn resolutions_in_flight(&self) -> usize {
        self.resolver.in_flight()
    }

    /// Idle pooled tunnels.
    pub fn idle_tunnels(&self) -> usize {
        self.tunnels.idle_count()
    }

    /// Pooled gRPC connections (one tunnel each).
    pub fn grpc_tunnels(&self) -> usize {
        self.tunnels.grpc_count()
    }

    /// Open relays (WebSocket over HTTP/1.1 or HTTP/2, client CONNECT tunnels).
    pub fn open_relays(&self) -> usize {
        self.drain.open()
    }

    /// Where the router is: serving, draining, or past the drain deadline.
    pub fn phase(&self) -> drain::Phase {
        self.drain.phase()
    }
}

/// Serves `config` on pre-bound listeners (tests bind port 0) until `shutdown`, then drains.
pub async fn serve(
    config: RouterConfig,
    listener: TcpListener,
    metrics_listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RouterError> {
    Router::new(config)?
        .serve(listener, metrics_listener, shutdown)
        .await
}

/// Binds `--listen` and `--metrics-listen` and serves until `shutdown` (the binary passes
/// [`ate_tls::process::shutdown_signal`]), then drains for at most `--drain-delay`.
pub async fn run(
    config: RouterConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RouterError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| RouterError::Bind {
            addr: config.listen,
            source,
        })?;
    let metrics_listener = TcpListener::bind(config.metrics_listen)
        .await
        .map_err(|source| RouterError::Bind {
            addr: config.metrics_listen,
            source,
        })?;
    serve(config, listener, metrics_listener, shutdown).await
}
