//! Memory pressure on the node: when the host's available memory falls below
//! `--memory-low-percent`, frozen copies go first (each worker drops its own below
//! `--frozen-min-available-percent`, a higher mark), then the node suspends its least recently
//! used idle actor, one at a time — an ordinary suspend, its memory kept in its generation —
//! until memory is back above the mark. Admission books memory by limits, so nothing running is
//! ever OOM-killed to admit another; this gives back what idle actors hold, so the node keeps
//! room for those that work (docs/capacity.md, "Memory pressure").
//!
//! The decision is here, without I/O or clock; the fleet's activity pass feeds it.

use std::time::Duration;

use ate_core::ActorRef;

/// An actor with nothing open for less than this is not suspended for memory: the same
/// minimum as the api's recommended `--evict-idle-after` (a request's follow-up usually comes
/// within it; past it the actor is as good as idle).
pub const MIN_IDLE: Duration = Duration::from_secs(2);

/// At most one suspend for memory per this long: the memory a suspend gives back shows in
/// MemAvailable only once the sandbox is gone, and the next pass must see it before it picks
/// another actor.
pub const SPACING: Duration = Duration::from_secs(1);

/// An actor the activity pass saw idle on one of the node's workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub actor: ActorRef,
    pub last_activity_unix_ms: i64,
}

/// What one activity pass found about memory.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// MemAvailable as a percentage of the host's memory (None: unreadable, nothing is done).
    pub available_percent: Option<u8>,
    /// Frozen copies the workers still keep.
    pub frozen: u32,
    /// Actors with nothing open (not exited, not draining, not already being suspended).
    pub idle: Vec<Candidate>,
}

/// The actor to suspend for memory now, with the cause recorded with its suspend; None when
/// memory is not low (or `low_percent` is 0: off), a frozen copy is still there to go first,
/// or no actor has been idle for [`MIN_IDLE`].
pub fn choose(pass: &Pass, low_percent: u8, now_ms: i64) -> Option<(ActorRef, String)> {
    let available = pass.available_percent?;
    if low_percent == 0 || available >= low_percent || pass.frozen > 0 {
        return None;
    }
    let min_idle_ms = i64::try_from(MIN_IDLE.as_millis()).unwrap_or(i64::MAX);
    let victim = pass
        .idle
        .iter()
        .filter(|c| now_ms.saturating_sub(c.last_activity_unix_ms) >= min_idle_ms)
        .min_by(|a, b| {
            a.last_activity_unix_ms
                .cmp(&b.last_activity_unix_ms)
                .then_with(|| a.actor.cmp(&b.actor))
        })?;
    let idle_s = now_ms.saturating_sub(victim.last_activity_unix_ms) / 1000;
    let why = format!(
        "host memory low: {available}% available, below {low_percent}% (no frozen copy left); least recently used idle actor, idle for {idle_s} s"
    );
    Some((victim.actor.clone(), why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(name: &str, last: i64) -> Candidate {
        Candidate {
            actor: ActorRef::new("ns", name),
            last_activity_unix_ms: last,
        }
    }

    fn pass(available: u8, frozen: u32) -> Pass {
        Pass {
            available_percent: Some(available),
            frozen,
            idle: vec![
                idle("recent", 9_000),
                idle("oldest", 1_000),
                idle("older", 2_000),
            ],
        }
    }

    #[test]
    fn the_least_recently_used_idle_actor_goes_when_memory_is_low() {
        let (actor, why) = choose(&pass(5, 0), 10, 10_000).expect("a victim");
        assert_eq!(actor, ActorRef::new("ns", "oldest"));
        assert!(why.contains("5% available, below 10%"), "{why}");
        assert!(why.contains("idle for 9 s"), "{why}");
    }

    #[test]
    fn frozen_copies_go_first() {
        assert_eq!(choose(&pass(5, 1), 10, 10_000), None);
    }

    #[test]
    fn nothing_while_memory_is_not_low_or_unknown_or_off() {
        assert_eq!(choose(&pass(10, 0), 10, 10_000), None);
        assert_eq!(choose(&pass(50, 0), 10, 10_000), None);
        assert_eq!(choose(&pass(0, 0), 0, 10_000), None);
        let unknown = Pass {
            available_percent: None,
            ..pass(0, 0)
        };
        assert_eq!(choose(&unknown, 10, 10_000), None);
    }

    #[test]
    fn an_actor_touched_within_the_minimum_is_kept() {
        // At 10.5 s only "oldest" and "older" have been idle for 2 s; at 2.5 s none has.
        let (actor, _) = choose(&pass(5, 0), 10, 10_500).expect("a victim");
        assert_eq!(actor, ActorRef::new("ns", "oldest"));
        let fresh = Pass {
            idle: vec![idle("recent", 9_000)],
            ..pass(5, 0)
        };
        assert_eq!(choose(&fresh, 10, 10_500), None);
    }
}
