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
//! A chunk brought in first is never faulted, so a restore that prefetched well records few
//! faults; the entries it was given are carried into its own working set (one generation older
//! each time) and dropped after [`MAX_AGE`] restores in which the actor did not fault on them
//! first. Without that the working set would alternate between full and nearly empty.
//!
//! A missing or unreadable file only means no prefetch.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// File name, in the restore's work directory and in a generation's `criu/`.
pub const FILE: &str = "working-set.json";
/// Most entries kept (a chunk each: 8 GiB of working set).
pub const MAX_ENTRIES: usize = 4096;
/// Restores an entry is carried through without the actor faulting on it again.
pub const MAX_AGE: u8 = 3;

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkingSet {
    /// `(pid, page address, age)`: this restore's faults first (age 0), in fault order, then
    /// the entries carried from earlier restores (age: restores since the last fault).
    pub faults: Vec<(i32, u64, u8)>,
}

/// The recorder in the page source: one entry per `(pages image, chunk)` first placed on a fault,
/// plus the working set this restore was given.
#[derive(Debug, Default)]
pub struct Recorder {
    seen: HashSet<(u32, u64)>,
    set: WorkingSet,
    carried: Vec<(i32, u64, u8)>,
}

impl Recorder {
    /// Notes a fault of task `pid` on `page`, which lies in chunk `chunk` of pages image
    /// `pages_id`.
    pub fn fault(&mut self, pid: i32, page: u64, pages_id: u32, chunk: u64) {
        if self.set.faults.len() < MAX_ENTRIES && self.seen.insert((pages_id, chunk)) {
            self.set.faults.push((pid, page, 0));
        }
    }

    /// The working set this restore was given: written back one restore older unless too old.
    pub fn carry(&mut self, given: &WorkingSet) {
        self.carried = given
            .faults
            .iter()
            .filter(|e| e.2 < MAX_AGE)
            .map(|&(pid, page, age)| (pid, page, age + 1))
            .collect();
    }

    pub fn len(&self) -> usize {
        self.set.faults.len()
    }

    /// Nothing to write: no fault recorded and nothing carried.
    pub fn is_empty(&self) -> bool {
        self.set.faults.is_empty() && self.carried.is_empty()
    }

    /// Writes the working set to `dir/working-set.json` (through a temporary file, so a reader
    /// never sees half of it).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let faulted: HashSet<(i32, u64)> = self.set.faults.iter().map(|e| (e.0, e.1)).collect();
        let mut set = self.set.clone();
        set.faults.extend(
            self.carried
                .iter()
                .filter(|e| !faulted.contains(&(e.0, e.1)))
                .copied(),
        );
        set.faults.truncate(MAX_ENTRIES);
        let json = serde_json::to_vec(&set).map_err(std::io::Error::other)?;
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
            vec![
                (7, 0x7000_0000, 0),
                (8, 0x5000_0000, 0),
                (7, 0x6000_0000, 0)
            ]
        );
        assert!(!dir.path().join(format!("{FILE}.tmp")).exists());
    }

    #[test]
    fn given_entries_are_carried_one_restore_older_until_too_old() {
        let dir = tempfile::tempdir().expect("tempdir");
        let given = WorkingSet {
            faults: vec![
                (7, 0x1000, 0),
                (7, 0x2000, 2),
                (7, 0x3000, MAX_AGE),
                (7, 0x4000, 1),
            ],
        };
        let mut r = Recorder::default();
        r.carry(&given);
        r.fault(7, 0x4000, 1, 9); // faulted again: fresh, not carried
        r.write(dir.path()).expect("write");
        assert_eq!(
            read(dir.path()).faults,
            vec![(7, 0x4000, 0), (7, 0x1000, 1), (7, 0x2000, 3)]
        );
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
