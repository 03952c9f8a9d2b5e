//! Router side of the atunnel protocol (docs/tunnel-protocol.md): one shared HTTP/2 connection per
//! worker (h2c prior knowledge), one `CONNECT` stream per tunnel, HTTP/1.1 (or HTTP/2 for gRPC)
//! spoken to the actor over the stream, a small pool of idle HTTP/1.1 tunnels per (actor, port)
//! for keep-alive reuse, and one long-lived HTTP/2 connection per (actor, port) inside one tunnel
//! that carries every gRPC request to that port. Here: the worker connections, CONNECT and
//! probe; `h1` the HTTP/1.1 pool and the same-machine handoff; `grpc` the gRPC connections.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ate_core::{ACTIVATION_HEADER, REQUEST_ID_HEADER, TARGET_ACTOR_HEADER, TARGET_PORT_HEADER};
use ate_tls::rustls::ClientConfig;
use ate_tls::rustls::pki_types::ServerName;
use ate_tls::tokio_rustls::TlsConnector;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::actor_ref::ActorKey;
use crate::cache::Route;
use crate::metrics::Stats;

mod grpc;
mod h1;

use grpc::GrpcSlot;
pub use grpc::InUse;
use h1::IdleH1;
pub use h1::{H1Conn, PoolReturn};

/// The tunnel protocol's headers (defined in [`ate_core::tunnel`]): atunnel's 421 for an actor
/// it does not serve, its 502 mark for a closed port, and the probe CONNECT.
pub use ate_core::tunnel::{
    PORT_CLOSED as PORT_CLOSED_HEADER, PROBE as PROBE_HEADER, STALE as STALE_HEADER,
};

/// What a failed tunnel means for the request: resolve again, tell the client nothing listens on
/// the port, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The route is wrong (stale, or its worker does not answer): resolve again and retry.
    RouteBad,
    /// atunnel reached the actor's netns but nothing listens on the port.
    PortClosed,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("connect to atunnel {worker}: {source}")]
    Connect {
        worker: Arc<str>,
        source: std::io::Error,
    },
    #[error("connect to atunnel {worker}: timed out")]
    ConnectTimeout { worker: Arc<str> },
    #[error("HTTP/2 handshake with atunnel {worker}: {source}")]
    Handshake {
        worker: Arc<str>,
        source: hyper::Error,
    },
    #[error("TLS to atunnel {worker}: {source}")]
    Tls {
        worker: Arc<str>,
        source: std::io::Error,
    },
    #[error("worker {worker} has no usable SPIFFE ID in its assignment ({identity:?}): {reason}")]
    Identity {
        worker: Arc<str>,
        identity: String,
        reason: String,
    },
    #[error("CONNECT stream to atunnel: {0}")]
    Stream(hyper::Error),
    /// 421 + `x-ate-assignment-stale: true`: the actor is not active on that worker.
    #[error("stale assignment: the actor is not served by that worker")]
    Stale,
    /// 502 + `x-ate-port-closed: true`: the actor is active but nothing listens on the port.
    #[error("nothing listens on that port in the actor")]
    PortClosed,
    #[error("atunnel refused the tunnel with {0}")]
    Refused(StatusCode),
    #[error("tunnel upgrade: {0}")]
    Upgrade(hyper::Error),
    #[error("HTTP to the actor: {0}")]
    Actor(hyper::Error),
    /// The gRPC tunnel this request waited for could not be opened (by the request that tried).
    #[error("{reason}")]
    Shared { reason: String, kind: FailureKind },
}

impl TunnelError {
    pub fn kind(&self) -> FailureKind {
        match self {
            TunnelError::Stale
            | TunnelError::Connect { .. }
            | TunnelError::ConnectTimeout { .. }
            | TunnelError::Handshake { .. }
            | TunnelError::Tls { .. } => FailureKind::RouteBad,
            TunnelError::PortClosed => FailureKind::PortClosed,
            TunnelError::Shared { kind, .. } => *kind,
            _ => FailureKind::Other,
        }
    }

    /// Worth resolving again and retrying when the request was not written: the route is bad,
    /// or the way to the actor broke before the request left (the worker's connection closed
    /// as its process died or restarted, a refused or failed tunnel). Not when the actor itself
    /// has nothing on the port, nor for a worker identity the router cannot use.
    pub fn retry_unsent(&self) -> bool {
        match self {
            TunnelError::PortClosed | TunnelError::Identity { .. } => false,
            TunnelError::Shared { kind, .. } => *kind != FailureKind::PortClosed,
            _ => true,
        }
    }
}

