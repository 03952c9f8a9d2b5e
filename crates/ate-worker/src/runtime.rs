//! The sandbox runtime contract and the per-actor types every runtime shares.
//!
//! A runtime runs one actor's main container in its own network namespace, can dump it to a
//! directory of memory images and bring it back, and restarts it from its kept files for the
//! lower fidelities. `runc` + CRIU ([`crate::runc::RuncRuntime`]) is the only implementation on
//! these hosts; gVisor or a micro-VM runtime would implement the same trait.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ate_core::template::{ExitPolicy, Resources, TemplateSpec, Volume};

use crate::error::{Result, SandboxError};
use ate_image::UnpackedImage;

/// What a runtime can do on this worker (reported to the api at registration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// False when CRIU is missing or too old: no `memory:criu` is advertised, and the scheduler
    /// places no actor whose newest generation holds memory here.
    pub can_restore_memory: bool,
    /// `runc` for [`crate::runc::RuncRuntime`]; snapshots only restore on the class that wrote them.
    pub sandbox_class: String,
    /// [`SandboxRuntime::checkpoint_frozen`] and [`SandboxRuntime::thaw`] work.
    pub can_keep_frozen: bool,
    /// Memory can come back on demand ([`SandboxRuntime::restore_lazily`]).
    pub can_restore_lazily: bool,
    /// An eager memory restore reads the images through a stream: a sealed generation's
    /// memory images need not be opened before it (`sealed::Opening::Small`).
    pub can_stream_images: bool,
}

impl Capabilities {
    /// The restore capabilities (`ate_core::capability`) the worker advertises to the api, whose
    /// scheduler places an actor only on a worker offering everything its newest generation
    /// needs. This build restores a memory image in the user-namespace mode it was dumped in,
    /// whatever mode it runs new sandboxes in (`--userns`), so it offers both `userns:off` and
    /// `userns:on`; a worker of an older build offers only `userns:off`.
    pub fn advertised(&self) -> Vec<String> {
        use ate_core::capability::{MEMORY_CRIU, MEMORY_LAZY, USERNS_OFF, USERNS_ON};
        let mut caps = Vec::new();
        if self.can_restore_memory {
            caps.push(MEMORY_CRIU.to_string());
            if self.can_restore_lazily {
                caps.push(MEMORY_LAZY.to_string());
            }
        }
        caps.push(USERNS_OFF.to_string());
        caps.push(USERNS_ON.to_string());
        caps
    }
}

/// Where the worker attaches external volumes, one dir per sandbox (see
/// [`ActorSandbox::external_volumes_dir`]).
pub const EXTERNAL_VOLUMES_ROOT: &str = "/run/ate/external-volumes";

/// An actor's identity and its directory on the node. Everything a runtime names for the actor
/// (netns, container id, cgroup) derives from `atespace/name`, so `stop` works after a worker restart
/// with nothing but this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorSandbox {
    pub atespace: String,
    pub name: String,
    /// The actor's uid (written into `/etc/ate/uid`).
    pub uid: String,
    /// `<node dir>/actors/<...>`: holds `rootfs/` (overlay mount point), `upper/`, `work/`,
    /// `volumes/<name>/`, `etc-ate/`, `config.json`.
    pub dir: PathBuf,
    /// Container stdout + stderr, appended across runs and restores (default `<dir>/log`).
    pub log: PathBuf,
}

impl ActorSandbox {
    pub fn new(
        atespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
        dir: impl Into<PathBuf>,
    ) -> Self {
        let dir = dir.into();
        ActorSandbox {
            atespace: atespace.into(),
            name: name.into(),
            uid: uid.into(),
            log: dir.join("log"),
            dir,
        }
    }

    /// Keeps the log outside the actor's directory (which a checkpoint removes), so it follows the
    /// actor across suspends and workers.
    pub fn with_log_path(mut self, log: impl Into<PathBuf>) -> Self {
        self.log = log.into();
        self
    }

    /// 10 hex chars of the actor directory's path: stable for this actor on this worker (across
    /// worker restarts), distinct for the same actor on another worker or another system on the
    /// same host (two systems running `ns/a`, or an actor's frozen copy on one worker while it
    /// starts on another, never share a netns, container or cgroup name).
    pub fn short_id(&self) -> String {
        ate_netns::short_id(&self.dir.to_string_lossy())
    }

    /// Network namespace name (`ate-<short id>`), also used as container id.
    pub fn netns(&self) -> String {
        ate_netns::netns_name(&self.dir.to_string_lossy())
    }

