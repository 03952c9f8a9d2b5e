//! `ate up`: the embedded all-in-one. Starts each component as a child process, waits for it to
//! be healthy, registers the demo template, prints one ready line, and stops everything on
//! Ctrl-C / SIGTERM. A component that exits after start-up is reported on stderr and restarted
//! with the same arguments after a backoff (100 ms doubling to 10 s, reset after 60 s up); one
//! that exits more than 10 times in 5 minutes makes `ate up` stop everything and exit non-zero.
//! Stopping goes router, workers, node agent, api, each group waiting for its processes, so the
//! workers can still suspend their actors through the node agent and the api.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_core::Document;
use ate_core::template::TemplateSpec;
use ate_proto::v1;
use ate_tls::process::shutdown_signal;
use clap::Args;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::client::{self, API_ADDRESS_FILE, Clients};
use crate::serve::{LogFormat, write_atomically};

const DEMO_TEMPLATE: &str = include_str!("demo-counter.yaml");
/// The running executable, as the kernel keeps it (Linux).
const SELF_EXE: &str = "/proc/self/exe";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
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

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where the store, snapshots, images and logs live.
    #[arg(long, env = "ATE_STATE_DIR", default_value = client::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Number of workers to start.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Actor slots per worker.
    #[arg(long, default_value_t = 8)]
    pub worker_slots: u32,
    /// Do not register the `ate-demo` atespace and `ate-demo/counter` template.
    #[arg(long)]
    pub no_demo: bool,
    /// api gRPC address.
    #[arg(long, default_value = ate_core::DEFAULT_API_ADDR)]
    pub api_listen: SocketAddr,
    /// api health/metrics address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub api_http_listen: SocketAddr,
    /// Store URL (default: SQLite file in the state dir).
    #[arg(long)]
    pub store: Option<String>,
    /// Directory of OCI image layouts for the demo (default: STATE_DIR/images).
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
    /// Router (ingress) address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub router_listen: SocketAddr,
    /// Router metrics address.
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub router_metrics_listen: SocketAddr,
    /// Node agent address.
    #[arg(long, default_value = "127.0.0.1:8085")]
    pub node_listen: SocketAddr,
    /// Durable snapshot store URL (default: a directory in the state dir).
    #[arg(long)]
    pub durable_store: Option<String>,
    /// First worker's loopback address; worker i gets this address + (i - 1).
    #[arg(long, default_value = "127.0.0.2")]
    pub worker_first_ip: std::net::Ipv4Addr,
    /// atunnel port of every worker.
    #[arg(long, default_value_t = 8443)]
    pub worker_port: u16,
    /// Write the addresses of the running system as JSON here once ready.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Extra flags for the router, e.g. `--router-arg=--parked-request-budget=2s` (repeatable).
    #[arg(long = "router-arg", allow_hyphen_values = true)]
    pub router_args: Vec<String>,
    /// Extra flags for the api, e.g. `--api-arg=--heartbeat-timeout-seconds=20` (repeatable; the flags
    /// `ate up` sets itself — listeners, store, TLS, ready file — cannot be given again).
    #[arg(long = "api-arg", allow_hyphen_values = true)]
    pub api_args: Vec<String>,
    /// The router uses mTLS CONNECT tunnels through atunnel for every request, instead of
    /// taking plain HTTP/1.1 tunnels as the actor's own socket from the workers of this
    /// machine (docs/tunnel-protocol.md, "Handoff").
    #[arg(long)]
    pub no_local_tunnels: bool,
    /// SPIFFE trust domain of the local CA and every component's identity.
    #[arg(long, default_value = ate_tls::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Lifetime of every component certificate; each is re-issued at 2/3 of it (e.g. `60s`).
    /// Also the lifetime of the certificates the api signs for joining nodes.
    #[arg(long, default_value = "24h", value_parser = ate_router::config::parse_duration)]
    pub cert_lifetime: Duration,
    /// What this machine runs: `all` (api, router, node agent, workers), `control` (api and
    /// router; machines join it) or `node` (node agent and workers, joined to a control host
    /// with `--join` and `--join-token`).
    #[arg(long, value_enum, default_value_t = UpRole::All)]
    pub role: UpRole,
    /// `--role node`: the api address(es) to join, comma-separated (`10.0.0.1:7443,10.0.0.2:7443`).
    #[arg(long, env = "ATE_JOIN")]
    pub join: Option<String>,
    /// `--role node`: the join token from `ate token create` on a control host. Needed for the
    /// first start only: a restarted node renews with the certificates it holds.
    #[arg(long, env = "ATE_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// This machine's node name (`--role node`: default the host name; else `node-1`). Its
    /// workers are `<node>-worker-<i>`.
    #[arg(long)]
    pub node_name: Option<String>,
    /// The CA that signs every certificate (default STATE_DIR/ca). Control hosts that serve one
    /// fleet share it (as api replicas share a Kubernetes Secret).
    #[arg(long)]
    pub ca_dir: Option<PathBuf>,
    /// Extra DNS name or IP in the api's and the router's certificates, for clients that check
    /// the host name (repeatable).
    #[arg(long = "tls-san")]
    pub tls_sans: Vec<String>,
    /// Another api replica on the same store (repeatable): the router fails over to it, and the
    /// api no longer assumes it is the only replica.
    #[arg(long = "peer-api")]
    pub peer_apis: Vec<String>,
    /// A registry the workers may reach over plain HTTP (`HOST:PORT`, repeatable; e.g. a
    /// loopback registry for your own images). Adds to `ATE_INSECURE_REGISTRIES`.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Registry credentials for the workers (a Docker `config.json`; `ATE_REGISTRY_AUTH_FILE`).
    #[arg(long)]
    pub registry_auth_file: Option<PathBuf>,
    /// Log line format of every component (their logs in STATE_DIR/logs): `text` (plain, no
    /// colours in a file) or `json` (JSON lines).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What one `ate up` runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpRole {
    All,
    Control,
    Node,
}

