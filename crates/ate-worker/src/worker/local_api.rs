//! The worker's local actor API at the platform address (`http://169.254.17.1/v1/…`): what an
//! actor can ask about itself (identity), asks about its own idle suspend (keep awake for a
//! while, suspend now), which the worker's activity report carries to the node, and its alarm
//! (`/v1/alarm`), kept by the api (AlarmService, `--api`): set only once the api has stored it.
//! `GET /v1/identity?audience=A` adds a short-lived token the api signs (IdentityService).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ate_core::clock::now_ms;
use http::{Method, StatusCode, header};

use ate_egress::{ActorIdentity, LocalApi, LocalRequest, LocalResponse};

/// The path an alarm POSTs to when the actor names none.
pub const DEFAULT_ALARM_PATH: &str = "/alarm";

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

/// The api's AlarmService, as the local API calls it.
pub type AlarmClient =
    ate_proto::v1::alarm_service_client::AlarmServiceClient<tonic::transport::Channel>;
/// The api's IdentityService, as the local API calls it.
pub type IdentityClient =
    ate_proto::v1::identity_service_client::IdentityServiceClient<tonic::transport::Channel>;

/// The api's services the local API calls (`--api`), on one channel.
#[derive(Debug, Clone)]
pub struct ApiClients {
    pub alarms: AlarmClient,
    pub identity: IdentityClient,
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
    pub(super) api: Option<ApiClients>,
}

#[async_trait::async_trait]
impl LocalApi for WorkerLocalApi {
    async fn serve(&self, actor: &ActorIdentity, req: LocalRequest) -> LocalResponse {
        match req.path.as_str() {
            "/v1/alarm" => return alarm(self.api.clone(), actor, &req).await,
            "/v1/identity" => return identity(self.api.clone(), actor, &req).await,
            _ => {}
        }
        answer(&self.asks, actor, &req)
    }
}

/// What `PUT /v1/alarm` asks for: the due time (Unix ms) and the path.
pub(crate) fn parse_alarm(body: &[u8], now_ms: i64) -> Result<(i64, String), String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        format!(
            "invalid body: expected JSON like {{\"in\": \"30s\", \"path\": \"/on-alarm\"}}: {e}"
        )
    })?;
    let due = match (v.get("at"), v.get("in")) {
        (Some(_), Some(_)) => return Err("invalid at/in: give one of them, not both".into()),
        (None, None) => {
            return Err(
                "invalid at/in: missing (\"at\": an RFC 3339 time, or \"in\": a duration such as \"30s\")"
                    .into(),
            );
        }
        (Some(at), None) => {
            let text = at.as_str().ok_or("invalid at: not a string")?;
            let t = humantime::parse_rfc3339_weak(text)
                .map_err(|e| format!("invalid at: {text:?} is not an RFC 3339 time: {e}"))?;
            let ms = t
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| format!("invalid at: {text:?} is before 1970"))?
                .as_millis();
            i64::try_from(ms).map_err(|_| format!("invalid at: {text:?} is too far ahead"))?
        }
        (None, Some(d)) => {
            let text = d.as_str().ok_or("invalid in: not a string")?;
            let d =
                ate_core::duration::parse_duration(text).map_err(|e| format!("invalid in: {e}"))?;
            now_ms.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }
    };
    let path = match v.get("path") {
        None => DEFAULT_ALARM_PATH.to_string(),
        Some(p) => p.as_str().ok_or("invalid path: not a string")?.to_string(),
    };
    if !path.starts_with('/') {
        return Err(format!("invalid path: {path:?} must start with '/'"));
    }
    Ok((due, path))
}

/// An alarm as the local API shows it.
fn alarm_json(a: &ate_proto::v1::Alarm) -> serde_json::Value {
    let at = |ms: i64| {
        u64::try_from(ms)
            .ok()
            .map(|ms| {
                humantime::format_rfc3339_millis(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
                )
                .to_string()
            })
            .unwrap_or_default()
    };
    serde_json::json!({
        "at": at(a.due_unix_ms),
        "at_unix_ms": a.due_unix_ms,
        "path": a.path,
        "attempts": a.attempts,
        "last_error": a.last_error,
        "failed": a.failed,
    })
}

