//! Whole-api throughput on loopback gRPC: warm-path ResumeActor calls/s, cold resumes/s (with a
//! scripted node agent that answers at once), and raw bind transactions/s against the store, on
//! SQLite and (when ATE_TEST_POSTGRES_URL is set) PostgreSQL.
//!
//!   cargo bench -p ate-api --bench api            # both stores
//!   ATE_BENCH_SECONDS=5 cargo bench -p ate-api --bench api
//!
//! Prints one line per figure; the figures go into docs/benchmarks.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ate_api::ApiConfig;
use ate_core::{ActorRef, ActorState};
use ate_proto::v1::*;
use ate_store::{Capacity, Transition};
use common::*;

fn seconds() -> Duration {
    Duration::from_secs(
        std::env::var("ATE_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
    )
}

/// Runs `f` from `concurrency` tasks for the bench duration; returns completed calls per second.
async fn rate<F, Fut>(concurrency: usize, f: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let f = Arc::new(f);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let f = f.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    if f(task, i).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn bench(backend: Backend) {
    let t = TestApi::start(
        backend,
        ApiConfig {
            fleet_max_age: Duration::from_millis(250),
            // The scripted node sends no heartbeats; keep its workers ACTIVE for the whole run.
            heartbeat_timeout: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await;
    let node = TestNode::start("node-1").await;
    for w in 0..4 {
        t.register(&node, &format!("w{w}"), 100_000).await;
    }
    t.seed("bench").await;

    // Warm path: 64 concurrent callers over 4 HTTP/2 connections, one RUNNING actor each.
    t.create_actor("bench", "warm").await;
    t.resume("bench", "warm").await.expect("resume");
    let channels: Vec<_> = (0..4)
        .map(|_| {
            tonic::transport::Endpoint::from_shared(format!("http://{}", t.addr))
                .unwrap()
                .connect_lazy()
        })
        .collect();
    let warm = rate(64, move |task, _| {
        let mut c = actor_service_client::ActorServiceClient::new(channels[task % 4].clone());
        async move {
            c.resume_actor(ResumeActorRequest {
                actor: Some(obj("bench", "warm")),
            })
            .await
            .is_ok()
        }
    })
    .await;
    println!("{backend:?}: warm ResumeActor: {warm:.0} calls/s (64 concurrent, loopback gRPC)");

    // Cold resumes: distinct suspended actors, scripted node answers at once.
    let n = 4000;
    for i in 0..n {
        t.create_actor("bench", &format!("c{i}")).await;
    }
    let next = Arc::new(AtomicU64::new(0));
    let channel = t.channel.clone();
    let cold = rate(16, move |_, _| {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let mut c = actor_service_client::ActorServiceClient::new(channel.clone());
        async move {
            i < n
                && c.resume_actor(ResumeActorRequest {
                    actor: Some(obj("bench", &format!("c{i}"))),
                })
                .await
                .is_ok_and(|r| r.get_ref().resumed)
        }
    })
    .await;
    println!(
        "{backend:?}: cold ResumeActor (lease + bind + node call + finalize): {cold:.0} resumes/s (16 concurrent)"
    );

    // Raw bind transactions: bind + release of pre-created actors, 16 concurrent.
    let store = t.api.store().clone();
    let binds = rate(16, move |task, i| {
        let store = store.clone();
        async move {
            // Disjoint actors per task: the figure is admission throughput, not lock contention.
            let per_task = n / 16;
            let actor = ActorRef::new(
                "bench",
                format!("c{}", task as u64 * per_task + i % per_task),
            );
            let demand = Capacity {
                cpu_millis: 1,
                memory_bytes: 1,
                slots: 1,
            };
            let from = [
                ActorState::Suspended,
                ActorState::Resuming,
                ActorState::Running,
            ];
            let worker = format!("w{}", task % 4);
            let bound = store.bind_actor(&actor, &from, &worker, demand, 0).await;
            let released = store
                .release_actor(
                    &actor,
                    Transition::new(&[ActorState::Resuming], ActorState::Suspended),
                    None,
                    0,
                )
                .await;
            if i == 0 && (bound.is_err() || released.is_err()) {
                eprintln!(
                    "bind/release of {} failed: {:?} / {:?}",
                    actor.name,
                    bound.as_ref().err(),
                    released.as_ref().err()
                );
            }
            bound.is_ok() && released.is_ok()
        }
    })
    .await;
    println!("{backend:?}: bind + release transactions: {binds:.0} pairs/s (16 concurrent)");
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        bench(Backend::Sqlite).await;
        if std::env::var("ATE_TEST_POSTGRES_URL").is_ok() {
            bench(Backend::Postgres).await;
        } else {
            println!("Postgres: skipped (set ATE_TEST_POSTGRES_URL)");
        }
    });
}
