//! Parameter-server roles run inside an evaluator.
//!
//! - [`load_input`]: read input splits, parse them with the app, store them as
//!   input blocks (and the app's worker-local state beside them).
//! - [`run_worker`]: the worker task, on a thread of its own (the
//!   evaluator's runtime thread keeps serving the connections meanwhile). For
//!   each local input block, for each mini-batch: pull the model keys it
//!   needs, compute, push the deltas. With `job.pipeline` the pulls of the
//!   next `job.pipeline_depth` mini-batches are already on their way and
//!   pushes are not awaited until the pipeline is full; measurements are
//!   summed and reported every 20 ms. Between local epochs it ticks its clock
//!   and, under SSP, waits until the slowest worker is within the staleness
//!   bound.
//! - [`evaluate`]: the objective over all local input with the current model;
//!   [`evaluate_held_out`]: the same over held-out splits, read and dropped.
//! - [`dump_model`]: send the model blocks held here to the AM.
//! - [`run_server`]: the server task: blocks are served by the data plane
//!   whatever the role; this task reports serving metrics periodically.
//!
//! Roles share one [`DataPlane`] and [`Store`], so an evaluator switches role
//! without restarting, and blocks stay where they are until moved.
//!
//! The worker's pipeline is here; loading lives in `input`, evaluation and
//! the model dump in `eval`, the server task in `server`, and what a
//! mini-batch costs its worker (the figures the cost model prices it by) in
//! `cost`.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::apps::{App, Step};
use crate::peer::DataPlane;
use crate::protocol::{
    BlockId, EvalToAm, INPUT_TABLE, Key, LinkSample, MODEL_TABLE, MiniBatchReport, PeerResponse,
    TaskKind, ValueBatch, WorkerTask,
};
use crate::store::{InputBlock, ModelFunctions, OpKind, PartResult, Store, StoreOp, value_offsets};

mod cost;
mod eval;
mod input;
mod server;

use cost::{BatchMark, RequestCpu, RequestPricing, finish, model_servers, round_trip_cpu};
pub use cost::{codec_cpu_per_byte, io_secs, own_secs};
pub use eval::{dump_model, evaluate, evaluate_held_out};
pub use input::{load_input, read_input};
pub use server::{SERVER_REPORT_PERIOD, run_server};

/// Errors of the PS roles.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// Reading input failed.
    #[error("cannot read input {uri}: {source}")]
    Read {
        /// The file.
        uri: String,
        /// Why.
        #[source]
        source: Box<cruise_hdfs::HdfsError>,
    },
    /// A record is malformed.
    #[error("{uri}:{line}: {message}")]
    Parse {
        /// The file.
        uri: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A pull or push failed.
    #[error("{what} failed: {message}")]
    Remote {
        /// Pull or push.
        what: &'static str,
        /// Why.
        message: String,
    },
    /// The store refused.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The AM's channel is gone.
    #[error("the control channel to the AM is closed")]
    ChannelClosed,
}

/// What a worker task needs.
pub struct WorkerContext {
    /// The data plane (pulls and pushes go through it).
    pub dp: DataPlane,
    /// The app.
    pub app: Arc<dyn App>,
    /// Reports to the AM.
    pub to_am: mpsc::Sender<EvalToAm>,
    /// Cancelled to ask the worker to stop after the current mini-batch.
    pub stop: CancellationToken,
    /// The slowest worker's clock, from the AM (SSP).
    pub min_clock: watch::Receiver<u32>,
    /// Records per mini-batch.
    pub mini_batch: usize,
    /// The task's parameters.
    pub task: WorkerTask,
    /// Mini-batches pulled ahead and pushes left unacknowledged, at most:
    /// `job.pipeline_depth` with `job.pipeline`, 0 without (pull, compute,
    /// push and wait).
    pub pipeline_depth: usize,
}

/// Mini-batches a block of `n` records is cut into at mini-batch size
/// `size`: `n / size` rounded to the nearest (at least one). The cost model
/// counts communication rounds with it.
pub fn mini_batch_count(n: usize, size: usize) -> usize {
    let size = size.max(1);
    if n == 0 {
        0
    } else {
        ((n + size / 2) / size).max(1)
    }
}

/// A block's rows cut into [`mini_batch_count`] mini-batches whose sizes
/// differ by at most one. Mini-batches do not span blocks: cut at `size`, a
/// block of 156 records at 100 made a mini-batch of 56 that cost a whole
/// round trip (28% more round trips than records / size in the benchmarks'
/// data sets); a block of 312 now makes 3 of 104 instead of 4.
fn batches(n: usize, size: usize) -> impl Iterator<Item = Range<usize>> {
    let k = mini_batch_count(n, size);
    let base = n.checked_div(k).unwrap_or(0);
    let extra = n.checked_rem(k).unwrap_or(0);
    (0..k).map(move |i| {
        let start = i * base + i.min(extra);
        start..start + base + usize::from(i < extra)
    })
}

async fn pull(dp: &DataPlane, keys: &[Key]) -> Result<ValueBatch, PsError> {
    pulled(dp.execute(pull_op(keys.to_vec())).await)
}

fn pull_op(keys: Vec<Key>) -> StoreOp {
    StoreOp {
        kind: OpKind::Get,
        table: MODEL_TABLE,
        keys,
        values: ValueBatch::default(),
    }
}

fn pulled(r: PartResult) -> Result<ValueBatch, PsError> {
    match r {
        Ok(PeerResponse::Values(v)) => Ok(v),
        Ok(other) => Err(PsError::Remote {
            what: "pull",
            message: format!("unexpected answer {other:?}"),
        }),
        Err(e) => Err(PsError::Remote {
            what: "pull",
            message: e.message,
        }),
    }
}

