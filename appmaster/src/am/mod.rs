//! The application master.
//!
//! [`run_job`] sets a job up (job id and secret, input splits, control
//! listener, status endpoint, resource manager) and then runs the job's event
//! loop (`job::Driver`), which owns all job state: containers, evaluators,
//! block ownership, metrics, the phase of the job. Everything else — the
//! acceptor, one reader per evaluator, the resource manager — sends it typed
//! [`Event`]s. Progress is reported on a channel for the command line to draw,
//! and a status snapshot is published for the status endpoint and tests.

pub mod control;
pub mod history;
mod job;
pub mod metrics;
mod outputs;
pub mod resume;
pub mod snapshot;

pub(crate) use job::role_name;
pub use job::{PlanRecord, plural, split_text};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::{AppKind, CruiseConfig, DeleteCheckpoints};
use cruise_container::evaluator::{ENV_AM_ADDR, ENV_JOB_ID, ENV_JOB_SECRET};
use cruise_container::protocol::{EvalToAm, EvaluatorId, FrameOptions, Secret, Stats};
use cruise_hdfs::{FileSystem, Split, plan_splits};
use cruise_rm::{LaunchSpec, ResourceManager, RmEvent};

use control::ControlFramed;

/// Errors of the AM.
#[derive(Debug, thiserror::Error)]
pub enum AmError {
    /// The configuration cannot be run.
    #[error("{0}")]
    Config(String),
    /// The input cannot be used.
    #[error("input {uri}: {message}")]
    Input {
        /// The input.
        uri: String,
        /// What is wrong.
        message: String,
    },
    /// Local I/O failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The resource manager failed.
    #[error("resource manager: {0}")]
    Rm(#[from] cruise_rm::RmError),
    /// The job failed; the message says which evaluator and why.
    #[error("job failed: {0}")]
    JobFailed(String),
    /// The job was cancelled (Ctrl-C).
    #[error("job cancelled")]
    Cancelled,
    /// The job was cancelled (SIGINT, SIGTERM) before it started; the text
    /// says what it was waiting for.
    #[error("job cancelled while {0}")]
    CancelledWhile(String),
}

/// The role of an evaluator: the optimizer's, so that a plan's roles are
/// the AM's without translation.
pub use cruise_optimizer::Role;

/// One epoch of training, as the AM saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EpochSummary {
    /// 1-based epoch number.
    pub epoch: u32,
    /// Training objective over the epoch's mini-batches (before their updates).
    pub stats: Stats,
    /// Wall time of the epoch, seconds.
    pub secs: f64,
    /// When it ended, seconds after the job started (comparable with a
    /// reconfiguration's `at_secs`).
    pub end_secs: f64,
    /// Workers during the epoch (at its end).
    pub workers: u32,
    /// Servers during the epoch (at its end).
    pub servers: u32,
}

/// One evaluator at the end of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvaluatorSummary {
    /// Its id.
    pub id: EvaluatorId,
    /// Its container.
    pub container: String,
    /// Its process id.
    pub pid: u32,
    /// Its last role.
    pub role: Role,
    /// Peak resident set size it reported, bytes.
    pub peak_rss_bytes: u64,
    /// Most bytes of blocks it held, bytes.
    pub max_store_bytes: u64,
}

