//! The worker's actor table and the operations behind WorkerService: start (cold or restore),
//! checkpoint, stop, activity, and the exit watcher.
//!
//! Operations on one actor are serialized by a per-actor async lock; different actors proceed
//! concurrently. An actor is "active" from the moment its probe passed and ingress went on until
//! ingress goes off again (checkpoint, stop, exit, shutdown).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use ate_core::clock::now_ms;
use ate_core::template::MemoryRestore;
use ate_core::{Fidelity, TemplateSpec};
use ate_proto::v1;
use futures::StreamExt as _;
use tonic::Status;

use crate::atunnel::Tunnels;
use crate::config::{Faults, FrozenPolicy};
use crate::egress::{Cidr, Egress};
use crate::error::SandboxError;
use crate::image::ImageCache;
use crate::lazy::{Outcome, PageSource};
use crate::netns::{ACTOR_IP, NetnsDialer, connect_in_netns_timeout};
use crate::probe;
use crate::runc;
use crate::runtime::{ActorSandbox, ExitInfo, RunMode, SandboxRuntime, SandboxSpec};

/// How often the exit watcher asks the runtime about active actors.
pub const EXIT_POLL: Duration = Duration::from_millis(500);
/// Probe limit when a template's first container has no wakeup probe (template default).
const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a checkpoint waits for closed tunnels' connections to leave the actor's TCP table.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);
/// The default grace of a suspend for requests in flight (`--suspend-grace`).
pub const DEFAULT_SUSPEND_GRACE: Duration = Duration::from_secs(5);
const LOG_TAIL_LINES: usize = 20;
/// How often a start checks, while its wakeup probe runs, whether the container already exited.
const START_EXIT_CHECK: Duration = Duration::from_millis(100);
/// Sandboxes stopped at once when the worker shuts down.
const SHUTDOWN_PARALLELISM: usize = 16;
/// How long a stopping worker waits for its node and the api to suspend its actors.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// A drain gives up when the node has not polled Activity for this long.
const NODE_SILENCE: Duration = Duration::from_secs(2);
/// How long a checkpoint waits for a lazy restore to place every page.
const LAZY_COMPLETE_WAIT: Duration = Duration::from_secs(60);
/// How long a restarted worker waits for a lazy restore's page source to finish before it
/// gives up adopting the sandbox.
const ADOPT_PAGE_SOURCE_WAIT: Duration = Duration::from_secs(30);
/// Next to each active actor: what a restarted worker needs to re-adopt its sandbox.
const ADOPTION_FILE: &str = "adoption.pb";

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
}

/// An exit not yet reported through Activity.
#[derive(Debug, Clone)]
struct ExitReport {
    atespace: String,
    name: String,
    idle_timeout_seconds: u32,
    at_ms: i64,
    exit_code: i32,
    log: String,
    /// Why the worker ended the actor because it must not run on (its memory could not be
    /// completed); empty for an exit of its own.
    crash: String,
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
    table: Mutex<Table>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    shutting_down: AtomicBool,
    /// When the node last asked for Activity (Unix ms).
    last_poll_ms: std::sync::atomic::AtomicI64,
}

/// `<atespace>/<name>` of a validated ref.
fn key_of(atespace: &str, name: &str) -> String {
    format!("{atespace}/{name}")
}

fn validate_ref(r: Option<&v1::ObjectRef>) -> Result<(String, String), Status> {
    let r = r.ok_or_else(|| Status::invalid_argument("actor ref missing"))?;
    ate_core::validate_label("actor.atespace", &r.atespace)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    ate_core::validate_label("actor.name", &r.name)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((r.atespace.clone(), r.name.clone()))
}

/// Sandbox-layer failures as RPC errors: a broken image, spec, snapshot or runtime command is
/// not transient (the api crashes the actor); host I/O failures are INTERNAL.
fn sandbox_status(what: &str, e: SandboxError) -> Status {
    match e {
        SandboxError::Io { .. } => Status::internal(format!("{what}: {e}")),
        _ => Status::failed_precondition(format!("{what}: {e}")),
    }
}

fn snapshot_status(what: &str, e: ate_snapshot::Error) -> Status {
    Status::failed_precondition(format!("{what}: {e}"))
}

