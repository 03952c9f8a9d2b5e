//! Heap bytes a parked HTTP/1.1 request holds (issue 4: ≤ 16 KiB of router RSS per parked
//! request, measured end to end by `scripts/park-memory.py`). This in-process figure counts live
//! heap bytes, not RSS: hyper's two 8 KiB connection buffers are in it even where their pages were
//! never touched. It guards the two big regressions measured: a doubled (16 KiB) or second read
//! buffer per connection, and a request future that carries the tunnel-open futures (~9 KiB).

mod common;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ate_router::Stats;
use common::{Reply, World, no_room};

#[global_allocator]
static GLOBAL: common::heap::CountingAllocator = common::heap::CountingAllocator;

async fn wait_parked(stats: &Stats, n: u64) {
    common::wait_parked(stats, n).await;
    // Let every connection finish its first round of reads.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_request_holds_little_heap() {
    const N: usize = 200;
    let w = World::start(|c| c.parked_request_budget = Duration::from_secs(10)).await;
    w.api.script("lab/p", |_| Reply::err(no_room()));
    let request =
        b"GET /x?y=1 HTTP/1.1\r\nhost: x\r\nuser-agent: t\r\nate-target-actor: lab/p\r\n\r\n";
    // Blocking std sockets: the client side allocates nothing while we count.
    let mut clients = Vec::with_capacity(N + 1);
    let park = |clients: &mut Vec<std::net::TcpStream>| {
        let mut tcp = std::net::TcpStream::connect(w.router.addr).unwrap();
        tcp.write_all(request).unwrap();
        clients.push(tcp);
    };
    // The first one pays for the flight, the api connection and the gauges.
    park(&mut clients);
    wait_parked(&w.router.stats, 1).await;
    let before = common::heap::LIVE_BYTES.load(Ordering::Relaxed);
    for _ in 0..N {
        park(&mut clients);
    }
    wait_parked(&w.router.stats, N as u64 + 1).await;
    let per = (common::heap::LIVE_BYTES.load(Ordering::Relaxed) - before) / N as i64;
    println!("live heap per parked request: {per} bytes");
    // Measured ~20 KiB: 8 KiB read + 8 KiB write buffer (hyper's), ~2 KiB request future,
    // ~1 KiB connection task, the rest small. It was ~38 KiB before (16 KiB read buffer, 9.4 KiB
    // request future, 3.7 KiB task).
    assert!(per < 24 * 1024, "{per} bytes per parked request");
    drop(clients);
}
