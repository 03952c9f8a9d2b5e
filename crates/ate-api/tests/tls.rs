//! The api over mTLS with roles: who may call what, and who is refused at the handshake.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ate_api::authz::Authz;
use ate_api::{Api, ApiConfig};
use ate_proto::v1::*;
use ate_tls::{
    AllowList, CertSource, ClientAuth, LocalCa, ServerCheck, SpiffeId, SvidRequest, client_config,
    client_config_no_cert, endpoint, tls_channel,
};
use common::*;
use tonic::Code;
use tonic::transport::Channel;

const TD: &str = "ate.local";

struct TlsApi {
    addr: String,
    ca: Arc<LocalCa>,
    /// Signs actors' identity tokens (its key in `_dir`).
    issuer: Arc<ate_api::jwt::issuer::TokenIssuer>,
    /// Stops serving when dropped, before the directories go.
    _serving: TlsServing,
    _dir: tempfile::TempDir,
    _store_dir: Option<tempfile::TempDir>,
}

fn client_a() -> SpiffeId {
    SpiffeId::parse("spiffe://ate.local/ns/team/sa/client-a").unwrap()
}

impl TlsApi {
    async fn start() -> TlsApi {
        ate_tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let (ca, api_id) = api_pki(dir.path(), TD);
        let authz = Authz::new(TD, &format!("{}=team-a", client_a())).unwrap();
        let (store, store_dir) = fresh_store(Backend::Sqlite).await;
        let issuer = Arc::new(
            ate_api::jwt::issuer::TokenIssuer::load_or_create(
                &dir.path().join("identity.pem"),
                "https://ate.test",
            )
            .unwrap(),
        );
        let api = Arc::new(Api::new(
            store,
            ApiConfig {
                fleet_max_age: Duration::from_millis(50),
                identity: Some(issuer.clone()),
                ..Default::default()
            },
        ));
        let client_auth = ClientAuth::Required {
            allowed: AllowList::any(),
        };
        let serving = TlsServing::start(api, api_id, client_auth, authz).await;
        TlsApi {
            addr: serving.addr.clone(),
            ca,
            issuer,
            _dir: dir,
            _serving: serving,
            _store_dir: store_dir,
        }
    }

    /// A channel presenting `id`'s certificate from this api's CA.
    async fn channel(&self, id: SpiffeId) -> Channel {
        let src = CertSource::issued(self.ca.clone(), SvidRequest::new(id)).unwrap();
        self.channel_with(&src).await
    }

    async fn channel_with(&self, src: &CertSource) -> Channel {
        let cfg = client_config(src, ServerCheck::Pin(SpiffeId::api(TD).unwrap())).unwrap();
        tls_channel(endpoint(&self.addr).unwrap(), Arc::new(cfg))
            .await
            .unwrap()
    }
}

fn resume_req(ns: &str, name: &str) -> ResumeActorRequest {
    ResumeActorRequest {
        actor: Some(obj(ns, name)),
    }
}

