//! The invariants checked after each fault: no actor running on two workers, slots equal to
//! running containers, no sandbox leftovers (netns, overlay mount, process, cgroup) without
//! their container.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_proto::v1;
use tokio::process::Command;

use super::ATESPACE;
use super::lab::Lab;

/// The api updates slots asynchronously, and a torn-down sandbox takes a moment to disappear:
/// slot and orphan checks retry for this long before they report.
const CHECK_RETRY: Duration = Duration::from_secs(5);

/// The checks after a fault's recovery.
#[derive(Default)]
pub(super) struct Checks {
    pub(super) double: Vec<(String, Vec<String>)>,
    pub(super) slots: Vec<SlotMismatch>,
    pub(super) orphans: Vec<String>,
    /// Workers the api has marked GONE while their sandboxes run.
    pub(super) gone: Vec<String>,
    /// A check that could not run.
    pub(super) errors: Vec<String>,
}

pub(super) async fn check_invariants(lab: &Lab, actors: &[String]) -> Checks {
    let layout = lab.layout(actors);
    let mut checks = Checks::default();
    match layout.containers().await {
        Ok(containers) => checks.double = layout.double_activations(&containers),
        Err(e) => checks
            .errors
            .push(format!("cannot list the containers: {e:#}")),
    }
    match lab.slot_mismatches(&layout).await {
        Ok(m) => checks.slots = m,
        Err(e) => checks.errors.push(format!("slot check did not run: {e:#}")),
    }
    match gone_with_sandboxes(&lab.api().await, &layout).await {
        Ok(g) => checks.gone = g,
        Err(e) => checks.errors.push(format!("gone check did not run: {e:#}")),
    }
    match layout.orphans_settled().await {
        Ok(o) => checks.orphans = o,
        Err(e) => checks
            .errors
            .push(format!("orphan check did not run: {e:#}")),
    }
    checks
}

/// A runc container as `runc list --format json` shows it.
#[derive(Clone, Debug, serde::Deserialize)]
pub(super) struct Container {
    id: String,
    #[serde(default)]
    status: String,
}

/// Where an actor's sandbox would be on each worker: its container id (= netns name) and
/// cgroup short id, derived from the actor's directory exactly as the worker does.
#[derive(Clone)]
pub(super) struct Layout {
    state: PathBuf,
    workers: Vec<String>,
    /// container id → (worker, actor)
    ids: HashMap<String, (String, String)>,
}

impl Layout {
    pub(super) fn new(state: &Path, workers: u32, actors: &[String]) -> Layout {
        let mut ids: BTreeSet<String> = (1..=workers).map(|i| format!("worker-{i}")).collect();
        if let Ok(dirs) = std::fs::read_dir(state.join("workers")) {
            ids.extend(
                dirs.flatten()
                    .map(|d| d.file_name().to_string_lossy().into_owned()),
            );
        }
        let workers: Vec<String> = ids.into_iter().collect();
        let mut map = HashMap::new();
        for w in &workers {
            for a in actors {
                let dir = actor_dir(state, w, ATESPACE, a);
                map.insert(container_id(&dir), (w.clone(), a.clone()));
            }
        }
        Layout {
            state: state.to_path_buf(),
            workers,
            ids: map,
        }
    }

