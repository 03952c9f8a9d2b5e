//! The worker's Prometheus series (`ate_worker_…`): names, descriptions, and the recording
//! helpers WorkerService and the actor table call. Rendered by the endpoint every component
//! shares ([`ate_telemetry`]) when `ate worker --metrics-listen` is given; without it the
//! calls below record into nothing.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ate_telemetry::PrometheusHandle;
use metrics::Unit;

use crate::worker::{CheckpointReply, VerbError, outcome};

pub const STARTS: &str = "ate_worker_starts_total";
pub const START_SECONDS: &str = "ate_worker_start_seconds";
pub const START_PHASE_SECONDS: &str = "ate_worker_start_phase_seconds";
pub const THAWS: &str = "ate_worker_thaws_total";
pub const CHECKPOINTS: &str = "ate_worker_checkpoints_total";
pub const CHECKPOINT_SECONDS: &str = "ate_worker_checkpoint_seconds";
pub const CHECKPOINT_PHASE_SECONDS: &str = "ate_worker_checkpoint_phase_seconds";
pub const INCREMENTAL_CHECKPOINTS: &str = "ate_worker_incremental_checkpoints_total";
pub const FLATTEN_SECONDS: &str = ate_generation::delta::FLATTEN_SECONDS;
pub const SNAPSHOT_BYTES_WRITTEN: &str = "ate_worker_snapshot_bytes_written_total";
pub const SNAPSHOT_SIZE: &str = "ate_worker_snapshot_size_bytes";
pub const ACTORS_ACTIVE: &str = "ate_worker_actors_active";
pub const SLOTS: &str = "ate_worker_slots";
pub const CPU_USAGE: &str = "ate_worker_cpu_usage_millicores";
pub const FROZEN_ACTORS: &str = "ate_worker_frozen_actors";
pub const LAZY_RESTORES: &str = "ate_worker_lazy_restores_total";
pub const LAZY_CHUNKS: &str = "ate_worker_lazy_chunks_total";
pub const LAZY_PREFETCHED_CHUNKS: &str = "ate_worker_lazy_prefetched_chunks_total";
pub const LAZY_ALL_IN_SECONDS: &str = "ate_worker_lazy_all_in_seconds";
pub const MEMORY_DUMP_FAILURES: &str = "ate_worker_memory_dump_failures_total";
pub const MEMORY_STREAMED_BYTES: &str = "ate_worker_memory_streamed_bytes_total";
pub const EXEC_SESSIONS: &str = "ate_worker_exec_sessions_total";
pub const EXEC_OPEN: &str = "ate_worker_exec_sessions_open";

/// How an exec session ended (the `ended` label of [`EXEC_SESSIONS`]).
pub const EXEC_ENDINGS: [&str; 4] = ["exited", "not_run", "caller_gone", "ingress_off"];

