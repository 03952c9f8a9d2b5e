//! The worker's local actor API at the platform address (`http://169.254.17.1/v1/…`): what an
//! actor can ask about itself (identity), and asks about its own idle suspend (keep awake for a
//! while, suspend now), which the worker's activity report carries to the node. Alarms are
//! reserved.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ate_core::clock::now_ms;
use http::{Method, StatusCode, header};

use crate::egress::{ActorIdentity, LocalApi, LocalRequest, LocalResponse};

/// Paths reserved for features that are not built yet (answered 501, not 404, so a client can
/// tell "not here yet" from a typo).
const NOT_BUILT: [&str; 1] = ["/v1/alarm"];

/// The longest keep-awake one ask may hold (ask again to extend): an actor that forgets to stop
/// asking still gets suspended within the hour.
pub const KEEP_AWAKE_MAX: Duration = Duration::from_secs(3600);

/// What actors asked about their own idle suspend, by `<atespace>/<name>`.
#[derive(Debug, Default)]
pub struct LocalAsks {
    asks: Mutex<HashMap<String, Asked>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Asked {
    /// Not idle before this instant (Unix ms); 0: no keep-awake.
    keep_awake_until_ms: i64,
    /// `POST /v1/suspend` since the last activity report.
    suspend: bool,
}

impl LocalAsks {
    fn asks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Asked>> {
        self.asks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn with<R>(&self, key: &str, f: impl FnOnce(&mut Asked) -> R) -> R {
        f(self.asks().entry(key.to_string()).or_default())
    }

    /// For the activity report of `key` at `now_ms`: whether a keep-awake holds, and whether a
    /// suspend was asked (taken: reported once).
    pub fn take(&self, key: &str, now_ms: i64) -> (bool, bool) {
        let mut asks = self.asks();
        let Some(a) = asks.get_mut(key) else {
            return (false, false);
        };
        let awake = a.keep_awake_until_ms > now_ms;
        let suspend = std::mem::take(&mut a.suspend);
        if !awake && !suspend {
            asks.remove(key);
        }
        (awake, suspend)
    }

    /// Keeps the asks of the actors `here` says are still here.
    pub fn retain(&self, here: impl Fn(&str) -> bool) {
        self.asks().retain(|k, _| here(k));
    }
}

pub(super) struct WorkerLocalApi {
    pub(super) asks: std::sync::Arc<LocalAsks>,
}

#[async_trait::async_trait]
impl LocalApi for WorkerLocalApi {
    async fn serve(&self, actor: &ActorIdentity, req: LocalRequest) -> LocalResponse {
        answer(&self.asks, actor, &req)
    }
}

fn post_only(req: &LocalRequest) -> Option<LocalResponse> {
    (req.method != Method::POST).then(|| {
        LocalResponse::text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} {}: use POST\n", req.method, req.path),
        )
        .with_header(header::ALLOW, http::HeaderValue::from_static("POST"))
    })
}

/// `POST /v1/keep-awake {"for": "60s"}`: not idle for that long from now (`"0s"` ends it).
fn keep_awake(asks: &LocalAsks, actor: &ActorIdentity, req: &LocalRequest) -> LocalResponse {
    if let Some(r) = post_only(req) {
        return r;
    }
    let bad = |why: String| LocalResponse::text(StatusCode::BAD_REQUEST, format!("{why}\n"));
    let v: serde_json::Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            return bad(format!(
                "invalid body: expected JSON like {{\"for\": \"60s\"}}: {e}"
            ));
        }
    };
    let Some(text) = v.get("for").and_then(|f| f.as_str()) else {
        return bad("invalid for: missing (a duration such as \"60s\" or \"5m\")".to_string());
    };
    let d = match ate_core::duration::parse_duration(text) {
        Ok(d) => d,
        Err(e) => return bad(format!("invalid for: {e}")),
    };
    if d > KEEP_AWAKE_MAX {
        return bad(format!(
            "invalid for: {text} is longer than {}s (ask again to extend)",
            KEEP_AWAKE_MAX.as_secs()
        ));
    }
    let until = now_ms().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let until = if d.is_zero() { 0 } else { until };
    asks.with(&actor.key(), |a| a.keep_awake_until_ms = until);
    LocalResponse::json(StatusCode::OK, &serde_json::json!({"until_unix_ms": until}))
}

