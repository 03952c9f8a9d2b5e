//! Column lists and the mapping from rows to records.

use ate_core::TemplateSpec;
use sqlx::Row as _;

use super::{Db, DbRow, StoreImpl};
use crate::util::{
    empty_as_none, from_json, none_as_empty, not_found, parse_durable, parse_fidelity,
    parse_labels, parse_state, parse_template_ref, parse_worker_status, to_i64, to_json, to_u64,
};
use crate::{
    ActorRecord, AtespaceRecord, Capacity, JoinTokenRecord, Result, SnapshotRecord, StoreError,
    TagRecord, TemplateRecord, WorkerRecord,
};

macro_rules! actor_cols {
    () => {
        "atespace, name, uid, template, state, worker_selector, worker_id, epoch, generation, attached_node, \
         last_error, created_ms, updated_ms, activation"
    };
}

macro_rules! snapshot_cols {
    () => {
        "atespace, name, generation, uuid, fidelity, template, sandbox_class, node, boot_id, local_path, \
         durable_uri, durable_status, size_bytes, checksum, reason, created_ms, local_damage, durable_damage, requires"
    };
}

/// What a SELECT from `snapshots` reads: [`snapshot_cols!`] and the row's own `skipped` (which
/// tags' copies do not keep).
macro_rules! snapshot_select_cols {
    () => {
        concat!(snapshot_cols!(), ", skipped")
    };
}

macro_rules! tag_cols {
    () => {
        "atespace, name, created_ms, s_atespace, s_name, s_generation, s_uuid, s_fidelity, s_template, \
         s_sandbox_class, s_node, s_boot_id, s_local_path, s_durable_uri, s_durable_status, s_size_bytes, \
         s_checksum, s_reason, s_created_ms, s_local_damage, s_durable_damage, s_requires"
    };
}

macro_rules! atespace_select {
    () => {
        "SELECT s.name, s.created_ms, s.callers_allow, \
         s.quota_running_actors, s.quota_cpu_millis, s.quota_memory_bytes, \
         (SELECT COUNT(*) FROM actors a WHERE a.atespace = s.name) AS actor_count, \
         (SELECT COUNT(*) FROM actor_assignments u WHERE u.atespace = s.name) AS used_slots, \
         (SELECT CAST(COALESCE(SUM(u.cpu_millis), 0) AS BIGINT) FROM actor_assignments u WHERE u.atespace = s.name) AS used_cpu, \
         (SELECT CAST(COALESCE(SUM(u.memory_bytes), 0) AS BIGINT) FROM actor_assignments u WHERE u.atespace = s.name) AS used_mem \
         FROM atespaces s"
    };
}

macro_rules! worker_select {
    () => {
        "SELECT w.id, w.node, w.addresses, w.identity, w.labels, w.sandbox_class, w.can_restore_memory, \
         w.cpu_millis, w.memory_bytes, w.slots, w.epoch, w.status, w.last_heartbeat_ms, w.node_address, \
         w.boot_id, w.capabilities, w.cpu_physical_millis, w.cpu_usage_millis, CAST(COALESCE(u.cpu, 0) AS BIGINT) AS used_cpu, CAST(COALESCE(u.mem, 0) AS BIGINT) AS used_mem, \
         CAST(COALESCE(u.n, 0) AS BIGINT) AS used_slots \
         FROM workers w LEFT JOIN (SELECT worker_id, SUM(cpu_millis) AS cpu, SUM(memory_bytes) AS mem, \
         COUNT(*) AS n FROM actor_assignments GROUP BY worker_id) u ON u.worker_id = w.id"
    };
}

/// A write query with the 19 [`snapshot_cols!`] of `s` bound next, in that order (the snapshot
/// row itself, or a tag's copy of it).
pub(super) fn bind_snapshot<'q>(query: DbQuery<'q>, s: &SnapshotRecord) -> Result<DbQuery<'q>> {
    Ok(query
        .bind(&s.atespace)
        .bind(&s.name)
        .bind(to_i64(s.generation, "generation")?)
        .bind(&s.uuid)
        .bind(s.fidelity.as_str())
        .bind(s.template.to_string())
        .bind(&s.sandbox_class)
        .bind(&s.node)
        .bind(&s.boot_id)
        .bind(none_as_empty(&s.local_path))
        .bind(none_as_empty(&s.durable_uri))
        .bind(s.durable_status.map(|d| d.as_str()))
        .bind(to_i64(s.size_bytes, "size_bytes")?)
        .bind(&s.checksum)
        .bind(none_as_empty(&s.reason))
        .bind(s.created_ms)
        .bind(none_as_empty(&s.local_damage))
        .bind(none_as_empty(&s.durable_damage))
        .bind(to_json(&s.requires, "requires")?))
}

