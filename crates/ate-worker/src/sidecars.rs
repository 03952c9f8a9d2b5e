//! Actors with several containers: one sandbox (one runc container, cgroup, netns and CRIU
//! process tree) holds them all, as a gVisor sandbox holds a pod. Its PID 1 is `ate-init`
//! (`init/main.rs`, built static by `build.rs` and embedded here): it runs the first container on
//! the sandbox root (that container's own rootfs, as for a single-container actor) and each
//! sidecar chrooted into its own rootfs, bind-mounted at `/.ate/containers/<name>` with its own
//! `/proc`, `/dev`, `/sys`, identity files and volumes.
//!
//! Because the whole actor is one process tree, everything built for one container (memory
//! snapshots, lazy restores, the frozen-in-place tier, adoption after a worker restart, exit
//! detection) works unchanged; only the sidecars' upper dirs are archived separately
//! (`containers/<name>/rootfs.tar` in a generation).
//!
//! Architecture invariant: the containers of one actor are one trust domain (like a Kubernetes
//! pod's); chroot separates their file views, not their privileges. The sandbox's boundary
//! (namespaces, seccomp, capabilities, cgroup) is the one a single-container actor has, except
//! that `chroot` is allowed for `ate-init`, which drops CAP_SYS_CHROOT from every container.

use std::path::Path;

use oci_spec::runtime::Mount;

use crate::error::{Result, SandboxError};
use crate::runc::{
    DEV_OPTIONS, IDENTITY_OPTIONS, SHM_OPTIONS, SYSFS_OPTIONS, VOLUME_OPTIONS, command_line, mount,
};
use crate::runtime::{ActorSandbox, SandboxSpec, SidecarSpec};

/// The static `ate-init` executable (see `build.rs`).
const INIT_BINARY: &[u8] = include_bytes!(env!("ATE_INIT_PATH"));
/// Where `ate-init` and its plan live in the first container's rootfs (written into its upper
/// dir at a cold start, so a memory snapshot carries the exact bytes its PID 1 maps).
pub const INIT_DIR: &str = ".ate";
pub const INIT_PATH: &str = "/.ate/init";
pub const PLAN_PATH: &str = "/.ate/plan";
/// Where sidecar `name`'s rootfs appears inside the sandbox.
pub fn container_root(name: &str) -> String {
    format!("/.ate/containers/{name}")
}

/// Device nodes bound into each sidecar's `/dev` (those runc gives the first container).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The sidecar's command: the template's, else its image's Entrypoint + Cmd.
pub fn sidecar_args(s: &SidecarSpec) -> Vec<String> {
    command_line(&s.command, &s.image.config)
}

/// One container as `ate-init` starts it.
struct PlanEntry<'a> {
    name: &'a str,
    exit: &'a str,
    /// Empty for the first container (the sandbox root).
    root: String,
    cwd: &'a str,
    args: Vec<String>,
    env: Vec<String>,
}

impl PlanEntry<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut word = |w: &str| {
            out.extend_from_slice(w.as_bytes());
            out.push(0);
        };
        for (k, v) in [
            ("container", self.name),
            ("exit", self.exit),
            ("root", self.root.as_str()),
            ("cwd", self.cwd),
        ] {
            word(k);
            word(v);
        }
        for a in &self.args {
            word("arg");
            word(a);
        }
        for e in &self.env {
            word("env");
            word(e);
        }
        word("end");
    }
}

/// `ate-init`'s plan: NUL-terminated words, the first container first (see `init/main.rs`).
pub fn plan(spec: &SandboxSpec, first_args: &[String], first_env: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    PlanEntry {
        name: &spec.name,
        exit: spec.exit_policy.as_str(),
        root: String::new(),
        cwd: &spec.image.config.working_dir,
        args: first_args.to_vec(),
        env: first_env.to_vec(),
    }
    .write(&mut out);
    for s in &spec.sidecars {
        PlanEntry {
            name: &s.name,
            exit: s.exit_policy.as_str(),
            root: container_root(&s.name),
            cwd: &s.image.config.working_dir,
            args: sidecar_args(s),
            env: crate::runc::merge_env(&s.image.config.env, &s.env, None),
        }
        .write(&mut out);
    }
    out
}

/// Writes `ate-init` and its plan into the first container's upper dir (before its overlay is
/// mounted), replacing what an earlier start left there.
pub async fn write_init(upper: &Path, plan: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = upper.join(INIT_DIR);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| SandboxError::io(format!("create {}", dir.display()), e))?;
    for (file, bytes, mode) in [("init", INIT_BINARY, 0o755), ("plan", plan, 0o600)] {
        let tmp = dir.join(format!(".{file}.tmp"));
        let dst = dir.join(file);
        tokio::fs::write(&tmp, bytes)
            .await
            .map_err(|e| SandboxError::io(format!("write {}", tmp.display()), e))?;
        tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
            .await
            .map_err(|e| SandboxError::io(format!("chmod {}", tmp.display()), e))?;
        tokio::fs::rename(&tmp, &dst)
            .await
            .map_err(|e| SandboxError::io(format!("rename {}", dst.display()), e))?;
    }
    Ok(())
}

/// `paths` (absolute in the first container), then the same under each sidecar's root: the
/// masked and read-only `/proc` and `/sys` paths hold in every container of the actor.
pub fn under_each_root(paths: &[&str], spec: &SandboxSpec) -> Vec<String> {
    let roots =
        std::iter::once(String::new()).chain(spec.sidecars.iter().map(|s| container_root(&s.name)));
    roots
        .flat_map(|root| paths.iter().map(move |p| format!("{root}{p}")))
        .collect()
}

