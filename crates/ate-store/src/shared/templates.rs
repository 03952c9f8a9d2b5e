//! Templates: apply (insert or replace), read, list, and delete while unused.

use ate_core::TemplateSpec;
use sqlx::Row as _;

use super::StoreImpl;
use super::atespaces::share_atespace;
use super::rows::{read_all, read_optional, template_from_row};
use crate::util::{count_of, not_found, to_json};
use crate::{Result, StoreError, TemplateRecord};

pub(super) async fn apply_template(
    store: &StoreImpl,
    namespace: &str,
    name: &str,
    spec: &TemplateSpec,
    now_ms: i64,
) -> Result<TemplateRecord> {
    store.counters.write();
    let spec_json = to_json(spec, "template spec")?;
    let mut tx = store.begin_write().await?;
    share_atespace(&mut tx, namespace).await?;
    let row = sqlx::query(
        "INSERT INTO templates (namespace, name, spec, created_ms, updated_ms) VALUES ($1, $2, $3, $4, $4) \
         ON CONFLICT (namespace, name) DO UPDATE SET spec = excluded.spec, updated_ms = excluded.updated_ms \
         RETURNING namespace, name, spec, created_ms, updated_ms",
    )
    .bind(namespace)
    .bind(name)
    .bind(spec_json)
    .bind(now_ms)
    .fetch_one(&mut *tx)
    .await?;
    let record = template_from_row(&row)?;
    tx.commit().await?;
    Ok(record)
}

pub(super) async fn get_template(
    store: &StoreImpl,
    namespace: &str,
    name: &str,
) -> Result<TemplateRecord> {
    let query = sqlx::query(
        "SELECT namespace, name, spec, created_ms, updated_ms FROM templates WHERE namespace = $1 AND name = $2",
    )
    .bind(namespace)
    .bind(name);
    let template = read_optional(store, query, template_from_row).await?;
    template.ok_or_else(|| not_found("template", &format!("{namespace}/{name}")))
}

pub(super) async fn list_templates(
    store: &StoreImpl,
    namespace: Option<&str>,
) -> Result<Vec<TemplateRecord>> {
    let query = sqlx::query(
        "SELECT namespace, name, spec, created_ms, updated_ms FROM templates \
         WHERE ($1 IS NULL OR namespace = $1) ORDER BY namespace, name",
    )
    .bind(namespace);
    read_all(store, query, template_from_row).await
}

pub(super) async fn delete_template(store: &StoreImpl, namespace: &str, name: &str) -> Result<()> {
    store.counters.write();
    let reference = format!("{namespace}/{name}");
    let mut tx = store.begin_write().await?;
    let row = sqlx::query(concat!(
        "SELECT name FROM templates WHERE namespace = $1 AND name = $2",
        for_update!()
    ))
    .bind(namespace)
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    if row.is_none() {
        return Err(not_found("template", &reference));
    }
    let users: i64 = sqlx::query("SELECT COUNT(*) AS n FROM actors WHERE template = $1")
        .bind(&reference)
        .fetch_one(&mut *tx)
        .await?
        .try_get("n")?;
    if users > 0 {
        return Err(StoreError::FailedPrecondition(format!(
            "template \"{reference}\" is used by {}",
            count_of(users, "actor")
        )));
    }
    sqlx::query("DELETE FROM templates WHERE namespace = $1 AND name = $2")
        .bind(namespace)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
