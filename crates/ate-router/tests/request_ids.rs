//! Request ids and the access log, on real sockets (scripted api, test atunnel, echo upstreams):
//! a client's `x-request-id` is kept, sent to the actor and returned; a missing or unacceptable
//! one is replaced by a new 128-bit hex id, on success and on every error the router answers;
//! the id reaches the api as gRPC metadata; a failed request is one log line carrying the id;
//! `--access-log` writes one JSON line per request.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use tokio::net::TcpStream;
use tonic::Status;

fn id_of(got: &Got) -> String {
    let ids: Vec<_> = got.headers.get_all("x-request-id").iter().collect();
    assert_eq!(ids.len(), 1, "{:?}", got.headers);
    ids[0].to_str().unwrap().to_string()
}

fn is_generated(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The `x-request-id` values the echo upstream saw (its `header <k>: <v>` lines).
fn seen_by_actor(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("header x-request-id: "))
        .collect()
}

async fn get_with_id(addr: std::net::SocketAddr, actor: Option<&str>, ids: &[&[u8]]) -> Got {
    get_with(addr, actor, "app.example", |r| {
        for id in ids {
            r.headers_mut()
                .append("x-request-id", http::HeaderValue::from_bytes(id).unwrap());
        }
    })
    .await
}

#[tokio::test]
async fn a_client_request_id_is_kept_sent_to_the_actor_and_the_api_and_returned() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let got = get_with_id(w.router.addr, Some("a/b"), &[b"client-id-42"]).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.resume(), "warm");
    assert_eq!(id_of(&got), "client-id-42");
    assert_eq!(seen_by_actor(&got.body), ["client-id-42"], "{}", got.body);
    // The cold path called ResumeActor with the id as metadata.
    assert_eq!(w.api.request_ids("a/b"), [Some("client-id-42".to_string())]);

    // Any printable ASCII without spaces, up to 128 characters, is kept as it is.
    let long = "x".repeat(128);
    for id in ["a", "{\"t\":[1,2]}~!", long.as_str()] {
        let got = get_with_id(w.router.addr, Some("a/b"), &[id.as_bytes()]).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert_eq!(id_of(&got), id);
        assert_eq!(seen_by_actor(&got.body), [id], "{}", got.body);
    }
}

#[tokio::test]
async fn a_missing_or_unacceptable_request_id_is_replaced_by_a_new_one() {
    let w = World::start(|c| c.assignment_cache_ttl = Duration::ZERO).await;
    w.running("a/b");
    let long = vec![b'x'; 129];
    let cases: [&[&[u8]]; 6] = [
        &[],
        &[b"has space"],
        &[long.as_slice()],
        &[b""],
        &[b"caf\xc3\xa9"],
        &[b"one", b"two"],
    ];
    let mut seen = std::collections::HashSet::new();
    for (n, ids) in cases.iter().enumerate() {
        let got = get_with_id(w.router.addr, Some("a/b"), ids).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        let id = id_of(&got);
        assert!(is_generated(&id), "{ids:?}: {id:?}");
        assert!(seen.insert(id.clone()), "{id} twice");
        // The actor sees only the new id; the client's values are gone.
        assert_eq!(seen_by_actor(&got.body), [id.as_str()], "{}", got.body);
        // With the cache off, each request asks the api, with its id.
        assert_eq!(w.api.request_ids("a/b")[n], Some(id));
    }
}

