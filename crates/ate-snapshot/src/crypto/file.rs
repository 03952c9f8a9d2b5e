//! Sealed files on the node's disk: the object format of [`super`] (header, then frames of at
//! most [`FRAME_BYTES`]), written and read frame by frame at fixed offsets, so a file is sealed
//! or opened by several threads at once and any frame can be read alone.
//!
//! Every frame but the last holds exactly [`FRAME_BYTES`]: frame `i` starts at
//! `header + i * (4 + FRAME_BYTES + 16)` and holds plaintext bytes `i * FRAME_BYTES ..`.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use aws_lc_rs::aead::{Aad, LessSafeKey};

use super::{FRAME_BYTES, MAGIC, OpenError, SALT_BYTES, SnapshotKeys, TAG_BYTES};
use super::{aad, nonce, object_key, random_salt};
use crate::manifest::CHUNK_BYTES;

/// Bytes of a frame on disk besides its plaintext: the length prefix and the tag.
const FRAME_OVERHEAD: u64 = 4 + TAG_BYTES as u64;
const FULL_FRAME: u64 = FRAME_BYTES as u64 + FRAME_OVERHEAD;

/// Frames of a sealed file with `plain` bytes (at least one, also for an empty file).
fn frames_for(plain: u64) -> u64 {
    plain.div_ceil(FRAME_BYTES as u64).max(1)
}

fn header_len(keys: &SnapshotKeys) -> u64 {
    (MAGIC.len() + 1 + keys.data_key_id.len() + SALT_BYTES) as u64
}

/// The size on disk of a file of `plain` bytes sealed under `keys`.
pub(crate) fn sealed_len(keys: &SnapshotKeys, plain: u64) -> u64 {
    header_len(keys) + frames_for(plain) * FRAME_OVERHEAD + plain
}

/// True when the file at `path` starts like a sealed object.
pub(crate) fn looks_sealed(path: &Path) -> bool {
    let mut head = [0u8; MAGIC.len()];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == MAGIC)
}

/// Seals the `plain` file into `sealed` (created or truncated; not synced), bound to `path`
/// (the associated data of every frame). `threads` frames are sealed at once.
pub(crate) fn seal_file(
    keys: &SnapshotKeys,
    path: &str,
    plain: &Path,
    sealed: &Path,
    threads: usize,
) -> io::Result<u64> {
    seal_file_hashing(keys, path, plain, sealed, threads, false)
        .map(|(len, _)| sealed_len(keys, len))
}

/// Frames per [`CHUNK_BYTES`] chunk of a memory image: the unit a thread seals (and hashes).
const FRAMES_PER_CHUNK: u64 = CHUNK_BYTES / FRAME_BYTES as u64;
const _: () = assert!(CHUNK_BYTES.is_multiple_of(FRAME_BYTES as u64) && FRAMES_PER_CHUNK > 0);

