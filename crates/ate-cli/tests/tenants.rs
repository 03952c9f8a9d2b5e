//! Atespace quotas end to end (issue 34, item 2), through `ate up` on real runc workers: an
//! atespace at its `spec.quota` gets a 429 naming the quota at once (not parked), while another
//! atespace's requests are served; `ate get atespaces` shows use against quota; room frees when
//! one of its actors suspends; lowering or clearing the quota with `ate apply` takes effect.
//! And fairness between atespaces that wait: the router's parking places and the room that
//! frees are shared between them.

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

/// The counter template in `ns`, with the Atespace document carrying `quota` (YAML flow map).
fn with_quota(ns: &str, quota: Option<&str>) -> String {
    let doc = Tpl::counter().yaml(ns, "counter");
    match quota {
        Some(q) => doc.replacen(
            &format!("metadata:\n  name: {ns}\n"),
            &format!("metadata:\n  name: {ns}\nspec:\n  quota: {q}\n"),
            1,
        ),
        None => doc,
    }
}

fn apply_text(sys: &System, file: &str, text: &str) -> String {
    let path = sys.dir.path().join(file);
    std::fs::write(&path, text).expect("write documents");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")])
}

/// The `ate get atespaces` row of `ns`, split on whitespace.
fn atespace_row(sys: &System, ns: &str) -> Vec<String> {
    let out = sys.ate_ok(&["get", "atespaces"]);
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(ns))
        .unwrap_or_else(|| panic!("{ns} not listed:\n{out}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_atespace_at_its_quota_is_refused_at_once_while_others_are_served() {
    let sys = System::up(UpOptions::default());
    let out = apply_text(
        &sys,
        "a.yaml",
        &with_quota("team-a", Some("{runningActors: 2, memory: 1Gi}")),
    );
    assert!(out.contains("atespace/team-a created"), "{out}");
    apply_text(&sys, "b.yaml", &with_quota("team-b", None));
    for (ns, name) in [
        ("team-a", "a1"),
        ("team-a", "a2"),
        ("team-a", "a3"),
        ("team-b", "b1"),
        ("team-b", "b2"),
        ("team-b", "b3"),
    ] {
        create_actor(&sys, ns, name, "counter");
    }
    get_ok(&sys, "team-a/a1", "/");
    get_ok(&sys, "team-a/a2", "/");
    assert_eq!(
        atespace_row(&sys, "team-a")[1..5],
        ["3", "2/2", "500m", "128Mi/1Gi"]
    );

    // The third is over runningActors: 429 at once (the parking budget is 5 s), naming it.
    let asked = Instant::now();
    let (status, _, body) = get(sys.router_addr, "team-a/a3", "/");
    let took = asked.elapsed();
    assert_eq!(status, 429, "{body}");
    assert!(
        took < Duration::from_secs(2),
        "answered after {took:?}: parked?"
    );
    assert!(
        body.contains(
            r#"atespace "team-a" has no quota left for the actor: runningActors 2 of 2 in use"#
        ),
        "{body}"
    );
    let a3 = actor(&sys, "team-a", "a3");
    assert_eq!(
        state_of(&a3),
        "ACTOR_STATE_SUSPENDED",
        "nothing changed: {a3}"
    );

    // Another atespace is served meanwhile, on the same workers.
    for b in ["b1", "b2", "b3"] {
        get_ok(&sys, &format!("team-b/{b}"), "/");
    }
    assert_eq!(atespace_row(&sys, "team-b")[2], "3");

    // One of team-a's actors suspends: its room is the third one's.
    sys.ate_ok(&["suspend", "actor", "a1", "-a", "team-a"]);
    get_ok(&sys, "team-a/a3", "/");
    // Memory: a third 64Mi counter would pass 128Mi; the quota is changed by applying again.
    let out = apply_text(
        &sys,
        "a2.yaml",
        &with_quota("team-a", Some("{memory: 128Mi}")),
    );
    assert!(out.contains("atespace/team-a configured"), "{out}");
    let (status, _, body) = get(sys.router_addr, "team-a/a1", "/");
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("memory 128Mi of 128Mi in use"), "{body}");
    // Cleared: no limit.
    let out = apply_text(&sys, "a3.yaml", &with_quota("team-a", Some("{}")));
    assert!(out.contains("atespace/team-a configured"), "{out}");
    get_ok(&sys, "team-a/a1", "/");
    assert_eq!(atespace_row(&sys, "team-a")[2], "3");
    // Listing in chunks (kubectl's --limit / --continue): two, then the rest after the token.
    let out = sys.ate(&[
        "get",
        "actors",
        "-a",
        "team-b",
        "--limit",
        "2",
        "--chunk-size",
        "1",
    ]);
    assert!(out.status.success());
    let first = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = first.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{first}");
    assert!(
        rows[0].contains(" b1 ") && rows[1].contains(" b2 "),
        "{first}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let token = err
        .split("--continue ")
        .nth(1)
        .map(str::trim)
        .unwrap_or_else(|| panic!("no token: {err}"));
    let rest = sys.ate_ok(&["get", "actors", "-a", "team-b", "--continue", token]);
    let rows: Vec<&str> = rest.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{rest}");
    assert!(rows[0].contains(" b3 "), "{rest}");
    // Applying the same document again changes nothing.
    let out = apply_text(&sys, "a4.yaml", &with_quota("team-a", Some("{}")));
    assert!(out.contains("atespace/team-a unchanged"), "{out}");
}

#[test]
fn a_bad_quota_is_refused_before_anything_changes() {
    let sys = System::up(UpOptions::bare(1));
    let path = sys.dir.path().join("bad.yaml");
    std::fs::write(&path, with_quota("team-c", Some("{memory: lots}"))).expect("write");
    let out = sys.ate(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.quota.memory"), "{err}");
    let listed = sys.ate_ok(&["get", "atespaces"]);
    assert!(!listed.contains("team-c"), "created anyway:\n{listed}");
}

/// `atenet_router_parking_active` on the router's `/metrics`.
fn parked(sys: &System) -> u64 {
    let (_, text) = ate_test_support::http::http_get(&sys.router_metrics.to_string(), "/metrics");
    text.lines()
        .find(|l| l.starts_with("atenet_router_parking_active"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

type Call = std::thread::JoinHandle<(u16, String, Duration)>;

fn call_in_background(sys: &System, target: String) -> Call {
    let router = sys.router_addr;
    std::thread::spawn(move || {
        let began = Instant::now();
        let (status, _, body) = get(router, &target, "/");
        (status, body, began.elapsed())
    })
}

/// Issue 34's "two atespaces flooding the router get parking places in proportion", and fair
/// placement, through `ate up` on one real worker with one slot: flood-a fills the router's
/// 4 places; flood-b's arrivals take half of them (flood-a's newest are shed with the lot-full
/// 503 at once); then, as the slot frees twice, room goes to flood-a's oldest and then to
/// flood-b's, though another of flood-a waited longer.
#[test]
fn two_flooding_atespaces_share_the_parking_lot_and_the_freed_room() {
    let sys = System::up(UpOptions {
        workers: 1,
        slots: 1,
        demo: false,
        router_args: vec![
            "--parked-request-max=4".into(),
            "--parked-request-budget=25s".into(),
        ],
        ..Default::default()
    });
    for ns in ["flood-a", "flood-b"] {
        apply_text(&sys, &format!("{ns}.yaml"), &with_quota(ns, None));
    }
    // The only slot is taken.
    create_actor(&sys, "flood-a", "holder", "counter");
    get_ok(&sys, "flood-a/holder", "/");
    for name in ["a0", "a1", "a2", "a3"] {
        create_actor(&sys, "flood-a", name, "counter");
    }
    for name in ["b0", "b1"] {
        create_actor(&sys, "flood-b", name, "counter");
    }

    // flood-a alone takes every place, oldest first.
    let mut a = Vec::new();
    for name in ["a0", "a1", "a2", "a3"] {
        a.push((name, call_in_background(&sys, format!("flood-a/{name}"))));
        wait_for("parked", Duration::from_secs(10), || {
            parked(&sys) == a.len() as u64
        });
    }
    // flood-b arrives: it gets half the lot; flood-a's two newest places are shed at once.
    let mut b = Vec::new();
    for name in ["b0", "b1"] {
        b.push((name, call_in_background(&sys, format!("flood-b/{name}"))));
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for("two of flood-a shed", Duration::from_secs(5), || {
        a.iter().filter(|(_, t)| t.is_finished()).count() == 2
    });
    assert_eq!(parked(&sys), 4);
    let (kept, shed): (Vec<_>, Vec<_>) = a.into_iter().partition(|(_, t)| !t.is_finished());
    let shed_names: Vec<&str> = shed.iter().map(|(n, _)| *n).collect();
    assert_eq!(shed_names, ["a2", "a3"], "the newest places go");
    for (name, t) in shed {
        let (status, body, took) = t.join().expect("call thread");
        assert_eq!(status, 503, "{name}: {body}");
        assert!(body.contains("router at capacity"), "{name}: {body}");
        assert!(took < Duration::from_secs(5), "{name} shed after {took:?}");
    }

    // The slot frees: flood-a's oldest waiter is first in every order.
    sys.ate_ok(&["suspend", "actor", "holder", "-a", "flood-a"]);
    let mut waiting: Vec<(&str, Call)> = kept.into_iter().chain(b).collect();
    let first = next_served(&mut waiting);
    assert_eq!(first, "a0");
    // It frees again: flood-b's oldest, though flood-a's a1 has waited longer (first come,
    // first served would give it a1).
    sys.ate_ok(&["suspend", "actor", "a0", "-a", "flood-a"]);
    let second = next_served(&mut waiting);
    assert_eq!(second, "b0", "room goes round the atespaces that wait");
}

/// Waits for one of `waiting` to be answered, takes it out and returns its name; it must have
/// been served (200).
fn next_served(waiting: &mut Vec<(&'static str, Call)>) -> &'static str {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(i) = waiting.iter().position(|(_, t)| t.is_finished()) {
            let (name, t) = waiting.remove(i);
            let (status, body, _) = t.join().expect("call thread");
            assert_eq!(status, 200, "{name}: {body}");
            return name;
        }
        assert!(Instant::now() < deadline, "no waiter served within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}
