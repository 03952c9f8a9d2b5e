//! `ate worker` flags ([`WorkerConfig`]) and test-only fault injection.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ate_egress::{Cidr, RouterAddr};

/// `--memory-restore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryRestore {
    Lazy,
    Eager,
}
use crate::service::WorkerError;

/// Configuration of one worker process (flattened into `ate worker`).
/// `--incremental-min-mib`'s default.
pub const DEFAULT_INCREMENTAL_MIN_MIB: u64 = crate::worker::DEFAULT_INCREMENTAL_MIN_BYTES >> 20;

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerConfig {
    /// Worker id: names `<state>/workers/<id>/` (socket, runc state, actor dirs).
    #[arg(long, env = "ATE_WORKER_ID")]
    pub id: String,

    /// Node state directory shared by the node agent and its workers.
    #[arg(long, default_value = "/var/lib/ate")]
    pub state_dir: PathBuf,

    /// atunnel listen address, the worker's own address (port 0 picks one; Info reports the bound one).
    #[arg(long, default_value = "127.0.0.2:8443")]
    pub listen: SocketAddr,

    /// atunnel address reported to the node agent (and through the api to the routers) instead
    /// of the bound one: the IP and port routers reach this worker on, when `--listen` binds
    /// 0.0.0.0/`::` (then it is required) or an address other hosts cannot reach (NAT, a
    /// container's own IP). Default: the bound address.
    #[arg(long, env = "ATE_WORKER_ADVERTISE", value_name = "IP:PORT")]
    pub advertise: Option<SocketAddr>,

    /// Control-plane addresses no actor may reach — api replicas, the SQL store, the object
    /// store — whatever its template's egress policy says, even an explicit `allow` entry for
    /// them (unlike the private ranges, which such an entry opens). IPs or CIDRs, comma-separated
    /// or repeated. IPv6 entries are accepted, though actors have no IPv6 route out today.
    #[arg(
        long,
        env = "ATE_WORKER_DENY_EGRESS",
        value_name = "IP|CIDR",
        value_delimiter = ',',
        value_parser = parse_deny_egress
    )]
    pub deny_egress: Vec<Cidr>,

    /// Directories under which templates' external `hostPath` volumes may live (comma-separated
    /// or repeated). A volume whose hostPath is not under one fails the actor's start with a
    /// clear error. None (the default of `ate worker`): no external volume can start here;
    /// `ate up` passes `<state-dir>/volumes` unless this is set.
    #[arg(
        long,
        env = "ATE_EXTERNAL_VOLUME_ROOTS",
        value_name = "DIR",
        value_delimiter = ','
    )]
    pub external_volume_roots: Vec<PathBuf>,

    /// The router that carries calls between actors (requests an actor sends to the platform
    /// address 169.254.17.1 naming another actor): `unix:/path` (the router's internal socket
    /// on this machine, plaintext) or `host:port[,host:port…]` (its internal listener, mTLS
    /// with this worker's certificate; the router must present the router SPIFFE ID). Unset:
    /// such calls are answered 503. The connection is made lazily, at the first call.
    #[arg(long, env = "ATE_WORKER_ROUTER", value_name = "unix:PATH|HOST:PORT")]
    pub router: Option<RouterAddr>,

    /// The api (`host:port[,host:port…]`, mTLS with this worker's certificate) that keeps
    /// actors' alarms: the local actor API's `/v1/alarm` sets, reads and deletes them there.
    /// Unset: `/v1/alarm` answers 503.
    #[arg(long, env = "ATE_WORKER_API", value_name = "HOST:PORT")]
    pub api: Option<String>,

    /// Actor slots offered to the scheduler.
    #[arg(long, default_value_t = 8)]
    pub slots: u32,

    /// CPU offered, in millicores (default: 1000 × available cores).
    #[arg(long)]
    pub cpu: Option<u32>,

    /// How many times `--cpu` the scheduler may book to actors: a template's `cpu` is the
    /// actor's share and cap, not a reservation, and idle actors use almost none, so the
    /// default books 32 actors of one core per core (128 of 250m on each core). `1` books no more
    /// than the machine has (strict reservations). From 1 to 1000.
    #[arg(
        long,
        env = "ATE_CPU_OVERCOMMIT",
        default_value_t = DEFAULT_CPU_OVERCOMMIT,
        value_parser = parse_cpu_overcommit
    )]
    pub cpu_overcommit: f64,

    /// Memory offered: bytes or a quantity like `8Gi` (default: half of total RAM).
    #[arg(long, value_parser = parse_memory)]
    pub memory: Option<u64>,

    /// Worker labels, `k=v,k2=v2` (matched against template and actor worker selectors).
    #[arg(long, value_delimiter = ',', value_parser = parse_label)]
    pub labels: Vec<(String, String)>,

    /// Unpacked image cache (default `<state>/images-cache`).
    #[arg(long)]
    pub image_cache: Option<PathBuf>,

    /// The actor log relay program (set by `ate worker` to `ate log-relay`, which stamps each
    /// line with its time); `None`: plain `cat`.
    #[arg(skip)]
    pub log_relay: Option<Vec<String>>,

    /// The page source program for lazy memory restores (set by `ate worker` to `ate
    /// page-source`); `None`: every memory restore is eager.
    #[arg(skip)]
    pub page_source: Option<Vec<String>>,

    /// How memory snapshots are restored: `lazy` (the actor runs once CRIU has restored its
    /// state; pages arrive as it touches them, each 2 MiB chunk checked against the manifest,
    /// the rest pushed in the background) or `eager` (every page is read and checked first).
    /// Generations written before chunk digests existed always restore eagerly.
    #[arg(long, env = "ATE_MEMORY_RESTORE", value_enum, default_value_t = MemoryRestore::Lazy)]
    pub memory_restore: MemoryRestore,

    /// How long a suspend lets requests in flight finish before it cuts them (a suspend request
    /// may ask for another grace). New requests wait meanwhile and resume the actor afterwards;
    /// idle connections close at once; WebSockets get a close frame (1001).
    #[arg(long, env = "ATE_SUSPEND_GRACE", default_value = "5s", value_parser = parse_retention)]
    pub suspend_grace: std::time::Duration,

    /// Unpacked images no sandbox has used for this long are removed (checked hourly; `0`
    /// keeps them forever). A later start unpacks (or pulls) the image again.
    #[arg(long, env = "ATE_IMAGE_RETENTION", default_value = "24h", value_parser = parse_retention)]
    pub image_retention: std::time::Duration,

    /// Memory-checkpointed actors kept frozen in place after a suspend, so a resume on this
    /// worker thaws them in milliseconds instead of restoring the dump (default: the slot
    /// count; 0 turns it off). The dump is still written and is what any other resume uses;
    /// the oldest frozen actor is dropped first.
    #[arg(long, env = "ATE_KEEP_FROZEN")]
    pub keep_frozen: Option<u32>,

    /// A frozen actor not resumed within this many seconds is dropped (its dump remains).
    #[arg(long, env = "ATE_FROZEN_TTL_SECONDS", default_value_t = 300)]
    pub frozen_ttl_seconds: u64,

    /// Frozen actors are dropped, oldest first, while the host's MemAvailable is below this
    /// percentage of its memory (they hold their RAM).
    #[arg(
        long,
        env = "ATE_FROZEN_MIN_AVAILABLE_PERCENT",
        default_value_t = 25,
        value_parser = clap::value_parser!(u8).range(0..=100)
    )]
    pub frozen_min_available_percent: u8,

    /// Network namespaces kept ready for the next starts and restores, so they need no `ip`
    /// run (0: each is made on demand; never more than `--slots`). Each spare holds a
    /// namespace with its loopback and one link.
    #[arg(long, env = "ATE_SPARE_NETNS", default_value_t = ate_netns::pool::DEFAULT_SPARE_NETNS)]
    pub spare_netns: usize,

    /// Run each new sandbox in its own user namespace (uid/gid 0–65535 inside = a host range
    /// of its own; see docs/security.md): on by default; `--userns=false` or `ATE_USERNS=0`
    /// turns it off. Restores follow the generation either way: one dumped in a user namespace
    /// is restored in one, an older one without.
    #[arg(
        long,
        env = "ATE_USERNS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub userns: bool,

    /// Track what lazily restored actors write (userfaultfd write protection, CRIU with the
    /// project's patch 0003), so their next suspend dumps only that (docs/incremental-suspend.md):
    /// on by default where CRIU and the kernel can; `--track-memory=false` or
    /// `ATE_TRACK_MEMORY=0` turns it off. Each tracked actor keeps its page source process
    /// (a few MiB) while it runs.
    #[arg(
        long,
        env = "ATE_TRACK_MEMORY",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub track_memory: bool,

    /// A tracked actor's suspend is incremental only when the generation it builds on holds at
    /// least this many MiB of memory images: below that a whole dump takes little longer, and
    /// a resume soon after an incremental suspend waits for its generation to be made whole
    /// (docs/incremental-suspend.md). 0: always.
    #[arg(long, env = "ATE_INCREMENTAL_MIN_MIB", default_value_t = DEFAULT_INCREMENTAL_MIN_MIB)]
    pub incremental_min_mib: u64,

    /// Node-wide directory of user namespace range claims (every worker on the node must use
    /// the same one).
    #[arg(long, env = "ATE_USERNS_CLAIMS_DIR", default_value = crate::runc::userns::DEFAULT_CLAIMS_DIR)]
    pub userns_claims_dir: PathBuf,

    /// Stop every sandbox an earlier process of this worker id left running under the state
    /// dir (no snapshot), remove their netns, mounts and directories, and exit. For operators
    /// retiring a worker whose actors were already moved, and for test clean-up; a worker
    /// started normally re-adopts such sandboxes instead.
    #[arg(long)]
    pub remove_leftovers: bool,

    /// Running actors with series of their own on `/metrics` (`ate_worker_actor_*`: CPU,
    /// memory, start time), the busiest first; the rest are summed under
    /// `atespace="_other",actor="_other"` (docs/observability.md). 0: only the sums.
    #[arg(long, env = "ATE_WORKER_ACTOR_METRICS_LIMIT", default_value_t = crate::actor_metrics::DEFAULT_LIMIT)]
    pub actor_metrics_limit: usize,

    /// The CRIU binary (default: `criu` on PATH). Missing, or older than 4.2: this worker takes
    /// no memory snapshots and advertises no `memory:criu` capability, so the api never places
    /// an actor whose newest generation holds memory here (it parks instead of losing that
    /// memory). `--criu=none` turns memory snapshots off on purpose.
    #[arg(long, env = "ATE_CRIU", value_name = "PATH|none")]
    pub criu: Option<PathBuf>,

    /// Snapshot keys directory (docs/security.md, "Snapshots at rest"): every generation this
    /// worker writes is sealed under its data key on the node's disk, and opened into
    /// `--snapshot-scratch` (a tmpfs) to be restored. Default: STATE_DIR/keys when it holds a
    /// data key (`ate up` creates it); none: generations are written in plaintext.
    #[arg(long = "snapshot-keys", env = "ATE_SNAPSHOT_KEYS")]
    pub snapshot_keys: Option<PathBuf>,

    /// Write generations in plaintext even when STATE_DIR/keys exists
    /// (`ATE_NO_SNAPSHOT_ENCRYPTION=1` for the workers of an `ate up`).
    #[arg(
        long = "no-snapshot-encryption",
        env = "ATE_NO_SNAPSHOT_ENCRYPTION",
        conflicts_with = "snapshot_keys",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_snapshot_encryption: bool,

    /// Where the plaintext of a generation passes while it is sealed or opened: a tmpfs
    /// (memory), so memory reaches the disk only sealed. Entries of processes that are gone
    /// are removed at start.
    #[arg(long = "snapshot-scratch", env = "ATE_SNAPSHOT_SCRATCH", default_value = ate_snapshot::sealed::DEFAULT_SCRATCH)]
    pub snapshot_scratch: PathBuf,

    /// atunnel's identity (`--tls-cert/--tls-key/--tls-ca`): mTLS accepting only the router.
    #[command(flatten)]
    pub tls: ate_tls::TlsArgs,

    /// Fault injection for tests (never set from the command line).
    #[arg(skip)]
    pub faults: Arc<Faults>,
}

