//! `/metrics` text (the Prometheus exposition every component renders,
//! [`ate_telemetry::render`]) to OTLP metrics: one source for both, so every series on
//! `/metrics` is exported and nothing else is.
//!
//! Names: the spec's where it names them (`atenet_router_parking_active` →
//! `atenet.router.parking.active`, `atenet_router_parking_rejected_total` →
//! `atenet.router.parking.rejected`), the semantic conventions' for the `process_*` series,
//! otherwise the Prometheus name with a counter's `_total` and a unit suffix (`_seconds`: `s`,
//! `_bytes`: `By`) moved to the unit and every `_` made a `.` (`ate_router_requests_total` →
//! `ate.router.requests`, `ate_router_resolve_duration_seconds` → `ate.router.resolve.duration`
//! in `s`); `…_cpu_seconds_total` becomes `….cpu.time`. Counters are cumulative monotonic sums
//! (integers when every value is), gauges are gauges, histograms keep their buckets. Labels
//! become attributes as they are.

use std::collections::HashMap;

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
    metric, number_data_point,
};

/// Semantic-convention names (and units) of the conventional `process_*` series.
const PROCESS_NAMES: &[(&str, &str, &str)] = &[
    ("process_cpu_seconds_total", "process.cpu.time", "s"),
    ("process_start_time_seconds", "process.start_time", "s"),
    (
        "process_resident_memory_bytes",
        "process.memory.usage",
        "By",
    ),
    (
        "process_virtual_memory_bytes",
        "process.memory.virtual",
        "By",
    ),
    (
        "process_open_fds",
        "process.unix.file_descriptor.count",
        "{file_descriptor}",
    ),
    (
        "process_max_fds",
        "process.unix.file_descriptor.limit",
        "{file_descriptor}",
    ),
    ("process_threads", "process.thread.count", "{thread}"),
];

/// The OTLP name and unit of the Prometheus family `name` of type `kind`.
pub fn otlp_name(name: &str, kind: Kind) -> (String, &'static str) {
    if let Some((_, otlp, unit)) = PROCESS_NAMES.iter().find(|(p, _, _)| *p == name) {
        return ((*otlp).to_string(), unit);
    }
    let mut base = name;
    if kind == Kind::Counter {
        base = base.strip_suffix("_total").unwrap_or(base);
    }
    let (base, unit, time) = if let Some(b) = base.strip_suffix("_cpu_seconds") {
        (b, "s", true)
    } else if let Some(b) = base.strip_suffix("_seconds") {
        (b, "s", false)
    } else if let Some(b) = base.strip_suffix("_bytes") {
        (b, "By", false)
    } else {
        (base, "", false)
    };
    let mut otlp = base.replace('_', ".");
    if time {
        otlp.push_str(".cpu.time");
    }
    (otlp, unit)
}

/// A family's `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    /// `summary` (never rendered here: every histogram is a histogram): left out.
    Other,
}

/// One sample line: its name's suffix within the family (`_bucket`, `_sum`, `_count` or none),
/// its labels and its value.
#[derive(Debug)]
struct Sample {
    suffix: &'static str,
    labels: Vec<(String, String)>,
    value: f64,
    /// The value as written is an integer (counters export as integers when all are).
    integral: bool,
}

#[derive(Debug)]
struct Family {
    name: String,
    kind: Kind,
    help: String,
    samples: Vec<Sample>,
}

/// The metrics of one `/metrics` text, stamped `now` (and `start` for cumulative ones, in Unix
/// ns). Lines that do not parse are skipped: the text is ours, and one bad line must not cost the
/// rest.
pub fn metrics(text: &str, start: u64, now: u64) -> Vec<Metric> {
    let families = parse(text);
    // Counters whose series began at a time a gauge of the same labels gives (Unix seconds):
    // an actor's CPU restarts from 0 in a restore's new cgroup, and a consumer tells a reset
    // from a drop by the start time.
    let mut starts: HashMap<(String, Labels), u64> = HashMap::new();
    for (counter, gauge) in STARTED_AT {
        let Some(g) = families.iter().find(|f| f.name == *gauge) else {
            continue;
        };
        for sample in &g.samples {
            let at = (sample.value * 1e9) as u64;
            if sample.value.is_finite() && at > 0 && at <= now {
                starts.insert(((*counter).to_string(), sample.labels.clone()), at);
            }
        }
    }
    families
        .into_iter()
        .filter_map(|f| {
            metric(
                f,
                &|name, labels| {
                    starts
                        .get(&(name.to_string(), labels.to_vec()))
                        .copied()
                        .unwrap_or(start)
                },
                now,
            )
        })
        .collect()
}

