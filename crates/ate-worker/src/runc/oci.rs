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
use crate::runtime::{ActorSandbox, SandboxSpec};
use crate::sidecars;
use ate_image::ImageConfig;

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
            actor.volume_source(&spec.volumes, &m.name),
            VOLUME_OPTIONS,
        )?);
    }
    for s in &spec.sidecars {
        mounts.extend(sidecars::sidecar_mounts(actor, &spec.volumes, s)?);
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
        .path(ate_netns::netns_path(&actor.netns()))
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
mod tests;
