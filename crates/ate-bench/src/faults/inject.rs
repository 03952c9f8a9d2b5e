//! The faults: what each one does to the bench's system, and the recovery and checks around it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_proto::v1;
use nix::sys::signal::Signal;

use super::checks::check_invariants;
use super::lab::{Lab, UP_STOP_GRACE, children_of, signal};
use super::load::{Load, Sampler};
use super::report::Row;
use super::{ATESPACE, Fault};

/// How long every actor gets to answer 200 again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Load kept going after the recovery, inside the fault's window: some effects of a fault come
/// later (the router's assignment cache expires after 5 s, leases run out, a restarted
/// component reconciles).
const OBSERVE: Duration = Duration::from_secs(5);
/// A killed component is restarted by `ate up` after its backoff (up to 10 s).
const COMPONENT_WAIT: Duration = Duration::from_secs(15);
/// Actors of `snapshot-disk-full` whose suspend must fail.
const DISK_FULL_VICTIMS: usize = 2;
/// After a new `ate up` is ready, the window lasts at least this long: the new api marks a
/// worker gone 12 s (lease 10 s plus a fifth) after its start or after the last heartbeat of a
/// process it registered, and that must not happen while the worker's sandboxes run (the
/// sampler looks every second, during and between the faults).
const GONE_WATCH: Duration = Duration::from_secs(20);

/// Injects `fault`, waits for recovery, runs the checks and builds the fault's row.
pub(super) async fn run_fault(
    lab: &mut Lab,
    load: &Load,
    sampler: &Sampler,
    actors: &[String],
    fault: Fault,
    delay: Option<Duration>,
    segment_start: f64,
) -> Row {
    let started = lab.clock.now();
    let mut notes = Vec::new();
    let fault_errors = match inject(lab, load, actors, fault, delay, &mut notes).await {
        Ok(failed) => failed,
        Err(e) => vec![format!("could not inject the fault: {e:#}")],
    };
    let injected = lab.clock.now();
    let recovered = match load.wait_answered(injected, RECOVERY_TIMEOUT).await {
        Ok(t) => Some(t),
        Err(missing) => {
            notes.push(format!(
                "not recovered: {} did not answer 200 within {} s of the fault's end",
                missing.join(", "),
                RECOVERY_TIMEOUT.as_secs()
            ));
            None
        }
    };
    // A restart of the whole system is watched until its api could have expired a worker.
    let observe = if matches!(
        fault,
        Fault::KillUpOverlap | Fault::KillUp | Fault::RestartUp
    ) {
        OBSERVE.max(GONE_WATCH.saturating_sub(Duration::from_secs_f64(
            (lab.clock.now() - injected).max(0.0),
        )))
    } else {
        OBSERVE
    };
    tokio::time::sleep(observe).await;
    let window_end = lab.clock.now();
    let checks = check_invariants(lab, actors).await;
    let checked = lab.clock.now();
    let mut gone = sampler.gone_between(segment_start, checked);
    for g in checks.gone.iter() {
        if !gone.contains(g) {
            gone.push(g.clone());
        }
    }
    let history = load.samples();
    let mut row = Row::new(fault, started, injected, recovered, checked);
    row.delay = delay.map(|d| d.as_secs_f64());
    row.gone = gone;
    row.tally(&history, &load.actors, started, window_end, segment_start);
    if let Ok(rollbacks) = lab.reported_rollbacks.lock() {
        row.excuse_reported_rollbacks(&rollbacks);
    }
    row.double = checks.double;
    row.double_seen = sampler.seen_between(segment_start, checked);
    row.slots = checks.slots;
    row.orphans = checks.orphans;
    row.fault_errors = fault_errors;
    row.fault_errors.extend(checks.errors);
    row.notes = notes;
    row
}

