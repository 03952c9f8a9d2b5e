//! Workers: registration, heartbeats (fenced by epoch), and expiry.

use sqlx::Row as _;

use super::StoreImpl;
use super::rows::{read_all, read_one, worker_from_row};
use crate::util::{not_found, to_i64, to_json};
use crate::{Result, WorkerRecord, WorkerStatus};

pub(super) async fn register_worker(
    store: &StoreImpl,
    worker: &WorkerRecord,
    now_ms: i64,
) -> Result<WorkerRecord> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    sqlx::query(
        "INSERT INTO workers (id, node, addresses, identity, labels, sandbox_class, can_restore_memory, \
         cpu_millis, memory_bytes, slots, epoch, status, last_heartbeat_ms, node_address, boot_id, capabilities, \
         cpu_physical_millis, cpu_usage_millis) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, 0) \
         ON CONFLICT (id) DO UPDATE SET node = excluded.node, addresses = excluded.addresses, \
         identity = excluded.identity, labels = excluded.labels, sandbox_class = excluded.sandbox_class, \
         can_restore_memory = excluded.can_restore_memory, cpu_millis = excluded.cpu_millis, \
         memory_bytes = excluded.memory_bytes, slots = excluded.slots, epoch = excluded.epoch, \
         status = excluded.status, last_heartbeat_ms = excluded.last_heartbeat_ms, \
         node_address = excluded.node_address, boot_id = excluded.boot_id, \
         capabilities = excluded.capabilities, cpu_physical_millis = excluded.cpu_physical_millis, \
         cpu_usage_millis = 0",
    )
    .bind(&worker.id)
    .bind(&worker.node)
    .bind(to_json(&worker.addresses, "addresses")?)
    .bind(&worker.identity)
    .bind(to_json(&worker.labels, "labels")?)
    .bind(&worker.sandbox_class)
    .bind(worker.can_restore_memory)
    .bind(to_i64(worker.capacity.cpu_millis, "cpu_millis")?)
    .bind(to_i64(worker.capacity.memory_bytes, "memory_bytes")?)
    .bind(to_i64(worker.capacity.slots, "slots")?)
    .bind(to_i64(worker.epoch, "epoch")?)
    .bind(WorkerStatus::Active.as_str())
    .bind(now_ms)
    .bind(&worker.node_address)
    .bind(&worker.boot_id)
    .bind(to_json(&worker.capabilities, "capabilities")?)
    .bind(to_i64(worker.cpu_physical_millis, "cpu_physical_millis")?)
    .execute(&mut *tx)
    .await?;
    let row = sqlx::query(concat!(worker_select!(), " WHERE w.id = $1"))
        .bind(&worker.id)
        .fetch_one(&mut *tx)
        .await?;
    let record = worker_from_row(&row)?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn heartbeat_worker(
    store: &StoreImpl,
    id: &str,
    epoch: u64,
    cpu_usage_millis: u64,
    now_ms: i64,
) -> Result<bool> {
    store.counters.write();
    let Ok(epoch) = i64::try_from(epoch) else {
        return Ok(false); // no stored epoch can be that large
    };
    let done = sqlx::query(
        "UPDATE workers SET last_heartbeat_ms = $3, cpu_usage_millis = $4 \
         WHERE id = $1 AND epoch = $2 AND status = 'ACTIVE'",
    )
    .bind(id)
    .bind(epoch)
    .bind(now_ms)
    .bind(to_i64(cpu_usage_millis, "cpu_usage_millis")?)
    .execute(&store.pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn deregister_worker(store: &StoreImpl, id: &str) -> Result<()> {
    store.counters.write();
    let done = sqlx::query("UPDATE workers SET status = 'GONE' WHERE id = $1")
        .bind(id)
        .execute(&store.pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(not_found("worker", id));
    }
    Ok(())
}

pub(super) async fn get_worker(store: &StoreImpl, id: &str) -> Result<WorkerRecord> {
    let query = sqlx::query(concat!(worker_select!(), " WHERE w.id = $1")).bind(id);
    read_one(store, query, worker_from_row, "worker", id).await
}

pub(super) async fn list_workers(store: &StoreImpl) -> Result<Vec<WorkerRecord>> {
    let query = sqlx::query(concat!(worker_select!(), " ORDER BY w.id"));
    read_all(store, query, worker_from_row).await
}

pub(super) async fn expire_workers(store: &StoreImpl, stale_before_ms: i64) -> Result<Vec<String>> {
    store.counters.write();
    let rows = sqlx::query(
        "UPDATE workers SET status = 'GONE' WHERE status = 'ACTIVE' AND last_heartbeat_ms < $1 RETURNING id",
    )
    .bind(stale_before_ms)
    .fetch_all(&store.pool)
    .await?;
    let mut ids = rows
        .iter()
        .map(|r| r.try_get::<String, _>("id"))
        .collect::<Result<Vec<_>, _>>()?;
    ids.sort();
    Ok(ids)
}
