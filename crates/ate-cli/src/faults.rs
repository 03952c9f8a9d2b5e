//! `ate bench faults`: a Jepsen-style fault suite on a system of its own.
//!
//! The bench starts its own `ate up` (this executable) in a fresh state dir, on free loopback
//! ports and a private loopback /24 for the workers, optionally on a PostgreSQL cluster of its own
//! (`--private-postgres`). It creates counter actors and keeps one sequential client per actor
//! going through the router, recording every answer's memory count. Then it injects one fault at
//! a time (kill -9 of a component, a frozen api, a stopped store, a full snapshot disk, a restart
//! of the whole system), waits until every actor answers again and checks what must hold whatever
//! the fault:
//!
//! - no state lost: an actor's memory count never goes back (a rollback to an older snapshot or
//!   a fresh start would);
//! - no double activation: no actor has a running container on two workers;
//! - slot accounting: each worker's used slots (api) equal its running containers (runc);
//! - no orphans: no actor netns, overlay mount or counter process without its container.
//!
//! Table on stdout, progress on stderr, JSON to `--out`. Exit code 1 when a check fails (or a
//! fault's own expectation, such as "a suspend onto a full disk fails and the actor keeps
//! running"); unavailability over 10 s is only marked. The bench always stops what it started
//! (`ate up`, leftover sandboxes, the tmpfs, PostgreSQL), also on error or Ctrl-C.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ate_proto::v1;
use bytes::Bytes;
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

use crate::client::{self, Clients};

/// Atespace of the bench's actors.
const ATESPACE: &str = "faults";
/// The demo template `ate up` registers.
const TEMPLATE: &str = "ate-demo/counter";
/// One request's budget: longer than the router's parking budget, so a parked request is seen
/// with the router's own answer rather than as our timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between two requests of one client loop.
const REQUEST_PAUSE: Duration = Duration::from_millis(50);
/// Steady load before each fault, so each fault's window starts from a quiet system.
const SETTLE: Duration = Duration::from_secs(3);
/// How long every actor gets to answer 200 again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Load kept going after the recovery, inside the fault's window: some effects of a fault come
/// later (the router's assignment cache expires after 5 s, leases run out, a restarted
/// component reconciles).
const OBSERVE: Duration = Duration::from_secs(5);
/// First answers of fresh actors (image unpack, first starts on a busy machine).
const FIRST_ANSWERS_TIMEOUT: Duration = Duration::from_secs(120);
/// The api updates slots asynchronously, and a torn-down sandbox takes a moment to disappear:
/// slot and orphan checks retry for this long before they report.
const CHECK_RETRY: Duration = Duration::from_secs(5);
/// `ate up` gets this long to stop gracefully before it (and its children) are killed.
const UP_STOP_GRACE: Duration = Duration::from_secs(60);
/// `ate up` start-up budget (its own steps each have 30 s).
const UP_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// A killed component is restarted by `ate up` after its backoff (up to 10 s).
const COMPONENT_WAIT: Duration = Duration::from_secs(15);
/// How often the double-activation sampler lists the containers during the run.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Reported target for the longest unavailability (marked, not failed).
const UNAVAILABILITY_TARGET_S: f64 = 10.0;
/// Size of the tmpfs mounted on `<state>/snapshots` for `snapshot-disk-full`.
const SNAPSHOT_TMPFS_SIZE: &str = "512m";
/// Actors of `snapshot-disk-full` whose suspend must fail.
const DISK_FULL_VICTIMS: usize = 2;
/// Worker slots of the bench's system.
const WORKER_SLOTS: u32 = 8;
const DEFAULT_IMAGES_DIR: &str = "/var/lib/ate/images";

#[derive(Args, Debug)]
pub struct FaultsArgs {
    /// State dir of the bench's own `ate up` (default: a fresh temp dir, removed after a passing
    /// run). Must not be the state dir of a running system.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Directory of the demo OCI image layouts (`workloads/build-images.sh DIR`).
    #[arg(long, default_value = DEFAULT_IMAGES_DIR)]
    images_dir: PathBuf,
    /// Counter actors, each with its own sequential client.
    #[arg(long, default_value_t = 8)]
    actors: usize,
    /// Workers of the bench's `ate up` (8 slots each).
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// The short suite: kill-worker, kill-node, kill-api, kill-router, restart-up,
    /// snapshot-disk-full (and store-down-12s with --private-postgres).
    #[arg(long, conflicts_with = "only")]
    short: bool,
    /// Only these faults, comma separated, in the suite's order.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Fault>,
    /// Run the system on a PostgreSQL 15 cluster of the bench's own (in `<state>/pg`, as the
    /// `postgres` user, on a free loopback port) instead of SQLite; enables the store-down faults.
    #[arg(long)]
    private_postgres: bool,
    /// PostgreSQL binaries (initdb, pg_ctl).
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pg_bin: PathBuf,
    /// JSON results file.
    #[arg(long, default_value = "bench-faults.json")]
    out: PathBuf,
}

/// The faults, in the order the suite injects them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// kill -9 of `ate worker --id worker-1` (its sandboxes outlive it and are re-adopted).
    #[value(name = "kill-worker")]
    KillWorker,
    /// kill -9 of the node agent.
    #[value(name = "kill-node")]
    KillNode,
    /// kill -9 of the api.
    #[value(name = "kill-api")]
    KillApi,
    /// kill -9 of the router.
    #[value(name = "kill-router")]
    KillRouter,
    /// SIGSTOP of the api for 15 s: connections stay open but nothing answers.
    #[value(name = "api-down-15s")]
    ApiDown15s,
    /// PostgreSQL stopped (fast) for 12 s.
    #[value(name = "store-down-12s")]
    StoreDown12s,
    /// PostgreSQL stopped (fast) for 60 s: longer than the worker leases.
    #[value(name = "store-down-60s")]
    StoreDown60s,
    /// A graceful stop of the whole `ate up` (actors suspended) and a new one on the same state.
    #[value(name = "restart-up")]
    RestartUp,
    /// kill -9 of `ate up` itself (its components die with it, the sandboxes do not) and a new
    /// one on the same state: every actor must come back with its memory.
    #[value(name = "kill-up")]
    KillUp,
    /// The snapshot disk full: suspends must fail and leave the actors running.
    #[value(name = "snapshot-disk-full")]
    SnapshotDiskFull,
    /// SIGSTOP of `ate worker --id worker-1` for 30 s, well beyond the api's worker expiry
    /// (12 s) and the router's assignment cache (5 s), while its sandboxes keep running. Only
    /// with `--only`: not part of the suites.
    #[value(name = "worker-stop-30s")]
    WorkerStop30s,
    /// kill -9 of `ate worker --id worker-1` while `ate up` is frozen, so that the worker stays
    /// dead for 20 s (beyond the api's 12 s expiry) while its sandboxes keep running; then
    /// `ate up` goes on and restarts it. Only with `--only`: not part of the suites.
    #[value(name = "worker-down-20s")]
    WorkerDown20s,
}

impl Fault {
    const ALL: [Fault; 12] = [
        Fault::KillWorker,
        Fault::KillNode,
        Fault::KillApi,
        Fault::KillRouter,
        Fault::ApiDown15s,
        Fault::StoreDown12s,
        Fault::StoreDown60s,
        Fault::RestartUp,
        Fault::KillUp,
        Fault::SnapshotDiskFull,
        Fault::WorkerStop30s,
        Fault::WorkerDown20s,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::KillWorker => "kill-worker",
            Fault::KillNode => "kill-node",
            Fault::KillApi => "kill-api",
            Fault::KillRouter => "kill-router",
            Fault::ApiDown15s => "api-down-15s",
            Fault::StoreDown12s => "store-down-12s",
            Fault::StoreDown60s => "store-down-60s",
            Fault::RestartUp => "restart-up",
            Fault::KillUp => "kill-up",
            Fault::SnapshotDiskFull => "snapshot-disk-full",
            Fault::WorkerStop30s => "worker-stop-30s",
            Fault::WorkerDown20s => "worker-down-20s",
        }
    }

    /// Stopping the store is only possible when the bench owns it.
    fn needs_postgres(self) -> bool {
        matches!(self, Fault::StoreDown12s | Fault::StoreDown60s)
    }

    fn in_short_suite(self) -> bool {
        !matches!(
            self,
            Fault::ApiDown15s | Fault::StoreDown60s | Fault::WorkerStop30s | Fault::WorkerDown20s
        )
    }

    /// Faults beyond the specified suites, run only when named with `--only`.
    fn only_on_request(self) -> bool {
        matches!(self, Fault::WorkerStop30s | Fault::WorkerDown20s)
    }
}

