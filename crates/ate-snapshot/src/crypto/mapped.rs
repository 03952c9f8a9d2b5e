//! A read-only mapping of part of a sealed file, for opening its frames out of place: AES-GCM
//! reads the ciphertext where the page cache holds it and writes the plaintext once, instead
//! of a `pread` copy followed by a pass in place (in a 1 GiB eager restore the copy cost the
//! streamer more than AES-GCM itself, docs/benchmarks.md).
//!
//! Architecture invariant: what is mapped is written once and then only renamed or removed,
//! never truncated or rewritten in place (sealed generation files; a local object store's
//! files, which object_store writes to a staging file and renames into place), so a mapping
//! inside the size the file had when it was opened cannot fault past its end (`SIGBUS`).

use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

const PAGE: u64 = 4096;

/// Bytes `offset .. offset + len` of a file, mapped read-only and populated.
pub(crate) struct Mapped {
    base: NonNull<std::ffi::c_void>,
    map_len: usize,
    /// Where the bytes asked for start in the mapping (mappings start on a page).
    skew: usize,
    len: usize,
}

impl Mapped {
    pub(crate) fn new(file: &File, offset: u64, len: usize) -> io::Result<Self> {
        let skew = offset % PAGE;
        let map_len = len
            .checked_add(skew as usize)
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty mapping"))?;
        let at = i64::try_from(offset - skew)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: a new read-only private mapping at an address the kernel chooses, so it
        // aliases nothing of ours; it is unmapped exactly once, in Drop.
        let base = unsafe {
            mmap(
                None,
                map_len,
                ProtFlags::PROT_READ,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE,
                file,
                at,
            )
        }
        .map_err(io::Error::from)?;
        Ok(Self {
            base,
            map_len: map_len.get(),
            skew: skew as usize,
            len,
        })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping covers `skew + len` readable bytes from `base` for as long as
        // `self` lives, and nothing writes to it (read-only, private; the file is not
        // truncated, see the module's invariant).
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().cast::<u8>().add(self.skew), self.len)
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `base` and `map_len` are the mapping `new` made, unmapped only here; no slice
        // from `bytes` outlives `self`.
        let _ = unsafe { munmap(self.base, self.map_len) };
    }
}
