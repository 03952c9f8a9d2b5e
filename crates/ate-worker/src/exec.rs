//! A command run inside a running actor's sandbox (`ate exec`): what the runtime starts
//! ([`ExecSpec`]), the started process and its I/O ([`ExecProcess`]: pipes, or a terminal's
//! master side), its exit, and ending it with everything it started.
//!
//! The process is started detached (`runc exec -d`, see `runc/exec.rs`), so once runc exits it
//! is a child of the worker (a child subreaper): [`wait_exit`] collects its status. Ending a
//! session kills the process's whole tree, leaves first ([`kill_tree`]): the actor's own PID 1 may
//! not reap orphans, and a shell killed before the children it waits for would leave them
//! behind (as zombies or running) in the sandbox.
//!
//! runc (1.1) does not know time namespaces, and CRIU restores a sandbox into a time namespace of
//! its own, so in a restored sandbox an exec'd process is in the worker's time namespace, not
//! the sandbox's. A dump holding such a process cannot be restored ("Can't restore sub-task in
//! NS"), so before any dump the processes an exec left running there are killed
//! ([`kill_strays`]). (runc cannot be started in the sandbox's time namespace instead: its check
//! of the container's init reads start times through it, shifted, and calls the container
//! stopped.)

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::procfs::{process_table, tree_of};
use tokio::net::unix::pipe;

/// What to run in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// The command and its arguments (not through a shell).
    pub command: Vec<String>,
    /// A terminal (its stdout and stderr are one stream).
    pub tty: bool,
    /// The caller sends stdin; without it the command reads an empty stdin.
    pub stdin: bool,
    /// With a terminal: its size (columns, rows) from the start, so the command never sees
    /// an unsized terminal.
    pub size: Option<(u16, u16)>,
}

/// What starting the command came to.
pub enum Exec {
    Started(ExecProcess),
    /// The runtime could not run the command (not found, not executable): no process exists.
    NotRun {
        /// 127 (not found) or 126 (found but not runnable), as the shells and kubectl answer.
        code: i32,
        /// The runtime's reason.
        reason: String,
    },
}

/// A started command: its host pid and its I/O.
pub struct ExecProcess {
    pub pid: u32,
    pub io: ExecIo,
}

pub enum ExecIo {
    Pipes {
        /// None without stdin (the command has /dev/null).
        stdin: Option<pipe::Sender>,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
    },
    Terminal(Pty),
}

/// The master side of the command's terminal, non-blocking.
pub struct Pty {
    fd: AsyncFd<OwnedFd>,
}

impl Pty {
    pub fn new(master: OwnedFd) -> std::io::Result<Pty> {
        let flags = nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: the OwnedFd is moved into the AsyncFd, so the descriptor stays open and the
        // same until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register(master) }.map_err(std::io::Error::from)?;
        Ok(Pty { fd })
    }