/// The local CA and one rotating certificate per component, written to `<state>/tls/<name>.crt`
/// and `.key` (+ `ca.crt`) for the children, which reload them when they change.
struct Pki {
    /// None on a joined node: its certificates come from the api (see `crate::join`).
    ca: Option<Arc<ate_tls::LocalCa>>,
    dir: PathBuf,
    td: String,
    lifetime: Duration,
    /// Kept alive: dropping a source stops its rotation.
    sources: Vec<ate_tls::CertSource>,
}

impl Pki {
    fn open(args: &UpArgs) -> anyhow::Result<Self> {
        let ca_dir = ca_dir(args);
        let ca =
            ate_tls::LocalCa::open_or_create(&ca_dir, &args.trust_domain).with_context(|| {
                format!("cannot open or create the local CA in {}", ca_dir.display())
            })?;
        let dir = args.state_dir.join(client::TLS_DIR);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Pki {
            ca: Some(Arc::new(ca)),
            dir,
            td: args.trust_domain.clone(),
            lifetime: args.cert_lifetime,
            sources: Vec::new(),
        })
    }

    /// A joined node's certificates, already in `dir` and renewed by `crate::join`.
    fn joined(dir: PathBuf, issued: &crate::join::Issued) -> Self {
        Pki {
            ca: None,
            dir,
            td: issued.trust_domain.clone(),
            lifetime: issued.lifetime,
            sources: Vec::new(),
        }
    }

    /// Issues (and keeps rotating) `id`'s certificate as `<name>.{crt,key}`.
    fn issue(
        &mut self,
        name: &str,
        id: ate_tls::SpiffeId,
    ) -> anyhow::Result<(ate_tls::CertSource, ate_tls::TlsArgs)> {
        self.issue_req(name, ate_tls::SvidRequest::new(id))
    }

    fn issue_req(
        &mut self,
        name: &str,
        req: ate_tls::SvidRequest,
    ) -> anyhow::Result<(ate_tls::CertSource, ate_tls::TlsArgs)> {
        let files = ate_tls::PemFiles::in_dir(&self.dir, name);
        let source = match &self.ca {
            Some(ca) => {
                let req = req.lifetime(self.lifetime);
                ate_tls::CertSource::issued_to_files(ca.clone(), req, files.clone())
                    .with_context(|| format!("cannot issue the {name} certificate"))?
            }
            // Joined: the files are there (checked by loading them), renewed elsewhere.
            None => ate_tls::CertSource::from_files(files.clone(), ate_tls::DEFAULT_FILE_POLL)
                .with_context(|| format!("cannot load the {name} certificate"))?,
        };
        self.sources.push(source.clone());
        let mut flags = ate_tls::TlsArgs::from_files(&files, &self.td);
        // Children must notice a rotated certificate well before the old one expires.
        flags.tls_reload_interval = Some(
            (self.lifetime / 12).clamp(Duration::from_millis(100), ate_tls::DEFAULT_FILE_POLL),
        );
        Ok((source, flags))
    }
}

