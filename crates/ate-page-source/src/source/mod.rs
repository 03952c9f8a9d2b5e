//! The page source: the process that serves a lazily restored actor's memory (`ate
//! page-source`, started by the worker for each lazy restore).
//!
//! It takes the place of `criu lazy-pages`: it listens on `lazy-pages.socket` in the restore's
//! work directory, where `criu restore --lazy-pages` sends the userfaultfd of each restored task
//! (a 4-byte pid, then the descriptor), then `LAZY_PAGES_RESTORE_FINISHED`. From then on:
//!
//! - a fault on a page still to come loads the 2 MiB chunk of the pages image that holds it
//!   (from the local image, or from the durable store when the generation was downloaded for a
//!   lazy restore: [`crate::remote`]), checks the chunk's BLAKE3 digest against the generation's
//!   manifest, and copies every page of that chunk the task still lacks (so neighbouring faults
//!   cost nothing);
//! - a fault on a page the dump did not hold (or the task dropped since) gets the zero page;
//! - when no fault waits, the next chunk is pushed in the background, so the task soon depends
//!   on nothing;
//! - mremap/munmap/madvise(DONTNEED) and fork events keep the set of pages to come exact (a
//!   page the task dropped must never come back with old contents).
//!
//! Memory tracking (`--write-protect`, CRIU started with `lazy-pages-wp`): the tasks' lazy
//! ranges are registered for write protection too, and every page placed where the dump found
//! it is placed write-protected. A page that still is at suspend time holds what the parent
//! image holds at its address, so an incremental dump (`--track-mem-uffd-since`, CRIU patch
//! 0003) leaves it to the parent. What would break that rule is handled here: pages moved by
//! `mremap` lose their protection (and pending pages moved are placed unprotected); a dropped
//! page comes back as the zero page, never protected. Once every page is in, this process
//! stays while the worker keeps the report socket open, holding the descriptors (closing the
//! last one clears every protection, which is safe: all pages then read as written) and
//! answering the worker's barrier before each dump: every event read and handled, and whether
//! tracking still holds.
//!
//! Safety against wrong memory: every descriptor is also sent to the worker (`report` socket),
//! which holds it until this process has said `Done`. If this process dies or finds a damaged
//! chunk, the worker's copies keep the userfaultfd registered, so the task's faults block
//! instead of reading zero pages, and the worker kills the sandbox. Nothing here ever places a
//! page it did not verify.

pub mod criu;
mod push;
mod serve;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ate_generation::images::ImageError;
use ate_snapshot::{CHUNK_BYTES, FileEntry, Manifest};

use crate::ranges::Pending;
use crate::remote::Remote;
use crate::report::{Report, send_report};
use crate::working_set::{self, Recorder, WorkingSet};

/// Name CRIU connects to, relative to the restore's work directory (criu/uffd.c).
pub const SOCKET_NAME: &str = "lazy-pages.socket";
/// `LAZY_PAGES_RESTORE_FINISHED` ("RSTF"): all tasks are restored.
const RESTORE_FINISHED: i32 = 0x5253_5446;
/// How long to wait for CRIU to connect and finish restoring.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    Image(#[from] ImageError),
    #[error("{0}")]
    Snapshot(#[from] ate_snapshot::Error),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{0}")]
    Protocol(String),
}

impl SourceError {
    /// The generation's own content is wrong (a chunk that does not match its digest, a file of
    /// another size): no restore of this copy can succeed, unlike a page source that failed. A
    /// missing chunk is not counted: the pages images are open before the actor runs, so it is
    /// an object missing from the durable store, which may be back for the next attempt.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            SourceError::Snapshot(e)
                if e.is_corrupt() && !matches!(e, ate_snapshot::Error::MissingFile { .. })
        )
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> SourceError {
    let what = what.into();
    move |source| SourceError::Io { what, source }
}

/// Counters reported to the worker when every page is in.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub tasks: u32,
    pub faults: u64,
    pub zero_pages: u64,
    pub pages_on_fault: u64,
    pub pages_pushed: u64,
    pub chunks_read: u64,
    /// Of `chunks_read`, those fetched from the durable store.
    pub chunks_fetched: u64,
    /// Chunks pushed first because the previous restore's working set named them.
    pub prefetched: u64,
    /// Entries of the working set recorded for the next restore.
    pub working_set: u64,
    pub restore_finished_ms: u64,
    pub all_in_ms: u64,
}

