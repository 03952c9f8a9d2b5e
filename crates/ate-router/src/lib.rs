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
//! [`access_log`] (the optional JSON access log), [`internal`] (the workers' listeners) and
//! [`callers`] (calls between actors: the caller header and the policy).
//!
//! Every request has an id (`x-request-id`: the client's if acceptable, else a new one), which
//! reaches the actor, comes back on the response, is a field of the request's tracing span and
//! goes to the api as gRPC metadata on ResumeActor.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod access_log;
pub mod actor_ref;
pub mod api;
pub mod auth;
pub mod body;
pub mod cache;
pub mod callers;
pub mod config;
pub mod drain;
pub mod error;
pub mod handoff;
pub mod internal;
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
pub use crate::config::{PreviewFeatures, RouterConfig, RouterMode, Tuning};
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
    #[error(
        "--tls-listen needs a certificate: --ingress-tls-cert/--ingress-tls-key, or the router's own --tls-cert, --tls-key, --tls-ca"
    )]
    TlsListenWithoutCert,
    #[error("ingress authentication: {0}")]
    IngressAuth(String),
    #[error("ingress JWT: {0}")]
    Jwt(#[from] ate_jwt::JwtError),
    #[error(
        "--internal-listen needs the router's own certificate (--tls-cert, --tls-key, --tls-ca): workers are admitted by their client certificates"
    )]
    InternalListenWithoutTls,
    #[error("--internal-socket {path}: {source}")]
    InternalSocket {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
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
    /// `--ingress-auth-mode` and its settings.
    auth: Arc<auth::IngressAuth>,
    proxy: Arc<Proxy>,
    resolver: Arc<Resolver>,
    tunnels: Arc<Tunnels>,
    stats: Arc<Stats>,
    /// A pre-bound `--internal-listen` listener (tests bind port 0).
    internal_tcp: Option<TcpListener>,
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
        let auth = Arc::new(ingress_auth(&config)?);
        let stats = Arc::new(Stats::default());
        let t = &config.tuning;
        let api_for_callers = api.clone();
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
                auth: auth.clone(),
                // Same atespace, and across atespaces as the callee's allow list says.
                callers: Arc::new(callers::AllowLists::new(api_for_callers)),
                hibernate: proxy::HibernateLimits {
                    max: config.hibernate_websockets_max,
                    per_actor: config.hibernate_websockets_per_actor,
                },
            },
            stats.clone(),
        );
        Ok(Self {
            config,
            tls,
            auth,
            proxy,
            resolver,
            tunnels,
            stats,
            internal_tcp: None,
        })
    }

    /// Serves `--internal-listen` on this pre-bound listener instead of binding its address.
    pub fn with_internal_listener(mut self, listener: TcpListener) -> Self {
        self.internal_tcp = Some(listener);
        self
    }

    /// The internal listeners the flags ask for (see [`internal`]), bound now.
    async fn internal_listeners(&mut self) -> Result<internal::InternalListeners, RouterError> {
        let mut listeners = internal::InternalListeners::default();
        if let Some(path) = &self.config.internal_socket {
            let unix =
                internal::bind_socket(path).map_err(|source| RouterError::InternalSocket {
                    path: path.clone(),
                    source,
                })?;
            tracing::info!(socket = %path.display(), "internal socket serving workers' actor calls");
            listeners.unix = Some(unix);
        }
        if let Some(addr) = self.config.internal_listen {
            let source = self
                .tls
                .clone()
                .ok_or(RouterError::InternalListenWithoutTls)?;
            let tcp = match self.internal_tcp.take() {
                Some(listener) => listener,
                None => TcpListener::bind(addr)
                    .await
                    .map_err(|source| RouterError::Bind { addr, source })?,
            };
            let incoming = internal::tls_listener(&source, tcp)?;
            tracing::info!(listen = %incoming.local_addr(), "internal TLS listener serving workers' actor calls");
            listeners.tls = Some(incoming);
        }
        Ok(listeners)
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

    /// The `--tls-listen` listener: the ingress certificate (`--ingress-tls-cert`, else the
    /// router's own), ALPN h2 + http/1.1, and with `--ingress-allowed-spiffe-ids` a client
    /// certificate on that list required in the handshake (optional in jwt mode, where a token
    /// stands in for it). Returns the listener and whether an allow-list applies.
    async fn tls_ingress(
        &self,
        bound: Option<TcpListener>,
    ) -> Result<Option<(ate_tls::TlsIncoming, bool)>, RouterError> {
        let Some(addr) = self.config.tls_listen else {
            return Ok(None);
        };
        let source = self.ingress_cert()?;
        let allowed = match &self.config.ingress_allowed_spiffe_ids {
            Some(list) => Some(ate_tls::AllowList::parse_list(list)?),
            None => None,
        };
        let client_auth = match (allowed.clone(), self.auth.mode()) {
            (None, _) => ate_tls::ClientAuth::None,
            (Some(allowed), auth::IngressAuthMode::Jwt) => {
                ate_tls::ClientAuth::Optional { allowed }
            }
            (Some(allowed), _) => ate_tls::ClientAuth::Required { allowed },
        };
        let mut server = ate_tls::server_config(&source, client_auth)?;
        ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2, ate_tls::Alpn::Http11]);
        let listener = match bound {
            Some(listener) => listener,
            None => TcpListener::bind(addr)
                .await
                .map_err(|source| RouterError::Bind { addr, source })?,
        };
        let incoming = ate_tls::TlsIncoming::new(listener, Arc::new(server))
            .map_err(|source| RouterError::Bind { addr, source })?;
        tracing::info!(
            listen = %incoming.local_addr(),
            auth = self.auth.mode().as_str(),
            allowed = ?self.config.ingress_allowed_spiffe_ids,
            "TLS ingress serving: {}",
            self.auth.describe()
        );
        Ok(Some((incoming, allowed.is_some())))
    }

    /// The certificate of the TLS ingress listener, and the CA its clients must chain to.
    fn ingress_cert(&self) -> Result<ate_tls::CertSource, RouterError> {
        let c = &self.config;
        if c.ingress_tls_cert.is_none() && c.ingress_client_ca.is_none() {
            return self.tls.clone().ok_or(RouterError::TlsListenWithoutCert);
        }
        let (Some(cert), Some(key)) = (
            c.ingress_tls_cert
                .clone()
                .or_else(|| c.tls.tls_cert.clone()),
            c.ingress_tls_key.clone().or_else(|| c.tls.tls_key.clone()),
        ) else {
            return Err(RouterError::TlsListenWithoutCert);
        };
        let ca = match c.ingress_client_ca.clone().or_else(|| c.tls.tls_ca.clone()) {
            Some(ca) => ca,
            // No client certificates are asked for, so the roots are never used; the server's
            // own chain stands in for them.
            None if c.ingress_allowed_spiffe_ids.is_none() => cert.clone(),
            None => {
                return Err(RouterError::IngressAuth(
                    "--ingress-allowed-spiffe-ids needs the CA client certificates chain to: --ingress-client-ca or --tls-ca".into(),
                ));
            }
        };
        let files = ate_tls::PemFiles { cert, key, ca };
        let every = c
            .tls
            .tls_reload_interval
            .unwrap_or(ate_tls::DEFAULT_FILE_POLL);
        Ok(ate_tls::CertSource::from_files(files, every)?)
    }

    /// Serves on pre-bound listeners until `shutdown`, then drains (see [`Ingress::run`]).
    /// `--tls-listen`, if set, is bound here.
    pub async fn serve(
        self,
        listener: TcpListener,
        metrics_listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RouterError> {
        self.serve_with_tls(listener, None, metrics_listener, shutdown)
            .await
    }

    /// Like [`Router::serve`], with the `--tls-listen` listener pre-bound too (tests bind port
    /// 0); `tls_listener` is used only when `--tls-listen` is set.
    pub async fn serve_with_tls(
        mut self,
        listener: TcpListener,
        tls_listener: Option<TcpListener>,
        metrics_listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RouterError> {
        let t = &self.config.tuning;
        let listener_cfg = ListenerConfig {
            header_read_timeout: t.header_read_timeout,
            max_header_bytes: t.max_header_bytes,
            drain_delay: self.config.drain_delay,
        };
        let (tls_ingress, tls_allow_list) = match self.tls_ingress(tls_listener).await? {
            Some((incoming, allow_list)) => (Some(incoming), allow_list),
            None => (None, false),
        };
        let internal = self.internal_listeners().await?;
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
            auth = self.auth.mode().as_str(),
            "router serving: {}",
            self.auth.describe()
        );
        let drain_flag = draining.clone();
        let shutdown = async move {
            shutdown.await;
            drain_flag.store(true, std::sync::atomic::Ordering::Relaxed);
        };
        Ingress::new(self.proxy.clone(), &listener_cfg)
            .run(
                listener,
                tls_ingress,
                tls_allow_list,
                internal,
                shutdown,
                listener_cfg.drain_delay,
            )
            .await;
        let _ = stop_tx.send(true);
        let _ = ops.await;
        let _ = reaper.await;
        Ok(())
    }
}

