//! Clients of node agents, one lazily-connected channel per node address, and the adapter the
//! workflows call them through: methods take store records and core types, build the
//! NodeService messages, and answer a failed call as a [`NodeError`]. The pool is the api's
//! [`NodeCalls`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_core::{ActorRef, DurableStatus, Fidelity};
use ate_proto::v1;
use ate_proto::v1::node_service_client::NodeServiceClient;
use ate_store::{ActorRecord, SnapshotRecord, TemplateRecord};
use ate_tls::rustls::ClientConfig;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::convert;
use crate::error::WorkflowError;
use crate::node_calls::{NodeAnswer, NodeCalls};
use crate::workflows::Damage;

/// Pool of node-agent clients keyed by gRPC address (`host:port` or `http://host:port`).
#[derive(Default)]
pub struct NodeClients {
    channels: Mutex<HashMap<String, Channel>>,
    /// mTLS (the api's certificate, the node's SPIFFE ID pinned); None: plaintext.
    tls: Option<Arc<ClientConfig>>,
}

impl NodeClients {
    pub fn new(tls: Option<Arc<ClientConfig>>) -> Self {
        Self {
            channels: Mutex::default(),
            tls,
        }
    }

    /// The node agent at `address`. Connection happens on first use, so a down node surfaces
    /// as a transient [`NodeError`] of the call (a state the router parks on), not here.
    pub fn client(&self, address: &str) -> Result<NodeAgent, WorkflowError> {
        let mut channels = self
            .channels
            .lock()
            .map_err(|_| WorkflowError::Internal("node client pool poisoned".to_string()))?;
        if let Some(ch) = channels.get(address) {
            return Ok(NodeAgent(NodeServiceClient::new(ch.clone())));
        }
        let endpoint = ate_tls::endpoint(address)
            .map_err(|e| {
                WorkflowError::FailedPrecondition(format!("bad node address {address:?}: {e}"))
            })?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10));
        let channel = match &self.tls {
            Some(tls) => ate_tls::tls_channel_lazy(endpoint, tls.clone()),
            None => endpoint.connect_lazy(),
        };
        channels.insert(address.to_string(), channel.clone());
        Ok(NodeAgent(NodeServiceClient::new(channel)))
    }
}

/// How a node answered a failed call, as far as the workflows tell answers apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeErrorKind {
    /// The node gave up the operation and undid it (a checkpoint that wrote nothing: the actor
    /// runs on). Transient, like the next kind, for the workflows that do not single it out.
    Aborted,
    /// Unavailable, timed out, cancelled or unknown: the actor stays where it is; retry later.
    Transient,
    /// The operation failed on the node.
    Failed,
    /// A checkpoint failed and took the sandbox with it (DATA_LOSS from the worker): nothing
    /// was written and the actor no longer runs, so its previous generation is what remains.
    SandboxLost,
}

/// A failed node call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    pub kind: NodeErrorKind,
    /// The call never reached the node (a transport failure: refused, reset, no route).
    pub unreached: bool,
    /// The node's (or the transport's) message.
    pub message: String,
    /// Copies of the generation the node found damaged (a Restore's status details).
    pub damage: Option<Damage>,
}

impl NodeError {
    /// Leaves the actor where it is (retry later) rather than crash it.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, NodeErrorKind::Aborted | NodeErrorKind::Transient)
    }
}

impl From<Status> for NodeError {
    fn from(status: Status) -> Self {
        use std::error::Error as _;
        let kind = match status.code() {
            Code::Aborted => NodeErrorKind::Aborted,
            Code::DataLoss => NodeErrorKind::SandboxLost,
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                NodeErrorKind::Transient
            }
            _ => NodeErrorKind::Failed,
        };
        NodeError {
            kind,
            // A transport failure carries its local error as the status's source; a status the
            // node sent has none.
            unreached: status.source().is_some(),
            message: status.message().to_string(),
            damage: ate_proto::damage::damage_of(&status).map(convert::damage),
        }
    }
}

/// What a node needs to start (or checkpoint) an actor on one of its workers.
pub struct Workload<'a> {
    pub actor: &'a ActorRecord,
    pub template: &'a TemplateRecord,
    pub worker_id: &'a str,
}

impl Workload<'_> {
    fn wire(&self) -> v1::Workload {
        v1::Workload {
            actor: Some(object_ref(&self.actor.atespace, &self.actor.name)),
            uid: self.actor.uid.clone(),
            template: self.actor.template.to_string(),
            spec: Some(ate_proto::spec_to_wire(&self.template.spec)),
            worker_id: self.worker_id.to_string(),
            activation: self.actor.activation,
        }
    }
}