/// Copies the admin certificate into the CLI context `dir` (key 0600) now and after each
/// rotation, so `ate` finds it without flags.
fn publish_admin(admin: &ate_tls::CertSource, pki_dir: &Path, dir: PathBuf) {
    let from = ate_tls::PemFiles::in_dir(pki_dir, client::ADMIN_CERT_NAME);
    let to = ate_tls::PemFiles::in_dir(&dir, client::ADMIN_CERT_NAME);
    let copy = move || -> anyhow::Result<()> {
        std::fs::create_dir_all(&dir)?;
        for (src, dst, mode) in [
            (&from.cert, &to.cert, 0o644),
            (&from.key, &to.key, 0o600),
            (&from.ca, &to.ca, 0o644),
        ] {
            let bytes = std::fs::read(src)?;
            let tmp = dst.with_extension("tmp");
            {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let _ = std::fs::remove_file(&tmp);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&tmp)?;
                f.write_all(&bytes)?;
            }
            std::fs::rename(&tmp, dst)?;
        }
        Ok(())
    };
    if let Err(e) = copy() {
        eprintln!("ate up: cannot copy the admin certificate to the user config dir: {e:#}");
    }
    let mut changes = admin.subscribe();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            if let Err(e) = copy() {
                eprintln!("ate up: cannot copy the rotated admin certificate: {e:#}");
            }
        }
    });
}

/// The CA directory: `--ca-dir`, else STATE_DIR/ca.
fn ca_dir(args: &UpArgs) -> PathBuf {
    args.ca_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("ca"))
}

/// The address of worker `i` (1-based): every worker serves atunnel on its own address, as a
/// pod would (loopback addresses on one machine; the host's addresses on a joined node).
fn worker_address(first: std::net::Ipv4Addr, i: u32) -> anyhow::Result<std::net::IpAddr> {
    let ip = u32::from(first)
        .checked_add(i - 1)
        .map(std::net::Ipv4Addr::from);
    match ip {
        Some(ip) if ip.is_loopback() == first.is_loopback() && !ip.is_unspecified() => {
            Ok(std::net::IpAddr::V4(ip))
        }
        _ => anyhow::bail!("worker {i} would not get an address starting from {first}"),
    }
}

/// `req` with the `--tls-san` names and addresses.
fn with_sans(mut req: ate_tls::SvidRequest, sans: &[String]) -> ate_tls::SvidRequest {
    for san in sans {
        req = match san.parse::<std::net::IpAddr>() {
            Ok(ip) => req.ip(ip),
            Err(_) => req.dns(san.clone()),
        };
    }
    req
}

