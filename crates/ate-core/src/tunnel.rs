//! The tunnel protocol between the router and atunnel (docs/tunnel-protocol.md), defined once:
//! its header names, the actor reference and port parsers both sides use (allocation-free: they
//! run on every request), and the stale-assignment contract.
//!
//! Stale assignment: atunnel answers **421** with `x-ate-assignment-stale: true` for an actor it
//! does not serve (not here, not active, or another activation than `ate-activation` names); the
//! router then forgets its route and resolves again. Any other status is the actor's or the
//! tunnel's own.

use crate::names::is_label;

/// Names the actor: `<atespace>/<name>` (client → router, router → atunnel).
pub const TARGET_ACTOR: &str = "ate-target-actor";
/// Names the actor's port on a tunnel (default 80).
pub const TARGET_PORT: &str = "ate-target-port";
/// The activation's fencing token (router → atunnel): atunnel serves only the copy of the actor
/// that holds exactly this token.
pub const ACTIVATION: &str = "ate-activation";
/// Set (`true`) by atunnel on the 421 for an actor it does not serve.
pub const STALE: &str = "x-ate-assignment-stale";
/// Set (`true`) by atunnel on the 502 for a port nothing listens on inside the actor.
pub const PORT_CLOSED: &str = "x-ate-port-closed";
/// `ate-probe: 1` on a CONNECT: atunnel only answers whether it serves the actor (200 or 421)
/// and dials nothing.
pub const PROBE: &str = "ate-probe";
/// `ate-websocket-hibernate: 1` on a CONNECT (router → atunnel): the tunnel carries the upstream
/// leg of a hibernating WebSocket (docs/websockets.md). Its frames count as the actor's activity,
/// but the open tunnel itself does not keep the actor from idle suspend.
pub const WEBSOCKET_HIBERNATE: &str = "ate-websocket-hibernate";
/// On the upgrade request the actor receives for a hibernating WebSocket: the client
/// connection's id, the same on every upstream WebSocket the router opens for it.
pub const WEBSOCKET_ID: &str = "ate-websocket-id";
/// On the same upgrade request: `1` when this upstream WebSocket replaces an earlier one of the
/// same client connection (the actor was suspended, or its socket ended, in between).
pub const WEBSOCKET_RESUMED: &str = "ate-websocket-resumed";

/// `(atespace, name)` of `<atespace>/<name>` when both halves are DNS-1123 labels.
pub fn split_actor_ref(text: &str) -> Option<(&str, &str)> {
    let (atespace, name) = text.split_once('/')?;
    (is_label(atespace) && is_label(name)).then_some((atespace, name))
}

/// A port header's value: 1 to 5 decimal digits, 1-65535 (no sign, no spaces).
pub fn parse_port(bytes: &[u8]) -> Option<u16> {
    if bytes.is_empty() || bytes.len() > 5 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = bytes.iter().fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
    u16::try_from(n).ok().filter(|p| *p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_refs() {
        assert_eq!(
            split_actor_ref("ate-demo/counter"),
            Some(("ate-demo", "counter"))
        );
        for bad in ["", "/", "a/", "/b", "a/b/c", "A/b", "a b/c", "a/b ", "a"] {
            assert_eq!(split_actor_ref(bad), None, "{bad:?}");
        }
        assert_eq!(split_actor_ref(&format!("{}/b", "x".repeat(64))), None);
    }

    #[test]
    fn ports() {
        assert_eq!(parse_port(b"80"), Some(80));
        assert_eq!(parse_port(b"65535"), Some(65535));
        for bad in [&b""[..], b"0", b"65536", b"+80", b" 80", b"8o", b"000080"] {
            assert_eq!(parse_port(bad), None, "{bad:?}");
        }
    }
}
