//! Egress is on before an actor's first instruction (issue 37, item 3): the counter dials a
//! host from its first line of `main` and every 5 ms after (`$DIAL_ADDR`, see the counter's
//! `dial.rs`); not one dial fails at a cold start, after a thaw of its frozen copy, nor after
//! a CRIU restore on the other worker. The host is a network namespace the test creates
//! (`support::test_host`), removed on drop; traffic goes nowhere else.

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::actors::*;
use support::test_host::TestHost;
use support::*;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `(ok, failed, body)` of the dials begun at or after `since` (unix ms).
fn dials(sys: &System, target: &str, since: u64) -> (u64, u64, String) {
    let body = get_ok(sys, target, &format!("/dials?since={since}"));
    let num = |word: &str| {
        body.split_whitespace()
            .skip_while(|w| *w != word)
            .nth(1)
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("not a /dials answer: {body:?}"))
    };
    (num("ok"), num("failed"), body)
}

/// Every dial begun since `since` succeeded, and some did (asked again until one has).
fn all_dials_reached(sys: &System, target: &str, since: u64, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ok, failed, body) = dials(sys, target, since);
        assert_eq!(
            failed,
            0,
            "{when}: a dial failed ({body})\nworker-1:\n{}\nworker-2:\n{}",
            sys.log("worker-1"),
            sys.log("worker-2")
        );
        if ok > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{when}: no dial reached the host"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn egress_is_on_before_the_first_instruction_at_start_thaw_and_restore() {
    // Before the system starts, so the workers' first read of the node addresses has it.
    let host = TestHost::new();
    let sys = System::up(UpOptions::default());
    let ns = "ns-egress-first";
    let peer = host.peer(0);
    let tpl = Tpl {
        env: vec![
            ("DIAL_ADDR".into(), peer.clone()),
            ("DIAL_EVERY_MS".into(), "5".into()),
        ],
        egress: Some(format!(
            "  egress:\n    defaultAction: deny-all\n    allow: [\"{peer}\"]\n"
        )),
        ..Tpl::counter()
    };
    sys_apply(&sys, ns, "dialer", &tpl);
    create_actor(&sys, ns, "d", "dialer");
    let target = format!("{ns}/d");

    // Cold start: the first dial ran before the wakeup probe, even before the listener.
    all_dials_reached(&sys, &target, 0, "cold start");

    // Suspended with a frozen copy kept (the default), resumed by a thaw in place.
    sys.ate_ok(&["suspend", "actor", "d", "-a", ns]);
    let since = now_ms();
    all_dials_reached(&sys, &target, since, "after a thaw");

    // Suspended again and restored from the generation on the other worker (CRIU).
    let here = worker_of(&sys, ns, "d");
    sys.ate_ok(&["suspend", "actor", "d", "-a", ns]);
    let other = pin_to_other_worker(&sys, ns, "d", &here);
    let since = now_ms();
    all_dials_reached(&sys, &target, since, "after a restore");
    assert_eq!(worker_of(&sys, ns, "d"), other, "the restore ran elsewhere");
}
