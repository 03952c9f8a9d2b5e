//! The router end to end, through real `ate up` systems (api, node agent, runc + CRIU workers,
//! router): the spec's parking demo and its timing, single flight for a burst at one suspended
//! actor, a stale cached assignment (421 → re-resolve), the parked-request limit, WebSocket and
//! client CONNECT through the router, and drain on SIGTERM with parked requests.
//!
//! gRPC pass-through is not tested here: the counter workload is std-only and has no HTTP/2
//! server; `crates/ate-router/tests/router.rs` covers gRPC (trailers, streaming) against an
//! in-process h2 upstream behind a test atunnel.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::*;

const NO_ROOM: &str = "unavailable: no worker has room for the actor";

fn create(sys: &System, name: &str) {
    sys.ate_ok(&create_actor_args(name, "ate-demo", "ate-demo/counter"));
}

fn suspend(sys: &System, name: &str) {
    sys.ate_ok(&["suspend", "actor", name, "-a", "ate-demo"]);
}

/// A GET through the router, timed at the client.
fn timed_get(router: SocketAddr, actor: &str) -> (u16, String, f64) {
    let started = Instant::now();
    let (status, _head, body) = get(router, actor, "/");
    (status, body, started.elapsed().as_secs_f64())
}

/// `GET path` on a plain HTTP endpoint (metrics), body only.
fn http_body(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    ate_test_support::http::read_response(&mut s).2
}

/// Sum of the samples of metric `name` whose labels contain every one of `labels`
/// (e.g. `path="cold"`); 0 when there is none.
fn metric(addr: &str, name: &str, labels: &[&str]) -> f64 {
    http_body(addr, "/metrics")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric_name, rest) = match series.split_once('{') {
                Some((n, r)) => (n, r),
                None => (series, ""),
            };
            (metric_name == name && labels.iter().all(|x| rest.contains(x)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

fn assert_no_room_503(sys: &System, name: &str, status: u16, body: &str, secs: f64) {
    assert_eq!(status, 503, "{name}: {body}");
    assert_eq!(body, format!("actor ate-demo/{name} {NO_ROOM}"), "{name}");
    assert!(
        (5.0..=5.3).contains(&secs),
        "{name}: 503 after {secs:.3} s, want 5.0–5.3 s\nrouter log:\n{}",
        sys.log("router")
    );
}

/// The spec's parking demo (Fig. 4.7): 2 workers with 1 slot each, actors p1..p4.
#[test]
fn parking_demo_timeline() {
    let sys = System::up(UpOptions::with_slots(2, 1));
    for p in ["p1", "p2", "p3", "p4"] {
        create(&sys, p);
    }
    // A free worker each: served without waiting for the budget.
    for p in ["p1", "p2"] {
        let (status, body, secs) = timed_get(sys.router_addr, &format!("ate-demo/{p}"));
        assert_eq!(
            status,
            200,
            "{p}: {body}\nrouter log:\n{}",
            sys.log("router")
        );
        assert!(secs < 5.0, "{p} took {secs:.3} s");
        eprintln!("{p}-free-worker\t{status}\t{secs:.6}\t{body}");
    }
    // Full pool: parked for the whole 5 s budget, then the capacity 503.
    let (status, body, secs) = timed_get(sys.router_addr, "ate-demo/p3");
    eprintln!("p3-no-free-worker\t{status}\t{secs:.6}\t{body}");
    assert_no_room_503(&sys, "p3", status, &body, secs);
    // Again, and 2 s into the wait p1 is suspended: its worker becomes free and p3 is served.
    let router = sys.router_addr;
    let parked = std::thread::spawn(move || timed_get(router, "ate-demo/p3"));
    std::thread::sleep(Duration::from_secs(2));
    suspend(&sys, "p1");
    let (status, body, secs) = parked.join().expect("p3 thread");
    eprintln!("p3-served-after-park\t{status}\t{secs:.6}\t{body}");
    assert_eq!(status, 200, "{body}\nrouter log:\n{}", sys.log("router"));
    assert!(body.starts_with("preserved memory count: 1 |"), "{body}");
    assert!(secs < 3.0, "p3 served after {secs:.3} s, want < 3 s");
}

/// Fifty concurrent requests at one suspended actor share one ResumeActor: one cold resume.
#[test]
fn fifty_requests_one_cold_resume() {
    let sys = System::up(UpOptions::default());
    assert!(
        !sys.api_http.is_empty(),
        "ready file has the api http address"
    );
    create(&sys, "s1");
    assert_eq!(get(sys.router_addr, "ate-demo/s1", "/").0, 200);
    suspend(&sys, "s1");
    let cold = |sys: &System| {
        metric(
            &sys.api_http,
            "ate_api_resume_total",
            &["path=\"cold\"", "outcome=\"resumed\""],
        )
    };
    let before = cold(&sys);
    let router = sys.router_addr;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(50));
    let threads: Vec<_> = (0..50)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                get(router, "ate-demo/s1", "/")
            })
        })
        .collect();
    let mut memory_counts = Vec::new();
    for t in threads {
        let (status, _head, body) = t.join().expect("thread");
        assert_eq!(status, 200, "{body}\nrouter log:\n{}", sys.log("router"));
        let n: u64 = body
            .strip_prefix("preserved memory count: ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("body {body:?}"));
        memory_counts.push(n);
    }
    // One actor, memory restored once: the 50 requests counted 2..=51 in some order.
    memory_counts.sort_unstable();
    assert_eq!(memory_counts, (2..=51).collect::<Vec<u64>>());
    let after = cold(&sys);
    assert_eq!(
        after - before,
        1.0,
        "cold resumes: {before} → {after}\napi log:\n{}",
        sys.log("api")
    );
}

