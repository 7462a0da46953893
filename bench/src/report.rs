//! The benchmark's report: every table the run prints (through [`emit!`](crate::emit)), the
//! plots its rows fed ([`point`]), and the machine it ran on, written as a markdown file with SVG
//! plots by `bench -- --report DIR`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;

use plotters::prelude::*;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PLOTS: Mutex<BTreeMap<String, Plot>> = Mutex::new(BTreeMap::new());

/// Prints a line and keeps it for the report (`emit!` is `println!` that also records).
#[macro_export]
macro_rules! emit {
    () => {
        $crate::report::line("")
    };
    ($($t:tt)*) => {
        $crate::report::line(&format!($($t)*))
    };
}

/// Prints `s` and keeps it for the report.
pub fn line(s: &str) {
    println!("{s}");
    LINES.lock().unwrap().push(s.to_string());
}

/// One plot: points of named series.
#[derive(Debug, Default)]
struct Plot {
    title: String,
    x: String,
    y: String,
    log_x: bool,
    log_y: bool,
    series: BTreeMap<String, Vec<(f64, f64)>>,
}

/// Declares plot `id` (a file name), its title and axes (a logarithmic x axis with `log_x`).
pub fn define(id: &str, title: &str, x: &str, y: &str, log_x: bool) {
    define_with(id, title, x, y, log_x, false);
}

/// Like [`define`], with a logarithmic y axis too if `log_y` (latencies spanning decades).
pub fn define_with(id: &str, title: &str, x: &str, y: &str, log_x: bool, log_y: bool) {
    let mut plots = PLOTS.lock().unwrap();
    let p = plots.entry(id.to_string()).or_default();
    p.title = title.to_string();
    p.x = x.to_string();
    p.y = y.to_string();
    p.log_x = log_x;
    p.log_y = log_y;
}

/// Adds the point `(x, y)` to `series` of plot `id`.
pub fn point(id: &str, series: &str, x: f64, y: f64) {
    if !(x.is_finite() && y.is_finite()) {
        return;
    }
    PLOTS
        .lock()
        .unwrap()
        .entry(id.to_string())
        .or_default()
        .series
        .entry(series.to_string())
        .or_default()
        .push((x, y));
}

fn draw(plot: &Plot, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let points = plot.series.values().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, 0f64);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Ok(());
    }
    if x0 == x1 {
        x1 = x0 + 1.0;
    }
    let y1 = y1 * 1.15 + f64::EPSILON;
    let mut builder = ChartBuilder::on(&root);
    let chart = builder
        .caption(&plot.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    macro_rules! body {
        ($chart:expr) => {{
            let mut c = $chart;
            c.configure_mesh()
                .x_desc(plot.x.as_str())
                .y_desc(plot.y.as_str())
                .draw()?;
            for (i, (name, pts)) in plot.series.iter().enumerate() {
                let color = colors[i % colors.len()];
                let mut pts = pts.clone();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
                c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()?;
        }};
    }
    let y0 = (y0 / 1.5).max(f64::MIN_POSITIVE);
    match (plot.log_x, plot.log_y) {
        (true, true) => {
            body!(chart.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?)
        }
        (true, false) => body!(chart.build_cartesian_2d((x0..x1).log_scale(), 0f64..y1)?),
        (false, true) => body!(chart.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?),
        (false, false) => body!(chart.build_cartesian_2d(x0..x1, 0f64..y1)?),
    }
    root.present()?;
    Ok(())
}

/// What the run ran on: CPU, cores, memory, OS, server versions.
pub fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_string()))
        .unwrap_or_default();
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_default();
    let etcd = std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "etcd not installed".into());
    let jars = std::fs::read_dir("/usr/share/java")
        .map(|d| {
            let mut v: Vec<String> = d
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| {
                    (n.starts_with("zookeeper-3") || n.starts_with("curator-recipes-"))
                        && n.ends_with(".jar")
                })
                .collect();
            v.sort();
            v.join(", ")
        })
        .unwrap_or_default();
    format!("- CPU: {cpu}, {cores} cores; memory {mem}; {os}\n- {etcd}; {jars}\n")
}

/// Writes `dir/README.md` (the tables, with the plots above them) and one SVG per plot.
pub fn write(dir: &Path, command: &str) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut md = String::new();
    writeln!(md, "# fencelock benchmark report\n")?;
    writeln!(md, "Produced by `{command}`, one run, side by side with the peers against the same local servers.")?;
    writeln!(
        md,
        "Figures on a shared machine are noisy: compare rows of one run, read the ratios.\n"
    )?;
    writeln!(md, "{}", machine())?;
    let plots = PLOTS.lock().unwrap();
    if !plots.is_empty() {
        writeln!(md, "## Plots\n")?;
    }
    for (id, plot) in plots.iter() {
        let file = format!("{id}.svg");
        draw(plot, &dir.join(&file))?;
        writeln!(md, "![{}]({file})\n", plot.title)?;
    }
    writeln!(md, "## Tables\n")?;
    for l in LINES.lock().unwrap().iter() {
        // The run's own title is the report's.
        if l.starts_with("# ") {
            continue;
        }
        writeln!(
            md,
            "{}",
            l.strip_prefix("#")
                .map_or(l.clone(), |rest| format!("##{rest}"))
        )?;
    }
    std::fs::write(dir.join("README.md"), md)?;
    Ok(())
}