/// Every series of the worker with its help text (`# HELP` / `# TYPE` on `/metrics`).
pub fn describe() {
    metrics::describe_counter!(
        STARTS,
        Unit::Count,
        "Actor starts by kind (cold: a fresh boot; restore: from a generation, a thaw in place included) and outcome (ok, or the gRPC code in snake case)."
    );
    metrics::describe_histogram!(
        START_SECONDS,
        Unit::Seconds,
        "Time from a start request to the actor ready (probe passed, ingress on), by kind and outcome."
    );
    metrics::describe_histogram!(
        START_PHASE_SECONDS,
        Unit::Seconds,
        "Phases of a successful start, by kind and phase: verify (checksums of the generation's files, alongside extract and runtime), extract (rootfs and volumes), runtime (runc/CRIU restore or run), boot_and_egress (from the request to the sandbox started with its egress proxy), probe (the wakeup probe)."
    );
    metrics::describe_counter!(
        THAWS,
        Unit::Count,
        "Restores served by thawing a sandbox kept frozen in place, by outcome (ok; failed: the generation was restored instead)."
    );
    metrics::describe_counter!(
        CHECKPOINTS,
        Unit::Count,
        "Checkpoints by fidelity captured (memory, rootfs, volumes; none on failure) and outcome (ok, or the gRPC code in snake case)."
    );
    metrics::describe_histogram!(
        CHECKPOINT_SECONDS,
        Unit::Seconds,
        "Checkpoint latency on the worker (grace for requests in flight included), by outcome."
    );
    metrics::describe_histogram!(
        CHECKPOINT_PHASE_SECONDS,
        Unit::Seconds,
        "Phases of a successful checkpoint: quiesce (requests in flight, connections closing), dump_or_stop (CRIU dump, freeze or stop), seal (archives, checksums, manifest)."
    );
    metrics::describe_counter!(
        INCREMENTAL_CHECKPOINTS,
        Unit::Count,
        "Memory checkpoints of actors whose writes were tracked, by dump: incremental (only the pages written since the parent generation), or whole and why (small, tracking_lost, no_parent, parent_unreadable)."
    );
    metrics::describe_histogram!(
        FLATTEN_SECONDS,
        Unit::Seconds,
        "Time to make an incremental generation whole (its parent's pages merged in, resealed), in the background after the suspend or before a restore or upload."
    );
    metrics::describe_counter!(
        SNAPSHOT_BYTES_WRITTEN,
        Unit::Bytes,
        "Bytes of the generations this worker wrote (their files' total size)."
    );
    metrics::describe_histogram!(
        SNAPSHOT_SIZE,
        Unit::Bytes,
        "Size of each generation this worker wrote, by fidelity."
    );
    metrics::describe_gauge!(
        ACTORS_ACTIVE,
        Unit::Count,
        "Actors running on this worker (each takes a slot)."
    );
    metrics::describe_gauge!(SLOTS, Unit::Count, "Actor slots this worker offers.");
    metrics::describe_gauge!(
        CPU_USAGE,
        Unit::Count,
        "CPU this worker's running actors used over the last sampling window (2 s), in millicores, from their cgroups."
    );
    metrics::describe_gauge!(
        FROZEN_ACTORS,
        Unit::Count,
        "Checkpointed actors kept frozen in place (no slot taken; a resume here thaws them)."
    );
    metrics::describe_counter!(
        LAZY_RESTORES,
        Unit::Count,
        "Lazy memory restores by outcome once their page source ended: complete (every page in), failed (a damaged chunk or a dead page source: the actor was stopped and marked CRASHED)."
    );
    metrics::describe_counter!(
        LAZY_CHUNKS,
        Unit::Count,
        "2 MiB memory chunks placed by completed lazy restores, by where they came from: local (the generation on this node), store (fetched from the durable store)."
    );
    metrics::describe_counter!(
        LAZY_PREFETCHED_CHUNKS,
        Unit::Count,
        "Chunks completed lazy restores pushed first because the previous restore's working set named them."
    );
    metrics::describe_histogram!(
        LAZY_ALL_IN_SECONDS,
        Unit::Seconds,
        "Time from a lazy restore's start until every page of the actor's memory was in (the actor answers long before)."
    );
    metrics::describe_counter!(
        MEMORY_DUMP_FAILURES,
        Unit::Count,
        "MEMORY suspends whose memory could not be dumped, by what followed: suspend_failed (nothing written, the actor runs on or, if its sandbox did not survive, stays at its previous generation), rootfs_fallback (the template's snapshots.onMemoryFailure: rootfs wrote a ROOTFS generation: the process memory is lost)."
    );
    metrics::describe_counter!(
        MEMORY_STREAMED_BYTES,
        Unit::Bytes,
        "Memory image bytes eager restores of sealed generations streamed to CRIU, opened and checked as CRIU read them (no plaintext copy written first)."
    );
    metrics::describe_counter!(
        EXEC_SESSIONS,
        Unit::Count,
        "Exec sessions (ate exec, ate cp) by how they ended: exited (the command's own exit), not_run (the command was not found or not runnable), caller_gone (its process tree killed), ingress_off (ended by a suspend or stop of the actor)."
    );
    metrics::describe_gauge!(
        EXEC_OPEN,
        Unit::Count,
        "Exec sessions open now (each keeps its actor from idle suspend)."
    );
    // Present (at zero) from the start: rate() needs the series before the first event.
    for ended in EXEC_ENDINGS {
        metrics::counter!(EXEC_SESSIONS, "ended" => ended).increment(0);
    }
    metrics::gauge!(EXEC_OPEN).set(0.0);
    metrics::counter!(SNAPSHOT_BYTES_WRITTEN).increment(0);
    metrics::counter!(MEMORY_STREAMED_BYTES).increment(0);
    metrics::counter!(LAZY_PREFETCHED_CHUNKS).increment(0);
    for source in ["local", "store"] {
        metrics::counter!(LAZY_CHUNKS, "source" => source).increment(0);
    }
    for outcome in ["complete", "failed"] {
        metrics::counter!(LAZY_RESTORES, "outcome" => outcome).increment(0);
    }
    for outcome in ["suspend_failed", "rootfs_fallback"] {
        metrics::counter!(MEMORY_DUMP_FAILURES, "outcome" => outcome).increment(0);
    }
}

/// Installs the process-wide recorder with the worker's series (idempotent).
pub fn install() -> &'static PrometheusHandle {
    ate_telemetry::install("worker", describe)
}

