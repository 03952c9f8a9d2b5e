//! End-to-end tests of the router on real sockets: scripted api, test atunnel, echo upstreams.
//! Spec tables covered: "What the router parks" (every row), "Error mapping" (Envoy column).

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ate_router::Stats;
use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Status;

const NO_ROOM_BODY: &str = "actor lab/p3 unavailable: no worker has room for the actor";

// ---- naming the actor -----------------------------------------------------------------------

#[tokio::test]
async fn missing_or_malformed_header_is_404_before_any_api_call() {
    let w = World::start(|_| {}).await;
    let addr = w.router.addr;
    assert_eq!(get(addr, None).await.status, StatusCode::NOT_FOUND);
    for bad in [
        "a",
        "a/b/c",
        "A/b",
        "a/-b",
        "a_b/c",
        "/b",
        "a/",
        &format!("{}/b", "a".repeat(64)),
    ] {
        let got = get(addr, Some(bad)).await;
        assert_eq!(got.status, StatusCode::NOT_FOUND, "{bad}");
    }
    // Non-UTF-8 bytes.
    let got = get_with(addr, None, "app.example", |r| {
        r.headers_mut().insert(
            "ate-target-actor",
            http::HeaderValue::from_bytes(b"a\xff/b").unwrap(),
        );
    })
    .await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(w.api.total_calls(), 0);
}

#[tokio::test]
async fn running_actor_is_routed_with_host_unchanged_and_routing_headers_stripped() {
    let w = World::start(|_| {}).await;
    w.running("team-a/agent-7");
    let got = get_with(
        w.router.addr,
        Some("team-a/agent-7"),
        "my-app.internal:3000",
        |r| {
            r.headers_mut()
                .insert("ate-activation", "99".parse().unwrap());
            r.headers_mut().insert("x-custom", "kept".parse().unwrap());
            r.headers_mut()
                .insert("connection", "keep-alive, x-hop".parse().unwrap());
            r.headers_mut().insert("x-hop", "dropped".parse().unwrap());
        },
    )
    .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert!(got.body.contains("name=port80\n"), "{}", got.body);
    assert!(
        got.body.contains("host=my-app.internal:3000\n"),
        "{}",
        got.body
    );
    assert!(got.body.contains("path=/hello?x=1\n"), "{}", got.body);
    assert!(got.body.contains("header x-custom: kept\n"), "{}", got.body);
    assert!(!got.body.contains("ate-target"), "{}", got.body);
    assert!(!got.body.contains("ate-activation"), "{}", got.body);
    assert!(!got.body.contains("x-hop"), "{}", got.body);
    assert_eq!(got.resume(), "warm");
    // The tunnel carried the routing headers, with the informational authority.
    let connects = w.atunnel.state.connects.lock().unwrap().clone();
    assert_eq!(
        connects[0],
        ("team-a/agent-7".into(), 80, "agent-7.team-a:80".into())
    );
}

#[tokio::test]
async fn cold_resume_is_marked_and_the_assignment_is_cached() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    w.api.script("a/cold", move |c| {
        Reply::ok(&worker, c.n == 0).after(Duration::from_millis(50))
    });
    let first = get(w.router.addr, Some("a/cold")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.resume(), "cold");
    let second = get(w.router.addr, Some("a/cold")).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.resume(), "warm");
    assert_eq!(w.api.calls("a/cold"), 1, "second request used the cache");
}

#[tokio::test]
async fn zero_cache_ttl_asks_the_api_on_every_request() {
    let w = World::start(|c| c.assignment_cache_ttl = Duration::ZERO).await;
    w.running("a/b");
    for _ in 0..3 {
        assert_eq!(get(w.router.addr, Some("a/b")).await.status, StatusCode::OK);
    }
    assert_eq!(w.api.calls("a/b"), 3);
}

#[tokio::test]
async fn http2_prior_knowledge_client_is_served() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    for _ in 0..2 {
        let req = http::Request::builder()
            .uri("http://h2-app.example/x")
            .header("ate-target-actor", "a/b")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert!(got.body.contains("host=h2-app.example\n"), "{}", got.body);
        assert!(got.body.contains("path=/x\n"), "{}", got.body);
    }
}

// ---- behaviour table: what the router parks ------------------------------------------------

#[tokio::test]
async fn not_found_is_404_at_once() {
    let w = World::start(|_| {}).await;
    let got = get(w.router.addr, Some("a/ghost")).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(
        got.body,
        "actor a/ghost not found; create it with `ate create actor ghost -a a -t <atespace>/<template>`"
    );
    assert_clean(&got, Some("a/ghost"));
    assert!(got.elapsed < Duration::from_millis(500));
    assert_eq!(w.api.calls("a/ghost"), 1);
}

#[tokio::test]
async fn crashed_actor_is_503_at_once_with_the_prerequisite_text() {
    let w = World::start(|_| {}).await;
    w.api.script("a/crashed", |_| {
        Reply::err(Status::failed_precondition(
            "resume a/crashed: AssignWorker prerequisite not met: actor is ACTOR_STATE_CRASHED",
        ))
    });
    let got = get(w.router.addr, Some("a/crashed")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        got.body.contains("AssignWorker prerequisite not met"),
        "{}",
        got.body
    );
    assert_clean(&got, Some("a/crashed"));
    assert!(
        got.body
            .contains("run `ate revert actor crashed -a a` to retry"),
        "{}",
        got.body
    );
    assert!(
        got.elapsed < Duration::from_millis(500),
        "{:?}",
        got.elapsed
    );
    assert_eq!(w.api.calls("a/crashed"), 1);
}

