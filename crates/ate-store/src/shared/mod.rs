//! The `Store` implementation shared by both backends, one file per concern; this file is the
//! trait impl, which only delegates. It is not declared in `lib.rs`: `sqlite.rs` and
//! `postgres.rs` each declare it (`#[path = "shared/mod.rs"] mod shared;`), so it is compiled
//! once per backend against that backend's items, which each defines before the declaration:
//!
//! - `Db` (the sqlx database), `DbRow` (its row type), `Tx` (a write transaction that derefs to
//!   the backend's connection), `StoreImpl` (the store struct, with fields `pool` and `counters`,
//!   an inherent `begin_write()` that opens a transaction serialized against other writers:
//!   `BEGIN IMMEDIATE` behind an in-process writer lock on SQLite — and `write_guard()`, that lock
//!   for one-statement writes, a no-op on PostgreSQL);
//! - macros `for_update!()` / `for_update_skip_locked!()` / `for_share!()` expanding to the
//!   row-lock suffix of a SELECT (empty on SQLite, where `BEGIN IMMEDIATE` already serializes
//!   writers).
//!
//! SQL text uses `$N` placeholders, which both backends accept.

use std::collections::BTreeMap;

use ate_core::{ActorRef, ActorState, DurableStatus, TemplateSpec};

use super::{Db, DbRow, StoreImpl, Tx};
use crate::{
    ActorRecord, Alarm, AtespaceRecord, Capacity, EventPage, EventQuery, FrozenCopy,
    JoinTokenRecord, Result, SnapshotCopy, SnapshotRecord, Store, StoreCounters, TagRecord,
    TemplateRecord, Transition, WorkerRecord, async_trait,
};

// Column lists and row mapping; `macro_use` makes the column macros visible to the modules below.
#[macro_use]
mod rows;

mod actors;
mod alarms;
mod atespaces;
mod binding;
mod events;
mod frozen_copies;
mod join_tokens;
mod leases;
mod snapshots;
mod tags;
mod templates;
mod workers;

#[async_trait]
impl Store for StoreImpl {
    // ---- atespaces

    async fn create_atespace(&self, name: &str, now_ms: i64) -> Result<AtespaceRecord> {
        atespaces::create_atespace(self, name, now_ms).await
    }

    async fn get_atespace(&self, name: &str) -> Result<AtespaceRecord> {
        atespaces::get_atespace(self, name).await
    }

    async fn list_atespaces(&self) -> Result<Vec<AtespaceRecord>> {
        atespaces::list_atespaces(self).await
    }

    async fn set_atespace_callers(&self, name: &str, allow: &[String]) -> Result<AtespaceRecord> {
        atespaces::set_atespace_callers(self, name, allow).await
    }

    async fn atespace_quota(&self, name: &str) -> Result<(Capacity, Capacity)> {
        atespaces::atespace_quota(self, name).await
    }

    async fn set_atespace_quota(&self, name: &str, quota: &Capacity) -> Result<AtespaceRecord> {
        atespaces::set_atespace_quota(self, name, quota).await
    }

    async fn delete_atespace(&self, name: &str) -> Result<()> {
        atespaces::delete_atespace(self, name).await
    }

    // ---- templates

    async fn apply_template(
        &self,
        namespace: &str,
        name: &str,
        spec: &TemplateSpec,
        now_ms: i64,
    ) -> Result<TemplateRecord> {
        templates::apply_template(self, namespace, name, spec, now_ms).await
    }

    async fn get_template(&self, namespace: &str, name: &str) -> Result<TemplateRecord> {
        templates::get_template(self, namespace, name).await
    }

    async fn list_templates(&self, namespace: Option<&str>) -> Result<Vec<TemplateRecord>> {
        templates::list_templates(self, namespace).await
    }

    async fn delete_template(&self, namespace: &str, name: &str) -> Result<()> {
        templates::delete_template(self, namespace, name).await
    }

    // ---- actors

    async fn create_actor(&self, actor: &ActorRecord) -> Result<ActorRecord> {
        actors::create_actor(self, actor).await
    }

    async fn get_actor(&self, actor: &ActorRef) -> Result<ActorRecord> {
        actors::get_actor(self, actor).await
    }

