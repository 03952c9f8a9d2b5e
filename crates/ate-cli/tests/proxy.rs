//! `ate proxy` relays HTTP/1.1, h2c (prior knowledge and `Upgrade: h2c`) and WebSocket to an
//! actor through the router, and logs what the router refused.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use support::*;

fn proxy(sys: &System, actor: &str, log: &std::path::Path) -> (Child, u16) {
    let port = free_port();
    let child = Command::new(ATE)
        .args(["proxy", actor, "--listen", &format!("127.0.0.1:{port}")])
        .args(["--router", &sys.router])
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("ate proxy");
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "proxy not listening"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn proxy_relays_h2c_and_websocket_and_logs_refusals() {
    let sys = System::up(UpOptions {
        workers: 1,
        ..Default::default()
    });
    sys.ate_ok(&[
        "create",
        "actor",
        "px",
        "-a",
        "ate-demo",
        "-t",
        "ate-demo/counter",
    ]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut p, port) = proxy(&sys, "ate-demo/px", &tmp.path().join("proxy.log"));
    let url = format!("http://127.0.0.1:{port}/");

    let (ok, out) = curl(&["--http2-prior-knowledge", &url]);
    assert!(ok, "h2c prior knowledge: {out}");
    assert!(out.contains("preserved memory count: 1 |"), "{out}");
    let (ok, out) = curl(&["--http2", &url]);
    assert!(ok, "h2c upgrade: {out}");
    assert!(out.contains("preserved memory count: 2 |"), "{out}");
    let (ok, out) = curl(&["--http1.1", &url]);
    assert!(ok && out.contains("preserved memory count: 3 |"), "{out}");

    // WebSocket: handshake, one masked text frame, its echo.
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).ok();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .expect("handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("read handshake");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let payload = b"hello";
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).expect("frame");
    let mut reply = [0u8; 7];
    s.read_exact(&mut reply).expect("echo");
    assert_eq!(&reply[..2], &[0x81, 5], "an unmasked text frame of 5 bytes");
    assert_eq!(&reply[2..], payload);
    drop(s);
    let _ = p.kill();
    let _ = p.wait();

    // A request the router refuses is logged by the proxy.
    let log = tmp.path().join("missing.log");
    let (mut p, port) = proxy(&sys, "ate-demo/missing", &log);
    let (_, out) = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{port}/x"),
    ]);
    assert!(out.contains("404"), "{out}");
    std::thread::sleep(Duration::from_millis(200));
    let _ = p.kill();
    let _ = p.wait();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("GET /x → 404"), "{logged}");
}
