//! Benchmark: reconfiguration (issue #3).
//!
//! 1. Block-move throughput: 100 MiB of input blocks (libsvm-like records,
//!    40 entries each) moved between two data planes over loopback with the
//!    default settings (4 MiB chunks, `compression = auto`), back and forth,
//!    against `iperf3` single-stream TCP on 127.0.0.1 in the same run.
//! 2. Latency of `get` on model keys that are NOT being moved, served by the
//!    source of the move, while idle and while moves run (p50/p99), one
//!    `get` per millisecond: the design promises that moves never block
//!    unrelated keys. Each repetition takes [`LATENCY_SAMPLES`] idle gets
//!    and as many taken while a move runs (a get is counted only if a move
//!    ran from its start to its end), so that a p99 is not the worst of a
//!    few dozen, in [`LATENCY_ROUNDS`] alternating rounds (idle gets, then
//!    moves back and forth until there are as many busy ones), so that both
//!    see the same machine when other processes come and go.
//!
//! ```text
//! integration/bench/setup.sh          # iperf3 (once)
//! cargo run --release -p cruise-integration --bin bench-reconfig [-- REPS]
//! ```
//!
//! Each repetition's figure is printed, and the median. Targets (issue
//! #21): move throughput ≥ 0.8× iperf3; `get` p99 on unmoved keys during
//! a move ≤ 1.5× idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;

use cruise_container::peer::DataPlane;
use cruise_container::protocol::{
    BlockId, EvalToAm, EvaluatorId, INPUT_TABLE, Key, MODEL_TABLE, PeerResponse, ValueBatch,
};
use cruise_container::store::{BlockData, InputBlock, OpKind, StoreOp};
use cruise_integration::bench::{
    AddModel, Cluster, Row, default_settings, iperf3_loopback, machine_note, mb_s, median,
    percentile, print_table,
};

const INPUT_BLOCKS: u32 = 10;
const TOTAL_BYTES: usize = 100 << 20;
const MODEL_BLOCKS: u32 = 16;
const VALUE_LEN: usize = 64;
const SOURCE: EvaluatorId = EvaluatorId(1);
const DEST: EvaluatorId = EvaluatorId(2);
const CLIENT: EvaluatorId = EvaluatorId(3);
/// Keys per `get` in the latency probe.
const GET_KEYS: u64 = 8;
/// One probe `get` this often.
const PROBE_EVERY: Duration = Duration::from_millis(1);
/// Gets per repetition of the latency figure, idle and during moves each.
const LATENCY_SAMPLES: usize = 600;
/// Rounds of idle and busy gets per repetition.
const LATENCY_ROUNDS: usize = 10;

/// An input block of about `bytes` bytes: records of 40 entries with feature
/// indices below 100,000 and values like libsvm's `0.123`.
fn input_block(bytes: usize, rng: &mut ChaCha8Rng) -> InputBlock {
    let mut b = InputBlock::new();
    let per_record = 4 + 4 + 40 * 8;
    for _ in 0..bytes / per_record {
        let label = rng.random_range(0..10) as f32;
        let entries: Vec<(u32, f32)> = (0..40)
            .map(|_| {
                (
                    rng.random_range(1..100_000u32),
                    rng.random_range(1..=1000u32) as f32 / 1000.0,
                )
            })
            .collect();
        b.push(label, entries);
    }
    b
}

/// Moves every input block from `from` to `to`; returns (bytes, seconds).
async fn move_all(
    cluster: &mut Cluster,
    from: EvaluatorId,
    to: EvaluatorId,
    move_id: u64,
) -> anyhow::Result<(u64, f64)> {
    let blocks: Vec<BlockId> = BlockId::all(INPUT_BLOCKS).collect();
    let (tx, mut rx) = mpsc::channel(64);
    let src = cluster.plane(from).clone();
    let t0 = Instant::now();
    let bytes = src
        .move_blocks(move_id, INPUT_TABLE, &blocks, to, &tx)
        .await
        .with_context(|| format!("moving input blocks {from} → {to}"))?;
    let secs = t0.elapsed().as_secs_f64();
    drop(tx);
    let mut moved = Vec::new();
    while let Some(EvalToAm::BlockMoved { block, .. }) = rx.recv().await {
        moved.push((INPUT_TABLE, block, to));
    }
    if moved.len() != blocks.len() {
        bail!("{} of {} blocks reported moved", moved.len(), blocks.len());
    }
    cluster.set_owners(moved);
    Ok((bytes, secs))
}