/// What a finished job reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSummary {
    /// The job id.
    pub job_id: String,
    /// The app.
    pub app: AppKind,
    /// Name of the app's loss.
    pub loss_name: String,
    /// Whether accuracy is meaningful.
    pub has_accuracy: bool,
    /// Records in the input.
    pub records: u64,
    /// Each epoch.
    pub epochs: Vec<EpochSummary>,
    /// The objective over all input with the final model.
    pub final_stats: Stats,
    /// The objective over the held-out input (`job.eval_input`) with the
    /// final model, if there is held-out input.
    pub eval_stats: Option<Stats>,
    /// The file the final model was written to (`job.model_out`), if any.
    pub model_out: Option<String>,
    /// Wall time from start to finish, seconds.
    pub wall_secs: f64,
    /// Time spent training, seconds.
    pub train_secs: f64,
    /// Containers at the start.
    pub containers: u32,
    /// Workers at the start.
    pub workers: u32,
    /// Servers at the start.
    pub servers: u32,
    /// Peak resident set size of the AM, bytes.
    pub am_peak_rss_bytes: u64,
    /// The evaluators.
    pub evaluators: Vec<EvaluatorSummary>,
    /// Reconfigurations the optimizer made.
    pub reconfigurations: Vec<PlanRecord>,
    /// The emulated cluster the job ran on (mechanism and container
    /// shapes), if any.
    pub emulation: Option<String>,
    /// Evaluators the job lost and went on without, in words (see
    /// `job.max_failures`).
    #[serde(default)]
    pub lost: Vec<String>,
    /// SSP: the workers' clocks and the job's progress rolled back to a
    /// checkpoint after a lost server's blocks were restored from it, in
    /// words, oldest first.
    #[serde(default)]
    pub clock_rollbacks: Vec<String>,
    /// LDA: the model's counts emptied and rebuilt from the workers'
    /// assignments after a loss, in words, oldest first.
    #[serde(default)]
    pub recounts: Vec<String>,
    /// Checkpoints published.
    #[serde(default)]
    pub checkpoints: u64,
    /// The checkpoint the job was resumed from (`cruise run --resume`), if
    /// it was.
    #[serde(default)]
    pub resumed_from: Option<CheckpointInfo>,
    /// Where the job's checkpoints were written (`checkpoint.dir`), if it
    /// took any.
    #[serde(default)]
    pub checkpoint_dir: Option<String>,
    /// Whether they were deleted at the job's end
    /// (`checkpoint.delete_on_success`).
    #[serde(default)]
    pub checkpoints_deleted: bool,
}

/// Progress of a job, for the command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// The job started; where its status endpoint is.
    Started {
        /// Job id.
        job_id: String,
        /// Status endpoint, if any.
        status: Option<SocketAddr>,
        /// Records per epoch are not known yet.
        containers: u32,
    },
    /// A phase began (e.g. "loading input").
    Phase(String),
    /// Training progress within the current epoch.
    Batch {
        /// Current epoch (1-based).
        epoch: u32,
        /// Records processed in it so far.
        done: u64,
        /// Records per epoch.
        total: u64,
        /// Objective so far in this epoch.
        stats: Stats,
        /// Workers now.
        workers: u32,
        /// Servers now.
        servers: u32,
    },
    /// An epoch ended.
    Epoch(EpochSummary),
}

/// The status snapshot published by the AM (served as JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Status {
    /// Job id.
    pub job_id: String,
    /// The AM's control address (evaluators connect here).
    pub am_addr: Option<SocketAddr>,
    /// Phase.
    pub phase: String,
    /// Epochs done.
    pub epochs_done: u32,
    /// Epochs to do.
    pub epochs: u32,
    /// Records per epoch (0 until loaded).
    pub records_per_epoch: u64,
    /// Records processed in total.
    pub records_processed: u64,
    /// The job's members: evaluators a plan deleted or the job lost are
    /// not listed (the lost are in `lost`).
    pub evaluators: Vec<EvaluatorStatus>,
    /// Last epoch.
    pub last_epoch: Option<EpochSummary>,
    /// Why the job failed, if it did.
    pub failure: Option<String>,
    /// Connections refused (e.g. a wrong job secret), most recent last: `address: reason`.
    pub refused: Vec<String>,
    /// Containers the job may hold now.
    pub capacity: u32,
    /// The optimizer's last decision, in words.
    pub optimizer: Option<String>,
    /// The smoothed measurements the optimizer works from.
    pub metrics: metrics::MetricsView,
    /// The optimizer's last look: the predicted epoch time of each split,
    /// `(workers, servers, seconds)`.
    pub splits: Vec<(u32, u32, f64)>,
    /// Reconfigurations so far.
    pub reconfigurations: Vec<PlanRecord>,
    /// The emulated cluster the job runs on (mechanism and container
    /// shapes), if any.
    pub emulation: Option<String>,
    /// Evaluators the job lost and went on without so far, in words.
    #[serde(default)]
    pub lost: Vec<String>,
    /// SSP: clock rollbacks so far, in words (see [`JobSummary`]).
    #[serde(default)]
    pub clock_rollbacks: Vec<String>,
    /// LDA: recounts done so far, in words (see [`JobSummary`]).
    #[serde(default)]
    pub recounts: Vec<String>,
    /// The newest published checkpoint, if any.
    pub checkpoint: Option<CheckpointInfo>,
    /// Checkpoints published so far.
    pub checkpoints: u64,
}

