//! Every translation between the wire (`ate_proto::v1`, `tonic::Status`) and the worker's own
//! types (`worker::types`): WorkerService requests decoded (bad input rejected with the messages
//! callers know), replies encoded, [`VerbError`]s as status codes; and the adoption record file,
//! whose format is the wire message `v1::AdoptionRecord` (so it is written once, in
//! `worker.proto`, and read back by any later worker version). No other module names a wire
//! type but `service.rs`.

use std::path::PathBuf;
use std::time::Duration;

use ate_core::template::OnMemoryFailure;
use ate_core::{ActorRef, Fidelity, TemplateSpec};
use ate_proto::v1;
use tonic::Status;

mod exec;
pub(crate) use exec::{exec_input, exec_output, exec_start};

use crate::worker::{
    ActivityReport, ActorActivity, AdoptionRecord, CheckpointReply, CheckpointRequest, StartReply,
    StartRequest, StopReply, StopRequest, VerbError, Worker, Workload,
};

/// A verb's error as the status its caller sees: one code per variant, the message unchanged.
pub(crate) fn status(e: VerbError) -> Status {
    match e {
        VerbError::InvalidArgument(m) => Status::invalid_argument(m),
        VerbError::FailedPrecondition(m) => Status::failed_precondition(m),
        VerbError::ResourceExhausted(m) => Status::resource_exhausted(m),
        VerbError::Unavailable(m) => Status::unavailable(m),
        VerbError::Aborted(m) => Status::aborted(m),
        VerbError::Internal(m) => Status::internal(m),
        VerbError::SandboxLost(m) => Status::data_loss(m),
    }
}

fn invalid(message: impl Into<String>) -> VerbError {
    VerbError::InvalidArgument(message.into())
}

/// A present ref whose two halves are DNS-1123 labels.
fn actor_ref(r: Option<&v1::ObjectRef>) -> Result<ActorRef, VerbError> {
    let r = r.ok_or_else(|| invalid("actor ref missing"))?;
    ate_core::validate_label("actor.atespace", &r.atespace).map_err(|e| invalid(e.to_string()))?;
    ate_core::validate_label("actor.name", &r.name).map_err(|e| invalid(e.to_string()))?;
    Ok(ActorRef::new(r.atespace.clone(), r.name.clone()))
}

fn object_ref(r: &ActorRef) -> v1::ObjectRef {
    v1::ObjectRef {
        atespace: r.atespace.clone(),
        name: r.name.clone(),
    }
}

/// FIDELITY_UNSPECIFIED (0) is `None`; an unknown number is refused.
fn fidelity(n: i32) -> Result<Option<Fidelity>, VerbError> {
    if n == 0 {
        return Ok(None);
    }
    Fidelity::from_wire(n)
        .map(Some)
        .ok_or_else(|| invalid(format!("unknown fidelity {n}")))
}

/// 0 on the wire means "none".
fn nonzero<T: Default + PartialEq>(n: T) -> Option<T> {
    (n != T::default()).then_some(n)
}

pub(crate) fn start_request(req: v1::WorkerStartRequest) -> Result<StartRequest, VerbError> {
    let w = req.workload.ok_or_else(|| invalid("workload missing"))?;
    let actor = actor_ref(w.actor.as_ref())?;
    let wire_spec = w
        .spec
        .as_ref()
        .ok_or_else(|| invalid("workload.spec missing"))?;
    let spec =
        ate_proto::spec_from_wire(wire_spec).map_err(|e| invalid(format!("workload.spec: {e}")))?;
    let fidelity = fidelity(req.fidelity)?;
    let generation_dir =
        (!req.generation_dir.is_empty()).then(|| PathBuf::from(req.generation_dir));
    if fidelity.is_some() && generation_dir.is_none() {
        return Err(invalid("a fidelity was given without a generation_dir"));
    }
    Ok(StartRequest {
        workload: workload_from_wire(w, actor, spec),
        generation_dir,
        fidelity,
    })
}

pub(crate) fn start_reply(r: StartReply) -> v1::WorkerStartReply {
    v1::WorkerStartReply {
        epoch: r.epoch,
        ready_ms: r.ready_ms,
    }
}

/// The workload of a checkpoint needs only its ref, worker and activation, and of its spec (if
/// sent) only `onMemoryFailure`.
pub(crate) fn checkpoint_request(
    req: v1::WorkerCheckpointRequest,
) -> Result<CheckpointRequest, VerbError> {
    let w = req.workload.ok_or_else(|| invalid("workload missing"))?;
    let actor = actor_ref(w.actor.as_ref())?;
    if req.generation_dir.is_empty() {
        return Err(invalid("generation_dir missing"));
    }
    let generation_dir = PathBuf::from(req.generation_dir);
    if !generation_dir.is_absolute() {
        return Err(invalid("generation_dir must be absolute"));
    }
    Ok(CheckpointRequest {
        actor,
        worker_id: w.worker_id,
        activation: w.activation,
        generation_dir,
        fidelity: fidelity(req.fidelity)?,
        generation: req.generation,
        uuid: req.uuid,
        node: req.node,
        boot_id: req.boot_id,
        grace: nonzero(req.grace_ms).map(|ms| Duration::from_millis(u64::from(ms))),
        on_memory_failure: w.spec.as_ref().map(|s| {
            if s.rootfs_on_memory_failure {
                OnMemoryFailure::Rootfs
            } else {
                OnMemoryFailure::Fail
            }
        }),
    })
}

