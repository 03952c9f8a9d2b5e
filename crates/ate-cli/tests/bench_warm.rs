//! `ate bench warm --baseline nginx` end to end (issue 18): a real `ate up`, Debian's nginx
//! started by the bench inside the actor's network namespace, h2load as the load generator for
//! both paths. Checks that both paths answered (no errors, requests counted), that the comparison
//! is in the JSON, and that the bench stopped its nginx.

mod support;

use std::path::Path;

use support::*;

fn installed(binary: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
        .iter()
        .any(|dir| Path::new(dir).join(binary).is_file())
}

/// Processes whose command line mentions `needle` (nginx shows its `-p <dir>` there).
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(needle) && !text.contains("bench_warm") {
                found.push(text);
            }
        }
    }
    found
}

#[test]
fn warm_bench_measures_the_router_beside_nginx() {
    // scripts/setup.sh installs both; a machine without them cannot run this comparison at all.
    assert!(
        installed("nginx") && installed("h2load"),
        "nginx and h2load are needed (scripts/setup.sh installs nginx-light and nghttp2-client)"
    );
    let sys = System::up(UpOptions::with_workers(1));
    let (stdout, json) = sys.bench(
        &[
            "warm",
            "--seconds",
            "1",
            "--rounds",
            "1",
            "--concurrency",
            "2,4",
            "--baseline",
            "nginx",
            "--generator",
            "h2load",
        ],
        "warm.json",
    );
    assert!(
        stdout.contains("router → atunnel → actor / nginx → actor (plain reverse proxy): req/s ×"),
        "{stdout}"
    );

    let sides = json["sides"].as_array().unwrap();
    // direct, router and nginx at each of the two connection counts.
    assert_eq!(sides.len(), 6, "{json:#}");
    for side in sides {
        let m = &side["median"];
        assert_eq!(m["errors"], 0, "{side:#}");
        assert!(m["requests"].as_u64().unwrap() > 0, "{side:#}");
        assert!(m["rps"].as_f64().unwrap() > 0.0, "{side:#}");
        assert!(
            m["max_ms"].as_f64().unwrap() >= m["p99_ms"].as_f64().unwrap(),
            "{side:#}"
        );
    }
    let comparisons = json["baseline_comparisons"].as_array().unwrap();
    assert_eq!(comparisons.len(), 2, "{json:#}");
    assert_eq!(comparisons[0]["concurrency"], 2);
    assert_eq!(comparisons[1]["concurrency"], 4);
    assert!(comparisons[0]["rps_ratio"].as_f64().unwrap() > 0.0);
    assert!(sys.dir.path().join("warm.svg").is_file());

    // The bench's nginx (its prefix is ate-bench-nginx-<pid>) is gone.
    let left = processes_with("ate-bench-nginx-");
    assert!(left.is_empty(), "nginx left running: {left:?}");
}

#[test]
fn connection_counts_are_checked_before_anything_is_sent() {
    let ate = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ate"))
            .args(args)
            .env("ATE_API", "127.0.0.1:9")
            .env("ATE_ROUTER", "http://127.0.0.1:9")
            .env_remove("ATE_STATE_DIR")
            .output()
            .expect("run ate")
    };
    for bad in ["0", "16,x", "100000"] {
        let out = ate(&["bench", "warm", "--concurrency", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--concurrency"), "{bad}: {err}");
    }
}
