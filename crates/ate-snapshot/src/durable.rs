//! Durable copies of generations in an object store (local directory, S3, GCS, Azure).
//!
//! Layout under `<store url>/<key>/`: `<file>.zst` for every file of the manifest (zstd level 3),
//! then `manifest.json` (plain JSON), uploaded last and deleted first, so an object set without a
//! manifest is never taken for a complete generation.
//!
//! An upload cut off for good (its node died) leaves such a manifest-less object set behind.
//! [`DurableStore::sweep_partial_uploads`] deletes those once their newest object is older than
//! the store's grace age ([`DEFAULT_PARTIAL_GRACE`]); an upload that has run for half of it
//! refuses to write its manifest, so a sweep never removes the files of a generation that then
//! becomes complete.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::delta_upload::DeltaSources;
use crate::error::{Error, Result};
use crate::generation::{self, fsync_dir, sibling, write_manifest};
use crate::layout::MemoryLayout;
use crate::manifest::{FileEntry, MANIFEST_FILE, Manifest};

/// zstd level for every uploaded file (fast, ~3x on typical memory images).
const ZSTD_LEVEL: i32 = 3;
/// Objects at least this big (compressed) go up as multipart uploads of this part size
/// (S3's minimum part is 5 MiB).
const PART_SIZE: usize = 8 << 20;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;
/// Chunk handed between the blocking (de)compressor and the async side.
const CHUNK: usize = 1 << 20;
/// Files transferred at once by default.
const DEFAULT_PARALLELISM: usize = 4;
/// Default grace age of partial uploads (see [`DurableStore::with_partial_grace`]).
pub const DEFAULT_PARTIAL_GRACE: Duration = Duration::from_secs(3600);

/// What one upload or download moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub files: usize,
    /// Uncompressed bytes (the generation's size).
    pub raw_bytes: u64,
    /// Bytes written to the store (compressed; an upload leaves out the memory chunks the store
    /// already holds). 0 for a download.
    pub sent_bytes: u64,
    /// Memory chunks the upload found in the store and did not send again.
    pub chunks_reused: u64,
    /// Memory chunks sent as the pages that differ from a parent's chunk (see
    /// [`DurableStore::upload_with_parents`]).
    pub chunks_delta: u64,
    pub elapsed: Duration,
}

/// An object store plus the prefix generations live under.
#[derive(Debug, Clone)]
pub struct DurableStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Normalized, no trailing `/` (`file:///var/lib/ate/durable`, `s3://bucket/prefix`).
    pub(crate) url: String,
    pub(crate) prefix: Vec<String>,
    parallelism: usize,
    /// Age after which a manifest-less key (or an unreferenced chunk) is garbage; uploads stop
    /// at half of it.
    pub(crate) partial_grace: Duration,
}

impl DurableStore {
    /// `file:///abs/dir` or `/abs/dir` → local directory (created if missing);
    /// `s3://bucket[/prefix]` → S3 configured from `AWS_*` env vars (`AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`, credentials, region); `gs://bucket[/prefix]` → GCS from `GOOGLE_*`;
    /// `az://container[/prefix]` → Azure from `AZURE_*`.
    pub fn from_url(url: &str) -> Result<Self> {
        Self::from_url_with_options(url, std::iter::empty::<(String, String)>())
    }

