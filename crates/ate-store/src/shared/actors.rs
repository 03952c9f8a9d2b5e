//! Actors: create, read, list, delete, and the compare-and-set state transitions; also the
//! actor-row helpers that binding shares (lock, write, apply an update).

use std::collections::BTreeMap;

use ate_core::{ActorRef, ActorState};

use super::atespaces::share_atespace;
use super::events::record_change;
use super::leases::DELETE_LEASE;
use super::rows::{actor_from_row, found, read_all, read_one, snapshot_from_row};
use super::{StoreImpl, Tx};
use crate::util::{
    already_exists, check_state, none_as_empty, not_found, to_i64, to_json, unique_or,
};
use crate::{ActorRecord, ActorUpdate, Result, SnapshotRecord, Transition};

pub(super) async fn create_actor(store: &StoreImpl, actor: &ActorRecord) -> Result<ActorRecord> {
    store.counters.write();
    let selector = to_json(&actor.worker_selector, "worker_selector")?;
    let epoch = to_i64(actor.epoch, "epoch")?;
    let generation = to_i64(actor.generation, "generation")?;
    let mut tx = store.begin_write().await?;
    share_atespace(&mut tx, &actor.atespace).await?;
    let template = sqlx::query(concat!(
        "SELECT name FROM templates WHERE namespace = $1 AND name = $2",
        for_share!()
    ))
    .bind(&actor.template.namespace)
    .bind(&actor.template.name)
    .fetch_optional(&mut *tx)
    .await?;
    if template.is_none() {
        return Err(not_found("template", &actor.template.to_string()));
    }
    let inserted = sqlx::query(concat!(
        "INSERT INTO actors (",
        actor_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING ",
        actor_cols!()
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(&actor.uid)
    .bind(actor.template.to_string())
    .bind(actor.state.as_str())
    .bind(selector)
    .bind(actor.worker_id.as_deref())
    .bind(epoch)
    .bind(generation)
    .bind(actor.attached_node.as_deref())
    .bind(none_as_empty(&actor.last_error))
    .bind(actor.created_ms)
    .bind(actor.updated_ms)
    .bind(to_i64(actor.activation, "activation")?)
    .fetch_one(&mut *tx)
    .await;
    let row = unique_or(inserted, || {
        already_exists("actor", &format!("{}/{}", actor.atespace, actor.name))
    })?;
    let record = actor_from_row(&row)?;
    record_change(&mut tx, None, Some(&record), None, None, record.created_ms).await?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn get_actor(store: &StoreImpl, actor: &ActorRef) -> Result<ActorRecord> {
    let query = sqlx::query(concat!(
        "SELECT ",
        actor_cols!(),
        " FROM actors WHERE atespace = $1 AND name = $2"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name);
    read_one(store, query, actor_from_row, "actor", actor).await
}

pub(super) async fn list_actors(
    store: &StoreImpl,
    atespace: Option<&str>,
    after: Option<&ActorRef>,
    limit: u32,
) -> Result<Vec<ActorRecord>> {
    // Names are never empty, so ("", "") sorts before every actor.
    let (after_space, after_name) = after.map_or(("", ""), |a| (&a.atespace, &a.name));
    let query = sqlx::query(concat!(
        "SELECT ",
        actor_cols!(),
        // A row comparison, not `a > x OR (a = x AND n > y)`: PostgreSQL turns it into an index
        // range (the OR form scanned the key index from its start on every page: 107 s to page
        // through a million actors).
        " FROM actors WHERE ($1 IS NULL OR atespace = $1) AND (atespace, name) > ($2, $3) \
         ORDER BY atespace, name LIMIT $4"
    ))
    .bind(atespace)
    .bind(after_space)
    .bind(after_name)
    .bind(i64::from(limit));
    read_all(store, query, actor_from_row).await
}

pub(super) async fn update_actor_selector(
    store: &StoreImpl,
    actor: &ActorRef,
    selector: &BTreeMap<String, String>,
    now_ms: i64,
) -> Result<ActorRecord> {
    store.counters.write();
    let row = sqlx::query(concat!(
        "UPDATE actors SET worker_selector = $3, updated_ms = $4 WHERE atespace = $1 AND name = $2 RETURNING ",
        actor_cols!()
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(to_json(selector, "worker_selector")?)
    .bind(now_ms)
    .fetch_optional(&store.pool)
    .await?;
    found(row, actor_from_row, "actor", actor)
}

pub(super) async fn delete_actor(
    store: &StoreImpl,
    actor: &ActorRef,
    now_ms: i64,
) -> Result<Vec<SnapshotRecord>> {
    let (mut tx, record) = begin_on_actor(store, actor).await?;
    check_state(record.state, &[ActorState::Suspended, ActorState::Crashed])?;
    let rows = sqlx::query(concat!(
        "SELECT ",
        snapshot_select_cols!(),
        " FROM snapshots s WHERE atespace = $1 AND name = $2 \
         AND NOT EXISTS (SELECT 1 FROM tags t WHERE t.s_uuid = s.uuid) ORDER BY generation DESC"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_all(&mut *tx)
    .await?;
    let unreferenced = rows
        .iter()
        .map(|r| snapshot_from_row(r, ""))
        .collect::<Result<Vec<_>>>()?;
    delete_actor_rows(&mut tx, DELETE_SNAPSHOTS, actor).await?;
    delete_actor_rows(&mut tx, DELETE_ASSIGNMENT, actor).await?;
    sqlx::query("DELETE FROM leases WHERE key = $1")
        .bind(actor.lease_key())
        .execute(&mut *tx)
        .await?;
    delete_actor_rows(&mut tx, DELETE_FROZEN_COPY, actor).await?;
    delete_actor_rows(&mut tx, DELETE_ALARM, actor).await?;
    delete_actor_rows(&mut tx, DELETE_ACTOR, actor).await?;
    record_change(&mut tx, Some(&record), None, None, None, now_ms).await?;
    tx.commit().await?;
    Ok(unreferenced)
}

/// [`crate::Store::transition`], and with `lease` (key, holder)
/// [`crate::Store::transition_releasing_lease`]:
/// the lease row is deleted in the same transaction.
pub(super) async fn transition(
    store: &StoreImpl,
    actor: &ActorRef,
    transition: Transition<'_>,
    now_ms: i64,
    lease: Option<(&str, &str)>,
) -> Result<ActorRecord> {
    if lease.is_some() {
        store.counters.lease();
    }
    let (mut tx, mut record) = begin_on_actor(store, actor).await?;
    check_state(record.state, transition.from)?;
    let before = record.clone();
    record.state = transition.to;
    let note = apply_update(&mut record, transition.update, now_ms);
    let record = write_actor(&mut tx, &record).await?;
    record_change(
        &mut tx,
        Some(&before),
        Some(&record),
        note.as_deref(),
        None,
        now_ms,
    )
    .await?;
    if let Some((key, holder)) = lease {
        sqlx::query(DELETE_LEASE)
            .bind(key)
            .bind(holder)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn actors_on_worker(
    store: &StoreImpl,
    worker_id: &str,
) -> Result<Vec<ActorRecord>> {
    let query = sqlx::query(concat!(
        "SELECT ",
        actor_cols!(),
        " FROM actors WHERE worker_id = $1 ORDER BY atespace, name"
    ))
    .bind(worker_id);
    read_all(store, query, actor_from_row).await
}

/// A write transaction (counted as one write) holding the actor's row lock, and the row.
pub(super) async fn begin_on_actor(
    store: &StoreImpl,
    actor: &ActorRef,
) -> Result<(Tx, ActorRecord)> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let record = lock_actor(&mut tx, actor).await?;
    Ok((tx, record))
}

// Statements for `delete_actor_rows`: each deletes the actor's rows of one table.
const DELETE_SNAPSHOTS: &str = "DELETE FROM snapshots WHERE atespace = $1 AND name = $2";
/// Drops the actor's assignment (its claim on a worker's capacity).
pub(super) const DELETE_ASSIGNMENT: &str =
    "DELETE FROM actor_assignments WHERE atespace = $1 AND name = $2";
const DELETE_FROZEN_COPY: &str = "DELETE FROM frozen_copies WHERE atespace = $1 AND name = $2";
const DELETE_ALARM: &str = "DELETE FROM alarms WHERE atespace = $1 AND name = $2";
const DELETE_ACTOR: &str = "DELETE FROM actors WHERE atespace = $1 AND name = $2";

/// Runs `sql`, a DELETE keyed by `atespace = $1 AND name = $2`, for the actor.
pub(super) async fn delete_actor_rows(
    tx: &mut Tx,
    sql: &'static str,
    actor: &ActorRef,
) -> Result<()> {
    sqlx::query(sql)
        .bind(&actor.atespace)
        .bind(&actor.name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The actor row, locked for update (Postgres). NotFound if missing.
pub(super) async fn lock_actor(tx: &mut Tx, actor: &ActorRef) -> Result<ActorRecord> {
    let row = sqlx::query(concat!(
        "SELECT ",
        actor_cols!(),
        " FROM actors WHERE atespace = $1 AND name = $2",
        for_update!()
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_optional(&mut **tx)
    .await?;
    found(row, actor_from_row, "actor", actor)
}

/// Writes every mutable field of the actor and returns the stored row.
pub(super) async fn write_actor(tx: &mut Tx, actor: &ActorRecord) -> Result<ActorRecord> {
    let row = sqlx::query(concat!(
        "UPDATE actors SET state = $3, worker_selector = $4, worker_id = $5, epoch = $6, generation = $7, \
         attached_node = $8, last_error = $9, updated_ms = $10, activation = $11 WHERE atespace = $1 AND name = $2 RETURNING ",
        actor_cols!()
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(actor.state.as_str())
    .bind(to_json(&actor.worker_selector, "worker_selector")?)
    .bind(actor.worker_id.as_deref())
    .bind(to_i64(actor.epoch, "epoch")?)
    .bind(to_i64(actor.generation, "generation")?)
    .bind(actor.attached_node.as_deref())
    .bind(none_as_empty(&actor.last_error))
    .bind(actor.updated_ms)
    .bind(to_i64(actor.activation, "activation")?)
    .fetch_optional(&mut **tx)
    .await?;
    found(
        row,
        actor_from_row,
        "actor",
        format_args!("{}/{}", actor.atespace, actor.name),
    )
}

/// Applies `update` to `actor` and returns its note (for the event, not kept on the actor).
pub(super) fn apply_update(
    actor: &mut ActorRecord,
    update: ActorUpdate,
    now_ms: i64,
) -> Option<String> {
    if let Some(error) = update.last_error {
        actor.last_error = error;
    }
    if let Some(epoch) = update.epoch {
        actor.epoch = epoch;
    }
    if update.clear_attached_node {
        actor.attached_node = None;
    }
    actor.updated_ms = now_ms;
    update.note
}
