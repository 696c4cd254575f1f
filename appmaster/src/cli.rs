//! The `cruise` command line: argument definitions and the commands.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use cruise_conf::{CruiseConfig, LassoConfig, Layers, LdaConfig, NmfConfig};

use crate::am::{self, AmError, JobOptions, JobSummary, RmFactory, Status};
use crate::{datagen, progress, runtime};

/// cruise: a self-configuring, elastic parameter-server ML framework.
///
/// Submit a training job; cruise runs it on workers and servers in containers
/// and reports progress per epoch. Containers come from this machine (the
/// local runtime), a Mesos cluster (`cruise run --runtime mesos --master
/// HOST:PORT`) or a YARN cluster (`cruise submit`, then `cruise status`,
/// `cruise logs`, `cruise kill`). Configuration comes from built-in defaults,
/// a TOML file (--config), environment variables CRUISE_<SECTION>__<KEY>, and
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

/// Configuration flags shared by commands that build a configuration.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfFlags {
    /// TOML configuration file (see conf/examples/local.toml for every key).
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Application to train.
    #[arg(long, value_enum)]
    pub app: Option<AppArg>,
    /// Input file, directory or URI (file://, hdfs://, webhdfs://).
    /// Default: generate a data set into the work directory.
    #[arg(short, long, value_name = "PATH")]
    pub input: Option<String>,
    /// Held-out input (same format): the final model is also evaluated over
    /// it and reported as eval_stats (mlr and lasso).
    #[arg(long, value_name = "PATH")]
    pub eval_input: Option<String>,
    /// Write the final model to this file (text: `key v1 v2 ...` per line).
    #[arg(long, value_name = "FILE")]
    pub model_out: Option<PathBuf>,
    /// Containers (evaluators) to start with.
    #[arg(short = 'n', long, value_name = "N")]
    pub containers: Option<u32>,
    /// Initial workers; the other containers are servers.
    #[arg(short, long, value_name = "W")]
    pub workers: Option<u32>,
    /// Training epochs.
    #[arg(short, long, value_name = "E")]
    pub epochs: Option<u32>,
    /// Records per mini-batch.
    #[arg(short = 'b', long, value_name = "B")]
    pub mini_batch: Option<u32>,
    /// Synchronisation: async, or ssp (stale-synchronous; see --staleness).
    #[arg(long, value_enum)]
    pub sync: Option<SyncArg>,
    /// SSP staleness bound in epochs (0 = bulk-synchronous). Implies --sync ssp.
    #[arg(long, value_name = "S")]
    pub staleness: Option<u32>,
    /// Work directory for generated data and container logs.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Where containers come from: local, yarn or mesos.
    #[arg(long, value_enum)]
    pub runtime: Option<RuntimeArg>,
    /// Mesos master HOST:PORT (several separated by commas); implies
    /// --runtime mesos unless another runtime is given.
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// Set any configuration key, e.g. --set mlr.step_size=0.2 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Applications.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum AppArg {
    /// Multinomial logistic regression.
    Mlr,
    /// Non-negative matrix factorisation.
    Nmf,
    /// Latent Dirichlet allocation.
    Lda,
    /// Lasso regression.
    Lasso,
}

/// Runtimes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeArg {
    /// Evaluator processes on this machine.
    Local,
    /// Containers of a YARN service.
    Yarn,
    /// Tasks of a Mesos framework.
    Mesos,
}

/// Synchronisation modes.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum SyncArg {
    /// Workers never wait.
    Async,
    /// Stale-synchronous parallel.
    Ssp,
}

impl ConfFlags {
    /// Builds the configuration from defaults, file, environment and these flags.
    pub fn load(&self) -> Result<CruiseConfig, cruise_conf::ConfError> {
        let mut l = Layers::from_process_env(self.config.clone());
        if let Some(a) = self.app {
            l.set("job.app", format!("{a:?}").to_lowercase(), "--app");
        }
        if let Some(v) = &self.input {
            l.set("job.input", v, "--input");
        }
        if let Some(v) = &self.eval_input {
            l.set("job.eval_input", v, "--eval-input");
        }
        if let Some(v) = &self.model_out {
            l.set("job.model_out", v.display(), "--model-out");
        }
        if let Some(v) = self.containers {
            l.set("job.containers", v, "--containers");
        }
        if let Some(v) = self.workers {
            l.set("job.workers", v, "--workers");
        }
        if let Some(v) = self.epochs {
            l.set("job.epochs", v, "--epochs");
        }
        if let Some(v) = self.mini_batch {
            l.set("job.mini_batch", v, "--mini-batch");
        }
        if let Some(v) = self.sync {
            l.set("job.sync", format!("{v:?}").to_lowercase(), "--sync");
        }
        if let Some(v) = self.staleness {
            if self.sync.is_none() {
                l.set("job.sync", "ssp", "--staleness");
            }
            l.set("job.staleness", v, "--staleness");
        }
        if let Some(v) = &self.work_dir {
            l.set("job.work_dir", v.display(), "--work-dir");
        }
        match (self.runtime, &self.master) {
            (Some(r), _) => l.set("runtime.kind", format!("{r:?}").to_lowercase(), "--runtime"),
            (None, Some(_)) => l.set("runtime.kind", "mesos", "--master"),
            (None, None) => {}
        }
        if let Some(m) = &self.master {
            l.set("mesos.master", m, "--master");
        }
        for s in &self.set {
            l.set_text(s)?;
        }
        l.load()
    }
}

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

