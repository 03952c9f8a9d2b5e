//! What an explicit suspend does to open connections, with real clients through the router:
//! a WebSocket gets a close frame with code 1001 (and a fresh socket works right after), an
//! upload in flight completes with 200, and a request sent during the suspend waits and is
//! answered by the resumed actor.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;

const ACTOR: &str = "ate-demo/conn";

fn websocket(router: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(router).expect("connect router");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let head = websocket::handshake(&mut s, "t", Some(ACTOR));
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// Sends a masked text frame and reads its echo.
fn echo(s: &mut TcpStream, text: &[u8]) -> Vec<u8> {
    s.write_all(&websocket::frame(1, text)).expect("frame");
    let (_, payload) = websocket::read_frame(s).expect("echo");
    payload
}

#[test]
fn a_suspend_closes_websockets_with_1001_and_lets_uploads_finish() {
    let sys = System::up(UpOptions::with_workers(1));
    sys.ate_ok(&create_actor_args("conn", "ate-demo", "ate-demo/counter"));
    let (status, _, body) = get(sys.router_addr, ACTOR, "/");
    assert_eq!(status, 200, "{body}");

    // 1. A WebSocket open across a suspend: close frame 1001, then a fresh socket works.
    let mut ws = websocket(sys.router_addr);
    assert_eq!(echo(&mut ws, b"before"), b"before");
    let started = Instant::now();
    sys.ate_ok(&["suspend", "actor", "conn", "-a", "ate-demo"]);
    let mut frame = Vec::new();
    let _ = ws.read_to_end(&mut frame);
    assert!(frame.len() >= 4, "a close frame, not a cut: {frame:?}");
    assert_eq!(frame[0], 0x88, "a close frame: {frame:?}");
    assert_eq!(u16::from_be_bytes([frame[2], frame[3]]), 1001, "{frame:?}");
    assert!(
        String::from_utf8_lossy(&frame[4..]).contains("suspending"),
        "{frame:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a WebSocket does not hold the suspend for the whole grace"
    );
    let mut ws = websocket(sys.router_addr);
    assert_eq!(echo(&mut ws, b"after"), b"after");
    drop(ws);

    // 2. An upload in flight when the suspend starts completes; a request sent meanwhile waits.
    let total = 300 * 1024;
    let mut up = TcpStream::connect(sys.router_addr).expect("connect");
    up.set_read_timeout(Some(Duration::from_secs(60))).ok();
    up.write_all(
        format!(
            "POST /echo HTTP/1.1\r\nHost: t\r\nate-target-actor: {ACTOR}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {total}\r\n\
             Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .expect("upload head");
    let chunk = vec![b'x'; 50 * 1024];
    up.write_all(&chunk).expect("first chunk");
    std::thread::sleep(Duration::from_millis(300));
    let state = sys.state_dir();
    let api = sys.api.clone();
    let suspend = std::thread::spawn(move || {
        std::process::Command::new(ATE)
            .args(["--api", &api, "suspend", "actor", "conn", "-a", "ate-demo"])
            .env("ATE_STATE_DIR", &state)
            .output()
            .expect("ate suspend")
    });
    std::thread::sleep(Duration::from_millis(300));
    let router = sys.router_addr;
    let waiter = std::thread::spawn(move || get(router, ACTOR, "/"));
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        up.write_all(&chunk).expect("a chunk during the suspend");
    }
    let mut reply = Vec::new();
    up.read_to_end(&mut reply).expect("upload reply");
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "the upload completes: {}",
        &text[..text.len().min(300)]
    );
    let body_len = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| reply.len() - p - 4)
        .unwrap_or(0);
    assert_eq!(body_len, total, "the whole upload was echoed");
    let out = suspend.join().expect("suspend thread");
    assert!(
        out.status.success(),
        "the suspend succeeds after the upload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, _, body) = waiter.join().expect("waiter");
    assert_eq!(
        status, 200,
        "a request sent during the suspend is answered: {body}"
    );
    assert!(body.contains("preserved memory count: 2 |"), "{body}");
}

fn state_of(sys: &System, ns: &str, name: &str) -> String {
    let json = sys.ate_ok(&["get", "actors", name, "-a", ns, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v[0]["state"].as_str().unwrap_or_default().to_string()
}

#[test]
fn an_open_websocket_keeps_an_actor_from_idle_suspend() {
    let sys = System::up(UpOptions::with_workers(1));
    // The demo counter with a 2 s idle timeout.
    let images = images_dir();
    let yaml = format!(
        "apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata:
  namespace: ate-demo
  name: idle
spec:
  containers:
    - name: main
      image: oci-layout:{}/counter:latest
      command: [\"/counter\"]
      wakeupProbe:
        httpGet: {{path: /healthz, port: 80}}
  resources: {{cpu: 250m, memory: 64Mi}}
  snapshots: {{fidelity: memory}}
  idleTimeout: 2s
",
        images.display()
    );
    let path = sys.dir.path().join("idle.yaml");
    std::fs::write(&path, yaml).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    sys.ate_ok(&create_actor_args("conn", "ate-demo", "ate-demo/idle"));
    let mut ws = websocket(sys.router_addr);
    assert_eq!(echo(&mut ws, b"hi"), b"hi");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        state_of(&sys, "ate-demo", "conn"),
        "ACTOR_STATE_RUNNING",
        "an actor with an open WebSocket is not idle"
    );
    assert_eq!(echo(&mut ws, b"still"), b"still");
    drop(ws);
    let start = Instant::now();
    while state_of(&sys, "ate-demo", "conn") != "ACTOR_STATE_SUSPENDED" {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "not idle-suspended after its WebSocket closed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
