//! CRIU: the options every dump and restore runs with, probing the installed CRIU, and the two
//! memory paths (dump for `checkpoint`/`checkpoint_frozen`, `runc restore` eager or lazy).

use std::path::Path;
use std::time::Instant;

use super::RuncRuntime;
use super::cgroup::{cpu_quota_us, read_cpu_quota};
use super::files::{dir_size, remove_dir_if_exists, remove_file_if_exists};
use super::spawn::{criu_died_under, pid_file};
use crate::error::{IoContext, Result, SandboxError};
use crate::lazy::{PageSource, Tracking};
use crate::reaper::InitStatus;
use crate::runtime::{ActorSandbox, CheckpointStats, SandboxSpec, Started};

/// CRIU options the worker's dumps and restores run with (the file overrides what runc asks
/// for over RPC):
/// - `tcp-close`: an actor's TCP connections are dumped without TCP repair and restored
///   closed (shut down both ways), like a laptop that slept: a read sees end-of-file, a write
///   EPIPE, epoll a hang-up, and the actor reconnects. Open connections (an HTTP keep-alive
///   pool, a stream, a database) never block a suspend and never break a restore; a
///   connection's peer (the worker's egress proxy, a router's tunnel) is gone by then anyway.
///   Listening sockets are restored listening. The dump records the option, and a restore of
///   such an image needs it too.
/// - `network-lock skip`: CRIU's default network lock runs `iptables-restore` in the actor
///   netns twice per dump and per restore (~100 ms of a ~250 ms restore here); it guards TCP
///   connections under repair, and with `tcp-close` none is (the netns is private to the
///   actor and its ingress and egress are off during the dump).
/// - `manage-cgroups ignore`: runc creates the actor's cgroups (from config.json) and puts
///   CRIU into them before a restore, so the restored tasks land there anyway; CRIU's own
///   cgroup handling (mounting every controller into a scratch yard, dumping and comparing
///   properties) cost ~20 ms of a ~100 ms CRIU restore and some of each dump.
pub const CRIU_OPTIONS: &str = "network-lock skip\nmanage-cgroups ignore\ntcp-close\n";

/// [`CRIU_OPTIONS`] for an actor with sidecars, with `tcp-established` in place of
/// `tcp-close`: its containers talk over loopback inside the actor's netns, and CRIU dumps both
/// ends of such a connection (they are in one process tree) and restores them with TCP repair,
/// so they survive a suspend. With every task frozen during the dump and both ends repaired
/// before any runs, no lock is needed. A connection to outside the actor is restored too, but
/// its peer is gone: the actor's next write on it is answered with a reset.
pub const CRIU_OPTIONS_SIDECARS: &str =
    "network-lock skip\nmanage-cgroups ignore\ntcp-established\n";

/// The options an actor's dumps and restores run with.
pub(super) fn criu_options(spec: &SandboxSpec) -> &'static str {
    if spec.sidecars.is_empty() {
        CRIU_OPTIONS
    } else {
        CRIU_OPTIONS_SIDECARS
    }
}

/// An actor's own CRIU options file in its sandbox dir (sidecars, or a streamed restore).
pub(super) const ACTOR_CRIU_CONF: &str = "criu.conf";

/// The line a streamed restore adds to the actor's options: CRIU reads the images through
/// [`super::image_streamer`] (needs the project's CRIU patch 0002).
pub(super) const CRIU_STREAM_OPTION: &str = "stream";

/// The line a tracked lazy restore adds: lazy ranges registered for write protection too
/// (CRIU patch 0003; the page source places pages write-protected).
pub(super) const CRIU_LAZY_WP_OPTION: &str = "lazy-pages-wp";

/// The option of an incremental dump (CRIU patch 0003): `--track-mem` reads "written since
/// placed write-protected"; tasks started at or after the value (CLOCK_BOOTTIME µs) are whole.
const CRIU_TRACK_SINCE_OPTION: &str = "track-mem-uffd-since";

