//! Hibernating WebSockets (`webSockets: hibernate` in the actor's template, docs/websockets.md).
//!
//! The router terminates the client's WebSocket itself (frames, not bytes) and keeps a separate
//! upstream WebSocket to the actor through the normal tunnel, marked `ate-websocket-hibernate` on
//! the CONNECT so that atunnel counts its frames as activity but not the open tunnel: an actor
//! whose sockets are quiet is suspended by its idle timeout like any other. The suspend closes
//! the upstream leg (atunnel's close frame 1001 "actor suspending", or the tunnel's end); the
//! client's socket stays open, and the router answers its pings. The client's next message wakes
//! the actor through the normal path (assignment cache, single flight, parking), a new upstream
//! WebSocket is opened carrying the same `ate-websocket-id` (and `ate-websocket-resumed: 1`), and
//! the message is delivered on it; messages are handled one at a time, so they reach the actor
//! in the order the client sent them. The actor's own close frame ends the client's socket with
//! the same code. A wake that fails closes the client's socket: actor deleted → 1000, crashed →
//! 1011, anything else → 1011 or 1013 (try again later), each with the reason. A router drain
//! closes every such socket with 1012 (service restart): the client reconnects to another
//! replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use super::Proxy;
use super::headers::{strip_hop_by_hop, unshare_head};
use super::observe::{text, with_detail};
use super::upgrade::{SEC_WEBSOCKET_KEY, websocket_key};
use crate::actor_ref::ActorKey;
use crate::body::RouterBody;
use crate::cache::Route;
use crate::drain::Relay;
use crate::error::{ForwardError, ResolveError};
use crate::tunnel::{SendFailed, TunnelError};

/// Gauge: client WebSockets the router terminates for hibernating actors (awake or not).
pub const WEBSOCKETS_OPEN: &str = "ate_router_hibernate_websockets_open";
/// Gauge: of those, the ones whose actor side is closed now (the actor sleeps, or its socket
/// ended): the next client message wakes it.
pub const WEBSOCKETS_HIBERNATED: &str = "ate_router_hibernate_websockets_hibernated";
/// Counter: wakes (upstream WebSockets opened again for a client message), by outcome.
pub const WEBSOCKET_WAKES: &str = "ate_router_hibernate_websocket_wakes_total";

const SEC_WEBSOCKET_EXTENSIONS: HeaderName = HeaderName::from_static("sec-websocket-extensions");
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");
const WEBSOCKET_ID: HeaderName = HeaderName::from_static(ate_core::tunnel::WEBSOCKET_ID);
const WEBSOCKET_RESUMED: HeaderName = HeaderName::from_static(ate_core::tunnel::WEBSOCKET_RESUMED);

/// The close reason atunnel's drain sends on a suspend (worker `pipe.rs`).
const SUSPENDING_REASON: &str = "actor suspending";
/// How long the closing handshake with either side may take before the socket is dropped.
const CLOSE_WAIT: Duration = Duration::from_millis(500);
/// A close frame's reason is at most 123 bytes (RFC 6455 §5.5: control payload ≤ 125).
const MAX_REASON: usize = 123;

/// `--hibernate-websockets-max` and `--hibernate-websockets-per-actor`.
#[derive(Debug, Clone, Copy)]
pub struct HibernateLimits {
    pub max: usize,
    pub per_actor: usize,
}

/// Counts the router-terminated WebSockets, in all and per actor, against the limits.
pub struct Sockets {
    limits: HibernateLimits,
    total: AtomicUsize,
    per_actor: Mutex<HashMap<ActorKey, usize>>,
}

/// One admitted socket; dropping it gives its place back.
pub struct Slot {
    sockets: Arc<Sockets>,
    actor: ActorKey,
}

impl Sockets {
    pub fn new(limits: HibernateLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            total: AtomicUsize::new(0),
            per_actor: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more socket to `actor`, or the refusal's text.
    fn admit(self: &Arc<Self>, actor: &str) -> Result<Slot, String> {
        let mut per_actor = self
            .per_actor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let total = self.total.load(Ordering::Acquire);
        if total >= self.limits.max {
            return Err(format!(
                "actor {actor}: router at capacity: {total} hibernating WebSockets open (--hibernate-websockets-max={})",
                self.limits.max
            ));
        }
        let key = ActorKey::from_validated(actor);
        let n = per_actor.entry(key.clone()).or_insert(0);
        if *n >= self.limits.per_actor {
            return Err(format!(
                "actor {actor}: {n} WebSockets are open to this actor already (--hibernate-websockets-per-actor={})",
                self.limits.per_actor
            ));
        }
        *n += 1;
        self.total.fetch_add(1, Ordering::AcqRel);
        metrics::gauge!(WEBSOCKETS_OPEN).increment(1.0);
        Ok(Slot {
            sockets: self.clone(),
            actor: key,
        })
    }

    /// Sockets open now (all actors).
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_actor = self
            .sockets
            .per_actor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = per_actor.get_mut(&self.actor) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_actor.remove(&self.actor);
            }
        }
        self.sockets.total.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!(WEBSOCKETS_OPEN).decrement(1.0);
    }
}

