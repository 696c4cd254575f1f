//! Parameter-server roles run inside an evaluator.
//!
//! - [`load_input`]: read input splits, parse them with the app, store them as
//!   input blocks (and the app's worker-local state beside them).
//! - [`run_worker`]: the worker task. For each local input block, for each
//!   mini-batch: pull the model keys it needs, compute on a blocking thread,
//!   push the deltas, report what it measured. Between local epochs it ticks
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

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use cruise_hdfs::{FileSystem, Split, line_number_at, read_split};

use crate::apps::{App, Step};
use crate::peer::DataPlane;
use crate::protocol::{
    BlockId, EvalToAm, INPUT_TABLE, Key, LinkSample, MODEL_TABLE, MiniBatchReport, PeerResponse,
    STATE_TABLE, ServerReport, Stats, TaskKind, ValueBatch, WorkerTask,
};
use crate::store::{BlockData, InputBlock, OpKind, Store, StoreOp};

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
        source: cruise_hdfs::HdfsError,
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
            source,
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
}

fn batches(n: usize, size: usize) -> impl Iterator<Item = Range<usize>> {
    let size = size.max(1);
    (0..n).step_by(size).map(move |s| s..(s + size).min(n))
}

async fn pull(
    dp: &DataPlane,
    keys: &[Key],
    links: &mut Vec<LinkSample>,
) -> Result<ValueBatch, PsError> {
    let op = StoreOp {
        kind: OpKind::Get,
        table: MODEL_TABLE,
        keys: keys.to_vec(),
        values: ValueBatch::default(),
    };
    let (r, samples) = dp.execute_traced(op).await;
    links.extend(samples);
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

async fn push(
    dp: &DataPlane,
    keys: Vec<Key>,
    deltas: ValueBatch,
    links: &mut Vec<LinkSample>,
) -> Result<(), PsError> {
    let op = StoreOp {
        kind: OpKind::Update,
        table: MODEL_TABLE,
        keys,
        values: deltas,
    };
    let (r, samples) = dp.execute_traced(op).await;
    links.extend(samples);
    r.map(|_| ()).map_err(|e| PsError::Remote {
        what: "push",
        message: e.message,
    })
}

/// Sums the samples of each peer (a pull and a push to the same server).
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

/// Runs the worker task until `stop` is cancelled (between mini-batches).
/// Reports `TaskStopped` when it returns normally.
pub async fn run_worker(mut ctx: WorkerContext) -> Result<(), PsError> {
    let store = ctx.dp.store().clone();
    let mut clock = ctx.task.start_clock;
    let mut keys: Vec<Key> = Vec::new();
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
        let blocks = store.local_blocks(INPUT_TABLE);
        if blocks.is_empty() {
            // No input here (yet): wait for a stop or a block to arrive.
            tokio::select! {
                _ = ctx.stop.cancelled() => break 'epochs,
                _ = tokio::time::sleep(Duration::from_millis(20)) => continue 'epochs,
            }
        }
        for block in blocks {
            // The block may have moved away since the list was taken.
            let Some(input) = store.input_block(block) else {
                continue;
            };
            for rows in batches(input.len(), ctx.mini_batch) {
                if ctx.stop.is_cancelled() {
                    break 'epochs;
                }
                if !store.is_owned(INPUT_TABLE, block) {
                    // Moved away mid-pass: its new owner trains on it now.
                    break;
                }
                ctx.app.keys(&input, rows.clone(), &mut keys);
                let mut links = Vec::new();
                let t0 = Instant::now();
                let values = pull(&ctx.dp, &keys, &mut links).await?;
                let pull_secs = t0.elapsed().as_secs_f64();
                let pull_bytes = values.byte_len() as u64;

                let t1 = Instant::now();
                let (app, inp, st, ks) = (
                    Arc::clone(&ctx.app),
                    Arc::clone(&input),
                    store.clone(),
                    std::mem::take(&mut keys),
                );
                let step = Step { clock };
                let r = rows.clone();
                let computed = tokio::task::spawn_blocking(move || {
                    let out = if app.has_state() {
                        st.with_state(block, |s| {
                            app.compute(&inp, r.clone(), &ks, &values, Some(s), step)
                        })
                    } else {
                        Some(app.compute(&inp, r, &ks, &values, None, step))
                    };
                    (out, ks)
                })
                .await
                .map_err(|e| PsError::Remote {
                    what: "compute",
                    message: format!("compute task failed: {e}"),
                })?;
                let (out, ks) = computed;
                crate::emulate::stretch_compute(t1.elapsed()).await;
                let comp_secs = t1.elapsed().as_secs_f64();
                let Some((deltas, stats)) = out else {
                    // The block's state moved away mid-way: skip this mini-batch.
                    keys = ks;
                    continue;
                };
                let push_bytes = deltas.byte_len() as u64;
                let t2 = Instant::now();
                if !deltas.is_empty() {
                    push(&ctx.dp, ks.clone(), deltas, &mut links).await?;
                }
                let push_secs = t2.elapsed().as_secs_f64();
                keys = ks;
                let report = MiniBatchReport {
                    clock,
                    stats,
                    comp_secs,
                    pull_secs,
                    pull_bytes,
                    push_secs,
                    push_bytes,
                    links: merge_links(links),
                };
                ctx.to_am
                    .send(EvalToAm::MiniBatch(report))
                    .await
                    .map_err(|_| PsError::ChannelClosed)?;
            }
        }
        clock += 1;
        ctx.to_am
            .send(EvalToAm::ClockTick { clock })
            .await
            .map_err(|_| PsError::ChannelClosed)?;
    }
    ctx.to_am
        .send(EvalToAm::TaskStopped {
            task: TaskKind::Worker,
        })
        .await
        .map_err(|_| PsError::ChannelClosed)
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
        let values = pull(dp, &keys, &mut Vec::new()).await?;
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
