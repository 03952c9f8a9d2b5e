//! The actor's bundle, made before runc runs: its directories, overlay rootfs (and each
//! sidecar's), identity files, network namespace and `config.json`.

use std::time::Instant;

use super::RuncRuntime;
use super::criu::CRIU_OPTIONS_SIDECARS;
use super::files::remove_dir_if_exists;
use super::mounts::{mount_overlay, unmount_if_mounted};
use super::oci::{build_env, oci_config, process_args, validate_spec};
use crate::error::{IoContext, Result, SandboxError};
use crate::runtime::{ActorSandbox, SandboxSpec};
use crate::sidecars;

impl RuncRuntime {
    /// Directories, overlay, identity files, netns and `config.json`: everything before runc.
    /// With `restoring`, the config carries no CPU quota: runc runs CRIU inside the container's
    /// cgroup, so the restore itself would be throttled to the actor's share (a 250m actor's
    /// 50 MiB restore took ~0.45 s instead of ~0.1 s); [`apply_cpu_quota`] sets it afterwards.
    pub(super) async fn prepare(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        fresh_upper: bool,
        restoring: bool,
    ) -> Result<()> {
        validate_spec(actor, spec)?;
        let begun = Instant::now();
        let dir = &actor.dir;
        tokio::fs::create_dir_all(dir)
            .await
            .ctx(|| format!("create {}", dir.display()))?;
        if fresh_upper {
            remove_dir_if_exists(&actor.upper_dir()).await?;
            for s in &spec.sidecars {
                remove_dir_if_exists(&actor.container_upper_dir(&s.name)).await?;
            }
        }
        // Overlay refuses a work dir left over from another mount; it is scratch space anyway.
        remove_dir_if_exists(&actor.work_dir()).await?;
        for d in [
            actor.upper_dir(),
            actor.work_dir(),
            actor.rootfs_dir(),
            actor.identity_dir(),
        ] {
            tokio::fs::create_dir_all(&d)
                .await
                .ctx(|| format!("create {}", d.display()))?;
        }
        for v in &spec.volumes {
            let d = actor.volume_dir(&v.name);
            tokio::fs::create_dir_all(&d)
                .await
                .ctx(|| format!("create {}", d.display()))?;
        }
        write_identity(actor).await?;
        if !spec.sidecars.is_empty() && !restoring {
            // A process starts fresh from these (a memory restore keeps the bytes it maps).
            let plan = sidecars::plan(spec, &process_args(spec), &build_env(spec));
            sidecars::write_init(&actor.upper_dir(), &plan).await?;
        }
        for s in &spec.sidecars {
            let dir = actor.container_dir(&s.name);
            let work = dir.join("work");
            remove_dir_if_exists(&work).await?;
            for d in [
                actor.container_upper_dir(&s.name),
                work.clone(),
                actor.container_rootfs_dir(&s.name),
            ] {
                tokio::fs::create_dir_all(&d)
                    .await
                    .ctx(|| format!("create {}", d.display()))?;
            }
            unmount_if_mounted(&actor.container_rootfs_dir(&s.name))?;
            mount_overlay(
                &s.image.rootfs,
                &actor.container_upper_dir(&s.name),
                &work,
                &actor.container_rootfs_dir(&s.name),
            )?;
        }
        let dirs_done = begun.elapsed();
        mount_overlay(
            &spec.image.rootfs,
            &actor.upper_dir(),
            &actor.work_dir(),
            &actor.rootfs_dir(),
        )?;
        let overlay_done = begun.elapsed();
        let criu_conf = if spec.sidecars.is_empty() {
            self.criu_conf.clone()
        } else {
            let path = dir.join("criu.conf");
            tokio::fs::write(&path, CRIU_OPTIONS_SIDECARS)
                .await
                .ctx(|| format!("write {}", path.display()))?;
            path
        };
        let config = oci_config(actor, spec, restoring, &criu_conf)?;
        let bytes =
            serde_json::to_vec_pretty(&config).map_err(|e| SandboxError::Invalid(e.to_string()))?;
        let path = dir.join("config.json");
        tokio::fs::write(&path, bytes)
            .await
            .ctx(|| format!("write {}", path.display()))?;
        let config_done = begun.elapsed();
        self.netns_pool.create(&actor.netns()).await?;
        tracing::debug!(
            container = %actor.container_id(),
            dirs_us = dirs_done.as_micros() as u64,
            overlay_us = (overlay_done - dirs_done).as_micros() as u64,
            config_us = (config_done - overlay_done).as_micros() as u64,
            netns_us = (begun.elapsed() - config_done).as_micros() as u64,
            "sandbox prepared"
        );
        Ok(())
    }
}

/// Identity files are rewritten on every run and restore, in a host dir bind-mounted at
/// `/etc/ate` — so a restored golden snapshot reads the new actor's identity and the dump never
/// contains them. Written via rename so a reader never sees half a file.
async fn write_identity(actor: &ActorSandbox) -> Result<()> {
    let dir = actor.identity_dir();
    for (file, value) in [
        ("actor-name", &actor.name),
        ("atespace", &actor.atespace),
        ("uid", &actor.uid),
    ] {
        let tmp = dir.join(format!(".{file}.tmp"));
        let dst = dir.join(file);
        tokio::fs::write(&tmp, value.as_bytes())
            .await
            .ctx(|| format!("write {}", tmp.display()))?;
        tokio::fs::rename(&tmp, &dst)
            .await
            .ctx(|| format!("rename {}", dst.display()))?;
    }
    Ok(())
}
