//! Long-lived traffic through the router on real sockets: gRPC over one pooled tunnel per
//! (actor, port), WebSocket over HTTP/2 (RFC 8441 extended CONNECT), and the graceful drain of
//! relays (WebSocket over HTTP/1.1 and HTTP/2, client CONNECT tunnels).

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ate_router::Stats;
use ate_router::drain::Phase;
use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

type Body = BoxBody<Bytes, Infallible>;

/// Polls `cond` every 5 ms for up to `within`.
async fn eventually(within: Duration, cond: impl FnMut() -> bool) -> bool {
    ate_test_support::wait::eventually(within, Duration::from_millis(5), cond).await
}

/// An HTTP/2 (prior knowledge) client connection to the router.
async fn h2_client<B>(addr: SocketAddr) -> http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

fn grpc_request(actor: &str, path: &str, body: Body) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(format!("http://greeter.svc:50051{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("ate-target-actor", actor)
        .body(body)
        .unwrap()
}

/// One unary gRPC-shaped call: the payload comes back, followed by `grpc-status: 0`.
async fn unary(sender: &mut http2::SendRequest<Body>, actor: &str, n: u32) {
    let payload = Bytes::from(format!("\0\0\0\0\x04call{n}"));
    let req = grpc_request(
        actor,
        "/helloworld.Greeter/SayHello",
        Full::new(payload.clone()).boxed(),
    );
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "call {n}");
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .unwrap_or_else(|| panic!("call {n}: no trailers"));
    assert_eq!(trailers["grpc-status"], "0", "call {n}");
    assert_eq!(trailers["x-seen-version"], "HTTP/2.0", "call {n}");
    assert_eq!(
        trailers["x-seen-authority"], "greeter.svc:50051",
        "call {n}"
    );
    assert_eq!(collected.to_bytes(), payload, "call {n}");
}

// ---- gRPC over one pooled tunnel ---------------------------------------------------------------

#[tokio::test]
async fn grpc_requests_share_one_tunnel_per_actor_and_port() {
    let w = World::start(|_| {}).await;
    w.running("a/grpc");
    w.running("a/other");
    let mut first = h2_client::<Body>(w.router.addr).await;
    for n in 0..10 {
        unary(&mut first, "a/grpc", n).await;
    }
    // 30 at once over three client connections (the first one included).
    let mut clients = vec![first];
    for _ in 0..2 {
        clients.push(h2_client::<Body>(w.router.addr).await);
    }
    let calls = (0..30u32).map(|n| {
        let mut sender = clients[n as usize % 3].clone();
        async move { unary(&mut sender, "a/grpc", 100 + n).await }
    });
    futures::future::join_all(calls).await;
    assert_eq!(
        w.atunnel.connects(),
        1,
        "one CONNECT stream carried all 40 gRPC requests"
    );
    assert_eq!(w.atunnel.open_tunnels(), 1);
    assert_eq!(
        w.up80.connections.load(Ordering::SeqCst),
        1,
        "one HTTP/2 connection to the actor"
    );
    assert_eq!(w.up80.requests.load(Ordering::SeqCst), 40);
    assert_eq!(Stats::get(&w.router.stats.tunnel_reuses), 39);
    assert_eq!(w.router.probe.grpc_tunnels(), 1);

    // Another actor gets its own tunnel.
    unary(&mut clients[1], "a/other", 0).await;
    unary(&mut clients[2], "a/other", 1).await;
    assert_eq!(w.atunnel.connects(), 2);
    assert_eq!(w.router.probe.grpc_tunnels(), 2);
    let connects = w.atunnel.state.connects.lock().unwrap().clone();
    assert_eq!(connects[0], ("a/grpc".into(), 80, "grpc.a:80".into()));
    assert_eq!(connects[1], ("a/other".into(), 80, "other.a:80".into()));
}