/// Flags that find the cluster for `status`, `kill` and `logs`.
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// TOML configuration file (its yarn section is used).
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// ResourceManager web address (repeatable for HA). Default:
    /// yarn.rm_addresses, else HADOOP_CONF_DIR/yarn-site.xml.
    #[arg(long = "rm", value_name = "HOST:PORT")]
    pub rm: Vec<String>,
    /// Set any configuration key, e.g. --set yarn.user=alice (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ClusterFlags {
    /// The configuration these flags describe.
    pub fn load(&self) -> Result<CruiseConfig, cruise_conf::ConfError> {
        let mut l = Layers::from_process_env(self.config.clone());
        if !self.rm.is_empty() {
            let list: Vec<String> = self.rm.iter().map(|r| format!("{r:?}")).collect();
            l.set(
                "yarn.rm_addresses",
                format!("[{}]", list.join(", ")),
                "--rm",
            );
        }
        for s in &self.set {
            l.set_text(s)?;
        }
        l.load()
    }
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

/// `cruise datagen`.
#[derive(Args, Debug)]
pub struct DatagenArgs {
    /// The app whose data to generate.
    #[command(subcommand)]
    pub app: DatagenApp,
}

/// Data sets `cruise datagen` makes, one per app.
#[derive(Subcommand, Debug)]
pub enum DatagenApp {
    /// libsvm records labelled by a random linear model (`label idx:val ...`).
    Mlr(MlrGenArgs),
    /// A low-rank non-negative matrix plus Gaussian noise (`row: col,val ...`),
    /// or a conversion of `row col value` triplets to that format.
    Nmf(NmfGenArgs),
    /// A corpus drawn from known topics (`doc_id word:count ...`).
    Lda(LdaGenArgs),
    /// Regression data with sparse true coefficients plus noise (libsvm
    /// `target idx:val ...`).
    Lasso(LassoGenArgs),
}

/// Options every generator has.
#[derive(Args, Debug, Clone)]
pub struct GenOut {
    /// Seed (the same seed gives the same file).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output file.
    #[arg(short, long, value_name = "PATH")]
    pub out: PathBuf,
    /// Also write the ground truth here, as JSON (true coefficients, topics,
    /// noise level).
    #[arg(long, value_name = "PATH")]
    pub truth: Option<PathBuf>,
}

