//! The end of an actor's life and of its generations: RevertActor (CRASHED → SUSPENDED, and
//! the generation the next resume restores), ListGenerations, DeleteActor (with `--force`'s stop
//! without a snapshot, the nodes forgetting its log), and the deletion of removed generations'
//! files (after a delete, and retention after a suspend).

use std::time::Duration;

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState, DurableStatus};
use ate_store::{
    ActorRecord, ActorUpdate, SnapshotRecord, StoreError, Transition, WorkerRecord, WorkerStatus,
};

use super::placement::{choose, local_usable};
use super::{ActorView, Api, Failure, live_node_address};
use crate::error::WorkflowError;
use crate::node_calls::NodeCalls;

/// One of an actor's generations as ListGenerations shows it.
#[derive(Debug, Clone)]
pub struct GenerationView {
    pub snapshot: SnapshotRecord,
    /// Its node-local copy can be restored now.
    pub local_usable: bool,
    /// The next resume restores it.
    pub next: bool,
}

impl Api {
    /// RevertActor: a CRASHED actor goes back to SUSPENDED, and its next resume restores
    /// `generation` (CRASHED or SUSPENDED actors), or without one the newest generation that is
    /// not skipped and has a copy not found damaged; every newer generation is kept but skipped
    /// ([`ate_store::Store::revert_actor`]). A generation the actor lacks (NotFound), found
    /// damaged in every copy or with no usable copy (FailedPrecondition) is refused and nothing
    /// changes.
    pub async fn revert(
        &self,
        r: &ActorRef,
        generation: Option<u64>,
    ) -> Result<ActorView, WorkflowError> {
        r.validate()?;
        self.under_lease(r, async {
            let actor = self.store.get_actor(r).await?;
            match (actor.state, generation) {
                (ActorState::Suspended, None) => Ok(ActorView::bare(actor)),
                (ActorState::Crashed, None) => {
                    let a = self.store.revert_actor(r, &[ActorState::Crashed], None, now_ms()).await?;
                    let next = self.next_generation(&a).await;
                    tracing::info!(actor = %r, next = ?next, "actor reverted");
                    Ok(ActorView::bare(a))
                }
                (ActorState::Crashed | ActorState::Suspended, Some(g)) => {
                    self.check_revert_target(r, g).await?;
                    let from = [ActorState::Crashed, ActorState::Suspended];
                    let a = self.store.revert_actor(r, &from, Some(g), now_ms()).await?;
                    tracing::info!(actor = %r, generation = g, "actor reverted to a chosen generation");
                    Ok(ActorView::bare(a))
                }
                (state, None) => Err(WorkflowError::FailedPrecondition(format!("RevertActor is refused while actor {r} is {state}; it reverts only ACTOR_STATE_CRASHED")).into()),
                (state, Some(_)) => Err(WorkflowError::FailedPrecondition(format!("RevertActor to a generation is refused while actor {r} is {state}; it reverts only ACTOR_STATE_CRASHED or ACTOR_STATE_SUSPENDED actors (suspend it first)")).into()),
            }
        })
        .await
    }

    /// Refuses a revert to generation `g` of `r` that a resume could not restore: NotFound when
    /// the actor lacks it, FailedPrecondition when every copy was found damaged or none is
    /// usable now. The message names the generations that are there.
    async fn check_revert_target(&self, r: &ActorRef, g: u64) -> Result<(), WorkflowError> {
        let snapshots = self.store.list_snapshots(r).await?;
        let listed = || {
            let all: Vec<String> = snapshots.iter().map(|s| s.generation.to_string()).collect();
            if all.is_empty() {
                "it has none".to_string()
            } else {
                format!("it has {}", all.join(", "))
            }
        };
        let see = format!("`ate get generations actor {} -a {}`", r.name, r.atespace);
        let Some(snap) = snapshots.iter().find(|s| s.generation == g) else {
            return Err(WorkflowError::NotFound(format!(
                "actor {r} has no generation {g} ({}; {see})",
                listed()
            )));
        };
        if !snap.local_intact() && !snap.durable_intact() {
            return Err(WorkflowError::FailedPrecondition(format!(
                "generation {g} of actor {r} is damaged ({}); revert to an intact one ({see})",
                damage_text(snap)
            )));
        }
        let workers = self.fleet.refresh().await?;
        if !local_usable(snap, &workers) && !snap.durable_intact() {
            return Err(WorkflowError::FailedPrecondition(format!(
                "generation {g} of actor {r} has no usable copy: {}; revert to another one ({see})",
                unusable_text(snap)
            )));
        }
        Ok(())
    }