/// Latencies (seconds) of `get`s of keys owned by the source, one every
/// [`PROBE_EVERY`] (so the probe itself takes little of the machine), until
/// `max` were counted: with `during` given, only the gets that began and
/// ended while it was set.
async fn probe(
    client: DataPlane,
    during: Option<Arc<AtomicBool>>,
    max: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut lat = Vec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let counts = || during.as_ref().is_none_or(|d| d.load(Ordering::SeqCst));
    while lat.len() < max {
        tick.tick().await;
        let first = rng.random_range(0..1000u64);
        let keys: Vec<Key> = (first..first + GET_KEYS).collect();
        let op = StoreOp {
            kind: OpKind::Get,
            table: MODEL_TABLE,
            keys,
            values: ValueBatch::default(),
        };
        let began = counts();
        let t0 = Instant::now();
        match client.execute(op).await {
            Ok(PeerResponse::Values(v)) if v.len() == GET_KEYS as usize => {}
            other => bail!("get failed: {other:?}"),
        }
        let secs = t0.elapsed().as_secs_f64();
        if began && counts() {
            lat.push(secs);
        }
    }
    Ok(lat)
}

async fn run(reps: usize) -> anyhow::Result<()> {
    println!("## Reconfiguration ({})", machine_note());
    let mut iperf = vec![iperf3_loopback(2).await?];

    let mut cluster = Cluster::start(
        3,
        &[(MODEL_TABLE, MODEL_BLOCKS), (INPUT_TABLE, INPUT_BLOCKS)],
        Arc::new(AddModel { len: VALUE_LEN }),
        default_settings(),
    )
    .await?;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let per_block = TOTAL_BYTES / INPUT_BLOCKS as usize;
    let mut owners = Vec::new();
    let src = cluster.plane(SOURCE).store().clone();
    for b in 0..INPUT_BLOCKS {
        src.put_block(
            INPUT_TABLE,
            BlockId(b),
            BlockData::Input(Arc::new(input_block(per_block, &mut rng))),
        )?;
        owners.push((INPUT_TABLE, BlockId(b), SOURCE));
    }
    let model: Vec<BlockId> = BlockId::all(MODEL_BLOCKS).collect();
    src.create_blocks(MODEL_TABLE, &model)?;
    owners.extend(model.iter().map(|&b| (MODEL_TABLE, b, SOURCE)));
    cluster.set_owners(owners);
    let sample = src
        .input_block(BlockId(0))
        .map(|b| BlockData::Input(b).encode())
        .context("input block 0")?;
    let mid = &sample[sample.len() / 2..sample.len() / 2 + (64 << 10)];
    let lz4_ratio = lz4_flex::block::compress(mid).len() as f64 / mid.len() as f64;

    let client = cluster.plane(CLIENT).clone();
    probe(client.clone(), None, 100).await?; // warm-up

    // Throughput: moves back and forth, nothing else running.
    let mut thr = Vec::new();
    let mut move_id = 0;
    let (mut from, mut to) = (SOURCE, DEST);
    for _ in 0..reps {
        move_id += 1;
        let (bytes, secs) = move_all(&mut cluster, from, to, move_id).await?;
        thr.push(bytes as f64 / secs);
        std::mem::swap(&mut from, &mut to);
    }
    if from != SOURCE {
        move_id += 1;
        move_all(&mut cluster, from, to, move_id).await?;
    }
    // Latency: the probe while idle, then while the input blocks move away
    // from the source and back, again and again, until it has as many.
    let mut idle = Vec::new();
    let mut busy = Vec::new();
    let mut p99s = Vec::new();
    let mut moves = 0;
    for _ in 0..reps.div_ceil(2).max(2) {
        let (mut i, mut b) = (Vec::new(), Vec::new());
        for _ in 0..LATENCY_ROUNDS {
            let per_round = LATENCY_SAMPLES / LATENCY_ROUNDS;
            i.extend(probe(client.clone(), None, per_round).await?);
            let moving = Arc::new(AtomicBool::new(false));
            let probing = tokio::spawn(probe(client.clone(), Some(Arc::clone(&moving)), per_round));
            let (mut from, mut to) = (SOURCE, DEST);
            while !probing.is_finished() || from != SOURCE {
                move_id += 1;
                moving.store(!probing.is_finished(), Ordering::SeqCst);
                move_all(&mut cluster, from, to, move_id).await?;
                moving.store(false, Ordering::SeqCst);
                moves += 1;
                std::mem::swap(&mut from, &mut to);
            }
            b.extend(probing.await??);
        }
        idle.extend_from_slice(&i);
        busy.extend_from_slice(&b);
        p99s.push((percentile(&mut b, 99.0), percentile(&mut i, 99.0)));
    }
    cluster.stop().await;
    iperf.push(iperf3_loopback(2).await?);
    let iperf_bps = median(&mut iperf);
    let per_move = thr
        .iter()
        .map(|b| format!("{:.2}", b / iperf_bps))
        .collect::<Vec<_>>()
        .join(" ");
    let per_p99 = p99s
        .iter()
        .map(|(b, i)| format!("{:.2}", b / i))
        .collect::<Vec<_>>()
        .join(" ");
    let moved = median(&mut thr);
    let ratio = moved / iperf_bps;
    let ms = |s: f64| format!("{:.3} ms", s * 1e3);
    let (i50, i99) = (percentile(&mut idle, 50.0), percentile(&mut idle, 99.0));
    let (b50, b99) = (percentile(&mut busy, 50.0), percentile(&mut busy, 99.0));
    print_table(
        &format!(
            "Block moves: {INPUT_BLOCKS} input blocks, {} MiB encoded in total, median of {reps} moves; \
             lz4 on a 64 KiB sample of the encoded data: ratio {lz4_ratio:.2}; iperf3 runs: {}",
            TOTAL_BYTES >> 20,
            iperf
                .iter()
                .map(|b| format!("{:.0} MB/s", mb_s(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        &[
            Row {
                figure: "move throughput (100 MiB input blocks)".into(),
                value: format!("{:.0} MB/s", mb_s(moved)),
                reference: format!("iperf3 {:.0} MB/s", mb_s(iperf_bps)),
                ratio: Some(ratio),
                target: "≥ 0.80×".into(),
                pass: Some(ratio >= 0.8),
            },
            Row {
                figure: format!("get p50, {GET_KEYS} unmoved keys, during a move"),
                value: ms(b50),
                reference: format!("idle {}", ms(i50)),
                ratio: Some(b50 / i50),
                target: "— (report)".into(),
                pass: None,
            },
            Row {
                figure: format!("get p99, {GET_KEYS} unmoved keys, during a move"),
                value: ms(b99),
                reference: format!("idle {}", ms(i99)),
                ratio: Some(b99 / i99),
                target: "≤ 1.50×".into(),
                pass: Some(b99 / i99 <= 1.5),
            },
            Row::plain(
                "gets measured (idle / during moves)",
                format!("{} / {} (during {moves} moves)", idle.len(), busy.len()),
            ),
        ],
    );
    println!("\nEach repetition, in order:\n");
    println!("- move throughput / iperf3: {per_move}");
    println!("- get p99 during moves / idle, in alternating rounds: {per_p99}");
    Ok(())
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-reconfig [REPS]

Time per reconfiguration operation, block-move throughput against iperf3
on loopback, and get latency during a move against idle (install iperf3
once with integration/bench/setup.sh).

  REPS   repetitions; medians are printed (default 6)
";

fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    // The data planes here stand for evaluators: tuned as `cruise` tunes them.
    cruise_container::os::tune_allocator();
    let reps = cruise_integration::bench::reps_arg(6)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(reps))
}
