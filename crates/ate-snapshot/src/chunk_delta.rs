//! Chunks stored as the pages that differ from chunks the store already holds ("delta
//! chunks").
//!
//! CRIU can dump only what changed since the previous generation when the kernel tracks dirty
//! pages (`CONFIG_MEM_SOFT_DIRTY`); without it every suspend dumps all of an actor's memory. So
//! what changed is found at upload instead: a chunk whose digest the store lacks is compared,
//! page by page, with the pages at the same virtual addresses in an earlier generation of the
//! actor that this node holds, and when few pages differ only those go up; every other page is
//! named as a page of a chunk the store holds whole (a *base*). Pages are matched by address
//! (from CRIU's pagemaps, see [`crate::MemoryLayout`]), not by offset in the image, because one
//! new page early in the address space shifts every page after it in the image.
//!
//! A delta is stored under the same key as a full chunk (`_chunks/<fan>/<digest>.zst`), so
//! readers, reuse checks and sweeps find every chunk by its digest alone. Its object is a zstd
//! skippable frame holding the [`DeltaHeader`] (the bases, and for each page: a literal, or page
//! N of base M), then one zstd frame of the literal pages in order; a full chunk is one plain
//! zstd frame. A delta's bases are whole chunks when it is written (a page the parent holds in
//! a delta of its own is resolved to where that delta takes it from), so a read takes the delta
//! and then its bases, fetched together; readers still follow up to [`MAX_CHAIN`] levels,
//! because a base's object may later be replaced by a delta of the same content. A chunk with
//! more than [`MAX_DELTA_PAGES`] literal pages, or pages from more than [`MAX_BASES`] bases, is
//! written whole (and becomes a base itself).

use crate::error::{Error, Result};

/// Bytes per page of CRIU's memory images (x86-64, aarch64 with 4 KiB pages).
pub(crate) const PAGE: usize = 4096;
/// Pages of a [`crate::CHUNK_BYTES`] chunk.
pub(crate) const CHUNK_PAGES: usize = (crate::manifest::CHUNK_BYTES as usize) / PAGE;
/// More literal pages than this (a quarter of a chunk): the chunk is written whole instead,
/// which also bounds how far a chain of generations drifts from its bases.
pub(crate) const MAX_DELTA_PAGES: usize = CHUNK_PAGES / 4;
/// Levels of bases a read follows at most.
pub(crate) const MAX_CHAIN: usize = 4;
/// Bases one delta may take pages from (a shifted layout spans two chunks of the parent, each
/// of which may be a delta on others).
pub(crate) const MAX_BASES: usize = 8;

/// zstd's first skippable-frame magic (any of 0x184D2A50..=0x184D2A5F); decoders skip it.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A50;
const DELTA_MAGIC: &[u8; 8] = b"ATEDELTA";
const DELTA_VERSION: u8 = 1;
const DIGEST_HEX: usize = 64;
/// A page-table entry meaning "this page is in the delta itself".
const LITERAL: u16 = 0xFFFF;
/// Longest header: magic, version, length, base count, bases, one table entry per page.
const MAX_HEADER_BYTES: usize =
    DELTA_MAGIC.len() + 1 + 4 + 1 + MAX_BASES * DIGEST_HEX + CHUNK_PAGES * 2;
/// Bytes of an object that hold the header of any delta (what a ranged read fetches to learn
/// how a stored chunk is made).
pub(crate) const PREFIX_BYTES: usize = 8 + MAX_HEADER_BYTES;

/// Where one page of a delta chunk comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageFrom {
    /// The delta holds it.
    Literal,
    /// Page `page` of base number `base` (an index into [`DeltaHeader::bases`]).
    Base { base: u8, page: u16 },
}

impl PageFrom {
    fn encode(self) -> u16 {
        match self {
            PageFrom::Literal => LITERAL,
            PageFrom::Base { base, page } => (u16::from(base) << 12) | (page & 0x0FFF),
        }
    }

