//! The worker's actor table and the operations behind WorkerService: start (cold or restore),
//! checkpoint, stop, activity, and the exit watcher.
//!
//! Operations on one actor are serialized by a per-actor async lock; different actors proceed
//! concurrently. An actor is "active" from the moment its probe passed and ingress went on until
//! ingress goes off again (checkpoint, stop, exit, shutdown).
//!
//! This file holds the table, the `Worker` with its constructor and the helpers every verb
//! uses (discard, ingress off); each verb has a file of its own: `start` (Start), `restore`
//! (boot: cold run or a generation restored, eager or lazy), `ready` (wakeup probes and an exit
//! before them), `frozen` (the frozen-in-place tier: thaw, trim), `checkpoint` (suspend: dump,
//! seal, the ROOTFS fallback; `tcp_quiet` its wait for connections to close), `stop` (Stop,
//! drain, shutdown), `activity` (Activity and the exit watcher), `adoption` (the adoption
//! record, re-adopting sandboxes after a worker restart), `logs` (actor log tails) and `types`
//! (what the verbs take and return, and [`VerbError`]).
//!
//! No wire type lives here: WorkerService (`service.rs`) decodes requests into [`types`] and
//! encodes the answers (`convert`).

mod activity;
mod adoption;
mod checkpoint;
mod exec;
mod frozen;
mod incremental;
mod local_api;
mod logs;
mod ready;
mod restore;
mod start;
mod stop;
mod tcp_quiet;
#[cfg(test)]
mod tests;
mod types;
mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::{ActorRef, TemplateSpec};

use crate::config::{Faults, FrozenPolicy};
use crate::error::SandboxError;
use crate::lazy::PageSource;
use crate::runtime::{ActorSandbox, SandboxRuntime};
use ate_atunnel::Tunnels;
use ate_egress::{ActorIdentity, Cidr, Egress, RouterClient};
use ate_image::ImageCache;
use ate_netns::NetnsDialer;

pub use exec::{ExecEvent, ExecInput, ExecRequest};
pub use local_api::ApiClients;
pub use types::{
    ActivityReport, ActorActivity, AdoptionRecord, CheckpointReply, CheckpointRequest, StartReply,
    StartRequest, StopReply, StopRequest, VerbError, Workload, outcome,
};

/// How often the exit watcher asks the runtime about active actors.
pub const EXIT_POLL: Duration = Duration::from_millis(500);
/// How long a checkpoint waits for closed tunnels' connections to leave the actor's TCP table.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);
/// The default of `--incremental-min-mib` (in bytes): the memory an actor's generation must hold for its
/// next suspend to be incremental (docs/incremental-suspend.md).
pub const DEFAULT_INCREMENTAL_MIN_BYTES: u64 = 128 << 20;
/// The default grace of a suspend for requests in flight (`--suspend-grace`).
pub const DEFAULT_SUSPEND_GRACE: Duration = Duration::from_secs(5);
/// How long a stopping worker waits for its node and the api to suspend its actors.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// An actor running here.
#[derive(Debug, Clone)]
struct Entry {
    sandbox: ActorSandbox,
    spec: TemplateSpec,
    template: String,
    /// Host pid of the container init (for the TCP-table check before a dump).
    pid: Option<u32>,
    /// The fencing token of the activation this copy belongs to (0: none was given).
    activation: u64,
    /// A lazy restore's page source until every page is in (see [`crate::lazy`]).
    page_source: Option<Arc<PageSource>>,
    /// Once every page is in: the page source of a restore that tracks what the actor writes
    /// (it holds the userfaultfd whose write protection is the tracking), kept for the
    /// actor's life here, so its next suspend dumps only what was written.
    tracker: Option<Arc<PageSource>>,
    /// The generation the tracked memory is relative to (the one restored, or the last one
    /// dumped while frozen in place and re-armed): the parent of an incremental dump.
    memory_parent: Option<PathBuf>,
}

