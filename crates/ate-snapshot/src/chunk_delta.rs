//! Chunks stored as the pages that differ from another chunk ("delta chunks").
//!
//! CRIU can dump only what changed since the previous generation when the kernel tracks dirty
//! pages (`CONFIG_MEM_SOFT_DIRTY`); without it every suspend dumps all of an actor's memory. So
//! what changed is found at upload instead: a chunk whose digest the store lacks is compared
//! page by page with the same chunk of an earlier generation of the actor that this node holds,
//! and when few pages differ only those go up, as a delta on that chunk's full copy in the
//! store (its *base*).
//!
//! A delta is stored under the same key as a full chunk (`_chunks/<fan>/<digest>.zst`), so
//! readers, reuse checks and sweeps find every chunk by its digest alone. Its object is a zstd
//! skippable frame holding the [`DeltaHeader`], then one zstd frame of the replaced pages in
//! order; a full chunk is one plain zstd frame. Bases are full chunks when they are chosen (a
//! new delta against a chunk that is itself a delta takes that delta's base and adds its pages),
//! so a read usually takes two objects; readers still follow up to [`MAX_CHAIN`] bases, because a
//! base's object may be replaced by a delta of the same content later. A chunk whose pages differ
//! from its base in more than [`MAX_DELTA_PAGES`] pages is written full again.

use crate::error::{Error, Result};

/// Bytes per page of CRIU's memory images (x86-64, aarch64 with 4 KiB pages).
pub(crate) const PAGE: usize = 4096;
/// Pages of a [`crate::CHUNK_BYTES`] chunk.
pub(crate) const CHUNK_PAGES: usize = (crate::manifest::CHUNK_BYTES as usize) / PAGE;
/// More pages than this (a quarter of a chunk) differing from the base: the chunk is written
/// full instead, which also bounds how far a chain of generations drifts from its base.
pub(crate) const MAX_DELTA_PAGES: usize = CHUNK_PAGES / 4;
/// Bases a read follows at most.
pub(crate) const MAX_CHAIN: usize = 4;

/// zstd's first skippable-frame magic (any of 0x184D2A50..=0x184D2A5F); decoders skip it.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A50;
const DELTA_MAGIC: &[u8; 8] = b"ATEDELTA";
const DELTA_VERSION: u8 = 1;
const BITMAP_BYTES: usize = CHUNK_PAGES / 8;
const DIGEST_HEX: usize = 64;
/// Header bytes inside the skippable frame.
const HEADER_BYTES: usize = DELTA_MAGIC.len() + 1 + DIGEST_HEX + 4 + BITMAP_BYTES;
/// Bytes of an object that hold the header of a delta (what a ranged read fetches to learn a
/// stored chunk's base).
pub(crate) const PREFIX_BYTES: usize = 8 + HEADER_BYTES;

/// A set of pages of one chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PageSet([u64; CHUNK_PAGES / 64]);

impl PageSet {
    pub fn insert(&mut self, page: usize) {
        if page < CHUNK_PAGES {
            self.0[page / 64] |= 1 << (page % 64);
        }
    }

    pub fn contains(&self, page: usize) -> bool {
        page < CHUNK_PAGES && self.0[page / 64] & (1 << (page % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn union(&self, other: &PageSet) -> PageSet {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a |= *b;
        }
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..CHUNK_PAGES).filter(|p| self.contains(*p))
    }

    fn to_bytes(self) -> [u8; BITMAP_BYTES] {
        let mut out = [0u8; BITMAP_BYTES];
        for (i, w) in self.0.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    fn from_bytes(b: &[u8]) -> PageSet {
        let mut set = PageSet::default();
        for (i, w) in set.0.iter_mut().enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(&b[i * 8..i * 8 + 8]);
            *w = u64::from_le_bytes(word);
        }
        set
    }
}

/// The pages of `new` that differ from `old`; `None` when the two are not the same length (a
/// delta needs a base of the chunk's own length) or longer than a chunk.
pub(crate) fn diff_pages(old: &[u8], new: &[u8]) -> Option<PageSet> {
    if old.len() != new.len() || new.len() > CHUNK_PAGES * PAGE {
        return None;
    }
    let mut set = PageSet::default();
    for (i, (a, b)) in old.chunks(PAGE).zip(new.chunks(PAGE)).enumerate() {
        if a != b {
            set.insert(i);
        }
    }
    Some(set)
}

/// What a delta object says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeltaHeader {
    /// BLAKE3 (lowercase hex) of the base chunk.
    pub base: String,
    /// Length of the chunk (and of its base).
    pub len: usize,
    /// Pages taken from the delta; every other page is the base's.
    pub pages: PageSet,
}

