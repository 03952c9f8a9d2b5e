//! The api in jwt mode (`--auth-mode=jwt`) over real gRPC on loopback: bearer tokens for callers
//! without a client certificate, verified against a JWKS file; mesh certificates still honoured.

mod common;

use std::sync::Arc;

use ate_api::Api;
use ate_api::authz::Authz;
use ate_api::jwt::{JwtConfig, JwtVerifier};
use ate_proto::v1::*;
use ate_test_support::jwt::{Signer, merged, now};
use ate_tls::{
    AllowList, CertSource, ClientAuth, LocalCa, ServerCheck, SpiffeId, SvidRequest, client_config,
    client_config_no_cert, endpoint, tls_channel,
};
use base64::Engine as _;
use common::*;

use serde_json::json;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const TD: &str = "ate.local";
const ISS: &str = "https://issuer.test";
const AUD: &str = "ate-api";

/// Valid claims for subject `sub`, with `extra` merged in.
fn claims(sub: &str, extra: serde_json::Value) -> serde_json::Value {
    let valid = json!({"iss": ISS, "aud": AUD, "sub": sub, "exp": now() + 600});
    merged(valid, extra)
}

struct JwtApi {
    addr: String,
    ca: Arc<LocalCa>,
    ec: Signer,
    rsa: Signer,
    /// Stops serving when dropped, before the directories go.
    _serving: TlsServing,
    _dir: tempfile::TempDir,
    _store_dir: Option<tempfile::TempDir>,
}

impl JwtApi {
    /// The api as `ate api --auth-mode=jwt` builds it: TLS with an optional client certificate,
    /// roles for certificates, bearer tokens verified against a JWKS with an EC and an RSA key.
    async fn start() -> JwtApi {
        ate_tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let (ca, api_id) = api_pki(dir.path(), TD);
        let (ec, rsa) = (Signer::ec("ec-1"), Signer::rsa("rsa-1"));
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, json!({"keys": [ec.jwk(), rsa.jwk()]}).to_string()).unwrap();
        let verifier = JwtVerifier::new(JwtConfig {
            issuer: ISS.into(),
            audience: AUD.into(),
            jwks_file: jwks,
        })
        .unwrap();
        let authz = Authz::new(TD, "").unwrap().with_jwt(verifier);
        let (store, store_dir) = fresh_store(Backend::Sqlite).await;
        let api = Arc::new(Api::new(store, cfg()));
        let client_auth = ClientAuth::Optional {
            allowed: AllowList::any(),
        };
        let serving = TlsServing::start(api, api_id, client_auth, authz).await;
        JwtApi {
            addr: serving.addr.clone(),
            ca,
            ec,
            rsa,
            _dir: dir,
            _serving: serving,
            _store_dir: store_dir,
        }
    }

    /// TLS without a client certificate (a caller outside the mesh); the api's ID pinned.
    async fn anonymous(&self) -> Channel {
        let cfg = client_config_no_cert(
            self.ca.roots().unwrap(),
            ServerCheck::Pin(SpiffeId::api(TD).unwrap()),
        )
        .unwrap();
        tls_channel(endpoint(&self.addr).unwrap(), Arc::new(cfg))
            .await
            .unwrap()
    }

    /// mTLS presenting `id`'s certificate.
    async fn mesh(&self, id: SpiffeId) -> Channel {
        let src = CertSource::issued(self.ca.clone(), SvidRequest::new(id)).unwrap();
        let cfg = client_config(&src, ServerCheck::Pin(SpiffeId::api(TD).unwrap())).unwrap();
        tls_channel(endpoint(&self.addr).unwrap(), Arc::new(cfg))
            .await
            .unwrap()
    }
}

fn with_token<T>(msg: T, token: &str) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

fn get_req(ns: &str, name: &str) -> GetActorRequest {
    GetActorRequest {
        actor: Some(obj(ns, name)),
    }
}

fn unauthenticated<T: std::fmt::Debug>(r: Result<T, Status>, needle: &str) {
    let e = r.expect_err("the api must refuse this token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(
        e.message().contains(needle),
        "message {:?} should name {needle:?}",
        e.message()
    );
}

