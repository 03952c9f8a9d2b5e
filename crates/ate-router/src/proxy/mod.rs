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

mod headers;
mod hibernate;
mod observe;
mod upgrade;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use ate_core::{ACTIVATION_HEADER, TARGET_ACTOR_HEADER, TARGET_PORT_HEADER};
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::ext::Protocol;
use tracing::Instrument;

use crate::access_log::{AccessLog, Entry};
use crate::actor_ref::{parse_port, parse_target};
use crate::auth::{ConnAuth, IngressAuth, IngressAuthMode};
use crate::body::RouterBody;
use crate::cache::Route;
use crate::callers::{ALARM_ATTEMPT, CALLER, Caller, CallerPolicy, Decision, Verdict};
use crate::drain::Drain;
use crate::error::{ForwardError, RequestError, shown};
use crate::metrics::{RequestMetrics, STALE_RETRIES, Stats};
use crate::resolve::{Resolver, ResumeKind};
use crate::tunnel::{FailureKind, SendFailed, TunnelError, Tunnels};

use headers::{
    Mode, finish_response, id_of, prepare_request, request_id, take_header, unshare_head, uri_len,
};
pub use hibernate::{
    HibernateLimits, Sockets, WEBSOCKET_WAKES, WEBSOCKETS_HIBERNATED, WEBSOCKETS_OPEN,
};
pub use observe::{Timings, text};
use observe::{
    error_response, log_failure, note_kind, note_status, request_span, request_span_for,
    with_detail,
};

/// Response header telling how the actor was found: `cold`, `warm` or `parked`.
pub const RESUME_HEADER: &str = "ate-resume";
/// [`RESUME_HEADER`] as a header name, made once: a `&str` name that is not a standard header
/// is copied into a new allocation on every insert.
const RESUME: HeaderName = HeaderName::from_static(RESUME_HEADER);

/// The request's id, on the request to the actor and on every response (`x-request-id`).
pub const REQUEST_ID: HeaderName = HeaderName::from_static(ate_core::REQUEST_ID_HEADER);

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub max_uri_len: usize,
    pub header_read_timeout: Duration,
    /// `--access-log`: one line per request.
    pub access_log: Option<AccessLog>,
    /// `--ingress-auth-mode`: who may send requests.
    pub auth: Arc<IngressAuth>,
    /// Which actors may call which (requests from a worker's internal connection).
    pub callers: Arc<dyn CallerPolicy>,
    /// How many hibernating WebSockets the router terminates (docs/websockets.md).
    pub hibernate: HibernateLimits,
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
    /// The trace id on the request span (see `ate_telemetry::trace_context`), for the lines written
    /// after it: the failure line and the access log.
    trace_id: Option<ate_telemetry::trace_context::TraceId>,
    /// Only with the access log on (boxed: every request future carries this).
    access: Option<Box<AccessStart>>,
}

struct AccessStart {
    time: SystemTime,
    started: Instant,
    method: Method,
    path: String,
    /// The calling actor, for a call from another actor (set once the request is admitted).
    caller: Option<String>,
}

pub struct Proxy {
    resolver: Arc<Resolver>,
    tunnels: Arc<Tunnels>,
    drain: Arc<Drain>,
    cfg: ProxyConfig,
    stats: Arc<Stats>,
    metrics: RequestMetrics,
    /// The client WebSockets terminated here for hibernating actors.
    sockets: Arc<Sockets>,
}

impl Proxy {
    pub fn new(
        resolver: Arc<Resolver>,
        tunnels: Arc<Tunnels>,
        drain: Arc<Drain>,
        cfg: ProxyConfig,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        let sockets = Sockets::new(cfg.hibernate);
        Arc::new(Self {
            resolver,
            tunnels,
            drain,
            cfg,
            stats,
            metrics: RequestMetrics::new(),
            sockets,
        })
    }

    /// The relays this proxy started, for the listener's drain.
    pub fn drain(&self) -> &Arc<Drain> {
        &self.drain
    }

    /// The hibernating WebSockets terminated here.
    pub fn sockets(&self) -> &Arc<Sockets> {
        &self.sockets
    }

