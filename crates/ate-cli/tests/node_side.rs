//! Node-side acceptance tests: the whole system (real api, node agent, runc + CRIU workers,
//! router) driven through the CLI and the router, one system per test, each in its own atespace.
//!
//! Covered: durable restore from S3 (moto), ROOTFS / VOLUMES fidelity, golden tags and identity
//! rewriting, failure paths (probe never answers, CRIU dump fails, worker killed mid-restore,
//! corrupted snapshot, durable store full), exit detection, network isolation and atunnel's
//! refusals, cleanup after shutdown; plus suspend / resume timings (printed, not asserted).
//!
//! One file of tests only (its helpers are in `support/`): they share one harness and run as one
//! binary (`--test node_side`), and each section is a few long scenarios.

mod support;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ate_test_support::block_on;
use ate_test_support::fs::walk;
use ate_test_support::http::healthz;
use ate_test_support::services::create_s3_bucket as create_bucket;
use serde_json::Value;
use support::actors::*;
use support::atunnel::*;
use support::generations::*;
use support::manual::*;
use support::runc::*;
use support::*;

// ---------------------------------------------------------------------------------------------
// 1. durable restore

#[test]
fn durable_restore_from_s3_after_local_copy_is_gone() {
    let endpoint = std::env::var("ATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "ATE_TEST_S3_ENDPOINT is not set: start moto with `eval \"$(scripts/test-services.sh)\"` \
             (it also sets the AWS_* credentials) and run the test again"
        )
    });
    assert!(
        std::env::var("AWS_ACCESS_KEY_ID").is_ok(),
        "AWS_ACCESS_KEY_ID is not set (scripts/test-services.sh exports it)"
    );
    let bucket = format!("ate-node-side-{}", std::process::id());
    create_bucket(&endpoint, &bucket);
    let sys = System::up_with_env(
        UpOptions {
            workers: 1,
            durable_store: Some(format!("s3://{bucket}/gens")),
            ..Default::default()
        },
        &[("AWS_ENDPOINT_URL", &endpoint), ("AWS_ALLOW_HTTP", "true")],
    );
    let ns = "ns-durable";
    counter_actor(&sys, ns, "counter", "c");
    let target = format!("{ns}/c");
    for n in 1..=3 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
    }
    let t = Instant::now();
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    eprintln!(
        "[timing] counter suspend --durable to S3: {} ms",
        ms(t.elapsed())
    );
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED");
    assert!(a.get("lastError").is_none(), "durable suspend reported {a}");

    // The node-local copy disappears (as on a node that lost its disk): only S3 has it.
    let gen_dir = generation_dir(&sys.state_dir(), ns, "c", 1);
    std::fs::remove_dir_all(&gen_dir).expect("remove local generation");
    let t = Instant::now();
    let body = get_ok(&sys, &target, "/");
    eprintln!(
        "[timing] counter resume from S3 to first response: {} ms",
        ms(t.elapsed())
    );
    assert_eq!(
        counts(&body),
        (4, 4, 4),
        "memory, files and rootfs continue from S3"
    );
    // A lazy restore's download (plaintext: the page source reads it) is kept on a tmpfs when
    // snapshots are encrypted (`ate up`'s default), not in the state dir's snapshot-cache.
    let cache = sys.state_dir().join("snapshot-cache");
    let cached = std::fs::read_dir(&cache).map(|d| d.count()).unwrap_or(0);
    assert_eq!(cached, 0, "nothing plaintext in {}", cache.display());
    let node_log = sys.log("node");
    assert!(
        node_log.contains("generation fetched for a lazy restore"),
        "the durable copy was downloaded:\n{node_log}"
    );
    assert!(
        !gen_dir.exists(),
        "the restore did not recreate the local dir"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. fidelities

#[test]
fn rootfs_and_volumes_fidelity_keep_what_they_promise() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ns-fidelity";
    sys_apply(
        &sys,
        ns,
        "rootfs",
        &Tpl {
            fidelity: "rootfs",
            ..Tpl::counter()
        },
    );
    sys_apply(
        &sys,
        ns,
        "volumes",
        &Tpl {
            fidelity: "volumes",
            ..Tpl::counter()
        },
    );
    create_actor(&sys, ns, "r", "rootfs");
    create_actor(&sys, ns, "v", "volumes");
    for name in ["r", "v"] {
        let target = format!("{ns}/{name}");
        for n in 1..=2 {
            assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
        }
    }
    for cycle in 0..2u64 {
        sys.ate_ok(&["suspend", "actor", "r", "-a", ns]);
        sys.ate_ok(&["suspend", "actor", "v", "-a", ns]);
        // ROOTFS: a fresh process, but the rootfs upper dir and the volume come back.
        let n = 3 + cycle;
        assert_eq!(
            counts(&get_ok(&sys, &format!("{ns}/r"), "/")),
            (1, n, n),
            "rootfs cycle {cycle}"
        );
        // VOLUMES: a fresh process and a fresh rootfs; only the volume comes back.
        assert_eq!(
            counts(&get_ok(&sys, &format!("{ns}/v"), "/")),
            (1, n, 1),
            "volumes cycle {cycle}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. golden tags

#[test]
fn golden_tag_seeds_new_actors_with_their_own_identity() {
    let sys = System::up(UpOptions::with_slots(1, 8));
    let ns = "ns-golden";
    counter_actor(&sys, ns, "agent", "g");
    for n in 1..=3 {
        assert_eq!(counts(&get_ok(&sys, &format!("{ns}/g"), "/")), (n, n, n));
    }
    let g_uid = actor(&sys, ns, "g")["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(get_ok(&sys, &format!("{ns}/g"), "/whoami").starts_with(&format!("{ns}/g {g_uid}")));
    sys.ate_ok(&["suspend", "actor", "g", "-a", ns, "--durable"]);
    sys.ate_ok(&[
        "create",
        "tag",
        "gold",
        "-a",
        ns,
        "--actor",
        &format!("{ns}/g"),
    ]);
    let tags = sys.ate_ok(&["get", "tags", "-a", ns, "-o", "json"]);
    assert!(
        tags.contains("\"gold\"") && tags.contains(&format!("{ns}/g")),
        "{tags}"
    );

    // The same template now names the tag: new actors start from g's memory, as themselves.
    let golden = Tpl {
        golden_tag: Some(format!("{ns}/gold")),
        ..Tpl::counter()
    };
    sys_apply(&sys, ns, "agent", &golden);
    // A second template with the tag: captured under another template → VOLUMES fidelity.
    sys_apply(&sys, ns, "agent2", &golden);
    for (name, template, expect) in [
        ("a1", "agent", (4, 4, 4)),
        ("a2", "agent", (4, 4, 4)),
        ("b1", "agent2", (1, 4, 1)),
        ("b2", "agent2", (1, 4, 1)),
    ] {
        create_actor(&sys, ns, name, template);
        let target = format!("{ns}/{name}");
        let who = get_ok(&sys, &target, "/whoami");
        let uid = actor(&sys, ns, name)["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(!uid.is_empty() && uid != g_uid, "{name} has its own uid");
        assert_eq!(
            who.trim(),
            format!("{ns}/{name} {uid}"),
            "{name} answers as itself, not as g"
        );
        assert_eq!(
            counts(&get_ok(&sys, &target, "/")),
            expect,
            "{name} seeded from the tag"
        );
    }
    // The golden actor is untouched by its borrowers.
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/g"), "/")), (4, 4, 4));
}

// ---------------------------------------------------------------------------------------------
// 4. failure paths

#[test]
fn probe_never_answering_crashes_then_revert_and_fixed_template_resume() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ns-probe";
    let broken = probe_on_closed_port(2);
    sys_apply(&sys, ns, "counter", &broken);
    create_actor(&sys, ns, "c", "counter");
    let t = Instant::now();
    let (status, head, body) = get(sys.router_addr, &format!("{ns}/c"), "/");
    let took = t.elapsed();
    assert_eq!(
        status,
        503,
        "{head}\n{body}\nrouter:\n{}\napi:\n{}\nworker:\n{}",
        sys.log("router"),
        sys.log("api"),
        sys.log("worker-1")
    );
    assert!(
        took < Duration::from_secs(6),
        "503 after {took:?}: the crash must not be parked"
    );
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_CRASHED", "{a}");
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("wakeup probe") && why.contains("9999"),
        "lastError: {why}"
    );
    // Capacity is not held by a crashed actor, and no sandbox is left behind.
    let workers: Value =
        serde_json::from_str(&sys.ate_ok(&["get", "workers", "-o", "json"])).expect("json");
    assert_eq!(workers[0]["slotsUsed"], 0, "{workers}");
    assert!(
        containers(&sys.state_dir())
            .iter()
            .all(|(id, _)| !ids_of(&sys.state_dir(), ns, "c").contains(id)),
        "the failed sandbox was removed"
    );
    // Requests keep failing fast until an operator reverts.
    assert_eq!(get(sys.router_addr, &format!("{ns}/c"), "/").0, 503);
    sys.ate_ok(&["revert", "actor", "c", "-a", ns]);
    assert_eq!(state_of(&actor(&sys, ns, "c")), "ACTOR_STATE_SUSPENDED");
    sys_apply(&sys, ns, "counter", &Tpl::counter());
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/c"), "/")), (1, 1, 1));
    assert_eq!(state_of(&actor(&sys, ns, "c")), "ACTOR_STATE_RUNNING");
}

#[test]
fn a_failed_memory_dump_fails_the_suspend_unless_the_template_allows_rootfs() {
    let sys = System::up_with_env(
        UpOptions::with_workers(1),
        &[("ATE_FAULT_CRIU_DUMP", "fail")],
    );
    let ns = "ns-criufail";
    counter_actor(&sys, ns, "counter", "c");
    for n in 1..=2 {
        assert_eq!(counts(&get_ok(&sys, &format!("{ns}/c"), "/")), (n, n, n));
    }
    // By default a memory suspend that cannot dump memory fails, visibly, and the actor runs on
    // with its memory: never a quiet ROOTFS generation.
    let out = sys.ate(&["suspend", "actor", "c", "-a", ns]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the suspend must fail: {stderr}");
    assert!(
        stderr.contains("memory dump failed") && stderr.contains("runs on"),
        "{stderr}"
    );
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING");
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(why.contains("memory dump failed"), "lastError: {a}");
    let written = std::fs::read_dir(sys.state_dir().join("snapshots").join(ns).join("c"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(written, 0, "no generation written");
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/c"), "/")), (3, 3, 3));
    assert_eq!(
        sys.worker_metric("ate_worker_memory_dump_failures_total{outcome=\"suspend_failed\"}"),
        1
    );

    // A template that opts in gets a ROOTFS generation, which says so.
    let fallback = Tpl {
        on_memory_failure: Some("rootfs"),
        ..Tpl::counter()
    };
    sys_apply(&sys, ns, "counter", &fallback);
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED");
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("memory dump failed") && why.contains("FIDELITY_ROOTFS"),
        "reason: {a}"
    );
    let manifest = support::generations::local_manifest(
        &sys.state_dir(),
        &generation_dir(&sys.state_dir(), ns, "c", 1),
    );
    assert!(
        manifest.contains("FIDELITY_ROOTFS") || manifest.contains("rootfs"),
        "{manifest}"
    );
    assert!(
        sys.log("worker-1").contains("falling back to ROOTFS"),
        "the worker log says so"
    );
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/c"), "/")), (1, 4, 4));
}

#[test]
fn corrupted_snapshot_is_refused_with_a_checksum_error() {
    // No frozen copy: a resume must restore (and so verify) the generation on disk. No durable
    // copy either (a read-only store): a COMPLETED one would replace the damaged local copy.
    let store = TmpfsStore::mount(true);
    let sys = one_worker_restoring(Some(store.url()));
    let ns = "ns-corrupt";
    counter_actor(&sys, ns, "counter", "c");
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/c"), "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    let gen_dir = generation_dir(&sys.state_dir(), ns, "c", 1);
    // Flip one byte in the middle of the largest file (a CRIU pages image or the rootfs tar).
    let mut files = Vec::new();
    let mut stack = vec![gen_dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read gen dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "manifest.json") {
                files.push((e.metadata().map(|m| m.len()).unwrap_or(0), p));
            }
        }
    }
    files.sort();
    let (len, victim) = files.pop().expect("a file to corrupt");
    let mut bytes = std::fs::read(&victim).expect("read");
    bytes[(len / 2) as usize] ^= 0x40;
    std::fs::write(&victim, bytes).expect("write");

    let (status, head, body) = get(sys.router_addr, &format!("{ns}/c"), "/");
    assert_ne!(
        status, 200,
        "a corrupted generation must never restore: {head}\n{body}"
    );
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_CRASHED", "{a}");
    let why = a["lastError"].as_str().unwrap_or_default().to_lowercase();
    assert!(
        why.contains("checksum") || why.contains("sha256") || why.contains("fails authentication"),
        "lastError: {why}"
    );
    assert!(
        containers(&sys.state_dir()).is_empty(),
        "no sandbox was started from it"
    );
}

#[test]
fn durable_store_full_keeps_the_local_copy() {
    // A 1 MiB tmpfs as the durable store; a few MiB of random memory cannot fit.
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("tiny-store");
    std::fs::create_dir_all(&store).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&store)
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    // Declared before the system: dropped (unmounted) after it stopped.
    let _unmount = Unmount(store.clone());
    let sys = System::up(UpOptions {
        workers: 1,
        durable_store: Some(format!("file://{}", store.display())),
        ..Default::default()
    });
    let ns = "ns-diskfull";
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(8));
    create_actor(&sys, ns, "s", "sleeper");
    let before = get_ok(&sys, &format!("{ns}/s"), "/");
    assert!(before.starts_with("sleeper holding 8 MiB"), "{before}");
    let out = sys.ate(&["suspend", "actor", "s", "-a", ns, "--durable"]);
    eprintln!(
        "suspend --durable on a full store: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let a = actor(&sys, ns, "s");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "{a}");
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(why.contains("durable upload failed"), "lastError: {a}");
    let gen_dir = generation_dir(&sys.state_dir(), ns, "s", 1);
    assert!(
        gen_dir.join("manifest.json").exists(),
        "the local copy is kept"
    );
    // Nothing half-written is left to be mistaken for a generation.
    let left: Vec<_> = walk(&store);
    assert!(
        left.iter().all(|p| !p.ends_with("manifest.json")),
        "{left:?}"
    );
    // The local copy restores, memory included.
    assert_eq!(
        get_ok(&sys, &format!("{ns}/s"), "/"),
        before,
        "memory restored from the local copy"
    );
}

/// Two api replicas on one PostgreSQL; the one node and router talk to is killed and not
/// restarted. Both fail over to the other (`--api a,b`): the worker stays ACTIVE well past the
/// lease (its heartbeats go to the survivor), the running actor keeps its memory, and a cold
/// resume goes through the survivor.
#[test]
fn a_lost_api_replica_is_failed_over() {
    let mut m = Manual::up_with(Some(fresh_postgres()), 2);
    let ns = "ns-replicas";
    apply(
        &|a: &[&str]| m.ate_ok(a),
        m.dir.path(),
        ns,
        "counter",
        &Tpl::counter(),
    );
    m.ate_ok(&create_actor_args("c", ns, &format!("{ns}/counter")));
    let target = format!("{ns}/c");
    for n in 1..=2 {
        let (status, _, body) = get(m.router, &target, "/");
        assert_eq!(status, 200, "{body}\n{}", m.log("node"));
        assert_eq!(counts(&body), (n, n, n));
    }
    let first = m
        .children
        .iter_mut()
        .find(|(n, _)| n == "api")
        .map(|(_, c)| c)
        .expect("api");
    first.kill().expect("SIGKILL api");
    let _ = first.wait();
    let survivor = m.api.split(',').nth(1).expect("second replica").to_string();
    m.api = survivor;
    // Longer than the lease plus its margin (12 s): only heartbeats through the survivor keep
    // the worker.
    let start = Instant::now();
    let mut n = 2;
    while start.elapsed() < Duration::from_secs(15) {
        n += 1;
        let (status, _, body) = get(m.router, &target, "/");
        assert_eq!(status, 200, "{body}\nrouter:\n{}", m.log("router"));
        assert_eq!(counts(&body), (n, n, n));
        std::thread::sleep(Duration::from_millis(500));
    }
    let workers: Value =
        serde_json::from_str(&m.ate_ok(&["get", "workers", "-o", "json"])).expect("json");
    assert_eq!(
        workers[0]["status"],
        "ACTIVE",
        "{workers}\nnode:\n{}",
        m.log("node")
    );
    // A suspend and a cold resume, both through the surviving replica.
    m.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    n += 1;
    let (status, _, body) = get(m.router, &target, "/");
    assert_eq!(status, 200, "{body}\nrouter:\n{}", m.log("router"));
    assert_eq!(counts(&body), (n, n, n), "nothing lost");
}

/// The one fault with a rollback: a whole node lost (agent, worker, sandboxes and disk). Its
/// actors resume on the other node from their newest durable generation, with no operator
/// action: what changed since that generation is lost (docs/reliability.md, "Recovery point").
#[test]
fn a_lost_node_rolls_actors_back_to_their_durable_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let second = 1 + (std::process::id() % 200) as u8;
    let mut m = Manual {
        api: String::new(),
        router: SocketAddr::from(([127, 0, 0, 1], free_port())),
        worker_listen: SocketAddr::new(Ipv4Addr::new(127, second, 253, 2).into(), free_port()),
        children: Vec::new(),
        dir,
    };
    let s = |x: &str| x.to_string();
    let root = m.dir.path().to_path_buf();
    let durable = format!("file://{}", root.join("durable").display());
    // A short lease, so the lost node's workers expire within seconds.
    let store = format!("sqlite://{}", root.join("ate.db").display());
    m.api = m.spawn_api("api", &store, &["--heartbeat-timeout-seconds", "3"]);
    let start_node = |m: &mut Manual, node: &str, ip: Ipv4Addr| {
        let state = root.join(node);
        std::fs::create_dir_all(&state).expect("state");
        let ready = root.join(format!("{node}.json"));
        m.spawn(
            node,
            &[
                s("node"),
                s("--name"),
                s(node),
                s("--listen"),
                format!("127.0.0.1:{}", free_port()),
                s("--api"),
                m.api.clone(),
                s("--state-dir"),
                state.display().to_string(),
                s("--durable-store"),
                durable.clone(),
                s("--ready-file"),
                ready.display().to_string(),
            ],
        );
        m.wait_file(&ready);
        let worker = format!("{node}-w");
        m.spawn(
            &worker,
            &[
                s("worker"),
                s("--id"),
                worker.clone(),
                s("--state-dir"),
                state.display().to_string(),
                s("--listen"),
                SocketAddr::new(ip.into(), free_port()).to_string(),
                s("--slots"),
                s("4"),
            ],
        );
    };
    let active = |m: &Manual| -> usize {
        let v: Value =
            serde_json::from_str(&m.ate_ok(&["get", "workers", "-o", "json"])).unwrap_or_default();
        v.as_array()
            .map(|ws| ws.iter().filter(|w| w["status"] == "ACTIVE").count())
            .unwrap_or(0)
    };
    let wait_active = |m: &Manual, n: usize| {
        let start = Instant::now();
        while active(m) != n {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{n} workers not ACTIVE"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Node A alone first, so every actor is placed there.
    start_node(&mut m, "node-a", Ipv4Addr::new(127, second, 253, 10));
    wait_active(&m, 1);
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    m.spawn_router(metrics);
    let start = Instant::now();
    while !healthz(metrics) {
        assert!(start.elapsed() < Duration::from_secs(30), "router not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ns = "ns-nodeloss";
    apply(
        &|a: &[&str]| m.ate_ok(a),
        m.dir.path(),
        ns,
        "counter",
        &Tpl::counter(),
    );
    for name in ["d", "r"] {
        m.ate_ok(&create_actor_args(name, ns, &format!("{ns}/counter")));
    }
    let count = |m: &Manual, name: &str| -> u64 {
        let (status, _, body) = get(m.router, &format!("{ns}/{name}"), "/");
        assert_eq!(status, 200, "{body}\nnode-b:\n{}", m.log("node-b"));
        counts(&body).0
    };
    // d: three requests, a DURABLE suspend (its recovery point), then one more request.
    for n in 1..=3 {
        assert_eq!(count(&m, "d"), n);
    }
    m.ate_ok(&["suspend", "actor", "d", "-a", ns, "--durable"]);
    assert_eq!(count(&m, "d"), 4);
    // r: running, never suspended: its recovery point is nothing.
    for n in 1..=2 {
        assert_eq!(count(&m, "r"), n);
    }
    start_node(&mut m, "node-b", Ipv4Addr::new(127, second, 253, 20));
    wait_active(&m, 2);

    // Node A is lost: agent, worker, sandboxes and its disk.
    for name in ["node-a-w", "node-a"] {
        let i = m
            .children
            .iter()
            .position(|(n, _)| n == name)
            .expect("child");
        let (_, mut child) = m.children.remove(i);
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }
    remove_leftover_sandboxes(&root.join("node-a"));
    std::fs::remove_dir_all(root.join("node-a")).expect("lose node-a's disk");

    // Requests keep coming; within the lease plus a few parking budgets both actors answer from
    // node B, rolled back to their recovery points.
    let start = Instant::now();
    let mut answers = Vec::new();
    for name in ["d", "r"] {
        loop {
            let (status, _, body) = get(m.router, &format!("{ns}/{name}"), "/");
            if status == 200 {
                answers.push((name, counts(&body).0, start.elapsed()));
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(40),
                "{name} not back: {status} {body}\napi:\n{}",
                m.log("api")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    eprintln!("after the node loss: {answers:?}");
    assert_eq!(
        answers[0].1, 4,
        "d resumes from its durable generation (count 3), +1"
    );
    assert_eq!(answers[1].1, 1, "r had no durable generation: a cold boot");
    for name in ["d", "r"] {
        let a = actor_json(&|a: &[&str]| m.ate_ok(a), ns, name);
        assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
        assert_eq!(a["worker"], "node-b-w", "{a}");
    }
    remove_leftover_sandboxes(&root.join("node-b"));
}

/// A worker killed with SIGKILL leaves its sandboxes running; its next process re-adopts them
/// with their memory: one that was serving, and one frozen by a checkpoint that never finished
/// (thawed, it runs on). The actors' stdout keeps flowing into their logs while no worker runs.
#[test]
fn a_killed_worker_readopts_its_sandboxes() {
    let mut m = Manual::up();
    let ns = "ns-adopt";
    apply(
        &|a: &[&str]| m.ate_ok(a),
        m.dir.path(),
        ns,
        "counter",
        &Tpl::counter(),
    );
    for name in ["r", "f"] {
        m.ate_ok(&create_actor_args(name, ns, &format!("{ns}/counter")));
        for n in 1..=2 {
            let (status, _, body) = get(m.router, &format!("{ns}/{name}"), "/");
            assert_eq!(status, 200, "{body}\n{}", m.log("node"));
            assert_eq!(counts(&body), (n, n, n));
        }
    }
    // A checkpoint froze "f", then the worker died.
    let f = ate_worker::ActorSandbox::new(
        ns,
        "f",
        "",
        m.state().join("workers/worker-1/actors").join(ns).join("f"),
    );
    let paused = Command::new("runc")
        .arg("--root")
        .arg(m.state().join("workers/worker-1/runc"))
        .args(["pause", &f.container_id()])
        .status()
        .expect("runc pause");
    assert!(paused.success());
    let old_epoch = m.worker_epoch().expect("epoch");
    m.kill_worker();
    assert_eq!(
        containers(&m.state()).len(),
        2,
        "sandboxes outlive their worker"
    );
    m.start_worker();
    let start = Instant::now();
    while m.worker_epoch().is_none_or(|e| e == old_epoch) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "worker not re-registered:\n{}",
            m.log("node")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for name in ["r", "f"] {
        let target = format!("{ns}/{name}");
        let (status, _, body) = get(m.router, &target, "/");
        assert_eq!(
            status,
            200,
            "{body}\nworker:\n{}\nnode:\n{}",
            m.log("worker-1"),
            m.log("node")
        );
        assert_eq!(counts(&body), (3, 3, 3), "{target} kept its memory");
        let a = actor_json(&|a: &[&str]| m.ate_ok(a), ns, name);
        assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
        let log = std::fs::read_to_string(
            m.state()
                .join("logs/actors")
                .join(ns)
                .join(format!("{name}.log")),
        )
        .unwrap_or_default();
        assert!(
            log.contains("counted request 3"),
            "the actor's stdout after the worker's death reached its log:\n{log}"
        );
    }
    assert_eq!(containers(&m.state()).len(), 2, "no copy was added or lost");
}

/// The same for an actor with a sidecar (its sandbox's PID 1 is ate-init): after the worker's
/// SIGKILL and restart, both containers answer with their memory over the same connection.
#[test]
fn a_killed_worker_readopts_a_two_container_actor() {
    let mut m = Manual::up();
    let ns = "ns-adopt-pair";
    let images = images_dir();
    let yaml = format!(
        "apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {{name: {ns}}}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {{namespace: {ns}, name: pair}}
spec:
  containers:
    - name: main
      image: oci-layout:{images}/counter:latest
      command: [\"/counter\"]
      env: [{{name: SIDECAR_ADDR, value: \"127.0.0.1:9000\"}}, {{name: PORT2, value: \"off\"}}]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 80}}, timeoutSeconds: 10}}
    - name: side
      image: oci-layout:{images}/counter:latest
      command: [\"/counter\"]
      env: [{{name: PORT, value: \"9000\"}}, {{name: PORT2, value: \"off\"}}, {{name: ATE_DATA_DIR, value: /data/side}}]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 9000}}, timeoutSeconds: 10}}
  resources: {{cpu: 250m, memory: 128Mi}}
  volumes: [{{name: data, mountPath: /data}}]
  snapshots: {{fidelity: memory}}
",
        images = images.display()
    );
    let path = m.dir.path().join("pair.yaml");
    std::fs::write(&path, yaml).expect("write template");
    m.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    m.ate_ok(&create_actor_args("p", ns, &format!("{ns}/pair")));
    let target = format!("{ns}/p");
    let answer = |m: &Manual| {
        let (status, _, body) = get(m.router, &target, "/");
        assert_eq!(status, 200, "{body}\n{}", m.log("worker-1"));
        body
    };
    let first = answer(&m);
    assert!(
        first.contains("sidecar memory count: 1 |") && first.ends_with("sidecar connection: 1"),
        "{first}"
    );
    let old_epoch = m.worker_epoch().expect("epoch");
    m.kill_worker();
    assert_eq!(
        containers(&m.state()).len(),
        1,
        "the sandbox outlives its worker"
    );
    m.start_worker();
    let start = Instant::now();
    while m.worker_epoch().is_none_or(|e| e == old_epoch) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "worker not re-registered:\n{}",
            m.log("node")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let body = answer(&m);
    assert!(
        body.starts_with("preserved memory count: 2 |")
            && body.contains("sidecar memory count: 2 |")
            && body.ends_with("sidecar connection: 1"),
        "both containers kept their memory and their connection: {body}"
    );
    assert_eq!(containers(&m.state()).len(), 1, "no copy was added or lost");
}

#[test]
fn worker_killed_mid_restore_then_restarted_resumes() {
    let mut m = Manual::up();
    let ns = "ns-workerkill";
    apply(
        &|a: &[&str]| m.ate_ok(a),
        m.dir.path(),
        ns,
        "counter",
        &Tpl::counter(),
    );
    m.ate_ok(&create_actor_args("c", ns, &format!("{ns}/counter")));
    let target = format!("{ns}/c");
    for n in 1..=2 {
        let (status, _, body) = get(m.router, &target, "/");
        assert_eq!(status, 200, "{body}\n{}", m.log("node"));
        assert_eq!(counts(&body), (n, n, n));
    }
    m.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    // A probe that waits 20 s keeps the restore in progress while the worker dies.
    let slow = probe_on_closed_port(20);
    apply(
        &|a: &[&str]| m.ate_ok(a),
        m.dir.path(),
        ns,
        "counter",
        &slow,
    );
    let api = m.api.clone();
    let resume = std::thread::spawn(move || {
        Command::new(ATE)
            .args(["--api", &api, "resume", "actor", "c", "-a", "ns-workerkill"])
            .output()
            .expect("ate")
    });
    let start = Instant::now();
    while !m.log("worker-1").contains("wakeup probe") && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let state = state_of(&actor_json(&|a: &[&str]| m.ate_ok(a), ns, "c"));
    assert_eq!(state, "ACTOR_STATE_RESUMING");
    let old_epoch = m.worker_epoch().expect("epoch");
    m.kill_worker();
    let out = resume.join().expect("resume thread");
    assert!(
        !out.status.success(),
        "the resume cannot succeed on a killed worker"
    );
    eprintln!(
        "resume during the kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = actor_json(&|a: &[&str]| m.ate_ok(a), ns, "c");
    // The node answered (its worker could not be reached): nothing of this resume runs, so the
    // actor is released (no slot held while nobody asks again), the reason in lastError.
    assert_eq!(
        state_of(&a),
        "ACTOR_STATE_SUSPENDED",
        "a transient failure the node answered releases the actor: {a}"
    );
    assert!(
        a["lastError"]
            .as_str()
            .unwrap_or_default()
            .contains("failed for now"),
        "{a}"
    );

    m.start_worker();
    let start = Instant::now();
    while m.worker_epoch().is_none_or(|e| e == old_epoch) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "worker not re-registered:\n{}",
            m.log("node")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The new worker process removed the orphaned sandbox of the killed one.
    let start = Instant::now();
    while !containers(&m.state()).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "leftover sandbox: {:?}",
            containers(&m.state())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let a = actor_json(&|a: &[&str]| m.ate_ok(a), ns, "c");
    assert_eq!(
        state_of(&a),
        "ACTOR_STATE_SUSPENDED",
        "a worker restart is not a crash: the next resume places the actor again: {a}"
    );
    apply(
        &|a: &[&str]| m.ate_ok(a),
        m.dir.path(),
        ns,
        "counter",
        &Tpl::counter(),
    );
    let (status, _, body) = get(m.router, &target, "/");
    assert_eq!(
        status,
        200,
        "{body}\napi:\n{}\nnode:\n{}",
        m.log("api"),
        m.log("node")
    );
    assert_eq!(
        counts(&body),
        (3, 3, 3),
        "restored from generation 1 on the restarted worker"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. exits

#[test]
fn exited_actor_is_released_within_a_second_and_resumes_from_its_last_generation() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ns-exit";
    counter_actor(&sys, ns, "counter", "c");
    let target = format!("{ns}/c");
    for n in 1..=3 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
    }
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 4, 4));
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (5, 5, 5));
    let killed = Instant::now();
    kill_actor(&sys, ns, "c");
    let a = wait_state(
        &sys,
        ns,
        "c",
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(5),
    );
    let noticed = killed.elapsed();
    eprintln!(
        "[timing] exit noticed and actor released after {} ms",
        ms(noticed)
    );
    assert!(
        noticed < Duration::from_millis(2500),
        "noticed after {noticed:?}"
    );
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("all processes exited"),
        "lastError names the exit: {why}"
    );
    // The worker is the init's subreaper, so the status is known: SIGKILL → 128 + 9.
    assert!(why.contains("(code 137)"), "exit code recorded: {why}");
    let workers: Value =
        serde_json::from_str(&sys.ate_ok(&["get", "workers", "-o", "json"])).expect("json");
    assert_eq!(workers[0]["slotsUsed"], 0, "capacity released: {workers}");
    // The next request resumes it from generation 1 (taken after the 3rd request).
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 4, 4));

    // The last log lines are in lastError: checked on a fresh actor, whose start-up line is
    // certainly in its log (before d7ce43a a memory-restored actor's log began empty, since the
    // log lived in the sandbox dir that each checkpoint removes).
    create_actor(&sys, ns, "fresh", "counter");
    assert_eq!(
        counts(&get_ok(&sys, &format!("{ns}/fresh"), "/")),
        (1, 1, 1)
    );
    kill_actor(&sys, ns, "fresh");
    let why = last_error_in_state(
        &sys,
        ns,
        "fresh",
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(5),
    );
    assert!(
        why.contains("counter listening on"),
        "lastError carries the last log lines: {why}"
    );
    // No generation yet: a cold boot.
    assert_eq!(
        counts(&get_ok(&sys, &format!("{ns}/fresh"), "/")),
        (1, 1, 1)
    );

    // An exit of the workload's own choosing carries its code, also for an init CRIU restored
    // (`c` came back from generation 1 above: runc restore, not a thaw, since its frozen copy
    // was thawed before the kill).
    let (status, _, body) = request(sys.router_addr, "POST", &target, "/exit?code=3", "");
    assert_eq!((status, body.trim()), (200, "exiting with code 3"));
    let why = last_error_in_state(
        &sys,
        ns,
        "c",
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(5),
    );
    assert!(why.contains("(code 3)"), "exit code 3 recorded: {why}");
    assert!(
        why.contains("exiting with code 3 as asked"),
        "last log lines: {why}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. isolation

#[test]
fn actors_are_isolated_and_atunnel_refuses_strangers() {
    let sys = System::up(UpOptions::default());
    let ns = "ns-isolation";
    sys_apply(&sys, ns, "counter", &Tpl::counter());
    let other = Tpl {
        env: vec![("PORT2".into(), "9091".into())],
        ..Tpl::counter()
    };
    sys_apply(&sys, ns, "other", &other);
    sys.ate_ok(&[
        "create",
        "actor",
        "a",
        "-a",
        ns,
        "-t",
        &format!("{ns}/counter"),
        "--selector",
        "ate.dev/worker=worker-1",
    ]);
    sys.ate_ok(&[
        "create",
        "actor",
        "b",
        "-a",
        ns,
        "-t",
        &format!("{ns}/other"),
        "--selector",
        "ate.dev/worker=worker-1",
    ]);
    get_ok(&sys, &format!("{ns}/a"), "/healthz");
    get_ok(&sys, &format!("{ns}/b"), "/healthz");

    // Host services on loopback and on every address.
    let lo = TcpListener::bind("127.0.0.1:0").expect("bind");
    let any = TcpListener::bind("0.0.0.0:0").expect("bind");
    let any_port = any.local_addr().expect("addr").port();
    let host_ip = Command::new("sh")
        .args([
            "-c",
            "ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n1",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let connect = |addr: String| {
        let (status, _, body) = get(
            sys.router_addr,
            &format!("{ns}/a"),
            &format!("/connect?addr={addr}"),
        );
        (status, body)
    };
    // The handler works: the actor reaches itself.
    assert_eq!(connect("169.254.17.2:8080".into()), (200, "ok".into()));
    let mut targets = vec![
        (
            "host loopback listener",
            lo.local_addr().expect("addr").to_string(),
        ),
        (
            "host listener via 127.0.0.1",
            format!("127.0.0.1:{any_port}"),
        ),
        (
            "worker-1 atunnel",
            SocketAddr::new(sys.worker_ips[0].into(), sys.worker_port).to_string(),
        ),
        (
            "worker-2 atunnel",
            SocketAddr::new(sys.worker_ips[1].into(), sys.worker_port).to_string(),
        ),
        ("api", sys.api.trim_start_matches("http://").to_string()),
        ("actor b's port", "169.254.17.2:9091".into()),
    ];
    if !host_ip.is_empty() {
        targets.push((
            "host listener via its global address",
            format!("{host_ip}:{any_port}"),
        ));
    }
    for (what, addr) in &targets {
        let (status, body) = connect(addr.clone());
        assert_eq!(status, 502, "actor a reached {what} at {addr}: {body}");
    }
    // b, on the same worker, answers on 9091 — only through atunnel.
    let (status, _, _) = {
        let mut s = std::net::TcpStream::connect(sys.router_addr).expect("router");
        use std::io::{Read, Write};
        write!(
            s,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nate-target-actor: {ns}/b\r\nate-target-port: 9091\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        let status = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0u16);
        (status, (), ())
    };
    assert_eq!(
        status, 200,
        "b answers on 9091 through the router (ate-target-port)"
    );
    for l in [&lo, &any] {
        l.set_nonblocking(true).expect("nonblocking");
        assert!(
            l.accept().is_err(),
            "a host listener got a connection from an actor"
        );
    }

    // atunnel itself: an actor not active on this worker → 421 stale; bad targets → 400.
    let w1 = SocketAddr::new(sys.worker_ips[0].into(), sys.worker_port);
    let w2 = SocketAddr::new(sys.worker_ips[1].into(), sys.worker_port);
    let tls = sys.state_dir().join("tls");
    let tls = tls.as_path();
    // Only the router gets in: no certificate (h2c) and other identities of the CA are refused.
    for stranger in [None, Some("admin"), Some("node"), Some("worker-2")] {
        let r = block_on(atunnel_request(tls, stranger, w1, &format!("{ns}/a"), None));
        assert!(r.is_err(), "atunnel let {stranger:?} in: {r:?}");
    }
    assert_eq!(
        atunnel_connect(tls, w1, &format!("{ns}/a"), None).0,
        200,
        "a is active on worker-1"
    );
    assert_eq!(
        atunnel_connect(tls, w2, &format!("{ns}/a"), None),
        (421, Some("true".into())),
        "a is not on worker-2"
    );
    assert_eq!(
        atunnel_connect(tls, w1, &format!("{ns}/nobody"), None),
        (421, Some("true".into()))
    );
    assert_eq!(atunnel_connect(tls, w1, "Bad/Name", None).0, 400);
    assert_eq!(atunnel_connect(tls, w1, "no-slash", None).0, 400);
    assert_eq!(
        atunnel_connect(tls, w1, &format!("{ns}/a"), Some("0")).0,
        400
    );
    assert_eq!(
        atunnel_connect(tls, w1, &format!("{ns}/a"), Some("http")).0,
        400
    );
    sys.ate_ok(&["suspend", "actor", "a", "-a", ns]);
    assert_eq!(
        atunnel_connect(tls, w1, &format!("{ns}/a"), None),
        (421, Some("true".into())),
        "suspended → stale"
    );
}

// ---------------------------------------------------------------------------------------------
// 7. cleanup

#[test]
fn nothing_is_left_behind_after_shutdown() {
    let mut sys = System::up(UpOptions::default());
    let ns = "ns-cleanup";
    sys_apply(&sys, ns, "counter", &Tpl::counter());
    let names = ["c1", "c2", "c3"];
    for n in names {
        create_actor(&sys, ns, n, "counter");
        get_ok(&sys, &format!("{ns}/{n}"), "/");
    }
    sys.ate_ok(&["suspend", "actor", "c3", "-a", ns]);
    let state = sys.state_dir();
    let all = containers_with_status(&state);
    let running = all.iter().filter(|c| c.2 == "running").count();
    let frozen = all.iter().filter(|c| c.2 == "paused").count();
    // c3 stays frozen in place after its dump (dropped at shutdown like the others).
    assert_eq!((running, frozen), (2, 1), "{all:?}");
    let netns: Vec<String> = names
        .iter()
        .map(|n| ids_of(&state, ns, n).pop().expect("a container per actor"))
        .collect();
    assert!(
        Path::new("/var/run/netns").join(&netns[0]).exists(),
        "netns naming as expected"
    );
    assert!(
        Path::new("/var/run/netns").join(&netns[2]).exists(),
        "a frozen actor keeps its netns until it is dropped"
    );
    let state_str = state.display().to_string();
    assert!(
        std::fs::read_to_string("/proc/mounts")
            .expect("mounts")
            .contains(&state_str)
    );

    sys.stop();
    for n in &netns {
        assert!(
            !Path::new("/var/run/netns").join(n).exists(),
            "netns {n} left behind"
        );
    }
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for n in &netns {
        assert!(
            !listed.contains(n.as_str()),
            "ip netns list still shows {n}"
        );
    }
    let mounts = std::fs::read_to_string("/proc/mounts").expect("mounts");
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&state_str)).collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    assert!(
        containers(&state).is_empty(),
        "runc containers left: {:?}",
        containers(&state)
    );
    for (_, pid, _) in all {
        // A zombie reparented to init is gone for every practical purpose; init reaps it soon.
        let start = Instant::now();
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("");
            if stat.is_empty() || state == "Z" {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "actor process {pid} left: {stat}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let procs = Command::new("pgrep")
        .args(["-f", &state_str])
        .output()
        .expect("pgrep");
    assert!(
        procs.stdout.is_empty(),
        "processes left: {}",
        String::from_utf8_lossy(&procs.stdout)
    );
}

// ---------------------------------------------------------------------------------------------
// frozen in place

#[test]
fn suspended_actor_is_kept_frozen_and_thawed_in_place() {
    let sys = System::up_with_env(UpOptions::with_workers(1), &[("ATE_KEEP_FROZEN", "1")]);
    let ns = "ns-frozen";
    sys_apply(&sys, ns, "counter", &Tpl::counter());
    for n in ["a", "b"] {
        create_actor(&sys, ns, n, "counter");
    }
    let state = sys.state_dir();
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/a"), "/")), (1, 1, 1));
    let (pid, status) = container_of(&state, ns, "a").expect("a runs");
    assert_eq!(status, "running");

    // Suspend: the generation is sealed as always, and the sandbox stays, frozen.
    sys.ate_ok(&["suspend", "actor", "a", "-a", ns]);
    assert_eq!(state_of(&actor(&sys, ns, "a")), "ACTOR_STATE_SUSPENDED");
    let gen1 = generation_dir(&state, ns, "a", 1);
    assert!(gen1.join("manifest.json").is_file(), "generation 1 sealed");
    assert!(
        gen1.join("criu").join("inventory.img").is_file(),
        "memory dumped"
    );
    assert_eq!(
        container_of(&state, ns, "a"),
        Some((pid, "paused".to_string())),
        "kept frozen in place"
    );

    // Resume: the same process continues (same host pid: a CRIU restore would give a new one).
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/a"), "/")), (2, 2, 2));
    assert_eq!(
        container_of(&state, ns, "a"),
        Some((pid, "running".to_string())),
        "thawed, not restored"
    );
    assert!(
        sys.log("worker-1").contains("actor thawed in place"),
        "the worker reports the thaw"
    );

    // The frozen limit (1 here): freezing b drops a's frozen copy, oldest first.
    sys.ate_ok(&["suspend", "actor", "a", "-a", ns]);
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/b"), "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "b", "-a", ns]);
    let start = Instant::now();
    while container_of(&state, ns, "a").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a's frozen copy dropped over the limit: {:?}",
            containers_with_status(&state)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        container_of(&state, ns, "b").map(|c| c.1),
        Some("paused".to_string())
    );
    // a comes back from its dump (generation 2) with nothing lost.
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/a"), "/")), (3, 3, 3));
    let (pid_a, status) = container_of(&state, ns, "a").expect("a restored");
    assert_eq!(status, "running");
    assert_ne!(pid_a, pid, "restored from the dump: a new process");

    // Deleting a frozen actor removes its frozen sandbox (its generations are deleted).
    sys.ate_ok(&["delete", "actor", "b", "-a", ns]);
    let start = Instant::now();
    while container_of(&state, ns, "b").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "b's frozen copy outlived its generations: {:?}",
            containers_with_status(&state)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------------
// timings (printed, not asserted)

#[test]
fn timings_local_and_durable() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ns-timing";
    sys_apply(&sys, ns, "counter", &Tpl::counter());
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(50));
    for (name, template) in [("c", "counter"), ("s", "sleeper")] {
        create_actor(&sys, ns, name, template);
        let target = format!("{ns}/{name}");
        let t = Instant::now();
        let first = get_ok(&sys, &target, "/");
        eprintln!(
            "[timing] {template}: cold start to first response {} ms",
            ms(t.elapsed())
        );
        let mut generation = 0;
        for durable in [false, true] {
            generation += 1;
            let t = Instant::now();
            if durable {
                sys.ate_ok(&["suspend", "actor", name, "-a", ns, "--durable"]);
            } else {
                sys.ate_ok(&["suspend", "actor", name, "-a", ns]);
            }
            let suspend = t.elapsed();
            if durable {
                // Resume from the durable copy only.
                std::fs::remove_dir_all(generation_dir(&sys.state_dir(), ns, name, generation))
                    .expect("rm");
            }
            let t = Instant::now();
            let body = get_ok(&sys, &target, "/");
            let resume = t.elapsed();
            let how = if durable {
                "durable (file store)"
            } else {
                "node-local"
            };
            eprintln!(
                "[timing] {template}: suspend{} {} ms; resume {how} to first response {} ms",
                if durable { " --durable" } else { "" },
                ms(suspend),
                ms(resume)
            );
            if template == "sleeper" {
                assert_eq!(body, first, "sleeper memory survives");
            }
        }
        // Where the time went, from the components' own logs.
        for (component, keys) in [
            ("worker-1", ["generation sealed", "actor started"]),
            ("node", ["generation uploaded", "generation downloaded"]),
        ] {
            for line in sys
                .log(component)
                .lines()
                .filter(|l| l.contains(target.as_str()))
            {
                if keys.iter().any(|k| line.contains(k)) {
                    eprintln!(
                        "    {component}: {}",
                        line.split_once("Z ").map_or(line, |x| x.1)
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// a damaged node-local generation and its durable copy

#[test]
fn corrupted_local_generation_is_restored_from_its_durable_copy() {
    // No frozen copy: a resume must restore (and so verify) the generation on disk.
    let sys = one_worker_restoring(None);
    let ns = "ns-corrupt-durable";
    counter_actor(&sys, ns, "counter", "c");
    let target = format!("{ns}/c");
    for n in 1..=3 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
    }
    // DURABLE: returns after the upload; no lastError = the durable copy is COMPLETED.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "{a}");
    assert!(a.get("lastError").is_none(), "durable suspend reported {a}");
    assert_eq!(a["generation"].as_u64(), Some(1), "{a}");
    let state = sys.state_dir();
    assert!(
        durable_manifest(&state.join("durable"), ns, "c", 1).is_some(),
        "generation 1 has a complete durable copy"
    );

    let gen_dir = generation_dir(&state, ns, "c", 1);
    let victim = flip_byte_in_largest_file(&gen_dir);

    // The same resume discards the local copy and restores generation 1 from the durable one:
    // memory, files and rootfs continue.
    assert_eq!(
        counts(&get_ok(&sys, &target, "/")),
        (4, 4, 4),
        "restored from the durable copy"
    );
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
    assert!(
        a.get("lastError").is_none(),
        "nothing recorded as wrong: {a}"
    );
    assert_eq!(
        a["generation"].as_u64(),
        Some(1),
        "generation unchanged: {a}"
    );
    let node_log = sys.log("node");
    let warning = node_log
        .lines()
        .find(|l| l.contains("node-local generation failed verification; discarding it"))
        .unwrap_or_else(|| panic!("no warning in the node log:\n{node_log}"));
    assert!(
        warning.contains(&victim.display().to_string()),
        "the warning names the bad file {}: {warning}",
        victim.display()
    );
    // Moved aside for good (kept for inspection), never used again; the download is cached.
    assert!(!gen_dir.exists(), "the damaged copy left its place");
    let aside = quarantined(&gen_dir);
    let rel = victim.strip_prefix(&gen_dir).expect("victim under gen dir");
    assert!(aside.join(rel).is_file(), "{} kept aside", aside.display());
    let cache = state.join("snapshot-cache");
    assert_eq!(
        std::fs::read_dir(&cache).map(|d| d.count()).unwrap_or(0),
        1,
        "the durable copy was downloaded into {}",
        cache.display()
    );

    // The actor carries on as usual: a new local generation, restored in place.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (5, 5, 5));
    assert!(actor(&sys, ns, "c").get("lastError").is_none());

    // Deleting the actor deletes the set-aside copy with its generation.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    sys.ate_ok(&["delete", "actor", "c", "-a", ns]);
    let start = Instant::now();
    while aside.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} outlived its generation",
            aside.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn corrupted_local_generation_without_durable_copy_crashes_and_keeps_the_older_one() {
    // The durable store is writable for generation 1, read-only for generation 2.
    let store = TmpfsStore::mount(false);
    let sys = one_worker_restoring(Some(store.url()));
    let ns = "ns-corrupt-local-only";
    counter_actor(&sys, ns, "counter", "c");
    let target = format!("{ns}/c");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    assert!(actor(&sys, ns, "c").get("lastError").is_none());
    let durable1 = durable_manifest(&store.dir, ns, "c", 1).expect("generation 1 is durable");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (2, 2, 2));

    // Generation 2 gets no durable copy.
    store.make_read_only();
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "{a}");
    assert!(
        a["lastError"]
            .as_str()
            .unwrap_or_default()
            .contains("durable upload failed"),
        "{a}"
    );
    let state = sys.state_dir();
    let gen1 = generation_dir(&state, ns, "c", 1);
    let gen2 = generation_dir(&state, ns, "c", 2);
    let gen1_manifest = std::fs::read(gen1.join("manifest.json")).expect("generation 1 kept");
    let durable1_manifest = std::fs::read(&durable1).expect("durable generation 1");
    flip_byte_in_largest_file(&gen2);

    // CRASHED with the checksum reason; no fallback to another generation by itself.
    let (status, head, body) = get(sys.router_addr, &target, "/");
    assert_ne!(
        status, 200,
        "a corrupted generation must never restore: {head}\n{body}"
    );
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_CRASHED", "{a}");
    let why = a["lastError"].as_str().unwrap_or_default().to_lowercase();
    assert!(
        why.contains("checksum") || why.contains("sha256") || why.contains("fails authentication"),
        "lastError: {why}"
    );
    assert!(
        sys.log("node").contains("has no COMPLETED durable copy"),
        "node log:\n{}",
        sys.log("node")
    );
    // Nothing was moved or deleted: the damaged copy stays where it was, generation 1 (local
    // and durable) is untouched.
    assert!(
        gen2.join("manifest.json").is_file(),
        "generation 2 left in place"
    );
    assert!(!quarantined(&gen2).exists());
    assert_eq!(
        std::fs::read(gen1.join("manifest.json")).expect("generation 1"),
        gen1_manifest
    );
    assert_eq!(
        std::fs::read(&durable1).expect("durable generation 1"),
        durable1_manifest
    );
    assert!(
        containers(&state).is_empty(),
        "no sandbox was started from it"
    );
    // The local copy is marked damaged (it was the only one); a revert goes back to generation
    // 1, whose counts continue, and skips 2.
    let json = sys.ate_ok(&["get", "generations", "actor", "c", "-a", ns, "-o", "json"]);
    let listed: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(listed[0]["generation"], 2, "{json}");
    assert_eq!(listed[0]["status"], "damaged", "{json}");
    assert_eq!(listed[0]["durable"], "FAILED", "{json}");
    assert!(
        listed[0]["localDamage"]
            .as_str()
            .is_some_and(|d| !d.is_empty()),
        "{json}"
    );
    assert_eq!(listed[1]["generation"], 1, "{json}");
    assert_eq!(listed[1]["next"], true, "{json}");
    sys.ate_ok(&["revert", "actor", "c", "-a", ns]);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (2, 2, 2));
    let json = sys.ate_ok(&["get", "generations", "actor", "c", "-a", ns, "-o", "json"]);
    let listed: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(listed[0]["skipped"], true, "{json}");
}
