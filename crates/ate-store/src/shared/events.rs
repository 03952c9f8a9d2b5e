//! Actor events: the row a state change writes inside its own transaction, reading them back
//! (filtered, after an id, newest or oldest first) and retention.

use sqlx::Row as _;

use super::{DbRow, StoreImpl, Tx};
use crate::events::{ActorEvent, EventKind, EventPage, EventQuery, NewEvent, describe};
use crate::util::{none_as_empty, parse_state, to_i64, to_u64};
use crate::{ActorRecord, Result, SnapshotRecord, StoreError};

macro_rules! event_cols {
    () => {
        "id, time_ms, atespace, name, uid, kind, reason, from_state, to_state, worker_id, generation, message"
    };
}

/// The WHERE clause of a read: `$1` atespace, `$2` name (each NULL: any), after the id `$3`.
macro_rules! event_filter {
    () => {
        " FROM actor_events WHERE ($1 IS NULL OR atespace = $1) AND ($2 IS NULL OR name = $2) AND id > $3"
    };
}

/// Records the event of `before` → `after` (see [`describe`]) in `tx`; nothing when nothing
/// changed.
pub(super) async fn record_change(
    tx: &mut Tx,
    before: Option<&ActorRecord>,
    after: Option<&ActorRecord>,
    note: Option<&str>,
    wrote: Option<&SnapshotRecord>,
    now_ms: i64,
) -> Result<()> {
    let Some(actor) = after.or(before) else {
        return Ok(());
    };
    match describe(before, after, note, wrote) {
        Some(event) => insert(tx, actor, &event, now_ms).await,
        None => Ok(()),
    }
}

/// Inserts `event` about `actor` (as it is after the change).
pub(super) async fn insert(
    tx: &mut Tx,
    actor: &ActorRecord,
    event: &NewEvent,
    now_ms: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO actor_events (time_ms, atespace, name, uid, kind, reason, from_state, \
         to_state, worker_id, generation, message) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(now_ms)
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(&actor.uid)
    .bind(event.kind.as_str())
    .bind(event.reason)
    .bind(event.from_state.map_or("", |s| s.as_str()))
    .bind(event.to_state.map_or("", |s| s.as_str()))
    .bind(none_as_empty(&event.worker_id))
    .bind(to_i64(actor.generation, "generation")?)
    .bind(&event.message)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn list_events(store: &StoreImpl, query: &EventQuery) -> Result<EventPage> {
    store.counters.read();
    let newest_id: i64 =
        sqlx::query("SELECT CAST(COALESCE(MAX(id), 0) AS BIGINT) AS n FROM actor_events")
            .fetch_one(&store.pool)
            .await?
            .try_get("n")?;
    if query.limit == 0 {
        return Ok(EventPage {
            events: Vec::new(),
            newest_id,
        });
    }
    let rows = if query.newest {
        sqlx::query(concat!(
            "SELECT ",
            event_cols!(),
            event_filter!(),
            " ORDER BY id DESC LIMIT $4"
        ))
    } else {
        sqlx::query(concat!(
            "SELECT ",
            event_cols!(),
            event_filter!(),
            " ORDER BY id LIMIT $4"
        ))
    }
    .bind(query.atespace.as_deref())
    .bind(query.name.as_deref())
    .bind(query.after_id)
    .bind(i64::from(query.limit))
    .fetch_all(&store.pool)
    .await?;
    let mut events = rows
        .iter()
        .map(event_from_row)
        .collect::<Result<Vec<_>>>()?;
    if query.newest {
        events.reverse();
    }
    Ok(EventPage { events, newest_id })
}

/// Deletes up to `limit` events older than `before_ms`, oldest first; returns how many.
pub(super) async fn prune_events(store: &StoreImpl, before_ms: i64, limit: u32) -> Result<u64> {
    store.counters.write();
    let _writer = store.write_guard().await;
    let done = sqlx::query(
        "DELETE FROM actor_events WHERE id IN \
         (SELECT id FROM actor_events WHERE time_ms < $1 ORDER BY id LIMIT $2)",
    )
    .bind(before_ms)
    .bind(i64::from(limit))
    .execute(&store.pool)
    .await?;
    Ok(done.rows_affected())
}

fn event_from_row(row: &DbRow) -> Result<ActorEvent> {
    let state = |column: &str| -> Result<_> {
        let text: String = row.try_get(column)?;
        if text.is_empty() {
            Ok(None)
        } else {
            parse_state(&text).map(Some)
        }
    };
    let kind: String = row.try_get("kind")?;
    let worker: String = row.try_get("worker_id")?;
    Ok(ActorEvent {
        id: row.try_get("id")?,
        time_ms: row.try_get("time_ms")?,
        atespace: row.try_get("atespace")?,
        name: row.try_get("name")?,
        uid: row.try_get("uid")?,
        kind: EventKind::parse(&kind)
            .ok_or_else(|| StoreError::Database(format!("unknown event kind {kind:?}")))?,
        reason: row.try_get("reason")?,
        from_state: state("from_state")?,
        to_state: state("to_state")?,
        worker_id: Some(worker).filter(|w| !w.is_empty()),
        generation: to_u64(row.try_get("generation")?, "actor_events.generation")?,
        message: row.try_get("message")?,
    })
}
