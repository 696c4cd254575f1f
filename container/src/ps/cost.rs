//! What a mini-batch costs its worker, told apart: its own time (the CPU
//! it spends, at the wall seconds a CPU second takes here), the part of its
//! requests' CPU that grows with the servers it talks to, and the CPU of
//! encoding and decoding values. The AM's cost model prices a worker by
//! these figures.

use std::time::Instant;

use crate::peer::DataPlane;
use crate::protocol::{MODEL_TABLE, MiniBatchReport, ValueBatch};
use crate::store::Store;

/// CPU seconds used so far by the calling thread (the worker's loop), by
/// the evaluator's outbound request connections ([`DataPlane::request_cpu_secs`]),
/// and by the loop's thread on its requests ([`RequestCpu::on_loop`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct CpuMark {
    pub(super) thread: f64,
    pub(super) requests: f64,
    pub(super) loop_requests: f64,
}

impl CpuMark {
    pub(super) fn now(cpu: RequestCpu) -> CpuMark {
        CpuMark {
            thread: crate::os::thread_cpu_secs(),
            requests: cpu.connections,
            loop_requests: cpu.on_loop,
        }
    }
}

/// What a worker's requests have cost so far, in CPU seconds: on the
/// outbound connections (the runtime's thread), and on the worker's loop
/// thread (handing each request to its connection, and being woken for the
/// answers).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RequestCpu {
    pub(super) connections: f64,
    /// The loop thread's part: [`DataPlane::forward_cpu_secs`], and its CPU
    /// between polls of the worker's loop ([`crate::os::OffPollCpu`]). The
    /// loop waits only for answers (a pull, a push's acknowledgement), one
    /// wake-up per server answer that arrives while it waits, which grows
    /// with the servers a mini-batch talks to.
    pub(super) on_loop: f64,
}

/// What a worker's request CPU is told apart by (see [`io_secs`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestPricing {
    /// CPU seconds encoding and decoding take per byte of values
    /// ([`codec_cpu_per_byte`]).
    pub(super) codec_per_byte: f64,
    /// CPU seconds one empty round trip takes the request connection
    /// ([`round_trip_cpu`]); infinite when unknown.
    pub(super) round_trip: f64,
}

/// Completes a mini-batch's report at its end, on the worker's loop thread:
/// its wall time since the previous one ended (`since`), its CPU at the
/// wall seconds a CPU second takes here (`cpu_wall_secs`, of which the AM
/// takes its own time over a window of reports: [`own_secs`]) and the part
/// of that spent on its requests that grows with the `servers` it talks to
/// ([`io_secs`]); `requests` is what its requests have cost so far
/// ([`RequestCpu`]).
/// Returns this end, where the next mini-batch starts, so that the
/// mini-batches tile the loop's time.
///
/// The CPU clocks are read before the wall clock: reading a CPU clock
/// settles the scheduler's accounting, and a container out of CPU quota is
/// throttled right there, until its next period. Read after the wall clock,
/// that wait fell between two mini-batches and counted in neither. On
/// `bench-optimizer`'s emulated cluster (0.15-CPU workers, MLR 100
/// features, B = 1000) the mini-batches of a local epoch summed to 0.04-0.11
/// s of its 0.11 s, and the cost model, priced by them, predicted 0.08 s
/// epochs that took 0.11-0.12 s.
pub(super) fn finish(
    r: &mut MiniBatchReport,
    since: BatchMark,
    requests: RequestCpu,
    pricing: RequestPricing,
    servers: usize,
) -> BatchMark {
    let end = BatchMark::now(requests);
    let loop_requests = (end.cpu.loop_requests - since.cpu.loop_requests).max(0.0);
    r.batch_secs = end.wall.duration_since(since.wall).as_secs_f64();
    let loop_cpu = end.cpu.thread - since.cpu.thread;
    let request_cpu = (end.cpu.requests - since.cpu.requests).max(0.0);
    let wall_per_cpu = crate::os::wall_per_cpu();
    r.cpu_wall_secs = (loop_cpu + request_cpu).max(0.0) * wall_per_cpu;
    let codec = pricing.codec_per_byte * (r.pull_bytes + r.push_bytes) as f64;
    let per_server = (request_cpu - codec + loop_requests)
        .min(ROUND_TRIPS_PER_SERVER * pricing.round_trip * servers as f64);
    r.io_secs = io_secs(r.cpu_wall_secs, per_server, wall_per_cpu);
    end
}

/// The servers a mini-batch talks to (the model's owners), counted again
/// only when the ownership view has changed since `counted` (its version
/// and count), not on every mini-batch.
pub(super) fn model_servers(store: &Store, counted: &mut (u64, usize)) -> usize {
    let version = store.ownership_version();
    if counted.0 != version {
        *counted = (version, store.owner_count(MODEL_TABLE));
    }
    counted.1
}

