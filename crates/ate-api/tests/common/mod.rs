//! Fixtures: a real api gRPC server on loopback over a real store (SQLite file or a fresh
//! PostgreSQL database); the scripted node agent it calls is `ate_test_support::test_node`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ate_api::authz::Authz;
use ate_api::{Api, ApiConfig, TlsServe};
use ate_proto::v1::{self, *};
use ate_store::Store;
pub use ate_test_support::test_node::TestNode;
// Not every test binary polls.
#[allow(unused_imports)]
pub use ate_test_support::wait::{eventually, poll_until};
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Request, Status};

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The api's defaults, but a fleet view at most 50 ms old: a registered worker is seen at once.
pub fn cfg() -> ApiConfig {
    ApiConfig {
        fleet_max_age: Duration::from_millis(50),
        ..Default::default()
    }
}

/// A fresh store; the returned guard keeps its directory (SQLite) alive.
pub async fn fresh_store(backend: Backend) -> (Arc<dyn Store>, Option<tempfile::TempDir>) {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            let url = format!("sqlite://{}", dir.path().join("ate.db").display());
            (ate_store::open(&url).await.expect("open sqlite"), Some(dir))
        }
        Backend::Postgres => {
            let db = format!("ate_api_test_{}", uuid::Uuid::new_v4().simple());
            let url = ate_test_support::services::create_postgres_database(&db);
            (ate_store::open(&url).await.expect("open postgres"), None)
        }
    }
}

