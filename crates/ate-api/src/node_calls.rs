//! The calls the workflows make to node agents, as a trait: [`NodeCalls`]. The gRPC client pool
//! ([`crate::node::NodeClients`]) is the implementation the api runs with; a test gives
//! [`crate::Api::with_node_calls`] a scripted one, so the workflows' decisions (placement, the
//! restore choice, state transitions, retries) are tested over a real store without a socket.

use ate_core::{ActorRef, Fidelity};
use ate_store::SnapshotRecord;

use crate::error::WorkflowError;
use crate::node::{
    Checkpointed, Detached, LogChunk, NodeError, RunningActivity, Started, Workload,
};

/// A node's answer to one call: what it did, or how it failed ([`NodeError`]: transient or not,
/// unreached or answered).
pub type NodeAnswer<T> = Result<T, NodeError>;

/// The unary NodeService calls the workflows make, each to the node agent at `address` (a
/// worker's `node_address`). The outer error is the api's own, before any call: no client for
/// that address (a malformed one: FailedPrecondition); the inner one is the node's answer.
///
/// Exec, a stream relayed both ways, is not here: it stays on the gRPC client
/// ([`crate::Api::exec_node`]).
#[async_trait::async_trait]
pub trait NodeCalls: Send + Sync {
    /// Cold boot (no generation).
    async fn run(
        &self,
        address: &str,
        workload: &Workload<'_>,
        request_id: Option<&str>,
    ) -> Result<NodeAnswer<Started>, WorkflowError>;

    /// Restores `snapshot` at `fidelity` (which may be lower than the generation's own).
    async fn restore(
        &self,
        address: &str,
        workload: &Workload<'_>,
        snapshot: &SnapshotRecord,
        fidelity: Fidelity,
        request_id: Option<&str>,
    ) -> Result<NodeAnswer<Started>, WorkflowError>;

    /// Writes `generation` (named `uuid`) of the workload's actor; `grace_ms` for requests in
    /// flight (0: the worker's default).
    #[allow(clippy::too_many_arguments)]
    async fn checkpoint(
        &self,
        address: &str,
        workload: &Workload<'_>,
        generation: u64,
        uuid: String,
        fidelity: Fidelity,
        durable: bool,
        grace_ms: u32,
    ) -> Result<NodeAnswer<Checkpointed>, WorkflowError>;

    /// Uploads the actor's node-local `snapshots` (unless durable already) and drops the local
    /// copies; answers each one's durable copy.
    async fn detach(
        &self,
        address: &str,
        actor: &ActorRef,
        snapshots: &[SnapshotRecord],
    ) -> Result<NodeAnswer<Vec<Detached>>, WorkflowError>;

    /// Stops the actor's sandbox on `worker_id` without a snapshot.
    async fn stop(
        &self,
        address: &str,
        actor: &ActorRef,
        worker_id: &str,
    ) -> Result<NodeAnswer<()>, WorkflowError>;

    /// What the actors running on `worker_id` are doing now.
    async fn actor_activity(
        &self,
        address: &str,
        worker_id: &str,
    ) -> Result<NodeAnswer<Vec<RunningActivity>>, WorkflowError>;

    /// The actor was deleted: the node removes what it keeps of it outside its generations,
    /// and the external volume directories in `purge_dirs`. Answers how many it removed.
    async fn forget_actor(
        &self,
        address: &str,
        actor: &ActorRef,
        purge_dirs: Vec<String>,
    ) -> Result<NodeAnswer<u32>, WorkflowError>;

    /// Deletes the generations' local directories and durable objects.
    async fn delete_snapshots(
        &self,
        address: &str,
        snapshots: &[SnapshotRecord],
    ) -> Result<NodeAnswer<()>, WorkflowError>;

    /// Up to `max_bytes` of the actor's log on the node, from `offset`.
    async fn read_log(
        &self,
        address: &str,
        actor: &ActorRef,
        offset: u64,
        max_bytes: u32,
    ) -> Result<NodeAnswer<LogChunk>, WorkflowError>;
}
