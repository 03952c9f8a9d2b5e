//! Starting `runc run -d` / `runc restore -d` with the container's stdout and stderr on a pipe
//! that a separate relay process copies into the actor log, and reading back the init's pid.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use tokio::process::Command;

use super::RuncRuntime;
use super::cgroup::kill_cgroup_processes;
use crate::error::{IoContext, Result, SandboxError};
use crate::lazy::PageSource;
use crate::procfs::process_running;
use crate::runtime::{ActorSandbox, Started};

impl RuncRuntime {
    /// Spawns `runc <args>` (run -d / restore -d) with stdout+stderr on a fresh pipe whose read
    /// end is copied into the actor log by a relay process that ends when every writer has
    /// closed. The relay is not the worker: it outlives a worker that crashes or is killed, so
    /// the actor never gets EPIPE/SIGPIPE for writing to its stdout while no worker runs, and
    /// a restarted worker re-adopts the sandbox with its log still flowing.
    pub(super) async fn spawn_detached(
        &self,
        actor: &ActorSandbox,
        args: Vec<String>,
        page_source: Option<&PageSource>,
    ) -> Result<()> {
        // Where this runc's words start in the actor log (which holds the actor's own output of
        // earlier runs): an error quotes runc, not the actor's last lines.
        let log_start = tokio::fs::metadata(actor.log_path())
            .await
            .map_or(0, |m| m.len());
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ctx(|| "create stdio pipe")?;
        let copier = spawn_log_relay(&self.log_relay, read, actor.log_path()).await?;
        let write_err: OwnedFd = write.try_clone().ctx(|| "dup stdio pipe")?;
        let mut full = self.base_args();
        full.extend(args);
        let mut command = Command::new(&self.runc);
        command
            .args(&full)
            .stdin(Stdio::null())
            .stdout(Stdio::from(write))
            .stderr(Stdio::from(write_err));
        let child = command.spawn();
        // Drop our copies of the write end so the copier sees EOF when the container is gone.
        drop(command);
        let mut child = child.map_err(|e| SandboxError::Command {
            command: ate_cmd::render(&self.runc, &full),
            status: "could not start".to_string(),
            stderr: e.to_string(),
        })?;
        // A lazy restore whose page source gives up mid-restore would leave CRIU and the
        // restored tasks waiting on a page forever: end them all instead.
        let failed = async {
            match page_source {
                Some(source) => source.failed().await,
                None => std::future::pending().await,
            }
        };
        // A CRIU killed in the middle of a restore leaves runc waiting for ever: the half
        // restored tasks hold CRIU's end of runc's socket. Noticed here, it ends like a page
        // source that gave up: everything of the restore is killed.
        let runc_pid = child.id();
        let criu_gone = async {
            match runc_pid {
                Some(pid) => criu_died_under(pid, work_path(&full).map(Path::to_path_buf)).await,
                None => std::future::pending().await,
            }
        };
        let status = tokio::select! {
            status = child.wait() => status.ctx(|| "wait for runc")?,
            () = criu_gone => {
                let _ = child.start_kill();
                kill_cgroup_processes(&actor.short_id());
                let _ = child.wait().await;
                return Err(SandboxError::Command {
                    command: ate_cmd::render(&self.runc, &full),
                    status: "signal: 9 (SIGKILL)".to_string(),
                    stderr: format!("{CRIU_DIED} before the restore finished; runc was ended"),
                });
            }
            why = failed => {
                // runc killed from outside (before the page source noticed): CRIU then loses
                // its RPC client and gives up with "Restoring FAILED." too, yet nothing was
                // refused: the restore was cut short.
                let runc_killed = child
                    .try_wait()
                    .ok()
                    .flatten()
                    .is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s).is_some());
                let _ = child.start_kill();
                kill_cgroup_processes(&actor.short_id());
                let _ = child.wait().await;
                // A CRIU that refuses a restore once it talks to the page source ends with
                // "Restoring FAILED." in its log (cr-restore.c); one that left the page source
                // without it was killed, not refused (its forked tasks may still have logged
                // errors of their own as it went): say so, so the restore counts as cut short.
                // So was one whose client (runc) vanished under it (cr-service.c).
                let criu_log = restore_log(&full).await;
                let client_gone = runc_killed
                    || criu_log
                        .as_ref()
                        .is_some_and(|(_, text)| text.contains(CRIU_CLIENT_GONE));
                let criu_refused = !client_gone
                    && (work_path(&full).is_none()
                        || criu_log
                            .as_ref()
                            .is_some_and(|(_, text)| text.contains(CRIU_RESTORE_FAILED)));
                let damaged = page_source.is_some_and(PageSource::found_damage);
                let stderr = match &criu_log {
                    _ if client_gone && !damaged => {
                        format!("{why}; {RUNC_DIED}")
                    }
                    _ if why.contains("CRIU closed the lazy-pages socket") && !criu_refused => {
                        format!("{why}; {CRIU_DIED}")
                    }
                    // CRIU refused: its own words say why (the actor goes CRASHED on them).
                    Some((log, text)) if criu_refused => format!("{why}{}", quote(log, text)),
                    _ => why,
                };
                return Err(SandboxError::Command {
                    command: ate_cmd::render(&self.runc, &full),
                    status: "ended: the page source gave up".to_string(),
                    stderr,
                });
            }
        };
        if status.success() {
            if let Ok(mut relays) = self.relays.lock() {
                relays.insert(actor.container_id(), copier);
            }
            return Ok(());
        }
        // runc's own error went into the log pipe; give the relay a moment to drain it.
        let mut copier = copier;
        let _ = tokio::time::timeout(Duration::from_secs(1), copier.wait()).await;
        let log = tokio::fs::read(actor.log_path()).await.unwrap_or_default();
        let since = usize::try_from(log_start).unwrap_or(0).min(log.len());
        let mut stderr = ate_cmd::tail(&String::from_utf8_lossy(&log[since..]), 2000);
        if let Some((log, text)) = restore_log(&full).await {
            stderr.push_str(&quote(&log, &text));
        }
        Err(SandboxError::Command {
            command: ate_cmd::render(&self.runc, &full),
            status: status.to_string(),
            stderr,
        })
    }

    pub(super) async fn started(&self, actor: &ActorSandbox, begun: Instant) -> Result<Started> {
        let id = actor.container_id();
        // runc wrote the init's pid (`--pid-file`): no `runc state` process on the resume path.
        let written = tokio::fs::read_to_string(pid_file(actor))
            .await
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|p| *p > 0);
        let pid = match written {
            Some(pid) => Some(pid),
            None => self.status(&id).await?.and_then(|(_, pid)| pid),
        };
        if let Some(pid) = pid {
            self.inits.register(&id, pid);
        }
        Ok(Started {
            netns: actor.netns(),
            container_id: id,
            pid,
            elapsed: begun.elapsed(),
        })
    }
}

