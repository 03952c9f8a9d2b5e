//! Snapshot rows: listing, pruning, and the durable-copy and local-copy updates (which tags,
//! holding a copy of the row, follow).

use ate_core::DurableStatus;
use sqlx::Row as _;

use super::actors::lock_actor;
use super::rows::snapshot_from_row;
use super::{StoreImpl, Tx};
use crate::util::{is_unique_violation, none_as_empty, snapshot_not_found, to_i64};
use crate::{Result, SnapshotRecord, StoreError};

pub(super) async fn list_snapshots(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
) -> Result<Vec<SnapshotRecord>> {
    store.counters.read();
    let rows = sqlx::query(concat!(
        "SELECT ",
        snapshot_cols!(),
        " FROM snapshots WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(atespace)
    .bind(name)
    .fetch_all(&store.pool)
    .await?;
    rows.iter().map(|r| snapshot_from_row(r, "")).collect()
}

pub(super) async fn prune_snapshots(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
    keep_newest: usize,
) -> Result<Vec<SnapshotRecord>> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    // The actor row lock serializes this with suspends and deletes of the same actor.
    lock_actor(&mut tx, atespace, name).await?;
    let rows = sqlx::query(concat!(
        "SELECT ",
        snapshot_cols!(),
        ", EXISTS (SELECT 1 FROM tags t WHERE t.s_uuid = s.uuid) AS tagged \
         FROM snapshots s WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(atespace)
    .bind(name)
    .fetch_all(&mut *tx)
    .await?;
    let mut newest_completed_kept = false;
    let mut doomed = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let snap = snapshot_from_row(row, "")?;
        let tagged: bool = row.try_get("tagged")?;
        let completed = snap.durable_status == Some(DurableStatus::Completed);
        let keep = i < keep_newest.max(1) || tagged || (completed && !newest_completed_kept);
        if completed {
            newest_completed_kept = true;
        }
        if !keep {
            doomed.push(snap);
        }
    }
    for snap in &doomed {
        sqlx::query("DELETE FROM snapshots WHERE atespace = $1 AND name = $2 AND generation = $3")
            .bind(atespace)
            .bind(name)
            .bind(to_i64(snap.generation, "generation")?)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(doomed)
}

pub(super) async fn update_snapshot_durable(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
    generation: u64,
    status: DurableStatus,
    durable_uri: &str,
    reason: &str,
) -> Result<()> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(
        "UPDATE snapshots SET durable_status = $4, durable_uri = $5, \
         reason = CASE WHEN $6 = '' THEN reason ELSE $6 END \
         WHERE atespace = $1 AND name = $2 AND generation = $3 RETURNING uuid",
    )
    .bind(atespace)
    .bind(name)
    .bind(to_i64(generation, "generation")?)
    .bind(status.as_str())
    .bind(durable_uri)
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| snapshot_not_found(atespace, name, generation))?;
    let uuid: String = row.try_get("uuid")?;
    // Tags hold a copy of the row: keep their durable copy's whereabouts current.
    sqlx::query(
        "UPDATE tags SET s_durable_status = $2, s_durable_uri = $3, \
         s_reason = CASE WHEN $4 = '' THEN s_reason ELSE $4 END WHERE s_uuid = $1",
    )
    .bind(uuid)
    .bind(status.as_str())
    .bind(durable_uri)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn clear_snapshot_local(
    store: &StoreImpl,
    atespace: &str,
    name: &str,
    generation: u64,
) -> Result<()> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(
        "UPDATE snapshots SET local_path = '' WHERE atespace = $1 AND name = $2 AND generation = $3 RETURNING uuid",
    )
    .bind(atespace)
    .bind(name)
    .bind(to_i64(generation, "generation")?)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| snapshot_not_found(atespace, name, generation))?;
    let uuid: String = row.try_get("uuid")?;
    sqlx::query("UPDATE tags SET s_local_path = '' WHERE s_uuid = $1")
        .bind(uuid)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn insert_snapshot(tx: &mut Tx, s: &SnapshotRecord) -> Result<()> {
    let inserted = sqlx::query(concat!(
        "INSERT INTO snapshots (",
        snapshot_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
    ))
    .bind(&s.atespace)
    .bind(&s.name)
    .bind(to_i64(s.generation, "generation")?)
    .bind(&s.uuid)
    .bind(s.fidelity.as_str())
    .bind(s.template.to_string())
    .bind(&s.sandbox_class)
    .bind(&s.node)
    .bind(&s.boot_id)
    .bind(none_as_empty(&s.local_path))
    .bind(none_as_empty(&s.durable_uri))
    .bind(s.durable_status.map(|d| d.as_str()))
    .bind(to_i64(s.size_bytes, "size_bytes")?)
    .bind(&s.checksum)
    .bind(none_as_empty(&s.reason))
    .bind(s.created_ms)
    .execute(&mut **tx)
    .await;
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists(format!(
            "snapshot {} of actor \"{}/{}\" already exists",
            s.generation, s.atespace, s.name
        ))),
        Err(e) => Err(e.into()),
    }
}
