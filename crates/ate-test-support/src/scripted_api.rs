//! A scripted api: a real ActorService gRPC server on 127.0.0.1 whose ResumeActor answer each
//! test scripts per actor (the other verbs are Unimplemented), as the router sees the api.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_proto::v1::actor_service_server::{ActorService, ActorServiceServer};
use ate_proto::v1::*;
use tokio::net::TcpListener;
use tonic::Status;

/// What the scripted api knows about one call.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// 0 for the actor's first call.
    pub n: usize,
    /// Time since the actor's first call.
    pub since_first: Duration,
}

/// The api's answer after `delay`: Ok((worker address, resumed)) or a status.
pub struct Reply {
    pub delay: Duration,
    pub result: Result<(String, bool), Status>,
}

impl Reply {
    pub fn ok(worker: &str, resumed: bool) -> Reply {
        Reply {
            delay: Duration::ZERO,
            result: Ok((worker.to_string(), resumed)),
        }
    }
    pub fn err(status: Status) -> Reply {
        Reply {
            delay: Duration::ZERO,
            result: Err(status),
        }
    }
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

pub type Script = Arc<dyn Fn(Call) -> Reply + Send + Sync>;

#[derive(Default)]
struct ApiState {
    scripts: HashMap<String, Script>,
    calls: HashMap<String, (usize, Instant)>,
    /// Every ResumeActor call in order: (actor, its `x-request-id` metadata).
    request_ids: Vec<(String, Option<String>)>,
    /// Actors whose template says `webSockets: hibernate`.
    hibernating: std::collections::HashSet<String>,
}

#[derive(Clone, Default)]
pub struct ScriptedApi {
    state: Arc<Mutex<ApiState>>,
    total: Arc<AtomicUsize>,
}

impl ScriptedApi {
    pub fn script(&self, actor: &str, f: impl Fn(Call) -> Reply + Send + Sync + 'static) {
        self.state
            .lock()
            .unwrap()
            .scripts
            .insert(actor.to_string(), Arc::new(f));
    }

    /// ResumeActor answers for `actor` say its template hibernates WebSockets.
    pub fn hibernate_web_sockets(&self, actor: &str) {
        self.state
            .lock()
            .unwrap()
            .hibernating
            .insert(actor.to_string());
    }

    /// ResumeActor calls for `actor`.
    pub fn calls(&self, actor: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .calls
            .get(actor)
            .map_or(0, |c| c.0)
    }

    pub fn total_calls(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// The `x-request-id` metadata of each ResumeActor call for `actor`, in order.
    pub fn request_ids(&self, actor: &str) -> Vec<Option<String>> {
        self.state
            .lock()
            .unwrap()
            .request_ids
            .iter()
            .filter(|(a, _)| a == actor)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Serves on 127.0.0.1:0; returns its address.
    pub async fn start(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = ActorServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        addr
    }
}

#[tonic::async_trait]
impl ActorService for ScriptedApi {
    type ExecActorStream =
        tokio_stream::wrappers::ReceiverStream<Result<ate_proto::v1::ExecOutput, Status>>;

    async fn exec_actor(
        &self,
        _req: tonic::Request<tonic::Streaming<ate_proto::v1::ExecActorRequest>>,
    ) -> Result<tonic::Response<Self::ExecActorStream>, Status> {
        Err(Status::unimplemented("the scripted api runs no commands"))
    }

    async fn top_actors(
        &self,
        _req: tonic::Request<TopActorsRequest>,
    ) -> Result<tonic::Response<TopActorsResponse>, Status> {
        Err(Status::unimplemented("the scripted api measures no actors"))
    }

    type WatchEventsStream =
        tokio_stream::wrappers::ReceiverStream<Result<ate_proto::v1::ActorEvent, Status>>;
    type WatchActorsStream =
        tokio_stream::wrappers::ReceiverStream<Result<ate_proto::v1::ActorChange, Status>>;

    async fn list_events(
        &self,
        _req: tonic::Request<ate_proto::v1::ListEventsRequest>,
    ) -> Result<tonic::Response<ate_proto::v1::ListEventsResponse>, Status> {
        Err(Status::unimplemented("the scripted api records no events"))
    }

    async fn watch_events(
        &self,
        _req: tonic::Request<ate_proto::v1::WatchEventsRequest>,
    ) -> Result<tonic::Response<Self::WatchEventsStream>, Status> {
        Err(Status::unimplemented("the scripted api records no events"))
    }

    async fn watch_actors(
        &self,
        _req: tonic::Request<ate_proto::v1::WatchActorsRequest>,
    ) -> Result<tonic::Response<Self::WatchActorsStream>, Status> {
        Err(Status::unimplemented("the scripted api records no events"))
    }

    async fn resume_actor(
        &self,
        req: tonic::Request<ResumeActorRequest>,
    ) -> Result<tonic::Response<ResumeActorResponse>, Status> {
        self.total.fetch_add(1, Ordering::SeqCst);
        let request_id = req
            .metadata()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap_or("<not ASCII>").to_string());
        let r = req.into_inner().actor.unwrap_or_default();
        let key = format!("{}/{}", r.atespace, r.name);
        let (script, call, hibernate_web_sockets) = {
            let mut st = self.state.lock().unwrap();
            let hibernate = st.hibernating.contains(&key);
            st.request_ids.push((key.clone(), request_id));
            let now = Instant::now();
            let entry = st.calls.entry(key.clone()).or_insert((0, now));
            let call = Call {
                n: entry.0,
                since_first: now - entry.1,
            };
            entry.0 += 1;
            (st.scripts.get(&key).cloned(), call, hibernate)
        };
        let Some(script) = script else {
            return Err(Status::not_found(format!("actor {key} not found")));
        };
        let reply = script(call);
        tokio::time::sleep(reply.delay).await;
        let (worker, resumed) = reply.result?;
        Ok(tonic::Response::new(ResumeActorResponse {
            actor: Some(Actor {
                atespace: r.atespace,
                name: r.name,
                state: ActorState::Running as i32,
                worker_assignment: Some(WorkerAssignment {
                    worker_id: format!("w-{worker}"),
                    addresses: vec![worker],
                    epoch: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            resumed,
            hibernate_web_sockets,
        }))
    }

    async fn create_actor(
        &self,
        _: tonic::Request<CreateActorRequest>,
    ) -> Result<tonic::Response<Actor>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn get_actor(
        &self,
        _: tonic::Request<GetActorRequest>,
    ) -> Result<tonic::Response<Actor>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn list_actors(
        &self,
        _: tonic::Request<ListActorsRequest>,
    ) -> Result<tonic::Response<ListActorsResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn update_actor(
        &self,
        _: tonic::Request<UpdateActorRequest>,
    ) -> Result<tonic::Response<Actor>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn delete_actor(
        &self,
        _: tonic::Request<DeleteActorRequest>,
    ) -> Result<tonic::Response<DeleteActorResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn suspend_actor(
        &self,
        _: tonic::Request<SuspendActorRequest>,
    ) -> Result<tonic::Response<Actor>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn revert_actor(
        &self,
        _: tonic::Request<RevertActorRequest>,
    ) -> Result<tonic::Response<Actor>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn read_actor_log(
        &self,
        _: tonic::Request<ReadActorLogRequest>,
    ) -> Result<tonic::Response<ReadActorLogResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn list_generations(
        &self,
        _: tonic::Request<ListGenerationsRequest>,
    ) -> Result<tonic::Response<ListGenerationsResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
}
