//! Snapshot rows: listing, pruning, and the durable-copy and local-copy updates (which tags,
//! holding a copy of the row, follow).

use ate_core::{ActorRef, DurableStatus};
use sqlx::Row as _;

use super::actors::begin_on_actor;
use super::rows::{bind_snapshot, snapshot_from_row};
use super::{StoreImpl, Tx};
use crate::util::{snapshot_not_found, to_i64, unique_or};
use crate::{Result, SnapshotRecord, StoreError};

pub(super) async fn list_snapshots(
    store: &StoreImpl,
    actor: &ActorRef,
) -> Result<Vec<SnapshotRecord>> {
    store.counters.read();
    let rows = sqlx::query(concat!(
        "SELECT ",
        snapshot_cols!(),
        " FROM snapshots WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_all(&store.pool)
    .await?;
    rows.iter().map(|r| snapshot_from_row(r, "")).collect()
}

pub(super) async fn prune_snapshots(
    store: &StoreImpl,
    actor: &ActorRef,
    keep_newest: usize,
) -> Result<Vec<SnapshotRecord>> {
    // The actor row lock serializes this with suspends and deletes of the same actor.
    let (mut tx, _) = begin_on_actor(store, actor).await?;
    let rows = sqlx::query(concat!(
        "SELECT ",
        snapshot_cols!(),
        ", EXISTS (SELECT 1 FROM tags t WHERE t.s_uuid = s.uuid) AS tagged \
         FROM snapshots s WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
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
            .bind(&actor.atespace)
            .bind(&actor.name)
            .bind(to_i64(snap.generation, "generation")?)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(doomed)
}

pub(super) async fn update_snapshot_durable(
    store: &StoreImpl,
    actor: &ActorRef,
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
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(to_i64(generation, "generation")?)
    .bind(status.as_str())
    .bind(durable_uri)
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| snapshot_not_found(actor, generation))?;
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
    actor: &ActorRef,
    generation: u64,
) -> Result<()> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(
        "UPDATE snapshots SET local_path = '' WHERE atespace = $1 AND name = $2 AND generation = $3 RETURNING uuid",
    )
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(to_i64(generation, "generation")?)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| snapshot_not_found(actor, generation))?;
    let uuid: String = row.try_get("uuid")?;
    sqlx::query("UPDATE tags SET s_local_path = '' WHERE s_uuid = $1")
        .bind(uuid)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn insert_snapshot(tx: &mut Tx, s: &SnapshotRecord) -> Result<()> {
    let insert = sqlx::query(concat!(
        "INSERT INTO snapshots (",
        snapshot_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
    ));
    let inserted = bind_snapshot(insert, s)?.execute(&mut **tx).await;
    unique_or(inserted, || {
        StoreError::AlreadyExists(format!(
            "snapshot {} of actor \"{}/{}\" already exists",
            s.generation, s.atespace, s.name
        ))
    })?;
    Ok(())
}
