//! Charts as SVG text, drawn here so that the live page and the report
//! are the same pictures: a line chart, a bar chart, a timeline of lanes
//! with coloured segments and marked bands, and nothing else. No script,
//! no external asset.

use std::fmt::Write;

/// Width of every chart, in SVG units.
pub const WIDTH: f64 = 640.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 36.0;

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// At most this many points are drawn per series: a longer series is
/// thinned to every n-th point (its last one kept), so that a page of a
/// job of many epochs stays light.
pub const MAX_POINTS: usize = 400;

/// `points` thinned to at most [`MAX_POINTS`], keeping the last.
fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let step = points.len().div_ceil(MAX_POINTS).max(1);
    let mut out: Vec<(f64, f64)> = points.iter().copied().step_by(step).collect();
    if let Some(&last) = points.last()
        && out.last() != Some(&last)
    {
        out.push(last);
    }
    out
}

/// A named series of points.
pub struct Series<'a> {
    /// Its name in the legend.
    pub name: &'a str,
    /// Its colour (CSS).
    pub color: &'a str,
    /// Its points `(x, y)`; non-finite ones are left out.
    pub points: Vec<(f64, f64)>,
}

/// A marked interval of the x axis (a plan), with its label.
pub struct Band {
    /// Start.
    pub from: f64,
    /// End.
    pub to: f64,
    /// Label.
    pub label: String,
}

/// About five round tick values covering `lo..=hi`.
pub fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

/// A tick's text: few digits, no trailing zeros.
pub fn num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let s = if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Maps data to the plot area.
struct Frame {
    /// Whole-number ticks on the x axis (epochs).
    x_whole: bool,
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    height: f64,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x0) / (self.x1 - self.x0).max(1e-12) * (WIDTH - LEFT - RIGHT)
    }
    fn py(&self, y: f64) -> f64 {
        self.height - BOTTOM - (y - self.y0) / (self.y1 - self.y0).max(1e-12) * (self.plot_h())
    }
    fn plot_h(&self) -> f64 {
        self.height - TOP - BOTTOM
    }
}

fn open(out: &mut String, class: &str, title: &str, height: f64) {
    let _ = write!(
        out,
        r#"<svg class="chart {class}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="{t}"><title>{t}</title><text x="{LEFT}" y="18" class="ctitle">{t}</text>"#,
        t = esc(title)
    );
}

fn axes(out: &mut String, f: &Frame, x_label: &str, y_label: &str, y_ticks: bool) {
    let (l, r, b, t) = (LEFT, WIDTH - RIGHT, f.height - BOTTOM, TOP);
    let _ = write!(
        out,
        r##"<path class="axis" d="M{l} {t}V{b}H{r}" fill="none" stroke="#888"/>"##
    );
    let mut xt = ticks(f.x0, f.x1);
    if f.x_whole {
        xt.retain(|x| x.fract() == 0.0);
        if xt.is_empty() {
            xt = ((f.x0.ceil() as i64)..=(f.x1.floor() as i64))
                .map(|x| x as f64)
                .collect();
        }
    }
    for x in xt {
        let px = f.px(x);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{b}" x2="{px:.1}" y2="{}" stroke="#888"/><text x="{px:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"##,
            b + 4.0,
            b + 15.0,
            num(x)
        );
    }
    if y_ticks {
        for y in ticks(f.y0, f.y1) {
            let py = f.py(y);
            let _ = write!(
                out,
                r##"<line x1="{l}" y1="{py:.1}" x2="{r}" y2="{py:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
                l - 4.0,
                py + 4.0,
                num(y)
            );
        }
    }
    let _ = write!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="label">{}</text>"#,
        (l + r) / 2.0,
        f.height - 4.0,
        esc(x_label)
    );
    if !y_label.is_empty() {
        let _ = write!(
            out,
            r#"<text transform="translate(12 {:.1}) rotate(-90)" text-anchor="middle" class="label">{}</text>"#,
            (t + b) / 2.0,
            esc(y_label)
        );
    }
}

