//! Scaling curves, such as throughput against message size, publishers, topics or subscriptions,
//! or resident memory against topics, as an SVG line chart written by hand, and the same points
//! as a Markdown table.
//!
//! The chart shows the shape: where a curve bends, and how far it stays under a ceiling such as
//! the disk's write-and-fdatasync rate. The table carries the exact figures for a report or a
//! review that quotes them. As in [`super::plot`], the SVG is written by hand, because a plotting
//! crate would be the largest dependency of the tools for a few hundred lines of markup.
//! Everything here is pure: the caller decides where the documents go.

use super::format::thousands;
use super::plot::{
    escape, legend_swatch, round_step, HEIGHT_PX, LEGEND_ROW_HEIGHT_PX, MARGIN_BOTTOM_PX, MARGIN_LEFT_PX,
    MARGIN_RIGHT_PX, MARGIN_TOP_PX, WIDTH_PX,
};

/// One line of a chart: (x, y) points in x order.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A horizontal reference line (a ceiling such as "disk 1 MiB write+fdatasync" or "loopback
/// TCP"), drawn dashed and labelled.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceiling {
    pub name: String,
    pub y: f64,
}

/// A line chart: its labels, the scale of each axis, the lines and the ceilings.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    /// Such as "message size (bytes)"; also the header of the first column of the table.
    pub x_label: String,
    /// Such as "MB/s".
    pub y_label: String,
    /// A log10 x axis, for sizes and counts that span decades.
    pub x_log: bool,
    /// A log10 y axis.
    pub y_log: bool,
    pub lines: Vec<Line>,
    pub ceilings: Vec<Ceiling>,
}

const POINT_RADIUS_PX: f64 = 3.0;
/// Ceiling labels this close to the top of the plot go below their line, so they stay inside
/// the frame rather than run into the legend.
const CEILING_LABEL_HEIGHT_PX: f64 = 16.0;
/// About this many steps on a linear axis: enough to read a value off, and few enough that
/// labels such as `1,250,000` stay apart.
const LINEAR_TICKS_TARGET: f64 = 6.0;
/// A log axis spanning more decades than this labels every second (or third...) power of ten,
/// so the labels stay apart.
const LOG_TICKS_MAX: f64 = 10.0;
/// Data spanning fewer decades than this also gets ticks at 2x and 5x each power of ten,
/// because one or two labelled powers of ten are too few to read a value off.
const LOG_DECADES_FOR_MINOR_TICKS: f64 = 2.0;
/// A log axis shows at least one decade, so it always holds a power of ten to label, even for a
/// single point.
const LOG_DECADES_MIN: f64 = 1.0;
/// On a log x axis the first and last points sit just inside the frame, so their circles are
/// whole, without spending width on sizes nobody measured.
const LOG_PADDING_X_DECADES: f64 = 0.1;
/// On a log y axis half a decade above and below keeps the highest and lowest points and
/// ceilings clear of the frame and of each other's labels.
const LOG_PADDING_Y_DECADES: f64 = 0.5;
/// The first four are those of [`super::plot`], so the first lines keep their colors between
/// the two figures; gray is left out because it marks ceilings. More lines cycle.
const COLORS: [&str; 9] =
    ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#17becf"];
const CEILING_COLOR: &str = "#888888";
const GRID_COLOR: &str = "#dddddd";