/// The router caches s2's assignment (5 s TTL); s2 moves to the other worker meanwhile. The next
/// request meets atunnel's 421 on the old worker, resolves again and is served: the client sees 200.
#[test]
fn stale_assignment_is_re_resolved() {
    let sys = System::up(UpOptions::default());
    create(&sys, "m1");
    let started = Instant::now();
    assert_eq!(get(sys.router_addr, "ate-demo/m1", "/").0, 200);
    let json = sys.ate_ok(&["get", "actors", "m1", "-a", "ate-demo", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    let before = v[0]["worker"].as_str().unwrap_or_default().to_string();
    let other = if before == "worker-1" {
        "worker-2"
    } else {
        "worker-1"
    };
    suspend(&sys, "m1");
    sys.ate_ok(&[
        "update",
        "actor",
        "m1",
        "-a",
        "ate-demo",
        "--selector",
        &format!("ate.dev/worker={other}"),
    ]);
    sys.ate_ok(&["resume", "actor", "m1", "-a", "ate-demo"]);
    let moved_in = started.elapsed();
    assert!(
        moved_in < Duration::from_millis(4500),
        "the move took {moved_in:?}: the router's 5 s cache entry may have expired, so this run cannot show the stale path"
    );
    let stale = |sys: &System| {
        metric(
            &sys.router_metrics.to_string(),
            "ate_router_stale_assignment_retries_total",
            &[],
        )
    };
    let before_retries = stale(&sys);
    let (_, body) = sys.get_200("ate-demo/m1", "/");
    assert!(
        body.starts_with("preserved memory count: 2 |"),
        "memory kept: {body}"
    );
    assert_eq!(stale(&sys) - before_retries, 1.0, "one 421 retry");
}

fn fill_pool(sys: &System) {
    for p in ["p1", "p2", "p3", "p4", "p5"] {
        create(sys, p);
    }
    for p in ["p1", "p2"] {
        assert_eq!(get(sys.router_addr, &format!("ate-demo/{p}"), "/").0, 200);
    }
}

/// `--parked-request-max=2`: two requests park, the third is shed at once with the capacity body.
#[test]
fn parked_request_limit_sheds_the_third() {
    let sys = System::up(UpOptions {
        workers: 2,
        slots: 1,
        router_args: vec!["--parked-request-max=2".into()],
        ..Default::default()
    });
    fill_pool(&sys);
    let metrics = sys.router_metrics.to_string();
    let rejected_before = metric(&metrics, "atenet_router_parking_rejected_total", &[]);
    let router = sys.router_addr;
    let parked: Vec<_> = ["p3", "p4"]
        .into_iter()
        .map(|p| std::thread::spawn(move || timed_get(router, &format!("ate-demo/{p}"))))
        .collect();
    // Wait until both hold a parking place.
    let deadline = Instant::now() + Duration::from_secs(4);
    while metric(&metrics, "atenet_router_parking_active", &[]) < 2.0 {
        assert!(Instant::now() < deadline, "two requests never parked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, body, secs) = timed_get(router, "ate-demo/p5");
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        "actor \"ate-demo/p5\" unavailable: router at capacity"
    );
    assert!(secs < 1.0, "shed after {secs:.3} s, want at once");
    let rejected_after = metric(&metrics, "atenet_router_parking_rejected_total", &[]);
    assert!(
        rejected_after > rejected_before,
        "rejected counter {rejected_before} → {rejected_after}"
    );
    for (t, p) in parked.into_iter().zip(["p3", "p4"]) {
        let (status, body, secs) = t.join().expect("thread");
        assert_no_room_503(&sys, p, status, &body, secs);
    }
}

/// `--parked-request-max=0` turns parking off: a full pool answers 503 at once.
#[test]
fn parking_off_answers_at_once() {
    let sys = System::up(UpOptions {
        workers: 2,
        slots: 1,
        router_args: vec!["--parked-request-max=0".into()],
        ..Default::default()
    });
    fill_pool(&sys);
    let (status, body, secs) = timed_get(sys.router_addr, "ate-demo/p3");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body, format!("actor ate-demo/p3 {NO_ROOM}"));
    assert!(secs < 1.0, "503 after {secs:.3} s, want at once");
}

/// Reads one WebSocket frame: (opcode, payload).
fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).expect("frame head");
    let mut len = u64::from(head[1] & 0x7F);
    if len == 126 {
        let mut b = [0u8; 2];
        s.read_exact(&mut b).expect("len");
        len = u64::from(u16::from_be_bytes(b));
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).expect("payload");
    (head[0] & 0x0F, payload)
}

