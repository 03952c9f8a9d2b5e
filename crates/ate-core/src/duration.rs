//! Duration flags: `5s`, `500ms`, `1m`, `1h`, `250us`, `1.5s` or a bare `0` (every component's
//! `--…-budget`, `--…-delay`, `--…-lifetime` flag).

use std::time::Duration;

/// Parses `5s`, `500ms`, `1m`, `1h`, `250us`, `1.5s`, or a bare `0`.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if value == "0" {
        return Ok(Duration::ZERO);
    }
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{value:?}: missing unit (use ms, s, m or h)"))?;
    let (number, unit) = value.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{value:?}: not a number followed by a unit"))?;
    let seconds = match unit {
        "us" | "µs" => number / 1_000_000.0,
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => {
            return Err(format!(
                "{value:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{value:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("s").is_err());
    }
}
