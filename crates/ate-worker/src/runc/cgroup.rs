//! The actor's cgroups: CPU quota and freezer, written to the v1 cgroup files directly where
//! this host has them (no process start) and through `runc update`/`pause`/`resume` otherwise,
//! plus killing and removing what a teardown leaves.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::RuncRuntime;
use crate::error::{IoContext, Result, SandboxError};
use crate::runtime::{ActorSandbox, SandboxSpec};

/// Parent of every actor cgroup (`/sys/fs/cgroup/<controller>/ate/<short id>`).
pub(super) const CGROUP_PARENT: &str = "ate";
pub(super) const CPU_PERIOD_US: u64 = 100_000;

impl RuncRuntime {
    /// Sets the container's CFS quota (µs per [`CPU_PERIOD_US`]; `None` = unlimited): the v1
    /// cpu controller file directly where this host has one, `runc update` otherwise.
    pub(super) async fn set_cpu_quota(
        &self,
        actor: &ActorSandbox,
        quota_us: Option<u64>,
    ) -> Result<()> {
        let value = quota_us.map_or("-1".to_string(), |q| q.to_string());
        let file = cpu_quota_file(actor);
        if file.is_file() {
            return tokio::fs::write(&file, &value)
                .await
                .ctx(|| format!("write {value} to {}", file.display()));
        }
        let period = CPU_PERIOD_US.to_string();
        self.runc(&[
            "update",
            "--cpu-period",
            &period,
            "--cpu-quota",
            &value,
            &actor.container_id(),
        ])
        .await
        .map(|_| ())
    }

    /// Freezes or thaws the container, without taking the actor lock: through the v1 cgroup
    /// freezer directly where this host has it (no process start; a thaw is on the resume path),
    /// `runc pause` / `runc resume` otherwise.
    pub(super) async fn set_frozen(&self, actor: &ActorSandbox, frozen: bool) -> Result<()> {
        if let Some(state) = freezer_state_file(actor) {
            return set_freezer(&state, if frozen { "FROZEN" } else { "THAWED" }).await;
        }
        let verb = if frozen { "pause" } else { "resume" };
        self.runc(&[verb, &actor.container_id()]).await.map(|_| ())
    }
}

impl RuncRuntime {
    /// Thaws a frozen (or freezing) sandbox after SIGKILL went to every one of its tasks, so
    /// that they die instead of waiting for a thaw that would never come. `paused`: runc
    /// reports the container paused (hosts without the v1 freezer files).
    pub(super) async fn thaw_to_die(&self, actor: &ActorSandbox, paused: bool) {
        let id = actor.container_id();
        if let Some(state) = freezer_state_file(actor) {
            match read_freezer(&state).await {
                Ok(now) if now == "THAWED" => {}
                Ok(now) => {
                    kill_cgroup_processes(&actor.short_id());
                    match set_freezer(&state, "THAWED").await {
                        Ok(()) => {
                            tracing::info!(container = %id, was = %now, "thawed a frozen sandbox to end it")
                        }
                        Err(e) => {
                            tracing::warn!(container = %id, error = %e, "cannot thaw a frozen sandbox to end it")
                        }
                    }
                }
                Err(e) => tracing::debug!(container = %id, error = %e, "freezer state"),
            }
        } else if paused {
            kill_cgroup_processes(&actor.short_id());
            if let Err(e) = self.runc(&["resume", &id]).await {
                tracing::warn!(container = %id, error = %e, "cannot resume a paused sandbox to end it");
            }
        }
    }
}

/// `freezer.state` of the actor's cgroup in the v1 freezer hierarchy (hybrid hosts like these;
/// runc's "paused" is this file reading FROZEN), if it exists.
pub(super) fn freezer_state_file(actor: &ActorSandbox) -> Option<PathBuf> {
    let path = Path::new("/sys/fs/cgroup/freezer")
        .join(CGROUP_PARENT)
        .join(actor.short_id())
        .join("freezer.state");
    path.is_file().then_some(path)
}

pub(super) async fn read_freezer(path: &Path) -> Result<String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .ctx(|| format!("read {}", path.display()))?;
    Ok(text.trim().to_string())
}

/// Writes `FROZEN` or `THAWED` and waits until the freezer reports it (FREEZING is transient).
async fn set_freezer(path: &Path, want: &str) -> Result<()> {
    tokio::fs::write(path, want)
        .await
        .ctx(|| format!("write {want} to {}", path.display()))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = read_freezer(path).await?;
        if now == want {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SandboxError::Invalid(format!(
                "{} reads {now} 5 s after writing {want}",
                path.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The template's CPU limit as a CFS quota per [`CPU_PERIOD_US`] (`None`: no limit).
pub(super) fn cpu_quota_us(spec: &SandboxSpec) -> Option<u64> {
    (spec.resources.cpu_millis > 0)
        .then(|| u64::from(spec.resources.cpu_millis) * CPU_PERIOD_US / 1000)
}

fn cpu_quota_file(actor: &ActorSandbox) -> PathBuf {
    Path::new("/sys/fs/cgroup/cpu")
        .join(CGROUP_PARENT)
        .join(actor.short_id())
        .join("cpu.cfs_quota_us")
}

/// The container's current CFS quota (-1 = none), where the v1 cpu controller file exists.
pub(super) async fn read_cpu_quota(actor: &ActorSandbox) -> Option<i64> {
    let text = tokio::fs::read_to_string(cpu_quota_file(actor))
        .await
        .ok()?;
    text.trim().parse().ok()
}

/// The actor's cgroup directory in each hierarchy that has one.
fn actor_cgroups(short_id: &str) -> Vec<PathBuf> {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    hierarchies
        .flatten()
        .map(|h| h.path().join(CGROUP_PARENT).join(short_id))
        .filter(|dir| dir.is_dir())
        .collect()
}

/// SIGKILLs every process in the actor's cgroups (the restored tasks, and CRIU, which runc
/// puts there for a restore).
pub(super) fn kill_cgroup_processes(short_id: &str) {
    for dir in actor_cgroups(short_id) {
        let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
            continue;
        };
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The processes (thread-group ids) in the actor's cgroups, each once.
pub(super) fn cgroup_processes(short_id: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = actor_cgroups(short_id)
        .into_iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The name of the memfd CRIU's parasite code is mapped from in a task it infects (compel's
/// `parasite_memfd_exchange`); the task shows it in its maps as `/memfd:CRIUMFD (deleted)`.
const PARASITE_MEMFD: &str = "memfd:CRIUMFD";

/// A process of the actor that still has CRIU's parasite mapped (CRIU was killed before it
/// cured the task), as "pid N"; None if there is none.
pub(super) fn parasite_left_in(short_id: &str) -> Option<String> {
    cgroup_processes(short_id)
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .is_ok_and(|maps| maps.contains(PARASITE_MEMFD))
        })
        .map(|pid| format!("pid {pid}"))
}

/// Removes leftover actor cgroups in every hierarchy (runc delete normally does this; a crash
/// between dump and delete can leave empty ones).
pub(super) fn remove_cgroups(short_id: &str) {
    for dir in actor_cgroups(short_id) {
        if let Err(e) = std::fs::remove_dir(&dir) {
            tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove actor cgroup");
        }
    }
}
