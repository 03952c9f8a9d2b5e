//! The actor's bundle, made before runc runs: its directories, overlay rootfs (and each
//! sidecar's), identity files, network namespace and `config.json`.

use std::time::Instant;

use super::RuncRuntime;
use super::criu::{ACTOR_CRIU_CONF, CRIU_LAZY_WP_OPTION, CRIU_STREAM_OPTION, criu_options};
use super::external;
use super::files::remove_dir_if_exists;
use super::mounts::{mount_overlay, unmount_below, unmount_if_mounted};
use super::oci::{build_env, oci_config, process_args, validate_spec};
use super::userns;
use crate::error::{IoContext, Result, SandboxError};
use crate::runtime::{ActorSandbox, SandboxSpec};
use crate::sidecars;

/// How [`RuncRuntime::prepare`] makes a sandbox's bundle.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Bundle {
    /// A new, empty upper dir (a cold start); otherwise the actor's files stay.
    pub fresh_upper: bool,
    /// For `runc restore`: the config carries no CPU quota (runc runs CRIU inside the
    /// container's cgroup, so the restore itself would be throttled to the actor's share: a
    /// 250m actor's 50 MiB restore took ~0.45 s instead of ~0.1 s); [`apply_cpu_quota`] sets it
    /// afterwards.
    pub restoring: bool,
    /// The sandbox gets its own user namespace (see [`userns`]): a claimed uid range, idmapped
    /// layers, and runc making the netns (set up by the config's hook).
    pub in_userns: bool,
    /// CRIU reads the memory images from the image streamer (option `stream`).
    pub stream_images: bool,
    /// A lazy restore that tracks writes (option `lazy-pages-wp`).
    pub track_memory: bool,
}

impl RuncRuntime {
    /// Directories, overlay, identity files, netns and `config.json`: everything before runc.
    /// Returns the user namespace range's base when the sandbox gets one.
    pub(super) async fn prepare(
        &self,
        actor: &ActorSandbox,
        spec: &SandboxSpec,
        how: Bundle,
    ) -> Result<Option<u32>> {
        let Bundle {
            fresh_upper,
            restoring,
            in_userns,
            stream_images,
            track_memory,
        } = how;
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
        for v in spec.volumes.iter().filter(|v| v.external.is_none()) {
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
        }
        let dirs_done = begun.elapsed();
        let base = if in_userns {
            Some(self.idmapped_overlays(actor, spec)?)
        } else {
            userns::release(&self.userns_claims, &actor.dir);
            for s in &spec.sidecars {
                mount_overlay(
                    &s.image.rootfs,
                    &actor.container_upper_dir(&s.name),
                    &actor.container_dir(&s.name).join("work"),
                    &actor.container_rootfs_dir(&s.name),
                )?;
            }
            mount_overlay(
                &spec.image.rootfs,
                &actor.upper_dir(),
                &actor.work_dir(),
                &actor.rootfs_dir(),
            )?;
            None
        };
        external::attach(actor, spec, base)?;
        let overlay_done = begun.elapsed();
        let criu_conf = if spec.sidecars.is_empty() && !stream_images && !track_memory {
            self.criu_conf.clone()
        } else {
            // The actor's own options file. A streamed restore's names `stream`, which the
            // dumps of the restored sandbox must not (runc keeps the annotation): see
            // `criu::options_for_dumps`.
            let path = dir.join(ACTOR_CRIU_CONF);
            let mut options = criu_options(spec).to_string();
            if stream_images {
                options.push_str(CRIU_STREAM_OPTION);
                options.push('\n');
            }
            if track_memory {
                options.push_str(CRIU_LAZY_WP_OPTION);
                options.push('\n');
            }
            tokio::fs::write(&path, options)
                .await
                .ctx(|| format!("write {}", path.display()))?;
            path
        };
        let config = oci_config(actor, spec, restoring, &criu_conf)?;
        let mut config =
            serde_json::to_value(&config).map_err(|e| SandboxError::Invalid(e.to_string()))?;
        match base {
            Some(base) => in_own_userns(&mut config, actor, base),
            // The netns exists already (made below, before runc runs): the hook only waits
            // for the worker's egress.
            None => {
                if let Some(o) = config.as_object_mut() {
                    o.insert(
                        "hooks".into(),
                        serde_json::json!({"createRuntime": [{
                            "path": "/bin/sh",
                            "args": ["sh", "-c", ate_egress::gate::HOOK, "ate-egress-gate",
                                actor.egress_gate_dir()],
                            "env": [HOOK_PATH],
                            "timeout": HOOK_TIMEOUT_SECONDS,
                        }]}),
                    );
                }
            }
        }
        let bytes =
            serde_json::to_vec_pretty(&config).map_err(|e| SandboxError::Invalid(e.to_string()))?;
        let path = dir.join("config.json");
        tokio::fs::write(&path, bytes)
            .await
            .ctx(|| format!("write {}", path.display()))?;
        let config_done = begun.elapsed();
        if base.is_none() {
            self.netns_pool.create(&actor.netns()).await?;
        }
        tracing::debug!(
            container = %actor.container_id(),
            dirs_us = dirs_done.as_micros() as u64,
            overlay_us = (overlay_done - dirs_done).as_micros() as u64,
            config_us = (config_done - overlay_done).as_micros() as u64,
            netns_us = (begun.elapsed() - config_done).as_micros() as u64,
            userns_base = ?base,
            "sandbox prepared"
        );
        Ok(base)
    }

