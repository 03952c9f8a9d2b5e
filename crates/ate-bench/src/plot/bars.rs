//! Bar charts, one bar per row: `ate bench warm` and `ate bench snapshots`.

use anyhow::ensure;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use super::{Area, LABEL, chart_builder, legend, list, num, opt, tick, top};

/// Requests per second of each path (median of the rounds as a bar, each round as a dot).
pub(super) fn warm(root: &Area, v: &Value) -> anyhow::Result<()> {
    let mut sides: Vec<(String, &Value, &[Value])> = list(v, "sides")
        .iter()
        .filter_map(|s| {
            let name = s.get("name")?.as_str()?.to_string();
            Some((name, s.get("median")?, list(s, "rounds")))
        })
        .collect();
    if sides.is_empty() {
        // Results written before `sides` existed: the baseline and the router only.
        for key in ["direct", "router"] {
            if let Some(m) = v.get(key) {
                sides.push((key.to_string(), m, &[]));
            }
        }
    }
    sides.retain(|s| num(s.1, "rps").is_some());
    ensure!(!sides.is_empty(), "no paths with a req/s figure to plot");
    let rps = |s: &Value| num(s, "rps").unwrap_or(0.0);
    let all = sides.iter().flat_map(|s| s.2.iter().chain([s.1]).map(rps));
    let x_top = top(all, 1.45);
    let mut title = "Warm requests per second by path".to_string();
    if let Some(path) = v.get("path").and_then(Value::as_str) {
        title += &format!(" (GET {path}");
        title += &opt(v, "concurrency", |c| format!(", {c} connections"));
        title += &opt(v, "rounds", |r| format!(", {r} round(s)"));
        title += &opt(v, "seconds", |s| format!(" of {s} s"));
        title += ")";
    }
    let rows: Vec<Row> = sides
        .iter()
        .map(|(name, m, rounds)| {
            let mut text = format!("{name}: {:.0} req/s", rps(m));
            text += &opt(m, "p50_ms", |p| format!(", p50 {p:.2} ms"));
            text += &opt(m, "p99_ms", |p| format!(", p99 {p:.2} ms"));
            text += &opt(m, "errors", |e| format!(", {e} errors"));
            Row {
                text,
                median: rps(m),
                samples: rounds.iter().map(rps).collect(),
            }
        })
        .collect();
    bar_rows(
        root,
        title,
        "requests per second (keep-alive connections, 200 answers and errors)",
        x_top,
        &rows,
    )
}

/// `ate bench snapshots`: one bar per workload and figure (median of the rounds), the rounds as
/// dots.
pub(super) fn snapshots(root: &Area, v: &Value) -> anyhow::Result<()> {
    const FIGURES: [(&str, &str); 6] = [
        ("suspend_seconds", "suspend"),
        ("resume_local_seconds", "resume, node-local"),
        ("full_local_seconds", "all memory, node-local"),
        ("suspend_durable_seconds", "suspend DURABLE"),
        ("resume_durable_seconds", "resume from durable"),
        ("full_durable_seconds", "all memory from durable"),
    ];
    let mut bars: Vec<(String, Vec<f64>)> = Vec::new();
    for w in list(v, "workloads") {
        let label = w.get("workload").and_then(Value::as_str).unwrap_or("?");
        let name = match w.get("restore").and_then(Value::as_str) {
            Some(restore) => format!("{label} ({restore})"),
            None => label.to_string(),
        };
        for (key, what) in FIGURES {
            let samples: Vec<f64> = list(w, key).iter().filter_map(Value::as_f64).collect();
            if !samples.is_empty() {
                bars.push((format!("{name}: {what}"), samples));
            }
        }
    }
    ensure!(!bars.is_empty(), "no snapshot figures to plot");
    // The same median as the bench's table.
    let med = |xs: &[f64]| crate::median(&crate::sorted(xs.to_vec()));
    let x_top = top(bars.iter().flat_map(|b| b.1.iter().copied()), 1.45);
    let rows: Vec<Row> = bars
        .into_iter()
        .map(|(name, samples)| Row {
            text: format!("{name} {:.3} s", med(&samples)),
            median: med(&samples),
            samples,
        })
        .collect();
    bar_rows(
        root,
        "Suspend and resume-to-first-answer".to_string(),
        "seconds",
        x_top,
        &rows,
    )
}

/// One horizontal bar per row (its median, first row on top), each sample as a dot on it and
/// the row's text above it: the shape of the warm and snapshot charts.
struct Row {
    text: String,
    median: f64,
    samples: Vec<f64>,
}

fn bar_rows(
    root: &Area,
    title: String,
    x_desc: &str,
    x_top: f64,
    rows: &[Row],
) -> anyhow::Result<()> {
    let n = rows.len() as f64;
    let mut chart = chart_builder(root, title, 20).build_cartesian_2d(0.0..x_top, -0.6..n - 0.4)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(x_desc)
        .x_label_formatter(&tick)
        .draw()?;
    let y = |i: usize| n - 1.0 - i as f64;
    let fill = BLUE.mix(0.55).filled();
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .map(|(i, r)| Rectangle::new([(0.0, y(i) - 0.25), (r.median, y(i) + 0.15)], fill)),
        )?
        .label("median of the rounds")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], fill));
    chart
        .draw_series(rows.iter().enumerate().flat_map(|(i, r)| {
            r.samples
                .iter()
                .map(move |x| Circle::new((*x, y(i) - 0.05), 3, BLACK.filled()))
        }))?
        .label("each round")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, BLACK.filled()));
    let font = TextStyle::from(("sans-serif", LABEL + 1).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(
        rows.iter()
            .enumerate()
            .map(|(i, r)| Text::new(r.text.clone(), (0.0, y(i) + 0.32), font.clone())),
    )?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}
