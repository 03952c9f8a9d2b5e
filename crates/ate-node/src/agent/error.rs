//! Why a NodeService verb failed, in the node's own terms. `service.rs` maps each variant to
//! the gRPC status code the api depends on (the message is the variant's text).

use crate::types::{CallError, Damage};

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
    /// `error`, caused by copies of the generation found damaged (their content does not match
    /// the manifest): the same status, with `damage` as its details so the api marks them.
    #[error("{error}")]
    Damaged {
        error: Box<AgentError>,
        damage: Damage,
    },
}

impl AgentError {
    /// `self`, reported with the damage of `snap`'s copies: `local`, `durable` (what was found
    /// wrong with each; None: not found damaged). A damage the error already carries is kept.
    pub fn with_damage(
        self,
        snap: &crate::types::Snapshot,
        local: Option<String>,
        durable: Option<String>,
    ) -> AgentError {
        let (error, old) = match self {
            AgentError::Damaged { error, damage } => (error, Some(damage)),
            other => (Box::new(other), None),
        };
        let (old_local, old_durable) = old.map_or((None, None), |d| (d.local, d.durable));
        AgentError::Damaged {
            error,
            damage: Damage {
                generation: snap.generation,
                uuid: snap.uuid.clone(),
                local: local.or(old_local),
                durable: durable.or(old_durable),
            },
        }
    }

    /// The damage of the generation this error reports, if any.
    pub fn damage(&self) -> Option<&Damage> {
        match self {
            AgentError::Damaged { damage, .. } => Some(damage),
            _ => None,
        }
    }
}