    /// Whether the request names an actor with no cached route (it will call the api and may
    /// park). Such an HTTP/1.x head has its header values and target copied out of hyper's read
    /// buffer: they are slices of it, and while they live hyper cannot reuse that buffer, so the
    /// read it makes next (to notice a client that goes away) allocated a second 8 KiB buffer for
    /// every waiting request. Copied, the head costs a few dozen bytes and the read buffer is
    /// reused in place. Warm requests (cached route) are left as they are: they are forwarded at
    /// once. Runs as hyper hands over the head, before it reads the socket again.
    fn unshare_head_if_cold(&self, request: &mut Request<Incoming>) -> bool {
        let cold = match parse_target(request.headers().get(TARGET_ACTOR_HEADER)) {
            Ok(actor) => !self.resolver.cache.contains(actor),
            Err(_) => false, // answered at once
        };
        // HTTP/2 heads are decoded into their own memory.
        if cold && request.version() <= Version::HTTP_11 {
            unshare_head(request);
        }
        cold
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
        let cold = self.unshare_head_if_cold(&mut request);
        let mut begun = self.begin(&mut request);
        let preflight = match self.authenticate(&mut request) {
            Ok(()) => {
                begun.note_caller(&request);
                self.preflight(request)
            }
            Err(response) => Preflight::Answer(*response, None),
        };
        let answer = match preflight {
            Preflight::Forward(mut request, target, port) => {
                if !begun.kept {
                    request.headers_mut().insert(REQUEST_ID, begun.id.clone());
                }
                let span = if cold || wants_span(&request) {
                    request_span(&begun.id, &target)
                } else {
                    tracing::Span::none()
                };
                begun.trace_id =
                    ate_telemetry::trace_context::continue_http(&span, request.headers());
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
                caller: None,
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
        self.metrics.answered(status);
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
                caller: start.caller,
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

    /// The ingress policy ([`crate::auth`]), before anything else about the request is looked
    /// at: an unauthenticated client learns nothing about actors (not even a 404). In jwt mode
    /// the token's header is removed here, so it never reaches the actor. A worker's internal
    /// connection skips the policy; its request must name one valid caller, which moves from
    /// the header into a [`Caller`] extension (else 400).
    fn authenticate(
        &self,
        request: &mut Request<Incoming>,
    ) -> Result<(), Box<Response<RouterBody>>> {
        let conn = request
            .extensions()
            .get::<ConnAuth>()
            .copied()
            .unwrap_or(ConnAuth::Plain);
        if conn == ConnAuth::Worker {
            return match Caller::take(request.headers_mut()) {
                Ok(caller) => {
                    request.extensions_mut().insert(caller);
                    Ok(())
                }
                Err(e) => {
                    let about = parse_target(request.headers().get(TARGET_ACTOR_HEADER))
                        .map(|a| format!("actor {a}: "))
                        .unwrap_or_default();
                    Err(Box::new(text(
                        StatusCode::BAD_REQUEST,
                        format!("{about}{e}"),
                    )))
                }
            };
        }
        let auth = &self.cfg.auth;
        if auth.mode() == IngressAuthMode::None {
            return Ok(());
        }
        let atespace = parse_target(request.headers().get(TARGET_ACTOR_HEADER))
            .ok()
            .and_then(|actor| actor.split_once('/'))
            .map(|(atespace, _)| atespace.to_owned());
        match auth.check(request.headers_mut(), conn, atespace.as_deref()) {
            Ok(_) => Ok(()),
            Err(refusal) => {
                metrics::counter!(crate::metrics::INGRESS_REFUSED, "status" => refusal.status.as_str().to_owned())
                    .increment(1);
                Err(Box::new(
                    refusal.response(auth.mode() == IngressAuthMode::Jwt),
                ))
            }
        }
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
        // A call from another actor: the policy first, so that a denied call wakes nobody. On
        // every path (CONNECT-inner too) requests reach the actor through here. (No `let` at
        // this level: its storage would stay in the future across every later await.)
        if let Some(decision) = self.decide_call(&request, name) {
            let verdict = match decision {
                Decision::Ready(verdict) => verdict,
                Decision::Pending(verdict) => verdict.await,
            };
            crate::callers::count(&verdict);
            match verdict {
                Verdict::Denied(rule) => {
                    if let Some(caller) = request.extensions().get::<Caller>() {
                        let body = crate::callers::denied_body(name, caller, &rule);
                        done!(text(StatusCode::FORBIDDEN, body));
                    }
                }
                Verdict::Unavailable(why) => {
                    done!(text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("actor {name}: {why}")
                    ));
                }
                Verdict::Allowed => {}
            }
        }
        let started = Instant::now();
        let found = self
            .resolver
            .resolve(name, id_of(&request))
            .instrument(ate_telemetry::trace_span!("resolve"))
            .await;
        timings.add_resolve(started.elapsed());
        let (mut route, mut kind) = match found {
            Ok(found) => found,
            Err(e) => done!(error_response(&e, name)),
        };
        timings.kind = Some(kind);
        note_kind(kind);
        self.metrics.resolved(started.elapsed());

        let mode = Mode::of(&request);
        prepare_request(&mut request, mode);
        set_caller_header(&mut request);
        // A bad route (stale, or its worker not answering), or a tunnel that broke before the
        // request was written, is evicted and resolved again at once; when that gives the same
        // unreachable worker (it is restarting, or fenced until its node reconciles), the
        // request waits like a parked one: retries with the parking backoff until the parking
        // budget from its start is spent. A request that was written is never sent twice.
        let mut retries = 0u32;
        let mut backoff = crate::parking::backoff(self.resolver.retry_initial());
        loop {
            let sent = Instant::now();
            // The actor (and atunnel, on a new tunnel) continue the trace from the request's
            // span. No span per attempt: it would sit in this (per connection) future.
            ate_telemetry::trace_context::inject_http(request.headers_mut());
            let result = match mode {
                Mode::Http1 => self.tunnels.send_h1(&route, name, port, request).await,
                Mode::Upgrade => self.upgrade(&route, name, port, request).await,
                Mode::H2WebSocket => self.h2_websocket(&route, name, port, request).await,
                Mode::Grpc => self.tunnels.send_grpc(&route, name, port, request).await,
            };
            timings.forward_us = Timings::micros(sent.elapsed());
            match result {
                Ok(response) => {
                    self.metrics.forwarded(sent.elapsed());
                    done!(finish_response(response, kind));
                }
                Err(SendFailed {
                    error,
                    request: Some(back),
                }) if error.retry_unsent()
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
                    // A warm request has no span of its own (see `wants_span`); resolving
                    // again may call the api and log, so it gets one now.
                    let outer = if tracing::Span::current().is_none() {
                        request_span_for(&back, name)
                    } else {
                        tracing::Span::none()
                    };
                    // Boxed: a retry is rare, and its spans would sit in every request's future.
                    let found = Box::pin(
                        self.resolver
                            .resolve(name, id_of(&back))
                            .instrument(ate_telemetry::trace_span!("resolve", retry = retries))
                            .instrument(outer),
                    )
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
}

/// Whether a request to be forwarded whose route is cached gets its span. The span is for the
/// trace (when traces are exported), for debug lines, and for the lines a request writes while
/// its actor is found or woken (a failed ResumeActor, parking), which only a request without a
/// cached route does (it always gets one); a warm HTTP/1.1 request writes none, and a span costs
/// it ~5 allocations (its fields formatted for the log layer, a registry slot) and ~5 % of its
/// CPU. A warm request whose route turns out bad gets one when it resolves again (see
/// `Proxy::forward`).
fn wants_span(request: &Request<Incoming>) -> bool {
    ate_telemetry::trace_context::enabled()
        || tracing::enabled!(tracing::Level::DEBUG)
        || Mode::of(request) != Mode::Http1
}

impl Begun {
    /// With the access log on, the request's caller (a call from another actor).
    fn note_caller<B>(&mut self, request: &Request<B>) {
        if let Some(access) = self.access.as_mut() {
            access.caller = request
                .extensions()
                .get::<Caller>()
                .map(|c| c.as_str().to_owned());
        }
    }
}

impl Proxy {
    /// The caller policy's decision when `request` is a call from another actor.
    fn decide_call<B>(&self, request: &Request<B>, callee: &str) -> Option<Decision> {
        let caller = request.extensions().get::<Caller>()?;
        Some(self.cfg.callers.decide(caller, callee))
    }
}

/// The one place `ate-caller-actor` is set on a forwarded request, for every path (plain, TLS,
/// CONNECT-inner, upgrades, gRPC): whatever a client sent is dropped, and only a caller a worker
/// named (the [`Caller`] extension) is put back. `ate-alarm-attempt` likewise survives only on
/// requests of the internal listeners (the api's alarm deliveries; workers drop it from their
/// actors' calls).
fn set_caller_header<B>(request: &mut Request<B>) {
    let caller = request
        .extensions()
        .get::<Caller>()
        .map(|c| c.header_value().clone());
    let headers = request.headers_mut();
    headers.remove(CALLER);
    match caller {
        Some(caller) => {
            headers.insert(CALLER, caller);
        }
        None => {
            headers.remove(ALARM_ATTEMPT);
        }
    }
}

/// What [`Proxy::preflight`] decided.
enum Preflight {
    /// Forward the request (routing headers removed) to the actor of this `ate-target-actor`, at
    /// this port.
    Forward(Request<Incoming>, HeaderValue, u16),
    /// Answer at once; the request's `ate-target-actor` if it named one valid actor.
    Answer(Response<RouterBody>, Option<HeaderValue>),
}

/// An `ate-target-actor` value that [`parse_target`] accepted, as the actor's `<atespace>/<name>`.
struct Target(HeaderValue);

impl AsRef<str> for Target {
    fn as_ref(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