/// Sums the samples of each peer over a report (the pulls and pushes of its
/// mini-batches to the same server).
fn merge_links(samples: Vec<LinkSample>) -> Vec<LinkSample> {
    let mut out: Vec<LinkSample> = Vec::new();
    for s in samples {
        match out.iter_mut().find(|o| o.peer == s.peer) {
            Some(o) => {
                o.bytes += s.bytes;
                o.secs += s.secs;
            }
            None => out.push(s),
        }
    }
    out
}

/// The round trip of a request from its per-peer samples: until its last
/// answer arrived. Requests served wholly here have no samples and took
/// `waited`.
fn round_trip(samples: &[LinkSample], waited: f64) -> f64 {
    samples
        .iter()
        .map(|s| s.secs)
        .reduce(f64::max)
        .unwrap_or(waited)
}

/// A worker that holds all the job's input pulls at least this many
/// mini-batches ahead. Alone, it misses no one's pushes but its own, and
/// those are applied to what it pulls ([`apply_own_pushes`]): it computes on
/// the same values at any depth, and deeper only hides more of the round
/// trip. Measured with 1 worker + 1 server (20 epochs, records/s): MLR
/// 50k × 1000 at B = 100 0.61–0.66M at depth 4, 0.61–0.73M at 8; Lasso
/// 20k × 100 0.87–0.98M at 4, 1.08–1.34M at 8.
pub const LONE_WORKER_DEPTH: usize = 8;

/// The pipeline depth of a local epoch: `configured` (0 without
/// pipelining), deepened to [`LONE_WORKER_DEPTH`] when `input_owners`, the
/// workers holding input, are this one alone. (The AM's cost model divides
/// round trips by the same depth.)
pub fn pipeline_depth(configured: usize, input_owners: usize) -> usize {
    if configured > 0 && input_owners <= 1 {
        configured.max(LONE_WORKER_DEPTH)
    } else {
        configured
    }
}

/// How often a worker sends its (summed) mini-batch measurements to the AM.
const REPORT_EVERY: Duration = Duration::from_millis(20);

type Traced = BoxFuture<'static, (PartResult, Vec<LinkSample>)>;

/// A mini-batch whose pull is on its way.
struct Prefetched {
    block: BlockId,
    input: Arc<InputBlock>,
    rows: Range<usize>,
    keys: Vec<Key>,
    pull: Traced,
    /// Pushes this worker had sent when the pull went out: the answer
    /// reflects those, and not the ones sent since.
    seen: u64,
}

/// A push this worker sent, kept until every pull on its way reflects it.
struct SentPush {
    seq: u64,
    op: Arc<StoreOp>,
    /// Where each key's delta starts in `op.values` ([`value_offsets`]).
    offsets: Vec<usize>,
}

/// Applies to pulled `values` (laid out as the sorted `keys`) this worker's
/// own pushes that the pull did not see yet (each with its
/// [`value_offsets`], oldest first), through the model's update function:
/// the worker then computes on what the servers will hold once those pushes
/// land — its own writes are never stale, however far it pulls ahead. Other
/// workers' pushes in flight are missed as in any asynchronous PS.
///
/// One pass over the pulled keys, merging every push's sorted keys at once:
/// a key's value is updated by all its deltas while it is in cache, with
/// one call of the update function.
fn apply_own_pushes(
    model: &dyn ModelFunctions,
    keys: &[Key],
    values: &mut ValueBatch,
    pushes: &[(&StoreOp, &[usize])],
) {
    // A malformed answer (not one value per key) is left for the app's own
    // checks to refuse.
    let total: usize = values.lens.iter().map(|&l| l as usize).sum();
    if values.lens.len() != keys.len() || values.data.len() != total {
        return;
    }
    let mut next = vec![0usize; pushes.len()];
    let mut deltas: Vec<&[f32]> = Vec::with_capacity(pushes.len());
    let mut at = 0usize;
    for (a, &key) in keys.iter().enumerate() {
        let la = values.lens[a] as usize;
        deltas.clear();
        for ((op, offsets), b) in pushes.iter().zip(next.iter_mut()) {
            // Both key lists are sorted.
            while *b < op.keys.len() && op.keys[*b] < key {
                *b += 1;
            }
            if *b < op.keys.len() && op.keys[*b] == key {
                let (o, l) = (offsets[*b], op.values.lens[*b] as usize);
                if l == la {
                    deltas.push(&op.values.data[o..o + l]);
                }
                *b += 1;
            }
        }
        if !deltas.is_empty() {
            model.update_all(key, &mut values.data[at..at + la], &deltas);
        }
        at += la;
    }
}

/// A push on its way and the report it completes.
struct InFlightPush {
    push: Traced,
    report: MiniBatchReport,
}

/// The mini-batches of one local epoch, block after block. Blocks that move
/// away mid-epoch are skipped from then on (their new owner trains on them).
struct EpochCursor {
    blocks: std::vec::IntoIter<BlockId>,
    current: Option<(BlockId, Arc<InputBlock>, std::vec::IntoIter<Range<usize>>)>,
    mini_batch: usize,
}

impl EpochCursor {
    fn new(store: &Store, mini_batch: usize) -> Self {
        EpochCursor {
            blocks: store.local_blocks(INPUT_TABLE).into_iter(),
            current: None,
            mini_batch,
        }
    }

