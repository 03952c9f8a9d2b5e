//! No silent memory loss by placement (issue 30, item 6), end to end on real runc + CRIU: an
//! actor suspended at MEMORY fidelity, whose only worker then comes back without CRIU
//! (`ATE_CRIU=none`: it advertises no `memory:criu`), is not restored at ROOTFS there. The api
//! answers its resume with ResourceExhausted naming the missing capability, the router parks
//! and answers the spec's 503, the actor stays SUSPENDED with its generation; once a worker
//! with CRIU is back, the same generation restores with its memory.

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

const NS: &str = "ns-place";

#[test]
fn a_memory_generation_waits_for_a_worker_that_can_restore_it() {
    let opts = || UpOptions::with_workers(1);
    // No frozen copies: a resume restores the generation on disk.
    let keep_frozen_off = ("ATE_KEEP_FROZEN", "0");
    let sys = System::up_with_env(opts(), &[keep_frozen_off]);
    counter_actor(&sys, NS, "counter", "m");
    let target = format!("{NS}/m");
    for n in 1..=2 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")).0, n);
    }
    sys.ate_ok(&["suspend", "actor", "m", "-a", NS]);
    let generation = actor(&sys, NS, "m")["generation"].as_u64().unwrap_or(0);
    assert!(generation >= 1, "a generation was written");

    // The worker comes back without CRIU.
    let sys = sys.restart_with_env(opts(), &[keep_frozen_off, ("ATE_CRIU", "none")]);
    // The store still holds the worker's last registration until the new process registers.
    wait_workers(&sys, |w| {
        !w.contains("memory:criu") && w.contains("userns:off")
    });
    let out = sys.ate(&["resume", "actor", "m", "-a", NS]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "resume must not succeed: {said}");
    assert!(
        said.contains("no worker has room for the actor") && said.contains("memory:criu"),
        "ResourceExhausted naming the capability: {said}"
    );
    // Through the router: parked, then the spec's 503 after the budget.
    let started = Instant::now();
    let (status, _, body) = get(sys.router_addr, &target, "/");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no worker has room for the actor"), "{body}");
    assert!(
        started.elapsed().as_secs_f64() >= 4.0,
        "the router parked before answering ({:?})",
        started.elapsed()
    );
    let a = actor(&sys, NS, "m");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "{a}");
    assert_eq!(a["generation"].as_u64(), Some(generation), "{a}");

    // CRIU is back: the same generation restores with its memory (count goes on from 2).
    let sys = sys.restart_with_env(opts(), &[keep_frozen_off]);
    wait_workers(&sys, |w| w.contains("memory:criu"));
    assert_eq!(counts(&get_ok(&sys, &target, "/")).0, 3);
    let a = actor(&sys, NS, "m");
    assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
}

/// Waits (30 s at most) until `ate get workers -o json` satisfies `ok`.
fn wait_workers(sys: &System, ok: impl Fn(&str) -> bool) {
    let start = Instant::now();
    loop {
        let workers = sys.ate_ok(&["get", "workers", "-o", "json"]);
        if ok(&workers) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "workers never became as expected: {workers}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
