//! The node as a client of its workers' WorkerService (over each worker's unix socket): the
//! calls take and return the node's types, and the wire messages are built and read here only.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use ate_core::{ActorRef, Fidelity};
use ate_proto::v1::{self, worker_service_client::WorkerServiceClient};
use tonic::transport::Channel;
use tracing::Instrument;

use crate::types::{CallCode, CallError, Workload};
use crate::wire;

/// Longest wait for a worker's answer to Info, Activity or RenewLease (a stopped worker
/// process accepts connections but never answers).
const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to one worker.
#[derive(Clone)]
pub struct WorkerClient {
    client: WorkerServiceClient<Channel>,
}

/// What a worker says about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerInfo {
    pub worker_id: String,
    pub epoch: u64,
    /// atunnel address(es), host:port.
    pub addresses: Vec<String>,
    pub capacity: Option<Capacity>,
    pub labels: HashMap<String, String>,
    pub sandbox_class: String,
    pub can_restore_memory: bool,
    pub identity: String,
    /// Restores memory lazily: it can restore from a generation downloaded for a lazy restore.
    pub can_restore_lazily: bool,
    /// Restore capabilities (`memory:criu`, `userns:off`, …), passed on to the api.
    pub capabilities: Vec<String>,
    /// Machine CPU offered before overcommit (millicores; 0: not reported).
    pub cpu_physical_millis: u32,
    /// CPU the worker's actors used lately (millicores), sent on with each heartbeat.
    pub cpu_usage_millis: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub actor_slots: u32,
}

/// What a worker holds and whether it is stopping.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Activity {
    pub actors: Vec<ActorActivity>,
    /// The worker is stopping (SIGTERM): each of its actors is to be suspended.
    pub draining: bool,
    /// Frozen copies the worker keeps.
    pub frozen: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActorActivity {
    pub actor: Option<ActorRef>,
    pub open_streams: u32,
    pub last_activity_unix_ms: i64,
    pub exited: bool,
    pub exit_code: i32,
    pub last_log_lines: String,
    pub idle_timeout_seconds: u32,
    pub activation: u64,
    pub crash_reason: String,
    /// The actor asked to be suspended now (its local API's `POST /v1/suspend`).
    pub suspend_requested: bool,
    /// With `crash_reason`: the generation directory the lazy restore found damaged (empty:
    /// none).
    pub damaged_generation_dir: String,
    /// What it uses: CPU lately (millicores), memory now (bytes), active since (Unix ms).
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub active_since_unix_ms: i64,
}

/// A Start: a cold boot (no generation) or a restore from a sealed generation directory.
pub struct Start {
    pub workload: Workload,
    /// None for a cold boot.
    pub generation_dir: Option<String>,
    /// Fidelity to restore at; None for a cold boot.
    pub fidelity: Option<Fidelity>,
}

/// A Checkpoint into a new generation directory.
pub struct Checkpoint {
    pub workload: Workload,
    pub generation_dir: String,
    pub fidelity: Fidelity,
    pub generation: u64,
    pub uuid: String,
    pub node: String,
    pub boot_id: String,
    pub grace_ms: u32,
}

/// What the worker wrote.
pub struct Checkpointed {
    pub epoch: u64,
    /// Fidelity actually captured (None: the worker sent none this build knows).
    pub fidelity: Option<Fidelity>,
    pub reason: String,
    pub size_bytes: u64,
    pub checksum: String,
    pub kept_frozen: bool,
}

impl WorkerClient {
    pub async fn connect(socket: &Path) -> Result<Self, String> {
        ate_worker_client::connect_worker(socket)
            .await
            .map(|client| Self { client })
            .map_err(|e| e.to_string())
    }

    /// Info, within the worker call timeout.
    pub async fn info(&mut self) -> Result<WorkerInfo, CallError> {
        let i = within(self.client.info(v1::WorkerInfoRequest {}))
            .await?
            .into_inner();
        Ok(WorkerInfo {
            worker_id: i.worker_id,
            epoch: i.epoch,
            addresses: i.addresses,
            capacity: i.capacity.map(|c| Capacity {
                cpu_millis: c.cpu_millis,
                memory_bytes: c.memory_bytes,
                actor_slots: c.actor_slots,
            }),
            labels: i.labels,
            sandbox_class: i.sandbox_class,
            can_restore_memory: i.can_restore_memory,
            identity: i.identity,
            can_restore_lazily: i.can_restore_lazily,
            capabilities: i.capabilities,
            cpu_physical_millis: i.cpu_physical_millis,
            cpu_usage_millis: i.cpu_usage_millis,
        })
    }