fn fidelity_from_wire(n: i32) -> Result<Option<Fidelity>, Status> {
    if n == 0 {
        return Ok(None);
    }
    Fidelity::from_wire(n)
        .map(Some)
        .ok_or_else(|| Status::invalid_argument(format!("unknown fidelity {n}")))
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
        Worker {
            ident,
            runtime,
            images,
            actors_dir,
            logs_dir,
            tunnels: Arc::new(Tunnels::new()),
            egress: Egress::new(),
            faults,
            frozen_policy: FrozenPolicy::OFF,
            suspend_grace: DEFAULT_SUSPEND_GRACE,
            page_source: None,
            table: Mutex::new(Table::default()),
            locks: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            last_poll_ms: std::sync::atomic::AtomicI64::new(now_ms()),
        }
    }

    /// Deny every actor's egress to `denied` (`--deny-egress`: the control plane), whatever its
    /// template allows.
    pub fn with_egress_denied(mut self, denied: Vec<Cidr>) -> Self {
        self.egress = self.egress.with_control_plane(denied);
        self
    }

    /// The time a suspend lets requests in flight finish unless it asks for another.
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

    fn check_running(&self) -> Result<(), Status> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Status::unavailable(format!(
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
    pub fn can_restore_lazily(&self) -> bool {
        self.page_source.is_some() && self.runtime.capabilities().can_restore_lazily
    }

    pub fn sandbox_class(&self) -> String {
        self.runtime.capabilities().sandbox_class
    }

    /// Validates a workload addressed to this worker; returns `(atespace, name)`.
    fn check_workload(&self, w: Option<&v1::Workload>) -> Result<(String, String), Status> {
        let w = w.ok_or_else(|| Status::invalid_argument("workload missing"))?;
        let (atespace, name) = validate_ref(w.actor.as_ref())?;
        if w.worker_id != self.ident.id {
            return Err(Status::failed_precondition(format!(
                "workload for {atespace}/{name} names worker {:?}, this is worker {:?}",
                w.worker_id, self.ident.id
            )));
        }
        Ok((atespace, name))
    }

    // ------------------------------------------------------------------ Start

    pub async fn start(&self, req: v1::WorkerStartRequest) -> Result<v1::WorkerStartReply, Status> {
        let begun = Instant::now();
        let (atespace, name) = self.check_workload(req.workload.as_ref())?;
        let workload = req.workload.unwrap_or_default();
        let wire_spec = workload
            .spec
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("workload.spec missing"))?;
        let spec = ate_proto::spec_from_wire(wire_spec)
            .map_err(|e| Status::invalid_argument(format!("workload.spec: {e}")))?;
        let requested = fidelity_from_wire(req.fidelity)?;
        let generation_dir =
            (!req.generation_dir.is_empty()).then(|| PathBuf::from(&req.generation_dir));
        if requested.is_some() && generation_dir.is_none() {
            return Err(Status::invalid_argument(
                "a fidelity was given without a generation_dir",
            ));
        }
        if spec.sandbox_class != self.sandbox_class() {
            return Err(Status::failed_precondition(format!(
                "template wants sandbox class {:?}; worker {} runs {:?}",
                spec.sandbox_class,
                self.ident.id,
                self.sandbox_class()
            )));
        }
        let key = key_of(&atespace, &name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;
        self.check_running()?;
        // An exit of an earlier run that was never collected is about a sandbox that is gone.
        self.table()
            .exits
            .retain(|x| !(x.atespace == atespace && x.name == name));
        let activation = workload.activation;
        let held = self
            .table()
            .actors
            .get(&key)
            .map(|e| (e.sandbox.uid.clone(), e.activation));
        if let Some((uid, held)) = held {
            let same = uid == workload.uid;
            if same && (activation == 0 || held == activation) {
                // A retried start of the copy that runs here (or a re-adopted one the api
                // still names): nothing to do but make sure ingress is on.
                if self.tunnels.get(&key).is_none()
                    && let Some(dialer) = self.table().adopted.remove(&key)
                {
                    self.tunnels.activate(&key, held, dialer);
                    tracing::info!(actor = %key, activation = held, "re-adopted actor named by a start; ingress on");
                }
                if self.tunnels.get(&key).is_some() {
                    return Ok(v1::WorkerStartReply {
                        epoch: self.ident.epoch,
                        ready_ms: 0,
                    });
                }
            }
            if same && activation != 0 && held > activation {
                return Err(Status::failed_precondition(format!(
                    "worker {} holds activation {held} of {key}; this start names the older {activation}",
                    self.ident.id
                )));
            }
            // An older copy (or one of a deleted actor of the same name) stops serving before
            // the new activation exists; its sandbox goes with the discard below.
            tracing::info!(actor = %key, held, activation, "replacing an older copy of the actor");
            self.ingress_off(&key).await;
            let mut t = self.table();
            t.adopted.remove(&key);
            t.actors.remove(&key);
        }
        let in_use = self.table().actors.len();
        if in_use >= self.ident.slots as usize {
            return Err(Status::resource_exhausted(format!(
                "worker {} has all {} actor slots in use",
                self.ident.id, self.ident.slots
            )));
        }
        // Whatever happens next, a frozen copy of this actor stops being a cache: it is thawed
        // now (a resume of exactly its generation) or discarded with the rest below.
        let frozen = self.table().frozen.remove(&key);
        if let (Some(f), Some(gen_dir)) = (frozen, generation_dir.as_deref()) {
            let memory = matches!(requested, None | Some(Fidelity::Memory));
            if memory && f.gen_dir == gen_dir {
                match self
                    .thaw(&key, f, &spec, &workload)
                    .instrument(ate_tls::trace_span!("thaw"))
                    .await
                {
                    Ok(()) => {
                        crate::metrics::thawed(true);
                        let ready_ms =
                            u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
                        tracing::info!(actor = %key, ready_ms, restore = req.generation_dir.as_str(), "actor thawed in place; ingress on");
                        return Ok(v1::WorkerStartReply {
                            epoch: self.ident.epoch,
                            ready_ms,
                        });
                    }
                    // The generation on disk is intact: restore it the ordinary way.
                    Err(e) => {
                        crate::metrics::thawed(false);
                        tracing::warn!(actor = %key, error = %e.message(), "thaw failed; restoring the generation instead")
                    }
                }
            }
        }
        self.trim_frozen().await;
        if spec.containers.is_empty() {
            return Err(Status::invalid_argument("workload.spec has no containers"));
        }
        let mut images = Vec::with_capacity(spec.containers.len());
        for c in &spec.containers {
            let image = self
                .images
                .ensure(&c.image)
                .await
                .map_err(|e| sandbox_status(&format!("image {}", c.image), e))?;
            images.push(image);
        }
        let first_image = images.remove(0);
        let sandbox_spec = SandboxSpec::from_template(&spec, first_image, images)
            .map_err(|e| sandbox_status("sandbox spec", e))?;
        let sandbox = self.sandbox_for(&atespace, &name, &workload.uid);

        // Nothing of an earlier life of this actor on this worker carries over: the generation
        // (or nothing, for a cold boot) is the whole truth.
        self.discard(&sandbox).await?;
        // The log is appended across lives: a failed start quotes only what this one wrote.
        let log_from = tokio::fs::metadata(sandbox.log_path())
            .await
            .map_or(0, |m| m.len());
        // Trace spans of the phases (disabled when traces are off): the sandbox with its netns
        // (a CRIU restore or a run), egress, the wakeup probe, activation.
        let boot_span = if generation_dir.is_some() {
            ate_tls::trace_span!("restore")
        } else {
            ate_tls::trace_span!("run")
        };
        let booted = self
            .boot(
                &sandbox,
                &sandbox_spec,
                generation_dir.as_deref(),
                requested,
                spec.memory_restore,
            )
            .instrument(boot_span)
            .await;
        // Declared after the sandbox is discarded on every error path below: a page source is
        // released only once its sandbox is gone.
        let (pid, page_source) = match booted {
            Ok(booted) => booted,
            Err(e) => {
                self.discard_quietly(&sandbox).await;
                return Err(e);
            }
        };
        // Egress proxy + nftables redirect, right after the sandbox started (cold boot or any
        // restore). Nothing leaks before: the netns has no way out (its only link leads nowhere),
        // so an early connect just times out or is refused.
        if let Err(e) = self
            .egress
            .start(&key, &sandbox.netns(), &spec.egress)
            .instrument(ate_tls::trace_span!("egress"))
            .await
        {
            self.discard_quietly(&sandbox).await;
            return Err(Status::internal(format!("egress for {key}: {e}")));
        }
        let egress_at = begun.elapsed();
        if let Err(e) = self
            .wait_ready(
                &sandbox,
                &spec,
                &sandbox_spec,
                log_from,
                page_source.as_ref(),
            )
            .instrument(ate_tls::trace_span!("probe"))
            .await
        {
            self.discard_quietly(&sandbox).await;
            return Err(e);
        }
        let probed_at = begun.elapsed();
        let _activate = ate_tls::trace_span!("activate");
        let dialer = match NetnsDialer::new(&sandbox.netns()).await {
            Ok(d) => d,
            Err(e) => {
                self.discard_quietly(&sandbox).await;
                return Err(Status::internal(format!(
                    "socket factory for netns {}: {e}",
                    sandbox.netns()
                )));
            }
        };
        self.write_adoption(
            &sandbox,
            &workload,
            pid,
            page_source.as_ref().map(PageSource::pid),
        )
        .await;
        self.table().actors.insert(
            key.clone(),
            Entry {
                sandbox,
                spec,
                template: workload.template.clone(),
                pid,
                activation,
                page_source: page_source.map(Arc::new),
            },
        );
        self.tunnels.activate(&key, activation, dialer);
        let ready_ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
        let kind = if generation_dir.is_some() {
            "restore"
        } else {
            "cold"
        };
        crate::metrics::start_phase(kind, "boot_and_egress", egress_at);
        crate::metrics::start_phase(kind, "probe", probed_at - egress_at);
        tracing::info!(
            actor = %key,
            ready_ms,
            boot_and_egress_ms = egress_at.as_millis() as u64,
            probe_ms = (probed_at - egress_at).as_millis() as u64,
            restore = req.generation_dir.as_str(),
            "actor started; ingress on"
        );
        Ok(v1::WorkerStartReply {
            epoch: self.ident.epoch,
            ready_ms,
        })
    }

    /// Thaws a sandbox kept frozen since its checkpoint: the dumped processes continue with
    /// their netns, mounts and files as they were, so nothing is extracted or verified. On
    /// failure the sandbox is discarded (the caller restores the generation instead).
    async fn thaw(
        &self,
        key: &str,
        frozen: Frozen,
        spec: &TemplateSpec,
        workload: &v1::Workload,
    ) -> Result<(), Status> {
        let sandbox = frozen.entry.sandbox.clone();
        let begun = Instant::now();
        let thawed = async {
            self.runtime
                .thaw(&sandbox)
                .await
                .map_err(|e| sandbox_status("thaw", e))?;
            let resumed = begun.elapsed();
            // Independent of each other, so at once: the egress proxy (the netns kept its
            // nftables redirect; only the proxy was stopped at checkpoint), the wakeup probe and
            // the socket factory for ingress.
            let netns = sandbox.netns();
            let kept = frozen.dialer.clone();
            let (egress, probe, dialer) = tokio::join!(
                self.egress.restart(key, &netns, &spec.egress),
                self.wait_probe(&sandbox, spec),
                async {
                    match kept {
                        Some(d) => Ok(d),
                        None => NetnsDialer::new(&netns).await,
                    }
                },
            );
            egress.map_err(|e| Status::internal(format!("egress for {key}: {e}")))?;
            probe?;
            let dialer = dialer.map_err(|e| {
                Status::internal(format!("socket factory for netns {netns}: {e}"))
            })?;
            tracing::debug!(actor = %key, runc_resume_ms = resumed.as_millis() as u64, total_ms = begun.elapsed().as_millis() as u64, "thawed");
            Ok(dialer)
        }
        .await;
        let dialer = match thawed {
            Ok(d) => d,
            Err(e) => {
                self.discard_quietly(&sandbox).await;
                return Err(e);
            }
        };
        self.write_adoption(&sandbox, workload, frozen.entry.pid, None)
            .await;
        self.table().actors.insert(
            key.to_string(),
            Entry {
                sandbox,
                spec: spec.clone(),
                template: workload.template.clone(),
                pid: frozen.entry.pid,
                activation: workload.activation,
                // A frozen copy was dumped only once all its pages were in.
                page_source: None,
            },
        );
        self.tunnels.activate(key, workload.activation, dialer);
        Ok(())
    }

    /// Drops frozen actors, oldest first, until at most the policy's `max` remain, none is older
    /// than the policy's TTL or has lost its generation directory (deleted or detached), and
    /// the host has the policy's share of memory available. Each drop takes that actor's lock;
    /// one busy with another operation is skipped.
    pub async fn trim_frozen(&self) {
        let policy = self.frozen_policy;
        let mut frozen: Vec<(String, Instant, PathBuf)> = self
            .table()
            .frozen
            .iter()
            .map(|(k, f)| (k.clone(), f.since, f.gen_dir.clone()))
            .collect();
        if frozen.is_empty() {
            return;
        }
        frozen.sort_by_key(|(_, since, _)| *since);
        let mut excess = frozen.len().saturating_sub(policy.max);
        let mut low_memory = memory_low(policy.min_available_percent);
        for (key, since, gen_dir) in frozen {
            let stale = since.elapsed() >= policy.ttl
                || !gen_dir.join(ate_snapshot::MANIFEST_FILE).exists();
            if excess == 0 && !low_memory && !stale {
                continue;
            }
            let lock = self.lock_for(&key);
            let Ok(_guard) = lock.try_lock() else {
                continue;
            };
            let Some(f) = self.table().frozen.remove(&key) else {
                continue;
            };
            let why = if excess > 0 {
                "over the frozen limit"
            } else if low_memory {
                "host memory low"
            } else {
                "expired or its generation is gone"
            };
            tracing::info!(actor = %key, frozen_s = f.since.elapsed().as_secs(), why, "dropping frozen actor (its generation remains)");
            self.discard_quietly(&f.entry.sandbox).await;
            excess = excess.saturating_sub(1);
            if low_memory {
                low_memory = memory_low(policy.min_available_percent);
            }
        }
    }

    /// Extracts what the fidelity keeps and starts the sandbox; returns the init pid and, for a
    /// lazy memory restore, the page source serving the actor's memory.
    async fn boot(
        &self,
        sandbox: &ActorSandbox,
        spec: &SandboxSpec,
        generation_dir: Option<&Path>,
        requested: Option<Fidelity>,
        memory_restore: MemoryRestore,
    ) -> Result<(Option<u32>, Option<PageSource>), Status> {
        let Some(gen_dir) = generation_dir else {
            // Egress is set up by `start` once this returns (the netns is made by the runtime).
            let started = self
                .runtime
                .run(sandbox, spec, RunMode::KeepRootfs)
                .await
                .map_err(|e| sandbox_status("cold boot", e))?;
            return Ok((started.pid, None));
        };
        let begun = Instant::now();
        let manifest = ate_snapshot::read_manifest(gen_dir)
            .await
            .map_err(|e| snapshot_status(&format!("generation {}", gen_dir.display()), e))?;
        let fidelity = requested.unwrap_or(manifest.fidelity);
        if fidelity.rank() > manifest.fidelity.rank() {
            return Err(Status::failed_precondition(format!(
                "generation {} holds {} and cannot be restored at {fidelity}",
                gen_dir.display(),
                manifest.fidelity
            )));
        }
        if fidelity == Fidelity::Memory && manifest.sandbox_class != self.sandbox_class() {
            return Err(Status::failed_precondition(format!(
                "generation {} was captured by sandbox class {:?}; its memory cannot restore on {:?}",
                gen_dir.display(),
                manifest.sandbox_class,
                self.sandbox_class()
            )));
        }
        if fidelity == Fidelity::Memory && !self.can_restore_memory() {
            return Err(Status::failed_precondition(format!(
                "worker {} cannot restore memory (no CRIU ≥ 4.2); restore at FIDELITY_ROOTFS",
                self.ident.id
            )));
        }
        // Lazy when this worker has a page source, the template does not ask for eager
        // restores, and every memory image carries chunk digests (generations written before
        // them restore eagerly).
        let lazy = match &self.page_source {
            Some(command)
                if fidelity == Fidelity::Memory
                    && memory_restore == MemoryRestore::Lazy
                    && self.runtime.capabilities().can_restore_lazily
                    && lazy_restorable(&manifest) =>
            {
                Some(command.clone())
            }
            _ => None,
        };
        // A generation downloaded for a lazy restore holds only part of its memory (the rest is
        // in the durable store): it cannot be restored eagerly. The node then fetches it whole.
        let partial = ate_snapshot::durable_source(gen_dir)
            .map_err(|e| snapshot_status(&format!("generation {}", gen_dir.display()), e))?;
        if partial.is_some() && fidelity == Fidelity::Memory && lazy.is_none() {
            return Err(Status::failed_precondition(format!(
                "generation {} holds only part of its memory (the rest is in the durable store) and worker {} restores memory eagerly; fetch the whole generation",
                gen_dir.display(),
                self.ident.id
            )));
        }
        // The files' checksums are checked while the sandbox is built from them (hashing a
        // 50 MiB generation takes ~35 ms, a third of a restore): the restored processes sit in
        // a netns with no way out and get no ingress until this returns, and a mismatch fails
        // the start (the caller discards the sandbox and everything extracted), reported as the
        // checksum error whatever the restore itself made of the damaged files. A lazy restore
        // checks here only the files CRIU reads itself and the chunks of the memory images that
        // hold pages the restorer loads; the page source checks every other chunk as it reads it.
        let verify = async {
            let checked = if lazy.is_some() {
                verify_for_lazy_restore(gen_dir, &manifest).await
            } else {
                ate_snapshot::verify_files(gen_dir, &manifest).await
            };
            (checked, begun.elapsed())
        };
        let build = async {
            if fidelity != Fidelity::Volumes && manifest.has_rootfs() {
                ate_snapshot::extract_rootfs(gen_dir, &sandbox.upper_dir())
                    .await
                    .map_err(|e| snapshot_status("extract rootfs", e))?;
            }
            for c in &spec.sidecars {
                // A container the generation does not hold (template change) starts afresh.
                if fidelity != Fidelity::Volumes && manifest.has_container_rootfs(&c.name) {
                    ate_snapshot::extract_container_rootfs(
                        gen_dir,
                        &c.name,
                        &sandbox.container_upper_dir(&c.name),
                    )
                    .await
                    .map_err(|e| snapshot_status(&format!("extract rootfs of {}", c.name), e))?;
                }
            }
            let archived = manifest.volumes();
            for v in &spec.volumes {
                // A volume the generation does not hold (template change) starts empty.
                if archived.contains(&v.name) {
                    ate_snapshot::extract_volume(gen_dir, &v.name, &sandbox.volume_dir(&v.name))
                        .await
                        .map_err(|e| snapshot_status(&format!("extract volume {}", v.name), e))?;
                }
            }
            let extracted = begun.elapsed();
            // Egress (nftables redirect in the actor netns to the worker's egress listener) is
            // set up by `start` right after this returns: the runtime creates the netns.
            let mut page_source = None;
            let started = match fidelity {
                Fidelity::Memory => match &lazy {
                    Some(command) => {
                        let (started, source) = self
                            .runtime
                            .restore_lazily(sandbox, spec, gen_dir, command)
                            .await
                            .map_err(|e| sandbox_status("lazy memory restore", e))?;
                        page_source = Some(source);
                        started
                    }
                    None => self
                        .runtime
                        .restore(sandbox, spec, &gen_dir.join(ate_snapshot::CRIU_DIR))
                        .await
                        .map_err(|e| sandbox_status("memory restore", e))?,
                },
                Fidelity::Rootfs => self
                    .runtime
                    .run(sandbox, spec, RunMode::KeepRootfs)
                    .await
                    .map_err(|e| sandbox_status("rootfs restart", e))?,
                Fidelity::Volumes => self
                    .runtime
                    .run(sandbox, spec, RunMode::FreshRootfs)
                    .await
                    .map_err(|e| sandbox_status("volumes restart", e))?,
            };
            Ok::<_, Status>((started, extracted, page_source))
        };
        let ((checked, verified), built) = tokio::join!(verify, build);
        // On a failed check a page source must not be released before its sandbox is gone:
        // stop the sandbox here, then drop the handle (the caller removes the rest).
        if let Err(e) = checked {
            if let Ok((_, _, Some(source))) = &built {
                source.kill();
                if let Err(stop) = self.runtime.stop(sandbox).await {
                    tracing::warn!(container = %sandbox.container_id(), error = %stop, "stop after a failed generation check");
                }
            }
            drop(built);
            return Err(snapshot_status(
                &format!("generation {}", gen_dir.display()),
                e,
            ));
        }
        let (started, extracted, page_source) = built?;
        crate::metrics::start_phase("restore", "verify", verified);
        crate::metrics::start_phase("restore", "extract", extracted);
        crate::metrics::start_phase("restore", "runtime", begun.elapsed() - extracted);
        tracing::debug!(
            actor = %key_of(&sandbox.atespace, &sandbox.name),
            fidelity = ?fidelity,
            verify_ms = verified.as_millis() as u64,
            extract_ms = extracted.as_millis() as u64,
            runtime_ms = (begun.elapsed() - extracted).as_millis() as u64,
            lazy = page_source.is_some(),
            "generation restored"
        );
        Ok((started.pid, page_source))
    }

    /// The wakeup probe of a sandbox just started, given up as soon as the container's processes
    /// have all exited: a command that could not be executed, or a process that dies at start,
    /// fails the start at once with the reason (and the log lines of this start) instead of after
    /// the probe's whole timeout with only "did not answer".
    async fn wait_ready(
        &self,
        sandbox: &ActorSandbox,
        spec: &TemplateSpec,
        sandbox_spec: &SandboxSpec,
        log_from: u64,
        page_source: Option<&PageSource>,
    ) -> Result<(), Status> {
        let probe = self.wait_probe(sandbox, spec);
        tokio::pin!(probe);
        let source_failed = async {
            match page_source {
                Some(ps) => ps.failed().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(source_failed);
        loop {
            tokio::select! {
                ready = &mut probe => return ready,
                // The restored processes wait on pages that will never come: fail the start
                // (the caller removes the sandbox; the node checks the generation).
                why = &mut source_failed => {
                    return Err(Status::failed_precondition(format!(
                        "lazy memory restore failed: {why}"
                    )));
                }
                () = tokio::time::sleep(START_EXIT_CHECK) => {}
            }
            match self.runtime.exited(sandbox).await {
                Ok(Some(exit)) => {
                    return Err(self
                        .exited_at_start(sandbox, sandbox_spec, &exit, log_from)
                        .await);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(container = %sandbox.container_id(), error = %e, "exit check during the wakeup probe")
                }
            }
        }
    }

    /// Why a sandbox's processes ended before its wakeup probe passed: an exec failure names the
    /// command and the kernel's reason; any other exit gives the code and the last log lines.
    async fn exited_at_start(
        &self,
        sandbox: &ActorSandbox,
        sandbox_spec: &SandboxSpec,
        exit: &ExitInfo,
        log_from: u64,
    ) -> Status {
        // Its last words may still be in the log relay's pipe.
        self.runtime
            .output_flushed(sandbox, Duration::from_millis(500))
            .await;
        let log = log_tail_from(&sandbox.log_path(), log_from, LOG_TAIL_LINES).await;
        let args = runc::process_args(sandbox_spec);
        let code = exit.code.map_or("unknown".to_string(), |c| c.to_string());
        tracing::warn!(container = %sandbox.container_id(), status = %exit.status, code = %code, "container exited before its wakeup probe passed");
        if let Some(reason) = exec_failed_after_start(&log, exit.code, &args) {
            return sandbox_status(
                "start",
                SandboxError::Command {
                    command: runc::render_args(&args),
                    status: runc::EXEC_FAILED.to_string(),
                    stderr: format!(
                        "{reason} (the container exited with code {code} before its wakeup probe passed)"
                    ),
                },
            );
        }
        // The last line first (a client sees only the first line of a crash reason), then the
        // tail of what this start wrote.
        let last: String = log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or("it wrote nothing to its log".to_string(), |l| {
                l.trim().chars().take(200).collect()
            });
        // With sidecars the sandbox's process is ate-init; its last line names the container.
        let what = if sandbox_spec.sidecars.is_empty() {
            format!("`{}`", runc::render_args(&args))
        } else {
            "the actor's containers".to_string()
        };
        Status::failed_precondition(format!(
            "start: {what} exited (code {code}) before its wakeup probe passed: {last}\n\
             --- last log lines ---\n{log}"
        ))
    }

    /// Every container's wakeup probe, at once; the first container without one gets a TCP
    /// connect to its port (80), a sidecar without one a TCP connect to its first declared port
    /// (or nothing). With sidecars, a failure names the container.
    async fn wait_probe(&self, sandbox: &ActorSandbox, spec: &TemplateSpec) -> Result<(), Status> {
        let netns = sandbox.netns();
        let several = spec.containers.len() > 1;
        let probes = spec.containers.iter().enumerate().map(|(i, c)| {
            let netns = netns.clone();
            async move {
                let result = match &c.wakeup_probe {
                    Some(p) => http_probe(&netns, p).await,
                    None if i == 0 => tcp_probe(&netns, 80).await,
                    None => match c.ports.first() {
                        Some(port) => tcp_probe(&netns, *port).await,
                        None => Ok(()),
                    },
                };
                result.map_err(|e| {
                    if several {
                        Status::failed_precondition(format!("container {:?}: {e}", c.name))
                    } else {
                        Status::failed_precondition(e)
                    }
                })
            }
        });
        futures::future::try_join_all(probes).await.map(|_| ())
    }

    /// Stops the sandbox and removes the actor's working dirs (egress first: its listener holds
    /// the netns the runtime deletes).
    async fn discard(&self, sandbox: &ActorSandbox) -> Result<(), Status> {
        self.egress
            .stop(&key_of(&sandbox.atespace, &sandbox.name))
            .await;
        self.runtime.stop(sandbox).await.map_err(|e| {
            Status::internal(format!("stop sandbox {}: {e}", sandbox.container_id()))
        })?;
        remove_dir_all(&sandbox.dir).await
    }

    async fn discard_quietly(&self, sandbox: &ActorSandbox) {
        if let Err(e) = self.discard(sandbox).await {
            tracing::warn!(actor = %key_of(&sandbox.atespace, &sandbox.name), error = %e.message(), "cleanup after a failed start");
        }
    }

    /// Ingress off and every tunnel of `key` closed (waits for them to go, bounded); egress off
    /// too, its connections reset (a dump cannot take established TCP).
    async fn ingress_off(&self, key: &str) -> Option<NetnsDialer> {
        self.egress.stop(key).await;
        let a = self.tunnels.deactivate(key)?;
        if !a.wait_closed(QUIESCE_TIMEOUT).await {
            tracing::warn!(actor = %key, open = a.open_tunnels(), "tunnels still open after ingress off");
        }
        Some(a.dialer().clone())
    }

    // ------------------------------------------------------------------ Checkpoint

    pub async fn checkpoint(
        &self,
        req: v1::WorkerCheckpointRequest,
    ) -> Result<v1::WorkerCheckpointReply, Status> {
        let (atespace, name) = self.check_workload(req.workload.as_ref())?;
        if req.generation_dir.is_empty() {
            return Err(Status::invalid_argument("generation_dir missing"));
        }
        let gen_dir = PathBuf::from(&req.generation_dir);
        if !gen_dir.is_absolute() {
            return Err(Status::invalid_argument("generation_dir must be absolute"));
        }
        let requested = fidelity_from_wire(req.fidelity)?;
        let asked_activation = req.workload.as_ref().map_or(0, |w| w.activation);
        let key = key_of(&atespace, &name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;

        let entry = self.table().actors.get(&key).cloned();
        if let Some(e) = &entry
            && asked_activation != 0
            && e.activation != asked_activation
        {
            return Err(Status::failed_precondition(format!(
                "worker {} holds activation {} of {key}, not the {asked_activation} the checkpoint names",
                self.ident.id, e.activation
            )));
        }
        let Some(entry) = entry else {
            // A retried call whose first attempt finished: answer from the sealed generation.
            if ate_snapshot::is_sealed(&gen_dir) {
                let m = ate_snapshot::verify(&gen_dir)
                    .await
                    .map_err(|e| snapshot_status("sealed generation", e))?;
                if m.atespace == atespace && m.name == name {
                    return Ok(self.checkpoint_reply(&m));
                }
            }
            return Err(Status::failed_precondition(format!(
                "actor {key} is not running on worker {}",
                self.ident.id
            )));
        };
        if dir_has_entries(&gen_dir).await? {
            return Err(Status::failed_precondition(format!(
                "generation_dir {} exists and is not empty",
                gen_dir.display()
            )));
        }
        // A dump reads memory through the page tables: pages a lazy restore has not placed yet
        // would be missing from it. Wait until every page is in (the background push takes
        // about a second per GiB here).
        if let Some(source) = &entry.page_source {
            match tokio::time::timeout(LAZY_COMPLETE_WAIT, source.finished()).await {
                Ok(Outcome::Done(_)) => {}
                Ok(Outcome::Failed(why)) => {
                    return Err(Status::failed_precondition(format!(
                        "actor {key} cannot be checkpointed: its lazy memory restore failed: {why}"
                    )));
                }
                Ok(Outcome::Running) | Err(_) => {
                    return Err(Status::unavailable(format!(
                        "actor {key} is still receiving its memory from a lazy restore after {LAZY_COMPLETE_WAIT:?}; suspend it again later"
                    )));
                }
            }
        }
        // The adoption record stays while the sandbox is frozen for the checkpoint: a worker
        // restarted in the middle thaws it and takes it back (the checkpoint was interrupted;
        // nothing may be lost). It goes once the sandbox is only a cache or gone.
        let asked = requested.unwrap_or(entry.spec.fidelity);
        let keep_frozen = asked == Fidelity::Memory && self.keeps_frozen();
        // Where the runtime can freeze, the sandbox is frozen (not stopped) while its generation
        // is written, so a generation that cannot be written (disk full) costs nothing: the
        // sandbox thaws and serves on. Only a sealed generation lets it go.
        let can_freeze = self.runtime.capabilities().can_keep_frozen;
        let sandbox = entry.sandbox.clone();
        let begun = Instant::now();

        // Requests in flight finish first (new ones are refused with 421: the router parks them
        // and resumes the actor after the suspend); then everything left is cut.
        let grace = match req.grace_ms {
            0 => self.suspend_grace,
            ms => Duration::from_millis(u64::from(ms)),
        };
        if let Some(a) = self.tunnels.get(&key) {
            let left = a.drain(grace).await;
            if left > 0 {
                tracing::info!(actor = %key, open = left, grace_ms = grace.as_millis() as u64, "requests still in flight after the suspend grace; cutting them");
            }
        }
        let dialer = self.ingress_off(&key).await;
        if let Some(pid) = entry.pid {
            // Connections between an actor's containers stay: CRIU keeps them (tcp-established).
            let internal_ok = entry.spec.containers.len() > 1;
            wait_tcp_quiet(pid, QUIESCE_TIMEOUT, internal_ok).await;
        }
        let quiesced = begun.elapsed();

        let mut fidelity = asked;
        let mut reason = String::new();
        let mut dumped = false;
        let mut no_space: Option<String> = None;
        if asked == Fidelity::Memory {
            if !self.can_restore_memory() {
                reason = "memory dump unavailable on this worker (no CRIU ≥ 4.2); captured FIDELITY_ROOTFS".to_string();
            } else if self.faults.criu_dump_fails() {
                reason = "memory dump failed: injected fault (ATE_FAULT_CRIU_DUMP=fail); captured FIDELITY_ROOTFS".to_string();
            } else {
                let criu = gen_dir.join(ate_snapshot::CRIU_DIR);
                let dump = if can_freeze {
                    self.runtime.checkpoint_frozen(&sandbox, &criu).await
                } else {
                    self.runtime.checkpoint(&sandbox, &criu).await
                };
                match dump {
                    Ok(stats) => {
                        dumped = true;
                        tracing::info!(actor = %key, dump_ms = stats.dump.as_millis() as u64, image_bytes = stats.image_bytes, "memory dumped");
                        carry_working_set(&sandbox, &criu).await;
                    }
                    Err(e) => {
                        let full = e.to_string();
                        let text = crate::error::tail(&full, 1500);
                        // A partial image must not be mistaken for a dump.
                        let _ = tokio::fs::remove_dir_all(&criu).await;
                        if full.contains("No space left on device") {
                            // Not a limit of CRIU but of the disk: a ROOTFS generation would
                            // throw the memory away for a passing condition. Fail instead; the
                            // actor runs on (below).
                            no_space = Some(format!(
                                "memory dump: no space left on device for {}",
                                gen_dir.display()
                            ));
                        } else {
                            reason =
                                format!("memory dump failed, captured FIDELITY_ROOTFS: {text}");
                        }
                    }
                }
            }
            if !dumped && no_space.is_none() {
                fidelity = Fidelity::Rootfs;
                tracing::warn!(actor = %key, %reason, "falling back to ROOTFS fidelity");
            }
        }
        // A successful dump already froze (or stopped) the sandbox; otherwise it is frozen now,
        // or stopped where the runtime cannot freeze. The files stay for archiving.
        let paused = if dumped {
            can_freeze
        } else if can_freeze {
            match self.runtime.freeze(&sandbox).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(actor = %key, error = %e, "cannot freeze for the checkpoint; stopping instead");
                    false
                }
            }
        } else {
            false
        };
        let stopped = if dumped || paused {
            Ok(())
        } else {
            self.runtime.stop(&sandbox).await
        };
        let stopped_at = begun.elapsed();
        let result = match stopped {
            Err(e) => Err(Status::internal(format!(
                "stop sandbox {} for checkpoint: {e}",
                sandbox.container_id()
            ))),
            Ok(()) if no_space.is_some() => Err(Status::resource_exhausted(
                no_space.clone().unwrap_or_default(),
            )),
            Ok(()) => {
                let meta = ate_snapshot::GenerationMeta {
                    atespace: atespace.clone(),
                    name: name.clone(),
                    generation: req.generation,
                    uuid: req.uuid.clone(),
                    fidelity,
                    template: entry.template.clone(),
                    sandbox_class: self.sandbox_class(),
                    node: req.node.clone(),
                    boot_id: req.boot_id.clone(),
                    created_unix_ms: now_ms(),
                    reason: reason.clone(),
                };
                let upper = sandbox.upper_dir();
                let upper = (fidelity != Fidelity::Volumes).then_some(upper.as_path());
                let volumes: Vec<(String, PathBuf)> = entry
                    .spec
                    .volumes
                    .iter()
                    .map(|v| (v.name.clone(), sandbox.volume_dir(&v.name)))
                    .collect();
                let sidecar_uppers: Vec<(String, PathBuf)> = entry
                    .spec
                    .containers
                    .iter()
                    .skip(1)
                    .map(|c| (c.name.clone(), sandbox.container_upper_dir(&c.name)))
                    .collect();
                ate_snapshot::seal_actor_generation(
                    &gen_dir,
                    meta,
                    upper,
                    &sidecar_uppers,
                    &volumes,
                )
                .await
                .map_err(|e| Status::internal(format!("seal {}: {e}", gen_dir.display())))
            }
        };
        let sealed_at = begun.elapsed();
        if let Err(e) = &result {
            // Nothing half written may look like a generation.
            if let Err(rm) = tokio::fs::remove_dir_all(&gen_dir).await
                && rm.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(actor = %key, dir = %gen_dir.display(), error = %rm, "cannot remove a partial generation");
            }
            if paused {
                return match self
                    .resume_after_failed_checkpoint(&key, &entry, dialer, e)
                    .await
                {
                    Ok(()) => Err(Status::aborted(format!(
                        "suspend of {key} failed, nothing was written and the actor runs on: {}",
                        e.message()
                    ))),
                    Err(again) => {
                        self.table().actors.remove(&key);
                        self.discard_quietly(&sandbox).await;
                        Err(Status::internal(format!(
                            "checkpoint of {key} failed ({}) and the actor could not run on: {}",
                            e.message(),
                            again.message()
                        )))
                    }
                };
            }
        }
        // Checkpointed or not, the actor no longer runs here. A sealed memory dump of a frozen
        // sandbox leaves the sandbox frozen in place as a cache of that generation.
        let entry = self.table().actors.remove(&key);
        let kept = keep_frozen && dumped && result.is_ok();
        match entry {
            Some(entry) if kept => {
                remove_file_quietly(&entry.sandbox.dir.join(ADOPTION_FILE)).await;
                self.table().frozen.insert(
                    key.clone(),
                    Frozen {
                        entry,
                        gen_dir: gen_dir.clone(),
                        since: Instant::now(),
                        dialer,
                    },
                );
            }
            _ => {
                if let Err(e) = self.discard(&sandbox).await {
                    tracing::warn!(actor = %key, error = %e.message(), "cleanup after checkpoint");
                }
            }
        }
        let manifest = result?;
        crate::metrics::checkpoint_phase("quiesce", quiesced);
        crate::metrics::checkpoint_phase("dump_or_stop", stopped_at - quiesced);
        crate::metrics::checkpoint_phase("seal", sealed_at - stopped_at);
        tracing::info!(
            actor = %key,
            fidelity = %manifest.fidelity,
            size = manifest.total_size(),
            quiesce_ms = quiesced.as_millis() as u64,
            dump_or_stop_ms = (stopped_at - quiesced).as_millis() as u64,
            seal_ms = (sealed_at - stopped_at).as_millis() as u64,
            total_ms = begun.elapsed().as_millis() as u64,
            kept_frozen = kept,
            "generation sealed"
        );
        drop(_guard);
        if kept {
            self.trim_frozen().await;
        }
        let mut reply = self.checkpoint_reply(&manifest);
        reply.kept_frozen = kept && self.table().frozen.contains_key(&key);
        Ok(reply)
    }

    /// After a checkpoint whose generation could not be written: the frozen sandbox thaws, its
    /// egress proxy and ingress come back, and it is adoptable again.
    async fn resume_after_failed_checkpoint(
        &self,
        key: &str,
        entry: &Entry,
        dialer: Option<NetnsDialer>,
        why: &Status,
    ) -> Result<(), Status> {
        let sandbox = &entry.sandbox;
        self.runtime
            .thaw(sandbox)
            .await
            .map_err(|e| sandbox_status("thaw after a failed checkpoint", e))?;
        self.egress
            .restart(key, &sandbox.netns(), &entry.spec.egress)
            .await
            .map_err(|e| Status::internal(format!("egress for {key}: {e}")))?;
        let dialer = match dialer {
            Some(d) => d,
            None => NetnsDialer::new(&sandbox.netns()).await.map_err(|e| {
                Status::internal(format!("socket factory for netns {}: {e}", sandbox.netns()))
            })?,
        };
        let record = v1::Workload {
            actor: Some(v1::ObjectRef {
                atespace: sandbox.atespace.clone(),
                name: sandbox.name.clone(),
            }),
            uid: sandbox.uid.clone(),
            template: entry.template.clone(),
            spec: Some(ate_proto::spec_to_wire(&entry.spec)),
            worker_id: self.ident.id.clone(),
            activation: entry.activation,
        };
        self.write_adoption(sandbox, &record, entry.pid, None).await;
        self.tunnels.activate(key, entry.activation, dialer);
        tracing::warn!(actor = %key, error = %why.message(), "checkpoint failed; nothing written, the actor runs on");
        Ok(())
    }

    fn checkpoint_reply(&self, m: &ate_snapshot::Manifest) -> v1::WorkerCheckpointReply {
        v1::WorkerCheckpointReply {
            epoch: self.ident.epoch,
            fidelity: m.fidelity.wire(),
            reason: m.reason.clone(),
            size_bytes: m.total_size(),
            checksum: m.checksum(),
            kept_frozen: false,
        }
    }

    // ------------------------------------------------------------------ Stop

    pub async fn stop(&self, req: v1::WorkerStopRequest) -> Result<v1::WorkerStopReply, Status> {
        let (atespace, name) = validate_ref(req.actor.as_ref())?;
        let key = key_of(&atespace, &name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;
        if req.activation_at_most != 0 {
            let held = self.table().actors.get(&key).map(|e| e.activation);
            if let Some(held) = held
                && held > req.activation_at_most
            {
                // A newer activation started here since the caller looked: not its business.
                return Ok(v1::WorkerStopReply {
                    epoch: self.ident.epoch,
                });
            }
        }
        self.ingress_off(&key).await;
        self.table().adopted.remove(&key);
        let entry = self.table().actors.remove(&key);
        let frozen = self.table().frozen.remove(&key).map(|f| f.entry);
        let sandbox = entry
            .or(frozen)
            .map(|e| e.sandbox)
            .unwrap_or_else(|| self.sandbox_for(&atespace, &name, ""));
        self.discard(&sandbox).await?;
        self.table()
            .exits
            .retain(|x| !(x.atespace == atespace && x.name == name));
        Ok(v1::WorkerStopReply {
            epoch: self.ident.epoch,
        })
    }

    // ------------------------------------------------------------------ Activity

    pub fn activity(&self) -> v1::WorkerActivityReply {
        self.last_poll_ms.store(now_ms(), Ordering::Release);
        let mut table = self.table();
        let mut actors: Vec<v1::ActorActivity> = table
            .actors
            .iter()
            .map(|(key, e)| {
                // Ingress off (a checkpoint, stop or start is deciding the actor's fate): not
                // idle. A last activity of 0 here made the node ask for an idle suspend of
                // every actor in the middle of a suspend.
                let (open, last) = match self.tunnels.get(key) {
                    Some(a) => (a.open_tunnels(), a.last_activity_unix_ms()),
                    None => (0, now_ms()),
                };
                // Outbound connections count as activity too: open ones keep the actor busy.
                let out = self.egress.activity(key);
                let open =
                    open.saturating_add(u32::try_from(out.open_connections).unwrap_or(u32::MAX));
                let last = last.max(out.last_activity_unix_ms);
                v1::ActorActivity {
                    actor: Some(v1::ObjectRef {
                        atespace: e.sandbox.atespace.clone(),
                        name: e.sandbox.name.clone(),
                    }),
                    open_streams: open,
                    last_activity_unix_ms: last,
                    exited: false,
                    exit_code: 0,
                    last_log_lines: String::new(),
                    idle_timeout_seconds: e.spec.idle_timeout_seconds,
                    activation: e.activation,
                    crash_reason: String::new(),
                }
            })
            .collect();
        // Exits are reported once.
        for x in table.exits.drain(..) {
            actors.push(v1::ActorActivity {
                actor: Some(v1::ObjectRef {
                    atespace: x.atespace,
                    name: x.name,
                }),
                open_streams: 0,
                last_activity_unix_ms: x.at_ms,
                exited: true,
                exit_code: x.exit_code,
                last_log_lines: x.log,
                idle_timeout_seconds: x.idle_timeout_seconds,
                activation: 0,
                crash_reason: x.crash,
            });
        }
        actors.sort_by(|a, b| {
            let k = |x: &v1::ActorActivity| {
                x.actor
                    .as_ref()
                    .map(|r| (r.atespace.clone(), r.name.clone()))
            };
            k(a).cmp(&k(b))
        });
        v1::WorkerActivityReply {
            epoch: self.ident.epoch,
            actors,
            draining: self.draining(),
        }
    }

    /// One pass of the exit watcher: an actor whose processes all exited is deactivated, its
    /// sandbox removed, and its exit queued for Activity.
    pub async fn reap_exited(&self) {
        self.trim_frozen().await;
        self.discard_superseded().await;
        self.collect_exits().await;
    }

    /// Discards copies that atunnel found superseded by a newer activation (a CONNECT carried a
    /// newer token): the actor runs elsewhere now, or is about to start again here.
    pub async fn discard_superseded(&self) {
        for (key, token) in self.tunnels.take_superseded() {
            let lock = self.lock_for(&key);
            let _guard = lock.lock().await;
            let entry = {
                let mut t = self.table();
                match t.actors.get(&key) {
                    Some(e) if e.activation == token => t.actors.remove(&key),
                    _ => None,
                }
            };
            if let Some(e) = entry {
                tracing::warn!(actor = %key, activation = token, "discarding a superseded copy");
                self.discard_quietly(&e.sandbox).await;
            }
        }
    }

    /// The node renewed this worker's lease: atunnel admits traffic for `valid_for` more, and
    /// re-adopted actors (reconciled with the api by now) get their ingress back.
    pub fn renew_lease(&self, valid_for: Duration) {
        self.tunnels.renew_lease(valid_for);
        let adopted: Vec<(String, NetnsDialer)> = self.table().adopted.drain().collect();
        for (key, dialer) in adopted {
            let activation = self.table().actors.get(&key).map(|e| e.activation);
            if let Some(activation) = activation {
                self.tunnels.activate(&key, activation, dialer);
                tracing::info!(actor = %key, activation, "re-adopted actor; ingress on");
            }
        }
    }

    /// Records what a restarted worker needs to re-adopt the actor's sandbox. Best effort: a
    /// missing record only means the sandbox would be discarded (not adopted) after a crash.
    async fn write_adoption(
        &self,
        sandbox: &ActorSandbox,
        workload: &v1::Workload,
        pid: Option<u32>,
        page_source_pid: Option<u32>,
    ) {
        let record = v1::AdoptionRecord {
            workload: Some(workload.clone()),
            pid: pid.unwrap_or(0),
            page_source_pid: page_source_pid.unwrap_or(0),
        };
        let path = sandbox.dir.join(ADOPTION_FILE);
        let tmp = sandbox.dir.join(format!(".{ADOPTION_FILE}.tmp"));
        let bytes = prost::Message::encode_to_vec(&record);
        let written = async {
            tokio::fs::write(&tmp, &bytes).await?;
            tokio::fs::rename(&tmp, &path).await
        }
        .await;
        if let Err(e) = written {
            tracing::warn!(actor = %key_of(&sandbox.atespace, &sandbox.name), error = %e, "cannot write the adoption record; a worker restart would discard this sandbox");
        }
    }

    /// The exit half of [`Worker::reap_exited`] (what a SIGCHLD asks for).
    pub async fn collect_exits(&self) {
        let keys: Vec<String> = self.table().actors.keys().cloned().collect();
        for key in keys {
            let lock = self.lock_for(&key);
            // Busy actors are in the middle of an operation that decides their fate itself.
            let Ok(_guard) = lock.try_lock() else {
                continue;
            };
            let Some(entry) = self.table().actors.get(&key).cloned() else {
                continue;
            };
            match entry.page_source.as_ref().map(|p| p.outcome()) {
                Some(Outcome::Failed(why)) => {
                    self.end_incomplete(&key, entry, why).await;
                    continue;
                }
                Some(Outcome::Done(summary)) => {
                    tracing::info!(actor = %key, %summary, "lazy restore: every page is in");
                    crate::metrics::lazy_restore_done(&summary);
                    if let Some(e) = self.table().actors.get_mut(&key) {
                        e.page_source = None;
                    }
                }
                Some(Outcome::Running) | None => {}
            }
            let exited = match self.runtime.exited(&entry.sandbox).await {
                Ok(Some(info)) => info,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(actor = %key, error = %e, "exit check");
                    continue;
                }
            };
            self.ingress_off(&key).await;
            // The last lines the actor wrote may still be in its log relay's pipe.
            self.runtime
                .output_flushed(&entry.sandbox, Duration::from_millis(500))
                .await;
            let log = log_tail(&entry.sandbox.log_path(), LOG_TAIL_LINES).await;
            let exit_code = exited.code.unwrap_or(-1);
            tracing::warn!(actor = %key, status = %exited.status, exit_code, "actor exited while active");
            self.table().actors.remove(&key);
            if let Err(e) = self.discard(&entry.sandbox).await {
                tracing::warn!(actor = %key, error = %e.message(), "cleanup after exit");
            }
            self.table().exits.push(ExitReport {
                atespace: entry.sandbox.atespace.clone(),
                name: entry.sandbox.name.clone(),
                idle_timeout_seconds: entry.spec.idle_timeout_seconds,
                at_ms: now_ms(),
                // -1: unknown (the init was not the worker's child; runc keeps no exit status).
                exit_code,
                log,
                crash: String::new(),
            });
        }
    }

    /// Ends an actor whose lazily restored memory cannot be completed (its page source failed:
    /// a damaged chunk, or it died): the processes wait on pages that will never come and must
    /// not run on. The sandbox is stopped before the page source's descriptors are released
    /// (dropping `entry` last), and the api is told to mark the actor CRASHED with `why`.
    async fn end_incomplete(&self, key: &str, entry: Entry, why: String) {
        tracing::error!(actor = %key, error = %why, "lazy restore failed; stopping the actor");
        crate::metrics::lazy_restore_failed();
        self.ingress_off(key).await;
        self.table().actors.remove(key);
        if let Err(e) = self.discard(&entry.sandbox).await {
            tracing::warn!(actor = %key, error = %e.message(), "cleanup after a failed lazy restore");
        }
        self.table().exits.push(ExitReport {
            atespace: entry.sandbox.atespace.clone(),
            name: entry.sandbox.name.clone(),
            idle_timeout_seconds: entry.spec.idle_timeout_seconds,
            at_ms: now_ms(),
            exit_code: -1,
            log: String::new(),
            crash: format!("lazy memory restore failed: {why}"),
        });
        drop(entry);
    }

    // ------------------------------------------------------------------ lifecycle

    /// Re-adopts the sandboxes an earlier process of this worker id left running (a crash or a
    /// kill): each actor dir whose adoption record names a running container is taken back
    /// into the table with its activation; ingress stays off until the node has reconciled it
    /// with the api and renewed the lease ([`Worker::renew_lease`]), or a start names it.
    /// Anything else left behind (a sandbox being dumped, frozen, half started) is removed.
    pub async fn adopt_leftovers(&self) {
        for (atespace, name) in self.leftover_actors() {
            let key = key_of(&atespace, &name);
            match self.adopt(&atespace, &name).await {
                Ok(activation) => {
                    tracing::info!(actor = %key, activation, "re-adopted a running sandbox from an earlier worker process");
                }
                Err(why) => {
                    tracing::info!(actor = %key, %why, "removing leftover actor from an earlier run");
                    let sandbox = self.sandbox_for(&atespace, &name, "");
                    self.discard_quietly(&sandbox).await;
                }
            }
        }
    }

    fn leftover_actors(&self) -> Vec<(String, String)> {
        actor_dirs(&self.actors_dir)
    }

    async fn adopt(&self, atespace: &str, name: &str) -> Result<u64, String> {
        let record = read_adoption(&self.actors_dir.join(atespace).join(name))?;
        let workload = record.workload.unwrap_or_default();
        let (ns, n) = validate_ref(workload.actor.as_ref()).map_err(|e| e.message().to_string())?;
        if ns != atespace || n != name {
            return Err(format!("adoption record names {ns}/{n}"));
        }
        let spec = workload
            .spec
            .as_ref()
            .ok_or("adoption record has no spec")
            .and_then(|w| ate_proto::spec_from_wire(w).map_err(|_| "adoption record spec invalid"))
            .map_err(str::to_string)?;
        let sandbox = self.sandbox_for(atespace, name, &workload.uid);
        if record.page_source_pid != 0 {
            wait_page_source(&sandbox, record.page_source_pid).await?;
        }
        match self.runtime.is_running(&sandbox).await {
            Ok(true) => {}
            // Frozen with its record still there: a checkpoint this worker's previous process
            // did not finish. The actor runs on.
            Ok(false) if matches!(self.runtime.is_paused(&sandbox).await, Ok(true)) => {
                self.runtime
                    .thaw(&sandbox)
                    .await
                    .map_err(|e| format!("thaw after an interrupted checkpoint: {e}"))?;
                tracing::warn!(actor = %key_of(atespace, name), "a checkpoint was interrupted by the worker's restart; the actor runs on");
            }
            Ok(false) => return Err("its container is not running".to_string()),
            Err(e) => return Err(format!("container state: {e}")),
        }
        let key = key_of(atespace, name);
        // The egress listener died with the old process; the netns keeps its redirect.
        self.egress
            .restart(&key, &sandbox.netns(), &spec.egress)
            .await
            .map_err(|e| format!("egress: {e}"))?;
        let dialer = match NetnsDialer::new(&sandbox.netns()).await {
            Ok(d) => d,
            Err(e) => {
                self.egress.stop(&key).await;
                return Err(format!("socket factory: {e}"));
            }
        };
        let activation = workload.activation;
        let mut t = self.table();
        t.actors.insert(
            key.clone(),
            Entry {
                sandbox,
                spec,
                template: workload.template.clone(),
                pid: (record.pid != 0).then_some(record.pid),
                activation,
                page_source: None,
            },
        );
        t.adopted.insert(key, dialer);
        Ok(activation)
    }

    /// Stops and removes every sandbox left under this worker's actors dir (no snapshot).
    pub async fn remove_leftovers(&self) {
        for (atespace, name) in self.leftover_actors() {
            tracing::info!(actor = %key_of(&atespace, &name), "removing a leftover sandbox");
            let sandbox = self.sandbox_for(&atespace, &name, "");
            self.discard_quietly(&sandbox).await;
        }
    }

    /// Marks the worker as stopping: starts are refused, and Activity tells the node, which
    /// asks the api to suspend every actor here. Returns when none is left or `timeout` passed.
    pub async fn drain(&self, timeout: Duration) {
        self.shutting_down.store(true, Ordering::Release);
        if !self.tunnels.is_leased() {
            return; // No node drives this worker: nobody could suspend its actors.
        }
        let n = self.table().actors.len();
        if n == 0 {
            return;
        }
        tracing::info!(
            actors = n,
            timeout_s = timeout.as_secs(),
            "stopping: asking for every actor to be suspended"
        );
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.table().actors.is_empty() {
                tracing::info!("every actor suspended");
                return;
            }
            // The node polls Activity twice a second: silence means no node is there to ask
            // the api for the suspends, and waiting longer would change nothing.
            let silent_ms = now_ms().saturating_sub(self.last_poll_ms.load(Ordering::Acquire));
            if silent_ms > NODE_SILENCE.as_millis() as i64 || !self.tunnels.lease_valid() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let left: Vec<String> = self.table().actors.keys().cloned().collect();
        tracing::warn!(
            ?left,
            "actors not suspended within the stop timeout; their sandboxes keep running for the next worker process to re-adopt"
        );
    }

    /// Shutdown after [`Worker::drain`]: frozen copies (caches of sealed generations) are
    /// dropped. Running sandboxes of a worker under a node's lease are left running, never
    /// killed without a snapshot: the next process of this worker re-adopts them. A worker no
    /// node ever leased (driven directly, as in tests) stops them.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        let keys: Vec<String> = if self.tunnels.is_leased() {
            for key in self.table().actors.keys() {
                self.tunnels.deactivate(key);
            }
            Vec::new()
        } else {
            self.table().actors.keys().cloned().collect()
        };
        // Several at a time: each stop is mostly waiting on runc and the kernel (~40 ms), and a
        // worker with hundreds of actors must be done well within its supervisor's grace period
        // (one by one, 256 actors took ~10 s and `ate up` killed the worker, leaking them).
        futures::stream::iter(keys)
            .for_each_concurrent(SHUTDOWN_PARALLELISM, |key| async move {
                let lock = self.lock_for(&key);
                let _guard = lock.lock().await;
                self.ingress_off(&key).await;
                let entry = self.table().actors.remove(&key);
                if let Some(e) = entry {
                    self.discard_quietly(&e.sandbox).await;
                }
            })
            .await;
        let frozen: Vec<Frozen> = self.table().frozen.drain().map(|(_, f)| f).collect();
        futures::stream::iter(frozen)
            .for_each_concurrent(SHUTDOWN_PARALLELISM, |f| async move {
                self.discard_quietly(&f.entry.sandbox).await;
            })
            .await;
    }
}

