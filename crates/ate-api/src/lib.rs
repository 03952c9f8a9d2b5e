//! The control plane (`ate api`): gRPC services over the [`ate_store::Store`], the actor
//! workflows, the scheduler and the fleet registry.
//!
//! Architecture invariant: the api never talks to a worker directly, only to node agents
//! (NodeService), and it never holds state outside the store that it cannot rebuild from the
//! store (the fleet view is a cache).
//!
//! Architecture invariant: wire types (`ate_proto::v1`, `tonic::Status`) stay at the gRPC edge —
//! `services/`, `convert.rs`, `node.rs` and the servers' plumbing; the workflows below them speak
//! store records, core types and [`error::WorkflowError`].

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod authz;
pub mod convert;
pub mod error;
pub mod events;
pub mod join;
/// Bearer-token verification (the `ate-jwt` crate, shared with the router's JWT mode).
pub use ate_jwt as jwt;
pub mod lease;
pub mod metrics;
pub mod node;
pub mod node_calls;
pub mod scheduler;
pub mod server;
pub mod services;
pub mod workflows;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ate_proto::v1::actor_service_server::ActorServiceServer;
use ate_proto::v1::alarm_service_server::AlarmServiceServer;
use ate_proto::v1::atespace_service_server::AtespaceServiceServer;
use ate_proto::v1::fleet_service_server::FleetServiceServer;
use ate_proto::v1::identity_service_server::IdentityServiceServer;
use ate_proto::v1::join_service_server::JoinServiceServer;
use ate_proto::v1::tag_service_server::TagServiceServer;
use ate_proto::v1::template_service_server::TemplateServiceServer;
use tokio::net::TcpListener;

pub use server::{AuthMode, RunError, ServerConfig, run};
pub use workflows::{Api, FaultPoint};

#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Lease lifetime; renewed at a third of it while a workflow runs.
    pub lease_ttl: Duration,
    /// A worker without a heartbeat for this long is marked GONE.
    pub heartbeat_timeout: Duration,
    /// Longest wait for a node's Run/Restore/Checkpoint.
    pub node_call_timeout: Duration,
    /// Age after which the scheduler re-reads the fleet.
    pub fleet_max_age: Duration,
    /// Names this api process in lease holders.
    pub instance_id: String,
    /// mTLS to node agents (the api's identity; the node's pinned). None: plaintext.
    pub node_tls: Option<Arc<ate_tls::rustls::ClientConfig>>,
    /// The only api on its store: a heartbeat that cannot be recorded because the store is down
    /// is still acknowledged (no other replica can release the worker meanwhile).
    pub sole_replica: bool,
    /// Signs actors' identity tokens (`--identity-key`); None: IssueActorToken is refused and
    /// no JWKS is published.
    pub identity: Option<Arc<ate_jwt::issuer::TokenIssuer>>,
    /// Slots used as a cache: when no worker has room, a running actor with nothing open for
    /// at least this long is suspended (least recently used first) to make room. Zero: never.
    pub evict_idle_after: Duration,
    /// How long actor events are kept (`ate get events`).
    pub event_retention: Duration,
}

/// [`ApiConfig::event_retention`] by default: a day of history, enough to look into last
/// night's trouble, bounded so the table stays small (kubectl's events live an hour).
pub const DEFAULT_EVENT_RETENTION: Duration = Duration::from_secs(24 * 3600);

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            // An api that dies mid-workflow blocks its actors until their leases expire: keep
            // that within the worker lease (renewed every third of it while a workflow runs).
            lease_ttl: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(10),
            node_call_timeout: Duration::from_secs(120),
            fleet_max_age: Duration::from_millis(250),
            instance_id: format!("api-{}", std::process::id()),
            node_tls: None,
            sole_replica: false,
            identity: None,
            evict_idle_after: Duration::ZERO,
            event_retention: DEFAULT_EVENT_RETENTION,
        }
    }
}

/// The value we recommend for [`ApiConfig::evict_idle_after`] (`--evict-idle-after 2s`; off by
/// default, see docs/capacity.md "Slots as a cache" for why). Why 2 s: longer than the gaps
/// inside one burst of an agent's work (a tool-call chain, a page's requests), short enough
/// that a newcomer finds room within its 5 s parking budget; the evicted actor keeps its
/// memory (a frozen copy where the worker keeps one), so evicting too early costs it one
/// resume, never state.
pub const RECOMMENDED_EVICT_IDLE_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("health server failed: {0}")]
    Http(std::io::Error),
}

/// How the gRPC listener authenticates and authorizes callers.
#[derive(Debug, Clone)]
pub struct TlsServe {
    /// Server config with `ClientAuth::Required` (any ID of the trust domain), or
    /// `ClientAuth::Optional` when `authz` accepts bearer tokens (`--auth-mode=jwt`); ALPN is
    /// set to h2.
    pub server: Arc<ate_tls::rustls::ServerConfig>,
    /// Identity → role policy (and the bearer-token verifier in jwt mode).
    pub authz: authz::Authz,
    /// The CA bundle peers trust (PEM, the `--tls-ca` file): what a joining machine fetches.
    pub trust_bundle: String,
    /// Signs joining nodes' certificates (`--ca-dir`); the server config must then use
    /// `ClientAuth::Optional` so a machine without a certificate can reach JoinService.
    pub join_signer: Option<Arc<join::Signer>>,
}

