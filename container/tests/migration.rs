//! Property test of live reconfiguration (issue #3, DESIGN §4): random
//! sequences of add / delete / switch / move, with injected failures of moves,
//! while workers push known increments — no update is lost or applied twice,
//! reads never go backwards, and every block has exactly one owner at every
//! observation.
//!
//! Everything is real except the AM: several [`DataPlane`]s, each with its own
//! [`Store`], talk over loopback sockets with the real handshake and frames,
//! exactly as evaluators do. A small driver plays the AM: it holds the
//! authoritative ownership table (the AM's [`OwnerTable`]), broadcasts an ownership delta to every store
//! after each `BlockMoved` report, and publishes the peer directory.
//!
//! The model is an "add-vector": every key holds `[sum, count]`, every push
//! adds `[increment, 1]` with a small integer increment (exact in `f32`), so
//! the final value of a key is exactly the sum of what was acknowledged for it,
//! and its count says how many pushes were applied.
//!
//! Reproducing a failure: proptest stores the failing case's seed in
//! `tests/migration.regressions`; it is run first on the next `cargo test`.
//! The sequence of steps and the pushers' choices are fixed by the seed; the
//! interleaving of threads is not, so a rare race may need a few runs.
//! `PROPTEST_CASES=N` sets the number of cases (default 32).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_container::ownership::OwnerTable;
use cruise_container::peer::{DataPlane, PeerSettings};
use cruise_container::protocol::{
    BlockId, EvalToAm, EvaluatorId, Faults, FrameOptions, INPUT_TABLE, Key, MODEL_TABLE,
    OwnershipUpdate, PeerResponse, Secret, TableId, ValueBatch,
};
use cruise_container::store::{
    BlockData, InputBlock, ModelFunctions, OpKind, SlotKind, Store, StoreOp,
};

const KEYS: u64 = 160;
const MODEL_BLOCKS: u32 = 8;
const INPUT_BLOCKS: u32 = 6;
const PUSHERS_PER_WORKER: u64 = 2;
/// Longest any single step of the driver may take before the case fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// `[sum, count]`, updated by adding.
struct AddVector;

impl ModelFunctions for AddVector {
    fn value_len(&self) -> usize {
        2
    }
    fn init(&self, _key: Key) -> Vec<f32> {
        vec![0.0, 0.0]
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        for (v, d) in value.iter_mut().zip(delta) {
            *v += d;
        }
    }
}

/// The records of input block `b` (distinct per block, so a swapped or
/// truncated block is noticed).
fn input_block(b: BlockId) -> InputBlock {
    let b = b.0;
    let mut block = InputBlock::new();
    for r in 0..(40 + 13 * b) {
        let n = (r % 7) + 1;
        block.push(
            b as f32,
            (0..n).map(|j| (r * 10 + j, (b * 1000 + r) as f32 + j as f32 * 0.5)),
        );
    }
    block
}

// ---------------------------------------------------------------------------
// The random plan
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MoveSpec {
    /// Input blocks between workers, or model blocks between servers.
    input: bool,
    src: Index,
    dst: Index,
    blocks: Vec<Index>,
}

#[derive(Debug, Clone)]
struct FaultSpec {
    /// Which of the step's moves to break.
    on_move: Index,
    /// Break the source's end (else the destination's).
    at_source: bool,
    /// `None`: broken before the move starts; `Some(n)`: after `n` yields,
    /// anywhere in the transfer (or after it).
    after_yields: Option<u32>,
}

#[derive(Debug, Clone)]
enum Step {
    /// A new evaluator joins (as a worker or as a server without blocks).
    Add { worker: bool },
    /// An evaluator leaves: its blocks move off, then it says goodbye.
    Delete { who: Index },
    /// An evaluator changes role (its blocks move off first).
    Switch { who: Index },
    /// An evaluator answers requests slowly from now on (every frame it
    /// answers is delayed; zero ends that), widening the windows in which
    /// operations queue or are forwarded.
    Slow { who: Index, micros: u64 },
    /// Several moves at once, maybe one of them broken.
    Move {
        moves: Vec<MoveSpec>,
        fault: Option<FaultSpec>,
    },
}

#[derive(Debug, Clone)]
struct Scenario {
    servers: usize,
    workers: usize,
    seed: u64,
    steps: Vec<Step>,
}

