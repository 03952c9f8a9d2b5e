//! Where an upload's blocking work runs: the blocking pool, or a thread of its own at the lowest
//! CPU priority.

use std::io;

use crate::error::{Error, Result};

/// How an upload shares the cores with the rest of the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadPriority {
    /// Tokio's blocking pool at normal priority: someone waits for this upload (a DURABLE
    /// suspend, a detach before a move).
    #[default]
    Normal,
    /// A thread of its own at nice [`BACKGROUND_NICE`]: the upload after an ASYNC suspend,
    /// which nobody waits for. Its hashing and zstd (~0.1 s of CPU per 50 MiB) then take only
    /// the CPU that resumes and requests leave over, instead of an equal share of it.
    Background,
}

/// Nice value of background compression threads (the lowest priority).
pub const BACKGROUND_NICE: i32 = 19;

/// Starts blocking `work` at once at `priority`: on the blocking pool, or for
/// [`UploadPriority::Background`] on a thread of its own at [`BACKGROUND_NICE`] (not the shared
/// pool: the nice value stays with the thread, and a pool thread kept at nice 19 would slow
/// whatever it runs next). The receiver gets its result (dropped without one only if it panicked).
pub(super) fn spawn_at<T: Send + 'static>(
    priority: UploadPriority,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<T>> {
    let (done, result) = tokio::sync::oneshot::channel();
    let work = move || {
        let _ = done.send(work());
    };
    match priority {
        UploadPriority::Normal => {
            tokio::task::spawn_blocking(work);
        }
        UploadPriority::Background => {
            std::thread::Builder::new()
                .name("ate-upload-bg".into())
                .spawn(move || {
                    lower_this_thread_priority(BACKGROUND_NICE);
                    work();
                })
                .map_err(|e| Error::Task {
                    what: "start a background compression thread".into(),
                    message: e.to_string(),
                })?;
        }
    }
    Ok(result)
}

/// [`spawn_at`], awaited.
pub(crate) async fn run_at<T: Send + 'static>(
    priority: UploadPriority,
    what: String,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    spawn_at(priority, work)?.await.map_err(|_| Error::Task {
        what,
        message: "the work ended without a result".into(),
    })?
}

/// Sets the calling thread's nice value to `nice` (Linux keeps nice per thread; processes the
/// thread starts inherit it). Best effort: on failure the work runs at normal priority. Also
/// used by the worker's background threads.
pub fn lower_this_thread_priority(nice: i32) {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority only reads its integer arguments; `tid` is this thread's own id.
    let rc = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::id_t::try_from(tid).unwrap_or(0),
            nice,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "could not lower a background thread's priority");
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// Field 19 of `/proc/thread-self/stat`: the calling thread's nice value.
    fn this_thread_nice() -> i32 {
        let stat = fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
        // The command name (field 2) may hold spaces; count from the closing parenthesis.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        after
            .split_whitespace()
            .nth(16)
            .and_then(|v| v.parse().ok())
            .unwrap_or(i32::MIN)
    }

    #[test]
    fn background_threads_run_at_the_lowest_priority_and_others_do_not() {
        let before = this_thread_nice();
        let lowered = std::thread::spawn(|| {
            lower_this_thread_priority(BACKGROUND_NICE);
            this_thread_nice()
        })
        .join()
        .unwrap_or(i32::MIN);
        assert_eq!(lowered, BACKGROUND_NICE);
        // Only that thread: the test's own thread keeps its nice value.
        assert_eq!(this_thread_nice(), before);
    }
}
