//! The node's workers: discovered by their sockets under `<state>/workers/<id>/worker.sock`,
//! registered with the api (again whenever their epoch changes), kept alive with heartbeats, and
//! polled for idle and exited actors.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::{ActorRef, SuspendMode};

use crate::api_client::{ActorExit, ApiClient, HeldActor, Registering};
use crate::types::{CallCode, CallError, Damage};
use crate::worker_client::{WorkerClient, WorkerInfo};

/// A worker this node knows, with the facts it last reported.
#[derive(Clone)]
pub struct WorkerHandle {
    pub client: WorkerClient,
    pub info: WorkerInfo,
    pub socket: PathBuf,
    /// The liveness lease the api gave at registration.
    pub lease: Duration,
}

/// Longest wait for one heartbeat's answer.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

/// Lease assumed until the api says otherwise (its default heartbeat timeout).
const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// Renews a worker's lease after a heartbeat sent at `sent` succeeded: valid for the lease
/// counted from the send, so the worker's lease always ends before the api's expiry of it.
async fn renew(client: &mut WorkerClient, worker: &str, lease: Duration, sent: std::time::Instant) {
    let left = lease.saturating_sub(sent.elapsed());
    let valid_for_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
    if let Err(e) = client.renew_lease(valid_for_ms).await {
        tracing::warn!(worker = %worker, error = %e.message, "cannot renew the worker's lease");
    }
}

/// First wait after an idle suspend failed (a memory dump refused, a full disk) before the
/// next try; each further failure doubles it up to [`IDLE_RETRY_MAX`]. Without it a refused
/// dump would freeze and dump the actor again at every activity poll.
const IDLE_RETRY_FIRST: Duration = Duration::from_secs(30);
const IDLE_RETRY_MAX: Duration = Duration::from_secs(600);

/// The wait after an idle suspend failed, given the wait after the previous failure (if the
/// one before also failed).
fn idle_retry_after(previous: Option<Duration>) -> Duration {
    previous.map_or(IDLE_RETRY_FIRST, |p| {
        (p * 2).clamp(IDLE_RETRY_FIRST, IDLE_RETRY_MAX)
    })
}

/// Which copy of a generation a directory a restore read from is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyKind {
    /// The node-local generation.
    Local,
    /// The durable copy: a download for a lazy restore (`<uuid>.lazy`), whose memory chunks
    /// come from the store.
    Durable,
}

/// The copy `dir` is, given the node's `<state>/snapshots`; None for a whole download of the
/// durable copy (a cache, verified in full before each use) or anything else.
fn copy_of(dir: &Path, snapshots_dir: &Path) -> Option<CopyKind> {
    let lazy_download = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(".lazy"));
    if lazy_download {
        Some(CopyKind::Durable)
    } else if dir.starts_with(snapshots_dir) && dir != snapshots_dir {
        Some(CopyKind::Local)
    } else {
        None
    }
}

/// Shared state of the node's fleet loops.
pub struct Fleet {
    pub node: String,
    pub node_address: String,
    pub boot_id: String,
    pub workers_dir: PathBuf,
    /// Where this node keeps its node-local generations (`<state>/snapshots`).
    pub snapshots_dir: PathBuf,
    pub workers: Mutex<HashMap<String, WorkerHandle>>,
    pub api: ApiClient,
    /// Actors an idle suspend has been asked for and not answered yet.
    suspending: Mutex<HashSet<(String, String)>>,
    /// Actors whose last idle suspend failed: not asked again before the instant, and the
    /// wait that led to it.
    idle_retry: Mutex<HashMap<(String, String), (Instant, Duration)>>,
    /// Worker processes (id, epoch) seen stopping before this node registered them, each
    /// logged once.
    passed_over: Mutex<HashSet<(String, u64)>>,
    /// Exit reports the api has not taken yet (unreachable, or the actor's resume still being
    /// recorded), with when each was first sent: a worker reports an exit once, so the node
    /// keeps it and sends it again at every activity pass, for up to [`EXIT_REPORT_RETENTION`].
    pending_exits: Mutex<Vec<(ActorExit, Instant)>>,
    /// `--memory-low-percent` (0: off).
    memory_low_percent: u8,
    /// When the last suspend for memory was asked (see [`crate::pressure::SPACING`]).
    last_pressure_suspend: Mutex<Option<Instant>>,
}

