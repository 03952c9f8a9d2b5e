//! The actor workflows: resume, suspend, revert, delete, and the fleet's reports.
//!
//! Architecture invariant: every mutating workflow runs under the actor's lease, and every state
//! change is a compare-and-set in the store, so a workflow interrupted after any step is picked up
//! by the next call (after the dead holder's lease expires) and never corrupts a record.
//!
//! This file holds [`Api`] and what the workflows share (leases, `Failure`, fault points, error
//! helpers, [`ActorView`]); each verb family has a file of its own: `resume` (with `placement`:
//! which worker, which generation), `suspend`, `lifecycle` (revert, delete, removed generations'
//! files), `logs`, and `fleet` (the node agents' reports).
//!
//! Architecture invariant: no wire type here. Workflows take and return store records and core
//! types and fail with [`WorkflowError`]; `services/` and `convert.rs` answer the caller, and
//! `node.rs` speaks NodeService for them.

mod alarms;
mod evict;
mod exec;
mod fleet;
mod lifecycle;
mod logs;
mod placement;
mod resume;
mod suspend;
mod top;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_store::{
    ActorRecord, Capacity, Store, StoreError, TemplateRecord, WorkerRecord, WorkerStatus,
};

use crate::ApiConfig;
use crate::error::WorkflowError;
use crate::lease::Lease;
use crate::node::{NodeClients, NodeError};
use crate::node_calls::NodeCalls;
use crate::scheduler::{self, FleetView};

pub use evict::THRASH_WINDOW;
pub use exec::ExecTarget;
pub use fleet::{ActorExit, HeldActor};
pub use lifecycle::GenerationView;
pub use logs::ActorLog;
pub use top::ActorUsage;

/// Points between workflow steps where a test can simulate a crash of the api.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    ResumeAfterLease,
    ResumeAfterBind,
    ResumeAfterNodeCall,
    SuspendAfterSuspending,
    SuspendAfterCheckpoint,
}

/// Armed fault points; each fires once. Empty in production.
#[derive(Default)]
pub struct Faults(Mutex<HashSet<FaultPoint>>);

impl Faults {
    pub fn arm(&self, point: FaultPoint) {
        if let Ok(mut set) = self.0.lock() {
            set.insert(point);
        }
    }

    fn fire(&self, point: FaultPoint) -> Result<(), Failure> {
        let fired = self
            .0
            .lock()
            .map(|mut set| set.remove(&point))
            .unwrap_or(false);
        if fired {
            Err(Failure::Crash(WorkflowError::Internal(format!(
                "injected crash at {point:?}"
            ))))
        } else {
            Ok(())
        }
    }
}

/// How a workflow under a lease ended badly.
enum Failure {
    /// An answer for the caller; the lease is released.
    Error(WorkflowError),
    /// A simulated crash: the lease is abandoned (it expires) and nothing is cleaned up.
    Crash(WorkflowError),
}

impl From<WorkflowError> for Failure {
    fn from(e: WorkflowError) -> Self {
        Failure::Error(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Error(WorkflowError::Store(e))
    }
}

/// Copies of one generation a node found damaged (their content does not match the manifest),
/// from a failed Restore or an actor's exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub generation: u64,
    pub uuid: String,
    /// What was found wrong with the node-local copy, naming the file; None: not found damaged.
    pub local: Option<String>,
    /// The same for the durable copy.
    pub durable: Option<String>,
}

/// An actor with the worker it is assigned to, if that worker is known (its addresses and
/// identity go to the caller with the assignment).
#[derive(Debug, Clone)]
pub struct ActorView {
    pub actor: ActorRecord,
    pub worker: Option<WorkerRecord>,
}

impl ActorView {
    /// An actor no worker holds any more (just released: SUSPENDED or CRASHED).
    fn bare(actor: ActorRecord) -> Self {
        Self {
            actor,
            worker: None,
        }
    }
}

