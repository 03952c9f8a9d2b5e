//! `ate bench noisy`: noisy neighbours (issue 38, item 4). A quiet counter actor's warm request
//! latency without a CPU hog beside it and with one, in the same invocation, rounds alternating
//! so that the machine's own load hits both sides alike.
//!
//! The hog is a second counter actor whose template books `--hog-cpu` (default: every core of
//! this machine, so its CFS quota lets it take them all) asked to spin (`GET /spin?seconds=N
//! &threads=T`, `workloads/counter/src/spin.rs`) on as many threads as the machine has cores.
//! The quiet actor books `--quiet-cpu` (default 250m, the demo counter's). What bounds its
//! latency under the hog is the weights: an actor using less than half its share weighs 4 times
//! the machine, a busy one its template's `cpu` (`ate_worker::wakeup`, docs/capacity.md).
//!
//! The quiet side sends `GET /healthz` on one kept-alive connection, one request at a time with
//! `--gap-ms` of idle between them (an actor that is called now and then, whose threads sleep
//! between calls and have to be woken, rather than one kept hot). Host CPU use (`/proc/stat`)
//! is recorded per phase, to show that the hog really held the cores.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use ate_client::Clients;
use clap::Args;
use serde_json::json;

use crate::{
    Common, apply_yaml, call, counter_template, ensure_actor, http_client, images_dir, median, pct,
    sorted, write_json,
};

#[derive(Args, Debug, Clone)]
pub struct NoisyArgs {
    #[command(flatten)]
    common: Common,
    /// Requests to the quiet actor per phase (quiet, then under the hog) and round.
    #[arg(long, default_value_t = 500)]
    requests: usize,
    /// Rounds: each measures the quiet phase, then the hog phase.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Idle time between two requests to the quiet actor, in milliseconds.
    #[arg(long, default_value_t = 5)]
    gap_ms: u64,
    /// The quiet actor's template `cpu` (its share and its cap).
    #[arg(long, default_value = "250m")]
    quiet_cpu: String,
    /// The hog's template `cpu` (default: this machine's cores, so its quota caps nothing).
    #[arg(long)]
    hog_cpu: Option<String>,
    /// Threads the hog spins on (default: this machine's cores).
    #[arg(long)]
    hog_threads: Option<usize>,
    /// Seconds the hog spins before the quiet side is measured: by default a little more than
    /// one of the workers' CPU passes (2 s), after which a spinning actor has lost the boost of
    /// an idle one (`ate_worker::wakeup`); the first pass of a new hog is not what this measures.
    #[arg(long, default_value_t = 2.5)]
    hog_settle: f64,
}

/// One phase's latencies (ms) and the host CPU it saw.
struct Phase {
    ms: Vec<f64>,
    host_busy: f64,
}

