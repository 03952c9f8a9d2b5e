//! `ate top actors` (issue 33, item 4): what each running actor uses now, asked of the node of
//! every active worker (its worker meters CPU per sandbox every 2 s and reads the cgroup's
//! memory). Read-only; a node that does not answer within a second leaves its workers' actors
//! out, named in the reply.

use std::sync::Arc;
use std::time::Duration;

use ate_core::ActorRef;
use ate_store::{WorkerRecord, WorkerStatus};

use super::Api;
use crate::error::WorkflowError;
use crate::node::RunningActivity;
use crate::node_calls::NodeCalls;

/// How long one node may take to say what a worker's actors are doing.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the actors running on worker `w` are doing, asked of its node (`ActorActivity`);
/// None when the node cannot be reached or does not answer within [`NODE_TIMEOUT`].
pub(super) async fn worker_activity(
    nodes: &dyn NodeCalls,
    w: &WorkerRecord,
) -> Option<Vec<RunningActivity>> {
    let asked = async {
        match nodes.actor_activity(&w.node_address, &w.id).await.ok()? {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::debug!(worker = %w.id, error = %e.message, "no activity from the worker's node");
                None
            }
        }
    };
    tokio::time::timeout(NODE_TIMEOUT, asked)
        .await
        .ok()
        .flatten()
}

/// One running actor's usage, with the worker it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorUsage {
    pub actor: ActorRef,
    pub worker_id: String,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub active_since_unix_ms: i64,
    pub open_streams: u32,
    pub last_activity_unix_ms: i64,
}

impl Api {
    /// The running actors of `atespace` (every atespace: None) with what they use, most CPU
    /// first; and the workers whose node did not answer.
    pub async fn top(
        &self,
        atespace: Option<&str>,
    ) -> Result<(Vec<ActorUsage>, Vec<String>), WorkflowError> {
        let workers = self.fleet.workers().await?;
        let mut calls = tokio::task::JoinSet::new();
        for w in workers.iter().filter(|w| w.status == WorkerStatus::Active) {
            let (w, nodes) = (w.clone(), Arc::clone(&self.nodes));
            calls.spawn(async move { (w.id.clone(), worker_activity(nodes.as_ref(), &w).await) });
        }
        let mut usage = Vec::new();
        let mut unreachable = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let Ok((worker_id, reply)) = joined else {
                continue;
            };
            let Some(actors) = reply else {
                unreachable.push(worker_id);
                continue;
            };
            for a in actors {
                if atespace.is_some_and(|s| s != a.actor.atespace) {
                    continue;
                }
                usage.push(ActorUsage {
                    actor: a.actor,
                    worker_id: worker_id.clone(),
                    cpu_millis: a.cpu_millis,
                    memory_bytes: a.memory_bytes,
                    active_since_unix_ms: a.active_since_unix_ms,
                    open_streams: a.open_streams,
                    last_activity_unix_ms: a.last_activity_unix_ms,
                });
            }
        }
        usage.sort_by(|a, b| {
            b.cpu_millis
                .cmp(&a.cpu_millis)
                .then_with(|| a.actor.to_string().cmp(&b.actor.to_string()))
        });
        unreachable.sort();
        Ok((usage, unreachable))
    }
}
