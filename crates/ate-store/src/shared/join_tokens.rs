//! Join tokens (only a hash of the secret is stored).

use sqlx::Row as _;

use super::StoreImpl;
use super::rows::{join_token_from_row, read_all, read_one};
use crate::util::{already_exists, from_json, not_found, to_json, unique_or};
use crate::{JoinTokenRecord, Result};

pub(super) async fn create_join_token(store: &StoreImpl, token: &JoinTokenRecord) -> Result<()> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    // Expired tokens stay listed for a day (so an operator sees why a join failed), then go.
    sqlx::query("DELETE FROM join_tokens WHERE expires_ms < $1")
        .bind(token.created_ms - 24 * 3600 * 1000)
        .execute(&mut *tx)
        .await?;
    let inserted = sqlx::query(
        "INSERT INTO join_tokens (id, secret_sha256, description, created_ms, expires_ms, used_by) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&token.id)
    .bind(&token.secret_sha256)
    .bind(&token.description)
    .bind(token.created_ms)
    .bind(token.expires_ms)
    .bind(to_json(&token.used_by, "used_by")?)
    .execute(&mut *tx)
    .await;
    unique_or(inserted, || already_exists("join token", &token.id))?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn get_join_token(store: &StoreImpl, id: &str) -> Result<JoinTokenRecord> {
    let query = sqlx::query(
        "SELECT id, secret_sha256, description, created_ms, expires_ms, used_by \
         FROM join_tokens WHERE id = $1",
    )
    .bind(id);
    read_one(store, query, join_token_from_row, "join token", id).await
}

pub(super) async fn list_join_tokens(store: &StoreImpl) -> Result<Vec<JoinTokenRecord>> {
    let query = sqlx::query(
        "SELECT id, secret_sha256, description, created_ms, expires_ms, used_by \
         FROM join_tokens ORDER BY created_ms, id",
    );
    read_all(store, query, join_token_from_row).await
}

pub(super) async fn delete_join_token(store: &StoreImpl, id: &str) -> Result<bool> {
    store.counters.write();
    let _guard = store.write_guard().await;
    let done = sqlx::query("DELETE FROM join_tokens WHERE id = $1")
        .bind(id)
        .execute(&store.pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn record_join_token_use(store: &StoreImpl, id: &str, node: &str) -> Result<()> {
    store.counters.write();
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(concat!(
        "SELECT used_by FROM join_tokens WHERE id = $1",
        for_update!()
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Err(not_found("join token", id));
    };
    let text: String = row.try_get("used_by")?;
    let mut used: Vec<String> = from_json(&text, "used_by")?;
    if used.last().map(String::as_str) != Some(node) {
        used.retain(|n| n != node);
        used.push(node.to_string());
        let excess = used.len().saturating_sub(100);
        used.drain(..excess);
        sqlx::query("UPDATE join_tokens SET used_by = $2 WHERE id = $1")
            .bind(id)
            .bind(to_json(&used, "used_by")?)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
