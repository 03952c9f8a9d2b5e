// The `Store` implementation shared by both backends. This file is `include!`d by `sqlite.rs` and
// `postgres.rs`, which define before the include:
//
// - `Db` (the sqlx database), `DbRow` (its row type), `Tx` (`Transaction<'static, Db>`), `StoreImpl`
//   (the store struct, with fields `pool` and `counters`, an inherent `begin_write()` that opens
//   a transaction serialized against other writers: `BEGIN IMMEDIATE` behind an in-process writer
//   lock on SQLite — and `write_guard()`, that lock for one-statement writes, a no-op on
//   PostgreSQL);
// - macros `for_update!()` / `for_share!()` expanding to the row-lock suffix of a SELECT (empty on
//   SQLite, where `BEGIN IMMEDIATE` already serializes writers).
//
// SQL text uses `$N` placeholders, which both backends accept.

use std::collections::BTreeMap;

use ate_core::{ActorState, DurableStatus, TemplateSpec};
use sqlx::Row as _;

use crate::util::{
    actor_lease_key, admits, already_exists, check_state, count_of, from_json, is_unique_violation,
    not_found, parse_durable, parse_fidelity, parse_labels, parse_state, parse_worker_status,
    snapshot_not_found, split_template, to_i64, to_json, to_u64,
};
use crate::{
    ActorRecord, ActorUpdate, AtespaceRecord, Capacity, FrozenCopy, JoinTokenRecord, Result, SnapshotRecord, Store,
    StoreCounters, StoreError, TagRecord, TemplateRecord, WorkerRecord, WorkerStatus, async_trait,
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
         durable_uri, durable_status, size_bytes, checksum, reason, created_ms"
    };
}

macro_rules! tag_cols {
    () => {
        "atespace, name, created_ms, s_atespace, s_name, s_generation, s_uuid, s_fidelity, s_template, \
         s_sandbox_class, s_node, s_boot_id, s_local_path, s_durable_uri, s_durable_status, s_size_bytes, \
         s_checksum, s_reason, s_created_ms"
    };
}

macro_rules! atespace_select {
    () => {
        "SELECT s.name, s.created_ms, (SELECT COUNT(*) FROM actors a WHERE a.atespace = s.name) AS actor_count \
         FROM atespaces s"
    };
}

macro_rules! worker_select {
    () => {
        "SELECT w.id, w.node, w.addresses, w.identity, w.labels, w.sandbox_class, w.can_restore_memory, \
         w.cpu_millis, w.memory_bytes, w.slots, w.epoch, w.status, w.last_heartbeat_ms, w.node_address, \
         w.boot_id, CAST(COALESCE(u.cpu, 0) AS BIGINT) AS used_cpu, CAST(COALESCE(u.mem, 0) AS BIGINT) AS used_mem, \
         CAST(COALESCE(u.n, 0) AS BIGINT) AS used_slots \
         FROM workers w LEFT JOIN (SELECT worker_id, SUM(cpu_millis) AS cpu, SUM(memory_bytes) AS mem, \
         COUNT(*) AS n FROM actor_assignments GROUP BY worker_id) u ON u.worker_id = w.id"
    };
}

// ---------------------------------------------------------------- row mapping

fn atespace_from_row(row: &DbRow) -> Result<AtespaceRecord> {
    Ok(AtespaceRecord {
        name: row.try_get("name")?,
        created_ms: row.try_get("created_ms")?,
        actor_count: to_u64(row.try_get("actor_count")?, "actor_count")?,
    })
}

fn template_from_row(row: &DbRow) -> Result<TemplateRecord> {
    let spec: String = row.try_get("spec")?;
    Ok(TemplateRecord {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        spec: from_json::<TemplateSpec>(&spec, "templates.spec")?,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
    })
}

fn actor_from_row(row: &DbRow) -> Result<ActorRecord> {
    let state: String = row.try_get("state")?;
    let selector: String = row.try_get("worker_selector")?;
    Ok(ActorRecord {
        atespace: row.try_get("atespace")?,
        name: row.try_get("name")?,
        uid: row.try_get("uid")?,
        template: row.try_get("template")?,
        state: parse_state(&state)?,
        worker_selector: parse_labels(&selector, "actors.worker_selector")?,
        worker_id: row.try_get("worker_id")?,
        epoch: to_u64(row.try_get("epoch")?, "actors.epoch")?,
        generation: to_u64(row.try_get("generation")?, "actors.generation")?,
        attached_node: row.try_get("attached_node")?,
        last_error: row.try_get("last_error")?,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
        activation: to_u64(row.try_get("activation")?, "actors.activation")?,
    })
}