fn move_spec() -> impl Strategy<Value = MoveSpec> {
    (
        any::<bool>(),
        any::<Index>(),
        any::<Index>(),
        prop::collection::vec(any::<Index>(), 1..4),
    )
        .prop_map(|(input, src, dst, blocks)| MoveSpec {
            input,
            src,
            dst,
            blocks,
        })
}

fn fault_spec() -> impl Strategy<Value = FaultSpec> {
    (
        any::<Index>(),
        any::<bool>(),
        prop_oneof![Just(None), (0u32..40).prop_map(Some)],
    )
        .prop_map(|(on_move, at_source, after_yields)| FaultSpec {
            on_move,
            at_source,
            after_yields,
        })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => any::<bool>().prop_map(|worker| Step::Add { worker }),
        1 => any::<Index>().prop_map(|who| Step::Delete { who }),
        1 => any::<Index>().prop_map(|who| Step::Switch { who }),
        1 => (any::<Index>(), prop_oneof![Just(0u64), 20u64..300])
            .prop_map(|(who, micros)| Step::Slow { who, micros }),
        5 => (
            prop::collection::vec(move_spec(), 1..4),
            prop::option::weighted(0.35, fault_spec()),
        )
            .prop_map(|(moves, fault)| Step::Move { moves, fault }),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        1usize..=3,
        1usize..=2,
        any::<u64>(),
        prop::collection::vec(step(), 1..10),
    )
        .prop_map(|(servers, workers, seed, steps)| Scenario {
            servers,
            workers,
            seed,
            steps,
        })
}

// ---------------------------------------------------------------------------
// What all cases did, so that the test can tell it exercised what it claims
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Stats {
    cases: AtomicU64,
    adds: AtomicU64,
    deletes: AtomicU64,
    switches: AtomicU64,
    move_steps: AtomicU64,
    moves_ok: AtomicU64,
    moves_failed: AtomicU64,
    pushes: AtomicU64,
    reads: AtomicU64,
}

static STATS: Stats = Stats {
    cases: AtomicU64::new(0),
    adds: AtomicU64::new(0),
    deletes: AtomicU64::new(0),
    switches: AtomicU64::new(0),
    move_steps: AtomicU64::new(0),
    moves_ok: AtomicU64::new(0),
    moves_failed: AtomicU64::new(0),
    pushes: AtomicU64::new(0),
    reads: AtomicU64::new(0),
};

// ---------------------------------------------------------------------------
// What the pushers did
// ---------------------------------------------------------------------------

/// Per-key sums of increments and counts: `issued` before a push is sent,
/// `acked` once it is acknowledged; `seen` is the largest sum a completed read
/// returned.
struct Tally {
    issued: Vec<AtomicU64>,
    issued_n: Vec<AtomicU64>,
    acked: Vec<AtomicU64>,
    acked_n: Vec<AtomicU64>,
    seen: Vec<AtomicU64>,
    /// Operations completed (pushes and reads), to wait for traffic to flow.
    ops: AtomicU64,
    violations: Mutex<Vec<String>>,
}

fn counters() -> Vec<AtomicU64> {
    (0..KEYS).map(|_| AtomicU64::new(0)).collect()
}

impl Tally {
    fn new() -> Self {
        Tally {
            issued: counters(),
            issued_n: counters(),
            acked: counters(),
            acked_n: counters(),
            seen: counters(),
            ops: AtomicU64::new(0),
            violations: Mutex::new(Vec::new()),
        }
    }

    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
}

fn get_op(keys: &[Key]) -> StoreOp {
    StoreOp {
        kind: OpKind::Get,
        table: MODEL_TABLE,
        keys: keys.to_vec(),
        values: ValueBatch::default(),
    }
}

