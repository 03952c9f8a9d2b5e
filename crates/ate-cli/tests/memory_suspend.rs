//! Memory that survives what real agents do and what goes wrong inside a suspend, end to end on
//! real runc + CRIU workers:
//!
//! - an actor holding an open outbound TCP connection (through the egress proxy, to a test host
//!   in a network namespace) suspends at MEMORY fidelity and resumes with its memory, on the same
//!   worker and on the other one; its connection comes back closed and a new one works;
//! - a `runc checkpoint` killed in the middle of the dump fails the suspend visibly: the actor is
//!   RUNNING again with its memory and the reason in `lastError`, nothing is written, and a later
//!   suspend works.

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::test_host::TestHost;
use support::*;

const NS: &str = "ns-mem";

fn manifest_fidelity(sys: &System, name: &str, generation: u64) -> String {
    let dir = generation_dir(&sys.state_dir(), NS, name, generation);
    let text = support::generations::local_manifest(&sys.state_dir(), &dir);
    let v: serde_json::Value = serde_json::from_str(&text).expect("manifest json");
    v["fidelity"].to_string()
}

#[test]
fn an_open_outbound_connection_does_not_stop_memory_from_coming_back() {
    // Before the system starts, so the workers' first read of the node addresses has it.
    let host = TestHost::new();
    // No frozen copies: every resume restores the generation with CRIU (lazily).
    let sys = System::up_with_env(UpOptions::default(), &[("ATE_KEEP_FROZEN", "0")]);
    let tpl = Tpl {
        egress: Some(format!(
            "  egress:\n    defaultAction: allow-all\n    allow: [\"{}\"]\n",
            host.peer(0)
        )),
        ..Tpl::counter()
    };
    sys_apply(&sys, NS, "counter", &tpl);
    create_actor(&sys, NS, "c", "counter");
    let target = format!("{NS}/c");
    for n in 1..=2 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
    }
    let hold = format!("/connect?addr={}&hold=600", host.peer(0));

    // The actor keeps a connection open (for 10 minutes) and is suspended: a MEMORY generation.
    let mut count = 2;
    for (round, other_worker) in [(1u64, false), (2, true), (3, false)] {
        assert_eq!(get_ok(&sys, &target, &hold), "ok", "round {round}");
        let before = worker_of(&sys, NS, "c");
        if other_worker {
            // The next resume goes to the other worker (through the node-local generation).
            pin_to_other_worker(&sys, NS, "c", &before);
        }
        let began = Instant::now();
        sys.ate_ok(&["suspend", "actor", "c", "-a", NS]);
        let suspend = began.elapsed();
        let a = actor(&sys, NS, "c");
        assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "round {round}: {a}");
        assert_eq!(
            a["lastError"].as_str().unwrap_or_default(),
            "",
            "round {round}: a suspend with an open connection is a plain success: {a}"
        );
        assert!(
            manifest_fidelity(&sys, "c", round).contains("MEMORY"),
            "round {round}: generation {round} holds memory"
        );
        // Memory continues: the count does not start over.
        count += 1;
        let began = Instant::now();
        assert_eq!(
            counts(&get_ok(&sys, &target, "/")),
            (count, count, count),
            "round {round}"
        );
        let resume = began.elapsed();
        let after = worker_of(&sys, NS, "c");
        if other_worker {
            assert_ne!(after, before, "round {round}: resumed on the other worker");
        }
        eprintln!(
            "round {round}: suspend with an open connection {} ms, resume {} ms ({before} → {after})",
            ms(suspend),
            ms(resume)
        );
    }
    // Reconnecting after the resumes works (the test host holds every connection it accepts).
    assert_eq!(get_ok(&sys, &target, &hold), "ok");
}

/// Finds the `runc … checkpoint` process among `ate up`'s descendants and kills it with
/// SIGKILL `delay` after it appeared; true when one was killed.
fn kill_runc_checkpoint(up: u32, delay: Duration, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(pid) = runc_checkpoint_under(up) {
            std::thread::sleep(delay);
            return nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn runc_checkpoint_under(up: u32) -> Option<i32> {
    descendant_matching(up, |args| {
        args.first().is_some_and(|a| a.ends_with("runc")) && args.iter().any(|a| a == "checkpoint")
    })
}

#[test]
fn a_killed_dump_fails_the_suspend_and_the_actor_runs_on_with_its_memory() {
    let mut sys = System::up(UpOptions::with_workers(1));
    counter_actor(&sys, NS, "counter", "k");
    let target = format!("{NS}/k");
    let mut count = 0;
    for _ in 0..3 {
        count += 1;
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (count, count, count));
    }
    let up = sys.child.id();
    // Early in the dump, in the middle, and late: whenever runc dies, the suspend fails and
    // the actor runs on with its memory.
    for delay_ms in [0u64, 30, 80, 150] {
        let killer = std::thread::spawn(move || {
            kill_runc_checkpoint(up, Duration::from_millis(delay_ms), Duration::from_secs(20))
        });
        let out = sys.ate(&["suspend", "actor", "k", "-a", NS]);
        let killed = killer.join().unwrap_or(false);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let a = actor(&sys, NS, "k");
        if !killed || out.status.success() {
            // runc finished before the kill landed: a plain suspend; the next request resumes.
            eprintln!(
                "delay {delay_ms} ms: the dump finished first ({})",
                state_of(&a)
            );
            assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "{a}");
        } else {
            assert!(
                stderr.contains("runs on"),
                "delay {delay_ms} ms: the failure says the actor runs on: {stderr}"
            );
            assert_eq!(
                state_of(&a),
                "ACTOR_STATE_RUNNING",
                "delay {delay_ms} ms: {a}"
            );
            let why = a["lastError"].as_str().unwrap_or_default();
            assert!(why.contains("memory dump failed"), "lastError: {a}");
            eprintln!(
                "delay {delay_ms} ms: suspend failed as it must: {}",
                stderr.trim()
            );
        }
        count += 1;
        assert_eq!(
            counts(&get_ok(&sys, &target, "/")),
            (count, count, count),
            "delay {delay_ms} ms: memory intact"
        );
    }
    // Nothing stuck: a suspend now succeeds and the count continues after it.
    sys.ate_ok(&["suspend", "actor", "k", "-a", NS]);
    count += 1;
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (count, count, count));
    assert!(
        !sys.log("worker-1").contains("cannot thaw"),
        "every frozen sandbox thawed"
    );
    sys.stop();
}
