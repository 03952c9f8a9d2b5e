//! Fixtures: a real api gRPC server on loopback over a real store (SQLite file or a fresh
//! PostgreSQL database), and a scripted node agent (a real NodeService gRPC server) whose
//! behaviour each test sets.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_api::{Api, ApiConfig};
use ate_proto::v1::{self, *};
use ate_store::Store;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
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
            let base = std::env::var("ATE_TEST_POSTGRES_URL")
                .expect("ATE_TEST_POSTGRES_URL must point at a PostgreSQL server (scripts/test.sh starts one)");
            let db = format!("ate_api_test_{}", uuid::Uuid::new_v4().simple());
            let status = std::process::Command::new("psql")
                .args([base.as_str(), "-q", "-c", &format!("CREATE DATABASE {db}")])
                .status()
                .expect("run psql");
            assert!(status.success(), "CREATE DATABASE failed");
            let (prefix, _) = base.rsplit_once('/').expect("URL has a database part");
            let url = format!("{prefix}/{db}");
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
    pub async fn seed(&self, ns: &str) {
        self.atespaces()
            .create_atespace(CreateAtespaceRequest { name: ns.into() })
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
        let worker = Worker {
            id: id.into(),
            node: node.name.clone(),
            addresses: vec!["127.0.0.2:8443".into()],
            identity: format!("spiffe://ate.local/ns/ate-system/sa/worker-{id}"),
            labels,
            sandbox_class: "runc".into(),
            can_restore_memory,
            capacity: Some(Capacity {
                // Ample cpu and memory: slots are what tests and the api bench exhaust.
                cpu_millis: 4_000_000,
                memory_bytes: 1 << 50,
                actor_slots: slots,
            }),
            used: None,
            epoch: node.epoch(),
            status: String::new(),
            last_heartbeat_unix_ms: 0,
            node_address: node.addr.to_string(),
            boot_id: node.boot_id.clone(),
        };
        self.fleet()
            .register_worker(RegisterWorkerRequest {
                held: vec![],
                worker: Some(worker),
            })
            .await
            .expect("register worker");
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
        let worker = Worker {
            id: id.into(),
            node: node.name.clone(),
            addresses: vec!["127.0.0.2:8443".into()],
            identity: format!("spiffe://ate.local/ns/ate-system/sa/worker-{id}"),
            sandbox_class: "runc".into(),
            can_restore_memory: true,
            capacity: Some(Capacity {
                cpu_millis: 4_000_000,
                memory_bytes: 1 << 50,
                actor_slots: slots,
            }),
            epoch: node.epoch(),
            node_address: node.addr.to_string(),
            boot_id: node.boot_id.clone(),
            ..Default::default()
        };
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

/// What the scripted node does on Run/Restore.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeBehaviour {
    Ok,
    /// Answer with this gRPC code (e.g. Internal = restore failed, Unavailable = transient).
    Fail(tonic::Code),
    /// Reply OK but with another epoch (the worker restarted).
    WrongEpoch,
}

#[derive(Default)]
pub struct NodeCalls {
    pub run: AtomicU64,
    pub restore: AtomicU64,
    pub checkpoint: AtomicU64,
    pub detach: AtomicU64,
    pub delete_snapshots: AtomicU64,
    pub restores: Mutex<Vec<RestoreRequest>>,
    /// Actors named by ForgetActor calls (`ns/name`).
    pub forgotten: Mutex<Vec<String>>,
    /// The `x-request-id` metadata of each Run and Restore call, in order.
    pub request_ids: Mutex<Vec<Option<String>>>,
}

struct NodeState {
    name: String,
    boot_id: String,
    epoch: AtomicU64,
    behaviour: Mutex<NodeBehaviour>,
    delay: Mutex<Duration>,
    calls: NodeCalls,
}

#[derive(Clone)]
struct NodeSvc(Arc<NodeState>);

/// A scripted node agent on loopback.
pub struct TestNode {
    pub name: String,
    pub boot_id: String,
    pub addr: SocketAddr,
    state: Arc<NodeState>,
}

