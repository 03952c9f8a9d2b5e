//! Router side of the atunnel protocol (docs/tunnel-protocol.md): one shared HTTP/2 connection per
//! worker (h2c prior knowledge), one `CONNECT` stream per tunnel, HTTP/1.1 (or HTTP/2 for gRPC)
//! spoken to the actor over the stream, a small pool of idle HTTP/1.1 tunnels per (actor, port)
//! for keep-alive reuse, and one long-lived HTTP/2 connection per (actor, port) inside one tunnel
//! that carries every gRPC request to that port.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ate_core::{ACTIVATION_HEADER, REQUEST_ID_HEADER, TARGET_ACTOR_HEADER, TARGET_PORT_HEADER};
use ate_tls::rustls::ClientConfig;
use ate_tls::rustls::pki_types::ServerName;
use ate_tls::tokio_rustls::TlsConnector;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::actor_ref::ActorKey;
use crate::body::RouterBody;
use crate::cache::Route;
use crate::metrics::Stats;

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

    /// The route itself is wrong (stale or the worker is gone): resolve again and retry.
    pub fn route_is_bad(&self) -> bool {
        self.kind() == FailureKind::RouteBad
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

/// Whether atunnel asked for a handed-off tunnel back (the actor drains for a suspend). Read and
/// written under the pool's lock: a retired connection found in the pool is closed at once, one
/// a request holds is closed when that request's response ends (it is not put back).
#[derive(Debug, Default)]
struct HandoffUse {
    retired: AtomicBool,
}

/// What a handed-off connection has beyond a CONNECT one, boxed so that [`H1Conn`] (which a
/// request's future holds) stays small. `_alive` ties it to its watcher task
/// ([`Tunnels::watch_handoff`]): dropped with the connection, wherever that happens, it ends the
/// watcher, whose end closes the unix connection, which is the tunnel's end at atunnel.
struct Handed {
    usage: Arc<HandoffUse>,
    _alive: tokio::sync::oneshot::Sender<()>,
    /// The connection's I/O, polled by whoever holds the connection; `None` once it has ended.
    driver: Option<Driver>,
}

impl Handed {
    fn retired(&self) -> bool {
        self.usage.retired.load(Ordering::SeqCst)
    }
}

/// The I/O of an HTTP/1.1 connection to an actor (hyper's connection future), polled by the task
/// that holds the connection: the request's own task while it waits for the answer and streams
/// the body, so a warm request never hands off to another task (no cross-task wake-ups, which
/// were most of the router's cost per request beside nginx). An idle pooled connection is
/// polled by the next request that checks it out, which then sees what happened meanwhile (the
/// actor closed it, or the previous response's end).
type Driver = Pin<Box<dyn std::future::Future<Output = hyper::Result<()>> + Send>>;

type WorkerSlot = Arc<tokio::sync::Mutex<Option<http2::SendRequest<Empty<Bytes>>>>>;

struct IdleH1 {
    conn: H1Conn,
    since: Instant,
}

/// How a shared HTTP/2 tunnel connection is used: streams open on it, and since when it is idle.
#[derive(Debug)]
struct ConnUse {
    active: AtomicUsize,
    broken: AtomicBool,
    /// Milliseconds after `base` when the last stream ended.
    idle_since_ms: AtomicU64,
    base: Instant,
}

impl ConnUse {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Not broken, and either carrying a stream or idle for less than `idle_timeout`.
    fn reusable(&self, idle_timeout: Duration) -> bool {
        if self.broken.load(Ordering::SeqCst) {
            return false;
        }
        if self.active.load(Ordering::SeqCst) > 0 {
            return true;
        }
        let idle_ms = self
            .now_ms()
            .saturating_sub(self.idle_since_ms.load(Ordering::SeqCst));
        u128::from(idle_ms) < idle_timeout.as_millis()
    }
}

/// One stream's hold on a shared HTTP/2 tunnel connection (held by the response body): the
/// connection is not reaped while any is alive, and its idle time starts when the last one drops.
#[derive(Debug)]
pub struct InUse(Arc<ConnUse>);

impl InUse {
    fn new(usage: &Arc<ConnUse>) -> Self {
        usage.active.fetch_add(1, Ordering::SeqCst);
        Self(usage.clone())
    }

    /// The stream failed: the connection is not handed out again (it closes after its last
    /// stream).
    pub fn mark_broken(&self) {
        self.0.broken.store(true, Ordering::SeqCst);
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0
            .idle_since_ms
            .store(self.0.now_ms(), Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The gRPC connection of one (actor, port): HTTP/2 to the actor inside one CONNECT stream.
struct GrpcConn {
    sender: http2::SendRequest<Incoming>,
    worker: Arc<str>,
    usage: Arc<ConnUse>,
}

impl GrpcConn {
    fn reusable(&self, worker: &Arc<str>, idle_timeout: Duration) -> bool {
        self.worker == *worker && !self.sender.is_closed() && self.usage.reusable(idle_timeout)
    }
}

/// The gRPC connection of one (actor, port), locked while it is checked or made so that a burst
/// of gRPC requests opens one tunnel. Requests that waited for a failed attempt fail with its
/// error instead of each trying (and timing out) in turn.
#[derive(Default)]
struct GrpcSlotState {
    conn: Option<GrpcConn>,
    /// Failed attempts so far, and the last one's worker and error (its text and kind).
    failures: u64,
    last_failure: Option<(Arc<str>, String, FailureKind)>,
}

#[derive(Default)]
struct GrpcSlotInner {
    state: tokio::sync::Mutex<GrpcSlotState>,
    failures: AtomicU64,
}

type GrpcSlot = Arc<GrpcSlotInner>;

/// An HTTP/1.1 connection to an actor over a tunnel.
pub struct H1Conn {
    pub sender: http1::SendRequest<Incoming>,
    worker: Arc<str>,
    port: u16,
    /// Set for a handed-off tunnel (the actor's own socket), whose I/O its holder polls; a
    /// CONNECT tunnel's runs in a task of its own (its bytes cross the shared HTTP/2
    /// connection's task anyway).
    handoff: Option<Box<Handed>>,
}

impl H1Conn {
    /// Whether the connection's I/O is polled by its holder (and has not ended).
    fn polled_inline(&self) -> bool {
        self.handoff.as_ref().is_some_and(|h| h.driver.is_some())
    }

    /// Polls the connection's I/O in the caller's task (nothing when it has its own task).
    fn poll_io(&mut self, cx: &mut Context<'_>) {
        if let Some(handed) = &mut self.handoff
            && let Some(driver) = &mut handed.driver
            && let Poll::Ready(result) = driver.as_mut().poll(cx)
        {
            if let Err(e) = result {
                tracing::debug!(error = %e, "handed-off HTTP/1.1 connection ended");
            }
            handed.driver = None;
        }
    }

    /// Waits for `answer` (the response to a request just given to this connection), polling
    /// the connection's I/O in this same task.
    fn drive<'a, F: Future>(&'a mut self, answer: Pin<&'a mut F>) -> Drive<'a, F> {
        Drive { conn: self, answer }
    }

    /// The connection will not be reused (the pool is off): its I/O gets a task of its own,
    /// which ends after the response in flight (the sender is dropped here).
    fn detach(self) {
        if let Some(mut handed) = self.handoff
            && let Some(driver) = handed.driver.take()
        {
            tokio::spawn(async move {
                if let Err(e) = driver.await {
                    tracing::debug!(error = %e, "handed-off HTTP/1.1 connection ended");
                }
                drop(handed);
            });
        }
    }
}

/// [`H1Conn::drive`]'s future. Written out rather than an `async fn` so that the answer's
/// future is stored once, pinned in the request's future, not copied into this one: the request
/// future's size is what every parked request costs.
pub struct Drive<'a, F> {
    conn: &'a mut H1Conn,
    answer: Pin<&'a mut F>,
}

impl<F: Future> Future for Drive<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if let Poll::Ready(out) = this.answer.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        if !this.conn.polled_inline() {
            return Poll::Pending;
        }
        this.conn.poll_io(cx);
        this.answer.as_mut().poll(cx)
    }
}

/// A pooled HTTP/1.1 connection waiting for the end of the response body it carries, carried by
/// that body ([`crate::body::RouterBody`]): the body's end puts the connection back in the pool
/// in place, without a task per request waiting for it to be ready again (a pooled connection
/// that is not ready yet is skipped by `checkout`, not dropped).
pub struct PoolReturn {
    tunnels: Arc<Tunnels>,
    key: ActorKey,
    conn: H1Conn,
}

impl PoolReturn {
    /// The body ended: the connection goes back to the pool (unless atunnel asked for it back,
    /// or the pool is full: then it is dropped, which closes it).
    pub fn done(self) {
        let PoolReturn { tunnels, key, conn } = self;
        if conn.sender.is_closed() {
            return;
        }
        let mut idle = tunnels.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the pool's lock, where the watcher sets it: a connection atunnel asked
        // for back while the request ran is closed now, not pooled.
        if conn.handoff.as_ref().is_some_and(|h| h.retired()) {
            drop(idle);
            return;
        }
        let conns = idle.entry(key).or_default();
        if conns.len() < tunnels.cfg.idle_per_actor {
            conns.push(IdleH1 {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Polls the connection's I/O (the body's task drives it while the body streams).
    pub fn poll_io(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.conn.polled_inline() {
            return false;
        }
        self.conn.poll_io(cx);
        true
    }
}

impl std::fmt::Debug for PoolReturn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolReturn")
            .field("worker", &self.conn.worker)
            .field("port", &self.conn.port)
            .finish()
    }
}

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
        self.stats.tunnel_connects.fetch_add(1, Ordering::Relaxed);
        // One retry: a shared connection that died since its last use is replaced.
        let mut retried = false;
        loop {
            let mut sender = self.worker(route).await?;
            let mut request = connect_request(actor, port, route.activation)?;
            if let Ok(id) = HeaderValue::from_str(request_id)
                && !request_id.is_empty()
            {
                request.headers_mut().insert(REQUEST_ID_HEADER, id);
            }
            ate_tls::trace_context::inject_http(request.headers_mut());
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

    /// A new HTTP/1.1 connection over a new tunnel (upgrades allowed, for WebSocket).
    pub async fn new_h1(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, TunnelError> {
        // Boxed, like the worker connection: opening a tunnel (CONNECT stream, upgrade, HTTP/1.1
        // handshake) is a large future that would otherwise sit in every request's future,
        // parked ones included; the warm path takes a pooled tunnel and never gets here (with
        // the pool off, this is one allocation beside a new CONNECT stream and handshake).
        Box::pin(self.new_h1_unboxed(route, actor, port, request_id)).await
    }

    /// A new HTTP/1.1 connection for the pool: the actor's own socket handed over by a worker
    /// on this machine when there is one (`--local-tunnels`), else a CONNECT tunnel. No upgrades
    /// go over it (WebSockets take [`Tunnels::new_h1`]: atunnel closes them with a close frame
    /// on a suspend, which needs the bytes to pass through it).
    async fn pooled_h1(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, TunnelError> {
        if let Some(dir) = &self.cfg.local_tunnels {
            match self.handed_h1(dir, route, actor, port, request_id).await {
                Ok(conn) => return Ok(conn),
                Err(crate::handoff::HandoffError::Unavailable { .. }) => {}
                Err(crate::handoff::HandoffError::Refused(reply)) => {
                    return Err(match reply {
                        ate_core::handoff::Reply::Stale(_) => TunnelError::Stale,
                        ate_core::handoff::Reply::PortClosed(_) => TunnelError::PortClosed,
                        ate_core::handoff::Reply::Refused(status, _) => TunnelError::Refused(
                            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                        ),
                        ate_core::handoff::Reply::Ok => TunnelError::Refused(StatusCode::OK),
                    });
                }
                Err(e) => {
                    // The worker's process is going or gone: as when its atunnel does not
                    // answer, the route is bad.
                    return Err(TunnelError::Connect {
                        worker: route.worker.clone(),
                        source: std::io::Error::other(e.to_string()),
                    });
                }
            }
        }
        self.new_h1(route, actor, port, request_id).await
    }

    async fn handed_h1(
        self: &Arc<Self>,
        dir: &std::path::Path,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, crate::handoff::HandoffError> {
        let request = ate_core::handoff::Request {
            actor,
            port,
            // 0: an assignment without a token (as the CONNECT path, none is sent).
            activation: (route.activation != 0).then_some(route.activation),
            request_id,
        };
        let handed =
            crate::handoff::take(dir, &route.worker, &request, self.cfg.connect_timeout).await?;
        self.stats.tunnel_connects.fetch_add(1, Ordering::Relaxed);
        self.stats.tunnel_handoffs.fetch_add(1, Ordering::Relaxed);
        let io_err = |e: std::io::Error| crate::handoff::HandoffError::Io {
            worker: route.worker.to_string(),
            source: e,
        };
        // A second descriptor of the socket, for the watcher to cut it with (`shutdown(2)`)
        // whoever holds the connection at that moment.
        let cut = handed.tcp.as_fd().try_clone_to_owned().map_err(io_err)?;
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(handed.tcp))
            .await
            .map_err(|e| io_err(std::io::Error::other(e)))?;
        let usage = Arc::new(HandoffUse {
            retired: AtomicBool::new(handed.retired),
        });
        let (alive, dropped) = tokio::sync::oneshot::channel();
        tokio::spawn(Self::watch_handoff(
            Arc::downgrade(self),
            ActorKey::from_validated(actor),
            usage.clone(),
            handed.control,
            std::net::TcpStream::from(cut),
            dropped,
        ));
        Ok(H1Conn {
            sender,
            worker: route.worker.clone(),
            port,
            handoff: Some(Box::new(Handed {
                usage,
                _alive: alive,
                driver: Some(Box::pin(conn)),
            })),
        })
    }

    /// Holds a handed-off tunnel's unix connection for as long as the connection lives, and
    /// acts on what atunnel says on it: [`ate_core::handoff::RETIRE`] closes the connection if
    /// it sits in the pool (else its request's end does, see [`PoolReturn::done`]); atunnel gone
    /// (the worker process ended) or speaking out of turn cuts the socket at once, request in
    /// flight or not, so nothing reaches a copy no worker vouches for. Returning drops `control`,
    /// which tells atunnel the tunnel ended.
    async fn watch_handoff(
        tunnels: std::sync::Weak<Self>,
        key: ActorKey,
        usage: Arc<HandoffUse>,
        mut control: tokio::net::UnixStream,
        socket: std::net::TcpStream,
        mut dropped: tokio::sync::oneshot::Receiver<()>,
    ) {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        loop {
            tokio::select! {
                // The connection was dropped (closed): the tunnel ends with it.
                _ = &mut dropped => return,
                read = control.read(&mut byte) => match read {
                    Ok(1) if byte[0] == ate_core::handoff::RETIRE => {
                        let Some(tunnels) = tunnels.upgrade() else { return };
                        if tunnels.retire_handoff(&key, &usage) {
                            return;
                        }
                        // A request holds it: its end closes it, and `dropped` fires.
                    }
                    _ => {
                        let _ = socket.shutdown(std::net::Shutdown::Both);
                        if let Some(tunnels) = tunnels.upgrade() {
                            tunnels.retire_handoff(&key, &usage);
                        }
                        return;
                    }
                },
            }
        }
    }

    /// Marks a handed-off connection retired and closes it if it sits in the pool; says whether
    /// it did (false: a request holds it).
    fn retire_handoff(&self, key: &ActorKey, usage: &Arc<HandoffUse>) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        usage.retired.store(true, Ordering::SeqCst);
        let Some(conns) = idle.get_mut(key.as_str()) else {
            return false;
        };
        let Some(i) = conns.iter().position(|c| {
            c.conn
                .handoff
                .as_ref()
                .is_some_and(|h| Arc::ptr_eq(&h.usage, usage))
        }) else {
            return false;
        };
        let conn = conns.swap_remove(i);
        if conns.is_empty() {
            idle.remove(key.as_str());
        }
        drop(idle);
        drop(conn);
        true
    }

    async fn new_h1_unboxed(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, TunnelError> {
        let io = self.open(route, actor, port, request_id).await?;
        let (sender, conn) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(TunnelError::Actor)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "tunnel HTTP/1.1 connection ended");
            }
        });
        Ok(H1Conn {
            sender,
            worker: route.worker.clone(),
            port,
            handoff: None,
        })
    }

    /// Sends a gRPC request (HTTP/2, streams and trailers untouched) over the shared HTTP/2
    /// connection of (actor, port): one CONNECT stream carries every gRPC request to that port,
    /// opened on first use and closed after `idle_timeout` without a stream, on an error, or when
    /// the actor's route changes worker. A pooled connection found dead before the request was
    /// written is replaced transparently. With the pool off (`idle_per_actor == 0`) every request
    /// gets its own tunnel.
    pub async fn send_grpc(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        if self.cfg.idle_per_actor == 0 {
            let id = request_id_of(&request);
            let mut sender = match self.h2(route, actor, port, id).await {
                Ok(sender) => sender,
                Err(error) => {
                    return Err(SendFailed {
                        error,
                        request: Some(request),
                    });
                }
            };
            return match sender.send_request(request).await {
                Ok(response) => Ok(response.map(RouterBody::from)),
                Err(e) => Err(SendFailed {
                    error: TunnelError::Actor(e),
                    request: None,
                }),
            };
        }
        let mut replaced = false;
        loop {
            let id = request_id_of(&request);
            let (mut sender, in_use, fresh) = match self.grpc_conn(route, actor, port, id).await {
                Ok(conn) => conn,
                Err(error) => {
                    return Err(SendFailed {
                        error,
                        request: Some(request),
                    });
                }
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    return Ok(response.map(|body| RouterBody::Shared(body, in_use)));
                }
                Err(mut e) => {
                    in_use.mark_broken();
                    drop(in_use);
                    match e.take_message() {
                        Some(back) if !fresh && !replaced => {
                            tracing::debug!(%actor, port, error = %e.error(), "pooled gRPC tunnel was dead; replacing it");
                            replaced = true;
                            request = back;
                        }
                        back => {
                            return Err(SendFailed {
                                error: TunnelError::Actor(e.into_error()),
                                request: back,
                            });
                        }
                    }
                }
            }
        }
    }

    /// The gRPC connection of (actor, port) on the route's worker, already marked in use: the
    /// pooled one if it is usable, else a new one (replacing it). Also says whether it is new.
    async fn grpc_conn(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<(http2::SendRequest<Incoming>, InUse, bool), TunnelError> {
        let slot = {
            let mut grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
            if !grpc.contains_key(actor) {
                grpc.insert(ActorKey::from_validated(actor), Vec::new());
            }
            let slots = grpc.get_mut(actor);
            match slots {
                Some(slots) => match slots.iter().find(|(p, _)| *p == port) {
                    Some((_, slot)) => slot.clone(),
                    None => {
                        let slot = GrpcSlot::default();
                        slots.push((port, slot.clone()));
                        slot
                    }
                },
                // Just inserted under the same lock.
                None => GrpcSlot::default(),
            }
        };
        let failures_seen = slot.failures.load(Ordering::SeqCst);
        let mut state = slot.state.lock().await;
        if let Some(c) = state.conn.as_ref() {
            if c.reusable(&route.worker, self.cfg.idle_timeout) {
                self.stats.tunnel_reuses.fetch_add(1, Ordering::Relaxed);
                // Marked under the slot's lock, so the reaper never sees it idle in between.
                return Ok((c.sender.clone(), InUse::new(&c.usage), false));
            }
            // Dropping our handle closes the connection (and its tunnel) after its last stream.
            state.conn = None;
        } else if state.failures != failures_seen
            && let Some((worker, reason, kind)) = &state.last_failure
            && *worker == route.worker
        {
            return Err(TunnelError::Shared {
                reason: reason.clone(),
                kind: *kind,
            });
        }
        let sender = match self.h2(route, actor, port, request_id).await {
            Ok(sender) => sender,
            Err(e) => {
                state.failures += 1;
                state.last_failure = Some((route.worker.clone(), e.to_string(), e.kind()));
                slot.failures.store(state.failures, Ordering::SeqCst);
                return Err(e);
            }
        };
        let usage = Arc::new(ConnUse::new());
        let in_use = InUse::new(&usage);
        state.conn = Some(GrpcConn {
            sender: sender.clone(),
            worker: route.worker.clone(),
            usage,
        });
        Ok((sender, in_use, true))
    }

    /// Forgets pooled connections of `actor` on `worker` (its route there turned out stale or
    /// unreachable); gRPC connections close after their last stream.
    pub fn evict(&self, actor: &str, worker: &Arc<str>) {
        {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(conns) = idle.get_mut(actor) {
                conns.retain(|c| c.conn.worker != *worker);
                if conns.is_empty() {
                    idle.remove(actor);
                }
            }
        }
        let grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, slot) in grpc.get(actor).into_iter().flatten() {
            // A locked slot is being checked against the new route by its holder.
            if let Ok(mut state) = slot.state.try_lock()
                && state.conn.as_ref().is_some_and(|c| c.worker == *worker)
            {
                state.conn = None;
            }
        }
    }

    /// An HTTP/2 connection to the actor over a new tunnel (gRPC passes through as HTTP/2).
    pub async fn h2(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<http2::SendRequest<Incoming>, TunnelError> {
        // Boxed for the same reason as `new_h1`.
        Box::pin(self.h2_unboxed(route, actor, port, request_id)).await
    }

    async fn h2_unboxed(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<http2::SendRequest<Incoming>, TunnelError> {
        let io = self.open(route, actor, port, request_id).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(TunnelError::Actor)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "tunnel HTTP/2 connection ended");
            }
        });
        Ok(sender)
    }

    /// Sends `request` over HTTP/1.1, reusing an idle tunnel when one exists. A pooled connection
    /// that turns out dead before the request was written is replaced transparently.
    pub async fn send_h1(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        // One call site for sending, so the request's future holds one send state, not two.
        let mut fresh = false;
        loop {
            let pooled = std::future::poll_fn(|cx| {
                Poll::Ready(self.checkout(actor, port, &route.worker, cx))
            })
            .await;
            let mut conn = match pooled {
                Some(conn) => {
                    self.stats.tunnel_reuses.fetch_add(1, Ordering::Relaxed);
                    conn
                }
                None => {
                    let id = request_id_of(&request);
                    // Boxed for the same reason as `new_h1`: a new connection (a handoff or a
                    // CONNECT tunnel) is a large future, and the warm path never makes one.
                    match Box::pin(self.pooled_h1(route, actor, port, id)).await {
                        Ok(conn) => {
                            fresh = true;
                            conn
                        }
                        Err(error) => {
                            return Err(SendFailed {
                                error,
                                request: Some(request),
                            });
                        }
                    }
                }
            };
            let answer = std::pin::pin!(conn.sender.try_send_request(request));
            match conn.drive(answer).await {
                Ok(response) => return Ok(self.respond(actor, conn, response)),
                Err(mut e) => match e.take_message() {
                    // A pooled connection that died before the request was written: another.
                    Some(back) if !fresh => request = back,
                    _ => {
                        return Err(SendFailed {
                            error: TunnelError::Actor(e.into_error()),
                            request: None,
                        });
                    }
                },
            }
        }
    }

    /// The actor's response, its body returning `conn` to the pool at its end.
    fn respond(
        self: &Arc<Self>,
        actor: &str,
        conn: H1Conn,
        response: Response<Incoming>,
    ) -> Response<RouterBody> {
        match self.checkin(actor, conn) {
            Ok(back) => response.map(|body| RouterBody::pooled(body, back)),
            Err(conn) => {
                conn.detach();
                response.map(RouterBody::from)
            }
        }
    }

    /// A pooled connection for `actor`'s `port` on `worker`, newest first, its I/O polled here
    /// (in `cx`'s task) first so that one the actor closed while it was idle is not used.
    fn checkout(
        &self,
        actor: &str,
        port: u16,
        worker: &Arc<str>,
        cx: &mut Context<'_>,
    ) -> Option<H1Conn> {
        if self.cfg.idle_per_actor == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.get_mut(actor)?;
        let now = Instant::now();
        let mut found = None;
        // Newest first. Dead entries go; one still finishing its last response (its body
        // ended a moment ago, the connection has not caught up) stays for the next turn.
        let mut i = conns.len();
        while i > 0 {
            i -= 1;
            let c = &mut conns[i];
            if c.conn.port != port {
                continue;
            }
            let retired = c.conn.handoff.as_ref().is_some_and(|h| h.retired());
            if c.conn.worker != *worker
                || retired
                || now.duration_since(c.since) >= self.cfg.idle_timeout
            {
                conns.swap_remove(i);
                continue;
            }
            c.conn.poll_io(cx);
            if c.conn.sender.is_closed() {
                conns.swap_remove(i);
                continue;
            }
            if !c.conn.sender.is_ready() {
                continue;
            }
            found = Some(conns.swap_remove(i).conn);
            break;
        }
        if conns.is_empty() {
            idle.remove(actor);
        }
        found
    }

    /// What returns `conn` to the pool once its response body has ended (see
    /// [`PoolReturn`]); the connection back with the pool off.
    fn checkin(self: &Arc<Self>, actor: &str, conn: H1Conn) -> Result<PoolReturn, H1Conn> {
        if self.cfg.idle_per_actor == 0 {
            return Err(conn);
        }
        Ok(PoolReturn {
            tunnels: self.clone(),
            key: ActorKey::from_validated(actor),
            conn,
        })
    }

    /// Closes idle tunnels older than the idle timeout: an open tunnel counts as activity for
    /// the worker's idle auto-suspend, so idle ones must not linger.
    pub fn reap_idle(&self) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, conns| {
            conns.retain(|c| {
                !c.conn.sender.is_closed() && now.duration_since(c.since) < self.cfg.idle_timeout
            });
            !conns.is_empty()
        });
        drop(idle);
        let idle_timeout = self.cfg.idle_timeout;
        let mut grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
        grpc.retain(|_, slots| {
            slots.retain(|(_, slot)| {
                let Ok(mut state) = slot.state.try_lock() else {
                    return true; // being checked or connected right now
                };
                if let Some(c) = state.conn.as_ref()
                    && (c.sender.is_closed() || !c.usage.reusable(idle_timeout))
                {
                    state.conn = None;
                }
                // An empty slot goes once no request holds it (clones are made under this lock).
                state.conn.is_some() || Arc::strong_count(slot) > 1
            });
            !slots.is_empty()
        });
        drop(grpc);
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        workers.retain(|_, slot| match slot.try_lock() {
            Ok(s) => s.as_ref().is_some_and(|s| !s.is_closed()),
            Err(_) => true,
        });
    }

    /// Idle pooled connections (for tests and metrics).
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Open pooled gRPC connections (one tunnel each).
    pub fn grpc_count(&self) -> usize {
        let grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
        grpc.values()
            .flatten()
            .filter(|(_, slot)| {
                slot.state.try_lock().map_or(true, |s| {
                    s.conn.as_ref().is_some_and(|c| !c.sender.is_closed())
                })
            })
            .count()
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
}