    async fn list_actors(
        &self,
        atespace: Option<&str>,
        after: Option<&ActorRef>,
        limit: u32,
    ) -> Result<Vec<ActorRecord>> {
        actors::list_actors(self, atespace, after, limit).await
    }

    async fn update_actor_selector(
        &self,
        actor: &ActorRef,
        selector: &BTreeMap<String, String>,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        actors::update_actor_selector(self, actor, selector, now_ms).await
    }

    async fn delete_actor(&self, actor: &ActorRef, now_ms: i64) -> Result<Vec<SnapshotRecord>> {
        actors::delete_actor(self, actor, now_ms).await
    }

    async fn transition(
        &self,
        actor: &ActorRef,
        transition: Transition<'_>,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        actors::transition(self, actor, transition, now_ms, None).await
    }

    async fn transition_releasing_lease(
        &self,
        actor: &ActorRef,
        transition: Transition<'_>,
        now_ms: i64,
        lease_key: &str,
        lease_holder: &str,
    ) -> Result<ActorRecord> {
        let lease = Some((lease_key, lease_holder));
        actors::transition(self, actor, transition, now_ms, lease).await
    }

    async fn bind_actor(
        &self,
        actor: &ActorRef,
        from: &[ActorState],
        worker_id: &str,
        demand: Capacity,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        binding::bind_actor(self, actor, from, worker_id, demand, now_ms).await
    }

    async fn readopt_actor(
        &self,
        actor: &ActorRef,
        worker_id: &str,
        activation: u64,
        demand: Capacity,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        binding::readopt_actor(self, actor, worker_id, activation, demand, now_ms).await
    }

    async fn release_actor(
        &self,
        actor: &ActorRef,
        transition: Transition<'_>,
        snapshot: Option<&SnapshotRecord>,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        binding::release_actor(self, actor, transition, snapshot, now_ms).await
    }

    async fn actors_on_worker(&self, worker_id: &str) -> Result<Vec<ActorRecord>> {
        actors::actors_on_worker(self, worker_id).await
    }

    // ---- snapshots

    async fn list_snapshots(&self, actor: &ActorRef) -> Result<Vec<SnapshotRecord>> {
        snapshots::list_snapshots(self, actor).await
    }

    async fn prune_snapshots(
        &self,
        actor: &ActorRef,
        keep_newest: usize,
    ) -> Result<Vec<SnapshotRecord>> {
        snapshots::prune_snapshots(self, actor, keep_newest).await
    }

    async fn update_snapshot_durable(
        &self,
        actor: &ActorRef,
        generation: u64,
        status: DurableStatus,
        durable_uri: &str,
        reason: &str,
    ) -> Result<()> {
        snapshots::update_snapshot_durable(self, actor, generation, status, durable_uri, reason)
            .await
    }

    async fn clear_snapshot_local(&self, actor: &ActorRef, generation: u64) -> Result<()> {
        snapshots::clear_snapshot_local(self, actor, generation).await
    }

    async fn mark_snapshot_damaged(
        &self,
        actor: &ActorRef,
        generation: u64,
        uuid: &str,
        copy: SnapshotCopy,
        reason: &str,
    ) -> Result<SnapshotRecord> {
        snapshots::mark_snapshot_damaged(self, actor, generation, uuid, copy, reason).await
    }

    async fn revert_actor(
        &self,
        actor: &ActorRef,
        from: &[ActorState],
        generation: Option<u64>,
        now_ms: i64,
    ) -> Result<ActorRecord> {
        snapshots::revert_actor(self, actor, from, generation, now_ms).await
    }

    // ---- tags

    async fn create_tag(&self, tag: &TagRecord) -> Result<TagRecord> {
        tags::create_tag(self, tag).await
    }

    async fn get_tag(&self, atespace: &str, name: &str) -> Result<TagRecord> {
        tags::get_tag(self, atespace, name).await
    }

    async fn list_tags(&self, atespace: Option<&str>) -> Result<Vec<TagRecord>> {
        tags::list_tags(self, atespace).await
    }

    async fn delete_tag(&self, atespace: &str, name: &str) -> Result<()> {
        tags::delete_tag(self, atespace, name).await
    }

