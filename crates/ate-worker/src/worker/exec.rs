//! Exec: a command in an active actor's sandbox, as a session that streams its I/O.
//!
//! A session starts only while the actor serves here (its ingress on: not while a start, a
//! checkpoint or a stop decides its fate), under the actor's lock, so a checkpoint that
//! follows sees it registered. While it lasts it counts as an open stream in Activity (the
//! actor is not idle). Ingress off (a suspend, a stop, the actor's exit) ends every session of
//! the actor before anything else happens to the sandbox: the command's process tree is killed
//! (a memory dump must not find a process whose parent is the worker), and the caller gets why
//! as the exit's message. A caller that goes away ends its session the same way, so nothing it
//! started stays in the sandbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_core::ActorRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use super::{VerbError, Worker, key_of, sandbox_error};
use crate::exec::{Exec, ExecIo, ExecProcess, ExecSpec, Pty, kill_tree, wait_exit};

/// How long a session waits, after its command exited, for the last output that processes it
/// left behind may still hold open.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);
/// How long ending a session waits for its process tree to be gone.
const END_WAIT: Duration = Duration::from_secs(5);
/// Output read at once.
const CHUNK: usize = 32 * 1024;

/// An exec as the worker's verb takes it.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub actor: ActorRef,
    pub worker_id: String,
    /// The activation the caller's record names (0: not checked).
    pub activation: u64,
    /// None: the first container.
    pub container: Option<String>,
    pub spec: ExecSpec,
    /// Who asked, for the log line.
    pub caller: String,
}

/// The caller's input after the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    Stdin(Vec<u8>),
    StdinClosed,
    Resize { columns: u16, rows: u16 },
}

/// The session's output: the command's bytes, then its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit { code: i32, message: String },
}

/// The open sessions per actor (`atespace/name`).
#[derive(Default)]
pub(super) struct ExecSessions {
    open: Mutex<HashMap<String, Vec<Session>>>,
    next_id: AtomicU64,
}

struct Session {
    id: u64,
    /// Ends the session with this message.
    end: Option<oneshot::Sender<String>>,
    /// True once its process tree is gone.
    done: watch::Receiver<bool>,
}

impl ExecSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Session>>> {
        match self.open.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Open sessions of the actor.
    pub(super) fn count(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, Vec::len)
    }

    fn add(&self, key: &str, end: oneshot::Sender<String>, done: watch::Receiver<bool>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .entry(key.to_string())
            .or_default()
            .push(Session {
                id,
                end: Some(end),
                done,
            });
        id
    }

    fn remove(&self, key: &str, id: u64) {
        let mut open = self.lock();
        if let Some(list) = open.get_mut(key) {
            list.retain(|s| s.id != id);
            if list.is_empty() {
                open.remove(key);
            }
        }
    }

    /// Ends every session of the actor with `why` and waits (bounded) until their processes
    /// are gone.
    pub(super) async fn end_all(&self, key: &str, why: &str) {
        let waits: Vec<watch::Receiver<bool>> = {
            let mut open = self.lock();
            let Some(list) = open.get_mut(key) else {
                return;
            };
            list.iter_mut()
                .map(|s| {
                    if let Some(end) = s.end.take() {
                        let _ = end.send(why.to_string());
                    }
                    s.done.clone()
                })
                .collect()
        };
        if waits.is_empty() {
            return;
        }
        tracing::info!(actor = %key, sessions = waits.len(), "ending exec sessions");
        let all = futures::future::join_all(waits.into_iter().map(|mut done| async move {
            let _ = done.wait_for(|d| *d).await;
        }));
        if tokio::time::timeout(END_WAIT, all).await.is_err() {
            tracing::warn!(actor = %key, "exec sessions still ending after {END_WAIT:?}");
        }
    }
}

impl Worker {
    /// Ends every exec session of the actor (ingress is going off: a suspend, a stop, its
    /// exit), then kills what an exec left running where a dump could not restore it.
    pub(super) async fn end_exec_sessions(&self, key: &str) {
        self.execs
            .end_all(
                key,
                &format!("exec session ended: actor {key} is being suspended or stopped"),
            )
            .await;
        let init = self.table().actors.get(key).and_then(|e| e.pid);
        if let Some(init) = init {
            let killed = crate::exec::kill_strays(init).await;
            if killed > 0 {
                tracing::info!(actor = %key, killed, "processes an exec left running killed (not in the sandbox's time namespace: a dump of them could not be restored)");
            }
        }
    }