/// Where runc writes the container init's host pid (`--pid-file`).
pub(super) fn pid_file(actor: &ActorSandbox) -> PathBuf {
    actor.dir.join("init.pid")
}

/// `cat` from the pipe's read end into the actor log (append): a tiny process of its own,
/// in its own process group (a Ctrl-C meant for the worker's terminal does not reach it), that
/// ends at EOF, when the container and every runc holding the write end are gone. The returned
/// child is reaped by whoever waits for it or by tokio once dropped; after a worker crash, by
/// the process that inherits it.
async fn spawn_log_relay(
    relay: &[String],
    read: OwnedFd,
    log: PathBuf,
) -> Result<tokio::process::Child> {
    // The log may live outside the actor dir (shared `<state>/logs/actors/<atespace>/`).
    if let Some(parent) = log.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .ctx(|| format!("create {}", parent.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .ctx(|| format!("open actor log {}", log.display()))?;
    let (program, args) = relay
        .split_first()
        .map(|(p, a)| (p.as_str(), a))
        .unwrap_or(("cat", &[]));
    let mut command = Command::from(ate_cmd::self_aware_command(program));
    command
        .args(args)
        .stdin(Stdio::from(read))
        .stdout(Stdio::from(file))
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(false);
    command.spawn().map_err(|e| SandboxError::Command {
        command: format!("{program} (actor log relay)"),
        status: "could not start".to_string(),
        stderr: e.to_string(),
    })
}

/// What a restore's error says when its CRIU ended without an error of its own (killed): the
/// restore was cut short (see `SandboxError::interrupted`).
pub(crate) const CRIU_DIED: &str = "CRIU ended with no error in its log (killed)";

/// What a restore's error says when runc, CRIU's client, ended (killed) before CRIU finished:
/// the restore was cut short (see `SandboxError::interrupted`).
pub(crate) const RUNC_DIED: &str = "runc ended before CRIU finished (killed); CRIU lost its client";

/// CRIU's words when its RPC client (runc) is gone in the middle of a request (cr-service.c).
const CRIU_CLIENT_GONE: &str = "Client exited unexpectedly";

/// The last line of a restore CRIU itself gave up (`restore_root_task`'s failure path).
const CRIU_RESTORE_FAILED: &str = "Restoring FAILED.";

/// The `--work-path` of a runc command line.
fn work_path(args: &[String]) -> Option<&Path> {
    args.iter()
        .position(|a| a == "--work-path")
        .and_then(|i| args.get(i + 1))
        .map(Path::new)
}

/// CRIU's restore log for the runc command line `args` (in its `--work-path`), if written.
async fn restore_log(args: &[String]) -> Option<(PathBuf, String)> {
    let log = work_path(args)?.join("restore.log");
    let text = tokio::fs::read_to_string(&log).await.ok()?;
    Some((log, text))
}

/// The tail of a CRIU log, as appended to an error.
fn quote(log: &Path, text: &str) -> String {
    format!("\n--- {} ---\n{}", log.display(), ate_cmd::tail(text, 2000))
}

/// How long runc may outlive its CRIU child before the restore counts as cut short (runc
/// exits within milliseconds of a CRIU that finished).
const CRIU_GONE_GRACE: Duration = Duration::from_secs(2);

/// Resolves once the `criu` that does `runc`'s dump or restore has been gone for
/// [`CRIU_GONE_GRACE`] while runc still runs (the caller selects it against runc's exit). Never
/// resolves if CRIU is never seen (runc run) or runc exits first. When it resolves, the `criu`
/// helpers the dead one forked and left under runc are killed (they hold runc's socket and
/// would wait for ever).
///
/// runc runs CRIU twice per command: first for its version check, which it reaps before it
/// starts the second, then for the work, which writes its log (`dump.log`, `restore.log`) into
/// `work_dir` (runc's `--work-path`) as it starts and forks helpers (also named `criu`, left to
/// runc, a subreaper, when it dies). See [`next_watch`] for how the watch tells them apart.
pub(super) async fn criu_died_under(runc: u32, work_dir: Option<PathBuf>) {
    let mut watch = Watch::default();
    let mut gone_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if watch.pid.is_some_and(process_running) {
            // Looked for until found (two stats every poll while runc's first CRIU runs).
            watch.doing_the_work =
                watch.doing_the_work || work_dir.as_deref().is_none_or(holds_criu_log);
            gone_since = None;
            continue;
        }
        match next_watch(watch, &criu_children(runc)) {
            Next::Watch(pid) => {
                watch = Watch {
                    pid: Some(pid),
                    doing_the_work: false,
                };
                gone_since = None;
                continue;
            }
            Next::Wait => continue,
            // Latched: once the work's CRIU is known dead, nothing replaces it.
            Next::Died(pid) => {
                watch = Watch {
                    pid: Some(pid),
                    doing_the_work: true,
                }
            }
            Next::Gone => {}
        }
        let since = *gone_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= CRIU_GONE_GRACE {
            kill_leftovers(runc);
            return;
        }
    }
}

/// The CRIU the watch follows, and whether it was seen doing the work (its log was there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Watch {
    pid: Option<u32>,
    doing_the_work: bool,
}

