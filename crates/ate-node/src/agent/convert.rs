//! NodeService's messages to and from the verbs' types, and [`AgentError`] to the status the
//! api gets. Used only by `service.rs`. Requests are validated here, in the order the verbs
//! checked them before, with the same messages.

use ate_core::{ActorRef, Fidelity};
use ate_proto::v1;
use tonic::Status;

use super::AgentError;
use super::types::{
    CheckpointRequest, Checkpointed, LogPart, OnWorker, ReadLogRequest, RestoreRequest, StopRequest,
};
use crate::types::{Snapshot, Workload};
use crate::wire;

/// The status the api gets for a verb's error: the code is what the api decides on (retry,
/// place elsewhere, give up), the message is the error's text.
pub(super) fn status(e: &AgentError) -> Status {
    match e {
        AgentError::Invalid(_) => Status::invalid_argument(e.to_string()),
        AgentError::WorkerNotRunning { .. } | AgentError::DeleteDurable { .. } => {
            Status::unavailable(e.to_string())
        }
        AgentError::NoDurableCopy { .. }
        | AgentError::Fetch { .. }
        | AgentError::NotReplaced { .. } => Status::failed_precondition(e.to_string()),
        AgentError::LocalFile { .. } | AgentError::DownloadLockPoisoned => {
            Status::internal(e.to_string())
        }
        AgentError::Worker(refused) => wire::call_status(refused),
        AgentError::Damaged { error, damage } => {
            ate_proto::damage::with_damage(status(error), &wire::damage_to_wire(damage))
        }
    }
}

fn invalid(e: impl ToString) -> AgentError {
    AgentError::Invalid(e.to_string())
}

/// A request's actor, validated.
pub(super) fn actor(a: Option<v1::ObjectRef>) -> Result<ActorRef, AgentError> {
    let a = a.ok_or_else(|| invalid("invalid actor: missing"))?;
    ate_core::validate_label("actor.atespace", &a.atespace).map_err(invalid)?;
    ate_core::validate_label("actor.name", &a.name).map_err(invalid)?;
    Ok(wire::actor_from_wire(a))
}

/// Whether the verb starts the workload (the spec must then be valid) or only names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SpecUse {
    Start,
    /// Checkpoint: the worker reads only the workload's actor, worker and activation, so a
    /// spec that no longer validates is no reason to refuse a suspend; it is not passed on.
    NameOnly,
}

/// A request's workload, its actor validated; its spec decoded as the worker decodes it (same
/// message when invalid).
fn workload(w: Option<v1::Workload>, spec_use: SpecUse) -> Result<Workload, AgentError> {
    let w = w.ok_or_else(|| invalid("invalid workload: missing"))?;
    let a = w
        .actor
        .ok_or_else(|| invalid("invalid workload.actor: missing"))?;
    ate_core::validate_label("workload.actor.atespace", &a.atespace).map_err(invalid)?;
    ate_core::validate_label("workload.actor.name", &a.name).map_err(invalid)?;
    let spec = match (w.spec, spec_use) {
        (None, _) => None,
        (Some(s), SpecUse::Start) => Some(
            ate_proto::spec_from_wire(&s).map_err(|e| invalid(format!("workload.spec: {e}")))?,
        ),
        (Some(s), SpecUse::NameOnly) => ate_proto::spec_from_wire(&s).ok(),
    };
    Ok(Workload {
        actor: wire::actor_from_wire(a),
        uid: w.uid,
        template: w.template,
        spec,
        worker_id: w.worker_id,
        activation: w.activation,
    })
}

fn fidelity(n: i32) -> Result<Fidelity, AgentError> {
    Fidelity::from_wire(n).ok_or_else(|| invalid(format!("invalid fidelity: {n}")))
}

pub(super) fn run(req: v1::RunRequest) -> Result<Workload, AgentError> {
    workload(req.workload, SpecUse::Start)
}

pub(super) fn restore(req: v1::RestoreRequest) -> Result<RestoreRequest, AgentError> {
    let workload = workload(req.workload, SpecUse::Start)?;
    let snapshot = req
        .snapshot
        .ok_or_else(|| invalid("invalid snapshot: missing"))?;
    Ok(RestoreRequest {
        workload,
        snapshot: wire::snapshot_from_wire(snapshot),
        fidelity: fidelity(req.fidelity)?,
    })
}

pub(super) fn checkpoint(req: v1::CheckpointRequest) -> Result<CheckpointRequest, AgentError> {
    Ok(CheckpointRequest {
        workload: workload(req.workload, SpecUse::NameOnly)?,
        generation: req.generation,
        uuid: req.uuid,
        fidelity: fidelity(req.fidelity)?,
        durable: req.durable,
        grace_ms: req.grace_ms,
    })
}

/// Detach's actor (not validated: it only keys the node's delta parents and names the
/// uploads) and generations.
pub(super) fn detach(req: v1::DetachRequest) -> Result<(ActorRef, Vec<Snapshot>), AgentError> {
    let actor = req.actor.ok_or_else(|| invalid("invalid actor: missing"))?;
    Ok((wire::actor_from_wire(actor), snapshots(req.snapshots)))
}

pub(super) fn stop(req: v1::StopRequest) -> StopRequest {
    StopRequest {
        actor: req.actor.map(wire::actor_from_wire),
        worker_id: req.worker_id,
    }
}

pub(super) fn read_log(req: v1::ReadLogRequest) -> Result<ReadLogRequest, AgentError> {
    Ok(ReadLogRequest {
        actor: actor(req.actor)?,
        offset: req.offset,
        max_bytes: req.max_bytes,
    })
}

pub(super) fn snapshots(snapshots: Vec<v1::Snapshot>) -> Vec<Snapshot> {
    snapshots
        .into_iter()
        .map(wire::snapshot_from_wire)
        .collect()
}

pub(super) fn node_reply(r: OnWorker) -> v1::NodeReply {
    v1::NodeReply {
        worker_id: r.worker_id,
        epoch: r.epoch,
        addresses: r.addresses,
    }
}

pub(super) fn checkpoint_reply(c: Checkpointed) -> v1::CheckpointReply {
    v1::CheckpointReply {
        snapshot: Some(wire::snapshot_to_wire(c.snapshot)),
        epoch: c.epoch,
        kept_frozen: c.kept_frozen,
    }
}

pub(super) fn detach_reply(snapshots: Vec<Snapshot>) -> v1::DetachReply {
    v1::DetachReply {
        snapshots: snapshots.into_iter().map(wire::snapshot_to_wire).collect(),
    }
}

/// Running actors' activity (NodeService.ActorActivity); those without a name are left out.
pub(super) fn actor_activity_reply(
    actors: Vec<crate::worker_client::ActorActivity>,
) -> v1::ActorActivityReply {
    v1::ActorActivityReply {
        actors: actors
            .into_iter()
            .filter_map(|a| {
                Some(v1::RunningActorActivity {
                    actor: Some(wire::actor_to_wire(a.actor.as_ref()?)),
                    open_streams: a.open_streams,
                    last_activity_unix_ms: a.last_activity_unix_ms,
                    activation: a.activation,
                    cpu_millis: a.cpu_millis,
                    memory_bytes: a.memory_bytes,
                    active_since_unix_ms: a.active_since_unix_ms,
                })
            })
            .collect(),
    }
}

pub(super) fn read_log_reply(p: LogPart) -> v1::ReadLogReply {
    v1::ReadLogReply {
        data: p.data,
        next_offset: p.next_offset,
        found: p.found,
    }
}

#[cfg(test)]
mod tests;