    fn decode(v: u16) -> PageFrom {
        if v == LITERAL {
            PageFrom::Literal
        } else {
            PageFrom::Base {
                base: (v >> 12) as u8,
                page: v & 0x0FFF,
            }
        }
    }
}

/// What a delta object says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeltaHeader {
    /// Length of the chunk.
    pub len: usize,
    /// BLAKE3 (lowercase hex) of each base chunk.
    pub bases: Vec<String>,
    /// One entry per page of the chunk.
    pub pages: Vec<PageFrom>,
}

impl DeltaHeader {
    /// Pages the delta holds itself.
    pub fn literals(&self) -> usize {
        self.pages
            .iter()
            .filter(|p| **p == PageFrom::Literal)
            .count()
    }
}

/// Pages of a chunk of `len` bytes (the last one may be short).
pub(crate) fn pages_in(len: usize) -> usize {
    len.div_ceil(PAGE)
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The delta header at the start of a stored chunk object (`obj` may be just its first
/// [`PREFIX_BYTES`]); `None` for a full chunk. `name` labels errors.
pub(crate) fn parse_header(obj: &[u8], name: &str) -> Result<Option<DeltaHeader>> {
    let bad = |why: &str| Error::InvalidInput(format!("chunk object {name}: {why}"));
    match obj.get(..4) {
        Some(magic) if le_u32(magic) == SKIPPABLE_MAGIC => {}
        // Shorter than any frame, or a plain frame: not a delta (the decoder says what it is).
        _ => return Ok(None),
    }
    let size = obj
        .get(4..8)
        .map(|b| le_u32(b) as usize)
        .ok_or_else(|| bad("delta header cut short"))?;
    if size > MAX_HEADER_BYTES {
        return Err(bad("delta header too long"));
    }
    let h = obj
        .get(8..8 + size)
        .ok_or_else(|| bad("delta header cut short"))?;
    let mut at = 0;
    let mut take = |n: usize| -> Result<&[u8]> {
        let part = h
            .get(at..at + n)
            .ok_or_else(|| bad("delta header cut short"))?;
        at += n;
        Ok(part)
    };
    if take(DELTA_MAGIC.len())? != DELTA_MAGIC.as_slice() {
        return Err(bad("not a delta header this build knows"));
    }
    let version = take(1)?[0];
    if version != DELTA_VERSION {
        return Err(bad(&format!(
            "delta format version {version} is not supported"
        )));
    }
    let len = le_u32(take(4)?) as usize;
    if len > CHUNK_PAGES * PAGE {
        return Err(bad("chunk length past a chunk"));
    }
    let n = usize::from(take(1)?[0]);
    if n == 0 || n > MAX_BASES {
        return Err(bad(&format!("{n} bases")));
    }
    let mut bases = Vec::with_capacity(n);
    for _ in 0..n {
        let d = std::str::from_utf8(take(DIGEST_HEX)?)
            .ok()
            .filter(|s| {
                s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
            .ok_or_else(|| bad("a base digest is not lowercase hex"))?;
        bases.push(d.to_string());
    }
    let table = take(pages_in(len) * 2)?;
    let mut pages = Vec::with_capacity(pages_in(len));
    for e in table.chunks_exact(2) {
        let from = PageFrom::decode(u16::from_le_bytes([e[0], e[1]]));
        if let PageFrom::Base { base, page } = from
            && (usize::from(base) >= n || usize::from(page) >= CHUNK_PAGES)
        {
            return Err(bad("a page from a base or a page that does not exist"));
        }
        pages.push(from);
    }
    if at != size {
        return Err(bad("trailing bytes in the delta header"));
    }
    Ok(Some(DeltaHeader { len, bases, pages }))
}

/// The object of chunk `new` as `h` says (`h.len` must be `new`'s length): the header, then the
/// literal pages, compressed at `level`.
pub(crate) fn encode(h: &DeltaHeader, new: &[u8], level: i32) -> Result<Vec<u8>> {
    let bad = |why: String| Error::InvalidInput(format!("delta chunk: {why}"));
    if h.len != new.len() || h.pages.len() != pages_in(new.len()) || new.len() > CHUNK_PAGES * PAGE
    {
        return Err(bad(format!(
            "{} pages for {} bytes",
            h.pages.len(),
            new.len()
        )));
    }
    if h.bases.is_empty()
        || h.bases.len() > MAX_BASES
        || h.bases.iter().any(|b| b.len() != DIGEST_HEX)
    {
        return Err(bad(format!("{} bases", h.bases.len())));
    }
    let mut payload = Vec::with_capacity(h.literals() * PAGE);
    for (p, from) in h.pages.iter().enumerate() {
        if *from == PageFrom::Literal {
            payload.extend_from_slice(&new[p * PAGE..((p + 1) * PAGE).min(new.len())]);
        }
    }
    let label = std::path::Path::new("delta chunk");
    let mut c = zstd::bulk::Compressor::new(level).map_err(|e| Error::io("zstd init", label, e))?;
    c.include_checksum(true)
        .map_err(|e| Error::io("zstd init", label, e))?;
    let frame = c
        .compress(&payload)
        .map_err(|e| Error::io("compress", label, e))?;
    let mut header = Vec::with_capacity(MAX_HEADER_BYTES);
    header.extend_from_slice(DELTA_MAGIC);
    header.push(DELTA_VERSION);
    header.extend_from_slice(&(new.len() as u32).to_le_bytes());
    header.push(h.bases.len() as u8);
    for b in &h.bases {
        header.extend_from_slice(b.as_bytes());
    }
    for from in &h.pages {
        header.extend_from_slice(&from.encode().to_le_bytes());
    }
    let mut out = Vec::with_capacity(8 + header.len() + frame.len());
    out.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&frame);
    Ok(out)
}

/// The chunk the delta object `obj` (with header `h`, parsed from it) stands for, from the
/// contents of its bases (`bases[i]` for `h.bases[i]`). `name` labels errors.
pub(crate) fn apply(h: &DeltaHeader, obj: &[u8], bases: &[Vec<u8>], name: &str) -> Result<Vec<u8>> {
    let bad = |why: String| Error::InvalidInput(format!("chunk object {name}: {why}"));
    if bases.len() != h.bases.len() {
        return Err(bad(format!(
            "{} bases given for {}",
            bases.len(),
            h.bases.len()
        )));
    }
    let size = obj.get(4..8).map_or(0, |b| le_u32(b) as usize);
    let frame = obj.get(8 + size..).unwrap_or_default();
    let expected: usize = h
        .pages
        .iter()
        .enumerate()
        .filter(|(_, f)| **f == PageFrom::Literal)
        .map(|(p, _)| (h.len - p * PAGE).min(PAGE))
        .sum();
    let literals = zstd::bulk::decompress(frame, expected).map_err(|e| Error::Decompress {
        key: name.to_string(),
        source: e,
    })?;
    if literals.len() != expected {
        return Err(bad(format!(
            "{} bytes of literal pages, the header names {expected}",
            literals.len()
        )));
    }
    let mut out = vec![0u8; h.len];
    let mut at = 0;
    for (p, from) in h.pages.iter().enumerate() {
        let start = p * PAGE;
        let n = (h.len - start).min(PAGE);
        let src = match *from {
            PageFrom::Literal => {
                at += n;
                &literals[at - n..at]
            }
            PageFrom::Base { base, page } => {
                let b = &bases[usize::from(base)];
                let from = usize::from(page) * PAGE;
                b.get(from..from + n).ok_or_else(|| {
                    bad(format!(
                        "page {page} of base {} is past its {} bytes",
                        h.bases[usize::from(base)],
                        b.len()
                    ))
                })?
            }
        };
        out[start..start + n].copy_from_slice(src);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i / PAGE) as u8)
            .collect()
    }

    fn digest(data: &[u8]) -> String {
        blake3::hash(data).to_hex().to_string()
    }

    #[test]
    fn a_delta_takes_pages_from_its_bases_and_holds_the_rest() {
        let a = chunk(1, CHUNK_PAGES * PAGE);
        let b = chunk(2, CHUNK_PAGES * PAGE);
        // The new chunk: a shifted by 3 pages into b (a layout shift), two pages changed.
        let mut new = Vec::new();
        new.extend_from_slice(&a[3 * PAGE..]);
        new.extend_from_slice(&b[..3 * PAGE]);
        new[10 * PAGE + 5] ^= 0xff;
        new[CHUNK_PAGES * PAGE - 1] ^= 0xff;
        let pages: Vec<PageFrom> = (0..CHUNK_PAGES)
            .map(|p| match p {
                10 => PageFrom::Literal,
                p if p == CHUNK_PAGES - 1 => PageFrom::Literal,
                p if p < CHUNK_PAGES - 3 => PageFrom::Base {
                    base: 0,
                    page: (p + 3) as u16,
                },
                p => PageFrom::Base {
                    base: 1,
                    page: (p + 3 - CHUNK_PAGES) as u16,
                },
            })
            .collect();
        let h = DeltaHeader {
            len: new.len(),
            bases: vec![digest(&a), digest(&b)],
            pages,
        };
        let obj = encode(&h, &new, 3).expect("encode");
        assert!(obj.len() < 4 * PAGE, "only two pages go in: {}", obj.len());
        assert_eq!(parse_header(&obj, "x").expect("parse"), Some(h.clone()));
        // The prefix a ranged read fetches holds the whole header.
        assert_eq!(
            parse_header(&obj[..PREFIX_BYTES.min(obj.len())], "x").expect("parse"),
            Some(h.clone())
        );
        assert_eq!(apply(&h, &obj, &[a, b], "x").expect("apply"), new);
    }

    #[test]
    fn a_short_last_chunk_round_trips() {
        let len = 3 * PAGE + 100;
        let base = chunk(3, len);
        let mut new = base.clone();
        new[3 * PAGE + 50] = 9;
        let h = DeltaHeader {
            len,
            bases: vec![digest(&base)],
            pages: vec![
                PageFrom::Base { base: 0, page: 0 },
                PageFrom::Base { base: 0, page: 1 },
                PageFrom::Base { base: 0, page: 2 },
                PageFrom::Literal,
            ],
        };
        let obj = encode(&h, &new, 3).expect("encode");
        let parsed = parse_header(&obj, "x").expect("parse").expect("a delta");
        assert_eq!(apply(&parsed, &obj, &[base], "x").expect("apply"), new);
    }

    #[test]
    fn a_full_chunk_has_no_header_and_damage_is_refused() {
        let full = zstd::bulk::compress(&chunk(4, PAGE), 3).expect("compress");
        assert_eq!(parse_header(&full, "x").expect("parse"), None);
        assert_eq!(parse_header(&[], "x").expect("parse"), None);
        let base = chunk(5, 2 * PAGE);
        let mut new = base.clone();
        new[0] ^= 1;
        let h = DeltaHeader {
            len: new.len(),
            bases: vec![digest(&base)],
            pages: vec![PageFrom::Literal, PageFrom::Base { base: 0, page: 1 }],
        };
        let obj = encode(&h, &new, 3).expect("encode");
        assert!(parse_header(&obj[..20], "x").is_err(), "cut in the header");
        // A base too short for the page it gives.
        assert!(apply(&h, &obj, &[vec![0; PAGE]], "x").is_err());
        // A damaged literal frame fails in the decoder (frame checksum).
        let mut bad = obj.clone();
        let last = bad.len() - 6;
        bad[last] ^= 0xff;
        assert!(apply(&h, &bad, std::slice::from_ref(&base), "x").is_err());
        // A table naming a base that is not listed.
        let wrong = DeltaHeader {
            pages: vec![PageFrom::Literal, PageFrom::Base { base: 1, page: 1 }],
            ..h.clone()
        };
        let obj = encode(&wrong, &new, 3).expect("encode");
        assert!(parse_header(&obj, "x").is_err());
    }
}