impl WorkerConfig {
    /// A config with the defaults the flags would give.
    pub fn new(id: impl Into<String>, state_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        WorkerConfig {
            id: id.into(),
            state_dir: state_dir.into(),
            listen,
            advertise: None,
            deny_egress: Vec::new(),
            external_volume_roots: Vec::new(),
            router: None,
            api: None,
            slots: 8,
            cpu: None,
            cpu_overcommit: DEFAULT_CPU_OVERCOMMIT,
            memory: None,
            labels: Vec::new(),
            image_cache: None,
            image_retention: std::time::Duration::from_secs(24 * 3600),
            suspend_grace: std::time::Duration::from_secs(5),
            log_relay: None,
            page_source: None,
            memory_restore: MemoryRestore::Lazy,
            keep_frozen: None,
            frozen_ttl_seconds: 300,
            frozen_min_available_percent: 25,
            spare_netns: ate_netns::pool::DEFAULT_SPARE_NETNS,
            userns: crate::runc::userns::enabled_by_default(),
            userns_claims_dir: PathBuf::from(crate::runc::userns::DEFAULT_CLAIMS_DIR),
            track_memory: true,
            incremental_min_mib: DEFAULT_INCREMENTAL_MIN_MIB,
            remove_leftovers: false,
            actor_metrics_limit: crate::actor_metrics::DEFAULT_LIMIT,
            criu: None,
            snapshot_keys: None,
            no_snapshot_encryption: false,
            snapshot_scratch: PathBuf::from(ate_snapshot::sealed::DEFAULT_SCRATCH),
            tls: ate_tls::TlsArgs::default(),
            faults: Arc::default(),
        }
    }