/// Snapshot columns, optionally prefixed (`s_` in the tags table).
fn snapshot_from_row(row: &DbRow, prefix: &str) -> Result<SnapshotRecord> {
    let col = |c: &str| format!("{prefix}{c}");
    let fidelity: String = row.try_get(col("fidelity").as_str())?;
    let durable: Option<String> = row.try_get(col("durable_status").as_str())?;
    Ok(SnapshotRecord {
        atespace: row.try_get(col("atespace").as_str())?,
        name: row.try_get(col("name").as_str())?,
        generation: to_u64(row.try_get(col("generation").as_str())?, "generation")?,
        uuid: row.try_get(col("uuid").as_str())?,
        fidelity: parse_fidelity(&fidelity)?,
        template: row.try_get(col("template").as_str())?,
        sandbox_class: row.try_get(col("sandbox_class").as_str())?,
        node: row.try_get(col("node").as_str())?,
        boot_id: row.try_get(col("boot_id").as_str())?,
        local_path: row.try_get(col("local_path").as_str())?,
        durable_uri: row.try_get(col("durable_uri").as_str())?,
        durable_status: parse_durable(durable.as_deref())?,
        size_bytes: to_u64(row.try_get(col("size_bytes").as_str())?, "size_bytes")?,
        checksum: row.try_get(col("checksum").as_str())?,
        reason: row.try_get(col("reason").as_str())?,
        created_ms: row.try_get(col("created_ms").as_str())?,
    })
}

fn tag_from_row(row: &DbRow) -> Result<TagRecord> {
    Ok(TagRecord {
        atespace: row.try_get("atespace")?,
        name: row.try_get("name")?,
        snapshot: snapshot_from_row(row, "s_")?,
        created_ms: row.try_get("created_ms")?,
    })
}

fn worker_from_row(row: &DbRow) -> Result<WorkerRecord> {
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
        epoch: to_u64(row.try_get("epoch")?, "workers.epoch")?,
        status: parse_worker_status(&status)?,
        last_heartbeat_ms: row.try_get("last_heartbeat_ms")?,
        node_address: row.try_get("node_address")?,
        boot_id: row.try_get("boot_id")?,
    })
}

// ---------------------------------------------------------------- statements used inside transactions

/// The actor row, locked for update (Postgres). NotFound if missing.
async fn lock_actor(tx: &mut Tx, atespace: &str, name: &str) -> Result<ActorRecord> {
    let row = sqlx::query(concat!(
        "SELECT ",
        actor_cols!(),
        " FROM actors WHERE atespace = $1 AND name = $2",
        for_update!()
    ))
    .bind(atespace)
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    match row {
        Some(row) => actor_from_row(&row),
        None => Err(not_found("actor", &format!("{atespace}/{name}"))),
    }
}

/// Releases a lease if `holder` holds it (binds: key, holder).
const DELETE_LEASE: &str = "DELETE FROM leases WHERE key = $1 AND holder = $2";

/// The compare-and-set state change of [`Store::transition`], inside `tx`.
async fn transition_in(
    tx: &mut Tx,
    atespace: &str,
    name: &str,
    from: &[ActorState],
    to: ActorState,
    update: ActorUpdate,
    now_ms: i64,
) -> Result<ActorRecord> {
    let mut actor = lock_actor(tx, atespace, name).await?;
    check_state(actor.state, from)?;
    actor.state = to;
    apply_update(&mut actor, update, now_ms);
    write_actor(tx, &actor).await
}

/// Writes every mutable field of the actor and returns the stored row.
async fn write_actor(tx: &mut Tx, actor: &ActorRecord) -> Result<ActorRecord> {
    let row = sqlx::query(concat!(
        "UPDATE actors SET state = $3, worker_selector = $4, worker_id = $5, epoch = $6, generation = $7, \
         attached_node = $8, last_error = $9, updated_ms = $10, activation = $11 WHERE atespace = $1 AND name = $2 RETURNING ",
        actor_cols!()
    ))
    .bind(&actor.atespace)
    .bind(&actor.name)
    .bind(actor.state.as_str())
    .bind(to_json(&actor.worker_selector, "worker_selector")?)
    .bind(actor.worker_id.as_deref())
    .bind(to_i64(actor.epoch, "epoch")?)
    .bind(to_i64(actor.generation, "generation")?)
    .bind(actor.attached_node.as_deref())
    .bind(&actor.last_error)
    .bind(actor.updated_ms)
    .bind(to_i64(actor.activation, "activation")?)
    .fetch_optional(&mut **tx)
    .await?;
    match row {
        Some(row) => actor_from_row(&row),
        None => Err(not_found(
            "actor",
            &format!("{}/{}", actor.atespace, actor.name),
        )),
    }
}

