//! How a workflow ends badly, in the api's own terms. `convert::status` answers each variant
//! with its gRPC code; the message is this type's `Display`, which is the text callers see.

use ate_core::{ActorRef, ActorState, CRASHED_PREREQUISITE, NO_ROOM_MESSAGE, ValidationError};
use ate_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// A name or field of the request is invalid.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// What the store answered (see [`WorkflowError::kind`] for how each is classed).
    #[error("{}", store_message(.0))]
    Store(#[from] StoreError),
    /// The actor is CRASHED: every verb but RevertActor and DeleteActor is refused.
    #[error("actor {actor} is ACTOR_STATE_CRASHED{}: {CRASHED_PREREQUISITE}; RevertActor returns it to ACTOR_STATE_SUSPENDED", crash_reason(.last_error))]
    Crashed {
        actor: ActorRef,
        last_error: Option<String>,
    },
    /// Another workflow's transient state (RESUMING, SUSPENDING): retry when it has finished.
    #[error("actor {actor} is {state}; try again when the operation on it has finished")]
    Busy { actor: ActorRef, state: ActorState },
    /// Another operation holds the actor's lease.
    #[error("another operation holds actor {0}")]
    LeaseHeld(ActorRef),
    /// No worker has room for the actor (the router parks on it).
    #[error("{NO_ROOM_MESSAGE}")]
    NoRoom,
    /// No worker that could otherwise host the actor can restore everything its newest
    /// generation holds: it is not placed (ResourceExhausted, so the router parks) rather than
    /// restored at a lower fidelity. The spec's text first, then the missing capabilities.
    #[error(
        "{NO_ROOM_MESSAGE}: no worker offers {} that generation {generation} needs to restore its {fidelity} snapshot (it is kept; a worker with them resumes it)",
        .missing.join(", ")
    )]
    NoCapableWorker {
        missing: Vec<String>,
        generation: u64,
        fidelity: ate_core::Fidelity,
    },
    /// A node call failed transiently: the actor stays where it is, and the caller may retry.
    #[error("worker {worker_id} unavailable: {reason}")]
    WorkerUnavailable { worker_id: String, reason: String },
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the actor (or what it needs) is not in a shape that allows it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A transient condition (a node unreachable or slow, a worker restarted): retry later.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

/// The classes of [`WorkflowError`] a caller tells apart; each is answered with its own gRPC
/// code, and names the outcome in the workflow metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    NoRoom,
    /// The actor's atespace is at a quota: ResourceExhausted like NoRoom, but the router does
    /// not park it (waiting rarely clears it).
    OverQuota,
    Aborted,
    Unavailable,
    Internal,
}

impl WorkflowError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            WorkflowError::Invalid(_) => ErrorKind::InvalidArgument,
            WorkflowError::Store(e) => match e {
                StoreError::NotFound(_) => ErrorKind::NotFound,
                StoreError::AlreadyExists(_) => ErrorKind::AlreadyExists,
                StoreError::FailedPrecondition(_) | StoreError::StateConflict { .. } => {
                    ErrorKind::FailedPrecondition
                }
                StoreError::NoRoom { .. } => ErrorKind::NoRoom,
                StoreError::QuotaExceeded { .. } => ErrorKind::OverQuota,
                // A database that does not answer is a transient condition: the router parks on it.
                StoreError::Database(_) => ErrorKind::Unavailable,
            },
            WorkflowError::Crashed { .. }
            | WorkflowError::Busy { .. }
            | WorkflowError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            WorkflowError::LeaseHeld(_) => ErrorKind::Aborted,
            WorkflowError::NoRoom | WorkflowError::NoCapableWorker { .. } => ErrorKind::NoRoom,
            WorkflowError::WorkerUnavailable { .. } | WorkflowError::Unavailable(_) => {
                ErrorKind::Unavailable
            }
            WorkflowError::NotFound(_) => ErrorKind::NotFound,
            WorkflowError::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The outcome label of the workflow metrics (`ate_api_resume_total{outcome}`, `ate_api_suspend_total{outcome}`).
    pub fn outcome(&self) -> &'static str {
        match self.kind() {
            ErrorKind::NoRoom => "no_room",
            ErrorKind::OverQuota => "over_quota",
            ErrorKind::Aborted => "aborted",
            ErrorKind::FailedPrecondition => "failed_precondition",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::NotFound => "not_found",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::AlreadyExists | ErrorKind::Internal => "error",
        }
    }
}

fn store_message(e: &StoreError) -> String {
    match e {
        // The same text whatever worker lost the race: the spec's fixed string.
        StoreError::NoRoom { .. } => NO_ROOM_MESSAGE.to_string(),
        StoreError::Database(m) => format!("store unavailable: {m}"),
        e => e.to_string(),
    }
}

fn crash_reason(last_error: &Option<String>) -> String {
    match last_error {
        Some(why) => format!(" ({why})"),
        None => String::new(),
    }
}
