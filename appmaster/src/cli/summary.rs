//! The summary `cruise run` prints at a job's end, for people.

use cruise_conf::CruiseConfig;

use crate::am::JobSummary;

/// What the final loss is, where it differs from the last epoch's: the
/// final model evaluated over all input after training, not the mean over
/// the last epoch's mini-batches (each taken before its own update).
fn final_loss_note(s: &JobSummary) -> String {
    let Some(last) = s.epochs.last() else {
        return String::new();
    };
    let (fin, ep) = (s.final_stats.mean_loss(), last.stats.mean_loss());
    if format!("{fin:.4}") == format!("{ep:.4}") {
        return String::new();
    }
    format!(
        " (the final model over all input, after training; epoch {}'s training {} was {ep:.4})",
        last.epoch, s.loss_name
    )
}

/// Formats a summary for people.
pub fn summary_text(s: &JobSummary, config: &CruiseConfig) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "  {label:<15}{value}");
    };
    line("app", s.app.to_string());
    line("epochs", s.epochs.len().to_string());
    line("records", s.records.to_string());
    let app = cruise_container::apps::params(config)
        .ok()
        .and_then(|p| cruise_container::apps::build(config, &p).ok());
    let mut figures = |what: &str, stats: &cruise_container::protocol::Stats, note: String| {
        line(
            &format!("{what} {}", s.loss_name),
            format!("{:.4}{note}", stats.mean_loss()),
        );
        if let Some((name, v)) = app.as_ref().and_then(|a| a.derived_metric(stats)) {
            line(&format!("{what} {name}"), format!("{v:.4}"));
        }
        if s.has_accuracy {
            line(
                &format!("{what} accuracy"),
                format!("{:.2}%", 100.0 * stats.accuracy()),
            );
        }
    };
    figures("final", &s.final_stats, final_loss_note(s));
    if let Some(e) = &s.eval_stats {
        figures("eval", e, String::new());
    }
    if let Some(path) = &s.model_out {
        line("model", path.clone());
    }
    line(
        "wall time",
        format!("{:.2} s (training {:.2} s)", s.wall_secs, s.train_secs),
    );
    let sync = match config.job.sync {
        cruise_conf::SyncMode::Async => "async".to_string(),
        cruise_conf::SyncMode::Ssp => format!("ssp, staleness {}", config.job.staleness),
    };
    let end = s
        .epochs
        .last()
        .filter(|e| (e.workers, e.servers) != (s.workers, s.servers))
        .map(|e| {
            format!(
                "; ended with {}",
                crate::am::split_text(e.workers, e.servers)
            )
        })
        .unwrap_or_default();
    line(
        "configuration",
        format!(
            "{} containers: {}, {sync}, mini-batch {}{end}",
            s.containers,
            crate::am::split_text(s.workers, s.servers),
            config.job.mini_batch
        ),
    );
    if let Some(e) = &s.emulation {
        line("emulation", e.clone());
    }
    for r in &s.reconfigurations {
        let failed = if r.failed.is_empty() {
            String::new()
        } else {
            format!(" ({} failed)", r.failed.len())
        };
        line(
            "reconfigured",
            format!(
                "in {:.2} s, ending at {:.1} s: {}{failed}",
                r.secs, r.at_secs, r.summary
            ),
        );
    }
    for l in &s.lost {
        line("survived", format!("{l}; its input re-read by the others"));
    }
    for r in &s.clock_rollbacks {
        line("rolled back", r.clone());
    }
    for r in &s.recounts {
        line("recounted", r.clone());
    }
    if let Some(r) = &s.resumed_from {
        line(
            "resumed",
            format!("from checkpoint {} (epoch {})", r.folder, r.epoch),
        );
    }
    format!("cruise: job {} finished\n{out}", s.job_id)
}
