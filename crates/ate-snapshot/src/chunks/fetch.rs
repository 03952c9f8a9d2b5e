//! Fetching chunks: one for a page fault, the chunks of a file, or a download for a lazy restore.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use object_store::ObjectStoreExt;

use crate::chunk_delta;
use crate::durable::DurableStore;
use crate::error::{Error, Result};
use crate::manifest::{FileEntry, Manifest};

use super::{CHUNKS_IN_FLIGHT, DURABLE_SOURCE_FILE, DurableSource};

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
            let mut obj = self.chunk_object(digest);
            let mut got = self.store.get(&obj).await;
            // A generation written before encryption named its chunks by their plain digests
            // (read only with `--snapshot-legacy-plaintext`).
            if matches!(got, Err(object_store::Error::NotFound { .. }))
                && self.keys.as_ref().is_some_and(|k| k.legacy_plaintext())
            {
                obj = self.legacy_chunk_object(digest);
                got = self.store.get(&obj).await;
            }
            // A chunk that does not open is named by its image and index, as a mismatch is.
            let named = |e: object_store::Error| match Error::object(&obj, e) {
                Error::Unauthentic { message, .. } => Error::Unauthentic {
                    key: format!("{label}, {obj})"),
                    message,
                },
                Error::ForeignKey { message, .. } => Error::ForeignKey {
                    key: format!("{label}, {obj})"),
                    message,
                },
                other => other,
            };
            // (An encrypted local store opens a chunk whole in `get`, a remote one as it
            // streams in: either way a chunk that does not open is named.)
            let got = match got {
                Ok(r) => r.bytes().await.map_err(named)?,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(Error::MissingFile {
                        file: format!("{label}, {obj})"),
                    });
                }
                Err(e) => return Err(named(e)),
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
                keys: self
                    .keys
                    .as_ref()
                    .and_then(|k| k.dir().map(Path::to_path_buf)),
                legacy_plaintext: self.keys.as_ref().is_some_and(|k| k.legacy_plaintext()),
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
}
