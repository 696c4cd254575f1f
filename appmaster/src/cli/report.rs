//! `cruise report`: its arguments and the command, one HTML file from a
//! job's history.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::datagen;

/// `cruise report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The job's work directory (its newest job is reported), its `jobs`
    /// or `jobs/history` directory, or a history file (`.jsonl`).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Where to write the report. Default: `<job id>.html` beside the
    /// job's `history` directory (where its container logs, linked from
    /// the report, are).
    #[arg(short, long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs `cruise report`: returns the file written.
pub fn report(args: &ReportArgs) -> anyhow::Result<PathBuf> {
    use crate::am::history;
    let file = history::find(&args.dir)?;
    let records = history::read(&file)?;
    let job_id = records
        .iter()
        .find_map(|r| match r {
            history::Record::Job { job_id, .. } => Some(job_id.clone()),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("{}: no job record: not a job's history", file.display()))?;
    // `<jobs>/history/<job>.jsonl` → `<jobs>/<job>.html`, where
    // `containers/<id>/stderr` are the job's logs; a history file
    // elsewhere → beside it.
    let dir = file.parent().unwrap_or(std::path::Path::new("."));
    let jobs_dir = if dir.file_name().is_some_and(|n| n == history::HISTORY_DIR) {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    }
    .to_path_buf();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| jobs_dir.join(format!("{job_id}.html")));
    let logs = if jobs_dir.join("containers").is_dir() && args.out.is_none() {
        crate::ui::Logs::Under("containers")
    } else {
        crate::ui::Logs::None
    };
    let html = crate::ui::page(&records, None, logs, false);
    datagen::write_atomically(&out, |w| w.write_all(html.as_bytes()))?;
    Ok(out)
}
