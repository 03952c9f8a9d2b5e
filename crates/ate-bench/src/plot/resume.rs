//! The chart of `ate bench resume`.

use anyhow::ensure;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use serde_json::Value;

use super::{Area, LABEL, chart_builder, legend, list, num, opt, tick, top};

/// Median and slowest resume per concurrency level; x is categorical (the levels as run).
pub(super) fn resume(root: &Area, v: &Value) -> anyhow::Result<()> {
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
    let mut chart = chart_builder(root, title, 70)
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