/// A failed send; `request` is handed back when it was not written, so it can be retried.
#[derive(Debug)]
pub struct SendFailed<R> {
    pub error: TunnelError,
    pub request: Option<R>,
}

#[derive(Debug, Clone)]
pub struct TunnelConfig {
    pub idle_per_actor: usize,
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    /// The handoff sockets of the workers on this machine (`--local-tunnels`).
    pub local_tunnels: Option<std::path::PathBuf>,
}

type WorkerSlot = Arc<tokio::sync::Mutex<Option<http2::SendRequest<Empty<Bytes>>>>>;

/// mTLS to atunnel: the router's identity, and one client config per pinned worker ID.
struct TunnelTls {
    source: ate_tls::CertSource,
    configs: Mutex<HashMap<String, Arc<ClientConfig>>>,
}

impl TunnelTls {
    /// The client config pinning `identity` (cached per worker ID).
    fn config(&self, route: &Route) -> Result<Arc<ClientConfig>, TunnelError> {
        let identity = &route.worker_identity;
        let mut configs = self.configs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = configs.get(identity) {
            return Ok(c.clone());
        }
        let bad = |reason: String| TunnelError::Identity {
            worker: route.worker.clone(),
            identity: identity.clone(),
            reason,
        };
        let id = ate_tls::SpiffeId::parse(identity).map_err(|e| bad(e.to_string()))?;
        let mut config = ate_tls::client_config(&self.source, ate_tls::ServerCheck::Pin(id))
            .map_err(|e| bad(e.to_string()))?;
        ate_tls::set_client_alpn(&mut config, &[ate_tls::Alpn::H2]);
        let config = Arc::new(config);
        // Worker IDs are few (one per worker); bound the map anyway.
        if configs.len() >= 4096 {
            configs.clear();
        }
        configs.insert(identity.clone(), config.clone());
        Ok(config)
    }
}

pub struct Tunnels {
    workers: Mutex<HashMap<Arc<str>, WorkerSlot>>,
    tls: Option<TunnelTls>,
    idle: Mutex<HashMap<ActorKey, Vec<IdleH1>>>,
    /// gRPC connections per actor, one slot per port.
    grpc: Mutex<HashMap<ActorKey, Vec<(u16, GrpcSlot)>>>,
    cfg: TunnelConfig,
    stats: Arc<Stats>,
}

impl Tunnels {
    /// With `tls`, every atunnel connection is mTLS with the router's identity, pinning the
    /// worker's SPIFFE ID from the assignment.
    pub fn new(
        cfg: TunnelConfig,
        tls: Option<ate_tls::CertSource>,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        Arc::new(Self {
            workers: Mutex::new(HashMap::new()),
            tls: tls.map(|source| TunnelTls {
                source,
                configs: Mutex::new(HashMap::new()),
            }),
            idle: Mutex::new(HashMap::new()),
            grpc: Mutex::new(HashMap::new()),
            cfg,
            stats,
        })
    }

    /// The shared HTTP/2 connection to `worker`, (re)connected when missing or dead. Connecting
    /// holds the worker's slot so that a burst makes one connection, not one each.
    async fn worker(&self, route: &Route) -> Result<http2::SendRequest<Empty<Bytes>>, TunnelError> {
        let worker = &route.worker;
        let slot = {
            let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
            match workers.get(&**worker) {
                Some(slot) => slot.clone(),
                None => workers.entry(worker.clone()).or_default().clone(),
            }
        };
        let mut slot = slot.lock().await;
        if let Some(sender) = slot.as_ref().filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        // Boxed: the TCP connect, TLS and HTTP/2 handshake futures are several KiB, and inline
        // they would be part of every request's future, so every parked request would carry them
        // too (5.7 of the 9.4 KiB the request future was, measured with `size_of`). A connection
        // is made rarely (once per worker), so the allocation costs nothing on the warm path.
        let sender = Box::pin(self.connect_worker(route)).await?;
        *slot = Some(sender.clone());
        Ok(sender)
    }

