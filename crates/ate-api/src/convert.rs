//! Between the api's own types and the wire: store records and workflow results → messages,
//! and [`WorkflowError`] → `tonic::Status` (its code by [`ErrorKind`], its text unchanged).

use ate_core::{ActorRef, TemplateRef, ValidationError};
use ate_proto::v1;
use ate_store::{
    ActorEvent, ActorRecord, Alarm, AtespaceRecord, Capacity, SnapshotRecord, StoreError,
    TagRecord, TemplateRecord, WorkerRecord,
};
use tonic::{Code, Status};

use crate::error::{ErrorKind, WorkflowError};
use crate::workflows::{ActorLog, ActorView, Damage, GenerationView, HeldActor};

fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::NoRoom | ErrorKind::OverQuota => Code::ResourceExhausted,
        ErrorKind::Aborted => Code::Aborted,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    }
}

/// The answer to a caller for a workflow's error.
pub fn status(e: WorkflowError) -> Status {
    Status::new(code(e.kind()), e.to_string())
}

impl From<WorkflowError> for Status {
    fn from(e: WorkflowError) -> Self {
        status(e)
    }
}

/// The answer for a store error met in a service.
pub fn store_status(e: StoreError) -> Status {
    status(WorkflowError::Store(e))
}

/// InvalidArgument naming the field.
pub fn invalid(e: ValidationError) -> Status {
    status(WorkflowError::Invalid(e))
}

pub fn actor_view(v: &ActorView) -> v1::Actor {
    actor(&v.actor, v.worker.as_ref())
}

pub fn alarm(a: &Alarm) -> v1::Alarm {
    v1::Alarm {
        actor: Some(v1::ObjectRef {
            atespace: a.actor.atespace.clone(),
            name: a.actor.name.clone(),
        }),
        due_unix_ms: a.due_ms,
        path: a.path.clone(),
        attempts: a.attempts,
        next_attempt_unix_ms: a.next_attempt_ms,
        last_error: a.last_error.clone(),
        failed: a.failed,
        set_unix_ms: a.set_ms,
    }
}

pub fn actor_log(log: ActorLog) -> v1::ReadActorLogResponse {
    v1::ReadActorLogResponse {
        data: log.data,
        next_offset: log.next_offset,
        node: log.node,
    }
}

/// A worker's held actor from its registration; None without the actor reference (the
/// service refuses such a registration before).
pub fn held_from_wire(h: &v1::HeldActor) -> Option<HeldActor> {
    let a = h.actor.as_ref()?;
    Some(HeldActor {
        actor: ActorRef::new(a.atespace.clone(), a.name.clone()),
        activation: h.activation,
    })
}

pub fn held(h: &HeldActor) -> v1::HeldActor {
    v1::HeldActor {
        actor: Some(v1::ObjectRef {
            atespace: h.actor.atespace.clone(),
            name: h.actor.name.clone(),
        }),
        activation: h.activation,
    }
}

pub fn event(e: &ActorEvent) -> v1::ActorEvent {
    v1::ActorEvent {
        id: e.id,
        time_unix_ms: e.time_ms,
        actor: Some(v1::ObjectRef {
            atespace: e.atespace.clone(),
            name: e.name.clone(),
        }),
        uid: e.uid.clone(),
        r#type: e.kind.as_str().to_string(),
        reason: e.reason.clone(),
        from_state: e.from_state.map_or(0, |s| s.wire()),
        to_state: e.to_state.map_or(0, |s| s.wire()),
        worker_id: e.worker_id.clone().unwrap_or_default(),
        generation: e.generation,
        message: e.message.clone(),
    }
}

