//! The sweep of chunks no manifest references, and what it must keep.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::durable::{DurableStore, older_than};
use crate::error::{Error, Result};
use crate::manifest::{MANIFEST_FILE, Manifest};

use super::{MARKER_INFIX, SWEEP_CHECK_TO_DELETE, SWEEP_DELETE_WINDOW, SWEEPS_DIR};

/// A sweep's announcement, for people reading the store: it may delete chunks from `started_ms`
/// to `ends_by_ms` (its clock). Uploads go by the object's last-modified time only.
#[derive(Debug, Serialize, Deserialize)]
struct SweepWindow {
    started_ms: u64,
    ends_by_ms: u64,
}

/// The markers store unsigned milliseconds; [`ate_core::clock::unix_ms`] is never negative.
fn unix_ms(t: SystemTime) -> u64 {
    u64::try_from(ate_core::clock::unix_ms(t)).unwrap_or(0)
}

impl DurableStore {
    /// Deletes the chunks no generation references any more: those under `_chunks/` that no
    /// `manifest.json` in the store lists and that are older than the grace age. Returns how many
    /// were deleted.
    ///
    /// The window this leaves: a sweep checks a chunk (old, unreferenced), an upload writes the
    /// same chunk again, then the sweep's delete lands. So a sweep first announces itself
    /// (`_chunks/_sweeps/<id>`: when it deletes, at most [`SWEEP_DELETE_WINDOW`]), sends each
    /// delete within [`SWEEP_CHECK_TO_DELETE`] of its check, and stops at the end of its
    /// window; an upload that overlapped an announced window checks all its chunks again
    /// after its last write (writing back any that is gone) before it writes its manifest.
    pub async fn sweep_unreferenced_chunks(&self, sweeper_id: &str) -> Result<u64> {
        let grace = self.partial_grace;
        if grace.is_zero() {
            return Err(Error::InvalidInput(
                "sweep of unreferenced chunks: the grace age is 0, which would delete chunks of uploads in flight".into(),
            ));
        }
        let listed_at = Instant::now();
        let root = ObjPath::from_iter(self.prefix.iter().map(String::as_str));
        let chunks_root = self.chunks_root();
        let mut manifests = Vec::new();
        // Every chunk object: digest → (object, old enough to delete).
        let mut stored: BTreeMap<String, (ObjPath, bool)> = BTreeMap::new();
        let mut markers: Vec<DeltaMarker> = Vec::new();
        let now = SystemTime::now();
        let mut listing = self.list_under_prefix(&root);
        while let Some(m) = listing.next().await {
            let m = m?;
            if m.location.prefix_matches(&chunks_root) {
                let old = older_than(m.last_modified.into(), now, grace);
                let Some(name) = m.location.filename().map(str::to_owned) else {
                    continue;
                };
                if let Some(digest) = name.strip_suffix(".zst") {
                    stored.insert(digest.to_owned(), (m.location, old));
                } else if let Some((digest, base)) = name.split_once(MARKER_INFIX) {
                    markers.push(DeltaMarker {
                        obj: m.location,
                        digest: digest.to_owned(),
                        base: base.to_owned(),
                        old,
                    });
                }
            } else if m.location.filename() == Some(MANIFEST_FILE) {
                manifests.push(m.location);
            }
        }
        drop(listing);
        if !stored.values().any(|(_, old)| *old) && !markers.iter().any(|m| m.old) {
            return Ok(0);
        }
        let mut referenced: BTreeSet<String> = BTreeSet::new();
        for mpath in &manifests {
            let bytes = match self.store.get(mpath).await {
                Ok(r) => r.bytes().await.map_err(|e| Error::object(mpath, e))?,
                Err(object_store::Error::NotFound { .. }) => continue, // deleted meanwhile
                Err(e) => return Err(Error::object(mpath, e)),
            };
            // A manifest this build cannot read still protects nothing it can name; refuse to
            // sweep rather than guess (a newer format may reference chunks differently).
            let manifest = Manifest::from_json(&bytes).map_err(|e| {
                Error::InvalidInput(format!(
                    "sweep of unreferenced chunks: cannot read {mpath}: {e}; nothing deleted"
                ))
            })?;
            // Names, as listed: keyed digests when the store is encrypted, and the plain
            // digests too (the chunks of generations written before encryption).
            for f in manifest.files {
                referenced.extend(f.blake3_chunks.iter().map(|d| self.chunk_name(d)));
                referenced.extend(f.blake3_chunks);
            }
        }
        let keep = chunks_to_keep(&stored, &markers, &referenced);
        // A marker goes with its chunk, after it; an old one whose chunk is gone, at once.
        let markers_to_delete: Vec<(ObjPath, bool)> = markers
            .into_iter()
            .filter(|m| {
                m.old
                    && !keep.contains(&m.digest)
                    && stored.get(&m.digest).is_none_or(|(_, old)| *old)
            })
            .map(|m| (m.obj, false))
            .collect();
        // (object, is a chunk rather than a marker)
        let mut chunks: Vec<(ObjPath, bool)> = stored
            .into_iter()
            .filter(|(d, (_, old))| *old && !keep.contains(d))
            .map(|(_, (obj, _))| (obj, true))
            .collect();
        chunks.extend(markers_to_delete);
        if chunks.is_empty() {
            return Ok(0);
        }
        // Manifests written after the listing are not known here: stop well before an upload
        // that started after it could have written its manifest (see the module docs).
        let listing_valid_until = listed_at + grace / 4;
        let started = SystemTime::now();
        let window = SweepWindow {
            started_ms: unix_ms(started),
            ends_by_ms: unix_ms(started + SWEEP_DELETE_WINDOW),
        };
        let marker = chunks_root.join(SWEEPS_DIR).join(sweeper_id);
        let body = serde_json::to_vec(&window)
            .map_err(|e| Error::InvalidInput(format!("sweep window: {e}")))?;
        self.store
            .put(&marker, PutPayload::from(body))
            .await
            .map_err(|e| Error::object(&marker, e))?;
        let window_end = Instant::now() + SWEEP_DELETE_WINDOW;
        let mut deleted = 0u64;
        for (obj, is_chunk) in chunks {
            if Instant::now() >= window_end.min(listing_valid_until) {
                break;
            }
            let checked = Instant::now();
            match self.store.head(&obj).await {
                Ok(meta) if older_than(meta.last_modified.into(), SystemTime::now(), grace) => {}
                Ok(_) | Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::object(&obj, e)),
            }
            if checked.elapsed() > SWEEP_CHECK_TO_DELETE {
                continue;
            }
            match self.store.delete(&obj).await {
                Ok(()) => deleted += u64::from(is_chunk),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::object(&obj, e)),
            }
        }
        if deleted > 0 {
            tracing::info!(
                deleted,
                "removed chunks no generation references from the durable store"
            );
        }
        Ok(deleted)
    }
}

