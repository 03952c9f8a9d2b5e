//! Charts of a load run over time: `ate bench throughput` and `ate bench parking`.

use anyhow::ensure;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use super::{
    Area, DARK_GREEN, GREY, LABEL, ORANGE, chart_builder, legend, list, num, opt, tick, top,
};

/// Cold resumes completed in each second of the run, answers other than 200 stacked over them
/// (burst mode), and the run's mean rate.
pub(super) fn throughput(root: &Area, v: &Value) -> anyhow::Result<()> {
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
    let mut chart = chart_builder(root, title, 60).build_cartesian_2d(0.0..x_max, 0.0..y_top)?;
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
pub(super) fn parking(root: &Area, v: &Value) -> anyhow::Result<()> {
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
    let mut chart = chart_builder(root, title, 60).build_cartesian_2d(0.0..x_top, 0.0..y_top)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch() {
        let t = epoch_seconds("2026-11-12T11:32:40.522Z").unwrap();
        assert!((t - 1_794_483_160.522).abs() < 1e-6, "{t}");
        assert_eq!(epoch_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(epoch_seconds("2026-11-12 11:32"), None);
    }
}