/// Small buffers: most of these sockets sit idle for hours (the read buffer is allocated
/// eagerly; 128 KiB by default). 1 KiB means more reads for a large message, which chat
/// traffic rarely has. Writes go out at once.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(0)
}

type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// What the router sends the actor on every upstream leg: the client's upgrade request (without
/// extensions, which the router does not negotiate, and without its key), and the socket's id.
struct Head {
    uri: Uri,
    headers: HeaderMap,
    request_id: String,
}

/// The answer to one upstream upgrade.
enum Leg {
    /// 101: the actor's side of the socket, and the response head (for the client's 101).
    Open(Box<Ws>, Response<()>),
    /// Anything else, passed back as it is (first leg) or turned into a close (later ones).
    Refused(Response<Incoming>),
}

impl Proxy {
    /// A WebSocket upgrade to an actor whose template hibernates WebSockets: the first upstream
    /// leg is opened now (a failure before anything was written gives the request back, for the
    /// caller's stale-route retry); on the actor's 101 the client gets its own 101 (200 over
    /// HTTP/2) and a task of its own terminates both sides.
    pub(super) async fn hibernate(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
        h2: bool,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        let slot = match self.sockets.admit(actor) {
            Ok(slot) => slot,
            Err(body) => return Ok(text(StatusCode::SERVICE_UNAVAILABLE, body)),
        };
        let head = Arc::new(head_of(&request));
        // The client's own key on the first leg, so the actor's accept is valid for the client.
        let key = request
            .headers()
            .get(SEC_WEBSOCKET_KEY)
            .cloned()
            .unwrap_or_else(websocket_key);
        let (ws, response) = match self.open_leg(route, actor, port, &head, key, false).await {
            Ok(Leg::Open(ws, response)) => (ws, response),
            // Over HTTP/2 a 2xx would open a stream the actor never agreed to (as `h2_websocket`).
            Ok(Leg::Refused(response)) if h2 && response.status().is_success() => {
                let why = ForwardError::UpgradeRefused;
                let detail = format!(
                    "the actor answered the WebSocket upgrade with {}",
                    response.status()
                );
                return Ok(with_detail(
                    text(why.status(), why.body(actor, port)),
                    detail,
                ));
            }
            Ok(Leg::Refused(response)) => return Ok(response.map(RouterBody::from)),
            Err(error) => {
                // Sent: the actor may have seen the upgrade (the caller asks atunnel why).
                let written = matches!(error, TunnelError::Actor(_) | TunnelError::Upgrade(_));
                return Err(SendFailed {
                    error,
                    request: (!written).then_some(request),
                });
            }
        };
        let client_side = hyper::upgrade::on(&mut request);
        let session = Session {
            proxy: self.clone(),
            actor: ActorKey::from_validated(actor),
            port,
            head,
            _slot: slot,
            relay: self.drain.relay(),
            hibernated: false,
        };
        tokio::spawn(async move {
            let mut session = session;
            let upgraded = tokio::select! {
                u = client_side => u,
                () = session.relay.draining() => return,
            };
            match upgraded {
                Ok(upgraded) => {
                    let client = WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        Role::Server,
                        Some(ws_config()),
                    )
                    .await;
                    session.run(client, Some(ws)).await;
                }
                Err(e) => tracing::debug!(error = %e, "client WebSocket upgrade failed"),
            }
        });
        let (mut parts, ()) = response.into_parts();
        if h2 {
            // HTTP/2: the stream itself is the upgrade (RFC 8441).
            parts.status = StatusCode::OK;
            parts.headers.remove(SEC_WEBSOCKET_ACCEPT);
            parts.headers.remove(header::CONTENT_LENGTH);
            strip_hop_by_hop(&mut parts.headers, false);
        }
        Ok(Response::from_parts(parts, RouterBody::empty()))
    }

    /// Opens one upstream leg: a marked tunnel, the upgrade request with `key`, and the actor's
    /// answer. Errors before the request was written are retryable on a fresh route.
    async fn open_leg(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        head: &Head,
        key: HeaderValue,
        resumed: bool,
    ) -> Result<Leg, TunnelError> {
        let io = self
            .tunnels
            .open_marked(route, actor, port, &head.request_id, true)
            .await?;
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake::<_, Empty<Bytes>>(io)
            .await
            .map_err(TunnelError::Actor)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "hibernating WebSocket leg ended");
            }
        });
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = head.uri.clone();
        *request.headers_mut() = head.headers.clone();
        request.headers_mut().insert(SEC_WEBSOCKET_KEY, key);
        if resumed {
            request
                .headers_mut()
                .insert(WEBSOCKET_RESUMED, HeaderValue::from_static("1"));
        }
        let mut response = sender
            .send_request(request)
            .await
            .map_err(TunnelError::Actor)?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Ok(Leg::Refused(response));
        }
        let upgraded = hyper::upgrade::on(&mut response)
            .await
            .map_err(TunnelError::Upgrade)?;
        let ws = WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Client,
            Some(ws_config()),
        )
        .await;
        let (parts, _) = response.into_parts();
        Ok(Leg::Open(Box::new(ws), Response::from_parts(parts, ())))
    }
}

