//! The job's event loop: the one owner of job state.
//!
//! Phases: `allocating` (wait for the initial containers to register) →
//! `loading` (assign roles and blocks; servers create model blocks — a
//! resumed job's load them from its checkpoint — workers load input splits) → `training` (workers run; the AM counts records into
//! epochs and, under SSP, releases clocks) → `stopping` (workers finish their
//! mini-batch) → `evaluating` (the objective with the final model) →
//! `evaluating held-out` (only with `job.eval_input`) → `saving model` (only
//! with `job.model_out`: servers send their blocks, the AM writes the file) →
//! `finishing` (evaluators shut down, containers end). A worker lost while
//! training (its process ended, its connection dropped, its heartbeats
//! stopped) is survived (`reconfigure/recovery.rs`), a server's from the
//! newest checkpoint (LDA's: created empty, and the model recounted from
//! the workers' state, `reconfigure/recount.rs`), also while a plan runs
//! (the plan stops); any other loss, a
//! fatal report or a missed heartbeat fails the job with a message that
//! names the evaluator, its container, its process, why it was not
//! survived and — when the resource manager reports it — its exit status
//! and the tail of its stderr.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the [`Driver`]'s state, the loop and its dispatch, the waits for answers ([`Answer`]) |
//! | `members.rs` | containers and evaluators: connecting, registering, liveness, shutting down |
//! | `training.rs` | the phases: loading, epochs and clocks, stopping, evaluating, saving the model |
//! | `status.rs` | the live status and the summary |
//! | `checkpoints.rs` | taking checkpoints: when, who writes, publishing the manifest; the published ones |
//! | `from_checkpoint.rs` | a resumed job (`cruise run --resume`): model blocks loaded from its checkpoint, its progress carried over; under SSP, the clocks and progress rolled back to the checkpoint a lost server's blocks are restored from |
//! | `reconfigure/` | live reconfiguration: the trigger, the running plan and its operations, surviving a lost worker or server |

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::CruiseConfig;
use cruise_container::apps;
use cruise_container::ownership::OwnerTable;
use cruise_container::protocol::{AmToEval, AppParams, EvalToAm, EvaluatorId, Stats};
use cruise_hdfs::Split;
use cruise_rm::{ContainerId, ContainerRequest, ExitStatus, ResourceManager, RmEvent};

use super::history::{HistoryLog, Member};
use super::outputs::Outputs;
use super::{AmError, EpochSummary, Event, JobSummary, Progress, Role, Status};

mod checkpoints;
mod from_checkpoint;
mod members;
mod reconfigure;
mod status;
mod training;

pub use reconfigure::PlanRecord;
use reconfigure::Reconfig;

/// How long to wait for the resource manager to report the exit status of a
/// lost evaluator before failing the job without it.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(3);

/// How often, at most, a job still waiting for its first containers says so.
const ALLOCATION_NOTE_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Allocating,
    Loading,
    Training,
    Stopping,
    Evaluating,
    EvaluatingHeldOut,
    SavingModel,
    Finishing,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Allocating => "allocating",
            Phase::Loading => "loading",
            Phase::Training => "training",
            Phase::Stopping => "stopping",
            Phase::Evaluating => "evaluating",
            Phase::EvaluatingHeldOut => "evaluating held-out",
            Phase::SavingModel => "saving model",
            Phase::Finishing => "finishing",
        }
    }
}

struct Evaluator {
    id: EvaluatorId,
    container: ContainerId,
    tx: mpsc::Sender<AmToEval>,
    conn_cancel: CancellationToken,
    data_addr: Option<SocketAddr>,
    pid: u32,
    host: String,
    role: Role,
    last_heard: Instant,
    rss: u64,
    peak_rss: u64,
    store_bytes: u64,
    max_store_bytes: u64,
    clock: u32,
    /// The clock rollback its worker task's reports belong to: the one
    /// current when the task started, or the last it said it took
    /// (`ClockRolledBack`). Reports of an earlier one are of local epochs
    /// abandoned, and not counted.
    rollback: u32,
    /// The answer the AM waits for from it, in a phase that waits for
    /// every evaluator it asked.
    awaiting: Option<Answer>,
    connected: bool,
    /// Left the job (deleted by a reconfiguration).
    gone: bool,
    /// Newest ownership version it has applied.
    acked_version: u64,
}

