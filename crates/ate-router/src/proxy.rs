//! One client request: name the actor, resolve it, and forward through a tunnel. Plain requests
//! are forwarded as HTTP/1.1; WebSocket upgrades are relayed byte for byte; a WebSocket over
//! HTTP/2 (RFC 8441 extended CONNECT, `:protocol = websocket`) reaches the actor as an HTTP/1.1
//! upgrade and is relayed the same way; gRPC (HTTP/2 with `content-type: application/grpc*`) is
//! forwarded as HTTP/2 over the actor port's shared gRPC tunnel, so trailers pass through
//! untouched; a client `CONNECT host:port` opens a tunnel in which each HTTP/1.1 request is routed
//! on its own. Relays and client tunnels are registered with the [`Drain`].
//!
//! Every request gets an id ([`REQUEST_ID`]: the client's if acceptable, else a new one), which
//! the actor receives, the response carries, and the request's tracing span (`request_id`,
//! `actor`) holds around its resolution, parking and forwarding. A request the router answers
//! with an error of its own is logged in one line ([`log_failure`]); with `--access-log` every
//! request is a line of the access log.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use ate_core::{ACTIVATION_HEADER, TARGET_ACTOR_HEADER, TARGET_PORT_HEADER};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::ext::Protocol;
use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use tracing::Instrument;

use crate::access_log::{AccessLog, Entry};
use crate::actor_ref::{ActorKey, parse_port, parse_target};
use crate::body::RouterBody;
use crate::cache::Route;
use crate::drain::{Drain, spawn_pipe};
use crate::error::{ForwardError, RequestError, ResolveError, shown};
use crate::metrics::{
    FORWARD_SECONDS, REQUESTS, RESOLVE_SECONDS, STALE_RETRIES, Stats, status_label,
};
use crate::resolve::{Resolver, ResumeKind};
use crate::tunnel::{FailureKind, SendFailed, TunnelError, Tunnels};

/// Response header telling how the actor was found: `cold`, `warm` or `parked`.
pub const RESUME_HEADER: &str = "ate-resume";

/// The request's id, on the request to the actor and on every response (`x-request-id`).
pub const REQUEST_ID: HeaderName = HeaderName::from_static(ate_core::REQUEST_ID_HEADER);

/// Set on the HTTP/1.1 upgrade the router makes for an HTTP/2 WebSocket (RFC 6455 §4.1).
const SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// Headers that describe one hop and never cross the router (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// How a request crosses the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Http1,
    Upgrade,
    /// RFC 8441 extended CONNECT with `:protocol = websocket` (checked by the caller).
    H2WebSocket,
    Grpc,
}

impl Mode {
    fn of(request: &Request<Incoming>) -> Mode {
        if request.method() == Method::CONNECT && request.extensions().get::<Protocol>().is_some() {
            return Mode::H2WebSocket;
        }
        if request.version() == Version::HTTP_2 {
            let grpc = request
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
            return if grpc { Mode::Grpc } else { Mode::Http1 };
        }
        if request.headers().contains_key(header::UPGRADE)
            && has_token(request.headers(), header::CONNECTION, "upgrade")
        {
            return Mode::Upgrade;
        }
        Mode::Http1
    }
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub max_uri_len: usize,
    pub header_read_timeout: Duration,
    /// `--access-log`: one line per request.
    pub access_log: Option<AccessLog>,
}

/// What [`Proxy::forward`] measured, for the access log. Microseconds in `u32`s (`u32::MAX`:
/// not measured) rather than `Option<Duration>`s: every request future carries this twice.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Finding (or waking) the actor, again after a stale route included.
    resolve_us: u32,
    /// Sending the request to the actor until its response head (the last attempt).
    forward_us: u32,
    /// How the actor was found.
    pub kind: Option<ResumeKind>,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            resolve_us: u32::MAX,
            forward_us: u32::MAX,
            kind: None,
        }
    }
}

impl Timings {
    fn micros(d: Duration) -> u32 {
        u32::try_from(d.as_micros()).unwrap_or(u32::MAX - 1)
    }
    fn add_resolve(&mut self, d: Duration) {
        let before = if self.resolve_us == u32::MAX {
            0
        } else {
            self.resolve_us
        };
        self.resolve_us = before.saturating_add(Self::micros(d)).min(u32::MAX - 1);
    }
    fn duration(us: u32) -> Option<Duration> {
        (us != u32::MAX).then(|| Duration::from_micros(u64::from(us)))
    }
    /// Finding (or waking) the actor (every resolution of the request), if it was measured.
    pub fn resolve(&self) -> Option<Duration> {
        Self::duration(self.resolve_us)
    }
    /// Sending the request to the actor until its response head, if it was measured.
    pub fn forward(&self) -> Option<Duration> {
        Self::duration(self.forward_us)
    }
}