    pub fn container_id(&self) -> String {
        self.netns()
    }

    /// Overlay mount point = the container's root. Must be the same path at dump and restore.
    pub fn rootfs_dir(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// The overlay upper dir: everything the actor wrote outside its volumes (ROOTFS fidelity).
    pub fn upper_dir(&self) -> PathBuf {
        self.dir.join("upper")
    }

    pub fn work_dir(&self) -> PathBuf {
        self.dir.join("work")
    }

    pub fn volumes_dir(&self) -> PathBuf {
        self.dir.join("volumes")
    }

    pub fn volume_dir(&self, volume: &str) -> PathBuf {
        self.volumes_dir().join(volume)
    }

    /// Where the worker attaches the actor's external volumes before runc runs (outside the
    /// actor dir, so nothing that removes the actor dir can reach into their data).
    pub fn external_volumes_dir(&self) -> PathBuf {
        Path::new(EXTERNAL_VOLUMES_ROOT).join(self.container_id())
    }

    /// What a container's mount of volume `name` binds: the attached external volume, or the
    /// actor's own volume dir.
    pub fn volume_source(&self, volumes: &[Volume], name: &str) -> PathBuf {
        if volumes
            .iter()
            .any(|v| v.name == name && v.external.is_some())
        {
            self.external_volumes_dir().join(name)
        } else {
            self.volume_dir(name)
        }
    }

    /// Host directory bind-mounted at `/etc/ate` (identity files).
    /// Upper, work and rootfs dirs of container `name` (an actor's second or later container).
    pub fn container_dir(&self, name: &str) -> PathBuf {
        self.dir.join("containers").join(name)
    }

    pub fn container_upper_dir(&self, name: &str) -> PathBuf {
        self.container_dir(name).join("upper")
    }

    pub fn container_rootfs_dir(&self, name: &str) -> PathBuf {
        self.container_dir(name).join("rootfs")
    }

    pub fn identity_dir(&self) -> PathBuf {
        self.dir.join("etc-ate")
    }

    /// Where a start's egress gate keeps its FIFOs (`ate_egress::gate`): the `createRuntime` hook
    /// waits there until the worker's egress for the sandbox is on.
    pub fn egress_gate_dir(&self) -> PathBuf {
        self.dir.join("egress-gate")
    }

    /// Container stdout + stderr, appended across runs and restores.
    pub fn log_path(&self) -> PathBuf {
        self.log.clone()
    }
}

/// What to run: the image, the process and its limits of the actor's first container, and its
/// other containers (sidecars) if it has any. One sandbox (one runc container, cgroup and netns)
/// holds them all; with sidecars its PID 1 is `ate-init` (see `init/main.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The first container's name (prefixes its log lines when there are sidecars).
    pub name: String,
    pub image: UnpackedImage,
    /// Replaces the image's Entrypoint + Cmd when not empty.
    pub command: Vec<String>,
    /// Added after the image's env; a name set here wins.
    pub env: Vec<(String, String)>,
    /// Exported as `PORT` unless `env` sets it.
    pub port: u16,
    /// The actor's volumes (each a directory of its own, kept in snapshots).
    pub volumes: Vec<Volume>,
    /// Where the first container mounts them (`name` = the volume): `volumes` unless the
    /// template gives the container its own `volumeMounts`.
    pub mounts: Vec<Volume>,
    pub resources: Resources,
    /// What the first container's exit does when there are sidecars (alone, it ends the actor).
    pub exit_policy: ExitPolicy,
    pub sidecars: Vec<SidecarSpec>,
}

/// An actor's second or later container: its own image and rootfs (chrooted into by
/// `ate-init`), the actor's netns, volumes and identity files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarSpec {
    pub name: String,
    pub image: UnpackedImage,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub exit_policy: ExitPolicy,
    /// Where this container mounts the actor's volumes (`name` = the volume).
    pub mounts: Vec<Volume>,
}

