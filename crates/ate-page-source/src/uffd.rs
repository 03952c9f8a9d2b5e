//! The userfaultfd ABI the page source needs (linux/userfaultfd.h): reading events and the
//! COPY, ZEROPAGE, WAKE and WRITEPROTECT ioctls on a descriptor CRIU opened in a restored task.
//!
//! Written out here rather than taken from the `userfaultfd` crate: that crate generates its
//! bindings with bindgen at build time (libclang on every build machine) and pulls a second nix;
//! the part we use is five fixed-layout structs and four ioctls.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ate_generation::images::PAGE_SIZE;

const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_FORK: u8 = 0x13;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

/// `struct uffd_msg` (packed, 32 bytes): the event byte, 7 reserved, then a 24-byte union.
const MSG_SIZE: usize = 32;

#[repr(C)]
#[derive(Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `UFFDIO_COPY_MODE_WP`: the copied pages are write-protected (the task's first write to one
/// clears the protection: with `UFFD_FEATURE_WP_ASYNC` the kernel does it without a message).
const COPY_MODE_WP: u64 = 1 << 1;

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

const UFFDIO: u8 = 0xAA;
nix::ioctl_read!(uffdio_wake, UFFDIO, 0x02, UffdioRange);
nix::ioctl_readwrite!(uffdio_copy, UFFDIO, 0x03, UffdioCopy);
nix::ioctl_readwrite!(uffdio_zeropage, UFFDIO, 0x04, UffdioZeropage);
nix::ioctl_readwrite!(uffdio_writeprotect, UFFDIO, 0x06, UffdioWriteprotect);

/// One event read from a userfaultfd.
#[derive(Debug)]
pub enum Event {
    /// A thread touched a missing page at `addr` (not page aligned) and waits for it.
    Pagefault { addr: u64 },
    /// The process forked: `uffd` serves the child, whose memory is the parent's at the fork.
    Fork { uffd: OwnedFd },
    /// mremap moved `[from, from + len)` to `to`.
    Remap { from: u64, to: u64, len: u64 },
    /// madvise(DONTNEED/REMOVE) or munmap dropped `[start, end)`: its pages read as zero now
    /// (or the range is gone), so they must never be copied in.
    Remove { start: u64, end: u64 },
}

fn u64_at(buf: &[u8; MSG_SIZE], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_ne_bytes(b)
}

/// Reads one event; `Ok(None)` when none is queued (the descriptors are non-blocking).
pub fn read_event(fd: RawFd) -> io::Result<Option<Event>> {
    let mut buf = [0u8; MSG_SIZE];
    // SAFETY: reads at most MSG_SIZE bytes into a buffer of that size.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), MSG_SIZE) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    if n as usize != MSG_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("short userfaultfd message ({n} bytes)"),
        ));
    }
    // The union starts at byte 8.
    let event = match buf[0] {
        UFFD_EVENT_PAGEFAULT => Event::Pagefault {
            addr: u64_at(&buf, 16),
        },
        UFFD_EVENT_FORK => {
            let mut b = [0u8; 4];
            b.copy_from_slice(&buf[8..12]);
            let raw = u32::from_ne_bytes(b) as RawFd;
            if raw < 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "fork event without a descriptor",
                ));
            }
            // SAFETY: the kernel installed this descriptor in our table for us to own.
            let uffd = unsafe { OwnedFd::from_raw_fd(raw) };
            set_nonblocking(uffd.as_raw_fd())?;
            Event::Fork { uffd }
        }
        UFFD_EVENT_REMAP => Event::Remap {
            from: u64_at(&buf, 8),
            to: u64_at(&buf, 16),
            len: u64_at(&buf, 24),
        },
        UFFD_EVENT_REMOVE | UFFD_EVENT_UNMAP => Event::Remove {
            start: u64_at(&buf, 8),
            end: u64_at(&buf, 16),
        },
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown userfaultfd event {other:#x}"),
            ));
        }
    };
    Ok(Some(event))
}

pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What became of a copy into a process.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    /// Every page is in (pages that were already present were left as they were).
    Done,
    /// The address space is changing (an event is queued): nothing more was placed; read the
    /// events and try again.
    Retry,
    /// The range is no longer registered (unmapped): nothing to place.
    Gone,
    /// The process exited.
    Exited,
}

