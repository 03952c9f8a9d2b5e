//! Fixtures on real 127.0.0.1 sockets: the scripted ResumeActor server of
//! `ate_test_support::scripted_api`, a test atunnel (h2c, CONNECT per docs/tunnel-protocol.md;
//! `atunnel.rs`) that pipes to small HTTP/1.1 upstreams (`upstream.rs`), a router, and the
//! client helpers the tests share.

#![allow(dead_code)]

mod atunnel;
pub mod heap;
mod upstream;

pub use atunnel::*;
pub use upstream::*;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ate_router::{Probe, Router, RouterConfig, Stats};
pub use ate_test_support::scripted_api::{Reply, ScriptedApi};
// Not every test binary polls.
#[allow(unused_imports)]
pub use ate_test_support::wait::{eventually, poll_until};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tonic::Status;

pub struct TestRouter {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub stats: Arc<Stats>,
    pub probe: Probe,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<()>>,
}

impl TestRouter {
    /// A router started by the caller (with `shutdown` ending its serve).
    pub fn new(
        addr: SocketAddr,
        metrics_addr: SocketAddr,
        stats: Arc<Stats>,
        probe: Probe,
        shutdown: tokio::sync::oneshot::Sender<()>,
        done: tokio::task::JoinHandle<()>,
    ) -> Self {
        TestRouter {
            addr,
            metrics_addr,
            stats,
            probe,
            shutdown: Some(shutdown),
            done: Some(done),
        }
    }

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
    start_router_with_tls(config, None).await
}

/// [`start_router`] with the `--tls-listen` listener pre-bound too (used when the config sets
/// `tls_listen`).
pub async fn start_router_with_tls(
    config: RouterConfig,
    tls_listener: Option<TcpListener>,
) -> TestRouter {
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
            .serve_with_tls(listener, tls_listener, metrics_listener, async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    TestRouter::new(addr, metrics_addr, stats, probe, tx, done)
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

/// A GET of `uri` for `host` with no body, and header `name: value` when given.
pub fn bodiless_get(
    uri: &str,
    host: &str,
    header: Option<(&'static str, &str)>,
) -> Request<Empty<Bytes>> {
    let mut req = Request::builder()
        .uri(uri)
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    if let Some((name, value)) = header {
        req.headers_mut().insert(name, value.parse().unwrap());
    }
    req
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
    let target = actor.map(|a| ("ate-target-actor", a));
    let mut req = bodiless_get("/hello?x=1", host, target);
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
pub use ate_test_support::oracles::ROUTER_INTERNAL_NAMES as INTERNAL_NAMES;

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

/// Writes `request` and reads the answer's head, through its blank line (as sent).
pub async fn send_and_read_head<I>(io: &mut I, request: &[u8]) -> String
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    io.write_all(request).await.unwrap();
    read_head(io).await
}

/// Reads an answer's head, through its blank line (as sent).
pub async fn read_head<I: tokio::io::AsyncRead + Unpin>(io: &mut I) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        io.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Waits up to 5 s for exactly `n` requests to be parked; panics otherwise.
pub async fn wait_parked(stats: &Stats, n: u64) {
    let what = format!("{n} parked requests");
    let parked = async || (Stats::get(&stats.parking_active) == n).then_some(());
    poll_until(
        &what,
        Duration::from_secs(5),
        Duration::from_millis(10),
        parked,
    )
    .await
}

/// The access log at `path` once `done` holds for its text (the writer is a thread of its own);
/// panics naming `what` after 5 s.
pub async fn access_log_until(
    path: &std::path::Path,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let read = async || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        done(&text).then_some(text)
    };
    poll_until(
        what,
        Duration::from_secs(5),
        Duration::from_millis(20),
        read,
    )
    .await
}