pub(crate) async fn noisy(c: Clients, a: NoisyArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.requests > 0 && a.rounds > 0, "nothing to do");
    let ns = a.common.atespace_or("bench-noisy");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let hog_cpu = a.hog_cpu.clone().unwrap_or_else(|| cores.to_string());
    let hog_threads = a.hog_threads.unwrap_or(cores);
    let images = images_dir(&c, &a.common).await?;
    apply_yaml(&c, &counter_template(&ns, "quiet", &images, &a.quiet_cpu)).await?;
    apply_yaml(&c, &counter_template(&ns, "hog", &images, &hog_cpu)).await?;
    ensure_actor(&c, &ns, "quiet", "quiet").await?;
    ensure_actor(&c, &ns, "hog", "hog").await?;
    let router = a.common.router.clone();
    let quiet = format!("{ns}/quiet");
    let hog = format!("{ns}/hog");
    let quiet_client = http_client(1);
    let hog_client = http_client(1);
    for actor in [&quiet, &hog] {
        let r = call(&quiet_client, &router, Some(actor), "/healthz").await;
        anyhow::ensure!(r.status == 200, "waking {actor}: {} {}", r.status, r.body);
    }
    // The workers set each sandbox's weight in their CPU pass (every 2 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    eprintln!(
        "==> quiet {quiet} (cpu {}), hog {hog} (cpu {hog_cpu}, {hog_threads} threads), {} requests per phase, {} rounds, gap {} ms",
        a.quiet_cpu, a.requests, a.rounds, a.gap_ms
    );
    let load_before = load_average();
    // Warm-up: connections on every hop, the router's assignment.
    quiet_phase(&quiet_client, &router, &quiet, 100, a.gap_ms).await?;

    let spin_seconds = (a.hog_settle + 60.0).ceil() as u64;
    let mut quiet_rows = Vec::new();
    let mut hog_rows = Vec::new();
    println!("round | phase | p50 ms | p99 ms | max ms | host CPU busy");
    for round in 1..=a.rounds {
        let q = quiet_phase(&quiet_client, &router, &quiet, a.requests, a.gap_ms).await?;
        print_row(round, "quiet", &q);
        let r = call(
            &hog_client,
            &router,
            Some(&hog),
            &format!("/spin?seconds={spin_seconds}&threads={hog_threads}"),
        )
        .await;
        anyhow::ensure!(r.status == 200, "starting the hog: {} {}", r.status, r.body);
        tokio::time::sleep(Duration::from_secs_f64(a.hog_settle)).await;
        let h = quiet_phase(&quiet_client, &router, &quiet, a.requests, a.gap_ms).await;
        let stopped = call(&hog_client, &router, Some(&hog), "/spin?seconds=0").await;
        let h = h?;
        anyhow::ensure!(
            stopped.status == 200,
            "stopping the hog: {} {}",
            stopped.status,
            stopped.body
        );
        print_row(round, "hog", &h);
        quiet_rows.push(q);
        hog_rows.push(h);
        // Let the hog's threads end and the machine settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let summary = |rows: &[Phase]| {
        let all = sorted(rows.iter().flat_map(|p| p.ms.iter().copied()).collect());
        let p99s = sorted(
            rows.iter()
                .map(|p| pct(&sorted(p.ms.clone()), 0.99))
                .collect(),
        );
        let p50s = sorted(
            rows.iter()
                .map(|p| pct(&sorted(p.ms.clone()), 0.5))
                .collect(),
        );
        let busy = sorted(rows.iter().map(|p| p.host_busy).collect());
        json!({"p50_ms": pct(&all, 0.5), "p99_ms": pct(&all, 0.99), "max_ms": pct(&all, 1.0),
               "median_round_p50_ms": median(&p50s), "median_round_p99_ms": median(&p99s),
               "median_host_busy": median(&busy), "samples": all.len()})
    };
    let quiet_sum = summary(&quiet_rows);
    let hog_sum = summary(&hog_rows);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let ratio = |k: &str| {
        let q = f(&quiet_sum, k);
        if q > 0.0 { f(&hog_sum, k) / q } else { 0.0 }
    };
    let (p50_ratio, p99_ratio) = (ratio("p50_ms"), ratio("p99_ms"));
    let round_p99_ratio = ratio("median_round_p99_ms");
    println!(
        "all rounds: quiet p50 {:.3} / p99 {:.3} ms, under the hog p50 {:.3} / p99 {:.3} ms",
        f(&quiet_sum, "p50_ms"),
        f(&quiet_sum, "p99_ms"),
        f(&hog_sum, "p50_ms"),
        f(&hog_sum, "p99_ms")
    );
    println!(
        "under the hog / quiet: p50 {p50_ratio:.2}×, p99 {p99_ratio:.2}× (median of rounds' p99: {round_p99_ratio:.2}×; target p99 ≤ 2×: {})",
        if p99_ratio <= 2.0 { "met" } else { "missed" }
    );
    let load_after = load_average();
    println!("load average (1 min) before / after: {load_before:.2} / {load_after:.2}");
    let phase_json = |p: &Phase| json!({"ms": p.ms, "host_busy": p.host_busy});
    write_json(
        &a.common,
        "noisy",
        &json!({
            "kind": "noisy",
            "quiet_cpu": a.quiet_cpu, "hog_cpu": hog_cpu, "hog_threads": hog_threads,
            "requests": a.requests, "gap_ms": a.gap_ms,
            "load_before": load_before, "load_after": load_after,
            "quiet": quiet_sum, "hog": hog_sum,
            "p50_ratio": p50_ratio, "p99_ratio": p99_ratio, "round_p99_ratio": round_p99_ratio,
            "rounds": quiet_rows.iter().zip(&hog_rows).map(|(q, h)|
                json!({"quiet": phase_json(q), "hog": phase_json(h)})).collect::<Vec<_>>(),
        }),
    )?;
    Ok(ExitCode::SUCCESS)
}

fn print_row(round: usize, phase: &str, p: &Phase) {
    let s = sorted(p.ms.clone());
    println!(
        "{round:>5} | {phase:>5} | {:>6.3} | {:>6.3} | {:>6.3} | {:>5.1} %",
        pct(&s, 0.5),
        pct(&s, 0.99),
        pct(&s, 1.0),
        p.host_busy * 100.0
    );
}

/// `n` sequential `GET /healthz` to the quiet actor, `gap_ms` apart; any answer but 200 fails
/// the bench.
async fn quiet_phase(
    client: &crate::HttpClient,
    router: &str,
    actor: &str,
    n: usize,
    gap_ms: u64,
) -> anyhow::Result<Phase> {
    let before = host_cpu();
    let mut ms = Vec::with_capacity(n);
    let gap = Duration::from_millis(gap_ms);
    for _ in 0..n {
        let r = call(client, router, Some(actor), "/healthz").await;
        anyhow::ensure!(r.status == 200, "{actor}: {} {}", r.status, r.body);
        ms.push(r.secs * 1000.0);
        if !gap.is_zero() {
            let until = Instant::now() + gap;
            tokio::time::sleep_until(until.into()).await;
        }
    }
    let host_busy = match (before, host_cpu()) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
        _ => 0.0,
    };
    Ok(Phase { ms, host_busy })
}

/// Busy and total jiffies of the whole machine (`/proc/stat`'s `cpu` line; idle and iowait are
/// not busy).
fn host_cpu() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// The machine's 1-minute load average (0 if unreadable): how busy it was is part of a tail
/// figure on a shared machine.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