#[tokio::test]
async fn grpc_streams_pass_through_and_keep_the_tunnel_until_idle() {
    let w = World::start(|c| c.tuning.tunnel_idle_timeout = Duration::from_millis(300)).await;
    w.running("a/grpc");
    let mut sender = h2_client::<Body>(w.router.addr).await;

    // A bidi stream longer than the idle timeout: each frame comes back before the next is sent.
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
    let req = grpc_request("a/grpc", "/echo.Echo/stream", StreamBody::new(rx).boxed());
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    for i in 0..4u8 {
        let msg = Bytes::from(vec![0, 0, 0, 0, 1, i]);
        tx.unbounded_send(Ok(Frame::data(msg.clone()))).unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), msg, "frame {i} streamed back");
        if i == 2 {
            // Mid-stream, after more than the idle timeout: the tunnel is still the pooled one.
            unary(&mut sender, "a/grpc", 7).await;
        }
        // The scenario: a slow stream, its frames spaced past the idle timeout in all.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(tx);
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        if let Ok(t) = frame.unwrap().into_trailers() {
            trailers = Some(t);
        }
    }
    let trailers = trailers.expect("trailers after the stream");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-frames"], "4");
    assert_eq!(w.atunnel.connects(), 1, "the stream kept the tunnel alive");

    // Idle past the timeout: the router closes the tunnel (an open tunnel is actor activity).
    assert!(
        eventually(Duration::from_secs(3), || w.atunnel.open_tunnels() == 0).await,
        "idle gRPC tunnel closed"
    );
    assert_eq!(w.router.probe.grpc_tunnels(), 0);
    unary(&mut sender, "a/grpc", 8).await;
    assert_eq!(w.atunnel.connects(), 2, "a new tunnel after the idle close");
}

#[tokio::test]
async fn grpc_stale_tunnel_is_evicted_resolved_again_and_retried() {
    let w = World::start(|_| {}).await;
    let old = start_atunnel(HashMap::from([(80, w.up80.addr)])).await;
    old.mark_stale("a/moved");
    let (old_addr, new_addr) = (old.addr.to_string(), w.worker());
    w.api.script("a/moved", move |c| {
        Reply::ok(if c.n == 0 { &old_addr } else { &new_addr }, false)
    });
    let mut sender = h2_client::<Body>(w.router.addr).await;
    for n in 0..3 {
        unary(&mut sender, "a/moved", n).await;
    }
    assert_eq!(old.connects(), 1, "the stale worker was asked once");
    assert_eq!(w.api.calls("a/moved"), 2);
    assert_eq!(w.atunnel.connects(), 1, "the new worker's tunnel is pooled");
    assert_eq!(Stats::get(&w.router.stats.stale_retries), 1);
}

#[tokio::test]
async fn a_burst_of_grpc_requests_waits_for_one_tunnel_attempt_and_shares_its_failure() {
    let w = World::start(|_| {}).await;
    let old = start_atunnel(HashMap::from([(80, w.up80.addr)])).await;
    old.mark_stale("a/burst");
    let (old_addr, new_addr) = (old.addr.to_string(), w.worker());
    // Every request of the burst joins the first resolution, so all get the stale route at once.
    w.api.script("a/burst", move |c| {
        if c.n == 0 {
            Reply::ok(&old_addr, false).after(Duration::from_millis(200))
        } else {
            Reply::ok(&new_addr, false)
        }
    });
    let sender = h2_client::<Body>(w.router.addr).await;
    let calls = (0..10u32).map(|n| {
        let mut sender = sender.clone();
        async move { unary(&mut sender, "a/burst", n).await }
    });
    futures::future::join_all(calls).await;
    assert_eq!(
        old.connects(),
        1,
        "the waiters did not each try the stale worker"
    );
    assert_eq!(w.atunnel.connects(), 1);
    assert_eq!(w.api.calls("a/burst"), 2);
}

#[tokio::test]
async fn grpc_tunnel_follows_the_actor_to_its_new_worker() {
    // No cache: every request asks the api, which moves the actor after three calls.
    let w = World::start(|c| c.assignment_cache_ttl = Duration::ZERO).await;
    let second = start_atunnel(HashMap::from([(80, w.up80.addr)])).await;
    let (first_addr, second_addr) = (w.worker(), second.addr.to_string());
    w.api.script("a/mover", move |c| {
        Reply::ok(if c.n < 3 { &first_addr } else { &second_addr }, false)
    });
    let mut sender = h2_client::<Body>(w.router.addr).await;
    for n in 0..6 {
        unary(&mut sender, "a/mover", n).await;
    }
    assert_eq!(w.atunnel.connects(), 1);
    assert_eq!(second.connects(), 1);
    assert!(
        eventually(Duration::from_secs(2), || w.atunnel.open_tunnels() == 0).await,
        "the tunnel on the old worker is closed"
    );
    assert_eq!(second.open_tunnels(), 1);
}