/// The client's upgrade request as every upstream leg repeats it, with a new socket id.
fn head_of(request: &Request<Incoming>) -> Head {
    let mut headers = request.headers().clone();
    // The router speaks plain frames to both sides: no permessage-deflate.
    headers.remove(SEC_WEBSOCKET_EXTENSIONS);
    headers.remove(SEC_WEBSOCKET_KEY);
    let id = ate_core::request_id::hex_id(rand::random());
    if let Ok(id) = HeaderValue::from_bytes(&id) {
        headers.insert(WEBSOCKET_ID, id);
    }
    // The values and the target are slices of hyper's read buffer (8 KiB) for a request whose
    // route was cached: copied into one allocation of their own, so that a sleeping socket does
    // not keep that buffer alive.
    let mut copy = Request::new(());
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = headers;
    unshare_head(&mut copy);
    let (parts, ()) = copy.into_parts();
    Head {
        uri: parts.uri,
        headers: parts.headers,
        request_id: crate::tunnel::request_id_of(request).to_owned(),
    }
}

/// One client WebSocket and, while the actor is awake, its upstream leg.
struct Session {
    proxy: Arc<Proxy>,
    actor: ActorKey,
    port: u16,
    head: Arc<Head>,
    _slot: Slot,
    relay: Relay,
    /// Counted in [`WEBSOCKETS_HIBERNATED`].
    hibernated: bool,
}

/// How the session ends, as the close frame the client gets (none: the client is gone or
/// already closed).
type Ending = Option<CloseFrame>;

