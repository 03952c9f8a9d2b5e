//! ResumeActor's branches: run or restore (and at which fidelity), the node's answers (refused,
//! transient, unreachable, slow, restarted), no room, quota, capabilities, single flight.

use std::time::Duration;

use ate_api::error::{ErrorKind, WorkflowError};
use ate_api::node::NodeErrorKind;
use ate_core::{ActorRef, ActorState, Fidelity};
use ate_store::StoreError;
use ate_test_support::wait::poll_until;

use super::fake_node::{Answer, Gate, Op};
use super::fixture::{Plane, WITH_CRIU, WITHOUT_CRIU, address, cfg};

#[tokio::test]
async fn a_never_run_actor_is_started_afresh_with_run() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.create_actor("ns", "a").await;

    let (view, resumed) = p.api.resume(&a, Some("req-1")).await.expect("resume");

    assert!(resumed);
    assert_eq!(view.actor.state, ActorState::Running);
    assert_eq!(view.actor.worker_id.as_deref(), Some("w1"));
    assert_eq!(view.worker.map(|w| w.id).as_deref(), Some("w1"));
    assert_eq!(view.actor.epoch, 1);
    let calls = p.nodes.calls();
    assert_eq!(p.nodes.ops(), [Op::Run]);
    assert_eq!(calls[0].address, address("n1"));
    assert_eq!(calls[0].worker_id.as_deref(), Some("w1"));
    assert_eq!(calls[0].request_id.as_deref(), Some("req-1"));
}

#[tokio::test]
async fn a_running_actor_is_answered_warm_without_a_node_call() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;

    let (view, resumed) = p.api.resume(&a, None).await.expect("warm resume");

    assert!(!resumed);
    assert_eq!(view.actor.state, ActorState::Running);
    assert_eq!(p.nodes.ops(), [Op::Run]);
}

#[tokio::test]
async fn a_suspended_actor_is_restored_from_its_newest_generation_at_its_fidelity() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;
    p.suspend(&a).await;
    p.resume(&a).await;
    p.suspend(&a).await;

    let view = p.resume(&a).await;

    assert_eq!(view.actor.state, ActorState::Running);
    assert_eq!(
        p.nodes.ops(),
        [
            Op::Run,
            Op::Checkpoint,
            Op::Restore,
            Op::Checkpoint,
            Op::Restore
        ]
    );
    let restore = p.nodes.calls_of(Op::Restore).pop().expect("a restore");
    assert_eq!(restore.generation, Some(2));
    assert_eq!(restore.fidelity, Some(Fidelity::Memory));
    // The worker that kept the generation frozen is preferred: a thaw.
    assert_eq!(restore.worker_id.as_deref(), Some("w1"));
}

#[tokio::test]
async fn a_generation_written_without_memory_is_restored_without_memory() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;
    let why = "memory dump failed; the filesystem was kept";
    p.nodes.script(
        &address("n1"),
        Op::Checkpoint,
        [Answer::Degraded(Fidelity::Rootfs, why)],
    );

    let view = p.suspend(&a).await;

    // Recorded at the fidelity the node wrote, with its reason: never as MEMORY.
    assert_eq!(view.actor.state, ActorState::Suspended);
    assert_eq!(view.actor.last_error.as_deref(), Some(why));
    let snaps = p.snapshots(&a).await;
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].fidelity, Fidelity::Rootfs);
    assert!(
        !snaps[0].requires.iter().any(|c| c == "memory:criu"),
        "{:?}",
        snaps[0].requires
    );
    p.resume(&a).await;
    let restore = p.nodes.calls_of(Op::Restore).pop().expect("a restore");
    assert_eq!(restore.fidelity, Some(Fidelity::Rootfs));
}

/// A new actor whose first start n1 fails (`kind`, saying `why`): the plane, the actor and its
/// resume's error.
async fn first_start_fails(
    kind: NodeErrorKind,
    why: &'static str,
) -> (Plane, ActorRef, WorkflowError) {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.create_actor("ns", "a").await;
    p.nodes
        .script(&address("n1"), Op::Run, [Answer::fail(kind, why)]);
    let err = p.api.resume(&a, None).await.expect_err("the start fails");
    (p, a, err)
}

