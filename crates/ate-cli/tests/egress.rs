//! Egress control end to end: real runc actors whose outbound TCP is redirected (nftables in the
//! actor netns) to the worker's egress proxy, which applies the template's policy.
//!
//! The destination that may be reached is a network namespace this test creates ("test host"):
//! a veth pair with the host side at 10.254.X.1/30 (which thereby becomes a node address) and
//! the test host at 10.254.X.2, where a small Python server holds connections open on two ports.
//! Everything the test creates is removed by a drop guard, also on panic. Traffic only goes to
//! 127.0.0.0/8 and to that namespace.

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use support::test_host::TestHost;
use support::*;

/// The counter template with `egress` (YAML lines under `spec`).
fn template(ns: &str, name: &str, egress: &str) -> String {
    let tpl = actors::Tpl {
        egress: Some(egress.to_string()),
        ..actors::Tpl::counter()
    };
    tpl.yaml(ns, name)
}

fn apply(sys: &System, dir: &Path, ns: &str, name: &str, egress: &str) {
    let path = dir.join(format!("{ns}-{name}.yaml"));
    std::fs::write(&path, template(ns, name, egress)).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
}

/// Both workers' logs, without terminal colour codes.
fn worker_logs(sys: &System) -> String {
    strip_ansi(&format!("{}\n{}", sys.log("worker-1"), sys.log("worker-2")))
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters… final byte in @..~
            if chars.next() == Some('[') {
                for f in chars.by_ref() {
                    if ('@'..='~').contains(&f) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// `/connect?addr=…` from the actor: (status, body).
fn connect(sys: &System, actor: &str, addr: &str) -> (u16, String) {
    let (status, _, body) = get(sys.router_addr, actor, &format!("/connect?addr={addr}"));
    (status, body)
}

fn reached(sys: &System, actor: &str, addr: &str) {
    let (status, body) = connect(sys, actor, addr);
    assert_eq!(
        (status, body.as_str()),
        (200, "ok"),
        "{actor} should reach {addr}\nworker logs:\n{}",
        worker_logs(sys)
    );
}

fn refused(sys: &System, actor: &str, addr: &str) {
    let (status, body) = connect(sys, actor, addr);
    assert_eq!(
        status,
        502,
        "{actor} must not reach {addr}: {body}\nworker logs:\n{}",
        worker_logs(sys)
    );
}

/// A worker log line about `destination` with all of `words`.
fn logged(sys: &System, destination: &str, words: &[&str]) -> bool {
    let dest = format!("destination={destination}");
    worker_logs(sys)
        .lines()
        .any(|l| l.contains("egress") && l.contains(&dest) && words.iter().all(|w| l.contains(w)))
}

#[test]
fn egress_policy_is_enforced_per_template() {
    // Before the system starts, so the workers' first read of the node addresses has 10.254.X.1.
    let host = TestHost::new();
    let sys = System::up(UpOptions::default());
    let ns = "ns-egress";
    let dir = sys.dir.path().to_path_buf();
    // allow-all, but the test host sits in a private range (10.254.X.2): only the port listed
    // is open to the actor.
    apply(
        &sys,
        &dir,
        ns,
        "open",
        &format!(
            "  egress:\n    defaultAction: allow-all\n    allow: [\"{}\"]\n",
            host.peer(0)
        ),
    );
    apply(
        &sys,
        &dir,
        ns,
        "listed",
        &format!(
            "  egress:\n    defaultAction: deny-all\n    allow: [\"{}\"]\n",
            host.peer(0)
        ),
    );
    apply(
        &sys,
        &dir,
        ns,
        "sealed",
        "  egress:\n    defaultAction: deny-all\n",
    );
    for (actor, worker) in [("a", "worker-1"), ("b", "worker-2"), ("c", "worker-1")] {
        let tpl = match actor {
            "a" => "open",
            "b" => "listed",
            _ => "sealed",
        };
        sys.ate_ok(&[
            "create",
            "actor",
            actor,
            "-a",
            ns,
            "-t",
            &format!("{ns}/{tpl}"),
            "--selector",
            &format!("ate.dev/worker={worker}"),
        ]);
    }
    let (a, b, c) = (format!("{ns}/a"), format!("{ns}/b"), format!("{ns}/c"));

    // Host listeners the actors must never reach: a node address (the veth's host side) and
    // loopback.
    let node_listener = TcpListener::bind((host.host_ip, 0)).expect("bind node address");
    let node_addr = node_listener.local_addr().expect("addr").to_string();
    let lo_listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let lo_addr = lo_listener.local_addr().expect("addr").to_string();

    // (a) allow-all: the listed private host:port yes, the same host's other port no (private
    // ranges need an explicit entry); node addresses, link-local and loopback no.
    reached(&sys, &a, &host.peer(0));
    refused(&sys, &a, &host.peer(1));
    refused(&sys, &a, &node_addr);
    refused(&sys, &a, "169.254.169.254:80");
    refused(&sys, &a, &lo_addr);
    // The actor still reaches itself (loopback and its own address are never redirected).
    reached(&sys, &a, "169.254.17.2:8080");

    // (b) deny-all with one allow entry: only that host:port.
    reached(&sys, &b, &host.peer(0));
    refused(&sys, &b, &host.peer(1));
    refused(&sys, &b, &node_addr);
    refused(&sys, &b, "169.254.169.254:80");

    // (c) deny-all, nothing listed: nothing.
    refused(&sys, &c, &host.peer(0));
    refused(&sys, &c, &host.peer(1));
    refused(&sys, &c, &node_addr);
    refused(&sys, &c, &lo_addr);

    for l in [&node_listener, &lo_listener] {
        l.set_nonblocking(true).expect("nonblocking");
        assert!(
            l.accept().is_err(),
            "a host listener got a connection from an actor"
        );
    }

    // The worker logged each decision.
    assert!(
        logged(
            &sys,
            &host.peer(0),
            &["egress allowed", "allow-all, allow entry", &a]
        ),
        "no 'allowed' line for {a}\n{}",
        worker_logs(&sys)
    );
    assert!(
        logged(
            &sys,
            &host.peer(1),
            &["egress denied", "need an explicit allow entry", &a]
        ),
        "no 'denied: private range' line for {a}\n{}",
        worker_logs(&sys)
    );
    assert!(
        logged(&sys, &node_addr, &["egress denied", "node address"]),
        "no 'denied: node address' line\n{}",
        worker_logs(&sys)
    );
    assert!(
        logged(&sys, "169.254.169.254:80", &["egress denied", "link-local"]),
        "no 'denied: link-local' line\n{}",
        worker_logs(&sys)
    );
    assert!(
        logged(&sys, &host.peer(0), &["egress allowed", "allow entry", &b]),
        "no 'allowed by entry' line for {b}\n{}",
        worker_logs(&sys)
    );
    assert!(
        logged(
            &sys,
            &host.peer(1),
            &["egress denied", "no allow entry matches", &b]
        ),
        "no 'denied: not listed' line for {b}\n{}",
        worker_logs(&sys)
    );

    // After a memory suspend and a restore (on whichever worker), the policy holds again.
    sys.ate_ok(&["suspend", "actor", "b", "-a", ns]);
    reached(&sys, &b, &host.peer(0));
    refused(&sys, &b, &host.peer(1));
    refused(&sys, &b, &node_addr);
    assert!(
        worker_logs(&sys).contains("egress proxy off"),
        "no per-actor egress counters logged at suspend\n{}",
        worker_logs(&sys)
    );
}

/// The actor's state through the CLI.
fn actor_state(sys: &System, ns: &str, name: &str) -> String {
    let out = sys.ate_ok(&["get", "actors", name, "-a", ns, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("actor json");
    v[0]["state"].as_str().unwrap_or_default().to_string()
}

#[test]
fn open_outbound_connection_keeps_the_actor_from_idle_suspend() {
    let host = TestHost::new();
    let sys = System::up(UpOptions::default());
    let ns = "ns-egress-idle";
    let dir = sys.dir.path().to_path_buf();
    let path = dir.join("idle.yaml");
    let yaml = template(
        ns,
        "idle",
        &format!(
            "  egress:\n    defaultAction: allow-all\n    allow: [\"{}\"]\n",
            host.peer(0)
        ),
    )
    .replace("idleTimeout: 5m", "idleTimeout: 2s");
    std::fs::write(&path, yaml).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    for name in ["busy", "quiet"] {
        sys.ate_ok(&create_actor_args(name, ns, &format!("{ns}/idle")));
    }
    let busy = format!("{ns}/busy");
    let quiet = format!("{ns}/quiet");
    // busy holds one outbound connection open for 8 s after its answer; quiet does nothing.
    let (status, _, body) = get(
        sys.router_addr,
        &busy,
        &format!("/connect?addr={}&hold=8", host.peer(0)),
    );
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(get(sys.router_addr, &quiet, "/healthz").0, 200);
    let start = Instant::now();
    // quiet is suspended after its 2 s idle timeout (the suspend itself may take a few seconds
    // on a loaded machine); busy is not while its connection is open (8 s).
    let mut quiet_suspended = false;
    while start.elapsed() < Duration::from_secs(7) {
        quiet_suspended =
            quiet_suspended || actor_state(&sys, ns, "quiet") == "ACTOR_STATE_SUSPENDED";
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        actor_state(&sys, ns, "busy"),
        "ACTOR_STATE_RUNNING",
        "an actor with an open outbound connection is not idle"
    );
    while !quiet_suspended {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "quiet was not idle-suspended"
        );
        quiet_suspended = actor_state(&sys, ns, "quiet") == "ACTOR_STATE_SUSPENDED";
        std::thread::sleep(Duration::from_millis(200));
    }
    // Once the connection closes (8 s) and 2 s pass, busy is idle too.
    while actor_state(&sys, ns, "busy") != "ACTOR_STATE_SUSPENDED" {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "busy was not idle-suspended after its connection closed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