/// [`seal_file`] that also returns, when `chunk_digests`, the BLAKE3 (lowercase hex) of each
/// [`CHUNK_BYTES`] chunk of the plaintext, computed from the same read (a suspend reads a
/// memory image once to hash and seal it; none for an empty file). Returns the plaintext size
/// it sealed.
pub(crate) fn seal_file_hashing(
    keys: &SnapshotKeys,
    path: &str,
    plain: &Path,
    sealed: &Path,
    threads: usize,
    chunk_digests: bool,
) -> io::Result<(u64, Vec<String>)> {
    let src = File::open(plain)?;
    let len = src.metadata()?.len();
    let salt = random_salt().map_err(io::Error::other)?;
    let key = object_key(keys, &salt).map_err(io::Error::other)?;
    let id = keys.data_key_id.as_bytes();
    let mut header = Vec::with_capacity(header_len(keys) as usize);
    header.extend_from_slice(MAGIC);
    header.push(id.len() as u8);
    header.extend_from_slice(id);
    header.extend_from_slice(&salt);
    let dst = File::create(sealed)?;
    dst.write_all_at(&header, 0)?;
    let frames = frames_for(len);
    let base = header.len() as u64;
    let digests = std::sync::Mutex::new(Vec::new());
    for_each_frame(frames.div_ceil(FRAMES_PER_CHUNK), threads, |chunk, buf| {
        let first = chunk * FRAMES_PER_CHUNK;
        let mut hasher = (chunk_digests && len > 0).then(blake3::Hasher::new);
        // The chunk's frames as they go on disk (length prefix, plaintext sealed in place,
        // tag), side by side: one read per frame, one AES pass, one write (the buffer grows
        // once per thread and is never cleared).
        let mut used = 0;
        for index in first..(first + FRAMES_PER_CHUNK).min(frames) {
            let at = index * FRAME_BYTES as u64;
            let n = (len - at.min(len)).min(FRAME_BYTES as u64) as usize;
            let total = 4 + n + TAG_BYTES;
            if buf.len() < used + total {
                buf.resize(used + total, 0);
            }
            let frame = &mut buf[used..used + total];
            src.read_exact_at(&mut frame[4..4 + n], at)?;
            if let Some(h) = hasher.as_mut() {
                h.update(&frame[4..4 + n]);
            }
            let tag = key
                .seal_in_place_separate_tag(
                    nonce(index),
                    Aad::from(aad(path, index)),
                    &mut frame[4..4 + n],
                )
                .map_err(|_| io::Error::other("seal failed"))?;
            frame[4 + n..].copy_from_slice(tag.as_ref());
            frame[..4].copy_from_slice(&((n + TAG_BYTES) as u32).to_le_bytes());
            used += total;
        }
        let at = base + first * FULL_FRAME;
        dst.write_all_at(&buf[..used], at)?;
        start_writeback(&dst, at, used as u64);
        if let Some(h) = hasher {
            digests
                .lock()
                .map_err(|_| io::Error::other("chunk digests poisoned"))?
                .push((chunk, h.finalize().to_hex().to_string()));
        }
        Ok(())
    })?;
    // A file that shrank under us (it must not) would leave a tail: cut it to what was sealed.
    dst.set_len(base + frames * FRAME_OVERHEAD + len)?;
    let mut digests = digests
        .into_inner()
        .map_err(|_| io::Error::other("chunk digests poisoned"))?;
    digests.sort_unstable_by_key(|(i, _)| *i);
    Ok((len, digests.into_iter().map(|(_, d)| d).collect()))
}

/// Starts writing `len` bytes of `file` from `offset` to its disk now, without waiting: the
/// disk works while the next chunks are sealed, and the sync that makes a generation durable
/// finds little left to write. A hint only: where it fails, that sync writes the bytes.
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range only reads its integer arguments; the descriptor is borrowed
    // from a `File` that outlives the call.
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

/// Runs `f(index, scratch buffer)` for every frame index, on up to `threads` threads.
fn for_each_frame(
    frames: u64,
    threads: usize,
    f: impl Fn(u64, &mut Vec<u8>) -> io::Result<()> + Sync,
) -> io::Result<()> {
    let threads = (threads.max(1) as u64).min(frames) as usize;
    if threads <= 1 {
        let mut buf = Vec::with_capacity(FULL_FRAME as usize);
        return (0..frames).try_for_each(|i| f(i, &mut buf));
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                scope.spawn(move || {
                    let mut buf = Vec::with_capacity(FULL_FRAME as usize);
                    (t as u64..frames)
                        .step_by(threads)
                        .try_for_each(|i| f(i, &mut buf))
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(io::Error::other("frame thread panicked")))
        })
    })
}

/// A sealed file open for reading, frame by frame.
pub(crate) struct SealedFile {
    file: File,
    key: LessSafeKey,
    path: String,
    base: u64,
    frames: u64,
    /// Plaintext bytes, from the file's size (every frame but the last is full).
    plain_len: u64,
}

