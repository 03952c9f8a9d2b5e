//! From a [`SandboxSpec`] to runc's OCI config: checking the spec, the container's command
//! line and environment, the `config.json` value, and runc's "could not exec" errors put in
//! the template's terms.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCpuBuilder, LinuxDeviceCgroupBuilder, LinuxMemoryBuilder,
    LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder, LinuxResources,
    LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType,
    ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use super::cgroup::{CGROUP_PARENT, CPU_PERIOD_US, cpu_quota_us};
use crate::error::{Result, SandboxError};
use crate::hardening::{self, oci_error};
use crate::image::ImageConfig;
use crate::netns;
use crate::runtime::{ActorSandbox, SandboxSpec};
use crate::sidecars;

const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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

/// `options` of the mounts the first container and each sidecar get alike.
pub(crate) const DEV_OPTIONS: &[&str] = &["nosuid", "strictatime", "mode=755", "size=65536k"];
pub(crate) const SHM_OPTIONS: &[&str] = &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"];
pub(crate) const SYSFS_OPTIONS: &[&str] = &["nosuid", "noexec", "nodev", "ro"];
pub(crate) const IDENTITY_OPTIONS: &[&str] = &["bind", "ro", "nosuid", "nodev", "noexec"];
pub(crate) const VOLUME_OPTIONS: &[&str] = &["rbind", "rw", "nosuid", "nodev"];

/// One entry of `mounts`.
pub(crate) fn mount(
    destination: impl Into<PathBuf>,
    typ: &str,
    source: impl Into<PathBuf>,
    options: &[&str],
) -> Result<Mount> {
    let mut m = MountBuilder::default()
        .destination(destination)
        .typ(typ)
        .source(source);
    if !options.is_empty() {
        m = m.options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>());
    }
    m.build().map_err(oci_error)
}

/// The OCI runtime config (`config.json`): runc's default mounts plus the actor's process,
/// namespaces (network by path), volumes, identity dir and limits, the security fields of
/// [`hardening`] (capabilities, no-new-privs, seccomp, masked/read-only paths, pids limit), and
/// for an actor with sidecars what [`sidecars`] changes (`ate-init` as the process, each
/// sidecar's mounts and masks, `chroot` allowed).
/// With `restoring`, the CPU quota is explicitly unlimited (see `RuncRuntime::prepare`);
/// `criu_conf` is the CRIU options file runc hands CRIU (its `org.criu.config` annotation).
///
/// Every part is built explicitly: oci-spec's builders fill what is left unset with their
/// defaults (runc's mounts, capabilities, masked paths, …), which are not this config.
pub(super) fn oci_config(
    actor: &ActorSandbox,
    spec: &SandboxSpec,
    restoring: bool,
    criu_conf: &Path,
) -> Result<Spec> {
    let pod = !spec.sidecars.is_empty();
    let (args, env, cwd, extra_caps) = if pod {
        // ate-init keeps CAP_SYS_CHROOT for its chroots only: it takes it away from every
        // container it starts (no_new_privs keeps an exec from giving it back).
        let init = vec![
            sidecars::INIT_PATH.to_string(),
            sidecars::PLAN_PATH.to_string(),
        ];
        (
            init,
            vec![DEFAULT_PATH.to_string()],
            "/".to_string(),
            vec![Capability::SysChroot],
        )
    } else {
        let cwd = match spec.image.config.working_dir.as_str() {
            "" => "/",
            dir => dir,
        };
        (process_args(spec), build_env(spec), cwd.to_string(), vec![])
    };
    let nofile = PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .hard(1024u64)
        .soft(1024u64)
        .build()
        .map_err(oci_error)?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(0u32)
                .gid(0u32)
                .build()
                .map_err(oci_error)?,
        )
        .args(args)
        .env(env)
        .cwd(cwd)
        .rlimits(vec![nofile])
        .capabilities(hardening::capabilities(&extra_caps))
        .no_new_privileges(true)
        .build()
        .map_err(oci_error)?;

    let mut mounts = vec![
        mount("/proc", "proc", "proc", &[])?,
        mount("/dev", "tmpfs", "tmpfs", DEV_OPTIONS)?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount("/dev/shm", "tmpfs", "shm", SHM_OPTIONS)?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount("/sys", "sysfs", "sysfs", SYSFS_OPTIONS)?,
        // No /sys/fs/cgroup mount (runc's default has one): workloads don't need it and it is
        // one more mount CRIU would have to carry.
        mount("/etc/ate", "bind", actor.identity_dir(), IDENTITY_OPTIONS)?,
    ];
    for m in &spec.mounts {
        mounts.push(mount(
            &m.mount_path,
            "bind",
            actor.volume_dir(&m.name),
            VOLUME_OPTIONS,
        )?);
    }
    for s in &spec.sidecars {
        mounts.extend(sidecars::sidecar_mounts(actor, s)?);
    }

    let linux = LinuxBuilder::default()
        .cgroups_path(format!("/{CGROUP_PARENT}/{}", actor.short_id()))
        .resources(resources(spec, restoring)?)
        .namespaces(namespaces(actor)?)
        .seccomp(if pod {
            hardening::seccomp_allowing_chroot()?
        } else {
            hardening::seccomp()?
        })
        .masked_paths(sidecars::under_each_root(hardening::MASKED_PATHS, spec))
        .readonly_paths(sidecars::under_each_root(hardening::READONLY_PATHS, spec))
        .build()
        .map_err(oci_error)?;

    let root = RootBuilder::default()
        .path(actor.rootfs_dir())
        .readonly(false)
        .build()
        .map_err(oci_error)?;
    // runc hands this file to CRIU on checkpoint and restore (its `org.criu.config`
    // annotation): per-actor CRIU options without touching /etc/criu.
    let annotations = HashMap::from([(
        "org.criu.config".to_string(),
        criu_conf.to_string_lossy().into_owned(),
    )]);
    SpecBuilder::default()
        .version("1.0.2-dev")
        .process(process)
        .root(root)
        .hostname(actor.name.clone())
        .mounts(mounts)
        .linux(linux)
        .annotations(annotations)
        .build()
        .map_err(oci_error)
}