impl Session {
    async fn run(&mut self, mut client: Ws, first: Option<Box<Ws>>) {
        let mut upstream = first;
        let ending: Ending = loop {
            tokio::select! {
                message = client.next() => match message {
                    Some(Ok(message @ (Message::Text(_) | Message::Binary(_)))) => {
                        if let Err(close) = self.deliver(&mut upstream, message).await {
                            break Some(close);
                        }
                    }
                    // Pings are answered by the socket itself (even while the actor sleeps).
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                    Some(Ok(Message::Close(frame))) => {
                        if let Some(up) = upstream.as_mut() {
                            let _ = tokio::time::timeout(CLOSE_WAIT, WebSocketStream::close(up, frame)).await;
                        }
                        // Our reply to the client's close goes out with this flush.
                        let _ = tokio::time::timeout(CLOSE_WAIT, client.flush()).await;
                        break None;
                    }
                    Some(Err(e)) => {
                        tracing::debug!(actor = %self.actor, error = %e, "client WebSocket ended");
                        break self.close_upstream(&mut upstream, CloseCode::Away, "client went away").await;
                    }
                    None => break self.close_upstream(&mut upstream, CloseCode::Away, "client went away").await,
                },
                message = next_upstream(&mut upstream) => match message {
                    Some(Ok(message @ (Message::Text(_) | Message::Binary(_)))) => {
                        if client.send(message).await.is_err() {
                            break self.close_upstream(&mut upstream, CloseCode::Away, "client went away").await;
                        }
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                    Some(Ok(Message::Close(frame))) => {
                        if is_suspend(frame.as_ref()) {
                            // The actor is being suspended: our close reply goes out, the
                            // client's socket stays.
                            if let Some(up) = upstream.as_mut() {
                                let _ = tokio::time::timeout(CLOSE_WAIT, up.flush()).await;
                            }
                            self.set_hibernated(&mut upstream);
                        } else {
                            // The actor closed the socket itself: so does the client's.
                            break Some(frame.unwrap_or(CloseFrame {
                                code: CloseCode::Normal,
                                reason: "".into(),
                            }));
                        }
                    }
                    // The tunnel ended without a close frame (a suspend's cut, the worker gone,
                    // the actor's process ended): the next message finds out which.
                    Some(Err(_)) | None => self.set_hibernated(&mut upstream),
                },
                () = self.relay.draining() => {
                    let _ = self.close_upstream(&mut upstream, CloseCode::Away, "router restarting").await;
                    break Some(close_frame(CloseCode::Restart, "router restarting"));
                }
            }
        };
        if let Some(frame) = ending {
            let _ = tokio::time::timeout(CLOSE_WAIT, client.close(Some(frame))).await;
        }
        if self.hibernated {
            metrics::gauge!(WEBSOCKETS_HIBERNATED).decrement(1.0);
        }
    }

    fn set_hibernated(&mut self, upstream: &mut Option<Box<Ws>>) {
        *upstream = None;
        if !self.hibernated {
            self.hibernated = true;
            metrics::gauge!(WEBSOCKETS_HIBERNATED).increment(1.0);
        }
        tracing::debug!(actor = %self.actor, "WebSocket hibernated: the actor side is closed");
    }

    /// Sends the actor a close frame (best effort) and forgets the leg.
    async fn close_upstream(
        &mut self,
        upstream: &mut Option<Box<Ws>>,
        code: CloseCode,
        reason: &str,
    ) -> Ending {
        if let Some(mut up) = upstream.take() {
            let frame = close_frame(code, reason);
            let _ = tokio::time::timeout(CLOSE_WAIT, WebSocketStream::close(&mut up, Some(frame)))
                .await;
        }
        None
    }

    /// Delivers one client message, waking the actor first when its side is closed. A send on
    /// a leg that turns out closed (the suspend's close crossed this message) was not taken by
    /// the transport: it goes once more, on a new leg.
    async fn deliver(
        &mut self,
        upstream: &mut Option<Box<Ws>>,
        message: Message,
    ) -> Result<(), CloseFrame> {
        for _ in 0..2 {
            if upstream.is_none() {
                // Boxed: a wake (resolve, park, open a tunnel) is a large future, and it would
                // sit in every sleeping socket's task otherwise.
                *upstream = Some(Box::pin(self.wake()).await?);
                if self.hibernated {
                    self.hibernated = false;
                    metrics::gauge!(WEBSOCKETS_HIBERNATED).decrement(1.0);
                }
            }
            let Some(up) = upstream.as_mut() else {
                continue;
            };
            match up.send(message.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(actor = %self.actor, error = %e, "upstream WebSocket closed under a message; opening a new one");
                    self.set_hibernated(upstream);
                }
            }
        }
        Err(close_frame(
            CloseCode::Error,
            "actor unavailable: its WebSocket closed twice while a message was delivered",
        ))
    }

    /// Resumes the actor (the normal path: cache, single flight, parking) and opens a new
    /// upstream leg; a stale or unreachable route is resolved again within the parking budget.
    async fn wake(&self) -> Result<Box<Ws>, CloseFrame> {
        let proxy = &self.proxy;
        let actor = self.actor.as_str();
        let started = tokio::time::Instant::now();
        let mut backoff = crate::parking::backoff(proxy.resolver.retry_initial());
        let mut retries = 0u32;
        loop {
            let route = match proxy.resolver.resolve(actor, &self.head.request_id).await {
                Ok((route, _)) => route,
                Err(e) => {
                    metrics::counter!(WEBSOCKET_WAKES, "outcome" => "refused").increment(1);
                    return Err(close_for(&e));
                }
            };
            match proxy
                .open_leg(&route, actor, self.port, &self.head, websocket_key(), true)
                .await
            {
                Ok(Leg::Open(ws, _)) => {
                    metrics::counter!(WEBSOCKET_WAKES, "outcome" => "woken").increment(1);
                    return Ok(ws);
                }
                Ok(Leg::Refused(response)) => {
                    metrics::counter!(WEBSOCKET_WAKES, "outcome" => "refused").increment(1);
                    let reason = format!(
                        "actor answered the WebSocket upgrade with {}",
                        response.status()
                    );
                    return Err(close_frame(CloseCode::Error, &reason));
                }
                Err(e)
                    if e.retry_unsent()
                        && (retries == 0 || started.elapsed() < proxy.resolver.budget()) =>
                {
                    if retries > 0 {
                        tokio::time::sleep(backoff.next_delay(rand::random())).await;
                    }
                    retries += 1;
                    proxy.resolver.evict_stale(actor, &route);
                    proxy.tunnels.evict(actor, &route.worker);
                }
                Err(e) => {
                    metrics::counter!(WEBSOCKET_WAKES, "outcome" => "failed").increment(1);
                    tracing::info!(%actor, error = %e, "WebSocket wake failed");
                    return Err(close_frame(
                        CloseCode::Error,
                        &format!("actor unavailable: {e}"),
                    ));
                }
            }
        }
    }
}