impl SealedFile {
    /// Opens `file` (sealed, bound to `path`) and reads its header.
    pub(crate) fn open(keys: &SnapshotKeys, path: &str, file: File) -> Result<Self, SealedError> {
        let disk_len = file.metadata().map_err(SealedError::Io)?.len();
        let mut head = vec![0u8; MAGIC.len() + 1];
        if disk_len < head.len() as u64 {
            return Err(SealedError::Open(if disk_len == 0 {
                OpenError::Plaintext
            } else {
                OpenError::Truncated("header")
            }));
        }
        file.read_exact_at(&mut head, 0).map_err(SealedError::Io)?;
        if head[..MAGIC.len()] != MAGIC[..] {
            return Err(SealedError::Open(OpenError::Plaintext));
        }
        let id_len = usize::from(head[MAGIC.len()]);
        let base = (MAGIC.len() + 1 + id_len + SALT_BYTES) as u64;
        if disk_len < base + FRAME_OVERHEAD {
            return Err(SealedError::Open(OpenError::Truncated("header")));
        }
        let mut rest = vec![0u8; id_len + SALT_BYTES];
        file.read_exact_at(&mut rest, head.len() as u64)
            .map_err(SealedError::Io)?;
        let (id, salt) = rest.split_at(id_len);
        let key = super::header_key(keys, id, salt).map_err(SealedError::Open)?;
        let body = disk_len - base;
        let frames = body.div_ceil(FULL_FRAME).max(1);
        let plain_len = body
            .checked_sub(frames * FRAME_OVERHEAD)
            .ok_or(SealedError::Open(OpenError::Truncated("frame")))?;
        Ok(Self {
            file,
            key,
            path: path.to_string(),
            base,
            frames,
            plain_len,
        })
    }

    /// The plaintext size.
    pub(crate) fn plain_len(&self) -> u64 {
        self.plain_len
    }

