//! Decoding and validating the pagemap and mm images: CRIU's framing, range checks, VMA splits.

use std::path::{Path, PathBuf};

use prost::Message;

use super::{
    IMG_COMMON_MAGIC, ImageError, ImageRange, MAX_ENTRY_BYTES, MM_MAGIC, MmEntry, PAGE_SIZE,
    PAGEMAP_MAGIC, PE_KNOWN, PE_LAZY, PE_PARENT, PE_PRESENT, PagemapEntry, PagemapHead,
};

/// A decoded, validated pagemap: lazy entries not yet split at VMAs.
pub(super) struct Pagemap {
    pub(super) path: PathBuf,
    pub(super) pages_id: u32,
    pub(super) lazy: Vec<ImageRange>,
    pub(super) eager: Vec<ImageRange>,
}

fn format_err(path: &Path, message: impl Into<String>) -> ImageError {
    ImageError::Format {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn unsupported(path: &Path, message: impl Into<String>) -> ImageError {
    ImageError::Unsupported {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// One pagemap entry as CRIU wrote it, its flags made explicit as CRIU's
/// `init_compat_pagemap_entry` does (criu/pagemap.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RawEntry {
    pub(super) vaddr: u64,
    pub(super) pages: u64,
    pub(super) flags: u32,
}

impl RawEntry {
    /// The address just past the entry's pages (unchecked: see the callers' overflow checks).
    pub(super) fn end(&self) -> u64 {
        self.vaddr + self.pages * PAGE_SIZE
    }
}

/// A pagemap image's pages id and its entries in file order, decoded (checked no further than
/// the framing and the protobuf).
pub(super) fn read_raw_pagemap(path: &Path) -> Result<(u32, Vec<RawEntry>), ImageError> {
    let data = read_file(path)?;
    let mut entries = Entries::new(path, &data, PAGEMAP_MAGIC)?;
    let head = entries
        .next_entry()?
        .ok_or_else(|| format_err(path, "no pagemap_head"))?;
    let head =
        PagemapHead::decode(head).map_err(|e| format_err(path, format!("pagemap_head: {e}")))?;
    let mut raw = Vec::new();
    while let Some(bytes) = entries.next_entry()? {
        let pe = PagemapEntry::decode(bytes)
            .map_err(|e| format_err(path, format!("pagemap entry {}: {e}", raw.len() + 1)))?;
        let mut flags = pe.flags.unwrap_or(0);
        if pe.in_parent == Some(true) {
            flags |= PE_PARENT;
        } else if pe.flags.is_none() {
            flags = PE_PRESENT;
        }
        raw.push(RawEntry {
            vaddr: pe.vaddr,
            pages: pe.nr_pages.unwrap_or(u64::from(pe.compat_nr_pages)),
            flags,
        });
    }
    Ok((head.pages_id, raw))
}

pub(super) fn read_pagemap(criu_dir: &Path, pid: i32) -> Result<Pagemap, ImageError> {
    let path = criu_dir.join(format!("pagemap-{pid}.img"));
    let (pages_id, raw) = read_raw_pagemap(&path)?;

    let mut lazy = Vec::new();
    let mut eager = Vec::new();
    let mut img_offset = 0u64;
    for (i, pe) in raw.into_iter().enumerate() {
        let index = i + 1;
        let (flags, nr_pages) = (pe.flags, pe.pages);
        let what = || format!("pagemap entry {index} at {:#x}", pe.vaddr);

        if flags & PE_PARENT != 0 {
            return Err(unsupported(
                &path,
                format!(
                    "{}: pages in the parent snapshot (incremental dump)",
                    what()
                ),
            ));
        }
        if flags & !PE_KNOWN != 0 {
            return Err(unsupported(
                &path,
                format!("{}: unknown flags {flags:#x}", what()),
            ));
        }
        if flags & PE_PRESENT == 0 {
            return Err(unsupported(
                &path,
                format!("{}: pages not in the image (flags {flags:#x})", what()),
            ));
        }
        if pe.vaddr % PAGE_SIZE != 0 {
            return Err(format_err(&path, format!("{}: unaligned address", what())));
        }
        let len = nr_pages
            .checked_mul(PAGE_SIZE)
            .ok_or_else(|| format_err(&path, format!("{}: {nr_pages} pages", what())))?;
        let end = pe.vaddr.checked_add(len).ok_or_else(|| {
            format_err(
                &path,
                format!("{}: {nr_pages} pages overflow the address space", what()),
            )
        })?;
        let img_end = img_offset
            .checked_add(len)
            .ok_or_else(|| format_err(&path, format!("{}: pages file offset overflows", what())))?;
        if len > 0 {
            let range = ImageRange {
                start: pe.vaddr,
                end,
                img_offset,
            };
            if flags & PE_LAZY != 0 {
                lazy.push(range);
            } else {
                eager.push(range);
            }
        }
        img_offset = img_end;
    }

    lazy.sort_unstable_by_key(|r| r.start);
    eager.sort_unstable_by_key(|r| r.start);
    check_disjoint(&path, &lazy, &eager)?;
    Ok(Pagemap {
        path,
        pages_id,
        lazy,
        eager,
    })
}

/// Fails if any two ranges of `a` and `b` (each sorted by start) overlap.
fn check_disjoint(path: &Path, a: &[ImageRange], b: &[ImageRange]) -> Result<(), ImageError> {
    let mut all: Vec<&ImageRange> = a.iter().chain(b).collect();
    all.sort_unstable_by_key(|r| r.start);
    for pair in all.windows(2) {
        if pair[1].start < pair[0].end {
            return Err(format_err(
                path,
                format!(
                    "pagemap entries {:#x}-{:#x} and {:#x}-{:#x} overlap",
                    pair[0].start, pair[0].end, pair[1].start, pair[1].end
                ),
            ));
        }
    }
    Ok(())
}

/// The VMAs of an mm image as `(start, end)`, sorted and checked not to overlap.
pub(super) fn read_vmas(path: &Path) -> Result<Vec<(u64, u64)>, ImageError> {
    let data = read_file(path)?;
    let mut entries = Entries::new(path, &data, MM_MAGIC)?;
    let bytes = entries
        .next_entry()?
        .ok_or_else(|| format_err(path, "no mm_entry"))?;
    let mm = MmEntry::decode(bytes).map_err(|e| format_err(path, format!("mm_entry: {e}")))?;
    let mut vmas = Vec::with_capacity(mm.vmas.len());
    for vma in &mm.vmas {
        if vma.start >= vma.end || vma.start % PAGE_SIZE != 0 || vma.end % PAGE_SIZE != 0 {
            return Err(format_err(
                path,
                format!("bad VMA {:#x}-{:#x}", vma.start, vma.end),
            ));
        }
        vmas.push((vma.start, vma.end));
    }
    vmas.sort_unstable();
    for pair in vmas.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(format_err(
                path,
                format!(
                    "VMAs {:#x}-{:#x} and {:#x}-{:#x} overlap",
                    pair[0].0, pair[0].1, pair[1].0, pair[1].1
                ),
            ));
        }
    }
    Ok(vmas)
}

/// Appends `range` to `out` cut at the boundaries of `vmas` (sorted, disjoint); every page of
/// `range` must be inside a VMA.
pub(super) fn split_at_vmas(
    path: &Path,
    range: &ImageRange,
    vmas: &[(u64, u64)],
    out: &mut Vec<ImageRange>,
) -> Result<(), ImageError> {
    let mut cur = range.start;
    while cur < range.end {
        let i = vmas.partition_point(|&(_, end)| end <= cur);
        let Some(&(vma_start, vma_end)) = vmas.get(i).filter(|&&(start, _)| start <= cur) else {
            return Err(format_err(
                path,
                format!(
                    "lazy pages {:#x}-{:#x}: page {cur:#x} is in no VMA",
                    range.start, range.end
                ),
            ));
        };
        debug_assert!(vma_start <= cur && cur < vma_end);
        let end = range.end.min(vma_end);
        out.push(ImageRange {
            start: cur,
            end,
            img_offset: range.img_offset + (cur - range.start),
        });
        cur = end;
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<Vec<u8>, ImageError> {
    std::fs::read(path).map_err(|source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The framed protobuf entries of an image held in memory.
struct Entries<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
}

impl<'a> Entries<'a> {
    /// Checks both magics and positions after them.
    fn new(path: &'a Path, data: &'a [u8], magic: u32) -> Result<Self, ImageError> {
        let mut entries = Entries { path, data, pos: 0 };
        let common = entries
            .read_u32()
            .ok_or_else(|| format_err(path, "too short for the image magic"))?;
        if common != IMG_COMMON_MAGIC {
            return Err(format_err(
                path,
                format!("head magic {common:#010x}, expected {IMG_COMMON_MAGIC:#010x}"),
            ));
        }
        let own = entries
            .read_u32()
            .ok_or_else(|| format_err(path, "too short for the image magic"))?;
        if own != magic {
            return Err(format_err(
                path,
                format!("magic {own:#010x}, expected {magic:#010x}"),
            ));
        }
        Ok(entries)
    }

    fn read_u32(&mut self) -> Option<u32> {
        let bytes = self.data.get(self.pos..self.pos.checked_add(4)?)?;
        self.pos += 4;
        Some(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// The next entry's protobuf bytes, `None` at a clean end of file.
    fn next_entry(&mut self) -> Result<Option<&'a [u8]>, ImageError> {
        let at = self.pos;
        if at == self.data.len() {
            return Ok(None);
        }
        let size = self
            .read_u32()
            .ok_or_else(|| format_err(self.path, format!("truncated entry length at byte {at}")))?;
        if size > MAX_ENTRY_BYTES {
            return Err(format_err(
                self.path,
                format!("entry at byte {at} claims {size} bytes"),
            ));
        }
        let body = usize::try_from(size)
            .ok()
            .and_then(|size| self.pos.checked_add(size))
            .and_then(|end| self.data.get(self.pos..end))
            .ok_or_else(|| {
                format_err(
                    self.path,
                    format!(
                        "truncated entry at byte {at}: {size} bytes, {} left",
                        self.data.len() - self.pos
                    ),
                )
            })?;
        self.pos += body.len();
        Ok(Some(body))
    }
}
