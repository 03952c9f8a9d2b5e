//! Uploading a memory image's chunks (whole, reused or as deltas) and confirming them before
//! the manifest goes up.

use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::{FutureExt, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};

use crate::delta_upload::{DeltaSources, encode_planned};
use crate::durable::{Deadline, DurableStore, UploadPriority, older_than, run_at};
use crate::error::{Error, Result};
use crate::generation::MemoryFile;
use crate::manifest::{FileEntry, Manifest};

use super::{
    BACKGROUND_CHUNKS_IN_FLIGHT, CHUNK_ZSTD_LEVEL, CHUNKS_IN_FLIGHT, CLOCK_SLACK, ChunkUpload,
    RECHECK_AFTER_WRITE, SWEEP_DELETE_WINDOW, SWEEPS_DIR,
};

/// What an upload did with one chunk.
enum Written {
    Reused,
    /// Written whole, compressed bytes.
    Full(u64),
    /// Written as a delta: bytes, digest, base digests.
    Delta(u64, String, Vec<String>),
}

impl DurableStore {
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
        let file = Arc::new(MemoryFile::open(gen_dir, entry)?);
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
        file: Arc<MemoryFile>,
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
            file.read_trusted_chunk(&entry_owned, index, &mut buf)?;
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
            let file = Arc::new(MemoryFile::open(gen_dir, entry)?);
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
        let mut listing = self.list_present(Some(&dir), &dir);
        while let Some(m) = listing.next().await {
            let began = SystemTime::from(m?.last_modified);
            if began >= from && began <= to {
                return Ok(true);
            }
        }
        Ok(false)
    }
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
