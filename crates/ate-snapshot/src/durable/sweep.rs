//! The sweep of manifest-less keys that uploads cut off for good left behind.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectMeta, ObjectStoreExt};

use super::{DurableStore, obj_child};
use crate::error::{Error, Result};
use crate::manifest::MANIFEST_FILE;

impl DurableStore {
    /// Deletes what uploads cut off for good (their node died) left behind: every key with
    /// objects but no `manifest.json` whose newest object is older than the grace age
    /// ([`DurableStore::with_partial_grace`]). A key is the first `key_depth` path segments
    /// under the store's prefix (the node's `<atespace>/<name>/<generation>-<uuid>`: 3); objects
    /// nearer the root are not looked at. A key with a manifest is never touched, nor one with
    /// any object younger than the grace age (an upload may be in flight on another node), and
    /// only the objects an upload writes (`*.zst`) are deleted.
    ///
    /// Candidates are listed again and each object re-read right before it is deleted, so a
    /// retried upload of the same generation that started meanwhile keeps its files. Several
    /// nodes may sweep at once (deleting is idempotent). Fails only when the store cannot be
    /// listed; a key that cannot be deleted is logged, counted in [`SweepStats::keys_failed`]
    /// and left to the next sweep.
    pub async fn sweep_partial_uploads(&self, key_depth: usize) -> Result<SweepStats> {
        if key_depth == 0 {
            return Err(Error::InvalidInput(
                "sweep of partial uploads: the key depth must be at least 1".into(),
            ));
        }
        let grace = self.partial_grace;
        if grace.is_zero() {
            return Err(Error::InvalidInput(
                "sweep of partial uploads: the grace age is 0, which would delete uploads in flight"
                    .into(),
            ));
        }
        let root = ObjPath::from_iter(self.prefix.iter().map(String::as_str));
        // Shared memory chunks have their own sweep (`sweep_unreferenced_chunks`).
        let chunks_root = root.clone().join(crate::chunks::CHUNKS_DIR);
        let depth = self.prefix.len() + key_depth;
        // One entry per key, not per object: the listing of a large store stays small in memory.
        let mut keys: BTreeMap<ObjPath, KeySummary> = BTreeMap::new();
        let mut listing = self.list_under_prefix(&root);
        while let Some(m) = listing.next().await {
            let m = m?;
            let parts = m.location.parts_count();
            if parts <= depth || m.location.prefix_matches(&chunks_root) {
                continue;
            }
            let key = ObjPath::from_iter(m.location.parts().take(depth));
            let t = SystemTime::from(m.last_modified);
            let k = keys.entry(key).or_insert(KeySummary {
                manifest: false,
                uploaded: 0,
                newest: t,
            });
            k.newest = k.newest.max(t);
            if parts == depth + 1 && m.location.filename() == Some(MANIFEST_FILE) {
                k.manifest = true;
            } else if is_uploaded_file(&m.location) {
                k.uploaded += 1;
            }
        }
        drop(listing);

        let mut stats = SweepStats {
            keys_seen: keys.len(),
            ..SweepStats::default()
        };
        let now = SystemTime::now();
        for (key, k) in keys {
            if k.manifest || k.uploaded == 0 {
                continue;
            }
            if !older_than(k.newest, now, grace) {
                stats.keys_young += 1;
                continue;
            }
            match self.sweep_key(&key, grace).await {
                Ok(KeySweep::Complete) => {}
                Ok(KeySweep::Swept {
                    objects,
                    bytes,
                    interrupted,
                }) => {
                    stats.objects_deleted += objects;
                    stats.bytes_deleted += bytes;
                    if interrupted {
                        stats.keys_young += 1;
                    } else {
                        stats.keys_deleted += 1;
                    }
                    let age_s = now.duration_since(k.newest).unwrap_or_default().as_secs();
                    if objects > 0 {
                        tracing::info!(key = %key, objects, bytes, age_s, interrupted, "removed a partial upload (objects without manifest.json) from the durable store");
                    } else if interrupted {
                        tracing::debug!(key = %key, "partial upload written again since the listing; left alone");
                    }
                }
                Err(e) => {
                    stats.keys_failed += 1;
                    tracing::warn!(key = %key, error = %e, "cannot remove a partial upload from the durable store; the next sweep retries");
                }
            }
        }
        Ok(stats)
    }

