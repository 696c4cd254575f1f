//! The messages on every channel: one enum per direction per channel.
//!
//! | channel | direction | enum |
//! |---|---|---|
//! | any (first frames) | both | [`Handshake`] |
//! | control | AM → evaluator | [`AmToEval`] |
//! | control | evaluator → AM | [`EvalToAm`] |
//! | data plane, requests | client → owner | [`ToOwner`] (carries [`PeerRequest`]) |
//! | data plane, requests | owner → client | [`ToClient`] (carries [`PeerResponse`]) |
//! | data plane, bulk | source → destination | [`BulkToDest`] |
//! | data plane, bulk | destination → source | [`BulkToSource`] |

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use cruise_conf::CruiseConfig;
use cruise_hdfs::Split;

/// Version of this protocol; both ends must agree.
pub const PROTOCOL_VERSION: u32 = 1;

/// An evaluator's id within a job, given by the AM at registration.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct EvaluatorId(pub u32);

impl std::fmt::Display for EvaluatorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for EvaluatorId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(EvaluatorId)
    }
}
/// A table's id.
pub type TableId = u8;
/// A block's index within its table.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    /// Its position in its table's list of blocks.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Blocks `0..n` of a table.
    pub fn all(n: u32) -> impl DoubleEndedIterator<Item = BlockId> + ExactSizeIterator {
        (0..n).map(BlockId)
    }
}

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
/// A key within a table.
pub type Key = u64;

/// The model table (on servers): the shared parameters.
pub const MODEL_TABLE: TableId = 0;
/// The input table (on workers): training records, one block per split.
pub const INPUT_TABLE: TableId = 1;
/// Worker-local state (on workers), co-partitioned with and moving with the input.
pub const STATE_TABLE: TableId = 2;

/// A job secret proof is an HMAC-SHA256 tag.
pub type Nonce = [u8; 32];

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

/// What a connection is for, declared in its first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    /// Evaluator → AM control channel.
    Control,
    /// Evaluator → evaluator store requests (pull, push, get, put, handover).
    Requests,
    /// Evaluator → evaluator bulk block transfer.
    Bulk,
}

/// The first frames of every connection. The connecting side says hello with a
/// nonce; the accepting side proves it knows the job secret and challenges;
/// the connecting side proves it too. Anything else is dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Handshake {
    /// Connecting side → accepting side.
    Hello {
        /// [`PROTOCOL_VERSION`] of the sender.
        protocol: u32,
        /// The job this connection belongs to.
        job_id: String,
        /// Who is connecting: a container id on the control channel, an
        /// evaluator id on the data plane.
        peer: String,
        /// What the connection is for.
        purpose: Purpose,
        /// Fresh random nonce.
        nonce: Nonce,
    },
    /// Accepting side → connecting side.
    Challenge {
        /// Fresh random nonce.
        nonce: Nonce,
        /// HMAC over both nonces, proving the accepting side knows the secret.
        proof: Vec<u8>,
    },
    /// Connecting side → accepting side.
    Proof {
        /// HMAC over both nonces and the hello, proving the connecting side knows the secret.
        proof: Vec<u8>,
    },
    /// Accepting side → connecting side: the connection may be used.
    Accepted,
    /// Accepting side → connecting side: refused; the connection closes.
    Rejected {
        /// Why.
        reason: String,
    },
}

// ---------------------------------------------------------------------------
// Control channel
// ---------------------------------------------------------------------------

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
    /// Compute the objective over all local input with the current model (no updates).
    Evaluate,
    /// Measure the bandwidth to another evaluator with a bulk transfer.
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
    /// Write the model blocks owned here into a checkpoint's folder, each
    /// copied under its own lock while training goes on. Answered by
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

/// Per-app objective statistics, summed over records.
///
/// `records` counts input records (the AM counts epochs with it); the loss is
/// a sum over `loss_terms` terms, which are records for MLR and Lasso,
/// observed entries for NMF and tokens for LDA (each app documents its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Records counted.
    pub records: u64,
    /// Sum of the loss terms.
    pub loss_sum: f64,
    /// Number of terms in `loss_sum`; 0 means one per record.
    pub loss_terms: u64,
    /// Records predicted correctly (apps without accuracy leave 0).
    pub correct: u64,
}

