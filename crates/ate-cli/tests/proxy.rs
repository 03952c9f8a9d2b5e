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
    let sys = System::up(UpOptions::with_workers(1));
    sys.ate_ok(&create_actor_args("px", "ate-demo", "ate-demo/counter"));
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
    let head = websocket::handshake(&mut s, "localhost", None);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let payload = b"hello";
    s.write_all(&websocket::frame(1, payload)).expect("frame");
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
