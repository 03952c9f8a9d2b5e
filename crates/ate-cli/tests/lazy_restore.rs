//! Lazy memory restores end to end (real runc + CRIU + userfaultfd through `ate up`): memory
//! survives suspend/resume cycles on either worker and from the durable copy, a damaged chunk
//! crashes the actor (never a wrong page), and a page source killed mid-restore never leaves
//! the actor running on incomplete memory.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

/// `ate_worker_lazy_restores_total{outcome}` summed over the system's workers.
fn lazy_restores(sys: &System, outcome: &str) -> u64 {
    sys.worker_metric(&format!(
        "ate_worker_lazy_restores_total{{outcome=\"{outcome}\"}}"
    ))
}

fn lazy_system(workers: u32, env: &[(&str, &str)]) -> System {
    // No frozen copies: every resume restores the generation.
    let mut all = vec![("ATE_KEEP_FROZEN", "0")];
    all.extend_from_slice(env);
    System::up_with_env(
        UpOptions {
            workers,
            ..Default::default()
        },
        &all,
    )
}

/// A page source of this system (a worker's child, found by its generation under our state dir).
fn page_source_pid(sys: &System) -> Option<u32> {
    // Its generation may be a scratch dir (a sealed generation opened): found by its work dir.
    let pattern = format!(
        "page-source --generation .* --work-dir {}",
        sys.state_dir().display()
    );
    // The newest (`-n`): an earlier restore's page source may still be finishing its push.
    pgrep_first(&["-n", "-f", &pattern])
}

/// A 64 MiB sleeper `s` in `ns` that answered once (its checksum returned) and is suspended.
fn suspended_sleeper(sys: &System, ns: &str) -> (String, String) {
    sys_apply(sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    let original = sleeper_checksum(&get_ok(sys, &target, "/"));
    sys.ate_ok(&["suspend", "actor", "s", "-a", ns]);
    (target, original)
}

#[test]
fn memory_survives_five_lazy_cycles_on_either_worker_and_from_the_durable_copy() {
    let sys = lazy_system(2, &[]);
    let ns = "ns-lazy";
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    sys_apply(&sys, ns, "counter", &Tpl::counter());
    create_actor(&sys, ns, "s", "sleeper");
    create_actor(&sys, ns, "c", "counter");
    let sleeper = format!("{ns}/s");
    let counter = format!("{ns}/c");
    let first = sleeper_checksum(&get_ok(&sys, &sleeper, "/"));
    assert_eq!(counts(&get_ok(&sys, &counter, "/")), (1, 1, 1));
    let mut workers = std::collections::BTreeSet::new();
    for cycle in 1..=5u64 {
        sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]);
        sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
        if cycle == 3 {
            // The node-local copies disappear: these resumes come from the durable store.
            for name in ["s", "c"] {
                let dir = generation_dir(&sys.state_dir(), ns, name, cycle);
                std::fs::remove_dir_all(&dir).expect("remove the node-local generation");
            }
        }
        let t = Instant::now();
        let health = get_ok(&sys, &sleeper, "/healthz");
        let first_answer = t.elapsed();
        assert_eq!(health, "ok");
        let sum = sleeper_checksum(&get_ok(&sys, &sleeper, "/"));
        eprintln!(
            "[timing] cycle {cycle}: sleeper 64 MiB first answer {} ms, full memory {} ms",
            first_answer.as_millis(),
            t.elapsed().as_millis()
        );
        assert_eq!(
            sum, first,
            "cycle {cycle}: the sleeper's memory changed across a lazy restore"
        );
        let n = cycle + 1;
        assert_eq!(
            counts(&get_ok(&sys, &counter, "/")),
            (n, n, n),
            "cycle {cycle}: the counter continues"
        );
        workers.insert(worker_of(&sys, ns, "s"));
        workers.insert(worker_of(&sys, ns, "c"));
        if cycle == 3 {
            // From the durable copy, memory on demand: only the small files and the chunks CRIU
            // reads came down before the restore; the page source fetched the rest.
            let node_log = sys.log("node");
            assert!(
                node_log.matches("durable copy, memory on demand").count() >= 2,
                "cycle 3 restored lazily from the durable copy:\n{node_log}"
            );
        }
    }
    // Every restore above was lazy and each page source finished (checked a moment later: the
    // exit watcher records it).
    let deadline = Instant::now() + Duration::from_secs(10);
    while lazy_restores(&sys, "complete") < 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        lazy_restores(&sys, "complete") >= 10,
        "ten lazy restores completed: {}\nworker logs:\n{}\n{}",
        lazy_restores(&sys, "complete"),
        sys.log("worker-1"),
        sys.log("worker-2")
    );
    assert_eq!(lazy_restores(&sys, "failed"), 0);
    assert_eq!(
        workers.len(),
        2,
        "the actors ran on both workers over the cycles: {workers:?}"
    );
    // Working-set prefetch: each generation dumped after a lazy restore carries the chunks that
    // restore faulted first, and the restores of such generations pushed them first.
    let carried = generation_dir(&sys.state_dir(), ns, "s", 5)
        .join("criu")
        .join("working-set.json");
    assert!(carried.is_file(), "{} is missing", carried.display());
    let logs = format!("{}\n{}", sys.log("worker-1"), sys.log("worker-2"));
    let prefetched: Vec<u64> = logs
        .lines()
        .filter(|l| l.contains("every page is in"))
        .filter_map(|l| l.split("prefetched=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        prefetched.iter().any(|n| *n > 0),
        "some restore pushed its working set first: {prefetched:?}"
    );
    // The same, as the workers' metrics count it.
    assert!(sys.worker_metric("ate_worker_lazy_chunks_total{source=\"store\"}") > 0);
    assert!(sys.worker_metric("ate_worker_lazy_chunks_total{source=\"local\"}") > 0);
    assert!(sys.worker_metric("ate_worker_lazy_prefetched_chunks_total") > 0);
}

