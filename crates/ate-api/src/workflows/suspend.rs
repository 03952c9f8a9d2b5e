//! SuspendActor: RUNNING → SUSPENDING → the node's checkpoint → SUSPENDED with the new
//! generation (or back to RUNNING when nothing was written), then the frozen-copy hint and
//! generation retention.

use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_store::{ActorRecord, ActorUpdate, StoreError, Transition, WorkerStatus};

use super::{ActorView, Api, Failure, FaultPoint, crashed, transient, worker_unavailable};
use crate::error::WorkflowError;
use crate::node::{NodeErrorKind, Workload};

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
    pub async fn suspend(&self, r: &ActorRef, durable: bool) -> Result<ActorView, WorkflowError> {
        self.suspend_with_grace(r, durable, 0).await
    }

    /// [`Self::suspend`] giving requests in flight `grace_ms` to finish (0: the worker's default).
    pub async fn suspend_with_grace(
        &self,
        r: &ActorRef,
        durable: bool,
        grace_ms: u32,
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
            .under_lease(r, self.suspend_locked(r, durable, grace_ms))
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
    ) -> Result<ActorView, Failure> {
        let mut actor = self.store.get_actor(r).await?;
        match actor.state {
            ActorState::Suspended => return Ok(self.actor_view(actor).await),
            ActorState::Crashed => return Err(crashed(r, &actor.last_error).into()),
            ActorState::Resuming => return Err(transient(r, actor.state).into()),
            ActorState::Running => {
                actor = self
                    .store
                    .transition(
                        r,
                        Transition::new(&[ActorState::Running], ActorState::Suspending),
                        now_ms(),
                    )
                    .await?;
            }
            ActorState::Suspending => {}
        }
        self.faults.fire(FaultPoint::SuspendAfterSuspending)?;
        let from = [ActorState::Suspending];
        let worker = match &actor.worker_id {
            Some(id) => match self.store.get_worker(id).await {
                Ok(w) if w.status == WorkerStatus::Active => Some(w),
                Ok(_) | Err(StoreError::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        let Some(worker) = worker else {
            // Its worker is gone, and with it the sandbox: the last generation is what remains.
            let update =
                ActorUpdate::with_error("worker gone before the suspend; last generation kept");
            let a = self
                .store
                .release_actor(
                    r,
                    Transition::new(&from, ActorState::Suspended).with(update),
                    None,
                    now_ms(),
                )
                .await?;
            return Ok(ActorView::bare(a));
        };
        let t = &actor.template;
        let template = self.store.get_template(&t.namespace, &t.name).await?;
        let generation = actor.generation + 1;
        let workload = Workload {
            actor: &actor,
            template: &template,
            worker_id: &worker.id,
        };
        // The same for every attempt of this suspend (api, node or worker restarted in the
        // middle): the node writes the same generation directory, and a worker that already
        // sealed it answers from it instead of losing it.
        let uuid = suspend_uuid(&actor, generation);
        let began = Instant::now();
        let mut pause = SUSPEND_RETRY_FIRST;
        let answer = loop {
            let mut client = self.nodes.client(&worker.node_address)?;
            let call = client.checkpoint(
                &workload,
                generation,
                uuid.clone(),
                template.spec.fidelity,
                durable,
                grace_ms,
            );
            match tokio::time::timeout(self.cfg.node_call_timeout, call).await {
                // The node or the worker is restarting (killed in the middle, say): ask again
                // while the lease holds, rather than leave the actor SUSPENDING until it
                // goes stale.
                Ok(Err(error))
                    if error.kind == NodeErrorKind::Transient
                        && began.elapsed() < SUSPEND_RETRY_WINDOW =>
                {
                    tracing::info!(actor = %r, worker = %worker.id, error = %error.message, retry_in_ms = pause.as_millis() as u64, "checkpoint call failed; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(SUSPEND_RETRY_MAX);
                }
                answer => break answer,
            }
        };
        let reply = match answer {
            Ok(Ok(reply)) => reply,
            // Nothing was written (disk full, …) and the worker put the actor back to work:
            // it is RUNNING again, with the reason in lastError.
            Ok(Err(error)) if error.kind == NodeErrorKind::Aborted => {
                let why = format!("suspend failed on worker {}: {}", worker.id, error.message);
                tracing::warn!(actor = %r, worker = %worker.id, error = %error.message, "suspend failed; the actor runs on");
                let update = ActorUpdate::with_error(why.clone());
                self.store
                    .transition(
                        r,
                        Transition::new(&from, ActorState::Running).with(update),
                        now_ms(),
                    )
                    .await?;
                return Err(WorkflowError::Unavailable(why).into());
            }
            Ok(Err(error)) if error.is_transient() => {
                return Err(worker_unavailable(&worker.id, &error).into());
            }
            // The checkpoint failed and the sandbox with it (a dump killed inside the actor's
            // processes): nothing runs any more and nothing was written, so the actor is back
            // at its previous generation; it resumes from there on the next request.
            Ok(Err(error)) if error.kind == NodeErrorKind::SandboxLost => {
                let why = format!(
                    "suspend failed on worker {} and the actor's sandbox did not survive it; back at generation {} (what it did since is lost): {}",
                    worker.id, actor.generation, error.message
                );
                tracing::error!(actor = %r, worker = %worker.id, error = %error.message, "suspend lost the sandbox; the previous generation stands");
                let update = ActorUpdate::with_error(why.clone());
                self.store
                    .release_actor(
                        r,
                        Transition::new(&from, ActorState::Suspended).with(update),
                        None,
                        now_ms(),
                    )
                    .await?;
                return Err(WorkflowError::Internal(why).into());
            }
            Err(_) => {
                return Err(WorkflowError::Unavailable(format!(
                    "worker {} did not answer the checkpoint in time",
                    worker.id
                ))
                .into());
            }
            Ok(Err(error)) => {
                // Nothing usable was written; the previous generation stays the newest.
                let why = format!(
                    "checkpoint on worker {} failed: {}",
                    worker.id, error.message
                );
                let update = ActorUpdate::with_error(why.clone());
                self.store
                    .release_actor(
                        r,
                        Transition::new(&from, ActorState::Crashed).with(update),
                        None,
                        now_ms(),
                    )
                    .await?;
                return Err(WorkflowError::Internal(why).into());
            }
        };
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
            ..ActorUpdate::default()
        };
        let a = self
            .store
            .release_actor(
                r,
                Transition::new(&from, ActorState::Suspended).with(update),
                Some(&snap),
                now_ms(),
            )
            .await?;
        self.note_frozen_copy(r, reply.kept_frozen.then_some((&worker.id, generation)))
            .await;
        tracing::info!(actor = %r, generation, fidelity = %snap.fidelity, durable, kept_frozen = reply.kept_frozen, "actor suspended");
        self.prune_generations(r).await;
        Ok(ActorView::bare(a))
    }
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