pub struct TestApi {
    pub api: Arc<Api>,
    pub addr: SocketAddr,
    pub channel: Channel,
    _dir: Option<tempfile::TempDir>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestApi {
    /// [`TestApi::start`] under the tests' [`cfg`] as `change` changes it.
    pub async fn start_with(backend: Backend, change: impl FnOnce(&mut ApiConfig)) -> TestApi {
        let mut config = cfg();
        change(&mut config);
        TestApi::start(backend, config).await
    }

    pub async fn start(backend: Backend, cfg: ApiConfig) -> TestApi {
        let (store, dir) = fresh_store(backend).await;
        let api = Arc::new(Api::new(store, cfg));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(ate_api::serve(api.clone(), listener, None, async move {
            let _ = rx.await;
        }));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect_lazy();
        TestApi {
            api,
            addr,
            channel,
            _dir: dir,
            stop: Some(tx),
        }
    }

    pub fn actors(&self) -> actor_service_client::ActorServiceClient<Channel> {
        actor_service_client::ActorServiceClient::new(self.channel.clone())
    }
    pub fn atespaces(&self) -> atespace_service_client::AtespaceServiceClient<Channel> {
        atespace_service_client::AtespaceServiceClient::new(self.channel.clone())
    }
    pub fn templates(&self) -> template_service_client::TemplateServiceClient<Channel> {
        template_service_client::TemplateServiceClient::new(self.channel.clone())
    }
    pub fn tags(&self) -> tag_service_client::TagServiceClient<Channel> {
        tag_service_client::TagServiceClient::new(self.channel.clone())
    }
    pub fn fleet(&self) -> fleet_service_client::FleetServiceClient<Channel> {
        fleet_service_client::FleetServiceClient::new(self.channel.clone())
    }

    /// Atespace `ns` with template `ns/t` (cpu 250m, memory 64Mi).
    /// Node `node-1` with one worker, `w1`, of `slots` slots, registered; atespace `ns`
    /// seeded.
    pub async fn one_worker(&self, slots: u32) -> TestNode {
        let node = TestNode::start("node-1").await;
        self.register(&node, "w1", slots).await;
        self.seed("ns").await;
        node
    }

    pub async fn seed(&self, ns: &str) {
        self.atespaces()
            .create_atespace(CreateAtespaceRequest {
                name: ns.into(),
                ..Default::default()
            })
            .await
            .expect("create atespace");
        self.templates()
            .apply_template(ApplyTemplateRequest {
                template: Some(template(ns, "t")),
            })
            .await
            .expect("apply template");
    }

    pub async fn create_actor(&self, ns: &str, name: &str) -> Actor {
        self.actors()
            .create_actor(CreateActorRequest {
                atespace: ns.into(),
                name: name.into(),
                template: format!("{ns}/t"),
                worker_selector: Default::default(),
            })
            .await
            .expect("create actor")
            .into_inner()
    }

    pub async fn resume(&self, ns: &str, name: &str) -> Result<ResumeActorResponse, Status> {
        self.actors()
            .resume_actor(ResumeActorRequest {
                actor: Some(obj(ns, name)),
            })
            .await
            .map(|r| r.into_inner())
    }

    /// ResumeActor as the router calls it: with `x-request-id` metadata.
    pub async fn resume_with_id(
        &self,
        ns: &str,
        name: &str,
        request_id: &str,
    ) -> Result<ResumeActorResponse, Status> {
        let mut req = Request::new(ResumeActorRequest {
            actor: Some(obj(ns, name)),
        });
        req.metadata_mut()
            .insert("x-request-id", request_id.parse().expect("ASCII id"));
        self.actors()
            .resume_actor(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn suspend(&self, ns: &str, name: &str) -> Result<Actor, Status> {
        self.actors()
            .suspend_actor(SuspendActorRequest {
                actor: Some(obj(ns, name)),
                mode: SuspendMode::Async as i32,
                grace_ms: 0,
                reason: String::new(),
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn get(&self, ns: &str, name: &str) -> Actor {
        self.actors()
            .get_actor(GetActorRequest {
                actor: Some(obj(ns, name)),
            })
            .await
            .expect("get actor")
            .into_inner()
    }

    /// Registers a worker of `node` with `slots` slots and ample cpu/memory.
    pub async fn register(&self, node: &TestNode, id: &str, slots: u32) {
        self.register_with(node, id, slots, true, Default::default())
            .await
    }

    pub async fn register_with(
        &self,
        node: &TestNode,
        id: &str,
        slots: u32,
        can_restore_memory: bool,
        labels: HashMap<String, String>,
    ) {
        // What a real worker advertises with and without CRIU.
        let capabilities = if can_restore_memory {
            vec!["memory:criu".into(), "userns:off".into()]
        } else {
            vec!["userns:off".into()]
        };
        let worker = Worker {
            labels,
            ..test_worker(node, id, slots, can_restore_memory, capabilities)
        };
        self.register_worker(vec![], worker).await;
    }

    /// Registers a worker advertising exactly `capabilities` (`memory:criu`, `userns:on`, …).
    pub async fn register_caps(
        &self,
        node: &TestNode,
        id: &str,
        slots: u32,
        capabilities: Vec<String>,
    ) {
        let can_restore_memory = capabilities.iter().any(|c| c == "memory:criu");
        let worker = test_worker(node, id, slots, can_restore_memory, capabilities);
        self.register_worker(vec![], worker).await;
    }

    /// Registers worker `id` of `node` (with the node's current epoch) reporting `held`
    /// actors; returns the api's answer (its `discard` list).
    pub async fn register_holding(
        &self,
        node: &TestNode,
        id: &str,
        slots: u32,
        held: Vec<HeldActor>,
    ) -> RegisterWorkerResponse {
        let worker = test_worker(node, id, slots, true, vec![]);
        self.register_worker(held, worker).await
    }

    async fn register_worker(
        &self,
        held: Vec<HeldActor>,
        worker: Worker,
    ) -> RegisterWorkerResponse {
        self.fleet()
            .register_worker(RegisterWorkerRequest {
                held,
                worker: Some(worker),
            })
            .await
            .expect("register worker")
            .into_inner()
    }
}

/// Worker `id` of `node` (with the node's current epoch) as it registers: `slots` slots and ample
/// cpu and memory (slots are what tests and the api bench exhaust), no labels.
fn test_worker(
    node: &TestNode,
    id: &str,
    slots: u32,
    can_restore_memory: bool,
    capabilities: Vec<String>,
) -> Worker {
    Worker {
        id: id.into(),
        node: node.name.clone(),
        addresses: vec!["127.0.0.2:8443".into()],
        identity: format!("spiffe://ate.local/ns/ate-system/sa/worker-{id}"),
        sandbox_class: "runc".into(),
        can_restore_memory,
        capacity: Some(Capacity {
            cpu_millis: 4_000_000,
            memory_bytes: 1 << 50,
            actor_slots: slots,
        }),
        epoch: node.epoch(),
        node_address: node.addr.to_string(),
        boot_id: node.boot_id.clone(),
        capabilities,
        ..Default::default()
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

pub fn obj(ns: &str, name: &str) -> ObjectRef {
    ObjectRef {
        atespace: ns.into(),
        name: name.into(),
    }
}

pub fn template(ns: &str, name: &str) -> ActorTemplate {
    ActorTemplate {
        namespace: ns.into(),
        name: name.into(),
        spec: Some(TemplateSpec {
            containers: vec![v1::Container {
                name: "main".into(),
                image: "oci-layout:/images/counter:latest".into(),
                ..Default::default()
            }],
            resources: Some(Resources {
                cpu_millis: 250,
                memory_bytes: 64 << 20,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs an async test body once per backend.
#[macro_export]
macro_rules! both_stores {
    ($name:ident, $body:path) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                $body(Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                $body(Backend::Postgres).await
            }
        }
    };
}

/// A CA in `dir` for trust domain `td`, and the api's certificate from it.
pub fn api_pki(dir: &std::path::Path, td: &str) -> (Arc<ate_tls::LocalCa>, ate_tls::CertSource) {
    use ate_tls::{CertSource, LocalCa, SpiffeId, SvidRequest};
    let ca = Arc::new(LocalCa::open_or_create(&dir.join("ca"), td).unwrap());
    let api_id =
        CertSource::issued(ca.clone(), SvidRequest::new(SpiffeId::api(td).unwrap())).unwrap();
    (ca, api_id)
}

/// An api served over TLS (as `api_id`, asking for client certificates as `client_auth` says)
/// on a loopback port, until dropped.
pub struct TlsServing {
    pub addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TlsServing {
    pub async fn start(
        api: Arc<Api>,
        api_id: ate_tls::CertSource,
        client_auth: ate_tls::ClientAuth,
        authz: Authz,
    ) -> TlsServing {
        let server = ate_tls::server_config(&api_id, client_auth).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tls = TlsServe {
            server: Arc::new(server),
            authz,
            trust_bundle: String::new(),
            join_signer: None,
        };
        tokio::spawn(async move {
            // Keeps the api's identity alive for as long as it serves.
            let _api_id = api_id;
            ate_api::serve_with(api, listener, None, Some(tls), async move {
                let _ = rx.await;
            })
            .await
        });
        TlsServing {
            addr,
            stop: Some(tx),
        }
    }
}

impl Drop for TlsServing {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The api's actor service on channel `c`.
pub fn actors(c: &Channel) -> actor_service_client::ActorServiceClient<Channel> {
    actor_service_client::ActorServiceClient::new(c.clone())
}

/// The api's atespace service on channel `c`.
pub fn atespaces(c: &Channel) -> atespace_service_client::AtespaceServiceClient<Channel> {
    atespace_service_client::AtespaceServiceClient::new(c.clone())
}

/// Create actor `ns/name` of template `ns/t`.
pub fn create_req(ns: &str, name: &str) -> CreateActorRequest {
    CreateActorRequest {
        atespace: ns.into(),
        name: name.into(),
        template: format!("{ns}/t"),
        worker_selector: Default::default(),
    }
}

/// A worker message for `id` of node `node_name` at `address`, reachable through `node`: 8 slots,
/// ample cpu and memory, able to restore memory.
pub fn worker_on(id: &str, node_name: &str, address: &str, node: &TestNode) -> Worker {
    Worker {
        id: id.into(),
        node: node_name.into(),
        addresses: vec![address.into()],
        sandbox_class: "runc".into(),
        can_restore_memory: true,
        capacity: Some(Capacity {
            cpu_millis: 64_000,
            memory_bytes: 1 << 40,
            actor_slots: 8,
        }),
        epoch: node.epoch(),
        node_address: node.addr.to_string(),
        boot_id: node.boot_id.clone(),
        ..Default::default()
    }
}
