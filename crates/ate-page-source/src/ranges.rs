//! Bookkeeping of the lazy pages still to copy into one restored process.
//!
//! Ranges are kept by their *run-time* address, which drifts from the dump-time address when the
//! process `mremap`s; each keeps the pages-file offset of its first page. Ranges are never
//! merged, so a range that came from [`read_task_pages`](ate_generation::images::read_task_pages) stays
//! inside one VMA (as one `UFFDIO_COPY` must).

use std::collections::BTreeMap;

use ate_generation::images::{ImageRange, PAGE_SIZE};

/// Pages still to copy into one process, by run-time address (a process can
/// mremap/munmap/madvise while we serve it).
///
/// Ranges are disjoint; addresses and lengths are bytes (page-aligned in practice).
#[derive(Clone, Debug, Default)]
pub struct Pending {
    /// start → (end, img_offset of start).
    map: BTreeMap<u64, (u64, u64)>,
    /// Sum of `end - start` over `map`.
    bytes: u64,
}

impl Pending {
    /// Pending set of `ranges`; empty ranges are skipped, and where ranges overlap a later one
    /// replaces the overlapped part of an earlier one.
    pub fn new(ranges: impl IntoIterator<Item = ImageRange>) -> Self {
        let mut pending = Pending::default();
        for range in ranges {
            if range.start < range.end {
                pending.remove(range.start, range.end);
                pending.insert(range);
            }
        }
        pending
    }

    /// True when nothing is left to copy.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Total pages pending.
    pub fn pages(&self) -> u64 {
        self.bytes / PAGE_SIZE
    }

    /// The pending range containing `addr`.
    pub fn find(&self, addr: u64) -> Option<ImageRange> {
        let (&start, &(end, img_offset)) = self.map.range(..=addr).next_back()?;
        (addr < end).then_some(ImageRange {
            start,
            end,
            img_offset,
        })
    }

    /// Drops `[start, end)`: copied, unmapped or madvised away. Ranges straddling a bound are
    /// cut; the image offset of a right remainder moves with its start.
    pub fn remove(&mut self, start: u64, end: u64) {
        self.take(start, end);
    }

    /// `mremap` of `[from, from + len)` to `to`: the pending pages there now live at
    /// `to + (addr - from)`, with the same image offsets.
    ///
    /// The whole destination `[to, to + len)` is dropped first, as the kernel unmaps it: pending
    /// pages there are replaced by whatever moved in (pending or already copied). The source is
    /// dropped too (moved away). A range that would pass the end of the address space is cut.
    pub fn remap(&mut self, from: u64, to: u64, len: u64) {
        let len = len.min(u64::MAX - from).min(u64::MAX - to);
        if len == 0 || from == to {
            return;
        }
        let moved = self.take(from, from + len);
        self.take(to, to + len);
        for piece in moved {
            self.insert(ImageRange {
                start: to + (piece.start - from),
                end: to + (piece.end - from),
                img_offset: piece.img_offset,
            });
        }
    }

    /// Pending pieces whose image bytes intersect `[img_start, img_end)`, clipped to it (the
    /// addresses clipped alike), sorted by address. With page-aligned bounds the pieces are
    /// page-aligned. Scans every range.
    pub fn in_image_span(&self, img_start: u64, img_end: u64) -> Vec<ImageRange> {
        self.iter()
            .filter_map(|r| {
                let lo = r.img_offset.max(img_start);
                let hi = r.img_end().min(img_end);
                (lo < hi).then(|| ImageRange {
                    start: r.start + (lo - r.img_offset),
                    end: r.start + (hi - r.img_offset),
                    img_offset: lo,
                })
            })
            .collect()
    }

