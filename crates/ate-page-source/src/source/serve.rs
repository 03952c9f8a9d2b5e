//! The serve loop: CRIU's messages, userfaultfd events, and faults answered as they come.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use ate_snapshot::CHUNK_BYTES;

use super::criu::{RestoreMessage, read_restore_message};
use super::{PagesFile, RESTORE_TIMEOUT, Source, SourceError, Task, io_err, poll, pollfd};
use crate::ranges::Pending;
use crate::remote::Remote;
use crate::report::{self, Report, send_report};
use crate::uffd::{self, Event, Placed};
use ate_generation::images;

impl Source {
    pub(super) fn send(&mut self, report: Report) {
        if let Some(sock) = &self.report
            && send_report(sock, &report).is_err()
        {
            // The worker is gone (restarted): keep serving; nobody else can.
            self.report = None;
        }
    }

    pub(super) fn serve(&mut self, client: UnixStream) -> Result<(), SourceError> {
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
                // Said on disk at once, not only at exit: a tracking page source stays for the
                // actor's life, and a restarted worker adopts the sandbox only on `done`.
                if let Ok(dir) = std::fs::File::open(&self.work_dir) {
                    let _ = super::write_status(&dir, "done\n");
                }
                self.send(Report::Done(summary));
                done_sent = true;
                // Nothing is read from the images any more; a tracked restore's page source
                // stays for the actor's life, so it keeps as little as it can.
                self.buf = Vec::new();
                self.files.clear();
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
                        if let Some(t) = self.tracking.as_mut() {
                            t.since_us = boottime_us();
                        }
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
            if fds[1].revents != 0 && !self.answer_worker()? {
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
            self.unprotect_moved();
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
        let origin = std::sync::Arc::new(pending.clone());
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
            origin,
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
        // A sealed generation's chunks are opened from its sealed image (the scratch dir the
        // restore reads holds only the chunks CRIU reads itself).
        let file = match self.remote {
            Some(_) => None,
            None => {
                let gen_dir = self.criu_dir.parent().unwrap_or(&self.criu_dir);
                Some(ate_snapshot::MemoryFile::open(gen_dir, &entry)?)
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
                Event::Remap { from, to, len } => {
                    task.pending.remap(from, to, len);
                    // Pages moved with their write protection would read as "as in the parent
                    // image" at an address where the parent holds something else.
                    if let Some(t) = self.tracking.as_mut() {
                        t.to_unprotect.push((i, to, len));
                    }
                }
                Event::Fork { uffd } => {
                    // The child's memory is the parent's as of now: it lacks the same pages.
                    let child = Task {
                        pid: task.pid,
                        uffd,
                        pages_id: task.pages_id,
                        pending: task.pending.clone(),
                        origin: task.origin.clone(),
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
                    // Tracking: a copy of zeros, which also fills a write-protection marker
                    // (UFFDIO_ZEROPAGE refuses one, and the fault would come back forever).
                    let placed = if self.tracking.is_some() {
                        uffd::copy(task.uffd.as_raw_fd(), page, &ZEROS, false)
                    } else {
                        uffd::zero(task.uffd.as_raw_fd(), page)
                    }
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

    /// Lifts the write protection of ranges moved by `mremap`; one the kernel refuses for
    /// another reason than a change in progress ends tracking (the next dump is whole).
    fn unprotect_moved(&mut self) {
        let Some(tracking) = self.tracking.as_mut() else {
            return;
        };
        let tasks = &self.tasks;
        tracking.to_unprotect.retain(|&(i, start, len)| {
            let Some(task) = tasks.get(i).filter(|t| !t.exited) else {
                return false;
            };
            match uffd::unprotect(task.uffd.as_raw_fd(), start, len) {
                Ok(done) => !done,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => false,
                Err(e) => {
                    tracking.lost.get_or_insert_with(|| {
                        format!(
                            "write protection of {len:#x} bytes moved to {start:#x} in task {} could not be lifted: {e}",
                            task.pid
                        )
                    });
                    false
                }
            }
        });
    }

    /// A request from the worker on the report socket; `Ok(false)` once it closed it.
    fn answer_worker(&mut self) -> Result<bool, SourceError> {
        let Some(sock) = self.report.as_ref() else {
            return Ok(false);
        };
        let mut byte = [0u8; 1];
        let n = match std::io::Read::read(&mut &*sock, &mut byte) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(true),
            Err(_) => 0,
        };
        if n == 0 {
            return Ok(false);
        }
        if byte[0] == report::BARRIER {
            let state = self.barrier()?;
            self.send(Report::Tracking(state));
        }
        Ok(true)
    }

    /// Before a dump (the tasks frozen, so no new event can come): every queued event read and
    /// handled, and whether tracking still holds: `since_us=N`, or `lost: why`.
    fn barrier(&mut self) -> Result<String, SourceError> {
        for _ in 0..100 {
            for i in 0..self.tasks.len() {
                self.read_events(i)?;
            }
            self.unprotect_moved();
            self.serve_faults()?;
            if self
                .tracking
                .as_ref()
                .is_none_or(|t| t.to_unprotect.is_empty())
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let Some(tracking) = self.tracking.as_mut() else {
            return Ok("lost: this restore was not tracked".into());
        };
        if !tracking.to_unprotect.is_empty() && tracking.lost.is_none() {
            tracking.lost = Some("a range moved by mremap stayed write-protected".into());
        }
        Ok(match &tracking.lost {
            Some(why) => format!("lost: {why}"),
            None if tracking.since_us == 0 => "lost: the restore never finished".into(),
            None => format!("since_us={}", tracking.since_us),
        })
    }

    fn task_exited(&mut self, i: usize) {
        if let Some(t) = self.tasks.get_mut(i) {
            t.exited = true;
            t.pending = Pending::default();
        }
    }
}

/// One page of zeros.
static ZEROS: [u8; images::PAGE_SIZE as usize] = [0; images::PAGE_SIZE as usize];

/// CLOCK_BOOTTIME in µs: the clock of `/proc/<pid>/stat`'s start time and of `/proc/uptime`,
/// which CRIU compares tasks' start times with.
fn boottime_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}