/// One pusher: random multi-key pushes of known increments, and reads that
/// check the values against what was acknowledged and issued.
async fn pusher(dp: DataPlane, tally: Arc<Tally>, stop: CancellationToken, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let me = dp.store().me();
    while !stop.is_cancelled() {
        let n = rng.random_range(1..=5);
        let keys: Vec<Key> = (0..n)
            .map(|_| rng.random_range(0..KEYS))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if rng.random_bool(0.25) {
            let lo: Vec<(u64, u64, u64)> = keys
                .iter()
                .map(|&k| {
                    let k = k as usize;
                    (
                        tally.acked[k].load(Ordering::SeqCst),
                        tally.acked_n[k].load(Ordering::SeqCst),
                        tally.seen[k].load(Ordering::SeqCst),
                    )
                })
                .collect();
            // Never abandon an operation once sent: its outcome must be known.
            let r = dp.execute(get_op(&keys)).await;
            let values = match r {
                Ok(PeerResponse::Values(v)) if v.len() == keys.len() => v,
                other => {
                    tally.violation(format!(
                        "evaluator {me}: read of {keys:?} failed: {other:?}"
                    ));
                    return;
                }
            };
            for ((&k, v), (lo, lo_n, seen)) in keys.iter().zip(values.iter()).zip(lo) {
                let ku = k as usize;
                let hi = tally.issued[ku].load(Ordering::SeqCst);
                let hi_n = tally.issued_n[ku].load(Ordering::SeqCst);
                let (sum, count) = (v[0], v[1]);
                let ok = sum.fract() == 0.0
                    && count.fract() == 0.0
                    && (lo.max(seen) as f32) <= sum
                    && sum <= hi as f32
                    && (lo_n as f32) <= count
                    && count <= hi_n as f32;
                if !ok {
                    tally.violation(format!(
                        "evaluator {me}: key {k} read [{sum}, {count}]; acknowledged before \
                         the read [{lo}, {lo_n}], largest sum read before {seen}, issued by \
                         its end [{hi}, {hi_n}]"
                    ));
                }
                tally.seen[ku].fetch_max(sum as u64, Ordering::SeqCst);
            }
            STATS.reads.fetch_add(1, Ordering::Relaxed);
        } else {
            let mut values = ValueBatch::default();
            let incs: Vec<u64> = keys.iter().map(|_| rng.random_range(1..=9)).collect();
            for (&k, &inc) in keys.iter().zip(&incs) {
                tally.issued[k as usize].fetch_add(inc, Ordering::SeqCst);
                tally.issued_n[k as usize].fetch_add(1, Ordering::SeqCst);
                values.push(&[inc as f32, 1.0]);
            }
            let op = StoreOp {
                kind: OpKind::Update,
                table: MODEL_TABLE,
                keys: keys.clone(),
                values,
            };
            match dp.execute(op).await {
                Ok(_) => {
                    STATS.pushes.fetch_add(1, Ordering::Relaxed);
                    for (&k, &inc) in keys.iter().zip(&incs) {
                        tally.acked[k as usize].fetch_add(inc, Ordering::SeqCst);
                        tally.acked_n[k as usize].fetch_add(1, Ordering::SeqCst);
                    }
                }
                Err(e) => {
                    tally.violation(format!("evaluator {me}: push to {keys:?} failed: {e}"));
                    return;
                }
            }
        }
        tally.ops.fetch_add(1, Ordering::SeqCst);
        let pause = Duration::from_micros(rng.random_range(0..400));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => {}
        }
    }
}

// ---------------------------------------------------------------------------
// The driver (the AM's part)
// ---------------------------------------------------------------------------

struct Node {
    dp: DataPlane,
    /// The hooks on all of its connections (used to slow it down).
    faults: Faults,
    worker: bool,
    pushers: Option<(CancellationToken, TaskTracker)>,
}

struct Driver {
    cancel: CancellationToken,
    settings: PeerSettings,
    nodes: BTreeMap<EvaluatorId, Node>,
    next_id: EvaluatorId,
    owners: OwnerTable,
    next_move: u64,
    tally: Arc<Tally>,
    rng: ChaCha8Rng,
    log: Vec<String>,
}

type Res<T = ()> = Result<T, String>;

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> Res<T> {
    tokio::time::timeout(STEP_TIMEOUT, f)
        .await
        .map_err(|_| format!("{what}: not done within {STEP_TIMEOUT:?}"))
}

/// A planned move, resolved against the current configuration.
#[derive(Debug, Clone)]
struct Planned {
    table: TableId,
    blocks: Vec<BlockId>,
    src: EvaluatorId,
    dst: EvaluatorId,
}

impl Driver {
    fn new(seed: u64) -> Self {
        Driver {
            cancel: CancellationToken::new(),
            settings: PeerSettings {
                job_id: "job_migration_0001".into(),
                secret: Secret::generate(),
                frames: FrameOptions::default(),
                connect_timeout: Duration::from_secs(5),
                // Small chunks: every block travels in several frames.
                chunk_bytes: 512,
                drain_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(60),
            },
            nodes: BTreeMap::new(),
            next_id: EvaluatorId(1),
            owners: OwnerTable::new(),
            next_move: 1,
            tally: Arc::new(Tally::new()),
            rng: ChaCha8Rng::seed_from_u64(seed),
            log: Vec::new(),
        }
    }