/// What one running actor of a worker is doing (NodeService.ActorActivity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningActivity {
    pub actor: ActorRef,
    /// Requests, streams, outbound connections and exec sessions open now.
    pub open_streams: u32,
    pub last_activity_unix_ms: i64,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub active_since_unix_ms: i64,
}

/// A started actor: the epoch of the worker that runs it.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    pub epoch: u64,
}

/// A checkpoint's result.
#[derive(Debug, Clone)]
pub struct Checkpointed {
    /// The generation written, None if the node's answer has none that can be recorded.
    pub snapshot: Option<SnapshotRecord>,
    /// The worker kept the actor frozen in place: a resume of this generation there is a thaw.
    pub kept_frozen: bool,
}

/// A generation's durable copy after a detach.
#[derive(Debug, Clone)]
pub struct Detached {
    pub generation: u64,
    pub durable_status: DurableStatus,
    pub durable_uri: String,
    pub reason: String,
}

/// A part of an actor's log on a node.
#[derive(Debug, Clone)]
pub struct LogChunk {
    /// False when the node has no log of the actor.
    pub found: bool,
    pub data: Vec<u8>,
    pub next_offset: u64,
}

/// One node agent's NodeService.
pub struct NodeAgent(NodeServiceClient<Channel>);

fn object_ref(atespace: &str, name: &str) -> v1::ObjectRef {
    v1::ObjectRef {
        atespace: atespace.to_string(),
        name: name.to_string(),
    }
}

/// A call to a node agent for the request `request_id`, continuing the current span's trace.
fn traced<T>(message: T, request_id: Option<&str>) -> tonic::Request<T> {
    let mut request = ate_proto::request_id::request(message, request_id);
    ate_telemetry::trace_context::inject_grpc(&mut request);
    request
}

impl NodeAgent {
    /// Cold boot (no generation).
    pub async fn run(
        &mut self,
        workload: &Workload<'_>,
        request_id: Option<&str>,
    ) -> Result<Started, NodeError> {
        let req = v1::RunRequest {
            workload: Some(workload.wire()),
        };
        let reply = self.0.run(traced(req, request_id)).await?.into_inner();
        Ok(Started { epoch: reply.epoch })
    }

    /// Restores `snapshot` at `fidelity` (which may be lower than the generation's own).
    pub async fn restore(
        &mut self,
        workload: &Workload<'_>,
        snapshot: &SnapshotRecord,
        fidelity: Fidelity,
        request_id: Option<&str>,
    ) -> Result<Started, NodeError> {
        let req = v1::RestoreRequest {
            workload: Some(workload.wire()),
            snapshot: Some(convert::snapshot(snapshot)),
            fidelity: fidelity.wire(),
        };
        let reply = self.0.restore(traced(req, request_id)).await?.into_inner();
        Ok(Started { epoch: reply.epoch })
    }

    /// Writes `generation` (named `uuid`) of the workload's actor; `grace_ms` for requests in
    /// flight (0: the worker's default). The generation's record is dated at the answer.
    pub async fn checkpoint(
        &mut self,
        workload: &Workload<'_>,
        generation: u64,
        uuid: String,
        fidelity: Fidelity,
        durable: bool,
        grace_ms: u32,
    ) -> Result<Checkpointed, NodeError> {
        let req = v1::CheckpointRequest {
            workload: Some(workload.wire()),
            generation,
            uuid,
            fidelity: fidelity.wire(),
            durable,
            grace_ms,
        };
        let reply = self.0.checkpoint(req).await?.into_inner();
        let actor = workload.actor;
        let snapshot = reply.snapshot.as_ref().and_then(|s| {
            convert::snapshot_from_wire(s, &actor.atespace, &actor.name, ate_core::clock::now_ms())
        });
        Ok(Checkpointed {
            snapshot,
            kept_frozen: reply.kept_frozen,
        })
    }

    /// Uploads the actor's node-local `snapshots` (unless durable already) and drops the local
    /// copies; answers each one's durable copy (an unknown status counts as FAILED).
    pub async fn detach(
        &mut self,
        actor: &ActorRef,
        snapshots: &[SnapshotRecord],
    ) -> Result<Vec<Detached>, NodeError> {
        let req = v1::DetachRequest {
            actor: Some(object_ref(&actor.atespace, &actor.name)),
            snapshots: snapshots.iter().map(convert::snapshot).collect(),
        };
        let reply = self.0.detach(req).await?.into_inner();
        Ok(reply
            .snapshots
            .into_iter()
            .map(|s| Detached {
                generation: s.generation,
                durable_status: DurableStatus::from_wire(s.durable_status)
                    .unwrap_or(DurableStatus::Failed),
                durable_uri: s.durable_uri,
                reason: s.reason,
            })
            .collect())
    }