/// Counters and the gauge that says when each of their series started.
const STARTED_AT: &[(&str, &str)] = &[
    (
        "ate_worker_actor_cpu_seconds_total",
        "ate_worker_actor_start_time_seconds",
    ),
    ("process_cpu_seconds_total", "process_start_time_seconds"),
];

fn parse(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut help: HashMap<String, String> = HashMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = rest.split_once(' ') {
                help.insert(name.to_string(), unescape(text));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let Some((name, kind)) = rest.split_once(' ') else {
                continue;
            };
            let kind = match kind.trim() {
                "counter" => Kind::Counter,
                "gauge" | "untyped" => Kind::Gauge,
                "histogram" => Kind::Histogram,
                _ => Kind::Other,
            };
            index.entry(name.to_string()).or_insert_with(|| {
                families.push(Family {
                    name: name.to_string(),
                    kind,
                    help: help.get(name).cloned().unwrap_or_default(),
                    samples: Vec::new(),
                });
                families.len() - 1
            });
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some((name, labels, value)) = sample_line(line) else {
            continue;
        };
        let mut found = index.get(name).map(|&i| (i, ""));
        if found.is_none() {
            for suffix in ["_bucket", "_sum", "_count"] {
                if let Some(&i) = name.strip_suffix(suffix).and_then(|b| index.get(b)) {
                    found = Some((i, suffix));
                    break;
                }
            }
        }
        let (i, suffix) = match found {
            Some(f) => f,
            None => {
                // A series without `# TYPE`: untyped, exported as a gauge.
                families.push(Family {
                    name: name.to_string(),
                    kind: Kind::Gauge,
                    help: help.get(name).cloned().unwrap_or_default(),
                    samples: Vec::new(),
                });
                index.insert(name.to_string(), families.len() - 1);
                (families.len() - 1, "")
            }
        };
        let integral = !value.contains(['.', 'e', 'E', 'n', 'N', 'i', 'I']);
        let Ok(value) = value.parse::<f64>().or_else(|e| match value {
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            _ => Err(e),
        }) else {
            continue;
        };
        families[i].samples.push(Sample {
            suffix,
            labels,
            value,
            integral,
        });
    }
    families
}

/// A sample's labels, in their order.
type Labels = Vec<(String, String)>;

/// `name{k="v",…} value` (an optional timestamp after the value is ignored).
fn sample_line(line: &str) -> Option<(&str, Labels, &str)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let mut key = String::new();
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    rest = &inner[i + 1..];
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            '"' => break,
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                other => key.push(other),
            }
        }
    }
    let value = rest.split_whitespace().next()?;
    Some((name, labels, value))
}

/// A HELP text: `\\` and `\n` escapes undone.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

fn attributes(labels: &[(String, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue {
            key_strindex: 0,
            key: k.clone(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.clone())),
            }),
        })
        .collect()
}

/// The start (Unix ns) of a cumulative series of a family, by its labels.
type StartOf<'a> = &'a dyn Fn(&str, &[(String, String)]) -> u64;