#[tokio::test]
async fn no_room_parks_then_503_with_the_capacity_text_after_the_budget() {
    let w = World::start(|_| {}).await;
    w.api.script("lab/p3", |_| Reply::err(no_room()));
    let got = get(w.router.addr, Some("lab/p3")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.body, NO_ROOM_BODY);
    let s = secs(got.elapsed);
    assert!((1.0..1.3).contains(&s), "{s}");
    // 100 ms, ×1.1 …: about 8 attempts in one second, certainly more than 3 and fewer than 12.
    let calls = w.api.calls("lab/p3");
    assert!((4..=12).contains(&calls), "{calls}");
    assert_eq!(Stats::get(&w.router.stats.parking_active), 0);
}

#[tokio::test]
async fn full_pool_503_after_the_default_5s_budget() {
    let w = World::start(|c| c.parked_request_budget = Duration::from_secs(5)).await;
    w.api.script("lab/p3", |_| Reply::err(no_room()));
    let got = get(w.router.addr, Some("lab/p3")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.body, NO_ROOM_BODY);
    let s = secs(got.elapsed);
    assert!((5.0..5.3).contains(&s), "{s}");
}

#[tokio::test]
async fn parked_request_is_served_when_a_worker_frees_up() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    w.api.script("lab/p3", move |c| {
        if c.since_first < Duration::from_millis(400) {
            Reply::err(no_room())
        } else {
            Reply::ok(&worker, true)
        }
    });
    let got = get(w.router.addr, Some("lab/p3")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.resume(), "parked");
    let s = secs(got.elapsed);
    assert!((0.4..0.9).contains(&s), "{s}");
    let m = metrics_text(w.router.metrics_addr).await;
    assert!(
        m.contains("ate_router_parking_wait_seconds_count{outcome=\"served\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn api_blip_parks_and_is_served() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    w.api.script("a/b", move |c| {
        if c.n < 3 {
            Reply::err(Status::unavailable("api restarting"))
        } else {
            Reply::ok(&worker, false)
        }
    });
    let got = get(w.router.addr, Some("a/b")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.resume(), "parked");
}

#[tokio::test]
async fn api_down_parks_then_503_unavailable() {
    // An address nobody listens on: tonic reports Unavailable.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let router = start_router(config(addr)).await;
    let got = get(router.addr, Some("lab/p3")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.body, "actor lab/p3 unavailable");
    assert_clean(&got, Some("lab/p3"));
    let s = secs(got.elapsed);
    assert!((1.0..1.5).contains(&s), "{s}");
}

#[tokio::test]
async fn aborted_another_resume_active_is_retried() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    w.api.script("a/b", move |c| {
        if c.n < 2 {
            Reply::err(Status::aborted("another resume of a/b is active"))
        } else {
            Reply::ok(&worker, true)
        }
    });
    let got = get(w.router.addr, Some("a/b")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(w.api.calls("a/b"), 3);
}

#[tokio::test]
async fn transient_failed_precondition_and_aborted_become_503_after_retries() {
    let w = World::start(|c| c.parked_request_budget = Duration::from_millis(500)).await;
    w.api.script("a/resuming", |_| {
        Reply::err(Status::failed_precondition(
            "actor is ACTOR_STATE_SUSPENDING",
        ))
    });
    w.api
        .script("a/busy", |_| Reply::err(Status::aborted("lease held")));
    for actor in ["a/resuming", "a/busy"] {
        let got = get(w.router.addr, Some(actor)).await;
        assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{actor}");
        assert!(
            got.body.starts_with(&format!("actor {actor} unavailable")),
            "{}",
            got.body
        );
        assert_clean(&got, Some(actor));
        assert!(w.api.calls(actor) > 2);
        let s = secs(got.elapsed);
        assert!((0.5..0.8).contains(&s), "{s}");
    }
}

// ---- error mapping table (Envoy column) ------------------------------------------------------

#[tokio::test]
async fn error_mapping_table() {
    let w = World::start(|_| {}).await;
    w.api.script("e/deadline", |_| {
        Reply::err(Status::deadline_exceeded("slow"))
    });
    w.api
        .script("e/denied", |_| Reply::err(Status::permission_denied("no")));
    w.api
        .script("e/unauth", |_| Reply::err(Status::unauthenticated("who")));
    w.api.script("e/internal", |_| {
        Reply::err(Status::internal("db password=hunter2 broke"))
    });
    w.api.script("e/unknown", |_| {
        Reply::err(Status::unknown("secret detail"))
    });
    let cases = [
        ("e/deadline", 504),
        ("e/denied", 403),
        ("e/unauth", 401),
        ("e/internal", 500),
        ("e/unknown", 500),
        ("e/missing", 404),
    ];
    for (actor, code) in cases {
        let got = get(w.router.addr, Some(actor)).await;
        assert_eq!(got.status.as_u16(), code, "{actor}: {}", got.body);
        assert!(
            got.elapsed < Duration::from_millis(500),
            "{actor} answered at once"
        );
        if code == 500 {
            assert_eq!(
                got.body,
                format!("actor {actor}: internal error (details are in the router's log)")
            );
        }
        assert_clean(&got, Some(actor));
        assert!(!got.body.contains("hunter2") && !got.body.contains("secret"));
    }
}

// ---- parking: budget, limit, no cancel, decision timeout ---------------------------------------

#[tokio::test]
async fn joiner_shares_the_budget_clock() {
    let w = World::start(|_| {}).await;
    w.api.script("lab/p3", |_| Reply::err(no_room()));
    let addr = w.router.addr;
    let start = Instant::now();
    let first = tokio::spawn(async move { get(addr, Some("lab/p3")).await });
    // The scenario: the joiner comes 0.4 s after the first request.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let joiner = get(addr, Some("lab/p3")).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(joiner.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(joiner.body, NO_ROOM_BODY);
    // Scaled from "joins 2 s late, fails ~3 s later": joins 0.4 s into a 1 s budget.
    let j = secs(joiner.elapsed);
    assert!((0.55..0.85).contains(&j), "joiner waited {j}");
    let total = secs(start.elapsed());
    assert!((1.0..1.3).contains(&total), "{total}");
}

