//! The `cruise` command line: argument definitions and the commands.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the command tree ([`Cli`], [`Command`]); running a job: `run`, `run --resume`, the shared [`run_with`] |
//! | `flags.rs` | flags several commands share: [`ConfFlags`], [`ClusterFlags`] and the configuration they build |
//! | `args.rs` | the arguments of `run`, `submit`, `kill`, `status`, `logs`, `appmaster`, `plan`, `config` |
//! | `generate.rs` | `cruise datagen`: its arguments and the command |
//! | `report.rs` | `cruise report`: its arguments and the command |
//! | `summary.rs` | the text summary of a finished job ([`summary_text`]) |

mod args;
mod flags;
mod generate;
mod report;
mod summary;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use cruise_conf::CruiseConfig;

use crate::am::{self, AmError, JobOptions, JobSummary, RmFactory, Status};
use crate::{datagen, progress, runtime};

pub use args::{
    AppIdArgs, AppmasterArgs, ConfigArgs, LogsArgs, PlanArgs, RunArgs, StatusArgs, SubmitArgs,
};
pub use flags::{AppArg, ClusterFlags, ConfFlags, RuntimeArg, SyncArg};
pub use generate::{
    DatagenApp, DatagenArgs, GenOut, LassoGenArgs, LdaGenArgs, MlrGenArgs, NmfGenArgs, datagen,
};
pub use report::{ReportArgs, report};
pub use summary::summary_text;

/// cruise: a self-configuring, elastic parameter-server ML framework.
///
/// Submit a training job; cruise runs it on workers and servers in containers
/// and reports progress per epoch. Containers come from this machine (the
/// local runtime), a Mesos cluster (`cruise run --runtime mesos --master
/// HOST:PORT`) or a YARN cluster (`cruise submit`, then `cruise status`,
/// `cruise logs`, `cruise kill`). Configuration comes from built-in defaults,
/// a TOML file (--config), environment variables `CRUISE_<SECTION>__<KEY>`, and
/// flags, each overriding the one before.
#[derive(Parser, Debug)]
#[command(
    name = "cruise",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// More log output (-v info, -vv debug) on stderr. RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a training job with the AM in the foreground. Evaluators are
    /// processes on this machine (--runtime local, the default; with
    /// --set emulation.containers=... each gets its own CPU share and
    /// bandwidth, an emulated cluster), tasks on a Mesos cluster (--runtime
    /// mesos --master HOST:PORT), or containers of a YARN service (--runtime
    /// yarn). With no arguments: MLR on a generated data set, 4 containers,
    /// 5 epochs.
    Run(RunArgs),
    /// Submit a training job to YARN: upload this binary and the job
    /// configuration to an HDFS staging directory, start the AM in a YARN
    /// container, and print the application id. Reads HADOOP_CONF_DIR
    /// (yarn-site.xml for the ResourceManager, core-site.xml/hdfs-site.xml for
    /// HDFS). A local or generated input is uploaded too.
    Submit(SubmitArgs),
    /// Show the state of a submitted application and its evaluators.
    Status(StatusArgs),
    /// Kill a submitted application and destroy its evaluator service.
    Kill(AppIdArgs),
    /// Print the AM's output (stdout, stderr) of a submitted application.
    Logs(LogsArgs),
    /// Generate a synthetic data set with a known ground truth.
    Datagen(DatagenArgs),
    /// Print the effective configuration (after file, environment and flags).
    Config(ConfigArgs),
    /// What-if: from a metrics snapshot a job wrote (optimizer.snapshot_file),
    /// print the predicted epoch time of every workers/servers split and the
    /// plan the optimizer would run.
    Plan(PlanArgs),
    /// Write a job's report: one self-contained HTML file (no script, no
    /// asset from elsewhere) with the plots of the web UI, from the history
    /// the job wrote in its work directory (`<work dir>/jobs/history/`).
    Report(ReportArgs),
    /// Run an evaluator (started by a resource manager, not by hand).
    #[command(hide = true)]
    Evaluator,
    /// Run the AM inside a YARN container (started by `cruise submit`).
    #[command(hide = true)]
    Appmaster(AppmasterArgs),
}

