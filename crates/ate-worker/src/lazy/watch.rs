//! The worker's side of a lazy restore: starts the page source, holds a copy of every
//! userfaultfd it serves, and tells the worker how it ended.
//!
//! Architecture invariant: the worker drops its userfaultfd copies only once the page source
//! has reported every page in, or after the sandbox is gone ([`PageSource::release`], or the
//! handle dropped). While any copy is open the kernel keeps the tasks' ranges registered, so a
//! page source that dies leaves faults waiting (the worker then kills the sandbox), never
//! reading zero pages.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_page_source::REPORT_FD;
use ate_page_source::report::{self, Received};

use crate::error::SandboxError;

/// How long the page source may take to listen before the restore gives up on it.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The page source's pid, in its work dir (for [`end_leftover`]).
pub const PID_FILE: &str = "page-source.pid";

/// Why a lazy restore failed when its page source died without a report (killed, crashed):
/// the generation is not at fault, and a new restore of it may well succeed.
pub const SOURCE_DIED: &str =
    "the page source exited before every page of the actor's memory was in";

/// How a page source ended, so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Running,
    /// Every page is in (the counters' summary).
    Done(String),
    /// It gave up or died: the actor's memory is incomplete and it must not run on.
    Failed(String),
}

#[derive(Debug)]
struct Shared {
    outcome: Mutex<Outcome>,
    changed: tokio::sync::Notify,
    /// The failure was the generation's content (a chunk that does not match its digest).
    damaged: std::sync::atomic::AtomicBool,
}

/// Whether a tracked restore's pages still say what changed since its generation (the answer
/// to [`PageSource::barrier`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracking {
    /// Every page still write-protected holds what the generation holds at its address; tasks
    /// started at or after `since_us` (CLOCK_BOOTTIME, µs) were not restored and are dumped
    /// whole.
    Holds { since_us: u64 },
    /// The next dump must be whole: why.
    Lost(String),
}

/// What the worker asks of the reader thread.
#[derive(Debug)]
enum Request {
    /// A barrier: the page source's answer goes back on the channel.
    Barrier(tokio::sync::oneshot::Sender<Tracking>),
}

/// One running page source. Dropping the handle releases the descriptor copies: drop it only
/// after the outcome is `Done` or the sandbox has been stopped.
#[derive(Debug)]
pub struct PageSource {
    pid: u32,
    /// The generation directory it serves memory from.
    generation: PathBuf,
    shared: Arc<Shared>,
    /// Dropped to let the reader thread close the descriptor copies after a failure, or (a
    /// tracked restore) the socket that keeps the page source holding the descriptors.
    release: Mutex<Option<std::sync::mpsc::Sender<Request>>>,
    /// Started with `--write-protect`: it stays after `Done` and answers barriers.
    tracks_memory: bool,
}

/// How long a barrier may take (the page source reads a few queued events).
const BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