/// The delta header at the start of a stored chunk object (`obj` may be just its first
/// [`PREFIX_BYTES`]); `None` for a full chunk. `name` labels errors.
pub(crate) fn parse_header(obj: &[u8], name: &str) -> Result<Option<DeltaHeader>> {
    let bad = |why: &str| Error::InvalidInput(format!("chunk object {name}: {why}"));
    let Some(magic) = obj.get(..4) else {
        return Ok(None); // shorter than any frame: not a delta (the decoder says what it is)
    };
    if u32::from_le_bytes([magic[0], magic[1], magic[2], magic[3]]) != SKIPPABLE_MAGIC {
        return Ok(None);
    }
    let h = obj
        .get(8..8 + HEADER_BYTES)
        .ok_or_else(|| bad("delta header cut short"))?;
    let size = u32::from_le_bytes([obj[4], obj[5], obj[6], obj[7]]) as usize;
    if size != HEADER_BYTES || &h[..8] != DELTA_MAGIC {
        return Err(bad("not a delta header this build knows"));
    }
    if h[8] != DELTA_VERSION {
        return Err(bad(&format!(
            "delta format version {} is not supported",
            h[8]
        )));
    }
    let base = std::str::from_utf8(&h[9..9 + DIGEST_HEX])
        .ok()
        .filter(|s| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .ok_or_else(|| bad("the base digest is not lowercase hex"))?
        .to_string();
    let at = 9 + DIGEST_HEX;
    let len = u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]) as usize;
    if len > CHUNK_PAGES * PAGE {
        return Err(bad("chunk length past a chunk"));
    }
    let pages = PageSet::from_bytes(&h[at + 4..at + 4 + BITMAP_BYTES]);
    if pages.iter().any(|p| p * PAGE >= len) {
        return Err(bad("a page past the chunk's end"));
    }
    Ok(Some(DeltaHeader { base, len, pages }))
}

/// The object of chunk `new` stored as `pages` taken over a base chunk with digest `base`.
pub(crate) fn encode(base: &str, new: &[u8], pages: &PageSet, level: i32) -> Result<Vec<u8>> {
    if base.len() != DIGEST_HEX || new.len() > CHUNK_PAGES * PAGE {
        return Err(Error::InvalidInput(format!(
            "delta on {base}: not a digest or chunk too long ({} bytes)",
            new.len()
        )));
    }
    let mut payload = Vec::with_capacity(pages.len() * PAGE);
    for p in pages.iter() {
        let start = p * PAGE;
        if start >= new.len() {
            break;
        }
        payload.extend_from_slice(&new[start..(start + PAGE).min(new.len())]);
    }
    let mut c = zstd::bulk::Compressor::new(level)
        .map_err(|e| Error::io("zstd init", std::path::Path::new(base), e))?;
    c.include_checksum(true)
        .map_err(|e| Error::io("zstd init", std::path::Path::new(base), e))?;
    let frame = c
        .compress(&payload)
        .map_err(|e| Error::io("compress", std::path::Path::new(base), e))?;
    let mut out = Vec::with_capacity(PREFIX_BYTES + frame.len());
    out.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    out.extend_from_slice(DELTA_MAGIC);
    out.push(DELTA_VERSION);
    out.extend_from_slice(base.as_bytes());
    out.extend_from_slice(&(new.len() as u32).to_le_bytes());
    out.extend_from_slice(&pages.to_bytes());
    out.extend_from_slice(&frame);
    Ok(out)
}

