//! Frozen-copy hints: which worker holds a frozen-in-place copy of which generation.

use ate_core::ActorRef;
use sqlx::Row as _;

use super::StoreImpl;
use super::rows::read_optional;
use crate::util::{to_i64, to_u64};
use crate::{FrozenCopy, Result};

pub(super) async fn set_frozen_copy(
    store: &StoreImpl,
    actor: &ActorRef,
    copy: &FrozenCopy,
) -> Result<()> {
    store.counters.write();
    let _guard = store.write_guard().await;
    sqlx::query(
        "INSERT INTO frozen_copies (atespace, name, worker_id, generation) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (atespace, name) DO UPDATE SET worker_id = excluded.worker_id, \
         generation = excluded.generation",
    )
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(&copy.worker_id)
    .bind(to_i64(copy.generation, "generation")?)
    .execute(&store.pool)
    .await?;
    Ok(())
}

pub(super) async fn get_frozen_copy(
    store: &StoreImpl,
    actor: &ActorRef,
) -> Result<Option<FrozenCopy>> {
    let query = sqlx::query(
        "SELECT worker_id, generation FROM frozen_copies WHERE atespace = $1 AND name = $2",
    )
    .bind(&actor.atespace)
    .bind(&actor.name);
    read_optional(store, query, |row| {
        Ok(FrozenCopy {
            worker_id: row.try_get("worker_id")?,
            generation: to_u64(row.try_get("generation")?, "generation")?,
        })
    })
    .await
}

pub(super) async fn clear_frozen_copy(store: &StoreImpl, actor: &ActorRef) -> Result<()> {
    store.counters.write();
    let _guard = store.write_guard().await;
    sqlx::query("DELETE FROM frozen_copies WHERE atespace = $1 AND name = $2")
        .bind(&actor.atespace)
        .bind(&actor.name)
        .execute(&store.pool)
        .await?;
    Ok(())
}
