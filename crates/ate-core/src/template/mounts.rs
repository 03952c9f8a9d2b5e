//! Where a volume may be mounted: places where the start would fail are refused at apply.

use super::IDENTITY_DIR;
use crate::names::ValidationError;

/// Why a volume cannot be mounted at `path` (already absolute, without `.`/`..` parts), when the
/// start would fail: runc refuses mounts on or inside `/proc` and fails on `/dev` itself and on
/// the device nodes it sets up afterwards; the worker refuses `/etc/ate…`.
fn reserved_mount_path(path: &str) -> Option<String> {
    let p = path.trim_end_matches('/');
    let at_or_under = |dir: &str| p == dir || p.starts_with(&format!("{dir}/"));
    if at_or_under("/proc") {
        return Some(
            "/proc is the container's procfs; runc refuses a mount on or inside it".to_string(),
        );
    }
    if matches!(p, "/dev" | "/dev/null" | "/dev/ptmx") {
        return Some(format!(
            "{p} is set up by runc (a tmpfs /dev with its device nodes); a volume there makes \
             the container fail to start (other paths under /dev, like /dev/shm, work)"
        ));
    }
    if at_or_under("/.ate") {
        return Some(
            "/.ate holds the init of actors with several containers and their roots".to_string(),
        );
    }
    if p.starts_with(IDENTITY_DIR) {
        return Some(format!(
            "{IDENTITY_DIR} holds the actor's identity files (a read-only mount); workers refuse \
             any mount path beginning with {IDENTITY_DIR}"
        ));
    }
    None
}

/// A volume's mount path: absolute, not `/`, without `.`/`..` parts, not a reserved place.
pub(super) fn check_mount_path(field: &str, p: &str) -> Result<(), ValidationError> {
    if !p.starts_with('/')
        || p == "/"
        || p.split('/').any(|s| s == ".." || s == ".")
        || p.contains('\0')
        || p.len() > 4096
    {
        return Err(ValidationError::new(
            field,
            format!("{p:?} must be an absolute path other than / without . or .. parts"),
        ));
    }
    if let Some(why) = reserved_mount_path(p) {
        return Err(ValidationError::new(field, format!("{p:?}: {why}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::template::fixtures::field_of;

    #[test]
    fn volumes_where_the_start_would_fail_are_refused() {
        for bad in [
            "/proc",
            "/proc/sys",
            "/proc/",
            "/dev",
            "/dev/",
            "/dev/null",
            "/dev/ptmx",
            "/etc/ate",
            "/etc/ate/keys",
            "/etc/atelier",
        ] {
            assert_eq!(
                field_of(|s| s.volumes[0].mount_path = bad.into()).as_deref(),
                Some("spec.volumes[0].mountPath"),
                "{bad}"
            );
        }
        for ok in [
            "/dev/shm",
            "/sys/fs/x",
            "/etc",
            "/etc/app",
            "/procfiles",
            "/state",
        ] {
            assert_eq!(
                field_of(|s| s.volumes[0].mount_path = ok.into()),
                None,
                "{ok}"
            );
        }
    }

    #[test]
    fn external_volumes_need_a_usable_host_path_of_their_own() {
        use crate::template::{ExternalVolume, Volume};
        let host = |p: &str| {
            Some(ExternalVolume {
                host_path: Some(p.into()),
                ..ExternalVolume::default()
            })
        };
        for bad in ["relative", "/", "//", "/srv/../etc", "/srv/./x", ""] {
            assert_eq!(
                field_of(|s| s.volumes[0].external = host(bad)).as_deref(),
                Some("spec.volumes[0].external.hostPath"),
                "{bad:?}"
            );
        }
        assert_eq!(
            field_of(|s| s.volumes[0].external = Some(ExternalVolume::default())).as_deref(),
            Some("spec.volumes[0].external.hostPath")
        );
        assert_eq!(
            field_of(|s| {
                s.volumes[0].external = Some(ExternalVolume {
                    storage_class_name: Some("fast".into()),
                    ..ExternalVolume::default()
                })
            })
            .as_deref(),
            Some("spec.volumes[0].external.storageClassName")
        );
        assert_eq!(field_of(|s| s.volumes[0].external = host("/srv/ate")), None);
        // Two volumes on one hostPath would share each actor's directory.
        assert_eq!(
            field_of(|s| {
                s.volumes[0].external = host("/srv/ate");
                s.volumes.push(Volume {
                    name: "other".into(),
                    mount_path: "/other".into(),
                    external: host("/srv/ate/"),
                });
            })
            .as_deref(),
            Some("spec.volumes[1].external.hostPath")
        );
    }
}
