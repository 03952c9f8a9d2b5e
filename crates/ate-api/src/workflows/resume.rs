//! ResumeActor: the warm answer, and the cold path under the actor's lease (placement in
//! `placement`, then the node's Run/Restore, the epoch check and RUNNING), timed step by step.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::restore::{RestorePlan, SnapshotFacts, decide};
use ate_core::{ActorRef, ActorState};
use ate_store::{ActorUpdate, Transition, WorkerStatus};
use tracing::Instrument;

use super::placement::without_damaged_copies;
use super::{
    ActorView, Api, Failure, FaultPoint, crashed, end_lease, transient, worker_unavailable,
};
use crate::error::WorkflowError;
use crate::lease::Lease;
use crate::node::Workload;

/// Per-step durations of one workflow, logged at debug level when it ends (where a slow resume
/// spends its time: the lease, store reads, the bind, the node call, the finalizing writes).
struct StepTimes {
    begun: Instant,
    marks: Mutex<Vec<(&'static str, Duration)>>,
}

impl StepTimes {
    fn new() -> Self {
        Self {
            begun: Instant::now(),
            marks: Mutex::new(Vec::new()),
        }
    }

    fn mark(&self, step: &'static str) {
        let at = self.begun.elapsed();
        if let Ok(mut m) = self.marks.lock() {
            m.push((step, at));
        }
    }

    /// Each step's time into `ate_api_resume_step_seconds{step}`.
    fn observe(&self) {
        let Ok(marks) = self.marks.lock() else { return };
        let mut last = Duration::ZERO;
        for (step, at) in marks.iter() {
            crate::metrics::resume_step(step, at.saturating_sub(last));
            last = *at;
        }
    }

    fn log(&self, actor: &ActorRef, what: &str) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let Ok(marks) = self.marks.lock() else { return };
        let mut last = Duration::ZERO;
        let mut parts = Vec::with_capacity(marks.len());
        for (step, at) in marks.iter() {
            parts.push(format!("{step}={:.2}", (*at - last).as_secs_f64() * 1e3));
            last = *at;
        }
        tracing::debug!(actor = %actor, total_ms = format!("{:.2}", last.as_secs_f64() * 1e3), steps_ms = %parts.join(" "), "{what} steps");
    }
}

impl Api {
    /// Ends a resume that did not make the actor RUNNING: RESUMING → `to` (SUSPENDED to be placed
    /// again, CRASHED for an operator) with `why` as lastError, dropping its worker assignment.
    async fn release_resuming(
        &self,
        r: &ActorRef,
        to: ActorState,
        why: String,
    ) -> Result<(), WorkflowError> {
        let update = ActorUpdate::with_error(why);
        self.store
            .release_actor(
                r,
                Transition::new(&[ActorState::Resuming], to).with(update),
                None,
                now_ms(),
            )
            .await?;
        Ok(())
    }

    /// ResumeActor. Warm path (RUNNING): one read, no lease, `resumed = false`. `request_id`
    /// (the router's `x-request-id`) goes on to the node's Run/Restore as metadata; the caller
    /// runs this inside a span carrying it.
    pub async fn resume(
        &self,
        r: &ActorRef,
        request_id: Option<&str>,
    ) -> Result<(ActorView, bool), WorkflowError> {
        let warm_started = Instant::now();
        r.validate()?;
        let actor = self.store.get_actor(r).await?;
        match actor.state {
            ActorState::Running => {
                let message = self.actor_view(actor).await;
                crate::metrics::resumed("warm", crate::metrics::WARM_OUTCOME, warm_started);
                return Ok((message, false));
            }
            ActorState::Crashed => return Err(crashed(r, &actor.last_error)),
            ActorState::Suspending if self.stale(&actor) => {
                // The suspend that set SUSPENDING died (api crash, node timeout) and nothing else
                // would ever finish it: the request finishes it, then resumes as usual.
                tracing::info!(actor = %r, "finishing a stale suspend before the resume");
                if let Err(e) = self.suspend(r, false).await {
                    // A suspend that failed may still have settled the actor: RUNNING again
                    // (nothing written, it runs on) is served warm, SUSPENDED (at its
                    // previous generation) is resumed; anything else is the answer.
                    let now = self.store.get_actor(r).await?;
                    match now.state {
                        ActorState::Running => return Ok((self.actor_view(now).await, false)),
                        ActorState::Suspended => {}
                        _ => return Err(e),
                    }
                }
            }
            ActorState::Suspending => return Err(transient(r, actor.state)),
            ActorState::Suspended | ActorState::Resuming => {}
        }
        let started = Instant::now();
        let steps = StepTimes::new();
        let result = self.resume_under_lease(r, &steps, request_id).await;
        steps.log(r, "cold resume");
        steps.observe();
        let outcome = match &result {
            Ok((_, true)) => "resumed",
            Ok((_, false)) => "already_running",
            Err(e) => e.outcome(),
        };
        crate::metrics::resumed("cold", outcome, started);
        result
    }

