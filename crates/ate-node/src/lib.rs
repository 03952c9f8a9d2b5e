//! The node agent (`ate node`, one per machine): serves NodeService to the api, drives the
//! node's workers over their unix sockets, registers them with the api and keeps them alive,
//! owns the node's snapshot generations (local, durable, tag cache), and asks the api to suspend
//! idle actors and to release actors whose processes exited.
//!
//! Architecture invariant: the node never writes the store; everything it learns goes to the api
//! through FleetService / ActorService, which applies it under the api's rules.
//!
//! Architecture invariant: wire messages are decoded and built only in the adapters
//! (`agent/service.rs` with `agent/convert.rs`, `worker_client.rs`, `api_client.rs`, `wire.rs`);
//! the agent's verbs and the fleet loops work on the node's own types (`types.rs`).

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod agent;
mod api_client;
mod cache;
mod fleet;
pub mod metrics;
mod pressure;
mod sweep;
mod types;
mod wire;
mod worker_client;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use agent::NodeAgent;

/// Flags of `ate node`.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeConfig {
    /// Node name (DNS-1123 label).
    #[arg(long = "name", default_value = "node-1")]
    pub name: String,
    /// NodeService listen address.
    #[arg(long = "listen", default_value = "127.0.0.1:8085")]
    pub listen: SocketAddr,
    /// Address the api uses to reach this node (default: the listen address).
    #[arg(long = "advertise")]
    pub advertise: Option<String>,
    /// api address, or several replicas' comma-separated (`host:port,host:port`): the node
    /// fails over to another when the one it uses stops answering.
    #[arg(long = "api", env = "ATE_API", default_value = ate_core::DEFAULT_API_ADDR)]
    pub api: String,
    /// State directory shared with the node's workers.
    #[arg(
        long = "state-dir",
        env = "ATE_STATE_DIR",
        default_value = "/var/lib/ate"
    )]
    pub state_dir: PathBuf,
    /// Durable snapshot store: `file:///dir` (default STATE_DIR/durable), `s3://bucket/prefix`,
    /// `gs://…`, `az://…`.
    #[arg(long = "durable-store", env = "ATE_DURABLE_STORE")]
    pub durable_store: Option<String>,
    /// Objects in the durable store without a `manifest.json` (an upload cut off by a dead
    /// node) are deleted by this node's hourly sweep once their newest is older than this
    /// (default 1h; `30m`, `6h`, seconds; `0`: this node does not sweep). Uploads give up
    /// without writing their manifest after half of it. Use one value on every node of a store.
    #[arg(long = "durable-gc-age", env = "ATE_DURABLE_GC_AGE", value_parser = parse_gc_age)]
    pub durable_gc_age: Option<Duration>,
    /// How often this node sweeps the durable store (partial uploads, unreferenced chunks):
    /// default hourly, give or take a quarter, the first one 1 to 5 minutes after the start
    /// (`30m`, `6h`, seconds). Sooner frees space sooner; each sweep lists the whole store.
    #[arg(long = "durable-sweep-every", env = "ATE_DURABLE_SWEEP_EVERY", value_parser = parse_sweep_every)]
    pub durable_sweep_every: Option<Duration>,
    /// Downloads of durable generations kept in STATE_DIR/snapshot-cache for later restores
    /// are removed once unused for this long (default 1h; `30m`, `6h`, seconds; `0`: kept).
    #[arg(long = "snapshot-cache-ttl", env = "ATE_SNAPSHOT_CACHE_TTL", value_parser = parse_cache_ttl)]
    pub snapshot_cache_ttl: Option<Duration>,
    /// Snapshot keys directory (a key-encryption key file and the data key wrapped by it,
    /// docs/security.md "Snapshots at rest"): every object of the durable store is sealed under
    /// that data key and refused when it does not open. Default: STATE_DIR/keys when it holds
    /// a data key (`ate up` creates it); none: the durable store is not encrypted.
    #[arg(long = "snapshot-keys", env = "ATE_SNAPSHOT_KEYS")]
    pub snapshot_keys: Option<PathBuf>,
    /// Do not encrypt the durable store even when STATE_DIR/keys exists.
    #[arg(long = "no-snapshot-encryption", conflicts_with = "snapshot_keys")]
    pub no_snapshot_encryption: bool,
    /// Read durable objects written before encryption (no header) as they are. Off: such an
    /// object is refused as unauthenticated, and the restore fails naming it.
    #[arg(
        long = "snapshot-legacy-plaintext",
        env = "ATE_SNAPSHOT_LEGACY_PLAINTEXT"
    )]
    pub snapshot_legacy_plaintext: bool,
    /// Where the plaintext of a node-local generation passes while it is opened for an upload:
    /// a tmpfs (memory). Entries of processes that are gone are removed at start.
    #[arg(long = "snapshot-scratch", env = "ATE_SNAPSHOT_SCRATCH", default_value = ate_snapshot::sealed::DEFAULT_SCRATCH)]
    pub snapshot_scratch: PathBuf,
    /// Directories under which external `hostPath` volumes live (the workers' own
    /// `--external-volume-roots`): `ate delete actor --purge-volumes` removes an actor's
    /// directory only under one of them.
    #[arg(
        long = "external-volume-roots",
        env = "ATE_EXTERNAL_VOLUME_ROOTS",
        value_name = "DIR",
        value_delimiter = ','
    )]
    pub external_volume_roots: Vec<PathBuf>,
    /// Memory pressure: while the host's MemAvailable is below this percentage of its memory
    /// and no worker keeps a frozen copy (those go first, below the workers'
    /// `--frozen-min-available-percent`), the node suspends its least recently used idle actor,
    /// one a second, its memory kept in its generation. 0: off.
    #[arg(
        long = "memory-low-percent",
        env = "ATE_MEMORY_LOW_PERCENT",
        default_value_t = 10,
        value_parser = clap::value_parser!(u8).range(0..=100)
    )]
    pub memory_low_percent: u8,
    /// Write the bound address as JSON here once serving.
    #[arg(long = "ready-file")]
    pub ready_file: Option<PathBuf>,
    /// The node's identity (`--tls-cert/--tls-key/--tls-ca`): mTLS to the api, and NodeService
    /// accepts only the api. Absent: plaintext.
    #[command(flatten)]
    pub tls: ate_tls::TlsArgs,
}

