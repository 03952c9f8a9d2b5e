//! SVG charts of `ate bench` results, drawn from the same JSON value that is written to `--out`.
//!
//! plotters with only its SVG backend: text becomes `<text>` elements that the viewer renders
//! with its own fonts (no font files are loaded here). Fields missing from the JSON are skipped.
//!
//! One file per shape of chart: `resume.rs` (latency per concurrency level), `load.rs` (a load
//! run over time: throughput, parking), `bars.rs` (one bar per row: warm, snapshots); the shared
//! helpers are here.

mod bars;
mod load;
mod resume;

use anyhow::{Context as _, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use bars::{snapshots, warm};
use load::{parking, throughput};
use resume::resume;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

const SIZE: (u32, u32) = (960, 560);
const TITLE: u32 = 22;
const LABEL: u32 = 13;
const GREY: RGBColor = RGBColor(120, 120, 120);
const ORANGE: RGBColor = RGBColor(230, 130, 20);
const DARK_GREEN: RGBColor = RGBColor(30, 150, 60);

/// The chart of one bench's JSON value (`kind` as passed to `write_json`), as SVG text.
pub fn svg(kind: &str, value: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        match kind {
            "resume" => resume(&root, value)?,
            "throughput" => throughput(&root, value)?,
            "parking" => parking(&root, value)?,
            "warm" => warm(&root, value)?,
            "snapshots" => snapshots(&root, value)?,
            _ => bail!("no chart for bench kind {kind:?}"),
        }
        root.present()?;
    }
    Ok(out)
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A number field formatted, or nothing when it is missing.
fn opt(v: &Value, key: &str, fmt: impl Fn(f64) -> String) -> String {
    num(v, key).map(fmt).unwrap_or_default()
}

/// An axis tick without trailing zeros (`5`, `0.25`).
fn tick(x: &f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Top of a value axis: a little above the largest value, never an empty range.
fn top(values: impl Iterator<Item = f64>, headroom: f64) -> f64 {
    let max = values.fold(0.0, f64::max);
    if max > 0.0 { max * headroom } else { 1.0 }
}

/// A chart with `title` and the frame of every chart here; `y_label_area` is the room for the
/// y axis labels.
fn chart_builder<'a, 'b>(
    root: &'a Area<'b>,
    title: String,
    y_label_area: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, ("sans-serif", TITLE))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(y_label_area);
    builder
}

fn legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(GREY)
        .label_font(("sans-serif", LABEL + 1))
        .draw()
        .context("legend")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The chart's SVG after checking its frame and that each of `expected` is one of its texts.
    fn check(kind: &str, v: &Value, expected: &[&str]) -> String {
        let svg = svg(kind, v).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        let texts = texts(&svg);
        for t in expected {
            assert!(texts.contains(t), "{kind}: {t:?} is not among {texts:#?}");
        }
        svg
    }

    /// The content of each `<text>` element (plotters writes it on a line of its own).
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text ")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
            .collect()
    }

    fn sample(status: u16, secs: f64, start: &str) -> Value {
        json!({"status": status, "seconds": secs, "resume": "cold", "start": start, "body": "x"})
    }

    #[test]
    fn resume_chart() {
        let level = |n: u64, med: f64, slow: f64| {
            json!({"n": n, "requests": n * 2, "returned_200": n * 2, "median_seconds": med,
                   "p90_seconds": slow, "slowest_seconds": slow,
                   "samples": [sample(200, med, "2026-11-30T04:43:41.483Z")]})
        };
        let v = json!({"kind": "resume", "memory_mib": 50, "rounds": 2, "router": "http://r",
                       "levels": [level(1, 0.055, 0.067), level(4, 0.2, 0.31), level(16, 0.9, 1.4)]});
        check(
            "resume",
            &v,
            &[
                "Cold resume latency vs concurrency (50 MiB actors, 2 rounds)",
                "seconds from request to reply",
                "0.055 s",
                "1.400 s",
                "16",
                "median",
                "slowest",
            ],
        );
    }

    #[test]
    fn throughput_chart() {
        let v = json!({"kind": "throughput", "seconds": 3.2, "concurrency": 16, "actors": 48,
                       "requests": 60, "returned_200": 60, "cold_resumes": 60,
                       "resumes_per_second": 18.75, "p50_seconds": 0.26, "p99_seconds": 0.56,
                       "cold_per_second": [43, 12, 5, 0], "first_errors": []});
        check(
            "throughput",
            &v,
            &[
                "Cold resumes completed per second (16 requests in flight, 48 actors, 3.2 s run)",
                "seconds since the start of the run",
                "43",
                "12",
                "mean 18.8 resumes/s",
                "resumes in that second (60 in all, p50 0.260 s, p99 0.560 s)",
            ],
        );
    }

    #[test]
    fn throughput_burst_chart() {
        let v = json!({"kind": "throughput", "mode": "burst", "seconds": 4.5, "concurrency": 32,
                       "actors": 64, "requests": 64, "returned_200": 60, "not_200": 4,
                       "cold_resumes": 60, "resumes_per_second": 13.3, "p50_seconds": 1.2,
                       "p99_seconds": 2.5, "cold_per_second": [10, 30, 20, 0, 0],
                       "not_200_per_second": [0, 0, 0, 0, 4], "samples": []});
        check(
            "throughput",
            &v,
            &[
                "Cold resumes completed per second (one request to each of 64 actors, up to 32 in flight, 4.5 s run)",
                "seconds since the first request was sent",
                "30",
                "answers other than 200 (4 in all)",
                "answers in that second",
                "mean 13.3 resumes/s",
            ],
        );
    }

    #[test]
    fn parking_chart_of_the_load_run() {
        let v = json!({"kind": "parking", "atespace": "p", "timeline": [], "load": {
            "seconds": 30, "summary": "==> results",
            "requests": [sample(200, 0.4, "2026-11-30T23:59:59.500Z"),
                         sample(503, 5.05, "2026-12-01T00:00:00.100Z"),
                         sample(200, 1.2, "2026-12-01T00:00:02.000Z")]}});
        let svg = check(
            "parking",
            &v,
            &[
                "Parking: latency of each request of the 30 s load run",
                "200 OK (2)",
                "503 unavailable (1)",
            ],
        );
        assert!(!svg.contains("other status"));
    }

    #[test]
    fn parking_chart_of_the_timeline_without_load() {
        let reply = |s, t, at| sample(s, t, at);
        let v = json!({"kind": "parking", "atespace": "p", "load": null, "timeline": [
            {"event": "p1", "line": "", "reply": reply(200, 0.3, "2026-11-30T04:00:00.000Z")},
            {"event": "p3-no-free-worker", "line": "", "reply": reply(503, 0.01, "2026-11-30T04:00:01.000Z")},
            {"event": "p3-request-start", "line": "", "reply": null},
            {"event": "p3-served-after-park", "line": "", "reply": reply(200, 2.1, "2026-11-30T04:00:01.100Z")}]});
        check(
            "parking",
            &v,
            &[
                "Parking: latency of each scripted request",
                "p3-no-free-worker 503 (0.010 s)",
                "p3-served-after-park 200 (2.100 s)",
            ],
        );
    }

    #[test]
    fn warm_chart() {
        let side = |rps: f64| json!({"requests": 1000, "errors": 0, "rps": rps, "p50_ms": 0.41, "p99_ms": 1.2});
        let v = json!({"kind": "warm", "seconds": 10, "concurrency": 64, "path": "/", "rounds": 2,
            "sides": [
                {"name": "direct (in-process baseline)", "median": side(30000.0), "rounds": [side(29000.0), side(31000.0)]},
                {"name": "router → atunnel → actor", "median": side(6100.0), "rounds": [side(6000.0), side(6200.0)]}],
            "direct": side(30000.0), "router": side(6100.0), "ratio": 0.2, "tls_cost": null});
        check(
            "warm",
            &v,
            &[
                "Warm requests per second by path (GET /, 64 connections, 2 round(s) of 10 s)",
                "direct (in-process baseline): 30000 req/s, p50 0.41 ms, p99 1.20 ms, 0 errors",
                "router → atunnel → actor: 6100 req/s, p50 0.41 ms, p99 1.20 ms, 0 errors",
                "median of the rounds",
                "each round",
            ],
        );
        // Older results without `sides`.
        let old = json!({"kind": "warm", "direct": side(100.0), "router": side(50.0)});
        check(
            "warm",
            &old,
            &["router: 50 req/s, p50 0.41 ms, p99 1.20 ms, 0 errors"],
        );
    }

    #[test]
    fn snapshots_chart() {
        let v = json!({"kind": "snapshots", "rounds": 3, "workloads": [
            {"workload": "counter", "suspend_seconds": [0.1, 0.12, 0.11],
             "resume_local_seconds": [0.02, 0.03, 0.025], "suspend_durable_seconds": [],
             "resume_durable_seconds": []},
            {"workload": "sleeper 50 MiB", "suspend_seconds": [0.3],
             "resume_local_seconds": [0.2], "suspend_durable_seconds": [0.9],
             "resume_durable_seconds": [0.6]}]});
        check(
            "snapshots",
            &v,
            &[
                "Suspend and resume-to-first-answer",
                "counter: suspend 0.110 s",
                "counter: resume, node-local 0.025 s",
                "sleeper 50 MiB: resume from durable 0.600 s",
            ],
        );
    }

    #[test]
    fn missing_fields_are_an_error_not_a_panic() {
        for kind in ["resume", "throughput", "parking", "warm", "snapshots"] {
            assert!(svg(kind, &json!({"kind": kind})).is_err());
            assert!(svg(kind, &json!([1, 2])).is_err());
        }
        let partial = json!({"levels": [{"n": 2}, {"median_seconds": 1.0}, {"n": 4, "slowest_seconds": 0.5}]});
        check(
            "resume",
            &partial,
            &["Cold resume latency vs concurrency", "0.500 s"],
        );
        assert!(svg("nope", &json!({})).is_err());
    }
}
