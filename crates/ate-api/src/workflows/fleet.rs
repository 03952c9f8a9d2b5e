//! What the node agents report about their workers and actors: exits, heartbeats (worker
//! expiry), re-registration (reconciliation and re-adoption) and the release of a gone
//! worker's actors.

use std::time::Duration;

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_store::{ActorRecord, ActorUpdate, StoreError, Transition, WorkerStatus};

use super::{Api, Damage, demand};
use crate::error::WorkflowError;

/// An actor a worker reports holding at its registration, with the activation its copy runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldActor {
    pub actor: ActorRef,
    pub activation: u64,
}

/// A worker's report that all of an actor's processes exited (or that it ended them).
#[derive(Debug, Clone, Copy)]
pub struct ActorExit<'a> {
    pub worker_id: &'a str,
    /// The activation of the copy that exited (0: unknown, from an older node).
    pub activation: u64,
    pub exit_code: i32,
    pub last_lines: &'a str,
    pub crash_reason: &'a str,
    pub damage: Option<&'a Damage>,
}

impl Api {
    /// A worker saw all of an actor's processes exit while RUNNING: release its capacity at once
    /// and leave it SUSPENDED with its last usable generation. With a `crash_reason` the worker
    /// ended the actor because it must not run on (its restored memory could not be completed):
    /// it becomes CRASHED with that reason, for an operator to look at before RevertActor. With
    /// `damage` too (the lazy restore found the generation it read damaged), those copies are
    /// marked damaged after the crash is recorded, so no resume chooses them again.
    ///
    /// A report for another activation than the record's is stale and ignored. One for the
    /// activation whose resume is still being recorded (RESUMING on this worker: the copy ended
    /// between the worker's answer and the commit of RUNNING) is answered with
    /// [`WorkflowError::LeaseHeld`] (ABORTED), and the node sends it again: ignoring it left the
    /// actor RUNNING with no sandbox.
    pub async fn actor_exited(
        &self,
        r: &ActorRef,
        exit: ActorExit<'_>,
    ) -> Result<(), WorkflowError> {
        r.validate()?;
        let ActorExit {
            worker_id,
            activation,
            exit_code,
            last_lines,
            crash_reason,
            damage,
        } = exit;
        let actor = self.store.get_actor(r).await?;
        if activation != 0 && actor.activation != activation {
            return Ok(());
        }
        if actor.worker_id.as_deref() != Some(worker_id) {
            return Ok(());
        }
        if actor.state == ActorState::Resuming && activation != 0 {
            return Err(WorkflowError::LeaseHeld(r.clone()));
        }
        if actor.state != ActorState::Running {
            return Ok(());
        }
        let tail: String = last_lines
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let (why, next) = if crash_reason.is_empty() {
            (
                format!(
                    "all processes exited (code {exit_code}) on worker {worker_id}; last log lines:\n{tail}"
                ),
                ActorState::Suspended,
            )
        } else {
            (
                format!("worker {worker_id} stopped the actor: {crash_reason}"),
                ActorState::Crashed,
            )
        };
        let update = ActorUpdate::with_error(why.clone());
        match self
            .store
            .release_actor(
                r,
                Transition::new(&[ActorState::Running], next).with(update),
                None,
                now_ms(),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(actor = %r, worker = %worker_id, activation, state = ?next, reason = ?why, "actor ended on its worker");
            }
            Err(StoreError::StateConflict { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        if let Some(damage) = damage.filter(|_| next == ActorState::Crashed) {
            self.record_damage(r, damage).await;
        }
        Ok(())
    }

    /// Marks workers without a heartbeat for the lease plus a margin GONE; their RESUMING actors
    /// go to CRASHED, their RUNNING actors to SUSPENDED with their last snapshot; SUSPENDING ones
    /// stay for the next request to finish (see `release_gone`).
    ///
    /// Only time in which this api could hear heartbeats counts: after its own start or a store
    /// outage it waits a whole lease plus the margin before it expires anyone, so an api restart
    /// or an outage of any length marks no live worker GONE. By the time a worker is expired its
    /// node has been unable to renew for longer than the lease, so the worker has fenced itself
    /// (atunnel refuses its actors' traffic) and releasing its actors cannot run them twice.
    pub async fn expire_workers(&self) -> Result<Vec<String>, StoreError> {
        let now = now_ms();
        let after = i64::try_from(self.expiry_after().as_millis()).unwrap_or(i64::MAX);
        let hearing_since = self
            .hearing_since_ms
            .load(std::sync::atomic::Ordering::Acquire);
        if now.saturating_sub(hearing_since) <= after {
            return Ok(Vec::new());
        }
        let gone = match self.store.expire_workers(now - after).await {
            Ok(gone) => gone,
            Err(e) => {
                self.store_outage_seen();
                return Err(e);
            }
        };
        for id in &gone {
            let _worker = self.lock_worker(id).await;
            // Registered again since it was marked: that registration reconciled its actors.
            if let Ok(w) = self.store.get_worker(id).await
                && w.status != WorkerStatus::Gone
            {
                tracing::info!(worker = %id, "worker registered again right after it was marked GONE; its registration kept what it holds");
                continue;
            }
            tracing::warn!(worker = %id, silent_for_ms = after, "worker stopped heartbeating; marked GONE");
            self.release_actors_of(id).await?;
        }
        if !gone.is_empty() {
            self.fleet.refresh().await?;
        }
        Ok(gone)
    }

    /// How long a worker may go without a heartbeat before it is expired: the lease it was
    /// given plus a margin for clock and scheduling skew between its node and the api.
    pub fn expiry_after(&self) -> Duration {
        self.cfg.heartbeat_timeout + self.cfg.heartbeat_timeout / 5
    }

    pub async fn release_actors_of(&self, worker_id: &str) -> Result<(), StoreError> {
        self.release_actors_of_worker(worker_id, false).await
    }

    /// Reconciles a (re-)registered worker with the actors it reports holding (each with its
    /// activation token); returns the held copies the worker must discard.
    ///
    /// - held with the activation the record names on this worker: kept as it is (a RUNNING
    ///   actor re-adopted by a restarted worker goes on with nothing lost);
    /// - any other held copy (the actor moved, was released while the worker was unreachable,
    ///   was deleted, or holds a newer activation now): discarded on the worker;
    /// - `restarted` (a new epoch, or the worker was GONE): RUNNING actors the worker does not
    ///   hold go to SUSPENDED with their last generation; SUSPENDING ones stay for the next
    ///   request to finish their suspend (answered from a generation the worker sealed);
    ///   RESUMING ones stay bound (a restore interrupted by a worker restart is transient:
    ///   spec, resume "Finalize"), so the next ResumeActor re-binds and restores there.
    ///
    /// Without `restarted` (the node agent restarted, same worker process) an actor that is not
    /// held is left alone: a resume may have finished after the node listed the worker's actors,
    /// and real exits are reported by the exit watcher.
    pub async fn reconcile_worker(
        &self,
        worker_id: &str,
        held: &[HeldActor],
        restarted: bool,
    ) -> Result<Vec<HeldActor>, StoreError> {
        let on_worker = self.store.actors_on_worker(worker_id).await?;
        let mut discard = Vec::new();
        for h in held {
            let a = &h.actor;
            let current = on_worker
                .iter()
                .find(|r| r.atespace == a.atespace && r.name == a.name);
            let mut keep = current.is_some_and(|r| r.activation == h.activation);
            if !keep && current.is_none() {
                keep = self.readopt(worker_id, a, h.activation).await;
            }
            if !keep {
                tracing::warn!(actor = %format!("{}/{}", a.atespace, a.name), worker = %worker_id, activation = h.activation, current = ?current.map(|r| (r.state, r.activation)), "worker holds a stale copy of the actor; discarding it");
                discard.push(h.clone());
            } else {
                tracing::info!(actor = %format!("{}/{}", a.atespace, a.name), worker = %worker_id, activation = h.activation, "worker still holds the actor; kept");
            }
        }
        if restarted {
            for a in on_worker {
                let held_now = held.iter().any(|h| {
                    h.activation == a.activation
                        && h.actor.atespace == a.atespace
                        && h.actor.name == a.name
                });
                if held_now {
                    continue;
                }
                self.release_gone(worker_id, &a, true).await?;
            }
        }
        Ok(discard)
    }

    /// A worker came back holding an actor the api released while it was unreachable: if no
    /// one activated the actor since (same token, still SUSPENDED), the running copy is taken
    /// back with nothing lost. False when it cannot be (the copy is then discarded).
    async fn readopt(&self, worker_id: &str, a: &ActorRef, activation: u64) -> bool {
        let Ok(actor) = self.store.get_actor(a).await else {
            return false;
        };
        if actor.state != ActorState::Suspended || actor.activation != activation {
            return false;
        }
        let t = &actor.template;
        let Ok(template) = self.store.get_template(&t.namespace, &t.name).await else {
            return false;
        };
        match self
            .store
            .readopt_actor(a, worker_id, activation, demand(&template), now_ms())
            .await
        {
            Ok(_) => {
                tracing::info!(actor = %format!("{}/{}", a.atespace, a.name), worker = %worker_id, activation, "re-adopted an actor released while its worker was unreachable; nothing lost");
                true
            }
            Err(e) => {
                tracing::info!(actor = %format!("{}/{}", a.atespace, a.name), worker = %worker_id, activation, error = %e, "cannot re-adopt");
                false
            }
        }
    }

    async fn release_actors_of_worker(
        &self,
        worker_id: &str,
        restarted: bool,
    ) -> Result<(), StoreError> {
        for a in self.store.actors_on_worker(worker_id).await? {
            self.release_gone(worker_id, &a, restarted).await?;
        }
        Ok(())
    }

    /// Releases one actor of a worker that is gone (or restarted without it).
    async fn release_gone(
        &self,
        worker_id: &str,
        a: &ActorRecord,
        restarted: bool,
    ) -> Result<(), StoreError> {
        let (to, why) = match a.state {
            ActorState::Resuming if restarted => return Ok(()),
            // The restore was never confirmed and its generation is intact: the next request
            // resumes it elsewhere, with no revert needed.
            ActorState::Resuming => (
                ActorState::Suspended,
                format!(
                    "worker {worker_id} gone during the resume; resumes from the last generation"
                ),
            ),
            // Its suspend may have sealed a generation whose answer was lost with the node (kill
            // -9 of the node agent past the expiry): released to the last generation the api
            // knows, what the actor did since would be lost (fault suite 2026-12-03). Left
            // SUSPENDING, the next request finishes the suspend (`resume`): the worker, back,
            // answers from the sealed generation; still gone, the suspend releases the actor to
            // its last generation then.
            ActorState::Suspending => return Ok(()),
            ActorState::Running => (
                ActorState::Suspended,
                format!("worker {worker_id} gone; resumes from the last generation"),
            ),
            _ => return Ok(()),
        };
        tracing::warn!(actor = %format!("{}/{}", a.atespace, a.name), worker = %worker_id, from = %a.state, to = %to, "releasing an actor of a gone worker");
        let update = ActorUpdate::with_error(why);
        match self
            .store
            .release_actor(
                &a.actor_ref(),
                Transition::new(&[a.state], to).with(update),
                None,
                now_ms(),
            )
            .await
        {
            Ok(_) | Err(StoreError::StateConflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        self.cfg.heartbeat_timeout
    }

    /// See [`crate::ApiConfig::sole_replica`].
    pub fn sole_replica(&self) -> bool {
        self.cfg.sole_replica
    }
}