    /// The next mini-batch of a block still held here.
    fn next(&mut self, store: &Store) -> Option<(BlockId, Arc<InputBlock>, Range<usize>)> {
        loop {
            if let Some((block, input, rows)) = &mut self.current {
                if store.is_owned(INPUT_TABLE, *block)
                    && let Some(r) = rows.next()
                {
                    return Some((*block, Arc::clone(input), r));
                }
                self.current = None;
            }
            let block = self.blocks.next()?;
            // The block may have moved away since the list was taken.
            if let Some(input) = store.input_block(block) {
                let rows: Vec<Range<usize>> = batches(input.len(), self.mini_batch).collect();
                self.current = Some((block, input, rows.into_iter()));
            }
        }
    }

    /// Stops handing out mini-batches of `block` (it moved away).
    fn skip_block(&mut self, block: BlockId) {
        if self.current.as_ref().is_some_and(|c| c.0 == block) {
            self.current = None;
        }
    }
}

/// The model keys of each mini-batch, from the app, kept across epochs: a
/// mini-batch needs the same keys every epoch, and listing them (distinct and
/// sorted, from every entry of every record) cost MLR at B = 100 a tenth of
/// its worker's time. Entries are tied to the block's records (the
/// `Arc<InputBlock>` they were listed from): a block that is moved away and
/// back is listed again, and the keys of blocks no longer here are dropped
/// at the start of each local epoch. At most [`KeyCache::MAX_BYTES`] of
/// keys are kept; beyond that they are listed every time.
#[derive(Default)]
struct KeyCache {
    blocks: HashMap<BlockId, CachedBlock>,
    bytes: usize,
}

struct CachedBlock {
    /// The records the keys were listed from.
    input: Arc<InputBlock>,
    /// Keys by the mini-batch's first row.
    batches: HashMap<usize, Vec<Key>>,
}

impl KeyCache {
    const MAX_BYTES: usize = 64 << 20;

    /// The keys of `rows` of `input` (block `block`), sorted and distinct.
    fn keys(
        &mut self,
        app: &dyn App,
        block: BlockId,
        input: &Arc<InputBlock>,
        rows: Range<usize>,
    ) -> Vec<Key> {
        let entry = self.blocks.get(&block);
        if let Some(keys) = entry
            .filter(|c| Arc::ptr_eq(&c.input, input))
            .and_then(|c| c.batches.get(&rows.start))
        {
            return keys.clone();
        }
        let mut keys = Vec::new();
        app.keys(input, rows.clone(), &mut keys);
        if entry.is_some_and(|c| !Arc::ptr_eq(&c.input, input)) {
            self.forget(block);
        }
        let size = keys.len() * std::mem::size_of::<Key>();
        if self.bytes + size <= Self::MAX_BYTES {
            self.bytes += size;
            self.blocks
                .entry(block)
                .or_insert_with(|| CachedBlock {
                    input: Arc::clone(input),
                    batches: HashMap::new(),
                })
                .batches
                .insert(rows.start, keys.clone());
        }
        keys
    }

    /// Drops the keys of `block` (moved away).
    fn forget(&mut self, block: BlockId) {
        if let Some(c) = self.blocks.remove(&block) {
            let size: usize = c.batches.values().map(Vec::len).sum();
            self.bytes -= size * std::mem::size_of::<Key>();
        }
    }

    /// Drops the keys of the blocks `held` says are no longer here (and
    /// with them the records they hold on to).
    fn retain(&mut self, held: impl Fn(BlockId) -> bool) {
        let gone: Vec<BlockId> = self.blocks.keys().copied().filter(|&b| !held(b)).collect();
        for b in gone {
            self.forget(b);
        }
    }
}

/// Sums a worker's mini-batch reports and sends them to the AM every
/// [`REPORT_EVERY`] (and when flushed): one control message per mini-batch
/// would cost the AM a wake-up each, thousands a second.
struct Reporter {
    to_am: mpsc::Sender<EvalToAm>,
    sum: Option<MiniBatchReport>,
    since: Instant,
}

impl Reporter {
    fn new(to_am: mpsc::Sender<EvalToAm>) -> Self {
        Reporter {
            to_am,
            sum: None,
            since: Instant::now(),
        }
    }

    fn add(&mut self, r: MiniBatchReport) {
        match &mut self.sum {
            None => self.sum = Some(r),
            Some(s) => s.add(&r),
        }
    }

