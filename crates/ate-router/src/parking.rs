//! Request parking: the limit on parked requests (`--parked-request-max`), the place a parked
//! request holds (released on drop, so a client that goes away frees it at once), and the retry
//! backoff (100 ms, ×1.1, with jitter).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{PARKING_ACTIVE, PARKING_REJECTED, PARKING_WAIT, Stats};

/// How a parked request's wait ended (label `outcome` of the wait histogram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Served,
    Timeout,
    Canceled,
    Error,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Timeout => "timeout",
            Outcome::Canceled => "canceled",
            Outcome::Error => "error",
        }
    }
}

/// The limit on parked requests.
pub struct ParkingLot {
    places: Option<Arc<Semaphore>>,
    stats: Arc<Stats>,
}

impl ParkingLot {
    /// `max == 0` turns parking off.
    pub fn new(max: usize, stats: Arc<Stats>) -> Self {
        Self {
            places: (max > 0).then(|| Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS)))),
            stats,
        }
    }

    pub fn enabled(&self) -> bool {
        self.places.is_some()
    }

    /// Takes a place, or `None` when all are taken (the caller sheds the request; counted here).
    /// With parking off, a place is never needed and this returns `None` without counting.
    pub fn try_park(&self) -> Option<ParkingPlace> {
        let places = self.places.as_ref()?;
        match places.clone().try_acquire_owned() {
            Ok(permit) => {
                self.stats.parking_active.fetch_add(1, Ordering::Relaxed);
                metrics::gauge!(PARKING_ACTIVE).increment(1.0);
                Some(ParkingPlace {
                    _permit: permit,
                    since: Instant::now(),
                    outcome: Outcome::Canceled,
                    stats: self.stats.clone(),
                })
            }
            Err(_) => {
                self.stats.parking_rejected.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(PARKING_REJECTED).increment(1);
                None
            }
        }
    }
}

/// One parked request's place. Dropping it (request answered or its future dropped because the
/// client went away) frees the place and records the wait; the outcome stays `canceled` unless set.
pub struct ParkingPlace {
    _permit: OwnedSemaphorePermit,
    since: Instant,
    outcome: Outcome,
    stats: Arc<Stats>,
}

impl ParkingPlace {
    pub fn finish(mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for ParkingPlace {
    fn drop(&mut self) {
        self.stats.parking_active.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(PARKING_ACTIVE).decrement(1.0);
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
        let a = lot.try_park().unwrap();
        let b = lot.try_park().unwrap();
        assert!(lot.try_park().is_none());
        assert_eq!(Stats::get(&stats.parking_rejected), 1);
        assert_eq!(Stats::get(&stats.parking_active), 2);
        drop(a);
        b.finish(Outcome::Served);
        assert_eq!(Stats::get(&stats.parking_active), 0);
        assert!(lot.try_park().is_some());
    }

    #[test]
    fn zero_disables() {
        let stats = Arc::new(Stats::default());
        let lot = ParkingLot::new(0, stats.clone());
        assert!(!lot.enabled());
        assert!(lot.try_park().is_none());
        assert_eq!(Stats::get(&stats.parking_rejected), 0);
    }
}