impl SandboxSpec {
    /// The spec for a template: its first container (the one requests reach) with `image`, and
    /// one sidecar per further container with `sidecar_images` (in template order).
    pub fn from_template(
        template: &TemplateSpec,
        image: UnpackedImage,
        sidecar_images: Vec<UnpackedImage>,
    ) -> Result<Self> {
        if sidecar_images.len() + 1 != template.containers.len() {
            return Err(SandboxError::Invalid(format!(
                "{} images for {} containers",
                sidecar_images.len() + 1,
                template.containers.len()
            )));
        }
        let sidecars = template
            .containers
            .iter()
            .skip(1)
            .zip(sidecar_images)
            .map(|(c, image)| SidecarSpec {
                name: c.name.clone(),
                image,
                command: c.command.clone(),
                env: c
                    .env
                    .iter()
                    .map(|e| (e.name.clone(), e.value.clone()))
                    .collect(),
                exit_policy: c.exit_policy,
                mounts: c.mounts(&template.volumes).to_vec(),
            })
            .collect();
        let container = template
            .containers
            .first()
            .ok_or_else(|| SandboxError::Invalid("template has no containers".to_string()))?;
        let port = container
            .wakeup_probe
            .as_ref()
            .map(|p| p.http_get.port)
            .unwrap_or(80)
            .try_into()
            .map_err(|_| SandboxError::Invalid("wakeup probe port out of range".to_string()))?;
        Ok(SandboxSpec {
            name: container.name.clone(),
            image,
            command: container.command.clone(),
            env: container
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
            port,
            volumes: template.volumes.clone(),
            mounts: container.mounts(&template.volumes).to_vec(),
            resources: template.resources,
            exit_policy: container.exit_policy,
            sidecars,
        })
    }
}

/// How `run` treats the actor's kept files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Cold boot or ROOTFS fidelity: keep the upper dir (if any) and the volumes.
    KeepRootfs,
    /// VOLUMES fidelity (or a template change): empty upper dir, volumes kept.
    FreshRootfs,
}

/// A started (or restored) sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub netns: String,
    pub container_id: String,
    /// Host pid of the container's init, when the runtime knows it.
    pub pid: Option<u32>,
    /// Wall time of the runtime command (`runc run -d` / `runc restore -d`), mounts included.
    pub elapsed: Duration,
}

/// Result of a memory checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Wall time of the dump command alone (the sandbox is frozen this long).
    pub dump: Duration,
    /// Total size of the image directory after the dump.
    pub image_bytes: u64,
}

/// Why an actor is no longer running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    /// `exited` (the init's status was collected), runtime status (`stopped`), or `missing`
    /// when the runtime has no such sandbox.
    pub status: String,
    /// The init's exit code (128 + signal number when killed by a signal), when known.
    pub code: Option<i32>,
}

/// A sandbox runtime. Calls for one actor are serialized by the implementation; calls for
/// different actors run concurrently.
#[async_trait::async_trait]
pub trait SandboxRuntime: Send + Sync {
    fn capabilities(&self) -> Capabilities;

    /// Starts the actor from its image (plus kept upper dir per `mode`) in a fresh netns.
    async fn run(&self, actor: &ActorSandbox, spec: &SandboxSpec, mode: RunMode)
    -> Result<Started>;

    /// Dumps the actor's processes into `image_dir` (created if missing) and stops the sandbox;
    /// the upper dir and volumes are left for the caller to archive.
    async fn checkpoint(&self, actor: &ActorSandbox, image_dir: &Path) -> Result<CheckpointStats>;

    /// Like [`checkpoint`](Self::checkpoint), but the sandbox is frozen first and stays frozen
    /// in place afterwards (processes, netns, mounts and files kept), so [`thaw`](Self::thaw)
    /// can bring back exactly the dumped state without a restore. The dump is the durable
    /// truth; the frozen sandbox is a cache of it that the worker may drop at any time.
    async fn checkpoint_frozen(
        &self,
        _actor: &ActorSandbox,
        image_dir: &Path,
    ) -> Result<CheckpointStats> {
        Err(SandboxError::Checkpoint {
            path: image_dir.to_path_buf(),
            message: "this runtime cannot keep a checkpointed sandbox frozen".to_string(),
        })
    }

    /// Whether lazy restores track what the restored tasks write, so that a later
    /// [`checkpoint_incremental`](Self::checkpoint_incremental) can leave unwritten pages to
    /// the generation they came from.
    fn tracks_memory(&self) -> bool {
        false
    }