/// How long the node keeps sending an exit report the api does not take. Past it the report
/// is dropped with an error: the api's own reconciliation (a worker re-registering, a GONE
/// worker) is then the only way the actor leaves RUNNING.
const EXIT_REPORT_RETENTION: Duration = Duration::from_secs(600);

/// An exit report answered with `code` is worth sending again: the api was unreachable or
/// busy with the actor (ABORTED: its resume is still being recorded).
fn exit_report_retryable(code: CallCode) -> bool {
    matches!(
        code,
        CallCode::Aborted
            | CallCode::Unavailable
            | CallCode::DeadlineExceeded
            | CallCode::Unknown
            | CallCode::Internal
            | CallCode::Cancelled
    )
}

impl Fleet {
    pub fn new(
        node: String,
        node_address: String,
        boot_id: String,
        workers_dir: PathBuf,
        snapshots_dir: PathBuf,
        api: ApiClient,
    ) -> Self {
        Self {
            node,
            node_address,
            boot_id,
            workers_dir,
            snapshots_dir,
            workers: Mutex::new(HashMap::new()),
            api,
            suspending: Mutex::new(HashSet::new()),
            idle_retry: Mutex::new(HashMap::new()),
            passed_over: Mutex::new(HashSet::new()),
            pending_exits: Mutex::new(Vec::new()),
            memory_low_percent: 0,
            last_pressure_suspend: Mutex::new(None),
        }
    }

    /// Suspends idle actors while the host's memory is below `percent` available (0: never).
    pub fn with_memory_low_percent(mut self, percent: u8) -> Self {
        self.memory_low_percent = percent;
        self
    }

    /// The worker's client, if the worker is known and alive.
    pub fn worker(&self, id: &str) -> Option<WorkerHandle> {
        self.workers.lock().ok()?.get(id).cloned()
    }