/// A `criu` child of runc: alive in runc's own pid namespace, or a zombie runc has not reaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CriuChild {
    pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    started: u64,
    zombie: bool,
}

/// What the watch does once the CRIU it follows is not running (or none was seen yet).
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Follow this CRIU from now on.
    Watch(u32),
    /// The CRIU doing the work (this one) died: the verdict, after the grace, whatever appears
    /// meanwhile.
    Died(u32),
    /// The CRIU followed is gone and no other is there: the verdict after the grace unless
    /// another appears (runc's version check is gone and runc starts the work's CRIU, or exits).
    Gone,
    /// Nothing to decide yet (no CRIU seen).
    Wait,
}

/// The watch's decision, from what it followed and runc's `criu` children now:
/// - one that did the work (wrote its log) is never replaced: gone means died;
/// - a zombie next to another `criu` means the work's CRIU died and left helpers (runc reaps its
///   version check before it starts anything else), however briefly it lived;
/// - otherwise the oldest live one is followed (the work's CRIU is older than its helpers); a
///   lone zombie decides nothing (runc is about to reap its version check, or to exit).
fn next_watch(watch: Watch, children: &[CriuChild]) -> Next {
    if let Some(pid) = watch.pid.filter(|_| watch.doing_the_work) {
        return Next::Died(pid);
    }
    if children.len() >= 2
        && let Some(zombie) = children.iter().find(|c| c.zombie)
    {
        return Next::Died(zombie.pid);
    }
    let oldest = children
        .iter()
        .filter(|c| Some(c.pid) != watch.pid)
        .min_by_key(|c| (c.started, c.pid));
    match oldest {
        Some(c) if !c.zombie => Next::Watch(c.pid),
        _ if watch.pid.is_some() => Next::Gone,
        _ => Next::Wait,
    }
}

