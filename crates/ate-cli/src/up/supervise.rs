//! Process supervision of `ate up`'s components: start (each in its own process group, with its
//! log), restart after a backoff, give up on a crash loop, stop in order; and the start-up waits.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

// The running executable, as the kernel keeps it (Linux).
use ate_cmd::SELF_EXE;

/// The descriptor of this `ate up`'s generation lock (`generation.rs`), handed to every
/// component it starts; unset (tests) hands nothing down.
static GENERATION_FD: std::sync::OnceLock<std::os::fd::RawFd> = std::sync::OnceLock::new();

/// Every component started from now on inherits `fd` (the generation lock), so the lock is held
/// as long as any of them lives.
pub(super) fn hand_down(fd: std::os::fd::RawFd) {
    let _ = GENERATION_FD.set(fd);
}
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping component gets before it is killed. Generous: a worker stops every
/// sandbox it hosts first, and a killed worker leaves them running.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// How often the main loop looks for exited components.
const POLL: Duration = Duration::from_millis(200);
/// Restart delay after a component's first exit; doubles with each exit up to `BACKOFF_MAX`.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A component that ran this long before exiting counts as healthy: its backoff starts over.
const BACKOFF_RESET: Duration = Duration::from_secs(60);
/// More than `CRASH_LIMIT` exits of one component within `CRASH_WINDOW` is a crash loop that
/// restarts will not fix.
const CRASH_LIMIT: usize = 10;
const CRASH_WINDOW: Duration = Duration::from_secs(5 * 60);

/// What a component is; decides its place in the stop order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Api,
    Node,
    Worker,
    Router,
}

/// No new requests first; then the workers, which suspend their actors through the node agent and
/// the api, so those two must outlive them.
const STOP_ORDER: [Role; 4] = [Role::Router, Role::Worker, Role::Node, Role::Api];

/// The restart delays and recent failures of one component.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    /// Failures (exits and failed restarts) within the last `CRASH_WINDOW`.
    failures: VecDeque<Instant>,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: BACKOFF_FIRST,
            failures: VecDeque::new(),
        }
    }

    /// Records a failure at `now` of a process that had been up for `up` (zero for a restart that
    /// could not be spawned). Returns the delay before the next restart, or `None` when the
    /// component failed more than `CRASH_LIMIT` times within `CRASH_WINDOW`.
    fn failed(&mut self, now: Instant, up: Duration) -> Option<Duration> {
        if up >= BACKOFF_RESET {
            self.next = BACKOFF_FIRST;
        }
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > CRASH_WINDOW)
        {
            self.failures.pop_front();
        }
        if self.failures.len() > CRASH_LIMIT {
            return None;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Some(delay)
    }
}

/// A supervised child process.
pub(super) struct Component {
    pub(super) name: String,
    role: Role,
    /// The arguments after the executable, kept to restart the component identically.
    pub(super) args: Vec<String>,
    /// Environment added to `ate up`'s own (kept for restarts too).
    env: Vec<(String, String)>,
    pub(super) log: PathBuf,
    /// `None` between an exit and the restart.
    child: Option<Child>,
    /// When `child` was started, to tell a crash from an exit after a healthy run.
    since: Instant,
    /// When to start the component again while `child` is `None`.
    restart_at: Option<Instant>,
    backoff: Backoff,
}

impl Component {
    fn pid(&self) -> Option<Pid> {
        self.child
            .as_ref()
            .and_then(Child::id)
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
    }

    /// The exit status once the process has exited; `None` while it runs or while none does.
    pub(super) fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => child.try_wait(),
            None => Ok(None),
        }
    }
}

pub(super) fn spawn(
    name: &str,
    role: Role,
    args: Vec<String>,
    logs: &Path,
) -> anyhow::Result<Component> {
    spawn_with_env(name, role, args, logs, Vec::new())
}

pub(super) fn spawn_with_env(
    name: &str,
    role: Role,
    args: Vec<String>,
    logs: &Path,
    env: Vec<(String, String)>,
) -> anyhow::Result<Component> {
    let log = logs.join(format!("{name}.log"));
    let child = start_process(name, &args, &env, &log)?;
    Ok(Component {
        name: name.to_string(),
        role,
        args,
        env,
        log,
        child: Some(child),
        since: Instant::now(),
        restart_at: None,
        backoff: Backoff::new(),
    })
}