impl TestNode {
    pub async fn start(name: &str) -> TestNode {
        let state = Arc::new(NodeState {
            name: name.into(),
            boot_id: format!("boot-{name}"),
            epoch: AtomicU64::new(1),
            behaviour: Mutex::new(NodeBehaviour::Ok),
            delay: Mutex::new(Duration::ZERO),
            calls: NodeCalls::default(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
        let addr = listener.local_addr().expect("addr");
        let svc = node_service_server::NodeServiceServer::new(NodeSvc(state.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        TestNode {
            name: name.into(),
            boot_id: state.boot_id.clone(),
            addr,
            state,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.state.epoch.load(Ordering::SeqCst)
    }

    /// A new worker process behind this node (its replies carry the new epoch).
    pub fn set_epoch(&self, epoch: u64) {
        self.state.epoch.store(epoch, Ordering::SeqCst);
    }
    pub fn set(&self, b: NodeBehaviour) {
        *self.state.behaviour.lock().unwrap() = b;
    }
    pub fn set_delay(&self, d: Duration) {
        *self.state.delay.lock().unwrap() = d;
    }
    pub fn calls(&self) -> &NodeCalls {
        &self.state.calls
    }
}

impl NodeSvc {
    fn record_request_id<T>(&self, req: &Request<T>) {
        let id = req
            .metadata()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap_or("<not ASCII>").to_string());
        self.0.calls.request_ids.lock().unwrap().push(id);
    }

    async fn start_reply(&self, worker_id: &str) -> Result<Response<NodeReply>, Status> {
        let delay = *self.0.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let behaviour = self.0.behaviour.lock().unwrap().clone();
        let epoch = self.0.epoch.load(Ordering::SeqCst);
        match behaviour {
            NodeBehaviour::Ok => Ok(Response::new(NodeReply {
                worker_id: worker_id.into(),
                epoch,
                addresses: vec![],
            })),
            NodeBehaviour::WrongEpoch => Ok(Response::new(NodeReply {
                worker_id: worker_id.into(),
                epoch: epoch + 100,
                addresses: vec![],
            })),
            NodeBehaviour::Fail(code) => Err(Status::new(
                code,
                "scripted failure: wakeup probe never answered",
            )),
        }
    }
}

#[tonic::async_trait]
impl node_service_server::NodeService for NodeSvc {
    async fn run(&self, req: Request<RunRequest>) -> Result<Response<NodeReply>, Status> {
        self.0.calls.run.fetch_add(1, Ordering::SeqCst);
        self.record_request_id(&req);
        let w = req.into_inner().workload.unwrap_or_default();
        self.start_reply(&w.worker_id).await
    }

    async fn restore(&self, req: Request<RestoreRequest>) -> Result<Response<NodeReply>, Status> {
        self.0.calls.restore.fetch_add(1, Ordering::SeqCst);
        self.record_request_id(&req);
        let req = req.into_inner();
        let worker_id = req
            .workload
            .as_ref()
            .map(|w| w.worker_id.clone())
            .unwrap_or_default();
        self.0.calls.restores.lock().unwrap().push(req);
        self.start_reply(&worker_id).await
    }

    async fn checkpoint(
        &self,
        req: Request<CheckpointRequest>,
    ) -> Result<Response<CheckpointReply>, Status> {
        self.0.calls.checkpoint.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let w = req.workload.unwrap_or_default();
        let actor = w.actor.unwrap_or_default();
        let snapshot = Snapshot {
            actor: Some(actor.clone()),
            generation: req.generation,
            uuid: req.uuid,
            fidelity: req.fidelity,
            template: w.template,
            sandbox_class: "runc".into(),
            node: self.0.name.clone(),
            boot_id: self.0.boot_id.clone(),
            local_path: format!(
                "/var/lib/ate/snapshots/{}/{}/{}",
                actor.atespace, actor.name, req.generation
            ),
            durable_uri: if req.durable {
                format!(
                    "file:///durable/{}/{}/{}",
                    actor.atespace, actor.name, req.generation
                )
            } else {
                String::new()
            },
            durable_status: if req.durable {
                DurableStatus::Completed as i32
            } else {
                DurableStatus::Pending as i32
            },
            size_bytes: 1234,
            checksum: "sha256:00".into(),
            reason: String::new(),
            create_time_unix_ms: 0,
        };
        Ok(Response::new(CheckpointReply {
            snapshot: Some(snapshot),
            epoch: self.0.epoch.load(Ordering::SeqCst),
            // Like a real worker with frozen copies on: placement should come back here.
            kept_frozen: true,
        }))
    }

    async fn detach(&self, req: Request<DetachRequest>) -> Result<Response<DetachReply>, Status> {
        self.0.calls.detach.fetch_add(1, Ordering::SeqCst);
        let mut snapshots = req.into_inner().snapshots;
        for s in &mut snapshots {
            s.durable_status = DurableStatus::Completed as i32;
            s.durable_uri = format!("file:///durable/{}", s.uuid);
        }
        Ok(Response::new(DetachReply { snapshots }))
    }

    async fn stop(&self, req: Request<StopRequest>) -> Result<Response<NodeReply>, Status> {
        let req = req.into_inner();
        Ok(Response::new(NodeReply {
            worker_id: req.worker_id,
            epoch: self.0.epoch.load(Ordering::SeqCst),
            addresses: vec![],
        }))
    }

    async fn delete_snapshots(
        &self,
        req: Request<DeleteSnapshotsRequest>,
    ) -> Result<Response<DeleteSnapshotsReply>, Status> {
        let n = req.into_inner().snapshots.len() as u64;
        self.0.calls.delete_snapshots.fetch_add(n, Ordering::SeqCst);
        Ok(Response::new(DeleteSnapshotsReply {}))
    }

    /// Every actor's log on this node is `log of <atespace>/<name>\n`.
    async fn forget_actor(
        &self,
        req: Request<ForgetActorRequest>,
    ) -> Result<Response<ForgetActorReply>, Status> {
        let a = req.into_inner().actor.unwrap_or_default();
        self.0
            .calls
            .forgotten
            .lock()
            .unwrap()
            .push(format!("{}/{}", a.atespace, a.name));
        Ok(Response::new(ForgetActorReply { log_removed: true }))
    }

    async fn read_log(
        &self,
        req: Request<ReadLogRequest>,
    ) -> Result<Response<ReadLogReply>, Status> {
        let req = req.into_inner();
        let a = req.actor.unwrap_or_default();
        let text = format!("log of {}/{}\n", a.atespace, a.name).into_bytes();
        let from = usize::try_from(req.offset)
            .unwrap_or(usize::MAX)
            .min(text.len());
        Ok(Response::new(ReadLogReply {
            data: text[from..].to_vec(),
            next_offset: text.len() as u64,
            found: true,
        }))
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