#[tokio::test]
async fn every_error_the_router_answers_carries_the_request_id() {
    let w = World::start(|c| c.parked_request_budget = Duration::from_millis(200)).await;
    w.running("a/b");
    w.api
        .script("a/crashed", |_| Reply::err(Status::internal("boom")));
    w.api.script("a/full", |_| Reply::err(no_room()));
    let cases: [(Option<&str>, Option<&str>, StatusCode); 7] = [
        // Answered before any api call: no header, a bad one, a bad port.
        (None, None, StatusCode::NOT_FOUND),
        (Some("A/b"), None, StatusCode::NOT_FOUND),
        (Some("a/b"), Some("x"), StatusCode::BAD_REQUEST),
        // The api's answers.
        (Some("a/nobody"), None, StatusCode::NOT_FOUND),
        (Some("a/crashed"), None, StatusCode::INTERNAL_SERVER_ERROR),
        (Some("a/full"), None, StatusCode::SERVICE_UNAVAILABLE),
        // The tunnel's: nothing listens on that port of the actor.
        (Some("a/b"), Some("81"), StatusCode::BAD_GATEWAY),
    ];
    for (actor, port, status) in cases {
        let edit = |r: &mut http::Request<Empty<Bytes>>| {
            if let Some(port) = port {
                r.headers_mut()
                    .insert("ate-target-port", port.parse().unwrap());
            }
        };
        let got = get_with(w.router.addr, actor, "app.example", edit).await;
        assert_eq!(got.status, status, "{actor:?} {port:?}: {}", got.body);
        assert!(is_generated(&id_of(&got)), "{actor:?} {port:?}");
        let got = get_with(w.router.addr, actor, "app.example", |r| {
            edit(r);
            r.headers_mut()
                .insert("x-request-id", "err-id-7".parse().unwrap());
        })
        .await;
        assert_eq!(got.status, status, "{actor:?} {port:?}: {}", got.body);
        assert_eq!(id_of(&got), "err-id-7", "{actor:?} {port:?}");
    }
}

#[tokio::test]
async fn requests_inside_a_client_connect_get_ids_too() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let mut tcp = TcpStream::connect(w.router.addr).await.unwrap();
    let head = send_and_read_head(&mut tcp, b"CONNECT b.a:80 HTTP/1.1\r\nhost: b.a:80\r\nate-target-actor: a/b\r\nx-request-id: outer-1\r\n\r\n").await;
    let head = head.to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("x-request-id: outer-1\r\n"), "{head}");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    for id in [None, Some("inner-2")] {
        let req = bodiless_get("/inner", "inner.example", id.map(|id| ("x-request-id", id)));
        let got = collect(sender.send_request(req).await.unwrap(), Instant::now()).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        let returned = id_of(&got);
        match id {
            Some(id) => assert_eq!(returned, id),
            None => assert!(is_generated(&returned), "{returned}"),
        }
        assert_eq!(
            seen_by_actor(&got.body),
            [returned.as_str()],
            "{}",
            got.body
        );
    }
}

// ---- logs ---------------------------------------------------------------------------------------

/// Everything the JSON formatter writes, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

/// The value of `field` on a JSON log line: its own fields first, then its spans'.
fn field<'a>(line: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    line["fields"].get(name).or_else(|| {
        line["spans"]
            .as_array()?
            .iter()
            .rev()
            .find_map(|span| span.get(name))
    })
}

/// JSON lines at INFO and above, captured for this thread until the guard drops.
fn capture_info_lines() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

/// A warm request has no span of its own (making one cost ~5 allocations per request); when its
/// cached route turns out stale and the api is asked again, the lines of that resolution still
/// carry the request's id and actor.
#[tokio::test(flavor = "current_thread")]
async fn a_warm_request_whose_route_went_stale_logs_its_resume_with_its_id() {
    let (captured, _guard) = capture_info_lines();
    // No pooled tunnels: the second request opens a new one, which atunnel refuses as stale.
    let w = World::start(|c| c.tunnel_idle_per_actor = Some(0)).await;
    w.running("a/moved");
    let warm = get_with_id(w.router.addr, Some("a/moved"), &[b"warm-1"]).await;
    assert_eq!(warm.status, StatusCode::OK);
    // The worker no longer runs it, and the api fails to say where it went.
    w.atunnel.mark_stale("a/moved");
    w.api
        .script("a/moved", |_| Reply::err(Status::internal("boom")));
    let failed = get_with_id(w.router.addr, Some("a/moved"), &[b"went-stale-1"]).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let lines = captured.lines();
    let resume = lines
        .iter()
        .find(|l| l["fields"]["message"] == "ResumeActor failed")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(field(resume, "request_id").unwrap(), "went-stale-1");
    assert_eq!(field(resume, "actor").unwrap(), "a/moved");
    assert!(
        !lines.iter().any(|l| l.to_string().contains("warm-1")),
        "a served request logs nothing: {lines:#?}"
    );
}

