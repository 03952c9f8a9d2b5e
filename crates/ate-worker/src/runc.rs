//! [`SandboxRuntime`] on `runc` (OCI containers) with CRIU for memory checkpoints.
//!
//! Host facts this follows (see shared/notes/sandbox-facts.md): the netns is pre-created and
//! passed by path (a runc-made one comes back with `lo` down after restore); container stdio is a
//! pipe, never a host file (CRIU cannot dump those); restore runs in runc's fresh PID namespace so
//! old pids never collide; the host has hybrid cgroups, which runc 1.1 drives through v1.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::cmd;
use crate::error::{IoContext, Result, SandboxError, tail};
use crate::hardening;
use crate::lazy::PageSource;
use crate::netns;
use crate::netns_pool::NetnsPool;
use crate::reaper::{self, InitStatus, Inits};
use crate::runtime::{
    ActorSandbox, Capabilities, CheckpointStats, ExitInfo, RunMode, SandboxRuntime, SandboxSpec,
    Started,
};
use crate::sidecars;

/// Sandbox class reported for this runtime.
pub const SANDBOX_CLASS: &str = "runc";
/// Parent of every actor cgroup (`/sys/fs/cgroup/<controller>/ate/<short id>`).
const CGROUP_PARENT: &str = "ate";
const CPU_PERIOD_US: u64 = 100_000;
/// How long a teardown waits for a killed init to exit (so it can be reaped) before it removes
/// the cgroups anyway.
const INIT_EXIT_WAIT: Duration = Duration::from_millis(500);
pub(crate) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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
}

