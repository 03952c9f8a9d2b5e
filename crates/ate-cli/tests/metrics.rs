//! Every component's `/metrics` of a real `ate up` system (api, router, node agent, workers, the
//! last two on the addresses `--node-metrics-listen` and `--worker-metrics-listen` gave),
//! scraped after a cold request, a warm one, a suspend and a restore, and checked against the
//! Prometheus text format by a strict parser (below): every family has `# HELP` and `# TYPE`,
//! no summaries, histograms well formed, no label value naming an actor outside the worker's
//! capped per-actor families (`ate_worker_actor_*`, which do show the running actors), the
//! spec's two parking series and `ate_build_info` present, and every metric `deploy/grafana/ate-dashboard.json`
//! queries exported by some component.
//!
//! The parser is hand-written because the crates that parse this format skip lines they do not
//! understand, which is what this test must catch (`prometheus-parse` also files histogram
//! `_sum`/`_count` lines as untyped and splits label values at commas).

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use ate_test_support::http::http_get;
use support::*;

/// Actors of this test: no label value of any series may contain these.
const ACTORS: [&str; 3] = ["scrape-me-7q", "scrape-me-8r", "scrape-me-9s"];

/// A free loopback port whose successor is free too (worker 2's metrics port).
fn two_free_ports_in_a_row() -> u16 {
    for _ in 0..100 {
        let [p] = free_ports();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no two consecutive free loopback ports");
}

#[test]
fn every_component_exports_well_formed_prometheus_metrics() {
    let [node_port] = free_ports();
    let worker_base = two_free_ports_in_a_row();
    // One slot per worker, so that a third actor has to park (a short budget keeps it quick).
    let sys = System::up(UpOptions {
        workers: 2,
        slots: 1,
        router_args: vec!["--parked-request-budget=1s".into()],
        up_args: vec![
            format!("--node-metrics-listen=127.0.0.1:{node_port}"),
            format!("--worker-metrics-listen=127.0.0.1:{worker_base}"),
        ],
        ..Default::default()
    });
    assert!(!sys.api_http.is_empty(), "ready file: api_http");
    // The fixed addresses, in the ready file: the node's as given, worker N's at base + N - 1.
    assert_eq!(sys.node_metrics, format!("127.0.0.1:{node_port}"));
    assert_eq!(
        sys.worker_metrics,
        [
            format!("127.0.0.1:{worker_base}"),
            format!("127.0.0.1:{}", worker_base + 1)
        ],
        "ready file: worker_metrics"
    );
    for actor in ACTORS {
        sys.ate_ok(&create_actor_args(actor, "ate-demo", "ate-demo/counter"));
    }
    let [a, b, c] = ACTORS.map(|n| format!("ate-demo/{n}"));
    // Cold, then warm (the router has the assignment cached: this one never reaches the api).
    for what in ["cold", "warm"] {
        let (status, _, body) = get(sys.router_addr, &a, "/");
        assert_eq!(status, 200, "{what} request: {body}\n{}", sys.log("router"));
    }
    // A warm resume in the api: ResumeActor of the running actor.
    sys.ate_ok(&["resume", "actor", ACTORS[0], "-a", "ate-demo"]);
    // The second worker's slot, then no room: parked for the budget, then 503.
    assert_eq!(get(sys.router_addr, &b, "/").0, 200);
    let (status, _, body) = get(sys.router_addr, &c, "/");
    assert_eq!(status, 503, "a third actor with two slots: {body}");
    sys.ate_ok(&["suspend", "actor", ACTORS[0], "-a", "ate-demo"]);
    // A restore of the generation just written.
    let (status, _, body) = get(sys.router_addr, &a, "/");
    assert_eq!(status, 200, "request after the suspend: {body}");

    let mut endpoints: Vec<(String, String)> = vec![
        ("api".into(), sys.api_http.clone()),
        ("router".into(), sys.router_metrics.to_string()),
        ("node".into(), sys.node_metrics.clone()),
    ];
    for (i, w) in sys.worker_metrics.iter().enumerate() {
        endpoints.push((format!("worker-{}", i + 1), w.clone()));
    }
    for (name, addr) in &endpoints {
        let (status, body) = http_get(addr, "/healthz");
        assert_eq!(status, 200, "{name} /healthz: {body}");
    }

    let dashboard = dashboard_metrics();
    assert!(dashboard.len() > 10, "dashboard metrics: {dashboard:?}");
    // The background upload of the suspend's generation reports when it is done: scrape until
    // every dashboard metric is there (or the deadline passes and the check below says which).
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrapes = loop {
        let scrapes: Vec<(String, Scrape)> = endpoints
            .iter()
            .map(|(name, addr)| {
                let (status, body) = http_get(addr, "/metrics");
                assert_eq!(status, 200, "{name} /metrics: {body}");
                let scrape = Scrape::parse(&body)
                    .unwrap_or_else(|e| panic!("{name} /metrics is not valid: {e}\n{body}"));
                (name.clone(), scrape)
            })
            .collect();
        let all: BTreeSet<&str> = scrapes.iter().flat_map(|(_, s)| s.names()).collect();
        if dashboard.iter().all(|m| all.contains(m.as_str())) || Instant::now() > deadline {
            break scrapes;
        }
        std::thread::sleep(Duration::from_millis(500));
    };

    let mut exported = BTreeSet::new();
    for (name, scrape) in &scrapes {
        let component = name.split('-').next().unwrap_or(name);
        // Conventions: one scheme of names per component (plus the spec's two and process_*).
        for (family, f) in &scrape.families {
            let own = format!("ate_{component}_");
            let allowed = family.starts_with(&own)
                || family == "ate_build_info"
                || family.starts_with("process_")
                || (component == "router"
                    && [
                        "atenet_router_parking_active",
                        "atenet_router_parking_rejected_total",
                    ]
                    .contains(&family.as_str()));
            assert!(
                allowed,
                "{name}: {family} is outside the ate_{component}_ scheme"
            );
            assert_ne!(f.kind, "summary", "{name}: {family} is a summary");
            assert_ne!(f.kind, "untyped", "{name}: {family} is untyped");
            if f.kind == "counter" {
                assert!(
                    family.ends_with("_total"),
                    "{name}: counter {family} without _total"
                );
            }
            // The worker's per-actor families are capped (--actor-metrics-limit): the only
            // ones allowed to name actors.
            let per_actor = component == "worker" && family.starts_with("ate_worker_actor_");
            for sample in f.samples.iter().filter(|_| !per_actor) {
                for (label, value) in &sample.labels {
                    for actor in ACTORS {
                        assert!(
                            !value.contains(actor),
                            "{name}: {family}{{{label}={value:?}}} names an actor"
                        );
                    }
                }
            }
        }
        // Every component says what it is.
        let info = scrape
            .families
            .get("ate_build_info")
            .unwrap_or_else(|| panic!("{name}: no ate_build_info"));
        assert!(
            info.samples.iter().any(|s| s.value == 1.0
                && s.labels.get("component").map(String::as_str) == Some(component)
                && s.labels.get("version").is_some_and(|v| !v.is_empty())),
            "{name}: ate_build_info {:?}",
            info.samples
        );
        for process in [
            "process_start_time_seconds",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_cpu_seconds_total",
        ] {
            assert!(
                scrape.families.contains_key(process),
                "{name}: no {process}"
            );
        }
        exported.extend(scrape.names().map(str::to_string));
    }

    // The running actors (the first one restored, the second one) have series of their own on
    // their worker; the third never ran.
    let per_actor = |actor: &str| {
        scrapes.iter().any(|(_, scrape)| {
            scrape
                .families
                .get("ate_worker_actor_memory_bytes")
                .is_some_and(|f| {
                    f.samples.iter().any(|s| {
                        s.labels.get("actor").map(String::as_str) == Some(actor)
                            && s.labels.get("atespace").map(String::as_str) == Some("ate-demo")
                            && s.value > 0.0
                    })
                })
        })
    };
    assert!(
        per_actor(ACTORS[0]) && per_actor(ACTORS[1]),
        "per-actor series"
    );
    assert!(
        !per_actor(ACTORS[2]),
        "an actor that never ran has no series"
    );

    let router = &scrapes[1].1;
    for spec in [
        "atenet_router_parking_active",
        "atenet_router_parking_rejected_total",
    ] {
        assert!(router.families.contains_key(spec), "router: no {spec}");
    }
    assert_eq!(
        router.families["atenet_router_parking_active"].kind,
        "gauge"
    );
    assert_eq!(
        router.families["atenet_router_parking_rejected_total"].kind,
        "counter"
    );

    // Warm and cold resumes carry the same labels.
    let api = &scrapes[0].1;
    let resumes = &api.families["ate_api_resume_total"].samples;
    for path in ["warm", "cold"] {
        let s = resumes
            .iter()
            .find(|s| s.labels.get("path").map(String::as_str) == Some(path))
            .unwrap_or_else(|| panic!("no {path} resume in {resumes:?}"));
        let keys: BTreeSet<&str> = s.labels.keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["outcome", "path"]), "{path}: {s:?}");
    }
    // The node agent counted the restore and the checkpoint; the workers their phases.
    let node = &scrapes[2].1;
    assert!(node.value("ate_node_restores_total", &[("outcome", "ok")]) >= 1.0);
    assert!(node.value("ate_node_checkpoints_total", &[("outcome", "ok")]) >= 1.0);
    let workers_written: f64 = scrapes[3..]
        .iter()
        .map(|(_, s)| s.value("ate_worker_snapshot_bytes_written_total", &[]))
        .sum();
    assert!(workers_written > 0.0, "no snapshot bytes written");

    let missing: Vec<&String> = dashboard
        .iter()
        .filter(|m| !exported.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no component exports: {missing:?}"
    );
}

