//! Unit tests of the page source against real userfaultfds in this test process.

use std::io::Write;
use std::os::fd::AsRawFd;

use super::*;
use crate::report::{self, Received};
use ate_generation::images::fixtures;

const PAGES: u64 = 16;
const P: usize = 4096;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

nix::ioctl_readwrite!(uffdio_api, 0xAA, 0x3F, UffdioApi);
nix::ioctl_readwrite!(uffdio_register, 0xAA, 0x00, UffdioRegister);
const UFFD_API: u64 = 0xAA;
/// UFFD_FEATURE_EVENT_REMAP | EVENT_REMOVE | EVENT_UNMAP.
const FEATURES: u64 = (1 << 1) | (1 << 3) | (1 << 4);

/// A generation whose memory image holds `PAGES` pages at `vaddr`, page i filled with i + 1.
fn generation(dir: &Path, vaddr: u64) -> (PathBuf, Vec<u8>) {
    let generation = dir.join("gen");
    let criu = generation.join(ate_snapshot::CRIU_DIR);
    std::fs::create_dir_all(&criu).unwrap();
    fixtures::write_one_lazy_range(&criu, 1, 1, vaddr, PAGES);
    let pages: Vec<u8> = (0..PAGES as usize)
        .flat_map(|i| std::iter::repeat_n(i as u8 + 1, P))
        .collect();
    std::fs::write(criu.join("pages-1.img"), &pages).unwrap();
    let manifest = Manifest {
        format_version: ate_snapshot::FORMAT_VERSION,
        atespace: "ns".into(),
        name: "a".into(),
        generation: 1,
        uuid: "u".into(),
        fidelity: ate_core::Fidelity::Memory,
        template: "ns/t".into(),
        sandbox_class: "runc".into(),
        node: "n".into(),
        boot_id: "b".into(),
        created_unix_ms: 1,
        reason: String::new(),
        files: vec![FileEntry {
            path: "criu/pages-1.img".into(),
            size: pages.len() as u64,
            sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&pages)),
            blake3_chunks: vec![blake3::hash(&pages).to_hex().to_string()],
        }],
        parent: None,
    };
    std::fs::write(
        generation.join(ate_snapshot::MANIFEST_FILE),
        manifest.to_json(),
    )
    .unwrap();
    (generation, pages)
}

fn send_fd(sock: &UnixStream, fd: RawFd) {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [fd];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[io::IoSlice::new(&[0u8])],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
}

/// A private anonymous mapping of `PAGES` pages, unmapped on drop.
struct Mapping(*mut libc::c_void);

impl Mapping {
    fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping, owned by the value.
        let region = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGES as usize * P,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(region, libc::MAP_FAILED);
        Mapping(region)
    }

    fn base(&self) -> u64 {
        self.0 as u64
    }

    fn read(&self, page: usize, at: usize) -> u8 {
        // SAFETY: inside the mapping; a missing page is served by the page source thread.
        unsafe { *(self.0 as *const u8).add(page * P + at) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(self.0, PAGES as usize * P) };
    }
}

/// A userfaultfd with the events CRIU asks for, registered for missing pages of `m`.
fn registered_uffd(m: &Mapping) -> OwnedFd {
    registered(m, false)
}

/// As CRIU's restorer makes it with `lazy-pages-wp`: also `UFFD_FEATURE_WP_ASYNC`, and the
/// range registered for write protection too.
fn registered(m: &Mapping, write_protect: bool) -> OwnedFd {
    // SAFETY: plain syscall; the descriptor is owned below.
    let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
        as RawFd;
    assert!(raw >= 0, "userfaultfd: {}", io::Error::last_os_error());
    // SAFETY: just created, owned here.
    let uffd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut api = UffdioApi {
        api: UFFD_API,
        features: FEATURES | if write_protect { 1 << 15 } else { 0 },
        ioctls: 0,
    };
    // SAFETY: valid struct for the call.
    unsafe { uffdio_api(uffd.as_raw_fd(), &mut api) }.unwrap();
    let mut reg = UffdioRegister {
        start: m.base(),
        len: PAGES * P as u64,
        // UFFDIO_REGISTER_MODE_MISSING (| UFFDIO_REGISTER_MODE_WP)
        mode: if write_protect { 1 | 2 } else { 1 },
        ioctls: 0,
    };
    // SAFETY: valid struct for the call; the range is our mapping.
    unsafe { uffdio_register(uffd.as_raw_fd(), &mut reg) }.unwrap();
    uffd
}

type Running = std::thread::JoinHandle<Result<Stats, SourceError>>;

/// Starts the page source on `generation`, waits until it listens, and hands it `uffd` as
/// CRIU would (pid 1). Returns the worker's end of the report socket and CRIU's connection.
fn start(dir: &Path, generation: &Path, uffd: &OwnedFd) -> (UnixStream, UnixStream, Running) {
    start_tracking(dir, generation, uffd, false)
}

