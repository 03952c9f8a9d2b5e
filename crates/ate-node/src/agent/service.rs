//! The `NodeService` impl: a thin adapter that decodes each call's message into the verb's
//! types (`convert.rs`; for Run and Restore also the request id and trace context of its
//! metadata), calls the verb on [`NodeAgent`], and encodes its reply or maps its
//! [`AgentError`](super::AgentError) to a status; Run, Restore and Checkpoint also record their
//! metrics here. The gRPC server itself ([`serve_grpc`]) is started here too.

use std::sync::Arc;

use ate_proto::v1::{
    self,
    node_service_server::{NodeService, NodeServiceServer},
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{NodeAgent, convert};
use crate::NodeError;

#[tonic::async_trait]
impl NodeService for NodeAgent {
    type ExecStream = super::exec::ExecStream;

    /// Relayed to the actor's worker (`exec.rs`).
    async fn exec(
        &self,
        req: Request<tonic::Streaming<v1::PlacedExecRequest>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        self.exec_relay(req).await
    }

    async fn run(&self, req: Request<v1::RunRequest>) -> Result<Response<v1::NodeReply>, Status> {
        let span = start_span("run", &req, req.get_ref().workload.as_ref());
        // Passed on to the worker's Start, as the api passed it here.
        let request_id = ate_proto::request_id::of(&req).map(str::to_owned);
        let agent = self.clone();
        to_completion(async move {
            let result = async {
                let workload = convert::run(req.into_inner())?;
                agent.run_inner(request_id.as_deref(), workload).await
            }
            .instrument(span)
            .await
            .map(|r| Response::new(convert::node_reply(r)))
            .map_err(|e| convert::status(&e));
            crate::metrics::ran(ate_telemetry::outcome(&result));
            result
        })
        .await
    }

    async fn restore(
        &self,
        req: Request<v1::RestoreRequest>,
    ) -> Result<Response<v1::NodeReply>, Status> {
        let begun = std::time::Instant::now();
        let span = start_span("restore", &req, req.get_ref().workload.as_ref());
        // Passed on to the worker's Start, as the api passed it here.
        let request_id = ate_proto::request_id::of(&req).map(str::to_owned);
        let agent = self.clone();
        to_completion(async move {
            let result = async {
                let restore = convert::restore(req.into_inner())?;
                agent.restore_inner(request_id.as_deref(), restore).await
            }
            .instrument(span)
            .await
            .map(|r| Response::new(convert::node_reply(r)))
            .map_err(|e| convert::status(&e));
            crate::metrics::restored(ate_telemetry::outcome(&result), begun);
            result
        })
        .await
    }

    async fn checkpoint(
        &self,
        req: Request<v1::CheckpointRequest>,
    ) -> Result<Response<v1::CheckpointReply>, Status> {
        let begun = std::time::Instant::now();
        let agent = self.clone();
        to_completion(async move {
            let result = match convert::checkpoint(req.into_inner()) {
                Ok(checkpoint) => agent.checkpoint_inner(checkpoint).await,
                Err(e) => Err(e),
            };
            let written = result.as_ref().ok().map(|c| c.snapshot.size_bytes);
            let result = result
                .map(|c| Response::new(convert::checkpoint_reply(c)))
                .map_err(|e| convert::status(&e));
            crate::metrics::checkpointed(ate_telemetry::outcome(&result), begun, written);
            result
        })
        .await
    }

    async fn detach(
        &self,
        req: Request<v1::DetachRequest>,
    ) -> Result<Response<v1::DetachReply>, Status> {
        let agent = self.clone();
        to_completion(async move {
            let result = match convert::detach(req.into_inner()) {
                Ok((actor, snapshots)) => agent.detach_inner(&actor, snapshots).await,
                Err(e) => Err(e),
            };
            result
                .map(|s| Response::new(convert::detach_reply(s)))
                .map_err(|e| convert::status(&e))
        })
        .await
    }

    async fn stop(&self, req: Request<v1::StopRequest>) -> Result<Response<v1::NodeReply>, Status> {
        let agent = self.clone();
        to_completion(async move {
            agent
                .stop_inner(convert::stop(req.into_inner()))
                .await
                .map(|r| Response::new(convert::node_reply(r)))
                .map_err(|e| convert::status(&e))
        })
        .await
    }

    async fn forget_actor(
        &self,
        req: Request<v1::ForgetActorRequest>,
    ) -> Result<Response<v1::ForgetActorReply>, Status> {
        let req = req.into_inner();
        let result = match convert::actor(req.actor) {
            Ok(actor) => self.forget_actor_inner(&actor, &req.purge_dirs).await,
            Err(e) => Err(e),
        };
        result
            .map(|(log_removed, dirs_removed)| {
                Response::new(v1::ForgetActorReply {
                    log_removed,
                    dirs_removed,
                })
            })
            .map_err(|e| convert::status(&e))
    }

    async fn actor_activity(
        &self,
        req: Request<v1::ActorActivityRequest>,
    ) -> Result<Response<v1::ActorActivityReply>, Status> {
        self.actor_activity_inner(&req.into_inner().worker_id)
            .await
            .map(|actors| Response::new(convert::actor_activity_reply(actors)))
            .map_err(|e| convert::status(&e))
    }

    async fn read_log(
        &self,
        req: Request<v1::ReadLogRequest>,
    ) -> Result<Response<v1::ReadLogReply>, Status> {
        let result = match convert::read_log(req.into_inner()) {
            Ok(read) => self.read_log_inner(read).await,
            Err(e) => Err(e),
        };
        result
            .map(|p| Response::new(convert::read_log_reply(p)))
            .map_err(|e| convert::status(&e))
    }

    async fn delete_snapshots(
        &self,
        req: Request<v1::DeleteSnapshotsRequest>,
    ) -> Result<Response<v1::DeleteSnapshotsReply>, Status> {
        self.delete_snapshots_inner(convert::snapshots(req.into_inner().snapshots))
            .await
            .map(|()| Response::new(v1::DeleteSnapshotsReply {}))
            .map_err(|e| convert::status(&e))
    }
}

/// Runs a verb that changes a sandbox or a generation to its end even when the api goes away
/// in the middle (its call timed out, it was killed, a connection broke): tonic drops a
/// handler whose caller is gone, and a checkpoint dropped half way would leave the sandbox
/// frozen and without ingress, a start half made. The api learns the outcome when it asks
/// again (every verb is idempotent).
async fn to_completion<T: Send + 'static>(
    verb: impl std::future::Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    tokio::spawn(verb)
        .await
        .map_err(|e| Status::internal(format!("node verb task failed: {e}")))?
}

