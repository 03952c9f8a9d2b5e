//! One error type for the sandbox layer. Every variant names what failed so a node log line or a
//! CRASHED message is enough to diagnose without re-running.

use std::path::PathBuf;
use std::time::Duration;

/// Errors from image unpacking, namespaces, the runtime and probes.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A filesystem or syscall step failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// An external command (runc, ip, mount helper) exited non-zero or could not be started.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },

    /// The image reference or layout is unusable.
    #[error("image {reference}: {message}")]
    Image { reference: String, message: String },

    /// A blob's content does not hash to its digest: the layout is corrupt or tampered with.
    #[error("image blob {digest} failed verification: content hashes to sha256:{actual}")]
    Checksum { digest: String, actual: String },

    /// The wakeup probe never answered 200 within its limit.
    #[error("wakeup probe GET {path} on port {port} got no 200 within {timeout:?}; last: {last}")]
    ProbeTimeout {
        path: String,
        port: u16,
        timeout: Duration,
        last: String,
    },

    /// A checkpoint directory is missing or incomplete.
    #[error("checkpoint image {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },

    /// Input the runtime cannot act on (bad volume path, empty command, ...).
    #[error("invalid sandbox spec: {0}")]
    Invalid(String),

    /// The runtime cannot do this on this host (e.g. memory restore without CRIU).
    #[error("unsupported on this worker: {0}")]
    Unsupported(String),
}

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// The image store's errors are the sandbox layer's, variant for variant and word for word.
impl From<ate_image::ImageError> for SandboxError {
    fn from(e: ate_image::ImageError) -> Self {
        match e {
            ate_image::ImageError::Io { what, source } => SandboxError::Io { what, source },
            ate_image::ImageError::Image { reference, message } => {
                SandboxError::Image { reference, message }
            }
            ate_image::ImageError::Checksum { digest, actual } => {
                SandboxError::Checksum { digest, actual }
            }
        }
    }
}

/// The network namespaces' errors are the sandbox layer's, variant for variant and word for word.
impl From<ate_netns::NetnsError> for SandboxError {
    fn from(e: ate_netns::NetnsError) -> Self {
        match e {
            ate_netns::NetnsError::Io { what, source } => SandboxError::Io { what, source },
            ate_netns::NetnsError::Command(e) => e.into(),
            ate_netns::NetnsError::Invalid(message) => SandboxError::Invalid(message),
        }
    }
}

/// A failed external command (`ate_cmd`) is the sandbox layer's `Command`, field for field.
impl From<ate_cmd::CommandError> for SandboxError {
    fn from(e: ate_cmd::CommandError) -> Self {
        let ate_cmd::CommandError {
            command,
            status,
            stderr,
        } = e;
        SandboxError::Command {
            command,
            status,
            stderr,
        }
    }
}

impl SandboxError {
    /// A restore that was cut short rather than refused: `runc` (or what it ran) killed by a
    /// signal, or the page source of a lazy restore dead without reporting a damaged chunk. The
    /// generation is not at fault; restoring it again may succeed.
    pub fn interrupted(&self) -> bool {
        match self {
            SandboxError::Command { status, stderr, .. } => {
                status.starts_with("signal:")
                    || stderr.contains(crate::lazy::SOURCE_DIED)
                    || stderr.contains(crate::runc::CRIU_DIED)
                    || stderr.contains(crate::runc::RUNC_DIED)
                    // runc's words for a CRIU that died under it: its socket to CRIU was cut
                    // without an answer (a CRIU that fails answers with its error).
                    // (`criu-xprt-cln` is runc's name for its end of that socket, in the
                    // version check it asks first; a write finds it closed: broken pipe.)
                    || ((stderr.contains("unixpacket") || stderr.contains("criu-xprt-cln"))
                        && (stderr.contains("connection reset by peer")
                            || stderr.contains("broken pipe")
                            || stderr.contains("EOF")))
                    || criu_gone_before_its_request(stderr)
            }
            _ => false,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io {
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
        self.map_err(|e| SandboxError::io(what(), e))
    }
}

impl<T> IoContext<T> for std::result::Result<T, nix::Error> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| SandboxError::io(what(), std::io::Error::from(e)))
    }
}

/// runc's words for a CRIU gone between its start and runc's request (nothing was dumped or
/// restored yet): right after starting it, runc moves it into the container's cgroups (a dead
/// one: `cgroup.procs` … "no such process") and reads its stdio links (`readlink
/// /proc/<criu>/fd/0: no such file or directory`).
fn criu_gone_before_its_request(stderr: &str) -> bool {
    stderr.lines().any(|line| {
        (line.contains("readlink /proc/")
            && line.contains("/fd/")
            && line.contains("no such file or directory"))
            || (line.contains("cgroup.procs") && line.contains("no such process"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(status: &str, stderr: &str) -> SandboxError {
        SandboxError::Command {
            command: "runc restore".into(),
            status: status.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn restores_cut_short_are_told_from_refused_ones() {
        for cut in [
            command("signal: 9 (SIGKILL)", ""),
            command("ended: the page source gave up", crate::lazy::SOURCE_DIED),
            command(
                "ended: the page source gave up",
                &format!(
                    "CRIU closed the lazy-pages socket; {}",
                    crate::runc::CRIU_DIED
                ),
            ),
            command(
                "ended: the page source gave up",
                &format!(
                    "CRIU closed the lazy-pages socket before the restore finished; {}",
                    crate::runc::RUNC_DIED
                ),
            ),
            command(
                "exit status: 1",
                "level=error msg=\"read unixpacket @->@: recvmsg: connection reset by peer\"",
            ),
            // CRIU killed while runc asked its version (the first exchange).
            command(
                "exit status: 1",
                "level=error msg=\"CRIU version check failed: read criu-xprt-cln: connection reset by peer\"",
            ),
            // CRIU killed right after runc started it for the restore, before the request.
            command(
                "exit status: 1",
                "time=\"2026-12-04T07:18:26Z\" level=error msg=\"readlink /proc/30727/fd/0: no such file or directory\"",
            ),
            command(
                "exit status: 1",
                "level=error msg=\"write /sys/fs/cgroup/ate/29399b9cf1/cgroup.procs: no such process\"",
            ),
        ] {
            assert!(cut.interrupted(), "{cut}");
        }
        for refused in [
            command("exit status: 1", "criu failed: type RESTORE errno 0"),
            command(
                "ended: the page source gave up",
                "chunk 3 of pages-1.img is damaged",
            ),
            SandboxError::Invalid("no".into()),
        ] {
            assert!(!refused.interrupted(), "{refused}");
        }
    }
}
