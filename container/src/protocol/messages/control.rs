//! The control channel between the AM and an evaluator: [`AmToEval`] and
//! [`EvalToAm`], and the job description and ownership updates they carry.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use cruise_conf::CruiseConfig;
use cruise_hdfs::Split;

use super::{BlockId, EvaluatorId, Key, MiniBatchReport, ServerReport, Stats, TableId, ValueBatch};

/// Transfers an evaluator makes for one [`AmToEval::ProbeBandwidth`]; it
/// answers with the fastest.
pub const PROBE_TRIES: u32 = 3;

/// Messages from the AM to an evaluator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AmToEval {
    /// Liveness.
    Heartbeat,
    /// First message after registration: who the evaluator is and the job.
    Setup(Box<JobSetup>),
    /// The data-plane addresses of evaluators (full directory, replaces the old one).
    Peers(Vec<(EvaluatorId, SocketAddr)>),
    /// Block owners changed. Applied if `version` is newer than what the evaluator has.
    Ownership(OwnershipUpdate),
    /// Load these input blocks from their splits.
    LoadInput {
        /// Block id and the split it holds.
        blocks: Vec<(BlockId, Split)>,
        /// The worker-local state of these blocks in a checkpoint (a
        /// resumed job, a lost worker's blocks re-read): restored instead
        /// of drawn afresh, for each block it holds and that fits.
        state: Option<crate::checkpoint::SavedState>,
    },
    /// Drop these input blocks (a scale-in re-reads them elsewhere); only
    /// for blocks without worker-local state.
    DropInput {
        /// The blocks.
        blocks: Vec<BlockId>,
    },
    /// Create these empty blocks of a table (owned from now on).
    CreateBlocks {
        /// The table.
        table: TableId,
        /// The blocks.
        blocks: Vec<BlockId>,
    },
    /// Start the worker task (train on local input blocks).
    StartWorker(WorkerTask),
    /// Stop the worker task: finish the current mini-batch, flush pushes, report.
    StopWorker,
    /// Start the server task (report serving metrics).
    StartServer,
    /// Stop the server task. Blocks stay until moved away.
    StopServer,
    /// Move blocks of a table to another evaluator.
    MoveBlocks {
        /// Id of this move, echoed in the reports.
        move_id: u64,
        /// The table.
        table: TableId,
        /// The blocks.
        blocks: Vec<BlockId>,
        /// Destination evaluator.
        to: EvaluatorId,
    },
    /// SSP: the slowest worker's clock; a waiting worker may go on if within the bound.
    Clock {
        /// Minimum clock over all workers.
        min_clock: u32,
    },
    /// SSP: a lost server's model blocks are restored from a checkpoint
    /// whose blocks hold every update of the local epochs before `clock`.
    /// Sent to every evaluator before the ownership naming the blocks'
    /// new owners, and counting as `Clock{min_clock: clock}` too. A worker
    /// computes on nothing it pulled before it heard of it: it abandons the
    /// local epoch under way, flushes its pushes, goes on from `clock`,
    /// and answers `ClockRolledBack`.
    RollBackClock {
        /// The job's rollbacks so far, this one included (1, 2, ...).
        rollback: u32,
        /// The clock every worker goes on from.
        clock: u32,
    },
    /// A recount of the model (an app whose model is rebuilt from the
    /// workers' state after a loss, `apps::model_rebuilt_on_loss`: LDA),
    /// numbered: the job's recounts so far, this one included. A worker
    /// finishes the mini-batch under way, waits for every push it sent to
    /// be answered, marks the state of its input blocks uncounted
    /// (`App::uncount`), answers `RecountHeld` and trains on only after
    /// `ResumeAfterRecount` of this recount or a later one. A later
    /// `HoldForRecount` while it waits has it mark and answer again.
    HoldForRecount {
        /// The recount (1, 2, ...).
        recount: u32,
    },
    /// Sent once every worker has answered `HoldForRecount`: the model
    /// blocks owned here are emptied (their values back to the app's
    /// initial ones, zero counts). Answered by `ModelZeroed`.
    ZeroModel {
        /// The recount.
        recount: u32,
    },
    /// Sent once every holder of model blocks has answered `ZeroModel`:
    /// the workers held for this recount (or an earlier one) train on,
    /// each row's next sweep counting its state in again.
    ResumeAfterRecount {
        /// The recount.
        recount: u32,
    },
    /// Compute the objective over all local input with the current model (no updates).
    Evaluate,
    /// Measure the bandwidth to another evaluator with bulk transfers:
    /// [`PROBE_TRIES`] of `bytes` each, one after the other, sent by `to`.
    ProbeBandwidth {
        /// The other evaluator.
        to: EvaluatorId,
        /// Bytes to transfer.
        bytes: u64,
    },
    /// Read and parse these splits of the held-out input (`job.eval_input`)
    /// and compute the objective over them with the current model; nothing
    /// is stored. Answered by [`EvalToAm::HeldOutEvaluation`].
    EvaluateHeldOut {
        /// The splits.
        splits: Vec<Split>,
    },
    /// Send the model blocks owned here to the AM: [`EvalToAm::ModelPart`]s,
    /// then [`EvalToAm::ModelDumped`].
    DumpModel,
    /// Write the model blocks owned here, and the worker-local state
    /// blocks of apps whose state checkpoints hold
    /// ([`crate::apps::state_in_checkpoints`]), into a checkpoint's folder,
    /// each copied under its own lock while training goes on. Answered by
    /// [`EvalToAm::CheckpointWritten`].
    Checkpoint {
        /// The checkpoint's number.
        id: u64,
        /// Its folder (local path or URI).
        folder: String,
    },
    /// Own these blocks of the lost evaluator `lost` from now on, read from
    /// the checkpoint in `folder`: operations on them queue here until each
    /// is installed. Answered by [`EvalToAm::BlocksRestored`].
    RestoreBlocks {
        /// The evaluator that owned them.
        lost: EvaluatorId,
        /// The checkpoint's folder.
        folder: String,
        /// The blocks' files.
        files: Vec<crate::checkpoint::BlockFile>,
    },
    /// Stop: release everything and exit with status 0.
    Shutdown {
        /// Why (logged).
        reason: String,
    },
}