    /// The snapshot keys directory in use (see `--snapshot-keys`).
    pub fn snapshot_keys_dir(&self) -> Option<PathBuf> {
        ate_snapshot::sealed::keys_dir(
            self.snapshot_keys.as_deref(),
            self.no_snapshot_encryption,
            &self.state_dir,
        )
    }

    /// Refuses `--listen`/`--advertise` that would report an address routers cannot dial.
    pub fn check_addresses(&self) -> Result<(), WorkerError> {
        match self.advertise {
            Some(a) if a.ip().to_canonical().is_unspecified() => Err(WorkerError::Config(format!(
                "--advertise {a} is not an address routers can dial: give the IP they reach \
                 this worker on"
            ))),
            Some(a) if a.port() == 0 => Err(WorkerError::Config(format!(
                "--advertise {a} has no port: give the port routers dial"
            ))),
            Some(_) => Ok(()),
            None if self.listen.ip().to_canonical().is_unspecified() => {
                Err(WorkerError::Config(format!(
                    "--listen {} binds every address: say which one routers reach with --advertise",
                    self.listen
                )))
            }
            None => Ok(()),
        }
    }

    /// The atunnel address Info reports: `--advertise`, else `bound` (what `--listen` bound).
    pub fn reported_address(&self, bound: SocketAddr) -> SocketAddr {
        self.advertise.unwrap_or(bound)
    }