/// `linux.resources`: no device access, the memory limit and CPU quota when the template sets
/// them (while restoring, explicitly no quota: a cgroup left by an earlier life of this actor,
/// same name, would otherwise keep its old quota and throttle CRIU anyway), the pids limit.
fn resources(spec: &SandboxSpec, restoring: bool) -> Result<LinuxResources> {
    let no_devices = LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build()
        .map_err(oci_error)?;
    let pids = LinuxPidsBuilder::default()
        .limit(hardening::PIDS_LIMIT)
        .build()
        .map_err(oci_error)?;
    let mut resources = LinuxResourcesBuilder::default()
        .devices(vec![no_devices])
        .pids(pids);
    if spec.resources.memory_bytes > 0 {
        let limit = i64::try_from(spec.resources.memory_bytes).map_err(|_| {
            SandboxError::Invalid(format!(
                "memory limit {} bytes is too large",
                spec.resources.memory_bytes
            ))
        })?;
        let memory = LinuxMemoryBuilder::default()
            .limit(limit)
            .build()
            .map_err(oci_error)?;
        resources = resources.memory(memory);
    }
    let quota = if restoring {
        Some(-1)
    } else {
        // At most u32::MAX millis × 100 µs: always an i64.
        cpu_quota_us(spec).and_then(|q| i64::try_from(q).ok())
    };
    if let Some(quota) = quota {
        let cpu = LinuxCpuBuilder::default()
            .quota(quota)
            .period(CPU_PERIOD_US)
            .build()
            .map_err(oci_error)?;
        resources = resources.cpu(cpu);
    }
    resources.build().map_err(oci_error)
}

/// `linux.namespaces`: new pid, ipc, uts and mount namespaces; the network namespace the worker
/// made for the actor (by path).
fn namespaces(actor: &ActorSandbox) -> Result<Vec<LinuxNamespace>> {
    let new = |typ| LinuxNamespaceBuilder::default().typ(typ).build();
    let network = LinuxNamespaceBuilder::default()
        .typ(LinuxNamespaceType::Network)
        .path(netns::netns_path(&actor.netns()))
        .build();
    [
        new(LinuxNamespaceType::Pid),
        network,
        new(LinuxNamespaceType::Ipc),
        new(LinuxNamespaceType::Uts),
        new(LinuxNamespaceType::Mount),
    ]
    .into_iter()
    .map(|ns| ns.map_err(oci_error))
    .collect()
}

