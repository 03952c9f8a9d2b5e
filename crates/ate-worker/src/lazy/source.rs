//! The page source: the process that serves a lazily restored actor's memory (`ate
//! page-source`, started by the worker for each lazy restore).
//!
//! It takes the place of `criu lazy-pages`: it listens on `lazy-pages.socket` in the restore's
//! work directory, where `criu restore --lazy-pages` sends the userfaultfd of each restored task
//! (a 4-byte pid, then the descriptor), then `LAZY_PAGES_RESTORE_FINISHED`. From then on:
//!
//! - a fault on a page still to come loads the 2 MiB chunk of the pages image that holds it
//!   (from the local image, or from the durable store when the generation was downloaded for a
//!   lazy restore: [`super::remote`]), checks the chunk's BLAKE3 digest against the generation's
//!   manifest, and copies every page of that chunk the task still lacks (so neighbouring faults
//!   cost nothing);
//! - a fault on a page the dump did not hold (or the task dropped since) gets the zero page;
//! - when no fault waits, the next chunk is pushed in the background, so the task soon depends
//!   on nothing;
//! - mremap/munmap/madvise(DONTNEED) and fork events keep the set of pages to come exact (a
//!   page the task dropped must never come back with old contents).
//!
//! Safety against wrong memory: every descriptor is also sent to the worker (`report` socket),
//! which holds it until this process has said `Done`. If this process dies or finds a damaged
//! chunk, the worker's copies keep the userfaultfd registered, so the task's faults block
//! instead of reading zero pages, and the worker kills the sandbox. Nothing here ever places a
//! page it did not verify.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ate_snapshot::{CHUNK_BYTES, FileEntry, Manifest};

use super::images::{self, ImageError};
use super::ranges::Pending;
use super::remote::{self, Remote};
use super::report::{Report, send_report};
use super::uffd::{self, Event, Placed};
use super::working_set::{self, Recorder, WorkingSet};

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
    exited: bool,
}

/// A pages image and its manifest entry (with the chunk digests). No file when the chunks
/// come from the durable store.
struct PagesFile {
    file: Option<File>,
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
}

