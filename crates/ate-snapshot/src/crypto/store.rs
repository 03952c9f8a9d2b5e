//! [`EncryptedStore`]: an `ObjectStore` that seals every object it writes and opens every object
//! it reads (see the module above), in front of the real store. Listing, heads and deletes pass
//! through (names and sizes are not secret); a ranged read fetches and opens the whole object
//! (only chunk headers are read by range, and a chunk is at most 2 MiB).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

use super::{OpenError, Opener, Sealer, SnapshotKeys, join, open_object, seal_object};

const STORE: &str = "ate-encrypted";

fn generic(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: Box::new(e),
    }
}

/// The authentication failure inside an `object_store::Error`, if that is what it is, and
/// whether it says the object is damaged: an object sealed under another data key is not (a
/// node given the wrong keys must not mark every copy it reads as damaged; it never serves one
/// either way).
pub(crate) fn open_error(e: &object_store::Error) -> Option<(String, bool)> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(o) = err.downcast_ref::<OpenError>() {
            return Some((o.to_string(), !matches!(o, OpenError::OtherKey { .. })));
        }
        cur = err.source();
    }
    None
}

#[derive(Clone)]
pub(crate) struct EncryptedStore {
    inner: Arc<dyn ObjectStore>,
    keys: SnapshotKeys,
}

impl EncryptedStore {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, keys: SnapshotKeys) -> Self {
        Self { inner, keys }
    }
}

impl EncryptedStore {
    /// `range` of the object at `location` from its first stored bytes alone, when they hold it
    /// (objects sealed with a short first frame, [`super::FIRST_FRAME_BYTES`]) or are the whole
    /// object; `None` when it lies further on (then the whole object is read).
    async fn first_frame(
        &self,
        location: &Path,
        options: &GetOptions,
        range: &object_store::GetRange,
    ) -> object_store::Result<Option<GetResult>> {
        let want = match range {
            object_store::GetRange::Bounded(r) => r.end,
            _ => return Ok(None),
        };
        if want > super::FIRST_FRAME_BYTES as u64 {
            return Ok(None);
        }
        let head = GetOptions {
            range: Some((0..super::FIRST_FRAME_STORED_BYTES as u64).into()),
            ..options.clone()
        };
        let got = self.inner.get_opts(location, head).await?;
        let (meta, attributes, extensions) = (
            got.meta.clone(),
            got.attributes.clone(),
            got.extensions.clone(),
        );
        let stored = got.bytes().await?;
        let whole = stored.len() as u64 >= meta.size;
        let mut opener = Opener::new(&self.keys, location.as_ref());
        let plain = join(opener.push(&stored).map_err(generic)?);
        if whole {
            opener.finish().map_err(generic)?;
        } else if (plain.len() as u64) < want {
            return Ok(None); // a long first frame (sealed before short ones)
        }
        ranged(plain, range, meta, attributes, extensions).map(Some)
    }
}

/// `range` of the opened `plain` (the whole object, or a prefix of it that covers `range`).
fn ranged(
    plain: Bytes,
    range: &object_store::GetRange,
    meta: ObjectMeta,
    attributes: object_store::Attributes,
    extensions: object_store::Extensions,
) -> object_store::Result<GetResult> {
    let r: Range<u64> = range
        .as_range(plain.len() as u64)
        .map_err(|e| generic(std::io::Error::other(e.to_string())))?;
    let slice = plain.slice(r.start as usize..r.end as usize);
    Ok(GetResult {
        payload: GetResultPayload::Stream(futures::stream::once(async move { Ok(slice) }).boxed()),
        meta,
        range: r,
        attributes,
        extensions,
    })
}

impl fmt::Debug for EncryptedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptedStore")
            .field("inner", &self.inner)
            .field("keys", &self.keys)
            .finish()
    }
}

impl fmt::Display for EncryptedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Encrypted({})", self.inner)
    }
}

