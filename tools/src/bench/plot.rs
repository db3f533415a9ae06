//! The latency distribution as an HdrHistogram-style percentile plot, written as SVG by hand.
//!
//! The x axis is the percentile on a log scale of 1/(1-p), so 90%, 99%, 99.9% and 99.99% are
//! evenly spaced and the tail, where the trouble is, gets most of the width; the y axis is the
//! latency in microseconds, linear. A plotting crate would be the largest dependency of the
//! tools for a few dozen lines of markup.

use super::format::thousands;
use hdrhistogram::Histogram;

/// One line of the plot.
pub struct Series<'a> {
    pub name: &'a str,
    pub latency_us: &'a Histogram<u64>,
}

// The frame of every chart the tools draw (this plot and the scaling curves of `super::curve`).
pub(super) const WIDTH_PX: f64 = 820.0;
/// The height without the legend's rows, which a scaling curve adds above its plot.
pub(super) const HEIGHT_PX: f64 = 500.0;
/// Room for y tick labels such as `100,000` and for the rotated y axis label.
pub(super) const MARGIN_LEFT_PX: f64 = 90.0;
pub(super) const MARGIN_RIGHT_PX: f64 = 30.0;
/// Above the plot: the title, then one legend row per line.
pub(super) const MARGIN_TOP_PX: f64 = 50.0;
pub(super) const LEGEND_ROW_HEIGHT_PX: f64 = 18.0;
/// Below the plot: the x tick labels, then the x axis label.
pub(super) const MARGIN_BOTTOM_PX: f64 = 70.0;
/// Decades of 1/(1-p) always shown: 0, 90, 99, 99.9 and 99.99%, whatever the sample count.
const DECADES_MIN: u32 = 4;
/// A million samples reach 99.9999%; more decades than that would be empty.
const DECADES_MAX: u32 = 6;
/// Quantile iteration steps per halving of the distance to 100%: enough points for a smooth
/// curve far into the tail.
const TICKS_PER_HALF_DISTANCE: u32 = 10;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// The short line in a chart's legend, in a line's colour, left of its label at `legend_y`.
pub(super) fn legend_swatch(color: &str, legend_y: f64) -> String {
    format!(
        "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"3\"/>\n",
        MARGIN_LEFT_PX + 12.0,
        legend_y - 4.0,
        MARGIN_LEFT_PX + 36.0,
        legend_y - 4.0
    )
}

/// Text content and attribute values with the five XML special characters escaped.
pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A round step for about `target` ticks over `span`: 1, 2 or 5 times a power of ten, below 1
/// too (the scaling curves may be of small fractions); 1 for an empty or broken span.
pub(super) fn round_step(span: f64, target: f64) -> f64 {
    let raw = span / target;
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|factor| factor * power)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * power)
}

/// A round step for about `target` ticks up to `maximum` microseconds: at least 1.
fn tick_step(maximum: f64, target: f64) -> f64 {
    round_step(maximum, target).max(1.0)
}

/// `99.99%` for decade 4 of 1/(1-p).
fn percentile_label(decade: u32) -> String {
    match decade {
        0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        2 => "99%".to_owned(),
        decade => format!("99.{}%", "9".repeat(decade as usize - 2)),
    }
}

