//! Fixtures on real 127.0.0.1 sockets: a scripted ResumeActor gRPC server, a test atunnel (h2c,
//! CONNECT per docs/tunnel-protocol.md) that pipes to small HTTP/1.1 upstreams, and a router.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_router::{Probe, Router, RouterConfig, Stats};
pub use ate_test_support::scripted_api::{Reply, ScriptedApi};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tonic::Status;

// ---------------------------------------------------------------------------------------------
// Upstream: an HTTP/1.1 echo server standing in for an actor's port

/// The head of an upgrade request as the actor saw it.
#[derive(Debug, Clone)]
pub struct SeenUpgrade {
    pub method: http::Method,
    pub uri: String,
    pub version: http::Version,
    pub headers: http::HeaderMap,
}

#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    pub connections: Arc<AtomicUsize>,
    /// Every WebSocket upgrade request, in order.
    pub upgrades: Arc<Mutex<Vec<SeenUpgrade>>>,
}

/// Replies `name=<name>\nhost=<Host>\ncount=<n>\n`, one `header <k>: <v>` line per header, then
/// `body=<body>` (`/slow` after 100 ms, `/sleep/<ms>` after that long). A WebSocket upgrade gets
/// a 101 (echoing `sec-websocket-protocol`) and then raw bytes are echoed; an upgrade to
/// `/refuse` gets a 403, to `/plain` a 200 that switches nothing. gRPC requests (HTTP/2,
/// `application/grpc`) get [`grpc_echo`].
pub async fn start_upstream(name: &'static str) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let upgrades = Arc::new(Mutex::new(Vec::new()));
    let up = Upstream {
        addr,
        requests: requests.clone(),
        connections: connections.clone(),
        upgrades: upgrades.clone(),
    };
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            connections.fetch_add(1, Ordering::SeqCst);
            let requests = requests.clone();
            let upgrades = upgrades.clone();
            let service = service_fn(move |mut req: Request<Incoming>| {
                let requests = requests.clone();
                let upgrades = upgrades.clone();
                async move {
                    let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
                    if req
                        .headers()
                        .get("upgrade")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
                    {
                        upgrades.lock().unwrap().push(SeenUpgrade {
                            method: req.method().clone(),
                            uri: req.uri().to_string(),
                            version: req.version(),
                            headers: req.headers().clone(),
                        });
                        match req.uri().path() {
                            "/refuse" => {
                                let resp = Response::builder()
                                    .status(StatusCode::FORBIDDEN)
                                    .body(EchoBody::Full(Full::new(Bytes::from(
                                        "no websocket here",
                                    ))))
                                    .unwrap();
                                return Ok::<_, Infallible>(resp);
                            }
                            "/plain" => {
                                let resp = Response::new(EchoBody::Full(Full::new(Bytes::from(
                                    "just a page",
                                ))));
                                return Ok(resp);
                            }
                            _ => {}
                        }
                        let on = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            if let Ok(up) = on.await {
                                let (mut r, mut w) = tokio::io::split(TokioIo::new(up));
                                let _ = tokio::io::copy(&mut r, &mut w).await;
                            }
                        });
                        let mut resp = Response::builder()
                            .status(StatusCode::SWITCHING_PROTOCOLS)
                            .header("upgrade", "websocket")
                            .header("connection", "Upgrade")
                            .header("sec-websocket-accept", "not-checked-by-these-tests")
                            .body(EchoBody::Full(Full::new(Bytes::new())))
                            .unwrap();
                        if let Some(p) = req.headers().get("sec-websocket-protocol") {
                            resp.headers_mut()
                                .insert("sec-websocket-protocol", p.clone());
                        }
                        return Ok(resp);
                    }
                    if req
                        .headers()
                        .get("content-type")
                        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
                    {
                        return Ok(grpc_echo(req, name).await);
                    }
                    if req.uri().path() == "/slow" {
                        // Holds the request so that a test has many in flight at once.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    if let Some(ms) = req
                        .uri()
                        .path()
                        .strip_prefix("/sleep/")
                        .and_then(|ms| ms.parse().ok())
                    {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    let mut text = format!("name={name}\n");
                    let host = req
                        .headers()
                        .get("host")
                        .map(|h| h.to_str().unwrap_or("?").to_string())
                        .unwrap_or_default();
                    text.push_str(&format!("host={host}\ncount={n}\npath={}\n", req.uri()));
                    for (k, v) in req.headers() {
                        text.push_str(&format!("header {k}: {}\n", v.to_str().unwrap_or("?")));
                    }
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    text.push_str(&format!("body={}", String::from_utf8_lossy(&body)));
                    Ok(Response::new(EchoBody::Full(Full::new(Bytes::from(text)))))
                }
            });
            tokio::spawn(async move {
                // HTTP/1.1 and HTTP/2 (gRPC arrives as HTTP/2 over the tunnel).
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    up
}

type Frames =
    futures::stream::Iter<std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, Infallible>>>;

type Channel =
    futures::channel::mpsc::UnboundedReceiver<Result<hyper::body::Frame<Bytes>, Infallible>>;

/// Body of the upstream's answers: plain, data followed by trailers (gRPC), or frames sent as
/// they are made (streaming gRPC).
pub enum EchoBody {
    Full(Full<Bytes>),
    Frames(http_body_util::StreamBody<Frames>),
    Channel(http_body_util::StreamBody<Channel>),
}

impl hyper::body::Body for EchoBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            EchoBody::Full(b) => std::pin::Pin::new(b).poll_frame(cx),
            EchoBody::Frames(b) => std::pin::Pin::new(b).poll_frame(cx),
            EchoBody::Channel(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }
}

/// A gRPC-shaped echo: the request body back, `grpc-status: 0` and the Host/:authority it saw
/// as trailers. On `/stream` each request data frame is echoed as soon as it arrives (bidi
/// streaming), and the trailers follow the end of the request.
async fn grpc_echo(req: Request<Incoming>, name: &str) -> Response<EchoBody> {
    if req.uri().path().ends_with("/stream") {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let name = name.to_string();
        tokio::spawn(async move {
            let mut body = req.into_body();
            let mut frames = 0;
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    // An empty DATA frame may carry only END_STREAM.
                    if data.is_empty() {
                        continue;
                    }
                    frames += 1;
                    let _ = tx.unbounded_send(Ok(hyper::body::Frame::data(data)));
                }
            }
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            trailers.insert("x-frames", frames.to_string().parse().unwrap());
            trailers.insert("x-upstream", name.parse().unwrap());
            let _ = tx.unbounded_send(Ok(hyper::body::Frame::trailers(trailers)));
        });
        return Response::builder()
            .header("content-type", "application/grpc")
            .body(EchoBody::Channel(http_body_util::StreamBody::new(rx)))
            .unwrap();
    }
    let authority = req
        .uri()
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let version = format!("{:?}", req.version());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert("x-seen-authority", authority.parse().unwrap());
    trailers.insert("x-seen-version", version.parse().unwrap());
    trailers.insert("x-upstream", name.parse().unwrap());
    let frames = vec![
        Ok(hyper::body::Frame::data(body)),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    Response::builder()
        .header("content-type", "application/grpc")
        .body(EchoBody::Frames(http_body_util::StreamBody::new(
            futures::stream::iter(frames),
        )))
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Test atunnel

/// Cuts a tunnel when dropped (or sent on).
type Cut = tokio::sync::oneshot::Sender<()>;

#[derive(Clone, Default)]
pub struct AtunnelState {
    /// Actors this worker answers 421 stale for.
    pub stale: Arc<Mutex<HashSet<String>>>,
    /// Probe CONNECTs (`ate-probe: 1`): (actor, answered status).
    pub probes: Arc<Mutex<Vec<(String, u16)>>>,
    /// Per actor, what cuts each of its open tunnels (as ingress off does in atunnel).
    cuts: Arc<Mutex<HashMap<String, Vec<Cut>>>>,
    /// Every CONNECT: (actor, port, :authority).
    pub connects: Arc<Mutex<Vec<(String, u16, String)>>>,
    /// TCP connections from the router.
    pub connections: Arc<AtomicUsize>,
    /// Tunnels piping to an upstream right now.
    pub open_tunnels: Arc<AtomicUsize>,
}

pub struct Atunnel {
    pub addr: SocketAddr,
    pub state: AtunnelState,
}

impl Atunnel {
    pub fn mark_stale(&self, actor: &str) {
        self.state.stale.lock().unwrap().insert(actor.to_string());
    }
    /// What atunnel does when an actor is suspended: ingress off (421 from now on) and every
    /// open tunnel of the actor closed at once.
    pub fn suspend(&self, actor: &str) {
        self.mark_stale(actor);
        self.state.cuts.lock().unwrap().remove(actor);
    }
    pub fn probes(&self) -> Vec<(String, u16)> {
        self.state.probes.lock().unwrap().clone()
    }
    pub fn connects(&self) -> usize {
        self.state.connects.lock().unwrap().len()
    }
    pub fn open_tunnels(&self) -> usize {
        self.state.open_tunnels.load(Ordering::SeqCst)
    }
}

/// An h2c server accepting CONNECT streams like atunnel (docs/tunnel-protocol.md); port `p`
/// pipes to `ports[p]`, any other port is the 502 of a port nothing listens on.
pub async fn start_atunnel(ports: HashMap<u16, SocketAddr>) -> Atunnel {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AtunnelState::default();
    let st = state.clone();
    let ports = Arc::new(ports);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            st.connections.fetch_add(1, Ordering::SeqCst);
            let st = st.clone();
            let ports = ports.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let st = st.clone();
                let ports = ports.clone();
                async move { Ok::<_, Infallible>(atunnel_stream(req, &st, &ports)) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Atunnel { addr, state }
}

fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r
}

fn atunnel_stream(
    req: Request<Incoming>,
    st: &AtunnelState,
    ports: &HashMap<u16, SocketAddr>,
) -> Response<Full<Bytes>> {
    if req.method() != http::Method::CONNECT {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "CONNECT only");
    }
    let Some(actor) = req
        .headers()
        .get("ate-target-actor")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return reply(StatusCode::BAD_REQUEST, "missing ate-target-actor");
    };
    let port: u16 = match req.headers().get("ate-target-port") {
        None => 80,
        Some(v) => match v.to_str().ok().and_then(|s| s.parse().ok()) {
            Some(p) if p != 0 => p,
            _ => return reply(StatusCode::BAD_REQUEST, "bad ate-target-port"),
        },
    };
    let stale = st.stale.lock().unwrap().contains(&actor);
    let stale_reply = || {
        let mut r = reply(StatusCode::MISDIRECTED_REQUEST, "stale");
        r.headers_mut()
            .insert("x-ate-assignment-stale", "true".parse().unwrap());
        r
    };
    if req.headers().get("ate-probe").is_some_and(|v| v == "1") {
        let status = if stale { 421 } else { 200 };
        st.probes.lock().unwrap().push((actor, status));
        return if stale {
            stale_reply()
        } else {
            reply(StatusCode::OK, "")
        };
    }
    st.connects
        .lock()
        .unwrap()
        .push((actor.clone(), port, req.uri().to_string()));
    if stale {
        return stale_reply();
    }
    let Some(upstream) = ports.get(&port).copied() else {
        let mut r = reply(
            StatusCode::BAD_GATEWAY,
            &format!("actor {actor}: nothing listens on port {port} in the actor"),
        );
        r.headers_mut()
            .insert("x-ate-port-closed", "true".parse().unwrap());
        return r;
    };
    let on = hyper::upgrade::on(req);
    let open = st.open_tunnels.clone();
    let (cut, mut cut_rx) = tokio::sync::oneshot::channel::<()>();
    st.cuts.lock().unwrap().entry(actor).or_default().push(cut);
    tokio::spawn(async move {
        let Ok(up) = on.await else { return };
        let Ok(mut tcp) = TcpStream::connect(upstream).await else {
            return;
        };
        open.fetch_add(1, Ordering::SeqCst);
        let mut up = TokioIo::new(up);
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut up, &mut tcp) => {}
            // Dropping both ends here is how atunnel closes a tunnel when ingress goes off.
            _ = &mut cut_rx => {}
        }
        open.fetch_sub(1, Ordering::SeqCst);
    });
    reply(StatusCode::OK, "")
}

