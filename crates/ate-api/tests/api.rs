//! The api end to end over loopback gRPC, on SQLite and PostgreSQL, with scripted node agents.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use ate_api::{ApiConfig, FaultPoint};
use ate_core::{CRASHED_PREREQUISITE, NO_ROOM_MESSAGE};
use ate_proto::v1::*;
use ate_test_support::test_node::NodeBehaviour;
use common::*;
use tonic::Code;

fn state(a: &Actor) -> ActorState {
    ActorState::try_from(a.state).unwrap_or(ActorState::Unspecified)
}

async fn crud_and_validation(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    // Invalid names: InvalidArgument naming the field, nothing written.
    let err = t
        .atespaces()
        .create_atespace(CreateAtespaceRequest {
            name: "Bad_Name".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("atespace"), "{}", err.message());
    assert!(
        t.atespaces()
            .list_atespaces(ListAtespacesRequest {})
            .await
            .unwrap()
            .into_inner()
            .atespaces
            .is_empty()
    );

    t.seed("team-a").await;
    let dup = t
        .atespaces()
        .create_atespace(CreateAtespaceRequest {
            name: "team-a".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);

    // Template validation names the field.
    let mut bad = template("team-a", "bad");
    bad.spec.as_mut().unwrap().containers[0].image = "Not An Image".into();
    let err = t
        .templates()
        .apply_template(ApplyTemplateRequest {
            template: Some(bad),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("spec.containers[0].image"),
        "{}",
        err.message()
    );
    let err = t
        .templates()
        .get_template(GetTemplateRequest {
            namespace: "team-a".into(),
            name: "bad".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let missing_ns = t
        .templates()
        .apply_template(ApplyTemplateRequest {
            template: Some(template("nope", "t")),
        })
        .await
        .unwrap_err();
    assert_eq!(missing_ns.code(), Code::NotFound);

    // Actors.
    let err = t
        .actors()
        .create_actor(CreateActorRequest {
            atespace: "team-a".into(),
            name: "a1".into(),
            template: "team-a/missing".into(),
            worker_selector: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = t
        .actors()
        .create_actor(CreateActorRequest {
            atespace: "team-a".into(),
            name: "a1".into(),
            template: "no-slash".into(),
            worker_selector: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("template"), "{}", err.message());
    let bad_sel = t
        .actors()
        .create_actor(CreateActorRequest {
            atespace: "team-a".into(),
            name: "a1".into(),
            template: "team-a/t".into(),
            worker_selector: [("bad key".to_string(), "v".to_string())].into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_sel.code(), Code::InvalidArgument);
    assert!(
        t.actors()
            .list_actors(ListActorsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .actors
            .is_empty()
    );

    for i in 0..5 {
        let a = t.create_actor("team-a", &format!("a{i}")).await;
        assert_eq!(state(&a), ActorState::Suspended);
        assert!(!a.uid.is_empty());
    }
    let dup = t
        .actors()
        .create_actor(CreateActorRequest {
            atespace: "team-a".into(),
            name: "a0".into(),
            template: "team-a/t".into(),
            worker_selector: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);

    // Paging.
    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = t
            .actors()
            .list_actors(ListActorsRequest {
                atespace: "team-a".into(),
                page_size: 2,
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.actors.len() <= 2);
        names.extend(page.actors.into_iter().map(|a| a.name));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(names, ["a0", "a1", "a2", "a3", "a4"]);
    let bad_token = t
        .actors()
        .list_actors(ListActorsRequest {
            atespace: String::new(),
            page_size: 2,
            page_token: "%%".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_token.code(), Code::InvalidArgument);

    // Update selector.
    let updated = t
        .actors()
        .update_actor(UpdateActorRequest {
            actor: Some(obj("team-a", "a1")),
            worker_selector: [("zone".to_string(), "b".to_string())].into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        updated.worker_selector.get("zone").map(String::as_str),
        Some("b")
    );

    // Deleting an atespace that holds actors is refused; the template too.
    let err = t
        .atespaces()
        .delete_atespace(DeleteAtespaceRequest {
            name: "team-a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let err = t
        .templates()
        .delete_template(DeleteTemplateRequest {
            namespace: "team-a".into(),
            name: "t".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);

    for i in 0..5 {
        t.actors()
            .delete_actor(DeleteActorRequest {
                actor: Some(obj("team-a", &format!("a{i}"))),
                force: false,
                purge_volumes: false,
            })
            .await
            .unwrap();
    }
    let gone = t
        .actors()
        .get_actor(GetActorRequest {
            actor: Some(obj("team-a", "a0")),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    t.templates()
        .delete_template(DeleteTemplateRequest {
            namespace: "team-a".into(),
            name: "t".into(),
        })
        .await
        .unwrap();
    t.atespaces()
        .delete_atespace(DeleteAtespaceRequest {
            name: "team-a".into(),
        })
        .await
        .unwrap();
    let err = t
        .atespaces()
        .get_atespace(GetAtespaceRequest {
            name: "team-a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}
both_stores!(crud, crud_and_validation);

async fn cold_then_warm(b: Backend) {
    let t = TestApi::start(
        b,
        ApiConfig {
            fleet_max_age: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await;
    let node = t.one_worker(4).await;
    t.create_actor("ns", "a").await;

    let cold = t.resume("ns", "a").await.unwrap();
    assert!(cold.resumed);
    assert!(
        !cold.hibernate_web_sockets,
        "webSockets: close is the default"
    );
    let actor = cold.actor.unwrap();
    assert_eq!(state(&actor), ActorState::Running);
    let wa = actor.worker_assignment.unwrap();
    assert_eq!(wa.worker_id, "w1");
    assert_eq!(wa.addresses, ["127.0.0.2:8443"]);
    assert_eq!(wa.epoch, node.epoch());
    assert!(wa.worker_identity.starts_with("spiffe://"));
    assert_eq!(node.calls().run.load(Ordering::SeqCst), 1);

    // Warm path: one store read, no lease, no node call.
    let (reads0, writes0, leases0) = t.api.store().counters().snapshot();
    let warm = t.resume("ns", "a").await.unwrap();
    let (reads1, writes1, leases1) = t.api.store().counters().snapshot();
    assert!(!warm.resumed);
    assert_eq!(
        warm.actor.unwrap().worker_assignment.unwrap().worker_id,
        "w1"
    );
    assert_eq!(
        (reads1 - reads0, writes1 - writes0, leases1 - leases0),
        (1, 0, 0)
    );
    assert_eq!(node.calls().run.load(Ordering::SeqCst), 1);

    // An actor of a template with webSockets: hibernate: every ResumeActor says so (the router
    // terminates its WebSockets), cold and warm; the warm path still reads the store once.
    let mut hibernating = common::template("ns", "h");
    if let Some(spec) = hibernating.spec.as_mut() {
        spec.hibernate_web_sockets = true;
    }
    t.templates()
        .apply_template(ApplyTemplateRequest {
            template: Some(hibernating),
        })
        .await
        .expect("apply template");
    t.actors()
        .create_actor(CreateActorRequest {
            atespace: "ns".into(),
            name: "b".into(),
            template: "ns/h".into(),
            worker_selector: Default::default(),
        })
        .await
        .expect("create actor");
    let cold = t.resume("ns", "b").await.unwrap();
    assert!(cold.resumed && cold.hibernate_web_sockets);
    let (reads0, _, _) = t.api.store().counters().snapshot();
    assert!(t.resume("ns", "b").await.unwrap().hibernate_web_sockets);
    let (reads1, _, _) = t.api.store().counters().snapshot();
    assert_eq!(reads1 - reads0, 1, "the warm path stays one read");
    assert!(!t.resume("ns", "a").await.unwrap().hibernate_web_sockets);

    // Unknown actor, malformed names.
    assert_eq!(
        t.resume("ns", "nobody").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        t.resume("NS", "a").await.unwrap_err().code(),
        Code::InvalidArgument
    );
}
both_stores!(warm_path, cold_then_warm);

async fn no_room(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let _node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    t.create_actor("ns", "b").await;
    t.resume("ns", "a").await.unwrap();
    let err = t.resume("ns", "b").await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), NO_ROOM_MESSAGE);
    assert_eq!(state(&t.get("ns", "b").await), ActorState::Suspended);
    // Suspending `a` frees the slot.
    let s = t.suspend("ns", "a").await.unwrap();
    assert_eq!(state(&s), ActorState::Suspended);
    assert_eq!(s.generation, 1);
    assert!(t.resume("ns", "b").await.unwrap().resumed);
    // A worker selector nothing matches.
    t.actors()
        .update_actor(UpdateActorRequest {
            actor: Some(obj("ns", "a")),
            worker_selector: [("zone".to_string(), "mars".to_string())].into(),
        })
        .await
        .unwrap();
    let node2 = TestNode::start("node-2").await;
    t.register(&node2, "w2", 4).await;
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::ResourceExhausted
    );
}
both_stores!(resource_exhausted, no_room);

/// Freed room goes to the oldest waiting resume, not to whoever asks first after the release.
async fn freed_room_goes_to_the_oldest_waiter(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    // Generous hold so a slow test machine cannot let b's claim lapse between the steps.
    t.api
        .admission()
        .set_timing(Duration::from_secs(30), Duration::from_secs(60));
    let node = t.one_worker(1).await;
    for n in ["a", "b", "c"] {
        t.create_actor("ns", n).await;
    }
    t.resume("ns", "a").await.unwrap();
    // b finds no room: it waits (its router parks the request and retries).
    let err = t.resume("ns", "b").await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    // a's suspend frees the only slot ...
    t.suspend("ns", "a").await.unwrap();
    // ... which a newcomer asking first does not get: same answer as a full pool, so its
    // router parks it too.
    let err = t.resume("ns", "c").await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), NO_ROOM_MESSAGE);
    assert_eq!(state(&t.get("ns", "c").await), ActorState::Suspended);
    // b's next attempt takes it.
    let r = t.resume("ns", "b").await.unwrap();
    assert!(r.resumed);
    assert_eq!(r.actor.unwrap().worker_assignment.unwrap().worker_id, "w1");
    // Next in line is c (it failed before a asked again), so a is refused now.
    t.suspend("ns", "b").await.unwrap();
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert_eq!(
        t.api.admission().queued(std::time::Instant::now()),
        ["ns/c", "ns/a"]
    );
    // A waiter that stops asking stops holding room after the hold: c's client went away.
    t.api
        .admission()
        .set_timing(Duration::from_millis(200), Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.resume("ns", "a").await.unwrap().resumed);
    assert_eq!(
        t.api.admission().queued(std::time::Instant::now()),
        ["ns/c"]
    );
    // Deleting a waiter removes it from the queue, and every live node is asked to forget it
    // (its log).
    t.actors()
        .delete_actor(DeleteActorRequest {
            actor: Some(obj("ns", "c")),
            force: false,
            purge_volumes: false,
        })
        .await
        .unwrap();
    assert_eq!(*node.calls().forgotten.lock().unwrap(), ["ns/c"]);
    assert!(
        t.api
            .admission()
            .queued(std::time::Instant::now())
            .is_empty()
    );
}
both_stores!(fair_hand_off, freed_room_goes_to_the_oldest_waiter);

async fn one_cold_resume_for_fifty(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = TestNode::start("node-1").await;
    node.set_delay(Duration::from_millis(300));
    t.register(&node, "w1", 4).await;
    t.seed("ns").await;
    t.create_actor("ns", "a").await;
    let calls = (0..50).map(|_| t.resume("ns", "a"));
    let results = futures::future::join_all(calls).await;
    let mut resumed = 0;
    for r in &results {
        match r {
            Ok(reply) => resumed += usize::from(reply.resumed),
            Err(s) => assert_eq!(s.code(), Code::Aborted, "{s:?}"),
        }
    }
    assert_eq!(resumed, 1);
    assert_eq!(node.calls().run.load(Ordering::SeqCst), 1);
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
}
both_stores!(single_flight, one_cold_resume_for_fifty);

async fn abandoned_call_still_completes(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = TestNode::start("node-1").await;
    node.set_delay(Duration::from_millis(400));
    t.register(&node, "w1", 4).await;
    t.seed("ns").await;
    t.create_actor("ns", "a").await;
    // The caller gives up while the node is still restoring (its future is dropped: the HTTP/2
    // stream is reset and tonic drops the server's handler).
    let gave_up = tokio::time::timeout(Duration::from_millis(100), t.resume("ns", "a")).await;
    assert!(gave_up.is_err(), "the call was still running: {gave_up:?}");
    // The workflow runs to its end anyway...
    poll_until(
        "the resume to finish",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || (state(&t.get("ns", "a").await) == ActorState::Running).then_some(()),
    )
    .await;
    assert_eq!(
        node.calls().restore.load(Ordering::SeqCst) + node.calls().run.load(Ordering::SeqCst),
        1
    );
    // ...and releases the lease: a suspend takes it at once (no "another operation holds").
    node.set_delay(Duration::ZERO);
    let suspended = t
        .suspend("ns", "a")
        .await
        .expect("suspend after the abandoned resume");
    assert_eq!(state(&suspended), ActorState::Suspended);
}
both_stores!(abandoned_call, abandoned_call_still_completes);

async fn no_overbooking(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let n1 = TestNode::start("node-1").await;
    let n2 = TestNode::start("node-2").await;
    t.register(&n1, "w1", 2).await;
    t.register(&n2, "w2", 3).await;
    t.seed("ns").await;
    for i in 0..12 {
        t.create_actor("ns", &format!("a{i}")).await;
    }
    let names: Vec<String> = (0..12).map(|i| format!("a{i}")).collect();
    let results = futures::future::join_all(names.iter().map(|n| t.resume("ns", n))).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.code(), Code::ResourceExhausted, "{r:?}");
    }
    assert_eq!(ok, 5, "exactly the 5 free slots are admitted");
    let workers = t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers;
    for w in workers {
        let (used, cap) = (w.used.unwrap().actor_slots, w.capacity.unwrap().actor_slots);
        assert_eq!(used, cap, "worker {} used {used} of {cap}", w.id);
    }
}
both_stores!(admission, no_overbooking);

async fn crash_revert_resume(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    node.set(NodeBehaviour::Fail(Code::Internal));
    let err = t.resume("ns", "a").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let crashed = t.get("ns", "a").await;
    assert_eq!(state(&crashed), ActorState::Crashed);
    assert!(
        crashed.last_error.contains("wakeup probe never answered"),
        "{}",
        crashed.last_error
    );
    // Capacity was released: the worker's slot is free.
    let w = &t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers[0];
    assert_eq!(w.used.unwrap().actor_slots, 0);
    // CRASHED: fails fast with the prerequisite text until reverted.
    node.set(NodeBehaviour::Ok);
    let err = t.resume("ns", "a").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains(CRASHED_PREREQUISITE),
        "{}",
        err.message()
    );
    let reverted = t
        .actors()
        .revert_actor(RevertActorRequest {
            actor: Some(obj("ns", "a")),
            generation: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&reverted), ActorState::Suspended);
    assert!(t.resume("ns", "a").await.unwrap().resumed);
    // Revert is refused while not CRASHED.
    let err = t
        .actors()
        .revert_actor(RevertActorRequest {
            actor: Some(obj("ns", "a")),
            generation: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
}
both_stores!(crashed, crash_revert_resume);

async fn epoch_mismatch_stays_resuming(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    node.set(NodeBehaviour::WrongEpoch);
    let err = t.resume("ns", "a").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Resuming);
    // Revert is refused while RESUMING.
    assert_eq!(
        t.actors()
            .revert_actor(RevertActorRequest {
                actor: Some(obj("ns", "a")),
                generation: 0,
            })
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition
    );
    // A transient failure the node answered with (nothing of the resume runs there) releases
    // the actor: SUSPENDED, no worker, no slot held while nobody asks again, the reason kept.
    node.set(NodeBehaviour::Fail(Code::Unavailable));
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::Unavailable
    );
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Suspended);
    assert!(a.worker_assignment.is_none(), "{a:?}");
    assert!(a.last_error.contains("failed for now"), "{a:?}");
    node.set(NodeBehaviour::Ok);
    let r = t.resume("ns", "a").await.unwrap();
    assert!(r.resumed);
    assert_eq!(state(&r.actor.unwrap()), ActorState::Running);
}
both_stores!(epoch, epoch_mismatch_stays_resuming);

async fn interrupted_workflows_resume(b: Backend) {
    let lease_ttl = Duration::from_millis(400);
    let t = TestApi::start(b, ApiConfig { lease_ttl, ..cfg() }).await;
    let _node = t.one_worker(2).await;
    for point in [
        FaultPoint::ResumeAfterLease,
        FaultPoint::ResumeAfterBind,
        FaultPoint::ResumeAfterNodeCall,
    ] {
        let name = format!("{point:?}").to_lowercase();
        t.create_actor("ns", &name).await;
        t.api.faults.arm(point);
        let err = t.resume("ns", &name).await.unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{point:?}");
        // The crashed holder's lease blocks the next workflow until it expires.
        assert_eq!(
            t.resume("ns", &name).await.unwrap_err().code(),
            Code::Aborted,
            "{point:?}"
        );
        tokio::time::sleep(lease_ttl + Duration::from_millis(100)).await;
        let r = t.resume("ns", &name).await.unwrap();
        assert_eq!(state(&r.actor.unwrap()), ActorState::Running, "{point:?}");
        t.suspend("ns", &name).await.unwrap();
    }
    for point in [
        FaultPoint::SuspendAfterSuspending,
        FaultPoint::SuspendAfterCheckpoint,
    ] {
        let name = format!("{point:?}").to_lowercase();
        t.create_actor("ns", &name).await;
        t.resume("ns", &name).await.unwrap();
        t.api.faults.arm(point);
        assert_eq!(
            t.suspend("ns", &name).await.unwrap_err().code(),
            Code::Internal,
            "{point:?}"
        );
        assert_eq!(state(&t.get("ns", &name).await), ActorState::Suspending);
        // The router parks on a SUSPENDING actor.
        assert_eq!(
            t.resume("ns", &name).await.unwrap_err().code(),
            Code::FailedPrecondition
        );
        tokio::time::sleep(lease_ttl + Duration::from_millis(100)).await;
        let s = t.suspend("ns", &name).await.unwrap();
        assert_eq!(state(&s), ActorState::Suspended, "{point:?}");
        assert_eq!(s.generation, 1, "{point:?}: one generation recorded");
        let w = &t
            .fleet()
            .list_workers(ListWorkersRequest {})
            .await
            .unwrap()
            .into_inner()
            .workers[0];
        assert_eq!(
            w.used.unwrap().actor_slots,
            0,
            "{point:?}: capacity released"
        );
    }
}
both_stores!(interrupted, interrupted_workflows_resume);

async fn restore_fidelity(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    let s = t.suspend("ns", "a").await.unwrap();
    assert_eq!(s.attached_node, "node-1");
    t.resume("ns", "a").await.unwrap();
    {
        let restores = node.calls().restores.lock().unwrap();
        let r = restores.last().unwrap();
        assert_eq!(r.fidelity, Fidelity::Memory as i32);
        assert_eq!(r.snapshot.as_ref().unwrap().generation, 1);
    }
    t.suspend("ns", "a").await.unwrap();
    let restored_before = node.calls().restores.lock().unwrap().len();
    // The only worker comes back without CRIU: the memory snapshot is not restored at ROOTFS
    // there; the resume is refused with ResourceExhausted (the router parks) naming the
    // missing capability, and the generation is kept.
    t.register_with(&node, "w1", 2, false, Default::default())
        .await;
    for _ in 0..2 {
        let err = t.resume("ns", "a").await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert!(
            err.message().starts_with(NO_ROOM_MESSAGE)
                && err.message().contains("memory:criu")
                && err.message().contains("generation 2"),
            "{}",
            err.message()
        );
    }
    assert_eq!(
        node.calls().restores.lock().unwrap().len(),
        restored_before,
        "nothing was restored"
    );
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Suspended);
    assert_eq!(a.generation, 2);
    let w = &t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers[0];
    assert_eq!(w.capabilities, ["userns:off"]);
    assert_eq!(w.used.unwrap().actor_slots, 0, "no capacity held");
    // CRIU is back: the same generation restores with its memory.
    t.register(&node, "w1", 2).await;
    t.resume("ns", "a").await.unwrap();
    let restores = node.calls().restores.lock().unwrap();
    let r = restores.last().unwrap();
    assert_eq!(r.fidelity, Fidelity::Memory as i32);
    assert_eq!(r.snapshot.as_ref().unwrap().generation, 2);
}
both_stores!(fidelity, restore_fidelity);

/// A memory generation records the capabilities its restore needs, from the worker that wrote
/// it: one dumped in a user namespace (`userns:on`) is placed only on a worker in that mode.
async fn memory_generation_needs_its_user_namespace_mode(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = TestNode::start("node-1").await;
    let caps = |list: &[&str]| list.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    t.register_caps(&node, "w1", 2, caps(&["memory:criu", "userns:on"]))
        .await;
    t.seed("ns").await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    t.suspend("ns", "a").await.unwrap();
    // The worker is replaced by one without user namespaces (CRIU still there).
    t.register_caps(&node, "w1", 2, caps(&["memory:criu", "userns:off"]))
        .await;
    let err = t.resume("ns", "a").await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("userns:on") && !err.message().contains("memory:criu"),
        "{}",
        err.message()
    );
    // A second worker in the right mode takes it, with its memory.
    t.register_caps(&node, "w2", 2, caps(&["memory:criu", "userns:on"]))
        .await;
    let r = t.resume("ns", "a").await.unwrap();
    assert_eq!(r.actor.unwrap().worker_assignment.unwrap().worker_id, "w2");
    let restores = node.calls().restores.lock().unwrap();
    assert_eq!(restores.last().unwrap().fidelity, Fidelity::Memory as i32);
}
both_stores!(userns_mode, memory_generation_needs_its_user_namespace_mode);

async fn attached_to_full_node_detaches(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let n1 = t.one_worker(1).await;
    let n2 = TestNode::start("node-2").await;
    t.create_actor("ns", "a").await;
    t.create_actor("ns", "b").await;
    t.resume("ns", "a").await.unwrap();
    t.suspend("ns", "a").await.unwrap();
    // b fills node-1; a's only generation is local to node-1.
    t.resume("ns", "b").await.unwrap();
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    t.register(&n2, "w2", 1).await;
    let r = t.resume("ns", "a").await.unwrap();
    assert_eq!(r.actor.unwrap().worker_assignment.unwrap().worker_id, "w2");
    assert_eq!(n1.calls().detach.load(Ordering::SeqCst), 1);
    assert_eq!(n2.calls().restore.load(Ordering::SeqCst), 1);
}
both_stores!(detach, attached_to_full_node_detaches);

async fn worker_gone(b: Backend) {
    let t = TestApi::start_with(b, |c| c.heartbeat_timeout = Duration::from_millis(600)).await;
    let node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    let activation = t
        .resume("ns", "a")
        .await
        .unwrap()
        .actor
        .unwrap()
        .worker_assignment
        .unwrap()
        .activation;
    // No heartbeats: within the timeout plus one expiry tick the worker is GONE and the actor
    // SUSPENDED with its capacity released.
    let a = poll_until(
        "the actor SUSPENDED",
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || {
            let a = t.get("ns", "a").await;
            (state(&a) == ActorState::Suspended).then_some(a)
        },
    )
    .await;
    assert!(a.last_error.contains("gone"), "{}", a.last_error);
    let w = &t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers[0];
    assert_eq!(w.status, "GONE");
    let hb = t
        .fleet()
        .heartbeat(HeartbeatRequest {
            worker_id: "w1".into(),
            epoch: node.epoch(),
            cpu_usage_millis: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!hb.known);
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    // The worker comes back (same process) still running the actor, and no one activated it
    // since: it is taken back, RUNNING with the same token, nothing lost.
    let reply = t
        .register_holding(&node, "w1", 2, vec![held("ns", "a", activation)])
        .await;
    assert!(reply.discard.is_empty(), "{:?}", reply.discard);
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Running, "{}", a.last_error);
    assert_eq!(a.worker_assignment.unwrap().activation, activation);
}
both_stores!(expiry, worker_gone);

fn held(ns: &str, name: &str, activation: u64) -> HeldActor {
    HeldActor {
        actor: Some(obj(ns, name)),
        activation,
    }
}

/// A restarted worker (new epoch) reports what it re-adopted: an actor it holds with the
/// activation the record names stays RUNNING with nothing lost, one it lost is released to its
/// last generation, and a stale copy (an older activation, or an actor that is not on this
/// worker) comes back in `discard`.
async fn reregistration_reconciles(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(4).await;
    for name in ["a", "b", "c"] {
        t.create_actor("ns", name).await;
    }
    let a = t.resume("ns", "a").await.unwrap().actor.unwrap();
    let activation = a.worker_assignment.unwrap().activation;
    assert!(activation > 0, "a bind takes a fencing token");
    t.resume("ns", "b").await.unwrap();

    node.set_epoch(2);
    let reply = t
        .register_holding(
            &node,
            "w1",
            4,
            vec![
                held("ns", "a", activation),
                held("ns", "c", 7),
                held("ns", "gone", 1),
            ],
        )
        .await;
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Running, "{}", a.last_error);
    assert_eq!(a.worker_assignment.unwrap().activation, activation);
    let b_ = t.get("ns", "b").await;
    assert_eq!(state(&b_), ActorState::Suspended);
    assert!(b_.last_error.contains("gone"), "{}", b_.last_error);
    let mut discard: Vec<(String, u64)> = reply
        .discard
        .iter()
        .map(|h| (h.actor.clone().unwrap().name, h.activation))
        .collect();
    discard.sort();
    assert_eq!(discard, [("c".to_string(), 7), ("gone".to_string(), 1)]);
    assert!(reply.lease_seconds > 0);

    // The next resume of b is a new activation with a larger token.
    let b2 = t.resume("ns", "b").await.unwrap().actor.unwrap();
    assert!(b2.worker_assignment.unwrap().activation >= 2);
}
both_stores!(reconcile, reregistration_reconciles);

/// Expiry counts only time in which the api could hear heartbeats: an api that has just
/// started waits a whole lease (plus the margin) before it expires anyone, however old the
/// last heartbeat in the store is.
async fn fresh_api_waits_a_lease_before_expiry(b: Backend) {
    let t = TestApi::start_with(b, |c| c.heartbeat_timeout = Duration::from_secs(600)).await;
    let _node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A second api process on the same store, with a short lease: the heartbeat is older
    // than its lease, but it has not been listening that long.
    let restarted = ate_api::Api::new(
        t.api.store().clone(),
        ApiConfig {
            heartbeat_timeout: Duration::from_millis(500),
            ..cfg()
        },
    );
    assert_eq!(
        restarted.expire_workers().await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    restarted.store_outage_seen();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        restarted.expire_workers().await.unwrap(),
        Vec::<String>::new()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Now it has heard nothing for longer than the lease plus the margin.
    assert_eq!(restarted.expire_workers().await.unwrap(), ["w1"]);
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Suspended);
}
both_stores!(expiry_after_start, fresh_api_waits_a_lease_before_expiry);

/// A resume sent to a node that cannot be reached (its machine lost) does not leave the actor
/// RESUMING there or CRASHED: it is released with the reason, and the next attempt places it on
/// another node.
async fn unreachable_node_resumes_elsewhere(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    t.fleet()
        .register_worker(RegisterWorkerRequest {
            held: vec![],
            worker: Some(Worker {
                id: "w-dead".into(),
                node: "node-dead".into(),
                addresses: vec!["127.0.0.2:8443".into()],
                identity: "spiffe://ate.local/ns/ate-system/sa/worker-w-dead".into(),
                sandbox_class: "runc".into(),
                can_restore_memory: true,
                capacity: Some(Capacity {
                    cpu_millis: 4_000_000,
                    memory_bytes: 1 << 50,
                    actor_slots: 4,
                }),
                epoch: 1,
                node_address: dead.to_string(),
                boot_id: "boot-dead".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    t.seed("ns").await;
    t.create_actor("ns", "a").await;
    let err = t.resume("ns", "a").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Suspended, "{}", a.last_error);
    assert!(a.last_error.contains("unreachable"), "{}", a.last_error);
    let live = TestNode::start("node-live").await;
    t.register(&live, "w-live", 4).await;
    let r = t.resume("ns", "a").await.unwrap();
    assert_eq!(
        r.actor.unwrap().worker_assignment.unwrap().worker_id,
        "w-live"
    );
}
both_stores!(node_unreachable, unreachable_node_resumes_elsewhere);

/// ReadActorLog goes to the node the actor runs on; an actor that never ran has no log.
async fn actor_logs_through_the_api(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let _node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    let read = |offset: u64| {
        let mut c = t.actors();
        async move {
            c.read_actor_log(ReadActorLogRequest {
                actor: Some(obj("ns", "a")),
                offset,
            })
            .await
        }
    };
    let err = read(0).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("has not run"), "{}", err.message());
    t.resume("ns", "a").await.unwrap();
    let r = read(0).await.unwrap().into_inner();
    assert_eq!(r.data, b"log of ns/a\n");
    assert_eq!(r.node, "node-1");
    let rest = read(r.next_offset).await.unwrap().into_inner();
    assert!(rest.data.is_empty());
    // Bad input is refused before anything is read.
    let err = t
        .actors()
        .read_actor_log(ReadActorLogRequest {
            actor: Some(obj("ns", "Bad_Name")),
            offset: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}
both_stores!(logs, actor_logs_through_the_api);

async fn actor_exit_releases(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    t.fleet()
        .report_actor_exit(ReportActorExitRequest {
            actor: Some(obj("ns", "a")),
            worker_id: "w1".into(),
            epoch: node.epoch(),
            exit_code: 3,
            last_log_lines: "panic: boom".into(),
            crash_reason: String::new(),
            damage: None,
            activation: 0,
        })
        .await
        .unwrap();
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Suspended);
    assert!(
        a.last_error.contains("code 3") && a.last_error.contains("panic: boom"),
        "{}",
        a.last_error
    );
    let w = &t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers[0];
    assert_eq!(w.used.unwrap().actor_slots, 0);
}
both_stores!(exit, actor_exit_releases);

/// The copy a resume started exits before the api has recorded RUNNING (a lazy restore whose
/// page source died at once): the report is answered ABORTED while the actor is RESUMING, so the
/// node sends it again, and then applies. A report for an older activation changes nothing.
async fn exit_of_a_copy_whose_resume_is_being_recorded_is_taken_when_sent_again(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    let first = t
        .api
        .store()
        .get_actor(&ate_core::ActorRef::new("ns", "a"))
        .await
        .unwrap();
    t.suspend("ns", "a").await.unwrap();
    let exit = |activation: u64| ReportActorExitRequest {
        actor: Some(obj("ns", "a")),
        worker_id: "w1".into(),
        epoch: node.epoch(),
        exit_code: -1,
        last_log_lines: "page source gone".into(),
        crash_reason: String::new(),
        damage: None,
        activation,
    };
    node.set_delay(Duration::from_millis(1500));
    let resume = {
        let actors = t.actors();
        tokio::spawn(async move {
            let mut actors = actors;
            actors
                .resume_actor(ResumeActorRequest {
                    actor: Some(obj("ns", "a")),
                })
                .await
        })
    };
    let a = ate_core::ActorRef::new("ns", "a");
    let resuming = poll_until(
        "the actor RESUMING",
        Duration::from_secs(1),
        Duration::from_millis(10),
        async || {
            let r = t.api.store().get_actor(&a).await.unwrap();
            (r.state == ate_core::ActorState::Resuming).then_some(r)
        },
    )
    .await;
    assert!(resuming.activation > first.activation);
    let err = t
        .fleet()
        .report_actor_exit(exit(resuming.activation))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{}", err.message());
    // The older activation's exit is stale: taken, and nothing changes.
    t.fleet()
        .report_actor_exit(exit(first.activation))
        .await
        .unwrap();
    resume.await.unwrap().unwrap();
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    t.fleet()
        .report_actor_exit(exit(first.activation))
        .await
        .unwrap();
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    // Sent again once RUNNING is recorded: applied.
    t.fleet()
        .report_actor_exit(exit(resuming.activation))
        .await
        .unwrap();
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Suspended);
    assert!(
        a.last_error.contains("page source gone"),
        "{}",
        a.last_error
    );
}
both_stores!(
    exit_while_resuming,
    exit_of_a_copy_whose_resume_is_being_recorded_is_taken_when_sent_again
);

async fn actor_stopped_for_incomplete_memory_crashes(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    t.fleet()
        .report_actor_exit(ReportActorExitRequest {
            actor: Some(obj("ns", "a")),
            worker_id: "w1".into(),
            epoch: node.epoch(),
            exit_code: -1,
            last_log_lines: String::new(),
            crash_reason: "lazy memory restore failed: chunk 3 is damaged".into(),
            damage: None,
            activation: 0,
        })
        .await
        .unwrap();
    let a = t.get("ns", "a").await;
    assert_eq!(state(&a), ActorState::Crashed);
    assert!(
        a.last_error.contains("w1") && a.last_error.contains("chunk 3 is damaged"),
        "{}",
        a.last_error
    );
    let w = &t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers[0];
    assert_eq!(w.used.unwrap().actor_slots, 0, "its slot is released");
}
both_stores!(exit_crash, actor_stopped_for_incomplete_memory_crashes);

async fn tags_and_gc(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(2).await;
    t.create_actor("ns", "golden").await;
    let err = t
        .tags()
        .create_tag(CreateTagRequest {
            atespace: "ns".into(),
            name: "g".into(),
            actor: Some(obj("ns", "golden")),
            generation: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    t.resume("ns", "golden").await.unwrap();
    t.actors()
        .suspend_actor(SuspendActorRequest {
            actor: Some(obj("ns", "golden")),
            mode: SuspendMode::Durable as i32,
            grace_ms: 0,
            reason: String::new(),
        })
        .await
        .unwrap();
    let tag = t
        .tags()
        .create_tag(CreateTagRequest {
            atespace: "ns".into(),
            name: "g".into(),
            actor: Some(obj("ns", "golden")),
            generation: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tag.snapshot.as_ref().unwrap().generation, 1);
    assert_eq!(
        t.tags()
            .list_tags(ListTagsRequest {
                atespace: "ns".into()
            })
            .await
            .unwrap()
            .into_inner()
            .tags
            .len(),
        1
    );
    let dup = t
        .tags()
        .create_tag(CreateTagRequest {
            atespace: "ns".into(),
            name: "g".into(),
            actor: Some(obj("ns", "golden")),
            generation: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);

    // A template whose golden tag seeds new actors: their first resume restores the tag.
    let mut seeded = template("ns", "seeded");
    seeded.spec.as_mut().unwrap().golden_tag = "ns/g".into();
    t.templates()
        .apply_template(ApplyTemplateRequest {
            template: Some(seeded),
        })
        .await
        .unwrap();
    t.actors()
        .create_actor(CreateActorRequest {
            atespace: "ns".into(),
            name: "child".into(),
            template: "ns/seeded".into(),
            worker_selector: Default::default(),
        })
        .await
        .unwrap();
    t.resume("ns", "child").await.unwrap();
    {
        let restores = node.calls().restores.lock().unwrap();
        let r = restores.last().unwrap();
        let w = r.workload.as_ref().unwrap();
        assert_eq!(w.actor.as_ref().unwrap().name, "child");
        assert_eq!(
            r.snapshot.as_ref().unwrap().uuid,
            tag.snapshot.as_ref().unwrap().uuid
        );
        // Captured under another template: volumes only.
        assert_eq!(r.fidelity, Fidelity::Volumes as i32);
    }

    // Deleting the source actor keeps the tagged generation's files.
    let err = t
        .actors()
        .delete_actor(DeleteActorRequest {
            actor: Some(obj("ns", "child")),
            force: false,
            purge_volumes: false,
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "RUNNING actors cannot be deleted"
    );
    t.resume("ns", "golden").await.unwrap();
    t.suspend("ns", "golden").await.unwrap();
    t.actors()
        .delete_actor(DeleteActorRequest {
            actor: Some(obj("ns", "golden")),
            force: false,
            purge_volumes: false,
        })
        .await
        .unwrap();
    // Generation 2 is collected; generation 1 is held by the tag.
    let deleted = || node.calls().delete_snapshots.load(Ordering::SeqCst);
    let collected = || deleted() >= 1;
    eventually(Duration::from_secs(1), Duration::from_millis(20), collected).await;
    assert_eq!(deleted(), 1);
    t.tags()
        .delete_tag(DeleteTagRequest {
            atespace: "ns".into(),
            name: "g".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        t.tags()
            .get_tag(GetTagRequest {
                atespace: "ns".into(),
                name: "g".into()
            })
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
}
both_stores!(tags, tags_and_gc);

async fn fleet_validation(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let err = t
        .fleet()
        .register_worker(RegisterWorkerRequest {
            held: vec![],
            worker: Some(Worker {
                id: "w1".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        t.fleet()
            .list_workers(ListWorkersRequest {})
            .await
            .unwrap()
            .into_inner()
            .workers
            .is_empty()
    );
    let node = TestNode::start("node-1").await;
    // The machine's CPU can be overcommitted, never undercommitted.
    let err = t
        .fleet()
        .register_worker(RegisterWorkerRequest {
            held: vec![],
            worker: Some(Worker {
                id: "w1".into(),
                node: node.name.clone(),
                addresses: vec!["127.0.0.2:8443".into()],
                sandbox_class: "runc".into(),
                capacity: Some(Capacity {
                    cpu_millis: 2000,
                    memory_bytes: 1 << 30,
                    actor_slots: 8,
                }),
                cpu_physical_millis: 4000,
                epoch: node.epoch(),
                node_address: node.addr.to_string(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("worker.cpu_physical_millis"),
        "{}",
        err.message()
    );
    t.register(&node, "w1", 1).await;
    let hb = t
        .fleet()
        .heartbeat(HeartbeatRequest {
            worker_id: "w1".into(),
            epoch: node.epoch(),
            cpu_usage_millis: 350,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(hb.known);
    // The usage a heartbeat carries is what ListWorkers shows (and placement prefers by).
    let listed = t
        .fleet()
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers;
    assert_eq!(listed[0].cpu_usage_millis, 350);
    let stale = t
        .fleet()
        .heartbeat(HeartbeatRequest {
            worker_id: "w1".into(),
            epoch: node.epoch() + 1,
            cpu_usage_millis: 9000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stale.known);
    t.fleet()
        .deregister_worker(DeregisterWorkerRequest {
            worker_id: "w1".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        t.fleet()
            .list_workers(ListWorkersRequest {})
            .await
            .unwrap()
            .into_inner()
            .workers[0]
            .status,
        "GONE"
    );
}
both_stores!(fleet, fleet_validation);

async fn stale_suspend_is_finished_by_the_next_request(b: Backend) {
    let lease_ttl = Duration::from_millis(400);
    let t = TestApi::start(b, ApiConfig { lease_ttl, ..cfg() }).await;
    let node = t.one_worker(1).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    t.api.faults.arm(FaultPoint::SuspendAfterSuspending);
    assert_eq!(
        t.suspend("ns", "a").await.unwrap_err().code(),
        Code::Internal
    );
    // While the dead workflow's lease could still be alive the router parks.
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    tokio::time::sleep(lease_ttl + Duration::from_millis(150)).await;
    // Then the next resume finishes the suspend (one generation) and resumes from it.
    let r = t.resume("ns", "a").await.unwrap();
    assert!(r.resumed);
    let a = r.actor.unwrap();
    assert_eq!(state(&a), ActorState::Running);
    assert_eq!(a.generation, 1);
    assert_eq!(node.calls().checkpoint.load(Ordering::SeqCst), 1);
    assert_eq!(node.calls().restore.load(Ordering::SeqCst), 1);
}
both_stores!(stale_suspend, stale_suspend_is_finished_by_the_next_request);

/// A worker that kept the actor's newest generation frozen (checkpoint reply `kept_frozen`) is
/// where its next resume goes, among several empty workers.
async fn resume_prefers_the_worker_keeping_it_frozen(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = TestNode::start("node-1").await;
    for w in ["w1", "w2", "w3", "w4"] {
        t.register(&node, w, 4).await;
    }
    t.seed("ns").await;
    t.create_actor("ns", "a").await;
    let first = t.resume("ns", "a").await.unwrap();
    let home = first.actor.unwrap().worker_assignment.unwrap().worker_id;
    for round in 0..8 {
        t.suspend("ns", "a").await.unwrap();
        let again = t.resume("ns", "a").await.unwrap();
        assert!(again.resumed);
        let wa = again.actor.unwrap().worker_assignment.unwrap();
        assert_eq!(wa.worker_id, home, "round {round}: back where it is frozen");
    }
    assert_eq!(node.calls().restore.load(Ordering::SeqCst), 8);

    // A home that is not eligible (full, gone) is not chosen: the scheduler's unit test
    // `frozen_hint_wins_only_when_eligible_and_current`.
}
both_stores!(
    frozen_preference,
    resume_prefers_the_worker_keeping_it_frozen
);

/// The router's `x-request-id` (gRPC metadata on ResumeActor) reaches the node's Run and
/// Restore; a resume without one gets a new id (128 bits in hex), passed on the same way.
async fn request_ids_reach_the_node(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(4).await;
    t.create_actor("ns", "a").await;
    assert!(
        t.resume_with_id("ns", "a", "test-123")
            .await
            .unwrap()
            .resumed
    );
    t.suspend("ns", "a").await.unwrap();
    assert!(
        t.resume_with_id("ns", "a", "test-456")
            .await
            .unwrap()
            .resumed
    );
    t.suspend("ns", "a").await.unwrap();
    assert!(t.resume("ns", "a").await.unwrap().resumed);
    assert_eq!(node.calls().run.load(Ordering::SeqCst), 1);
    assert_eq!(node.calls().restore.load(Ordering::SeqCst), 2);
    let ids = node.calls().request_ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(ids[0].as_deref(), Some("test-123"), "Run");
    assert_eq!(ids[1].as_deref(), Some("test-456"), "Restore");
    let made = ids[2].as_deref().unwrap_or_default();
    assert!(
        made.len() == 32 && made.bytes().all(|c| c.is_ascii_hexdigit()),
        "{made:?}"
    );
}
both_stores!(request_ids, request_ids_reach_the_node);

async fn generations(t: &TestApi, ns: &str, name: &str) -> Vec<Generation> {
    t.actors()
        .list_generations(ListGenerationsRequest {
            actor: Some(obj(ns, name)),
        })
        .await
        .expect("list generations")
        .into_inner()
        .generations
}

/// (generation, next, skipped, local damaged, durable damaged) of each generation, newest first.
async fn summary(t: &TestApi, ns: &str, name: &str) -> Vec<(u64, bool, bool, bool, bool)> {
    generations(t, ns, name)
        .await
        .iter()
        .map(|g| {
            (
                g.snapshot.as_ref().map_or(0, |s| s.generation),
                g.next,
                g.skipped,
                !g.local_damage.is_empty(),
                !g.durable_damage.is_empty(),
            )
        })
        .collect()
}

async fn revert_to(
    t: &TestApi,
    ns: &str,
    name: &str,
    generation: u64,
) -> Result<Actor, tonic::Status> {
    t.actors()
        .revert_actor(RevertActorRequest {
            actor: Some(obj(ns, name)),
            generation,
        })
        .await
        .map(|r| r.into_inner())
}

/// An ASYNC suspend whose upload then completes (the node's ReportSnapshot).
async fn suspend_uploaded(t: &TestApi, ns: &str, name: &str) -> u64 {
    let a = t.suspend(ns, name).await.expect("suspend");
    t.fleet()
        .report_snapshot(ReportSnapshotRequest {
            actor: Some(obj(ns, name)),
            generation: a.generation,
            durable_status: DurableStatus::Completed as i32,
            durable_uri: format!("file:///durable/{ns}/{name}/{}", a.generation),
            reason: String::new(),
        })
        .await
        .expect("report snapshot");
    a.generation
}

/// The generation the node was last asked to restore.
fn last_restored(node: &TestNode) -> Snapshot {
    node.calls()
        .restores
        .lock()
        .unwrap()
        .last()
        .and_then(|r| r.snapshot.clone())
        .expect("a restore")
}

/// A restore that finds both copies of the newest generation damaged crashes the actor and marks
/// them; ListGenerations shows it, a revert to it is refused, the default revert skips it and the
/// next resume restores the generation before it; a revert to a chosen generation works, bad
/// ones are refused and change nothing.
async fn damaged_generation_is_skipped_by_revert(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    // Unknown or invalid actor.
    let err = t
        .actors()
        .list_generations(ListGenerationsRequest {
            actor: Some(obj("ns", "nobody")),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    let err = t
        .actors()
        .list_generations(ListGenerationsRequest {
            actor: Some(obj("ns", "Bad_Name")),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(generations(&t, "ns", "a").await.is_empty());

    t.resume("ns", "a").await.unwrap();
    for expected in 1..=3 {
        assert_eq!(suspend_uploaded(&t, "ns", "a").await, expected);
        if expected < 3 {
            t.resume("ns", "a").await.unwrap();
        }
    }
    // Retention kept 3 (newest) and 2 (the newest COMPLETED one when 3 was written).
    assert_eq!(
        summary(&t, "ns", "a").await,
        [
            (3, true, false, false, false),
            (2, false, false, false, false)
        ]
    );
    let listed = generations(&t, "ns", "a").await;
    assert!(listed.iter().all(|g| g.local_usable), "{listed:?}");
    let three = listed[0].snapshot.clone().unwrap();
    assert_eq!(three.durable_status, DurableStatus::Completed as i32);

    node.set(NodeBehaviour::Damaged {
        local: true,
        durable: true,
    });
    let err = t.resume("ns", "a").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let crashed = t.get("ns", "a").await;
    assert_eq!(state(&crashed), ActorState::Crashed);
    assert!(
        crashed.last_error.contains("scripted damage"),
        "{}",
        crashed.last_error
    );
    assert_eq!(last_restored(&node).generation, 3);
    // Both copies of 3 are marked; the next resume would restore 2.
    assert_eq!(
        summary(&t, "ns", "a").await,
        [
            (3, false, false, true, true),
            (2, true, false, false, false)
        ]
    );
    let g3 = &generations(&t, "ns", "a").await[0];
    assert!(
        g3.local_damage.contains("rootfs.tar"),
        "{}",
        g3.local_damage
    );
    assert!(!g3.local_usable, "a damaged local copy is not usable");

    // Refused, nothing changed: a damaged generation, one the actor lacks, one retention dropped.
    let before = (t.get("ns", "a").await, summary(&t, "ns", "a").await);
    let err = revert_to(&t, "ns", "a", 3).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("generation 3 of actor ns/a is damaged")
            && err.message().contains("rootfs.tar")
            && err.message().contains("ate get generations actor a -a ns"),
        "{}",
        err.message()
    );
    for missing in [9, 1] {
        let err = revert_to(&t, "ns", "a", missing).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(
            err.message(),
            format!(
                "actor ns/a has no generation {missing} (it has 3, 2; `ate get generations actor a -a ns`)"
            )
        );
    }
    assert_eq!(
        (t.get("ns", "a").await, summary(&t, "ns", "a").await),
        before
    );

    // The default revert goes back to the newest intact generation: 3 is kept, but skipped.
    node.set(NodeBehaviour::Ok);
    let reverted = revert_to(&t, "ns", "a", 0).await.unwrap();
    assert_eq!(state(&reverted), ActorState::Suspended);
    assert_eq!(
        summary(&t, "ns", "a").await,
        [(3, false, true, true, true), (2, true, false, false, false)]
    );
    assert!(t.resume("ns", "a").await.unwrap().resumed);
    assert_eq!(last_restored(&node).generation, 2);

    // A revert to a chosen generation is refused while RUNNING.
    let err = revert_to(&t, "ns", "a", 2).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("suspend it first"),
        "{}",
        err.message()
    );
    // The next suspend writes 4 (after 3, which it drops: damaged and skipped).
    assert_eq!(suspend_uploaded(&t, "ns", "a").await, 4);
    assert_eq!(
        summary(&t, "ns", "a").await,
        [
            (4, true, false, false, false),
            (2, false, false, false, false)
        ]
    );
    // A SUSPENDED actor may choose an older generation: 4 is kept but skipped.
    let reverted = revert_to(&t, "ns", "a", 2).await.unwrap();
    assert_eq!(state(&reverted), ActorState::Suspended);
    assert_eq!(
        reverted.generation, 4,
        "the newest generation stays the actor's"
    );
    assert_eq!(
        summary(&t, "ns", "a").await,
        [
            (4, false, true, false, false),
            (2, true, false, false, false)
        ]
    );
    t.resume("ns", "a").await.unwrap();
    assert_eq!(last_restored(&node).generation, 2);
    assert_eq!(suspend_uploaded(&t, "ns", "a").await, 5);
}
both_stores!(damaged_generation, damaged_generation_is_skipped_by_revert);

/// Only the node-local copy is damaged: the generation stays the one to restore, from its
/// durable copy (the Restore names no local path), and the default revert skips nothing.
async fn a_damaged_local_copy_leaves_the_durable_one(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    assert_eq!(suspend_uploaded(&t, "ns", "a").await, 1);
    node.set(NodeBehaviour::Damaged {
        local: true,
        durable: false,
    });
    assert_eq!(
        t.resume("ns", "a").await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(
        summary(&t, "ns", "a").await,
        [(1, true, false, true, false)]
    );
    node.set(NodeBehaviour::Ok);
    revert_to(&t, "ns", "a", 0).await.unwrap();
    assert_eq!(
        summary(&t, "ns", "a").await,
        [(1, true, false, true, false)]
    );
    // So is a revert to it: its durable copy is intact.
    revert_to(&t, "ns", "a", 1).await.unwrap();
    t.resume("ns", "a").await.unwrap();
    let restored = last_restored(&node);
    assert_eq!(restored.generation, 1);
    assert_eq!(
        restored.local_path, "",
        "the damaged local copy is not named"
    );
    assert_eq!(restored.durable_status, DurableStatus::Completed as i32);
    assert!(!restored.durable_uri.is_empty());
}
both_stores!(
    damaged_local_copy,
    a_damaged_local_copy_leaves_the_durable_one
);

/// A lazy restore that finds a damaged chunk after the actor started: the exit report names the
/// generation's copy, which is marked once the actor is CRASHED; a malformed report is refused.
async fn a_damaged_chunk_reported_with_the_exit_marks_the_copy(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let node = t.one_worker(2).await;
    t.create_actor("ns", "a").await;
    t.resume("ns", "a").await.unwrap();
    assert_eq!(suspend_uploaded(&t, "ns", "a").await, 1);
    t.resume("ns", "a").await.unwrap();
    let uuid = last_restored(&node).uuid;
    let exit = |damage: Option<GenerationDamage>| ReportActorExitRequest {
        actor: Some(obj("ns", "a")),
        worker_id: "w1".into(),
        epoch: node.epoch(),
        exit_code: -1,
        last_log_lines: String::new(),
        crash_reason:
            "lazy memory restore failed: memory image criu/pages-1.img chunk 3 is damaged".into(),
        damage,
        activation: 0,
    };
    // A damage naming no generation is refused; the actor is untouched.
    let err = t
        .fleet()
        .report_actor_exit(exit(Some(GenerationDamage {
            local: "chunk 3".into(),
            ..Default::default()
        })))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Running);
    t.fleet()
        .report_actor_exit(exit(Some(GenerationDamage {
            generation: 1,
            uuid,
            local: "memory image criu/pages-1.img chunk 3 is damaged".into(),
            durable: String::new(),
        })))
        .await
        .unwrap();
    assert_eq!(state(&t.get("ns", "a").await), ActorState::Crashed);
    let g = &generations(&t, "ns", "a").await[0];
    assert_eq!(
        g.local_damage,
        "memory image criu/pages-1.img chunk 3 is damaged"
    );
    assert_eq!(g.durable_damage, "");
    // Its durable copy is intact: still the one to restore.
    assert!(g.next);
}
both_stores!(
    damaged_chunk_exit,
    a_damaged_chunk_reported_with_the_exit_marks_the_copy
);
