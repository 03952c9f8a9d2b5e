//! Memory images read chunk by chunk, wherever the plaintext is: a plain generation's file, a
//! sealed generation's file (its frames opened as they are read), or the sealed generation a
//! scratch dir was partly opened from ([`SEALED_SOURCE_FILE`]).
//!
//! A scratch dir opened for an upload or a lazy restore holds the small files in plaintext (CRIU
//! and the pagemap parser read them by path) but not the memory images: copying a 1 GiB image
//! into a tmpfs before anything can use it was most of what sealing cost (docs/benchmarks.md).
//! Whoever reads chunks (the page source, the uploader, a delta's parent) opens them through
//! [`MemoryFile`], which follows the marker back to the sealed file.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::crypto::SnapshotKeys;
use crate::crypto::file::{SealedError, SealedFile};
use crate::error::{Error, Result};
use crate::manifest::FileEntry;

use super::chunk::{chunk_span, open_listed, read_chunk, verify_chunk_bytes};

/// Left in a scratch dir opened without its memory images: where they are (sealed).
pub const SEALED_SOURCE_FILE: &str = "sealed-source.json";

/// Contents of [`SEALED_SOURCE_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedSource {
    /// The sealed generation directory the scratch was opened from.
    pub generation: PathBuf,
    /// The snapshot keys directory, for a process that did not configure keys (the page
    /// source loads the data key from it, as the worker did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<PathBuf>,
}

/// The [`SealedSource`] of a scratch dir opened without its memory images; `None` for any other
/// generation directory.
pub fn sealed_source(dir: &Path) -> Result<Option<SealedSource>> {
    read_marker(&dir.join(SEALED_SOURCE_FILE))
}

/// A JSON marker file a generation directory may hold (`sealed-source.json`,
/// `durable-source.json`): `None` when it does not.
pub(crate) fn read_marker<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path, e)),
    }
}

pub(super) fn write_sealed_source(dir: &Path, source: &SealedSource) -> Result<()> {
    let json = serde_json::to_vec(source)
        .map_err(|e| Error::InvalidInput(format!("sealed source: {e}")))?;
    let path = dir.join(SEALED_SOURCE_FILE);
    std::fs::write(&path, json).map_err(|e| Error::io("write", &path, e))
}

/// One memory image of a generation, open for reading verified chunks.
pub struct MemoryFile {
    inner: Inner,
    /// The file on disk, for errors.
    shown: PathBuf,
}

enum Inner {
    Plain(File),
    Sealed(SealedFile),
}

impl std::fmt::Debug for MemoryFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner {
            Inner::Plain(_) => "plain",
            Inner::Sealed(_) => "sealed",
        };
        write!(f, "MemoryFile({kind} {})", self.shown.display())
    }
}

impl MemoryFile {
    /// Opens the file `entry` lists in `gen_dir`: in place, or (a memory image of a scratch dir
    /// with a [`SEALED_SOURCE_FILE`]) in the sealed generation it names. Absent is
    /// [`Error::MissingFile`]; a sealed file that does not open is [`Error::Unauthentic`].
    pub fn open(gen_dir: &Path, entry: &FileEntry) -> Result<Self> {
        if entry.has_chunk_digests()
            && let Some(source) = sealed_source(gen_dir)?
        {
            let keys = match super::sealed::keys() {
                Some(k) => k.clone(),
                None => {
                    let dir = source.keys.as_deref().ok_or_else(|| {
                        Error::Keys(format!(
                            "{} names no snapshot keys and this process has none",
                            gen_dir.join(SEALED_SOURCE_FILE).display()
                        ))
                    })?;
                    SnapshotKeys::load(dir)?
                }
            };
            return Self::sealed(&keys, &source.generation, entry);
        }
        if super::sealed::is_encrypted(gen_dir) {
            let keys = super::sealed::keys().ok_or_else(|| {
                Error::Keys(format!(
                    "generation {} is sealed and this process has no snapshot keys (--snapshot-keys)",
                    gen_dir.display()
                ))
            })?;
            return Self::sealed(keys, gen_dir, entry);
        }
        let shown = gen_dir.join(&entry.path);
        Ok(Self {
            inner: Inner::Plain(open_listed(&shown, entry)?),
            shown,
        })
    }

    fn sealed(keys: &SnapshotKeys, sealed_dir: &Path, entry: &FileEntry) -> Result<Self> {
        let file = super::sealed::open_file_with(keys, sealed_dir, &entry.path)?;
        if file.plain_len() != entry.size {
            return Err(Error::SizeMismatch {
                file: entry.path.clone(),
                expected: entry.size,
                actual: file.plain_len(),
            });
        }
        Ok(Self {
            inner: Inner::Sealed(file),
            shown: sealed_dir.join(&entry.path),
        })
    }

    /// True when the chunks are opened from a sealed file.
    pub fn is_sealed(&self) -> bool {
        matches!(self.inner, Inner::Sealed(_))
    }

    /// Reads chunk `index` of the file `entry` describes into `buf` and checks it against the
    /// manifest's BLAKE3 digest, as [`super::read_verified_chunk_at`] does; a sealed frame that
    /// does not open is [`Error::Unauthentic`] naming the file. Blocking.
    pub fn read_verified_chunk(
        &self,
        entry: &FileEntry,
        index: u64,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.read_trusted_chunk(entry, index, buf)?;
        match &self.inner {
            Inner::Plain(_) => Ok(()),
            Inner::Sealed(_) => verify_chunk_bytes(entry, index, buf),
        }
    }