    /// The generation the actor's next resume restores, if any (for the log).
    async fn next_generation(&self, actor: &ActorRecord) -> Option<u64> {
        let workers = self.fleet.workers().await.ok()?;
        let snapshots = self.store.list_snapshots(&actor.actor_ref()).await.ok()?;
        choose(snapshots, &workers).map(|s| s.generation)
    }

    /// ListGenerations: the actor's generations, newest first, each with whether its node-local
    /// copy is usable now and whether the next resume restores it (the same choice a resume
    /// makes). NotFound when the actor does not exist.
    pub async fn generations(&self, r: &ActorRef) -> Result<Vec<GenerationView>, WorkflowError> {
        r.validate()?;
        // The actor first: an unknown one is NotFound, not an empty list.
        self.store.get_actor(r).await?;
        let snapshots = self.store.list_snapshots(r).await?;
        let workers = self.fleet.workers().await?;
        let next = choose(snapshots.clone(), &workers).map(|s| s.generation);
        Ok(snapshots
            .into_iter()
            .map(|s| GenerationView {
                local_usable: local_usable(&s, &workers),
                next: Some(s.generation) == next,
                snapshot: s,
            })
            .collect())
    }

    /// Deletes the actor and its generations. `force` also deletes an active actor: its
    /// sandbox is stopped without a snapshot first. `purge_volumes` also removes its external
    /// volume directories (kept otherwise). Returns whether one was stopped, and how many
    /// directories were purged.
    pub async fn delete(
        &self,
        r: &ActorRef,
        force: bool,
        purge_volumes: bool,
    ) -> Result<(bool, u32), WorkflowError> {
        r.validate()?;
        // Named before anything is deleted: the template says where they are.
        let purge_dirs = if purge_volumes {
            self.external_volume_dirs(r).await?
        } else {
            Vec::new()
        };
        let (garbage, stopped) = self
            .under_lease(r, async {
                let stopped = if force {
                    self.stop_without_snapshot(r).await?
                } else {
                    false
                };
                match self.store.delete_actor(r, now_ms()).await {
                    Ok(garbage) => Ok((garbage, stopped)),
                    Err(StoreError::StateConflict { actual, .. }) => Err(WorkflowError::FailedPrecondition(format!(
                        "actor {r} is {actual}; only ACTOR_STATE_SUSPENDED or ACTOR_STATE_CRASHED actors can be deleted (suspend it first, or delete with --force to stop it without a snapshot)"
                    ))
                    .into()),
                    Err(e) => Err(e.into()),
                }
            })
            .await?;
        let key = format!("{}/{}", r.atespace, r.name);
        self.waiters.remove(&key);
        if !garbage.is_empty() {
            self.collect_garbage(garbage).await;
        }
        let purged = self.forget_on_nodes(r, &purge_dirs).await;
        if purge_volumes {
            tracing::info!(actor = %r, dirs = ?purge_dirs, purged, "external volumes purged");
        }
        Ok((stopped, purged))
    }

    /// The node directories of the actor's external volumes, from its template.
    async fn external_volume_dirs(&self, r: &ActorRef) -> Result<Vec<String>, WorkflowError> {
        let actor = self.store.get_actor(r).await?;
        let t = &actor.template;
        let template = self
            .store
            .get_template(&t.namespace, &t.name)
            .await
            .map_err(|e| match e {
                StoreError::NotFound(_) => WorkflowError::FailedPrecondition(format!(
                    "cannot purge the external volumes of {r}: its template {}/{} is gone; \
                     nothing was deleted",
                    t.namespace, t.name
                )),
                e => e.into(),
            })?;
        Ok(template
            .spec
            .volumes
            .iter()
            .filter_map(|v| v.external_dir(&r.atespace, &r.name))
            .map(|d| d.display().to_string())
            .collect())
    }