    fn sockets(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path().join("worker.sock"))
            .filter(|p| p.exists())
            .collect()
    }

    /// One discovery pass: new workers and workers with a new epoch are (re-)registered; workers
    /// that no longer answer are forgotten (the api marks them GONE when heartbeats stop).
    pub async fn discover(&self) {
        let mut seen = HashSet::new();
        for socket in Self::sockets(&self.workers_dir) {
            let known = self
                .workers
                .lock()
                .ok()
                .and_then(|w| w.values().find(|h| h.socket == socket).cloned());
            let known_handle = known.clone();
            let mut client = match known {
                Some(h) => h.client,
                None => match WorkerClient::connect(&socket).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(socket = %socket.display(), error = %e, "worker socket not answering");
                        continue;
                    }
                },
            };
            let info = match client.info().await {
                Ok(info) => info,
                Err(e) => {
                    tracing::debug!(socket = %socket.display(), error = %e.message, "worker info failed");
                    if let Some(h) = &known_handle
                        && self.keep_down_worker(h)
                    {
                        seen.insert(h.info.worker_id.clone());
                    }
                    continue;
                }
            };
            seen.insert(info.worker_id.clone());
            let previous = self
                .workers
                .lock()
                .ok()
                .and_then(|w| w.get(&info.worker_id).map(|h| (h.info.epoch, h.lease)));
            let lease = match previous {
                Some((epoch, lease)) if epoch == info.epoch => lease,
                _ => {
                    let sent = std::time::Instant::now();
                    match self.register(&mut client, &info, Process::New).await {
                        Ok(Some(lease)) => {
                            renew(&mut client, &info.worker_id, lease, sent).await;
                            lease
                        }
                        Ok(None) => {
                            // A process on its way out; its successor will be registered.
                            seen.remove(&info.worker_id);
                            if let Some(h) = &known_handle
                                && self.keep_down_worker(h)
                            {
                                seen.insert(h.info.worker_id.clone());
                            }
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(worker = %info.worker_id, error = %e.message, "worker registration failed");
                            continue;
                        }
                    }
                }
            };
            if let Ok(mut workers) = self.workers.lock() {
                workers.insert(
                    info.worker_id.clone(),
                    WorkerHandle {
                        client,
                        info,
                        socket,
                        lease,
                    },
                );
            }
        }
        if let Ok(mut workers) = self.workers.lock() {
            workers.retain(|id, _| seen.contains(id));
        }
    }

    /// Registers the worker with what it holds, discards what the api says is stale, and
    /// returns the lease the api gave. Only then may the worker's lease be renewed: re-adopted
    /// actors get their ingress back at the renewal, after the reconciliation.
    /// A known worker whose process does not answer (crashed, stopped, restarting) stays
    /// registered and heartbeated while any of its sandboxes still runs: the api must not
    /// release actors whose sandboxes may still run. The restarted worker re-adopts them (the
    /// worker fences itself meanwhile: its lease is not renewed, and atunnel is down anyway).
    fn keep_down_worker(&self, h: &WorkerHandle) -> bool {
        let actors_dir = h
            .socket
            .parent()
            .map(|d| d.join("actors"))
            .unwrap_or_default();
        let live = ate_worker_client::live_sandboxes(&actors_dir);
        if live > 0 {
            // Debug: the heartbeat loop already warns every 2 s that the lease is not renewed.
            tracing::debug!(worker = %h.info.worker_id, live_sandboxes = live, "worker does not answer but its sandboxes still run; keeping it registered");
        }
        live > 0
    }

    ///
    /// A process this node has not registered yet ([`Process::New`]) that is already stopping
    /// (draining) is not registered at all (`Ok(None)`): it is an earlier process of the worker
    /// that a node restart found on its way out (its supervisor stopped it, or died), and its
    /// successor, which cannot start before it exits (the worker's identity lock), is the one to
    /// register. Registering it would have this node ask the api to suspend every actor of a
    /// process about to be replaced, and keep it draining.
    async fn register(
        &self,
        client: &mut WorkerClient,
        info: &WorkerInfo,
        process: Process,
    ) -> Result<Option<Duration>, CallError> {
        let activity = client.activity(false).await?;
        if process == Process::New && activity.draining {
            let first = self
                .passed_over
                .lock()
                .map(|mut s| s.insert((info.worker_id.clone(), info.epoch)))
                .unwrap_or(false);
            if first {
                tracing::info!(worker = %info.worker_id, epoch = info.epoch, "worker process is stopping; not registering it (its next process will be)");
            }
            return Ok(None);
        }
        let held: Vec<HeldActor> = activity
            .actors
            .into_iter()
            .filter(|a| !a.exited)
            .map(|a| HeldActor {
                actor: a.actor,
                activation: a.activation,
            })
            .collect();
        let reply = self
            .api
            .register_worker(Registering {
                info,
                node: &self.node,
                node_address: &self.node_address,
                boot_id: &self.boot_id,
                held: &held,
            })
            .await?;
        tracing::info!(worker = %info.worker_id, epoch = info.epoch, held = held.len(), discard = reply.discard.len(), "worker registered with the api");
        for d in reply.discard {
            let Some(actor) = d.actor else { continue };
            match client.stop(Some(&actor), d.activation.max(1)).await {
                Ok(_) => {
                    tracing::info!(actor = %actor, worker = %info.worker_id, activation = d.activation, "stale copy discarded")
                }
                // The worker goes on fenced for this actor: atunnel refuses any older token.
                Err(e) => {
                    tracing::warn!(actor = %actor, worker = %info.worker_id, error = %e.message, "cannot discard a stale copy")
                }
            }
        }
        Ok(Some(match reply.lease_seconds {
            0 => DEFAULT_LEASE,
            n => Duration::from_secs(u64::from(n)),
        }))
    }

    /// Heartbeats every known worker and renews its lease on success; one the api no longer
    /// knows is registered again (and reconciled) first. A worker whose heartbeats fail is not
    /// renewed, so it fences itself when its lease runs out, before the api may release its
    /// actors.
    pub async fn heartbeat(&self) {
        let workers: Vec<WorkerHandle> = self
            .workers
            .lock()
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default();
        for mut h in workers {
            let info = &h.info;
            let sent = std::time::Instant::now();
            // A hung api must not hold the loop (and the other workers' renewals).
            let answer = match tokio::time::timeout(
                HEARTBEAT_TIMEOUT,
                // The usage the worker reported at the last discovery pass (≤ 500 ms old).
                self.api
                    .heartbeat(&info.worker_id, info.epoch, info.cpu_usage_millis),
            )
            .await
            {
                Ok(a) => a,
                Err(_) => Err(CallError::new(
                    CallCode::DeadlineExceeded,
                    "heartbeat timed out",
                )),
            };
            match answer {
                Ok(true) => {
                    renew(&mut h.client, &info.worker_id, h.lease, sent).await;
                }
                Ok(false) => match self.register(&mut h.client, info, Process::Known).await {
                    Ok(Some(lease)) => renew(&mut h.client, &info.worker_id, lease, sent).await,
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(worker = %info.worker_id, error = %e.message, "re-registration failed")
                    }
                },
                Err(e) => {
                    tracing::warn!(worker = %info.worker_id, error = %e.message, "heartbeat failed; the worker's lease is not renewed")
                }
            }
        }
    }

    /// Reports exited actors and asks the api to suspend idle ones.
    pub async fn watch_activity(self: &Arc<Self>) {
        let workers: Vec<WorkerHandle> = self
            .workers
            .lock()
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default();
        let now = now_ms();
        let mut memory = crate::pressure::Pass::default();
        for w in workers {
            let mut client = w.client.clone();
            let Ok(reply) = client.activity(false).await else {
                continue;
            };
            let draining = reply.draining;
            memory.frozen = memory.frozen.saturating_add(reply.frozen);
            for a in reply.actors {
                let Some(actor) = a.actor.clone() else {
                    continue;
                };
                if a.exited {
                    let damage = if a.crash_reason.is_empty() || a.damaged_generation_dir.is_empty()
                    {
                        None
                    } else {
                        self.damaged_copy(Path::new(&a.damaged_generation_dir), &a.crash_reason)
                            .await
                    };
                    let exit = ActorExit {
                        actor: actor.clone(),
                        worker_id: w.info.worker_id.clone(),
                        epoch: w.info.epoch,
                        exit_code: a.exit_code,
                        last_log_lines: a.last_log_lines.clone(),
                        crash_reason: a.crash_reason.clone(),
                        damage,
                        activation: a.activation,
                    };
                    if let Ok(mut pending) = self.pending_exits.lock() {
                        pending.push((exit, Instant::now()));
                    }
                    continue;
                }
                if draining || a.suspend_requested {
                    // The worker is stopping (every actor is suspended, state kept), or the
                    // actor asked to be suspended now (its turn is over: free its slot).
                    let why = if draining {
                        format!("worker {} is draining", w.info.worker_id)
                    } else {
                        "the actor asked to be suspended".to_string()
                    };
                    self.suspend_idle(actor, why);
                    continue;
                }
                let idle_ms = now.saturating_sub(a.last_activity_unix_ms);
                if a.open_streams == 0 {
                    memory.idle.push(crate::pressure::Candidate {
                        actor: actor.clone(),
                        last_activity_unix_ms: a.last_activity_unix_ms,
                    });
                }
                if a.idle_timeout_seconds > 0
                    && a.open_streams == 0
                    && idle_ms >= i64::from(a.idle_timeout_seconds) * 1000
                    && !self.idle_retry_pending(&actor)
                {
                    let why = format!(
                        "idle: nothing open for {} s (idle timeout {} s)",
                        idle_ms / 1000,
                        a.idle_timeout_seconds
                    );
                    self.suspend_idle(actor, why);
                }
            }
        }
        self.relieve_memory(memory, now);
        self.report_exits().await;
    }

    /// Under memory pressure, once no frozen copy is left, asks for the suspend of the least
    /// recently used idle actor ([`crate::pressure`]), at most one per
    /// [`crate::pressure::SPACING`].
    fn relieve_memory(self: &Arc<Self>, mut memory: crate::pressure::Pass, now: i64) {
        if self.memory_low_percent == 0 {
            return;
        }
        let spaced = self
            .last_pressure_suspend
            .lock()
            .is_ok_and(|last| last.is_none_or(|at| at.elapsed() >= crate::pressure::SPACING));
        if !spaced {
            return;
        }
        memory.available_percent = ate_worker_client::host_memory_available_percent();
        let busy = |c: &crate::pressure::Candidate| {
            let key = (c.actor.atespace.clone(), c.actor.name.clone());
            self.suspending.lock().is_ok_and(|s| s.contains(&key))
                || self.idle_retry_pending(&c.actor)
        };
        memory.idle.retain(|c| !busy(c));
        let Some((actor, why)) = crate::pressure::choose(&memory, self.memory_low_percent, now)
        else {
            return;
        };
        tracing::warn!(actor = %actor, %why, "memory pressure: suspending an idle actor");
        metrics::counter!(crate::metrics::MEMORY_PRESSURE_SUSPENDS).increment(1);
        if let Ok(mut last) = self.last_pressure_suspend.lock() {
            *last = Some(Instant::now());
        }
        self.suspend_idle(actor, why);
    }

    /// Sends every exit report the api has not taken yet; keeps those it refuses or cannot be
    /// asked (see [`Fleet::pending_exits`]).
    async fn report_exits(&self) {
        let pending = match self.pending_exits.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => return,
        };
        let mut kept = Vec::new();
        for (exit, first) in pending {
            let actor = exit.actor.clone();
            match self.api.report_actor_exit(exit.clone()).await {
                Ok(()) => {}
                // Refused for good (a stale worker epoch, an invalid report): not sent again.
                Err(e) if !exit_report_retryable(e.code) => {
                    tracing::warn!(actor = %actor, error = %e.message, "exit report refused");
                }
                Err(e) if first.elapsed() < EXIT_REPORT_RETENTION => {
                    tracing::info!(actor = %actor, error = %e.message, "exit report not taken yet; reporting it again");
                    kept.push((exit, first));
                }
                Err(e) => {
                    tracing::error!(actor = %actor, error = %e.message, "exit report not taken for {EXIT_REPORT_RETENTION:?}; dropping it");
                }
            }
        }
        if let Ok(mut p) = self.pending_exits.lock() {
            p.extend(kept);
        }
    }

    /// An earlier idle suspend of `actor` failed and its retry wait has not passed.
    fn idle_retry_pending(&self, actor: &ActorRef) -> bool {
        let key = (actor.atespace.clone(), actor.name.clone());
        self.idle_retry
            .lock()
            .is_ok_and(|r| r.get(&key).is_some_and(|(at, _)| Instant::now() < *at))
    }

    /// Which copy of its generation the directory `dir` is, where a lazy restore found damaged
    /// content (`reason`): the node-local generation (under `<state>/snapshots`), or the durable
    /// copy (a download for a lazy restore, `<uuid>.lazy`, whose memory chunks come from the
    /// store). None for a whole download of the durable copy (it was verified in full before
    /// the restore; the next restore verifies it again and fetches it anew) and for a directory
    /// whose manifest cannot be read (the generation is then unknown).
    async fn damaged_copy(&self, dir: &Path, reason: &str) -> Option<Damage> {
        let Some(copy) = copy_of(dir, &self.snapshots_dir) else {
            tracing::warn!(dir = %dir.display(), reason, "damaged content in a downloaded copy that was verified before the restore; not reported as damage of the generation");
            return None;
        };
        match ate_snapshot::read_manifest(dir).await {
            Ok(m) => Some(Damage {
                generation: m.generation,
                uuid: m.uuid,
                local: (copy == CopyKind::Local).then(|| reason.to_string()),
                durable: (copy == CopyKind::Durable).then(|| reason.to_string()),
            }),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot tell which generation a lazy restore found damaged");
                None
            }
        }
    }

    /// Asks the api to suspend `actor`, saying `why` (for its events).
    fn suspend_idle(self: &Arc<Self>, actor: ActorRef, why: String) {
        let key = (actor.atespace.clone(), actor.name.clone());
        if !self
            .suspending
            .lock()
            .map(|mut s| s.insert(key.clone()))
            .unwrap_or(false)
        {
            return;
        }
        let fleet = self.clone();
        tokio::spawn(async move {
            tracing::info!(actor = %actor, "idle; asking the api to suspend");
            let failed = fleet
                .api
                .suspend_actor(&actor, SuspendMode::Async, 0, why)
                .await
                .err();
            if let Ok(mut retry) = fleet.idle_retry.lock() {
                match failed {
                    Some(e) => {
                        let wait = idle_retry_after(retry.get(&key).map(|(_, w)| *w));
                        tracing::info!(actor = %actor, error = %e.message, retry_in_s = wait.as_secs(), "idle suspend not done");
                        retry.insert(key.clone(), (Instant::now() + wait, wait));
                    }
                    None => {
                        retry.remove(&key);
                    }
                }
            }
            if let Ok(mut s) = fleet.suspending.lock() {
                s.remove(&key);
            }
        });
    }

    /// Runs discovery + heartbeats + activity until `stop` flips.
    /// Runs discovery, heartbeats and activity until `stop` flips, each in a loop of its own:
    /// a worker or an api that stops answering slows one loop, never the heartbeats of the
    /// others.
    pub async fn run_loops(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let every = |period: Duration, what: Loop| {
            let fleet = self.clone();
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => match what {
                            Loop::Discover => fleet.discover().await,
                            Loop::Heartbeat => fleet.heartbeat().await,
                            Loop::Activity => fleet.watch_activity().await,
                        },
                        _ = stop.changed() => return,
                    }
                }
            })
        };
        let loops = [
            every(Duration::from_millis(500), Loop::Discover),
            every(Duration::from_secs(2), Loop::Heartbeat),
            every(Duration::from_millis(500), Loop::Activity),
        ];
        for l in loops {
            let _ = l.await;
        }
    }
}

