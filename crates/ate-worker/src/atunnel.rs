//! atunnel: the router's only way to an actor (docs/tunnel-protocol.md, server side).
//!
//! h2c with prior knowledge; every tunnel is one HTTP/2 `CONNECT` stream naming the actor in
//! `ate-target-actor` and the port in `ate-target-port`. A stream for an actor that is active here
//! becomes a byte pipe to `169.254.17.2:<port>`, dialed from a socket made inside the actor's
//! network namespace by its [`NetnsDialer`]; a probe (`ate-probe: 1`) only answers whether the
//! actor is served here. A port nothing listens on is a 502 marked `x-ate-port-closed: true`. atunnel also counts open tunnels and the last
//! activity per actor (idle auto-suspend), and closes an actor's tunnels when ingress goes off
//! (so a memory dump sees no established connection).
//!
//! Egress (nftables in the actor netns redirecting outbound TCP to an egress listener here,
//! which applies the template's egress policy) is not built yet; it belongs next to this
//! listener, started per actor before the sandbox runs.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ate_tls::rustls::ServerConfig;
use ate_tls::tokio_rustls::TlsAcceptor;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::Instrument;

use crate::netns::{ACTOR_IP, NetnsDialer};
use crate::pipe::{Command, TunnelState};

/// A tunnel whose last bytes were the actor's answer and that was quiet this long has no
/// request in flight (a drain closes it).
const DRAIN_QUIET: Duration = Duration::from_millis(100);
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// The tunnel protocol's headers (defined in [`ate_core::tunnel`]). A probe (`ate-probe: 1`)
/// only answers whether this copy of the actor serves (200, or the usual 421) and dials nothing:
/// the router asks after a tunnel broke mid-request, to tell a tunnel cut by a suspend (ingress
/// off: 421) from the actor closing its connection (still 200).
pub use ate_core::tunnel::{
    ACTIVATION as HEADER_ACTIVATION, PORT_CLOSED as HEADER_PORT_CLOSED, PROBE as HEADER_PROBE,
    STALE as HEADER_STALE, TARGET_ACTOR as HEADER_ACTOR, TARGET_PORT as HEADER_PORT,
};
/// A SYN into an actor netns is answered at once (RST or SYN-ACK); this only bounds a stuck one.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Per-direction pipe buffer: small, since most tunnels carry a few KiB and many stay open idle.
const COPY_BUF: usize = 16 * 1024;
/// Time a client gets to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One actor's ingress while it is active on this worker.
#[derive(Debug)]
pub struct Activation {
    key: String,
    /// The fencing token of the activation this copy belongs to.
    token: u64,
    dialer: NetnsDialer,
    open: AtomicU32,
    last_activity_ms: AtomicI64,
    closed: watch::Sender<bool>,
    /// Set once ingress is off: a tunnel dialed concurrently with `deactivate` is refused.
    off: AtomicBool,
    /// The open tunnels, for a graceful drain.
    pipes: std::sync::Mutex<Vec<std::sync::Weak<TunnelState>>>,
}

impl Activation {
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn token(&self) -> u64 {
        self.token
    }

    /// The socket factory of this activation (a sandbox thawed in place reuses it).
    pub fn dialer(&self) -> &NetnsDialer {
        &self.dialer
    }