/// True when `dir` (runc's `--work-path`) holds the log of a CRIU dump or restore.
fn holds_criu_log(dir: &Path) -> bool {
    ["dump.log", "restore.log"]
        .iter()
        .any(|log| dir.join(log).exists())
}

/// runc's `criu` children: alive ones in runc's own pid namespace (restored tasks, named `criu`
/// until they become the actor, live in the actor's), and zombies (whose namespace is gone).
/// Each thread lists the children it forked (runc is a Go program: any of its threads may
/// have).
fn criu_children(pid: u32) -> Vec<CriuChild> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let listed: Vec<String> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .collect();
    let pid_ns = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let Some(own) = pid_ns(pid) else {
        return Vec::new();
    };
    let mut children: Vec<CriuChild> = listed
        .iter()
        .flat_map(|c| c.split_whitespace())
        .filter_map(|c| c.parse::<u32>().ok())
        .filter_map(|c| {
            let (name, state, started) = criu_stat(c)?;
            let zombie = state == "Z";
            (name == "criu" && (zombie || pid_ns(c).as_ref() == Some(&own))).then_some(CriuChild {
                pid: c,
                started,
                zombie,
            })
        })
        .collect();
    children.sort_by_key(|c| c.pid);
    children.dedup_by_key(|c| c.pid);
    children
}

/// Name, state and start time of `pid` from `/proc/<pid>/stat`.
fn criu_stat(pid: u32) -> Option<(String, String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.to_string();
    // Fields after the state: ppid … starttime is the 20th of them (field 22 overall).
    let started = rest.nth(18)?.parse().ok()?;
    Some((name, state, started))
}