// ---------------------------------------------------------------------------------------------
// Router and client

pub struct TestRouter {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub stats: Arc<Stats>,
    pub probe: Probe,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<()>>,
}

impl TestRouter {
    /// Starts graceful drain; `done` completes when the router exits.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A config for tests: api at `api`, 1 s budget unless changed.
pub fn config(api: SocketAddr) -> RouterConfig {
    let mut c = RouterConfig {
        api: api.to_string(),
        parked_request_budget: Duration::from_secs(1),
        drain_delay: Duration::from_secs(10),
        ..RouterConfig::default()
    };
    c.tuning.decision_grace = Duration::from_secs(5);
    c
}

pub async fn start_router(config: RouterConfig) -> TestRouter {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics_addr = metrics_listener.local_addr().unwrap();
    let router = Router::new(config).unwrap();
    let stats = router.stats();
    let probe = router.probe();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        router
            .serve(listener, metrics_listener, async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    TestRouter {
        addr,
        metrics_addr,
        stats,
        probe,
        shutdown: Some(tx),
        done: Some(done),
    }
}

/// An actor port whose process reads a request and closes the connection without answering.
pub async fn start_closer() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
            });
        }
    });
    addr
}

/// The actor port of [`start_closer`] in every [`World`].
pub const CLOSER_PORT: u16 = 9000;

