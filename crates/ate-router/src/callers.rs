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
//! [`CallerPolicy`]: [`AllowLists`] in a router, [`SameAtespace`] where no api can be asked. An
//! actor may always call the actors of its own atespace; another atespace's actors only if that
//! atespace lists the caller's in its `spec.callers.allow` (`"*"`: every atespace), read from
//! the api and cached for [`ALLOW_LIST_TTL`] (a change takes effect within it), hence
//! [`Decision::Pending`] on a miss.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::platform::CALLER_ACTOR_HEADER;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// [`CALLER_ACTOR_HEADER`] as a header name, made once.
pub const CALLER: HeaderName = HeaderName::from_static(CALLER_ACTOR_HEADER);
/// `ate-alarm-attempt` as a header name: kept only on requests of the internal listeners.
pub const ALARM_ATTEMPT: HeaderName =
    HeaderName::from_static(ate_core::platform::ALARM_ATTEMPT_HEADER);

/// Metric: calls the policy decided, by `verdict` (`allowed`, `denied`, `unavailable`).
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
    /// The rule could not be read (the api is unreachable): 503, try again.
    Unavailable(String),
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

/// How long [`AllowLists`] trusts an atespace's allow list it read (like the assignment cache).
pub const ALLOW_LIST_TTL: Duration = Duration::from_secs(5);
/// Allow lists kept at most; past it the cache starts over (a bound, not an LRU: atespaces
/// called across are few).
const ALLOW_LIST_CACHE_MAX: usize = 10_000;

/// Allow lists read, by atespace, with when they were read.
type ListCache = Arc<Mutex<HashMap<String, (Instant, Arc<Vec<String>>)>>>;

/// Same atespace always; across atespaces as the callee's atespace allows (`callers_allow`,
/// read through [`crate::Resume::callers_allow`]).
pub struct AllowLists {
    api: Arc<dyn crate::Resume>,
    cache: ListCache,
}

impl fmt::Debug for AllowLists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllowLists").finish_non_exhaustive()
    }
}

impl AllowLists {
    pub fn new(api: Arc<dyn crate::Resume>) -> Self {
        AllowLists {
            api,
            cache: Arc::default(),
        }
    }
}

/// The verdict of `allow` (the callee atespace's list) on a call from `caller`.
fn by_list(allow: &[String], caller: &str, callee_atespace: &str) -> Verdict {
    if allow.iter().any(|a| a == "*" || a == caller) {
        Verdict::Allowed
    } else if allow.is_empty() {
        Verdict::Denied(format!(
            "calls between atespaces are not allowed: atespace {callee_atespace} admits no other atespace (its spec.callers.allow is empty)"
        ))
    } else {
        Verdict::Denied(format!(
            "atespace {callee_atespace} does not allow calls from atespace {caller} (its spec.callers.allow: [{}])",
            allow.join(", ")
        ))
    }
}

impl CallerPolicy for AllowLists {
    fn decide(&self, caller: &Caller, callee: &str) -> Decision {
        let callee_atespace = callee
            .split_once('/')
            .map_or(callee, |(a, _)| a)
            .to_string();
        if caller.atespace() == callee_atespace {
            return Decision::Ready(Verdict::Allowed);
        }
        let caller_atespace = caller.atespace().to_string();
        let cached = self
            .cache
            .lock()
            .ok()
            .and_then(|c| c.get(&callee_atespace).cloned())
            .filter(|(at, _)| at.elapsed() < ALLOW_LIST_TTL);
        if let Some((_, allow)) = cached {
            return Decision::Ready(by_list(&allow, &caller_atespace, &callee_atespace));
        }
        let lookup = self.api.callers_allow(&callee_atespace);
        let cache = self.cache.clone();
        Decision::Pending(Box::pin(async move {
            match lookup.await {
                Ok(allow) => {
                    let allow = Arc::new(allow);
                    if let Ok(mut c) = cache.lock() {
                        if c.len() >= ALLOW_LIST_CACHE_MAX {
                            c.clear();
                        }
                        c.insert(callee_atespace.clone(), (Instant::now(), allow.clone()));
                    }
                    by_list(&allow, &caller_atespace, &callee_atespace)
                }
                Err(e) => Verdict::Unavailable(format!(
                    "cannot read the callers allow list of atespace {callee_atespace}: {}",
                    e.message()
                )),
            }
        }))
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
        Verdict::Unavailable(_) => "unavailable",
    };
    metrics::counter!(ACTOR_CALLS, "verdict" => label).increment(1);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

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

    /// A fake api: allow lists by atespace, `None` = the api is down; counts lookups.
    struct Lists {
        lists: HashMap<&'static str, Option<Vec<String>>>,
        lookups: std::sync::atomic::AtomicUsize,
    }

    impl crate::Resume for Lists {
        fn resume(
            &self,
            _: &crate::actor_ref::ActorKey,
            _: Option<&str>,
        ) -> crate::api::ResumeFuture {
            Box::pin(async { Err(tonic::Status::unimplemented("not in this test")) })
        }

        fn callers_allow(&self, atespace: &str) -> crate::api::CallersFuture {
            self.lookups
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let answer = self
                .lists
                .get(atespace)
                .cloned()
                .unwrap_or(Some(Vec::new()));
            Box::pin(async move { answer.ok_or_else(|| tonic::Status::unavailable("api down")) })
        }
    }

    #[tokio::test]
    async fn allow_lists_decide_across_atespaces_and_are_cached() {
        let api = Arc::new(Lists {
            lists: HashMap::from([
                ("billing", Some(vec!["web".to_string()])),
                ("public", Some(vec!["*".to_string()])),
                ("down", None),
            ]),
            lookups: Default::default(),
        });
        let policy = AllowLists::new(api.clone());
        let web = Caller::parse(HeaderValue::from_static("web/front")).unwrap();
        let ops = Caller::parse(HeaderValue::from_static("ops/bot")).unwrap();
        let decide = |caller: &Caller, callee: &str| {
            let d = policy.decide(caller, callee);
            async move {
                match d {
                    Decision::Ready(v) => v,
                    Decision::Pending(f) => f.await,
                }
            }
        };
        // Its own atespace: no lookup.
        assert_eq!(decide(&web, "web/other").await, Verdict::Allowed);
        assert_eq!(api.lookups.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(decide(&web, "billing/ledger").await, Verdict::Allowed);
        let Verdict::Denied(rule) = decide(&ops, "billing/ledger").await else {
            panic!("ops may not call billing");
        };
        assert_eq!(
            rule,
            "atespace billing does not allow calls from atespace ops (its spec.callers.allow: [web])"
        );
        // The second decision on billing came from the cache.
        assert_eq!(api.lookups.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(decide(&ops, "public/x").await, Verdict::Allowed);
        let Verdict::Denied(rule) = decide(&web, "secret/x").await else {
            panic!("secret admits nobody");
        };
        assert!(rule.contains("admits no other atespace"), "{rule}");
        assert!(matches!(
            decide(&web, "down/x").await,
            Verdict::Unavailable(w) if w.contains("api down")
        ));
    }
}