/// Capacity admission inside a bind's transaction: the worker exists (NotFound) and is ACTIVE,
/// and its assignments minus this actor's plus `demand` fit (else NoRoom); then the actor's
/// assignment is set to this worker. Returns the worker's registered epoch.
async fn admit(
    tx: &mut Tx,
    atespace: &str,
    name: &str,
    worker_id: &str,
    demand: Capacity,
) -> Result<u64> {
    let demand_cpu = to_i64(demand.cpu_millis, "cpu_millis")?;
    let demand_memory = to_i64(demand.memory_bytes, "memory_bytes")?;
    // The worker row lock serializes every admission onto this worker (Postgres; SQLite's
    // BEGIN IMMEDIATE serializes all writers).
    let worker = sqlx::query(concat!(
        "SELECT status, epoch, cpu_millis, memory_bytes, slots FROM workers WHERE id = $1",
        for_update!()
    ))
    .bind(worker_id)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(|| not_found("worker", worker_id))?;
    let status: String = worker.try_get("status")?;
    if parse_worker_status(&status)? != WorkerStatus::Active {
        return Err(StoreError::NoRoom {
            worker_id: worker_id.to_string(),
        });
    }
    let capacity = Capacity {
        cpu_millis: to_u64(worker.try_get("cpu_millis")?, "workers.cpu_millis")?,
        memory_bytes: to_u64(worker.try_get("memory_bytes")?, "workers.memory_bytes")?,
        slots: to_u64(worker.try_get("slots")?, "workers.slots")?,
    };
    let epoch = to_u64(worker.try_get("epoch")?, "workers.epoch")?;
    let used = sqlx::query(
        "SELECT CAST(COALESCE(SUM(cpu_millis), 0) AS BIGINT) AS cpu, \
         CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT) AS mem, COUNT(*) AS n \
         FROM actor_assignments WHERE worker_id = $1 AND NOT (atespace = $2 AND name = $3)",
    )
    .bind(worker_id)
    .bind(atespace)
    .bind(name)
    .fetch_one(&mut **tx)
    .await?;
    let used = Capacity {
        cpu_millis: to_u64(used.try_get("cpu")?, "used cpu_millis")?,
        memory_bytes: to_u64(used.try_get("mem")?, "used memory_bytes")?,
        slots: to_u64(used.try_get("n")?, "used slots")?,
    };
    if !admits(&capacity, &used, &demand) {
        return Err(StoreError::NoRoom {
            worker_id: worker_id.to_string(),
        });
    }
    sqlx::query(
        "INSERT INTO actor_assignments (atespace, name, worker_id, cpu_millis, memory_bytes) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (atespace, name) DO UPDATE SET \
         worker_id = excluded.worker_id, cpu_millis = excluded.cpu_millis, memory_bytes = excluded.memory_bytes",
    )
    .bind(atespace)
    .bind(name)
    .bind(worker_id)
    .bind(demand_cpu)
    .bind(demand_memory)
    .execute(&mut **tx)
    .await?;
    Ok(epoch)
}

