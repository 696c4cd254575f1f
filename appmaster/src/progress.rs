//! Drawing a job's progress on stderr: a bar per epoch (records processed,
//! loss, accuracy, epoch time, workers and servers), and a line per epoch when
//! stderr is not a terminal.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::mpsc;

use cruise_conf::CruiseConfig;
use cruise_container::apps;
use cruise_container::protocol::Stats;

use crate::am::Progress;

fn metrics(stats: &Stats, app: Option<&dyn apps::App>, loss_name: &str, accuracy: bool) -> String {
    let mut s = format!("{loss_name} {:.4}", stats.mean_loss());
    if let Some((name, v)) = app.and_then(|a| a.derived_metric(stats)) {
        s.push_str(&format!("  {name} {v:.4}"));
    }
    if accuracy {
        s.push_str(&format!("  acc {:.2}%", 100.0 * stats.accuracy()));
    }
    s
}

/// Renders progress events until the sender is dropped.
pub async fn render(mut rx: mpsc::UnboundedReceiver<Progress>, config: CruiseConfig, show: bool) {
    let app = apps::params(&config)
        .ok()
        .and_then(|p| apps::build(&config, &p).ok());
    let (loss_name, accuracy) = app
        .as_ref()
        .map_or(("loss", false), |a| (a.loss_name(), a.has_accuracy()));
    let app = app.as_deref();
    let tty = std::io::stderr().is_terminal();
    let style = ProgressStyle::with_template(
        "{prefix:>10} [{bar:30.cyan/blue}] {percent:>3}% {elapsed:>4} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let mut bar: Option<ProgressBar> = None;
    let epochs = config.job.epochs;
    let say = |bar: &Option<ProgressBar>, line: String| {
        if !show {
            return;
        }
        match bar {
            Some(b) if tty => b.println(line),
            _ => eprintln!("{line}"),
        }
    };
    while let Some(p) = rx.recv().await {
        match p {
            Progress::Started {
                job_id,
                status,
                containers,
            } => {
                let where_ =
                    status.map_or(String::new(), |a| format!(", status at http://{a}/status"));
                say(
                    &bar,
                    format!(
                        "cruise: job {job_id} on {containers} {} containers{where_}",
                        config.runtime.kind.as_str()
                    ),
                );
                if let Some(a) = status {
                    say(
                        &bar,
                        format!(
                            "cruise: web UI at http://{a}/, Prometheus metrics at http://{a}/metrics"
                        ),
                    );
                }
            }
            Progress::Phase(text) => say(&bar, format!("cruise: {text}")),
            Progress::Batch {
                epoch,
                done,
                total,
                stats,
                workers,
                servers,
            } => {
                if !show || !tty {
                    continue;
                }
                let b = bar.get_or_insert_with(|| {
                    let b =
                        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                    b.set_style(style.clone());
                    b.enable_steady_tick(Duration::from_millis(200));
                    b
                });
                b.set_length(total);
                b.set_prefix(format!("epoch {epoch}/{epochs}"));
                b.set_position(done);
                b.set_message(format!(
                    "{}  W{workers} S{servers}",
                    metrics(&stats, app, loss_name, accuracy)
                ));
            }
            Progress::Epoch(e) => {
                let line = format!(
                    "epoch {}/{epochs}  {}  {:.2} s  ({})",
                    e.epoch,
                    metrics(&e.stats, app, loss_name, accuracy),
                    e.secs,
                    crate::am::split_text(e.workers, e.servers),
                );
                if let Some(b) = bar.take() {
                    b.finish_and_clear();
                }
                say(&bar, line);
            }
        }
    }
    if let Some(b) = bar.take() {
        b.finish_and_clear();
    }
}