/// The api's refusal as the local API's answer, its message after `what: `.
fn from_status(what: &str, s: &tonic::Status) -> LocalResponse {
    let code = match s.code() {
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::FailedPrecondition => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    LocalResponse::text(code, format!("{what}: {}\n", s.message()))
}

/// What `GET /v1/identity` asks for: a token's audience and lifetime (`?audience=A&ttl=10m`),
/// or nothing (the identity alone).
pub(crate) fn parse_identity_query(
    query: Option<&str>,
) -> Result<Option<(String, Option<Duration>)>, String> {
    let mut audience = None;
    let mut ttl = None;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "audience" => audience = Some(value.into_owned()),
            "ttl" => {
                // Plain seconds or a duration ("600", "10m").
                let d = match value.parse::<u64>() {
                    Ok(secs) => Duration::from_secs(secs),
                    Err(_) => ate_core::duration::parse_duration(&value)
                        .map_err(|e| format!("invalid ttl: {e}"))?,
                };
                // 0 s on the wire means "the default": a caller's 0 (or "500ms") is a mistake.
                if d.as_secs() == 0 {
                    return Err("invalid ttl: must be at least 60s".into());
                }
                ttl = Some(d);
            }
            other => {
                return Err(format!(
                    "invalid query parameter {other:?}: /v1/identity takes audience and ttl"
                ));
            }
        }
    }
    match (audience, ttl) {
        (Some(a), ttl) => Ok(Some((a, ttl))),
        (None, Some(_)) => Err("invalid ttl: a token needs an audience (?audience=…)".into()),
        (None, None) => Ok(None),
    }
}

/// `GET /v1/identity[?audience=A[&ttl=T]]`: who the actor is, and with an audience a signed
/// token saying so (the api's IdentityService).
async fn identity(
    api: Option<ApiClients>,
    actor: &ActorIdentity,
    req: &LocalRequest,
) -> LocalResponse {
    if req.method != Method::GET && req.method != Method::HEAD {
        return LocalResponse::text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} /v1/identity: use GET\n", req.method),
        )
        .with_header(header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
    }
    let mut body = serde_json::json!({
        "atespace": actor.atespace,
        "name": actor.name,
        "uid": actor.uid,
        "activation": actor.activation,
    });
    let (audience, ttl) = match parse_identity_query(req.query.as_deref()) {
        Ok(Some(asked)) => asked,
        Ok(None) => return LocalResponse::json(StatusCode::OK, &body),
        Err(why) => return LocalResponse::text(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    let Some(mut api) = api else {
        return LocalResponse::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "identity tokens are not available on this worker (it has no --api)\n".to_string(),
        );
    };
    let ask = ate_proto::v1::IssueActorTokenRequest {
        actor: Some(ate_proto::v1::ObjectRef {
            atespace: actor.atespace.clone(),
            name: actor.name.clone(),
        }),
        activation: actor.activation,
        audience,
        // Out of range: the api names the bounds.
        ttl_seconds: ttl.map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX)),
    };
    match api.identity.issue_actor_token(ask).await {
        Ok(t) => {
            let t = t.into_inner();
            body["token"] = t.token.into();
            body["expires_unix"] = t.expires_unix.into();
            body["expires_at"] = u64::try_from(t.expires_unix)
                .map(|s| {
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + Duration::from_secs(s),
                    )
                    .to_string()
                })
                .unwrap_or_default()
                .into();
            body["issuer"] = t.issuer.into();
            body["key_id"] = t.key_id.into();
            LocalResponse::json(StatusCode::OK, &body)
        }
        Err(s) => from_status("identity token", &s),
    }
}

