//! The control plane's persistent state behind one [`Store`] trait, with an SQLite implementation
//! (embedded default: one file under the state dir, WAL) and a PostgreSQL one (production).
//!
//! Both implementations have the same semantics; the shared test suite runs against each.
//! Architecture invariant: every multi-row change that must be atomic (bind = capacity admission +
//! actor RESUMING; suspend finish = snapshot row + capacity release + actor SUSPENDED) happens in
//! one SQL transaction inside one trait method. Callers never compose transactions.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ate_core::{ActorRef, ActorState, DurableStatus, Fidelity, TemplateRef, TemplateSpec};

pub use async_trait::async_trait;

mod events;
mod postgres;
mod sqlite;
mod util;

pub use events::{ActorEvent, EventKind, EventPage, EventQuery};

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
pub use util::actor_lease_key;

/// Opens the store named by `url` and applies its migrations:
///
/// - `sqlite:<path>` / `sqlite://<path>` (the file and its directory are created if missing;
///   `sqlite::memory:` for a throw-away in-memory store) → [`SqliteStore`];
/// - `postgres://…` / `postgresql://…` → [`PostgresStore`].
///
/// Any other scheme is a `StoreError::Database("unsupported store URL …")`.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect(url).await?))
    } else {
        Err(StoreError::Database(format!(
            "unsupported store URL {url:?}: expected sqlite:<path> or postgres://…"
        )))
    }
}