/// How many sandboxes under a worker's actors dir (`<state>/workers/<id>/actors`) still run:
/// those whose adoption record names an init that is alive (not a zombie) in the sandbox's own
/// cgroup. The node asks this about a worker whose process does not answer: while any runs, the
/// worker's actors may not be released (a restarted worker re-adopts them).
pub fn live_sandboxes(actors_dir: &Path) -> usize {
    actor_dirs(actors_dir)
        .into_iter()
        .filter(|(atespace, name)| sandbox_alive(actors_dir, atespace, name))
        .count()
}

/// Whether a sandbox of actor `atespace/name` still runs under a worker's actors dir (see
/// [`live_sandboxes`]).
pub fn sandbox_alive(actors_dir: &Path, atespace: &str, name: &str) -> bool {
    let dir = actors_dir.join(atespace).join(name);
    let short_id = ActorSandbox::new("", "", "", &dir).short_id();
    read_adoption(&dir).is_ok_and(|r| r.pid != 0 && init_alive(r.pid, &short_id))
}

/// `(atespace, name)` of every actor dir under an actors dir (`<atespace>/<name>`).
fn actor_dirs(actors_dir: &Path) -> Vec<(String, String)> {
    let Ok(spaces) = std::fs::read_dir(actors_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for space in spaces.flatten() {
        let Ok(names) = std::fs::read_dir(space.path()) else {
            continue;
        };
        let atespace = space.file_name().to_string_lossy().into_owned();
        for n in names.flatten() {
            out.push((
                atespace.clone(),
                n.file_name().to_string_lossy().into_owned(),
            ));
        }
    }
    out
}

/// The adoption record next to an actor's sandbox, or why there is none to use.
fn read_adoption(dir: &Path) -> Result<v1::AdoptionRecord, String> {
    let bytes =
        std::fs::read(dir.join(ADOPTION_FILE)).map_err(|e| format!("no adoption record: {e}"))?;
    prost::Message::decode(bytes.as_slice()).map_err(|e| format!("adoption record unreadable: {e}"))
}

/// The process exists, is not a zombie, and sits in the sandbox's cgroup (not a reused pid).
fn init_alive(pid: u32, short_id: &str) -> bool {
    process_running(pid)
        && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| c.contains(short_id))
}