/// The answer [`Proxy::forward`] got for a request, with the actor it was given back.
pub struct Forwarded<A> {
    pub response: Response<RouterBody>,
    pub timings: Timings,
    pub actor: A,
}

/// What the router knows about a request from its start until its answer.
struct Begun {
    /// The request's id; the router's own copy, for the response.
    id: HeaderValue,
    /// The client's id was kept (it is already on the request); else `id` replaces it.
    kept: bool,
    /// The trace id on the request span (see `ate_tls::trace_context`), for the lines written
    /// after it: the failure line and the access log.
    trace_id: Option<ate_tls::trace_context::TraceId>,
    /// Only with the access log on (boxed: every request future carries this).
    access: Option<Box<AccessStart>>,
}

struct AccessStart {
    time: SystemTime,
    started: Instant,
    method: Method,
    path: String,
}

/// Why the router answered an error itself, beyond what the client is told (the worker, the
/// tunnel's error, an internal reason): a response extension, logged by [`log_failure`].
#[derive(Debug, Clone)]
struct Detail(String);

/// `response` with a [`Detail`] for the failure log.
fn with_detail(mut response: Response<RouterBody>, detail: String) -> Response<RouterBody> {
    response.extensions_mut().insert(Detail(detail));
    response
}

pub struct Proxy {
    resolver: Arc<Resolver>,
    tunnels: Arc<Tunnels>,
    drain: Arc<Drain>,
    cfg: ProxyConfig,
    stats: Arc<Stats>,
}

impl Proxy {
    pub fn new(
        resolver: Arc<Resolver>,
        tunnels: Arc<Tunnels>,
        drain: Arc<Drain>,
        cfg: ProxyConfig,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        Arc::new(Self {
            resolver,
            tunnels,
            drain,
            cfg,
            stats,
        })
    }

    /// The relays this proxy started, for the listener's drain.
    pub fn drain(&self) -> &Arc<Drain> {
        &self.drain
    }

    /// Called as hyper hands over an HTTP/1.x request head whose actor has no cached route (the
    /// request will call the api and may park): copies the header values and the target out of
    /// hyper's read buffer. They are slices of it, and while they live hyper cannot reuse that
    /// buffer, so the read it makes next (to notice a client that goes away) allocated a second
    /// 8 KiB buffer for every waiting request. Copied, the head costs a few dozen bytes and the
    /// read buffer is reused in place. Warm requests (cached route) are left as they are: they
    /// are forwarded at once.
    pub fn unshare_head_if_cold(&self, request: &mut Request<Incoming>) {
        if request.version() > Version::HTTP_11 {
            return; // HTTP/2 heads are decoded into their own memory.
        }
        let cold = match parse_target(request.headers().get(TARGET_ACTOR_HEADER)) {
            Ok(actor) => !self.resolver.cache.contains(actor),
            Err(_) => false, // answered at once
        };
        if cold {
            unshare_head(request);
        }
    }

    /// The hyper service of the ingress listener. Requests answered without an actor (bad target,
    /// client CONNECT) are answered here; the rest are forwarded.
    ///
    /// Not an `async fn`, nor is anything between here and [`Proxy::forward`]: every async layer
    /// that takes the request by value keeps its own copy of it in its future (~264 bytes), and
    /// hyper allocates this future's full size for every connection, parked ones included.
    pub fn handle(
        self: Arc<Self>,
        mut request: Request<Incoming>,
    ) -> impl Future<Output = Result<Response<RouterBody>, Infallible>> + Send + use<> {
        use futures::future::{Either, FutureExt, ready};
        let mut begun = self.begin(&mut request);
        let answer = match self.preflight(request) {
            Preflight::Forward(mut request, target, port) => {
                if !begun.kept {
                    request.headers_mut().insert(REQUEST_ID, begun.id.clone());
                }
                let span = request_span(&begun.id, &target);
                begun.trace_id = ate_tls::trace_context::continue_http(&span, request.headers());
                let forward = self.clone().forward(request, Target(target), port);
                Either::Left(forward.instrument(span).map(|f| {
                    let Target(actor) = f.actor;
                    (f.response, f.timings, Some(actor))
                }))
            }
            Preflight::Answer(response, target) => {
                Either::Right(ready((response, Timings::default(), target)))
            }
        };
        answer.map(move |(response, timings, actor)| {
            let actor = actor.as_ref().and_then(|a| a.to_str().ok());
            Ok(self.finish(response, begun, actor.unwrap_or_default(), timings))
        })
    }

    /// The request's id (see [`request_id`]) and, with the access log on, what its line needs
    /// from the request.
    fn begin(&self, request: &mut Request<Incoming>) -> Begun {
        let (id, kept) = request_id(request.headers());
        let access = self.cfg.access_log.as_ref().map(|_| {
            let uri = request.uri();
            // A CONNECT names an authority, not a path.
            let path = match (uri.path_and_query(), uri.authority()) {
                (Some(pq), _) => pq.path(),
                (None, Some(authority)) => authority.as_str(),
                (None, None) => "",
            };
            Box::new(AccessStart {
                time: SystemTime::now(),
                started: Instant::now(),
                method: request.method().clone(),
                path: path.to_owned(),
            })
        });
        Begun {
            id,
            kept,
            trace_id: None,
            access,
        }
    }

