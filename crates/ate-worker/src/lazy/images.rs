//! Reading the memory images of a CRIU 4.2 dump directory for lazy restore.
//!
//! CRIU protobuf images (`pagemap-<pid>.img`, `mm-<pid>.img`) start with two native-endian
//! `u32`s, `IMG_COMMON_MAGIC` and the image's own magic (`img_check_magic` in
//! `criu/image.c`), followed by entries, each a native-endian `u32` length and that many bytes
//! of protobuf (`do_pb_read_one` in `criu/protobuf.c`).
//!
//! A pagemap starts with `pagemap_head` (the id of its `pages-<id>.img`), then one
//! `pagemap_entry` per run of pages. The pages of every `PE_PRESENT` entry are stored
//! back-to-back, in pagemap order, in the raw (header-less) pages file, so an entry's offset
//! there is the total size of the `PE_PRESENT` entries before it.
//!
//! Lazy entries are split at VMA boundaries (as `collect_iovs` in `criu/uffd.c` does), because a
//! single `UFFDIO_COPY` may only fill pages of one VMA.
//!
//! The pages files themselves are neither opened nor checked here: they may still be on their
//! way from remote storage when these functions run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use prost::Message;

/// Size of a page in CRIU images (and on the architectures we restore on).
pub const PAGE_SIZE: u64 = 4096;

/// `IMG_COMMON_MAGIC` (criu/include/magic.h): first word of every non-inventory image.
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `PAGEMAP_MAGIC` (criu/include/magic.h).
const PAGEMAP_MAGIC: u32 = 0x5608_4025;
/// `MM_MAGIC` (criu/include/magic.h).
const MM_MAGIC: u32 = 0x5749_2820;

/// Pages are in the parent snapshot (incremental dumps).
const PE_PARENT: u32 = 1 << 0;
/// Pages can be restored lazily.
const PE_LAZY: u32 = 1 << 1;
/// Pages are stored in `pages-<id>.img`.
const PE_PRESENT: u32 = 1 << 2;
const PE_KNOWN: u32 = PE_PARENT | PE_LAZY | PE_PRESENT;

/// Larger protobuf entries are refused as corrupt (CRIU's own are a few dozen bytes, an
/// `mm_entry` a few hundred per VMA).
const MAX_ENTRY_BYTES: u32 = 64 << 20;

/// Errors reading CRIU images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a well-formed CRIU image of the expected kind.
    #[error("{}: malformed CRIU image: {message}", path.display())]
    Format { path: PathBuf, message: String },
    /// The image is valid but uses a feature lazy restore does not handle (e.g. incremental
    /// dumps).
    #[error("{}: unsupported CRIU image: {message}", path.display())]
    Unsupported { path: PathBuf, message: String },
}

/// Pages of one address range and where they are in the pages file.
///
/// `[start, end)` are page-aligned virtual addresses (as at dump time); `img_offset` is the
/// byte offset in `pages-<id>.img` of the page at `start`, the following pages following it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageRange {
    pub start: u64,
    pub end: u64,
    pub img_offset: u64,
}

impl ImageRange {
    /// Number of pages in the range.
    pub fn pages(&self) -> u64 {
        self.end.saturating_sub(self.start) / PAGE_SIZE
    }

    /// Byte offset in the pages file just past the range's last page.
    pub fn img_end(&self) -> u64 {
        self.img_offset
            .saturating_add(self.end.saturating_sub(self.start))
    }
}

/// The dumped pages of one task (process), from its `pagemap-<pid>.img`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPages {
    /// Id of the pages file: see [`pages_file_name`].
    pub pages_id: u32,
    /// `PE_LAZY | PE_PRESENT` entries, split at VMA boundaries, sorted by address: the pages we
    /// serve through userfaultfd.
    pub lazy: Vec<ImageRange>,
    /// `PE_PRESENT` entries without `PE_LAZY`, not split, sorted by address: the restorer reads
    /// those itself before the task runs.
    pub eager: Vec<ImageRange>,
}

/// `pagemap_head` (images/pagemap.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct PagemapHead {
    #[prost(uint32, required, tag = "1")]
    pages_id: u32,
}

/// `pagemap_entry` (images/pagemap.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct PagemapEntry {
    #[prost(uint64, required, tag = "1")]
    vaddr: u64,
    #[prost(uint32, required, tag = "2")]
    compat_nr_pages: u32,
    #[prost(bool, optional, tag = "3")]
    in_parent: Option<bool>,
    #[prost(uint32, optional, tag = "4")]
    flags: Option<u32>,
    #[prost(uint64, optional, tag = "5")]
    nr_pages: Option<u64>,
}

