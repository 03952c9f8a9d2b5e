//! Request parking: the limit on parked requests (`--parked-request-max`), shared fairly
//! between atespaces, the place a parked request holds (released on drop, so a client that goes
//! away frees it at once), and the retry backoff (100 ms, ×1.1, with jitter).
//!
//! Fair shares: while the lot has free places anyone may park (nothing is left idle). Once it
//! is full, a request of an atespace holding fewer than its share (the lot divided by the
//! atespaces parked, its own included) takes the newest place of the atespace furthest over its
//! share, whose request is shed with the lot-full 503; one at or over its share is refused. So a
//! flood from one atespace cannot hold every place while another waits: two flooding atespaces
//! end up with half each, three with a third.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::metrics::{PARKING_ACTIVE, PARKING_REJECTED, PARKING_WAIT, Stats};

/// How a parked request's wait ended (label `outcome` of the wait histogram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Served,
    Timeout,
    Canceled,
    Error,
    /// Its place went to an atespace below its fair share.
    Shed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Timeout => "timeout",
            Outcome::Canceled => "canceled",
            Outcome::Error => "error",
            Outcome::Shed => "shed",
        }
    }
}

/// Who holds the places now.
#[derive(Default)]
struct Places {
    total: usize,
    next_id: u64,
    /// Per atespace: its places' ids (oldest first) and how to tell each it was shed.
    by_atespace: HashMap<String, Vec<(u64, Arc<Notify>)>>,
}

/// The limit on parked requests.
pub struct ParkingLot {
    /// 0: parking off.
    max: usize,
    places: Arc<Mutex<Places>>,
    stats: Arc<Stats>,
}

impl ParkingLot {
    /// `max == 0` turns parking off.
    pub fn new(max: usize, stats: Arc<Stats>) -> Self {
        Self {
            max,
            places: Arc::new(Mutex::new(Places::default())),
            stats,
        }
    }

    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    /// Takes a place for a request of `atespace`, or `None` (the caller sheds the request;
    /// counted here) when the lot is full and the atespace holds its share already. With
    /// parking off, a place is never needed and this returns `None` without counting.
    pub fn try_park(&self, atespace: &str) -> Option<ParkingPlace> {
        if self.max == 0 {
            return None;
        }
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        if places.total >= self.max && !shed_for(&mut places, atespace, self.max, &self.stats) {
            drop(places);
            self.stats.parking_rejected.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(PARKING_REJECTED).increment(1);
            return None;
        }
        places.next_id += 1;
        let id = places.next_id;
        let shed = Arc::new(Notify::new());
        places
            .by_atespace
            .entry(atespace.to_string())
            .or_default()
            .push((id, shed.clone()));
        places.total += 1;
        drop(places);
        self.stats.parking_active.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(PARKING_ACTIVE).increment(1.0);
        Some(ParkingPlace {
            id,
            atespace: atespace.to_string(),
            places: self.places.clone(),
            shed,
            since: Instant::now(),
            outcome: Outcome::Canceled,
            stats: self.stats.clone(),
        })
    }
}

/// The lot is full: frees a place for `atespace` if it holds fewer than its share, taking the
/// newest place of the atespace furthest over its share (its request is told to go).
fn shed_for(places: &mut Places, atespace: &str, max: usize, stats: &Stats) -> bool {
    let mine = places.by_atespace.get(atespace).map_or(0, Vec::len);
    let parked = places.by_atespace.len() + usize::from(mine == 0);
    let share = (max / parked.max(1)).max(1);
    if mine >= share {
        return false;
    }
    let Some(victim) = places
        .by_atespace
        .iter()
        .filter(|(_, held)| held.len() > share)
        .max_by_key(|(_, held)| held.len())
        .map(|(a, _)| a.clone())
    else {
        return false;
    };
    let Some(held) = places.by_atespace.get_mut(&victim) else {
        return false;
    };
    let Some((_, shed)) = held.pop() else {
        return false;
    };
    if held.is_empty() {
        places.by_atespace.remove(&victim);
    }
    places.total -= 1;
    stats.parking_active.fetch_sub(1, Ordering::Relaxed);
    metrics::gauge!(PARKING_ACTIVE).decrement(1.0);
    stats.parking_rejected.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(PARKING_REJECTED).increment(1);
    shed.notify_one();
    true
}

/// One parked request's place. Dropping it (request answered or its future dropped because the
/// client went away) frees the place and records the wait; the outcome stays `canceled` unless set.
pub struct ParkingPlace {
    id: u64,
    atespace: String,
    places: Arc<Mutex<Places>>,
    shed: Arc<Notify>,
    since: Instant,
    outcome: Outcome,
    stats: Arc<Stats>,
}

