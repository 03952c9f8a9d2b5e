//! The platform address inside an actor ([`PLATFORM_ADDR`]`:`[`PLATFORM_PORT`]): the egress
//! proxy hands it every connection there, and this serves HTTP/1.1 on it.
//!
//! - A request naming another actor (`ate-target-actor`, optionally `ate-target-port`, or a
//!   `Host`/absolute URI `<name>.<atespace>.actors.internal[:port]`) is a **call**: every
//!   `ate-caller-actor` the actor sent is removed, `ate-caller-actor: <atespace>/<name>` of the
//!   calling actor (known from the listener that accepted the connection, so it cannot be
//!   forged) is set, and the request is streamed to the router (`--router`) and its answer back.
//! - Anything else is the **local actor API** ([`LocalApi`]).
//!
//! Idle suspend: a request counts as open egress activity while it is in flight (until its
//! answer's body ends), never an idle keep-alive connection, so an actor that keeps a pooled
//! platform connection is still suspended when idle.

use std::convert::Infallible;
use std::net::SocketAddrV4;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ate_core::platform::{CALLER_ACTOR_HEADER, PLATFORM_ADDR, PLATFORM_PORT, target_from_host};
use ate_core::tunnel::{parse_port, split_actor_ref};
use ate_core::{ActorRef, TARGET_ACTOR_HEADER, TARGET_PORT_HEADER};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::proxy::{OpenGuard, Stats};
use ate_router_client::RouterClient;

/// A request's headers must arrive within this long of the connection waiting for one, so an
/// idle keep-alive connection is closed after it too (hyper starts the timer when it waits for
/// the next request). Longer than common clients' own pool idle times, so that a client rarely
/// reuses a connection just as the platform closes it.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request body the local API reads.
const LOCAL_BODY_LIMIT: usize = 1 << 20;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(super) type PlatformBody = BoxBody<Bytes, BoxError>;

/// Whether a redirected connection was meant for the platform.
pub(super) fn is_platform(dst: SocketAddrV4) -> bool {
    *dst.ip() == PLATFORM_ADDR && dst.port() == PLATFORM_PORT
}

/// The actor whose sandbox a proxy serves: who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorIdentity {
    pub atespace: String,
    pub name: String,
    /// The actor's uid (as in `/etc/ate/uid`).
    pub uid: String,
    /// The activation this sandbox runs (its alarm calls name it to the api).
    pub activation: u64,
}

impl ActorIdentity {
    /// `<atespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.atespace, self.name)
    }
}

/// A request to the local actor API (its body read in full, at most 1 MiB).
#[derive(Debug)]
pub struct LocalRequest {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The local API's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl LocalResponse {
    pub fn text(status: StatusCode, body: impl Into<String>) -> Self {
        LocalResponse {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: Bytes::from(body.into()),
        }
    }

    pub fn json(status: StatusCode, value: &serde_json::Value) -> Self {
        LocalResponse {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: Bytes::from(format!("{value}\n")),
        }
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }
}

/// The local actor API served at the platform address (`/v1/…`): a trait so that alarms,
/// keep-awake and the like can be served by whoever owns them later.
#[async_trait::async_trait]
pub trait LocalApi: Send + Sync + 'static {
    /// Answers `req` from `actor`.
    async fn serve(&self, actor: &ActorIdentity, req: LocalRequest) -> LocalResponse;
}

/// What every platform connection of the worker shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) router: Option<RouterClient>,
    pub(super) local: Arc<dyn LocalApi>,
}

/// One actor's side of the platform.
pub(super) struct Ctx {
    pub(super) actor: ActorIdentity,
    /// `<atespace>/<name>` as a header value.
    caller: HeaderValue,
    pub(super) shared: Shared,
    pub(super) stats: Arc<Stats>,
}

impl Ctx {
    pub(super) fn new(actor: ActorIdentity, shared: Shared, stats: Arc<Stats>) -> Option<Self> {
        let caller = HeaderValue::from_str(&actor.key()).ok()?;
        Some(Ctx {
            actor,
            caller,
            shared,
            stats,
        })
    }
}

/// The actor's connection: reset (RST) when dropped unless the connection ended normally, like
/// the proxy's spliced connections (teardown aborts the task before a dump).
struct ResetIo {
    stream: TcpStream,
    armed: bool,
}

impl Drop for ResetIo {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for ResetIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResetIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Serves one actor connection to the platform address until it closes.
pub(super) async fn serve(stream: TcpStream, ctx: Arc<Ctx>) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(ResetIo {
        stream,
        armed: true,
    });
    let key = ctx.actor.key();
    let svc = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(handle(&ctx, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(io, svc)
        .without_shutdown();
    match conn.await {
        Ok(parts) => parts.io.into_inner().armed = false,
        Err(e) => {
            tracing::debug!(target: "egress", actor = %key, error = %e, "platform connection ended")
        }
    }
}

/// A call's callee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    actor: String,
    port: Option<u16>,
}

/// How a request to the platform address is served.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    Call(Target),
    Local,
    /// A call that names its callee badly: 400 with this text.
    Bad(String),
}