impl Evaluator {
    /// Records the memory figures of a heartbeat.
    fn heard_memory(&mut self, rss: u64, peak_rss: u64, store_bytes: u64) {
        self.rss = rss;
        self.peak_rss = self.peak_rss.max(peak_rss);
        self.store_bytes = store_bytes;
        self.max_store_bytes = self.max_store_bytes.max(store_bytes);
    }
}

#[derive(Default)]
struct Container {
    /// How its process ended, once the resource manager said.
    ended: Option<Ended>,
    evaluator: Option<EvaluatorId>,
}

/// An answer the AM waits for from each evaluator it asked, before the
/// phase moves on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Loading: a server has created its model blocks.
    BlocksCreated,
    /// Loading: a worker has read its input blocks.
    InputLoaded,
    /// Stopping: a worker's task has stopped.
    WorkerStopped,
    /// Evaluating: a worker's metrics over its input.
    Evaluation,
    /// Evaluating held-out input: a worker's metrics over its splits.
    HeldOutEvaluation,
    /// Saving the model: a server has sent all of its part.
    ModelDumped,
}

/// How a container's process ended, as its resource manager reported it.
#[derive(Clone)]
struct Ended {
    exit: ExitStatus,
    diagnostics: String,
}

/// An evaluator whose connection was lost, while the AM waits for its
/// container's exit status to say why.
struct PendingLoss {
    eval: EvaluatorId,
    reason: String,
    since: Instant,
}

/// An evaluator that reported a fatal failure, while the AM waits briefly
/// for the loss that may have caused it (a worker's request to a server
/// that was killed fails before the AM hears of the server): the job's
/// failure then names that loss first.
struct PendingFatal {
    eval: EvaluatorId,
    error: String,
    since: Instant,
}

/// What the job's loop talks to outside itself: the resource manager, the
/// channels it reports on, the tasks it spawns and their events, the
/// cancellation that ends it, and the job's history.
pub(super) struct Links {
    pub(super) rm: Arc<dyn ResourceManager>,
    /// Progress for people (the CLI's lines and bars).
    pub(super) progress: mpsc::UnboundedSender<Progress>,
    /// The live status the status port serves.
    pub(super) status: watch::Sender<Status>,
    /// The job's tasks (connections, plans' helpers).
    pub(super) tracker: TaskTracker,
    /// Where those tasks send what they learn.
    pub(super) events: mpsc::Sender<Event>,
    pub(super) cancel: CancellationToken,
    /// The job's history (records for the file and the web UI).
    pub(super) history: HistoryLog,
}

/// The owner of the job's state.
pub(super) struct Driver {
    config: CruiseConfig,
    job_id: String,
    am_addr: SocketAddr,
    refused: Vec<String>,
    params: AppParams,
    loss_name: &'static str,
    has_accuracy: bool,
    splits: Vec<Split>,
    /// What the loop talks to outside itself.
    links: Links,

    phase: Phase,
    started: Instant,
    /// When the job entered [`Phase::Finishing`].
    finishing_since: Option<Instant>,
    /// When the job last said it still waits for its first containers.
    allocation_noted: Option<Instant>,
    evaluators: BTreeMap<EvaluatorId, Evaluator>,
    containers: HashMap<ContainerId, Container>,
    next_eval: EvaluatorId,
    /// Who owns each block; its version is what evaluators acknowledge.
    owners: OwnerTable,

