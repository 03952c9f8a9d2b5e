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
}
