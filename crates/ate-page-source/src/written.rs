//! What a tracked restore's tasks wrote: the kernel features memory tracking needs, and a count
//! of the pages written since they were placed write-protected (`PAGEMAP_SCAN`,
//! `PAGE_IS_WRITTEN`; Linux 6.7+).
//!
//! A page placed by the page source with `UFFDIO_COPY_MODE_WP` in a range registered for
//! write protection with `UFFD_FEATURE_WP_ASYNC` reads as not written until the task writes it;
//! every other page (placed by CRIU itself, new mappings, memory not registered) reads as
//! written. That is what lets a dump leave unwritten pages to the parent generation.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const PAGE_IS_WRITTEN: u64 = 1 << 1;
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;

/// `PM_SCAN_WP_MATCHING`: write-protect the pages the scan matches (only in ranges registered
/// for asynchronous write protection; other ranges are skipped without an error, as long as
/// `PM_SCAN_CHECK_WPASYNC` is not asked).
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;

/// `UFFD_FEATURE_WP_ASYNC`: write faults on protected pages are resolved by the kernel.
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFD_API: u64 = 0xAA;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

nix::ioctl_readwrite!(pagemap_scan, b'f', 16, PmScanArg);
nix::ioctl_readwrite!(uffdio_api, 0xAA, 0x3F, UffdioApi);

/// Whether this kernel can track writes for incremental dumps: `Err` names what is missing.
pub fn probe() -> Result<(), String> {
    // SAFETY: plain syscall; the descriptor is owned below.
    let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
    if raw < 0 {
        return Err(format!("userfaultfd: {}", io::Error::last_os_error()));
    }
    // SAFETY: just created, owned here.
    let uffd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut api = UffdioApi {
        api: UFFD_API,
        ..UffdioApi::default()
    };
    // SAFETY: a valid struct for the call; features 0 asks what the kernel supports.
    unsafe { uffdio_api(uffd.as_raw_fd(), &mut api) }.map_err(|e| format!("UFFDIO_API: {e}"))?;
    if api.features & UFFD_FEATURE_WP_ASYNC == 0 {
        return Err("the kernel's userfaultfd lacks UFFD_FEATURE_WP_ASYNC (Linux 6.7+)".into());
    }
    let pagemap = std::fs::File::open("/proc/self/pagemap")
        .map_err(|e| format!("open /proc/self/pagemap: {e}"))?;
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        ..PmScanArg::default()
    };
    // SAFETY: an empty range and no output vector: the kernel only checks the arguments.
    unsafe { pagemap_scan(pagemap.as_raw_fd(), &mut arg) }
        .map_err(|e| format!("the kernel has no PAGEMAP_SCAN (Linux 6.7+): {e}"))?;
    Ok(())
}

/// The user half of the address space with 48-bit addresses, less its last page (the kernel's
/// limit on x86_64; wider address spaces are walked as far as this goes, which is where
/// ordinary processes live).
const USER_END: u64 = (1 << 47) - 4096;

/// Pages of process `pid` that hold data (present or swapped, not the zero page, not file
/// pages) and read as written: all of them unless its memory was restored with tracking.
pub fn written_pages(pid: u32) -> io::Result<u64> {
    written_pages_in(pid, 0, USER_END)
}

/// [`written_pages`] of `[start, end)` only (page-aligned).
pub fn written_pages_in(pid: u32, start: u64, end: u64) -> io::Result<u64> {
    let query = PmScanArg {
        category_inverted: PAGE_IS_PFNZERO | PAGE_IS_FILE,
        category_mask: PAGE_IS_PFNZERO | PAGE_IS_FILE,
        category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        return_mask: PAGE_IS_WRITTEN,
        ..PmScanArg::default()
    };
    scan_pages(pid, start, end, query, |r| {
        r.categories & PAGE_IS_WRITTEN != 0
    })
}

/// Write-protects again every page of process `pid` written since it was placed or last
/// protected, in its ranges registered for write protection: after a dump that becomes the next
/// generation's parent, with the process frozen (so every page is as the dump wrote it), the
/// next dump leaves all of them to that generation. Returns how many pages were protected.
/// Only present or swapped pages are matched: with the written category alone the kernel takes
/// a fast path that also protects *unpopulated* entries (uffd-wp markers), which a read then
/// faults into the page source as missing, and which a dump would leave to a parent that does
/// not hold them.
pub fn rearm(pid: u32) -> io::Result<u64> {
    let query = PmScanArg {
        flags: PM_SCAN_WP_MATCHING,
        category_mask: PAGE_IS_WRITTEN,
        category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        return_mask: PAGE_IS_WRITTEN,
        ..PmScanArg::default()
    };
    scan_pages(pid, 0, USER_END, query, |_| true)
}

/// Walks `[start, end)` of `pid`'s pagemap with PAGEMAP_SCAN as `query` asks (its flags and
/// masks; the range and output vector are filled in here), in as many calls as the output
/// needs, and counts the pages of the regions `count` picks.
fn scan_pages(
    pid: u32,
    mut start: u64,
    end: u64,
    query: PmScanArg,
    count: impl Fn(&PageRegion) -> bool,
) -> io::Result<u64> {
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let mut regions = vec![PageRegion::default(); 512];
    let mut pages = 0u64;
    while start < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            ..query
        };
        // SAFETY: `vec` points at `vec_len` regions we own for the call.
        let n = unsafe { pagemap_scan(pagemap.as_raw_fd(), &mut arg) }
            .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
        for r in regions.iter().take(n as usize).filter(|r| count(r)) {
            pages += (r.end - r.start) / 4096;
        }
        if arg.walk_end <= start {
            break;
        }
        start = arg.walk_end;
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel_headers() {
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(std::mem::size_of::<PageRegion>(), 24);
        // _IOWR('f', 16, struct pm_scan_arg) from linux/fs.h.
        assert_eq!(
            nix::request_code_readwrite!(b'f', 16, std::mem::size_of::<PmScanArg>()) as u64,
            0xc060_6610
        );
    }

    /// This process's own memory was never write-protected: every page it touched reads as
    /// written, so a dump of it would leave nothing to a parent.
    #[test]
    fn memory_never_protected_reads_as_written() {
        probe().expect("this kernel tracks writes (Linux 6.7+)");
        let touched: Vec<u8> = vec![7; 64 * 4096];
        let written = written_pages(std::process::id()).expect("scan");
        assert!(written >= 64, "{written} pages written");
        assert_eq!(touched[4096], 7);
    }
}
