//! External volumes (issue 37): a node directory per actor (`<hostPath>/<atespace>/<actor>`,
//! made and checked by the worker before the boot, see `worker::volumes`) attached at
//! [`ActorSandbox::external_volumes_dir`]`/<volume>` for runc to bind into the container:
//! idmapped onto the actor's range when it has its own user namespace (files stay in canonical
//! form on disk: the actor's root is uid 0 there, whatever range it runs on), a plain bind
//! otherwise. The attach point is outside the actor dir, and detaching only unmounts and
//! removes empty dirs: nothing that tears a sandbox down can delete an external volume's data.

use std::path::Path;

use nix::mount::MsFlags;

use super::mounts::unmount_below;
use super::userns;
use crate::error::{IoContext, Result};
use crate::runtime::{ActorSandbox, SandboxSpec};

/// Attaches every external volume of `spec` (anything attached before is detached first).
/// `userns_base`: the actor's range when it runs in its own user namespace.
pub(super) fn attach(
    actor: &ActorSandbox,
    spec: &SandboxSpec,
    userns_base: Option<u32>,
) -> Result<()> {
    detach(actor);
    let external: Vec<_> = spec
        .volumes
        .iter()
        .filter_map(|v| Some((v, v.external_dir(&actor.atespace, &actor.name)?)))
        .collect();
    if external.is_empty() {
        return Ok(());
    }
    let ns = userns_base.map(userns::mapping_userns).transpose()?;
    for (v, src) in external {
        let dst = actor.external_volumes_dir().join(&v.name);
        std::fs::create_dir_all(&dst).ctx(|| format!("create {}", dst.display()))?;
        match &ns {
            Some(ns) => userns::idmapped_clone(ns, &src, &dst)?,
            None => bind(&src, &dst)?,
        }
    }
    Ok(())
}

/// Detaches the external volumes of `actor` and removes their (empty) attach points.
pub(super) fn detach(actor: &ActorSandbox) {
    let dir = actor.external_volumes_dir();
    unmount_below(&dir);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            // rmdir, never a recursive remove: a dir still mounted is left as it is.
            let _ = std::fs::remove_dir(e.path());
        }
    }
    let _ = std::fs::remove_dir(&dir);
}

fn bind(src: &Path, dst: &Path) -> Result<()> {
    nix::mount::mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .ctx(|| format!("bind {} at {}", src.display(), dst.display()))
}
