//! Deleting an actor leaves nothing of it behind on the node: its generations (local files),
//! its log, and the actor can be created again under the same name with a fresh log.

mod support;

use std::time::{Duration, Instant};

use support::*;

fn log_file(sys: &System, ns: &str, name: &str) -> std::path::PathBuf {
    sys.state_dir()
        .join("logs")
        .join("actors")
        .join(ns)
        .join(format!("{name}.log"))
}

/// One worker and a demo counter `name` that answered once: the system and the actor's target.
fn one_counter_that_answered(name: &str) -> (System, String) {
    let sys = System::up(UpOptions::with_workers(1));
    sys.ate_ok(&[
        "create",
        "actor",
        name,
        "-a",
        "ate-demo",
        "-t",
        "ate-demo/counter",
    ]);
    let target = format!("ate-demo/{name}");
    let (status, _, body) = get(sys.router_addr, &target, "/");
    assert_eq!(status, 200, "{body}");
    (sys, target)
}

#[test]
fn deleting_an_actor_removes_its_log_and_generations() {
    let (ns, name) = ("ate-demo", "gone");
    let (sys, target) = one_counter_that_answered(name);
    sys.ate_ok(&["suspend", "actor", name, "-a", ns]);
    let snapshots = sys.state_dir().join("snapshots").join(ns).join(name);
    let generations = || {
        std::fs::read_dir(&snapshots)
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    assert!(generations() > 0, "the suspend wrote a generation");
    // The counter writes a line at start: the log exists (the relay may lag a moment).
    let start = Instant::now();
    while !log_file(&sys, ns, name).exists() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(log_file(&sys, ns, name).exists(), "the actor wrote a log");

    sys.ate_ok(&["delete", "actor", name, "-a", ns]);
    assert_eq!(
        generations(),
        0,
        "generations left in {}",
        snapshots.display()
    );
    assert!(
        !log_file(&sys, ns, name).exists(),
        "the log of a deleted actor stays"
    );
    // `ate logs` of the deleted actor: the actor is gone.
    let out = sys.ate(&["logs", "actor", name, "-a", ns]);
    assert!(!out.status.success());

    // The same name again starts from nothing.
    sys.ate_ok(&["create", "actor", name, "-a", ns, "-t", "ate-demo/counter"]);
    let (status, _, body) = get(sys.router_addr, &target, "/");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("preserved memory count: 1 |"),
        "a re-created actor starts fresh: {body}"
    );
}

#[test]
fn a_running_actor_is_deleted_only_with_force() {
    let (ns, name) = ("ate-demo", "busy");
    let (sys, target) = one_counter_that_answered(name);

    let refused = sys.ate(&["delete", "actor", name, "-a", ns]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--force"), "the refusal names --force: {err}");

    let out = sys.ate_ok(&["delete", "actor", name, "-a", ns, "--force"]);
    assert!(
        out.contains("stopped without a snapshot"),
        "the forced delete says what it did: {out}"
    );
    let list = sys.ate_ok(&["get", "actors", "-a", ns, "-o", "json"]);
    assert!(!list.contains(&format!("\"{name}\"")), "{list}");
    // Its sandbox is gone: the same name starts fresh on the same worker.
    sys.ate_ok(&["create", "actor", name, "-a", ns, "-t", "ate-demo/counter"]);
    let (status, _, body) = get(sys.router_addr, &target, "/");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("preserved memory count: 1 |"), "{body}");
}