    /// Turns true when ingress goes off for good (every tunnel is cut).
    pub(crate) fn subscribe_closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    pub fn open_tunnels(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    pub fn last_activity_unix_ms(&self) -> i64 {
        self.last_activity_ms.load(Ordering::Acquire)
    }

    fn touch(&self) {
        self.last_activity_ms
            .store(now_unix_ms(), Ordering::Release);
    }

    pub(crate) fn register(&self, state: &Arc<TunnelState>) {
        let mut pipes = match self.pipes.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        pipes.retain(|w| w.strong_count() > 0);
        pipes.push(Arc::downgrade(state));
    }

    fn live_pipes(&self) -> Vec<Arc<TunnelState>> {
        let pipes = match self.pipes.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        pipes.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// A graceful ingress off, before the suspend cuts what is left: new tunnels are refused
    /// (421: the router parks the request, and it resumes the actor after the suspend), idle
    /// tunnels (pooled keep-alive connections) close at once, WebSockets get a close frame
    /// (1001 "actor suspending") at a frame boundary, and tunnels with a request in flight get
    /// up to `grace` to finish. Returns how many tunnels were still open at the end.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.off.store(true, Ordering::Release);
        let deadline = Instant::now() + grace;
        loop {
            let live = self.live_pipes();
            if live.is_empty() {
                return 0;
            }
            for p in &live {
                if p.is_websocket() {
                    p.command(Command::GoingAway);
                } else if p.is_idle(DRAIN_QUIET) {
                    p.command(Command::Close);
                }
            }
            if Instant::now() >= deadline {
                return live.len();
            }
            drop(live);
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Waits until every tunnel of this activation has closed, up to `timeout`; true if they did.
    pub async fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.open_tunnels() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

/// Decrements the open count and records activity when a tunnel ends, whichever way it ends.
pub(crate) struct OpenGuard(Arc<Activation>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.touch();
    }
}

/// The actors whose ingress is on, keyed `<atespace>/<name>`, and the worker's liveness lease.
#[derive(Debug)]
pub struct Tunnels {
    actors: RwLock<HashMap<String, Arc<Activation>>>,
    /// Milliseconds after `base` until which the lease admits traffic; `UNLEASED` until the
    /// first renewal (a worker driven without a node, as in tests, is never fenced).
    lease_until_ms: AtomicI64,
    base: Instant,
    /// Copies refused because a CONNECT carried a newer token: `(key, their token)`, for the
    /// worker to discard.
    superseded: std::sync::Mutex<Vec<(String, u64)>>,
}

const UNLEASED: i64 = i64::MIN;

impl Default for Tunnels {
    fn default() -> Self {
        Self {
            actors: RwLock::default(),
            lease_until_ms: AtomicI64::new(UNLEASED),
            base: Instant::now(),
            superseded: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Tunnels {
    pub fn new() -> Self {
        Self::default()
    }

    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.base.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// The node renewed the worker's lease with the api: traffic is admitted for `valid_for`.
    pub fn renew_lease(&self, valid_for: Duration) {
        let until = self
            .elapsed_ms()
            .saturating_add(i64::try_from(valid_for.as_millis()).unwrap_or(i64::MAX));
        self.lease_until_ms.store(until, Ordering::Release);
    }

    /// Whether the worker was ever leased (a node renews it).
    pub fn is_leased(&self) -> bool {
        self.lease_until_ms.load(Ordering::Acquire) != UNLEASED
    }

    /// False once the lease ran out: the api may release this worker's actors soon, so none of
    /// them may be served (the worker fences itself) until the node renews again.
    pub fn lease_valid(&self) -> bool {
        let until = self.lease_until_ms.load(Ordering::Acquire);
        until == UNLEASED || self.elapsed_ms() < until
    }

    /// Copies found superseded by a newer activation since the last call.
    pub fn take_superseded(&self) -> Vec<(String, u64)> {
        match self.superseded.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// A CONNECT named a newer activation than the copy here: ingress off at once, and the copy
    /// is queued for the worker to discard.
    fn supersede(&self, a: &Activation) {
        let removed = {
            let mut actors = self.write();
            match actors.get(&a.key) {
                Some(current) if current.token == a.token => actors.remove(&a.key),
                _ => None,
            }
        };
        if let Some(old) = removed {
            shut(&old);
            match self.superseded.lock() {
                Ok(mut v) => v.push((old.key.clone(), old.token)),
                Err(poisoned) => poisoned.into_inner().push((old.key.clone(), old.token)),
            }
        }
    }

    /// Ingress on: tunnels to `key` (activation `token`) are dialed through `dialer` from now on.
    pub fn activate(&self, key: &str, token: u64, dialer: NetnsDialer) -> Arc<Activation> {
        let (closed, _) = watch::channel(false);
        let a = Arc::new(Activation {
            key: key.to_string(),
            token,
            dialer,
            open: AtomicU32::new(0),
            last_activity_ms: AtomicI64::new(now_unix_ms()),
            closed,
            off: AtomicBool::new(false),
            pipes: std::sync::Mutex::new(Vec::new()),
        });
        let old = self.write().insert(key.to_string(), a.clone());
        if let Some(old) = old {
            shut(&old);
        }
        a
    }

    /// Ingress off (new CONNECTs get 421) and every open tunnel of `key` is closed. Returns the
    /// activation so the caller can wait for the tunnels to be gone.
    pub fn deactivate(&self, key: &str) -> Option<Arc<Activation>> {
        let a = self.write().remove(key)?;
        shut(&a);
        Some(a)
    }

    pub fn get(&self, key: &str) -> Option<Arc<Activation>> {
        self.read().get(key).cloned()
    }

    pub fn keys(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Activation>>> {
        match self.actors.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Activation>>> {
        match self.actors.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

fn shut(a: &Activation) {
    a.off.store(true, Ordering::Release);
    a.closed.send_replace(true);
}

/// Serves atunnel on `listener` until `shutdown` resolves; then stops accepting and cuts every
/// connection (the worker stops its sandboxes right after).
/// Serves atunnel on `listener` until `shutdown`. With `tls` (a server config requiring the
/// router's SPIFFE ID, ALPN h2) every connection is mTLS and anyone else fails the handshake;
/// without, h2c.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    tunnels: Arc<Tunnels>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "atunnel accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let tunnels = tunnels.clone();
                let acceptor = acceptor.clone();
                conns.spawn(async move {
                    match acceptor {
                        None => serve_connection(stream, peer, tunnels).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => serve_connection(tls, peer, tunnels).await,
                                Ok(Err(e)) => {
                                    tracing::warn!(%peer, error = %e, "atunnel TLS handshake refused");
                                }
                                Err(_) => tracing::debug!(%peer, "atunnel TLS handshake timed out"),
                            }
                        }
                    }
                });
            }
            // Reap finished connection tasks so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

async fn serve_connection<S>(stream: S, peer: SocketAddr, tunnels: Arc<Tunnels>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let tunnels = tunnels.clone();
        let span = forward_span(&req);
        async move {
            let response = handle(&tunnels, req).instrument(span.clone()).await;
            span.record("status", response.status().as_u16());
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // One connection carries every tunnel from the router: many streams, roomy windows.
    builder
        .max_concurrent_streams(4096)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(16 << 20);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%peer, error = %e, "atunnel connection ended");
    }
}

/// The span of one CONNECT (one tunnel: its checks and the dial into the actor's netns, until
/// atunnel answers; the bytes piped afterwards are not in it). Carries the request id of the
/// request that opened the tunnel, so every line about it has one, and continues that request's
/// trace (the router's `traceparent` on the CONNECT). Requests sent later over the same pooled
/// tunnel never reach atunnel as requests: they are bytes in the pipe.
fn forward_span(req: &Request<Incoming>) -> tracing::Span {
    let headers = req.headers();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let request_id = Some(text(ate_core::REQUEST_ID_HEADER))
        .filter(|id| ate_core::request_id::is_valid(id.as_bytes()))
        .unwrap_or_default();
    let span = tracing::info_span!(
        "forward",
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        actor = %text(HEADER_ACTOR),
        port = %Some(text(HEADER_PORT)).filter(|p| !p.is_empty()).unwrap_or("80"),
        status = tracing::field::Empty,
    );
    ate_tls::trace_context::continue_http(&span, headers);
    span
}

/// The request id on a CONNECT (for the lines of the tunnel's task, which outlives its span).
fn request_id_of(headers: &http::HeaderMap) -> String {
    headers
        .get(ate_core::REQUEST_ID_HEADER)
        .filter(|v| ate_core::request_id::is_valid(v.as_bytes()))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn stale(key: &str) -> Response<Full<Bytes>> {
    stale_because(format!("actor {key} is not active on this worker\n"))
}

fn stale_because(body: String) -> Response<Full<Bytes>> {
    let mut r = reply(StatusCode::MISDIRECTED_REQUEST, body);
    r.headers_mut()
        .insert(HEADER_STALE, http::HeaderValue::from_static("true"));
    r
}

/// Parses the routing headers: `(<atespace>/<name>, port)` or the 400 body.
pub fn parse_target(headers: &http::HeaderMap) -> Result<(String, u16), String> {
    let actor = match headers.get(HEADER_ACTOR) {
        None => return Err(format!("missing {HEADER_ACTOR} header")),
        Some(v) => v
            .to_str()
            .map_err(|_| format!("{HEADER_ACTOR} is not ASCII"))?,
    };
    if ate_core::tunnel::split_actor_ref(actor).is_none() {
        let shown: String = actor.chars().take(140).collect();
        return Err(format!(
            "{HEADER_ACTOR} {shown:?} is not <atespace>/<name> with both DNS-1123 labels"
        ));
    }
    let port = match headers.get(HEADER_PORT) {
        None => 80,
        Some(v) => match ate_core::tunnel::parse_port(v.as_bytes()) {
            Some(p) => p,
            None => {
                let shown: String = String::from_utf8_lossy(v.as_bytes())
                    .chars()
                    .take(20)
                    .collect();
                return Err(format!("{HEADER_PORT} {shown:?} is not a port (1-65535)"));
            }
        },
    };
    Ok((actor.to_string(), port))
}

/// Whether the CONNECT is a probe (`ate-probe: 1`).
pub fn parse_probe(headers: &http::HeaderMap) -> Result<bool, String> {
    match headers.get(HEADER_PROBE) {
        None => Ok(false),
        Some(v) if v == "1" => Ok(true),
        Some(_) => Err(format!("{HEADER_PROBE} must be 1 when present")),
    }
}

/// The 502 for a dial into the actor's netns that failed. A refused connection means nothing
/// listens on the port (the actor's process is not up on it, or listens elsewhere): marked, so
/// the router can say so instead of "unreachable".
fn dial_failed(key: &str, port: u16, e: &std::io::Error) -> Response<Full<Bytes>> {
    let (port_closed, body) = dial_failure(key, port, e);
    let mut r = reply(StatusCode::BAD_GATEWAY, body + "\n");
    if port_closed {
        r.headers_mut()
            .insert(HEADER_PORT_CLOSED, http::HeaderValue::from_static("true"));
    }
    r
}

/// Whether a failed dial means nothing listens on the port, and the text that says so.
pub(crate) fn dial_failure(key: &str, port: u16, e: &std::io::Error) -> (bool, String) {
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        return (
            true,
            format!("actor {key}: nothing listens on port {port} in the actor"),
        );
    }
    (
        false,
        format!("actor {key}: cannot connect to port {port} in the actor: {e}"),
    )
}

/// The router's fencing token (`ate-activation`), if it sent one.
pub fn parse_activation(headers: &http::HeaderMap) -> Result<Option<u64>, String> {
    match headers.get(HEADER_ACTIVATION) {
        None => Ok(None),
        Some(v) => match v.to_str().ok().and_then(|t| t.parse::<u64>().ok()) {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("{HEADER_ACTIVATION} is not a positive integer")),
        },
    }
}

/// Why an admitted tunnel was not opened.
pub(crate) enum Refusal {
    /// Ingress went off (a drain for a suspend): the CONNECT's 421.
    Stale,
    /// The dial into the actor's netns failed.
    Dial(std::io::Error),
}

/// The checks every tunnel request passes, CONNECT or handoff: the worker's lease, the actor
/// active here, and the fencing token (a newer one than the copy's supersedes this copy). The
/// error is the 421's body.
pub(crate) fn admit(
    tunnels: &Tunnels,
    key: &str,
    token: Option<u64>,
) -> Result<Arc<Activation>, String> {
    if !tunnels.lease_valid() {
        return Err(format!(
            "actor {key}: this worker lost contact with the control plane and serves no actor until it is back\n"
        ));
    }
    let Some(activation) = tunnels.get(key) else {
        return Err(format!("actor {key} is not active on this worker\n"));
    };
    // Fencing: only the copy holding exactly the router's token serves. A newer token means
    // the actor was activated elsewhere (or again here) since: this copy must go.
    if let Some(token) = token
        && token != activation.token
    {
        if token > activation.token {
            tracing::warn!(actor = %key, held = activation.token, asked = token, "a newer activation exists; this copy stops serving and is discarded");
            tunnels.supersede(&activation);
        }
        return Err(format!(
            "actor {key}: activation {token} is not the one held here ({})\n",
            activation.token
        ));
    }
    Ok(activation)
}

/// Dials the admitted actor's `port` and counts the tunnel as open (and as activity) for as
/// long as the returned guard lives.
pub(crate) async fn dial(
    activation: &Arc<Activation>,
    port: u16,
) -> Result<(tokio::net::TcpStream, OpenGuard), Refusal> {
    if activation.off.load(Ordering::Acquire) {
        // Draining for a suspend: the router parks the request and resumes the actor after.
        return Err(Refusal::Stale);
    }
    let addr = SocketAddr::new(ACTOR_IP.into(), port);
    let upstream = activation
        .dialer
        .connect_timeout(addr, DIAL_TIMEOUT)
        .await
        .map_err(Refusal::Dial)?;
    activation.open.fetch_add(1, Ordering::AcqRel);
    let guard = OpenGuard(activation.clone());
    // Re-check after counting: `deactivate` sets `off` before waiting for the count to drop,
    // so either it sees this tunnel or this tunnel sees ingress off.
    if activation.off.load(Ordering::Acquire) {
        return Err(Refusal::Stale);
    }
    activation.touch();
    Ok((upstream, guard))
}

async fn handle(tunnels: &Tunnels, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::CONNECT {
        return reply(
            StatusCode::BAD_REQUEST,
            "atunnel accepts only CONNECT streams (docs/tunnel-protocol.md)\n",
        );
    }
    let (key, port) = match parse_target(req.headers()) {
        Ok(t) => t,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let token = match parse_activation(req.headers()) {
        Ok(t) => t,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let probe = match parse_probe(req.headers()) {
        Ok(p) => p,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let activation = match admit(tunnels, &key, token) {
        Ok(a) => a,
        Err(body) => return stale_because(body),
    };
    if probe {
        // Not traffic: neither dialed nor counted as activity.
        if activation.off.load(Ordering::Acquire) {
            return stale(&key);
        }
        return reply(StatusCode::OK, Bytes::new());
    }
    let (upstream, guard) = match dial(&activation, port).await {
        Ok(x) => x,
        Err(Refusal::Stale) => return stale(&key),
        Err(Refusal::Dial(e)) => return dial_failed(&key, port, &e),
    };
    let mut closed = activation.closed.subscribe();
    let state = TunnelState::new();
    activation.register(&state);
    let request_id = request_id_of(req.headers());
    // The tunnel's trace is the CONNECT's (the router's request span), whether or not this
    // process exports traces.
    let trace_id = req
        .headers()
        .get(ate_tls::trace_context::TRACEPARENT)
        .and_then(|v| ate_tls::trace_context::TraceId::from_traceparent(v.as_bytes()));
    tokio::spawn(async move {
        let _guard = guard;
        let upgraded = tokio::select! {
            u = hyper::upgrade::on(req) => match u {
                Ok(u) => u,
                Err(e) => {
                    let trace_id = trace_id.map(tracing::field::display);
                    tracing::debug!(actor = %key, request_id = %request_id, trace_id, error = %e, "tunnel upgrade failed");
                    return;
                }
            },
            _ = closed.wait_for(|c| *c) => return,
        };
        let downstream = TokioIo::new(upgraded);
        crate::pipe::run(downstream, upstream, state, closed, COPY_BUF).await;
    });
    reply(StatusCode::OK, Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn target_headers() {
        assert_eq!(
            parse_target(&headers(&[(HEADER_ACTOR, "team/c-1")])),
            Ok(("team/c-1".to_string(), 80))
        );
        assert_eq!(
            parse_target(&headers(&[(HEADER_ACTOR, "team/c"), (HEADER_PORT, "8080")])),
            Ok(("team/c".to_string(), 8080))
        );
        for bad in ["team", "Team/c", "team/c/d", "/c", "team/-c", ""] {
            assert!(
                parse_target(&headers(&[(HEADER_ACTOR, bad)])).is_err(),
                "{bad:?}"
            );
        }
        for bad in ["0", "65536", "x", "-1", ""] {
            assert!(
                parse_target(&headers(&[(HEADER_ACTOR, "a/b"), (HEADER_PORT, bad)])).is_err(),
                "{bad:?}"
            );
        }
        assert!(parse_target(&headers(&[])).is_err());
    }

    #[test]
    fn activation_header() {
        assert_eq!(parse_activation(&headers(&[])), Ok(None));
        assert_eq!(
            parse_activation(&headers(&[(HEADER_ACTIVATION, "42")])),
            Ok(Some(42))
        );
        for bad in ["0", "-1", "x", "", "18446744073709551616"] {
            assert!(
                parse_activation(&headers(&[(HEADER_ACTIVATION, bad)])).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn probe_header() {
        assert_eq!(parse_probe(&headers(&[])), Ok(false));
        assert_eq!(parse_probe(&headers(&[(HEADER_PROBE, "1")])), Ok(true));
        for bad in ["0", "true", "", "11"] {
            assert!(
                parse_probe(&headers(&[(HEADER_PROBE, bad)])).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_refused_dial_is_marked_port_closed() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let r = dial_failed("a/b", 8080, &refused);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(r.headers()[HEADER_PORT_CLOSED], "true");
        let other = std::io::Error::from(std::io::ErrorKind::TimedOut);
        let r = dial_failed("a/b", 8080, &other);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert!(r.headers().get(HEADER_PORT_CLOSED).is_none());
    }

    #[test]
    fn the_lease_fences_only_once_given() {
        let t = Tunnels::new();
        assert!(t.lease_valid() && !t.is_leased());
        t.renew_lease(Duration::from_secs(60));
        assert!(t.lease_valid() && t.is_leased());
        t.renew_lease(Duration::ZERO);
        assert!(!t.lease_valid());
    }
}