/// One world: scripted api, upstreams on ports 80 and 8080 (and [`CLOSER_PORT`]) behind one
/// atunnel, and a router.
pub struct World {
    pub api: ScriptedApi,
    pub atunnel: Atunnel,
    pub up80: Upstream,
    pub up8080: Upstream,
    pub router: TestRouter,
}

impl World {
    pub async fn start(tune: impl FnOnce(&mut RouterConfig)) -> World {
        let api = ScriptedApi::default();
        let api_addr = api.start().await;
        let up80 = start_upstream("port80").await;
        let up8080 = start_upstream("port8080").await;
        let closer = start_closer().await;
        let atunnel = start_atunnel(HashMap::from([
            (80, up80.addr),
            (8080, up8080.addr),
            (CLOSER_PORT, closer),
        ]))
        .await;
        let mut cfg = config(api_addr);
        tune(&mut cfg);
        let router = start_router(cfg).await;
        World {
            api,
            atunnel,
            up80,
            up8080,
            router,
        }
    }

    pub fn worker(&self) -> String {
        self.atunnel.addr.to_string()
    }

    /// Scripts `actor` as running on this world's worker.
    pub fn running(&self, actor: &str) {
        let w = self.worker();
        self.api.script(actor, move |_| Reply::ok(&w, false));
    }
}