    /// Every answer ends here: the request counter, the failure line, the access log line, and
    /// the request's id on the response.
    fn finish(
        &self,
        mut response: Response<RouterBody>,
        begun: Begun,
        actor: &str,
        timings: Timings,
    ) -> Response<RouterBody> {
        let status = response.status();
        metrics::counter!(REQUESTS, "status" => status_label(status)).increment(1);
        let id = begun.id.to_str().unwrap_or_default();
        log_failure(&response, id, begun.trace_id, actor);
        if let (Some(log), Some(start)) = (&self.cfg.access_log, begun.access) {
            use hyper::body::Body as _;
            let start = *start;
            log.record(Entry {
                time: start.time,
                request_id: id.to_owned(),
                trace_id: begun.trace_id,
                actor: actor.to_owned(),
                method: start.method,
                path: start.path,
                status: status.as_u16(),
                resume: timings.kind.map(ResumeKind::header_value),
                duration: start.started.elapsed(),
                resolve: timings.resolve(),
                forward: timings.forward(),
                bytes: response.body().size_hint().exact(),
            });
        }
        response.headers_mut().insert(REQUEST_ID, begun.id);
        response
    }

    /// Checks the target and takes the routing headers out of `request` (they must not reach
    /// the actor): forward it to the actor and port they name, or answer at once.
    fn preflight(self: &Arc<Self>, mut request: Request<Incoming>) -> Preflight {
        let (target, targets) = take_header(request.headers_mut(), TARGET_ACTOR_HEADER);
        let (port, ports) = take_header(request.headers_mut(), TARGET_PORT_HEADER);
        request.headers_mut().remove(ACTIVATION_HEADER);
        let port = match self.check_routing(
            request.uri(),
            target.as_ref(),
            targets,
            port.as_ref(),
            ports,
        ) {
            Ok(port) => port,
            Err((status, body)) => {
                let valid = target.filter(|t| targets == 1 && parse_target(Some(t)).is_ok());
                return Preflight::Answer(text(status, body), valid);
            }
        };
        // Present: `check_routing` refuses a missing header.
        let target = target.unwrap_or_else(|| HeaderValue::from_static(""));
        if request.method() == Method::CONNECT {
            if let Some(protocol) = request.extensions().get::<Protocol>() {
                // RFC 8441: only WebSocket is bootstrapped over HTTP/2.
                if !protocol.as_str().eq_ignore_ascii_case("websocket") {
                    let body = format!(
                        "actor {}: extended CONNECT :protocol {} is not supported (only websocket)",
                        Target(target.clone()).as_ref(),
                        shown(protocol.as_str().as_bytes())
                    );
                    return Preflight::Answer(
                        text(StatusCode::NOT_IMPLEMENTED, body),
                        Some(target),
                    );
                }
                return Preflight::Forward(request, target, port.unwrap_or(80));
            }
            let response = self.client_connect(request, Target(target.clone()).as_ref(), port);
            return Preflight::Answer(response, Some(target));
        }
        Preflight::Forward(request, target, port.unwrap_or(80))
    }

    /// The routing headers of a request (already taken out of it) and its target length: the
    /// port asked for (`ate-target-port`, if any), or the status and body of the refusal.
    fn check_routing(
        &self,
        uri: &Uri,
        target: Option<&HeaderValue>,
        targets: usize,
        port: Option<&HeaderValue>,
        ports: usize,
    ) -> Result<Option<u16>, (StatusCode, String)> {
        let parsed = parse_target(target);
        let actor = parsed.ok();
        let refuse = |e: RequestError| (e.status(), e.body(actor, port.map(HeaderValue::as_bytes)));
        if uri_len(uri) > self.cfg.max_uri_len {
            let about = actor.map(|a| format!("actor {a}: ")).unwrap_or_default();
            let body = format!(
                "{about}request target longer than {} bytes",
                self.cfg.max_uri_len
            );
            return Err((StatusCode::URI_TOO_LONG, body));
        }
        // Two actor headers (an intermediary appending one, a client bug): guessing which one
        // is meant could send the request to the wrong actor.
        if targets > 1 {
            return Err(refuse(RequestError::DuplicateTarget));
        }
        if let Err(e) = parsed {
            return Err((StatusCode::NOT_FOUND, e.body(target)));
        }
        if ports > 1 {
            return Err(refuse(RequestError::DuplicatePort));
        }
        match port.map(parse_port) {
            None => Ok(None),
            Some(Ok(port)) => Ok(Some(port)),
            Some(Err(_)) => Err(refuse(RequestError::BadPort)),
        }
    }