pub struct Api {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) fleet: FleetView,
    /// The node agents' calls: the gRPC pool below, or a test's scripted nodes.
    nodes: Arc<dyn NodeCalls>,
    /// The gRPC pool, for what [`NodeCalls`] leaves out (exec's two-way stream).
    grpc: Arc<NodeClients>,
    cfg: ApiConfig,
    pub faults: Faults,
    /// Cold resumes that found no room, oldest first: freed room goes to them first.
    waiters: scheduler::Waiters,
    /// Since when (Unix ms) this api could have heard every heartbeat: its start, or the end of
    /// the last store outage it saw. Worker expiry counts only time after it.
    hearing_since_ms: std::sync::atomic::AtomicI64,
    /// Nodes a call could not reach: new placements avoid their workers meanwhile (soft state;
    /// the store expires them if they stay silent), until the node is heard again.
    suspect_nodes: Mutex<std::collections::HashMap<String, Suspicion>>,
    /// One lock per worker id, held by what changes a worker's actors wholesale: its
    /// registration with the reconciliation of what it holds, and its expiry with the release
    /// of its actors. Without it an expiry could release an actor after a concurrent
    /// registration had read it as RUNNING and kept the worker's copy: the actor then resumed
    /// from its last generation beside the kept copy (state lost, fault suite 2026-12-03).
    worker_locks: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Woken when an alarm is set, so one due at once is delivered without waiting for a tick.
    alarm_wake: tokio::sync::Notify,
    /// Actor events as the store records them, for the watches.
    pub(crate) events: crate::events::Feed,
    /// Per template (`<namespace>/<name>`): whether it hibernates WebSockets, and when that was
    /// read (see `Api::hibernates_web_sockets`).
    web_sockets: Mutex<std::collections::HashMap<String, (bool, Instant)>>,
}

/// Why placement avoids a node: a call to it failed in the transport.
#[derive(Debug, Clone, Copy)]
struct Suspicion {
    since: Instant,
    /// `since` as the store's clock (Unix ms), to compare with heartbeats.
    since_ms: i64,
    /// When the api would have expired its workers anyway.
    until: Instant,
}

/// How long a suspicion holds at least, whatever is heard: a node that answers heartbeats but
/// not calls (a one-way partition) costs one failed placement a second, not one per request.
const SUSPICION_AT_LEAST: Duration = Duration::from_secs(1);

impl Suspicion {
    /// Whether the node is still avoided at `now`, given the newest heartbeat recorded for any
    /// of its workers: a node restarted after the failed call heartbeats within a second or
    /// two, and is used again at once rather than after the whole expiry time.
    fn holds(&self, now: Instant, heard_ms: Option<i64>) -> bool {
        if now >= self.until {
            return false;
        }
        let heard_since = heard_ms.is_some_and(|h| h > self.since_ms);
        !(heard_since && now.duration_since(self.since) >= SUSPICION_AT_LEAST)
    }
}

fn crashed(actor: &ActorRef, last_error: &Option<String>) -> WorkflowError {
    WorkflowError::Crashed {
        actor: actor.clone(),
        last_error: last_error.clone(),
    }
}

fn transient(actor: &ActorRef, state: ActorState) -> WorkflowError {
    WorkflowError::Busy {
        actor: actor.clone(),
        state,
    }
}

/// A node call failed transiently (the node may have answered Unavailable, or never got the
/// call): the actor stays where it is, and the caller may retry.
fn worker_unavailable(worker_id: &str, error: &NodeError) -> WorkflowError {
    WorkflowError::WorkerUnavailable {
        worker_id: worker_id.to_string(),
        reason: error.message.clone(),
    }
}

/// Ends a workflow's lease by how the work ended: released after an answer (success or not),
/// abandoned after a simulated crash (it expires).
async fn end_lease<T>(lease: Lease, result: Result<T, Failure>) -> Result<T, WorkflowError> {
    match result {
        Ok(v) => {
            lease.release().await;
            Ok(v)
        }
        Err(Failure::Error(s)) => {
            lease.release().await;
            Err(s)
        }
        Err(Failure::Crash(s)) => {
            lease.abandon();
            Err(s)
        }
    }
}

/// The NodeService address of `node` while one of its workers is ACTIVE.
fn live_node_address(workers: &[WorkerRecord], node: &str) -> Option<String> {
    workers
        .iter()
        .find(|w| w.node == node && w.status == WorkerStatus::Active)
        .map(|w| w.node_address.clone())
}

fn demand(template: &TemplateRecord) -> Capacity {
    Capacity {
        cpu_millis: u64::from(template.spec.resources.cpu_millis),
        memory_bytes: template.spec.resources.memory_bytes,
        slots: 1,
    }
}