/// `value` with at most `decimals` decimals and no trailing zeros: `0.25`, `1.5`, `3`.
fn trimmed(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// A tick label: `100`, `1,000`, `100,000`, then `1M`, `1.25M`, `10M` and `1G`, so the labels
/// of a log axis reaching into the millions stay short enough not to collide; below 1, as many
/// decimals as the tick needs (`0.2`, `0.01`).
fn tick_label(value: f64) -> String {
    let sign = if value < 0.0 { "-" } else { "" };
    let magnitude = value.abs();
    for (unit, suffix) in [(1e9, "G"), (1e6, "M")] {
        if magnitude >= unit {
            return format!("{sign}{}{suffix}", trimmed(magnitude / unit, 3));
        }
    }
    if magnitude.fract() == 0.0 {
        format!("{sign}{}", thousands(magnitude as u64))
    } else {
        format!("{sign}{}", trimmed(magnitude, 6))
    }
}

/// A measured value for people: `1,234,567` for whole numbers, otherwise rounded to one decimal
/// (`12.3`, `1,024.5`), because a table of throughputs is read by order of magnitude first.
fn value_label(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    // The cast saturates, so absurd magnitudes print as the largest u64 rather than panic.
    let tenths = (value.abs() * 10.0).round() as u64;
    let sign = if value < 0.0 && tenths > 0 { "-" } else { "" };
    let whole = thousands(tenths / 10);
    match tenths % 10 {
        0 => format!("{sign}{whole}"),
        tenth => format!("{sign}{whole}.{tenth}"),
    }
}

/// Whether `value` has a place on an axis: it must be finite, and positive on a log axis.
fn fits(value: f64, log: bool) -> bool {
    value.is_finite() && (!log || value > 0.0)
}

/// How values map onto one axis: the range drawn, in scale units (the log10 of the value on a
/// log axis), and the values at which ticks are drawn and labelled.
struct Axis {
    log: bool,
    low: f64,
    high: f64,
    ticks: Vec<f64>,
}

impl Axis {
    /// The axis for `values`, which must all fit it and not be empty. A linear axis starts at 0
    /// (or below, for negative values) so that heights compare as ratios; a log axis is padded
    /// by `log_padding_decades` at both ends.
    fn new(log: bool, values: &[f64], log_padding_decades: f64) -> Axis {
        if log {
            Axis::log(values, log_padding_decades)
        } else {
            Axis::linear(values)
        }
    }

    fn linear(values: &[f64]) -> Axis {
        let low = values.iter().copied().fold(0.0, f64::min);
        let high = values.iter().copied().fold(0.0, f64::max);
        // All zero: show 0 to 1 rather than divide by an empty range.
        let high = if high > low { high } else { low + 1.0 };
        let step = round_step(high - low, LINEAR_TICKS_TARGET);
        let first = (low / step).floor() as i64;
        let last = (high / step).ceil() as i64;
        // Ticks as multiples of the step, not a running sum, so 0.6 is not 0.6000000000000001.
        let ticks = (first..=last).map(|index| index as f64 * step).collect();
        Axis { log: false, low: first as f64 * step, high: last as f64 * step, ticks }
    }

    fn log(values: &[f64], padding_decades: f64) -> Axis {
        let data_low = values.iter().map(|value| value.log10()).fold(f64::INFINITY, f64::min);
        let data_high = values.iter().map(|value| value.log10()).fold(f64::NEG_INFINITY, f64::max);
        let data_decades = data_high - data_low;
        let padding_decades = padding_decades.max((LOG_DECADES_MIN - data_decades) / 2.0);
        let low = data_low - padding_decades;
        let high = data_high + padding_decades;
        let factors: &[f64] =
            if data_decades < LOG_DECADES_FOR_MINOR_TICKS { &[1.0, 2.0, 5.0] } else { &[1.0] };
        let decade_step = ((high - low) / LOG_TICKS_MAX).ceil().max(1.0) as i32;
        // A little slack, so a tick exactly at an end is not lost to rounding in log10.
        let slack = 1e-9;
        let mut ticks = Vec::new();
        for decade in (low.floor() as i32)..=(high.ceil() as i32) {
            if decade.rem_euclid(decade_step) != 0 {
                continue;
            }
            for factor in factors {
                let tick = factor * 10f64.powi(decade);
                if (low - slack..=high + slack).contains(&tick.log10()) {
                    ticks.push(tick);
                }
            }
        }
        Axis { log: true, low, high, ticks }
    }

    /// How far along the axis `value` lies, from 0 at the low end to 1 at the high end.
    fn fraction(&self, value: f64) -> f64 {
        let scaled = if self.log { value.log10() } else { value };
        (scaled - self.low) / (self.high - self.low)
    }
}

/// The opening of the document: the root element, a white background and the title.
fn open(title: &str, height_px: f64) -> String {
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH_PX}\" height=\"{height_px:.1}\" viewBox=\"0 0 {WIDTH_PX} {height_px:.1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    out.push_str(&format!(
        "<rect x=\"0\" y=\"0\" width=\"{WIDTH_PX}\" height=\"{height_px:.1}\" fill=\"white\"/>\n"
    ));
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
        WIDTH_PX / 2.0,
        escape(title)
    ));
    out
}

