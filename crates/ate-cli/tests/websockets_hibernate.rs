//! Hibernating WebSockets (`webSockets: hibernate`, docs/websockets.md) end to end, with real
//! runc sandboxes and real sockets through the router: a client's WebSocket stays open (no close
//! frame) while its actor is suspended by its idle timeout and by `ate suspend`, the router
//! answers pings meanwhile without waking it, the next message wakes the actor and is echoed, and
//! the actor's memory continued (the counter's in-memory count). Over the per-actor limit an
//! upgrade is refused with 503; a deleted actor's socket closes with 1000 on its next message;
//! a router drain closes the rest with 1012. `close`, the default: tests/suspend_connections.rs.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::actors::*;
use support::websocket::{frame, read_frame};
use support::*;

const NS: &str = "wsh";
const SUSPENDED: &str = "ACTOR_STATE_SUSPENDED";
const RUNNING: &str = "ACTOR_STATE_RUNNING";

/// Opens a WebSocket to `/ws` of `actor`; returns the socket, or the status line and body of
/// the refusal.
fn connect(router: SocketAddr, actor: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(router).expect("connect router");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let head = websocket::handshake(&mut s, "t", Some(actor));
    if head.starts_with("HTTP/1.1 101") {
        assert!(
            head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            "the accept of the client's key (RFC 6455 §1.3): {head}"
        );
        return Ok(s);
    }
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    Err(format!("{head}{body}"))
}

/// Sends a text message and reads its echo.
fn echo(s: &mut TcpStream, text: &str) -> String {
    s.write_all(&frame(1, text.as_bytes())).expect("send");
    let (first, payload) = read_frame(s).expect("echo");
    assert_eq!(first, 0x81, "a text frame, got {first:#x} {payload:?}");
    String::from_utf8(payload).expect("utf-8")
}

/// Nothing arrives for a moment: the socket is open and quiet (no close frame, no end).
fn assert_quiet(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_millis(300))).ok();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        Ok(0) => panic!("{what}: the router closed the socket"),
        Ok(_) => panic!("{what}: unexpected bytes from the router (a close frame?): {b:?}"),
        Err(e) => panic!("{what}: {e}"),
    }
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
}

/// Reads until the close frame: its code and reason.
fn read_close(s: &mut TcpStream) -> (u16, String) {
    loop {
        let (first, payload) = read_frame(s).expect("a close frame");
        if first == 0x88 {
            assert!(payload.len() >= 2, "a close frame with a code: {payload:?}");
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            return (code, String::from_utf8_lossy(&payload[2..]).into_owned());
        }
    }
}

fn memory_count(sys: &System, actor: &str) -> u64 {
    counts(&get_ok(sys, actor, "/")).0
}

#[test]
fn a_hibernating_websocket_stays_open_across_suspends_and_wakes_its_actor() {
    // No frozen-in-place copies: every wake is a CRIU restore of the memory snapshot.
    let mut sys = System::up_with_env(
        UpOptions {
            workers: 1,
            router_args: vec!["--hibernate-websockets-per-actor=2".into()],
            ..Default::default()
        },
        &[("ATE_KEEP_FROZEN", "0")],
    );
    let tpl = Tpl {
        idle_timeout: "2s",
        web_sockets: Some("hibernate"),
        ..Tpl::counter()
    };
    sys_apply(&sys, NS, "hib", &tpl);
    create_actor(&sys, NS, "a", "hib");
    create_actor(&sys, NS, "gone", "hib");
    let a = format!("{NS}/a");
    assert_eq!(memory_count(&sys, &a), 1);

    let mut ws = connect(sys.router_addr, &a).expect("upgrade");
    assert_eq!(echo(&mut ws, "before"), "before");

    // 1. The idle timeout suspends the actor although its WebSocket is open; the client's socket
    // stays open (no close frame).
    wait_state(&sys, NS, "a", SUSPENDED, Duration::from_secs(60));
    assert_quiet(&mut ws, "after the idle suspend");
    // The router answers a ping itself, without waking the actor.
    ws.write_all(&frame(9, b"are you there")).expect("ping");
    let (first, payload) = read_frame(&mut ws).expect("pong");
    assert_eq!((first, payload.as_slice()), (0x8a, &b"are you there"[..]));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        state_of(&actor(&sys, NS, "a")),
        SUSPENDED,
        "a ping woke the actor"
    );

    // 2. The next message wakes the actor and is answered; its memory continued.
    let woke = Instant::now();
    assert_eq!(
        echo(&mut ws, "after the idle suspend"),
        "after the idle suspend"
    );
    eprintln!("echo through a wake: {:?}", woke.elapsed());
    assert_eq!(state_of(&actor(&sys, NS, "a")), RUNNING);
    assert_eq!(memory_count(&sys, &a), 2, "the counter's memory continued");

    // 3. An explicit suspend: the same, and messages keep their order after the wake.
    sys.ate_ok(&["suspend", "actor", "a", "-a", NS]);
    assert_eq!(state_of(&actor(&sys, NS, "a")), SUSPENDED);
    assert_quiet(&mut ws, "after ate suspend");
    for i in 0..5 {
        ws.write_all(&frame(1, format!("m{i}").as_bytes()))
            .expect("send");
    }
    for i in 0..5 {
        let (first, payload) = read_frame(&mut ws).expect("echo");
        assert_eq!(first, 0x81);
        assert_eq!(payload, format!("m{i}").into_bytes(), "in order");
    }
    assert_eq!(memory_count(&sys, &a), 3, "the counter's memory continued");

    // 4. The per-actor limit: a second socket is admitted, a third refused with 503.
    let mut second = connect(sys.router_addr, &a).expect("second socket");
    assert_eq!(echo(&mut second, "two"), "two");
    let refused = connect(sys.router_addr, &a).expect_err("over the limit");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("--hibernate-websockets-per-actor=2"),
        "{refused}"
    );

    // 5. A deleted actor: its hibernated socket closes with 1000 on the next message.
    let gone = format!("{NS}/gone");
    let mut ws_gone = connect(sys.router_addr, &gone).expect("upgrade");
    assert_eq!(echo(&mut ws_gone, "hi"), "hi");
    sys.ate_ok(&["suspend", "actor", "gone", "-a", NS]);
    assert_quiet(&mut ws_gone, "after ate suspend");
    sys.ate_ok(&["delete", "actor", "gone", "-a", NS]);
    ws_gone.write_all(&frame(1, b"anyone?")).expect("send");
    let (code, reason) = read_close(&mut ws_gone);
    assert_eq!((code, reason.as_str()), (1000, "actor deleted"));

    // 6. A router drain (the system stops) closes the open sockets with 1012.
    sys.stop();
    for s in [&mut ws, &mut second] {
        let (code, reason) = read_close(s);
        assert_eq!((code, reason.as_str()), (1012, "router restarting"));
    }
}