/// A query on this backend, as `sqlx::query` returns it.
pub(super) type DbQuery<'q> = sqlx::query::Query<'q, Db, <Db as sqlx::Database>::Arguments>;

/// The record of `row`, or NotFound naming the `kind` `id` when there is no row.
pub(super) fn found<T>(
    row: Option<DbRow>,
    from_row: impl FnOnce(&DbRow) -> Result<T>,
    kind: &str,
    id: impl std::fmt::Display,
) -> Result<T> {
    match row {
        Some(row) => from_row(&row),
        None => Err(not_found(kind, &id.to_string())),
    }
}

/// A read (counted as one): every row `query` returns, as `from_row` makes it a record.
pub(super) async fn read_all<T>(
    store: &StoreImpl,
    query: DbQuery<'_>,
    from_row: impl Fn(&DbRow) -> Result<T>,
) -> Result<Vec<T>> {
    store.counters.read();
    let rows = query.fetch_all(&store.pool).await?;
    rows.iter().map(from_row).collect()
}

/// A read (counted as one) of at most one row: its record, None when there is no row.
pub(super) async fn read_optional<T>(
    store: &StoreImpl,
    query: DbQuery<'_>,
    from_row: impl FnOnce(&DbRow) -> Result<T>,
) -> Result<Option<T>> {
    store.counters.read();
    let row = query.fetch_optional(&store.pool).await?;
    row.as_ref().map(from_row).transpose()
}

/// [`read_optional`] of a row that must be there: NotFound naming the `kind` `id` when it is not.
pub(super) async fn read_one<T>(
    store: &StoreImpl,
    query: DbQuery<'_>,
    from_row: impl FnOnce(&DbRow) -> Result<T>,
    kind: &str,
    id: impl std::fmt::Display + Send,
) -> Result<T> {
    let record = read_optional(store, query, from_row).await?;
    record.ok_or_else(|| not_found(kind, &id.to_string()))
}

pub(super) fn atespace_from_row(row: &DbRow) -> Result<AtespaceRecord> {
    Ok(AtespaceRecord {
        name: row.try_get("name")?,
        created_ms: row.try_get("created_ms")?,
        actor_count: to_u64(row.try_get("actor_count")?, "actor_count")?,
        callers_allow: split_callers(&row.try_get::<String, _>("callers_allow")?),
        quota: super::atespaces::quota_of(row)?,
        usage: Capacity {
            slots: to_u64(row.try_get("used_slots")?, "used_slots")?,
            cpu_millis: to_u64(row.try_get("used_cpu")?, "used_cpu")?,
            memory_bytes: to_u64(row.try_get("used_mem")?, "used_mem")?,
        },
    })
}

/// `atespaces.callers_allow` as stored: the entries joined with ',' (atespace names and `*`
/// contain no comma); `''` for none.
pub(super) fn join_callers(allow: &[String]) -> Result<String> {
    if let Some(bad) = allow.iter().find(|e| e.is_empty() || e.contains(',')) {
        return Err(StoreError::Database(format!(
            "callers_allow entry {bad:?} cannot be stored (empty or contains ',')"
        )));
    }
    Ok(allow.join(","))
}

fn split_callers(text: &str) -> Vec<String> {
    if text.is_empty() {
        Vec::new()
    } else {
        text.split(',').map(str::to_string).collect()
    }
}

pub(super) fn template_from_row(row: &DbRow) -> Result<TemplateRecord> {
    let spec: String = row.try_get("spec")?;
    Ok(TemplateRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: from_json::<TemplateSpec>(&spec, "templates.spec")?,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
    })
}

pub(super) fn actor_from_row(row: &DbRow) -> Result<ActorRecord> {
    let state: String = row.try_get("state")?;
    let selector: String = row.try_get("worker_selector")?;
    let template: String = row.try_get("template")?;
    Ok(ActorRecord {
        atespace: row.try_get("atespace")?,
        name: row.try_get("name")?,
        uid: row.try_get("uid")?,
        template: parse_template_ref(&template, "actors.template")?,
        state: parse_state(&state)?,
        worker_selector: parse_labels(&selector, "actors.worker_selector")?,
        worker_id: row.try_get("worker_id")?,
        epoch: to_u64(row.try_get("epoch")?, "actors.epoch")?,
        generation: to_u64(row.try_get("generation")?, "actors.generation")?,
        attached_node: row.try_get("attached_node")?,
        last_error: empty_as_none(row.try_get("last_error")?),
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
        activation: to_u64(row.try_get("activation")?, "actors.activation")?,
    })
}