impl Api {
    /// See [`Api::worker_locks`].
    pub(crate) async fn lock_worker(&self, worker_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .worker_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(worker_id.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    pub fn new(store: Arc<dyn Store>, cfg: ApiConfig) -> Self {
        let grpc = Arc::new(NodeClients::new(cfg.node_tls.clone()));
        Self::with_clients(store, cfg, grpc.clone(), grpc)
    }

    /// An api whose workflows call the node agents through `calls` (a test's scripted nodes:
    /// the control plane tested without sockets) instead of gRPC. Exec still goes over gRPC.
    pub fn with_node_calls(
        store: Arc<dyn Store>,
        cfg: ApiConfig,
        calls: Arc<dyn NodeCalls>,
    ) -> Self {
        let grpc = Arc::new(NodeClients::new(cfg.node_tls.clone()));
        Self::with_clients(store, cfg, calls, grpc)
    }

    fn with_clients(
        store: Arc<dyn Store>,
        cfg: ApiConfig,
        nodes: Arc<dyn NodeCalls>,
        grpc: Arc<NodeClients>,
    ) -> Self {
        Self {
            fleet: FleetView::new(store.clone(), cfg.fleet_max_age),
            events: crate::events::Feed::new(store.clone()),
            store,
            nodes,
            grpc,
            cfg,
            faults: Faults::default(),
            waiters: scheduler::Waiters::default(),
            hearing_since_ms: std::sync::atomic::AtomicI64::new(now_ms()),
            suspect_nodes: Mutex::new(std::collections::HashMap::new()),
            worker_locks: Mutex::new(std::collections::HashMap::new()),
            alarm_wake: tokio::sync::Notify::new(),
            web_sockets: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// How long actor events are kept.
    pub fn event_retention(&self) -> Duration {
        self.cfg.event_retention
    }

    /// A call to `node` failed in the transport (refused, reset, timed out connecting): avoid
    /// placing on it for as long as the api would take to expire its workers, or until it is
    /// heard again (see [`Suspicion::holds`]).
    fn suspect_node(&self, node: &str) {
        let suspicion = Suspicion {
            since: Instant::now(),
            since_ms: now_ms(),
            until: Instant::now() + self.expiry_after(),
        };
        if let Ok(mut s) = self.suspect_nodes.lock() {
            s.insert(node.to_string(), suspicion);
        }
    }

    /// Nodes currently avoided by placement, given the workers as the store last had them.
    fn suspects(&self, workers: &[WorkerRecord]) -> HashSet<String> {
        let now = Instant::now();
        match self.suspect_nodes.lock() {
            Ok(mut s) => {
                s.retain(|node, suspicion| {
                    let heard_ms = workers
                        .iter()
                        .filter(|w| &w.node == node)
                        .map(|w| w.last_heartbeat_ms)
                        .max();
                    suspicion.holds(now, heard_ms)
                });
                s.keys().cloned().collect()
            }
            Err(_) => HashSet::new(),
        }
    }

    /// The store failed a heartbeat or an expiry pass: heartbeats sent meanwhile were lost, so
    /// expiry starts counting again from now.
    pub fn store_outage_seen(&self) {
        self.hearing_since_ms
            .store(now_ms(), std::sync::atomic::Ordering::Release);
    }

    /// The admission queue (fair hand-off of freed capacity; see [`scheduler::Waiters`]).
    pub fn admission(&self) -> &scheduler::Waiters {
        &self.waiters
    }

    /// What signs actors' identity tokens (`--identity-key`), if anything.
    pub fn identity_issuer(&self) -> Option<&Arc<ate_jwt::issuer::TokenIssuer>> {
        self.cfg.identity.as_ref()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The worker that keeps `generation` of the actor frozen in place, if the store knows one
    /// (a placement preference shared by every api replica: a resume there is a thaw). A store
    /// error costs only the preference.
    async fn frozen_worker(&self, actor: &ActorRef, generation: u64) -> Option<String> {
        match self.store.get_frozen_copy(actor).await {
            Ok(Some(c)) if c.generation == generation => Some(c.worker_id),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(actor = %actor, error = %e, "cannot read the frozen-copy hint");
                None
            }
        }
    }

    /// Records where the actor's new generation is kept frozen (`Some((worker, generation))`)
    /// or that no copy is (`None`). Best effort: a lost hint costs a restore instead of a thaw.
    async fn note_frozen_copy(&self, r: &ActorRef, kept: Option<(&String, u64)>) {
        let result = match kept {
            Some((worker, generation)) => {
                let copy = ate_store::FrozenCopy {
                    worker_id: worker.clone(),
                    generation,
                };
                self.store.set_frozen_copy(r, &copy).await
            }
            None => self.store.clear_frozen_copy(r).await,
        };
        if let Err(e) = result {
            tracing::warn!(actor = %r, error = %e, "cannot record the frozen-copy hint");
        }
    }

    fn holder(&self) -> String {
        format!("{}/{}", self.cfg.instance_id, uuid::Uuid::new_v4())
    }

    async fn lease(&self, actor: &ActorRef) -> Result<Lease, WorkflowError> {
        Lease::acquire(&self.store, actor, self.holder(), self.cfg.lease_ttl).await
    }

    /// Runs `work` under the actor's lease; releases it unless the work "crashed".
    async fn under_lease<T>(
        &self,
        actor: &ActorRef,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, WorkflowError> {
        let lease = self.lease(actor).await?;
        let result = work.await;
        end_lease(lease, result).await
    }

    /// The worker record for an actor's assignment, from the fleet view (no store read when fresh).
    async fn assigned_worker(&self, actor: &ActorRecord) -> Option<WorkerRecord> {
        let id = actor.worker_id.as_ref()?;
        let workers = self.fleet.workers().await.ok()?;
        if let Some(w) = workers.iter().find(|w| &w.id == id) {
            return Some(w.clone());
        }
        // Registered after the view was read.
        let workers = self.fleet.refresh().await.ok()?;
        workers.iter().find(|w| &w.id == id).cloned()
    }

    /// Records in the store the copies `damage` names as damaged (after the actor was marked
    /// CRASHED for it: a crash between the two leaves the mark out, and the next attempt on the
    /// same generation finds and records it again). A failed write is logged, not returned.
    async fn record_damage(&self, r: &ActorRef, damage: &Damage) {
        let copies = [
            (&damage.local, ate_store::SnapshotCopy::Local),
            (&damage.durable, ate_store::SnapshotCopy::Durable),
        ];
        for (reason, copy) in copies
            .iter()
            .filter_map(|(reason, copy)| reason.as_deref().map(|r| (r, *copy)))
        {
            match self
                .store
                .mark_snapshot_damaged(r, damage.generation, &damage.uuid, copy, reason)
                .await
            {
                Ok(_) => {
                    tracing::warn!(actor = %r, generation = damage.generation, copy = copy.as_str(), reason, "generation copy marked damaged")
                }
                Err(e) => {
                    tracing::warn!(actor = %r, generation = damage.generation, copy = copy.as_str(), error = %e, "cannot mark the generation copy damaged")
                }
            }
        }
    }

    /// The actor with its assigned worker's details.
    pub async fn actor_view(&self, actor: ActorRecord) -> ActorView {
        let worker = self.assigned_worker(&actor).await;
        ActorView { actor, worker }
    }

    /// True when the actor's last change is older than a lease: whatever workflow set its
    /// transient state is no longer running.
    fn stale(&self, actor: &ActorRecord) -> bool {
        let lease_ms = i64::try_from(self.cfg.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        now_ms().saturating_sub(actor.updated_ms) > lease_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suspicion(at: Instant) -> Suspicion {
        Suspicion {
            since: at,
            since_ms: 1_000_000,
            until: at + Duration::from_secs(12),
        }
    }

    #[test]
    fn a_suspect_node_is_used_again_once_heard_after_the_failed_call() {
        let t0 = Instant::now();
        let s = suspicion(t0);
        // Nothing heard since the failed call: avoided until the expiry time.
        assert!(s.holds(t0 + Duration::from_secs(5), Some(999_000)));
        assert!(s.holds(t0 + Duration::from_secs(5), None));
        assert!(!s.holds(t0 + Duration::from_secs(12), None));
        // Heard again (a restarted node heartbeats): used again, but not within the first
        // second (a node that heartbeats yet cannot be called fails one placement a second).
        assert!(s.holds(t0 + Duration::from_millis(500), Some(1_000_400)));
        assert!(!s.holds(t0 + Duration::from_millis(1500), Some(1_000_400)));
    }
}
