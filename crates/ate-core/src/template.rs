//! The ActorTemplate: its YAML/JSON document form (shaped like a Kubernetes custom resource, so the
//! same file works with `kubectl apply` later) and the validated internal [`TemplateSpec`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::names::{ValidationError, parse_namespaced, validate_label};
use crate::state::Fidelity;

/// `apiVersion` of every document.
pub const API_VERSION: &str = "ate.dev/v1alpha1";
/// Sandbox class of the runc + CRIU runtime (the default).
pub const DEFAULT_SANDBOX_CLASS: &str = "runc";
const DEFAULT_CPU_MILLIS: u32 = 250;
const DEFAULT_MEMORY_BYTES: u64 = 128 << 20;
const DEFAULT_PROBE_TIMEOUT_SECONDS: u32 = 30;
/// Containers per actor: one sandbox holds them all (one cgroup, netns and snapshot).
const MAX_CONTAINERS: usize = 8;
const MAX_IDLE_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;
/// The kernel's limit on one argument or environment string, its NUL included
/// (`MAX_ARG_STRLEN`, 32 pages): `execve` fails with E2BIG on a longer one, so the actor could
/// never start.
pub const MAX_ARG_STRLEN: usize = 128 * 1024;
/// Bound on a container's `command` plus `env` as `execve` counts them (each string with its
/// NUL, plus one pointer per string). The kernel allows a quarter of the stack limit (2 MiB under
/// the usual 8 MiB); the rest is left for the image's own environment and `PORT`/`PATH`, which
/// the worker adds.
pub const MAX_EXEC_BYTES: usize = 1 << 20;
/// The smallest CPU limit: the quota is `cpu × 100 ms` per 100 ms period and the kernel refuses
/// a CFS quota under 1 ms (`cpu.cfs_quota_us` EINVAL), so `runc run` would fail.
const MIN_CPU_MILLIS: u32 = 10;
/// Where the worker bind-mounts the actor's identity files; it refuses any volume whose mount
/// path begins with this string.
const IDENTITY_DIR: &str = "/etc/ate";

// ---------------------------------------------------------------- document form

/// One document of `ate apply -f`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum Document {
    ActorTemplate(Box<TemplateDocument>),
    Atespace(AtespaceDocument),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AtespaceDocument {
    pub api_version: String,
    pub metadata: Metadata,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateDocument {
    pub api_version: String,
    pub metadata: Metadata,
    pub spec: SpecDocument,
}

/// A number or a string in YAML (`cpu: 1` and `cpu: "500m"` are both valid).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    Int(u64),
    Float(f64),
    Text(String),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Text(s) => s.trim().to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_class: Option<String>,
    #[serde(default)]
    pub containers: Vec<ContainerDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesDocument>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<SnapshotsDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Scalar>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub worker_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden_tag: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerDocument {
    pub name: String,
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeup_probe: Option<WakeupProbeDocument>,
    /// Ports the container listens on. The containers of an actor share its network namespace,
    /// so no two may declare the same port (checked at apply).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortDocument>,
    /// `stop` (default): the container's exit ends the actor; `ignore`: the exit is logged and
    /// the other containers keep running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_policy: Option<String>,
    /// What this container needs; the actor's limits (`spec.resources`, one cgroup for all its
    /// containers) default to the sum over its containers and must cover it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesDocument>,
    /// Which of `spec.volumes` this container mounts, and where. Absent: every volume at its
    /// `spec.volumes[].mountPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<Volume>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortDocument {
    pub container_port: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only `TCP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WakeupProbeDocument {
    pub http_get: HttpGet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Scalar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Scalar>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotsDocument {
    pub fidelity: String,
    /// `lazy` (default) or `eager`: how a MEMORY generation's pages come back on a restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_restore: Option<String>,
}

/// How a restore brings back an actor's memory (`spec.snapshots.memoryRestore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MemoryRestore {
    /// The actor runs as soon as its state is restored; pages arrive as it touches them (each
    /// chunk checked against the manifest), the rest in the background. Resume time does not
    /// grow with the actor's size.
    #[default]
    Lazy,
    /// Every page is read and checked before the actor gets ingress: no page fault ever waits
    /// on the snapshot, at the cost of a resume time that grows with memory size.
    Eager,
}

impl MemoryRestore {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "lazy" => Some(MemoryRestore::Lazy),
            "eager" => Some(MemoryRestore::Eager),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MemoryRestore::Lazy => "lazy",
            MemoryRestore::Eager => "eager",
        }
    }
}

// ---------------------------------------------------------------- validated form

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpGet {
    pub path: String,
    pub port: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeupProbe {
    pub http_get: HttpGet,
    pub timeout_seconds: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<EnvVar>,
    pub wakeup_probe: Option<WakeupProbe>,
    /// Declared TCP ports (records stored before ports existed read as none).
    #[serde(default)]
    pub ports: Vec<u32>,
    #[serde(default)]
    pub exit_policy: ExitPolicy,
    /// `(volume, mountPath)` pairs; None: every volume of the template at its own mountPath.
    #[serde(default)]
    pub volume_mounts: Option<Vec<Volume>>,
}

/// What the exit of one of an actor's containers does (`spec.containers[].exitPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExitPolicy {
    /// The actor ends (its other containers are stopped), reported like a single container's
    /// exit: the actor's `lastError` names the container.
    #[default]
    Stop,
    /// The exit is logged (`[ate-init] container "x" exited …`) and the actor keeps running.
    Ignore,
}

impl ExitPolicy {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "stop" => Some(ExitPolicy::Stop),
            "ignore" => Some(ExitPolicy::Ignore),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExitPolicy::Stop => "stop",
            ExitPolicy::Ignore => "ignore",
        }
    }
}

impl Container {
    /// The volumes this container mounts (`name` = the volume, `mount_path` = where).
    pub fn mounts<'a>(&'a self, volumes: &'a [Volume]) -> &'a [Volume] {
        self.volume_mounts.as_deref().unwrap_or(volumes)
    }

