//! Binding an actor to a worker (capacity admission), re-adopting it, and releasing it (the end
//! of a suspend).

use ate_core::ActorState;
use sqlx::Row as _;

use super::actors::{apply_update, lock_actor, write_actor};
use super::snapshots::insert_snapshot;
use super::{StoreImpl, Tx};
use crate::util::{admits, check_state, not_found, parse_worker_status, to_i64, to_u64};
use crate::{ActorRecord, ActorUpdate, Capacity, Result, SnapshotRecord, StoreError, WorkerStatus};

pub(super) async fn bind_actor(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
    from: &[ActorState],
    worker_id: &str,
    demand: Capacity,
    now_ms: i64,
) -> Result<ActorRecord> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let mut actor = lock_actor(&mut tx, atespace, name).await?;
    // Already bound here (a retried bind): the same call succeeds again.
    let rebind =
        actor.state == ActorState::Resuming && actor.worker_id.as_deref() == Some(worker_id);
    if !rebind {
        check_state(actor.state, from)?;
    }
    let epoch = admit(&mut tx, atespace, name, worker_id, demand).await?;
    // A new activation gets a new fencing token; a retried bind keeps the one it took, so a
    // sandbox its first attempt started is the same activation.
    if !rebind {
        actor.activation = actor.activation.checked_add(1).ok_or_else(|| {
            StoreError::Database(format!("actor {atespace}/{name}: activation overflow"))
        })?;
    }
    actor.state = ActorState::Resuming;
    actor.worker_id = Some(worker_id.to_string());
    actor.epoch = epoch;
    actor.updated_ms = now_ms;
    let record = write_actor(&mut tx, &actor).await?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn readopt_actor(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
    worker_id: &str,
    activation: u64,
    demand: Capacity,
    now_ms: i64,
) -> Result<ActorRecord> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let mut actor = lock_actor(&mut tx, atespace, name).await?;
    check_state(actor.state, &[ActorState::Suspended])?;
    if actor.activation != activation {
        return Err(StoreError::FailedPrecondition(format!(
            "actor {atespace}/{name} is at activation {}, not {activation}",
            actor.activation
        )));
    }
    let epoch = admit(&mut tx, atespace, name, worker_id, demand).await?;
    actor.state = ActorState::Running;
    actor.worker_id = Some(worker_id.to_string());
    actor.epoch = epoch;
    actor.last_error = None;
    actor.updated_ms = now_ms;
    let record = write_actor(&mut tx, &actor).await?;
    tx.commit().await?;
    Ok(record)
}

#[allow(clippy::too_many_arguments)] // the Store method's arguments, plus the store
pub(super) async fn release_actor(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
    from: &[ActorState],
    to: ActorState,
    snapshot: Option<&SnapshotRecord>,
    update: ActorUpdate,
    now_ms: i64,
) -> Result<ActorRecord> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let mut actor = lock_actor(&mut tx, atespace, name).await?;
    check_state(actor.state, from)?;
    apply_update(&mut actor, update, now_ms);
    if let Some(snapshot) = snapshot {
        if snapshot.atespace != atespace || snapshot.name != name {
            return Err(StoreError::FailedPrecondition(format!(
                "snapshot of actor \"{}/{}\" cannot be recorded for actor \"{atespace}/{name}\"",
                snapshot.atespace, snapshot.name
            )));
        }
        insert_snapshot(&mut tx, snapshot).await?;
        // The newest generation now lives on the node that wrote it.
        actor.generation = snapshot.generation;
        actor.attached_node = Some(snapshot.node.clone()).filter(|node| !node.is_empty());
    }
    sqlx::query("DELETE FROM actor_assignments WHERE atespace = $1 AND name = $2")
        .bind(atespace)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    actor.state = to;
    actor.worker_id = None;
    let record = write_actor(&mut tx, &actor).await?;
    tx.commit().await?;
    Ok(record)
}

/// Capacity admission inside a bind's transaction: the worker exists (NotFound) and is ACTIVE,
/// and its assignments minus this actor's plus `demand` fit (else NoRoom); then the actor's
/// assignment is set to this worker. Returns the worker's registered epoch.
async fn admit(
    tx: &mut Tx,
    atespace: &str,
    name: &str,
    worker_id: &str,
    demand: Capacity,
) -> Result<u64> {
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
    .bind(atespace)
    .bind(name)
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
    .bind(atespace)
    .bind(name)
    .bind(worker_id)
    .bind(demand_cpu)
    .bind(demand_memory)
    .execute(&mut **tx)
    .await?;
    Ok(epoch)
}
