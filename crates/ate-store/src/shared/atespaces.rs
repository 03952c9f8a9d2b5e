//! Atespaces, and the `FOR SHARE` check that keeps one alive while something is created in it.

use sqlx::Row as _;

use super::rows::{atespace_from_row, found, join_callers, read_all, read_one};
use super::{DbRow, StoreImpl, Tx};
use crate::util::{already_exists, count_of, not_found, to_i64, to_u64, unique_or};
use crate::{AtespaceRecord, Capacity, Result, StoreError};

pub(super) async fn create_atespace(
    store: &StoreImpl,
    name: &str,
    now_ms: i64,
) -> Result<AtespaceRecord> {
    store.counters.write();
    let result = sqlx::query("INSERT INTO atespaces (name, created_ms) VALUES ($1, $2)")
        .bind(name)
        .bind(now_ms)
        .execute(&store.pool)
        .await;
    unique_or(result, || already_exists("atespace", name))?;
    Ok(AtespaceRecord {
        name: name.to_string(),
        created_ms: now_ms,
        actor_count: 0,
        callers_allow: Vec::new(),
        quota: Capacity::default(),
        usage: Capacity::default(),
    })
}

pub(super) async fn get_atespace(store: &StoreImpl, name: &str) -> Result<AtespaceRecord> {
    let query = sqlx::query(concat!(atespace_select!(), " WHERE s.name = $1")).bind(name);
    read_one(store, query, atespace_from_row, "atespace", name).await
}

pub(super) async fn list_atespaces(store: &StoreImpl) -> Result<Vec<AtespaceRecord>> {
    let query = sqlx::query(concat!(atespace_select!(), " ORDER BY s.name"));
    read_all(store, query, atespace_from_row).await
}

pub(super) async fn set_atespace_callers(
    store: &StoreImpl,
    name: &str,
    allow: &[String],
) -> Result<AtespaceRecord> {
    let stored = join_callers(allow)?;
    store.counters.write();
    let done = {
        let _guard = store.write_guard().await;
        sqlx::query("UPDATE atespaces SET callers_allow = $1 WHERE name = $2")
            .bind(&stored)
            .bind(name)
            .execute(&store.pool)
            .await?
    };
    if done.rows_affected() == 0 {
        return Err(not_found("atespace", name));
    }
    let row = sqlx::query(concat!(atespace_select!(), " WHERE s.name = $1"))
        .bind(name)
        .fetch_optional(&store.pool)
        .await?;
    found(row, atespace_from_row, "atespace", name)
}

/// An atespace's quota columns (`$1`: its name).
macro_rules! quota_select {
    () => {
        "SELECT quota_running_actors, quota_cpu_millis, quota_memory_bytes FROM atespaces WHERE name = $1"
    };
}

/// What an atespace's actors other than `$2` hold (names are never empty: `''` leaves none out).
const USAGE_SELECT: &str = "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(cpu_millis), 0) AS BIGINT) AS cpu, \
     CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT) AS mem FROM actor_assignments \
     WHERE atespace = $1 AND name <> $2";

/// A row of [`quota_select!`] as a capacity (0 in a field: no limit). Also the atespace list's.
pub(super) fn quota_of(row: &DbRow) -> Result<Capacity> {
    Ok(Capacity {
        slots: to_u64(row.try_get("quota_running_actors")?, "quota_running_actors")?,
        cpu_millis: to_u64(row.try_get("quota_cpu_millis")?, "quota_cpu_millis")?,
        memory_bytes: to_u64(row.try_get("quota_memory_bytes")?, "quota_memory_bytes")?,
    })
}

fn usage_of(row: &DbRow) -> Result<Capacity> {
    Ok(Capacity {
        slots: to_u64(row.try_get("n")?, "used slots")?,
        cpu_millis: to_u64(row.try_get("cpu")?, "used cpu")?,
        memory_bytes: to_u64(row.try_get("mem")?, "used memory")?,
    })
}