    /// Starts `req`'s command in the actor's sandbox and returns its output; `input` carries
    /// what the caller sends after the start. The session ends when the command exits, when
    /// the receiver is dropped (the caller went away) or when the actor's ingress goes off.
    pub async fn exec(
        self: &Arc<Self>,
        req: ExecRequest,
        input: mpsc::Receiver<ExecInput>,
    ) -> Result<mpsc::Receiver<ExecEvent>, VerbError> {
        self.check_running()?;
        self.check_addressed(&req.actor, &req.worker_id)?;
        let key = key_of(&req.actor.atespace, &req.actor.name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;
        let entry = self.table().actors.get(&key).cloned().ok_or_else(|| {
            VerbError::FailedPrecondition(format!(
                "actor {key} does not run on worker {}",
                self.ident.id
            ))
        })?;
        if req.activation != 0 && entry.activation != req.activation {
            return Err(VerbError::FailedPrecondition(format!(
                "actor {key} runs here at activation {}, not {}",
                entry.activation, req.activation
            )));
        }
        if self.tunnels.get(&key).is_none() {
            return Err(VerbError::Unavailable(format!(
                "actor {key} is not serving on worker {} now (being started, suspended or stopped); try again",
                self.ident.id
            )));
        }
        let containers = &entry.spec.containers;
        let container = match &req.container {
            Some(name) => name.clone(),
            None => containers
                .first()
                .map(|c| c.name.clone())
                .unwrap_or_default(),
        };
        if !containers.iter().any(|c| c.name == container) {
            return Err(VerbError::InvalidArgument(format!(
                "actor {key} has no container {container:?}"
            )));
        }
        let mut spec = req.spec.clone();
        if containers.len() > 1 {
            // Several containers: PID 1 is ate-init, and the command runs through its exec
            // mode, in the container's root, cwd and environment, without the CAP_SYS_CHROOT
            // the sandbox's process settings give ate-init.
            let init = entry
                .sandbox
                .upper_dir()
                .join(crate::sidecars::INIT_PATH.trim_start_matches('/'));
            if !has_exec_mode(&init).await {
                return Err(VerbError::FailedPrecondition(format!(
                    "actor {key} runs an ate-init from before exec existed: exec works after its next cold start (a ROOTFS or VOLUMES resume, or a new actor)"
                )));
            }
            spec.command = init_exec(&container, &req.spec.command);
        }
        let started = self
            .runtime
            .exec(&entry.sandbox, &spec)
            .await
            .map_err(|e| sandbox_error(&format!("exec in actor {key}"), e))?;
        let (events, output) = mpsc::channel(32);
        let process = match started {
            Exec::NotRun { code, reason } => {
                metrics::counter!(crate::metrics::EXEC_SESSIONS, "ended" => "not_run").increment(1);
                tracing::info!(actor = %key, caller = %req.caller, command = ?req.spec.command, code, %reason, "exec: command not run");
                let _ = events.try_send(ExecEvent::Exit {
                    code,
                    message: reason,
                });
                return Ok(output);
            }
            Exec::Started(p) => p,
        };
        tracing::info!(actor = %key, caller = %req.caller, command = ?req.spec.command, tty = req.spec.tty, pid = process.pid, "exec session started");
        let (end_tx, end_rx) = oneshot::channel();
        let (done_tx, done_rx) = watch::channel(false);
        let id = self.execs.add(&key, end_tx, done_rx);
        metrics::gauge!(crate::metrics::EXEC_OPEN).increment(1.0);
        let worker = self.clone();
        tokio::spawn(async move {
            let pid = process.pid;
            let session_key = key.clone();
            // Once its processes are gone the session no longer counts (and a suspend waiting
            // for it goes on), even if its caller is slow to take the last answer.
            let gone = move |ended: &'static str| {
                worker.execs.remove(&session_key, id);
                let _ = done_tx.send(true);
                metrics::gauge!(crate::metrics::EXEC_OPEN).decrement(1.0);
                metrics::counter!(crate::metrics::EXEC_SESSIONS, "ended" => ended).increment(1);
            };
            let code = run_session(process, req.spec.size, input, events, end_rx, gone).await;
            tracing::info!(actor = %key, pid, code, "exec session ended");
        });
        Ok(output)
    }
}

/// The bytes an `ate-init` with the `--exec` mode carries (`init/main.rs`, `EXEC_MARKER`).
const INIT_EXEC_MARKER: &[u8] = b"ate-init exec-mode v1";

