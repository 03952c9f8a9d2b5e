//! The short fault suite (`ate bench faults --short`) end to end: the bench starts its own
//! system on private loopback addresses and ports in a temp state dir, injects each fault under a
//! client load and checks that no actor loses state or runs on two workers.

mod support;

use std::path::Path;
use std::process::Command;

const INITDB: &str = "/usr/lib/postgresql/15/bin/initdb";

/// Why this host cannot run the suite, if it cannot: it needs root (runc, network namespaces,
/// mounts, kill -9 of the system's components) and runc + CRIU.
fn cannot_run() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (runc, network namespaces, a tmpfs mount)".into());
    }
    ["runc", "criu"]
        .into_iter()
        .find(|t| !support::on_path(t))
        .map(|t| format!("{t} is not installed"))
}

#[test]
fn fault_suite_short() {
    if let Some(why) = cannot_run() {
        eprintln!("skipping fault_suite_short: {why}");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("faults.json");
    let mut cmd = Command::new(support::ATE);
    cmd.args([
        "bench",
        "faults",
        "--short",
        "--actors",
        "8",
        "--images-dir",
    ])
    .arg(support::images_dir())
    .arg("--out")
    .arg(&out);
    // The bench's own PostgreSQL adds store-down-12s; the store stays SQLite without it.
    if Path::new(INITDB).exists() {
        cmd.arg("--private-postgres");
    }
    let output = cmd.output().expect("run ate bench faults");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "ate bench faults failed ({}):\n{stdout}\n{stderr}",
        output.status
    );

    let text = std::fs::read_to_string(&out).expect("faults.json");
    let report: serde_json::Value = serde_json::from_str(&text).expect("faults.json is JSON");
    let rows = report["faults"].as_array().expect("faults rows");
    assert!(
        rows.len() >= 6,
        "the short suite has 6 faults or more: {text}"
    );
    for row in rows {
        let fault = row["fault"].as_str().unwrap_or("?");
        assert_eq!(row["states_lost"], 0, "{fault}: states lost: {row:#}");
        assert_eq!(
            row["double_activations"], 0,
            "{fault}: double activations: {row:#}"
        );
        assert_eq!(
            row["gone_with_sandboxes"], 0,
            "{fault}: a worker marked gone while its sandboxes ran: {row:#}"
        );
        assert_eq!(
            row["stuck"], false,
            "{fault}: an actor never answered again: {row:#}"
        );
    }
    // kill -9 of `ate up` and a new one at once, 0.3, 1.5 and 5 s later, while the old components may
    // still be stopping (the full 20 trials: `ate bench faults --only kill-up-overlap
    // --trials 20`, figures in docs/reliability.md).
    let delays: Vec<f64> = rows
        .iter()
        .filter(|r| r["fault"] == "kill-up-overlap")
        .filter_map(|r| r["delay_s"].as_f64())
        .collect();
    assert_eq!(delays, [0.0, 0.3, 1.5, 5.0], "{text}");
    assert_eq!(report["kill_up_overlap_trials"]["passed"], 4, "{text}");
}
