//! Where a cold resume runs and from which generation: the snapshot choice, the worker choice
//! and its admission (bind, with retries and the admission queue), and the detach that frees an
//! actor pinned to a node without room.

use std::time::{Duration, Instant};

use ate_core::backoff::{Backoff, Policy};
use ate_core::clock::now_ms;
use ate_core::{ActorState, DurableStatus};
use ate_store::{
    ActorRecord, SnapshotRecord, StoreError, TemplateRecord, WorkerRecord, WorkerStatus,
};
use tracing::Instrument;

use super::{Api, Failure, demand, live_node_address};
use crate::error::WorkflowError;
use crate::scheduler::{self, Requirements};

/// Most admission attempts after a lost race (up to 12 retries).
const MAX_BIND_RETRIES: u32 = 12;
/// Between admission attempts: from 10 ms, doubling to 250 ms, each delay ×[0.5, 1) so that
/// the racers for a worker's last room spread out instead of colliding again.
const BIND_BACKOFF: Policy = Policy {
    factor: 2.0,
    max: Duration::from_millis(250),
    jitter: (0.5, 1.0),
};

/// Idle actors one placement may suspend to make room before it parks (each frees one
/// actor's room; more means the room asked is larger than an idle actor's).
const MAX_EVICTIONS_PER_PLACEMENT: u32 = 2;

impl Api {
    /// Refuses at once an actor whose atespace has no quota left for it: before placement, so
    /// no other actor is evicted for it. Only a hint; the bind checks again in its transaction.
    pub(super) async fn check_quota(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
    ) -> Result<(), Failure> {
        let (quota, usage) = self.store.atespace_quota(&actor.atespace).await?;
        if quota == ate_store::Capacity::default() {
            return Ok(());
        }
        match ate_store::over_quota(&quota, &usage, &demand(template)) {
            None => Ok(()),
            Some((quota, limit, used)) => Err(WorkflowError::Store(StoreError::QuotaExceeded {
                atespace: actor.atespace.clone(),
                quota,
                limit,
                used,
            })
            .into()),
        }
    }

