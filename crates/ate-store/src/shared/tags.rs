//! Tags: named copies of a snapshot row.

use super::StoreImpl;
use super::atespaces::share_atespace;
use super::rows::{bind_snapshot, read_all, read_optional, tag_from_row};
use crate::util::{already_exists, not_found, unique_or};
use crate::{Result, TagRecord};

pub(super) async fn create_tag(store: &StoreImpl, tag: &TagRecord) -> Result<TagRecord> {
    store.counters.write();
    let s = &tag.snapshot;
    let mut tx = store.begin_write().await?;
    share_atespace(&mut tx, &tag.atespace).await?;
    let insert = sqlx::query(concat!(
        "INSERT INTO tags (",
        tag_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22) \
         RETURNING ",
        tag_cols!()
    ))
    .bind(&tag.atespace)
    .bind(&tag.name)
    .bind(tag.created_ms);
    // The tag's own columns, then the copy of the snapshot row.
    let inserted = bind_snapshot(insert, s)?.fetch_one(&mut *tx).await;
    let row = unique_or(inserted, || {
        already_exists("tag", &format!("{}/{}", tag.atespace, tag.name))
    })?;
    let record = tag_from_row(&row)?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn get_tag(store: &StoreImpl, atespace: &str, name: &str) -> Result<TagRecord> {
    let query = sqlx::query(concat!(
        "SELECT ",
        tag_cols!(),
        " FROM tags WHERE atespace = $1 AND name = $2"
    ))
    .bind(atespace)
    .bind(name);
    let tag = read_optional(store, query, tag_from_row).await?;
    tag.ok_or_else(|| not_found("tag", &format!("{atespace}/{name}")))
}

pub(super) async fn list_tags(store: &StoreImpl, atespace: Option<&str>) -> Result<Vec<TagRecord>> {
    let query = sqlx::query(concat!(
        "SELECT ",
        tag_cols!(),
        " FROM tags WHERE ($1 IS NULL OR atespace = $1) ORDER BY atespace, name"
    ))
    .bind(atespace);
    read_all(store, query, tag_from_row).await
}

pub(super) async fn delete_tag(store: &StoreImpl, atespace: &str, name: &str) -> Result<()> {
    store.counters.write();
    let done = sqlx::query("DELETE FROM tags WHERE atespace = $1 AND name = $2")
        .bind(atespace)
        .bind(name)
        .execute(&store.pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(not_found("tag", &format!("{atespace}/{name}")));
    }
    Ok(())
}