/// Whether this node registered the worker process before (same epoch: the api forgot it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Process {
    New,
    Known,
}

#[derive(Clone, Copy)]
enum Loop {
    Discover,
    Heartbeat,
    Activity,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_idle_suspend_is_retried_ever_later_up_to_ten_minutes() {
        let mut waits = Vec::new();
        let mut last = None;
        for _ in 0..7 {
            let w = idle_retry_after(last);
            waits.push(w.as_secs());
            last = Some(w);
        }
        assert_eq!(waits, [30, 60, 120, 240, 480, 600, 600]);
    }

    #[test]
    fn a_damaged_directory_is_the_copy_it_was_read_as() {
        let snapshots = Path::new("/var/lib/ate/snapshots");
        let local = snapshots.join("ns/a/3-0123abcd");
        assert_eq!(copy_of(&local, snapshots), Some(CopyKind::Local));
        let lazy = Path::new("/var/lib/ate/snapshot-cache/0123-abcd.lazy");
        assert_eq!(copy_of(lazy, snapshots), Some(CopyKind::Durable));
        // A whole download was verified before the restore: not the generation's damage.
        let whole = Path::new("/var/lib/ate/snapshot-cache/0123-abcd");
        assert_eq!(copy_of(whole, snapshots), None);
        assert_eq!(copy_of(snapshots, snapshots), None);
        assert_eq!(copy_of(Path::new("/elsewhere/3-x"), snapshots), None);
    }
}