impl Stats {
    /// Adds another set of sums.
    pub fn add(&mut self, o: &Stats) {
        self.loss_terms = self.terms() + o.terms();
        self.records += o.records;
        self.loss_sum += o.loss_sum;
        self.correct += o.correct;
    }

    /// Number of loss terms (`loss_terms`, or `records` when that is 0).
    pub fn terms(&self) -> u64 {
        if self.loss_terms == 0 {
            self.records
        } else {
            self.loss_terms
        }
    }

    /// Mean loss per term (per record unless the app counts terms).
    pub fn mean_loss(&self) -> f64 {
        let n = self.terms();
        if n == 0 {
            f64::NAN
        } else {
            self.loss_sum / n as f64
        }
    }

    /// Fraction correct.
    pub fn accuracy(&self) -> f64 {
        if self.records == 0 {
            f64::NAN
        } else {
            self.correct as f64 / self.records as f64
        }
    }
}

/// A transfer with one peer during a mini-batch: bytes moved and the time
/// from sending the request to receiving its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkSample {
    /// The other evaluator.
    pub peer: EvaluatorId,
    /// Bytes of values sent or received.
    pub bytes: u64,
    /// Seconds from request to answer.
    pub secs: f64,
}

/// What a worker measured over one or more mini-batches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MiniBatchReport {
    /// Mini-batches summed in this report (a worker reports every few
    /// milliseconds, not every mini-batch); the figures below are totals.
    pub mini_batches: u32,
    /// The worker's local epoch (of the last mini-batch).
    pub clock: u32,
    /// Objective statistics of the mini-batch (before its update).
    pub stats: Stats,
    /// Seconds computing.
    pub comp_secs: f64,
    /// Round trip of the pull: from its request to its last answer.
    pub pull_secs: f64,
    /// Bytes pulled (values received).
    pub pull_bytes: u64,
    /// Round trip of the push: from its request to its last acknowledgement.
    pub push_secs: f64,
    /// Bytes pushed (deltas sent).
    pub push_bytes: u64,
    /// Wall time of the mini-batch in the worker's loop, waits, compute and
    /// reporting included: what the mini-batch cost the worker.
    pub batch_secs: f64,
    /// Of `batch_secs`, the time the worker's loop was blocked waiting for a
    /// pull's answer or for a push's acknowledgement (room in the pipeline).
    /// The rest, `batch_secs - wait_secs`, is the worker's own time: its
    /// computation plus the per-mini-batch work around it (key lists,
    /// applying its own pushes, routing requests), at the speed its CPU
    /// share allows.
    pub wait_secs: f64,
    /// The worker's own seconds: the time its mini-batches would take if
    /// every answer came at once (`crate::ps` says how it is measured).
    /// At least `batch_secs - wait_secs`, at most `batch_secs`.
    pub own_secs: f64,
    /// Of `own_secs`, the part that grows with the servers a mini-batch
    /// talks to, not with its records: its requests' CPU beyond encoding
    /// and decoding the values (the request connections' and the loop
    /// thread's hand-offs and wake-ups), at most two empty round trips a
    /// server, at the wall seconds a CPU second takes here (`crate::ps`
    /// says how it is measured).
    pub io_secs: f64,
    /// Per-peer transfers of the pull and the push (local parts excluded),
    /// of the timed ones only.
    pub links: Vec<LinkSample>,
    /// Mini-batches whose pull round trip is in `pull_secs`. A pull that was
    /// on its way while the worker computed on its own thread is not timed:
    /// its answer was read only once the computation ended.
    pub timed_pulls: u32,
    /// Mini-batches whose push round trip is in `push_secs` (a mini-batch
    /// without a push counts, at 0 s); untimed as pulls are.
    pub timed_pushes: u32,
}

impl MiniBatchReport {
    /// Adds a later report to this one: totals add up, the clock is the
    /// later one's, and transfer samples are kept (merge them per peer
    /// before sending).
    pub fn add(&mut self, o: &MiniBatchReport) {
        self.mini_batches += o.mini_batches;
        self.clock = o.clock;
        self.stats.add(&o.stats);
        self.comp_secs += o.comp_secs;
        self.pull_secs += o.pull_secs;
        self.pull_bytes += o.pull_bytes;
        self.push_secs += o.push_secs;
        self.push_bytes += o.push_bytes;
        self.batch_secs += o.batch_secs;
        self.wait_secs += o.wait_secs;
        self.own_secs += o.own_secs;
        self.io_secs += o.io_secs;
        self.links.extend_from_slice(&o.links);
        self.timed_pulls += o.timed_pulls;
        self.timed_pushes += o.timed_pushes;
    }
}

