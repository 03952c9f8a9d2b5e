//! Actor log lines: the log relay prefixes each line with the time its first byte arrived,
//! `2026-12-01T19:58:01.123Z ` (RFC 3339, UTC, milliseconds, then one space). Lines written by
//! an older relay carry no prefix; everything here accepts both.

use std::time::{Duration, SystemTime};

/// Length of the prefix, space included.
pub const PREFIX_LEN: usize = 25;

/// The prefix for a line that started at `at`.
pub fn prefix(at: SystemTime) -> String {
    format!("{} ", humantime::format_rfc3339_millis(at))
}

/// `(timestamp, rest)` of a line: the timestamp when the line starts with a well-formed one.
pub fn split(line: &str) -> (Option<SystemTime>, &str) {
    let Some(head) = line.get(..PREFIX_LEN) else {
        return (None, line);
    };
    let b = head.as_bytes();
    let shaped = b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[23] == b'Z'
        && b[24] == b' ';
    if !shaped {
        return (None, line);
    }
    match humantime::parse_rfc3339(&head[..PREFIX_LEN - 1]) {
        Ok(t) => (Some(t), &line[PREFIX_LEN..]),
        Err(_) => (None, line),
    }
}

/// The line without its timestamp.
pub fn strip(line: &str) -> &str {
    split(line).1
}

/// Whether a line stamped `at` is newer than `since` before `now` (unstamped lines: unknown).
pub fn newer_than(at: SystemTime, since: Duration, now: SystemTime) -> bool {
    now.checked_sub(since).is_none_or(|cutoff| at >= cutoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_plain_lines() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_238_207_123);
        let line = format!("{}hello world", prefix(at));
        assert_eq!(prefix(at).len(), PREFIX_LEN);
        assert_eq!(split(&line), (Some(at), "hello world"));
        assert_eq!(strip(&line), "hello world");
        for plain in [
            "",
            "hello",
            "2026-12-01 not a stamp at all here",
            "counted request 1",
        ] {
            assert_eq!(split(plain), (None, plain));
        }
        let now = at + Duration::from_secs(60);
        assert!(newer_than(at, Duration::from_secs(120), now));
        assert!(!newer_than(at, Duration::from_secs(30), now));
    }
}
