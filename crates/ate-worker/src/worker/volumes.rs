//! External volumes' node directories (issue 37, `docs/volumes.md`): made and checked before a
//! sandbox boots, so a volume that cannot be attached fails the start with a clear error and
//! nothing half-started. The runtime attaches them (`runc::external`).

use std::path::{Path, PathBuf};

use ate_core::TemplateSpec;

use super::{VerbError, Worker};

impl Worker {
    /// Makes `<hostPath>/<atespace>/<name>` of every external volume of `spec` (kept as it is
    /// when it exists) after checking that it is under one of `--external-volume-roots`, also
    /// once every symlink on the way is resolved.
    pub(super) async fn prepare_external_volumes(
        &self,
        atespace: &str,
        name: &str,
        spec: &TemplateSpec,
    ) -> Result<(), VerbError> {
        for v in &spec.volumes {
            let Some(dir) = v.external_dir(atespace, name) else {
                continue;
            };
            let roots = self.external_volume_roots.clone();
            let volume = v.name.clone();
            tokio::task::spawn_blocking(move || prepare(&roots, &volume, &dir))
                .await
                .map_err(|e| VerbError::Internal(format!("external volume task: {e}")))??;
        }
        Ok(())
    }
}

fn prepare(roots: &[PathBuf], volume: &str, dir: &Path) -> Result<(), VerbError> {
    let listed = || {
        if roots.is_empty() {
            "none: set --external-volume-roots or ATE_EXTERNAL_VOLUME_ROOTS on the worker"
                .to_string()
        } else {
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let Some(root) = roots.iter().find(|r| dir.starts_with(r)) else {
        return Err(VerbError::FailedPrecondition(format!(
            "external volume {volume:?}: {} is not under an allowed root (the worker's \
             --external-volume-roots: {})",
            dir.display(),
            listed()
        )));
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        VerbError::FailedPrecondition(format!(
            "external volume {volume:?}: cannot make {}: {e}",
            dir.display()
        ))
    })?;
    let real = |p: &Path| {
        std::fs::canonicalize(p).map_err(|e| {
            VerbError::FailedPrecondition(format!(
                "external volume {volume:?}: cannot resolve {}: {e}",
                p.display()
            ))
        })
    };
    let (real_dir, real_root) = (real(dir)?, real(root)?);
    if !real_dir.starts_with(&real_root) || !real_dir.is_dir() {
        return Err(VerbError::FailedPrecondition(format!(
            "external volume {volume:?}: {} leads to {}, outside the allowed root {}",
            dir.display(),
            real_dir.display(),
            real_root.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    /// Why `prepare` refuses `dir` for the volume "work" under `roots` ("" if it does not).
    fn refusal(roots: &[PathBuf], dir: &Path) -> String {
        prepare(roots, "work", dir)
            .err()
            .map(|e| e.message().to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_dir_is_made_under_an_allowed_root_only() {
        let tmp = tempdir();
        let root = tmp.path().join("volumes");
        let dir = root.join("ns").join("a");
        assert!(prepare(std::slice::from_ref(&root), "work", &dir).is_ok());
        assert!(dir.is_dir());
        std::fs::write(dir.join("kept"), b"1").unwrap_or_else(|e| panic!("write: {e}"));
        // Again: kept as it is.
        assert!(prepare(std::slice::from_ref(&root), "work", &dir).is_ok());
        assert!(dir.join("kept").exists());

        let other = tmp.path().join("elsewhere").join("ns").join("a");
        let err = refusal(std::slice::from_ref(&root), &other);
        assert!(err.contains("not under an allowed root"), "{err}");
        assert!(!other.exists(), "nothing is made outside the roots");
        let err = refusal(&[], &dir);
        assert!(err.contains("--external-volume-roots"), "{err}");
    }

    #[test]
    fn a_symlink_out_of_the_root_is_refused() {
        let tmp = tempdir();
        let root = tmp.path().join("volumes");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::fs::create_dir_all(outside.join("a")).unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::os::unix::fs::symlink(&outside, root.join("ns"))
            .unwrap_or_else(|e| panic!("symlink: {e}"));
        let err = refusal(std::slice::from_ref(&root), &root.join("ns").join("a"));
        assert!(err.contains("outside the allowed root"), "{err}");
    }

    #[test]
    fn a_file_where_the_dir_goes_is_a_clear_error() {
        let tmp = tempdir();
        let root = tmp.path().join("volumes");
        std::fs::create_dir_all(root.join("ns")).unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::fs::write(root.join("ns").join("a"), b"x").unwrap_or_else(|e| panic!("write: {e}"));
        let err = refusal(std::slice::from_ref(&root), &root.join("ns").join("a"));
        assert!(err.contains("cannot make"), "{err}");
    }
}