    /// Whether every page of `piece` sits where the dump found it: `self` is the task's
    /// pending set as it was read from the images (before any event), and a piece moved by
    /// `mremap` (or only partly back in place) is not. Write-protected copies are only for
    /// pages in place: a page's write protection says "the same as the parent image *at this
    /// address*" (see `source`'s memory tracking).
    pub fn holds_in_place(&self, piece: &ImageRange) -> bool {
        self.find(piece.start).is_some_and(|origin| {
            piece.end <= origin.end
                && origin.img_offset + (piece.start - origin.start) == piece.img_offset
        })
    }

    /// The pending range with the lowest address.
    pub fn first(&self) -> Option<ImageRange> {
        self.iter().next()
    }

    /// Pending ranges by increasing address.
    pub fn iter(&self) -> impl Iterator<Item = ImageRange> + '_ {
        self.map
            .iter()
            .map(|(&start, &(end, img_offset))| ImageRange {
                start,
                end,
                img_offset,
            })
    }

    /// Adds `range`, which must not overlap any pending range.
    fn insert(&mut self, range: ImageRange) {
        if range.start < range.end {
            self.bytes += range.end - range.start;
            self.map.insert(range.start, (range.end, range.img_offset));
        }
    }

    /// Removes `[start, end)` and returns the removed pieces, clipped, by address.
    fn take(&mut self, start: u64, end: u64) -> Vec<ImageRange> {
        let mut taken = Vec::new();
        if start >= end {
            return taken;
        }
        let first = match self.find(start) {
            Some(r) => r.start,
            None => start,
        };
        let keys: Vec<u64> = self.map.range(first..end).map(|(&k, _)| k).collect();
        for key in keys {
            let Some((r_end, img_offset)) = self.map.remove(&key) else {
                continue;
            };
            self.bytes -= r_end - key;
            let range = ImageRange {
                start: key,
                end: r_end,
                img_offset,
            };
            let lo = key.max(start);
            let hi = r_end.min(end);
            self.insert(ImageRange { end: lo, ..range });
            self.insert(ImageRange {
                start: hi,
                end: r_end,
                img_offset: img_offset + (hi - key),
            });
            taken.push(ImageRange {
                start: lo,
                end: hi,
                img_offset: img_offset + (lo - key),
            });
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const P: u64 = PAGE_SIZE;

    fn r(start: u64, end: u64, img_offset: u64) -> ImageRange {
        ImageRange {
            start,
            end,
            img_offset,
        }
    }

    fn all(p: &Pending) -> Vec<ImageRange> {
        p.iter().collect()
    }

    #[test]
    fn basics() {
        let p = Pending::new([
            r(10 * P, 14 * P, 0),
            r(2 * P, 3 * P, 4 * P),
            r(5 * P, 5 * P, 0),
        ]);
        assert_eq!(p.pages(), 5);
        assert!(!p.is_empty());
        assert_eq!(p.first(), Some(r(2 * P, 3 * P, 4 * P)));
        assert_eq!(p.find(13 * P + 5), Some(r(10 * P, 14 * P, 0)));
        assert_eq!(p.find(14 * P), None);
        assert_eq!(p.find(P), None);
        assert_eq!(p.find(5 * P), None);
        assert!(Pending::default().is_empty());
        assert_eq!(Pending::default().first(), None);
    }

    #[test]
    fn new_with_overlap_keeps_later() {
        let p = Pending::new([r(0, 4 * P, 0), r(2 * P, 3 * P, 100 * P)]);
        assert_eq!(
            all(&p),
            vec![
                r(0, 2 * P, 0),
                r(2 * P, 3 * P, 100 * P),
                r(3 * P, 4 * P, 3 * P)
            ]
        );
        assert_eq!(p.pages(), 4);
    }

    #[test]
    fn remove_in_the_middle_splits() {
        let mut p = Pending::new([r(10 * P, 20 * P, 100 * P)]);
        p.remove(12 * P, 15 * P);
        assert_eq!(
            all(&p),
            vec![r(10 * P, 12 * P, 100 * P), r(15 * P, 20 * P, 105 * P)]
        );
        assert_eq!(p.pages(), 7);
        p.remove(0, 0);
        p.remove(16 * P, 16 * P);
        assert_eq!(p.pages(), 7);
    }

    #[test]
    fn remove_spanning_several_ranges() {
        let mut p = Pending::new([
            r(0, 4 * P, 0),
            r(4 * P, 6 * P, 4 * P),
            r(8 * P, 9 * P, 6 * P),
            r(10 * P, 14 * P, 7 * P),
        ]);
        p.remove(2 * P, 11 * P);
        assert_eq!(all(&p), vec![r(0, 2 * P, 0), r(11 * P, 14 * P, 8 * P)]);
        assert_eq!(p.pages(), 5);
        p.remove(0, u64::MAX);
        assert!(p.is_empty());
        assert_eq!(p.pages(), 0);
    }

    #[test]
    fn only_pieces_where_the_dump_found_them_are_in_place() {
        let origin = Pending::new([r(10 * P, 20 * P, 0), r(40 * P, 42 * P, 10 * P)]);
        let mut p = origin.clone();
        assert!(origin.holds_in_place(&r(12 * P, 15 * P, 2 * P)));
        assert!(origin.holds_in_place(&r(40 * P, 42 * P, 10 * P)));
        // Moved onto the second range: its addresses, another image offset.
        p.remap(12 * P, 40 * P, 3 * P);
        let moved = p.find(40 * P).unwrap();
        assert!(!origin.holds_in_place(&moved));
        // Moved back: in place again.
        p.remap(40 * P, 12 * P, 3 * P);
        assert!(origin.holds_in_place(&p.find(12 * P).unwrap()));
        // Moved where the dump had nothing, or across the end of an original range.
        assert!(!origin.holds_in_place(&r(60 * P, 61 * P, 0)));
        assert!(!origin.holds_in_place(&r(19 * P, 21 * P, 9 * P)));
    }

    #[test]
    fn remap_moves_part_of_a_range() {
        let mut p = Pending::new([r(10 * P, 20 * P, 0), r(40 * P, 42 * P, 10 * P)]);
        // Move pages 12..15 to 40..43: replaces the range at 40..42.
        p.remap(12 * P, 40 * P, 3 * P);
        assert_eq!(
            all(&p),
            vec![
                r(10 * P, 12 * P, 0),
                r(15 * P, 20 * P, 5 * P),
                r(40 * P, 43 * P, 2 * P),
            ]
        );
        assert_eq!(p.pages(), 10);
        // Moving a span with nothing pending still clears the destination.
        p.remap(100 * P, 10 * P, 2 * P);
        assert_eq!(
            all(&p),
            vec![r(15 * P, 20 * P, 5 * P), r(40 * P, 43 * P, 2 * P)]
        );
        // Partly pending source: only the pending pages arrive.
        p.remap(18 * P, 60 * P, 4 * P);
        assert_eq!(
            all(&p),
            vec![
                r(15 * P, 18 * P, 5 * P),
                r(40 * P, 43 * P, 2 * P),
                r(60 * P, 62 * P, 8 * P),
            ]
        );
        // No overflow at the top of the address space.
        p.remap(15 * P, u64::MAX - P + 1, 3 * P);
        assert_eq!(
            p.find(u64::MAX - 1),
            Some(r(u64::MAX - P + 1, u64::MAX, 5 * P))
        );
    }

    #[test]
    fn in_image_span_clips() {
        let p = Pending::new([
            r(10 * P, 20 * P, 0),
            r(30 * P, 35 * P, 10 * P),
            r(5 * P, 6 * P, 40 * P),
        ]);
        assert_eq!(
            p.in_image_span(8 * P, 12 * P),
            vec![r(18 * P, 20 * P, 8 * P), r(30 * P, 32 * P, 10 * P)]
        );
        assert_eq!(
            p.in_image_span(40 * P, 50 * P),
            vec![r(5 * P, 6 * P, 40 * P)]
        );
        assert_eq!(p.in_image_span(15 * P, 40 * P), vec![]);
        assert_eq!(p.in_image_span(3 * P, 3 * P), vec![]);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Remove(u64, u64),
        Remap(u64, u64, u64),
        Span(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..80u64, 0..20u64).prop_map(|(s, l)| Op::Remove(s, l)),
            (0..80u64, 0..80u64, 0..20u64).prop_map(|(f, t, l)| Op::Remap(f, t, l)),
            (0..60u64, 0..20u64).prop_map(|(s, l)| Op::Span(s, l)),
        ]
    }

    type Model = HashMap<u64, u64>;

    fn model_of(p: &Pending) -> Model {
        let mut m = Model::new();
        for range in p.iter() {
            for page in 0..range.pages() {
                m.insert(range.start + page * P, range.img_offset + page * P);
            }
        }
        m
    }

    fn check(p: &Pending, model: &Model) -> Result<(), TestCaseError> {
        let ranges = all(p);
        for pair in ranges.windows(2) {
            prop_assert!(pair[0].end <= pair[1].start, "overlap: {:?}", pair);
        }
        for range in &ranges {
            prop_assert!(range.start < range.end);
        }
        prop_assert_eq!(&model_of(p), model);
        prop_assert_eq!(p.pages(), model.len() as u64);
        prop_assert_eq!(p.is_empty(), model.is_empty());
        prop_assert_eq!(p.first().map(|r| r.start), model.keys().min().copied());
        for page in 0..120 {
            let addr = page * P;
            let found = p
                .find(addr + P / 2)
                .map(|r| r.img_offset + (addr - r.start));
            prop_assert_eq!(found, model.get(&addr).copied(), "page {}", page);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn matches_per_page_model(
            layout in prop::collection::vec((0..4u64, 1..6u64, 0..3u64), 0..12),
            ops in prop::collection::vec(op(), 0..24),
        ) {
            let mut ranges = Vec::new();
            let mut model = Model::new();
            let (mut addr, mut img) = (0u64, 0u64);
            for (gap, len, img_gap) in layout {
                addr += gap;
                img += img_gap;
                ranges.push(r(addr * P, (addr + len) * P, img * P));
                for i in 0..len {
                    model.insert((addr + i) * P, (img + i) * P);
                }
                addr += len;
                img += len;
            }
            let mut p = Pending::new(ranges);
            check(&p, &model)?;
            for op in ops {
                match op {
                    Op::Remove(s, l) => {
                        p.remove(s * P, (s + l) * P);
                        model.retain(|&a, _| a < s * P || a >= (s + l) * P);
                    }
                    Op::Remap(f, t, l) => {
                        p.remap(f * P, t * P, l * P);
                        if f != t {
                            let (from, to, len) = (f * P, t * P, l * P);
                            let moved: Vec<(u64, u64)> = model
                                .iter()
                                .filter(|&(&a, _)| (from..from + len).contains(&a))
                                .map(|(&a, &o)| (a, o))
                                .collect();
                            model.retain(|&a, _| {
                                !(from..from + len).contains(&a) && !(to..to + len).contains(&a)
                            });
                            for (a, o) in moved {
                                model.insert(to + (a - from), o);
                            }
                        }
                    }
                    Op::Span(s, l) => {
                        let (lo, hi) = (s * P, (s + l) * P);
                        let pieces = p.in_image_span(lo, hi);
                        for pair in pieces.windows(2) {
                            prop_assert!(pair[0].end <= pair[1].start);
                        }
                        let mut got = Model::new();
                        for piece in &pieces {
                            prop_assert!(piece.img_offset >= lo && piece.img_end() <= hi);
                            prop_assert!(piece.start < piece.end);
                            for i in 0..piece.pages() {
                                got.insert(piece.start + i * P, piece.img_offset + i * P);
                            }
                        }
                        let want: Model = model
                            .iter()
                            .filter(|&(_, &o)| o >= lo && o < hi)
                            .map(|(&a, &o)| (a, o))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                }
                check(&p, &model)?;
            }
        }
    }
}
