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

mod checks;
mod inject;
mod inside;
mod lab;
mod load;
mod pg;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use inject::run_fault;
use lab::Lab;
use load::{Load, Sampler};
use report::{Suite, write_json};

/// Atespace of the bench's actors.
const ATESPACE: &str = "faults";
/// Steady load before each fault, so each fault's window starts from a quiet system.
const SETTLE: Duration = Duration::from_secs(3);
/// First answers of fresh actors (image unpack, first starts on a busy machine).
const FIRST_ANSWERS_TIMEOUT: Duration = Duration::from_secs(120);
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
    /// The short suite: kill-worker, kill-node, kill-api, kill-router, restart-up, kill-up,
    /// kill-up-overlap, snapshot-disk-full, kill-in-suspend, kill-in-resume (and store-down-12s
    /// with --private-postgres).
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
    /// Trials of each repeated fault. `kill-up-overlap` (default 4): each with its own delay
    /// before the new `ate up`, 0, 0.3, 1.5 and 5 s first, then drawn uniformly from 0–5 s.
    /// `kill-in-suspend`, `kill-in-resume`, `kill-in-delete` (default 12 each): each kills one
    /// process of the operation (runc, criu, the page source, the worker, the node agent, in
    /// turn) at a random moment.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    trials: Option<u32>,
    /// Only these processes are killed by the kill-inside faults, comma separated (default:
    /// each the fault knows, in turn). To repeat one kind of kill, e.g. `--kill criu`.
    #[arg(long, value_enum, value_delimiter = ',')]
    kill: Vec<KillKind>,
    /// Seed of the random delays of `kill-up-overlap` trials past the fourth (default: from the
    /// clock; the JSON records it).
    #[arg(long)]
    seed: Option<u64>,
    /// JSON results file.
    #[arg(long, default_value = "bench-faults.json")]
    out: PathBuf,
}

impl FaultsArgs {
    /// Trials of `kill-up-overlap`.
    fn overlap_trials(&self) -> u32 {
        self.trials.unwrap_or(4)
    }

    /// Trials of each kill-inside fault.
    fn inside_trials(&self) -> usize {
        self.trials.map_or(12, |t| t as usize)
    }
}

/// The faults, in the order the suite injects them.
/// A process the kill-inside faults can kill (`--kill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum KillKind {
    /// `runc` of the operation (checkpoint, restore, delete).
    Runc,
    /// The `criu` that runc runs (dump or restore).
    Criu,
    /// `ate page-source` of a lazy restore.
    PageSource,
    /// The worker holding the actor.
    Worker,
    /// The node agent.
    Node,
}

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
    /// one on the same state once they are gone: every actor must come back with its memory.
    #[value(name = "kill-up")]
    KillUp,
    /// kill -9 of `ate up` alone and a new one on the same state after a short delay (0, 0.3,
    /// 1.5, 5 s, then random 0–5 s; `--trials`), while the old components may still be stopping (as
    /// systemd's `Restart=` does): no actor may run on two workers, no worker be marked gone while
    /// its sandboxes run, no state be lost.
    #[value(name = "kill-up-overlap")]
    KillUpOverlap,
    /// The snapshot disk full: suspends must fail and leave the actors running.
    #[value(name = "snapshot-disk-full")]
    SnapshotDiskFull,
    /// `--trials` suspends, each with `runc checkpoint`, its `criu`, the worker or the node
    /// agent killed (in turn) at a random moment inside it.
    #[value(name = "kill-in-suspend")]
    KillInSuspend,
    /// `--trials` resumes, each with `runc restore`, its `criu`, the page source, the worker or
    /// the node agent killed (in turn) at a random moment inside it.
    #[value(name = "kill-in-resume")]
    KillInResume,
    /// `--trials` deletes of actors made for the trial, each with `runc delete`, the worker or
    /// the node agent killed (in turn) at a random moment inside it; the delete is asked again
    /// until it succeeds, as a user would. Not in `--short` (the worker and node kills are spaced
    /// 32 s apart).
    #[value(name = "kill-in-delete")]
    KillInDelete,
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
    const ALL: [Fault; 16] = [
        Fault::KillWorker,
        Fault::KillNode,
        Fault::KillApi,
        Fault::KillRouter,
        Fault::ApiDown15s,
        Fault::StoreDown12s,
        Fault::StoreDown60s,
        Fault::RestartUp,
        Fault::KillUp,
        Fault::KillUpOverlap,
        Fault::SnapshotDiskFull,
        Fault::KillInSuspend,
        Fault::KillInResume,
        Fault::KillInDelete,
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
            Fault::KillUpOverlap => "kill-up-overlap",
            Fault::SnapshotDiskFull => "snapshot-disk-full",
            Fault::KillInSuspend => "kill-in-suspend",
            Fault::KillInResume => "kill-in-resume",
            Fault::KillInDelete => "kill-in-delete",
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
            Fault::ApiDown15s
                | Fault::StoreDown60s
                | Fault::KillInDelete
                | Fault::WorkerStop30s
                | Fault::WorkerDown20s
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
    let sampler = Sampler::start(
        lab.layout(&actors),
        lab.clock,
        lab.state.clone(),
        lab.api_now.clone(),
    );
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
    let mut delays = Delays::new(a.seed);
    let runs = plan.iter().flat_map(|&fault| {
        let trials = if fault == Fault::KillUpOverlap {
            a.overlap_trials()
        } else {
            1
        };
        (0..trials).map(move |t| (fault, t))
    });
    for (fault, trial) in runs {
        tokio::time::sleep(SETTLE).await;
        let delay = (fault == Fault::KillUpOverlap).then(|| delays.next(trial));
        match delay {
            Some(d) => eprintln!(
                "==> {} trial {} of {} (new ate up after {:.2} s)",
                fault.name(),
                trial + 1,
                a.overlap_trials(),
                d.as_secs_f64()
            ),
            None => eprintln!("==> {}", fault.name()),
        }
        let row = run_fault(lab, &load, &sampler, &actors, fault, delay, segment_start).await;
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
        seed: delays.seed,
        aborted,
        store: if a.private_postgres {
            "postgres"
        } else {
            "sqlite"
        },
    })
}