/// After a fault in a lazy restore: the next request is either refused or answered from
/// complete, verified memory (the `original` checksum), and the actor becomes CRASHED with a
/// lastError holding every one of `why`; no page source is left running.
fn expect_crash_never_a_wrong_answer(sys: &System, ns: &str, original: &str, why: &[&str]) {
    let target = format!("{ns}/s");
    let (status, _, body) = get(sys.router_addr, &target, "/");
    eprintln!("request after the fault: {status} {body}");
    if status == 200 {
        assert_eq!(
            sleeper_checksum(&body),
            original,
            "an answer from unverified memory"
        );
    }
    let a = wait_state(sys, ns, "s", "ACTOR_STATE_CRASHED", Duration::from_secs(30));
    let last_error = a["lastError"].as_str().unwrap_or_default();
    eprintln!("lastError: {last_error}");
    assert!(
        why.iter().all(|w| last_error.contains(w)),
        "lastError names {why:?}: {last_error}"
    );
    assert!(
        page_source_pid(sys).is_none(),
        "no page source is left running"
    );
}

/// Flips one byte in the middle of the largest memory image of generation `generation`;
/// returns the chunk it lies in (of a plaintext image) and the image's name.
fn damage_pages_image(sys: &System, ns: &str, name: &str, generation: u64) -> (String, String) {
    let criu = generation_dir(&sys.state_dir(), ns, name, generation).join("criu");
    let mut images: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&criu)
        .expect("read criu dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .map(|e| (e.metadata().map(|m| m.len()).unwrap_or(0), e.path()))
        .collect();
    images.sort();
    let (len, victim) = images.pop().expect("a pages image");
    let mut bytes = std::fs::read(&victim).expect("read");
    let at = (len / 2) as usize;
    bytes[at] ^= 0x40;
    std::fs::write(&victim, bytes).expect("write");
    let file = victim
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (format!("chunk {}", at as u64 / (2 << 20)), file)
}