    /// Chunk `index` into `buf`, checked as far as its form needs: a plain chunk against its
    /// digest, a sealed one by opening its frames, without hashing it again. Each frame opens
    /// only under the file's own key, bound to the generation's path and the frame's index, and
    /// the chunk's span comes from the authenticated manifest, so the bytes are the ones the
    /// seal hashed (what an upload reads: BLAKE3 was 12 % of a node's CPU in an encrypted
    /// durable suspend, docs/benchmarks.md). Blocking.
    pub fn read_trusted_chunk(
        &self,
        entry: &FileEntry,
        index: u64,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        match &self.inner {
            Inner::Plain(f) => read_chunk(f, &self.shown, entry, index, buf),
            Inner::Sealed(f) => {
                let (start, end, _) = chunk_span(entry, index)?;
                // One frame buffer per thread, kept: a page source or an upload reads chunk
                // after chunk.
                thread_local! {
                    static FRAME: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
                }
                FRAME
                    .with_borrow_mut(|frame| {
                        f.read_range(start, (end - start) as usize, buf, frame)
                    })
                    .map_err(|e: SealedError| {
                        super::sealed::reader_error(&entry.path, &self.shown, e)
                    })
            }
        }
    }

    /// Chunk `index` for [`Self::stream_to`], into `buf`: returns where its bytes are in `buf`,
    /// in order. A plain chunk is read and checked against its digest. A sealed chunk's frames
    /// are read through a mapping and opened out of place into `buf` (no `pread` copy, no
    /// joining copy), and not hashed again: each
    /// frame opened under the file's own key, bound to the file's path and the frame's index,
    /// and the file's size is the authenticated manifest's, so the bytes are the ones sealed,
    /// which the one-read seal hashed (BLAKE3 was 40 % of the streamer's CPU, the joining copy
    /// another 8 %: docs/benchmarks.md).
    fn read_streamed_chunk(
        &self,
        entry: &FileEntry,
        index: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<std::ops::Range<usize>>> {
        match &self.inner {
            Inner::Plain(_) => {
                self.read_verified_chunk(entry, index, buf)?;
                Ok(std::iter::once(0..buf.len()).collect())
            }
            Inner::Sealed(f) => {
                let (start, end, _) = chunk_span(entry, index)?;
                f.open_frames_mapped(start, (end - start) as usize, buf)
                    .map_err(|e: SealedError| {
                        super::sealed::reader_error(&entry.path, &self.shown, e)
                    })
            }
        }
    }

    /// Writes the whole file `entry` describes to `out`, in order, every chunk checked as
    /// [`Self::read_verified_chunk`] checks it: what an eager restore streams to CRIU instead
    /// of opening the image into a scratch file first. `threads` read (and open) chunks side by
    /// side, chunk `i` on thread `i % threads`, each a few chunks ahead of `out` at most, so
    /// memory stays bounded whatever the file's size. The first error stops every thread; an
    /// error writing to `out` is [`Error::Io`] naming `shown_out`. Blocking.
    pub fn stream_to(
        &self,
        entry: &FileEntry,
        out: &mut impl super::ChunkSink,
        shown_out: &Path,
        threads: usize,
    ) -> Result<()> {
        use std::sync::mpsc::sync_channel;
        let threads = threads.max(1);
        let count = entry.chunk_count();
        std::thread::scope(|scope| {
            let mut filled = Vec::with_capacity(threads);
            let mut emptied = Vec::with_capacity(threads);
            for t in 0..threads {
                // Three buffers per thread (one being filled, one waiting to be written, one a
                // pipe sink may still hold), handed back and forth: no allocation per chunk.
                let (full_tx, full_rx) = sync_channel::<Result<(Vec<u8>, Pieces)>>(2);
                let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(3);
                for _ in 0..3 {
                    let _ = empty_tx.send(Vec::new());
                }
                scope.spawn(move || {
                    let mut index = t as u64;
                    while index < count {
                        // The writer hung up (it failed or finished): stop.
                        let Ok(mut buf) = empty_rx.recv() else { return };
                        let read = self
                            .read_streamed_chunk(entry, index, &mut buf)
                            .map(|pieces| (buf, pieces));
                        let failed = read.is_err();
                        if full_tx.send(read).is_err() || failed {
                            return;
                        }
                        index += threads as u64;
                    }
                });
                filled.push(full_rx);
                emptied.push(empty_tx);
            }
            // The thread each buffer the sink still holds came from, oldest first: a sink gives
            // buffers back in the order it took them.
            let mut in_sink = std::collections::VecDeque::with_capacity(4);
            for index in 0..count {
                let t = (index % threads as u64) as usize;
                let (buf, pieces) = filled[t].recv().map_err(|_| {
                    Error::InvalidInput(format!("{}: a reader thread ended early", entry.path))
                })??;
                in_sink.push_back(t);
                let freed = out
                    .write_chunk(buf, &pieces)
                    .map_err(|e| Error::io("write", shown_out, e))?;
                for buf in freed {
                    if let Some(t) = in_sink.pop_front() {
                        let _ = emptied[t].send(buf);
                    }
                }
            }
            Ok(())
        })
    }
}

/// Where a chunk's bytes are in its buffer, in order.
type Pieces = Vec<std::ops::Range<usize>>;