/// Puts the pages of delta object `obj` (with header `h`, parsed from it) over `base` (the base
/// chunk's bytes, `h.len` long), giving the chunk. `name` labels errors.
pub(crate) fn apply(h: &DeltaHeader, obj: &[u8], mut base: Vec<u8>, name: &str) -> Result<Vec<u8>> {
    if base.len() != h.len {
        return Err(Error::InvalidInput(format!(
            "chunk object {name}: its base {} is {} bytes, the delta says {}",
            h.base,
            base.len(),
            h.len
        )));
    }
    let frame = obj.get(PREFIX_BYTES..).unwrap_or_default();
    let expected: usize = h.pages.iter().map(|p| (h.len - p * PAGE).min(PAGE)).sum();
    let pages = zstd::bulk::decompress(frame, expected).map_err(|e| Error::Decompress {
        key: name.to_string(),
        source: e,
    })?;
    if pages.len() != expected {
        return Err(Error::InvalidInput(format!(
            "chunk object {name}: {} bytes of pages, the header names {expected}",
            pages.len()
        )));
    }
    let mut at = 0;
    for p in h.pages.iter() {
        let start = p * PAGE;
        let n = (h.len - start).min(PAGE);
        base[start..start + n].copy_from_slice(&pages[at..at + n]);
        at += n;
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_delta_rebuilds_the_chunk_from_its_base() {
        let base = chunk(1, CHUNK_PAGES * PAGE);
        let mut new = base.clone();
        for p in [0, 7, 300, CHUNK_PAGES - 1] {
            new[p * PAGE + 5] ^= 0xff;
        }
        let pages = diff_pages(&base, &new).expect("same length");
        assert_eq!(
            pages.iter().collect::<Vec<_>>(),
            vec![0, 7, 300, CHUNK_PAGES - 1]
        );
        let digest = blake3::hash(&base).to_hex().to_string();
        let obj = encode(&digest, &new, &pages, 3).expect("encode");
        assert!(
            obj.len() < 5 * PAGE,
            "only the changed pages go in: {}",
            obj.len()
        );
        let h = parse_header(&obj, "x").expect("parse").expect("a delta");
        assert_eq!(h.base, digest);
        assert_eq!(h.len, new.len());
        assert_eq!(h.pages, pages);
        // The header alone (a ranged read of the prefix) parses the same.
        assert_eq!(
            parse_header(&obj[..PREFIX_BYTES], "x").expect("parse"),
            Some(h.clone())
        );
        assert_eq!(apply(&h, &obj, base, "x").expect("apply"), new);
    }

    #[test]
    fn extra_pages_and_a_short_last_chunk_round_trip() {
        let len = 3 * PAGE + 100;
        let base = chunk(2, len);
        let mut new = base.clone();
        new[3 * PAGE + 50] = 9;
        let mut pages = diff_pages(&base, &new).expect("same length");
        assert_eq!(pages.len(), 1);
        // Pages the base's own delta carried go again, unchanged or not.
        let mut carried = PageSet::default();
        carried.insert(1);
        pages = pages.union(&carried);
        let obj = encode(&"a".repeat(64), &new, &pages, 3).expect("encode");
        let h = parse_header(&obj, "x").expect("parse").expect("a delta");
        assert_eq!(apply(&h, &obj, base, "x").expect("apply"), new);
    }

    #[test]
    fn a_full_chunk_has_no_header_and_damage_is_refused() {
        let full = zstd::bulk::compress(&chunk(3, PAGE), 3).expect("compress");
        assert_eq!(parse_header(&full, "x").expect("parse"), None);
        assert_eq!(parse_header(&[], "x").expect("parse"), None);
        let base = chunk(4, 2 * PAGE);
        let mut new = base.clone();
        new[0] ^= 1;
        let pages = diff_pages(&base, &new).expect("same length");
        let obj = encode(&"b".repeat(64), &new, &pages, 3).expect("encode");
        // Cut in the header.
        assert!(parse_header(&obj[..20], "x").is_err());
        // A base of the wrong length.
        let h = parse_header(&obj, "x").expect("parse").expect("a delta");
        assert!(apply(&h, &obj, vec![0; PAGE], "x").is_err());
        // A damaged page frame fails in the decoder (frame checksum).
        let mut bad = obj.clone();
        let last = bad.len() - 6;
        bad[last] ^= 0xff;
        assert!(apply(&h, &bad, base.clone(), "x").is_err());
        // Different lengths have no delta.
        assert_eq!(diff_pages(&base, &new[..PAGE]), None);
    }
}
