//! Slots used as a cache (issue 34): when no worker has room for an actor, the least recently
//! used running actor that has had nothing open for `--evict-idle-after` is suspended — an
//! ordinary suspend, its memory kept (a frozen copy where the worker keeps one) — and the
//! placement looks again. Only workers that pass every other filter (selector, sandbox class,
//! pinned node, capabilities) are searched, so the room made is room the newcomer can use.
//!
//! What "idle" is comes from the node (`ActorActivity`: the worker's own count of requests,
//! tunnels, exec sessions and outbound connections, and when it last had one); the store must
//! agree that the actor runs there. An eviction that fails (the actor woke up, its suspend
//! failed) leaves it running and the newcomer parks as before. Thrashing — evicting an actor
//! resumed less than [`THRASH_WINDOW`] ago — is counted (`ate_api_eviction_thrash_total`) and
//! logged: it says the working set of actors does not fit the slots.

use std::time::Duration;

use ate_core::clock::now_ms;
use ate_core::{ActorRef, ActorState};
use ate_store::WorkerRecord;

use super::{Api, Failure};
use crate::scheduler::{self, Requirements};

/// An actor evicted less than this after it was resumed counts as thrashing.
pub const THRASH_WINDOW: Duration = Duration::from_secs(60);

/// An idle running actor: the eviction candidate.
struct Idle {
    actor: ActorRef,
    worker: String,
    last_activity_unix_ms: i64,
}

impl Api {
    /// Suspends the least recently used idle actor on a worker `req` could use but for room,
    /// other than `newcomer`. True when one was suspended (the caller looks for room again).
    pub(super) async fn make_room(
        &self,
        workers: &[WorkerRecord],
        req: &Requirements<'_>,
        newcomer: &ActorRef,
    ) -> Result<bool, Failure> {
        let min_idle = self.cfg.evict_idle_after;
        if min_idle.is_zero() {
            return Ok(false);
        }
        let now = now_ms();
        let min_idle_ms = i64::try_from(min_idle.as_millis()).unwrap_or(i64::MAX);
        let mut oldest: Option<Idle> = None;
        for w in scheduler::suitable_workers(workers, req) {
            for idle in self.idle_actors(w, now, min_idle_ms).await {
                if idle.actor != *newcomer
                    && oldest
                        .as_ref()
                        .is_none_or(|o| idle.last_activity_unix_ms < o.last_activity_unix_ms)
                {
                    oldest = Some(idle);
                }
            }
        }
        let Some(victim) = oldest else {
            return Ok(false);
        };
        // The store must agree: it runs on that worker now.
        let record = self.store.get_actor(&victim.actor).await?;
        if record.state != ActorState::Running
            || record.worker_id.as_deref() != Some(victim.worker.as_str())
        {
            return Ok(false);
        }
        let idle_ms = now.saturating_sub(victim.last_activity_unix_ms);
        let running_ms = now.saturating_sub(record.updated_ms);
        if running_ms < i64::try_from(THRASH_WINDOW.as_millis()).unwrap_or(i64::MAX) {
            metrics::counter!(crate::metrics::EVICTION_THRASH_TOTAL).increment(1);
            tracing::warn!(actor = %victim.actor, for_actor = %newcomer, running_ms, "evicting an actor resumed less than a minute ago: the slots are too few for the actors in use");
        }
        tracing::info!(actor = %victim.actor, worker = %victim.worker, idle_ms, for_actor = %newcomer, "no worker has room: suspending the least recently used idle actor");
        let cause = format!(
            "evicted: idle for {} s, its slot was needed for {newcomer}",
            idle_ms / 1000
        );
        match self.suspend(&victim.actor, false, &cause).await {
            Ok(_) => {
                metrics::counter!(crate::metrics::EVICTIONS_TOTAL, "outcome" => "suspended")
                    .increment(1);
                Ok(true)
            }
            Err(e) => {
                metrics::counter!(crate::metrics::EVICTIONS_TOTAL, "outcome" => e.outcome())
                    .increment(1);
                tracing::warn!(actor = %victim.actor, error = %e, "eviction failed; it keeps running");
                Ok(false)
            }
        }
    }

    /// The actors of worker `w` with nothing open for at least `min_idle_ms` (none when its node
    /// does not answer in time: it is not searched).
    async fn idle_actors(&self, w: &WorkerRecord, now: i64, min_idle_ms: i64) -> Vec<Idle> {
        let Some(actors) = super::top::worker_activity(self.nodes.as_ref(), w).await else {
            return Vec::new();
        };
        actors
            .into_iter()
            .filter(|a| a.open_streams == 0)
            .filter(|a| now.saturating_sub(a.last_activity_unix_ms) >= min_idle_ms)
            .map(|a| Idle {
                actor: a.actor,
                worker: w.id.clone(),
                last_activity_unix_ms: a.last_activity_unix_ms,
            })
            .collect()
    }
}