/// Snapshot columns, optionally prefixed (`s_` in the tags table); a row of `snapshots` itself
/// (no prefix) must have been read with [`snapshot_select_cols!`].
pub(super) fn snapshot_from_row(row: &DbRow, prefix: &str) -> Result<SnapshotRecord> {
    let col = |c: &str| format!("{prefix}{c}");
    let fidelity: String = row.try_get(col("fidelity").as_str())?;
    let durable: Option<String> = row.try_get(col("durable_status").as_str())?;
    let template: String = row.try_get(col("template").as_str())?;
    Ok(SnapshotRecord {
        atespace: row.try_get(col("atespace").as_str())?,
        name: row.try_get(col("name").as_str())?,
        generation: to_u64(row.try_get(col("generation").as_str())?, "generation")?,
        uuid: row.try_get(col("uuid").as_str())?,
        fidelity: parse_fidelity(&fidelity)?,
        template: parse_template_ref(&template, &col("template"))?,
        sandbox_class: row.try_get(col("sandbox_class").as_str())?,
        node: row.try_get(col("node").as_str())?,
        boot_id: row.try_get(col("boot_id").as_str())?,
        local_path: empty_as_none(row.try_get(col("local_path").as_str())?),
        durable_uri: empty_as_none(row.try_get(col("durable_uri").as_str())?),
        durable_status: parse_durable(durable.as_deref())?,
        size_bytes: to_u64(row.try_get(col("size_bytes").as_str())?, "size_bytes")?,
        checksum: row.try_get(col("checksum").as_str())?,
        reason: empty_as_none(row.try_get(col("reason").as_str())?),
        created_ms: row.try_get(col("created_ms").as_str())?,
        local_damage: empty_as_none(row.try_get(col("local_damage").as_str())?),
        durable_damage: empty_as_none(row.try_get(col("durable_damage").as_str())?),
        requires: {
            let requires: String = row.try_get(col("requires").as_str())?;
            from_json::<Vec<String>>(&requires, &col("requires"))?
        },
        // Only the actor's own rows are skipped (a tag's copy has no such column).
        skipped: if prefix.is_empty() {
            row.try_get("skipped")?
        } else {
            false
        },
    })
}

pub(super) fn tag_from_row(row: &DbRow) -> Result<TagRecord> {
    Ok(TagRecord {
        atespace: row.try_get("atespace")?,
        name: row.try_get("name")?,
        snapshot: snapshot_from_row(row, "s_")?,
        created_ms: row.try_get("created_ms")?,
    })
}

pub(super) fn worker_from_row(row: &DbRow) -> Result<WorkerRecord> {
    let addresses: String = row.try_get("addresses")?;
    let labels: String = row.try_get("labels")?;
    let status: String = row.try_get("status")?;
    Ok(WorkerRecord {
        id: row.try_get("id")?,
        node: row.try_get("node")?,
        addresses: from_json::<Vec<String>>(&addresses, "workers.addresses")?,
        identity: row.try_get("identity")?,
        labels: parse_labels(&labels, "workers.labels")?,
        sandbox_class: row.try_get("sandbox_class")?,
        can_restore_memory: row.try_get("can_restore_memory")?,
        capabilities: {
            let caps: String = row.try_get("capabilities")?;
            from_json::<Vec<String>>(&caps, "workers.capabilities")?
        },
        capacity: Capacity {
            cpu_millis: to_u64(row.try_get("cpu_millis")?, "workers.cpu_millis")?,
            memory_bytes: to_u64(row.try_get("memory_bytes")?, "workers.memory_bytes")?,
            slots: to_u64(row.try_get("slots")?, "workers.slots")?,
        },
        used: Capacity {
            cpu_millis: to_u64(row.try_get("used_cpu")?, "used cpu_millis")?,
            memory_bytes: to_u64(row.try_get("used_mem")?, "used memory_bytes")?,
            slots: to_u64(row.try_get("used_slots")?, "used slots")?,
        },
        cpu_physical_millis: to_u64(
            row.try_get("cpu_physical_millis")?,
            "workers.cpu_physical_millis",
        )?,
        cpu_usage_millis: to_u64(row.try_get("cpu_usage_millis")?, "workers.cpu_usage_millis")?,
        epoch: to_u64(row.try_get("epoch")?, "workers.epoch")?,
        status: parse_worker_status(&status)?,
        last_heartbeat_ms: row.try_get("last_heartbeat_ms")?,
        node_address: row.try_get("node_address")?,
        boot_id: row.try_get("boot_id")?,
    })
}

pub(super) fn join_token_from_row(row: &DbRow) -> Result<JoinTokenRecord> {
    let used: String = row.try_get("used_by")?;
    Ok(JoinTokenRecord {
        id: row.try_get("id")?,
        secret_sha256: row.try_get("secret_sha256")?,
        description: row.try_get("description")?,
        created_ms: row.try_get("created_ms")?,
        expires_ms: row.try_get("expires_ms")?,
        used_by: from_json(&used, "used_by")?,
    })
}
