//! The system under test: the bench's `ate up` (start, stop, kill), its api, and everything the
//! bench set up around it and tears down (state dir, tmpfs, PostgreSQL, leftover sandboxes).

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ate_proto::v1;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::checks::{Layout, unescape_mountinfo};
use super::load::Clock;
use super::pg::Pg;
use super::{ATESPACE, Fault, FaultsArgs, WORKER_SLOTS};
use ate_client::{self as client, Clients};

/// The demo template `ate up` registers.
const TEMPLATE: &str = "ate-demo/counter";
/// `ate up` gets this long to stop gracefully before it (and its children) are killed.
pub(super) const UP_STOP_GRACE: Duration = Duration::from_secs(60);
/// `ate up` start-up budget (its own steps each have 30 s).
const UP_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Size of the tmpfs mounted on `<state>/snapshots` for `snapshot-disk-full`.
const SNAPSHOT_TMPFS_SIZE: &str = "512m";

/// The system under test and everything the bench set up for it.
pub(super) struct Lab {
    exe: PathBuf,
    pub(super) state: PathBuf,
    /// The temp dir the bench created (removed after a passing run).
    owned: bool,
    /// The bench's own files: ready file, `ate up`'s log, its HOME.
    work: PathBuf,
    images: PathBuf,
    workers: u32,
    ports: Ports,
    first_ip: Ipv4Addr,
    up: Option<Child>,
    api: String,
    /// The current api's address, for the sampler (it moves with every new `ate up`).
    pub(super) api_now: std::sync::Arc<std::sync::Mutex<String>>,
    pub(super) pg: Option<Pg>,
    pub(super) tmpfs: Option<PathBuf>,
    pub(super) clock: Clock,
    /// Trials of each kill-inside fault (`--trials`).
    pub(super) trials: usize,
    /// The processes kill-inside faults may kill (`--kill`; empty: all).
    pub(super) kill: Vec<super::KillKind>,
    /// (actor, from, to) in the bench's clock: a rollback to the actor's previous generation
    /// the system reported in that window (see `Row::excuse_reported_rollbacks`).
    pub(super) reported_rollbacks: std::sync::Mutex<Vec<(String, f64, f64)>>,
}