/// Checks that the atespace exists and keeps it from being deleted until commit (Postgres).
async fn share_atespace(tx: &mut Tx, name: &str) -> Result<()> {
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

fn apply_update(actor: &mut ActorRecord, update: ActorUpdate, now_ms: i64) {
    if let Some(error) = update.last_error {
        actor.last_error = error;
    }
    if let Some(epoch) = update.epoch {
        actor.epoch = epoch;
    }
    if update.clear_attached_node {
        actor.attached_node = None;
    }
    actor.updated_ms = now_ms;
}

// ---------------------------------------------------------------- the trait

#[async_trait]
impl Store for StoreImpl {
    // ---- atespaces

    async fn create_atespace(&self, name: &str, now_ms: i64) -> Result<AtespaceRecord> {
        self.counters.write();
        let result = sqlx::query("INSERT INTO atespaces (name, created_ms) VALUES ($1, $2)")
            .bind(name)
            .bind(now_ms)
            .execute(&self.pool)
            .await;
        match result {
            Ok(_) => Ok(AtespaceRecord {
                name: name.to_string(),
                created_ms: now_ms,
                actor_count: 0,
            }),
            Err(e) if is_unique_violation(&e) => Err(already_exists("atespace", name)),
            Err(e) => Err(e.into()),
        }
    }

    async fn get_atespace(&self, name: &str) -> Result<AtespaceRecord> {
        self.counters.read();
        let row = sqlx::query(concat!(atespace_select!(), " WHERE s.name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => atespace_from_row(&row),
            None => Err(not_found("atespace", name)),
        }
    }

    async fn list_atespaces(&self) -> Result<Vec<AtespaceRecord>> {
        self.counters.read();
        let rows = sqlx::query(concat!(atespace_select!(), " ORDER BY s.name"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(atespace_from_row).collect()
    }

    async fn delete_atespace(&self, name: &str) -> Result<()> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
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

    // ---- templates

    async fn apply_template(
        &self,
        namespace: &str,
        name: &str,
        spec: &TemplateSpec,
        now_ms: i64,
    ) -> Result<TemplateRecord> {
        self.counters.write();
        let spec_json = to_json(spec, "template spec")?;
        let mut tx = self.begin_write().await?;
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

    async fn get_template(&self, namespace: &str, name: &str) -> Result<TemplateRecord> {
        self.counters.read();
        let row = sqlx::query(
            "SELECT namespace, name, spec, created_ms, updated_ms FROM templates WHERE namespace = $1 AND name = $2",
        )
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => template_from_row(&row),
            None => Err(not_found("template", &format!("{namespace}/{name}"))),
        }
    }

    async fn list_templates(&self, namespace: Option<&str>) -> Result<Vec<TemplateRecord>> {
        self.counters.read();
        let rows = sqlx::query(
            "SELECT namespace, name, spec, created_ms, updated_ms FROM templates \
             WHERE ($1 IS NULL OR namespace = $1) ORDER BY namespace, name",
        )
        .bind(namespace)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(template_from_row).collect()
    }

    async fn delete_template(&self, namespace: &str, name: &str) -> Result<()> {
        self.counters.write();
        let reference = format!("{namespace}/{name}");
        let mut tx = self.begin_write().await?;
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

    // ---- actors

    async fn create_actor(&self, actor: &ActorRecord) -> Result<ActorRecord> {
        self.counters.write();
        let selector = to_json(&actor.worker_selector, "worker_selector")?;
        let epoch = to_i64(actor.epoch, "epoch")?;
        let generation = to_i64(actor.generation, "generation")?;
        let mut tx = self.begin_write().await?;
        share_atespace(&mut tx, &actor.atespace).await?;
        let Some((template_ns, template_name)) = split_template(&actor.template) else {
            return Err(not_found("template", &actor.template));
        };
        let template = sqlx::query(concat!(
            "SELECT name FROM templates WHERE namespace = $1 AND name = $2",
            for_share!()
        ))
        .bind(template_ns)
        .bind(template_name)
        .fetch_optional(&mut *tx)
        .await?;
        if template.is_none() {
            return Err(not_found("template", &actor.template));
        }
        let inserted = sqlx::query(concat!(
            "INSERT INTO actors (",
            actor_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING ",
            actor_cols!()
        ))
        .bind(&actor.atespace)
        .bind(&actor.name)
        .bind(&actor.uid)
        .bind(&actor.template)
        .bind(actor.state.as_str())
        .bind(selector)
        .bind(actor.worker_id.as_deref())
        .bind(epoch)
        .bind(generation)
        .bind(actor.attached_node.as_deref())
        .bind(&actor.last_error)
        .bind(actor.created_ms)
        .bind(actor.updated_ms)
        .bind(to_i64(actor.activation, "activation")?)
        .fetch_one(&mut *tx)
        .await;
        let row = match inserted {
            Ok(row) => row,
            Err(e) if is_unique_violation(&e) => {
                return Err(already_exists(
                    "actor",
                    &format!("{}/{}", actor.atespace, actor.name),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let record = actor_from_row(&row)?;
        tx.commit().await?;
        Ok(record)
    }

    async fn get_actor(&self, atespace: &str, name: &str) -> Result<ActorRecord> {
        self.counters.read();
        let row = sqlx::query(concat!(
            "SELECT ",
            actor_cols!(),
            " FROM actors WHERE atespace = $1 AND name = $2"
        ))
        .bind(atespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => actor_from_row(&row),
            None => Err(not_found("actor", &format!("{atespace}/{name}"))),
        }
    }

    async fn list_actors(
        &self,
        atespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<ActorRecord>> {
        self.counters.read();
        // Names are never empty, so ("", "") sorts before every actor.
        let (after_space, after_name) = after.unwrap_or(("", ""));
        let rows = sqlx::query(concat!(
            "SELECT ",
            actor_cols!(),
            " FROM actors WHERE ($1 IS NULL OR atespace = $1) AND (atespace > $2 OR (atespace = $2 AND name > $3)) \
             ORDER BY atespace, name LIMIT $4"
        ))
        .bind(atespace)
        .bind(after_space)
        .bind(after_name)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(actor_from_row).collect()
    }

    async fn update_actor_selector(
        &self,
        atespace: &str,
        name: &str,
        selector: &BTreeMap<String, String>,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        self.counters.write();
        let row = sqlx::query(concat!(
            "UPDATE actors SET worker_selector = $3, updated_ms = $4 WHERE atespace = $1 AND name = $2 RETURNING ",
            actor_cols!()
        ))
        .bind(atespace)
        .bind(name)
        .bind(to_json(selector, "worker_selector")?)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => actor_from_row(&row),
            None => Err(not_found("actor", &format!("{atespace}/{name}"))),
        }
    }

    async fn delete_actor(&self, atespace: &str, name: &str) -> Result<Vec<SnapshotRecord>> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let actor = lock_actor(&mut tx, atespace, name).await?;
        check_state(actor.state, &[ActorState::Suspended, ActorState::Crashed])?;
        let rows = sqlx::query(concat!(
            "SELECT ",
            snapshot_cols!(),
            " FROM snapshots s WHERE atespace = $1 AND name = $2 \
             AND NOT EXISTS (SELECT 1 FROM tags t WHERE t.s_uuid = s.uuid) ORDER BY generation DESC"
        ))
        .bind(atespace)
        .bind(name)
        .fetch_all(&mut *tx)
        .await?;
        let unreferenced = rows
            .iter()
            .map(|r| snapshot_from_row(r, ""))
            .collect::<Result<Vec<_>>>()?;
        sqlx::query("DELETE FROM snapshots WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM actor_assignments WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM leases WHERE key = $1")
            .bind(actor_lease_key(atespace, name))
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM frozen_copies WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM actors WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(unreferenced)
    }

    async fn transition(
        &self,
        atespace: &str,
        name: &str,
        from: &[ActorState],
        to: ActorState,
        update: ActorUpdate,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let record = transition_in(&mut tx, atespace, name, from, to, update, now_ms).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn transition_releasing_lease(
        &self,
        atespace: &str,
        name: &str,
        from: &[ActorState],
        to: ActorState,
        update: ActorUpdate,
        now_ms: i64,
        lease_key: &str,
        lease_holder: &str,
    ) -> Result<ActorRecord> {
        self.counters.write();
        self.counters.lease();
        let mut tx = self.begin_write().await?;
        let record = transition_in(&mut tx, atespace, name, from, to, update, now_ms).await?;
        sqlx::query(DELETE_LEASE)
            .bind(lease_key)
            .bind(lease_holder)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn bind_actor(
        &self,
        atespace: &str,
        name: &str,
        from: &[ActorState],
        worker_id: &str,
        demand: Capacity,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let mut actor = lock_actor(&mut tx, atespace, name).await?;
        // Already bound here (a retried bind): the same call succeeds again.
        let rebind =
            actor.state == ActorState::Resuming && actor.worker_id.as_deref() == Some(worker_id);
        if !rebind {
            check_state(actor.state, from)?;
        }
        let epoch = admit(&mut tx, atespace, name, worker_id, demand).await?;
        // A new activation gets a new fencing token; a retried bind keeps the one it took, so a
        // sandbox its first attempt started is the same activation.
        if !rebind {
            actor.activation = actor.activation.checked_add(1).ok_or_else(|| {
                StoreError::Database(format!("actor {atespace}/{name}: activation overflow"))
            })?;
        }
        actor.state = ActorState::Resuming;
        actor.worker_id = Some(worker_id.to_string());
        actor.epoch = epoch;
        actor.updated_ms = now_ms;
        let record = write_actor(&mut tx, &actor).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn readopt_actor(
        &self,
        atespace: &str,
        name: &str,
        worker_id: &str,
        activation: u64,
        demand: Capacity,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let mut actor = lock_actor(&mut tx, atespace, name).await?;
        check_state(actor.state, &[ActorState::Suspended])?;
        if actor.activation != activation {
            return Err(StoreError::FailedPrecondition(format!(
                "actor {atespace}/{name} is at activation {}, not {activation}",
                actor.activation
            )));
        }
        let epoch = admit(&mut tx, atespace, name, worker_id, demand).await?;
        actor.state = ActorState::Running;
        actor.worker_id = Some(worker_id.to_string());
        actor.epoch = epoch;
        actor.last_error = String::new();
        actor.updated_ms = now_ms;
        let record = write_actor(&mut tx, &actor).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn release_actor(
        &self,
        atespace: &str,
        name: &str,
        from: &[ActorState],
        to: ActorState,
        snapshot: Option<&SnapshotRecord>,
        update: ActorUpdate,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let mut actor = lock_actor(&mut tx, atespace, name).await?;
        check_state(actor.state, from)?;
        apply_update(&mut actor, update, now_ms);
        if let Some(snapshot) = snapshot {
            if snapshot.atespace != atespace || snapshot.name != name {
                return Err(StoreError::FailedPrecondition(format!(
                    "snapshot of actor \"{}/{}\" cannot be recorded for actor \"{atespace}/{name}\"",
                    snapshot.atespace, snapshot.name
                )));
            }
            insert_snapshot(&mut tx, snapshot).await?;
            // The newest generation now lives on the node that wrote it.
            actor.generation = snapshot.generation;
            actor.attached_node = Some(snapshot.node.clone()).filter(|node| !node.is_empty());
        }
        sqlx::query("DELETE FROM actor_assignments WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        actor.state = to;
        actor.worker_id = None;
        let record = write_actor(&mut tx, &actor).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn actors_on_worker(&self, worker_id: &str) -> Result<Vec<ActorRecord>> {
        self.counters.read();
        let rows = sqlx::query(concat!(
            "SELECT ",
            actor_cols!(),
            " FROM actors WHERE worker_id = $1 ORDER BY atespace, name"
        ))
        .bind(worker_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(actor_from_row).collect()
    }

    // ---- snapshots

    async fn list_snapshots(&self, atespace: &str, name: &str) -> Result<Vec<SnapshotRecord>> {
        self.counters.read();
        let rows = sqlx::query(concat!(
            "SELECT ",
            snapshot_cols!(),
            " FROM snapshots WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
        ))
        .bind(atespace)
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| snapshot_from_row(r, "")).collect()
    }

    async fn prune_snapshots(
        &self,
        atespace: &str,
        name: &str,
        keep_newest: usize,
    ) -> Result<Vec<SnapshotRecord>> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        // The actor row lock serializes this with suspends and deletes of the same actor.
        lock_actor(&mut tx, atespace, name).await?;
        let rows = sqlx::query(concat!(
            "SELECT ",
            snapshot_cols!(),
            ", EXISTS (SELECT 1 FROM tags t WHERE t.s_uuid = s.uuid) AS tagged \
             FROM snapshots s WHERE atespace = $1 AND name = $2 ORDER BY generation DESC"
        ))
        .bind(atespace)
        .bind(name)
        .fetch_all(&mut *tx)
        .await?;
        let mut newest_completed_kept = false;
        let mut doomed = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let snap = snapshot_from_row(row, "")?;
            let tagged: bool = row.try_get("tagged")?;
            let completed = snap.durable_status == Some(DurableStatus::Completed);
            let keep = i < keep_newest.max(1) || tagged || (completed && !newest_completed_kept);
            if completed {
                newest_completed_kept = true;
            }
            if !keep {
                doomed.push(snap);
            }
        }
        for snap in &doomed {
            sqlx::query(
                "DELETE FROM snapshots WHERE atespace = $1 AND name = $2 AND generation = $3",
            )
            .bind(atespace)
            .bind(name)
            .bind(to_i64(snap.generation, "generation")?)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(doomed)
    }

    async fn update_snapshot_durable(
        &self,
        atespace: &str,
        name: &str,
        generation: u64,
        status: DurableStatus,
        durable_uri: &str,
        reason: &str,
    ) -> Result<()> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "UPDATE snapshots SET durable_status = $4, durable_uri = $5, \
             reason = CASE WHEN $6 = '' THEN reason ELSE $6 END \
             WHERE atespace = $1 AND name = $2 AND generation = $3 RETURNING uuid",
        )
        .bind(atespace)
        .bind(name)
        .bind(to_i64(generation, "generation")?)
        .bind(status.as_str())
        .bind(durable_uri)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| snapshot_not_found(atespace, name, generation))?;
        let uuid: String = row.try_get("uuid")?;
        // Tags hold a copy of the row: keep their durable copy's whereabouts current.
        sqlx::query(
            "UPDATE tags SET s_durable_status = $2, s_durable_uri = $3, \
             s_reason = CASE WHEN $4 = '' THEN s_reason ELSE $4 END WHERE s_uuid = $1",
        )
        .bind(uuid)
        .bind(status.as_str())
        .bind(durable_uri)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn clear_snapshot_local(
        &self,
        atespace: &str,
        name: &str,
        generation: u64,
    ) -> Result<()> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "UPDATE snapshots SET local_path = '' WHERE atespace = $1 AND name = $2 AND generation = $3 RETURNING uuid",
        )
        .bind(atespace)
        .bind(name)
        .bind(to_i64(generation, "generation")?)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| snapshot_not_found(atespace, name, generation))?;
        let uuid: String = row.try_get("uuid")?;
        sqlx::query("UPDATE tags SET s_local_path = '' WHERE s_uuid = $1")
            .bind(uuid)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    // ---- tags

    async fn create_tag(&self, tag: &TagRecord) -> Result<TagRecord> {
        self.counters.write();
        let s = &tag.snapshot;
        let mut tx = self.begin_write().await?;
        share_atespace(&mut tx, &tag.atespace).await?;
        let inserted = sqlx::query(concat!(
            "INSERT INTO tags (",
            tag_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) \
             RETURNING ",
            tag_cols!()
        ))
        .bind(&tag.atespace)
        .bind(&tag.name)
        .bind(tag.created_ms)
        .bind(&s.atespace)
        .bind(&s.name)
        .bind(to_i64(s.generation, "generation")?)
        .bind(&s.uuid)
        .bind(s.fidelity.as_str())
        .bind(&s.template)
        .bind(&s.sandbox_class)
        .bind(&s.node)
        .bind(&s.boot_id)
        .bind(&s.local_path)
        .bind(&s.durable_uri)
        .bind(s.durable_status.map(|d| d.as_str()))
        .bind(to_i64(s.size_bytes, "size_bytes")?)
        .bind(&s.checksum)
        .bind(&s.reason)
        .bind(s.created_ms)
        .fetch_one(&mut *tx)
        .await;
        let row = match inserted {
            Ok(row) => row,
            Err(e) if is_unique_violation(&e) => {
                return Err(already_exists(
                    "tag",
                    &format!("{}/{}", tag.atespace, tag.name),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let record = tag_from_row(&row)?;
        tx.commit().await?;
        Ok(record)
    }

    async fn get_tag(&self, atespace: &str, name: &str) -> Result<TagRecord> {
        self.counters.read();
        let row = sqlx::query(concat!(
            "SELECT ",
            tag_cols!(),
            " FROM tags WHERE atespace = $1 AND name = $2"
        ))
        .bind(atespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => tag_from_row(&row),
            None => Err(not_found("tag", &format!("{atespace}/{name}"))),
        }
    }

    async fn list_tags(&self, atespace: Option<&str>) -> Result<Vec<TagRecord>> {
        self.counters.read();
        let rows = sqlx::query(concat!(
            "SELECT ",
            tag_cols!(),
            " FROM tags WHERE ($1 IS NULL OR atespace = $1) ORDER BY atespace, name"
        ))
        .bind(atespace)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tag_from_row).collect()
    }

    async fn delete_tag(&self, atespace: &str, name: &str) -> Result<()> {
        self.counters.write();
        let done = sqlx::query("DELETE FROM tags WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("tag", &format!("{atespace}/{name}")));
        }
        Ok(())
    }

    // ---- workers

    async fn register_worker(&self, worker: &WorkerRecord, now_ms: i64) -> Result<WorkerRecord> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO workers (id, node, addresses, identity, labels, sandbox_class, can_restore_memory, \
             cpu_millis, memory_bytes, slots, epoch, status, last_heartbeat_ms, node_address, boot_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
             ON CONFLICT (id) DO UPDATE SET node = excluded.node, addresses = excluded.addresses, \
             identity = excluded.identity, labels = excluded.labels, sandbox_class = excluded.sandbox_class, \
             can_restore_memory = excluded.can_restore_memory, cpu_millis = excluded.cpu_millis, \
             memory_bytes = excluded.memory_bytes, slots = excluded.slots, epoch = excluded.epoch, \
             status = excluded.status, last_heartbeat_ms = excluded.last_heartbeat_ms, \
             node_address = excluded.node_address, boot_id = excluded.boot_id",
        )
        .bind(&worker.id)
        .bind(&worker.node)
        .bind(to_json(&worker.addresses, "addresses")?)
        .bind(&worker.identity)
        .bind(to_json(&worker.labels, "labels")?)
        .bind(&worker.sandbox_class)
        .bind(worker.can_restore_memory)
        .bind(to_i64(worker.capacity.cpu_millis, "cpu_millis")?)
        .bind(to_i64(worker.capacity.memory_bytes, "memory_bytes")?)
        .bind(to_i64(worker.capacity.slots, "slots")?)
        .bind(to_i64(worker.epoch, "epoch")?)
        .bind(WorkerStatus::Active.as_str())
        .bind(now_ms)
        .bind(&worker.node_address)
        .bind(&worker.boot_id)
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(concat!(worker_select!(), " WHERE w.id = $1"))
            .bind(&worker.id)
            .fetch_one(&mut *tx)
            .await?;
        let record = worker_from_row(&row)?;
        tx.commit().await?;
        Ok(record)
    }

    async fn heartbeat_worker(&self, id: &str, epoch: u64, now_ms: i64) -> Result<bool> {
        self.counters.write();
        let Ok(epoch) = i64::try_from(epoch) else {
            return Ok(false); // no stored epoch can be that large
        };
        let done = sqlx::query(
            "UPDATE workers SET last_heartbeat_ms = $3 WHERE id = $1 AND epoch = $2 AND status = 'ACTIVE'",
        )
        .bind(id)
        .bind(epoch)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn deregister_worker(&self, id: &str) -> Result<()> {
        self.counters.write();
        let done = sqlx::query("UPDATE workers SET status = 'GONE' WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("worker", id));
        }
        Ok(())
    }

    async fn get_worker(&self, id: &str) -> Result<WorkerRecord> {
        self.counters.read();
        let row = sqlx::query(concat!(worker_select!(), " WHERE w.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => worker_from_row(&row),
            None => Err(not_found("worker", id)),
        }
    }

    async fn list_workers(&self) -> Result<Vec<WorkerRecord>> {
        self.counters.read();
        let rows = sqlx::query(concat!(worker_select!(), " ORDER BY w.id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(worker_from_row).collect()
    }

    async fn expire_workers(&self, stale_before_ms: i64) -> Result<Vec<String>> {
        self.counters.write();
        let rows = sqlx::query(
            "UPDATE workers SET status = 'GONE' WHERE status = 'ACTIVE' AND last_heartbeat_ms < $1 RETURNING id",
        )
        .bind(stale_before_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut ids = rows
            .iter()
            .map(|r| r.try_get::<String, _>("id"))
            .collect::<Result<Vec<_>, _>>()?;
        ids.sort();
        Ok(ids)
    }

    // ---- leases

    async fn try_acquire_lease(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool> {
        self.counters.lease();
        let expires_ms = now_ms.saturating_add(ttl_ms);
        let _writer = self.write_guard().await;
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
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<()> {
        self.counters.lease();
        let _writer = self.write_guard().await;
        sqlx::query(DELETE_LEASE)
            .bind(key)
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // ---- join tokens

    async fn create_join_token(&self, token: &JoinTokenRecord) -> Result<()> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
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
        match inserted {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => {
                return Err(already_exists("join token", &token.id));
            }
            Err(e) => return Err(e.into()),
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_join_token(&self, id: &str) -> Result<JoinTokenRecord> {
        self.counters.read();
        let row = sqlx::query(
            "SELECT id, secret_sha256, description, created_ms, expires_ms, used_by \
             FROM join_tokens WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => join_token_from_row(&row),
            None => Err(not_found("join token", id)),
        }
    }

    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRecord>> {
        self.counters.read();
        let rows = sqlx::query(
            "SELECT id, secret_sha256, description, created_ms, expires_ms, used_by \
             FROM join_tokens ORDER BY created_ms, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(join_token_from_row).collect()
    }

    async fn delete_join_token(&self, id: &str) -> Result<bool> {
        self.counters.write();
        let _guard = self.write_guard().await;
        let done = sqlx::query("DELETE FROM join_tokens WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn record_join_token_use(&self, id: &str, node: &str) -> Result<()> {
        self.counters.write();
        let mut tx = self.begin_write().await?;
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

    // ---- frozen copies

    async fn set_frozen_copy(&self, atespace: &str, name: &str, copy: &FrozenCopy) -> Result<()> {
        self.counters.write();
        let _guard = self.write_guard().await;
        sqlx::query(
            "INSERT INTO frozen_copies (atespace, name, worker_id, generation) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (atespace, name) DO UPDATE SET worker_id = excluded.worker_id, \
             generation = excluded.generation",
        )
        .bind(atespace)
        .bind(name)
        .bind(&copy.worker_id)
        .bind(to_i64(copy.generation, "generation")?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_frozen_copy(&self, atespace: &str, name: &str) -> Result<Option<FrozenCopy>> {
        self.counters.read();
        let row = sqlx::query(
            "SELECT worker_id, generation FROM frozen_copies WHERE atespace = $1 AND name = $2",
        )
        .bind(atespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(FrozenCopy {
                worker_id: row.try_get("worker_id")?,
                generation: to_u64(row.try_get("generation")?, "generation")?,
            })
        })
        .transpose()
    }

    async fn clear_frozen_copy(&self, atespace: &str, name: &str) -> Result<()> {
        self.counters.write();
        let _guard = self.write_guard().await;
        sqlx::query("DELETE FROM frozen_copies WHERE atespace = $1 AND name = $2")
            .bind(atespace)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn counters(&self) -> &StoreCounters {
        &self.counters
    }
}

async fn insert_snapshot(tx: &mut Tx, s: &SnapshotRecord) -> Result<()> {
    let inserted = sqlx::query(concat!(
        "INSERT INTO snapshots (",
        snapshot_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
    ))
    .bind(&s.atespace)
    .bind(&s.name)
    .bind(to_i64(s.generation, "generation")?)
    .bind(&s.uuid)
    .bind(s.fidelity.as_str())
    .bind(&s.template)
    .bind(&s.sandbox_class)
    .bind(&s.node)
    .bind(&s.boot_id)
    .bind(&s.local_path)
    .bind(&s.durable_uri)
    .bind(s.durable_status.map(|d| d.as_str()))
    .bind(to_i64(s.size_bytes, "size_bytes")?)
    .bind(&s.checksum)
    .bind(&s.reason)
    .bind(s.created_ms)
    .execute(&mut **tx)
    .await;
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists(format!(
            "snapshot {} of actor \"{}/{}\" already exists",
            s.generation, s.atespace, s.name
        ))),
        Err(e) => Err(e.into()),
    }
}

fn join_token_from_row(row: &DbRow) -> Result<JoinTokenRecord> {
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
