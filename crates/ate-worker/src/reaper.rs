//! Container inits as children of the worker: exit codes and exits noticed without `runc state`.
//!
//! The worker makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so when `runc run -d` /
//! `runc restore -d` exits, the container's init is re-parented to the worker (as with
//! containerd's shim). The worker can then `waitpid` that pid: the exit code is known (runc
//! keeps none for a detached container), an exit costs one `waitpid(WNOHANG)` per active actor
//! instead of one `runc state` process (which cost ~0.7 % of a core per actor at 2 polls/s), and
//! SIGCHLD wakes the exit watcher at once.
//!
//! Only pids registered here are waited for (`waitpid(pid)`, never `waitpid(-1)`), so the
//! statuses of the worker's own commands stay with tokio.

use std::collections::HashMap;
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// What became of a registered init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitStatus {
    /// Still running (or frozen).
    Running,
    /// Exited with this code; killed by a signal → 128 + signal number (the shell convention).
    Exited(i32),
    /// Not a child of this process (the subreaper flag could not be set, or another process
    /// adopted it): ask the runtime instead.
    NotOurs,
}

/// Marks this process as a child subreaper. Idempotent; an error leaves the worker on the
/// slower `runc state` path.
pub fn become_subreaper() -> Result<(), Errno> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// Container inits by container id, plus inits of removed containers not yet reaped.
#[derive(Debug, Default)]
pub struct Inits {
    by_container: Mutex<HashMap<String, Init>>,
    /// Torn-down inits whose exit was not collected yet (they would stay zombies).
    pending: Mutex<Vec<i32>>,
}

#[derive(Debug, Clone, Copy)]
enum Init {
    Alive(i32),
    Gone(i32),
}

impl Inits {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the init of a container that just started or was restored.
    pub fn register(&self, container: &str, pid: u32) {
        let Ok(pid) = i32::try_from(pid) else { return };
        lock(&self.by_container).insert(container.to_string(), Init::Alive(pid));
    }

    /// The init's status without blocking; `None` when no init is registered for `container`.
    pub fn status(&self, container: &str) -> Option<InitStatus> {
        let mut map = lock(&self.by_container);
        let init = *map.get(container)?;
        match init {
            Init::Gone(code) => Some(InitStatus::Exited(code)),
            Init::Alive(pid) => match try_reap(pid) {
                Reaped::Alive => Some(InitStatus::Running),
                Reaped::Exited(code) => {
                    map.insert(container.to_string(), Init::Gone(code));
                    Some(InitStatus::Exited(code))
                }
                Reaped::NotOurs => Some(InitStatus::NotOurs),
            },
        }
    }

    /// The container is being removed: forget its init, reaping it if it already exited and
    /// otherwise remembering it for [`Inits::reap_pending`].
    pub fn forget(&self, container: &str) {
        let init = lock(&self.by_container).remove(container);
        if let Some(Init::Alive(pid)) = init
            && try_reap(pid) == Reaped::Alive
        {
            lock(&self.pending).push(pid);
        }
    }

    /// [`Inits::forget`], after waiting up to `wait` for a killed init to exit and be reaped.
    pub async fn forget_after(&self, container: &str, wait: std::time::Duration) {
        let deadline = std::time::Instant::now() + wait;
        while matches!(self.status(container), Some(InitStatus::Running))
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        self.forget(container);
    }

    /// Collects the exits of removed containers' inits (so none stays a zombie).
    pub fn reap_pending(&self) {
        lock(&self.pending).retain(|pid| try_reap(*pid) == Reaped::Alive);
    }

    /// Inits of removed containers still waiting to be reaped (tests, diagnostics).
    pub fn pending_len(&self) -> usize {
        lock(&self.pending).len()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Reaped {
    Alive,
    Exited(i32),
    NotOurs,
}

fn try_reap(pid: i32) -> Reaped {
    loop {
        return match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => Reaped::Exited(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => Reaped::Exited(128 + signal as i32),
            // StillAlive; stop/continue reports are not requested, but are not exits either.
            Ok(_) => Reaped::Alive,
            Err(Errno::EINTR) => continue,
            Err(_) => Reaped::NotOurs,
        };
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
// The children are reaped through `Inits` (waitpid), which is what these tests check.
#[allow(clippy::zombie_processes)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn wait_for(inits: &Inits, id: &str) -> InitStatus {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let s = inits.status(id);
            if s != Some(InitStatus::Running) || Instant::now() > until {
                return s.unwrap_or(InitStatus::NotOurs);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn exit_codes_and_signals_of_own_children() {
        let inits = Inits::new();
        assert_eq!(inits.status("none"), None);
        let exits = Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .expect("sh");
        inits.register("a", exits.id());
        assert_eq!(wait_for(&inits, "a"), InitStatus::Exited(7));
        // Collected once, remembered after.
        assert_eq!(inits.status("a"), Some(InitStatus::Exited(7)));

        let mut sleeps = Command::new("sleep").arg("30").spawn().expect("sleep");
        inits.register("b", sleeps.id());
        assert_eq!(inits.status("b"), Some(InitStatus::Running));
        sleeps.kill().expect("kill");
        assert_eq!(wait_for(&inits, "b"), InitStatus::Exited(128 + 9));
    }

    #[test]
    fn forgotten_inits_are_reaped_later() {
        let inits = Inits::new();
        let mut sleeps = Command::new("sleep").arg("30").spawn().expect("sleep");
        inits.register("c", sleeps.id());
        inits.forget("c");
        assert_eq!(inits.pending_len(), 1);
        assert_eq!(inits.status("c"), None);
        sleeps.kill().expect("kill");
        let until = Instant::now() + Duration::from_secs(5);
        while inits.pending_len() > 0 && Instant::now() < until {
            inits.reap_pending();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(inits.pending_len(), 0, "the killed init was reaped");
    }

    #[test]
    fn a_pid_that_is_not_a_child_is_not_ours() {
        let inits = Inits::new();
        // pid 1 is never our child.
        inits.register("d", 1);
        assert_eq!(inits.status("d"), Some(InitStatus::NotOurs));
    }
}