/// An exit not yet reported through Activity.
#[derive(Debug, Clone)]
struct ExitReport {
    atespace: String,
    name: String,
    /// The activation of the copy that exited: the api applies the report only to that life
    /// of the actor (and asks again while that life's resume is still being recorded).
    activation: u64,
    idle_timeout_seconds: u32,
    at_ms: i64,
    exit_code: i32,
    log: String,
    /// Why the worker ended the actor because it must not run on (its memory could not be
    /// completed); empty for an exit of its own.
    crash: String,
    /// With `crash`: the generation directory whose content the lazy restore found damaged.
    damaged_generation: Option<PathBuf>,
}

impl ExitReport {
    /// The report of `entry`'s copy ending now with `exit_code` and `log`, of its own (no crash).
    fn of(entry: &Entry, exit_code: i32, log: String) -> Self {
        ExitReport {
            atespace: entry.sandbox.atespace.clone(),
            name: entry.sandbox.name.clone(),
            activation: entry.activation,
            idle_timeout_seconds: entry.spec.idle_timeout_seconds,
            at_ms: now_ms(),
            exit_code,
            log,
            crash: String::new(),
            damaged_generation: None,
        }
    }
}

/// An actor suspended with a memory dump whose sandbox was kept frozen in place: a cache of the
/// sealed generation at `gen_dir` that a resume of exactly that generation thaws.
#[derive(Debug, Clone)]
struct Frozen {
    entry: Entry,
    gen_dir: PathBuf,
    since: Instant,
    /// The ingress socket factory of its netns, kept for the thaw.
    dialer: Option<NetnsDialer>,
}

#[derive(Default)]
struct Table {
    actors: HashMap<String, Entry>,
    /// Not active, not counted against slots; dropped by [`Worker::trim_frozen`].
    frozen: HashMap<String, Frozen>,
    exits: Vec<ExitReport>,
    /// Sandboxes re-adopted from an earlier worker process, in `actors` but without ingress
    /// until the node has reconciled them with the api and renewed the lease.
    adopted: HashMap<String, NetnsDialer>,
}

/// Static facts reported by Info.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: String,
    /// The SPIFFE ID atunnel presents (reported in Info, pinned by the router).
    pub spiffe_id: String,
    pub epoch: u64,
    pub addresses: Vec<String>,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub slots: u32,
    pub labels: BTreeMap<String, String>,
}

pub struct Worker {
    pub ident: Identity,
    /// What actors asked through the local API about their own idle suspend.
    local_asks: Arc<local_api::LocalAsks>,
    runtime: Arc<dyn SandboxRuntime>,
    images: ImageCache,
    actors_dir: PathBuf,
    /// `<state>/logs/actors`: actor logs outside the actor dirs.
    logs_dir: PathBuf,
    pub tunnels: Arc<Tunnels>,
    /// Per-actor egress proxies (policy checks on every outbound TCP connection).
    egress: Egress,
    faults: Arc<Faults>,
    frozen_policy: FrozenPolicy,
    /// Default time a suspend lets requests in flight finish (`--suspend-grace`).
    suspend_grace: Duration,
    /// The page source command (`ate page-source`) when memory is restored lazily.
    page_source: Option<Vec<String>>,
    /// Memory images a parent generation must hold for a suspend to build on it (see
    /// [`Worker::with_incremental_min_bytes`]).
    incremental_min_bytes: u64,
    /// Where external `hostPath` volumes may live (`--external-volume-roots`).
    external_volume_roots: Vec<PathBuf>,
    table: Mutex<Table>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    shutting_down: AtomicBool,
    /// This process re-adopted sandboxes of an earlier one: it runs under a real node, so its
    /// shutdown leaves every sandbox running even before a node leased it.
    inherited: AtomicBool,
    /// When the node last asked for Activity (Unix ms).
    last_poll_ms: std::sync::atomic::AtomicI64,
    /// Open exec sessions (`ate exec`) per actor.
    execs: exec::ExecSessions,
}

/// Who the actor in `sandbox` is, for its egress proxy (the caller of its actor calls).
fn egress_identity(sandbox: &ActorSandbox, activation: u64) -> ActorIdentity {
    ActorIdentity {
        atespace: sandbox.atespace.clone(),
        name: sandbox.name.clone(),
        uid: sandbox.uid.clone(),
        activation,
    }
}

/// `<atespace>/<name>` of a validated ref.
fn key_of(atespace: &str, name: &str) -> String {
    format!("{atespace}/{name}")
}

