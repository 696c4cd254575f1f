//! Parameter-server roles run inside an evaluator.
//!
//! - [`load_input`]: read input splits, parse them with the app, store them as
//!   input blocks (and the app's worker-local state beside them).
//! - [`run_worker`]: the worker task. For each local input block, for each
//!   mini-batch: pull the model keys it needs, compute, push the deltas. With
//!   `job.pipeline` the pulls of the next mini-batches are already on their
//!   way and pushes are not awaited until the pipeline is full; measurements
//!   are summed and reported every 20 ms. Between local epochs it ticks
//!   its clock and, under SSP, waits until the slowest worker is within the
//!   staleness bound.
//! - [`evaluate`]: the objective over all local input with the current model;
//!   [`evaluate_held_out`]: the same over held-out splits, read and dropped.
//! - [`dump_model`]: send the model blocks held here to the AM.
//! - [`run_server`]: the server task: blocks are served by the data plane
//!   whatever the role; this task reports serving metrics periodically.
//!
//! Roles share one [`DataPlane`] and [`Store`], so an evaluator switches role
//! without restarting, and blocks stay where they are until moved.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use cruise_hdfs::{FileSystem, Split, line_number_at, read_split};

use crate::apps::{App, Step};
use crate::peer::DataPlane;
use crate::protocol::{
    BlockId, EvalToAm, INPUT_TABLE, Key, LinkSample, MODEL_TABLE, MiniBatchReport, PeerResponse,
    STATE_TABLE, ServerReport, Stats, TaskKind, ValueBatch, WorkerTask,
};
use crate::store::{BlockData, InputBlock, ModelFunctions, OpKind, PartResult, Store, StoreOp};

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

/// Reads one split and parses it with the app; returns the records and the
/// bytes they came from. Parse errors name the file and line.
pub async fn read_input(
    fs: &FileSystem,
    app: &Arc<dyn App>,
    split: &Split,
) -> Result<(InputBlock, u64), PsError> {
    let data = read_split(fs, split)
        .await
        .map_err(|source| PsError::Read {
            uri: split.uri.clone(),
            source: Box::new(source),
        })?;
    let bytes = data.bytes.len() as u64;
    let text = data.bytes.clone();
    let parser = Arc::clone(app);
    let parsed = tokio::task::spawn_blocking(move || parser.parse(&text))
        .await
        .map_err(|e| PsError::Parse {
            uri: split.uri.clone(),
            line: 0,
            message: format!("parser crashed: {e}"),
        })?;
    match parsed {
        Ok(b) => Ok((b, bytes)),
        Err(e) => {
            let at = data.start_offset + e.offset as u64;
            let line = line_number_at(fs, &split.uri, at).await.unwrap_or(0);
            Err(PsError::Parse {
                uri: split.uri.clone(),
                line,
                message: e.message,
            })
        }
    }
}

