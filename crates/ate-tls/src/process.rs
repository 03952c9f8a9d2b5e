//! What every component's process does at its edges, in one place: wait for the signal to stop,
//! announce that it is serving through a ready file, hold its identity's lock so that no two
//! processes ever serve one identity, and keep descriptors it inherited from its children.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use crate::error::TlsError;

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        })
    }
}

/// Resolves at the first SIGINT or SIGTERM. The handlers are installed by this call, not at the
/// first poll, so a signal sent while a component is still binding its listeners stops it
/// cleanly instead of killing it. Must be called inside a Tokio runtime. A handler that cannot
/// be installed (never seen in practice) leaves that signal's default action and is logged.
pub fn shutdown_signal() -> impl Future<Output = Signal> + Send + 'static {
    let install = |kind: SignalKind, name: Signal| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot install the {name} handler");
            None
        }
    };
    let int = install(SignalKind::interrupt(), Signal::Interrupt);
    let term = install(SignalKind::terminate(), Signal::Terminate);
    async move {
        tokio::select! {
            () = arrival(int) => Signal::Interrupt,
            () = arrival(term) => Signal::Terminate,
        }
    }
}

/// Resolves when `handler` sees its signal; never without a handler.
async fn arrival(handler: Option<tokio::signal::unix::Signal>) {
    // `recv` yields None only once the runtime's driver is gone: the signal can no longer come.
    if let Some(mut s) = handler
        && s.recv().await.is_some()
    {
        return;
    }
    std::future::pending::<()>().await
}

/// Mode of ready files: read by `ate up`, tests and operators' scripts, written by the component.
pub const READY_FILE_MODE: u32 = 0o644;

/// Writes a component's ready file (`--ready-file`: its bound addresses as JSON) atomically, so a
/// reader polling for it never sees a partial file.
pub fn write_ready_file(path: &Path, body: &str) -> Result<(), TlsError> {
    crate::write_atomic(path, body.as_bytes(), READY_FILE_MODE)
}

/// How often a process waiting for an [`InstanceLock`] tries again.
const LOCK_RETRY: Duration = Duration::from_millis(100);
/// How often a process still waiting for an [`InstanceLock`] says so again.
const LOCK_REPORT_EVERY: Duration = Duration::from_secs(5);

/// An exclusive lock (`flock`) on a file naming one identity (a worker id, a node's state dir),
/// held for the life of the process that serves it. The file is opened close-on-exec, so nothing
/// the process starts (runc, containers, log relays) ever holds it: the lock ends exactly when the
/// process does, however it ends (the kernel releases it on exit, `kill -9` included). The
/// holder's pid is written into the file, for the log of the next process waiting for it.
#[derive(Debug)]
pub struct InstanceLock {
    // Held, never read: dropping the file releases the lock.
    _file: std::fs::File,
    path: PathBuf,
}

