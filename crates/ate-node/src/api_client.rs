//! The node as a client of the api (FleetService and ActorService, over one channel that fails
//! over between `--api` replicas): the calls take and return the node's types, and the wire
//! messages are built and read here only.

use std::sync::Arc;
use std::time::Duration;

use ate_core::{ActorRef, DurableStatus, SuspendMode};
use ate_proto::v1::{
    self, actor_service_client::ActorServiceClient, fleet_service_client::FleetServiceClient,
};
use tonic::transport::Channel;

use crate::types::{CallError, Damage};
use crate::wire;
use crate::worker_client::WorkerInfo;

#[derive(Clone)]
pub struct ApiClient {
    fleet: FleetServiceClient<Channel>,
    actors: ActorServiceClient<Channel>,
}

/// A node's worker as it registers with the api.
pub struct Registering<'a> {
    pub info: &'a WorkerInfo,
    pub node: &'a str,
    /// gRPC address of this node agent.
    pub node_address: &'a str,
    pub boot_id: &'a str,
    /// The actors the worker holds, with their activations.
    pub held: &'a [HeldActor],
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeldActor {
    pub actor: Option<ActorRef>,
    pub activation: u64,
}

/// The api's answer to a registration.
pub struct Registration {
    /// Held copies the worker must discard.
    pub discard: Vec<HeldActor>,
    /// The liveness lease in seconds (0: the api did not say).
    pub lease_seconds: u32,
}

/// All of an actor's processes exited on a worker.
#[derive(Debug, Clone)]
pub struct ActorExit {
    pub actor: ActorRef,
    pub worker_id: String,
    pub epoch: u64,
    pub exit_code: i32,
    pub last_log_lines: String,
    /// Non-empty: the worker ended the actor because it must not run on.
    pub crash_reason: String,
    /// With `crash_reason`: the copy of the generation found damaged.
    pub damage: Option<Damage>,
    /// The activation of the copy that exited (0: unknown).
    pub activation: u64,
}

impl ApiClient {
    /// A lazy channel to `api` (one address, or several replicas comma-separated). Calls
    /// time out after 30 s, connects after 2 s.
    pub fn connect_lazy(
        api: &str,
        tls: Option<Arc<ate_tls::rustls::ClientConfig>>,
    ) -> Result<Self, ate_tls::TlsError> {
        let channel = ate_tls::replicas_channel_lazy(
            api,
            tls,
            Duration::from_secs(2),
            // No call of the node's loops may hang on an api that stopped answering.
            |e| e.timeout(Duration::from_secs(30)),
        )?;
        Ok(Self {
            fleet: FleetServiceClient::new(channel.clone()),
            actors: ActorServiceClient::new(channel),
        })
    }

    pub async fn register_worker(&self, r: Registering<'_>) -> Result<Registration, CallError> {
        let info = r.info;
        let worker = v1::Worker {
            id: info.worker_id.clone(),
            node: r.node.to_string(),
            addresses: info.addresses.clone(),
            identity: info.identity.clone(),
            labels: info.labels.clone(),
            sandbox_class: info.sandbox_class.clone(),
            can_restore_memory: info.can_restore_memory,
            capacity: info.capacity.map(|c| v1::Capacity {
                cpu_millis: c.cpu_millis,
                memory_bytes: c.memory_bytes,
                actor_slots: c.actor_slots,
            }),
            used: None,
            epoch: info.epoch,
            status: String::new(),
            last_heartbeat_unix_ms: 0,
            node_address: r.node_address.to_string(),
            boot_id: r.boot_id.to_string(),
            capabilities: info.capabilities.clone(),
            cpu_physical_millis: info.cpu_physical_millis,
            cpu_usage_millis: 0,
        };
        let held = r
            .held
            .iter()
            .map(|h| v1::HeldActor {
                actor: h.actor.as_ref().map(wire::actor_to_wire),
                activation: h.activation,
            })
            .collect();
        let reply = self
            .fleet
            .clone()
            .register_worker(v1::RegisterWorkerRequest {
                worker: Some(worker),
                held,
            })
            .await
            .map_err(wire::call_error)?
            .into_inner();
        Ok(Registration {
            discard: reply
                .discard
                .into_iter()
                .map(|d| HeldActor {
                    actor: d.actor.map(wire::actor_from_wire),
                    activation: d.activation,
                })
                .collect(),
            lease_seconds: reply.lease_seconds,
        })
    }

    /// Heartbeat; Ok(false) when the api no longer knows the worker (it must register again).
    /// A heartbeat for the worker, with the CPU its actors used lately (millicores).
    pub async fn heartbeat(
        &self,
        worker_id: &str,
        epoch: u64,
        cpu_usage_millis: u32,
    ) -> Result<bool, CallError> {
        let req = v1::HeartbeatRequest {
            worker_id: worker_id.to_string(),
            epoch,
            cpu_usage_millis,
        };
        self.fleet
            .clone()
            .heartbeat(req)
            .await
            .map(|r| r.get_ref().known)
            .map_err(wire::call_error)
    }

    pub async fn report_actor_exit(&self, exit: ActorExit) -> Result<(), CallError> {
        let req = v1::ReportActorExitRequest {
            actor: Some(wire::actor_to_wire(&exit.actor)),
            worker_id: exit.worker_id,
            epoch: exit.epoch,
            exit_code: exit.exit_code,
            last_log_lines: exit.last_log_lines,
            crash_reason: exit.crash_reason,
            damage: exit.damage.as_ref().map(wire::damage_to_wire),
            activation: exit.activation,
        };
        self.fleet
            .clone()
            .report_actor_exit(req)
            .await
            .map(drop)
            .map_err(wire::call_error)
    }

    /// The outcome of a generation's background upload.
    pub async fn report_snapshot(
        &self,
        actor: &ActorRef,
        generation: u64,
        status: DurableStatus,
        durable_uri: String,
        reason: String,
    ) -> Result<(), CallError> {
        let req = v1::ReportSnapshotRequest {
            actor: Some(wire::actor_to_wire(actor)),
            generation,
            durable_status: status.wire(),
            durable_uri,
            reason,
        };
        self.fleet
            .clone()
            .report_snapshot(req)
            .await
            .map(drop)
            .map_err(wire::call_error)
    }

    pub async fn suspend_actor(
        &self,
        actor: &ActorRef,
        mode: SuspendMode,
        grace_ms: u32,
        reason: String,
    ) -> Result<(), CallError> {
        let req = v1::SuspendActorRequest {
            actor: Some(wire::actor_to_wire(actor)),
            mode: mode.wire(),
            grace_ms,
            reason,
        };
        self.actors
            .clone()
            .suspend_actor(req)
            .await
            .map(drop)
            .map_err(wire::call_error)
    }
}
