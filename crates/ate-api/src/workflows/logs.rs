//! ReadActorLog: the actor's log is read on the node that ran it (each node keeps the output
//! of the runs there).

use ate_core::ActorRef;
use ate_proto::v1;
use ate_store::WorkerStatus;
use tonic::Status;

use super::Api;
use crate::error;

impl Api {
    /// A part of the actor's log, read on the node it runs on (else the node holding its
    /// newest generation): each node keeps the output of the actor's runs there.
    pub async fn read_log(
        &self,
        r: &ActorRef,
        offset: u64,
    ) -> Result<v1::ReadActorLogResponse, Status> {
        let actor = self
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(error::store)?;
        let workers = self.fleet.refresh().await.map_err(error::store)?;
        let on_worker = actor
            .worker_id
            .as_ref()
            .and_then(|id| workers.iter().find(|w| &w.id == id))
            .map(|w| w.node.clone());
        let node = match on_worker.or_else(|| actor.attached_node.clone()) {
            Some(n) => Some(n),
            None => self
                .store
                .list_snapshots(&r.atespace, &r.name)
                .await
                .map_err(error::store)?
                .first()
                .map(|s| s.node.clone())
                .filter(|n| !n.is_empty()),
        };
        let Some(node) = node else {
            return Err(Status::not_found(format!(
                "actor {r} has not run yet: it has no log"
            )));
        };
        let address = workers
            .iter()
            .find(|w| w.node == node && w.status == WorkerStatus::Active)
            .map(|w| w.node_address.clone())
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "node {node}, which holds the log of actor {r}, is not registered"
                ))
            })?;
        let mut client = self.nodes.client(&address)?;
        let reply = client
            .read_log(v1::ReadLogRequest {
                actor: Some(v1::ObjectRef {
                    atespace: r.atespace.clone(),
                    name: r.name.clone(),
                }),
                offset,
                max_bytes: 1 << 20,
            })
            .await
            .map_err(|s| {
                Status::unavailable(format!("reading the log on node {node}: {}", s.message()))
            })?
            .into_inner();
        if !reply.found {
            return Err(Status::not_found(format!(
                "actor {r} has no log on node {node}"
            )));
        }
        Ok(v1::ReadActorLogResponse {
            data: reply.data,
            next_offset: reply.next_offset,
            node,
        })
    }
}
