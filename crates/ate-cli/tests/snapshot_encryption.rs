//! Snapshots encrypted at rest and authenticated, end to end (real runc + CRIU through `ate up`,
//! which creates STATE_DIR/keys): a secret the actor holds in memory never reaches the node's
//! snapshots dir or the durable store; resumes from node-local and durable copies, lazy and eager, on either worker,
//! still work; a durable manifest rolled back to an older generation's, or swapped in from
//! another actor, is refused (CRASHED, `lastError` naming the object) and `ate revert` goes back
//! to an intact generation; a node-local copy flipped or rolled back is refused and the same
//! generation restored from its durable copy.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::actors::*;
use support::generations::durable_manifest;
use support::*;

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => all_files(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_with(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    all_files(dir, &mut files);
    files
        .into_iter()
        .filter(|f| std::fs::read(f).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
        .collect()
}

fn secret() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("sk-ate-secret-{nanos:x}-{}", std::process::id())
}

/// The counter with `AGENT_SECRET=<secret>` in its environment (its processes' memory).
fn counter_holding(secret: &str) -> Tpl {
    let mut t = Tpl::counter();
    t.env.push(("AGENT_SECRET".into(), secret.into()));
    t
}

/// Applies `tpl` as template `eager` of `ns`, restored eagerly
/// (`spec.snapshots.memoryRestore: eager`).
fn apply_eager(sys: &System, ns: &str, tpl: &Tpl) {
    let eager = tpl.yaml(ns, "eager").replace(
        "snapshots: {fidelity: memory",
        "snapshots: {memoryRestore: eager, fidelity: memory",
    );
    assert!(eager.contains("memoryRestore: eager"));
    let path = sys.dir.path().join(format!("eager-{ns}.yaml"));
    std::fs::write(&path, eager).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
}

fn durable_gen_dir(sys: &System, ns: &str, name: &str, generation: u64) -> PathBuf {
    durable_manifest(&sys.state_dir().join("durable"), ns, name, generation)
        .and_then(|m| m.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| panic!("generation {generation} of {ns}/{name} has no durable copy"))
}

#[test]
fn a_secret_in_memory_never_reaches_the_durable_store_and_resumes_still_work() {
    let sys = System::up_with_env(
        UpOptions::with_workers(2),
        // Every resume restores a generation (no frozen copy thawed in place).
        &[("ATE_KEEP_FROZEN", "0")],
    );
    let state = sys.state_dir();
    assert!(
        state.join("keys").join("data-key.json").is_file(),
        "ate up created the snapshot keys"
    );
    let ns = "ns-crypt";
    let secret = secret();
    sys_apply(&sys, ns, "counter", &counter_holding(&secret));
    // The same template restored eagerly.
    apply_eager(&sys, ns, &counter_holding(&secret));
    create_actor(&sys, ns, "c", "counter");
    create_actor(&sys, ns, "e", "eager");
    let (c, e) = (format!("{ns}/c"), format!("{ns}/e"));
    assert_eq!(counts(&get_ok(&sys, &c, "/")), (1, 1, 1));
    assert_eq!(counts(&get_ok(&sys, &e, "/")), (1, 1, 1));
    let mut workers = std::collections::BTreeSet::new();
    for n in 1..=4u64 {
        for name in ["c", "e"] {
            sys.ate_ok(&["suspend", "actor", name, "-a", ns, "--durable"]);
        }
        if n == 1 {
            // The control: the secret is in the memory the node-local generation holds, once
            // opened with the keys ate up made …
            let local = generation_dir(&state, ns, "c", 1);
            assert!(ate_snapshot::sealed::is_encrypted(&local), "sealed on disk");
            let opened = open_with_keys(&state, &local);
            assert!(
                !files_with(&opened.path().join("criu"), secret.as_bytes()).is_empty(),
                "the actor's memory holds the secret (else this test proves nothing)"
            );
            // … and in no byte of the node's snapshots, nor of the durable store, nor is any
            // manifest readable there.
            let snapshots = state.join("snapshots");
            assert_eq!(
                files_with(&snapshots, secret.as_bytes()),
                Vec::<PathBuf>::new(),
                "the secret is in a node-local generation"
            );
            assert_eq!(
                files_with(&snapshots, b"\"atespace\""),
                Vec::<PathBuf>::new()
            );
            let durable = state.join("durable");
            assert_eq!(
                files_with(&durable, secret.as_bytes()),
                Vec::<PathBuf>::new(),
                "the secret is in the durable store"
            );
            assert_eq!(files_with(&durable, b"\"atespace\""), Vec::<PathBuf>::new());
            assert!(
                !files_with(&durable, b"ATEENC1").is_empty(),
                "sealed objects"
            );
        }
        if n == 2 {
            // From the durable copies: lazy (c) and eager (e).
            for name in ["c", "e"] {
                std::fs::remove_dir_all(generation_dir(&state, ns, name, n))
                    .expect("remove the node-local generation");
            }
        }
        let m = n + 1;
        assert_eq!(counts(&get_ok(&sys, &c, "/")), (m, m, m), "lazy, cycle {n}");
        assert_eq!(
            counts(&get_ok(&sys, &e, "/")),
            (m, m, m),
            "eager, cycle {n}"
        );
        workers.insert(actor(&sys, ns, "c")["worker"].to_string());
        workers.insert(actor(&sys, ns, "e")["worker"].to_string());
    }
    let node_log = sys.log("node");
    assert!(
        node_log.contains("durable copy, memory on demand"),
        "a lazy restore from the (encrypted) durable copy:\n{node_log}"
    );
    assert!(workers.len() >= 2, "resumed on both workers: {workers:?}");
    // The eager restores from node-local sealed generations read the memory through the image
    // streamer (CRIU with the project's patch 0002), opened as CRIU read it.
    assert!(
        sys.worker_metric("ate_worker_memory_streamed_bytes_total") > 0,
        "no memory streamed to CRIU"
    );
    // The eager restore from the durable copy left a (sealed) download in the cache; the lazy
    // one's plaintext part is kept on a tmpfs, not under the state dir.
    let cached: Vec<PathBuf> = std::fs::read_dir(state.join("snapshot-cache"))
        .expect("snapshot cache")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    assert!(
        cached.iter().any(|p| ate_snapshot::sealed::is_encrypted(p)),
        "a sealed download in the cache: {cached:?}"
    );
    assert!(
        cached.iter().all(|p| ate_snapshot::sealed::is_encrypted(p)),
        "no plaintext download in the cache: {cached:?}"
    );
    for dir in ["durable", "snapshots", "snapshot-cache"] {
        assert_eq!(
            files_with(&state.join(dir), secret.as_bytes()),
            Vec::<PathBuf>::new(),
            "{dir} after every cycle"
        );
    }
}

/// `gen_dir` (sealed) opened with STATE_DIR/keys into a scratch dir of this test process.
fn open_with_keys(state: &Path, gen_dir: &Path) -> ate_snapshot::sealed::Scratch {
    let keys = ate_snapshot::SnapshotKeys::load(&state.join("keys")).expect("keys");
    // One test process, one configuration; the keys of a later system differ, so each test
    // that opens a generation runs in a process of its own (nextest).
    ate_snapshot::sealed::configure(Some(keys), std::env::temp_dir().join("ate-test-scratch"));
    let scratch = ate_snapshot::sealed::Scratch::new("test").expect("scratch");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(ate_snapshot::sealed::open_into(
        gen_dir,
        scratch.path(),
        ate_snapshot::sealed::Opening::All,
    ))
    .expect("open the sealed generation with the keys");
    scratch
}

#[test]
fn a_tampered_node_local_generation_is_refused_and_restored_from_its_durable_copy() {
    let sys = System::up_with_env(UpOptions::with_workers(1), &[("ATE_KEEP_FROZEN", "0")]);
    let state = sys.state_dir();
    let ns = "ns-crypt-local";
    counter_actor(&sys, ns, "counter", "c");
    let c = format!("{ns}/c");
    assert_eq!(counts(&get_ok(&sys, &c, "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]); // generation 1, count 1
    assert_eq!(counts(&get_ok(&sys, &c, "/")), (2, 2, 2));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]); // 2, count 2

    // A flipped bit in a sealed CRIU image of the node-local generation 2 (the task's core
    // image: opened before the restore starts; a damaged memory chunk, which a lazy restore's
    // page source finds as it reads it, crashes the actor: lazy_restore.rs).
    let g2 = generation_dir(&state, ns, "c", 2);
    let mut files = Vec::new();
    all_files(&g2.join("criu"), &mut files);
    let pages = files
        .into_iter()
        .find(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("core-"))
        })
        .expect("a core image");
    let mut bytes = std::fs::read(&pages).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&pages, &bytes).expect("write");
    assert_eq!(
        counts(&get_ok(&sys, &c, "/")),
        (3, 3, 3),
        "generation 2 restored from its durable copy"
    );
    let node_log = sys.log("node");
    assert!(
        node_log.contains("node-local generation failed verification")
            && node_log.contains("refused"),
        "the node found the damage and named it:\n{node_log}"
    );

    // Generation 1's node-local manifest put over generation 3's: refused, and 3 comes from
    // its durable copy (count 3, not 1).
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]); // 3, count 3
    let g3 = generation_dir(&state, ns, "c", 3);
    // Retention may prune generation 1 at any moment (after the suspends above): when it is
    // gone, or goes while it is copied, the other way is taken.
    let g1 = std::fs::read_dir(state.join("snapshots").join(ns).join("c"))
        .expect("actor dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("1-"))
        });
    let rolled_back = g1.is_some_and(|g1| {
        g1.join("manifest.json").is_file()
            && std::fs::copy(g1.join("manifest.json"), g3.join("manifest.json")).is_ok()
    });
    if !rolled_back {
        // Retention pruned generation 1: a manifest from another generation dir of this
        // actor still exists (2 was moved aside as damaged; 3's own is swapped with a copy
        // sealed for another path).
        let aside = state
            .join("snapshots")
            .join(ns)
            .join("c")
            .read_dir()
            .expect("actor dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p != &g3 && p.join("manifest.json").is_file())
            .expect("another generation dir");
        std::fs::copy(aside.join("manifest.json"), g3.join("manifest.json")).expect("swap");
    }
    assert_eq!(
        counts(&get_ok(&sys, &c, "/")),
        (4, 4, 4),
        "generation 3 (count 3) from its durable copy, not the rolled-back manifest"
    );
}

