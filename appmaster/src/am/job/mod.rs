//! The job's event loop: the one owner of job state.
//!
//! Phases: `allocating` (wait for the initial containers to register) →
//! `loading` (assign roles and blocks; servers create model blocks, workers
//! load input splits) → `training` (workers run; the AM counts records into
//! epochs and, under SSP, releases clocks) → `stopping` (workers finish their
//! mini-batch) → `evaluating` (the objective with the final model) →
//! `evaluating held-out` (only with `job.eval_input`) → `saving model` (only
//! with `job.model_out`: servers send their blocks, the AM writes the file) →
//! `finishing` (evaluators shut down, containers end). Any lost evaluator,
//! fatal report or missed heartbeat fails the job with a message that names
//! the evaluator, its container, its process and — when the resource manager
//! reports it — its exit status and the tail of its stderr.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::{CruiseConfig, SyncMode};
use cruise_container::apps;
use cruise_container::os;
use cruise_container::ownership::OwnerTable;
use cruise_container::protocol::{
    AmToEval, AppParams, BlockId, EvalToAm, EvaluatorId, Faults, INPUT_TABLE, JobSetup,
    MODEL_TABLE, STATE_TABLE, Stats, TaskKind, WorkerTask,
};
use cruise_hdfs::Split;
use cruise_rm::{ContainerId, ContainerRequest, ExitStatus, ResourceManager, RmEvent};

use super::outputs::Outputs;
use super::{
    AmError, EpochSummary, EvaluatorStatus, EvaluatorSummary, Event, JobSummary, Progress, Role,
    Status, control,
};

mod reconfigure;

pub use reconfigure::PlanRecord;
use reconfigure::Reconfig;

