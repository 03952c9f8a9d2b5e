//! One read of a file for its size, sha256 and per-chunk BLAKE3 digests.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::manifest::CHUNK_BYTES;

/// What one read of a file found.
pub(super) struct Hashed {
    pub(super) size: u64,
    /// Lowercase hex.
    pub(super) sha256: String,
    /// BLAKE3 (lowercase hex) per [`CHUNK_BYTES`] chunk; empty unless asked for.
    pub(super) blake3_chunks: Vec<String>,
}

/// Size and (when `sha256`) sha256 of a file and, when `chunked`, the BLAKE3 of each
/// [`CHUNK_BYTES`] chunk: one read of the file. The chunk digests are computed on a second
/// thread while this one reads (and feeds sha256); `sha256` is empty when not asked for.
pub(super) fn hash_file(path: &Path, chunked: bool, sha256: bool) -> Result<Hashed> {
    let mut f = File::open(path).map_err(|e| Error::io("open", path, e))?;
    hash_reader(&mut f, path, chunked, sha256)
}

/// [`hash_file`] of what `f` reads (`path` names it in errors).
pub(super) fn hash_reader(
    f: &mut impl Read,
    path: &Path,
    chunked: bool,
    sha256: bool,
) -> Result<Hashed> {
    let mut h = sha256.then(Sha256::new);
    // CHUNK_BYTES is 2 MiB: fits usize.
    let chunk = CHUNK_BYTES as usize;
    if !chunked {
        let mut buf = vec![0u8; chunk];
        let mut size = 0u64;
        loop {
            let n = read_full(f, &mut buf).map_err(|e| Error::io("read", path, e))?;
            if let Some(h) = h.as_mut() {
                h.update(&buf[..n]);
            }
            size += n as u64;
            if n < buf.len() {
                break;
            }
        }
        return Ok(Hashed {
            size,
            sha256: h.map(|h| hex::encode(h.finalize())).unwrap_or_default(),
            blake3_chunks: Vec::new(),
        });
    }
    std::thread::scope(|scope| {
        // Filled chunks go to the BLAKE3 threads and come back empty. Two hashing threads: a
        // suspend waits for this, and one thread hashes a 1 GiB image in ~0.4 s here.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 2));
        let (to_blake3, filled) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(threads);
        let filled = std::sync::Arc::new(std::sync::Mutex::new(filled));
        let (give_back, empty) = std::sync::mpsc::channel::<Vec<u8>>();
        for _ in 0..2 * threads + 1 {
            let _ = give_back.send(vec![0u8; chunk]);
        }
        let hashers: Vec<_> = (0..threads)
            .map(|_| {
                let give_back = give_back.clone();
                let filled = filled.clone();
                scope.spawn(move || {
                    let mut digests = Vec::new();
                    loop {
                        let next = filled.lock().map(|rx| rx.recv());
                        let Ok(Ok((index, buf))) = next else {
                            break;
                        };
                        digests.push((index, blake3::hash(&buf).to_hex().to_string()));
                        // The reader may have stopped (error or end): nobody needs the buffer.
                        let _ = give_back.send(buf);
                    }
                    digests
                })
            })
            .collect();
        drop(give_back);
        let mut index = 0usize;
        let mut size = 0u64;
        let read = (|| -> Result<()> {
            loop {
                let Ok(mut buf) = empty.recv() else {
                    return Err(Error::io(
                        "hash",
                        path,
                        io::Error::other("chunk hashing thread ended"),
                    ));
                };
                buf.resize(chunk, 0);
                let n = read_full(f, &mut buf).map_err(|e| Error::io("read", path, e))?;
                if n == 0 {
                    return Ok(());
                }
                buf.truncate(n);
                if let Some(h) = h.as_mut() {
                    h.update(&buf);
                }
                size += n as u64;
                index += 1;
                if to_blake3.send((index - 1, buf)).is_err() {
                    return Err(Error::io(
                        "hash",
                        path,
                        io::Error::other("chunk hashing thread ended"),
                    ));
                }
                if n < chunk {
                    // read_full stops short only at end of file.
                    return Ok(());
                }
            }
        })();
        drop(to_blake3);
        let mut indexed = Vec::new();
        for hasher in hashers {
            indexed.extend(hasher.join().map_err(|_| {
                Error::io(
                    "hash",
                    path,
                    io::Error::other("chunk hashing thread panicked"),
                )
            })?);
        }
        read?;
        indexed.sort_unstable_by_key(|(i, _)| *i);
        if indexed.len() != index || indexed.iter().enumerate().any(|(n, (i, _))| n != *i) {
            return Err(Error::io(
                "hash",
                path,
                io::Error::other("a chunk was not hashed"),
            ));
        }
        let digests = indexed.into_iter().map(|(_, d)| d).collect();
        Ok(Hashed {
            size,
            sha256: h.map(|h| hex::encode(h.finalize())).unwrap_or_default(),
            blake3_chunks: digests,
        })
    })
}

/// Fills `buf` from `f`, short only at end of file; returns how many bytes it read.
fn read_full(f: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
