//! One `ate up` generation per state dir at a time.
//!
//! `ate up` locks `<state>/run/up.lock` (flock) before it does anything else and hands the
//! locked descriptor to every component it starts (api, node agent, workers, router); each
//! component marks it close-on-exec at its start (`keep_inherited_descriptors`), so nothing *it*
//! starts (runc, sandboxes, log relays) ever holds it. The lock is therefore held exactly as long
//! as a process of that generation lives. A killed `ate up` (SIGKILL) leaves its components
//! stopping on their parent-death SIGTERM; the next `ate up` on the state dir waits here until the
//! last of them has exited (a worker finishing a checkpoint, say), so the two generations never
//! overlap: no worker id served by two processes, no port still held.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How often the wait tries the lock again.
const RETRY: Duration = Duration::from_millis(100);
/// How often a wait that goes on says so again.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// This `ate up`'s hold on its state dir.
pub(super) struct Generation {
    file: std::fs::File,
}

/// A process holding the lock of an earlier generation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    pid: u32,
    /// `worker worker-1`, `router`, … (the subcommand and a worker's id).
    what: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.what, self.pid)
    }
}

impl Generation {
    /// The descriptor the components inherit.
    pub(super) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Takes the generation lock of `state`. Fails at once when a running `ate up` holds it (the
    /// pid it wrote still holds the lock); waits, saying which processes it waits for at once and
    /// every few seconds, while only components of an earlier `ate up` still run. There is no
    /// time limit: such a component is finishing something that must not be cut (a checkpoint),
    /// and nothing of this generation may start before it is done.
    pub(super) async fn acquire(state: &Path) -> anyhow::Result<Generation> {
        let path = lock_path(state);
        let started = Instant::now();
        let mut reported: Option<Instant> = None;
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            match file.try_lock() {
                Ok(()) => {
                    use std::io::Write as _;
                    file.set_len(0)
                        .and_then(|()| {
                            file.write_all(format!("{}\n", std::process::id()).as_bytes())
                        })
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    if reported.is_some() {
                        eprintln!(
                            "ate up: the earlier generation on {} has exited (waited {:.1} s); starting",
                            state.display(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                    return Ok(Generation { file });
                }
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("cannot lock {}", path.display()));
                }
            }
            let holders = holders_of(&file, &path);
            let supervisor = ate_tls::process::lock_holder(&path)
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|pid| holders.iter().any(|h| h.pid == *pid));
            if let Some(pid) = supervisor {
                anyhow::bail!(
                    "another `ate up` (pid {pid}) is running on the state dir {}; stop it first, or use another --state-dir",
                    state.display()
                );
            }
            if reported.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
                let list = if holders.is_empty() {
                    "processes that cannot be listed".to_string()
                } else {
                    holders
                        .iter()
                        .map(Holder::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                eprintln!(
                    "ate up: components of an earlier `ate up` on {} are still stopping: {list}; \
                     waiting for them to exit before starting anything ({:.0} s so far)",
                    state.display(),
                    started.elapsed().as_secs_f64()
                );
                reported = Some(Instant::now());
            }
            drop(file);
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// The processes (other than this one) with `file` open, from `/proc/<pid>/fd`: the components
/// of the generation that holds it. Processes whose descriptors cannot be read are left out.
fn holders_of(file: &std::fs::File, path: &Path) -> Vec<Holder> {
    let Ok(meta) = file.metadata() else {
        return Vec::new();
    };
    let target = (meta.dev(), meta.ino());
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<Holder> = procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| holds(pid, target, path))
        .map(|pid| Holder {
            pid,
            what: describe(pid),
        })
        .collect();
    out.sort_by_key(|h| h.pid);
    out
}

/// Whether process `pid` has a descriptor open on the file `(dev, ino)`.
fn holds(pid: u32, target: (u64, u64), path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        // The link's text first (cheap): only a link naming the lock file is looked at closer.
        let named = std::fs::read_link(fd.path())
            .ok()
            .is_some_and(|t| t == path || t.file_name() == path.file_name());
        named && std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == target)
    })
}

/// `worker worker-1`, `router`, … for an `ate` process; its command name otherwise.
fn describe(pid: u32) -> String {
    let args: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let Some(sub) = args.get(1) else {
        return std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
    };
    let id = args
        .windows(2)
        .find(|w| w[0] == "--id")
        .map(|w| format!(" {}", w[1]))
        .unwrap_or_default();
    format!("{sub}{id}")
}

/// The lock file of a state dir's generation.
fn lock_path(state: &Path) -> PathBuf {
    state.join("run").join("up.lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sleep SECS` holding `fd` (inherited: close-on-exec cleared in the child only).
    fn holder(fd: RawFd, secs: &str) -> std::io::Result<std::process::Child> {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg(secs);
        // SAFETY: only fcntl between fork and exec (async-signal-safe), on a descriptor the
        // parent keeps open.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                use nix::fcntl::{FcntlArg, FdFlag, fcntl};
                let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
                fcntl(borrowed, FcntlArg::F_SETFD(FdFlag::empty()))
                    .map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        cmd.spawn()
    }

    #[tokio::test]
    async fn a_new_generation_waits_for_every_holder_of_the_last() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("run"))?;
        let first = Generation::acquire(dir.path()).await?;
        // A component of the first generation: a child that inherited the descriptor.
        let mut child = holder(first.fd(), "1.5")?;
        // The supervisor is gone (its own hold with it).
        drop(first);
        let begun = Instant::now();
        let holders = {
            let f = std::fs::File::open(lock_path(dir.path()))?;
            holders_of(&f, &lock_path(dir.path()))
        };
        assert_eq!(
            holders,
            [Holder {
                pid: child.id(),
                what: "1.5".into()
            }]
        );
        let second =
            tokio::time::timeout(Duration::from_secs(10), Generation::acquire(dir.path())).await;
        let _ = child.wait();
        let second = second??;
        assert!(
            begun.elapsed() >= Duration::from_millis(1000),
            "took the lock while the child held it"
        );
        drop(second);
        Ok(())
    }

    #[tokio::test]
    async fn a_live_supervisor_makes_a_second_start_fail_at_once() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("run"))?;
        let first = Generation::acquire(dir.path()).await?;
        // A stand-in for a running `ate up`: holds the lock and its pid is in the file.
        let mut child = holder(first.fd(), "30")?;
        std::fs::write(lock_path(dir.path()), format!("{}\n", child.id()))?;
        drop(first);
        let second =
            tokio::time::timeout(Duration::from_secs(5), Generation::acquire(dir.path())).await;
        // Ours: ended by its pid.
        let _ = child.kill();
        let _ = child.wait();
        let err = match second? {
            Ok(_) => anyhow::bail!("a second generation started beside a live one"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(&format!("another `ate up` (pid {})", child.id())),
            "{err}"
        );
        Ok(())
    }
}