#[tokio::test]
async fn a_node_refusing_the_start_crashes_the_actor_until_it_is_reverted() {
    let (p, a, err) = first_start_fails(NodeErrorKind::Failed, "wakeup probe never answered").await;

    assert!(matches!(err, WorkflowError::Crashed { .. }), "{err:?}");
    let crashed = p.get(&a).await;
    assert_eq!(crashed.state, ActorState::Crashed);
    assert_eq!(crashed.worker_id, None);
    let why = crashed.last_error.unwrap_or_default();
    assert!(why.contains("wakeup probe never answered"), "{why}");
    // A CRASHED actor is refused without asking any node.
    let again = p.api.resume(&a, None).await.expect_err("still crashed");
    assert!(matches!(again, WorkflowError::Crashed { .. }), "{again:?}");
    assert_eq!(p.nodes.ops(), [Op::Run]);
    // Reverted, it resumes.
    let reverted = p.api.revert(&a, None).await.expect("revert");
    assert_eq!(reverted.actor.state, ActorState::Suspended);
    assert_eq!(p.resume(&a).await.actor.state, ActorState::Running);
}

#[tokio::test]
async fn a_transient_answer_releases_the_actor_for_the_next_attempt_on_the_same_node() {
    let (p, a, err) =
        first_start_fails(NodeErrorKind::Transient, "worker not registered yet").await;

    assert!(
        matches!(&err, WorkflowError::WorkerUnavailable { worker_id, .. } if worker_id == "w1"),
        "{err:?}"
    );
    let released = p.get(&a).await;
    assert_eq!(released.state, ActorState::Suspended);
    assert_eq!(released.worker_id, None);
    // The node answered: it is not avoided, the next attempt goes there again.
    p.resume(&a).await;
    let runs = p.nodes.calls_of(Op::Run);
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|c| c.address == address("n1")));
}

#[tokio::test]
async fn an_unreachable_node_is_avoided_and_the_next_resume_goes_elsewhere() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.create_actor("ns", "a").await;
    p.nodes.script(&address("n1"), Op::Run, [Answer::Unreached]);

    let err = p.api.resume(&a, None).await.expect_err("unreachable");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.to_string().contains("unreachable"), "{err}");
    let released = p.get(&a).await;
    assert_eq!(released.state, ActorState::Suspended);
    assert!(
        released
            .last_error
            .is_some_and(|e| e.contains("resuming elsewhere"))
    );
    // With another node registered, the suspect one is not chosen.
    p.register("n2", "w2", 4, WITH_CRIU).await;
    for i in 0..3 {
        let b = p.create_actor("ns", &format!("b{i}")).await;
        assert_eq!(p.resume(&b).await.actor.worker_id.as_deref(), Some("w2"));
    }
    let view = p.resume(&a).await;
    assert_eq!(view.actor.worker_id.as_deref(), Some("w2"));
}

#[tokio::test]
async fn no_worker_with_room_answers_no_room_and_queues_the_resume() {
    let p = Plane::one_worker(cfg(), 1).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;

    // The api answers at once (the router parks and asks again); b waits in the queue.
    let err = p.api.resume(&b, None).await.expect_err("no room");

    assert!(matches!(err, WorkflowError::NoRoom), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::NoRoom);
    assert_eq!(p.get(&b).await.state, ActorState::Suspended);
    let queued = p.api.admission().queued(std::time::Instant::now());
    assert_eq!(queued, ["ns/b"]);
    assert_eq!(p.nodes.ops(), [Op::Run], "no node is asked for b");
    // Room freed: b is placed and leaves the queue.
    p.suspend(&a).await;
    assert_eq!(p.resume(&b).await.actor.state, ActorState::Running);
    assert!(
        p.api
            .admission()
            .queued(std::time::Instant::now())
            .is_empty()
    );
}

#[tokio::test]
async fn a_full_quota_is_refused_before_placement_naming_the_atespace() {
    let p = Plane::new(cfg()).await;
    p.seed("team-q").await;
    p.register("n1", "w1", 4, WITH_CRIU).await;
    let quota = ate_store::Capacity {
        slots: 1,
        ..Default::default()
    };
    p.store
        .set_atespace_quota("team-q", &quota)
        .await
        .expect("quota");
    let a = p.create_actor("team-q", "a").await;
    let b = p.create_actor("team-q", "b").await;
    p.resume(&a).await;

    let err = p.api.resume(&b, None).await.expect_err("over quota");

    assert_eq!(err.kind(), ErrorKind::OverQuota, "{err:?}");
    assert!(
        matches!(&err, WorkflowError::Store(StoreError::QuotaExceeded { atespace, .. }) if atespace == "team-q"),
        "{err:?}"
    );
    assert!(err.to_string().contains("team-q"), "{err}");
    assert_eq!(p.get(&b).await.state, ActorState::Suspended);
    assert_eq!(p.nodes.ops(), [Op::Run]);
}