/// The process exists and is not a zombie (its state in `/proc/<pid>/stat` is not `Z`).
pub fn process_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

/// Whether the host's MemAvailable is below `min_percent` of its memory.
/// A sandbox left by an earlier worker process was restored lazily: adopt it only once its page
/// source (which outlives the worker) has placed every page. A page source that died first, or
/// is not done in time, leaves memory that cannot be trusted: the sandbox is removed.
async fn wait_page_source(sandbox: &ActorSandbox, pid: u32) -> Result<(), String> {
    let status_file = sandbox
        .dir
        .join("criu-restore")
        .join(crate::lazy::STATUS_FILE);
    let begun = Instant::now();
    loop {
        let status = tokio::fs::read_to_string(&status_file)
            .await
            .unwrap_or_default();
        if status.trim() == "done" {
            return Ok(());
        }
        if !status.is_empty() {
            return Err(format!("its lazy restore failed: {}", status.trim()));
        }
        if !process_running(pid) {
            return Err(format!(
                "the page source of its lazy restore (pid {pid}) ended without placing every page"
            ));
        }
        if begun.elapsed() > ADOPT_PAGE_SOURCE_WAIT {
            return Err(format!(
                "the page source of its lazy restore (pid {pid}) is not done after {ADOPT_PAGE_SOURCE_WAIT:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every memory image of the generation carries chunk digests (a page source can check each
/// chunk as it reads it).
fn lazy_restorable(manifest: &ate_snapshot::Manifest) -> bool {
    let mut pages = manifest
        .files
        .iter()
        .filter(|f| ate_snapshot::is_memory_pages_file(&f.path))
        .peekable();
    pages.peek().is_some() && pages.all(|f| f.size == 0 || f.chunk_count() > 0)
}

/// What a lazy restore checks before the actor gets ingress: every file but the memory images
/// in full, and of the memory images the chunks holding pages CRIU's restorer loads itself
/// (stacks and other pages it does not leave to the page source).
async fn verify_for_lazy_restore(
    gen_dir: &Path,
    manifest: &ate_snapshot::Manifest,
) -> ate_snapshot::Result<()> {
    ate_snapshot::verify_files_except_chunked(gen_dir, manifest).await?;
    let criu_dir = gen_dir.join(ate_snapshot::CRIU_DIR);
    let dir = gen_dir.to_path_buf();
    let m = manifest.clone();
    tokio::task::spawn_blocking(move || {
        let which = crate::lazy::images::eager_chunk_files(&criu_dir)
            .map_err(|e| ate_snapshot::Error::InvalidInput(format!("memory images: {e}")))?;
        ate_snapshot::verify_chunks(&dir, &m, &which)
    })
    .await
    .map_err(|e| ate_snapshot::Error::InvalidInput(format!("chunk check task: {e}")))?
}

/// Copies the working set the page source recorded at the actor's last lazy restore into the
/// new dump (`criu/working-set.json`), so the next restore brings that memory in first. Best
/// effort: without it the next restore only does no prefetch.
async fn carry_working_set(sandbox: &ActorSandbox, criu: &Path) {
    let file = crate::lazy::working_set::FILE;
    let recorded = sandbox.dir.join("criu-restore").join(file);
    match tokio::fs::copy(&recorded, criu.join(file)).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(actor = %key_of(&sandbox.atespace, &sandbox.name), error = %e, "cannot carry the working set into the new generation; its restore will not prefetch");
        }
    }
}

fn memory_low(min_percent: u8) -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| crate::config::available_percent(&t))
        .is_some_and(|p| p < min_percent)
}

async fn remove_file_quietly(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %path.display(), error = %e, "cannot remove");
    }
}

