//! Between the document form and the validated [`TemplateSpec`]: defaults filled in one way,
//! written out the other.

use super::{
    Container, ContainerDocument, DEFAULT_CPU_MILLIS, DEFAULT_MEMORY_BYTES,
    DEFAULT_PROBE_TIMEOUT_SECONDS, DEFAULT_SANDBOX_CLASS, EgressPolicy, ExitPolicy, MemoryRestore,
    OnMemoryFailure, PortDocument, Resources, ResourcesDocument, Scalar, SnapshotsDocument,
    SpecDocument, TemplateSpec, WakeupProbe, WakeupProbeDocument, WebSockets, allow_all,
    format_cpu, format_memory, parse_cpu, parse_duration_seconds, parse_memory,
};
use crate::names::ValidationError;
use crate::state::Fidelity;

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
        let on_memory_failure = match doc
            .snapshots
            .as_ref()
            .and_then(|s| s.on_memory_failure.as_deref())
        {
            None => OnMemoryFailure::Fail,
            Some(text) => OnMemoryFailure::parse(text).ok_or_else(|| {
                ValidationError::new(
                    "spec.snapshots.onMemoryFailure",
                    format!("{text:?} is not one of fail, rootfs"),
                )
            })?,
        };
        let web_sockets = match doc.web_sockets.as_deref() {
            None => WebSockets::Close,
            Some(text) => WebSockets::parse(text).ok_or_else(|| {
                ValidationError::new(
                    "spec.webSockets",
                    format!("{text:?} is not one of close, hibernate"),
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
            on_memory_failure,
            idle_timeout_seconds,
            worker_selector: doc.worker_selector.clone(),
            egress: doc.egress.clone().unwrap_or_else(|| EgressPolicy {
                default_action: allow_all(),
                allow: vec![],
            }),
            golden_tag: doc.golden_tag.clone().filter(|t| !t.is_empty()),
            web_sockets,
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
                on_memory_failure: (self.on_memory_failure != OnMemoryFailure::Fail)
                    .then(|| self.on_memory_failure.as_str().to_string()),
            }),
            idle_timeout: (self.idle_timeout_seconds > 0)
                .then(|| Scalar::Text(format!("{}s", self.idle_timeout_seconds))),
            worker_selector: self.worker_selector.clone(),
            egress: Some(self.egress.clone()),
            golden_tag: self.golden_tag.clone(),
            web_sockets: (self.web_sockets != WebSockets::Close)
                .then(|| self.web_sockets.as_str().to_string()),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::fixtures::{demo, with_sidecar};

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
            on_memory_failure: None,
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
    fn on_memory_failure_is_fail_unless_rootfs_is_asked_for() {
        let mut doc = demo();
        let spec = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(spec.on_memory_failure, OnMemoryFailure::Fail);
        assert_eq!(
            spec.to_document().snapshots.unwrap().on_memory_failure,
            None,
            "the default is not written out"
        );
        doc.spec.snapshots = Some(SnapshotsDocument {
            fidelity: "memory".into(),
            memory_restore: None,
            on_memory_failure: Some("rootfs".into()),
        });
        let rootfs = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(rootfs.on_memory_failure, OnMemoryFailure::Rootfs);
        assert_eq!(
            TemplateSpec::from_document(&rootfs.to_document()).unwrap(),
            rootfs
        );
        // A record stored before the field existed reads as fail.
        let mut stored = serde_json::to_value(&rootfs).unwrap();
        stored.as_object_mut().unwrap().remove("on_memory_failure");
        let old: TemplateSpec = serde_json::from_value(stored).unwrap();
        assert_eq!(old.on_memory_failure, OnMemoryFailure::Fail);
    }

    #[test]
    fn web_sockets_default_to_close_and_hibernate_round_trips() {
        let mut doc = demo();
        let spec = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(spec.web_sockets, WebSockets::Close);
        assert_eq!(
            spec.to_document().web_sockets,
            None,
            "the default is not written out"
        );
        doc.spec.web_sockets = Some("hibernate".into());
        let hibernate = TemplateSpec::from_document(&doc.spec).unwrap();
        assert_eq!(hibernate.web_sockets, WebSockets::Hibernate);
        assert_eq!(
            TemplateSpec::from_document(&hibernate.to_document()).unwrap(),
            hibernate
        );
        doc.spec.web_sockets = Some("sleep".into());
        let e = TemplateSpec::from_document(&doc.spec).unwrap_err();
        assert!(e.to_string().contains("spec.webSockets"), "{e}");
        // A record stored before the field existed reads as close.
        let mut stored = serde_json::to_value(&hibernate).unwrap();
        stored.as_object_mut().unwrap().remove("web_sockets");
        let old: TemplateSpec = serde_json::from_value(stored).unwrap();
        assert_eq!(old.web_sockets, WebSockets::Close);
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
}
