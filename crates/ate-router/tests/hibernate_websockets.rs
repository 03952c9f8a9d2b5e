//! Hibernating WebSockets through a real router, a scripted api, an atunnel stand-in and a
//! frame-speaking upstream (docs/websockets.md): the client's socket outlives the actor's, pings
//! are answered while nothing is behind it, the next message opens a new upstream socket carrying
//! the same `ate-websocket-id` (and `ate-websocket-resumed: 1`), a deleted actor closes it with
//! 1000, the per-actor limit refuses with 503, and a drain closes with 1012.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ACTOR: &str = "lab/h";

async fn world(tune: impl FnOnce(&mut ate_router::RouterConfig)) -> World {
    let w = World::start(tune).await;
    w.running(ACTOR);
    w.api.hibernate_web_sockets(ACTOR);
    w
}

/// A WebSocket to `/ws-frames` of `actor`: the socket, or the refusal's head and body.
async fn connect(w: &World, actor: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(w.router.addr).await.unwrap();
    let head = send_and_read_head(&mut s, format!(
            "GET /ws-frames HTTP/1.1\r\nHost: t\r\nate-target-actor: {actor}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
        )
        .as_bytes()).await;
    if head.starts_with("HTTP/1.1 101") {
        return Ok(s);
    }
    let mut body = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut body))
        .await
        .unwrap_or(Ok(0))
        .unwrap_or(0);
    Err(format!("{head}{}", String::from_utf8_lossy(&body[..n])))
}

fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

async fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let read = async {
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await.unwrap();
        let mut payload = vec![0u8; usize::from(head[1] & 0x7f)];
        s.read_exact(&mut payload).await.unwrap();
        (head[0], payload)
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("a frame within 10 s")
}

async fn echo(s: &mut TcpStream, text: &str) -> String {
    s.write_all(&frame(1, text.as_bytes())).await.unwrap();
    let (first, payload) = read_frame(s).await;
    assert_eq!(first, 0x81, "a text frame: {payload:?}");
    String::from_utf8(payload).unwrap()
}

async fn assert_quiet(s: &mut TcpStream) {
    let mut b = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await {
        Err(_) => {}
        Ok(r) => panic!("the socket should be open and quiet: {r:?} {b:?}"),
    }
}

fn close_of(first: u8, payload: &[u8]) -> (u16, String) {
    assert_eq!(first, 0x88, "a close frame: {payload:?}");
    (
        u16::from_be_bytes([payload[0], payload[1]]),
        String::from_utf8_lossy(&payload[2..]).into_owned(),
    )
}

#[tokio::test]
async fn the_client_socket_outlives_the_actors_and_wakes_it_with_the_same_id() {
    let w = world(|_| {}).await;
    let mut ws = connect(&w, ACTOR).await.expect("upgrade");
    assert_eq!(echo(&mut ws, "one").await, "one");
    // The actor side closes as a suspend closes it (1001 "actor suspending").
    ws.write_all(&frame(1, b"suspend")).await.unwrap();
    assert_quiet(&mut ws).await;
    // Pings are answered with nothing behind the socket.
    ws.write_all(&frame(9, b"p")).await.unwrap();
    assert_eq!(read_frame(&mut ws).await, (0x8a, b"p".to_vec()));
    assert_eq!(w.up80.upgrades.lock().unwrap().len(), 1);
    // The next message opens a new upstream socket and is delivered, then the rest in order.
    assert_eq!(echo(&mut ws, "two").await, "two");
    for i in 0..20 {
        ws.write_all(&frame(1, format!("m{i}").as_bytes()))
            .await
            .unwrap();
    }
    for i in 0..20 {
        let (_, payload) = read_frame(&mut ws).await;
        assert_eq!(payload, format!("m{i}").into_bytes());
    }
    let seen = w.up80.upgrades.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "one upstream socket per wake");
    let id = |i: usize| seen[i].headers.get("ate-websocket-id").cloned();
    assert!(
        id(0).is_some_and(|v| v.len() == 32),
        "{:?}",
        seen[0].headers
    );
    assert_eq!(id(0), id(1), "the same client connection, the same id");
    assert!(seen[0].headers.get("ate-websocket-resumed").is_none());
    assert_eq!(seen[1].headers["ate-websocket-resumed"], "1");
    for s in &seen {
        assert_eq!(s.uri, "/ws-frames");
        assert!(s.headers.get("sec-websocket-extensions").is_none());
        assert!(s.headers.get("ate-target-actor").is_none());
    }
    // A second client connection gets another id.
    let mut other = connect(&w, ACTOR).await.expect("upgrade");
    assert_eq!(echo(&mut other, "x").await, "x");
    let third = w.up80.upgrades.lock().unwrap()[2].headers["ate-websocket-id"].clone();
    assert_ne!(Some(third), id(0));
}

#[tokio::test]
async fn a_deleted_actor_closes_the_socket_with_1000_on_its_next_message() {
    let w = world(|_| {}).await;
    let mut ws = connect(&w, ACTOR).await.expect("upgrade");
    assert_eq!(echo(&mut ws, "one").await, "one");
    // Suspended (its tunnels cut, 421 from now on), then deleted.
    w.atunnel.suspend(ACTOR);
    assert_quiet(&mut ws).await;
    w.api.script(ACTOR, |_| {
        ate_test_support::scripted_api::Reply::err(tonic::Status::not_found(
            "actor lab/h not found",
        ))
    });
    ws.write_all(&frame(1, b"anyone?")).await.unwrap();
    let (first, payload) = read_frame(&mut ws).await;
    assert_eq!(close_of(first, &payload), (1000, "actor deleted".into()));
}

#[tokio::test]
async fn over_the_per_actor_limit_an_upgrade_is_refused_with_503() {
    let w = world(|c| c.hibernate_websockets_per_actor = 1).await;
    let mut ws = connect(&w, ACTOR).await.expect("upgrade");
    assert_eq!(echo(&mut ws, "one").await, "one");
    let refused = connect(&w, ACTOR).await.expect_err("over the limit");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("--hibernate-websockets-per-actor=1"),
        "{refused}"
    );
    // The place comes back when the socket closes.
    ws.write_all(&frame(8, &1000u16.to_be_bytes()))
        .await
        .unwrap();
    let (first, _) = read_frame(&mut ws).await;
    assert_eq!(first, 0x88, "the router answers the close");
    drop(ws);
    let what = "the place to come back";
    poll_until(
        what,
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || match connect(&w, ACTOR).await {
            Ok(_) => Some(()),
            Err(e) => {
                assert!(e.starts_with("HTTP/1.1 503"), "{e}");
                None
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_drain_closes_hibernated_and_awake_sockets_with_1012() {
    let mut w = world(|_| {}).await;
    let mut awake = connect(&w, ACTOR).await.expect("upgrade");
    assert_eq!(echo(&mut awake, "a").await, "a");
    let mut asleep = connect(&w, ACTOR).await.expect("upgrade");
    assert_eq!(echo(&mut asleep, "b").await, "b");
    asleep.write_all(&frame(1, b"suspend")).await.unwrap();
    assert_quiet(&mut asleep).await;
    w.router.shutdown();
    for s in [&mut awake, &mut asleep] {
        let (first, payload) = read_frame(s).await;
        assert_eq!(
            close_of(first, &payload),
            (1012, "router restarting".into())
        );
    }
    // The drain did not wait for them (its deadline is 10 s).
    let done = w.router.done.take().unwrap();
    tokio::time::timeout(Duration::from_secs(5), done)
        .await
        .expect("the router exits once its sockets are closed")
        .unwrap();
}