    /// Resolves `actor` and forwards `request` (carrying its [`REQUEST_ID`]) to its `port`; a
    /// stale route is evicted, resolved again and retried once (the client never sees the 421).
    pub async fn forward<A: AsRef<str>>(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        actor: A,
        port: u16,
    ) -> Forwarded<A> {
        let mut timings = Timings::default();
        macro_rules! done {
            ($response:expr) => {{
                let response = $response;
                note_status(response.status());
                return Forwarded {
                    response,
                    timings,
                    actor,
                };
            }};
        }
        let name = actor.as_ref();
        let started = Instant::now();
        let found = self
            .resolver
            .resolve(name, id_of(&request))
            .instrument(ate_tls::trace_span!("resolve"))
            .await;
        timings.add_resolve(started.elapsed());
        let (mut route, mut kind) = match found {
            Ok(found) => found,
            Err(e) => done!(error_response(&e, name)),
        };
        timings.kind = Some(kind);
        note_kind(kind);
        metrics::histogram!(RESOLVE_SECONDS).record(started.elapsed().as_secs_f64());

        let mode = Mode::of(&request);
        prepare_request(&mut request, mode);
        // A bad route (stale, or its worker not answering) is evicted and resolved again at
        // once; when that gives the same unreachable worker (it is restarting, or fenced until
        // its node reconciles), the request waits like a parked one: retries with the parking
        // backoff until the parking budget from its start is spent.
        let mut retries = 0u32;
        let mut backoff = crate::parking::backoff(self.resolver.retry_initial());
        loop {
            let sent = Instant::now();
            // The actor (and atunnel, on a new tunnel) continue the trace from the request's
            // span. No span per attempt: it would sit in this (per connection) future.
            ate_tls::trace_context::inject_http(request.headers_mut());
            let result = match mode {
                Mode::Http1 => self.tunnels.send_h1(&route, name, port, request).await,
                Mode::Upgrade => self.upgrade(&route, name, port, request).await,
                Mode::H2WebSocket => self.h2_websocket(&route, name, port, request).await,
                Mode::Grpc => self.tunnels.send_grpc(&route, name, port, request).await,
            };
            timings.forward_us = Timings::micros(sent.elapsed());
            match result {
                Ok(response) => {
                    metrics::histogram!(FORWARD_SECONDS).record(sent.elapsed().as_secs_f64());
                    done!(finish_response(response, kind));
                }
                Err(SendFailed {
                    error,
                    request: Some(back),
                }) if error.route_is_bad()
                    && (retries == 0 || started.elapsed() < self.resolver.budget()) =>
                {
                    tracing::debug!(actor = %name, worker = %route.worker, %error, retries, "route is bad; resolving again");
                    if retries > 0 {
                        tokio::time::sleep(backoff.next_delay(rand::random())).await;
                    }
                    retries += 1;
                    self.stats.stale_retries.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(STALE_RETRIES).increment(1);
                    self.resolver.evict_stale(name, &route);
                    self.tunnels.evict(name, &route.worker);
                    let resolving = Instant::now();
                    let found = self
                        .resolver
                        .resolve(name, id_of(&back))
                        .instrument(ate_tls::trace_span!("resolve", retry = retries))
                        .await;
                    timings.add_resolve(resolving.elapsed());
                    match found {
                        Ok((r, k)) => {
                            route = r;
                            kind = kind.max(k);
                            timings.kind = Some(kind);
                            note_kind(kind);
                        }
                        Err(e) => done!(error_response(&e, name)),
                    }
                    request = back;
                }
                Err(failed) => {
                    // Boxed: only failed requests ask atunnel why, and the probe's future
                    // would otherwise sit in every request's future.
                    let (why, detail) = Box::pin(self.explain(&route, name, port, failed)).await;
                    let response = text(why.status(), why.body(name, port));
                    done!(with_detail(response, detail));
                }
            }
        }
    }

    /// What the client is told about a request that got no answer from the actor. A tunnel that
    /// ended after the request was written is either the actor's own doing or atunnel closing
    /// the actor's tunnels because its ingress went off (a suspend, a move): atunnel is asked
    /// whether the actor is still active there (a probe, nothing dialed) to tell the two apart.
    /// Also returns what the failure line logs beyond the client's text.
    async fn explain(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        failed: SendFailed<Request<Incoming>>,
    ) -> (ForwardError, String) {
        let error = failed.error;
        let why = match error.kind() {
            FailureKind::PortClosed => ForwardError::PortClosed,
            FailureKind::RouteBad if matches!(error, TunnelError::Stale) => ForwardError::NotServed,
            FailureKind::RouteBad => ForwardError::WorkerDown,
            // Written, then the tunnel broke: was it cut because ingress went off?
            FailureKind::Other
                if matches!(error, TunnelError::Actor(_)) && failed.request.is_none() =>
            {
                match self.tunnels.probe(route, actor, port).await {
                    Ok(false) => ForwardError::IngressClosed,
                    Ok(true) => ForwardError::ClosedByActor,
                    Err(probe) => {
                        tracing::debug!(%actor, error = %probe, "probe after a failed forward");
                        ForwardError::Tunnel
                    }
                }
            }
            FailureKind::Other => ForwardError::Tunnel,
        };
        (why, format!("worker {} port {port}: {error}", route.worker))
    }