impl Lab {
    pub(super) fn new(a: &FaultsArgs, plan: &[Fault]) -> anyhow::Result<Lab> {
        anyhow::ensure!(!plan.is_empty(), "no fault to inject");
        // The running executable itself, even when cargo has relinked the file under its name
        // since (a path would then name another build, or nothing).
        let exe = PathBuf::from("/proc/self/exe");
        anyhow::ensure!(
            exe.exists(),
            "no /proc/self/exe: the suite needs Linux /proc"
        );
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        let images = cwd.join(&a.images_dir);
        anyhow::ensure!(
            images.join("counter").is_dir(),
            "no counter image in {} (build it with workloads/build-images.sh DIR and pass \
             --images-dir DIR)",
            images.display()
        );
        let (state, owned) = match &a.state_dir {
            Some(d) => (cwd.join(d), false),
            None => (temp_state_dir()?, true),
        };
        let work = state.join("bench-faults");
        std::fs::create_dir_all(work.join("home"))
            .with_context(|| format!("cannot create {}", work.display()))?;
        Ok(Lab {
            exe,
            state,
            owned,
            work,
            images,
            workers: a.workers,
            ports: Ports::pick()?,
            first_ip: private_worker_ip(),
            up: None,
            api: String::new(),
            api_now: Default::default(),
            pg: None,
            tmpfs: None,
            clock: Clock(Instant::now()),
            trials: a.inside_trials(),
            kill: a.kill.clone(),
            reported_rollbacks: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub(super) fn router_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.router)
    }

    fn ready_file(&self) -> PathBuf {
        self.work.join("ready.json")
    }

    pub(super) fn up_log(&self) -> PathBuf {
        self.work.join("up.log")
    }

    pub(super) fn layout(&self, actors: &[String]) -> Layout {
        Layout::new(&self.state, self.workers, actors)
    }

    /// `ate up`'s arguments; the same for every start, so a restart finds its state.
    fn up_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "up".into(),
            "--state-dir".into(),
            self.state.display().to_string(),
            "--images-dir".into(),
            self.images.display().to_string(),
            "--workers".into(),
            self.workers.to_string(),
            "--worker-slots".into(),
            WORKER_SLOTS.to_string(),
            "--api-listen".into(),
            "127.0.0.1:0".into(),
            "--api-http-listen".into(),
            "127.0.0.1:0".into(),
            "--node-listen".into(),
            format!("127.0.0.1:{}", self.ports.node),
            "--router-listen".into(),
            format!("127.0.0.1:{}", self.ports.router),
            "--router-metrics-listen".into(),
            format!("127.0.0.1:{}", self.ports.router_metrics),
            "--worker-first-ip".into(),
            self.first_ip.to_string(),
            "--worker-port".into(),
            self.ports.worker.to_string(),
            "--ready-file".into(),
            self.ready_file().display().to_string(),
        ];
        if let Some(pg) = &self.pg {
            args.extend(["--store".into(), pg.url()]);
        }
        args
    }

    pub(super) async fn start_postgres(&mut self, bin: &Path) -> anyhow::Result<()> {
        eprintln!(
            "==> PostgreSQL cluster in {}",
            self.state.join("pg").display()
        );
        let mut pg = Pg::create(bin, self.state.join("pg")).await?;
        let started = pg.start().await;
        self.pg = Some(pg);
        started
    }

    /// A small tmpfs on the node's snapshot dir, so `snapshot-disk-full` can fill it.
    pub(super) async fn mount_snapshot_tmpfs(&mut self) -> anyhow::Result<()> {
        let dir = self.state.join("snapshots");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        run_tool(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={SNAPSHOT_TMPFS_SIZE}"))
                .arg("tmpfs")
                .arg(&dir),
            "mount tmpfs",
        )
        .await?;
        self.tmpfs = Some(dir);
        Ok(())
    }

    /// The first start: on new ports when a neighbour took one of ours in between.
    pub(super) async fn start_up_first(&mut self) -> anyhow::Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.start_up().await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 4 && format!("{e:#}").contains("in use") => {
                    eprintln!("==> a port was taken; starting ate up on new ports");
                    self.ports = Ports::pick()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts `ate up` and waits for its ready file. Its HOME is ours, so it does not write the
    /// user's `~/.config/ate`; its own process group, so a Ctrl-C reaches only the bench, which
    /// stops it in order.
    pub(super) async fn start_up(&mut self) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(self.ready_file());
        let log_path = self.up_log();
        let log_from = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let stdout = log.try_clone()?;
        let home = self.work.join("home");
        let child = Command::new(&self.exe)
            .args(self.up_args())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("cannot start ate up")?;
        self.up = Some(child);
        let ready = self.wait_ready(log_from).await?;
        self.api = ready["api"].as_str().unwrap_or_default().to_string();
        anyhow::ensure!(!self.api.is_empty(), "ate up's ready file names no api");
        if let Ok(mut a) = self.api_now.lock() {
            a.clone_from(&self.api);
        }
        eprintln!(
            "==> ate up ready: router {} api {}",
            self.router_url(),
            self.api
        );
        Ok(())
    }

    async fn wait_ready(&mut self, log_from: u64) -> anyhow::Result<serde_json::Value> {
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(self.ready_file())
                && let Ok(v) = serde_json::from_str(&text)
            {
                return Ok(v);
            }
            let exited = match self.up.as_mut() {
                Some(c) => c.try_wait()?,
                None => anyhow::bail!("ate up is not running"),
            };
            if let Some(status) = exited {
                self.up = None;
                let log = std::fs::read(self.up_log()).unwrap_or_default();
                let from = usize::try_from(log_from).unwrap_or(0).min(log.len());
                anyhow::bail!(
                    "ate up exited during start-up ({status}):\n{}",
                    String::from_utf8_lossy(&log[from..]).trim()
                );
            }
            if started.elapsed() > UP_READY_TIMEOUT {
                anyhow::bail!(
                    "ate up not ready after {UP_READY_TIMEOUT:?}; see {}",
                    self.up_log().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn up_pid(&self) -> Option<i32> {
        self.up
            .as_ref()
            .and_then(Child::id)
            .and_then(|p| i32::try_from(p).ok())
    }

    pub(super) fn up_running(&mut self) -> bool {
        self.up
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM to `ate up` (which stops router, workers, node and api in that order) and waits
    /// for it; after `UP_STOP_GRACE` it and its children are killed. True when it stopped by
    /// itself.
    pub(super) async fn stop_up(&mut self) -> anyhow::Result<bool> {
        let Some(pid) = self.up_pid() else {
            return Ok(true);
        };
        let Some(mut child) = self.up.take() else {
            return Ok(true);
        };
        if child.try_wait()?.is_some() {
            return Ok(true);
        }
        // A frozen `ate up` (worker-down) or component (api-down) must be able to stop.
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        for (kid, _) in children_of(pid) {
            let _ = kill(Pid::from_raw(kid), Signal::SIGCONT);
        }
        signal(pid, Signal::SIGTERM)?;
        if tokio::time::timeout(UP_STOP_GRACE, child.wait())
            .await
            .is_ok()
        {
            return Ok(true);
        }
        let kids = children_of(pid);
        let _ = child.start_kill();
        for (kid, _) in kids {
            let _ = kill(Pid::from_raw(kid), Signal::SIGKILL);
        }
        let _ = child.wait().await;
        Ok(false)
    }

    /// SIGKILL of `ate up` alone: its components get SIGTERM from the kernel (their parent-death
    /// signal) and exit; waits until none is left, so the next `ate up` finds its ports free.
    pub(super) async fn kill_up(&mut self) -> anyhow::Result<()> {
        let Some(pid) = self.up_pid() else {
            anyhow::bail!("ate up is not running");
        };
        let kids = children_of(pid);
        signal(pid, Signal::SIGKILL)?;
        if let Some(mut child) = self.up.take() {
            let _ = child.wait().await;
        }
        let deadline = Instant::now() + UP_STOP_GRACE;
        for (kid, _) in kids {
            // A zombie holds no port.
            while u32::try_from(kid).is_ok_and(ate_worker::process_running)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// SIGKILL of `ate up` alone, as a crash would: its components get SIGTERM from the kernel
    /// (their parent-death signal) and are left stopping; returns their pids. Nothing waits for
    /// them: the next `ate up` may start while they still run. Each as (pid, `worker-1`, `api`,
    /// …).
    pub(super) async fn kill_up_alone(&mut self) -> anyhow::Result<Vec<(i32, String)>> {
        let Some(pid) = self.up_pid() else {
            anyhow::bail!("ate up is not running");
        };
        let kids: Vec<(i32, String)> = children_of(pid)
            .into_iter()
            .map(|(k, args)| {
                let id = args
                    .windows(2)
                    .find(|w| w[0] == "--id")
                    .map(|w| w[1].clone());
                (k, id.or_else(|| args.get(1).cloned()).unwrap_or_default())
            })
            .collect();
        eprintln!("    kill -9 ate up ({pid})");
        signal(pid, Signal::SIGKILL)?;
        if let Some(mut child) = self.up.take() {
            let _ = child.wait().await;
        }
        Ok(kids)
    }

    /// A fresh mTLS connection to the current api as admin (the api moves on restart-up).
    pub(super) async fn api(&self) -> anyhow::Result<Clients> {
        connect_api(&self.state, &self.api).await
    }

    pub(super) async fn create_actors(&self, actors: &[String]) -> anyhow::Result<()> {
        let c = self.api().await?;
        match c
            .atespaces
            .clone()
            .create_atespace(v1::CreateAtespaceRequest {
                name: ATESPACE.into(),
                ..Default::default()
            })
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::AlreadyExists => {}
            Err(s) => anyhow::bail!("create atespace {ATESPACE}: {}", s.message()),
        }
        for name in actors {
            match c
                .actors
                .clone()
                .create_actor(v1::CreateActorRequest {
                    atespace: ATESPACE.into(),
                    name: name.clone(),
                    template: TEMPLATE.into(),
                    ..Default::default()
                })
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::AlreadyExists => {}
                Err(s) => anyhow::bail!("create actor {ATESPACE}/{name}: {}", s.message()),
            }
        }
        Ok(())
    }

    /// Stops everything the bench started, in order: `ate up`, the sandboxes it left behind,
    /// the tmpfs, PostgreSQL; removes the temp state dir after a passing run. Problems are
    /// reported, not returned: the rest must still be cleaned.
    pub(super) async fn teardown(&mut self, passed: bool) {
        eprintln!("==> stopping the bench's system");
        match self.stop_up().await {
            Ok(true) => {}
            Ok(false) => eprintln!(
                "warning: ate up did not stop within {} s and was killed",
                UP_STOP_GRACE.as_secs()
            ),
            Err(e) => eprintln!("warning: stopping ate up: {e:#}"),
        }
        self.remove_leftover_sandboxes().await;
        if let Some(dir) = self.tmpfs.take()
            && let Err(e) = unmount(&dir).await
        {
            eprintln!("warning: {e:#}");
        }
        if let Some(pg) = self.pg.as_mut()
            && pg.running
            && let Err(e) = pg.stop().await
        {
            eprintln!("warning: stopping PostgreSQL: {e:#}");
        }
        if !self.owned {
            return;
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", self.state.display());
        let mounted = mounts.lines().any(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| unescape_mountinfo(m).starts_with(&prefix))
        });
        if passed && !mounted {
            if let Err(e) = std::fs::remove_dir_all(&self.state) {
                eprintln!("warning: cannot remove {}: {e}", self.state.display());
            }
        } else {
            eprintln!(
                "==> kept {} (logs in {}/logs)",
                self.state.display(),
                self.state.display()
            );
        }
    }

    /// Sandboxes outlive their workers on purpose; `ate worker --remove-leftovers` removes
    /// what a worker left, one run per worker dir (as the test harness does).
    async fn remove_leftover_sandboxes(&self) {
        for id in crate::workers_with_leftovers(&self.state) {
            let done = run_tool(
                Command::new(&self.exe).args(crate::remove_leftovers_args(&self.state, &id)),
                "ate worker --remove-leftovers",
            )
            .await;
            if let Err(e) = done {
                eprintln!("warning: leftovers of {id}: {e:#}");
            }
        }
    }
}

/// A fresh mTLS connection as admin (the certificate `ate up` wrote in `state`) to `api`.
pub(super) async fn connect_api(state: &Path, api: &str) -> anyhow::Result<Clients> {
    let files = ate_tls::PemFiles::in_dir(&state.join(client::TLS_DIR), client::ADMIN_CERT_NAME);
    let source = ate_tls::CertSource::from_files(files, ate_tls::DEFAULT_FILE_POLL)
        .context("cannot read the admin certificate of the bench's ate up")?;
    let channel = tokio::time::timeout(
        Duration::from_secs(10),
        client::connect_to(api, Some(&source)),
    )
    .await
    .context("timed out connecting to the api")??;
    Ok(Clients::new(channel))
}

/// The ports `ate up` is started on.
#[derive(Clone, Copy)]
struct Ports {
    router: u16,
    router_metrics: u16,
    node: u16,
    worker: u16,
}

impl Ports {
    fn pick() -> anyhow::Result<Ports> {
        Ok(Ports {
            router: free_port()?,
            router_metrics: free_port()?,
            node: free_port()?,
            worker: free_port()?,
        })
    }
}

/// A free TCP port on 127.0.0.1 (bound then released; `ate up` is retried on new ports when a
/// neighbour took one in between).
pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("cannot find a free port")?
        .port())
}