    fn role_ids(&self, worker: bool) -> Vec<EvaluatorId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.worker == worker)
            .map(|(&id, _)| id)
            .collect()
    }

    fn blocks_of(&self, table: TableId, id: EvaluatorId) -> Vec<BlockId> {
        self.owners.blocks_of(table, id)
    }

    async fn start_node(&mut self, worker: bool) -> Res<EvaluatorId> {
        let id = self.next_id;
        self.next_id.0 += 1;
        let store = Store::new(id);
        store.configure(
            &[(MODEL_TABLE, MODEL_BLOCKS), (INPUT_TABLE, INPUT_BLOCKS)],
            Arc::new(AddVector),
        );
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind: {e}"))?;
        let faults = Faults::default();
        let dp = DataPlane::start(
            id,
            store,
            listener,
            self.settings.clone(),
            faults.clone(),
            &self.cancel,
        )
        .map_err(|e| format!("starting data plane {id}: {e}"))?;
        if self.owners.version() > 0 {
            // Joins a running job: the whole table at the current version.
            dp.store().apply_ownership(&self.owners.full());
        }
        self.nodes.insert(
            id,
            Node {
                dp,
                faults,
                worker,
                pushers: None,
            },
        );
        self.publish_peers();
        Ok(id)
    }

    fn publish_peers(&self) {
        let peers: Vec<(EvaluatorId, SocketAddr)> = self
            .nodes
            .iter()
            .map(|(&id, n)| (id, n.dp.local_addr()))
            .collect();
        for n in self.nodes.values() {
            n.dp.set_peers(&peers);
        }
    }

    /// The AM's broadcast: a new version of the table, as a delta, to everyone.
    fn broadcast(&mut self, changes: Vec<(TableId, BlockId, EvaluatorId)>) -> Res {
        let u = self.owners.change(changes).map_err(|e| e.to_string())?;
        self.apply_everywhere(&u)
    }

    /// Every evaluator applies `u` and is then at its version.
    fn apply_everywhere(&self, u: &OwnershipUpdate) -> Res {
        for (id, n) in &self.nodes {
            let v = n.dp.store().apply_ownership(u);
            if v != u.version {
                return Err(format!(
                    "evaluator {id} is at ownership version {v} after applying {}",
                    u.version
                ));
            }
        }
        Ok(())
    }

    fn start_pushers(&mut self, id: EvaluatorId) {
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let node = self.nodes.get_mut(&id).expect("node exists");
        for i in 0..PUSHERS_PER_WORKER {
            let seed = self.rng.random::<u64>() ^ i;
            tasks.spawn(pusher(
                node.dp.clone(),
                Arc::clone(&self.tally),
                stop.clone(),
                seed,
            ));
        }
        tasks.close();
        node.pushers = Some((stop, tasks));
    }

    async fn stop_pushers(&mut self, id: EvaluatorId) -> Res {
        if let Some((stop, tasks)) = self.nodes.get_mut(&id).and_then(|n| n.pushers.take()) {
            stop.cancel();
            bounded(
                &format!("pushers of evaluator {id} finishing their last operation"),
                tasks.wait(),
            )
            .await?;
        }
        Ok(())
    }

    /// Waits until the pushers have completed `n` more operations, so that
    /// every step happens with traffic flowing.
    async fn let_traffic_flow(&self, n: u64) -> Res {
        if !self.nodes.values().any(|n| n.pushers.is_some()) {
            return Ok(());
        }
        let target = self.tally.ops.load(Ordering::SeqCst) + n;
        bounded("waiting for pushes to flow", async {
            while self.tally.ops.load(Ordering::SeqCst) < target {
                if !self.tally.violations().is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
    }

    /// Runs moves concurrently, broadcasting each `BlockMoved` as it comes,
    /// like the AM. Returns each move's outcome.
    async fn run_moves(
        &mut self,
        moves: &[Planned],
        fault: Option<(usize, bool, Option<u32>)>,
    ) -> Res<Vec<Result<u64, String>>> {
        let (tx, mut rx) = mpsc::channel::<EvalToAm>(64);
        let mut ids = Vec::new();
        let mut breaker = None;
        if let Some((i, at_source, when)) = fault {
            let m = &moves[i];
            let who = if at_source { m.src } else { m.dst };
            let faults = self.nodes[&who].dp.bulk_faults().clone();
            match when {
                None => faults.break_now(),
                Some(n) => {
                    breaker = Some(tokio::spawn(async move {
                        for _ in 0..n {
                            tokio::task::yield_now().await;
                        }
                        faults.break_now();
                    }))
                }
            }
        }
        let mut set = JoinSet::new();
        for (i, m) in moves.iter().enumerate() {
            let move_id = self.next_move;
            self.next_move += 1;
            ids.push(move_id);
            let dp = self.nodes[&m.src].dp.clone();
            let tx = tx.clone();
            let m = m.clone();
            set.spawn(async move {
                let r = dp
                    .move_blocks(move_id, m.table, &m.blocks, m.dst, &tx)
                    .await
                    .map_err(|e| e.to_string());
                (i, r)
            });
        }
        drop(tx);
        let mut moved: Vec<Vec<BlockId>> = vec![Vec::new(); moves.len()];
        // Every move task holds a sender: the channel ends when all are done.
        // Each report is broadcast at once, while the other moves go on.
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let r = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => return Err(format!("moves not done within {STEP_TIMEOUT:?}")),
                Ok(None) => break,
                Ok(Some(r)) => r,
            };
            let EvalToAm::BlockMoved {
                move_id,
                table,
                block,
                to,
                ..
            } = r
            else {
                return Err(format!("unexpected report {r:?}"));
            };
            let i = ids
                .iter()
                .position(|&m| m == move_id)
                .ok_or_else(|| format!("report of unknown move {move_id}"))?;
            let m = &moves[i];
            if table != m.table || to != m.dst || m.blocks.get(moved[i].len()) != Some(&block) {
                return Err(format!(
                    "move {move_id} ({m:?}) reported block {block} of table {table} to {to} after {:?}",
                    moved[i]
                ));
            }
            moved[i].push(block);
            self.broadcast(vec![(table, block, to)])?;
        }
        let mut results: Vec<Result<u64, String>> = vec![Ok(0); moves.len()];
        let joined = bounded("moves finishing", async {
            let mut out = Vec::new();
            while let Some(j) = set.join_next().await {
                out.push(j);
            }
            out
        })
        .await?;
        for j in joined {
            let (i, r) = j.map_err(|e| format!("move task panicked: {e}"))?;
            if r.is_ok() && moved[i].len() != moves[i].blocks.len() {
                return Err(format!(
                    "move {} ({:?}) succeeded but reported only {:?}",
                    ids[i], moves[i], moved[i]
                ));
            }
            results[i] = r;
        }
        if let Some(b) = breaker {
            b.await.map_err(|e| format!("breaker: {e}"))?;
        }
        for n in self.nodes.values() {
            n.dp.bulk_faults().heal();
        }
        for r in &results {
            let c = if r.is_ok() {
                &STATS.moves_ok
            } else {
                &STATS.moves_failed
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
        for (i, (m, r)) in moves.iter().zip(&results).enumerate() {
            self.log.push(format!(
                "    move {}: {:?} {:?} {}→{}: {}",
                ids[i],
                if m.table == MODEL_TABLE {
                    "model"
                } else {
                    "input"
                },
                m.blocks,
                m.src,
                m.dst,
                match r {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("failed after {:?}: {e}", moved[i]),
                }
            ));
        }
        Ok(results)
    }

    /// Moves every block of `table` off `id`, spread over `to`, without faults.
    async fn evacuate(&mut self, id: EvaluatorId, table: TableId, to: &[EvaluatorId]) -> Res {
        let blocks = self.blocks_of(table, id);
        if blocks.is_empty() {
            return Ok(());
        }
        let mut per: BTreeMap<EvaluatorId, Vec<BlockId>> = BTreeMap::new();
        for (i, b) in blocks.into_iter().enumerate() {
            per.entry(to[i % to.len()]).or_default().push(b);
        }
        let moves: Vec<Planned> = per
            .into_iter()
            .map(|(dst, blocks)| Planned {
                table,
                blocks,
                src: id,
                dst,
            })
            .collect();
        for r in self.run_moves(&moves, None).await? {
            r.map_err(|e| format!("a move without injected faults failed: {e}"))?;
        }
        Ok(())
    }

    /// Every block has exactly one owner: one store holds it `Owned`, it is
    /// the driver's owner, no store has it in transit, and every store's view
    /// agrees with the driver.
    fn observe(&self, when: &str) -> Res {
        for (table, b, owner) in self.owners.entries() {
            let mut kinds = Vec::new();
            for (&id, n) in &self.nodes {
                let k =
                    n.dp.store()
                        .slot_kind(table, b)
                        .map_err(|e| e.to_string())?;
                kinds.push((id, k));
                let view = n.dp.store().owner(table, b);
                if view != Some(owner) {
                    return Err(format!(
                        "{when}: evaluator {id} thinks block {b} of table {table} is on {view:?}; the driver says {owner}"
                    ));
                }
            }
            let owned: Vec<EvaluatorId> = kinds
                .iter()
                .filter(|(_, k)| *k == SlotKind::Owned)
                .map(|(id, _)| *id)
                .collect();
            let in_transit = kinds
                .iter()
                .any(|(_, k)| matches!(k, SlotKind::Incoming | SlotKind::MovingOut));
            if owned != [owner] || in_transit {
                return Err(format!(
                    "{when}: block {b} of table {table}: driver says {owner}, slots {kinds:?}"
                ));
            }
        }
        Ok(())
    }

    fn resolve_moves(&self, specs: &[MoveSpec]) -> Vec<Planned> {
        let mut used: BTreeSet<(TableId, BlockId)> = BTreeSet::new();
        let mut out = Vec::new();
        for s in specs {
            let (table, worker) = if s.input {
                (INPUT_TABLE, true)
            } else {
                (MODEL_TABLE, false)
            };
            let holders: Vec<EvaluatorId> = self
                .role_ids(worker)
                .into_iter()
                .filter(|&id| {
                    self.blocks_of(table, id)
                        .iter()
                        .any(|&b| !used.contains(&(table, b)))
                })
                .collect();
            if holders.is_empty() {
                continue;
            }
            let src = holders[s.src.index(holders.len())];
            let dsts: Vec<EvaluatorId> = self
                .role_ids(worker)
                .into_iter()
                .filter(|&id| id != src)
                .collect();
            if dsts.is_empty() {
                continue;
            }
            let dst = dsts[s.dst.index(dsts.len())];
            let free: Vec<BlockId> = self
                .blocks_of(table, src)
                .into_iter()
                .filter(|&b| !used.contains(&(table, b)))
                .collect();
            let mut blocks = Vec::new();
            for i in &s.blocks {
                let b = free[i.index(free.len())];
                if !blocks.contains(&b) {
                    blocks.push(b);
                    used.insert((table, b));
                }
            }
            out.push(Planned {
                table,
                blocks,
                src,
                dst,
            });
        }
        out
    }

    async fn step(&mut self, step: &Step) -> Res {
        match step {
            Step::Add { worker } => {
                STATS.adds.fetch_add(1, Ordering::Relaxed);
                let id = self.start_node(*worker).await?;
                if *worker {
                    self.start_pushers(id);
                }
                self.log.push(format!(
                    "add evaluator {id} as a {}",
                    if *worker { "worker" } else { "server" }
                ));
            }
            Step::Delete { who } => {
                let servers = self.role_ids(false);
                let workers = self.role_ids(true);
                let mut candidates = Vec::new();
                if servers.len() >= 2 {
                    candidates.extend(&servers);
                }
                if workers.len() >= 2 {
                    candidates.extend(&workers);
                }
                if candidates.is_empty() {
                    self.log
                        .push("delete: skipped (one worker, one server)".into());
                    return Ok(());
                }
                let id = candidates[who.index(candidates.len())];
                let worker = self.nodes[&id].worker;
                self.log.push(format!("delete evaluator {id}"));
                STATS.deletes.fetch_add(1, Ordering::Relaxed);
                let others: Vec<EvaluatorId> = self
                    .role_ids(worker)
                    .into_iter()
                    .filter(|&o| o != id)
                    .collect();
                if worker {
                    self.stop_pushers(id).await?;
                    self.evacuate(id, INPUT_TABLE, &others).await?;
                } else {
                    self.evacuate(id, MODEL_TABLE, &others).await?;
                }
                self.observe(&format!("evaluator {id} evacuated"))?;
                let node = self.nodes.remove(&id).ok_or("node vanished")?;
                bounded(
                    &format!("evaluator {id} leaving gracefully"),
                    node.dp.shutdown(),
                )
                .await?;
                self.publish_peers();
            }
            Step::Switch { who } => {
                let ids: Vec<EvaluatorId> = self.nodes.keys().copied().collect();
                let id = ids[who.index(ids.len())];
                let worker = self.nodes[&id].worker;
                let others: Vec<EvaluatorId> = self
                    .role_ids(worker)
                    .into_iter()
                    .filter(|&o| o != id)
                    .collect();
                if others.is_empty() {
                    self.log.push(format!(
                        "switch evaluator {id}: skipped (the only {})",
                        if worker { "worker" } else { "server" }
                    ));
                    return Ok(());
                }
                STATS.switches.fetch_add(1, Ordering::Relaxed);
                if worker {
                    self.log
                        .push(format!("switch evaluator {id}: worker → server"));
                    self.stop_pushers(id).await?;
                    self.evacuate(id, INPUT_TABLE, &others).await?;
                    self.nodes.get_mut(&id).ok_or("node vanished")?.worker = false;
                } else {
                    self.log
                        .push(format!("switch evaluator {id}: server → worker"));
                    self.evacuate(id, MODEL_TABLE, &others).await?;
                    self.nodes.get_mut(&id).ok_or("node vanished")?.worker = true;
                    self.start_pushers(id);
                }
            }
            Step::Slow { who, micros } => {
                let ids: Vec<EvaluatorId> = self.nodes.keys().copied().collect();
                let id = ids[who.index(ids.len())];
                self.nodes[&id]
                    .faults
                    .set_delay(Duration::from_micros(*micros));
                self.log
                    .push(format!("evaluator {id} answers after {micros} µs"));
            }
            Step::Move { moves, fault } => {
                STATS.move_steps.fetch_add(1, Ordering::Relaxed);
                let planned = self.resolve_moves(moves);
                if planned.is_empty() {
                    self.log.push("move: nothing to move".into());
                    return Ok(());
                }
                let fault = fault
                    .as_ref()
                    .map(|f| (f.on_move.index(planned.len()), f.at_source, f.after_yields));
                self.log.push(format!(
                    "{} concurrent moves, fault {fault:?}",
                    planned.len()
                ));
                let results = self.run_moves(&planned, fault).await?;
                if fault.is_none()
                    && let Some(e) = results.iter().find_map(|r| r.as_ref().err())
                {
                    return Err(format!("a move without injected faults failed: {e}"));
                }
            }
        }
        Ok(())
    }

    async fn setup(&mut self, servers: usize, workers: usize) -> Res {
        let mut s = Vec::new();
        let mut w = Vec::new();
        for _ in 0..servers {
            s.push(self.start_node(false).await?);
        }
        for _ in 0..workers {
            w.push(self.start_node(true).await?);
        }
        let model: Vec<EvaluatorId> = (0..MODEL_BLOCKS as usize).map(|b| s[b % s.len()]).collect();
        let input: Vec<EvaluatorId> = (0..INPUT_BLOCKS as usize).map(|b| w[b % w.len()]).collect();
        for (b, &o) in model.iter().enumerate() {
            self.nodes[&o]
                .dp
                .store()
                .create_blocks(MODEL_TABLE, &[BlockId(b as u32)])
                .map_err(|e| e.to_string())?;
        }
        for (b, &o) in input.iter().enumerate() {
            self.nodes[&o]
                .dp
                .store()
                .put_block(
                    INPUT_TABLE,
                    BlockId(b as u32),
                    BlockData::Input(Arc::new(input_block(BlockId(b as u32)))),
                )
                .map_err(|e| e.to_string())?;
        }
        let all = self
            .owners
            .assign([(MODEL_TABLE, model), (INPUT_TABLE, input)]);
        self.apply_everywhere(&all)?;
        for id in w {
            self.start_pushers(id);
        }
        self.log.push(format!(
            "setup: servers {s:?}, workers {:?}",
            self.role_ids(true)
        ));
        Ok(())
    }

    /// After everything: every key holds exactly what was acknowledged, read
    /// through every evaluator; every input block is intact.
    async fn check_final(&self) -> Res {
        let t = &self.tally;
        let keys: Vec<Key> = (0..KEYS).collect();
        for (id, n) in &self.nodes {
            let r = bounded("final read", n.dp.execute(get_op(&keys))).await?;
            let Ok(PeerResponse::Values(v)) = r else {
                return Err(format!("final read through evaluator {id} failed: {r:?}"));
            };
            for (k, val) in keys.iter().zip(v.iter()) {
                let ku = *k as usize;
                let (sum, cnt) = (
                    t.acked[ku].load(Ordering::SeqCst),
                    t.acked_n[ku].load(Ordering::SeqCst),
                );
                if t.issued[ku].load(Ordering::SeqCst) != sum {
                    return Err(format!("key {k}: pushes issued and acknowledged differ"));
                }
                if val != [sum as f32, cnt as f32] {
                    return Err(format!(
                        "key {k} read through evaluator {id} is [{}, {}]; pushes acknowledged: {cnt} adding up to {sum} ({})",
                        val[0],
                        val[1],
                        if val[1] < cnt as f32 {
                            "lost updates"
                        } else {
                            "duplicated updates"
                        }
                    ));
                }
            }
        }
        for (_, b, o) in self.owners.entries().filter(|e| e.0 == INPUT_TABLE) {
            let got = self.nodes[&o].dp.store().input_block(b);
            if got.as_deref() != Some(&input_block(b)) {
                return Err(format!(
                    "input block {b} on evaluator {o} is not the block loaded"
                ));
            }
        }
        let pushed: u64 = t.acked_n.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        if pushed == 0 {
            return Err("no push was acknowledged: the test tested nothing".into());
        }
        Ok(())
    }

    async fn finish(&mut self) -> Res {
        let ids: Vec<EvaluatorId> = self.nodes.keys().copied().collect();
        for id in ids {
            self.stop_pushers(id).await?;
        }
        Ok(())
    }

    async fn stop_all(&mut self) {
        for n in self.nodes.values() {
            n.dp.stop().await;
        }
        self.cancel.cancel();
    }
}

async fn run(sc: &Scenario) -> Res {
    let mut d = Driver::new(sc.seed);
    let t0 = Instant::now();
    let r = async {
        d.setup(sc.servers, sc.workers).await?;
        d.let_traffic_flow(20).await?;
        d.observe("after setup")?;
        for (i, s) in sc.steps.iter().enumerate() {
            d.step(s).await?;
            d.let_traffic_flow(20).await?;
            d.observe(&format!("after step {i}"))?;
            let v = d.tally.violations();
            if !v.is_empty() {
                return Err(format!("after step {i}: {}", v.join("\n")));
            }
        }
        d.finish().await?;
        let v = d.tally.violations();
        if !v.is_empty() {
            return Err(v.join("\n"));
        }
        d.observe("at the end")?;
        d.check_final().await
    }
    .await;
    d.stop_all().await;
    r.map_err(|e| {
        format!(
            "{e}\n-- what happened ({:?}):\n{}",
            t0.elapsed(),
            d.log.join("\n")
        )
    })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Random add / delete / switch / slow / move (some broken) under concurrent
/// pushes and reads: nothing lost, nothing applied twice, reads monotonic and
/// within bounds, one owner per block at every observation.
#[test]
fn reconfiguration_loses_and_duplicates_nothing() {
    let config = Config {
        cases: cases(),
        max_shrink_iters: 200,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&scenario(), |sc| {
        STATS.cases.fetch_add(1, Ordering::Relaxed);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(run(&sc));
        rt.shutdown_timeout(Duration::from_secs(5));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let s = &STATS;
    eprintln!(
        "{} cases: {} adds, {} deletes, {} switches, {} move steps ({} moves done, {} failed by injected faults), {} pushes, {} reads",
        get(&s.cases),
        get(&s.adds),
        get(&s.deletes),
        get(&s.switches),
        get(&s.move_steps),
        get(&s.moves_ok),
        get(&s.moves_failed),
        get(&s.pushes),
        get(&s.reads),
    );
    if get(&s.cases) >= 32 {
        // A test that never fails a move or never deletes proves nothing
        // about those paths.
        for (what, c) in [
            ("adds", &s.adds),
            ("deletes", &s.deletes),
            ("switches", &s.switches),
            ("completed moves", &s.moves_ok),
            ("failed moves", &s.moves_failed),
            ("reads", &s.reads),
        ] {
            assert!(get(c) > 0, "no {what} in {} cases", get(&s.cases));
        }
    }
}
