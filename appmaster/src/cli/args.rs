//! The arguments of the commands that have no module of their own here:
//! `run`, `submit`, `kill`, `status`, `logs`, `appmaster`, `plan` and
//! `config` (what they do is in [`super`] and the binary's `main.rs`).

use std::path::PathBuf;

use clap::Args;

use super::{ClusterFlags, ConfFlags};

/// `cruise run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Configuration.
    #[command(flatten)]
    pub conf: ConfFlags,
    /// Continue the job of this work directory (the --work-dir it ran
    /// with; its newest job) from its newest usable checkpoint, after its
    /// AM died: the job runs again with the configuration it was started
    /// with (`<WORK_DIR>/jobs/config/<job id>.toml`; configuration flags
    /// and CRUISE_* variables are not applied), its model loaded from the
    /// checkpoint and only its remaining epochs trained. Fails, naming the
    /// directory, when the job took no checkpoint; a job that had finished
    /// is not run again (it says so and exits 0).
    #[arg(
        long,
        value_name = "WORK_DIR",
        conflicts_with_all = [
            "config", "app", "input", "eval_input", "model_out", "containers", "workers",
            "epochs", "mini_batch", "sync", "staleness", "work_dir", "runtime", "master", "set",
        ]
    )]
    pub resume: Option<PathBuf>,
    /// Print the final summary as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bars or per-epoch lines.
    #[arg(short, long)]
    pub quiet: bool,
}

/// `cruise submit`.
#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// Configuration (--runtime must be yarn, the default here).
    #[command(flatten)]
    pub conf: ConfFlags,
    /// Print what was submitted as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `cruise kill`.
#[derive(Args, Debug)]
pub struct AppIdArgs {
    /// The YARN application id, e.g. application_1700000000000_0001.
    #[arg(value_name = "APP_ID")]
    pub app_id: String,
    /// Cluster.
    #[command(flatten)]
    pub cluster: ClusterFlags,
}

/// `cruise status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The YARN application id.
    #[arg(value_name = "APP_ID")]
    pub app_id: String,
    /// Cluster.
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Print the application and service reports as JSON.
    #[arg(long)]
    pub json: bool,
    /// Poll until the application ends (FINISHED, FAILED or KILLED); exit
    /// non-zero unless it succeeded.
    #[arg(long)]
    pub wait: bool,
}

/// `cruise logs`.
#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The YARN application id.
    #[arg(value_name = "APP_ID")]
    pub app_id: String,
    /// Cluster.
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Log file of the AM container (repeatable): stdout, stderr,
    /// summary.json. Default: stdout and stderr.
    #[arg(long = "file", value_name = "NAME")]
    pub files: Vec<String>,
    /// Attempt number (default: the last one).
    #[arg(long)]
    pub attempt: Option<i64>,
}

/// `cruise appmaster`.
#[derive(Args, Debug)]
pub struct AppmasterArgs {
    /// The job configuration staged by `cruise submit`.
    #[arg(short, long, value_name = "FILE")]
    pub config: PathBuf,
}

/// `cruise plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The snapshot (JSON; `--set optimizer.snapshot_file=FILE` makes a job write one).
    #[arg(value_name = "SNAPSHOT.json")]
    pub snapshot: PathBuf,
    /// Plan for this many containers instead (more: offered; fewer: reclaimed).
    #[arg(short = 'n', long, value_name = "N")]
    pub containers: Option<usize>,
    /// Least predicted gain worth a reconfiguration (default: the job's,
    /// from the snapshot; 0.05 for a snapshot without it).
    #[arg(long, value_name = "FRACTION")]
    pub min_gain: Option<f64>,
    /// Instead of planning: predict every split of this container order
    /// (comma-separated ids of the snapshot, e.g. `e3,e1,e2`): the first W
    /// work, the rest serve, blocks dealt as at a job's start. Compare
    /// with measured runs to check the cost model.
    #[arg(
        long,
        value_name = "IDS",
        conflicts_with_all = ["containers", "min_gain", "remaining_epochs"]
    )]
    pub splits: Option<String>,
    /// Decide as if this many epochs of training remained (default: the
    /// snapshot's). The net saving of a plan grows with them: a snapshot
    /// written near a job's end stays where one written early would move.
    #[arg(long, value_name = "EPOCHS")]
    pub remaining_epochs: Option<f64>,
    /// Print JSON: the decision and the roles it proposes (with
    /// `--splits`: every split's prediction).
    #[arg(long)]
    pub json: bool,
}

/// `cruise config`.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Configuration.
    #[command(flatten)]
    pub conf: ConfFlags,
}