/// SIGKILL to the live `criu` children of runc once the one doing the work died: its helpers
/// would otherwise wait for ever on sockets whose other end is gone.
fn kill_leftovers(runc: u32) {
    for child in criu_children(runc).iter().filter(|c| !c.zombie) {
        if let Ok(pid) = i32::try_from(child.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(pid: u32, started: u64, zombie: bool) -> CriuChild {
        CriuChild {
            pid,
            started,
            zombie,
        }
    }

    fn watching(pid: u32, doing_the_work: bool) -> Watch {
        Watch {
            pid: Some(pid),
            doing_the_work,
        }
    }

    #[test]
    fn the_watch_follows_the_oldest_live_criu_and_never_a_helper_of_a_dead_one() {
        // Nothing seen yet: wait; the first CRIU is followed.
        assert_eq!(next_watch(Watch::default(), &[]), Next::Wait);
        assert_eq!(
            next_watch(Watch::default(), &[child(10, 5, false)]),
            Next::Watch(10)
        );
        // The version check gone, the work's CRIU started: followed, not its helpers.
        let work_and_helpers = [
            child(12, 7, false),
            child(14, 7, false),
            child(13, 7, false),
        ];
        assert_eq!(
            next_watch(watching(10, false), &work_and_helpers),
            Next::Watch(12)
        );
        // The version check gone and nothing yet: the grace runs, a newcomer stops it.
        assert_eq!(next_watch(watching(10, false), &[]), Next::Gone);
        // A lone zombie (runc has not reaped its version check yet) decides nothing.
        assert_eq!(
            next_watch(Watch::default(), &[child(10, 5, true)]),
            Next::Wait
        );
        assert_eq!(
            next_watch(watching(10, false), &[child(10, 5, true)]),
            Next::Gone
        );
        // The work's CRIU killed before the watch saw its log, helpers left under runc: dead,
        // whether it was followed or never seen.
        let dead_with_helpers = [child(12, 7, true), child(13, 7, false), child(14, 8, false)];
        assert_eq!(
            next_watch(watching(10, false), &dead_with_helpers),
            Next::Died(12)
        );
        assert_eq!(
            next_watch(Watch::default(), &dead_with_helpers),
            Next::Died(12)
        );
        assert_eq!(
            next_watch(watching(12, false), &dead_with_helpers),
            Next::Died(12)
        );
        // One that wrote its log is never replaced.
        assert_eq!(
            next_watch(watching(12, true), &[child(13, 7, false)]),
            Next::Died(12)
        );
    }

    /// A stand-in for runc that runs a short `criu` (its version check, no log yet) and then a
    /// long one (the dump, whose log appears as it starts): the watch follows the second and
    /// resolves only once it is gone.
    #[tokio::test]
    async fn the_watch_follows_runcs_second_criu_and_resolves_when_it_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let criu = dir.path().join("criu");
        std::os::unix::fs::symlink("/bin/sleep", &criu).expect("symlink");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("work dir");
        let mut runc = tokio::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "{c} 0.2; touch {log}; {c} 3.5; exec /bin/sleep 30",
                c = criu.display(),
                log = work.join("dump.log").display()
            ))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let pid = runc.id().expect("pid");
        let begun = Instant::now();
        let watch = criu_died_under(pid, Some(work.clone()));
        // The first criu is gone after 0.2 s: no verdict while the second one runs.
        tokio::pin!(watch);
        let early = tokio::time::timeout(Duration::from_secs(3), &mut watch).await;
        assert!(early.is_err(), "resolved while the second criu ran");
        // Then the second is gone, and after the grace the watch resolves.
        tokio::time::timeout(Duration::from_secs(10), &mut watch)
            .await
            .expect("resolves once the working criu is gone");
        assert!(begun.elapsed() >= Duration::from_millis(3600) + CRIU_GONE_GRACE);
        let _ = runc.kill().await;
    }

    /// A CRIU that wrote its log did the work: once it is gone, another `criu` left under runc
    /// (a helper it forked) does not hold the verdict back.
    #[tokio::test]
    async fn a_working_criu_that_died_is_not_replaced_by_a_leftover() {
        let dir = tempfile::tempdir().expect("tempdir");
        let criu = dir.path().join("criu");
        std::os::unix::fs::symlink("/bin/sleep", &criu).expect("symlink");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("work dir");
        std::fs::write(work.join("restore.log"), b"").expect("log");
        let mut runc = tokio::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "{c} 0.3; {c} 30; exec /bin/sleep 30",
                c = criu.display()
            ))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let pid = runc.id().expect("pid");
        tokio::time::timeout(Duration::from_secs(6), criu_died_under(pid, Some(work)))
            .await
            .expect("resolves although another criu runs");
        let _ = runc.kill().await;
    }

    /// The work's CRIU killed a few ms in, before the watch saw it or its log, with a helper it
    /// forked left under runc (a subreaper that does not reap it: real runc waits on the
    /// socket the helper holds): the watch must not follow the helper, it resolves after the
    /// grace and kills the helper.
    #[tokio::test]
    async fn a_criu_killed_before_its_log_with_helpers_left_is_dead() {
        let dir = tempfile::tempdir().expect("tempdir");
        let version_check = dir.path().join("criu");
        std::os::unix::fs::symlink("/bin/sleep", &version_check).expect("symlink");
        let shells = dir.path().join("sh");
        std::fs::create_dir(&shells).expect("dir");
        let criu_shell = shells.join("criu");
        std::os::unix::fs::symlink("/bin/sh", &criu_shell).expect("symlink");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("work dir");
        let helper_pid = dir.path().join("helper.pid");
        // The helper stays a shell named criu (`; true` stops sh from exec-ing sleep).
        let script = dir.path().join("work-criu.sh");
        std::fs::write(
            &script,
            format!(
                "{s} -c 'sleep 30; true' &\necho $! > {pidfile}\nsleep 0.05\nkill -9 $$\n",
                s = criu_shell.display(),
                pidfile = helper_pid.display()
            ),
        )
        .expect("script");
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(format!(
                "{v} 0.05; {s} {script} & exec /bin/sleep 30",
                v = version_check.display(),
                s = criu_shell.display(),
                script = script.display(),
            ))
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
            });
        }
        let mut runc = command.spawn().expect("spawn");
        let pid = runc.id().expect("pid");
        tokio::time::timeout(Duration::from_secs(8), criu_died_under(pid, Some(work)))
            .await
            .expect("resolves although a helper of the dead criu runs");
        let helper: u32 = std::fs::read_to_string(&helper_pid)
            .expect("helper pid")
            .trim()
            .parse()
            .expect("pid");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!process_running(helper), "the helper was killed");
        let _ = runc.kill().await;
    }
}
