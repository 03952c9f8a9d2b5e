//! Uploads: each file hashed while it is compressed, memory images as shared chunks, and the
//! manifest last, only within the deadline.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};
use tokio::sync::mpsc;

use super::codec::compress_file;
use super::multipart::MultipartGuard;
use super::priority::spawn_at;
use super::{
    Deadline, DurableStore, PART_SIZE, PARTS_IN_FLIGHT, TransferStats, UploadPriority, obj_child,
};
use crate::delta_upload::DeltaSources;
use crate::error::{Error, Result};
use crate::generation;
use crate::layout::MemoryLayout;
use crate::manifest::{FileEntry, MANIFEST_FILE};

impl DurableStore {
    /// Uploads a sealed generation under `key` and returns its durable uri. The local copy is
    /// only read; each file's size and sha256 are checked against the manifest on the way. Files go up compressed and in parallel; `manifest.json`
    /// goes last, and on failure the objects already written are deleted (best effort).
    pub async fn upload(&self, gen_dir: &Path, key: &str) -> Result<String> {
        Ok(self.upload_with_stats(gen_dir, key).await?.0)
    }

    /// [`DurableStore::upload`] at `priority`: [`UploadPriority::Background`] for an upload
    /// nobody waits for (hashing and compression at the lowest CPU priority).
    pub async fn upload_with_priority(
        &self,
        gen_dir: &Path,
        key: &str,
        priority: UploadPriority,
    ) -> Result<String> {
        Ok(self
            .upload_prioritized(gen_dir, key, priority, &DeltaSources::default())
            .await?
            .0)
    }

    /// [`DurableStore::upload`] at `priority`, sending each memory chunk the store lacks as a
    /// delta when few of its pages differ from the pages at the same addresses in `parents`
    /// (earlier generations of the actor on this node): an actor that changed 1 % of its memory
    /// sends about 1 %, although CRIU dumped all of it. `layout_of` gives a generation
    /// directory's [`MemoryLayout`] (from CRIU's pagemaps; `None`: pages are matched by offset).
    /// A parent that cannot be read, or whose chunk does not read back with its digest (a lazy
    /// restore's partial download), only means whole chunks.
    pub async fn upload_with_parents(
        &self,
        gen_dir: &Path,
        key: &str,
        priority: UploadPriority,
        parents: &[PathBuf],
        layout_of: &(dyn Fn(&Path) -> Option<MemoryLayout> + Send + Sync),
    ) -> Result<(String, TransferStats)> {
        let mut loaded = Vec::new();
        for dir in parents {
            if dir.as_path() == gen_dir {
                continue;
            }
            match generation::read_manifest(dir).await {
                Ok(manifest) => loaded.push(crate::delta_upload::Parent {
                    dir: dir.clone(),
                    manifest,
                    layout: layout_of(dir),
                    partial: crate::chunks::durable_source(dir)
                        .ok()
                        .flatten()
                        .is_some_and(|s| s.store == self.url),
                }),
                Err(e) => {
                    tracing::debug!(parent = %dir.display(), error = %e, "not a parent for deltas")
                }
            }
        }
        let layout = if loaded.is_empty() {
            None
        } else {
            layout_of(gen_dir)
        };
        let sources = crate::delta_upload::DeltaSources::new(layout, loaded);
        self.upload_prioritized(gen_dir, key, priority, &sources)
            .await
    }

    /// [`DurableStore::upload`] with the amount moved and the time it took.
    pub async fn upload_with_stats(
        &self,
        gen_dir: &Path,
        key: &str,
    ) -> Result<(String, TransferStats)> {
        self.upload_prioritized(
            gen_dir,
            key,
            UploadPriority::Normal,
            &DeltaSources::default(),
        )
        .await
    }

