//! Runs the README's commands: the quickstart script (from a state dir that does not exist yet)
//! and the three lines that create an actor and call it through the router with curl.
//!
//! The quickstart runs with the user-facing defaults except: packages are not installed again
//! (CI's `.ci/run` just did), the `ate` nextest already built is installed instead of a release
//! build, and it goes into a temp dir instead of /usr/local/bin. The second README command is the test
//! command itself, so it is checked for presence, not run recursively.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The ```sh blocks of the README, in order.
fn sh_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start().starts_with("```")) {
            (None, true) if line.trim() == "```sh" => current = Some(Vec::new()),
            (Some(_), true) => blocks.push(current.take().unwrap_or_default()),
            (Some(block), false) if !line.trim().is_empty() => block.push(line.trim().to_string()),
            _ => {}
        }
    }
    blocks
}

#[test]
fn readme_quickstart_and_first_actor() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let blocks = sh_blocks(&readme);
    assert_eq!(
        blocks.len(),
        3,
        "the README has three command blocks: {blocks:?}"
    );
    assert_eq!(blocks[0], ["scripts/quickstart.sh"]);
    assert_eq!(blocks[1], ["scripts/test.sh"]);
    let ci = std::fs::read_to_string(root().join(".ci/run")).expect(".ci/run");
    assert!(
        ci.contains("scripts/test.sh"),
        ".ci/run runs the README's test command"
    );

    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("state-does-not-exist-yet");
    let bin = tmp.path().join("bin");
    // Private ports and worker addresses, so the suite passes beside a quickstart a person left
    // running on the defaults (the quickstart script passes extra arguments on to `ate up`).
    let router = format!("127.0.0.1:{}", support::free_port());
    let worker_ip = format!("127.{}.250.2", 1 + std::process::id() % 200);
    let mut up = Command::new("bash")
        .arg(root().join(&blocks[0][0]))
        .args([
            "--api-listen",
            "127.0.0.1:0",
            "--api-http-listen",
            "127.0.0.1:0",
        ])
        .args(["--router-listen", &router])
        .args([
            "--router-metrics-listen",
            &format!("127.0.0.1:{}", support::free_port()),
        ])
        .args([
            "--node-listen",
            &format!("127.0.0.1:{}", support::free_port()),
        ])
        .args(["--worker-first-ip", &worker_ip])
        .args(["--worker-port", &support::free_port().to_string()])
        .current_dir(root())
        .env("ATE_SKIP_SETUP", "1")
        // The binary nextest built: a `cargo build` here would relink target/debug/ate (other
        // feature unification) while tests running in parallel execute it.
        .env("ATE_BINARY", env!("CARGO_BIN_EXE_ate"))
        .env("ATE_INSTALL_DIR", &bin)
        .env("ATE_STATE_DIR", &state)
        .env("HOME", tmp.path())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(tmp.path().join("quickstart.log")).expect("log"))
        .spawn()
        .expect("run quickstart");
    let stdout = up.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let start = Instant::now();
    let ready = loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200))
            && line.starts_with("ate up: ready")
        {
            break line;
        }
        if let Ok(Some(status)) = up.try_wait() {
            let log =
                std::fs::read_to_string(tmp.path().join("quickstart.log")).unwrap_or_default();
            panic!("quickstart exited ({status}):\n{log}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "quickstart not ready in 300 s"
        );
    };
    assert!(
        ready.contains(&format!("router=http://{router}")),
        "{ready}"
    );

    // The three lines, as written, with the installed `ate` first on PATH.
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut outputs = Vec::new();
    for line in &blocks[2] {
        // The README's lines as written, but for the router on its private port.
        assert!(
            !line.contains("curl") || line.contains("http://127.0.0.1:8080/"),
            "the README's curl lines name the default router address: {line}"
        );
        let line = line.replace("http://127.0.0.1:8080/", &format!("http://{router}/"));
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &line])
            .env("PATH", &path)
            .env("ATE_STATE_DIR", &state)
            .env("HOME", tmp.path());
        outputs.push(support::run_ok(&mut cmd, &format!("`{line}`")));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &up.id().to_string()])
        .status();
    let _ = up.wait();
    assert!(
        outputs[1].contains(
            "preserved memory count: 1 | preserved file counter: 1 | preserved rootfs counter: 1"
        ),
        "{}",
        outputs[1]
    );
    assert!(
        outputs[2].contains(
            "preserved memory count: 2 | preserved file counter: 2 | preserved rootfs counter: 2"
        ),
        "{}",
        outputs[2]
    );
}
