//! The network namespaces' errors. The worker turns each into the `SandboxError` variant of the
//! same name and text, so what its callers see is what it was before namespaces were a crate of
//! their own.

pub use ate_cmd::CommandError;

/// Errors from making, naming and deleting network namespaces.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A filesystem or syscall step failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// `ip` exited non-zero or could not be started.
    #[error(transparent)]
    Command(#[from] CommandError),

    /// A spare namespace could not be made or named (the worker's `SandboxError::Invalid`).
    #[error("invalid sandbox spec: {0}")]
    Invalid(String),
}

pub type Result<T, E = NetnsError> = std::result::Result<T, E>;

impl NetnsError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        NetnsError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Adds a description to I/O results (`.ctx(|| format!("create {dir:?}"))`).
pub(crate) trait IoContext<T> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T> IoContext<T> for std::result::Result<T, std::io::Error> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| NetnsError::io(what(), e))
    }
}

impl<T> IoContext<T> for std::result::Result<T, nix::Error> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| NetnsError::io(what(), std::io::Error::from(e)))
    }
}
