//! The image store's errors. The worker turns each into the `ImageError` variant of the same
//! name and text (`ate_worker::ImageError`), so what callers see is what it was before the store
//! was a crate of its own.

/// Errors from image references, registry pulls, verification and unpacking.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A filesystem or syscall step failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// The image reference or layout is unusable.
    #[error("image {reference}: {message}")]
    Image { reference: String, message: String },

    /// A blob's content does not hash to its digest: the layout is corrupt or tampered with.
    #[error("image blob {digest} failed verification: content hashes to sha256:{actual}")]
    Checksum { digest: String, actual: String },
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

impl ImageError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ImageError::Io {
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
        self.map_err(|e| ImageError::io(what(), e))
    }
}

impl<T> IoContext<T> for std::result::Result<T, nix::Error> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| ImageError::io(what(), std::io::Error::from(e)))
    }
}

/// Opens (creating) `path` and takes its exclusive lock, blocking; released when the returned
/// value drops or the process dies.
pub(crate) fn lock_exclusive(path: &std::path::Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ctx(|| format!("open {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| ImageError::io(format!("flock {}", path.display()), e.into()))
}
