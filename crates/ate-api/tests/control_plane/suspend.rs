//! SuspendActor's branches: the generation recorded, and each way a checkpoint fails (the actor
//! runs on, goes back to its previous generation, crashes, or is asked again).

use std::time::Duration;

use ate_api::error::{ErrorKind, WorkflowError};
use ate_api::node::NodeErrorKind;
use ate_core::{ActorState, DurableStatus, Fidelity};

use super::fake_node::{Answer, Gate, Op};
use super::fixture::{Plane, address, cfg};

/// A plane with worker w1 on n1 and actor ns/a RUNNING on it.
async fn running() -> (Plane, ate_core::ActorRef) {
    running_with(cfg()).await
}

async fn running_with(cfg: ate_api::ApiConfig) -> (Plane, ate_core::ActorRef) {
    let p = Plane::one_worker(cfg, 2).await;
    let a = p.running("a").await;
    (p, a)
}

#[tokio::test]
async fn a_suspend_records_the_generation_the_node_wrote() {
    let (p, a) = running().await;

    let view = p.api.suspend(&a, true, "requested").await.expect("suspend");

    assert_eq!(view.actor.state, ActorState::Suspended);
    assert_eq!(view.actor.generation, 1);
    assert_eq!(view.actor.worker_id, None);
    assert_eq!(view.actor.last_error, None);
    let checkpoint = p
        .nodes
        .calls_of(Op::Checkpoint)
        .pop()
        .expect("a checkpoint");
    assert_eq!(checkpoint.address, address("n1"));
    assert_eq!(checkpoint.generation, Some(1));
    assert_eq!(checkpoint.fidelity, Some(Fidelity::Memory));
    let snaps = p.snapshots(&a).await;
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].generation, 1);
    assert_eq!(snaps[0].fidelity, Fidelity::Memory);
    assert_eq!(snaps[0].node, "n1");
    assert_eq!(snaps[0].durable_status, Some(DurableStatus::Completed));
    // What restoring it needs: CRIU, and the user-namespace mode it was dumped in.
    assert_eq!(snaps[0].requires, ["memory:criu", "userns:off"]);
    // Suspending a suspended actor answers at once.
    let again = p.suspend(&a).await;
    assert_eq!(again.actor.generation, 1);
    assert_eq!(p.nodes.calls_of(Op::Checkpoint).len(), 1);
}

#[tokio::test]
async fn a_checkpoint_the_node_gave_up_leaves_the_actor_running() {
    let (p, a) = running().await;
    p.nodes.script(
        &address("n1"),
        Op::Checkpoint,
        [Answer::fail(NodeErrorKind::Aborted, "disk full")],
    );

    let err = p.api.suspend(&a, false, "").await.expect_err("aborted");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    let actor = p.get(&a).await;
    assert_eq!(actor.state, ActorState::Running);
    assert_eq!(actor.worker_id.as_deref(), Some("w1"));
    assert_eq!(actor.generation, 0);
    assert!(
        actor
            .last_error
            .is_some_and(|e| e.contains("suspend failed") && e.contains("disk full"))
    );
    assert!(p.snapshots(&a).await.is_empty());
}

#[tokio::test]
async fn a_checkpoint_that_lost_the_sandbox_goes_back_to_the_previous_generation() {
    let (p, a) = running().await;
    p.suspend(&a).await;
    p.resume(&a).await;
    p.nodes.script(
        &address("n1"),
        Op::Checkpoint,
        [Answer::fail(
            NodeErrorKind::SandboxLost,
            "criu dump killed the task",
        )],
    );

    let err = p
        .api
        .suspend(&a, false, "")
        .await
        .expect_err("sandbox lost");

    // Not reported as a suspend that kept the memory: nothing new is recorded, the actor is
    // SUSPENDED at generation 1, and the error says what was lost.
    assert!(matches!(err, WorkflowError::Internal(_)), "{err:?}");
    assert!(err.to_string().contains("back at generation 1"), "{err}");
    let actor = p.get(&a).await;
    assert_eq!(actor.state, ActorState::Suspended);
    assert_eq!(actor.generation, 1);
    assert_eq!(actor.worker_id, None);
    assert!(
        actor
            .last_error
            .is_some_and(|e| e.contains("did not survive"))
    );
    let snaps = p.snapshots(&a).await;
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].generation, 1);
    // The next resume restores generation 1, the memory it really has.
    p.resume(&a).await;
    assert_eq!(p.last_restored_generation(), Some(1));
}

#[tokio::test]
async fn a_failed_checkpoint_crashes_the_actor_keeping_its_last_generation() {
    let (p, a) = running().await;
    p.nodes.script(
        &address("n1"),
        Op::Checkpoint,
        [Answer::fail(NodeErrorKind::Failed, "tar: no space")],
    );

    let err = p.api.suspend(&a, false, "").await.expect_err("failed");

    assert!(matches!(err, WorkflowError::Internal(_)), "{err:?}");
    let actor = p.get(&a).await;
    assert_eq!(actor.state, ActorState::Crashed);
    assert_eq!(actor.generation, 0);
    assert!(
        actor
            .last_error
            .is_some_and(|e| e.contains("checkpoint on worker w1 failed"))
    );
}

#[tokio::test]
async fn a_restarting_node_is_asked_again_for_the_same_generation() {
    let (p, a) = running().await;
    p.nodes.script(
        &address("n1"),
        Op::Checkpoint,
        [Answer::fail(
            NodeErrorKind::Transient,
            "node agent restarting",
        )],
    );
    let began = std::time::Instant::now();

    let view = p.suspend(&a).await;

    assert_eq!(view.actor.state, ActorState::Suspended);
    let tries = p.nodes.calls_of(Op::Checkpoint);
    assert_eq!(tries.len(), 2);
    // Every try names the same generation, so a worker that sealed it answers from it.
    assert!(tries.iter().all(|c| c.uuid == tries[0].uuid));
    assert!(tries.iter().all(|c| c.generation == Some(1)));
    // After the first pause (200 ms; real time: see the module's note on paused time).
    assert!(began.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_checkpoint_that_does_not_answer_in_time_leaves_the_actor_suspending() {
    let (p, a) = running_with(ate_api::ApiConfig {
        node_call_timeout: Duration::from_millis(100),
        ..cfg()
    })
    .await;
    // Never answers: the gate is not opened.
    let gate = Gate::default();
    p.nodes
        .script(&address("n1"), Op::Checkpoint, [Answer::Ok.held(&gate)]);

    let err = p.api.suspend(&a, false, "").await.expect_err("timed out");

    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert_eq!(p.get(&a).await.state, ActorState::Suspending);
    // The next suspend finishes it.
    assert_eq!(p.suspend(&a).await.actor.state, ActorState::Suspended);
}

#[tokio::test]
async fn a_suspend_whose_worker_is_gone_keeps_the_last_generation() {
    let (p, a) = running().await;
    p.store.deregister_worker("w1").await.expect("deregister");

    let view = p.suspend(&a).await;

    assert_eq!(view.actor.state, ActorState::Suspended);
    assert_eq!(view.actor.generation, 0);
    assert!(
        view.actor
            .last_error
            .is_some_and(|e| e.contains("worker gone before the suspend"))
    );
    assert!(p.nodes.calls_of(Op::Checkpoint).is_empty());
}