    /// A RESUMING actor whose worker is still ACTIVE is resumed there again (the previous attempt
    /// failed transiently); binding is idempotent.
    pub(super) async fn rebind_existing(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
    ) -> Result<Option<(ActorRecord, WorkerRecord)>, Failure> {
        if actor.state != ActorState::Resuming {
            return Ok(None);
        }
        let Some(worker_id) = &actor.worker_id else {
            return Ok(None);
        };
        let worker = match self.store.get_worker(worker_id).await {
            Ok(w) if w.status == WorkerStatus::Active => w,
            Ok(_) | Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match self
            .store
            .bind_actor(
                &actor.actor_ref(),
                &[ActorState::Resuming],
                &worker.id,
                demand(template),
                now_ms(),
            )
            .instrument(ate_telemetry::trace_span!("bind", worker = %worker.id, rebind = true))
            .await
        {
            Ok(a) => Ok(Some((a, worker))),
            Err(StoreError::NoRoom { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Newest generation a resume can restore now ([`restorable`]: not skipped by a revert, with
    /// a copy not found damaged that is usable); else, for an actor that never had a generation,
    /// the template's golden tag; else none (cold boot).
    pub(super) async fn choose_snapshot(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
    ) -> Result<Option<SnapshotRecord>, Failure> {
        let workers = self.fleet.workers().await?;
        let snapshots = self.store.list_snapshots(&actor.actor_ref()).await?;
        if let Some(s) = choose(snapshots, &workers) {
            return Ok(Some(s));
        }
        if actor.generation == 0
            && let Some(tag) = &template.spec.golden_tag
        {
            let (ts, tn) = ate_core::names::parse_namespaced("spec.goldenTag", tag)
                .map_err(WorkflowError::from)?;
            match self.store.get_tag(&ts, &tn).await {
                Ok(t) if restorable(&t.snapshot, &workers) => return Ok(Some(t.snapshot)),
                Ok(_) => tracing::warn!(tag = %tag, "golden tag has no usable copy; cold boot"),
                Err(StoreError::NotFound(_)) => {
                    tracing::warn!(tag = %tag, "golden tag not found; cold boot")
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// The node an actor with a node-local external volume (a `hostPath` not marked `shared`)
    /// must run on: that of its newest generation, where it last ran. None for an actor
    /// without one, or that never ran (its first start decides).
    async fn volume_node(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
    ) -> Result<Option<String>, Failure> {
        let node_local = template.spec.volumes.iter().any(|v| {
            v.external
                .as_ref()
                .is_some_and(|e| e.host_path.is_some() && !e.shared)
        });
        if !node_local {
            return Ok(None);
        }
        let snapshots = self.store.list_snapshots(&actor.actor_ref()).await?;
        Ok(snapshots
            .into_iter()
            .max_by_key(|s| s.generation)
            .map(|s| s.node)
            .filter(|n| !n.is_empty()))
    }

    /// Picks a worker and binds the actor to it. Returns whether the actor's node-local snapshot
    /// had to be detached (uploaded) so it could move to another node.
    pub(super) async fn assign(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
        snapshot: Option<&SnapshotRecord>,
    ) -> Result<((ActorRecord, WorkerRecord), bool), Failure> {
        let mut selector = template.spec.worker_selector.clone();
        selector.extend(actor.worker_selector.clone());
        let sandbox_class = snapshot
            .map(|s| s.sandbox_class.as_str())
            .unwrap_or(&template.spec.sandbox_class);
        // A node-local generation without an intact durable copy pins the actor to its node.
        let mut pinned = snapshot
            .filter(|s| !s.durable_intact())
            .map(|s| s.node.clone());
        let mut detached = false;
        let demand = demand(template);
        let from = [ActorState::Suspended, ActorState::Resuming];
        let r = actor.actor_ref();
        // An external hostPath volume (not `shared`) lives on the node the actor last ran on:
        // it goes back there, whatever generation it restores (docs/volumes.md).
        let volume_node = self.volume_node(actor, template).await?;
        if let Some(node) = &volume_node {
            // A generation held only on another node is uploaded first, to be restored there.
            if let (Some(held), Some(snap)) = (pinned.as_deref(), snapshot)
                && held != node
            {
                let workers = self.fleet.refresh().await?;
                self.detach(actor, held, snap, &workers).await?;
                detached = true;
            }
            pinned = Some(node.clone());
        }
        let actor_key = r.to_string();
        let frozen_on = match snapshot {
            Some(s) => self.frozen_worker(&r, s.generation).await,
            None => None,
        };
        // What the restore needs from the worker: a generation restored whole (same template)
        // needs its recorded capabilities (a memory image: CRIU, the user-namespace mode it was
        // dumped in); one captured under another template restores only its volumes.
        let capabilities = match snapshot {
            Some(s) if s.template == actor.template => {
                ate_core::capability::required(&s.requires, s.fidelity)
            }
            _ => Vec::new(),
        };
        // What this resume waits for if it finds no room (its entry in the admission queue).
        let needs = || scheduler::Needs {
            selector: selector.clone(),
            sandbox_class: sandbox_class.to_string(),
            demand,
            capabilities: capabilities.clone(),
        };
        let mut refreshed = false;
        let mut evictions = 0;
        let mut attempt = 0;
        let mut backoff = Backoff::new(Duration::from_millis(10), &BIND_BACKOFF);
        loop {
            let workers = if refreshed {
                self.fleet.workers().await?
            } else {
                self.fleet.refresh().await?
            };
            refreshed = true;
            let suspects = self.suspects(&workers);
            let exclude: Vec<String> = workers
                .iter()
                .filter(|w| suspects.contains(&w.node))
                .map(|w| w.id.clone())
                .collect();
            let req = Requirements {
                selector: selector.clone(),
                sandbox_class,
                node: pinned.as_deref(),
                demand,
                exclude: &exclude,
                capabilities: &capabilities,
            };
            // Room that older waiting resumes fit into is not offered to this one.
            let now = Instant::now();
            let candidates = self.waiters.admissible(&actor_key, &req, &workers, now);
            let Some(worker) = scheduler::pick_preferring(&candidates, frozen_on.as_deref()) else {
                // A detach drops the local copy once the durable one is COMPLETED: never when
                // that durable copy was found damaged (the local one is all that is left).
                if let (Some(node), Some(snap), None) = (pinned.clone(), snapshot, &volume_node)
                    && snap.durable_damage.is_none()
                {
                    let anywhere = Requirements {
                        selector: req.selector.clone(),
                        node: None,
                        ..req
                    };
                    if !self
                        .waiters
                        .admissible(&actor_key, &anywhere, &workers, now)
                        .is_empty()
                    {
                        self.detach(actor, &node, snap, &workers).await?;
                        pinned = None;
                        detached = true;
                        continue;
                    }
                }
                // Slots used as a cache: suspend the least recently used idle actor where
                // room would do, then look again (with the fleet re-read).
                if evictions < MAX_EVICTIONS_PER_PLACEMENT
                    && self.make_room(&workers, &req, &r).await?
                {
                    evictions += 1;
                    refreshed = false;
                    continue;
                }
                self.waiters.no_room(&actor_key, needs(), Instant::now());
                // No worker can restore what the generation holds (not merely no room): the
                // answer names what is missing. Unpinned: a capable worker on another node
                // counts, since the generation would be detached to reach it.
                let anywhere = Requirements {
                    selector: req.selector.clone(),
                    node: None,
                    ..req
                };
                let missing = scheduler::missing_everywhere(&workers, &anywhere);
                if let (false, Some(snap)) = (missing.is_empty(), snapshot) {
                    tracing::warn!(actor = %r, generation = snap.generation, ?missing, "no worker can restore the actor's newest generation; not placed");
                    metrics::counter!(crate::metrics::NO_CAPABLE_WORKER).increment(1);
                    return Err(WorkflowError::NoCapableWorker {
                        missing,
                        generation: snap.generation,
                        fidelity: snap.fidelity,
                    }
                    .into());
                }
                return Err(WorkflowError::NoRoom.into());
            };
            match self
                .store
                .bind_actor(&r, &from, &worker.id, demand, now_ms())
                .instrument(ate_telemetry::trace_span!("bind", worker = %worker.id, attempt))
                .await
            {
                Ok(bound) => {
                    self.waiters.remove(&actor_key);
                    // The frozen-copy row stays: it names this generation only, and the next
                    // suspend replaces or clears it.
                    return Ok(((bound, worker.clone()), detached));
                }
                Err(StoreError::NoRoom { .. }) if attempt < MAX_BIND_RETRIES => {
                    // Lost a race for the worker's last room: back off a little and look again.
                    attempt += 1;
                    tokio::time::sleep(backoff.next_delay(rand::random())).await;
                    self.fleet.refresh().await?;
                }
                Err(StoreError::NoRoom { .. }) => {
                    self.waiters.no_room(&actor_key, needs(), Instant::now());
                    return Err(WorkflowError::NoRoom.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Asks the node holding the actor's local generation to upload it and drop the local copy.
    async fn detach(
        &self,
        actor: &ActorRecord,
        node: &str,
        snap: &SnapshotRecord,
        workers: &[WorkerRecord],
    ) -> Result<(), Failure> {
        let node_address = live_node_address(workers, node).ok_or_else(|| {
            WorkflowError::Unavailable(format!(
                "node {node} holding the actor's snapshot is not registered"
            ))
        })?;
        let r = actor.actor_ref();
        let detached = self
            .nodes
            .detach(&node_address, &r, std::slice::from_ref(snap))
            .await?
            .map_err(|e| {
                WorkflowError::Unavailable(format!("detach from node {node} failed: {}", e.message))
            })?;
        for s in detached {
            let status = s.durable_status;
            self.store
                .update_snapshot_durable(&r, s.generation, status, &s.durable_uri, &s.reason)
                .await?;
            if status == DurableStatus::Completed {
                self.store.clear_snapshot_local(&r, s.generation).await?;
            } else {
                return Err(WorkflowError::Unavailable(format!(
                    "upload of generation {} failed: {}",
                    s.generation, s.reason
                ))
                .into());
            }
        }
        Ok(())
    }
}

/// The node-local copy of `s` can be restored now: recorded, not found damaged, on a node with an
/// ACTIVE worker in the boot that wrote it.
pub(super) fn local_usable(s: &SnapshotRecord, workers: &[WorkerRecord]) -> bool {
    s.local_intact()
        && workers
            .iter()
            .any(|w| w.status == WorkerStatus::Active && w.node == s.node && w.boot_id == s.boot_id)
}

/// A resume may restore `s` now: not skipped by a revert, and a copy not found damaged is usable
/// (the node-local one per [`local_usable`], or a COMPLETED durable one).
pub(super) fn restorable(s: &SnapshotRecord, workers: &[WorkerRecord]) -> bool {
    !s.skipped && (local_usable(s, workers) || s.durable_intact())
}

/// The generation the next resume restores among the actor's own (newest first): the newest
/// [`restorable`] one.
pub(super) fn choose(
    snapshots: Vec<SnapshotRecord>,
    workers: &[WorkerRecord],
) -> Option<SnapshotRecord> {
    snapshots.into_iter().find(|s| restorable(s, workers))
}

/// `s` as a Restore names it to the node: a copy found damaged is left out (its path, or the
/// durable copy's status and URI), so the node never reads it again.
pub(super) fn without_damaged_copies(s: &SnapshotRecord) -> SnapshotRecord {
    let mut s = s.clone();
    if s.local_damage.is_some() {
        s.local_path = None;
    }
    if s.durable_damage.is_some() {
        s.durable_status = None;
        s.durable_uri = None;
    }
    s
}
