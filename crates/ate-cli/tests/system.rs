//! The whole system through `ate up`: the counter demo end to end (create, call, suspend, resume
//! on the other worker, call) with real runc + CRIU sandboxes.

mod support;

use support::actors::{counts, pin_to_other_worker, worker_of};
use support::*;

#[test]
fn counter_keeps_memory_across_suspends_and_workers() {
    let sys = System::up(UpOptions::default());
    sys.ate_ok(&create_actor_args("c1", "ate-demo", "ate-demo/counter"));
    let (head, body) = sys.get_200("ate-demo/c1", "/");
    assert!(
        head.to_ascii_lowercase().contains("ate-resume: cold"),
        "{head}"
    );
    assert_eq!(counts(&body), (1, 1, 1));
    for n in 2..=3 {
        assert_eq!(
            counts(&get(sys.router_addr, "ate-demo/c1", "/").2),
            (n, n, n)
        );
    }
    // Five cycles: suspend, pin to the other worker, resume by request; all three counters continue.
    for cycle in 0..5u64 {
        let before = worker_of(&sys, "ate-demo", "c1");
        assert!(before.starts_with("worker-"), "running actor has a worker");
        sys.ate_ok(&["suspend", "actor", "c1", "-a", "ate-demo"]);
        let other = pin_to_other_worker(&sys, "ate-demo", "c1", &before);
        let n = 4 + cycle;
        let (status, head, body) = get(sys.router_addr, "ate-demo/c1", "/");
        assert_eq!(
            status,
            200,
            "cycle {cycle}: {head}\n{body}\nnode log:\n{}",
            sys.log("node")
        );
        assert_eq!(counts(&body), (n, n, n), "cycle {cycle}");
        assert_eq!(worker_of(&sys, "ate-demo", "c1"), other, "cycle {cycle}");
    }
}

#[test]
fn proxy_adds_the_actor_header() {
    use std::io::{Read, Write};
    let sys = System::up(UpOptions::with_workers(1));
    sys.ate_ok(&create_actor_args("p1", "ate-demo", "ate-demo/counter"));
    let port = free_port();
    let mut proxy = std::process::Command::new(ATE)
        .args([
            "proxy",
            "ate-demo/p1",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--router",
            &sys.router,
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ate proxy");
    let start = std::time::Instant::now();
    let reply = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            // No ate-target-actor header: the proxy adds it.
            s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .expect("write");
            let mut buf = String::new();
            s.read_to_string(&mut buf).expect("read");
            break buf;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "proxy not listening"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        reply.contains(
            "preserved memory count: 1 | preserved file counter: 1 | preserved rootfs counter: 1"
        ),
        "{reply}"
    );
}

#[test]
fn logs_follow_the_actor_across_suspends() {
    let sys = System::up(UpOptions::with_workers(2));
    sys.ate_ok(&create_actor_args("l1", "ate-demo", "ate-demo/counter"));
    assert_eq!(get(sys.router_addr, "ate-demo/l1", "/").0, 200);
    sys.ate_ok(&["suspend", "actor", "l1", "-a", "ate-demo"]);
    let before = worker_of(&sys, "ate-demo", "l1");
    assert!(before.is_empty(), "suspended actor has no worker");
    assert_eq!(get(sys.router_addr, "ate-demo/l1", "/").0, 200);
    let state = sys.state_dir();
    let state = state.to_str().expect("utf-8 path");
    let log = sys.ate_ok(&[
        "logs",
        "actor",
        "l1",
        "-a",
        "ate-demo",
        "--state-dir",
        state,
    ]);
    assert!(log.contains("counter listening on"), "{log}");
    assert!(log.contains("counted request 1"), "{log}");
    // After a memory restore the same process goes on writing into the same log.
    assert!(log.contains("counted request 2"), "{log}");
    assert_eq!(
        log.matches("counter listening on").count(),
        1,
        "restored, not restarted: {log}"
    );
    let out = sys.ate(&[
        "logs",
        "actor",
        "nobody",
        "-a",
        "ate-demo",
        "--state-dir",
        state,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no log"));
    // Without --state-dir the log comes through the api from the actor's node (any machine).
    let remote = sys.ate_ok(&["logs", "actor", "l1", "-a", "ate-demo"]);
    assert_eq!(remote, log, "the same log through the api");
    let out = sys.ate(&["logs", "actor", "nobody", "-a", "ate-demo"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `/proc/PID/comm` (what `top` and `ps -o comm` show) and the command line of a process.
fn title_of(pid: u32) -> (String, Vec<String>) {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    let args = std::fs::read(format!("/proc/{pid}/cmdline"))
        .expect("cmdline")
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (comm.trim().to_string(), args)
}

/// `ps` and `top` name every component `ate <role>` (not `exe`, not `/proc/self/exe`): the
/// ones `ate up` starts, and the log relay a worker starts beside each actor.
#[test]
fn components_show_as_ate_in_ps_and_top() {
    let sys = System::up(UpOptions::default());
    let (comm, args) = title_of(sys.child.id());
    assert_eq!(comm, "ate up", "{args:?}");
    for (find, title, sub) in [
        ("api --listen", "ate api", "api"),
        ("router --listen", "ate router", "router"),
        ("node --name", "ate node", "node"),
        ("worker --id worker-1", "ate worker", "worker"),
    ] {
        let pid = sys
            .pid_of(find)
            .unwrap_or_else(|| panic!("no process {find}"));
        let (comm, args) = title_of(pid);
        assert_eq!(comm, title, "{args:?}");
        assert_eq!(args.first().map(String::as_str), Some("ate"), "{args:?}");
        assert_eq!(args.get(1).map(String::as_str), Some(sub), "{args:?}");
    }
    sys.ate_ok(&create_actor_args("t1", "ate-demo", "ate-demo/counter"));
    assert_eq!(get(sys.router_addr, "ate-demo/t1", "/").0, 200);
    // The relay writing this system's actor log (its stdout is under this state dir).
    let state = sys.state_dir();
    let relay = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_link(format!("/proc/{pid}/fd/1"))
                .is_ok_and(|out| out.starts_with(&state) && out.to_string_lossy().contains("t1"))
                && title_of(*pid).1.iter().any(|a| a == "log-relay")
        })
        .expect("the actor's log relay");
    let (comm, args) = title_of(relay);
    assert_eq!(comm, "ate log-relay", "{args:?}");
    assert_eq!(args, ["ate", "log-relay"]);
}
