//! ReadActorLog: the actor's log is read on the node that ran it (each node keeps the output
//! of the runs there).

use ate_core::ActorRef;

use super::{Api, live_node_address};
use crate::error::WorkflowError;

/// Most bytes of log one ReadActorLog returns.
const MAX_LOG_READ: u32 = 1 << 20;

/// A part of an actor's log, and the node it was read on.
#[derive(Debug, Clone)]
pub struct ActorLog {
    pub data: Vec<u8>,
    /// Where the next read starts.
    pub next_offset: u64,
    pub node: String,
}

impl Api {
    /// A part of the actor's log, read on the node it runs on (else the node holding its
    /// newest generation): each node keeps the output of the actor's runs there.
    pub async fn read_log(&self, r: &ActorRef, offset: u64) -> Result<ActorLog, WorkflowError> {
        let actor = self.store.get_actor(r).await?;
        let workers = self.fleet.refresh().await?;
        let on_worker = actor
            .worker_id
            .as_ref()
            .and_then(|id| workers.iter().find(|w| &w.id == id))
            .map(|w| w.node.clone());
        let node = match on_worker.or_else(|| actor.attached_node.clone()) {
            Some(n) => Some(n),
            None => self
                .store
                .list_snapshots(r)
                .await?
                .first()
                .map(|s| s.node.clone())
                .filter(|n| !n.is_empty()),
        };
        let Some(node) = node else {
            return Err(WorkflowError::NotFound(format!(
                "actor {r} has not run yet: it has no log"
            )));
        };
        let address = live_node_address(&workers, &node).ok_or_else(|| {
            WorkflowError::Unavailable(format!(
                "node {node}, which holds the log of actor {r}, is not registered"
            ))
        })?;
        let reply = self
            .nodes
            .read_log(&address, r, offset, MAX_LOG_READ)
            .await?
            .map_err(|e| {
                WorkflowError::Unavailable(format!("reading the log on node {node}: {}", e.message))
            })?;
        if !reply.found {
            return Err(WorkflowError::NotFound(format!(
                "actor {r} has no log on node {node}"
            )));
        }
        Ok(ActorLog {
            data: reply.data,
            next_offset: reply.next_offset,
            node,
        })
    }
}