#[test]
fn a_damaged_chunk_crashes_the_actor_and_no_wrong_page_is_served() {
    // The page source's own check of every chunk it reads, on a plaintext generation.
    let sys = lazy_system(1, &[("ATE_NO_SNAPSHOT_ENCRYPTION", "1")]);
    let ns = "ns-lazy-damage";
    let (target, original) = suspended_sleeper(&sys, ns);
    let (chunk, _) = damage_pages_image(&sys, ns, "s", 1);
    // The first answer may come before the damaged chunk is read (a lazy restore starts the
    // actor at once); whatever answers must never be computed from the damaged page.
    expect_crash_never_a_wrong_answer(&sys, ns, &original, &[&chunk, "damaged"]);
    let (status, _, body) = get(sys.router_addr, &target, "/");
    assert_ne!(status, 200, "a CRASHED actor is not served: {body}");
    // The copy the chunk was read from, the node-local one, is marked damaged, naming the chunk
    // (the worker reported the directory, the node which copy it is): no resume reads it again.
    let g = newest_marked_damaged(&sys, ns, "s", "localDamage");
    assert_eq!(g["generation"], 1, "{g}");
    assert!(
        g["localDamage"]
            .as_str()
            .is_some_and(|d| d.contains(&chunk) && d.contains("damaged")),
        "{g}"
    );
    assert!(g.get("durableDamage").is_none(), "{g}");
}

#[test]
fn a_damaged_frame_of_a_sealed_generation_crashes_the_actor_and_no_wrong_page_is_served() {
    // A sealed node-local generation's memory is opened frame by frame as the page source reads
    // it: a frame that does not authenticate is damage, found and reported the same way.
    let sys = lazy_system(1, &[]);
    let ns = "ns-lazy-sealed-damage";
    let (target, original) = suspended_sleeper(&sys, ns);
    let (_, file) = damage_pages_image(&sys, ns, "s", 1);
    expect_crash_never_a_wrong_answer(&sys, ns, &original, &[&file]);
    let (status, _, body) = get(sys.router_addr, &target, "/");
    assert_ne!(status, 200, "a CRASHED actor is not served: {body}");
    // The worker named the sealed generation (not the scratch dir it restored from), so the
    // node-local copy is the one marked damaged.
    let g = newest_marked_damaged(&sys, ns, "s", "localDamage");
    assert_eq!(g["generation"], 1, "{g}");
    assert!(
        g["localDamage"].as_str().is_some_and(|d| d.contains(&file)),
        "{g}"
    );
}