/// Copies `data` (whole pages) to `dst` in the process behind `fd` and wakes threads waiting on
/// those pages. Pages already present are skipped, never overwritten. With `write_protect` the
/// pages are placed write-protected (the range must be registered in write-protect mode): they
/// read as not written (PAGEMAP_SCAN's `PAGE_IS_WRITTEN`) until the task writes them.
pub fn copy(fd: RawFd, dst: u64, data: &[u8], write_protect: bool) -> io::Result<Placed> {
    let mut done = 0u64;
    let len = data.len() as u64;
    while done < len {
        let mut arg = UffdioCopy {
            dst: dst + done,
            src: data[done as usize..].as_ptr() as u64,
            len: len - done,
            mode: if write_protect { COPY_MODE_WP } else { 0 },
            copy: 0,
        };
        // SAFETY: `arg` describes `data[done..]`, which outlives the call; the kernel only reads
        // from `src` and writes into the other process.
        let result = unsafe { uffdio_copy(fd, &mut arg) };
        if result.is_ok() {
            return Ok(Placed::Done);
        }
        if arg.copy > 0 {
            // Partial: the next call says why it stopped.
            done += arg.copy as u64;
            continue;
        }
        match failure(arg.copy, result.err()) {
            libc::EEXIST => done += PAGE_SIZE,
            libc::EAGAIN => return Ok(Placed::Retry),
            libc::ENOENT => return Ok(Placed::Gone),
            libc::ESRCH | libc::ENOSPC => return Ok(Placed::Exited),
            errno => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
    Ok(Placed::Done)
}

/// Why a UFFDIO_COPY or UFFDIO_ZEROPAGE placed nothing: the negative errno the kernel wrote into
/// the result field (`copy`, `zeropage`), or, when it failed before writing it, the ioctl's own
/// errno. A process whose address space is already gone fails the second way
/// (`mmget_not_zero` fails: -ESRCH, the field left 0): that is an exit, not an error.
fn failure(field: i64, ioctl: Option<nix::errno::Errno>) -> i32 {
    if field < 0 {
        return -field as i32;
    }
    ioctl.map_or(libc::EIO, |e| e as i32)
}

/// Maps the zero page at `page` (a page never dumped, or dropped since) and wakes its waiters.
pub fn zero(fd: RawFd, page: u64) -> io::Result<Placed> {
    let mut arg = UffdioZeropage {
        range: UffdioRange {
            start: page,
            len: PAGE_SIZE,
        },
        mode: 0,
        zeropage: 0,
    };
    // SAFETY: plain struct in, result field out.
    let result = unsafe { uffdio_zeropage(fd, &mut arg) };
    if result.is_ok() {
        return Ok(Placed::Done);
    }
    match failure(arg.zeropage, result.err()) {
        // Another fault on the same page was served first: the waiter still needs waking.
        libc::EEXIST => wake(fd, page).map(|()| Placed::Done),
        libc::EAGAIN => Ok(Placed::Retry),
        libc::ENOENT => Ok(Placed::Gone),
        libc::ESRCH | libc::ENOSPC => Ok(Placed::Exited),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Lifts write protection from `[start, start + len)` (registered in write-protect mode): its
/// pages read as written from now on. `Ok(false)` while the address space is changing (an event
/// is queued: read it and try again).
pub fn unprotect(fd: RawFd, start: u64, len: u64) -> io::Result<bool> {
    let mut arg = UffdioWriteprotect {
        range: UffdioRange { start, len },
        mode: 0,
    };
    // SAFETY: plain struct in.
    match unsafe { uffdio_writeprotect(fd, &mut arg) } {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN) => Ok(false),
        Err(e) => Err(io::Error::from_raw_os_error(e as i32)),
    }
}

pub fn wake(fd: RawFd, page: u64) -> io::Result<()> {
    let mut range = UffdioRange {
        start: page,
        len: PAGE_SIZE,
    };
    // SAFETY: plain struct in.
    unsafe { uffdio_wake(fd, &mut range) }
        .map(|_| ())
        .map_err(|e| io::Error::from_raw_os_error(e as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_into_a_process_already_gone_is_an_exit() {
        use nix::errno::Errno;
        // The kernel's result field first; the ioctl's errno when it failed before writing it
        // (the address space gone: -ESRCH, the field left 0).
        assert_eq!(
            failure(-(libc::EEXIST as i64), Some(Errno::EEXIST)),
            libc::EEXIST
        );
        assert_eq!(failure(0, Some(Errno::ESRCH)), libc::ESRCH);
        assert_eq!(failure(0, Some(Errno::EFAULT)), libc::EFAULT);
        assert_eq!(failure(0, None), libc::EIO);
    }

    #[test]
    fn layouts_match_the_kernel_headers() {
        assert_eq!(std::mem::size_of::<UffdioRange>(), 16);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdioZeropage>(), 32);
        assert_eq!(std::mem::size_of::<UffdioWriteprotect>(), 24);
        assert_eq!(
            nix::request_code_readwrite!(UFFDIO, 0x06, std::mem::size_of::<UffdioWriteprotect>())
                as u64,
            0xc018_aa06
        );
        // _IOWR(0xAA, 0x03, struct uffdio_copy) and _IOR(0xAA, 0x02, struct uffdio_range)
        // from linux/userfaultfd.h, as the kernel defines them on x86_64 and arm64.
        assert_eq!(
            nix::request_code_readwrite!(UFFDIO, 0x03, std::mem::size_of::<UffdioCopy>()) as u64,
            0xc028_aa03
        );
        assert_eq!(
            nix::request_code_readwrite!(UFFDIO, 0x04, std::mem::size_of::<UffdioZeropage>())
                as u64,
            0xc020_aa04
        );
        assert_eq!(
            nix::request_code_read!(UFFDIO, 0x02, std::mem::size_of::<UffdioRange>()) as u64,
            0x8010_aa02
        );
    }
}