/// Errors of the store. Each maps to one gRPC code in the api.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The named record does not exist (message names it, e.g. `actor "a/b" not found`).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The record exists but the operation is not allowed in its current shape
    /// (atespace still holds actors, actor not SUSPENDED/CRASHED on delete, …).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Compare-and-set on the actor's state failed: it is in `actual`.
    #[error("actor is {actual}, expected one of {expected}")]
    StateConflict {
        actual: ActorState,
        expected: String,
    },
    /// Capacity admission failed: the worker has no room left for the demand (or is not ACTIVE).
    #[error("worker {worker_id} has no room for the actor")]
    NoRoom { worker_id: String },
    /// The actor's atespace would go over one of its quotas (`quota`: `runningActors`, `cpu`,
    /// `memory`); the text is [`ate_core::QUOTA_EXCEEDED`]'s shape, which the router recognises.
    #[error("{}", ate_core::quota_exceeded_message(atespace, quota, *limit, *used))]
    QuotaExceeded {
        atespace: String,
        quota: &'static str,
        limit: u64,
        used: u64,
    },
    /// Anything the database said that is not one of the above.
    #[error("store error: {0}")]
    Database(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtespaceRecord {
    pub name: String,
    pub created_ms: i64,
    /// Number of actors in the atespace at read time.
    pub actor_count: u64,
    /// Atespaces whose actors may call this atespace's actors, in the order set; `"*"` = every
    /// atespace. Empty: none besides its own (calls within one atespace are always allowed).
    pub callers_allow: Vec<String>,
    /// The most its actors may hold at once (0 in a field: no limit).
    pub quota: Capacity,
    /// What its actors hold now: their worker assignments (actors RESUMING, RUNNING or
    /// SUSPENDING), `slots` = how many (computed on read).
    pub usage: Capacity,
}

impl AtespaceRecord {
    /// The first quota `demand` more would exceed, as (its name in the Atespace document,
    /// limit, in use), or None. A quota of 0 is no limit.
    pub fn over_quota(&self, demand: &Capacity) -> Option<(&'static str, u64, u64)> {
        over_quota(&self.quota, &self.usage, demand)
    }
}

/// The first quota of `quota` that `used + demand` exceeds: (its name in the Atespace document,
/// limit, in use). A quota of 0 is no limit.
pub fn over_quota(
    quota: &Capacity,
    used: &Capacity,
    demand: &Capacity,
) -> Option<(&'static str, u64, u64)> {
    [
        ("runningActors", quota.slots, used.slots, demand.slots),
        ("cpu", quota.cpu_millis, used.cpu_millis, demand.cpu_millis),
        (
            "memory",
            quota.memory_bytes,
            used.memory_bytes,
            demand.memory_bytes,
        ),
    ]
    .into_iter()
    .find(|&(_, limit, used, more)| limit > 0 && used.saturating_add(more) > limit)
    .map(|(name, limit, used, _)| (name, limit, used))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    /// Templates live in an atespace (their namespace), which must exist.
    pub namespace: String,
    pub name: String,
    pub spec: TemplateSpec,
    pub created_ms: i64,
    pub updated_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorRecord {
    pub atespace: String,
    pub name: String,
    pub uid: String,
    /// The actor's template (stored as `ns/name`).
    pub template: TemplateRef,
    pub state: ActorState,
    pub worker_selector: BTreeMap<String, String>,
    /// Worker the actor is bound to (RESUMING, RUNNING, SUSPENDING); `None` otherwise.
    pub worker_id: Option<String>,
    /// Worker epoch recorded at bind (the registered one) and at finalize (the node's).
    pub epoch: u64,
    /// Newest snapshot generation (0 = none).
    pub generation: u64,
    /// Node holding the newest node-local generation (async suspend), if any.
    pub attached_node: Option<String>,
    /// Why the actor last failed or fell back, if it did (stored as `''` when `None`).
    pub last_error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Fencing token of the newest activation (0 = never bound): strictly increasing, taken by
    /// every [`Store::bind_actor`] that is not a retry of the same bind.
    pub activation: u64,
}

impl ActorRecord {
    /// A new actor, as it is created: SUSPENDED, never bound (no worker, epoch or activation),
    /// no generation, no error, created and updated at `now_ms`.
    pub fn new(
        atespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
        template: TemplateRef,
        worker_selector: BTreeMap<String, String>,
        now_ms: i64,
    ) -> Self {
        ActorRecord {
            atespace: atespace.into(),
            name: name.into(),
            uid: uid.into(),
            template,
            state: ActorState::Suspended,
            worker_selector,
            worker_id: None,
            epoch: 0,
            generation: 0,
            attached_node: None,
            last_error: None,
            created_ms: now_ms,
            updated_ms: now_ms,
            activation: 0,
        }
    }

    /// The actor's `<atespace>/<name>` address.
    pub fn actor_ref(&self) -> ActorRef {
        ActorRef::new(self.atespace.clone(), self.name.clone())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub atespace: String,
    pub name: String,
    pub generation: u64,
    pub uuid: String,
    pub fidelity: Fidelity,
    /// Template the generation was captured under (stored as `ns/name`).
    pub template: TemplateRef,
    pub sandbox_class: String,
    /// Node that wrote the generation and the boot it was written in.
    pub node: String,
    pub boot_id: String,
    /// Directory on `node`; `None` once the local copy is dropped (stored as `''` when `None`).
    pub local_path: Option<String>,
    /// Where the durable copy is, once known (stored as `''` when `None`).
    pub durable_uri: Option<String>,
    /// `None` = no durable copy was asked for yet.
    pub durable_status: Option<DurableStatus>,
    pub size_bytes: u64,
    pub checksum: String,
    /// Why the fidelity is lower than the template asked for, if it is (stored as `''` when
    /// `None`).
    pub reason: Option<String>,
    pub created_ms: i64,
    /// Why the node-local copy was found damaged when a restore read it; `None`: it never was
    /// (stored as `''` when `None`).
    pub local_damage: Option<String>,
    /// The same for the durable copy.
    pub durable_damage: Option<String>,
    /// A revert chose an older generation: no resume chooses this one (see
    /// [`Store::revert_actor`]). Always false in a tag's copy.
    pub skipped: bool,
    /// Restore capabilities a worker needs to restore everything this generation holds
    /// (`ate_core::capability`; empty for a generation written before they were recorded: see
    /// `ate_core::capability::required`).
    pub requires: Vec<String>,
}

impl SnapshotRecord {
    /// A node-local copy is recorded and was never found damaged (whether its node is up is
    /// the caller's to check).
    pub fn local_intact(&self) -> bool {
        self.local_path.is_some() && self.local_damage.is_none()
    }

    /// A COMPLETED durable copy that was never found damaged.
    pub fn durable_intact(&self) -> bool {
        self.durable_status == Some(DurableStatus::Completed) && self.durable_damage.is_none()
    }

    /// Some copy was found damaged.
    pub fn damaged(&self) -> bool {
        self.local_damage.is_some() || self.durable_damage.is_some()
    }
}

/// One of the two copies of a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotCopy {
    /// The directory on the node that wrote it.
    Local,
    /// The copy in the object store.
    Durable,
}

impl SnapshotCopy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "node-local",
            Self::Durable => "durable",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRecord {
    pub atespace: String,
    pub name: String,
    /// A copy of the tagged generation's record (the tag keeps its files alive).
    pub snapshot: SnapshotRecord,
    pub created_ms: i64,
}

/// A join token as stored: the secret only as its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTokenRecord {
    pub id: String,
    pub secret_sha256: String,
    pub description: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    /// Nodes that joined with it, oldest first.
    pub used_by: Vec<String>,
}

/// A generation kept frozen in place on a worker (placement preference for the next resume).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenCopy {
    pub worker_id: String,
    pub generation: u64,
}