/// One thread (current_thread runtime) so that the thread-local subscriber sees the router's
/// tasks too.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_request_is_one_log_line_with_its_id_and_lines_of_its_resume_carry_it() {
    let (captured, _guard) = capture_info_lines();

    let w = World::start(|_| {}).await;
    w.running("a/b");
    w.api
        .script("a/crashed", |_| Reply::err(Status::internal("boom")));
    let ok = get_with_id(w.router.addr, Some("a/b"), &[b"fine-1"]).await;
    assert_eq!(ok.status, StatusCode::OK);
    // With traces off, a client's `traceparent` still names the trace on the request's lines.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let failed = get_with(w.router.addr, Some("a/crashed"), "app.example", |r| {
        let h = r.headers_mut();
        h.insert("x-request-id", http::HeaderValue::from_static("log-test-1"));
        let traceparent = format!("00-{client_trace}-00f067aa0ba902b7-01");
        h.insert("traceparent", traceparent.parse().unwrap());
    })
    .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let missing = get_with_id(w.router.addr, None, &[b"log-test-2"]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    let lines = captured.lines();
    let failures: Vec<_> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "request failed")
        .collect();
    assert_eq!(failures.len(), 2, "{lines:#?}");
    let crashed = failures
        .iter()
        .find(|l| l["fields"]["request_id"] == "log-test-1")
        .unwrap_or_else(|| panic!("{failures:#?}"));
    assert_eq!(crashed["level"], "WARN");
    assert_eq!(crashed["fields"]["trace_id"], client_trace);
    assert_eq!(crashed["fields"]["actor"], "a/crashed");
    assert_eq!(crashed["fields"]["status"], 500);
    // The client's text, and the reason it is not shown.
    let error = crashed["fields"]["error"].as_str().unwrap();
    assert!(error.contains("internal error"), "{error}");
    let detail = crashed["fields"]["detail"].as_str().unwrap();
    assert!(detail.contains("boom"), "{detail}");
    let missing = failures
        .iter()
        .find(|l| l["fields"]["request_id"] == "log-test-2")
        .unwrap_or_else(|| panic!("{failures:#?}"));
    assert_eq!(missing["level"], "INFO");
    assert_eq!(missing["fields"]["status"], 404);
    assert_eq!(
        missing["fields"].get("trace_id"),
        None,
        "no traceparent, no trace id"
    );
    // The resume's own line (the api's failure) is inside the request's span.
    let resume = lines
        .iter()
        .find(|l| l["fields"]["message"] == "ResumeActor failed")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(field(resume, "request_id").unwrap(), "log-test-1");
    assert_eq!(field(resume, "trace_id").unwrap(), client_trace);
    assert_eq!(field(resume, "actor").unwrap(), "a/crashed");
    // A served request logs nothing.
    assert!(
        !lines.iter().any(|l| l.to_string().contains("fine-1")),
        "{lines:#?}"
    );
}

// ---- access log ---------------------------------------------------------------------------------

/// The access log's lines (as written, and parsed) once there are `n` of them (the writer is a
/// thread of its own).
async fn access_lines(path: &std::path::Path, n: usize) -> (Vec<String>, Vec<serde_json::Value>) {
    let what = format!("{n} access log lines");
    let text = access_log_until(path, &what, |text| text.lines().count() >= n).await;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (text.lines().map(str::to_string).collect(), lines)
}

