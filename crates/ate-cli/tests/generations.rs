//! Choosing the generation to return to, end to end (real runc + CRIU through `ate up`): the
//! newest generation damaged in both its copies crashes the actor, `ate get generations` shows
//! it damaged, `ate revert actor` goes back to the generation before it (the counts continue
//! from there), `--generation` picks an older one, and bad choices are refused.

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::actors::*;
use support::generations::*;
use support::*;

/// `ate get generations actor NAME -a NS -o json`.
fn generations(sys: &System, ns: &str, name: &str) -> Vec<Value> {
    let json = sys.ate_ok(&["get", "generations", "actor", name, "-a", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v.as_array().cloned().unwrap_or_default()
}

/// (generation, status, skipped, next) of each generation, newest first.
fn summary(sys: &System, ns: &str, name: &str) -> Vec<(u64, String, bool, bool)> {
    generations(sys, ns, name)
        .iter()
        .map(|g| {
            (
                g["generation"].as_u64().unwrap_or(0),
                g["status"].as_str().unwrap_or_default().to_string(),
                g["skipped"].as_bool().unwrap_or(false),
                g["next"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

fn intact(generation: u64, skipped: bool, next: bool) -> (u64, String, bool, bool) {
    (generation, "intact".into(), skipped, next)
}

/// `ate revert actor NAME -a NS ARGS…` that must fail: its stderr.
fn refused(sys: &System, ns: &str, name: &str, args: &[&str]) -> String {
    let mut all = vec!["revert", "actor", name, "-a", ns];
    all.extend_from_slice(args);
    let out = sys.ate(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "ate {all:?} succeeded: {stderr}");
    stderr
}

/// The durable copy of generation `generation` of `ns/name` in the system's `file://` store.
fn durable_dir(sys: &System, ns: &str, name: &str, generation: u64) -> PathBuf {
    let store = sys.state_dir().join("durable");
    durable_manifest(&store, ns, name, generation)
        .and_then(|m| m.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| panic!("generation {generation} of {ns}/{name} has no durable copy"))
}

/// Damages `rootfs.tar` of a generation in both copies, so nothing can heal it: one byte flipped
/// in the node-local file, and the durable object replaced by another file's (valid zstd, other
/// content). A restore checks that file in full before the actor gets ingress.
fn damage_rootfs_in_both_copies(sys: &System, ns: &str, name: &str, generation: u64) {
    let local = generation_dir(&sys.state_dir(), ns, name, generation).join("rootfs.tar");
    let mut bytes = std::fs::read(&local).expect("read rootfs.tar");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&local, bytes).expect("write rootfs.tar");
    let durable = durable_dir(sys, ns, name, generation);
    std::fs::copy(
        durable.join("volumes").join("data.tar.zst"),
        durable.join("rootfs.tar.zst"),
    )
    .expect("replace the durable rootfs.tar");
}

#[test]
fn a_damaged_newest_generation_is_skipped_by_revert_and_an_older_one_can_be_chosen() {
    // One worker, no frozen copies: every resume restores (and verifies) a generation on disk.
    let sys = one_worker_restoring(None);
    let ns = "ns-gens";
    counter_actor(&sys, ns, "counter", "c");
    let target = format!("{ns}/c");
    let out = sys.ate_ok(&["get", "generations", "actor", "c", "-a", ns]);
    assert_eq!(out.trim(), format!("actor {ns}/c has no generation yet"));

    // Three suspends with their durable copies: generation N holds the counts N.
    for n in 1..=3 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
        sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    }
    // Retention keeps the newest and the one before it (what a revert goes back to).
    assert_eq!(
        summary(&sys, ns, "c"),
        [intact(3, false, true), intact(2, false, false)]
    );
    let listed = generations(&sys, ns, "c");
    for g in &listed {
        assert_eq!(g["durable"], "COMPLETED", "{g}");
        assert_eq!(g["fidelity"], "memory", "{g}");
        assert_eq!(g["localUsable"], true, "{g}");
        assert!(
            g["node"].as_str().is_some_and(|n| !n.is_empty()),
            "the node keeping it: {g}"
        );
        assert!(
            g["created"].as_str().is_some_and(|c| c.ends_with('Z')),
            "{g}"
        );
    }
    let table = sys.ate_ok(&["get", "generations", "actor", "c", "-a", ns]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    for column in "GENERATION CREATED FIDELITY LOCAL DURABLE STATUS NEXT REASON".split(' ') {
        assert!(lines[0].contains(column), "{table}");
    }
    let row3: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row3[0], "3", "{table}");
    assert!(
        row3.contains(&"COMPLETED") && row3.contains(&"intact") && row3.contains(&"*"),
        "{table}"
    );
    assert!(!lines[2].contains('*'), "only 3 is next: {table}");

    // Generation 3 damaged beyond repair: the next request crashes the actor.
    damage_rootfs_in_both_copies(&sys, ns, "c", 3);
    let (status, head, body) = get(sys.router_addr, &target, "/");
    assert_ne!(
        status, 200,
        "a damaged generation must never serve: {head}\n{body}"
    );
    let why = crash_reason(&sys, ns, "c");
    assert!(
        why.contains("rootfs.tar"),
        "lastError names the file: {why}"
    );

    // Both copies are marked damaged, each with what was found; 2 is what a resume would take.
    assert_eq!(
        summary(&sys, ns, "c"),
        [
            (3, "damaged".to_string(), false, false),
            intact(2, false, true)
        ]
    );
    let g3 = &generations(&sys, ns, "c")[0];
    for copy in ["localDamage", "durableDamage"] {
        assert!(
            g3[copy].as_str().is_some_and(|d| d.contains("rootfs.tar")),
            "{copy}: {g3}"
        );
    }
    let table = sys.ate_ok(&["get", "generations", "actor", "c", "-a", ns]);
    let row3 = table.lines().nth(1).unwrap_or_default();
    assert!(
        row3.contains("(damaged)") && row3.contains("damaged") && row3.contains("rootfs.tar"),
        "{table}"
    );

    // Bad choices are refused and change nothing.
    let before = (actor(&sys, ns, "c"), summary(&sys, ns, "c"));
    let e = refused(&sys, ns, "c", &["--generation", "3"]);
    assert!(
        e.contains("generation 3 of actor ns-gens/c is damaged")
            && e.contains("FailedPrecondition"),
        "{e}"
    );
    let e = refused(&sys, ns, "c", &["--generation", "9"]);
    assert!(
        e.contains("actor ns-gens/c has no generation 9 (it has 3, 2;") && e.contains("NotFound"),
        "{e}"
    );
    // Generation 1 was dropped by retention when 3 was written.
    let e = refused(&sys, ns, "c", &["--generation", "1"]);
    assert!(e.contains("has no generation 1"), "{e}");
    let e = refused(&sys, ns, "c", &["--generation", "0"]);
    assert!(e.contains("--generation must be at least 1"), "{e}");
    let e = refused(&sys, ns, "c", &["--generation", "two"]);
    assert!(e.contains("invalid value 'two'"), "{e}");
    assert_eq!((actor(&sys, ns, "c"), summary(&sys, ns, "c")), before);

    // The default revert goes back to the newest intact generation; 3 is kept but skipped.
    let out = sys.ate_ok(&["revert", "actor", "c", "-a", ns]);
    assert!(out.contains("SUSPENDED"), "{out}");
    assert_eq!(
        summary(&sys, ns, "c"),
        [
            (3, "damaged".to_string(), true, false),
            intact(2, false, true)
        ]
    );
    // Memory, files and rootfs continue from generation 2 (which held 2).
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (3, 3, 3));
    let a = actor(&sys, ns, "c");
    assert_eq!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
    assert!(a.get("lastError").is_none(), "{a}");

    // A revert to a chosen generation needs the actor suspended.
    let e = refused(&sys, ns, "c", &["--generation", "2"]);
    assert!(e.contains("suspend it first"), "{e}");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 4, 4));
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    // 4 holds the counts 4; the next suspend's retention dropped the damaged, skipped 3.
    assert_eq!(
        summary(&sys, ns, "c"),
        [intact(4, false, true), intact(2, false, false)]
    );

    // An explicit older generation: 4 is kept but skipped, and the counts continue from 2 again.
    sys.ate_ok(&["revert", "actor", "c", "-a", ns, "--generation", "2"]);
    assert_eq!(
        summary(&sys, ns, "c"),
        [intact(4, true, false), intact(2, false, true)]
    );
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (3, 3, 3));
    // The next suspend writes 5 (holding 3); retention drops 4, which that revert skipped.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns, "--durable"]);
    assert_eq!(
        summary(&sys, ns, "c"),
        [intact(5, false, true), intact(2, false, false)]
    );
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 4, 4));
}