/// Makes the actor's own options file, if it has one, right for a dump: runc hands the file a
/// container was restored with to its dumps too. A restore's lines go ([`CRIU_STREAM_OPTION`]:
/// a dump has no streamer; [`CRIU_LAZY_WP_OPTION`]: only for restores), and an incremental
/// dump's tracking line is set (`track_since`) or dropped. Done after every streamed restore
/// and before every dump (a worker killed between the two leaves the line for the re-adopted
/// sandbox's next dump to drop).
async fn options_for_dumps(actor: &ActorSandbox, track_since: Option<u64>) -> Result<()> {
    let path = actor.dir.join(ACTOR_CRIU_CONF);
    let text = match tokio::fs::read_to_string(&path).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match track_since {
                None => Ok(()),
                Some(_) => Err(SandboxError::Invalid(format!(
                    "an incremental dump of {} needs its own CRIU options file (a tracked restore writes it)",
                    actor.container_id()
                ))),
            };
        }
        Err(e) => return Err(SandboxError::io(format!("read {}", path.display()), e)),
    };
    let restore_only = |l: &str| {
        let l = l.trim();
        l == CRIU_STREAM_OPTION
            || l == CRIU_LAZY_WP_OPTION
            || l.split_whitespace().next() == Some(CRIU_TRACK_SINCE_OPTION)
    };
    let mut kept: String = text
        .lines()
        .filter(|l| !restore_only(l))
        .map(|l| format!("{l}\n"))
        .collect();
    if let Some(since) = track_since {
        kept.push_str(&format!("{CRIU_TRACK_SINCE_OPTION} {since}\n"));
    }
    if kept == text {
        return Ok(());
    }
    tokio::fs::write(&path, kept)
        .await
        .ctx(|| format!("write {}", path.display()))
}

impl RuncRuntime {
    /// The memory dump behind `checkpoint` and `checkpoint_frozen`. With `keep_frozen` the
    /// container is paused (cgroup freezer) before the dump and CRIU leaves it paused, so the
    /// kept processes are exactly the dumped state; without, runc removes the container.
    ///
    /// With `incremental` (the parent images' path relative to `image_dir`, and the page source
    /// of the tracked restore from them) the container is frozen first and the page source
    /// asked whether tracking holds: then pages not written since are left to the parent
    /// (`PE_PARENT` entries and a `parent` link in `image_dir`); otherwise, or on any doubt,
    /// the dump is whole. The returned [`Tracking`] says which.
    pub(super) async fn dump(
        &self,
        actor: &ActorSandbox,
        image_dir: &Path,
        keep_frozen: bool,
        incremental: Option<(&Path, &PageSource)>,
    ) -> Result<CheckpointStats> {
        self.dump_tracked(actor, image_dir, keep_frozen, incremental)
            .await
            .map(|(stats, _)| stats)
    }