fn answer(asks: &LocalAsks, actor: &ActorIdentity, req: &LocalRequest) -> LocalResponse {
    match req.path.as_str() {
        "/v1/keep-awake" => keep_awake(asks, actor, req),
        "/v1/suspend" => {
            if let Some(r) = post_only(req) {
                return r;
            }
            asks.with(&actor.key(), |a| {
                a.suspend = true;
                a.keep_awake_until_ms = 0;
            });
            LocalResponse::json(
                StatusCode::ACCEPTED,
                &serde_json::json!({"suspend": "requested"}),
            )
        }
        "/v1/identity" => {
            if req.method != Method::GET && req.method != Method::HEAD {
                return LocalResponse::text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("{} /v1/identity: use GET\n", req.method),
                )
                .with_header(header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
            }
            LocalResponse::json(
                StatusCode::OK,
                &serde_json::json!({
                    "atespace": actor.atespace,
                    "name": actor.name,
                    "uid": actor.uid,
                }),
            )
        }
        p if NOT_BUILT.contains(&p) => {
            LocalResponse::text(StatusCode::NOT_IMPLEMENTED, format!("{p}: not built yet\n"))
        }
        p => LocalResponse::text(
            StatusCode::NOT_FOUND,
            format!(
                "{p}: no such path in the local actor API (GET /v1/identity; to call another actor, send ate-target-actor: <atespace>/<name>)\n"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderMap;

    use super::*;

    fn req(method: Method, path: &str) -> LocalRequest {
        LocalRequest {
            method,
            path: path.into(),
            query: None,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }
    }

    #[test]
    fn identity_and_reserved_paths() {
        let me = ActorIdentity {
            atespace: "web".into(),
            name: "front-1".into(),
            uid: "u-1".into(),
        };
        let asks = LocalAsks::default();
        let r = answer(&asks, &me, &req(Method::GET, "/v1/identity"));
        assert_eq!(r.status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"atespace": "web", "name": "front-1", "uid": "u-1"})
        );
        let r = answer(&asks, &me, &req(Method::POST, "/v1/identity"));
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        for p in NOT_BUILT {
            let r = answer(&asks, &me, &req(Method::POST, p));
            assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{p}");
            assert!(String::from_utf8_lossy(&r.body).contains("not built yet"));
        }
        let r = answer(&asks, &me, &req(Method::GET, "/v2/nope"));
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&r.body).contains("/v2/nope"));
    }

    fn post(path: &str, body: &str) -> LocalRequest {
        LocalRequest {
            body: Bytes::from(body.to_string()),
            ..req(Method::POST, path)
        }
    }

    #[test]
    fn keep_awake_and_suspend_are_asked_and_reported_once() {
        let me = ActorIdentity {
            atespace: "web".into(),
            name: "front-1".into(),
            uid: "u-1".into(),
        };
        let asks = LocalAsks::default();
        let now = now_ms();
        assert_eq!(asks.take("web/front-1", now), (false, false));
        let r = answer(&asks, &me, &post("/v1/keep-awake", r#"{"for": "60s"}"#));
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(asks.take("web/front-1", now), (true, false));
        assert_eq!(asks.take("web/front-1", now + 61_000), (false, false));
        // Bad input names the field and changes nothing.
        for (body, field) in [
            ("nope", "invalid body"),
            ("{}", "invalid for: missing"),
            (r#"{"for": "soon"}"#, "invalid for"),
            (r#"{"for": "2h"}"#, "longer than 3600s"),
        ] {
            let r = answer(&asks, &me, &post("/v1/keep-awake", body));
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(String::from_utf8_lossy(&r.body).contains(field), "{body}");
        }
        assert_eq!(asks.take("web/front-1", now), (false, false));
        let r = answer(&asks, &me, &req(Method::GET, "/v1/suspend"));
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        answer(&asks, &me, &post("/v1/keep-awake", r#"{"for": "60s"}"#));
        let r = answer(&asks, &me, &post("/v1/suspend", ""));
        assert_eq!(r.status, StatusCode::ACCEPTED);
        // A suspend ends the keep-awake, and is reported once.
        assert_eq!(asks.take("web/front-1", now), (false, true));
        assert_eq!(asks.take("web/front-1", now), (false, false));
    }
}