    /// The actor's overlays on idmapped layers (see [`userns`]): claims its range, lets the
    /// range reach the actor dir, attaches idmapped clones of the image layers and of the actor
    /// dir under `<actor>/idmap/`, and mounts each overlay as the range's root.
    fn idmapped_overlays(&self, actor: &ActorSandbox, spec: &SandboxSpec) -> Result<u32> {
        let base = userns::claim(&self.userns_claims, &actor.dir)?;
        userns::open_path_for(base, &actor.dir)?;
        let idmap = actor.dir.join(userns::IDMAP_DIR);
        unmount_below(&idmap);
        let own = idmap.join("self");
        let lower = |name: &str| idmap.join(format!("lower-{name}"));
        let mut points = vec![own.clone(), lower("")];
        points.extend(spec.sidecars.iter().map(|s| lower(&s.name)));
        for d in &points {
            std::fs::create_dir_all(d).ctx(|| format!("create {}", d.display()))?;
        }
        let ns = userns::mapping_userns(base)?;
        userns::idmapped_clone(&ns, &actor.dir, &own)?;
        userns::idmapped_clone(&ns, &spec.image.rootfs, &lower(""))?;
        let under_own = |p: std::path::PathBuf| match p.strip_prefix(&actor.dir) {
            Ok(rel) => own.join(rel),
            Err(_) => p,
        };
        for s in &spec.sidecars {
            userns::idmapped_clone(&ns, &s.image.rootfs, &lower(&s.name))?;
            userns::mount_overlay_as(
                base,
                &lower(&s.name),
                &under_own(actor.container_upper_dir(&s.name)),
                &under_own(actor.container_dir(&s.name).join("work")),
                &actor.container_rootfs_dir(&s.name),
            )?;
        }
        userns::mount_overlay_as(
            base,
            &lower(""),
            &under_own(actor.upper_dir()),
            &under_own(actor.work_dir()),
            &actor.rootfs_dir(),
        )?;
        Ok(base)
    }
}

/// `PATH` of the `createRuntime` hooks (`sh`, `ip`, `mount`).
const HOOK_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// runc kills a hook that takes longer and fails the start: the egress gate's wait included.
const HOOK_TIMEOUT_SECONDS: u32 = 10;

