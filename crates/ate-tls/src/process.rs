//! What every component's process does at its edges, in one place: wait for the signal to stop,
//! and announce that it is serving through a ready file.

use std::fmt;
use std::path::Path;

use tokio::signal::unix::{SignalKind, signal};

use crate::error::TlsError;

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        })
    }
}

/// Resolves at the first SIGINT or SIGTERM. The handlers are installed by this call, not at the
/// first poll, so a signal sent while a component is still binding its listeners stops it
/// cleanly instead of killing it. Must be called inside a Tokio runtime. A handler that cannot
/// be installed (never seen in practice) leaves that signal's default action and is logged.
pub fn shutdown_signal() -> impl Future<Output = Signal> + Send + 'static {
    let install = |kind: SignalKind, name: Signal| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot install the {name} handler");
            None
        }
    };
    let int = install(SignalKind::interrupt(), Signal::Interrupt);
    let term = install(SignalKind::terminate(), Signal::Terminate);
    async move {
        tokio::select! {
            () = arrival(int) => Signal::Interrupt,
            () = arrival(term) => Signal::Terminate,
        }
    }
}

/// Resolves when `handler` sees its signal; never without a handler.
async fn arrival(handler: Option<tokio::signal::unix::Signal>) {
    // `recv` yields None only once the runtime's driver is gone: the signal can no longer come.
    if let Some(mut s) = handler
        && s.recv().await.is_some()
    {
        return;
    }
    std::future::pending::<()>().await
}

/// Mode of ready files: read by `ate up`, tests and operators' scripts, written by the component.
pub const READY_FILE_MODE: u32 = 0o644;

/// Writes a component's ready file (`--ready-file`: its bound addresses as JSON) atomically, so a
/// reader polling for it never sees a partial file.
pub fn write_ready_file(path: &Path, body: &str) -> Result<(), TlsError> {
    crate::write_atomic(path, body.as_bytes(), READY_FILE_MODE)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use super::*;

    #[test]
    fn ready_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        write_ready_file(&path, r#"{"grpc":"127.0.0.1:1"}"#).unwrap();
        write_ready_file(&path, r#"{"grpc":"127.0.0.1:2"}"#).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"grpc":"127.0.0.1:2"}"#
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, READY_FILE_MODE);
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["ready.json"]);
    }

    #[test]
    fn ready_file_readers_never_see_a_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        let bodies = ["a".repeat(64 * 1024), "b".repeat(64 * 1024)];
        write_ready_file(&path, &bodies[0]).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, stop, bodies) = (path.clone(), stop.clone(), bodies.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let text = std::fs::read_to_string(&path).unwrap();
                    assert!(
                        bodies.contains(&text),
                        "partial read of {} bytes",
                        text.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..200 {
            write_ready_file(&path, &bodies[i % 2]).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn ready_file_in_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent").join("ready.json");
        assert!(write_ready_file(&path, "{}").is_err());
    }

    #[tokio::test]
    async fn shutdown_signal_resolves_on_sigterm_and_names_it() {
        let stop = shutdown_signal();
        // Installed at the call: raising before the first poll neither kills the test process
        // nor is lost.
        nix_raise(libc::SIGTERM);
        let got = tokio::time::timeout(Duration::from_secs(5), stop)
            .await
            .expect("SIGTERM seen");
        assert_eq!(got, Signal::Terminate);
        assert_eq!(got.to_string(), "SIGTERM");
        assert_eq!(Signal::Interrupt.to_string(), "SIGINT");
    }

    fn nix_raise(sig: libc::c_int) {
        // SAFETY: raise only sends a signal to this process; a handler is installed for it.
        let rc = unsafe { libc::raise(sig) };
        assert_eq!(rc, 0);
    }
}
