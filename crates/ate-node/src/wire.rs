//! Conversions between the node's types (`types.rs`) and the wire forms that every adapter
//! shares: actor references, workloads, snapshots and status codes. Used only by the adapters
//! (`agent/service.rs`, `worker_client.rs`, `api_client.rs`).

use ate_core::{ActorRef, DurableStatus, Fidelity};
use ate_proto::v1;
use tonic::{Code, Status};

use crate::types::{CallCode, CallError, Damage, Snapshot, Workload};

/// A reference as sent, unvalidated (where the node only passes it on or logs it).
pub fn actor_from_wire(a: v1::ObjectRef) -> ActorRef {
    ActorRef::new(a.atespace, a.name)
}

pub fn actor_to_wire(a: &ActorRef) -> v1::ObjectRef {
    v1::ObjectRef {
        atespace: a.atespace.clone(),
        name: a.name.clone(),
    }
}

pub fn workload_to_wire(w: &Workload) -> v1::Workload {
    v1::Workload {
        actor: Some(actor_to_wire(&w.actor)),
        uid: w.uid.clone(),
        template: w.template.clone(),
        spec: w.spec.as_ref().map(ate_proto::spec_to_wire),
        worker_id: w.worker_id.clone(),
        activation: w.activation,
    }
}

/// An optional fidelity's wire number (0: unspecified).
pub fn fidelity_to_wire(f: Option<Fidelity>) -> i32 {
    f.map_or(0, Fidelity::wire)
}

pub fn snapshot_from_wire(s: v1::Snapshot) -> Snapshot {
    Snapshot {
        actor: s.actor.map(actor_from_wire),
        generation: s.generation,
        uuid: s.uuid,
        fidelity: Fidelity::from_wire(s.fidelity),
        template: s.template,
        sandbox_class: s.sandbox_class,
        node: s.node,
        boot_id: s.boot_id,
        local_path: s.local_path,
        durable_uri: s.durable_uri,
        durable_status: DurableStatus::from_wire(s.durable_status),
        size_bytes: s.size_bytes,
        checksum: s.checksum,
        reason: s.reason,
        create_time_unix_ms: s.create_time_unix_ms,
    }
}

pub fn snapshot_to_wire(s: Snapshot) -> v1::Snapshot {
    v1::Snapshot {
        actor: s.actor.as_ref().map(actor_to_wire),
        generation: s.generation,
        uuid: s.uuid,
        fidelity: fidelity_to_wire(s.fidelity),
        template: s.template,
        sandbox_class: s.sandbox_class,
        node: s.node,
        boot_id: s.boot_id,
        local_path: s.local_path,
        durable_uri: s.durable_uri,
        durable_status: s.durable_status.map_or(0, DurableStatus::wire),
        size_bytes: s.size_bytes,
        checksum: s.checksum,
        reason: s.reason,
        create_time_unix_ms: s.create_time_unix_ms,
    }
}

pub fn damage_to_wire(d: &Damage) -> v1::GenerationDamage {
    v1::GenerationDamage {
        generation: d.generation,
        uuid: d.uuid.clone(),
        local: d.local.clone().unwrap_or_default(),
        durable: d.durable.clone().unwrap_or_default(),
    }
}

/// A failed call as the node keeps it: the status's code and message.
pub fn call_error(status: Status) -> CallError {
    CallError::new(code_from_wire(status.code()), status.message())
}

/// The status that passes a failed call's answer on unchanged.
pub fn call_status(e: &CallError) -> Status {
    Status::new(code_to_wire(e.code), e.message.clone())
}

pub fn code_from_wire(code: Code) -> CallCode {
    match code {
        Code::Ok => CallCode::Ok,
        Code::Cancelled => CallCode::Cancelled,
        Code::Unknown => CallCode::Unknown,
        Code::InvalidArgument => CallCode::InvalidArgument,
        Code::DeadlineExceeded => CallCode::DeadlineExceeded,
        Code::NotFound => CallCode::NotFound,
        Code::AlreadyExists => CallCode::AlreadyExists,
        Code::PermissionDenied => CallCode::PermissionDenied,
        Code::ResourceExhausted => CallCode::ResourceExhausted,
        Code::FailedPrecondition => CallCode::FailedPrecondition,
        Code::Aborted => CallCode::Aborted,
        Code::OutOfRange => CallCode::OutOfRange,
        Code::Unimplemented => CallCode::Unimplemented,
        Code::Internal => CallCode::Internal,
        Code::Unavailable => CallCode::Unavailable,
        Code::DataLoss => CallCode::DataLoss,
        Code::Unauthenticated => CallCode::Unauthenticated,
    }
}

pub fn code_to_wire(code: CallCode) -> Code {
    match code {
        CallCode::Ok => Code::Ok,
        CallCode::Cancelled => Code::Cancelled,
        CallCode::Unknown => Code::Unknown,
        CallCode::InvalidArgument => Code::InvalidArgument,
        CallCode::DeadlineExceeded => Code::DeadlineExceeded,
        CallCode::NotFound => Code::NotFound,
        CallCode::AlreadyExists => Code::AlreadyExists,
        CallCode::PermissionDenied => Code::PermissionDenied,
        CallCode::ResourceExhausted => Code::ResourceExhausted,
        CallCode::FailedPrecondition => Code::FailedPrecondition,
        CallCode::Aborted => Code::Aborted,
        CallCode::OutOfRange => Code::OutOfRange,
        CallCode::Unimplemented => Code::Unimplemented,
        CallCode::Internal => Code::Internal,
        CallCode::Unavailable => Code::Unavailable,
        CallCode::DataLoss => Code::DataLoss,
        CallCode::Unauthenticated => Code::Unauthenticated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_code_survives_the_round_trip() {
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert_eq!(code_to_wire(code_from_wire(code)), code, "{n}");
        }
        let status = Status::new(Code::DataLoss, "manifest.json: checksum mismatch");
        let passed_on = call_status(&call_error(status));
        assert_eq!(passed_on.code(), Code::DataLoss);
        assert_eq!(passed_on.message(), "manifest.json: checksum mismatch");
    }

    #[test]
    fn a_snapshot_survives_the_round_trip() {
        let wire = v1::Snapshot {
            actor: Some(v1::ObjectRef {
                atespace: "ns".into(),
                name: "a".into(),
            }),
            generation: 4,
            uuid: "u-4".into(),
            fidelity: Fidelity::Rootfs.wire(),
            template: "ns/t".into(),
            sandbox_class: "runc".into(),
            node: "node-1".into(),
            boot_id: "b".into(),
            local_path: "/s/4".into(),
            durable_uri: "file:///d/4".into(),
            durable_status: DurableStatus::Completed.wire(),
            size_bytes: 77,
            checksum: "c".into(),
            reason: "r".into(),
            create_time_unix_ms: 1234,
        };
        assert_eq!(snapshot_to_wire(snapshot_from_wire(wire.clone())), wire);
        assert_eq!(
            snapshot_to_wire(snapshot_from_wire(v1::Snapshot::default())),
            v1::Snapshot::default()
        );
    }
}
