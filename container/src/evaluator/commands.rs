//! What the evaluator does for the AM once the job is set up: the job
//! (app, store, data plane), the role tasks it runs, and one function per
//! command of the AM ([`handle`] dispatches them). Long work runs off the
//! control loop, on the tracker, and answers the AM when done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::CruiseConfig;
use cruise_hdfs::{FileSystem, Split};

use super::{EvaluatorEnv, EvaluatorError, EvaluatorOptions, STOP_GRACE};
use crate::apps::{self, App};
use crate::checkpoint::{self, BlockFile, SavedState};
use crate::peer::{DataPlane, PeerSettings};
use crate::protocol::{
    AmToEval, BlockId, EvalToAm, EvaluatorId, FrameOptions, JobSetup, OwnershipUpdate, TableId,
    TaskKind, WorkerTask,
};
use crate::ps::{self, PsError};
use crate::store::Store;

/// The job set up here.
pub(super) struct Job {
    pub(super) config: CruiseConfig,
    app: Arc<dyn App>,
    pub(super) dp: DataPlane,
    fs: FileSystem,
}

/// A role task and the token that asks it to stop.
struct Task {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

/// The role tasks running here, owned by the evaluator's loop.
#[derive(Default)]
pub(super) struct Roles {
    worker: Option<Task>,
    server: Option<Task>,
}

/// What the handlers of the AM's messages reach the rest of the evaluator
/// by: the control channel to the AM, the loop's channel for a task's
/// fatal error, the tracker tasks are spawned on, the clock bound the
/// worker waits on and the last clock rollback (SSP), the recounts ordered
/// (LDA), and the token that drops pending work when the evaluator ends.
pub(super) struct Links {
    pub(super) to_am: mpsc::Sender<EvalToAm>,
    pub(super) fail: mpsc::Sender<String>,
    pub(super) tracker: TaskTracker,
    pub(super) min_clock: watch::Sender<u32>,
    /// The last `RollBackClock` heard (the worker compares it with its own).
    pub(super) rollback: watch::Sender<ps::ClockRollback>,
    /// The recounts the AM ordered (`HoldForRecount`, `ResumeAfterRecount`).
    pub(super) recount: watch::Sender<ps::RecountOrder>,
    /// Cancelled when the evaluator ends: work still waiting for its
    /// answer (e.g. a read blocked on a datanode) is dropped then.
    pub(super) stop: CancellationToken,
}

impl Links {
    /// Sends `m` to the AM.
    pub(super) async fn send(&self, m: EvalToAm) -> Result<(), EvaluatorError> {
        self.to_am
            .send(m)
            .await
            .map_err(|_| EvaluatorError::AmLost("control channel closed".into()))
    }

    /// Runs `work` off the control loop, on the tracker: its answer, if
    /// any, goes to the AM; its error fails the evaluator, after `what`.
    fn answer_later<E: std::fmt::Display>(
        &self,
        what: &'static str,
        work: impl Future<Output = Result<Option<EvalToAm>, E>> + Send + 'static,
    ) {
        let (tx, fail, stop) = (self.to_am.clone(), self.fail.clone(), self.stop.clone());
        self.tracker.spawn(async move {
            let result = tokio::select! {
                r = work => r,
                _ = stop.cancelled() => {
                    tracing::info!("{what}: dropped, the evaluator is ending");
                    return;
                }
            };
            match result.map_err(|e| format!("{what}: {e}")) {
                Ok(Some(answer)) => {
                    let _ = tx.send(answer).await;
                }
                Ok(None) => {}
                Err(error) => {
                    let _ = fail.send(error).await;
                }
            }
        });
    }