    // ---- workers

    async fn register_worker(&self, worker: &WorkerRecord, now_ms: i64) -> Result<WorkerRecord> {
        workers::register_worker(self, worker, now_ms).await
    }

    async fn heartbeat_worker(
        &self,
        id: &str,
        epoch: u64,
        cpu_usage_millis: u64,
        now_ms: i64,
    ) -> Result<bool> {
        workers::heartbeat_worker(self, id, epoch, cpu_usage_millis, now_ms).await
    }

    async fn deregister_worker(&self, id: &str) -> Result<()> {
        workers::deregister_worker(self, id).await
    }

    async fn get_worker(&self, id: &str) -> Result<WorkerRecord> {
        workers::get_worker(self, id).await
    }

    async fn list_workers(&self) -> Result<Vec<WorkerRecord>> {
        workers::list_workers(self).await
    }

    async fn expire_workers(&self, stale_before_ms: i64) -> Result<Vec<String>> {
        workers::expire_workers(self, stale_before_ms).await
    }

    // ---- leases

    async fn try_acquire_lease(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool> {
        leases::try_acquire_lease(self, key, holder, now_ms, ttl_ms).await
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<()> {
        leases::release_lease(self, key, holder).await
    }

    // ---- join tokens

    async fn create_join_token(&self, token: &JoinTokenRecord) -> Result<()> {
        join_tokens::create_join_token(self, token).await
    }

    async fn get_join_token(&self, id: &str) -> Result<JoinTokenRecord> {
        join_tokens::get_join_token(self, id).await
    }

    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRecord>> {
        join_tokens::list_join_tokens(self).await
    }

    async fn delete_join_token(&self, id: &str) -> Result<bool> {
        join_tokens::delete_join_token(self, id).await
    }

    async fn record_join_token_use(&self, id: &str, node: &str) -> Result<()> {
        join_tokens::record_join_token_use(self, id, node).await
    }

    // ---- frozen copies

    async fn set_frozen_copy(&self, actor: &ActorRef, copy: &FrozenCopy) -> Result<()> {
        frozen_copies::set_frozen_copy(self, actor, copy).await
    }

    async fn get_frozen_copy(&self, actor: &ActorRef) -> Result<Option<FrozenCopy>> {
        frozen_copies::get_frozen_copy(self, actor).await
    }

    async fn clear_frozen_copy(&self, actor: &ActorRef) -> Result<()> {
        frozen_copies::clear_frozen_copy(self, actor).await
    }

    // ---- alarms

    async fn set_alarm(
        &self,
        actor: &ActorRef,
        due_ms: i64,
        path: &str,
        now_ms: i64,
    ) -> Result<Alarm> {
        alarms::set_alarm(self, actor, due_ms, path, now_ms).await
    }

    async fn get_alarm(&self, actor: &ActorRef) -> Result<Option<Alarm>> {
        alarms::get_alarm(self, actor).await
    }

    async fn delete_alarm(&self, actor: &ActorRef, seq: Option<i64>) -> Result<bool> {
        alarms::delete_alarm(self, actor, seq).await
    }

    async fn list_alarms(&self, atespace: Option<&str>) -> Result<Vec<Alarm>> {
        alarms::list_alarms(self, atespace).await
    }

    async fn claim_due_alarms(&self, now_ms: i64, lease_ms: i64, limit: u32) -> Result<Vec<Alarm>> {
        alarms::claim_due_alarms(self, now_ms, lease_ms, limit).await
    }

    async fn alarm_attempt_failed(
        &self,
        actor: &ActorRef,
        seq: i64,
        next_attempt_ms: i64,
        error: &str,
        give_up: bool,
    ) -> Result<bool> {
        alarms::alarm_attempt_failed(self, actor, seq, next_attempt_ms, error, give_up).await
    }

    // ---- events

    async fn list_events(&self, query: &EventQuery) -> Result<EventPage> {
        events::list_events(self, query).await
    }

    async fn prune_events(&self, before_ms: i64, limit: u32) -> Result<u64> {
        events::prune_events(self, before_ms, limit).await
    }

    fn counters(&self) -> &StoreCounters {
        &self.counters
    }
}