#[tokio::test]
async fn parking_limit_sheds_the_third_request_at_once() {
    let w = World::start(|c| c.parked_request_max = 2).await;
    for a in ["lab/p1", "lab/p2", "lab/p3"] {
        w.api.script(a, |_| Reply::err(no_room()));
    }
    let addr = w.router.addr;
    let a = tokio::spawn(async move { get(addr, Some("lab/p1")).await });
    let b = tokio::spawn(async move { get(addr, Some("lab/p2")).await });
    wait_parked(&w.router.stats, 2).await;
    let third = get(addr, Some("lab/p3")).await;
    assert_eq!(third.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        third.body,
        "actor \"lab/p3\" unavailable: router at capacity"
    );
    assert_clean(&third, Some("lab/p3"));
    assert!(
        third.elapsed < Duration::from_millis(300),
        "{:?}",
        third.elapsed
    );
    assert_eq!(w.api.calls("lab/p3"), 1, "shed after its one attempt");
    assert_eq!(Stats::get(&w.router.stats.parking_rejected), 1);
    let m = metrics_text(w.router.metrics_addr).await;
    assert_eq!(
        metric(&m, "atenet_router_parking_rejected_total"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(metric(&m, "atenet_router_parking_active"), Some(2.0), "{m}");
    assert_eq!(
        a.await.unwrap().body,
        "actor lab/p1 unavailable: no worker has room for the actor"
    );
    assert_eq!(b.await.unwrap().status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(Stats::get(&w.router.stats.parking_active), 0);
    let m = metrics_text(w.router.metrics_addr).await;
    assert_eq!(metric(&m, "atenet_router_parking_active"), Some(0.0), "{m}");
}

#[tokio::test]
async fn two_flooding_atespaces_share_the_parking_lot() {
    let w = World::start(|c| c.parked_request_max = 4).await;
    for i in 0..6 {
        w.api.script(&format!("ta/a{i}"), |_| Reply::err(no_room()));
        w.api.script(&format!("tb/b{i}"), |_| Reply::err(no_room()));
    }
    let addr = w.router.addr;
    let park = |actor: String| tokio::spawn(async move { get(addr, Some(&actor)).await });
    // Alone, ta takes every place.
    let ta: Vec<_> = (0..4).map(|i| park(format!("ta/a{i}"))).collect();
    wait_parked(&w.router.stats, 4).await;
    // tb arrives: it gets its half, from ta's newest places, whose requests are shed at once.
    let tb: Vec<_> = (0..2).map(|i| park(format!("tb/b{i}"))).collect();
    let shed = || ta.iter().filter(|t| t.is_finished()).count();
    let two_shed = || shed() >= 2;
    eventually(Duration::from_secs(5), Duration::from_millis(10), two_shed).await;
    wait_parked(&w.router.stats, 4).await;
    assert_eq!(shed(), 2, "two of ta's four places went to tb");
    // Both at their share with the lot full: a newcomer of either is refused at once.
    for actor in ["tb/b2", "ta/a4"] {
        let refused = get(addr, Some(actor)).await;
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{actor}");
        assert_eq!(
            refused.body,
            format!("actor \"{actor}\" unavailable: router at capacity")
        );
        assert!(
            refused.elapsed < Duration::from_millis(300),
            "{:?}",
            refused.elapsed
        );
    }
    let mut bodies = Vec::new();
    for t in ta.into_iter().chain(tb) {
        bodies.push(t.await.unwrap().body);
    }
    let at_capacity = bodies
        .iter()
        .filter(|b| b.contains("router at capacity"))
        .count();
    let parked_out = bodies
        .iter()
        .filter(|b| b.contains("no worker has room"))
        .count();
    assert_eq!((at_capacity, parked_out), (2, 4), "{bodies:#?}");
    // tb's two were among those that waited out the budget.
    assert!(
        bodies[4..].iter().all(|b| b.contains("no worker has room")),
        "{bodies:#?}"
    );
    assert_eq!(Stats::get(&w.router.stats.parking_active), 0);
    assert_eq!(
        Stats::get(&w.router.stats.parking_rejected),
        4,
        "2 shed + 2 refused"
    );
}

#[tokio::test]
async fn parking_max_zero_disables_parking_but_aborted_is_still_retried() {
    let w = World::start(|c| c.parked_request_max = 0).await;
    w.api.script("lab/p3", |_| Reply::err(no_room()));
    let got = get(w.router.addr, Some("lab/p3")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.body, NO_ROOM_BODY);
    assert!(
        got.elapsed < Duration::from_millis(300),
        "{:?}",
        got.elapsed
    );
    assert_eq!(w.api.calls("lab/p3"), 1);

    let worker = w.worker();
    w.api.script("a/busy", move |c| {
        if c.n < 2 {
            Reply::err(Status::aborted("another resume"))
        } else {
            Reply::ok(&worker, true)
        }
    });
    let got = get(w.router.addr, Some("a/busy")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(Stats::get(&w.router.stats.parking_rejected), 0);
}

#[tokio::test]
async fn a_started_resume_is_not_cancelled_by_the_budget() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    // No room until 0.8 s; the attempt started after that takes 0.7 s and succeeds.
    w.api.script("lab/p3", move |c| {
        if c.since_first < Duration::from_millis(800) {
            Reply::err(no_room())
        } else {
            Reply::ok(&worker, true).after(Duration::from_millis(700))
        }
    });
    let got = get(w.router.addr, Some("lab/p3")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    let s = secs(got.elapsed);
    assert!(s > 1.2, "served after the 1 s budget: {s}");
}

#[tokio::test]
async fn routing_decision_gives_up_at_budget_plus_grace_with_an_empty_504() {
    let w = World::start(|c| {
        c.parked_request_budget = Duration::from_millis(500);
        c.tuning.decision_grace = Duration::from_millis(500);
    })
    .await;
    let worker = w.worker();
    w.api.script("a/slow", move |_| {
        Reply::ok(&worker, true).after(Duration::from_millis(2000))
    });
    let got = get(w.router.addr, Some("a/slow")).await;
    assert_eq!(got.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(got.body, "");
    let s = secs(got.elapsed);
    assert!((1.0..1.3).contains(&s), "{s}");
    // The resume was not cancelled: once it completes, the actor is served from the cache.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = get(w.router.addr, Some("a/slow")).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.resume(), "warm");
    assert_eq!(w.api.calls("a/slow"), 1);
}

#[tokio::test]
async fn client_disconnect_releases_its_parking_place() {
    let w = World::start(|c| c.parked_request_budget = Duration::from_secs(3)).await;
    w.api.script("lab/p3", |_| Reply::err(no_room()));
    let addr = w.router.addr;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: lab/p3\r\n\r\n")
        .await
        .unwrap();
    wait_parked(&w.router.stats, 1).await;
    drop(tcp);
    let released = || Stats::get(&w.router.stats.parking_active) == 0;
    assert!(
        eventually(
            Duration::from_millis(500),
            Duration::from_millis(10),
            released
        )
        .await
    );
    let m = metrics_text(w.router.metrics_addr).await;
    assert_eq!(metric(&m, "atenet_router_parking_active"), Some(0.0), "{m}");
    assert!(
        m.contains("ate_router_parking_wait_seconds_count{outcome=\"canceled\"} 1"),
        "{m}"
    );
}

// ---- single flight ------------------------------------------------------------------------------

#[tokio::test]
async fn fifty_concurrent_requests_to_a_cold_actor_share_one_resume() {
    let w = World::start(|_| {}).await;
    let worker = w.worker();
    w.api.script("a/cold", move |_| {
        Reply::ok(&worker, true).after(Duration::from_millis(500))
    });
    let addr = w.router.addr;
    let all = futures::future::join_all(
        (0..50).map(|_| tokio::spawn(async move { get(addr, Some("a/cold")).await })),
    )
    .await;
    let mut cold = 0;
    for got in all {
        let got = got.unwrap();
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        // A straggler on a loaded machine may arrive after the resume and hit the cache.
        assert!(["cold", "warm"].contains(&got.resume()), "{}", got.resume());
        cold += usize::from(got.resume() == "cold");
    }
    assert!(cold >= 40, "{cold} of 50 waited for the shared resume");
    assert_eq!(w.api.calls("a/cold"), 1);
    // One shared HTTP/2 connection to the worker carried every tunnel.
    assert_eq!(w.atunnel.state.connections.load(Ordering::SeqCst), 1);
}

// ---- stale assignment ---------------------------------------------------------------------------

#[tokio::test]
async fn stale_421_evicts_resolves_again_and_retries_once() {
    let w = World::start(|_| {}).await;
    // The old worker: a second atunnel that says the actor is not here.
    let old = start_atunnel(Default::default()).await;
    old.mark_stale("a/moved");
    let old_addr = old.addr.to_string();
    let new_addr = w.worker();
    w.api.script("a/moved", move |c| {
        Reply::ok(if c.n == 0 { &old_addr } else { &new_addr }, false)
    });
    let got = get(w.router.addr, Some("a/moved")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(w.api.calls("a/moved"), 2);
    assert_eq!(old.connects(), 1);
    assert_eq!(Stats::get(&w.router.stats.stale_retries), 1);
    // The new assignment is cached.
    assert_eq!(
        get(w.router.addr, Some("a/moved")).await.status,
        StatusCode::OK
    );
    assert_eq!(w.api.calls("a/moved"), 2);

    // Stale whatever the api says (the worker it names is fenced or restarting): the request
    // keeps retrying with the parking backoff until the parking budget is spent; the client
    // still never sees 421.
    let stale_addr = old.addr.to_string();
    old.mark_stale("a/lost");
    w.api
        .script("a/lost", move |_| Reply::ok(&stale_addr, false));
    let started = std::time::Instant::now();
    let got = get(w.router.addr, Some("a/lost")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        got.body,
        "actor a/lost unreachable: its worker is not serving it right now; retry in a few seconds"
    );
    assert!(w.api.calls("a/lost") > 2, "retried within the budget");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "gave up at the budget: {:?}",
        started.elapsed()
    );
}

/// While the api cannot be asked (Unavailable), a running actor is still reached through its last
/// known route: atunnel's fencing decides whether that copy may serve.
#[tokio::test]
async fn api_unavailable_uses_the_last_known_route() {
    let w = World::start(|c| c.assignment_cache_ttl = Duration::from_millis(100)).await;
    let worker = w.worker();
    w.api.script("a/known", move |c| {
        if c.n == 0 {
            Reply::ok(&worker, false)
        } else {
            Reply::err(tonic::Status::unavailable("store unavailable"))
        }
    });
    assert_eq!(
        get(w.router.addr, Some("a/known")).await.status,
        StatusCode::OK
    );
    // Past the assignment cache's 100 ms: the next request asks the api again.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let got = get(w.router.addr, Some("a/known")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(
        w.api.calls("a/known"),
        2,
        "the api was asked, then the last route used"
    );
    // An api that does not answer at all is not waited for past a second either.
    let worker = w.worker();
    w.api.script("a/slow", move |c| {
        let r = Reply::ok(&worker, false);
        if c.n == 0 {
            r
        } else {
            r.after(Duration::from_secs(8))
        }
    });
    assert_eq!(
        get(w.router.addr, Some("a/slow")).await.status,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = Instant::now();
    let got = get(w.router.addr, Some("a/slow")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // An actor the router never routed has no last known route: it parks as before.
    w.api.script("a/never", |_| {
        Reply::err(tonic::Status::unavailable("store unavailable"))
    });
    let got = get(w.router.addr, Some("a/never")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{}", got.body);
}

/// `--api` lists several replicas: one that refuses connections (down) is skipped, and the
/// router keeps going through the one that answers.
#[tokio::test]
async fn api_replicas_fail_over() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let w = World::start(|c| c.api = format!("{dead},{}", c.api)).await;
    w.running("a/replicated");
    for _ in 0..3 {
        let got = get(w.router.addr, Some("a/replicated")).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    }
    assert!(w.api.calls("a/replicated") >= 1);
}

// ---- gRPC ---------------------------------------------------------------------------------------

#[tokio::test]
async fn grpc_over_http2_passes_through_with_trailers() {
    use http_body_util::BodyExt;
    let w = World::start(|_| {}).await;
    w.running("a/grpc");
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    for i in 0..2u8 {
        let req = http::Request::builder()
            .method("POST")
            .uri("http://greeter.svc:50051/helloworld.Greeter/SayHello")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("ate-target-actor", "a/grpc")
            .body(http_body_util::Full::new(Bytes::from(vec![
                0, 0, 0, 0, 1, i,
            ])))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected
            .trailers()
            .cloned()
            .expect("trailers pass through");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-seen-authority"], "greeter.svc:50051");
        assert_eq!(trailers["x-seen-version"], "HTTP/2.0");
        assert_eq!(collected.to_bytes().as_ref(), &[0, 0, 0, 0, 1, i]);
    }
}

// ---- WebSocket and CONNECT ----------------------------------------------------------------------

#[tokio::test]
async fn websocket_upgrade_is_relayed() {
    let w = World::start(|_| {}).await;
    w.running("a/ws");
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let head = send_and_read_head(
        &mut tcp,
        b"GET /chat HTTP/1.1\r\nhost: ws.example\r\nate-target-actor: a/ws\r\n\
          connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
          sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    let head = head.to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for msg in [&b"hello"[..], b"second frame"] {
        tcp.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tcp.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }
}

#[tokio::test]
async fn client_connect_routes_each_inner_request_to_the_named_port() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let head = send_and_read_head(
        &mut tcp,
        b"CONNECT b.a:8080 HTTP/1.1\r\nhost: b.a:8080\r\nate-target-actor: a/b\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    for i in 0..3 {
        let req = http::Request::builder()
            .uri(format!("/inner/{i}"))
            .header("host", "inner.example:8080")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert!(got.body.contains("name=port8080\n"), "{}", got.body);
        assert!(
            got.body.contains("host=inner.example:8080\n"),
            "{}",
            got.body
        );
        assert!(
            got.body.contains(&format!("path=/inner/{i}\n")),
            "{}",
            got.body
        );
    }
    let connects = w.atunnel.state.connects.lock().unwrap().clone();
    assert!(connects.iter().all(|c| c.1 == 8080), "{connects:?}");
    // CONNECT without the header is a 404, like any request.
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    tcp.write_all(b"CONNECT b.a:8080 HTTP/1.1\r\nhost: b.a:8080\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    tcp.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 404");
}

// ---- keep-alive pool ----------------------------------------------------------------------------

#[tokio::test]
async fn idle_tunnels_are_reused_for_keep_alive() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    for _ in 0..5 {
        assert_eq!(get(w.router.addr, Some("a/b")).await.status, StatusCode::OK);
        // The pool takes the connection back once the response has ended.
        let back = || w.router.probe.idle_tunnels() > 0;
        eventually(Duration::from_secs(2), Duration::from_millis(5), back).await;
    }
    assert_eq!(
        w.atunnel.connects(),
        1,
        "one tunnel carried all five requests"
    );
    assert_eq!(w.up80.connections.load(Ordering::SeqCst), 1);
    assert_eq!(Stats::get(&w.router.stats.tunnel_reuses), 4);
}

#[tokio::test]
async fn the_pool_keeps_a_tunnel_per_concurrent_request() {
    // 32 keep-alive clients of one actor with a request in flight each, twice: the pool must
    // keep at least as many idle tunnels as one actor has concurrent requests, or each request
    // past the pool's size opens a new CONNECT stream (and atunnel a new connection to the
    // actor). With the old limit of 8, the second wave opened 24 more.
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let addr = w.router.addr;
    let senders = futures::future::join_all((0..32).map(|_| async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender
    }))
    .await;
    let mut senders = senders;
    for wave in 0..2 {
        let sent = senders.iter_mut().map(|sender| async move {
            let req = http::Request::builder()
                .uri("/slow")
                .header("host", "x")
                .header("ate-target-actor", "a/b")
                .body(Empty::<Bytes>::new())
                .unwrap();
            sender.ready().await.unwrap();
            collect(sender.send_request(req).await.unwrap(), Instant::now()).await
        });
        for got in futures::future::join_all(sent).await {
            assert_eq!(got.status, StatusCode::OK, "wave {wave}: {}", got.body);
        }
        let back = || w.router.probe.idle_tunnels() >= 32;
        eventually(Duration::from_secs(2), Duration::from_millis(5), back).await;
        assert_eq!(w.router.probe.idle_tunnels(), 32, "wave {wave}");
    }
    assert_eq!(w.up80.connections.load(Ordering::SeqCst), 32);
    assert_eq!(Stats::get(&w.router.stats.tunnel_reuses), 32);
}

// ---- robustness ---------------------------------------------------------------------------------

#[tokio::test]
async fn ten_thousand_unknown_actors_are_404_and_the_cache_stays_empty() {
    let w = World::start(|_| {}).await;
    let addr = w.router.addr;
    let tasks = (0..8).map(|t| {
        tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn);
            for i in (t..10_000).step_by(8) {
                let req = http::Request::builder()
                    .uri("/")
                    .header("host", "x")
                    .header("ate-target-actor", format!("ghosts/g-{i}"))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                sender.ready().await.unwrap();
                let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
                assert_eq!(got.status, StatusCode::NOT_FOUND);
            }
        })
    });
    for t in futures::future::join_all(tasks).await {
        t.unwrap();
    }
    assert_eq!(w.api.total_calls(), 10_000);
    assert_eq!(
        w.router.probe.cached_assignments(),
        0,
        "negative results are not cached"
    );
    assert_eq!(w.router.probe.resolutions_in_flight(), 0);
    let m = metrics_text(w.router.metrics_addr).await;
    assert!(
        m.contains("ate_router_requests_total{status=\"404\"} 10000"),
        "{m}"
    );
}

#[tokio::test]
async fn oversized_headers_and_uri_are_refused() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let long_uri = format!("/{}", "x".repeat(9000));
    let got = get_with(w.router.addr, Some("a/b"), "x", |r| {
        *r.uri_mut() = long_uri.parse().unwrap();
    })
    .await;
    assert_eq!(got.status, StatusCode::URI_TOO_LONG);
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let big = "y".repeat(70 * 1024);
    let req = format!("GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: a/b\r\nx-big: {big}\r\n\r\n");
    let _ = tcp.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out}");
}

