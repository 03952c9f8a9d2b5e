//! Actors' alarms end to end on real runc workers under `ate up` (issue 31): an actor sets its
//! alarm through the local actor API (the counter's `POST /alarm?in=S`, which asks
//! `169.254.17.1/v1/alarm` for `POST /on-alarm` then); the api keeps it in the store and, when
//! due, POSTs through the router, resuming the actor if suspended. Alarms survive a worker
//! `kill -9` and an api `kill -9`.

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

/// `alarms delivered: N` of the counter, read through the router (resumes it if needed).
fn delivered(sys: &System, actor: &str) -> u64 {
    let body = get_ok(sys, actor, "/alarms");
    body.trim()
        .strip_prefix("alarms delivered: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected /alarms answer {body:?}"))
}

/// Sets `actor`'s alarm `secs` ahead from inside it.
fn set_alarm(sys: &System, actor: &str, secs: u64) {
    let (status, _, body) = request(
        sys.router_addr,
        "POST",
        actor,
        &format!("/alarm?in={secs}"),
        "",
    );
    assert_eq!(status, 200, "setting the alarm: {body}");
    assert!(body.contains("/on-alarm"), "{body}");
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// A counter `ns/name` (template `ns/counter`) that answered once, with an alarm due in `secs`.
fn counter_with_alarm(sys: &System, ns: &str, name: &str, secs: u64) {
    sys_apply(sys, ns, "counter", &Tpl::counter());
    create_actor(sys, ns, name, "counter");
    get_ok(sys, &format!("{ns}/{name}"), "/");
    set_alarm(sys, &format!("{ns}/{name}"), secs);
}

#[test]
fn an_alarm_wakes_a_suspended_actor_once_and_bad_asks_name_the_field() {
    let sys = System::up(UpOptions::default());
    counter_with_alarm(&sys, "n1", "sleepy", 3);
    let listed = sys.ate_ok(&["get", "alarms", "-a", "n1"]);
    assert!(
        listed.contains("n1/sleepy") && listed.contains("/on-alarm") && listed.contains("pending"),
        "{listed}"
    );
    sys.ate_ok(&["suspend", "actor", "sleepy", "-a", "n1"]);
    wait_state(
        &sys,
        "n1",
        "sleepy",
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(30),
    );
    // Nobody calls it: the alarm alone wakes it.
    wait_state(
        &sys,
        "n1",
        "sleepy",
        "ACTOR_STATE_RUNNING",
        Duration::from_secs(20),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while sys
        .ate_ok(&["get", "alarms", "-a", "n1"])
        .contains("n1/sleepy")
    {
        assert!(
            Instant::now() < deadline,
            "the delivered alarm is still listed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(delivered(&sys, "n1/sleepy"), 1);
    // Delivered once: nothing more comes.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(delivered(&sys, "n1/sleepy"), 1);
    assert!(
        sys.log("api").contains("alarm delivered"),
        "the api logs the delivery"
    );

    // Bad input gets a 400 naming the field, and sets nothing.
    let (status, _, body) = get(
        sys.router_addr,
        "n1/sleepy",
        "/call?path=/v1/alarm&method=POST&body=%7B%22in%22%3A%22soon%22%7D",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid in"), "{body}");
    assert!(
        sys.ate_ok(&["get", "alarms", "-a", "n1"])
            .contains("no alarms")
    );
    // A delivery's `ate-alarm-attempt` sent by anyone else is dropped: the counter logs
    // "attempt ?" for this one, "attempt 1" for the real one.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(sys.router_addr).expect("connect router");
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        s.write_all(
            b"POST /on-alarm HTTP/1.1\r\nHost: t\r\nate-target-actor: n1/sleepy\r\n\
              ate-alarm-attempt: 7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .expect("write");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let logs = sys.ate_ok(&["logs", "actor", "sleepy", "-a", "n1"]);
    assert!(logs.contains("alarm delivered 1 (attempt 1)"), "{logs}");
    assert!(logs.contains("alarm delivered 2 (attempt ?)"), "{logs}");
    assert!(!logs.contains("attempt 7"), "{logs}");
}

#[test]
fn an_alarm_survives_a_worker_and_an_api_kill() {
    let sys = System::up(UpOptions::default());
    counter_with_alarm(&sys, "n2", "steady", 8);
    // Both workers and the api die before it is due; `ate up` starts them again.
    for component in [
        "worker --id worker-1",
        "worker --id worker-2",
        "api --listen",
    ] {
        let pid = sys
            .pid_of(component)
            .unwrap_or_else(|| panic!("no pid for {component}"));
        kill9(pid);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = get(sys.router_addr, "n2/steady", "/alarms");
        if status == 200 && body.contains("alarms delivered: 1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the alarm was not delivered after the kills: {status} {body}\n{}",
            sys.log("api")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The actor's memory survived the worker's death too (re-adopted, counter intact).
    let body = get_ok(&sys, "n2/steady", "/");
    assert!(body.contains("preserved memory count: 2"), "{body}");
}
