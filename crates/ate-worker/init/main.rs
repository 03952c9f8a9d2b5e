//! `ate-init`: PID 1 of an actor sandbox whose template has several containers.
//!
//! One runc container holds the whole actor (one cgroup, one network namespace, one process tree
//! for CRIU), like a gVisor sandbox holds a pod. The first container runs on the sandbox's root
//! (its own image's rootfs, as a single-container actor does); every other container runs
//! chrooted into its own rootfs, bind-mounted at `/.ate/containers/<name>` with its own
//! `/proc`, `/dev` and volumes. This program starts them, prefixes each line they print with
//! `[<name>] ` (so `ate logs actor NAME -c CONTAINER` can pick one), forwards SIGTERM/SIGINT to
//! them, reaps every process of the sandbox, and ends the actor when a container whose exit
//! policy is `stop` exits.
//!
//! It is built by `build.rs` with `rustc -C target-feature=+crt-static` and only `std`, so it
//! runs on any image root (no dynamic loader or libc needed in the image). The worker writes it
//! into the first container's rootfs upper dir at a cold start, so a memory snapshot carries the
//! very bytes its restored process maps.
//!
//! Its plan (`/.ate/plan`, written by the worker) is a list of NUL-terminated words:
//! `container NAME exit stop|ignore root PATH cwd PATH (arg WORD)* (env K=V)* end`, once per
//! container, the first container first (its `root` is empty).
//!
//! `ate-init --exec NAME -- COMMAND…` (what the worker runs through `runc exec` for `ate exec`)
//! is not PID 1: it runs COMMAND in container NAME as the plan describes it (its root, working
//! directory and environment) without CAP_SYS_CHROOT, and exits 127 / 126 when it cannot.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[repr(C)]
struct SigSet([u64; 16]);

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

unsafe extern "C" {
    fn sigemptyset(set: *mut SigSet) -> i32;
    fn sigaddset(set: *mut SigSet, sig: i32) -> i32;
    fn pthread_sigmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    fn sigtimedwait(set: *const SigSet, info: *mut [u64; 16], timeout: *const Timespec) -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
    fn capget(header: *mut CapHeader, data: *mut CapData) -> i32;
    fn capset(header: *mut CapHeader, data: *const CapData) -> i32;
}

const CAP_VERSION_3: u32 = 0x2008_0522;
const CAP_SYS_CHROOT: u32 = 18;

/// Takes CAP_SYS_CHROOT out of this process's effective and permitted sets (the sandbox gives
/// it to ate-init alone; with no_new_privs an exec cannot get it back).
fn drop_chroot_capability() -> std::io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset with a v3 header and the two data words v3 uses.
    unsafe {
        if capget(&mut header, data.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        data[0].effective &= !(1 << CAP_SYS_CHROOT);
        data[0].permitted &= !(1 << CAP_SYS_CHROOT);
        if capset(&mut header, data.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
const SIGCHLD: i32 = 17;
const SIG_BLOCK: i32 = 0;
const SIG_SETMASK: i32 = 2;
const WNOHANG: i32 = 1;
/// How long containers get to end after a stop signal before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// A line longer than this is printed in pieces (each with the prefix).
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Plan {
    name: String,
    stop_on_exit: bool,
    root: String,
    cwd: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

struct Running {
    name: String,
    pid: i32,
    stop_on_exit: bool,
    status: Option<i32>,
    relay: JoinHandle<()>,
}

/// Waits (briefly: a process the container left behind may hold its pipe) until `relay` has
/// printed what the container wrote, so its exit is reported after its last words.
fn drained(relay: &JoinHandle<()>, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !relay.is_finished() {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "[ate-init] {text}");
    let _ = out.flush();
}

fn parse_plan(bytes: &[u8]) -> Result<Vec<Plan>, String> {
    let mut words = bytes
        .split(|b| *b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned());
    let mut plans = Vec::new();
    let mut current: Option<Plan> = None;
    while let Some(word) = words.next() {
        let mut value = || {
            words
                .next()
                .ok_or_else(|| format!("plan: {word} without a value"))
        };
        match (word.as_str(), current.as_mut()) {
            ("", _) => {}
            ("container", None) => {
                current = Some(Plan {
                    name: value()?,
                    stop_on_exit: true,
                    ..Plan::default()
                })
            }
            ("exit", Some(p)) => p.stop_on_exit = value()? != "ignore",
            ("root", Some(p)) => p.root = value()?,
            ("cwd", Some(p)) => p.cwd = value()?,
            ("arg", Some(p)) => p.args.push(value()?),
            ("env", Some(p)) => {
                let kv = value()?;
                let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
                p.env.push((k.to_string(), v.to_string()));
            }
            ("end", Some(_)) => plans.extend(current.take()),
            (other, _) => return Err(format!("plan: unexpected word {other:?}")),
        }
    }
    if current.is_some() || plans.is_empty() {
        return Err("plan: incomplete".to_string());
    }
    Ok(plans)
}

/// Copies `from` to stdout line by line, each line prefixed with `[name] ` (a line longer than
/// [`MAX_LINE`] in pieces, each prefixed).
fn relay(name: String, from: std::io::PipeReader) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let prefix = format!("[{name}] ");
        let mut reader = BufReader::new(from);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match (&mut reader)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)
            {
                Ok(0) | Err(_) => return,
                Ok(_) => write_line(&prefix, &line),
            }
        }
    })
}