/// The span of a Run or Restore (`call`): the request id the api passed on (DESIGN §8: on every
/// line of the request, in every component) and the actor.
fn start_span<T>(call: &str, req: &Request<T>, workload: Option<&v1::Workload>) -> tracing::Span {
    let actor = workload
        .and_then(|w| w.actor.as_ref())
        .map(|a| format!("{}/{}", a.atespace, a.name))
        .unwrap_or_default();
    let request_id = ate_proto::request_id::of(req).unwrap_or_default();
    let span = tracing::info_span!(
        "start",
        call,
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        actor = %actor
    );
    ate_telemetry::trace_context::continue_grpc(&span, req);
    span
}

/// Serves NodeService on `listener` (with TLS when `server_tls` is given) until `stopped`.
pub(super) async fn serve_grpc(
    agent: NodeAgent,
    listener: tokio::net::TcpListener,
    server_tls: Option<Arc<ate_tls::rustls::ServerConfig>>,
    stopped: impl Future<Output = ()>,
) -> Result<(), NodeError> {
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(NodeServiceServer::new(agent));
    let result = match server_tls {
        Some(server) => {
            router
                .serve_with_incoming_shutdown(ate_tls::TlsIncoming::new(listener, server)?, stopped)
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    stopped,
                )
                .await
        }
    };
    result.map_err(NodeError::from)
}
