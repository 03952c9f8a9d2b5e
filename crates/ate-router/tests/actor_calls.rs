//! Calls between actors (issue 31) on real sockets: a worker's requests on `--internal-socket`
//! reach the callee with the caller they name in `ate-caller-actor`; the same header from a
//! client (plain HTTP/1.1, h2c gRPC, a WebSocket upgrade, inside a CONNECT) never reaches an
//! actor; a call across atespaces is 403 before any ResumeActor; a worker request without one
//! valid caller is 400. The TLS paths (ingress and `--internal-listen`) are in ingress_auth.rs.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// The rule for n1 (the test api knows no allow list: admits no other atespace).
const RULE: &str = "calls between atespaces are not allowed: atespace n1 admits no other atespace (its spec.callers.allow is empty)";

/// A world whose router also serves `--internal-socket` (and an access log) in `dir`.
async fn world(dir: &Path) -> World {
    let socket = socket_of(dir);
    let log = dir.join("access.log");
    let w = World::start(move |cfg| {
        cfg.internal_socket = Some(socket);
        cfg.access_log = Some(log.display().to_string());
    })
    .await;
    for actor in ["n1/a", "n1/b", "n2/c"] {
        w.running(actor);
    }
    w
}

fn socket_of(dir: &Path) -> PathBuf {
    dir.join("run/router/internal.sock")
}

/// GET `/who` to `target` on a new connection over `io`, with these `ate-caller-actor` values.
async fn get_over<I>(io: I, target: &str, callers: &[&str]) -> Got
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .uri("/who")
        .header("host", "callee.example")
        .header("ate-target-actor", target)
        .body(Empty::<Bytes>::new())
        .unwrap();
    for caller in callers {
        req.headers_mut()
            .append("ate-caller-actor", caller.parse().unwrap());
    }
    collect(sender.send_request(req).await.unwrap(), started).await
}

/// A call as a worker makes it: over the internal socket.
async fn call(dir: &Path, target: &str, callers: &[&str]) -> Got {
    get_over(connect(dir).await, target, callers).await
}

/// A connection to the internal socket; the router binds it as it starts serving, which may be
/// just after the test's first call.
async fn connect(dir: &Path) -> UnixStream {
    let what = "the internal socket";
    poll_until(
        what,
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || UnixStream::connect(socket_of(dir)).await.ok(),
    )
    .await
}

/// The `ate-caller-actor` lines the echo upstream saw.
fn seen_callers(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("header ate-caller-actor: "))
        .collect()
}