#[test]
fn a_damaged_memory_chunk_stops_a_streamed_eager_restore_and_the_durable_copy_serves() {
    let sys = System::up_with_env(UpOptions::with_workers(1), &[("ATE_KEEP_FROZEN", "0")]);
    let state = sys.state_dir();
    let ns = "ns-crypt-stream";
    apply_eager(&sys, ns, &Tpl::counter());
    create_actor(&sys, ns, "e", "eager");
    let e = format!("{ns}/e");
    assert_eq!(counts(&get_ok(&sys, &e, "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "e", "-a", ns, "--durable"]); // generation 1, count 1
    assert_eq!(counts(&get_ok(&sys, &e, "/")), (2, 2, 2));
    let streamed = sys.worker_metric("ate_worker_memory_streamed_bytes_total");
    assert!(streamed > 0, "generation 1 was streamed to CRIU");
    sys.ate_ok(&["suspend", "actor", "e", "-a", ns, "--durable"]); // 2, count 2

    // A flipped bit in the last frame of the memory image of the node-local generation 2:
    // the streamer has sent CRIU most of the image when it reaches it.
    let g2 = generation_dir(&state, ns, "e", 2);
    let mut files = Vec::new();
    all_files(&g2.join("criu"), &mut files);
    let pages = files
        .into_iter()
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
        .max_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .expect("a memory image");
    let mut bytes = std::fs::read(&pages).expect("read");
    let at = bytes.len() - 100;
    bytes[at] ^= 0x20;
    std::fs::write(&pages, &bytes).expect("write");
    assert_eq!(
        counts(&get_ok(&sys, &e, "/")),
        (3, 3, 3),
        "generation 2 restored from its durable copy, its memory intact"
    );
    let logs = format!("{}\n{}", sys.log("worker-1"), sys.log("node"));
    let restore_lines: Vec<&str> = logs.lines().filter(|l| l.contains("restore")).collect();
    assert!(
        logs.contains("refused while streaming it to CRIU"),
        "the worker named the refused image:\n{}",
        restore_lines.join("\n")
    );
    let node_log = sys.log("node");
    assert!(
        node_log.contains("node-local generation failed verification"),
        "the node found the damage:\n{node_log}"
    );
}

#[test]
fn a_rolled_back_or_swapped_durable_manifest_is_refused_and_revert_recovers() {
    let sys = System::up_with_env(UpOptions::with_workers(1), &[("ATE_KEEP_FROZEN", "0")]);
    let state = sys.state_dir();
    let ns = "ns-crypt-tamper";
    counter_actor(&sys, ns, "counter", "c");
    create_actor(&sys, ns, "d", "counter");
    let c = format!("{ns}/c");
    assert_eq!(counts(&get_ok(&sys, &c, "/")), (1, 1, 1));
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/d"), "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "d", "-a", ns, "--durable"]);
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]); // c: generation 1, count 1
    assert_eq!(counts(&get_ok(&sys, &c, "/")), (2, 2, 2));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]); // 2, count 2
    assert_eq!(counts(&get_ok(&sys, &c, "/")), (3, 3, 3));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]); // 3, count 3

    // Roll generation 3 back to generation 2: its manifest copied over 3's, node-local copy
    // gone, so the next resume reads the durable one.
    let g2 = durable_gen_dir(&sys, ns, "c", 2);
    let g3 = durable_gen_dir(&sys, ns, "c", 3);
    std::fs::copy(g2.join("manifest.json"), g3.join("manifest.json")).expect("roll back");
    std::fs::remove_dir_all(generation_dir(&state, ns, "c", 3)).expect("remove local gen 3");
    let (status, _, body) = get(sys.router_addr, &c, "/");
    assert_ne!(status, 200, "a refused generation serves nothing: {body}");
    let a = wait_state(
        &sys,
        ns,
        "c",
        "ACTOR_STATE_CRASHED",
        Duration::from_secs(30),
    );
    let last_error = a["lastError"].as_str().unwrap_or_default().to_string();
    eprintln!("lastError: {last_error}");
    let object = format!(
        "{ns}/c/{}/manifest.json",
        g3.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    assert!(
        last_error.contains(&object) && last_error.contains("refused"),
        "lastError names the refused object {object}: {last_error}"
    );
    // The durable copy of generation 3 is marked damaged; revert goes back to 2.
    let json = sys.ate_ok(&["get", "generations", "actor", "c", "-a", ns, "-o", "json"]);
    let gens: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(gens[0]["generation"], 3, "{gens}");
    assert!(
        gens[0]["durableDamage"]
            .as_str()
            .is_some_and(|d| d.contains("manifest.json")),
        "{gens}"
    );
    // (Its node-local copy was removed by hand above, which the api cannot know: a plain
    // revert would pick generation 3 for that copy. Name the intact generation.)
    sys.ate_ok(&["revert", "actor", "c", "-a", ns, "--generation", "2"]);
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_SUSPENDED", "{a}");
    assert_eq!(
        counts(&get_ok(&sys, &c, "/")),
        (3, 3, 3),
        "generation 2 (count 2) restored, then one more request"
    );

    // Swapped between actors: d's manifest in place of c's newest (generation 4, count 3).
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    let newest = actor(&sys, ns, "c")["generation"]
        .as_u64()
        .expect("generation");
    let gc = durable_gen_dir(&sys, ns, "c", newest);
    let gd = durable_gen_dir(&sys, ns, "d", 1);
    std::fs::copy(gd.join("manifest.json"), gc.join("manifest.json")).expect("swap");
    std::fs::remove_dir_all(generation_dir(&state, ns, "c", newest)).expect("remove local");
    let (status, _, _) = get(sys.router_addr, &c, "/");
    assert_ne!(status, 200);
    let last_error = crash_reason(&sys, ns, "c");
    assert!(
        last_error.contains("manifest.json") && last_error.contains("refused"),
        "{last_error}"
    );
    // Retention kept 2 (the skipped 3 is gone): back to it once more.
    assert_eq!(newest, 4);
    sys.ate_ok(&["revert", "actor", "c", "-a", ns, "--generation", "2"]);
    assert_eq!(
        counts(&get_ok(&sys, &c, "/")),
        (3, 3, 3),
        "back to generation 2 (count 2) before the swapped one"
    );
    // d itself was never touched.
    assert_eq!(counts(&get_ok(&sys, &format!("{ns}/d"), "/")), (2, 2, 2));
}

