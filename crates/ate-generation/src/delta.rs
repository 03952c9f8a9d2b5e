//! Incremental (delta) generations made whole: [`ensure_flat`] merges the pages an incremental
//! suspend left to its parent generation into its own memory images and replaces them in place
//! (docs/incremental-suspend.md, "a delta generation, flattened in the background").
//!
//! A delta exists only from its suspend until its flatten, which the worker starts right after
//! the suspend. Everything that reads a generation's files beyond its manifest (a restore, an
//! upload, a move) and everything that removes a generation another one may build on calls
//! [`ensure_flat`] first, so none of them ever follows a parent.
//!
//! Architecture invariant: flattens of one actor's generations are serialized by an exclusive
//! `flock` on the actor's snapshot directory (the parent of every generation dir), across the
//! worker and the node processes; a generation that is whole never changes again.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ate_snapshot::sealed::{Opening, Scratch};

use crate::images::ImageError;

/// Histogram of the time a flatten took (`ate_worker_generation_flatten_seconds`: the name it
/// had when only the worker flattened; the node's flattens record it too).
pub const FLATTEN_SECONDS: &str = "ate_worker_generation_flatten_seconds";

/// Why a delta generation could not be made whole. The generation is left as it was.
#[derive(Debug, thiserror::Error)]
pub enum FlattenError {
    #[error("{0}")]
    Snapshot(#[from] ate_snapshot::Error),
    #[error("memory images: {0}")]
    Images(#[from] ImageError),
    /// The parent the delta's manifest names is not there, or is another generation: the pages
    /// the delta left to it are lost. Never expected (retention flattens a delta before it
    /// removes its parent); said loudly.
    #[error("generation {dir} builds on {parent}, which {why}")]
    Parent {
        dir: PathBuf,
        parent: PathBuf,
        why: String,
    },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Makes the generation `gen_dir` whole if it is a delta (its manifest names a parent), the
/// parent first if that is a delta too, and returns its (whole) manifest. Waits for a flatten
/// of the same actor under way in this or another process.
pub async fn ensure_flat(gen_dir: &Path) -> Result<ate_snapshot::Manifest, FlattenError> {
    // Most generations are whole: one manifest read, no lock.
    let manifest = ate_snapshot::read_manifest(gen_dir).await?;
    if manifest.parent.is_none() {
        return Ok(manifest);
    }
    let _lock = lock_actor_dir(gen_dir).await?;
    flatten_locked(gen_dir.to_path_buf()).await
}

/// Makes whole every delta among `dir`'s sibling generations that builds on `dir`: what must
/// happen before `dir` is removed.
pub async fn flatten_children(dir: &Path) -> Result<usize, FlattenError> {
    flatten_children_except(dir, &[]).await
}

/// [`flatten_children`], leaving out the generations in `going` (removed with `dir`).
pub async fn flatten_children_except(dir: &Path, going: &[PathBuf]) -> Result<usize, FlattenError> {
    let (Some(actor_dir), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Ok(0);
    };
    let mut flattened = 0;
    let Ok(mut entries) = tokio::fs::read_dir(actor_dir).await else {
        return Ok(0);
    };
    while let Ok(Some(e)) = entries.next_entry().await {
        let path = e.path();
        if path == dir || going.contains(&path) || e.file_name().to_string_lossy().starts_with('.')
        {
            continue;
        }
        let Ok(m) = ate_snapshot::read_manifest(&path).await else {
            continue;
        };
        if m.parent
            .is_some_and(|p| std::ffi::OsStr::new(&p.dir) == name)
        {
            ensure_flat(&path).await?;
            flattened += 1;
        }
    }
    Ok(flattened)
}

fn flatten_locked(
    gen_dir: PathBuf,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<ate_snapshot::Manifest, FlattenError>> + Send>,
> {
    Box::pin(async move {
        let begun = Instant::now();
        // Again under the lock: another process may have flattened it meanwhile.
        let manifest = ate_snapshot::read_manifest(&gen_dir).await?;
        let Some(parent) = manifest.parent.clone() else {
            return Ok(manifest);
        };
        ate_snapshot::remove_leftovers(&gen_dir);
        let parent_dir = gen_dir
            .parent()
            .map(|d| d.join(&parent.dir))
            .ok_or_else(|| FlattenError::Parent {
                dir: gen_dir.clone(),
                parent: PathBuf::from(&parent.dir),
                why: "has no directory".into(),
            })?;
        let parent_manifest = ate_snapshot::read_manifest(&parent_dir)
            .await
            .map_err(|e| FlattenError::Parent {
                dir: gen_dir.clone(),
                parent: parent_dir.clone(),
                why: format!("cannot be read: {e}"),
            })?;
        if parent_manifest.generation != parent.generation || parent_manifest.uuid != parent.uuid {
            return Err(FlattenError::Parent {
                dir: gen_dir.clone(),
                parent: parent_dir.clone(),
                why: format!(
                    "holds generation {} ({}), not {} ({})",
                    parent_manifest.generation,
                    parent_manifest.uuid,
                    parent.generation,
                    parent.uuid
                ),
            });
        }
        if parent_manifest.parent.is_some() {
            flatten_locked(parent_dir.clone()).await?;
        }
        let (delta_plain, _delta_scratch) = plain_view(&gen_dir, "flatten-delta").await?;
        let (parent_plain, _parent_scratch) = plain_view(&parent_dir, "flatten-parent").await?;
        // The flat images, on the tmpfs scratch (plaintext memory never reaches the disk);
        // `replace_memory` seals or copies them into the generation.
        let out = Scratch::new("flatten")?;
        let criu = ate_snapshot::CRIU_DIR;
        let (d, p, o) = (
            delta_plain.join(criu),
            parent_plain.join(criu),
            out.path().join(criu),
        );
        let merged =
            tokio::task::spawn_blocking(move || crate::images::flatten::flatten(&d, &p, &o))
                .await
                .map_err(|e| FlattenError::Io {
                    what: "flatten task",
                    path: gen_dir.clone(),
                    source: std::io::Error::other(e.to_string()),
                })??;
        let whole = ate_snapshot::replace_memory(&gen_dir, out.path()).await?;
        tracing::info!(
            generation = %gen_dir.display(),
            parent = %parent_dir.display(),
            own_pages = merged.own_pages,
            parent_pages = merged.parent_pages,
            took_ms = begun.elapsed().as_millis() as u64,
            "incremental generation flattened"
        );
        metrics::histogram!(FLATTEN_SECONDS).record(begun.elapsed().as_secs_f64());
        Ok(whole)
    })
}

/// A plaintext view of the generation's CRIU images: the directory itself when it is not
/// sealed, else a scratch dir they are opened into (kept alive by the returned handle; the
/// archives are not opened: the flat generation keeps them sealed as they are).
async fn plain_view(gen_dir: &Path, tag: &str) -> Result<(PathBuf, Option<Scratch>), FlattenError> {
    if !ate_snapshot::sealed::is_encrypted(gen_dir) {
        return Ok((gen_dir.to_path_buf(), None));
    }
    let scratch = Scratch::new(tag)?;
    ate_snapshot::sealed::open_into(gen_dir, scratch.path(), Opening::Images).await?;
    Ok((scratch.path().to_path_buf(), Some(scratch)))
}

/// The CRIU parent images of an incremental dump into `images` (the dump's `criu/` dir) made
/// from the generation `parent_gen`: a link to its `criu/` when it is plaintext, else its
/// pagemaps opened (and empty pages files) into `<images>/../parent-images/criu`. Returns the
/// parent path relative to `images`, as `runc checkpoint --parent-path` wants it.
pub async fn parent_images_for_dump(
    parent_gen: &Path,
    images: &Path,
) -> Result<PathBuf, FlattenError> {
    let criu = ate_snapshot::CRIU_DIR;
    if !ate_snapshot::sealed::is_encrypted(parent_gen) {
        // Plaintext generations are siblings: `<gen>/criu/` → `../../<parent>/criu`.
        let name = parent_gen.file_name().ok_or_else(|| FlattenError::Parent {
            dir: images.to_path_buf(),
            parent: parent_gen.to_path_buf(),
            why: "has no name".into(),
        })?;
        return Ok(Path::new("../..").join(name).join(criu));
    }
    let base = images
        .parent()
        .map(|d| d.join("parent-images"))
        .ok_or_else(|| FlattenError::Parent {
            dir: images.to_path_buf(),
            parent: parent_gen.to_path_buf(),
            why: "has no place for its images".into(),
        })?;
    ate_snapshot::sealed::open_into(parent_gen, &base, Opening::ParentOfDump).await?;
    Ok(Path::new("../parent-images").join(criu))
}

/// An exclusive `flock` on the directory holding `gen_dir` (the actor's generations), held
/// until the returned file is dropped.
async fn lock_actor_dir(gen_dir: &Path) -> Result<nix::fcntl::Flock<File>, FlattenError> {
    let dir = gen_dir
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| FlattenError::Parent {
            dir: gen_dir.to_path_buf(),
            parent: PathBuf::new(),
            why: "has no actor directory".into(),
        })?;
    tokio::task::spawn_blocking(move || {
        let f = File::open(&dir).map_err(|source| FlattenError::Io {
            what: "open",
            path: dir.clone(),
            source,
        })?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| {
            FlattenError::Io {
                what: "lock",
                path: dir.clone(),
                source: std::io::Error::from(e),
            }
        })
    })
    .await
    .map_err(|e| FlattenError::Io {
        what: "lock task",
        path: gen_dir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?
}
