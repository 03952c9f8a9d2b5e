//! `ate bench throughput`: resumes/s of small counter actors, as a burst (default) or a
//! sustained resume/suspend loop (`--cycle`), with its table, histogram and not-200 summary.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ate_client::Clients;
use ate_proto::v1;
use clap::Args;
use serde_json::json;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use crate::{
    COUNTER_MEMORY_MIB, Common, HttpClient, NO_ROOM, Reply, apply_yaml, call, counter_template,
    ensure_actor, http_client, images_dir, median, parse_settle, pct, prime, reply_json, rpc,
    sorted, suspend, write_json,
};
use burst::burst;
use cycle::cycle;

mod burst;
mod cycle;

#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    common: Common,
    /// Number of suspended counter actors (default: 600; with --cycle, 2 × concurrency). Actors
    /// of an earlier run that are still suspended are reused.
    #[arg(long)]
    actors: Option<usize>,
    /// Requests in flight at most (default: 300; with --cycle, 64).
    #[arg(long)]
    concurrency: Option<usize>,
    /// The sustained resume/suspend loop instead of the burst: requesters keep --concurrency
    /// requests to suspended actors in flight for --seconds while --suspenders suspend each
    /// served actor again.
    #[arg(long)]
    cycle: bool,
    /// With --cycle: length of the measurement in seconds.
    #[arg(long, default_value_t = 20, requires = "cycle")]
    seconds: u64,
    /// With --cycle: suspend calls in flight.
    #[arg(long, default_value_t = 16, requires = "cycle")]
    suspenders: usize,
    /// Burst only: pause between preparing the suspended actors and the burst, in seconds, so
    /// the preparing suspends' durable uploads are not measured as resume time (as in `bench
    /// resume`). 0 sends the burst at once.
    #[arg(long, default_value_t = 2.0, conflicts_with = "cycle", value_parser = parse_settle)]
    settle: f64,
}

/// CPU of each throughput actor: tiny, so that the slots (not the workers' CPU) bound how many
/// run at once.
const TP_CPU_MILLIS: u32 = 10;
/// Preparations (create, first request, suspend) in flight.
const TP_PREPARERS: usize = 8;

pub(super) async fn throughput(c: Clients, a: ThroughputArgs) -> anyhow::Result<ExitCode> {
    let settle = Duration::from_secs_f64(a.settle);
    let ns = a.common.atespace_or("ate-bench-tp");
    let concurrency = a
        .concurrency
        .unwrap_or(if a.cycle { 64 } else { 300 })
        .max(1);
    let n_actors = if a.cycle {
        a.actors.unwrap_or(concurrency * 2).max(concurrency)
    } else {
        a.actors.unwrap_or(600)
    };
    anyhow::ensure!(n_actors > 0, "--actors 0: nothing to do");
    let images = images_dir(&c, &a.common).await?;
    let cpu = format!("{TP_CPU_MILLIS}m");
    apply_yaml(&c, &counter_template(&ns, "counter", &images, &cpu)).await?;
    let http = http_client(concurrency);
    let router = a.common.router.clone();
    let names: Vec<String> = (0..n_actors).map(|i| format!("tp-{i}")).collect();
    prepare_counters(&c, &http, &router, &ns, &names).await?;
    let run = TpRun {
        c,
        http,
        router,
        ns,
        names,
        concurrency,
    };
    if a.cycle {
        cycle(run, &a).await
    } else {
        burst(run, &a.common, settle).await
    }
}

/// What both throughput modes work on: prepared (suspended) actors and the client to reach them.
struct TpRun {
    c: Clients,
    http: HttpClient,
    router: String,
    ns: String,
    names: Vec<String>,
    concurrency: usize,
}