/// Serves the gRPC services on `grpc` (plaintext, every caller admin) and `/healthz` +
/// `/metrics` on `http` until `shutdown` resolves; runs the worker-expiry loop alongside.
pub async fn serve(
    api: Arc<Api>,
    grpc: TcpListener,
    http: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with(api, grpc, http, None, shutdown).await
}

/// The JWKS (and, for an http(s) issuer, the OpenID discovery document) that verify actors'
/// identity tokens, served on the api's HTTP listener.
fn identity_documents(
    issuer: Option<&Arc<ate_jwt::issuer::TokenIssuer>>,
) -> Arc<[(String, bytes::Bytes)]> {
    let Some(issuer) = issuer else {
        return Arc::new([]);
    };
    let mut documents = vec![(
        "/.well-known/jwks.json".to_string(),
        bytes::Bytes::from(issuer.jwks_json().to_string()),
    )];
    if let Some(discovery) = issuer.openid_configuration() {
        documents.push((
            "/.well-known/openid-configuration".to_string(),
            bytes::Bytes::from(discovery),
        ));
    }
    documents.into()
}

/// How often the api looks for workers whose lease ran out.
const EXPIRY_TICK: Duration = Duration::from_millis(500);

/// Like [`serve`], with mTLS and roles on the gRPC listener when `tls` is given.
pub async fn serve_with(
    api: Arc<Api>,
    grpc: TcpListener,
    http: Option<TcpListener>,
    tls: Option<TlsServe>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    metrics::install();
    let authz = match &tls {
        Some(t) => t.authz.clone(),
        // Plaintext: no identities, every caller is admin (see `authz`).
        None => authz::Authz::new(ate_tls::DEFAULT_TRUST_DOMAIN, "")
            .map_err(|e| ServeError::Tls(e.to_string()))?,
    };
    let authz = Arc::new(authz);
    let join = join::Join {
        store: api.store.clone(),
        authz: authz.clone(),
        signer: tls.as_ref().and_then(|t| t.join_signer.clone()),
        trust_bundle: tls
            .as_ref()
            .map(|t| t.trust_bundle.clone())
            .unwrap_or_default(),
        trust_domain: authz.trust_domain().to_string(),
    };
    let services = services::Services {
        api: api.clone(),
        authz,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let expiry = {
        let api = api.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPIRY_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        // A tick far later than due means this process did not run (stopped,
                        // swapped out, starved): heartbeats sent meanwhile went unheard, so
                        // expiry starts counting again.
                        if last.elapsed() > EXPIRY_TICK * 4 {
                            tracing::warn!(late_ms = last.elapsed().as_millis() as u64, "the api did not run for a while; worker expiry starts counting again");
                            api.store_outage_seen();
                        }
                        last = tokio::time::Instant::now();
                        if let Err(e) = api.expire_workers().await {
                            tracing::warn!(error = %e, "worker expiry failed");
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        })
    };

    tokio::spawn(events::retention(
        api.store.clone(),
        api.event_retention(),
        stop_rx.clone(),
    ));

    // Each scrape (and each OTLP metrics export) re-reads the fleet when the view is older than
    // its max age, so the fleet gauges are current even while no resume runs.
    let fleet_api = Arc::downgrade(&api);
    ate_telemetry::on_refresh(move || {
        let api = fleet_api.upgrade()?;
        Some(Box::pin(async move {
            let _ = api.fleet.workers().await;
        }))
    });
    let http_task = http.map(|listener| {
        let mut stop = stop_rx.clone();
        let endpoint = ate_telemetry::Endpoint {
            health: None,
            before_scrape: None,
            documents: identity_documents(api.identity_issuer()),
        };
        tokio::spawn(async move {
            ate_telemetry::serve_with(listener, endpoint, async move {
                let _ = stop.changed().await;
            })
            .await;
            Ok::<(), std::io::Error>(())
        })
    });

    let mut stop = stop_rx.clone();
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(ActorServiceServer::new(services.clone()))
        .add_service(AlarmServiceServer::new(services.clone()))
        .add_service(AtespaceServiceServer::new(services.clone()))
        .add_service(TemplateServiceServer::new(services.clone()))
        .add_service(TagServiceServer::new(services.clone()))
        .add_service(IdentityServiceServer::new(services.clone()))
        .add_service(FleetServiceServer::new(services))
        .add_service(JoinServiceServer::new(join));
    let stopped = async move {
        let _ = stop.changed().await;
    };
    let result = match tls {
        Some(t) => {
            let mut server = (*t.server).clone();
            ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2]);
            let incoming = ate_tls::TlsIncoming::new(grpc, Arc::new(server))
                .map_err(|e| ServeError::Tls(e.to_string()))?;
            router.serve_with_incoming_shutdown(incoming, stopped).await
        }
        None => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc);
            router.serve_with_incoming_shutdown(incoming, stopped).await
        }
    };
    expiry.abort();
    if let Some(task) = http_task
        && let Ok(Err(e)) = task.await
    {
        return Err(ServeError::Http(e));
    }
    result.map_err(ServeError::from)
}
