//! [`SandboxRuntime`] on `runc` (OCI containers) with CRIU for memory checkpoints.
//!
//! Host facts this follows (see shared/notes/sandbox-facts.md): the netns is pre-created and
//! passed by path (a runc-made one comes back with `lo` down after restore); container stdio is a
//! pipe, never a host file (CRIU cannot dump those); restore runs in runc's fresh PID namespace so
//! old pids never collide; the host has hybrid cgroups, which runc 1.1 drives through v1.
//!
//! This file holds the runtime, its config and the verbs (`SandboxRuntime`); what they use is
//! split by concern: `bundle` (the actor's directories, overlays and `config.json` before runc
//! runs), `spawn` (runc started detached, its output relayed into the actor log), `criu` (CRIU
//! options and probing, dump and memory restore), `teardown`, `cgroup` (freezer, CPU quota),
//! `mounts` (overlays), `oci` (the spec as an OCI config) and `files` (filesystem helpers).

mod bundle;
mod cgroup;
mod criu;
mod exec;
mod external;
mod files;
mod image_streamer;
mod mounts;
mod oci;
mod orphans;
mod spawn;
mod teardown;
pub mod userns;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{IoContext, Result, SandboxError};
use crate::lazy::PageSource;
use crate::reaper::{self, InitStatus, Inits};
use crate::runtime::{
    ActorSandbox, Capabilities, CheckpointStats, ExitInfo, RunMode, SandboxRuntime, SandboxSpec,
    Started,
};
use ate_netns::pool::NetnsPool;

use cgroup::{freezer_state_file, read_freezer};
pub use criu::{CRIU_OPTIONS, CRIU_OPTIONS_SIDECARS};
use criu::{criu_kdat_cache_possible, parse_criu_version};
use files::remove_file_if_exists;
use oci::exec_failure;
pub(crate) use oci::{
    DEV_OPTIONS, EXEC_FAILED, IDENTITY_OPTIONS, SHM_OPTIONS, SYSFS_OPTIONS, VOLUME_OPTIONS,
    command_line, merge_env, mount, process_args, render_args,
};
use spawn::pid_file;
pub(crate) use spawn::{CRIU_DIED, RUNC_DIED};

/// Sandbox class reported for this runtime.
pub const SANDBOX_CLASS: &str = "runc";

/// Where the runtime keeps its state and which binaries it uses.
#[derive(Debug, Clone)]
pub struct RuncConfig {
    /// runc state goes to `<state_dir>/runc` (`--root`).
    pub state_dir: PathBuf,
    pub runc: PathBuf,
    /// `None`: look up `criu` on PATH; memory snapshots are disabled when it is missing or < 4.2.
    pub criu: Option<PathBuf>,
    /// Network namespaces kept ready for the next starts and restores (0: made on demand).
    pub spare_netns: usize,
    /// The program (and arguments) that copies a container's output into its log: reads the
    /// pipe on stdin, appends to the log on stdout. `ate worker` uses `ate log-relay`, which
    /// stamps each line with its time; plain `cat` (the default) does not.
    pub log_relay: Vec<String>,
    /// Every new sandbox in its own user namespace (issue 30; see [`userns`]). Restores follow
    /// the generation: one dumped in a user namespace is restored in one, an older one without.
    pub userns: bool,
    /// Node-wide dir of user namespace range claims, shared by every worker on the node.
    pub userns_claims_dir: PathBuf,
    /// Lazy restores track what their tasks write (when CRIU and the kernel can: see
    /// [`SandboxRuntime::tracks_memory`]), so a later [`SandboxRuntime::checkpoint_incremental`]
    /// writes only that. Off in this default (`ate worker` turns it on, `--track-memory`): each
    /// tracked restore keeps its page source running.
    pub track_memory: bool,
}

impl RuncConfig {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        RuncConfig {
            state_dir: state_dir.into(),
            runc: PathBuf::from("runc"),
            criu: None,
            spare_netns: ate_netns::pool::DEFAULT_SPARE_NETNS,
            log_relay: vec!["cat".to_string()],
            userns: userns::enabled_by_default(),
            userns_claims_dir: PathBuf::from(userns::DEFAULT_CLAIMS_DIR),
            track_memory: false,
        }
    }
}

