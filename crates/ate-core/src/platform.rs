//! The platform as an actor sees it from inside its sandbox: one fixed link-local address that
//! serves the local actor API (`/v1/…`) and carries calls to other actors by name, and the
//! header the platform sets on such calls. Architecture invariant: only the platform sets
//! [`CALLER_ACTOR_HEADER`]; the router removes it from every request that did not come from a
//! worker's actor-call path, so a callee can trust it.

use std::net::Ipv4Addr;

use crate::names::ActorRef;
use crate::tunnel::parse_port;

/// The platform's address inside every actor (next to the actor's own `169.254.17.2`). TCP to
/// it is intercepted by the worker's egress proxy and served by the worker: it never leaves the
/// node.
pub const PLATFORM_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 1);
/// The platform's port at [`PLATFORM_ADDR`] (plain HTTP/1.1).
pub const PLATFORM_PORT: u16 = 80;
/// Set by the platform on a call from one actor to another: the caller, `<atespace>/<name>`.
pub const CALLER_ACTOR_HEADER: &str = "ate-caller-actor";
/// Set by the platform on an alarm's delivery: which try it is (1 for the first). Like
/// [`CALLER_ACTOR_HEADER`], removed from every request the platform did not make, so an actor
/// can trust it.
pub const ALARM_ATTEMPT_HEADER: &str = "ate-alarm-attempt";
/// Calls may also name their callee as `<name>.<atespace>.actors.internal` in the `Host` header
/// (or an absolute URI) of a request to [`PLATFORM_ADDR`].
pub const ACTORS_DOMAIN: &str = "actors.internal";

/// The callee named by a `Host` (or absolute-URI authority) of the form
/// `<name>.<atespace>.actors.internal[:port]`: the actor and the port, if one is given. `None`
/// for any other host, a name or atespace that is not a DNS-1123 label, or a bad port. Host
/// names are case-insensitive, and a trailing dot (a fully qualified name) is accepted.
pub fn target_from_host(host: &str) -> Option<(ActorRef, Option<u16>)> {
    let (name_part, port) = match host.rsplit_once(':') {
        Some((h, p)) => (h, Some(parse_port(p.as_bytes())?)),
        None => (host, None),
    };
    let lower = name_part.to_ascii_lowercase();
    let lower = lower.strip_suffix('.').unwrap_or(&lower);
    let labels = lower.strip_suffix(ACTORS_DOMAIN)?.strip_suffix('.')?;
    let (name, atespace) = labels.split_once('.')?;
    let actor = ActorRef::new(atespace, name);
    actor.validate().ok()?;
    Some((actor, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_naming_an_actor() {
        let a = |s: &str, n: &str| ActorRef::new(s, n);
        assert_eq!(
            target_from_host("ledger.billing.actors.internal"),
            Some((a("billing", "ledger"), None))
        );
        assert_eq!(
            target_from_host("ledger.billing.actors.internal:8080"),
            Some((a("billing", "ledger"), Some(8080)))
        );
        assert_eq!(
            target_from_host("Ledger.Billing.Actors.Internal.:80"),
            Some((a("billing", "ledger"), Some(80)))
        );
    }

    #[test]
    fn other_hosts_are_not_calls() {
        for bad in [
            "",
            "actors.internal",
            ".actors.internal",
            "billing.actors.internal",
            "a.b.c.actors.internal",
            "ledger.billing.actors.internal:0",
            "ledger.billing.actors.internal:65536",
            "ledger.billing.actors.internal:",
            "ledger.billing.actorsXinternal",
            "ledger.billingactors.internal",
            "-x.billing.actors.internal",
            "led_ger.billing.actors.internal",
            "169.254.17.1",
            "169.254.17.1:80",
            "example.com",
        ] {
            assert_eq!(target_from_host(bad), None, "{bad:?}");
        }
        let long = format!("{}.b.actors.internal", "x".repeat(64));
        assert_eq!(target_from_host(&long), None);
    }
}
