//! One file of a generation: its manifest entry, chunk geometry, and the checks on it.

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::CHUNK_BYTES;
use crate::error::{Error, Result};

/// One file of a generation, path relative to the generation directory (`/`-separated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    /// Lowercase hex; empty for a file with chunk digests from format 3 on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// BLAKE3 of each [`CHUNK_BYTES`] chunk of the file, in order, lowercase hex (64 digits);
    /// the last chunk may be shorter. Only memory images ([`is_memory_pages_file`]) have them;
    /// empty for every other file and for an empty image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blake3_chunks: Vec<String>,
}

/// True for CRIU's memory images, `criu/pages-<digits>.img` exactly: the files that get chunk
/// digests.
pub fn is_memory_pages_file(rel: &str) -> bool {
    rel.strip_prefix("criu/pages-")
        .and_then(|r| r.strip_suffix(".img"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl FileEntry {
    /// How many chunks of the file have a digest: `ceil(size / CHUNK_BYTES)` for a memory image
    /// with chunk digests (a validated entry has exactly one per chunk), 0 for a file without
    /// them (every other file, an empty image, an image from a version 1 manifest).
    pub fn chunk_count(&self) -> u64 {
        self.blake3_chunks.len() as u64
    }

    /// True when the manifest carries per-chunk BLAKE3 digests for this file.
    pub fn has_chunk_digests(&self) -> bool {
        !self.blake3_chunks.is_empty()
    }

    /// The manifest's BLAKE3 (lowercase hex) of chunk `index`; `None` past the end or for a
    /// file without chunk digests.
    pub fn chunk_digest(&self, index: u64) -> Option<&str> {
        let i = usize::try_from(index).ok()?;
        self.blake3_chunks.get(i).map(String::as_str)
    }

    /// Byte range `(start, end)` (end exclusive) of chunk `index` in the file: `index *
    /// CHUNK_BYTES` up to the next chunk or the end of the file. `None` past the end of the file.
    /// Only the size counts: a file without chunk digests has chunks too.
    pub fn chunk_range(&self, index: u64) -> Option<(u64, u64)> {
        if index >= self.size.div_ceil(CHUNK_BYTES) {
            return None;
        }
        // index < ceil(size / CHUNK_BYTES), so start < size: no overflow.
        let start = index * CHUNK_BYTES;
        let end = start.saturating_add(CHUNK_BYTES).min(self.size);
        Some((start, end))
    }
}

pub(super) fn is_lower_hex_64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `blake3_chunks`: only on memory images, only from format 2 on, one well-formed digest per
/// chunk.
pub(super) fn check_chunk_digests(format_version: u32, f: &FileEntry) -> Result<()> {
    if f.blake3_chunks.is_empty() {
        return Ok(());
    }
    let bad = |why: String| Err(Error::InvalidManifest(format!("file {:?}: {why}", f.path)));
    if format_version < 2 {
        return bad(format!(
            "blake3_chunks in a format_version {format_version} manifest (chunk digests came \
             with version 2)"
        ));
    }
    if !is_memory_pages_file(&f.path) {
        return bad(
            "blake3_chunks on a file that is not a memory image (criu/pages-<N>.img)".into(),
        );
    }
    let want = f.size.div_ceil(CHUNK_BYTES);
    if f.blake3_chunks.len() as u64 != want {
        return bad(format!(
            "{} blake3_chunks for {} bytes, expected {want} (one per {CHUNK_BYTES} bytes)",
            f.blake3_chunks.len(),
            f.size
        ));
    }
    if let Some((i, d)) = f
        .blake3_chunks
        .iter()
        .enumerate()
        .find(|(_, d)| !is_lower_hex_64(d))
    {
        return bad(format!(
            "blake3_chunks[{i}] {d:?} is not 64 lowercase hex digits"
        ));
    }
    Ok(())
}

/// A listed path must stay inside the generation: relative, `/`-separated plain names only.
pub(super) fn check_rel_path(p: &str) -> Result<()> {
    let bad = |why: &str| Error::InvalidManifest(format!("file path {p:?}: {why}"));
    if p.is_empty() || p.len() > 4096 {
        return Err(bad("empty or too long"));
    }
    if p.contains('\0') || p.contains('\\') {
        return Err(bad("NUL or backslash"));
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(bad("empty, '.' or '..' segment"));
        }
    }
    if !Path::new(p)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(bad("not a plain relative path"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_file_names() {
        for ok in [
            "criu/pages-1.img",
            "criu/pages-0.img",
            "criu/pages-1234567890.img",
        ] {
            assert!(is_memory_pages_file(ok), "{ok}");
        }
        for no in [
            "criu/pages-.img",
            "criu/pages-1.img.x",
            "criu/pages-1a.img",
            "criu/pages-1",
            "criu/pagemap-1.img",
            "criu/sub/pages-1.img",
            "pages-1.img",
            "x/criu/pages-1.img",
            "criu/pages--1.img",
            "criu/pages-+1.img",
            "criu/inventory.img",
            "rootfs.tar",
        ] {
            assert!(!is_memory_pages_file(no), "{no}");
        }
    }

    #[test]
    fn chunk_geometry() {
        let entry = |size| FileEntry {
            path: "criu/pages-1.img".into(),
            size,
            sha256: "a".repeat(64),
            blake3_chunks: Vec::new(),
        };
        let empty = entry(0);
        assert_eq!(empty.chunk_count(), 0);
        assert_eq!(empty.chunk_range(0), None);
        // Without digests (another file, a version 1 manifest): no chunks to verify, but the
        // byte ranges are still defined by the size.
        let one = entry(1);
        assert_eq!(one.chunk_count(), 0);
        assert!(!one.has_chunk_digests());
        assert_eq!(one.chunk_range(0), Some((0, 1)));
        assert_eq!(one.chunk_digest(0), None, "no digests");
        let exact = entry(2 * CHUNK_BYTES);
        assert_eq!(exact.chunk_count(), 0);
        assert_eq!(exact.chunk_range(1), Some((CHUNK_BYTES, 2 * CHUNK_BYTES)));
        assert_eq!(exact.chunk_range(2), None);
        let mut odd = entry(5 * 1024 * 1024 + 123);
        odd.blake3_chunks = vec!["0".repeat(64), "1".repeat(64), "2".repeat(64)];
        assert_eq!(odd.chunk_count(), 3);
        assert!(odd.has_chunk_digests());
        assert_eq!(
            odd.chunk_range(2),
            Some((2 * CHUNK_BYTES, 5 * 1024 * 1024 + 123))
        );
        assert_eq!(odd.chunk_digest(1), Some("1".repeat(64).as_str()));
        assert_eq!(odd.chunk_digest(3), None);
        assert_eq!(odd.chunk_digest(u64::MAX), None);
        // The largest sizes do not overflow.
        let huge = entry(u64::MAX);
        let last = u64::MAX.div_ceil(CHUNK_BYTES) - 1;
        assert_eq!(huge.chunk_range(last).map(|r| r.1), Some(u64::MAX));
        assert_eq!(huge.chunk_range(last + 1), None);
    }
}