pub(crate) fn checkpoint_reply(r: CheckpointReply) -> v1::WorkerCheckpointReply {
    v1::WorkerCheckpointReply {
        epoch: r.epoch,
        fidelity: r.fidelity.wire(),
        reason: r.reason,
        size_bytes: r.size_bytes,
        checksum: r.checksum,
        kept_frozen: r.kept_frozen,
    }
}

pub(crate) fn stop_request(req: v1::WorkerStopRequest) -> Result<StopRequest, VerbError> {
    Ok(StopRequest {
        actor: actor_ref(req.actor.as_ref())?,
        activation_at_most: nonzero(req.activation_at_most),
    })
}

pub(crate) fn stop_reply(r: StopReply) -> v1::WorkerStopReply {
    v1::WorkerStopReply { epoch: r.epoch }
}

fn actor_activity(a: ActorActivity) -> v1::ActorActivity {
    v1::ActorActivity {
        // Filled by the service from the CPU meter and the cgroup.
        cpu_millis: 0,
        memory_bytes: 0,
        active_since_unix_ms: 0,
        actor: Some(object_ref(&a.actor)),
        open_streams: a.open_streams,
        last_activity_unix_ms: a.last_activity_unix_ms,
        exited: a.exited,
        exit_code: a.exit_code,
        last_log_lines: a.last_log_lines,
        idle_timeout_seconds: a.idle_timeout_seconds,
        activation: a.activation,
        crash_reason: a.crash_reason,
        suspend_requested: a.suspend_requested,
        damaged_generation_dir: a
            .damaged_generation
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
    }
}

pub(crate) fn activity_reply(r: ActivityReport) -> v1::WorkerActivityReply {
    v1::WorkerActivityReply {
        epoch: r.epoch,
        actors: r.actors.into_iter().map(actor_activity).collect(),
        draining: r.draining,
        frozen_actors: r.frozen,
    }
}

/// Info: the worker's identity, capacity (CPU overcommitted; the machine's CPU and what its
/// actors use lately from `cpu`) and capabilities.
pub(crate) fn worker_info(w: &Worker, cpu: &crate::cpu::CpuMeter) -> v1::WorkerInfo {
    let id = &w.ident;
    v1::WorkerInfo {
        worker_id: id.id.clone(),
        epoch: id.epoch,
        addresses: id.addresses.clone(),
        capacity: Some(v1::Capacity {
            cpu_millis: id.cpu_millis,
            memory_bytes: id.memory_bytes,
            actor_slots: id.slots,
        }),
        labels: id.labels.clone().into_iter().collect(),
        sandbox_class: w.sandbox_class(),
        can_restore_memory: w.can_restore_memory(),
        identity: id.spiffe_id.clone(),
        can_restore_lazily: w.can_restore_lazily(),
        capabilities: w.capabilities(),
        cpu_physical_millis: cpu.physical_millis(),
        cpu_usage_millis: cpu.usage_millis(),
    }
}

fn workload_to_wire(w: &Workload) -> v1::Workload {
    v1::Workload {
        actor: Some(object_ref(&w.actor)),
        uid: w.uid.clone(),
        template: w.template.clone(),
        spec: Some(ate_proto::spec_to_wire(&w.spec)),
        worker_id: w.worker_id.clone(),
        activation: w.activation,
    }
}

/// The reverse of [`workload_to_wire`], with the actor and spec already read from `w` (each
/// caller words its own errors for them).
fn workload_from_wire(w: v1::Workload, actor: ActorRef, spec: TemplateSpec) -> Workload {
    Workload {
        actor,
        uid: w.uid,
        template: w.template,
        spec,
        worker_id: w.worker_id,
        activation: w.activation,
    }
}

/// The adoption record file's bytes.
pub(crate) fn adoption_to_bytes(r: &AdoptionRecord) -> Vec<u8> {
    prost::Message::encode_to_vec(&v1::AdoptionRecord {
        workload: Some(workload_to_wire(&r.workload)),
        pid: r.pid.unwrap_or(0),
        page_source_pid: r.page_source_pid.unwrap_or(0),
    })
}

fn adoption_message(bytes: &[u8]) -> Result<v1::AdoptionRecord, String> {
    prost::Message::decode(bytes).map_err(|e| format!("adoption record unreadable: {e}"))
}

/// An adoption record file read back, or why it cannot be used.
pub(crate) fn adoption_from_bytes(bytes: &[u8]) -> Result<AdoptionRecord, String> {
    let record = adoption_message(bytes)?;
    let w = record.workload.unwrap_or_default();
    let actor = actor_ref(w.actor.as_ref()).map_err(|e| e.message().to_string())?;
    let spec = w
        .spec
        .as_ref()
        .ok_or("adoption record has no spec")
        .and_then(|s| ate_proto::spec_from_wire(s).map_err(|_| "adoption record spec invalid"))
        .map_err(str::to_string)?;
    Ok(AdoptionRecord {
        workload: workload_from_wire(w, actor, spec),
        pid: nonzero(record.pid),
        page_source_pid: nonzero(record.page_source_pid),
    })
}

#[cfg(test)]
mod tests;