/// A sidecar's rootfs at `/.ate/containers/<name>` and, inside it, what runc gives the first
/// container: proc, a tmpfs `/dev` with the usual device nodes and `/dev/shm`, a read-only
/// sysfs, the identity files and the template's volumes.
pub fn sidecar_mounts(
    actor: &ActorSandbox,
    volumes: &[ate_core::template::Volume],
    sidecar: &SidecarSpec,
) -> Result<Vec<Mount>> {
    let root = container_root(&sidecar.name);
    let rootfs = actor.container_rootfs_dir(&sidecar.name);
    let mut mounts = vec![
        mount(&root, "bind", rootfs, &["rbind", "rw"])?,
        mount(format!("{root}/proc"), "proc", "proc", &[])?,
        mount(format!("{root}/dev"), "tmpfs", "tmpfs", DEV_OPTIONS)?,
    ];
    for d in DEVICES {
        let options = &["bind", "rw", "nosuid", "noexec"];
        mounts.push(mount(
            format!("{root}/dev/{d}"),
            "bind",
            format!("/dev/{d}"),
            options,
        )?);
    }
    mounts.extend([
        mount(format!("{root}/dev/shm"), "tmpfs", "shm", SHM_OPTIONS)?,
        mount(format!("{root}/sys"), "sysfs", "sysfs", SYSFS_OPTIONS)?,
        mount(
            format!("{root}/etc/ate"),
            "bind",
            actor.identity_dir(),
            IDENTITY_OPTIONS,
        )?,
    ]);
    for m in &sidecar.mounts {
        let destination = format!("{root}{}", m.mount_path);
        mounts.push(mount(
            destination,
            "bind",
            actor.volume_source(volumes, &m.name),
            VOLUME_OPTIONS,
        )?);
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ate_core::template::{ExitPolicy, Resources, Volume};
    use ate_image::{ImageConfig, UnpackedImage};

    fn image(entry: &str) -> UnpackedImage {
        UnpackedImage {
            manifest_digest: "sha256:00".into(),
            rootfs: "/cache/x/rootfs".into(),
            config: ImageConfig {
                entrypoint: vec![entry.into()],
                cmd: vec![],
                env: vec!["PATH=/bin".into()],
                working_dir: "/srv".into(),
            },
        }
    }

    fn spec() -> SandboxSpec {
        SandboxSpec {
            name: "app".into(),
            image: image("/app"),
            command: vec![],
            env: vec![],
            port: 80,
            volumes: vec![Volume {
                name: "data".into(),
                mount_path: "/data".into(),
                external: None,
            }],
            mounts: vec![],
            resources: Resources {
                cpu_millis: 500,
                memory_bytes: 64 << 20,
            },
            exit_policy: ExitPolicy::Stop,
            sidecars: vec![SidecarSpec {
                name: "side".into(),
                image: image("/side"),
                command: vec![],
                env: vec![("MODE".into(), "x".into())],
                exit_policy: ExitPolicy::Ignore,
                mounts: vec![Volume {
                    name: "data".into(),
                    mount_path: "/srv/data".into(),
                    external: None,
                }],
            }],
        }
    }

    fn words(plan: &[u8]) -> Vec<String> {
        plan.split(|b| *b == 0)
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect()
    }

    #[test]
    fn the_plan_lists_the_first_container_then_each_sidecar_chrooted() {
        let s = spec();
        let w = words(&plan(&s, &["/app".into()], &["A=1".into()]));
        let second = w.iter().rposition(|x| x == "container").unwrap();
        assert_eq!(
            &w[..8],
            [
                "container",
                "app",
                "exit",
                "stop",
                "root",
                "",
                "cwd",
                "/srv"
            ]
        );
        assert_eq!(
            &w[second..second + 8],
            [
                "container",
                "side",
                "exit",
                "ignore",
                "root",
                "/.ate/containers/side",
                "cwd",
                "/srv"
            ]
        );
        assert!(w.contains(&"MODE=x".to_string()));
        assert!(
            !w.iter().any(|x| x.starts_with("PORT=")),
            "no PORT for sidecars"
        );
    }

    /// The embedded `ate-init`, run on the host with `sh` containers (no chroot: their roots
    /// are empty): prefixed output, the exit policies, the exit code.
    #[test]
    fn init_prefixes_lines_applies_exit_policies_and_ends_with_the_stopping_containers_code() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let init = dir.path().join("init");
        std::fs::write(&init, INIT_BINARY).unwrap();
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sh =
            |script: &str| -> Vec<String> { vec!["/bin/sh".into(), "-c".into(), script.into()] };
        let path = vec!["PATH=/usr/bin:/bin".to_string()];
        let mut out = Vec::new();
        for (name, exit, script) in [
            ("app", "stop", "echo started; sleep 30"),
            ("quits", "ignore", "echo bye; exit 7"),
            (
                "side",
                "stop",
                "echo side up; sleep 0.5; echo -n last words; exit 3",
            ),
        ] {
            PlanEntry {
                name,
                exit,
                root: String::new(),
                cwd: "/",
                args: sh(script),
                env: path.clone(),
            }
            .write(&mut out);
        }
        let plan = dir.path().join("plan");
        std::fs::write(&plan, out).unwrap();
        let run = std::process::Command::new(&init)
            .arg(&plan)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&run.stdout);
        assert_eq!(run.status.code(), Some(3), "{text}");
        for line in [
            "[app] started\n",
            "[quits] bye\n",
            "[ate-init] container \"quits\" exited with status 7; the actor keeps running (its exitPolicy is ignore)\n",
            "[side] side up\n",
            "[side] last words\n[ate-init] container \"side\" exited with status 3; ending the actor (its exitPolicy is stop)\n",
            "[ate-init] container \"app\" was killed by signal 15\n",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
    }
}