    /// [`DurableStore::from_url`], with builder options on top of the environment (keys as in
    /// `object_store`'s config keys, e.g. `aws_endpoint`, `aws_allow_http`,
    /// `aws_access_key_id`). Options are refused for local directories.
    pub fn from_url_with_options<K: AsRef<str>, V: Into<String>>(
        url: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self> {
        let bad = |message: String| Error::StoreUrl {
            url: url.to_string(),
            message,
        };
        let options: Vec<(String, String)> = options
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.into()))
            .collect();
        let trimmed = url.trim_end_matches('/');
        if let Some(dir) = trimmed.strip_prefix("file://").or_else(|| {
            trimmed
                .starts_with('/')
                .then_some(trimmed)
                .filter(|_| !url.contains("://"))
        }) {
            if !dir.starts_with('/') {
                return Err(bad("file:// needs an absolute path (file:///dir)".into()));
            }
            if !options.is_empty() {
                return Err(bad("a local directory takes no options".into()));
            }
            let dir = if dir.is_empty() { "/" } else { dir };
            fs::create_dir_all(dir).map_err(|e| Error::io("create dir", dir, e))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| bad(e.to_string()))?
                .with_automatic_cleanup(true);
            return Ok(Self {
                store: Arc::new(store),
                url: format!("file://{}", dir.trim_end_matches('/')),
                prefix: Vec::new(),
                parallelism: DEFAULT_PARALLELISM,
                partial_grace: DEFAULT_PARTIAL_GRACE,
            });
        }
        let (scheme, rest) = trimmed.split_once("://").ok_or_else(|| {
            bad("expected file://, s3://, gs://, az:// or an absolute path".into())
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket / container".into()));
        }
        let prefix = split_key(prefix, true).map_err(|_| bad("invalid prefix".into()))?;
        let opt_err = |k: &str, e: object_store::Error| bad(format!("option {k}: {e}"));
        let store: Arc<dyn ObjectStore> = match scheme {
            "s3" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
                for (k, v) in options {
                    b = b.with_config(k.parse().map_err(|e| opt_err(&k, e))?, v);
                }
                Arc::new(b.build().map_err(|e| bad(e.to_string()))?)
            }
            "gs" => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket);
                for (k, v) in options {
                    b = b.with_config(k.parse().map_err(|e| opt_err(&k, e))?, v);
                }
                Arc::new(b.build().map_err(|e| bad(e.to_string()))?)
            }
            "az" => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(bucket);
                for (k, v) in options {
                    b = b.with_config(k.parse().map_err(|e| opt_err(&k, e))?, v);
                }
                Arc::new(b.build().map_err(|e| bad(e.to_string()))?)
            }
            other => {
                return Err(bad(format!(
                    "unknown scheme {other:?} (use file://, s3://, gs:// or az://)"
                )));
            }
        };
        Ok(Self {
            store,
            url: trimmed.to_string(),
            prefix,
            parallelism: DEFAULT_PARALLELISM,
            partial_grace: DEFAULT_PARTIAL_GRACE,
        })
    }

    /// Files transferred at once (default 4).
    pub fn with_parallelism(mut self, n: usize) -> Self {
        self.parallelism = n.max(1);
        self
    }

    /// Grace age of partial uploads (default [`DEFAULT_PARTIAL_GRACE`], 1 hour). A key with
    /// objects but no `manifest.json` whose newest object is older than this is deleted by
    /// [`DurableStore::sweep_partial_uploads`]; in exchange an upload that has run longer than
    /// half of it fails without writing its manifest (a sweep elsewhere may have taken its files).
    /// Every node sharing a store should use the same value. Zero: uploads have no time limit
    /// and sweeping is refused (only when no node sweeps this store).
    pub fn with_partial_grace(mut self, grace: Duration) -> Self {
        self.partial_grace = grace;
        self
    }

    /// See [`DurableStore::with_partial_grace`].
    pub fn partial_grace(&self) -> Duration {
        self.partial_grace
    }

    /// The normalized store url; uris are `<url>/<key>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Durable uri of `key` in this store.
    pub fn uri(&self, key: &str) -> Result<String> {
        split_key(key, false)?;
        Ok(format!("{}/{}", self.url, key.trim_matches('/')))
    }

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

    /// Deletes every object of the generation, the manifest first. Idempotent.
    pub async fn delete(&self, uri_or_key: &str) -> Result<()> {
        let key = self.key_of(uri_or_key)?;
        let base = self.base(&key)?;
        let mpath = obj_child(&base, MANIFEST_FILE);
        match self.store.delete(&mpath).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::object(&mpath, e)),
        }
        self.delete_prefix(&base).await
    }

    /// True when the generation's `manifest.json` is present (the upload finished).
    pub async fn exists_complete(&self, uri_or_key: &str) -> Result<bool> {
        let key = self.key_of(uri_or_key)?;
        let mpath = obj_child(&self.base(&key)?, MANIFEST_FILE);
        match self.store.head(&mpath).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Error::object(&mpath, e)),
        }
    }

    /// Keys of all objects under `uri_or_key` (for tests and operators).
    pub async fn list_objects(&self, uri_or_key: &str) -> Result<Vec<String>> {
        let key = self.key_of(uri_or_key)?;
        let base = self.base(&key)?;
        let mut out = Vec::new();
        let mut s = self.store.list(Some(&base));
        while let Some(m) = s.next().await {
            out.push(m.map_err(|e| Error::object(&base, e))?.location.to_string());
        }
        out.sort();
        Ok(out)
    }

    async fn delete_prefix(&self, base: &ObjPath) -> Result<()> {
        let mut listed = Vec::new();
        let mut s = self.store.list(Some(base));
        while let Some(m) = s.next().await {
            match m {
                Ok(m) => listed.push(m.location),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::object(base, e)),
            }
        }
        // Manifest first even here: a failed upload might have raced a retry that wrote one.
        listed.sort_by_key(|p| p.filename() != Some(MANIFEST_FILE));
        for p in listed {
            match self.store.delete(&p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::object(&p, e)),
            }
        }
        Ok(())
    }

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
        let mut listing = self.store.list((!self.prefix.is_empty()).then_some(&root));
        while let Some(item) = listing.next().await {
            let m = match item {
                Ok(m) => m,
                // Deleted between the listing and its metadata (local directories).
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::object(&root, e)),
            };
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
        let mut objects: Vec<ObjectMeta> = Vec::new();
        let mut listing = self.store.list(Some(key));
        while let Some(item) = listing.next().await {
            match item {
                Ok(m) => objects.push(m),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::object(key, e)),
            }
        }
        drop(listing);
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

    /// Accepts `<store url>/<key>` or a bare key.
    pub(crate) fn key_of(&self, uri_or_key: &str) -> Result<String> {
        let key = if uri_or_key.contains("://") {
            uri_or_key
                .strip_prefix(&self.url)
                .and_then(|r| r.strip_prefix('/'))
                .ok_or_else(|| Error::InvalidName {
                    what: "durable uri",
                    value: uri_or_key.to_string(),
                    message: format!("not in this store ({})", self.url),
                })?
        } else {
            uri_or_key
        };
        split_key(key, false)?;
        Ok(key.trim_matches('/').to_string())
    }

    pub(crate) fn base(&self, key: &str) -> Result<ObjPath> {
        let parts = self
            .prefix
            .iter()
            .cloned()
            .chain(split_key(key, false)?)
            .collect::<Vec<_>>();
        Ok(ObjPath::from_iter(parts))
    }
}