    /// Activity, within the worker call timeout; `with_usage`: also what each actor uses.
    pub async fn activity(&mut self, with_usage: bool) -> Result<Activity, CallError> {
        let reply = within(
            self.client
                .activity(v1::WorkerActivityRequest { with_usage }),
        )
        .await?
        .into_inner();
        Ok(Activity {
            actors: reply
                .actors
                .into_iter()
                .map(|a| ActorActivity {
                    actor: a.actor.map(wire::actor_from_wire),
                    open_streams: a.open_streams,
                    last_activity_unix_ms: a.last_activity_unix_ms,
                    exited: a.exited,
                    exit_code: a.exit_code,
                    last_log_lines: a.last_log_lines,
                    idle_timeout_seconds: a.idle_timeout_seconds,
                    activation: a.activation,
                    crash_reason: a.crash_reason,
                    suspend_requested: a.suspend_requested,
                    damaged_generation_dir: a.damaged_generation_dir,
                    cpu_millis: a.cpu_millis,
                    memory_bytes: a.memory_bytes,
                    active_since_unix_ms: a.active_since_unix_ms,
                })
                .collect(),
            draining: reply.draining,
            frozen: reply.frozen_actors,
        })
    }

    /// RenewLease, within the worker call timeout.
    pub async fn renew_lease(&mut self, valid_for_ms: u64) -> Result<(), CallError> {
        within(
            self.client
                .renew_lease(v1::WorkerLeaseRequest { valid_for_ms }),
        )
        .await
        .map(drop)
    }

    /// Stop; `activation_at_most` non-zero stops only a copy of at most that activation.
    /// Returns the worker's epoch.
    pub async fn stop(
        &mut self,
        actor: Option<&ActorRef>,
        activation_at_most: u64,
    ) -> Result<u64, CallError> {
        let req = v1::WorkerStopRequest {
            actor: actor.map(wire::actor_to_wire),
            activation_at_most,
        };
        self.client
            .stop(req)
            .await
            .map(|r| r.into_inner().epoch)
            .map_err(wire::call_error)
    }

    /// Start for the request `request_id`, in a span of its own whose trace context the
    /// worker continues. Returns the worker's epoch.
    pub fn start(
        &self,
        start: Start,
        request_id: Option<&str>,
    ) -> impl Future<Output = Result<u64, CallError>> + use<> {
        let start = v1::WorkerStartRequest {
            workload: Some(wire::workload_to_wire(&start.workload)),
            generation_dir: start.generation_dir.unwrap_or_default(),
            fidelity: wire::fidelity_to_wire(start.fidelity),
        };
        let mut client = self.client.clone();
        let span = ate_telemetry::trace_span!("worker_start", otel.kind = "client");
        let mut request = ate_proto::request_id::request(start, request_id);
        span.in_scope(|| ate_telemetry::trace_context::inject_grpc(&mut request));
        async move {
            client
                .start(request)
                .await
                .map(|r| r.into_inner().epoch)
                .map_err(wire::call_error)
        }
        .instrument(span)
    }

    pub async fn checkpoint(&self, c: Checkpoint) -> Result<Checkpointed, CallError> {
        let req = v1::WorkerCheckpointRequest {
            workload: Some(wire::workload_to_wire(&c.workload)),
            generation_dir: c.generation_dir,
            fidelity: c.fidelity.wire(),
            generation: c.generation,
            uuid: c.uuid,
            node: c.node,
            boot_id: c.boot_id,
            grace_ms: c.grace_ms,
        };
        let reply = self
            .client
            .clone()
            .checkpoint(req)
            .await
            .map_err(wire::call_error)?
            .into_inner();
        Ok(Checkpointed {
            epoch: reply.epoch,
            fidelity: Fidelity::from_wire(reply.fidelity),
            reason: reply.reason,
            size_bytes: reply.size_bytes,
            checksum: reply.checksum,
            kept_frozen: reply.kept_frozen,
        })
    }
}

impl WorkerClient {
    /// Exec: `requests` (the start first) to the worker, its output back. No time limit: the
    /// session lasts as long as its command.
    pub async fn exec(
        &self,
        requests: impl tonic::IntoStreamingRequest<Message = v1::PlacedExecRequest>,
    ) -> Result<tonic::Streaming<v1::ExecOutput>, tonic::Status> {
        Ok(self.client.clone().exec(requests).await?.into_inner())
    }
}

async fn within<T>(call: impl Future<Output = Result<T, tonic::Status>>) -> Result<T, CallError> {
    match tokio::time::timeout(WORKER_CALL_TIMEOUT, call).await {
        Ok(answer) => answer.map_err(wire::call_error),
        Err(_) => Err(CallError::new(
            CallCode::DeadlineExceeded,
            "the worker did not answer",
        )),
    }
}