/// The SVG document for `chart`. Points that have no place on an axis (not finite, or not
/// positive on a log axis) are left out, and the legend says how many, so a gap in a curve is
/// not mistaken for a measurement; a chart with nothing to draw says "no data".
pub fn svg(chart: &Chart) -> String {
    let drawn: Vec<Vec<(f64, f64)>> = chart
        .lines
        .iter()
        .map(|line| {
            let mut points: Vec<(f64, f64)> = line
                .points
                .iter()
                .copied()
                .filter(|(x, y)| fits(*x, chart.x_log) && fits(*y, chart.y_log))
                .collect();
            // Drawn left to right whatever order the caller measured in.
            points.sort_by(|left, right| left.0.total_cmp(&right.0));
            points
        })
        .collect();
    let ceilings: Vec<&Ceiling> =
        chart.ceilings.iter().filter(|ceiling| fits(ceiling.y, chart.y_log)).collect();
    let xs: Vec<f64> = drawn.iter().flatten().map(|(x, _)| *x).collect();
    let plot_width_px = WIDTH_PX - MARGIN_LEFT_PX - MARGIN_RIGHT_PX;
    let plot_height_px = HEIGHT_PX - MARGIN_TOP_PX - MARGIN_BOTTOM_PX;
    if xs.is_empty() {
        let mut out = open(&chart.title, HEIGHT_PX);
        out.push_str(&format!(
            "<rect x=\"{MARGIN_LEFT_PX}\" y=\"{MARGIN_TOP_PX}\" width=\"{plot_width_px:.1}\" height=\"{plot_height_px:.1}\" fill=\"none\" stroke=\"#333333\"/>\n"
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no data</text>\n",
            MARGIN_LEFT_PX + plot_width_px / 2.0,
            MARGIN_TOP_PX + plot_height_px / 2.0
        ));
        out.push_str("</svg>\n");
        return out;
    }
    let ys: Vec<f64> =
        drawn.iter().flatten().map(|(_, y)| *y).chain(ceilings.iter().map(|ceiling| ceiling.y)).collect();
    let x_axis = Axis::new(chart.x_log, &xs, LOG_PADDING_X_DECADES);
    let y_axis = Axis::new(chart.y_log, &ys, LOG_PADDING_Y_DECADES);
    let legend_height_px = LEGEND_ROW_HEIGHT_PX * chart.lines.len() as f64;
    let height_px = HEIGHT_PX + legend_height_px;
    let top_px = MARGIN_TOP_PX + legend_height_px;
    let bottom_px = top_px + plot_height_px;
    let right_px = MARGIN_LEFT_PX + plot_width_px;
    let x_of = |x: f64| MARGIN_LEFT_PX + plot_width_px * x_axis.fraction(x);
    let y_of = |y: f64| top_px + plot_height_px * (1.0 - y_axis.fraction(y));

    let mut out = open(&chart.title, height_px);
    // Grid and tick labels.
    for tick in &x_axis.ticks {
        let x = x_of(*tick);
        out.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{top_px:.1}\" x2=\"{x:.1}\" y2=\"{bottom_px:.1}\" stroke=\"{GRID_COLOR}\"/>\n"
        ));
        out.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            bottom_px + 18.0,
            tick_label(*tick)
        ));
    }
    for tick in &y_axis.ticks {
        let y = y_of(*tick);
        out.push_str(&format!(
            "<line x1=\"{MARGIN_LEFT_PX}\" y1=\"{y:.1}\" x2=\"{right_px:.1}\" y2=\"{y:.1}\" stroke=\"{GRID_COLOR}\"/>\n"
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            MARGIN_LEFT_PX - 8.0,
            y + 4.0,
            tick_label(*tick)
        ));
    }
    out.push_str(&format!(
        "<rect x=\"{MARGIN_LEFT_PX}\" y=\"{top_px:.1}\" width=\"{plot_width_px:.1}\" height=\"{plot_height_px:.1}\" fill=\"none\" stroke=\"#333333\"/>\n"
    ));
    let scale_note = |log: bool| if log { " (log scale)" } else { "" };
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}{}</text>\n",
        MARGIN_LEFT_PX + plot_width_px / 2.0,
        height_px - 20.0,
        escape(&chart.x_label),
        scale_note(chart.x_log)
    ));
    let middle_px = top_px + plot_height_px / 2.0;
    out.push_str(&format!(
        "<text x=\"20\" y=\"{middle_px:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {middle_px:.1})\">{}{}</text>\n",
        escape(&chart.y_label),
        scale_note(chart.y_log)
    ));
    // Ceilings under the lines, so a curve that reaches its ceiling stays visible.
    for ceiling in &ceilings {
        let y = y_of(ceiling.y);
        out.push_str(&format!(
            "<line x1=\"{MARGIN_LEFT_PX}\" y1=\"{y:.1}\" x2=\"{right_px:.1}\" y2=\"{y:.1}\" stroke=\"{CEILING_COLOR}\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n"
        ));
        let label_y = if y - top_px < CEILING_LABEL_HEIGHT_PX { y + 14.0 } else { y - 4.0 };
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{label_y:.1}\" text-anchor=\"end\" font-size=\"11\" fill=\"{CEILING_COLOR}\">{}: {}</text>\n",
            right_px - 4.0,
            escape(&ceiling.name),
            value_label(ceiling.y)
        ));
    }
    // One polyline per line with a circle per point, and its legend entry.
    for (index, (line, points)) in chart.lines.iter().zip(&drawn).enumerate() {
        let color = COLORS[index % COLORS.len()];
        if !points.is_empty() {
            let path: Vec<String> =
                points.iter().map(|(x, y)| format!("{:.1},{:.1}", x_of(*x), y_of(*y))).collect();
            out.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
                path.join(" ")
            ));
        }
        for (x, y) in points {
            out.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"{POINT_RADIUS_PX}\" fill=\"{color}\"><title>{}: {}, {}</title></circle>\n",
                x_of(*x),
                y_of(*y),
                escape(&line.name),
                value_label(*x),
                value_label(*y)
            ));
        }
        let legend_y = MARGIN_TOP_PX + LEGEND_ROW_HEIGHT_PX * index as f64;
        out.push_str(&legend_swatch(color, legend_y));
        let skipped = line.points.len() - points.len();
        let note = if skipped > 0 {
            format!(" ({} points not drawn)", thousands(skipped as u64))
        } else {
            String::new()
        };
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{legend_y:.1}\" font-size=\"11\">{}{note}</text>\n",
            MARGIN_LEFT_PX + 42.0,
            escape(&line.name)
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// A Markdown table cell: pipes escaped so a name cannot split a row.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The points of `chart` as a Markdown table: the x values (the union over all lines, sorted)
/// down the first column and one column per line, with "-" where a line has no point at that x.
/// Ceilings are not in it: they are context for the chart, not measurements. Points with a
/// non-finite x have no row to go in and are left out.
pub fn markdown_table(chart: &Chart) -> String {
    let mut xs: Vec<f64> = chart
        .lines
        .iter()
        .flat_map(|line| line.points.iter().map(|(x, _)| *x))
        .filter(|x| x.is_finite())
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let mut out = format!("| {} |", cell(&chart.x_label));
    for line in &chart.lines {
        out.push_str(&format!(" {} |", cell(&line.name)));
    }
    out.push_str("\n|");
    // Right-aligned, so digit groups line up.
    out.push_str(&"---:|".repeat(chart.lines.len() + 1));
    out.push('\n');
    for x in xs {
        out.push_str(&format!("| {} |", value_label(x)));
        for line in &chart.lines {
            let value = line.points.iter().find(|(point_x, _)| *point_x == x).map(|(_, y)| value_label(*y));
            out.push_str(&format!(" {} |", value.as_deref().unwrap_or("-")));
        }
        out.push('\n');
    }
    out
}