    /// Deletes one manifest-less key's uploaded objects after checking, on a fresh listing,
    /// that it still has no manifest and nothing younger than `grace`.
    async fn sweep_key(&self, key: &ObjPath, grace: Duration) -> Result<KeySweep> {
        let mut objects: Vec<ObjectMeta> = self.list_present(Some(key), key).try_collect().await?;
        let mpath = obj_child(key, MANIFEST_FILE);
        if objects.iter().any(|m| m.location == mpath) {
            return Ok(KeySweep::Complete);
        }
        let now = SystemTime::now();
        let young = |m: &ObjectMeta| !older_than(m.last_modified.into(), now, grace);
        if objects.iter().any(young) {
            return Ok(KeySweep::Swept {
                objects: 0,
                bytes: 0,
                interrupted: true,
            });
        }
        objects.retain(|m| is_uploaded_file(&m.location));
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        let mut swept = (0usize, 0u64);
        for m in objects {
            // Re-read right before deleting: a retry of the same upload may have written this
            // object since the listing; then it and the rest of the key are left to that upload.
            match self.store.head(&m.location).await {
                Ok(now_there) => {
                    if !older_than(now_there.last_modified.into(), SystemTime::now(), grace) {
                        return Ok(KeySweep::Swept {
                            objects: swept.0,
                            bytes: swept.1,
                            interrupted: true,
                        });
                    }
                }
                // Another node's sweep was first.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::object(&m.location, e)),
            }
            match self.store.delete(&m.location).await {
                Ok(()) => {
                    swept.0 += 1;
                    swept.1 += m.size;
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::object(&m.location, e)),
            }
        }
        Ok(KeySweep::Swept {
            objects: swept.0,
            bytes: swept.1,
            interrupted: false,
        })
    }
}

/// What one [`DurableStore::sweep_partial_uploads`] found and removed. When several nodes sweep
/// at once, their counts may overlap (an object another sweep deleted first may still count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Keys listed, complete or not.
    pub keys_seen: usize,
    /// Manifest-less keys past the grace age whose objects were deleted.
    pub keys_deleted: usize,
    pub objects_deleted: usize,
    /// Stored (compressed) size of the deleted objects.
    pub bytes_deleted: u64,
    /// Manifest-less keys left alone because an object under them is younger than the grace age
    /// (an upload may be in flight).
    pub keys_young: usize,
    /// Keys whose deletion failed (logged; the next sweep tries again).
    pub keys_failed: usize,
}

/// What the first listing saw of one key.
struct KeySummary {
    manifest: bool,
    /// Objects an upload writes (`*.zst`).
    uploaded: usize,
    /// Newest object of any kind.
    newest: SystemTime,
}

/// What [`DurableStore::sweep_key`] did.
enum KeySweep {
    /// A manifest appeared since the first listing.
    Complete,
    /// Deleted these; `interrupted` when an object turned out to be young (rewritten by a retry
    /// of the same upload) and the rest of the key was left to that upload.
    Swept {
        objects: usize,
        bytes: u64,
        interrupted: bool,
    },
}

/// True when `t` is more than `grace` before `now`. A time in the future (clocks that disagree)
/// counts as young.
pub(crate) fn older_than(t: SystemTime, now: SystemTime, grace: Duration) -> bool {
    now.duration_since(t).is_ok_and(|age| age > grace)
}

/// Objects an upload writes besides the manifest: `<file>.zst`.
fn is_uploaded_file(p: &ObjPath) -> bool {
    p.filename().is_some_and(|n| n.ends_with(".zst"))
}