    /// `<state>/workers/<id>`.
    pub fn worker_dir(&self) -> PathBuf {
        self.state_dir.join("workers").join(&self.id)
    }

    /// The lock that makes this process the worker's only one (`service::lock_identity`).
    pub fn lock_path(&self) -> PathBuf {
        self.worker_dir().join("worker.lock")
    }

    /// The WorkerService unix socket.
    pub fn socket_path(&self) -> PathBuf {
        self.worker_dir().join("worker.sock")
    }

    /// Where atunnel's handoff sockets live, one per advertised address
    /// (`<state>/run/atunnel/<ip:port>.sock`): shared by the workers of a machine, and what a
    /// router on it is given as `--local-tunnels`.
    pub fn handoff_dir(&self) -> PathBuf {
        self.state_dir.join("run").join("atunnel")
    }

    pub fn actors_dir(&self) -> PathBuf {
        self.worker_dir().join("actors")
    }

    /// Actor logs, shared by every worker of the node: `<state>/logs/actors/<atespace>/<name>.log`
    /// (what `ate logs` reads; it survives suspends and moves between workers).
    pub fn actor_logs_dir(&self) -> PathBuf {
        self.state_dir.join("logs").join("actors")
    }

    pub fn image_cache_dir(&self) -> PathBuf {
        self.image_cache
            .clone()
            .unwrap_or_else(|| self.state_dir.join("images-cache"))
    }