/// The newest generation of `ns/name` once its `copy` (`localDamage`, `durableDamage`) is marked
/// damaged: the api marks it right after it records the crash.
fn newest_marked_damaged(sys: &System, ns: &str, name: &str, copy: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let json = sys.ate_ok(&["get", "generations", "actor", name, "-a", ns, "-o", "json"]);
        let generations: serde_json::Value = serde_json::from_str(&json).expect("json");
        let newest = generations[0].clone();
        if newest.get(copy).is_some() || Instant::now() > deadline {
            return newest;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replaces the stored object of a memory chunk in the middle of `ns/name`'s newest durable
/// generation by another chunk's (valid zstd, other bytes), and removes the node-local copy, so
/// the next resume fetches it from the durable store. Returns "chunk N".
fn damage_durable_chunk(sys: &System, ns: &str, name: &str, generation: u64) -> String {
    let durable = sys.state_dir().join("durable");
    // The durable manifest is sealed (docs/security.md); the node-local one lists the same
    // chunks.
    let local = generation_dir(&sys.state_dir(), ns, name, generation);
    let manifest: serde_json::Value = serde_json::from_str(&support::generations::local_manifest(
        &sys.state_dir(),
        &local,
    ))
    .expect("manifest json");
    // Chunk objects are named by a keyed digest when the store is encrypted.
    let keys = ate_snapshot::SnapshotKeys::load(&sys.state_dir().join("keys")).ok();
    let pages = manifest["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter(|f| f["path"].as_str().is_some_and(|p| p.contains("pages-")))
        .max_by_key(|f| f["size"].as_u64().unwrap_or(0))
        .expect("a memory image");
    let chunks: Vec<&str> = pages["blake3_chunks"]
        .as_array()
        .expect("chunk digests")
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    let victim = chunks.len() / 2;
    let other = chunks
        .iter()
        .take(chunks.len() - 1) // full-size chunks only
        .find(|d| **d != chunks[victim])
        .expect("another chunk");
    let object = |d: &str| {
        let n = keys.as_ref().map_or(d.to_string(), |k| k.chunk_name(d));
        durable
            .join("_chunks")
            .join(&n[..2])
            .join(format!("{n}.zst"))
    };
    std::fs::copy(object(other), object(chunks[victim])).expect("damage the stored chunk");
    std::fs::remove_dir_all(generation_dir(&sys.state_dir(), ns, name, generation))
        .expect("remove the node-local generation");
    format!("chunk {victim}")
}

#[test]
fn a_damaged_chunk_in_the_durable_store_crashes_the_actor_and_no_wrong_page_is_served() {
    let sys = lazy_system(1, &[]);
    let ns = "ns-lazy-durable-damage";
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    let original = sleeper_checksum(&get_ok(&sys, &target, "/"));
    sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]);
    let chunk = damage_durable_chunk(&sys, ns, "s", 1);
    expect_crash_never_a_wrong_answer(&sys, ns, &original, &[&chunk, "damaged"]);
    // The chunk came from the store (a lazy restore from the durable copy): that copy is marked.
    let g = newest_marked_damaged(&sys, ns, "s", "durableDamage");
    assert!(
        g["durableDamage"]
            .as_str()
            .is_some_and(|d| d.contains(&chunk) && d.contains("damaged")),
        "{g}"
    );
    assert!(g.get("localDamage").is_none(), "{g}");
}

#[test]
fn chunks_gone_from_the_durable_store_mid_restore_crash_the_actor_and_revert_recovers_it() {
    // The background push is slowed down so the restore is still fetching when the chunks go.
    let sys = lazy_system(1, &[("ATE_FAULT_PAGE_SOURCE_PUSH_DELAY_MS", "200")]);
    let ns = "ns-lazy-store-gone";
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    let original = sleeper_checksum(&get_ok(&sys, &target, "/"));
    sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]);
    std::fs::remove_dir_all(generation_dir(&sys.state_dir(), ns, "s", 1))
        .expect("remove the node-local generation");
    assert_eq!(get_ok(&sys, &target, "/healthz"), "ok");
    // The store loses every chunk while the page source still fetches (the test's own store
    // under its state dir; moved back below).
    let chunks = sys.state_dir().join("durable").join("_chunks");
    let aside = sys.state_dir().join("durable-chunks-aside");
    std::fs::rename(&chunks, &aside).expect("move the chunks away");
    expect_crash_never_a_wrong_answer(&sys, ns, &original, &["chunk", "pages-", "missing"]);
    // The store is back: revert and the next request restore the same memory.
    std::fs::rename(&aside, &chunks).expect("move the chunks back");
    sys.ate_ok(&["revert", "actor", "s", "-a", ns]);
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), original);
}

