//! Actor events end to end (issue 33, item 3), through `ate up` on real runc workers: every
//! change of an actor's state is recorded with its reason (resumed for which request, suspended
//! idle with the generation written, requested by whom, deleted), `ate get events` lists them,
//! and `ate get events --watch` / `ate get actors --watch` stream each change within a second.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::actors::*;
use support::*;

/// A running `ate ARGS` whose stdout lines arrive, with the wall-clock time (Unix ms) each was
/// read at, on `lines`.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<(i64, String)>,
}

impl Watch {
    fn start(sys: &System, args: &[&str]) -> Watch {
        let mut child = Command::new(ATE)
            .arg("--api")
            .arg(&sys.api)
            .env("ATE_STATE_DIR", sys.state_dir())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ate watch");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send((ate_core::clock::now_ms(), line)).is_err() {
                    return;
                }
            }
        });
        Watch { child, lines }
    }

    /// Lines until one satisfies `done`, or panics after `within` with what came.
    fn until(&self, within: Duration, done: impl Fn(&str) -> bool) -> Vec<(i64, String)> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) => {
                    let hit = done(&line);
                    seen.push((at, line));
                    if hit {
                        return seen;
                    }
                }
                Err(_) => panic!("no matching line within {within:?}; got {seen:#?}"),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The template with a short idle timeout, so the idle suspend happens within the test.
fn short_idle(ns: &str) -> String {
    Tpl::counter()
        .yaml(ns, "counter")
        .replace("idleTimeout: 5m", "idleTimeout: 2s")
}

fn events_json(sys: &System, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["get", "events", "-o", "json"];
    all.extend_from_slice(args);
    serde_json::from_str(&sys.ate_ok(&all)).expect("events JSON")
}

fn field<'a>(e: &'a Value, name: &str) -> &'a str {
    e[name].as_str().unwrap_or_default()
}

#[test]
fn events_say_what_happened_and_why_and_watches_stream_them() {
    let ns = "ns-events";
    let sys = System::up(UpOptions::default());
    let path = sys.dir.path().join("short-idle.yaml");
    std::fs::write(&path, short_idle(ns)).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    create_actor(&sys, ns, "a", "counter");

    let events = Watch::start(&sys, &["get", "events", "-a", ns, "--watch", "-o", "json"]);
    let actors = Watch::start(&sys, &["get", "actors", "-a", ns, "--watch"]);
    // The actors watch prints its table first: the header, then the actor, SUSPENDED.
    let first = actors.until(Duration::from_secs(10), |l| l.contains(" a "));
    assert!(first[0].1.starts_with("ATESPACE"), "{first:?}");
    assert!(first[1].1.contains("SUSPENDED"), "{first:?}");
    // The events watch prints what is recorded so far: the creation.
    events.until(Duration::from_secs(10), |l| l.contains("\"Created\""));

    // A request resumes it: the watch shows Resumed (for that request) within a second.
    let body = get_ok(&sys, &format!("{ns}/a"), "/");
    let served_ms = ate_core::clock::now_ms();
    let resumed = events.until(Duration::from_secs(5), |l| l.contains("\"Resumed\""));
    let (at, line) = resumed.last().expect("a line");
    assert!(
        at - served_ms < 1000,
        "Resumed shown {} ms after the answer",
        at - served_ms
    );
    let e: Value = serde_json::from_str(line).expect("event JSON");
    assert!(
        field(&e, "message").contains("for request")
            && field(&e, "message").contains("running on worker"),
        "{e}"
    );
    assert!(body.contains("count"), "{body}");
    actors.until(Duration::from_secs(2), |l| {
        l.contains(" a ") && l.contains("RUNNING")
    });

    // Idle for its 2 s: the node asks for the suspend; the event says so and what was written.
    let suspended = events.until(Duration::from_secs(30), |l| l.contains("\"Suspended\""));
    for (at, line) in &suspended {
        let e: Value = serde_json::from_str(line).expect("event JSON");
        let recorded = time_ms(&e);
        assert!(
            at - recorded < 1000,
            "{line} shown {} ms after it was recorded",
            at - recorded
        );
    }
    let e: Value = serde_json::from_str(&suspended.last().expect("line").1).expect("JSON");
    assert!(
        field(&e, "message").starts_with("idle: nothing open for")
            && field(&e, "message").contains("generation 1 (memory) written on node"),
        "{e}"
    );
    assert_eq!(
        (field(&e, "from"), field(&e, "to")),
        ("SUSPENDING", "SUSPENDED")
    );
    actors.until(Duration::from_secs(2), |l| {
        l.contains(" a ") && l.contains("SUSPENDED")
    });

    // The list, oldest first, with kubectl's columns; the actor's own events by NAME.
    let table = sys.ate_ok(&["get", "events", "a", "-a", ns]);
    let reasons: Vec<&str> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        reasons,
        ["Created", "Resuming", "Resumed", "Suspending", "Suspended"],
        "{table}"
    );
    assert!(table.starts_with("LAST SEEN   TYPE"), "{table}");

    // An operator's suspend names the operator; a delete is recorded too.
    get_ok(&sys, &format!("{ns}/a"), "/");
    sys.ate_ok(&["suspend", "actor", "a", "-a", ns]);
    sys.ate_ok(&["delete", "actor", "a", "-a", ns]);
    events.until(Duration::from_secs(5), |l| l.contains("\"Deleted\""));
    actors.until(Duration::from_secs(2), |l| {
        l.contains(" a ") && l.contains("DELETED")
    });
    let all = events_json(&sys, &["a", "-a", ns]);
    let requested = all
        .iter()
        .find(|e| {
            field(e, "reason") == "Suspending" && field(e, "message").starts_with("requested by")
        })
        .unwrap_or_else(|| panic!("no operator suspend in {all:#?}"));
    assert!(
        field(requested, "message").len() > "requested by ".len(),
        "{requested}"
    );
    assert_eq!(all.last().map(|e| field(e, "reason")), Some("Deleted"));
    // Ids increase; every event is of this actor, Normal.
    assert!(
        all.windows(2)
            .all(|w| w[0]["id"].as_i64() < w[1]["id"].as_i64())
    );
    assert!(all.iter().all(|e| field(e, "type") == "Normal"), "{all:#?}");
}

/// When an event was recorded (Unix ms), from its RFC 3339 `time`.
fn time_ms(e: &Value) -> i64 {
    let t = humantime::parse_rfc3339(field(e, "time")).expect("RFC 3339 time");
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    i64::try_from(ms).expect("ms")
}

#[test]
fn bad_event_requests_are_refused_with_a_clear_error() {
    let sys = System::up(UpOptions::bare(1));
    let out = sys.ate(&["get", "events", "a"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("need -a ATESPACE"), "{err}");
    let out = sys.ate(&["get", "events", "-a", "Not_A_Label"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid atespace") && err.contains("InvalidArgument"),
        "{err}"
    );
    // An atespace without events: an empty list, not an error.
    let out = sys.ate_ok(&["get", "events", "-a", "nothing-here"]);
    assert_eq!(out.trim(), "LAST SEEN   TYPE   REASON   ACTOR   MESSAGE");
}
