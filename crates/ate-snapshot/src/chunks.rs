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

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{FutureExt, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::chunk_delta;
use crate::delta_upload::{DeltaSources, encode_planned};
use crate::durable::{Deadline, DurableStore, UploadPriority, older_than, run_at};
use crate::error::{Error, Result};
use crate::manifest::{FileEntry, MANIFEST_FILE, Manifest};

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
}

/// The [`DurableSource`] of a generation directory made by
/// [`DurableStore::download_for_lazy_restore`]; `None` for a complete generation.
pub fn durable_source(gen_dir: &Path) -> Result<Option<DurableSource>> {
    let path = gen_dir.join(DURABLE_SOURCE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", &path, e)),
    }
}

/// A sweep's announcement, for people reading the store: it may delete chunks from `started_ms`
/// to `ends_by_ms` (its clock). Uploads go by the object's last-modified time only.
#[derive(Debug, Serialize, Deserialize)]
struct SweepWindow {
    started_ms: u64,
    ends_by_ms: u64,
}

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

/// What an upload did with one chunk.
enum Written {
    Reused,
    /// Written whole, compressed bytes.
    Full(u64),
    /// Written as a delta: bytes, digest, base digests.
    Delta(u64, String, Vec<String>),
}

/// Infix of a delta marker's name: `<digest>.base-<base digest>`.
const MARKER_INFIX: &str = ".base-";

/// The markers store unsigned milliseconds; [`ate_core::clock::unix_ms`] is never negative.
fn unix_ms(t: SystemTime) -> u64 {
    u64::try_from(ate_core::clock::unix_ms(t)).unwrap_or(0)
}