fn obj_child(base: &ObjPath, rel: &str) -> ObjPath {
    let mut p = base.clone();
    for seg in rel.split('/') {
        p = p.join(seg);
    }
    p
}

/// How long an upload may run before its manifest must be written: half the store's grace age
/// (the other half is margin for the manifest PUT and for clocks that disagree).
pub(crate) struct Deadline {
    start: Instant,
    /// None: no limit (grace age zero).
    limit: Option<Duration>,
    uri: String,
}

impl Deadline {
    /// Time left; None without a limit.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.limit
            .map(|limit| limit.saturating_sub(self.start.elapsed()))
    }

    pub(crate) fn check(&self) -> Result<()> {
        match self.limit {
            Some(limit) if self.start.elapsed() > limit => Err(self.exceeded()),
            _ => Ok(()),
        }
    }

    pub(crate) fn exceeded(&self) -> Error {
        Error::UploadTooSlow {
            uri: self.uri.clone(),
            elapsed: self.start.elapsed(),
            limit: self.limit.unwrap_or_default(),
        }
    }
}

/// A multipart upload that is aborted unless it is finished: S3 keeps the parts of an upload
/// that is neither completed nor aborted (billed, and invisible to `list`) until a bucket
/// lifecycle rule removes them. Dropping the guard (an early return, a cancelled upload) aborts
/// it in a task of its own.
struct MultipartGuard {
    writer: Option<WriteMultipart>,
    obj: ObjPath,
}

impl MultipartGuard {
    /// Creates the multipart upload in a task of its own. Cancelled while S3 creates it, a
    /// plain call would drop the upload's id with its response and leave it incomplete; here
    /// the guard is built in the task, and one nobody receives any more aborts on drop.
    async fn start(store: Arc<dyn ObjectStore>, obj: ObjPath) -> Result<Self> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let target = obj.clone();
        tokio::spawn(async move {
            let started = store.put_multipart(&target).await.map(|up| Self {
                writer: Some(WriteMultipart::new_with_chunk_size(up, PART_SIZE)),
                obj: target.clone(),
            });
            // A send that fails hands the guard back here, and dropping it aborts the upload.
            let _ = tx.send(started);
        });
        match rx.await {
            Ok(started) => started.map_err(|e| Error::object(&obj, e)),
            Err(_) => Err(Error::Task {
                what: format!("start a multipart upload of {obj}"),
                message: "the task ended without a result".into(),
            }),
        }
    }

    fn put(&mut self, chunk: Bytes) {
        if let Some(w) = self.writer.as_mut() {
            w.put(chunk);
        }
    }

    async fn wait_for_capacity(&mut self, parts: usize) -> object_store::Result<()> {
        match self.writer.as_mut() {
            Some(w) => w.wait_for_capacity(parts).await,
            None => Ok(()),
        }
    }

    /// Aborts and waits for it; a failure is logged (the lifecycle rule is the fallback).
    async fn abort(mut self) {
        if let Some(w) = self.writer.take() {
            // Spawned: a caller dropped while waiting does not cut the abort short.
            let _ = tokio::spawn(abort_multipart(w, self.obj.clone())).await;
        }
    }

    /// Uploads the last part and completes the upload (`WriteMultipart::finish` aborts it
    /// itself when a part or the completion fails). Spawned, so a caller dropped half-way
    /// leaves neither an incomplete upload nor one cut off between its parts.
    async fn finish(mut self) -> Result<()> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        match tokio::spawn(w.finish()).await {
            Ok(done) => done.map(|_| ()).map_err(|e| Error::object(&self.obj, e)),
            Err(e) => Err(Error::task(format!("complete {}", self.obj), e)),
        }
    }
}