// ---- WebSocket over HTTP/2 (RFC 8441) ------------------------------------------------------------

/// An HTTP/2 client that has seen the router's SETTINGS_ENABLE_CONNECT_PROTOCOL.
async fn h2_websocket_client(addr: SocketAddr) -> http2::SendRequest<Empty<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    let mut conn = Box::pin(conn);
    let deadline = Instant::now() + Duration::from_secs(2);
    // Drive the connection until the router's SETTINGS frame has been read.
    while !conn.is_extended_connect_protocol_enabled() {
        assert!(
            Instant::now() < deadline,
            "the router advertises SETTINGS_ENABLE_CONNECT_PROTOCOL"
        );
        tokio::select! {
            ended = conn.as_mut() => panic!("connection ended: {ended:?}"),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
    tokio::spawn(conn);
    sender
}

fn extended_connect(
    actor: Option<&str>,
    uri: &str,
    protocol: &'static str,
) -> Request<Empty<Bytes>> {
    let mut req = Request::builder()
        .method("CONNECT")
        .uri(uri)
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat")
        .header("origin", "http://ws.example")
        .body(Empty::new())
        .unwrap();
    if let Some(actor) = actor {
        req.headers_mut()
            .insert("ate-target-actor", actor.parse().unwrap());
    }
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static(protocol));
    req
}

/// Opens a WebSocket stream over HTTP/2; returns the response head and the byte stream.
async fn open_h2_websocket(
    sender: &mut http2::SendRequest<Empty<Bytes>>,
    actor: &str,
) -> (http::response::Parts, TokioIo<hyper::upgrade::Upgraded>) {
    let resp = sender
        .send_request(extended_connect(
            Some(actor),
            "http://ws.example/chat?room=1",
            "websocket",
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", resp.headers());
    let (parts, body) = resp.into_parts();
    let upgraded = hyper::upgrade::on(Response::from_parts(parts.clone(), body))
        .await
        .unwrap();
    (parts, TokioIo::new(upgraded))
}

use http::Response;

async fn echo<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, msg: &[u8]) {
    io.write_all(msg).await.unwrap();
    io.flush().await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(3), io.read_exact(&mut back))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(back, msg);
}

#[tokio::test]
async fn websocket_over_http2_reaches_the_actor_as_an_http1_upgrade() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    w.api.script("a/ws", move |c| {
        Reply::ok(&worker, c.n == 0).after(Duration::from_millis(50))
    });
    let mut sender = h2_websocket_client(w.router.addr).await;
    let (head, mut ws) = open_h2_websocket(&mut sender, "a/ws").await;
    assert_eq!(
        head.headers["ate-resume"], "cold",
        "resumed like any request"
    );
    assert_eq!(head.headers["sec-websocket-protocol"], "chat");
    assert!(head.headers.get("sec-websocket-accept").is_none());
    assert!(head.headers.get("upgrade").is_none());
    for msg in [&b"hello"[..], b"second frame", &[0x81, 0x05, 1, 2, 3, 4, 5]] {
        echo(&mut ws, msg).await;
    }
    // A second WebSocket on the same HTTP/2 connection, both open at once.
    let (head2, mut ws2) = open_h2_websocket(&mut sender, "a/ws").await;
    assert_eq!(head2.headers["ate-resume"], "warm");
    echo(&mut ws2, b"two").await;
    echo(&mut ws, b"one").await;
    assert_eq!(w.router.probe.open_relays(), 2);

    let seen = w.up80.upgrades.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let up = &seen[0];
    assert_eq!(up.method, http::Method::GET);
    assert_eq!(up.version, http::Version::HTTP_11);
    assert_eq!(up.uri, "/chat?room=1");
    let h = &up.headers;
    assert_eq!(h["host"], "ws.example");
    assert_eq!(h["upgrade"], "websocket");
    assert!(
        h["connection"]
            .to_str()
            .unwrap()
            .eq_ignore_ascii_case("upgrade")
    );
    assert_eq!(h["sec-websocket-version"], "13");
    assert_eq!(h["sec-websocket-protocol"], "chat");
    assert_eq!(h["origin"], "http://ws.example");
    let key = h["sec-websocket-key"].to_str().unwrap();
    assert_eq!(key.len(), 24, "{key}");
    assert!(key.ends_with("=="), "{key}");
    assert_ne!(seen[1].headers["sec-websocket-key"], h["sec-websocket-key"]);
    assert!(h.get("ate-target-actor").is_none());

    // Closing the client side ends the relay.
    drop(ws);
    drop(ws2);
    assert!(eventually(Duration::from_secs(2), || w.router.probe.open_relays() == 0).await);
}

