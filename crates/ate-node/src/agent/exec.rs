//! Exec (`ate exec`): the api's stream relayed to the worker the actor runs on, and the
//! worker's answers back, unchanged. Part of the gRPC adapter (like `service.rs`): the messages
//! are not the node's business, only where they go (the start's `worker_id`) and that a caller
//! going away ends the worker's session (its stream is dropped, which cancels the worker call).

use ate_proto::exec_relay::relay_output;
use ate_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{NodeAgent, convert};

pub(super) type ExecStream = ate_proto::exec_relay::ExecOutputStream;

impl NodeAgent {
    pub(super) async fn exec_relay(
        &self,
        req: Request<Streaming<v1::PlacedExecRequest>>,
    ) -> Result<Response<ExecStream>, Status> {
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("exec: the stream ended before its start"))?;
        let worker_id = match &first.request {
            Some(v1::placed_exec_request::Request::Start(s)) => s.worker_id.clone(),
            _ => {
                return Err(Status::invalid_argument(
                    "exec: the first message must be the start",
                ));
            }
        };
        let worker = self.worker(&worker_id).map_err(|e| convert::status(&e))?;
        let (to_worker, upstream) = mpsc::channel(16);
        to_worker
            .send(first)
            .await
            .map_err(|_| Status::internal("exec: relay closed"))?;
        let feeder = tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if to_worker.send(m).await.is_err() {
                    return;
                }
            }
        });
        let answers = worker.client.exec(ReceiverStream::new(upstream)).await?;
        Ok(Response::new(relay_output(answers, feeder)))
    }
}
