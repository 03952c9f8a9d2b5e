//! Worker label selectors: equality-based `key=value` maps, as Kubernetes `matchLabels`.

use std::collections::BTreeMap;

use crate::names::ValidationError;

/// True when every `key=value` in `selector` is present in `labels`.
pub fn matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Validates keys (optional DNS prefix + `/` + name ≤ 63) and values (≤ 63, alphanumerics, `-_.`).
pub fn validate(field: &str, selector: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    for (key, value) in selector {
        let name = match key.split_once('/') {
            Some((prefix, name)) => {
                if prefix.is_empty()
                    || prefix.len() > 253
                    || !prefix.split('.').all(crate::names::is_label)
                {
                    return Err(ValidationError::new(
                        format!("{field}[{key}]"),
                        format!("key prefix {prefix:?} is not a DNS subdomain"),
                    ));
                }
                name
            }
            None => key.as_str(),
        };
        if !is_qualified_name(name) {
            return Err(ValidationError::new(
                format!("{field}[{key}]"),
                format!("key {key:?} is not a valid label key"),
            ));
        }
        if !(value.is_empty() || is_qualified_name(value)) {
            return Err(ValidationError::new(
                format!("{field}[{key}]"),
                format!("value {value:?} is not a valid label value"),
            ));
        }
    }
    Ok(())
}

fn is_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Parses `k=v,k2=v2` (the CLI's `--selector`).
pub fn parse(field: &str, text: &str) -> Result<BTreeMap<String, String>, ValidationError> {
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| ValidationError::new(field, format!("{part:?} is not key=value")))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    validate(field, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_matching_and_validation() {
        let sel = parse("s", "zone=a, ate.dev/pool=fast").unwrap();
        let mut labels = sel.clone();
        labels.insert("extra".into(), "x".into());
        assert!(matches(&sel, &labels));
        labels.insert("zone".into(), "b".into());
        assert!(!matches(&sel, &labels));
        assert!(matches(&BTreeMap::new(), &labels));
        assert!(parse("s", "novalue").is_err());
        assert!(parse("s", "bad key=x").is_err());
        assert!(parse("s", "k=-bad").is_err());
        assert!(parse("s", "Up_per.ok=V.1").is_ok());
    }
}
