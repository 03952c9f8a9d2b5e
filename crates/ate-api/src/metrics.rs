//! The api's Prometheus series (`ate_api_…`): names, descriptions, and the fleet gauges.
//!
//! Recorded where the work happens (`workflows`, `scheduler`); rendered by the endpoint every
//! component shares ([`ate_telemetry`]).

use ate_telemetry::PrometheusHandle;
use metrics::Unit;

use ate_store::{WorkerRecord, WorkerStatus};

/// ResumeActor calls, by `path` (`warm`: the actor was running, one store read; `cold`: a
/// resume workflow under the actor's lease) and `outcome`.
pub const RESUME_TOTAL: &str = "ate_api_resume_total";
/// Their latency, with the same labels.
pub const RESUME_SECONDS: &str = "ate_api_resume_seconds";
/// The steps of a cold resume (`step`).
pub const RESUME_STEP_SECONDS: &str = "ate_api_resume_step_seconds";
/// SuspendActor workflows by `outcome`, and their latency.
pub const SUSPEND_TOTAL: &str = "ate_api_suspend_total";
pub const SUSPEND_SECONDS: &str = "ate_api_suspend_seconds";
/// Cold resumes waiting for room (the admission queue).
pub const ADMISSION_WAITERS: &str = "ate_api_admission_waiters";
/// Placements held back so that older waiting resumes get the room first.
pub const ADMISSION_DEFERRED: &str = "ate_api_admission_deferred_total";
/// Resumes not placed because no worker offers the restore capabilities their newest generation
/// needs (e.g. `memory:criu` for a memory snapshot).
pub const NO_CAPABLE_WORKER: &str = "ate_api_no_capable_worker_total";
/// Workers in the fleet by `status` (`active`, `gone`), as of the api's last fleet read.
pub const FLEET_WORKERS: &str = "ate_api_fleet_workers";
/// Actor slots of the active workers, and those assigned.
pub const FLEET_SLOTS: &str = "ate_api_fleet_slots";
pub const FLEET_SLOTS_USED: &str = "ate_api_fleet_slots_used";

/// Outcome of a warm resume: the actor was running already.
pub const WARM_OUTCOME: &str = "already_running";

/// Running actors suspended to make room for another (slots used as a cache), by outcome.
pub const EVICTIONS_TOTAL: &str = "ate_api_evictions_total";
/// Evicted actors that had been resumed less than [`crate::workflows::THRASH_WINDOW`] before.
pub const EVICTION_THRASH_TOTAL: &str = "ate_api_eviction_thrash_total";

/// Every series of the api with its help text (`# HELP` / `# TYPE` on `/metrics`).
pub fn describe() {
    metrics::describe_counter!(
        EVICTIONS_TOTAL,
        Unit::Count,
        "Running actors suspended (memory kept) because no worker had room for another, least recently used first, by outcome (suspended, or why not: the suspend's error)."
    );
    metrics::describe_counter!(
        EVICTION_THRASH_TOTAL,
        Unit::Count,
        "Evictions of an actor resumed less than a minute before: slots too few for the working set of actors (thrashing)."
    );
    metrics::describe_counter!(
        NO_CAPABLE_WORKER,
        Unit::Count,
        "Resumes answered ResourceExhausted because no worker offers the restore capabilities the newest generation needs (it is kept, never restored at a lower fidelity)."
    );
    metrics::describe_counter!(
        RESUME_TOTAL,
        Unit::Count,
        "ResumeActor calls by path (warm: the actor was running; cold: a resume workflow) and outcome (resumed, already_running, or the error: no_room, aborted, unavailable, failed_precondition, not_found, invalid_argument, error)."
    );
    metrics::describe_histogram!(
        RESUME_SECONDS,
        Unit::Seconds,
        "ResumeActor latency in the api, by path and outcome (as ate_api_resume_total)."
    );
    metrics::describe_histogram!(
        RESUME_STEP_SECONDS,
        Unit::Seconds,
        "Time of each step of a cold resume (step: lease, reread, template_and_snapshot, bind, node, finalize, release)."
    );
    metrics::describe_counter!(
        SUSPEND_TOTAL,
        Unit::Count,
        "SuspendActor workflows by outcome (suspended, or the error as for resumes)."
    );
    metrics::describe_histogram!(
        SUSPEND_SECONDS,
        Unit::Seconds,
        "SuspendActor workflow latency, by outcome."
    );
    metrics::describe_gauge!(
        ADMISSION_WAITERS,
        Unit::Count,
        "Cold resumes waiting for a worker with room (the admission queue)."
    );
    metrics::describe_counter!(
        ADMISSION_DEFERRED,
        Unit::Count,
        "Placements held back because the free room is set aside for older waiting resumes."
    );
    metrics::describe_gauge!(
        FLEET_WORKERS,
        Unit::Count,
        "Workers registered with the api, by status (active, gone), as of its last fleet read."
    );
    metrics::describe_gauge!(
        FLEET_SLOTS,
        Unit::Count,
        "Actor slots offered by the active workers, as of the api's last fleet read."
    );
    metrics::describe_gauge!(
        FLEET_SLOTS_USED,
        Unit::Count,
        "Actor slots of the active workers taken by assigned actors, as of the api's last fleet read."
    );
    // Present (at zero) from the start: alerts and rate() need the series before the first event.
    metrics::gauge!(ADMISSION_WAITERS).increment(0.0);
    metrics::counter!(ADMISSION_DEFERRED).increment(0);
}

/// Installs the process-wide recorder with the api's series (idempotent).
pub fn install() -> &'static PrometheusHandle {
    ate_telemetry::install("api", describe)
}

/// Sets the fleet gauges from a fresh read of the workers.
pub fn fleet(workers: &[WorkerRecord]) {
    let active = || workers.iter().filter(|w| w.status == WorkerStatus::Active);
    let gone = workers.len() - active().count();
    metrics::gauge!(FLEET_WORKERS, "status" => "active").set(active().count() as f64);
    metrics::gauge!(FLEET_WORKERS, "status" => "gone").set(gone as f64);
    metrics::gauge!(FLEET_SLOTS).set(active().map(|w| w.capacity.slots as f64).sum::<f64>());
    metrics::gauge!(FLEET_SLOTS_USED).set(active().map(|w| w.used.slots as f64).sum::<f64>());
}

/// A ResumeActor call that began at `started` ended with `outcome` on `path`.
pub fn resumed(path: &'static str, outcome: &'static str, started: std::time::Instant) {
    metrics::counter!(RESUME_TOTAL, "path" => path, "outcome" => outcome).increment(1);
    metrics::histogram!(RESUME_SECONDS, "path" => path, "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
}

/// One step of a cold resume took `took`.
pub fn resume_step(step: &'static str, took: std::time::Duration) {
    metrics::histogram!(RESUME_STEP_SECONDS, "step" => step).record(took.as_secs_f64());
}

/// A SuspendActor workflow that began at `started` ended with `outcome`.
pub fn suspended(outcome: &'static str, started: std::time::Instant) {
    metrics::counter!(SUSPEND_TOTAL, "outcome" => outcome).increment(1);
    metrics::histogram!(SUSPEND_SECONDS, "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
}