#[tokio::test]
async fn concurrent_resumes_of_one_actor_make_one_node_call() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.create_actor("ns", "a").await;
    let gate = Gate::default();
    p.nodes
        .script(&address("n1"), Op::Run, [Answer::Ok.held(&gate)]);

    let first = {
        let (api, a) = (p.api.clone(), a.clone());
        tokio::spawn(async move { api.resume(&a, None).await })
    };
    p.nodes.wait_for(Op::Run, 1).await;
    // The first holds the actor's lease while its node call is under way.
    let second = p.api.resume(&a, None).await.expect_err("lease held");
    assert_eq!(second.kind(), ErrorKind::Aborted, "{second:?}");
    gate.open();
    let (view, resumed) = first.await.expect("join").expect("first resume");

    assert!(resumed);
    assert_eq!(view.actor.state, ActorState::Running);
    let (_, resumed) = p.api.resume(&a, None).await.expect("warm");
    assert!(!resumed);
    assert_eq!(p.nodes.ops(), [Op::Run]);
}

#[tokio::test]
async fn a_node_that_does_not_answer_in_time_leaves_the_actor_resuming_on_its_worker() {
    let p = Plane::one_worker_with(2, |c| c.node_call_timeout = Duration::from_millis(100)).await;
    let a = p.create_actor("ns", "a").await;
    let n1 = address("n1");
    // Answers long after the api gave up on it.
    let late = Answer::Ok.after(Duration::from_secs(3600));
    p.nodes.script(&n1, Op::Run, [late]);

    let err = p.api.resume(&a, None).await.expect_err("timed out");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.to_string().contains("did not answer within"), "{err}");
    // Not released: the node may still be starting it; the next resume goes back there.
    let resuming = p.get(&a).await;
    assert_eq!(resuming.state, ActorState::Resuming);
    assert_eq!(resuming.worker_id.as_deref(), Some("w1"));
    p.register("n2", "w2", 2, WITH_CRIU).await;
    let view = p.resume(&a).await;
    assert_eq!(view.actor.worker_id.as_deref(), Some("w1"));
    assert_eq!(p.nodes.calls_of(Op::Run).len(), 2);
}

#[tokio::test]
async fn a_worker_that_restarted_during_the_start_is_not_trusted() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.create_actor("ns", "a").await;
    p.nodes.script(&address("n1"), Op::Run, [Answer::Epoch(7)]);

    let err = p.api.resume(&a, None).await.expect_err("epoch mismatch");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(
        err.to_string().contains("restarted during the restore"),
        "{err}"
    );
    assert_eq!(p.get(&a).await.state, ActorState::Resuming);
    // Asked again, the worker (same epoch as registered now) starts it.
    assert_eq!(p.resume(&a).await.actor.state, ActorState::Running);
}

#[tokio::test]
async fn a_memory_generation_is_not_placed_where_it_cannot_be_restored() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;
    p.suspend(&a).await;
    // The only worker comes back without CRIU.
    p.register("n1", "w1", 2, WITHOUT_CRIU).await;

    let err = p.api.resume(&a, None).await.expect_err("no capable worker");

    assert!(
        matches!(&err, WorkflowError::NoCapableWorker { missing, generation: 1, fidelity: Fidelity::Memory } if missing == &["memory:criu"]),
        "{err:?}"
    );
    assert_eq!(p.get(&a).await.state, ActorState::Suspended);
    assert!(p.nodes.calls_of(Op::Restore).is_empty());
}

/// Actor `a` suspended with its generation only on n1 (its durable copy PENDING), n1 (one slot)
/// full with `b`, and a second node n2 with room: `a`'s resume has to move its generation.
async fn held_on_a_full_node() -> (Plane, ActorRef) {
    let p = Plane::one_worker(cfg(), 1).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;
    p.suspend(&a).await;
    p.resume(&b).await;
    p.register("n2", "w2", 1, WITH_CRIU).await;
    (p, a)
}

#[tokio::test]
async fn a_generation_held_on_a_full_node_is_uploaded_and_restored_elsewhere() {
    let (p, a) = held_on_a_full_node().await;

    let view = p.resume(&a).await;

    assert_eq!(view.actor.worker_id.as_deref(), Some("w2"));
    let detach = p.nodes.calls_of(Op::Detach).pop().expect("a detach");
    assert_eq!(detach.address, address("n1"));
    let restore = p.nodes.calls_of(Op::Restore).pop().expect("a restore");
    assert_eq!(restore.address, address("n2"));
    assert_eq!(restore.generation, Some(1));
    let snap = &p.snapshots(&a).await[0];
    assert_eq!(snap.local_path, None, "the local copy was dropped");
    assert_eq!(
        snap.durable_status,
        Some(ate_core::DurableStatus::Completed)
    );
}

