//! Memory-image chunks read from disk and checked one at a time against their BLAKE3 digests.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::manifest::{FileEntry, Manifest};

/// Reads chunk `index` of `file` (the file `entry` describes) into `buf`, resized to the chunk's
/// length, and checks it against the manifest's BLAKE3 digest. Blocking (a positioned read of up
/// to [`CHUNK_BYTES`]); for a page-source thread. See [`read_verified_chunk_at`] for an open file.
pub fn read_verified_chunk(
    file: &Path,
    entry: &FileEntry,
    index: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    // Arguments first: a bad index is the caller's mistake whatever is on disk.
    chunk_span(entry, index)?;
    let f = open_listed(file, entry)?;
    read_chunk(&f, file, entry, index, buf)
}

/// [`read_verified_chunk`] on a file already open (a page source keeps its images open). I/O
/// errors name `entry.path`. A file shorter than the chunk is a [`Error::SizeMismatch`]; a chunk
/// whose BLAKE3 differs is an [`Error::ChunkMismatch`] (both [`Error::is_corrupt`]). An index
/// past the end, or an entry without chunk digests, is an [`Error::InvalidInput`].
pub fn read_verified_chunk_at(
    file: &File,
    entry: &FileEntry,
    index: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    read_chunk(file, Path::new(&entry.path), entry, index, buf)
}

/// Checks the chunks `which` (`(path relative to gen_dir, chunk index)`) of the generation's
/// memory images against `manifest` (e.g. the chunks a restore reads eagerly). Blocking; each
/// file is opened once. A path the manifest does not list, a file without chunk digests or an
/// index past the end is an [`Error::InvalidInput`].
pub fn verify_chunks(gen_dir: &Path, manifest: &Manifest, which: &[(String, u64)]) -> Result<()> {
    let mut open: Vec<(&str, &FileEntry, File, PathBuf)> = Vec::new();
    let mut buf = Vec::new();
    for (rel, index) in which {
        let slot = match open.iter().position(|(p, ..)| *p == rel.as_str()) {
            Some(i) => i,
            None => {
                let entry = manifest.file(rel).ok_or_else(|| {
                    Error::InvalidInput(format!("{rel}: not listed in the manifest"))
                })?;
                chunk_span(entry, *index)?;
                let full = gen_dir.join(rel);
                let f = open_listed(&full, entry)?;
                open.push((rel.as_str(), entry, f, full));
                open.len() - 1
            }
        };
        let (_, entry, f, full) = &open[slot];
        read_chunk(f, full, entry, *index, &mut buf)?;
    }
    Ok(())
}

/// `(start, end, digest)` of chunk `index`, or why there is none.
pub(super) fn chunk_span(entry: &FileEntry, index: u64) -> Result<(u64, u64, &str)> {
    if !entry.has_chunk_digests() {
        return Err(Error::InvalidInput(format!(
            "{}: the manifest has no chunk digests for it",
            entry.path
        )));
    }
    match (entry.chunk_range(index), entry.chunk_digest(index)) {
        (Some((start, end)), Some(digest)) => Ok((start, end, digest)),
        _ => Err(Error::InvalidInput(format!(
            "{}: chunk {index} is past the end ({} bytes, {} chunks)",
            entry.path,
            entry.size,
            entry.chunk_count()
        ))),
    }
}

/// Opens a listed file for reading; absent (or not a regular file) is [`Error::MissingFile`].
pub(super) fn open_listed(full: &Path, entry: &FileEntry) -> Result<File> {
    match File::open(full) {
        Ok(f) => match f.metadata() {
            Ok(m) if m.is_file() => Ok(f),
            Ok(_) => Err(Error::MissingFile {
                file: entry.path.clone(),
            }),
            Err(e) => Err(Error::io("stat", full, e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::MissingFile {
            file: entry.path.clone(),
        }),
        Err(e) => Err(Error::io("open", full, e)),
    }
}

/// pread of chunk `index` into `buf`, then BLAKE3 against the manifest. `shown` names the file
/// in I/O errors.
pub(super) fn read_chunk(
    f: &File,
    shown: &Path,
    entry: &FileEntry,
    index: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let (start, end, _) = chunk_span(entry, index)?;
    // A chunk is at most CHUNK_BYTES (2 MiB): fits usize.
    let len = (end - start) as usize;
    buf.resize(len, 0);
    match f.read_exact_at(buf, start) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            // Shorter than the manifest says: the image was truncated.
            let actual = f.metadata().map_err(|e| Error::io("stat", shown, e))?.len();
            return Err(Error::SizeMismatch {
                file: entry.path.clone(),
                expected: entry.size,
                actual,
            });
        }
        Err(e) => return Err(Error::io("read", shown, e)),
    }
    verify_chunk_bytes(entry, index, buf)
}

/// Checks `data` as chunk `index` of the file `entry` describes: its length and its BLAKE3
/// digest against the manifest (a chunk fetched from the durable store, or read from disk).
pub fn verify_chunk_bytes(entry: &FileEntry, index: u64, data: &[u8]) -> Result<()> {
    let (start, end, expected) = chunk_span(entry, index)?;
    let actual = blake3::hash(data).to_hex();
    if data.len() as u64 != end - start || actual.as_str() != expected {
        return Err(Error::ChunkMismatch {
            file: entry.path.clone(),
            chunk: index,
            start,
            end,
            expected: expected.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}