    records_per_epoch: u64,
    records_done: u64,
    epochs: Vec<EpochSummary>,
    window: Stats,
    epoch_started: Instant,
    train_started: Option<Instant>,
    train_secs: f64,
    last_batch_progress: Instant,
    min_clock_sent: u32,
    /// SSP: the clock rollbacks so far, in words (the number is the
    /// current rollback's, `from_checkpoint.rs`).
    clock_rollbacks: Vec<String>,
    final_stats: Stats,
    /// Held-out evaluation and the model file.
    outputs: Outputs,
    initial_split: (u32, u32),
    /// A lost evaluator whose exit status we are waiting for.
    pending_loss: Option<PendingLoss>,
    /// A fatal report whose cause the AM is waiting to hear of.
    pending_fatal: Option<PendingFatal>,
    /// Measurements and live reconfiguration.
    rc: Reconfig,
    /// The emulated cluster, in words (from the resource manager).
    emulation: Option<String>,
    /// The members and roles last recorded in the history.
    recorded_members: Vec<Member>,
    /// The app (for its derived metric), once built.
    app: Option<Arc<dyn apps::App>>,
    /// Checkpoints taken and published.
    ck: checkpoints::Checkpoints,
    /// Where a resumed job resumes from (`None`: a new job).
    resume: Option<crate::am::resume::Resume>,
}

impl Driver {
    pub(super) fn new(
        config: CruiseConfig,
        job_id: String,
        am_addr: SocketAddr,
        splits: Vec<Split>,
        links: Links,
        outputs: Outputs,
        resume: Option<crate::am::resume::Resume>,
    ) -> Self {
        let now = links.history.started();
        let initial_split = config.job.initial_split();
        let config_for_rc = config.clone();
        let emulation = links.rm.emulation();
        Driver {
            params: AppParams {
                value_len: 0,
                model_keys: 0,
                extra: Vec::new(),
            },
            loss_name: "loss",
            has_accuracy: false,
            config,
            job_id,
            am_addr,
            refused: Vec::new(),
            splits,
            links,
            phase: Phase::Allocating,
            started: now,
            finishing_since: None,
            allocation_noted: None,
            evaluators: BTreeMap::new(),
            containers: HashMap::new(),
            next_eval: EvaluatorId(1),
            owners: OwnerTable::new(),
            records_per_epoch: 0,
            records_done: 0,
            epochs: Vec::new(),
            window: Stats::default(),
            epoch_started: now,
            train_started: None,
            train_secs: 0.0,
            last_batch_progress: now,
            min_clock_sent: 0,
            clock_rollbacks: Vec::new(),
            final_stats: Stats::default(),
            outputs,
            initial_split,
            pending_loss: None,
            pending_fatal: None,
            rc: Reconfig::new(&config_for_rc),
            emulation,
            recorded_members: Vec::new(),
            app: None,
            ck: checkpoints::Checkpoints::new(
                cruise_container::input_fs::file_system(&config_for_rc.hdfs),
                resume
                    .as_ref()
                    .map(|r| (r.manifest.clone(), r.next_checkpoint)),
            ),
            resume,
        }
    }