/// Loads input blocks from their splits. Returns `(block, records, bytes)` per block.
pub async fn load_input(
    fs: FileSystem,
    app: Arc<dyn App>,
    store: Store,
    blocks: Vec<(BlockId, Split)>,
) -> Result<Vec<(BlockId, u64, u64)>, PsError> {
    let mut loaded = Vec::with_capacity(blocks.len());
    for (block, split) in blocks {
        let (input, bytes) = read_input(&fs, &app, &split).await?;
        let records = input.len() as u64;
        if let Some(state) = app.init_state(block, &input) {
            store.put_block(STATE_TABLE, block, BlockData::State(state))?;
        }
        store.put_block(INPUT_TABLE, block, BlockData::Input(Arc::new(input)))?;
        loaded.push((block, records, bytes));
    }
    Ok(loaded)
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
    /// Overlap communication with computation (`job.pipeline`).
    pub pipeline: bool,
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

/// Mini-batches that compute in less than this (smoothed) compute on the
/// worker's own thread; others on the blocking pool. With `job.pipeline`,
/// all but the timing runs ([`TimingRuns`]) do.
const INLINE_COMPUTE_SECS: f64 = 500e-6;

/// With `job.pipeline`, short computations go to the blocking pool anyway in
/// runs of `RUN` mini-batches, one run every `EVERY` mini-batches or every
/// `INTERVAL`, whichever comes first, so that the answers arriving meanwhile
/// are read, and timed, when they arrive: the optimizer's round trips and
/// link speeds come from those. A computation on the worker's own thread
/// holds every answer until it ends, and the requests on their way during
/// one are not timed. (A pull is on its way during one computation, a push
/// during two: a run of 2 times 2 pulls and a push.) Handing every
/// computation to the pool and back cost MLR at B = 100 a third of its
/// throughput (thread wake-ups both ways, 2 per mini-batch).
struct TimingRuns {
    /// Mini-batches since the last run started.
    since: u64,
    /// When the last run started.
    started: Instant,
    /// Mini-batches of the current run still to go.
    left: u64,
}

impl TimingRuns {
    const RUN: u64 = 2;
    const EVERY: u64 = 16;
    const INTERVAL: Duration = Duration::from_millis(10);

    fn new() -> Self {
        TimingRuns {
            since: Self::EVERY,
            started: Instant::now(),
            left: 0,
        }
    }

    /// Whether the next (short) computation belongs to a timing run.
    fn next(&mut self) -> bool {
        if self.left == 0 && (self.since >= Self::EVERY || self.started.elapsed() >= Self::INTERVAL)
        {
            self.left = Self::RUN;
            self.since = 0;
            self.started = Instant::now();
        }
        self.since += 1;
        if self.left > 0 {
            self.left -= 1;
            true
        } else {
            false
        }
    }
}

/// With `job.pipeline`: mini-batches pulled ahead, and pushes left
/// unacknowledged, at most. Two hide a round trip behind a computation; more
/// slow convergence per epoch (measured with MLR on 4 containers: final
/// accuracy 0.95 with 2, 0.91–0.95 with 3), as every worker then computes
/// on values missing more of the other workers' pushes.
const PIPELINE_DEPTH: usize = 2;

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
    /// No computation ran on the worker's own thread while it was on its
    /// way, so its answer was timed when it arrived.
    timed: bool,
}

/// A push this worker sent, kept until every pull on its way reflects it.
struct SentPush {
    seq: u64,
    op: Arc<StoreOp>,
}

/// Applies to pulled `values` (laid out as the sorted `keys`) this worker's
/// own pushes that the pull did not see yet, through the model's update
/// function: the worker then computes on what the servers will hold once
/// those pushes land — its own writes are never stale, however far it pulls
/// ahead. Other workers' pushes in flight are missed as in any asynchronous
/// PS.
fn apply_own_pushes(
    model: &dyn ModelFunctions,
    keys: &[Key],
    values: &mut ValueBatch,
    pushes: &[&StoreOp],
) {
    // A malformed answer (not one value per key) is left for the app's own
    // checks to refuse.
    let total: usize = values.lens.iter().map(|&l| l as usize).sum();
    if values.lens.len() != keys.len() || values.data.len() != total {
        return;
    }
    let offsets = crate::store::value_offsets(values);
    for op in pushes {
        let push_offsets = crate::store::value_offsets(&op.values);
        // Both key lists are sorted: merge.
        let (mut a, mut b) = (0, 0);
        while a < keys.len() && b < op.keys.len() {
            match keys[a].cmp(&op.keys[b]) {
                std::cmp::Ordering::Less => a += 1,
                std::cmp::Ordering::Greater => b += 1,
                std::cmp::Ordering::Equal => {
                    let (va, la) = (offsets[a], values.lens[a] as usize);
                    let (vb, lb) = (push_offsets[b], op.values.lens[b] as usize);
                    if la == lb {
                        model.update(
                            keys[a],
                            &mut values.data[va..va + la],
                            &op.values.data[vb..vb + lb],
                        );
                    }
                    a += 1;
                    b += 1;
                }
            }
        }
    }
}