    /// For a forced delete (under the actor's lease): an active actor's sandbox is stopped
    /// without a snapshot and the actor released to SUSPENDED. A worker that is gone has no
    /// sandbox left to stop. True if the actor was active.
    async fn stop_without_snapshot(&self, r: &ActorRef) -> Result<bool, Failure> {
        let actor = self.store.get_actor(r).await?;
        let active = [
            ActorState::Running,
            ActorState::Suspending,
            ActorState::Resuming,
        ];
        if !active.contains(&actor.state) {
            return Ok(false);
        }
        if let Some(id) = &actor.worker_id {
            match self.store.get_worker(id).await {
                Ok(w) if w.status == WorkerStatus::Active => {
                    let call = self.nodes.stop(&w.node_address, r, &w.id);
                    match tokio::time::timeout(self.cfg.node_call_timeout, call).await {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Err(e)) => return Err(e.into()),
                        Ok(Ok(Err(e))) => {
                            return Err(WorkflowError::Unavailable(format!(
                                "cannot stop actor {r} on worker {}: {}; nothing was deleted",
                                w.id, e.message
                            ))
                            .into());
                        }
                        Err(_) => {
                            return Err(WorkflowError::Unavailable(format!(
                                "stopping actor {r} on worker {} timed out; nothing was deleted",
                                w.id
                            ))
                            .into());
                        }
                    }
                }
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.store
            .release_actor(
                r,
                Transition::new(&active, ActorState::Suspended).with(ActorUpdate::with_error(
                    "deleted with --force: stopped without a snapshot",
                )),
                None,
                now_ms(),
            )
            .await?;
        tracing::warn!(actor = %r, state = %actor.state, "actor stopped without a snapshot for a forced delete");
        Ok(true)
    }

    /// Asks every live node to drop what it keeps of a deleted actor outside its generations
    /// (its log, and the external volume directories in `purge_dirs`). Best effort,
    /// concurrently, 3 s per node: a node that misses it keeps a log file no one reads, which
    /// its next `ate delete` of that name removes. Returns the directories removed.
    async fn forget_on_nodes(&self, r: &ActorRef, purge_dirs: &[String]) -> u32 {
        let Ok(workers) = self.fleet.workers().await else {
            return 0;
        };
        let mut nodes: Vec<String> = workers
            .iter()
            .filter(|w| w.status == WorkerStatus::Active)
            .map(|w| w.node_address.clone())
            .collect();
        nodes.sort();
        nodes.dedup();
        let mut calls = tokio::task::JoinSet::new();
        for address in nodes {
            let nodes = self.nodes.clone();
            let actor = r.clone();
            let dirs = purge_dirs.to_vec();
            calls.spawn(async move {
                let call = async {
                    match nodes.forget_actor(&address, &actor, dirs).await {
                        Ok(answer) => answer.map_err(|e| e.message),
                        Err(e) => Err(e.to_string()),
                    }
                };
                match tokio::time::timeout(Duration::from_secs(3), call).await {
                    Ok(Ok(removed)) => removed,
                    Ok(Err(why)) => {
                        tracing::warn!(node = %address, error = %why, "cannot remove a deleted actor's log or volumes");
                        0
                    }
                    Err(_) => {
                        tracing::warn!(node = %address, "removing a deleted actor's log timed out");
                        0
                    }
                }
            });
        }
        let mut removed = 0;
        while let Some(r) = calls.join_next().await {
            removed += r.unwrap_or(0);
        }
        removed
    }

    /// Deletes the files of removed generations: local copies on their node, durable objects via
    /// any live node. Failures are logged with the generation so an operator can clean up.
    async fn collect_garbage(&self, snapshots: Vec<SnapshotRecord>) {
        let Ok(workers) = self.fleet.refresh().await else {
            return;
        };
        delete_snapshot_files(self.nodes.as_ref(), &workers, snapshots).await;
    }

    /// Retention after a suspend: drops generation records no resume would choose any more (see
    /// [`ate_store::Store::prune_snapshots`]) and deletes their files in the background, so a
    /// suspend does not wait for object-store deletes.
    pub(super) async fn prune_generations(&self, r: &ActorRef) {
        let garbage = match self.store.prune_snapshots(r, KEEP_NEWEST_GENERATIONS).await {
            Ok(g) if g.is_empty() => return,
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(actor = %r, error = %e, "pruning old generations failed; they stay until the next suspend");
                return;
            }
        };
        let Ok(workers) = self.fleet.workers().await else {
            return;
        };
        let nodes = self.nodes.clone();
        tokio::spawn(async move { delete_snapshot_files(nodes.as_ref(), &workers, garbage).await });
    }
}

