//! SVG charts of `ate bench` results, drawn from the same JSON value that is written to `--out`.
//!
//! plotters with only its SVG backend: text becomes `<text>` elements that the viewer renders
//! with its own fonts (no font files are loaded here). Fields missing from the JSON are skipped.

use anyhow::{Context as _, bail, ensure};
use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

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

/// Median and slowest resume per concurrency level; x is categorical (the levels as run).
fn resume(root: &Area, v: &Value) -> anyhow::Result<()> {
    let levels: Vec<(u64, Option<f64>, Option<f64>)> = list(v, "levels")
        .iter()
        .filter_map(|l| {
            let n = l.get("n")?.as_u64()?;
            Some((n, num(l, "median_seconds"), num(l, "slowest_seconds")))
        })
        .collect();
    ensure!(!levels.is_empty(), "no levels to plot");
    let y_top = top(levels.iter().flat_map(|l| [l.1, l.2]).flatten(), 1.2);
    let mut title = "Cold resume latency vs concurrency".to_string();
    if let Some(mib) = num(v, "memory_mib") {
        title += &format!(" ({mib} MiB actors");
        title += &opt(v, "rounds", |r| format!(", {r} rounds"));
        title += ")";
    }
    let last = u32::try_from(levels.len() - 1)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", TITLE))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0..last).into_segmented(), 0.0..y_top)?;
    chart
        .configure_mesh()
        .x_desc("requests to suspended actors started at the same instant (n)")
        .y_desc("seconds from request to reply")
        .y_label_formatter(&tick)
        .x_labels(levels.len())
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => levels
                .get(*i as usize)
                .map(|l| l.0.to_string())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    // Median values written under their points, slowest ones over theirs.
    let lines = [
        (
            "median",
            BLUE,
            4,
            levels.iter().map(|l| l.1).collect::<Vec<_>>(),
        ),
        ("slowest", RED, -16, levels.iter().map(|l| l.2).collect()),
    ];
    for (name, color, dy, ys) in lines {
        let points: Vec<(SegmentValue<u32>, f64)> = (0..=last)
            .zip(&ys)
            .filter_map(|(i, y)| Some((SegmentValue::CenterOf(i), (*y)?)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        let font = ("sans-serif", LABEL).into_font().color(&color);
        chart.draw_series(PointSeries::of_element(
            points,
            4,
            color.filled(),
            &|c, s, st| {
                let text = Text::new(format!("{:.3} s", c.1), (7, dy), font.clone());
                EmptyElement::at(c) + Circle::new((0, 0), s, st) + text
            },
        ))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
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

/// Cold resumes completed in each second of the run, answers other than 200 stacked over them
/// (burst mode), and the run's mean rate.
fn throughput(root: &Area, v: &Value) -> anyhow::Result<()> {
    let counts = |key: &str| -> Vec<u64> {
        list(v, key)
            .iter()
            .map(|c| c.as_u64().unwrap_or(0))
            .collect()
    };
    let cold = counts("cold_per_second");
    ensure!(!cold.is_empty(), "no per-second counts to plot");
    let mut not_ok = counts("not_200_per_second");
    not_ok.resize(cold.len(), 0);
    let x_max = cold.len() as f64;
    let y_top = top(cold.iter().zip(&not_ok).map(|(c, b)| (c + b) as f64), 1.25);
    let burst = v.get("mode").and_then(Value::as_str) == Some("burst");
    let bad: u64 = not_ok.iter().sum();
    let mut title = "Cold resumes completed per second".to_string();
    if let Some(c) = num(v, "concurrency") {
        if burst {
            title += &opt(v, "actors", |a| {
                format!(" (one request to each of {a} actors")
            });
            title += &format!(", up to {c} in flight");
        } else {
            title += &format!(" ({c} requests in flight");
            title += &opt(v, "actors", |a| format!(", {a} actors"));
        }
        title += &opt(v, "seconds", |s| format!(", {s:.1} s run"));
        title += ")";
    }
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", TITLE))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_top)?;
    chart
        .configure_mesh()
        .x_desc(if burst {
            "seconds since the first request was sent"
        } else {
            "seconds since the start of the run"
        })
        .y_desc(if bad > 0 {
            "answers in that second"
        } else {
            "cold resumes answered 200 in that second"
        })
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    let mut bars = "resumes in that second".to_string();
    bars += &opt(v, "cold_resumes", |n| format!(" ({n} in all"));
    bars += &opt(v, "p50_seconds", |s| format!(", p50 {s:.3} s"));
    bars += &opt(v, "p99_seconds", |s| format!(", p99 {s:.3} s"));
    if num(v, "cold_resumes").is_some() {
        bars += ")";
    }
    let fill = BLUE.mix(0.6).filled();
    chart
        .draw_series(cold.iter().enumerate().map(|(i, &c)| {
            Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, c as f64)], fill)
        }))?
        .label(bars)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], fill));
    if bad > 0 {
        let red = RED.mix(0.6).filled();
        chart
            .draw_series(
                cold.iter()
                    .zip(&not_ok)
                    .enumerate()
                    .filter(|p| *p.1.1 > 0)
                    .map(|(i, (&c, &b))| {
                        let x = i as f64;
                        Rectangle::new([(x + 0.1, c as f64), (x + 0.9, (c + b) as f64)], red)
                    }),
            )?
            .label(format!("answers other than 200 ({bad} in all)"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], red));
    }
    // A count over each bar while they are wide enough to hold one.
    if cold.len() <= 60 {
        chart.draw_series(cold.iter().enumerate().filter(|p| *p.1 > 0).map(|(i, &c)| {
            Text::new(
                c.to_string(),
                (i as f64 + 0.5, c as f64 + not_ok[i] as f64),
                TextStyle::from(("sans-serif", LABEL).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))?;
    }
    if let Some(rate) = num(v, "resumes_per_second") {
        let style = ORANGE.stroke_width(2);
        chart
            .draw_series(LineSeries::new([(0.0, rate), (x_max, rate)], style))?
            .label(format!("mean {rate:.1} resumes/s"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// Seconds since the Unix epoch of a `2026-11-12T11:32:40.522Z` time (as `bench` writes them).
fn epoch_seconds(s: &str) -> Option<f64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.splitn(3, ':').map(str::parse::<f64>);
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days since 1970-01-01 of a civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// Latency of each request of the load run against its start time, one colour per status; the
/// scripted timeline's replies (labelled with their event) when there was no load run.
fn parking(root: &Area, v: &Value) -> anyhow::Result<()> {
    let load = v.get("load").unwrap_or(&Value::Null);
    let from_load = !list(load, "requests").is_empty();
    // (start, seconds, status, label)
    let replies: Vec<(f64, f64, u64, Option<&str>)> = if from_load {
        list(load, "requests").iter().map(|r| (r, None)).collect()
    } else {
        let timeline = list(v, "timeline").iter();
        timeline
            .filter_map(|e| Some((e.get("reply")?, e.get("event")?.as_str())))
            .collect::<Vec<_>>()
    }
    .into_iter()
    .filter_map(|(r, label)| {
        let start = epoch_seconds(r.get("start")?.as_str()?)?;
        Some((start, num(r, "seconds")?, r.get("status")?.as_u64()?, label))
    })
    .collect();
    ensure!(!replies.is_empty(), "no requests to plot");
    let t0 = replies.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
    let x_top = top(replies.iter().map(|r| r.0 - t0 + r.1), 1.05);
    let y_top = top(replies.iter().map(|r| r.1), 1.2);
    let title = match num(load, "seconds") {
        Some(s) if from_load => format!("Parking: latency of each request of the {s} s load run"),
        _ => "Parking: latency of each scripted request".to_string(),
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", TITLE))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_top, 0.0..y_top)?;
    chart
        .configure_mesh()
        .x_desc("request start, seconds since the first request")
        .y_desc("seconds from request to reply")
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    // `None`: any status but 200 and 503.
    let groups = [
        ("200 OK", DARK_GREEN, Some(200)),
        ("503 unavailable", RED, Some(503)),
        ("other status", GREY, None),
    ];
    for (name, color, status) in groups {
        let mine: Vec<_> = replies
            .iter()
            .filter(|r| status.map_or(r.2 != 200 && r.2 != 503, |s| r.2 == s))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let points = mine.iter().map(|r| (r.0 - t0, r.1));
        chart
            .draw_series(PointSeries::of_element(
                points,
                4,
                color.filled(),
                &|c, s, st| EmptyElement::at(c) + Circle::new((0, 0), s, st),
            ))?
            .label(format!("{name} ({})", mine.len()))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        chart.draw_series(mine.iter().filter_map(|r| {
            let text = format!("{} {} ({:.3} s)", r.3?, r.2, r.1);
            let font = ("sans-serif", LABEL).into_font().color(&color);
            Some(EmptyElement::at((r.0 - t0, r.1)) + Text::new(text, (7, -16), font))
        }))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// Requests per second of each path (median of the rounds as a bar, each round as a dot).
fn warm(root: &Area, v: &Value) -> anyhow::Result<()> {
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
fn snapshots(root: &Area, v: &Value) -> anyhow::Result<()> {
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
    let med = |xs: &[f64]| crate::bench::median(&crate::bench::sorted(xs.to_vec()));
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
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", TITLE))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(20)
        .build_cartesian_2d(0.0..x_top, -0.6..n - 0.4)?;
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

    #[test]
    fn epoch() {
        let t = epoch_seconds("2026-11-12T11:32:40.522Z").unwrap();
        assert!((t - 1_794_483_160.522).abs() < 1e-6, "{t}");
        assert_eq!(epoch_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(epoch_seconds("2026-11-12 11:32"), None);
    }
}