/// The metric names in the dashboard's PromQL expressions (`_bucket`/`_sum`/`_count` of a
/// histogram stay as written: [`Scrape::names`] lists those too).
fn dashboard_metrics() -> BTreeSet<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/ate-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let json: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut exprs = Vec::new();
    collect_exprs(&json, &mut exprs);
    assert!(!exprs.is_empty(), "no expr in the dashboard");
    exprs.iter().flat_map(|e| promql_metrics(e)).collect()
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// Metric names in one PromQL expression: identifiers outside label matchers, ranges and
/// grouping clauses that are neither functions, keywords nor numbers.
fn promql_metrics(expr: &str) -> Vec<String> {
    // Grouping modifiers: a label list follows them.
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &[
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan", // aggregation operators (`sum by (…) (…)`):
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    // Drop {…}, […] and quoted strings.
    let mut plain = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut quote: Option<char> = None;
    for c in expr.chars() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' if depth_brace == 0 => quote = Some(c),
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace == 0 && depth_bracket == 0 => plain.push(c),
            _ => {}
        }
    }
    let chars: Vec<char> = plain.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let called = chars.get(j) == Some(&'(');
            let lower = word.to_ascii_lowercase();
            if GROUPING.contains(&lower.as_str()) {
                // The label list that follows is not metrics.
                skip_group = called;
            } else if !called && !KEYWORDS.contains(&lower.as_str()) {
                names.push(word);
            }
            continue;
        }
        if c == '(' && skip_group {
            // Skip to the matching ')'.
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            skip_group = false;
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    names
}