    /// A new HTTP/2 connection (TCP, TLS with the worker's identity pinned, h2 handshake) to the
    /// route's worker.
    async fn connect_worker(
        &self,
        route: &Route,
    ) -> Result<http2::SendRequest<Empty<Bytes>>, TunnelError> {
        let worker = &route.worker;
        let connect = TcpStream::connect(&**worker);
        let tcp = tokio::time::timeout(self.cfg.connect_timeout, connect)
            .await
            .map_err(|_| TunnelError::ConnectTimeout {
                worker: worker.clone(),
            })?
            .map_err(|source| TunnelError::Connect {
                worker: worker.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let sender = match &self.tls {
            None => h2_handshake(worker, tcp).await?,
            Some(tls) => {
                let config = tls.config(route)?;
                let host = worker
                    .rsplit_once(':')
                    .map_or(&**worker, |(h, _)| h)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let tls_err = |source| TunnelError::Tls {
                    worker: worker.clone(),
                    source,
                };
                let name = ServerName::try_from(host.to_string()).map_err(|e| {
                    tls_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                })?;
                let handshake = TlsConnector::from(config).connect(name, tcp);
                let stream = tokio::time::timeout(self.cfg.connect_timeout, handshake)
                    .await
                    .map_err(|_| TunnelError::ConnectTimeout {
                        worker: worker.clone(),
                    })?
                    .map_err(tls_err)?;
                h2_handshake(worker, stream).await?
            }
        };
        Ok(sender)
    }

    /// Opens one tunnel (a CONNECT stream) to `actor`'s `port` on the route's worker, for the
    /// request with id `request_id` (on the CONNECT with the current span's trace context, so
    /// atunnel's lines and span about it belong to that request).
    pub async fn open(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<Upgraded, TunnelError> {
        self.open_marked(route, actor, port, request_id, false)
            .await
    }

    /// Like [`Tunnels::open`]; with `hibernate`, the CONNECT says the tunnel carries the upstream
    /// leg of a hibernating WebSocket (`ate-websocket-hibernate: 1`): atunnel counts its bytes
    /// as the actor's activity but not the open tunnel itself (docs/websockets.md).
    pub async fn open_marked(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
        hibernate: bool,
    ) -> Result<Upgraded, TunnelError> {
        self.stats.tunnel_connects.fetch_add(1, Ordering::Relaxed);
        // One retry: a shared connection that died since its last use is replaced.
        let mut retried = false;
        loop {
            let mut sender = self.worker(route).await?;
            let mut request = connect_request(actor, port, route.activation)?;
            if hibernate {
                request.headers_mut().insert(
                    ate_core::tunnel::WEBSOCKET_HIBERNATE,
                    HeaderValue::from_static("1"),
                );
            }
            if let Ok(id) = HeaderValue::from_str(request_id)
                && !request_id.is_empty()
            {
                request.headers_mut().insert(REQUEST_ID_HEADER, id);
            }
            ate_telemetry::trace_context::inject_http(request.headers_mut());
            match sender.send_request(request).await {
                Ok(response) => return accept(response).await,
                Err(e) if !retried && sender.is_closed() => {
                    tracing::debug!(error = %e, "atunnel connection was dead; reconnecting");
                    retried = true;
                }
                Err(e) => return Err(TunnelError::Stream(e)),
            }
        }
    }

    /// Asks the route's worker whether it serves `actor` (with the route's activation) right
    /// now, without a tunnel: true on 200, false on 421 stale. Used only to explain a failed
    /// request, over the worker's existing connection when it has one.
    pub async fn probe(&self, route: &Route, actor: &str, port: u16) -> Result<bool, TunnelError> {
        let mut sender = self.worker(route).await?;
        let mut request = connect_request(actor, port, route.activation)?;
        request
            .headers_mut()
            .insert(PROBE_HEADER, HeaderValue::from_static("1"));
        let response = sender
            .send_request(request)
            .await
            .map_err(TunnelError::Stream)?;
        match response.status() {
            StatusCode::OK => Ok(true),
            _ if is_stale(&response) => Ok(false),
            status => Err(TunnelError::Refused(status)),
        }
    }

    /// Forgets pooled connections of `actor` on `worker` (its route there turned out stale or
    /// unreachable); gRPC connections close after their last stream.
    pub fn evict(&self, actor: &str, worker: &Arc<str>) {
        self.evict_idle_h1(actor, worker);
        self.evict_grpc(actor, worker);
    }

    /// Closes idle tunnels older than the idle timeout: an open tunnel counts as activity for
    /// the worker's idle auto-suspend, so idle ones must not linger.
    pub fn reap_idle(&self) {
        self.reap_idle_h1();
        self.reap_grpc();
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        workers.retain(|_, slot| match slot.try_lock() {
            Ok(s) => s.as_ref().is_some_and(|s| !s.is_closed()),
            Err(_) => true,
        });
    }

    pub fn idle_timeout(&self) -> Duration {
        self.cfg.idle_timeout
    }
}

/// The shared HTTP/2 connection over `io` (TCP or TLS) to a worker's atunnel.
async fn h2_handshake<T>(
    worker: &Arc<str>,
    io: T,
) -> Result<http2::SendRequest<Empty<Bytes>>, TunnelError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .handshake(TokioIo::new(io))
        .await
        .map_err(|source| TunnelError::Handshake {
            worker: worker.clone(),
            source,
        })?;
    let name = worker.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(worker = %name, error = %e, "atunnel connection ended");
        }
    });
    Ok(sender)
}