/// A sealed cached download is checked by manifest and sizes before a restore uses it (the
/// worker authenticates each frame as it opens it): one damaged after it was cached is refused
/// by the worker, dropped by the node, and the generation is downloaded again, so the actor
/// resumes with its memory instead of failing at every attempt.
#[test]
fn a_damaged_cached_download_is_dropped_and_downloaded_again() {
    let sys = System::up_with_env(UpOptions::with_workers(1), &[("ATE_KEEP_FROZEN", "0")]);
    let state = sys.state_dir();
    let ns = "ns-crypt-cache";
    apply_eager(&sys, ns, &Tpl::counter());
    create_actor(&sys, ns, "e", "eager");
    let e = format!("{ns}/e");
    assert_eq!(counts(&get_ok(&sys, &e, "/")), (1, 1, 1));
    sys.ate_ok(&["suspend", "actor", "e", "-a", ns, "--durable"]); // 1, count 1
    // From the durable copy (the node-local one gone): downloaded, then sealed into the cache.
    std::fs::remove_dir_all(generation_dir(&state, ns, "e", 1)).expect("remove node-local");
    assert_eq!(counts(&get_ok(&sys, &e, "/")), (2, 2, 2));
    sys.ate_ok(&["suspend", "actor", "e", "-a", ns]); // 2
    let cache = state.join("snapshot-cache");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let cached = loop {
        let found = std::fs::read_dir(&cache)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("manifest.json").is_file());
        if let Some(dir) = found {
            break dir;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sealed copy in the cache"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        ate_snapshot::sealed::is_encrypted(&cached),
        "{}",
        cached.display()
    );
    // A flipped bit in the cached memory image.
    let mut files = Vec::new();
    all_files(&cached.join("criu"), &mut files);
    let pages = files
        .into_iter()
        .find(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
        .expect("a memory image");
    let mut bytes = std::fs::read(&pages).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&pages, &bytes).expect("write");
    // Back to generation 1, whose only copy on the node is the damaged cache entry.
    sys.ate_ok(&["revert", "actor", "e", "-a", ns, "--generation", "1"]);
    assert_eq!(
        counts(&get_ok(&sys, &e, "/")),
        (2, 2, 2),
        "generation 1 (count 1) resumed from a fresh download"
    );
    assert!(
        sys.log("node")
            .contains("a cached download of the durable copy is damaged"),
        "the node dropped the damaged cache entry:\n{}",
        sys.log("node")
    );
}

