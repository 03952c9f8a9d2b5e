//! The memory dump of a checkpoint, incremental where it can be (docs/incremental-suspend.md):
//! an actor restored lazily with tracking, suspended into a sibling of the generation its
//! tracked memory is relative to, dumps only the pages written since; anything else, or any
//! doubt, dumps whole. And after a dump that leaves the sandbox frozen in place, the tracking
//! is re-armed, so the thawed actor's next dump builds on the generation just written.

use std::path::Path;
use std::sync::Arc;

use ate_snapshot::ParentGeneration;

use super::{Entry, Worker};
use crate::error::SandboxError;
use crate::lazy::{Outcome, PageSource, Tracking};
use crate::runtime::CheckpointStats;

/// A memory dump and the generation it builds on (`None`: whole).
pub(super) type Dumped = (CheckpointStats, Option<ParentGeneration>);

impl Worker {
    /// Dumps the actor's memory into `criu` (the new generation's images, to be sealed into
    /// `gen_dir`), frozen in place when `freeze`: incremental against the entry's tracked
    /// parent when tracking holds and that generation is a sibling of `gen_dir`, else whole. CRIU's `parent` link is removed: the manifest names the parent.
    pub(super) async fn dump_memory(
        &self,
        key: &str,
        entry: &Entry,
        gen_dir: &Path,
        criu: &Path,
        freeze: bool,
    ) -> Result<Dumped, SandboxError> {
        let sandbox = &entry.sandbox;
        let Some(tracker) = tracker_of(entry) else {
            return self.dump_whole(entry, criu, freeze).await;
        };
        let Some(parent_gen) = entry
            .memory_parent
            .as_deref()
            .filter(|p| p.parent() == gen_dir.parent() && *p != gen_dir)
        else {
            // Restored from a download, not from a generation of this node's.
            crate::metrics::incremental_checkpoint("no_parent");
            return self.dump_whole(entry, criu, freeze).await;
        };
        let parent = async {
            // Small: a whole dump is quick, and the next resume need not wait for a flatten. (A
            // parent that is still a delta holds only what changed; it exists because the
            // generation under it was large enough.)
            let manifest = ate_snapshot::read_manifest(parent_gen).await?;
            let memory: u64 = manifest
                .files
                .iter()
                .filter(|f| ate_snapshot::is_memory_pages_file(&f.path))
                .map(|f| f.size)
                .sum();
            if manifest.parent.is_none() && memory < self.incremental_min_bytes {
                return Ok(None);
            }
            // CRIU checks the pages it leaves to the parent against the parent's pagemaps only
            // (one level): a parent that is itself a delta serves. Its flatten may swap it in
            // place meanwhile, which a sealed parent's opened copy does not see; a plaintext
            // one is read in place, so it is made whole first.
            if !ate_snapshot::sealed::is_encrypted(parent_gen) {
                ate_generation::delta::ensure_flat(parent_gen).await?;
            }
            let rel = ate_generation::delta::parent_images_for_dump(parent_gen, criu).await?;
            Ok::<_, ate_generation::delta::FlattenError>(Some((manifest, rel)))
        }
        .await;
        let (manifest, rel) = match parent {
            Ok(Some(p)) => p,
            Ok(None) => {
                crate::metrics::incremental_checkpoint("small");
                return self.dump_whole(entry, criu, freeze).await;
            }
            Err(e) => {
                tracing::warn!(actor = %key, parent = %parent_gen.display(), error = %e, "the parent generation cannot be used; dumping whole");
                crate::metrics::incremental_checkpoint("parent_unreadable");
                return self.dump_whole(entry, criu, freeze).await;
            }
        };
        let (stats, tracking) = self
            .runtime
            .checkpoint_incremental(sandbox, criu, &rel, &tracker, freeze)
            .await?;
        let link = criu.join(ate_generation::images::flatten::PARENT_LINK);
        if let Err(e) = tokio::fs::remove_file(&link).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(SandboxError::io(format!("remove {}", link.display()), e));
        }
        match tracking {
            Tracking::Holds { .. } => {
                crate::metrics::incremental_checkpoint("incremental");
                let dir = parent_gen
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Ok((
                    stats,
                    Some(ParentGeneration {
                        dir,
                        generation: manifest.generation,
                        uuid: manifest.uuid,
                    }),
                ))
            }
            Tracking::Lost(why) => {
                tracing::info!(actor = %key, %why, "memory tracking lost; the dump is whole");
                crate::metrics::incremental_checkpoint("tracking_lost");
                Ok((stats, None))
            }
        }
    }

    async fn dump_whole(
        &self,
        entry: &Entry,
        criu: &Path,
        freeze: bool,
    ) -> Result<Dumped, SandboxError> {
        let stats = if freeze {
            self.runtime.checkpoint_frozen(&entry.sandbox, criu).await?
        } else {
            self.runtime.checkpoint(&entry.sandbox, criu).await?
        };
        Ok((stats, None))
    }

    /// For an entry kept frozen in place after its dump into `gen_dir`: protects again what its
    /// processes wrote, so that after a thaw its writes are tracked relative to `gen_dir`.
    /// Without tracking (or if the re-arm fails) the entry tracks nothing from now on.
    pub(super) async fn rearm_frozen(&self, key: &str, entry: &mut Entry, gen_dir: &Path) {
        let Some(tracker) = tracker_of(entry) else {
            return;
        };
        entry.page_source = None;
        match self.runtime.rearm_tracking(&entry.sandbox).await {
            Ok(pages) => {
                tracing::debug!(actor = %key, pages, "memory tracking re-armed while frozen");
                entry.tracker = Some(tracker);
                entry.memory_parent = Some(gen_dir.to_path_buf());
            }
            Err(e) => {
                tracing::warn!(actor = %key, error = %e, "cannot re-arm memory tracking; its next dump is whole");
                entry.tracker = None;
                entry.memory_parent = None;
            }
        }
    }
}

/// The page source that tracks the entry's writes: kept after its lazy restore finished, or
/// the restore's own once every page is in (before the activity loop moved it).
fn tracker_of(entry: &Entry) -> Option<Arc<PageSource>> {
    entry.tracker.clone().or_else(|| {
        entry
            .page_source
            .clone()
            .filter(|p| p.tracks_memory() && matches!(p.outcome(), Outcome::Done(_)))
    })
}
