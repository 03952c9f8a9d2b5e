//! Actors' alarms (one per actor): set, read, delete, and the claim-and-report cycle of the
//! delivery loop that several api replicas may run at once.
//!
//! A claim moves `next_attempt_ms` to the end of a lease instead of marking the row taken, so a
//! replica that dies mid-delivery leaves nothing to clean up: the alarm is simply due again when
//! the lease ends (delivery is at least once).

use ate_core::ActorRef;
use sqlx::Row as _;

use super::rows::{found, read_all, read_optional};
use super::{DbRow, StoreImpl};
use crate::util::to_u64;
use crate::{Alarm, Result, StoreError};

macro_rules! alarm_cols {
    () => {
        "atespace, name, seq, due_ms, path, attempts, next_attempt_ms, last_error, failed, set_ms"
    };
}

pub(super) async fn set_alarm(
    store: &StoreImpl,
    actor: &ActorRef,
    due_ms: i64,
    path: &str,
    now_ms: i64,
) -> Result<Alarm> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    // The seq lives on the actor row, so it survives a deleted alarm. Bumping it also checks that
    // the actor exists and (PostgreSQL) locks its row until commit, so a concurrent delete_actor
    // cannot leave this alarm behind.
    let row = sqlx::query(
        "UPDATE actors SET alarm_seq = alarm_seq + 1 WHERE atespace = $1 AND name = $2 \
         RETURNING alarm_seq",
    )
    .bind(&actor.atespace)
    .bind(&actor.name)
    .fetch_optional(&mut *tx)
    .await?;
    let seq: i64 = found(row, |r| Ok(r.try_get("alarm_seq")?), "actor", actor)?;
    let row = sqlx::query(concat!(
        "INSERT INTO alarms (",
        alarm_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, 0, $4, '', FALSE, $6) \
         ON CONFLICT (atespace, name) DO UPDATE SET seq = excluded.seq, due_ms = excluded.due_ms, \
         path = excluded.path, attempts = 0, next_attempt_ms = excluded.next_attempt_ms, \
         last_error = '', failed = FALSE, set_ms = excluded.set_ms RETURNING ",
        alarm_cols!()
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(seq)
    .bind(due_ms)
    .bind(path)
    .bind(now_ms)
    .fetch_one(&mut *tx)
    .await?;
    let alarm = alarm_from_row(&row)?;
    tx.commit().await?;
    Ok(alarm)
}

pub(super) async fn get_alarm(store: &StoreImpl, actor: &ActorRef) -> Result<Option<Alarm>> {
    let query = sqlx::query(concat!(
        "SELECT ",
        alarm_cols!(),
        " FROM alarms WHERE atespace = $1 AND name = $2"
    ))
    .bind(&actor.atespace)
    .bind(&actor.name);
    read_optional(store, query, alarm_from_row).await
}

pub(super) async fn delete_alarm(
    store: &StoreImpl,
    actor: &ActorRef,
    seq: Option<i64>,
) -> Result<bool> {
    store.counters.write();
    let _guard = store.write_guard().await;
    let done = sqlx::query(
        "DELETE FROM alarms WHERE atespace = $1 AND name = $2 AND ($3 IS NULL OR seq = $3)",
    )
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(seq)
    .execute(&store.pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn list_alarms(store: &StoreImpl, atespace: Option<&str>) -> Result<Vec<Alarm>> {
    let query = sqlx::query(concat!(
        "SELECT ",
        alarm_cols!(),
        " FROM alarms WHERE ($1 IS NULL OR atespace = $1) ORDER BY due_ms, atespace, name"
    ))
    .bind(atespace);
    read_all(store, query, alarm_from_row).await
}

pub(super) async fn claim_due_alarms(
    store: &StoreImpl,
    now_ms: i64,
    lease_ms: i64,
    limit: u32,
) -> Result<Vec<Alarm>> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    // PostgreSQL: the rows stay locked until commit and rows another claimer holds are skipped;
    // a row another claimer already committed is re-checked against `next_attempt_ms <= $1` and
    // dropped. SQLite: this transaction is the only writer.
    let rows = sqlx::query(concat!(
        "SELECT ",
        alarm_cols!(),
        " FROM alarms WHERE failed = FALSE AND next_attempt_ms <= $1 \
         ORDER BY next_attempt_ms, atespace, name LIMIT $2",
        for_update_skip_locked!()
    ))
    .bind(now_ms)
    .bind(i64::from(limit))
    .fetch_all(&mut *tx)
    .await?;
    let lease_end = now_ms.saturating_add(lease_ms);
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut alarm = alarm_from_row(row)?;
        sqlx::query("UPDATE alarms SET next_attempt_ms = $3 WHERE atespace = $1 AND name = $2")
            .bind(&alarm.actor.atespace)
            .bind(&alarm.actor.name)
            .bind(lease_end)
            .execute(&mut *tx)
            .await?;
        alarm.next_attempt_ms = lease_end;
        claimed.push(alarm);
    }
    tx.commit().await?;
    Ok(claimed)
}

pub(super) async fn alarm_attempt_failed(
    store: &StoreImpl,
    actor: &ActorRef,
    seq: i64,
    next_attempt_ms: i64,
    error: &str,
    give_up: bool,
) -> Result<bool> {
    store.counters.write();
    let _guard = store.write_guard().await;
    let done = sqlx::query(
        "UPDATE alarms SET attempts = attempts + 1, last_error = $4, next_attempt_ms = $5, \
         failed = $6 WHERE atespace = $1 AND name = $2 AND seq = $3",
    )
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(seq)
    .bind(error)
    .bind(next_attempt_ms)
    .bind(give_up)
    .execute(&store.pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

fn alarm_from_row(row: &DbRow) -> Result<Alarm> {
    let attempts = to_u64(row.try_get("attempts")?, "alarms.attempts")?;
    Ok(Alarm {
        actor: ActorRef::new(
            row.try_get::<String, _>("atespace")?,
            row.try_get::<String, _>("name")?,
        ),
        due_ms: row.try_get("due_ms")?,
        path: row.try_get("path")?,
        seq: row.try_get("seq")?,
        attempts: u32::try_from(attempts).map_err(|_| {
            StoreError::Database(format!(
                "column alarms.attempts holds {attempts}, more than a u32"
            ))
        })?,
        next_attempt_ms: row.try_get("next_attempt_ms")?,
        last_error: row.try_get("last_error")?,
        failed: row.try_get("failed")?,
        set_ms: row.try_get("set_ms")?,
    })
}