    /// Whatever of the layout's actors is still on the host: containers runc lists, netns,
    /// mounts and processes without one, and the actor's directory on each worker. For actors
    /// that were deleted, all of it is left behind.
    pub(super) async fn anything_left(&self) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        for (worker, containers) in self.containers().await? {
            for c in containers {
                if let Some((_, actor)) = self.ids.get(&c.id) {
                    out.push(format!(
                        "container {} ({ATESPACE}/{actor}, {}) on {worker}",
                        c.id, c.status
                    ));
                }
            }
        }
        out.extend(self.orphans().await?);
        for (worker, actor) in self.ids.values() {
            let dir = actor_dir(&self.state, worker, ATESPACE, actor);
            if dir.exists() {
                out.push(format!("directory {}", dir.display()));
            }
        }
        Ok(out)
    }

    fn runc_root(&self, worker: &str) -> PathBuf {
        self.state.join("workers").join(worker).join("runc")
    }

    /// Every worker's containers (runc list), by worker id.
    pub(super) async fn containers(&self) -> anyhow::Result<HashMap<String, Vec<Container>>> {
        let mut out = HashMap::new();
        for w in &self.workers {
            out.insert(w.clone(), runc_list(&self.runc_root(w)).await?);
        }
        Ok(out)
    }

    /// Actors with a running container on more than one worker, with those workers.
    pub(super) fn double_activations(
        &self,
        containers: &HashMap<String, Vec<Container>>,
    ) -> Vec<(String, Vec<String>)> {
        let mut running: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (worker, list) in containers {
            for c in list.iter().filter(|c| c.status == "running") {
                if let Some((w, actor)) = self.ids.get(&c.id)
                    && w == worker
                {
                    running.entry(actor.clone()).or_default().push(w.clone());
                }
            }
        }
        running
            .into_iter()
            .filter(|(_, ws)| ws.len() > 1)
            .map(|(a, mut ws)| {
                ws.sort();
                (a, ws)
            })
            .collect()
    }

    /// [`Layout::orphans`], again for up to `CHECK_RETRY` while any is found: a sandbox being
    /// torn down or built has its netns or mount for a moment without its container.
    async fn orphans_settled(&self) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + CHECK_RETRY;
        loop {
            let found = self.orphans().await?;
            if found.is_empty() || Instant::now() >= deadline {
                return Ok(found);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Netns, overlay mounts and counter processes of this state dir's actors whose container
    /// runc does not list.
    async fn orphans(&self) -> anyhow::Result<Vec<String>> {
        let containers = self.containers().await?;
        let listed: HashSet<&str> = containers
            .values()
            .flatten()
            .map(|c| c.id.as_str())
            .collect();
        let mut out = Vec::new();
        let name = |id: &str| {
            self.ids
                .get(id)
                .map(|(w, a)| format!("{ATESPACE}/{a} on {w}"))
                .unwrap_or_else(|| "an actor of this state dir".into())
        };
        for netns in list_netns() {
            if self.ids.contains_key(&netns) && !listed.contains(netns.as_str()) {
                out.push(format!(
                    "netns {netns} ({}) without its container",
                    name(&netns)
                ));
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        let workers_dir = self.state.join("workers");
        for mount in overlay_mounts(&mountinfo, &workers_dir) {
            let Some(dir) = mount.strip_suffix("/rootfs") else {
                out.push(format!("overlay mount {mount} outside an actor's rootfs"));
                continue;
            };
            let id = container_id(Path::new(dir));
            if !listed.contains(id.as_str()) {
                out.push(format!(
                    "overlay mount {mount} ({}) without its container {id}",
                    name(&id)
                ));
            }
        }
        let ours: HashMap<String, &String> = self
            .ids
            .keys()
            .map(|id| (id.trim_start_matches("ate-").to_string(), id))
            .collect();
        for (pid, short) in counter_processes() {
            if let Some(id) = ours.get(&short)
                && !listed.contains(id.as_str())
            {
                out.push(format!(
                    "counter process {pid} in cgroup /ate/{short} ({}) without its container",
                    name(id)
                ));
            }
        }
        // Cgroup directories the runtime made for a sandbox (`<hierarchy>/ate/<short id>`) must
        // go with it: a kept one would hand its limits to the actor's next start.
        for (dir, short) in actor_cgroup_dirs() {
            if let Some(id) = ours.get(&short)
                && !listed.contains(id.as_str())
            {
                out.push(format!(
                    "cgroup {} ({}) without its container",
                    dir.display(),
                    name(id)
                ));
            }
        }
        Ok(out)
    }
}

/// Every worker the api knows of, with its status and usage.
async fn list_workers(api: &ate_client::Clients) -> anyhow::Result<Vec<v1::Worker>> {
    Ok(api
        .fleet
        .clone()
        .list_workers(v1::ListWorkersRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("list workers: {}", s.message()))?
        .into_inner()
        .workers)
}

/// Workers the api lists as GONE while runc runs containers of theirs: the api released (and may
/// resume elsewhere) actors whose sandboxes still run. `api` is a connection to the current api.
pub(super) async fn gone_with_sandboxes(
    api: &anyhow::Result<ate_client::Clients>,
    layout: &Layout,
) -> anyhow::Result<Vec<String>> {
    let api = match api {
        Ok(c) => c,
        Err(e) => anyhow::bail!("no api: {e:#}"),
    };
    let workers = list_workers(api).await?;
    let mut out = Vec::new();
    for w in workers.into_iter().filter(|w| w.status == "GONE") {
        let running = runc_list(&layout.runc_root(&w.id))
            .await?
            .iter()
            .filter(|c| c.status == "running")
            .count();
        if running > 0 {
            out.push(format!(
                "{} (epoch {}) marked GONE while sandboxes of it ran",
                w.id, w.epoch
            ));
        }
    }
    Ok(out)
}

/// `<state>/workers/<worker>/actors/<atespace>/<name>`: the directory the worker hashes into the
/// sandbox's names.
fn actor_dir(state: &Path, worker: &str, atespace: &str, name: &str) -> PathBuf {
    state
        .join("workers")
        .join(worker)
        .join("actors")
        .join(atespace)
        .join(name)
}

/// The container id (= netns name, `ate-<short id>`) of the actor directory `dir`.
fn container_id(dir: &Path) -> String {
    ate_worker::ActorSandbox::new("", "", "", dir).container_id()
}

/// `runc --root ROOT list --format json`; no root yet means no containers.
async fn runc_list(root: &Path) -> anyhow::Result<Vec<Container>> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let out = Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run runc list")?;
    anyhow::ensure!(
        out.status.success(),
        "runc --root {} list: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let list: Option<Vec<Container>> = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("runc --root {} list: unexpected output", root.display()))?;
    Ok(list.unwrap_or_default())
}

/// Named network namespaces (`/var/run/netns`).
fn list_netns() -> Vec<String> {
    std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Mount points of overlay mounts under `under`, from a mountinfo text.
fn overlay_mounts(mountinfo: &str, under: &Path) -> Vec<String> {
    let prefix = format!("{}/", under.display());
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount_point = unescape_mountinfo(left.split_whitespace().nth(4)?);
            (fstype == "overlay" && mount_point.starts_with(&prefix)).then_some(mount_point)
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(super) fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(oct) = field.get(i + 1..i + 4)
            && oct.bytes().all(|c| (b'0'..=b'7').contains(&c))
            && let Ok(b) = u8::from_str_radix(oct, 8)
        {
            out.push(b);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(directory, short id)` of every actor cgroup in every hierarchy under /sys/fs/cgroup.
fn actor_cgroup_dirs() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for h in hierarchies.flatten() {
        let Ok(actors) = std::fs::read_dir(h.path().join("ate")) else {
            continue;
        };
        for a in actors.flatten() {
            if a.path().is_dir() {
                out.push((a.path(), a.file_name().to_string_lossy().into_owned()));
            }
        }
    }
    out
}

/// `(pid, cgroup short id)` of every process named `counter` that sits in an actor cgroup
/// (`/ate/<short id>`).
fn counter_processes() -> Vec<(u32, String)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "counter")
        })
        .filter_map(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            Some((pid, actor_cgroup(&cgroup)?))
        })
        .collect()
}

/// The actor short id in a `/proc/PID/cgroup` text (`N:controller:/ate/<short id>`).
fn actor_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let rest = path.split("/ate/").nth(1)?;
        let short = rest.split('/').next()?;
        (!short.is_empty()).then(|| short.to_string())
    })
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct SlotMismatch {
    pub(super) worker: String,
    pub(super) used: u32,
    pub(super) running: usize,
}

impl Lab {
    /// Workers whose used slots (api) differ from their running containers (runc), after up
    /// to `CHECK_RETRY` of agreeing.
    async fn slot_mismatches(&self, layout: &Layout) -> anyhow::Result<Vec<SlotMismatch>> {
        let deadline = Instant::now() + CHECK_RETRY;
        loop {
            let found = self.slot_mismatches_once(layout).await;
            match found {
                Ok(m) if m.is_empty() => return Ok(m),
                Ok(m) if Instant::now() >= deadline => return Ok(m),
                Err(e) if Instant::now() >= deadline => return Err(e),
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    async fn slot_mismatches_once(&self, layout: &Layout) -> anyhow::Result<Vec<SlotMismatch>> {
        let workers = list_workers(&self.api().await?).await?;
        let mut out = Vec::new();
        for w in workers {
            let running = runc_list(&layout.runc_root(&w.id))
                .await?
                .iter()
                .filter(|c| c.status == "running")
                .count();
            let used = w.used.map_or(0, |u| u.actor_slots);
            if used as usize != running {
                out.push(SlotMismatch {
                    worker: w.id,
                    used,
                    running,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_mounts_under_the_workers_dir_are_found_and_unescaped() {
        let info = "\
36 35 0:40 / /s/workers/worker-1/actors/faults/c1/rootfs rw - overlay overlay rw,lowerdir=x
37 35 0:41 / /s/workers/worker-1/actors/faults/c\\0402/rootfs rw - overlay overlay rw
38 35 0:42 / /s/snapshots rw - tmpfs tmpfs rw
39 35 0:43 / /other/workers/worker-1/actors/faults/c1/rootfs rw - overlay overlay rw";
        assert_eq!(
            overlay_mounts(info, Path::new("/s/workers")),
            [
                "/s/workers/worker-1/actors/faults/c1/rootfs",
                "/s/workers/worker-1/actors/faults/c 2/rootfs"
            ]
        );
    }

    #[test]
    fn actor_cgroups_are_parsed() {
        let cgroup = "9:name=systemd:/\n4:memory:/ate/0a1b2c3d4e\n1:cpu:/ate/0a1b2c3d4e\n";
        assert_eq!(actor_cgroup(cgroup).as_deref(), Some("0a1b2c3d4e"));
        assert_eq!(actor_cgroup("0::/\n"), None);
    }

    #[test]
    fn container_ids_hash_the_actor_dir_like_the_worker() {
        let dir = actor_dir(Path::new("/s"), "worker-1", "faults", "c1");
        let sandbox = ate_worker::ActorSandbox::new("faults", "c1", "uid-x", &dir);
        assert_eq!(container_id(&dir), sandbox.container_id());
        assert_ne!(
            container_id(&dir),
            container_id(&actor_dir(Path::new("/s"), "worker-2", "faults", "c1"))
        );
    }
}
