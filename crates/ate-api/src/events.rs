//! The actor-event feed behind WatchEvents and WatchActors, and event retention.
//!
//! Events are rows the store writes with each state change (`ate_store::ActorEvent`), by this
//! api or any other replica on the same store, so the feed reads them from the store: one poller
//! per api process, every [`POLL_EVERY`] while anyone watches (nothing while no one does),
//! fanned out to the watchers over a broadcast channel. A watcher sends what it backfilled from
//! the store first, then what the feed brings, skipping what it already sent.
//!
//! PostgreSQL hands out ids when a transaction inserts, not when it commits, so a poller can see
//! id 7 before id 6 commits. [`Cursor`] keeps the ids it skipped over for [`GAP_WAIT`] and asks
//! for them again, so such a late event is still delivered (after newer ones); an id that never
//! appears (a rolled-back transaction) is given up after that wait.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_core::clock::now_ms;
use ate_store::{ActorEvent, EventQuery, Store};
use tokio::sync::broadcast;
use tokio::time::Instant;

/// How often the feed reads new events while someone watches: well within the 1 s an operator
/// expects a watch to show a change in.
pub const POLL_EVERY: Duration = Duration::from_millis(250);
/// How long a skipped id is waited for (a transaction that inserted it and has not committed).
pub const GAP_WAIT: Duration = Duration::from_secs(10);
/// Most ids one read may skip over and still wait for: a larger jump is not a transaction in
/// flight (nothing skips that many), and waiting for each would cost memory for nothing.
const MAX_GAP: i64 = 10_000;
/// Events read per store query.
const BATCH: u32 = 1000;
/// Events a watcher may fall behind by before it is ended (it lists again).
const CHANNEL: usize = 8192;

/// What the feed has delivered so far: everything up to `after`, except the ids in `gaps`,
/// which it skipped over and still waits for.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    after: i64,
    gaps: BTreeMap<i64, Instant>,
}

impl Cursor {
    /// A cursor that delivers what comes after `id`.
    pub fn after(id: i64) -> Self {
        Self {
            after: id,
            gaps: BTreeMap::new(),
        }
    }

    /// The id a read should start after: below the oldest gap, so a late commit is read.
    pub fn read_after(&self) -> i64 {
        self.gaps
            .keys()
            .next()
            .map_or(self.after, |oldest| oldest - 1)
    }

    /// Takes a batch read after [`Self::read_after`] (ids increasing) and returns which of its
    /// events are new; records the ids skipped over as gaps, and gives up gaps older than
    /// [`GAP_WAIT`] at `now`.
    pub fn accept(&mut self, ids: &[i64], now: Instant) -> Vec<bool> {
        let mut fresh = Vec::with_capacity(ids.len());
        for &id in ids {
            if id <= self.after {
                fresh.push(self.gaps.remove(&id).is_some());
                continue;
            }
            if id - self.after <= MAX_GAP {
                for missing in self.after + 1..id {
                    self.gaps.insert(missing, now);
                }
            }
            self.after = id;
            fresh.push(true);
        }
        self.gaps
            .retain(|_, since| now.duration_since(*since) < GAP_WAIT);
        fresh
    }
}

/// Shared by the api's watchers: subscribe, then backfill, then take what comes.
pub struct Feed {
    store: Arc<dyn Store>,
    sender: broadcast::Sender<Arc<ActorEvent>>,
    /// Whether a poller runs. Taken by a subscriber (to start one) and by the poller (to end
    /// when no one is subscribed), so a subscriber never counts on a poller that is ending.
    polling: Arc<Mutex<bool>>,
}

impl Feed {
    pub fn new(store: Arc<dyn Store>) -> Self {
        let (sender, _) = broadcast::channel(CHANNEL);
        Self {
            store,
            sender,
            polling: Arc::new(Mutex::new(false)),
        }
    }

    /// Every event recorded from now on (and some recorded shortly before), in the order the
    /// feed read them; starts the poller if it is not running.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<ActorEvent>> {
        let mut polling = self.polling.lock().unwrap_or_else(|e| e.into_inner());
        let receiver = self.sender.subscribe();
        if !*polling {
            *polling = true;
            tokio::spawn(poll(
                self.store.clone(),
                self.sender.clone(),
                self.polling.clone(),
            ));
        }
        receiver
    }
}

/// Reads new events while anyone is subscribed, then ends (the next subscriber starts it again;
/// what was committed meanwhile is the subscribers' backfill).
async fn poll(
    store: Arc<dyn Store>,
    sender: broadcast::Sender<Arc<ActorEvent>>,
    polling: Arc<Mutex<bool>>,
) {
    let mut cursor = None::<Cursor>;
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if sender.receiver_count() == 0 {
            let mut polling = polling.lock().unwrap_or_else(|e| e.into_inner());
            // Checked again under the lock: a subscriber that came meanwhile keeps it going.
            if sender.receiver_count() == 0 {
                *polling = false;
                return;
            }
        }
        let c = match cursor.as_mut() {
            Some(c) => c,
            None => {
                let head = store.list_events(&EventQuery::default()).await;
                match head {
                    Ok(page) => cursor.insert(Cursor::after(page.newest_id)),
                    Err(e) => {
                        tracing::warn!(error = %e, "event feed: cannot read the newest event");
                        continue;
                    }
                }
            }
        };
        // Everything new, in batches; a store error waits for the next tick.
        loop {
            let query = EventQuery {
                after_id: c.read_after(),
                limit: BATCH,
                ..EventQuery::default()
            };
            let page = match store.list_events(&query).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "event feed: reading events failed");
                    break;
                }
            };
            let ids: Vec<i64> = page.events.iter().map(|e| e.id).collect();
            let fresh = c.accept(&ids, Instant::now());
            for (event, fresh) in page.events.into_iter().zip(fresh) {
                if fresh {
                    // No receiver left: nothing to do; the next tick ends the poller.
                    let _ = sender.send(Arc::new(event));
                }
            }
            if (ids.len() as u32) < BATCH {
                break;
            }
        }
    }
}