/// Makes every named actor exist and be suspended with a snapshot, [`TP_PREPARERS`] at a time;
/// actors that already are (an earlier run's) are only checked.
async fn prepare_counters(
    c: &Clients,
    http: &HttpClient,
    router: &str,
    ns: &str,
    names: &[String],
) -> anyhow::Result<()> {
    let n_actors = names.len();
    eprintln!(
        "==> preparing {n_actors} suspended counter actors in {ns} (create, first request, suspend; suspended ones are reused)"
    );
    let started = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let reused = Arc::new(AtomicU64::new(0));
    let queue = Arc::new(Mutex::new(names.iter().cloned().collect::<VecDeque<_>>()));
    let mut set = JoinSet::new();
    for _ in 0..TP_PREPARERS.min(n_actors) {
        let (c, http, router, ns) = (c.clone(), http.clone(), router.to_string(), ns.to_string());
        let (queue, done, reused) = (queue.clone(), done.clone(), reused.clone());
        set.spawn(async move {
            loop {
                let Some(name) = queue.lock().await.pop_front() else {
                    return anyhow::Ok(());
                };
                ensure_actor(&c, &ns, &name, "counter").await?;
                if !prime(&c, &http, &router, &ns, &name).await? {
                    reused.fetch_add(1, Ordering::Relaxed);
                }
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                if d % 16 == 0 || d as usize == n_actors {
                    eprintln!(
                        "    {d}/{n_actors} ready ({} were ready before), {:.0} s",
                        reused.load(Ordering::Relaxed),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        });
    }
    for r in set.join_all().await {
        r?;
    }
    Ok(())
}

/// How many more actors of `cpu_millis` and `memory_bytes` fit the ACTIVE workers now (the
/// scheduler's test: slots, CPU and memory), and the number of ACTIVE workers.
fn free_room(workers: &[v1::Worker], cpu_millis: u32, memory_bytes: u64) -> (u64, usize) {
    let active: Vec<&v1::Worker> = workers.iter().filter(|w| w.status == "ACTIVE").collect();
    let room = active
        .iter()
        .map(|w| {
            let (cap, used) = (w.capacity.unwrap_or_default(), w.used.unwrap_or_default());
            let slots = u64::from(cap.actor_slots.saturating_sub(used.actor_slots));
            let cpu = u64::from(cap.cpu_millis.saturating_sub(used.cpu_millis))
                / u64::from(cpu_millis.max(1));
            let mem = cap.memory_bytes.saturating_sub(used.memory_bytes) / memory_bytes.max(1);
            slots.min(cpu).min(mem)
        })
        .sum();
    (room, active.len())
}

/// One request of the burst, times in seconds since the burst started.
struct BurstSample {
    actor: String,
    sent: f64,
    done: f64,
    reply: Reply,
}

/// A 200 that resumed a suspended actor (`parked`: the resume waited for room first).
fn is_cold(r: &Reply) -> bool {
    r.status == 200 && (r.resume == "cold" || r.resume == "parked")
}

/// The row of the throughput table (both modes).
struct TpRow {
    actors: usize,
    concurrency: usize,
    requests: usize,
    ok: usize,
    cold: usize,
    seconds: f64,
    p50: f64,
    p99: f64,
}

impl TpRow {
    /// The row of a run; the latencies of its `cold` resumes, `cold_secs` (sorted), give its p50
    /// and p99.
    fn new(
        actors: usize,
        concurrency: usize,
        requests: usize,
        ok: usize,
        cold: usize,
        cold_secs: &[f64],
        seconds: f64,
    ) -> Self {
        TpRow {
            actors,
            concurrency,
            requests,
            ok,
            cold,
            seconds,
            p50: median(cold_secs),
            p99: pct(cold_secs, 0.99),
        }
    }

    fn rate(&self) -> f64 {
        self.cold as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }

    fn table(&self) -> String {
        format!(
            "Actors | Concurrency | Requests | Returned 200 | Not 200 | Cold resumes | Seconds | Resumes/s | p50     | p99\n\
             {:>6} | {:>11} | {:>8} | {:>12} | {:>7} | {:>12} | {:>7.1} | {:>9.1} | {:>5.3} s | {:>5.3} s",
            self.actors,
            self.concurrency,
            self.requests,
            self.ok,
            self.requests - self.ok,
            self.cold,
            self.seconds,
            self.rate(),
            self.p50,
            self.p99
        )
    }
}

/// `503 × 12 (no worker has room: 12), 0 (no answer) × 1`: the answers that were not 200.
/// The first ten answers that were not 200, each also printed (for the JSON's `first_errors`).
fn first_errors(replies: &[&Reply]) -> Vec<String> {
    let errors: Vec<String> = replies
        .iter()
        .filter(|r| r.status != 200)
        .take(10)
        .map(|r| format!("{} {}", r.status, r.body))
        .collect();
    for e in &errors {
        eprintln!("    {e}");
    }
    errors
}

fn not_ok_summary(replies: &[&Reply]) -> String {
    let mut by_status = std::collections::BTreeMap::<u16, (usize, usize)>::new();
    for r in replies.iter().filter(|r| r.status != 200) {
        let e = by_status.entry(r.status).or_default();
        e.0 += 1;
        e.1 += usize::from(r.body.contains(NO_ROOM));
    }
    let parts: Vec<String> = by_status
        .iter()
        .map(|(status, (n, no_room))| {
            let name = match status {
                0 => "0 (no answer)".to_string(),
                s => s.to_string(),
            };
            match no_room {
                0 => format!("{name} × {n}"),
                k => format!("{name} × {n} (no worker has room: {k})"),
            }
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Per-second counts as a text table, bins of `ceil(len / 60)` seconds so that it stays short.
fn histogram(answers: &[u64], cold: &[u64], not_ok: &[u64]) -> String {
    let bin = answers.len().div_ceil(60).max(1);
    let sum = |v: &[u64], i: usize| v.iter().skip(i).take(bin).sum::<u64>();
    let rows: Vec<(usize, u64, u64, u64)> = (0..answers.len())
        .step_by(bin)
        .map(|i| (i, sum(answers, i), sum(cold, i), sum(not_ok, i)))
        .collect();
    let widest = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1);
    let mut out = format!(
        "Seconds | Answers | Cold resumes | Not 200 | (# cold resume, x not 200; per {bin} s)\n"
    );
    for (i, n, c, bad) in rows {
        let scale = |k: u64| (k * 50).div_ceil(widest) as usize;
        let line = format!(
            "{:>7} | {n:>7} | {c:>12} | {bad:>7} | {}{}",
            format!("{i}–{}", i + bin),
            "#".repeat(scale(c)),
            "x".repeat(scale(bad))
        );
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// Counts of `at` (seconds) per whole second, over `len` seconds.
fn per_second(len: usize, at: impl Iterator<Item = f64>) -> Vec<u64> {
    let mut v = vec![0u64; len.max(1)];
    for t in at {
        let i = (t.max(0.0) as usize).min(v.len() - 1);
        v[i] += 1;
    }
    v
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn worker(status: &str, cap: (u32, u32, u64), used: (u32, u32, u64)) -> v1::Worker {
        let capacity = |(slots, cpu, mib): (u32, u32, u64)| v1::Capacity {
            actor_slots: slots,
            cpu_millis: cpu,
            memory_bytes: mib << 20,
        };
        v1::Worker {
            status: status.into(),
            capacity: Some(capacity(cap)),
            used: Some(capacity(used)),
            ..Default::default()
        }
    }

    #[test]
    fn free_room_is_the_tightest_resource_of_each_active_worker() {
        let workers = [
            // 64 − 10 slots, but CPU for (2000 − 1900) / 10 = 10.
            worker("ACTIVE", (64, 2000, 8192), (10, 1900, 0)),
            // Slots bound: 8 − 5 = 3.
            worker("ACTIVE", (8, 2000, 8192), (5, 0, 0)),
            // Memory bounds: (1024 − 64 × 12) / 64 = 4.
            worker("ACTIVE", (64, 2000, 1024), (12, 0, 768)),
            // Over-used: none, not a negative number.
            worker("ACTIVE", (4, 2000, 8192), (5, 0, 0)),
            worker("GONE", (64, 2000, 8192), (0, 0, 0)),
        ];
        assert_eq!(free_room(&workers, 10, 64 << 20), (17, 4));
        assert_eq!(free_room(&[], 10, 64 << 20), (0, 0));
    }

    #[test]
    fn per_second_counts_and_histogram() {
        assert_eq!(
            per_second(3, [0.1, 0.9, 1.0, 2.99, 3.0].into_iter()),
            [2, 1, 2]
        );
        assert_eq!(per_second(0, [5.0].into_iter()), [1]);
        let h = histogram(&[3, 1, 0], &[2, 1, 0], &[1, 0, 0]);
        assert_eq!(
            h,
            concat!(
                "Seconds | Answers | Cold resumes | Not 200 | (# cold resume, x not 200; per 1 s)\n",
                "    0–1 |       3 |            2 |       1 | ##################################xxxxxxxxxxxxxxxxx\n",
                "    1–2 |       1 |            1 |       0 | #################\n",
                "    2–3 |       0 |            0 |       0 |\n",
            )
        );
        // Long runs are binned so that the table stays short.
        let long = vec![1u64; 125];
        let h = histogram(&long, &long, &vec![0; 125]);
        assert_eq!(h.lines().count(), 1 + 42, "{h}");
        assert!(
            h.contains("per 3 s") && h.contains("123–126 |       2 |"),
            "{h}"
        );
    }

    #[test]
    fn throughput_table_and_not_200_summary() {
        let row = TpRow {
            actors: 64,
            concurrency: 32,
            requests: 64,
            ok: 60,
            cold: 59,
            seconds: 5.0,
            p50: 1.25,
            p99: 3.5,
        };
        assert_eq!(
            row.table(),
            concat!(
                "Actors | Concurrency | Requests | Returned 200 | Not 200 | Cold resumes | Seconds | Resumes/s | p50     | p99\n",
                "    64 |          32 |       64 |           60 |       4 |           59 |     5.0 |      11.8 | 1.250 s | 3.500 s",
            )
        );
        let reply = |status: u16, body: &str| Reply {
            status,
            body: body.into(),
            resume: String::new(),
            secs: 1.0,
            start: UNIX_EPOCH,
        };
        let replies = [
            reply(200, "ok"),
            reply(503, &format!("actor a/b {NO_ROOM}")),
            reply(503, "other"),
            reply(0, "timed out after 60 s"),
        ];
        let refs: Vec<&Reply> = replies.iter().collect();
        assert_eq!(
            not_ok_summary(&refs),
            "0 (no answer) × 1, 503 × 2 (no worker has room: 1)"
        );
        assert_eq!(not_ok_summary(&refs[..1]), "none");
        assert!(is_cold(&Reply {
            resume: "parked".into(),
            ..reply(200, "")
        }));
        assert!(!is_cold(&Reply {
            resume: "warm".into(),
            ..reply(200, "")
        }));
    }
}