fn start_tracking(
    dir: &Path,
    generation: &Path,
    uffd: &OwnedFd,
    write_protect: bool,
) -> (UnixStream, UnixStream, Running) {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (ours, theirs) = report::pair().unwrap();
    let (generation, work2) = (generation.to_path_buf(), work.clone());
    let source = std::thread::spawn(move || run(&generation, &work2, theirs, write_protect));
    assert!(matches!(
        report::receive_report(&ours).unwrap(),
        Received::Listening
    ));
    let mut criu = UnixStream::connect(work.join(SOCKET_NAME)).unwrap();
    criu.write_all(&1i32.to_ne_bytes()).unwrap();
    send_fd(&criu, uffd.as_raw_fd());
    (ours, criu, source)
}

#[test]
fn faults_are_served_from_verified_chunks_and_dropped_pages_read_as_zero() {
    let m = Mapping::new();
    let dir = tempfile::tempdir().unwrap();
    let (generation, _) = generation(dir.path(), m.base());
    let uffd = registered_uffd(&m);
    let (ours, mut criu, source) = start(dir.path(), &generation, &uffd);
    // Our own copy stays open like the worker's: the page source must still finish.
    assert!(matches!(
        report::receive_report(&ours).unwrap(),
        Received::Uffd(_)
    ));
    // Page 5 is dropped before it was ever placed: it must read as zero, never as the
    // dumped 6s (a REMOVE event the page source has to honour).
    // SAFETY: inside our mapping.
    let rc = unsafe {
        libc::madvise(
            (m.base() + 5 * P as u64) as *mut libc::c_void,
            P,
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0);
    criu.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();

    assert_eq!(m.read(0, 0), 1);
    assert_eq!(m.read(15, P - 1), 16);
    assert_eq!(m.read(5, 100), 0, "a dropped page came back with old data");
    assert_eq!(m.read(7, 7), 8);

    let done = loop {
        match report::receive_report(&ours).unwrap() {
            Received::Done(summary) => break summary,
            Received::Failed(why) => panic!("page source failed: {why}"),
            _ => {}
        }
    };
    assert!(done.contains("tasks=1"), "{done}");
    drop(ours);
    drop(criu);
    let stats = source.join().unwrap().unwrap();
    assert_eq!(
        stats.pages_on_fault + stats.pages_pushed,
        PAGES - 1,
        "{stats:?}"
    );
    assert_eq!(m.read(9, 0), 10);
}

#[test]
fn a_damaged_chunk_places_nothing_and_fails() {
    let m = Mapping::new();
    let dir = tempfile::tempdir().unwrap();
    let (generation, mut pages) = generation(dir.path(), m.base());
    pages[3 * P + 10] ^= 0xff;
    std::fs::write(generation.join("criu/pages-1.img"), &pages).unwrap();
    let uffd = registered_uffd(&m);
    let (_ours, mut criu, source) = start(dir.path(), &generation, &uffd);
    criu.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
    // No fault here (it would wait forever: our copy of the uffd keeps it registered).
    let err = source.join().unwrap().unwrap_err().to_string();
    assert!(err.contains("chunk 0") && err.contains("damaged"), "{err}");
    // Nothing was placed: the kernel still reports every page of the mapping missing.
    let mut resident = vec![0u8; PAGES as usize];
    // SAFETY: mincore over our mapping into a buffer of one byte per page.
    let rc = unsafe { libc::mincore(m.0, PAGES as usize * P, resident.as_mut_ptr().cast()) };
    assert_eq!(rc, 0);
    assert!(
        resident.iter().all(|v| v & 1 == 0),
        "pages were placed: {resident:?}"
    );
    // The uffd closes before the mapping goes (declared after it).
    drop(uffd);
}

/// Only content that does not match the manifest is the generation's damage; a chunk missing
/// from the store, an I/O error or a protocol failure is the page source's failure.
#[test]
fn damage_is_content_that_does_not_match_the_manifest() {
    let mismatch = SourceError::Snapshot(ate_snapshot::Error::ChunkMismatch {
        file: "criu/pages-1.img".into(),
        chunk: 3,
        start: 6 << 20,
        end: 8 << 20,
        expected: "aa".into(),
        actual: "bb".into(),
    });
    assert!(mismatch.is_damage());
    let missing = SourceError::Snapshot(ate_snapshot::Error::MissingFile {
        file: "criu/pages-1.img (chunk 3)".into(),
    });
    assert!(!missing.is_damage());
    let io = SourceError::Io {
        what: "read".into(),
        source: std::io::Error::other("EIO"),
    };
    assert!(!io.is_damage());
    assert!(!SourceError::Protocol("CRIU hung up".into()).is_damage());
}

/// A page source that outlived its restore writes its status into its own work dir only: a
/// later restore of the actor (same path, a new dir) never reads a failure that is not its own.
#[test]
fn the_status_goes_to_the_page_sources_own_work_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("criu-restore");
    std::fs::create_dir(&work).expect("mkdir");
    let own = std::fs::File::open(&work).expect("open the work dir");
    write_status(&own, "done\n").expect("write into its own dir");
    assert_eq!(
        std::fs::read_to_string(work.join(crate::STATUS_FILE)).expect("status"),
        "done\n"
    );

    std::fs::remove_dir_all(&work).expect("rm");
    std::fs::create_dir(&work).expect("the next restore's dir");
    let _ = write_status(&own, "failed: CRIU did not connect\n");
    assert!(
        !work.join(crate::STATUS_FILE).exists(),
        "a stale page source wrote into the next restore's dir"
    );
}

