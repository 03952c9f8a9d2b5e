//! FleetService: what node agents report about their workers (registration with the
//! reconciliation of held actors, heartbeats, snapshots, exits).

use std::collections::BTreeMap;

use ate_core::DurableStatus;
use ate_core::clock::now_ms;
use ate_proto::v1::{self, *};
use ate_store::{Capacity, WorkerRecord, WorkerStatus};
use tonic::{Request, Response, Status};

use super::{Services, actor_ref, label};
use crate::authz::Need;
use crate::convert::{self, invalid, store_status};
use crate::workflows::ActorExit;

/// Longest wait for the store to record a heartbeat (the node waits 3 s for the answer).
const HEARTBEAT_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

fn worker_record(w: v1::Worker) -> Result<WorkerRecord, Status> {
    label("worker.id", &w.id)?;
    label("worker.node", &w.node)?;
    label("worker.sandbox_class", &w.sandbox_class)?;
    if w.addresses.is_empty()
        || w.addresses
            .iter()
            .any(|a| a.parse::<std::net::SocketAddr>().is_err())
    {
        return Err(Status::invalid_argument(format!(
            "invalid worker.addresses: {:?} must be one or more ip:port",
            w.addresses
        )));
    }
    if w.node_address.is_empty() {
        return Err(Status::invalid_argument(
            "invalid worker.node_address: must not be empty",
        ));
    }
    let cap = w
        .capacity
        .ok_or_else(|| Status::invalid_argument("invalid worker.capacity: missing"))?;
    if cap.actor_slots == 0 || cap.cpu_millis == 0 || cap.memory_bytes == 0 {
        return Err(Status::invalid_argument(
            "invalid worker.capacity: cpu, memory and actor slots must be positive",
        ));
    }
    if w.cpu_physical_millis > cap.cpu_millis {
        return Err(Status::invalid_argument(format!(
            "invalid worker.cpu_physical_millis: {} exceeds capacity.cpu_millis {} (the \
             overcommitted CPU is at least the machine's)",
            w.cpu_physical_millis, cap.cpu_millis
        )));
    }
    if w.epoch == 0 || i64::try_from(w.epoch).is_err() {
        return Err(Status::invalid_argument(format!(
            "invalid worker.epoch: {} must be between 1 and 2^63-1",
            w.epoch
        )));
    }
    let labels: BTreeMap<String, String> = w.labels.into_iter().collect();
    ate_core::selector::validate("worker.labels", &labels).map_err(invalid)?;
    if let Some(bad) = w
        .capabilities
        .iter()
        .find(|c| !ate_core::capability::is_valid(c))
    {
        return Err(Status::invalid_argument(format!(
            "invalid worker.capabilities: {bad:?} is not <kind>:<value> in [a-z0-9.-]"
        )));
    }
    Ok(WorkerRecord {
        id: w.id,
        node: w.node,
        addresses: w.addresses,
        identity: w.identity,
        labels,
        sandbox_class: w.sandbox_class,
        can_restore_memory: w.can_restore_memory,
        capabilities: w.capabilities,
        capacity: Capacity {
            cpu_millis: u64::from(cap.cpu_millis),
            memory_bytes: cap.memory_bytes,
            slots: u64::from(cap.actor_slots),
        },
        used: Capacity::default(),
        cpu_physical_millis: u64::from(w.cpu_physical_millis),
        cpu_usage_millis: 0,
        epoch: w.epoch,
        status: WorkerStatus::Active,
        last_heartbeat_ms: 0,
        node_address: w.node_address,
        boot_id: w.boot_id,
    })
}

