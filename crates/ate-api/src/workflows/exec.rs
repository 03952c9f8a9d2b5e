//! ExecActor's placement: where the command runs. The actor must have the container named; a
//! SUSPENDED actor is resumed first (the same workflow a request through the router runs, so
//! its memory comes back), a CRASHED one is refused with the revert hint, and an actor that
//! another workflow holds (RESUMING, SUSPENDING) is waited for a while.

use std::time::{Duration, Instant};

use ate_core::{ActorRef, ActorState};

use super::{Api, crashed, live_node_address};
use crate::error::{ErrorKind, WorkflowError};

/// How long an exec waits for another workflow on the actor (a suspend in progress) to end.
const BUSY_WAIT: Duration = Duration::from_secs(30);

/// Where an exec goes.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    pub node: String,
    pub node_address: String,
    pub worker_id: String,
    /// The activation the worker must hold.
    pub activation: u64,
    /// The actor was resumed for the exec.
    pub resumed: bool,
}

impl Api {
    /// The node agent an exec's stream goes to (`ExecTarget::node_address`).
    pub fn exec_node(&self, target: &ExecTarget) -> Result<crate::node::NodeAgent, WorkflowError> {
        self.grpc.client(&target.node_address)
    }

    /// The node and worker the actor runs on, resuming it if it is suspended; `container`
    /// (None: the first) must be one of its template's.
    pub async fn exec_target(
        &self,
        r: &ActorRef,
        container: Option<&str>,
    ) -> Result<ExecTarget, WorkflowError> {
        r.validate()?;
        let actor = self.store.get_actor(r).await?;
        if actor.state == ActorState::Crashed {
            return Err(crashed(r, &actor.last_error));
        }
        if let Some(name) = container {
            let template = self
                .store
                .get_template(&actor.template.namespace, &actor.template.name)
                .await?;
            let names: Vec<&str> = template
                .spec
                .containers
                .iter()
                .map(|c| c.name.as_str())
                .collect();
            if !names.contains(&name) {
                return Err(WorkflowError::NotFound(format!(
                    "container {name:?} not found in actor {r} (its containers: {})",
                    names.join(", ")
                )));
            }
        }
        let begun = Instant::now();
        let (view, resumed) = loop {
            match self.resume(r, None).await {
                Ok(answer) => break answer,
                // Another workflow holds the actor (its lease, or a state it is in the middle
                // of): wait for it, as the router's parking would.
                Err(e)
                    if (e.kind() == ErrorKind::Aborted
                        || matches!(e, WorkflowError::Busy { .. }))
                        && begun.elapsed() < BUSY_WAIT =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let worker = view.worker.ok_or_else(|| {
            WorkflowError::Unavailable(format!("actor {r} runs on a worker that is not registered"))
        })?;
        let workers = self.fleet.refresh().await?;
        let node_address = live_node_address(&workers, &worker.node).ok_or_else(|| {
            WorkflowError::Unavailable(format!(
                "node {}, where actor {r} runs, is not registered",
                worker.node
            ))
        })?;
        Ok(ExecTarget {
            node: worker.node,
            node_address,
            worker_id: worker.id,
            activation: view.actor.activation,
            resumed,
        })
    }
}
