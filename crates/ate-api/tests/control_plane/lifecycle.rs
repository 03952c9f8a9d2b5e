//! DeleteActor (plain and forced), eviction of the least recently used idle actor, and the
//! read-only calls (`ate top`, the actor's log).

use std::time::Duration;

use ate_api::error::ErrorKind;
use ate_api::node::{NodeErrorKind, RunningActivity};
use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};

use super::fake_node::{Answer, Op};
use super::fixture::{Plane, WITH_CRIU, actor, address, cfg};

#[tokio::test]
async fn a_running_actor_is_not_deleted_without_force() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;

    let err = p.api.delete(&a, false, false).await.expect_err("running");

    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err:?}");
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(p.get(&a).await.state, ActorState::Running);
    assert_eq!(p.nodes.ops(), [Op::Run]);
}

#[tokio::test]
async fn a_suspended_actor_is_deleted_with_its_generations_and_forgotten_on_every_node() {
    let p = Plane::one_worker(cfg(), 2).await;
    p.register("n2", "w2", 2, WITH_CRIU).await;
    let a = p.running("a").await;
    p.suspend(&a).await;

    let (stopped, purged) = p.api.delete(&a, false, false).await.expect("delete");

    assert!(!stopped);
    assert_eq!(purged, 0);
    assert!(p.store.get_actor(&a).await.is_err(), "the actor is gone");
    // Its generation's files are deleted through the node holding them.
    let deleted = p.nodes.calls_of(Op::DeleteSnapshots);
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].generation, Some(1));
    let mut forgotten: Vec<String> = p
        .nodes
        .calls_of(Op::ForgetActor)
        .into_iter()
        .map(|c| c.address)
        .collect();
    forgotten.sort();
    assert_eq!(forgotten, [address("n1"), address("n2")]);
}

#[tokio::test]
async fn a_forced_delete_stops_the_sandbox_without_a_snapshot() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;

    let (stopped, _) = p.api.delete(&a, true, false).await.expect("forced delete");

    assert!(stopped);
    assert!(p.store.get_actor(&a).await.is_err());
    let stop = p.nodes.calls_of(Op::Stop).pop().expect("a stop");
    assert_eq!(stop.worker_id.as_deref(), Some("w1"));
    assert!(p.nodes.calls_of(Op::Checkpoint).is_empty());
}

#[tokio::test]
async fn a_forced_delete_whose_stop_fails_deletes_nothing() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;
    p.nodes.script(
        &address("n1"),
        Op::Stop,
        [Answer::fail(NodeErrorKind::Failed, "sandbox busy")],
    );

    let err = p
        .api
        .delete(&a, true, false)
        .await
        .expect_err("stop failed");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.to_string().contains("nothing was deleted"), "{err}");
    assert_eq!(p.get(&a).await.state, ActorState::Running);
}

/// `a` on its node, last active `ago_ms` before now, with `open` streams.
fn activity(a: &ActorRef, ago_ms: i64, open: u32) -> RunningActivity {
    RunningActivity {
        actor: a.clone(),
        open_streams: open,
        last_activity_unix_ms: now_ms() - ago_ms,
        cpu_millis: 0,
        memory_bytes: 0,
        active_since_unix_ms: 0,
    }
}

#[tokio::test]
async fn eviction_suspends_the_least_recently_used_idle_actor() {
    let p = Plane::one_worker_with(2, |c| c.evict_idle_after = Duration::from_secs(2)).await;
    let [a, b, c] = ["a", "b", "c"].map(|n| actor("ns", n));
    for r in [&a, &b, &c] {
        p.create_actor(&r.atespace, &r.name).await;
    }
    p.resume(&a).await;
    p.resume(&b).await;
    p.nodes.set_activity(
        &address("n1"),
        vec![activity(&a, 10_000, 0), activity(&b, 20_000, 0)],
    );

    let view = p.resume(&c).await;

    assert_eq!(view.actor.worker_id.as_deref(), Some("w1"));
    let evicted = p.get(&b).await;
    assert_eq!(evicted.state, ActorState::Suspended);
    assert_eq!(evicted.generation, 1, "its state was written");
    assert_eq!(p.get(&a).await.state, ActorState::Running);
    let checkpoint = p
        .nodes
        .calls_of(Op::Checkpoint)
        .pop()
        .expect("a checkpoint");
    assert_eq!(checkpoint.actor.as_ref(), Some(&b));

    // Touched within the idle time, or with something open: not evicted; b finds no room.
    p.nodes.set_activity(
        &address("n1"),
        vec![activity(&a, 500, 0), activity(&c, 60_000, 1)],
    );
    let err = p.api.resume(&b, None).await.expect_err("no room");
    assert_eq!(err.kind(), ErrorKind::NoRoom, "{err:?}");
    assert_eq!(p.get(&a).await.state, ActorState::Running);
    assert_eq!(p.get(&c).await.state, ActorState::Running);
    assert_eq!(p.nodes.calls_of(Op::Checkpoint).len(), 1);
}