/// An actor's alarm: at `due_ms` the platform POSTs to `path` on the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alarm {
    pub actor: ActorRef,
    /// When it is due (Unix ms), as set.
    pub due_ms: i64,
    /// Path the platform POSTs to (starts with '/').
    pub path: String,
    /// Bumped by every set_alarm of the actor (1 for the first): a delivery or a failure
    /// report changes only the alarm it was about.
    pub seq: i64,
    /// Failed delivery attempts so far.
    pub attempts: u32,
    /// Earliest time of the next delivery attempt (Unix ms): `due_ms` at first, then the retry
    /// time after a failure, or the end of a claim's lease while a delivery is under way.
    pub next_attempt_ms: i64,
    /// Why the last attempt failed ("" if none).
    pub last_error: String,
    /// Given up after its last try; kept (not delivered again) until the actor sets another
    /// alarm, deletes it, or is deleted.
    pub failed: bool,
    /// When it was set (Unix ms).
    pub set_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub slots: u64,
}

impl Capacity {
    /// True when `demand` fits in `self - used`.
    pub fn fits(&self, used: &Capacity, demand: &Capacity) -> bool {
        used.cpu_millis + demand.cpu_millis <= self.cpu_millis
            && used.memory_bytes + demand.memory_bytes <= self.memory_bytes
            && used.slots + demand.slots <= self.slots
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerStatus {
    Active,
    Gone,
}

impl WorkerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "ACTIVE",
            Self::Gone => "GONE",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRecord {
    pub id: String,
    pub node: String,
    /// host:port of the worker's atunnel listener(s).
    pub addresses: Vec<String>,
    pub identity: String,
    pub labels: BTreeMap<String, String>,
    pub sandbox_class: String,
    pub can_restore_memory: bool,
    /// Restore capabilities it advertised (`ate_core::capability`; empty for a worker registered
    /// before workers advertised them: see `ate_core::capability::offered`).
    pub capabilities: Vec<String>,
    /// What admission books against: `capacity.cpu_millis` is the machine's CPU times the
    /// worker's overcommit factor (`ate worker --cpu-overcommit`).
    pub capacity: Capacity,
    /// Sum of the worker's actor assignments (computed on read; ignored on write).
    pub used: Capacity,
    /// The machine's CPU the worker offers before overcommit, in millicores (0: unknown, a
    /// worker that did not report it; the same as `capacity.cpu_millis`).
    pub cpu_physical_millis: u64,
    /// CPU its actors really used lately, in millicores (from the last heartbeat; written by
    /// [`Store::heartbeat_worker`], ignored by `register_worker`, which starts it at 0).
    pub cpu_usage_millis: u64,
    pub epoch: u64,
    pub status: WorkerStatus,
    pub last_heartbeat_ms: i64,
    /// gRPC address of the node agent that owns the worker.
    pub node_address: String,
    pub boot_id: String,
}

/// Fields a state transition may also change.
#[derive(Debug, Clone, Default)]
pub struct ActorUpdate {
    /// Replace `last_error`: `Some(None)` clears it, `None` keeps it.
    pub last_error: Option<Option<String>>,
    /// Record this worker epoch.
    pub epoch: Option<u64>,
    /// Forget the attached node (its local generation was detached).
    pub clear_attached_node: bool,
    /// Why the change happens, for the actor's event (not kept on the actor): "idle", "for
    /// request r-1", ….
    pub note: Option<String>,
}

impl ActorUpdate {
    /// Only `last_error` replaced (the reason of a transition).
    pub fn with_error(why: impl Into<String>) -> Self {
        Self {
            last_error: Some(Some(why.into())),
            ..Self::default()
        }
    }

    /// Only the event's note (see [`ActorUpdate::note`]).
    pub fn with_note(note: impl Into<String>) -> Self {
        Self {
            note: Some(note.into()),
            ..Self::default()
        }
    }
}

/// A compare-and-set of an actor's state: allowed only while the actor is in one of `from`, it
/// moves the actor to `to` and applies `update`.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    pub from: &'a [ActorState],
    pub to: ActorState,
    pub update: ActorUpdate,
}

impl<'a> Transition<'a> {
    /// From one of `from` to `to`, changing no other field.
    pub fn new(from: &'a [ActorState], to: ActorState) -> Self {
        Self {
            from,
            to,
            update: ActorUpdate::default(),
        }
    }