/// The faults to inject: `--only`, else the short or the full suite; store faults only with the
/// bench's own PostgreSQL.
fn plan(a: &FaultsArgs) -> anyhow::Result<Vec<Fault>> {
    if !a.only.is_empty() {
        if let Some(f) = a.only.iter().find(|f| f.needs_postgres()) {
            anyhow::ensure!(
                a.private_postgres,
                "{} stops the store: it needs --private-postgres",
                f.name()
            );
        }
        return Ok(Fault::ALL
            .into_iter()
            .filter(|f| a.only.contains(f))
            .collect());
    }
    Ok(Fault::ALL
        .into_iter()
        .filter(|f| !f.only_on_request())
        .filter(|f| !a.short || f.in_short_suite())
        .filter(|f| a.private_postgres || !f.needs_postgres())
        .collect())
}

pub async fn run(a: FaultsArgs) -> anyhow::Result<ExitCode> {
    preflight()?;
    let plan = plan(&a)?;
    anyhow::ensure!(a.actors > 0, "--actors must be at least 1");
    anyhow::ensure!(a.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(
        a.actors <= (a.workers * WORKER_SLOTS) as usize,
        "--actors {} do not fit on {} workers of {WORKER_SLOTS} slots",
        a.actors,
        a.workers
    );
    let mut lab = Lab::new(&a, &plan)?;
    eprintln!(
        "==> fault suite: {} in {} ({} actors, {} workers, {})",
        plan.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
        lab.state.display(),
        a.actors,
        a.workers,
        if a.private_postgres {
            "private PostgreSQL"
        } else {
            "SQLite"
        }
    );
    let signal = ate_tls::process::shutdown_signal();
    let outcome = tokio::select! {
        r = suite(&mut lab, &a, &plan) => r,
        _ = signal => Err(anyhow::anyhow!("interrupted")),
    };
    let passed = outcome.as_ref().is_ok_and(Suite::passed);
    lab.teardown(passed).await;
    let suite = outcome?;
    print!("{}", suite.table());
    write_json(&a.out, &suite.json(&a, &lab))?;
    Ok(if suite.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What the bench needs from the host: root (runc, netns, mounts), runc and CRIU.
fn preflight() -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::Uid::effective().is_root(),
        "the fault suite starts runc sandboxes, kills processes and mounts a tmpfs: run it as root"
    );
    for tool in ["runc", "criu"] {
        anyhow::ensure!(
            on_path(tool),
            "{tool} is not installed (scripts/setup.sh installs it)"
        );
    }
    Ok(())
}

/// True when `program` is an executable file in a `PATH` directory.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            let p = d.join(program);
            p.is_file()
                && std::fs::metadata(&p).is_ok_and(|m| {
                    std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
                })
        })
    })
}