#[tokio::test]
async fn the_access_log_has_one_json_line_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let log = path.to_str().unwrap().to_string();
    let w = World::start(move |c| c.access_log = Some(log)).await;
    let worker = w.worker();
    w.api.script("a/b", move |_| {
        Reply::ok(&worker, true).after(Duration::from_millis(50))
    });
    let started = std::time::SystemTime::now();
    let cold = get_with_id(w.router.addr, Some("a/b"), &[b"access-1"]).await;
    assert_eq!(cold.resume(), "cold");
    // Traces are off here: the trace id logged is the client's.
    let warm = get_with(w.router.addr, Some("a/b"), "app.example", |r| {
        r.headers_mut().insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
    })
    .await;
    assert_eq!(warm.resume(), "warm");
    let missing = get_with_id(w.router.addr, Some("a/nobody"), &[b"access-3"]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let no_header = get(w.router.addr, None).await;

    let (raw, lines) = access_lines(&path, 4).await;
    assert_eq!(lines.len(), 4, "{raw:#?}");

    let l = &lines[0];
    assert_eq!(l["request_id"], "access-1");
    assert_eq!(l["actor"], "a/b");
    assert_eq!(l["method"], "GET");
    assert_eq!(l["path"], "/hello", "the query is left out");
    assert_eq!(l["status"], 200);
    assert_eq!(l["resume"], "cold");
    // The echo upstream's body is chunked: its size is not known up front, so not logged.
    assert!(cold.headers.get("content-length").is_none());
    assert!(l.get("bytes").is_none(), "{l}");
    let (total, resolve, forward) = (
        l["duration_ms"].as_f64().unwrap(),
        l["resolve_ms"].as_f64().unwrap(),
        l["forward_ms"].as_f64().unwrap(),
    );
    assert!(resolve >= 50.0, "{l}");
    assert!(total >= resolve + forward - 0.01, "{l}");
    // `2025-06-01T12:00:00.123Z`, close to when the request was sent.
    let time = l["time"].as_str().unwrap();
    assert_eq!(time.len(), 24, "{time}");
    assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
    let year: u64 = time[..4].parse().unwrap();
    let since_epoch = started.duration_since(std::time::UNIX_EPOCH).unwrap();
    let now_year = 1970 + since_epoch.as_secs() / 31_556_952;
    assert!(year.abs_diff(now_year) <= 1, "{time}");

    let l = &lines[1];
    assert_eq!(l["request_id"].as_str().unwrap(), id_of(&warm));
    assert!(is_generated(l["request_id"].as_str().unwrap()));
    assert_eq!(l["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(l["resume"], "warm");
    assert_eq!(l["status"], 200);

    let l = &lines[2];
    assert_eq!(l["request_id"], "access-3");
    assert_eq!(l["actor"], "a/nobody");
    assert_eq!(l["status"], 404);
    assert_eq!(l["bytes"], missing.body.len() as u64);
    assert!(
        l.get("resume").is_none() && l.get("forward_ms").is_none(),
        "{l}"
    );
    assert!(l["resolve_ms"].as_f64().is_some(), "{l}");

    let l = &lines[3];
    assert_eq!(l["request_id"].as_str().unwrap(), id_of(&no_header));
    assert_eq!(l["actor"], "");
    assert_eq!(l["status"], 404);
    // Keys in a fixed order; what was not measured is left out.
    let keys: Vec<&str> = raw[3]
        .split("\":")
        .filter_map(|part| part.rsplit_once('"').map(|(_, key)| key))
        .collect();
    assert_eq!(
        keys,
        [
            "time",
            "request_id",
            "actor",
            "method",
            "path",
            "status",
            "duration_ms",
            "bytes"
        ],
        "{}",
        raw[3]
    );
}

/// With traces off (no OpenTelemetry layer: no `OTEL_*` variables) a client's `traceparent`
/// reaches the actor as it was sent (`tests/traces.rs` checks it on).
#[tokio::test]
async fn with_traces_off_a_client_traceparent_passes_through() {
    let w = World::start(|_| {}).await;
    w.running("a/b");
    let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let got = get_with(w.router.addr, Some("a/b"), "app.example", |r| {
        r.headers_mut()
            .insert("traceparent", http::HeaderValue::from_static(sent));
    })
    .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    let seen: Vec<&str> = got
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("header traceparent: "))
        .collect();
    assert_eq!(seen, [sent], "{}", got.body);
}