/// The worker killed (-9) while it streams a sealed generation's memory to CRIU in an eager
/// restore: CRIU's pipe ends short, the restore fails without touching the generation (it is not
/// damage), the restarted worker clears the half-restored sandbox, and a later request restores
/// the same generation with all of its memory. The suspend is node-local only, so there is no
/// durable copy to hide a generation that was lost or moved aside.
#[test]
fn a_worker_killed_while_streaming_an_eager_restore_loses_nothing() {
    let sys = System::up_with_env(
        UpOptions::with_workers(1),
        // 32 chunks at 150 ms each: the stream takes ~5 s.
        &[
            ("ATE_KEEP_FROZEN", "0"),
            ("ATE_FAULT_IMAGE_STREAM_DELAY_MS", "150"),
        ],
    );
    let state = sys.state_dir();
    let ns = "ns-crypt-stream-kill";
    apply_eager(&sys, ns, &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "eager");
    let target = format!("{ns}/s");
    let original = sleeper_checksum(&get_ok(&sys, &target, "/"));
    sys.ate_ok(&["suspend", "actor", "s", "-a", ns]); // generation 1, node-local only
    let g1 = generation_dir(&state, ns, "s", 1);

    let router = sys.router_addr;
    let in_flight = {
        let target = target.clone();
        std::thread::spawn(move || get(router, &target, "/"))
    };
    let up = sys.child.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while descendant_matching(up, |args| {
        args.first().is_some_and(|a| a.ends_with("criu")) && args.iter().any(|a| a == "swrk")
    })
    .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no CRIU restore started:\n{}",
            sys.log("worker-1")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Well into the stream (about a third of it), then the worker dies.
    std::thread::sleep(Duration::from_millis(1500));
    let worker = sys.pid_of("worker --id worker-1").expect("the worker");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    let (status, _, body) = in_flight.join().expect("the request thread");
    eprintln!("the request in flight got {status}: {body}");
    if status == 200 {
        assert_eq!(
            sleeper_checksum(&body),
            original,
            "answered from the restored memory"
        );
    }

    // The same generation restores, whole: the sleeper's checksum over all its memory.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (status, _, body) = get(router, &target, "/");
        if status == 200 {
            assert_eq!(
                sleeper_checksum(&body),
                original,
                "generation 1's memory (a cold start would give another checksum)"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer after the worker restart: {status} {body}\nnode log:\n{}\nworker log:\n{}",
            sys.log("node"),
            sys.log("worker-1")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let a = actor(&sys, ns, "s");
    assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
    assert!(g1.exists(), "generation 1 kept in place: {}", g1.display());
    // The kill landed in the restore: that attempt was released (SUSPENDED, tried again), not
    // CRASHED.
    let api_log = sys.log("api");
    assert!(
        api_log.contains("resume failed for now; released to resume at the next attempt"),
        "the cut restore was released to be tried again:\n{api_log}"
    );
    assert!(!api_log.contains("actor CRASHED"), "{api_log}");
    let node_log = sys.log("node");
    assert!(
        !node_log.contains("failed verification"),
        "a killed worker is not damage to the generation:\n{node_log}"
    );
    // Still streamed after the restart (the second restore read the sealed generation too).
    assert!(sys.worker_metric("ate_worker_memory_streamed_bytes_total") > 0);
}
