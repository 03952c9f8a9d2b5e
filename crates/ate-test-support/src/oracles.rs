//! Independent oracles for property tests: what a parser should accept, written apart from the
//! code under test so that one mistake cannot hide in both.

/// A DNS-1123 label, written independently of `ate_core::names::is_label`.
pub fn dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && edge(b[0])
        && edge(b[b.len() - 1])
        && b.iter().all(|&c| edge(c) || c == b'-')
}

/// Internal names no error body the router sends may contain (RPCs, state enums, gRPC status
/// dumps): the router's unit tests and its integration tests check its bodies against this one
/// list.
pub const ROUTER_INTERNAL_NAMES: [&str; 7] = [
    "AssignWorker",
    "ResumeActor",
    "RevertActor",
    "ACTOR_STATE_",
    "Status {",
    "tonic",
    "code:",
];
