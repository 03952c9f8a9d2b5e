//! Actor events: one row per change of an actor's state (or of its worker), written by the store
//! in the same transaction as the change itself, so the history can neither miss a change that
//! committed nor show one that did not. What each change is called (`reason`, kubectl's REASON
//! column) and its default message are decided here, without I/O; callers add why (a note).
//!
//! Architecture invariant: every store method that changes an actor's `state` or `worker_id`
//! records exactly one event for it, and a retried call that changes nothing records none.

use ate_core::ActorState;

use crate::{ActorRecord, SnapshotRecord};

/// kubectl's event TYPE: whether the change is what operators expect, or a sign of trouble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "Normal" => Some(Self::Normal),
            "Warning" => Some(Self::Warning),
            _ => None,
        }
    }
}

/// One recorded change of an actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorEvent {
    /// Assigned by the store, increasing in insertion order (a watch resumes after one). On
    /// PostgreSQL two concurrent transactions may commit out of id order, so a reader must
    /// tolerate an id appearing below one it already saw (see `ate-api`'s event feed).
    pub id: i64,
    pub time_ms: i64,
    pub atespace: String,
    pub name: String,
    /// The actor's uid: tells events of a deleted actor from those of a new one of that name.
    pub uid: String,
    pub kind: EventKind,
    /// What happened, one CamelCase word (`Created`, `Resuming`, `Resumed`, `Suspending`,
    /// `Suspended`, `SuspendFailed`, `ResumeFailed`, `Released`, `Crashed`, `Reverted`,
    /// `Readopted`, `Deleted`).
    pub reason: String,
    /// The state before (`None` for `Created`).
    pub from_state: Option<ActorState>,
    /// The state after (`None` for `Deleted`).
    pub to_state: Option<ActorState>,
    /// The actor's worker after the change (before it, for a change that left no worker).
    pub worker_id: Option<String>,
    /// The actor's newest generation after the change.
    pub generation: u64,
    /// Why, in words: the caller's note, the error the change recorded, and what the store
    /// knows (the worker, the generation written).
    pub message: String,
}

/// Which events [`crate::Store::list_events`] returns.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Only this atespace's actors.
    pub atespace: Option<String>,
    /// Only the actor of this name (with `atespace`).
    pub name: Option<String>,
    /// Only events with a larger id.
    pub after_id: i64,
    /// At most this many (0: none, e.g. to read only the newest id).
    pub limit: u32,
    /// The newest `limit` matching events (still returned oldest first), instead of the oldest.
    pub newest: bool,
}

/// What [`crate::Store::list_events`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPage {
    /// Oldest first.
    pub events: Vec<ActorEvent>,
    /// The newest event id in the whole store when read (0: none yet): a watch that starts after
    /// it misses nothing that committed before the read.
    pub newest_id: i64,
}

/// An event before the store gives it an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewEvent {
    pub kind: EventKind,
    pub reason: &'static str,
    pub from_state: Option<ActorState>,
    pub to_state: Option<ActorState>,
    pub worker_id: Option<String>,
    pub message: String,
}

/// The event for `before` → `after` (`None`: created / deleted), or `None` when neither the state
/// nor the worker changed (a retried call). `note` is the caller's why; `wrote` the generation a
/// release recorded.
pub(crate) fn describe(
    before: Option<&ActorRecord>,
    after: Option<&ActorRecord>,
    note: Option<&str>,
    wrote: Option<&SnapshotRecord>,
) -> Option<NewEvent> {
    let from = before.map(|a| a.state);
    let to = after.map(|a| a.state);
    let worker_before = before.and_then(|a| a.worker_id.clone());
    let worker_after = after.and_then(|a| a.worker_id.clone());
    if from == to && worker_before == worker_after {
        return None;
    }
    let (reason, mut kind) = reason_for(from, to, wrote.is_some());
    // An error the change recorded (a fallback to lower fidelity, a failed resume) is news.
    let new_error = after
        .and_then(|a| a.last_error.as_deref())
        .filter(|e| before.and_then(|b| b.last_error.as_deref()) != Some(*e));
    if new_error.is_some() && reason == "Suspended" {
        kind = EventKind::Warning;
    }
    let worker = worker_after.clone().or(worker_before);
    let detail = match (reason, after) {
        ("Created", Some(a)) => format!("from template {}", a.template),
        ("Resuming", _) => format!("placed on worker {}", worker.as_deref().unwrap_or("?")),
        ("Resumed" | "Readopted", _) => {
            format!("running on worker {}", worker.as_deref().unwrap_or("?"))
        }
        ("Suspended", _) => match wrote {
            Some(s) => format!(
                "generation {} ({}) written on node {}",
                s.generation,
                s.fidelity.short(),
                s.node
            ),
            None => String::new(),
        },
        _ => String::new(),
    };
    let message = [note, new_error, Some(detail.as_str())]
        .into_iter()
        .flatten()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Some(NewEvent {
        kind,
        reason,
        from_state: from,
        to_state: to,
        worker_id: worker,
        message,
    })
}

/// The REASON of a change from `from` to `to` (`None`: the actor did not / no longer exists).
fn reason_for(
    from: Option<ActorState>,
    to: Option<ActorState>,
    wrote_snapshot: bool,
) -> (&'static str, EventKind) {
    use ActorState::*;
    use EventKind::*;
    match (from, to) {
        (None, _) => ("Created", Normal),
        (_, None) => ("Deleted", Normal),
        (_, Some(Crashed)) => ("Crashed", Warning),
        (_, Some(Resuming)) => ("Resuming", Normal),
        (Some(Resuming), Some(Running)) => ("Resumed", Normal),
        (Some(Suspended), Some(Running)) => ("Readopted", Normal),
        (Some(Suspending), Some(Running)) => ("SuspendFailed", Warning),
        (_, Some(Suspending)) => ("Suspending", Normal),
        (Some(Suspending), Some(Suspended)) if wrote_snapshot => ("Suspended", Normal),
        (Some(Resuming), Some(Suspended)) => ("ResumeFailed", Warning),
        // Released without a new generation: the worker went away, or the suspend lost the
        // sandbox; the previous generation is what the next resume restores.
        (Some(_), Some(Suspended)) => ("Released", Warning),
        (Some(_), Some(Running)) => ("Running", Normal),
    }
}

