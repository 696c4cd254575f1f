//! Benchmark: parameter-server pull/push throughput, one worker and one
//! server (two data planes over loopback, each with its own store, the
//! default data-plane settings), dense pulls and pushes of 1 MiB and 64 MiB
//! of random model values, against `iperf3` single-stream TCP on 127.0.0.1
//! measured in the same run (before, between the sizes and after; the median
//! is the reference). Each repetition's ratio is printed, and the median.
//!
//! ```text
//! integration/bench/setup.sh          # iperf3 (once)
//! cargo run --release -p cruise-integration --bin bench-dataplane [-- REPS [SIZE_MIB...]]
//! ```
//!
//! Targets (issue #21): 64 MiB pulls and pushes at ≥ 0.8× iperf3, 1 MiB at
//! ≥ 0.7×.

use cruise_container::protocol::BlockId;
use cruise_container::protocol::EvaluatorId;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use cruise_container::peer::DataPlane;
use cruise_container::protocol::{Key, MODEL_TABLE, PeerResponse, ValueBatch};
use cruise_container::store::{OpKind, StoreOp};
use cruise_integration::bench::{
    AddModel, Cluster, Row, default_settings, iperf3_loopback, machine_note, mb_s, median,
    print_table,
};

/// Floats per key: 4 KiB values, like a dense model row block.
const VALUE_LEN: usize = 1024;
const MODEL_BLOCKS: u32 = 64;
const SERVER: EvaluatorId = EvaluatorId(1);
const WORKER: EvaluatorId = EvaluatorId(2);

fn op(kind: OpKind, keys: &[Key], values: ValueBatch) -> StoreOp {
    StoreOp {
        kind,
        table: MODEL_TABLE,
        keys: keys.to_vec(),
        values,
    }
}

fn random_values(n: usize, rng: &mut ChaCha8Rng) -> ValueBatch {
    let mut v = ValueBatch {
        lens: Vec::with_capacity(n),
        data: Vec::with_capacity(n * VALUE_LEN),
    };
    let mut row = vec![0f32; VALUE_LEN];
    for _ in 0..n {
        for x in row.iter_mut() {
            *x = rng.random_range(-1.0..1.0);
        }
        v.push(&row);
    }
    v
}

async fn timed(dp: &DataPlane, o: StoreOp, want_values: usize) -> anyhow::Result<f64> {
    // The caller keeps the operation until the time is taken, as a worker
    // keeps its pushes (`execute_arc_traced`): the data plane would
    // otherwise free a push's 64 MiB of deltas as it answers, an munmap of
    // about 6 ms on the caller's thread inside the timing that a worker
    // pays later, off the transfer's path.
    let o = Arc::new(o);
    let t0 = Instant::now();
    let (r, _) = dp.execute_arc_traced(Arc::clone(&o)).await;
    let secs = t0.elapsed().as_secs_f64();
    drop(o);
    match r {
        Ok(PeerResponse::Values(v)) if v.data.len() == want_values => {
            // Given back as a worker gives back its pulls' values.
            dp.recycle(v.data);
            Ok(secs)
        }
        Ok(PeerResponse::Done) if want_values == 0 => Ok(secs),
        other => bail!(
            "unexpected answer: {:?}",
            other.map(|_| "values of the wrong size")
        ),
    }
}

