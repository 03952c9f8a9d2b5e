//! Placement: an in-memory view of the fleet, filters, and the power of two random choices.

use std::collections::{BTreeMap, HashMap};
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
        crate::metrics::fleet(&workers);
        *self.cached.write().await = (Instant::now(), workers.clone());
        Ok(workers)
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
    /// Restore capabilities the worker must offer (`ate_core::capability`): what the newest
    /// generation needs to come back whole. Empty for a cold boot or a file-only restore.
    pub capabilities: &'a [String],
}

/// What a worker offers (its advertised capabilities, or those derived for a worker that
/// advertised none).
pub fn offered(w: &WorkerRecord) -> Vec<String> {
    ate_core::capability::offered(&w.capabilities, w.can_restore_memory)
}

/// Does `w` offer every capability in `required`?
pub fn capable(w: &WorkerRecord, required: &[String]) -> bool {
    required.is_empty() || ate_core::capability::missing(required, &offered(w)).is_empty()
}

/// Why no worker passed the filters, when the capability filter is the reason: the required
/// capabilities that no worker passing every other filter (room aside) offers, or all of them
/// when each is offered somewhere but never together. Empty when some such worker offers them
/// all (it is full: the reason is room), or when no worker passes the other filters either.
pub fn missing_everywhere(workers: &[WorkerRecord], req: &Requirements<'_>) -> Vec<String> {
    if req.capabilities.is_empty() {
        return Vec::new();
    }
    let others: Vec<Vec<String>> = workers
        .iter()
        .filter(|w| suitable_but_capable(w, req))
        .map(offered)
        .collect();
    if others.is_empty()
        || others
            .iter()
            .any(|o| ate_core::capability::missing(req.capabilities, o).is_empty())
    {
        return Vec::new();
    }
    let nowhere: Vec<String> = req
        .capabilities
        .iter()
        .filter(|c| !others.iter().any(|o| o.contains(c)))
        .cloned()
        .collect();
    if nowhere.is_empty() {
        req.capabilities.to_vec()
    } else {
        nowhere
    }
}

/// Workers that pass every filter.
pub fn eligible<'w>(workers: &'w [WorkerRecord], req: &Requirements<'_>) -> Vec<&'w WorkerRecord> {
    workers
        .iter()
        .filter(|w| suitable(w, req))
        .filter(|w| w.capacity.fits(&w.used, &req.demand))
        .collect()
}

/// Workers that pass every filter but room: where room could be made.
pub fn suitable_workers<'w>(
    workers: &'w [WorkerRecord],
    req: &Requirements<'_>,
) -> Vec<&'w WorkerRecord> {
    workers.iter().filter(|w| suitable(w, req)).collect()
}

/// Every filter except room: the worker could host the actor if it had room.
fn suitable(w: &WorkerRecord, req: &Requirements<'_>) -> bool {
    suitable_but_capable(w, req) && capable(w, req.capabilities)
}

/// Every filter except room and capabilities.
fn suitable_but_capable(w: &WorkerRecord, req: &Requirements<'_>) -> bool {
    w.status == WorkerStatus::Active
        && w.sandbox_class == req.sandbox_class
        && req.node.is_none_or(|n| w.node == n)
        && ate_core::selector::matches(&req.selector, &w.labels)
        && !req.exclude.contains(&w.id)
}

/// Load of a worker: the fullest of its dimensions, as a fraction.
fn load(w: &WorkerRecord) -> f64 {
    load_with(w, &w.used)
}

/// The machine CPU a worker offers before overcommit (its whole CPU capacity for a worker that
/// did not report it).
fn physical_cpu(w: &WorkerRecord) -> u64 {
    match w.cpu_physical_millis {
        0 => w.capacity.cpu_millis,
        n => n,
    }
}

/// Load of a worker if `used` were booked: the fullest of slots, memory and CPU, as a
/// fraction. CPU is the larger of what is booked (against the overcommitted capacity) and what
/// its actors really used lately (against the machine's CPU): with overcommit, bookings of idle
/// actors say little, so a worker whose actors are busy looks loaded however few it holds, and
/// placement prefers the least busy worker.
fn load_with(w: &WorkerRecord, used: &Capacity) -> f64 {
    let frac = |used: u64, cap: u64| {
        if cap == 0 {
            1.0
        } else {
            used as f64 / cap as f64
        }
    };
    frac(used.slots, w.capacity.slots)
        .max(frac(used.cpu_millis, w.capacity.cpu_millis))
        .max(frac(w.cpu_usage_millis, physical_cpu(w)))
        .max(frac(used.memory_bytes, w.capacity.memory_bytes))
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

// ------------------------------------------------------------------ admission queue

/// How long a waiter keeps its claim on free room after its last failed attempt. The router
/// retries a parked resume at most ~0.61 s apart within its 5 s budget (100 ms × 1.1ⁿ + ≤ 10 %
/// jitter), so a waiter whose client is still parked attempts again well inside this window.
pub const WAITER_HOLD: Duration = Duration::from_secs(1);
/// A waiter forgotten this long after its last attempt (the router's 5 s budget + slack): a
/// client that asks again within it keeps its place in the queue.
pub const WAITER_EXPIRY: Duration = Duration::from_secs(6);
/// Waiters kept at most; a resume that finds the queue full is just not recorded (no priority).
const MAX_WAITERS: usize = 1 << 16;
/// Older waiters whose room is set aside for one admission, oldest first; later ones keep their
/// place in the queue but are not protected from a newcomer until they move up.
const MAX_SET_ASIDE: usize = 64;

/// What a waiting resume needs from a worker: enough to tell whether free room fits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    pub selector: BTreeMap<String, String>,
    pub sandbox_class: String,
    pub demand: Capacity,
    /// Restore capabilities (see [`Requirements::capabilities`]).
    pub capabilities: Vec<String>,
}