    /// The same transition, also applying `update`.
    pub fn with(self, update: ActorUpdate) -> Self {
        Self { update, ..self }
    }
}

/// Operation counters, so tests can assert what a workflow did (e.g. the warm path is one read
/// and takes no lease).
#[derive(Debug, Default)]
pub struct StoreCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub lease_ops: AtomicU64,
}

impl StoreCounters {
    pub fn read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }
    pub fn write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
    pub fn lease(&self) {
        self.lease_ops.fetch_add(1, Ordering::Relaxed);
    }
    /// (reads, writes, lease_ops)
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.reads.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
            self.lease_ops.load(Ordering::Relaxed),
        )
    }
}

/// Persistent state of the control plane. Times are Unix milliseconds supplied by the caller.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    // ---- atespaces
    /// AlreadyExists if present.
    async fn create_atespace(&self, name: &str, now_ms: i64) -> Result<AtespaceRecord>;
    async fn get_atespace(&self, name: &str) -> Result<AtespaceRecord>;
    async fn list_atespaces(&self) -> Result<Vec<AtespaceRecord>>;
    /// Replaces the atespace's `callers_allow` list (`[]` clears it) and returns the record as
    /// [`Store::get_atespace`] would. NotFound if the atespace does not exist. The entries are
    /// expected to pass `ate_core::validate_callers_allow`; one that is empty or contains a comma
    /// (which the stored form could not keep) is a `Database` error.
    async fn set_atespace_callers(&self, name: &str, allow: &[String]) -> Result<AtespaceRecord>;
    /// The atespace's quota and, when it has one, what its actors hold now (else zeros): what a
    /// resume checks before placement, without [`Store::get_atespace`]'s count of its actors.
    /// NotFound if the atespace does not exist.
    async fn atespace_quota(&self, name: &str) -> Result<(Capacity, Capacity)>;
    /// Replaces the atespace's quota (0 in a field: no limit) and returns the record as
    /// [`Store::get_atespace`] would. NotFound if the atespace does not exist. Actors already
    /// over a lowered quota keep running; only new binds are refused.
    async fn set_atespace_quota(&self, name: &str, quota: &Capacity) -> Result<AtespaceRecord>;
    /// FailedPrecondition while it holds actors, templates or tags.
    async fn delete_atespace(&self, name: &str) -> Result<()>;

    // ---- templates
    /// Insert or replace. NotFound if the namespace (an atespace) does not exist.
    async fn apply_template(
        &self,
        namespace: &str,
        name: &str,
        spec: &TemplateSpec,
        now_ms: i64,
    ) -> Result<TemplateRecord>;
    async fn get_template(&self, namespace: &str, name: &str) -> Result<TemplateRecord>;
    async fn list_templates(&self, namespace: Option<&str>) -> Result<Vec<TemplateRecord>>;
    /// FailedPrecondition while actors use it.
    async fn delete_template(&self, namespace: &str, name: &str) -> Result<()>;

    // ---- actors
    /// Checks in the same transaction that the atespace and the template exist (NotFound);
    /// AlreadyExists if the actor does.
    async fn create_actor(&self, actor: &ActorRecord) -> Result<ActorRecord>;
    /// Exactly one read.
    async fn get_actor(&self, actor: &ActorRef) -> Result<ActorRecord>;
    /// Ordered by (atespace, name); starts strictly after `after`; at most `limit`.
    async fn list_actors(
        &self,
        atespace: Option<&str>,
        after: Option<&ActorRef>,
        limit: u32,
    ) -> Result<Vec<ActorRecord>>;
    async fn update_actor_selector(
        &self,
        actor: &ActorRef,
        selector: &BTreeMap<String, String>,
        now_ms: i64,
    ) -> Result<ActorRecord>;
    /// Only SUSPENDED or CRASHED (else StateConflict). Removes the actor, its snapshot rows, its
    /// assignment, its lease and its alarm; returns the removed snapshot rows that no tag
    /// references, for GC.
    async fn delete_actor(&self, actor: &ActorRef, now_ms: i64) -> Result<Vec<SnapshotRecord>>;
    /// Compare-and-set of the state (StateConflict if not in `transition.from`), plus its update.
    async fn transition(
        &self,
        actor: &ActorRef,
        transition: Transition<'_>,
        now_ms: i64,
    ) -> Result<ActorRecord>;
    /// [`Store::transition`] that also releases the lease `lease_key` held by `lease_holder` (as
    /// [`Store::release_lease`]) in the same transaction: a workflow's last write and the end
    /// of its lease in one commit. On an error nothing changes and the lease is still held.
    async fn transition_releasing_lease(
        &self,
        actor: &ActorRef,
        transition: Transition<'_>,
        now_ms: i64,
        lease_key: &str,
        lease_holder: &str,
    ) -> Result<ActorRecord>;
    /// One transaction: actor state in `from` (else StateConflict); the atespace's assignments
    /// minus this actor's plus `demand` stay within its quota (else QuotaExceeded); worker exists
    /// (NotFound) and is ACTIVE; the worker's assignments minus this actor's plus `demand` fit
    /// its capacity (else NoRoom); the actor's assignment is set to this worker (replacing any other); the actor becomes
    /// RESUMING with `worker_id` and the worker's registered epoch. Idempotent when already bound there.
    /// (An actor already RESUMING on `worker_id` passes the state check whatever `from` says, and
    /// its own assignment is not counted against the room, so a retried bind succeeds again.)
    async fn bind_actor(
        &self,
        actor: &ActorRef,
        from: &[ActorState],
        worker_id: &str,
        demand: Capacity,
        now_ms: i64,
    ) -> Result<ActorRecord>;
    /// Takes back an actor released while its worker was unreachable, when that worker turns out
    /// to still run it: one transaction, the actor is SUSPENDED and still at `activation` (no
    /// bind happened since, so no other copy can exist; else StateConflict / FailedPrecondition),
    /// capacity is admitted on `worker_id` as in [`Store::bind_actor`], and the actor becomes
    /// RUNNING there with the same activation.
    async fn readopt_actor(
        &self,
        actor: &ActorRef,
        worker_id: &str,
        activation: u64,
        demand: Capacity,
        now_ms: i64,
    ) -> Result<ActorRecord>;
    /// One transaction: optionally insert `snapshot` (the actor's generation and attached node
    /// follow it), drop the actor's assignment, and make `transition` (StateConflict if not in
    /// its `from`), leaving the actor with no worker.
    /// The snapshot must be of this actor (else FailedPrecondition) and a new generation (else
    /// AlreadyExists); `attached_node` becomes its `node` (`None` if empty) after the update applied.
    async fn release_actor(
        &self,
        actor: &ActorRef,
        transition: Transition<'_>,
        snapshot: Option<&SnapshotRecord>,
        now_ms: i64,
    ) -> Result<ActorRecord>;
    async fn actors_on_worker(&self, worker_id: &str) -> Result<Vec<ActorRecord>>;

    // ---- snapshots
    /// Newest generation first.
    async fn list_snapshots(&self, actor: &ActorRef) -> Result<Vec<SnapshotRecord>>;
    /// Retention, in one transaction: keeps the newest generation, the newest `keep_newest`
    /// generations a resume could still choose (not skipped by a revert, with a copy not found
    /// damaged), the newest such generation with an intact COMPLETED durable copy, and every
    /// generation a tag refers to; deletes the other records and returns them (their files are
    /// the caller's to delete).
    async fn prune_snapshots(
        &self,
        actor: &ActorRef,
        keep_newest: usize,
    ) -> Result<Vec<SnapshotRecord>>;
    /// Sets the durable status and URI; `reason` replaces the stored one unless empty. Tags holding
    /// a copy of the generation (same uuid) are updated too. NotFound if the generation is missing.
    async fn update_snapshot_durable(
        &self,
        actor: &ActorRef,
        generation: u64,
        status: DurableStatus,
        durable_uri: &str,
        reason: &str,
    ) -> Result<()>;
    /// Forget the node-local copy of a generation (after Detach), in tags' copies too.
    async fn clear_snapshot_local(&self, actor: &ActorRef, generation: u64) -> Result<()>;
    /// Records that `copy` of the generation (named by its number and `uuid`) was found damaged,
    /// and why; a reason already recorded stays. Tags holding a copy of the generation (same
    /// uuid) are marked too. NotFound if the actor has no such generation (or it has another
    /// uuid: a generation of an earlier actor of that name).
    async fn mark_snapshot_damaged(
        &self,
        actor: &ActorRef,
        generation: u64,
        uuid: &str,
        copy: SnapshotCopy,
        reason: &str,
    ) -> Result<SnapshotRecord>;
    /// RevertActor's write, in one transaction: the actor is in `from` (else StateConflict) and
    /// becomes SUSPENDED with no worker, and a generation is chosen for its next resume: with
    /// `generation`, that one, which must exist (else NotFound) with a copy not found damaged
    /// (else FailedPrecondition; nothing changes on an error); without, the newest generation
    /// not skipped with such a copy (none: every generation). Every generation newer than the
    /// chosen one is marked skipped and the chosen one is not; older ones keep their mark (one
    /// an earlier revert skipped stays skipped).
    async fn revert_actor(
        &self,
        actor: &ActorRef,
        from: &[ActorState],
        generation: Option<u64>,
        now_ms: i64,
    ) -> Result<ActorRecord>;

    // ---- tags
    async fn create_tag(&self, tag: &TagRecord) -> Result<TagRecord>;
    async fn get_tag(&self, atespace: &str, name: &str) -> Result<TagRecord>;
    async fn list_tags(&self, atespace: Option<&str>) -> Result<Vec<TagRecord>>;
    async fn delete_tag(&self, atespace: &str, name: &str) -> Result<()>;

    // ---- workers
    /// Insert or replace (status ACTIVE, heartbeat = now). Keeps existing assignments.
    async fn register_worker(&self, worker: &WorkerRecord, now_ms: i64) -> Result<WorkerRecord>;
    /// Records a heartbeat with the CPU the worker's actors used lately (millicores). False
    /// when the worker is unknown, GONE, or registered with another epoch.
    async fn heartbeat_worker(
        &self,
        id: &str,
        epoch: u64,
        cpu_usage_millis: u64,
        now_ms: i64,
    ) -> Result<bool>;
    /// Marks GONE (NotFound if unknown). Its assignments stay until their actors are released.
    async fn deregister_worker(&self, id: &str) -> Result<()>;
    async fn get_worker(&self, id: &str) -> Result<WorkerRecord>;
    /// Every worker with its `used` capacity.
    async fn list_workers(&self) -> Result<Vec<WorkerRecord>>;
    /// Marks ACTIVE workers whose last heartbeat is older than `stale_before_ms` GONE; returns their ids.
    async fn expire_workers(&self, stale_before_ms: i64) -> Result<Vec<String>>;

    // ---- leases
    /// Takes `key` for `holder` until `now + ttl` if it is free, expired, or already held by `holder`.
    async fn try_acquire_lease(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool>;
    /// Releases `key` if `holder` holds it.
    async fn release_lease(&self, key: &str, holder: &str) -> Result<()>;

    // ---- join tokens
    /// Inserts a token (AlreadyExists on an id clash) and drops tokens expired for a day.
    async fn create_join_token(&self, token: &JoinTokenRecord) -> Result<()>;
    async fn get_join_token(&self, id: &str) -> Result<JoinTokenRecord>;
    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRecord>>;
    /// False when no such token exists.
    async fn delete_join_token(&self, id: &str) -> Result<bool>;
    /// Appends `node` to the token's `used_by` (once; the list keeps its last 100 entries).
    async fn record_join_token_use(&self, id: &str, node: &str) -> Result<()>;

    // ---- frozen copies
    async fn set_frozen_copy(&self, actor: &ActorRef, copy: &FrozenCopy) -> Result<()>;
    async fn get_frozen_copy(&self, actor: &ActorRef) -> Result<Option<FrozenCopy>>;
    async fn clear_frozen_copy(&self, actor: &ActorRef) -> Result<()>;

    // ---- alarms
    /// Inserts or replaces the actor's alarm, in one transaction with a check that the actor
    /// exists (NotFound): `seq` is one more than the actor's previous alarm's (even a deleted
    /// one's, so a delivery in flight never mistakes the new alarm for its own), and delivery
    /// starts afresh (no attempts, next attempt at `due_ms`, not failed).
    async fn set_alarm(
        &self,
        actor: &ActorRef,
        due_ms: i64,
        path: &str,
        now_ms: i64,
    ) -> Result<Alarm>;
    async fn get_alarm(&self, actor: &ActorRef) -> Result<Option<Alarm>>;
    /// Deletes the actor's alarm if it has one and, with `seq`, only if it is that alarm (a
    /// delivery deletes what it delivered, never an alarm set again meanwhile). True if deleted.
    async fn delete_alarm(&self, actor: &ActorRef, seq: Option<i64>) -> Result<bool>;
    /// Ordered by (due_ms, atespace, name).
    async fn list_alarms(&self, atespace: Option<&str>) -> Result<Vec<Alarm>>;
    /// Atomically claims up to `limit` alarms to deliver: not failed, `next_attempt_ms <= now_ms`,
    /// oldest `next_attempt_ms` first; each one's `next_attempt_ms` becomes `now_ms + lease_ms`
    /// (returned so), so no other caller claims it before that lease ends, and an unfinished
    /// delivery is claimed again after it. Concurrent callers (other replicas) never claim the
    /// same alarm.
    async fn claim_due_alarms(&self, now_ms: i64, lease_ms: i64, limit: u32) -> Result<Vec<Alarm>>;
    /// Records a failed delivery of the alarm `seq`: one more attempt, `error`, the next attempt
    /// at `next_attempt_ms`, and `failed = give_up`. False (nothing changed) when the actor's
    /// alarm is no longer `seq` (set again or deleted meanwhile).
    async fn alarm_attempt_failed(
        &self,
        actor: &ActorRef,
        seq: i64,
        next_attempt_ms: i64,
        error: &str,
        give_up: bool,
    ) -> Result<bool>;

    // ---- events
    /// The events `query` asks for (see [`EventQuery`]), oldest first, and the newest event id.
    /// Every method above that changes an actor's state or worker records one in its own
    /// transaction ([`ActorEvent`]).
    async fn list_events(&self, query: &EventQuery) -> Result<EventPage>;
    /// Retention: deletes up to `limit` events older than `before_ms`, oldest first; returns
    /// how many (call again while it returns `limit`).
    async fn prune_events(&self, before_ms: i64, limit: u32) -> Result<u64>;

    fn counters(&self) -> &StoreCounters;
}
