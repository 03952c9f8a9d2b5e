//! SuspendActor: RUNNING → SUSPENDING → the node's checkpoint → SUSPENDED with the new
//! generation (or back to RUNNING when nothing was written), then the frozen-copy hint and
//! generation retention.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_store::{ActorRecord, ActorUpdate, StoreError, Transition, WorkerRecord, WorkerStatus};
use tokio::time::error::Elapsed;

use super::{ActorView, Api, Failure, FaultPoint, crashed, transient, worker_unavailable};
use crate::error::WorkflowError;
use crate::node::{Checkpointed, NodeError, NodeErrorKind, Workload};

/// How long a suspend keeps asking a node that does not answer (restarting), and the pauses
/// between its tries (doubling).
const SUSPEND_RETRY_WINDOW: Duration = Duration::from_secs(20);
const SUSPEND_RETRY_FIRST: Duration = Duration::from_millis(200);
const SUSPEND_RETRY_MAX: Duration = Duration::from_secs(2);

/// The uuid of the generation a suspend of `actor`'s current activation writes as `generation`:
/// derived (UUID v5), so that every attempt of one suspend names the same generation, and no
/// two suspends do (the actor's uid is its own, and each activation suspends at most once
/// successfully).
fn suspend_uuid(actor: &ActorRecord, generation: u64) -> String {
    let name = format!(
        "ate-suspend/{}/{generation}/{}",
        actor.uid, actor.activation
    );
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

impl Api {
    /// SuspendActor; `cause` says why (idle, requested by whom, evicted for whom), for the
    /// actor's events.
    pub async fn suspend(
        &self,
        r: &ActorRef,
        durable: bool,
        cause: &str,
    ) -> Result<ActorView, WorkflowError> {
        self.suspend_with_grace(r, durable, 0, cause).await
    }

    /// [`Self::suspend`] giving requests in flight `grace_ms` to finish (0: the worker's default).
    pub async fn suspend_with_grace(
        &self,
        r: &ActorRef,
        durable: bool,
        grace_ms: u32,
        cause: &str,
    ) -> Result<ActorView, WorkflowError> {
        r.validate()?;
        let actor = self.store.get_actor(r).await?;
        match actor.state {
            ActorState::Suspended => return Ok(self.actor_view(actor).await),
            ActorState::Crashed => return Err(crashed(r, &actor.last_error)),
            ActorState::Resuming => return Err(transient(r, actor.state)),
            ActorState::Running | ActorState::Suspending => {}
        }
        let started = Instant::now();
        let result = self
            .under_lease(r, self.suspend_locked(r, durable, grace_ms, cause))
            .await;
        let outcome = match &result {
            Ok(_) => "suspended",
            Err(e) => e.outcome(),
        };
        crate::metrics::suspended(outcome, started);
        result
    }

    async fn suspend_locked(
        &self,
        r: &ActorRef,
        durable: bool,
        grace_ms: u32,
        cause: &str,
    ) -> Result<ActorView, Failure> {
        let note = || Some(cause.to_string()).filter(|c| !c.is_empty());
        let actor = match self.mark_suspending(r, note()).await? {
            ControlFlow::Break(suspended) => return Ok(suspended),
            ControlFlow::Continue(actor) => actor,
        };
        self.faults.fire(FaultPoint::SuspendAfterSuspending)?;
        let Some(worker) = self.active_worker_of(&actor).await? else {
            return self.release_without_worker(r, note()).await;
        };
        let t = &actor.template;
        let template = self.store.get_template(&t.namespace, &t.name).await?;
        let generation = actor.generation + 1;
        let workload = Workload {
            actor: &actor,
            template: &template,
            worker_id: &worker.id,
        };
        let answer = self
            .checkpoint_on_node(r, &workload, &worker, generation, durable, grace_ms)
            .await?;
        let reply = match answer {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => {
                return Err(self
                    .settle_failed_checkpoint(r, &worker, actor.generation, &error, note())
                    .await);
            }
            Err(_) => {
                return Err(WorkflowError::Unavailable(format!(
                    "worker {} did not answer the checkpoint in time",
                    worker.id
                ))
                .into());
            }
        };
        let suspended = Suspended {
            worker: &worker,
            generation,
            durable,
            note: note(),
        };
        self.record_suspended(r, reply, suspended).await
    }

    /// Re-reads the actor under the lease: RUNNING becomes SUSPENDING (with `note`), a
    /// SUSPENDING one (an earlier attempt cut off) is taken on, a SUSPENDED one is the answer
    /// (`Break`).
    async fn mark_suspending(
        &self,
        r: &ActorRef,
        note: Option<String>,
    ) -> Result<ControlFlow<ActorView, ActorRecord>, Failure> {
        let actor = self.store.get_actor(r).await?;
        match actor.state {
            ActorState::Suspended => Ok(ControlFlow::Break(self.actor_view(actor).await)),
            ActorState::Crashed => Err(crashed(r, &actor.last_error).into()),
            ActorState::Resuming => Err(transient(r, actor.state).into()),
            ActorState::Running => {
                let actor = self
                    .store
                    .transition(
                        r,
                        Transition::new(&[ActorState::Running], ActorState::Suspending).with(
                            ActorUpdate {
                                note,
                                ..ActorUpdate::default()
                            },
                        ),
                        now_ms(),
                    )
                    .await?;
                Ok(ControlFlow::Continue(actor))
            }
            ActorState::Suspending => Ok(ControlFlow::Continue(actor)),
        }
    }

    /// The actor's worker, if it is still registered and active.
    async fn active_worker_of(&self, actor: &ActorRecord) -> Result<Option<WorkerRecord>, Failure> {
        Ok(match &actor.worker_id {
            Some(id) => match self.store.get_worker(id).await {
                Ok(w) if w.status == WorkerStatus::Active => Some(w),
                Ok(_) | Err(StoreError::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        })
    }

    /// Its worker is gone, and with it the sandbox: the last generation is what remains.
    async fn release_without_worker(
        &self,
        r: &ActorRef,
        note: Option<String>,
    ) -> Result<ActorView, Failure> {
        let update = ActorUpdate {
            note,
            ..ActorUpdate::with_error("worker gone before the suspend; last generation kept")
        };
        let a = self
            .store
            .release_actor(
                r,
                Transition::new(&SUSPENDING, ActorState::Suspended).with(update),
                None,
                now_ms(),
            )
            .await?;
        Ok(ActorView::bare(a))
    }

    /// The node's checkpoint of `generation`, asked again while the node or the worker is
    /// restarting (within [`SUSPEND_RETRY_WINDOW`]); each try bounded by the node call timeout.
    async fn checkpoint_on_node(
        &self,
        r: &ActorRef,
        workload: &Workload<'_>,
        worker: &WorkerRecord,
        generation: u64,
        durable: bool,
        grace_ms: u32,
    ) -> Result<Result<Result<Checkpointed, NodeError>, Elapsed>, Failure> {
        // The same for every attempt of this suspend (api, node or worker restarted in the
        // middle): the node writes the same generation directory, and a worker that already
        // sealed it answers from it instead of losing it.
        let uuid = suspend_uuid(workload.actor, generation);
        let began = Instant::now();
        let mut pause = SUSPEND_RETRY_FIRST;
        loop {
            let call = self.nodes.checkpoint(
                &worker.node_address,
                workload,
                generation,
                uuid.clone(),
                workload.template.spec.fidelity,
                durable,
                grace_ms,
            );
            match tokio::time::timeout(self.cfg.node_call_timeout, call).await {
                // The node or the worker is restarting (killed in the middle, say): ask again
                // while the lease holds, rather than leave the actor SUSPENDING until it
                // goes stale.
                Ok(Ok(Err(error)))
                    if error.kind == NodeErrorKind::Transient
                        && began.elapsed() < SUSPEND_RETRY_WINDOW =>
                {
                    tracing::info!(actor = %r, worker = %worker.id, error = %error.message, retry_in_ms = pause.as_millis() as u64, "checkpoint call failed; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(SUSPEND_RETRY_MAX);
                }
                // No client for the node's address: the api's own error, no call made.
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(answer)) => return Ok(Ok(answer)),
                Err(elapsed) => return Ok(Err(elapsed)),
            }
        }
    }

    /// After a checkpoint the node answered with an error: the actor RUNNING again (nothing
    /// written, it runs on), SUSPENDED at its previous generation (the sandbox lost), or
    /// CRASHED; a transient error leaves it SUSPENDING for the next attempt. The answer.
    async fn settle_failed_checkpoint(
        &self,
        r: &ActorRef,
        worker: &WorkerRecord,
        previous_generation: u64,
        error: &NodeError,
        note: Option<String>,
    ) -> Failure {
        // Nothing was written (disk full, …) and the worker put the actor back to work:
        // it is RUNNING again, with the reason in lastError.
        if error.kind == NodeErrorKind::Aborted {
            let why = format!("suspend failed on worker {}: {}", worker.id, error.message);
            tracing::warn!(actor = %r, worker = %worker.id, error = %error.message, "suspend failed; the actor runs on");
            let update = ActorUpdate {
                note,
                ..ActorUpdate::with_error(why.clone())
            };
            let to = Transition::new(&SUSPENDING, ActorState::Running).with(update);
            if let Err(e) = self.store.transition(r, to, now_ms()).await {
                return e.into();
            }
            return WorkflowError::Unavailable(why).into();
        }
        if error.is_transient() {
            return worker_unavailable(&worker.id, error).into();
        }
        let (why, to) = if error.kind == NodeErrorKind::SandboxLost {
            // The checkpoint failed and the sandbox with it (a dump killed inside the actor's
            // processes): nothing runs any more and nothing was written, so the actor is back
            // at its previous generation; it resumes from there on the next request.
            let why = format!(
                "suspend failed on worker {} and the actor's sandbox did not survive it; back at generation {} (what it did since is lost): {}",
                worker.id, previous_generation, error.message
            );
            tracing::error!(actor = %r, worker = %worker.id, error = %error.message, "suspend lost the sandbox; the previous generation stands");
            (why, ActorState::Suspended)
        } else {
            // Nothing usable was written; the previous generation stays the newest.
            let why = format!(
                "checkpoint on worker {} failed: {}",
                worker.id, error.message
            );
            (why, ActorState::Crashed)
        };
        let update = ActorUpdate {
            note,
            ..ActorUpdate::with_error(why.clone())
        };
        let to = Transition::new(&SUSPENDING, to).with(update);
        if let Err(e) = self.store.release_actor(r, to, None, now_ms()).await {
            return e.into();
        }
        WorkflowError::Internal(why).into()
    }

    /// SUSPENDED with the generation the node wrote (and what restoring it needs), then the
    /// frozen-copy hint and generation retention.
    async fn record_suspended(
        &self,
        r: &ActorRef,
        reply: Checkpointed,
        done: Suspended<'_>,
    ) -> Result<ActorView, Failure> {
        let (worker, generation) = (done.worker, done.generation);
        let mut snap = reply
            .snapshot
            .filter(|s| s.generation == generation)
            .ok_or_else(|| {
                WorkflowError::Internal(format!(
                    "node returned no valid snapshot for generation {generation}"
                ))
            })?;
        // What restoring it needs (a memory image: CRIU and this worker's user-namespace mode);
        // the scheduler places the actor only on a worker offering all of it.
        snap.requires = ate_core::capability::required_by_generation(
            snap.fidelity,
            &ate_core::capability::offered(&worker.capabilities, worker.can_restore_memory),
        );
        self.faults.fire(FaultPoint::SuspendAfterCheckpoint)?;
        let update = ActorUpdate {
            last_error: Some(snap.reason.clone()),
            note: done.note,
            ..ActorUpdate::default()
        };
        let a = self
            .store
            .release_actor(
                r,
                Transition::new(&SUSPENDING, ActorState::Suspended).with(update),
                Some(&snap),
                now_ms(),
            )
            .await?;
        self.note_frozen_copy(r, reply.kept_frozen.then_some((&worker.id, generation)))
            .await;
        tracing::info!(actor = %r, generation, fidelity = %snap.fidelity, durable = done.durable, kept_frozen = reply.kept_frozen, "actor suspended");
        self.prune_generations(r).await;
        Ok(ActorView::bare(a))
    }
}

/// The states a suspend moves the actor from once it has begun.
const SUSPENDING: [ActorState; 1] = [ActorState::Suspending];

/// A checkpoint the node wrote, to be recorded.
struct Suspended<'a> {
    worker: &'a WorkerRecord,
    generation: u64,
    durable: bool,
    note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uid: &str, activation: u64) -> ActorRecord {
        ActorRecord {
            atespace: "a".into(),
            name: "b".into(),
            uid: uid.into(),
            template: ate_core::TemplateRef::new("a", "t"),
            state: ActorState::Suspending,
            worker_selector: Default::default(),
            worker_id: Some("w-1".into()),
            epoch: 1,
            generation: 3,
            attached_node: None,
            last_error: None,
            created_ms: 0,
            updated_ms: 0,
            activation,
        }
    }

    #[test]
    fn every_attempt_of_one_suspend_names_the_same_generation_and_no_other_suspend_does() {
        let a = record("uid-1", 7);
        assert_eq!(suspend_uuid(&a, 4), suspend_uuid(&a, 4));
        assert_ne!(suspend_uuid(&a, 4), suspend_uuid(&a, 5));
        assert_ne!(suspend_uuid(&a, 4), suspend_uuid(&record("uid-1", 8), 4));
        assert_ne!(suspend_uuid(&a, 4), suspend_uuid(&record("uid-2", 7), 4));
        assert!(uuid::Uuid::parse_str(&suspend_uuid(&a, 4)).is_ok());
    }
}
