//! The warm path in process, on loopback: client → router (cache hit) → CONNECT tunnel over the
//! shared HTTP/2 connection → test atunnel → HTTP/1.1 echo upstream, and back.
//!
//! Variants: with the idle-tunnel pool (default), without it (every request opens a new CONNECT
//! stream and HTTP/1.1 handshake), and the upstream called directly as the floor; then the same
//! with 32 keep-alive connections at once (time per request = wall time / requests), where the
//! pool must hold a tunnel per concurrent request (`Tuning::tunnel_idle_per_actor`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

async fn run_requests(addr: SocketAddr, actor: Option<&str>, iters: u64) -> Duration {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let started = Instant::now();
    for _ in 0..iters {
        let mut req = http::Request::builder()
            .uri("/bench")
            .header("host", "bench.example")
            .body(Empty::<Bytes>::new())
            .unwrap();
        if let Some(actor) = actor {
            req.headers_mut()
                .insert("ate-target-actor", actor.parse().unwrap());
        }
        sender.ready().await.unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert!(resp.status().is_success());
        resp.into_body().collect().await.unwrap();
    }
    started.elapsed()
}

/// `iters` requests spread over `CONCURRENT` keep-alive connections, one in flight on each.
async fn run_concurrent(addr: SocketAddr, actor: Option<&'static str>, iters: u64) -> Duration {
    let per = iters.div_ceil(CONCURRENT);
    let started = Instant::now();
    let runs = (0..CONCURRENT).map(|_| tokio::spawn(run_requests(addr, actor, per)));
    for run in runs {
        run.await.unwrap();
    }
    // Normalised to `iters` requests (the last connection may have done a few more).
    started
        .elapsed()
        .mul_f64(iters as f64 / (per * CONCURRENT) as f64)
}

const CONCURRENT: u64 = 32;

fn warm_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (pooled, unpooled) = rt.block_on(async {
        let long_ttl = |c: &mut ate_router::RouterConfig| {
            c.assignment_cache_ttl = Duration::from_secs(3600);
        };
        let pooled = common::World::start(long_ttl).await;
        pooled.running("bench/warm");
        let unpooled = common::World::start(|c| {
            long_ttl(c);
            c.tuning.tunnel_idle_per_actor = 0;
        })
        .await;
        unpooled.running("bench/warm");
        // Fill the caches.
        run_requests(pooled.router.addr, Some("bench/warm"), 2).await;
        run_requests(unpooled.router.addr, Some("bench/warm"), 2).await;
        (pooled, unpooled)
    });

    let mut group = c.benchmark_group("warm_path");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    let direct = pooled.up80.addr;
    group.bench_function("upstream_direct", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_requests(direct, None, iters));
    });
    let addr = pooled.router.addr;
    group.bench_function("router_pooled_tunnel", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_requests(addr, Some("bench/warm"), iters));
    });
    let addr = unpooled.router.addr;
    group.bench_function("router_new_tunnel_per_request", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_requests(addr, Some("bench/warm"), iters));
    });
    group.finish();

    let mut group = c.benchmark_group("warm_path_32_connections");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("upstream_direct", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_concurrent(direct, None, iters));
    });
    let addr = pooled.router.addr;
    group.bench_function("router_pooled_tunnel", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_concurrent(addr, Some("bench/warm"), iters));
    });
    group.finish();
    drop((pooled, unpooled));
}

criterion_group!(benches, warm_path);
criterion_main!(benches);
