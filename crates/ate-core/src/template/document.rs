//! The document form: what `ate apply -f` reads and `-o yaml` writes, before validation.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{EgressPolicy, EnvVar, HttpGet, Volume};
use crate::names::{ValidationError, validate_label};

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
    /// The atespace's settings. Absent: `ate apply` leaves an existing atespace's settings as
    /// they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<AtespaceSpec>,
}

/// `spec` of an Atespace document.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AtespaceSpec {
    #[serde(default)]
    pub callers: CallersSpec,
    /// Absent: no quota (an admin's `ate apply` clears one that was set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaSpec>,
}

/// `spec.quota`: the most the atespace's actors may hold at once, counted over the actors on a
/// worker (RESUMING, RUNNING, SUSPENDING) with what their templates book. A field left out:
/// no limit for it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_actors: Option<u32>,
    /// Kubernetes quantity (`2`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Scalar>,
    /// Kubernetes quantity (`4Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Scalar>,
}

/// A parsed [`QuotaSpec`]; 0 in a field is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    pub running_actors: u32,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
}

impl QuotaSpec {
    /// The quota it sets; a quantity that does not parse is an error naming its field.
    pub fn parse(&self) -> Result<Quota, ValidationError> {
        Ok(Quota {
            running_actors: self.running_actors.unwrap_or(0),
            cpu_millis: match &self.cpu {
                Some(q) => super::parse_cpu("spec.quota.cpu", &q.text())?,
                None => 0,
            },
            memory_bytes: match &self.memory {
                Some(q) => super::parse_memory("spec.quota.memory", &q.text())?,
                None => 0,
            },
        })
    }
}

/// `spec.callers`: who may call this atespace's actors from another atespace. The callee's
/// atespace decides; calls within one atespace are always allowed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallersSpec {
    /// Atespaces whose actors may call this atespace's actors; `"*"` = every atespace. Checked
    /// by [`validate_callers_allow`].
    #[serde(default)]
    pub allow: Vec<String>,
}

/// The entry of `spec.callers.allow` that admits every atespace.
pub const CALLERS_ALLOW_ALL: &str = "*";
/// Most entries in `spec.callers.allow`.
pub const MAX_CALLERS_ALLOW: usize = 256;

