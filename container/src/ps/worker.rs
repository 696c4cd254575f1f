//! The worker task: for each local input block, for each mini-batch, pull
//! the model keys it needs, compute, push the deltas, pipelined to
//! `job.pipeline_depth`; between local epochs, tick the clock and, under
//! SSP, wait for the slowest worker. [`run_worker`] runs it on a thread of
//! its own; [`Worker`] holds its state, one step per method.
//!
//! A clock rollback (SSP, [`ClockRollback`]: a lost server's model blocks
//! restored from a checkpoint) is heard between mini-batches, while waiting
//! for the slowest worker, and after every pull's answer: the worker
//! computes on no values pulled before it heard of it (they may come from
//! a restored block older than its clock allows), abandons the local epoch
//! under way (its pulls ahead are dropped), flushes its pushes, and goes on
//! from the checkpoint's clock, saying so (`ClockRolledBack`).
//!
//! A recount (LDA's counts rebuilt after a lost evaluator, [`RecountOrder`])
//! is heard between mini-batches and while waiting for the slowest worker:
//! the worker waits for every push it sent to be answered, marks the
//! state of its blocks uncounted, says so (`RecountHeld`) and sends
//! nothing more until the AM says the servers have emptied their blocks.
//! Its pulls ahead are kept: the mini-batches after a recount only count
//! their rows in (nothing is drawn from the values pulled), so values
//! pulled before the counts were emptied change only the statistics they
//! report. A worker that stops counts in, before it says it stopped,
//! whatever state of its blocks the model does not count yet (blocks
//! re-read or marked and not swept since), so the model a job ends with
//! counts all of it.

use std::collections::VecDeque;
use std::ops::{ControlFlow, Range};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::cost::{
    BatchMark, RequestCpu, RequestPricing, codec_cpu_per_byte, finish, model_servers,
    round_trip_cpu,
};
use super::key_cache::KeyCache;
use super::own_pushes::{SentPush, apply_own_pushes};
use super::recount::{RecountOrder, mark_uncounted};
use super::report::{Reporter, round_trip};
use super::{PsError, batches, pull_op, pulled};
use crate::apps::{App, Step};
use crate::peer::DataPlane;
use crate::protocol::{
    BlockId, EvalToAm, INPUT_TABLE, Key, LinkSample, MODEL_TABLE, MiniBatchReport, Stats, TaskKind,
    ValueBatch, WorkerTask,
};
use crate::store::{InputBlock, ModelFunctions, OpKind, PartResult, Store, StoreOp, value_offsets};

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
    /// The last clock rollback the AM ordered (SSP).
    pub rollback: watch::Receiver<ClockRollback>,
    /// The recounts the AM ordered (LDA after a loss).
    pub recount: watch::Receiver<RecountOrder>,
    /// The last recount ordered before the task was started: not its own
    /// (the evaluator marked and answered it without a worker). Read when
    /// the task is created, not when it first runs: a recount ordered
    /// while the task prices its requests is its own to answer.
    pub recounts_before: u32,
    /// Records per mini-batch.
    pub mini_batch: usize,
    /// The task's parameters.
    pub task: WorkerTask,
    /// Mini-batches pulled ahead and pushes left unacknowledged, at most:
    /// `job.pipeline_depth` with `job.pipeline`, 0 without (pull, compute,
    /// push and wait).
    pub pipeline_depth: usize,
}

/// A clock rollback the AM ordered (`AmToEval::RollBackClock`): a worker
/// whose task started before rollback `rollback` goes on from `clock`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockRollback {
    /// The job's rollbacks so far (0: none).
    pub rollback: u32,
    /// The clock to go on from.
    pub clock: u32,
}

/// How a mini-batch whose pull was on its way ended.
enum Batch {
    /// Computed, and its deltas pushed (or reported without any).
    Trained,
    /// Skipped: the block's state moved away mid-way.
    Skipped,
    /// Not computed: a clock rollback came first.
    RolledBack,
}

