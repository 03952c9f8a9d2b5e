//! Chunks of memory images fetched from the durable store, for a page source serving a
//! generation that was downloaded for a lazy restore (only its small files and the chunks CRIU
//! reads itself are local; `ate_snapshot::DurableSource` says where the rest is).
//!
//! Fetches run on a small tokio runtime of their own, in parallel: the chunk a fault waits for
//! at once, the chunks the background push will want next ahead of time. Each result wakes the
//! page source's poll through a pipe. Every chunk is decompressed and checked against its
//! BLAKE3 digest before it is handed over (`DurableStore::fetch_chunk`).

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use ate_snapshot::{DurableSource, DurableStore, FileEntry};

use crate::source::SourceError;

/// Chunks fetched ahead for the background push.
pub const PREFETCH: usize = 16;
/// Longest a fault waits for its chunk.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// `(pages image id, chunk index)`.
pub type ChunkKey = (u32, u64);

type Fetched = (ChunkKey, Result<Vec<u8>, ate_snapshot::Error>);

/// Writes a verified chunk into the generation's sparse image (never creating or growing it).
fn write_back(image: &std::path::Path, offset: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .and_then(|f| {
            let len = f.metadata()?.len();
            if offset + data.len() as u64 > len {
                return Err(io::Error::other("past the image's end"));
            }
            f.write_all_at(data, offset)
        });
    if let Err(e) = written {
        tracing::debug!(image = %image.display(), offset, error = %e, "chunk not written back");
    }
}

pub struct Remote {
    runtime: tokio::runtime::Runtime,
    store: DurableStore,
    tx: Sender<Fetched>,
    rx: Receiver<Fetched>,
    wake_read: OwnedFd,
    wake_write: Arc<OwnedFd>,
    in_flight: HashSet<ChunkKey>,
    ready: HashMap<ChunkKey, Vec<u8>>,
    /// The generation directory: each fetched chunk is also written into its (sparse) image
    /// there, so the node's download becomes a whole copy over time, which the actor's next
    /// upload sends deltas against (`DurableStore::upload_with_parents`).
    generation: std::path::PathBuf,
    /// Whether fetched chunks are written back: not into a download kept on a tmpfs (a node
    /// with snapshot keys keeps them there), where the whole memory would end up in RAM.
    write_back: bool,
    /// Chunks fetched so far (for the page source's summary).
    pub fetched: u64,
}

impl Remote {
    pub fn new(source: &DurableSource, generation: &std::path::Path) -> Result<Self, SourceError> {
        let store = source.open_store()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ate-page-fetch")
            .enable_all()
            .build()
            .map_err(|e| SourceError::Io {
                what: "start the chunk fetcher".into(),
                source: e,
            })?;
        let (wake_read, wake_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(|e| SourceError::Io {
                    what: "create the fetcher's wake-up pipe".into(),
                    source: io::Error::from(e),
                })?;
        let (tx, rx) = channel();
        Ok(Remote {
            runtime,
            store,
            tx,
            rx,
            wake_read,
            wake_write: Arc::new(wake_write),
            in_flight: HashSet::new(),
            ready: HashMap::new(),
            generation: generation.to_path_buf(),
            write_back: !ate_snapshot::sealed::is_memory_fs(generation),
            fetched: 0,
        })
    }

    /// Readable when a fetch has finished.
    pub fn wake_fd(&self) -> RawFd {
        self.wake_read.as_raw_fd()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn is_ready(&self, key: ChunkKey) -> bool {
        self.ready.contains_key(&key)
    }

    pub fn is_wanted(&self, key: ChunkKey) -> bool {
        self.ready.contains_key(&key) || self.in_flight.contains(&key)
    }

    /// Starts fetching chunk `key` of `entry` unless it is fetched or on its way.
    pub fn request(&mut self, key: ChunkKey, entry: &FileEntry) {
        if self.is_wanted(key) {
            return;
        }
        self.in_flight.insert(key);
        let store = self.store.clone();
        let entry = entry.clone();
        let tx = self.tx.clone();
        let wake = self.wake_write.clone();
        let image = self.generation.join(&entry.path);
        let keep = self.write_back;
        self.runtime.spawn(async move {
            let got = store.fetch_chunk(&entry, key.1).await;
            let copy = got.as_ref().ok().cloned();
            let _ = tx.send((key, got));
            // A full pipe already wakes the reader.
            let _ = nix::unistd::write(&*wake, &[1u8]);
            if let Some(data) = copy.filter(|_| keep) {
                let offset = key.1 * ate_snapshot::CHUNK_BYTES;
                // Best effort: a chunk not written back only means a whole chunk in an upload.
                let _ =
                    tokio::task::spawn_blocking(move || write_back(&image, offset, &data)).await;
            }
        });
    }

    /// Takes in every finished fetch; a failed one is the page source's failure (the chunk is
    /// damaged or missing in the store: the actor cannot get its memory).
    pub fn collect(&mut self) -> Result<(), SourceError> {
        let mut sink = [0u8; 64];
        while matches!(nix::unistd::read(&self.wake_read, &mut sink), Ok(n) if n > 0) {}
        while let Ok((key, got)) = self.rx.try_recv() {
            self.accept(key, got)?;
        }
        Ok(())
    }

    fn accept(
        &mut self,
        key: ChunkKey,
        got: Result<Vec<u8>, ate_snapshot::Error>,
    ) -> Result<(), SourceError> {
        self.in_flight.remove(&key);
        let data = got?;
        self.fetched += 1;
        self.ready.insert(key, data);
        Ok(())
    }

    /// The chunk if it has arrived.
    pub fn take(&mut self, key: ChunkKey) -> Option<Vec<u8>> {
        self.ready.remove(&key)
    }

    /// The chunk, fetched now if need be (a fault waits for it).
    pub fn wait_for(&mut self, key: ChunkKey, entry: &FileEntry) -> Result<Vec<u8>, SourceError> {
        self.request(key, entry);
        loop {
            if let Some(data) = self.ready.remove(&key) {
                return Ok(data);
            }
            match self.rx.recv_timeout(FETCH_TIMEOUT) {
                Ok((k, got)) => self.accept(k, got)?,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(SourceError::Protocol(format!(
                        "chunk {} of {} did not arrive from the durable store within {FETCH_TIMEOUT:?}",
                        key.1, entry.path
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(SourceError::Protocol("the chunk fetcher stopped".into()));
                }
            }
        }
    }
}
