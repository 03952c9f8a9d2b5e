//! The `ate` binary against a real `ate api` process on loopback.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod support;

use support::ATE;
use support::api_process::ApiProcess;

fn ok(out: Output) -> String {
    support::stdout_of_success(out, "ate")
}

fn start_api() -> ApiProcess {
    start_api_logging("info")
}

fn start_api_logging(rust_log: &str) -> ApiProcess {
    ApiProcess::start_in(tempfile::tempdir().unwrap(), |cmd| {
        cmd.env("RUST_LOG", rust_log);
    })
}

fn ate(api: &ApiProcess, args: &[&str]) -> Output {
    Command::new(ATE)
        .arg("--api")
        .arg(&api.addr)
        .args(args)
        .output()
        .unwrap()
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/counter.yaml")
}

#[test]
fn apply_round_trips_and_verbs_work() {
    let api = start_api();
    let applied = ok(ate(&api, &["apply", "-f", example().to_str().unwrap()]));
    assert_eq!(
        applied,
        "atespace/team-a created\nactortemplate/team-a/counter created\n"
    );
    // Applying again is idempotent.
    let again = ok(ate(&api, &["apply", "-f", example().to_str().unwrap()]));
    assert_eq!(
        again,
        "atespace/team-a unchanged\nactortemplate/team-a/counter unchanged\n"
    );

    // `get templates -o yaml` gives back a document `apply -f` accepts, equal to what went in.
    let yaml = ok(ate(&api, &["get", "templates", "-o", "yaml"]));
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("back.yaml");
    std::fs::write(&back, &yaml).unwrap();
    let original: Vec<ate_core::Document> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(example()).unwrap()).unwrap();
    let returned: Vec<ate_core::Document> = serde_saphyr::from_multiple(&yaml).unwrap();
    let spec_of = |d: &ate_core::Document| match d {
        ate_core::Document::ActorTemplate(t) => {
            Some(ate_core::TemplateSpec::from_document(&t.spec).unwrap())
        }
        _ => None,
    };
    assert_eq!(returned.len(), 1);
    assert_eq!(spec_of(&returned[0]), spec_of(&original[1]));
    ok(ate(&api, &["apply", "-f", back.to_str().unwrap()]));

    let table = ok(ate(&api, &["get", "templates"]));
    assert!(table.starts_with("ATESPACE   NAME      IMAGE"), "{table}");
    assert!(table.contains("team-a     counter   oci-layout:/var/lib/ate/images/counter:latest   250m   64Mi     memory     300s"), "{table}");

    ok(ate(
        &api,
        &[
            "create",
            "actor",
            "c1",
            "-a",
            "team-a",
            "-t",
            "team-a/counter",
        ],
    ));
    let json = ok(ate(&api, &["get", "actors", "-a", "team-a", "-o", "json"]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["name"], "c1");
    assert_eq!(v[0]["state"], "ACTOR_STATE_SUSPENDED");
    let table = ok(ate(&api, &["get", "actors", "-A"]));
    assert_eq!(
        table.lines().nth(1).unwrap(),
        "team-a     c1     SUSPENDED   team-a/counter   -        0"
    );

    // No worker registered: resume fails with the api's message and a non-zero exit.
    let out = ate(&api, &["resume", "actor", "c1", "-a", "team-a"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no worker has room for the actor"));

    // Errors name the problem and exit non-zero.
    let out = ate(&api, &["get", "actors", "nope", "-a", "team-a"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("actor \"team-a/nope\" not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ate(&api, &["create", "atespace", "Bad_Name"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid atespace"));

    ok(ate(&api, &["delete", "actor", "c1", "-a", "team-a"]));
    ok(ate(&api, &["delete", "template", "team-a/counter"]));
    ok(ate(&api, &["delete", "atespace", "team-a"]));
    assert_eq!(
        ok(ate(&api, &["get", "atespaces"])),
        "NAME   ACTORS   RUNNING   CPU   MEMORY   CALLERS ALLOWED\n"
    );
}

#[test]
fn bad_documents_apply_nothing() {
    let api = start_api();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(example())
        .unwrap()
        .replace("memory: 64Mi", "memory: lots");
    std::fs::write(&file, text).unwrap();
    let out = ate(&api, &["apply", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.resources.memory"), "{err}");
    // The atespace in the same file was not created either.
    assert_eq!(
        ok(ate(&api, &["get", "atespaces"])),
        "NAME   ACTORS   RUNNING   CPU   MEMORY   CALLERS ALLOWED\n"
    );
    // Wrong apiVersion and unknown fields are refused with the document named.
    let text = std::fs::read_to_string(example())
        .unwrap()
        .replace("idleTimeout", "idleTimout");
    std::fs::write(&file, text).unwrap();
    let out = ate(&api, &["apply", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("idleTimout"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cli_without_api_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ATE)
        .args(["get", "actors", "-A"])
        .env("ATE_API", "127.0.0.1:1")
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the api at 127.0.0.1:1"));
}

/// `ate up --api-arg` reaches the api: a flag the api does not know stops the start-up, and the
/// error quotes the api's own complaint about that flag.
#[test]
fn ate_up_passes_api_args_to_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ATE)
        .args(["up", "--no-demo", "--workers", "1", "--state-dir"])
        .arg(dir.path().join("state"))
        .args([
            "--api-listen",
            "127.0.0.1:0",
            "--api-http-listen",
            "127.0.0.1:0",
            "--api-arg=--no-such-api-flag=1",
        ])
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("api exited during start-up"), "{err}");
    assert!(err.contains("--no-such-api-flag"), "{err}");
}

/// A component started with info lines off (`RUST_LOG=warn`) serves until it is told to stop:
/// the shutdown signal is not an argument of a log line that the level skips.
#[test]
fn a_component_with_info_logs_off_keeps_serving_until_sigterm() {
    let mut api = start_api_logging("warn");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        matches!(api.child.try_wait(), Ok(None)),
        "the api stopped by itself"
    );
    ok(ate(&api, &["get", "atespaces"]));
    let pid = nix::unistd::Pid::from_raw(api.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = api.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the api did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}