/// The job description sent to every evaluator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSetup {
    /// This evaluator's id.
    pub evaluator: EvaluatorId,
    /// The job's configuration (app, store, channel settings).
    pub config: CruiseConfig,
    /// Application parameters that the AM derived (e.g. model size).
    pub app: AppParams,
    /// Number of blocks per table.
    pub tables: Vec<(TableId, u32)>,
}

/// Application parameters fixed for the job (derived by the AM from the config
/// and the input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppParams {
    /// Values per model key.
    pub value_len: u32,
    /// Number of model keys.
    pub model_keys: u64,
    /// Extra per-app integer parameters (documented by each app).
    pub extra: Vec<u64>,
}

/// A change of block owners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnershipUpdate {
    /// Monotonic version of the AM's ownership table.
    pub version: u64,
    /// `(table, block, owner)` for each changed block.
    pub owners: Vec<(TableId, BlockId, EvaluatorId)>,
}

/// Parameters of a worker task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerTask {
    /// Local epoch (clock) to start at.
    pub start_clock: u32,
    /// SSP bound; `None` means asynchronous.
    pub staleness: Option<u32>,
    /// The job's clock rollbacks when the task was started
    /// ([`AmToEval::RollBackClock`]): a later one rolls this worker back.
    pub rollback: u32,
}

