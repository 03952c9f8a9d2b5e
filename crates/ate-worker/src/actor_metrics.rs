//! Per-actor series of the worker (`ate top actors`' numbers on `/metrics` and over OTLP), with
//! a cardinality cap.
//!
//! Three families, labelled `atespace` and `actor`, for each running actor:
//! `ate_worker_actor_cpu_seconds_total` (its cgroup's CPU time), `ate_worker_actor_memory_bytes`
//! (its cgroup's memory now) and `ate_worker_actor_start_time_seconds` (when its sandbox
//! started, Unix seconds). Only the [`WorkerConfig::actor_metrics_limit`] busiest actors (CPU
//! over the meter's last window, then memory, then name) get series of their own; the others are
//! summed under `atespace="_other",actor="_other"` (a name no atespace can take), so that a sum
//! over a family still covers every actor, and `ate_worker_actor_metrics_omitted` says how many
//! there were.
//!
//! Why text rendered at each scrape ([`ate_telemetry::on_render`]) and not the recorder:
//! the recorder never forgets a series, and an actor's must go when it is suspended or moves
//! away. The `_other` CPU counter is kept here: each render adds what the actors summed in it
//! used since the previous render, so it only grows while actors move in and out of the top N.
//!
//! [`WorkerConfig::actor_metrics_limit`]: crate::config::WorkerConfig::actor_metrics_limit

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, Weak};

use ate_core::ActorRef;

use crate::cpu::CpuMeter;

/// Actors with series of their own when `--actor-metrics-limit` is not given.
pub const DEFAULT_LIMIT: usize = 100;

pub const CPU_SECONDS: &str = "ate_worker_actor_cpu_seconds_total";
pub const MEMORY_BYTES: &str = "ate_worker_actor_memory_bytes";
pub const START_TIME: &str = "ate_worker_actor_start_time_seconds";
pub const OMITTED: &str = "ate_worker_actor_metrics_omitted";

/// The label value of the sums over actors past the limit.
pub const OTHER: &str = "_other";

/// What one running actor uses, read at a render.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub actor: ActorRef,
    /// Its sandbox's cgroup name (`ActorSandbox::short_id`).
    pub sandbox: String,
    /// CPU over the meter's last window (millicores): the ranking.
    pub recent_millis: u32,
    /// Cumulative CPU time of its cgroup (ns).
    pub cpu_ns: u64,
    pub memory_bytes: u64,
    /// When its sandbox started (Unix ms; 0: unknown).
    pub since_ms: i64,
}

/// The actors that get series of their own (`listed`, busiest first) and the rest.
#[derive(Debug, Default, PartialEq)]
pub struct Selection {
    pub listed: Vec<Reading>,
    pub rest: Vec<Reading>,
}

/// Splits `readings` at `limit`: the busiest by recent CPU, then by memory, then by name (a
/// stable order, so equal actors do not swap places between scrapes).
pub fn select(mut readings: Vec<Reading>, limit: usize) -> Selection {
    readings.sort_by(|a, b| {
        b.recent_millis
            .cmp(&a.recent_millis)
            .then(b.memory_bytes.cmp(&a.memory_bytes))
            .then_with(|| by_name(a, b))
    });
    let rest = readings.split_off(limit.min(readings.len()));
    Selection {
        listed: readings,
        rest,
    }
}

fn by_name(a: &Reading, b: &Reading) -> Ordering {
    (&a.actor.atespace, &a.actor.name).cmp(&(&b.actor.atespace, &b.actor.name))
}

/// The state kept between renders: the `_other` CPU total and each sandbox's last reading.
#[derive(Debug, Default)]
pub struct Families {
    limit: usize,
    /// CPU time (ns) of actors past the limit, summed over the renders they were in it.
    other_cpu_ns: u64,
    /// Cumulative CPU (ns) per sandbox at the previous render.
    last_cpu_ns: HashMap<String, u64>,
}

