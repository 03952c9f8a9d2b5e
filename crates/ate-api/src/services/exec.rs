//! ActorService.ExecActor: a command inside the actor's sandbox (`ate exec`). The caller's
//! role is checked (admin, or a client for the actor's atespace: never the router), an audit
//! line names the caller and the command, the workflow finds (or resumes) the actor's worker,
//! and the stream is relayed to that worker's node and back. A caller that goes away ends the
//! relay, which cancels the node's stream and so the worker's session (its process is killed).

use ate_proto::exec_relay::relay_output;
use ate_proto::v1::{self, ExecActorRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{Services, actor_ref, label, to_completion};
use crate::authz::Need;
use crate::convert;

pub(super) type ExecStream = ate_proto::exec_relay::ExecOutputStream;

const RPC: &str = "ActorService/ExecActor";

impl Services {
    pub(super) async fn exec(
        &self,
        req: Request<Streaming<ExecActorRequest>>,
    ) -> Result<Response<ExecStream>, Status> {
        let caller = self.authz.caller(&req)?;
        let mut inbound = req.into_inner();
        let start = match inbound.message().await? {
            Some(ExecActorRequest {
                request: Some(v1::exec_actor_request::Request::Start(s)),
            }) => s,
            _ => {
                return Err(Status::invalid_argument(
                    "exec: the first message must be the start",
                ));
            }
        };
        let r = actor_ref(start.actor.clone())?;
        caller.check(RPC, Need::Exec(&r.atespace))?;
        if start.command.first().is_none_or(String::is_empty) {
            return Err(Status::invalid_argument("invalid command: empty"));
        }
        let container = Some(start.container.clone()).filter(|c| !c.is_empty());
        if let Some(c) = &container {
            label("container", c)?;
        }
        tracing::info!(
            target: "audit",
            identity = %caller.identity,
            role = %caller.role,
            actor = %r,
            container = container.as_deref().unwrap_or(""),
            command = ?start.command,
            tty = start.tty,
            stdin = start.stdin,
            "exec"
        );
        let api = self.api.clone();
        let target = {
            let r = r.clone();
            to_completion(async move { api.exec_target(&r, container.as_deref()).await }).await?
        };
        tracing::info!(actor = %r, node = %target.node, worker = %target.worker_id, resumed = target.resumed, "exec: relaying to the node");
        let mut node = self.api.exec_node(&target).map_err(convert::status)?;
        let (to_node, upstream) = mpsc::channel(16);
        let first = v1::PlacedExecRequest {
            request: Some(v1::placed_exec_request::Request::Start(
                v1::PlacedExecStart {
                    exec: Some(start),
                    worker_id: target.worker_id.clone(),
                    activation: target.activation,
                    caller: caller.identity.to_string(),
                },
            )),
        };
        to_node
            .send(first)
            .await
            .map_err(|_| Status::internal("exec: relay closed"))?;
        let feeder = tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                // A second start is ignored: only input follows the first message.
                let Some(v1::exec_actor_request::Request::Input(input)) = m.request else {
                    continue;
                };
                let m = v1::PlacedExecRequest {
                    request: Some(v1::placed_exec_request::Request::Input(input)),
                };
                if to_node.send(m).await.is_err() {
                    return;
                }
            }
        });
        let answers = node.exec(ReceiverStream::new(upstream)).await?;
        Ok(Response::new(relay_output(answers, feeder)))
    }
}