    pub fn cpu_millis(&self) -> u32 {
        self.cpu.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            u32::try_from(cores * 1000).unwrap_or(u32::MAX)
        })
    }

    /// What the scheduler may book: [`WorkerConfig::cpu_millis`] × `--cpu-overcommit`.
    pub fn cpu_capacity_millis(&self) -> u32 {
        overcommitted(self.cpu_millis(), self.cpu_overcommit)
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory.unwrap_or_else(|| total_memory_bytes() / 2)
    }

    /// What [`crate::worker::Worker`] keeps frozen after a suspend.
    pub fn frozen_policy(&self) -> FrozenPolicy {
        FrozenPolicy {
            max: self.keep_frozen.unwrap_or(self.slots) as usize,
            ttl: std::time::Duration::from_secs(self.frozen_ttl_seconds),
            min_available_percent: self.frozen_min_available_percent,
        }
    }

    pub fn label_map(&self) -> BTreeMap<String, String> {
        self.labels.iter().cloned().collect()
    }
}

/// Limits on actors kept frozen in place after a memory checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrozenPolicy {
    /// At most this many per worker (0: never keep one).
    pub max: usize,
    /// Dropped when not resumed within this long.
    pub ttl: std::time::Duration,
    /// Dropped while the host's MemAvailable is below this percentage of MemTotal.
    pub min_available_percent: u8,
}

impl FrozenPolicy {
    /// Nothing is kept frozen.
    pub const OFF: FrozenPolicy = FrozenPolicy {
        max: 0,
        ttl: std::time::Duration::ZERO,
        min_available_percent: 100,
    };
}

/// Faults a test can switch on for one worker, without process-wide env races.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every memory dump fails as if CRIU had (same as env `ATE_FAULT_CRIU_DUMP=fail`).
    pub criu_dump_fail: AtomicBool,
}

impl Faults {
    pub fn set_criu_dump_fail(&self, on: bool) {
        self.criu_dump_fail.store(on, Ordering::Release);
    }

    pub(crate) fn criu_dump_fails(&self) -> bool {
        self.criu_dump_fail.load(Ordering::Acquire)
            || std::env::var("ATE_FAULT_CRIU_DUMP").is_ok_and(|v| v == "fail")
    }
}

/// `--cpu-overcommit` unless given: idle agents use next to no CPU (issue 38), so a core is
/// booked 32 times over; weights share it when they are busy, quotas cap each one.
pub const DEFAULT_CPU_OVERCOMMIT: f64 = 32.0;

/// `millis` × `factor`, rounded down, at most `u32::MAX`.
pub fn overcommitted(millis: u32, factor: f64) -> u32 {
    let booked = (f64::from(millis) * factor).floor();
    if booked >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        booked.max(f64::from(millis)) as u32
    }
}

pub fn parse_cpu_overcommit(text: &str) -> Result<f64, String> {
    let factor: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number (e.g. 1, 1.5, 32)"))?;
    if !factor.is_finite() || !(1.0..=1000.0).contains(&factor) {
        return Err(format!(
            "{text:?} is out of range: from 1 (strict reservations) to 1000"
        ));
    }
    Ok(factor)
}