/// One line per `(field, name)` of `y_fields`, with a point per run that has numbers at both
/// `x_field` and the line's field (dotted paths, as `compare` shows them). A run without them
/// (a failed point, another workload) is left out, with a note saying so.
pub fn lines_from_runs(
    runs: &[super::compare::Run],
    x_field: &str,
    y_fields: &[(&str, &str)],
) -> (Vec<Line>, Vec<String>) {
    let number = |run: &super::compare::Run, path: &str| {
        run.fields.iter().find(|(field, _)| field == path).and_then(|(_, value)| match value {
            crate::json::Value::Number(number) => Some(*number),
            _ => None,
        })
    };
    let mut notes = Vec::new();
    let lines = y_fields
        .iter()
        .map(|(field, name)| {
            let mut points = Vec::new();
            for run in runs {
                match (number(run, x_field), number(run, field)) {
                    (Some(x), Some(y)) => points.push((x, y)),
                    _ => notes
                        .push(format!("{} has no number at '{x_field}' or '{field}'; left out", run.name)),
                }
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Line { name: (*name).to_owned(), points }
        })
        .collect();
    (lines, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, points: &[(f64, f64)]) -> Line {
        Line { name: name.to_owned(), points: points.to_vec() }
    }

    fn chart(x_log: bool, y_log: bool, lines: Vec<Line>, ceilings: Vec<Ceiling>) -> Chart {
        Chart {
            title: "msgs/s by size <test> & more".to_owned(),
            x_label: "message size (bytes)".to_owned(),
            y_label: "MB/s".to_owned(),
            x_log,
            y_log,
            lines,
            ceilings,
        }
    }

    /// Sizes 64 B to 1 MiB by factors of 4, as `ringpost-bench` measures them.
    fn sizes() -> Vec<f64> {
        (0..=7).map(|power| 64.0 * 4f64.powi(power)).collect()
    }

    /// The text of every `<text>` element, tick labels among them.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|rest| {
                let start = rest.find('>')? + 1;
                let end = rest.find("</text>")?;
                Some(rest[start..end].to_owned())
            })
            .collect()
    }

    #[test]
    fn two_lines_and_a_ceiling() {
        let sizes = sizes();
        let publish = line("publish", &sizes.iter().map(|size| (*size, size / 100.0)).collect::<Vec<_>>());
        let e2e = line("e2e", &sizes.iter().map(|size| (*size, size / 200.0)).collect::<Vec<_>>());
        let disk = Ceiling { name: "disk 1 MiB write+fdatasync".to_owned(), y: 20_000.0 };
        let svg = svg(&chart(true, true, vec![publish, e2e], vec![disk]));
        assert!(svg.starts_with("<svg"));
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 16);
        assert!(svg.contains(">publish</text>"));
        assert!(svg.contains(">e2e</text>"));
        assert!(svg.contains(">disk 1 MiB write+fdatasync: 20,000</text>"));
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.contains("msgs/s by size &lt;test&gt; &amp; more"));
        assert!(svg.contains("message size (bytes) (log scale)"));
        // Two colors, one per line.
        assert!(svg.contains(&format!("stroke=\"{}\"", COLORS[0])));
        assert!(svg.contains(&format!("stroke=\"{}\"", COLORS[1])));
    }

    #[test]
    fn attribute_numbers_have_at_most_one_decimal() {
        let sizes = sizes();
        let points: Vec<(f64, f64)> = sizes.iter().map(|size| (*size, 1.0 / 3.0 * size)).collect();
        for (x_log, y_log) in [(true, true), (true, false), (false, false)] {
            let svg = svg(&chart(
                x_log,
                y_log,
                vec![line("a", &points)],
                vec![Ceiling { name: "c".to_owned(), y: 123_456.789 }],
            ));
            // Attribute values are the odd pieces between quotes; text never holds a raw quote.
            for value in svg.split('"').skip(1).step_by(2) {
                for number in value.split(|c: char| !(c.is_ascii_digit() || c == '.')) {
                    let decimals = number.split_once('.').map_or(0, |(_, decimals)| decimals.len());
                    assert!(decimals <= 1, "{number} in \"{value}\"");
                }
            }
        }
    }

    #[test]
    fn log_ticks_are_powers_of_ten() {
        let svg = svg(&chart(
            true,
            false,
            vec![line("publish", &sizes().iter().map(|size| (*size, 1.0)).collect::<Vec<_>>())],
            vec![],
        ));
        let labels = texts(&svg);
        for label in ["100", "1,000", "10,000", "100,000", "1M"] {
            assert!(labels.iter().any(|text| text == label), "{label} missing from {labels:?}");
        }
        // More than two decades: no 2x and 5x ticks.
        assert!(!labels.iter().any(|text| text == "500"));

        let axis = Axis::new(true, &[20.0, 600.0], LOG_PADDING_Y_DECADES);
        assert_eq!(axis.ticks, [10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]);
        // A single point still gets a power of ten to label.
        let axis = Axis::new(true, &[64.0], LOG_PADDING_X_DECADES);
        assert!(axis.ticks.contains(&50.0) && axis.ticks.contains(&100.0), "{:?}", axis.ticks);
        // Many decades: every second power of ten.
        let axis = Axis::new(true, &[1.0, 1e15], LOG_PADDING_X_DECADES);
        assert_eq!(axis.ticks.len(), 8);
    }

    #[test]
    fn linear_axes_start_at_zero_and_include_ceilings() {
        let axis = Axis::new(false, &[250.0, 900.0, 1_100.0], LOG_PADDING_Y_DECADES);
        assert_eq!(axis.low, 0.0);
        assert_eq!(axis.high, 1_200.0);
        assert_eq!(axis.ticks, [0.0, 200.0, 400.0, 600.0, 800.0, 1_000.0, 1_200.0]);
        let axis = Axis::new(false, &[0.1, 0.25], LOG_PADDING_Y_DECADES);
        assert_eq!(
            axis.ticks.iter().map(|tick| tick_label(*tick)).collect::<Vec<_>>(),
            ["0", "0.05", "0.1", "0.15", "0.2", "0.25"]
        );
        let axis = Axis::new(false, &[0.0], LOG_PADDING_Y_DECADES);
        assert_eq!((axis.low, axis.high), (0.0, 1.0));

        let svg = svg(&chart(
            false,
            false,
            vec![line("a", &[(1.0, 100.0), (2.0, 150.0)])],
            vec![Ceiling { name: "loopback TCP".to_owned(), y: 950.0 }],
        ));
        let labels = texts(&svg);
        assert!(labels.iter().any(|text| text == "1,000"), "{labels:?}");
        assert!(labels.iter().any(|text| text == "loopback TCP: 950"), "{labels:?}");
    }

    #[test]
    fn ticks_and_values_are_labelled_compactly() {
        assert_eq!(round_step(1000.0, 5.0), 200.0);
        assert_eq!(round_step(0.25, 5.0), 0.05);
        assert_eq!(round_step(0.0, 5.0), 1.0);
        assert_eq!(tick_label(64.0), "64");
        assert_eq!(tick_label(100_000.0), "100,000");
        assert_eq!(tick_label(1e6), "1M");
        assert_eq!(tick_label(1_250_000.0), "1.25M");
        assert_eq!(tick_label(1e10), "10G");
        assert_eq!(tick_label(0.01), "0.01");
        assert_eq!(tick_label(-200.0), "-200");
        assert_eq!(value_label(245_112.0), "245,112");
        assert_eq!(value_label(1_024.46), "1,024.5");
        assert_eq!(value_label(999.96), "1,000");
        assert_eq!(value_label(12.34), "12.3");
        assert_eq!(value_label(-0.04), "0");
        assert_eq!(value_label(-2.5), "-2.5");
    }

    #[test]
    fn points_off_a_log_axis_are_skipped() {
        let lines =
            vec![line("publish", &[(0.0, 5.0), (64.0, 10.0), (256.0, 0.0), (1024.0, -3.0), (4096.0, 40.0)])];
        let svg = svg(&chart(true, true, lines, vec![Ceiling { name: "nothing".to_owned(), y: 0.0 }]));
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains(">publish (3 points not drawn)</text>"));
        assert!(!svg.contains("nothing: 0"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn no_point_on_a_log_axis_is_no_data() {
        let svg = svg(&chart(true, true, vec![line("publish", &[(0.0, 5.0), (64.0, -1.0)])], vec![]));
        assert!(svg.contains(">no data</text>"));
    }

    #[test]
    fn empty_charts_say_no_data() {
        for lines in [vec![], vec![line("publish", &[])]] {
            let svg = svg(&chart(false, true, lines, vec![Ceiling { name: "disk".to_owned(), y: 100.0 }]));
            assert!(svg.starts_with("<svg"));
            assert!(svg.ends_with("</svg>\n"));
            assert!(svg.contains(">no data</text>"));
            assert!(svg.contains("msgs/s by size &lt;test&gt; &amp; more"));
            assert_eq!(svg.matches("<polyline").count(), 0);
        }
    }

    #[test]
    fn table_has_the_union_of_x_values() {
        let table = markdown_table(&chart(
            true,
            false,
            vec![
                line("publish", &[(64.0, 245_112.0), (4096.0, 120_000.5), (1_048_576.0, 950.24)]),
                line("e2e | p99", &[(64.0, 1.04), (65_536.0, 3_000.0)]),
            ],
            vec![Ceiling { name: "disk".to_owned(), y: 100.0 }],
        ));
        assert_eq!(
            table,
            "| message size (bytes) | publish | e2e \\| p99 |\n\
             |---:|---:|---:|\n\
             | 64 | 245,112 | 1 |\n\
             | 4,096 | 120,000.5 | - |\n\
             | 65,536 | - | 3,000 |\n\
             | 1,048,576 | 950.2 | - |\n"
        );
        assert!(!table.contains("disk"));
        assert_eq!(
            markdown_table(&chart(false, false, vec![], vec![])),
            "| message size (bytes) |\n|---:|\n"
        );
    }

    #[test]
    fn lines_from_result_files() {
        let run = |name: &str, text: &str| super::super::compare::Run {
            name: name.to_owned(),
            fields: crate::json::parse(text).unwrap().flatten(),
        };
        let runs = [
            run("b.json", r#"{"size":1024,"msgs_per_sec":500.0,"publish_ack_us":{"p99":70}}"#),
            run("a.json", r#"{"size":64,"msgs_per_sec":900.0,"publish_ack_us":{"p99":50}}"#),
            run("failed.json", r#"{"size":4096,"errors":3}"#),
        ];
        let (lines, notes) =
            lines_from_runs(&runs, "size", &[("msgs_per_sec", "msgs/s"), ("publish_ack_us.p99", "p99")]);
        assert_eq!(lines[0].name, "msgs/s");
        assert_eq!(lines[0].points, vec![(64.0, 900.0), (1024.0, 500.0)], "sorted by x");
        assert_eq!(lines[1].points, vec![(64.0, 50.0), (1024.0, 70.0)], "dotted paths");
        assert_eq!(notes.len(), 2, "the failed run is left out of both lines: {notes:?}");
        assert!(notes[0].contains("failed.json"));
    }
}
