//! The demos under `demos/`, each run (shortened through its environment variables) against an
//! `ate up` of the shape its README asks for, with their outcomes checked.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

/// Runs `demos/<name>/run.sh` against `sys`; returns stdout (stderr is printed for the test log).
fn run_demo(sys: &System, name: &str, env: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../demos/{name}/run.sh"));
    let out = Command::new("bash")
        .arg(&script)
        .env("ATE", ATE)
        .env("ATE_API", &sys.api)
        // The admin certificate `ate up` wrote (mTLS).
        .env("ATE_STATE_DIR", sys.state_dir())
        .env("ATE_ROUTER", &sys.router)
        .env("HOME", sys.dir.path())
        // Where `ate up` wrote the api address (and any client certificate).
        .env("XDG_CONFIG_HOME", sys.dir.path().join("config"))
        .env("ATE_STATE_DIR", sys.state_dir())
        .envs(env.iter().copied())
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("--- {name} stdout\n{stdout}--- {name} stderr\n{stderr}");
    assert!(
        out.status.success(),
        "demo {name} failed ({}); router log:\n{}",
        out.status,
        sys.log("router")
    );
    stdout
}

/// The number after `label :` in a summary block line.
fn summary_number(out: &str, label: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == label).then(|| v.split_whitespace().next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {label:?} line in\n{out}"))
}

#[test]
fn counter_demo_counts_continue() {
    let sys = System::up(UpOptions::default());
    let out = run_demo(&sys, "counter", &[("NAME", "demo-counter")]);
    for n in 1..=4 {
        assert!(
            out.contains(&format!(
                "preserved memory count: {n} | preserved file counter: {n} | preserved rootfs counter: {n}"
            )),
            "count {n} missing:\n{out}"
        );
    }
    assert!(
        out.contains("==> counts continued across 2 suspends"),
        "{out}"
    );
}

#[test]
fn parking_demo_timeline_and_load_run() {
    let sys = System::up(UpOptions::with_slots(2, 1));
    let out = run_demo(&sys, "parking", &[("LOAD_SECONDS", "30")]);
    let row = |event: &str| -> Vec<String> {
        out.lines()
            .map(|l| l.split('\t').map(str::to_string).collect::<Vec<_>>())
            .find(|cols| cols.get(1).map(String::as_str) == Some(event))
            .unwrap_or_else(|| panic!("no {event} row in\n{out}"))
    };
    for p in ["p1", "p2"] {
        assert_eq!(row(&format!("{p}-free-worker"))[2], "200");
    }
    let failed = row("p3-no-free-worker");
    assert_eq!(failed[2], "503");
    let secs: f64 = failed[3].parse().expect("seconds");
    assert!(
        (5.0..=5.5).contains(&secs),
        "503 after {secs} s, want about 5 s"
    );
    assert_eq!(
        failed[4],
        "actor ate-demo-parking/p3 unavailable: no worker has room for the actor"
    );
    let served = row("p3-served-after-park");
    assert_eq!(served[2], "200", "{served:?}");
    let secs: f64 = served[3].parse().expect("seconds");
    assert!(secs < 5.0, "served after {secs} s");
    // The load run: the spec's summary block and most requests served.
    assert!(out.contains("==> results\n    total requests : "), "{out}");
    let total = summary_number(&out, "total requests");
    let ok = summary_number(&out, "200 OK");
    assert!(total >= 20, "only {total} requests in 30 s");
    // The issue asks for ≥ 95 % (the spec served 90 of 92, 97.8 %). Before the api's admission
    // queue the loop whose actor was just suspended asked again at once and usually won the
    // freed worker over requests parked with a longer backoff, so a parked request could starve
    // for the whole budget (90-94 % served). Now freed room goes to the oldest waiting resume
    // (crates/ate-api/src/scheduler.rs, `Waiters`): 100 % served in every debug run we made,
    // alone and with the whole suite in parallel on 2 cores.
    assert!(
        ok * 100 >= total * 95,
        "{ok} of {total} served, want ≥ 95 %"
    );
    assert!(out.contains("    200 latency    : avg "), "{out}");
}

#[test]
fn burst_demo_all_served() {
    // Room for 16 actors, as the demo asks (2 workers × 8 slots); shortened levels and rounds.
    let sys = System::up(UpOptions::with_slots(2, 8));
    let out = run_demo(
        &sys,
        "burst",
        &[("LEVELS", "1 2 4"), ("ROUNDS", "2"), ("MEMORY_MIB", "20")],
    );
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip_while(|l| !l.starts_with("Resumes at the same instant"))
        .skip(1)
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for (row, n) in rows.iter().zip([1, 2, 4]) {
        assert_eq!(row[0], n.to_string());
        assert_eq!(row[1], (n * 2).to_string(), "requests");
        assert_eq!(row[2], row[1], "all returned 200: {row:?}");
    }
}

#[test]
fn oversubscribe_demo_serves_more_actors_than_slots() {
    let sys = System::up(UpOptions::with_slots(2, 2));
    let out = run_demo(
        &sys,
        "oversubscribe",
        &[
            ("ACTORS", "12"),
            ("CLIENTS", "3"),
            ("DURATION", "25"),
            ("IDLE_TIMEOUT", "2s"),
        ],
    );
    let distinct = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("served actors  : "))
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no served actors line:\n{out}"));
    assert!(
        distinct > 4,
        "{distinct} distinct actors served on 4 slots:\n{out}"
    );
    let total = summary_number(&out, "total requests");
    let ok = summary_number(&out, "200 OK");
    // The point is density (more distinct actors served than slots). A request that finds all
    // slots taken by actors not yet idle for 2 s parks up to 5 s and can get the 503; with the
    // whole test suite running in parallel on 2 cores that is a few percent (88 % served seen).
    assert!(ok * 100 >= total * 75, "{ok} of {total} served");
}