fn parse_memory(text: &str) -> Result<u64, String> {
    ate_core::template::parse_memory("--memory", text).map_err(|e| e.to_string())
}

fn parse_deny_egress(text: &str) -> Result<Cidr, String> {
    text.parse::<Cidr>().map_err(|e| e.to_string())
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("label {text:?} is not k=v"))?;
    if k.trim().is_empty() {
        return Err(format!("label {text:?} has an empty key"));
    }
    Ok((k.trim().to_string(), v.trim().to_string()))
}

/// The machine's memory (`MemTotal`), 0 when unreadable.
pub fn total_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// `24h`, `90m`, `30s`, `3600` (seconds) or `0`.
fn parse_retention(value: &str) -> Result<std::time::Duration, String> {
    let v = value.trim();
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{value:?}: expected a duration such as 24h, 90m or 3600"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("{value:?}: the unit must be s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn cpu_overcommit_multiplies_the_cpu_offered() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["ate", "--id", "w1", "--cpu", "2000"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).map(|c| c.worker)
        };
        let w = parse(&["--cpu-overcommit", "1"]).expect("strict");
        assert_eq!((w.cpu_millis(), w.cpu_capacity_millis()), (2000, 2000));
        let w = parse(&["--cpu-overcommit", "1.5"]).expect("fraction");
        assert_eq!(w.cpu_capacity_millis(), 3000);
        let w = parse(&["--cpu-overcommit", "16"]).expect("16");
        assert_eq!(w.cpu_capacity_millis(), 32_000);
        for bad in ["0.5", "0", "-2", "1001", "nan", "inf", "lots"] {
            let e = match parse(&[&format!("--cpu-overcommit={bad}")]) {
                Ok(_) => panic!("--cpu-overcommit {bad} accepted"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains("--cpu-overcommit"), "{e}");
        }
        // Never past u32::MAX millicores.
        assert_eq!(overcommitted(u32::MAX / 2, 1000.0), u32::MAX);
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        worker: WorkerConfig,
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "ate",
            "--id",
            "w1",
            "--listen",
            "127.0.0.3:8443",
            "--memory",
            "8Gi",
            "--labels",
            "zone=a,gpu=no",
        ])
        .expect("parse");
        let w = cli.worker;
        assert_eq!(w.id, "w1");
        assert_eq!(w.memory_bytes(), 8 << 30);
        assert_eq!(w.slots, 8);
        assert_eq!(w.state_dir, PathBuf::from("/var/lib/ate"));
        assert_eq!(
            w.image_cache_dir(),
            PathBuf::from("/var/lib/ate/images-cache")
        );
        assert_eq!(w.label_map().get("zone").map(String::as_str), Some("a"));
        assert_eq!(w.labels.len(), 2);
        assert!(w.cpu_millis() >= 1000);
        assert_eq!(w.cpu_overcommit, DEFAULT_CPU_OVERCOMMIT);
        assert_eq!(w.cpu_capacity_millis(), w.cpu_millis() * 32);
        assert!(Cli::try_parse_from(["ate", "--id", "w", "--labels", "nokv"]).is_err());
        // The bare flag (what `ate up --no-snapshot-encryption` passes) turns sealing off.
        let plain =
            Cli::try_parse_from(["ate", "--id", "w", "--no-snapshot-encryption"]).expect("parse");
        assert!(plain.worker.no_snapshot_encryption);
        assert_eq!(plain.worker.snapshot_keys_dir(), None);
        assert_eq!(w.advertise, None);
        assert!(w.deny_egress.is_empty());
    }

    fn config(listen: &str, advertise: Option<&str>) -> WorkerConfig {
        let mut c = WorkerConfig::new("w1", "/tmp/ate", listen.parse().expect("listen"));
        c.advertise = advertise.map(|a| a.parse().expect("advertise"));
        c
    }

    fn config_error(c: &WorkerConfig) -> String {
        match c.check_addresses() {
            Err(WorkerError::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn advertise_defaults_to_the_bound_address() {
        let c = config("127.0.0.3:0", None);
        assert!(c.check_addresses().is_ok());
        let bound: SocketAddr = "127.0.0.3:40123".parse().expect("bound");
        assert_eq!(c.reported_address(bound), bound);
    }

    #[test]
    fn advertise_replaces_the_bound_address() {
        let c = config("0.0.0.0:8443", Some("10.0.0.5:8443"));
        assert!(c.check_addresses().is_ok());
        assert_eq!(
            c.reported_address("0.0.0.0:8443".parse().expect("bound")),
            "10.0.0.5:8443".parse::<SocketAddr>().expect("addr")
        );
        assert!(
            config("[::]:8443", Some("[2001:db8::5]:8443"))
                .check_addresses()
                .is_ok()
        );
        assert!(
            config("10.0.0.5:8443", Some("192.0.2.7:443"))
                .check_addresses()
                .is_ok()
        );
    }

    #[test]
    fn unspecified_listen_needs_advertise() {
        assert_eq!(
            config_error(&config("0.0.0.0:8443", None)),
            "--listen 0.0.0.0:8443 binds every address: say which one routers reach with --advertise"
        );
        assert_eq!(
            config_error(&config("[::]:8443", None)),
            "--listen [::]:8443 binds every address: say which one routers reach with --advertise"
        );
        assert!(
            config_error(&config("[::ffff:0.0.0.0]:8443", None)).contains("binds every address")
        );
    }

    #[test]
    fn advertise_must_be_dialable() {
        for a in ["0.0.0.0:8443", "[::]:8443"] {
            let m = config_error(&config("10.0.0.5:8443", Some(a)));
            assert!(
                m.starts_with(&format!("--advertise {a} is not an address")),
                "{m}"
            );
        }
        assert_eq!(
            config_error(&config("0.0.0.0:8443", Some("10.0.0.5:0"))),
            "--advertise 10.0.0.5:0 has no port: give the port routers dial"
        );
    }

    #[test]
    fn advertise_and_deny_egress_flags_parse() {
        let cli = Cli::try_parse_from([
            "ate",
            "--id",
            "w1",
            "--listen",
            "0.0.0.0:8443",
            "--advertise",
            "10.0.0.5:8443",
            "--deny-egress",
            "10.0.0.10,203.0.113.0/24",
            "--deny-egress",
            "2001:db8::/32",
        ])
        .expect("parse");
        let w = cli.worker;
        assert_eq!(w.advertise, Some("10.0.0.5:8443".parse().expect("addr")));
        let denied: Vec<String> = w.deny_egress.iter().map(ToString::to_string).collect();
        assert_eq!(denied, ["10.0.0.10/32", "203.0.113.0/24", "2001:db8::/32"]);
        assert!(w.check_addresses().is_ok());
    }

    #[test]
    fn router_flag_parses() {
        let w = Cli::try_parse_from(["ate", "--id", "w1", "--router", "unix:/run/r.sock"])
            .expect("parse")
            .worker;
        assert_eq!(
            w.router,
            Some(RouterAddr::Unix(PathBuf::from("/run/r.sock")))
        );
        let w = Cli::try_parse_from(["ate", "--id", "w1"])
            .expect("parse")
            .worker;
        assert_eq!(w.router, None);
        let err = match Cli::try_parse_from(["ate", "--id", "w1", "--router", "unix:r.sock"]) {
            Ok(_) => panic!("a relative unix path parsed"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("--router"), "{err}");
    }

    #[test]
    fn bad_deny_egress_entry_is_named() {
        for (arg, bad) in [
            ("10.0.0.10,10.0.0.300", "10.0.0.300"),
            ("api.internal", "api.internal"),
            ("10.1.2.3/16", "10.1.2.3/16"),
            ("10.0.0.0/40", "10.0.0.0/40"),
        ] {
            let err = match Cli::try_parse_from(["ate", "--id", "w1", "--deny-egress", arg]) {
                Ok(_) => panic!("{arg} parsed"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains("--deny-egress"), "{err}");
            assert!(err.contains(bad), "{err}");
        }
    }
}
