//! Where [`super::MemoryFile::stream_to`] puts a memory image's chunks: any writer (the bytes
//! copied), or a pipe the chunk's pages are handed to by reference ([`PipeSink`], `vmsplice`),
//! which is how an eager restore feeds CRIU's image streamer.
//!
//! Why a pipe sink: the streamer's `write` into CRIU's pipe copied every opened byte once more
//! before CRIU's `read` copied it into the restored memory; on 2 cores that copy (and the page
//! the pipe allocates for every 4 KiB) was the part of a 1 GiB sealed eager restore that did not
//! overlap CRIU's own work (docs/benchmarks.md).
//!
//! Architecture invariant: a buffer handed to the pipe by reference is neither written nor freed
//! until the pipe no longer holds any of its bytes (`FIONREAD`), or nothing can read them any
//! more (the pipe has no reader). A buffer whose fate is unknown when the sink ends is leaked,
//! never reused: CRIU must read exactly the bytes that were opened and checked.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// Takes a memory image's chunks, in order: a chunk buffer and where its bytes are in it.
pub trait ChunkSink {
    /// Writes `pieces` of `buf`, in order, whole, and gives back the buffers that may be filled
    /// again: `buf` itself at once when the bytes were copied, earlier ones later when the sink
    /// hands pages over by reference.
    fn write_chunk(&mut self, buf: Vec<u8>, pieces: &[Range<usize>]) -> io::Result<Vec<Vec<u8>>>;
}

/// Any writer: the pieces are copied, the buffer is free again at once.
impl<W: Write + ?Sized> ChunkSink for W {
    fn write_chunk(&mut self, buf: Vec<u8>, pieces: &[Range<usize>]) -> io::Result<Vec<Vec<u8>>> {
        let mut slices = slices_of(&buf, pieces)?;
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            match self.write_vectored(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(vec![buf])
    }
}

fn slices_of<'a>(buf: &'a [u8], pieces: &[Range<usize>]) -> io::Result<Vec<IoSlice<'a>>> {
    let mut slices = Vec::with_capacity(pieces.len());
    for r in pieces {
        let piece = buf.get(r.clone()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "a chunk piece past its buffer")
        })?;
        if !piece.is_empty() {
            slices.push(IoSlice::new(piece));
        }
    }
    Ok(slices)
}

/// Buffers the pipe may hold pages of before the sink waits for its reader: with a 1 MiB pipe
/// and 2 MiB chunks the previous chunk is always read by the time the next one is in, so this
/// is only reached with a pipe larger than a chunk.
const MAX_HELD: usize = 2;

/// How long a sink that ends waits for its reader to take what is still in the pipe before it
/// leaks those buffers rather than free them.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// A pipe's write end that takes chunks' pages by reference (`vmsplice`) and keeps each buffer
/// until the reader has read all of it out of the pipe.
#[derive(Debug)]
pub struct PipeSink {
    pipe: File,
    /// Buffers the pipe may still hold pages of, oldest first, each with the count of bytes
    /// written when its last byte went in.
    held: VecDeque<(Vec<u8>, u64)>,
    written: u64,
}

impl PipeSink {
    /// A sink writing into `pipe`, which must be a pipe's write end (anything else fails the
    /// first write with `EINVAL` or `EBADF`).
    pub fn new(pipe: File) -> Self {
        Self {
            pipe,
            held: VecDeque::new(),
            written: 0,
        }
    }

    /// Waits until nothing written is left in the pipe (or nothing can read it), then closes
    /// it. An error (or a reader that stops reading for [`SETTLE_WAIT`]) leaks the buffers the
    /// pipe may still hold.
    pub fn finish(mut self) -> io::Result<()> {
        self.settle()
    }