    /// WebSocket (any HTTP/1.1 upgrade): forward the handshake on a fresh tunnel, then relay bytes.
    async fn upgrade(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        let id = crate::tunnel::request_id_of(&request);
        let mut conn = match self.tunnels.new_h1(route, actor, port, id).await {
            Ok(conn) => conn,
            Err(error) => {
                return Err(SendFailed {
                    error,
                    request: Some(request),
                });
            }
        };
        let client_side = hyper::upgrade::on(&mut request);
        let mut response = conn
            .sender
            .send_request(request)
            .await
            .map_err(|e| SendFailed {
                error: TunnelError::Actor(e),
                request: None,
            })?;
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let actor_side = hyper::upgrade::on(&mut response);
            spawn_pipe(self.drain.relay(), client_side, actor_side, "websocket");
        }
        Ok(response.map(RouterBody::from))
    }

    /// WebSocket over HTTP/2 (RFC 8441): the client's extended CONNECT (already shaped by
    /// [`prepare_request`] into an HTTP/1.1 upgrade) goes to the actor on a fresh tunnel; the
    /// actor's 101 becomes the client's 200 and the bytes are relayed between the HTTP/2 stream
    /// and the tunnel. Any other answer is passed back as it is, except a 2xx, which would open
    /// a stream the actor never agreed to (502).
    async fn h2_websocket(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        let id = crate::tunnel::request_id_of(&request);
        let mut conn = match self.tunnels.new_h1(route, actor, port, id).await {
            Ok(conn) => conn,
            Err(error) => {
                return Err(SendFailed {
                    error,
                    request: Some(request),
                });
            }
        };
        let client_side = hyper::upgrade::on(&mut request);
        let mut response = conn
            .sender
            .send_request(request)
            .await
            .map_err(|e| SendFailed {
                error: TunnelError::Actor(e),
                request: None,
            })?;
        let status = response.status();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let actor_side = hyper::upgrade::on(&mut response);
            spawn_pipe(
                self.drain.relay(),
                client_side,
                actor_side,
                "websocket over h2",
            );
            *response.status_mut() = StatusCode::OK;
            let headers = response.headers_mut();
            // HTTP/1.1-only handshake headers; the HTTP/2 stream itself is the upgrade.
            headers.remove(SEC_WEBSOCKET_ACCEPT);
            headers.remove(header::CONTENT_LENGTH);
            strip_hop_by_hop(headers, false);
            return Ok(response.map(RouterBody::from));
        }
        if status.is_success() {
            let why = ForwardError::UpgradeRefused;
            let detail = format!("the actor answered the WebSocket upgrade with {status}");
            return Ok(with_detail(
                text(why.status(), why.body(actor, port)),
                detail,
            ));
        }
        Ok(response.map(RouterBody::from))
    }

    /// Client `CONNECT host:port` with the actor header: answer 200, then serve the bytes inside as
    /// HTTP/1.1, routing (and resuming) each request independently to that port. An
    /// `ate-target-port` on the CONNECT must name the same port.
    fn client_connect(
        self: &Arc<Self>,
        request: Request<Incoming>,
        actor: &str,
        header_port: Option<u16>,
    ) -> Response<RouterBody> {
        let port = match request.uri().port_u16() {
            Some(port) if port != 0 => port,
            _ => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("actor {actor}: CONNECT needs host:port with a port from 1 to 65535"),
                );
            }
        };
        if let Some(header) = header_port.filter(|h| *h != port) {
            let e = RequestError::PortMismatch {
                header,
                connect: port,
            };
            return text(e.status(), e.body(Some(actor), None));
        }
        let actor = ActorKey::from_validated(actor);
        let proxy = self.clone();
        let on_upgrade = hyper::upgrade::on(request);
        // Registered before the 200 goes out, so a drain starting now still waits for it.
        let mut relay = self.drain.relay();
        tokio::spawn(async move {
            let upgraded = tokio::select! {
                upgraded = on_upgrade => match upgraded {
                    Ok(upgraded) => upgraded,
                    Err(e) => {
                        tracing::debug!(error = %e, "client CONNECT upgrade failed");
                        return;
                    }
                },
                () = relay.cut() => return,
            };
            let header_read_timeout = proxy.cfg.header_read_timeout;
            let service = service_fn(move |mut inner: Request<Incoming>| {
                let proxy = proxy.clone();
                let actor = actor.clone();
                async move {
                    let mut begun = proxy.begin(&mut inner);
                    if !begun.kept {
                        inner.headers_mut().insert(REQUEST_ID, begun.id.clone());
                    }
                    let span = request_span(&begun.id, actor.as_str());
                    begun.trace_id = ate_tls::trace_context::continue_http(&span, inner.headers());
                    let (response, timings) = proxy
                        .tunneled_request(inner, &actor, port)
                        .instrument(span)
                        .await;
                    Ok::<_, Infallible>(proxy.finish(response, begun, actor.as_str(), timings))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(upgraded, service)
                .with_upgrades();
            tokio::pin!(conn);
            // Like a client connection: on drain, close after the request in flight (at once
            // when idle); at the drain deadline, close regardless.
            let served = tokio::select! {
                served = conn.as_mut() => Some(served),
                () = relay.draining() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::select! {
                        served = conn.as_mut() => Some(served),
                        () = relay.cut() => None,
                    }
                }
            };
            match served {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "client CONNECT tunnel ended"),
                None => tracing::info!("drain deadline passed: client CONNECT tunnel closed"),
            }
        });
        Response::new(RouterBody::empty())
    }

    /// A request inside a client CONNECT: routed to the CONNECT's actor and port.
    async fn tunneled_request(
        self: &Arc<Self>,
        mut request: Request<Incoming>,
        actor: &ActorKey,
        port: u16,
    ) -> (Response<RouterBody>, Timings) {
        if request.method() == Method::CONNECT {
            let body = format!("actor {actor}: a CONNECT inside a CONNECT tunnel is not supported");
            return (text(StatusCode::BAD_REQUEST, body), Timings::default());
        }
        if uri_len(request.uri()) > self.cfg.max_uri_len {
            let body = format!(
                "actor {actor}: request target longer than {} bytes",
                self.cfg.max_uri_len
            );
            return (text(StatusCode::URI_TOO_LONG, body), Timings::default());
        }
        // The tunnel's actor and port apply to every request inside; these are dropped.
        request.headers_mut().remove(TARGET_ACTOR_HEADER);
        request.headers_mut().remove(TARGET_PORT_HEADER);
        request.headers_mut().remove(ACTIVATION_HEADER);
        let forwarded = self.clone().forward(request, actor.as_str(), port).await;
        (forwarded.response, forwarded.timings)
    }
}

