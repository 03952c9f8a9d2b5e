//! The `NodeService` impl: a thin adapter that takes each call's message (and, for Run and
//! Restore, the request id and trace context of its metadata), calls the verb on [`NodeAgent`]
//! and wraps the reply; Run, Restore and Checkpoint also record their metrics here.

use ate_proto::v1::{self, node_service_server::NodeService};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::NodeAgent;

#[tonic::async_trait]
impl NodeService for NodeAgent {
    async fn run(&self, req: Request<v1::RunRequest>) -> Result<Response<v1::NodeReply>, Status> {
        let span = start_span("run", &req, req.get_ref().workload.as_ref());
        // Passed on to the worker's Start, as the api passed it here.
        let request_id = ate_proto::request_id::of(&req).map(str::to_owned);
        let result = self
            .run_inner(request_id.as_deref(), req.into_inner())
            .instrument(span)
            .await
            .map(Response::new);
        crate::metrics::ran(&result);
        result
    }

    async fn restore(
        &self,
        req: Request<v1::RestoreRequest>,
    ) -> Result<Response<v1::NodeReply>, Status> {
        let begun = std::time::Instant::now();
        let span = start_span("restore", &req, req.get_ref().workload.as_ref());
        // Passed on to the worker's Start, as the api passed it here.
        let request_id = ate_proto::request_id::of(&req).map(str::to_owned);
        let result = self
            .restore_inner(request_id.as_deref(), req.into_inner())
            .instrument(span)
            .await
            .map(Response::new);
        crate::metrics::restored(&result, begun);
        result
    }

    async fn checkpoint(
        &self,
        req: Request<v1::CheckpointRequest>,
    ) -> Result<Response<v1::CheckpointReply>, Status> {
        let begun = std::time::Instant::now();
        let result = self
            .checkpoint_inner(req.into_inner())
            .await
            .map(Response::new);
        crate::metrics::checkpointed(&result, begun);
        result
    }

    async fn detach(
        &self,
        req: Request<v1::DetachRequest>,
    ) -> Result<Response<v1::DetachReply>, Status> {
        self.detach_inner(req.into_inner()).await.map(Response::new)
    }

    async fn stop(&self, req: Request<v1::StopRequest>) -> Result<Response<v1::NodeReply>, Status> {
        self.stop_inner(req.into_inner()).await.map(Response::new)
    }

    async fn forget_actor(
        &self,
        req: Request<v1::ForgetActorRequest>,
    ) -> Result<Response<v1::ForgetActorReply>, Status> {
        self.forget_actor_inner(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn read_log(
        &self,
        req: Request<v1::ReadLogRequest>,
    ) -> Result<Response<v1::ReadLogReply>, Status> {
        self.read_log_inner(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_snapshots(
        &self,
        req: Request<v1::DeleteSnapshotsRequest>,
    ) -> Result<Response<v1::DeleteSnapshotsReply>, Status> {
        self.delete_snapshots_inner(req.into_inner())
            .await
            .map(Response::new)
    }
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
    ate_tls::trace_context::continue_grpc(&span, req);
    span
}