    pub(super) async fn dump_tracked(
        &self,
        actor: &ActorSandbox,
        image_dir: &Path,
        keep_frozen: bool,
        incremental: Option<(&Path, &PageSource)>,
    ) -> Result<(CheckpointStats, Tracking)> {
        if self.criu.is_none() {
            return Err(SandboxError::Unsupported(
                "memory checkpoint needs CRIU ≥ 4.2".to_string(),
            ));
        }
        let lock = self.lock_for(actor);
        let _guard = lock.lock().await;
        let id = actor.container_id();
        let running = match self.inits.status(&id) {
            // The init is our child and alive: no need to ask runc (one process less per suspend).
            Some(InitStatus::Running) => Some(("running".to_string(), None)),
            _ => self.status(&id).await?,
        };
        match running {
            Some((status, _)) if status == "running" => {}
            other => {
                return Err(SandboxError::Checkpoint {
                    path: image_dir.to_path_buf(),
                    message: format!("container {id} is not running ({other:?})"),
                });
            }
        }
        tokio::fs::create_dir_all(image_dir)
            .await
            .ctx(|| format!("create {}", image_dir.display()))?;
        let work = actor.dir.join("criu-dump");
        remove_dir_if_exists(&work).await?;
        tokio::fs::create_dir_all(&work)
            .await
            .ctx(|| format!("create {}", work.display()))?;
        let image = image_dir.to_string_lossy().into_owned();
        let work_s = work.to_string_lossy().into_owned();
        let begun = Instant::now();
        // CRIU's parasite code runs in the actor's tasks, so in its cgroup: lift the CPU quota
        // for the dump (put back below when the container stays).
        let quota = read_cpu_quota(actor).await;
        if quota.is_some_and(|q| q > 0) {
            self.set_cpu_quota(actor, None).await?;
        }
        // Frozen before the barrier: no task can write, map or fork between the page source's
        // answer and CRIU's scan.
        let froze_for_tracking = incremental.is_some() && !keep_frozen;
        if keep_frozen || froze_for_tracking {
            self.set_frozen(actor, true).await?;
        }
        let tracking = match incremental {
            Some((_, source)) => source.barrier().await,
            None => Tracking::Lost("a whole dump was asked for".into()),
        };
        let parent = match (&tracking, incremental) {
            (Tracking::Holds { .. }, Some((parent, _))) => {
                Some(parent.to_string_lossy().into_owned())
            }
            _ => None,
        };
        if let (Tracking::Lost(why), Some(_)) = (&tracking, incremental) {
            tracing::info!(container = %id, %why, "memory tracking lost: a whole dump");
        }
        let track_since = match &tracking {
            Tracking::Holds { since_us } if parent.is_some() => Some(*since_us),
            _ => None,
        };
        if let Err(e) = options_for_dumps(actor, track_since).await {
            // Nothing was dumped: the sandbox goes back to how it was found.
            if keep_frozen || froze_for_tracking {
                let _ = self.set_frozen(actor, false).await;
            }
            if let Some(q) = quota.filter(|q| *q > 0) {
                let _ = self.set_cpu_quota(actor, u64::try_from(q).ok()).await;
            }
            return Err(e);
        }
        // Default flags suffice here: TCP as the CRIU config file says (see CRIU_OPTIONS),
        // cgroups in runc's default "soft" mode; the netns is external and re-supplied on restore.
        let mut args = vec!["checkpoint"];
        if keep_frozen {
            args.push("--leave-running");
        }
        if super::userns::recorded_base(&actor.dir).is_some() {
            // The netns is runc's (owned by the actor's user namespace): its links, addresses
            // and egress rules are made again from outside at restore (see `userns`).
            args.extend(["--empty-ns", "network"]);
        }
        if let Some(parent) = &parent {
            args.extend(["--parent-path", parent]);
        }
        args.extend(["--image-path", &image, "--work-path", &work_s, &id]);
        // A CRIU killed in the middle leaves runc waiting for an answer that never comes:
        // ended when its CRIU is gone.
        let mut full = self.base_args();
        full.extend(args.iter().map(|a| a.to_string()));
        let dumped = ate_cmd::run_unless(&self.runc, &full, |runc| {
            criu_died_under(runc, Some(work.clone()))
        })
        .await;
        let dump = begun.elapsed();
        if (keep_frozen || dumped.is_err())
            && let Some(q) = quota.filter(|q| *q > 0)
            && let Err(e) = self.set_cpu_quota(actor, u64::try_from(q).ok()).await
        {
            tracing::warn!(container = %id, error = %e, "could not put the CPU quota back after a dump");
        }
        if let Err(e) = dumped {
            if keep_frozen || froze_for_tracking {
                // The caller falls back to stopping the sandbox; leave it as it found it.
                if let Err(e) = self.set_frozen(actor, false).await {
                    tracing::debug!(container = %id, error = %e, "thaw after a failed dump");
                }
            }
            // A `runc checkpoint` that died (killed) leaves its CRIU running, reparented to this
            // process (a child subreaper): it must be gone before the caller thaws the sandbox
            // for good or tries again.
            wait_orphaned_criu(ORPHAN_CRIU_WAIT).await;
            let log = tokio::fs::read_to_string(work.join("dump.log"))
                .await
                .unwrap_or_default();
            let message = format!("{e}\n--- dump.log ---\n{}", ate_cmd::tail(&log, 2000));
            return Err(SandboxError::Checkpoint {
                path: image_dir.to_path_buf(),
                message,
            });
        }
        if !keep_frozen {
            // runc removed the container; release the host-side pieces (files stay for archiving).
            self.teardown(actor).await?;
        }
        let image_bytes = dir_size(image_dir).await?;
        let tracking = if parent.is_some() {
            tracking
        } else {
            match tracking {
                Tracking::Holds { .. } => Tracking::Lost("a whole dump was asked for".into()),
                lost => lost,
            }
        };
        Ok((CheckpointStats { dump, image_bytes }, tracking))
    }

