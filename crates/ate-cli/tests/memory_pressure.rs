//! Memory pressure (issue 34 item 1, issue 38 item 2) through `ate up` on real runc + CRIU
//! workers: while the host's available memory is below the node's `--memory-low-percent`, frozen
//! copies go first (the workers drop them below `--frozen-min-available-percent`), then the
//! node suspends its least recently used idle actor, one at a time, each keeping its memory in
//! its generation; an actor in use is never suspended for it.
//!
//! A test machine's memory is not low, so both marks are set to 100 % (env of `ate up`, passed
//! on to the node and the workers): memory then counts as low all the time, which is what the
//! test needs to watch the order the system gives memory back in.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::actors::*;
use support::*;

const NS: &str = "ns-pressure";

fn events(sys: &System) -> Vec<Value> {
    serde_json::from_str(&sys.ate_ok(&["get", "events", "-a", NS, "-o", "json"]))
        .expect("events JSON")
}

/// The ids of the events of `name` whose reason is `reason` and whose message holds `needle`.
fn ids(events: &[Value], name: &str, reason: &str, needle: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["name"] == name && e["reason"] == reason)
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(needle)))
        .filter_map(|e| e["id"].as_u64())
        .collect()
}

#[test]
fn under_memory_pressure_idle_actors_go_least_recently_used_first_and_busy_ones_stay() {
    let sys = System::up_with_env(
        UpOptions {
            workers: 2,
            slots: 4,
            demo: false,
            ..Default::default()
        },
        &[
            ("ATE_MEMORY_LOW_PERCENT", "100"),
            ("ATE_FROZEN_MIN_AVAILABLE_PERCENT", "100"),
        ],
    );
    assert!(!sys.node_metrics.is_empty(), "the node serves /metrics");
    sys_apply(&sys, NS, "counter", &Tpl::counter());
    for name in ["c0", "c1", "c2", "busy"] {
        create_actor(&sys, NS, name, "counter");
    }

    // `busy` is called every 300 ms for the whole test: never idle for the 2 s minimum.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (stop, router) = (stop.clone(), sys.router_addr);
        std::thread::spawn(move || {
            let mut last = 0;
            let mut served = 0;
            while !stop.load(Ordering::SeqCst) {
                let (status, _, body) = get(router, &format!("{NS}/busy"), "/");
                assert_eq!(status, 200, "busy: {body}");
                let count = counts(&body).0;
                assert_eq!(count, last + 1, "busy lost or skipped a count: {body}");
                last = count;
                served += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            served
        })
    };

    // c0, c1, c2 are called once each, in this order.
    for name in ["c0", "c1", "c2"] {
        assert_eq!(counts(&get_ok(&sys, &format!("{NS}/{name}"), "/")).0, 1);
        std::thread::sleep(Duration::from_millis(300));
    }
    for name in ["c0", "c1", "c2"] {
        wait_state(
            &sys,
            NS,
            name,
            "ACTOR_STATE_SUSPENDED",
            Duration::from_secs(30),
        );
    }

    // Each was suspended for memory, the least recently used first, one after another.
    let all = events(&sys);
    let order: Vec<u64> = ["c0", "c1", "c2"]
        .iter()
        .map(|name| {
            let suspended = ids(&all, name, "Suspending", "host memory low");
            assert!(!suspended.is_empty(), "{name}: {all:#?}");
            suspended[0]
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "least recently used first: {order:?}"
    );
    assert!(sys.node_metric("ate_node_memory_pressure_suspends_total") >= 3);
    // Their frozen copies went too (below the workers' mark), so the node went on to the next.
    let workers_log = format!("{}{}", sys.log("worker-1"), sys.log("worker-2"));
    assert!(
        workers_log
            .lines()
            .any(|l| l.contains("dropping frozen actor") && l.contains("host memory low")),
        "no frozen copy dropped for memory"
    );

    // The one in use was never suspended, and has answered every call.
    let busy_state = actor(&sys, NS, "busy");
    assert_eq!(state_of(&busy_state), "ACTOR_STATE_RUNNING", "{busy_state}");
    assert!(
        ids(&events(&sys), "busy", "Suspending", "").is_empty(),
        "busy was suspended"
    );

    // An actor suspended for memory comes back with it.
    let began = Instant::now();
    assert_eq!(counts(&get_ok(&sys, &format!("{NS}/c0"), "/")).0, 2);
    eprintln!("[timing] c0 back in {} ms", began.elapsed().as_millis());

    stop.store(true, Ordering::SeqCst);
    let served = busy.join().expect("busy thread");
    assert!(served >= 10, "busy served {served} calls");
}