/// Everything from the system's start to the last fault's checks.
async fn suite(lab: &mut Lab, a: &FaultsArgs, plan: &[Fault]) -> anyhow::Result<Suite> {
    if a.private_postgres {
        lab.start_postgres(&a.pg_bin).await?;
    }
    if plan.contains(&Fault::SnapshotDiskFull) {
        lab.mount_snapshot_tmpfs().await?;
    }
    lab.start_up_first().await?;
    let actors: Vec<String> = (1..=a.actors).map(|i| format!("counter-{i}")).collect();
    lab.create_actors(&actors).await?;
    let load = Load::start(&lab.router_url(), &actors, lab.clock);
    let sampler = Sampler::start(lab.layout(&actors), lab.clock);
    eprintln!("==> waiting for the first answer of every actor");
    if let Err(missing) = load.wait_answered(0.0, FIRST_ANSWERS_TIMEOUT).await {
        load.stop().await;
        sampler.stop().await;
        anyhow::bail!(
            "actors {} never answered 200 within {FIRST_ANSWERS_TIMEOUT:?}; see {}",
            missing.join(", "),
            lab.state.join("logs").display()
        );
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut segment_start = 0.0;
    let mut aborted = None;
    for &fault in plan {
        tokio::time::sleep(SETTLE).await;
        eprintln!("==> {}", fault.name());
        let row = run_fault(lab, &load, &sampler, &actors, fault, segment_start).await;
        segment_start = row.checked;
        eprintln!("    {}", row.summary());
        rows.push(row);
        if !lab.up_running() {
            let why = format!(
                "ate up exited after {}; the remaining faults were not run (see {})",
                fault.name(),
                lab.up_log().display()
            );
            eprintln!("==> {why}");
            aborted = Some(why);
            break;
        }
    }
    load.stop().await;
    sampler.stop().await;
    Ok(Suite {
        rows,
        seconds: started.elapsed().as_secs_f64(),
        aborted,
        store: if a.private_postgres {
            "postgres"
        } else {
            "sqlite"
        },
    })
}

// ------------------------------------------------------------------ the fault and its checks

/// Injects `fault`, waits for recovery, runs the checks and builds the fault's row.
async fn run_fault(
    lab: &mut Lab,
    load: &Load,
    sampler: &Sampler,
    actors: &[String],
    fault: Fault,
    segment_start: f64,
) -> Row {
    let started = lab.clock.now();
    let mut notes = Vec::new();
    let fault_errors = match inject(lab, load, actors, fault, &mut notes).await {
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
    tokio::time::sleep(OBSERVE).await;
    let window_end = lab.clock.now();
    let checks = check_invariants(lab, actors).await;
    let checked = lab.clock.now();
    let history = load.samples();
    let mut row = Row::new(fault, started, injected, recovered, checked);
    row.tally(&history, &load.actors, started, window_end, segment_start);
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
        Fault::SnapshotDiskFull => return snapshot_disk_full(lab, load, actors, notes).await,
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

/// The checks after a fault's recovery.
#[derive(Default)]
struct Checks {
    double: Vec<(String, Vec<String>)>,
    slots: Vec<SlotMismatch>,
    orphans: Vec<String>,
    /// A check that could not run.
    errors: Vec<String>,
}

async fn check_invariants(lab: &Lab, actors: &[String]) -> Checks {
    let layout = lab.layout(actors);
    let mut checks = Checks::default();
    match layout.containers().await {
        Ok(containers) => checks.double = layout.double_activations(&containers),
        Err(e) => checks
            .errors
            .push(format!("cannot list the containers: {e:#}")),
    }
    match lab.slot_mismatches(&layout).await {
        Ok(m) => checks.slots = m,
        Err(e) => checks.errors.push(format!("slot check did not run: {e:#}")),
    }
    match layout.orphans_settled().await {
        Ok(o) => checks.orphans = o,
        Err(e) => checks
            .errors
            .push(format!("orphan check did not run: {e:#}")),
    }
    checks
}

// ------------------------------------------------------------------ containers and leftovers

/// A runc container as `runc list --format json` shows it.
#[derive(Clone, Debug, serde::Deserialize)]
struct Container {
    id: String,
    #[serde(default)]
    status: String,
}

/// Where an actor's sandbox would be on each worker: its container id (= netns name) and
/// cgroup short id, derived from the actor's directory exactly as the worker does.
#[derive(Clone)]
struct Layout {
    state: PathBuf,
    workers: Vec<String>,
    /// container id → (worker, actor)
    ids: HashMap<String, (String, String)>,
}

impl Layout {
    fn new(state: &Path, workers: u32, actors: &[String]) -> Layout {
        let mut ids: BTreeSet<String> = (1..=workers).map(|i| format!("worker-{i}")).collect();
        if let Ok(dirs) = std::fs::read_dir(state.join("workers")) {
            ids.extend(
                dirs.flatten()
                    .map(|d| d.file_name().to_string_lossy().into_owned()),
            );
        }
        let workers: Vec<String> = ids.into_iter().collect();
        let mut map = HashMap::new();
        for w in &workers {
            for a in actors {
                let dir = actor_dir(state, w, ATESPACE, a);
                map.insert(container_id(&dir), (w.clone(), a.clone()));
            }
        }
        Layout {
            state: state.to_path_buf(),
            workers,
            ids: map,
        }
    }

    fn runc_root(&self, worker: &str) -> PathBuf {
        self.state.join("workers").join(worker).join("runc")
    }

    /// Every worker's containers (runc list), by worker id.
    async fn containers(&self) -> anyhow::Result<HashMap<String, Vec<Container>>> {
        let mut out = HashMap::new();
        for w in &self.workers {
            out.insert(w.clone(), runc_list(&self.runc_root(w)).await?);
        }
        Ok(out)
    }

    /// Actors with a running container on more than one worker, with those workers.
    fn double_activations(
        &self,
        containers: &HashMap<String, Vec<Container>>,
    ) -> Vec<(String, Vec<String>)> {
        let mut running: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (worker, list) in containers {
            for c in list.iter().filter(|c| c.status == "running") {
                if let Some((w, actor)) = self.ids.get(&c.id)
                    && w == worker
                {
                    running.entry(actor.clone()).or_default().push(w.clone());
                }
            }
        }
        running
            .into_iter()
            .filter(|(_, ws)| ws.len() > 1)
            .map(|(a, mut ws)| {
                ws.sort();
                (a, ws)
            })
            .collect()
    }

    /// [`Layout::orphans`], again for up to `CHECK_RETRY` while any is found: a sandbox being
    /// torn down or built has its netns or mount for a moment without its container.
    async fn orphans_settled(&self) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + CHECK_RETRY;
        loop {
            let found = self.orphans().await?;
            if found.is_empty() || Instant::now() >= deadline {
                return Ok(found);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Netns, overlay mounts and counter processes of this state dir's actors whose container
    /// runc does not list.
    async fn orphans(&self) -> anyhow::Result<Vec<String>> {
        let containers = self.containers().await?;
        let listed: HashSet<&str> = containers
            .values()
            .flatten()
            .map(|c| c.id.as_str())
            .collect();
        let mut out = Vec::new();
        let name = |id: &str| {
            self.ids
                .get(id)
                .map(|(w, a)| format!("{ATESPACE}/{a} on {w}"))
                .unwrap_or_else(|| "an actor of this state dir".into())
        };
        for netns in list_netns() {
            if self.ids.contains_key(&netns) && !listed.contains(netns.as_str()) {
                out.push(format!(
                    "netns {netns} ({}) without its container",
                    name(&netns)
                ));
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        let workers_dir = self.state.join("workers");
        for mount in overlay_mounts(&mountinfo, &workers_dir) {
            let Some(dir) = mount.strip_suffix("/rootfs") else {
                out.push(format!("overlay mount {mount} outside an actor's rootfs"));
                continue;
            };
            let id = container_id(Path::new(dir));
            if !listed.contains(id.as_str()) {
                out.push(format!(
                    "overlay mount {mount} ({}) without its container {id}",
                    name(&id)
                ));
            }
        }
        let ours: HashMap<String, &String> = self
            .ids
            .keys()
            .map(|id| (id.trim_start_matches("ate-").to_string(), id))
            .collect();
        for (pid, short) in counter_processes() {
            if let Some(id) = ours.get(&short)
                && !listed.contains(id.as_str())
            {
                out.push(format!(
                    "counter process {pid} in cgroup /ate/{short} ({}) without its container",
                    name(id)
                ));
            }
        }
        // Cgroup directories the runtime made for a sandbox (`<hierarchy>/ate/<short id>`) must
        // go with it: a kept one would hand its limits to the actor's next start.
        for (dir, short) in actor_cgroup_dirs() {
            if let Some(id) = ours.get(&short)
                && !listed.contains(id.as_str())
            {
                out.push(format!(
                    "cgroup {} ({}) without its container",
                    dir.display(),
                    name(id)
                ));
            }
        }
        Ok(out)
    }
}

/// `<state>/workers/<worker>/actors/<atespace>/<name>`: the directory the worker hashes into the
/// sandbox's names.
fn actor_dir(state: &Path, worker: &str, atespace: &str, name: &str) -> PathBuf {
    state
        .join("workers")
        .join(worker)
        .join("actors")
        .join(atespace)
        .join(name)
}

/// The container id (= netns name, `ate-<short id>`) of the actor directory `dir`.
fn container_id(dir: &Path) -> String {
    ate_worker::ActorSandbox::new("", "", "", dir).container_id()
}

/// `runc --root ROOT list --format json`; no root yet means no containers.
async fn runc_list(root: &Path) -> anyhow::Result<Vec<Container>> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let out = Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run runc list")?;
    anyhow::ensure!(
        out.status.success(),
        "runc --root {} list: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let list: Option<Vec<Container>> = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("runc --root {} list: unexpected output", root.display()))?;
    Ok(list.unwrap_or_default())
}

/// Named network namespaces (`/var/run/netns`).
fn list_netns() -> Vec<String> {
    std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Mount points of overlay mounts under `under`, from a mountinfo text.
fn overlay_mounts(mountinfo: &str, under: &Path) -> Vec<String> {
    let prefix = format!("{}/", under.display());
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount_point = unescape_mountinfo(left.split_whitespace().nth(4)?);
            (fstype == "overlay" && mount_point.starts_with(&prefix)).then_some(mount_point)
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(oct) = field.get(i + 1..i + 4)
            && oct.bytes().all(|c| (b'0'..=b'7').contains(&c))
            && let Ok(b) = u8::from_str_radix(oct, 8)
        {
            out.push(b);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(directory, short id)` of every actor cgroup in every hierarchy under /sys/fs/cgroup.
fn actor_cgroup_dirs() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for h in hierarchies.flatten() {
        let Ok(actors) = std::fs::read_dir(h.path().join("ate")) else {
            continue;
        };
        for a in actors.flatten() {
            if a.path().is_dir() {
                out.push((a.path(), a.file_name().to_string_lossy().into_owned()));
            }
        }
    }
    out
}

/// `(pid, cgroup short id)` of every process named `counter` that sits in an actor cgroup
/// (`/ate/<short id>`).
fn counter_processes() -> Vec<(u32, String)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "counter")
        })
        .filter_map(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            Some((pid, actor_cgroup(&cgroup)?))
        })
        .collect()
}

/// The actor short id in a `/proc/PID/cgroup` text (`N:controller:/ate/<short id>`).
fn actor_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let rest = path.split("/ate/").nth(1)?;
        let short = rest.split('/').next()?;
        (!short.is_empty()).then(|| short.to_string())
    })
}

/// When an actor was seen running on which workers (more than one).
type Sighting = (f64, String, Vec<String>);

/// Lists the containers every `SAMPLE_EVERY` during the whole run and records actors running on
/// two workers at once, including ones that are gone again by the time a fault's checks run.
struct Sampler {
    seen: Arc<Mutex<Vec<Sighting>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(layout: Layout, clock: Clock) -> Sampler {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (seen, stop) = (seen.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(c) = layout.containers().await {
                        let now = clock.now();
                        let doubles = layout.double_activations(&c);
                        lock(&seen).extend(doubles.into_iter().map(|(a, w)| (now, a, w)));
                    }
                    tokio::time::sleep(SAMPLE_EVERY).await;
                }
            }
        });
        Sampler { seen, stop, task }
    }

    /// Distinct actors seen on two workers within `(from, to]`, with the workers.
    fn seen_between(&self, from: f64, to: f64) -> Vec<(String, Vec<String>)> {
        let mut by_actor: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (t, a, ws) in lock(&self.seen).iter() {
            if *t > from && *t <= to {
                by_actor.entry(a.clone()).or_insert_with(|| ws.clone());
            }
        }
        by_actor.into_iter().collect()
    }

    async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = (&mut self.task).await;
    }
}

/// An interrupted suite drops the sampler without `stop`: its task must not outlive it.
impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ------------------------------------------------------------------ client load

/// Seconds since the suite started: the time axis of every sample and event.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// One request of a client loop.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    start: f64,
    end: f64,
    /// HTTP status; 0 for a transport error or our timeout.
    status: u16,
    /// The memory count of a 200.
    count: Option<u64>,
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One sequential client per actor, recording every request.
struct Load {
    actors: Vec<String>,
    history: Arc<Vec<Mutex<Vec<Sample>>>>,
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl Load {
    fn start(router: &str, actors: &[String], clock: Clock) -> Load {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let http: HttpClient = Client::builder(TokioExecutor::new()).build(conn);
        let history: Arc<Vec<Mutex<Vec<Sample>>>> =
            Arc::new(actors.iter().map(|_| Mutex::new(Vec::new())).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for (i, name) in actors.iter().enumerate() {
            let (http, history, stop) = (http.clone(), history.clone(), stop.clone());
            let url = format!("{}/", router.trim_end_matches('/'));
            let target = format!("{ATESPACE}/{name}");
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let start = clock.now();
                    let (status, count) = get_count(&http, &url, &target).await;
                    let end = clock.now();
                    lock(&history[i]).push(Sample {
                        start,
                        end,
                        status,
                        count,
                    });
                    tokio::time::sleep(REQUEST_PAUSE).await;
                }
            });
        }
        Load {
            actors: actors.to_vec(),
            history,
            stop,
            tasks,
        }
    }

    /// A copy of every actor's samples so far.
    fn samples(&self) -> Vec<Vec<Sample>> {
        self.history.iter().map(|h| lock(h).clone()).collect()
    }

    /// Waits until every actor has a 200 to a request sent at or after `since`; returns when
    /// the last of them arrived, or the actors still missing after `timeout`.
    async fn wait_answered(&self, since: f64, timeout: Duration) -> Result<f64, Vec<String>> {
        self.wait_answered_by(&self.actors, since, timeout).await
    }

    async fn wait_answered_by(
        &self,
        actors: &[String],
        since: f64,
        timeout: Duration,
    ) -> Result<f64, Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut missing = Vec::new();
            let mut last = since;
            for a in actors {
                let Some(i) = self.actors.iter().position(|x| x == a) else {
                    continue;
                };
                let first = lock(&self.history[i])
                    .iter()
                    .find(|s| s.status == 200 && s.start >= since)
                    .map(|s| s.end);
                match first {
                    Some(t) => last = last.max(t),
                    None => missing.push(a.clone()),
                }
            }
            if missing.is_empty() {
                return Ok(last);
            }
            if Instant::now() >= deadline {
                return Err(missing);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One `GET /` through the router: the status and the memory count of a 200 (status 0 for a
/// transport error or after `REQUEST_TIMEOUT`).
async fn get_count(http: &HttpClient, url: &str, target: &str) -> (u16, Option<u64>) {
    let request = async {
        let req = hyper::Request::get(url)
            .header("ate-target-actor", target)
            .body(Empty::new())?;
        let resp = http.request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok((200, body))) => (200, memory_count(&body)),
        Ok(Ok((status, _))) => (status, None),
        Ok(Err(_)) | Err(_) => (0, None),
    }
}

/// N of the counter's `preserved memory count: N | …`.
fn memory_count(body: &str) -> Option<u64> {
    let rest = body.split("preserved memory count:").nth(1)?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

// ------------------------------------------------------------------ analysis

/// An actor's memory count that did not follow the one before it by exactly 1.
#[derive(Clone, Debug, PartialEq)]
struct CountEvent {
    actor: String,
    at: f64,
    previous: u64,
    got: u64,
}

/// State lost (a count ≤ the last one seen) and replies lost (a count more than 1 ahead: a
/// request executed whose answer never came back) in one actor's history.
fn count_events(actor: &str, samples: &[Sample]) -> (Vec<CountEvent>, Vec<CountEvent>) {
    let (mut lost, mut skipped) = (Vec::new(), Vec::new());
    let mut last: Option<u64> = None;
    for s in samples.iter().filter(|s| s.status == 200) {
        let Some(got) = s.count else { continue };
        if let Some(previous) = last {
            let event = CountEvent {
                actor: actor.to_string(),
                at: s.end,
                previous,
                got,
            };
            if got <= previous {
                lost.push(event);
            } else if got > previous + 1 {
                skipped.push(event);
            }
        }
        last = Some(got);
    }
    (lost, skipped)
}

/// The longest time between two 200s of one actor around the window `[from, to]`: from the last
/// 200 before `from` to the end of the window (which is at least that long for an actor that
/// never answered again).
fn longest_gap(samples: &[Sample], from: f64, to: f64) -> f64 {
    let oks: Vec<f64> = samples
        .iter()
        .filter(|s| s.status == 200)
        .map(|s| s.end)
        .collect();
    let anchor = oks
        .iter()
        .rev()
        .find(|&&t| t < from)
        .copied()
        .unwrap_or(from);
    let mut points = vec![anchor];
    points.extend(oks.iter().copied().filter(|&t| t >= from && t <= to));
    points.push(to);
    points.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max)
}

#[derive(Clone, Debug, PartialEq)]
struct SlotMismatch {
    worker: String,
    used: u32,
    running: usize,
}

/// One fault's results.
struct Row {
    fault: Fault,
    started: f64,
    injected: f64,
    recovered: Option<f64>,
    /// End of the window: the recovery plus `OBSERVE`.
    window_end: f64,
    checked: f64,
    requests: usize,
    answers: BTreeMap<u16, usize>,
    unavailable: f64,
    unavailable_actor: String,
    lost: Vec<CountEvent>,
    replies_lost: Vec<CountEvent>,
    double: Vec<(String, Vec<String>)>,
    double_seen: Vec<(String, Vec<String>)>,
    slots: Vec<SlotMismatch>,
    orphans: Vec<String>,
    fault_errors: Vec<String>,
    notes: Vec<String>,
}

impl Row {
    fn new(fault: Fault, started: f64, injected: f64, recovered: Option<f64>, checked: f64) -> Row {
        Row {
            fault,
            started,
            injected,
            recovered,
            window_end: checked,
            checked,
            requests: 0,
            answers: BTreeMap::new(),
            unavailable: 0.0,
            unavailable_actor: String::new(),
            lost: Vec::new(),
            replies_lost: Vec::new(),
            double: Vec::new(),
            double_seen: Vec::new(),
            slots: Vec::new(),
            orphans: Vec::new(),
            fault_errors: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Requests and answers of the window `[started, window_end]`, the longest unavailability,
    /// and the count events since the previous fault's checks (`segment_start`), so that none
    /// falls between two rows.
    fn tally(
        &mut self,
        history: &[Vec<Sample>],
        actors: &[String],
        started: f64,
        window_end: f64,
        segment_start: f64,
    ) {
        self.window_end = window_end;
        for (actor, samples) in actors.iter().zip(history) {
            for s in samples
                .iter()
                .filter(|s| s.start >= started && s.start <= window_end)
            {
                self.requests += 1;
                *self.answers.entry(s.status).or_default() += 1;
            }
            let gap = longest_gap(samples, started, window_end);
            if gap > self.unavailable {
                self.unavailable = gap;
                self.unavailable_actor = actor.clone();
            }
            let in_segment = |e: &CountEvent| e.at > segment_start && e.at <= self.checked;
            let (lost, skipped) = count_events(actor, samples);
            self.lost.extend(lost.into_iter().filter(in_segment));
            self.replies_lost
                .extend(skipped.into_iter().filter(in_segment));
        }
    }

    /// Every target: no state lost, no actor running on two workers (after recovery or at any
    /// sample during the window), slots equal to real containers, no orphan.
    fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.double.is_empty()
            && self.double_seen.is_empty()
            && self.slots.is_empty()
            && self.orphans.is_empty()
            && self.fault_errors.is_empty()
    }

    /// `200:812 502:2 err:1` (err = transport error or timeout).
    fn answers_text(&self) -> String {
        self.answers
            .iter()
            .map(|(status, n)| format!("{}:{n}", status_key(*status)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn summary(&self) -> String {
        format!(
            "{}: {} requests ({}), longest unavailability {:.2} s, states lost {}, double \
             activations {}, slot mismatches {}, orphans {}{}",
            if self.passed() { "pass" } else { "FAIL" },
            self.requests,
            self.answers_text(),
            self.unavailable,
            self.lost.len(),
            self.double.len(),
            self.slots.len(),
            self.orphans.len(),
            if self.fault_errors.is_empty() {
                String::new()
            } else {
                format!("; {}", self.fault_errors.join("; "))
            }
        )
    }

    fn json(&self) -> serde_json::Value {
        let events = |v: &[CountEvent]| {
            v.iter()
                .map(|e| json!({"actor": e.actor, "at_s": round2(e.at), "previous": e.previous, "got": e.got}))
                .collect::<Vec<_>>()
        };
        let pairs = |v: &[(String, Vec<String>)]| {
            v.iter()
                .map(|(a, ws)| json!({"actor": a, "workers": ws}))
                .collect::<Vec<_>>()
        };
        json!({
            "fault": self.fault.name(),
            "started_s": round2(self.started),
            "injected_s": round2(self.injected),
            "recovered_s": self.recovered.map(round2),
            "window_end_s": round2(self.window_end),
            "checked_s": round2(self.checked),
            "requests": self.requests,
            "answers": self.answers.iter().map(|(s, n)| (status_key(*s), json!(n))).collect::<serde_json::Map<_, _>>(),
            "longest_unavailable_s": round2(self.unavailable),
            "longest_unavailable_actor": self.unavailable_actor,
            "over_unavailability_target": self.unavailable > UNAVAILABILITY_TARGET_S,
            "states_lost": self.lost.len(),
            "states_lost_events": events(&self.lost),
            "replies_lost": self.replies_lost.len(),
            "replies_lost_events": events(&self.replies_lost),
            "double_activations": self.double.len(),
            "double_activation_actors": pairs(&self.double),
            "double_activations_sampled_during_window": pairs(&self.double_seen),
            "slot_mismatches": self.slots.len(),
            "slot_mismatch_workers": self.slots.iter().map(|m| json!({"worker": m.worker, "used": m.used, "running": m.running})).collect::<Vec<_>>(),
            "orphans": self.orphans.len(),
            "orphan_details": self.orphans,
            "fault_errors": self.fault_errors,
            "notes": self.notes,
            "pass": self.passed(),
        })
    }
}

/// An HTTP status as text; `err` for a transport error or timeout (status 0).
fn status_key(status: u16) -> String {
    match status {
        0 => "err".into(),
        s => s.to_string(),
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Every fault's row.
struct Suite {
    rows: Vec<Row>,
    seconds: f64,
    /// Why the suite stopped before its last fault (the system died), failing it.
    aborted: Option<String>,
    store: &'static str,
}

impl Suite {
    fn passed(&self) -> bool {
        self.aborted.is_none() && self.rows.iter().all(Row::passed)
    }

    fn table(&self) -> String {
        let mut out = format!(
            "{:<19} {:>8}  {:<34} {:>10} {:>5} {:>6} {:>5} {:>7}  {}\n",
            "fault",
            "requests",
            "answers",
            "unavail s",
            "lost",
            "double",
            "slots",
            "orphans",
            "result"
        );
        let mut notes = Vec::new();
        for r in &self.rows {
            let mark = if r.unavailable > UNAVAILABILITY_TARGET_S {
                "*"
            } else {
                " "
            };
            out.push_str(&format!(
                "{:<19} {:>8}  {:<34} {:>9.2}{mark} {:>5} {:>6} {:>5} {:>7}  {}\n",
                r.fault.name(),
                r.requests,
                r.answers_text(),
                r.unavailable,
                r.lost.len(),
                r.double.len(),
                r.slots.len(),
                r.orphans.len(),
                if r.passed() { "pass" } else { "FAIL" }
            ));
            notes.extend(row_notes(r));
        }
        if self
            .rows
            .iter()
            .any(|r| r.unavailable > UNAVAILABILITY_TARGET_S)
        {
            out.push_str(&format!(
                "* longest unavailability over the {UNAVAILABILITY_TARGET_S:.0} s target (reported, not failed)\n"
            ));
        }
        for n in notes {
            out.push_str(&format!("  {n}\n"));
        }
        if let Some(why) = &self.aborted {
            out.push_str(&format!("  ABORTED: {why}\n"));
        }
        out.push_str(&format!(
            "{} in {:.0} s on {}\n",
            if self.passed() {
                "all targets met"
            } else {
                "TARGETS MISSED"
            },
            self.seconds,
            self.store
        ));
        out
    }

    fn json(&self, a: &FaultsArgs, lab: &Lab) -> serde_json::Value {
        json!({
            "kind": "faults",
            "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs(),
            "actors": a.actors,
            "workers": a.workers,
            "store": self.store,
            "state_dir": lab.state.display().to_string(),
            "seconds": round2(self.seconds),
            "unavailability_target_s": UNAVAILABILITY_TARGET_S,
            "pass": self.passed(),
            "aborted": self.aborted,
            "faults": self.rows.iter().map(Row::json).collect::<Vec<_>>(),
        })
    }
}

/// The detail lines under the table for one row: what failed, and the notes.
fn row_notes(r: &Row) -> Vec<String> {
    let f = r.fault.name();
    let mut out = Vec::new();
    for e in &r.lost {
        out.push(format!(
            "{f}: STATE LOST {ATESPACE}/{} at {:.2} s: count {} after {}",
            e.actor, e.at, e.got, e.previous
        ));
    }
    for (a, ws) in &r.double {
        out.push(format!(
            "{f}: DOUBLE ACTIVATION {ATESPACE}/{a} running on {}",
            ws.join(", ")
        ));
    }
    for (a, ws) in &r.double_seen {
        out.push(format!(
            "{f}: {ATESPACE}/{a} was seen running on {} during the window",
            ws.join(", ")
        ));
    }
    for m in &r.slots {
        out.push(format!(
            "{f}: SLOTS {}: api says {} used, runc runs {}",
            m.worker, m.used, m.running
        ));
    }
    for o in &r.orphans {
        out.push(format!("{f}: ORPHAN {o}"));
    }
    for e in &r.fault_errors {
        out.push(format!("{f}: FAILED {e}"));
    }
    if !r.replies_lost.is_empty() {
        out.push(format!(
            "{f}: {} replies lost (executed, answer never came back)",
            r.replies_lost.len()
        ));
    }
    out.extend(r.notes.iter().map(|n| format!("{f}: {n}")));
    out
}

fn write_json(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("==> wrote {}", path.display());
    Ok(())
}

// ------------------------------------------------------------------ the system under test

/// A component of the bench's `ate up`, found among its children by command line.
#[derive(Clone, Copy, Debug)]
enum Component {
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

/// The PostgreSQL cluster of `--private-postgres`: `<state>/pg/data`, socket dir `<state>/pg`,
/// run as the `postgres` user.
struct Pg {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    running: bool,
}

impl Pg {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// initdb (trust auth) and the settings that keep it private: loopback, our port, the
    /// socket inside the cluster dir.
    async fn create(bin: &Path, dir: PathBuf) -> anyhow::Result<Pg> {
        anyhow::ensure!(
            bin.join("initdb").exists(),
            "no initdb in {} (pass --pg-bin)",
            bin.display()
        );
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        run_tool(
            Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(&dir),
            "chown",
        )
        .await?;
        let pg = Pg {
            bin: bin.to_path_buf(),
            dir,
            port: free_port()?,
            running: false,
        };
        pg.as_postgres(
            "initdb",
            &[
                "-D".into(),
                pg.data().display().to_string(),
                "-A".into(),
                "trust".into(),
                "-U".into(),
                "postgres".into(),
                "--no-sync".into(),
            ],
        )
        .await?;
        let conf = format!(
            "\n# ate bench faults\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n",
            pg.port,
            pg.dir.display()
        );
        let conf_path = pg.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path)
            .with_context(|| format!("cannot read {}", conf_path.display()))?;
        text.push_str(&conf);
        std::fs::write(&conf_path, text)
            .with_context(|| format!("cannot write {}", conf_path.display()))?;
        Ok(pg)
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        let log = self.dir.join("postgres.log").display().to_string();
        let data = self.data().display().to_string();
        self.as_postgres(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", "60", "start"].map(String::from),
        )
        .await?;
        self.running = true;
        Ok(())
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        let data = self.data().display().to_string();
        self.as_postgres(
            "pg_ctl",
            &["-D", &data, "-m", "fast", "-w", "-t", "60", "stop"].map(String::from),
        )
        .await?;
        self.running = false;
        Ok(())
    }

    /// `runuser -u postgres -- BIN/tool ARGS` in the cluster dir (postgres cannot read ours).
    async fn as_postgres(&self, tool: &str, args: &[String]) -> anyhow::Result<()> {
        run_tool(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join(tool))
                .args(args)
                .current_dir(&self.dir),
            tool,
        )
        .await
    }
}

/// Runs a command to completion; its output goes into the error when it fails. stdout is not
/// captured: a server it starts (pg_ctl) must not hold our pipe open.
async fn run_tool(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("cannot run {what}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// A free TCP port on 127.0.0.1 (bound then released; `ate up` is retried on new ports when a
/// neighbour took one in between).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("cannot find a free port")?
        .port())
}

/// The first worker address of a loopback /24 of our own: second octet 201–250 (the test
/// harness uses 1–200), third from our pid.
fn private_worker_ip() -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(127, 201 + (pid % 50) as u8, 1 + ((pid / 50) % 250) as u8, 2)
}

/// The ports `ate up` is started on.
#[derive(Clone, Copy)]
struct Ports {
    router: u16,
    router_metrics: u16,
    node: u16,
    worker: u16,
}

impl Ports {
    fn pick() -> anyhow::Result<Ports> {
        Ok(Ports {
            router: free_port()?,
            router_metrics: free_port()?,
            node: free_port()?,
            worker: free_port()?,
        })
    }
}

/// The system under test and everything the bench set up for it.
struct Lab {
    exe: PathBuf,
    state: PathBuf,
    /// The temp dir the bench created (removed after a passing run).
    owned: bool,
    /// The bench's own files: ready file, `ate up`'s log, its HOME.
    work: PathBuf,
    images: PathBuf,
    workers: u32,
    ports: Ports,
    first_ip: Ipv4Addr,
    up: Option<Child>,
    api: String,
    pg: Option<Pg>,
    tmpfs: Option<PathBuf>,
    clock: Clock,
}

impl Lab {
    fn new(a: &FaultsArgs, plan: &[Fault]) -> anyhow::Result<Lab> {
        anyhow::ensure!(!plan.is_empty(), "no fault to inject");
        // The running executable itself, even when cargo has relinked the file under its name
        // since (a path would then name another build, or nothing).
        let exe = PathBuf::from("/proc/self/exe");
        anyhow::ensure!(
            exe.exists(),
            "no /proc/self/exe: the suite needs Linux /proc"
        );
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        let images = cwd.join(&a.images_dir);
        anyhow::ensure!(
            images.join("counter").is_dir(),
            "no counter image in {} (build it with workloads/build-images.sh DIR and pass \
             --images-dir DIR)",
            images.display()
        );
        let (state, owned) = match &a.state_dir {
            Some(d) => (cwd.join(d), false),
            None => (temp_state_dir()?, true),
        };
        let work = state.join("bench-faults");
        std::fs::create_dir_all(work.join("home"))
            .with_context(|| format!("cannot create {}", work.display()))?;
        Ok(Lab {
            exe,
            state,
            owned,
            work,
            images,
            workers: a.workers,
            ports: Ports::pick()?,
            first_ip: private_worker_ip(),
            up: None,
            api: String::new(),
            pg: None,
            tmpfs: None,
            clock: Clock(Instant::now()),
        })
    }

    fn router_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.router)
    }

    fn ready_file(&self) -> PathBuf {
        self.work.join("ready.json")
    }

    fn up_log(&self) -> PathBuf {
        self.work.join("up.log")
    }

    fn layout(&self, actors: &[String]) -> Layout {
        Layout::new(&self.state, self.workers, actors)
    }

    /// `ate up`'s arguments; the same for every start, so a restart finds its state.
    fn up_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "up".into(),
            "--state-dir".into(),
            self.state.display().to_string(),
            "--images-dir".into(),
            self.images.display().to_string(),
            "--workers".into(),
            self.workers.to_string(),
            "--worker-slots".into(),
            WORKER_SLOTS.to_string(),
            "--api-listen".into(),
            "127.0.0.1:0".into(),
            "--api-http-listen".into(),
            "127.0.0.1:0".into(),
            "--node-listen".into(),
            format!("127.0.0.1:{}", self.ports.node),
            "--router-listen".into(),
            format!("127.0.0.1:{}", self.ports.router),
            "--router-metrics-listen".into(),
            format!("127.0.0.1:{}", self.ports.router_metrics),
            "--worker-first-ip".into(),
            self.first_ip.to_string(),
            "--worker-port".into(),
            self.ports.worker.to_string(),
            "--ready-file".into(),
            self.ready_file().display().to_string(),
        ];
        if let Some(pg) = &self.pg {
            args.extend(["--store".into(), pg.url()]);
        }
        args
    }

    async fn start_postgres(&mut self, bin: &Path) -> anyhow::Result<()> {
        eprintln!(
            "==> PostgreSQL cluster in {}",
            self.state.join("pg").display()
        );
        let mut pg = Pg::create(bin, self.state.join("pg")).await?;
        let started = pg.start().await;
        self.pg = Some(pg);
        started
    }

    /// A small tmpfs on the node's snapshot dir, so `snapshot-disk-full` can fill it.
    async fn mount_snapshot_tmpfs(&mut self) -> anyhow::Result<()> {
        let dir = self.state.join("snapshots");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        run_tool(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={SNAPSHOT_TMPFS_SIZE}"))
                .arg("tmpfs")
                .arg(&dir),
            "mount tmpfs",
        )
        .await?;
        self.tmpfs = Some(dir);
        Ok(())
    }

    /// The first start: on new ports when a neighbour took one of ours in between.
    async fn start_up_first(&mut self) -> anyhow::Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.start_up().await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 4 && format!("{e:#}").contains("in use") => {
                    eprintln!("==> a port was taken; starting ate up on new ports");
                    self.ports = Ports::pick()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts `ate up` and waits for its ready file. Its HOME is ours, so it does not write the
    /// user's `~/.config/ate`; its own process group, so a Ctrl-C reaches only the bench, which
    /// stops it in order.
    async fn start_up(&mut self) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(self.ready_file());
        let log_path = self.up_log();
        let log_from = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let stdout = log.try_clone()?;
        let home = self.work.join("home");
        let child = Command::new(&self.exe)
            .args(self.up_args())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("cannot start ate up")?;
        self.up = Some(child);
        let ready = self.wait_ready(log_from).await?;
        self.api = ready["api"].as_str().unwrap_or_default().to_string();
        anyhow::ensure!(!self.api.is_empty(), "ate up's ready file names no api");
        eprintln!(
            "==> ate up ready: router {} api {}",
            self.router_url(),
            self.api
        );
        Ok(())
    }

    async fn wait_ready(&mut self, log_from: u64) -> anyhow::Result<serde_json::Value> {
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(self.ready_file())
                && let Ok(v) = serde_json::from_str(&text)
            {
                return Ok(v);
            }
            let exited = match self.up.as_mut() {
                Some(c) => c.try_wait()?,
                None => anyhow::bail!("ate up is not running"),
            };
            if let Some(status) = exited {
                self.up = None;
                let log = std::fs::read(self.up_log()).unwrap_or_default();
                let from = usize::try_from(log_from).unwrap_or(0).min(log.len());
                anyhow::bail!(
                    "ate up exited during start-up ({status}):\n{}",
                    String::from_utf8_lossy(&log[from..]).trim()
                );
            }
            if started.elapsed() > UP_READY_TIMEOUT {
                anyhow::bail!(
                    "ate up not ready after {UP_READY_TIMEOUT:?}; see {}",
                    self.up_log().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn up_pid(&self) -> Option<i32> {
        self.up
            .as_ref()
            .and_then(Child::id)
            .and_then(|p| i32::try_from(p).ok())
    }

    fn up_running(&mut self) -> bool {
        self.up
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM to `ate up` (which stops router, workers, node and api in that order) and waits
    /// for it; after `UP_STOP_GRACE` it and its children are killed. True when it stopped by
    /// itself.
    async fn stop_up(&mut self) -> anyhow::Result<bool> {
        let Some(pid) = self.up_pid() else {
            return Ok(true);
        };
        let Some(mut child) = self.up.take() else {
            return Ok(true);
        };
        if child.try_wait()?.is_some() {
            return Ok(true);
        }
        // A frozen `ate up` (worker-down) or component (api-down) must be able to stop.
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        for (kid, _) in children_of(pid) {
            let _ = kill(Pid::from_raw(kid), Signal::SIGCONT);
        }
        signal(pid, Signal::SIGTERM)?;
        if tokio::time::timeout(UP_STOP_GRACE, child.wait())
            .await
            .is_ok()
        {
            return Ok(true);
        }
        let kids = children_of(pid);
        let _ = child.start_kill();
        for (kid, _) in kids {
            let _ = kill(Pid::from_raw(kid), Signal::SIGKILL);
        }
        let _ = child.wait().await;
        Ok(false)
    }

    /// SIGKILL of `ate up` alone: its components get SIGTERM from the kernel (their parent-death
    /// signal) and exit; waits until none is left, so the next `ate up` finds its ports free.
    async fn kill_up(&mut self) -> anyhow::Result<()> {
        let Some(pid) = self.up_pid() else {
            anyhow::bail!("ate up is not running");
        };
        let kids = children_of(pid);
        signal(pid, Signal::SIGKILL)?;
        if let Some(mut child) = self.up.take() {
            let _ = child.wait().await;
        }
        let deadline = Instant::now() + UP_STOP_GRACE;
        for (kid, _) in kids {
            // A zombie holds no port.
            while u32::try_from(kid).is_ok_and(ate_worker::process_running)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// The pid of a component of our `ate up`, waiting for `ate up` to restart it if it is
    /// between two lives.
    async fn component_pid(&self, component: Component) -> anyhow::Result<i32> {
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

    /// A fresh mTLS connection to the current api as admin (the api moves on restart-up).
    async fn api(&self) -> anyhow::Result<Clients> {
        let files =
            ate_tls::PemFiles::in_dir(&self.state.join(client::TLS_DIR), client::ADMIN_CERT_NAME);
        let source = ate_tls::CertSource::from_files(files, ate_tls::DEFAULT_FILE_POLL)
            .context("cannot read the admin certificate of the bench's ate up")?;
        let channel = tokio::time::timeout(
            Duration::from_secs(10),
            client::connect_to(&self.api, Some(&source)),
        )
        .await
        .context("timed out connecting to the api")??;
        Ok(Clients::new(channel))
    }

    async fn create_actors(&self, actors: &[String]) -> anyhow::Result<()> {
        let c = self.api().await?;
        match c
            .atespaces
            .clone()
            .create_atespace(v1::CreateAtespaceRequest {
                name: ATESPACE.into(),
            })
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::AlreadyExists => {}
            Err(s) => anyhow::bail!("create atespace {ATESPACE}: {}", s.message()),
        }
        for name in actors {
            match c
                .actors
                .clone()
                .create_actor(v1::CreateActorRequest {
                    atespace: ATESPACE.into(),
                    name: name.clone(),
                    template: TEMPLATE.into(),
                    ..Default::default()
                })
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::AlreadyExists => {}
                Err(s) => anyhow::bail!("create actor {ATESPACE}/{name}: {}", s.message()),
            }
        }
        Ok(())
    }

    /// An ASYNC suspend through the api.
    async fn suspend(&self, name: &str) -> anyhow::Result<()> {
        let mut actors = self.api().await?.actors;
        let call = actors.suspend_actor(v1::SuspendActorRequest {
            actor: Some(v1::ObjectRef {
                atespace: ATESPACE.into(),
                name: name.into(),
            }),
            mode: ate_core::SuspendMode::Async.wire(),
            grace_ms: 0,
        });
        match tokio::time::timeout(Duration::from_secs(60), call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) => anyhow::bail!("{} ({:?})", s.message(), s.code()),
            Err(_) => anyhow::bail!("no answer within 60 s"),
        }
    }

    /// Polls the actor's state for up to 10 s until it is `want`; returns the last state read.
    async fn wait_state(&self, name: &str, want: v1::ActorState) -> String {
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

    /// Workers whose used slots (api) differ from their running containers (runc), after up
    /// to `CHECK_RETRY` of agreeing.
    async fn slot_mismatches(&self, layout: &Layout) -> anyhow::Result<Vec<SlotMismatch>> {
        let deadline = Instant::now() + CHECK_RETRY;
        loop {
            let found = self.slot_mismatches_once(layout).await;
            match found {
                Ok(m) if m.is_empty() => return Ok(m),
                Ok(m) if Instant::now() >= deadline => return Ok(m),
                Err(e) if Instant::now() >= deadline => return Err(e),
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    async fn slot_mismatches_once(&self, layout: &Layout) -> anyhow::Result<Vec<SlotMismatch>> {
        let workers = self
            .api()
            .await?
            .fleet
            .clone()
            .list_workers(v1::ListWorkersRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("list workers: {}", s.message()))?
            .into_inner()
            .workers;
        let mut out = Vec::new();
        for w in workers {
            let running = runc_list(&layout.runc_root(&w.id))
                .await?
                .iter()
                .filter(|c| c.status == "running")
                .count();
            let used = w.used.map_or(0, |u| u.actor_slots);
            if used as usize != running {
                out.push(SlotMismatch {
                    worker: w.id,
                    used,
                    running,
                });
            }
        }
        Ok(out)
    }

    /// Stops everything the bench started, in order: `ate up`, the sandboxes it left behind,
    /// the tmpfs, PostgreSQL; removes the temp state dir after a passing run. Problems are
    /// reported, not returned: the rest must still be cleaned.
    async fn teardown(&mut self, passed: bool) {
        eprintln!("==> stopping the bench's system");
        match self.stop_up().await {
            Ok(true) => {}
            Ok(false) => eprintln!(
                "warning: ate up did not stop within {} s and was killed",
                UP_STOP_GRACE.as_secs()
            ),
            Err(e) => eprintln!("warning: stopping ate up: {e:#}"),
        }
        self.remove_leftover_sandboxes().await;
        if let Some(dir) = self.tmpfs.take()
            && let Err(e) = unmount(&dir).await
        {
            eprintln!("warning: {e:#}");
        }
        if let Some(pg) = self.pg.as_mut()
            && pg.running
            && let Err(e) = pg.stop().await
        {
            eprintln!("warning: stopping PostgreSQL: {e:#}");
        }
        if !self.owned {
            return;
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", self.state.display());
        let mounted = mounts.lines().any(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| unescape_mountinfo(m).starts_with(&prefix))
        });
        if passed && !mounted {
            if let Err(e) = std::fs::remove_dir_all(&self.state) {
                eprintln!("warning: cannot remove {}: {e}", self.state.display());
            }
        } else {
            eprintln!(
                "==> kept {} (logs in {}/logs)",
                self.state.display(),
                self.state.display()
            );
        }
    }

    /// Sandboxes outlive their workers on purpose; `ate worker --remove-leftovers` removes
    /// what a worker left, one run per worker dir (as the test harness does).
    async fn remove_leftover_sandboxes(&self) {
        let Ok(workers) = std::fs::read_dir(self.state.join("workers")) else {
            return;
        };
        for w in workers.flatten() {
            let id = w.file_name().to_string_lossy().into_owned();
            let has_actors = std::fs::read_dir(w.path().join("actors"))
                .map(|mut d| d.next().is_some())
                .unwrap_or(false);
            if !has_actors {
                continue;
            }
            let done = run_tool(
                Command::new(&self.exe)
                    .args([
                        "worker",
                        "--id",
                        &id,
                        "--remove-leftovers",
                        "--spare-netns",
                        "0",
                    ])
                    .arg("--state-dir")
                    .arg(&self.state),
                "ate worker --remove-leftovers",
            )
            .await;
            if let Err(e) = done {
                eprintln!("warning: leftovers of {id}: {e:#}");
            }
        }
    }
}

/// Unmounts the snapshot tmpfs (lazily if it is still busy after a few tries).
async fn unmount(dir: &Path) -> anyhow::Result<()> {
    for _ in 0..5 {
        if run_tool(Command::new("umount").arg(dir), "umount")
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run_tool(Command::new("umount").arg("-l").arg(dir), "umount -l")
        .await
        .with_context(|| format!("cannot unmount {}", dir.display()))
}

fn signal(pid: i32, sig: Signal) -> anyhow::Result<()> {
    kill(Pid::from_raw(pid), sig).with_context(|| format!("cannot send {sig} to {pid}"))
}

/// `(pid, command line)` of the processes whose parent is `parent` (from /proc). Zombies have
/// an empty command line and never match a component.
fn children_of(parent: i32) -> Vec<(i32, Vec<String>)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parent_pid(&s))
                == Some(parent)
        })
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (pid, args)
        })
        .collect()
}

/// The parent pid in a `/proc/PID/stat` text (the fourth field; the command name in parentheses
/// may contain spaces, so count from the last `)`).
fn parent_pid(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A fresh state dir under the temp dir, traversable by the `postgres` user.
fn temp_state_dir() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!("ate-faults-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(at: f64, count: u64) -> Sample {
        Sample {
            start: at - 0.01,
            end: at,
            status: 200,
            count: Some(count),
        }
    }

    fn failed(at: f64, status: u16) -> Sample {
        Sample {
            start: at - 0.01,
            end: at,
            status,
            count: None,
        }
    }

    #[test]
    fn memory_count_is_read_from_the_counter_body() {
        let body =
            "preserved memory count: 42 | preserved file counter: 7 | preserved rootfs counter: 3";
        assert_eq!(memory_count(body), Some(42));
        assert_eq!(memory_count("no worker has room"), None);
    }

    #[test]
    fn a_count_that_goes_back_is_state_lost_and_a_jump_is_a_lost_reply() {
        let samples = [
            ok(1.0, 1),
            ok(2.0, 2),
            failed(3.0, 502),
            ok(4.0, 4),
            ok(5.0, 1),
            ok(6.0, 2),
        ];
        let (lost, skipped) = count_events("a", &samples);
        assert_eq!(lost.len(), 1);
        assert_eq!((lost[0].previous, lost[0].got, lost[0].at), (4, 1, 5.0));
        assert_eq!(skipped.len(), 1);
        assert_eq!((skipped[0].previous, skipped[0].got), (2, 4));
    }

    #[test]
    fn longest_gap_runs_from_the_last_answer_before_the_window() {
        let samples = [ok(1.0, 1), failed(2.0, 502), ok(4.5, 2), ok(5.0, 3)];
        assert!((longest_gap(&samples, 1.5, 6.0) - 3.5).abs() < 1e-9);
        // Never answered again: the gap runs to the window's end.
        assert!((longest_gap(&samples[..2], 1.5, 9.0) - 8.0).abs() < 1e-9);
    }

    #[test]
    fn overlay_mounts_under_the_workers_dir_are_found_and_unescaped() {
        let info = "\
36 35 0:40 / /s/workers/worker-1/actors/faults/c1/rootfs rw - overlay overlay rw,lowerdir=x
37 35 0:41 / /s/workers/worker-1/actors/faults/c\\0402/rootfs rw - overlay overlay rw
38 35 0:42 / /s/snapshots rw - tmpfs tmpfs rw
39 35 0:43 / /other/workers/worker-1/actors/faults/c1/rootfs rw - overlay overlay rw";
        assert_eq!(
            overlay_mounts(info, Path::new("/s/workers")),
            [
                "/s/workers/worker-1/actors/faults/c1/rootfs",
                "/s/workers/worker-1/actors/faults/c 2/rootfs"
            ]
        );
    }

    #[test]
    fn actor_cgroups_and_parent_pids_are_parsed() {
        let cgroup = "9:name=systemd:/\n4:memory:/ate/0a1b2c3d4e\n1:cpu:/ate/0a1b2c3d4e\n";
        assert_eq!(actor_cgroup(cgroup).as_deref(), Some("0a1b2c3d4e"));
        assert_eq!(actor_cgroup("0::/\n"), None);
        assert_eq!(parent_pid("123 (ate (x) y) S 77 123 123 0"), Some(77));
    }

    #[test]
    fn container_ids_hash_the_actor_dir_like_the_worker() {
        let dir = actor_dir(Path::new("/s"), "worker-1", "faults", "c1");
        let sandbox = ate_worker::ActorSandbox::new("faults", "c1", "uid-x", &dir);
        assert_eq!(container_id(&dir), sandbox.container_id());
        assert_ne!(
            container_id(&dir),
            container_id(&actor_dir(Path::new("/s"), "worker-2", "faults", "c1"))
        );
    }

    #[test]
    fn the_short_suite_and_only_pick_faults_in_suite_order() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: FaultsArgs,
        }
        let names = |args: &[&str]| -> Vec<&str> {
            let cli = Cli::parse_from(std::iter::once("x").chain(args.iter().copied()));
            plan(&cli.a)
                .map(|p| p.into_iter().map(Fault::name).collect())
                .unwrap_or_default()
        };
        assert_eq!(
            names(&["--short"]),
            [
                "kill-worker",
                "kill-node",
                "kill-api",
                "kill-router",
                "restart-up",
                "kill-up",
                "snapshot-disk-full"
            ]
        );
        assert!(names(&["--short", "--private-postgres"]).contains(&"store-down-12s"));
        assert_eq!(
            names(&["--only", "restart-up,kill-api"]),
            ["kill-api", "restart-up"]
        );
        assert_eq!(names(&[]).len(), 8);
        assert_eq!(names(&["--private-postgres"]).len(), 10);
        assert_eq!(names(&["--only", "worker-stop-30s"]), ["worker-stop-30s"]);
        assert!(names(&["--only", "store-down-12s"]).is_empty());
    }
}