impl PageSource {
    /// Starts `command --generation <gen> --work-dir <work>` with the report socket as fd 3 and
    /// waits until it listens for CRIU. Its output goes to `<work>/page-source.log`. With
    /// `track_memory` it places pages write-protected (`--write-protect`; the restore must be
    /// CRIU's `lazy-pages-wp`) and stays, once every page is in, until the handle is dropped.
    pub async fn start(
        command: &[String],
        generation: &Path,
        work_dir: &Path,
        track_memory: bool,
    ) -> Result<PageSource, SandboxError> {
        let Some((program, args)) = command.split_first() else {
            return Err(SandboxError::Invalid("empty page source command".into()));
        };
        let (ours, theirs) = report::pair().map_err(|e| SandboxError::Io {
            what: "create the page source's report socket".into(),
            source: e,
        })?;
        let log_path = work_dir.join("page-source.log");
        let log = std::fs::File::create(&log_path).map_err(|e| SandboxError::Io {
            what: format!("create {}", log_path.display()),
            source: e,
        })?;
        let log_err = log.try_clone().map_err(|e| SandboxError::Io {
            what: "dup page source log".into(),
            source: e,
        })?;
        let mut command = ate_cmd::self_aware_command(program);
        command
            .args(args)
            .arg("--generation")
            .arg(generation)
            .arg("--work-dir")
            .arg(work_dir)
            .args(track_memory.then_some("--write-protect"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            // Its own process group: a signal to the worker's group (or the worker's death)
            // must not end it while it serves a running actor.
            .process_group(0);
        let raw = theirs.as_raw_fd();
        // SAFETY: only dup2 between fork and exec (async-signal-safe); dup2 clears
        // close-on-exec on the new descriptor, so exactly this socket is inherited.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(raw, REPORT_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = tokio::process::Command::from(command)
            .spawn()
            .map_err(|e| SandboxError::Command {
                command: format!("{program} page-source"),
                status: "could not start".into(),
                stderr: e.to_string(),
            })?;
        drop(theirs);
        let pid = child.id().unwrap_or(0);
        // tokio reaps it; its end is seen through the report socket (and, before it listens,
        // through its exit status: killed or exited on its own).
        let (exited_tx, exited_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                let _ = exited_tx.send(status);
            }
        });
        let shared = Arc::new(Shared {
            outcome: Mutex::new(Outcome::Running),
            changed: tokio::sync::Notify::new(),
            damaged: std::sync::atomic::AtomicBool::new(false),
        });
        let (listening_tx, listening_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("page-source-{pid}"))
            .spawn(move || {
                read_reports(ours, thread_shared, listening_tx, release_rx, track_memory)
            })
            .map_err(|e| SandboxError::Io {
                what: "start the page source reader".into(),
                source: e,
            })?;
        let source = PageSource {
            pid,
            generation: generation.to_path_buf(),
            shared,
            release: Mutex::new(Some(release_tx)),
            tracks_memory: track_memory,
        };
        // A teardown of this actor ends a page source a dead worker left behind (it would
        // otherwise wait for its CRIU for minutes): it finds it by this pid file.
        let pid_path = work_dir.join(PID_FILE);
        if let Err(e) = std::fs::write(&pid_path, format!("{pid}\n")) {
            source.kill();
            return Err(SandboxError::io(format!("write {}", pid_path.display()), e));
        }
        let listened = tokio::time::timeout(LISTEN_TIMEOUT, listening_rx).await;
        if matches!(listened, Ok(Ok(()))) {
            return Ok(source);
        }
        source.kill();
        let exited = tokio::time::timeout(Duration::from_secs(1), exited_rx)
            .await
            .ok()
            .and_then(Result::ok);
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let command = format!("{program} page-source");
        if listened.is_err() {
            return Err(SandboxError::Command {
                command,
                status: format!("not listening within {LISTEN_TIMEOUT:?}"),
                stderr: log,
            });
        }
        Err(match exited {
            // Killed before it listened: the restore was cut short, the generation is not at
            // fault (see `SandboxError::interrupted`).
            Some(status) if std::os::unix::process::ExitStatusExt::signal(&status).is_some() => {
                SandboxError::Command {
                    command,
                    status: format!("{status} before it listened"),
                    stderr: format!("{SOURCE_DIED}\n{log}"),
                }
            }
            exited => SandboxError::Command {
                command,
                status: match (exited, source.outcome()) {
                    (_, Outcome::Failed(why)) if why != SOURCE_DIED => {
                        format!("failed before it listened: {why}")
                    }
                    (Some(status), _) => format!("{status} before it listened"),
                    (None, _) => "ended before it listened".into(),
                },
                stderr: log,
            },
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The generation directory this page source serves (damage is reported against it).
    pub fn generation(&self) -> &Path {
        &self.generation
    }

    /// Names `dir` as the generation served: a sealed generation's, when the page source was
    /// started on the scratch dir it was opened into (which is gone by the time damage is
    /// reported, and is no copy the node knows).
    pub fn serves_generation(&mut self, dir: &Path) {
        self.generation = dir.to_path_buf();
    }

    /// It failed because the generation is damaged (a chunk that does not match its digest),
    /// not because it died or could not fetch.
    pub fn found_damage(&self) -> bool {
        self.shared
            .damaged
            .load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn outcome(&self) -> Outcome {
        self.shared
            .outcome
            .lock()
            .map(|o| o.clone())
            .unwrap_or_else(|_| Outcome::Failed("page source state poisoned".into()))
    }

    /// Waits until the page source is done or failed.
    pub async fn finished(&self) -> Outcome {
        loop {
            let notified = self.shared.changed.notified();
            let now = self.outcome();
            if now != Outcome::Running {
                return now;
            }
            notified.await;
        }
    }

    /// Resolves with the reason once the page source has failed; never if it finishes.
    pub async fn failed(&self) -> String {
        match self.finished().await {
            Outcome::Failed(why) => why,
            _ => std::future::pending().await,
        }
    }

    /// Ends the page source (the restore it serves failed or the sandbox is being removed).
    pub fn kill(&self) {
        if self.pid > 0 && self.outcome() == Outcome::Running {
            // Our own child, by pid; it may have exited already.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Whether this restore tracks what its tasks write (started with `track_memory`).
    pub fn tracks_memory(&self) -> bool {
        self.tracks_memory
    }

    /// Before a dump, with the sandbox frozen: has the page source handle every event queued so
    /// far and say whether tracking still holds. Anything but a clear answer is `Lost`.
    pub async fn barrier(&self) -> Tracking {
        if !self.tracks_memory {
            return Tracking::Lost("the restore did not track memory".into());
        }
        if !matches!(self.outcome(), Outcome::Done(_)) {
            return Tracking::Lost("the lazy restore has not placed every page".into());
        }
        let sender = self.release.lock().ok().and_then(|r| r.as_ref().cloned());
        let Some(sender) = sender else {
            return Tracking::Lost("the page source was released".into());
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if sender.send(Request::Barrier(tx)).is_err() {
            return Tracking::Lost("the page source is gone".into());
        }
        match tokio::time::timeout(BARRIER_TIMEOUT, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Tracking::Lost("the page source is gone".into()),
            Err(_) => Tracking::Lost(format!(
                "the page source did not answer within {BARRIER_TIMEOUT:?}"
            )),
        }
    }

    /// The sandbox is gone: the descriptor copies may close.
    pub fn release(&self) {
        if let Ok(mut r) = self.release.lock() {
            r.take();
        }
    }
}

/// Ends the page source a restore in `work_dir` left running, if any: one whose worker died
/// waits for a CRIU that will never connect (minutes), and then reports a failure. Only a
/// process whose command line is `… page-source … --work-dir <work_dir>` is killed (the pid
/// file may name a pid reused since).
pub async fn end_leftover(work_dir: &Path) {
    let Ok(text) = tokio::fs::read_to_string(work_dir.join(PID_FILE)).await else {
        return;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return;
    };
    if pid <= 0 || !serves(pid, work_dir) {
        return;
    }
    let target = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    for _ in 0..50 {
        // Gone, or a zombie (dead; whoever started it reaps it).
        if !crate::procfs::process_running(pid.unsigned_abs()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::warn!(pid, work_dir = %work_dir.display(), "a leftover page source did not end after SIGKILL");
}

/// `pid` is a page source serving `work_dir` (from its command line).
fn serves(pid: i32, work_dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let dir = work_dir.as_os_str().as_encoded_bytes();
    args.iter().any(|a| *a == b"page-source")
        && args
            .windows(2)
            .any(|w| w[0] == b"--work-dir" && w[1] == dir)
}

impl Drop for PageSource {
    fn drop(&mut self) {
        self.kill();
        self.release();
    }
}

fn set_outcome(shared: &Shared, outcome: Outcome) {
    if let Ok(mut o) = shared.outcome.lock()
        && *o == Outcome::Running
    {
        *o = outcome;
    }
    shared.changed.notify_waiters();
}

fn read_reports(
    sock: UnixStream,
    shared: Arc<Shared>,
    listening: tokio::sync::oneshot::Sender<()>,
    release: std::sync::mpsc::Receiver<Request>,
    track_memory: bool,
) {
    let mut listening = Some(listening);
    let mut held: Vec<OwnedFd> = Vec::new();
    loop {
        match report::receive_report(&sock) {
            Ok(Received::Listening) => {
                if let Some(tx) = listening.take() {
                    let _ = tx.send(());
                }
            }
            Ok(Received::Uffd(fd)) => held.push(fd),
            Ok(Received::Done(summary)) => {
                // Every page is in: nothing can fault into the source any more. Closing our
                // copies (and the socket) lets the page source exit. A tracked restore's page
                // source stays while the socket is open: it alone holds the descriptors then,
                // so if it dies the protections go with them (every page reads as written)
                // and no fault waits on a handler that is gone.
                drop(held);
                // Counted here, when it happens: a tracking page source does not exit after
                // this, so no SIGCHLD brings the worker's exit check round to count it.
                crate::metrics::lazy_restore_done(&summary);
                set_outcome(&shared, Outcome::Done(summary));
                if track_memory {
                    answer_barriers(&sock, &release);
                }
                return;
            }
            Ok(Received::Failed(why)) => set_outcome(&shared, Outcome::Failed(why)),
            Ok(Received::Tracking(_)) => {}
            Ok(Received::Damaged(why)) => {
                shared
                    .damaged
                    .store(true, std::sync::atomic::Ordering::Release);
                set_outcome(&shared, Outcome::Failed(why));
            }
            Ok(Received::Closed) | Err(_) => {
                set_outcome(&shared, Outcome::Failed(SOURCE_DIED.into()));
                break;
            }
        }
    }
    drop(listening);
    // Keep the registrations until the sandbox is gone (or the handle is dropped): the
    // channel closes then. A barrier asked now is answered by dropping its sender (`Lost`).
    while release.recv().is_ok() {}
    drop(held);
}

/// After `Done`, for a tracked restore: each barrier the worker asks is passed on to the page
/// source and its answer back, until the handle goes (the socket closes with this function,
/// and the page source exits).
fn answer_barriers(sock: &UnixStream, requests: &std::sync::mpsc::Receiver<Request>) {
    // A page source that hangs must not hang the worker's dumps.
    let _ = sock.set_read_timeout(Some(BARRIER_TIMEOUT));
    // Once an answer did not come in time it may still come, and would be taken for the next
    // barrier's (events since then unread): every later barrier is `Lost`.
    let mut broken: Option<String> = None;
    while let Ok(Request::Barrier(reply)) = requests.recv() {
        if let Some(why) = &broken {
            let _ = reply.send(Tracking::Lost(why.clone()));
            continue;
        }
        let answer = (|| {
            let n = nix::sys::socket::send(
                sock.as_raw_fd(),
                &[report::BARRIER],
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            )
            .map_err(|e| format!("ask the page source: {e}"))?;
            if n != 1 {
                return Err("ask the page source: short write".to_string());
            }
            match report::receive_report(sock) {
                Ok(Received::Tracking(text)) => Ok(parse_tracking(&text)),
                Ok(Received::Closed) => Err("the page source is gone".into()),
                Ok(other) => Err(format!("the page source answered {other:?}")),
                Err(e) => Err(format!("no answer from the page source: {e}")),
            }
        })();
        if let Err(why) = &answer {
            broken = Some(why.clone());
        }
        let _ = reply.send(answer.unwrap_or_else(Tracking::Lost));
    }
}

/// The page source's barrier answer: `since_us=N` or `lost: why`.
fn parse_tracking(text: &str) -> Tracking {
    match text
        .strip_prefix("since_us=")
        .and_then(|n| n.parse::<u64>().ok())
    {
        Some(since_us) if since_us > 0 => Tracking::Holds { since_us },
        _ => Tracking::Lost(text.strip_prefix("lost: ").unwrap_or(text).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page source killed before it listens cut the restore short: the generation is not at
    /// fault, so the api tries again instead of marking the actor CRASHED.
    #[tokio::test]
    async fn a_page_source_killed_before_it_listens_interrupts_the_restore() {
        let dir = tempfile::tempdir().expect("tempdir");
        let command = ["sh".to_string(), "-c".into(), "kill -9 $$".into()];
        let err = PageSource::start(&command, dir.path(), dir.path(), false)
            .await
            .expect_err("a page source that dies cannot serve");
        assert!(err.interrupted(), "{err}");
    }

    /// One that exits on its own before it listens (bad arguments, say) is a failure.
    #[tokio::test]
    async fn a_page_source_that_exits_before_it_listens_is_a_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let command = [
            "sh".to_string(),
            "-c".into(),
            "echo no such generation; exit 2".into(),
        ];
        let err = PageSource::start(&command, dir.path(), dir.path(), false)
            .await
            .expect_err("a page source that exits cannot serve");
        assert!(!err.interrupted(), "{err}");
        assert!(err.to_string().contains("no such generation"), "{err}");
    }

    /// A teardown ends the page source a dead worker left in the actor's restore dir, and
    /// nothing else named by a stale pid file.
    #[tokio::test]
    async fn a_leftover_page_source_is_ended_and_only_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("criu-restore");
        std::fs::create_dir(&work).expect("mkdir");
        let spawn = |work_dir: &Path| {
            // `read` is built in: one process, waiting on its stdin (a pipe held open here).
            std::process::Command::new("sh")
                .args(["-c", "read x; true", "page-source", "--work-dir"])
                .arg(work_dir)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn sh")
        };
        let mut leftover = spawn(&work);
        let mut other = spawn(&dir.path().join("elsewhere"));
        let wait_exit = |child: &mut std::process::Child| {
            for _ in 0..100 {
                if child.try_wait().expect("try_wait").is_some() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        };

        std::fs::write(work.join(PID_FILE), format!("{}\n", other.id())).expect("pid file");
        end_leftover(&work).await;
        assert!(
            !wait_exit(&mut other),
            "a process serving another dir was killed"
        );

        std::fs::write(work.join(PID_FILE), format!("{}\n", leftover.id())).expect("pid file");
        end_leftover(&work).await;
        assert!(
            wait_exit(&mut leftover),
            "the leftover page source still runs"
        );
        let _ = other.kill();
        let _ = other.wait();
    }
}