/// An admin token seeds atespaces team-a and team-b, each with template `t` and actor `x`.
async fn seed(api: &JwtApi, ch: &Channel) {
    let admin = api.ec.sign(&claims("root", json!({"ate_role": "admin"})));
    for ns in ["team-a", "team-b"] {
        atespaces(ch)
            .create_atespace(with_token(
                CreateAtespaceRequest {
                    name: ns.into(),
                    ..Default::default()
                },
                &admin,
            ))
            .await
            .expect("admin token creates atespaces");
        template_service_client::TemplateServiceClient::new(ch.clone())
            .apply_template(with_token(
                ApplyTemplateRequest {
                    template: Some(template(ns, "t")),
                },
                &admin,
            ))
            .await
            .expect("admin token applies templates");
        actors(ch)
            .create_actor(with_token(create_req(ns, "x"), &admin))
            .await
            .expect("admin token creates actors");
    }
}

#[tokio::test]
async fn valid_tokens_are_accepted_and_bad_ones_refused() {
    let api = JwtApi::start().await;
    let ch = api.anonymous().await;
    seed(&api, &ch).await;

    // Valid ES256 and RS256 client tokens for team-a.
    let team_a = json!({"ate_atespaces": ["team-a"]});
    for token in [
        api.ec.sign(&claims("alice", team_a.clone())),
        api.rsa.sign(&claims("alice", team_a.clone())),
    ] {
        let got = actors(&ch)
            .get_actor(with_token(get_req("team-a", "x"), &token))
            .await
            .expect("a valid token is accepted")
            .into_inner();
        assert_eq!(got.name, "x");
    }

    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    // (the token, what its refusal names)
    let refused = [
        // Expired.
        (
            api.ec.sign(&claims(
                "alice",
                json!({"ate_atespaces": ["team-a"], "exp": now() - 3600}),
            )),
            "expired",
        ),
        // Wrong audience.
        (
            api.ec.sign(&claims(
                "alice",
                json!({"ate_atespaces": ["team-a"], "aud": "another-api"}),
            )),
            "audience",
        ),
        // Bad signature: a key the JWKS does not hold, under the JWKS's kid.
        (
            Signer::ec("ec-1").sign(&claims("mallory", json!({"ate_role": "admin"}))),
            "signature",
        ),
        // Unsigned (alg none).
        (
            format!(
                "{}.{}.",
                b64(json!({"alg": "none", "typ": "JWT"})),
                b64(claims("mallory", json!({"ate_role": "admin"})))
            ),
            "unsigned",
        ),
        // Unknown kid.
        (
            Signer::ec("ec-9").sign(&claims("mallory", json!({}))),
            "ec-9",
        ),
    ];
    for (token, why) in refused {
        let got = actors(&ch)
            .get_actor(with_token(get_req("team-a", "x"), &token))
            .await;
        unauthenticated(got, why);
    }
    // No token at all, and a header that is not Bearer.
    unauthenticated(
        actors(&ch).get_actor(get_req("team-a", "x")).await,
        "Bearer",
    );
    let mut basic = Request::new(get_req("team-a", "x"));
    basic
        .metadata_mut()
        .insert("authorization", "Basic YWxpY2U6cHc=".parse().unwrap());
    unauthenticated(actors(&ch).get_actor(basic).await, "Bearer");
}