    /// Stops the actor's sandbox on `worker_id` without a snapshot.
    pub async fn stop(&mut self, actor: &ActorRef, worker_id: &str) -> Result<(), NodeError> {
        let req = v1::StopRequest {
            actor: Some(object_ref(&actor.atespace, &actor.name)),
            worker_id: worker_id.to_string(),
        };
        self.0.stop(req).await?;
        Ok(())
    }

    /// What the actors running on `worker_id` are doing now (those the node names).
    pub async fn actor_activity(
        &mut self,
        worker_id: &str,
    ) -> Result<Vec<RunningActivity>, NodeError> {
        let req = v1::ActorActivityRequest {
            worker_id: worker_id.to_string(),
        };
        let actors = self.0.actor_activity(req).await?.into_inner().actors;
        Ok(actors
            .into_iter()
            .filter_map(|a| {
                let r = a.actor?;
                Some(RunningActivity {
                    actor: ActorRef::new(r.atespace, r.name),
                    open_streams: a.open_streams,
                    last_activity_unix_ms: a.last_activity_unix_ms,
                    cpu_millis: a.cpu_millis,
                    memory_bytes: a.memory_bytes,
                    active_since_unix_ms: a.active_since_unix_ms,
                })
            })
            .collect())
    }

    /// The actor was deleted: the node removes what it keeps of it outside its generations,
    /// and the external volume directories in `purge_dirs`. Returns how many it removed.
    pub async fn forget_actor(
        &mut self,
        actor: &ActorRef,
        purge_dirs: Vec<String>,
    ) -> Result<u32, NodeError> {
        let req = v1::ForgetActorRequest {
            actor: Some(object_ref(&actor.atespace, &actor.name)),
            purge_dirs,
        };
        Ok(self.0.forget_actor(req).await?.into_inner().dirs_removed)
    }

    /// Deletes the generations' local directories and durable objects.
    pub async fn delete_snapshots(
        &mut self,
        snapshots: &[SnapshotRecord],
    ) -> Result<(), NodeError> {
        let req = v1::DeleteSnapshotsRequest {
            snapshots: snapshots.iter().map(convert::snapshot).collect(),
        };
        self.0.delete_snapshots(req).await?;
        Ok(())
    }

    /// Exec on the node: `requests` (the start first) relayed to the actor's worker, its
    /// output back. The status is the node's (or the worker's) as it is.
    pub async fn exec(
        &mut self,
        requests: impl tonic::IntoStreamingRequest<Message = v1::PlacedExecRequest>,
    ) -> Result<tonic::Streaming<v1::ExecOutput>, Status> {
        Ok(self.0.exec(requests).await?.into_inner())
    }

    /// Up to `max_bytes` of the actor's log on this node, from `offset`.
    pub async fn read_log(
        &mut self,
        actor: &ActorRef,
        offset: u64,
        max_bytes: u32,
    ) -> Result<LogChunk, NodeError> {
        let req = v1::ReadLogRequest {
            actor: Some(object_ref(&actor.atespace, &actor.name)),
            offset,
            max_bytes,
        };
        let reply = self.0.read_log(req).await?.into_inner();
        Ok(LogChunk {
            found: reply.found,
            data: reply.data,
            next_offset: reply.next_offset,
        })
    }
}

/// The api's [`NodeCalls`]: each call on the pooled gRPC client of the node at `address`.
#[async_trait::async_trait]
impl NodeCalls for NodeClients {
    async fn run(
        &self,
        address: &str,
        workload: &Workload<'_>,
        request_id: Option<&str>,
    ) -> Result<NodeAnswer<Started>, WorkflowError> {
        Ok(self.client(address)?.run(workload, request_id).await)
    }

    async fn restore(
        &self,
        address: &str,
        workload: &Workload<'_>,
        snapshot: &SnapshotRecord,
        fidelity: Fidelity,
        request_id: Option<&str>,
    ) -> Result<NodeAnswer<Started>, WorkflowError> {
        let mut client = self.client(address)?;
        Ok(client
            .restore(workload, snapshot, fidelity, request_id)
            .await)
    }