fn payload_bytes(p: &PutPayload) -> Vec<u8> {
    let mut v = Vec::with_capacity(p.content_length());
    for b in p.iter() {
        v.extend_from_slice(b);
    }
    v
}

#[async_trait]
impl ObjectStore for EncryptedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let keys = self.keys.clone();
        let path = location.to_string();
        // Sealing a 2 MiB chunk takes about a millisecond; keep it off the async threads.
        let sealed = tokio::task::spawn_blocking(move || {
            // Most payloads are one piece (a compressed chunk): sealed without joining first.
            let mut parts = payload.iter();
            match (parts.next(), parts.next()) {
                (Some(one), None) => seal_object(&keys, &path, one),
                _ => seal_object(&keys, &path, &payload_bytes(&payload)),
            }
        })
        .await
        .map_err(generic)?
        .map_err(generic)?;
        self.inner
            .put_opts(location, PutPayload::from(sealed), opts)
            .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let sealer = Sealer::new(&self.keys, location.as_ref()).map_err(generic)?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(SealedUpload {
            inner,
            sealer: Some(sealer),
            header_sent: false,
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if options.head {
            return self.inner.get_opts(location, options).await;
        }
        let path = location.to_string();
        if let Some(range) = options.range.clone() {
            // The first frame first: what a delta header's read needs, without the object.
            if let Some(got) = self.first_frame(location, &options, &range).await? {
                return Ok(got);
            }
            let whole = GetOptions {
                range: None,
                ..options
            };
            let got = self.inner.get_opts(location, whole).await?;
            let (meta, attributes, extensions) = (
                got.meta.clone(),
                got.attributes.clone(),
                got.extensions.clone(),
            );
            let stored = got.bytes().await?;
            let keys = self.keys.clone();
            let plain = tokio::task::spawn_blocking(move || open_object(&keys, &path, &stored))
                .await
                .map_err(generic)?
                .map_err(generic)?;
            return ranged(plain, &range, meta, attributes, extensions);
        }
        let got = self.inner.get_opts(location, options).await?;
        let meta = got.meta.clone();
        let attributes = got.attributes.clone();
        let extensions = got.extensions.clone();
        let opener = Opener::new(&self.keys, &path);
        let size = meta.size;
        let inner = match got.payload {
            // A local file of a chunk's size is opened whole, out of place from a mapping of
            // it: one pass over its bytes (a 1 GiB durable download's chunks were read, copied
            // into the opener, opened in place and joined: docs/benchmarks.md).
            GetResultPayload::File(file, _) if size <= WHOLE_OPEN_MAX_BYTES => {
                let keys = self.keys.clone();
                let plain =
                    tokio::task::spawn_blocking(move || open_local(&keys, &path, &file, size))
                        .await
                        .map_err(generic)??;
                let len = plain.len() as u64;
                return Ok(GetResult {
                    payload: GetResultPayload::Stream(
                        futures::stream::once(async move { Ok(plain) }).boxed(),
                    ),
                    meta,
                    range: 0..len,
                    attributes,
                    extensions,
                });
            }
            // A larger one is read in large pieces (the local store's own stream reads 8 KiB
            // at a time) and opened as it comes.
            GetResultPayload::File(file, _) => file_stream(file),
            GetResultPayload::Stream(s) => s,
        };
        // State: the stored stream, the opener, frames opened but not yet handed on, done.
        let stream = futures::stream::unfold(
            (
                inner,
                opener,
                std::collections::VecDeque::<Bytes>::new(),
                false,
            ),
            |(mut inner, mut opener, mut ready, done)| async move {
                loop {
                    if let Some(b) = ready.pop_front() {
                        return Some((Ok(b), (inner, opener, ready, done)));
                    }
                    if done {
                        return None;
                    }
                    match inner.next().await {
                        Some(Ok(piece)) => match opener.push(&piece) {
                            Ok(frames) => ready.extend(frames),
                            Err(e) => return Some((Err(generic(e)), (inner, opener, ready, true))),
                        },
                        Some(Err(e)) => return Some((Err(e), (inner, opener, ready, true))),
                        None => {
                            return match opener.finish() {
                                Ok(()) => None,
                                Err(e) => Some((Err(generic(e)), (inner, opener, ready, true))),
                            };
                        }
                    }
                }
            },
        )
        .boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream),
            meta,
            // The plaintext is shorter than the stored object; callers read to the end.
            range: 0..size,
            attributes,
            extensions,
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    /// Objects are bound to their path: a copy is opened and sealed again for its new one.
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let plain = self
            .get_opts(from, GetOptions::default())
            .await?
            .bytes()
            .await?;
        let mode = match options.mode {
            object_store::CopyMode::Overwrite => object_store::PutMode::Overwrite,
            object_store::CopyMode::Create => object_store::PutMode::Create,
        };
        self.put_opts(
            to,
            PutPayload::from(plain),
            PutOptions {
                mode,
                ..Default::default()
            },
        )
        .await
        .map(|_| ())
    }
}