pub(super) async fn atespace_quota(store: &StoreImpl, name: &str) -> Result<(Capacity, Capacity)> {
    store.counters.read();
    let Some(row) = sqlx::query(quota_select!())
        .bind(name)
        .fetch_optional(&store.pool)
        .await?
    else {
        return Err(not_found("atespace", name));
    };
    let quota = quota_of(&row)?;
    if quota == Capacity::default() {
        return Ok((quota, Capacity::default()));
    }
    let used = sqlx::query(USAGE_SELECT)
        .bind(name)
        .bind("")
        .fetch_one(&store.pool)
        .await?;
    Ok((quota, usage_of(&used)?))
}

pub(super) async fn set_atespace_quota(
    store: &StoreImpl,
    name: &str,
    quota: &Capacity,
) -> Result<AtespaceRecord> {
    store.counters.write();
    let done = {
        let _guard = store.write_guard().await;
        sqlx::query(
            "UPDATE atespaces SET quota_running_actors = $1, quota_cpu_millis = $2, \
             quota_memory_bytes = $3 WHERE name = $4",
        )
        .bind(to_i64(quota.slots, "quota.runningActors")?)
        .bind(to_i64(quota.cpu_millis, "quota.cpu")?)
        .bind(to_i64(quota.memory_bytes, "quota.memory")?)
        .bind(name)
        .execute(&store.pool)
        .await?
    };
    if done.rows_affected() == 0 {
        return Err(not_found("atespace", name));
    }
    get_atespace(store, name).await
}

/// Inside a bind: the atespace's assignments other than `actor`'s plus `demand` stay within its
/// quota, else QuotaExceeded. An atespace without a quota costs one read and takes no lock; one
/// with a quota is locked (PostgreSQL) so concurrent binds in it are counted one after another.
pub(super) async fn check_quota(
    tx: &mut Tx,
    actor: &ate_core::ActorRef,
    demand: &Capacity,
) -> Result<()> {
    let Some(row) = sqlx::query(quota_select!())
        .bind(&actor.atespace)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Err(not_found("atespace", &actor.atespace));
    };
    if quota_of(&row)? == Capacity::default() {
        return Ok(());
    }
    let row = sqlx::query(concat!(quota_select!(), for_update!()))
        .bind(&actor.atespace)
        .fetch_one(&mut **tx)
        .await?;
    let quota = quota_of(&row)?;
    let used = sqlx::query(USAGE_SELECT)
        .bind(&actor.atespace)
        .bind(&actor.name)
        .fetch_one(&mut **tx)
        .await?;
    let used = usage_of(&used)?;
    match crate::over_quota(&quota, &used, demand) {
        None => Ok(()),
        Some((quota, limit, used)) => Err(StoreError::QuotaExceeded {
            atespace: actor.atespace.clone(),
            quota,
            limit,
            used,
        }),
    }
}

pub(super) async fn delete_atespace(store: &StoreImpl, name: &str) -> Result<()> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(concat!(
        "SELECT name FROM atespaces WHERE name = $1",
        for_update!()
    ))
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    if row.is_none() {
        return Err(not_found("atespace", name));
    }
    let counts = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM actors WHERE atespace = $1) AS actors, \
         (SELECT COUNT(*) FROM templates WHERE namespace = $1) AS templates, \
         (SELECT COUNT(*) FROM tags WHERE atespace = $1) AS tags",
    )
    .bind(name)
    .fetch_one(&mut *tx)
    .await?;
    let mut held = Vec::new();
    for (column, noun) in [
        ("actors", "actor"),
        ("templates", "template"),
        ("tags", "tag"),
    ] {
        let n: i64 = counts.try_get(column)?;
        if n > 0 {
            held.push(count_of(n, noun));
        }
    }
    if !held.is_empty() {
        return Err(StoreError::FailedPrecondition(format!(
            "atespace \"{name}\" still holds {}",
            held.join(", ")
        )));
    }
    sqlx::query("DELETE FROM atespaces WHERE name = $1")
        .bind(name)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Checks that the atespace exists and keeps it from being deleted until commit (Postgres).
pub(super) async fn share_atespace(tx: &mut Tx, name: &str) -> Result<()> {
    let row = sqlx::query(concat!(
        "SELECT name FROM atespaces WHERE name = $1",
        for_share!()
    ))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(not_found("atespace", name)),
    }
}