pub fn actor(a: &ActorRecord, worker: Option<&WorkerRecord>) -> v1::Actor {
    v1::Actor {
        atespace: a.atespace.clone(),
        name: a.name.clone(),
        uid: a.uid.clone(),
        template: a.template.to_string(),
        state: a.state.wire(),
        worker_selector: a.worker_selector.clone().into_iter().collect(),
        worker_assignment: a.worker_id.as_ref().map(|id| v1::WorkerAssignment {
            worker_id: id.clone(),
            addresses: worker.map(|w| w.addresses.clone()).unwrap_or_default(),
            worker_identity: worker.map(|w| w.identity.clone()).unwrap_or_default(),
            epoch: a.epoch,
            node: worker.map(|w| w.node.clone()).unwrap_or_default(),
            activation: a.activation,
        }),
        generation: a.generation,
        attached_node: a.attached_node.clone().unwrap_or_default(),
        last_error: a.last_error.clone().unwrap_or_default(),
        create_time_unix_ms: a.created_ms,
        update_time_unix_ms: a.updated_ms,
    }
}

pub fn atespace(a: &AtespaceRecord) -> v1::Atespace {
    v1::Atespace {
        name: a.name.clone(),
        create_time_unix_ms: a.created_ms,
        actor_count: a.actor_count,
        callers_allow: a.callers_allow.clone(),
        quota: Some(quota(&a.quota)),
        usage: Some(quota(&a.usage)),
    }
}

/// A quota or a usage on the wire (`slots` = running actors).
pub fn quota(c: &Capacity) -> v1::AtespaceQuota {
    v1::AtespaceQuota {
        running_actors: u32::try_from(c.slots).unwrap_or(u32::MAX),
        cpu_millis: u32::try_from(c.cpu_millis).unwrap_or(u32::MAX),
        memory_bytes: c.memory_bytes,
    }
}

/// A quota from the wire (unset: none).
pub fn quota_from_wire(q: Option<&v1::AtespaceQuota>) -> Capacity {
    q.map_or_else(Capacity::default, |q| Capacity {
        slots: u64::from(q.running_actors),
        cpu_millis: u64::from(q.cpu_millis),
        memory_bytes: q.memory_bytes,
    })
}

pub fn template(t: &TemplateRecord) -> v1::ActorTemplate {
    v1::ActorTemplate {
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        spec: Some(ate_proto::spec_to_wire(&t.spec)),
        create_time_unix_ms: t.created_ms,
        update_time_unix_ms: t.updated_ms,
    }
}

pub fn snapshot(s: &SnapshotRecord) -> v1::Snapshot {
    v1::Snapshot {
        actor: Some(v1::ObjectRef {
            atespace: s.atespace.clone(),
            name: s.name.clone(),
        }),
        generation: s.generation,
        uuid: s.uuid.clone(),
        fidelity: s.fidelity.wire(),
        template: s.template.to_string(),
        sandbox_class: s.sandbox_class.clone(),
        node: s.node.clone(),
        boot_id: s.boot_id.clone(),
        local_path: s.local_path.clone().unwrap_or_default(),
        durable_uri: s.durable_uri.clone().unwrap_or_default(),
        durable_status: s.durable_status.map(|d| d.wire()).unwrap_or(0),
        size_bytes: s.size_bytes,
        checksum: s.checksum.clone(),
        reason: s.reason.clone().unwrap_or_default(),
        create_time_unix_ms: s.created_ms,
    }
}

/// A node's report of damaged copies (a Restore's status details, an exit report).
pub fn damage(d: v1::GenerationDamage) -> Damage {
    Damage {
        generation: d.generation,
        uuid: d.uuid,
        local: non_empty(&d.local),
        durable: non_empty(&d.durable),
    }
}

/// One of an actor's generations as ListGenerations answers it.
pub fn generation(g: &GenerationView) -> v1::Generation {
    v1::Generation {
        snapshot: Some(snapshot(&g.snapshot)),
        local_damage: g.snapshot.local_damage.clone().unwrap_or_default(),
        durable_damage: g.snapshot.durable_damage.clone().unwrap_or_default(),
        skipped: g.snapshot.skipped,
        local_usable: g.local_usable,
        next: g.next,
    }
}

pub fn tag(t: &TagRecord) -> v1::Tag {
    v1::Tag {
        atespace: t.atespace.clone(),
        name: t.name.clone(),
        snapshot: Some(snapshot(&t.snapshot)),
        create_time_unix_ms: t.created_ms,
    }
}