    async fn maybe_send(&mut self) -> Result<(), PsError> {
        if self.since.elapsed() >= REPORT_EVERY {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), PsError> {
        self.since = Instant::now();
        let Some(mut r) = self.sum.take() else {
            return Ok(());
        };
        r.links = merge_links(std::mem::take(&mut r.links));
        self.send(EvalToAm::MiniBatch(r)).await
    }

    async fn send(&self, m: EvalToAm) -> Result<(), PsError> {
        self.to_am.send(m).await.map_err(|_| PsError::ChannelClosed)
    }
}

/// Waits for a push in flight; returns its mini-batch's report completed
/// with the push's round trip and transfers, and how long this waited.
async fn complete_push(p: InFlightPush) -> Result<MiniBatchReport, PsError> {
    let t = Instant::now();
    let (r, samples) = p.push.await;
    let waited = t.elapsed().as_secs_f64();
    r.map_err(|e| PsError::Remote {
        what: "push",
        message: e.message,
    })?;
    let mut report = p.report;
    report.push_secs = round_trip(&samples, waited);
    report.links.extend(samples);
    report.timed_pushes = 1;
    Ok(report)
}

/// Flushes every push in flight, oldest first, and the reports.
async fn flush_pushes(
    reporter: &mut Reporter,
    pushes: &mut VecDeque<InFlightPush>,
) -> Result<(), PsError> {
    while let Some(p) = pushes.pop_front() {
        reporter.add(complete_push(p).await?);
    }
    reporter.flush().await
}

/// Runs the worker task until `stop` is cancelled (between mini-batches),
/// on a thread of its own; returns when it has ended. Reports `TaskStopped`
/// when it returns normally.
///
/// The worker's loop runs on a blocking-pool thread
/// ([`tokio::runtime::Handle::block_on`]), so that its computations never
/// hold up the caller's runtime: the evaluator's (single) runtime thread
/// keeps encoding, sending and reading the data plane's frames, serving the
/// blocks held here and stamping answers as they arrive (the round trips the
/// optimizer fits are then right), while the worker computes. Measured with
/// MLR at B = 100 (50k × 1000, 1 worker + 1 server, 20 epochs), alternating
/// with the inline version: 400–440k → 450–520k records/s at the same
/// pipeline depth (2).
///
/// If this future is dropped before the loop ends (its task aborted, or
/// its runtime shutting down), the loop's thread is told to give up at its
/// next await and ends: no thread outlives its task, and a runtime's
/// shutdown, which waits for its blocking threads, is not held by a worker
/// waiting for an answer that will not come.
pub async fn run_worker(ctx: WorkerContext) -> Result<(), PsError> {
    let rt = tokio::runtime::Handle::current();
    let waits = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let timed = crate::os::OffPollCpu::new(worker_loop(ctx, Arc::clone(&waits)), waits);
    let abandoned = tokio_util::sync::CancellationToken::new();
    let _abandon_when_dropped = abandoned.clone().drop_guard();
    tokio::task::spawn_blocking(move || {
        rt.block_on(async move {
            tokio::select! {
                r = timed => r,
                _ = abandoned.cancelled() => Err(PsError::Remote {
                    what: "worker",
                    message: "abandoned by its task before it ended".into(),
                }),
            }
        })
    })
    .await
    .map_err(|e| PsError::Remote {
        what: "worker",
        message: format!("the worker's thread failed: {e}"),
    })?
}

/// The worker's loop (see [`run_worker`]).
///
/// Each mini-batch pulls the model keys it needs, computes, and pushes the
/// deltas. Without `pipeline` that is all, one step after the other. With
/// it, `d = pipeline_depth` mini-batches are pulled ahead and as many pushes
/// go unacknowledged: after computing mini-batch `i` the worker sends its
/// push and the pull of `i + d` together (one write, one wake-up of the
/// server), so the answer it waits for next was asked for `d - 1`
/// mini-batches earlier. Requests to one server travel in order on one
/// connection, so the pull of `i + d` sees every push up to `i`; the
/// worker's pushes sent after a pull are applied to the pulled values here
/// ([`apply_own_pushes`]), so a worker never computes on a model missing its
/// own updates (without it, MLR on 4 containers lost 5 points of accuracy
/// in the first epochs). Pushes are flushed at the end of every local epoch
/// (before the clock ticks, so SSP's bound holds) and before the task stops.
async fn worker_loop(
    mut ctx: WorkerContext,
    waits: Arc<std::sync::atomic::AtomicU64>,
) -> Result<(), PsError> {
    let store = ctx.dp.store().clone();
    let mut clock = ctx.task.start_clock;
    let mut pushes: VecDeque<InFlightPush> = VecDeque::new();
    // This worker's pushes so far, and the recent ones a pull on its way may
    // not reflect.
    let mut pushed: u64 = 0;
    let mut recent: VecDeque<SentPush> = VecDeque::new();
    let model = ctx.app.model();
    let mut reporter = Reporter::new(ctx.to_am.clone());
    let mut key_cache = KeyCache::default();
    let dp = ctx.dp.clone();
    let pricing = RequestPricing {
        codec_per_byte: codec_cpu_per_byte(dp.frame_options()),
        round_trip: round_trip_cpu(&dp, &waits).await.unwrap_or(f64::INFINITY),
    };
    tracing::debug!(?pricing, "a worker's request CPU");
    let request_cpu = || RequestCpu {
        connections: dp.request_cpu_secs(),
        on_loop: dp.forward_cpu_secs()
            + waits.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9,
    };
    'epochs: loop {
        let depth = pipeline_depth(ctx.pipeline_depth, store.owner_count(INPUT_TABLE));
        if let Some(s) = ctx.task.staleness {
            // SSP: wait until the slowest worker is within `s` epochs.
            loop {
                if ctx.stop.is_cancelled() {
                    break 'epochs;
                }
                if clock <= *ctx.min_clock.borrow() + s {
                    break;
                }
                tokio::select! {
                    _ = ctx.stop.cancelled() => break 'epochs,
                    r = ctx.min_clock.changed() => if r.is_err() { break 'epochs },
                }
            }
        }
        key_cache.retain(|b| store.is_owned(INPUT_TABLE, b));
        let mut cursor = EpochCursor::new(&store, ctx.mini_batch);
        let mut ahead: VecDeque<Prefetched> = VecDeque::new();
        // Issues pulls until `n` mini-batches are on their way.
        let mut refill =
            |ahead: &mut VecDeque<Prefetched>, cursor: &mut EpochCursor, n: usize, seen: u64| {
                while ahead.len() < n {
                    let Some((block, input, rows)) = cursor.next(&store) else {
                        break;
                    };
                    let keys = key_cache.keys(&*ctx.app, block, &input, rows.clone());
                    let pull = ctx.dp.execute_traced(pull_op(keys.clone()));
                    ahead.push_back(Prefetched {
                        block,
                        input,
                        rows,
                        keys,
                        pull,
                        seen,
                    });
                }
            };
        refill(&mut ahead, &mut cursor, depth.max(1), pushed);
        if ahead.is_empty() {
            // No input here (yet): wait for a stop or a block to arrive.
            tokio::select! {
                _ = ctx.stop.cancelled() => break 'epochs,
                _ = tokio::time::sleep(Duration::from_millis(20)) => continue 'epochs,
            }
        }
        let mut last = BatchMark::now(request_cpu());
        let mut counted = (u64::MAX, 0usize);
        while let Some(cur) = ahead.pop_front() {
            if ctx.stop.is_cancelled() {
                break 'epochs;
            }
            if !store.is_owned(INPUT_TABLE, cur.block) {
                // Moved away mid-pass: its new owner trains on it now.
                cursor.skip_block(cur.block);
                ahead.retain(|p| p.block != cur.block);
                refill(&mut ahead, &mut cursor, depth.max(1), pushed);
                continue;
            }
            let t0 = Instant::now();
            let (r, links) = cur.pull.await;
            let waited = t0.elapsed().as_secs_f64();
            // Time this mini-batch's loop spent blocked (not its own work).
            let mut blocked = waited;
            let mut values = pulled(r)?;
            let pull_secs = round_trip(&links, waited);
            let unseen: Vec<(&StoreOp, &[usize])> = recent
                .iter()
                .filter(|p| p.seq >= cur.seen)
                .map(|p| (&*p.op, p.offsets.as_slice()))
                .collect();
            if !unseen.is_empty() {
                apply_own_pushes(&*model, &cur.keys, &mut values, &unseen);
            }
            let pull_bytes = values.byte_len() as u64;

            let step = Step { clock };
            let t1 = Instant::now();
            let out = if ctx.app.has_state() {
                store.with_state(cur.block, |s| {
                    ctx.app.compute(
                        &cur.input,
                        cur.rows.clone(),
                        &cur.keys,
                        &values,
                        Some(s),
                        step,
                    )
                })
            } else {
                Some(
                    ctx.app
                        .compute(&cur.input, cur.rows.clone(), &cur.keys, &values, None, step),
                )
            };
            let ks = cur.keys;
            crate::emulate::stretch_compute(t1.elapsed()).await;
            let comp_secs = t1.elapsed().as_secs_f64();
            let Some((deltas, stats)) = out else {
                // The block's state moved away mid-way: skip this mini-batch.
                refill(&mut ahead, &mut cursor, depth.max(1), pushed);
                continue;
            };
            // Room for this push: the oldest beyond the depth must be answered.
            while depth > 0 && pushes.len() >= depth {
                let Some(p) = pushes.pop_front() else { break };
                let t = Instant::now();
                let done = complete_push(p).await?;
                blocked += t.elapsed().as_secs_f64();
                reporter.add(done);
            }
            let mut report = MiniBatchReport {
                mini_batches: 1,
                clock,
                stats,
                comp_secs,
                pull_secs,
                pull_bytes,
                push_secs: 0.0,
                push_bytes: deltas.byte_len() as u64,
                batch_secs: 0.0,
                wait_secs: blocked,
                own_secs: 0.0,
                io_secs: 0.0,
                links,
                timed_pulls: 1,
                // Without a push its round trip is known (0 s); with one,
                // completing the push says.
                timed_pushes: u32::from(deltas.is_empty()),
            };
            if deltas.is_empty() {
                last = finish(
                    &mut report,
                    last,
                    request_cpu(),
                    pricing,
                    model_servers(&store, &mut counted),
                );
                reporter.add(report);
                refill(&mut ahead, &mut cursor, depth.max(1), pushed);
            } else {
                let op = Arc::new(StoreOp {
                    kind: OpKind::Update,
                    table: MODEL_TABLE,
                    keys: ks,
                    values: deltas,
                });
                let push = InFlightPush {
                    push: ctx.dp.execute_arc_traced(Arc::clone(&op)),
                    report,
                };
                pushed += 1;
                if depth > 0 {
                    // Kept while a pull on its way may not reflect it.
                    recent.push_back(SentPush {
                        seq: pushed - 1,
                        offsets: value_offsets(&op.values),
                        op,
                    });
                    let oldest_seen = ahead.iter().map(|p| p.seen).min().unwrap_or(pushed);
                    // The next pull goes out with this push (and sees it).
                    refill(&mut ahead, &mut cursor, depth, pushed);
                    while recent.front().is_some_and(|p| p.seq < oldest_seen) {
                        recent.pop_front();
                    }
                    let mut p = push;
                    last = finish(
                        &mut p.report,
                        last,
                        request_cpu(),
                        pricing,
                        model_servers(&store, &mut counted),
                    );
                    pushes.push_back(p);
                } else {
                    let t = Instant::now();
                    let mut r = complete_push(push).await?;
                    r.wait_secs += t.elapsed().as_secs_f64();
                    last = finish(
                        &mut r,
                        last,
                        request_cpu(),
                        pricing,
                        model_servers(&store, &mut counted),
                    );
                    reporter.add(r);
                    refill(&mut ahead, &mut cursor, 1, pushed);
                }
            }
            reporter.maybe_send().await?;
        }
        // End of the local epoch: every push is applied and reported before
        // the clock ticks.
        flush_pushes(&mut reporter, &mut pushes).await?;
        recent.clear();
        clock += 1;
        tracing::debug!(
            clock,
            loop_cpu = crate::os::thread_cpu_secs(),
            connections = dp.request_cpu_secs(),
            connections_idle = dp.request_idle_cpu_secs(),
            forward = dp.forward_cpu_secs(),
            waits = waits.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9,
            servers = model_servers(&store, &mut counted),
            pushed,
            "worker CPU so far, seconds"
        );
        reporter.send(EvalToAm::ClockTick { clock }).await?;
    }
    // Stopping: flush the pushes in flight before saying so.
    flush_pushes(&mut reporter, &mut pushes).await?;
    reporter
        .send(EvalToAm::TaskStopped {
            task: TaskKind::Worker,
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::EvaluatorId;

    /// A worker's own time is its process's CPU time at what a CPU second
    /// costs it, between the loop's own wall time and the mini-batch's.
    #[test]
    fn own_time_counts_the_process_cpu_at_its_share() {
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} != {b}");
        // A free core: 3 s of the process's CPU in a 4 s mini-batch, 2 s
        // of it spent waiting.
        close(own_secs(4.0, 2.0, 1.0, 3.0, 1.0), 3.0);
        // A quarter-core quota: 0.75 CPU seconds take 3 s of wall time,
        // however fast the computation ran in a burst (1 s here).
        close(own_secs(4.0, 2.0, 1.0, 0.75, 4.0), 3.0);
        // Never less than the loop's own time outside its waits...
        close(own_secs(4.0, 1.0, 1.0, 0.25, 4.0), 3.0);
        // ...nor than the computation's wall time...
        close(own_secs(4.0, 3.5, 1.0, 0.1, 1.0), 1.0);
        // ...nor more than the mini-batch (threads on free cores in parallel).
        close(own_secs(4.0, 1.0, 1.0, 9.0, 1.0), 4.0);
        // Without a CPU clock (0): the loop's own time.
        close(own_secs(4.0, 2.5, 1.0, 0.0, 1.0), 1.5);
    }

    /// The off-loop part of the own time is the request connections' CPU
    /// at its share, and never more than the own time.
    #[test]
    fn io_time_is_the_request_connections_cpu() {
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} != {b}");
        // 0.1 CPU-s on the request connections at 4 wall/CPU.
        close(io_secs(3.0, 0.1, 4.0), 0.4);
        // Capped by the own time.
        close(io_secs(0.2, 0.1, 4.0), 0.2);
        // A counter read out of order gives 0, not less.
        close(io_secs(3.0, -0.05, 1.0), 0.0);
    }

    /// Encoding and decoding values costs some CPU per byte, far less
    /// than a microsecond (it runs at hundreds of MB/s or more).
    #[test]
    fn codec_cost_per_byte_is_measured() {
        let opts = crate::protocol::FrameOptions::data(&cruise_conf::ChannelConfig::default());
        let per_byte = codec_cpu_per_byte(opts);
        assert!(per_byte > 0.0 && per_byte < 1e-6, "{per_byte}");
    }

    #[test]
    fn a_lone_worker_pulls_deeper() {
        assert_eq!(pipeline_depth(0, 1), 0, "no pipelining stays off");
        assert_eq!(pipeline_depth(2, 1), LONE_WORKER_DEPTH);
        assert_eq!(pipeline_depth(2, 0), LONE_WORKER_DEPTH);
        assert_eq!(pipeline_depth(16, 1), 16);
        assert_eq!(pipeline_depth(2, 3), 2);
    }

    const UNPRICED: RequestPricing = RequestPricing {
        codec_per_byte: 0.0,
        round_trip: f64::INFINITY,
    };

    /// A mini-batch's request CPU is priced per server up to two round
    /// trips a server; beyond, it stays in the own time (per record).
    #[test]
    fn request_cpu_per_server_is_at_most_two_round_trips_a_server() {
        let io_of = |round_trip: f64, servers: usize| {
            let since = BatchMark::now(RequestCpu::default());
            std::thread::sleep(Duration::from_millis(50));
            let mut r = MiniBatchReport::default();
            let spent = RequestCpu {
                connections: 0.01,
                on_loop: 0.002,
            };
            let pricing = RequestPricing {
                codec_per_byte: 0.0,
                round_trip,
            };
            finish(&mut r, since, spent, pricing, servers);
            (r.io_secs, r.own_secs)
        };
        let wpc = crate::os::wall_per_cpu();
        let close = |(io, own): (f64, f64), cpu: f64| {
            let want = (cpu * wpc).min(own);
            assert!((io - want).abs() < 1e-12, "{io} != {want}");
        };
        // 12 ms of request CPU; round trips of 1 ms: 2 ms a server.
        close(io_of(1e-3, 2), 4e-3);
        close(io_of(1e-3, 5), 10e-3);
        close(io_of(1e-3, 7), 12e-3);
        // Unknown round trip: all of it.
        close(io_of(f64::INFINITY, 1), 12e-3);
    }

    /// A round trip to the evaluator's own data-plane port costs its
    /// request connection some CPU, far less than a millisecond on a free
    /// core.
    #[tokio::test]
    async fn an_empty_round_trip_is_measured() {
        use crate::protocol::auth::Secret;
        let store = crate::store::Store::new(EvaluatorId(1));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let settings = crate::peer::PeerSettings {
            job_id: "job_round_trip_0001".into(),
            secret: Secret::generate(),
            frames: crate::protocol::FrameOptions::default(),
            connect_timeout: Duration::from_secs(5),
            chunk_bytes: 1 << 16,
            drain_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
        };
        let dp = DataPlane::start(
            EvaluatorId(1),
            store,
            listener,
            settings,
            Default::default(),
            &cancel,
        )
        .unwrap();
        let waits = std::sync::atomic::AtomicU64::new(0);
        assert_eq!(
            round_trip_cpu(&dp, &waits).await,
            None,
            "not in its directory yet"
        );
        dp.set_peers(&[(EvaluatorId(1), addr)]);
        let cpu = round_trip_cpu(&dp, &waits).await.expect("measured");
        assert!(cpu > 0.0 && cpu < 1e-3, "{cpu}");
        dp.shutdown().await;
    }

    /// A worker whose task is dropped while it waits for an answer that
    /// will not come ends its thread: the runtime's shutdown, which waits
    /// for its blocking threads, is not held (it was, for good, before).
    #[test]
    fn an_abandoned_worker_does_not_hold_its_runtime() {
        use crate::apps::mlr::{Mlr, params};
        use crate::emulate::Throttled;
        use crate::protocol::{OwnershipUpdate, ToClient, ToOwner};
        use crate::store::BlockData;
        use futures::StreamExt;
        use tokio::net::TcpListener;

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let settings = crate::peer::PeerSettings::for_tests(Duration::from_secs(3600));
            // Evaluator 2 holds the model, takes requests and never answers.
            let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let silent_addr = silent.local_addr().unwrap();
            let (asked_tx, asked_rx) = tokio::sync::oneshot::channel();
            let s = settings.clone();
            tokio::spawn(async move {
                let (stream, _) = silent.accept().await.unwrap();
                let (_, mut framed) = crate::protocol::auth::accept::<_, ToClient, ToOwner>(
                    Throttled::new(stream),
                    &s.secret,
                    &s.job_id,
                    s.frames,
                    s.connect_timeout,
                    |_| Ok(()),
                )
                .await
                .unwrap();
                if let Some(Ok(_)) = framed.next().await {
                    let _ = asked_tx.send(());
                }
                while let Some(Ok(_)) = framed.next().await {}
            });

            let c = cruise_conf::MlrConfig {
                classes: 3,
                features: 10,
                features_per_key: 2,
                ..cruise_conf::MlrConfig::default()
            };
            let app = Arc::new(Mlr::new(&c, &params(&c, 4).unwrap()).unwrap());
            let me = EvaluatorId(1);
            let store = Store::new(me);
            store.configure(&[(MODEL_TABLE, 4), (INPUT_TABLE, 1)], app.model());
            let input = app.parse(b"0 1:1 3:1\n1 2:1\n2 9:1\n").unwrap();
            store
                .put_block(INPUT_TABLE, BlockId(0), BlockData::Input(Arc::new(input)))
                .unwrap();
            let mut owners: Vec<_> = BlockId::all(4)
                .map(|b| (MODEL_TABLE, b, EvaluatorId(2)))
                .collect();
            owners.push((INPUT_TABLE, BlockId(0), me));
            store.apply_ownership(&OwnershipUpdate { version: 1, owners });
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let cancel = CancellationToken::new();
            let dp = DataPlane::start(me, store, listener, settings, Default::default(), &cancel)
                .unwrap();
            dp.set_peers(&[(EvaluatorId(2), silent_addr)]);
            let (to_am, _from_worker) = mpsc::channel(64);
            let (_clock, min_clock) = watch::channel(0);
            let worker = tokio::spawn(run_worker(WorkerContext {
                dp,
                app,
                to_am,
                stop: CancellationToken::new(),
                min_clock,
                mini_batch: 2,
                task: WorkerTask {
                    start_clock: 0,
                    staleness: None,
                },
                pipeline_depth: 0,
            }));
            asked_rx.await.expect("the worker pulled");
            worker.abort();
        });
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(rt);
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the runtime's shutdown waited for the abandoned worker's thread");
    }

    /// Each mini-batch ends where the next begins: their wall times add up
    /// to the span of the loop, with nothing left between them.
    #[test]
    fn mini_batches_tile_the_loops_time() {
        let start = BatchMark::now(RequestCpu::default());
        let mut mark = start;
        let mut sum = 0.0;
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(2));
            let mut r = MiniBatchReport::default();
            mark = finish(&mut r, mark, RequestCpu::default(), UNPRICED, 1);
            assert!(r.batch_secs >= 0.002, "{}", r.batch_secs);
            sum += r.batch_secs;
        }
        let span = mark.wall.duration_since(start.wall).as_secs_f64();
        assert!((sum - span).abs() < 1e-9, "{sum} vs {span}");
    }

    /// Cached keys are the app's; records replaced under the same block id
    /// are listed again; forgetting gives the budget back.
    #[test]
    fn key_cache_follows_the_records() {
        use crate::apps::mlr::{Mlr, params};
        let c = cruise_conf::MlrConfig {
            classes: 3,
            features: 10,
            features_per_key: 2,
            ..cruise_conf::MlrConfig::default()
        };
        let app = Mlr::new(&c, &params(&c, 4).unwrap()).unwrap();
        let listed = |input: &InputBlock, rows: Range<usize>| {
            let mut k = Vec::new();
            app.keys(input, rows, &mut k);
            k
        };
        let a = Arc::new(app.parse(b"0 1:1 3:1\n1 2:1\n2 9:1\n").unwrap());
        let b = Arc::new(app.parse(b"0 7:1\n1 8:1\n2 5:1\n").unwrap());
        let mut cache = KeyCache::default();
        for _ in 0..2 {
            assert_eq!(cache.keys(&app, BlockId(0), &a, 0..2), listed(&a, 0..2));
            assert_eq!(cache.keys(&app, BlockId(0), &a, 2..3), listed(&a, 2..3));
        }
        assert!(cache.bytes > 0);
        // Block 0 now holds other records: listed from them.
        assert_ne!(listed(&a, 0..2), listed(&b, 0..2));
        assert_eq!(cache.keys(&app, BlockId(0), &b, 0..2), listed(&b, 0..2));
        assert_eq!(cache.keys(&app, BlockId(1), &a, 0..2), listed(&a, 0..2));
        cache.retain(|block| block == BlockId(1));
        assert_eq!(cache.blocks.len(), 1);
        cache.forget(BlockId(1));
        assert_eq!(cache.bytes, 0);
        assert!(cache.blocks.is_empty());
    }

    #[test]
    fn blocks_are_cut_into_near_equal_mini_batches() {
        for size in 1..40 {
            for n in 0..200 {
                let b: Vec<Range<usize>> = batches(n, size).collect();
                assert_eq!(b.len(), mini_batch_count(n, size));
                assert_eq!(b.first().map_or(0, |r| r.start), 0);
                assert_eq!(b.last().map_or(0, |r| r.end), n, "{n} rows at {size}");
                assert!(b.windows(2).all(|w| w[0].end == w[1].start));
                let lens: Vec<usize> = b.iter().map(|r| r.len()).collect();
                let (lo, hi) = (lens.iter().min(), lens.iter().max());
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    assert!(hi - lo <= 1, "{lens:?}");
                    // Within half a mini-batch of the size asked for (or
                    // the whole block when it is smaller).
                    assert!(*lo >= (size / 2).min(n), "{n} at {size}: {lens:?}");
                    assert!(*hi <= size + size.div_ceil(2), "{n} at {size}: {lens:?}");
                }
            }
        }
        assert_eq!(
            batches(156, 100).map(|r| r.len()).collect::<Vec<_>>(),
            [78, 78]
        );
        assert_eq!(
            batches(312, 100).map(|r| r.len()).collect::<Vec<_>>(),
            [104, 104, 104]
        );
        assert_eq!(batches(30, 100).count(), 1);
    }

    /// Adds, then clamps at zero: not a plain sum, so the test sees that
    /// the model's own update function is what gets applied.
    struct NonNegative;

    impl ModelFunctions for NonNegative {
        fn value_len(&self) -> usize {
            2
        }
        fn init(&self, _key: Key) -> Vec<f32> {
            vec![0.0; 2]
        }
        fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
            for (v, d) in value.iter_mut().zip(delta) {
                *v = (*v + d).max(0.0);
            }
        }
    }

    fn batch(rows: &[[f32; 2]]) -> ValueBatch {
        let mut b = ValueBatch::default();
        for r in rows {
            b.push(r);
        }
        b
    }

    fn push(keys: &[Key], deltas: &[[f32; 2]]) -> StoreOp {
        StoreOp {
            kind: OpKind::Update,
            table: MODEL_TABLE,
            keys: keys.to_vec(),
            values: batch(deltas),
        }
    }

    #[test]
    fn own_pushes_are_applied_to_the_keys_they_share_in_order() {
        let keys = [1, 3, 5];
        let mut values = batch(&[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]);
        let first = push(
            &[0, 3, 4, 5],
            &[[9.0, 9.0], [1.0, -5.0], [9.0, 9.0], [0.5, 0.5]],
        );
        let second = push(&[1, 3], &[[-2.0, 1.0], [1.0, 1.0]]);
        let offsets = |op: &StoreOp| value_offsets(&op.values);
        let (o1, o2) = (offsets(&first), offsets(&second));
        apply_own_pushes(
            &NonNegative,
            &keys,
            &mut values,
            &[(&first, &o1), (&second, &o2)],
        );
        assert_eq!(
            values.data,
            vec![0.0, 2.0, 4.0, 1.0, 3.5, 3.5],
            "key 1: second only (clamped); key 3: first (clamped) then second; key 5: first"
        );
        // Keys 0 and 4 were not pulled: nothing else changed.
        assert_eq!(values.lens, vec![2, 2, 2]);
    }

    proptest::proptest! {
        /// The one-pass merge gives what applying each push in turn, key by
        /// key, gives.
        #[test]
        fn own_pushes_merged_as_if_applied_one_by_one(
            pulled in proptest::collection::btree_set(0u64..40, 0..20),
            pushes in proptest::collection::vec(
                proptest::collection::btree_map(0u64..40, (-3.0f32..3.0, -3.0f32..3.0), 0..20),
                0..8,
            ),
        ) {
            let keys: Vec<Key> = pulled.into_iter().collect();
            let start: Vec<[f32; 2]> = keys.iter().map(|&k| [k as f32 * 0.1, 1.0]).collect();
            let ops: Vec<StoreOp> = pushes
                .iter()
                .map(|m| {
                    let ks: Vec<Key> = m.keys().copied().collect();
                    let ds: Vec<[f32; 2]> = m.values().map(|&(a, b)| [a, b]).collect();
                    push(&ks, &ds)
                })
                .collect();
            let mut expected = start.clone();
            for op in &ops {
                for (k, d) in op.keys.iter().zip(op.values.iter()) {
                    if let Ok(i) = keys.binary_search(k) {
                        NonNegative.update(*k, &mut expected[i], d);
                    }
                }
            }
            let offsets: Vec<Vec<usize>> = ops.iter().map(|op| value_offsets(&op.values)).collect();
            let with: Vec<(&StoreOp, &[usize])> =
                ops.iter().zip(&offsets).map(|(op, o)| (op, o.as_slice())).collect();
            let mut values = batch(&start);
            apply_own_pushes(&NonNegative, &keys, &mut values, &with);
            proptest::prop_assert_eq!(values.data, expected.concat());
        }
    }
}