/// Sandbox-layer failures as verb errors: a broken image, spec, snapshot or runtime command is
/// not transient (the api crashes the actor); host I/O failures are INTERNAL.
fn sandbox_error(what: &str, e: SandboxError) -> VerbError {
    match e {
        SandboxError::Io { .. } => VerbError::Internal(format!("{what}: {e}")),
        _ => VerbError::FailedPrecondition(format!("{what}: {e}")),
    }
}

fn snapshot_error(what: &str, e: ate_snapshot::Error) -> VerbError {
    VerbError::FailedPrecondition(format!("{what}: {e}"))
}

impl Worker {
    pub fn new(
        ident: Identity,
        runtime: Arc<dyn SandboxRuntime>,
        images: ImageCache,
        actors_dir: PathBuf,
        logs_dir: PathBuf,
        faults: Arc<Faults>,
    ) -> Self {
        let local_asks = Arc::new(local_api::LocalAsks::default());
        Worker {
            ident,
            runtime,
            images,
            actors_dir,
            logs_dir,
            tunnels: Arc::new(Tunnels::new()),
            egress: Egress::new().with_local_api(Arc::new(local_api::WorkerLocalApi {
                asks: local_asks.clone(),
                api: None,
            })),
            local_asks,
            faults,
            frozen_policy: FrozenPolicy::OFF,
            suspend_grace: DEFAULT_SUSPEND_GRACE,
            page_source: None,
            incremental_min_bytes: DEFAULT_INCREMENTAL_MIN_BYTES,
            external_volume_roots: Vec::new(),
            table: Mutex::new(Table::default()),
            locks: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            inherited: AtomicBool::new(false),
            last_poll_ms: std::sync::atomic::AtomicI64::new(now_ms()),
            execs: exec::ExecSessions::default(),
        }
    }

    /// Deny every actor's egress to `denied` (`--deny-egress`: the control plane), whatever its
    /// template allows.
    pub fn with_egress_denied(mut self, denied: Vec<Cidr>) -> Self {
        self.egress = self.egress.with_control_plane(denied);
        self
    }

    /// Calls between actors (requests to the platform address naming another actor) go to
    /// this router (`--router`); without one they are answered 503.
    pub fn with_router(mut self, router: Option<RouterClient>) -> Self {
        self.egress = self.egress.with_router(router);
        self
    }

    /// The api's AlarmService and IdentityService, for the local actor API's `/v1/alarm` and
    /// identity tokens (`--api`); without them those answer 503.
    pub fn with_api(mut self, api: Option<local_api::ApiClients>) -> Self {
        self.egress = self
            .egress
            .with_local_api(Arc::new(local_api::WorkerLocalApi {
                asks: self.local_asks.clone(),
                api,
            }));
        self
    }

    /// The time a suspend lets requests in flight finish unless it asks for another.
    /// Directories under which external `hostPath` volumes may live.
    pub fn with_external_volume_roots(mut self, roots: Vec<PathBuf>) -> Self {
        self.external_volume_roots = roots;
        self
    }

    pub fn with_suspend_grace(mut self, grace: Duration) -> Self {
        self.suspend_grace = grace;
        self
    }

    /// Restore memory lazily with this page source command (`ate page-source`) when a
    /// generation carries chunk digests (eager restores otherwise).
    pub fn with_page_source(mut self, command: Option<Vec<String>>) -> Self {
        self.page_source = command.filter(|c| !c.is_empty());
        self
    }

    /// Suspends of tracked actors build on their parent generation only when its memory
    /// images hold at least `bytes`: below that a whole dump costs little, and a resume soon
    /// after an incremental suspend waits for the generation to be made whole.
    pub fn with_incremental_min_bytes(mut self, bytes: u64) -> Self {
        self.incremental_min_bytes = bytes;
        self
    }

    /// Keep memory-checkpointed actors frozen in place per `policy` (off by default).
    pub fn with_frozen_policy(mut self, policy: FrozenPolicy) -> Self {
        self.frozen_policy = policy;
        self
    }

    fn keeps_frozen(&self) -> bool {
        self.frozen_policy.max > 0 && self.runtime.capabilities().can_keep_frozen
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        match self.table.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = match self.locks.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        locks.entry(key.to_string()).or_default().clone()
    }