/// The delays of `kill-up-overlap` trials: 0, 0.3, 1.5 and 5 s, then uniform in 0–5 s from a
/// seeded generator (splitmix64), so a run can be repeated with `--seed`.
struct Delays {
    seed: u64,
    state: u64,
}

/// Fixed delays of the first trials: at once, well before, around and after the old
/// components' exit.
const FIRST_DELAYS: [f64; 4] = [0.0, 0.3, 1.5, 5.0];
/// Longest random delay.
const MAX_DELAY_S: f64 = 5.0;

impl Delays {
    fn new(seed: Option<u64>) -> Delays {
        let seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed)
        });
        Delays { seed, state: seed }
    }

    fn next(&mut self, trial: u32) -> Duration {
        if let Some(&d) = FIRST_DELAYS.get(trial as usize) {
            return Duration::from_secs_f64(d);
        }
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 random bits → [0, 1), in 10 ms steps.
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_millis((unit * MAX_DELAY_S * 100.0).round() as u64 * 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trial_delays_start_fixed_then_stay_within_five_seconds() {
        let mut d = Delays::new(Some(7));
        let first: Vec<f64> = (0..4).map(|t| d.next(t).as_secs_f64()).collect();
        assert_eq!(first, [0.0, 0.3, 1.5, 5.0]);
        let rest: Vec<Duration> = (4..40).map(|t| d.next(t)).collect();
        assert!(rest.iter().all(|r| *r <= Duration::from_secs(5)));
        assert!(rest.windows(2).any(|w| w[0] != w[1]), "{rest:?}");
        // The same seed, the same delays.
        let mut again = Delays::new(Some(7));
        let repeat: Vec<Duration> = (0..40).map(|t| again.next(t)).collect();
        assert_eq!(&repeat[4..], &rest[..]);
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
                "kill-up-overlap",
                "snapshot-disk-full",
                "kill-in-suspend",
                "kill-in-resume"
            ]
        );
        assert!(names(&["--short", "--private-postgres"]).contains(&"store-down-12s"));
        assert_eq!(
            names(&["--only", "restart-up,kill-api"]),
            ["kill-api", "restart-up"]
        );
        assert_eq!(names(&[]).len(), 12);
        assert_eq!(names(&["--private-postgres"]).len(), 14);
        assert_eq!(names(&["--only", "worker-stop-30s"]), ["worker-stop-30s"]);
        assert!(names(&["--only", "store-down-12s"]).is_empty());
    }
}