/// A push on its way and the report it completes.
struct InFlightPush {
    push: Traced,
    report: MiniBatchReport,
    /// As [`Prefetched::timed`].
    timed: bool,
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
    if p.timed {
        report.push_secs = round_trip(&samples, waited);
        report.links.extend(samples);
        report.timed_pushes = 1;
    }
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

/// Runs the worker task until `stop` is cancelled (between mini-batches).
/// Reports `TaskStopped` when it returns normally.
///
/// Each mini-batch pulls the model keys it needs, computes, and pushes the
/// deltas. Without `pipeline` that is all, one step after the other. With
/// it, [`PIPELINE_DEPTH`] mini-batches are pulled ahead and as many pushes
/// go unacknowledged: after computing mini-batch `i` the worker sends its
/// push and the pull of `i + 2` together (one write, one wake-up of the
/// server), so the answer it waits for next was asked for a whole mini-batch
/// earlier. Requests to one server travel in order on one connection, so
/// the pull of `i + 2` sees every push up to `i`; the worker's push of
/// `i + 1`, sent after that pull, is applied to the pulled values here
/// ([`apply_own_pushes`]), so a worker never computes on a model missing its
/// own updates (without it, MLR on 4 containers lost 5 points of accuracy
/// in the first epochs). Pushes are flushed at the end of every local epoch
/// (before the clock ticks, so SSP's bound holds) and before the task stops.
pub async fn run_worker(mut ctx: WorkerContext) -> Result<(), PsError> {
    let store = ctx.dp.store().clone();
    let mut clock = ctx.task.start_clock;
    let mut pushes: VecDeque<InFlightPush> = VecDeque::new();
    // This worker's pushes so far, and the recent ones a pull on its way may
    // not reflect.
    let mut pushed: u64 = 0;
    let mut recent: VecDeque<SentPush> = VecDeque::new();
    let model = ctx.app.model();
    let mut reporter = Reporter::new(ctx.to_am.clone());
    let depth = if ctx.pipeline { PIPELINE_DEPTH } else { 0 };
    // Smoothed compute time of a mini-batch (unknown before the first).
    let mut comp_ema: Option<f64> = None;
    let mut timing = TimingRuns::new();
    'epochs: loop {
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
        let mut cursor = EpochCursor::new(&store, ctx.mini_batch);
        let mut ahead: VecDeque<Prefetched> = VecDeque::new();
        // Issues pulls until `n` mini-batches are on their way.
        let refill =
            |ahead: &mut VecDeque<Prefetched>, cursor: &mut EpochCursor, n: usize, seen: u64| {
                while ahead.len() < n {
                    let Some((block, input, rows)) = cursor.next(&store) else {
                        break;
                    };
                    let mut keys = Vec::new();
                    ctx.app.keys(&input, rows.clone(), &mut keys);
                    let pull = ctx.dp.execute_traced(pull_op(keys.clone()));
                    ahead.push_back(Prefetched {
                        block,
                        input,
                        rows,
                        keys,
                        pull,
                        seen,
                        timed: true,
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
        let mut last_end = Instant::now();
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
            let mut values = pulled(r)?;
            let (pull_secs, links) = if cur.timed {
                (round_trip(&links, waited), links)
            } else {
                (0.0, Vec::new())
            };
            let unseen: Vec<&StoreOp> = recent
                .iter()
                .filter(|p| p.seq >= cur.seen)
                .map(|p| &*p.op)
                .collect();
            if !unseen.is_empty() {
                apply_own_pushes(&*model, &cur.keys, &mut values, &unseen);
            }
            let pull_bytes = values.byte_len() as u64;

            let t1 = Instant::now();
            let (app, inp, st) = (Arc::clone(&ctx.app), cur.input, store.clone());
            let (block, rows, ks) = (cur.block, cur.rows, cur.keys);
            let step = Step { clock };
            let compute = move || {
                let out = if app.has_state() {
                    st.with_state(block, |s| {
                        app.compute(&inp, rows.clone(), &ks, &values, Some(s), step)
                    })
                } else {
                    Some(app.compute(&inp, rows, &ks, &values, None, step))
                };
                (out, ks)
            };
            // A short computation runs here: handing it to another thread
            // and back costs more than it does. A long one goes to the
            // blocking pool, so that the connections stay served; so do a
            // few short ones while requests are in flight (TimingRuns).
            let inline = comp_ema.is_some_and(|c| c < INLINE_COMPUTE_SECS)
                && (!ctx.pipeline || !timing.next());
            let (out, ks) = if inline {
                // Answers to the requests on their way are read after it.
                for p in &mut ahead {
                    p.timed = false;
                }
                for p in &mut pushes {
                    p.timed = false;
                }
                compute()
            } else {
                tokio::task::spawn_blocking(compute)
                    .await
                    .map_err(|e| PsError::Remote {
                        what: "compute",
                        message: format!("compute task failed: {e}"),
                    })?
            };
            let cpu_secs = t1.elapsed().as_secs_f64();
            comp_ema = Some(comp_ema.map_or(cpu_secs, |c| 0.8 * c + 0.2 * cpu_secs));
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
                reporter.add(complete_push(p).await?);
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
                links,
                timed_pulls: u32::from(cur.timed),
                // Without a push its round trip is known (0 s); with one,
                // completing the push says.
                timed_pushes: u32::from(deltas.is_empty()),
            };
            if deltas.is_empty() {
                report.batch_secs = last_end.elapsed().as_secs_f64();
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
                    timed: true,
                };
                pushed += 1;
                if depth > 0 {
                    // Kept while a pull on its way may not reflect it.
                    recent.push_back(SentPush {
                        seq: pushed - 1,
                        op,
                    });
                    let oldest_seen = ahead.iter().map(|p| p.seen).min().unwrap_or(pushed);
                    // The next pull goes out with this push (and sees it).
                    refill(&mut ahead, &mut cursor, depth, pushed);
                    while recent.front().is_some_and(|p| p.seq < oldest_seen) {
                        recent.pop_front();
                    }
                    let mut p = push;
                    p.report.batch_secs = last_end.elapsed().as_secs_f64();
                    pushes.push_back(p);
                } else {
                    let mut r = complete_push(push).await?;
                    r.batch_secs = last_end.elapsed().as_secs_f64();
                    reporter.add(r);
                    refill(&mut ahead, &mut cursor, 1, pushed);
                }
            }
            last_end = Instant::now();
            reporter.maybe_send().await?;
        }
        // End of the local epoch: every push is applied and reported before
        // the clock ticks.
        flush_pushes(&mut reporter, &mut pushes).await?;
        recent.clear();
        clock += 1;
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

/// Rows per evaluation batch: no updates, so fewer round trips are fine.
fn eval_batch(mini_batch: usize) -> usize {
    mini_batch.max(1000)
}

/// The objective over one input block with the current model; `state_of`
/// names the block whose worker-local state to use (if the app keeps any).
async fn evaluate_block(
    dp: &DataPlane,
    app: &Arc<dyn App>,
    input: &Arc<InputBlock>,
    state_of: Option<BlockId>,
    mini_batch: usize,
) -> Result<Stats, PsError> {
    let store = dp.store().clone();
    let mut total = Stats::default();
    let mut keys = Vec::new();
    for rows in batches(input.len(), eval_batch(mini_batch)) {
        app.keys(input, rows.clone(), &mut keys);
        let values = pull(dp, &keys).await?;
        let (a, inp, st, ks) = (
            Arc::clone(app),
            Arc::clone(input),
            store.clone(),
            keys.clone(),
        );
        let s = tokio::task::spawn_blocking(move || match state_of {
            Some(block) if a.has_state() => st
                .with_state(block, |s| {
                    a.evaluate(&inp, rows.clone(), &ks, &values, Some(s))
                })
                .unwrap_or_default(),
            _ => a.evaluate(&inp, rows, &ks, &values, None),
        })
        .await
        .map_err(|e| PsError::Remote {
            what: "evaluate",
            message: format!("evaluation task failed: {e}"),
        })?;
        total.add(&s);
    }
    Ok(total)
}

/// The objective over all local input blocks with the current model.
pub async fn evaluate(
    dp: &DataPlane,
    app: &Arc<dyn App>,
    mini_batch: usize,
) -> Result<Stats, PsError> {
    let store = dp.store().clone();
    let mut total = Stats::default();
    for block in store.local_blocks(INPUT_TABLE) {
        let Some(input) = store.input_block(block) else {
            continue;
        };
        total.add(&evaluate_block(dp, app, &input, Some(block), mini_batch).await?);
    }
    Ok(total)
}

/// The objective over held-out splits with the current model: each split is
/// read, parsed and evaluated, and nothing is stored. Only for apps without
/// worker-local state (the configuration checks it).
pub async fn evaluate_held_out(
    fs: &FileSystem,
    dp: &DataPlane,
    app: &Arc<dyn App>,
    splits: &[Split],
    mini_batch: usize,
) -> Result<Stats, PsError> {
    let mut total = Stats::default();
    for split in splits {
        let input = Arc::new(read_input(fs, app, split).await?.0);
        total.add(&evaluate_block(dp, app, &input, None, mini_batch).await?);
    }
    Ok(total)
}

/// Sends every model block owned here to the AM in parts of at most about
/// `part_bytes` of values, keys in increasing order within a block. Returns
/// the number of keys sent. Keys never read or written are not in any block:
/// they hold the app's initial value.
pub async fn dump_model(
    store: &Store,
    to_am: &mpsc::Sender<EvalToAm>,
    part_bytes: usize,
) -> Result<u64, PsError> {
    let mut sent = 0u64;
    for block in store.local_blocks(MODEL_TABLE) {
        let Some(b) = store.keyed_snapshot(block) else {
            continue;
        };
        let mut keys: Vec<Key> = b.values.keys().copied().collect();
        keys.sort_unstable();
        let mut part_keys = Vec::new();
        let mut part = ValueBatch::default();
        for (i, k) in keys.iter().enumerate() {
            part_keys.push(*k);
            part.push(&b.values[k]);
            if part.byte_len() + part_keys.len() * 8 >= part_bytes || i + 1 == keys.len() {
                sent += part_keys.len() as u64;
                to_am
                    .send(EvalToAm::ModelPart {
                        keys: std::mem::take(&mut part_keys),
                        values: std::mem::take(&mut part),
                    })
                    .await
                    .map_err(|_| PsError::ChannelClosed)?;
            }
        }
    }
    to_am
        .send(EvalToAm::ModelDumped { keys: sent })
        .await
        .map_err(|_| PsError::ChannelClosed)?;
    Ok(sent)
}

/// Runs the server task: reports serving metrics every `period` until `stop`.
pub async fn run_server(
    dp: DataPlane,
    to_am: mpsc::Sender<EvalToAm>,
    stop: CancellationToken,
    period: Duration,
) -> Result<(), PsError> {
    let mut last = dp.serve_totals();
    let mut last_t = Instant::now();
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = dp.serve_totals();
        let t = Instant::now();
        let report = ServerReport {
            period_secs: (t - last_t).as_secs_f64(),
            requests: now.requests - last.requests,
            busy_secs: now.busy_secs - last.busy_secs,
            bytes_in: now.bytes_in - last.bytes_in,
            bytes_out: now.bytes_out - last.bytes_out,
        };
        (last, last_t) = (now, t);
        if report.requests > 0 {
            to_am
                .send(EvalToAm::ServerReport(report))
                .await
                .map_err(|_| PsError::ChannelClosed)?;
        }
    }
    to_am
        .send(EvalToAm::TaskStopped {
            task: TaskKind::Server,
        })
        .await
        .map_err(|_| PsError::ChannelClosed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of 2 every 16 mini-batches when they are fast; every one when
    /// they are slower than the interval.
    #[test]
    fn timing_runs_every_16_mini_batches_or_10_ms() {
        let mut t = TimingRuns::new();
        let pattern: Vec<bool> = (0..32).map(|_| t.next()).collect();
        let timed: Vec<usize> = (0..32).filter(|&i| pattern[i]).collect();
        assert_eq!(timed, vec![0, 1, 16, 17], "{pattern:?}");
        t.started -= TimingRuns::INTERVAL;
        assert!(t.next(), "a run starts once the interval has passed");
        assert!(t.next());
        assert!(!t.next());
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
        apply_own_pushes(&NonNegative, &keys, &mut values, &[&first, &second]);
        assert_eq!(
            values.data,
            vec![0.0, 2.0, 4.0, 1.0, 3.5, 3.5],
            "key 1: second only (clamped); key 3: first (clamped) then second; key 5: first"
        );
        // Keys 0 and 4 were not pulled: nothing else changed.
        assert_eq!(values.lens, vec![2, 2, 2]);
    }
}