impl InstanceLock {
    /// Takes the lock on `path` (created if absent) if no other process holds it.
    pub fn try_acquire(path: &Path) -> Result<Option<InstanceLock>, TlsError> {
        let io = |op: &'static str| {
            move |source| TlsError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io("open lock file"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock")(e)),
        }
        // Ours now: say who holds it (for the log of the next process that waits).
        file.set_len(0).map_err(io("truncate lock file"))?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io("write lock file"))?;
        Ok(Some(InstanceLock {
            _file: file,
            path: path.to_path_buf(),
        }))
    }

    /// Takes the lock on `path`, waiting as long as another process holds it; says at once, and
    /// every few seconds after, which process (the pid it wrote) `what` waits for. Stop waiting
    /// by dropping the future (a shutdown signal).
    pub async fn acquire(path: &Path, what: &str) -> Result<InstanceLock, TlsError> {
        let started = Instant::now();
        let mut reported: Option<Instant> = None;
        loop {
            if let Some(lock) = Self::try_acquire(path)? {
                if reported.is_some() {
                    tracing::info!(
                        lock = %path.display(),
                        waited_ms = started.elapsed().as_millis() as u64,
                        "{what}: the earlier process exited; taking over"
                    );
                }
                return Ok(lock);
            }
            if reported.is_none_or(|t| t.elapsed() >= LOCK_REPORT_EVERY) {
                let holder = lock_holder(path);
                tracing::warn!(
                    lock = %path.display(),
                    holder_pid = holder.as_deref().unwrap_or("unknown"),
                    waited_s = started.elapsed().as_secs(),
                    "{what} is still served by another process; waiting for it to exit before doing anything"
                );
                reported = Some(Instant::now());
            }
            tokio::time::sleep(LOCK_RETRY).await;
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid a lock file's holder wrote, if it is there.
pub fn lock_holder(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let pid = text.trim();
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then(|| pid.to_string())
}

/// Marks every descriptor this process inherited beyond stdin, stdout and stderr close-on-exec,
/// so that none of them reaches a process it starts. Called first thing by the long-running
/// components: `ate up` hands its children the lock that marks its generation, and a sandbox,
/// log relay or page source that inherited it would hold that generation "alive" forever.
/// Everything this process opens itself is close-on-exec already (Rust's standard library).
/// Must run before any other thread starts; descriptors it cannot read are left as they are.
pub fn keep_inherited_descriptors() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    // Collected first: the directory's own descriptor is among the entries.
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_GETFD/F_SETFD only read and set the descriptor's flags; a descriptor that
        // was closed meanwhile (the directory's own) makes them fail with EBADF, ignored.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// The process that started this one and whether it asked for a parent-death signal, as
/// [`note_supervisor`] saw them at the start.
static SUPERVISOR: std::sync::OnceLock<(u32, bool)> = std::sync::OnceLock::new();

/// Notes this process's parent and whether it set a parent-death signal for it (`ate up` does:
/// its components get SIGTERM when it dies), for [`supervisor_gone`]. Must be called on the main
/// thread before any other starts: the kernel keeps the parent-death signal per thread and gives
/// new threads none, so only the thread that `exec`ed can read it.
pub fn note_supervisor() {
    let mut signal: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG writes one int to the address given, which is ours.
    let read = unsafe {
        libc::prctl(
            libc::PR_GET_PDEATHSIG,
            &mut signal as *mut libc::c_int as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let _ = SUPERVISOR.set((
        std::os::unix::process::parent_id(),
        read == 0 && signal != 0,
    ));
}

/// Whether the supervisor noted by [`note_supervisor`], which asked for a parent-death signal,
/// is gone: a SIGTERM just received is then that signal, sent because the supervisor died, not a
/// request to stop gracefully. Looks for up to `wait`: the kernel sends the signal as the
/// supervisor's threads exit, possibly before the last of them is gone and this process has been
/// given another parent, so a supervisor that is still there after `wait` sent the signal itself.
/// False at once when nothing was noted or no parent-death signal was set.
pub async fn supervisor_gone(wait: Duration) -> bool {
    let Some(&(pid, true)) = SUPERVISOR.get() else {
        return false;
    };
    let deadline = Instant::now() + wait;
    loop {
        if std::os::unix::process::parent_id() != pid || !alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` is a live process: it exists and is neither a zombie nor dead (`/proc`).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may contain anything.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x") | None)
}

/// The supervisor's pid as noted at the start, if it was.
pub fn supervisor_pid() -> Option<u32> {
    SUPERVISOR.get().map(|&(pid, _)| pid)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn ready_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        write_ready_file(&path, r#"{"grpc":"127.0.0.1:1"}"#).unwrap();
        write_ready_file(&path, r#"{"grpc":"127.0.0.1:2"}"#).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"grpc":"127.0.0.1:2"}"#
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, READY_FILE_MODE);
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["ready.json"]);
    }

    #[test]
    fn ready_file_readers_never_see_a_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        let bodies = ["a".repeat(64 * 1024), "b".repeat(64 * 1024)];
        write_ready_file(&path, &bodies[0]).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, stop, bodies) = (path.clone(), stop.clone(), bodies.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let text = std::fs::read_to_string(&path).unwrap();
                    assert!(
                        bodies.contains(&text),
                        "partial read of {} bytes",
                        text.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..200 {
            write_ready_file(&path, &bodies[i % 2]).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn ready_file_in_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent").join("ready.json");
        assert!(write_ready_file(&path, "{}").is_err());
    }

    #[tokio::test]
    async fn shutdown_signal_resolves_on_sigterm_and_names_it() {
        let stop = shutdown_signal();
        // Installed at the call: raising before the first poll neither kills the test process
        // nor is lost.
        nix_raise(libc::SIGTERM);
        let got = tokio::time::timeout(Duration::from_secs(5), stop)
            .await
            .expect("SIGTERM seen");
        assert_eq!(got, Signal::Terminate);
        assert_eq!(got.to_string(), "SIGTERM");
        assert_eq!(Signal::Interrupt.to_string(), "SIGINT");
    }

    #[test]
    fn one_holder_at_a_time_and_the_pid_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.lock");
        let first = InstanceLock::try_acquire(&path).unwrap().expect("free");
        assert_eq!(first.path(), path);
        assert_eq!(
            lock_holder(&path).as_deref(),
            Some(std::process::id().to_string().as_str())
        );
        // flock is per open file: a second open, even in this process, is refused.
        assert!(InstanceLock::try_acquire(&path).unwrap().is_none());
        drop(first);
        let again = InstanceLock::try_acquire(&path).unwrap();
        assert!(again.is_some());
    }

    #[tokio::test]
    async fn acquire_waits_until_the_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.lock");
        let first = InstanceLock::try_acquire(&path).unwrap().expect("free");
        let waiting = tokio::spawn({
            let path = path.clone();
            async move { InstanceLock::acquire(&path, "test").await }
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!waiting.is_finished(), "acquired while held");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("acquired after the release")
            .unwrap()
            .unwrap();
        assert_eq!(second.path(), path);
    }

    #[test]
    fn the_lock_file_is_not_inherited_by_children() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.lock");
        let _lock = InstanceLock::try_acquire(&path).unwrap().expect("free");
        // A child (sh) lists its descriptors' targets: the lock file is not among them.
        let out = std::process::Command::new("sh")
            .args(["-c", "ls -l /proc/$$/fd"])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(!listing.contains("w.lock"), "{listing}");
    }

    #[test]
    fn inherited_descriptors_are_made_close_on_exec() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("inherited")).unwrap();
        let fd = file.as_raw_fd();
        // SAFETY: flag changes on a descriptor this test owns.
        let cloexec = || unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC != 0;
        // As a parent that handed it down would leave it: close-on-exec cleared.
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        assert!(!cloexec());
        keep_inherited_descriptors();
        assert!(cloexec());
        // stdio is left alone.
        // SAFETY: reads the flags of stderr.
        let stderr_flags = unsafe { libc::fcntl(2, libc::F_GETFD) };
        assert_eq!(stderr_flags & libc::FD_CLOEXEC, 0);
    }

    #[tokio::test]
    async fn no_supervisor_noted_means_none_died() {
        // This test process noted nothing (and no parent-death signal is set for it).
        assert!(!supervisor_gone(Duration::from_millis(50)).await);
        assert!(alive(std::process::id()));
        // A child that exited and was not reaped yet is a zombie: not alive.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(300));
        assert!(!alive(pid), "a zombie counts as gone");
        child.wait().unwrap();
        assert!(!alive(pid));
    }

    fn nix_raise(sig: libc::c_int) {
        // SAFETY: raise only sends a signal to this process; a handler is installed for it.
        let rc = unsafe { libc::raise(sig) };
        assert_eq!(rc, 0);
    }
}