    pub(super) async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut rm_events: mpsc::UnboundedReceiver<RmEvent>,
        mut requests: Option<mpsc::UnboundedReceiver<crate::am::Request>>,
    ) -> Result<JobSummary, AmError> {
        let r = match self
            .run_inner(&mut events, &mut rm_events, &mut requests)
            .await
        {
            // Cancelling closes the control connections, and the evaluators
            // exit because of it: whichever of those events the loop saw
            // before the cancellation itself, the cause is the cancellation.
            Err(e) if self.links.cancel.is_cancelled() && !matches!(e, AmError::Cancelled) => {
                tracing::debug!("after the job was cancelled: {e}");
                Err(AmError::Cancelled)
            }
            // A failure that came with an evaluator's fatal report still
            // pending: the report is what the failure caused.
            Err(AmError::JobFailed(m)) => {
                Err(AmError::JobFailed(match self.pending_fatal.take() {
                    Some(f) => format!("{m}; then {} failed: {}", self.describe(f.eval), f.error),
                    None => m,
                }))
            }
            r => r,
        };
        let r = match r {
            Ok(()) => Ok(self.summary()),
            Err(e) => {
                let reason = e.to_string();
                self.publish_status(Some(reason.clone()));
                self.shutdown_all(&reason).await;
                Err(e)
            }
        };
        self.record_end(r.as_ref().err());
        for e in self.evaluators.values() {
            e.conn_cancel.cancel();
        }
        r
    }

    async fn run_inner(
        &mut self,
        events: &mut mpsc::Receiver<Event>,
        rm_events: &mut mpsc::UnboundedReceiver<RmEvent>,
        requests: &mut Option<mpsc::UnboundedReceiver<crate::am::Request>>,
    ) -> Result<(), AmError> {
        self.params = apps::params(&self.config).map_err(|e| AmError::Config(e.to_string()))?;
        let app =
            apps::build(&self.config, &self.params).map_err(|e| AmError::Config(e.to_string()))?;
        self.loss_name = app.loss_name();
        self.has_accuracy = app.has_accuracy();
        self.record_start();
        self.app = Some(app);
        let n = self.config.job.containers;
        self.phase(Phase::Allocating, format!("allocating {n} containers"));
        self.links
            .rm
            .request(ContainerRequest {
                count: n,
                memory_mb: self.config.runtime.container_memory_mb,
                cores: self.config.runtime.container_cores,
                hosts: Vec::new(),
            })
            .await?;
        let hb = Duration::from_millis(self.config.channel.heartbeat_interval_ms);
        // The tick also checks for slow plans: a report period shorter than
        // the tick is honoured (down to 10 ms).
        let slow_plan = Duration::from_secs_f64(self.config.optimizer.slow_plan_report_secs)
            .max(Duration::from_millis(10));
        let mut tick = tokio::time::interval(hb.min(Duration::from_millis(250)).min(slow_plan));
        let mut last_hb_sent = Instant::now();
        loop {
            tokio::select! {
                _ = self.links.cancel.cancelled() => return Err(AmError::Cancelled),
                Some(ev) = rm_events.recv() => self.on_rm(ev).await?,
                Some(ev) = events.recv() => self.on_event(ev).await?,
                r = next_request(requests) => match r {
                    Some(r) => self.on_request(r),
                    // Nobody can ask any more.
                    None => *requests = None,
                },
                _ = tick.tick() => {
                    if last_hb_sent.elapsed() >= hb {
                        last_hb_sent = Instant::now();
                        for e in self.evaluators.values().filter(|e| e.connected) {
                            let _ = e.tx.try_send(AmToEval::Heartbeat);
                        }
                    }
                    self.check_time().await?;
                    self.expire_start_probes().await?;
                    self.expire_adds();
                    self.report_slow_plan();
                    self.expire_ops();
                    self.expire_checkpoint();
                    self.expire_recount()?;
                    self.maybe_checkpoint().await;
                    self.maybe_reconfigure();
                    self.publish_status(None);
                }
            }
            self.step_plan().await?;
            self.step_recount().await;
            self.step_deferred_stop().await;
            self.step_request();
            if self.phase == Phase::Finishing
                && (self.all_containers_done() || self.finishing_overdue())
            {
                return Ok(());
            }
        }
    }

    fn phase(&mut self, p: Phase, text: String) {
        if p == Phase::Finishing && self.phase != Phase::Finishing {
            self.finishing_since = Some(Instant::now());
        }
        self.phase = p;
        // People read phases from the progress channel (its lines go to
        // the same stderr): logged at debug, they are not said twice.
        tracing::debug!(phase = p.name(), "{text}");
        let _ = self.links.progress.send(Progress::Phase(text));
        self.publish_status(None);
    }

    fn role_counts(&self) -> (u32, u32) {
        let count = |role| self.evaluators.values().filter(|e| e.role == role).count() as u32;
        (count(Role::Worker), count(Role::Server))
    }

    /// The evaluators in `role`, by id.
    fn with_role(&self, role: Role) -> Vec<EvaluatorId> {
        self.evaluators
            .values()
            .filter(|e| e.role == role)
            .map(|e| e.id)
            .collect()
    }

    async fn on_event(&mut self, ev: Event) -> Result<(), AmError> {
        match ev {
            Event::Refused { remote, reason } => {
                tracing::warn!("refused a control connection from {remote}: {reason}");
                self.refused.push(format!("{remote}: {reason}"));
                if self.refused.len() > 16 {
                    self.refused.remove(0);
                }
                self.publish_status(None);
            }
            Event::Accepted {
                container,
                framed,
                remote,
            } => self.accept(container, *framed, remote).await?,
            Event::Disconnected { eval, reason } => {
                let Some(e) = self.evaluators.get_mut(&eval) else {
                    return Ok(());
                };
                e.connected = false;
                if self.phase == Phase::Finishing
                    || e.gone
                    || self.rc.is_leaving(eval)
                    || self.pending_fatal.as_ref().is_some_and(|f| f.eval == eval)
                {
                    return Ok(());
                }
                let container = e.container.clone();
                let ended = self
                    .containers
                    .get(&container)
                    .and_then(|c| c.ended.clone());
                let cause = match &ended {
                    Some(ended) => format!(
                        "{reason}; its process ended: {}{}",
                        ended.exit,
                        stderr_note(&ended.diagnostics)
                    ),
                    None => reason.clone(),
                };
                let Err(why_not) = self.try_survive(eval, &cause).await else {
                    return Ok(());
                };
                if ended.is_some() {
                    return Err(AmError::JobFailed(format!(
                        "{} lost: {cause} (not survived: {why_not})",
                        self.describe(eval),
                    )));
                }
                tracing::warn!("{} disconnected: {reason}", self.describe(eval));
                self.pending_loss = Some(PendingLoss {
                    eval,
                    reason,
                    since: Instant::now(),
                });
            }
            Event::Message { eval, msg } => self.on_message(eval, msg).await?,
            Event::Decided { decided, splits } => self.on_decided(decided, splits),
            Event::CheckpointPublished { manifest, result } => {
                self.on_checkpoint_published(*manifest, result)
            }
        }
        Ok(())
    }

    async fn send(&self, id: EvaluatorId, msg: AmToEval) {
        if let Some(e) = self.evaluators.get(&id)
            && e.tx.send(msg).await.is_err()
        {
            tracing::debug!("evaluator {id}: control channel closed");
        }
    }

    /// Sends `msg` to `id` and waits for its `answer` (see [`Answer`]).
    async fn ask(&mut self, id: EvaluatorId, msg: AmToEval, answer: Answer) {
        if let Some(e) = self.evaluators.get_mut(&id) {
            e.awaiting = Some(answer);
        }
        self.send(id, msg).await;
    }

    /// Takes `id`'s `answer`: whether the AM was waiting for it. An answer
    /// nobody waits for (late, or of another phase) is ignored.
    fn answered(&mut self, id: EvaluatorId, answer: Answer) -> bool {
        match self.evaluators.get_mut(&id) {
            Some(e) if e.awaiting == Some(answer) => {
                e.awaiting = None;
                true
            }
            _ => false,
        }
    }

    /// Whether every evaluator asked has answered.
    fn all_answered(&self) -> bool {
        self.evaluators.values().all(|e| e.awaiting.is_none())
    }

    /// Hands a message of evaluator `id` to the part of the job it
    /// concerns. Messages of an evaluator no longer known are dropped.
    async fn on_message(&mut self, id: EvaluatorId, msg: EvalToAm) -> Result<(), AmError> {
        let current_rollback = self.current_rollback();
        let Some(e) = self.evaluators.get_mut(&id) else {
            return Ok(());
        };
        e.last_heard = Instant::now();
        match msg {
            EvalToAm::Register {
                data_addr,
                pid,
                host,
                cpu_speed,
            } => {
                self.on_registered(id, data_addr, pid, &host, cpu_speed)
                    .await?
            }
            EvalToAm::Heartbeat {
                rss_bytes,
                peak_rss_bytes,
                store_bytes,
            } => e.heard_memory(rss_bytes, peak_rss_bytes, store_bytes),
            EvalToAm::OwnershipApplied { version } => self.on_ownership_applied(id, version).await,
            EvalToAm::BlocksCreated { .. } => self.on_blocks_created(id).await?,
            EvalToAm::InputLoaded { blocks } => self.on_input_loaded(id, blocks).await?,
            EvalToAm::InputDropped { blocks } => self.on_input_dropped(id, blocks).await,
            EvalToAm::TaskStarted { task } => {
                tracing::debug!(evaluator = %id, ?task, "task started");
            }
            EvalToAm::TaskStopped { task } => self.on_task_stopped(id, task).await,
            EvalToAm::MiniBatch(r) => self.on_mini_batch_report(id, r).await,
            EvalToAm::ServerReport(r) => self.rc.metrics.server(id, &r),
            EvalToAm::ClockTick { clock } => {
                // A tick of local epochs a rollback abandoned is not counted.
                if e.rollback == current_rollback {
                    e.clock = clock;
                    self.release_clocks().await;
                }
            }
            EvalToAm::ClockRolledBack { rollback, clock } => {
                self.on_clock_rolled_back(id, rollback, clock).await
            }
            EvalToAm::RecountHeld { recount } => self.on_recount_held(id, recount).await,
            EvalToAm::ModelZeroed { recount, blocks } => {
                self.on_model_zeroed(id, recount, blocks).await
            }
            EvalToAm::Evaluation(stats) => self.on_evaluation(id, &stats).await?,
            EvalToAm::HeldOutEvaluation(stats) => self.on_held_out_evaluation(id, &stats).await?,
            EvalToAm::ModelPart { keys, values } => self.on_model_part(id, keys, values)?,
            EvalToAm::ModelDumped { .. } => self.on_model_dumped(id).await?,
            EvalToAm::BlockMoved {
                move_id,
                table,
                block,
                to,
                bytes,
            } => {
                self.on_block_moved(move_id, table, block, to, bytes)
                    .await?
            }
            EvalToAm::MoveFinished {
                move_id,
                result,
                secs,
            } => self.on_move_finished(move_id, result, secs),
            EvalToAm::BandwidthProbe { to, bytes, secs } => {
                self.on_probe_measured(id, to, bytes, secs).await?
            }
            EvalToAm::ProbeFailed { to, error } => self.on_probe_failed(id, to, &error).await?,
            EvalToAm::CheckpointWritten { id: ck, result } => {
                self.on_checkpoint_written(id, ck, result)
            }
            EvalToAm::BlocksRestored { folder, result, .. } if self.phase == Phase::Loading => {
                self.on_checkpoint_loaded(id, &folder, result).await?
            }
            EvalToAm::BlocksRestored {
                folder,
                blocks,
                result,
            } => self.on_blocks_restored(id, folder, blocks, result).await?,
            EvalToAm::Fatal { error } => self.on_fatal(id, error),
        }
        Ok(())
    }
}