/// What a server measured over a period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerReport {
    /// Length of the period, seconds.
    pub period_secs: f64,
    /// Requests served.
    pub requests: u64,
    /// CPU seconds spent applying and reading values.
    pub busy_secs: f64,
    /// Bytes received in requests.
    pub bytes_in: u64,
    /// Bytes sent in responses.
    pub bytes_out: u64,
    /// The CPU seconds of the inbound connections' tasks over the period
    /// (reading, decoding, applying, encoding, writing: framing and system
    /// calls as well as the values), priced at what a CPU second costs
    /// here in wall time (`os::wall_per_cpu`: `1 / quota` under a CPU
    /// quota): the wall time serving takes at this container's CPU share.
    /// The runtime's parking and waking between requests is left out: it
    /// is paid per idle spell, and shrinks as the server nears saturation,
    /// which is when the cost model's server bound matters. Left out, a
    /// 0.09-CPU server's cost per worker mini-batch (MLR, 100 features)
    /// fell by 18–25%; it still falls with load (0.58–1.17 ms beside one
    /// worker, 0.40 ms beside seven).
    pub own_secs: f64,
    /// Of that, the part that grows with the bytes served, at the same
    /// price: applying and reading the values (`busy_secs`) and encoding
    /// and decoding them (`ps::codec_cpu_per_byte`). The rest is the
    /// requests' own cost, which spreading the model does not shrink.
    pub values_secs: f64,
}

// ---------------------------------------------------------------------------
// Data plane
// ---------------------------------------------------------------------------

/// Values of several keys, concatenated. Travels as raw little-endian bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueBatch {
    /// Length of each key's value.
    pub lens: Vec<u32>,
    /// All values, concatenated in key order.
    pub data: Vec<f32>,
}

impl ValueBatch {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Bytes of value data.
    pub fn byte_len(&self) -> usize {
        self.data.len() * 4
    }

    /// Iterates over the values as slices.
    pub fn iter(&self) -> impl Iterator<Item = &[f32]> {
        let mut off = 0usize;
        self.lens.iter().map(move |&l| {
            let s = &self.data[off..off + l as usize];
            off += l as usize;
            s
        })
    }

    /// Appends one value.
    pub fn push(&mut self, v: &[f32]) {
        self.lens.push(v.len() as u32);
        self.data.extend_from_slice(v);
    }
}

impl Serialize for ValueBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&self.lens)?;
        t.serialize_element(serde_bytes::Bytes::new(&f32s_to_le_bytes(&self.data)))?;
        t.end()
    }
}

impl<'de> Deserialize<'de> for ValueBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ValueBatch;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a value batch (lengths, little-endian f32 bytes)")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<ValueBatch, A::Error> {
                use serde::de::Error;
                let lens: Vec<u32> = a
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let F32Bytes(data) = a
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
                if total != data.len() as u64 {
                    return Err(A::Error::custom(format!(
                        "value lengths sum to {total} but {} values were sent",
                        data.len()
                    )));
                }
                Ok(ValueBatch { lens, data })
            }
        }
        d.deserialize_tuple(2, V)
    }
}

/// f32 values decoded straight from a byte string (one copy, no staging buffer).
struct F32Bytes(Vec<f32>);

impl<'de> Deserialize<'de> for F32Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = F32Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("little-endian f32 bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<F32Bytes, E> {
                if !b.len().is_multiple_of(4) {
                    return Err(E::custom("value bytes not a multiple of 4"));
                }
                if b.is_empty()
                    && let Some(tail) = TAIL.with(|t| t.borrow_mut().take())
                {
                    return Ok(F32Bytes(tail));
                }
                Ok(F32Bytes(le_bytes_to_f32s(b)))
            }
        }
        d.deserialize_bytes(V)
    }
}

thread_local! {
    /// Values read apart from their message (a frame's tail, see
    /// `protocol::frames`), for the next value bytes decoded on this thread.
    static TAIL: std::cell::RefCell<Option<Vec<f32>>> = const { std::cell::RefCell::new(None) };
}