/// The part of `vma_entry` (images/vma.proto) we use.
#[derive(Clone, PartialEq, prost::Message)]
struct VmaEntry {
    #[prost(uint64, required, tag = "1")]
    start: u64,
    #[prost(uint64, required, tag = "2")]
    end: u64,
    #[prost(uint32, required, tag = "7")]
    status: u32,
}

/// The part of `mm_entry` (images/mm.proto) we use; prost skips the other fields.
#[derive(Clone, PartialEq, prost::Message)]
struct MmEntry {
    #[prost(message, repeated, tag = "14")]
    vmas: Vec<VmaEntry>,
}

/// File name of the pages image with this id: `pages-<id>.img`.
pub fn pages_file_name(pages_id: u32) -> String {
    format!("pages-{pages_id}.img")
}

/// Reads the pagemap and (if it has lazy pages) the mm image of task `pid` in `criu_dir`.
///
/// Fails with [`ImageError::Unsupported`] when an entry has `PE_PARENT` (incremental dump),
/// `PE_LAZY` without `PE_PRESENT` (pages left on a page server) or unknown flags, and with
/// [`ImageError::Format`] when the images are malformed: bad magic, truncated or oversized
/// entries, undecodable protobuf, unaligned or overflowing ranges, overlapping entries or VMAs,
/// or lazy pages outside every VMA.
pub fn read_task_pages(criu_dir: &Path, pid: i32) -> Result<TaskPages, ImageError> {
    let pagemap = read_pagemap(criu_dir, pid)?;
    let lazy = if pagemap.lazy.is_empty() {
        Vec::new()
    } else {
        let mm_path = criu_dir.join(format!("mm-{pid}.img"));
        let vmas = read_vmas(&mm_path)?;
        let mut lazy = Vec::with_capacity(pagemap.lazy.len());
        for range in &pagemap.lazy {
            split_at_vmas(&pagemap.path, range, &vmas, &mut lazy)?;
        }
        lazy
    };
    Ok(TaskPages {
        pages_id: pagemap.pages_id,
        lazy,
        eager: pagemap.eager,
    })
}