/// Runs `cruise run`: returns the summary, or the error that ended the job.
pub async fn run(args: RunArgs, cancel: CancellationToken) -> anyhow::Result<JobSummary> {
    let mut config = args.conf.load()?;
    // Evaluators run in their own directories: relative local paths are
    // meant relative to where `cruise run` was started.
    for path in [
        &mut config.job.input,
        &mut config.job.eval_input,
        &mut config.job.work_dir,
        &mut config.checkpoint.dir,
    ] {
        *path = absolute_local(path)?;
    }
    let work = datagen::work_dir(&config);
    let input = datagen::prepare_input(&config, &work)?;
    let factory = runtime::foreground_factory(&mut config)?;
    let summary = run_with(
        config,
        input,
        work,
        cancel,
        !args.quiet,
        factory,
        am::JobStart::New,
    )
    .await?;
    Ok(summary)
}

/// What `cruise run --resume` did.
pub enum Resumed {
    /// The job ran to its end from its checkpoint; the configuration it
    /// ran with.
    Ran(Box<JobSummary>, Box<CruiseConfig>),
    /// The job had finished before; nothing was run. The text says which
    /// job and where that is recorded.
    AlreadyFinished(String),
}

/// Runs `cruise run --resume WORK_DIR` (see [`RunArgs::resume`]).
pub async fn resume(
    work_dir: &std::path::Path,
    show_progress: bool,
    cancel: CancellationToken,
) -> anyhow::Result<Resumed> {
    let work_dir = &std::path::absolute(work_dir)
        .map_err(|e| anyhow::anyhow!("cannot resolve {}: {e}", work_dir.display()))?;
    let (mut config, resume) = match am::resume::prepare(work_dir).await? {
        am::resume::Prepared::Finished { job_id, history } => {
            return Ok(Resumed::AlreadyFinished(format!(
                "job {job_id} in {} had already finished (its history {} says so); \
                 nothing to resume",
                work_dir.display(),
                history.display()
            )));
        }
        am::resume::Prepared::Resume { config, resume } => (*config, resume),
    };
    let input = config.job.input.clone();
    let factory = runtime::foreground_factory(&mut config)?;
    let summary = run_with(
        config.clone(),
        input,
        work_dir.to_path_buf(),
        cancel,
        show_progress,
        factory,
        am::JobStart::Resume(resume),
    )
    .await?;
    Ok(Resumed::Ran(Box::new(summary), Box::new(config)))
}

/// A relative local path made absolute against the current directory; URIs
/// (`scheme://...`), absolute paths and the empty string are kept.
pub fn absolute_local(path: &str) -> anyhow::Result<String> {
    if path.is_empty() || path.contains("://") || std::path::Path::new(path).is_absolute() {
        return Ok(path.to_string());
    }
    let cwd = std::env::current_dir()
        .map_err(|e| anyhow::anyhow!("cannot resolve the relative path {path:?}: {e}"))?;
    Ok(cwd.join(path).display().to_string())
}

/// Runs a job on the local runtime with progress drawn on stderr.
pub async fn run_local(
    mut config: CruiseConfig,
    input: String,
    work: PathBuf,
    cancel: CancellationToken,
    show_progress: bool,
) -> Result<JobSummary, AmError> {
    let factory = runtime::local_factory(&mut config)?;
    run_with(
        config,
        input,
        work,
        cancel,
        show_progress,
        factory,
        am::JobStart::New,
    )
    .await
}

/// Runs a job with the resource manager `rm` builds, progress drawn on
/// stderr; `start` says whether it is a new job or resumed.
pub async fn run_with(
    config: CruiseConfig,
    input: String,
    work: PathBuf,
    cancel: CancellationToken,
    show_progress: bool,
    rm: RmFactory,
    start: am::JobStart,
) -> Result<JobSummary, AmError> {
    let (ptx, prx) = mpsc::unbounded_channel();
    let (status_tx, _) = watch::channel(Status::default());
    let renderer = tokio::spawn(progress::render(prx, config.clone(), show_progress));
    let evaluator_command = config.runtime.evaluator_command.clone();
    let job_work = work.join("jobs");
    let opts = JobOptions {
        rm,
        config,
        input,
        progress: ptx,
        status: status_tx,
        cancel,
        work_dir: job_work,
        evaluator_command,
        start,
        requests: None,
    };
    let result = am::run_job(opts).await;
    let _ = renderer.await;
    result
}
