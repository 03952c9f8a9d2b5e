//! Atespaces, and the `FOR SHARE` check that keeps one alive while something is created in it.

use sqlx::Row as _;

use super::rows::{atespace_from_row, found, join_callers};
use super::{StoreImpl, Tx};
use crate::util::{already_exists, count_of, not_found, unique_or};
use crate::{AtespaceRecord, Result, StoreError};

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
    })
}

pub(super) async fn get_atespace(store: &StoreImpl, name: &str) -> Result<AtespaceRecord> {
    store.counters.read();
    let row = sqlx::query(concat!(atespace_select!(), " WHERE s.name = $1"))
        .bind(name)
        .fetch_optional(&store.pool)
        .await?;
    found(row, atespace_from_row, "atespace", name)
}

pub(super) async fn list_atespaces(store: &StoreImpl) -> Result<Vec<AtespaceRecord>> {
    store.counters.read();
    let rows = sqlx::query(concat!(atespace_select!(), " ORDER BY s.name"))
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(atespace_from_row).collect()
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
