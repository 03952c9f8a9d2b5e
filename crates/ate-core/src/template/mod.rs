//! The ActorTemplate: its YAML/JSON document form (shaped like a Kubernetes custom resource, so the
//! same file works with `kubectl apply` later) and the validated internal [`TemplateSpec`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

mod convert;
mod document;
#[cfg(test)]
mod fixtures;
mod image;
mod mounts;
mod quantity;
mod validate;

pub use document::{
    AtespaceDocument, AtespaceSpec, CALLERS_ALLOW_ALL, CallersSpec, ContainerDocument, Document,
    MAX_CALLERS_ALLOW, MemoryRestore, Metadata, OnMemoryFailure, PortDocument, Quota, QuotaSpec,
    ResourcesDocument, Scalar, SnapshotsDocument, SpecDocument, TemplateDocument,
    WakeupProbeDocument, WebSockets, validate_callers_allow,
};
pub use image::validate_image;
pub use quantity::{format_cpu, format_memory, parse_cpu, parse_duration_seconds, parse_memory};

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
    /// Data outside the actor's snapshots (`spec.volumes[].external`); only in `spec.volumes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalVolume>,
}

impl Volume {
    /// The host directory of this volume for actor `atespace/name`, when it is an external
    /// `hostPath` volume: `<hostPath>/<atespace>/<name>`.
    pub fn external_dir(&self, atespace: &str, name: &str) -> Option<std::path::PathBuf> {
        let root = self.external.as_ref()?.host_path.as_deref()?;
        Some(std::path::Path::new(root).join(atespace).join(name))
    }
}

/// Where an external volume lives (see `docs/volumes.md`). Exactly one way is given.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExternalVolume {
    /// A directory of the node: each actor gets `<hostPath>/<atespace>/<actor>`, made at its
    /// first start and kept across suspends, moves, reverts and its deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// The hostPath is on storage every node mounts at the same path (NFS, CephFS): the actor
    /// may move between nodes. Otherwise it stays on the node where it last ran.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// A PersistentVolumeClaim per actor (Kubernetes deployments, not built yet: refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
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
    /// What a MEMORY suspend does when the dump fails (records stored before it existed read
    /// as `fail`).
    #[serde(default)]
    pub on_memory_failure: OnMemoryFailure,
    /// 0 = never suspend automatically.
    pub idle_timeout_seconds: u32,
    pub worker_selector: BTreeMap<String, String>,
    pub egress: EgressPolicy,
    /// `<atespace>/<tag>` whose snapshot seeds new actors.
    pub golden_tag: Option<String>,
    /// What a suspend does to the actor's WebSockets (records stored before it existed read
    /// as `close`).
    #[serde(default)]
    pub web_sockets: WebSockets,
}