impl Families {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            ..Default::default()
        }
    }

    /// The four families for `readings`, in the text exposition format.
    pub fn render(&mut self, readings: Vec<Reading>) -> String {
        let last = std::mem::take(&mut self.last_cpu_ns);
        self.last_cpu_ns = readings
            .iter()
            .map(|r| (r.sandbox.clone(), r.cpu_ns))
            .collect();
        let Selection { listed, rest } = select(readings, self.limit);
        for r in &rest {
            // Growth since the previous render; a sandbox first seen now counts from the next
            // one, and a counter that went down belongs to a new cgroup of that name.
            if let Some(&before) = last.get(&r.sandbox) {
                let grown = if r.cpu_ns >= before {
                    r.cpu_ns - before
                } else {
                    r.cpu_ns
                };
                self.other_cpu_ns = self.other_cpu_ns.saturating_add(grown);
            }
        }
        let other_memory: u64 = rest.iter().map(|r| r.memory_bytes).sum();
        let mut out = String::new();
        family(
            &mut out,
            CPU_SECONDS,
            "counter",
            "CPU time of each running actor's cgroup (seconds; a restore starts a new cgroup, from 0). Past --actor-metrics-limit, summed under atespace=\"_other\".",
            &listed,
            |r| Some(r.cpu_ns as f64 / 1e9),
            Some(self.other_cpu_ns as f64 / 1e9),
        );
        family(
            &mut out,
            MEMORY_BYTES,
            "gauge",
            "Memory each running actor's cgroup holds now. Past --actor-metrics-limit, summed under atespace=\"_other\".",
            &listed,
            |r| Some(r.memory_bytes as f64),
            Some(other_memory as f64),
        );
        family(
            &mut out,
            START_TIME,
            "gauge",
            "When each running actor's sandbox started (Unix seconds); only actors within --actor-metrics-limit.",
            &listed,
            |r| (r.since_ms > 0).then(|| r.since_ms as f64 / 1000.0),
            None,
        );
        let _ = write!(
            out,
            "# HELP {OMITTED} Running actors past --actor-metrics-limit: summed under atespace=\"_other\" instead of series of their own.\n# TYPE {OMITTED} gauge\n{OMITTED} {}\n\n",
            rest.len()
        );
        out
    }
}

/// One family: its HELP and TYPE lines, a line per listed actor, the `_other` line if any.
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    listed: &[Reading],
    value: impl Fn(&Reading) -> Option<f64>,
    other: Option<f64>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for r in listed {
        if let Some(v) = value(r) {
            let _ = writeln!(
                out,
                "{name}{{atespace=\"{}\",actor=\"{}\"}} {v}",
                escape(&r.actor.atespace),
                escape(&r.actor.name)
            );
        }
    }
    if let Some(v) = other {
        let _ = writeln!(out, "{name}{{atespace=\"{OTHER}\",actor=\"{OTHER}\"}} {v}");
    }
    out.push('\n');
}