#[tonic::async_trait]
impl fleet_service_server::FleetService for Services {
    async fn register_worker(
        &self,
        req: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let caller = self.authorize(&req, "FleetService/RegisterWorker", |_| Need::Fleet)?;
        let req = req.into_inner();
        let w = req
            .worker
            .ok_or_else(|| Status::invalid_argument("invalid worker: missing"))?;
        let record = worker_record(w)?;
        let held = req.held;
        for (i, h) in held.iter().enumerate() {
            let a = h.actor.as_ref().ok_or_else(|| {
                Status::invalid_argument(format!("invalid held[{i}].actor: missing"))
            })?;
            label(&format!("held[{i}].actor.atespace"), &a.atespace)?;
            label(&format!("held[{i}].actor.name"), &a.name)?;
        }
        // Registration and reconciliation as one step against the worker's expiry (see
        // `Api::worker_locks`).
        let _worker = self.api.lock_worker(&record.id).await;
        let previous = match self.api.store.get_worker(&record.id).await {
            Ok(p) => Some(p),
            Err(ate_store::StoreError::NotFound(_)) => None,
            Err(e) => return Err(store_status(e)),
        };
        // A node bound to a name registers only its own workers, and cannot take over a live
        // worker of another node (that would move the other node's actors under it).
        if let Some(Some(node)) = caller.node_agent() {
            let target = format!("worker {}", record.id);
            if record.node != node {
                return Err(caller.deny(
                    "FleetService/RegisterWorker",
                    &target,
                    &format!("the worker names node {}", record.node),
                ));
            }
            if let Some(p) = &previous
                && p.node != node
                && p.status == WorkerStatus::Active
            {
                return Err(caller.deny(
                    "FleetService/RegisterWorker",
                    &target,
                    &format!("the worker is registered to node {}", p.node),
                ));
            }
        }
        // A new epoch (the worker process restarted) or a return from GONE: whatever the
        // worker does not hold any more is released; what it holds is kept or discarded.
        let restarted =
            previous.is_some_and(|p| p.epoch != record.epoch || p.status == WorkerStatus::Gone);
        self.api
            .store
            .register_worker(&record, now_ms())
            .await
            .map_err(store_status)?;
        // Every entry names its actor (checked above).
        let held: Vec<_> = held.iter().filter_map(convert::held_from_wire).collect();
        let discard = self
            .api
            .reconcile_worker(&record.id, &held, restarted)
            .await
            .map_err(store_status)?;
        self.api.fleet.refresh().await.map_err(store_status)?;
        tracing::info!(worker = %record.id, node = %record.node, epoch = record.epoch, held = held.len(), discard = discard.len(), "worker registered");
        let interval = (self.api.heartbeat_timeout().as_secs() / 3).max(1);
        Ok(Response::new(RegisterWorkerResponse {
            heartbeat_interval_seconds: u32::try_from(interval).unwrap_or(1),
            discard: discard.iter().map(convert::held).collect(),
            lease_seconds: u32::try_from(self.api.heartbeat_timeout().as_secs().max(1))
                .unwrap_or(u32::MAX),
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let _ = self.authorize(&req, "FleetService/Heartbeat", |_| Need::Fleet)?;
        let req = req.into_inner();
        label("worker_id", &req.worker_id)?;
        // A store that does not answer (its server gone, connections being retried) must not
        // hold the heartbeat past the node's patience: treat it as down.
        let recorded = tokio::time::timeout(
            HEARTBEAT_STORE_TIMEOUT,
            self.api.store.heartbeat_worker(
                &req.worker_id,
                req.epoch,
                u64::from(req.cpu_usage_millis),
                now_ms(),
            ),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ate_store::StoreError::Database(format!(
                "the store did not answer within {HEARTBEAT_STORE_TIMEOUT:?}"
            )))
        });
        let known = match recorded {
            Ok(known) => known,
            Err(e) => {
                // This heartbeat is lost: expiry must not count the time it covered.
                self.api.store_outage_seen();
                // The only replica cannot release anyone while its store is down (and waits a
                // whole lease after it is back), so the worker may go on serving.
                if self.api.sole_replica() && matches!(e, ate_store::StoreError::Database(_)) {
                    tracing::debug!(worker = %req.worker_id, error = %e, "store down; heartbeat acknowledged unrecorded (sole replica)");
                    return Ok(Response::new(HeartbeatResponse { known: true }));
                }
                return Err(store_status(e));
            }
        };
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn deregister_worker(
        &self,
        req: Request<DeregisterWorkerRequest>,
    ) -> Result<Response<DeregisterWorkerResponse>, Status> {
        let caller = self.authorize(&req, "FleetService/DeregisterWorker", |_| Need::Fleet)?;
        let id = req.into_inner().worker_id;
        label("worker_id", &id)?;
        self.check_node_worker(&caller, "FleetService/DeregisterWorker", &id)
            .await?;
        let _worker = self.api.lock_worker(&id).await;
        self.api
            .store
            .deregister_worker(&id)
            .await
            .map_err(store_status)?;
        self.api
            .release_actors_of(&id)
            .await
            .map_err(store_status)?;
        self.api.fleet.refresh().await.map_err(store_status)?;
        Ok(Response::new(DeregisterWorkerResponse {}))
    }

    async fn list_workers(
        &self,
        _req: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        let _ = self.authorize(&_req, "FleetService/ListWorkers", |_| Need::Fleet)?;
        let rows = self.api.store.list_workers().await.map_err(store_status)?;
        Ok(Response::new(ListWorkersResponse {
            workers: rows.iter().map(convert::worker).collect(),
        }))
    }

    async fn report_snapshot(
        &self,
        req: Request<ReportSnapshotRequest>,
    ) -> Result<Response<ReportSnapshotResponse>, Status> {
        let _ = self.authorize(&req, "FleetService/ReportSnapshot", |_| Need::Fleet)?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        let status = DurableStatus::from_wire(req.durable_status).ok_or_else(|| {
            Status::invalid_argument(format!("invalid durable_status: {}", req.durable_status))
        })?;
        self.api
            .store
            .update_snapshot_durable(&r, req.generation, status, &req.durable_uri, &req.reason)
            .await
            .map_err(store_status)?;
        Ok(Response::new(ReportSnapshotResponse {}))
    }

    async fn report_actor_exit(
        &self,
        req: Request<ReportActorExitRequest>,
    ) -> Result<Response<ReportActorExitResponse>, Status> {
        let caller = self.authorize(&req, "FleetService/ReportActorExit", |_| Need::Fleet)?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        self.check_node_worker(&caller, "FleetService/ReportActorExit", &req.worker_id)
            .await?;
        let damage = match req.damage {
            Some(d) if d.local.is_empty() && d.durable.is_empty() => None,
            Some(d) if req.crash_reason.is_empty() || d.generation == 0 || d.uuid.is_empty() => {
                return Err(Status::invalid_argument(
                    "invalid damage: it needs a crash_reason, a generation and a uuid",
                ));
            }
            Some(d) => Some(convert::damage(d)),
            None => None,
        };
        let exit = ActorExit {
            worker_id: &req.worker_id,
            activation: req.activation,
            exit_code: req.exit_code,
            last_lines: &req.last_log_lines,
            crash_reason: &req.crash_reason,
            damage: damage.as_ref(),
        };
        self.api.actor_exited(&r, exit).await?;
        Ok(Response::new(ReportActorExitResponse {}))
    }
}