impl Stats {
    pub fn summary(&self) -> String {
        format!(
            "tasks={} faults={} zero_pages={} pages_on_fault={} pages_pushed={} chunks={} fetched={} prefetched={} working_set={} restore_ms={} all_in_ms={}",
            self.tasks,
            self.faults,
            self.zero_pages,
            self.pages_on_fault,
            self.pages_pushed,
            self.chunks_read,
            self.chunks_fetched,
            self.prefetched,
            self.working_set,
            self.restore_finished_ms,
            self.all_in_ms
        )
    }
}

/// One restored task (or a child it forked).
struct Task {
    pid: i32,
    uffd: OwnedFd,
    pages_id: u32,
    pending: Pending,
    /// The pending set as the images gave it, before any event: where pages are "in place".
    origin: std::sync::Arc<Pending>,
    exited: bool,
}

/// Dirty tracking by write protection, when the restore asked for it.
#[derive(Debug, Default)]
struct Tracking {
    /// CLOCK_BOOTTIME (µs) when CRIU said the restore finished: tasks started later (forked
    /// since) are not tracked against the parent images and are dumped whole.
    since_us: u64,
    /// Why tracking no longer holds (the next dump must be whole).
    lost: Option<String>,
    /// Ranges moved by `mremap` whose protection is still to be lifted: (task, start, len).
    to_unprotect: Vec<(usize, u64, u64)>,
}

/// A pages image and its manifest entry (with the chunk digests). No file when the chunks
/// come from the durable store.
struct PagesFile {
    file: Option<ate_snapshot::MemoryFile>,
    entry: FileEntry,
}

struct Source {
    criu_dir: PathBuf,
    manifest: Manifest,
    files: BTreeMap<u32, PagesFile>,
    tasks: Vec<Task>,
    /// Faults not yet resolved: (task index, page address).
    faults: VecDeque<(usize, u64)>,
    buf: Vec<u8>,
    stats: Stats,
    report: Option<UnixStream>,
    begun: Instant,
    push_delay: Option<Duration>,
    /// The durable store, when only part of the generation is local.
    remote: Option<Remote>,
    /// The background push waits for chunks on their way from the store.
    push_stalled: bool,
    work_dir: PathBuf,
    /// The working set the generation carries (the previous restore's first faults).
    working_set: WorkingSet,
    /// Chunks of that working set, in fault order: pushed before any other.
    hot: VecDeque<(u32, u64)>,
    hot_seen: HashSet<(u32, u64)>,
    /// This restore's first faults, for the next generation.
    recorder: Recorder,
    /// Memory tracking (`--write-protect`): pages in place are placed write-protected.
    tracking: Option<Tracking>,
}

/// Runs the page source until every page is in and the worker has acknowledged (or is gone).
/// `report` is the worker's end of the report socket (fd 3 of `ate page-source`).
pub fn run(
    generation: &Path,
    work_dir: &Path,
    report: UnixStream,
    write_protect: bool,
) -> Result<Stats, SourceError> {
    let begun = Instant::now();
    let manifest_path = generation.join(ate_snapshot::MANIFEST_FILE);
    let bytes = std::fs::read(&manifest_path)
        .map_err(io_err(format!("read {}", manifest_path.display())))?;
    let manifest = Manifest::from_json(&bytes)?;
    let remote = ate_snapshot::durable_source(generation)?
        .map(|s| Remote::new(&s, generation))
        .transpose()?;
    // CRIU connects to the name relative to the work dir. A long state path would not fit in a
    // socket address: then bind relative to it, from inside it.
    let mut socket_path = work_dir.join(SOCKET_NAME);
    if socket_path.as_os_str().len() >= 100 {
        std::env::set_current_dir(work_dir)
            .map_err(io_err(format!("chdir {}", work_dir.display())))?;
        socket_path = PathBuf::from(SOCKET_NAME);
    }
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path).map_err(io_err(format!(
        "listen on {}/{SOCKET_NAME}",
        work_dir.display()
    )))?;
    let mut source = Source {
        criu_dir: generation.join(ate_snapshot::CRIU_DIR),
        manifest,
        files: BTreeMap::new(),
        tasks: Vec::new(),
        faults: VecDeque::new(),
        buf: Vec::with_capacity(CHUNK_BYTES as usize),
        stats: Stats::default(),
        report: Some(report),
        begun,
        push_delay: std::env::var("ATE_FAULT_PAGE_SOURCE_PUSH_DELAY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis),
        remote,
        push_stalled: false,
        work_dir: work_dir.to_path_buf(),
        working_set: working_set::read(&generation.join(ate_snapshot::CRIU_DIR)),
        hot: VecDeque::new(),
        hot_seen: HashSet::new(),
        recorder: Recorder::default(),
        tracking: write_protect.then(Tracking::default),
    };
    source.send(Report::Listening);
    let client = accept_within(&listener, RESTORE_TIMEOUT)?;
    drop(listener);
    let _ = std::fs::remove_file(&socket_path);
    source.serve(client)?;
    Ok(source.stats)
}