async fn run(reps: usize, sizes: Vec<usize>) -> anyhow::Result<()> {
    println!("## PS pull/push throughput ({})", machine_note());
    let mut iperf = vec![iperf3_loopback(2).await?];

    let mut cluster = Cluster::start(
        2,
        &[(MODEL_TABLE, MODEL_BLOCKS)],
        Arc::new(AddModel { len: VALUE_LEN }),
        default_settings(),
    )
    .await?;
    let blocks: Vec<BlockId> = BlockId::all(MODEL_BLOCKS).collect();
    cluster
        .plane(SERVER)
        .store()
        .create_blocks(MODEL_TABLE, &blocks)
        .context("creating model blocks")?;
    cluster.set_owners(blocks.iter().map(|&b| (MODEL_TABLE, b, SERVER)).collect());
    let worker = cluster.plane(WORKER).clone();
    let mut rng = ChaCha8Rng::seed_from_u64(7);

    let mut rows = Vec::new();
    let mut results = Vec::new();
    for size in sizes {
        let n = size / (VALUE_LEN * 4);
        let keys: Vec<Key> = (0..n as u64).collect();
        // Random values: model values do not compress, and the codec sends
        // them raw (as `channel.compression = auto` decides).
        timed(
            &worker,
            op(OpKind::Put, &keys, random_values(n, &mut rng)),
            0,
        )
        .await?;
        let deltas = random_values(n, &mut rng);
        let (mut pulls, mut pushes) = (Vec::new(), Vec::new());
        // One untimed round first (connections, allocator).
        timed(
            &worker,
            op(OpKind::Get, &keys, ValueBatch::default()),
            n * VALUE_LEN,
        )
        .await?;
        for _ in 0..reps {
            let pull = op(OpKind::Get, &keys, ValueBatch::default());
            pulls.push(size as f64 / timed(&worker, pull, n * VALUE_LEN).await?);
            let push = op(OpKind::Update, &keys, deltas.clone());
            pushes.push(size as f64 / timed(&worker, push, 0).await?);
        }
        results.push((size, pulls, pushes));
        iperf.push(iperf3_loopback(2).await?);
    }
    cluster.stop().await;
    let iperf_runs = iperf.clone();
    let iperf_bps = median(&mut iperf);

    let mut per_rep = Vec::new();
    for (size, mut pulls, mut pushes) in results {
        let label = if size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else {
            format!("{} KiB", size >> 10)
        };
        for (what, all) in [("pull", &mut pulls), ("push", &mut pushes)] {
            per_rep.push(format!(
                "dense {what}, {label}: {}",
                all.iter()
                    .map(|b| format!("{:.2}", b / iperf_bps))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
            let bps = median(all);
            let ratio = bps / iperf_bps;
            let target = match size {
                s if s == 64 << 20 => Some(0.8),
                s if s == 1 << 20 => Some(0.7),
                _ => None,
            };
            rows.push(Row {
                figure: format!("dense {what}, {label}"),
                value: format!("{:.0} MB/s", mb_s(bps)),
                reference: format!("iperf3 {:.0} MB/s", mb_s(iperf_bps)),
                ratio: Some(ratio),
                target: target.map_or("—".into(), |t| format!("≥ {t:.2}×")),
                pass: target.map(|t| ratio >= t),
            });
        }
    }
    print_table(
        &format!(
            "Pull/push throughput, 1 worker + 1 server on loopback, median of {reps}; iperf3 runs: {}",
            iperf_runs
                .iter()
                .map(|b| format!("{:.0} MB/s", mb_s(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        &rows,
    );
    println!("\nEach repetition's ratio to the median iperf3 run, in order:\n");
    for line in per_rep {
        println!("- {line}");
    }
    Ok(())
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-dataplane [REPS [SIZE_MIB...]]

Data-plane pull throughput against iperf3 on loopback, measured in the
same run (install iperf3 once with integration/bench/setup.sh).

  REPS       repetitions; medians are printed (default 7)
  SIZE_MIB   pull sizes in MiB (default: 1 and 64)
";

fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    // The data planes here stand for evaluators: tuned as `cruise` tunes them.
    cruise_container::os::tune_allocator();
    let reps = cruise_integration::bench::reps_arg(7)?;
    let mut sizes = Vec::new();
    for a in std::env::args().skip(2) {
        let mib: usize = a
            .parse()
            .with_context(|| format!("SIZE_MIB {a:?} is not a number"))?;
        sizes.push(mib << 20);
    }
    if sizes.is_empty() {
        sizes = vec![1 << 20, 64 << 20];
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(reps, sizes))
}