/// Removes and returns the first item of `list` that `matches`; the last
/// item takes its place.
/// The next request to the job; never, when none can come.
async fn next_request(
    requests: &mut Option<mpsc::UnboundedReceiver<crate::am::Request>>,
) -> Option<crate::am::Request> {
    match requests {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

fn take_first<T>(list: &mut Vec<T>, matches: impl FnMut(&T) -> bool) -> Option<T> {
    let i = list.iter().position(matches)?;
    Some(list.swap_remove(i))
}

/// Container ids in the order they were started: by the text before their
/// trailing number, then by that number (`c_9` before `c_10`).
fn start_order(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (head, tail) = s.split_at(s.len() - digits);
        (head.to_string(), tail.parse::<u128>().unwrap_or(0))
    };
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

/// "1 worker", "3 workers".
pub fn plural(n: u32, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// "3 workers, 1 server".
pub fn split_text(w: u32, s: u32) -> String {
    format!("{}, {}", plural(w, "worker"), plural(s, "server"))
}

/// A role as the status, the history and the pages name it.
pub(crate) fn role_name(r: Role) -> &'static str {
    match r {
        Role::Idle => "idle",
        Role::Worker => "worker",
        Role::Server => "server",
    }
}

fn stderr_note(diag: &str) -> String {
    let diag = diag.trim();
    if diag.is_empty() {
        String::new()
    } else {
        let lines: Vec<&str> = diag.lines().collect();
        let tail = &lines[lines.len().saturating_sub(5)..];
        format!("; stderr ends with:\n  {}", tail.join("\n  "))
    }
}

#[cfg(test)]
mod tests {
    use super::start_order;

    #[test]
    fn containers_sort_in_start_order() {
        let mut ids = vec![
            "task_10",
            "task_9",
            "container_17_000002",
            "container_17_000001",
            "task_1",
        ];
        ids.sort_by(|a, b| start_order(a, b));
        assert_eq!(
            ids,
            vec![
                "container_17_000001",
                "container_17_000002",
                "task_1",
                "task_9",
                "task_10"
            ]
        );
    }
}
