//! The tunnel protocol's request headers: the target actor and port, a probe, the fencing token.

use super::{HEADER_ACTIVATION, HEADER_ACTOR, HEADER_HIBERNATE, HEADER_PORT, HEADER_PROBE};

/// Parses the routing headers: `(<atespace>/<name>, port)` or the 400 body.
pub fn parse_target(headers: &http::HeaderMap) -> Result<(String, u16), String> {
    let actor = match headers.get(HEADER_ACTOR) {
        None => return Err(format!("missing {HEADER_ACTOR} header")),
        Some(v) => v
            .to_str()
            .map_err(|_| format!("{HEADER_ACTOR} is not ASCII"))?,
    };
    if ate_core::tunnel::split_actor_ref(actor).is_none() {
        let shown: String = actor.chars().take(140).collect();
        return Err(format!(
            "{HEADER_ACTOR} {shown:?} is not <atespace>/<name> with both DNS-1123 labels"
        ));
    }
    let port = match headers.get(HEADER_PORT) {
        None => 80,
        Some(v) => match ate_core::tunnel::parse_port(v.as_bytes()) {
            Some(p) => p,
            None => {
                let shown: String = String::from_utf8_lossy(v.as_bytes())
                    .chars()
                    .take(20)
                    .collect();
                return Err(format!("{HEADER_PORT} {shown:?} is not a port (1-65535)"));
            }
        },
    };
    Ok((actor.to_string(), port))
}

/// Whether the CONNECT is a probe (`ate-probe: 1`).
pub fn parse_probe(headers: &http::HeaderMap) -> Result<bool, String> {
    match headers.get(HEADER_PROBE) {
        None => Ok(false),
        Some(v) if v == "1" => Ok(true),
        Some(_) => Err(format!("{HEADER_PROBE} must be 1 when present")),
    }
}

/// Whether the CONNECT carries the upstream leg of a hibernating WebSocket
/// (`ate-websocket-hibernate: 1`, docs/websockets.md).
pub fn parse_hibernate(headers: &http::HeaderMap) -> Result<bool, String> {
    match headers.get(HEADER_HIBERNATE) {
        None => Ok(false),
        Some(v) if v == "1" => Ok(true),
        Some(_) => Err(format!("{HEADER_HIBERNATE} must be 1 when present")),
    }
}

/// The router's fencing token (`ate-activation`), if it sent one.
pub fn parse_activation(headers: &http::HeaderMap) -> Result<Option<u64>, String> {
    match headers.get(HEADER_ACTIVATION) {
        None => Ok(None),
        Some(v) => match v.to_str().ok().and_then(|t| t.parse::<u64>().ok()) {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("{HEADER_ACTIVATION} is not a positive integer")),
        },
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn target_headers() {
        assert_eq!(
            parse_target(&headers(&[(HEADER_ACTOR, "team/c-1")])),
            Ok(("team/c-1".to_string(), 80))
        );
        assert_eq!(
            parse_target(&headers(&[(HEADER_ACTOR, "team/c"), (HEADER_PORT, "8080")])),
            Ok(("team/c".to_string(), 8080))
        );
        for bad in ["team", "Team/c", "team/c/d", "/c", "team/-c", ""] {
            assert!(
                parse_target(&headers(&[(HEADER_ACTOR, bad)])).is_err(),
                "{bad:?}"
            );
        }
        for bad in ["0", "65536", "x", "-1", ""] {
            assert!(
                parse_target(&headers(&[(HEADER_ACTOR, "a/b"), (HEADER_PORT, bad)])).is_err(),
                "{bad:?}"
            );
        }
        assert!(parse_target(&headers(&[])).is_err());
    }

    #[test]
    fn activation_header() {
        assert_eq!(parse_activation(&headers(&[])), Ok(None));
        assert_eq!(
            parse_activation(&headers(&[(HEADER_ACTIVATION, "42")])),
            Ok(Some(42))
        );
        for bad in ["0", "-1", "x", "", "18446744073709551616"] {
            assert!(
                parse_activation(&headers(&[(HEADER_ACTIVATION, bad)])).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn hibernate_header() {
        assert_eq!(parse_hibernate(&headers(&[])), Ok(false));
        assert_eq!(
            parse_hibernate(&headers(&[(HEADER_HIBERNATE, "1")])),
            Ok(true)
        );
        assert!(parse_hibernate(&headers(&[(HEADER_HIBERNATE, "yes")])).is_err());
    }

    #[test]
    fn probe_header() {
        assert_eq!(parse_probe(&headers(&[])), Ok(false));
        assert_eq!(parse_probe(&headers(&[(HEADER_PROBE, "1")])), Ok(true));
        for bad in ["0", "true", "", "11"] {
            assert!(
                parse_probe(&headers(&[(HEADER_PROBE, bad)])).is_err(),
                "{bad:?}"
            );
        }
    }
}