/// Decodes a message sent with its values apart (`protocol::frames`): `meta`
/// is the message encoded with empty value bytes; `tail` takes their place.
/// An error if the message has no values to take them.
pub(crate) fn decode_with_tail<T>(
    tail: Vec<f32>,
    decode: impl FnOnce() -> Result<T, super::ProtocolError>,
) -> Result<T, super::ProtocolError> {
    TAIL.with(|t| *t.borrow_mut() = Some(tail));
    let out = decode();
    let unused = TAIL.with(|t| t.borrow_mut().take()).is_some();
    match out {
        Ok(_) if unused => Err(super::ProtocolError::Malformed(
            "a frame's values have no place in its message".into(),
        )),
        other => other,
    }
}

/// Messages whose large values may travel apart, after the rest of the
/// message (a frame's tail): the values are the message's last field.
pub trait ValueTail {
    /// The values, if the message carries any.
    fn tail(&self) -> Option<&[f32]>;
    /// Takes the values out, leaving none.
    fn take_tail(&mut self) -> Vec<f32>;
}

impl ValueTail for ToClient {
    fn tail(&self) -> Option<&[f32]> {
        match self {
            ToClient::Response {
                result: Ok(PeerResponse::Values(v)),
                ..
            } => Some(&v.data),
            _ => None,
        }
    }
    fn take_tail(&mut self) -> Vec<f32> {
        match self {
            ToClient::Response {
                result: Ok(PeerResponse::Values(v)),
                ..
            } => std::mem::take(&mut v.data),
            _ => Vec::new(),
        }
    }
}

impl ValueTail for ToOwner {
    fn tail(&self) -> Option<&[f32]> {
        match self {
            ToOwner::Request {
                req: PeerRequest::Put { values: v, .. } | PeerRequest::Update { deltas: v, .. },
                ..
            } => Some(&v.data),
            _ => None,
        }
    }
    fn take_tail(&mut self) -> Vec<f32> {
        match self {
            ToOwner::Request {
                req: PeerRequest::Put { values: v, .. } | PeerRequest::Update { deltas: v, .. },
                ..
            } => std::mem::take(&mut v.data),
            _ => Vec::new(),
        }
    }
}

/// f32 values as little-endian bytes (borrowed on little-endian machines).
pub fn f32s_to_le_bytes(v: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(v))
    } else {
        std::borrow::Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// Little-endian bytes back to f32 values (one copy).
pub fn le_bytes_to_f32s(b: &[u8]) -> Vec<f32> {
    if cfg!(target_endian = "little") {
        bytemuck::pod_collect_to_vec(b)
    } else {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// A store request to the owner of the blocks it touches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PeerRequest {
    /// Read values (pull). Answered by [`PeerResponse::Values`].
    Get {
        /// The table.
        table: TableId,
        /// The keys.
        keys: Vec<Key>,
    },
    /// Overwrite values. Answered by [`PeerResponse::Done`].
    Put {
        /// The table.
        table: TableId,
        /// The keys.
        keys: Vec<Key>,
        /// One value per key.
        values: ValueBatch,
    },
    /// Apply deltas with the table's update function (push). Answered by [`PeerResponse::Done`].
    Update {
        /// The table.
        table: TableId,
        /// The keys.
        keys: Vec<Key>,
        /// One delta per key.
        deltas: ValueBatch,
    },
    /// Migration: take ownership of a block and queue operations on it until
    /// its data arrives. Answered by [`PeerResponse::Done`].
    Handover {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// The move it belongs to.
        move_id: u64,
    },
    /// Bandwidth probe: answer with `bytes` of incompressible data. Answered
    /// by [`PeerResponse::Blob`].
    Probe {
        /// How many bytes.
        bytes: u64,
    },
    /// Migration failed after handover: the source asks to call the move
    /// off. If the block has not landed, the destination stops queueing,
    /// answers every operation it queued with a retryable error (none of them
    /// was applied) and forwards later ones to the source. If it has landed
    /// (the source lost the answer with its connection), the move stands.
    /// Idempotent. Answered by [`PeerResponse::HandoverOutcome`].
    AbortHandover {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
    },
}

/// The answer to a [`PeerRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PeerResponse {
    /// Values, in the order of the requested keys.
    Values(ValueBatch),
    /// Done.
    Done,
    /// Opaque bytes (the answer to a probe).
    Blob(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The answer to [`PeerRequest::AbortHandover`].
    HandoverOutcome {
        /// The destination had already installed the block: the move took
        /// place and the destination owns it. Otherwise the source does.
        installed: bool,
    },
}

/// An error answered to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    /// Whether the request was not applied and may be sent again.
    pub retry: bool,
    /// What went wrong, with context.
    pub message: String,
    /// Set by this evaluator's data plane, never sent: the request was on
    /// its way to this peer when the connection was lost, so whether it was
    /// applied is unknown — unless the peer has left the job, whose blocks
    /// then come back from a checkpoint that cannot hold it (the request
    /// is then sent again to their new owner).
    #[serde(skip)]
    pub lost_at: Option<EvaluatorId>,
}

impl RemoteError {
    /// A permanent failure.
    pub fn fatal(message: impl Into<String>) -> Self {
        RemoteError {
            retry: false,
            message: message.into(),
            lost_at: None,
        }
    }

    /// The request was not applied; sending it again is safe.
    pub fn retry(message: impl Into<String>) -> Self {
        RemoteError {
            retry: true,
            message: message.into(),
            lost_at: None,
        }
    }

    /// The request was in flight to `peer` when its connection was lost.
    pub fn lost_at(peer: EvaluatorId, message: impl Into<String>) -> Self {
        RemoteError {
            retry: false,
            message: message.into(),
            lost_at: Some(peer),
        }
    }
}

/// Client → owner frames on a request connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToOwner {
    /// A request, answered by a response with the same id.
    Request {
        /// Id chosen by the client, unique on the connection.
        id: u64,
        /// The request.
        req: PeerRequest,
    },
    /// Answer to [`ToClient::GoAway`]: every request before this frame has
    /// been sent; no more will come on this connection.
    GoAwayAck,
}

