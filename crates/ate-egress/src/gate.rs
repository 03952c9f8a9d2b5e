//! The egress gate: an actor's egress is on before its first instruction runs (issue 37).
//!
//! The sandbox's netns exists only once runc made it (in a user namespace) or, at the latest,
//! when runc runs the OCI `createRuntime` hooks — which it does before the container's process
//! starts at `runc run`, and at CRIU's `setup-namespaces` step of a restore, before any task is
//! restored. The hook ([`HOOK`]) therefore opens the gate: it says "up" on one FIFO in the
//! actor's dir and waits for the worker's answer on another; the worker ([`Gate::serve`])
//! starts the egress proxy and loads the redirect in the netns meanwhile, then answers `ok`
//! (or the error, which fails the hook and so the start). Without the FIFOs (a runtime driven
//! without a worker, as in the runtime's own tests) the hook lets the start go on.
//!
//! Why FIFOs: the hook is a shell script runc runs on the host, and `sh` can open a FIFO but
//! not a socket. The worker opens both ends read-write so neither open ever blocks or sees
//! end-of-file early, and keeps the answer's end open until the boot returns: a FIFO's buffer
//! lives only while some end is open.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;

/// The FIFO the hook writes `up` into once the netns is set up.
const READY: &str = "ready";
/// The FIFO the worker answers on: `ok`, or why egress could not start.
const ANSWER: &str = "answer";

/// The `createRuntime` hook's part that waits for the worker (`$1`: the gate dir; nothing to
/// wait for when it holds no FIFO). Its exit status is the hook's.
pub const HOOK: &str = r#"g=$1
if [ -n "$g" ] && [ -p "$g/ready" ]; then
  echo up > "$g/ready"
  answer="no answer from the worker"
  read -r answer < "$g/answer" || true
  [ "$answer" = ok ] || { echo "egress: $answer" >&2; exit 1; }
fi
"#;

/// One start's gate: its FIFOs exist from [`Gate::open`] until the gate is dropped.
#[derive(Debug)]
pub struct Gate {
    dir: PathBuf,
    ready: Option<pipe::Receiver>,
    /// Held until the gate is dropped, so the hook can still read the answer.
    answer: Option<pipe::Sender>,
}

impl Gate {
    /// Makes the gate's FIFOs in `dir` (anything there from an earlier life is replaced) and
    /// opens the hook's side for reading.
    pub fn open(dir: &Path) -> io::Result<Gate> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(dir)?;
        for name in [READY, ANSWER] {
            nix::unistd::mkfifo(
                &dir.join(name),
                nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
            )
            .map_err(io::Error::from)?;
        }
        let ready = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(dir.join(READY))?;
        Ok(Gate {
            dir: dir.to_path_buf(),
            ready: Some(ready),
            answer: None,
        })
    }

    /// Waits for the hook's `up`, runs `start` (the egress proxy and redirect), and answers
    /// the hook with its outcome, which it also returns. Pending until the hook runs: the
    /// caller races it against the boot.
    pub async fn serve<F, Fut>(&mut self, start: F) -> io::Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = io::Result<()>>,
    {
        let Some(ready) = self.ready.take() else {
            return Err(io::Error::other("the egress gate was already served"));
        };
        let mut line = String::new();
        BufReader::new(ready).read_line(&mut line).await?;
        let started = start().await;
        let answer = match &started {
            Ok(()) => "ok\n".to_string(),
            // One line: the hook reads one.
            Err(e) => format!("{}\n", e.to_string().replace('\n', " ")),
        };
        let mut tx = pipe::OpenOptions::new()
            .read_write(true)
            .open_sender(self.dir.join(ANSWER))?;
        tx.write_all(answer.as_bytes()).await?;
        self.answer = Some(tx);
        started
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // A hook still waiting for an answer (the boot ended without serving it: runc killed,
        // the start abandoned) gets one, so it ends instead of waiting for a runc that may be
        // gone to time it out. Non-blocking, read-write: never waits for a reader.
        if self.answer.is_none() {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(self.dir.join(ANSWER))
            {
                let _ = f.write_all(b"the worker abandoned this start\n");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook script against a real gate: it waits for the worker and passes its answer on.
    async fn run_hook(dir: &Path) -> std::process::Output {
        tokio::process::Command::new("sh")
            .args(["-c", HOOK, "gate-test"])
            .arg(dir)
            .output()
            .await
            .unwrap_or_else(|e| panic!("sh: {e}"))
    }

    #[tokio::test]
    async fn the_hook_waits_for_egress_and_fails_with_its_error() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let dir = tmp.path().join("gate");

        let mut gate = Gate::open(&dir).unwrap_or_else(|e| panic!("open: {e}"));
        let mut started = false;
        let (served, hook) = tokio::join!(
            gate.serve(|| {
                started = true;
                async { Ok(()) }
            }),
            run_hook(&dir)
        );
        assert!(served.is_ok());
        assert!(started);
        assert!(hook.status.success(), "{hook:?}");
        drop(gate);
        assert!(!dir.exists(), "the gate's FIFOs are removed with it");

        let mut gate = Gate::open(&dir).unwrap_or_else(|e| panic!("open: {e}"));
        let (served, hook) = tokio::join!(
            gate.serve(|| async { Err(io::Error::other("no listener\nin netns")) }),
            run_hook(&dir)
        );
        assert!(served.is_err());
        assert!(!hook.status.success());
        let stderr = String::from_utf8_lossy(&hook.stderr);
        assert!(stderr.contains("egress: no listener in netns"), "{stderr}");
    }

    #[tokio::test]
    async fn a_gate_dropped_unserved_ends_the_waiting_hook() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let dir = tmp.path().join("gate");
        let gate = Gate::open(&dir).unwrap_or_else(|e| panic!("open: {e}"));
        let hook = tokio::spawn({
            let dir = dir.clone();
            async move { run_hook(&dir).await }
        });
        // The hook said "up" and waits for the answer nobody serves.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        drop(gate);
        let out = tokio::time::timeout(std::time::Duration::from_secs(5), hook)
            .await
            .unwrap_or_else(|_| panic!("the hook still waits after the gate was dropped"))
            .unwrap_or_else(|e| panic!("join: {e}"));
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("abandoned"), "{stderr}");
    }

    #[tokio::test]
    async fn without_a_gate_the_hook_goes_on() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let hook = run_hook(&tmp.path().join("none")).await;
        assert!(hook.status.success(), "{hook:?}");
    }
}
