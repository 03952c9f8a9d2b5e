//! `ate top actors` end to end (issue 33, item 4), through `ate up` on real runc workers: a
//! counter spinning one thread shows its CPU (from its cgroup, as its worker samples it every
//! 2 s), a quiet one its memory; only the atespace asked for, most CPU first. The worker's
//! per-actor series show the same, up to `--actor-metrics-limit`.

mod support;

use std::time::{Duration, Instant};

use support::actors::*;
use support::*;

#[test]
fn top_shows_what_running_actors_use() {
    let ns = "ns-top";
    let sys = System::up(UpOptions::default());
    counter_actor(&sys, ns, "counter", "busy");
    create_actor(&sys, ns, "quiet", "counter");
    get_ok(&sys, &format!("{ns}/quiet"), "/");
    // Spins one thread for 6 s (answering at once): 2 s samples see it busy.
    get_ok(&sys, &format!("{ns}/busy"), "/spin?seconds=6&threads=1");
    let deadline = Instant::now() + Duration::from_secs(15);
    let (busy_cpu, out) = loop {
        let out = sys.ate_ok(&["top", "actors", "-a", ns]);
        let cpu = out
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("busy"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|c| c.trim_end_matches('m').parse::<u32>().ok())
            .unwrap_or(0);
        if cpu >= 100 || Instant::now() > deadline {
            break (cpu, out);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("{out}");
    // The counter's quota is 250m: a spinning thread shows close to it.
    assert!(busy_cpu >= 100, "busy at {busy_cpu}m:\n{out}");
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("ATESPACE") && header.contains("MEMORY") && header.contains("UPTIME"),
        "{out}"
    );
    let quiet = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("quiet"))
        .unwrap_or_else(|| panic!("quiet is not listed:\n{out}"));
    let cols: Vec<&str> = quiet.split_whitespace().collect();
    assert!(
        cols[4].ends_with("Mi") || cols[4].ends_with("Ki"),
        "{quiet}"
    );
    assert_ne!(cols[4], "0Ki", "memory of a running counter: {quiet}");
    // Only the atespace asked for; busy listed first (most CPU).
    assert!(out.lines().skip(1).all(|l| l.starts_with(ns)), "{out}");
    assert!(
        out.lines().nth(1).is_some_and(|l| l.contains(" busy ")),
        "{out}"
    );
}

/// The same figures in the worker's `/metrics`, capped: with `ATE_WORKER_ACTOR_METRICS_LIMIT=1`
/// (passed on by `ate up`) the spinning actor has series of its own, the quiet one is summed
/// under `_other` and counted as omitted.
#[test]
fn worker_metrics_list_the_busiest_actors_up_to_the_cap() {
    let ns = "ns-cap";
    // One worker: both actors on it.
    let sys = System::up_with_env(
        UpOptions::with_workers(1),
        &[("ATE_WORKER_ACTOR_METRICS_LIMIT", "1")],
    );
    counter_actor(&sys, ns, "counter", "busy");
    create_actor(&sys, ns, "quiet", "counter");
    get_ok(&sys, &format!("{ns}/quiet"), "/");
    get_ok(&sys, &format!("{ns}/busy"), "/spin?seconds=8&threads=1");
    let series = |text: &str, name: &str, actor: &str, atespace: &str| {
        let prefix = format!("{name}{{atespace=\"{atespace}\",actor=\"{actor}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let (_, text) = ate_test_support::http::http_get(&sys.worker_metrics[0], "/metrics");
        let listed = series(&text, "ate_worker_actor_cpu_seconds_total", "busy", ns);
        if listed.is_some_and(|cpu| cpu > 0.0) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        series(&text, "ate_worker_actor_cpu_seconds_total", "busy", ns).is_some_and(|c| c > 0.0),
        "busy is listed:\n{text}"
    );
    assert!(
        series(&text, "ate_worker_actor_memory_bytes", "busy", ns).is_some_and(|m| m > 0.0),
        "{text}"
    );
    assert!(
        !text.contains("actor=\"quiet\""),
        "quiet is past the cap:\n{text}"
    );
    let other = series(&text, "ate_worker_actor_memory_bytes", "_other", "_other");
    assert!(
        other.is_some_and(|m| m > 0.0),
        "quiet's memory under _other:\n{text}"
    );
    let omitted = text
        .lines()
        .find_map(|l| l.strip_prefix("ate_worker_actor_metrics_omitted "));
    assert_eq!(omitted, Some("1"), "{text}");
}