/// Starts `ate ARGS` with stdout and stderr appended to `log`.
fn start_process(
    name: &str,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> anyhow::Result<Child> {
    // This very executable even after the file was replaced on disk (an upgrade or a rebuild
    // while `ate up` runs): `current_exe()` would then name a path that no longer exists and
    // every restart would fail.
    let exe = match std::fs::metadata(SELF_EXE) {
        Ok(_) => PathBuf::from(SELF_EXE),
        Err(_) => std::env::current_exe().context("cannot find the ate executable")?,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let stdout = file
        .try_clone()
        .with_context(|| format!("cannot open {}", log.display()))?;
    let supervisor = nix::unistd::getpid();
    let generation = GENERATION_FD.get().copied();
    let mut command = Command::new(exe);
    command
        // `ps` shows `ate worker --id worker-1 …`, not `/proc/self/exe worker …`.
        .arg0("ate")
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file)
        // Its own process group: a Ctrl-C in the terminal then reaches only `ate up`, which stops
        // the components in order, instead of all of them at once.
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // (prctl, getppid, fcntl), which are async-signal-safe; it allocates nothing and takes no
    // lock. The generation descriptor stays open in `ate up` for its whole life.
    unsafe {
        command.pre_exec(move || {
            if let Some(fd) = generation {
                // The generation lock goes to the component (close-on-exec cleared in the child
                // only); the component marks it close-on-exec again at its start, so nothing it
                // starts holds it.
                let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
                nix::fcntl::fcntl(
                    borrowed,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )
                .map_err(std::io::Error::from)?;
            }
            // A supervisor that dies without stopping its children (SIGKILL) takes them along:
            // a worker stopped this way leaves its sandboxes running for the next `ate up` to
            // re-adopt, and no orphaned api or router holds the ports the next one needs.
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != supervisor {
                // The supervisor died before the line above: no signal would ever come.
                return Err(std::io::Error::other("ate up exited"));
            }
            Ok(())
        });
    }
    command
        .spawn()
        .with_context(|| format!("cannot start {name}"))
}

/// `message`, followed by the last `lines` lines of `log` if it has any.
fn with_tail(message: String, log: &Path, lines: usize) -> String {
    let tail = tail(log, lines);
    if tail.is_empty() {
        message
    } else {
        format!("{message}. Last log lines:\n{tail}")
    }
}

/// One supervision pass: notices components that exited, schedules their restarts and performs
/// those that are due. Fails when a component crash-loops.
fn supervise(components: &mut [Component]) -> anyhow::Result<()> {
    let now = Instant::now();
    for c in components.iter_mut() {
        // An error from `try_wait` is left for the next pass, as an exit we cannot see yet.
        if let Ok(Some(status)) = c.try_wait() {
            c.child = None;
            let up = now.saturating_duration_since(c.since);
            let Some(delay) = c.backoff.failed(now, up) else {
                anyhow::bail!(with_tail(
                    format!(
                        "{} exited ({status}) more than {CRASH_LIMIT} times within {} minutes; \
                         giving up",
                        c.name,
                        CRASH_WINDOW.as_secs() / 60
                    ),
                    &c.log,
                    20
                ));
            };
            eprintln!(
                "ate up: {}",
                with_tail(
                    format!(
                        "{} exited ({status}); restarting it in {} ms",
                        c.name,
                        delay.as_millis()
                    ),
                    &c.log,
                    10
                )
            );
            c.restart_at = Some(now + delay);
        }
        if c.child.is_none() && c.restart_at.is_some_and(|t| t <= now) {
            match start_process(&c.name, &c.args, &c.env, &c.log) {
                Ok(child) => {
                    c.child = Some(child);
                    c.since = now;
                    c.restart_at = None;
                }
                Err(e) => {
                    let Some(delay) = c.backoff.failed(now, Duration::ZERO) else {
                        anyhow::bail!(
                            "cannot restart {}: {e:#}; it failed more than {CRASH_LIMIT} times \
                             within {} minutes, giving up",
                            c.name,
                            CRASH_WINDOW.as_secs() / 60
                        );
                    };
                    eprintln!(
                        "ate up: cannot restart {}: {e:#}; retrying in {} ms",
                        c.name,
                        delay.as_millis()
                    );
                    c.restart_at = Some(now + delay);
                }
            }
        }
    }
    Ok(())
}

/// How long the main loop sleeps: one poll interval, less when a restart is due sooner.
fn next_wake(components: &[Component], now: Instant) -> Duration {
    components
        .iter()
        .filter_map(|c| c.restart_at)
        .min()
        .map_or(POLL, |t| t.saturating_duration_since(now).min(POLL))
}

/// Restarts components that exit until SIGINT/SIGTERM (SUCCESS) or a crash loop (FAILURE).
pub(super) async fn supervise_until_stopped(
    components: &mut [Component],
    signal: &mut std::pin::Pin<&mut impl std::future::Future<Output = ate_tls::process::Signal>>,
) -> ExitCode {
    loop {
        let wake = next_wake(components, Instant::now());
        tokio::select! {
            // The signal first: nothing is restarted once stopping has begun.
            biased;
            _ = signal.as_mut() => {
                eprintln!("ate up: stopping");
                return ExitCode::SUCCESS;
            }
            _ = tokio::time::sleep(wake) => {
                if let Err(e) = supervise(components) {
                    eprintln!("ate up: {e:#}; stopping everything");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
}

/// Sets the value following `flag` in `args`, if the flag is there.
pub(super) fn set_flag(args: &mut [String], flag: &str, value: &str) {
    if let Some(i) = args.iter().position(|a| a == flag)
        && let Some(v) = args.get_mut(i + 1)
    {
        *v = value.to_string();
    }
}

/// Last lines of a log, for the report when a component dies.
pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(super) async fn wait_ready(
    c: &mut Component,
    ready_file: &Path,
) -> anyhow::Result<serde_json::Value> {
    wait_until(c, "ready", |_| {
        let text = std::fs::read_to_string(ready_file).ok()?;
        serde_json::from_str(&text).ok()
    })
    .await
}

pub(super) async fn wait_listening(c: &mut Component, addr: SocketAddr) -> anyhow::Result<()> {
    // The component's own socket, not merely something answering there: a neighbour that took
    // the port (an ephemeral bind by another process) must not make a router that cannot bind
    // look ready.
    wait_until(c, &format!("listening on {addr}"), |c| {
        c.child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .is_some_and(|pid| listens_on(pid, addr.port()))
            .then_some(())
    })
    .await
}

/// Polls `ready` every 50 ms until it gives a value; an error when `c` exits first or after
/// [`READY_TIMEOUT`] (`state` is what `c` is then not).
async fn wait_until<T>(
    c: &mut Component,
    state: &str,
    mut ready: impl FnMut(&Component) -> Option<T>,
) -> anyhow::Result<T> {
    let started = Instant::now();
    loop {
        if let Some(status) = c.try_wait()? {
            anyhow::bail!(
                "{} exited during start-up ({status}); last log lines:\n{}",
                c.name,
                tail(&c.log, 20)
            );
        }
        if let Some(value) = ready(c) {
            return Ok(value);
        }
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!(
                "{} not {state} after {READY_TIMEOUT:?}; see {}",
                c.name,
                c.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4 or IPv6), read from
/// `/proc`: the socket inodes among its descriptors against the LISTEN entries of its network
/// namespace.
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let sockets: std::collections::HashSet<u64> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    ["tcp", "tcp6"].iter().any(|table| {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            return false;
        };
        text.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st … inode (10th field); st 0A is LISTEN.
            let local_port = fields
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            let inode = fields.get(9).and_then(|i| i.parse::<u64>().ok());
            fields.get(3) == Some(&"0A")
                && local_port == Some(port)
                && inode.is_some_and(|i| sockets.contains(&i))
        })
    })
}

/// Stops the components group by group in `STOP_ORDER`.
/// Runs `start` on `components` unless a shutdown signal comes first; when start-up fails or is
/// interrupted, stops whatever already started.
pub(super) async fn start_or_stop<T>(
    components: &mut Vec<Component>,
    signal: &mut std::pin::Pin<&mut impl std::future::Future<Output = ate_tls::process::Signal>>,
    start: impl AsyncFnOnce(&mut Vec<Component>) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let started = tokio::select! {
        r = start(components) => r,
        _ = signal.as_mut() => Err(anyhow::anyhow!("interrupted during start-up")),
    };
    if started.is_err() {
        stop_all(components).await;
    }
    started
}

pub(super) async fn stop_all(components: &mut [Component]) {
    for role in STOP_ORDER {
        stop_group(components, role).await;
    }
}

/// SIGTERMs every running component of `role` and waits for them to exit, killing one that is
/// still running after `STOP_GRACE`.
async fn stop_group(components: &mut [Component], role: Role) {
    for c in components.iter().filter(|c| c.role == role) {
        if let Some(pid) = c.pid() {
            let _ = kill(pid, Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    for c in components.iter_mut().filter(|c| c.role == role) {
        let Some(child) = c.child.as_mut() else {
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, child.wait()).await.is_err() {
            eprintln!(
                "ate up: {} did not stop within {STOP_GRACE:?}; killing it",
                c.name
            );
            let _ = child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets_after_a_healthy_run() {
        let mut b = Backoff::new();
        let t0 = Instant::now();
        let delays: Vec<_> = (0..8)
            .map(|i| b.failed(t0 + Duration::from_secs(40 * i), Duration::ZERO))
            .collect();
        let ms = |m| Some(Duration::from_millis(m));
        assert_eq!(
            delays,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(6400),
                ms(10_000)
            ]
        );
        let later = t0 + Duration::from_secs(400);
        assert_eq!(b.failed(later, BACKOFF_RESET), ms(100));
        assert_eq!(b.failed(later, Duration::from_secs(1)), ms(200));
    }

    #[test]
    fn more_than_ten_exits_within_five_minutes_is_a_crash_loop() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        for i in 0..CRASH_LIMIT as u64 {
            assert!(
                b.failed(t0 + Duration::from_secs(i), Duration::ZERO)
                    .is_some()
            );
        }
        assert_eq!(b.failed(t0 + Duration::from_secs(20), Duration::ZERO), None);

        // Exits spread over more than the window never add up to the limit.
        let mut b = Backoff::new();
        for i in 0..30 {
            let at = t0 + Duration::from_secs(31 * i);
            assert!(b.failed(at, Duration::ZERO).is_some(), "exit {i}");
        }
    }

    /// A component that exits at once (this test binary with `--list`) is restarted after the
    /// backoff, with the same arguments.
    #[tokio::test]
    async fn an_exited_component_is_restarted_after_its_backoff() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut components = vec![spawn(
            "lister",
            Role::Worker,
            vec!["--list".into()],
            dir.path(),
        )?];
        let started = Instant::now();
        while components[0].backoff.failures.len() < 2 {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(20), "not restarted");
            supervise(&mut components)?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Two exits: the first waited 100 ms, the second is waiting 200 ms.
        assert!(started.elapsed() >= BACKOFF_FIRST);
        assert!(components[0].child.is_none());
        assert_eq!(components[0].backoff.next, Duration::from_millis(400));
        let log = std::fs::read_to_string(dir.path().join("lister.log"))?;
        // Both runs listed the tests, into the same (appended) log.
        let listed = "an_exited_component_is_restarted_after_its_backoff: test";
        assert_eq!(log.matches(listed).count(), 2, "{log}");
        Ok(())
    }

    #[test]
    fn listens_on_sees_only_listening_sockets_of_that_process() -> anyhow::Result<()> {
        let me = std::process::id();
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        assert!(listens_on(me, port));
        // A connected socket on another port is not a listener there.
        let client = std::net::TcpStream::connect(("127.0.0.1", port))?;
        let client_port = client.local_addr()?.port();
        assert!(!listens_on(me, client_port));
        drop(listener);
        assert!(!listens_on(me, port));
        // Another process's listener is not ours (pid 1 holds none of our sockets).
        let again = std::net::TcpListener::bind("127.0.0.1:0")?;
        assert!(!listens_on(1, again.local_addr()?.port()));
        Ok(())
    }

    #[test]
    fn set_flag_replaces_only_the_value_after_the_flag() {
        let mut args: Vec<String> = ["api", "--listen", "127.0.0.1:0", "--http-listen", "x"]
            .map(String::from)
            .to_vec();
        set_flag(&mut args, "--listen", "127.0.0.1:4000");
        set_flag(&mut args, "--absent", "y");
        assert_eq!(
            args,
            ["api", "--listen", "127.0.0.1:4000", "--http-listen", "x"]
        );
    }
}