impl RuncConfig {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        RuncConfig {
            state_dir: state_dir.into(),
            runc: PathBuf::from("runc"),
            criu: None,
            spare_netns: crate::netns_pool::DEFAULT_SPARE_NETNS,
            log_relay: vec!["cat".to_string()],
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
}

/// CRIU options the worker's dumps and restores run with (the file overrides what runc asks
/// for over RPC):
/// - `network-lock skip`: CRIU's default network lock runs `iptables-restore` in the actor
///   netns twice per dump and per restore (~100 ms of a ~250 ms restore here); the lock only
///   guards established TCP traffic during the dump, and the worker never dumps with
///   established connections (ingress off, tunnels closed, egress reset, TCP table checked
///   first), while the netns is private to the actor.
/// - `manage-cgroups ignore`: runc creates the actor's cgroups (from config.json) and puts
///   CRIU into them before a restore, so the restored tasks land there anyway; CRIU's own
///   cgroup handling (mounting every controller into a scratch yard, dumping and comparing
///   properties) cost ~20 ms of a ~100 ms CRIU restore and some of each dump.
pub const CRIU_OPTIONS: &str = "network-lock skip\nmanage-cgroups ignore\n";

/// [`CRIU_OPTIONS`] for an actor with sidecars, plus `tcp-established`: its containers talk over
/// loopback inside the actor's netns, and CRIU dumps both ends of such a connection (they are in
/// one process tree) and restores them with TCP repair, so they survive a suspend. With every
/// task frozen during the dump and both ends repaired before any runs, no lock is needed.
pub const CRIU_OPTIONS_SIDECARS: &str =
    "network-lock skip\nmanage-cgroups ignore\ntcp-established\n";

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
        cmd::run(&runc, ["--version"]).await?;
        let root = config.state_dir.join("runc");
        tokio::fs::create_dir_all(&root)
            .await
            .ctx(|| format!("create {}", root.display()))?;
        let criu_bin = config
            .criu
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "criu".to_string());
        let criu = match cmd::run(&criu_bin, ["--version"]).await {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                match parse_criu_version(&text) {
                    Some(v) if v >= (4, 2) => Some(criu_bin),
                    v => {
                        tracing::warn!(criu = %criu_bin, version = ?v, "CRIU older than 4.2: memory snapshots disabled (ROOTFS fallback)");
                        None
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "CRIU not usable: memory snapshots disabled (ROOTFS fallback)");
                None
            }
        };
        // Lazy restores need userfaultfd with the non-cooperative events CRIU asks for (a
        // kernel or sysctl without them would fail every lazy restore): probed once here.
        let lazy_pages = match &criu {
            Some(bin) => match cmd::run(bin, ["check", "--feature", "uffd-noncoop"]).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "CRIU reports no non-cooperative userfaultfd: memory restores are eager");
                    false
                }
            },
            None => false,
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
        let criu_conf = root.join("criu.conf");
        tokio::fs::write(&criu_conf, CRIU_OPTIONS)
            .await
            .ctx(|| format!("write {}", criu_conf.display()))?;
        Ok(RuncRuntime {
            root,
            runc,
            criu,
            lazy_pages,
            criu_conf,
            log_relay: config.log_relay.clone(),
            locks: Mutex::new(HashMap::new()),
            inits: Inits::new(),
            relays: Mutex::new(HashMap::new()),
            netns_pool: NetnsPool::new(config.spare_netns),
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
        cmd::run(&self.runc, &args).await
    }

    /// `runc state` status, `None` when runc does not know the container.
    async fn status(&self, id: &str) -> Result<Option<(String, Option<u32>)>> {
        let mut args = self.base_args();
        args.extend(["state".to_string(), id.to_string()]);
        let out = cmd::output(&self.runc, &args).await?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("does not exist") || err.contains("not exist") {
                return Ok(None);
            }
            return Err(cmd::failed(&self.runc, &args, &out));
        }
        let state: Value =
            serde_json::from_slice(&out.stdout).map_err(|e| SandboxError::Command {
                command: cmd::render(&self.runc, &args),
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

    /// Directories, overlay, identity files, netns and `config.json`: everything before runc.
    /// With `restoring`, the config carries no CPU quota: runc runs CRIU inside the container's
    /// cgroup, so the restore itself would be throttled to the actor's share (a 250m actor's
    /// 50 MiB restore took ~0.45 s instead of ~0.1 s); [`apply_cpu_quota`] sets it afterwards.
    async fn prepare(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        fresh_upper: bool,
        restoring: bool,
    ) -> Result<()> {
        validate_spec(actor, spec)?;
        let begun = Instant::now();
        let dir = &actor.dir;
        tokio::fs::create_dir_all(dir)
            .await
            .ctx(|| format!("create {}", dir.display()))?;
        if fresh_upper {
            remove_dir_if_exists(&actor.upper_dir()).await?;
            for s in &spec.sidecars {
                remove_dir_if_exists(&actor.container_upper_dir(&s.name)).await?;
            }
        }
        // Overlay refuses a work dir left over from another mount; it is scratch space anyway.
        remove_dir_if_exists(&actor.work_dir()).await?;
        for d in [
            actor.upper_dir(),
            actor.work_dir(),
            actor.rootfs_dir(),
            actor.identity_dir(),
        ] {
            tokio::fs::create_dir_all(&d)
                .await
                .ctx(|| format!("create {}", d.display()))?;
        }
        for v in &spec.volumes {
            let d = actor.volume_dir(&v.name);
            tokio::fs::create_dir_all(&d)
                .await
                .ctx(|| format!("create {}", d.display()))?;
        }
        write_identity(actor).await?;
        if !spec.sidecars.is_empty() && !restoring {
            // A process starts fresh from these (a memory restore keeps the bytes it maps).
            let plan = sidecars::plan(spec, &process_args(spec), &build_env(spec));
            sidecars::write_init(&actor.upper_dir(), &plan).await?;
        }
        for s in &spec.sidecars {
            let dir = actor.container_dir(&s.name);
            let work = dir.join("work");
            remove_dir_if_exists(&work).await?;
            for d in [
                actor.container_upper_dir(&s.name),
                work.clone(),
                actor.container_rootfs_dir(&s.name),
            ] {
                tokio::fs::create_dir_all(&d)
                    .await
                    .ctx(|| format!("create {}", d.display()))?;
            }
            unmount_if_mounted(&actor.container_rootfs_dir(&s.name))?;
            mount_overlay(
                &s.image.rootfs,
                &actor.container_upper_dir(&s.name),
                &work,
                &actor.container_rootfs_dir(&s.name),
            )?;
        }
        let dirs_done = begun.elapsed();
        mount_overlay(
            &spec.image.rootfs,
            &actor.upper_dir(),
            &actor.work_dir(),
            &actor.rootfs_dir(),
        )?;
        let overlay_done = begun.elapsed();
        let mut config = oci_config(actor, spec);
        if restoring
            && let Some(resources) = config
                .pointer_mut("/linux/resources")
                .and_then(Value::as_object_mut)
        {
            // Explicitly unlimited, not just absent: a cgroup left by an earlier life of this
            // actor (same name) would otherwise keep its old quota and throttle CRIU anyway.
            resources.insert(
                "cpu".to_string(),
                json!({"quota": -1, "period": CPU_PERIOD_US}),
            );
        }
        let criu_conf = if spec.sidecars.is_empty() {
            self.criu_conf.clone()
        } else {
            let path = dir.join("criu.conf");
            tokio::fs::write(&path, CRIU_OPTIONS_SIDECARS)
                .await
                .ctx(|| format!("write {}", path.display()))?;
            path
        };
        if let Some(obj) = config.as_object_mut() {
            // runc hands this file to CRIU on checkpoint and restore (its `org.criu.config`
            // annotation): per-actor CRIU options without touching /etc/criu.
            let annotations = obj.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(
                    "org.criu.config".to_string(),
                    Value::String(criu_conf.to_string_lossy().into_owned()),
                );
            }
        }
        let bytes =
            serde_json::to_vec_pretty(&config).map_err(|e| SandboxError::Invalid(e.to_string()))?;
        let path = dir.join("config.json");
        tokio::fs::write(&path, bytes)
            .await
            .ctx(|| format!("write {}", path.display()))?;
        let config_done = begun.elapsed();
        self.netns_pool.create(&actor.netns()).await?;
        tracing::debug!(
            container = %actor.container_id(),
            dirs_us = dirs_done.as_micros() as u64,
            overlay_us = (overlay_done - dirs_done).as_micros() as u64,
            config_us = (config_done - overlay_done).as_micros() as u64,
            netns_us = (begun.elapsed() - config_done).as_micros() as u64,
            "sandbox prepared"
        );
        Ok(())
    }

    /// Spawns `runc <args>` (run -d / restore -d) with stdout+stderr on a fresh pipe whose read
    /// end is copied into the actor log by a relay process that ends when every writer has
    /// closed. The relay is not the worker: it outlives a worker that crashes or is killed, so
    /// the actor never gets EPIPE/SIGPIPE for writing to its stdout while no worker runs, and
    /// a restarted worker re-adopts the sandbox with its log still flowing.
    async fn spawn_detached(
        &self,
        actor: &ActorSandbox,
        args: Vec<String>,
        page_source: Option<&PageSource>,
    ) -> Result<()> {
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
            command: cmd::render(&self.runc, &full),
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
        let status = tokio::select! {
            status = child.wait() => status.ctx(|| "wait for runc")?,
            why = failed => {
                let _ = child.start_kill();
                kill_cgroup_processes(&actor.short_id());
                let _ = child.wait().await;
                return Err(SandboxError::Command {
                    command: cmd::render(&self.runc, &full),
                    status: "ended: the page source gave up".to_string(),
                    stderr: why,
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
        let mut stderr = tail(&String::from_utf8_lossy(&log), 2000);
        if let Some(work) = full
            .iter()
            .position(|a| a == "--work-path")
            .and_then(|i| full.get(i + 1))
        {
            let criu_log = Path::new(work).join("restore.log");
            if let Ok(text) = tokio::fs::read_to_string(&criu_log).await {
                stderr.push_str(&format!(
                    "\n--- {} ---\n{}",
                    criu_log.display(),
                    tail(&text, 2000)
                ));
            }
        }
        Err(SandboxError::Command {
            command: cmd::render(&self.runc, &full),
            status: status.to_string(),
            stderr,
        })
    }

    async fn started(&self, actor: &ActorSandbox, begun: Instant) -> Result<Started> {
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

    /// The memory dump behind `checkpoint` and `checkpoint_frozen`. With `keep_frozen` the
    /// container is paused (cgroup freezer) before the dump and CRIU leaves it paused, so the
    /// kept processes are exactly the dumped state; without, runc removes the container.
    async fn dump(
        &self,
        actor: &ActorSandbox,
        image_dir: &Path,
        keep_frozen: bool,
    ) -> Result<CheckpointStats> {
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
        if keep_frozen {
            self.set_frozen(actor, true).await?;
        }
        // Default flags suffice here: no established TCP (the worker closes connections first),
        // cgroups in runc's default "soft" mode; the netns is external and re-supplied on restore.
        let mut args = vec!["checkpoint"];
        if keep_frozen {
            args.push("--leave-running");
        }
        args.extend(["--image-path", &image, "--work-path", &work_s, &id]);
        let dumped = self.runc(&args).await;
        let dump = begun.elapsed();
        if (keep_frozen || dumped.is_err())
            && let Some(q) = quota.filter(|q| *q > 0)
            && let Err(e) = self.set_cpu_quota(actor, u64::try_from(q).ok()).await
        {
            tracing::warn!(container = %id, error = %e, "could not put the CPU quota back after a dump");
        }
        if let Err(e) = dumped {
            if keep_frozen {
                // The caller falls back to stopping the sandbox; leave it as it found it.
                if let Err(e) = self.set_frozen(actor, false).await {
                    tracing::debug!(container = %id, error = %e, "thaw after a failed dump");
                }
            }
            let log = tokio::fs::read_to_string(work.join("dump.log"))
                .await
                .unwrap_or_default();
            let message = format!("{e}\n--- dump.log ---\n{}", tail(&log, 2000));
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
        Ok(CheckpointStats { dump, image_bytes })
    }

    /// `runc restore` of the dump in `image_dir`; with `lazy` (the generation dir and the page
    /// source command) the memory pages are left to a page source started first
    /// (`--lazy-pages`), which is returned with the sandbox.
    async fn restore_memory(
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
        let result = async {
            self.prepare(actor, spec, false, true).await?;
            let prepared = begun.elapsed();
            let work = actor.dir.join("criu-restore");
            remove_dir_if_exists(&work).await?;
            tokio::fs::create_dir_all(&work)
                .await
                .ctx(|| format!("create {}", work.display()))?;
            remove_file_if_exists(&pid_file(actor)).await?;
            let mut args = vec!["restore".to_string(), "-d".to_string()];
            if let Some((generation_dir, command)) = lazy {
                // CRIU connects to `lazy-pages.socket` in its work dir: the source listens first.
                page_source = Some(PageSource::start(command, generation_dir, &work).await?);
                args.push("--lazy-pages".to_string());
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
            self.spawn_detached(actor, args, page_source.as_ref())
                .await?;
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

    /// Sets the container's CFS quota (µs per [`CPU_PERIOD_US`]; `None` = unlimited): the v1
    /// cpu controller file directly where this host has one, `runc update` otherwise.
    async fn set_cpu_quota(&self, actor: &ActorSandbox, quota_us: Option<u64>) -> Result<()> {
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
    async fn set_frozen(&self, actor: &ActorSandbox, frozen: bool) -> Result<()> {
        if let Some(state) = freezer_state_file(actor) {
            return set_freezer(&state, if frozen { "FROZEN" } else { "THAWED" }).await;
        }
        let verb = if frozen { "pause" } else { "resume" };
        self.runc(&[verb, &actor.container_id()]).await.map(|_| ())
    }

    /// Everything `stop` does, without taking the actor lock.
    async fn teardown(&self, actor: &ActorSandbox) -> Result<()> {
        let id = actor.container_id();
        // runc keeps a container's state in `<root>/<id>`: without it there is nothing to ask
        // runc about (spares a `runc state` process before every run and restore).
        // Leftovers of a restore ended in the middle (see `unmount_below`) first: runc cannot
        // delete a container whose state dir still has CRIU's root mounted.
        unmount_below(&actor.dir.join("criu-restore"));
        unmount_below(&self.root.join(&id));
        let known = tokio::fs::try_exists(self.root.join(&id))
            .await
            .unwrap_or(true);
        if known && self.status(&id).await?.is_some() {
            // The container may be dying on its own; kill errors are only informative.
            if let Err(e) = self.runc(&["kill", &id, "KILL"]).await {
                tracing::debug!(container = %id, error = %e, "runc kill");
            }
            let mut last_err = None;
            for _ in 0..20 {
                match self.runc(&["delete", "-f", &id]).await {
                    Ok(_) => {
                        last_err = None;
                        break;
                    }
                    Err(e) => {
                        if self.status(&id).await?.is_none() {
                            last_err = None;
                            break;
                        }
                        last_err = Some(e);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(e) = last_err {
                return Err(e);
            }
        }
        // A restore ended in the middle leaves runc a state dir it cannot read back (no state
        // for `runc state`, so nothing was deleted above) and a later restore would be refused
        // ("container with given ID already exists"). Its processes are gone (killed with the
        // cgroup); the dir is only runc's bookkeeping.
        let state_dir = self.root.join(&id);
        if tokio::fs::try_exists(&state_dir).await.unwrap_or(false)
            && self.status(&id).await.ok().flatten().is_none()
        {
            tracing::debug!(container = %id, "removing runc state left by an interrupted restore");
            remove_dir_if_exists(&state_dir).await?;
        }
        // The init must be reaped before its cgroups can go (a zombie still counts as a member
        // on this kernel's v1 hierarchies: rmdir says EBUSY and the cgroup, with its limits,
        // would outlive the actor).
        self.inits.forget_after(&id, INIT_EXIT_WAIT).await;
        self.inits.reap_pending();
        // Dropped, the relay is reaped by tokio when it ends (at EOF, the container being gone).
        if let Ok(mut relays) = self.relays.lock() {
            relays.remove(&id);
        }
        unmount_if_mounted(&actor.rootfs_dir())?;
        // Sidecars' rootfs overlays (whatever the template says now: a dir is all it takes).
        if let Ok(mut dirs) = tokio::fs::read_dir(actor.dir.join("containers")).await {
            while let Ok(Some(d)) = dirs.next_entry().await {
                unmount_if_mounted(&d.path().join("rootfs"))?;
            }
        }
        netns::delete(&actor.netns()).await?;
        remove_cgroups(&actor.short_id());
        Ok(())
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for RuncRuntime {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            can_restore_memory: self.criu.is_some(),
            can_keep_frozen: self.criu.is_some(),
            can_restore_lazily: self.lazy_pages,
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
            self.prepare(actor, spec, mode == RunMode::FreshRootfs, false)
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
        self.dump(actor, image_dir, false).await
    }

    async fn checkpoint_frozen(
        &self,
        actor: &ActorSandbox,
        image_dir: &Path,
    ) -> Result<CheckpointStats> {
        self.dump(actor, image_dir, true).await
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

/// Whether CRIU can keep its kernel-probe cache (`/run/criu.kdat`): it only does on a tmpfs,
/// either because `/run` is one (systemd hosts) or because the file was put on one
/// (`scripts/criu-kdat-cache.sh`).
fn criu_kdat_cache_possible() -> bool {
    let on_tmpfs = |p: &str| {
        nix::sys::statfs::statfs(p)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
    };
    on_tmpfs("/run") || on_tmpfs("/run/criu.kdat")
}

fn parse_criu_version(text: &str) -> Option<(u32, u32)> {
    let v = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))?
        .trim();
    let mut parts = v.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor = parts
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    Some((major, minor))
}

fn validate_spec(actor: &ActorSandbox, spec: &SandboxSpec) -> Result<()> {
    for s in &spec.sidecars {
        if sidecars::sidecar_args(s).is_empty() {
            return Err(SandboxError::Invalid(format!(
                "container {:?} has no command: template and image both leave it empty",
                s.name
            )));
        }
        if !ate_core::names::is_label(&s.name) || s.name == spec.name {
            return Err(SandboxError::Invalid(format!(
                "container name {:?}",
                s.name
            )));
        }
    }
    for p in std::iter::once(&actor.dir)
        .chain(std::iter::once(&spec.image.rootfs))
        .chain(spec.sidecars.iter().map(|s| &s.image.rootfs))
    {
        let s = p.to_string_lossy();
        // Overlay mount options are comma/colon separated: such paths cannot be expressed.
        if s.contains(',') || s.contains(':') || !p.is_absolute() {
            return Err(SandboxError::Invalid(format!(
                "path {s:?} must be absolute without ',' or ':'"
            )));
        }
    }
    let all_mounts = spec
        .mounts
        .iter()
        .chain(spec.sidecars.iter().flat_map(|s| s.mounts.iter()));
    for v in spec.volumes.iter().chain(all_mounts) {
        let ok_name =
            !v.name.is_empty() && !v.name.contains('/') && v.name != "." && v.name != "..";
        let mp = Path::new(&v.mount_path);
        let ok_path = mp.is_absolute()
            && mp
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir))
            && v.mount_path != "/"
            && !v.mount_path.starts_with("/etc/ate")
            && !v.mount_path.starts_with("/.ate");
        if !ok_name || !ok_path {
            return Err(SandboxError::Invalid(format!(
                "volume {:?} at {:?}",
                v.name, v.mount_path
            )));
        }
    }
    if spec.command.is_empty()
        && spec.image.config.entrypoint.is_empty()
        && spec.image.config.cmd.is_empty()
    {
        return Err(SandboxError::Invalid(
            "no command: template and image both leave it empty".to_string(),
        ));
    }
    Ok(())
}

/// Identity files are rewritten on every run and restore, in a host dir bind-mounted at
/// `/etc/ate` — so a restored golden snapshot reads the new actor's identity and the dump never
/// contains them. Written via rename so a reader never sees half a file.
async fn write_identity(actor: &ActorSandbox) -> Result<()> {
    let dir = actor.identity_dir();
    for (file, value) in [
        ("actor-name", &actor.name),
        ("atespace", &actor.atespace),
        ("uid", &actor.uid),
    ] {
        let tmp = dir.join(format!(".{file}.tmp"));
        let dst = dir.join(file);
        tokio::fs::write(&tmp, value.as_bytes())
            .await
            .ctx(|| format!("write {}", tmp.display()))?;
        tokio::fs::rename(&tmp, &dst)
            .await
            .ctx(|| format!("rename {}", dst.display()))?;
    }
    Ok(())
}

fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    nix::mount::mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::empty(),
        Some(opts.as_str()),
    )
    .ctx(|| format!("mount overlay at {} ({opts})", target.display()))
}

fn unmount_if_mounted(target: &Path) -> Result<()> {
    // Loop: an earlier crash may have stacked mounts on the same point.
    for _ in 0..8 {
        match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => {
                return Err(SandboxError::io(
                    format!("unmount {}", target.display()),
                    e.into(),
                ));
            }
        }
    }
    Ok(())
}

/// Detaches every mount at or below `dir`, deepest first. A CRIU restore that was ended in the
/// middle (its page source gave up) leaves its cgroup yard (a tmpfs with cgroup mounts, in the
/// restore's work dir) and runc's `criu-root` overlay mounted; nothing else mounts there.
fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        if let Err(e) = unmount_if_mounted(&p) {
            tracing::warn!(mount = %p.display(), error = %e, "leftover mount");
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(p: &str) -> String {
    let bytes = p.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `freezer.state` of the actor's cgroup in the v1 freezer hierarchy (hybrid hosts like these;
/// runc's "paused" is this file reading FROZEN), if it exists.
fn freezer_state_file(actor: &ActorSandbox) -> Option<PathBuf> {
    let path = Path::new("/sys/fs/cgroup/freezer")
        .join(CGROUP_PARENT)
        .join(actor.short_id())
        .join("freezer.state");
    path.is_file().then_some(path)
}

async fn read_freezer(path: &Path) -> Result<String> {
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
fn cpu_quota_us(spec: &SandboxSpec) -> Option<u64> {
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
async fn read_cpu_quota(actor: &ActorSandbox) -> Option<i64> {
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
fn kill_cgroup_processes(short_id: &str) {
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

/// Removes leftover actor cgroups in every hierarchy (runc delete normally does this; a crash
/// between dump and delete can leave empty ones).
fn remove_cgroups(short_id: &str) {
    for dir in actor_cgroups(short_id) {
        if let Err(e) = std::fs::remove_dir(&dir) {
            tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove actor cgroup");
        }
    }
}

/// Where runc writes the container init's host pid (`--pid-file`).
fn pid_file(actor: &ActorSandbox) -> PathBuf {
    actor.dir.join("init.pid")
}

async fn remove_file_if_exists(path: &Path) -> Result<()> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxError::io(format!("remove {}", path.display()), e)),
    }
}

async fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxError::io(format!("remove {}", dir.display()), e)),
    }
}

async fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .ctx(|| format!("list {}", dir.display()))?;
    while let Some(e) = entries
        .next_entry()
        .await
        .ctx(|| format!("list {}", dir.display()))?
    {
        let meta = e
            .metadata()
            .await
            .ctx(|| format!("stat {}", e.path().display()))?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
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
    let mut command = Command::new(program);
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

/// The OCI runtime config: runc's default mounts plus the actor's process, namespaces (network
/// by path), volumes, identity dir and limits; [`hardening::apply`] adds the security fields
/// (capabilities, no-new-privs, seccomp, masked/read-only paths, pids limit).
fn oci_config(actor: &ActorSandbox, spec: &SandboxSpec) -> Value {
    let args = process_args(spec);
    let env = build_env(spec);
    let cwd = if spec.image.config.working_dir.is_empty() {
        "/".to_string()
    } else {
        spec.image.config.working_dir.clone()
    };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        // No /sys/fs/cgroup mount (runc's default has one): workloads don't need it and it is
        // one more mount CRIU would have to carry.
        json!({"destination": "/etc/ate", "type": "bind", "source": actor.identity_dir(), "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}),
    ];
    for m in &spec.mounts {
        mounts.push(json!({"destination": m.mount_path, "type": "bind", "source": actor.volume_dir(&m.name), "options": ["rbind", "rw", "nosuid", "nodev"]}));
    }

    let mut resources = json!({"devices": [{"allow": false, "access": "rwm"}]});
    if spec.resources.memory_bytes > 0 {
        resources["memory"] = json!({"limit": spec.resources.memory_bytes});
    }
    if let Some(quota) = cpu_quota_us(spec) {
        resources["cpu"] = json!({"quota": quota, "period": CPU_PERIOD_US});
    }

    let mut config = json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": env,
            "cwd": cwd,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
        },
        "root": {"path": actor.rootfs_dir(), "readonly": false},
        "hostname": actor.name,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": format!("/{CGROUP_PARENT}/{}", actor.short_id()),
            "resources": resources,
            "namespaces": [
                {"type": "pid"},
                {"type": "network", "path": netns::netns_path(&actor.netns())},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"}
            ]
        }
    });
    hardening::apply(&mut config);
    if !spec.sidecars.is_empty() {
        sidecars::apply(&mut config, actor, spec);
    }
    config
}

/// The container's command line: the template's `command` when it has one, else the image's
/// Entrypoint followed by its Cmd.
pub(crate) fn process_args(spec: &SandboxSpec) -> Vec<String> {
    if spec.command.is_empty() {
        spec.image
            .config
            .entrypoint
            .iter()
            .chain(spec.image.config.cmd.iter())
            .cloned()
            .collect()
    } else {
        spec.command.clone()
    }
}

/// The status of a [`SandboxError::Command`] naming the container's own command when it could
/// not be executed (`` `/app/server` failed (exec failed): <reason> ``).
pub(crate) const EXEC_FAILED: &str = "exec failed";

/// The container command as shown in errors: its words joined by spaces, cut to 200 bytes.
pub(crate) fn render_args(args: &[String]) -> String {
    let line = args.join(" ");
    if line.len() <= 200 {
        return line;
    }
    let mut end = 200;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// The reason runc gave for not executing the container's command, from its output (`runc run`
/// checks the command before it starts the container: `…unable to start container process: exec:
/// "/app/nope": stat /app/nope: no such file or directory` → `stat /app/nope: no such file or
/// directory`). runc logs in logfmt, so the quotes inside `msg="…"` come escaped.
fn runc_exec_failure(output: &str) -> Option<String> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.contains("unable to start container process"))?;
    let text = line.replace("\\\"", "\"");
    let after = &text[text.rfind("exec: \"")? + "exec: \"".len()..];
    let (_name, reason) = after.split_once("\": ")?;
    let reason = reason.trim_end().trim_end_matches('"').trim();
    (!reason.is_empty()).then(|| reason.to_string())
}

/// A failed `runc run` whose output says the container's command could not be executed, in
/// terms of the template (`` `/app/nope` failed (exec failed): stat /app/nope: … ``) instead of
/// runc's command line and logfmt; any other error as it is.
fn exec_failure(e: SandboxError, spec: &SandboxSpec) -> SandboxError {
    if let SandboxError::Command { stderr, .. } = &e
        && let Some(reason) = runc_exec_failure(stderr)
    {
        return SandboxError::Command {
            command: render_args(&process_args(spec)),
            status: EXEC_FAILED.to_string(),
            stderr: reason,
        };
    }
    e
}

/// Image env, then template env (same name replaces), then `PORT` and `PATH` if still unset.
fn build_env(spec: &SandboxSpec) -> Vec<String> {
    merge_env(&spec.image.config.env, &spec.env, Some(spec.port))
}

/// `image_env` (`K=V`), then `template_env` (same name replaces), then `PORT` (when given) and
/// `PATH` if still unset.
pub(crate) fn merge_env(
    image_env: &[String],
    template_env: &[(String, String)],
    port: Option<u16>,
) -> Vec<String> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| {
        if let Some(slot) = env.iter_mut().find(|(n, _)| n == name) {
            slot.1 = value.to_string();
        } else {
            env.push((name.to_string(), value.to_string()));
        }
    };
    for kv in image_env {
        let (n, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
        set(n, v);
    }
    for (n, v) in template_env {
        set(n, v);
    }
    let mut out: Vec<String> = env.into_iter().map(|(n, v)| format!("{n}={v}")).collect();
    if let Some(port) = port
        && !out.iter().any(|e| e.starts_with("PORT="))
    {
        out.push(format!("PORT={port}"));
    }
    if !out.iter().any(|e| e.starts_with("PATH=")) {
        out.push(DEFAULT_PATH.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{ImageConfig, UnpackedImage};
    use ate_core::template::{Resources, Volume};

    fn spec() -> SandboxSpec {
        SandboxSpec {
            image: UnpackedImage {
                manifest_digest: "sha256:00".into(),
                rootfs: "/cache/x/rootfs".into(),
                config: ImageConfig {
                    entrypoint: vec!["/counter".into()],
                    cmd: vec![],
                    env: vec!["PATH=/bin".into(), "A=1".into()],
                    working_dir: String::new(),
                },
            },
            command: vec![],
            env: vec![("A".into(), "2".into())],
            port: 8080,
            volumes: vec![Volume {
                name: "data".into(),
                mount_path: "/data".into(),
            }],
            mounts: vec![Volume {
                name: "data".into(),
                mount_path: "/data".into(),
            }],
            resources: Resources {
                cpu_millis: 500,
                memory_bytes: 64 << 20,
            },
            name: "counter".into(),
            exit_policy: Default::default(),
            sidecars: vec![],
        }
    }

    #[test]
    fn env_merges_template_over_image() {
        assert_eq!(build_env(&spec()), vec!["PATH=/bin", "A=2", "PORT=8080"]);
    }

    #[test]
    fn config_has_netns_path_and_limits() {
        let actor = ActorSandbox::new("team", "c1", "u1", "/var/lib/ate/actors/c1");
        let c = oci_config(&actor, &spec());
        let ns = &c["linux"]["namespaces"][1];
        assert_eq!(ns["type"], "network");
        assert_eq!(ns["path"], format!("/var/run/netns/{}", actor.netns()));
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 64u64 << 20);
        assert_eq!(c["process"]["args"], json!(["/counter"]));
        assert_eq!(c["root"]["path"], "/var/lib/ate/actors/c1/rootfs");
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(c["linux"]["seccomp"], hardening::seccomp());
    }

    #[test]
    fn rejects_escaping_volumes() {
        let actor = ActorSandbox::new("team", "c1", "u1", "/x");
        let mut s = spec();
        s.volumes = vec![Volume {
            name: "../x".into(),
            mount_path: "/data".into(),
        }];
        assert!(validate_spec(&actor, &s).is_err());
        s.volumes = vec![Volume {
            name: "x".into(),
            mount_path: "/etc/ate".into(),
        }];
        assert!(validate_spec(&actor, &s).is_err());
        s.volumes = vec![Volume {
            name: "x".into(),
            mount_path: "data".into(),
        }];
        assert!(validate_spec(&actor, &s).is_err());
    }

    #[test]
    fn exec_failures_from_runc_output() {
        let line = |msg: &str| format!("time=\"2026-01-01T00:00:00Z\" level=error msg=\"{msg}\"");
        let cases = [
            (
                r#"runc run failed: unable to start container process: exec: \"/nope\": stat /nope: no such file or directory"#,
                "stat /nope: no such file or directory",
            ),
            (
                r#"runc run failed: unable to start container process: exec: \"/data\": permission denied"#,
                "permission denied",
            ),
            (
                r#"runc run failed: unable to start container process: error during container init: exec: \"nope\": executable file not found in $PATH"#,
                "executable file not found in $PATH",
            ),
        ];
        for (msg, reason) in cases {
            let out = format!("earlier output\n{}\n", line(msg));
            assert_eq!(runc_exec_failure(&out).as_deref(), Some(reason), "{msg}");
        }
        let mount = line(
            r#"runc run failed: unable to start container process: error during container init: error mounting \"/v\" to rootfs at \"/proc\": not of type proc"#,
        );
        assert_eq!(runc_exec_failure(&mount), None);
        assert_eq!(runc_exec_failure("exec: \"/x\": nope"), None);
    }

    #[test]
    fn the_image_command_is_used_without_a_template_command() {
        let mut s = spec();
        s.image.config.cmd = vec!["--flag".into()];
        assert_eq!(process_args(&s), vec!["/counter", "--flag"]);
        s.command = vec!["/other".into()];
        assert_eq!(process_args(&s), vec!["/other"]);
        let long = vec!["x".repeat(300)];
        assert!(render_args(&long).len() < 210);
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/é\\134x"), "/é\\x");
        assert_eq!(unescape_mount_path("/end\\04"), "/end\\04");
    }

    #[test]
    fn criu_versions() {
        assert_eq!(parse_criu_version("Version: 4.2.1\n"), Some((4, 2)));
        assert_eq!(parse_criu_version("Version: 3.17\nGitID: x"), Some((3, 17)));
        assert_eq!(parse_criu_version("nope"), None);
    }
}