    /// Reads what the command wrote; 0 once no process holds the terminal open any more (the
    /// kernel answers EIO then).
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready
                .try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(std::io::Error::from))
            {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut ready = self.fd.writable().await?;
            match ready
                .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the terminal's size (the command gets SIGWINCH).
    pub fn resize(&self, columns: u16, rows: u16) -> std::io::Result<()> {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: columns,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which lives for the call.
        let r = unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The exit code of `pid`, a child of this process once the runtime that started it exited:
/// its code, or 128 + the signal that ended it. Blocks a thread of the blocking pool until
/// then. A pid that is not our child (no subreaper) is watched through `/proc` instead, and its
/// code is unknown (255).
pub async fn wait_exit(pid: u32) -> i32 {
    let Ok(raw) = i32::try_from(pid) else {
        return 255;
    };
    let waited = tokio::task::spawn_blocking(move || {
        use nix::sys::wait::{WaitStatus, waitpid};
        loop {
            match waitpid(nix::unistd::Pid::from_raw(raw), None) {
                Ok(WaitStatus::Exited(_, code)) => return Some(code),
                Ok(WaitStatus::Signaled(_, signal, _)) => return Some(128 + signal as i32),
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten();
    if let Some(code) = waited {
        return code;
    }
    while crate::procfs::process_running(pid) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    255
}

/// Kills `root` and every process it started that still descends from it, leaves first (each
/// parent still alive to reap its killed children), `root` last; gives up after a few rounds
/// (a tree that keeps forking faster than it dies gets one last SIGKILL for all).
pub async fn kill_tree(root: u32) {
    const ROUNDS: usize = 50;
    for round in 0..ROUNDS {
        let table = tokio::task::spawn_blocking(process_table)
            .await
            .unwrap_or_default();
        let tree = tree_of(root, &table);
        if tree.is_empty() {
            return;
        }
        let targets = if round + 1 == ROUNDS {
            tree.iter().map(|(pid, _)| *pid).collect()
        } else {
            leaves(&tree)
        };
        for pid in targets {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills the processes in the sandbox whose PID 1 is host pid `init` (those in its PID namespace)
/// that are not in its time namespace: what an exec left running in a sandbox CRIU restored.
/// Returns how many were killed.
pub async fn kill_strays(init: u32) -> usize {
    tokio::task::spawn_blocking(move || {
        let Some(sandbox) = namespaces(init) else {
            return 0;
        };
        // A pid that is no longer the sandbox's init (reused by a host process) names this
        // worker's own PID namespace: nothing there is a sandbox's.
        let own = std::fs::read_link("/proc/self/ns/pid").ok();
        if own.as_ref() == Some(&sandbox.0) {
            return 0;
        }
        let mut killed = 0;
        for _ in 0..20 {
            let procs: Vec<(u32, Option<Namespaces>)> = pids()
                .into_iter()
                .map(|pid| (pid, namespaces(pid)))
                .collect();
            let victims = strays(&sandbox, &procs);
            if victims.is_empty() {
                break;
            }
            for pid in victims {
                if let Ok(raw) = i32::try_from(pid)
                    && nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(raw),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .is_ok()
                {
                    killed += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        killed
    })
    .await
    .unwrap_or(0)
}

/// A process's PID and time namespaces (the targets of `/proc/<pid>/ns/{pid,time}`).
type Namespaces = (std::path::PathBuf, std::path::PathBuf);

/// None for a process that is gone or a zombie (whose namespaces are gone with it).
fn namespaces(pid: u32) -> Option<Namespaces> {
    let ns = |kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok();
    Some((ns("pid")?, ns("time")?))
}

/// The processes of `procs` in the sandbox's PID namespace but not its time namespace.
fn strays(sandbox: &Namespaces, procs: &[(u32, Option<Namespaces>)]) -> Vec<u32> {
    procs
        .iter()
        .filter_map(|(pid, ns)| {
            let (pid_ns, time_ns) = ns.as_ref()?;
            (pid_ns == &sandbox.0 && time_ns != &sandbox.1).then_some(*pid)
        })
        .collect()
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The members of `tree` with no child in it.
fn leaves(tree: &[(u32, u32)]) -> Vec<u32> {
    tree.iter()
        .map(|(pid, _)| *pid)
        .filter(|pid| !tree.iter().any(|(_, ppid)| ppid == pid))
        .collect()
}

/// What runc said on stderr, without logrus's decoration: each `time=… level=error msg="…"`
/// line as its message, unquoted; other lines as they are.
pub fn runc_said(stderr: &str) -> String {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| {
            let Some(at) = line.find(" msg=\"") else {
                return line.to_string();
            };
            let quoted = &line[at + " msg=\"".len()..];
            let mut out = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.extend(chars.next()),
                    '"' => break,
                    c => out.push(c),
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The exit code and reason when runc's error (`stderr` of a failed `runc exec`) says the
/// command itself could not be run: 127 not found, 126 found but not runnable. None for any
/// other failure (the container, the runtime), which is an error of the exec, not a code.
pub fn not_run(stderr: &str) -> Option<(i32, String)> {
    // runc: `exec failed: unable to start container process: exec: "x": executable file not
    // found in $PATH` (the init's execve or PATH lookup failed).
    let at = stderr.find("unable to start container process: exec:")?;
    let reason = stderr[at + "unable to start container process: ".len()..]
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let lower = reason.to_ascii_lowercase();
    let code = if lower.contains("not found") || lower.contains("no such file or directory") {
        127
    } else {
        126
    };
    Some((code, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_failures_as_exit_codes() {
        let (code, reason) = not_run(
            "exec failed: unable to start container process: exec: \"nope\": executable file not found in $PATH\n",
        )
        .unwrap();
        assert_eq!(code, 127);
        assert_eq!(reason, "exec: \"nope\": executable file not found in $PATH");
        assert_eq!(
            not_run("runc exec failed: unable to start container process: exec: \"/x\": stat /x: no such file or directory").unwrap().0,
            127
        );
        assert_eq!(
            not_run("exec failed: unable to start container process: exec: \"/etc/passwd\": permission denied").unwrap().0,
            126
        );
        assert_eq!(not_run("cannot exec in a stopped container"), None);
    }

    #[test]
    fn runc_log_lines() {
        let said = runc_said(
            "time=\"2026-12-05T06:59:53Z\" level=error msg=\"exec failed: unable to start container process: exec: \\\"nope\\\": executable file not found in $PATH\"\n",
        );
        assert_eq!(
            said,
            "exec failed: unable to start container process: exec: \"nope\": executable file not found in $PATH"
        );
        assert_eq!(not_run(&said).unwrap().0, 127);
        assert_eq!(runc_said("plain words\n\n"), "plain words");
    }

    #[test]
    fn strays_are_in_the_sandbox_but_another_time_namespace() {
        let ns = |p: &str, t: &str| Some((p.into(), t.into()));
        let sandbox = ("pid:[1]".into(), "time:[9]".into());
        let procs = [
            (10, ns("pid:[1]", "time:[9]")), // the actor's own
            (11, ns("pid:[1]", "time:[5]")), // left by an exec
            (12, ns("pid:[2]", "time:[5]")), // another sandbox, or the host
            (13, None),                      // a zombie
        ];
        assert_eq!(strays(&sandbox, &procs), [11]);
    }

    #[test]
    fn trees_are_killed_leaves_first() {
        // 10 → 11 → 12, 10 → 13; 20 is someone else's.
        let table = [(1, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1)];
        let tree = tree_of(10, &table);
        let mut pids: Vec<u32> = tree.iter().map(|(p, _)| *p).collect();
        pids.sort_unstable();
        assert_eq!(pids, [10, 11, 12, 13]);
        let mut first = leaves(&tree);
        first.sort_unstable();
        assert_eq!(first, [12, 13]);
        assert_eq!(leaves(&tree_of(10, &[(10, 1)])), [10]);
        assert!(tree_of(99, &table).is_empty());
    }
}