/// Replaces every header value and the target by copies in one allocation of their own (see
/// [`Proxy::unshare_head_if_cold`]); a value or target that does not parse again stays as it was.
fn unshare_head<B>(request: &mut Request<B>) {
    use std::fmt::Write as _;
    let values: usize = request.headers().values().map(HeaderValue::len).sum();
    // The target as it was sent: `/path?query`, `scheme://authority/path` or `host:port`.
    let mut copy = bytes::BytesMut::with_capacity(uri_len(request.uri()) + 16 + values);
    let _ = write!(copy, "{}", request.uri());
    let target = copy.len();
    for value in request.headers().values() {
        copy.extend_from_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    if let Ok(uri) = Uri::from_maybe_shared(copy.slice(..target)) {
        *request.uri_mut() = uri;
    }
    let mut at = target;
    for value in request.headers_mut().values_mut() {
        let end = at + value.len();
        if let Ok(mut owned) = HeaderValue::from_maybe_shared(copy.slice(at..end)) {
            owned.set_sensitive(value.is_sensitive());
            *value = owned;
        }
        at = end;
    }
}

/// Removes every `name` header: the first value, and how many there were (no allocation).
fn take_header(headers: &mut HeaderMap, name: &str) -> (Option<HeaderValue>, usize) {
    let count = headers.get_all(name).iter().take(2).count();
    (headers.remove(name), count)
}

/// What [`Proxy::preflight`] decided.
enum Preflight {
    /// Forward the request (routing headers removed) to the actor of this `ate-target-actor`, at
    /// this port.
    Forward(Request<Incoming>, HeaderValue, u16),
    /// Answer at once; the request's `ate-target-actor` if it named one valid actor.
    Answer(Response<RouterBody>, Option<HeaderValue>),
}

/// The id of a request: the client's `x-request-id` when there is exactly one and it is
/// acceptable (1-128 printable ASCII characters, no space: `ate_core::request_id::is_valid`),
/// as the router's own copy (`true`: the request already carries it); else a new random 128-bit
/// id in hex (`false`: the caller puts it on the request, replacing the client's). One small
/// allocation either way; a copy of the client's value rather than a slice of it, which would
/// keep hyper's read buffer shared (and make hyper allocate a new one) until the response.
fn request_id(headers: &HeaderMap) -> (HeaderValue, bool) {
    let mut sent = headers.get_all(&REQUEST_ID).iter();
    if let (Some(value), None) = (sent.next(), sent.next())
        && ate_core::request_id::is_valid(value.as_bytes())
        && let Ok(own) =
            HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(value.as_bytes()))
    {
        return (own, true);
    }
    let id = ate_core::request_id::hex_id(rand::random());
    // One allocation, shared by the request and the response (clones are reference counts).
    let id = HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(id))
        .unwrap_or_else(|_| HeaderValue::from_static("0"));
    (id, false)
}

