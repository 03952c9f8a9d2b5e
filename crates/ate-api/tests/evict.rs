//! Slots used as a cache (issue 34), the api over loopback gRPC with scripted node agents, on
//! SQLite and PostgreSQL: when no worker has room, the least recently used running actor with
//! nothing open for `--evict-idle-after` is suspended (its generation written like any suspend)
//! and the newcomer placed; an actor with something open, or touched too recently, never is.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ate_proto::v1::*;
use common::*;
use tonic::Code;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `name` in `ns`, last active `ago_ms` before now, with `open` streams.
fn activity(ns: &str, name: &str, ago_ms: i64, open: u32) -> RunningActorActivity {
    RunningActorActivity {
        actor: Some(obj(ns, name)),
        open_streams: open,
        last_activity_unix_ms: now_ms() - ago_ms,
        ..Default::default()
    }
}

fn state(a: &Actor) -> ActorState {
    ActorState::try_from(a.state).unwrap_or(ActorState::Unspecified)
}

fn worker_of(r: &ResumeActorResponse) -> Option<String> {
    r.actor
        .as_ref()
        .and_then(|a| a.worker_assignment.as_ref())
        .map(|w| w.worker_id.clone())
}

async fn the_least_recently_used_idle_actor_makes_room(b: Backend) {
    let t = TestApi::start_with(b, |c| c.evict_idle_after = Duration::from_secs(2)).await;
    let n1 = t.one_worker(2).await;
    for a in ["a", "b", "c"] {
        t.create_actor("ns", a).await;
    }
    t.resume("ns", "a").await.expect("resume a");
    t.resume("ns", "b").await.expect("resume b");

    // w1 is full; b was used longest ago.
    n1.set_activity(vec![
        activity("ns", "a", 10_000, 0),
        activity("ns", "b", 20_000, 0),
    ]);
    let r = t.resume("ns", "c").await.expect("c finds room");
    assert_eq!(worker_of(&r).as_deref(), Some("w1"));
    assert_eq!(state(&t.get("ns", "b").await), ActorState::Suspended);
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    let b_after = t.get("ns", "b").await;
    assert_eq!(
        b_after.generation, 1,
        "the evicted actor's state was written"
    );

    // Touched within --evict-idle-after, or with something open: never evicted; b parks.
    n1.set_activity(vec![
        activity("ns", "a", 500, 0),
        activity("ns", "c", 60_000, 1),
    ]);
    let err = t.resume("ns", "b").await.err();
    assert_eq!(
        err.as_ref().map(|e| e.code()),
        Some(Code::ResourceExhausted),
        "{err:?}"
    );
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    assert_eq!(state(&t.get("ns", "c").await), ActorState::Running);
}
both_stores!(evict_lru, the_least_recently_used_idle_actor_makes_room);

async fn without_eviction_the_newcomer_parks(b: Backend) {
    let t = TestApi::start_with(b, |c| c.evict_idle_after = Duration::ZERO).await;
    let n1 = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    t.create_actor("ns", "b").await;
    t.resume("ns", "a").await.expect("resume a");
    n1.set_activity(vec![activity("ns", "a", 600_000, 0)]);
    let err = t.resume("ns", "b").await.err();
    assert_eq!(err.map(|e| e.code()), Some(Code::ResourceExhausted));
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    assert_eq!(
        n1.calls()
            .activity
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing is asked when eviction is off"
    );
}
both_stores!(evict_off, without_eviction_the_newcomer_parks);