#[test]
fn promql_metric_extraction() {
    let e = r#"histogram_quantile(0.99, sum by (le, path) (rate(ate_api_resume_seconds_bucket{path="warm",x=~"a|b"}[$__rate_interval]))) / on (instance) group_left max(up) > bool 2e3"#;
    assert_eq!(promql_metrics(e), ["ate_api_resume_seconds_bucket", "up"]);
}

// ----------------------------------------------------------------- a strict text-format parser

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Family {
    help: Option<String>,
    kind: String,
    samples: Vec<Sample>,
}

#[derive(Debug, Default)]
struct Scrape {
    families: BTreeMap<String, Family>,
}

impl Scrape {
    /// Family names, and for histograms also their `_bucket`, `_sum` and `_count` series.
    fn names(&self) -> impl Iterator<Item = &str> {
        self.families
            .values()
            .flat_map(|f| f.samples.iter().map(|s| s.name.as_str()))
            .chain(self.families.keys().map(String::as_str))
    }

    /// The sum of `name`'s samples whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.families
            .get(name)
            .map(|f| {
                f.samples
                    .iter()
                    .filter(|s| s.name == name)
                    .filter(|s| {
                        labels
                            .iter()
                            .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
                    })
                    .map(|s| s.value)
                    .sum()
            })
            .unwrap_or(0.0)
    }

    /// Parses the text format (0.0.4) strictly: every line must be a HELP, a TYPE, a comment, a
    /// blank line or a sample of a family declared before it with both HELP and TYPE; a family's
    /// lines are contiguous; no series twice; histograms cumulative with a `+Inf` bucket equal
    /// to `_count`, and `_sum`.
    fn parse(text: &str) -> Result<Scrape, String> {
        let mut scrape = Scrape::default();
        let mut seen_series = BTreeSet::new();
        let mut current: Option<String> = None;
        let mut closed = BTreeSet::new();
        for (n, line) in text.lines().enumerate() {
            let at = |msg: String| format!("line {}: {msg}: {line:?}", n + 1);
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                let rest = rest.strip_prefix(' ').unwrap_or(rest);
                let mut parts = rest.splitn(3, ' ');
                let keyword = parts.next().unwrap_or_default();
                if keyword != "HELP" && keyword != "TYPE" {
                    continue; // a comment
                }
                let name = parts.next().ok_or_else(|| at("no metric name".into()))?;
                check_name(name).map_err(at)?;
                let arg = parts
                    .next()
                    .ok_or_else(|| at(format!("{keyword} without text")))?;
                if current.as_deref() != Some(name) {
                    if let Some(prev) = current.take() {
                        closed.insert(prev);
                    }
                    if closed.contains(name) {
                        return Err(at(format!("{name} appears twice (not contiguous)")));
                    }
                    current = Some(name.to_string());
                }
                let f = scrape.families.entry(name.to_string()).or_default();
                if !f.samples.is_empty() {
                    return Err(at(format!("{keyword} of {name} after its samples")));
                }
                if keyword == "HELP" {
                    if f.help.replace(arg.to_string()).is_some() {
                        return Err(at(format!("second HELP for {name}")));
                    }
                } else {
                    if !f.kind.is_empty() {
                        return Err(at(format!("second TYPE for {name}")));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg) {
                        return Err(at(format!("unknown type {arg}")));
                    }
                    f.kind = arg.to_string();
                }
                continue;
            }
            let sample = parse_sample(line).map_err(at)?;
            let family = current
                .clone()
                .filter(|fam| {
                    let kind = &scrape.families[fam].kind;
                    sample.name == *fam
                        || (kind == "histogram"
                            && ["_bucket", "_sum", "_count"]
                                .iter()
                                .any(|s| sample.name == format!("{fam}{s}")))
                })
                .ok_or_else(|| at(format!("{} has no HELP/TYPE before it", sample.name)))?;
            let f = scrape.families.get_mut(&family).expect("family");
            if f.help.as_deref().is_none_or(str::is_empty) {
                return Err(at(format!("{family} has no HELP")));
            }
            if f.kind.is_empty() {
                return Err(at(format!("{family} has no TYPE")));
            }
            if f.kind == "histogram" && sample.name == family {
                return Err(at(format!("histogram {family} sample without a suffix")));
            }
            if !seen_series.insert(format!("{}{:?}", sample.name, sample.labels)) {
                return Err(at("the same series twice".into()));
            }
            if (f.kind == "counter" || sample.name.ends_with("_count")) && sample.value < 0.0 {
                return Err(at("negative count".into()));
            }
            f.samples.push(sample);
        }
        for (name, f) in &scrape.families {
            if f.help.is_none() || f.kind.is_empty() {
                return Err(format!("{name}: HELP or TYPE missing"));
            }
            if f.kind == "histogram" {
                check_histogram(name, f)?;
            }
        }
        Ok(scrape)
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if ok {
        Ok(())
    } else {
        Err(format!("bad metric name {name:?}"))
    }
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => v.parse().map_err(|_| format!("bad value {v:?}")),
    }
}