async fn remove_dir_all(dir: &Path) -> Result<(), Status> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Status::internal(format!("remove {}: {e}", dir.display()))),
    }
}

async fn dir_has_entries(dir: &Path) -> Result<bool, Status> {
    match tokio::fs::read_dir(dir).await {
        Ok(mut rd) => Ok(rd
            .next_entry()
            .await
            .map_err(|e| Status::internal(format!("list {}: {e}", dir.display())))?
            .is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Status::internal(format!("list {}: {e}", dir.display()))),
    }
}

/// Waits until the actor's network namespace has no TCP socket other than listeners and
/// TIME_WAIT remnants (closed tunnels leave the actor's end in CLOSE_WAIT until it closes it;
/// CRIU refuses connected sockets without `--tcp-established`). Gives up silently after
/// `timeout`: the dump then reports what it found.
/// A wakeup probe: GET until 200 or its timeout.
async fn http_probe(netns: &str, p: &ate_core::template::WakeupProbe) -> Result<(), String> {
    let port = u16::try_from(p.http_get.port)
        .map_err(|_| format!("wakeup probe port {}", p.http_get.port))?;
    let secs = if p.timeout_seconds == 0 {
        DEFAULT_PROBE_TIMEOUT.as_secs()
    } else {
        u64::from(p.timeout_seconds)
    };
    let path = if p.http_get.path.is_empty() {
        "/".to_string()
    } else {
        p.http_get.path.clone()
    };
    probe::wait_ready(netns, port, &path, Duration::from_secs(secs))
        .await
        .map(|_| ())
        .map_err(|e| {
            let last = match e {
                SandboxError::ProbeTimeout { last, .. } => last,
                other => other.to_string(),
            };
            format!(
                "wakeup probe GET {path} on port {port} did not answer 200 within {secs}s (last: {last})"
            )
        })
}