/// `kind` label of a start request with this generation directory (empty: a cold boot).
pub(crate) fn start_kind(generation_dir: &str) -> &'static str {
    if generation_dir.is_empty() {
        "cold"
    } else {
        "restore"
    }
}

pub(crate) fn started<T>(kind: &'static str, result: &Result<T, VerbError>, begun: Instant) {
    let outcome = outcome(result);
    metrics::counter!(STARTS, "kind" => kind, "outcome" => outcome).increment(1);
    metrics::histogram!(START_SECONDS, "kind" => kind, "outcome" => outcome)
        .record(begun.elapsed().as_secs_f64());
}

pub(crate) fn start_phase(kind: &'static str, phase: &'static str, took: Duration) {
    metrics::histogram!(START_PHASE_SECONDS, "kind" => kind, "phase" => phase)
        .record(took.as_secs_f64());
}

pub(crate) fn thawed(ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    metrics::counter!(THAWS, "outcome" => outcome).increment(1);
}

pub(crate) fn checkpointed(result: &Result<CheckpointReply, VerbError>, begun: Instant) {
    let outcome = outcome(result);
    let fidelity = result
        .as_ref()
        .map_or("none", |reply| reply.fidelity.short());
    metrics::counter!(CHECKPOINTS, "fidelity" => fidelity, "outcome" => outcome).increment(1);
    metrics::histogram!(CHECKPOINT_SECONDS, "outcome" => outcome)
        .record(begun.elapsed().as_secs_f64());
    if let Ok(reply) = result {
        metrics::counter!(SNAPSHOT_BYTES_WRITTEN).increment(reply.size_bytes);
        metrics::histogram!(SNAPSHOT_SIZE, "fidelity" => fidelity).record(reply.size_bytes as f64);
    }
}

/// A completed lazy restore, with the page source's summary (`key=value …`, see
/// `ate_page_source::Stats::summary`).
pub(crate) fn lazy_restore_done(summary: &str) {
    metrics::counter!(LAZY_RESTORES, "outcome" => "complete").increment(1);
    let value = |key: &str| {
        summary
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    let read = value("chunks").unwrap_or(0);
    let fetched = value("fetched").unwrap_or(0).min(read);
    metrics::counter!(LAZY_CHUNKS, "source" => "local").increment(read - fetched);
    metrics::counter!(LAZY_CHUNKS, "source" => "store").increment(fetched);
    metrics::counter!(LAZY_PREFETCHED_CHUNKS).increment(value("prefetched").unwrap_or(0));
    if let Some(ms) = value("all_in_ms") {
        metrics::histogram!(LAZY_ALL_IN_SECONDS).record(ms as f64 / 1000.0);
    }
}

pub(crate) fn lazy_restore_failed() {
    metrics::counter!(LAZY_RESTORES, "outcome" => "failed").increment(1);
}

/// A MEMORY suspend that could not dump memory; `fell_back`: it wrote ROOTFS as the template
/// allows, else the suspend failed.
pub(crate) fn memory_dump_failed(fell_back: bool) {
    let outcome = if fell_back {
        "rootfs_fallback"
    } else {
        "suspend_failed"
    };
    metrics::counter!(MEMORY_DUMP_FAILURES, "outcome" => outcome).increment(1);
}

pub(crate) fn incremental_checkpoint(dump: &'static str) {
    metrics::counter!(INCREMENTAL_CHECKPOINTS, "dump" => dump).increment(1);
}

pub(crate) fn checkpoint_phase(phase: &'static str, took: Duration) {
    metrics::histogram!(CHECKPOINT_PHASE_SECONDS, "phase" => phase).record(took.as_secs_f64());
}

/// Keeps the slot and frozen gauges of `worker` current at every scrape while it lives.
pub(crate) fn export_gauges(worker: &Arc<crate::worker::Worker>) {
    let worker: Weak<crate::worker::Worker> = Arc::downgrade(worker);
    ate_telemetry::on_scrape(move || {
        let Some(worker) = worker.upgrade() else {
            return false;
        };
        let (active, frozen) = worker.occupancy();
        metrics::gauge!(ACTORS_ACTIVE).set(active as f64);
        metrics::gauge!(SLOTS).set(f64::from(worker.ident.slots));
        metrics::gauge!(FROZEN_ACTORS).set(frozen as f64);
        true
    });
}

/// Memory image bytes an eager restore streamed to CRIU.
pub(crate) fn memory_streamed(bytes: u64) {
    metrics::counter!(MEMORY_STREAMED_BYTES).increment(bytes);
}