/// `name{label="value",…} value [timestamp]`, label values with `\\`, `\"` and `\n` escapes.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "no value".to_string())?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        loop {
            // label name
            let start = match chars.peek() {
                Some((_, '}')) => {
                    let (i, _) = chars.next().expect("peeked");
                    rest = &after[i + 1..];
                    break;
                }
                Some((i, _)) => *i,
                None => return Err("unterminated labels".into()),
            };
            let mut end = start;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    end = i;
                    break;
                }
                if !(c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!("bad label name character {c:?}"));
                }
            }
            let label = &after[start..end];
            if label.is_empty() || label.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(format!("bad label name {label:?}"));
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {label} value not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("bad escape {other:?}")),
                    },
                    Some((_, '"')) => break,
                    Some((_, '\n')) | None => return Err("unterminated label value".into()),
                    Some((_, c)) => value.push(c),
                }
            }
            if labels.insert(label.to_string(), value).is_some() {
                return Err(format!("label {label} twice"));
            }
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    rest = &after[i + 1..];
                    break;
                }
                other => return Err(format!("expected , or }} after a label, got {other:?}")),
            }
        }
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_string())?;
    let mut fields = rest.split(' ');
    let value = parse_value(fields.next().unwrap_or_default())?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// One histogram series: its buckets (`le`, count), `_sum` and `_count`.