/// Answers a worker waits for per server and mini-batch: its pull's and its
/// push's.
pub(super) const ROUND_TRIPS_PER_SERVER: f64 = 2.0;

/// Round trips [`round_trip_cpu`] times.
pub(super) const CALIBRATION_ROUND_TRIPS: u32 = 64;

/// CPU seconds one request's round trip costs the request connection of
/// the calling worker beside its values: writing the request and reading
/// the answer. Measured with empty probes to this evaluator's own
/// data-plane port, after one that opens the connection. `None` if they
/// fail.
///
/// It bounds the part of a mini-batch's request CPU that is priced per
/// server ([`finish`]): what grows with the servers is the connections'
/// work on each request; the rest grows with the bytes, whoever serves
/// them. The calling thread's part of a probe (handing it over, being woken
/// for its answer, parking) is logged but not counted: a mini-batch's
/// requests go out together and its loop is woken for their answers
/// together, so that part does not grow with the servers (BENCHMARKS.md,
/// issue #16, fourth pass, has the measurements).
pub(super) async fn round_trip_cpu(
    dp: &DataPlane,
    waits: &std::sync::atomic::AtomicU64,
) -> Option<f64> {
    use std::sync::atomic::Ordering::Relaxed;
    let me = dp.id();
    dp.probe(me, 0, 1).await.ok()?;
    let (c0, t0, w0) = (
        dp.request_cpu_secs(),
        crate::os::thread_cpu_secs(),
        waits.load(Relaxed),
    );
    dp.probe(me, 0, CALIBRATION_ROUND_TRIPS).await.ok()?;
    let connection = dp.request_cpu_secs() - c0;
    tracing::debug!(
        connection,
        loop_thread = crate::os::thread_cpu_secs() - t0,
        waits = waits.load(Relaxed).saturating_sub(w0) as f64 * 1e-9,
        round_trips = CALIBRATION_ROUND_TRIPS,
        "empty round trips' CPU, seconds"
    );
    (connection > 0.0).then(|| connection / f64::from(CALIBRATION_ROUND_TRIPS))
}

/// Where a mini-batch ended (and the next began): the CPU clocks, then the
/// wall clock (see [`finish`]).
#[derive(Clone, Copy)]
pub(super) struct BatchMark {
    pub(super) cpu: CpuMark,
    pub(super) wall: Instant,
}

impl BatchMark {
    pub(super) fn now(requests: RequestCpu) -> BatchMark {
        let cpu = CpuMark::now(requests);
        BatchMark {
            cpu,
            wall: Instant::now(),
        }
    }
}

/// The part of a mini-batch's own time (`own`) spent on its requests that
/// grows with the servers it talks to, at `wall_per_cpu`, within
/// `[0, own]`. `request_cpu` is the CPU its outbound request connections
/// took beyond encoding and decoding the values (writing, reading, waking,
/// completing; a pull and a push per server), plus what the loop's thread
/// spent handing each request to its connection and being woken for the
/// answers (`RequestCpu`), at most what two empty round trips take a
/// request connection, a server (`round_trip_cpu`). The values' part is as large whoever holds
/// them, and stays in the own time (the cost model prices it per record).
/// Left in the loop's own time, the wake-ups made a 0.09-CPU worker beside
/// 7 servers (MLR 100 features) measure 5.1 µs of computing a record where
/// beside 1 it measured 3.7 µs.
///
/// Only those connections' CPU: the evaluator's other work off the loop
/// (heartbeats, reports, timers) goes on per second whatever the
/// mini-batch talks to, and counted per mini-batch it grows with the time
/// a worker waits. On a generated cluster (MLR 1,000 features, 0.4-CPU
/// workers, wall seconds at the quota) the process's CPU off the loop
/// thread was 330 µs a mini-batch beside 7 servers and 400 µs beside 1
/// slow one that starved the workers: priced per server from the
/// one-server split, a 1W+7S split was predicted at 0.58 s for 0.20 s
/// measured. The request connections alone took 150 µs beside 1 server
/// and 300-340 µs beside 6 or 7: about 130 µs for the values whatever the
/// servers, and 30 µs per server.
pub fn io_secs(own: f64, request_cpu: f64, wall_per_cpu: f64) -> f64 {
    (request_cpu.max(0.0) * wall_per_cpu).min(own.max(0.0))
}