impl NodeConfig {
    /// The snapshot keys directory in use: `--snapshot-keys`, else STATE_DIR/keys if it holds a
    /// data key.
    pub fn snapshot_keys_dir(&self) -> Option<PathBuf> {
        ate_snapshot::sealed::keys_dir(
            self.snapshot_keys.as_deref(),
            self.no_snapshot_encryption,
            &self.state_dir,
        )
    }

    /// The lock that makes this process the node agent of its state dir ([`lock_identity`]).
    pub fn lock_path(&self) -> PathBuf {
        self.state_dir.join("node.lock")
    }
    pub fn workers_dir(&self) -> PathBuf {
        self.state_dir.join("workers")
    }
    pub fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }
    pub fn cache_dir(&self) -> PathBuf {
        self.state_dir.join("snapshot-cache")
    }
    /// `--snapshot-cache-ttl`, or its default (1 h); zero: nothing is evicted.
    pub fn snapshot_cache_ttl(&self) -> Duration {
        self.snapshot_cache_ttl.unwrap_or(Duration::from_secs(3600))
    }
    /// `--durable-gc-age`, or its default ([`ate_snapshot::DEFAULT_PARTIAL_GRACE`]); zero: no
    /// sweep on this node.
    pub fn durable_gc_age(&self) -> Duration {
        self.durable_gc_age
            .unwrap_or(ate_snapshot::DEFAULT_PARTIAL_GRACE)
    }
    pub fn durable_url(&self) -> String {
        self.durable_store
            .clone()
            .unwrap_or_else(|| format!("file://{}", self.state_dir.join("durable").display()))
    }
}

/// `1h`, `30m`, `90s`, `3600` (seconds) or `0`.
fn parse_cache_ttl(text: &str) -> Result<Duration, String> {
    ate_core::template::parse_duration_seconds("--snapshot-cache-ttl", text)
        .map(|s| Duration::from_secs(s.into()))
        .map_err(|e| e.to_string())
}