impl Needs {
    fn requirements(&self) -> Requirements<'_> {
        Requirements {
            selector: self.selector.clone(),
            sandbox_class: &self.sandbox_class,
            // A node-local generation can be detached (uploaded) to move, so no node pin.
            node: None,
            demand: self.demand,
            exclude: &[],
            capabilities: &self.capabilities,
        }
    }
}

#[derive(Debug)]
struct Waiter {
    /// First failed attempt: the place in the queue.
    since: Instant,
    /// Tie-break for equal `since`.
    seq: u64,
    last_attempt: Instant,
    needs: Needs,
}

#[derive(Debug)]
struct Queue {
    waiters: HashMap<String, Waiter>,
    /// Per atespace with waiters: how many of its waiters left the queue admitted since it
    /// began to wait (forgotten once none of it waits).
    served: HashMap<String, usize>,
    next_seq: u64,
    hold: Duration,
    expiry: Duration,
}

impl Queue {
    fn prune(&mut self, now: Instant) {
        let expiry = self.expiry;
        self.waiters
            .retain(|_, w| now.saturating_duration_since(w.last_attempt) <= expiry);
        self.forget_served();
    }

    /// Drops the served counts of atespaces none of whose resumes waits any more.
    fn forget_served(&mut self) {
        if self.served.is_empty() {
            return;
        }
        let waiting: std::collections::HashSet<&str> =
            self.waiters.keys().map(|k| atespace_of(k)).collect();
        self.served
            .retain(|atespace, _| waiting.contains(atespace.as_str()));
    }
}

/// The atespace of an actor key (`<atespace>/<name>`).
fn atespace_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(a, _)| a)
}

/// The admission queue: cold resumes that found no room, so that freed capacity goes to the
/// waiting resume whose turn it is (`fair_order`: round the atespaces that wait, oldest first
/// within one) instead of whichever request asks first after the release (usually the client
/// whose actor was just suspended).
///
/// A cold resume of actor X may take room only if X still fits after the room that every live
/// waiter *ahead of it* fits into has been set aside (in turn order, each on a worker X cannot
/// use if it has one, else the least loaded). Live = its last attempt is at most `hold` old: a
/// parked request retries well within that, and a vanished client stops holding room after
/// it. A waiter that fits nowhere sets nothing aside (no head-of-line blocking: a small actor
/// may take room a big one cannot use). A waiter leaves the queue when it is bound, deleted,
/// or `expiry` after its last attempt.
///
/// The queue only decides who may *try*; the store's bind transaction still guarantees
/// capacity. It is per api process: with several replicas each orders its own callers.
#[derive(Debug)]
pub struct Waiters(std::sync::Mutex<Queue>);

impl Default for Waiters {
    fn default() -> Self {
        Self::new(WAITER_HOLD, WAITER_EXPIRY)
    }
}

fn add(a: Capacity, b: Capacity) -> Capacity {
    Capacity {
        cpu_millis: a.cpu_millis.saturating_add(b.cpu_millis),
        memory_bytes: a.memory_bytes.saturating_add(b.memory_bytes),
        slots: a.slots.saturating_add(b.slots),
    }
}

fn has_room(w: &WorkerRecord, aside: Capacity, demand: &Capacity) -> bool {
    w.capacity.fits(&add(w.used, aside), demand)
}

/// A waiter's place in the admission order: its turn — its atespace's waiters admitted since
/// that atespace began to wait, plus its rank among those still waiting (0: the oldest) — then
/// its age. Room goes round the atespaces that wait — the oldest of each, then the second of
/// each — so one atespace with a thousand waiting resumes does not take every slot that frees
/// while another's wait; within an atespace, oldest first.
type Place = (usize, Instant, u64);

/// Every waiter's [`Place`], by actor key (`<atespace>/<name>`).
fn fair_order(q: &Queue) -> HashMap<&str, Place> {
    let mut by_atespace: HashMap<&str, Vec<(&str, Instant, u64)>> = HashMap::new();
    for (key, w) in &q.waiters {
        let atespace = atespace_of(key);
        by_atespace
            .entry(atespace)
            .or_default()
            .push((key.as_str(), w.since, w.seq));
    }
    let mut places = HashMap::with_capacity(q.waiters.len());
    for (atespace, mut group) in by_atespace {
        let served = q.served.get(atespace).copied().unwrap_or(0);
        group.sort_by_key(|(_, since, seq)| (*since, *seq));
        for (rank, (key, since, seq)) in group.into_iter().enumerate() {
            places.insert(key, (served.saturating_add(rank), since, seq));
        }
    }
    places
}

