//! zstd compression and decompression of one file, with its sha256 and size checked on the way.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{CHUNK, ZSTD_LEVEL};
use crate::error::{Error, Result};
use crate::manifest::FileEntry;

/// Reads `src`, hashing the raw bytes, and sends zstd-compressed chunks. Returns (size, sha256).
pub(super) fn compress_file(src: &Path, tx: mpsc::Sender<Bytes>) -> Result<(u64, String)> {
    let mut file = File::open(src).map_err(|e| Error::io("open", src, e))?;
    let mut enc = zstd::stream::write::Encoder::new(Vec::with_capacity(CHUNK * 2), ZSTD_LEVEL)
        .map_err(|e| Error::io("zstd init", src, e))?;
    // Frame checksum: a corrupted object fails in the decoder, before the sha256 check.
    enc.include_checksum(true)
        .map_err(|e| Error::io("zstd init", src, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    let closed = || Error::Task {
        what: format!("upload {}", src.display()),
        message: "receiver closed".into(),
    };
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("read", src, e)),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
        enc.write_all(&buf[..n])
            .map_err(|e| Error::io("compress", src, e))?;
        if enc.get_ref().len() >= CHUNK {
            let out = std::mem::take(enc.get_mut());
            tx.blocking_send(Bytes::from(out)).map_err(|_| closed())?;
        }
    }
    let out = enc.finish().map_err(|e| Error::io("compress", src, e))?;
    if !out.is_empty() {
        tx.blocking_send(Bytes::from(out)).map_err(|_| closed())?;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// `Read` over the chunks the async side receives from the object store.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

/// Decodes the streamed object into `dst` ([`decompress_into`]).
pub(super) fn decompress_file(
    rx: mpsc::Receiver<Bytes>,
    dst: &Path,
    f: &FileEntry,
    key: &str,
) -> Result<()> {
    let reader = ChannelReader {
        rx,
        cur: Bytes::new(),
    };
    decompress_into(reader, dst, f, key)
}

/// Decodes into `dst`, checking size (bounded, so a bad object cannot fill the disk) and sha256.
pub(super) fn decompress_into(
    reader: impl Read,
    dst: &Path,
    f: &FileEntry,
    key: &str,
) -> Result<()> {
    let dec = zstd::stream::read::Decoder::new(reader).map_err(|e| Error::Decompress {
        key: key.to_string(),
        source: e,
    })?;
    let mut limited = dec.take(f.size + 1);
    let mut out = File::create(dst).map_err(|e| Error::io("create", dst, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match limited.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Error::Decompress {
                    key: key.to_string(),
                    source: e,
                });
            }
        };
        hasher.update(&buf[..n]);
        size += n as u64;
        out.write_all(&buf[..n])
            .map_err(|e| Error::io("write", dst, e))?;
    }
    if size != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: size,
        });
    }
    let sha = hex::encode(hasher.finalize());
    if sha != f.sha256 {
        return Err(Error::ChecksumMismatch {
            file: f.path.clone(),
            expected: f.sha256.clone(),
            actual: sha,
        });
    }
    // Not synced: a download is a verified cache (see `download_into`).
    out.flush().map_err(|e| Error::io("write", dst, e))?;
    Ok(())
}