/// The SVG document for `series` (empty histograms are left out), under `title`.
pub fn svg(title: &str, series: &[Series]) -> String {
    let drawn: Vec<&Series> = series.iter().filter(|series| !series.latency_us.is_empty()).collect();
    let samples_max = drawn.iter().map(|series| series.latency_us.len()).max().unwrap_or(1).max(1);
    let decades = ((samples_max as f64).log10().ceil() as u32).clamp(DECADES_MIN, DECADES_MAX);
    let latency_max = drawn.iter().map(|series| series.latency_us.max()).max().unwrap_or(1).max(1) as f64;
    let step = tick_step(latency_max, 6.0);
    let y_max = (latency_max / step).ceil() * step;
    let legend_height = LEGEND_ROW_HEIGHT_PX * drawn.len() as f64;
    let height = HEIGHT_PX + legend_height;
    let top = MARGIN_TOP_PX + legend_height;
    let plot_width = WIDTH_PX - MARGIN_LEFT_PX - MARGIN_RIGHT_PX;
    let plot_height = HEIGHT_PX - MARGIN_TOP_PX - MARGIN_BOTTOM_PX;
    let x_of = |decade: f64| MARGIN_LEFT_PX + plot_width * decade.min(decades as f64) / decades as f64;
    let y_of = |latency: f64| top + plot_height * (1.0 - latency / y_max);

    let mut out = String::new();
    out.push_str(&format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH_PX}\" height=\"{height}\" viewBox=\"0 0 {WIDTH_PX} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    ));
    out.push_str(&format!(
        "<rect x=\"0\" y=\"0\" width=\"{WIDTH_PX}\" height=\"{height}\" fill=\"white\"/>\n"
    ));
    out.push_str(&format!(
        "<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
        WIDTH_PX / 2.0,
        escape(title)
    ));
    // Grid and axis labels.
    for decade in 0..=decades {
        let x = x_of(decade as f64);
        out.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#dddddd\"/>\n",
            top + plot_height
        ));
        out.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            top + plot_height + 18.0,
            percentile_label(decade)
        ));
    }
    let mut tick = 0.0;
    while tick <= y_max + step / 2.0 {
        let y = y_of(tick);
        out.push_str(&format!(
            "<line x1=\"{MARGIN_LEFT_PX}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#dddddd\"/>\n",
            MARGIN_LEFT_PX + plot_width
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            MARGIN_LEFT_PX - 8.0,
            y + 4.0,
            thousands(tick as u64)
        ));
        tick += step;
    }
    out.push_str(&format!(
        "<rect x=\"{MARGIN_LEFT_PX}\" y=\"{top}\" width=\"{plot_width}\" height=\"{plot_height}\" fill=\"none\" stroke=\"#333333\"/>\n"
    ));
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">percentile (log scale of 1/(1-p))</text>\n",
        MARGIN_LEFT_PX + plot_width / 2.0,
        height - 20.0
    ));
    out.push_str(&format!(
        "<text x=\"20\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {:.1})\">latency (µs)</text>\n",
        top + plot_height / 2.0,
        top + plot_height / 2.0
    ));
    // One polyline per series, and its legend entry with the figures that matter.
    for (index, series) in drawn.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let histogram = series.latency_us;
        let mut points: Vec<(f64, f64)> = histogram
            .iter_quantiles(TICKS_PER_HALF_DISTANCE)
            .map(|step| {
                let quantile = step.quantile_iterated_to();
                let decade = if quantile >= 1.0 { decades as f64 } else { (1.0 / (1.0 - quantile)).log10() };
                (x_of(decade), y_of(step.value_iterated_to() as f64))
            })
            .collect();
        points.push((x_of(decades as f64), y_of(histogram.max() as f64)));
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        let legend_y = MARGIN_TOP_PX + LEGEND_ROW_HEIGHT_PX * index as f64;
        out.push_str(&legend_swatch(color, legend_y));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{legend_y:.1}\" font-size=\"11\">{}: p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs ({} samples)</text>\n",
            MARGIN_LEFT_PX + 42.0,
            escape(series.name),
            thousands(histogram.value_at_quantile(0.5)),
            thousands(histogram.value_at_quantile(0.99)),
            thousands(histogram.value_at_quantile(0.999)),
            thousands(histogram.max()),
            thousands(histogram.len())
        ));
    }
    if drawn.is_empty() {
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no latency was recorded</text>\n",
            MARGIN_LEFT_PX + plot_width / 2.0,
            top + plot_height / 2.0
        ));
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::latency::new_histogram;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(1000.0, 5.0), 200.0);
        assert_eq!(tick_step(7.0, 6.0), 2.0);
        assert_eq!(tick_step(0.5, 6.0), 1.0);
        assert_eq!(tick_step(12_345.0, 6.0), 5000.0);
        assert_eq!(percentile_label(2), "99%");
        assert_eq!(percentile_label(3), "99.9%");
        assert_eq!(percentile_label(4), "99.99%");
    }

    #[test]
    fn svg_has_every_series_and_axis() {
        let mut fast = new_histogram();
        let mut slow = new_histogram();
        for value in 1..=10_000u64 {
            fast.record(value % 500 + 100).unwrap();
            slow.record(value).unwrap();
        }
        let svg = svg(
            "latency <test> & more",
            &[Series { name: "publish-ack", latency_us: &fast }, Series { name: "e2e", latency_us: &slow }],
        );
        assert!(svg.starts_with("<?xml"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        for label in ["0%", "90%", "99%", "99.9%", "99.99%"] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label} missing");
        }
        assert!(svg.contains("latency &lt;test&gt; &amp; more"));
        let empty = svg_of_nothing();
        assert!(empty.contains("no latency was recorded"));
    }

    fn svg_of_nothing() -> String {
        svg("nothing", &[Series { name: "none", latency_us: &new_histogram() }])
    }
}