/// The next message of the upstream leg; never, while there is none.
async fn next_upstream(
    upstream: &mut Option<Box<Ws>>,
) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
    match upstream {
        Some(up) => up.next().await,
        None => std::future::pending().await,
    }
}

/// atunnel's close for a suspend: 1001 "actor suspending".
fn is_suspend(frame: Option<&CloseFrame>) -> bool {
    frame.is_some_and(|f| f.code == CloseCode::Away && f.reason.as_str() == SUSPENDING_REASON)
}

/// What the client is told when its message could not wake the actor.
fn close_for(e: &ResolveError) -> CloseFrame {
    match e {
        // The actor is gone: a normal end.
        ResolveError::NotFound => close_frame(CloseCode::Normal, "actor deleted"),
        ResolveError::Crashed(_) | ResolveError::Missing(_) | ResolveError::Internal(_) => {
            close_frame(CloseCode::Error, &e.to_string())
        }
        // Capacity and control-plane trouble pass: the client may reconnect later.
        ResolveError::NoRoom
        | ResolveError::OverQuota(_)
        | ResolveError::ApiUnavailable
        | ResolveError::Busy(_)
        | ResolveError::AtCapacity
        | ResolveError::DecisionTimeout
        | ResolveError::DeadlineExceeded => close_frame(CloseCode::Again, &e.to_string()),
        ResolveError::PermissionDenied | ResolveError::Unauthenticated => {
            close_frame(CloseCode::Policy, &e.to_string())
        }
    }
}

/// A close frame with `reason` cut to what fits (at a character boundary).
fn close_frame(code: CloseCode, reason: &str) -> CloseFrame {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame {
        code,
        reason: reason[..end].to_owned().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sleeping socket holds its session's future: a wake's futures (resolve, tunnel,
    /// handshake) inline would make it tens of KiB.
    #[test]
    fn a_sleeping_socket_s_task_stays_small() {
        fn size_of_output<A, R>(_: impl FnOnce(A) -> R) -> usize {
            std::mem::size_of::<R>()
        }
        let task = size_of_output(|(mut s, c): (Session, Ws)| async move { s.run(c, None).await });
        println!("session task future: {task} bytes");
        assert!(task <= 4096, "session task future is {task} bytes");
    }

    #[test]
    fn limits_count_per_actor_and_in_all() {
        let sockets = Sockets::new(HibernateLimits {
            max: 3,
            per_actor: 2,
        });
        let a1 = sockets.admit("s/a").unwrap();
        let _a2 = sockets.admit("s/a").unwrap();
        let e = sockets.admit("s/a").err().unwrap();
        assert!(e.contains("--hibernate-websockets-per-actor=2"), "{e}");
        let _b1 = sockets.admit("s/b").unwrap();
        let e = sockets.admit("s/c").err().unwrap();
        assert!(e.contains("--hibernate-websockets-max=3"), "{e}");
        drop(a1);
        assert_eq!(sockets.open(), 2);
        let _c1 = sockets.admit("s/c").unwrap();
    }

    #[test]
    fn close_frames_fit_and_name_the_cause() {
        let long = "é".repeat(100);
        let f = close_frame(CloseCode::Error, &long);
        assert!(f.reason.len() <= MAX_REASON);
        assert_eq!(close_for(&ResolveError::NotFound).code, CloseCode::Normal);
        let crashed = close_for(&ResolveError::Crashed("probe timed out".into()));
        assert_eq!(crashed.code, CloseCode::Error);
        assert_eq!(crashed.reason.as_str(), "actor crashed: probe timed out");
        assert_eq!(close_for(&ResolveError::NoRoom).code, CloseCode::Again);
        assert!(is_suspend(Some(&close_frame(
            CloseCode::Away,
            "actor suspending"
        ))));
        assert!(!is_suspend(Some(&close_frame(CloseCode::Away, "bye"))));
        assert!(!is_suspend(None));
    }
}
