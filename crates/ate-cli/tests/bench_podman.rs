//! `ate bench resume --baseline podman` end to end (issue 32): a real `ate up` and Debian's
//! podman, the same sleeper image checkpointed and restored by both on the same CRIU, rounds
//! interleaved. Checks that both sides answered every round, that the comparison is in the
//! JSON, and that the bench removed its podman container and its network namespace name.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

#[test]
fn resume_bench_measures_the_substrate_beside_podman() {
    // scripts/setup.sh installs podman; a machine without it cannot run this comparison.
    assert!(
        Path::new("/usr/bin/podman").is_file(),
        "podman is needed (scripts/setup.sh installs it)"
    );
    let sys = System::up(UpOptions::with_workers(1));
    let (stdout, json) = sys.bench(
        &[
            "resume",
            "--concurrency",
            "1",
            "--rounds",
            "2",
            "--memory",
            "8MiB",
            "--settle",
            "0",
            "--baseline",
            "podman",
        ],
        "resume.json",
    );
    assert!(
        stdout.contains("Beside podman (8 MiB sleeper, 2 rounds)"),
        "{stdout}"
    );

    let b = &json["baseline"];
    assert_eq!(b["baseline"], "podman", "{json:#}");
    let rounds = b["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{json:#}");
    for r in rounds {
        for key in [
            "suspend_seconds",
            "resume_seconds",
            "podman_checkpoint_seconds",
            "podman_restore_seconds",
            "podman_first_answer_seconds",
        ] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key}: {r:#}");
        }
        assert!(
            r["podman_first_answer_seconds"].as_f64() >= r["podman_restore_seconds"].as_f64(),
            "{r:#}"
        );
    }
    assert!(b["resume_ratio"].as_f64().unwrap() > 0.0, "{json:#}");
    assert!(b["suspend_ratio"].as_f64().unwrap() > 0.0, "{json:#}");

    // Nothing of the baseline is left: no container, no namespace name.
    let names = Command::new("podman")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()
        .expect("podman ps");
    let names = String::from_utf8_lossy(&names.stdout);
    assert!(
        !names.lines().any(|n| n.starts_with("ate-bench-sleeper-")),
        "podman containers left: {names}"
    );
    let netns = std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("ate-bench-sleeper-")
                })
                .count()
        })
        .unwrap_or(0);
    assert_eq!(netns, 0, "namespace names left in /var/run/netns");
}
