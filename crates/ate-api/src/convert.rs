//! Store records → wire messages.

use ate_proto::v1;
use ate_store::{
    ActorRecord, AtespaceRecord, Capacity, SnapshotRecord, TagRecord, TemplateRecord, WorkerRecord,
};

pub fn actor(a: &ActorRecord, worker: Option<&WorkerRecord>) -> v1::Actor {
    v1::Actor {
        atespace: a.atespace.clone(),
        name: a.name.clone(),
        uid: a.uid.clone(),
        template: a.template.clone(),
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
        last_error: a.last_error.clone(),
        create_time_unix_ms: a.created_ms,
        update_time_unix_ms: a.updated_ms,
    }
}

pub fn atespace(a: &AtespaceRecord) -> v1::Atespace {
    v1::Atespace {
        name: a.name.clone(),
        create_time_unix_ms: a.created_ms,
        actor_count: a.actor_count,
    }
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
        template: s.template.clone(),
        sandbox_class: s.sandbox_class.clone(),
        node: s.node.clone(),
        boot_id: s.boot_id.clone(),
        local_path: s.local_path.clone(),
        durable_uri: s.durable_uri.clone(),
        durable_status: s.durable_status.map(|d| d.wire()).unwrap_or(0),
        size_bytes: s.size_bytes,
        checksum: s.checksum.clone(),
        reason: s.reason.clone(),
        create_time_unix_ms: s.created_ms,
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
    }
}

/// Wire snapshot → record, for the node's checkpoint reply.
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
        template: s.template.clone(),
        sandbox_class: s.sandbox_class.clone(),
        node: s.node.clone(),
        boot_id: s.boot_id.clone(),
        local_path: s.local_path.clone(),
        durable_uri: s.durable_uri.clone(),
        durable_status: ate_core::DurableStatus::from_wire(s.durable_status),
        size_bytes: s.size_bytes,
        checksum: s.checksum.clone(),
        reason: s.reason.clone(),
        created_ms: now_ms,
    })
}
