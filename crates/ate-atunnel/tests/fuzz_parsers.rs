//! Fuzz targets (property tests, bounded: a fixed number of cases each, a few seconds in all) for
//! atunnel's parser of untrusted input: the CONNECT routing headers
//! (`ate-target-actor`, `ate-target-port`; `atunnel::parse_target`). No root needed.
//!
//! Properties: arbitrary header maps never panic; a valid `<atespace>/<name>` and port
//! round-trip; anything else is an error (atunnel's 400 body) that names the offending header.

use ate_atunnel::{HEADER_ACTOR, HEADER_PORT, parse_target};
use ate_test_support::oracles::dns1123_label as oracle_label;
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

/// Cases per property: each case is microseconds.
const CASES: u32 = 2048;

fn config() -> ProptestConfig {
    ProptestConfig {
        max_shrink_iters: 2048,
        ..ProptestConfig::with_cases(CASES)
    }
}

fn oracle_actor(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let parts: Vec<&str> = text.split('/').collect();
    (parts.len() == 2 && oracle_label(parts[0]) && oracle_label(parts[1])).then(|| text.to_string())
}

/// `Some(port)` for 1–65535 written as 1 to 5 decimal digits, nothing else (no sign, no
/// spaces): the tunnel protocol's rule, the same on the router and in atunnel.
fn oracle_port(bytes: &[u8]) -> Option<u16> {
    if bytes.is_empty() || bytes.len() > 5 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u32 = bytes.iter().fold(0, |n, &d| n * 10 + u32::from(d - b'0'));
    u16::try_from(n).ok().filter(|p| *p > 0)
}

fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]",
        "[a-z0-9][a-z0-9-]{0,61}[a-z0-9]",
        "[a-z0-9]{63}"
    ]
}

/// Header value bytes: arbitrary, or a near miss of a valid actor reference / port.
fn actor_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..150),
        (label(), label()).prop_map(|(a, b)| format!("{a}/{b}").into_bytes()),
        (label(), label(), any::<prop::sample::Index>(), any::<u8>()).prop_map(
            |(a, b, i, byte)| {
                let mut v = format!("{a}/{b}").into_bytes();
                let i = i.index(v.len());
                v[i] = byte;
                v
            }
        ),
    ]
}

fn port_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..12),
        "[+-]?[0-9]{1,7}".prop_map(String::into_bytes),
        any::<u16>().prop_map(|p| p.to_string().into_bytes()),
        any::<u32>().prop_map(|p| p.to_string().into_bytes()),
    ]
}

/// Arbitrary other headers (names the `http` crate accepts) around the routing ones.
fn noise() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    prop::collection::vec(
        (
            "[a-z][a-z0-9-]{0,20}",
            prop::collection::vec(any::<u8>(), 0..40),
        ),
        0..6,
    )
}

fn build(
    actor: Option<&[u8]>,
    port: Option<&[u8]>,
    noise: &[(String, Vec<u8>)],
) -> Option<HeaderMap> {
    let mut h = HeaderMap::new();
    for (name, value) in noise {
        if name == HEADER_ACTOR || name == HEADER_PORT {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            h.append(n, v);
        }
    }
    // A value the http crate refuses (CR, LF, NUL…) never reaches atunnel: skip the case.
    if let Some(a) = actor {
        h.insert(HEADER_ACTOR, HeaderValue::from_bytes(a).ok()?);
    }
    if let Some(p) = port {
        h.insert(HEADER_PORT, HeaderValue::from_bytes(p).ok()?);
    }
    Some(h)
}

fn check(actor: Option<&[u8]>, port: Option<&[u8]>, h: &HeaderMap) -> Result<(), TestCaseError> {
    let got = parse_target(h);
    let want_actor = actor.and_then(oracle_actor);
    let want_port = match port {
        None => Some(80),
        Some(p) => oracle_port(p),
    };
    match (&got, want_actor, want_port) {
        (Ok((a, p)), Some(wa), Some(wp)) => {
            prop_assert_eq!(a, &wa);
            prop_assert_eq!(*p, wp);
        }
        (Err(msg), None, _) => {
            // The actor header is checked first; the message names it.
            prop_assert!(msg.contains(HEADER_ACTOR), "{}", msg);
            prop_assert!(!msg.is_empty() && msg.len() < 400, "{}", msg);
        }
        (Err(msg), Some(_), None) => {
            prop_assert!(msg.contains(HEADER_PORT), "{}", msg);
            prop_assert!(msg.contains("1-65535"), "{}", msg);
            prop_assert!(msg.len() < 400, "{}", msg);
        }
        (got, wa, wp) => {
            return Err(TestCaseError::fail(format!(
                "parse_target({actor:?}, {port:?}) = {got:?}, oracle says actor {wa:?} port {wp:?}"
            )));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_atunnel_target_arbitrary_headers_never_panic(
        actor in prop::option::of(actor_bytes()),
        port in prop::option::of(port_bytes()),
        noise in noise(),
    ) {
        if let Some(h) = build(actor.as_deref(), port.as_deref(), &noise) {
            check(actor.as_deref(), port.as_deref(), &h)?;
        }
    }

    #[test]
    fn fuzz_atunnel_target_valid_round_trips(atespace in label(), name in label(), port in 1u16..=65535, explicit in any::<bool>()) {
        let actor = format!("{atespace}/{name}");
        let port_text = port.to_string();
        let h = build(
            Some(actor.as_bytes()),
            explicit.then_some(port_text.as_bytes()),
            &[],
        )
        .ok_or_else(|| TestCaseError::fail("valid headers refused by http"))?;
        let want = (actor.clone(), if explicit { port } else { 80 });
        prop_assert_eq!(parse_target(&h), Ok(want));
    }

    #[test]
    fn fuzz_atunnel_target_bad_port_is_named(atespace in label(), name in label(), port in port_bytes()) {
        let actor = format!("{atespace}/{name}");
        if let Some(h) = build(Some(actor.as_bytes()), Some(&port), &[]) {
            check(Some(actor.as_bytes()), Some(&port), &h)?;
        }
    }
}

#[test]
fn fuzz_atunnel_target_missing_actor_is_named() {
    let msg = parse_target(&HeaderMap::new()).expect_err("no headers");
    assert!(
        msg.contains("missing") && msg.contains(HEADER_ACTOR),
        "{msg}"
    );
    // A long garbage value is quoted shortened, not echoed whole.
    let long = "x".repeat(10_000);
    let mut h = HeaderMap::new();
    h.insert(
        HEADER_ACTOR,
        HeaderValue::from_str(&long).expect("ascii value"),
    );
    let msg = parse_target(&h).expect_err("no slash");
    assert!(msg.len() < 400, "{} bytes", msg.len());
}