/// Performs the fault. Returns the fault's own failed expectations (only `snapshot-disk-full`
/// has some); an error means the fault could not be injected as intended.
async fn inject(
    lab: &mut Lab,
    load: &Load,
    actors: &[String],
    fault: Fault,
    delay: Option<Duration>,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    match fault {
        Fault::KillWorker => lab.kill_component(Component::Worker(1)).await?,
        Fault::KillNode => lab.kill_component(Component::Node).await?,
        Fault::KillApi => lab.kill_component(Component::Api).await?,
        Fault::KillRouter => lab.kill_component(Component::Router).await?,
        Fault::ApiDown15s => lab.freeze(Component::Api, Duration::from_secs(15)).await?,
        Fault::WorkerStop30s => {
            lab.freeze(Component::Worker(1), Duration::from_secs(30))
                .await?
        }
        Fault::WorkerDown20s => {
            lab.kill_unsupervised(Component::Worker(1), Duration::from_secs(20))
                .await?
        }
        Fault::StoreDown12s => lab.store_down(Duration::from_secs(12)).await?,
        Fault::StoreDown60s => lab.store_down(Duration::from_secs(60)).await?,
        Fault::RestartUp => {
            if !lab.stop_up().await? {
                notes.push(format!(
                    "ate up did not stop within {} s and was killed",
                    UP_STOP_GRACE.as_secs()
                ));
            }
            lab.start_up().await?;
        }
        Fault::KillUp => {
            lab.kill_up().await?;
            lab.start_up().await?;
        }
        Fault::KillUpOverlap => {
            let delay = delay.unwrap_or_default();
            let left = lab.kill_up_alone().await?;
            tokio::time::sleep(delay).await;
            let alive: Vec<&str> = left
                .iter()
                .filter(|(pid, _)| u32::try_from(*pid).is_ok_and(ate_worker::process_running))
                .map(|(_, name)| name.as_str())
                .collect();
            let begun = Instant::now();
            lab.start_up().await?;
            notes.push(format!(
                "new ate up started {:.2} s after the kill, old components still running: {}; ready {:.1} s later",
                delay.as_secs_f64(),
                if alive.is_empty() {
                    "none".to_string()
                } else {
                    alive.join(", ")
                },
                begun.elapsed().as_secs_f64()
            ));
        }
        Fault::SnapshotDiskFull => return snapshot_disk_full(lab, load, actors, notes).await,
        Fault::KillInSuspend => {
            return super::inside::kill_in_suspend(lab, load, actors, lab.trials, notes).await;
        }
        Fault::KillInResume => {
            return super::inside::kill_in_resume(lab, load, actors, lab.trials, notes).await;
        }
        Fault::KillInDelete => {
            return super::inside::kill_in_delete(lab, lab.trials, notes).await;
        }
    }
    Ok(Vec::new())
}

/// Fills the snapshot tmpfs, then: suspends of two actors must fail and leave them RUNNING and
/// serving; with the filler gone, a suspend must succeed (the next request resumes the actor,
/// its count continuing, which the state-lost check sees).
async fn snapshot_disk_full(
    lab: &Lab,
    load: &Load,
    actors: &[String],
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let dir = lab
        .tmpfs
        .clone()
        .context("the snapshot dir is not the bench's tmpfs")?;
    let filler = dir.join(".bench-faults-filler");
    let filled = fill_disk(&filler);
    let expectations = match filled {
        Ok(bytes) => {
            notes.push(format!(
                "filled the snapshot disk with {} MiB",
                bytes / (1024 * 1024)
            ));
            suspends_on_full_disk(
                lab,
                load,
                &actors[..DISK_FULL_VICTIMS.min(actors.len())],
                notes,
            )
            .await
        }
        Err(e) => Err(e),
    };
    // The filler goes whatever happened: the rest of the suite needs the disk.
    if let Err(e) = std::fs::remove_file(&filler)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        anyhow::bail!("cannot remove {}: {e}", filler.display());
    }
    let mut failed = expectations?;
    let victim = &actors[0];
    match lab.suspend(victim).await {
        Ok(()) => notes.push(format!("{victim} suspended once the disk had room")),
        Err(e) => failed.push(format!(
            "suspend of {victim} failed after the disk was freed: {e:#}"
        )),
    }
    Ok(failed)
}

/// The expectations while the disk is full: each victim's suspend fails, the victim stays
/// RUNNING and answers 200 again after it.
async fn suspends_on_full_disk(
    lab: &Lab,
    load: &Load,
    victims: &[String],
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let mut failed = Vec::new();
    for victim in victims {
        match lab.suspend(victim).await {
            Ok(()) => failed.push(format!(
                "suspend of {victim} succeeded with the snapshot disk full"
            )),
            Err(e) => notes.push(format!("suspend of {victim} refused: {e:#}")),
        }
        let after = lab.clock.now();
        let state = lab.wait_state(victim, v1::ActorState::Running).await;
        if state != v1::ActorState::Running.as_str_name() {
            failed.push(format!(
                "{victim} is {state} after the failed suspend (want RUNNING)"
            ));
        }
        if let Err(missing) = load
            .wait_answered_by(std::slice::from_ref(victim), after, Duration::from_secs(15))
            .await
        {
            failed.push(format!(
                "{} did not answer 200 within 15 s of the failed suspend",
                missing.join(", ")
            ));
        }
    }
    Ok(failed)
}

/// Writes zeros to `path` until the file system is full; returns the bytes written.
fn fill_disk(path: &Path) -> anyhow::Result<u64> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut written = 0u64;
    // Big chunks first, then small ones for the last bytes.
    for chunk in [1 << 20, 4096] {
        let buf = vec![0u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot write {}", path.display()));
                }
            }
        }
    }
    Ok(written)
}

/// A component of the bench's `ate up`, found among its children by command line.
#[derive(Clone, Copy, Debug)]
pub(super) enum Component {
    Api,
    Node,
    Router,
    Worker(u32),
}

impl Component {
    fn name(self) -> String {
        match self {
            Component::Api => "api".into(),
            Component::Node => "node".into(),
            Component::Router => "router".into(),
            Component::Worker(i) => format!("worker-{i}"),
        }
    }

