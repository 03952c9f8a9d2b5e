//! A scripted node agent: a real NodeService gRPC server on 127.0.0.1 whose Run/Restore answer
//! (success, a gRPC error, another epoch) and delay each test sets, counting every call.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_proto::v1::*;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// What the scripted node does on Run/Restore.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeBehaviour {
    Ok,
    /// Answer with this gRPC code (e.g. Internal = restore failed, Unavailable = transient).
    Fail(tonic::Code),
    /// Reply OK but with another epoch (the worker restarted).
    WrongEpoch,
    /// Restore fails (FailedPrecondition) finding these copies of the generation it was asked
    /// for damaged, reported as the status details (a Run succeeds).
    Damaged {
        local: bool,
        durable: bool,
    },
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
    /// ActorActivity calls.
    pub activity: AtomicU64,
}

struct NodeState {
    name: String,
    boot_id: String,
    epoch: AtomicU64,
    behaviour: Mutex<NodeBehaviour>,
    delay: Mutex<Duration>,
    calls: NodeCalls,
    /// What ActorActivity answers (none running by default: nothing to evict).
    activity: Mutex<Vec<RunningActorActivity>>,
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
            activity: Mutex::new(Vec::new()),
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
    /// What ActorActivity answers from now on (for every worker of this node).
    pub fn set_activity(&self, actors: Vec<RunningActorActivity>) {
        *self.state.activity.lock().unwrap() = actors;
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

    async fn start_reply(
        &self,
        worker_id: &str,
        snapshot: Option<&Snapshot>,
    ) -> Result<Response<NodeReply>, Status> {
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
            NodeBehaviour::Damaged { local, durable } => match snapshot {
                None => Ok(Response::new(NodeReply {
                    worker_id: worker_id.into(),
                    epoch,
                    addresses: vec![],
                })),
                Some(s) => {
                    let reason = format!(
                        "generation {}: rootfs.tar: sha256 00, manifest says 11",
                        s.generation
                    );
                    let of = |damaged: bool| {
                        if damaged {
                            reason.clone()
                        } else {
                            String::new()
                        }
                    };
                    Err(ate_proto::damage::with_damage(
                        Status::failed_precondition(format!("scripted damage: {reason}")),
                        &GenerationDamage {
                            generation: s.generation,
                            uuid: s.uuid.clone(),
                            local: of(local),
                            durable: of(durable),
                        },
                    ))
                }
            },
        }
    }
}

#[tonic::async_trait]
impl node_service_server::NodeService for NodeSvc {
    type ExecStream =
        tokio_stream::wrappers::ReceiverStream<Result<ate_proto::v1::ExecOutput, Status>>;

    async fn exec(
        &self,
        _req: Request<tonic::Streaming<ate_proto::v1::PlacedExecRequest>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        Err(Status::unimplemented("the test node runs no commands"))
    }

    async fn run(&self, req: Request<RunRequest>) -> Result<Response<NodeReply>, Status> {
        self.0.calls.run.fetch_add(1, Ordering::SeqCst);
        self.record_request_id(&req);
        let w = req.into_inner().workload.unwrap_or_default();
        self.start_reply(&w.worker_id, None).await
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
        let snapshot = req.snapshot.clone();
        self.0.calls.restores.lock().unwrap().push(req);
        self.start_reply(&worker_id, snapshot.as_ref()).await
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

    async fn actor_activity(
        &self,
        _req: Request<ActorActivityRequest>,
    ) -> Result<Response<ActorActivityReply>, Status> {
        self.0.calls.activity.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(ActorActivityReply {
            actors: self.0.activity.lock().unwrap().clone(),
        }))
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
        Ok(Response::new(ForgetActorReply {
            log_removed: true,
            dirs_removed: 0,
        }))
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
