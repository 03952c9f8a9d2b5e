//! Assignment cache (AgentGateway-style): an actor's worker is reused for `--assignment-cache-ttl`
//! without asking the api. Bounded; only successful resolutions are stored (negative results
//! never are, so unknown actors cannot grow it); a 421 stale answer evicts the entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::actor_ref::ActorKey;

/// Where an actor is served: its worker's atunnel address.
#[derive(Debug, PartialEq, Eq)]
pub struct Route {
    /// `host:port` of the worker's atunnel listener.
    pub worker: Arc<str>,
    pub worker_id: String,
    pub epoch: u64,
    /// The worker's SPIFFE ID from the assignment, pinned when the router dials atunnel over mTLS.
    pub worker_identity: String,
    /// The activation's fencing token, sent on every CONNECT (`ate-activation`).
    pub activation: u64,
    /// The actor's template has `webSockets: hibernate` (docs/websockets.md).
    pub hibernate_web_sockets: bool,
}

struct Entry {
    route: Arc<Route>,
    expires: Instant,
}

pub struct AssignmentCache {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<ActorKey, Entry>>,
}

impl AssignmentCache {
    /// `ttl` zero disables the cache (every request asks the api).
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    /// The live assignment of `actor` (`<atespace>/<name>`), if any.
    pub fn get(&self, actor: &str) -> Option<Arc<Route>> {
        if !self.enabled() {
            return None;
        }
        let entries = self.lock();
        let entry = entries.get(actor)?;
        // An expired entry stays (until evicted or replaced) as the last known route.
        (entry.expires > Instant::now()).then(|| entry.route.clone())
    }

    /// The last route the api gave for `actor`, expired at most `max_stale` ago: used only while
    /// the api cannot be asked. Safe because atunnel serves it only if the worker still holds that
    /// activation (fencing token) under a valid lease; otherwise it answers 421.
    pub fn last_known(&self, actor: &str, max_stale: Duration) -> Option<Arc<Route>> {
        if !self.enabled() {
            return None;
        }
        let entries = self.lock();
        let entry = entries.get(actor)?;
        (entry.expires + max_stale > Instant::now()).then(|| entry.route.clone())
    }

    /// Whether `actor` has a live assignment (like [`AssignmentCache::get`], without the route).
    pub fn contains(&self, actor: &str) -> bool {
        self.enabled()
            && self
                .lock()
                .get(actor)
                .is_some_and(|entry| entry.expires > Instant::now())
    }

    pub fn insert(&self, actor: ActorKey, route: Arc<Route>) {
        if !self.enabled() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(actor.as_str()) {
            entries.retain(|_, e| e.expires > now);
            // Still full of live entries: drop an arbitrary one; the cost is one extra api call.
            if entries.len() >= self.capacity
                && let Some(victim) = entries.keys().next().cloned()
            {
                entries.remove(&victim);
            }
        }
        entries.insert(
            actor,
            Entry {
                route,
                expires: now + self.ttl,
            },
        );
    }

    /// Drops `actor`'s entry if it still points at `stale` (a newer entry is kept).
    pub fn evict_stale(&self, actor: &str, stale: &Arc<Route>) {
        let mut entries = self.lock();
        if entries
            .get(actor)
            .is_some_and(|e| Arc::ptr_eq(&e.route, stale) || e.route == *stale)
        {
            entries.remove(actor);
        }
    }

    pub fn evict(&self, actor: &str) {
        self.lock().remove(actor);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ActorKey, Entry>> {
        // The map stays consistent even if a holder panicked: every operation is one call.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(worker: &str) -> Arc<Route> {
        Arc::new(Route {
            worker: Arc::from(worker),
            worker_id: "w".into(),
            worker_identity: String::new(),
            epoch: 1,
            activation: 1,
            hibernate_web_sockets: false,
        })
    }

    fn key(s: &str) -> ActorKey {
        ActorKey::parse(s).unwrap()
    }

    #[test]
    fn hit_then_expire() {
        let cache = AssignmentCache::new(Duration::from_millis(50), 10);
        cache.insert(key("a/b"), route("127.0.0.2:8443"));
        assert_eq!(&*cache.get("a/b").unwrap().worker, "127.0.0.2:8443");
        assert!(cache.contains("a/b"));
        assert!(cache.get("a/c").is_none());
        assert!(!cache.contains("a/c"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!cache.contains("a/b"));
        assert!(cache.get("a/b").is_none());
        // Kept as the last known route, for a while, for when the api cannot be asked.
        assert!(cache.last_known("a/b", Duration::from_secs(1)).is_some());
        assert!(cache.last_known("a/b", Duration::ZERO).is_none());
        cache.evict("a/b");
        assert!(cache.last_known("a/b", Duration::from_secs(1)).is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn zero_ttl_disables() {
        let cache = AssignmentCache::new(Duration::ZERO, 10);
        cache.insert(key("a/b"), route("x:1"));
        assert!(cache.get("a/b").is_none());
        assert!(!cache.contains("a/b"));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn bounded() {
        let cache = AssignmentCache::new(Duration::from_secs(60), 100);
        for i in 0..10_000 {
            cache.insert(key(&format!("a/n{i}")), route("x:1"));
            assert!(cache.len() <= 100);
        }
        assert!(cache.get("a/n9999").is_some());
    }

    #[test]
    fn evict_only_the_stale_route() {
        let cache = AssignmentCache::new(Duration::from_secs(60), 10);
        let old = route("old:1");
        cache.insert(key("a/b"), old.clone());
        let new = route("new:1");
        cache.insert(key("a/b"), new.clone());
        cache.evict_stale("a/b", &old);
        assert_eq!(cache.get("a/b"), Some(new.clone()));
        cache.evict_stale("a/b", &new);
        assert!(cache.get("a/b").is_none());
        cache.insert(key("a/b"), new);
        cache.evict("a/b");
        assert!(cache.get("a/b").is_none());
    }
}