/// The request id a request carries (set before it is forwarded); empty if none.
fn id_of<B>(request: &Request<B>) -> &str {
    request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The span around one request's resolution, parking and forwarding (the root of the router's
/// part of a trace, or the child of a client's `traceparent`). `trace_id` is recorded by
/// `continue_http`; `status`, `resume` and the error status only when traces are on
/// ([`note_status`], [`note_kind`]).
fn request_span(id: &HeaderValue, actor: impl AsRef<[u8]>) -> tracing::Span {
    let actor = std::str::from_utf8(actor.as_ref()).unwrap_or_default();
    let request_id = id.to_str().unwrap_or_default();
    tracing::info_span!(
        "request",
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        actor = %actor,
        status = tracing::field::Empty,
        resume = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// The answer's status on the current request span (a server error marks the span failed).
fn note_status(status: StatusCode) {
    if ate_tls::trace_context::enabled() {
        let span = tracing::Span::current();
        span.record("status", status.as_u16());
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// How the actor was found (`ate-resume`: warm, cold, parked) on the current request span.
fn note_kind(kind: ResumeKind) {
    if ate_tls::trace_context::enabled() {
        tracing::Span::current().record("resume", kind.header_value());
    }
}

/// One line for a request the router answered with an error of its own (status 400 or more and
/// a body the router wrote; an actor's own error answers are not logged): warn for 5xx, info for
/// 4xx. Carries the request id, the trace id, the actor, the status, the client's text and the
/// [`Detail`]. (Written after the request span ended, so the ids are fields of the line.)
fn log_failure(
    response: &Response<RouterBody>,
    request_id: &str,
    trace_id: Option<ate_tls::trace_context::TraceId>,
    actor: &str,
) {
    let status = response.status();
    let RouterBody::Text(body) = response.body() else {
        return;
    };
    if status.as_u16() < 400 {
        return;
    }
    let error = body
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let error = error.trim_end();
    let detail = response.extensions().get::<Detail>().map(|d| d.0.as_str());
    let code = status.as_u16();
    let trace_id = trace_id.map(tracing::field::display);
    if status.is_server_error() {
        tracing::warn!(
            request_id,
            trace_id,
            actor,
            status = code,
            error,
            detail,
            "request failed"
        );
    } else {
        tracing::info!(
            request_id,
            trace_id,
            actor,
            status = code,
            error,
            detail,
            "request failed"
        );
    }
}

/// An `ate-target-actor` value that [`parse_target`] accepted, as the actor's `<atespace>/<name>`.
struct Target(HeaderValue);

impl AsRef<str> for Target {
    fn as_ref(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

fn uri_len(uri: &Uri) -> usize {
    uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len())
}

/// Does a comma-separated header contain `token` (case-insensitive)?
fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let mut named: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        if let Ok(value) = value.to_str() {
            for token in value.split(',') {
                let token = token.trim();
                if token.eq_ignore_ascii_case("keep-alive")
                    || token.eq_ignore_ascii_case("close")
                    || token.eq_ignore_ascii_case("upgrade")
                {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    named.push(name);
                }
            }
        }
    }
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        if keep_upgrade && (name == header::UPGRADE || name == header::CONNECTION) {
            continue;
        }
        headers.remove(name);
    }
}

/// Shapes the request for the tunnel. Host and `:authority` are never rewritten: an HTTP/2
/// client's `:authority` becomes the HTTP/1.1 `Host` the actor sees, as any h2→h1 proxy does.
fn prepare_request(request: &mut Request<Incoming>, mode: Mode) {
    match mode {
        Mode::Grpc => {
            let keep_te = request
                .headers()
                .get(header::TE)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
            strip_hop_by_hop(request.headers_mut(), false);
            if keep_te {
                request
                    .headers_mut()
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
        }
        Mode::Http1 | Mode::Upgrade | Mode::H2WebSocket => {
            let upgrade = mode == Mode::Upgrade;
            strip_hop_by_hop(request.headers_mut(), upgrade);
            if upgrade {
                request
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            }
            if mode == Mode::H2WebSocket {
                // RFC 8441 §5: the extended CONNECT becomes the RFC 6455 opening handshake.
                *request.method_mut() = Method::GET;
                request.extensions_mut().remove::<Protocol>();
                let headers = request.headers_mut();
                headers.remove(header::CONTENT_LENGTH);
                headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                headers.insert(SEC_WEBSOCKET_KEY, websocket_key());
            }
            if !request.headers().contains_key(header::HOST)
                && let Some(authority) = request.uri().authority()
                && let Ok(host) = HeaderValue::from_str(authority.as_str())
            {
                request.headers_mut().insert(header::HOST, host);
            }
            // HTTP/1.1 to the actor takes the origin form; Host carries the authority.
            if request.uri().scheme().is_some() || request.uri().authority().is_some() {
                let origin = request
                    .uri()
                    .path_and_query()
                    .cloned()
                    .map(Uri::from)
                    .unwrap_or_else(|| Uri::from_static("/"));
                *request.uri_mut() = origin;
            }
            *request.version_mut() = Version::HTTP_11;
        }
    }
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 §4.1).
fn websocket_key() -> HeaderValue {
    let key = base64_16(rand::random());
    HeaderValue::from_bytes(&key)
        .unwrap_or_else(|_| HeaderValue::from_static("AAAAAAAAAAAAAAAAAAAAAA=="))
}

/// Standard base64 (with padding) of 16 bytes.
fn base64_16(bytes: [u8; 16]) -> [u8; 24] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = [b'='; 24];
    for (i, chunk) in bytes.chunks(3).enumerate() {
        let byte = |k: usize| u32::from(chunk.get(k).copied().unwrap_or(0));
        let n = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        // A chunk of k bytes makes k + 1 characters; the rest of the group stays `=`.
        for j in 0..=chunk.len() {
            out[i * 4 + j] = ALPHABET[((n >> (18 - 6 * j)) & 63) as usize];
        }
    }
    out
}

fn finish_response(mut response: Response<RouterBody>, kind: ResumeKind) -> Response<RouterBody> {
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    strip_hop_by_hop(response.headers_mut(), switching);
    if switching {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    response
        .headers_mut()
        .insert(RESUME_HEADER, HeaderValue::from_static(kind.header_value()));
    response
}

pub fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<RouterBody> {
    let mut response = Response::new(RouterBody::text(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The answer to a request whose actor could not be found or woken; the failure line says why
/// (for an internal error, the reason the client is not shown).
fn error_response(error: &ResolveError, actor: &str) -> Response<RouterBody> {
    let body = error.body(actor);
    let response = if body.is_empty() {
        let mut response = Response::new(RouterBody::empty());
        *response.status_mut() = error.status();
        response
    } else {
        text(error.status(), body)
    };
    with_detail(response, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("app.example"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[header::HOST], "app.example");
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn websocket_keys_are_base64_of_16_bytes() {
        // RFC 6455 §1.3's sample nonce.
        assert_eq!(
            &base64_16(*b"the sample nonce"),
            b"dGhlIHNhbXBsZSBub25jZQ=="
        );
        assert_eq!(&base64_16([0xff; 16]), b"/////////////////////w==");
        assert_eq!(&base64_16([0; 16]), b"AAAAAAAAAAAAAAAAAAAAAA==");
        let (a, b) = (websocket_key(), websocket_key());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }

    #[test]
    fn unshared_heads_keep_every_value_and_target() {
        // As hyper parses a head: every value a slice of one buffer.
        let head = Bytes::from_static(b"v1v2secret/x?y=1");
        for target in [
            "/a/b?c=d",
            "http://app.example:8080/p?q",
            "agent.team:7000",
            "*",
            "/",
        ] {
            let mut request = Request::builder().uri(target).body(()).unwrap();
            let headers = request.headers_mut();
            headers.append(
                "x-a",
                HeaderValue::from_maybe_shared(head.slice(0..2)).unwrap(),
            );
            headers.append(
                "x-a",
                HeaderValue::from_maybe_shared(head.slice(2..4)).unwrap(),
            );
            let mut secret = HeaderValue::from_maybe_shared(head.slice(4..10)).unwrap();
            secret.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, secret);
            let before = request.uri().clone();
            unshare_head(&mut request);
            assert_eq!(request.uri(), &before, "{target}");
            assert_eq!(request.uri().to_string(), before.to_string(), "{target}");
            let a: Vec<_> = request.headers().get_all("x-a").iter().collect();
            assert_eq!(a, ["v1", "v2"]);
            let auth = &request.headers()[header::AUTHORIZATION];
            assert_eq!(auth, "secret");
            assert!(auth.is_sensitive());
            // No value points into the old buffer any more.
            let old = head.as_ptr_range();
            for value in request.headers().values() {
                assert!(!old.contains(&value.as_bytes().as_ptr()));
            }
        }
    }

    /// hyper allocates the service future's full size for every client connection (parked ones
    /// included): it was 9.4 KiB while the worker-connect and tunnel-open futures were inline.
    #[test]
    fn the_request_future_stays_small() {
        fn size_of_output<A, R>(_: impl FnOnce(A) -> R) -> usize {
            std::mem::size_of::<R>()
        }
        let handle = size_of_output(|(p, r): (Arc<Proxy>, Request<Incoming>)| p.handle(r));
        assert!(handle <= 2560, "request future is {handle} bytes");
    }

    #[test]
    fn upgrade_keeps_upgrade_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(has_token(&h, header::CONNECTION, "upgrade"));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::UPGRADE], "websocket");
    }
}