/// The worker's barrier, as `watch` sends it: the page source's answer.
fn barrier(ours: &UnixStream) -> String {
    nix::sys::socket::send(
        ours.as_raw_fd(),
        &[report::BARRIER],
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    match report::receive_report(ours).unwrap() {
        Received::Tracking(text) => text,
        other => panic!("expected a barrier answer, got {other:?}"),
    }
}

/// A tracked restore: every page placed where the dump found it is write-protected, so only
/// what the task writes afterwards reads as written; pages moved by mremap read as written at
/// their new address; the barrier says tracking holds, since when.
#[test]
fn a_tracked_restore_leaves_only_what_the_task_writes_as_written() {
    crate::written::probe().expect("this kernel tracks writes (Linux 6.7+)");
    let m = Mapping::new();
    let dir = tempfile::tempdir().unwrap();
    let (generation, _) = generation(dir.path(), m.base());
    let uffd = registered(&m, true);
    let (ours, mut criu, source) = start_tracking(dir.path(), &generation, &uffd, true);
    assert!(matches!(
        report::receive_report(&ours).unwrap(),
        Received::Uffd(_)
    ));
    criu.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
    assert_eq!(m.read(2, 0), 3);
    loop {
        match report::receive_report(&ours).unwrap() {
            Received::Done(_) => break,
            Received::Failed(why) => panic!("page source failed: {why}"),
            _ => {}
        }
    }
    // The worker keeps only the socket: the page source alone holds the descriptor now.
    drop(uffd);
    let me = std::process::id();
    let (base, len) = (m.base(), PAGES * P as u64);
    let written = || crate::written::written_pages_in(me, base, base + len).unwrap();
    assert_eq!(written(), 0, "pages read as written before any write");
    assert_eq!(m.read(9, 0), 10);
    // SAFETY: inside our mapping, every page of which is in.
    unsafe { *(m.0 as *mut u8).add(3 * P + 1) = 42 };
    assert_eq!(written(), 1);
    // Re-armed (as after a dump that becomes the next parent): nothing reads as written, and
    // the next write shows again. Ranges not registered for it are left alone.
    assert!(crate::written::rearm(me).unwrap() >= 1);
    assert_eq!(written(), 0, "a re-armed page still reads as written");
    // SAFETY: as above.
    unsafe { *(m.0 as *mut u8).add(4 * P) = 7 };
    assert_eq!(written(), 1);
    let answer = barrier(&ours);
    let since: u64 = answer
        .strip_prefix("since_us=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("tracking lost: {answer}"));
    assert!(since > 0);

    // Pages 8..12 move elsewhere: protected there, they would read as "as in the parent at
    // this address". The page source lifts their protection.
    // SAFETY: a fresh reservation to move onto, and a move of four pages of our mapping.
    let dest = unsafe {
        let reserved = libc::mmap(
            std::ptr::null_mut(),
            4 * P,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(reserved, libc::MAP_FAILED);
        libc::mremap(
            (base + 8 * P as u64) as *mut libc::c_void,
            4 * P,
            4 * P,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            reserved,
        )
    };
    assert_ne!(dest, libc::MAP_FAILED, "{}", io::Error::last_os_error());
    let answer = barrier(&ours);
    assert!(answer.starts_with("since_us="), "{answer}");
    let dest = dest as u64;
    assert_eq!(
        crate::written::written_pages_in(me, dest, dest + 4 * P as u64).unwrap(),
        4,
        "moved pages still read as unwritten"
    );
    // SAFETY: the moved pages, still holding the image's bytes.
    assert_eq!(unsafe { *(dest as *const u8).add(P) }, 10);
    assert_eq!(written(), 1, "the pages left in place changed state");

    drop(ours);
    drop(criu);
    source.join().unwrap().unwrap();
    // SAFETY: the moved pages' new mapping, ours.
    unsafe { libc::munmap(dest as *mut libc::c_void, 4 * P) };
}
