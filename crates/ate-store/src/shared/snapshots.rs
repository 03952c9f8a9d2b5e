//! Snapshot rows: listing, pruning, the durable-copy and local-copy updates and the damage
//! marks (which tags, holding a copy of the row, follow), and a revert's choice of generation.

use ate_core::{ActorRef, ActorState, DurableStatus};
use sqlx::Row as _;

use super::actors::{DELETE_ASSIGNMENT, begin_on_actor, delete_actor_rows, write_actor};
use super::rows::{bind_snapshot, read_all, snapshot_from_row};
use super::{StoreImpl, Tx};
use crate::events::reverted;
use crate::util::{check_state, snapshot_not_found, to_i64, unique_or};
use crate::{ActorRecord, Result, SnapshotCopy, SnapshotRecord, StoreError};

pub(super) async fn list_snapshots(
    store: &StoreImpl,
    actor: &ActorRef,
) -> Result<Vec<SnapshotRecord>> {
    let query = sqlx::query(concat!(
        "SELECT ",
        snapshot_select_cols!(),
        " FROM snapshots WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name);
    read_all(store, query, |r| snapshot_from_row(r, "")).await
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
        snapshot_select_cols!(),
        ", EXISTS (SELECT 1 FROM tags t WHERE t.s_uuid = s.uuid) AS tagged \
         FROM snapshots s WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_all(&mut *tx)
    .await?;
    let mut newest_completed_kept = false;
    let mut choosable_kept = 0;
    let mut doomed = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let snap = snapshot_from_row(row, "")?;
        let tagged: bool = row.try_get("tagged")?;
        // What a resume (or a revert) could still take: not skipped by a revert, with a copy not
        // found damaged. Only such generations count among the newest kept, and the fallback
        // while the newest cannot be used is the newest of them with an intact durable copy.
        let choosable = !snap.skipped && (snap.local_intact() || snap.durable_intact());
        let completed = choosable && snap.durable_intact();
        let keep = i == 0
            || tagged
            || (choosable && choosable_kept < keep_newest)
            || (completed && !newest_completed_kept);
        if keep && choosable {
            choosable_kept += 1;
        }
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

pub(super) async fn mark_snapshot_damaged(
    store: &StoreImpl,
    actor: &ActorRef,
    generation: u64,
    uuid: &str,
    copy: SnapshotCopy,
    reason: &str,
) -> Result<SnapshotRecord> {
    store.counters.write();
    let (column, tag_column) = match copy {
        SnapshotCopy::Local => (DAMAGE_LOCAL, DAMAGE_LOCAL_TAGS),
        SnapshotCopy::Durable => (DAMAGE_DURABLE, DAMAGE_DURABLE_TAGS),
    };
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(column)
        .bind(&actor.atespace)
        .bind(&actor.name)
        .bind(to_i64(generation, "generation")?)
        .bind(uuid)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| snapshot_not_found(actor, generation))?;
    let record = snapshot_from_row(&row, "")?;
    // Tags hold a copy of the row: a golden tag must not seed actors from a damaged copy.
    sqlx::query(tag_column)
        .bind(uuid)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(record)
}

// The damage marks: a reason already recorded stays (the first finding names the file).
const DAMAGE_LOCAL: &str = concat!(
    "UPDATE snapshots SET local_damage = CASE WHEN local_damage = '' THEN $5 ELSE local_damage END \
     WHERE atespace = $1 AND name = $2 AND generation = $3 AND uuid = $4 RETURNING ",
    snapshot_select_cols!()
);
const DAMAGE_DURABLE: &str = concat!(
    "UPDATE snapshots SET durable_damage = CASE WHEN durable_damage = '' THEN $5 ELSE durable_damage END \
     WHERE atespace = $1 AND name = $2 AND generation = $3 AND uuid = $4 RETURNING ",
    snapshot_select_cols!()
);
const DAMAGE_LOCAL_TAGS: &str = "UPDATE tags SET s_local_damage = \
     CASE WHEN s_local_damage = '' THEN $2 ELSE s_local_damage END WHERE s_uuid = $1";
const DAMAGE_DURABLE_TAGS: &str = "UPDATE tags SET s_durable_damage = \
     CASE WHEN s_durable_damage = '' THEN $2 ELSE s_durable_damage END WHERE s_uuid = $1";

pub(super) async fn revert_actor(
    store: &StoreImpl,
    actor: &ActorRef,
    from: &[ActorState],
    generation: Option<u64>,
    now_ms: i64,
) -> Result<ActorRecord> {
    let (mut tx, mut record) = begin_on_actor(store, actor).await?;
    check_state(record.state, from)?;
    let before = record.clone();
    let rows = sqlx::query(concat!(
        "SELECT ",
        snapshot_select_cols!(),
        " FROM snapshots WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_all(&mut *tx)
    .await?;
    let generations = rows
        .iter()
        .map(|r| snapshot_from_row(r, ""))
        .collect::<Result<Vec<_>>>()?;
    let intact = |g: &SnapshotRecord| g.local_intact() || g.durable_intact();
    // What the revert goes back to: the generation asked for, or the newest one not skipped with
    // a copy not found damaged (0: none is left).
    let target = match generation {
        Some(generation) => {
            let snap = generations
                .iter()
                .find(|g| g.generation == generation)
                .ok_or_else(|| snapshot_not_found(actor, generation))?;
            if !intact(snap) {
                return Err(StoreError::FailedPrecondition(format!(
                    "generation {generation} of actor \"{actor}\" has no copy that was not found damaged"
                )));
            }
            generation
        }
        None => generations
            .iter()
            .find(|g| !g.skipped && intact(g))
            .map_or(0, |g| g.generation),
    };
    // Newer generations are set aside; the target is taken back if an earlier revert had set
    // it aside. Older ones keep their mark: one an earlier revert skipped belongs to a line of
    // generations abandoned then, and must not become a fallback again.
    if generations
        .iter()
        .any(|g| (g.generation > target && !g.skipped) || (g.generation == target && g.skipped))
    {
        sqlx::query(
            "UPDATE snapshots SET skipped = CASE WHEN generation > $3 THEN TRUE \
             WHEN generation = $3 THEN FALSE ELSE skipped END WHERE atespace = $1 AND name = $2",
        )
        .bind(&actor.atespace)
        .bind(&actor.name)
        .bind(to_i64(target, "generation")?)
        .execute(&mut *tx)
        .await?;
    }
    // A CRASHED actor holds no capacity, but its assignment row may outlive a failed release.
    delete_actor_rows(&mut tx, DELETE_ASSIGNMENT, actor).await?;
    record.state = ActorState::Suspended;
    record.worker_id = None;
    record.updated_ms = now_ms;
    let record = write_actor(&mut tx, &record).await?;
    let event = reverted(&before, &record, target);
    super::events::insert(&mut tx, &record, &event, now_ms).await?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn insert_snapshot(tx: &mut Tx, s: &SnapshotRecord) -> Result<()> {
    let insert = sqlx::query(concat!(
        "INSERT INTO snapshots (",
        snapshot_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)"
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