/// The first container's command line (see [`command_line`]).
pub(crate) fn process_args(spec: &SandboxSpec) -> Vec<String> {
    command_line(&spec.command, &spec.image.config)
}

/// A container's command line: the template's `command` when it has one, else the image's
/// Entrypoint followed by its Cmd.
pub(crate) fn command_line(command: &[String], image: &ImageConfig) -> Vec<String> {
    if command.is_empty() {
        image.entrypoint.iter().chain(&image.cmd).cloned().collect()
    } else {
        command.to_vec()
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
    use crate::image::UnpackedImage;
    use crate::runtime::SidecarSpec;
    use ate_core::template::{ExitPolicy, Resources, Volume};
    use serde_json::{Value, json};

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
            let config = config_value(&actor, &spec, restoring, criu_conf);
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
        let c = config_value(&actor, &spec(), false, "/var/lib/ate/criu.conf");
        let ns = &c["linux"]["namespaces"][1];
        assert_eq!(ns["type"], "network");
        assert_eq!(ns["path"], format!("/var/run/netns/{}", actor.netns()));
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 64u64 << 20);
        assert_eq!(c["process"]["args"], json!(["/counter"]));
        assert_eq!(c["root"]["path"], "/var/lib/ate/actors/c1/rootfs");
        assert_eq!(c["process"]["noNewPrivileges"], true);
        let seccomp = serde_json::to_value(hardening::seccomp().unwrap()).unwrap();
        assert_eq!(c["linux"]["seccomp"], seccomp);
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(
                c["process"]["capabilities"][set],
                json!(["CAP_NET_BIND_SERVICE"])
            );
        }
        assert!(c["process"]["capabilities"]["inheritable"].is_null());
        assert!(c["process"]["capabilities"]["ambient"].is_null());
        assert_eq!(
            c["linux"]["resources"]["pids"]["limit"],
            hardening::PIDS_LIMIT
        );
        assert_eq!(c["linux"]["maskedPaths"], json!(hardening::MASKED_PATHS));
        assert_eq!(
            c["linux"]["readonlyPaths"],
            json!(hardening::READONLY_PATHS)
        );
    }

    fn config_value(
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        restoring: bool,
        criu_conf: &str,
    ) -> Value {
        let config = oci_config(actor, spec, restoring, Path::new(criu_conf)).unwrap();
        serde_json::to_value(&config).unwrap()
    }

    #[test]
    fn the_config_runs_init_with_each_sidecars_mounts_and_masks() {
        let (_, actor, s, _, _) = fixture_cases().remove(4);
        let config = config_value(&actor, &s, false, "/criu.conf");
        assert!(
            config["process"]["capabilities"]["effective"]
                .as_array()
                .unwrap()
                .contains(&json!("CAP_SYS_CHROOT"))
        );
        assert_eq!(
            config["process"]["args"],
            json!([sidecars::INIT_PATH, sidecars::PLAN_PATH])
        );
        let dests: Vec<&str> = config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["destination"].as_str())
            .collect();
        for d in [
            "/.ate/containers/side",
            "/.ate/containers/side/proc",
            "/.ate/containers/side/dev/null",
            "/.ate/containers/side/etc/ate",
            "/.ate/containers/side/srv/data",
        ] {
            assert!(dests.contains(&d), "{d} not mounted: {dests:?}");
        }
        assert!(!dests.contains(&"/.ate/containers/side/data"), "{dests:?}");
        let masked = config["linux"]["maskedPaths"].as_array().unwrap();
        assert!(masked.contains(&json!("/.ate/containers/side/proc/kcore")));
        assert!(masked.contains(&json!("/proc/kcore")));
        let denied = config["linux"]["seccomp"]["syscalls"][0]["names"]
            .as_array()
            .unwrap();
        assert!(!denied.contains(&json!("chroot")));
        assert!(denied.contains(&json!("pivot_root")));
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
