//! Everyday CLI use, end to end: `-A` on every namespaced `get`, `apply`'s created / configured /
//! unchanged, the client flags before or after the verb (and not in the servers' help),
//! `logs --tail`, `--since` and `--timestamps`, and `get actors -o wide`.
//!
//! The first tests need only an `ate api` process; the last one runs a whole system (`ate up`)
//! with real actors.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::*;

/// An `ate api` on loopback with its own SQLite store, killed on drop.
struct Api {
    process: api_process::ApiProcess,
}

impl Api {
    fn start() -> Api {
        Api {
            process: api_process::ApiProcess::start(),
        }
    }

    /// `ate ARGS` with `--api` placed by the caller (nothing added).
    fn raw(&self, args: &[&str]) -> Output {
        Command::new(ATE)
            .args(args)
            .env_remove("ATE_API")
            .output()
            .expect("run ate")
    }

    /// `ate --api <this> ARGS`.
    fn ate(&self, args: &[&str]) -> Output {
        let mut all = vec!["--api", self.process.addr.as_str()];
        all.extend_from_slice(args);
        self.raw(&all)
    }

    fn ok(&self, args: &[&str]) -> String {
        stdout_ok(self.ate(args), args)
    }
}

fn stdout_ok(out: Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "ate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr_of_failure(out: Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should fail, printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An atespace and a counter template in it, as `apply -f` takes them.
fn template_yaml(ns: &str, name: &str, memory: &str) -> String {
    format!(
        "{head}spec:
  sandboxClass: runc
  containers:
    - name: counter
      image: oci-layout:/var/lib/ate/images/counter:latest
      command: [\"/counter\"]
  resources: {{cpu: 250m, memory: {memory}}}
  snapshots: {{fidelity: memory}}
",
        head = actors::template_head(ns, name),
    )
}

fn write(dir: &Path, file: &str, text: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write yaml");
    path.to_str().expect("utf-8 path").to_string()
}

/// First column of each table row (the header skipped).
fn first_column(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn apply_says_created_configured_or_unchanged() {
    let api = Api::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let small = write(
        dir.path(),
        "small.yaml",
        &template_yaml("ev-a", "t", "64Mi"),
    );
    let big = write(dir.path(), "big.yaml", &template_yaml("ev-a", "t", "128Mi"));

    assert_eq!(
        api.ok(&["apply", "-f", &small]),
        "atespace/ev-a created\nactortemplate/ev-a/t created\n"
    );
    assert_eq!(
        api.ok(&["apply", "-f", &small]),
        "atespace/ev-a unchanged\nactortemplate/ev-a/t unchanged\n"
    );
    assert_eq!(
        api.ok(&["apply", "-f", &big]),
        "atespace/ev-a unchanged\nactortemplate/ev-a/t configured\n"
    );
    // The change is in the store; the same file again changes nothing.
    let table = api.ok(&["get", "templates", "-a", "ev-a"]);
    assert!(table.contains("128Mi"), "{table}");
    assert_eq!(
        api.ok(&["apply", "-f", &big, "-o", "json"]),
        "[\n  \"atespace/ev-a unchanged\",\n  \"actortemplate/ev-a/t unchanged\"\n]\n"
    );
    // Back to the first spec: configured again; a deleted template is created again.
    assert!(api.ok(&["apply", "-f", &small]).ends_with("t configured\n"));
    api.ok(&["delete", "template", "ev-a/t"]);
    assert!(api.ok(&["apply", "-f", &small]).ends_with("t created\n"));
}

#[test]
fn one_template_by_name() {
    let api = Api::start();
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, memory) in [("t", "64Mi"), ("u", "128Mi")] {
        let f = write(
            dir.path(),
            &format!("{name}.yaml"),
            &template_yaml("ev-a", name, memory),
        );
        api.ok(&["apply", "-f", &f]);
    }
    let table = api.ok(&["get", "templates", "u", "-a", "ev-a"]);
    assert_eq!(first_column(&table), ["ev-a"], "{table}");
    assert!(
        table.contains("128Mi") && !table.contains("64Mi"),
        "{table}"
    );
    // As a document `apply -f` takes back.
    let yaml = api.ok(&["get", "templates", "t", "-a", "ev-a", "-o", "yaml"]);
    assert!(
        yaml.contains("name: t") && !yaml.contains("name: u"),
        "{yaml}"
    );
    // A name needs its atespace; an unknown one is named in the error.
    let err = stderr_of_failure(api.ate(&["get", "templates", "t"]), "a name without -a");
    assert!(err.contains("needs -a ATESPACE"), "{err}");
    let err = stderr_of_failure(
        api.ate(&["get", "templates", "nope", "-a", "ev-a"]),
        "an unknown template",
    );
    assert!(err.contains("nope") && err.contains("NotFound"), "{err}");
}

#[test]
fn namespaced_gets_take_all_atespaces() {
    let api = Api::start();
    let dir = tempfile::tempdir().expect("tempdir");
    for ns in ["ev-a", "ev-b"] {
        let f = write(
            dir.path(),
            &format!("{ns}.yaml"),
            &template_yaml(ns, "t", "64Mi"),
        );
        api.ok(&["apply", "-f", &f]);
        api.ok(&["create", "actor", "x", "-a", ns, "-t", &format!("{ns}/t")]);
    }
    let both = vec!["ev-a".to_string(), "ev-b".to_string()];
    for what in ["actors", "templates"] {
        assert_eq!(first_column(&api.ok(&["get", what, "-A"])), both, "{what}");
        assert_eq!(
            first_column(&api.ok(&["get", what, "--all-atespaces"])),
            both,
            "{what}"
        );
        assert_eq!(
            first_column(&api.ok(&["get", what, "-a", "ev-b"])),
            ["ev-b"],
            "{what}"
        );
        let err = stderr_of_failure(api.ate(&["get", what, "-a", "ev-a", "-A"]), "-a with -A");
        assert!(err.contains("cannot be used with"), "{err}");
    }
    // Tags need a snapshot (see the system test); here: -A is taken, the table is empty.
    assert_eq!(
        api.ok(&["get", "tags", "-A"]),
        "ATESPACE   NAME   ACTOR   GENERATION   FIDELITY\n"
    );
    let err = stderr_of_failure(api.ate(&["get", "tags", "-a", "ev-a", "-A"]), "-a with -A");
    assert!(err.contains("cannot be used with"), "{err}");
    // Listing atespaces or workers has no atespace to choose.
    let err = stderr_of_failure(api.ate(&["get", "workers", "-A"]), "get workers -A");
    assert!(err.contains("unexpected argument"), "{err}");
    // Help texts say the same for each.
    for what in ["actors", "templates", "tags"] {
        let help = stdout_ok(api.raw(&["get", what, "--help"]), &[what]);
        // The same words on each flag's line (the column they start at depends on the
        // command's longest flag).
        let line_of = |flag: &str| {
            help.lines()
                .find(|l| l.trim_start().starts_with(flag))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            line_of("-A, --all-atespaces")
                .ends_with(" Every atespace (also what you get without -a)"),
            "{help}"
        );
        assert!(
            line_of("-a, --atespace <ATESPACE>").ends_with(" Only this atespace"),
            "{help}"
        );
    }
}

/// Client flags: before or after the verb, and at any depth of it.
#[test]
fn client_flags_work_before_and_after_the_verb() {
    let api = Api::start();
    api.ok(&["create", "atespace", "ev-flags"]);
    let addr = api.process.addr.as_str();
    for args in [
        vec!["--api", addr, "get", "atespaces", "-o", "json"],
        vec!["get", "atespaces", "--api", addr, "-o", "json"],
        vec!["get", "--api", addr, "atespaces", "-o", "json"],
        vec!["-o", "json", "get", "atespaces", "--api", addr],
        vec!["get", "-o", "json", "atespaces", "--api", addr],
    ] {
        let out = stdout_ok(api.raw(&args), &args);
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v[0]["name"], "ev-flags", "{args:?}");
    }
    // The flag after the verb wins over ATE_API, as on the root.
    let out = Command::new(ATE)
        .args(["get", "atespaces", "--api", addr])
        .env("ATE_API", "127.0.0.1:1")
        .output()
        .expect("run ate");
    assert!(stdout_ok(out, &[]).contains("ev-flags"));
    // A verb that prints nothing formatted takes the connection flags, not -o.
    let err = stderr_of_failure(
        api.raw(&[
            "delete", "atespace", "ev-flags", "-o", "json", "--api", addr,
        ]),
        "delete -o",
    );
    assert!(err.contains("unexpected argument '-o'"), "{err}");
    api.ok(&["delete", "atespace", "ev-flags"]);
}

#[test]
fn servers_do_not_list_the_client_flags() {
    let help = |args: &[&str]| {
        let out = Command::new(ATE)
            .args(args)
            .output()
            .expect("run ate --help");
        stdout_ok(out, args)
    };
    // What only the client flags' help says (node and router have an `--api` of their own).
    let client_only = [
        "Connection to the api",
        "the address `ate up` wrote",
        "--cert <CERT>",
        "--key <KEY>",
        "--ca <CA>",
        "--token <TOKEN>",
        "--api-trust-domain",
        "--output",
    ];
    for server in ["api", "router", "node", "worker", "up"] {
        let text = help(&[server, "--help"]);
        for flag in client_only {
            assert!(
                !text.contains(flag),
                "`ate {server} --help` lists {flag}:\n{text}"
            );
        }
        // And they are refused there.
        let out = Command::new(ATE)
            .args([server, "--token", "x", "--help"])
            .output()
            .expect("run ate");
        let err = stderr_of_failure(out, "a client flag on a server");
        assert!(err.contains("unexpected argument '--token'"), "{err}");
    }
    for verb in [
        &["get", "actors"][..],
        &["apply"],
        &["create", "actor"],
        &["logs", "actor"],
        &["token", "list"],
        &["delete", "actor"],
    ] {
        let mut args = verb.to_vec();
        args.push("--help");
        let text = help(&args);
        for flag in client_only
            .iter()
            .filter(|f| !(**f == "--output" && matches!(verb[0], "logs" | "delete")))
        {
            assert!(
                text.contains(flag),
                "`ate {verb:?} --help` lacks {flag}:\n{text}"
            );
        }
    }
    // The root keeps them, for `ate --api X VERB`.
    let root = help(&["--help"]);
    for flag in client_only {
        assert!(root.contains(flag), "`ate --help` lacks {flag}");
    }
}

#[test]
fn logs_reject_a_bad_since_duration() {
    let out = Command::new(ATE)
        .args(["logs", "actor", "a", "-a", "b", "--since", "soon"])
        .output()
        .expect("run ate");
    let err = stderr_of_failure(out, "--since soon");
    assert!(err.contains("invalid value 'soon'"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// With a whole system: real actors, their logs, a tag and a last error.

fn actor_json(sys: &System, ns: &str, name: &str) -> serde_json::Value {
    let json = sys.ate_ok(&["get", "actors", name, "-a", ns, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v[0].clone()
}

/// Polls `what` until it returns Some, for at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    ate_test_support::wait::wait_for(what, limit, Duration::from_millis(100), f)
}

/// A child process killed (and reaped) on drop, so a failing assertion leaves nothing behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn tail_wide_and_tags_on_a_running_system() {
    let sys = System::up(UpOptions::with_workers(1));
    let ns = "ate-demo";
    let target = format!("{ns}/l1");
    sys.ate_ok(&["create", "actor", "l1", "-a", ns, "-t", "ate-demo/counter"]);
    for _ in 0..5 {
        let (status, head, body) = get(sys.router_addr, &target, "/");
        assert_eq!(status, 200, "{head}\n{body}\n{}", sys.log("router"));
    }
    // The log relay writes asynchronously: wait until the fifth line is there.
    let full = wait_for(
        Duration::from_secs(10),
        "counted request 5 in the log",
        || {
            let log = sys.ate_ok(&["logs", "actor", "l1", "-a", ns]);
            log.contains("counted request 5\n").then_some(log)
        },
    );
    assert!(full.starts_with("counter listening on"), "{full}");

    // --tail N: the last N lines, through the api and from the file alike.
    let state = sys.state_dir();
    let state = state.to_str().expect("utf-8 path");
    for local in [false, true] {
        let mut base = vec!["logs", "actor", "l1", "-a", ns];
        if local {
            base.extend(["--state-dir", state]);
        }
        let tail = |n: &str| sys.ate_ok(&[&base[..], &["--tail", n]].concat());
        assert_eq!(
            tail("2"),
            "counted request 4\ncounted request 5\n",
            "local={local}"
        );
        assert_eq!(tail("0"), "", "local={local}");
        assert_eq!(tail("1000"), full, "local={local}");
    }

    // --timestamps: every line starts with the time it was written; without, the same text.
    let stamped = sys.ate_ok(&["logs", "actor", "l1", "-a", ns, "--timestamps"]);
    let mut unstamped = String::new();
    for l in stamped.lines() {
        let (at, rest) = ate_core::log_line::split(l);
        assert!(at.is_some(), "a line without its time: {l:?}");
        unstamped.push_str(rest);
        unstamped.push('\n');
    }
    assert_eq!(unstamped, full);
    // --since: the last hour is everything; the last second (a moment later) is nothing.
    assert_eq!(
        sys.ate_ok(&["logs", "actor", "l1", "-a", ns, "--since", "1h"]),
        full
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        sys.ate_ok(&["logs", "actor", "l1", "-a", ns, "--since", "1s"]),
        ""
    );

    // --tail 1 -f: the last line, then what the actor writes next.
    let mut follow = Reaped(
        Command::new(ATE)
            .args([
                "--api", &sys.api, "logs", "actor", "l1", "-a", ns, "--tail", "1", "-f",
            ])
            .env("ATE_STATE_DIR", sys.state_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ate logs -f"),
    );
    let stdout = follow.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = |what: &str| {
        rx.recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("no line from `ate logs -f` ({what})"))
    };
    assert_eq!(line("the tail"), "counted request 5");
    assert_eq!(get(sys.router_addr, &target, "/").0, 200);
    assert_eq!(line("a new request"), "counted request 6");
    drop(follow);

    // A tag, seen with -A and with its own atespace only.
    sys.ate_ok(&["suspend", "actor", "l1", "-a", ns]);
    sys.ate_ok(&["create", "tag", "t1", "-a", ns, "--actor", &target]);
    sys.ate_ok(&["create", "atespace", "ev-empty"]);
    let all = sys.ate_ok(&["get", "tags", "-A"]);
    assert_eq!(first_column(&all), [ns], "{all}");
    let row: Vec<&str> = all
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..3], [ns, "t1", "ate-demo/l1"], "{all}");
    assert_eq!(sys.ate_ok(&["get", "tags", "-a", ns]), all);
    assert_eq!(
        first_column(&sys.ate_ok(&["get", "tags", "-a", "ev-empty"])).len(),
        0
    );

    // -o wide: LAST ERROR, the first line of the reason only. The counter exits on request.
    let wide = sys.ate_ok(&["get", "actors", "-a", ns, "-o", "wide"]);
    assert!(
        wide.lines()
            .next()
            .unwrap_or_default()
            .ends_with("GENERATION   LAST ERROR"),
        "{wide}"
    );
    assert!(
        wide.lines().nth(1).unwrap_or_default().ends_with("   -"),
        "no error yet: {wide}"
    );
    let (status, _, body) = request(sys.router_addr, "POST", &target, "/exit?code=3", "");
    assert_eq!((status, body.trim()), (200, "exiting with code 3"));
    let a = wait_for(Duration::from_secs(10), "the exit recorded", || {
        let a = actor_json(&sys, ns, "l1");
        let why = a["lastError"].as_str().unwrap_or_default().to_string();
        why.contains("(code 3)").then_some(a)
    });
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(why.contains('\n'), "the reason carries log lines: {why}");
    let first_line = why.lines().next().unwrap_or_default();
    let wide = sys.ate_ok(&["get", "actors", "-a", ns, "-o", "wide"]);
    let row = wide.lines().nth(1).unwrap_or_default();
    assert_eq!(wide.lines().count(), 2, "one line per actor: {wide}");
    assert!(
        row.ends_with(&format!("   {first_line}…")),
        "LAST ERROR is the first line, marked as cut: {row}\nreason: {why}"
    );
    // The plain table is as before, without it.
    let table = sys.ate_ok(&["get", "actors", "-a", ns]);
    assert!(
        !table.contains("LAST ERROR") && !table.contains("exited"),
        "{table}"
    );
}
