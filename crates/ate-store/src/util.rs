//! Backend-independent helpers: conversions between Rust and SQL values, and error messages.

use std::collections::BTreeMap;

use ate_core::{ActorState, DurableStatus, Fidelity, TemplateRef};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Capacity, Result, StoreError, WorkerStatus};

/// `u64` → `BIGINT`; values above `i64::MAX` are refused (never wrapped).
pub(crate) fn to_i64(value: u64, field: &str) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| StoreError::Database(format!("{field} {value} does not fit in BIGINT")))
}

/// `BIGINT` → `u64`; negative values are refused.
pub(crate) fn to_u64(value: i64, field: &str) -> Result<u64> {
    u64::try_from(value)
        .map_err(|_| StoreError::Database(format!("column {field} holds negative value {value}")))
}

pub(crate) fn to_json<T: Serialize>(value: &T, field: &str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Database(format!("encoding {field}: {e}")))
}

pub(crate) fn from_json<T: DeserializeOwned>(text: &str, field: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Database(format!("decoding column {field}: {e}")))
}

pub(crate) fn parse_state(text: &str) -> Result<ActorState> {
    ActorState::parse(text)
        .ok_or_else(|| StoreError::Database(format!("unknown actor state {text:?}")))
}

pub(crate) fn parse_fidelity(text: &str) -> Result<Fidelity> {
    Fidelity::parse(text).ok_or_else(|| StoreError::Database(format!("unknown fidelity {text:?}")))
}

pub(crate) fn parse_durable(text: Option<&str>) -> Result<Option<DurableStatus>> {
    text.map(|t| {
        DurableStatus::parse(t)
            .ok_or_else(|| StoreError::Database(format!("unknown durable status {t:?}")))
    })
    .transpose()
}

pub(crate) fn parse_worker_status(text: &str) -> Result<WorkerStatus> {
    match text {
        "ACTIVE" => Ok(WorkerStatus::Active),
        "GONE" => Ok(WorkerStatus::Gone),
        other => Err(StoreError::Database(format!(
            "unknown worker status {other:?}"
        ))),
    }
}

pub(crate) fn parse_labels(text: &str, field: &str) -> Result<BTreeMap<String, String>> {
    from_json(text, field)
}

/// `StateConflict` unless `actual` is one of `from`.
pub(crate) fn check_state(actual: ActorState, from: &[ActorState]) -> Result<()> {
    if from.contains(&actual) {
        Ok(())
    } else {
        Err(StoreError::StateConflict {
            actual,
            expected: expected_states(from),
        })
    }
}

/// `ACTOR_STATE_SUSPENDED, ACTOR_STATE_CRASHED` (the `expected` of a `StateConflict`).
pub(crate) fn expected_states(from: &[ActorState]) -> String {
    from.iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Like [`Capacity::fits`], but an overflowing sum never fits (instead of panicking).
pub(crate) fn admits(capacity: &Capacity, used: &Capacity, demand: &Capacity) -> bool {
    let fits = |used: u64, demand: u64, cap: u64| {
        used.checked_add(demand).is_some_and(|total| total <= cap)
    };
    fits(used.cpu_millis, demand.cpu_millis, capacity.cpu_millis)
        && fits(
            used.memory_bytes,
            demand.memory_bytes,
            capacity.memory_bytes,
        )
        && fits(used.slots, demand.slots, capacity.slots)
}

/// `3 actors`, `1 template`.
pub(crate) fn count_of(n: i64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Splits a template reference `ns/name`.
/// A stored `ns/name` template reference. Lenient (any non-empty halves), so rows written before
/// the type existed always read back.
pub(crate) fn parse_template_ref(text: &str, field: &str) -> Result<TemplateRef> {
    text.split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .map(|(ns, name)| TemplateRef::new(ns, name))
        .ok_or_else(|| {
            StoreError::Database(format!(
                "column {field} holds {text:?}, not <namespace>/<name>"
            ))
        })
}

/// The lease key of an actor's mutating workflows ([`ate_core::ActorRef::lease_key`]).
pub fn actor_lease_key(atespace: &str, name: &str) -> String {
    ate_core::ActorRef::new(atespace, name).lease_key()
}

/// True for a unique / primary-key violation (both backends).
fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// The outcome of an insert, with `exists()` in place of a unique / primary-key violation.
pub(crate) fn unique_or<T>(
    inserted: std::result::Result<T, sqlx::Error>,
    exists: impl FnOnce() -> StoreError,
) -> Result<T> {
    match inserted {
        Ok(value) => Ok(value),
        Err(e) if is_unique_violation(&e) => Err(exists()),
        Err(e) => Err(e.into()),
    }
}

// ---- messages naming the object (`actor "a/b" not found`)

pub(crate) fn not_found(kind: &str, id: &str) -> StoreError {
    StoreError::NotFound(format!("{kind} \"{id}\" not found"))
}

pub(crate) fn already_exists(kind: &str, id: &str) -> StoreError {
    StoreError::AlreadyExists(format!("{kind} \"{id}\" already exists"))
}

pub(crate) fn snapshot_not_found(actor: &ate_core::ActorRef, generation: u64) -> StoreError {
    StoreError::NotFound(format!(
        "snapshot {generation} of actor \"{actor}\" not found"
    ))
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        StoreError::Database(error.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        StoreError::Database(format!("migration failed: {error}"))
    }
}

/// A text column where `''` stands for "absent" → `None` for `''`.
pub(crate) fn empty_as_none(text: String) -> Option<String> {
    if text.is_empty() { None } else { Some(text) }
}

/// The inverse of [`empty_as_none`]: the stored text of an optional value.
pub(crate) fn none_as_empty(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("")
}