    /// Like [`checkpoint_frozen`](Self::checkpoint_frozen) (or `checkpoint` without
    /// `keep_frozen`) of an actor restored lazily with tracking by `source`: the pages its tasks
    /// have not written since are left to the images at `parent` (relative to `image_dir`).
    /// The dump is whole when tracking does not hold; the returned
    /// [`Tracking`](crate::lazy::Tracking) says which it was.
    async fn checkpoint_incremental(
        &self,
        _actor: &ActorSandbox,
        image_dir: &Path,
        _parent: &Path,
        _source: &crate::lazy::PageSource,
        _keep_frozen: bool,
    ) -> Result<(CheckpointStats, crate::lazy::Tracking)> {
        Err(SandboxError::Checkpoint {
            path: image_dir.to_path_buf(),
            message: "this runtime cannot dump memory incrementally".to_string(),
        })
    }

    /// Write-protects again every page a frozen sandbox's processes wrote, after a dump that
    /// becomes the parent of its next one; returns the pages protected.
    async fn rearm_tracking(&self, _actor: &ActorSandbox) -> Result<u64> {
        Err(SandboxError::Unsupported(
            "this runtime does not track memory".to_string(),
        ))
    }

    /// Freezes a running sandbox in place (its files then hold still for archiving); undone by
    /// [`thaw`](Self::thaw).
    async fn freeze(&self, _actor: &ActorSandbox) -> Result<()> {
        Err(SandboxError::Unsupported(
            "this runtime cannot freeze a sandbox".to_string(),
        ))
    }

    /// Resumes a sandbox left frozen by [`checkpoint_frozen`](Self::checkpoint_frozen).
    async fn thaw(&self, _actor: &ActorSandbox) -> Result<()> {
        Err(SandboxError::Unsupported(
            "this runtime cannot thaw a frozen sandbox".to_string(),
        ))
    }

    /// Restores a dump from `image_dir` with the same rootfs path, a fresh netns and freshly
    /// written identity files (MEMORY fidelity).
    async fn restore(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        image_dir: &Path,
    ) -> Result<Started>;

    /// Like [`SandboxRuntime::restore`] from `generation_dir/criu`, but the memory pages are
    /// left to a page source (`page_source`: the command of `ate page-source`) that the
    /// returned handle watches: the actor runs once its state is restored and its pages arrive
    /// as it touches them. The handle must outlive the sandbox until it reports `Done`.
    async fn restore_lazily(
        &self,
        _actor: &ActorSandbox,
        _spec: &SandboxSpec,
        _generation_dir: &Path,
        _page_source: &[String],
    ) -> Result<(Started, crate::lazy::PageSource)> {
        Err(SandboxError::Unsupported(
            "this runtime restores memory only eagerly".to_string(),
        ))
    }

    /// Kills and removes everything the sandbox holds on the host except the actor's files.
    /// Idempotent: stopping a stopped or unknown actor is Ok.
    async fn stop(&self, actor: &ActorSandbox) -> Result<()>;

    /// Starts a command inside the running sandbox (`ate exec`), in its namespaces, cgroup and
    /// security settings; see [`crate::exec`].
    async fn exec(
        &self,
        _actor: &ActorSandbox,
        _spec: &crate::exec::ExecSpec,
    ) -> Result<crate::exec::Exec> {
        Err(SandboxError::Unsupported(
            "this runtime cannot run commands in a sandbox".to_string(),
        ))
    }

    /// `Some` once the actor's processes have all exited (or the sandbox is gone).
    async fn exited(&self, actor: &ActorSandbox) -> Result<Option<ExitInfo>>;

    /// Ends the commands (and what runs under them) an earlier process of this worker left
    /// running on its sandboxes, a restore or checkpoint cut off by its death; returns their
    /// command lines. A restarted worker calls it before it touches any sandbox.
    async fn end_earlier_commands(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether the actor's sandbox exists and runs (not paused, not stopped): one a restarted
    /// worker may re-adopt.
    async fn is_running(&self, _actor: &ActorSandbox) -> Result<bool> {
        Ok(false)
    }

    /// Waits (at most `timeout`) until the output of a sandbox whose processes all exited is
    /// in its log.
    async fn output_flushed(&self, _actor: &ActorSandbox, _timeout: std::time::Duration) {}

    /// Whether the actor's sandbox exists and is frozen (paused).
    async fn is_paused(&self, _actor: &ActorSandbox) -> Result<bool> {
        Ok(false)
    }

    /// What a dump cut short left inside the actor's processes, if anything: CRIU's parasite
    /// code still mapped in a task (CRIU killed while it ran there). Such a task cannot be
    /// trusted to run on: the parasite's threads end on a trap that kills the process, and its
    /// mapping would be in every later dump.
    async fn dump_remnants(&self, _actor: &ActorSandbox) -> Option<String> {
        None
    }
}