/// A gRPC call over h2 on `io` with `caller` (if any): the caller the upstream saw.
async fn grpc_caller<I>(io: I, target: &str, caller: Option<&str>) -> String
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method("POST")
        .uri("http://greeter.svc/helloworld.Greeter/SayHello")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("ate-target-actor", target)
        .body(http_body_util::Full::new(Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    if let Some(caller) = caller {
        req.headers_mut()
            .insert("ate-caller-actor", caller.parse().unwrap());
    }
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("grpc trailers");
    trailers["x-seen-caller"].to_str().unwrap().to_string()
}

/// Sends `CONNECT <host>:80` on `io` with these extra header lines; after the 200, a client on
/// the tunnel.
async fn connect_tunnel<I>(
    mut io: I,
    target: &str,
    extra: &str,
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = format!(
        "CONNECT callee.example:80 HTTP/1.1\r\nhost: callee.example:80\r\nate-target-actor: {target}\r\n{extra}\r\n"
    );
    let answer = send_and_read_head(&mut io, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn inner_get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    caller: Option<&str>,
) -> Got {
    let caller = caller.map(|c| ("ate-caller-actor", c));
    let req = bodiless_get("/inner", "callee.example", caller);
    collect(sender.send_request(req).await.unwrap(), Instant::now()).await
}

/// The access log's lines, once `want` appears in them (the writer is a thread of its own).
async fn access_log_with(dir: &Path, want: &str) -> String {
    let what = format!("{want:?} in the access log");
    access_log_until(&dir.join("access.log"), &what, |text| text.contains(want)).await
}

#[tokio::test]
async fn a_call_on_the_internal_socket_reaches_the_callee_with_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(dir.path()).await;

    let got = call(dir.path(), "n1/b", &["n1/a"]).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(seen_callers(&got.body), ["n1/a"], "{}", got.body);
    assert_eq!(w.api.calls("n1/b"), 1);

    // HTTP/2 (gRPC) on the internal socket carries it too.
    let unix = connect(dir.path()).await;
    assert_eq!(grpc_caller(unix, "n1/b", Some("n1/a")).await, "n1/a");

    let log = access_log_with(dir.path(), "\"caller\":\"n1/a\"").await;
    assert!(
        log.contains("\"actor\":\"n1/b\",\"caller\":\"n1/a\""),
        "{log}"
    );
    let metrics = metrics_text(w.router.metrics_addr).await;
    assert!(
        metric(
            &metrics,
            "ate_router_actor_calls_total{verdict=\"allowed\"}"
        ) >= Some(2.0),
        "{metrics}"
    );
    w.router.shutdown();
}

#[tokio::test]
async fn a_client_cannot_forge_a_caller() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(dir.path()).await;

    // Plain HTTP/1.1, the header once and twice.
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let got = get_over(tcp, "n1/b", &["n1/a"]).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert!(seen_callers(&got.body).is_empty(), "{}", got.body);
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let got = get_over(tcp, "n1/b", &["n1/a", "n2/c"]).await;
    assert!(seen_callers(&got.body).is_empty(), "{}", got.body);

    // gRPC over h2c.
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    assert_eq!(grpc_caller(tcp, "n1/b", Some("n1/a")).await, "none");

    // A WebSocket upgrade.
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let head = send_and_read_head(
        &mut tcp,
        b"GET /chat HTTP/1.1\r\nhost: ws.example\r\nate-target-actor: n1/b\r\n\
          ate-caller-actor: n1/a\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
          sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"));
    let upgrades = w.up80.upgrades.lock().unwrap().clone();
    assert_eq!(upgrades.len(), 1);
    assert!(
        upgrades[0].headers.get("ate-caller-actor").is_none(),
        "{:?}",
        upgrades[0].headers
    );

    // Inside a client CONNECT: on the CONNECT itself and on the request inside.
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let mut tunnel = connect_tunnel(tcp, "n1/b", "ate-caller-actor: n1/a\r\n").await;
    for caller in [None, Some("n1/a")] {
        let got = inner_get(&mut tunnel, caller).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert!(seen_callers(&got.body).is_empty(), "{}", got.body);
    }
    w.router.shutdown();
}

#[tokio::test]
async fn a_call_across_atespaces_is_denied_before_any_resume() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(dir.path()).await;

    let got = call(dir.path(), "n1/b", &["n2/c"]).await;
    assert_eq!(got.status, StatusCode::FORBIDDEN, "{}", got.body);
    assert_eq!(
        got.body.trim_end(),
        format!("actor n1/b: call from actor n2/c denied: {RULE}")
    );
    assert_clean(&got, Some("n1/b"));
    // Denied before the callee was resolved: nothing woke it, nothing reached it.
    assert_eq!(w.api.calls("n1/b"), 0);
    assert_eq!(w.up80.requests.load(Ordering::SeqCst), 0);

    let metrics = metrics_text(w.router.metrics_addr).await;
    // At least: the recorder is per process, and `cargo test` runs tests side by side.
    assert!(
        metric(&metrics, "ate_router_actor_calls_total{verdict=\"denied\"}") >= Some(1.0),
        "{metrics}"
    );
    let log = access_log_with(dir.path(), "\"caller\":\"n2/c\"").await;
    assert!(
        log.contains("\"actor\":\"n1/b\",\"caller\":\"n2/c\""),
        "{log}"
    );
    assert!(log.contains("\"status\":403"), "{log}");
    w.router.shutdown();
}

#[tokio::test]
async fn a_connect_on_the_internal_socket_carries_its_caller_to_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(dir.path()).await;

    let unix = connect(dir.path()).await;
    let mut tunnel = connect_tunnel(unix, "n1/b", "ate-caller-actor: n1/a\r\n").await;
    // A header inside the tunnel is replaced by the CONNECT's caller.
    for forged in [None, Some("n9/x")] {
        let got = inner_get(&mut tunnel, forged).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert_eq!(seen_callers(&got.body), ["n1/a"], "{}", got.body);
    }

    // Across atespaces: every request inside is denied, and the callee stays asleep.
    let unix = connect(dir.path()).await;
    let mut tunnel = connect_tunnel(unix, "n1/b", "ate-caller-actor: n2/c\r\n").await;
    let before = w.api.calls("n1/b");
    let got = inner_get(&mut tunnel, Some("n1/a")).await;
    assert_eq!(got.status, StatusCode::FORBIDDEN, "{}", got.body);
    assert!(got.body.contains(RULE), "{}", got.body);
    assert_eq!(w.api.calls("n1/b"), before);
    w.router.shutdown();
}

#[tokio::test]
async fn a_worker_request_without_one_valid_caller_is_400() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(dir.path()).await;

    let cases: [(&[&str], &str); 4] = [
        (&[], "missing ate-caller-actor header"),
        (&["n1/a", "n1/a"], "more than one ate-caller-actor header"),
        (
            &["N1/a"],
            "ate-caller-actor \"N1/a\" is not a valid actor: invalid atespace",
        ),
        (&["n1"], "ate-caller-actor \"n1\" is not a valid actor"),
    ];
    for (callers, want) in cases {
        let got = call(dir.path(), "n1/b", callers).await;
        assert_eq!(
            got.status,
            StatusCode::BAD_REQUEST,
            "{callers:?}: {}",
            got.body
        );
        assert!(got.body.contains(want), "{callers:?}: {}", got.body);
        assert!(got.body.starts_with("actor n1/b: "), "{}", got.body);
        assert_clean(&got, Some("n1/b"));
    }
    assert_eq!(w.api.total_calls(), 0);
    assert_eq!(w.up80.requests.load(Ordering::SeqCst), 0);
    w.router.shutdown();
}