    async fn upload_prioritized(
        &self,
        gen_dir: &Path,
        key: &str,
        priority: UploadPriority,
        sources: &DeltaSources,
    ) -> Result<(String, TransferStats)> {
        let start = Instant::now();
        let started_at = SystemTime::now();
        let uri = self.uri(key)?;
        let base = self.base(key)?;
        let deadline = Deadline {
            start,
            limit: (!self.partial_grace.is_zero()).then(|| self.partial_grace / 2),
            uri: uri.clone(),
        };
        // Sizes only here: every file is hashed while it is compressed and a mismatch fails the
        // upload before the manifest is written (so the copy never becomes COMPLETED).
        let (manifest, manifest_bytes) = generation::verify_with_bytes(gen_dir, false).await?;
        // Futures are built eagerly and boxed: a stream `map` closure here makes the caller's future
        // fail rustc's higher-ranked `Send` check (rust-lang/rust#102211).
        // Memory images go up as content-addressed chunks (crate::chunks), everything else as
        // one object per file.
        let transfers: Vec<_> = manifest
            .files
            .iter()
            .map(|f| {
                if f.has_chunk_digests() {
                    self.upload_chunks(gen_dir, f, sources, priority, &deadline)
                        .boxed()
                } else {
                    self.upload_file(gen_dir, &base, f, priority, &deadline)
                        .map(|r| {
                            r.map(|sent_bytes| crate::chunks::ChunkUpload {
                                sent_bytes,
                                ..Default::default()
                            })
                        })
                        .boxed()
                }
            })
            .collect();
        let results: Vec<Result<crate::chunks::ChunkUpload>> = futures::stream::iter(transfers)
            .buffer_unordered(self.parallelism)
            .collect()
            .await;
        let last_write = Instant::now();
        // Every transfer has finished (none is cancelled half-way), so cleanup sees all objects.
        let mut sent = (0u64, 0u64, 0u64);
        let mut deltas: Vec<(String, String)> = Vec::new();
        let mut first_err = None;
        for r in results {
            match r {
                Ok(done) => {
                    sent.0 += done.sent_bytes;
                    sent.1 += done.reused;
                    sent.2 += done.delta_chunks;
                    deltas.extend(done.deltas);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let result = match first_err {
            Some(e) => Err(e),
            None => match self
                .confirm_chunks(
                    gen_dir,
                    &manifest,
                    &deltas,
                    (started_at, last_write),
                    priority,
                    &deadline,
                )
                .await
            {
                Ok(()) => self.put_manifest(&base, manifest_bytes, &deadline).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            tracing::warn!(uri, error = %e, "upload failed; removing partial objects");
            if let Err(cleanup) = self.delete_prefix(&base).await {
                tracing::warn!(uri, error = %cleanup, "cleanup after failed upload");
            }
            return Err(e);
        }
        let stats = TransferStats {
            files: manifest.files.len(),
            raw_bytes: manifest.total_size(),
            sent_bytes: sent.0,
            chunks_reused: sent.1,
            chunks_delta: sent.2,
            elapsed: start.elapsed(),
        };
        tracing::info!(
            uri,
            files = stats.files,
            bytes = stats.raw_bytes,
            sent_bytes = stats.sent_bytes,
            chunks_reused = stats.chunks_reused,
            chunks_delta = stats.chunks_delta,
            ms = stats.elapsed.as_millis() as u64,
            "generation uploaded"
        );
        Ok((uri, stats))
    }

    /// Writes `manifest.json`, which makes the objects a generation: only while the upload is
    /// within its deadline, and no later than the deadline either (the PUT is bounded by what is
    /// left of it), so a sweep that sees a manifest-less key past the grace age cannot race it.
    async fn put_manifest(
        &self,
        base: &ObjPath,
        manifest_bytes: Vec<u8>,
        deadline: &Deadline,
    ) -> Result<()> {
        deadline.check()?;
        let mpath = obj_child(base, MANIFEST_FILE);
        self.put_bounded(&mpath, PutPayload::from(manifest_bytes), deadline)
            .await
    }

    async fn upload_file(
        &self,
        gen_dir: &Path,
        base: &ObjPath,
        f: &FileEntry,
        priority: UploadPriority,
        deadline: &Deadline,
    ) -> Result<u64> {
        // Files not started yet when the deadline passed are not worth sending.
        deadline.check()?;
        let obj = obj_child(base, &format!("{}.zst", f.path));
        let src = gen_dir.join(&f.path);
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let producer = spawn_compress(src.clone(), tx, priority)?;

        // Small objects are one PUT; from PART_SIZE on, a multipart upload. Every way out of this
        // function finishes or aborts it (the guard covers early returns and cancellation), so no
        // incomplete multipart upload is left behind while this process lives.
        let mut pending: Vec<Bytes> = Vec::new();
        let mut pending_len = 0usize;
        let mut multipart: Option<MultipartGuard> = None;
        let mut send_err: Option<Error> = None;
        let mut sent = 0u64;
        while let Some(chunk) = rx.recv().await {
            sent += chunk.len() as u64;
            // A file of many GiB should not go on sending after the upload can no longer finish.
            if let Err(e) = deadline.check() {
                send_err = Some(e);
                break;
            }
            if let Some(w) = multipart.as_mut() {
                if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    send_err = Some(Error::object(&obj, e));
                    break;
                }
                w.put(chunk);
                continue;
            }
            pending_len += chunk.len();
            pending.push(chunk);
            if pending_len >= PART_SIZE {
                match MultipartGuard::start(self.store.clone(), obj.clone()).await {
                    Ok(mut w) => {
                        for c in pending.drain(..) {
                            w.put(c);
                        }
                        multipart = Some(w);
                    }
                    Err(e) => {
                        send_err = Some(e);
                        break;
                    }
                }
            }
        }
        // Dropping the receiver stops the producer early when sending failed.
        drop(rx);
        let produced = producer.await.unwrap_or_else(|_| {
            Err(Error::Task {
                what: format!("compress {}", src.display()),
                message: "the compressing thread ended without a result".into(),
            })
        });
        // A send error comes first: the producer then only saw its receiver close.
        let checked = match (send_err, produced) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            // The file changed after verify: do not store something the manifest does not describe.
            (None, Ok((size, _))) if size != f.size => Err(Error::SizeMismatch {
                file: f.path.clone(),
                expected: f.size,
                actual: size,
            }),
            (None, Ok((_, sha))) if sha != f.sha256 => Err(Error::ChecksumMismatch {
                file: f.path.clone(),
                expected: f.sha256.clone(),
                actual: sha,
            }),
            (None, Ok(_)) => Ok(()),
        };
        if let Err(e) = checked {
            if let Some(w) = multipart {
                w.abort().await;
            }
            return Err(e);
        }
        match multipart {
            Some(w) => w.finish().await,
            None => self
                .store
                .put(&obj, PutPayload::from_iter(pending))
                .await
                .map(|_| ())
                .map_err(|e| Error::object(&obj, e)),
        }
        .map(|()| sent)
    }
}

/// Runs [`compress_file`] at `priority`; the receiver gets its result (dropped without one only
/// if the work panicked).
fn spawn_compress(
    src: PathBuf,
    tx: mpsc::Sender<Bytes>,
    priority: UploadPriority,
) -> Result<tokio::sync::oneshot::Receiver<Result<(u64, String)>>> {
    spawn_at(priority, move || compress_file(&src, tx))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The last gate: files all written, but the upload is past half the grace age when it
    /// comes to the manifest. It is not written.
    #[tokio::test]
    async fn manifest_is_refused_past_the_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            DurableStore::from_url(&format!("file://{}", dir.path().display())).expect("store");
        let base = store.base("default/counter/7").expect("base");
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let late = Deadline {
            start,
            limit: Some(Duration::from_millis(1)),
            uri: store.uri("default/counter/7").expect("uri"),
        };
        let err = store
            .put_manifest(&base, b"{}".to_vec(), &late)
            .await
            .expect_err("late");
        assert!(matches!(err, Error::UploadTooSlow { .. }), "{err}");
        assert!(!dir.path().join("default/counter/7/manifest.json").exists());

        let in_time = Deadline {
            start: Instant::now(),
            limit: Some(Duration::from_secs(3600)),
            uri: late.uri.clone(),
        };
        store
            .put_manifest(&base, b"{}".to_vec(), &in_time)
            .await
            .expect("in time");
        assert!(dir.path().join("default/counter/7/manifest.json").exists());
    }
}