#[tokio::test]
async fn slow_header_clients_are_cut_off() {
    let w = World::start(|c| c.tuning.header_read_timeout = Duration::from_millis(300)).await;
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), tcp.read_to_end(&mut out)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "connection closed by the router"
    );
}

#[tokio::test]
async fn silent_clients_are_cut_off() {
    let w = World::start(|c| c.tuning.header_read_timeout = Duration::from_millis(300)).await;
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    // Not a single byte: the router closes the connection after the header timeout.
    let started = Instant::now();
    let mut out = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(3), tcp.read_to_end(&mut out)).await;
    assert!(closed.is_ok(), "connection still open after 3 s");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "closed after {:?}",
        started.elapsed()
    );
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
}

#[tokio::test]
async fn request_body_streams_through() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let body = "z".repeat(200_000);
    let req = http::Request::builder()
        .method("POST")
        .uri("/upload")
        .header("host", "x")
        .header("ate-target-actor", "a/b")
        .body(http_body_util::Full::new(Bytes::from(body.clone())))
        .unwrap();
    let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
    assert_eq!(got.status, StatusCode::OK);
    assert!(got.body.ends_with(&format!("body={body}")));
}

// ---- operations ---------------------------------------------------------------------------------

#[tokio::test]
async fn healthz_and_metrics() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    assert_eq!(get(w.router.addr, Some("a/b")).await.status, StatusCode::OK);
    let m = metrics_text(w.router.metrics_addr).await;
    for name in [
        "ate_router_requests_total{status=\"200\"} 1",
        "ate_router_resolve_duration_seconds_bucket",
        "ate_router_forward_duration_seconds_bucket",
        "ate_router_resume_calls_total 1",
    ] {
        assert!(m.contains(name), "{name} missing in\n{m}");
    }
    let tcp = TcpStream::connect(w.router.metrics_addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("/healthz")
        .header("host", "x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
    assert_eq!(got.status, StatusCode::OK);
}

#[tokio::test]
async fn drain_finishes_parked_requests_and_refuses_new_connections() {
    let mut w = World::start(|c| c.parked_request_budget = Duration::from_secs(2)).await;
    let worker = w.worker();
    w.api.script("lab/p3", move |c| {
        if c.since_first < Duration::from_millis(800) {
            Reply::err(no_room())
        } else {
            Reply::ok(&worker, true)
        }
    });
    let addr = w.router.addr;
    let parked: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { get(addr, Some("lab/p3")).await }))
        .collect();
    wait_parked(&w.router.stats, 3).await;
    w.router.shutdown();
    poll_until(
        "new connections refused",
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || TcpStream::connect(addr).await.err(),
    )
    .await;
    for p in parked {
        let got = p.await.unwrap();
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert_eq!(got.resume(), "parked");
    }
    let done = w.router.done.take().unwrap();
    tokio::time::timeout(Duration::from_secs(3), done)
        .await
        .expect("router exits after the drain")
        .unwrap();
}

