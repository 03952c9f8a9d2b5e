//! `runc exec -d`: a command started inside a running container, in its namespaces (user
//! namespace included), cgroup, capabilities and seccomp filter, with the process settings of
//! the container's `config.json` (env, user, cwd). Detached, so the process is the worker's
//! child once runc exits (see [`crate::exec`]); runc's exit then says only whether it started.
//!
//! Without a terminal the process inherits runc's stdio: pipes the worker holds the other ends
//! of. runc's own error, if the start fails, goes to the same stderr pipe before anything else
//! could (the process never ran), so it is read from there. With a terminal runc sends the
//! master side of the pty it made in the container over a console socket (`--console-socket`).

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::fcntl::OFlag;
use tokio::io::AsyncReadExt;
use tokio::net::UnixListener;
use tokio::net::unix::pipe;
use tokio::process::Command;

use super::RuncRuntime;
use crate::error::{IoContext, Result, SandboxError};
use crate::exec::{Exec, ExecIo, ExecProcess, ExecSpec, Pty, not_run};
use crate::runtime::ActorSandbox;

/// Longest a start may take (runc exec is ~50 ms here).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Files of one exec start, removed when it is done.
struct StartFiles {
    pid_file: PathBuf,
    socket: Option<PathBuf>,
    /// `--process`: with a terminal of a known size.
    process: Option<PathBuf>,
}

