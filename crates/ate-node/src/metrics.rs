//! The node agent's Prometheus series (`ate_node_…`): names, descriptions, and the recording
//! helpers NodeService calls. Rendered by the endpoint every component shares
//! ([`ate_telemetry`]) when `ate node --metrics-listen` is given; without it the calls
//! below record into nothing.

use std::time::{Duration, Instant};

use ate_snapshot::UploadPriority;
use ate_telemetry::PrometheusHandle;
use metrics::Unit;

pub const RUNS: &str = "ate_node_runs_total";
pub const RESTORES: &str = "ate_node_restores_total";
pub const RESTORE_SECONDS: &str = "ate_node_restore_seconds";
pub const CHECKPOINTS: &str = "ate_node_checkpoints_total";
pub const CHECKPOINT_SECONDS: &str = "ate_node_checkpoint_seconds";
pub const SNAPSHOT_BYTES_WRITTEN: &str = "ate_node_snapshot_bytes_written_total";
pub const DOWNLOADS: &str = "ate_node_downloads_total";
pub const DOWNLOAD_SECONDS: &str = "ate_node_download_seconds";
pub const DOWNLOADED_BYTES: &str = "ate_node_downloaded_bytes_total";
pub const LOCAL_REPLACED: &str = "ate_node_local_generations_replaced_total";
pub const UPLOADS: &str = "ate_node_uploads_total";
pub const UPLOAD_SECONDS: &str = "ate_node_upload_seconds";
pub const UPLOADED_BYTES: &str = "ate_node_uploaded_bytes_total";
pub const BACKGROUND_UPLOADS: &str = "ate_node_background_uploads";
pub const FROZEN_COPIES: &str = "ate_node_frozen_copies";
pub const MEMORY_PRESSURE_SUSPENDS: &str = "ate_node_memory_pressure_suspends_total";

/// Every series of the node agent with its help text (`# HELP` / `# TYPE` on `/metrics`).
pub fn describe() {
    metrics::describe_counter!(
        MEMORY_PRESSURE_SUSPENDS,
        Unit::Count,
        "Idle actors the node asked to suspend because the host's available memory was below --memory-low-percent (after every frozen copy was dropped)."
    );
    metrics::describe_counter!(
        RUNS,
        Unit::Count,
        "Cold starts (NodeService.Run) by outcome (ok, or the gRPC code in snake case)."
    );
    metrics::describe_counter!(
        RESTORES,
        Unit::Count,
        "Restores of a generation (NodeService.Restore) by outcome (ok, or the gRPC code in snake case)."
    );
    metrics::describe_histogram!(
        RESTORE_SECONDS,
        Unit::Seconds,
        "Restore latency on the node (fetching the generation if needed, and the worker's start), by outcome."
    );
    metrics::describe_counter!(
        CHECKPOINTS,
        Unit::Count,
        "Checkpoints (NodeService.Checkpoint) by outcome (ok, or the gRPC code in snake case)."
    );
    metrics::describe_histogram!(
        CHECKPOINT_SECONDS,
        Unit::Seconds,
        "Checkpoint latency on the node (the worker's checkpoint, and the durable upload when the suspend asked for it), by outcome."
    );
    metrics::describe_counter!(
        SNAPSHOT_BYTES_WRITTEN,
        Unit::Bytes,
        "Bytes of the generations checkpointed on this node (their files' total size)."
    );
    metrics::describe_counter!(
        DOWNLOADS,
        Unit::Count,
        "Generations fetched from the durable store for a restore, by outcome (ok, error) and kind (whole: every file; lazy: the small files and the chunks CRIU reads, the rest fetched by the worker's page source)."
    );
    metrics::describe_histogram!(
        DOWNLOAD_SECONDS,
        Unit::Seconds,
        "Time to fetch a generation from the durable store and verify it, by outcome and kind."
    );
    metrics::describe_counter!(
        DOWNLOADED_BYTES,
        Unit::Bytes,
        "Bytes downloaded from the durable store by the node (uncompressed; a lazy download counts its small files, the workers count the memory chunks they fetch)."
    );
    metrics::describe_counter!(
        LOCAL_REPLACED,
        Unit::Count,
        "Damaged node-local generations replaced by their durable copy during a restore."
    );
    metrics::describe_counter!(
        UPLOADS,
        Unit::Count,
        "Uploads of generations to the durable store by priority (normal: a caller waits; background: after an ASYNC suspend) and outcome (ok, error)."
    );
    metrics::describe_histogram!(
        UPLOAD_SECONDS,
        Unit::Seconds,
        "Time to upload a generation to the durable store, by priority and outcome."
    );
    metrics::describe_counter!(
        UPLOADED_BYTES,
        Unit::Bytes,
        "Bytes of the generations uploaded to the durable store, by priority."
    );
    metrics::describe_gauge!(
        BACKGROUND_UPLOADS,
        Unit::Count,
        "Background uploads by state: queued (waiting for one of the node's upload slots) or running."
    );
    metrics::describe_gauge!(
        FROZEN_COPIES,
        Unit::Count,
        "Actors this node knows to be kept frozen in place on one of its workers after their last checkpoint."
    );
    // Present (at zero) from the start: rate() and alerts need the series before the first event.
    for state in ["queued", "running"] {
        metrics::gauge!(BACKGROUND_UPLOADS, "state" => state).increment(0.0);
    }
    for priority in ["normal", "background"] {
        metrics::counter!(UPLOADED_BYTES, "priority" => priority).increment(0);
    }
    metrics::counter!(SNAPSHOT_BYTES_WRITTEN).increment(0);
    metrics::counter!(DOWNLOADED_BYTES).increment(0);
    metrics::counter!(LOCAL_REPLACED).increment(0);
}