/// The request's host: the absolute URI's authority, else the `Host` header.
fn request_host<B>(req: &Request<B>) -> Option<&str> {
    if let Some(a) = req.uri().authority() {
        return Some(a.as_str());
    }
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
}

/// Call or local API. An explicit `ate-target-actor` wins over an `actors.internal` host.
pub(super) fn route<B>(req: &Request<B>) -> Route {
    let h = req.headers();
    let mut targets = h.get_all(TARGET_ACTOR_HEADER).iter();
    if let Some(t) = targets.next() {
        if targets.next().is_some() {
            return Route::Bad(format!("more than one {TARGET_ACTOR_HEADER} header\n"));
        }
        let Some(actor) = t
            .to_str()
            .ok()
            .and_then(split_actor_ref)
            .map(|(s, n)| format!("{s}/{n}"))
        else {
            return Route::Bad(format!(
                "{TARGET_ACTOR_HEADER}: {:?} is not <atespace>/<name> (DNS-1123 labels)\n",
                String::from_utf8_lossy(t.as_bytes())
            ));
        };
        let mut ports = h.get_all(TARGET_PORT_HEADER).iter();
        let port = match (ports.next(), ports.next()) {
            (None, _) => None,
            (Some(p), None) => match parse_port(p.as_bytes()) {
                Some(p) => Some(p),
                None => {
                    return Route::Bad(format!(
                        "{TARGET_PORT_HEADER}: {:?} is not a port (1-65535)\n",
                        String::from_utf8_lossy(p.as_bytes())
                    ));
                }
            },
            (Some(_), Some(_)) => {
                return Route::Bad(format!("more than one {TARGET_PORT_HEADER} header\n"));
            }
        };
        return Route::Call(Target { actor, port });
    }
    match request_host(req).and_then(target_from_host) {
        Some((ActorRef { atespace, name }, port)) => Route::Call(Target {
            actor: format!("{atespace}/{name}"),
            port,
        }),
        None => Route::Local,
    }
}

/// Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1), plus whatever
/// the `Connection` header names.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
}

/// The call as the router must see it: the caller set by the platform (every value the actor
/// sent removed), the callee in `ate-target-actor`/`ate-target-port`, no hop-by-hop headers.
pub(super) fn rewrite_call(h: &mut HeaderMap, caller: &HeaderValue, target: &Target) {
    strip_hop_by_hop(h);
    h.remove(CALLER_ACTOR_HEADER);
    h.insert(CALLER_ACTOR_HEADER, caller.clone());
    // Only the api's deliveries carry it (the router keeps it on the internal listener).
    h.remove(ate_core::platform::ALARM_ATTEMPT_HEADER);
    if let Ok(v) = HeaderValue::from_str(&target.actor) {
        h.insert(TARGET_ACTOR_HEADER, v);
    }
    h.remove(TARGET_PORT_HEADER);
    if let Some(p) = target.port {
        h.insert(TARGET_PORT_HEADER, HeaderValue::from(p));
    }
}

fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT || req.headers().contains_key(header::UPGRADE)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<PlatformBody> {
    let mut resp = Response::new(full(Bytes::from(body.into())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn full(b: Bytes) -> PlatformBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

async fn handle(ctx: &Ctx, req: Request<Incoming>) -> Response<PlatformBody> {
    // In flight from here until the answer's body ends: idle suspend waits for it.
    let open = OpenGuard::new(ctx.stats.clone());
    let resp = match route(&req) {
        Route::Bad(msg) => text(StatusCode::BAD_REQUEST, msg),
        Route::Call(target) => call(ctx, req, target).await,
        Route::Local => local(ctx, req).await,
    };
    resp.map(|body| Counted { body, _open: open }.boxed())
}

async fn call(ctx: &Ctx, req: Request<Incoming>, target: Target) -> Response<PlatformBody> {
    if is_upgrade(&req) {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            "WebSocket, CONNECT and other upgrades are not supported on calls between actors yet\n",
        );
    }
    let Some(router) = &ctx.shared.router else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "actor calls are not configured on this worker (--router)\n",
        );
    };
    let (mut parts, body) = req.into_parts();
    rewrite_call(&mut parts.headers, &ctx.caller, &target);
    tracing::debug!(target: "egress", actor = %ctx.actor.key(), callee = %target.actor, method = %parts.method, path = %parts.uri.path(), "actor call");
    match router.send(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(BoxError::from).boxed())
        }
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                source = s.source();
            }
            tracing::info!(target: "egress", actor = %ctx.actor.key(), callee = %target.actor, router = %router.addr(), error = %msg, "actor call: router unreachable");
            text(
                StatusCode::BAD_GATEWAY,
                format!(
                    "call to {}: the router ({}) did not answer: {msg}\n",
                    target.actor,
                    router.addr()
                ),
            )
        }
    }
}

