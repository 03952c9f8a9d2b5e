//! Binding an actor to a worker (capacity admission), re-adopting it, and releasing it (the end
//! of a suspend).

use ate_core::{ActorRef, ActorState};
use sqlx::Row as _;

use super::actors::{
    DELETE_ASSIGNMENT, apply_update, begin_on_actor, delete_actor_rows, write_actor,
};
use super::events::record_change;
use super::snapshots::insert_snapshot;
use super::{StoreImpl, Tx};
use crate::util::{admits, check_state, not_found, parse_worker_status, to_i64, to_u64};
use crate::{ActorRecord, Capacity, Result, SnapshotRecord, StoreError, Transition, WorkerStatus};

pub(super) async fn bind_actor(
    store: &StoreImpl,
    actor: &ActorRef,
    from: &[ActorState],
    worker_id: &str,
    demand: Capacity,
    now_ms: i64,
) -> Result<ActorRecord> {
    let (mut tx, mut record) = begin_on_actor(store, actor).await?;
    let before = record.clone();
    // Already bound here (a retried bind): the same call succeeds again.
    let rebind =
        record.state == ActorState::Resuming && record.worker_id.as_deref() == Some(worker_id);
    if !rebind {
        check_state(record.state, from)?;
    }
    super::atespaces::check_quota(&mut tx, actor, &demand).await?;
    let epoch = admit(&mut tx, actor, worker_id, demand).await?;
    // A new activation gets a new fencing token; a retried bind keeps the one it took, so a
    // sandbox its first attempt started is the same activation.
    if !rebind {
        record.activation = record
            .activation
            .checked_add(1)
            .ok_or_else(|| StoreError::Database(format!("actor {actor}: activation overflow")))?;
    }
    record.state = ActorState::Resuming;
    commit_bound(tx, before, record, worker_id, epoch, now_ms).await
}

pub(super) async fn readopt_actor(
    store: &StoreImpl,
    actor: &ActorRef,
    worker_id: &str,
    activation: u64,
    demand: Capacity,
    now_ms: i64,
) -> Result<ActorRecord> {
    let (mut tx, mut record) = begin_on_actor(store, actor).await?;
    check_state(record.state, &[ActorState::Suspended])?;
    let before = record.clone();
    if record.activation != activation {
        return Err(StoreError::FailedPrecondition(format!(
            "actor {actor} is at activation {}, not {activation}",
            record.activation
        )));
    }
    let epoch = admit(&mut tx, actor, worker_id, demand).await?;
    record.state = ActorState::Running;
    record.last_error = None;
    commit_bound(tx, before, record, worker_id, epoch, now_ms).await
}

/// The end of a bind or a re-adoption: the actor, admitted on `worker_id` at its registered
/// `epoch`, is written and the transaction committed.
async fn commit_bound(
    mut tx: Tx,
    before: ActorRecord,
    mut record: ActorRecord,
    worker_id: &str,
    epoch: u64,
    now_ms: i64,
) -> Result<ActorRecord> {
    record.worker_id = Some(worker_id.to_string());
    record.epoch = epoch;
    record.updated_ms = now_ms;
    let record = write_actor(&mut tx, &record).await?;
    record_change(&mut tx, Some(&before), Some(&record), None, None, now_ms).await?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn release_actor(
    store: &StoreImpl,
    actor: &ActorRef,
    transition: Transition<'_>,
    snapshot: Option<&SnapshotRecord>,
    now_ms: i64,
) -> Result<ActorRecord> {
    let (mut tx, mut record) = begin_on_actor(store, actor).await?;
    check_state(record.state, transition.from)?;
    let before = record.clone();
    let note = apply_update(&mut record, transition.update, now_ms);
    if let Some(snapshot) = snapshot {
        if snapshot.atespace != actor.atespace || snapshot.name != actor.name {
            return Err(StoreError::FailedPrecondition(format!(
                "snapshot of actor \"{}/{}\" cannot be recorded for actor \"{actor}\"",
                snapshot.atespace, snapshot.name
            )));
        }
        insert_snapshot(&mut tx, snapshot).await?;
        // The newest generation now lives on the node that wrote it.
        record.generation = snapshot.generation;
        record.attached_node = Some(snapshot.node.clone()).filter(|node| !node.is_empty());
    }
    delete_actor_rows(&mut tx, DELETE_ASSIGNMENT, actor).await?;
    record.state = transition.to;
    record.worker_id = None;
    let record = write_actor(&mut tx, &record).await?;
    let note = note.as_deref();
    record_change(
        &mut tx,
        Some(&before),
        Some(&record),
        note,
        snapshot,
        now_ms,
    )
    .await?;
    tx.commit().await?;
    Ok(record)
}

/// Capacity admission inside a bind's transaction: the worker exists (NotFound) and is ACTIVE,
/// and its assignments minus this actor's plus `demand` fit (else NoRoom); then the actor's
/// assignment is set to this worker. Returns the worker's registered epoch.
async fn admit(tx: &mut Tx, actor: &ActorRef, worker_id: &str, demand: Capacity) -> Result<u64> {
    let demand_cpu = to_i64(demand.cpu_millis, "cpu_millis")?;
    let demand_memory = to_i64(demand.memory_bytes, "memory_bytes")?;
    // The worker row lock serializes every admission onto this worker (Postgres; SQLite's
    // BEGIN IMMEDIATE serializes all writers).
    let worker = sqlx::query(concat!(
        "SELECT status, epoch, cpu_millis, memory_bytes, slots FROM workers WHERE id = $1",
        for_update!()
    ))
    .bind(worker_id)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(|| not_found("worker", worker_id))?;
    let status: String = worker.try_get("status")?;
    if parse_worker_status(&status)? != WorkerStatus::Active {
        return Err(StoreError::NoRoom {
            worker_id: worker_id.to_string(),
        });
    }
    let capacity = Capacity {
        cpu_millis: to_u64(worker.try_get("cpu_millis")?, "workers.cpu_millis")?,
        memory_bytes: to_u64(worker.try_get("memory_bytes")?, "workers.memory_bytes")?,
        slots: to_u64(worker.try_get("slots")?, "workers.slots")?,
    };
    let epoch = to_u64(worker.try_get("epoch")?, "workers.epoch")?;
    let used = sqlx::query(
        "SELECT CAST(COALESCE(SUM(cpu_millis), 0) AS BIGINT) AS cpu, \
         CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT) AS mem, COUNT(*) AS n \
         FROM actor_assignments WHERE worker_id = $1 AND NOT (atespace = $2 AND name = $3)",
    )
    .bind(worker_id)
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_one(&mut **tx)
    .await?;
    let used = Capacity {
        cpu_millis: to_u64(used.try_get("cpu")?, "used cpu_millis")?,
        memory_bytes: to_u64(used.try_get("mem")?, "used memory_bytes")?,
        slots: to_u64(used.try_get("n")?, "used slots")?,
    };
    if !admits(&capacity, &used, &demand) {
        return Err(StoreError::NoRoom {
            worker_id: worker_id.to_string(),
        });
    }
    sqlx::query(
        "INSERT INTO actor_assignments (atespace, name, worker_id, cpu_millis, memory_bytes) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (atespace, name) DO UPDATE SET \
         worker_id = excluded.worker_id, cpu_millis = excluded.cpu_millis, memory_bytes = excluded.memory_bytes",
    )
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(worker_id)
    .bind(demand_cpu)
    .bind(demand_memory)
    .execute(&mut **tx)
    .await?;
    Ok(epoch)
}