    fn sandbox_for(&self, atespace: &str, name: &str, uid: &str) -> ActorSandbox {
        ActorSandbox::new(
            atespace,
            name,
            uid,
            self.actors_dir.join(atespace).join(name),
        )
        .with_log_path(self.logs_dir.join(atespace).join(format!("{name}.log")))
    }

    /// Actors running here and actors kept frozen in place (for the metrics).
    pub(crate) fn occupancy(&self) -> (usize, usize) {
        let t = self.table();
        (t.actors.len(), t.frozen.len())
    }

    /// True once the worker is stopping: its node asks the api to suspend every actor.
    pub fn draining(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    fn check_running(&self) -> Result<(), VerbError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(VerbError::Unavailable(format!(
                "worker {} is shutting down",
                self.ident.id
            )));
        }
        Ok(())
    }

    pub fn can_restore_memory(&self) -> bool {
        self.runtime.capabilities().can_restore_memory
    }

    /// True when memory restores can be lazy here (a page source and userfaultfd support).
    /// The restore capabilities advertised to the api (`memory:lazy` only with a page source).
    pub fn capabilities(&self) -> Vec<String> {
        let mut caps = self.runtime.capabilities();
        caps.can_restore_lazily = self.can_restore_lazily();
        caps.advertised()
    }

    pub fn can_restore_lazily(&self) -> bool {
        self.page_source.is_some() && self.runtime.capabilities().can_restore_lazily
    }

    pub fn sandbox_class(&self) -> String {
        self.runtime.capabilities().sandbox_class
    }

    /// Refuses a request that names another worker as the actor's (`worker_id`).
    fn check_addressed(&self, actor: &ActorRef, worker_id: &str) -> Result<(), VerbError> {
        if worker_id != self.ident.id {
            return Err(VerbError::FailedPrecondition(format!(
                "workload for {}/{} names worker {:?}, this is worker {:?}",
                actor.atespace, actor.name, worker_id, self.ident.id
            )));
        }
        Ok(())
    }

    /// Stops the sandbox and removes the actor's working dirs (egress first: its listener holds
    /// the netns the runtime deletes).
    async fn discard(&self, sandbox: &ActorSandbox) -> Result<(), VerbError> {
        self.egress
            .stop(&key_of(&sandbox.atespace, &sandbox.name))
            .await;
        remove_sandbox(self.runtime.as_ref(), sandbox).await
    }

    async fn discard_quietly(&self, sandbox: &ActorSandbox) {
        if let Err(e) = self.discard(sandbox).await {
            tracing::warn!(actor = %key_of(&sandbox.atespace, &sandbox.name), error = %e.message(), "cleanup after a failed start");
        }
    }

    /// Ingress off and every tunnel of `key` closed (waits for them to go, bounded); egress off
    /// too, its connections reset (a dump cannot take established TCP).
    async fn ingress_off(&self, key: &str) -> Option<NetnsDialer> {
        // Exec sessions first: nothing the worker started may be in the sandbox when it is
        // dumped or removed (docs/exec.md).
        self.end_exec_sessions(key).await;
        self.egress.stop(key).await;
        let a = self.tunnels.deactivate(key)?;
        if !a.wait_closed(QUIESCE_TIMEOUT).await {
            tracing::warn!(actor = %key, open = a.open_tunnels(), "tunnels still open after ingress off");
        }
        Some(a.dialer().clone())
    }
}

/// Stops the sandbox and removes its directory (the part of [`Worker::discard`] that needs no
/// worker: also run after a checkpoint's reply).
async fn remove_sandbox(
    runtime: &dyn SandboxRuntime,
    sandbox: &ActorSandbox,
) -> Result<(), VerbError> {
    runtime.stop(sandbox).await.map_err(|e| {
        VerbError::Internal(format!("stop sandbox {}: {e}", sandbox.container_id()))
    })?;
    remove_dir_all(&sandbox.dir).await
}

async fn remove_dir_all(dir: &Path) -> Result<(), VerbError> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(VerbError::Internal(format!(
            "remove {}: {e}",
            dir.display()
        ))),
    }
}
