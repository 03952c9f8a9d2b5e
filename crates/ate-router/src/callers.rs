//! Calls between actors (issue 31): who called, and whether the callee admits that caller.
//!
//! A worker sends its actors' calls on the internal listeners (`--internal-socket`,
//! `--internal-listen`), each request naming its caller in `ate-caller-actor`. The listener marks
//! such a connection [`ConnAuth::Worker`](crate::auth::ConnAuth::Worker); [`Caller::take`] moves
//! the header into a [`Caller`] request extension, and only that extension ever puts the header
//! back on a forwarded request (`Proxy::forward`). On every other connection the header is
//! removed, so a callee can trust it.
//!
//! Before the callee is resolved (a denied call must not wake it) the proxy asks the
//! [`CallerPolicy`]. Today that is [`SameAtespace`]: an actor may call the actors of its own
//! atespace. A per-atespace allow list (the Atespace resource's `spec.callers.allow`) will be
//! another implementation; it may need to fetch an atespace, hence [`Decision::Pending`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use ate_core::platform::CALLER_ACTOR_HEADER;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// [`CALLER_ACTOR_HEADER`] as a header name, made once.
pub const CALLER: HeaderName = HeaderName::from_static(CALLER_ACTOR_HEADER);

/// Metric: calls the policy decided, by `verdict` (`allowed`, `denied`).
pub const ACTOR_CALLS: &str = "ate_router_actor_calls_total";

/// The calling actor of a request from a worker: a validated `<atespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    value: HeaderValue,
    slash: usize,
}

/// Why a worker's request names no usable caller (answered 400: the worker is at fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallerError {
    #[error(
        "missing {CALLER_ACTOR_HEADER} header: a request on the router's internal listener must name its caller (<atespace>/<name>)"
    )]
    Missing,
    #[error("more than one {CALLER_ACTOR_HEADER} header: a call names exactly one caller")]
    Duplicate,
    #[error("{CALLER_ACTOR_HEADER} {shown} is not a valid actor: {reason}")]
    Invalid { shown: String, reason: String },
}

impl Caller {
    /// Takes every `ate-caller-actor` out of `headers` and returns the one caller they name.
    pub fn take(headers: &mut HeaderMap) -> Result<Caller, CallerError> {
        let mut values = match headers.entry(CALLER) {
            http::header::Entry::Occupied(entry) => entry.remove_entry_mult().1,
            http::header::Entry::Vacant(_) => return Err(CallerError::Missing),
        };
        let value = values.next().ok_or(CallerError::Missing)?;
        if values.next().is_some() {
            return Err(CallerError::Duplicate);
        }
        Caller::parse(value)
    }

    /// Validates `<atespace>/<name>` with the platform's actor naming rules.
    pub fn parse(value: HeaderValue) -> Result<Caller, CallerError> {
        let invalid = |reason: String| CallerError::Invalid {
            shown: crate::error::shown(value.as_bytes()),
            reason,
        };
        let text = value
            .to_str()
            .map_err(|_| invalid("not visible ASCII".to_string()))?;
        let actor = ate_core::ActorRef::parse(text).map_err(|e| invalid(e.to_string()))?;
        let slash = actor.atespace.len();
        Ok(Caller { value, slash })
    }

    /// `<atespace>/<name>`.
    pub fn as_str(&self) -> &str {
        // Checked to be visible ASCII in `parse`.
        self.value.to_str().unwrap_or_default()
    }

    pub fn atespace(&self) -> &str {
        &self.as_str()[..self.slash]
    }

    /// The header value the callee receives.
    pub fn header_value(&self) -> &HeaderValue {
        &self.value
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`CallerPolicy`] says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Refused; the rule that refused it, in words (the end of the 403 body).
    Denied(String),
}

/// A verdict now, or one that needs a lookup first (boxed: rare, and kept out of the request
/// future's size).
pub enum Decision {
    Ready(Verdict),
    Pending(Pin<Box<dyn Future<Output = Verdict> + Send>>),
}

/// Decides whether `caller` may call `callee` (`<atespace>/<name>`, already validated).
pub trait CallerPolicy: Send + Sync + fmt::Debug {
    fn decide(&self, caller: &Caller, callee: &str) -> Decision;
}

/// v1: an actor may call the actors of its own atespace, and no other.
#[derive(Debug, Clone, Copy, Default)]
pub struct SameAtespace;

/// The rule of [`SameAtespace`], as the 403 body states it.
pub const SAME_ATESPACE_RULE: &str =
    "calls between atespaces are not allowed (an actor may call actors of its own atespace)";

impl CallerPolicy for SameAtespace {
    fn decide(&self, caller: &Caller, callee: &str) -> Decision {
        let callee_atespace = callee.split_once('/').map_or(callee, |(a, _)| a);
        Decision::Ready(if caller.atespace() == callee_atespace {
            Verdict::Allowed
        } else {
            Verdict::Denied(SAME_ATESPACE_RULE.to_string())
        })
    }
}

/// The 403 body for a denied call: one line naming callee, caller and rule.
pub fn denied_body(callee: &str, caller: &Caller, rule: &str) -> String {
    format!("actor {callee}: call from actor {caller} denied: {rule}")
}

/// Counts `verdict` in [`ACTOR_CALLS`].
pub fn count(verdict: &Verdict) {
    let label = match verdict {
        Verdict::Allowed => "allowed",
        Verdict::Denied(_) => "denied",
    };
    metrics::counter!(ACTOR_CALLS, "verdict" => label).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(CALLER, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn take_needs_exactly_one_valid_caller_and_removes_them_all() {
        let mut h = headers(&["n1/a"]);
        let caller = Caller::take(&mut h).unwrap();
        assert_eq!(caller.as_str(), "n1/a");
        assert_eq!(caller.atespace(), "n1");
        assert!(h.get(CALLER).is_none());

        assert_eq!(Caller::take(&mut headers(&[])), Err(CallerError::Missing));
        let mut h = headers(&["n1/a", "n1/a"]);
        assert_eq!(Caller::take(&mut h), Err(CallerError::Duplicate));
        assert!(h.get(CALLER).is_none());
        for bad in ["n1", "N1/a", "n1/a/b", "/a", "n1/", "n1/a b"] {
            let err = Caller::take(&mut headers(&[bad])).unwrap_err();
            assert!(matches!(err, CallerError::Invalid { .. }), "{bad}: {err:?}");
            assert!(err.to_string().contains("ate-caller-actor"), "{err}");
        }
    }

    #[test]
    fn same_atespace_only() {
        let caller = Caller::parse(HeaderValue::from_static("n1/a")).unwrap();
        let verdict = |callee| match SameAtespace.decide(&caller, callee) {
            Decision::Ready(v) => v,
            Decision::Pending(_) => panic!("SameAtespace never looks anything up"),
        };
        assert_eq!(verdict("n1/b"), Verdict::Allowed);
        assert_eq!(verdict("n1/a"), Verdict::Allowed);
        // A prefix of the atespace is another atespace.
        assert!(matches!(verdict("n10/b"), Verdict::Denied(_)));
        let Verdict::Denied(rule) = verdict("n2/b") else {
            panic!("cross-atespace call allowed");
        };
        assert_eq!(
            denied_body("n2/b", &caller, &rule),
            "actor n2/b: call from actor n1/a denied: calls between atespaces are not allowed (an actor may call actors of its own atespace)"
        );
    }
}