fn metric(family: Family, start_of: StartOf<'_>, now: u64) -> Option<Metric> {
    let (name, unit) = otlp_name(&family.name, family.kind);
    let data = match family.kind {
        Kind::Other => return None,
        Kind::Counter => {
            let ints = family.samples.iter().all(|s| s.integral && s.value >= 0.0);
            metric::Data::Sum(Sum {
                data_points: family
                    .samples
                    .iter()
                    .map(|s| number(s, ints, start_of(&family.name, &s.labels), now))
                    .collect(),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })
        }
        Kind::Gauge => metric::Data::Gauge(Gauge {
            data_points: family
                .samples
                .iter()
                .map(|s| number(s, false, 0, now))
                .collect(),
        }),
        Kind::Histogram => metric::Data::Histogram(Histogram {
            data_points: histogram_points(&family.samples, start_of(&family.name, &[]), now),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
    };
    Some(Metric {
        name,
        description: family.help,
        unit: unit.to_string(),
        metadata: Vec::new(),
        data: Some(data),
    })
}

fn number(s: &Sample, int: bool, start: u64, now: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attributes(&s.labels),
        start_time_unix_nano: start,
        time_unix_nano: now,
        exemplars: Vec::new(),
        flags: 0,
        value: Some(if int {
            number_data_point::Value::AsInt(s.value as i64)
        } else {
            number_data_point::Value::AsDouble(s.value)
        }),
    }
}

/// One point per label set (`le` aside): bounds from the finite `le`s, per-bucket counts from
/// the cumulative ones, the last bucket (+Inf) from `_count`.
fn histogram_points(samples: &[Sample], start: u64, now: u64) -> Vec<HistogramDataPoint> {
    #[derive(Default)]
    struct Point {
        buckets: Vec<(f64, f64)>,
        sum: f64,
        count: f64,
    }
    let mut order: Vec<Vec<(String, String)>> = Vec::new();
    let mut points: HashMap<Vec<(String, String)>, Point> = HashMap::new();
    for s in samples {
        let mut le = None;
        let labels: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, v)| {
                let is_le = k == "le";
                if is_le {
                    le = Some(v.clone());
                }
                !is_le
            })
            .cloned()
            .collect();
        let point = points.entry(labels.clone()).or_insert_with(|| {
            order.push(labels);
            Point::default()
        });
        match s.suffix {
            "_bucket" => {
                let bound = match le.as_deref() {
                    Some("+Inf") | None => f64::INFINITY,
                    Some(b) => b.parse().unwrap_or(f64::INFINITY),
                };
                point.buckets.push((bound, s.value));
            }
            "_sum" => point.sum = s.value,
            "_count" => point.count = s.value,
            _ => {}
        }
    }
    order
        .into_iter()
        .filter_map(|labels| {
            let mut p = points.remove(&labels)?;
            p.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let finite: Vec<(f64, f64)> = p
                .buckets
                .into_iter()
                .filter(|(b, _)| b.is_finite())
                .collect();
            let mut counts = Vec::with_capacity(finite.len() + 1);
            let mut below = 0.0;
            for (_, cumulative) in &finite {
                counts.push((cumulative - below).max(0.0) as u64);
                below = *cumulative;
            }
            counts.push((p.count - below).max(0.0) as u64);
            Some(HistogramDataPoint {
                attributes: attributes(&labels),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: p.count as u64,
                sum: Some(p.sum),
                bucket_counts: counts,
                explicit_bounds: finite.into_iter().map(|(b, _)| b).collect(),
                exemplars: Vec::new(),
                flags: 0,
                min: None,
                max: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP atenet_router_parking_active Requests parked now (spec: atenet.router.parking.active).
# TYPE atenet_router_parking_active gauge
atenet_router_parking_active 0

# HELP atenet_router_parking_rejected_total Requests answered 503.
# TYPE atenet_router_parking_rejected_total counter
atenet_router_parking_rejected_total 3

# TYPE ate_router_requests_total counter
ate_router_requests_total{status="200"} 7
ate_router_requests_total{status="5xx"} 1

# HELP ate_router_resolve_duration_seconds Time to find a worker.\nSecond line \\ here.
# TYPE ate_router_resolve_duration_seconds histogram
ate_router_resolve_duration_seconds_bucket{outcome="ok",le="0.001"} 2
ate_router_resolve_duration_seconds_bucket{outcome="ok",le="0.01"} 5
ate_router_resolve_duration_seconds_bucket{outcome="ok",le="+Inf"} 6
ate_router_resolve_duration_seconds_sum{outcome="ok"} 1.25
ate_router_resolve_duration_seconds_count{outcome="ok"} 6

# TYPE ate_worker_actor_cpu_seconds_total counter
ate_worker_actor_cpu_seconds_total{atespace="a",actor="q\"x\\y"} 1.5
ate_worker_actor_cpu_seconds_total{atespace="_other",actor="_other"} 0

# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1048576
"#;

    fn find<'a>(ms: &'a [Metric], name: &str) -> &'a Metric {
        ms.iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {ms:#?}"))
    }

    #[test]
    fn names_follow_the_spec_and_conventions() {
        assert_eq!(
            otlp_name("atenet_router_parking_active", Kind::Gauge),
            ("atenet.router.parking.active".into(), "")
        );
        assert_eq!(
            otlp_name("atenet_router_parking_rejected_total", Kind::Counter),
            ("atenet.router.parking.rejected".into(), "")
        );
        assert_eq!(
            otlp_name("ate_router_parking_wait_seconds", Kind::Histogram),
            ("ate.router.parking.wait".into(), "s")
        );
        assert_eq!(
            otlp_name("ate_worker_snapshot_bytes_written_total", Kind::Counter),
            ("ate.worker.snapshot.bytes.written".into(), "")
        );
        assert_eq!(
            otlp_name("ate_worker_actor_memory_bytes", Kind::Gauge),
            ("ate.worker.actor.memory".into(), "By")
        );
        assert_eq!(
            otlp_name("ate_worker_actor_cpu_seconds_total", Kind::Counter),
            ("ate.worker.actor.cpu.time".into(), "s")
        );
        assert_eq!(
            otlp_name("process_cpu_seconds_total", Kind::Counter),
            ("process.cpu.time".into(), "s")
        );
    }

    #[test]
    fn every_family_becomes_a_metric() {
        let ms = metrics(TEXT, 10, 20);
        assert_eq!(ms.len(), 6, "{ms:#?}");

        let active = find(&ms, "atenet.router.parking.active");
        assert!(active.description.contains("parked now"));
        let Some(metric::Data::Gauge(g)) = &active.data else {
            panic!("{active:?}")
        };
        assert_eq!(
            g.data_points[0].value,
            Some(number_data_point::Value::AsDouble(0.0))
        );
        assert_eq!(g.data_points[0].time_unix_nano, 20);

        let rejected = find(&ms, "atenet.router.parking.rejected");
        let Some(metric::Data::Sum(s)) = &rejected.data else {
            panic!("{rejected:?}")
        };
        assert!(s.is_monotonic);
        assert_eq!(
            s.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        assert_eq!(
            s.data_points[0].value,
            Some(number_data_point::Value::AsInt(3))
        );
        assert_eq!(s.data_points[0].start_time_unix_nano, 10);

        let requests = find(&ms, "ate.router.requests");
        let Some(metric::Data::Sum(s)) = &requests.data else {
            panic!("{requests:?}")
        };
        assert_eq!(s.data_points.len(), 2);
        assert_eq!(
            s.data_points[1].attributes,
            attributes(&[("status".into(), "5xx".into())])
        );

        let cpu = find(&ms, "ate.worker.actor.cpu.time");
        assert_eq!(cpu.unit, "s");
        let Some(metric::Data::Sum(s)) = &cpu.data else {
            panic!("{cpu:?}")
        };
        // Not all integers: doubles throughout; label escapes undone.
        assert_eq!(
            s.data_points[0].value,
            Some(number_data_point::Value::AsDouble(1.5))
        );
        assert_eq!(
            s.data_points[0].attributes,
            attributes(&[
                ("atespace".into(), "a".into()),
                ("actor".into(), "q\"x\\y".into())
            ])
        );

        let memory = find(&ms, "process.memory.usage");
        assert_eq!(memory.unit, "By");
    }

    #[test]
    fn counters_start_when_their_start_gauge_says() {
        let text = "# TYPE ate_worker_actor_cpu_seconds_total counter
ate_worker_actor_cpu_seconds_total{atespace=\"a\",actor=\"b\"} 2.5
ate_worker_actor_cpu_seconds_total{atespace=\"_other\",actor=\"_other\"} 1
# TYPE ate_worker_actor_start_time_seconds gauge
ate_worker_actor_start_time_seconds{atespace=\"a\",actor=\"b\"} 1700000000.5
";
        let ms = metrics(text, 10, 1_800_000_000_000_000_000);
        let Some(metric::Data::Sum(s)) = &find(&ms, "ate.worker.actor.cpu.time").data else {
            panic!("{ms:?}")
        };
        assert_eq!(
            s.data_points[0].start_time_unix_nano,
            1_700_000_000_500_000_000
        );
        // No start gauge for the sum past the cap: the export's start.
        assert_eq!(s.data_points[1].start_time_unix_nano, 10);
    }

    #[test]
    fn histograms_keep_their_buckets() {
        let ms = metrics(TEXT, 10, 20);
        let h = find(&ms, "ate.router.resolve.duration");
        assert_eq!(h.unit, "s");
        assert_eq!(
            h.description,
            "Time to find a worker.\nSecond line \\ here."
        );
        let Some(metric::Data::Histogram(h)) = &h.data else {
            panic!("{h:?}")
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, [0.001, 0.01]);
        assert_eq!(p.bucket_counts, [2, 3, 1]);
        assert_eq!((p.count, p.sum), (6, Some(1.25)));
        assert_eq!(p.attributes, attributes(&[("outcome".into(), "ok".into())]));
    }

    #[test]
    fn the_real_render_converts_whole() {
        ate_telemetry::install("otlp-test", || {
            ::metrics::describe_histogram!("ate_otlptest_wait_seconds", "A wait.");
        });
        ::metrics::histogram!("ate_otlptest_wait_seconds", "k" => "v").record(0.002);
        let text = ate_telemetry::render();
        let ms = metrics(&text, 1, 2);
        let h = find(&ms, "ate.otlptest.wait");
        let Some(metric::Data::Histogram(h)) = &h.data else {
            panic!("{h:?}")
        };
        assert_eq!(h.data_points[0].count, 1);
        assert_eq!(h.data_points[0].bucket_counts.iter().sum::<u64>(), 1);
        find(&ms, "ate.build.info");
        find(&ms, "process.cpu.time");
        // Every family of the text is there (none lost to parsing).
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(ms.len(), families, "{text}");
    }
}