/// `1h`, `30m`, `90s`, `3600` (seconds); not `0`.
fn parse_sweep_every(text: &str) -> Result<Duration, String> {
    match ate_core::template::parse_duration_seconds("--durable-sweep-every", text) {
        Ok(0) => Err("--durable-sweep-every must be more than 0 seconds (use --durable-gc-age 0 for no sweeps)".into()),
        Ok(s) => Ok(Duration::from_secs(s.into())),
        Err(e) => Err(e.to_string()),
    }
}

/// `1h`, `30m`, `90s`, `3600` (seconds) or `0`.
fn parse_gc_age(text: &str) -> Result<Duration, String> {
    ate_core::template::parse_duration_seconds("--durable-gc-age", text)
        .map(|s| Duration::from_secs(s.into()))
        .map_err(|e| e.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid node configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("durable store: {0}")]
    Durable(String),
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] ate_tls::TlsError),
}

/// This machine's boot id: node-local generations are usable in place only within one boot.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-boot".into())
}

/// The node agent's identity, held: `<state>/node.lock` locked by this process
/// ([`lock_identity`]). One node agent per state dir: a second one (a restart while the first is
/// still stopping) would register the same workers and drive the same sandboxes.
#[derive(Debug)]
pub struct NodeLock {
    _lock: ate_tls::process::InstanceLock,
}

/// Checks the config, then takes the state dir's node lock, waiting (and saying so, with the
/// holder's pid) while an earlier node agent of this state dir still runs.
pub async fn lock_identity(cfg: &NodeConfig) -> Result<NodeLock, NodeError> {
    ate_core::validate_label("--name", &cfg.name).map_err(|e| NodeError::Config(e.to_string()))?;
    std::fs::create_dir_all(&cfg.state_dir)?;
    let lock = ate_tls::process::InstanceLock::acquire(
        &cfg.lock_path(),
        &format!("the node agent of {}", cfg.state_dir.display()),
    )
    .await?;
    Ok(NodeLock { _lock: lock })
}

/// Runs the node agent until `shutdown` resolves: [`lock_identity`] (a shutdown while it waits
/// ends the run at once), then [`run_locked`].
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let mut shutdown = Box::pin(shutdown);
    let lock = tokio::select! {
        lock = lock_identity(&cfg) => lock?,
        () = &mut shutdown => return Ok(()),
    };
    run_locked(cfg, lock, shutdown).await
}

/// Runs the node agent, its state dir locked, until `shutdown` resolves.
pub async fn run_locked(
    cfg: NodeConfig,
    _lock: NodeLock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    for dir in [cfg.workers_dir(), cfg.snapshots_dir(), cfg.cache_dir()] {
        std::fs::create_dir_all(&dir)?;
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| NodeError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let bound = listener.local_addr()?;
    let agent = NodeAgent::new(cfg.clone(), bound).await?;
    agent.export_gauges();
    if let Some(file) = &cfg.ready_file {
        ate_tls::process::write_ready_file(file, &format!("{{\"grpc\":\"{bound}\"}}"))?;
    }
    tracing::info!(node = %cfg.name, listen = %bound, api = %cfg.api, "node agent serving");
    agent.serve(listener, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeConfig,
    }

    fn gc_age(args: &[&str]) -> Duration {
        let cli = Cli::try_parse_from(std::iter::once("node").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        cli.node.durable_gc_age()
    }

    #[test]
    fn durable_gc_age_flag() {
        // Not set in the test's environment, or the default below would be its value.
        if std::env::var_os("ATE_DURABLE_GC_AGE").is_none() {
            assert_eq!(gc_age(&[]), ate_snapshot::DEFAULT_PARTIAL_GRACE);
            assert_eq!(gc_age(&[]), Duration::from_secs(3600));
        }
        assert_eq!(gc_age(&["--durable-gc-age", "0"]), Duration::ZERO);
        assert_eq!(
            gc_age(&["--durable-gc-age", "30m"]),
            Duration::from_secs(1800)
        );
        assert_eq!(
            gc_age(&["--durable-gc-age", "6h"]),
            Duration::from_secs(6 * 3600)
        );
        assert_eq!(gc_age(&["--durable-gc-age", "90"]), Duration::from_secs(90));
        assert!(Cli::try_parse_from(["node", "--durable-gc-age", "soon"]).is_err());
    }
}