/// Which events a watcher wants.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    pub atespace: Option<String>,
    pub name: Option<String>,
}

impl Selector {
    pub fn matches(&self, e: &ActorEvent) -> bool {
        self.atespace.as_ref().is_none_or(|a| a == &e.atespace)
            && self.name.as_ref().is_none_or(|n| n == &e.name)
    }
}

/// Ids a watcher sent from its backfill, so the feed's copies of them are not sent twice.
#[derive(Debug, Default)]
pub struct Sent {
    ids: HashSet<i64>,
    newest: i64,
}

impl Sent {
    pub fn record(&mut self, id: i64) {
        self.ids.insert(id);
        self.newest = self.newest.max(id);
    }

    /// Whether an event the feed brings was already sent: every id above the newest backfilled
    /// one is new; below it, only those the backfill did not have.
    pub fn already(&self, id: i64) -> bool {
        id <= self.newest && self.ids.contains(&id)
    }
}

/// Events of `selector` after `after_id`, in pages, for a watcher's backfill.
pub async fn backfill(
    store: &dyn Store,
    selector: &Selector,
    after_id: i64,
) -> ate_store::Result<Vec<ActorEvent>> {
    let mut out = Vec::new();
    let mut after = after_id;
    loop {
        let page = store
            .list_events(&EventQuery {
                atespace: selector.atespace.clone(),
                name: selector.name.clone(),
                after_id: after,
                limit: BATCH,
                newest: false,
            })
            .await?;
        let full = page.events.len() as u32 == BATCH;
        if let Some(last) = page.events.last() {
            after = last.id;
        }
        out.extend(page.events);
        if !full {
            return Ok(out);
        }
    }
}

/// Deletes events older than `retention`, every minute, until `stop` flips.
pub async fn retention(
    store: Arc<dyn Store>,
    retention: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    const EVERY: Duration = Duration::from_secs(60);
    const BATCH_DELETE: u32 = 5000;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let before =
            now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        // In batches, so a large backlog never holds the store's write lock for long.
        loop {
            match store.prune_events(before, BATCH_DELETE).await {
                Ok(n) if n == u64::from(BATCH_DELETE) => tokio::task::yield_now().await,
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(deleted = n, "old actor events deleted");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "deleting old actor events failed");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_delivers_each_id_once_and_waits_for_gaps() {
        let t0 = Instant::now();
        let mut c = Cursor::after(5);
        assert_eq!(c.read_after(), 5);
        // 6 committed, 7 not yet, 8 committed: 7 is a gap, read again from 6.
        assert_eq!(c.accept(&[6, 8], t0), vec![true, true]);
        assert_eq!(c.read_after(), 6);
        // 7 commits: the re-read brings 7 (new) and 8 (seen).
        assert_eq!(c.accept(&[7, 8, 9], t0), vec![true, false, true]);
        assert_eq!(c.read_after(), 9);
        // A gap that never fills (rolled back) is given up after GAP_WAIT.
        assert_eq!(c.accept(&[11], t0), vec![true]);
        assert_eq!(c.read_after(), 9);
        assert_eq!(c.accept(&[11], t0 + GAP_WAIT), vec![false]);
        assert_eq!(c.read_after(), 11);
    }

    #[test]
    fn sent_skips_only_backfilled_ids() {
        let mut sent = Sent::default();
        sent.record(3);
        sent.record(5);
        assert!(sent.already(3) && sent.already(5));
        // 4 committed late: the backfill did not have it, the feed brings it.
        assert!(!sent.already(4));
        assert!(!sent.already(6));
    }

    #[test]
    fn a_selector_matches_atespace_and_name() {
        let e = ActorEvent {
            id: 1,
            time_ms: 0,
            atespace: "ns".into(),
            name: "a".into(),
            uid: String::new(),
            kind: ate_store::EventKind::Normal,
            reason: "Created".into(),
            from_state: None,
            to_state: None,
            worker_id: None,
            generation: 0,
            message: String::new(),
        };
        assert!(Selector::default().matches(&e));
        let ns = |a: &str, n: Option<&str>| Selector {
            atespace: Some(a.into()),
            name: n.map(str::to_string),
        };
        assert!(ns("ns", None).matches(&e));
        assert!(ns("ns", Some("a")).matches(&e));
        assert!(!ns("ns", Some("b")).matches(&e));
        assert!(!ns("other", None).matches(&e));
    }
}
