//! `ate bench density` (issue 34, item 3): as many idle demo counters RUNNING as the system
//! admits, then what each costs and what stopped them.
//!
//! 1. A probe counter is started and suspended, one filler started; the probe is resumed
//!    `--samples` times (each time suspended again), with 1 filler running.
//! 2. Fillers (`d-0001`, …) are created and called once each, `--concurrency` at a time, until
//!    `--max` run or the first request is refused (503 after its parking budget: no worker has
//!    room) or fails.
//! 3. Reported: running actors; host memory per idle actor (`MemAvailable` before the fill
//!    minus after, over the actors started in between) against each sandbox's own cgroup memory
//!    (v1 `memory.usage_in_bytes` and `total_rss`, v2 `memory.current` and `anon`; needs
//!    `--state-dir`, the system's, to find the sandboxes); what stopped the fill (the workers'
//!    bookings against their capacity: slots, CPU, memory); the probe's resume with N running
//!    (a filler is suspended first when the fill ended full, to make room for it).
//! 4. Then as many frozen: every running filler is suspended, `--concurrency` at a time; the
//!    workers keep each as a frozen copy (up to `--keep-frozen` per worker, while the host's
//!    memory is above their `--frozen-min-available-percent`). Reported: how many copies were
//!    kept (their sandbox cgroups still there, with `--state-dir`), host memory per frozen copy
//!    (MemAvailable before the fill minus after the freeze), and their cgroups' memory.
//! 5. Every actor of the bench (fillers refused included) is deleted (`--force`: no snapshot),
//!    unless `--keep`.
//!
//! `MemAvailable` is the whole machine's: on a shared machine other processes move it too; the
//! per-sandbox cgroup figures are exact.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ate_client::Clients;
use ate_proto::v1;
use clap::Args;
use futures::{StreamExt, stream};
use serde_json::json;
use tokio::sync::Mutex;

use crate::{
    Common, NO_ROOM, apply_yaml, call, counter_template_sized, delete_all, ensure_actor,
    ensure_suspended, http_client, images_dir, median, pct, rpc, sorted, write_json,
};

#[derive(Args, Debug, Clone)]
pub struct DensityArgs {
    #[command(flatten)]
    common: Common,
    /// Stop after this many running fillers.
    #[arg(long, default_value_t = 500)]
    max: usize,
    /// First calls (each a cold start) in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Resumes of the probe measured with 1 and with N fillers running.
    #[arg(long, default_value_t = 5)]
    samples: usize,
    /// The system's state directory (to find each sandbox's cgroup; without it only the host's
    /// memory is measured).
    #[arg(long, env = "ATE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Leave the actors running at the end (default: delete them all).
    #[arg(long)]
    keep: bool,
    /// The counters' CPU (millicores): what each books against the workers' overcommitted CPU
    /// (the demo template's 250m by default).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=64_000))]
    cpu_millis: u32,
    /// The counters' memory limit (MiB): what each books against the workers' memory (the demo
    /// template's 64 by default; a counter uses under 1 MiB).
    #[arg(long, default_value_t = crate::COUNTER_MEMORY_MIB, value_parser = clap::value_parser!(u64).range(4..=65_536))]
    memory_mib: u64,
}

fn filler(i: usize) -> String {
    format!("d-{i:04}")
}

