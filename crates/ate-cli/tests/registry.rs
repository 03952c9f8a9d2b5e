//! Registry images end to end: the demo counter pushed to a real registry on loopback (Debian's
//! `docker-registry`, started by the test), a template whose `image` is the registry reference
//! (by tag, then by digest), and the actor answering through the router of a whole `ate up`
//! system; an unknown tag crashes the actor with a message naming the reference.
//!
//! Skipped with a message when `docker-registry` is not installed and `CI` is unset.

mod support;

use std::time::{Duration, Instant};

use ate_test_support::registry as registry_fixture;
use registry_fixture::Registry;
use serde_json::Value;
use support::*;

/// The counter template, its container's image pulled from `image`.
fn template(ns: &str, name: &str, image: &str) -> String {
    let tpl = actors::Tpl {
        image_ref: Some(format!("\"{image}\"")),
        ..actors::Tpl::counter()
    };
    tpl.yaml(ns, name)
}

fn apply_and_create(sys: &System, ns: &str, name: &str, image: &str) {
    let path = sys.dir.path().join(format!("{ns}-{name}.yaml"));
    std::fs::write(&path, template(ns, name, image)).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    actors::create_actor(sys, ns, name, name);
}

fn actor(sys: &System, ns: &str, name: &str) -> Value {
    let json = sys.ate_ok(&["get", "actors", name, "-a", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&json).expect("json");
    v[0].clone()
}

fn get_ok(sys: &System, reg: &Registry, target: &str) -> String {
    let (status, head, body) = get(sys.router_addr, target, "/");
    assert_eq!(
        status,
        200,
        "{target}: {head}\n{body}\nworker log:\n{}\nregistry log:\n{}",
        sys.log("worker-1"),
        reg.log()
    );
    body
}

#[test]
fn a_template_with_a_registry_image_runs_and_answers() {
    if !registry_fixture::available("a_template_with_a_registry_image_runs_and_answers") {
        return;
    }
    let mut reg = Registry::start();
    let digest = reg.push_layout(&images_dir().join("counter"), "demo/counter", "v1");
    let host = reg.host();
    let sys = System::up_with_env(
        UpOptions::bare(1),
        &[("ATE_INSECURE_REGISTRIES", host.as_str())],
    );
    let ns = "ns-registry";

    // By tag: pulled, verified, unpacked, run; the worker logs the resolved digest.
    let by_tag = format!("{host}/demo/counter:v1");
    apply_and_create(&sys, ns, "counter", &by_tag);
    let body = get_ok(&sys, &reg, &format!("{ns}/counter"));
    assert!(body.contains("preserved memory count: 1"), "{body}");
    let body = get_ok(&sys, &reg, &format!("{ns}/counter"));
    assert!(body.contains("preserved memory count: 2"), "{body}");
    let log = sys.log("worker-1");
    assert!(
        log.lines()
            .any(|l| l.contains("image reference resolved") && l.contains(&digest)),
        "no resolved digest in the worker log:\n{log}"
    );

    // By digest: the same cache entry, another template.
    apply_and_create(&sys, ns, "pinned", &format!("{host}/demo/counter@{digest}"));
    let body = get_ok(&sys, &reg, &format!("{ns}/pinned"));
    assert!(body.contains("preserved memory count: 1"), "{body}");
    let cache = sys.state_dir().join("images-cache");
    assert!(
        cache
            .join(digest.trim_start_matches("sha256:"))
            .join("rootfs/counter")
            .is_file(),
        "not in the node cache {}",
        cache.display()
    );

    // An unknown tag: the start fails, the actor is CRASHED, and lastError names the reference.
    let missing = format!("{host}/demo/counter:nope");
    apply_and_create(&sys, ns, "missing", &missing);
    let (status, head, body) = get(sys.router_addr, &format!("{ns}/missing"), "/");
    assert_ne!(status, 200, "{head}\n{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let a = loop {
        let a = actor(&sys, ns, "missing");
        if a["state"] == "ACTOR_STATE_CRASHED" || Instant::now() > deadline {
            break a;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(a["state"], "ACTOR_STATE_CRASHED", "{a}");
    let why = a["lastError"].as_str().unwrap_or_default();
    eprintln!("lastError: {why}");
    assert!(
        why.contains(&missing) && why.contains("not found"),
        "lastError: {why}"
    );

    // The registry gone: a new actor of the by-tag template still starts, because the tag's
    // digest is recorded on this node and its rootfs is in the cache (no registry request).
    reg.stop();
    sys.ate_ok(&create_actor_args("again", ns, &format!("{ns}/counter")));
    let body = get_ok(&sys, &reg, &format!("{ns}/again"));
    assert!(body.contains("preserved memory count: 1"), "{body}");
}
