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

use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::error::{Error, Result};
use crate::manifest::MANIFEST_FILE;

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

mod codec;
mod download;
mod multipart;
mod priority;
mod sweep;
mod upload;

pub(crate) use priority::run_at;
pub use priority::{BACKGROUND_NICE, UploadPriority, lower_this_thread_priority};
pub use sweep::SweepStats;
pub(crate) use sweep::older_than;

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
    /// Set by [`DurableStore::with_keys`]: every object is sealed under its data key.
    pub(crate) keys: Option<crate::crypto::SnapshotKeys>,
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
                keys: None,
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
            keys: None,
        })
    }

    /// Encrypts and authenticates every object this store writes and reads under `keys`
    /// (AES-256-GCM, each object bound to its path; see docs/security.md, "Snapshots at
    /// rest"), and names memory chunks by a keyed digest. Call once, right after `from_url`.
    pub fn with_keys(mut self, keys: crate::crypto::SnapshotKeys) -> Self {
        if self.keys.is_none() {
            self.store = Arc::new(crate::crypto::EncryptedStore::new(self.store, keys.clone()));
            self.keys = Some(keys);
        }
        self
    }

    /// The keys objects are sealed under, if any.
    pub fn keys(&self) -> Option<&crate::crypto::SnapshotKeys> {
        self.keys.as_ref()
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

    /// Every object under `base`, or in the whole store when `base` is `None` (then `root`
    /// names it in errors). An object deleted between the listing and its metadata (local
    /// directories) is left out.
    pub(crate) fn list_present<'a>(
        &'a self,
        base: Option<&'a ObjPath>,
        root: &'a ObjPath,
    ) -> futures::stream::BoxStream<'a, Result<ObjectMeta>> {
        self.store
            .list(base)
            .filter_map(move |item| async move {
                match item {
                    Ok(m) => Some(Ok(m)),
                    Err(object_store::Error::NotFound { .. }) => None,
                    Err(e) => Some(Err(Error::object(root, e))),
                }
            })
            .boxed()
    }

    /// Every object under the store's prefix, `root` (the whole store without a prefix).
    pub(crate) fn list_under_prefix<'a>(
        &'a self,
        root: &'a ObjPath,
    ) -> futures::stream::BoxStream<'a, Result<ObjectMeta>> {
        self.list_present((!self.prefix.is_empty()).then_some(root), root)
    }

    async fn delete_prefix(&self, base: &ObjPath) -> Result<()> {
        let mut listed = Vec::new();
        let mut s = self.list_present(Some(base), base);
        while let Some(m) = s.next().await {
            listed.push(m?.location);
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
