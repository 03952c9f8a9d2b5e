//! The `ate-target-actor` header: `<atespace>/<name>`, both halves DNS-1123 labels (≤ 63).
//! Anything else is a 404 before the api is called.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use http::HeaderValue;

/// Why a request names no routable actor (always a 404).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("missing ate-target-actor header")]
    Missing,
    #[error("malformed ate-target-actor header: want <atespace>/<name>, both DNS-1123 labels")]
    Malformed,
}

impl TargetError {
    /// The 404 body: the problem, the value as sent (escaped, cut) and the expected form.
    pub fn body(self, value: Option<&HeaderValue>) -> String {
        match (self, value) {
            (TargetError::Malformed, Some(value)) => format!(
                "ate-target-actor {} is not <atespace>/<name>: both halves must be lowercase DNS-1123 labels (a-z, 0-9, '-', at most 63 characters)",
                crate::error::shown(value.as_bytes())
            ),
            _ => "missing ate-target-actor header; name the actor with `ate-target-actor: <atespace>/<name>`"
                .to_string(),
        }
    }
}

/// `ate-target-port` is not a port number 1-65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ate-target-port is not a port number (1-65535)")]
pub struct BadPort;

/// The actor port a client names in `ate-target-port`: 1 to 5 decimal digits, 1-65535. Checked
/// without allocating (it is on every request that carries the header).
pub fn parse_port(value: &HeaderValue) -> Result<u16, BadPort> {
    ate_core::tunnel::parse_port(value.as_bytes()).ok_or(BadPort)
}

/// Validates the header value without allocating and returns it as `<atespace>/<name>`.
pub fn parse_target(value: Option<&HeaderValue>) -> Result<&str, TargetError> {
    let value = value.ok_or(TargetError::Missing)?;
    // Non-UTF-8 or non-visible bytes can never form two labels.
    let text = value.to_str().map_err(|_| TargetError::Malformed)?;
    ate_core::tunnel::split_actor_ref(text)
        .map(|_| text)
        .ok_or(TargetError::Malformed)
}

/// An owned, validated actor reference; cheap to clone, hashes as its `<atespace>/<name>` text so
/// maps keyed by it can be probed with a `&str` (no allocation on the warm path).
#[derive(Clone)]
pub struct ActorKey {
    full: Arc<str>,
    slash: usize,
}

impl ActorKey {
    /// From text that [`parse_target`] accepted.
    pub fn from_validated(text: &str) -> Self {
        let slash = text.find('/').unwrap_or(text.len());
        Self {
            full: Arc::from(text),
            slash,
        }
    }

    /// Parses and validates `<atespace>/<name>`.
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        let value = HeaderValue::from_str(text).map_err(|_| TargetError::Malformed)?;
        parse_target(Some(&value)).map(Self::from_validated)
    }

    pub fn atespace(&self) -> &str {
        &self.full[..self.slash]
    }

    pub fn name(&self) -> &str {
        self.full.get(self.slash + 1..).unwrap_or("")
    }

    pub fn as_str(&self) -> &str {
        &self.full
    }
}

impl PartialEq for ActorKey {
    fn eq(&self, other: &Self) -> bool {
        self.full == other.full
    }
}

impl Eq for ActorKey {}

impl Hash for ActorKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Must hash exactly like `str` for the `Borrow<str>` lookups.
        self.as_str().hash(state)
    }
}

impl Borrow<str> for ActorKey {
    fn borrow(&self) -> &str {
        &self.full
    }
}

impl fmt::Display for ActorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl fmt::Debug for ActorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<&str, TargetError> {
        // Leak is fine in tests: the parsed &str borrows from the value.
        let value: &'static HeaderValue =
            Box::leak(Box::new(HeaderValue::from_bytes(bytes).unwrap()));
        parse_target(Some(value))
    }

    #[test]
    fn accepts_two_labels() {
        assert_eq!(parse(b"team-a/agent-7"), Ok("team-a/agent-7"));
        let long = format!("{}/{}", "a".repeat(63), "b".repeat(63));
        assert!(parse(long.as_bytes()).is_ok());
        let key = ActorKey::parse("team-a/agent-7").unwrap();
        assert_eq!(key.atespace(), "team-a");
        assert_eq!(key.name(), "agent-7");
        assert_eq!(key.to_string(), "team-a/agent-7");
    }

    #[test]
    fn rejects_everything_else() {
        assert_eq!(parse_target(None), Err(TargetError::Missing));
        let long = format!("{}/b", "a".repeat(64));
        for bad in [
            &b""[..],
            b"a",
            b"/a",
            b"a/",
            b"a/b/c",
            b"A/b",
            b"a/B",
            b"-a/b",
            b"a/b-",
            b"a_b/c",
            b"a.b/c",
            b"a /b",
            b"\xff\xfe/b",
            b"a/\xc3\xa9",
            long.as_bytes(),
        ] {
            assert_eq!(parse(bad), Err(TargetError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn ports() {
        let port = |s: &str| parse_port(&HeaderValue::from_str(s).unwrap());
        assert_eq!(port("80"), Ok(80));
        assert_eq!(port("8080"), Ok(8080));
        assert_eq!(port("65535"), Ok(65535));
        assert_eq!(port("1"), Ok(1));
        for bad in [
            "", "0", "00000", "65536", "99999", "123456", "-1", "+80", " 80", "80 ", "8o", "0x50",
            "1e3",
        ] {
            assert_eq!(port(bad), Err(BadPort), "{bad:?}");
        }
    }

    #[test]
    fn target_error_bodies_are_one_line() {
        let value = HeaderValue::from_bytes(b"Team/\"x\"\xff").unwrap();
        let body = TargetError::Malformed.body(Some(&value));
        assert!(
            body.starts_with("ate-target-actor \"Team/\\\"x\\\"\u{fffd}\" is not"),
            "{body}"
        );
        assert!(!body.contains('\n'));
        assert!(
            TargetError::Missing
                .body(None)
                .starts_with("missing ate-target-actor header")
        );
    }

    #[test]
    fn key_lookup_by_str() {
        let mut map = std::collections::HashMap::new();
        map.insert(ActorKey::parse("a/b").unwrap(), 1);
        assert_eq!(map.get("a/b"), Some(&1));
    }
}
