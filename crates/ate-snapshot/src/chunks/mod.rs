//! Memory images in the durable store as content-addressed chunks.
//!
//! A file with chunk digests (CRIU's memory images, manifest format 2) is not stored as one
//! `<path>.zst`: each [`CHUNK_BYTES`] chunk is its own object, `<store>/_chunks/<b3[..2]>/<b3>.zst`
//! (zstd with a frame checksum), named by the chunk's BLAKE3 digest from the manifest. So
//!
//! - an upload sends only the chunks the store does not hold yet: the memory an actor did not
//!   change since its previous generation, the chunks a golden tag shares with every actor made
//!   from it;
//! - a lazy restore from the durable copy fetches exactly the chunks its faults need, in parallel
//!   ([`DurableStore::fetch_chunk`]); [`DurableStore::download_for_lazy_restore`] brings only the
//!   small files and the chunks CRIU reads itself.
//!
//! Chunks are shared between generations, so deleting a generation leaves them in place; a chunk
//! no manifest references is deleted by [`DurableStore::sweep_unreferenced_chunks`] once it is
//! older than the store's grace age. An upload reuses a stored chunk only while it is younger
//! than a quarter of that age (an older one is written again, which renews it), and it writes its
//! manifest within half of it; so a chunk a pending upload relies on is young, and a sweep never
//! takes it. See `sweep_unreferenced_chunks` for the last window (a chunk re-written while a
//! sweep deletes it) and how uploads close it.

use std::path::Path;
use std::time::Duration;

use object_store::path::Path as ObjPath;
use serde::{Deserialize, Serialize};

use crate::durable::DurableStore;
use crate::error::Result;

/// Top-level folder of the chunk objects (not a valid atespace name, so never a generation key).
pub(crate) const CHUNKS_DIR: &str = "_chunks";
/// Folder (under [`CHUNKS_DIR`]) of the sweeps' announcements.
const SWEEPS_DIR: &str = "_sweeps";
/// zstd level of a chunk (as for whole files).
const CHUNK_ZSTD_LEVEL: i32 = 3;
/// Chunks moved at once per file.
const CHUNKS_IN_FLIGHT: usize = 8;
/// Chunks compressed at once by a background upload: one at a time, as a whole file was before
/// chunks, so an upload nobody waits for takes one core at most from the restores beside it.
const BACKGROUND_CHUNKS_IN_FLIGHT: usize = 1;
/// Longest a sweep may spend deleting after it announced itself.
const SWEEP_DELETE_WINDOW: Duration = Duration::from_secs(60);
/// Longest between a sweep's check of a chunk and its delete; a delete that would come later is
/// not sent.
const SWEEP_CHECK_TO_DELETE: Duration = Duration::from_millis(250);
/// An upload that overlapped a sweep checks its chunks again no sooner than this after writing
/// the last of them (well past [`SWEEP_CHECK_TO_DELETE`], so a delete decided before the write
/// has landed).
const RECHECK_AFTER_WRITE: Duration = Duration::from_secs(1);
/// Slack for clocks that disagree, when an upload compares its time with a sweep's.
const CLOCK_SLACK: Duration = Duration::from_secs(5);

/// File a download for a lazy restore leaves in the generation directory: where the memory
/// images' chunks are (the local images hold only the chunks CRIU reads itself).
pub const DURABLE_SOURCE_FILE: &str = "durable-source.json";

/// Contents of [`DURABLE_SOURCE_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurableSource {
    /// The store's url (`file:///…`, `s3://bucket/prefix`); credentials come from the
    /// environment, as for the node.
    pub store: String,
    /// The generation's durable uri.
    pub uri: String,
    /// The snapshot keys directory when the store is encrypted (the page source loads the
    /// data key from it, as the node did; see `crate::SnapshotKeys::load`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<std::path::PathBuf>,
    /// Whether objects without encryption are read (`--snapshot-legacy-plaintext`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub legacy_plaintext: bool,
}

impl DurableSource {
    /// The store this source names, with its keys when it is encrypted.
    pub fn open_store(&self) -> Result<DurableStore> {
        let store = DurableStore::from_url(&self.store)?;
        Ok(match &self.keys {
            Some(dir) => store.with_keys(
                crate::crypto::SnapshotKeys::load(dir)?
                    .with_legacy_plaintext(self.legacy_plaintext),
            ),
            None => store,
        })
    }
}

/// The [`DurableSource`] of a generation directory made by
/// [`DurableStore::download_for_lazy_restore`]; `None` for a complete generation.
pub fn durable_source(gen_dir: &Path) -> Result<Option<DurableSource>> {
    crate::generation::read_marker(&gen_dir.join(DURABLE_SOURCE_FILE))
}

mod fetch;
mod sweep;
mod upload;

/// What an upload did with the chunks of one file.
#[derive(Debug, Default, Clone)]
pub(crate) struct ChunkUpload {
    /// Compressed bytes written.
    pub sent_bytes: u64,
    /// Chunks written whole.
    pub written: u64,
    /// Chunks written as deltas.
    pub delta_chunks: u64,
    /// Their bases: `(digest, base digest)`, one pair per base.
    pub deltas: Vec<(String, String)>,
    pub reused: u64,
}

/// Infix of a delta marker's name: `<digest>.base-<base digest>`.
const MARKER_INFIX: &str = ".base-";

impl DurableStore {
    fn chunks_root(&self) -> ObjPath {
        ObjPath::from_iter(
            self.prefix
                .iter()
                .map(String::as_str)
                .chain(std::iter::once(CHUNKS_DIR)),
        )
    }

    /// The object holding the chunk with BLAKE3 `digest` (64 lowercase hex digits, checked by
    /// the manifest's parser).
    pub(crate) fn chunk_object(&self, digest: &str) -> ObjPath {
        let name = self.chunk_name(digest);
        let fan = name.get(..2).unwrap_or("00");
        self.chunks_root().join(fan).join(format!("{name}.zst"))
    }

    /// The object a chunk had before the store was encrypted (named by its plain digest).
    pub(crate) fn legacy_chunk_object(&self, digest: &str) -> ObjPath {
        let fan = digest.get(..2).unwrap_or("00");
        self.chunks_root().join(fan).join(format!("{digest}.zst"))
    }

    /// The name a chunk's object has in this store: its digest, or with encryption a keyed
    /// digest of it (so names reveal nothing about contents; see `crate::crypto`).
    pub(crate) fn chunk_name(&self, digest: &str) -> String {
        match &self.keys {
            Some(k) => k.chunk_name(digest),
            None => digest.to_string(),
        }
    }

    /// The marker saying that chunk `digest` is stored as a delta on `base`.
    fn delta_marker(&self, digest: &str, base: &str) -> ObjPath {
        let (digest, base) = (self.chunk_name(digest), self.chunk_name(base));
        let fan = digest.get(..2).unwrap_or("00");
        self.chunks_root()
            .join(fan)
            .join(format!("{digest}{MARKER_INFIX}{base}"))
    }
}
