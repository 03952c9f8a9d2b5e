//! What the node agents report: worker expiry releasing its actors, re-registration
//! (reconciliation of the actors a worker holds), and actors' exits.

use std::time::Duration;

use ate_api::workflows::{ActorExit, HeldActor};
use ate_core::ActorState;
use ate_store::WorkerStatus;
use ate_test_support::wait::poll_until;

use super::fake_node::Op;
use super::fixture::{Plane, cfg};

/// Calls worker expiry until it marks a worker GONE. The api counts silence in wall-clock
/// milliseconds (the store's clock), so this waits on that condition, a millisecond at a time.
async fn expire_until_gone(p: &Plane) -> Vec<String> {
    poll_until(
        "a worker to expire",
        Duration::from_secs(5),
        Duration::from_millis(1),
        async || {
            let gone = p.api.expire_workers().await.expect("expiry");
            (!gone.is_empty()).then_some(gone)
        },
    )
    .await
}

#[tokio::test]
async fn an_expired_worker_releases_its_running_actors_to_their_last_generation() {
    // A 1 ms heartbeat timeout: the worker is silent for longer than that at once.
    let p = Plane::one_worker_with(2, |c| c.heartbeat_timeout = Duration::from_millis(1)).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;
    p.suspend(&a).await;
    p.resume(&a).await;
    p.resume(&b).await;

    let gone = expire_until_gone(&p).await;

    assert_eq!(gone, ["w1"]);
    let w1 = p.store.get_worker("w1").await.expect("worker");
    assert_eq!(w1.status, WorkerStatus::Gone);
    for (r, generation) in [(&a, 1), (&b, 0)] {
        let released = p.get(r).await;
        assert_eq!(released.state, ActorState::Suspended, "{r}");
        assert_eq!(released.worker_id, None, "{r}");
        assert_eq!(released.generation, generation, "{r}");
        assert!(
            released.last_error.is_some_and(|e| e.contains("gone")),
            "{r}"
        );
    }
    // No node is asked: the worker is gone.
    assert_eq!(p.nodes.calls_of(Op::Stop).len(), 0);
}

#[tokio::test]
async fn a_restarted_worker_keeps_what_it_holds_and_releases_the_rest() {
    let p = Plane::one_worker(cfg(), 4).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;
    p.resume(&b).await;
    let a_activation = p.get(&a).await.activation;
    let held = [
        HeldActor {
            actor: a.clone(),
            activation: a_activation,
        },
        // A copy of an activation the store does not name: discarded.
        HeldActor {
            actor: ate_core::ActorRef::new("ns", "stale"),
            activation: 99,
        },
    ];

    let discard = p
        .api
        .reconcile_worker("w1", &held, true)
        .await
        .expect("reconcile");

    assert_eq!(discard, [held[1].clone()]);
    assert_eq!(p.get(&a).await.state, ActorState::Running);
    let released = p.get(&b).await;
    assert_eq!(released.state, ActorState::Suspended);
    assert_eq!(released.worker_id, None);
}

#[tokio::test]
async fn an_actor_exit_releases_it_and_a_crash_reason_crashes_it() {
    let p = Plane::one_worker(cfg(), 4).await;
    let a = p.create_actor("ns", "a").await;
    let b = p.create_actor("ns", "b").await;
    p.resume(&a).await;
    p.resume(&b).await;
    let exit = |activation| ActorExit {
        worker_id: "w1",
        activation,
        exit_code: 1,
        last_lines: "panic: boom",
        crash_reason: "",
        damage: None,
    };

    // A report for another activation is stale: ignored.
    let a_activation = p.get(&a).await.activation;
    p.api
        .actor_exited(&a, exit(a_activation + 1))
        .await
        .expect("stale exit");
    assert_eq!(p.get(&a).await.state, ActorState::Running);
    p.api
        .actor_exited(&a, exit(a_activation))
        .await
        .expect("exit");
    let exited = p.get(&a).await;
    assert_eq!(exited.state, ActorState::Suspended);
    assert!(exited.last_error.is_some_and(|e| e.contains("panic: boom")));

    let b_activation = p.get(&b).await.activation;
    let crash = ActorExit {
        crash_reason: "lazy restore could not complete the memory",
        ..exit(b_activation)
    };
    p.api.actor_exited(&b, crash).await.expect("crash");
    let crashed = p.get(&b).await;
    assert_eq!(crashed.state, ActorState::Crashed);
    assert!(
        crashed
            .last_error
            .is_some_and(|e| e.contains("lazy restore could not complete"))
    );
}

#[tokio::test]
async fn an_expiry_leaves_a_suspending_actor_for_its_next_suspend_to_settle() {
    let p = Plane::one_worker_with(2, |c| {
        c.heartbeat_timeout = Duration::from_millis(1);
        c.node_call_timeout = Duration::from_millis(100);
    })
    .await;
    let a = p.running("a").await;
    let _never = p.suspend_cut_off(&a).await;

    expire_until_gone(&p).await;

    // The worker may have sealed a generation whose answer was lost: left for the next
    // request, which finds the worker gone and keeps the last generation the api knows.
    assert_eq!(p.get(&a).await.state, ActorState::Suspending);
    let view = p.suspend(&a).await;
    assert_eq!(view.actor.state, ActorState::Suspended);
    assert_eq!(view.actor.generation, 0);
    assert_eq!(p.nodes.calls_of(Op::Checkpoint).len(), 1);
}