/// `cruise datagen mlr`.
#[derive(Args, Debug)]
pub struct MlrGenArgs {
    /// Records.
    #[arg(long, default_value_t = 20_000)]
    pub samples: u64,
    /// Features (libsvm indices 1..=F).
    #[arg(long, default_value_t = 1_000)]
    pub features: u32,
    /// Classes (labels 0..K-1).
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    /// Non-zero features per record.
    #[arg(long, default_value_t = 40)]
    pub nnz: u32,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// `cruise datagen nmf`.
#[derive(Args, Debug)]
pub struct NmfGenArgs {
    /// Rows.
    #[arg(long, default_value_t = NmfConfig::default().generate_rows)]
    pub rows: u64,
    /// Columns.
    #[arg(long, default_value_t = NmfConfig::default().columns)]
    pub columns: u32,
    /// Rank of the true factors.
    #[arg(long, default_value_t = NmfConfig::default().rank)]
    pub rank: u32,
    /// Fraction of entries observed.
    #[arg(long, default_value_t = NmfConfig::default().generate_density)]
    pub density: f64,
    /// Standard deviation of the noise.
    #[arg(long, default_value_t = NmfConfig::default().generate_noise)]
    pub noise: f64,
    /// Instead of generating, convert this file of `row col value` triplets
    /// (one entry per line) to the row format.
    #[arg(long, value_name = "PATH")]
    pub from_triplets: Option<PathBuf>,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// `cruise datagen lda`.
#[derive(Args, Debug)]
pub struct LdaGenArgs {
    /// Documents.
    #[arg(long, default_value_t = LdaConfig::default().generate_docs)]
    pub docs: u64,
    /// Vocabulary size (word ids 0..V-1).
    #[arg(long, default_value_t = LdaConfig::default().vocab)]
    pub vocab: u32,
    /// Topics.
    #[arg(long, default_value_t = LdaConfig::default().topics)]
    pub topics: u32,
    /// Mean tokens per document.
    #[arg(long, default_value_t = LdaConfig::default().generate_doc_len)]
    pub doc_len: u32,
    /// Dirichlet prior of the document-topic mixtures.
    #[arg(long, default_value_t = LdaConfig::default().alpha)]
    pub alpha: f64,
    /// Dirichlet prior of the topics' word distributions.
    #[arg(long, default_value_t = LdaConfig::default().beta)]
    pub beta: f64,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// `cruise datagen lasso`.
#[derive(Args, Debug)]
pub struct LassoGenArgs {
    /// Records.
    #[arg(long, default_value_t = LassoConfig::default().generate_samples)]
    pub samples: u64,
    /// Features (libsvm indices 1..=F; every record has all of them).
    #[arg(long, default_value_t = LassoConfig::default().features)]
    pub features: u32,
    /// Non-zero true coefficients.
    #[arg(long, default_value_t = LassoConfig::default().generate_support)]
    pub support: u32,
    /// Standard deviation of the noise on the targets.
    #[arg(long, default_value_t = LassoConfig::default().generate_noise)]
    pub noise: f64,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
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
    #[arg(long, value_name = "IDS", conflicts_with_all = ["containers", "min_gain"])]
    pub splits: Option<String>,
    /// With `--splits`: print JSON.
    #[arg(long, requires = "splits")]
    pub json: bool,
}

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

/// `cruise config`.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Configuration.
    #[command(flatten)]
    pub conf: ConfFlags,
}

/// Runs `cruise run`: returns the summary, or the error that ended the job.
pub async fn run(args: RunArgs, cancel: CancellationToken) -> anyhow::Result<JobSummary> {
    let mut config = args.conf.load()?;
    // Evaluators run in their own directories: relative local paths are
    // meant relative to where `cruise run` was started.
    for path in [&mut config.job.input, &mut config.job.eval_input] {
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
    };
    let result = am::run_job(opts).await;
    let _ = renderer.await;
    result
}

/// Runs `cruise datagen`: returns the bytes written and the output file.
pub fn datagen(args: DatagenArgs) -> anyhow::Result<(u64, PathBuf)> {
    use cruise_container::apps::{lasso, lda, mlr, nmf};
    let (spec, out) = match args.app {
        DatagenApp::Mlr(a) => (
            datagen::GenSpec::Mlr(mlr::GenParams {
                samples: a.samples,
                features: a.features,
                classes: a.classes,
                nnz: a.nnz,
                seed: a.gen_out.seed,
            }),
            a.gen_out,
        ),
        DatagenApp::Nmf(a) => {
            if let Some(src) = &a.from_triplets {
                return convert_triplets(src, &a.gen_out.out);
            }
            (
                datagen::GenSpec::Nmf(nmf::GenParams {
                    rows: a.rows,
                    columns: a.columns,
                    rank: a.rank,
                    density: a.density,
                    noise: a.noise,
                    seed: a.gen_out.seed,
                }),
                a.gen_out,
            )
        }
        DatagenApp::Lda(a) => (
            datagen::GenSpec::Lda(lda::GenParams {
                docs: a.docs,
                vocab: a.vocab,
                topics: a.topics,
                doc_len: a.doc_len,
                alpha: a.alpha,
                beta: a.beta,
                seed: a.gen_out.seed,
            }),
            a.gen_out,
        ),
        DatagenApp::Lasso(a) => (
            datagen::GenSpec::Lasso(lasso::GenParams {
                samples: a.samples,
                features: a.features,
                support: a.support,
                noise: a.noise,
                seed: a.gen_out.seed,
            }),
            a.gen_out,
        ),
    };
    spec.check().map_err(anyhow::Error::msg)?;
    let mut bytes = 0;
    let mut truth = serde_json::Value::Null;
    datagen::write_atomically(&out.out, |w| {
        (bytes, truth) = spec.write(w)?;
        Ok(())
    })?;
    if let Some(path) = &out.truth {
        let text = serde_json::to_string(&truth)?;
        datagen::write_atomically(path, |w| w.write_all(text.as_bytes()))?;
    }
    Ok((bytes, out.out))
}

/// `cruise datagen nmf --from-triplets`: triplets to the row format.
fn convert_triplets(
    src: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<(u64, PathBuf)> {
    let text =
        std::fs::read(src).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", src.display()))?;
    let rows = cruise_container::apps::nmf::triplets_to_rows(&text).map_err(|e| {
        let line = 1 + text[..e.offset.min(text.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        anyhow::anyhow!("{}:{line}: {}", src.display(), e.message)
    })?;
    datagen::write_atomically(out, |w| w.write_all(rows.as_bytes()))?;
    Ok((rows.len() as u64, out.to_path_buf()))
}

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
    if let Some(r) = &s.resumed_from {
        line(
            "resumed",
            format!("from checkpoint {} (epoch {})", r.folder, r.epoch),
        );
    }
    format!("cruise: job {} finished\n{out}", s.job_id)
}