impl ParkingPlace {
    pub fn finish(mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Resolves when the place was given to an atespace below its share: the request must be
    /// answered with the lot-full 503 now.
    pub async fn shed(&self) {
        self.shed.notified().await
    }
}

impl Drop for ParkingPlace {
    fn drop(&mut self) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        // A shed place was taken out already (and counted) by the one who took it.
        let held = places.by_atespace.get_mut(&self.atespace).and_then(|held| {
            let at = held.iter().position(|(id, _)| *id == self.id)?;
            held.remove(at);
            Some(held.is_empty())
        });
        if let Some(now_empty) = held {
            if now_empty {
                places.by_atespace.remove(&self.atespace);
            }
            places.total -= 1;
            drop(places);
            self.stats.parking_active.fetch_sub(1, Ordering::Relaxed);
            metrics::gauge!(PARKING_ACTIVE).decrement(1.0);
        } else {
            self.outcome = Outcome::Shed;
        }
        metrics::histogram!(PARKING_WAIT, "outcome" => self.outcome.label())
            .record(self.since.elapsed().as_secs_f64());
    }
}

pub use ate_core::backoff::Backoff;

/// Retry delays: ×1.1 each time, plus up to 10 % random so that parked resumes of many actors
/// do not hit the api in lockstep. No cap: the parking budget bounds the retries.
pub const RETRY_BACKOFF: ate_core::backoff::Policy = ate_core::backoff::Policy {
    factor: 1.1,
    max: Duration::MAX,
    jitter: (1.0, 1.1),
};

/// [`RETRY_BACKOFF`] from `initial`; draw each delay's jitter with `rand::random()`.
pub fn backoff(initial: Duration) -> Backoff {
    Backoff::new(initial, &RETRY_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_by_a_tenth_with_jitter() {
        let mut b = backoff(Duration::from_millis(100));
        let mut base = 100.0;
        for _ in 0..20 {
            let d = b.next_delay(rand::random()).as_secs_f64() * 1000.0;
            assert!(d >= base - 1e-6 && d <= base * 1.1 + 1e-6, "{d} vs {base}");
            base *= 1.1;
        }
    }

    #[test]
    fn places_are_limited_and_released_on_drop() {
        let stats = Arc::new(Stats::default());
        let lot = ParkingLot::new(2, stats.clone());
        let a = lot.try_park("ns").unwrap();
        let b = lot.try_park("ns").unwrap();
        assert!(lot.try_park("ns").is_none());
        assert_eq!(Stats::get(&stats.parking_rejected), 1);
        assert_eq!(Stats::get(&stats.parking_active), 2);
        drop(a);
        b.finish(Outcome::Served);
        assert_eq!(Stats::get(&stats.parking_active), 0);
        assert!(lot.try_park("ns").is_some());
    }

    /// A place shed: its `shed()` resolves at once.
    fn was_shed(p: &ParkingPlace) -> bool {
        use std::future::Future;
        let mut shed = Box::pin(p.shed());
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        shed.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn a_full_lot_is_shared_between_the_atespaces_that_wait() {
        let stats = Arc::new(Stats::default());
        let lot = ParkingLot::new(4, stats.clone());
        // Alone, one atespace may take every place.
        let a: Vec<_> = (0..4).map(|_| lot.try_park("a").unwrap()).collect();
        // Another arrives: it takes the newest of a's places until each holds 4 / 2.
        let b1 = lot.try_park("b").unwrap();
        assert!(was_shed(&a[3]) && !was_shed(&a[2]));
        let b2 = lot.try_park("b").unwrap();
        assert!(was_shed(&a[2]) && !was_shed(&a[1]));
        // At its share, with the lot full: refused, and so is a.
        assert!(lot.try_park("b").is_none());
        assert!(lot.try_park("a").is_none());
        assert_eq!(Stats::get(&stats.parking_active), 4);
        assert_eq!(Stats::get(&stats.parking_rejected), 4, "2 shed + 2 refused");
        // A third atespace gets 4 / 3 = 1: from the one most over it (a tie: either).
        let c = lot.try_park("c").unwrap();
        assert_eq!(Stats::get(&stats.parking_active), 4);
        assert!(lot.try_park("c").is_none());
        // Shed places dropped later change nothing; a freed place is anyone's.
        drop(a);
        assert_eq!(
            Stats::get(&stats.parking_active),
            3 - usize::from(was_shed(&b1) || was_shed(&b2)) as u64
        );
        drop((b1, b2, c));
        assert_eq!(Stats::get(&stats.parking_active), 0);
        assert!(lot.try_park("a").is_some());
    }

    #[test]
    fn zero_disables() {
        let stats = Arc::new(Stats::default());
        let lot = ParkingLot::new(0, stats.clone());
        assert!(!lot.enabled());
        assert!(lot.try_park("ns").is_none());
        assert_eq!(Stats::get(&stats.parking_rejected), 0);
    }
}
