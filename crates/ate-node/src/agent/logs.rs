//! ReadLog: a part of an actor's log on this node, where its workers append the actor's output.

use std::path::Path;

use super::types::{LogPart, ReadLogRequest};
use super::{AgentError, NodeAgent};

/// Largest part of a log one ReadLog returns.
const MAX_LOG_READ: u32 = 1 << 20;

impl NodeAgent {
    pub(super) async fn read_log_inner(&self, req: ReadLogRequest) -> Result<LogPart, AgentError> {
        let path = actor_log_path(
            &self.inner.cfg.state_dir,
            &req.actor.atespace,
            &req.actor.name,
        );
        let max = u64::from(req.max_bytes.clamp(1, MAX_LOG_READ));
        let read = read_log_part(&path, req.offset, max).await;
        match read {
            Ok((data, next_offset)) => Ok(LogPart {
                data,
                next_offset,
                found: true,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LogPart {
                data: Vec::new(),
                next_offset: 0,
                found: false,
            }),
            Err(e) => Err(AgentError::LocalFile {
                verb: "read",
                path: path.display().to_string(),
                source: e,
            }),
        }
    }
}

/// Where every worker of this node appends an actor's output (the worker's `actor_logs_dir`).
pub(super) fn actor_log_path(state_dir: &Path, atespace: &str, name: &str) -> std::path::PathBuf {
    state_dir
        .join("logs")
        .join("actors")
        .join(atespace)
        .join(format!("{name}.log"))
}

/// Up to `max` bytes of the file at `path` from `offset` (from 0 when the file is now shorter:
/// replaced or truncated); returns them and the offset after them.
async fn read_log_part(path: &Path, offset: u64, max: u64) -> std::io::Result<(Vec<u8>, u64)> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let from = if offset > len { 0 } else { offset };
    file.seek(std::io::SeekFrom::Start(from)).await?;
    let mut data = Vec::new();
    file.take(max).read_to_end(&mut data).await?;
    let next = from + data.len() as u64;
    Ok((data, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::test_agent;

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    #[test]
    fn actor_log_path_is_per_atespace_and_name() {
        assert_eq!(
            actor_log_path(Path::new("/var/lib/ate"), "ns", "counter-1"),
            Path::new("/var/lib/ate/logs/actors/ns/counter-1.log")
        );
    }

    #[tokio::test]
    async fn read_log_part_reads_from_the_offset_up_to_max() {
        let dir = tempdir();
        let path = dir.path().join("a.log");
        std::fs::write(&path, b"0123456789").unwrap_or_else(|e| panic!("write: {e}"));
        let read = |offset, max| read_log_part(&path, offset, max);
        assert_eq!(read(0, 4).await.ok(), Some((b"0123".to_vec(), 4)));
        assert_eq!(read(4, 4).await.ok(), Some((b"4567".to_vec(), 8)));
        assert_eq!(read(8, 4).await.ok(), Some((b"89".to_vec(), 10)));
        // At the end: nothing new, same offset.
        assert_eq!(read(10, 4).await.ok(), Some((Vec::new(), 10)));
        assert_eq!(read(3, 100).await.ok(), Some((b"3456789".to_vec(), 10)));
    }

    #[tokio::test]
    async fn read_log_part_starts_over_when_the_file_is_shorter_than_the_offset() {
        let dir = tempdir();
        let path = dir.path().join("a.log");
        std::fs::write(&path, b"abc").unwrap_or_else(|e| panic!("write: {e}"));
        assert_eq!(
            read_log_part(&path, 11, 2).await.ok(),
            Some((b"ab".to_vec(), 2))
        );
    }

    #[tokio::test]
    async fn read_log_part_of_a_missing_file_is_not_found() {
        let dir = tempdir();
        let err = read_log_part(&dir.path().join("none.log"), 0, 10)
            .await
            .err()
            .map(|e| e.kind());
        assert_eq!(err, Some(std::io::ErrorKind::NotFound));
    }

    #[tokio::test]
    async fn read_log_reads_the_actors_log_under_the_state_dir() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let req = |name: &str, offset, max_bytes| ReadLogRequest {
            actor: ate_core::ActorRef::new("ns", name),
            offset,
            max_bytes,
        };
        let missing = agent.read_log_inner(req("a", 0, 10)).await.ok();
        assert_eq!(
            missing,
            Some(LogPart {
                data: Vec::new(),
                next_offset: 0,
                found: false,
            })
        );
        let path = actor_log_path(dir.path(), "ns", "a");
        std::fs::create_dir_all(path.parent().unwrap_or(dir.path()))
            .unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::fs::write(&path, b"hello\n").unwrap_or_else(|e| panic!("write: {e}"));
        let found = agent.read_log_inner(req("a", 2, 10)).await.ok();
        assert_eq!(
            found,
            Some(LogPart {
                data: b"llo\n".to_vec(),
                next_offset: 6,
                found: true,
            })
        );
        // max_bytes 0 is read as 1.
        let one = agent.read_log_inner(req("a", 0, 0)).await.ok();
        assert_eq!(one.map(|r| r.data), Some(b"h".to_vec()));
    }
}
