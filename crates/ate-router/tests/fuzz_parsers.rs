//! Fuzz targets (property tests, bounded: a fixed number of cases each, a few seconds in all) for
//! the router's parsers of untrusted input: the `ate-target-actor` and `ate-target-port` headers
//! (`actor_ref`), and the refusal bodies made from them.
//!
//! Properties: arbitrary bytes never panic and are accepted exactly when they are
//! `<label>/<label>` by an independent DNS-1123 oracle; valid references round-trip through
//! `parse_target` and `ActorKey`; everything else is a `Malformed` error whose message names the
//! header and the expected form.

use ate_router::actor_ref::{ActorKey, BadPort, TargetError, parse_port, parse_target};
use ate_router::error::RequestError;
use ate_test_support::oracles::dns1123_label as oracle_label;
use http::HeaderValue;
use proptest::prelude::*;

/// Cases per property: each case is microseconds, so this stays well under a second.
const CASES: u32 = 2048;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        // Shrinking a parser failure is cheap; keep it bounded anyway.
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    }
}

fn oracle(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let parts: Vec<&str> = text.split('/').collect();
    parts.len() == 2 && oracle_label(parts[0]) && oracle_label(parts[1])
}

fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]",
        "[a-z0-9][a-z0-9-]{0,61}[a-z0-9]",
        // the longest legal label
        "[a-z0-9]{63}",
    ]
}

/// Bytes biased towards almost-valid references: labels with one wrong character, extra or
/// missing slashes, upper case, over-long labels, non-ASCII, control bytes.
fn near_miss() -> impl Strategy<Value = Vec<u8>> {
    (
        label(),
        label(),
        any::<prop::sample::Index>(),
        prop::sample::select(vec![
            b'/', b'A', b'Z', b'_', b'.', b' ', b'-', 0u8, b'\t', 0x7f, 0xc3, 0xff, b':', b'@',
        ]),
        any::<bool>(),
    )
        .prop_map(|(a, b, at, byte, insert)| {
            let mut v = format!("{a}/{b}").into_bytes();
            let i = at.index(v.len() + 1);
            if insert || i == v.len() {
                v.insert(i, byte);
            } else {
                v[i] = byte;
            }
            v
        })
}

fn check_any_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    // HeaderValue refuses some bytes (CR, LF, NUL…) at construction: hyper would never hand
    // those to the router, so they are out of scope for `parse_target`.
    let Ok(value) = HeaderValue::from_bytes(bytes) else {
        return Ok(());
    };
    let got = parse_target(Some(&value));
    if oracle(bytes) {
        let text = std::str::from_utf8(bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(got, Ok(text));
    } else {
        prop_assert_eq!(got, Err(TargetError::Malformed));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_actor_ref_arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..160)) {
        check_any_bytes(&bytes)?;
    }

    #[test]
    fn fuzz_actor_ref_near_misses_match_the_oracle(bytes in near_miss()) {
        check_any_bytes(&bytes)?;
    }

    #[test]
    fn fuzz_actor_ref_arbitrary_strings_never_panic(text in "\\PC{0,140}") {
        // ActorKey::parse goes through HeaderValue::from_str first.
        let got = ActorKey::parse(&text);
        prop_assert_eq!(got.is_ok(), oracle(text.as_bytes()), "{:?}", text);
        if let Err(e) = got {
            prop_assert_eq!(e, TargetError::Malformed);
        }
    }

    #[test]
    fn fuzz_actor_ref_valid_round_trips(atespace in label(), name in label()) {
        let text = format!("{atespace}/{name}");
        let value = HeaderValue::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parse_target(Some(&value)), Ok(text.as_str()));
        let key = ActorKey::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(key.atespace(), atespace.as_str());
        prop_assert_eq!(key.name(), name.as_str());
        prop_assert_eq!(key.as_str(), text.as_str());
        prop_assert_eq!(key.to_string(), text.clone());
        // Validated text → key → text is the identity, and keys compare by text.
        prop_assert!(ActorKey::from_validated(key.as_str()) == key);
    }

    #[test]
    fn fuzz_target_port_matches_the_oracle(bytes in prop::collection::vec(any::<u8>(), 0..8)) {
        let Ok(value) = HeaderValue::from_bytes(&bytes) else {
            return Ok(());
        };
        // Independent oracle: 1 to 5 ASCII digits, and the number is a port (1-65535).
        let oracle = std::str::from_utf8(&bytes)
            .ok()
            .filter(|t| (1..=5).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u32>().ok())
            .filter(|n| (1..=65535).contains(n));
        match parse_port(&value) {
            Ok(port) => prop_assert_eq!(Some(u32::from(port)), oracle, "{:?}", bytes),
            Err(BadPort) => {
                prop_assert_eq!(None, oracle, "{:?}", bytes);
                // The refusal stays one line whatever was sent.
                let body = RequestError::BadPort.body(Some("a/b"), Some(&bytes));
                prop_assert!(!body.contains(['\n', '\r']), "{:?}", body);
                prop_assert!(body.starts_with("actor a/b: ate-target-port "), "{:?}", body);
            }
        }
    }

    #[test]
    fn fuzz_target_port_valid_round_trips(port in 1u16..) {
        prop_assert_eq!(parse_port(&HeaderValue::from(port)), Ok(port));
    }

    #[test]
    fn fuzz_actor_ref_bodies_are_one_line(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let Ok(value) = HeaderValue::from_bytes(&bytes) else {
            return Ok(());
        };
        if let Err(e) = parse_target(Some(&value)) {
            let body = e.body(Some(&value));
            prop_assert!(!body.contains(['\n', '\r']), "{:?}", body);
            prop_assert!(body.chars().count() < 300, "{:?}", body);
        }
    }

    #[test]
    fn fuzz_actor_ref_over_long_labels_are_refused(a in "[a-z]{64,100}", b in label(), first in any::<bool>()) {
        let text = if first { format!("{a}/{b}") } else { format!("{b}/{a}") };
        prop_assert_eq!(ActorKey::parse(&text), Err(TargetError::Malformed));
    }
}

#[test]
fn fuzz_actor_ref_errors_name_the_problem() {
    let missing = TargetError::Missing.to_string();
    assert!(missing.contains("missing") && missing.contains("ate-target-actor"));
    let malformed = TargetError::Malformed.to_string();
    assert!(
        malformed.contains("ate-target-actor") && malformed.contains("<atespace>/<name>"),
        "{malformed}"
    );
    assert_eq!(parse_target(None), Err(TargetError::Missing));
}