/// Checks `spec.callers.allow`: each entry an atespace name (a DNS-1123 label) or exactly `"*"`,
/// no entry twice, at most [`MAX_CALLERS_ALLOW`] entries.
pub fn validate_callers_allow(list: &[String]) -> Result<(), ValidationError> {
    if list.len() > MAX_CALLERS_ALLOW {
        return Err(ValidationError::new(
            "spec.callers.allow",
            format!(
                "has {} entries, at most {MAX_CALLERS_ALLOW} are allowed",
                list.len()
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let field = format!("spec.callers.allow[{i}]");
        if entry != CALLERS_ALLOW_ALL {
            validate_label(&field, entry)?;
        }
        if !seen.insert(entry.as_str()) {
            return Err(ValidationError::new(
                field,
                format!("{entry:?} is listed more than once"),
            ));
        }
    }
    Ok(())
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
    pub(super) fn text(&self) -> String {
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
    /// `close` (default) or `hibernate`: what a suspend does to the actor's WebSockets
    /// (docs/websockets.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_sockets: Option<String>,
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
    /// `fail` (default) or `rootfs`: what a suspend does when the memory dump fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_memory_failure: Option<String>,
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

/// What a MEMORY suspend does when the memory cannot be dumped
/// (`spec.snapshots.onMemoryFailure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnMemoryFailure {
    /// The suspend fails: the actor runs on with its memory, the caller gets the reason.
    #[default]
    Fail,
    /// The suspend writes a ROOTFS generation instead (the process memory is lost) and says
    /// so: the snapshot's reason, the actor's lastError, a metric.
    Rootfs,
}

impl OnMemoryFailure {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fail" => Some(OnMemoryFailure::Fail),
            "rootfs" => Some(OnMemoryFailure::Rootfs),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnMemoryFailure::Fail => "fail",
            OnMemoryFailure::Rootfs => "rootfs",
        }
    }
}

/// What a suspend does to the actor's WebSockets (`spec.webSockets`, docs/websockets.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WebSockets {
    /// The router relays the upgraded bytes; a suspend closes each WebSocket (1001), and an
    /// open one keeps the actor from idle suspend.
    #[default]
    Close,
    /// The router terminates the client's WebSocket and keeps it open while the actor sleeps;
    /// the actor sees a new upstream WebSocket (same `ate-websocket-id`) after each wake.
    Hibernate,
}

impl WebSockets {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "close" => Some(WebSockets::Close),
            "hibernate" => Some(WebSockets::Hibernate),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WebSockets::Close => "close",
            WebSockets::Hibernate => "hibernate",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::fixtures::DEMO;

    #[test]
    fn unknown_fields_are_rejected() {
        let text = DEMO.replace("idleTimeout: 5m", "idleTimout: 5m");
        assert!(serde_saphyr::from_str::<Document>(&text).is_err());
    }

    fn atespace(text: &str) -> AtespaceDocument {
        match serde_saphyr::from_str::<Document>(text).unwrap() {
            Document::Atespace(a) => a,
            other => panic!("not an Atespace: {other:?}"),
        }
    }

    #[test]
    fn atespace_without_spec_parses_and_round_trips() {
        let a = atespace("apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\n");
        assert_eq!(a.metadata.name, "demo");
        assert_eq!(a.spec, None);
        let yaml = serde_saphyr::to_string(&Document::Atespace(a.clone())).unwrap();
        assert!(!yaml.contains("spec"), "{yaml}");
        assert_eq!(atespace(&yaml), a);
    }

    #[test]
    fn atespace_with_callers_parses_and_round_trips() {
        let a = atespace(
            "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec:\n  callers:\n    allow: [team-a, \"*\"]\n",
        );
        assert_eq!(
            a.spec,
            Some(AtespaceSpec {
                callers: CallersSpec {
                    allow: vec!["team-a".into(), "*".into()],
                },
                quota: None,
            })
        );
        let yaml = serde_saphyr::to_string(&Document::Atespace(a.clone())).unwrap();
        assert_eq!(atespace(&yaml), a);
    }

    #[test]
    fn atespace_quota_parses_and_round_trips() {
        let a = atespace(
            "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec:\n  quota: {runningActors: 10, cpu: \"2\", memory: 4Gi}\n",
        );
        let quota = a.spec.as_ref().and_then(|s| s.quota.clone()).unwrap();
        assert_eq!(
            quota.parse(),
            Ok(Quota {
                running_actors: 10,
                cpu_millis: 2000,
                memory_bytes: 4 << 30
            })
        );
        let yaml = serde_saphyr::to_string(&Document::Atespace(a.clone())).unwrap();
        assert_eq!(atespace(&yaml), a);
        let partial = QuotaSpec {
            cpu: Some(Scalar::Text("500m".into())),
            ..QuotaSpec::default()
        };
        assert_eq!(partial.parse().map(|q| q.cpu_millis), Ok(500));
        let bad = QuotaSpec {
            memory: Some(Scalar::Text("lots".into())),
            ..QuotaSpec::default()
        };
        assert!(
            bad.parse()
                .unwrap_err()
                .to_string()
                .contains("spec.quota.memory")
        );
        let unknown = "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec:\n  quota: {actors: 1}\n";
        assert!(serde_saphyr::from_str::<Document>(unknown).is_err());
    }

    #[test]
    fn atespace_spec_parts_default_when_absent() {
        let a = atespace(
            "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec: {}\n",
        );
        assert_eq!(a.spec, Some(AtespaceSpec::default()));
        let a = atespace(
            "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec:\n  callers: {}\n",
        );
        assert_eq!(a.spec.unwrap().callers.allow, Vec::<String>::new());
    }

    #[test]
    fn atespace_spec_unknown_fields_are_rejected() {
        for text in [
            "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec:\n  caller:\n    allow: [a]\n",
            "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: demo\nspec:\n  callers:\n    allowed: [a]\n",
        ] {
            assert!(serde_saphyr::from_str::<Document>(text).is_err(), "{text}");
        }
    }

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn callers_allow_accepts_names_and_star() {
        for good in [
            list(&[]),
            list(&["*"]),
            list(&["team-a"]),
            list(&["team-a", "b", "0x9", "*"]),
            list(&[&"a".repeat(63)]),
        ] {
            assert_eq!(validate_callers_allow(&good), Ok(()), "{good:?}");
        }
        let many: Vec<String> = (0..MAX_CALLERS_ALLOW).map(|i| format!("a{i}")).collect();
        assert_eq!(validate_callers_allow(&many), Ok(()));
    }

    #[test]
    fn callers_allow_rejects_bad_entries() {
        for (bad, field) in [
            (list(&[""]), "spec.callers.allow[0]"),
            (list(&["ok", "Not_A_Name"]), "spec.callers.allow[1]"),
            (list(&["a", "b", "-a"]), "spec.callers.allow[2]"),
            (list(&["a-"]), "spec.callers.allow[0]"),
            (list(&["a,b"]), "spec.callers.allow[0]"),
            (list(&["**"]), "spec.callers.allow[0]"),
            (list(&["a*"]), "spec.callers.allow[0]"),
            (list(&[" *"]), "spec.callers.allow[0]"),
            (list(&[&"a".repeat(64)]), "spec.callers.allow[0]"),
            (list(&["a", "b", "a"]), "spec.callers.allow[2]"),
            (list(&["*", "x", "*"]), "spec.callers.allow[2]"),
        ] {
            let err = validate_callers_allow(&bad).unwrap_err();
            assert_eq!(err.field, field, "{bad:?}: {err}");
        }
        let too_many: Vec<String> = (0..=MAX_CALLERS_ALLOW).map(|i| format!("a{i}")).collect();
        let err = validate_callers_allow(&too_many).unwrap_err();
        assert_eq!(err.field, "spec.callers.allow");
        assert!(err.message.contains("257"), "{err}");
    }
}