fn write_line(prefix: &str, line: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(prefix.as_bytes());
    let _ = out.write_all(line);
    if !line.ends_with(b"\n") {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

fn start(plan: &Plan) -> Result<(i32, JoinHandle<()>), String> {
    let (read, write) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    let write_err = write.try_clone().map_err(|e| format!("pipe: {e}"))?;
    let program = plan
        .args
        .first()
        .ok_or_else(|| format!("container {:?} has no command", plan.name))?;
    let mut command = Command::new(program);
    command
        .args(&plan.args[1..])
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(write)
        .stderr(write_err);
    let root = plan.root.clone();
    let cwd = if plan.cwd.is_empty() {
        "/".to_string()
    } else {
        plan.cwd.clone()
    };
    // SAFETY: runs in the forked child before exec; these are plain syscalls.
    unsafe {
        command.pre_exec(move || {
            // The container starts with no signal blocked (std leaves ours in place).
            let mut empty = SigSet([0; 16]);
            sigemptyset(&mut empty);
            pthread_sigmask(SIG_SETMASK, &empty, std::ptr::null_mut());
            if !root.is_empty() {
                std::os::unix::fs::chroot(&root)?;
            }
            drop_chroot_capability()?;
            std::env::set_current_dir(&cwd)
        });
    }
    let child = command
        .spawn()
        .map_err(|e| format!("container {:?}: cannot run `{program}`: {e}", plan.name))?;
    drop(command);
    let pid = i32::try_from(child.id()).map_err(|_| "pid out of range".to_string())?;
    Ok((pid, relay(plan.name.clone(), read)))
}

/// The links runc makes in the first container's `/dev`, in a sidecar's (best effort: a program
/// that never uses them should not fail to start for them).
fn dev_links(root: &str) {
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(target, format!("{root}/dev/{link}"));
    }
}

fn describe(status: i32) -> (String, i32) {
    let s = std::process::ExitStatus::from_raw(status);
    match (s.code(), s.signal()) {
        (Some(code), _) => (format!("exited with status {code}"), code),
        (None, Some(sig)) => (format!("was killed by signal {sig}"), 128 + sig),
        _ => ("ended".to_string(), 1),
    }
}

/// In every binary that has the `--exec` mode: the worker looks for these bytes in an actor's
/// `ate-init` before it asks for the mode (an older one would read `--exec` as its plan's path).
static EXEC_MARKER: &str = "ate-init exec-mode v1";

/// `--exec NAME -- COMMAND…`: COMMAND in container NAME (see the module doc). Never returns.
fn exec_in(args: &[String]) -> ! {
    fn fail(code: i32, why: String) -> ! {
        eprintln!("{why}");
        std::process::exit(code);
    }
    let (name, command) = match args {
        [name, dashes, command @ ..] if dashes == "--" && !command.is_empty() => (name, command),
        _ => fail(
            126,
            format!("{EXEC_MARKER}: usage: --exec NAME -- COMMAND…"),
        ),
    };
    let plans = std::fs::read("/.ate/plan")
        .map_err(|e| format!("read /.ate/plan: {e}"))
        .and_then(|b| parse_plan(&b))
        .unwrap_or_else(|e| fail(126, e));
    let Some(plan) = plans.iter().find(|p| &p.name == name) else {
        fail(126, format!("no container {name:?} in this sandbox"));
    };
    if !plan.root.is_empty()
        && let Err(e) = std::os::unix::fs::chroot(&plan.root)
    {
        fail(126, format!("chroot {}: {e}", plan.root));
    }
    let cwd = if plan.cwd.is_empty() { "/" } else { &plan.cwd };
    if let Err(e) = std::env::set_current_dir(cwd) {
        fail(126, format!("chdir {cwd}: {e}"));
    }
    if let Err(e) = drop_chroot_capability() {
        fail(126, format!("drop CAP_SYS_CHROOT: {e}"));
    }
    let e = Command::new(&command[0])
        .args(&command[1..])
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .exec();
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    fail(code, format!("exec: {:?}: {e}", command[0]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--exec") {
        exec_in(&args[2..]);
    }
    let plan_path = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/.ate/plan".to_string());
    let plans = match std::fs::read(&plan_path)
        .map_err(|e| format!("read {plan_path}: {e}"))
        .and_then(|b| parse_plan(&b))
    {
        Ok(p) => p,
        Err(e) => {
            say(&e);
            std::process::exit(127);
        }
    };
    // Block the signals we wait for before any thread or child exists (children get an empty
    // mask from std). Blocked, they are queued even for a namespace's PID 1.
    let mut set = SigSet([0; 16]);
    // SAFETY: plain libc calls on a sigset we own.
    unsafe {
        sigemptyset(&mut set);
        for sig in [SIGHUP, SIGINT, SIGTERM, SIGCHLD] {
            sigaddset(&mut set, sig);
        }
        pthread_sigmask(SIG_BLOCK, &set, std::ptr::null_mut());
    }
    for plan in plans.iter().filter(|p| !p.root.is_empty()) {
        dev_links(&plan.root);
    }
    let mut running: Vec<Running> = Vec::new();
    let mut stopping: Option<(Instant, i32)> = None;
    for plan in &plans {
        match start(plan) {
            Ok((pid, relay)) => {
                running.push(Running {
                    name: plan.name.clone(),
                    pid,
                    stop_on_exit: plan.stop_on_exit,
                    status: None,
                    relay,
                });
            }
            Err(e) => {
                say(&e);
                stopping = Some((Instant::now(), 127));
                break;
            }
        }
    }
    if stopping.is_some() {
        signal_all(&running, SIGTERM);
    }
    loop {
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        let mut info = [0u64; 16];
        // SAFETY: waits for one of the blocked signals; `info` is large enough for siginfo_t.
        let sig = unsafe { sigtimedwait(&set, &mut info, &timeout) };
        if sig == SIGTERM || sig == SIGINT || sig == SIGHUP {
            if stopping.is_none() {
                let code = 128 + sig;
                stopping = Some((Instant::now(), code));
            }
            signal_all(&running, sig);
        }
        // Reap everything that ended: containers and orphans alike (this is PID 1).
        loop {
            let mut status = 0;
            // SAFETY: waitpid on any child with WNOHANG.
            let pid = unsafe { waitpid(-1, &mut status, WNOHANG) };
            if pid <= 0 {
                break;
            }
            let Some(c) = running
                .iter_mut()
                .find(|c| c.pid == pid && c.status.is_none())
            else {
                continue;
            };
            c.status = Some(status);
            drained(&c.relay, Duration::from_millis(300));
            let (what, code) = describe(status);
            if stopping.is_some() {
                say(&format!("container {:?} {what}", c.name));
            } else if c.stop_on_exit {
                say(&format!(
                    "container {:?} {what}; ending the actor (its exitPolicy is stop)",
                    c.name
                ));
                stopping = Some((Instant::now(), code));
                signal_all(&running, SIGTERM);
            } else {
                say(&format!(
                    "container {:?} {what}; the actor keeps running (its exitPolicy is ignore)",
                    c.name
                ));
            }
        }
        let all_ended = running.iter().all(|c| c.status.is_some());
        if let Some((since, code)) = stopping {
            if all_ended {
                finish(&running, code);
            }
            if since.elapsed() > STOP_GRACE {
                signal_all(&running, SIGKILL);
            }
        } else if all_ended {
            finish(&running, 0);
        }
    }
}

fn signal_all(running: &[Running], sig: i32) {
    for c in running.iter().filter(|c| c.status.is_none()) {
        // SAFETY: signals a child we started and have not reaped.
        unsafe {
            kill(c.pid, sig);
        }
    }
}

/// Lets the relays print what the containers wrote last, then ends the sandbox.
fn finish(running: &[Running], code: i32) -> ! {
    for c in running {
        drained(&c.relay, Duration::from_millis(300));
    }
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse() {
        let text = b"container\0app\0exit\0stop\0root\0\0cwd\0/srv\0arg\0/app\0arg\0a b\0env\0A=1\0end\0\
                     container\0side\0exit\0ignore\0root\0/.ate/containers/side\0cwd\0\0arg\0/side\0end\0";
        let plans = parse_plan(text).unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].args, ["/app", "a b"]);
        assert_eq!(plans[0].env, [("A".to_string(), "1".to_string())]);
        assert!(plans[0].stop_on_exit);
        assert_eq!(plans[1].root, "/.ate/containers/side");
        assert!(!plans[1].stop_on_exit);
        assert!(parse_plan(b"container\0x\0arg\0").is_err());
        assert!(parse_plan(b"").is_err());
    }
}
