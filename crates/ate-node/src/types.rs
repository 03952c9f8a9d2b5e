//! The node's own vocabulary for what crosses its boundaries: the workload it starts and
//! checkpoints, a snapshot generation, and a failed call to another service. The wire forms
//! (`ate_proto::v1`, `tonic::Status`) are converted to and from these only in the adapters
//! (`agent/service.rs`, `worker_client.rs`, `api_client.rs`, with `wire.rs`).

use ate_core::{ActorRef, DurableStatus, Fidelity, TemplateSpec};

/// What the node needs to start (or checkpoint) an actor: who it is, its template and where it
/// runs. The actor was validated when the workload was decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub actor: ActorRef,
    pub uid: String,
    pub template: String,
    /// None when the caller sent none (the worker refuses to start such a workload).
    pub spec: Option<TemplateSpec>,
    pub worker_id: String,
    /// Fencing token of the activation this workload belongs to.
    pub activation: u64,
}

/// A snapshot generation as the api and the node exchange it. Nothing here is validated: the
/// node echoes what it does not use (Detach returns the generations it was given).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub actor: Option<ActorRef>,
    pub generation: u64,
    pub uuid: String,
    /// None: unspecified (or a number this build does not know).
    pub fidelity: Option<Fidelity>,
    /// Template the generation was captured under (`<namespace>/<name>`).
    pub template: String,
    pub sandbox_class: String,
    pub node: String,
    pub boot_id: String,
    pub local_path: String,
    pub durable_uri: String,
    /// None: unspecified (or a number this build does not know).
    pub durable_status: Option<DurableStatus>,
    pub size_bytes: u64,
    pub checksum: String,
    /// Why the generation has a lower fidelity than asked for, or why its upload failed.
    pub reason: String,
    pub create_time_unix_ms: i64,
}

/// Copies of one generation found damaged: their content does not match the generation's
/// manifest (a file's checksum or size, a missing file, an unreadable manifest, a memory chunk's
/// digest). The api marks them so that no resume chooses them again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub generation: u64,
    pub uuid: String,
    /// What was found wrong with the node-local copy, naming the file; None: not found damaged.
    pub local: Option<String>,
    /// The same for the durable copy.
    pub durable: Option<String>,
}

/// The canonical status codes (google.rpc.Code) another service answers a failed call with,
/// in the node's own type: the agent decides on them (is a worker's refusal about the
/// generation it was given?) and NodeService passes a worker's answer on with the same code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallCode {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

/// A call to a worker or to the api that failed: the code and message it answered with (or
/// that its transport or the node's timeout gave).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub code: CallCode,
    pub message: String,
}

impl CallError {
    pub fn new(code: CallCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}