    fn matches(self, args: &[String]) -> bool {
        let sub = args.get(1).map(String::as_str);
        match self {
            Component::Api => sub == Some("api"),
            Component::Node => sub == Some("node"),
            Component::Router => sub == Some("router"),
            Component::Worker(i) => {
                sub == Some("worker")
                    && args
                        .windows(2)
                        .any(|w| w[0] == "--id" && w[1] == format!("worker-{i}"))
            }
        }
    }
}

impl Lab {
    /// The pid of a component of our `ate up`, waiting for `ate up` to restart it if it is
    /// between two lives.
    pub(super) async fn component_pid(&self, component: Component) -> anyhow::Result<i32> {
        self.component_pid_other_than(component, None).await
    }

    /// [`Lab::component_pid`] of a process other than `old` (a restarted one).
    async fn component_pid_other_than(
        &self,
        component: Component,
        old: Option<i32>,
    ) -> anyhow::Result<i32> {
        let up = self.up_pid().context("ate up is not running")?;
        let deadline = Instant::now() + COMPONENT_WAIT;
        loop {
            if let Some((pid, _)) = children_of(up)
                .into_iter()
                .find(|(pid, args)| Some(*pid) != old && component.matches(args))
            {
                return Ok(pid);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no {} among the children of ate up ({up}) after {COMPONENT_WAIT:?}",
                component.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9 of the component, then waits until `ate up` has started it again: the fault is
    /// the crash and the restart, and recovery is measured from the restart.
    async fn kill_component(&self, component: Component) -> anyhow::Result<()> {
        let pid = self.component_pid(component).await?;
        eprintln!("    kill -9 {} ({pid})", component.name());
        signal(pid, Signal::SIGKILL)?;
        let new = self.component_pid_other_than(component, Some(pid)).await?;
        eprintln!("    {} restarted by ate up ({new})", component.name());
        Ok(())
    }

    /// kill -9 of the component with `ate up` frozen (SIGSTOP) for `down`, so nothing restarts
    /// it meanwhile; then `ate up` goes on (SIGCONT) and restarts it.
    async fn kill_unsupervised(&self, component: Component, down: Duration) -> anyhow::Result<()> {
        let up = self.up_pid().context("ate up is not running")?;
        let pid = self.component_pid(component).await?;
        eprintln!(
            "    SIGSTOP ate up ({up}), kill -9 {} ({pid}), {} s down",
            component.name(),
            down.as_secs()
        );
        signal(up, Signal::SIGSTOP)?;
        let killed = signal(pid, Signal::SIGKILL);
        tokio::time::sleep(down).await;
        signal(up, Signal::SIGCONT)?;
        killed?;
        let new = self.component_pid_other_than(component, Some(pid)).await?;
        eprintln!("    {} restarted by ate up ({new})", component.name());
        Ok(())
    }

    /// SIGSTOP of the component for `pause`, then SIGCONT: alive but silent, its connections
    /// open. (Teardown sends SIGCONT to every child of `ate up` too, should the bench be
    /// interrupted in between.)
    async fn freeze(&self, component: Component, pause: Duration) -> anyhow::Result<()> {
        let pid = self.component_pid(component).await?;
        eprintln!(
            "    SIGSTOP {} ({pid}) for {} s",
            component.name(),
            pause.as_secs()
        );
        signal(pid, Signal::SIGSTOP)?;
        tokio::time::sleep(pause).await;
        signal(pid, Signal::SIGCONT)
    }

    async fn store_down(&mut self, pause: Duration) -> anyhow::Result<()> {
        let pg = self
            .pg
            .as_mut()
            .context("the store faults need --private-postgres")?;
        eprintln!("    pg_ctl stop -m fast for {} s", pause.as_secs());
        let stopped = pg.stop().await;
        tokio::time::sleep(pause).await;
        let started = pg.start().await;
        stopped.and(started)
    }

    /// An ASYNC suspend through the api.
    pub(super) async fn suspend(&self, name: &str) -> anyhow::Result<()> {
        let mut actors = self.api().await?.actors;
        let call = actors.suspend_actor(v1::SuspendActorRequest {
            actor: Some(v1::ObjectRef {
                atespace: ATESPACE.into(),
                name: name.into(),
            }),
            mode: ate_core::SuspendMode::Async.wire(),
            grace_ms: 0,
            reason: String::new(),
        });
        match tokio::time::timeout(Duration::from_secs(60), call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) => anyhow::bail!("{} ({:?})", s.message(), s.code()),
            Err(_) => anyhow::bail!("no answer within 60 s"),
        }
    }

    /// Polls the actor's state for up to 10 s until it is `want`; returns the last state read.
    pub(super) async fn wait_state(&self, name: &str, want: v1::ActorState) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = String::from("unknown");
        loop {
            if let Ok(c) = self.api().await {
                let read = c
                    .actors
                    .clone()
                    .get_actor(v1::GetActorRequest {
                        actor: Some(v1::ObjectRef {
                            atespace: ATESPACE.into(),
                            name: name.into(),
                        }),
                    })
                    .await;
                if let Ok(a) = read {
                    let state = a.into_inner().state();
                    last = state.as_str_name().to_string();
                    if state == want {
                        return last;
                    }
                }
            }
            if Instant::now() >= deadline {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
