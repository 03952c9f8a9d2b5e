//! Request ids end to end through a real `ate up` system (api, node agent, runc + CRIU workers,
//! router): a client's `x-request-id` comes back on the response, is in the router's access log
//! and on the log lines of that request's resume in the api, the node agent and the worker — for
//! a cold boot (NodeService Run) and for a restore from a snapshot (Restore). A request the
//! router fails is a router log line carrying its id.
//!
//! That the actor receives the header is checked by the router's own tests
//! (`crates/ate-router/tests/request_ids.rs`, an echo upstream): the demo counter does not echo
//! request headers.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use support::*;

/// GET `path` through the router for `actor` with `x-request-id: id`: (status, head, body).
fn get_with_id(router: SocketAddr, actor: &str, path: &str, id: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(router).expect("connect router");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test.local\r\nate-target-actor: {actor}\r\nx-request-id: {id}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    ate_test_support::http::read_response(&mut s)
}

/// The value of header `name` in a response head (case-insensitive name).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn a_request_id_is_on_the_response_and_in_every_components_log() {
    let access = tempfile::tempdir().expect("tempdir");
    let access_log = access.path().join("access.log");
    let sys = System::up(UpOptions {
        workers: 1,
        router_args: vec![format!("--access-log={}", access_log.display())],
        ..Default::default()
    });
    sys.ate_ok(&create_actor_args("rid", "ate-demo", "ate-demo/counter"));
    let workers = |sys: &System| {
        std::fs::read_dir(sys.state_dir().join("logs"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .collect::<Vec<_>>()
                    .join("")
            })
            .unwrap_or_default()
    };

    // Cold boot (Run), then a restore from the snapshot its suspend made (Restore).
    for (id, how) in [("test-123", "cold boot"), ("test-456", "restore")] {
        let (status, head, body) = get_with_id(sys.router_addr, "ate-demo/rid", "/", id);
        assert_eq!(
            status,
            200,
            "{how}: {body}\nrouter log:\n{}",
            sys.log("router")
        );
        assert_eq!(header(&head, "ate-resume"), Some("cold"), "{how}: {head}");
        assert_eq!(header(&head, "x-request-id"), Some(id), "{how}: {head}");

        let api = lines_with("api", id, || sys.log("api"));
        assert!(
            api.iter().any(|l| l.contains("actor resumed")),
            "{how}: {api:#?}"
        );
        let node = lines_with("node", id, || sys.log("node"));
        let want = if how == "restore" {
            "actor restored"
        } else {
            "actor started"
        };
        assert!(node.iter().any(|l| l.contains(want)), "{how}: {node:#?}");
        let worker = lines_with("worker", id, || workers(&sys));
        assert!(
            worker.iter().any(|l| l.contains("ingress on")),
            "{how}: {worker:#?}"
        );
        let access = lines_with("access", &format!("\"request_id\":\"{id}\""), || {
            std::fs::read_to_string(&access_log).unwrap_or_default()
        });
        for line in api.iter().chain(&node).chain(&worker).chain(&access) {
            eprintln!("{how}: {line}");
        }
        let line: serde_json::Value = serde_json::from_str(&access[0]).expect("JSON line");
        assert_eq!(line["actor"], "ate-demo/rid", "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["resume"], "cold", "{line}");
        assert_eq!(line["path"], "/", "{line}");
        assert!(line["resolve_ms"].as_f64().is_some(), "{line}");

        if how == "cold boot" {
            sys.ate_ok(&["suspend", "actor", "rid", "-a", "ate-demo"]);
        }
    }

    // The router logs a request it fails, with its id (and nothing for served ones).
    let (status, head, _) = get_with_id(sys.router_addr, "ate-demo/nobody", "/", "test-404");
    assert_eq!(status, 404);
    assert_eq!(header(&head, "x-request-id"), Some("test-404"), "{head}");
    let failed = lines_with("router", "test-404", || sys.log("router"));
    assert!(
        failed.iter().any(|l| l.contains("request failed")),
        "{failed:#?}"
    );
    assert!(!sys.log("router").contains("test-123"));
}