/// Pids of the tasks with a `pagemap-<pid>.img` in `criu_dir`, sorted.
///
/// Other files (`pagemap-shmem-<id>.img` included) are ignored.
pub fn image_pids(criu_dir: &Path) -> Result<Vec<i32>, ImageError> {
    let io = |source| ImageError::Io {
        path: criu_dir.to_path_buf(),
        source,
    };
    let mut pids = Vec::new();
    for dirent in std::fs::read_dir(criu_dir).map_err(io)? {
        let dirent = dirent.map_err(io)?;
        let name = dirent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(num) = name
            .strip_prefix("pagemap-")
            .and_then(|rest| rest.strip_suffix(".img"))
        else {
            continue;
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        match num.parse::<i32>() {
            Ok(pid) if pid > 0 => pids.push(pid),
            _ => continue,
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// [`eager_chunks`] of [`ate_snapshot::CHUNK_BYTES`] as `(path relative to the generation
/// directory, chunk index)`: the chunks a lazy restore needs locally before CRIU starts.
pub fn eager_chunk_files(criu_dir: &Path) -> Result<Vec<(String, u64)>, ImageError> {
    Ok(eager_chunks(criu_dir, ate_snapshot::CHUNK_BYTES)?
        .into_iter()
        .map(|(pages_id, chunk)| {
            (
                format!("{}/{}", ate_snapshot::CRIU_DIR, pages_file_name(pages_id)),
                chunk,
            )
        })
        .collect())
}

/// Where the pages of each memory image of the generation in `gen_dir` sit in the address
/// space they were dumped from (every `PE_PRESENT` run of every task's pagemap): what an upload
/// matches a new generation's pages with its parent's by (`DurableStore::upload_with_parents`).
pub fn memory_layout(gen_dir: &Path) -> Result<ate_snapshot::MemoryLayout, ImageError> {
    let criu_dir = gen_dir.join(ate_snapshot::CRIU_DIR);
    let mut layout = ate_snapshot::MemoryLayout::default();
    for pid in image_pids(&criu_dir)? {
        let pagemap = read_pagemap(&criu_dir, pid)?;
        let runs = pagemap
            .lazy
            .iter()
            .chain(&pagemap.eager)
            .map(|r| ate_snapshot::PageRun {
                vaddr: r.start,
                img_offset: r.img_offset,
                pages: r.pages(),
            });
        layout.add(
            format!(
                "{}/{}",
                ate_snapshot::CRIU_DIR,
                pages_file_name(pagemap.pages_id)
            ),
            runs,
        );
    }
    Ok(layout)
}

/// Chunks of each pages file that hold any eager page, over all tasks of `criu_dir`, as
/// `(pages_id, chunk index)` where chunk index = image byte offset / `chunk_bytes`.
///
/// Only the pagemaps are read (not the mm images). `chunk_bytes` must be positive.
pub fn eager_chunks(criu_dir: &Path, chunk_bytes: u64) -> Result<BTreeSet<(u32, u64)>, ImageError> {
    if chunk_bytes == 0 {
        return Err(ImageError::Unsupported {
            path: criu_dir.to_path_buf(),
            message: "chunk size must be positive".into(),
        });
    }
    let mut chunks = BTreeSet::new();
    for pid in image_pids(criu_dir)? {
        let pagemap = read_pagemap(criu_dir, pid)?;
        for range in &pagemap.eager {
            if range.img_end() <= range.img_offset {
                continue;
            }
            let first = range.img_offset / chunk_bytes;
            let last = (range.img_end() - 1) / chunk_bytes;
            chunks.extend((first..=last).map(|chunk| (pagemap.pages_id, chunk)));
        }
    }
    Ok(chunks)
}

/// A decoded, validated pagemap: lazy entries not yet split at VMAs.
struct Pagemap {
    path: PathBuf,
    pages_id: u32,
    lazy: Vec<ImageRange>,
    eager: Vec<ImageRange>,
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

fn read_pagemap(criu_dir: &Path, pid: i32) -> Result<Pagemap, ImageError> {
    let path = criu_dir.join(format!("pagemap-{pid}.img"));
    let data = read_file(&path)?;
    let mut entries = Entries::new(&path, &data, PAGEMAP_MAGIC)?;

    let head = entries
        .next_entry()?
        .ok_or_else(|| format_err(&path, "no pagemap_head"))?;
    let head =
        PagemapHead::decode(head).map_err(|e| format_err(&path, format!("pagemap_head: {e}")))?;

    let mut lazy = Vec::new();
    let mut eager = Vec::new();
    let mut img_offset = 0u64;
    let mut index = 0usize;
    while let Some(bytes) = entries.next_entry()? {
        index += 1;
        let pe = PagemapEntry::decode(bytes)
            .map_err(|e| format_err(&path, format!("pagemap entry {index}: {e}")))?;
        // init_compat_pagemap_entry (criu/pagemap.c).
        let mut flags = pe.flags.unwrap_or(0);
        if pe.in_parent == Some(true) {
            flags |= PE_PARENT;
        } else if pe.flags.is_none() {
            flags = PE_PRESENT;
        }
        let nr_pages = pe.nr_pages.unwrap_or(u64::from(pe.compat_nr_pages));
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
        pages_id: head.pages_id,
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
fn read_vmas(path: &Path) -> Result<Vec<(u64, u64)>, ImageError> {
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
fn split_at_vmas(
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

/// Writers of the two images the page source reads, for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// One entry as CRIU frames it: a native-endian u32 length, then the protobuf.
    pub(crate) fn framed(msg: &impl Message) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut out = (body.len() as u32).to_ne_bytes().to_vec();
        out.extend(body);
        out
    }

    /// An image file: the common magic, the image's magic, the framed entries.
    pub(crate) fn image(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = IMG_COMMON_MAGIC.to_ne_bytes().to_vec();
        out.extend(magic.to_ne_bytes());
        for e in entries {
            out.extend(e);
        }
        out
    }

    /// `pagemap-<pid>.img` with one lazy, present entry of `pages` pages at `vaddr`, and
    /// `mm-<pid>.img` with one VMA covering exactly that range.
    pub(crate) fn write_one_lazy_range(
        criu_dir: &Path,
        pid: i32,
        pages_id: u32,
        vaddr: u64,
        pages: u64,
    ) {
        let entries = vec![
            framed(&PagemapHead { pages_id }),
            framed(&PagemapEntry {
                vaddr,
                compat_nr_pages: 0,
                in_parent: None,
                flags: Some(PE_LAZY | PE_PRESENT),
                nr_pages: Some(pages),
            }),
        ];
        std::fs::write(
            criu_dir.join(format!("pagemap-{pid}.img")),
            image(PAGEMAP_MAGIC, &entries),
        )
        .unwrap();
        let mm = MmEntry {
            vmas: vec![VmaEntry {
                start: vaddr,
                end: vaddr + pages * PAGE_SIZE,
                status: 0,
            }],
        };
        std::fs::write(
            criu_dir.join(format!("mm-{pid}.img")),
            image(MM_MAGIC, &[framed(&mm)]),
        )
        .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{framed as frame, image};
    use super::*;

    const P: u64 = PAGE_SIZE;

    fn pe(vaddr: u64, nr_pages: u64, flags: u32) -> PagemapEntry {
        PagemapEntry {
            vaddr,
            compat_nr_pages: 0,
            in_parent: None,
            flags: Some(flags),
            nr_pages: Some(nr_pages),
        }
    }

    fn write_pagemap(dir: &Path, pid: i32, pages_id: u32, entries: &[PagemapEntry]) {
        let mut framed = vec![frame(&PagemapHead { pages_id })];
        framed.extend(entries.iter().map(frame));
        std::fs::write(
            dir.join(format!("pagemap-{pid}.img")),
            image(PAGEMAP_MAGIC, &framed),
        )
        .unwrap();
    }

    fn write_mm(dir: &Path, pid: i32, vmas: &[(u64, u64)]) {
        let mm = MmEntry {
            vmas: vmas
                .iter()
                .map(|&(start, end)| VmaEntry {
                    start,
                    end,
                    status: 1 | (1 << 9),
                })
                .collect(),
        };
        std::fs::write(
            dir.join(format!("mm-{pid}.img")),
            image(MM_MAGIC, &[frame(&mm)]),
        )
        .unwrap();
    }

    fn r(start: u64, end: u64, img_offset: u64) -> ImageRange {
        ImageRange {
            start,
            end,
            img_offset,
        }
    }

    const LP: u32 = PE_LAZY | PE_PRESENT;

    #[test]
    fn offsets_and_eager_lazy_separation() {
        let dir = tempfile::tempdir().unwrap();
        write_pagemap(
            dir.path(),
            42,
            7,
            &[
                pe(0x10000, 2, PE_PRESENT),
                pe(0x20000, 3, LP),
                pe(0x40000, 1, PE_PRESENT),
                pe(0x50000, 4, LP),
            ],
        );
        write_mm(dir.path(), 42, &[(0x10000, 0x12000), (0x20000, 0x60000)]);
        let tp = read_task_pages(dir.path(), 42).unwrap();
        assert_eq!(tp.pages_id, 7);
        assert_eq!(
            tp.eager,
            vec![r(0x10000, 0x12000, 0), r(0x40000, 0x41000, 5 * P)]
        );
        assert_eq!(
            tp.lazy,
            vec![r(0x20000, 0x23000, 2 * P), r(0x50000, 0x54000, 6 * P)]
        );
        assert_eq!(tp.lazy[1].pages(), 4);
        assert_eq!(tp.lazy[1].img_end(), 10 * P);
        assert_eq!(pages_file_name(tp.pages_id), "pages-7.img");
    }

    #[test]
    fn lazy_split_at_vma_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        write_pagemap(
            dir.path(),
            1,
            1,
            &[pe(0x10000, 1, PE_PRESENT), pe(0x11000, 15, LP)],
        );
        // Unsorted on purpose; adjacent VMAs.
        write_mm(
            dir.path(),
            1,
            &[(0x15000, 0x30000), (0x10000, 0x12000), (0x12000, 0x15000)],
        );
        let tp = read_task_pages(dir.path(), 1).unwrap();
        assert_eq!(
            tp.lazy,
            vec![
                r(0x11000, 0x12000, P),
                r(0x12000, 0x15000, 2 * P),
                r(0x15000, 0x20000, 5 * P),
            ]
        );
        assert_eq!(tp.eager, vec![r(0x10000, 0x11000, 0)]);
    }

    #[test]
    fn lazy_outside_vmas_is_format_error() {
        let dir = tempfile::tempdir().unwrap();
        write_pagemap(dir.path(), 1, 1, &[pe(0x10000, 4, LP)]);
        // Hole at 0x12000.
        write_mm(dir.path(), 1, &[(0x10000, 0x12000), (0x13000, 0x20000)]);
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(matches!(err, ImageError::Format { .. }), "{err}");
        assert!(err.to_string().contains("0x12000"), "{err}");

        write_mm(dir.path(), 1, &[(0x20000, 0x30000)]);
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(matches!(err, ImageError::Format { .. }), "{err}");

        // Overlapping VMAs.
        write_mm(dir.path(), 1, &[(0x10000, 0x20000), (0x18000, 0x30000)]);
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(matches!(err, ImageError::Format { .. }), "{err}");
    }

    #[test]
    fn mm_not_needed_without_lazy_pages() {
        let dir = tempfile::tempdir().unwrap();
        write_pagemap(dir.path(), 3, 2, &[pe(0x10000, 1, PE_PRESENT)]);
        let tp = read_task_pages(dir.path(), 3).unwrap();
        assert!(tp.lazy.is_empty());
        assert_eq!(tp.eager, vec![r(0x10000, 0x11000, 0)]);

        write_pagemap(dir.path(), 3, 2, &[pe(0x10000, 1, LP)]);
        let err = read_task_pages(dir.path(), 3).unwrap_err();
        assert!(matches!(err, ImageError::Io { .. }), "{err}");
    }

    #[test]
    fn compat_fields() {
        let dir = tempfile::tempdir().unwrap();
        let old = |vaddr, compat_nr_pages| PagemapEntry {
            vaddr,
            compat_nr_pages,
            in_parent: None,
            flags: None,
            nr_pages: None,
        };
        let mut both = pe(0x30000, 2, LP);
        both.compat_nr_pages = 9; // nr_pages wins
        let mut not_in_parent = old(0x40000, 1);
        not_in_parent.in_parent = Some(false);
        write_pagemap(dir.path(), 5, 3, &[old(0x10000, 3), both, not_in_parent]);
        write_mm(dir.path(), 5, &[(0x10000, 0x50000)]);
        let tp = read_task_pages(dir.path(), 5).unwrap();
        assert_eq!(
            tp.eager,
            vec![r(0x10000, 0x13000, 0), r(0x40000, 0x41000, 5 * P)]
        );
        assert_eq!(tp.lazy, vec![r(0x30000, 0x32000, 3 * P)]);
    }

    #[test]
    fn parent_and_non_present_are_unsupported() {
        let dir = tempfile::tempdir().unwrap();
        write_mm(dir.path(), 1, &[(0, 0x100000)]);
        let mut in_parent = pe(0x10000, 1, PE_PRESENT);
        in_parent.in_parent = Some(true);
        in_parent.flags = None;
        for bad in [
            pe(0x10000, 1, PE_PARENT),
            pe(0x10000, 1, PE_PARENT | PE_LAZY),
            in_parent,
            pe(0x10000, 1, PE_LAZY),
            pe(0x10000, 1, 0),
            pe(0x10000, 1, PE_PRESENT | 0x100),
        ] {
            write_pagemap(dir.path(), 1, 1, &[pe(0x1000, 1, PE_PRESENT), bad.clone()]);
            let err = read_task_pages(dir.path(), 1).unwrap_err();
            assert!(
                matches!(err, ImageError::Unsupported { .. }),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn bad_ranges_are_format_errors() {
        let dir = tempfile::tempdir().unwrap();
        write_mm(dir.path(), 1, &[(0, 0x100000)]);
        for entries in [
            vec![pe(0x10001, 1, PE_PRESENT)],
            vec![pe(u64::MAX - 0xfff, 1, PE_PRESENT)],
            vec![pe(0x10000, u64::MAX, LP)],
            vec![pe(0x10000, u64::MAX / P, PE_PRESENT)],
            vec![pe(0, 1 << 51, PE_PRESENT), pe(0, 1 << 51, PE_PRESENT)],
            vec![pe(0x10000, 4, PE_PRESENT), pe(0x12000, 1, LP)],
            vec![pe(0x12000, 1, LP), pe(0x10000, 4, LP)],
        ] {
            write_pagemap(dir.path(), 1, 1, &entries);
            let err = read_task_pages(dir.path(), 1).unwrap_err();
            assert!(
                matches!(err, ImageError::Format { .. }),
                "{entries:?}: {err}"
            );
        }
    }

    #[test]
    fn unsorted_pagemap_is_sorted_with_pagemap_order_offsets() {
        let dir = tempfile::tempdir().unwrap();
        write_pagemap(
            dir.path(),
            1,
            1,
            &[
                pe(0x30000, 1, LP),
                pe(0x20000, 2, PE_PRESENT),
                pe(0x10000, 1, LP),
                pe(0x00000, 0, LP),
            ],
        );
        write_mm(dir.path(), 1, &[(0x10000, 0x40000)]);
        let tp = read_task_pages(dir.path(), 1).unwrap();
        assert_eq!(
            tp.lazy,
            vec![r(0x10000, 0x11000, 3 * P), r(0x30000, 0x31000, 0)]
        );
        assert_eq!(tp.eager, vec![r(0x20000, 0x22000, P)]);
    }

    fn expect_format(bytes: &[u8], what: &str) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pagemap-1.img"), bytes).unwrap();
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(matches!(err, ImageError::Format { .. }), "{what}: {err}");
    }

    #[test]
    fn framing_errors() {
        let head = frame(&PagemapHead { pages_id: 1 });
        let entry = frame(&pe(0x10000, 1, PE_PRESENT));
        let good = image(PAGEMAP_MAGIC, &[head.clone(), entry]);
        let head_only = image(PAGEMAP_MAGIC, std::slice::from_ref(&head));
        {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("pagemap-1.img"), &good).unwrap();
            assert!(read_task_pages(dir.path(), 1).is_ok());
        }

        expect_format(&[], "empty file");
        expect_format(&good[..6], "short magic");
        expect_format(
            &image(MM_MAGIC, std::slice::from_ref(&head)),
            "mm magic in pagemap",
        );
        let mut bad_common = good.clone();
        bad_common[0] ^= 1;
        expect_format(&bad_common, "bad common magic");
        expect_format(&image(PAGEMAP_MAGIC, &[]), "no head");
        expect_format(&good[..good.len() - 1], "truncated body");
        let mut short_len = head_only.clone();
        short_len.extend([3, 0]);
        expect_format(&short_len, "truncated length");
        let mut huge = head_only.clone();
        huge.extend((MAX_ENTRY_BYTES + 1).to_ne_bytes());
        huge.extend([0; 16]);
        expect_format(&huge, "oversized entry");
        let mut max = head_only.clone();
        max.extend(u32::MAX.to_ne_bytes());
        expect_format(&max, "u32::MAX entry");
        let mut garbage = head_only.clone();
        garbage.extend([3, 0, 0, 0, 0xff, 0xff, 0xff]);
        expect_format(&garbage, "undecodable protobuf");
    }

    #[test]
    fn mm_framing_errors() {
        let dir = tempfile::tempdir().unwrap();
        write_pagemap(dir.path(), 1, 1, &[pe(0x10000, 1, LP)]);
        let mm_path = dir.path().join("mm-1.img");
        std::fs::write(&mm_path, image(PAGEMAP_MAGIC, &[])).unwrap();
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(matches!(err, ImageError::Format { .. }), "{err}");
        std::fs::write(&mm_path, image(MM_MAGIC, &[])).unwrap();
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(matches!(err, ImageError::Format { .. }), "{err}");
    }

    #[test]
    fn missing_pagemap_is_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_task_pages(dir.path(), 9).unwrap_err();
        assert!(matches!(err, ImageError::Io { .. }), "{err}");
        let err = image_pids(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(err, ImageError::Io { .. }), "{err}");
    }

    #[test]
    fn pids_from_file_names() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "pagemap-12.img",
            "pagemap-3.img",
            "pagemap-shmem-5.img",
            "pagemap-+6.img",
            "pagemap-0.img",
            "pagemap-99999999999.img",
            "pagemap-.img",
            "pagemap-7.img.bak",
            "mm-4.img",
            "pages-1.img",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(image_pids(dir.path()).unwrap(), vec![3, 12]);
    }

    #[test]
    fn eager_chunks_over_tasks() {
        let dir = tempfile::tempdir().unwrap();
        // pid 1, pages 1: eager at img [0, 2P), lazy [2P, 6P), eager [6P, 7P).
        write_pagemap(
            dir.path(),
            1,
            1,
            &[
                pe(0x10000, 2, PE_PRESENT),
                pe(0x20000, 4, LP),
                pe(0x30000, 1, PE_PRESENT),
            ],
        );
        // pid 2, pages 2: lazy [0, 8P), eager [8P, 17P).
        write_pagemap(
            dir.path(),
            2,
            2,
            &[pe(0x10000, 8, LP), pe(0x20000, 9, PE_PRESENT)],
        );
        let chunks = eager_chunks(dir.path(), 4 * P).unwrap();
        let expect: BTreeSet<(u32, u64)> = [(1, 0), (1, 1), (2, 2), (2, 3), (2, 4)].into();
        assert_eq!(chunks, expect);
        assert!(matches!(
            eager_chunks(dir.path(), 0),
            Err(ImageError::Unsupported { .. })
        ));
    }
}