/// Objects a local store's file is opened whole for: a chunk object (2 MiB and a delta's
/// header) with room; archives and images larger than this stream frame by frame.
const WHOLE_OPEN_MAX_BYTES: u64 = 8 << 20;

/// Opens the local stored object `file` of `len` bytes (the size the store read when it opened
/// it) whole: through a read-only mapping, or (a file that cannot be mapped, such as an empty
/// one) read into memory first.
fn open_local(
    keys: &SnapshotKeys,
    path: &str,
    file: &std::fs::File,
    len: u64,
) -> object_store::Result<Bytes> {
    let mapped = usize::try_from(len)
        .ok()
        .filter(|&n| n > 0)
        .and_then(|n| super::mapped::Mapped::new(file, 0, n).ok());
    let opened = match &mapped {
        Some(map) => open_object(keys, path, map.bytes()),
        None => {
            use std::io::Read;
            let mut stored = Vec::new();
            let mut reader = file;
            reader.read_to_end(&mut stored).map_err(generic)?;
            open_object(keys, path, &stored)
        }
    };
    opened.map_err(generic)
}

/// Reads `file` to its end in pieces of up to four frames, on blocking threads. Each piece is
/// read into a buffer of exactly its size that is not zeroed first, and the read stops at the
/// file's length (no extra read to find the end): a 2 MiB chunk object is one allocation and
/// one read (two zeroed 4 MiB buffers per chunk were most of a 1 GiB download's time).
fn file_stream(file: std::fs::File) -> BoxStream<'static, object_store::Result<Bytes>> {
    // Unknown (metadata failed): read until a read returns nothing.
    let len = file.metadata().ok().map(|m| m.len());
    futures::stream::try_unfold((Some(file), 0u64), move |(file, at)| async move {
        let Some(file) = file else {
            return Ok(None);
        };
        let left = len.map_or(u64::MAX, |len| len.saturating_sub(at));
        if left == 0 {
            return Ok(None);
        }
        let want = left.min(4 * (super::FRAME_BYTES as u64 + 64)) as usize;
        let (file, piece) = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut buf = Vec::with_capacity(want);
            (&file)
                .take(want as u64)
                .read_to_end(&mut buf)
                .map_err(generic)?;
            Ok::<_, object_store::Error>((file, buf))
        })
        .await
        .map_err(generic)??;
        if piece.is_empty() {
            return Ok(None);
        }
        let at = at + piece.len() as u64;
        Ok(Some((Bytes::from(piece), (Some(file), at))))
    })
    .boxed()
}

/// A multipart upload whose parts are sealed frames (the header goes with the first part).
struct SealedUpload {
    inner: Box<dyn MultipartUpload>,
    sealer: Option<Sealer>,
    header_sent: bool,
}