/// A published checkpoint, for the status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointInfo {
    /// Its number.
    pub id: u64,
    /// Epochs the job had completed when it was taken.
    pub epoch: u32,
    /// Its folder.
    pub folder: String,
}

/// One evaluator in the status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvaluatorStatus {
    /// Id.
    pub id: EvaluatorId,
    /// Container.
    pub container: String,
    /// Role.
    pub role: Role,
    /// Process id.
    pub pid: u32,
    /// The host it runs on, as it reported.
    pub host: String,
    /// Data-plane address.
    pub data_addr: Option<SocketAddr>,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Bytes of blocks held.
    pub store_bytes: u64,
    /// Input blocks owned.
    pub input_blocks: u32,
    /// Model blocks owned.
    pub model_blocks: u32,
    /// The local epochs it has completed as a worker, as the AM heard
    /// (its clock, which bounds the others' under SSP).
    pub clock: u32,
}

/// Events of the job's loop.
pub enum Event {
    /// An evaluator connected and proved the secret.
    Accepted {
        /// The container it says it runs in.
        container: String,
        /// The connection.
        framed: Box<ControlFramed>,
        /// Its address.
        remote: SocketAddr,
    },
    /// A connection was refused.
    Refused {
        /// Its address.
        remote: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A message from an evaluator.
    Message {
        /// From.
        eval: EvaluatorId,
        /// The message.
        msg: EvalToAm,
    },
    /// An evaluator's connection ended.
    Disconnected {
        /// Which.
        eval: EvaluatorId,
        /// Why.
        reason: String,
    },
    /// A checkpoint's manifest was published (or not), off the loop.
    CheckpointPublished {
        /// The manifest.
        manifest: Box<cruise_container::checkpoint::Manifest>,
        /// `Err` says why it was not published.
        result: Result<(), String>,
    },
    /// The optimizer decided (off the loop) what to do with the job.
    Decided {
        /// The snapshot it decided on and its decision, or why there is none.
        decided: Result<(Box<cruise_optimizer::Snapshot>, cruise_optimizer::Decision), String>,
        /// The predicted epoch time of each split, `(workers, servers,
        /// seconds)` ([`crate::whatif::split_epochs`]).
        splits: Vec<(u32, u32, f64)>,
    },
}

/// Builds the resource manager once the AM knows how evaluators are launched.
pub type RmFactory = Box<
    dyn FnOnce(
            LaunchSpec,
            mpsc::UnboundedSender<RmEvent>,
        ) -> Result<Arc<dyn ResourceManager>, AmError>
        + Send,
>;

/// How to run a job.
pub struct JobOptions {
    /// The configuration.
    pub config: CruiseConfig,
    /// The input (after generation, if any).
    pub input: String,
    /// Builds the resource manager.
    pub rm: RmFactory,
    /// Progress events go here.
    pub progress: mpsc::UnboundedSender<Progress>,
    /// Status snapshots are published here (the status endpoint reads it).
    pub status: watch::Sender<Status>,
    /// Cancels the job.
    pub cancel: CancellationToken,
    /// Work directory of this job (logs, scratch).
    pub work_dir: PathBuf,
    /// The evaluator command; empty: this executable with `evaluator`.
    pub evaluator_command: Vec<String>,
    /// A new job, or one resumed from its checkpoint.
    pub start: JobStart,
    /// Requests to the running job (the test harness's
    /// [`crate::harness::Cluster::request_roles`]); `None`: none come.
    pub requests: Option<mpsc::UnboundedReceiver<Request>>,
}

/// A request to a running job, answered on its `reply` channel.
#[derive(Debug)]
pub enum Request {
    /// Reconfigure to these roles (evaluator → role; the others keep
    /// theirs), the blocks placed by the solver for them, whatever the
    /// optimizer predicts: a plan chosen from outside. It waits until no
    /// plan, look of the optimizer, recovery or recount is under way, and is
    /// answered with the plan's summary once it started, or why the job did
    /// not start it (training is over, another request is waiting, the
    /// roles fit no partition or are the job's already).
    Roles {
        /// The roles asked for.
        roles: std::collections::BTreeMap<EvaluatorId, Role>,
        /// The answer.
        reply: tokio::sync::oneshot::Sender<Result<String, String>>,
    },
}

/// How a job starts.
#[derive(Debug)]
pub enum JobStart {
    /// A new job under a fresh id.
    New,
    /// A new job under this id: every attempt of a YARN application runs
    /// the same job, named after the application.
    NewAs(String),
    /// The job resumed from its checkpoint (`cruise run --resume`, or a
    /// later attempt of a YARN application).
    Resume(Box<resume::Resume>),
}

/// A fresh job id.
pub fn new_job_id() -> String {
    use rand::Rng;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("job_{ts}_{:04x}", rand::rng().random::<u16>())
}

/// Plans input splits (one input block each) over the input's files.
pub async fn plan_input(fs: &FileSystem, uri: &str, blocks: u32) -> Result<Vec<Split>, AmError> {
    let files = fs.list(uri).await.map_err(|e| AmError::Input {
        uri: uri.to_string(),
        message: e.to_string(),
    })?;
    let splits = plan_splits(&files, blocks as usize);
    if splits.is_empty() {
        return Err(AmError::Input {
            uri: uri.to_string(),
            message: "no data: the input is empty".into(),
        });
    }
    Ok(splits)
}

/// What answers for an input URI, for messages: its file system.
fn input_service(uri: &str) -> String {
    match cruise_hdfs::Location::parse(uri) {
        Ok(cruise_hdfs::Location::Remote {
            scheme, authority, ..
        }) => format!("the WebHDFS namenode of {}://{authority}", scheme.as_str()),
        _ => "the local file system".to_string(),
    }
}

/// The job's input splits, and its outputs (the held-out input's splits,
/// one per initial worker so that they evaluate in parallel, and the
/// model's path).
async fn plan_inputs(
    config: &CruiseConfig,
    input: &str,
) -> Result<(Vec<Split>, outputs::Outputs), AmError> {
    let fs = cruise_container::input_fs::file_system(&config.hdfs);
    let blocks = config
        .store
        .input_blocks_for(config.runtime.capacity_ceiling(&config.job));
    let splits = plan_input(&fs, input, blocks).await?;
    let held_out = if config.job.eval_input.is_empty() {
        Vec::new()
    } else {
        let workers = config.job.initial_split().0.max(1);
        plan_input(&fs, &config.job.eval_input, workers).await?
    };
    let model_out =
        (!config.job.model_out.is_empty()).then(|| PathBuf::from(&config.job.model_out));
    Ok((splits, outputs::Outputs::new(held_out, model_out)))
}

/// How the resource manager starts an evaluator: `command` (this
/// executable's `evaluator` subcommand when empty) with the AM's address,
/// the job's id and secret, and the evaluators' log filter
/// (`CRUISE_EVALUATOR_LOG`, default `info`).
fn evaluator_launch(
    command: &[String],
    am_addr: SocketAddr,
    job_id: &str,
    secret: &Secret,
    work_dir: &Path,
) -> Result<LaunchSpec, AmError> {
    let (program, args) = match command.split_first() {
        Some((p, a)) => (p.clone(), a.to_vec()),
        None => (
            std::env::current_exe()
                .map_err(|source| AmError::Io {
                    context: "locating the cruise executable".into(),
                    source,
                })?
                .display()
                .to_string(),
            vec!["evaluator".to_string()],
        ),
    };
    let mut env = std::collections::BTreeMap::new();
    env.insert(ENV_AM_ADDR.to_string(), am_addr.to_string());
    env.insert(ENV_JOB_ID.to_string(), job_id.to_string());
    env.insert(ENV_JOB_SECRET.to_string(), secret.to_hex());
    env.insert(
        "RUST_LOG".to_string(),
        std::env::var("CRUISE_EVALUATOR_LOG").unwrap_or_else(|_| "info".to_string()),
    );
    Ok(LaunchSpec {
        program,
        args,
        env,
        work_dir: work_dir.to_path_buf(),
    })
}

/// Runs a job to its end.
pub async fn run_job(opts: JobOptions) -> Result<JobSummary, AmError> {
    let mut config = opts.config;
    let (job_id, resumed) = match opts.start {
        JobStart::New => (new_job_id(), None),
        JobStart::NewAs(id) => (id, None),
        JobStart::Resume(r) => (r.job_id.clone(), Some(*r)),
    };
    place_checkpoints(&mut config, &opts.work_dir, &job_id);
    let secret = Secret::generate();
    let (splits, outputs) = plan_or_cancel(&config, &opts.input, &opts.cancel).await?;
    if resumed.is_none() {
        // What `cruise run --resume` reads back if this AM dies.
        resume::persist_config(&opts.work_dir, &job_id, &config, &opts.input)?;
    }
    let (listener, am_addr) = bind_control(&config).await?;

    let tracker = TaskTracker::new();
    let cancel = opts.cancel.child_token();
    let (ev_tx, ev_rx) = mpsc::channel::<Event>(4096);
    tracker.spawn(control::accept_loop(
        listener,
        accept_settings(&config, &job_id, &secret),
        ev_tx.clone(),
        tracker.clone(),
        cancel.clone(),
    ));

    let started = std::time::Instant::now();
    let (history_tx, history_rx) = watch::channel(history::Published::default());
    // A job started afresh under an id that ran before (a later YARN
    // attempt with no checkpoint) keeps the earlier run's history.
    let history_file = match &resumed {
        Some(r) => r.history_file.clone(),
        None => history::fresh_path(&opts.work_dir, &job_id),
    };
    let history = history::spawn_writer(&history_file, started, history_tx, &tracker)?;
    let status_addr = if config.status.bind.is_empty() {
        None
    } else {
        let (status, work_dir) = (&opts.status, &opts.work_dir);
        Some(serve_status(&config, status, history_rx, work_dir, &tracker, &cancel).await?)
    };

    let launch = evaluator_launch(
        &opts.evaluator_command,
        am_addr,
        &job_id,
        &secret,
        &opts.work_dir,
    )?;
    let (rm_tx, rm_rx) = mpsc::unbounded_channel();
    let rm = (opts.rm)(launch, rm_tx)?;
    if let Some(e) = rm.emulation() {
        tracing::info!("emulated cluster: {e}");
    }

    let _ = opts.progress.send(Progress::Started {
        job_id: job_id.clone(),
        status: status_addr,
        containers: config.job.containers,
    });
    tracing::info!(%job_id, %am_addr, ?status_addr, history = %history_file.display(), "AM started");

    let links = job::Links {
        rm: Arc::clone(&rm),
        progress: opts.progress,
        status: opts.status,
        tracker: tracker.clone(),
        events: ev_tx,
        cancel: cancel.clone(),
        history,
    };
    let (checkpoints, hdfs) = (config.checkpoint.clone(), config.hdfs.clone());
    let driver = job::Driver::new(config, job_id, am_addr, splits, links, outputs, resumed);
    let result = driver.run(ev_rx, rm_rx, opts.requests).await;

    if let Err(e) = rm.shutdown().await {
        tracing::warn!("resource manager shutdown: {e}");
    }
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    match result {
        Ok(mut summary) => {
            if checkpoints.enabled {
                summary.checkpoint_dir = Some(checkpoints.dir.clone());
                summary.checkpoints_deleted =
                    delete_checkpoints(&checkpoints, &hdfs, &summary.job_id).await;
            }
            Ok(summary)
        }
        Err(e) => {
            if checkpoints.enabled {
                tracing::warn!(
                    checkpoint_dir = %checkpoints.dir,
                    "the job did not finish; its checkpoints, if it published any, are kept in {}: \
                     `cruise run --resume WORK_DIR` continues a job of `cruise run` from the newest \
                     (a later attempt of a YARN application does by itself)",
                    checkpoints.dir
                );
            }
            Err(e)
        }
    }
}

/// At the successful end of job `job_id`: deletes its checkpoints when
/// `checkpoint.delete_on_success` is `always` (`cruise submit` sets it for
/// the checkpoints it places in the application's staging directory),
/// logging what was deleted, or where they are kept and why. Returns
/// whether they were deleted; a failure to delete is logged, not the
/// job's.
async fn delete_checkpoints(
    checkpoints: &cruise_conf::CheckpointConfig,
    hdfs: &cruise_conf::HdfsConfig,
    job_id: &str,
) -> bool {
    let dir = &checkpoints.dir;
    if checkpoints.delete_on_success != DeleteCheckpoints::Always {
        tracing::info!(
            checkpoint_dir = %dir,
            "job {job_id} finished; its checkpoints are kept in {dir} (checkpoint.delete_on_success = {:?})",
            checkpoints.delete_on_success
        );
        return false;
    }
    let fs = cruise_container::input_fs::file_system(hdfs);
    match cruise_container::checkpoint::delete_all(&fs, dir).await {
        Ok(n) => {
            tracing::info!(
                checkpoint_dir = %dir,
                "job {job_id} finished; deleted its {n} checkpoint(s) in {dir} (checkpoint.delete_on_success = always)"
            );
            true
        }
        Err(e) => {
            tracing::warn!(
                checkpoint_dir = %dir,
                "job {job_id} finished, but deleting its checkpoints in {dir} failed: {e}; delete them by hand"
            );
            false
        }
    }
}

/// Where the job's checkpoints go: `checkpoint.dir`, else a directory of
/// the AM's work directory when the evaluators share its disk (local
/// runtime); elsewhere, without `checkpoint.dir`, no checkpoints.
fn place_checkpoints(config: &mut CruiseConfig, work_dir: &Path, job_id: &str) {
    if config.checkpoint.enabled
        && config.checkpoint.dir.is_empty()
        && config.runtime.kind != cruise_conf::RuntimeKind::Local
    {
        // Evaluators elsewhere do not share the AM's work directory.
        tracing::info!(
            "no checkpoints: checkpoint.dir is not set, and on {} the evaluators do not share the AM's disk (set it to an hdfs:// directory)",
            config.runtime.kind.as_str()
        );
        config.checkpoint.enabled = false;
    } else if config.checkpoint.dir.is_empty() {
        config.checkpoint.dir = work_dir
            .join("checkpoints")
            .join(job_id)
            .display()
            .to_string();
    }
}

/// The input's splits and the job's outputs ([`plan_inputs`]), unless
/// `cancel` comes first: the input's file system may be slow to answer
/// (its own deadlines bound that), and a signal stops the wait.
async fn plan_or_cancel(
    config: &CruiseConfig,
    input: &str,
    cancel: &CancellationToken,
) -> Result<(Vec<Split>, outputs::Outputs), AmError> {
    tokio::select! {
        r = plan_inputs(config, input) => r,
        _ = cancel.cancelled() => {
            Err(AmError::CancelledWhile(format!(
                "planning the input: waiting for {} to list {}",
                input_service(input),
                input
            )))
        }
    }
}

/// The AM's control port (`runtime.am_bind`) and the address evaluators
/// reach it at.
async fn bind_control(config: &CruiseConfig) -> Result<(TcpListener, SocketAddr), AmError> {
    let io = |context: &str| {
        let context = context.to_string();
        move |source| AmError::Io { context, source }
    };
    let listener = TcpListener::bind(&config.runtime.am_bind)
        .await
        .map_err(io(&format!(
            "binding the AM's control port (runtime.am_bind = {})",
            config.runtime.am_bind
        )))?;
    let am_addr = control::advertised(listener.local_addr().map_err(io("control address"))?);
    Ok((listener, am_addr))
}

/// How the control port accepts an evaluator: the job's id and secret,
/// the control channel's frames and handshake deadline.
fn accept_settings(
    config: &CruiseConfig,
    job_id: &str,
    secret: &Secret,
) -> control::AcceptSettings {
    control::AcceptSettings {
        job_id: job_id.to_string(),
        secret: secret.clone(),
        frames: FrameOptions::control(&config.channel),
        timeout: Duration::from_millis(config.channel.connect_timeout_ms),
    }
}

/// Serves the status endpoint on `status.bind`: the job's `status` and
/// `history`, and on the local runtime the containers' logs under
/// `work_dir`; its address.
async fn serve_status(
    config: &CruiseConfig,
    status: &watch::Sender<Status>,
    history: watch::Receiver<history::Published>,
    work_dir: &Path,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Result<SocketAddr, AmError> {
    crate::status::serve(
        &config.status.bind,
        crate::status::Published {
            status: status.subscribe(),
            history,
            logs: (config.runtime.kind == cruise_conf::RuntimeKind::Local)
                .then(|| work_dir.join("containers")),
        },
        tracker,
        cancel.clone(),
    )
    .await
}