/// The ingress policy the flags ask for (see [`auth`]); contradictory or incomplete flags are an
/// error before anything binds.
fn ingress_auth(c: &RouterConfig) -> Result<auth::IngressAuth, RouterError> {
    use auth::IngressAuthMode as Mode;
    let bad = |m: &str| Err(RouterError::IngressAuth(m.to_string()));
    let allow = c.ingress_allowed_spiffe_ids.is_some();
    let jwt_flags = [
        c.ingress_jwt_issuer.is_some(),
        c.ingress_jwt_audience.is_some(),
        c.ingress_jwt_jwks_file.is_some(),
    ];
    let mode = c
        .ingress_auth_mode
        .unwrap_or(if allow { Mode::Mtls } else { Mode::None });
    if mode != Mode::Jwt && jwt_flags.iter().any(|f| *f) {
        return bad(
            "--ingress-jwt-issuer, --ingress-jwt-audience and --ingress-jwt-jwks-file need --ingress-auth-mode=jwt",
        );
    }
    if mode != Mode::None && c.tls_listen.is_none() {
        return bad(
            "--ingress-auth-mode=mtls and jwt need --tls-listen (credentials never travel in plaintext)",
        );
    }
    match mode {
        Mode::None if allow => bad(
            "--ingress-allowed-spiffe-ids needs --ingress-auth-mode=mtls (the default with it) or jwt",
        ),
        Mode::None => Ok(auth::IngressAuth::none()),
        Mode::Mtls if !allow => bad("--ingress-auth-mode=mtls needs --ingress-allowed-spiffe-ids"),
        Mode::Mtls => Ok(auth::IngressAuth::mtls()),
        Mode::Jwt => {
            let (Some(issuer), Some(audience), Some(jwks_file)) = (
                c.ingress_jwt_issuer.clone(),
                c.ingress_jwt_audience.clone(),
                c.ingress_jwt_jwks_file.clone(),
            ) else {
                return bad(
                    "--ingress-auth-mode=jwt needs --ingress-jwt-issuer, --ingress-jwt-audience and --ingress-jwt-jwks-file",
                );
            };
            if issuer.is_empty() || audience.is_empty() {
                return bad("--ingress-jwt-issuer and --ingress-jwt-audience must not be empty");
            }
            let verifier = ate_jwt::JwtVerifier::new(ate_jwt::JwtConfig {
                issuer,
                audience,
                jwks_file,
            })?;
            Ok(auth::IngressAuth::jwt(verifier, allow))
        }
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