#[tokio::test]
async fn without_eviction_no_node_is_asked_what_its_actors_do() {
    let p = Plane::one_worker(cfg(), 1).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;
    p.nodes
        .set_activity(&address("n1"), vec![activity(&a, 600_000, 0)]);

    let err = p.api.resume(&b, None).await.expect_err("no room");

    assert_eq!(err.kind(), ErrorKind::NoRoom);
    assert!(p.nodes.calls_of(Op::ActorActivity).is_empty());
}

#[tokio::test]
async fn top_names_the_workers_whose_node_did_not_answer() {
    let p = Plane::one_worker(cfg(), 2).await;
    p.register("n2", "w2", 2, WITH_CRIU).await;
    let a = p.create_actor("ns", "a").await;
    let mut busy = activity(&a, 0, 1);
    busy.cpu_millis = 300;
    p.nodes.set_activity(&address("n1"), vec![busy]);
    p.nodes
        .script(&address("n2"), Op::ActorActivity, [Answer::Unreached]);

    let (usage, unreachable) = p.api.top(None).await.expect("top");

    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].actor, a);
    assert_eq!(usage[0].worker_id, "w1");
    assert_eq!(usage[0].cpu_millis, 300);
    assert_eq!(unreachable, ["w2"]);
}

#[tokio::test]
async fn the_log_is_read_on_the_node_the_actor_runs_on() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.create_actor("ns", "a").await;
    let never_ran = p.api.read_log(&a, 0).await.expect_err("no log yet");
    assert_eq!(never_ran.kind(), ErrorKind::NotFound);
    p.resume(&a).await;

    let log = p.api.read_log(&a, 0).await.expect("log");

    assert_eq!(log.node, "n1");
    assert_eq!(log.data, b"log of ns/a\n");
    assert_eq!(p.nodes.calls_of(Op::ReadLog)[0].address, address("n1"));
}

#[tokio::test]
async fn a_revert_to_a_chosen_generation_is_what_the_next_resume_restores() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;
    p.suspend(&a).await;
    p.resume(&a).await;
    p.suspend(&a).await;

    let missing = p
        .api
        .revert(&a, Some(7))
        .await
        .expect_err("no generation 7");
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing:?}");
    let view = p.api.revert(&a, Some(1)).await.expect("revert to 1");

    assert_eq!(view.actor.state, ActorState::Suspended);
    let next: Vec<u64> = p
        .api
        .generations(&a)
        .await
        .expect("generations")
        .into_iter()
        .filter(|g| g.next)
        .map(|g| g.snapshot.generation)
        .collect();
    assert_eq!(next, [1]);
    p.resume(&a).await;
    assert_eq!(p.last_restored_generation(), Some(1));
}

#[tokio::test]
async fn an_eviction_whose_suspend_fails_leaves_the_actor_running_and_the_newcomer_waiting() {
    let p = Plane::one_worker_with(1, |c| c.evict_idle_after = Duration::from_secs(2)).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;
    p.nodes
        .set_activity(&address("n1"), vec![activity(&a, 60_000, 0)]);
    // The victim's suspend fails (the node gave up the dump): it runs on.
    let gave_up = Answer::fail(NodeErrorKind::Aborted, "dump aborted");
    p.nodes.script(&address("n1"), Op::Checkpoint, [gave_up]);

    let err = p.api.resume(&b, None).await.expect_err("no room");

    assert_eq!(err.kind(), ErrorKind::NoRoom, "{err:?}");
    assert_eq!(p.get(&a).await.state, ActorState::Running);
    assert_eq!(p.get(&b).await.state, ActorState::Suspended);
    assert_eq!(p.nodes.calls_of(Op::Checkpoint).len(), 1);
    assert_eq!(p.nodes.calls_of(Op::Run).len(), 1, "b was never started");
}