/// Generations a resume could choose kept per actor (the newest, and the one before it: what a
/// revert goes back to when the newest is found damaged), besides the newest with a COMPLETED
/// durable copy and tagged ones.
const KEEP_NEWEST_GENERATIONS: usize = 2;

/// Deletes the files of removed generations: local copies on their node, durable objects via
/// any live node. Failures are logged with the generation so an operator can clean up.
async fn delete_snapshot_files(
    nodes: &dyn NodeCalls,
    workers: &[WorkerRecord],
    snapshots: Vec<SnapshotRecord>,
) {
    let any_node = workers
        .iter()
        .find(|w| w.status == WorkerStatus::Active)
        .map(|w| w.node_address.clone());
    for snap in snapshots {
        let target = live_node_address(workers, &snap.node).or_else(|| any_node.clone());
        let Some(address) = target else {
            tracing::warn!(actor = %format!("{}/{}", snap.atespace, snap.name), generation = snap.generation, uri = snap.durable_uri.as_deref().unwrap_or_default(), "no live node to delete snapshot files");
            continue;
        };
        let result = match nodes
            .delete_snapshots(&address, std::slice::from_ref(&snap))
            .await
        {
            Ok(answer) => answer.map_err(|e| e.message),
            Err(e) => Err(e.to_string()),
        };
        if let Err(why) = result {
            tracing::warn!(generation = snap.generation, uri = snap.durable_uri.as_deref().unwrap_or_default(), error = %why, "snapshot garbage collection failed");
        }
    }
}

/// What was found damaged in `s`'s copies, for a refusal.
fn damage_text(s: &SnapshotRecord) -> String {
    let mut parts = Vec::new();
    if let Some(why) = &s.local_damage {
        parts.push(format!("node-local copy on node {}: {why}", s.node));
    } else if s.local_path.is_none() {
        parts.push("no node-local copy".to_string());
    }
    if let Some(why) = &s.durable_damage {
        parts.push(format!("durable copy: {why}"));
    } else if s.durable_status != Some(DurableStatus::Completed) {
        parts.push(durable_text(s));
    }
    parts.join("; ")
}

/// Why none of `s`'s copies that were not found damaged can be restored now.
fn unusable_text(s: &SnapshotRecord) -> String {
    let local = if s.local_path.is_none() {
        "no node-local copy".to_string()
    } else {
        format!(
            "its node-local copy is on node {}, which has no live worker in the boot that wrote it",
            s.node
        )
    };
    format!("{local}, and {}", durable_text(s))
}

fn durable_text(s: &SnapshotRecord) -> String {
    if let Some(why) = &s.durable_damage {
        return format!("its durable copy was found damaged ({why})");
    }
    match s.durable_status {
        None => "no durable copy".to_string(),
        Some(DurableStatus::Pending) => "its durable copy is still PENDING".to_string(),
        Some(DurableStatus::Failed) => "its durable copy FAILED".to_string(),
        Some(DurableStatus::Completed) => "a COMPLETED durable copy".to_string(),
    }
}