fn capacity(c: &Capacity) -> v1::Capacity {
    v1::Capacity {
        cpu_millis: u32::try_from(c.cpu_millis).unwrap_or(u32::MAX),
        memory_bytes: c.memory_bytes,
        actor_slots: u32::try_from(c.slots).unwrap_or(u32::MAX),
    }
}

pub fn worker(w: &WorkerRecord) -> v1::Worker {
    v1::Worker {
        id: w.id.clone(),
        node: w.node.clone(),
        addresses: w.addresses.clone(),
        identity: w.identity.clone(),
        labels: w.labels.clone().into_iter().collect(),
        sandbox_class: w.sandbox_class.clone(),
        can_restore_memory: w.can_restore_memory,
        capacity: Some(capacity(&w.capacity)),
        used: Some(capacity(&w.used)),
        epoch: w.epoch,
        status: w.status.as_str().to_string(),
        last_heartbeat_unix_ms: w.last_heartbeat_ms,
        node_address: w.node_address.clone(),
        boot_id: w.boot_id.clone(),
        capabilities: ate_core::capability::offered(&w.capabilities, w.can_restore_memory),
        cpu_physical_millis: u32::try_from(w.cpu_physical_millis).unwrap_or(u32::MAX),
        cpu_usage_millis: u32::try_from(w.cpu_usage_millis).unwrap_or(u32::MAX),
    }
}

/// Wire snapshot → record, for the node's checkpoint reply; `None` when its fidelity or template
/// is not valid.
pub fn snapshot_from_wire(
    s: &v1::Snapshot,
    atespace: &str,
    name: &str,
    now_ms: i64,
) -> Option<SnapshotRecord> {
    Some(SnapshotRecord {
        atespace: atespace.to_string(),
        name: name.to_string(),
        generation: s.generation,
        uuid: s.uuid.clone(),
        fidelity: ate_core::Fidelity::from_wire(s.fidelity)?,
        template: TemplateRef::parse("template", &s.template).ok()?,
        sandbox_class: s.sandbox_class.clone(),
        node: s.node.clone(),
        boot_id: s.boot_id.clone(),
        local_path: non_empty(&s.local_path),
        durable_uri: non_empty(&s.durable_uri),
        durable_status: ate_core::DurableStatus::from_wire(s.durable_status),
        size_bytes: s.size_bytes,
        checksum: s.checksum.clone(),
        reason: non_empty(&s.reason),
        created_ms: now_ms,
        local_damage: None,
        durable_damage: None,
        skipped: false,
        // Set by the suspend from the capturing worker's capabilities.
        requires: Vec::new(),
    })
}

