//! Exclusive `flock`s on lock files, shared by the worker processes of a node (the namespace
//! directory's lock, [`crate::prepare_dir`]).

use std::fs::File;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{IoContext, NetnsError, Result};

/// Opens (creating) `path` and takes its exclusive lock, blocking; released when the returned
/// value drops or the process dies.
pub(crate) fn lock_exclusive(path: &Path) -> Result<Flock<File>> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ctx(|| format!("open {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| NetnsError::io(format!("flock {}", path.display()), e.into()))
}
