//! Incremental suspend end to end (issue 32), through `ate up` on real runc + CRIU workers with
//! their page sources tracking writes: an actor restored lazily dumps only what it wrote since
//! the generation it came from; the generation is made whole in the background (or by the
//! restore that needs it first) and every byte comes back, generation after generation. Any
//! doubt dumps whole: an actor that was cold-started, and one whose tracking is gone (its page
//! source killed) — and its memory still comes back whole. (`ATE_INCREMENTAL_MIN_MIB=0`: the
//! 64 MiB sleepers here are below the worker's default threshold for incremental suspends.)

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

const WRITTEN: &str = "ate_worker_snapshot_bytes_written_total";
const INCREMENTAL: &str = "ate_worker_incremental_checkpoints_total{dump=\"incremental\"}";
const TRACKING_LOST: &str = "ate_worker_incremental_checkpoints_total{dump=\"tracking_lost\"}";

/// The sleeper's checksum after `/dirty` (`dirtied N pages, checksum X`).
fn dirtied_checksum(body: &str) -> String {
    body.rsplit("checksum ")
        .next()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| panic!("not a /dirty answer: {body:?}"))
}

/// Suspends `ns/name` and returns the bytes its generation's files took as written.
fn suspend_written(sys: &System, ns: &str, name: &str) -> u64 {
    let before = sys.worker_metric(WRITTEN);
    sys.ate_ok(&["suspend", "actor", name, "-a", ns]);
    sys.worker_metric(WRITTEN) - before
}

/// A 64 MiB sleeper `ns/s`: cold-started, suspended (whole), restored lazily (tracked) with its
/// memory. Returns its target and the bytes of that whole suspend.
fn restored_sleeper(sys: &System, ns: &str) -> (String, u64) {
    sys_apply(sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    let sum = sleeper_checksum(&get_ok(sys, &target, "/"));
    let whole = suspend_written(sys, ns, "s");
    assert_eq!(sleeper_checksum(&get_ok(sys, &target, "/")), sum);
    (target, whole)
}

/// Generations of `ns/name` on the node whose manifest still names a parent. A generation
/// retention is deleting right now (its manifest already gone) is none.
fn deltas_on_disk(sys: &System, ns: &str, name: &str) -> usize {
    let dir = sys.state_dir().join("snapshots").join(ns).join(name);
    std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .filter(|e| {
                    support::generations::try_local_manifest(&sys.state_dir(), &e.path())
                        .is_ok_and(|m| m.contains("\"parent\""))
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_tracked_actor_suspends_what_it_wrote_and_resumes_with_every_byte() {
    let ns = "ns-incr";
    // No frozen copies: every resume restores a generation lazily, with tracking.
    let sys = System::up_with_env(
        UpOptions::default(),
        &[("ATE_KEEP_FROZEN", "0"), ("ATE_INCREMENTAL_MIN_MIB", "0")],
    );
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    let mut sum = sleeper_checksum(&get_ok(&sys, &target, "/"));

    // Cold-started: nothing is tracked, the first generation is whole.
    let whole = suspend_written(&sys, ns, "s");
    assert!(whole > 64 << 20, "a whole 64 MiB dump wrote {whole} bytes");
    assert_eq!(sys.worker_metric(INCREMENTAL), 0);

    for round in 1..=3u64 {
        // Restored lazily with tracking; the memory is the generation's.
        assert_eq!(
            sleeper_checksum(&get_ok(&sys, &target, "/")),
            sum,
            "round {round}: memory after the resume"
        );
        sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));
        let began = Instant::now();
        let written = suspend_written(&sys, ns, "s");
        eprintln!(
            "[timing] round {round}: incremental suspend of a 64 MiB sleeper with 1 % rewritten: {} ms, {written} bytes (whole: {whole})",
            began.elapsed().as_millis()
        );
        assert_eq!(
            sys.worker_metric(INCREMENTAL),
            round,
            "round {round}: the suspend was not incremental\nworker-1: {}\nworker-2: {}",
            sys.log("worker-1"),
            sys.log("worker-2")
        );
        assert!(
            written * 5 < whole,
            "round {round}: the incremental suspend wrote {written} bytes, a whole one {whole}"
        );
    }
    // Made whole in the background, and the restore needs nothing else.
    let deadline = Instant::now() + Duration::from_secs(60);
    while deltas_on_disk(&sys, ns, "s") > 0 {
        assert!(
            Instant::now() < deadline,
            "an incremental generation is still not whole after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        sleeper_checksum(&get_ok(&sys, &target, "/")),
        sum,
        "memory after the last resume"
    );
}

#[test]
fn a_dump_without_tracking_is_whole_and_loses_nothing() {
    let ns = "ns-incr-lost";
    let sys = System::up_with_env(
        UpOptions::default(),
        &[("ATE_KEEP_FROZEN", "0"), ("ATE_INCREMENTAL_MIN_MIB", "0")],
    );
    let (target, whole) = restored_sleeper(&sys, ns);

    // Every page is in (the whole memory was read above): the page source now only tracks.
    // Killing it clears every write protection with its descriptors: tracking is gone.
    let source = descendant_matching(sys.child.id(), |args| {
        args.iter().any(|a| a == "page-source") && args.iter().any(|a| a == "--write-protect")
    })
    .expect("the actor's page source runs while it tracks");
    kill_9(source);
    std::thread::sleep(Duration::from_millis(300));
    // The actor runs on (its memory is all in) and its next dump is whole.
    let sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));
    let written = suspend_written(&sys, ns, "s");
    assert!(
        written * 10 > whole * 9,
        "without tracking the dump must be whole: {written} bytes of {whole}"
    );
    assert_eq!(sys.worker_metric(INCREMENTAL), 0);
    assert_eq!(sys.worker_metric(TRACKING_LOST), 1);
    assert_eq!(
        sleeper_checksum(&get_ok(&sys, &target, "/")),
        sum,
        "memory after a whole dump of an actor whose tracking was lost"
    );
}

/// With frozen-in-place copies (the default): a tracked actor's suspend keeps it frozen and
/// re-arms its tracking, the next resume thaws it, and the suspend after that holds only what
/// was written since the thaw — built on a generation that may itself still be incremental.
/// Restored on the other worker (from the node-local generations, made whole on the way), it
/// has every byte.
#[test]
fn a_thawed_actor_suspends_what_it_wrote_since_the_thaw() {
    let ns = "ns-incr-frozen";
    let sys = System::up_with_env(UpOptions::default(), &[("ATE_INCREMENTAL_MIN_MIB", "0")]);
    sys_apply(&sys, ns, "sleeper", &Tpl::sleeper(64));
    create_actor(&sys, ns, "s", "sleeper");
    let target = format!("{ns}/s");
    let sum = sleeper_checksum(&get_ok(&sys, &target, "/"));
    // Cold-started: the first generation is whole. Then restored (lazily, tracked) on the other
    // worker, where no frozen copy is.
    let here = worker_of(&sys, ns, "s");
    suspend_written(&sys, ns, "s");
    pin_to_other_worker(&sys, ns, "s", &here);
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), sum);
    let sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));
    let first = suspend_written(&sys, ns, "s");
    assert_eq!(
        sys.worker_metric(INCREMENTAL),
        1,
        "restored, then suspended"
    );
    // Thawed in place (its frozen copy), written again, suspended again: only that.
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), sum);
    assert!(
        sys.worker_metric("ate_worker_thaws_total{outcome=\"ok\"}") >= 1,
        "the resume did not thaw the frozen copy"
    );
    let sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));
    let here = worker_of(&sys, ns, "s");
    let second = suspend_written(&sys, ns, "s");
    assert_eq!(sys.worker_metric(INCREMENTAL), 2, "thawed, then suspended");
    assert!(
        second < 4 * first,
        "after the thaw the suspend wrote {second} bytes, the one before {first}"
    );
    // Restored from the node-local generations on the other worker: every byte.
    pin_to_other_worker(&sys, ns, "s", &here);
    assert_eq!(
        sleeper_checksum(&get_ok(&sys, &target, "/")),
        sum,
        "memory restored from a generation built on a frozen-in-place dump"
    );
}