/// A delta marker from a sweep's listing: chunk `digest` is stored as a delta on `base`.
struct DeltaMarker {
    obj: ObjPath,
    digest: String,
    base: String,
    old: bool,
}

/// The chunks a sweep must not delete: those a manifest references, those too young to judge,
/// and every base a kept delta chunk needs, transitively. A marker whose chunk the listing did
/// not hold keeps its base while it is young (an upload writes the marker, then the chunk).
fn chunks_to_keep(
    stored: &BTreeMap<String, (ObjPath, bool)>,
    markers: &[DeltaMarker],
    referenced: &BTreeSet<String>,
) -> BTreeSet<String> {
    let mut keep: BTreeSet<String> = referenced.clone();
    keep.extend(
        stored
            .iter()
            .filter(|(_, (_, old))| !*old)
            .map(|(d, _)| d.clone()),
    );
    let mut bases_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in markers {
        if stored.contains_key(&m.digest) {
            bases_of.entry(&m.digest).or_default().push(&m.base);
        } else if !m.old {
            keep.insert(m.base.clone());
        }
    }
    let mut work: Vec<String> = keep.iter().cloned().collect();
    while let Some(d) = work.pop() {
        for base in bases_of.get(d.as_str()).into_iter().flatten() {
            if keep.insert((*base).to_string()) {
                work.push((*base).to_string());
            }
        }
    }
    keep
}
