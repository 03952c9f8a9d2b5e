//! Teardown: everything `stop` does (and `run`/`restore` do first), so that a container, its
//! mounts, netns and cgroups are gone even after a restore ended in the middle.

use std::time::Duration;

use super::RuncRuntime;
use super::cgroup::{cgroup_processes, kill_cgroup_processes, remove_cgroups};
use super::files::remove_dir_if_exists;
use super::mounts::{unmount_below, unmount_if_mounted};
use crate::error::Result;
use crate::runtime::ActorSandbox;

/// How long a teardown waits for a killed init to exit (so it can be reaped) before it removes
/// the cgroups anyway.
const INIT_EXIT_WAIT: Duration = Duration::from_millis(500);

impl RuncRuntime {
    /// Everything `stop` does, without taking the actor lock.
    pub(super) async fn teardown(&self, actor: &ActorSandbox) -> Result<()> {
        let id = actor.container_id();
        // runc keeps a container's state in `<root>/<id>`: without it there is nothing to ask
        // runc about (spares a `runc state` process before every run and restore).
        // Leftovers of a restore ended in the middle (see `unmount_below`) first: runc cannot
        // delete a container whose state dir still has CRIU's root mounted.
        let restore_work = actor.dir.join("criu-restore");
        unmount_below(&restore_work);
        crate::lazy::watch::end_leftover(&restore_work).await;
        unmount_below(&self.root.join(&id));
        let known = tokio::fs::try_exists(self.root.join(&id))
            .await
            .unwrap_or(true);
        let status = if known { self.status(&id).await? } else { None };
        if let Some((state, _)) = &status {
            // The container may be dying on its own; kill errors are only informative.
            if let Err(e) = self.runc(&["kill", &id, "KILL"]).await {
                tracing::debug!(container = %id, error = %e, "runc kill");
            }
            // A frozen task cannot die (SIGKILL waits for the thaw), and a killed init waits
            // in the kernel for its frozen children forever: a checkpoint that died with the
            // sandbox frozen must not leave it so. Every task is killed first, so no actor code
            // runs again; then the cgroup thaws and they die.
            self.thaw_to_die(actor, state == "paused").await;
            let mut last_err = None;
            for _ in 0..20 {
                match self.runc(&["delete", "-f", &id]).await {
                    Ok(_) => {
                        last_err = None;
                        break;
                    }
                    Err(e) => {
                        if self.status(&id).await?.is_none() {
                            last_err = None;
                            break;
                        }
                        last_err = Some(e);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(e) = last_err {
                return Err(e);
            }
        }
        // Whatever is still in the sandbox's cgroups dies now. A `runc restore` killed in the
        // middle leaves runc no state to kill from (above), while CRIU — which runc moved into
        // the cgroup — can outlive it and finish restoring the tasks after this teardown: a
        // sandbox without its container, holding its netns and cgroups (the fault suite's
        // kill-in-resume found one).
        kill_cgroup_processes(&actor.short_id());
        let deadline = tokio::time::Instant::now() + INIT_EXIT_WAIT;
        while !cgroup_processes(&actor.short_id()).is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
            kill_cgroup_processes(&actor.short_id());
        }
        // A restore ended in the middle leaves runc a state dir it cannot read back (no state
        // for `runc state`, so nothing was deleted above) and a later restore would be refused
        // ("container with given ID already exists"). Its processes are gone (killed just
        // above); the dir is only runc's bookkeeping.
        let state_dir = self.root.join(&id);
        if tokio::fs::try_exists(&state_dir).await.unwrap_or(false)
            && self.status(&id).await.ok().flatten().is_none()
        {
            tracing::debug!(container = %id, "removing runc state left by an interrupted restore");
            remove_dir_if_exists(&state_dir).await?;
        }
        // The init must be reaped before its cgroups can go (a zombie still counts as a member
        // on this kernel's v1 hierarchies: rmdir says EBUSY and the cgroup, with its limits,
        // would outlive the actor).
        self.inits.forget_after(&id, INIT_EXIT_WAIT).await;
        self.inits.reap_pending();
        // Dropped, the relay is reaped by tokio when it ends (at EOF, the container being gone).
        if let Ok(mut relays) = self.relays.lock() {
            relays.remove(&id);
        }
        unmount_if_mounted(&actor.rootfs_dir())?;
        // Sidecars' rootfs overlays (whatever the template says now: a dir is all it takes).
        if let Ok(mut dirs) = tokio::fs::read_dir(actor.dir.join("containers")).await {
            while let Ok(Some(d)) = dirs.next_entry().await {
                unmount_if_mounted(&d.path().join("rootfs"))?;
            }
        }
        // The idmapped clones under the overlays (sandboxes in a user namespace), then the range.
        unmount_below(&actor.dir.join(super::userns::IDMAP_DIR));
        super::external::detach(actor);
        super::userns::release(&self.userns_claims, &actor.dir);
        ate_netns::delete(&actor.netns()).await?;
        remove_cgroups(&actor.short_id());
        Ok(())
    }
}