impl Drop for MultipartGuard {
    fn drop(&mut self) {
        let Some(w) = self.writer.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(abort_multipart(w, self.obj.clone()));
            }
            Err(_) => {
                tracing::warn!(object = %self.obj, "multipart upload left incomplete: no runtime to abort it on");
            }
        }
    }
}

async fn abort_multipart(w: WriteMultipart, obj: ObjPath) {
    if let Err(e) = w.abort().await {
        tracing::warn!(object = %obj, error = %e, "cannot abort a multipart upload; the bucket's AbortIncompleteMultipartUpload rule has to remove it");
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

/// `/`-separated key segments: non-empty, no `.`/`..`, printable. `allow_empty` for prefixes.
fn split_key(key: &str, allow_empty: bool) -> Result<Vec<String>> {
    let key = key.trim_matches('/');
    let bad = |message: &str| Error::InvalidName {
        what: "key",
        value: key.to_string(),
        message: message.to_string(),
    };
    if key.is_empty() {
        return if allow_empty {
            Ok(Vec::new())
        } else {
            Err(bad("empty"))
        };
    }
    key.split('/')
        .map(|seg| {
            if seg.is_empty() || seg == "." || seg == ".." {
                Err(bad("empty, '.' or '..' segment"))
            } else if seg.chars().any(|c| c.is_control() || c == '\\') {
                Err(bad("control character or backslash"))
            } else {
                Ok(seg.to_string())
            }
        })
        .collect()
}

/// How an upload shares the cores with the rest of the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadPriority {
    /// Tokio's blocking pool at normal priority: someone waits for this upload (a DURABLE
    /// suspend, a detach before a move).
    #[default]
    Normal,
    /// A thread of its own at nice [`BACKGROUND_NICE`]: the upload after an ASYNC suspend,
    /// which nobody waits for. Its hashing and zstd (~0.1 s of CPU per 50 MiB) then take only
    /// the CPU that resumes and requests leave over, instead of an equal share of it.
    Background,
}

/// Nice value of background compression threads (the lowest priority).
pub const BACKGROUND_NICE: i32 = 19;

/// Runs [`compress_file`] at `priority`; the receiver gets its result (dropped without one only
/// if the work panicked).
fn spawn_compress(
    src: PathBuf,
    tx: mpsc::Sender<Bytes>,
    priority: UploadPriority,
) -> Result<tokio::sync::oneshot::Receiver<Result<(u64, String)>>> {
    spawn_at(priority, move || compress_file(&src, tx))
}

/// Starts blocking `work` at once at `priority`: on the blocking pool, or for
/// [`UploadPriority::Background`] on a thread of its own at [`BACKGROUND_NICE`] (not the shared
/// pool: the nice value stays with the thread, and a pool thread kept at nice 19 would slow
/// whatever it runs next). The receiver gets its result (dropped without one only if it panicked).
fn spawn_at<T: Send + 'static>(
    priority: UploadPriority,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<T>> {
    let (done, result) = tokio::sync::oneshot::channel();
    let work = move || {
        let _ = done.send(work());
    };
    match priority {
        UploadPriority::Normal => {
            tokio::task::spawn_blocking(work);
        }
        UploadPriority::Background => {
            std::thread::Builder::new()
                .name("ate-upload-bg".into())
                .spawn(move || {
                    lower_this_thread_priority(BACKGROUND_NICE);
                    work();
                })
                .map_err(|e| Error::Task {
                    what: "start a background compression thread".into(),
                    message: e.to_string(),
                })?;
        }
    }
    Ok(result)
}

/// [`spawn_at`], awaited.
pub(crate) async fn run_at<T: Send + 'static>(
    priority: UploadPriority,
    what: String,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    spawn_at(priority, work)?.await.map_err(|_| Error::Task {
        what,
        message: "the work ended without a result".into(),
    })?
}