impl Drop for StartFiles {
    fn drop(&mut self) {
        for file in [
            Some(&self.pid_file),
            self.socket.as_ref(),
            self.process.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl RuncRuntime {
    pub(super) async fn exec_in(&self, actor: &ActorSandbox, spec: &ExecSpec) -> Result<Exec> {
        if spec.command.is_empty() {
            return Err(SandboxError::Invalid("exec: no command".into()));
        }
        let tag = format!("{:012x}", rand::random::<u64>() >> 16);
        let files = StartFiles {
            pid_file: self.root.join(format!("exec-{tag}.pid")),
            socket: spec.tty.then(|| console_socket_path(&self.root, &tag)),
            process: (spec.tty && spec.size.is_some())
                .then(|| self.root.join(format!("exec-{tag}.json"))),
        };
        let mut args = self.base_args();
        args.extend(["exec".into(), "-d".into(), "--pid-file".into()]);
        args.push(files.pid_file.to_string_lossy().into_owned());
        let console = match &files.socket {
            Some(path) => {
                let listener =
                    UnixListener::bind(path).ctx(|| format!("bind {}", path.display()))?;
                args.push("--console-socket".into());
                args.push(path.to_string_lossy().into_owned());
                Some(listener)
            }
            None => None,
        };
        match (&files.process, spec.size) {
            (Some(path), Some(size)) => {
                // runc sizes the terminal before the command runs (a `stty size` first thing
                // would otherwise race the worker's resize and see 0 0).
                write_process_file(actor, &spec.command, size, path).await?;
                args.push("--process".into());
                args.push(path.to_string_lossy().into_owned());
                args.push(actor.container_id());
            }
            _ => {
                if spec.tty {
                    args.push("--tty".into());
                }
                args.push(actor.container_id());
                args.extend(spec.command.iter().cloned());
            }
        }

        let (err_read, err_write) = pipe_pair()?;
        let mut command = Command::new(&self.runc);
        command.args(&args).kill_on_drop(true);
        let mut kept = None;
        if console.is_some() {
            // The terminal is the process's stdio; runc's own stderr is still read for errors.
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(err_write));
        } else {
            let (out_read, out_write) = pipe_pair()?;
            let (stdin_keep, stdin_child) = if spec.stdin {
                let (read, write) = pipe_pair()?;
                (Some(write), Stdio::from(read))
            } else {
                (None, Stdio::null())
            };
            command
                .stdin(stdin_child)
                .stdout(Stdio::from(out_write))
                .stderr(Stdio::from(err_write));
            kept = Some((stdin_keep, out_read));
        }
        let child = command.spawn();
        // Our copies of the child's ends go, so the readers see EOF once the process is gone.
        drop(command);
        let mut child = child.map_err(|e| SandboxError::Command {
            command: ate_cmd::render(&self.runc, &args),
            status: "could not start".into(),
            stderr: e.to_string(),
        })?;
        let mut stderr = pipe::Receiver::from_owned_fd(err_read).ctx(|| "exec stderr pipe")?;

        // With a terminal runc connects to the console socket before it starts the process;
        // one that fails first never does, so its exit ends the wait too.
        let mut master = None;
        let status = tokio::time::timeout(START_TIMEOUT, async {
            if let Some(listener) = &console {
                tokio::select! {
                    received = receive_master(listener) => {
                        master = Some(received?);
                    }
                    status = child.wait() => return status.ctx(|| "wait for runc exec"),
                }
            }
            child.wait().await.ctx(|| "wait for runc exec")
        })
        .await
        .map_err(|_| SandboxError::Command {
            command: ate_cmd::render(&self.runc, &args),
            status: "timed out".into(),
            stderr: format!("runc exec did not start the command within {START_TIMEOUT:?}"),
        })??;

        if !status.success() {
            let said = crate::exec::runc_said(&read_available(&mut stderr).await);
            if let Some((code, reason)) = not_run(&said) {
                return Ok(Exec::NotRun { code, reason });
            }
            return Err(SandboxError::Command {
                command: ate_cmd::render(&self.runc, &args),
                status: status.to_string(),
                stderr: said.trim().to_string(),
            });
        }
        let pid_text = tokio::fs::read_to_string(&files.pid_file)
            .await
            .ctx(|| format!("read {}", files.pid_file.display()))?;
        let pid: u32 = pid_text.trim().parse().map_err(|_| SandboxError::Command {
            command: ate_cmd::render(&self.runc, &args),
            status: "no pid".into(),
            stderr: format!("pid file holds {pid_text:?}"),
        })?;
        let io = match (master, kept) {
            (Some(master), _) => ExecIo::Terminal(Pty::new(master).ctx(|| "exec terminal")?),
            (None, Some((stdin, out_read))) => ExecIo::Pipes {
                stdin: match stdin {
                    Some(fd) => Some(pipe::Sender::from_owned_fd(fd).ctx(|| "exec stdin pipe")?),
                    None => None,
                },
                stdout: pipe::Receiver::from_owned_fd(out_read).ctx(|| "exec stdout pipe")?,
                stderr,
            },
            (None, None) => {
                return Err(SandboxError::Command {
                    command: ate_cmd::render(&self.runc, &args),
                    status: "no terminal".into(),
                    stderr: "runc exec sent no terminal on the console socket".into(),
                });
            }
        };
        Ok(Exec::Started(ExecProcess { pid, io }))
    }
}

/// runc exec's `--process` file: the container's process settings (its `config.json`, which runc
/// exec starts from without one) with `command`, a terminal and its size (columns, rows).
async fn write_process_file(
    actor: &ActorSandbox,
    command: &[String],
    (columns, rows): (u16, u16),
    path: &Path,
) -> Result<()> {
    let config_path = actor.dir.join("config.json");
    let config = tokio::fs::read(&config_path)
        .await
        .ctx(|| format!("read {}", config_path.display()))?;
    let config: serde_json::Value = serde_json::from_slice(&config)
        .map_err(|e| SandboxError::Invalid(format!("{}: {e}", config_path.display())))?;
    let mut process = config
        .get("process")
        .and_then(serde_json::Value::as_object)
        .cloned()
        .ok_or_else(|| {
            SandboxError::Invalid(format!("{} has no process", config_path.display()))
        })?;
    process.insert("args".into(), serde_json::json!(command));
    process.insert("terminal".into(), serde_json::Value::Bool(true));
    process.insert(
        "consoleSize".into(),
        serde_json::json!({ "width": columns, "height": rows }),
    );
    let bytes = serde_json::to_vec(&process)
        .map_err(|e| SandboxError::Invalid(format!("exec process settings: {e}")))?;
    tokio::fs::write(path, bytes)
        .await
        .ctx(|| format!("write {}", path.display()))
}

/// A socket path for runc's console: in the runtime's state dir, or the temp dir when that path
/// would be too long for a unix socket (108 bytes with its NUL).
fn console_socket_path(root: &Path, tag: &str) -> PathBuf {
    let path = root.join(format!("exec-{tag}.sock"));
    if path.as_os_str().len() < 100 {
        return path;
    }
    std::env::temp_dir().join(format!("ate-exec-{tag}.sock"))
}

fn pipe_pair() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).ctx(|| "create exec pipe")
}

/// The pty master runc sends on the console socket (one message, SCM_RIGHTS).
async fn receive_master(listener: &UnixListener) -> Result<OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::AsRawFd;
    let (stream, _) = listener
        .accept()
        .await
        .ctx(|| "accept on the console socket")?;
    loop {
        stream
            .readable()
            .await
            .ctx(|| "wait on the console socket")?;
        let received = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut buf = [0u8; 4096];
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let msg = recvmsg::<()>(
                stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            let mut fd = None;
            for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for raw in fds {
                        // SAFETY: SCM_RIGHTS installed this descriptor in our table for us.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        fd.get_or_insert(owned);
                    }
                }
            }
            Ok(fd)
        });
        match received {
            Ok(Some(fd)) => return Ok(fd),
            Ok(None) => {
                return Err(SandboxError::Invalid(
                    "runc closed the console socket without sending the terminal".into(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(SandboxError::io("receive the exec terminal", e)),
        }
    }
}

/// What a failed runc left on its stderr: read until end of file, or for a moment if some
/// process still holds the pipe.
async fn read_available(stderr: &mut pipe::Receiver) -> String {
    let mut said = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), stderr.read_to_end(&mut said)).await;
    String::from_utf8_lossy(&said).into_owned()
}
