//! Tails of an actor's log (the lines quoted in a failed start and an exit report).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

pub(super) const LOG_TAIL_LINES: usize = 20;

/// The last `lines` lines of the actor log (reads at most the last 64 KiB).
pub(super) async fn log_tail(path: &Path, lines: usize) -> String {
    log_tail_from(path, 0, lines).await
}

/// [`log_tail`] of what was written at or after byte `from`.
pub(super) async fn log_tail_from(path: &Path, from: u64, lines: usize) -> String {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&path).ok()?;
        let len = f.metadata().ok()?.len();
        let start = len.saturating_sub(64 * 1024).max(from.min(len));
        f.seek(SeekFrom::Start(start)).ok()?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).ok()?;
        let text = String::from_utf8_lossy(&buf);
        // The relay's time stamps are not part of what the actor said.
        let all: Vec<&str> = text.lines().map(ate_core::log_line::strip).collect();
        let from = all.len().saturating_sub(lines);
        Some(all[from..].join("\n"))
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_default()
}