/// Messages from an evaluator to the AM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EvalToAm {
    /// First message after the handshake.
    Register {
        /// Data-plane listening address.
        data_addr: SocketAddr,
        /// Process id (evaluator reuse is visible through it).
        pid: u32,
        /// Host name.
        host: String,
        /// Relative CPU speed from a short calibration (higher is faster).
        cpu_speed: f64,
    },
    /// Liveness, with memory use.
    Heartbeat {
        /// Resident set size, bytes.
        rss_bytes: u64,
        /// Peak resident set size, bytes.
        peak_rss_bytes: u64,
        /// Bytes held in store blocks.
        store_bytes: u64,
    },
    /// Ownership update applied up to this version.
    OwnershipApplied {
        /// The version.
        version: u64,
    },
    /// Input blocks loaded.
    InputLoaded {
        /// `(block, records, bytes)`.
        blocks: Vec<(BlockId, u64, u64)>,
    },
    /// Input blocks dropped (answer to `DropInput`).
    InputDropped {
        /// The blocks.
        blocks: Vec<BlockId>,
    },
    /// Blocks created.
    BlocksCreated {
        /// The table.
        table: TableId,
        /// The blocks.
        blocks: Vec<BlockId>,
    },
    /// A task started.
    TaskStarted {
        /// Which.
        task: TaskKind,
    },
    /// A task stopped (after a stop request or because it finished).
    TaskStopped {
        /// Which.
        task: TaskKind,
    },
    /// A worker finished a mini-batch.
    MiniBatch(MiniBatchReport),
    /// A server's periodic serving metrics.
    ServerReport(ServerReport),
    /// A worker finished a local epoch (SSP clock tick).
    ClockTick {
        /// The clock it reached.
        clock: u32,
    },
    /// A worker took rollback `rollback` ([`AmToEval::RollBackClock`]):
    /// its reports before this belong to the local epochs abandoned, those
    /// after it to the ones trained again from `clock`.
    ClockRolledBack {
        /// The rollback.
        rollback: u32,
        /// The clock it goes on from.
        clock: u32,
    },
    /// A worker holds for recount `recount` ([`AmToEval::HoldForRecount`]):
    /// every push it sent before is answered, its state is marked
    /// uncounted, and it sends no push until it hears
    /// [`AmToEval::ResumeAfterRecount`].
    RecountHeld {
        /// The recount.
        recount: u32,
    },
    /// The answer to [`AmToEval::ZeroModel`]: the model blocks owned here
    /// are empty.
    ModelZeroed {
        /// The recount.
        recount: u32,
        /// How many blocks were emptied.
        blocks: u32,
    },
    /// The answer to [`AmToEval::Evaluate`].
    Evaluation(Stats),
    /// The answer to [`AmToEval::EvaluateHeldOut`].
    HeldOutEvaluation(Stats),
    /// Part of the model blocks owned here (answering [`AmToEval::DumpModel`]).
    ModelPart {
        /// The keys.
        keys: Vec<Key>,
        /// Their values, in the order of `keys`.
        values: ValueBatch,
    },
    /// All model blocks owned here were sent.
    ModelDumped {
        /// Keys sent in all parts.
        keys: u64,
    },
    /// One block of a move is installed at the destination (its new owner).
    BlockMoved {
        /// The move.
        move_id: u64,
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// The destination, now the owner.
        to: EvaluatorId,
        /// Bytes streamed.
        bytes: u64,
    },
    /// A move ended. Blocks not reported by `BlockMoved` stayed with the source.
    MoveFinished {
        /// The move.
        move_id: u64,
        /// `Err` names what failed.
        result: Result<(), String>,
        /// Seconds taken.
        secs: f64,
    },
    /// The answer to [`AmToEval::ProbeBandwidth`] (the fastest of a few tries).
    BandwidthProbe {
        /// The other evaluator.
        to: EvaluatorId,
        /// Bytes transferred.
        bytes: u64,
        /// Seconds from request to the last byte.
        secs: f64,
    },
    /// The answer to [`AmToEval::ProbeBandwidth`] when no transfer
    /// succeeded: the optimizer goes without that measurement.
    ProbeFailed {
        /// The other evaluator.
        to: EvaluatorId,
        /// Why.
        error: String,
    },
    /// The answer to [`AmToEval::Checkpoint`]: the blocks written, or why
    /// not.
    CheckpointWritten {
        /// The checkpoint's number.
        id: u64,
        /// The files written, or the error.
        result: Result<Vec<crate::checkpoint::BlockFile>, String>,
    },
    /// The answer to [`AmToEval::RestoreBlocks`]: every block restored and
    /// owned here, or why not (the blocks not restored are still arriving).
    BlocksRestored {
        /// The checkpoint's folder they were read from.
        folder: String,
        /// The blocks asked for.
        blocks: Vec<BlockId>,
        /// `Err` names the file and what was wrong with it.
        result: Result<(), String>,
    },
    /// Something failed that the evaluator cannot recover from; it will exit.
    Fatal {
        /// What it was doing and what went wrong.
        error: String,
    },
}

/// Kinds of task an evaluator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskKind {
    /// Trains on local input blocks.
    Worker,
    /// Serves model blocks and reports metrics.
    Server,
}
