//! Template spec conversions between the wire form and [`ate_core::TemplateSpec`].

use ate_core::template::{
    Container, EgressPolicy, EnvVar, ExitPolicy, ExternalVolume, HttpGet, MemoryRestore,
    OnMemoryFailure, Resources, Volume, WakeupProbe, WebSockets,
};
use ate_core::{Fidelity, TemplateSpec, ValidationError};

use crate::v1;

/// Wire spec → validated core spec. Missing optional parts get the template defaults' meaning.
pub fn spec_from_wire(w: &v1::TemplateSpec) -> Result<TemplateSpec, ValidationError> {
    let fidelity = match w.fidelity {
        0 => Fidelity::Memory,
        n => Fidelity::from_wire(n).ok_or_else(|| {
            ValidationError::new("spec.snapshots.fidelity", format!("unknown fidelity {n}"))
        })?,
    };
    let resources = w.resources.unwrap_or_default();
    let spec = TemplateSpec {
        sandbox_class: if w.sandbox_class.is_empty() {
            ate_core::template::DEFAULT_SANDBOX_CLASS.to_string()
        } else {
            w.sandbox_class.clone()
        },
        containers: w
            .containers
            .iter()
            .map(|c| Container {
                name: c.name.clone(),
                image: c.image.clone(),
                command: c.command.clone(),
                env: c.env.iter().map(EnvVar::from).collect(),
                wakeup_probe: c.wakeup_probe.as_ref().map(|p| WakeupProbe {
                    http_get: p
                        .http_get
                        .as_ref()
                        .map(|h| HttpGet {
                            path: h.path.clone(),
                            port: h.port,
                        })
                        .unwrap_or(HttpGet {
                            path: String::new(),
                            port: 0,
                        }),
                    timeout_seconds: p.timeout_seconds,
                }),
                ports: c.ports.clone(),
                exit_policy: if c.ignore_exit {
                    ExitPolicy::Ignore
                } else {
                    ExitPolicy::Stop
                },
                volume_mounts: c
                    .volume_mounts_set
                    .then(|| c.volume_mounts.iter().map(Volume::from).collect()),
            })
            .collect(),
        resources: Resources {
            cpu_millis: resources.cpu_millis,
            memory_bytes: resources.memory_bytes,
        },
        volumes: w.volumes.iter().map(Volume::from).collect(),
        fidelity,
        memory_restore: if w.eager_memory_restore {
            MemoryRestore::Eager
        } else {
            MemoryRestore::Lazy
        },
        on_memory_failure: if w.rootfs_on_memory_failure {
            OnMemoryFailure::Rootfs
        } else {
            OnMemoryFailure::Fail
        },
        web_sockets: if w.hibernate_web_sockets {
            WebSockets::Hibernate
        } else {
            WebSockets::Close
        },
        idle_timeout_seconds: w.idle_timeout_seconds,
        worker_selector: w.worker_selector.clone().into_iter().collect(),
        egress: w
            .egress
            .as_ref()
            .map(|e| EgressPolicy {
                default_action: if e.default_action.is_empty() {
                    "allow-all".to_string()
                } else {
                    e.default_action.clone()
                },
                allow: e.allow.clone(),
            })
            .unwrap_or_else(|| EgressPolicy {
                default_action: "allow-all".to_string(),
                allow: vec![],
            }),
        golden_tag: Some(w.golden_tag.clone()).filter(|t| !t.is_empty()),
    };
    spec.validate()?;
    Ok(spec)
}

/// Core spec → wire spec.
pub fn spec_to_wire(s: &TemplateSpec) -> v1::TemplateSpec {
    v1::TemplateSpec {
        sandbox_class: s.sandbox_class.clone(),
        containers: s
            .containers
            .iter()
            .map(|c| v1::Container {
                name: c.name.clone(),
                image: c.image.clone(),
                command: c.command.clone(),
                env: c.env.iter().map(v1::EnvVar::from).collect(),
                wakeup_probe: c.wakeup_probe.as_ref().map(|p| v1::WakeupProbe {
                    http_get: Some(v1::HttpGetAction {
                        path: p.http_get.path.clone(),
                        port: p.http_get.port,
                    }),
                    timeout_seconds: p.timeout_seconds,
                }),
                ports: c.ports.clone(),
                ignore_exit: c.exit_policy == ExitPolicy::Ignore,
                volume_mounts: c
                    .volume_mounts
                    .iter()
                    .flatten()
                    .map(v1::Volume::from)
                    .collect(),
                volume_mounts_set: c.volume_mounts.is_some(),
            })
            .collect(),
        resources: Some(v1::Resources {
            cpu_millis: s.resources.cpu_millis,
            memory_bytes: s.resources.memory_bytes,
        }),
        volumes: s.volumes.iter().map(v1::Volume::from).collect(),
        fidelity: s.fidelity.wire(),
        eager_memory_restore: s.memory_restore == MemoryRestore::Eager,
        rootfs_on_memory_failure: s.on_memory_failure == OnMemoryFailure::Rootfs,
        hibernate_web_sockets: s.web_sockets == WebSockets::Hibernate,
        idle_timeout_seconds: s.idle_timeout_seconds,
        worker_selector: s.worker_selector.clone().into_iter().collect(),
        egress: Some(v1::EgressPolicy {
            default_action: s.egress.default_action.clone(),
            allow: s.egress.allow.clone(),
        }),
        golden_tag: s.golden_tag.clone().unwrap_or_default(),
    }
}

// The parts with the same fields on both sides.

impl From<&v1::EnvVar> for EnvVar {
    fn from(e: &v1::EnvVar) -> Self {
        EnvVar {
            name: e.name.clone(),
            value: e.value.clone(),
        }
    }
}

impl From<&EnvVar> for v1::EnvVar {
    fn from(e: &EnvVar) -> Self {
        v1::EnvVar {
            name: e.name.clone(),
            value: e.value.clone(),
        }
    }
}

impl From<&v1::Volume> for Volume {
    fn from(v: &v1::Volume) -> Self {
        Volume {
            name: v.name.clone(),
            mount_path: v.mount_path.clone(),
            external: (!v.external_host_path.is_empty()).then(|| ExternalVolume {
                host_path: Some(v.external_host_path.clone()),
                shared: v.external_shared,
                ..ExternalVolume::default()
            }),
        }
    }
}

impl From<&Volume> for v1::Volume {
    fn from(v: &Volume) -> Self {
        v1::Volume {
            name: v.name.clone(),
            mount_path: v.mount_path.clone(),
            external_host_path: v
                .external
                .as_ref()
                .and_then(|e| e.host_path.clone())
                .unwrap_or_default(),
            external_shared: v.external.as_ref().is_some_and(|e| e.shared),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip_and_validation() {
        let wire = v1::TemplateSpec {
            containers: vec![v1::Container {
                name: "c".into(),
                image: "oci-layout:/x".into(),
                ..Default::default()
            }],
            resources: Some(v1::Resources {
                cpu_millis: 100,
                memory_bytes: 64 << 20,
            }),
            ..Default::default()
        };
        let core = spec_from_wire(&wire).unwrap();
        assert_eq!(core.fidelity, Fidelity::Memory);
        assert_eq!(spec_from_wire(&spec_to_wire(&core)).unwrap(), core);
        let mut bad = wire.clone();
        bad.resources = None;
        assert_eq!(
            spec_from_wire(&bad).unwrap_err().field,
            "spec.resources.cpu"
        );
    }
}