/// Owner → client frames on a request connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToClient {
    /// The answer to a request.
    Response {
        /// The request's id.
        id: u64,
        /// The outcome.
        result: Result<PeerResponse, RemoteError>,
    },
    /// The owner is leaving: send nothing new, acknowledge with [`ToOwner::GoAwayAck`].
    GoAway,
}

/// Source → destination frames on a bulk connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BulkToDest {
    /// A block's data begins.
    Begin {
        /// The move.
        move_id: u64,
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// Total bytes that follow in chunks.
        bytes: u64,
    },
    /// A piece of the current block's encoded data.
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The current block is complete; install it and answer.
    End,
}

/// Destination → source frames on a bulk connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BulkToSource {
    /// The block is installed and owned by the destination.
    Installed {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
    },
    /// The block could not be installed.
    Failed {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_batch_round_trip() {
        let mut b = ValueBatch::default();
        b.push(&[1.0, -2.5]);
        b.push(&[]);
        b.push(&[f32::MAX]);
        let bytes = postcard::to_allocvec(&b).unwrap();
        let back: ValueBatch = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, b);
        let vals: Vec<&[f32]> = back.iter().collect();
        assert_eq!(vals, vec![&[1.0, -2.5][..], &[][..], &[f32::MAX][..]]);
    }

    #[test]
    fn stats_count_loss_terms() {
        let per_record = Stats {
            records: 2,
            loss_sum: 4.0,
            loss_terms: 0,
            correct: 1,
        };
        assert_eq!(per_record.mean_loss(), 2.0);
        let per_token = Stats {
            records: 1,
            loss_sum: 6.0,
            loss_terms: 6,
            correct: 0,
        };
        let mut sum = Stats::default();
        sum.add(&per_record);
        sum.add(&per_token);
        assert_eq!((sum.records, sum.loss_terms, sum.correct), (3, 8, 1));
        assert_eq!(sum.mean_loss(), 10.0 / 8.0);
        assert!(Stats::default().mean_loss().is_nan());
    }

    #[test]
    fn value_batch_lengths_checked() {
        let bad = ValueBatch {
            lens: vec![3],
            data: vec![1.0],
        };
        let bytes = postcard::to_allocvec(&bad).unwrap();
        assert!(postcard::from_bytes::<ValueBatch>(&bytes).is_err());
    }
}
