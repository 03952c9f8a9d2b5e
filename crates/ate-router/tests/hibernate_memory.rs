//! Heap bytes a hibernated WebSocket holds in the router (issue 35: memory per hibernated
//! socket). Live heap bytes, counted by a global allocator, not RSS: the router's side of one
//! client socket whose actor side is closed (the connection's task, the frame codec's buffers,
//! the upgrade request kept for the next wake). The end-to-end RSS figure is `ate bench
//! hibernate` (docs/benchmarks.md). It guards the big regressions: tungstenite's default 128 KiB
//! read buffer per socket, and a kept request that pins hyper's 8 KiB read buffer.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::World;

#[global_allocator]
static GLOBAL: common::heap::CountingAllocator = common::heap::CountingAllocator;

const ACTOR: &str = "lab/mem";

/// A WebSocket to the actor's `/ws-frames` over a blocking socket (it allocates nothing while
/// the heap is counted), one echo, then the text `suspend`: the upstream closes its side with
/// 1001 "actor suspending" and the router keeps the client's socket, hibernated.
fn hibernated_socket(router: std::net::SocketAddr) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(router).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        format!(
            "GET /ws-frames HTTP/1.1\r\nHost: t\r\nate-target-actor: {ACTOR}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut head = [0u8; 4];
    let mut seen = Vec::new();
    while !seen.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut head[..1]).unwrap();
        seen.push(head[0]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 101"));
    let mask = [1u8, 2, 3, 4];
    let masked = |text: &[u8]| {
        let mut f = vec![0x81, 0x80 | text.len() as u8];
        f.extend_from_slice(&mask);
        f.extend(text.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    };
    s.write_all(&masked(b"hello")).unwrap();
    let mut echo = [0u8; 7];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(&echo[2..], b"hello");
    s.write_all(&masked(b"suspend")).unwrap();
    s
}

async fn wait_hibernated(w: &World, n: usize) {
    let what = format!("{n} hibernated WebSockets");
    common::poll_until(
        &what,
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let text = common::metrics_text(w.router.metrics_addr).await;
            let hibernated =
                common::metric(&text, "ate_router_hibernate_websockets_hibernated").unwrap_or(0.0);
            (hibernated as usize >= n).then_some(())
        },
    )
    .await;
    // Let every connection finish its round of reads and closes.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// What the stand-ins keep per socket (the upstream's record of each upgrade, atunnel's of each
/// CONNECT and the handle that would cut its tunnel) is not the router's: dropped before each
/// count (cutting tunnels touches no hibernated socket: none has one).
fn forget_fixture_records(w: &World) {
    let mut upgrades = w.up80.upgrades.lock().unwrap();
    upgrades.clear();
    upgrades.shrink_to_fit();
    drop(upgrades);
    let mut connects = w.atunnel.state.connects.lock().unwrap();
    connects.clear();
    connects.shrink_to_fit();
    drop(connects);
    w.atunnel.cut_tunnels(ACTOR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_websocket_holds_little_heap() {
    const N: usize = 200;
    let w = World::start(|_| {}).await;
    w.running(ACTOR);
    w.api.hibernate_web_sockets(ACTOR);
    let router = w.router.addr;
    // The first one pays for the api connection, the tunnel to the worker and the gauges.
    let first = tokio::task::spawn_blocking(move || hibernated_socket(router))
        .await
        .unwrap();
    wait_hibernated(&w, 1).await;
    forget_fixture_records(&w);
    let before = common::heap::LIVE_BYTES.load(Ordering::Relaxed);
    let clients = tokio::task::spawn_blocking(move || {
        (0..N)
            .map(|_| hibernated_socket(router))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    wait_hibernated(&w, N + 1).await;
    forget_fixture_records(&w);
    let per = (common::heap::LIVE_BYTES.load(Ordering::Relaxed) - before) / N as i64;
    println!("live heap per hibernated WebSocket: {per} bytes");
    // Measured ~4.3 KiB: the 1 KiB read buffer, the session's task (~1.7 KiB), the upgrade
    // request kept for the next wake (in one allocation). It was ~15 KiB while that request's
    // values were slices of hyper's 8 KiB read buffer (keeping it alive), and would be ~135 KiB
    // with tungstenite's default 128 KiB read buffer.
    assert!(per < 8 * 1024, "{per} bytes per hibernated WebSocket");
    drop(clients);
    drop(first);
}
