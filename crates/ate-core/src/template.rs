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
/// Containers per template. Each actor runs in one runc container with one CRIU image; a
/// template with sidecars is refused at apply instead of silently running its first container.
const MAX_CONTAINERS: usize = 1;
const MAX_IDLE_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

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
        let cpu_millis = match &resources.cpu {
            Some(q) => parse_cpu("spec.resources.cpu", &q.text())?,
            None => DEFAULT_CPU_MILLIS,
        };
        let memory_bytes = match &resources.memory {
            Some(q) => parse_memory("spec.resources.memory", &q.text())?,
            None => DEFAULT_MEMORY_BYTES,
        };
        let fidelity = match &doc.snapshots {
            Some(s) => Fidelity::parse_any(&s.fidelity).ok_or_else(|| {
                ValidationError::new(
                    "spec.snapshots.fidelity",
                    format!("{:?} is not one of memory, rootfs, volumes", s.fidelity),
                )
            })?,
            None => Fidelity::Memory,
        };
        let idle_timeout_seconds = match &doc.idle_timeout {
            Some(d) => parse_duration_seconds("spec.idleTimeout", &d.text())?,
            None => 0,
        };
        let containers = doc
            .containers
            .iter()
            .map(|c| Container {
                name: c.name.clone(),
                image: c.image.clone(),
                command: c.command.clone(),
                env: c.env.clone(),
                wakeup_probe: c.wakeup_probe.as_ref().map(|p| WakeupProbe {
                    http_get: p.http_get.clone(),
                    timeout_seconds: p.timeout_seconds.unwrap_or(DEFAULT_PROBE_TIMEOUT_SECONDS),
                }),
            })
            .collect();
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
                })
                .collect(),
            resources: Some(ResourcesDocument {
                cpu: Some(Scalar::Text(format_cpu(self.resources.cpu_millis))),
                memory: Some(Scalar::Text(format_memory(self.resources.memory_bytes))),
            }),
            volumes: self.volumes.clone(),
            snapshots: Some(SnapshotsDocument {
                fidelity: self.fidelity.short().to_string(),
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
                    "{} containers given; this release runs one container per actor \
                     (sidecars are not supported yet)",
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
                if !env_names.insert(e.name.as_str()) {
                    return Err(ValidationError::new(
                        format!("{f}.env[{j}].name"),
                        format!("duplicate variable {:?}", e.name),
                    ));
                }
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
        if self.resources.cpu_millis == 0 || self.resources.cpu_millis > 64_000 {
            return Err(ValidationError::new(
                "spec.resources.cpu",
                "must be between 1m and 64",
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
            if !p.starts_with('/')
                || p == "/"
                || p.split('/').any(|s| s == ".." || s == ".")
                || p.contains('\0')
                || p.len() > 4096
            {
                return Err(ValidationError::new(
                    format!("{f}.mountPath"),
                    format!("{p:?} must be an absolute path other than / without . or .. parts"),
                ));
            }
            if !vol_paths.insert(p.trim_end_matches('/')) {
                return Err(ValidationError::new(
                    format!("{f}.mountPath"),
                    format!("{p:?} is mounted twice"),
                ));
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

fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Accepts `oci-layout:<dir>[:<tag>]` and registry references (`[host/]repo[:tag][@sha256:<hex>]`).
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
    let (name, digest) = match image.split_once('@') {
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
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._/:".contains(&b));
    if name.is_empty()
        || !ok_chars
        || name.starts_with('/')
        || name.ends_with('/')
        || name.contains("//")
    {
        return Err(ValidationError::new(
            field,
            format!("{image:?} is not an image reference"),
        ));
    }
    Ok(())
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

    #[test]
    fn a_second_container_is_refused_not_ignored() {
        let mut doc = demo().spec;
        let mut sidecar = doc.containers[0].clone();
        sidecar.name = "logs".into();
        doc.containers.push(sidecar);
        let err = TemplateSpec::from_document(&doc).unwrap_err();
        assert_eq!(err.field, "spec.containers");
        assert!(
            err.to_string()
                .contains("2 containers given; this release runs one container per actor"),
            "{err}"
        );
    }

    #[test]
    fn invalid_fields_are_named() {
        type Mutation = fn(&mut SpecDocument);
        let cases: Vec<(Mutation, &str)> = vec![
            (|s| s.containers.clear(), "spec.containers"),
            (
                |s| {
                    let mut sidecar = s.containers[0].clone();
                    sidecar.name = "sidecar".into();
                    s.containers.push(sidecar);
                },
                "spec.containers",
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
                    })
                },
                "spec.snapshots.fidelity",
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