#[tokio::test]
async fn client_token_is_limited_to_its_atespaces() {
    let api = JwtApi::start().await;
    let ch = api.anonymous().await;
    seed(&api, &ch).await;
    let token = api
        .rsa
        .sign(&claims("alice", json!({"ate_atespaces": ["team-a"]})));

    actors(&ch)
        .create_actor(with_token(create_req("team-a", "mine"), &token))
        .await
        .expect("alice creates in team-a");
    for e in [
        actors(&ch)
            .get_actor(with_token(get_req("team-b", "x"), &token))
            .await
            .unwrap_err(),
        actors(&ch)
            .create_actor(with_token(create_req("team-b", "theirs"), &token))
            .await
            .unwrap_err(),
        actors(&ch)
            .delete_actor(with_token(
                DeleteActorRequest {
                    actor: Some(obj("team-b", "x")),
                    force: false,
                    purge_volumes: false,
                },
                &token,
            ))
            .await
            .unwrap_err(),
        atespaces(&ch)
            .delete_atespace(with_token(
                DeleteAtespaceRequest {
                    name: "team-b".into(),
                },
                &token,
            ))
            .await
            .unwrap_err(),
        template_service_client::TemplateServiceClient::new(ch.clone())
            .apply_template(with_token(
                ApplyTemplateRequest {
                    template: Some(template("team-a", "t2")),
                },
                &token,
            ))
            .await
            .unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("jwt:alice"), "{}", e.message());
    }
    // Listings are filtered to team-a.
    let listed = actors(&ch)
        .list_actors(with_token(ListActorsRequest::default(), &token))
        .await
        .unwrap()
        .into_inner()
        .actors;
    assert!(
        !listed.is_empty() && listed.iter().all(|a| a.atespace == "team-a"),
        "{listed:?}"
    );
    // A token without ate_atespaces is a client of nothing.
    let none = api.ec.sign(&claims("bob", json!({})));
    let e = actors(&ch)
        .get_actor(with_token(get_req("team-a", "x"), &none))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}

#[tokio::test]
async fn mesh_certificates_still_work_in_jwt_mode() {
    let api = JwtApi::start().await;
    let admin = api.mesh(SpiffeId::admin(TD).unwrap()).await;
    atespaces(&admin)
        .create_atespace(CreateAtespaceRequest {
            name: "team-a".into(),
            ..Default::default()
        })
        .await
        .expect("the admin certificate is honoured");
    // The certificate is the identity; a token on the same call does not change it.
    let router = api.mesh(SpiffeId::router(TD).unwrap()).await;
    let admin_token = api.ec.sign(&claims("root", json!({"ate_role": "admin"})));
    let e = atespaces(&router)
        .delete_atespace(with_token(
            DeleteAtespaceRequest {
                name: "team-a".into(),
            },
            &admin_token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("atenet-router"), "{}", e.message());
}

#[tokio::test]
async fn node_agent_token_suspends_only_on_its_node() {
    let api = JwtApi::start().await;
    let ch = api.anonymous().await;
    seed(&api, &ch).await;
    let admin = api.ec.sign(&claims("root", json!({"ate_role": "admin"})));
    let node = TestNode::start("node-1").await;
    let node1 = api.ec.sign(&claims(
        "node-1-agent",
        json!({"ate_role": "node_agent", "ate_node": "node-1"}),
    ));
    fleet_service_client::FleetServiceClient::new(ch.clone())
        .register_worker(with_token(
            RegisterWorkerRequest {
                held: vec![],
                worker: Some(worker_on("w1", "node-1", "127.0.0.2:8443", &node)),
            },
            &node1,
        ))
        .await
        .expect("a node-1 token registers node-1's worker");
    actors(&ch)
        .resume_actor(with_token(
            ResumeActorRequest {
                actor: Some(obj("team-a", "x")),
            },
            &admin,
        ))
        .await
        .expect("admin token resumes");
    let suspend = || SuspendActorRequest {
        actor: Some(obj("team-a", "x")),
        mode: SuspendMode::Async as i32,
        grace_ms: 0,
        reason: String::new(),
    };
    for (token, needle) in [
        (
            api.ec.sign(&claims(
                "node-2-agent",
                json!({"ate_role": "node_agent", "ate_node": "node-2"}),
            )),
            "jwt:node-2-agent",
        ),
        (
            api.ec
                .sign(&claims("nameless", json!({"ate_role": "node_agent"}))),
            "names no node",
        ),
    ] {
        let e = actors(&ch)
            .suspend_actor(with_token(suspend(), &token))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains(needle), "{}", e.message());
    }
    actors(&ch)
        .suspend_actor(with_token(suspend(), &node1))
        .await
        .expect("the node-1 token suspends node-1's actor");
}