pub(crate) async fn density(c: Clients, a: DensityArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.max > 0 && a.concurrency > 0, "nothing to do");
    let ns = a.common.atespace_or("bench-density");
    let images = images_dir(&c, &a.common).await?;
    let cpu = format!("{}m", a.cpu_millis);
    apply_yaml(
        &c,
        &counter_template_sized(&ns, "counter", &images, &cpu, a.memory_mib),
    )
    .await?;
    let router = a.common.router.clone();
    let http = http_client(a.concurrency);

    eprintln!("==> probe and the first filler");
    ensure_actor(&c, &ns, "probe", "counter").await?;
    first_call(&http, &router, &ns, "probe").await?;
    ensure_suspended(&c, &ns, "probe").await?;
    ensure_actor(&c, &ns, &filler(0), "counter").await?;
    first_call(&http, &router, &ns, &filler(0)).await?;
    let resume_1 = probe_resumes(&c, &http, &router, &ns, a.samples).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let avail_before = mem_available();

    eprintln!(
        "==> filling: up to {} counters, {} at a time",
        a.max, a.concurrency
    );
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let running = Arc::new(Mutex::new(vec![filler(0)]));
    let stopped_by: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.concurrency {
        let (c, http, router, ns) = (c.clone(), http.clone(), router.clone(), ns.clone());
        let (next, stop, running, stopped_by) = (
            next.clone(),
            stop.clone(),
            running.clone(),
            stopped_by.clone(),
        );
        let max = a.max;
        tasks.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= max {
                    stop.store(true, Ordering::SeqCst);
                    let mut s = stopped_by.lock().await;
                    s.get_or_insert_with(|| format!("--max {max}"));
                    break;
                }
                let name = filler(i);
                let outcome = match ensure_actor(&c, &ns, &name, "counter").await {
                    Ok(()) => call(&http, &router, Some(&format!("{ns}/{name}")), "/").await,
                    Err(e) => {
                        stop.store(true, Ordering::SeqCst);
                        stopped_by.lock().await.get_or_insert(format!("{e:#}"));
                        break;
                    }
                };
                if outcome.status == 200 {
                    let mut r = running.lock().await;
                    r.push(name);
                    if r.len() % 50 == 0 {
                        eprintln!(
                            "    {} running ({:.0} s)",
                            r.len(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                } else {
                    stop.store(true, Ordering::SeqCst);
                    let why = if outcome.body.contains(NO_ROOM) {
                        format!("refused: {} {}", outcome.status, outcome.body.trim())
                    } else {
                        format!("failed: {} {}", outcome.status, outcome.body.trim())
                    };
                    eprintln!("    {name}: {why} after {:.1} s", outcome.secs);
                    stopped_by.lock().await.get_or_insert(why);
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    let fill_secs = started.elapsed().as_secs_f64();
    let running = running.lock().await.clone();
    let stopped_by = stopped_by.lock().await.clone().unwrap_or_default();
    let n = running.len();
    eprintln!("==> {n} fillers running after {fill_secs:.1} s; stopped by {stopped_by}");

    let limits = limit_report(&c, a.cpu_millis, a.memory_mib).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let avail_after = mem_available();
    let host_per_actor_mib = match (avail_before, avail_after) {
        (Some(b), Some(a)) if n > 1 => Some((b as f64 - a as f64) / (n - 1) as f64 / 1024.0),
        _ => None,
    };
    let sandboxes = match &a.state_dir {
        Some(dir) => sandbox_memory(dir, &ns, &running),
        None => Vec::new(),
    };
    let usage = sorted(sandboxes.iter().map(|s| s.0).collect());
    let rss = sorted(sandboxes.iter().map(|s| s.1).collect());

    // Room for the probe: a filler suspended when the fill ended full.
    if stopped_by.starts_with("refused")
        && let Some(last) = running.last()
    {
        ensure_suspended(&c, &ns, last).await?;
    }
    let resume_n = probe_resumes(&c, &http, &router, &ns, a.samples).await?;
    let frozen = freeze_all(&c, &ns, &running, a.concurrency, a.state_dir.as_deref()).await;

    let med = |v: &[(f64, String)]| median(&sorted(v.iter().map(|x| x.0).collect()));
    let kinds = |v: &[(f64, String)]| {
        let mut k: Vec<&str> = v.iter().map(|x| x.1.as_str()).collect();
        k.sort_unstable();
        k.dedup();
        k.join(",")
    };
    println!("running idle counters      : {n} (fill {fill_secs:.1} s)");
    println!("stopped by                 : {stopped_by}");
    for l in &limits {
        println!("  {l}");
    }
    match host_per_actor_mib {
        Some(m) => println!("host memory per actor      : {m:.2} MiB (MemAvailable)"),
        None => println!("host memory per actor      : n/a"),
    }
    if !usage.is_empty() {
        println!(
            "sandbox cgroup memory      : usage median {:.2} MiB (p95 {:.2}), rss median {:.2} MiB, over {}",
            median(&usage),
            pct(&usage, 0.95),
            median(&rss),
            usage.len()
        );
        if let Some(h) = host_per_actor_mib {
            println!(
                "beyond the sandbox's own   : {:.2} MiB per actor",
                h - median(&usage)
            );
        }
    }
    println!(
        "probe resume, 1 running    : median {:.3} s ({})",
        med(&resume_1),
        kinds(&resume_1)
    );
    println!(
        "{:<27}: median {:.3} s ({})",
        format!("probe resume, {n} running"),
        med(&resume_n),
        kinds(&resume_n)
    );
    if med(&resume_1) > 0.0 {
        println!(
            "ratio N / 1                : {:.2}×",
            med(&resume_n) / med(&resume_1)
        );
    }
    let frozen_usage = sorted(frozen.sandboxes.iter().map(|s| s.0).collect());
    let host_per_frozen_mib = match (avail_before, frozen.mem_available) {
        (Some(b), Some(f)) if frozen.sandboxes.len() > 1 => {
            Some((b as f64 - f as f64) / frozen.sandboxes.len() as f64 / 1024.0)
        }
        _ => None,
    };
    println!(
        "suspended, kept frozen     : {} of {} (suspend failures {}; in {:.1} s)",
        frozen.sandboxes.len(),
        frozen.suspended,
        frozen.failed,
        frozen.seconds
    );
    match host_per_frozen_mib {
        Some(m) => println!("host memory per frozen copy: {m:.2} MiB (MemAvailable)"),
        None => println!("host memory per frozen copy: n/a"),
    }
    if !frozen_usage.is_empty() {
        println!(
            "frozen cgroup memory       : usage median {:.2} MiB (p95 {:.2})",
            median(&frozen_usage),
            pct(&frozen_usage, 0.95)
        );
    }
    write_json(
        &a.common,
        "density",
        &json!({
            "kind": "density", "running": n, "fill_seconds": fill_secs, "stopped_by": stopped_by,
            "limits": limits, "mem_available_kib_before": avail_before,
            "mem_available_kib_after": avail_after, "host_mib_per_actor": host_per_actor_mib,
            "sandbox_usage_mib": usage, "sandbox_rss_mib": rss,
            "resume_1": resume_1.iter().map(|r| json!({"seconds": r.0, "resume": r.1})).collect::<Vec<_>>(),
            "resume_n": resume_n.iter().map(|r| json!({"seconds": r.0, "resume": r.1})).collect::<Vec<_>>(),
            "frozen": {
                "suspended": frozen.suspended, "failed": frozen.failed,
                "kept_frozen": frozen.sandboxes.len(), "seconds": frozen.seconds,
                "mem_available_kib": frozen.mem_available,
                "host_mib_per_frozen_copy": host_per_frozen_mib,
                "sandbox_usage_mib": frozen_usage,
            },
        }),
    )?;

    if !a.keep {
        eprintln!("==> deleting the bench's actors");
        // Every filler handed out, running or not (a refused one was created too).
        let handed = next.load(Ordering::SeqCst).min(a.max);
        let mut names: Vec<String> = (0..handed).map(filler).collect();
        names.push("probe".into());
        delete_all(&c, &ns, names, a.concurrency).await;
    }
    Ok(ExitCode::SUCCESS)
}

async fn first_call(
    http: &crate::HttpClient,
    router: &str,
    ns: &str,
    name: &str,
) -> anyhow::Result<()> {
    let r = call(http, router, Some(&format!("{ns}/{name}")), "/").await;
    anyhow::ensure!(r.status == 200, "{ns}/{name}: {} {}", r.status, r.body);
    Ok(())
}

/// What freezing the fillers found.
struct Frozen {
    suspended: usize,
    failed: usize,
    seconds: f64,
    /// MemAvailable (KiB) once they are suspended.
    mem_available: Option<u64>,
    /// (usage, rss) MiB of each sandbox still there: the frozen copies.
    sandboxes: Vec<(f64, f64)>,
}

/// Suspends every one of `names`, `concurrency` at a time (the workers keep what they can as
/// frozen copies), then measures what is left.
async fn freeze_all(
    c: &Clients,
    ns: &str,
    names: &[String],
    concurrency: usize,
    state_dir: Option<&Path>,
) -> Frozen {
    eprintln!("==> freezing: suspending the {} fillers", names.len());
    let began = Instant::now();
    let failed = AtomicUsize::new(0);
    stream::iter(names)
        .for_each_concurrent(concurrency, |name| {
            let failed = &failed;
            async move {
                if let Err(e) = ensure_suspended(c, ns, name).await {
                    eprintln!("    suspend {ns}/{name}: {e:#}");
                    failed.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
        .await;
    let seconds = began.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let failed = failed.load(Ordering::SeqCst);
    Frozen {
        suspended: names.len().saturating_sub(failed),
        failed,
        seconds,
        mem_available: mem_available(),
        sandboxes: state_dir.map_or_else(Vec::new, |dir| sandbox_memory(dir, ns, names)),
    }
}

/// `samples` resumes of the suspended probe: seconds from request to answer and the router's
/// `ate-resume` kind; suspended again after each, and a second's pause for the suspend's upload.
async fn probe_resumes(
    c: &Clients,
    http: &crate::HttpClient,
    router: &str,
    ns: &str,
    samples: usize,
) -> anyhow::Result<Vec<(f64, String)>> {
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        ensure_suspended(c, ns, "probe").await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = call(http, router, Some(&format!("{ns}/probe")), "/").await;
        anyhow::ensure!(r.status == 200, "probe resume: {} {}", r.status, r.body);
        out.push((r.secs, r.resume));
    }
    ensure_suspended(c, ns, "probe").await?;
    Ok(out)
}

/// Each worker's bookings against its capacity, and which of them leaves no room for one more
/// counter.
async fn limit_report(
    c: &Clients,
    cpu_millis: u32,
    memory_mib: u64,
) -> anyhow::Result<Vec<String>> {
    let workers = rpc(c
        .fleet
        .clone()
        .list_workers(v1::ListWorkersRequest {})
        .await)?
    .workers;
    let mib = 1024 * 1024;
    Ok(workers
        .iter()
        .map(|w| {
            let cap = w.capacity.unwrap_or_default();
            let used = w.used.unwrap_or_default();
            let mut full = Vec::new();
            if used.actor_slots + 1 > cap.actor_slots {
                full.push("slots");
            }
            if used.cpu_millis + cpu_millis > cap.cpu_millis {
                full.push("CPU booking");
            }
            if used.memory_bytes + memory_mib * mib > cap.memory_bytes {
                full.push("memory");
            }
            format!(
                "{}: slots {}/{}, CPU {}m/{}m, memory {}Mi/{}Mi; full: {}",
                w.id,
                used.actor_slots,
                cap.actor_slots,
                used.cpu_millis,
                cap.cpu_millis,
                used.memory_bytes / mib,
                cap.memory_bytes / mib,
                if full.is_empty() {
                    "nothing".to_string()
                } else {
                    full.join(", ")
                }
            )
        })
        .collect())
}

/// `MemAvailable` of /proc/meminfo, KiB.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// (usage, rss) in MiB of each named actor's sandbox cgroup found under the state dir.
fn sandbox_memory(state: &Path, ns: &str, names: &[String]) -> Vec<(f64, f64)> {
    let Ok(workers) = std::fs::read_dir(state.join("workers")) else {
        return Vec::new();
    };
    let dirs: Vec<PathBuf> = workers
        .flatten()
        .flat_map(|w| {
            names
                .iter()
                .map(move |n| w.path().join("actors").join(ns).join(n))
        })
        .filter(|d| d.is_dir())
        .collect();
    dirs.iter()
        .filter_map(|dir| {
            let id = ate_worker::ActorSandbox::new("", "", "", dir).short_id();
            cgroup_memory(&id)
        })
        .collect()
}

fn cgroup_memory(short_id: &str) -> Option<(f64, f64)> {
    let mib = 1024.0 * 1024.0;
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let stat = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let v1 = Path::new("/sys/fs/cgroup/memory/ate").join(short_id);
    if let Some(u) = read(v1.join("memory.usage_in_bytes")) {
        let usage: u64 = u.trim().parse().ok()?;
        let rss = read(v1.join("memory.stat"))
            .and_then(|s| stat(&s, "total_rss"))
            .unwrap_or(0);
        return Some((usage as f64 / mib, rss as f64 / mib));
    }
    let v2 = ["/sys/fs/cgroup/ate", "/sys/fs/cgroup/unified/ate"]
        .into_iter()
        .map(|h| Path::new(h).join(short_id))
        .find(|d| d.join("memory.current").is_file())?;
    let usage: u64 = read(v2.join("memory.current"))?.trim().parse().ok()?;
    let anon = read(v2.join("memory.stat"))
        .and_then(|s| stat(&s, "anon"))
        .unwrap_or(0);
    Some((usage as f64 / mib, anon as f64 / mib))
}
