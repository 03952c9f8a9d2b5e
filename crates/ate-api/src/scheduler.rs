//! Placement: an in-memory view of the fleet, filters, and the power of two random choices.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ate_store::{Capacity, Store, StoreError, WorkerRecord, WorkerStatus};
use rand::seq::IndexedRandom;
use tokio::sync::RwLock;

/// Workers as last read from the store. Refreshed when older than `max_age` and after a lost
/// admission race, so placement costs no query on most resumes; the store's bind transaction is
/// what actually guarantees capacity.
pub struct FleetView {
    store: Arc<dyn Store>,
    max_age: Duration,
    cached: RwLock<(Instant, Arc<Vec<WorkerRecord>>)>,
}

impl FleetView {
    pub fn new(store: Arc<dyn Store>, max_age: Duration) -> Self {
        let stale = Instant::now()
            .checked_sub(max_age * 2)
            .unwrap_or_else(Instant::now);
        Self {
            store,
            max_age,
            cached: RwLock::new((stale, Arc::new(Vec::new()))),
        }
    }

    pub async fn workers(&self) -> Result<Arc<Vec<WorkerRecord>>, StoreError> {
        {
            let guard = self.cached.read().await;
            if guard.0.elapsed() < self.max_age {
                return Ok(guard.1.clone());
            }
        }
        self.refresh().await
    }

    pub async fn refresh(&self) -> Result<Arc<Vec<WorkerRecord>>, StoreError> {
        let workers = Arc::new(self.store.list_workers().await?);
        *self.cached.write().await = (Instant::now(), workers.clone());
        Ok(workers)
    }
}

/// Where an actor's newest generation is still kept frozen in place: `(worker, generation)`
/// per actor, learnt from checkpoint replies. Placement prefers that worker when it is
/// eligible, because a resume there is a thaw instead of a restore. A hint is only a
/// preference: a lost or stale one (another api instance, a restart, a worker that dropped
/// its copy) costs a normal restore, never correctness — the worker thaws only the exact
/// generation it was asked to restore.
#[derive(Default)]
pub struct FrozenHints(std::sync::Mutex<std::collections::HashMap<String, (String, u64)>>);

/// Hints kept at most; past it the map is cleared (a cache, not a record).
const MAX_FROZEN_HINTS: usize = 1 << 20;

impl FrozenHints {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (String, u64)>> {
        match self.0.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn insert(&self, actor: &str, worker: &str, generation: u64) {
        let mut map = self.map();
        if map.len() >= MAX_FROZEN_HINTS {
            map.clear();
        }
        map.insert(actor.to_string(), (worker.to_string(), generation));
    }

    /// The worker holding `generation` of `actor` frozen, if known.
    pub fn worker_for(&self, actor: &str, generation: u64) -> Option<String> {
        self.map()
            .get(actor)
            .filter(|(_, g)| *g == generation)
            .map(|(w, _)| w.clone())
    }

    pub fn remove(&self, actor: &str) {
        self.map().remove(actor);
    }
}

/// The preferred worker when it is among the candidates, else two random choices.
pub fn pick_preferring<'w>(
    candidates: &[&'w WorkerRecord],
    preferred: Option<&str>,
) -> Option<&'w WorkerRecord> {
    preferred
        .and_then(|id| candidates.iter().find(|w| w.id == id).copied())
        .or_else(|| pick(candidates))
}

/// What a placement must satisfy.
pub struct Requirements<'a> {
    /// Template and actor selectors merged (actor wins on equal keys).
    pub selector: BTreeMap<String, String>,
    pub sandbox_class: &'a str,
    /// Restrict to this node (node-local snapshot without a durable copy).
    pub node: Option<&'a str>,
    pub demand: Capacity,
    /// Workers already tried and lost in this workflow.
    pub exclude: &'a [String],
}

/// Workers that pass every filter.
pub fn eligible<'w>(workers: &'w [WorkerRecord], req: &Requirements<'_>) -> Vec<&'w WorkerRecord> {
    workers
        .iter()
        .filter(|w| w.status == WorkerStatus::Active)
        .filter(|w| w.sandbox_class == req.sandbox_class)
        .filter(|w| req.node.is_none_or(|n| w.node == n))
        .filter(|w| ate_core::selector::matches(&req.selector, &w.labels))
        .filter(|w| w.capacity.fits(&w.used, &req.demand))
        .filter(|w| !req.exclude.contains(&w.id))
        .collect()
}

