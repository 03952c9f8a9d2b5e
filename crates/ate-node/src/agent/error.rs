//! Why a NodeService verb failed, in the node's own terms. `service.rs` maps each variant to
//! the gRPC status code the api depends on (the message is the variant's text).

use crate::types::CallError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A request the node refuses as malformed (InvalidArgument).
    #[error("{0}")]
    Invalid(String),
    /// The workload names a worker this node does not know or that does not answer
    /// (Unavailable: the api may place it elsewhere).
    #[error("worker {worker} is not running on node {node}")]
    WorkerNotRunning { worker: String, node: String },
    /// The generation to restore is neither usable here nor copied to the durable store
    /// (FailedPrecondition).
    #[error("generation {generation} ({uuid}) is not on node {node} and has no durable copy")]
    NoDurableCopy {
        generation: u64,
        uuid: String,
        node: String,
    },
    /// The durable copy could not be downloaded (FailedPrecondition).
    #[error("cannot fetch generation {generation} from {uri}{for_what}: {error}")]
    Fetch {
        generation: u64,
        uri: String,
        /// "" for a whole download, " for a lazy restore" for a lazy one.
        for_what: &'static str,
        error: String,
    },
    /// The worker refused the damaged node-local copy and the durable copy could not replace
    /// it (FailedPrecondition).
    #[error("{refused}; its durable copy could not replace it: {error}")]
    NotReplaced { refused: String, error: String },
    /// A file of this node could not be read, removed or deleted (Internal).
    #[error("cannot {verb} {path}: {source}")]
    LocalFile {
        verb: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// Another task panicked holding the download map (Internal).
    #[error("download lock poisoned")]
    DownloadLockPoisoned,
    /// The durable store refused a deletion (Unavailable: the api retries).
    #[error("cannot delete {uri}: {error}")]
    DeleteDurable { uri: String, error: String },
    /// A worker refused or failed the call: passed on with its own code and message.
    #[error(transparent)]
    Worker(#[from] CallError),
}