/// How long to wait for the resource manager to report the exit status of a
/// lost evaluator before failing the job without it.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(3);

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
    role: Role,
    last_heard: Instant,
    rss: u64,
    peak_rss: u64,
    store_bytes: u64,
    max_store_bytes: u64,
    clock: u32,
    /// The answer the AM waits for from it, in a phase that waits for
    /// every evaluator it asked.
    awaiting: Option<Answer>,
    connected: bool,
    /// Left the job (deleted by a reconfiguration).
    gone: bool,
    /// Newest ownership version it has applied.
    acked_version: u64,
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
    rm: Arc<dyn ResourceManager>,
    progress: mpsc::UnboundedSender<Progress>,
    status: watch::Sender<Status>,
    tracker: TaskTracker,
    events: mpsc::Sender<Event>,
    cancel: CancellationToken,

    phase: Phase,
    started: Instant,
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
    final_stats: Stats,
    /// Held-out evaluation and the model file.
    outputs: Outputs,
    initial_split: (u32, u32),
    /// A lost evaluator whose exit status we are waiting for.
    pending_loss: Option<PendingLoss>,
    /// Measurements and live reconfiguration.
    rc: Reconfig,
    /// The emulated cluster, in words (from the resource manager).
    emulation: Option<String>,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: CruiseConfig,
        job_id: String,
        am_addr: SocketAddr,
        splits: Vec<Split>,
        rm: Arc<dyn ResourceManager>,
        progress: mpsc::UnboundedSender<Progress>,
        status: watch::Sender<Status>,
        tracker: TaskTracker,
        events: mpsc::Sender<Event>,
        cancel: CancellationToken,
        outputs: Outputs,
    ) -> Self {
        let now = Instant::now();
        let initial_split = config.job.initial_split();
        let config_for_rc = config.clone();
        let emulation = rm.emulation();
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
            rm,
            progress,
            status,
            tracker,
            events,
            cancel,
            phase: Phase::Allocating,
            started: now,
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
            final_stats: Stats::default(),
            outputs,
            initial_split,
            pending_loss: None,
            rc: Reconfig::new(&config_for_rc),
            emulation,
        }
    }

    pub(super) async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut rm_events: mpsc::UnboundedReceiver<RmEvent>,
    ) -> Result<JobSummary, AmError> {
        let r = match self.run_inner(&mut events, &mut rm_events).await {
            // Cancelling closes the control connections, and the evaluators
            // exit because of it: whichever of those events the loop saw
            // before the cancellation itself, the cause is the cancellation.
            Err(e) if self.cancel.is_cancelled() && !matches!(e, AmError::Cancelled) => {
                tracing::debug!("after the job was cancelled: {e}");
                Err(AmError::Cancelled)
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
        for e in self.evaluators.values() {
            e.conn_cancel.cancel();
        }
        r
    }

    async fn run_inner(
        &mut self,
        events: &mut mpsc::Receiver<Event>,
        rm_events: &mut mpsc::UnboundedReceiver<RmEvent>,
    ) -> Result<(), AmError> {
        self.params = apps::params(&self.config).map_err(|e| AmError::Config(e.to_string()))?;
        let app =
            apps::build(&self.config, &self.params).map_err(|e| AmError::Config(e.to_string()))?;
        self.loss_name = app.loss_name();
        self.has_accuracy = app.has_accuracy();
        let n = self.config.job.containers;
        self.phase(Phase::Allocating, format!("allocating {n} containers"));
        self.rm
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
                _ = self.cancel.cancelled() => return Err(AmError::Cancelled),
                Some(ev) = rm_events.recv() => self.on_rm(ev).await?,
                Some(ev) = events.recv() => self.on_event(ev).await?,
                _ = tick.tick() => {
                    if last_hb_sent.elapsed() >= hb {
                        last_hb_sent = Instant::now();
                        for e in self.evaluators.values().filter(|e| e.connected) {
                            let _ = e.tx.try_send(AmToEval::Heartbeat);
                        }
                    }
                    self.check_time()?;
                    self.expire_start_probes().await?;
                    self.expire_adds();
                    self.report_slow_plan();
                    self.maybe_reconfigure();
                    self.publish_status(None);
                }
            }
            self.step_plan().await?;
            if self.phase == Phase::Finishing && self.all_containers_done() {
                return Ok(());
            }
        }
    }

    fn phase(&mut self, p: Phase, text: String) {
        self.phase = p;
        tracing::info!(phase = p.name(), "{text}");
        let _ = self.progress.send(Progress::Phase(text));
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

    fn describe(&self, id: EvaluatorId) -> String {
        match self.evaluators.get(&id) {
            Some(e) => format!(
                "evaluator {id} ({}, container {}, pid {})",
                role_name(e.role),
                e.container,
                e.pid
            ),
            None => format!("evaluator {id}"),
        }
    }

    fn check_time(&mut self) -> Result<(), AmError> {
        if let Some(loss) = &self.pending_loss
            && loss.since.elapsed() >= EXIT_STATUS_WAIT
        {
            return Err(AmError::JobFailed(format!(
                "{} lost: {}; the resource manager has not reported its exit status",
                self.describe(loss.eval),
                loss.reason
            )));
        }
        let timeout = Duration::from_millis(self.config.channel.heartbeat_timeout_ms);
        if self.phase != Phase::Finishing {
            for e in self.evaluators.values().filter(|e| e.connected) {
                if e.last_heard.elapsed() > timeout {
                    return Err(AmError::JobFailed(format!(
                        "{} sent nothing for {:.1} s (channel.heartbeat_timeout_ms = {})",
                        self.describe(e.id),
                        e.last_heard.elapsed().as_secs_f64(),
                        timeout.as_millis()
                    )));
                }
            }
        }
        if self.phase == Phase::Allocating {
            let limit = Duration::from_millis(self.config.runtime.allocation_timeout_ms);
            if self.started.elapsed() > limit {
                return Err(AmError::JobFailed(format!(
                    "only {} of {} containers registered within {:.0} s (runtime.allocation_timeout_ms)",
                    self.evaluators.len(),
                    self.config.job.containers,
                    limit.as_secs_f64()
                )));
            }
        }
        Ok(())
    }

    async fn on_rm(&mut self, ev: RmEvent) -> Result<(), AmError> {
        match ev {
            RmEvent::Allocated { container, host } => {
                tracing::debug!(%container, %host, "container allocated");
                self.containers.entry(container).or_default();
            }
            RmEvent::Running { container, pid } => {
                tracing::debug!(%container, ?pid, "container running");
            }
            RmEvent::Completed {
                container,
                exit,
                diagnostics,
                released: _,
            } => {
                self.containers.entry(container.clone()).or_default().ended = Some(Ended {
                    exit,
                    diagnostics: diagnostics.clone(),
                });
                if self.phase == Phase::Finishing || self.on_container_ended(&container).await {
                    return Ok(());
                }
                let c = self.containers.entry(container.clone()).or_default();
                let what = match c.evaluator {
                    Some(id) => self.describe(id),
                    None => format!("container {container} (before its evaluator registered)"),
                };
                let reason = match self.pending_loss.take() {
                    Some(loss) => format!("{}; ", loss.reason),
                    None => String::new(),
                };
                return Err(AmError::JobFailed(format!(
                    "{what} lost: {reason}its process ended: {exit}{}",
                    stderr_note(&diagnostics)
                )));
            }
            RmEvent::AllocationFailed { reason } => {
                if !self.on_allocation_failed(&reason) {
                    return Err(AmError::JobFailed(format!(
                        "container allocation failed: {reason}"
                    )));
                }
            }
            RmEvent::CapacityChanged { max_containers } => self.on_capacity(max_containers),
        }
        Ok(())
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
                if self.phase == Phase::Finishing || e.gone || self.rc.is_leaving(eval) {
                    return Ok(());
                }
                let container = e.container.clone();
                if let Some(ended) = self
                    .containers
                    .get(&container)
                    .and_then(|c| c.ended.clone())
                {
                    return Err(AmError::JobFailed(format!(
                        "{} lost: {reason}; its process ended: {}{}",
                        self.describe(eval),
                        ended.exit,
                        stderr_note(&ended.diagnostics)
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
            Event::Decided { decided } => self.on_decided(decided),
        }
        Ok(())
    }

    async fn accept(
        &mut self,
        container: ContainerId,
        framed: control::ControlFramed,
        remote: SocketAddr,
    ) -> Result<(), AmError> {
        if self.phase == Phase::Finishing {
            return Ok(());
        }
        if self
            .containers
            .get(&container)
            .is_some_and(|c| c.evaluator.is_some())
        {
            tracing::warn!(
                "container {container} connected twice (from {remote}); ignoring the second"
            );
            return Ok(());
        }
        let id = self.next_eval;
        self.next_eval.0 += 1;
        let (sink, stream) = framed.split();
        let conn_cancel = self.cancel.child_token();
        let faults = Faults::default();
        let (tx, _writer) = cruise_container::protocol::spawn_writer(
            sink,
            4096,
            faults.clone(),
            conn_cancel.clone(),
            &self.tracker,
            format!("control channel to evaluator {id}"),
        );
        self.tracker.spawn(control::read_loop(
            id,
            stream,
            self.events.clone(),
            faults,
            conn_cancel.clone(),
        ));
        self.containers
            .entry(container.clone())
            .or_default()
            .evaluator = Some(id);
        self.evaluators.insert(
            id,
            Evaluator {
                id,
                container,
                tx,
                conn_cancel,
                data_addr: None,
                pid: 0,
                role: Role::Idle,
                last_heard: Instant::now(),
                rss: 0,
                peak_rss: 0,
                store_bytes: 0,
                max_store_bytes: 0,
                clock: 0,
                awaiting: None,
                connected: true,
                gone: false,
                acked_version: 0,
            },
        );
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

    async fn on_message(&mut self, id: EvaluatorId, msg: EvalToAm) -> Result<(), AmError> {
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
            } => {
                e.rss = rss_bytes;
                e.peak_rss = e.peak_rss.max(peak_rss_bytes);
                e.store_bytes = store_bytes;
                e.max_store_bytes = e.max_store_bytes.max(store_bytes);
            }
            EvalToAm::OwnershipApplied { version } => self.on_ownership_applied(id, version).await,
            EvalToAm::BlocksCreated { .. } => {
                if self.answered(id, Answer::BlocksCreated) {
                    self.maybe_start_training().await?;
                }
            }
            EvalToAm::InputLoaded { blocks } => self.on_input_loaded(id, blocks).await?,
            EvalToAm::InputDropped { blocks } => self.on_input_dropped(id, blocks).await,
            EvalToAm::TaskStarted { task } => {
                tracing::debug!(evaluator = %id, ?task, "task started");
            }
            EvalToAm::TaskStopped { task } => {
                if self.phase == Phase::Training {
                    self.on_task_stopped_in_training(id, task).await;
                } else if task == TaskKind::Worker
                    && self.answered(id, Answer::WorkerStopped)
                    && self.all_answered()
                {
                    self.start_evaluating().await;
                }
            }
            EvalToAm::MiniBatch(r) => {
                if self.phase == Phase::Training {
                    self.rc.metrics.mini_batch(id, &r, &r.links);
                    self.on_minibatch(r.stats).await;
                }
            }
            EvalToAm::ServerReport(r) => self.rc.metrics.server(id, &r),
            EvalToAm::ClockTick { clock } => {
                e.clock = clock;
                self.release_clocks().await;
            }
            EvalToAm::Evaluation(stats) => self.on_evaluation(id, &stats).await?,
            EvalToAm::HeldOutEvaluation(stats) => self.on_held_out_evaluation(id, &stats).await?,
            EvalToAm::ModelPart { keys, values } => {
                if self.phase == Phase::SavingModel {
                    let from = self.describe(id);
                    self.outputs.add_part(&from, keys, values)?;
                }
            }
            EvalToAm::ModelDumped { .. } => {
                if self.answered(id, Answer::ModelDumped) && self.all_answered() {
                    self.write_model().await?;
                }
            }
            EvalToAm::BlockMoved {
                move_id,
                table,
                block,
                to,
                bytes,
            } => self.on_block_moved(move_id, table, block, to, bytes).await,
            EvalToAm::MoveFinished {
                move_id,
                result,
                secs,
            } => self.on_move_finished(move_id, result, secs),
            EvalToAm::BandwidthProbe { to, bytes, secs } => {
                tracing::debug!(from = %id, %to, bytes, secs, "bandwidth probe");
                self.rc.metrics.bulk(id, to, bytes, secs);
                self.on_start_probe(id, to).await?;
            }
            EvalToAm::ProbeFailed { to, error } => {
                tracing::warn!(from = %id, %to, "bandwidth probe failed: {error}");
                self.on_start_probe(id, to).await?;
            }
            EvalToAm::Fatal { error } => {
                return Err(AmError::JobFailed(format!(
                    "{} failed: {error}",
                    self.describe(id)
                )));
            }
        }
        Ok(())
    }

    /// An evaluator registered: its setup, then the phase's use of it (the
    /// initial configuration, a planned add) or, if nobody asked for it,
    /// its release.
    async fn on_registered(
        &mut self,
        id: EvaluatorId,
        data_addr: SocketAddr,
        pid: u32,
        host: &str,
        cpu_speed: f64,
    ) -> Result<(), AmError> {
        self.rc.metrics.cpu_speed(id, cpu_speed);
        let e = self
            .evaluators
            .get_mut(&id)
            .ok_or_else(|| AmError::JobFailed(format!("evaluator {id} vanished")))?;
        e.data_addr = Some(data_addr);
        e.pid = pid;
        tracing::info!(evaluator = %id, container = %e.container, pid, %host, %data_addr, "evaluator registered");
        let setup = JobSetup {
            evaluator: id,
            config: self.config.clone(),
            app: self.params.clone(),
            tables: vec![
                (MODEL_TABLE, self.config.store.model_blocks),
                (INPUT_TABLE, self.splits.len() as u32),
                (STATE_TABLE, self.splits.len() as u32),
            ],
        };
        self.send(id, AmToEval::Setup(Box::new(setup))).await;
        let registered = self
            .evaluators
            .values()
            .filter(|e| e.data_addr.is_some())
            .count() as u32;
        if self.phase == Phase::Allocating {
            if registered >= self.config.job.containers {
                self.start_loading().await;
            }
        } else if !(self.phase == Phase::Training && self.on_late_registration(id).await) {
            self.release_unasked(id).await;
        }
        Ok(())
    }

    /// Gives back an evaluator nobody asked for (e.g. an add that timed
    /// out).
    async fn release_unasked(&mut self, id: EvaluatorId) {
        tracing::warn!(
            "{} registered unexpectedly; releasing it",
            self.describe(id)
        );
        self.send(
            id,
            AmToEval::Shutdown {
                reason: "not needed".into(),
            },
        )
        .await;
        let Some(e) = self.evaluators.get_mut(&id) else {
            return;
        };
        e.gone = true;
        let c = e.container.clone();
        if let Err(e) = self.rm.release(&c).await {
            tracing::warn!("releasing container {c}: {e}");
        }
    }

    /// A worker read input blocks: while loading, its share of the first
    /// epoch; while training, blocks re-read for a scale-in.
    async fn on_input_loaded(
        &mut self,
        id: EvaluatorId,
        blocks: Vec<(BlockId, u64, u64)>,
    ) -> Result<(), AmError> {
        if self.phase != Phase::Loading {
            // Blocks re-read while training (a scale-in).
            if !self.on_input_reloaded(id, &blocks).await {
                tracing::warn!(evaluator = %id, "unexpected InputLoaded");
            }
            return Ok(());
        }
        if !self.answered(id, Answer::InputLoaded) {
            tracing::warn!(evaluator = %id, "unexpected InputLoaded");
            return Ok(());
        }
        let bytes: u64 = blocks.iter().map(|b| b.2).sum();
        if let Some(t) = self.rc.load_started.remove(&id) {
            self.rc.metrics.load(bytes, t.elapsed().as_secs_f64());
        }
        for &(b, records, bytes) in &blocks {
            self.rc.input_bytes.insert(b, bytes);
            self.rc.mini_batches_per_epoch += cruise_container::ps::mini_batch_count(
                usize::try_from(records).unwrap_or(usize::MAX),
                self.config.job.mini_batch as usize,
            ) as u64;
        }
        self.records_per_epoch += blocks.iter().map(|b| b.1).sum::<u64>();
        self.maybe_start_training().await
    }

    async fn start_loading(&mut self) {
        let (w, s) = self.initial_split;
        // Roles are dealt in the order the resource manager started the
        // containers, not in the order their evaluators happened to
        // register: the initial configuration is then reproducible (and an
        // emulated cluster's shapes, given in start order, land on the
        // roles they were meant for).
        let mut ids: Vec<EvaluatorId> = self.evaluators.keys().copied().collect();
        ids.sort_by(|a, b| {
            start_order(&self.evaluators[a].container, &self.evaluators[b].container)
        });
        let (workers, servers) = ids.split_at((w as usize).min(ids.len()));
        let (workers, servers) = (
            workers.to_vec(),
            servers[..(s as usize).min(servers.len())].to_vec(),
        );
        for &id in &workers {
            if let Some(e) = self.evaluators.get_mut(&id) {
                e.role = Role::Worker;
            }
        }
        for &id in &servers {
            if let Some(e) = self.evaluators.get_mut(&id) {
                e.role = Role::Server;
            }
        }
        let nm = self.config.store.model_blocks as usize;
        let ni = self.splits.len();
        let model: Vec<EvaluatorId> = (0..nm).map(|b| servers[b % servers.len()]).collect();
        let input: Vec<EvaluatorId> = (0..ni).map(|b| workers[b * workers.len() / ni]).collect();
        let update = self.owners.assign([
            (MODEL_TABLE, model.clone()),
            (INPUT_TABLE, input.clone()),
            (STATE_TABLE, input.clone()),
        ]);
        let peers: Vec<(EvaluatorId, SocketAddr)> = self
            .evaluators
            .values()
            .filter_map(|e| e.data_addr.map(|a| (e.id, a)))
            .collect();
        self.phase(
            Phase::Loading,
            format!(
                "loading: {ni} input blocks on {}, {nm} model blocks on {}",
                plural(workers.len() as u32, "worker"),
                plural(servers.len() as u32, "server"),
            ),
        );
        for &id in &ids {
            self.send(id, AmToEval::Peers(peers.clone())).await;
            self.send(id, AmToEval::Ownership(update.clone())).await;
        }
        for &id in &servers {
            let blocks: Vec<BlockId> = (0..nm)
                .filter(|&b| model[b] == id)
                .map(|b| b as BlockId)
                .collect();
            self.ask(
                id,
                AmToEval::CreateBlocks {
                    table: MODEL_TABLE,
                    blocks,
                },
                Answer::BlocksCreated,
            )
            .await;
        }
        for &id in &workers {
            let blocks: Vec<(BlockId, Split)> = (0..ni)
                .filter(|&b| input[b] == id)
                .map(|b| (b as BlockId, self.splits[b].clone()))
                .collect();
            self.rc.load_started.insert(id, Instant::now());
            self.ask(id, AmToEval::LoadInput { blocks }, Answer::InputLoaded)
                .await;
        }
    }

    async fn maybe_start_training(&mut self) -> Result<(), AmError> {
        if self.phase != Phase::Loading || !self.all_answered() {
            return Ok(());
        }
        if self.records_per_epoch == 0 {
            return Err(AmError::Input {
                uri: self.config.job.input.clone(),
                message: "the input has no records".into(),
            });
        }
        if self.probe_before_training().await {
            return Ok(());
        }
        self.learn_capacity().await;
        let (w, s) = self.role_counts();
        self.phase(
            Phase::Training,
            format!(
                "training: {} records per epoch, {}, {}",
                self.records_per_epoch,
                split_text(w, s),
                match self.config.job.sync {
                    SyncMode::Async => "async".to_string(),
                    SyncMode::Ssp => format!("ssp (staleness {})", self.config.job.staleness),
                }
            ),
        );
        let ids: Vec<(EvaluatorId, Role)> =
            self.evaluators.values().map(|e| (e.id, e.role)).collect();
        for (id, role) in ids {
            self.start_role(id, role).await;
        }
        if matches!(
            self.rc.start_probes,
            reconfigure::StartProbes::WhileTraining
        ) {
            self.probe_ring().await;
        }
        let now = Instant::now();
        self.train_started = Some(now);
        self.epoch_started = now;
        Ok(())
    }

    async fn on_minibatch(&mut self, stats: Stats) {
        self.records_done += stats.records;
        self.window.add(&stats);
        let (w, s) = self.role_counts();
        let epoch_no = self.epochs.len() as u32 + 1;
        if self.last_batch_progress.elapsed() >= Duration::from_millis(100) {
            self.last_batch_progress = Instant::now();
            let done = self.records_done - (epoch_no as u64 - 1) * self.records_per_epoch;
            let _ = self.progress.send(Progress::Batch {
                epoch: epoch_no,
                done: done.min(self.records_per_epoch),
                total: self.records_per_epoch,
                stats: self.window,
                workers: w,
                servers: s,
            });
        }
        while self.records_done >= (self.epochs.len() as u64 + 1) * self.records_per_epoch
            && (self.epochs.len() as u32) < self.config.job.epochs
        {
            let summary = EpochSummary {
                epoch: self.epochs.len() as u32 + 1,
                stats: std::mem::take(&mut self.window),
                secs: self.epoch_started.elapsed().as_secs_f64(),
                end_secs: self.started.elapsed().as_secs_f64(),
                workers: w,
                servers: s,
            };
            self.epoch_started = Instant::now();
            self.epochs.push(summary);
            tracing::info!(
                epoch = summary.epoch,
                loss = summary.stats.mean_loss(),
                secs = summary.secs,
                "epoch done"
            );
            let _ = self.progress.send(Progress::Epoch(summary));
        }
        if self.epochs.len() as u32 >= self.config.job.epochs && !self.end_reconfiguration() {
            self.start_stopping().await;
        }
    }

    /// Starts `role`'s task on `id`. A worker starts at the clock the job
    /// has released so far (0 at the start of training), which becomes its
    /// own.
    async fn start_role(&mut self, id: EvaluatorId, role: Role) {
        match role {
            Role::Server => self.send(id, AmToEval::StartServer).await,
            Role::Worker => {
                let start_clock = self.min_clock_sent;
                if let Some(e) = self.evaluators.get_mut(&id) {
                    e.clock = start_clock;
                }
                let staleness =
                    (self.config.job.sync == SyncMode::Ssp).then_some(self.config.job.staleness);
                let task = WorkerTask {
                    start_clock,
                    staleness,
                };
                self.send(id, AmToEval::StartWorker(task)).await
            }
            Role::Idle => {}
        }
    }

    async fn release_clocks(&mut self) {
        let min = self
            .evaluators
            .values()
            .filter(|e| e.role == Role::Worker && e.connected)
            .map(|e| e.clock)
            .min()
            .unwrap_or(0);
        if min > self.min_clock_sent {
            self.min_clock_sent = min;
            let workers = self.with_role(Role::Worker);
            for id in workers {
                self.send(id, AmToEval::Clock { min_clock: min }).await;
            }
        }
    }

    async fn start_stopping(&mut self) {
        if self.phase != Phase::Training {
            return;
        }
        if let Some(t) = self.train_started {
            self.train_secs = t.elapsed().as_secs_f64();
        }
        self.phase(Phase::Stopping, "stopping workers".into());
        let workers = self.with_role(Role::Worker);
        for id in workers {
            self.ask(id, AmToEval::StopWorker, Answer::WorkerStopped)
                .await;
        }
    }

    async fn start_evaluating(&mut self) {
        self.phase(Phase::Evaluating, "evaluating the final model".into());
        let workers = self.with_role(Role::Worker);
        for id in workers {
            self.ask(id, AmToEval::Evaluate, Answer::Evaluation).await;
        }
    }

    /// A worker's final evaluation over its input.
    async fn on_evaluation(&mut self, id: EvaluatorId, stats: &Stats) -> Result<(), AmError> {
        if self.answered(id, Answer::Evaluation) {
            self.final_stats.add(stats);
            if self.all_answered() {
                return self.after_evaluation().await;
            }
        }
        Ok(())
    }

    /// A worker's evaluation over its splits of the held-out input.
    async fn on_held_out_evaluation(
        &mut self,
        id: EvaluatorId,
        stats: &Stats,
    ) -> Result<(), AmError> {
        if self.answered(id, Answer::HeldOutEvaluation) {
            self.outputs.add_eval(stats);
            if self.all_answered() {
                return self.after_held_out().await;
            }
        }
        Ok(())
    }

    /// After the final evaluation: the held-out input, if any, else what
    /// follows it.
    async fn after_evaluation(&mut self) -> Result<(), AmError> {
        if !self.outputs.has_held_out() {
            return self.after_held_out().await;
        }
        self.phase(
            Phase::EvaluatingHeldOut,
            format!("evaluating held-out input {}", self.config.job.eval_input),
        );
        let workers = self.with_role(Role::Worker);
        for (id, splits) in self.outputs.assign(&workers) {
            self.ask(
                id,
                AmToEval::EvaluateHeldOut { splits },
                Answer::HeldOutEvaluation,
            )
            .await;
        }
        Ok(())
    }

    /// After the held-out evaluation: the model dump, if asked for, else the end.
    async fn after_held_out(&mut self) -> Result<(), AmError> {
        if !self.outputs.wants_model() {
            self.finish().await;
            return Ok(());
        }
        self.phase(
            Phase::SavingModel,
            format!("saving the model to {}", self.config.job.model_out),
        );
        for id in self.owners.owners_of(MODEL_TABLE) {
            self.ask(id, AmToEval::DumpModel, Answer::ModelDumped).await;
        }
        if self.all_answered() {
            self.write_model().await?;
        }
        Ok(())
    }

    /// Every server has sent its part of the model: writes it, and ends.
    async fn write_model(&mut self) -> Result<(), AmError> {
        let keys = self
            .outputs
            .write_model(self.config.job.app, &self.params)
            .await?;
        tracing::info!(keys, path = %self.config.job.model_out, "model written");
        self.finish().await;
        Ok(())
    }

    async fn finish(&mut self) {
        self.phase(Phase::Finishing, "shutting down evaluators".into());
        let ids: Vec<EvaluatorId> = self.evaluators.keys().copied().collect();
        for id in ids {
            self.send(
                id,
                AmToEval::Shutdown {
                    reason: "job finished".into(),
                },
            )
            .await;
        }
    }

    fn all_containers_done(&self) -> bool {
        self.evaluators.values().all(|e| {
            self.containers
                .get(&e.container)
                .is_some_and(|c| c.ended.is_some())
        })
    }

    async fn shutdown_all(&mut self, reason: &str) {
        let ids: Vec<EvaluatorId> = self.evaluators.keys().copied().collect();
        for id in ids {
            if let Some(e) = self.evaluators.get(&id) {
                let _ = e.tx.try_send(AmToEval::Shutdown {
                    reason: reason.to_string(),
                });
            }
        }
    }

    fn publish_status(&self, failure: Option<String>) {
        let counts = self.owners.counts();
        let status = Status {
            job_id: self.job_id.clone(),
            am_addr: Some(self.am_addr),
            refused: self.refused.clone(),
            phase: self.phase.name().to_string(),
            epochs_done: self.epochs.len() as u32,
            epochs: self.config.job.epochs,
            records_per_epoch: self.records_per_epoch,
            records_processed: self.records_done,
            evaluators: self
                .evaluators
                .values()
                .map(|e| EvaluatorStatus {
                    id: e.id,
                    container: e.container.clone(),
                    role: e.role,
                    pid: e.pid,
                    data_addr: e.data_addr,
                    rss_bytes: e.rss,
                    store_bytes: e.store_bytes,
                    input_blocks: counts.get(&(INPUT_TABLE, e.id)).copied().unwrap_or(0),
                    model_blocks: counts.get(&(MODEL_TABLE, e.id)).copied().unwrap_or(0),
                })
                .collect(),
            last_epoch: self.epochs.last().copied(),
            failure,
            capacity: self.rc.capacity,
            optimizer: self.rc.last_decision.clone(),
            metrics: self.rc.metrics.view(),
            reconfigurations: self.rc.history.clone(),
            emulation: self.emulation.clone(),
        };
        self.status.send_replace(status);
    }

    fn summary(&self) -> JobSummary {
        let (w, s) = self.initial_split;
        JobSummary {
            reconfigurations: self.rc.history.clone(),
            emulation: self.emulation.clone(),
            job_id: self.job_id.clone(),
            app: self.config.job.app,
            loss_name: self.loss_name.to_string(),
            has_accuracy: self.has_accuracy,
            records: self.records_per_epoch,
            epochs: self.epochs.clone(),
            final_stats: self.final_stats,
            eval_stats: self.outputs.eval_stats(),
            model_out: self.outputs.written(),
            wall_secs: self.started.elapsed().as_secs_f64(),
            train_secs: self.train_secs,
            containers: self.config.job.containers,
            workers: w,
            servers: s,
            am_peak_rss_bytes: os::memory().1,
            evaluators: self
                .evaluators
                .values()
                .map(|e| EvaluatorSummary {
                    id: e.id,
                    container: e.container.clone(),
                    pid: e.pid,
                    role: e.role,
                    peak_rss_bytes: e.peak_rss,
                    max_store_bytes: e.max_store_bytes,
                })
                .collect(),
        }
    }
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

fn role_name(r: Role) -> &'static str {
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