/// Installs the process-wide recorder with the node agent's series (idempotent).
pub fn install() -> &'static PrometheusHandle {
    ate_telemetry::install("node", describe)
}

fn seconds(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

/// `outcome`: `ok`, or the gRPC code of the answer in snake case
/// (`ate_telemetry::outcome`).
pub(crate) fn ran(outcome: &'static str) {
    metrics::counter!(RUNS, "outcome" => outcome).increment(1);
}

pub(crate) fn restored(outcome: &'static str, begun: Instant) {
    metrics::counter!(RESTORES, "outcome" => outcome).increment(1);
    metrics::histogram!(RESTORE_SECONDS, "outcome" => outcome).record(seconds(begun));
}

/// `written`: the size of the generation a successful checkpoint wrote.
pub(crate) fn checkpointed(outcome: &'static str, begun: Instant, written: Option<u64>) {
    metrics::counter!(CHECKPOINTS, "outcome" => outcome).increment(1);
    metrics::histogram!(CHECKPOINT_SECONDS, "outcome" => outcome).record(seconds(begun));
    if let Some(bytes) = written {
        metrics::counter!(SNAPSHOT_BYTES_WRITTEN).increment(bytes);
    }
}

/// `kind`: `whole` or `lazy` (see the description of [`DOWNLOADS`]).
pub(crate) fn downloaded(kind: &'static str, ok: bool, bytes: u64, took: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!(DOWNLOADS, "outcome" => outcome, "kind" => kind).increment(1);
    metrics::histogram!(DOWNLOAD_SECONDS, "outcome" => outcome, "kind" => kind)
        .record(took.as_secs_f64());
    if ok {
        metrics::counter!(DOWNLOADED_BYTES).increment(bytes);
    }
}

pub(crate) fn local_replaced() {
    metrics::counter!(LOCAL_REPLACED).increment(1);
}

fn priority_label(priority: UploadPriority) -> &'static str {
    match priority {
        UploadPriority::Background => "background",
        _ => "normal",
    }
}

pub(crate) fn uploaded<T, E>(
    priority: UploadPriority,
    result: &Result<T, E>,
    bytes: u64,
    begun: Instant,
) {
    let priority = priority_label(priority);
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics::counter!(UPLOADS, "priority" => priority, "outcome" => outcome).increment(1);
    metrics::histogram!(UPLOAD_SECONDS, "priority" => priority, "outcome" => outcome)
        .record(seconds(begun));
    if result.is_ok() {
        metrics::counter!(UPLOADED_BYTES, "priority" => priority).increment(bytes);
    }
}

/// A background upload in the `ate_node_background_uploads` gauge: queued from creation,
/// running after [`BackgroundUpload::running`], gone when dropped.
pub(crate) struct BackgroundUpload {
    state: &'static str,
}

impl BackgroundUpload {
    pub(crate) fn queued() -> Self {
        metrics::gauge!(BACKGROUND_UPLOADS, "state" => "queued").increment(1.0);
        BackgroundUpload { state: "queued" }
    }

    pub(crate) fn running(&mut self) {
        if self.state == "queued" {
            metrics::gauge!(BACKGROUND_UPLOADS, "state" => "queued").decrement(1.0);
            metrics::gauge!(BACKGROUND_UPLOADS, "state" => "running").increment(1.0);
            self.state = "running";
        }
    }
}

impl Drop for BackgroundUpload {
    fn drop(&mut self) {
        metrics::gauge!(BACKGROUND_UPLOADS, "state" => self.state).decrement(1.0);
    }
}

pub(crate) fn frozen_copies(n: usize) {
    metrics::gauge!(FROZEN_COPIES).set(n as f64);
}