/// runc + CRIU runtime.
pub struct RuncRuntime {
    root: PathBuf,
    runc: String,
    criu: Option<String>,
    /// CRIU and the kernel can restore memory lazily (`criu check --feature uffd-noncoop`).
    lazy_pages: bool,
    /// A lazy restore can also open its userfaultfd inside an actor's user namespace (see
    /// [`userns::lazy_restore_in_userns`]).
    lazy_in_userns: bool,
    /// CRIU reads an eager restore's images through [`image_streamer`] (the project's CRIU
    /// patch 0002): a sealed generation's memory is opened as CRIU reads it.
    stream_images: bool,
    /// Lazy restores track writes (CRIU patch 0003, `UFFD_FEATURE_WP_ASYNC`, PAGEMAP_SCAN; and
    /// asked for in [`RuncConfig::track_memory`]).
    track_memory: bool,
    /// CRIU options for every dump and restore (see [`CRIU_OPTIONS`]).
    criu_conf: PathBuf,
    /// See [`RuncConfig::log_relay`].
    log_relay: Vec<String>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Container inits, children of the worker (a subreaper): exits without `runc state`.
    inits: Inits,
    /// Each running container's log relay (by container id): once the container is gone, the
    /// relay's exit means its last output is in the log.
    relays: Mutex<HashMap<String, tokio::process::Child>>,
    /// Ready network namespaces, named for an actor in `prepare`.
    netns_pool: NetnsPool,
    /// See [`RuncConfig::userns`].
    userns: bool,
    /// See [`RuncConfig::userns_claims_dir`].
    userns_claims: PathBuf,
}

impl std::fmt::Debug for RuncRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuncRuntime")
            .field("root", &self.root)
            .field("criu", &self.criu)
            .finish()
    }
}