    /// Runs a task on the tracker; its error fails the evaluator, after
    /// `what`.
    fn fail_on_error<E: std::fmt::Display>(
        &self,
        what: &'static str,
        task: impl Future<Output = Result<(), E>> + Send + 'static,
    ) -> JoinHandle<()> {
        let fail = self.fail.clone();
        self.tracker.spawn(async move {
            if let Err(error) = task.await.map_err(|e| format!("{what}: {e}")) {
                let _ = fail.send(error).await;
            }
        })
    }
}

/// Sets up the job the AM describes: its app, its store, and the data
/// plane on `listener`.
pub(super) fn start_job(
    env: &EvaluatorEnv,
    setup: JobSetup,
    listener: TcpListener,
    opts: &EvaluatorOptions,
) -> Result<Job, EvaluatorError> {
    let config = setup.config;
    let app = apps::build(&config, &setup.app).map_err(|e| EvaluatorError::Task(e.to_string()))?;
    let store = Store::new(setup.evaluator);
    store.configure(&setup.tables, app.model());
    let ch = &config.channel;
    let settings = PeerSettings {
        job_id: env.job_id.clone(),
        secret: env.secret.clone(),
        frames: FrameOptions::data(ch),
        connect_timeout: Duration::from_millis(ch.connect_timeout_ms),
        chunk_bytes: config.store.move_chunk_bytes as usize,
        drain_timeout: Duration::from_millis(ch.heartbeat_timeout_ms),
        request_timeout: Duration::from_millis(config.store.request_timeout_ms),
    };
    // The data plane gets a token of its own, not one derived from the
    // process's shutdown signal: leaving must drain (GoAway until every
    // client acknowledges), so it ends only through `shutdown` or `stop`,
    // which `run` always calls on its way out.
    let dp = DataPlane::start(
        setup.evaluator,
        store,
        listener,
        settings,
        opts.data_faults.clone(),
        &CancellationToken::new(),
    )
    .map_err(|source| EvaluatorError::Io {
        context: "starting the data plane".into(),
        source,
    })?;
    tracing::info!(evaluator = %setup.evaluator, app = %config.job.app, "job set up");
    Ok(Job {
        fs: crate::input_fs::file_system(&config.hdfs),
        config,
        app,
        dp,
    })
}

/// Carries out one message of the AM (other than setup and shutdown) for
/// the job set up here.
pub(super) async fn handle(
    msg: AmToEval,
    job: &Job,
    links: &Links,
    roles: &mut Roles,
) -> Result<(), EvaluatorError> {
    match msg {
        AmToEval::Peers(peers) => job.dp.set_peers(&peers),
        AmToEval::Ownership(u) => apply_ownership(&u, job, links),
        AmToEval::CreateBlocks { table, blocks } => {
            create_blocks(table, blocks, job, links).await?
        }
        AmToEval::DropInput { blocks } => drop_input(blocks, job, links).await?,
        AmToEval::LoadInput { blocks, state } => load_input(blocks, state, job, links),
        AmToEval::StartWorker(task) => start_worker(task, job, links, roles).await?,
        AmToEval::StopWorker => stop_task(&mut roles.worker, TaskKind::Worker, links).await?,
        AmToEval::StartServer => start_server(job, links, roles).await?,
        AmToEval::StopServer => stop_task(&mut roles.server, TaskKind::Server, links).await?,
        AmToEval::MoveBlocks {
            move_id,
            table,
            blocks,
            to,
        } => move_blocks(move_id, table, blocks, to, job, links),
        AmToEval::ProbeBandwidth { to, bytes } => probe_bandwidth(to, bytes, job, links),
        AmToEval::Clock { min_clock } => {
            links.min_clock.send_replace(min_clock);
        }
        AmToEval::RollBackClock { rollback, clock } => {
            // Both before the ownership that follows is applied: a pull
            // routed by it to a restored block is answered after the worker
            // can see the rollback, and it checks before computing.
            links.min_clock.send_replace(clock);
            links
                .rollback
                .send_replace(ps::ClockRollback { rollback, clock });
        }
        AmToEval::HoldForRecount { recount } => {
            hold_for_recount(recount, job, links, roles).await?
        }
        AmToEval::ZeroModel { recount } => zero_model(recount, job, links).await?,
        AmToEval::ResumeAfterRecount { recount } => {
            links.recount.send_modify(|r| r.go = r.go.max(recount));
        }
        AmToEval::Evaluate => evaluate(job, links),
        AmToEval::EvaluateHeldOut { splits } => evaluate_held_out(splits, job, links),
        AmToEval::DumpModel => dump_model(job, links),
        AmToEval::Checkpoint { id, folder } => write_checkpoint(id, folder, job, links),
        AmToEval::RestoreBlocks {
            lost,
            folder,
            files,
        } => restore_blocks(lost, folder, files, job, links).await?,
        AmToEval::Heartbeat | AmToEval::Setup(_) | AmToEval::Shutdown { .. } => {}
    }
    Ok(())
}

/// Creates empty blocks of `table` here and says so.
async fn create_blocks(
    table: TableId,
    blocks: Vec<BlockId>,
    job: &Job,
    links: &Links,
) -> Result<(), EvaluatorError> {
    job.dp
        .store()
        .create_blocks(table, &blocks)
        .map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
    links.send(EvalToAm::BlocksCreated { table, blocks }).await
}

/// Recount `recount`: the worker task holds for it and answers itself
/// (`ps::RecountOrder`); without one running here, the state of the input
/// blocks held here is marked uncounted at once and the answer sent.
async fn hold_for_recount(
    recount: u32,
    job: &Job,
    links: &Links,
    roles: &Roles,
) -> Result<(), EvaluatorError> {
    links.recount.send_modify(|r| r.hold = r.hold.max(recount));
    if roles
        .worker
        .as_ref()
        .is_some_and(|t| !t.handle.is_finished())
    {
        return Ok(());
    }
    let marked = ps::mark_uncounted(job.dp.store(), &*job.app);
    tracing::info!(
        recount,
        marked,
        "state marked uncounted for a recount (no worker task here)"
    );
    links.send(EvalToAm::RecountHeld { recount }).await
}

/// Recount `recount`: empties the model blocks owned here once no request
/// of an evaluator that left the job can still be applied, and says so.
async fn zero_model(recount: u32, job: &Job, links: &Links) -> Result<(), EvaluatorError> {
    job.dp.departed_requests_done().await;
    let blocks =
        ps::zero_model(job.dp.store()).map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
    tracing::info!(recount, blocks, "model blocks emptied for a recount");
    links.send(EvalToAm::ModelZeroed { recount, blocks }).await
}

/// Drops input blocks held here and says so.
async fn drop_input(blocks: Vec<BlockId>, job: &Job, links: &Links) -> Result<(), EvaluatorError> {
    job.dp
        .store()
        .drop_input(&blocks)
        .map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
    links.send(EvalToAm::InputDropped { blocks }).await
}

/// Reads input splits into blocks, off the control loop; their
/// worker-local state is restored from `state` where it holds it.
fn load_input(blocks: Vec<(BlockId, Split)>, state: Option<SavedState>, job: &Job, links: &Links) {
    let (fs, app, store) = (job.fs.clone(), Arc::clone(&job.app), job.dp.store().clone());
    links.answer_later("loading input", async move {
        let blocks = ps::load_input(fs, app, store, blocks, state).await?;
        Ok::<_, PsError>(Some(EvalToAm::InputLoaded { blocks }))
    });
}

/// Moves blocks of `table` to `to`, off the control loop; the data plane
/// reports each block moved, and this the move's end.
fn move_blocks(
    move_id: u64,
    table: TableId,
    blocks: Vec<BlockId>,
    to: EvaluatorId,
    job: &Job,
    links: &Links,
) {
    let (dp, tx) = (job.dp.clone(), links.to_am.clone());
    links.answer_later("reporting a move", async move {
        let t0 = Instant::now();
        let result = dp.move_blocks(move_id, table, &blocks, to, &tx).await;
        Ok::<_, EvaluatorError>(Some(EvalToAm::MoveFinished {
            move_id,
            result: result.map(|_| ()).map_err(|e| e.to_string()),
            secs: t0.elapsed().as_secs_f64(),
        }))
    });
}

/// Evaluates the model over the local input, off the control loop.
fn evaluate(job: &Job, links: &Links) {
    let (dp, app) = (job.dp.clone(), Arc::clone(&job.app));
    let mb = job.config.job.mini_batch as usize;
    links.answer_later("evaluation", async move {
        let stats = ps::evaluate(&dp, &app, mb).await?;
        Ok::<_, PsError>(Some(EvalToAm::Evaluation(stats)))
    });
}

/// Evaluates the model over held-out splits, off the control loop.
fn evaluate_held_out(splits: Vec<Split>, job: &Job, links: &Links) {
    let (fs, dp, app) = (job.fs.clone(), job.dp.clone(), Arc::clone(&job.app));
    let mb = job.config.job.mini_batch as usize;
    links.answer_later("held-out evaluation", async move {
        let stats = ps::evaluate_held_out(&fs, &dp, &app, &splits, mb).await?;
        Ok::<_, PsError>(Some(EvalToAm::HeldOutEvaluation(stats)))
    });
}

/// Sends the model blocks held here to the AM, off the control loop.
fn dump_model(job: &Job, links: &Links) {
    let (store, tx) = (job.dp.store().clone(), links.to_am.clone());
    // Parts well below the control channel's frame limit.
    let part_bytes = (job.config.channel.control_max_frame_bytes / 4) as usize;
    links.answer_later("sending the model", async move {
        ps::dump_model(&store, &tx, part_bytes).await?;
        Ok::<_, PsError>(None)
    });
}

/// Writes the blocks held here to checkpoint `id` in `folder`, off the
/// control loop: the model blocks, and the worker-local state blocks of
/// apps whose state checkpoints hold.
fn write_checkpoint(id: u64, folder: String, job: &Job, links: &Links) {
    let (fs, store) = (job.fs.clone(), job.dp.store().clone());
    let state = apps::state_in_checkpoints(job.app.kind());
    links.answer_later("writing a checkpoint", async move {
        let result = checkpoint::write_blocks(&fs, &store, &folder, state)
            .await
            .map_err(|e| e.to_string());
        Ok::<_, EvaluatorError>(Some(EvalToAm::CheckpointWritten { id, result }))
    });
}

/// Restores the blocks `lost` held from their checkpoint `files`: marked
/// arriving here at once, read off the control loop.
async fn restore_blocks(
    lost: EvaluatorId,
    folder: String,
    files: Vec<BlockFile>,
    job: &Job,
    links: &Links,
) -> Result<(), EvaluatorError> {
    let store = job.dp.store().clone();
    // Arriving before this handler returns: the AM announces the
    // new owner only after this message.
    let blocks: Vec<_> = files.iter().map(|f| f.block).collect();
    if let Err(e) = checkpoint::begin_restore(&store, lost, &files) {
        let result = Err(e.to_string());
        let answer = EvalToAm::BlocksRestored {
            folder,
            blocks,
            result,
        };
        return links.send(answer).await;
    }
    let fs = job.fs.clone();
    links.answer_later("restoring blocks", async move {
        let result = checkpoint::restore_blocks(&fs, &store, &folder, &files)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        Ok::<_, EvaluatorError>(Some(EvalToAm::BlocksRestored {
            folder,
            blocks,
            result,
        }))
    });
    Ok(())
}

/// Applies an ownership update; acknowledges it once the requests already on
/// their way are done. They were routed by the older table: the update
/// counts as applied here once they are done (an evaluator released after
/// every member acknowledged cannot cut one off). Waited for off the
/// control loop: one of them may be queued on a block that a command to
/// this evaluator moves.
fn apply_ownership(u: &OwnershipUpdate, job: &Job, links: &Links) {
    let version = job.dp.store().apply_ownership(u);
    let mark = job.dp.request_mark();
    tracing::debug!(version, changes = u.owners.len(), "ownership applied");
    let dp = job.dp.clone();
    links.answer_later("acknowledging ownership", async move {
        dp.requests_done_before(mark).await;
        tracing::debug!(version, "ownership acknowledged");
        Ok::<_, EvaluatorError>(Some(EvalToAm::OwnershipApplied { version }))
    });
}

/// Measures the bulk bandwidth to `to` with `bytes`; a failed probe only
/// costs the optimizer a measurement, and is reported as such.
fn probe_bandwidth(to: EvaluatorId, bytes: u64, job: &Job, links: &Links) {
    let dp = job.dp.clone();
    links.answer_later("probing bandwidth", async move {
        Ok::<_, EvaluatorError>(Some(
            match dp.probe(to, bytes, crate::protocol::PROBE_TRIES).await {
                Ok(secs) => EvalToAm::BandwidthProbe { to, bytes, secs },
                Err(e) => {
                    tracing::warn!("bandwidth probe to evaluator {to}: {e}");
                    let error = e.to_string();
                    EvalToAm::ProbeFailed { to, error }
                }
            },
        ))
    });
}

/// A protocol error (`what`) if the task in `slot` still runs.
fn refuse_if_running(slot: &Option<Task>, what: &str) -> Result<(), EvaluatorError> {
    match slot {
        Some(t) if !t.handle.is_finished() => Err(EvaluatorError::Protocol(what.into())),
        _ => Ok(()),
    }
}

/// Starts the worker task, which reports `TaskStopped` itself when it ends.
async fn start_worker(
    task: WorkerTask,
    job: &Job,
    links: &Links,
    roles: &mut Roles,
) -> Result<(), EvaluatorError> {
    refuse_if_running(&roles.worker, "StartWorker while a worker runs")?;
    let stop = CancellationToken::new();
    let ctx = ps::WorkerContext {
        dp: job.dp.clone(),
        app: Arc::clone(&job.app),
        to_am: links.to_am.clone(),
        stop: stop.clone(),
        min_clock: links.min_clock.subscribe(),
        rollback: links.rollback.subscribe(),
        recount: links.recount.subscribe(),
        recounts_before: links.recount.borrow().hold,
        mini_batch: job.config.job.mini_batch as usize,
        task,
        pipeline_depth: job.config.job.in_flight() as usize,
    };
    links
        .send(EvalToAm::TaskStarted {
            task: TaskKind::Worker,
        })
        .await?;
    let handle = links.fail_on_error("worker", ps::run_worker(ctx));
    roles.worker = Some(Task { stop, handle });
    Ok(())
}

/// Starts the server task, which reports `TaskStopped` itself when it ends.
async fn start_server(job: &Job, links: &Links, roles: &mut Roles) -> Result<(), EvaluatorError> {
    refuse_if_running(&roles.server, "StartServer while a server runs")?;
    let stop = CancellationToken::new();
    links
        .send(EvalToAm::TaskStarted {
            task: TaskKind::Server,
        })
        .await?;
    let run = ps::run_server(
        job.dp.clone(),
        links.to_am.clone(),
        stop.clone(),
        ps::SERVER_REPORT_PERIOD,
    );
    let handle = links.fail_on_error("server", run);
    roles.server = Some(Task { stop, handle });
    Ok(())
}

/// Stops the task in `slot`, which then reports `TaskStopped` itself; with
/// none running, says so at once.
async fn stop_task(
    slot: &mut Option<Task>,
    kind: TaskKind,
    links: &Links,
) -> Result<(), EvaluatorError> {
    match slot.take() {
        Some(t) => t.stop.cancel(),
        None => links.send(EvalToAm::TaskStopped { task: kind }).await?,
    }
    Ok(())
}

/// Stops the tasks: the worker after its mini-batch, the server at once;
/// one that does not stop within [`STOP_GRACE`] is abandoned.
pub(super) async fn stop_roles(roles: Roles) {
    for mut t in [roles.worker, roles.server].into_iter().flatten() {
        t.stop.cancel();
        if tokio::time::timeout(STOP_GRACE, &mut t.handle)
            .await
            .is_err()
        {
            tracing::warn!(
                "a task did not stop within {:.0} s of the request; abandoning it",
                STOP_GRACE.as_secs_f64()
            );
            t.handle.abort();
            let _ = t.handle.await;
        }
    }
}