    /// Bytes written and not yet read.
    fn pending(&self) -> io::Result<u64> {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD on a pipe writes one c_int through the pointer, which points at `n`.
        let r = unsafe { libc::ioctl(self.pipe.as_raw_fd(), libc::FIONREAD, &mut n) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// True when no process holds the pipe's read end: nothing written can be read any more.
    fn reader_gone(&self) -> bool {
        let mut fd = libc::pollfd {
            fd: self.pipe.as_fd().as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; a zero timeout does not block.
        let r = unsafe { libc::poll(&mut fd, 1, 0) };
        r > 0 && fd.revents & libc::POLLERR != 0
    }

    /// Moves the buffers the reader has read whole into `freed`.
    fn release_read(&mut self, freed: &mut Vec<Vec<u8>>) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let read_up_to = if self.reader_gone() {
            self.written
        } else {
            // What is still in the pipe is the last `pending` bytes written.
            self.written.saturating_sub(self.pending()?)
        };
        while self.held.front().is_some_and(|(_, end)| *end <= read_up_to) {
            if let Some((buf, _)) = self.held.pop_front() {
                freed.push(buf);
            }
        }
        Ok(())
    }

    fn settle(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE_WAIT;
        let mut freed = Vec::new();
        loop {
            if let Err(e) = self.release_read(&mut freed) {
                self.leak_held();
                return Err(e);
            }
            if self.held.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.leak_held();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the pipe's reader stopped reading",
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn leak_held(&mut self) {
        for (buf, _) in self.held.drain(..) {
            // The pipe may still hand these pages to its reader: never reuse them.
            std::mem::forget(buf);
        }
    }

    /// Hands `pieces` of `buf` to the pipe, whole; the bytes handed.
    fn splice(&self, buf: &[u8], pieces: &[Range<usize>]) -> io::Result<u64> {
        let mut slices = slices_of(buf, pieces)?;
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            // SAFETY: the pages of `buf` the pipe takes are not written or freed until the
            // reader has read them out of the pipe: the caller moves `buf` into `held` (or
            // leaks it when this fails) and it leaves `held` only through `release_read` (all
            // of it read, or no reader left) or `leak_held`.
            let spliced = unsafe {
                nix::fcntl::vmsplice(self.pipe.as_fd(), slices, nix::fcntl::SpliceFFlags::empty())
            };
            match spliced {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        Ok(total as u64)
    }
}

impl ChunkSink for PipeSink {
    fn write_chunk(&mut self, buf: Vec<u8>, pieces: &[Range<usize>]) -> io::Result<Vec<Vec<u8>>> {
        let total = match self.splice(&buf, pieces) {
            Ok(total) => total,
            Err(e) => {
                // Some pages of `buf` may be in the pipe already: free it only when nothing
                // can read them.
                if !self.reader_gone() {
                    std::mem::forget(buf);
                }
                return Err(e);
            }
        };
        self.written += total;
        self.held.push_back((buf, self.written));
        let mut freed = Vec::new();
        self.release_read(&mut freed)?;
        while self.held.len() > MAX_HELD && !self.reader_gone() {
            std::thread::sleep(Duration::from_micros(100));
            self.release_read(&mut freed)?;
        }
        Ok(freed)
    }
}

impl Drop for PipeSink {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            let _ = self.settle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn chunk(fill: u8, len: usize) -> (Vec<u8>, Vec<Range<usize>>) {
        // Two pieces with a gap between them, as an opened chunk's two frames are.
        let mut buf = vec![0xEE; len + 20];
        buf[4..4 + len / 2].fill(fill);
        buf[4 + len / 2 + 16..4 + len + 16].fill(fill);
        (buf, vec![4..4 + len / 2, 4 + len / 2 + 16..4 + len + 16])
    }

    #[test]
    fn a_buffer_comes_back_only_once_its_bytes_are_read() {
        let (mut read, write) = std::io::pipe().expect("pipe");
        let mut sink = PipeSink::new(File::from(std::os::fd::OwnedFd::from(write)));
        // Two 16 KiB chunks fit the default 64 KiB pipe: neither is read yet.
        let (a, pa) = chunk(1, 16 << 10);
        let (b, pb) = chunk(2, 16 << 10);
        assert!(sink.write_chunk(a, &pa).expect("a").is_empty());
        assert!(sink.write_chunk(b, &pb).expect("b").is_empty());
        let mut got = vec![0u8; 16 << 10];
        read.read_exact(&mut got).expect("read a");
        assert!(got.iter().all(|&x| x == 1));
        // All of the first read: it comes back with the next write, the second does not.
        let (c, pc) = chunk(3, 4 << 10);
        let freed = sink.write_chunk(c, &pc).expect("c");
        assert_eq!(freed.len(), 1);
        assert_eq!(freed[0][4], 1, "the first buffer, unchanged");
        let reader = std::thread::spawn(move || {
            let mut rest = Vec::new();
            read.read_to_end(&mut rest).expect("read the rest");
            rest
        });
        sink.finish().expect("finish");
        let rest = reader.join().expect("reader");
        assert_eq!(rest.len(), 20 << 10);
        assert!(rest[..16 << 10].iter().all(|&x| x == 2));
        assert!(rest[16 << 10..].iter().all(|&x| x == 3));
    }

    #[test]
    fn a_pipe_without_a_reader_is_a_broken_pipe_and_nothing_waits() {
        let (read, write) = std::io::pipe().expect("pipe");
        drop(read);
        let mut sink = PipeSink::new(File::from(std::os::fd::OwnedFd::from(write)));
        let (a, pa) = chunk(1, 8 << 10);
        let e = sink.write_chunk(a, &pa).expect_err("no reader");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        sink.finish().expect("nothing held");
    }

    #[test]
    fn a_reader_that_closes_early_frees_what_it_left() {
        let (read, write) = std::io::pipe().expect("pipe");
        let mut sink = PipeSink::new(File::from(std::os::fd::OwnedFd::from(write)));
        let (a, pa) = chunk(1, 8 << 10);
        assert!(sink.write_chunk(a, &pa).expect("a").is_empty());
        drop(read);
        let started = Instant::now();
        sink.finish().expect("the reader is gone");
        assert!(started.elapsed() < SETTLE_WAIT);
    }
}