async fn wait_listening(c: &mut Component, addr: SocketAddr) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = c.try_wait()? {
            anyhow::bail!(
                "{} exited during start-up ({status}); last log lines:\n{}",
                c.name,
                tail(&c.log, 20)
            );
        }
        // The component's own socket, not merely something answering there: a neighbour that
        // took the port (an ephemeral bind by another process) must not make a router that
        // cannot bind look ready.
        if c.child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .is_some_and(|pid| listens_on(pid, addr.port()))
        {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!(
                "{} not listening on {addr} after {READY_TIMEOUT:?}; see {}",
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

/// Waits until the api lists `n` ACTIVE workers of `node`.
async fn wait_workers(
    clients: &Clients,
    node: &str,
    n: usize,
    components: &mut [Component],
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        for c in components.iter_mut() {
            if let Some(status) = c.try_wait()? {
                anyhow::bail!(
                    "{} exited during start-up ({status}); last log lines:\n{}",
                    c.name,
                    tail(&c.log, 20)
                );
            }
        }
        let workers = clients
            .fleet
            .clone()
            .list_workers(v1::ListWorkersRequest {})
            .await
            .map(|r| r.into_inner().workers)
            .unwrap_or_default();
        let workers: Vec<_> = workers.into_iter().filter(|w| w.node == node).collect();
        if workers.iter().filter(|w| w.status == "ACTIVE").count() >= n {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!(
                "only {} of {n} workers registered after {READY_TIMEOUT:?}; see the logs in {}",
                workers.len(),
                components[0]
                    .log
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a component is; decides its place in the stop order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
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
struct Component {
    name: String,
    role: Role,
    /// The arguments after the executable, kept to restart the component identically.
    args: Vec<String>,
    /// Environment added to `ate up`'s own (kept for restarts too).
    env: Vec<(String, String)>,
    log: PathBuf,
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
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => child.try_wait(),
            None => Ok(None),
        }
    }
}

/// The workers' registry settings from `--insecure-registry` and `--registry-auth-file`, on top
/// of the environment `ate up` was started with.
fn registry_env(args: &UpArgs) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    if !args.insecure_registries.is_empty() {
        for r in &args.insecure_registries {
            if r.is_empty() || r.contains(['/', ',', ' ']) {
                anyhow::bail!("--insecure-registry {r:?}: expected HOST:PORT (no scheme, no path)");
            }
        }
        let mut list: Vec<String> = std::env::var("ATE_INSECURE_REGISTRIES")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        list.extend(args.insecure_registries.iter().cloned());
        env.push(("ATE_INSECURE_REGISTRIES".to_string(), list.join(",")));
    }
    if let Some(file) = &args.registry_auth_file {
        let file = std::fs::canonicalize(file)
            .with_context(|| format!("--registry-auth-file {}", file.display()))?;
        env.push((
            "ATE_REGISTRY_AUTH_FILE".to_string(),
            file.display().to_string(),
        ));
    }
    Ok(env)
}

fn spawn(name: &str, role: Role, args: Vec<String>, logs: &Path) -> anyhow::Result<Component> {
    spawn_with_env(name, role, args, logs, Vec::new())
}

fn spawn_with_env(
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
    let mut command = Command::new(exe);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file)
        // Its own process group: a Ctrl-C in the terminal then reaches only `ate up`, which stops
        // the components in order, instead of all of them at once.
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked child before exec and only makes two system calls
    // (prctl, getppid), which are async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
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

/// Sets the value following `flag` in `args`, if the flag is there.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    if let Some(i) = args.iter().position(|a| a == flag)
        && let Some(v) = args.get_mut(i + 1)
    {
        *v = value.to_string();
    }
}

/// Last lines of a log, for the report when a component dies.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn wait_ready(c: &mut Component, ready_file: &Path) -> anyhow::Result<serde_json::Value> {
    let started = Instant::now();
    loop {
        if let Some(status) = c.try_wait()? {
            anyhow::bail!(
                "{} exited during start-up ({status}); last log lines:\n{}",
                c.name,
                tail(&c.log, 20)
            );
        }
        if let Ok(text) = std::fs::read_to_string(ready_file)
            && let Ok(v) = serde_json::from_str(&text)
        {
            return Ok(v);
        }
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!(
                "{} not ready after {READY_TIMEOUT:?}; see {}",
                c.name,
                c.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn register_demo(c: &Clients, images_dir: &Path) -> anyhow::Result<()> {
    let text = DEMO_TEMPLATE.replace("IMAGES_DIR", &images_dir.display().to_string());
    for doc in crate::verbs::parse_documents(&text)? {
        match doc {
            Document::Atespace(a) => match c
                .atespaces
                .clone()
                .create_atespace(v1::CreateAtespaceRequest {
                    name: a.metadata.name.clone(),
                })
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::AlreadyExists => {}
                Err(s) => anyhow::bail!(
                    "cannot create atespace {}: {}",
                    a.metadata.name,
                    s.message()
                ),
            },
            Document::ActorTemplate(t) => {
                let spec = TemplateSpec::from_document(&t.spec)?;
                let template = v1::ActorTemplate {
                    namespace: t.metadata.namespace.clone(),
                    name: t.metadata.name.clone(),
                    spec: Some(ate_proto::spec_to_wire(&spec)),
                    ..Default::default()
                };
                c.templates
                    .clone()
                    .apply_template(v1::ApplyTemplateRequest {
                        template: Some(template),
                    })
                    .await
                    .map_err(|s| {
                        anyhow::anyhow!("cannot apply the demo template: {}", s.message())
                    })?;
            }
        }
    }
    Ok(())
}

/// The `/metrics` addresses of this machine's node agent and workers: free loopback ports,
/// chosen once so that a restarted component comes back on the same one.
#[derive(Debug, Clone, Default)]
struct NodeMetrics {
    node: String,
    workers: Vec<String>,
}

impl NodeMetrics {
    fn pick(workers: u32) -> anyhow::Result<Self> {
        let free = || -> anyhow::Result<String> {
            let l = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .context("cannot find a free loopback port for metrics")?;
            Ok(l.local_addr()?.to_string())
        };
        Ok(NodeMetrics {
            node: free()?,
            workers: (0..workers)
                .map(|_| free())
                .collect::<anyhow::Result<_>>()?,
        })
    }
}

/// Starts the node agent and the workers, and waits until the api lists every worker; returns
/// their metrics addresses.
#[allow(clippy::too_many_arguments)]
async fn start_node_and_workers(
    args: &UpArgs,
    node_name: &str,
    api_addrs: &str,
    logs: &Path,
    run_dir: &Path,
    pki: &mut Pki,
    clients: &Clients,
    components: &mut Vec<Component>,
) -> anyhow::Result<NodeMetrics> {
    let metrics = NodeMetrics::pick(args.workers)?;
    let td = pki.td.clone();
    let state = args.state_dir.display().to_string();
    if args.workers > 0 && !nix::unistd::Uid::effective().is_root() {
        anyhow::bail!(
            "workers run runc sandboxes and need root: run `ate up` as root (or with --workers 0)"
        );
    }
    let node_ready = run_dir.join("node.json");
    let _ = std::fs::remove_file(&node_ready);
    let mut node_args = vec![
        "node".to_string(),
        "--name".into(),
        node_name.into(),
        "--listen".into(),
        args.node_listen.to_string(),
        "--api".into(),
        api_addrs.to_string(),
        "--state-dir".into(),
        state.clone(),
        "--ready-file".into(),
        node_ready.display().to_string(),
        "--log-format".into(),
        args.log_format.as_str().into(),
        "--metrics-listen".into(),
        metrics.node.clone(),
    ];
    if let Some(url) = &args.durable_store {
        node_args.extend(["--durable-store".to_string(), url.clone()]);
    }
    node_args.extend(
        // A per-node identity: the api lets a node suspend only the actors on its own workers.
        pki.issue(
            crate::join::NODE_CERT_NAME,
            ate_tls::SpiffeId::node_instance(&td, node_name)?,
        )?
        .1
        .to_args(),
    );
    components.push(spawn("node", Role::Node, node_args, logs)?);
    let node_index = components.len() - 1;
    wait_ready(&mut components[node_index], &node_ready).await?;

    let deny = control_plane_addresses(args, api_addrs);
    for (i, id) in (1..=args.workers).zip(worker_ids(args, node_name)) {
        let listen = SocketAddr::new(worker_address(args.worker_first_ip, i)?, args.worker_port);
        let mut worker_args = vec![
            "worker".to_string(),
            "--id".into(),
            id.clone(),
            "--state-dir".into(),
            state.clone(),
            "--listen".into(),
            listen.to_string(),
            "--slots".into(),
            args.worker_slots.to_string(),
            // Lets an actor be pinned to one worker with a selector (`ate update actor --selector`).
            "--labels".into(),
            format!("ate.dev/worker={id},ate.dev/node={node_name}"),
            "--log-format".into(),
            args.log_format.as_str().into(),
            "--metrics-listen".into(),
            metrics.workers[(i - 1) as usize].clone(),
        ];
        if !deny.is_empty() {
            // No egress policy may let an actor reach the api, the store or the object store.
            worker_args.extend(["--deny-egress".to_string(), deny.join(",")]);
        }
        worker_args.extend(
            pki.issue(&id, ate_tls::SpiffeId::worker_instance(&td, &id)?)?
                .1
                .to_args(),
        );
        components.push(spawn_with_env(
            &id,
            Role::Worker,
            worker_args,
            logs,
            registry_env(args)?,
        )?);
    }
    wait_workers(clients, node_name, args.workers as usize, components).await?;
    Ok(metrics)
}

/// The addresses of the control plane this machine knows: the api replicas, the SQL store and
/// the object store endpoint (`AWS_ENDPOINT_URL`), resolved now. Loopback ones are left out
/// (always denied anyway); a name that does not resolve is skipped with a warning.
fn control_plane_addresses(args: &UpArgs, api_addrs: &str) -> Vec<String> {
    let mut hosts: Vec<String> = api_addrs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    let mut add_url = |url: &str| {
        // scheme://[user[:pass]@]host[:port][/…]
        let Some((_, rest)) = url.split_once("://") else {
            return;
        };
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if !host_port.is_empty() {
            hosts.push(host_port.to_string());
        }
    };
    if let Some(store) = &args.store {
        add_url(store);
    }
    if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
        add_url(&endpoint);
    }
    let mut out = std::collections::BTreeSet::new();
    for h in hosts {
        let with_port = if h.starts_with('[') || h.matches(':').count() == 1 {
            h.clone()
        } else {
            format!("{h}:0")
        };
        match std::net::ToSocketAddrs::to_socket_addrs(&with_port) {
            Ok(addrs) => out.extend(
                addrs
                    .map(|a| a.ip())
                    .filter(|ip| !ip.is_loopback())
                    .map(|ip| ip.to_string()),
            ),
            Err(e) => eprintln!("ate up: cannot resolve control-plane address {h}: {e}"),
        }
    }
    out.into_iter().collect()
}

/// Worker ids of this machine: `worker-<i>` on an all-in-one (as before nodes could join), else
/// `<node>-worker-<i>` (the api signs a node's worker certificates only under its name).
fn worker_ids(args: &UpArgs, node_name: &str) -> Vec<String> {
    (1..=args.workers)
        .map(|i| match args.role {
            UpRole::All => format!("worker-{i}"),
            _ => format!("{node_name}-worker-{i}"),
        })
        .collect()
}

/// Starts the router and waits until it listens.
fn router_args(args: &UpArgs, api_addrs: &str, pki: &mut Pki) -> anyhow::Result<Vec<String>> {
    let td = pki.td.clone();
    let mut router_args = vec![
        "router".to_string(),
        "--listen".into(),
        args.router_listen.to_string(),
        "--metrics-listen".into(),
        args.router_metrics_listen.to_string(),
        "--api".into(),
        api_addrs.to_string(),
        "--log-format".into(),
        args.log_format.as_str().into(),
    ];
    // Also valid for `localhost` / 127.0.0.1, for clients of `--router-arg=--tls-listen=…` that
    // check the hostname rather than the SPIFFE ID.
    let router_req = ate_tls::SvidRequest::new(ate_tls::SpiffeId::router(&td)?)
        .dns("localhost")
        .ip(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let router_req = with_sans(router_req, &args.tls_sans);
    router_args.extend(pki.issue_req("router", router_req)?.1.to_args());
    // The workers' handoff sockets (every worker of `ate up` is on this machine): plain
    // HTTP/1.1 tunnels skip atunnel's byte pipe.
    let chosen = args.no_local_tunnels
        || args
            .router_args
            .iter()
            .any(|a| a == "--local-tunnels" || a.starts_with("--local-tunnels="));
    if !chosen {
        router_args.push("--local-tunnels".into());
        router_args.push(
            args.state_dir
                .join("run")
                .join("atunnel")
                .display()
                .to_string(),
        );
    }
    router_args.extend(args.router_args.iter().cloned());
    Ok(router_args)
}

async fn start_router(
    args: &UpArgs,
    api_addrs: &str,
    logs: &Path,
    pki: &mut Pki,
    components: &mut Vec<Component>,
) -> anyhow::Result<()> {
    let router_args = router_args(args, api_addrs, pki)?;
    components.push(spawn("router", Role::Router, router_args, logs)?);
    let router_index = components.len() - 1;
    wait_listening(&mut components[router_index], args.router_listen).await
}

/// The api addresses a router or node agent of this host uses: ours first, then the peers.
fn api_list(own: &str, peers: &[String]) -> String {
    std::iter::once(own.to_string())
        .chain(peers.iter().cloned())
        .collect::<Vec<_>>()
        .join(",")
}

/// Stops the components group by group in `STOP_ORDER`.
async fn stop_all(components: &mut [Component]) {
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

/// Starts the api, registers the demo, then the data path; returns the api's gRPC address, its
/// bound health/metrics (http) address, and the node agent's and workers' metrics addresses.
async fn start_all(
    args: &UpArgs,
    store: &str,
    images_dir: &Path,
    pki: &mut Pki,
    components: &mut Vec<Component>,
) -> anyhow::Result<(String, String, Option<NodeMetrics>)> {
    let state = &args.state_dir;
    let logs = state.join("logs");
    let run_dir = state.join("run");
    let api_ready = run_dir.join("api.json");
    let _ = std::fs::remove_file(&api_ready);
    let mut api_args = vec![
        "api".to_string(),
        "--listen".into(),
        args.api_listen.to_string(),
        "--http-listen".into(),
        args.api_http_listen.to_string(),
        "--store".into(),
        store.to_string(),
        "--ready-file".into(),
        api_ready.display().to_string(),
        // Signs the certificates of machines that join (`ate up --role node`).
        "--ca-dir".into(),
        ca_dir(args).display().to_string(),
        "--join-cert-lifetime".into(),
        format!("{}s", args.cert_lifetime.as_secs().max(60)),
        "--log-format".into(),
        args.log_format.as_str().into(),
    ];
    // One api on its store (no --peer-api): a store outage need not fence the workers.
    if args.role == UpRole::All && args.peer_apis.is_empty() {
        api_args.push("--sole-replica".into());
    }
    let td = args.trust_domain.clone();
    let api_req = with_sans(
        ate_tls::SvidRequest::new(ate_tls::SpiffeId::api(&td)?),
        &args.tls_sans,
    );
    api_args.extend(pki.issue_req("api", api_req)?.1.to_args());
    api_args.extend(args.api_args.iter().cloned());
    let (admin, _) = pki.issue(client::ADMIN_CERT_NAME, ate_tls::SpiffeId::admin(&td)?)?;
    components.push(spawn("api", Role::Api, api_args, &logs)?);
    let api = &mut components[0];
    let ready = wait_ready(api, &api_ready).await?;
    let api_addr = ready["grpc"].as_str().unwrap_or_default().to_string();
    let api_http = ready["http"].as_str().unwrap_or_default().to_string();
    // A restarted api must come back where the others were told it is (`--api-listen` may be
    // port 0).
    set_flag(&mut api.args, "--listen", &api_addr);
    set_flag(&mut api.args, "--http-listen", &api_http);
    let channel = client::connect_to(&api_addr, Some(&admin))
        .await
        .with_context(|| format!("cannot reach the api at {api_addr}"))?;
    let clients = Clients::new(channel);
    if !args.no_demo {
        register_demo(&clients, images_dir).await?;
    }
    write_atomically(&state.join(API_ADDRESS_FILE), &api_addr)?;
    let api_addrs = api_list(&api_addr, &args.peer_apis);
    let mut node_metrics = None;
    if args.role == UpRole::All {
        let node_name = args.node_name.clone().unwrap_or_else(|| "node-1".into());
        node_metrics = Some(
            start_node_and_workers(
                args, &node_name, &api_addrs, &logs, &run_dir, pki, &clients, components,
            )
            .await?,
        );
    }
    start_router(args, &api_addrs, &logs, pki, components).await?;
    // A CLI context of this state dir (current unless the user already uses another one), only
    // once everything started: an `ate up` that fails (a port in use) leaves no context behind,
    // let alone a current one pointing at nothing.
    let context = crate::contexts::name_for_state_dir(state);
    match crate::contexts::publish(&context, &api_addr) {
        Ok(_) => {
            if let Some(dir) = crate::contexts::context_dir(&context) {
                publish_admin(&admin, &pki.dir, dir);
            }
        }
        Err(e) => eprintln!("ate up: cannot write the CLI context {context:?}: {e:#}"),
    }
    Ok((api_addr, api_http, node_metrics))
}

/// Restarts components that exit until SIGINT/SIGTERM (SUCCESS) or a crash loop (FAILURE).
async fn supervise_until_stopped(
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

/// `--role node`: joins the fleet (or renews the certificates it holds), then runs the node
/// agent and the workers, renewing their certificates in the background.
async fn run_node(args: UpArgs) -> anyhow::Result<ExitCode> {
    let Some(join) = args.join.clone() else {
        anyhow::bail!("--role node needs --join <api address[,address…]> of a control host");
    };
    let token = args
        .join_token
        .as_deref()
        .map(str::parse::<ate_tls::JoinToken>)
        .transpose()?;
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_ascii_lowercase())
            .context("cannot read the host name: give --node-name")?,
    };
    ate_core::validate_label("--node-name", &node_name)?;
    let state = &args.state_dir;
    let logs = state.join("logs");
    let run_dir = state.join("run");
    let tls_dir = state.join(client::TLS_DIR);
    let ids = Arc::new(crate::join::NodeIdentities {
        api: join.clone(),
        node: node_name.clone(),
        workers: worker_ids(&args, &node_name),
        dir: tls_dir.clone(),
    });
    let issued = ids.obtain(token.as_ref()).await?;
    let _renewal = ids.clone().spawn_renewal(issued.clone());
    let mut pki = Pki::joined(tls_dir, &issued);
    // The node's own identity reads the fleet (to wait for its workers).
    let (node_source, _) = pki.issue(
        crate::join::NODE_CERT_NAME,
        ate_tls::SpiffeId::node_instance(&issued.trust_domain, &node_name)?,
    )?;
    let clients = Clients::new(client::connect_to(&join, Some(&node_source)).await?);

    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut components = Vec::new();
    let started = tokio::select! {
        r = start_node_and_workers(&args, &node_name, &join, &logs, &run_dir, &mut pki, &clients, &mut components) => r,
        _ = &mut signal => Err(anyhow::anyhow!("interrupted during start-up")),
    };
    let metrics = match started {
        Ok(m) => m,
        Err(e) => {
            stop_all(&mut components).await;
            return Err(e);
        }
    };
    if let Some(file) = &args.ready_file {
        let body = serde_json::json!({
            "node": node_name,
            "api": join,
            "node_listen": args.node_listen.to_string(),
            "workers": worker_ids(&args, &node_name),
            "node_metrics": metrics.node,
            "worker_metrics": metrics.workers,
            "state_dir": state.display().to_string(),
            "tls_dir": pki.dir.display().to_string(),
        });
        write_atomically(file, &body.to_string())?;
    }
    println!(
        "ate up: ready node={node_name} api={join} state={} (workers={} slots={})",
        state.display(),
        args.workers,
        args.worker_slots
    );
    let code = supervise_until_stopped(&mut components, &mut signal).await;
    stop_all(&mut components).await;
    Ok(code)
}

pub async fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    let state = &args.state_dir;
    let logs = state.join("logs");
    let run_dir = state.join("run");
    for d in [state, &logs, &run_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    if args.role == UpRole::Node {
        return run_node(args).await;
    }
    if args.join.is_some() || args.join_token.is_some() {
        anyhow::bail!("--join and --join-token are for --role node");
    }
    let store = args
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", state.join("ate.db").display()));
    let images_dir = args
        .images_dir
        .clone()
        .unwrap_or_else(|| state.join("images"));

    let mut pki = Pki::open(&args)?;
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut components = Vec::new();
    // Ctrl-C / SIGTERM during start-up stops whatever already started.
    let started = tokio::select! {
        r = start_all(&args, &store, &images_dir, &mut pki, &mut components) => r,
        _ = &mut signal => Err(anyhow::anyhow!("interrupted during start-up")),
    };
    let (api_addr, api_http, node_metrics) = match started {
        Ok(a) => a,
        Err(e) => {
            stop_all(&mut components).await;
            return Err(e);
        }
    };
    if let Some(file) = &args.ready_file {
        let body = serde_json::json!({
            "router": format!("http://{}", args.router_listen),
            "api": api_addr,
            // The api's bound health/metrics address (`--api-http-listen` may be port 0).
            "api_http": api_http,
            "router_metrics": args.router_metrics_listen.to_string(),
            // The node agent's and each worker's `/metrics` (absent with `--role control`).
            "node_metrics": node_metrics.as_ref().map(|m| m.node.clone()),
            "worker_metrics": node_metrics.map(|m| m.workers).unwrap_or_default(),
            "state_dir": state.display().to_string(),
            "tls_dir": pki.dir.display().to_string(),
        });
        write_atomically(file, &body.to_string())?;
    }
    println!(
        "ate up: ready router=http://{} api={api_addr} store={store} state={} (workers={} slots={})",
        args.router_listen,
        state.display(),
        args.workers,
        args.worker_slots
    );

    let code = supervise_until_stopped(&mut components, &mut signal).await;
    stop_all(&mut components).await;
    Ok(code)
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