#[tokio::test]
async fn websocket_over_http2_errors() {
    let w = World::start(|_| {}).await;
    w.running("a/ws");
    let mut sender = h2_websocket_client(w.router.addr).await;
    let mut status_of = async |req: Request<Empty<Bytes>>| {
        let resp = sender.send_request(req).await.unwrap();
        collect(resp, Instant::now()).await
    };
    let got = status_of(extended_connect(
        None,
        "http://ws.example/chat",
        "websocket",
    ))
    .await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert!(
        got.body.starts_with("missing ate-target-actor header"),
        "{}",
        got.body
    );
    assert_clean(&got, None);
    let got = status_of(extended_connect(
        Some("a/ghost"),
        "http://ws.example/",
        "websocket",
    ))
    .await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert!(
        got.body.starts_with("actor a/ghost not found"),
        "{}",
        got.body
    );
    assert_clean(&got, Some("a/ghost"));
    let got = status_of(extended_connect(
        Some("a/ws"),
        "http://ws.example/",
        "connect-udp",
    ))
    .await;
    assert_eq!(got.status, StatusCode::NOT_IMPLEMENTED);
    assert!(got.body.contains("connect-udp"), "{}", got.body);
    assert_clean(&got, Some("a/ws"));
    // The actor's refusal passes through as it is.
    let got = status_of(extended_connect(
        Some("a/ws"),
        "http://ws.example/refuse",
        "websocket",
    ))
    .await;
    assert_eq!(got.status, StatusCode::FORBIDDEN);
    assert_eq!(got.body, "no websocket here");
    // A 2xx that switches nothing must not open the client's stream.
    let got = status_of(extended_connect(
        Some("a/ws"),
        "http://ws.example/plain",
        "websocket",
    ))
    .await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    assert_eq!(got.body, "actor a/ws did not accept the WebSocket upgrade");
    assert_clean(&got, Some("a/ws"));
    assert_eq!(w.router.probe.open_relays(), 0);
}

// ---- graceful drain of relays ------------------------------------------------------------------

/// A WebSocket over HTTP/1.1 through the router: the raw stream after the 101.
async fn h1_websocket(addr: SocketAddr, actor: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /chat HTTP/1.1\r\nhost: ws.example\r\nate-target-actor: {actor}\r\n\
         connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let head = common::read_head(&mut tcp).await.to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    tcp
}