/// The event a revert records: `Reverted`, whatever the states; `target` is the generation the
/// next resume restores (0: none, a fresh start).
pub(crate) fn reverted(before: &ActorRecord, after: &ActorRecord, target: u64) -> NewEvent {
    NewEvent {
        kind: EventKind::Normal,
        reason: "Reverted",
        from_state: Some(before.state),
        to_state: Some(after.state),
        worker_id: before.worker_id.clone(),
        message: match target {
            0 => "no generation left to restore: the next resume starts afresh".to_string(),
            g => format!("the next resume restores generation {g}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ate_core::{Fidelity, TemplateRef};

    use super::*;

    fn actor(state: ActorState, worker: Option<&str>) -> ActorRecord {
        ActorRecord {
            atespace: "ns".into(),
            name: "a".into(),
            uid: "u".into(),
            template: TemplateRef::new("ns", "t"),
            state,
            worker_selector: BTreeMap::new(),
            worker_id: worker.map(str::to_string),
            epoch: 1,
            generation: 2,
            attached_node: None,
            last_error: None,
            created_ms: 0,
            updated_ms: 0,
            activation: 1,
        }
    }

    fn snap() -> SnapshotRecord {
        SnapshotRecord {
            atespace: "ns".into(),
            name: "a".into(),
            generation: 3,
            uuid: "x".into(),
            fidelity: Fidelity::Memory,
            template: TemplateRef::new("ns", "t"),
            sandbox_class: "runc".into(),
            node: "n1".into(),
            boot_id: "b".into(),
            local_path: None,
            durable_uri: None,
            durable_status: None,
            size_bytes: 0,
            checksum: String::new(),
            reason: None,
            created_ms: 0,
            local_damage: None,
            durable_damage: None,
            skipped: false,
            requires: vec![],
        }
    }

    #[test]
    fn a_retried_call_that_changes_nothing_is_no_event() {
        let a = actor(ActorState::Resuming, Some("w1"));
        assert_eq!(describe(Some(&a), Some(&a), Some("why"), None), None);
    }

    #[test]
    fn each_change_has_its_reason_and_message() {
        let suspended = actor(ActorState::Suspended, None);
        let resuming = actor(ActorState::Resuming, Some("w1"));
        let running = actor(ActorState::Running, Some("w1"));
        let suspending = actor(ActorState::Suspending, Some("w1"));

        let e = describe(None, Some(&suspended), None, None).unwrap();
        assert_eq!((e.reason, e.kind), ("Created", EventKind::Normal));
        assert_eq!(e.message, "from template ns/t");

        let e = describe(Some(&suspended), Some(&resuming), None, None).unwrap();
        assert_eq!(e.reason, "Resuming");
        assert_eq!(e.message, "placed on worker w1");

        let e = describe(
            Some(&resuming),
            Some(&running),
            Some("for request r-1"),
            None,
        )
        .unwrap();
        assert_eq!(e.reason, "Resumed");
        assert_eq!(e.message, "for request r-1; running on worker w1");

        let e = describe(Some(&running), Some(&suspending), Some("idle"), None).unwrap();
        assert_eq!((e.reason, e.message.as_str()), ("Suspending", "idle"));

        let e = describe(
            Some(&suspending),
            Some(&suspended),
            Some("idle"),
            Some(&snap()),
        )
        .unwrap();
        assert_eq!((e.reason, e.kind), ("Suspended", EventKind::Normal));
        assert_eq!(e.message, "idle; generation 3 (memory) written on node n1");
        assert_eq!(e.worker_id.as_deref(), Some("w1"), "the worker it left");

        let e = describe(Some(&suspending), Some(&running), None, None).unwrap();
        assert_eq!((e.reason, e.kind), ("SuspendFailed", EventKind::Warning));

        let e = describe(Some(&running), None, None, None).unwrap();
        assert_eq!(e.reason, "Deleted");
    }

    #[test]
    fn a_change_that_records_an_error_says_it_and_warns() {
        let suspending = actor(ActorState::Suspending, Some("w1"));
        let mut fell_back = actor(ActorState::Suspended, None);
        fell_back.last_error = Some("memory dump failed; files only".into());
        let e = describe(Some(&suspending), Some(&fell_back), None, Some(&snap())).unwrap();
        assert_eq!((e.reason, e.kind), ("Suspended", EventKind::Warning));
        assert!(
            e.message
                .starts_with("memory dump failed; files only; generation 3")
        );

        let mut crashed = actor(ActorState::Crashed, None);
        crashed.last_error = Some("probe failed".into());
        let resuming = actor(ActorState::Resuming, Some("w1"));
        let e = describe(Some(&resuming), Some(&crashed), None, None).unwrap();
        assert_eq!((e.reason, e.kind), ("Crashed", EventKind::Warning));
        assert_eq!(e.message, "probe failed");

        let e = describe(
            Some(&resuming),
            Some(&actor(ActorState::Suspended, None)),
            None,
            None,
        );
        assert_eq!(e.unwrap().reason, "ResumeFailed");
    }
}
