//! `ate bench throughput`'s flags: the burst is the default, the resume/suspend loop needs
//! `--cycle`. Flag parsing only (no system needed).

use std::process::Command;

const ATE: &str = env!("CARGO_BIN_EXE_ate");

fn ate(args: &[&str]) -> std::process::Output {
    Command::new(ATE)
        .args(args)
        // Nothing here may reach a system: an unused port on loopback.
        .env("ATE_API", "127.0.0.1:9")
        .env("ATE_ROUTER", "http://127.0.0.1:9")
        .output()
        .expect("run ate")
}

#[test]
fn help_lists_the_burst_and_cycle_flags() {
    let out = ate(&["bench", "throughput", "--help"]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--actors",
        "--concurrency",
        "--cycle",
        "--seconds",
        "--suspenders",
        "--settle",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn cycle_flags_need_cycle() {
    for flag in [["--seconds", "10"], ["--suspenders", "4"]] {
        let out = ate(&["bench", "throughput", flag[0], flag[1]]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag:?}: {err}");
        assert!(err.contains("--cycle"), "{flag:?}: {err}");
    }
}

#[test]
fn settle_is_for_the_burst_and_bounded() {
    let out = ate(&["bench", "throughput", "--cycle", "--settle", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--settle") && err.contains("--cycle"), "{err}");

    // Out of range or not a number: a usage error, before anything is sent.
    for bad in ["--settle=-1", "--settle=601", "--settle=soon"] {
        let out = ate(&["bench", "throughput", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--settle"), "{bad}: {err}");
    }
}