/// Admin seeds atespaces team-a and team-b (template `t`, actor `x` in each) and a worker.
async fn seed(api: &TlsApi) -> (Channel, TestNode) {
    let admin = api.channel(SpiffeId::admin(TD).unwrap()).await;
    for ns in ["team-a", "team-b"] {
        atespace_service_client::AtespaceServiceClient::new(admin.clone())
            .create_atespace(CreateAtespaceRequest {
                name: ns.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        template_service_client::TemplateServiceClient::new(admin.clone())
            .apply_template(ApplyTemplateRequest {
                template: Some(template(ns, "t")),
            })
            .await
            .unwrap();
        actors(&admin)
            .create_actor(create_req(ns, "x"))
            .await
            .unwrap();
    }
    let node = TestNode::start("node-1").await;
    let worker = Worker {
        identity: SpiffeId::worker_instance(TD, "w1").unwrap().uri(),
        ..worker_on("w1", &node.name, "127.0.0.2:8443", &node)
    };
    fleet_service_client::FleetServiceClient::new(admin.clone())
        .register_worker(RegisterWorkerRequest {
            held: vec![],
            worker: Some(worker),
        })
        .await
        .unwrap();
    (admin, node)
}

#[tokio::test]
async fn router_may_only_resume() {
    let api = TlsApi::start().await;
    let (_admin, _node) = seed(&api).await;
    let router = api.channel(SpiffeId::router(TD).unwrap()).await;
    let resumed = actors(&router)
        .resume_actor(resume_req("team-a", "x"))
        .await
        .expect("the router resumes")
        .into_inner();
    let assignment = resumed.actor.unwrap().worker_assignment.unwrap();
    assert_eq!(
        assignment.worker_identity,
        "spiffe://ate.local/ns/ate-system/sa/ate-worker-w1"
    );
    let e = actors(&router)
        .create_actor(create_req("team-a", "y"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("atenet-router") && e.message().contains("CreateActor"),
        "{}",
        e.message()
    );
    let e = actors(&router)
        .delete_actor(DeleteActorRequest {
            actor: Some(obj("team-a", "x")),
            force: false,
            purge_volumes: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = fleet_service_client::FleetServiceClient::new(router.clone())
        .list_workers(ListWorkersRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = actors(&router)
        .list_generations(ListGenerationsRequest {
            actor: Some(obj("team-a", "x")),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("ListGenerations"), "{}", e.message());
}

#[tokio::test]
async fn client_limited_to_its_atespaces() {
    let api = TlsApi::start().await;
    let (_admin, _node) = seed(&api).await;
    let a = api.channel(client_a()).await;
    actors(&a)
        .create_actor(create_req("team-a", "mine"))
        .await
        .expect("client-a creates in team-a");
    actors(&a)
        .resume_actor(resume_req("team-a", "mine"))
        .await
        .expect("client-a resumes in team-a");
    actors(&a)
        .list_generations(ListGenerationsRequest {
            actor: Some(obj("team-a", "mine")),
        })
        .await
        .expect("client-a lists generations in team-a");
    for e in [
        actors(&a)
            .list_generations(ListGenerationsRequest {
                actor: Some(obj("team-b", "x")),
            })
            .await
            .unwrap_err(),
        actors(&a)
            .revert_actor(RevertActorRequest {
                actor: Some(obj("team-b", "x")),
                generation: 1,
            })
            .await
            .unwrap_err(),
        actors(&a)
            .create_actor(create_req("team-b", "theirs"))
            .await
            .unwrap_err(),
        actors(&a)
            .get_actor(GetActorRequest {
                actor: Some(obj("team-b", "x")),
            })
            .await
            .unwrap_err(),
        actors(&a)
            .delete_actor(DeleteActorRequest {
                actor: Some(obj("team-b", "x")),
                force: false,
                purge_volumes: false,
            })
            .await
            .unwrap_err(),
        actors(&a)
            .resume_actor(resume_req("team-b", "x"))
            .await
            .unwrap_err(),
        atespace_service_client::AtespaceServiceClient::new(a.clone())
            .delete_atespace(DeleteAtespaceRequest {
                name: "team-b".into(),
            })
            .await
            .unwrap_err(),
        template_service_client::TemplateServiceClient::new(a.clone())
            .apply_template(ApplyTemplateRequest {
                template: Some(template("team-a", "t2")),
            })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("client-a"), "{}", e.message());
    }
    // Listings show only team-a.
    let all = actors(&a)
        .list_actors(ListActorsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .actors;
    assert!(
        !all.is_empty() && all.iter().all(|x| x.atespace == "team-a"),
        "{all:?}"
    );
    let spaces = atespace_service_client::AtespaceServiceClient::new(a.clone())
        .list_atespaces(ListAtespacesRequest {})
        .await
        .unwrap()
        .into_inner()
        .atespaces;
    assert_eq!(
        spaces.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["team-a"]
    );
}

#[tokio::test]
async fn worker_identity_is_not_a_router() {
    let api = TlsApi::start().await;
    let (_admin, _node) = seed(&api).await;
    // A worker's certificate is a `client` with no atespaces: refused, not treated as the router.
    let worker = api
        .channel(SpiffeId::worker_instance(TD, "w1").unwrap())
        .await;
    let e = actors(&worker)
        .resume_actor(resume_req("team-a", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("ate-worker-w1") && e.message().contains("ResumeActor"));
    // Nor a node agent.
    let e = fleet_service_client::FleetServiceClient::new(worker)
        .heartbeat(HeartbeatRequest {
            worker_id: "w1".into(),
            epoch: 1,
            cpu_usage_millis: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
}

fn token_req(ns: &str, name: &str, activation: u64, audience: &str) -> IssueActorTokenRequest {
    IssueActorTokenRequest {
        actor: Some(obj(ns, name)),
        activation,
        audience: audience.into(),
        ttl_seconds: 0,
    }
}

#[tokio::test]
async fn identity_tokens_only_for_the_actor_a_worker_runs_at_its_activation() {
    let api = TlsApi::start().await;
    let (_admin, _node) = seed(&api).await;
    let identity = |c: &Channel| identity_service_client::IdentityServiceClient::new(c.clone());
    let worker = api
        .channel(SpiffeId::worker_instance(TD, "w1").unwrap())
        .await;
    // Not running: refused, naming why.
    let e = identity(&worker)
        .issue_actor_token(token_req("team-a", "x", 1, "vault"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("does not run on this worker"), "{e:?}");

    let router = api.channel(SpiffeId::router(TD).unwrap()).await;
    let running = actors(&router)
        .resume_actor(resume_req("team-a", "x"))
        .await
        .unwrap()
        .into_inner();
    let activation = running.actor.unwrap().worker_assignment.unwrap().activation;
    let token = identity(&worker)
        .issue_actor_token(token_req("team-a", "x", activation, "vault"))
        .await
        .expect("the worker it runs on gets a token")
        .into_inner();
    assert_eq!(token.issuer, "https://ate.test");
    assert_eq!(token.key_id, api.issuer.kid());
    // It verifies against the published JWKS and says who and which activation.
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_str(api.issuer.jwks_json()).unwrap();
    let key = jsonwebtoken::DecodingKey::from_jwk(&set.keys[0]).unwrap();
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
    v.set_audience(&["vault"]);
    v.set_issuer(&["https://ate.test"]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(&token.token, &key, &v)
        .unwrap()
        .claims;
    assert_eq!(claims["sub"], "team-a/x");
    assert_eq!(claims["ate_activation"], activation);

    // An older activation, another worker, a client, a node agent: refused.
    let e = identity(&worker)
        .issue_actor_token(token_req("team-a", "x", activation + 1, "vault"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let w2 = api
        .channel(SpiffeId::worker_instance(TD, "w2").unwrap())
        .await;
    let e = identity(&w2)
        .issue_actor_token(token_req("team-a", "x", activation, "vault"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    for who in [client_a(), SpiffeId::node(TD).unwrap()] {
        let c = api.channel(who).await;
        let e = identity(&c)
            .issue_actor_token(token_req("team-a", "x", activation, "vault"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("IssueActorToken"), "{e:?}");
    }
    // Bad input names the field.
    let e = identity(&worker)
        .issue_actor_token(token_req("team-a", "x", activation, "has space"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("audience"), "{e:?}");
    let e = identity(&worker)
        .issue_actor_token(IssueActorTokenRequest {
            ttl_seconds: 86_400,
            ..token_req("team-a", "x", activation, "vault")
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("ttl"), "{e:?}");
}

/// A call whose TLS handshake the api refused fails without reaching authorization.
fn refused(r: Result<tonic::Response<ResumeActorResponse>, tonic::Status>) {
    let e = r.expect_err("the api must refuse this client");
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "expected a transport failure, got {e:?}"
    );
}

async fn lazy_channel(addr: &str, cfg: ate_tls::rustls::ClientConfig) -> Channel {
    ate_tls::tls_channel_lazy(endpoint(addr).unwrap(), Arc::new(cfg))
}

#[tokio::test]
async fn handshake_refuses_no_cert_foreign_ca_and_expired() {
    let api = TlsApi::start().await;
    let api_pin = || ServerCheck::Pin(SpiffeId::api(TD).unwrap());

    // No client certificate.
    let cfg = client_config_no_cert(api.ca.roots().unwrap(), api_pin()).unwrap();
    let ch = lazy_channel(&api.addr, cfg).await;
    refused(actors(&ch).resume_actor(resume_req("team-a", "x")).await);

    // An admin certificate from another CA (which trusts our api, so only the api can refuse).
    let other_dir = tempfile::tempdir().unwrap();
    let other = Arc::new(LocalCa::open_or_create(other_dir.path(), TD).unwrap());
    let svid = other
        .issue(&SvidRequest::new(SpiffeId::admin(TD).unwrap()))
        .unwrap();
    let src = CertSource::fixed(&svid, api.ca.roots().unwrap()).unwrap();
    let ch = lazy_channel(&api.addr, client_config(&src, api_pin()).unwrap()).await;
    refused(actors(&ch).resume_actor(resume_req("team-a", "x")).await);

    // An expired admin certificate from the right CA.
    let past = SystemTime::now() - Duration::from_secs(7200);
    let svid = api
        .ca
        .issue_with_validity(
            &SvidRequest::new(SpiffeId::admin(TD).unwrap()),
            past,
            past + Duration::from_secs(3600),
        )
        .unwrap();
    let src = CertSource::fixed(&svid, api.ca.roots().unwrap()).unwrap();
    let ch = lazy_channel(&api.addr, client_config(&src, api_pin()).unwrap()).await;
    refused(actors(&ch).resume_actor(resume_req("team-a", "x")).await);

    // And the same CA with a valid certificate gets through the handshake.
    let ok = api.channel(SpiffeId::admin(TD).unwrap()).await;
    let e = actors(&ok)
        .resume_actor(resume_req("team-a", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

fn suspend_req(ns: &str, name: &str) -> SuspendActorRequest {
    SuspendActorRequest {
        actor: Some(obj(ns, name)),
        mode: SuspendMode::Async as i32,
        grace_ms: 0,
        reason: String::new(),
    }
}

/// A worker message for `id` claiming node `node_name`, reachable through `node`.
fn worker_msg(id: &str, node_name: &str, node: &TestNode) -> Worker {
    Worker {
        identity: SpiffeId::worker_instance(TD, id).unwrap().uri(),
        ..worker_on(id, node_name, "127.0.0.3:8443", node)
    }
}

#[tokio::test]
async fn node_agent_suspends_only_actors_on_its_own_workers() {
    let api = TlsApi::start().await;
    let (admin, node) = seed(&api).await;
    // team-a/x runs on worker w1 of node-1; team-b/x is suspended.
    actors(&admin)
        .resume_actor(resume_req("team-a", "x"))
        .await
        .expect("admin resumes");

    // Another node may not suspend it; the denial names the identity and the actor.
    let node2 = api
        .channel(SpiffeId::node_instance(TD, "node-2").unwrap())
        .await;
    let e = actors(&node2)
        .suspend_actor(suspend_req("team-a", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    for needle in ["ate-node-node-2", "SuspendActor", "team-a/x", "node-1"] {
        assert!(e.message().contains(needle), "{needle}: {}", e.message());
    }
    // The shared node identity names no node, so it may not suspend at all.
    let shared = api.channel(SpiffeId::node(TD).unwrap()).await;
    let e = actors(&shared)
        .suspend_actor(suspend_req("team-a", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("names no node"), "{}", e.message());
    // Nor may node-1 suspend an actor that is not on one of its workers.
    let node1 = api
        .channel(SpiffeId::node_instance(TD, "node-1").unwrap())
        .await;
    let e = actors(&node1)
        .suspend_actor(suspend_req("team-b", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("team-b/x"), "{}", e.message());
    // node-1 suspends its own actor (idle suspend).
    let suspended = actors(&node1)
        .suspend_actor(suspend_req("team-a", "x"))
        .await
        .expect("node-1 suspends the actor on its worker")
        .into_inner();
    assert_eq!(suspended.name, "x");

    // The node name is bound at registration: node-2 registers only node-2 workers and cannot
    // take over node-1's live worker; nor deregister it.
    let fleet2 = fleet_service_client::FleetServiceClient::new(node2.clone());
    for (id, claimed) in [("w2", "node-1"), ("w1", "node-2")] {
        let e = fleet2
            .clone()
            .register_worker(RegisterWorkerRequest {
                held: vec![],
                worker: Some(worker_msg(id, claimed, &node)),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{id} as {claimed}: {e:?}");
        assert!(e.message().contains("ate-node-node-2"), "{}", e.message());
    }
    fleet2
        .clone()
        .register_worker(RegisterWorkerRequest {
            held: vec![],
            worker: Some(worker_msg("w2", "node-2", &node)),
        })
        .await
        .expect("node-2 registers its own worker");
    let e = fleet2
        .clone()
        .deregister_worker(DeregisterWorkerRequest {
            worker_id: "w1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // node-1 still registers (re-registers) its own worker.
    fleet_service_client::FleetServiceClient::new(node1)
        .register_worker(RegisterWorkerRequest {
            held: vec![],
            worker: Some(worker_msg("w1", "node-1", &node)),
        })
        .await
        .expect("node-1 re-registers w1");
}