fn bands(out: &mut String, f: &Frame, bands: &[Band]) {
    for b in bands {
        let (x0, x1) = (f.px(b.from.max(f.x0)), f.px(b.to.min(f.x1)));
        let _ = write!(
            out,
            r##"<g class="plan-band"><rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f4c542" fill-opacity="0.3" stroke="#d4a017"/><text x="{x0:.1}" y="{}" class="tick">{}</text></g>"##,
            (x1 - x0).max(2.0),
            f.plot_h(),
            TOP - 2.0,
            esc(&b.label)
        );
    }
}

fn empty(out: &mut String, height: f64, what: &str) {
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" class="empty">{}</text></svg>"#,
        WIDTH / 2.0,
        height / 2.0,
        esc(what)
    );
}

/// A line chart of `series` over a shared x axis, each point a circle
/// (class `point`), plans marked as bands.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    marks: &[Band],
) -> String {
    let height = 240.0;
    let mut out = String::new();
    open(&mut out, "line", title, height);
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if pts.is_empty() {
        empty(&mut out, height, "no data yet");
        return out;
    }
    let (mut x0, mut x1, mut y0, mut y1) = pts.iter().fold(
        (f64::MAX, f64::MIN, f64::MAX, f64::MIN),
        |(a, b, c, d), &(x, y)| (a.min(x), b.max(x), c.min(y), d.max(y)),
    );
    for m in marks {
        x0 = x0.min(m.from);
        x1 = x1.max(m.to);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.08).max(y1.abs() * 0.02).max(1e-9);
    y0 = if y0 >= 0.0 && y0 - pad < 0.0 {
        0.0
    } else {
        y0 - pad
    };
    y1 += pad;
    let f = Frame {
        x_whole: true,
        x0,
        x1,
        y0,
        y1,
        height,
    };
    axes(&mut out, &f, x_label, y_label, true);
    bands(&mut out, &f, marks);
    for (i, s) in series.iter().enumerate() {
        let p: Vec<String> = thin(&s.points)
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", f.px(x), f.py(y)))
            .collect();
        let _ = write!(
            out,
            r#"<g class="series" data-name="{}"><polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            esc(s.name),
            s.color,
            p.join(" ")
        );
        for xy in &p {
            let (x, y) = xy.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(
                out,
                r#"<circle class="point" cx="{x}" cy="{y}" r="3" fill="{}"/>"#,
                s.color
            );
        }
        // Legends in the title's row, right-aligned.
        let lx = WIDTH - RIGHT - 150.0 * (i + 1) as f64;
        let ly = 18.0;
        let _ = write!(
            out,
            r#"<rect x="{lx}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{ly:.1}" class="tick">{}</text></g>"#,
            ly - 9.0,
            s.color,
            lx + 14.0,
            esc(s.name)
        );
    }
    out.push_str("</svg>");
    out
}

/// A bar chart: one bar per `(x, y)`, centred on `x` (class `bar`).
pub fn bar_chart(title: &str, x_label: &str, y_label: &str, bars: &[(f64, f64)]) -> String {
    let height = 200.0;
    let mut out = String::new();
    open(&mut out, "bars", title, height);
    let bars: Vec<(f64, f64)> = bars
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if bars.is_empty() {
        empty(&mut out, height, "no data yet");
        return out;
    }
    let x0 = bars.iter().map(|b| b.0).fold(f64::MAX, f64::min) - 0.5;
    let x1 = bars.iter().map(|b| b.0).fold(f64::MIN, f64::max) + 0.5;
    let y1 = bars.iter().map(|b| b.1).fold(0.0, f64::max) * 1.1;
    let f = Frame {
        x_whole: true,
        x0,
        x1,
        y0: 0.0,
        y1: if y1 > 0.0 { y1 } else { 1.0 },
        height,
    };
    axes(&mut out, &f, x_label, y_label, true);
    let w = ((f.px(1.0) - f.px(0.0)) * 0.7).max(1.0);
    for &(x, y) in &thin(&bars) {
        let _ = write!(
            out,
            r##"<rect class="bar" x="{:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="#4a7fb5"><title>{}: {}</title></rect>"##,
            f.px(x) - w / 2.0,
            f.py(y),
            (f.py(0.0) - f.py(y)).max(0.5),
            num(x),
            num(y)
        );
    }
    out.push_str("</svg>");
    out
}