impl RuncRuntime {
    /// Checks runc is usable and finds a CRIU ≥ 4.2 (older ones fail on this kernel).
    pub async fn new(config: RuncConfig) -> Result<Self> {
        let runc = config.runc.to_string_lossy().into_owned();
        ate_cmd::run(&runc, ["--version"]).await?;
        let root = config.state_dir.join("runc");
        tokio::fs::create_dir_all(&root)
            .await
            .ctx(|| format!("create {}", root.display()))?;
        let criu_bin = config
            .criu
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "criu".to_string());
        let run = if criu_bin == "none" {
            Err("--criu=none".to_string())
        } else {
            ate_cmd::run(&criu_bin, ["--version"])
                .await
                .map_err(|e| e.to_string())
        };
        let mut criu_version = String::new();
        let criu = match run {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                criu_version = text.to_string();
                match parse_criu_version(&text) {
                    Some(v) if v >= (4, 2) => Some(criu_bin),
                    v => {
                        tracing::warn!(criu = %criu_bin, version = ?v, "CRIU older than 4.2: memory snapshots disabled (no memory:criu capability)");
                        None
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "CRIU not usable: memory snapshots disabled (no memory:criu capability)");
                None
            }
        };
        // Lazy restores need userfaultfd with the non-cooperative events CRIU asks for (a
        // kernel or sysctl without them would fail every lazy restore): probed once here.
        let lazy_pages = match &criu {
            Some(bin) => match ate_cmd::run(bin, ["check", "--feature", "uffd-noncoop"]).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "CRIU reports no non-cooperative userfaultfd: memory restores are eager");
                    false
                }
            },
            None => false,
        };
        let lazy_in_userns = lazy_pages && userns::lazy_restore_in_userns(&criu_version);
        if lazy_pages && config.userns && !lazy_in_userns {
            tracing::warn!(
                "this CRIU cannot open a userfaultfd inside a user namespace (it lacks the project's \
                 patch, scripts/criu-patches, or /dev/userfaultfd is missing) and \
                 vm.unprivileged_userfaultfd is 0: memory restores of sandboxes in user namespaces are eager"
            );
        }
        let stream_images = criu.is_some() && userns::criu_patch_level(&criu_version) >= 2;
        if criu.is_some() && !stream_images {
            tracing::warn!(
                "this CRIU cannot read images from a streamer over RPC (it lacks the project's \
                 patch 0002, scripts/criu-patches): a sealed generation's memory is opened into \
                 the snapshot scratch before an eager restore"
            );
        }
        let track_memory = config.track_memory
            && lazy_pages
            && (lazy_in_userns || !config.userns)
            && match (
                userns::criu_patch_level(&criu_version) >= 3,
                ate_page_source::written::probe(),
            ) {
                (true, Ok(())) => true,
                (false, _) => {
                    tracing::warn!(
                        "memory tracking needs the project's CRIU patch 0003 (scripts/criu-patches): every dump is whole"
                    );
                    false
                }
                (true, Err(why)) => {
                    tracing::warn!(%why, "this kernel cannot track memory writes: every dump is whole");
                    false
                }
            };
        if criu.is_some() && !criu_kdat_cache_possible() {
            tracing::warn!(
                "/run is not a tmpfs and /run/criu.kdat is not kept on one: CRIU probes the kernel \
                 again on every dump and restore (~30 ms each); scripts/criu-kdat-cache.sh gives it a cache"
            );
        }
        if let Err(e) = reaper::become_subreaper() {
            tracing::warn!(error = %e, "cannot become a child subreaper: exits are found with `runc state` and carry no exit code");
        }
        tokio::task::spawn_blocking(ate_netns::prepare_dir)
            .await
            .map_err(|e| {
                SandboxError::Invalid(format!("preparing {}: {e}", ate_netns::NETNS_DIR))
            })??;
        let criu_conf = root.join("criu.conf");
        tokio::fs::write(&criu_conf, CRIU_OPTIONS)
            .await
            .ctx(|| format!("write {}", criu_conf.display()))?;
        Ok(RuncRuntime {
            root,
            runc,
            criu,
            lazy_pages,
            lazy_in_userns,
            stream_images,
            track_memory,
            criu_conf,
            log_relay: config.log_relay.clone(),
            locks: Mutex::new(HashMap::new()),
            inits: Inits::new(),
            relays: Mutex::new(HashMap::new()),
            // A sandbox in a user namespace gets its netns from runc (see `userns`): no spares.
            netns_pool: NetnsPool::new(if config.userns { 0 } else { config.spare_netns }),
            userns: config.userns,
            userns_claims: config.userns_claims_dir.clone(),
        })
    }

    /// The `--root` directory (for `runc --root … list` in diagnostics and tests).
    pub fn runc_root(&self) -> &Path {
        &self.root
    }

    fn lock_for(&self, actor: &ActorSandbox) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = match self.locks.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        map.entry(actor.container_id()).or_default().clone()
    }

    fn base_args(&self) -> Vec<String> {
        let mut args = vec![
            "--root".to_string(),
            self.root.to_string_lossy().into_owned(),
        ];
        if let Some(criu) = &self.criu {
            args.push("--criu".to_string());
            args.push(criu.clone());
        }
        args
    }

    async fn runc(&self, extra: &[&str]) -> Result<std::process::Output> {
        let mut args = self.base_args();
        args.extend(extra.iter().map(|s| s.to_string()));
        Ok(ate_cmd::run(&self.runc, &args).await?)
    }

    /// `runc state` status, `None` when runc does not know the container.
    async fn status(&self, id: &str) -> Result<Option<(String, Option<u32>)>> {
        let mut args = self.base_args();
        args.extend(["state".to_string(), id.to_string()]);
        let out = ate_cmd::output(&self.runc, &args).await?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("does not exist") || err.contains("not exist") {
                return Ok(None);
            }
            return Err(ate_cmd::failed(&self.runc, &args, &out).into());
        }
        let state: Value =
            serde_json::from_slice(&out.stdout).map_err(|e| SandboxError::Command {
                command: ate_cmd::render(&self.runc, &args),
                status: "unparsable output".to_string(),
                stderr: e.to_string(),
            })?;
        let status = state
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string();
        let pid = state
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0);
        Ok(Some((status, pid)))
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for RuncRuntime {
    async fn end_earlier_commands(&self) -> Vec<String> {
        orphans::end_earlier_commands(Path::new(&self.runc), &self.root, std::process::id()).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            can_restore_memory: self.criu.is_some(),
            can_keep_frozen: self.criu.is_some(),
            // CRIU's lazy restore opens its userfaultfd from the restored task, inside the
            // actor's user namespace: see `userns::lazy_restore_in_userns`.
            can_restore_lazily: self.lazy_pages && (!self.userns || self.lazy_in_userns),
            can_stream_images: self.stream_images,
            sandbox_class: SANDBOX_CLASS.to_string(),
        }
    }

    async fn run(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        mode: RunMode,
    ) -> Result<Started> {
        let lock = self.lock_for(actor);
        let _guard = lock.lock().await;
        let begun = Instant::now();
        self.teardown(actor).await?;
        let result = async {
            self.prepare(
                actor,
                spec,
                bundle::Bundle {
                    fresh_upper: mode == RunMode::FreshRootfs,
                    in_userns: self.userns,
                    ..Default::default()
                },
            )
            .await?;
            let bundle = actor.dir.to_string_lossy().into_owned();
            remove_file_if_exists(&pid_file(actor)).await?;
            self.spawn_detached(
                actor,
                vec![
                    "run".into(),
                    "-d".into(),
                    "--pid-file".into(),
                    pid_file(actor).to_string_lossy().into_owned(),
                    "--bundle".into(),
                    bundle,
                    actor.container_id(),
                ],
                None,
            )
            .await
            .map_err(|e| exec_failure(e, spec))?;
            self.started(actor, begun).await
        }
        .await;
        if result.is_err() {
            let _ = self.teardown(actor).await;
        }
        result
    }

    async fn checkpoint(&self, actor: &ActorSandbox, image_dir: &Path) -> Result<CheckpointStats> {
        self.dump(actor, image_dir, false, None).await
    }

    async fn checkpoint_frozen(
        &self,
        actor: &ActorSandbox,
        image_dir: &Path,
    ) -> Result<CheckpointStats> {
        self.dump(actor, image_dir, true, None).await
    }

    /// Lazy restores track what their tasks write (see [`RuncConfig::track_memory`]).
    fn tracks_memory(&self) -> bool {
        self.track_memory
    }

    /// A memory dump of an actor restored lazily with tracking, into `image_dir`, leaving the
    /// pages its tasks have not written since to the images it was restored from (`parent`,
    /// relative to `image_dir`: CRIU links it as `image_dir/parent`, and a restore of this dump
    /// reads those pages through that link). With `keep_frozen` the sandbox stays paused, as
    /// for `checkpoint_frozen`. The dump is whole (no link) when tracking does not hold; the
    /// [`Tracking`](crate::lazy::Tracking) returned says which it was.
    async fn checkpoint_incremental(
        &self,
        actor: &ActorSandbox,
        image_dir: &Path,
        parent: &Path,
        source: &crate::lazy::PageSource,
        keep_frozen: bool,
    ) -> Result<(CheckpointStats, crate::lazy::Tracking)> {
        if parent.is_absolute() {
            return Err(SandboxError::Invalid(format!(
                "the parent images of an incremental dump are named relative to its images dir, not {}",
                parent.display()
            )));
        }
        self.dump_tracked(actor, image_dir, keep_frozen, Some((parent, source)))
            .await
    }

    /// After an incremental (or whole) dump that left the sandbox frozen and became the next
    /// generation's parent: write-protects again every page its processes wrote, so the next
    /// dump against that generation holds only what is written after the thaw. Refused unless
    /// the sandbox is frozen (a page written between the dump and this call would be lost to
    /// tracking). Returns the pages protected.
    async fn rearm_tracking(&self, actor: &ActorSandbox) -> Result<u64> {
        let frozen = match cgroup::freezer_state_file(actor) {
            Some(state) => cgroup::read_freezer(&state).await? == "FROZEN",
            None => false,
        };
        if !frozen {
            return Err(SandboxError::Invalid(format!(
                "memory tracking of {} is re-armed only while it is frozen",
                actor.container_id()
            )));
        }
        let pids = cgroup::cgroup_processes(&actor.short_id());
        tokio::task::spawn_blocking(move || {
            pids.into_iter().try_fold(0u64, |sum, pid| {
                ate_page_source::written::rearm(pid).map(|n| sum + n)
            })
        })
        .await
        .map_err(|e| SandboxError::Invalid(format!("re-arm memory tracking: {e}")))?
        .map_err(|e| {
            SandboxError::io(
                format!("re-arm memory tracking of {}", actor.container_id()),
                e,
            )
        })
    }

    async fn freeze(&self, actor: &ActorSandbox) -> Result<()> {
        let lock = self.lock_for(actor);
        let _guard = lock.lock().await;
        self.set_frozen(actor, true).await
    }

    async fn thaw(&self, actor: &ActorSandbox) -> Result<()> {
        let lock = self.lock_for(actor);
        let _guard = lock.lock().await;
        let id = actor.container_id();
        let frozen = match freezer_state_file(actor) {
            Some(state) => read_freezer(&state).await? == "FROZEN",
            None => matches!(self.status(&id).await?, Some((status, _)) if status == "paused"),
        };
        if !frozen {
            return Err(SandboxError::Invalid(format!(
                "container {id} is not frozen"
            )));
        }
        self.set_frozen(actor, false).await
    }

    async fn restore(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        image_dir: &Path,
    ) -> Result<Started> {
        self.restore_memory(actor, spec, image_dir, None)
            .await
            .map(|(started, _)| started)
    }

    async fn restore_lazily(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        generation_dir: &Path,
        page_source: &[String],
    ) -> Result<(Started, PageSource)> {
        let image_dir = generation_dir.join(ate_snapshot::CRIU_DIR);
        let (started, source) = self
            .restore_memory(actor, spec, &image_dir, Some((generation_dir, page_source)))
            .await?;
        let source = source.ok_or_else(|| {
            SandboxError::Unsupported("lazy restore started no page source".into())
        })?;
        Ok((started, source))
    }

    async fn stop(&self, actor: &ActorSandbox) -> Result<()> {
        let lock = self.lock_for(actor);
        let _guard = lock.lock().await;
        self.teardown(actor).await
    }

    async fn exec(
        &self,
        actor: &ActorSandbox,
        spec: &crate::exec::ExecSpec,
    ) -> Result<crate::exec::Exec> {
        self.exec_in(actor, spec).await
    }

    async fn output_flushed(&self, actor: &ActorSandbox, timeout: Duration) {
        let relay = self
            .relays
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&actor.container_id()));
        match relay {
            Some(mut relay) => {
                let _ = tokio::time::timeout(timeout, relay.wait()).await;
            }
            // A relay of an earlier worker process (re-adopted sandbox): give it a moment.
            None => tokio::time::sleep(timeout.min(Duration::from_millis(100))).await,
        }
    }

    async fn dump_remnants(&self, actor: &ActorSandbox) -> Option<String> {
        let short_id = actor.short_id();
        tokio::task::spawn_blocking(move || cgroup::parasite_left_in(&short_id))
            .await
            .ok()
            .flatten()
    }

    async fn is_paused(&self, actor: &ActorSandbox) -> Result<bool> {
        Ok(
            matches!(self.status(&actor.container_id()).await?, Some((status, _)) if status == "paused"),
        )
    }

    async fn is_running(&self, actor: &ActorSandbox) -> Result<bool> {
        Ok(
            matches!(self.status(&actor.container_id()).await?, Some((status, _)) if status == "running"),
        )
    }

    async fn exited(&self, actor: &ActorSandbox) -> Result<Option<ExitInfo>> {
        let id = actor.container_id();
        match self.inits.status(&id) {
            Some(InitStatus::Running) => return Ok(None),
            Some(InitStatus::Exited(code)) => {
                return Ok(Some(ExitInfo {
                    status: "exited".to_string(),
                    code: Some(code),
                }));
            }
            // Unknown init, or not our child: runc's view (no exit code).
            Some(InitStatus::NotOurs) | None => {}
        }
        Ok(match self.status(&id).await? {
            None => Some(ExitInfo {
                status: "missing".to_string(),
                code: None,
            }),
            Some((status, _)) if status == "stopped" => Some(ExitInfo { status, code: None }),
            Some(_) => None,
        })
    }
}
