//! Jittered exponential backoff, as a pure calculator: the caller draws the randomness (so this
//! crate needs no random source, and tests can pin it).

use std::time::Duration;

/// How delays grow: × `factor` each time (below 1 counts as 1: a backoff never shrinks), never
/// beyond `max` before jitter, each delay scaled by a value in `[jitter.0, jitter.1)` so that
/// many retriers do not move in lockstep. A `const` per call site.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub factor: f64,
    pub max: Duration,
    pub jitter: (f64, f64),
}

/// Retry delays following a [`Policy`] from an initial delay. Small on purpose (the next delay
/// and a reference): it lives inside the router's per-request future.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    policy: &'static Policy,
}

impl Backoff {
    pub fn new(initial: Duration, policy: &'static Policy) -> Self {
        Self {
            next: initial.min(policy.max),
            policy,
        }
    }

    /// The next delay, with `draw` (uniform in `[0, 1)`, e.g. `rand::random()`) choosing the
    /// jitter; a draw outside that range is clamped into it.
    pub fn next_delay(&mut self, draw: f64) -> Duration {
        let Policy {
            factor,
            max,
            jitter: (lo, hi),
        } = *self.policy;
        let base = self.next;
        // `mul_f64` panics on overflow; saturate at `max` instead.
        self.next = Duration::try_from_secs_f64(base.as_secs_f64() * factor.max(1.0))
            .unwrap_or(max)
            .min(max);
        let draw = if draw.is_finite() {
            draw.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Duration::try_from_secs_f64(base.as_secs_f64() * (lo + (hi - lo) * draw)).unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TENTH: Policy = Policy {
        factor: 1.1,
        max: Duration::MAX,
        jitter: (1.0, 1.1),
    };
    const HALF_JITTER: Policy = Policy {
        factor: 2.0,
        max: Duration::MAX,
        jitter: (0.5, 1.0),
    };
    const CAPPED: Policy = Policy {
        factor: 2.0,
        max: Duration::from_millis(250),
        jitter: (1.0, 1.0),
    };

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    #[test]
    fn grows_by_factor_within_jitter_bounds() {
        let mut b = Backoff::new(Duration::from_millis(100), &TENTH);
        let mut base = 100.0;
        for i in 0..40 {
            let draw = f64::from(i % 10) / 10.0;
            let d = ms(b.next_delay(draw));
            // Relative slack: each step rounds to whole nanoseconds.
            assert!(
                d >= base * (1.0 - 1e-6) && d < base * 1.1 * (1.0 + 1e-6),
                "{i}: {d} vs {base}"
            );
            base *= 1.1;
        }
    }

    #[test]
    fn draw_picks_within_the_jitter_range() {
        let b = Backoff::new(Duration::from_millis(100), &HALF_JITTER);
        assert_eq!(b.clone().next_delay(0.0), Duration::from_millis(50));
        assert_eq!(b.clone().next_delay(0.5), Duration::from_millis(75));
        // Out-of-range and non-finite draws are clamped, never a panic or a negative delay.
        assert_eq!(b.clone().next_delay(-3.0), Duration::from_millis(50));
        assert_eq!(b.clone().next_delay(7.0), Duration::from_millis(100));
        assert_eq!(b.clone().next_delay(f64::NAN), Duration::from_millis(50));
    }

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(10), &CAPPED);
        let delays: Vec<u128> = (0..9).map(|_| b.next_delay(0.0).as_millis()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 250, 250, 250, 250]);
        // An initial delay above the cap starts at the cap.
        assert_eq!(
            Backoff::new(Duration::from_secs(9), &CAPPED).next_delay(0.0),
            CAPPED.max
        );
    }

    #[test]
    fn never_overflows_or_shrinks() {
        const HUGE: Policy = Policy {
            factor: 1e300,
            max: Duration::MAX,
            jitter: (1.0, 2.0),
        };
        const SHRINKING: Policy = Policy {
            factor: 0.5,
            max: Duration::MAX,
            jitter: (1.0, 1.0),
        };
        let mut b = Backoff::new(Duration::from_secs(1), &HUGE);
        for _ in 0..10 {
            let _ = b.next_delay(0.99);
        }
        assert_eq!(b.next_delay(0.5), Duration::MAX);
        let mut b = Backoff::new(Duration::from_millis(8), &SHRINKING);
        assert_eq!(b.next_delay(0.0), b.next_delay(0.0));
    }
}
