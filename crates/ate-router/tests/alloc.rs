//! Measures heap allocations per warm request (DESIGN §6: the data path must not allocate per
//! request beyond what hyper needs). Everything runs in this process, so the figure for the
//! router path also contains the test client, the test atunnel and the upstream; the direct
//! figure (client + upstream only) is subtracted to estimate the router's and atunnel's share.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[global_allocator]
static GLOBAL: common::heap::CountingAllocator = common::heap::CountingAllocator;

async fn allocations_per_request(
    addr: SocketAddr,
    actor: Option<&str>,
    extra: Option<(&'static str, &'static str)>,
    n: u64,
) -> f64 {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut one = async |count: bool| {
        let mut req = common::bodiless_get("/a", "x", actor.map(|a| ("ate-target-actor", a)));
        if let Some((name, value)) = extra {
            req.headers_mut()
                .insert(name, http::HeaderValue::from_static(value));
        }
        sender.ready().await.unwrap();
        let resp = sender.send_request(req).await.unwrap();
        resp.into_body().collect().await.unwrap();
        // Let the pool take the tunnel back before the next request.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let _ = count;
    };
    for _ in 0..20 {
        one(false).await;
    }
    let before = common::heap::ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..n {
        one(true).await;
    }
    (common::heap::ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

#[tokio::test(flavor = "current_thread")]
async fn warm_path_allocations() {
    let w = common::World::start(|c| c.assignment_cache_ttl = Duration::from_secs(3600)).await;
    w.running("a/b");
    let direct = allocations_per_request(w.up80.addr, None, None, 200).await;
    let routed = allocations_per_request(w.router.addr, Some("a/b"), None, 200).await;
    // `ate-target-port` is checked and parsed without allocating: it costs no more than another
    // non-standard header the router strips (`proxy-connection`, hop-by-hop) costs hyper.
    let port = Some(("ate-target-port", "80"));
    let with_port = allocations_per_request(w.router.addr, Some("a/b"), port, 200).await;
    let other = Some(("proxy-connection", "80"));
    let with_other = allocations_per_request(w.router.addr, Some("a/b"), other, 200).await;
    println!(
        "allocations per request: direct {direct:.1}, through router + test atunnel {routed:.1}, \
         difference {:.1}",
        routed - direct
    );
    println!("with ate-target-port: {with_port:.1}, with another header: {with_other:.1}");
    // A client's `x-request-id` is kept (one small copy for the response) instead of a new one
    // made (one allocation shared by request and response): no dearer than any other header
    // the router passes on to the actor.
    let id = Some(("x-request-id", "client-request-id-1"));
    let with_id = allocations_per_request(w.router.addr, Some("a/b"), id, 200).await;
    let custom = Some(("x-custom-header", "client-request-id-1"));
    let with_custom = allocations_per_request(w.router.addr, Some("a/b"), custom, 200).await;
    println!("with x-request-id: {with_id:.1}, with another passed-on header: {with_custom:.1}");
    assert!(
        with_id <= with_custom + 0.5,
        "with x-request-id {with_id}, with x-custom-header {with_custom}"
    );
    // A regression guard, not a target: the router + atunnel share must stay small.
    // (22 on the CONNECT path since the request series are kept as handles and a warm request
    // makes no span; it was 29.)
    assert!(routed - direct < 30.0, "direct {direct}, routed {routed}");
    // (hyper's parse of one more non-standard header is ~3.5 allocations, in any header.)
    assert!(
        with_port <= with_other + 0.5,
        "with ate-target-port {with_port}, with proxy-connection {with_other}"
    );
}