/// Without an HTTP probe: a TCP connect to `port` until it succeeds or the default timeout.
async fn tcp_probe(netns: &str, port: u32) -> Result<(), String> {
    let port = u16::try_from(port).map_err(|_| format!("port {port}"))?;
    let deadline = Instant::now() + DEFAULT_PROBE_TIMEOUT;
    let addr = std::net::SocketAddr::new(ACTOR_IP.into(), port);
    let mut last = String::from("no attempt made");
    while Instant::now() < deadline {
        match connect_in_netns_timeout(netns, addr, Duration::from_secs(1)).await {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(probe::PROBE_INTERVAL).await;
    }
    Err(format!(
        "wakeup probe (TCP connect to port {port}, no HTTP probe in the template) did not succeed within {}s (last: {last})",
        DEFAULT_PROBE_TIMEOUT.as_secs()
    ))
}

async fn wait_tcp_quiet(pid: u32, timeout: Duration, ignore_loopback: bool) {
    let deadline = Instant::now() + timeout;
    loop {
        match busy_tcp_sockets(pid, ignore_loopback) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if Instant::now() >= deadline {
                    tracing::warn!(
                        pid,
                        sockets = n,
                        "actor still has TCP connections before the dump"
                    );
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Connected-ish TCP sockets in `pid`'s network namespace (`/proc/<pid>/net/tcp{,6}`); with
/// `ignore_loopback`, not those between two loopback addresses (inside the actor's netns, both
/// ends belong to the actor).
fn busy_tcp_sockets(pid: u32, ignore_loopback: bool) -> std::io::Result<usize> {
    const LISTEN: &str = "0A";
    const TIME_WAIT: &str = "06";
    let mut busy = 0;
    for file in ["tcp", "tcp6"] {
        let text = match std::fs::read_to_string(format!("/proc/{pid}/net/{file}")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file == "tcp6" => continue,
            Err(e) => return Err(e),
        };
        busy += text
            .lines()
            .skip(1)
            .filter(|l| {
                let fields: Vec<&str> = l.split_whitespace().take(4).collect();
                let [_, local, remote, state] = fields[..] else {
                    return false;
                };
                state != LISTEN
                    && state != TIME_WAIT
                    && !(ignore_loopback && is_loopback(local) && is_loopback(remote))
            })
            .count();
    }
    Ok(busy)
}

/// `/proc/net/tcp{,6}` address `HEX:PORT` on loopback: 127.0.0.0/8 (IPv4 in host byte order:
/// the first octet is the last hex pair), ::1, or ::ffff:127.x.y.z.
fn is_loopback(addr: &str) -> bool {
    let ip = addr.split(':').next().unwrap_or("");
    match ip.len() {
        8 => ip.ends_with("7F"),
        32 => {
            ip == "00000000000000000000000001000000"
                || (ip.starts_with("0000000000000000FFFF0000") && ip.ends_with("7F"))
        }
        _ => false,
    }
}

/// The kernel's reason when the container's init could not execute its command after the
/// container started (runc checks only that the file exists and is executable beforehand):
/// runc's init then prints `exec <path>: <reason>` as the last line and exits with code 1
/// (`exec format error`, or `no such file or directory` for a script or dynamically linked
/// binary whose interpreter is missing from the image).
fn exec_failed_after_start(log: &str, code: Option<i32>, args: &[String]) -> Option<String> {
    if code.is_some_and(|c| c != 1) {
        return None;
    }
    let command = args.first()?;
    let last = log.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    let (path, reason) = last.strip_prefix("exec ")?.split_once(": ")?;
    // runc resolves a bare name through PATH before it executes it.
    let same =
        path == command || (!command.contains('/') && path.ends_with(&format!("/{command}")));
    (same && !reason.is_empty()).then(|| reason.to_string())
}

/// The last `lines` lines of the actor log (reads at most the last 64 KiB).
async fn log_tail(path: &Path, lines: usize) -> String {
    log_tail_from(path, 0, lines).await
}

/// [`log_tail`] of what was written at or after byte `from`.
async fn log_tail_from(path: &Path, from: u64, lines: usize) -> String {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&path).ok()?;
        let len = f.metadata().ok()?.len();
        let start = len.saturating_sub(64 * 1024).max(from.min(len));
        f.seek(SeekFrom::Start(start)).ok()?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).ok()?;
        let text = String::from_utf8_lossy(&buf);
        // The relay's time stamps are not part of what the actor said.
        let all: Vec<&str> = text.lines().map(ate_core::log_line::strip).collect();
        let from = all.len().saturating_sub(lines);
        Some(all[from..].join("\n"))
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::exec_failed_after_start;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exec_failures_after_the_start_are_told_from_other_exits() {
        let script = "exec /app/server: no such file or directory\n";
        assert_eq!(
            exec_failed_after_start(script, Some(1), &args(&["/app/server", "-v"])).as_deref(),
            Some("no such file or directory")
        );
        // A bare name resolved through PATH; the code unknown (init not the worker's child).
        let format = "exec /usr/bin/app: exec format error";
        assert_eq!(
            exec_failed_after_start(format, None, &args(&["app"])).as_deref(),
            Some("exec format error")
        );
        // Another command's words, another exit code, or the program's own last line.
        assert_eq!(
            exec_failed_after_start(format, Some(1), &args(&["/app"])),
            None
        );
        assert_eq!(
            exec_failed_after_start(script, Some(2), &args(&["/app/server"])),
            None
        );
        assert_eq!(
            exec_failed_after_start("listening\npanic: boom\n", Some(1), &args(&["/app/server"])),
            None
        );
        assert_eq!(exec_failed_after_start("", Some(1), &[]), None);
    }
}
