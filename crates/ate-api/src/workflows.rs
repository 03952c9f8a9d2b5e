//! The actor workflows: resume, suspend, revert, delete, and the fleet's reports.
//!
//! Architecture invariant: every mutating workflow runs under the actor's lease, and every state
//! change is a compare-and-set in the store, so a workflow interrupted after any step is picked up
//! by the next call (after the dead holder's lease expires) and never corrupts a record.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::backoff::{Backoff, Policy};
use ate_core::clock::now_ms;
use ate_core::restore::{RestorePlan, SnapshotFacts, decide};
use ate_core::{ActorRef, ActorState, CRASHED_PREREQUISITE, DurableStatus, NO_ROOM_MESSAGE};
use ate_proto::v1;
use ate_store::{
    ActorRecord, ActorUpdate, Capacity, SnapshotRecord, Store, StoreError, TemplateRecord,
    WorkerRecord, WorkerStatus,
};
use tonic::{Code, Status};
use tracing::Instrument;

use crate::ApiConfig;
use crate::convert;
use crate::error::{self, invalid};
use crate::lease::Lease;
use crate::node::NodeClients;
use crate::scheduler::{self, FleetView, Requirements};

/// Most admission attempts after a lost race (up to 12 retries).
const MAX_BIND_RETRIES: u32 = 12;
/// Between admission attempts: from 10 ms, doubling to 250 ms, each delay ×[0.5, 1) so that
/// the racers for a worker's last room spread out instead of colliding again.
const BIND_BACKOFF: Policy = Policy {
    factor: 2.0,
    max: Duration::from_millis(250),
    jitter: (0.5, 1.0),
};

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
            Err(Failure::Crash(Status::internal(format!(
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
    Status(Status),
    /// A simulated crash: the lease is abandoned (it expires) and nothing is cleaned up.
    Crash(Status),
}

impl From<Status> for Failure {
    fn from(s: Status) -> Self {
        Failure::Status(s)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Status(error::store(e))
    }
}

pub struct Api {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) fleet: FleetView,
    nodes: Arc<NodeClients>,
    cfg: ApiConfig,
    pub faults: Faults,
    /// Cold resumes that found no room, oldest first: freed room goes to them first.
    waiters: scheduler::Waiters,
    /// Since when (Unix ms) this api could have heard every heartbeat: its start, or the end of
    /// the last store outage it saw. Worker expiry counts only time after it.
    hearing_since_ms: std::sync::atomic::AtomicI64,
    /// Nodes a call could not reach, until when: new placements avoid their workers meanwhile
    /// (soft state; the store expires them if they stay silent).
    suspect_nodes: Mutex<std::collections::HashMap<String, Instant>>,
}

fn crashed(actor: &ActorRef, last_error: &str) -> Status {
    let why = if last_error.is_empty() {
        String::new()
    } else {
        format!(" ({last_error})")
    };
    Status::failed_precondition(format!(
        "actor {actor} is ACTOR_STATE_CRASHED{why}: {CRASHED_PREREQUISITE}; RevertActor returns it to ACTOR_STATE_SUSPENDED"
    ))
}

fn transient(actor: &ActorRef, state: ActorState) -> Status {
    Status::failed_precondition(format!(
        "actor {actor} is {state}; try again when the operation on it has finished"
    ))
}

/// The call never reached the node: a transport failure carries its local error as the
/// status's source (a status the node sent has none).
fn unreachable(status: &Status) -> bool {
    use std::error::Error as _;
    status.source().is_some()
}

/// Node errors that leave the actor where it is (retry later) rather than crash it.
fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
    )
}

/// Ends a workflow's lease by how the work ended: released after an answer (success or not),
/// abandoned after a simulated crash (it expires).
async fn end_lease<T>(lease: Lease, result: Result<T, Failure>) -> Result<T, Status> {
    match result {
        Ok(v) => {
            lease.release().await;
            Ok(v)
        }
        Err(Failure::Status(s)) => {
            lease.release().await;
            Err(s)
        }
        Err(Failure::Crash(s)) => {
            lease.abandon();
            Err(s)
        }
    }
}

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