/// CPU seconds per byte of values that a worker's request connections
/// spend encoding its pushes and decoding the answers to its pulls, with
/// the connections' framing options (postcard, and lz4 where they say).
/// Measured on this thread with a push and an answer of 64 KiB of values
/// (10 per key, as MLR's classes; random, as model values are), encoded
/// and decoded until a few milliseconds of CPU have passed.
pub fn codec_cpu_per_byte(opts: crate::protocol::FrameOptions) -> f64 {
    use tokio_util::codec::{Decoder, Encoder};
    const KEYS: usize = 1638;
    const LEN: usize = 10;
    let mut x = 0x2545_f491_u32;
    let data: Vec<f32> = (0..KEYS * LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        })
        .collect();
    let values = ValueBatch {
        lens: vec![LEN as u32; KEYS],
        data,
    };
    let bytes = values.byte_len() as f64;
    let keys: Vec<crate::protocol::Key> = (0..KEYS as u64).map(|k| k * 7919).collect();
    let push = crate::protocol::ToOwner::Request {
        id: 1,
        req: crate::protocol::PeerRequest::Update {
            table: MODEL_TABLE,
            keys,
            deltas: values.clone(),
        },
    };
    let answer = crate::protocol::ToClient::Response {
        id: 1,
        result: Ok(crate::protocol::PeerResponse::Values(values)),
    };
    let mut client = crate::protocol::FrameCodec::<
        crate::protocol::ToOwner,
        crate::protocol::ToClient,
    >::new(opts);
    let mut server = crate::protocol::FrameCodec::<
        crate::protocol::ToClient,
        crate::protocol::ToOwner,
    >::new(opts);
    let mut wire = bytes::BytesMut::new();
    if server.encode(answer, &mut wire).is_err() {
        return 0.0;
    }
    let frame = wire.freeze();
    let (mut cpu, mut done) = (0.0, 0.0);
    for _ in 0..200 {
        let t0 = crate::os::thread_cpu_secs();
        let mut out = bytes::BytesMut::new();
        let encoded = client.encode(push.clone(), &mut out).is_ok();
        let mut src = bytes::BytesMut::from(&frame[..]);
        let decoded = matches!(client.decode(&mut src), Ok(Some(_)));
        cpu += crate::os::thread_cpu_secs() - t0;
        if !(encoded && decoded) {
            return 0.0;
        }
        done += 2.0 * bytes;
        if cpu > 0.003 {
            break;
        }
    }
    if done > 0.0 { cpu.max(0.0) / done } else { 0.0 }
}

/// CPU seconds per byte served that a server's store takes on top of what
/// each of its operations costs whatever its size: reading and applying
/// values. Measured on this thread, on a scratch store with the job's
/// model functions (`model`) and its keys spread over 64 blocks, as the
/// slope between an update and a read of `n` keys and of `16 n` (`16 n`
/// values of at most 1 MiB): CPU seconds over the bytes a server counts
/// (keys and values in, values out). `None` if an operation fails.
///
/// What a server measures of its store's work beside a worker's requests
/// is not all per byte: an operation costs about the same whether it reads
/// a few keys or many when the server is not busy (its structures are out
/// of the cache between requests), and the cost per byte fell 3-6× from a
/// one-worker split (seven servers, a seventh of the model each) to a
/// seven-worker one (one server) on 0.09-CPU servers of MLR with 100
/// features, while with 10,000 features it stayed near this slope (0.8-1
/// times what was measured). Priced per byte, that fixed part made a
/// server's share of a small model look as costly as the whole of it.
pub fn store_cpu_per_byte(model: std::sync::Arc<dyn crate::store::ModelFunctions>) -> Option<f64> {
    use crate::protocol::{BlockId, EvaluatorId};
    use crate::store::{OpKind, StoreOp};
    let value_len = model.value_len().max(1);
    let large = ((1usize << 20) / (value_len * 4)).clamp(16, 4096);
    let small = (large / 16).max(1);
    // The model's keys spread over blocks as a job's do.
    const BLOCKS: u32 = 64;
    let store = Store::new(EvaluatorId(0));
    store.configure(&[(MODEL_TABLE, BLOCKS)], model);
    let blocks: Vec<BlockId> = (0..BLOCKS).map(BlockId).collect();
    store.create_blocks(MODEL_TABLE, &blocks).ok()?;
    // CPU seconds and bytes of an update and a read of `n` keys, spread
    // over a key space 16 times larger, as a server's share of a model is.
    let pair = |n: usize| -> Option<(f64, f64)> {
        let keys: Vec<u64> = (0..n as u64).map(|k| k * 16 + k % 16).collect();
        let mut deltas = ValueBatch::default();
        let delta = vec![1e-6f32; value_len];
        for _ in 0..n {
            deltas.push(&delta);
        }
        let update = StoreOp {
            kind: OpKind::Update,
            table: MODEL_TABLE,
            keys: keys.clone(),
            values: deltas,
        };
        let get = StoreOp {
            kind: OpKind::Get,
            table: MODEL_TABLE,
            keys,
            values: ValueBatch::default(),
        };
        let bytes = (update.byte_len() + get.byte_len() + n * value_len * 4) as f64;
        // Once to create the keys, then timed until a few milliseconds.
        store.submit(&update).ok()?;
        let (mut cpu, mut pairs) = (0.0, 0u32);
        while pairs < 3 || (cpu < 0.002 && pairs < 10_000) {
            let t0 = crate::os::thread_cpu_secs();
            let a = store.submit(&update);
            let b = store.submit(&get);
            cpu += crate::os::thread_cpu_secs() - t0;
            drop((a.ok()?, b.ok()?));
            pairs += 1;
        }
        Some((cpu / f64::from(pairs), bytes))
    };
    let (small_cpu, small_bytes) = pair(small)?;
    let (large_cpu, large_bytes) = pair(large)?;
    Some(((large_cpu - small_cpu) / (large_bytes - small_bytes)).max(0.0))
}

