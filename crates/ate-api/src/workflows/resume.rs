//! ResumeActor: the warm answer, and the cold path under the actor's lease (placement in
//! `placement`, then the node's Run/Restore, the epoch check and RUNNING), timed step by step.

use std::ops::ControlFlow;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::restore::{RestorePlan, SnapshotFacts, decide};
use ate_core::{ActorRef, ActorState};
use ate_store::{
    ActorRecord, ActorUpdate, SnapshotRecord, TemplateRecord, Transition, WorkerRecord,
    WorkerStatus,
};
use tracing::Instrument;

use super::placement::without_damaged_copies;
use super::{
    ActorView, Api, Failure, FaultPoint, crashed, end_lease, transient, worker_unavailable,
};
use crate::error::WorkflowError;
use crate::lease::Lease;
use crate::node::{NodeError, Started, Workload};

/// How long what a template says about WebSockets is reused without reading it again.
const WEB_SOCKETS_TTL: Duration = Duration::from_secs(5);

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
                let cause = "finishing a suspend that was cut off, before a resume";
                if let Err(e) = self.suspend(r, false, cause).await {
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

    /// Whether the template of `actor` (as ResumeActor returned it) asks for hibernating
    /// WebSockets: the router terminates the actor's client WebSockets itself and keeps them open
    /// while it sleeps (docs/websockets.md). Known from the template read of a cold resume, or
    /// read at most every `WEB_SOCKETS_TTL`: the warm path stays one store read, and a changed
    /// template is seen within that time (as the router's assignment cache). A template that no
    /// longer exists asks for nothing; any other failure to read it fails the call (the router
    /// parks and asks again rather than silently closing sockets on the next suspend).
    pub async fn hibernates_web_sockets(&self, actor: &ActorView) -> Result<bool, WorkflowError> {
        let t = &actor.actor.template;
        let key = format!("{}/{}", t.namespace, t.name);
        let known = match self.web_sockets.lock() {
            Ok(m) => m.get(&key).copied(),
            Err(poisoned) => poisoned.into_inner().get(&key).copied(),
        };
        if let Some((hibernate, at)) = known
            && at.elapsed() < WEB_SOCKETS_TTL
        {
            return Ok(hibernate);
        }
        match self.store.get_template(&t.namespace, &t.name).await {
            Ok(template) => Ok(self.note_web_sockets(&key, &template.spec)),
            Err(ate_store::StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Records what `spec` says about WebSockets for the template `key`; returns it.
    fn note_web_sockets(&self, key: &str, spec: &ate_core::TemplateSpec) -> bool {
        let hibernate = spec.web_sockets == ate_core::template::WebSockets::Hibernate;
        let mut m = match self.web_sockets.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Bounded by the number of templates; entries of deleted ones go when they expire.
        m.retain(|_, (_, at)| at.elapsed() < WEB_SOCKETS_TTL);
        m.insert(key.to_string(), (hibernate, Instant::now()));
        hibernate
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
            .instrument(ate_telemetry::trace_span!("lease"))
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
        let (actor, template, mut snapshot) = match self.load_for_resume(r, steps).await? {
            ControlFlow::Break(running) => return Ok((running, false)),
            ControlFlow::Continue(loaded) => loaded,
        };
        let (actor, worker) = self
            .place_for_resume(&actor, &template, &mut snapshot)
            .await?;
        steps.mark("bind");
        self.faults.fire(FaultPoint::ResumeAfterBind)?;
        self.release_if_worker_cannot_restore(r, &actor, &worker, snapshot.as_ref())
            .await?;
        let plan = restore_plan(&actor, snapshot.as_ref());
        let workload = Workload {
            actor: &actor,
            template: &template,
            worker_id: &worker.id,
        };
        let started = self
            .start_on_node(&workload, &worker, plan, snapshot.as_ref(), request_id)
            .await?;
        let reply = match started {
            Ok(started) => started,
            Err(failed) => {
                return Err(self
                    .release_after_node_failure(r, &worker, snapshot.as_ref(), failed)
                    .await);
            }
        };
        steps.mark("node");
        self.faults.fire(FaultPoint::ResumeAfterNodeCall)?;
        let _step = ate_telemetry::trace_span!("finalize");
        let note = resume_note(plan, snapshot.as_ref(), request_id);
        let view = self
            .finalize_resume(r, lease, &worker, reply.epoch, note)
            .await?;
        steps.mark("finalize");
        tracing::info!(actor = %r, worker = %worker.id, ?plan, "actor resumed");
        Ok((view, true))
    }

    /// Re-reads the actor under the lease (another workflow may have finished in between), then
    /// its template (the quota checked for a SUSPENDED one) and the snapshot to restore (None:
    /// run afresh). `Break`: RUNNING already, the answer.
    async fn load_for_resume(
        &self,
        r: &ActorRef,
        steps: &StepTimes,
    ) -> Result<ControlFlow<ActorView, Loaded>, Failure> {
        // Trace spans of the steps (disabled when traces are off), each from its creation to its
        // drop; an early return ends the step it is in.
        let _step = ate_telemetry::trace_span!("load");
        // Re-read under the lease: another workflow may have finished in between.
        let actor = self.store.get_actor(r).await?;
        steps.mark("reread");
        match actor.state {
            ActorState::Running => return Ok(ControlFlow::Break(self.actor_view(actor).await)),
            ActorState::Crashed => return Err(crashed(r, &actor.last_error).into()),
            ActorState::Suspending => return Err(transient(r, actor.state).into()),
            ActorState::Suspended | ActorState::Resuming => {}
        }
        let t = &actor.template;
        let template = self.store.get_template(&t.namespace, &t.name).await?;
        if actor.state == ActorState::Suspended {
            // A RESUMING actor's own assignment is counted already; its bind checks.
            self.check_quota(&actor, &template).await?;
        }
        self.note_web_sockets(&format!("{}/{}", t.namespace, t.name), &template.spec);
        let snapshot = self.choose_snapshot(&actor, &template).await?;
        steps.mark("template_and_snapshot");
        Ok(ControlFlow::Continue((actor, template, snapshot)))
    }

    /// Placement: the worker (two random choices) and its admission (`bind` spans within). A
    /// placement that detached the actor from its node chooses the snapshot again.
    async fn place_for_resume(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
        snapshot: &mut Option<SnapshotRecord>,
    ) -> Result<(ActorRecord, WorkerRecord), Failure> {
        let placed = async {
            match self.rebind_existing(actor, template).await? {
                Some(bound) => Ok::<_, Failure>(bound),
                None => {
                    let (bound, detached) = self.assign(actor, template, snapshot.as_ref()).await?;
                    if detached {
                        *snapshot = self.choose_snapshot(&bound.0, template).await?;
                    }
                    Ok(bound)
                }
            }
        };
        placed
            .instrument(ate_telemetry::trace_span!("schedule"))
            .await
    }

    /// The worker must be able to restore everything the generation holds. Placement
    /// filtered on it; a rebind to the worker of an earlier attempt did not, and that worker
    /// may have come back without a capability (CRIU gone): released, so the next attempt
    /// places the actor with the filter, or parks it — never a restore at lower fidelity.
    async fn release_if_worker_cannot_restore(
        &self,
        r: &ActorRef,
        actor: &ActorRecord,
        worker: &WorkerRecord,
        snapshot: Option<&SnapshotRecord>,
    ) -> Result<(), Failure> {
        let Some(snap) = snapshot.filter(|s| s.template == actor.template) else {
            return Ok(());
        };
        let required = ate_core::capability::required(&snap.requires, snap.fidelity);
        let offered = crate::scheduler::offered(worker);
        let missing: Vec<String> = ate_core::capability::missing(&required, &offered)
            .into_iter()
            .map(str::to_string)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
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
        Err(WorkflowError::NoCapableWorker {
            missing,
            generation: snap.generation,
            fidelity: snap.fidelity,
        }
        .into())
    }

    /// The node's Run or Restore (as `plan` says), bounded by the node call timeout.
    async fn start_on_node(
        &self,
        workload: &Workload<'_>,
        worker: &WorkerRecord,
        plan: RestorePlan,
        snapshot: Option<&SnapshotRecord>,
        request_id: Option<&str>,
    ) -> Result<Result<Started, NodeFailure>, Failure> {
        let address = &worker.node_address;
        let call = async {
            match (plan, snapshot) {
                (RestorePlan::Restore(fidelity), Some(snap)) => {
                    let snap = without_damaged_copies(snap);
                    self.nodes
                        .restore(address, workload, &snap, fidelity, request_id)
                        .await
                }
                _ => self.nodes.run(address, workload, request_id).await,
            }
        };
        let node_span = ate_telemetry::trace_span!(
            "node",
            node = %worker.node,
            worker = %worker.id,
            otel.kind = "client"
        );
        let call = tokio::time::timeout(self.cfg.node_call_timeout, call).instrument(node_span);
        Ok(match call.await {
            Ok(Ok(Ok(started))) => Ok(started),
            Ok(Ok(Err(error))) => Err(NodeFailure::Failed(error)),
            // No client for the node's address: the api's own error, no call made.
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => Err(NodeFailure::TimedOut),
        })
    }

    /// After a Run/Restore that did not start the actor: released to be resumed again (an
    /// unreachable node, a transient failure), or CRASHED; the answer for the caller.
    async fn release_after_node_failure(
        &self,
        r: &ActorRef,
        worker: &WorkerRecord,
        snapshot: Option<&SnapshotRecord>,
        failed: NodeFailure,
    ) -> Failure {
        let error = match failed {
            NodeFailure::Failed(error) => error,
            NodeFailure::TimedOut => {
                return WorkflowError::Unavailable(format!(
                    "worker {} did not answer within {:?}",
                    worker.id, self.cfg.node_call_timeout
                ))
                .into();
            }
        };
        if error.is_transient() && error.unreached {
            // The node itself could not be reached (its machine may be lost): the restore
            // never started there, or its copy never served (the actor was never RUNNING),
            // so the actor may resume elsewhere — a new activation fences any copy the node
            // made. Released now and avoided for a while, the next attempt goes elsewhere.
            self.suspect_node(&worker.node);
            let why = format!(
                "node {} unreachable during the resume ({}); resuming elsewhere",
                worker.node, error.message
            );
            if let Err(e) = self.release_resuming(r, ActorState::Suspended, why).await {
                return e.into();
            }
            tracing::warn!(actor = %r, node = %worker.node, error = %error.message, "node unreachable during the resume; released to resume elsewhere");
            return WorkflowError::Unavailable(format!(
                "node {} unreachable; the actor resumes on another node at the next attempt",
                worker.node
            ))
            .into();
        }
        if error.is_transient() {
            // The node answered: nothing of this resume runs there (a worker not registered
            // on the node yet, a restore cut short and torn down). Released, so that an
            // actor nobody asks for again holds no slot and is not left RESUMING; the next
            // attempt places it afresh. The activation is kept: a copy reported later is
            // re-adopted or discarded by reconciliation, as for an unreachable node.
            let why = format!(
                "resume on worker {} failed for now ({}); tried again at the next request",
                worker.id, error.message
            );
            if let Err(e) = self.release_resuming(r, ActorState::Suspended, why).await {
                return e.into();
            }
            tracing::warn!(actor = %r, worker = %worker.id, error = %error.message, "resume failed for now; released to resume at the next attempt");
            return worker_unavailable(&worker.id, &error).into();
        }
        self.crash_after_failed_restore(r, worker, snapshot, &error)
            .await
    }

    /// A Run/Restore that failed for good: the actor goes CRASHED, and copies of the generation
    /// the node found damaged are recorded so no resume chooses them again.
    async fn crash_after_failed_restore(
        &self,
        r: &ActorRef,
        worker: &WorkerRecord,
        snapshot: Option<&SnapshotRecord>,
        error: &NodeError,
    ) -> Failure {
        let why = format!("restore on worker {} failed: {}", worker.id, error.message);
        tracing::warn!(actor = %r, worker = %worker.id, error = %error.message, "resume failed; actor CRASHED");
        if let Err(e) = self
            .release_resuming(r, ActorState::Crashed, why.clone())
            .await
        {
            return e.into();
        }
        // The node found copies of the generation damaged: no resume chooses them again
        // (CRASHED first: a crash in between costs one more attempt, never a silent
        // fallback to an older generation).
        match (&error.damage, snapshot) {
            (Some(d), Some(s)) if d.generation == s.generation && d.uuid == s.uuid => {
                self.record_damage(r, d).await;
            }
            (Some(d), _) => {
                tracing::warn!(actor = %r, generation = d.generation, uuid = %d.uuid, "the node reported damage of a generation it was not asked to restore; ignored");
            }
            (None, _) => {}
        }
        crashed(r, &Some(why)).into()
    }

    /// Finalize: the node's epoch must be the one the worker registered, else it restarted
    /// during the restore and whatever it did is gone; then RUNNING.
    async fn finalize_resume(
        &self,
        r: &ActorRef,
        lease: &Lease,
        worker: &WorkerRecord,
        epoch: u64,
        note: String,
    ) -> Result<ActorView, Failure> {
        let registered = self.store.get_worker(&worker.id).await?;
        if epoch != registered.epoch || registered.status != WorkerStatus::Active {
            return Err(WorkflowError::Unavailable(format!(
                "worker {} restarted during the restore (epoch {} != registered {})",
                worker.id, epoch, registered.epoch
            ))
            .into());
        }
        let update = ActorUpdate {
            epoch: Some(epoch),
            last_error: Some(None),
            clear_attached_node: true,
            note: Some(note),
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
        Ok(ActorView {
            actor: running,
            worker: Some(registered),
        })
    }
}

/// What a resume places: the actor, its template and the snapshot to restore.
type Loaded = (ActorRecord, TemplateRecord, Option<SnapshotRecord>);

/// How a node's Run/Restore failed.
enum NodeFailure {
    /// No answer within the node call timeout.
    TimedOut,
    Failed(NodeError),
}

/// A restore of `snapshot` (at the fidelity the worker and template allow), or a fresh run.
fn restore_plan(actor: &ActorRecord, snapshot: Option<&SnapshotRecord>) -> RestorePlan {
    let snapshot_template = snapshot.map(|s| s.template.to_string());
    decide(
        snapshot
            .zip(snapshot_template.as_deref())
            .map(|(s, template)| SnapshotFacts {
                fidelity: s.fidelity,
                template,
            }),
        &actor.template.to_string(),
    )
}

/// The actor's note for a resume: what was restored, and for which request.
fn resume_note(
    plan: RestorePlan,
    snapshot: Option<&SnapshotRecord>,
    request_id: Option<&str>,
) -> String {
    let how = match (plan, snapshot) {
        (RestorePlan::Restore(fidelity), Some(snap)) => format!(
            "restored generation {} ({})",
            snap.generation,
            fidelity.short()
        ),
        _ => "started afresh".to_string(),
    };
    match request_id {
        Some(id) => format!("{how} for request {id}"),
        None => how,
    }
}