#[tokio::test]
async fn a_damaged_generation_crashes_the_actor_and_is_never_chosen_again() {
    let p = Plane::one_worker(cfg(), 2).await;
    let a = p.running("a").await;
    p.suspend(&a).await;
    p.resume(&a).await;
    p.suspend(&a).await;
    p.nodes.script(
        &address("n1"),
        Op::Restore,
        [Answer::Damaged {
            local: true,
            durable: false,
        }],
    );

    let err = p.api.resume(&a, None).await.expect_err("damaged");

    assert!(matches!(err, WorkflowError::Crashed { .. }), "{err:?}");
    assert_eq!(p.get(&a).await.state, ActorState::Crashed);
    let snaps = p.snapshots(&a).await;
    let g2 = snaps
        .iter()
        .find(|s| s.generation == 2)
        .expect("generation 2");
    assert!(g2.local_damage.is_some(), "the damaged copy is recorded");
    // Reverted, the actor resumes from generation 1: generation 2 has no intact copy.
    p.api.revert(&a, None).await.expect("revert");
    p.resume(&a).await;
    assert_eq!(p.last_restored_generation(), Some(1));
}

#[tokio::test]
async fn a_resume_finishes_a_suspend_that_was_cut_off_then_restores_its_generation() {
    // Short leases: a SUSPENDING actor is stale (its suspend dead) after 50 ms.
    let p = Plane::one_worker_with(2, |c| {
        c.lease_ttl = Duration::from_millis(50);
        c.node_call_timeout = Duration::from_millis(100);
    })
    .await;
    let a = p.running("a").await;
    let _never = p.suspend_cut_off(&a).await;
    assert_eq!(p.get(&a).await.state, ActorState::Suspending);

    // While the suspend could still be alive the caller is told to wait (the router parks);
    // once it is stale the resume finishes it (a second checkpoint) and restores from it.
    let stale = "the SUSPENDING actor to go stale";
    let answer = poll_until(
        stale,
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || match p.api.resume(&a, None).await {
            Err(WorkflowError::Busy { .. }) => None,
            other => Some(other),
        },
    )
    .await;
    let (view, resumed) = answer.expect("resume");

    assert!(resumed);
    assert_eq!(view.actor.state, ActorState::Running);
    assert_eq!(view.actor.generation, 1);
    assert_eq!(
        p.nodes.ops(),
        [Op::Run, Op::Checkpoint, Op::Checkpoint, Op::Restore]
    );
}

#[tokio::test]
async fn a_generation_that_cannot_be_uploaded_leaves_the_actor_suspended() {
    let (p, a) = held_on_a_full_node().await;
    p.nodes.script(
        &address("n1"),
        Op::Detach,
        [Answer::fail(
            NodeErrorKind::Failed,
            "object store unreachable",
        )],
    );

    let err = p.api.resume(&a, None).await.expect_err("detach failed");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(
        err.to_string().contains("object store unreachable"),
        "{err}"
    );
    let actor = p.get(&a).await;
    assert_eq!(actor.state, ActorState::Suspended);
    assert_eq!(actor.worker_id, None);
    // The local copy is kept: it is all there is.
    assert!(p.snapshots(&a).await[0].local_path.is_some());
    assert!(p.nodes.calls_of(Op::Restore).is_empty());
}

#[tokio::test]
async fn a_new_actor_starts_from_its_templates_golden_tag_restoring_only_its_volumes() {
    let p = Plane::one_worker(cfg(), 2).await;
    let seed = p.running("seed").await;
    p.api
        .suspend(&seed, true, "")
        .await
        .expect("durable suspend");
    let snapshot = p.snapshots(&seed).await.remove(0);
    let tag = ate_store::TagRecord {
        atespace: "ns".into(),
        name: "gold".into(),
        snapshot,
        created_ms: 0,
    };
    p.store.create_tag(&tag).await.expect("tag");
    let golden = ate_core::TemplateSpec {
        golden_tag: Some("ns/gold".into()),
        ..super::fixture::spec()
    };
    p.store
        .apply_template("ns", "g", &golden, 0)
        .await
        .expect("template");
    let b = p.create_actor_of("ns", "b", "g").await;

    p.resume(&b).await;

    let restore = p.nodes.calls_of(Op::Restore).pop().expect("a restore");
    assert_eq!(restore.actor.as_ref(), Some(&b));
    assert_eq!(restore.generation, Some(1));
    // Captured under another template (ns/t): only its volumes are restored.
    assert_eq!(restore.fidelity, Some(Fidelity::Volumes));
}