impl Waiters {
    pub fn new(hold: Duration, expiry: Duration) -> Self {
        Self(std::sync::Mutex::new(Queue {
            waiters: HashMap::new(),
            served: HashMap::new(),
            next_seq: 0,
            hold,
            expiry,
        }))
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        match self.0.lock() {
            Ok(q) => q,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Changes the hold and expiry windows (tests).
    pub fn set_timing(&self, hold: Duration, expiry: Duration) {
        let mut q = self.queue();
        q.hold = hold;
        q.expiry = expiry;
    }

    /// A cold resume of `actor` found no room at `now`: it joins the queue, or keeps its place
    /// and renews its claim if it is waiting already.
    pub fn no_room(&self, actor: &str, needs: Needs, now: Instant) {
        let mut q = self.queue();
        q.prune(now);
        if let Some(w) = q.waiters.get_mut(actor) {
            w.last_attempt = now;
            w.needs = needs;
        } else if q.waiters.len() < MAX_WAITERS {
            let seq = q.next_seq;
            q.next_seq += 1;
            q.waiters.insert(
                actor.to_string(),
                Waiter {
                    since: now,
                    seq,
                    last_attempt: now,
                    needs,
                },
            );
        }
        metrics::gauge!(crate::metrics::ADMISSION_WAITERS).set(q.waiters.len() as f64);
    }

    /// `actor` was admitted (bound to a worker) or deleted.
    pub fn remove(&self, actor: &str) {
        let mut q = self.queue();
        if q.waiters.remove(actor).is_some() {
            *q.served.entry(atespace_of(actor).to_string()).or_default() += 1;
            q.forget_served();
            metrics::gauge!(crate::metrics::ADMISSION_WAITERS).set(q.waiters.len() as f64);
        }
    }

    /// Actors waiting at `now`, in the order room goes to them (`fair_order`; expired ones
    /// dropped).
    pub fn queued(&self, now: Instant) -> Vec<String> {
        let mut q = self.queue();
        q.prune(now);
        let mut all: Vec<(Place, &str)> = fair_order(&q)
            .into_iter()
            .map(|(k, place)| (place, k))
            .collect();
        all.sort();
        all.into_iter().map(|(_, k)| k.to_string()).collect()
    }

    /// The workers `actor` (with `req`) may be placed on at `now`: those of `eligible` that
    /// still have room for it once the room of older live waiters is set aside.
    pub fn admissible<'w>(
        &self,
        actor: &str,
        req: &Requirements<'_>,
        workers: &'w [WorkerRecord],
        now: Instant,
    ) -> Vec<&'w WorkerRecord> {
        let candidates = eligible(workers, req);
        if candidates.is_empty() {
            return candidates;
        }
        let older = {
            let mut q = self.queue();
            q.prune(now);
            if q.waiters.is_empty() {
                return candidates;
            }
            let places = fair_order(&q);
            let mine = places.get(actor).copied();
            let hold = q.hold;
            let mut older: Vec<(Place, Needs)> = q
                .waiters
                .iter()
                .filter(|(k, _)| k.as_str() != actor)
                .filter(|(_, w)| now.saturating_duration_since(w.last_attempt) <= hold)
                .filter_map(|(k, w)| Some((*places.get(k.as_str())?, w)))
                .filter(|(place, _)| mine.is_none_or(|m| *place < m))
                .map(|(place, w)| (place, w.needs.clone()))
                .collect();
            older.sort_by_key(|w| w.0);
            older.truncate(MAX_SET_ASIDE);
            older
        };
        if older.is_empty() {
            return candidates;
        }
        let mut aside = vec![Capacity::default(); workers.len()];
        let x_can_use = |i: usize, aside: &[Capacity]| {
            suitable(&workers[i], req) && has_room(&workers[i], aside[i], &req.demand)
        };
        for (_, needs) in &older {
            let yreq = needs.requirements();
            let spot = (0..workers.len())
                .filter(|&i| {
                    suitable(&workers[i], &yreq) && has_room(&workers[i], aside[i], &needs.demand)
                })
                .min_by(|&a, &b| {
                    // A worker X cannot use first, then the least loaded.
                    let key = |i: usize| {
                        let load = load_with(&workers[i], &add(workers[i].used, aside[i]));
                        (x_can_use(i, &aside), load)
                    };
                    let (ka, kb) = (key(a), key(b));
                    ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
                });
            if let Some(i) = spot {
                aside[i] = add(aside[i], needs.demand);
            }
        }
        let admissible: Vec<&WorkerRecord> = workers
            .iter()
            .enumerate()
            .filter(|&(i, _)| x_can_use(i, &aside))
            .map(|(_, w)| w)
            .collect();
        if admissible.is_empty() {
            metrics::counter!(crate::metrics::ADMISSION_DEFERRED).increment(1);
            tracing::debug!(
                actor,
                older = older.len(),
                "free room is held for older waiting resumes"
            );
        }
        admissible
    }
}

#[cfg(test)]
mod tests;