/// `PUT` (set), `GET`, `DELETE /v1/alarm`.
async fn alarm(
    api: Option<ApiClients>,
    actor: &ActorIdentity,
    req: &LocalRequest,
) -> LocalResponse {
    let activation = actor.activation;
    let Some(mut client) = api.map(|a| a.alarms) else {
        return LocalResponse::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "alarms are not available on this worker (it has no --api)\n".to_string(),
        );
    };
    let object = Some(ate_proto::v1::ObjectRef {
        atespace: actor.atespace.clone(),
        name: actor.name.clone(),
    });
    match req.method {
        Method::PUT | Method::POST => {
            let (due, path) = match parse_alarm(&req.body, now_ms()) {
                Ok(v) => v,
                Err(why) => {
                    return LocalResponse::text(StatusCode::BAD_REQUEST, format!("{why}\n"));
                }
            };
            let set = ate_proto::v1::SetAlarmRequest {
                actor: object,
                activation,
                due_unix_ms: due,
                path,
            };
            match client.set_alarm(set).await {
                Ok(a) => LocalResponse::json(StatusCode::OK, &alarm_json(a.get_ref())),
                Err(s) => from_status("alarm", &s),
            }
        }
        Method::GET | Method::HEAD => {
            let get = ate_proto::v1::GetAlarmRequest {
                actor: object,
                activation,
            };
            match client.get_alarm(get).await {
                Ok(r) => match &r.get_ref().alarm {
                    Some(a) => LocalResponse::json(StatusCode::OK, &alarm_json(a)),
                    None => {
                        LocalResponse::text(StatusCode::NOT_FOUND, "no alarm is set\n".to_string())
                    }
                },
                Err(s) => from_status("alarm", &s),
            }
        }
        Method::DELETE => {
            let delete = ate_proto::v1::DeleteAlarmRequest {
                actor: object,
                activation,
            };
            match client.delete_alarm(delete).await {
                Ok(r) => LocalResponse::json(
                    StatusCode::OK,
                    &serde_json::json!({"deleted": r.get_ref().deleted}),
                ),
                Err(s) => from_status("alarm", &s),
            }
        }
        _ => LocalResponse::text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} /v1/alarm: use PUT, GET or DELETE\n", req.method),
        )
        .with_header(
            header::ALLOW,
            http::HeaderValue::from_static("PUT, GET, DELETE"),
        ),
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
        p => LocalResponse::text(
            StatusCode::NOT_FOUND,
            format!(
                "{p}: no such path in the local actor API (GET /v1/identity, PUT|GET|DELETE /v1/alarm, POST /v1/keep-awake, POST /v1/suspend; to call another actor, send ate-target-actor: <atespace>/<name>)\n"
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

    /// The actor the local API answers for in these tests: web/front-1, first activation.
    fn front_1() -> ActorIdentity {
        ActorIdentity {
            atespace: "web".into(),
            name: "front-1".into(),
            uid: "u-1".into(),
            activation: 1,
        }
    }

    #[tokio::test]
    async fn identity_and_unknown_paths() {
        let me = front_1();
        let asks = LocalAsks::default();
        let r = identity(None, &me, &req(Method::GET, "/v1/identity")).await;
        assert_eq!(r.status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"atespace": "web", "name": "front-1", "uid": "u-1", "activation": 1})
        );
        let r = identity(None, &me, &req(Method::POST, "/v1/identity")).await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        // A token needs the api: 503 naming the flag; bad queries are 400 naming the field.
        let with_query = |q: &str| LocalRequest {
            query: Some(q.to_string()),
            ..req(Method::GET, "/v1/identity")
        };
        let r = identity(None, &me, &with_query("audience=vault")).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(String::from_utf8_lossy(&r.body).contains("--api"));
        for (q, field) in [
            ("aud=vault", "invalid query parameter \"aud\""),
            ("ttl=60", "a token needs an audience"),
            ("audience=x&ttl=soon", "invalid ttl"),
            ("audience=x&ttl=0", "at least 60s"),
        ] {
            let r = identity(None, &me, &with_query(q)).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{q}");
            assert!(
                String::from_utf8_lossy(&r.body).contains(field),
                "{q}: {:?}",
                r.body
            );
        }
        assert_eq!(
            parse_identity_query(Some("audience=https%3A%2F%2Fvault.example&ttl=10m")),
            Ok(Some((
                "https://vault.example".to_string(),
                Some(Duration::from_secs(600))
            )))
        );
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
        let me = front_1();
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

    #[test]
    fn alarm_asks_parse_and_bad_ones_name_the_field() {
        let now = 1_000_000;
        assert_eq!(
            parse_alarm(br#"{"in": "30s", "path": "/on-alarm"}"#, now),
            Ok((now + 30_000, "/on-alarm".to_string()))
        );
        assert_eq!(
            parse_alarm(br#"{"at": "1970-01-01T00:00:05Z"}"#, now),
            Ok((5_000, DEFAULT_ALARM_PATH.to_string()))
        );
        for (body, field) in [
            ("nope", "invalid body"),
            ("{}", "invalid at/in: missing"),
            (r#"{"in": "30s", "at": "2026-01-01T00:00:00Z"}"#, "not both"),
            (r#"{"in": "soon"}"#, "invalid in"),
            (r#"{"at": "tomorrow"}"#, "invalid at"),
            (r#"{"in": "1s", "path": "on-alarm"}"#, "invalid path"),
            (r#"{"in": "1s", "path": 3}"#, "invalid path"),
        ] {
            let e = parse_alarm(body.as_bytes(), now).expect_err(body);
            assert!(e.contains(field), "{body}: {e}");
        }
    }
}
