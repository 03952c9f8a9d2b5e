//! Verification of a generation's files against its manifest: sizes, sha256 and chunk digests.

use std::fs;
use std::io;
use std::path::Path;

use futures::{FutureExt, StreamExt, TryStreamExt};

use super::HASH_PARALLELISM;
use super::hash::{hash_file, hash_reader};
use crate::error::{Error, Result};
use crate::manifest::{FileEntry, MANIFEST_FILE, Manifest};

/// Checks that the manifest is present and parses, and that every listed file exists with its
/// size and sha256 (and, for memory images, its chunk digests, from the same read). Files not
/// listed are ignored.
pub async fn verify(gen_dir: &Path) -> Result<Manifest> {
    Ok(verify_with_bytes(gen_dir, true).await?.0)
}

/// [`verify`], also returning the manifest's bytes as read (they are what gets uploaded). With
/// `hash` false only presence and sizes are checked (an upload hashes each file as it
/// compresses it and refuses a mismatch before the manifest goes up, so a second pass would
/// only cost CPU).
pub(crate) async fn verify_with_bytes(gen_dir: &Path, hash: bool) -> Result<(Manifest, Vec<u8>)> {
    let (manifest, bytes) = read_manifest_with_bytes(gen_dir).await?;
    let check = if hash { Check::Full } else { Check::SizeOnly };
    check_files(gen_dir, &manifest, check).await?;
    Ok((manifest, bytes))
}

/// The generation's manifest, read and validated, without looking at the files it lists (a
/// restore starts from it while [`verify_files`] hashes them).
pub async fn read_manifest(gen_dir: &Path) -> Result<Manifest> {
    Ok(read_manifest_with_bytes(gen_dir).await?.0)
}

/// The second half of [`verify`]: every file `manifest` lists exists in `gen_dir` with its size
/// and sha256, and every chunk digest a file has matches (one read of each file for both).
pub async fn verify_files(gen_dir: &Path, manifest: &Manifest) -> Result<()> {
    check_files(gen_dir, manifest, Check::Full).await
}

/// [`verify_files`] for a lazy restore: a file with chunk digests (a memory image) is only
/// checked for presence and size, since its chunks are checked as they are read
/// ([`read_verified_chunk_at`], [`verify_chunks`]); every other file is hashed in full.
pub async fn verify_files_except_chunked(gen_dir: &Path, manifest: &Manifest) -> Result<()> {
    check_files(gen_dir, manifest, Check::ExceptChunked).await
}

async fn read_manifest_with_bytes(gen_dir: &Path) -> Result<(Manifest, Vec<u8>)> {
    let path = gen_dir.join(MANIFEST_FILE);
    let bytes = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::Incomplete {
                dir: gen_dir.to_path_buf(),
            });
        }
        Err(e) => return Err(Error::io("read", path, e)),
    };
    let bytes = if bytes.starts_with(crate::crypto::MAGIC) {
        super::sealed::open_manifest(gen_dir, &bytes)?
    } else {
        bytes
    };
    let manifest = Manifest::from_json(&bytes)?;
    Ok((manifest, bytes))
}

/// How much of each listed file [`check_files`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Presence and size only.
    SizeOnly,
    /// Presence, size, sha256 and chunk digests.
    Full,
    /// [`Check::Full`], except presence and size only for a file with chunk digests.
    ExceptChunked,
}