impl fmt::Debug for SealedUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedUpload")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl MultipartUpload for SealedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let Some(sealer) = self.sealer.as_mut() else {
            return Box::pin(async { Err(generic(std::io::Error::other("upload finished"))) });
        };
        let plain = payload_bytes(&data);
        let mut out = Vec::with_capacity(plain.len() + 128);
        if !self.header_sent {
            out.extend_from_slice(sealer.header());
            self.header_sent = true;
        }
        if let Err(e) = sealer.seal(&plain, &mut out) {
            return Box::pin(async move { Err(generic(e)) });
        }
        self.inner.put_part(PutPayload::from(Bytes::from(out)))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.sealer = None;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.sealer = None;
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    use super::super::{FRAME_BYTES, Sealer};
    use super::*;

    fn keys() -> SnapshotKeys {
        SnapshotKeys::from_data_key("dk-test", &[7u8; 32]).expect("keys")
    }

    async fn read(store: &EncryptedStore, at: &Path, range: Option<Range<u64>>) -> Vec<u8> {
        let opts = GetOptions {
            range: range.map(Into::into),
            ..Default::default()
        };
        store
            .get_opts(at, opts)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes")
            .to_vec()
    }

    #[tokio::test]
    async fn a_read_of_the_first_bytes_opens_only_the_first_frame() {
        let inner = Arc::new(InMemory::new());
        let store = EncryptedStore::new(inner.clone(), keys());
        let at = Path::from("chunks/ab/abcd");
        let plain: Vec<u8> = (0..2 * FRAME_BYTES).map(|i| (i % 253) as u8).collect();
        store
            .put(&at, PutPayload::from(plain.clone()))
            .await
            .expect("put");
        assert_eq!(read(&store, &at, Some(0..1558)).await, plain[..1558]);
        assert_eq!(read(&store, &at, Some(100..4096)).await, plain[100..4096]);
        assert_eq!(
            read(&store, &at, Some(4000..5000)).await,
            plain[4000..5000],
            "a range past the first frame"
        );
        assert_eq!(read(&store, &at, None).await, plain);

        // Damage the last frame: the first bytes still read (only the first frame was opened),
        // the whole object does not.
        let mut stored = inner.get(&at).await.expect("get").bytes().await.expect("b");
        let mut bad = stored.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        stored = Bytes::from(bad);
        inner.put(&at, PutPayload::from(stored)).await.expect("put");
        assert_eq!(read(&store, &at, Some(0..1558)).await, plain[..1558]);
        let whole = store.get(&at).await.expect("get").bytes().await;
        assert!(whole.is_err(), "a damaged frame opened");
        let past = store
            .get_opts(
                &at,
                GetOptions {
                    range: Some((4000..5000).into()),
                    ..Default::default()
                },
            )
            .await;
        assert!(
            past.is_err(),
            "a range read past the first frame opens the whole object"
        );
    }

    #[tokio::test]
    async fn objects_sealed_with_a_long_first_frame_still_read_by_range() {
        let inner = Arc::new(InMemory::new());
        let k = keys();
        let store = EncryptedStore::new(inner.clone(), k.clone());
        let at = Path::from("chunks/cd/cdef");
        let plain: Vec<u8> = (0..FRAME_BYTES + 10).map(|i| (i % 251) as u8).collect();
        // As objects were sealed before short first frames: 1 MiB, then the rest.
        let mut s = Sealer::new(&k, at.as_ref()).expect("sealer");
        let mut stored = s.header().to_vec();
        s.seal(&plain, &mut stored).expect("seal");
        inner.put(&at, PutPayload::from(stored)).await.expect("put");
        assert_eq!(read(&store, &at, Some(0..1558)).await, plain[..1558]);
        assert_eq!(read(&store, &at, None).await, plain);
        // A small object is read whole by the first read, and checked whole.
        let small = Path::from("chunks/ef/ef01");
        store
            .put(&small, PutPayload::from(vec![5u8; 100]))
            .await
            .expect("put");
        assert_eq!(read(&store, &small, Some(10..1558)).await, vec![5u8; 90]);
    }
}
