//! Downloads into a fresh directory beside the target, every file checked against the manifest,
//! then renamed into place.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjPath;
use tokio::sync::mpsc;

use super::codec::{decompress_file, decompress_into};
use super::{CHUNK, DurableStore, TransferStats, obj_child};
use crate::error::{Error, Result};
use crate::generation::{fsync_dir, sibling, write_manifest};
use crate::manifest::{FileEntry, MANIFEST_FILE, Manifest};

impl DurableStore {
    /// Downloads the generation at `uri_or_key` into `target_gen_dir` (which must not exist, or
    /// be an empty dir). Every file's sha256 is checked against the manifest; on any error
    /// nothing is left at the target.
    pub async fn download(&self, uri_or_key: &str, target_gen_dir: &Path) -> Result<Manifest> {
        Ok(self
            .download_with_stats(uri_or_key, target_gen_dir)
            .await?
            .0)
    }

    /// [`DurableStore::download`] with the amount moved and the time it took.
    pub async fn download_with_stats(
        &self,
        uri_or_key: &str,
        target_gen_dir: &Path,
    ) -> Result<(Manifest, TransferStats)> {
        let start = Instant::now();
        let key = self.key_of(uri_or_key)?;
        let base = self.base(&key)?;
        let (manifest, manifest_bytes) = self.get_manifest(&base, &key).await?;

        let (parent, tmp) = sibling(target_gen_dir, "download")?;
        fs::create_dir_all(&parent).map_err(|e| Error::io("create dir", &parent, e))?;
        fs::create_dir(&tmp).map_err(|e| Error::io("create dir", &tmp, e))?;
        let result = self
            .download_into(&base, &manifest, &manifest_bytes, &tmp, target_gen_dir)
            .await;
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        fsync_dir(&parent)?;
        let stats = TransferStats {
            files: manifest.files.len(),
            raw_bytes: manifest.total_size(),
            sent_bytes: 0,
            chunks_reused: 0,
            chunks_delta: 0,
            elapsed: start.elapsed(),
        };
        tracing::info!(
            key,
            files = stats.files,
            bytes = stats.raw_bytes,
            ms = stats.elapsed.as_millis() as u64,
            "generation downloaded"
        );
        Ok((manifest, stats))
    }

    /// The generation's manifest (parsed, and its bytes as stored); [`Error::NotComplete`]
    /// when it has none.
    pub(crate) async fn get_manifest(
        &self,
        base: &ObjPath,
        key: &str,
    ) -> Result<(Manifest, Vec<u8>)> {
        let mpath = obj_child(base, MANIFEST_FILE);
        let manifest_bytes = match self.store.get(&mpath).await {
            Ok(r) => r.bytes().await.map_err(|e| Error::object(&mpath, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::NotComplete {
                    uri: self.uri(key)?,
                });
            }
            Err(e) => return Err(Error::object(&mpath, e)),
        };
        let manifest = Manifest::from_json(&manifest_bytes)?;
        Ok((manifest, manifest_bytes.to_vec()))
    }

    /// Downloads the manifest's files into `dir`: all of them, or (`with_chunked` false) only
    /// those without chunk digests. A memory image comes from its chunks.
    pub(crate) async fn download_files(
        &self,
        base: &ObjPath,
        manifest: &Manifest,
        dir: &Path,
        with_chunked: bool,
    ) -> Result<()> {
        // Built eagerly and boxed for the same reason as in upload (rust-lang/rust#102211).
        let transfers: Vec<_> = manifest
            .files
            .iter()
            .filter(|f| with_chunked || !f.has_chunk_digests())
            .map(|f| {
                if f.has_chunk_digests() {
                    async move {
                        let dst = dir.join(&f.path);
                        if let Some(p) = dst.parent() {
                            tokio::fs::create_dir_all(p)
                                .await
                                .map_err(|e| Error::io("create dir", p, e))?;
                        }
                        self.download_chunks(f, &dst, None).await
                    }
                    .boxed()
                } else {
                    self.download_file(base, f, dir).boxed()
                }
            })
            .collect();
        let results: Vec<Result<()>> = futures::stream::iter(transfers)
            .buffer_unordered(self.parallelism)
            .collect()
            .await;
        results.into_iter().collect()
    }

    async fn download_into(
        &self,
        base: &ObjPath,
        manifest: &Manifest,
        manifest_bytes: &[u8],
        tmp: &Path,
        target: &Path,
    ) -> Result<()> {
        self.download_files(base, manifest, tmp, true).await?;
        let tmp_owned = tmp.to_path_buf();
        let bytes = manifest_bytes.to_vec();
        // No syncfs before the manifest (a sealed generation gets one): a download is a cache of
        // the durable copy, and every use verifies it (the node's cache check hashes it in full,
        // the worker checks each file or chunk it restores from), so a copy torn by a crash is
        // found and fetched again, never restored from. Flushing a 1 GiB download first took
        // seconds of the resume.
        tokio::task::spawn_blocking(move || write_manifest(&tmp_owned, &bytes))
            .await
            .map_err(|e| Error::task("write manifest", e))??;
        fs::rename(tmp, target).map_err(|e| Error::io("rename into place", target, e))
    }

    async fn download_file(&self, base: &ObjPath, f: &FileEntry, tmp: &Path) -> Result<()> {
        let obj = obj_child(base, &format!("{}.zst", f.path));
        let dst = tmp.join(&f.path);
        if let Some(p) = dst.parent() {
            tokio::fs::create_dir_all(p)
                .await
                .map_err(|e| Error::io("create dir", p, e))?;
        }
        let got = match self.store.get(&obj).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::MissingFile {
                    file: f.path.clone(),
                });
            }
            Err(e) => return Err(Error::object(&obj, e)),
        };
        let mut stream = match got.payload {
            // A local store hands over the file itself: read it directly with large reads
            // (its stream comes in 8 KiB pieces, a third of the speed for a 1 GiB image).
            object_store::GetResultPayload::File(file, _) => {
                let entry = f.clone();
                let key = obj.to_string();
                let reader = io::BufReader::with_capacity(CHUNK, file);
                return tokio::task::spawn_blocking(move || {
                    decompress_into(reader, &dst, &entry, &key)
                })
                .await
                .map_err(|e| Error::task(format!("decompress {obj}"), e))?;
            }
            object_store::GetResultPayload::Stream(stream) => stream,
        };
        let (tx, rx) = mpsc::channel::<Bytes>(4);
        let entry = f.clone();
        let key = obj.to_string();
        let dst2 = dst.clone();
        let consumer =
            tokio::task::spawn_blocking(move || decompress_file(rx, &dst2, &entry, &key));
        let mut fetch_err = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(b) => {
                    if tx.send(b).await.is_err() {
                        break; // the decoder gave up; its error is reported below
                    }
                }
                Err(e) => {
                    fetch_err = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let decoded = consumer
            .await
            .map_err(|e| Error::task(format!("decompress {}", obj), e))?;
        if let Some(e) = fetch_err {
            return Err(Error::object(&obj, e));
        }
        decoded
    }
}
