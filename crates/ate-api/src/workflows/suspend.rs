//! SuspendActor: RUNNING → SUSPENDING → the node's checkpoint → SUSPENDED with the new
//! generation (or back to RUNNING when nothing was written), then the frozen-copy hint and
//! generation retention.

use std::time::Instant;

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_proto::v1;
use ate_store::{ActorUpdate, StoreError, WorkerStatus};
use tonic::{Code, Status};

use super::{
    Api, Failure, FaultPoint, code_label, crashed, is_transient, template_ref, transient,
    worker_unavailable, workload,
};
use crate::convert;
use crate::error::{self, invalid};

impl Api {
    pub async fn suspend(&self, r: &ActorRef, durable: bool) -> Result<v1::Actor, Status> {
        self.suspend_with_grace(r, durable, 0).await
    }

    /// [`Self::suspend`] giving requests in flight `grace_ms` to finish (0: the worker's default).
    pub async fn suspend_with_grace(
        &self,
        r: &ActorRef,
        durable: bool,
        grace_ms: u32,
    ) -> Result<v1::Actor, Status> {
        r.validate().map_err(invalid)?;
        let actor = self
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(error::store)?;
        match actor.state {
            ActorState::Suspended => return Ok(self.actor_message(&actor).await),
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
            Err(s) => code_label(s.code()),
        };
        crate::metrics::suspended(outcome, started);
        result
    }

    async fn suspend_locked(
        &self,
        r: &ActorRef,
        durable: bool,
        grace_ms: u32,
    ) -> Result<v1::Actor, Failure> {
        let mut actor = self.store.get_actor(&r.atespace, &r.name).await?;
        match actor.state {
            ActorState::Suspended => return Ok(self.actor_message(&actor).await),
            ActorState::Crashed => return Err(crashed(r, &actor.last_error).into()),
            ActorState::Resuming => return Err(transient(r, actor.state).into()),
            ActorState::Running => {
                actor = self
                    .store
                    .transition(
                        &r.atespace,
                        &r.name,
                        &[ActorState::Running],
                        ActorState::Suspending,
                        ActorUpdate::default(),
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
                    &r.atespace,
                    &r.name,
                    &from,
                    ActorState::Suspended,
                    None,
                    update,
                    now_ms(),
                )
                .await?;
            return Ok(convert::actor(&a, None));
        };
        let (ns, tname) = template_ref(&actor)?;
        let template = self.store.get_template(&ns, &tname).await?;
        let generation = actor.generation + 1;
        let req = v1::CheckpointRequest {
            workload: Some(workload(&actor, &template, &worker.id)),
            generation,
            uuid: uuid::Uuid::new_v4().to_string(),
            fidelity: template.spec.fidelity.wire(),
            durable,
            grace_ms,
        };
        let mut client = self.nodes.client(&worker.node_address)?;
        let reply = match tokio::time::timeout(self.cfg.node_call_timeout, client.checkpoint(req))
            .await
        {
            Ok(Ok(reply)) => reply.into_inner(),
            // Nothing was written (disk full, …) and the worker put the actor back to work:
            // it is RUNNING again, with the reason in lastError.
            Ok(Err(status)) if status.code() == Code::Aborted => {
                let why = format!(
                    "suspend failed on worker {}: {}",
                    worker.id,
                    status.message()
                );
                tracing::warn!(actor = %r, worker = %worker.id, error = %status.message(), "suspend failed; the actor runs on");
                let update = ActorUpdate::with_error(why.clone());
                self.store
                    .transition(
                        &r.atespace,
                        &r.name,
                        &from,
                        ActorState::Running,
                        update,
                        now_ms(),
                    )
                    .await?;
                return Err(Status::unavailable(why).into());
            }
            Ok(Err(status)) if is_transient(&status) => {
                return Err(worker_unavailable(&worker.id, &status).into());
            }
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "worker {} did not answer the checkpoint in time",
                    worker.id
                ))
                .into());
            }
            Ok(Err(status)) => {
                // Nothing usable was written; the previous generation stays the newest.
                let why = format!(
                    "checkpoint on worker {} failed: {}",
                    worker.id,
                    status.message()
                );
                let update = ActorUpdate::with_error(why.clone());
                self.store
                    .release_actor(
                        &r.atespace,
                        &r.name,
                        &from,
                        ActorState::Crashed,
                        None,
                        update,
                        now_ms(),
                    )
                    .await?;
                return Err(Status::internal(why).into());
            }
        };
        let snap = reply
            .snapshot
            .as_ref()
            .and_then(|s| convert::snapshot_from_wire(s, &r.atespace, &r.name, now_ms()))
            .filter(|s| s.generation == generation)
            .ok_or_else(|| {
                Status::internal(format!(
                    "node returned no valid snapshot for generation {generation}"
                ))
            })?;
        self.faults.fire(FaultPoint::SuspendAfterCheckpoint)?;
        let update = ActorUpdate::with_error(snap.reason.clone());
        let a = self
            .store
            .release_actor(
                &r.atespace,
                &r.name,
                &from,
                ActorState::Suspended,
                Some(&snap),
                update,
                now_ms(),
            )
            .await?;
        self.note_frozen_copy(r, reply.kept_frozen.then_some((&worker.id, generation)))
            .await;
        tracing::info!(actor = %r, generation, fidelity = %snap.fidelity, durable, kept_frozen = reply.kept_frozen, "actor suspended");
        self.prune_generations(r).await;
        Ok(convert::actor(&a, None))
    }
}