    /// `runc restore` of the dump in `image_dir`; with `lazy` (the generation dir and the page
    /// source command) the memory pages are left to a page source started first
    /// (`--lazy-pages`), which is returned with the sandbox.
    pub(super) async fn restore_memory(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        image_dir: &Path,
        lazy: Option<(&Path, &[String])>,
    ) -> Result<(Started, Option<PageSource>)> {
        if self.criu.is_none() {
            return Err(SandboxError::Unsupported(
                "memory restore needs CRIU ≥ 4.2".to_string(),
            ));
        }
        if !image_dir.join("inventory.img").is_file() {
            return Err(SandboxError::Checkpoint {
                path: image_dir.to_path_buf(),
                message: "no inventory.img: not a complete CRIU image".to_string(),
            });
        }
        let lock = self.lock_for(actor);
        let _guard = lock.lock().await;
        let begun = Instant::now();
        self.teardown(actor).await?;
        let mut page_source = None;
        // The generation decides: dumped in a user namespace, restored in one (a generation
        // written before user namespaces is restored without).
        let in_userns = super::userns::image_has_userns(image_dir);
        // A worker whose CRIU cannot open a userfaultfd inside a user namespace restores such
        // a generation eagerly: the same memory, read in full before ingress.
        let lazy = if in_userns && lazy.is_some() && !self.lazy_in_userns {
            tracing::warn!(
                actor = %format!("{}/{}", actor.atespace, actor.name),
                "lazy restore of a sandbox in a user namespace needs CRIU with the project's patch \
                 (scripts/criu-patches) and /dev/userfaultfd, or vm.unprivileged_userfaultfd=1: restoring eagerly"
            );
            None
        } else {
            lazy
        };
        // Images opened from a sealed generation (or a lazy restore's download) sit in a scratch
        // dir on a tmpfs: the range's copy goes into a scratch dir of this restore's own, on
        // the same tmpfs (hard links; a copy on the actor's disk would put plaintext there).
        let own_scratch = if ate_snapshot::sealed::Scratch::contains(image_dir) {
            Some(ate_snapshot::sealed::Scratch::new("images").map_err(|e| {
                SandboxError::io("snapshot scratch dir", std::io::Error::other(e.to_string()))
            })?)
        } else {
            None
        };
        let scratch_images = own_scratch.as_ref().map_or_else(
            || actor.dir.join("criu-images"),
            |s| s.path().join("criu-images"),
        );
        // A sealed generation opened without its memory images: CRIU reads them through the
        // image streamer, opened as it reads (see `image_streamer`).
        // (Also a lazy restore turned eager above: its scratch holds sparse memory images.)
        let streamed = match lazy {
            None => super::image_streamer::memory_images(image_dir)?,
            Some(_) => None,
        };
        if streamed.is_some() && !self.stream_images {
            return Err(SandboxError::Checkpoint {
                path: image_dir.to_path_buf(),
                message: "the memory images were not opened, and this CRIU cannot stream them \
                          (it lacks the project's patch 0002, scripts/criu-patches)"
                    .to_string(),
            });
        }
        let mut streamer = None;
        // A lazy restore tracks writes where this runtime can (see `RuncConfig::track_memory`).
        let track_memory = lazy.is_some() && self.track_memory;
        let result = async {
            let base = self
                .prepare(
                    actor,
                    spec,
                    super::bundle::Bundle {
                        restoring: true,
                        in_userns,
                        stream_images: streamed.is_some(),
                        track_memory,
                        ..Default::default()
                    },
                )
                .await?;
            let image_dir = match base {
                Some(base) => {
                    // CRIU gives the new user namespace the mapping it dumped: restore from a
                    // copy whose userns image maps the range claimed now.
                    super::userns::images_for_range(image_dir, &scratch_images, base)?;
                    if let Some(s) = &own_scratch {
                        // The restored task opens some images from inside its user namespace.
                        super::userns::open_to_range(s.path(), base)?;
                    }
                    scratch_images.as_path()
                }
                None => image_dir,
            };
            let prepared = begun.elapsed();
            let work = actor.dir.join("criu-restore");
            remove_dir_if_exists(&work).await?;
            tokio::fs::create_dir_all(&work)
                .await
                .ctx(|| format!("create {}", work.display()))?;
            remove_file_if_exists(&pid_file(actor)).await?;
            let mut args = vec!["restore".to_string(), "-d".to_string()];
            if base.is_some() {
                args.extend(["--empty-ns".to_string(), "network".to_string()]);
            }
            if let Some((generation_dir, command)) = lazy {
                // CRIU connects to `lazy-pages.socket` in its work dir: the source listens first.
                page_source = Some(
                    PageSource::start(command, generation_dir, &work, track_memory).await?,
                );
                args.push("--lazy-pages".to_string());
            }
            if let Some(memory) = streamed {
                // CRIU connects to `streamer-serve.sock` in its images dir: listening first.
                streamer = Some(super::image_streamer::ImageStreamer::start(image_dir, memory)?);
            }
            args.extend([
                "--pid-file".to_string(),
                pid_file(actor).to_string_lossy().into_owned(),
                "--image-path".to_string(),
                image_dir.to_string_lossy().into_owned(),
                "--work-path".to_string(),
                work.to_string_lossy().into_owned(),
                "--bundle".to_string(),
                actor.dir.to_string_lossy().into_owned(),
                actor.container_id(),
            ]);
            let spawned = self.spawn_detached(actor, args, page_source.as_ref()).await;
            if let Some(streamer) = streamer.take() {
                let served = streamer.finish().await;
                // Whatever CRIU made of a short pipe, a refused image is the reason.
                if let Some(refused) = served.refused {
                    return Err(SandboxError::Checkpoint {
                        path: image_dir.to_path_buf(),
                        message: format!("a memory image was refused while streaming it to CRIU: {refused}"),
                    });
                }
                tracing::debug!(container = %actor.container_id(), memory_bytes = served.memory_bytes, "memory images streamed");
                crate::metrics::memory_streamed(served.memory_bytes);
                options_for_dumps(actor, None).await?;
            }
            spawned?;
            let restored = begun.elapsed();
            self.set_cpu_quota(actor, cpu_quota_us(spec)).await?;
            let started = self.started(actor, begun).await;
            tracing::debug!(
                container = %actor.container_id(),
                lazy = lazy.is_some(),
                prepare_ms = prepared.as_millis() as u64,
                runc_restore_ms = (restored - prepared).as_millis() as u64,
                after_ms = (begun.elapsed() - restored).as_millis() as u64,
                "runc restore"
            );
            started
        }
        .await;
        let _ = remove_dir_if_exists(&scratch_images).await;
        match result {
            Ok(started) => Ok((started, page_source)),
            Err(e) => {
                let _ = self.teardown(actor).await;
                // Dropping the handle ends the page source; the sandbox is gone first.
                drop(page_source);
                Err(e)
            }
        }
    }
}

