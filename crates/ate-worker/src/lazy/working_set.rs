//! Working-set prefetch: which memory an actor touched first after its last lazy restore,
//! so the next restore brings that memory in first.
//!
//! The page source records the first faulted page of every chunk it placed on a fault (the
//! pages the actor needed before the background push got there) as `(pid, page address)`, in
//! fault order, and writes them to `working-set.json` in the restore's work directory when all
//! pages are in. The worker copies that file into the next generation it checkpoints
//! (`criu/working-set.json`, so it is covered by the manifest and travels with the durable copy).
//! The next lazy restore of that generation maps each address to the chunk of the new dump that
//! holds it and pushes (or, from the durable store, fetches in parallel) those chunks before any
//! other. Addresses, not chunk numbers: a new dump lays its pages out anew.
//!
//! A missing or unreadable file only means no prefetch.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// File name, in the restore's work directory and in a generation's `criu/`.
pub const FILE: &str = "working-set.json";
/// Most entries kept (a chunk each: 8 GiB of working set).
pub const MAX_ENTRIES: usize = 4096;

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkingSet {
    /// `(pid, page address)`, first fault first.
    pub faults: Vec<(i32, u64)>,
}

/// The recorder in the page source: one entry per `(pages image, chunk)` first placed on a fault.
#[derive(Debug, Default)]
pub struct Recorder {
    seen: HashSet<(u32, u64)>,
    set: WorkingSet,
}

impl Recorder {
    /// Notes a fault of task `pid` on `page`, which lies in chunk `chunk` of pages image
    /// `pages_id`.
    pub fn fault(&mut self, pid: i32, page: u64, pages_id: u32, chunk: u64) {
        if self.set.faults.len() < MAX_ENTRIES && self.seen.insert((pages_id, chunk)) {
            self.set.faults.push((pid, page));
        }
    }

    pub fn len(&self) -> usize {
        self.set.faults.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.faults.is_empty()
    }

    /// Writes the working set to `dir/working-set.json` (through a temporary file, so a reader
    /// never sees half of it).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(&self.set).map_err(std::io::Error::other)?;
        let tmp = dir.join(format!("{FILE}.tmp"));
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, dir.join(FILE))
    }
}

/// The working set a generation carries (`criu_dir/working-set.json`); empty when it has none
/// or it cannot be read.
pub fn read(criu_dir: &Path) -> WorkingSet {
    std::fs::read(criu_dir.join(FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<WorkingSet>(&b).ok())
        .map(|mut w| {
            w.faults.truncate(MAX_ENTRIES);
            w
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_one_entry_per_chunk_in_fault_order_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = Recorder::default();
        r.fault(7, 0x7000_0000, 1, 3);
        r.fault(7, 0x7000_1000, 1, 3); // same chunk: not again
        r.fault(8, 0x5000_0000, 2, 3); // same index, other image
        r.fault(7, 0x6000_0000, 1, 0);
        assert_eq!(r.len(), 3);
        r.write(dir.path()).expect("write");
        assert_eq!(
            read(dir.path()).faults,
            vec![(7, 0x7000_0000), (8, 0x5000_0000), (7, 0x6000_0000)]
        );
        assert!(!dir.path().join(format!("{FILE}.tmp")).exists());
    }

    #[test]
    fn a_missing_or_damaged_file_is_no_working_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read(dir.path()), WorkingSet::default());
        std::fs::write(dir.path().join(FILE), b"{not json").expect("write");
        assert_eq!(read(dir.path()), WorkingSet::default());
    }

    #[test]
    fn the_recorder_stops_at_its_limit() {
        let mut r = Recorder::default();
        for c in 0..(MAX_ENTRIES as u64 + 10) {
            r.fault(1, c * 4096, 1, c);
        }
        assert_eq!(r.len(), MAX_ENTRIES);
    }
}