    async fn checkpoint(
        &self,
        address: &str,
        workload: &Workload<'_>,
        generation: u64,
        uuid: String,
        fidelity: Fidelity,
        durable: bool,
        grace_ms: u32,
    ) -> Result<NodeAnswer<Checkpointed>, WorkflowError> {
        let mut client = self.client(address)?;
        Ok(client
            .checkpoint(workload, generation, uuid, fidelity, durable, grace_ms)
            .await)
    }

    async fn detach(
        &self,
        address: &str,
        actor: &ActorRef,
        snapshots: &[SnapshotRecord],
    ) -> Result<NodeAnswer<Vec<Detached>>, WorkflowError> {
        Ok(self.client(address)?.detach(actor, snapshots).await)
    }

    async fn stop(
        &self,
        address: &str,
        actor: &ActorRef,
        worker_id: &str,
    ) -> Result<NodeAnswer<()>, WorkflowError> {
        Ok(self.client(address)?.stop(actor, worker_id).await)
    }

    async fn actor_activity(
        &self,
        address: &str,
        worker_id: &str,
    ) -> Result<NodeAnswer<Vec<RunningActivity>>, WorkflowError> {
        Ok(self.client(address)?.actor_activity(worker_id).await)
    }

    async fn forget_actor(
        &self,
        address: &str,
        actor: &ActorRef,
        purge_dirs: Vec<String>,
    ) -> Result<NodeAnswer<u32>, WorkflowError> {
        Ok(self.client(address)?.forget_actor(actor, purge_dirs).await)
    }

    async fn delete_snapshots(
        &self,
        address: &str,
        snapshots: &[SnapshotRecord],
    ) -> Result<NodeAnswer<()>, WorkflowError> {
        Ok(self.client(address)?.delete_snapshots(snapshots).await)
    }

    async fn read_log(
        &self,
        address: &str,
        actor: &ActorRef,
        offset: u64,
        max_bytes: u32,
    ) -> Result<NodeAnswer<LogChunk>, WorkflowError> {
        Ok(self
            .client(address)?
            .read_log(actor, offset, max_bytes)
            .await)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tonic::{Code, Status};

    use super::{NodeError, NodeErrorKind};

    #[test]
    fn node_answers_are_classed_as_the_workflows_decide_on_them() {
        let cases = [
            (Code::Aborted, NodeErrorKind::Aborted, true),
            (Code::Unavailable, NodeErrorKind::Transient, true),
            (Code::DeadlineExceeded, NodeErrorKind::Transient, true),
            (Code::Cancelled, NodeErrorKind::Transient, true),
            (Code::Unknown, NodeErrorKind::Transient, true),
            (Code::Internal, NodeErrorKind::Failed, false),
            (Code::DataLoss, NodeErrorKind::SandboxLost, false),
            (Code::FailedPrecondition, NodeErrorKind::Failed, false),
            (Code::NotFound, NodeErrorKind::Failed, false),
            (Code::InvalidArgument, NodeErrorKind::Failed, false),
        ];
        for (code, kind, transient) in cases {
            let e = NodeError::from(Status::new(code, "the node's words"));
            assert_eq!(e.kind, kind, "{code:?}");
            assert_eq!(e.is_transient(), transient, "{code:?}");
            // The node answered: a status it sent carries no local source.
            assert!(!e.unreached, "{code:?}");
            assert_eq!(e.message, "the node's words");
        }
    }

    #[test]
    fn a_damaged_copy_comes_with_the_failure() {
        let damage = ate_proto::v1::GenerationDamage {
            generation: 4,
            uuid: "u-4".into(),
            local: "rootfs.tar: size 3 bytes, manifest says 4".into(),
            durable: "criu/pages-1.img chunk 2 is damaged".into(),
        };
        let status =
            ate_proto::damage::with_damage(Status::failed_precondition("restore failed"), &damage);
        let e = NodeError::from(status);
        assert_eq!(e.kind, NodeErrorKind::Failed);
        assert_eq!(e.message, "restore failed");
        assert_eq!(
            e.damage,
            Some(crate::workflows::Damage {
                generation: 4,
                uuid: "u-4".into(),
                local: Some("rootfs.tar: size 3 bytes, manifest says 4".into()),
                durable: Some("criu/pages-1.img chunk 2 is damaged".into()),
            })
        );
        assert_eq!(NodeError::from(Status::internal("x")).damage, None);
    }

    #[test]
    fn a_transport_failure_is_unreached() {
        let mut status = Status::unavailable("tcp connect error");
        status.set_source(Arc::new(std::io::Error::other("connection refused")));
        let e = NodeError::from(status);
        assert!(e.unreached);
        assert!(e.is_transient());
        assert_eq!(e.message, "tcp connect error");
    }
}