    /// [`Self::under_lease`] for the resume, whose finalizing write also releases the lease.
    async fn resume_under_lease(
        &self,
        r: &ActorRef,
        steps: &StepTimes,
        request_id: Option<&str>,
    ) -> Result<(ActorView, bool), WorkflowError> {
        let lease = self
            .lease(r)
            .instrument(ate_tls::trace_span!("lease"))
            .await?;
        steps.mark("lease");
        let result = self.resume_locked(r, steps, &lease, request_id).await;
        let result = end_lease(lease, result).await;
        steps.mark("release");
        result
    }

    async fn resume_locked(
        &self,
        r: &ActorRef,
        steps: &StepTimes,
        lease: &Lease,
        request_id: Option<&str>,
    ) -> Result<(ActorView, bool), Failure> {
        self.faults.fire(FaultPoint::ResumeAfterLease)?;
        // Trace spans of the steps (disabled when traces are off), each from its creation to its
        // drop; an early return ends the step it is in.
        let step = ate_tls::trace_span!("load");
        // Re-read under the lease: another workflow may have finished in between.
        let actor = self.store.get_actor(r).await?;
        steps.mark("reread");
        match actor.state {
            ActorState::Running => return Ok((self.actor_view(actor).await, false)),
            ActorState::Crashed => return Err(crashed(r, &actor.last_error).into()),
            ActorState::Suspending => return Err(transient(r, actor.state).into()),
            ActorState::Suspended | ActorState::Resuming => {}
        }
        let t = &actor.template;
        let template = self.store.get_template(&t.namespace, &t.name).await?;
        let mut snapshot = self.choose_snapshot(&actor, &template).await?;
        steps.mark("template_and_snapshot");
        drop(step);

        // Placement: the worker (two random choices) and its admission (`bind` spans within).
        let placed = async {
            match self.rebind_existing(&actor, &template).await? {
                Some(bound) => Ok::<_, Failure>(bound),
                None => {
                    let (bound, detached) =
                        self.assign(&actor, &template, snapshot.as_ref()).await?;
                    if detached {
                        snapshot = self.choose_snapshot(&bound.0, &template).await?;
                    }
                    Ok(bound)
                }
            }
        };
        let (actor, worker) = placed.instrument(ate_tls::trace_span!("schedule")).await?;
        steps.mark("bind");
        self.faults.fire(FaultPoint::ResumeAfterBind)?;

        // The worker must be able to restore everything the generation holds. Placement
        // filtered on it; a rebind to the worker of an earlier attempt did not, and that worker
        // may have come back without a capability (CRIU gone): released, so the next attempt
        // places the actor with the filter, or parks it — never a restore at lower fidelity.
        if let Some(snap) = snapshot.as_ref().filter(|s| s.template == actor.template) {
            let required = ate_core::capability::required(&snap.requires, snap.fidelity);
            let offered = crate::scheduler::offered(&worker);
            let missing: Vec<String> = ate_core::capability::missing(&required, &offered)
                .into_iter()
                .map(str::to_string)
                .collect();
            if !missing.is_empty() {
                let why = format!(
                    "worker {} cannot restore generation {} (missing {}); not restored there",
                    worker.id,
                    snap.generation,
                    missing.join(", ")
                );
                tracing::warn!(actor = %r, worker = %worker.id, ?missing, "worker lacks a restore capability; actor released");
                self.store
                    .release_actor(
                        r,
                        Transition::new(&[ActorState::Resuming], ActorState::Suspended)
                            .with(ActorUpdate::with_error(why)),
                        None,
                        now_ms(),
                    )
                    .await?;
                return Err(WorkflowError::NoCapableWorker {
                    missing,
                    generation: snap.generation,
                    fidelity: snap.fidelity,
                }
                .into());
            }
        }
        let snapshot_template = snapshot.as_ref().map(|s| s.template.to_string());
        let plan = decide(
            snapshot
                .as_ref()
                .zip(snapshot_template.as_deref())
                .map(|(s, template)| SnapshotFacts {
                    fidelity: s.fidelity,
                    template,
                }),
            &actor.template.to_string(),
        );
        let workload = Workload {
            actor: &actor,
            template: &template,
            worker_id: &worker.id,
        };
        let mut client = self.nodes.client(&worker.node_address)?;
        let call = async {
            match (plan, &snapshot) {
                (RestorePlan::Restore(fidelity), Some(snap)) => {
                    let snap = without_damaged_copies(snap);
                    client.restore(&workload, &snap, fidelity, request_id).await
                }
                _ => client.run(&workload, request_id).await,
            }
        };
        let node_span = ate_tls::trace_span!(
            "node",
            node = %worker.node,
            worker = %worker.id,
            otel.kind = "client"
        );
        let call = tokio::time::timeout(self.cfg.node_call_timeout, call).instrument(node_span);
        let reply = match call.await {
            Ok(Ok(started)) => started,
            Ok(Err(error)) if error.is_transient() && error.unreached => {
                // The node itself could not be reached (its machine may be lost): the restore
                // never started there, or its copy never served (the actor was never RUNNING),
                // so the actor may resume elsewhere — a new activation fences any copy the node
                // made. Released now and avoided for a while, the next attempt goes elsewhere.
                self.suspect_node(&worker.node);
                let why = format!(
                    "node {} unreachable during the resume ({}); resuming elsewhere",
                    worker.node, error.message
                );
                self.release_resuming(r, ActorState::Suspended, why).await?;
                tracing::warn!(actor = %r, node = %worker.node, error = %error.message, "node unreachable during the resume; released to resume elsewhere");
                return Err(WorkflowError::Unavailable(format!(
                    "node {} unreachable; the actor resumes on another node at the next attempt",
                    worker.node
                ))
                .into());
            }
            Ok(Err(error)) if error.is_transient() => {
                // The node answered: nothing of this resume runs there (a worker not registered
                // on the node yet, a restore cut short and torn down). Released, so that an
                // actor nobody asks for again holds no slot and is not left RESUMING; the next
                // attempt places it afresh. The activation is kept: a copy reported later is
                // re-adopted or discarded by reconciliation, as for an unreachable node.
                let why = format!(
                    "resume on worker {} failed for now ({}); tried again at the next request",
                    worker.id, error.message
                );
                self.release_resuming(r, ActorState::Suspended, why).await?;
                tracing::warn!(actor = %r, worker = %worker.id, error = %error.message, "resume failed for now; released to resume at the next attempt");
                return Err(worker_unavailable(&worker.id, &error).into());
            }
            Err(_) => {
                return Err(WorkflowError::Unavailable(format!(
                    "worker {} did not answer within {:?}",
                    worker.id, self.cfg.node_call_timeout
                ))
                .into());
            }
            Ok(Err(error)) => {
                let why = format!("restore on worker {} failed: {}", worker.id, error.message);
                tracing::warn!(actor = %r, worker = %worker.id, error = %error.message, "resume failed; actor CRASHED");
                self.release_resuming(r, ActorState::Crashed, why.clone())
                    .await?;
                // The node found copies of the generation damaged: no resume chooses them again
                // (CRASHED first: a crash in between costs one more attempt, never a silent
                // fallback to an older generation).
                match (&error.damage, &snapshot) {
                    (Some(d), Some(s)) if d.generation == s.generation && d.uuid == s.uuid => {
                        self.record_damage(r, d).await;
                    }
                    (Some(d), _) => {
                        tracing::warn!(actor = %r, generation = d.generation, uuid = %d.uuid, "the node reported damage of a generation it was not asked to restore; ignored");
                    }
                    (None, _) => {}
                }
                return Err(crashed(r, &Some(why)).into());
            }
        };
        steps.mark("node");
        self.faults.fire(FaultPoint::ResumeAfterNodeCall)?;
        let _step = ate_tls::trace_span!("finalize");

        // Finalize: the node's epoch must be the one the worker registered, else it restarted
        // during the restore and whatever it did is gone.
        let registered = self.store.get_worker(&worker.id).await?;
        if reply.epoch != registered.epoch || registered.status != WorkerStatus::Active {
            return Err(WorkflowError::Unavailable(format!(
                "worker {} restarted during the restore (epoch {} != registered {})",
                worker.id, reply.epoch, registered.epoch
            ))
            .into());
        }
        let update = ActorUpdate {
            epoch: Some(reply.epoch),
            last_error: Some(None),
            clear_attached_node: true,
        };
        // RUNNING and the lease's release in one write: the resume is over either way.
        lease.stop_renewal();
        let running = self
            .store
            .transition_releasing_lease(
                r,
                Transition::new(&[ActorState::Resuming], ActorState::Running).with(update),
                now_ms(),
                lease.key(),
                lease.holder(),
            )
            .await?;
        lease.released_in_store();
        steps.mark("finalize");
        tracing::info!(actor = %r, worker = %worker.id, ?plan, "actor resumed");
        Ok((
            ActorView {
                actor: running,
                worker: Some(registered),
            },
            true,
        ))
    }
}