/// A wire string where empty means "absent".
fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use ate_core::{ActorRef, ActorState, ValidationError};
    use ate_store::StoreError;
    use tonic::Code;

    use super::status;
    use crate::error::WorkflowError;

    fn answer(e: WorkflowError) -> (Code, String) {
        let s = status(e);
        (s.code(), s.message().to_string())
    }

    fn actor() -> ActorRef {
        ActorRef::new("ate-demo", "counter-1")
    }

    #[test]
    fn each_workflow_error_keeps_its_code_and_text() {
        let cases = [
            (
                WorkflowError::Invalid(ValidationError::new("template", "must be ns/name")),
                Code::InvalidArgument,
                "invalid template: must be ns/name",
            ),
            (
                WorkflowError::Crashed {
                    actor: actor(),
                    last_error: Some("restore on worker w1 failed: boom".into()),
                },
                Code::FailedPrecondition,
                "actor ate-demo/counter-1 is ACTOR_STATE_CRASHED (restore on worker w1 failed: boom): AssignWorker prerequisite not met; RevertActor returns it to ACTOR_STATE_SUSPENDED",
            ),
            (
                WorkflowError::Crashed {
                    actor: actor(),
                    last_error: None,
                },
                Code::FailedPrecondition,
                "actor ate-demo/counter-1 is ACTOR_STATE_CRASHED: AssignWorker prerequisite not met; RevertActor returns it to ACTOR_STATE_SUSPENDED",
            ),
            (
                WorkflowError::Busy {
                    actor: actor(),
                    state: ActorState::Suspending,
                },
                Code::FailedPrecondition,
                "actor ate-demo/counter-1 is ACTOR_STATE_SUSPENDING; try again when the operation on it has finished",
            ),
            (
                WorkflowError::LeaseHeld(actor()),
                Code::Aborted,
                "another operation holds actor ate-demo/counter-1",
            ),
            (
                WorkflowError::NoRoom,
                Code::ResourceExhausted,
                "no worker has room for the actor",
            ),
            (
                WorkflowError::WorkerUnavailable {
                    worker_id: "w1".into(),
                    reason: "connection refused".into(),
                },
                Code::Unavailable,
                "worker w1 unavailable: connection refused",
            ),
            (
                WorkflowError::NotFound("actor ate-demo/counter-1 has no log on node n1".into()),
                Code::NotFound,
                "actor ate-demo/counter-1 has no log on node n1",
            ),
            (
                WorkflowError::FailedPrecondition("bad node address \"x\": y".into()),
                Code::FailedPrecondition,
                "bad node address \"x\": y",
            ),
            (
                WorkflowError::Unavailable("node n1 unreachable".into()),
                Code::Unavailable,
                "node n1 unreachable",
            ),
            (
                WorkflowError::Internal("injected crash at ResumeAfterBind".into()),
                Code::Internal,
                "injected crash at ResumeAfterBind",
            ),
        ];
        for (error, code, text) in cases {
            assert_eq!(answer(error), (code, text.to_string()));
        }
    }

    #[test]
    fn store_errors_keep_their_code_and_text() {
        let cases = [
            (
                StoreError::NotFound("actor \"a/b\" not found".into()),
                Code::NotFound,
                "actor \"a/b\" not found",
            ),
            (
                StoreError::AlreadyExists("actor \"a/b\" already exists".into()),
                Code::AlreadyExists,
                "actor \"a/b\" already exists",
            ),
            (
                StoreError::FailedPrecondition("atespace a still holds actors".into()),
                Code::FailedPrecondition,
                "atespace a still holds actors",
            ),
            (
                StoreError::StateConflict {
                    actual: ActorState::Running,
                    expected: "ACTOR_STATE_SUSPENDED".into(),
                },
                Code::FailedPrecondition,
                "actor is ACTOR_STATE_RUNNING, expected one of ACTOR_STATE_SUSPENDED",
            ),
            (
                StoreError::NoRoom {
                    worker_id: "w1".into(),
                },
                Code::ResourceExhausted,
                "no worker has room for the actor",
            ),
            (
                StoreError::Database("connection reset".into()),
                Code::Unavailable,
                "store unavailable: connection reset",
            ),
        ];
        for (error, code, text) in cases {
            let s = super::store_status(error);
            assert_eq!((s.code(), s.message()), (code, text));
        }
    }

    #[test]
    fn outcome_labels_follow_the_code() {
        let label = |e: WorkflowError| e.outcome();
        assert_eq!(label(WorkflowError::NoRoom), "no_room");
        assert_eq!(
            label(WorkflowError::Store(StoreError::NoRoom {
                worker_id: "w1".into()
            })),
            "no_room"
        );
        assert_eq!(label(WorkflowError::LeaseHeld(actor())), "aborted");
        assert_eq!(
            label(WorkflowError::Busy {
                actor: actor(),
                state: ActorState::Resuming
            }),
            "failed_precondition"
        );
        assert_eq!(
            label(WorkflowError::Store(StoreError::Database("x".into()))),
            "unavailable"
        );
        assert_eq!(label(WorkflowError::NotFound("x".into())), "not_found");
        assert_eq!(
            label(WorkflowError::Invalid(ValidationError::new("a", "b"))),
            "invalid_argument"
        );
        assert_eq!(label(WorkflowError::Internal("x".into())), "error");
        assert_eq!(
            label(WorkflowError::Store(StoreError::AlreadyExists("x".into()))),
            "error"
        );
    }
}