/// A label value in the text format (names are validated labels, but a series must not break
/// the exposition whatever they hold).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the families of `worker`'s running actors at every scrape while it lives.
pub(crate) fn export(worker: &Arc<crate::worker::Worker>, cpu: &Arc<CpuMeter>, limit: usize) {
    let worker: Weak<crate::worker::Worker> = Arc::downgrade(worker);
    let cpu: Weak<CpuMeter> = Arc::downgrade(cpu);
    let families = Mutex::new(Families::new(limit));
    ate_telemetry::on_render(move || {
        let (worker, cpu) = (worker.upgrade()?, cpu.upgrade()?);
        // A few sysfs reads per actor, as a scrape of `ate top actors` does.
        let readings = worker
            .running_sandboxes()
            .into_iter()
            .map(|(actor, sandbox, since_ms)| Reading {
                recent_millis: cpu.sandbox_usage_millis(&sandbox).unwrap_or(0),
                cpu_ns: crate::cpu::usage_ns(&sandbox).unwrap_or(0),
                memory_bytes: crate::cpu::memory_bytes(&sandbox).unwrap_or(0),
                actor,
                sandbox,
                since_ms,
            })
            .collect();
        let mut families = match families.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        Some(families.render(readings))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(name: &str, recent_millis: u32, cpu_ns: u64, memory_bytes: u64) -> Reading {
        Reading {
            actor: ActorRef::new("space".to_string(), name.to_string()),
            sandbox: format!("sb-{name}"),
            recent_millis,
            cpu_ns,
            memory_bytes,
            since_ms: 1_700_000_000_500,
        }
    }

    fn names(rs: &[Reading]) -> Vec<&str> {
        rs.iter().map(|r| r.actor.name.as_str()).collect()
    }

    #[test]
    fn the_busiest_are_listed_up_to_the_limit() {
        let all = vec![
            reading("idle-big", 0, 0, 900),
            reading("busy", 500, 0, 10),
            reading("b-idle", 0, 0, 100),
            reading("a-idle", 0, 0, 100),
            reading("warm", 20, 0, 10),
        ];
        let s = select(all.clone(), 3);
        assert_eq!(names(&s.listed), ["busy", "warm", "idle-big"]);
        // Ties by memory, then by name.
        assert_eq!(names(&s.rest), ["a-idle", "b-idle"]);
        assert_eq!(select(all.clone(), 0).listed, Vec::new());
        assert_eq!(select(all.clone(), 10).listed.len(), 5);
        assert!(select(all, 10).rest.is_empty());
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn past_the_cap_actors_are_summed_and_counted() {
        let mut f = Families::new(1);
        let text = f.render(vec![
            reading("busy", 800, 3_000_000_000, 1000),
            reading("idle", 0, 1_000_000_000, 200),
            reading("idler", 0, 500_000_000, 300),
        ]);
        let busy = "{atespace=\"space\",actor=\"busy\"}";
        let other = "{atespace=\"_other\",actor=\"_other\"}";
        assert_eq!(value(&text, &format!("{CPU_SECONDS}{busy}")), Some(3.0));
        assert_eq!(value(&text, &format!("{MEMORY_BYTES}{busy}")), Some(1000.0));
        assert_eq!(
            value(&text, &format!("{START_TIME}{busy}")),
            Some(1_700_000_000.5)
        );
        assert!(!text.contains("actor=\"idle\""), "{text}");
        // Memory of the rest is summed at once; their CPU counts from the next render.
        assert_eq!(value(&text, &format!("{MEMORY_BYTES}{other}")), Some(500.0));
        assert_eq!(value(&text, &format!("{CPU_SECONDS}{other}")), Some(0.0));
        assert_eq!(value(&text, OMITTED), Some(2.0));
        assert!(
            text.contains(&format!("# TYPE {CPU_SECONDS} counter")),
            "{text}"
        );

        // "idle" becomes the busiest: "busy" moves to _other, and what it used since the last
        // render is added there; "idler" adds its growth; the counter never goes down.
        let text = f.render(vec![
            reading("busy", 0, 3_500_000_000, 1000),
            reading("idle", 900, 2_000_000_000, 200),
            reading("idler", 0, 750_000_000, 300),
        ]);
        assert_eq!(
            value(
                &text,
                &format!("{CPU_SECONDS}{{atespace=\"space\",actor=\"idle\"}}")
            ),
            Some(2.0)
        );
        assert_eq!(value(&text, &format!("{CPU_SECONDS}{other}")), Some(0.75));
        assert!(!text.contains("actor=\"busy\""), "{text}");

        // A suspended actor's series go; no actor left past the cap.
        let text = f.render(vec![reading("idle", 900, 2_100_000_000, 200)]);
        assert!(!text.contains("actor=\"busy\""), "{text}");
        assert_eq!(value(&text, &format!("{CPU_SECONDS}{other}")), Some(0.75));
        assert_eq!(value(&text, &format!("{MEMORY_BYTES}{other}")), Some(0.0));
        assert_eq!(value(&text, OMITTED), Some(0.0));
    }

    #[test]
    fn a_limit_of_zero_keeps_only_the_sums() {
        let mut f = Families::new(0);
        let text = f.render(vec![reading("a", 5, 1, 7), reading("b", 5, 1, 8)]);
        assert!(!text.contains("atespace=\"space\""), "{text}");
        assert_eq!(
            value(
                &text,
                &format!("{MEMORY_BYTES}{{atespace=\"_other\",actor=\"_other\"}}")
            ),
            Some(15.0)
        );
        assert_eq!(value(&text, OMITTED), Some(2.0));
    }
}
