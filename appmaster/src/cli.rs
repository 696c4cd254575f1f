//! The `cruise` command line: argument definitions and the commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use cruise_conf::{CruiseConfig, Layers};

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
    /// processes on this machine (--runtime local, the default), tasks on a
    /// Mesos cluster (--runtime mesos --master HOST:PORT), or containers of a
    /// YARN service (--runtime yarn). With no arguments: MLR on a generated
    /// data set, 4 containers, 5 epochs.
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
    #[arg(value_enum)]
    pub app: AppArg,
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
    /// Seed (the same seed gives the same file).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output file.
    #[arg(short, long, value_name = "PATH")]
    pub out: PathBuf,
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
    let config = args.conf.load()?;
    let work = datagen::work_dir(&config);
    let input = datagen::prepare_input(&config, &work)?;
    let factory = runtime::foreground_factory(&config)?;
    let summary = run_with(config, input, work, cancel, !args.quiet, factory).await?;
    Ok(summary)
}

/// Runs a job on the local runtime with progress drawn on stderr.
pub async fn run_local(
    config: CruiseConfig,
    input: String,
    work: PathBuf,
    cancel: CancellationToken,
    show_progress: bool,
) -> Result<JobSummary, AmError> {
    let factory = runtime::local_factory(&config);
    run_with(config, input, work, cancel, show_progress, factory).await
}

/// Runs a job with the resource manager `rm` builds, progress drawn on
/// stderr.
pub async fn run_with(
    config: CruiseConfig,
    input: String,
    work: PathBuf,
    cancel: CancellationToken,
    show_progress: bool,
    rm: RmFactory,
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
    };
    let result = am::run_job(opts).await;
    let _ = renderer.await;
    result
}

/// Runs `cruise datagen`.
pub fn datagen(args: DatagenArgs) -> anyhow::Result<u64> {
    match args.app {
        AppArg::Mlr => {
            let p = cruise_container::apps::mlr::GenParams {
                samples: args.samples,
                features: args.features,
                classes: args.classes,
                nnz: args.nnz,
                seed: args.seed,
            };
            if p.features == 0 || p.classes < 2 || p.nnz == 0 {
                anyhow::bail!("--features must be >= 1, --classes >= 2 and --nnz >= 1");
            }
            let mut bytes = 0;
            datagen::write_atomically(&args.out, |w| {
                bytes = cruise_container::apps::mlr::generate(&p, w)?;
                Ok(())
            })?;
            Ok(bytes)
        }
    }
}

/// Formats a summary for people.
pub fn summary_text(s: &JobSummary, config: &CruiseConfig) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "cruise: job {} finished", s.job_id);
    let _ = writeln!(out, "  app            {}", s.app);
    let _ = writeln!(out, "  epochs         {}", s.epochs.len());
    let _ = writeln!(out, "  records        {}", s.records);
    let _ = writeln!(
        out,
        "  final {:<8} {:.4}",
        s.loss_name,
        s.final_stats.mean_loss()
    );
    if s.has_accuracy {
        let _ = writeln!(
            out,
            "  accuracy       {:.2}%",
            100.0 * s.final_stats.accuracy()
        );
    }
    let _ = writeln!(
        out,
        "  wall time      {:.2} s (training {:.2} s)",
        s.wall_secs, s.train_secs
    );
    let sync = match config.job.sync {
        cruise_conf::SyncMode::Async => "async".to_string(),
        cruise_conf::SyncMode::Ssp => format!("ssp, staleness {}", config.job.staleness),
    };
    let _ = writeln!(
        out,
        "  configuration  {} containers: {} workers + {} servers, {sync}, mini-batch {}",
        s.containers, s.workers, s.servers, config.job.mini_batch
    );
    out
}