    /// Opens frame `index` in `buf` (grown to fit, never shrunk) and returns where in it the
    /// plaintext is: the frame is read once and opened in place.
    fn open_frame(
        &self,
        index: u64,
        buf: &mut Vec<u8>,
    ) -> Result<std::ops::Range<usize>, SealedError> {
        let at = self.base + index * FULL_FRAME;
        let end = (at + FULL_FRAME).min(self.base + self.plain_len + self.frames * FRAME_OVERHEAD);
        if index >= self.frames || end <= at + 4 {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        let len = (end - at) as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let stored = &mut buf[..len];
        self.file
            .read_exact_at(stored, at)
            .map_err(SealedError::Io)?;
        let n = self.open_stored(index, stored)?;
        Ok(4..4 + n)
    }

    /// Opens frame `index` as stored (length prefix, ciphertext, tag) in place; returns the
    /// plaintext's length (it starts after the 4-byte prefix).
    fn open_stored(&self, index: u64, stored: &mut [u8]) -> Result<usize, SealedError> {
        let frame = || SealedError::Open(OpenError::Frame(index));
        let prefix = stored
            .first_chunk::<4>()
            .map(|p| u32::from_le_bytes(*p) as usize)
            .ok_or_else(frame)?;
        if prefix != stored.len() - 4 {
            return Err(frame());
        }
        self.key
            .open_in_place(
                nonce(index),
                Aad::from(aad(&self.path, index)),
                &mut stored[4..],
            )
            .map(|plain| plain.len())
            .map_err(|_| frame())
    }

    /// Opens frame `index` into `buf` (its plaintext, nothing else).
    #[cfg(test)]
    pub(crate) fn read_frame(&self, index: u64, buf: &mut Vec<u8>) -> Result<(), SealedError> {
        let mut frame = Vec::new();
        let range = self.open_frame(index, &mut frame)?;
        buf.clear();
        buf.extend_from_slice(&frame[range]);
        Ok(())
    }

    /// The frames holding plaintext bytes `start .. start + len`, where `start` is a frame
    /// boundary and `start + len` one or the end: `(first, last, stored offset, stored length)`,
    /// `None` for an empty range.
    fn frames_span(
        &self,
        start: u64,
        len: usize,
    ) -> Result<Option<(u64, u64, u64, usize)>, SealedError> {
        let frame_bytes = FRAME_BYTES as u64;
        let end = start + len as u64;
        if end > self.plain_len || !start.is_multiple_of(frame_bytes) {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        if len == 0 {
            return Ok(None);
        }
        let (first, last) = (start / frame_bytes, (end - 1) / frame_bytes);
        if !end.is_multiple_of(frame_bytes) && end != self.plain_len {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        let at = self.base + first * FULL_FRAME;
        let stored_end = (self.base + (last + 1) * FULL_FRAME)
            .min(self.base + self.plain_len + self.frames * FRAME_OVERHEAD);
        Ok(Some((first, last, at, (stored_end - at) as usize)))
    }

    /// Opens the frames holding plaintext bytes `start .. start + len` (see
    /// [`Self::frames_span`]) with one read into `buf` (grown to fit, never shrunk) and in
    /// place: returns where in `buf` the plaintext pieces are, in order (one per frame; the
    /// frames' length prefixes and tags lie between them).
    pub(crate) fn open_frames_in_place(
        &self,
        start: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<std::ops::Range<usize>>, SealedError> {
        let Some((first, last, at, stored_len)) = self.frames_span(start, len)? else {
            return Ok(Vec::new());
        };
        if buf.len() < stored_len {
            buf.resize(stored_len, 0);
        }
        self.file
            .read_exact_at(&mut buf[..stored_len], at)
            .map_err(SealedError::Io)?;
        let mut pieces = Vec::with_capacity((last - first + 1) as usize);
        let mut offset = 0usize;
        for index in first..=last {
            let frame_len = (FULL_FRAME as usize).min(stored_len - offset);
            if frame_len <= 4 {
                return Err(SealedError::Open(OpenError::Truncated("frame")));
            }
            let n = self.open_stored(index, &mut buf[offset..offset + frame_len])?;
            pieces.push(offset + 4..offset + 4 + n);
            offset += frame_len;
        }
        if pieces.iter().map(|r| r.len()).sum::<usize>() != len {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        Ok(pieces)
    }

    /// As [`Self::open_frames_in_place`], but the frames are read through a mapping of the file
    /// and opened out of place into `buf` (grown to fit, never shrunk): the ciphertext is read
    /// once, by AES-GCM, and the plaintext lands in one piece at the start of `buf`. What an
    /// eager restore streams to CRIU. Where the file cannot be mapped, the frames are read and
    /// opened in place instead.
    pub(crate) fn open_frames_mapped(
        &self,
        start: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<std::ops::Range<usize>>, SealedError> {
        let Some((first, last, at, stored_len)) = self.frames_span(start, len)? else {
            return Ok(Vec::new());
        };
        let Ok(map) = super::mapped::Mapped::new(&self.file, at, stored_len) else {
            return self.open_frames_in_place(start, len, buf);
        };
        let stored = map.bytes();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let (mut offset, mut out) = (0usize, 0usize);
        for index in first..=last {
            let bad = || SealedError::Open(OpenError::Frame(index));
            let frame_len = (FULL_FRAME as usize).min(stored_len - offset);
            if frame_len < FRAME_OVERHEAD as usize {
                return Err(SealedError::Open(OpenError::Truncated("frame")));
            }
            let frame = &stored[offset..offset + frame_len];
            let (prefix, sealed) = frame.split_at(4);
            let prefix = prefix
                .first_chunk::<4>()
                .map(|p| u32::from_le_bytes(*p) as usize)
                .ok_or_else(bad)?;
            if prefix != sealed.len() {
                return Err(bad());
            }
            let n = sealed.len() - TAG_BYTES;
            let plain = buf
                .get_mut(out..out + n)
                .ok_or(SealedError::Open(OpenError::Truncated("frame")))?;
            super::open_frame_into(&self.key, &self.path, index, sealed, plain)
                .map_err(SealedError::Open)?;
            out += n;
            offset += frame_len;
        }
        if out != len {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        Ok(std::iter::once(0..len).collect())
    }

    /// Opens plaintext bytes `start .. start + len` into `out` (resized to `len`), reading only
    /// the frames that hold them; `frame` is scratch space. A range past the end is
    /// [`OpenError::Truncated`].
    pub(crate) fn read_range(
        &self,
        start: u64,
        len: usize,
        out: &mut Vec<u8>,
        frame: &mut Vec<u8>,
    ) -> Result<(), SealedError> {
        let end = start + len as u64;
        if end > self.plain_len {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        out.clear();
        if len == 0 {
            return Ok(());
        }
        let frame_bytes = FRAME_BYTES as u64;
        for index in start / frame_bytes..=(end - 1) / frame_bytes {
            let plain = self.open_frame(index, frame)?;
            let at = index * frame_bytes;
            let from = start.max(at) - at;
            let to = end.min(at + plain.len() as u64) - at;
            let piece = frame
                .get(plain.start + from as usize..plain.start + to as usize)
                .ok_or(SealedError::Open(OpenError::Frame(index)))?;
            out.extend_from_slice(piece);
        }
        if out.len() != len {
            return Err(SealedError::Open(OpenError::Truncated("frame")));
        }
        Ok(())
    }

    /// Opens the whole file into `out` (created or truncated; not synced), `threads` frames
    /// at once.
    pub(crate) fn open_into(&self, out: &Path, threads: usize) -> Result<(), SealedError> {
        let dst = File::create(out).map_err(SealedError::Io)?;
        dst.set_len(self.plain_len).map_err(SealedError::Io)?;
        let failed = std::sync::Mutex::new(None::<SealedError>);
        let run = for_each_frame(self.frames, threads, |index, buf| {
            match self.open_frame(index, buf) {
                Ok(plain) => dst.write_all_at(&buf[plain], index * FRAME_BYTES as u64),
                Err(e) => {
                    if let Ok(mut f) = failed.lock() {
                        f.get_or_insert(e);
                    }
                    Err(io::Error::other("frame refused"))
                }
            }
        });
        if let Some(e) = failed.into_inner().ok().flatten() {
            return Err(e);
        }
        run.map_err(SealedError::Io)
    }

    /// The plaintext as a reader, frame after frame.
    pub(crate) fn reader(self) -> SealedReader {
        SealedReader {
            file: self,
            next: 0,
            buf: Vec::new(),
            unread: 0..0,
            error: None,
        }
    }
}

/// Why a sealed file does not read: its storage failed, or it is not what was sealed there.
#[derive(Debug)]
pub(crate) enum SealedError {
    Io(io::Error),
    Open(OpenError),
}

/// [`SealedFile`]'s plaintext in order. A frame that does not open ends the read with an error
/// whose source is the [`SealedError`] (see [`SealedReader::take_error`]).
pub(crate) struct SealedReader {
    file: SealedFile,
    next: u64,
    /// The current frame as stored, opened in place; `unread` is its plaintext not read yet.
    buf: Vec<u8>,
    unread: std::ops::Range<usize>,
    error: Option<SealedError>,
}

impl SealedReader {
    /// Why the last read failed, when the sealed file itself was the cause.
    pub(crate) fn take_error(&mut self) -> Option<SealedError> {
        self.error.take()
    }
}

impl Read for SealedReader {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        while self.unread.is_empty() {
            if self.next == self.file.frames {
                return Ok(0);
            }
            match self.file.open_frame(self.next, &mut self.buf) {
                Ok(plain) => self.unread = plain,
                Err(e) => {
                    let message = match &e {
                        SealedError::Io(io) => io.to_string(),
                        SealedError::Open(o) => o.to_string(),
                    };
                    self.error = Some(e);
                    return Err(io::Error::other(message));
                }
            }
            self.next += 1;
        }
        let n = dst.len().min(self.unread.len());
        let from = self.unread.start;
        dst[..n].copy_from_slice(&self.buf[from..from + n]);
        self.unread.start += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> SnapshotKeys {
        SnapshotKeys::from_data_key("dk-test", &[7u8; 32]).expect("keys")
    }

    fn sealed(dir: &Path, plain: &[u8], threads: usize) -> std::path::PathBuf {
        let p = dir.join("plain");
        std::fs::write(&p, plain).expect("write");
        let s = dir.join("sealed");
        let n = seal_file(&keys(), "local:a/b/1-x/f", &p, &s, threads).expect("seal");
        assert_eq!(n, sealed_len(&keys(), plain.len() as u64));
        assert_eq!(std::fs::metadata(&s).expect("stat").len(), n);
        s
    }

    #[test]
    fn files_of_every_shape_round_trip_and_match_the_stream_format() {
        let dir = tempfile::tempdir().expect("tmp");
        for len in [
            0,
            1,
            FRAME_BYTES - 1,
            FRAME_BYTES,
            FRAME_BYTES + 1,
            3 * FRAME_BYTES + 7,
        ] {
            let plain: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            for threads in [1, 3] {
                let s = sealed(dir.path(), &plain, threads);
                let bytes = std::fs::read(&s).expect("read");
                if len >= 64 {
                    assert!(
                        !bytes.windows(64).any(|w| w == &plain[..64]),
                        "plaintext visible"
                    );
                }
                // The same bytes open with the streaming opener of durable objects.
                let streamed =
                    super::super::open_object(&keys(), "local:a/b/1-x/f", &bytes).expect("open");
                assert_eq!(&streamed[..], &plain[..], "len {len}");
                let f = SealedFile::open(&keys(), "local:a/b/1-x/f", File::open(&s).expect("o"))
                    .unwrap_or_else(|_| panic!("open len {len}"));
                assert_eq!(f.plain_len(), len as u64);
                let out = dir.path().join("out");
                assert!(f.open_into(&out, threads).is_ok());
                assert_eq!(std::fs::read(&out).expect("read"), plain);
                // Ranges across frame ends, from each frame alone, and past the end.
                let (mut range, mut frame) = (Vec::new(), Vec::new());
                for (start, n) in [(0, 10), (FRAME_BYTES - 5, 10), (len.saturating_sub(3), 3)] {
                    if start > len {
                        continue;
                    }
                    let n = n.min(len - start);
                    assert!(
                        f.read_range(start as u64, n, &mut range, &mut frame)
                            .is_ok()
                    );
                    assert_eq!(&range[..], &plain[start..start + n], "len {len} at {start}");
                }
                assert!(f.read_range(len as u64, 1, &mut range, &mut frame).is_err());
                let mut back = Vec::new();
                f.reader().read_to_end(&mut back).expect("reader");
                assert_eq!(back, plain);
            }
        }
    }

    #[test]
    fn moved_flipped_truncated_and_plain_files_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let plain = vec![9u8; FRAME_BYTES + 100];
        let s = sealed(dir.path(), &plain, 2);
        let open = |path: &str| SealedFile::open(&keys(), path, File::open(&s).expect("o"));
        // Bound to its path.
        let f = open("local:a/b/2-x/f").unwrap_or_else(|_| panic!("header"));
        let mut buf = Vec::new();
        assert!(matches!(
            f.read_frame(0, &mut buf),
            Err(SealedError::Open(OpenError::Frame(0)))
        ));
        // A flipped bit in the second frame.
        let mut bytes = std::fs::read(&s).expect("read");
        let last = bytes.len() - 3;
        bytes[last] ^= 1;
        std::fs::write(&s, &bytes).expect("write");
        let f = open("local:a/b/1-x/f").unwrap_or_else(|_| panic!("header"));
        assert!(f.read_frame(0, &mut buf).is_ok());
        assert!(matches!(
            f.open_into(&dir.path().join("o"), 2),
            Err(SealedError::Open(OpenError::Frame(1)))
        ));
        // Cut inside the last frame's length: its prefix no longer matches.
        std::fs::write(&s, &bytes[..bytes.len() - 10]).expect("write");
        let f = open("local:a/b/1-x/f").unwrap_or_else(|_| panic!("header"));
        assert!(f.open_into(&dir.path().join("o"), 1).is_err());
        // Plaintext and another key.
        std::fs::write(&s, b"{\"format_version\":3}").expect("write");
        assert!(matches!(
            open("x"),
            Err(SealedError::Open(OpenError::Plaintext))
        ));
        let other = SnapshotKeys::from_data_key("dk-other", &[1u8; 32]).expect("keys");
        let p = dir.path().join("p");
        std::fs::write(&p, b"x").expect("write");
        seal_file(&other, "x", &p, &s, 1).expect("seal");
        assert!(matches!(
            open("x"),
            Err(SealedError::Open(OpenError::OtherKey { .. }))
        ));
    }
}
