//! Leases: one-statement acquire (insert, take over an expired one, or extend our own) and release.

use super::StoreImpl;
use crate::Result;

/// Releases a lease if `holder` holds it (binds: key, holder).
pub(super) const DELETE_LEASE: &str = "DELETE FROM leases WHERE key = $1 AND holder = $2";

pub(super) async fn try_acquire_lease(
    store: &StoreImpl,
    key: &str,
    holder: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool> {
    store.counters.lease();
    let expires_ms = now_ms.saturating_add(ttl_ms);
    let _writer = store.write_guard().await;
    // One statement: insert, or take over an expired lease, or extend our own.
    let done = sqlx::query(
        "INSERT INTO leases (key, holder, expires_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_ms = excluded.expires_ms \
         WHERE leases.expires_ms <= $4 OR leases.holder = excluded.holder",
    )
    .bind(key)
    .bind(holder)
    .bind(expires_ms)
    .bind(now_ms)
    .execute(&store.pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn release_lease(store: &StoreImpl, key: &str, holder: &str) -> Result<()> {
    store.counters.lease();
    let _writer = store.write_guard().await;
    sqlx::query(DELETE_LEASE)
        .bind(key)
        .bind(holder)
        .execute(&store.pool)
        .await?;
    Ok(())
}