// ---- routing headers: duplicates and ate-target-port --------------------------------------------

/// Writes `request` on a new connection and reads the answer's status and body (the requests
/// here ask for `connection: close`).
async fn raw(addr: std::net::SocketAddr, request: &str) -> Got {
    let started = Instant::now();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0);
    Got {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT),
        headers: http::HeaderMap::new(),
        body: body.to_string(),
        elapsed: started.elapsed(),
    }
}

const DUPLICATE_TARGET: &str =
    "more than one ate-target-actor header in the request; send exactly one";

#[tokio::test]
async fn duplicate_target_actor_headers_are_400_before_any_api_call() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    w.running("a/c");
    let addr = w.router.addr;
    // The same actor twice, and two different actors: either could be a mistake.
    for second in ["a/b", "a/c"] {
        let got = get_with(addr, Some("a/b"), "x", |r| {
            r.headers_mut()
                .append("ate-target-actor", second.parse().unwrap());
        })
        .await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
        assert_eq!(got.body, DUPLICATE_TARGET);
        assert_clean(&got, None);
    }
    // As raw header lines on the wire.
    let got = raw(
        addr,
        "GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: a/b\r\nATE-Target-Actor: a/c\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_eq!(got.body, DUPLICATE_TARGET);
    // On a client CONNECT, and over HTTP/2.
    let got = raw(
        addr,
        "CONNECT b.a:8080 HTTP/1.1\r\nhost: b.a:8080\r\nate-target-actor: a/b\r\nate-target-actor: a/b\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_eq!(got.body, DUPLICATE_TARGET);
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://h2.example/")
        .header("ate-target-actor", "a/b")
        .header("ate-target-actor", "a/c")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_eq!(got.body, DUPLICATE_TARGET);
    assert_eq!(w.api.total_calls(), 0, "refused before the api is asked");
    assert_eq!(w.atunnel.connects(), 0);
    // One header still works.
    assert_eq!(get(addr, Some("a/b")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn target_port_routes_to_that_port_of_the_actor() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let addr = w.router.addr;
    let with_port = |port: &'static str| {
        move |r: &mut http::Request<Empty<Bytes>>| {
            r.headers_mut()
                .insert("ate-target-port", port.parse().unwrap());
        }
    };
    let got = get_with(addr, Some("a/b"), "app.example", with_port("8080")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert!(got.body.contains("name=port8080\n"), "{}", got.body);
    assert!(got.body.contains("host=app.example\n"), "{}", got.body);
    assert!(
        !got.body.contains("ate-target"),
        "header stripped: {}",
        got.body
    );
    let got = get_with(addr, Some("a/b"), "x", with_port("80")).await;
    assert!(got.body.contains("name=port80\n"), "{}", got.body);
    let got = get(addr, Some("a/b")).await;
    assert!(
        got.body.contains("name=port80\n"),
        "default 80: {}",
        got.body
    );
    let connects = w.atunnel.state.connects.lock().unwrap().clone();
    assert_eq!(connects[0], ("a/b".into(), 8080, "b.a:8080".into()));
    assert!(connects[1..].iter().all(|c| c.1 == 80), "{connects:?}");

    // Over HTTP/2 too.
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://h2.example/x")
        .header("ate-target-actor", "a/b")
        .header("ate-target-port", "8080")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert!(got.body.contains("name=port8080\n"), "{}", got.body);

    // A port nothing listens on in the actor.
    let got = get_with(addr, Some("a/b"), "x", with_port("9999")).await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        got.body,
        "actor a/b: nothing listens on port 9999 in the actor; check its process with `ate logs actor b -a a`"
    );
    assert_clean(&got, Some("a/b"));

    // Not a port, or two of them: 400 naming the actor, before the api is asked.
    let calls = w.api.total_calls();
    for bad in ["0", "65536", "http", "-1", "8080,8081", "0x50", ""] {
        let got = get_with(addr, Some("a/new"), "x", |r| {
            r.headers_mut()
                .insert("ate-target-port", http::HeaderValue::from_str(bad).unwrap());
        })
        .await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{bad:?}: {}", got.body);
        assert_eq!(
            got.body,
            format!("actor a/new: ate-target-port {bad:?} is not a port number (1-65535)")
        );
        assert_clean(&got, Some("a/new"));
    }
    let got = get_with(addr, Some("a/new"), "x", |r| {
        r.headers_mut()
            .append("ate-target-port", "80".parse().unwrap());
        r.headers_mut()
            .append("ate-target-port", "8080".parse().unwrap());
    })
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_eq!(
        got.body,
        "actor a/new: more than one ate-target-port header in the request; send at most one"
    );
    assert_eq!(
        w.api.total_calls(),
        calls,
        "refused before the api is asked"
    );
    assert_eq!(w.api.calls("a/new"), 0);

    // A client CONNECT names its port itself; a header naming another one is refused.
    let got = raw(
        addr,
        "CONNECT b.a:8080 HTTP/1.1\r\nhost: b.a:8080\r\nate-target-actor: a/b\r\nate-target-port: 9090\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_eq!(
        got.body,
        "actor a/b: ate-target-port 9090 disagrees with the CONNECT port 8080; send one of them"
    );
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        b"CONNECT b.a:8080 HTTP/1.1\r\nhost: b.a:8080\r\nate-target-actor: a/b\r\nate-target-port: 8080\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
}

// ---- forwarding failures ------------------------------------------------------------------------

#[tokio::test]
async fn a_suspend_cut_a_closing_actor_and_a_dead_worker_have_their_own_502s() {
    let w = World::start(|_| {}).await;
    let addr = w.router.addr;

    // Ingress goes off for a suspend while the actor works on the request: atunnel closes the
    // tunnel, and a probe finds the actor no longer served there.
    w.running("a/s");
    let slow = tokio::spawn(async move {
        get_with(addr, Some("a/s"), "x", |r| {
            *r.uri_mut() = "/sleep/3000".parse().unwrap();
        })
        .await
    });
    let open = || w.atunnel.open_tunnels() > 0;
    eventually(Duration::from_secs(2), Duration::from_millis(10), open).await;
    w.atunnel.suspend("a/s");
    let got = slow.await.unwrap();
    assert_eq!(got.status, StatusCode::BAD_GATEWAY, "{}", got.body);
    assert_eq!(
        got.body,
        "actor a/s: its connection was cut before it answered (the actor was suspended, moved or stopped); send the request again"
    );
    assert!(got.elapsed < Duration::from_secs(2), "{:?}", got.elapsed);
    assert_clean(&got, Some("a/s"));
    assert_eq!(w.atunnel.probes(), vec![("a/s".to_string(), 421)]);

    // The actor's process closes the connection without an answer: still served there.
    w.running("a/c");
    let got = get_with(addr, Some("a/c"), "x", |r| {
        r.headers_mut()
            .insert("ate-target-port", CLOSER_PORT.into());
    })
    .await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY, "{}", got.body);
    assert_eq!(
        got.body,
        "actor a/c closed the connection before it answered; check its process with `ate logs actor c -a a`"
    );
    assert_clean(&got, Some("a/c"));
    assert!(
        w.atunnel.probes().contains(&("a/c".to_string(), 200)),
        "{:?}",
        w.atunnel.probes()
    );

    // A worker that does not answer, until the parking budget is spent.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    w.api.script("a/d", move |_| Reply::ok(&dead_addr, false));
    let got = get(addr, Some("a/d")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{}", got.body);
    assert_eq!(
        got.body,
        "actor a/d unreachable: its worker did not answer; retry in a few seconds"
    );
    assert_clean(&got, Some("a/d"));
}

// ---- every error body: one line, naming the actor, no internal names ----------------------------

#[tokio::test]
async fn every_error_body_is_one_line_naming_the_actor_without_internal_names() {
    let w = World::start(|c| c.parked_request_budget = Duration::from_millis(300)).await;
    let addr = w.router.addr;
    let long_error = format!(
        "restore on worker w-1 failed: node call RestoreWorkload: Status {{ code: Internal, message: \"{}\" }}\nline two",
        "z".repeat(400)
    );
    let crashed = format!(
        "actor e/crashed is ACTOR_STATE_CRASHED ({long_error}): AssignWorker prerequisite not met; RevertActor returns it to ACTOR_STATE_SUSPENDED"
    );
    let statuses: Vec<(&str, Status, u16)> = vec![
        ("e/crashed", Status::failed_precondition(crashed), 503),
        (
            "e/suspending",
            Status::failed_precondition(
                "actor e/suspending is ACTOR_STATE_SUSPENDING; try again when the operation on it has finished",
            ),
            503,
        ),
        (
            "e/leased",
            Status::aborted("another operation holds actor e/leased"),
            503,
        ),
        (
            "e/full",
            Status::resource_exhausted(ate_core::NO_ROOM_MESSAGE),
            503,
        ),
        (
            "e/template",
            Status::not_found("template \"e/gone\" not found"),
            404,
        ),
        (
            "e/deadline",
            Status::deadline_exceeded("ResumeActor: Status { code: DeadlineExceeded }"),
            504,
        ),
        (
            "e/denied",
            Status::permission_denied("ResumeActor denied to x"),
            403,
        ),
        (
            "e/unauth",
            Status::unauthenticated("tonic: no certificate"),
            401,
        ),
        (
            "e/internal",
            Status::internal("Status { code: Internal, message: \"tonic::transport\" }"),
            500,
        ),
    ];
    for (actor, status, _) in &statuses {
        let status = status.clone();
        w.api.script(actor, move |_| Reply::err(status.clone()));
    }
    for (actor, _, code) in &statuses {
        let got = get(addr, Some(actor)).await;
        assert_eq!(got.status.as_u16(), *code, "{actor}: {}", got.body);
        assert_clean(&got, Some(actor));
    }
    let got = get(addr, Some("e/crashed")).await;
    assert!(
        got.body.starts_with(
            "actor e/crashed crashed: restore on worker w-1 failed: node call restore; run `ate revert actor crashed -a e` to retry"
        ),
        "{}",
        got.body
    );
    assert!(got.body.ends_with("(AssignWorker prerequisite not met)"));
    let got = get(addr, Some("e/suspending")).await;
    assert_eq!(
        got.body,
        "actor e/suspending unavailable: it is still suspending; retry in a few seconds"
    );
    let got = get(addr, Some("e/full")).await;
    assert_eq!(
        got.body,
        "actor e/full unavailable: no worker has room for the actor"
    );
    let got = get(addr, Some("e/template")).await;
    assert_eq!(
        got.body,
        "actor e/template cannot start: template \"e/gone\" not found; apply the template again with `ate apply -f <file>`"
    );

    // Unknown actor, and the forwarding failures.
    let got = get(addr, Some("e/ghost")).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_clean(&got, Some("e/ghost"));
    w.running("e/run");
    let got = get_with(addr, Some("e/run"), "x", |r| {
        r.headers_mut()
            .insert("ate-target-port", "7".parse().unwrap());
    })
    .await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    assert_clean(&got, Some("e/run"));

    // Refused before anything is resolved.
    let got = get(addr, None).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_clean(&got, None);
    assert!(
        got.body.starts_with("missing ate-target-actor header"),
        "{}",
        got.body
    );
    let got = get(addr, Some("Team/Agent")).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_clean(&got, Some("\"Team/Agent\""));
    let got = get_with(addr, Some("e/run"), "x", |r| {
        *r.uri_mut() = format!("/{}", "u".repeat(9000)).parse().unwrap();
    })
    .await;
    assert_eq!(got.status, StatusCode::URI_TOO_LONG);
    assert_clean(&got, Some("e/run"));
    let got = raw(
        addr,
        "CONNECT b.e HTTP/1.1\r\nhost: b.e\r\nate-target-actor: e/run\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_clean(&got, Some("e/run"));
    let got = get_with(addr, Some("e/run"), "x", |r| {
        r.headers_mut()
            .insert("ate-target-port", "99999".parse().unwrap());
    })
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert_clean(&got, Some("e/run"));
}