/// Reads until the stream ends (EOF or error); returns when that happened.
async fn closed_at<S: AsyncRead + Unpin>(io: &mut S) -> Instant {
    let mut buf = [0u8; 64];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return Instant::now(),
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn drain_keeps_websocket_relays_until_the_deadline_then_closes_them() {
    let drain_delay = Duration::from_millis(1500);
    let mut w = World::start(|c| c.drain_delay = drain_delay).await;
    w.running("a/ws");
    let mut h1 = h1_websocket(w.router.addr, "a/ws").await;
    let mut sender = h2_websocket_client(w.router.addr).await;
    let (_, mut h2) = open_h2_websocket(&mut sender, "a/ws").await;
    echo(&mut h1, b"before").await;
    echo(&mut h2, b"before").await;
    assert_eq!(w.router.probe.open_relays(), 2);

    let began = Instant::now();
    w.router.shutdown();
    let mut done = w.router.done.take().unwrap();
    assert!(
        eventually(Duration::from_secs(1), || w.router.probe.phase()
            == Phase::Draining)
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Still relaying after the drain began, and the router is still up.
    echo(&mut h1, b"during the drain").await;
    echo(&mut h2, b"during the drain").await;
    assert!(!done.is_finished(), "the router waits for open relays");
    assert!(
        TcpStream::connect(w.router.addr).await.is_err(),
        "new connections are refused"
    );

    // At the deadline both are cut, and the router exits right after.
    let (h1_closed, h2_closed) = tokio::time::timeout(Duration::from_secs(4), async {
        tokio::join!(closed_at(&mut h1), closed_at(&mut h2))
    })
    .await
    .expect("relays closed at the deadline");
    for (what, at) in [("h1", h1_closed), ("h2", h2_closed)] {
        let after = at - began;
        assert!(
            after >= drain_delay - Duration::from_millis(100),
            "{what} relay cut early: {after:?}"
        );
        assert!(
            after < drain_delay + Duration::from_millis(900),
            "{what}: {after:?}"
        );
    }
    tokio::time::timeout(Duration::from_secs(3), &mut done)
        .await
        .expect("router exits after the deadline")
        .unwrap();
    let exited = began.elapsed();
    assert!(exited >= drain_delay, "{exited:?}");
    assert_eq!(w.router.probe.open_relays(), 0);
    assert_eq!(w.router.probe.phase(), Phase::Cut);
}

#[tokio::test]
async fn drain_ends_as_soon_as_the_last_relay_closes() {
    let mut w = World::start(|c| c.drain_delay = Duration::from_secs(10)).await;
    w.running("a/ws");
    let mut ws = h1_websocket(w.router.addr, "a/ws").await;
    echo(&mut ws, b"hi").await;
    let began = Instant::now();
    w.router.shutdown();
    let mut done = w.router.done.take().unwrap();
    // A while into the drain, the relay is still served.
    tokio::time::sleep(Duration::from_millis(300)).await;
    echo(&mut ws, b"still here").await;
    assert!(!done.is_finished());
    drop(ws);
    tokio::time::timeout(Duration::from_secs(3), &mut done)
        .await
        .expect("router exits once the relay is gone")
        .unwrap();
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn drain_lets_a_client_connect_tunnel_finish_its_request_then_closes_it() {
    let mut w = World::start(|c| c.drain_delay = Duration::from_secs(10)).await;
    w.running("a/b");
    // Two CONNECT tunnels: one with a request in flight when the drain begins, one idle.
    let addr = w.router.addr;
    let open_tunnel = async || {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(
            b"CONNECT b.a:8080 HTTP/1.1\r\nhost: b.a:8080\r\nate-target-actor: a/b\r\n\r\n",
        )
        .await
        .unwrap();
        let head = common::read_head(&mut tcp).await.to_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        tcp
    };
    let busy = open_tunnel().await;
    let mut idle = open_tunnel().await;
    assert_eq!(w.router.probe.open_relays(), 2);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(busy))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .uri("/sleep/700")
        .header("host", "inner.example:8080")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let in_flight = tokio::spawn(async move {
        let resp = sender.send_request(req).await.unwrap();
        collect(resp, Instant::now()).await
    });
    // Time for the request to reach the upstream (which answers after 700 ms): the drain
    // begins with it in flight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let began = Instant::now();
    w.router.shutdown();
    let mut done = w.router.done.take().unwrap();
    // The idle tunnel is closed at once, like an idle keep-alive connection.
    let idle_closed = tokio::time::timeout(Duration::from_secs(2), closed_at(&mut idle))
        .await
        .expect("idle CONNECT tunnel closed");
    assert!(idle_closed - began < Duration::from_millis(500));
    let got = in_flight.await.unwrap();
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert!(got.body.contains("name=port8080\n"), "{}", got.body);
    // Then the busy tunnel closes too, and the router exits well before the 10 s deadline.
    tokio::time::timeout(Duration::from_secs(2), conn)
        .await
        .expect("CONNECT tunnel closed after its request")
        .unwrap()
        .ok();
    tokio::time::timeout(Duration::from_secs(3), &mut done)
        .await
        .expect("router exits once the tunnels are gone")
        .unwrap();
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(w.router.probe.open_relays(), 0);
}
