//! Durable copies of generations in an object store (local directory, S3, GCS, Azure).
//!
//! Layout under `<store url>/<key>/`: `<file>.zst` for every file of the manifest (zstd level 3),
//! then `manifest.json` (plain JSON), uploaded last and deleted first, so an object set without a
//! manifest is never taken for a complete generation.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::generation::{self, fsync_dir, sibling, write_manifest};
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

/// What one upload or download moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub files: usize,
    /// Uncompressed bytes (the generation's size).
    pub raw_bytes: u64,
    pub elapsed: Duration,
}

/// An object store plus the prefix generations live under.
#[derive(Debug, Clone)]
pub struct DurableStore {
    store: Arc<dyn ObjectStore>,
    /// Normalized, no trailing `/` (`file:///var/lib/ate/durable`, `s3://bucket/prefix`).
    url: String,
    prefix: Vec<String>,
    parallelism: usize,
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
        })
    }

    /// Files transferred at once (default 4).
    pub fn with_parallelism(mut self, n: usize) -> Self {
        self.parallelism = n.max(1);
        self
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
        Ok(self.upload_prioritized(gen_dir, key, priority).await?.0)
    }

    /// [`DurableStore::upload`] with the amount moved and the time it took.
    pub async fn upload_with_stats(
        &self,
        gen_dir: &Path,
        key: &str,
    ) -> Result<(String, TransferStats)> {
        self.upload_prioritized(gen_dir, key, UploadPriority::Normal)
            .await
    }

    async fn upload_prioritized(
        &self,
        gen_dir: &Path,
        key: &str,
        priority: UploadPriority,
    ) -> Result<(String, TransferStats)> {
        let start = Instant::now();
        let uri = self.uri(key)?;
        let base = self.base(key)?;
        // Sizes only here: every file is hashed while it is compressed and a mismatch fails the
        // upload before the manifest is written (so the copy never becomes COMPLETED).
        let (manifest, manifest_bytes) = generation::verify_with_bytes(gen_dir, false).await?;
        // Futures are built eagerly and boxed: a stream `map` closure here makes the caller's future
        // fail rustc's higher-ranked `Send` check (rust-lang/rust#102211).
        let transfers: Vec<_> = manifest
            .files
            .iter()
            .map(|f| self.upload_file(gen_dir, &base, f, priority).boxed())
            .collect();
        let results: Vec<Result<()>> = futures::stream::iter(transfers)
            .buffer_unordered(self.parallelism)
            .collect()
            .await;
        // Every transfer has finished (none is cancelled half-way), so cleanup sees all objects.
        let first_err = results.into_iter().find_map(Result::err);
        let result = match first_err {
            Some(e) => Err(e),
            None => {
                let mpath = obj_child(&base, MANIFEST_FILE);
                self.store
                    .put(&mpath, PutPayload::from(manifest_bytes))
                    .await
                    .map(|_| ())
                    .map_err(|e| Error::object(&mpath, e))
            }
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
            elapsed: start.elapsed(),
        };
        tracing::info!(
            uri,
            files = stats.files,
            bytes = stats.raw_bytes,
            ms = stats.elapsed.as_millis() as u64,
            "generation uploaded"
        );
        Ok((uri, stats))
    }

    async fn upload_file(
        &self,
        gen_dir: &Path,
        base: &ObjPath,
        f: &FileEntry,
        priority: UploadPriority,
    ) -> Result<()> {
        let obj = obj_child(base, &format!("{}.zst", f.path));
        let src = gen_dir.join(&f.path);
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let producer = spawn_compress(src.clone(), tx, priority)?;

        // Small objects are one PUT; from PART_SIZE on, a multipart upload.
        let mut pending: Vec<Bytes> = Vec::new();
        let mut pending_len = 0usize;
        let mut multipart: Option<WriteMultipart> = None;
        let mut send_err: Option<object_store::Error> = None;
        while let Some(chunk) = rx.recv().await {
            if let Some(w) = multipart.as_mut() {
                if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    send_err = Some(e);
                    break;
                }
                w.put(chunk);
                continue;
            }
            pending_len += chunk.len();
            pending.push(chunk);
            if pending_len >= PART_SIZE {
                match self.store.put_multipart(&obj).await {
                    Ok(up) => {
                        let mut w = WriteMultipart::new_with_chunk_size(up, PART_SIZE);
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
        let produced = producer.await.map_err(|_| Error::Task {
            what: format!("compress {}", src.display()),
            message: "the compressing thread ended without a result".into(),
        })?;
        if let Some(e) = send_err {
            if let Some(w) = multipart {
                let _ = w.abort().await;
            }
            return Err(Error::object(&obj, e));
        }
        let (size, sha) = match produced {
            Ok(v) => v,
            Err(e) => {
                if let Some(w) = multipart {
                    let _ = w.abort().await;
                }
                return Err(e);
            }
        };
        // The file changed after verify: do not store something the manifest does not describe.
        if size != f.size || sha != f.sha256 {
            if let Some(w) = multipart {
                let _ = w.abort().await;
            }
            return Err(if size != f.size {
                Error::SizeMismatch {
                    file: f.path.clone(),
                    expected: f.size,
                    actual: size,
                }
            } else {
                Error::ChecksumMismatch {
                    file: f.path.clone(),
                    expected: f.sha256.clone(),
                    actual: sha,
                }
            });
        }
        match multipart {
            Some(w) => w.finish().await.map(|_| ()),
            None => self
                .store
                .put(&obj, PutPayload::from_iter(pending))
                .await
                .map(|_| ()),
        }
        .map_err(|e| Error::object(&obj, e))
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
        let mpath = obj_child(&base, MANIFEST_FILE);
        let manifest_bytes = match self.store.get(&mpath).await {
            Ok(r) => r.bytes().await.map_err(|e| Error::object(&mpath, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::NotComplete {
                    uri: self.uri(&key)?,
                });
            }
            Err(e) => return Err(Error::object(&mpath, e)),
        };
        let manifest = Manifest::from_json(&manifest_bytes)?;

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

    async fn download_into(
        &self,
        base: &ObjPath,
        manifest: &Manifest,
        manifest_bytes: &[u8],
        tmp: &Path,
        target: &Path,
    ) -> Result<()> {
        // Built eagerly and boxed for the same reason as in upload (rust-lang/rust#102211).
        let transfers: Vec<_> = manifest
            .files
            .iter()
            .map(|f| self.download_file(base, f, tmp).boxed())
            .collect();
        let results: Vec<Result<()>> = futures::stream::iter(transfers)
            .buffer_unordered(self.parallelism)
            .collect()
            .await;
        if let Some(e) = results.into_iter().find_map(Result::err) {
            return Err(e);
        }
        let tmp_owned = tmp.to_path_buf();
        let bytes = manifest_bytes.to_vec();
        tokio::task::spawn_blocking(move || {
            crate::generation::sync_filesystem(&tmp_owned)?;
            write_manifest(&tmp_owned, &bytes)
        })
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
        let mut stream = match self.store.get(&obj).await {
            Ok(r) => r.into_stream(),
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::MissingFile {
                    file: f.path.clone(),
                });
            }
            Err(e) => return Err(Error::object(&obj, e)),
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

    /// Accepts `<store url>/<key>` or a bare key.
    fn key_of(&self, uri_or_key: &str) -> Result<String> {
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

    fn base(&self, key: &str) -> Result<ObjPath> {
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
    let (done, result) = tokio::sync::oneshot::channel();
    let work = move || {
        let _ = done.send(compress_file(&src, tx));
    };
    match priority {
        UploadPriority::Normal => {
            tokio::task::spawn_blocking(work);
        }
        UploadPriority::Background => {
            // A thread per file, not the shared pool: the nice value stays with the thread,
            // and a pool thread kept at nice 19 would slow whatever it runs next.
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

/// Decodes into `dst`, checking size (bounded, so a bad object cannot fill the disk) and sha256.
fn decompress_file(rx: mpsc::Receiver<Bytes>, dst: &Path, f: &FileEntry, key: &str) -> Result<()> {
    let reader = ChannelReader {
        rx,
        cur: Bytes::new(),
    };
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
    // Durable with the rest of the download: one syncfs before the manifest is written.
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