/// One lane of a timeline: a label and coloured segments.
pub struct Lane {
    /// Its label.
    pub label: String,
    /// Segments `(from, to, class, colour, tooltip)`.
    pub segments: Vec<Segment>,
}

/// A coloured interval of a lane.
pub struct Segment {
    /// Start.
    pub from: f64,
    /// End.
    pub to: f64,
    /// Its CSS class (e.g. the role: `worker`, `server`).
    pub class: String,
    /// Its colour.
    pub color: String,
    /// Tooltip.
    pub tip: String,
}

/// A timeline: one row per lane over `0..=x_max`, the bands marked across
/// every row, and a legend of `(name, colour)`.
pub fn timeline(
    title: &str,
    x_label: &str,
    lanes: &[Lane],
    marks: &[Band],
    x_max: f64,
    legend: &[(&str, &str)],
) -> String {
    let row = 18.0;
    let height = TOP + BOTTOM + 14.0 + row * lanes.len().max(1) as f64;
    let mut out = String::new();
    open(&mut out, "timeline", title, height);
    if lanes.is_empty() {
        empty(&mut out, height, "no containers yet");
        return out;
    }
    let x1 = lanes
        .iter()
        .flat_map(|l| l.segments.iter().map(|s| s.to))
        .chain(marks.iter().map(|b| b.to))
        .fold(x_max, f64::max)
        .max(1e-3);
    let f = Frame {
        x_whole: false,
        x0: 0.0,
        x1,
        y0: 0.0,
        y1: 1.0,
        height: height - 14.0,
    };
    axes(&mut out, &f, x_label, "", false);
    bands(&mut out, &f, marks);
    for (i, lane) in lanes.iter().enumerate() {
        let y = TOP + 2.0 + row * i as f64;
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" class="tick">{}</text>"#,
            LEFT - 4.0,
            y + row * 0.65,
            esc(&lane.label)
        );
        for s in &lane.segments {
            let (a, b) = (f.px(s.from), f.px(s.to));
            let _ = write!(
                out,
                r#"<rect class="segment {}" x="{a:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                esc(&s.class),
                (b - a).max(1.0),
                row - 4.0,
                s.color,
                esc(&s.tip)
            );
        }
    }
    let mut lx = LEFT;
    for (name, color) in legend {
        let _ = write!(
            out,
            r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}" class="tick">{}</text>"#,
            height - 12.0,
            lx + 14.0,
            height - 3.0,
            esc(name)
        );
        lx += 90.0;
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.31, 0.97);
        assert!(t.first().is_some_and(|&v| v >= 0.31) && t.last().is_some_and(|&v| v <= 0.97));
        assert_eq!(ticks(1.0, 1.0), vec![1.0]);
    }

    #[test]
    fn a_line_chart_has_a_point_per_finite_value_and_marks_the_bands() {
        let s = Series {
            name: "loss <train>",
            color: "#c00",
            points: vec![(1.0, 0.5), (2.0, f64::NAN), (3.0, 0.3)],
        };
        let band = Band {
            from: 1.5,
            to: 2.5,
            label: "plan 1".into(),
        };
        let svg = line_chart("Loss", "epoch", "", &[s], &[band]);
        assert_eq!(svg.matches(r#"class="point""#).count(), 2, "{svg}");
        assert_eq!(svg.matches("plan-band").count(), 1);
        assert!(svg.contains("loss &lt;train&gt;"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }

    #[test]
    fn a_long_series_is_thinned_and_keeps_its_last_point() {
        let points: Vec<(f64, f64)> = (1..=1001).map(|i| (f64::from(i), 1.0)).collect();
        let t = thin(&points);
        assert!(t.len() <= MAX_POINTS + 1, "{}", t.len());
        assert_eq!(t.first(), points.first());
        assert_eq!(t.last(), points.last());
        assert_eq!(thin(&points[..10]), points[..10].to_vec());
    }

    #[test]
    fn charts_without_data_say_so() {
        assert!(line_chart("L", "x", "y", &[], &[]).contains("no data yet"));
        assert!(bar_chart("B", "x", "y", &[]).contains("no data yet"));
        assert!(timeline("T", "s", &[], &[], 1.0, &[]).contains("no containers yet"));
    }
}