/// Runs the page source until every page is in and the worker has acknowledged (or is gone).
/// `report` is the worker's end of the report socket (fd 3 of `ate page-source`).
pub fn run(generation: &Path, work_dir: &Path, report: UnixStream) -> Result<Stats, SourceError> {
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

impl Source {
    fn send(&mut self, report: Report) {
        if let Some(sock) = &self.report
            && send_report(sock, &report).is_err()
        {
            // The worker is gone (restarted): keep serving; nobody else can.
            self.report = None;
        }
    }

    fn serve(&mut self, client: UnixStream) -> Result<(), SourceError> {
        let mut client = Some(client);
        let mut finished = false;
        let mut done_sent = false;
        loop {
            let all_in = self.tasks.iter().all(|t| t.pending.is_empty());
            if finished && all_in && self.faults.is_empty() && !done_sent {
                self.stats.all_in_ms = self.begun.elapsed().as_millis() as u64;
                self.recorder.carry(&self.working_set);
                self.stats.working_set = self.recorder.len() as u64;
                self.stats.chunks_fetched = self.remote.as_ref().map_or(0, |r| r.fetched);
                if !self.recorder.is_empty()
                    && let Err(e) = self.recorder.write(&self.work_dir)
                {
                    // Only the next restore's prefetch is lost.
                    eprintln!("page source: cannot write the working set: {e}");
                }
                let summary = self.stats.summary();
                self.send(Report::Done(summary));
                done_sent = true;
            }
            // After Done: keep answering faults (zero pages) until the worker has closed its
            // copies of the descriptors, so no fault ever waits on a handler that is gone.
            if done_sent && self.report.is_none() {
                return Ok(());
            }
            if !finished && self.begun.elapsed() > RESTORE_TIMEOUT {
                return Err(SourceError::Protocol(format!(
                    "CRIU did not finish the restore within {RESTORE_TIMEOUT:?}"
                )));
            }
            let busy = !self.faults.is_empty() || (finished && !all_in && !self.push_stalled);
            let mut fds = Vec::with_capacity(self.tasks.len() + 3);
            let client_fd = client.as_ref().map(|c| c.as_raw_fd()).unwrap_or(-1);
            fds.push(pollfd(client_fd));
            let report_fd = if done_sent {
                self.report.as_ref().map(|r| r.as_raw_fd()).unwrap_or(-1)
            } else {
                -1
            };
            fds.push(pollfd(report_fd));
            fds.push(pollfd(self.remote.as_ref().map_or(-1, Remote::wake_fd)));
            for t in &self.tasks {
                fds.push(pollfd(if t.exited { -1 } else { t.uffd.as_raw_fd() }));
            }
            poll(&mut fds, if busy { 0 } else { 1000 })?;
            if fds[0].revents != 0
                && let Some(c) = client.as_mut()
            {
                match read_restore_message(c)? {
                    RestoreMessage::Task { pid, uffd } => self.add_task(pid, uffd)?,
                    RestoreMessage::Zombie => {}
                    RestoreMessage::Finished => {
                        finished = true;
                        self.stats.restore_finished_ms = self.begun.elapsed().as_millis() as u64;
                    }
                    RestoreMessage::Closed => {
                        if !finished {
                            return Err(SourceError::Protocol(
                                "CRIU closed the lazy-pages socket before the restore finished"
                                    .into(),
                            ));
                        }
                        client = None;
                    }
                }
            }
            if fds[1].revents != 0 {
                // The worker closed the report socket: it holds no descriptor any more.
                self.report = None;
            }
            let ready: Vec<usize> = fds[3..]
                .iter()
                .enumerate()
                .filter(|(_, p)| p.revents != 0)
                .map(|(i, _)| i)
                .collect();
            for i in ready {
                self.read_events(i)?;
            }
            self.serve_faults()?;
            if finished && self.faults.is_empty() {
                self.push_next_chunk()?;
            }
        }
    }

    fn add_task(&mut self, pid: i32, uffd: OwnedFd) -> Result<(), SourceError> {
        uffd::set_nonblocking(uffd.as_raw_fd()).map_err(io_err("userfaultfd flags"))?;
        // The worker's copy keeps the registration alive should this process die.
        self.send(Report::Uffd(uffd.as_raw_fd()));
        let pages = images::read_task_pages(&self.criu_dir, pid)?;
        self.open_pages_file(pages.pages_id)?;
        self.stats.tasks += 1;
        let pending = Pending::new(pages.lazy);
        // The previous restore's first faults of this task, mapped onto this dump's chunks.
        for &(ws_pid, addr, _) in &self.working_set.faults {
            if ws_pid != pid {
                continue;
            }
            if let Some(r) = pending.find(addr) {
                let key = (
                    pages.pages_id,
                    (r.img_offset + (addr - r.start)) / CHUNK_BYTES,
                );
                if self.hot_seen.insert(key) {
                    self.hot.push_back(key);
                }
            }
        }
        self.tasks.push(Task {
            pid,
            uffd,
            pages_id: pages.pages_id,
            pending,
            exited: false,
        });
        Ok(())
    }

    fn open_pages_file(&mut self, pages_id: u32) -> Result<(), SourceError> {
        if self.files.contains_key(&pages_id) {
            return Ok(());
        }
        let name = images::pages_file_name(pages_id);
        let rel = format!("{}/{name}", ate_snapshot::CRIU_DIR);
        let entry = self
            .manifest
            .file(&rel)
            .filter(|e| e.chunk_count() > 0 || e.size == 0)
            .cloned()
            .ok_or_else(|| {
                SourceError::Protocol(format!(
                    "the manifest has no chunk digests for {rel}: this generation cannot be restored lazily"
                ))
            })?;
        let file = match self.remote {
            Some(_) => None,
            None => {
                let path = self.criu_dir.join(&name);
                Some(File::open(&path).map_err(io_err(format!("open {}", path.display())))?)
            }
        };
        self.files.insert(pages_id, PagesFile { file, entry });
        Ok(())
    }

    fn read_events(&mut self, i: usize) -> Result<(), SourceError> {
        loop {
            let Some(task) = self.tasks.get_mut(i) else {
                return Ok(());
            };
            if task.exited {
                return Ok(());
            }
            let event = match uffd::read_event(task.uffd.as_raw_fd()) {
                Ok(Some(e)) => e,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(SourceError::Io {
                        what: format!("read userfaultfd of task {}", task.pid),
                        source: e,
                    });
                }
            };
            match event {
                Event::Pagefault { addr } => {
                    self.stats.faults += 1;
                    self.faults.push_back((i, addr & !(images::PAGE_SIZE - 1)));
                }
                Event::Remove { start, end } => task.pending.remove(start, end),
                Event::Remap { from, to, len } => task.pending.remap(from, to, len),
                Event::Fork { uffd } => {
                    // The child's memory is the parent's as of now: it lacks the same pages.
                    let child = Task {
                        pid: task.pid,
                        uffd,
                        pages_id: task.pages_id,
                        pending: task.pending.clone(),
                        exited: false,
                    };
                    self.send(Report::Uffd(child.uffd.as_raw_fd()));
                    self.tasks.push(child);
                }
            }
        }
    }

    /// Resolves queued faults; a fault that meets a changing address space stays queued until
    /// its events are read.
    fn serve_faults(&mut self) -> Result<(), SourceError> {
        let mut left = VecDeque::new();
        while let Some((i, page)) = self.faults.pop_front() {
            let Some(task) = self.tasks.get(i) else {
                continue;
            };
            if task.exited {
                continue;
            }
            let placed = match task.pending.find(page) {
                Some(range) => {
                    let chunk = (range.img_offset + (page - range.start)) / CHUNK_BYTES;
                    let pages_id = task.pages_id;
                    self.recorder.fault(task.pid, page, pages_id, chunk);
                    self.place_chunk(pages_id, chunk, true)?;
                    match self.tasks.get(i) {
                        Some(t) if t.pending.find(page).is_some() && !t.exited => Placed::Retry,
                        _ => Placed::Done,
                    }
                }
                None => {
                    let placed = uffd::zero(task.uffd.as_raw_fd(), page)
                        .map_err(io_err(format!("zero page for task {}", task.pid)))?;
                    if placed == Placed::Done {
                        self.stats.zero_pages += 1;
                    }
                    placed
                }
            };
            match placed {
                Placed::Retry => left.push_back((i, page)),
                Placed::Exited => self.task_exited(i),
                Placed::Done | Placed::Gone => {}
            }
        }
        self.faults = left;
        Ok(())
    }

    fn task_exited(&mut self, i: usize) {
        if let Some(t) = self.tasks.get_mut(i) {
            t.exited = true;
            t.pending = Pending::default();
        }
    }

    /// Pushes the chunk holding the first page any task still lacks.
    fn push_next_chunk(&mut self) -> Result<(), SourceError> {
        if let Some(delay) = self.push_delay {
            // Test-only (ATE_FAULT_PAGE_SOURCE_PUSH_DELAY_MS): keeps a restore lazy long enough
            // for a fault test to act in the middle of it. Faults are still served at once.
            std::thread::sleep(delay);
        }
        if self.remote.is_some() {
            return self.push_fetched_chunk();
        }
        // The working set first.
        while let Some((pages_id, chunk)) = self.hot.pop_front() {
            if self.chunk_pending(pages_id, chunk) {
                self.stats.prefetched += 1;
                return self.place_chunk(pages_id, chunk, false);
            }
        }
        let next = self.tasks.iter().filter(|t| !t.exited).find_map(|t| {
            t.pending
                .first()
                .map(|r| (t.pages_id, r.img_offset / CHUNK_BYTES))
        });
        if let Some((pages_id, chunk)) = next {
            self.place_chunk(pages_id, chunk, false)?;
        }
        Ok(())
    }

    /// The push from the durable store: keeps the next chunks any task lacks on their way and
    /// places one that has arrived; stalls (waits in poll) when none has.
    fn push_fetched_chunk(&mut self) -> Result<(), SourceError> {
        // The working set first (its chunks fetched in parallel), then by address.
        while let Some(&(pages_id, chunk)) = self.hot.front() {
            if self.chunk_pending(pages_id, chunk) {
                break;
            }
            self.hot.pop_front();
        }
        let Some(remote) = self.remote.as_mut() else {
            return Ok(());
        };
        remote.collect()?;
        let mut upcoming: Vec<remote::ChunkKey> = Vec::with_capacity(remote::PREFETCH);
        upcoming.extend(self.hot.iter().take(remote::PREFETCH).copied());
        'tasks: for t in self.tasks.iter().filter(|t| !t.exited) {
            if upcoming.len() >= remote::PREFETCH {
                break;
            }
            for r in t.pending.iter() {
                let last = r.img_end().saturating_sub(1) / CHUNK_BYTES;
                for chunk in r.img_offset / CHUNK_BYTES..=last {
                    let key = (t.pages_id, chunk);
                    if !upcoming.contains(&key) {
                        upcoming.push(key);
                        if upcoming.len() >= remote::PREFETCH {
                            break 'tasks;
                        }
                    }
                }
            }
        }
        for key in &upcoming {
            if remote.in_flight() >= remote::PREFETCH {
                break;
            }
            if let Some(f) = self.files.get(&key.0) {
                remote.request(*key, &f.entry);
            }
        }
        match upcoming.iter().find(|k| remote.is_ready(**k)).copied() {
            Some((pages_id, chunk)) => {
                self.push_stalled = false;
                if self.hot_seen.contains(&(pages_id, chunk)) {
                    self.stats.prefetched += 1;
                }
                self.place_chunk(pages_id, chunk, false)
            }
            None => {
                self.push_stalled = !upcoming.is_empty();
                Ok(())
            }
        }
    }

    /// True when a task served from pages image `pages_id` still lacks a page of chunk `chunk`.
    fn chunk_pending(&self, pages_id: u32, chunk: u64) -> bool {
        self.tasks.iter().any(|t| {
            !t.exited
                && t.pages_id == pages_id
                && !t
                    .pending
                    .in_image_span(chunk * CHUNK_BYTES, (chunk + 1) * CHUNK_BYTES)
                    .is_empty()
        })
    }

    /// Reads and verifies one chunk of a pages image and copies every page of it that any task
    /// served from that image still lacks.
    fn place_chunk(
        &mut self,
        pages_id: u32,
        chunk: u64,
        on_fault: bool,
    ) -> Result<(), SourceError> {
        let file = self
            .files
            .get(&pages_id)
            .ok_or_else(|| SourceError::Protocol(format!("pages image {pages_id} not open")))?;
        match (self.remote.as_mut(), &file.file) {
            (Some(remote), _) => {
                let key = (pages_id, chunk);
                self.buf = match remote.take(key) {
                    Some(data) => data,
                    None => remote.wait_for(key, &file.entry)?,
                };
            }
            (None, Some(local)) => {
                ate_snapshot::read_verified_chunk_at(local, &file.entry, chunk, &mut self.buf)?
            }
            (None, None) => {
                return Err(SourceError::Protocol(format!(
                    "pages image {pages_id} is not open"
                )));
            }
        }
        self.stats.chunks_read += 1;
        let span_start = chunk * CHUNK_BYTES;
        let span_end = span_start + self.buf.len() as u64;
        for i in 0..self.tasks.len() {
            let task = &mut self.tasks[i];
            if task.exited || task.pages_id != pages_id {
                continue;
            }
            for piece in task.pending.in_image_span(span_start, span_end) {
                let from = (piece.img_offset - span_start) as usize;
                let len = (piece.end - piece.start) as usize;
                let Some(data) = self.buf.get(from..from + len) else {
                    return Err(SourceError::Protocol(format!(
                        "pages of task {} at {:#x} lie past the end of pages image {pages_id}",
                        task.pid, piece.start
                    )));
                };
                let placed = uffd::copy(task.uffd.as_raw_fd(), piece.start, data)
                    .map_err(io_err(format!("copy pages into task {}", task.pid)))?;
                match placed {
                    Placed::Done | Placed::Gone => {
                        task.pending.remove(piece.start, piece.end);
                        let pages = piece.pages();
                        if on_fault {
                            self.stats.pages_on_fault += pages;
                        } else {
                            self.stats.pages_pushed += pages;
                        }
                    }
                    // Events are queued for this task: read them before placing more.
                    Placed::Retry => break,
                    Placed::Exited => {
                        task.exited = true;
                        task.pending = Pending::default();
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

enum RestoreMessage {
    Task { pid: i32, uffd: OwnedFd },
    Zombie,
    Finished,
    Closed,
}

/// One message of CRIU's side of the lazy-pages socket: a 4-byte pid followed by a 1-byte
/// message carrying the task's userfaultfd (SCM_RIGHTS), a negative pid (a zombie, no
/// descriptor), or the restore-finished marker.
fn read_restore_message(client: &mut UnixStream) -> Result<RestoreMessage, SourceError> {
    let mut word = [0u8; 4];
    let mut got = 0;
    while got < word.len() {
        match client.read(&mut word[got..]) {
            Ok(0) if got == 0 => return Ok(RestoreMessage::Closed),
            Ok(0) => {
                return Err(SourceError::Protocol(
                    "CRIU closed the lazy-pages socket mid-message".into(),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("read from CRIU")(e)),
        }
    }
    let value = i32::from_ne_bytes(word);
    if value == RESTORE_FINISHED {
        return Ok(RestoreMessage::Finished);
    }
    if value < 0 {
        return Ok(RestoreMessage::Zombie);
    }
    let fd = receive_fd(client.as_raw_fd())?;
    Ok(RestoreMessage::Task {
        pid: value,
        uffd: fd,
    })
}

fn receive_fd(sock: RawFd) -> Result<OwnedFd, SourceError> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| io_err("receive a userfaultfd from CRIU")(io::Error::from(e)))?;
    let mut received = None;
    for cmsg in msg
        .cmsgs()
        .map_err(|e| io_err("control message")(io::Error::from(e)))?
    {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: SCM_RIGHTS installed these descriptors in our table for us to own.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if received.is_none() {
                    received = Some(owned);
                }
            }
        }
    }
    received.ok_or_else(|| SourceError::Protocol("CRIU sent a task without its userfaultfd".into()))
}

/// `ate page-source --generation G --work-dir W`: runs [`run`] with the report socket the
/// worker passed as fd 3, leaves the outcome in `W/page-source.status` (`done`, or `failed: …`;
/// a restarted worker reads it before adopting the sandbox) and tells the worker if it fails.
pub fn main(generation: &Path, work_dir: &Path) -> Result<Stats, SourceError> {
    // SAFETY: fd 3 is the report socket the worker set up for exactly this process
    // (`watch::REPORT_FD`); it is checked to be a socket before use and owned from here on.
    let report = unsafe { OwnedFd::from_raw_fd(super::watch::REPORT_FD) };
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
    let status_path = work_dir.join(super::STATUS_FILE);
    let failure_channel = report.try_clone().ok();
    let result = run(generation, work_dir, report);
    let status = match &result {
        Ok(_) => "done\n".to_string(),
        Err(e) => format!("failed: {e}\n"),
    };
    if let Err(e) = &result
        && let Some(sock) = &failure_channel
    {
        let _ = send_report(sock, &Report::Failed(e.to_string()));
    }
    let _ = std::fs::write(&status_path, status);
    result
}

/// The page source against a real userfaultfd, with this test playing CRIU: it registers an
/// anonymous mapping, hands the descriptor over the lazy-pages socket, and reads its memory.
#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::super::images::fixtures;
    use super::super::report::{self, Received};
    use super::*;

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
        // SAFETY: plain syscall; the descriptor is owned below.
        let raw =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
                as RawFd;
        assert!(raw >= 0, "userfaultfd: {}", io::Error::last_os_error());
        // SAFETY: just created, owned here.
        let uffd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURES,
            ioctls: 0,
        };
        // SAFETY: valid struct for the call.
        unsafe { uffdio_api(uffd.as_raw_fd(), &mut api) }.unwrap();
        let mut reg = UffdioRegister {
            start: m.base(),
            len: PAGES * P as u64,
            mode: 1, // UFFDIO_REGISTER_MODE_MISSING
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
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let (ours, theirs) = report::pair().unwrap();
        let (generation, work2) = (generation.to_path_buf(), work.clone());
        let source = std::thread::spawn(move || run(&generation, &work2, theirs));
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
}
