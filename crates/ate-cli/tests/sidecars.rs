//! Actors with two containers end to end (real runc + CRIU through `ate up`): the counter calls a
//! sidecar (a second counter) over one kept-alive loopback connection on every request; both
//! counts, and that connection, survive suspend/resume cycles on either worker, node-local and
//! from the durable copy. A sidecar whose probe never answers, or that exits, is named; a port
//! collision is refused at apply; `ate logs -c` shows one container's lines.

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

/// Atespace `ns` and the counter as `main` calling a second counter, `side`, on port 9000 (its
/// own memory count, its files under `/data/side`). `side_probe_port` is where the sidecar's
/// probe looks.
fn two_containers(ns: &str, name: &str, side_probe_port: u16, side_exit: &str) -> String {
    let template = two_counters_template(ns, name, side_probe_port, 3, Some(side_exit));
    format!("{}---\n{template}", atespace_yaml(ns))
}

fn apply_yaml(sys: &System, file: &str, yaml: &str) -> std::process::Output {
    let path = sys.dir.path().join(file);
    std::fs::write(&path, yaml).expect("write template");
    sys.ate(&["apply", "-f", path.to_str().expect("utf-8 path")])
}

/// The counter's answer with a sidecar: its three counts, the sidecar's memory count and how
/// many connections the counter has opened to the sidecar.
fn parse(body: &str) -> (u64, u64, u64, u64, u64) {
    let field = |name: &str| -> u64 {
        body.split('|')
            .find_map(|f| f.trim().strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in {body:?}"))
    };
    (
        field("preserved memory count:"),
        field("preserved file counter:"),
        field("preserved rootfs counter:"),
        field("sidecar memory count:"),
        field("sidecar connection:"),
    )
}

fn system() -> System {
    // No frozen copies: every resume restores the generation.
    System::up_with_env(UpOptions::with_workers(2), &[("ATE_KEEP_FROZEN", "0")])
}

#[test]
fn both_containers_keep_their_state_and_their_connection_across_five_cycles() {
    let sys = system();
    let ns = "ns-side";
    let out = apply_yaml(&sys, "pair.yaml", &two_containers(ns, "pair", 9000, "stop"));
    assert!(out.status.success(), "{out:?}");
    create_actor(&sys, ns, "p", "pair");
    let target = format!("{ns}/p");
    assert_eq!(parse(&get_ok(&sys, &target, "/")), (1, 1, 1, 1, 1));
    let worker_of = |sys: &System| {
        actor(sys, ns, "p")["worker"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut last = worker_of(&sys);
    let mut workers = std::collections::BTreeSet::from([last.clone()]);
    for cycle in 1..=5u64 {
        // Node-local and durable suspends alternate; cycle 3 restores from the durable copy.
        let durable = cycle % 2 == 1;
        let mut args = vec!["suspend", "actor", "p", "-a", ns];
        if durable {
            args.push("--durable");
        }
        sys.ate_ok(&args);
        if cycle == 3 {
            let dir = generation_dir(&sys.state_dir(), ns, "p", cycle);
            std::fs::remove_dir_all(&dir).expect("remove the node-local generation");
        }
        // Every restore goes to the other worker (placement alone would pick either: two
        // random choices between two idle workers).
        let next = if last == "worker-1" {
            "worker-2"
        } else {
            "worker-1"
        };
        let selector = format!("ate.dev/worker={next}");
        sys.ate_ok(&["update", "actor", "p", "-a", ns, "--selector", &selector]);
        let n = cycle + 1;
        let body = get_ok(&sys, &target, "/");
        assert_eq!(
            parse(&body),
            (n, n, n, n, 1),
            "cycle {cycle}: both memory counts continue over the same loopback connection: {body}"
        );
        last = worker_of(&sys);
        assert_eq!(last, next, "cycle {cycle}: restored on the selected worker");
        workers.insert(last.clone());
    }
    assert_eq!(
        workers.len(),
        2,
        "the actor ran on both workers over the cycles: {workers:?}"
    );
    // The generation holds each container's upper dir.
    let gen_dir = generation_dir(&sys.state_dir(), ns, "p", 5);
    let manifest = support::generations::local_manifest(&sys.state_dir(), &gen_dir);
    assert!(
        manifest.contains("containers/side/rootfs.tar"),
        "{manifest}"
    );
    // One container's lines, without the prefix; the other's are left out.
    let side = sys.ate_ok(&["logs", "actor", "p", "-a", ns, "-c", "side"]);
    let main = sys.ate_ok(&["logs", "actor", "p", "-a", ns, "-c", "main"]);
    assert!(side.contains("counted request 6"), "{side}");
    assert!(main.contains("counted request 6"), "{main}");
    assert!(side.contains("listening on 0.0.0.0:9000"), "{side}");
    assert!(
        !side.contains("0.0.0.0:80") && !side.contains('['),
        "{side}"
    );
    assert!(main.contains("listening on 0.0.0.0:80"), "{main}");
    let all = sys.ate_ok(&["logs", "actor", "p", "-a", ns]);
    assert!(all.contains("[side] ") && all.contains("[main] "), "{all}");
}

#[test]
fn a_sidecar_whose_probe_never_answers_crashes_the_actor_naming_it() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ns-side-probe";
    // The sidecar serves 9000; its probe asks 9001.
    let yaml = two_containers(ns, "pair", 9001, "stop").replace(
        "      ports:\n        - containerPort: 9000\n",
        "      ports:\n        - containerPort: 9001\n",
    );
    let out = apply_yaml(&sys, "pair.yaml", &yaml);
    assert!(out.status.success(), "{out:?}");
    create_actor(&sys, ns, "p", "pair");
    let (status, _, body) = get(sys.router_addr, &format!("{ns}/p"), "/");
    assert_ne!(status, 200, "{body}");
    let why = crash_reason(&sys, ns, "p");
    assert!(
        why.contains("container \"side\"") && why.contains("wakeup probe") && why.contains("9001"),
        "{why}"
    );
}

#[test]
fn a_sidecar_that_exits_is_reported_and_ends_the_actor_or_not_as_its_policy_says() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ns-side-exit";
    let out = apply_yaml(&sys, "stop.yaml", &two_containers(ns, "stop", 9000, "stop"));
    assert!(out.status.success(), "{out:?}");
    let out = apply_yaml(
        &sys,
        "ignore.yaml",
        &two_containers(ns, "ignore", 9000, "ignore"),
    );
    assert!(out.status.success(), "{out:?}");
    create_actor(&sys, ns, "s", "stop");
    create_actor(&sys, ns, "i", "ignore");

    // exitPolicy ignore: the exit is logged, the actor keeps serving (without its sidecar).
    let target = format!("{ns}/i");
    assert_eq!(parse(&get_ok(&sys, &target, "/")).0, 1);
    let (status, _, body) = request(sys.router_addr, "POST", &target, "/sidecar-exit?code=4", "");
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let logged = loop {
        let log = sys.ate_ok(&["logs", "actor", "i", "-a", ns]);
        if log.contains("container \"side\" exited with status 4") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        logged.contains(
            "[ate-init] container \"side\" exited with status 4; the actor keeps running"
        ),
        "{logged}"
    );
    let body = get_ok(&sys, &target, "/");
    assert!(
        body.starts_with("preserved memory count: 2") && body.contains("sidecar error"),
        "{body}"
    );
    assert_eq!(state_of(&actor(&sys, ns, "i")), "ACTOR_STATE_RUNNING");

    // exitPolicy stop: the actor ends, its lastError names the container and its status.
    let target = format!("{ns}/s");
    assert_eq!(parse(&get_ok(&sys, &target, "/")).0, 1);
    let (status, _, body) = request(sys.router_addr, "POST", &target, "/sidecar-exit?code=5", "");
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let why = loop {
        let a = actor(&sys, ns, "s");
        let why = a["lastError"].as_str().unwrap_or_default().to_string();
        if why.contains("container \"side\" exited with status 5") || Instant::now() > deadline {
            break why;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        why.contains("container \"side\" exited with status 5; ending the actor"),
        "{why}"
    );
}

#[test]
fn port_collisions_between_containers_are_refused_at_apply_naming_the_field() {
    let sys = System::up(UpOptions::bare(1));
    let ns = "ns-side-ports";
    // The sidecar declares port 80, which the first container declares too.
    let yaml = two_containers(ns, "pair", 9000, "stop").replace(
        "      ports:\n        - containerPort: 9000\n",
        "      ports:\n        - containerPort: 9000\n        - containerPort: 80\n",
    );
    let out = apply_yaml(&sys, "pair.yaml", &yaml);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.containers[1].ports[1].containerPort")
            && err.contains("port 80 is already used by container \"main\""),
        "{err}"
    );
    let out = sys.ate(&["get", "templates", "-a", ns]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(!table.contains("pair"), "nothing was stored: {table}");
}

/// The first file under `dir` whose path ends with `suffix`.
fn find_file(dir: &std::path::Path, suffix: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let kind = entry.file_type().ok()?;
        if kind.is_dir() && !kind.is_symlink() {
            if let Some(found) = find_file(&path, suffix) {
                return Some(found);
            }
        } else if path.to_string_lossy().ends_with(suffix) {
            return Some(path);
        }
    }
    None
}

/// The sidecar's rootfs counter from the counter's answer.
fn sidecar_rootfs(body: &str) -> u64 {
    body.split('|')
        .find_map(|f| {
            f.trim()
                .strip_prefix("sidecar rootfs counter:")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sidecar rootfs counter in {body:?}"))
}

#[test]
fn frozen_copies_golden_tags_and_rootfs_fidelity_work_for_two_containers() {
    // Frozen copies kept (the default): a node-local resume thaws the whole sandbox in place.
    let sys = System::up(UpOptions::with_slots(1, 8));
    let ns = "ns-side-tiers";
    let out = apply_yaml(&sys, "pair.yaml", &two_containers(ns, "pair", 9000, "stop"));
    assert!(out.status.success(), "{out:?}");
    create_actor(&sys, ns, "p", "pair");
    let target = format!("{ns}/p");
    assert_eq!(parse(&get_ok(&sys, &target, "/")), (1, 1, 1, 1, 1));
    // The sidecar mounts the volume where its volumeMounts say: its file is in the volume.
    let side_file = find_file(&sys.state_dir(), "volumes/data/side/counter")
        .expect("the sidecar's counter file in the actor's data volume");
    assert_eq!(std::fs::read_to_string(&side_file).unwrap().trim(), "1");
    sys.ate_ok(&["suspend", "actor", "p", "-a", ns]);
    assert_eq!(parse(&get_ok(&sys, &target, "/")), (2, 2, 2, 2, 1));
    assert!(
        sys.log("worker-1").contains("actor thawed in place"),
        "the resume thawed the frozen sandbox:\n{}",
        sys.log("worker-1")
    );

    // A golden tag of the pair seeds new actors with both containers' memory.
    sys.ate_ok(&["suspend", "actor", "p", "-a", ns, "--durable"]);
    sys.ate_ok(&["create", "tag", "gold", "-a", ns, "--actor", &target]);
    let golden = format!(
        "{}  goldenTag: {ns}/gold\n",
        two_containers(ns, "pair", 9000, "stop")
    );
    let out = apply_yaml(&sys, "golden.yaml", &golden);
    assert!(out.status.success(), "{out:?}");
    create_actor(&sys, ns, "a1", "pair");
    let a1 = format!("{ns}/a1");
    assert_eq!(
        parse(&get_ok(&sys, &a1, "/")),
        (3, 3, 3, 3, 1),
        "a1 starts from p's memory, sidecar included, over p's restored connection"
    );
    let uid = actor(&sys, ns, "a1")["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        get_ok(&sys, &a1, "/whoami").trim(),
        format!("{ns}/a1 {uid}")
    );
    assert_eq!(parse(&get_ok(&sys, &target, "/")).0, 3, "p is untouched");

    // ROOTFS fidelity: processes start afresh, both containers' files carry on.
    let rootfs = two_containers(ns, "pair-rootfs", 9000, "stop").replace(
        "snapshots: {fidelity: memory}",
        "snapshots: {fidelity: rootfs}",
    );
    let out = apply_yaml(&sys, "rootfs.yaml", &rootfs);
    assert!(out.status.success(), "{out:?}");
    create_actor(&sys, ns, "r", "pair-rootfs");
    let r = format!("{ns}/r");
    get_ok(&sys, &r, "/");
    let body = get_ok(&sys, &r, "/");
    assert_eq!((parse(&body), sidecar_rootfs(&body)), ((2, 2, 2, 2, 1), 2));
    sys.ate_ok(&["suspend", "actor", "r", "-a", ns]);
    let body = get_ok(&sys, &r, "/");
    assert_eq!(
        (parse(&body), sidecar_rootfs(&body)),
        ((1, 3, 3, 1, 1), 3),
        "memory starts over, each container's rootfs and the volume carry on: {body}"
    );
}