/// Reads an HTTP/1.1 response head (up to the blank line), byte by byte so nothing after it is lost.
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).expect("read head") == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// WebSocket echo (upgrade through the router, actor resumed by it) and a client CONNECT to port
/// 8080 of an actor, with two requests inside the tunnel.
#[test]
fn websocket_and_connect_through_the_router() {
    let sys = System::up(UpOptions::default());
    create(&sys, "w1");
    create(&sys, "w2");

    // WebSocket: the actor is suspended; the upgrade request resumes it.
    let mut s = TcpStream::connect(sys.router_addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: chat.example\r\nate-target-actor: ate-demo/w1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .expect("write");
    let head = read_head(&mut s);
    assert!(
        head.starts_with("HTTP/1.1 101"),
        "{head}\nrouter log:\n{}",
        sys.log("router")
    );
    assert!(
        head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "accept key: {head}"
    );
    for msg in ["hello through the router", "second frame"] {
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut frame = vec![0x81, 0x80 | msg.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(msg.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        s.write_all(&frame).expect("frame");
        let (opcode, payload) = read_frame(&mut s);
        assert_eq!(opcode, 1);
        assert_eq!(String::from_utf8_lossy(&payload), msg);
    }
    s.write_all(&[0x88, 0x80, 0, 0, 0, 0]).expect("close");
    assert_eq!(read_frame(&mut s).0, 8, "close answered");

    // CONNECT to port 8080 of w2: the header goes on the CONNECT; requests inside reach port 8080.
    let mut s = TcpStream::connect(sys.router_addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    write!(
        s,
        "CONNECT w2.actor:8080 HTTP/1.1\r\nHost: w2.actor:8080\r\nate-target-actor: ate-demo/w2\r\n\r\n"
    )
    .expect("write");
    let head = read_head(&mut s);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    for n in 1..=2 {
        write!(s, "GET /port-8080 HTTP/1.1\r\nHost: w2.actor:8080\r\n\r\n").expect("write");
        let head = read_head(&mut s);
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{head}\nrouter log:\n{}",
            sys.log("router")
        );
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .expect("content-length");
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).expect("body");
        assert_eq!(
            String::from_utf8_lossy(&body),
            format!(
                "preserved memory count: {n} | preserved file counter: {n} | preserved rootfs counter: {n}"
            )
        );
    }
    drop(s);
    // Port 8080 is the same process: a plain request to port 80 continues the count.
    let (status, _, body) = get(sys.router_addr, "ate-demo/w2", "/");
    assert_eq!(status, 200);
    assert!(body.starts_with("preserved memory count: 3 |"), "{body}");
}

/// SIGTERM to the router while 3 requests are parked: it stops accepting, and the parked requests
/// still complete (here p1 is suspended during the drain, so they are served).
#[test]
fn drain_finishes_parked_requests() {
    let sys = System::up(UpOptions::with_slots(2, 1));
    fill_pool(&sys);
    let metrics = sys.router_metrics.to_string();
    let router = sys.router_addr;
    let parked: Vec<_> = ["p3", "p3", "p4"]
        .into_iter()
        .map(|p| std::thread::spawn(move || timed_get(router, &format!("ate-demo/{p}"))))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(4);
    while metric(&metrics, "atenet_router_parking_active", &[]) < 3.0 {
        assert!(Instant::now() < deadline, "three requests never parked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = sys.pid_of("router").expect("router pid");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    // New connections are refused once the listener is closed.
    let deadline = Instant::now() + Duration::from_secs(2);
    while TcpStream::connect_timeout(&router, Duration::from_millis(200)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "router still accepts after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    suspend(&sys, "p1");
    for (t, p) in parked.into_iter().zip(["p3", "p3", "p4"]) {
        let (status, body, secs) = t.join().expect("thread");
        eprintln!("{p}\t{status}\t{secs:.3}\t{body}");
        match status {
            200 => assert!(body.starts_with("preserved memory count: "), "{body}"),
            503 => assert_eq!(body, format!("actor ate-demo/{p} {NO_ROOM}")),
            _ => panic!("{p}: {status} {body}\nrouter log:\n{}", sys.log("router")),
        }
    }
    assert!(
        sys.log("router").contains("draining"),
        "router log:\n{}",
        sys.log("router")
    );
}
