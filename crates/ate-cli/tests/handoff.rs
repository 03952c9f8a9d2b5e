//! The same-machine tunnel handoff (docs/tunnel-protocol.md, "Handoff") with a real `ate up`:
//! the router takes plain HTTP/1.1 tunnels as the actor's own socket from the worker's unix
//! socket, and
//! - a worker killed with SIGKILL takes those sockets with it: the router drops them at once,
//!   so nothing reaches the sandbox while no worker vouches for it; the restarted worker adopts
//!   the sandbox and the actor answers with its state;
//! - with `ate up --no-local-tunnels` the router uses CONNECT tunnels only, and requests still
//!   work.
//!
//! The drain of handed-off tunnels on a suspend (an upload in flight finishes, idle ones close
//! at once) is exercised by `suspend_connections.rs`, which runs with the handoff on.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ate_test_support::http::http_get;
use support::actors::create_actor;
use support::*;

const ACTOR: &str = "ate-demo/handed";

fn metric(sys: &System, name: &str) -> u64 {
    let (status, text) = http_get(&sys.router_metrics.to_string(), "/metrics");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The processes holding established connections to the actor's port 80 inside its network
/// namespace, one entry per connection (the dialing side: atunnel's worker, or the router
/// after a handoff).
fn dialed_connections(netns: &Path) -> Vec<u32> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ss", "-Htnp", "state", "established"])
        .args(["dst", "169.254.17.2:80"])
        .output()
        .expect("nsenter ss");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split("pid=")
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .and_then(|pid| pid.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

fn netns_of(sys: &System, name: &str) -> std::path::PathBuf {
    let dir = sys
        .state_dir()
        .join("workers/worker-1/actors/ate-demo")
        .join(name);
    ate_netns::netns_path(&ate_netns::netns_name(&dir.to_string_lossy()))
}

#[test]
fn handed_off_tunnels_go_with_a_killed_worker_and_the_actor_keeps_its_state() {
    let sys = System::up(UpOptions::with_workers(1));
    create_actor(&sys, "ate-demo", "handed", "counter");
    let (status, _, body) = get(sys.router_addr, ACTOR, "/");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("preserved memory count: 1 |"), "{body}");
    assert!(
        metric(&sys, "ate_router_tunnel_handoffs_total") >= 1,
        "the request took a handed-off tunnel"
    );
    let netns = netns_of(&sys, "handed");

    // An upload in flight on a handed-off tunnel: the router holds a socket in the actor's
    // namespace (atunnel holds none: the request is not piped through it).
    let mut up = TcpStream::connect(sys.router_addr).expect("connect");
    up.set_read_timeout(Some(Duration::from_secs(30))).ok();
    up.write_all(
        format!(
            "POST /echo HTTP/1.1\r\nHost: t\r\nate-target-actor: {ACTOR}\r\n\
             Content-Length: 100000\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .expect("upload head");
    up.write_all(&[b'x'; 1000]).expect("first bytes");
    let deadline = Instant::now() + Duration::from_secs(10);
    while dialed_connections(&netns).is_empty() {
        assert!(Instant::now() < deadline, "no connection to the actor");
        std::thread::sleep(Duration::from_millis(50));
    }
    let router = sys.pid_of("router --listen").expect("router pid");
    let holders = dialed_connections(&netns);
    assert!(
        holders.contains(&router),
        "the router itself holds the socket into the actor (router {router}, holders {holders:?})"
    );

    // The worker dies; its sandbox lives on (to be adopted), but the router lets go of it.
    let worker = sys.pid_of("worker --id worker-1").expect("worker pid");
    let killed = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-KILL", &worker.to_string()])
            .status()
            .expect("kill")
            .success()
    );
    while !dialed_connections(&netns).is_empty() {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the router still holds a socket into the actor {:?} after its worker died",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The client of the cut upload gets an answer or a close, never the actor's 200.
    let mut reply = Vec::new();
    let _ = up.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    assert!(!text.starts_with("HTTP/1.1 200"), "{text}");

    // `ate up` restarts the worker, which adopts the sandbox: the count goes on.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = get(sys.router_addr, ACTOR, "/");
        if status == 200 {
            assert!(
                body.contains("preserved memory count: 2 |"),
                "the actor kept its memory and served nothing in between: {body}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer after the worker restart: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn without_local_tunnels_the_router_uses_connect_tunnels() {
    let sys = System::up(UpOptions {
        workers: 1,
        up_args: vec!["--no-local-tunnels".into()],
        ..Default::default()
    });
    create_actor(&sys, "ate-demo", "plain", "counter");
    for n in 1..=3 {
        let (status, _, body) = get(sys.router_addr, "ate-demo/plain", "/");
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains(&format!("preserved memory count: {n} |")),
            "{body}"
        );
    }
    assert_eq!(metric(&sys, "ate_router_tunnel_handoffs_total"), 0);
    assert!(metric(&sys, "ate_router_tunnel_connects_total") >= 1);
}