/// A worker's own seconds in mini-batches of `batch` wall seconds: what
/// they cost it once it runs flat out, the work it cannot hand to the
/// network or the servers. That is the CPU time spent on them (`cpu`: the
/// loop thread's, computing, building requests, applying its own pushes,
/// and its request connections', framing and decoding) at the wall seconds
/// a CPU second takes here (`wall_per_cpu`: 1 on a free core, `1 / quota`
/// under a CPU quota, where every thread of the process draws on the
/// quota). It lies between the loop's own wall time outside its waits
/// (`batch - wait`, at least the computation `comp`) and `batch` (threads
/// on free cores run in parallel, so their CPU seconds may add up to more
/// than the wall time).
///
/// Bounded over many mini-batches, not one at a time (the AM takes it over
/// its window of reports): under a quota the CPU comes in bursts at a
/// core's speed, and a burst's mini-batches, whose answers were already
/// there, take less wall time than their CPU costs at the quota. Bounded
/// one at a time, a 0.09-CPU worker waiting on its one server most of each
/// 8.5 ms mini-batch (MLR, 100 features, B = 1000) was given 3.0-4.6 ms of
/// own time for 4.8-5.6 ms of CPU at the quota, while beside seven servers,
/// never waiting, it was given all of its 7.2 ms: the difference was
/// priced as per-record work that grows with the servers.
///
/// Why CPU time and not the computation's wall time: under a quota, a
/// worker that waits on its servers most of the time computes in bursts at
/// a core's speed, and its wall-clock compute time understates what the
/// same work costs once the worker is the bottleneck. On `bench-optimizer`'s
/// emulated cluster (0.3- and 0.15-CPU containers, MLR with a 4 KB model,
/// B = 1000) a fast worker computed a mini-batch in 0.52 ms behind a slow
/// server and in 1.0–1.1 ms once a fast server freed it, and the model,
/// priced by the first figure, predicted a 30% gain for a plan that gained
/// 5%. Before that, pricing the computation alone blamed the slow server
/// for the workers' own per-mini-batch work (3.6 ms mini-batches of 1.1 ms
/// of computation).
pub fn own_secs(batch: f64, wait: f64, comp: f64, cpu: f64, wall_per_cpu: f64) -> f64 {
    let loop_own = (batch - wait).max(comp).min(batch);
    (cpu.max(0.0) * wall_per_cpu).min(batch).max(loop_own)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    /// A model whose update adds deltas, `len` values a key.
    struct Add(usize);

    impl crate::store::ModelFunctions for Add {
        fn value_len(&self) -> usize {
            self.0
        }
        fn init(&self, _key: crate::protocol::Key) -> Vec<f32> {
            vec![0.0; self.0]
        }
        fn update(&self, _key: crate::protocol::Key, value: &mut [f32], delta: &[f32]) {
            for (v, d) in value.iter_mut().zip(delta) {
                *v += d;
            }
        }
    }

    /// Reading and applying values costs the store some CPU per byte
    /// beyond each operation's own, far less than a microsecond, for
    /// values of one float a key as of thousands.
    #[test]
    fn store_cost_per_byte_is_measured() {
        for len in [1, 10, 5000] {
            let per_byte = store_cpu_per_byte(std::sync::Arc::new(Add(len)))
                .expect("updates and reads on a scratch store");
            assert!((0.0..1e-6).contains(&per_byte), "{len}: {per_byte}");
        }
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
            (r.io_secs, r.cpu_wall_secs)
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
}