/// A worker that holds all the job's input pulls at least this many
/// mini-batches ahead. Alone, it misses no one's pushes but its own, and
/// those are applied to what it pulls (`apply_own_pushes`): it computes on
/// the same values at any depth, and deeper only hides more of the round
/// trip.
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

/// A local epoch's pulls ahead: where the epoch is, and the mini-batches
/// whose pulls are on their way, oldest first.
struct Ahead {
    cursor: EpochCursor,
    pulls: VecDeque<Prefetched>,
}

/// A local epoch under way.
struct Epoch {
    ahead: Ahead,
    /// Mini-batches pulled ahead and pushes left unanswered, at most.
    depth: usize,
    /// Where the last mini-batch ended: the next one's measurements start
    /// there.
    last: BatchMark,
    /// The model servers counted for this epoch ([`model_servers`]).
    counted: (u64, usize),
    /// This epoch's mini-batch reports summed, for the debug log.
    reported: ReportedTotals,
}

/// A local epoch's mini-batch reports summed, in seconds: what the AM's
/// cost model is given, beside the CPU clocks it came from.
#[derive(Debug, Default)]
struct ReportedTotals {
    batches: u32,
    batch: f64,
    wait: f64,
    comp: f64,
    cpu_wall: f64,
    io: f64,
}

/// A mini-batch's pulled values, with this worker's unseen pushes applied,
/// and what the pull measured.
struct Pulled {
    values: ValueBatch,
    links: Vec<LinkSample>,
    /// How long the worker waited for the answer.
    waited: f64,
    /// The pull's round trip ([`round_trip`]).
    secs: f64,
}

/// The worker's state across local epochs (see [`run_worker`]).
struct Worker {
    ctx: WorkerContext,
    store: Store,
    model: Arc<dyn ModelFunctions>,
    /// Nanoseconds the loop's thread spent in the runtime's waits
    /// ([`crate::os::OffPollCpu`]).
    waits: Arc<AtomicU64>,
    pricing: RequestPricing,
    clock: u32,
    /// The last clock rollback this worker took (or that came before its
    /// task started).
    rollback: u32,
    /// Pushes on their way, oldest first.
    pushes: VecDeque<InFlightPush>,
    /// This worker's pushes so far.
    pushed: u64,
    /// The recent pushes a pull on its way may not reflect.
    recent: VecDeque<SentPush>,
    reporter: Reporter,
    key_cache: KeyCache,
    /// The last recount this worker marked its state for.
    marked: u32,
    /// Stopped while holding for a recount: the counts are being rebuilt
    /// and nothing is counted in.
    held: bool,
}

impl Worker {
    /// A worker for `ctx`, once it has priced its requests' CPU.
    async fn new(ctx: WorkerContext, waits: Arc<AtomicU64>) -> Worker {
        let pricing = RequestPricing {
            codec_per_byte: codec_cpu_per_byte(ctx.dp.frame_options()),
            round_trip: round_trip_cpu(&ctx.dp, &waits)
                .await
                .unwrap_or(f64::INFINITY),
        };
        tracing::debug!(?pricing, "a worker's request CPU");
        let marked = ctx.recounts_before;
        Worker {
            store: ctx.dp.store().clone(),
            model: ctx.app.model(),
            clock: ctx.task.start_clock,
            rollback: ctx.task.rollback,
            reporter: Reporter::new(ctx.to_am.clone()),
            pushes: VecDeque::new(),
            pushed: 0,
            recent: VecDeque::new(),
            key_cache: KeyCache::default(),
            marked,
            held: false,
            ctx,
            waits,
            pricing,
        }
    }

