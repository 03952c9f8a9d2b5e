//! Wall-clock time as the store, the wire and the logs carry it: Unix milliseconds in an `i64`.
//!
//! [`now_ms`] is the one place this crate reads anything outside its arguments. The clock is not
//! I/O (no file, socket or device), and one definition keeps every component's timestamps
//! comparable; code that must be deterministic takes a [`SystemTime`] and calls [`unix_ms`].

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` as Unix milliseconds: 0 before the epoch (a clock set far back must not produce negative
/// times that compare as "long ago"), `i64::MAX` past year 292 million.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The current wall-clock time as Unix milliseconds.
pub fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn unix_ms_converts_and_clamps() {
        assert_eq!(unix_ms(UNIX_EPOCH), 0);
        assert_eq!(
            unix_ms(UNIX_EPOCH + Duration::from_millis(1_796_238_207_123)),
            1_796_238_207_123
        );
        // Sub-millisecond parts are truncated, not rounded.
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_micros(1_999)), 1);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_secs(u64::MAX / 2)) {
            assert_eq!(unix_ms(far), i64::MAX);
        }
    }

    #[test]
    fn now_ms_is_current_and_monotone_enough() {
        let before = unix_ms(SystemTime::now());
        let now = now_ms();
        let after = unix_ms(SystemTime::now());
        assert!(before <= now && now <= after, "{before} {now} {after}");
        // After 2020-01-01: the conversion is in milliseconds, not seconds or micros.
        assert!(now > 1_577_836_800_000 && now < 1_577_836_800_000 * 100);
    }
}
