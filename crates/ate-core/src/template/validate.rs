//! [`TemplateSpec::validate`]: every field checked, the first problem named by its field path.

use std::collections::{BTreeMap, BTreeSet};

use super::mounts::check_mount_path;
use super::{
    Container, MAX_ARG_STRLEN, MAX_CONTAINERS, MAX_EXEC_BYTES, MAX_IDLE_TIMEOUT_SECONDS,
    MIN_CPU_MILLIS, TemplateSpec, format_cpu, validate_image,
};
use crate::names::{ValidationError, parse_namespaced, validate_label};

impl TemplateSpec {
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
            unique_name(&f, "container", &c.name, &mut names)?;
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
        let mut host_paths = BTreeSet::new();
        for (i, v) in self.volumes.iter().enumerate() {
            let f = format!("spec.volumes[{i}]");
            unique_name(&f, "volume", &v.name, &mut vol_names)?;
            let p = &v.mount_path;
            check_mount_path(&format!("{f}.mountPath"), p)?;
            if !vol_paths.insert(p.trim_end_matches('/')) {
                return Err(ValidationError::new(
                    format!("{f}.mountPath"),
                    format!("{p:?} is mounted twice"),
                ));
            }
            if let Some(ext) = &v.external {
                check_external(&format!("{f}.external"), ext, &mut host_paths)?;
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
                if m.external.is_some() {
                    return Err(ValidationError::new(
                        format!("{f}.external"),
                        "is set on the volume in spec.volumes, not on a volumeMount",
                    ));
                }
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
/// `{f}.name`: a DNS-1123 label that no other `kind` in `seen` has.
fn unique_name<'a>(
    f: &str,
    kind: &str,
    name: &'a str,
    seen: &mut BTreeSet<&'a str>,
) -> Result<(), ValidationError> {
    let field = format!("{f}.name");
    validate_label(&field, name)?;
    if !seen.insert(name) {
        return Err(ValidationError::new(
            field,
            format!("duplicate {kind} name {name:?}"),
        ));
    }
    Ok(())
}

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

fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
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

/// An external volume: a `hostPath` (absolute, without `.`/`..`, not `/`, used by one volume
/// only, since each actor's directory is `<hostPath>/<atespace>/<actor>`); `storageClassName`
/// needs the Kubernetes deployment, which does not exist yet.
fn check_external<'a>(
    field: &str,
    ext: &'a super::ExternalVolume,
    host_paths: &mut BTreeSet<&'a str>,
) -> Result<(), ValidationError> {
    if ext.storage_class_name.is_some() || ext.size.is_some() {
        return Err(ValidationError::new(
            format!("{field}.storageClassName"),
            "a PersistentVolumeClaim per actor needs the Kubernetes deployment, which this \
             release does not have; use external.hostPath",
        ));
    }
    let Some(p) = ext.host_path.as_deref() else {
        return Err(ValidationError::new(
            format!("{field}.hostPath"),
            "is required (the node directory under which each actor gets <atespace>/<actor>)",
        ));
    };
    if !p.starts_with('/')
        || p.trim_end_matches('/').is_empty()
        || p.split('/').any(|s| s == ".." || s == ".")
        || p.contains('\0')
        || p.len() > 1024
    {
        return Err(ValidationError::new(
            format!("{field}.hostPath"),
            format!("{p:?} must be an absolute path other than / without . or .. parts"),
        ));
    }
    if !host_paths.insert(p.trim_end_matches('/')) {
        return Err(ValidationError::new(
            format!("{field}.hostPath"),
            format!(
                "{p:?} is the hostPath of another volume: each actor would share one directory"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::fixtures::{demo, field_of, with_sidecar};
    use crate::template::{
        EgressPolicy, EnvVar, PortDocument, Scalar, SnapshotsDocument, SpecDocument, Volume,
    };

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
            external: None,
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
                        on_memory_failure: None,
                    })
                },
                "spec.snapshots.fidelity",
            ),
            (
                |s| {
                    s.snapshots = Some(SnapshotsDocument {
                        fidelity: "memory".into(),
                        memory_restore: Some("sometimes".into()),
                        on_memory_failure: None,
                    })
                },
                "spec.snapshots.memoryRestore",
            ),
            (
                |s| {
                    s.snapshots = Some(SnapshotsDocument {
                        fidelity: "memory".into(),
                        memory_restore: None,
                        on_memory_failure: Some("volumes".into()),
                    })
                },
                "spec.snapshots.onMemoryFailure",
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
}