#[test]
fn a_page_source_killed_mid_restore_never_leaves_the_actor_on_incomplete_memory() {
    // The background push is slowed down so the restore stays lazy for seconds.
    let sys = lazy_system(1, &[("ATE_FAULT_PAGE_SOURCE_PUSH_DELAY_MS", "200")]);
    let ns = "ns-lazy-kill";
    let (target, original) = suspended_sleeper(&sys, ns);
    assert_eq!(get_ok(&sys, &target, "/healthz"), "ok");
    let pid = page_source_pid(&sys).expect("the lazy restore's page source runs");
    // Ours: started by this test's `ate up`, found by its command line.
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    // Either the request is refused (the actor is being stopped) or it is answered from
    // complete, verified memory: never a different checksum.
    let (status, _, body) = get(sys.router_addr, &target, "/");
    eprintln!("request after the kill: {status} {body}");
    if status == 200 {
        assert_eq!(
            sleeper_checksum(&body),
            original,
            "answered from incomplete memory"
        );
    }
    // A page source that died says nothing against the generation: the actor is stopped and
    // goes back to it (SUSPENDED, not CRASHED: no operator needed). The request above may
    // already have resumed it again (the api took the exit first), so the api's record of the
    // exit is what is checked, not the state now.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let api = sys.log("api");
        if let Some(line) = api
            .lines()
            .find(|l| l.contains("actor ended on its worker") && l.contains("actor=ns-lazy-kill/s"))
        {
            break line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the api never recorded the actor's end within 30 s\napi log:\n{api}\nworker log:\n{}",
            sys.log("worker-1")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("api: {ended}");
    assert!(
        ended.contains("state=Suspended") && ended.contains("page source"),
        "SUSPENDED, and the reason says the page source ended: {ended}"
    );
    // The next request restores the same generation: its memory, intact.
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), original);
}

