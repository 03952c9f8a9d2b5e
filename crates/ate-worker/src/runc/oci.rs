//! From a [`SandboxSpec`] to runc's OCI config: checking the spec, the container's command
//! line and environment, the `config.json` value, and runc's "could not exec" errors put in
//! the template's terms.

use std::path::Path;

use serde_json::{Value, json};

use super::cgroup::{CGROUP_PARENT, CPU_PERIOD_US, cpu_quota_us};
use crate::error::{Result, SandboxError};
use crate::hardening;
use crate::netns;
use crate::runtime::{ActorSandbox, SandboxSpec};
use crate::sidecars;

pub(crate) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub(super) fn validate_spec(actor: &ActorSandbox, spec: &SandboxSpec) -> Result<()> {
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

/// The OCI runtime config: runc's default mounts plus the actor's process, namespaces (network
/// by path), volumes, identity dir and limits; [`hardening::apply`] adds the security fields
/// (capabilities, no-new-privs, seccomp, masked/read-only paths, pids limit).
/// With `restoring`, the CPU quota is explicitly unlimited (see `RuncRuntime::prepare`);
/// `criu_conf` is the CRIU options file runc hands CRIU (its `org.criu.config` annotation).
pub(super) fn oci_config(
    actor: &ActorSandbox,
    spec: &SandboxSpec,
    restoring: bool,
    criu_conf: &Path,
) -> Value {
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
    if restoring {
        // Explicitly unlimited, not just absent: a cgroup left by an earlier life of this
        // actor (same name) would otherwise keep its old quota and throttle CRIU anyway.
        resources["cpu"] = json!({"quota": -1, "period": CPU_PERIOD_US});
    } else if let Some(quota) = cpu_quota_us(spec) {
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
    // runc hands this file to CRIU on checkpoint and restore (its `org.criu.config`
    // annotation): per-actor CRIU options without touching /etc/criu.
    config["annotations"] = json!({"org.criu.config": criu_conf.to_string_lossy()});
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
pub(super) fn exec_failure(e: SandboxError, spec: &SandboxSpec) -> SandboxError {
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
pub(super) fn build_env(spec: &SandboxSpec) -> Vec<String> {
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
    use crate::runtime::SidecarSpec;
    use ate_core::template::{ExitPolicy, Resources, Volume};

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

    /// Specs covering every branch of [`oci_config`]: limits or none, volumes mounted or not,
    /// a template command and working dir, sidecars (with and without their own mounts), cold
    /// start or restore.
    fn fixture_cases() -> Vec<(&'static str, ActorSandbox, SandboxSpec, bool, &'static str)> {
        let actor = ActorSandbox::new("team", "c1", "u1", "/var/lib/ate/actors/team/c1");
        let shared_criu = "/var/lib/ate/runc/criu.conf";
        let own_criu = "/var/lib/ate/actors/team/c1/criu.conf";
        let mut bare = spec();
        bare.command = vec!["/bin/server".into(), "--port".into(), "80".into()];
        bare.image.config.working_dir = "/srv".into();
        bare.image.config.env = vec!["LANG=C".into()];
        bare.env = vec![("PORT".into(), "9000".into())];
        bare.volumes = vec![];
        bare.mounts = vec![];
        bare.resources = Resources {
            cpu_millis: 0,
            memory_bytes: 0,
        };
        let mut pod = spec();
        pod.sidecars = vec![
            SidecarSpec {
                name: "side".into(),
                image: UnpackedImage {
                    manifest_digest: "sha256:01".into(),
                    rootfs: "/cache/y/rootfs".into(),
                    config: ImageConfig {
                        entrypoint: vec!["/side".into()],
                        cmd: vec!["-v".into()],
                        env: vec![],
                        working_dir: "/w".into(),
                    },
                },
                command: vec![],
                env: vec![("MODE".into(), "x".into())],
                exit_policy: ExitPolicy::Ignore,
                mounts: vec![Volume {
                    name: "data".into(),
                    mount_path: "/srv/data".into(),
                }],
            },
            SidecarSpec {
                name: "logs".into(),
                image: spec().image,
                command: vec!["/tail".into()],
                env: vec![],
                exit_policy: ExitPolicy::Stop,
                mounts: vec![],
            },
        ];
        let mut pod_memory_only = pod.clone();
        pod_memory_only.resources.cpu_millis = 0;
        vec![
            ("single", actor.clone(), spec(), false, shared_criu),
            ("single-restoring", actor.clone(), spec(), true, shared_criu),
            ("bare", actor.clone(), bare.clone(), false, shared_criu),
            ("bare-restoring", actor.clone(), bare, true, shared_criu),
            ("sidecars", actor.clone(), pod, false, own_criu),
            ("sidecars-restoring", actor, pod_memory_only, true, own_criu),
        ]
    }

    fn fixture_path(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/runc/testdata")
            .join(format!("{name}.json"))
    }

    /// The config as compared with a fixture: capability sets sorted (they are sets; their
    /// order means nothing to runc), and the seccomp architectures of this build in place of
    /// the fixtures' x86_64 ones.
    fn normalized(mut config: Value) -> Value {
        if let Some(caps) = config
            .pointer_mut("/process/capabilities")
            .and_then(Value::as_object_mut)
        {
            for set in caps.values_mut() {
                if let Some(list) = set.as_array_mut() {
                    list.sort_by_key(|c| c.as_str().map(str::to_string));
                }
            }
        }
        if let Some(seccomp) = config
            .pointer_mut("/linux/seccomp")
            .and_then(Value::as_object_mut)
        {
            seccomp.remove("architectures");
        }
        config
    }

    /// `config.json` field for field as the untyped (`serde_json::json!`) builder wrote it
    /// before the config was built from `oci-spec` types: the fixtures are its output.
    #[test]
    fn config_matches_the_fixtures() {
        for (name, actor, spec, restoring, criu_conf) in fixture_cases() {
            let config = oci_config(&actor, &spec, restoring, Path::new(criu_conf));
            let config = serde_json::to_value(&config).unwrap();
            let path = fixture_path(name);
            let expected: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            if std::env::consts::ARCH == "x86_64" {
                assert_eq!(
                    config["linux"]["seccomp"]["architectures"],
                    expected["linux"]["seccomp"]["architectures"],
                    "{name}"
                );
            }
            assert_eq!(normalized(config), normalized(expected), "{name}");
        }
    }

    #[test]
    fn env_merges_template_over_image() {
        assert_eq!(build_env(&spec()), vec!["PATH=/bin", "A=2", "PORT=8080"]);
    }

    #[test]
    fn config_has_netns_path_and_limits() {
        let actor = ActorSandbox::new("team", "c1", "u1", "/var/lib/ate/actors/c1");
        let c = oci_config(&actor, &spec(), false, Path::new("/var/lib/ate/criu.conf"));
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
}