    /// Seconds the loop's thread has spent in the runtime's waits.
    fn waited_secs(&self) -> f64 {
        self.waits.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// What this worker's requests have cost so far.
    fn request_cpu(&self) -> RequestCpu {
        RequestCpu {
            connections: self.ctx.dp.request_cpu_secs(),
            on_loop: self.ctx.dp.forward_cpu_secs() + self.waited_secs(),
        }
    }

    /// Runs local epochs until asked to stop, then flushes the pushes in
    /// flight before saying it stopped.
    async fn run(mut self) -> Result<(), PsError> {
        while self.epoch().await?.is_continue() {}
        flush_pushes(&mut self.reporter, &mut self.pushes).await?;
        if !self.held {
            self.count_in().await?;
        }
        self.reporter
            .send(EvalToAm::TaskStopped {
                task: TaskKind::Worker,
            })
            .await
    }

    /// One local epoch: waits for the slowest worker (SSP), trains on the
    /// mini-batches of the input blocks held here, then ticks the clock.
    /// `Break` when the worker is asked to stop.
    async fn epoch(&mut self) -> Result<ControlFlow<()>, PsError> {
        if let Some(r) = self.rollback_due() {
            self.roll_back(r).await?;
        }
        if let Some(n) = self.recount_due()
            && self.hold_for_recount(n).await?.is_break()
        {
            return Ok(ControlFlow::Break(()));
        }
        let depth = pipeline_depth(self.ctx.pipeline_depth, self.store.owner_count(INPUT_TABLE));
        if self.wait_for_slowest().await.is_break() {
            return Ok(ControlFlow::Break(()));
        }
        if self.rollback_due().is_some() || self.recount_due().is_some() {
            // Heard while waiting: the next call rolls back or holds.
            return Ok(ControlFlow::Continue(()));
        }
        let store = &self.store;
        self.key_cache.retain(|b| store.is_owned(INPUT_TABLE, b));
        let mut ahead = Ahead {
            cursor: EpochCursor::new(&self.store, self.ctx.mini_batch),
            pulls: VecDeque::new(),
        };
        self.refill(&mut ahead, depth.max(1));
        if ahead.pulls.is_empty() {
            // No input here (yet): the local epoch is empty and, under
            // SSP, ticks at once (the slowest worker's clock bounds every
            // other, so a clock that stood still would hold them all
            // back); then wait for a stop or a block to arrive.
            if self.ctx.task.staleness.is_some() {
                self.end_epoch(&mut (u64::MAX, 0), &ReportedTotals::default())
                    .await?;
            }
            tokio::select! {
                _ = self.ctx.stop.cancelled() => return Ok(ControlFlow::Break(())),
                _ = tokio::time::sleep(Duration::from_millis(20)) => return Ok(ControlFlow::Continue(())),
            }
        }
        let mut epoch = Epoch {
            ahead,
            depth,
            last: BatchMark::now(self.request_cpu()),
            counted: (u64::MAX, 0),
            reported: ReportedTotals::default(),
        };
        while let Some(cur) = epoch.ahead.pulls.pop_front() {
            if self.ctx.stop.is_cancelled() {
                return Ok(ControlFlow::Break(()));
            }
            if let Some(n) = self.recount_due()
                && self.hold_for_recount(n).await?.is_break()
            {
                return Ok(ControlFlow::Break(()));
            }
            if !self.store.is_owned(INPUT_TABLE, cur.block) {
                // Moved away mid-pass: its new owner trains on it now.
                epoch.ahead.cursor.skip_block(cur.block);
                epoch.ahead.pulls.retain(|p| p.block != cur.block);
                self.refill(&mut epoch.ahead, depth.max(1));
                continue;
            }
            match self.train(&mut epoch, cur).await? {
                Batch::Trained => self.reporter.maybe_send().await?,
                Batch::Skipped => {}
                // The epoch and its pulls ahead are dropped; the next call
                // rolls back.
                Batch::RolledBack => return Ok(ControlFlow::Continue(())),
            }
        }
        self.end_epoch(&mut epoch.counted, &epoch.reported).await?;
        Ok(ControlFlow::Continue(()))
    }

    /// SSP: waits until the slowest worker is within the staleness bound
    /// of this worker's clock, or a clock rollback comes. `Break` when
    /// asked to stop first, or when the AM's clock is gone.
    async fn wait_for_slowest(&mut self) -> ControlFlow<()> {
        let Some(s) = self.ctx.task.staleness else {
            return ControlFlow::Continue(());
        };
        loop {
            if self.ctx.stop.is_cancelled() {
                return ControlFlow::Break(());
            }
            if self.clock <= *self.ctx.min_clock.borrow() + s
                || self.rollback_due().is_some()
                || self.recount_due().is_some()
            {
                return ControlFlow::Continue(());
            }
            tokio::select! {
                _ = self.ctx.stop.cancelled() => return ControlFlow::Break(()),
                r = self.ctx.min_clock.changed() => if r.is_err() { return ControlFlow::Break(()) },
                r = self.ctx.rollback.changed() => if r.is_err() { return ControlFlow::Break(()) },
                r = self.ctx.recount.changed() => if r.is_err() { return ControlFlow::Break(()) },
            }
        }
    }

    /// The clock rollback the AM ordered since this worker's last one, if any.
    fn rollback_due(&self) -> Option<ClockRollback> {
        let r = *self.ctx.rollback.borrow();
        (r.rollback > self.rollback).then_some(r)
    }

    /// Takes rollback `r`: the pushes already computed are applied (on a
    /// restored block too: fresher than its checkpoint, which SSP allows)
    /// and reported, as the abandoned epochs' last; then the clock goes
    /// back to `r.clock` and the AM hears so before any report of the
    /// epochs trained again.
    async fn roll_back(&mut self, r: ClockRollback) -> Result<(), PsError> {
        flush_pushes(&mut self.reporter, &mut self.pushes).await?;
        self.recent.clear();
        tracing::info!(
            rollback = r.rollback,
            from = self.clock,
            to = r.clock,
            "the worker's clock rolls back: a lost server's model blocks were restored \
             from a checkpoint"
        );
        self.clock = r.clock;
        self.rollback = r.rollback;
        self.ctx.rollback.borrow_and_update();
        self.reporter
            .send(EvalToAm::ClockRolledBack {
                rollback: r.rollback,
                clock: r.clock,
            })
            .await
    }

    /// The recount the AM ordered since the last one this worker marked
    /// for, if any.
    fn recount_due(&self) -> Option<u32> {
        let r = *self.ctx.recount.borrow();
        (r.hold > self.marked).then_some(r.hold)
    }

    /// Holds for recount `n` (see the module's doc): every push answered,
    /// the state marked uncounted, `RecountHeld` said; then waits for the
    /// AM's go, marking again for a later recount heard meanwhile.
    /// `Break` when asked to stop first (the job is ending or cancelled).
    async fn hold_for_recount(&mut self, mut n: u32) -> Result<ControlFlow<()>, PsError> {
        loop {
            flush_pushes(&mut self.reporter, &mut self.pushes).await?;
            let marked = mark_uncounted(&self.store, &*self.ctx.app);
            self.marked = n;
            tracing::info!(
                recount = n,
                marked,
                "the worker holds for a recount of the model: its pushes answered, \
                 its state marked uncounted"
            );
            self.reporter
                .send(EvalToAm::RecountHeld { recount: n })
                .await?;
            loop {
                let r = *self.ctx.recount.borrow_and_update();
                if r.hold > self.marked {
                    n = r.hold;
                    break;
                }
                if r.go >= self.marked {
                    tracing::info!(recount = n, "the worker trains on after the recount");
                    return Ok(ControlFlow::Continue(()));
                }
                tokio::select! {
                    _ = self.ctx.stop.cancelled() => {
                        // The go and the stop may be heard together (the
                        // AM stops training right after a recount): only a
                        // worker stopped before the go counts nothing in.
                        self.held = self.ctx.recount.borrow().go < self.marked;
                        return Ok(ControlFlow::Break(()));
                    }
                    r = self.ctx.recount.changed() => if r.is_err() {
                        self.held = true;
                        return Ok(ControlFlow::Break(()));
                    },
                }
            }
        }
    }

    /// Before the task stops: counts in the state of the blocks held here
    /// that the model does not count yet ([`App::uncounted`]), one
    /// mini-batch after the other (pull, compute, push, answered). Nothing
    /// for apps whose state the model always counts.
    async fn count_in(&mut self) -> Result<(), PsError> {
        let app = Arc::clone(&self.ctx.app);
        if !app.has_state() {
            return Ok(());
        }
        let mut swept = 0u64;
        for block in self.store.local_blocks(INPUT_TABLE) {
            let Some(input) = self.store.input_block(block) else {
                continue;
            };
            for rows in batches(input.len(), self.ctx.mini_batch) {
                let due = self
                    .store
                    .with_state(block, |s| app.uncounted(&input, s, rows.clone()))
                    .unwrap_or(false);
                if !due {
                    continue;
                }
                let keys = self.key_cache.keys(&*app, block, &input, rows.clone());
                let (r, _) = self.ctx.dp.execute_traced(pull_op(keys.clone())).await;
                let values = pulled(r)?;
                let step = Step { clock: self.clock };
                let Some((deltas, _)) = self.compute(block, &input, rows, &keys, &values, step)
                else {
                    break;
                };
                swept += 1;
                if deltas.is_empty() {
                    continue;
                }
                let op = Arc::new(StoreOp {
                    kind: OpKind::Update,
                    table: MODEL_TABLE,
                    keys,
                    values: deltas,
                });
                let (r, _) = self.ctx.dp.execute_arc_traced(op).await;
                r.map_err(|e| PsError::Remote {
                    what: "push",
                    message: e.message,
                })?;
            }
        }
        if swept > 0 {
            tracing::info!(
                mini_batches = swept,
                "before stopping, the worker counted in the state the model did not count yet"
            );
        }
        Ok(())
    }

    /// Sends pulls until `n` mini-batches of the epoch are on their way (or
    /// it has no more).
    fn refill(&mut self, ahead: &mut Ahead, n: usize) {
        while ahead.pulls.len() < n {
            let Some((block, input, rows)) = ahead.cursor.next(&self.store) else {
                break;
            };
            let keys = self
                .key_cache
                .keys(&*self.ctx.app, block, &input, rows.clone());
            let pull = self.ctx.dp.execute_traced(pull_op(keys.clone()));
            ahead.pulls.push_back(Prefetched {
                block,
                input,
                rows,
                keys,
                pull,
                seen: self.pushed,
            });
        }
    }

    /// Trains on a mini-batch whose pull is on its way: waits for the
    /// values, computes, and pushes the deltas (or, without any, reports
    /// it at once). Skipped when the block's state moved away mid-way; not
    /// computed when a clock rollback came before the answer was looked at.
    async fn train(&mut self, epoch: &mut Epoch, cur: Prefetched) -> Result<Batch, PsError> {
        let Prefetched {
            block,
            input,
            rows,
            keys,
            pull,
            seen,
        } = cur;
        let t0 = Instant::now();
        let (r, links) = pull.await;
        if self.rollback_due().is_some() {
            // The answer may hold a restored block older than this clock
            // allows: any pull that reached one was answered after the
            // rollback was heard here (it came before the new owners).
            return Ok(Batch::RolledBack);
        }
        let pulled = self.answer(r, links, t0.elapsed().as_secs_f64(), &keys, seen)?;
        let step = Step { clock: self.clock };
        let t1 = Instant::now();
        let out = self.compute(block, &input, rows, &keys, &pulled.values, step);
        crate::emulate::stretch_compute(t1.elapsed()).await;
        let comp_secs = t1.elapsed().as_secs_f64();
        let Some((deltas, stats)) = out else {
            // The block's state moved away mid-way: skip this mini-batch.
            self.refill(&mut epoch.ahead, epoch.depth.max(1));
            return Ok(Batch::Skipped);
        };
        // Time this mini-batch's loop spent blocked (not its own work).
        let mut blocked = pulled.waited;
        self.make_room(epoch.depth, &mut blocked).await?;
        let report = MiniBatchReport {
            mini_batches: 1,
            clock: self.clock,
            stats,
            comp_secs,
            pull_secs: pulled.secs,
            pull_bytes: pulled.values.byte_len() as u64,
            push_secs: 0.0,
            push_bytes: deltas.byte_len() as u64,
            batch_secs: 0.0,
            wait_secs: blocked,
            cpu_wall_secs: 0.0,
            io_secs: 0.0,
            links: pulled.links,
            timed_pulls: 1,
            // Without a push its round trip is known (0 s); with one,
            // completing the push says.
            timed_pushes: u32::from(deltas.is_empty()),
        };
        // Done with the pulled values: a large buffer is read into again
        // by a later pull (`peer/buffers.rs`).
        self.ctx.dp.recycle(pulled.values.data);
        if deltas.is_empty() {
            let mut report = report;
            self.end_mini_batch(epoch, &mut report);
            self.reporter.add(report);
            self.refill(&mut epoch.ahead, epoch.depth.max(1));
        } else {
            self.push(epoch, keys, deltas, report).await?;
        }
        Ok(Batch::Trained)
    }

    /// A pull's answer, waited for `waited` seconds, with this worker's
    /// pushes sent after the pull (after push `seen`) applied to it.
    fn answer(
        &self,
        r: PartResult,
        links: Vec<LinkSample>,
        waited: f64,
        keys: &[Key],
        seen: u64,
    ) -> Result<Pulled, PsError> {
        let mut values = pulled(r)?;
        let secs = round_trip(&links, waited);
        let unseen: Vec<(&StoreOp, &[usize])> = self
            .recent
            .iter()
            .filter(|p| p.seq >= seen)
            .map(|p| (&*p.op, p.offsets.as_slice()))
            .collect();
        if !unseen.is_empty() {
            apply_own_pushes(&*self.model, keys, &mut values, &unseen);
        }
        Ok(Pulled {
            values,
            links,
            waited,
            secs,
        })
    }

    /// The app's computation on `rows` of `input`, with the block's state
    /// if the app keeps any; `None` when that state moved away.
    fn compute(
        &self,
        block: BlockId,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        step: Step,
    ) -> Option<(ValueBatch, Stats)> {
        let app = &self.ctx.app;
        if app.has_state() {
            self.store.with_state(block, |s| {
                app.compute(input, rows, keys, values, Some(s), step)
            })
        } else {
            Some(app.compute(input, rows, keys, values, None, step))
        }
    }

    /// Room for one more push under a pipeline of `depth`: the oldest
    /// pushes beyond it are waited for (the wait added to `blocked`) and
    /// reported.
    async fn make_room(&mut self, depth: usize, blocked: &mut f64) -> Result<(), PsError> {
        while depth > 0 && self.pushes.len() >= depth {
            let Some(p) = self.pushes.pop_front() else {
                break;
            };
            let t = Instant::now();
            let done = complete_push(p).await?;
            *blocked += t.elapsed().as_secs_f64();
            self.reporter.add(done);
        }
        Ok(())
    }

    /// Pushes a mini-batch's deltas. Pipelined, the push stays on its way
    /// and the next pull goes out with it; otherwise it is waited for.
    async fn push(
        &mut self,
        epoch: &mut Epoch,
        keys: Vec<Key>,
        deltas: ValueBatch,
        report: MiniBatchReport,
    ) -> Result<(), PsError> {
        let op = Arc::new(StoreOp {
            kind: OpKind::Update,
            table: MODEL_TABLE,
            keys,
            values: deltas,
        });
        let mut push = InFlightPush {
            push: self.ctx.dp.execute_arc_traced(Arc::clone(&op)),
            report,
        };
        self.pushed += 1;
        if epoch.depth > 0 {
            // Kept while a pull on its way may not reflect it.
            self.recent.push_back(SentPush {
                seq: self.pushed - 1,
                offsets: value_offsets(&op.values),
                op,
            });
            let oldest_seen = epoch
                .ahead
                .pulls
                .iter()
                .map(|p| p.seen)
                .min()
                .unwrap_or(self.pushed);
            // The next pull goes out with this push (and sees it).
            self.refill(&mut epoch.ahead, epoch.depth);
            while self.recent.front().is_some_and(|p| p.seq < oldest_seen) {
                self.recent.pop_front();
            }
            self.end_mini_batch(epoch, &mut push.report);
            self.pushes.push_back(push);
        } else {
            let t = Instant::now();
            let mut r = complete_push(push).await?;
            r.wait_secs += t.elapsed().as_secs_f64();
            self.end_mini_batch(epoch, &mut r);
            self.reporter.add(r);
            self.refill(&mut epoch.ahead, 1);
        }
        Ok(())
    }

    /// Ends `report`'s mini-batch: its time since the last one ended and
    /// what its requests cost ([`finish`]).
    fn end_mini_batch(&self, epoch: &mut Epoch, report: &mut MiniBatchReport) {
        epoch.last = finish(
            report,
            epoch.last,
            self.request_cpu(),
            self.pricing,
            model_servers(&self.store, &mut epoch.counted),
        );
        let t = &mut epoch.reported;
        t.batches += 1;
        t.batch += report.batch_secs;
        t.wait += report.wait_secs;
        t.comp += report.comp_secs;
        t.cpu_wall += report.cpu_wall_secs;
        t.io += report.io_secs;
    }

    /// The end of a local epoch: every push is applied and reported before
    /// the clock ticks.
    async fn end_epoch(
        &mut self,
        counted: &mut (u64, usize),
        reported: &ReportedTotals,
    ) -> Result<(), PsError> {
        flush_pushes(&mut self.reporter, &mut self.pushes).await?;
        self.recent.clear();
        self.clock += 1;
        let dp = &self.ctx.dp;
        tracing::debug!(
            clock = self.clock,
            loop_cpu = crate::os::thread_cpu_secs(),
            connections = dp.request_cpu_secs(),
            connections_idle = dp.request_idle_cpu_secs(),
            forward = dp.forward_cpu_secs(),
            waits = self.waited_secs(),
            servers = model_servers(&self.store, counted),
            pushed = self.pushed,
            wall_per_cpu = crate::os::wall_per_cpu(),
            "worker CPU so far, seconds"
        );
        tracing::debug!(
            clock = self.clock,
            batches = reported.batches,
            batch = reported.batch,
            wait = reported.wait,
            comp = reported.comp,
            cpu_wall = reported.cpu_wall,
            own = super::own_secs(
                reported.batch,
                reported.wait,
                reported.comp,
                reported.cpu_wall,
                1.0
            ),
            io = reported.io,
            "worker's mini-batch reports this epoch, summed, seconds"
        );
        let clock = self.clock;
        self.reporter.send(EvalToAm::ClockTick { clock }).await
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
/// optimizer fits are then right), while the worker computes.
///
/// If this future is dropped before the loop ends (its task aborted, or
/// its runtime shutting down), the loop's thread is told to give up at its
/// next await and ends: no thread outlives its task, and a runtime's
/// shutdown, which waits for its blocking threads, is not held by a worker
/// waiting for an answer that will not come.
pub async fn run_worker(ctx: WorkerContext) -> Result<(), PsError> {
    let rt = tokio::runtime::Handle::current();
    let waits = Arc::new(AtomicU64::new(0));
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
/// own updates, which would cost accuracy in the first epochs. Pushes are flushed at the end of every local epoch
/// (before the clock ticks, so SSP's bound holds) and before the task stops.
async fn worker_loop(ctx: WorkerContext, waits: Arc<AtomicU64>) -> Result<(), PsError> {
    Worker::new(ctx, waits).await.run().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::EvaluatorId;

    #[test]
    fn a_lone_worker_pulls_deeper() {
        assert_eq!(pipeline_depth(0, 1), 0, "no pipelining stays off");
        assert_eq!(pipeline_depth(2, 1), LONE_WORKER_DEPTH);
        assert_eq!(pipeline_depth(2, 0), LONE_WORKER_DEPTH);
        assert_eq!(pipeline_depth(16, 1), 16);
        assert_eq!(pipeline_depth(2, 3), 2);
    }

    /// An MLR app (3 classes, 10 features) and the store of evaluator
    /// `me`, which holds one input block of three records; `server` owns
    /// the 4 model blocks.
    fn mlr_store(me: EvaluatorId, server: EvaluatorId) -> (Arc<dyn App>, Store) {
        use crate::apps::mlr::{Mlr, params};
        use crate::protocol::OwnershipUpdate;
        use crate::store::BlockData;

        let c = cruise_conf::MlrConfig {
            classes: 3,
            features: 10,
            features_per_key: 2,
            ..cruise_conf::MlrConfig::default()
        };
        let app = Arc::new(Mlr::new(&c, &params(&c, 4).unwrap()).unwrap());
        let store = Store::new(me);
        store.configure(&[(MODEL_TABLE, 4), (INPUT_TABLE, 1)], app.model());
        let input = app.parse(b"0 1:1 3:1\n1 2:1\n2 9:1\n").unwrap();
        store
            .put_block(INPUT_TABLE, BlockId(0), BlockData::Input(Arc::new(input)))
            .unwrap();
        let mut owners: Vec<_> = BlockId::all(4).map(|b| (MODEL_TABLE, b, server)).collect();
        owners.push((INPUT_TABLE, BlockId(0), me));
        store.apply_ownership(&OwnershipUpdate { version: 1, owners });
        (app, store)
    }

    /// A worker whose task is dropped while it waits for an answer that
    /// will not come ends its thread: the runtime's shutdown, which waits
    /// for its blocking threads, is not held.
    #[test]
    fn an_abandoned_worker_does_not_hold_its_runtime() {
        use crate::emulate::Throttled;
        use crate::protocol::{ToClient, ToOwner};
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

            let me = EvaluatorId(1);
            let (app, store) = mlr_store(me, EvaluatorId(2));
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
                rollback: watch::channel(ClockRollback::default()).1,
                recount: watch::channel(RecountOrder::default()).1,
                recounts_before: 0,
                mini_batch: 2,
                task: WorkerTask {
                    start_clock: 0,
                    staleness: None,
                    rollback: 0,
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

    /// A recount ordered after the task was started but before it first
    /// ran (it prices its requests first, which takes a while on a loaded
    /// machine) is the task's own: the evaluator left it to the task, so
    /// the task holds and answers it. Reading the recounts already ordered
    /// only when it first ran, a worker once swallowed such an order and
    /// the AM waited for its answer until the job failed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_recount_ordered_while_the_task_starts_is_answered() {
        use tokio::net::TcpListener;

        let me = EvaluatorId(1);
        let (app, store) = mlr_store(me, me);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = crate::peer::PeerSettings::for_tests(Duration::from_secs(60));
        let cancel = CancellationToken::new();
        let dp =
            DataPlane::start(me, store, listener, settings, Default::default(), &cancel).unwrap();
        dp.set_peers(&[(me, addr)]);
        let (to_am, mut from_worker) = mpsc::channel(64);
        let (order, recount) = watch::channel(RecountOrder::default());
        // The context is made before the order comes (as the evaluator
        // makes it when the AM starts the worker); the task runs after.
        let ctx = WorkerContext {
            dp: dp.clone(),
            app,
            to_am,
            stop: CancellationToken::new(),
            min_clock: watch::channel(0).1,
            rollback: watch::channel(ClockRollback::default()).1,
            recount,
            recounts_before: order.borrow().hold,
            mini_batch: 1,
            task: WorkerTask {
                start_clock: 0,
                staleness: None,
                rollback: 0,
            },
            pipeline_depth: 0,
        };
        let stop = ctx.stop.clone();
        order.send_modify(|r| r.hold = 1);
        let worker = tokio::spawn(run_worker(ctx));
        let held = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(m) = from_worker.recv().await {
                if let EvalToAm::RecountHeld { recount } = m {
                    return Some(recount);
                }
            }
            None
        })
        .await
        .expect("the worker did not answer the recount ordered while it started");
        assert_eq!(held, Some(1));
        stop.cancel();
        worker.await.unwrap().unwrap();
        dp.shutdown().await;
    }
}