/// The first worker address of a loopback /24 of our own: second octet 201–250 (the test
/// harness uses 1–200), third from our pid.
fn private_worker_ip() -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(127, 201 + (pid % 50) as u8, 1 + ((pid / 50) % 250) as u8, 2)
}

/// Runs a command to completion; its output goes into the error when it fails. stdout is not
/// captured: a server it starts (pg_ctl) must not hold our pipe open.
pub(super) async fn run_tool(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("cannot run {what}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Unmounts the snapshot tmpfs (lazily if it is still busy after a few tries).
async fn unmount(dir: &Path) -> anyhow::Result<()> {
    for _ in 0..5 {
        if run_tool(Command::new("umount").arg(dir), "umount")
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run_tool(Command::new("umount").arg("-l").arg(dir), "umount -l")
        .await
        .with_context(|| format!("cannot unmount {}", dir.display()))
}

pub(super) fn signal(pid: i32, sig: Signal) -> anyhow::Result<()> {
    kill(Pid::from_raw(pid), sig).with_context(|| format!("cannot send {sig} to {pid}"))
}

/// `(pid, command line)` of the processes whose parent is `parent` (from /proc). Zombies have
/// an empty command line and never match a component.
pub(super) fn children_of(parent: i32) -> Vec<(i32, Vec<String>)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parent_pid(&s))
                == Some(parent)
        })
        .map(|pid| (pid, cmdline(pid)))
        .collect()
}

/// The command line of process `pid` (from /proc), one argument an entry; empty for a zombie or
/// a process that is gone.
pub(super) fn cmdline(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The parent pid in a `/proc/PID/stat` text (the fourth field; the command name in parentheses
/// may contain spaces, so count from the last `)`).
fn parent_pid(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A fresh state dir under the temp dir, traversable by the `postgres` user.
fn temp_state_dir() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!("ate-faults-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_pids_are_parsed() {
        assert_eq!(parent_pid("123 (ate (x) y) S 77 123 123 0"), Some(77));
    }
}