/// A call to a node agent for the request `request_id`, continuing the current span's trace.
fn node_request<T>(message: T, request_id: Option<&str>) -> tonic::Request<T> {
    let mut request = ate_proto::request_id::request(message, request_id);
    ate_tls::trace_context::inject_grpc(&mut request);
    request
}

fn template_ref(actor: &ActorRecord) -> Result<(String, String), Status> {
    ate_core::names::parse_namespaced("template", &actor.template).map_err(invalid)
}

impl Api {
    pub fn new(store: Arc<dyn Store>, cfg: ApiConfig) -> Self {
        Self {
            fleet: FleetView::new(store.clone(), cfg.fleet_max_age),
            store,
            nodes: Arc::new(NodeClients::new(cfg.node_tls.clone())),
            cfg,
            faults: Faults::default(),
            waiters: scheduler::Waiters::default(),
            hearing_since_ms: std::sync::atomic::AtomicI64::new(now_ms()),
            suspect_nodes: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// A call to `node` failed in the transport (refused, reset, timed out connecting): avoid
    /// placing on it for as long as the api would take to expire its workers.
    fn suspect_node(&self, node: &str) {
        let until = Instant::now() + self.expiry_after();
        if let Ok(mut s) = self.suspect_nodes.lock() {
            s.insert(node.to_string(), until);
        }
    }

    /// Nodes currently avoided by placement.
    fn suspects(&self) -> HashSet<String> {
        let now = Instant::now();
        match self.suspect_nodes.lock() {
            Ok(mut s) => {
                s.retain(|_, until| *until > now);
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

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The worker that keeps `generation` of the actor frozen in place, if the store knows one
    /// (a placement preference shared by every api replica: a resume there is a thaw). A store
    /// error costs only the preference.
    async fn frozen_worker(&self, atespace: &str, name: &str, generation: u64) -> Option<String> {
        match self.store.get_frozen_copy(atespace, name).await {
            Ok(Some(c)) if c.generation == generation => Some(c.worker_id),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(actor = %format!("{atespace}/{name}"), error = %e, "cannot read the frozen-copy hint");
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
                self.store
                    .set_frozen_copy(&r.atespace, &r.name, &copy)
                    .await
            }
            None => self.store.clear_frozen_copy(&r.atespace, &r.name).await,
        };
        if let Err(e) = result {
            tracing::warn!(actor = %r, error = %e, "cannot record the frozen-copy hint");
        }
    }

    fn holder(&self) -> String {
        format!("{}/{}", self.cfg.instance_id, uuid::Uuid::new_v4())
    }

    async fn lease(&self, actor: &ActorRef) -> Result<Lease, Status> {
        Lease::acquire(&self.store, actor, self.holder(), self.cfg.lease_ttl).await
    }

    /// Runs `work` under the actor's lease; releases it unless the work "crashed".
    async fn under_lease<T>(
        &self,
        actor: &ActorRef,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Status> {
        let lease = self.lease(actor).await?;
        let result = work.await;
        end_lease(lease, result).await
    }

    /// [`Self::under_lease`] for the resume, whose finalizing write also releases the lease.
    async fn resume_under_lease(
        &self,
        r: &ActorRef,
        steps: &StepTimes,
        request_id: Option<&str>,
    ) -> Result<(v1::Actor, bool), Status> {
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

    pub async fn actor_message(&self, actor: &ActorRecord) -> v1::Actor {
        let worker = self.assigned_worker(actor).await;
        convert::actor(actor, worker.as_ref())
    }

    // ------------------------------------------------------------------ resume

    /// ResumeActor. Warm path (RUNNING): one read, no lease, `resumed = false`. `request_id`
    /// (the router's `x-request-id`) goes on to the node's Run/Restore as metadata; the caller
    /// runs this inside a span carrying it.
    pub async fn resume(
        &self,
        r: &ActorRef,
        request_id: Option<&str>,
    ) -> Result<(v1::Actor, bool), Status> {
        let warm_started = Instant::now();
        r.validate().map_err(invalid)?;
        let actor = self
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(error::store)?;
        match actor.state {
            ActorState::Running => {
                let message = self.actor_message(&actor).await;
                crate::metrics::resumed("warm", crate::metrics::WARM_OUTCOME, warm_started);
                return Ok((message, false));
            }
            ActorState::Crashed => return Err(crashed(r, &actor.last_error)),
            ActorState::Suspending if self.stale(&actor) => {
                // The suspend that set SUSPENDING died (api crash, node timeout) and nothing else
                // would ever finish it: the request finishes it, then resumes as usual.
                tracing::info!(actor = %r, "finishing a stale suspend before the resume");
                self.suspend(r, false).await?;
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
            Err(s) => code_label(s.code()),
        };
        crate::metrics::resumed("cold", outcome, started);
        result
    }

    async fn resume_locked(
        &self,
        r: &ActorRef,
        steps: &StepTimes,
        lease: &Lease,
        request_id: Option<&str>,
    ) -> Result<(v1::Actor, bool), Failure> {
        self.faults.fire(FaultPoint::ResumeAfterLease)?;
        // Trace spans of the steps (disabled when traces are off), each from its creation to its
        // drop; an early return ends the step it is in.
        let step = ate_tls::trace_span!("load");
        // Re-read under the lease: another workflow may have finished in between.
        let actor = self.store.get_actor(&r.atespace, &r.name).await?;
        steps.mark("reread");
        match actor.state {
            ActorState::Running => return Ok((self.actor_message(&actor).await, false)),
            ActorState::Crashed => return Err(crashed(r, &actor.last_error).into()),
            ActorState::Suspending => return Err(transient(r, actor.state).into()),
            ActorState::Suspended | ActorState::Resuming => {}
        }
        let (ns, tname) = template_ref(&actor)?;
        let template = self.store.get_template(&ns, &tname).await?;
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

        let plan = decide(
            snapshot.as_ref().map(|s| SnapshotFacts {
                fidelity: s.fidelity,
                template: &s.template,
            }),
            &actor.template,
            worker.can_restore_memory,
        );
        let workload = workload(&actor, &template, &worker.id);
        let mut client = self.nodes.client(&worker.node_address)?;
        let call = async {
            match (plan, &snapshot) {
                (RestorePlan::Restore(fidelity), Some(snap)) => {
                    let req = v1::RestoreRequest {
                        workload: Some(workload),
                        snapshot: Some(convert::snapshot(snap)),
                        fidelity: fidelity.wire(),
                    };
                    client.restore(node_request(req, request_id)).await
                }
                _ => {
                    let req = v1::RunRequest {
                        workload: Some(workload),
                    };
                    client.run(node_request(req, request_id)).await
                }
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
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) if is_transient(&status) && unreachable(&status) => {
                // The node itself could not be reached (its machine may be lost): the restore
                // never started there, or its copy never served (the actor was never RUNNING),
                // so the actor may resume elsewhere — a new activation fences any copy the node
                // made. Released now and avoided for a while, the next attempt goes elsewhere.
                self.suspect_node(&worker.node);
                let update = ActorUpdate::with_error(format!(
                    "node {} unreachable during the resume ({}); resuming elsewhere",
                    worker.node,
                    status.message()
                ));
                self.store
                    .release_actor(
                        &r.atespace,
                        &r.name,
                        &[ActorState::Resuming],
                        ActorState::Suspended,
                        None,
                        update,
                        now_ms(),
                    )
                    .await?;
                tracing::warn!(actor = %r, node = %worker.node, error = %status.message(), "node unreachable during the resume; released to resume elsewhere");
                return Err(Status::unavailable(format!(
                    "node {} unreachable; the actor resumes on another node at the next attempt",
                    worker.node
                ))
                .into());
            }
            Ok(Err(status)) if is_transient(&status) => {
                // The actor stays RESUMING on this worker; the next resume picks up there.
                return Err(Status::unavailable(format!(
                    "worker {} unavailable: {}",
                    worker.id,
                    status.message()
                ))
                .into());
            }
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "worker {} did not answer within {:?}",
                    worker.id, self.cfg.node_call_timeout
                ))
                .into());
            }
            Ok(Err(status)) => {
                let why = format!(
                    "restore on worker {} failed: {}",
                    worker.id,
                    status.message()
                );
                tracing::warn!(actor = %r, worker = %worker.id, error = %status.message(), "resume failed; actor CRASHED");
                let update = ActorUpdate::with_error(why.clone());
                self.store
                    .release_actor(
                        &r.atespace,
                        &r.name,
                        &[ActorState::Resuming],
                        ActorState::Crashed,
                        None,
                        update,
                        now_ms(),
                    )
                    .await?;
                return Err(crashed(r, &why).into());
            }
        };
        steps.mark("node");
        self.faults.fire(FaultPoint::ResumeAfterNodeCall)?;
        let _step = ate_tls::trace_span!("finalize");

        // Finalize: the node's epoch must be the one the worker registered, else it restarted
        // during the restore and whatever it did is gone.
        let registered = self.store.get_worker(&worker.id).await?;
        if reply.epoch != registered.epoch || registered.status != WorkerStatus::Active {
            return Err(Status::unavailable(format!(
                "worker {} restarted during the restore (epoch {} != registered {})",
                worker.id, reply.epoch, registered.epoch
            ))
            .into());
        }
        let update = ActorUpdate {
            epoch: Some(reply.epoch),
            last_error: Some(String::new()),
            clear_attached_node: true,
        };
        // RUNNING and the lease's release in one write: the resume is over either way.
        lease.stop_renewal();
        let running = self
            .store
            .transition_releasing_lease(
                &r.atespace,
                &r.name,
                &[ActorState::Resuming],
                ActorState::Running,
                update,
                now_ms(),
                lease.key(),
                lease.holder(),
            )
            .await?;
        lease.released_in_store();
        steps.mark("finalize");
        tracing::info!(actor = %r, worker = %worker.id, ?plan, "actor resumed");
        Ok((convert::actor(&running, Some(&registered)), true))
    }

    /// A RESUMING actor whose worker is still ACTIVE is resumed there again (the previous attempt
    /// failed transiently); binding is idempotent.
    async fn rebind_existing(
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
                &actor.atespace,
                &actor.name,
                &[ActorState::Resuming],
                &worker.id,
                demand(template),
                now_ms(),
            )
            .instrument(ate_tls::trace_span!("bind", worker = %worker.id, rebind = true))
            .await
        {
            Ok(a) => Ok(Some((a, worker))),
            Err(StoreError::NoRoom { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Newest usable generation: node-local on a node still in the boot that wrote it, or with a
    /// COMPLETED durable copy; else the template's golden tag; else none (cold boot).
    async fn choose_snapshot(
        &self,
        actor: &ActorRecord,
        template: &TemplateRecord,
    ) -> Result<Option<SnapshotRecord>, Failure> {
        let workers = self.fleet.workers().await?;
        let usable = |s: &SnapshotRecord| {
            self.local_usable(s, &workers) || s.durable_status == Some(DurableStatus::Completed)
        };
        let snapshots = self
            .store
            .list_snapshots(&actor.atespace, &actor.name)
            .await?;
        if let Some(s) = snapshots.into_iter().find(|s| usable(s)) {
            return Ok(Some(s));
        }
        if actor.generation == 0
            && let Some(tag) = &template.spec.golden_tag
        {
            let (ts, tn) =
                ate_core::names::parse_namespaced("spec.goldenTag", tag).map_err(invalid)?;
            match self.store.get_tag(&ts, &tn).await {
                Ok(t) if usable(&t.snapshot) => return Ok(Some(t.snapshot)),
                Ok(_) => tracing::warn!(tag = %tag, "golden tag has no usable copy; cold boot"),
                Err(StoreError::NotFound(_)) => {
                    tracing::warn!(tag = %tag, "golden tag not found; cold boot")
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    fn local_usable(&self, s: &SnapshotRecord, workers: &[WorkerRecord]) -> bool {
        !s.local_path.is_empty()
            && workers.iter().any(|w| {
                w.status == WorkerStatus::Active && w.node == s.node && w.boot_id == s.boot_id
            })
    }

    /// Picks a worker and binds the actor to it. Returns whether the actor's node-local snapshot
    /// had to be detached (uploaded) so it could move to another node.
    async fn assign(
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
        // A node-local generation without a durable copy pins the actor to its node.
        let mut pinned = snapshot
            .filter(|s| s.durable_status != Some(DurableStatus::Completed))
            .map(|s| s.node.clone());
        let mut detached = false;
        let demand = demand(template);
        let from = [ActorState::Suspended, ActorState::Resuming];
        let actor_key = format!("{}/{}", actor.atespace, actor.name);
        let frozen_on = match snapshot {
            Some(s) => {
                self.frozen_worker(&actor.atespace, &actor.name, s.generation)
                    .await
            }
            None => None,
        };
        // What this resume waits for if it finds no room (its entry in the admission queue).
        let needs = || scheduler::Needs {
            selector: selector.clone(),
            sandbox_class: sandbox_class.to_string(),
            demand,
        };
        let mut refreshed = false;
        let mut attempt = 0;
        let mut backoff = Backoff::new(Duration::from_millis(10), &BIND_BACKOFF);
        loop {
            let workers = if refreshed {
                self.fleet.workers().await?
            } else {
                self.fleet.refresh().await?
            };
            refreshed = true;
            let suspects = self.suspects();
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
            };
            // Room that older waiting resumes fit into is not offered to this one.
            let now = Instant::now();
            let candidates = self.waiters.admissible(&actor_key, &req, &workers, now);
            let Some(worker) = scheduler::pick_preferring(&candidates, frozen_on.as_deref()) else {
                if let (Some(node), Some(snap)) = (pinned.clone(), snapshot) {
                    let anywhere = Requirements { node: None, ..req };
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
                self.waiters.no_room(&actor_key, needs(), Instant::now());
                return Err(Status::resource_exhausted(NO_ROOM_MESSAGE).into());
            };
            match self
                .store
                .bind_actor(
                    &actor.atespace,
                    &actor.name,
                    &from,
                    &worker.id,
                    demand,
                    now_ms(),
                )
                .instrument(ate_tls::trace_span!("bind", worker = %worker.id, attempt))
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
                    return Err(Status::resource_exhausted(NO_ROOM_MESSAGE).into());
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
        let node_address = workers
            .iter()
            .find(|w| w.node == node && w.status == WorkerStatus::Active)
            .map(|w| w.node_address.clone())
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "node {node} holding the actor's snapshot is not registered"
                ))
            })?;
        let mut client = self.nodes.client(&node_address)?;
        let req = v1::DetachRequest {
            actor: Some(v1::ObjectRef {
                atespace: actor.atespace.clone(),
                name: actor.name.clone(),
            }),
            snapshots: vec![convert::snapshot(snap)],
        };
        let reply = client
            .detach(req)
            .await
            .map_err(|s| {
                Status::unavailable(format!("detach from node {node} failed: {}", s.message()))
            })?
            .into_inner();
        for s in reply.snapshots {
            let status =
                DurableStatus::from_wire(s.durable_status).unwrap_or(DurableStatus::Failed);
            self.store
                .update_snapshot_durable(
                    &actor.atespace,
                    &actor.name,
                    s.generation,
                    status,
                    &s.durable_uri,
                    &s.reason,
                )
                .await?;
            if status == DurableStatus::Completed {
                self.store
                    .clear_snapshot_local(&actor.atespace, &actor.name, s.generation)
                    .await?;
            } else {
                return Err(Status::unavailable(format!(
                    "upload of generation {} failed: {}",
                    s.generation, s.reason
                ))
                .into());
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ suspend

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
                return Err(Status::unavailable(format!(
                    "worker {} unavailable: {}",
                    worker.id,
                    status.message()
                ))
                .into());
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

    // ------------------------------------------------------------------ logs

    /// A part of the actor's log, read on the node it runs on (else the node holding its
    /// newest generation): each node keeps the output of the actor's runs there.
    pub async fn read_log(
        &self,
        r: &ActorRef,
        offset: u64,
    ) -> Result<v1::ReadActorLogResponse, Status> {
        let actor = self
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(error::store)?;
        let workers = self.fleet.refresh().await.map_err(error::store)?;
        let on_worker = actor
            .worker_id
            .as_ref()
            .and_then(|id| workers.iter().find(|w| &w.id == id))
            .map(|w| w.node.clone());
        let node = match on_worker.or_else(|| actor.attached_node.clone()) {
            Some(n) => Some(n),
            None => self
                .store
                .list_snapshots(&r.atespace, &r.name)
                .await
                .map_err(error::store)?
                .first()
                .map(|s| s.node.clone())
                .filter(|n| !n.is_empty()),
        };
        let Some(node) = node else {
            return Err(Status::not_found(format!(
                "actor {r} has not run yet: it has no log"
            )));
        };
        let address = workers
            .iter()
            .find(|w| w.node == node && w.status == WorkerStatus::Active)
            .map(|w| w.node_address.clone())
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "node {node}, which holds the log of actor {r}, is not registered"
                ))
            })?;
        let mut client = self.nodes.client(&address)?;
        let reply = client
            .read_log(v1::ReadLogRequest {
                actor: Some(v1::ObjectRef {
                    atespace: r.atespace.clone(),
                    name: r.name.clone(),
                }),
                offset,
                max_bytes: 1 << 20,
            })
            .await
            .map_err(|s| {
                Status::unavailable(format!("reading the log on node {node}: {}", s.message()))
            })?
            .into_inner();
        if !reply.found {
            return Err(Status::not_found(format!(
                "actor {r} has no log on node {node}"
            )));
        }
        Ok(v1::ReadActorLogResponse {
            data: reply.data,
            next_offset: reply.next_offset,
            node,
        })
    }

    // ------------------------------------------------------------------ revert / delete

    pub async fn revert(&self, r: &ActorRef) -> Result<v1::Actor, Status> {
        r.validate().map_err(invalid)?;
        self.under_lease(r, async {
            let actor = self.store.get_actor(&r.atespace, &r.name).await?;
            match actor.state {
                ActorState::Suspended => Ok(convert::actor(&actor, None)),
                ActorState::Crashed => {
                    let a = self.store.release_actor(&r.atespace, &r.name, &[ActorState::Crashed], ActorState::Suspended, None, ActorUpdate::default(), now_ms()).await?;
                    Ok(convert::actor(&a, None))
                }
                state => Err(Status::failed_precondition(format!("RevertActor is refused while actor {r} is {state}; it reverts only ACTOR_STATE_CRASHED")).into()),
            }
        })
        .await
    }

    /// Deletes the actor and its generations. `force` also deletes an active actor: its
    /// sandbox is stopped without a snapshot first. Returns whether one was stopped.
    pub async fn delete(&self, r: &ActorRef, force: bool) -> Result<bool, Status> {
        r.validate().map_err(invalid)?;
        let (garbage, stopped) = self
            .under_lease(r, async {
                let stopped = if force {
                    self.stop_without_snapshot(r).await?
                } else {
                    false
                };
                match self.store.delete_actor(&r.atespace, &r.name).await {
                    Ok(garbage) => Ok((garbage, stopped)),
                    Err(StoreError::StateConflict { actual, .. }) => Err(Status::failed_precondition(format!(
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
        let actor = self.store.get_actor(&r.atespace, &r.name).await?;
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
                    let call = client.stop(v1::StopRequest {
                        actor: Some(v1::ObjectRef {
                            atespace: r.atespace.clone(),
                            name: r.name.clone(),
                        }),
                        worker_id: w.id.clone(),
                    });
                    match tokio::time::timeout(self.cfg.node_call_timeout, call).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(s)) => {
                            return Err(Status::unavailable(format!(
                                "cannot stop actor {r} on worker {}: {}; nothing was deleted",
                                w.id,
                                s.message()
                            ))
                            .into());
                        }
                        Err(_) => {
                            return Err(Status::unavailable(format!(
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
                &r.atespace,
                &r.name,
                &active,
                ActorState::Suspended,
                None,
                ActorUpdate::with_error("deleted with --force: stopped without a snapshot"),
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
            let actor = Some(v1::ObjectRef {
                atespace: r.atespace.clone(),
                name: r.name.clone(),
            });
            calls.spawn(async move {
                let call = async {
                    nodes
                        .client(&address)?
                        .forget_actor(v1::ForgetActorRequest { actor })
                        .await
                };
                match tokio::time::timeout(Duration::from_secs(3), call).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(s)) => tracing::warn!(node = %address, error = %s.message(), "cannot remove a deleted actor's log"),
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
    /// [`Store::prune_snapshots`]) and deletes their files in the background, so a suspend does
    /// not wait for object-store deletes.
    async fn prune_generations(&self, r: &ActorRef) {
        let garbage = match self
            .store
            .prune_snapshots(&r.atespace, &r.name, KEEP_NEWEST_GENERATIONS)
            .await
        {
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

    // ------------------------------------------------------------------ fleet reports

    /// A worker saw all of an actor's processes exit while RUNNING: release its capacity at once
    /// and leave it SUSPENDED with its last usable generation. With a `crash_reason` the worker
    /// ended the actor because it must not run on (its restored memory could not be completed):
    /// it becomes CRASHED with that reason, for an operator to look at before RevertActor.
    pub async fn actor_exited(
        &self,
        r: &ActorRef,
        worker_id: &str,
        exit_code: i32,
        last_lines: &str,
        crash_reason: &str,
    ) -> Result<(), Status> {
        r.validate().map_err(invalid)?;
        let actor = self
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(error::store)?;
        if actor.state != ActorState::Running || actor.worker_id.as_deref() != Some(worker_id) {
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
        let update = ActorUpdate::with_error(why);
        match self
            .store
            .release_actor(
                &r.atespace,
                &r.name,
                &[ActorState::Running],
                next,
                None,
                update,
                now_ms(),
            )
            .await
        {
            Ok(_) | Err(StoreError::StateConflict { .. }) => Ok(()),
            Err(e) => Err(error::store(e)),
        }
    }

    /// Marks workers without a heartbeat for the lease plus a margin GONE; their RESUMING actors
    /// go to CRASHED, their RUNNING and SUSPENDING actors to SUSPENDED with their last snapshot.
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
    /// - `restarted` (a new epoch, or the worker was GONE): RUNNING and SUSPENDING actors the
    ///   worker does not hold go to SUSPENDED with their last generation; RESUMING ones stay
    ///   bound (a restore interrupted by a worker restart is transient: spec, resume "Finalize"),
    ///   so the next ResumeActor re-binds and restores there.
    ///
    /// Without `restarted` (the node agent restarted, same worker process) an actor that is not
    /// held is left alone: a resume may have finished after the node listed the worker's actors,
    /// and real exits are reported by the exit watcher.
    pub async fn reconcile_worker(
        &self,
        worker_id: &str,
        held: &[v1::HeldActor],
        restarted: bool,
    ) -> Result<Vec<v1::HeldActor>, StoreError> {
        let on_worker = self.store.actors_on_worker(worker_id).await?;
        let mut discard = Vec::new();
        for h in held {
            let Some(a) = &h.actor else { continue };
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
                        && h.actor
                            .as_ref()
                            .is_some_and(|r| r.atespace == a.atespace && r.name == a.name)
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
    async fn readopt(&self, worker_id: &str, a: &v1::ObjectRef, activation: u64) -> bool {
        let Ok(actor) = self.store.get_actor(&a.atespace, &a.name).await else {
            return false;
        };
        if actor.state != ActorState::Suspended || actor.activation != activation {
            return false;
        }
        let Ok((ns, tname)) = template_ref(&actor) else {
            return false;
        };
        let Ok(template) = self.store.get_template(&ns, &tname).await else {
            return false;
        };
        match self
            .store
            .readopt_actor(
                &a.atespace,
                &a.name,
                worker_id,
                activation,
                demand(&template),
                now_ms(),
            )
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
            ActorState::Running | ActorState::Suspending => (
                ActorState::Suspended,
                format!("worker {worker_id} gone; resumes from the last generation"),
            ),
            _ => return Ok(()),
        };
        tracing::warn!(actor = %format!("{}/{}", a.atespace, a.name), worker = %worker_id, from = %a.state, to = %to, "releasing an actor of a gone worker");
        let update = ActorUpdate::with_error(why);
        match self
            .store
            .release_actor(&a.atespace, &a.name, &[a.state], to, None, update, now_ms())
            .await
        {
            Ok(_) | Err(StoreError::StateConflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn demand(template: &TemplateRecord) -> Capacity {
    Capacity {
        cpu_millis: u64::from(template.spec.resources.cpu_millis),
        memory_bytes: template.spec.resources.memory_bytes,
        slots: 1,
    }
}

fn workload(actor: &ActorRecord, template: &TemplateRecord, worker_id: &str) -> v1::Workload {
    v1::Workload {
        actor: Some(v1::ObjectRef {
            atespace: actor.atespace.clone(),
            name: actor.name.clone(),
        }),
        uid: actor.uid.clone(),
        template: actor.template.clone(),
        spec: Some(ate_proto::spec_to_wire(&template.spec)),
        worker_id: worker_id.to_string(),
        activation: actor.activation,
    }
}

fn code_label(code: Code) -> &'static str {
    match code {
        Code::ResourceExhausted => "no_room",
        Code::Aborted => "aborted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Unavailable => "unavailable",
        Code::NotFound => "not_found",
        Code::InvalidArgument => "invalid_argument",
        _ => "error",
    }
}

impl Api {
    /// True when the actor's last change is older than a lease: whatever workflow set its
    /// transient state is no longer running.
    fn stale(&self, actor: &ActorRecord) -> bool {
        let lease_ms = i64::try_from(self.cfg.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        now_ms().saturating_sub(actor.updated_ms) > lease_ms
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        self.cfg.heartbeat_timeout
    }

    /// See [`ApiConfig::sole_replica`].
    pub fn sole_replica(&self) -> bool {
        self.cfg.sole_replica
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
        let target = workers
            .iter()
            .find(|w| w.status == WorkerStatus::Active && w.node == snap.node)
            .map(|w| w.node_address.clone())
            .or_else(|| any_node.clone());
        let Some(address) = target else {
            tracing::warn!(actor = %format!("{}/{}", snap.atespace, snap.name), generation = snap.generation, uri = %snap.durable_uri, "no live node to delete snapshot files");
            continue;
        };
        let result = match nodes.client(&address) {
            Ok(mut c) => c
                .delete_snapshots(v1::DeleteSnapshotsRequest {
                    snapshots: vec![convert::snapshot(&snap)],
                })
                .await
                .map(|_| ()),
            Err(s) => Err(s),
        };
        if let Err(s) = result {
            tracing::warn!(generation = snap.generation, uri = %snap.durable_uri, error = %s.message(), "snapshot garbage collection failed");
        }
    }
}