fn accept_within(listener: &UnixListener, timeout: Duration) -> Result<UnixStream, SourceError> {
    let mut fds = [libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ready = poll(&mut fds, timeout.as_millis() as i32)?;
    if ready == 0 {
        return Err(SourceError::Protocol(format!(
            "CRIU did not connect within {timeout:?}"
        )));
    }
    let (client, _) = listener.accept().map_err(io_err("accept CRIU"))?;
    Ok(client)
}

fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, SourceError> {
    loop {
        // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(SourceError::Io {
                what: "poll".into(),
                source: e,
            });
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `ate page-source --generation G --work-dir W [--write-protect]`: runs [`run`] with the report socket the
/// worker passed as fd 3, leaves the outcome in `W/page-source.status` (`done`, or `failed: …`;
/// a restarted worker reads it before adopting the sandbox) and tells the worker if it fails.
pub fn main(generation: &Path, work_dir: &Path, write_protect: bool) -> Result<Stats, SourceError> {
    // SAFETY: fd 3 is the report socket the worker set up for exactly this process
    // (`REPORT_FD`); it is checked to be a socket before use and owned from here on.
    let report = unsafe { OwnedFd::from_raw_fd(crate::REPORT_FD) };
    let is_socket = nix::sys::stat::fstat(&report)
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK)
        .unwrap_or(false);
    if !is_socket {
        std::mem::forget(report);
        return Err(SourceError::Protocol(
            "fd 3 is not the worker's report socket (ate page-source is started by workers)".into(),
        ));
    }
    let report = UnixStream::from(report);
    // The status goes into this restore's own work dir, opened now: a page source that outlived
    // its worker and its restore must not write into the dir of a later restore of the actor
    // (same path, new dir), whose adoption would read a failure that is not its own.
    let own_dir = std::fs::File::open(work_dir).ok();
    let failure_channel = report.try_clone().ok();
    let result = run(generation, work_dir, report, write_protect);
    let status = match &result {
        Ok(_) => "done\n".to_string(),
        Err(e) => format!("failed: {e}\n"),
    };
    if let Err(e) = &result
        && let Some(sock) = &failure_channel
    {
        let report = if e.is_damage() {
            Report::Damaged(e.to_string())
        } else {
            Report::Failed(e.to_string())
        };
        let _ = send_report(sock, &report);
    }
    if let Some(dir) = &own_dir {
        let _ = write_status(dir, &status);
    }
    result
}

/// Writes [`crate::STATUS_FILE`] into `dir` (an open directory; nothing if it was removed).
fn write_status(dir: &std::fs::File, status: &str) -> nix::Result<()> {
    use nix::fcntl::OFlag;
    let fd = nix::fcntl::openat(
        dir,
        crate::STATUS_FILE,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, status.as_bytes()).map_err(|e| {
        e.raw_os_error()
            .map_or(nix::Error::EIO, nix::Error::from_raw)
    })
}

/// The page source against a real userfaultfd, with this test playing CRIU: it registers an
/// anonymous mapping, hands the descriptor over the lazy-pages socket, and reads its memory.
#[cfg(test)]
mod tests;