/// How long a failed dump waits for a CRIU its dead `runc` left behind, before killing it.
const ORPHAN_CRIU_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until no `criu` process is a child of this one (a CRIU whose `runc` died is
/// reparented here), reaping each; past `timeout` the rest are killed. Without a tracer CRIU
/// fails its next exchange with runc and lets the actor's tasks go within milliseconds.
async fn wait_orphaned_criu(timeout: std::time::Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let orphans = orphaned_criu();
        if orphans.is_empty() {
            return;
        }
        let past = Instant::now() >= deadline;
        for pid in &orphans {
            let pid = nix::unistd::Pid::from_raw(*pid);
            if past {
                tracing::warn!(pid = %pid, "a CRIU left by a dead runc is still running; killing it");
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            // Reaps it if it has exited (it is this process's child now).
            let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Pids of the `criu` processes whose parent is this process.
fn orphaned_criu() -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                let field = |name: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::trim)
                        .unwrap_or("")
                        .to_string()
                };
                field("Name:") == "criu" && field("PPid:") == me
            })
        })
        .collect()
}

/// Whether CRIU can keep its kernel-probe cache (`/run/criu.kdat`): it only does on a tmpfs,
/// either because `/run` is one (systemd hosts) or because the file was put on one
/// (`scripts/criu-kdat-cache.sh`).
pub(super) fn criu_kdat_cache_possible() -> bool {
    let on_tmpfs = |p: &str| {
        nix::sys::statfs::statfs(p)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
    };
    on_tmpfs("/run") || on_tmpfs("/run/criu.kdat")
}

pub(super) fn parse_criu_version(text: &str) -> Option<(u32, u32)> {
    let v = criu_version_line(text)?;
    let mut parts = v.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor = parts
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    Some((major, minor))
}

/// The value of `criu --version`'s `Version:` line (`4.2.1`, `4.2.1.ate1`).
pub(super) fn criu_version_line(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criu_versions() {
        assert_eq!(parse_criu_version("Version: 4.2.1\n"), Some((4, 2)));
        assert_eq!(parse_criu_version("Version: 3.17\nGitID: x"), Some((3, 17)));
        assert_eq!(parse_criu_version("nope"), None);
    }
}