#[test]
fn a_worker_killed_during_the_background_push_adopts_the_actor_once_every_page_is_in() {
    // Slow background push: the page source is still working when the worker dies.
    let sys = lazy_system(1, &[("ATE_FAULT_PAGE_SOURCE_PUSH_DELAY_MS", "100")]);
    let ns = "ns-lazy-adopt";
    let (target, original) = suspended_sleeper(&sys, ns);
    assert_eq!(get_ok(&sys, &target, "/healthz"), "ok");
    let source = page_source_pid(&sys).expect("the lazy restore's page source runs");
    let worker = sys
        .pid_of("worker --id worker-1")
        .expect("the worker process");
    // Ours: a child of this test's `ate up`, which restarts it.
    let _ = Command::new("kill")
        .args(["-9", &worker.to_string()])
        .status();
    // The page source outlives the worker and finishes; the restarted worker adopts the
    // sandbox once it has, and the actor answers from complete memory.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = get(sys.router_addr, &target, "/");
        if status == 200 {
            assert_eq!(
                sleeper_checksum(&body),
                original,
                "memory after the adoption"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer after the worker restart: {status} {body}\n{}",
            sys.log("worker-1")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{source}")).exists()
            || std::fs::read_to_string(format!("/proc/{source}/stat"))
                .is_ok_and(|s| s.contains(") Z")),
        "the page source has finished"
    );
    let a = actor(&sys, ns, "s");
    assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
    let log = sys.log("worker-1");
    assert!(
        log.contains("re-adopted a running sandbox"),
        "the sandbox was adopted, not restored again:\n{log}"
    );
}

/// `(sent_bytes, chunks_delta)` of every upload of `ns/name` the node logged, oldest first.
fn uploads_of(sys: &System, ns: &str, name: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, key: &str| -> u64 {
        line.split(&format!(" {key}="))
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    sys.log("node")
        .lines()
        .filter(|l| l.contains("generation uploaded") && l.contains(&format!("/{ns}/{name}/")))
        .map(|l| (field(l, "sent_bytes"), field(l, "chunks_delta")))
        .collect()
}

/// The bases a stored chunk object is a delta of (none for a whole chunk): after the skippable
/// frame's 8 bytes, `ATEDELTA`, a version byte, the length (4), the base count (1), the bases.
fn delta_bases(object: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(object).expect("read a chunk object");
    if bytes.get(..4) != Some(0x184D_2A50u32.to_le_bytes().as_slice()) {
        return Vec::new();
    }
    let n = usize::from(bytes[21]);
    (0..n)
        .map(|i| String::from_utf8_lossy(&bytes[22 + 64 * i..22 + 64 * (i + 1)]).into_owned())
        .collect()
}

/// Incremental generations: each DURABLE suspend after `/dirty?percent=1` sends about 1 % of the
/// sleeper's memory (deltas on the chunks of the generation it ran from, which the node holds),
/// although CRIU dumped all of it. Retention then prunes the parent generations (records,
/// durable copies, node-local copies), a sweep of the store deletes what no generation needs,
/// and the newest generation still restores from the durable copy with the memory it had.
#[test]
fn incremental_generations_restore_after_their_parents_were_pruned() {
    // This test reads the stored layout itself (manifests, delta headers inside chunk objects),
    // so the store is left unencrypted; crates/ate-snapshot/tests/encrypted.rs sweeps an
    // encrypted one.
    let sys = System::up_with_env(
        UpOptions {
            workers: 1,
            up_args: vec!["--no-snapshot-encryption".into()],
            ..Default::default()
        },
        &[("ATE_KEEP_FROZEN", "0"), ("ATE_DURABLE_SWEEP_EVERY", "2")],
    );
    let ns = "ns-incremental";
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    get_ok(&sys, &target, "/");
    sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]);
    let mut sum = String::new();
    for _ in 2..=4 {
        let dirty = get_ok(&sys, &target, "/dirty?percent=1");
        assert!(dirty.starts_with("dirtied"), "{dirty}");
        sum = sleeper_checksum(&get_ok(&sys, &target, "/"));
        sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]);
    }
    let uploads = uploads_of(&sys, ns, "s");
    eprintln!("uploads (sent bytes, delta chunks): {uploads:?}");
    assert_eq!(uploads.len(), 4, "{uploads:?}");
    assert_eq!(uploads[0].1, 0, "the first generation goes up whole");
    assert!(uploads[0].0 > 32 << 20, "{uploads:?}");
    for (sent, deltas) in &uploads[1..] {
        assert!(
            *deltas >= 16,
            "the dirtied chunks went up as deltas: {uploads:?}"
        );
        assert!(
            *sent < 6 << 20,
            "1 % of 64 MiB changed; under 6 MiB sent: {uploads:?}"
        );
    }

    // Retention keeps generations 4 and 3 (the newest and the one a revert would go back to):
    // the durable copies of 1 and 2 go (asynchronously).
    let durable = sys.state_dir().join("durable");
    let keys = || -> Vec<String> {
        std::fs::read_dir(durable.join(ns).join("s"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while keys().len() > 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut left = keys();
    left.sort();
    assert!(
        left.len() == 2 && left[0].starts_with("3-") && left[1].starts_with("4-"),
        "only generations 3 and 4 are left in the store: {left:?}"
    );
    // Generation 4's memory chunks include deltas whose bases no kept generation lists.
    let chunks_of = |key: &str| -> std::collections::BTreeSet<String> {
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(durable.join(ns).join("s").join(key).join("manifest.json"))
                .expect("read the manifest"),
        )
        .expect("manifest json");
        manifest["files"]
            .as_array()
            .expect("files")
            .iter()
            .filter_map(|f| f["blake3_chunks"].as_array())
            .flatten()
            .filter_map(|d| d.as_str().map(str::to_owned))
            .collect()
    };
    let listed = chunks_of(&left[1]);
    let kept: std::collections::BTreeSet<String> =
        listed.union(&chunks_of(&left[0])).cloned().collect();
    let object = |d: &str| {
        durable
            .join("_chunks")
            .join(&d[..2])
            .join(format!("{d}.zst"))
    };
    let orphan_bases: std::collections::BTreeSet<String> = listed
        .iter()
        .flat_map(|d| delta_bases(&object(d)))
        .filter(|b| !kept.contains(b))
        .collect();
    assert!(
        !orphan_bases.is_empty(),
        "generation 4 has deltas on chunks of a pruned generation"
    );

    // Time passes (every chunk object looks two hours old) and the node sweeps the store: the
    // pruned generations' own chunks go, the bases generation 4 needs stay.
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    for fan in std::fs::read_dir(durable.join("_chunks"))
        .expect("chunks")
        .flatten()
    {
        if fan.file_name() == "_sweeps" {
            continue;
        }
        for f in std::fs::read_dir(fan.path()).expect("fan").flatten() {
            std::fs::File::options()
                .write(true)
                .open(f.path())
                .and_then(|f| f.set_modified(two_hours_ago))
                .expect("age a chunk object");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sys
        .log("node")
        .contains("removed chunks no generation references")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        sys.log("node")
            .contains("removed chunks no generation references"),
        "the sweep deleted the pruned generations' chunks:\n{}",
        sys.log("node")
    );
    for b in &orphan_bases {
        assert!(object(b).is_file(), "base {b} was kept");
    }

    // From the durable copy alone: no node-local generation, no cached download.
    std::fs::remove_dir_all(generation_dir(&sys.state_dir(), ns, "s", 4))
        .expect("remove the node-local generation");
    let _ = std::fs::remove_dir_all(sys.state_dir().join("snapshot-cache"));
    assert_eq!(
        sleeper_checksum(&get_ok(&sys, &target, "/")),
        sum,
        "generation 4's memory, rebuilt from deltas on a pruned generation's chunks"
    );
}

/// Incremental generations on a node that seals its generations (the default): after a lazy
/// restore from the sealed node-local copy, and after one from the durable copy (whose download
/// holds almost none of the memory: the page source writes nothing back on such a node), a
/// DURABLE suspend after `/dirty?percent=1` still sends about 1 % of the memory as deltas, and
/// each generation restores with the memory it had.
#[test]
fn sealed_generations_upload_only_what_changed_after_lazy_restores_from_either_copy() {
    let sys = lazy_system(1, &[]);
    let ns = "ns-sealed-incremental";
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    get_ok(&sys, &target, "/");
    sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]); // 1: whole
    let dirty_and_suspend = || {
        let dirty = get_ok(&sys, &target, "/dirty?percent=1");
        assert!(dirty.starts_with("dirtied"), "{dirty}");
        let sum = sleeper_checksum(&get_ok(&sys, &target, "/"));
        sys.ate_ok(&["suspend", "actor", "s", "-a", ns, "--durable"]);
        sum
    };
    // 2: restored lazily from the sealed node-local generation 1.
    dirty_and_suspend();
    // 3: restored lazily from the durable copy of 2 (node-local copy and cache removed).
    std::fs::remove_dir_all(generation_dir(&sys.state_dir(), ns, "s", 2))
        .expect("remove the node-local generation");
    let _ = std::fs::remove_dir_all(sys.state_dir().join("snapshot-cache"));
    let sum = dirty_and_suspend();
    let uploads = uploads_of(&sys, ns, "s");
    eprintln!("uploads (sent bytes, delta chunks): {uploads:?}");
    assert_eq!(uploads.len(), 3, "{uploads:?}");
    assert!(
        uploads[0].0 > 32 << 20,
        "the first generation goes up whole: {uploads:?}"
    );
    for (sent, deltas) in &uploads[1..] {
        assert!(
            *deltas >= 16,
            "the dirtied chunks went up as deltas: {uploads:?}"
        );
        assert!(
            *sent < 6 << 20,
            "1 % of 64 MiB changed; under 6 MiB sent: {uploads:?}"
        );
    }
    // Generation 3 from its durable copy alone: its memory, rebuilt from its deltas.
    std::fs::remove_dir_all(generation_dir(&sys.state_dir(), ns, "s", 3))
        .expect("remove the node-local generation");
    let _ = std::fs::remove_dir_all(sys.state_dir().join("snapshot-cache"));
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), sum);
}