async fn local(ctx: &Ctx, req: Request<Incoming>) -> Response<PlatformBody> {
    if is_upgrade(&req) {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            "upgrades are not supported by the local actor API\n",
        );
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, LOCAL_BODY_LIMIT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body: {e} (the local actor API reads at most {LOCAL_BODY_LIMIT} bytes)\n"
                ),
            );
        }
    };
    let answer = ctx
        .shared
        .local
        .serve(
            &ctx.actor,
            LocalRequest {
                method: parts.method,
                path: parts.uri.path().to_string(),
                query: parts.uri.query().map(str::to_string),
                headers: parts.headers,
                body,
            },
        )
        .await;
    let mut resp = Response::new(full(answer.body));
    *resp.status_mut() = answer.status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(answer.content_type),
    );
    for (k, v) in answer.headers {
        h.append(k, v);
    }
    resp
}

/// A response body that keeps its request counted as open until it ends or is dropped.
struct Counted {
    body: PlatformBody,
    _open: OpenGuard,
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn req(uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request")
    }

    fn call(actor: &str, port: Option<u16>) -> Route {
        Route::Call(Target {
            actor: actor.into(),
            port,
        })
    }

    #[test]
    fn routes() {
        assert_eq!(route(&req("/v1/identity", &[])), Route::Local);
        assert_eq!(
            route(&req("/v1/identity", &[("host", "169.254.17.1")])),
            Route::Local
        );
        assert_eq!(
            route(&req("/x", &[("ate-target-actor", "billing/ledger")])),
            call("billing/ledger", None)
        );
        assert_eq!(
            route(&req(
                "/x",
                &[
                    ("ate-target-actor", "billing/ledger"),
                    ("ate-target-port", "8080")
                ]
            )),
            call("billing/ledger", Some(8080))
        );
        assert_eq!(
            route(&req("/x", &[("host", "ledger.billing.actors.internal:81")])),
            call("billing/ledger", Some(81))
        );
        assert_eq!(
            route(&req("http://ledger.billing.actors.internal/x", &[])),
            call("billing/ledger", None)
        );
        // The header wins over the host.
        assert_eq!(
            route(&req(
                "/x",
                &[
                    ("host", "ledger.billing.actors.internal"),
                    ("ate-target-actor", "web/front")
                ]
            )),
            call("web/front", None)
        );
        for bad in [
            vec![("ate-target-actor", "nope")],
            vec![("ate-target-actor", "a/b"), ("ate-target-actor", "a/c")],
            vec![("ate-target-actor", "a/b"), ("ate-target-port", "0")],
        ] {
            assert!(matches!(route(&req("/x", &bad)), Route::Bad(_)), "{bad:?}");
        }
    }

    #[test]
    fn a_call_carries_the_platforms_caller_only() {
        let mut h = HeaderMap::new();
        h.append(CALLER_ACTOR_HEADER, HeaderValue::from_static("evil/forged"));
        h.append(CALLER_ACTOR_HEADER, HeaderValue::from_static("evil/again"));
        h.insert(TARGET_PORT_HEADER, HeaderValue::from_static("9999"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        let caller = HeaderValue::from_static("web/front-1");
        rewrite_call(
            &mut h,
            &caller,
            &Target {
                actor: "billing/ledger".into(),
                port: None,
            },
        );
        let all: Vec<_> = h.get_all(CALLER_ACTOR_HEADER).iter().collect();
        assert_eq!(all, vec![&caller]);
        assert_eq!(h[TARGET_ACTOR_HEADER], "billing/ledger");
        assert!(!h.contains_key(TARGET_PORT_HEADER));
        assert!(!h.contains_key(header::CONNECTION));
        assert!(!h.contains_key("x-hop"));
        assert_eq!(h["x-kept"], "1");

        rewrite_call(
            &mut h,
            &caller,
            &Target {
                actor: "billing/ledger".into(),
                port: Some(8080),
            },
        );
        assert_eq!(h[TARGET_PORT_HEADER], "8080");
    }

    #[test]
    fn the_platform_destination() {
        assert!(is_platform(SocketAddrV4::new(PLATFORM_ADDR, 80)));
        assert!(!is_platform(SocketAddrV4::new(PLATFORM_ADDR, 81)));
        assert!(!is_platform(SocketAddrV4::new(
            Ipv4Addr::new(169, 254, 169, 254),
            80
        )));
    }
}