/// The request id a request carries (the router set it before forwarding); empty if none.
pub fn request_id_of<B>(request: &Request<B>) -> &str {
    request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// `CONNECT <name>.<atespace>:<port>` with the routing headers and the activation's fencing token
/// (docs/tunnel-protocol.md).
fn connect_request(
    actor: &str,
    port: u16,
    activation: u64,
) -> Result<Request<Empty<Bytes>>, TunnelError> {
    let (atespace, name) = actor.split_once('/').unwrap_or((actor, ""));
    let authority = format!("{name}.{atespace}:{port}");
    let uri =
        Uri::try_from(authority).map_err(|_| TunnelError::Refused(StatusCode::BAD_REQUEST))?;
    let mut request = Request::new(Empty::new());
    *request.method_mut() = Method::CONNECT;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    headers.insert(
        TARGET_ACTOR_HEADER,
        HeaderValue::from_str(actor).map_err(|_| TunnelError::Refused(StatusCode::BAD_REQUEST))?,
    );
    if port != 80 {
        headers.insert(TARGET_PORT_HEADER, HeaderValue::from(port));
    }
    if activation != 0 {
        headers.insert(ACTIVATION_HEADER, HeaderValue::from(activation));
    }
    Ok(request)
}

/// Whether atunnel's answer carries `header: true`.
fn flagged(response: &Response<Incoming>, header: &str) -> bool {
    response
        .headers()
        .get(header)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// 421 marked stale: the actor is not served by that worker.
fn is_stale(response: &Response<Incoming>) -> bool {
    response.status() == StatusCode::MISDIRECTED_REQUEST && flagged(response, STALE_HEADER)
}

async fn accept(response: Response<Incoming>) -> Result<Upgraded, TunnelError> {
    match response.status() {
        StatusCode::OK => hyper::upgrade::on(response)
            .await
            .map_err(TunnelError::Upgrade),
        _ if is_stale(&response) => Err(TunnelError::Stale),
        StatusCode::BAD_GATEWAY if flagged(&response, PORT_CLOSED_HEADER) => {
            Err(TunnelError::PortClosed)
        }
        status => Err(TunnelError::Refused(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_request_follows_the_protocol() {
        let r = connect_request("team-a/agent-7", 8080, 12).unwrap();
        assert_eq!(r.method(), Method::CONNECT);
        assert_eq!(r.uri().to_string(), "agent-7.team-a:8080");
        assert_eq!(r.headers()[TARGET_ACTOR_HEADER], "team-a/agent-7");
        assert_eq!(r.headers()[TARGET_PORT_HEADER], "8080");
        assert_eq!(r.headers()[ACTIVATION_HEADER], "12");
        let r = connect_request("team-a/agent-7", 80, 0).unwrap();
        assert!(r.headers().get(TARGET_PORT_HEADER).is_none());
        assert!(r.headers().get(ACTIVATION_HEADER).is_none());
    }

    #[test]
    fn an_unsent_request_is_retried_unless_the_actor_has_nothing_on_the_port() {
        let worker: Arc<str> = Arc::from("w-1");
        for retried in [
            TunnelError::Stale,
            TunnelError::ConnectTimeout {
                worker: worker.clone(),
            },
            TunnelError::Refused(StatusCode::SERVICE_UNAVAILABLE),
            TunnelError::Shared {
                reason: "tunnel failed".into(),
                kind: FailureKind::Other,
            },
        ] {
            assert!(retried.retry_unsent(), "{retried}");
        }
        for answered in [
            TunnelError::PortClosed,
            TunnelError::Identity {
                worker,
                identity: String::new(),
                reason: "empty".into(),
            },
            TunnelError::Shared {
                reason: "closed".into(),
                kind: FailureKind::PortClosed,
            },
        ] {
            assert!(!answered.retry_unsent(), "{answered}");
        }
    }
}