fn chunk_len(entry: &FileEntry, index: u64) -> Result<usize> {
    entry
        .chunk_range(index)
        .map(|(s, e)| (e - s) as usize)
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "{}: chunk {index} is past the end ({} bytes)",
                entry.path, entry.size
            ))
        })
}

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
        let fan = digest.get(..2).unwrap_or("00");
        self.chunks_root().join(fan).join(format!("{digest}.zst"))
    }

    /// Uploads the chunks of `entry` (a file with chunk digests) that the store lacks or holds
    /// only in an old copy. Each chunk is read from `gen_dir`, checked against its digest (a file
    /// changed since sealing is refused) and compressed at `priority`; a chunk the store lacks
    /// goes up as a delta when few of its pages differ from the pages at the same addresses in
    /// one of the `sources`' parents ([`crate::chunk_delta`]).
    pub(crate) async fn upload_chunks(
        &self,
        gen_dir: &Path,
        entry: &FileEntry,
        sources: &DeltaSources,
        priority: UploadPriority,
        deadline: &Deadline,
    ) -> Result<ChunkUpload> {
        let src = gen_dir.join(&entry.path);
        let file = Arc::new(File::open(&src).map_err(|e| Error::io("open", &src, e))?);
        let transfers: Vec<_> = (0..entry.chunk_count())
            .map(|i| {
                self.upload_chunk(file.clone(), entry, i, sources, priority, deadline)
                    .boxed()
            })
            .collect();
        let in_flight = match priority {
            UploadPriority::Normal => CHUNKS_IN_FLIGHT,
            UploadPriority::Background => BACKGROUND_CHUNKS_IN_FLIGHT,
        };
        let results: Vec<Result<Written>> = futures::stream::iter(transfers)
            .buffer_unordered(in_flight)
            .collect()
            .await;
        let mut done = ChunkUpload::default();
        for r in results {
            match r? {
                Written::Reused => done.reused += 1,
                Written::Full(bytes) => {
                    done.written += 1;
                    done.sent_bytes += bytes;
                }
                Written::Delta(bytes, digest, bases) => {
                    done.delta_chunks += 1;
                    done.deltas
                        .extend(bases.into_iter().map(|b| (digest.clone(), b)));
                    done.sent_bytes += bytes;
                }
            }
        }
        Ok(done)
    }

    /// Uploads chunk `index` unless the store already holds a recent copy.
    async fn upload_chunk(
        &self,
        file: Arc<File>,
        entry: &FileEntry,
        index: u64,
        sources: &DeltaSources,
        priority: UploadPriority,
        deadline: &Deadline,
    ) -> Result<Written> {
        deadline.check()?;
        let digest = entry
            .chunk_digest(index)
            .ok_or_else(|| Error::InvalidInput(format!("{}: no chunk {index}", entry.path)))?;
        let obj = self.chunk_object(digest);
        let absent = match self.store.head(&obj).await {
            Ok(meta) if !self.chunk_needs_renewal(meta.last_modified.into()) => {
                return Ok(Written::Reused);
            }
            // An old copy is renewed whole: a chunk object that exists is only ever replaced by
            // a full copy, so a reader chasing bases rarely meets a delta where a base was.
            Ok(_) => false,
            Err(object_store::Error::NotFound { .. }) => true,
            Err(e) => return Err(Error::object(&obj, e)),
        };
        let plan = if absent && !sources.is_empty() {
            self.plan_delta(entry, index, sources).await
        } else {
            None
        };
        let entry_owned = entry.clone();
        let digest_owned = digest.to_string();
        let (compressed, bases) = run_at(priority, format!("compress {obj}"), move || {
            let mut buf = Vec::new();
            crate::generation::read_verified_chunk_at(&file, &entry_owned, index, &mut buf)?;
            if let Some((obj, bases)) = plan
                .as_ref()
                .and_then(|p| encode_planned(p, &digest_owned, &buf, CHUNK_ZSTD_LEVEL))
            {
                return Ok((obj, bases));
            }
            compress_chunk(&buf, &entry_owned.path).map(|c| (c, Vec::new()))
        })
        .await?;
        let n = compressed.len() as u64;
        for base in &bases {
            // The edges the sweep follows, before the delta that needs them (see the sweep).
            let marker = self.delta_marker(digest, base);
            self.put_bounded(&marker, PutPayload::default(), deadline)
                .await?;
        }
        self.put_bounded(&obj, PutPayload::from(compressed), deadline)
            .await?;
        Ok(if bases.is_empty() {
            Written::Full(n)
        } else {
            Written::Delta(n, digest.to_string(), bases)
        })
    }

    pub(crate) async fn put_bounded(
        &self,
        obj: &ObjPath,
        payload: PutPayload,
        deadline: &Deadline,
    ) -> Result<()> {
        let put = self.store.put(obj, payload);
        match deadline.remaining() {
            None => put.await,
            Some(left) => tokio::time::timeout(left, put)
                .await
                .map_err(|_| deadline.exceeded())?,
        }
        .map(|_| ())
        .map_err(|e| Error::object(obj, e))
    }

    /// The marker saying that chunk `digest` is stored as a delta on `base`.
    fn delta_marker(&self, digest: &str, base: &str) -> ObjPath {
        let fan = digest.get(..2).unwrap_or("00");
        self.chunks_root()
            .join(fan)
            .join(format!("{digest}{MARKER_INFIX}{base}"))
    }

    /// A stored chunk older than a quarter of the grace age is written again rather than
    /// reused, so no sweep can take it before the upload's manifest references it.
    pub(crate) fn chunk_needs_renewal(&self, written: SystemTime) -> bool {
        if self.partial_grace.is_zero() {
            return false; // no sweeps
        }
        older_than(written, SystemTime::now(), self.partial_grace / 4)
    }

    /// Before an upload writes its manifest: when a sweep of unreferenced chunks may have run
    /// since `started`, checks that every chunk of the manifest is in the store (writing again
    /// any that is not), so the manifest never references a chunk a sweep deleted while this
    /// upload wrote it.
    pub(crate) async fn confirm_chunks(
        &self,
        gen_dir: &Path,
        manifest: &Manifest,
        deltas: &[(String, String)],
        (started, last_write): (SystemTime, Instant),
        priority: UploadPriority,
        deadline: &Deadline,
    ) -> Result<()> {
        if !manifest.files.iter().any(FileEntry::has_chunk_digests)
            || !self.sweep_overlapped(started).await?
        {
            return Ok(());
        }
        let wait = RECHECK_AFTER_WRITE.saturating_sub(last_write.elapsed());
        tokio::time::sleep(wait).await;
        // A sweep that deleted a chunk and its marker may have deleted the marker this upload
        // wrote again for the same delta (same name): write it back.
        for (digest, base) in deltas {
            let marker = self.delta_marker(digest, base);
            match self.store.head(&marker).await {
                Ok(_) => {}
                Err(object_store::Error::NotFound { .. }) => {
                    self.put_bounded(&marker, PutPayload::default(), deadline)
                        .await?
                }
                Err(e) => return Err(Error::object(&marker, e)),
            }
        }
        // A chunk written again here goes whole.
        let no_sources = &DeltaSources::default();
        for entry in manifest.files.iter().filter(|f| f.has_chunk_digests()) {
            let src = gen_dir.join(&entry.path);
            let file = Arc::new(File::open(&src).map_err(|e| Error::io("open", &src, e))?);
            let checks: Vec<_> = (0..entry.chunk_count())
                .map(|i| {
                    let file = file.clone();
                    async move {
                        let digest = entry.chunk_digest(i).unwrap_or_default();
                        let obj = self.chunk_object(digest);
                        match self.store.head(&obj).await {
                            Ok(_) => Ok(()),
                            Err(object_store::Error::NotFound { .. }) => {
                                tracing::info!(chunk = %obj, "a sweep removed a chunk during the upload; writing it again");
                                self.upload_chunk(file, entry, i, no_sources, priority, deadline)
                                    .await
                                    .map(|_| ())
                            }
                            Err(e) => Err(Error::object(&obj, e)),
                        }
                    }
                    .boxed()
                })
                .collect();
            let results: Vec<Result<()>> = futures::stream::iter(checks)
                .buffer_unordered(CHUNKS_IN_FLIGHT * 2)
                .collect()
                .await;
            if let Some(e) = results.into_iter().find_map(Result::err) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// True when a sweep's deletion window overlaps `started` .. now (with slack for clocks).
    async fn sweep_overlapped(&self, started: SystemTime) -> Result<bool> {
        // One listing, no reads: an announcement's last-modified time is when its sweep began
        // deleting (the store's clock, like every age the sweeps compare), and a sweep deletes
        // for at most SWEEP_DELETE_WINDOW after it.
        let dir = self.chunks_root().join(SWEEPS_DIR);
        let from = started - CLOCK_SLACK - SWEEP_DELETE_WINDOW;
        let to = SystemTime::now() + CLOCK_SLACK;
        let mut listing = self.store.list(Some(&dir));
        while let Some(item) = listing.next().await {
            match item {
                Ok(m) => {
                    let began = SystemTime::from(m.last_modified);
                    if began >= from && began <= to {
                        return Ok(true);
                    }
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::object(&dir, e)),
            }
        }
        Ok(false)
    }

    /// Fetches chunk `index` of `entry` from the store, decompressed and checked against its
    /// BLAKE3 digest ([`Error::ChunkMismatch`] when it differs, [`Error::MissingFile`] when the
    /// store does not hold it or a base it is a delta of). A delta chunk
    /// ([`crate::chunk_delta`]) is rebuilt from its base, which is checked against its own digest
    /// first.
    pub async fn fetch_chunk(&self, entry: &FileEntry, index: u64) -> Result<Vec<u8>> {
        let digest = entry
            .chunk_digest(index)
            .ok_or_else(|| Error::InvalidInput(format!("{}: no chunk {index}", entry.path)))?;
        let len = chunk_len(entry, index)?;
        let label = format!("{} (chunk {index}", entry.path);
        let data = self.fetch_chunk_object(digest, len, &label, 0).await?;
        let entry = entry.clone();
        tokio::task::spawn_blocking(move || {
            crate::generation::verify_chunk_bytes(&entry, index, &data)?;
            Ok(data)
        })
        .await
        .map_err(|e| Error::task("check a chunk", e))?
    }

    /// The bytes of the chunk object named `digest` (at most `len`), rebuilt from its bases when
    /// it is a delta; `depth` levels of bases followed so far. Bases are checked against their digests; the
    /// chunk itself is the caller's to check.
    fn fetch_chunk_object<'a>(
        &'a self,
        digest: &'a str,
        len: usize,
        label: &'a str,
        depth: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<u8>>> {
        async move {
            let obj = self.chunk_object(digest);
            let got = match self.store.get(&obj).await {
                Ok(r) => r.bytes().await.map_err(|e| Error::object(&obj, e))?,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(Error::MissingFile {
                        file: format!("{label}, {obj})"),
                    });
                }
                Err(e) => return Err(Error::object(&obj, e)),
            };
            let name = obj.to_string();
            let Some(header) = chunk_delta::parse_header(&got, &name)? else {
                return tokio::task::spawn_blocking(move || {
                    zstd::bulk::decompress(&got, len).map_err(|e| Error::Decompress {
                        key: name,
                        source: e,
                    })
                })
                .await
                .map_err(|e| Error::task("decompress a chunk", e))?;
            };
            if depth >= chunk_delta::MAX_CHAIN || header.len > len {
                return Err(Error::InvalidInput(format!(
                    "chunk object {name}: a delta {} (of {} bytes, at most {len} read)",
                    if depth >= chunk_delta::MAX_CHAIN {
                        "past the longest chain of bases"
                    } else {
                        "too long"
                    },
                    header.len
                )));
            }
            let base_label = format!("{label}, {obj}: a base");
            let bases = futures::future::try_join_all(header.bases.iter().map(|b| {
                let base_label = &base_label;
                async move {
                    let data = self
                        .fetch_chunk_object(
                            b,
                            chunk_delta::CHUNK_PAGES * chunk_delta::PAGE,
                            base_label,
                            depth + 1,
                        )
                        .await?;
                    Ok::<_, Error>((b.clone(), data))
                }
            }))
            .await?;
            tokio::task::spawn_blocking(move || {
                let mut contents = Vec::with_capacity(bases.len());
                for (digest, data) in bases {
                    let actual = blake3::hash(&data).to_hex();
                    if actual.as_str() != digest {
                        return Err(Error::InvalidInput(format!(
                            "chunk object {name}: its base {digest} holds {actual}: damaged"
                        )));
                    }
                    contents.push(data);
                }
                chunk_delta::apply(&header, &got, &contents, &name)
            })
            .await
            .map_err(|e| Error::task("rebuild a delta chunk", e))?
        }
        .boxed()
    }

    /// Writes the chunks `which` of `entry` (all when `None`) into `dst`, which is created with
    /// the file's full size (chunks not fetched read as zeros).
    pub(crate) async fn download_chunks(
        &self,
        entry: &FileEntry,
        dst: &Path,
        which: Option<&BTreeSet<u64>>,
    ) -> Result<()> {
        let file = File::create(dst).map_err(|e| Error::io("create", dst, e))?;
        file.set_len(entry.size)
            .map_err(|e| Error::io("size", dst, e))?;
        let file = Arc::new(file);
        let indices: Vec<u64> = match which {
            Some(set) => set.iter().copied().collect(),
            None => (0..entry.chunk_count()).collect(),
        };
        let transfers: Vec<_> = indices
            .into_iter()
            .map(|i| {
                let file = file.clone();
                async move {
                    let data = self.fetch_chunk(entry, i).await?;
                    let offset = i * crate::manifest::CHUNK_BYTES;
                    let dst = dst.to_path_buf();
                    tokio::task::spawn_blocking(move || {
                        file.write_all_at(&data, offset)
                            .map_err(|e| Error::io("write", &dst, e))
                    })
                    .await
                    .map_err(|e| Error::task("write a chunk", e))?
                }
                .boxed()
            })
            .collect();
        let results: Vec<Result<()>> = futures::stream::iter(transfers)
            .buffer_unordered(CHUNKS_IN_FLIGHT)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Downloads what a lazy restore needs before it starts into `target_gen_dir`: every file
    /// without chunk digests, and of the memory images only the chunks `eager` names (it is
    /// called with the directory once the small files are in; CRIU's own reads). The images are
    /// sparse files of their full size, and [`DURABLE_SOURCE_FILE`] says where the rest is (the
    /// page source fetches it). Nothing is left at the target on error.
    pub async fn download_for_lazy_restore<F>(
        &self,
        uri_or_key: &str,
        target_gen_dir: &Path,
        eager: F,
    ) -> Result<Manifest>
    where
        F: FnOnce(&Path) -> Result<Vec<(String, u64)>> + Send + 'static,
    {
        let key = self.key_of(uri_or_key)?;
        let base = self.base(&key)?;
        let (manifest, manifest_bytes) = self.get_manifest(&base, &key).await?;
        let (parent, tmp) = crate::generation::sibling(target_gen_dir, "lazy-download")?;
        std::fs::create_dir_all(&parent).map_err(|e| Error::io("create dir", &parent, e))?;
        std::fs::create_dir(&tmp).map_err(|e| Error::io("create dir", &tmp, e))?;
        let chunked = manifest.files.iter().any(FileEntry::has_chunk_digests);
        let result = async {
            self.download_files(&base, &manifest, &tmp, !chunked)
                .await?;
            if !chunked {
                // Nothing to leave in the store: a whole generation, as `download` makes it.
                return self
                    .seal_download(&tmp, target_gen_dir, manifest_bytes)
                    .await;
            }
            let dir = tmp.clone();
            let wanted = tokio::task::spawn_blocking(move || eager(&dir))
                .await
                .map_err(|e| Error::task("find the chunks CRIU reads", e))??;
            let mut by_file: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
            for (path, index) in wanted {
                by_file.entry(path).or_default().insert(index);
            }
            let empty = BTreeSet::new();
            for entry in manifest.files.iter().filter(|f| f.has_chunk_digests()) {
                let which = by_file.get(&entry.path).unwrap_or(&empty);
                self.download_chunks(entry, &tmp.join(&entry.path), Some(which))
                    .await?;
            }
            let source = DurableSource {
                store: self.url.clone(),
                uri: self.uri(&key)?,
            };
            let json = serde_json::to_vec(&source)
                .map_err(|e| Error::InvalidInput(format!("durable source: {e}")))?;
            let path = tmp.join(DURABLE_SOURCE_FILE);
            std::fs::write(&path, json).map_err(|e| Error::io("write", &path, e))?;
            self.seal_download(&tmp, target_gen_dir, manifest_bytes)
                .await
        }
        .await;
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Ok(manifest)
    }

    /// Writes the manifest into the downloaded `tmp` and moves it to `target`.
    async fn seal_download(
        &self,
        tmp: &Path,
        target: &Path,
        manifest_bytes: Vec<u8>,
    ) -> Result<()> {
        let dir = tmp.to_path_buf();
        tokio::task::spawn_blocking(move || {
            crate::generation::write_manifest(&dir, &manifest_bytes)
        })
        .await
        .map_err(|e| Error::task("write manifest", e))??;
        std::fs::rename(tmp, target).map_err(|e| Error::io("rename into place", target, e))
    }

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
        let mut listing = self.store.list((!self.prefix.is_empty()).then_some(&root));
        while let Some(item) = listing.next().await {
            let m = match item {
                Ok(m) => m,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::object(&root, e)),
            };
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
            for f in manifest.files {
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

fn compress_chunk(data: &[u8], path: &str) -> Result<Vec<u8>> {
    let mut c = zstd::bulk::Compressor::new(CHUNK_ZSTD_LEVEL)
        .map_err(|e| Error::io("zstd init", Path::new(path), e))?;
    // Frame checksum: a damaged object fails in the decoder, before the BLAKE3 check.
    c.include_checksum(true)
        .map_err(|e| Error::io("zstd init", Path::new(path), e))?;
    c.compress(data)
        .map_err(|e| Error::io("compress", Path::new(path), e))
}
