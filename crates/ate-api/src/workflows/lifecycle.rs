//! The end of an actor's life and of its generations: RevertActor (CRASHED → SUSPENDED),
//! DeleteActor (with `--force`'s stop without a snapshot, the nodes forgetting its log), and
//! the deletion of removed generations' files (after a delete, and retention after a suspend).

use std::time::Duration;

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_store::{ActorUpdate, SnapshotRecord, StoreError, Transition, WorkerRecord, WorkerStatus};

use super::{ActorView, Api, Failure, live_node_address};
use crate::error::WorkflowError;
use crate::node::NodeClients;

impl Api {
    pub async fn revert(&self, r: &ActorRef) -> Result<ActorView, WorkflowError> {
        r.validate()?;
        self.under_lease(r, async {
            let actor = self.store.get_actor(r).await?;
            match actor.state {
                ActorState::Suspended => Ok(ActorView::bare(actor)),
                ActorState::Crashed => {
                    let a = self.store.release_actor(r, Transition::new(&[ActorState::Crashed], ActorState::Suspended), None, now_ms()).await?;
                    Ok(ActorView::bare(a))
                }
                state => Err(WorkflowError::FailedPrecondition(format!("RevertActor is refused while actor {r} is {state}; it reverts only ACTOR_STATE_CRASHED")).into()),
            }
        })
        .await
    }

    /// Deletes the actor and its generations. `force` also deletes an active actor: its
    /// sandbox is stopped without a snapshot first. Returns whether one was stopped.
    pub async fn delete(&self, r: &ActorRef, force: bool) -> Result<bool, WorkflowError> {
        r.validate()?;
        let (garbage, stopped) = self
            .under_lease(r, async {
                let stopped = if force {
                    self.stop_without_snapshot(r).await?
                } else {
                    false
                };
                match self.store.delete_actor(r).await {
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
        self.forget_on_nodes(r).await;
        Ok(stopped)
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
                    let mut client = self.nodes.client(&w.node_address)?;
                    let call = client.stop(r, &w.id);
                    match tokio::time::timeout(self.cfg.node_call_timeout, call).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
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
    /// (its log). Best effort, concurrently, 3 s per node: a node that misses it keeps a log
    /// file no one reads, which its next `ate delete` of that name removes.
    async fn forget_on_nodes(&self, r: &ActorRef) {
        let Ok(workers) = self.fleet.workers().await else {
            return;
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
            calls.spawn(async move {
                let call = async {
                    match nodes.client(&address) {
                        Ok(mut c) => c.forget_actor(&actor).await.map_err(|e| e.message),
                        Err(e) => Err(e.to_string()),
                    }
                };
                match tokio::time::timeout(Duration::from_secs(3), call).await {
                    Ok(Ok(())) => {}
                    Ok(Err(why)) => tracing::warn!(node = %address, error = %why, "cannot remove a deleted actor's log"),
                    Err(_) => tracing::warn!(node = %address, "removing a deleted actor's log timed out"),
                }
            });
        }
        while calls.join_next().await.is_some() {}
    }

    /// Deletes the files of removed generations: local copies on their node, durable objects via
    /// any live node. Failures are logged with the generation so an operator can clean up.
    async fn collect_garbage(&self, snapshots: Vec<SnapshotRecord>) {
        let Ok(workers) = self.fleet.refresh().await else {
            return;
        };
        delete_snapshot_files(&self.nodes, &workers, snapshots).await;
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
        tokio::spawn(async move { delete_snapshot_files(&nodes, &workers, garbage).await });
    }
}

/// Generations kept per actor besides the newest durable one and tagged ones.
const KEEP_NEWEST_GENERATIONS: usize = 1;

/// Deletes the files of removed generations: local copies on their node, durable objects via
/// any live node. Failures are logged with the generation so an operator can clean up.
async fn delete_snapshot_files(
    nodes: &NodeClients,
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
        let result = match nodes.client(&address) {
            Ok(mut c) => c
                .delete_snapshots(std::slice::from_ref(&snap))
                .await
                .map_err(|e| e.message),
            Err(e) => Err(e.to_string()),
        };
        if let Err(why) = result {
            tracing::warn!(generation = snap.generation, uri = snap.durable_uri.as_deref().unwrap_or_default(), error = %why, "snapshot garbage collection failed");
        }
    }
}