/// Whether the `ate-init` at `path` (in the actor's upper dir) has the `--exec` mode.
async fn has_exec_mode(path: &std::path::Path) -> bool {
    tokio::fs::read(path).await.is_ok_and(|bytes| {
        bytes
            .windows(INIT_EXEC_MARKER.len())
            .any(|w| w == INIT_EXEC_MARKER)
    })
}

/// `command` run in `container` through ate-init's exec mode.
fn init_exec(container: &str, command: &[String]) -> Vec<String> {
    let mut line = vec![
        crate::sidecars::INIT_PATH.to_string(),
        "--exec".to_string(),
        container.to_string(),
        "--".to_string(),
    ];
    line.extend(command.iter().cloned());
    line
}

/// Pumps one session until it ends; returns the command's exit code.
async fn run_session(
    process: ExecProcess,
    size: Option<(u16, u16)>,
    input: mpsc::Receiver<ExecInput>,
    events: mpsc::Sender<ExecEvent>,
    end: oneshot::Receiver<String>,
    gone: impl FnOnce(&'static str),
) -> i32 {
    let pid = process.pid;
    let mut exit = tokio::spawn(wait_exit(pid));
    let (mut pumps, feeder) = match process.io {
        ExecIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let pumps = vec![
                tokio::spawn(pump(stdout, events.clone(), ExecEvent::Stdout)),
                tokio::spawn(pump(stderr, events.clone(), ExecEvent::Stderr)),
            ];
            (pumps, tokio::spawn(feed_pipe(stdin, input)))
        }
        ExecIo::Terminal(pty) => {
            let pty = Arc::new(pty);
            if let Some((columns, rows)) = size {
                let _ = pty.resize(columns, rows);
            }
            let pumps = vec![tokio::spawn(pump_terminal(pty.clone(), events.clone()))];
            (pumps, tokio::spawn(feed_terminal(pty, input)))
        }
    };
    let mut end = end;
    let (code, message, ended) = tokio::select! {
        code = &mut exit => (code.unwrap_or(255), String::new(), "exited"),
        why = &mut end => {
            let why = why.unwrap_or_else(|_| "exec session ended".to_string());
            // Not once reaped: the pid could be another process's by then.
            if !exit.is_finished() {
                kill_tree(pid).await;
            }
            ((&mut exit).await.unwrap_or(255), why, "ingress_off")
        }
        () = events.closed() => {
            if !exit.is_finished() {
                kill_tree(pid).await;
            }
            ((&mut exit).await.unwrap_or(255), String::new(), "caller_gone")
        }
    };
    feeder.abort();
    // Output the command wrote before it ended is still in the pipes: read to their end, but
    // not for ever (a process it left behind may hold them open).
    let drained = futures::future::join_all(pumps.iter_mut());
    if tokio::time::timeout(OUTPUT_DRAIN, drained).await.is_err() {
        for p in &pumps {
            p.abort();
        }
    }
    gone(ended);
    let _ = events.send(ExecEvent::Exit { code, message }).await;
    code
}

async fn pump(
    mut from: tokio::net::unix::pipe::Receiver,
    to: mpsc::Sender<ExecEvent>,
    wrap: fn(Vec<u8>) -> ExecEvent,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(wrap(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn pump_terminal(pty: Arc<Pty>, to: mpsc::Sender<ExecEvent>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pty.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(ExecEvent::Stdout(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The caller's stdin into the command's (closed at the caller's end of stdin).
async fn feed_pipe(
    mut stdin: Option<tokio::net::unix::pipe::Sender>,
    mut input: mpsc::Receiver<ExecInput>,
) {
    while let Some(message) = input.recv().await {
        match message {
            ExecInput::Stdin(data) => {
                if let Some(pipe) = stdin.as_mut()
                    && pipe.write_all(&data).await.is_err()
                {
                    stdin = None;
                }
            }
            ExecInput::StdinClosed => stdin = None,
            ExecInput::Resize { .. } => {}
        }
    }
}

async fn feed_terminal(pty: Arc<Pty>, mut input: mpsc::Receiver<ExecInput>) {
    while let Some(message) = input.recv().await {
        match message {
            ExecInput::Stdin(data) => {
                if pty.write_all(&data).await.is_err() {
                    return;
                }
            }
            ExecInput::Resize { columns, rows } => {
                let _ = pty.resize(columns, rows);
            }
            ExecInput::StdinClosed => {}
        }
    }
}