async fn check_files(gen_dir: &Path, manifest: &Manifest, check: Check) -> Result<()> {
    let sealed = super::sealed::is_encrypted(gen_dir);
    // A scratch dir opened without its memory images: those are checked where they are sealed.
    let source = super::sealed_source(gen_dir)?.map(|s| s.generation);
    // Built eagerly and boxed: a stream `map` closure here makes callers' futures fail rustc's
    // higher-ranked `Send` check (rust-lang/rust#102211).
    let checks: Vec<_> = manifest
        .files
        .iter()
        .cloned()
        .map(|f| {
            let (dir, sealed) = match &source {
                Some(generation) if f.has_chunk_digests() => (generation.clone(), true),
                _ => (gen_dir.to_path_buf(), sealed),
            };
            let full = dir.join(&f.path);
            async move {
                let what = format!("hash {}", full.display());
                tokio::task::spawn_blocking(move || {
                    if sealed {
                        check_sealed_file(&dir, &full, &f, check)
                    } else {
                        check_file(&full, &f, check)
                    }
                })
                .await
                .map_err(|e| Error::task(what, e))?
            }
            .boxed()
        })
        .collect();
    futures::stream::iter(checks)
        .buffered(HASH_PARALLELISM)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn check_file(full: &Path, f: &FileEntry, check: Check) -> Result<()> {
    let len = file_len(full, f)?;
    // Size first: cheap, and a truncated file needs no hashing to be rejected.
    if len != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: len,
        });
    }
    match check {
        Check::SizeOnly => return Ok(()),
        Check::ExceptChunked if f.has_chunk_digests() => return Ok(()),
        Check::Full | Check::ExceptChunked => {}
    }
    let hashed = hash_file(full, f.has_chunk_digests(), !f.sha256.is_empty())?;
    compare(f, hashed)
}

/// [`check_file`] of a sealed file: its size on disk is what `f.size` bytes seal to; hashing
/// opens every frame (a frame that does not open is [`Error::Unauthentic`]).
fn check_sealed_file(gen_dir: &Path, full: &Path, f: &FileEntry, check: Check) -> Result<()> {
    let len = file_len(full, f)?;
    let expected = super::sealed::sealed_size(gen_dir, f.size)?;
    if len != expected {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected,
            actual: len,
        });
    }
    match check {
        Check::SizeOnly => return Ok(()),
        Check::ExceptChunked if f.has_chunk_digests() => return Ok(()),
        Check::Full | Check::ExceptChunked => {}
    }
    let mut reader = super::sealed::open_file(gen_dir, &f.path)?.reader();
    let hashed = hash_reader(
        &mut reader,
        full,
        f.has_chunk_digests(),
        !f.sha256.is_empty(),
    );
    if let Some(e) = reader.take_error() {
        return Err(super::sealed::reader_error(&f.path, full, e));
    }
    compare(f, hashed?)
}

/// The size of the file the manifest lists as `f` (missing or not a regular file: missing).
fn file_len(full: &Path, f: &FileEntry) -> Result<u64> {
    let meta = match fs::symlink_metadata(full) {
        Ok(m) if m.is_file() => m,
        Ok(_) => {
            return Err(Error::MissingFile {
                file: f.path.clone(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::MissingFile {
                file: f.path.clone(),
            });
        }
        Err(e) => return Err(Error::io("stat", full, e)),
    };
    Ok(meta.len())
}

/// What hashing a file found against what the manifest says of it.
fn compare(f: &FileEntry, hashed: super::hash::Hashed) -> Result<()> {
    if hashed.size != f.size {
        return Err(Error::SizeMismatch {
            file: f.path.clone(),
            expected: f.size,
            actual: hashed.size,
        });
    }
    // The first damaged chunk first: it says where the damage is, the sha256 only that there
    // is some.
    for (index, (actual, expected)) in
        (0u64..).zip(hashed.blake3_chunks.iter().zip(&f.blake3_chunks))
    {
        if actual != expected {
            let (start, end) = f.chunk_range(index).unwrap_or((0, f.size));
            return Err(Error::ChunkMismatch {
                file: f.path.clone(),
                chunk: index,
                start,
                end,
                expected: expected.clone(),
                actual: actual.clone(),
            });
        }
    }
    if !f.sha256.is_empty() && hashed.sha256 != f.sha256 {
        return Err(Error::ChecksumMismatch {
            file: f.path.clone(),
            expected: f.sha256.clone(),
            actual: hashed.sha256,
        });
    }
    Ok(())
}
