//! Where the pages of a generation's memory images sit in the address space they were dumped
//! from. Uploads match a new generation's pages with its parent's by address (see
//! `chunk_delta`): a page added or dropped early in the address space moves every later page
//! of the image, so the same offset in two images rarely holds the same page after a change.
//!
//! This crate does not read CRIU's pagemaps itself; the worker crate does (it serves lazy
//! restores from them) and the node hands the result in.

use std::collections::BTreeMap;

use crate::chunk_delta::PAGE;

/// A run of pages: `pages` pages at virtual address `vaddr`, stored back to back from byte
/// `img_offset` of a memory image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRun {
    pub vaddr: u64,
    pub img_offset: u64,
    pub pages: u64,
}

impl PageRun {
    fn bytes(&self) -> u64 {
        self.pages.saturating_mul(PAGE as u64)
    }
}

/// The page runs of each memory image of a generation, by path relative to the generation
/// directory (`criu/pages-<N>.img`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryLayout {
    files: BTreeMap<String, FileLayout>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct FileLayout {
    by_offset: Vec<PageRun>,
    by_vaddr: Vec<PageRun>,
}

impl MemoryLayout {
    /// Adds the runs of the image at `path` (relative to the generation directory).
    pub fn add(&mut self, path: String, runs: impl IntoIterator<Item = PageRun>) {
        let f = self.files.entry(path).or_default();
        f.by_offset.extend(runs);
        f.by_offset.sort_by_key(|r| r.img_offset);
        f.by_vaddr = f.by_offset.clone();
        f.by_vaddr.sort_by_key(|r| r.vaddr);
    }

    /// The virtual address of the page at byte `offset` of image `path`.
    pub(crate) fn vaddr_at(&self, path: &str, offset: u64) -> Option<u64> {
        let runs = &self.files.get(path)?.by_offset;
        let i = runs
            .partition_point(|r| r.img_offset <= offset)
            .checked_sub(1)?;
        let r = runs[i];
        (offset < r.img_offset + r.bytes()).then(|| r.vaddr + (offset - r.img_offset))
    }

    /// The byte offset in image `path` of the page at virtual address `vaddr`.
    pub(crate) fn offset_of(&self, path: &str, vaddr: u64) -> Option<u64> {
        let runs = &self.files.get(path)?.by_vaddr;
        let i = runs.partition_point(|r| r.vaddr <= vaddr).checked_sub(1)?;
        let r = runs[i];
        (vaddr < r.vaddr + r.bytes()).then(|| r.img_offset + (vaddr - r.vaddr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_addresses_map_both_ways() {
        let mut l = MemoryLayout::default();
        let p = PAGE as u64;
        l.add(
            "criu/pages-1.img".into(),
            [
                PageRun {
                    vaddr: 0x10_0000,
                    img_offset: 0,
                    pages: 2,
                },
                PageRun {
                    vaddr: 0x40_0000,
                    img_offset: 2 * p,
                    pages: 3,
                },
            ],
        );
        let f = "criu/pages-1.img";
        assert_eq!(l.vaddr_at(f, 0), Some(0x10_0000));
        assert_eq!(l.vaddr_at(f, p), Some(0x10_0000 + p));
        assert_eq!(l.vaddr_at(f, 3 * p), Some(0x40_0000 + p));
        assert_eq!(l.vaddr_at(f, 5 * p), None, "past the last run");
        assert_eq!(l.offset_of(f, 0x40_0000 + 2 * p), Some(4 * p));
        assert_eq!(l.offset_of(f, 0x10_0000 + 2 * p), None, "a hole");
        assert_eq!(l.offset_of(f, 0x0f_f000), None, "below every run");
        assert_eq!(l.offset_of("criu/pages-2.img", 0x10_0000), None);
    }
}
