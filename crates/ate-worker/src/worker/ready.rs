//! Readiness of a sandbox just started: every container's wakeup probe (HTTP or a TCP connect),
//! given up as soon as the container exits, and the reason for such an exit (an exec failure, or
//! the code and the last log lines).

use std::time::{Duration, Instant};

use ate_core::TemplateSpec;

use super::logs::{LOG_TAIL_LINES, log_tail_from};
use super::sandbox_error;
use super::{VerbError, Worker};
use crate::error::SandboxError;
use crate::lazy::PageSource;
use crate::probe;
use crate::runc;
use crate::runtime::{ActorSandbox, ExitInfo, SandboxSpec};
use ate_netns::{ACTOR_IP, connect_in_netns_timeout};

/// Probe limit when a template's first container has no wakeup probe (template default).
const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a start checks, while its wakeup probe runs, whether the container already exited.
const START_EXIT_CHECK: Duration = Duration::from_millis(100);

impl Worker {
    /// The wakeup probe of a sandbox just started, given up as soon as the container's processes
    /// have all exited: a command that could not be executed, or a process that dies at start,
    /// fails the start at once with the reason (and the log lines of this start) instead of after
    /// the probe's whole timeout with only "did not answer".
    pub(super) async fn wait_ready(
        &self,
        sandbox: &ActorSandbox,
        spec: &TemplateSpec,
        sandbox_spec: &SandboxSpec,
        log_from: u64,
        page_source: Option<&PageSource>,
    ) -> Result<(), VerbError> {
        let probe = self.wait_probe(sandbox, spec);
        tokio::pin!(probe);
        let source_failed = async {
            match page_source {
                Some(ps) => ps.failed().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(source_failed);
        loop {
            tokio::select! {
                ready = &mut probe => return ready,
                // The restored processes wait on pages that will never come: fail the start
                // (the caller removes the sandbox; the node checks the generation).
                why = &mut source_failed => {
                    // A page source that died (not one that found a damaged chunk) says
                    // nothing about the generation: the api tries it again.
                    return Err(if why == crate::lazy::SOURCE_DIED {
                        VerbError::Unavailable(format!(
                            "lazy memory restore interrupted, the generation is intact; try again: {why}"
                        ))
                    } else {
                        VerbError::FailedPrecondition(format!(
                            "lazy memory restore failed: {why}"
                        ))
                    });
                }
                () = tokio::time::sleep(START_EXIT_CHECK) => {}
            }
            match self.runtime.exited(sandbox).await {
                Ok(Some(exit)) => {
                    return Err(self
                        .exited_at_start(sandbox, sandbox_spec, &exit, log_from)
                        .await);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(container = %sandbox.container_id(), error = %e, "exit check during the wakeup probe")
                }
            }
        }
    }

    /// Why a sandbox's processes ended before its wakeup probe passed: an exec failure names the
    /// command and the kernel's reason; any other exit gives the code and the last log lines.
    async fn exited_at_start(
        &self,
        sandbox: &ActorSandbox,
        sandbox_spec: &SandboxSpec,
        exit: &ExitInfo,
        log_from: u64,
    ) -> VerbError {
        // Its last words may still be in the log relay's pipe.
        self.runtime
            .output_flushed(sandbox, Duration::from_millis(500))
            .await;
        let log = log_tail_from(&sandbox.log_path(), log_from, LOG_TAIL_LINES).await;
        let args = runc::process_args(sandbox_spec);
        let code = exit.code.map_or("unknown".to_string(), |c| c.to_string());
        tracing::warn!(container = %sandbox.container_id(), status = %exit.status, code = %code, "container exited before its wakeup probe passed");
        if let Some(reason) = exec_failed_after_start(&log, exit.code, &args) {
            return sandbox_error(
                "start",
                SandboxError::Command {
                    command: runc::render_args(&args),
                    status: runc::EXEC_FAILED.to_string(),
                    stderr: format!(
                        "{reason} (the container exited with code {code} before its wakeup probe passed)"
                    ),
                },
            );
        }
        // The last line first (a client sees only the first line of a crash reason), then the
        // tail of what this start wrote.
        let last: String = log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or("it wrote nothing to its log".to_string(), |l| {
                l.trim().chars().take(200).collect()
            });
        // With sidecars the sandbox's process is ate-init; its last line names the container.
        let what = if sandbox_spec.sidecars.is_empty() {
            format!("`{}`", runc::render_args(&args))
        } else {
            "the actor's containers".to_string()
        };
        VerbError::FailedPrecondition(format!(
            "start: {what} exited (code {code}) before its wakeup probe passed: {last}\n\
             --- last log lines ---\n{log}"
        ))
    }

    /// Every container's wakeup probe, at once; the first container without one gets a TCP
    /// connect to its port (80), a sidecar without one a TCP connect to its first declared port
    /// (or nothing). With sidecars, a failure names the container.
    pub(super) async fn wait_probe(
        &self,
        sandbox: &ActorSandbox,
        spec: &TemplateSpec,
    ) -> Result<(), VerbError> {
        let netns = sandbox.netns();
        let several = spec.containers.len() > 1;
        let probes = spec.containers.iter().enumerate().map(|(i, c)| {
            let netns = netns.clone();
            async move {
                let result = match &c.wakeup_probe {
                    Some(p) => http_probe(&netns, p).await,
                    None if i == 0 => tcp_probe(&netns, 80).await,
                    None => match c.ports.first() {
                        Some(port) => tcp_probe(&netns, *port).await,
                        None => Ok(()),
                    },
                };
                result.map_err(|e| {
                    if several {
                        VerbError::FailedPrecondition(format!("container {:?}: {e}", c.name))
                    } else {
                        VerbError::FailedPrecondition(e)
                    }
                })
            }
        });
        futures::future::try_join_all(probes).await.map(|_| ())
    }
}

/// A wakeup probe: GET until 200 or its timeout.
async fn http_probe(netns: &str, p: &ate_core::template::WakeupProbe) -> Result<(), String> {
    let port = u16::try_from(p.http_get.port)
        .map_err(|_| format!("wakeup probe port {}", p.http_get.port))?;
    let secs = if p.timeout_seconds == 0 {
        DEFAULT_PROBE_TIMEOUT.as_secs()
    } else {
        u64::from(p.timeout_seconds)
    };
    let path = if p.http_get.path.is_empty() {
        "/".to_string()
    } else {
        p.http_get.path.clone()
    };
    probe::wait_ready(netns, port, &path, Duration::from_secs(secs))
        .await
        .map(|_| ())
        .map_err(|e| {
            let last = match e {
                SandboxError::ProbeTimeout { last, .. } => last,
                other => other.to_string(),
            };
            format!(
                "wakeup probe GET {path} on port {port} did not answer 200 within {secs}s (last: {last})"
            )
        })
}

/// Without an HTTP probe: a TCP connect to `port` until it succeeds or the default timeout.
async fn tcp_probe(netns: &str, port: u32) -> Result<(), String> {
    let port = u16::try_from(port).map_err(|_| format!("port {port}"))?;
    let deadline = Instant::now() + DEFAULT_PROBE_TIMEOUT;
    let addr = std::net::SocketAddr::new(ACTOR_IP.into(), port);
    let mut last = String::from("no attempt made");
    while Instant::now() < deadline {
        match connect_in_netns_timeout(netns, addr, Duration::from_secs(1)).await {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(probe::PROBE_INTERVAL).await;
    }
    Err(format!(
        "wakeup probe (TCP connect to port {port}, no HTTP probe in the template) did not succeed within {}s (last: {last})",
        DEFAULT_PROBE_TIMEOUT.as_secs()
    ))
}

/// The kernel's reason when the container's init could not execute its command after the
/// container started (runc checks only that the file exists and is executable beforehand):
/// runc's init then prints `exec <path>: <reason>` as the last line and exits with code 1
/// (`exec format error`, or `no such file or directory` for a script or dynamically linked
/// binary whose interpreter is missing from the image).
fn exec_failed_after_start(log: &str, code: Option<i32>, args: &[String]) -> Option<String> {
    if code.is_some_and(|c| c != 1) {
        return None;
    }
    let command = args.first()?;
    let last = log.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    let (path, reason) = last.strip_prefix("exec ")?.split_once(": ")?;
    // runc resolves a bare name through PATH before it executes it.
    let same =
        path == command || (!command.contains('/') && path.ends_with(&format!("/{command}")));
    (same && !reason.is_empty()).then(|| reason.to_string())
}

#[cfg(test)]
mod tests {
    use super::exec_failed_after_start;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exec_failures_after_the_start_are_told_from_other_exits() {
        let script = "exec /app/server: no such file or directory\n";
        assert_eq!(
            exec_failed_after_start(script, Some(1), &args(&["/app/server", "-v"])).as_deref(),
            Some("no such file or directory")
        );
        // A bare name resolved through PATH; the code unknown (init not the worker's child).
        let format = "exec /usr/bin/app: exec format error";
        assert_eq!(
            exec_failed_after_start(format, None, &args(&["app"])).as_deref(),
            Some("exec format error")
        );
        // Another command's words, another exit code, or the program's own last line.
        assert_eq!(
            exec_failed_after_start(format, Some(1), &args(&["/app"])),
            None
        );
        assert_eq!(
            exec_failed_after_start(script, Some(2), &args(&["/app/server"])),
            None
        );
        assert_eq!(
            exec_failed_after_start("listening\npanic: boom\n", Some(1), &args(&["/app/server"])),
            None
        );
        assert_eq!(exec_failed_after_start("", Some(1), &[]), None);
    }
}
