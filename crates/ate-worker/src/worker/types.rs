//! What the worker's verbs take and return, in the worker's own terms: no wire type here. The
//! WorkerService adapter (`service.rs`, with `convert`) decodes requests into these and
//! encodes the answers and [`VerbError`]s back.

use std::path::PathBuf;
use std::time::Duration;

use ate_core::template::OnMemoryFailure;
use ate_core::{ActorRef, Fidelity, TemplateSpec};

/// Why a verb failed. Each variant is one gRPC code on the wire (the api and the node act on
/// the code: a failed precondition crashes the actor, unavailable is retried, ...); the message
/// is what the caller sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    /// The request itself is malformed (a missing field, a bad name or spec).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request cannot be served in this state, and retrying will not change that.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Every actor slot is in use, or the disk is full.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Passing: the worker is shutting down, or the actor's memory is still coming in.
    #[error("{0}")]
    Unavailable(String),
    /// A suspend that wrote nothing: the actor runs on.
    #[error("{0}")]
    Aborted(String),
    /// A host failure (I/O, a runtime command, a socket).
    #[error("{0}")]
    Internal(String),
    /// A checkpoint failed and the sandbox did not survive it (a dump killed inside the
    /// actor's processes): nothing was written and the actor no longer runs here, so its
    /// previous generation is what remains (gRPC DATA_LOSS).
    #[error("{0}")]
    SandboxLost(String),
}

impl VerbError {
    /// The message the caller sees.
    pub fn message(&self) -> &str {
        match self {
            VerbError::InvalidArgument(m)
            | VerbError::FailedPrecondition(m)
            | VerbError::ResourceExhausted(m)
            | VerbError::Unavailable(m)
            | VerbError::Aborted(m)
            | VerbError::Internal(m)
            | VerbError::SandboxLost(m) => m,
        }
    }

    /// The `outcome` label of the verb's metrics: its gRPC code in snake case.
    pub fn outcome(&self) -> &'static str {
        match self {
            VerbError::InvalidArgument(_) => "invalid_argument",
            VerbError::FailedPrecondition(_) => "failed_precondition",
            VerbError::ResourceExhausted(_) => "resource_exhausted",
            VerbError::Unavailable(_) => "unavailable",
            VerbError::Aborted(_) => "aborted",
            VerbError::Internal(_) => "internal",
            VerbError::SandboxLost(_) => "data_loss",
        }
    }
}

/// `ok`, or the error's [`VerbError::outcome`].
pub fn outcome<T>(result: &Result<T, VerbError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.outcome(),
    }
}

/// An actor placed on a worker: what Start runs and the adoption record keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub actor: ActorRef,
    pub uid: String,
    pub template: String,
    pub spec: TemplateSpec,
    /// The worker the placement names (a start for another worker is refused).
    pub worker_id: String,
    /// The fencing token of this activation (0: none was given).
    pub activation: u64,
}

/// Start: a cold boot, or a generation restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    pub workload: Workload,
    /// The sealed generation to restore; `None` for a cold boot.
    pub generation_dir: Option<PathBuf>,
    /// The fidelity to restore at; `None`: the generation's own.
    pub fidelity: Option<Fidelity>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartReply {
    pub epoch: u64,
    /// From the call to the actor ready (0: it already ran here).
    pub ready_ms: u64,
}

/// Checkpoint (suspend) of an actor running here into a new generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRequest {
    pub actor: ActorRef,
    /// The worker the caller believes runs the actor.
    pub worker_id: String,
    /// The activation the caller means (0: whichever runs here).
    pub activation: u64,
    /// Absolute; must not exist yet or be empty.
    pub generation_dir: PathBuf,
    /// `None`: the template's fidelity.
    pub fidelity: Option<Fidelity>,
    pub generation: u64,
    pub uuid: String,
    pub node: String,
    pub boot_id: String,
    /// How long requests in flight may take to finish; `None`: the worker's `--suspend-grace`.
    pub grace: Option<Duration>,
    /// The template's `snapshots.onMemoryFailure` as the caller knows it now; `None`: as the
    /// actor started with.
    pub on_memory_failure: Option<OnMemoryFailure>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointReply {
    pub epoch: u64,
    /// What was captured (ROOTFS when a memory dump failed).
    pub fidelity: Fidelity,
    /// Why the fidelity is lower than asked, if it is.
    pub reason: String,
    pub size_bytes: u64,
    /// sha256 of the manifest.
    pub checksum: String,
    /// The dumped sandbox stays frozen in place here.
    pub kept_frozen: bool,
}

/// Stop without a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRequest {
    pub actor: ActorRef,
    /// Only a copy whose activation is at most this is stopped; `None`: any copy.
    pub activation_at_most: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReply {
    pub epoch: u64,
}

/// One actor in an Activity report: running here, or exited since the last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorActivity {
    pub actor: ActorRef,
    /// Open tunnels plus open outbound connections.
    pub open_streams: u32,
    pub last_activity_unix_ms: i64,
    pub exited: bool,
    pub exit_code: i32,
    pub last_log_lines: String,
    pub idle_timeout_seconds: u32,
    pub activation: u64,
    /// Why the worker ended the actor (its memory could not be completed); empty otherwise.
    pub crash_reason: String,
    /// With `crash_reason`, when the cause is the generation's content (a memory chunk that does
    /// not match its digest): the generation directory the lazy restore read. None otherwise.
    pub damaged_generation: Option<std::path::PathBuf>,
    /// The actor asked to be suspended now (the local API's `POST /v1/suspend`); reported once.
    pub suspend_requested: bool,
}

/// What the node polls: every actor here, exits once, and whether the worker is draining.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityReport {
    pub epoch: u64,
    /// Sorted by actor.
    pub actors: Vec<ActorActivity>,
    pub draining: bool,
    /// Frozen copies kept here (not active, holding their memory).
    pub frozen: u32,
}

/// Next to each active actor's sandbox: what a restarted worker needs to re-adopt it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptionRecord {
    pub workload: Workload,
    /// Host pid of the container init.
    pub pid: Option<u32>,
    /// The page source of a lazy restore.
    pub page_source_pid: Option<u32>,
}