/// Load of a worker: the fullest of its dimensions, as a fraction.
fn load(w: &WorkerRecord) -> f64 {
    let frac = |used: u64, cap: u64| {
        if cap == 0 {
            1.0
        } else {
            used as f64 / cap as f64
        }
    };
    frac(w.used.slots, w.capacity.slots)
        .max(frac(w.used.cpu_millis, w.capacity.cpu_millis))
        .max(frac(w.used.memory_bytes, w.capacity.memory_bytes))
}

/// Two random choices: sample two eligible workers and take the less loaded.
pub fn pick<'w>(candidates: &[&'w WorkerRecord]) -> Option<&'w WorkerRecord> {
    let mut rng = rand::rng();
    let two: Vec<&&WorkerRecord> = candidates.choose_multiple(&mut rng, 2).collect();
    match two.as_slice() {
        [] => None,
        [one] => Some(**one),
        [a, b, ..] => Some(if load(a) <= load(b) { **a } else { **b }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: &str, node: &str, slots: u64, used: u64) -> WorkerRecord {
        WorkerRecord {
            id: id.into(),
            node: node.into(),
            addresses: vec![],
            identity: String::new(),
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            sandbox_class: "runc".into(),
            can_restore_memory: true,
            capacity: Capacity {
                cpu_millis: 4000,
                memory_bytes: 8 << 30,
                slots,
            },
            used: Capacity {
                cpu_millis: 0,
                memory_bytes: 0,
                slots: used,
            },
            epoch: 1,
            status: WorkerStatus::Active,
            last_heartbeat_ms: 0,
            node_address: String::new(),
            boot_id: String::new(),
        }
    }

    #[test]
    fn filters_and_two_choices() {
        let mut gone = worker("gone", "n1", 8, 0);
        gone.status = WorkerStatus::Gone;
        let workers = vec![
            worker("full", "n1", 2, 2),
            worker("busy", "n1", 8, 6),
            worker("idle", "n2", 8, 0),
            gone,
        ];
        let req = Requirements {
            selector: BTreeMap::new(),
            sandbox_class: "runc",
            node: None,
            demand: Capacity {
                cpu_millis: 100,
                memory_bytes: 1 << 20,
                slots: 1,
            },
            exclude: &[],
        };
        let ids: Vec<&str> = eligible(&workers, &req)
            .iter()
            .map(|w| w.id.as_str())
            .collect();
        assert_eq!(ids, ["busy", "idle"]);
        // With exactly two candidates both are sampled, so the less loaded always wins.
        for _ in 0..20 {
            assert_eq!(
                pick(&eligible(&workers, &req)).map(|w| w.id.as_str()),
                Some("idle")
            );
        }
        let on_n1 = Requirements {
            node: Some("n1"),
            ..req
        };
        assert_eq!(eligible(&workers, &on_n1).len(), 1);
        let sel = Requirements {
            selector: BTreeMap::from([("zone".into(), "b".into())]),
            node: None,
            ..on_n1
        };
        assert!(eligible(&workers, &sel).is_empty());
        assert!(pick(&[]).is_none());
    }

    #[test]
    fn frozen_hint_wins_only_when_eligible_and_current() {
        let workers = [worker("a", "n1", 8, 0), worker("b", "n1", 8, 7)];
        let all: Vec<&WorkerRecord> = workers.iter().collect();
        let hints = FrozenHints::default();
        hints.insert("ns/x", "b", 3);
        assert_eq!(hints.worker_for("ns/x", 3).as_deref(), Some("b"));
        assert_eq!(hints.worker_for("ns/x", 4), None);
        assert_eq!(hints.worker_for("ns/y", 3), None);
        // The fuller worker still wins when it holds the frozen copy.
        for _ in 0..20 {
            assert_eq!(
                pick_preferring(&all, Some("b")).map(|w| w.id.as_str()),
                Some("b")
            );
        }
        // Not a candidate (full, excluded, gone): ordinary choice.
        let only_a: Vec<&WorkerRecord> = workers.iter().filter(|w| w.id == "a").collect();
        assert_eq!(
            pick_preferring(&only_a, Some("b")).map(|w| w.id.as_str()),
            Some("a")
        );
        hints.remove("ns/x");
        assert_eq!(hints.worker_for("ns/x", 3), None);
    }
}