/// Sets the calling thread's nice value to `nice` (Linux keeps nice per thread; processes the
/// thread starts inherit it). Best effort: on failure the work runs at normal priority. Also
/// used by the worker's background threads.
pub fn lower_this_thread_priority(nice: i32) {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority only reads its integer arguments; `tid` is this thread's own id.
    let rc = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::id_t::try_from(tid).unwrap_or(0),
            nice,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "could not lower a background thread's priority");
    }
}

/// Reads `src`, hashing the raw bytes, and sends zstd-compressed chunks. Returns (size, sha256).
fn compress_file(src: &Path, tx: mpsc::Sender<Bytes>) -> Result<(u64, String)> {
    let mut file = File::open(src).map_err(|e| Error::io("open", src, e))?;
    let mut enc = zstd::stream::write::Encoder::new(Vec::with_capacity(CHUNK * 2), ZSTD_LEVEL)
        .map_err(|e| Error::io("zstd init", src, e))?;
    // Frame checksum: a corrupted object fails in the decoder, before the sha256 check.
    enc.include_checksum(true)
        .map_err(|e| Error::io("zstd init", src, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    let closed = || Error::Task {
        what: format!("upload {}", src.display()),
        message: "receiver closed".into(),
    };
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("read", src, e)),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
        enc.write_all(&buf[..n])
            .map_err(|e| Error::io("compress", src, e))?;
        if enc.get_ref().len() >= CHUNK {
            let out = std::mem::take(enc.get_mut());
            tx.blocking_send(Bytes::from(out)).map_err(|_| closed())?;
        }
    }
    let out = enc.finish().map_err(|e| Error::io("compress", src, e))?;
    if !out.is_empty() {
        tx.blocking_send(Bytes::from(out)).map_err(|_| closed())?;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// `Read` over the chunks the async side receives from the object store.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

/// Decodes the streamed object into `dst` ([`decompress_into`]).
fn decompress_file(rx: mpsc::Receiver<Bytes>, dst: &Path, f: &FileEntry, key: &str) -> Result<()> {
    let reader = ChannelReader {
        rx,
        cur: Bytes::new(),
    };
    decompress_into(reader, dst, f, key)
}

/// Decodes into `dst`, checking size (bounded, so a bad object cannot fill the disk) and sha256.
fn decompress_into(reader: impl Read, dst: &Path, f: &FileEntry, key: &str) -> Result<()> {
    let dec = zstd::stream::read::Decoder::new(reader).map_err(|e| Error::Decompress {
        key: key.to_string(),
        source: e,
    })?;
    let mut limited = dec.take(f.size + 1);
    let mut out = File::create(dst).map_err(|e| Error::io("create", dst, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match limited.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Error::Decompress {
                    key: key.to_string(),
                    source: e,
                });
            }
        };
        hasher.update(&buf[..n]);
        size += n as u64;
        out.write_all(&buf[..n])
            .map_err(|e| Error::io("write", dst, e))?;
    }
    if size != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: size,
        });
    }
    let sha = hex::encode(hasher.finalize());
    if sha != f.sha256 {
        return Err(Error::ChecksumMismatch {
            file: f.path.clone(),
            expected: f.sha256.clone(),
            actual: sha,
        });
    }
    // Not synced: a download is a verified cache (see `download_into`).
    out.flush().map_err(|e| Error::io("write", dst, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field 19 of `/proc/thread-self/stat`: the calling thread's nice value.
    fn this_thread_nice() -> i32 {
        let stat = fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
        // The command name (field 2) may hold spaces; count from the closing parenthesis.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        after
            .split_whitespace()
            .nth(16)
            .and_then(|v| v.parse().ok())
            .unwrap_or(i32::MIN)
    }

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

    #[test]
    fn background_threads_run_at_the_lowest_priority_and_others_do_not() {
        let before = this_thread_nice();
        let lowered = std::thread::spawn(|| {
            lower_this_thread_priority(BACKGROUND_NICE);
            this_thread_nice()
        })
        .join()
        .unwrap_or(i32::MIN);
        assert_eq!(lowered, BACKGROUND_NICE);
        // Only that thread: the test's own thread keeps its nice value.
        assert_eq!(this_thread_nice(), before);
    }
}
