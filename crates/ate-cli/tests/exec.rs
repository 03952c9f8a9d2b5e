//! `ate exec` end to end (real runc): the command runs in the actor's sandbox through api →
//! node → worker; the CLI's exit code is the command's; stdout and stderr stay apart; `-t`
//! gives a terminal; a SUSPENDED actor is resumed first with its memory; errors are clear and
//! exit non-zero (127/126 for a command that cannot run); a client that goes away, and a
//! suspend, end the session and leave no process in the sandbox; an open session keeps the
//! actor from idle suspend; the router's identity is refused.

mod support;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

const NS: &str = "ate-demo";

fn one_worker() -> System {
    System::up(UpOptions::with_workers(1))
}

fn exec(sys: &System, args: &[&str]) -> Output {
    let mut all = vec!["exec"];
    all.extend_from_slice(args);
    sys.ate(&all)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `ate exec actor NAME -a ate-demo -- COMMAND…` in the background.
fn spawn_exec(sys: &System, name: &str, command: &[&str]) -> Child {
    Command::new(ATE)
        .arg("--api")
        .arg(&sys.api)
        .env("ATE_STATE_DIR", sys.state_dir())
        .args(["exec", "actor", name, "-a", NS, "--"])
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ate exec")
}

/// The sandbox's process list (busybox `ps`).
fn ps(sys: &System, name: &str) -> String {
    let out = exec(sys, &["actor", name, "-a", NS, "--", "ps"]);
    assert!(out.status.success(), "ps: {}", text(&out.stderr));
    text(&out.stdout)
}

fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn exit_codes_streams_terminal_and_errors() {
    let sys = one_worker();
    create_actor(&sys, NS, "c1", "counter");

    // The exit code is the command's; stdout and stderr stay apart. The actor was SUSPENDED
    // (never started): the exec started it.
    let out = exec(
        &sys,
        &[
            "actor",
            "c1",
            "-a",
            NS,
            "--",
            "sh",
            "-c",
            "echo to-out; echo to-err >&2; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "to-out\n");
    assert_eq!(text(&out.stderr), "to-err\n");
    assert_eq!(state_of(&actor(&sys, NS, "c1")), "ACTOR_STATE_RUNNING");

    // -it: a terminal in the sandbox (here stdin is not one, so no raw mode on this side).
    let out = exec(&sys, &["-it", "actor", "c1", "-a", NS, "--", "tty"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tty = text(&out.stdout);
    assert!(tty.trim_end().starts_with("/dev/pts/"), "tty said {tty:?}");
    // Without -t there is none.
    let out = exec(&sys, &["actor", "c1", "-a", NS, "--", "tty"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));

    // -i: stdin reaches the command, and its end too.
    let mut child = Command::new(ATE)
        .arg("--api")
        .arg(&sys.api)
        .env("ATE_STATE_DIR", sys.state_dir())
        .args(["exec", "-i", "actor", "c1", "-a", NS, "--", "wc", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(&[b'x'; 100_000]).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "100000");

    // A command that is not there: 127; one that cannot run: 126 (kubectl's and sh's codes).
    let out = exec(&sys, &["actor", "c1", "-a", NS, "--", "no-such-command"]);
    assert_eq!(out.status.code(), Some(127));
    let err = text(&out.stderr);
    assert!(
        err.contains("no-such-command") && err.contains("not found"),
        "{err}"
    );
    let out = exec(&sys, &["actor", "c1", "-a", NS, "--", "/etc/ate"]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("permission denied"));

    // Unknown actor, unknown container: clear errors, exit code 1.
    let out = exec(&sys, &["actor", "nobody", "-a", NS, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("ate-demo/nobody") && err.contains("not found"),
        "{err}"
    );
    let out = exec(&sys, &["actor", "c1", "-a", NS, "-c", "nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("container \"nope\" not found") && err.contains("counter"),
        "{err}"
    );
    // The command is required (after `--`).
    let out = exec(&sys, &["actor", "c1", "-a", NS]);
    assert!(!out.status.success());

    // The router's identity may not exec (as for every verb but ResumeActor).
    let tls = sys.state_dir().join("tls");
    let out = Command::new(ATE)
        .arg("--api")
        .arg(&sys.api)
        .arg("--cert")
        .arg(tls.join("router.crt"))
        .arg("--key")
        .arg(tls.join("router.key"))
        .arg("--ca")
        .arg(tls.join("ca.crt"))
        .args(["exec", "actor", "c1", "-a", NS, "--", "true"])
        .output()
        .expect("run ate");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("PermissionDenied") && err.contains("ExecActor"),
        "{err}"
    );
    // The api's audit line names the caller and the command.
    let api_log = sys.log("api");
    assert!(
        api_log.lines().any(|l| l.contains("audit")
            && l.contains("exec")
            && l.contains("ate-admin")
            && l.contains("no-such-command")),
        "no audit line for the exec:\n{api_log}"
    );
    // The worker counts its sessions by how they ended.
    assert!(sys.worker_metric("ate_worker_exec_sessions_total{ended=\"exited\"}") >= 4);
    assert_eq!(
        sys.worker_metric("ate_worker_exec_sessions_total{ended=\"not_run\"}"),
        2
    );
    assert_eq!(sys.worker_metric("ate_worker_exec_sessions_open"), 0);
}

#[test]
fn exec_resumes_a_suspended_actor_and_a_suspend_ends_the_session() {
    let sys = one_worker();
    create_actor(&sys, NS, "c2", "counter");
    let target = format!("{NS}/c2");
    for n in 1..=3 {
        assert_eq!(counts(&get_ok(&sys, &target, "/")), (n, n, n));
    }
    sys.ate_ok(&["suspend", "actor", "c2", "-a", NS]);
    assert_eq!(state_of(&actor(&sys, NS, "c2")), "ACTOR_STATE_SUSPENDED");

    // The exec resumes it from its memory snapshot: the counter's process is the same one
    // (PID 1), and its memory count goes on from 3.
    let out = exec(
        &sys,
        &["actor", "c2", "-a", NS, "--", "cat", "/proc/1/cmdline"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("/counter"));
    assert_eq!(state_of(&actor(&sys, NS, "c2")), "ACTOR_STATE_RUNNING");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 4, 4));

    // A suspend while a session is open ends it, with a message on its stderr, and its
    // process is not in the generation: the next resume has only the actor's own.
    let session = spawn_exec(&sys, "c2", &["sleep", "1000"]);
    wait_until(
        "sleep running in the sandbox",
        Duration::from_secs(10),
        || ps(&sys, "c2").contains("sleep 1000"),
    );
    let begun = Instant::now();
    sys.ate_ok(&["suspend", "actor", "c2", "-a", NS]);
    eprintln!(
        "[timing] suspend with an open session: {} ms",
        ms(begun.elapsed())
    );
    let out = session.wait_with_output().expect("wait");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("exec session ended") && err.contains("being suspended"),
        "{err}"
    );
    assert_eq!(state_of(&actor(&sys, NS, "c2")), "ACTOR_STATE_SUSPENDED");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (5, 5, 5));
    assert!(
        !ps(&sys, "c2").contains("sleep"),
        "the session's process came back"
    );
}

#[test]
fn a_client_that_goes_away_leaves_no_process_and_sessions_keep_the_actor_awake() {
    let sys = one_worker();
    // The counter with a 2 s idle timeout.
    let images = images_dir();
    let yaml = format!(
        "apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata:
  namespace: {NS}
  name: quick-idle
spec:
  containers:
    - name: main
      image: oci-layout:{images}/counter:latest
      wakeupProbe:
        httpGet: {{path: /healthz, port: 80}}
        timeoutSeconds: 10
  resources: {{cpu: 250m, memory: 64Mi}}
  snapshots: {{fidelity: memory}}
  idleTimeout: 2s
",
        images = images.display()
    );
    let path = sys.dir.path().join("quick-idle.yaml");
    std::fs::write(&path, yaml).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8")]);
    create_actor(&sys, NS, "c3", "quick-idle");

    // A client killed in the middle of a command: its whole process tree goes.
    let mut session = spawn_exec(&sys, "c3", &["sh", "-c", "sleep 1000; echo done"]);
    wait_until(
        "sleep running in the sandbox",
        Duration::from_secs(10),
        || ps(&sys, "c3").contains("sleep 1000"),
    );
    session.kill().expect("kill the client");
    let _ = session.wait();
    wait_until(
        "the session's processes gone",
        Duration::from_secs(5),
        || {
            let list = ps(&sys, "c3");
            !list.contains("sleep") && !list.contains("sh -c")
        },
    );

    // An open session (silent, no request) keeps the actor from idle suspend; once it ends,
    // the actor is suspended as idle.
    let session = spawn_exec(&sys, "c3", &["sleep", "6"]);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        state_of(&actor(&sys, NS, "c3")),
        "ACTOR_STATE_RUNNING",
        "suspended while a session was open"
    );
    let out = session.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_state(
        &sys,
        NS,
        "c3",
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(15),
    );
}

#[test]
fn exec_into_a_crashed_actor_is_refused_with_the_revert_hint() {
    let sys = one_worker();
    sys_apply(&sys, NS, "never-ready", &probe_on_closed_port(1));
    create_actor(&sys, NS, "broken", "never-ready");
    let (status, _, _) = get(sys.router_addr, &format!("{NS}/broken"), "/");
    assert_eq!(status, 503);
    wait_state(
        &sys,
        NS,
        "broken",
        "ACTOR_STATE_CRASHED",
        Duration::from_secs(30),
    );
    let out = exec(&sys, &["actor", "broken", "-a", NS, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("ACTOR_STATE_CRASHED") && err.contains("RevertActor"),
        "{err}"
    );
}

#[test]
fn exec_into_each_container_of_an_actor_with_a_sidecar() {
    let sys = one_worker();
    let path = sys.dir.path().join("pair.yaml");
    let template = two_counters_template(NS, "pair", 9000, 10, None);
    std::fs::write(&path, template).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8")]);
    create_actor(&sys, NS, "pair", "pair");
    let sh = |container: &str, script: &str| {
        exec(
            &sys,
            &[
                "actor", "pair", "-a", NS, "-c", container, "--", "sh", "-c", script,
            ],
        )
    };
    // Each container's own root, environment and volume mounts.
    let out = sh("side", "echo $PORT; ls -d /side-data");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "9000\n/side-data\n");
    let out = sh("main", "echo $SIDECAR_ADDR; ls -d /side-data");
    assert_eq!(out.status.code(), Some(1), "main sees the sidecar's mount");
    assert_eq!(text(&out.stdout), "127.0.0.1:9000\n");
    // The first container by default.
    let out = exec(
        &sys,
        &[
            "actor",
            "pair",
            "-a",
            NS,
            "--",
            "sh",
            "-c",
            "echo $SIDECAR_ADDR",
        ],
    );
    assert_eq!(
        text(&out.stdout),
        "127.0.0.1:9000\n",
        "{}",
        text(&out.stderr)
    );
    // Without the CAP_SYS_CHROOT ate-init holds (chroot refused), in either container.
    for c in ["main", "side"] {
        let out = sh(c, "chroot / true");
        assert!(!out.status.success(), "chroot allowed in {c}");
    }
    // A command that is not there: 127, as for one container.
    let out = exec(
        &sys,
        &["actor", "pair", "-a", NS, "-c", "side", "--", "no-such"],
    );
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no-such"));
}

/// `-it` from a real terminal (a pty this test holds the master of, the CLI in a session of its
/// own with the slave as its controlling terminal): the terminal is raw during the session and
/// restored after, its size reaches the command at the start and after a resize (SIGWINCH).
#[test]
fn a_local_terminal_is_raw_and_its_size_follows() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let sys = one_worker();
    create_actor(&sys, NS, "c4", "counter");
    let size = |columns: u16, rows: u16| nix::pty::Winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(&size(91, 33), None).expect("openpty");
    let slave = std::fs::File::from(pty.slave);
    let mut command = Command::new(ATE);
    command
        .arg("--api")
        .arg(&sys.api)
        .env("ATE_STATE_DIR", sys.state_dir())
        .args(["exec", "-it", "actor", "c4", "-a", NS, "--"])
        .args(["sh", "-c", "stty size; read x; stty size; exit 4"])
        .stdin(slave.try_clone().expect("dup"))
        .stdout(slave.try_clone().expect("dup"))
        .stderr(slave.try_clone().expect("dup"));
    // SAFETY: setsid and TIOCSCTTY between fork and exec: plain syscalls.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("spawn ate exec");
    let mut master = std::fs::File::from(pty.master);
    // What the terminal shows, read on a thread of its own (reads block).
    let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    {
        let shown = shown.clone();
        let mut reader = master.try_clone().expect("dup");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    return;
                }
                shown
                    .lock()
                    .expect("lock")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    let shows = |needle: &str| shown.lock().expect("lock").contains(needle);
    let start = Instant::now();
    while !shows("33 91") {
        let now = shown.lock().expect("lock").clone();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the first size not shown; the terminal shows {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let termios = nix::sys::termios::tcgetattr(&slave).expect("tcgetattr");
    assert!(
        !termios
            .local_flags
            .contains(nix::sys::termios::LocalFlags::ICANON),
        "the terminal is not raw during the session"
    );
    // A resize: the kernel tells the CLI (SIGWINCH), the CLI tells the command's terminal.
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which lives for the call.
    let r = unsafe {
        nix::libc::ioctl(
            master.as_raw_fd(),
            nix::libc::TIOCSWINSZ,
            &size(100, 40) as *const nix::pty::Winsize,
        )
    };
    assert_eq!(r, 0);
    std::thread::sleep(Duration::from_millis(500));
    master.write_all(b"\r").expect("type Enter");
    wait_until("the new size shown", Duration::from_secs(10), || {
        shows("40 100")
    });
    let status = child.wait().expect("wait");
    assert_eq!(
        status.code(),
        Some(4),
        "shown: {}",
        shown.lock().expect("lock")
    );
    let termios = nix::sys::termios::tcgetattr(&slave).expect("tcgetattr");
    assert!(
        termios
            .local_flags
            .contains(nix::sys::termios::LocalFlags::ICANON),
        "the terminal was not restored"
    );
}

/// A sandbox CRIU restored lives in a time namespace of its own, which runc exec does not join:
/// what an exec leaves running there is killed before the next dump, so the actor is restored
/// again (with its memory) instead of failing its restore.
#[test]
fn a_command_left_running_in_a_restored_actor_does_not_break_its_next_restore() {
    let opts = || UpOptions::with_workers(1);
    let sys = System::up(opts());
    create_actor(&sys, NS, "c6", "counter");
    let target = format!("{NS}/c6");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (1, 1, 1));
    // Stopping `ate up` suspends the actor; the next request restores it from its dump.
    let sys = sys.restart_with_env(opts(), &[]);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (2, 2, 2));
    let out = exec(
        &sys,
        &["actor", "c6", "-a", NS, "--", "sh", "-c", "sleep 1006 &"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(ps(&sys, "c6").contains("sleep 1006"));
    let sys = sys.restart_with_env(opts(), &[]);
    assert_eq!(
        counts(&get_ok(&sys, &target, "/")),
        (3, 3, 3),
        "not restored: {}",
        actor(&sys, NS, "c6")
    );
    assert!(!ps(&sys, "c6").contains("sleep 1006"));
}