    /// The port the wakeup probe (or, without one, the TCP check) uses: also the port requests
    /// reach when this is the actor's first container.
    pub fn probe_port(&self) -> u32 {
        self.wakeup_probe.as_ref().map_or(80, |p| p.http_get.port)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_millis: u32,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    pub mount_path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressPolicy {
    /// `allow-all` (default) or `deny-all`.
    #[serde(default = "allow_all")]
    pub default_action: String,
    /// `host:port` entries reachable under `deny-all`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

fn allow_all() -> String {
    "allow-all".to_string()
}

/// A validated template spec: what the store keeps and what the node runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateSpec {
    pub sandbox_class: String,
    pub containers: Vec<Container>,
    pub resources: Resources,
    pub volumes: Vec<Volume>,
    pub fidelity: Fidelity,
    /// How MEMORY restores bring pages back (records stored before it existed read as lazy).
    #[serde(default)]
    pub memory_restore: MemoryRestore,
    /// 0 = never suspend automatically.
    pub idle_timeout_seconds: u32,
    pub worker_selector: BTreeMap<String, String>,
    pub egress: EgressPolicy,
    /// `<atespace>/<tag>` whose snapshot seeds new actors.
    pub golden_tag: Option<String>,
}

impl TemplateSpec {
    /// Validates a document's spec and fills defaults. Errors name the field (`spec.containers[0].image`).
    pub fn from_document(doc: &SpecDocument) -> Result<Self, ValidationError> {
        let resources = doc.resources.clone().unwrap_or_default();
        let (wanted_cpu, wanted_memory) = container_resources(&doc.containers)?;
        let cpu_millis = match &resources.cpu {
            Some(q) => parse_cpu("spec.resources.cpu", &q.text())?,
            None => wanted_cpu.unwrap_or(DEFAULT_CPU_MILLIS),
        };
        let memory_bytes = match &resources.memory {
            Some(q) => parse_memory("spec.resources.memory", &q.text())?,
            None => wanted_memory.unwrap_or(DEFAULT_MEMORY_BYTES),
        };
        if let Some(cpu) = wanted_cpu.filter(|c| *c > cpu_millis) {
            return Err(ValidationError::new(
                "spec.resources.cpu",
                format!(
                    "{} is less than the {} its containers ask for together",
                    format_cpu(cpu_millis),
                    format_cpu(cpu)
                ),
            ));
        }
        if let Some(memory) = wanted_memory.filter(|m| *m > memory_bytes) {
            return Err(ValidationError::new(
                "spec.resources.memory",
                format!(
                    "{} is less than the {} its containers ask for together",
                    format_memory(memory_bytes),
                    format_memory(memory)
                ),
            ));
        }
        let fidelity = match &doc.snapshots {
            Some(s) => Fidelity::parse_any(&s.fidelity).ok_or_else(|| {
                ValidationError::new(
                    "spec.snapshots.fidelity",
                    format!("{:?} is not one of memory, rootfs, volumes", s.fidelity),
                )
            })?,
            None => Fidelity::Memory,
        };
        let memory_restore = match doc
            .snapshots
            .as_ref()
            .and_then(|s| s.memory_restore.as_deref())
        {
            None => MemoryRestore::Lazy,
            Some(text) => MemoryRestore::parse(text).ok_or_else(|| {
                ValidationError::new(
                    "spec.snapshots.memoryRestore",
                    format!("{text:?} is not one of lazy, eager"),
                )
            })?,
        };
        let idle_timeout_seconds = match &doc.idle_timeout {
            Some(d) => parse_duration_seconds("spec.idleTimeout", &d.text())?,
            None => 0,
        };
        let mut containers = Vec::with_capacity(doc.containers.len());
        for (i, c) in doc.containers.iter().enumerate() {
            let f = format!("spec.containers[{i}]");
            let exit_policy = match c.exit_policy.as_deref() {
                None => ExitPolicy::Stop,
                Some(text) => ExitPolicy::parse(text).ok_or_else(|| {
                    ValidationError::new(
                        format!("{f}.exitPolicy"),
                        format!("{text:?} is not one of stop, ignore"),
                    )
                })?,
            };
            for (j, p) in c.ports.iter().enumerate() {
                if let Some(proto) = p.protocol.as_deref().filter(|p| *p != "TCP") {
                    return Err(ValidationError::new(
                        format!("{f}.ports[{j}].protocol"),
                        format!("{proto:?}: only TCP ports are served"),
                    ));
                }
            }
            containers.push(Container {
                name: c.name.clone(),
                image: c.image.clone(),
                command: c.command.clone(),
                env: c.env.clone(),
                wakeup_probe: c.wakeup_probe.as_ref().map(|p| WakeupProbe {
                    http_get: p.http_get.clone(),
                    timeout_seconds: p.timeout_seconds.unwrap_or(DEFAULT_PROBE_TIMEOUT_SECONDS),
                }),
                ports: c.ports.iter().map(|p| p.container_port).collect(),
                exit_policy,
                volume_mounts: c.volume_mounts.clone(),
            });
        }
        let spec = TemplateSpec {
            sandbox_class: doc
                .sandbox_class
                .clone()
                .unwrap_or_else(|| DEFAULT_SANDBOX_CLASS.to_string()),
            containers,
            resources: Resources {
                cpu_millis,
                memory_bytes,
            },
            volumes: doc.volumes.clone(),
            fidelity,
            memory_restore,
            idle_timeout_seconds,
            worker_selector: doc.worker_selector.clone(),
            egress: doc.egress.clone().unwrap_or_else(|| EgressPolicy {
                default_action: allow_all(),
                allow: vec![],
            }),
            golden_tag: doc.golden_tag.clone().filter(|t| !t.is_empty()),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The document form (for `-o yaml` and round trips).
    pub fn to_document(&self) -> SpecDocument {
        SpecDocument {
            sandbox_class: Some(self.sandbox_class.clone()),
            containers: self
                .containers
                .iter()
                .map(|c| ContainerDocument {
                    name: c.name.clone(),
                    image: c.image.clone(),
                    command: c.command.clone(),
                    env: c.env.clone(),
                    wakeup_probe: c.wakeup_probe.as_ref().map(|p| WakeupProbeDocument {
                        http_get: p.http_get.clone(),
                        timeout_seconds: Some(p.timeout_seconds),
                    }),
                    ports: c
                        .ports
                        .iter()
                        .map(|p| PortDocument {
                            container_port: *p,
                            name: None,
                            protocol: None,
                        })
                        .collect(),
                    exit_policy: (c.exit_policy != ExitPolicy::Stop)
                        .then(|| c.exit_policy.as_str().to_string()),
                    resources: None,
                    volume_mounts: c.volume_mounts.clone(),
                })
                .collect(),
            resources: Some(ResourcesDocument {
                cpu: Some(Scalar::Text(format_cpu(self.resources.cpu_millis))),
                memory: Some(Scalar::Text(format_memory(self.resources.memory_bytes))),
            }),
            volumes: self.volumes.clone(),
            snapshots: Some(SnapshotsDocument {
                fidelity: self.fidelity.short().to_string(),
                // Only when it is not the default, so documents read as they were written.
                memory_restore: (self.memory_restore != MemoryRestore::Lazy)
                    .then(|| self.memory_restore.as_str().to_string()),
            }),
            idle_timeout: (self.idle_timeout_seconds > 0)
                .then(|| Scalar::Text(format!("{}s", self.idle_timeout_seconds))),
            worker_selector: self.worker_selector.clone(),
            egress: Some(self.egress.clone()),
            golden_tag: self.golden_tag.clone(),
        }
    }

    /// Checks every field; the first problem is returned with its field path.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_label("spec.sandboxClass", &self.sandbox_class)?;
        if self.containers.is_empty() {
            return Err(ValidationError::new(
                "spec.containers",
                "at least one container is required",
            ));
        }
        if self.containers.len() > MAX_CONTAINERS {
            return Err(ValidationError::new(
                "spec.containers",
                format!(
                    "{} containers given; an actor has at most {MAX_CONTAINERS}",
                    self.containers.len()
                ),
            ));
        }
        let mut names = BTreeSet::new();
        for (i, c) in self.containers.iter().enumerate() {
            let f = format!("spec.containers[{i}]");
            validate_label(&format!("{f}.name"), &c.name)?;
            if !names.insert(c.name.as_str()) {
                return Err(ValidationError::new(
                    format!("{f}.name"),
                    format!("duplicate container name {:?}", c.name),
                ));
            }
            validate_image(&format!("{f}.image"), &c.image)?;
            for (j, arg) in c.command.iter().enumerate() {
                if arg.contains('\0') {
                    return Err(ValidationError::new(
                        format!("{f}.command[{j}]"),
                        "contains a NUL byte",
                    ));
                }
                if arg.len() + 1 > MAX_ARG_STRLEN {
                    return Err(ValidationError::new(
                        format!("{f}.command[{j}]"),
                        format!(
                            "is {} bytes; the kernel refuses an argument over {} bytes \
                             (MAX_ARG_STRLEN), so the container could not start",
                            arg.len(),
                            MAX_ARG_STRLEN - 1
                        ),
                    ));
                }
            }
            if c.command.first().is_some_and(|a| a.is_empty()) {
                return Err(ValidationError::new(
                    format!("{f}.command[0]"),
                    "must not be empty",
                ));
            }
            let mut env_names = BTreeSet::new();
            for (j, e) in c.env.iter().enumerate() {
                if !is_env_name(&e.name) {
                    return Err(ValidationError::new(
                        format!("{f}.env[{j}].name"),
                        format!("{:?} is not a valid environment variable name", e.name),
                    ));
                }
                if e.value.contains('\0') {
                    return Err(ValidationError::new(
                        format!("{f}.env[{j}].value"),
                        "contains a NUL byte",
                    ));
                }
                // The process sees `NAME=value`: that string, with its NUL, is what the kernel limits.
                let entry = e.name.len() + 1 + e.value.len();
                if entry + 1 > MAX_ARG_STRLEN {
                    return Err(ValidationError::new(
                        format!("{f}.env[{j}].value"),
                        format!(
                            "{}=<{} bytes> is {entry} bytes; the kernel refuses an environment \
                             string over {} bytes (MAX_ARG_STRLEN), so the container could not start",
                            e.name,
                            e.value.len(),
                            MAX_ARG_STRLEN - 1
                        ),
                    ));
                }
                if !env_names.insert(e.name.as_str()) {
                    return Err(ValidationError::new(
                        format!("{f}.env[{j}].name"),
                        format!("duplicate variable {:?}", e.name),
                    ));
                }
            }
            let exec_bytes = exec_bytes(c);
            if exec_bytes > MAX_EXEC_BYTES {
                return Err(ValidationError::new(
                    f.clone(),
                    format!(
                        "command and env take {exec_bytes} bytes of execve's argument space \
                         (each string with its NUL and a pointer); the limit is {MAX_EXEC_BYTES} \
                         (1 MiB), leaving the rest of the kernel's 2 MiB for the image's own env"
                    ),
                ));
            }
            if let Some(p) = &c.wakeup_probe {
                let pf = format!("{f}.wakeupProbe");
                if !p.http_get.path.starts_with('/')
                    || p.http_get
                        .path
                        .chars()
                        .any(|ch| ch.is_whitespace() || ch.is_control())
                {
                    return Err(ValidationError::new(
                        format!("{pf}.httpGet.path"),
                        format!("{:?} must be an absolute URL path", p.http_get.path),
                    ));
                }
                if p.http_get.port == 0 || p.http_get.port > 65535 {
                    return Err(ValidationError::new(
                        format!("{pf}.httpGet.port"),
                        format!("{} is not a port (1-65535)", p.http_get.port),
                    ));
                }
                if p.timeout_seconds == 0 || p.timeout_seconds > 600 {
                    return Err(ValidationError::new(
                        format!("{pf}.timeoutSeconds"),
                        "must be between 1 and 600",
                    ));
                }
            }
        }
        validate_ports(&self.containers)?;
        if self.resources.cpu_millis < MIN_CPU_MILLIS || self.resources.cpu_millis > 64_000 {
            return Err(ValidationError::new(
                "spec.resources.cpu",
                format!(
                    "{} must be between {MIN_CPU_MILLIS}m and 64 (the kernel refuses a CPU quota \
                     under 1 ms per 100 ms)",
                    format_cpu(self.resources.cpu_millis)
                ),
            ));
        }
        if self.resources.memory_bytes < (4 << 20) || self.resources.memory_bytes > (1 << 40) {
            return Err(ValidationError::new(
                "spec.resources.memory",
                "must be between 4Mi and 1Ti",
            ));
        }
        let mut vol_names = BTreeSet::new();
        let mut vol_paths = BTreeSet::new();
        for (i, v) in self.volumes.iter().enumerate() {
            let f = format!("spec.volumes[{i}]");
            validate_label(&format!("{f}.name"), &v.name)?;
            if !vol_names.insert(v.name.as_str()) {
                return Err(ValidationError::new(
                    format!("{f}.name"),
                    format!("duplicate volume name {:?}", v.name),
                ));
            }
            let p = &v.mount_path;
            check_mount_path(&format!("{f}.mountPath"), p)?;
            if !vol_paths.insert(p.trim_end_matches('/')) {
                return Err(ValidationError::new(
                    format!("{f}.mountPath"),
                    format!("{p:?} is mounted twice"),
                ));
            }
        }
        for (i, c) in self.containers.iter().enumerate() {
            let Some(mounts) = &c.volume_mounts else {
                continue;
            };
            let mut paths = BTreeSet::new();
            for (j, m) in mounts.iter().enumerate() {
                let f = format!("spec.containers[{i}].volumeMounts[{j}]");
                if !vol_names.contains(m.name.as_str()) {
                    return Err(ValidationError::new(
                        format!("{f}.name"),
                        format!("no volume {:?} in spec.volumes", m.name),
                    ));
                }
                check_mount_path(&format!("{f}.mountPath"), &m.mount_path)?;
                if !paths.insert(m.mount_path.trim_end_matches('/')) {
                    return Err(ValidationError::new(
                        format!("{f}.mountPath"),
                        format!("{:?} is mounted twice", m.mount_path),
                    ));
                }
            }
        }
        if u64::from(self.idle_timeout_seconds) > MAX_IDLE_TIMEOUT_SECONDS {
            return Err(ValidationError::new(
                "spec.idleTimeout",
                "must be at most 7 days",
            ));
        }
        crate::selector::validate("spec.workerSelector", &self.worker_selector)?;
        match self.egress.default_action.as_str() {
            "allow-all" | "deny-all" => {}
            other => {
                return Err(ValidationError::new(
                    "spec.egress.defaultAction",
                    format!("{other:?} is not allow-all or deny-all"),
                ));
            }
        }
        for (i, a) in self.egress.allow.iter().enumerate() {
            let ok = a.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty()
                    && host.len() <= 253
                    && port.parse::<u16>().is_ok_and(|p| p > 0)
                    && !host.contains(char::is_whitespace)
            });
            if !ok {
                return Err(ValidationError::new(
                    format!("spec.egress.allow[{i}]"),
                    format!("{a:?} is not host:port"),
                ));
            }
        }
        if let Some(tag) = &self.golden_tag {
            parse_namespaced("spec.goldenTag", tag)?;
        }
        Ok(())
    }
}

/// What `execve` counts for the container's command and env: each string with its NUL and one
/// pointer per string. The image's entrypoint and env are not known here.
fn exec_bytes(c: &Container) -> usize {
    const POINTER: usize = 8;
    let args: usize = c.command.iter().map(|a| a.len() + 1 + POINTER).sum();
    let env: usize = c
        .env
        .iter()
        .map(|e| e.name.len() + 1 + e.value.len() + 1 + POINTER)
        .sum();
    args + env
}

/// Why a volume cannot be mounted at `path` (already absolute, without `.`/`..` parts), when the
/// start would fail: runc refuses mounts on or inside `/proc` and fails on `/dev` itself and on
/// the device nodes it sets up afterwards; the worker refuses `/etc/ate…`.
fn reserved_mount_path(path: &str) -> Option<String> {
    let p = path.trim_end_matches('/');
    let at_or_under = |dir: &str| p == dir || p.starts_with(&format!("{dir}/"));
    if at_or_under("/proc") {
        return Some(
            "/proc is the container's procfs; runc refuses a mount on or inside it".to_string(),
        );
    }
    if matches!(p, "/dev" | "/dev/null" | "/dev/ptmx") {
        return Some(format!(
            "{p} is set up by runc (a tmpfs /dev with its device nodes); a volume there makes \
             the container fail to start (other paths under /dev, like /dev/shm, work)"
        ));
    }
    if at_or_under("/.ate") {
        return Some(
            "/.ate holds the init of actors with several containers and their roots".to_string(),
        );
    }
    if p.starts_with(IDENTITY_DIR) {
        return Some(format!(
            "{IDENTITY_DIR} holds the actor's identity files (a read-only mount); workers refuse \
             any mount path beginning with {IDENTITY_DIR}"
        ));
    }
    None
}

fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Accepts `oci-layout:<dir>[:<tag>]` and registry references (`[host/]repo[:tag][@sha256:<hex>]`).
/// A volume's mount path: absolute, not `/`, without `.`/`..` parts, not a reserved place.
fn check_mount_path(field: &str, p: &str) -> Result<(), ValidationError> {
    if !p.starts_with('/')
        || p == "/"
        || p.split('/').any(|s| s == ".." || s == ".")
        || p.contains('\0')
        || p.len() > 4096
    {
        return Err(ValidationError::new(
            field,
            format!("{p:?} must be an absolute path other than / without . or .. parts"),
        ));
    }
    if let Some(why) = reserved_mount_path(p) {
        return Err(ValidationError::new(field, format!("{p:?}: {why}")));
    }
    Ok(())
}

/// Each container's declared ports and probe port: valid, and not used by another container
/// (the containers share one network namespace, so two listeners on one port cannot both work).
fn validate_ports(containers: &[Container]) -> Result<(), ValidationError> {
    let mut owners: BTreeMap<u32, &str> = BTreeMap::new();
    for (i, c) in containers.iter().enumerate() {
        let mut own = BTreeSet::new();
        for (j, port) in c.ports.iter().enumerate() {
            let field = format!("spec.containers[{i}].ports[{j}].containerPort");
            if *port == 0 || *port > 65535 {
                return Err(ValidationError::new(
                    field,
                    format!("{port} is not a port (1-65535)"),
                ));
            }
            if !own.insert(*port) {
                return Err(ValidationError::new(
                    field,
                    format!("port {port} is listed twice"),
                ));
            }
        }
        if let Some(p) = &c.wakeup_probe {
            own.insert(p.http_get.port);
        }
        for port in own {
            if let Some(other) = owners.insert(port, c.name.as_str()) {
                let field = match c.ports.iter().position(|p| *p == port) {
                    Some(j) => format!("spec.containers[{i}].ports[{j}].containerPort"),
                    None => format!("spec.containers[{i}].wakeupProbe.httpGet.port"),
                };
                return Err(ValidationError::new(
                    field,
                    format!(
                        "port {port} is already used by container {other:?} (an actor's \
                         containers share one network namespace)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The sum of what the containers ask for (`spec.containers[].resources`); None for a
/// dimension no container gives.
fn container_resources(
    containers: &[ContainerDocument],
) -> Result<(Option<u32>, Option<u64>), ValidationError> {
    let mut cpu: Option<u32> = None;
    let mut memory: Option<u64> = None;
    for (i, c) in containers.iter().enumerate() {
        let Some(r) = &c.resources else { continue };
        if let Some(q) = &r.cpu {
            let m = parse_cpu(&format!("spec.containers[{i}].resources.cpu"), &q.text())?;
            cpu = Some(cpu.unwrap_or(0).saturating_add(m));
        }
        if let Some(q) = &r.memory {
            let b = parse_memory(&format!("spec.containers[{i}].resources.memory"), &q.text())?;
            memory = Some(memory.unwrap_or(0).saturating_add(b));
        }
    }
    Ok((cpu, memory))
}

pub fn validate_image(field: &str, image: &str) -> Result<(), ValidationError> {
    if image.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if image.len() > 1024 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("{image:?} is not an image reference"),
        ));
    }
    if let Some(rest) = image.strip_prefix("oci-layout:") {
        if !rest.starts_with('/') {
            return Err(ValidationError::new(
                field,
                format!("{image:?}: oci-layout needs an absolute directory"),
            ));
        }
        return Ok(());
    }
    let bad = |why: &str| {
        ValidationError::new(
            field,
            format!(
                "{image:?} is not an image reference ({why}); use host[:port]/repo[:tag], \
                 host[:port]/repo@sha256:<hex> or oci-layout:/dir[:tag]"
            ),
        )
    };
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(ValidationError::new(
                field,
                format!("{image:?} has a malformed sha256 digest"),
            ));
        }
    }
    let ok_chars = name_tag
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._/:".contains(&b));
    if name_tag.is_empty() || !ok_chars {
        return Err(bad("lower-case letters, digits and -._/: only"));
    }
    // The grammar the workers' registry client parses (distribution's reference regexp), so a
    // reference that passes here is never refused at pull time for its form. A ':' after the
    // last '/' starts the tag; otherwise it is a registry port.
    let (name, tag) = match name_tag.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (name_tag, None),
    };
    if let Some(t) = tag {
        let first_ok = t
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !first_ok || t.len() > 128 {
            return Err(bad(
                "a tag is 1-128 of [a-z0-9_.-], not starting with '.' or '-'",
            ));
        }
    }
    let parts: Vec<&str> = name.split('/').collect();
    let path_ok = |from: usize| parts[from..].iter().all(|c| is_path_component(c));
    let with_registry = parts.len() > 1 && is_registry(parts[0]) && path_ok(1);
    if !with_registry && !path_ok(0) {
        return Err(bad(
            "repository parts are [a-z0-9] runs joined by '.', '_', '__' or dashes; \
             a registry is host[:port]",
        ));
    }
    // The repository without its registry, as the registry client splits it (`busybox` is
    // `docker.io/library/busybox`), is limited to 255 characters.
    let explicit_registry =
        parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost");
    let repository_len = match (explicit_registry, parts.len()) {
        (true, _) => name.len() - parts[0].len() - 1,
        (false, 1) => "library/".len() + name.len(),
        (false, _) => name.len(),
    };
    if repository_len > 255 {
        return Err(bad("the repository name is longer than 255 characters"));
    }
    Ok(())
}

/// `[a-z0-9]+` runs joined by one separator each: `.`, `_`, `__` or any number of `-`.
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `host[:port]`: dot-separated labels of letters, digits and inner dashes, then digits.
fn is_registry(c: &str) -> bool {
    let (host, port) = match c.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (c, None),
    };
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
    };
    host.split('.').all(label_ok)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

/// `500m`, `1`, `0.5`, `2` → millicores.
pub fn parse_cpu(field: &str, text: &str) -> Result<u32, ValidationError> {
    let bad = || {
        ValidationError::new(
            field,
            format!("{text:?} is not a CPU quantity (e.g. 500m, 1, 0.5)"),
        )
    };
    let millis = if let Some(m) = text.strip_suffix('m') {
        m.parse::<u64>().map_err(|_| bad())?
    } else {
        let v: f64 = text.parse().map_err(|_| bad())?;
        if !v.is_finite() || !(0.0..=1e6).contains(&v) {
            return Err(bad());
        }
        (v * 1000.0).round() as u64
    };
    u32::try_from(millis).map_err(|_| bad())
}

/// `64Mi`, `1Gi`, `128M`, `1048576` → bytes.
pub fn parse_memory(field: &str, text: &str) -> Result<u64, ValidationError> {
    let bad = || {
        ValidationError::new(
            field,
            format!("{text:?} is not a memory quantity (e.g. 64Mi, 1Gi)"),
        )
    };
    const UNITS: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (num, mult) = UNITS
        .iter()
        .find_map(|(u, m)| text.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((text, 1));
    let n: u64 = num.parse().map_err(|_| bad())?;
    n.checked_mul(mult).ok_or_else(bad)
}

/// `30s`, `5m`, `1h`, `90` (seconds), `0` → seconds.
pub fn parse_duration_seconds(field: &str, text: &str) -> Result<u32, ValidationError> {
    let bad = || {
        ValidationError::new(
            field,
            format!("{text:?} is not a duration (e.g. 30s, 5m, 1h)"),
        )
    };
    let (num, mult) = match text.char_indices().last() {
        Some((i, 's')) => (&text[..i], 1),
        Some((i, 'm')) => (&text[..i], 60),
        Some((i, 'h')) => (&text[..i], 3600),
        _ => (text, 1),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = n.checked_mul(mult).ok_or_else(bad)?;
    u32::try_from(secs).map_err(|_| bad())
}

pub fn format_cpu(millis: u32) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

pub fn format_memory(bytes: u64) -> String {
    for (u, m) in [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes >= m && bytes.is_multiple_of(m) {
            return format!("{}{u}", bytes / m);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: &str = r#"
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata:
  namespace: ate-demo
  name: counter
spec:
  containers:
    - name: counter
      image: oci-layout:/var/lib/ate/images/counter:latest
      command: ["/counter"]
      env:
        - name: PORT
          value: "80"
      wakeupProbe:
        httpGet: {path: /healthz, port: 80}
        timeoutSeconds: 10
  resources: {cpu: 250m, memory: 64Mi}
  volumes:
    - name: data
      mountPath: /data
  snapshots: {fidelity: memory}
  idleTimeout: 5m
"#;

    fn demo() -> TemplateDocument {
        match serde_saphyr::from_str::<Document>(DEMO).unwrap() {
            Document::ActorTemplate(t) => *t,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn memory_restore_defaults_to_lazy_and_eager_round_trips() {
        let mut doc = demo();
        let spec = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(spec.memory_restore, MemoryRestore::Lazy);
        assert_eq!(
            spec.to_document().snapshots.unwrap().memory_restore,
            None,
            "the default is not written out"
        );
        doc.spec.snapshots = Some(SnapshotsDocument {
            fidelity: "memory".into(),
            memory_restore: Some("eager".into()),
        });
        let eager = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(eager.memory_restore, MemoryRestore::Eager);
        assert_eq!(
            TemplateSpec::from_document(&eager.to_document()).unwrap(),
            eager
        );
        // A record stored before the field existed reads as lazy.
        let mut stored = serde_json::to_value(&spec).unwrap();
        stored.as_object_mut().unwrap().remove("memory_restore");
        let old: TemplateSpec = serde_json::from_value(stored).unwrap();
        assert_eq!(old.memory_restore, MemoryRestore::Lazy);
    }

    #[test]
    fn demo_template_parses_and_round_trips() {
        let doc = demo();
        let spec = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(
            spec.resources,
            Resources {
                cpu_millis: 250,
                memory_bytes: 64 << 20
            }
        );
        assert_eq!(spec.idle_timeout_seconds, 300);
        assert_eq!(spec.fidelity, Fidelity::Memory);
        assert_eq!(spec.sandbox_class, "runc");
        let again = TemplateSpec::from_document(&spec.to_document()).unwrap();
        assert_eq!(again, spec);
    }

    fn with_sidecar(doc: &mut SpecDocument, port: u32) {
        let mut sidecar = doc.containers[0].clone();
        sidecar.name = "sidecar".into();
        if let Some(p) = sidecar.wakeup_probe.as_mut() {
            p.http_get.port = port;
        }
        doc.containers.push(sidecar);
    }

    #[test]
    fn sidecars_round_trip_with_ports_exit_policy_and_summed_resources() {
        let mut doc = demo().spec;
        doc.resources = None;
        with_sidecar(&mut doc, 9000);
        doc.containers[1].ports = vec![PortDocument {
            container_port: 9000,
            name: Some("http".into()),
            protocol: Some("TCP".into()),
        }];
        doc.containers[1].exit_policy = Some("ignore".into());
        doc.containers[0].resources = Some(ResourcesDocument {
            cpu: Some(Scalar::Text("200m".into())),
            memory: Some(Scalar::Text("64Mi".into())),
        });
        doc.containers[1].resources = Some(ResourcesDocument {
            cpu: Some(Scalar::Text("100m".into())),
            memory: Some(Scalar::Text("32Mi".into())),
        });
        let spec = TemplateSpec::from_document(&doc).unwrap();
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[1].ports, [9000]);
        assert_eq!(spec.containers[1].exit_policy, ExitPolicy::Ignore);
        assert_eq!(spec.containers[0].exit_policy, ExitPolicy::Stop);
        assert_eq!(
            spec.resources,
            Resources {
                cpu_millis: 300,
                memory_bytes: 96 << 20
            },
            "the actor's limits default to the sum of its containers'"
        );
        assert_eq!(
            TemplateSpec::from_document(&spec.to_document()).unwrap(),
            spec
        );
        // Limits below what the containers ask for together are refused.
        doc.resources = Some(ResourcesDocument {
            cpu: Some(Scalar::Text("250m".into())),
            memory: None,
        });
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.resources.cpu");
        assert!(err.message.contains("300m"), "{err}");
        // A record stored before ports and exit policies existed reads as none and stop.
        let mut stored = serde_json::to_value(&spec).unwrap();
        for c in stored["containers"].as_array_mut().unwrap() {
            c.as_object_mut().unwrap().remove("ports");
            c.as_object_mut().unwrap().remove("exit_policy");
        }
        let old: TemplateSpec = serde_json::from_value(stored).unwrap();
        assert!(old.containers[1].ports.is_empty());
        assert_eq!(old.containers[1].exit_policy, ExitPolicy::Stop);
    }

    #[test]
    fn port_collisions_between_containers_name_the_field() {
        // Both probes on port 80.
        let mut doc = demo().spec;
        with_sidecar(&mut doc, 80);
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].wakeupProbe.httpGet.port");
        assert!(
            err.message
                .contains("already used by container \"counter\""),
            "{err}"
        );
        // A declared port of the sidecar that the first container declares too.
        let mut doc = demo().spec;
        with_sidecar(&mut doc, 9000);
        let port = |p| PortDocument {
            container_port: p,
            name: None,
            protocol: None,
        };
        doc.containers[0].ports = vec![port(80), port(8080)];
        doc.containers[1].ports = vec![port(9000), port(8080)];
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].ports[1].containerPort");
        // Out of range, listed twice, not TCP.
        doc.containers[1].ports = vec![port(0)];
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].ports[0].containerPort");
        doc.containers[1].ports = vec![port(9001), port(9001)];
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].ports[1].containerPort");
        doc.containers[1].ports = vec![PortDocument {
            container_port: 9001,
            name: None,
            protocol: Some("UDP".into()),
        }];
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].ports[0].protocol");
        doc.containers[1].ports = vec![];
        doc.containers[1].exit_policy = Some("restart".into());
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers[1].exitPolicy");
        doc.containers[1].exit_policy = None;
        // volumeMounts name a volume of the template, at a usable path, once.
        let mount = |name: &str, path: &str| Volume {
            name: name.into(),
            mount_path: path.into(),
        };
        for (mounts, field) in [
            (
                vec![mount("cache", "/cache")],
                "spec.containers[1].volumeMounts[0].name",
            ),
            (
                vec![mount("data", "/.ate/x")],
                "spec.containers[1].volumeMounts[0].mountPath",
            ),
            (
                vec![mount("data", "/proc/x")],
                "spec.containers[1].volumeMounts[0].mountPath",
            ),
            (
                vec![mount("data", "/a"), mount("data", "/a/")],
                "spec.containers[1].volumeMounts[1].mountPath",
            ),
        ] {
            doc.containers[1].volume_mounts = Some(mounts);
            let err = TemplateSpec::from_document(&doc).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        doc.containers[1].volume_mounts = Some(vec![mount("data", "/side")]);
        let spec = TemplateSpec::from_document(&doc).unwrap();
        assert_eq!(
            spec.containers[1].mounts(&spec.volumes)[0].mount_path,
            "/side"
        );
        assert_eq!(
            spec.containers[0].mounts(&spec.volumes)[0].mount_path,
            "/data"
        );
        assert_eq!(
            TemplateSpec::from_document(&spec.to_document()).unwrap(),
            spec
        );
    }

    #[test]
    fn invalid_fields_are_named() {
        type Mutation = fn(&mut SpecDocument);
        let cases: Vec<(Mutation, &str)> = vec![
            (|s| s.containers.clear(), "spec.containers"),
            (
                |s| {
                    for i in 0..8 {
                        let mut sidecar = s.containers[0].clone();
                        sidecar.name = format!("sidecar{i}");
                        sidecar.wakeup_probe = None;
                        s.containers.push(sidecar);
                    }
                },
                "spec.containers",
            ),
            (
                |s| {
                    let mut sidecar = s.containers[0].clone();
                    sidecar.name = "counter".into();
                    s.containers.push(sidecar);
                },
                "spec.containers[1].name",
            ),
            (
                |s| s.containers[0].image = "Bad Image".into(),
                "spec.containers[0].image",
            ),
            (
                |s| s.containers[0].name = "Counter".into(),
                "spec.containers[0].name",
            ),
            (
                |s| s.containers[0].env[0].name = "1X".into(),
                "spec.containers[0].env[0].name",
            ),
            (
                |s| s.containers[0].wakeup_probe.as_mut().unwrap().http_get.port = 0,
                "spec.containers[0].wakeupProbe.httpGet.port",
            ),
            (
                |s| s.containers[0].wakeup_probe.as_mut().unwrap().http_get.path = "healthz".into(),
                "spec.containers[0].wakeupProbe.httpGet.path",
            ),
            (
                |s| s.resources.as_mut().unwrap().cpu = Some(Scalar::Text("lots".into())),
                "spec.resources.cpu",
            ),
            (
                |s| s.resources.as_mut().unwrap().memory = Some(Scalar::Text("1".into())),
                "spec.resources.memory",
            ),
            (
                |s| s.volumes[0].mount_path = "data".into(),
                "spec.volumes[0].mountPath",
            ),
            (
                |s| {
                    s.snapshots = Some(SnapshotsDocument {
                        fidelity: "disk".into(),
                        memory_restore: None,
                    })
                },
                "spec.snapshots.fidelity",
            ),
            (
                |s| {
                    s.snapshots = Some(SnapshotsDocument {
                        fidelity: "memory".into(),
                        memory_restore: Some("sometimes".into()),
                    })
                },
                "spec.snapshots.memoryRestore",
            ),
            (
                |s| s.idle_timeout = Some(Scalar::Text("soon".into())),
                "spec.idleTimeout",
            ),
            (
                |s| {
                    s.worker_selector.insert("bad key".into(), "v".into());
                },
                "spec.workerSelector[bad key]",
            ),
            (
                |s| {
                    s.egress = Some(EgressPolicy {
                        default_action: "maybe".into(),
                        allow: vec![],
                    })
                },
                "spec.egress.defaultAction",
            ),
            (|s| s.golden_tag = Some("notag".into()), "spec.goldenTag"),
        ];
        for (mutate, field) in cases {
            let mut doc = demo().spec;
            mutate(&mut doc);
            let err = TemplateSpec::from_document(&doc).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    fn field_of(mutate: impl FnOnce(&mut SpecDocument)) -> Option<String> {
        let mut doc = demo().spec;
        mutate(&mut doc);
        TemplateSpec::from_document(&doc).err().map(|e| {
            // The message never echoes a huge value back.
            assert!(
                e.message.len() < 1000,
                "{} bytes of message",
                e.message.len()
            );
            e.field
        })
    }

    #[test]
    fn an_env_string_over_the_kernel_limit_is_refused() {
        // `PORT=<value>` plus its NUL exactly at MAX_ARG_STRLEN starts; one byte more cannot.
        let at_limit = "x".repeat(MAX_ARG_STRLEN - "PORT=".len() - 1);
        assert_eq!(
            field_of(|s| s.containers[0].env[0].value = at_limit.clone()),
            None
        );
        let over = format!("{at_limit}x");
        assert_eq!(
            field_of(|s| s.containers[0].env[0].value = over).as_deref(),
            Some("spec.containers[0].env[0].value")
        );
        let mut doc = demo().spec;
        doc.containers[0].env[0].value = "x".repeat(200 * 1024);
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert!(err.message.contains("MAX_ARG_STRLEN"), "{err}");
        assert!(err.message.contains("PORT=<204800 bytes>"), "{err}");
    }

    #[test]
    fn a_command_argument_over_the_kernel_limit_is_refused() {
        let over = "a".repeat(MAX_ARG_STRLEN);
        assert_eq!(
            field_of(|s| s.containers[0].command.push(over)).as_deref(),
            Some("spec.containers[0].command[1]")
        );
        let at_limit = "a".repeat(MAX_ARG_STRLEN - 1);
        assert_eq!(field_of(|s| s.containers[0].command.push(at_limit)), None);
    }

    #[test]
    fn command_and_env_together_over_the_exec_bound_are_refused() {
        // Ten 100 KiB variables: each fine alone, 1000 KiB together plus the command.
        let ten = |s: &mut SpecDocument| {
            for i in 0..10 {
                s.containers[0].env.push(EnvVar {
                    name: format!("BIG_{i}"),
                    value: "v".repeat(100 * 1024),
                });
            }
        };
        assert_eq!(field_of(ten), None);
        let more = |s: &mut SpecDocument| {
            ten(s);
            s.containers[0].command.push("a".repeat(100 * 1024));
        };
        assert_eq!(field_of(more).as_deref(), Some("spec.containers[0]"));
        let mut doc = demo().spec;
        more(&mut doc);
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert!(
            err.message.contains("command and env take") && err.message.contains("1 MiB"),
            "{err}"
        );
    }

    #[test]
    fn a_cpu_limit_under_the_kernels_minimum_quota_is_refused() {
        let cpu = |q: &'static str| {
            field_of(move |s| s.resources.as_mut().unwrap().cpu = Some(Scalar::Text(q.into())))
        };
        assert_eq!(cpu("9m").as_deref(), Some("spec.resources.cpu"));
        assert_eq!(cpu("0").as_deref(), Some("spec.resources.cpu"));
        assert_eq!(cpu("10m"), None);
        assert_eq!(cpu("0.01"), None);
    }

    #[test]
    fn volumes_where_the_start_would_fail_are_refused() {
        for bad in [
            "/proc",
            "/proc/sys",
            "/proc/",
            "/dev",
            "/dev/",
            "/dev/null",
            "/dev/ptmx",
            "/etc/ate",
            "/etc/ate/keys",
            "/etc/atelier",
        ] {
            assert_eq!(
                field_of(|s| s.volumes[0].mount_path = bad.into()).as_deref(),
                Some("spec.volumes[0].mountPath"),
                "{bad}"
            );
        }
        for ok in [
            "/dev/shm",
            "/sys/fs/x",
            "/etc",
            "/etc/app",
            "/procfiles",
            "/state",
        ] {
            assert_eq!(
                field_of(|s| s.volumes[0].mount_path = ok.into()),
                None,
                "{ok}"
            );
        }
    }

    #[test]
    fn image_references_follow_the_registry_grammar() {
        let digest = format!("sha256:{}", "0".repeat(64));
        let good = [
            "busybox".to_string(),
            "busybox:1.36".to_string(),
            "library/busybox:latest".to_string(),
            "registry.local:5000/ate/counter:v1".to_string(),
            "127.0.0.1:5000/demo/counter:v1".to_string(),
            "localhost/x".to_string(),
            "my_repo/a__b/c-d--e.f:_tag.1-x".to_string(),
            format!("127.0.0.1:5000/demo/counter@{digest}"),
            format!("127.0.0.1:5000/demo/counter:v1@{digest}"),
            "oci-layout:/var/lib/ate/images/counter:latest".to_string(),
            format!("r.example/{}", "a".repeat(255)),
        ];
        for image in &good {
            assert!(validate_image("f", image).is_ok(), "{image}");
        }
        let bad = [
            "a//b".to_string(),
            "a/b:".to_string(),
            "a/b:-x".to_string(),
            "a/b:.x".to_string(),
            "a/b:x:y".to_string(),
            "a/-b".to_string(),
            "a/b-".to_string(),
            "a..b/c".to_string(),
            "a/b___c".to_string(),
            "a/b._c".to_string(),
            "-host/x".to_string(),
            "host:port/x".to_string(),
            "host:/x".to_string(),
            "host:5000/".to_string(),
            "/x".to_string(),
            "Upper/x".to_string(),
            format!("a/b:{}", "t".repeat(129)),
            format!("r.example/{}", "a".repeat(256)),
            "a".repeat(248),
            "a/b@sha256:00".to_string(),
            format!("a/b@sha512:{}", "0".repeat(128)),
            "oci-layout:relative/dir".to_string(),
        ];
        for image in &bad {
            assert!(validate_image("f", image).is_err(), "{image}");
        }
        let err = validate_image("spec.containers[0].image", "a/b:").unwrap_err();
        assert_eq!(err.field, "spec.containers[0].image");
        assert!(err.message.contains("a tag is"), "{err}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let text = DEMO.replace("idleTimeout: 5m", "idleTimout: 5m");
        assert!(serde_saphyr::from_str::<Document>(&text).is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu("f", "1").unwrap(), 1000);
        assert_eq!(parse_cpu("f", "0.5").unwrap(), 500);
        assert_eq!(parse_memory("f", "1Gi").unwrap(), 1 << 30);
        assert_eq!(format_memory(64 << 20), "64Mi");
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(parse_duration_seconds("f", "2h").unwrap(), 7200);
        assert!(parse_memory("f", "99999999999999Ti").is_err());
        assert!(validate_image("f", "registry.local:5000/ate/counter@sha256:0000000000000000000000000000000000000000000000000000000000000000").is_ok());
    }
}
