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

pub mod flatten;
mod parse;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use parse::{read_pagemap, read_vmas, split_at_vmas};

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

/// Writers of the two images the page source reads, for tests here and in the page source's
/// crate (feature `fixtures`).
#[cfg(any(test, feature = "fixtures"))]
#[allow(clippy::unwrap_used)]
pub mod fixtures;

#[cfg(test)]
mod tests;
