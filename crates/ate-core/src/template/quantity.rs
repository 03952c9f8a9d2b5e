//! CPU, memory and duration quantities (`500m`, `64Mi`, `5m`) and their canonical text.

use crate::names::ValidationError;

/// `500m`, `1`, `0.5`, `2` → millicores.
pub fn parse_cpu(field: &str, text: &str) -> Result<u32, ValidationError> {
    let bad = || {
        ValidationError::new(
            field,
            format!("{text:?} is not a CPU quantity (e.g. 500m, 1, 0.5)"),
        )
    };
    let millis = if let Some(m) = text.strip_suffix('m') {
        m.parse::<u64>().map_err(|_| bad())?
    } else {
        let v: f64 = text.parse().map_err(|_| bad())?;
        if !v.is_finite() || !(0.0..=1e6).contains(&v) {
            return Err(bad());
        }
        (v * 1000.0).round() as u64
    };
    u32::try_from(millis).map_err(|_| bad())
}

/// `64Mi`, `1Gi`, `128M`, `1048576` → bytes.
pub fn parse_memory(field: &str, text: &str) -> Result<u64, ValidationError> {
    let bad = || {
        ValidationError::new(
            field,
            format!("{text:?} is not a memory quantity (e.g. 64Mi, 1Gi)"),
        )
    };
    const UNITS: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (num, mult) = UNITS
        .iter()
        .find_map(|(u, m)| text.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((text, 1));
    let n: u64 = num.parse().map_err(|_| bad())?;
    n.checked_mul(mult).ok_or_else(bad)
}

/// `30s`, `5m`, `1h`, `90` (seconds), `0` → seconds.
pub fn parse_duration_seconds(field: &str, text: &str) -> Result<u32, ValidationError> {
    let bad = || {
        ValidationError::new(
            field,
            format!("{text:?} is not a duration (e.g. 30s, 5m, 1h)"),
        )
    };
    let (num, mult) = match text.char_indices().last() {
        Some((i, 's')) => (&text[..i], 1),
        Some((i, 'm')) => (&text[..i], 60),
        Some((i, 'h')) => (&text[..i], 3600),
        _ => (text, 1),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = n.checked_mul(mult).ok_or_else(bad)?;
    u32::try_from(secs).map_err(|_| bad())
}

pub fn format_cpu(millis: u32) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

pub fn format_memory(bytes: u64) -> String {
    for (u, m) in [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes >= m && bytes.is_multiple_of(m) {
            return format!("{}{u}", bytes / m);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::validate_image;

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu("f", "1").unwrap(), 1000);
        assert_eq!(parse_cpu("f", "0.5").unwrap(), 500);
        assert_eq!(parse_memory("f", "1Gi").unwrap(), 1 << 30);
        assert_eq!(format_memory(64 << 20), "64Mi");
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(parse_duration_seconds("f", "2h").unwrap(), 7200);
        assert!(parse_memory("f", "99999999999999Ti").is_err());
        assert!(validate_image("f", "registry.local:5000/ate/counter@sha256:0000000000000000000000000000000000000000000000000000000000000000").is_ok());
    }
}