type HistogramSeries = (Vec<(f64, f64)>, Option<f64>, Option<f64>);

fn check_histogram(name: &str, f: &Family) -> Result<(), String> {
    // Per label set (without `le`): buckets in order, cumulative, `+Inf` == _count, a _sum.
    let mut groups: HashMap<String, HistogramSeries> = HashMap::new();
    for s in &f.samples {
        let mut key = s.labels.clone();
        let le = key.remove("le");
        let g = groups.entry(format!("{key:?}")).or_default();
        if s.name.ends_with("_bucket") {
            let le = le.ok_or_else(|| format!("{name}: bucket without le"))?;
            g.0.push((parse_value(&le)?, s.value));
        } else if s.name.ends_with("_sum") {
            g.1 = Some(s.value);
        } else if s.name.ends_with("_count") {
            g.2 = Some(s.value);
        }
    }
    for (labels, (buckets, sum, count)) in groups {
        let count = count.ok_or_else(|| format!("{name}{labels}: no _count"))?;
        sum.ok_or_else(|| format!("{name}{labels}: no _sum"))?;
        let last = buckets
            .last()
            .ok_or_else(|| format!("{name}{labels}: no buckets"))?;
        if last.0 != f64::INFINITY || last.1 != count {
            return Err(format!(
                "{name}{labels}: +Inf bucket {last:?} vs count {count}"
            ));
        }
        if buckets.len() < 3 {
            return Err(format!("{name}{labels}: only {} buckets", buckets.len()));
        }
        for w in buckets.windows(2) {
            if w[1].0 <= w[0].0 || w[1].1 < w[0].1 {
                return Err(format!("{name}{labels}: buckets not cumulative: {w:?}"));
            }
        }
    }
    Ok(())
}

#[test]
fn the_parser_rejects_what_prometheus_would() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"q\\\"u,o\"} 1\n\n\
                # HELP h_seconds H.\n# TYPE h_seconds histogram\n\
                h_seconds_bucket{le=\"0.1\"} 1\nh_seconds_bucket{le=\"1\"} 2\nh_seconds_bucket{le=\"+Inf\"} 2\n\
                h_seconds_sum 0.5\nh_seconds_count 2\n";
    let s = Scrape::parse(good).expect("good");
    assert_eq!(s.families["a_total"].samples[0].labels["x"], "q\"u,o");
    for bad in [
        "a_total 1\n",                               // no HELP/TYPE
        "# TYPE a_total counter\na_total 1\n",       // no HELP
        "# HELP a_total A.\na_total 1\n",            // no TYPE
        "# HELP a A.\n# TYPE a gauge\na{x=\"1} 1\n", // unterminated
        "# HELP a A.\n# TYPE a gauge\na{x=1} 1\n",   // unquoted
        "# HELP a A.\n# TYPE a gauge\na 1\na 2\n",   // twice
        "# HELP a A.\n# TYPE a gauge\na one\n",      // bad value
        "# HELP a A.\n# TYPE a gauge\nb 1\n",        // another family's sample
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
    ] {
        assert!(Scrape::parse(bad).is_err(), "accepted {bad:?}");
    }
}
