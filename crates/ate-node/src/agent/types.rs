//! What the NodeService verbs take and return, in the node's own types (`service.rs` decodes
//! and encodes the wire messages).

use ate_core::{ActorRef, Fidelity};

use crate::types::{Snapshot, Workload};

/// Restore a generation at a fidelity (which may be lower than the generation's own).
pub struct RestoreRequest {
    pub workload: Workload,
    pub snapshot: Snapshot,
    pub fidelity: Fidelity,
}

/// Checkpoint a running actor into a new generation.
pub struct CheckpointRequest {
    pub workload: Workload,
    pub generation: u64,
    pub uuid: String,
    pub fidelity: Fidelity,
    /// Upload to the durable store before returning.
    pub durable: bool,
    /// Grace for requests in flight (0: the worker's default).
    pub grace_ms: u32,
}

/// The new generation, and whether the worker keeps the actor frozen in place.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpointed {
    pub snapshot: Snapshot,
    pub epoch: u64,
    pub kept_frozen: bool,
}

/// Stop an actor's sandbox on a worker (the actor as sent, possibly absent: the worker judges).
pub struct StopRequest {
    pub actor: Option<ActorRef>,
    pub worker_id: String,
}

/// The worker an actor runs on after Run, Restore or Stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnWorker {
    pub worker_id: String,
    pub epoch: u64,
    /// The worker's atunnel address(es).
    pub addresses: Vec<String>,
}

/// Read up to `max_bytes` of an actor's log from `offset`.
pub struct ReadLogRequest {
    pub actor: ActorRef,
    pub offset: u64,
    pub max_bytes: u32,
}

/// A part of an actor's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPart {
    pub data: Vec<u8>,
    pub next_offset: u64,
    /// False when this node has no log of the actor.
    pub found: bool,
}
