//! Small filesystem helpers the verbs share: removing what may already be gone, and the size
//! of a dump's image directory.

use std::path::Path;

use crate::error::{IoContext, Result, SandboxError};

pub(super) async fn remove_file_if_exists(path: &Path) -> Result<()> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxError::io(format!("remove {}", path.display()), e)),
    }
}

pub(super) async fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxError::io(format!("remove {}", dir.display()), e)),
    }
}

pub(super) async fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .ctx(|| format!("list {}", dir.display()))?;
    while let Some(e) = entries
        .next_entry()
        .await
        .ctx(|| format!("list {}", dir.display()))?
    {
        let meta = e
            .metadata()
            .await
            .ctx(|| format!("stat {}", e.path().display()))?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}