/// A worker killed while a tracked actor runs: the restarted worker re-adopts the sandbox (its
/// page source said `done` when every page was in, although it keeps running to track), the
/// actor's memory continues, and its next suspend is whole (the tracking of a restore by an
/// earlier worker process is not trusted).
#[test]
fn a_restarted_worker_readopts_a_tracked_actor_and_dumps_it_whole() {
    let ns = "ns-incr-adopt";
    let sys = System::up_with_env(
        UpOptions::with_workers(1),
        &[("ATE_KEEP_FROZEN", "0"), ("ATE_INCREMENTAL_MIN_MIB", "0")],
    );
    let (target, whole) = restored_sleeper(&sys, ns);
    let sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));

    let worker = sys.pid_of("worker-1").expect("worker-1 runs");
    kill_9(worker);
    // Served again by the restarted worker, by the same sandbox: not restored from the
    // generation (which would give the checksum before /dirty).
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let (status, _, body) = get(sys.router_addr, &target, "/");
        if status == 200 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "not served after the worker's restart: {status} {body}\n{}",
            sys.log("worker-1")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        sleeper_checksum(&body),
        sum,
        "the re-adopted actor's memory\n{}",
        sys.log("worker-1")
    );
    let sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));
    let written = suspend_written(&sys, ns, "s");
    assert!(
        written * 10 > whole * 9,
        "a re-adopted actor's dump must be whole: {written} bytes of {whole}"
    );
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), sum);
}

/// Below the worker's threshold (`--incremental-min-mib`, 128 MiB by default) a tracked actor
/// is dumped whole: that costs little, and its next resume need not wait for a flatten.
#[test]
fn a_small_actor_is_dumped_whole_by_default() {
    let ns = "ns-incr-small";
    let sys = System::up_with_env(UpOptions::default(), &[("ATE_KEEP_FROZEN", "0")]);
    let (target, whole) = restored_sleeper(&sys, ns);
    let sum = dirtied_checksum(&get_ok(&sys, &target, "/dirty?percent=1"));
    let written = suspend_written(&sys, ns, "s");
    assert!(written * 10 > whole * 9, "{written} bytes of {whole}");
    assert_eq!(sys.worker_metric(INCREMENTAL), 0);
    assert_eq!(
        sys.worker_metric("ate_worker_incremental_checkpoints_total{dump=\"small\"}"),
        1
    );
    assert_eq!(sleeper_checksum(&get_ok(&sys, &target, "/")), sum);
}
