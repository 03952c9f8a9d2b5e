//! The platform as an actor sees it from inside its sandbox: one fixed link-local address that
//! serves the local actor API (`/v1/…`) and carries calls to other actors by name, and the
//! header the platform sets on such calls. Architecture invariant: only the platform sets
//! [`CALLER_ACTOR_HEADER`]; the router removes it from every request that did not come from a
//! worker's actor-call path, so a callee can trust it.

use std::net::Ipv4Addr;

/// The platform's address inside every actor (next to the actor's own `169.254.17.2`). TCP to
/// it is intercepted by the worker's egress proxy and served by the worker: it never leaves the
/// node.
pub const PLATFORM_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 1);
/// The platform's port at [`PLATFORM_ADDR`] (plain HTTP/1.1).
pub const PLATFORM_PORT: u16 = 80;
/// Set by the platform on a call from one actor to another: the caller, `<atespace>/<name>`.
pub const CALLER_ACTOR_HEADER: &str = "ate-caller-actor";
/// Calls may also name their callee as `<name>.<atespace>.actors.internal` in the `Host` header
/// (or an absolute URI) of a request to [`PLATFORM_ADDR`].
pub const ACTORS_DOMAIN: &str = "actors.internal";