#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: String,
    pub elapsed: Duration,
}

impl Got {
    pub fn resume(&self) -> &str {
        self.headers
            .get("ate-resume")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// GET `/` on a new HTTP/1.1 connection with the given actor header and Host.
pub async fn get(addr: SocketAddr, actor: Option<&str>) -> Got {
    get_with(addr, actor, "app.example", |_| {}).await
}

pub async fn get_with(
    addr: SocketAddr,
    actor: Option<&str>,
    host: &str,
    edit: impl FnOnce(&mut Request<Empty<Bytes>>),
) -> Got {
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .uri("/hello?x=1")
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    if let Some(actor) = actor {
        req.headers_mut()
            .insert("ate-target-actor", actor.parse().unwrap());
    }
    edit(&mut req);
    let resp = sender.send_request(req).await.unwrap();
    collect(resp, started).await
}

pub async fn collect(resp: Response<Incoming>, started: Instant) -> Got {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// The text of `/metrics`.
pub async fn metrics_text(addr: SocketAddr) -> String {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri("/metrics")
        .header("host", "x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    collect(sender.send_request(req).await.unwrap(), Instant::now())
        .await
        .body
}

/// Value of a metric line that starts with `prefix` (first match).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

pub fn no_room() -> Status {
    Status::resource_exhausted(ate_core::NO_ROOM_MESSAGE)
}

/// Internal names no error body may contain (RPCs, state enums, gRPC status dumps).
pub const INTERNAL_NAMES: [&str; 7] = [
    "AssignWorker",
    "ResumeActor",
    "RevertActor",
    "ACTOR_STATE_",
    "Status {",
    "tonic",
    "code:",
];

/// An error body for a person: one line, naming `actor` when there is one, and none of
/// [`INTERNAL_NAMES`] — apart from the spec's own CRASHED text (`AssignWorker prerequisite not
/// met`, which spec 4.4 tells operators to look for in the 503).
pub fn assert_clean(got: &Got, actor: Option<&str>) {
    let body = &got.body;
    assert!(!body.is_empty(), "{} with an empty body", got.status);
    assert!(
        !body.trim_end().contains(['\n', '\r']),
        "{}: more than one line: {body:?}",
        got.status
    );
    assert!(
        body.chars().count() <= 400,
        "{}: too long: {body:?}",
        got.status
    );
    let without_spec = body.replace(ate_core::CRASHED_PREREQUISITE, "");
    for name in INTERNAL_NAMES {
        assert!(
            !without_spec.contains(name),
            "{}: {name} in {body:?}",
            got.status
        );
    }
    if let Some(actor) = actor {
        assert!(
            body.contains(actor),
            "{}: {body:?} does not name {actor}",
            got.status
        );
    }
}
