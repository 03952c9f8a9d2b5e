//! Placing chunks: the background push (local or from the durable store) and each verified copy.

use std::os::fd::AsRawFd;

use ate_snapshot::CHUNK_BYTES;

use super::{Source, SourceError, io_err};
use crate::ranges::Pending;
use crate::remote;
use crate::uffd::{self, Placed};

impl Source {
    /// Pushes the chunk holding the first page any task still lacks.
    pub(super) fn push_next_chunk(&mut self) -> Result<(), SourceError> {
        if let Some(delay) = self.push_delay {
            // Test-only (ATE_FAULT_PAGE_SOURCE_PUSH_DELAY_MS): keeps a restore lazy long enough
            // for a fault test to act in the middle of it. Faults are still served at once.
            std::thread::sleep(delay);
        }
        if self.remote.is_some() {
            return self.push_fetched_chunk();
        }
        // The working set first.
        while let Some((pages_id, chunk)) = self.hot.pop_front() {
            if self.chunk_pending(pages_id, chunk) {
                self.stats.prefetched += 1;
                return self.place_chunk(pages_id, chunk, false);
            }
        }
        let next = self.tasks.iter().filter(|t| !t.exited).find_map(|t| {
            t.pending
                .first()
                .map(|r| (t.pages_id, r.img_offset / CHUNK_BYTES))
        });
        if let Some((pages_id, chunk)) = next {
            self.place_chunk(pages_id, chunk, false)?;
        }
        Ok(())
    }

    /// The push from the durable store: keeps the next chunks any task lacks on their way and
    /// places one that has arrived; stalls (waits in poll) when none has.
    fn push_fetched_chunk(&mut self) -> Result<(), SourceError> {
        // The working set first (its chunks fetched in parallel), then by address.
        while let Some(&(pages_id, chunk)) = self.hot.front() {
            if self.chunk_pending(pages_id, chunk) {
                break;
            }
            self.hot.pop_front();
        }
        let Some(remote) = self.remote.as_mut() else {
            return Ok(());
        };
        remote.collect()?;
        let mut upcoming: Vec<remote::ChunkKey> = Vec::with_capacity(remote::PREFETCH);
        upcoming.extend(self.hot.iter().take(remote::PREFETCH).copied());
        'tasks: for t in self.tasks.iter().filter(|t| !t.exited) {
            if upcoming.len() >= remote::PREFETCH {
                break;
            }
            for r in t.pending.iter() {
                let last = r.img_end().saturating_sub(1) / CHUNK_BYTES;
                for chunk in r.img_offset / CHUNK_BYTES..=last {
                    let key = (t.pages_id, chunk);
                    if !upcoming.contains(&key) {
                        upcoming.push(key);
                        if upcoming.len() >= remote::PREFETCH {
                            break 'tasks;
                        }
                    }
                }
            }
        }
        for key in &upcoming {
            if remote.in_flight() >= remote::PREFETCH {
                break;
            }
            if let Some(f) = self.files.get(&key.0) {
                remote.request(*key, &f.entry);
            }
        }
        match upcoming.iter().find(|k| remote.is_ready(**k)).copied() {
            Some((pages_id, chunk)) => {
                self.push_stalled = false;
                if self.hot_seen.contains(&(pages_id, chunk)) {
                    self.stats.prefetched += 1;
                }
                self.place_chunk(pages_id, chunk, false)
            }
            None => {
                self.push_stalled = !upcoming.is_empty();
                Ok(())
            }
        }
    }

    /// True when a task served from pages image `pages_id` still lacks a page of chunk `chunk`.
    fn chunk_pending(&self, pages_id: u32, chunk: u64) -> bool {
        self.tasks.iter().any(|t| {
            !t.exited
                && t.pages_id == pages_id
                && !t
                    .pending
                    .in_image_span(chunk * CHUNK_BYTES, (chunk + 1) * CHUNK_BYTES)
                    .is_empty()
        })
    }

    /// Reads and checks one chunk of a pages image (a plain one against its digest, a sealed one
    /// by opening its frames: `MemoryFile::read_trusted_chunk`) and copies every page of it that
    /// any task served from that image still lacks.
    pub(super) fn place_chunk(
        &mut self,
        pages_id: u32,
        chunk: u64,
        on_fault: bool,
    ) -> Result<(), SourceError> {
        let file = self
            .files
            .get(&pages_id)
            .ok_or_else(|| SourceError::Protocol(format!("pages image {pages_id} not open")))?;
        match (self.remote.as_mut(), &file.file) {
            (Some(remote), _) => {
                let key = (pages_id, chunk);
                self.buf = match remote.take(key) {
                    Some(data) => data,
                    None => remote.wait_for(key, &file.entry)?,
                };
            }
            (None, Some(local)) => local.read_trusted_chunk(&file.entry, chunk, &mut self.buf)?,
            (None, None) => {
                return Err(SourceError::Protocol(format!(
                    "pages image {pages_id} is not open"
                )));
            }
        }
        self.stats.chunks_read += 1;
        let span_start = chunk * CHUNK_BYTES;
        let span_end = span_start + self.buf.len() as u64;
        for i in 0..self.tasks.len() {
            let task = &mut self.tasks[i];
            if task.exited || task.pages_id != pages_id {
                continue;
            }
            for piece in task.pending.in_image_span(span_start, span_end) {
                let from = (piece.img_offset - span_start) as usize;
                let len = (piece.end - piece.start) as usize;
                let Some(data) = self.buf.get(from..from + len) else {
                    return Err(SourceError::Protocol(format!(
                        "pages of task {} at {:#x} lie past the end of pages image {pages_id}",
                        task.pid, piece.start
                    )));
                };
                let write_protect = self.tracking.is_some() && task.origin.holds_in_place(&piece);
                let placed = uffd::copy(task.uffd.as_raw_fd(), piece.start, data, write_protect)
                    .map_err(io_err(format!("copy pages into task {}", task.pid)))?;
                match placed {
                    Placed::Done | Placed::Gone => {
                        task.pending.remove(piece.start, piece.end);
                        let pages = piece.pages();
                        if on_fault {
                            self.stats.pages_on_fault += pages;
                        } else {
                            self.stats.pages_pushed += pages;
                        }
                    }
                    // Events are queued for this task: read them before placing more.
                    Placed::Retry => break,
                    Placed::Exited => {
                        task.exited = true;
                        task.pending = Pending::default();
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
