//! The worker's local actor API at the platform address (`http://169.254.17.1/v1/…`): what an
//! actor can ask about itself. Only identity exists so far; the other paths are reserved.

use http::{Method, StatusCode, header};

use crate::egress::{ActorIdentity, LocalApi, LocalRequest, LocalResponse};

/// Paths reserved for features that are not built yet (answered 501, not 404, so a client can
/// tell "not here yet" from a typo).
const NOT_BUILT: [&str; 3] = ["/v1/alarm", "/v1/keep-awake", "/v1/suspend"];

pub(super) struct WorkerLocalApi;

#[async_trait::async_trait]
impl LocalApi for WorkerLocalApi {
    async fn serve(&self, actor: &ActorIdentity, req: LocalRequest) -> LocalResponse {
        answer(actor, &req)
    }
}

fn answer(actor: &ActorIdentity, req: &LocalRequest) -> LocalResponse {
    match req.path.as_str() {
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
        let r = answer(&me, &req(Method::GET, "/v1/identity"));
        assert_eq!(r.status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"atespace": "web", "name": "front-1", "uid": "u-1"})
        );
        let r = answer(&me, &req(Method::POST, "/v1/identity"));
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        for p in NOT_BUILT {
            let r = answer(&me, &req(Method::POST, p));
            assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{p}");
            assert!(String::from_utf8_lossy(&r.body).contains("not built yet"));
        }
        let r = answer(&me, &req(Method::GET, "/v2/nope"));
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&r.body).contains("/v2/nope"));
    }
}