/// `config.json` for a sandbox in its own user namespace mapped to `base`…: a new user
/// namespace with that mapping and a new network namespace (runc makes both: the netns is
/// owned by the user namespace), the `createRuntime` hook that binds the netns at
/// `/var/run/netns/<name>` and sets it up from outside (at `runc run`, and at CRIU's
/// `setup-namespaces` step of a restore), volume binds from the idmapped clone of the actor dir.
fn in_own_userns(config: &mut serde_json::Value, actor: &ActorSandbox, base: u32) {
    use serde_json::json;
    let netns = actor.netns();
    let addr = format!("{}/32", ate_netns::ACTOR_IP);
    let map = json!([{"containerID": 0, "hostID": base, "size": userns::RANGE_SIZE}]);
    if let Some(linux) = config.get_mut("linux").and_then(|l| l.as_object_mut()) {
        if let Some(nss) = linux.get_mut("namespaces").and_then(|n| n.as_array_mut()) {
            for ns in nss.iter_mut() {
                if let Some(o) = ns.as_object_mut() {
                    o.remove("path");
                }
            }
            nss.push(json!({"type": "user"}));
        }
        linux.insert("uidMappings".into(), map.clone());
        linux.insert("gidMappings".into(), map);
        // runc moves CRIU into the container's cgroup for a restore, so the device filter
        // applies to CRIU too: let it open /dev/userfaultfd for a lazy restore (see
        // `userns::lazy_restore_in_userns`). No device node is made in the container, and a
        // task in the user namespace cannot make one.
        let devices = linux
            .get_mut("resources")
            .and_then(|r| r.get_mut("devices"))
            .and_then(|d| d.as_array_mut());
        if let (Some(devices), Some((major, minor))) = (devices, userns::userfaultfd_device()) {
            devices.push(json!({
                "allow": true, "type": "c", "access": "rw", "major": major, "minor": minor,
            }));
        }
    }
    if let Some(o) = config.as_object_mut() {
        o.insert(
            "hooks".into(),
            json!({"createRuntime": [{
                "path": "/bin/sh",
                "args": [
                    "sh", "-c", userns::netns_hook(), "ate-netns-hook", netns,
                    ate_netns::link_batch(&addr, !ate_netns::dummy_links()),
                    ate_netns::link_batch(&addr, true),
                    actor.egress_gate_dir(),
                ],
                "env": [HOOK_PATH],
                "timeout": HOOK_TIMEOUT_SECONDS,
            }]}),
        );
    }
    let volumes = actor.volumes_dir().to_string_lossy().into_owned();
    let own_volumes = actor
        .dir
        .join(userns::IDMAP_DIR)
        .join("self")
        .join("volumes")
        .to_string_lossy()
        .into_owned();
    if let Some(mounts) = config.get_mut("mounts").and_then(|m| m.as_array_mut()) {
        for m in mounts {
            if let Some(src) = m.get("source").and_then(|s| s.as_str())
                && let Some(rest) = src.strip_prefix(&volumes)
                && (rest.is_empty() || rest.starts_with('/'))
            {
                m["source"] = json!(format!("{own_volumes}{rest}"));
            }
        }
    }
}

/// `/etc/ate/platform`: the platform's URL inside every actor (`ate_core::platform`).
const PLATFORM_URL: &str = "http://169.254.17.1";

/// Identity files are rewritten on every run and restore, in a host dir bind-mounted at
/// `/etc/ate` — so a restored golden snapshot reads the new actor's identity and the dump never
/// contains them. Written via rename so a reader never sees half a file.
async fn write_identity(actor: &ActorSandbox) -> Result<()> {
    let dir = actor.identity_dir();
    for (file, value) in [
        ("actor-name", actor.name.as_str()),
        ("atespace", actor.atespace.as_str()),
        ("uid", actor.uid.as_str()),
        // Where the platform is (local actor API, calls to other actors), for workloads that
        // would rather read it than hard-code it.
        ("platform", PLATFORM_URL),
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
