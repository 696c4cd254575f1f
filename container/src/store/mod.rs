//! The elastic store: tables split into blocks, each block with exactly one owner.
//!
//! This module owns the blocks an evaluator holds and its view of who owns the
//! others. It is synchronous and knows nothing of sockets: [`Store::submit`]
//! applies what it can locally, queues what targets a block in flight, and
//! says which parts must go to which other evaluator; the data plane
//! ([`crate::peer`]) sends those parts and assembles the answer.
//!
//! # Slots
//!
//! Every block of every table has a slot, guarded by its own mutex, so that an
//! operation waits only for the block it touches:
//!
//! | slot | meaning | an operation on it |
//! |---|---|---|
//! | `Absent` | never held here | goes to the owner in the ownership view |
//! | `Owned` | held here | applied at once |
//! | `Incoming` | handed over to us, data on its way | queued, applied on arrival |
//! | `Forwarding` | handed over to another evaluator | forwarded to it |
//!
//! # Moving a block (Cruise §IV-B2)
//!
//! Source `S`, destination `D`: `D` takes the block `Incoming` when asked
//! ([`Store::begin_incoming`]); `S` then takes the data out and turns its slot
//! `Forwarding` ([`Store::take_for_move`]) — from this instant every operation
//! that reaches `S` is forwarded to `D`, over the one ordered connection `S → D`,
//! where it is queued. When the data lands, `D` installs it, applies the queue in
//! arrival order and owns the block ([`Store::install`]). Each operation is
//! applied exactly once: before the handover on `S` (and so included in the
//! data) or after it on `D`.
//!
//! If the transfer fails, `S` cannot tell whether `D` installed the block just
//! before (the answer may be lost with the connection), so it does not simply
//! take the block back: it queues operations on it ([`Store::recall`]) and asks
//! `D` to call the move off ([`Store::abort_incoming`], under `D`'s block lock).
//! If `D` had not installed it, `D` answers what it queued with a retryable
//! error — nothing queued had been applied, so sending it again is safe — and
//! `S` owns the block again ([`Store::install`] of its own data, applying its
//! queue). If `D` had, the move took place: `S`'s queue goes to `D`. Either
//! way exactly one of them owns the block.

mod block;

pub use block::{BlockData, InputBlock, KeyedBlock, StateBlock};

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio::sync::oneshot;

use crate::protocol::{
    BlockId, EvaluatorId, INPUT_TABLE, Key, MODEL_TABLE, OwnershipUpdate, PeerRequest,
    PeerResponse, RemoteError, STATE_TABLE, TableId, ValueBatch,
};

/// Errors of the store.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The table does not exist (the job was not set up, or a bad id).
    #[error("no table {0}")]
    NoTable(TableId),
    /// The block id is out of range.
    #[error("table {table} has no block {block}")]
    NoBlock {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
    },
    /// A block is not in the state an operation needs.
    #[error("block {block} of table {table}: {message}")]
    BadState {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// What was expected and found.
        message: String,
    },
    /// An operation is malformed.
    #[error("bad operation: {0}")]
    BadOp(String),
    /// Encoded block data is corrupt.
    #[error("cannot decode block: {0}")]
    Decode(String),
}

/// The model's functions, supplied by the app.
pub trait ModelFunctions: Send + Sync {
    /// Values per key.
    fn value_len(&self) -> usize;
    /// The initial value of a key never written (deterministic in the key).
    fn init(&self, key: Key) -> Vec<f32>;
    /// The commutative update function: fold `delta` into `value`.
    fn update(&self, key: Key, value: &mut [f32], delta: &[f32]);
    /// Folds each of `deltas` into `value`, in order: what calling
    /// [`update`](Self::update) with each does, in one call (one dynamic
    /// dispatch for a worker applying several of its pushes to a key).
    fn update_all(&self, key: Key, value: &mut [f32], deltas: &[&[f32]]) {
        for d in deltas {
            self.update(key, value, d);
        }
    }
}

/// The kind of a keyed operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Read (pull).
    Get,
    /// Overwrite.
    Put,
    /// Apply a delta with the update function (push).
    Update,
}

/// A keyed operation on a table (several keys at once).
#[derive(Debug, Clone, PartialEq)]
pub struct StoreOp {
    /// What to do.
    pub kind: OpKind,
    /// The table (must be keyed).
    pub table: TableId,
    /// The keys.
    pub keys: Vec<Key>,
    /// One value or delta per key; empty for `Get`.
    pub values: ValueBatch,
}

impl StoreOp {
    /// The operation carried by a data-plane request, if it is one.
    pub fn from_request(req: PeerRequest) -> Option<StoreOp> {
        Some(match req {
            PeerRequest::Get { table, keys } => StoreOp {
                kind: OpKind::Get,
                table,
                keys,
                values: ValueBatch::default(),
            },
            PeerRequest::Put {
                table,
                keys,
                values,
            } => StoreOp {
                kind: OpKind::Put,
                table,
                keys,
                values,
            },
            PeerRequest::Update {
                table,
                keys,
                deltas,
            } => StoreOp {
                kind: OpKind::Update,
                table,
                keys,
                values: deltas,
            },
            _ => return None,
        })
    }

    /// The data-plane request that carries this operation.
    pub fn into_request(self) -> PeerRequest {
        match self.kind {
            OpKind::Get => PeerRequest::Get {
                table: self.table,
                keys: self.keys,
            },
            OpKind::Put => PeerRequest::Put {
                table: self.table,
                keys: self.keys,
                values: self.values,
            },
            OpKind::Update => PeerRequest::Update {
                table: self.table,
                keys: self.keys,
                deltas: self.values,
            },
        }
    }

    /// Bytes of values carried.
    pub fn byte_len(&self) -> usize {
        self.values.byte_len() + self.keys.len() * 8
    }
}

/// What one store holds for one block, as seen by [`Store::slot_kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Never held here.
    Absent,
    /// Held here: operations are applied.
    Owned,
    /// Handed over to this evaluator, data on its way: operations queue.
    Incoming,
    /// Being moved away: the data is in transit and may come back.
    MovingOut,
    /// Moved away: operations are forwarded to the new owner.
    MovedAway,
}

/// The answer of [`Store::abort_incoming`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortOutcome {
    /// The block was not installed here; the source owns it.
    Aborted,
    /// The block had already been installed here: the move took place.
    Installed,
}

/// The outcome of (part of) an operation.
pub type PartResult = Result<PeerResponse, RemoteError>;

struct Queued {
    op: StoreOp,
    reply: oneshot::Sender<PartResult>,
}

enum Slot {
    Absent,
    Owned(BlockData),
    Incoming {
        from: EvaluatorId,
        queue: Vec<Queued>,
    },
    Forwarding {
        to: EvaluatorId,
        /// The move is not finished: the source still has the data and may
        /// take the block back.
        in_flight: bool,
    },
}

impl Slot {
    fn name(&self) -> &'static str {
        match self {
            Slot::Absent => "absent",
            Slot::Owned(_) => "owned",
            Slot::Incoming { .. } => "incoming",
            Slot::Forwarding {
                in_flight: true, ..
            } => "moving out",
            Slot::Forwarding { .. } => "moved away",
        }
    }
}

struct Table {
    keyed: bool,
    slots: Vec<Mutex<Slot>>,
}

#[derive(Default)]
struct Ownership {
    version: u64,
    owners: BTreeMap<TableId, Vec<Option<EvaluatorId>>>,
}

/// Where one part of a submitted operation stands.
pub enum Pending {
    /// Applied here.
    Ready(PartResult),
    /// Queued on a block in flight; the answer comes when the block lands.
    Queued(oneshot::Receiver<PartResult>),
    /// Must be sent to another evaluator.
    Forward {
        /// The evaluator to send it to.
        to: EvaluatorId,
        /// The part of the operation it must apply.
        op: StoreOp,
    },
}

/// One part of a submitted operation: the positions (in the original key
/// list) it covers and where it stands.
pub struct Part {
    /// Positions of its keys in the original operation.
    pub positions: Vec<usize>,
    /// Where it stands.
    pub pending: Pending,
}

/// The result of [`Store::submit`]: the parts of an operation.
pub struct Submission {
    /// The operation's kind.
    pub kind: OpKind,
    /// Number of keys of the original operation.
    pub keys: usize,
    /// Its parts.
    pub parts: Vec<Part>,
}

/// Assembles part results (in the order of `parts`) into the answer to the
/// whole operation.
pub fn assemble(
    kind: OpKind,
    keys: usize,
    parts: Vec<(Vec<usize>, PeerResponse)>,
) -> Result<PeerResponse, RemoteError> {
    if kind != OpKind::Get {
        return Ok(PeerResponse::Done);
    }
    let mut parts = parts;
    if parts.len() == 1
        && parts[0].0.iter().enumerate().all(|(i, &p)| i == p)
        && let Some((_, resp)) = parts.pop()
    {
        return Ok(resp);
    }
    // Parts that are consecutive runs of positions (a large read split into
    // requests) are concatenated, one copy per part.
    parts.sort_by_key(|(positions, _)| positions.first().copied().unwrap_or(usize::MAX));
    let mut next = 0usize;
    let runs = parts.iter().all(|(positions, resp)| {
        let ok = matches!(resp, PeerResponse::Values(b) if b.len() == positions.len())
            && positions.iter().enumerate().all(|(i, &p)| p == next + i);
        next += positions.len();
        ok
    });
    if runs && next == keys {
        let total: usize = parts
            .iter()
            .map(|(_, r)| match r {
                PeerResponse::Values(b) => b.data.len(),
                _ => 0,
            })
            .sum();
        let mut out = ValueBatch {
            lens: Vec::with_capacity(keys),
            data: crate::os::vec_for_large(total),
        };
        for (_, resp) in parts {
            if let PeerResponse::Values(b) = resp {
                out.lens.extend_from_slice(&b.lens);
                out.data.extend_from_slice(&b.data);
            }
        }
        return Ok(PeerResponse::Values(out));
    }
    let mut batches = Vec::with_capacity(parts.len());
    if parts
        .iter()
        .any(|(_, r)| !matches!(r, PeerResponse::Values(_)))
    {
        return Err(RemoteError::fatal("a read answered without values"));
    }
    let mut at: Vec<(u32, u32)> = vec![(u32::MAX, 0); keys];
    for (pi, (positions, resp)) in parts.into_iter().enumerate() {
        let PeerResponse::Values(batch) = resp else {
            return Err(RemoteError::fatal("a read answered without values"));
        };
        if batch.len() != positions.len() {
            return Err(RemoteError::fatal(format!(
                "a read of {} keys answered {} values",
                positions.len(),
                batch.len()
            )));
        }
        for (j, &p) in positions.iter().enumerate() {
            at[p] = (pi as u32, j as u32);
        }
        let mut offs = Vec::with_capacity(batch.lens.len());
        let mut o = 0usize;
        for &l in &batch.lens {
            offs.push(o);
            o += l as usize;
        }
        batches.push((batch, offs));
    }
    let total: usize = batches.iter().map(|(b, _)| b.data.len()).sum();
    let mut out = ValueBatch {
        lens: Vec::with_capacity(keys),
        data: crate::os::vec_for_large(total),
    };
    for &(pi, j) in &at {
        let Some((b, offs)) = batches.get(pi as usize) else {
            return Err(RemoteError::fatal("a read left a key unanswered"));
        };
        let (o, l) = (offs[j as usize], b.lens[j as usize] as usize);
        out.push(&b.data[o..o + l]);
    }
    Ok(PeerResponse::Values(out))
}

/// The elastic store of one evaluator. Cheap to clone (shared).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    me: EvaluatorId,
    model: RwLock<Option<Arc<dyn ModelFunctions>>>,
    tables: RwLock<BTreeMap<TableId, Arc<Table>>>,
    ownership: RwLock<Ownership>,
    departed: RwLock<HashSet<EvaluatorId>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a slot cannot leave it half-updated (updates are
    // single assignments), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Maps a model key to its block: a fixed mix of the key bits, so that
/// neighbouring keys spread over blocks.
pub fn block_of_key(key: Key, blocks: u32) -> BlockId {
    let mut x = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x % u64::from(blocks.max(1))) as BlockId
}

impl Store {
    /// An empty store for evaluator `me`.
    pub fn new(me: EvaluatorId) -> Self {
        Store {
            inner: Arc::new(Inner {
                me,
                model: RwLock::new(None),
                tables: RwLock::new(BTreeMap::new()),
                ownership: RwLock::new(Ownership::default()),
                departed: RwLock::new(HashSet::new()),
            }),
        }
    }

    /// This evaluator's id.
    pub fn me(&self) -> EvaluatorId {
        self.inner.me
    }

    /// Creates the job's tables (all slots `Absent`) and sets the model functions.
    pub fn configure(&self, tables: &[(TableId, u32)], model: Arc<dyn ModelFunctions>) {
        let mut t = self.inner.tables.write().unwrap_or_else(|p| p.into_inner());
        let mut own = self
            .inner
            .ownership
            .write()
            .unwrap_or_else(|p| p.into_inner());
        for &(id, blocks) in tables {
            let slots = (0..blocks).map(|_| Mutex::new(Slot::Absent)).collect();
            t.insert(
                id,
                Arc::new(Table {
                    keyed: id == MODEL_TABLE,
                    slots,
                }),
            );
            own.owners.insert(id, vec![None; blocks as usize]);
        }
        *self.inner.model.write().unwrap_or_else(|p| p.into_inner()) = Some(model);
    }

    fn table(&self, id: TableId) -> Result<Arc<Table>, StoreError> {
        self.inner
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .ok_or(StoreError::NoTable(id))
    }

    fn model(&self) -> Result<Arc<dyn ModelFunctions>, StoreError> {
        self.inner
            .model
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(StoreError::NoTable(MODEL_TABLE))
    }

    fn slot(t: &Table, table: TableId, block: BlockId) -> Result<&Mutex<Slot>, StoreError> {
        t.slots
            .get(block as usize)
            .ok_or(StoreError::NoBlock { table, block })
    }

    /// Number of blocks of a table.
    pub fn blocks(&self, table: TableId) -> Result<u32, StoreError> {
        Ok(self.table(table)?.slots.len() as u32)
    }

    /// Applies an ownership update if it is newer than the view. Returns the
    /// view's version afterwards.
    pub fn apply_ownership(&self, u: &OwnershipUpdate) -> u64 {
        let mut own = self
            .inner
            .ownership
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if u.version <= own.version {
            return own.version;
        }
        for &(table, block, owner) in &u.owners {
            if let Some(slot) = own
                .owners
                .get_mut(&table)
                .and_then(|v| v.get_mut(block as usize))
            {
                *slot = Some(owner);
            }
        }
        own.version = u.version;
        own.version
    }

    /// The owner of a block in this evaluator's view.
    pub fn owner(&self, table: TableId, block: BlockId) -> Option<EvaluatorId> {
        self.inner
            .ownership
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .owners
            .get(&table)
            .and_then(|v| v.get(block as usize).copied().flatten())
    }

    /// How many evaluators own blocks of `table` in this evaluator's view
    /// (for the input table: the workers that hold input).
    pub fn owner_count(&self, table: TableId) -> usize {
        let own = self
            .inner
            .ownership
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<EvaluatorId> = own
            .owners
            .get(&table)
            .map(|v| v.iter().copied().flatten().collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// Version of the ownership view.
    pub fn ownership_version(&self) -> u64 {
        self.inner
            .ownership
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .version
    }

    /// Records the evaluators that have left the job: forwarding pointers to
    /// them are no longer followed.
    pub fn set_departed(&self, ids: impl IntoIterator<Item = EvaluatorId>) {
        let mut d = self
            .inner
            .departed
            .write()
            .unwrap_or_else(|p| p.into_inner());
        d.clear();
        d.extend(ids);
    }

    fn route(
        &self,
        table: TableId,
        block: BlockId,
        forward: Option<EvaluatorId>,
    ) -> Option<EvaluatorId> {
        // The view, once it names another owner, is newer than a pointer
        // left by a handover from here: the update naming this evaluator
        // was applied before the command that moved the block away, and the
        // one naming the block's next owner comes after. So the pointer is
        // followed only while the view still names this evaluator (or no
        // one). Followed longer, it sent requests through an evaluator
        // that had passed the block on, one more hop each, and on to it
        // after it was released: an evaluator acknowledges an update once
        // the requests it routed before it are done, and these were routed
        // after (a worker's pull cut off, 2026-11-26).
        match self.owner(table, block) {
            Some(o) if o != self.inner.me => Some(o),
            _ => forward.filter(|to| {
                !self
                    .inner
                    .departed
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(to)
            }),
        }
    }

    /// Submits a keyed operation: applies the parts whose blocks are here,
    /// queues the parts whose blocks are arriving, and returns the parts that
    /// must be forwarded. Synchronous, so that operations submitted one after
    /// the other (e.g. from one connection) are applied or forwarded in order.
    pub fn submit(&self, op: &StoreOp) -> Result<Submission, StoreError> {
        let t = self.table(op.table)?;
        if !t.keyed {
            return Err(StoreError::BadOp(format!(
                "table {} is not keyed; it is accessed by block",
                op.table
            )));
        }
        let model = self.model()?;
        if op.kind != OpKind::Get && op.values.len() != op.keys.len() {
            return Err(StoreError::BadOp(format!(
                "{} keys but {} values",
                op.keys.len(),
                op.values.len()
            )));
        }
        if op.kind != OpKind::Get
            && op.values.lens.iter().map(|&l| l as usize).sum::<usize>() != op.values.data.len()
        {
            return Err(StoreError::BadOp(
                "value lengths do not add up to the values given".into(),
            ));
        }
        let n = op.keys.len();
        let nblocks = t.slots.len() as u32;
        let want = model.value_len();
        if let Some(to) = self.one_remote_owner(&t, op, want)? {
            return Ok(Submission {
                kind: op.kind,
                keys: n,
                parts: vec![Part {
                    positions: (0..n).collect(),
                    pending: Pending::Forward { to, op: op.clone() },
                }],
            });
        }
        let block_of: Vec<BlockId> = op.keys.iter().map(|&k| block_of_key(k, nblocks)).collect();
        // Positions grouped by block (in block order), keeping key order
        // within a block.
        let (starts, order) = group_by_block(&block_of, nblocks);
        let groups = starts.windows(2).filter(|w| w[0].1 < w[1].1).map(|w| {
            (
                w[0].0,
                order[w[0].1 as usize..w[1].1 as usize]
                    .iter()
                    .map(|&p| p as usize),
            )
        });
        // Writes applied here, answered as one part.
        let mut written: Vec<usize> = Vec::new();
        let offsets = if op.kind == OpKind::Get {
            Vec::new()
        } else {
            value_offsets(&op.values)
        };
        let mut parts = Vec::new();
        // Reads of blocks held here go straight into one buffer laid out like
        // the answer (a pull served wholly here is then answered without
        // reassembly); writes are applied from the operation as it is.
        let mut read: Option<Vec<f32>> = None;
        let mut read_positions: Vec<usize> = Vec::new();
        // The owner each forwarded block goes to, in block order (the
        // groups come in block order).
        let mut targets: Vec<(BlockId, EvaluatorId)> = Vec::new();
        for (block, positions) in groups {
            let mut slot = lock(Self::slot(&t, op.table, block)?);
            let target = match &mut *slot {
                Slot::Owned(BlockData::Keyed(data)) => {
                    if op.kind == OpKind::Get {
                        let out = read.get_or_insert_with(|| vec![0.0; n * want]);
                        for p in positions {
                            let k = op.keys[p];
                            let v = data.values.entry(k).or_insert_with(|| model.init(k));
                            if v.len() != want {
                                return Err(StoreError::BadState {
                                    table: op.table,
                                    block,
                                    message: format!(
                                        "key {k} holds {} values; the table's values have {want}",
                                        v.len()
                                    ),
                                });
                            }
                            out[p * want..(p + 1) * want].copy_from_slice(v);
                            read_positions.push(p);
                        }
                    } else {
                        let positions: Vec<usize> = positions.collect();
                        match apply_write(&*model, data, op, &positions, &offsets) {
                            Ok(_) => written.extend_from_slice(&positions),
                            Err(e) => parts.push(Part {
                                positions,
                                pending: Pending::Ready(Err(e)),
                            }),
                        }
                    }
                    continue;
                }
                Slot::Owned(_) => {
                    return Err(StoreError::BadState {
                        table: op.table,
                        block,
                        message: "holds block data, not keyed values".into(),
                    });
                }
                Slot::Incoming { queue, .. } => {
                    let positions: Vec<usize> = positions.collect();
                    let (tx, rx) = oneshot::channel();
                    queue.push(Queued {
                        op: sub_op(op, &positions, &offsets),
                        reply: tx,
                    });
                    parts.push(Part {
                        positions,
                        pending: Pending::Queued(rx),
                    });
                    continue;
                }
                Slot::Forwarding { to, .. } => self.route(op.table, block, Some(*to)),
                Slot::Absent => self.route(op.table, block, None),
            };
            drop(slot);
            match target {
                Some(to) => {
                    targets.push((block, to));
                }
                None => parts.push(Part {
                    positions: positions.collect(),
                    pending: Pending::Ready(Err(RemoteError::retry(format!(
                        "block {block} of table {} is not on evaluator {} and its owner is unknown here",
                        op.table, self.inner.me
                    )))),
                }),
            }
        }
        if !written.is_empty() {
            written.sort_unstable();
            parts.push(Part {
                positions: written,
                pending: Pending::Ready(Ok(PeerResponse::Done)),
            });
        }
        if let Some(data) = read {
            let batch = if read_positions.len() == n {
                read_positions = (0..n).collect();
                ValueBatch {
                    lens: vec![want as u32; n],
                    data,
                }
            } else {
                read_positions.sort_unstable();
                let mut b = ValueBatch {
                    lens: Vec::with_capacity(read_positions.len()),
                    data: Vec::with_capacity(read_positions.len() * want),
                };
                for &p in &read_positions {
                    b.push(&data[p * want..(p + 1) * want]);
                }
                b
            };
            parts.push(Part {
                positions: read_positions,
                pending: Pending::Ready(Ok(PeerResponse::Values(batch))),
            });
        }
        if !targets.is_empty() {
            // One request per owner, with its keys in the operation's order
            // (a pull served by one owner then needs no reassembly).
            let mut per: BTreeMap<EvaluatorId, Vec<usize>> = BTreeMap::new();
            for (p, b) in block_of.iter().enumerate() {
                if let Ok(t) = targets.binary_search_by_key(b, |t| t.0) {
                    per.entry(targets[t].1).or_default().push(p);
                }
            }
            for (to, positions) in per {
                for piece in split_positions(op, positions, want) {
                    let op = sub_op(op, &piece, &offsets);
                    parts.push(Part {
                        positions: piece,
                        pending: Pending::Forward { to, op },
                    });
                }
            }
        }
        Ok(Submission {
            kind: op.kind,
            keys: n,
            parts,
        })
    }

    /// The fast path of [`Store::submit`]: the one other evaluator that
    /// every block of `op` is routed to, when none of them is held or
    /// arriving here and the request fits in one piece
    /// ([`MAX_REQUEST_VALUE_BYTES`]; a read of `want` floats per key);
    /// `None` sends `op` down the general
    /// path. Each distinct block's slot is looked at under its lock, as the
    /// general path does, and nothing is changed.
    ///
    /// Why: a worker's pull and push usually all go to one server. The
    /// general path groups their keys by block, routes each group and
    /// copies the values key by key into a request per owner: for MLR at
    /// B = 100 (251 keys of 40 floats) that is 13% of the worker thread's
    /// time under `perf`, where this is one pass over the keys and one copy
    /// of the operation.
    fn one_remote_owner(
        &self,
        t: &Table,
        op: &StoreOp,
        want: usize,
    ) -> Result<Option<EvaluatorId>, StoreError> {
        let nblocks = t.slots.len() as u32;
        let bytes = match op.kind {
            OpKind::Get => op.keys.len() * want * 4,
            _ => op.values.data.len() * 4,
        };
        if bytes > MAX_REQUEST_VALUE_BYTES || op.keys.is_empty() {
            return Ok(None);
        }
        let mut seen = vec![0u64; (nblocks as usize).div_ceil(64)];
        let mut owner = None;
        for &k in &op.keys {
            let block = block_of_key(k, nblocks);
            let (word, bit) = (block as usize / 64, 1u64 << (block % 64));
            if seen[word] & bit != 0 {
                continue;
            }
            seen[word] |= bit;
            let to = match &*lock(Self::slot(t, op.table, block)?) {
                Slot::Absent => self.route(op.table, block, None),
                Slot::Forwarding { to, .. } => self.route(op.table, block, Some(*to)),
                Slot::Owned(_) | Slot::Incoming { .. } => return Ok(None),
            };
            match (to, owner) {
                (None, _) => return Ok(None),
                (Some(to), None) => owner = Some(to),
                (Some(to), Some(o)) if to != o => return Ok(None),
                _ => {}
            }
        }
        Ok(owner)
    }

    /// Makes this evaluator the owner of new, empty blocks.
    pub fn create_blocks(&self, table: TableId, blocks: &[BlockId]) -> Result<(), StoreError> {
        let t = self.table(table)?;
        for &b in blocks {
            let mut slot = lock(Self::slot(&t, table, b)?);
            if let Slot::Owned(_) | Slot::Incoming { .. } = &*slot {
                return Err(StoreError::BadState {
                    table,
                    block: b,
                    message: format!("cannot create a block that is {}", slot.name()),
                });
            }
            *slot = Slot::Owned(match table {
                MODEL_TABLE => BlockData::Keyed(KeyedBlock::default()),
                INPUT_TABLE => BlockData::Input(Arc::new(InputBlock::new())),
                _ => BlockData::State(StateBlock::default()),
            });
        }
        Ok(())
    }

    /// Drops input blocks held here (a scale-in re-reads them at their new
    /// owner): their slots become absent. Refused, and nothing dropped, when
    /// one is not held here or has worker-local state (which the input does
    /// not hold, so it must move instead).
    pub fn drop_input(&self, blocks: &[BlockId]) -> Result<(), StoreError> {
        let input = self.table(INPUT_TABLE)?;
        for &b in blocks {
            let slot = lock(Self::slot(&input, INPUT_TABLE, b)?);
            if !matches!(&*slot, Slot::Owned(BlockData::Input(_))) {
                return Err(StoreError::BadState {
                    table: INPUT_TABLE,
                    block: b,
                    message: format!("cannot drop a block that is {}", slot.name()),
                });
            }
            if self.is_owned(STATE_TABLE, b) {
                return Err(StoreError::BadState {
                    table: STATE_TABLE,
                    block: b,
                    message: "the block has worker-local state: it must move, not be re-read"
                        .into(),
                });
            }
        }
        for &b in blocks {
            *lock(Self::slot(&input, INPUT_TABLE, b)?) = Slot::Absent;
        }
        Ok(())
    }

    /// Stores a block's data (loaded input, new state) as owned here.
    pub fn put_block(
        &self,
        table: TableId,
        block: BlockId,
        data: BlockData,
    ) -> Result<(), StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        if let Slot::Incoming { .. } = &*slot {
            return Err(StoreError::BadState {
                table,
                block,
                message: "cannot overwrite a block that is arriving".into(),
            });
        }
        *slot = Slot::Owned(data);
        Ok(())
    }

    /// The state of one block's slot here (for checks and tests; takes the
    /// block's lock briefly, nothing else).
    pub fn slot_kind(&self, table: TableId, block: BlockId) -> Result<SlotKind, StoreError> {
        let t = self.table(table)?;
        let slot = lock(Self::slot(&t, table, block)?);
        Ok(match &*slot {
            Slot::Absent => SlotKind::Absent,
            Slot::Owned(_) => SlotKind::Owned,
            Slot::Incoming { .. } => SlotKind::Incoming,
            Slot::Forwarding {
                in_flight: true, ..
            } => SlotKind::MovingOut,
            Slot::Forwarding { .. } => SlotKind::MovedAway,
        })
    }

    /// Blocks of a table owned here, in order.
    pub fn local_blocks(&self, table: TableId) -> Vec<BlockId> {
        let Ok(t) = self.table(table) else {
            return Vec::new();
        };
        t.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(&*lock(s), Slot::Owned(_)))
            .map(|(i, _)| i as BlockId)
            .collect()
    }

    /// Whether this evaluator owns the block now.
    pub fn is_owned(&self, table: TableId, block: BlockId) -> bool {
        let Ok(t) = self.table(table) else {
            return false;
        };
        t.slots
            .get(block as usize)
            .is_some_and(|s| matches!(&*lock(s), Slot::Owned(_)))
    }

    /// An input block owned here (shared, read-only).
    pub fn input_block(&self, block: BlockId) -> Option<Arc<InputBlock>> {
        let t = self.table(INPUT_TABLE).ok()?;
        let slot = lock(t.slots.get(block as usize)?);
        match &*slot {
            Slot::Owned(BlockData::Input(b)) => Some(Arc::clone(b)),
            _ => None,
        }
    }

    /// Runs `f` on a state block owned here, holding the block for the
    /// duration (a move of the block waits until `f` returns). `None` if the
    /// block is not here (e.g. it was just moved away).
    pub fn with_state<R>(&self, block: BlockId, f: impl FnOnce(&mut StateBlock) -> R) -> Option<R> {
        let t = self.table(STATE_TABLE).ok()?;
        let mut slot = lock(t.slots.get(block as usize)?);
        match &mut *slot {
            Slot::Owned(BlockData::State(s)) => Some(f(s)),
            _ => None,
        }
    }

    /// Reads a whole keyed block owned here (for checks and evaluation).
    pub fn keyed_snapshot(&self, block: BlockId) -> Option<KeyedBlock> {
        let t = self.table(MODEL_TABLE).ok()?;
        let slot = lock(t.slots.get(block as usize)?);
        match &*slot {
            Slot::Owned(BlockData::Keyed(b)) => Some(b.clone()),
            _ => None,
        }
    }

    /// Bytes held in owned blocks.
    pub fn bytes_held(&self) -> u64 {
        let tables: Vec<Arc<Table>> = self
            .inner
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut n = 0u64;
        for t in tables {
            for s in &t.slots {
                if let Slot::Owned(d) = &*lock(s) {
                    n += d.byte_size() as u64;
                }
            }
        }
        n
    }

    // ----- migration, destination side -----

    /// Destination: takes the block `Incoming` (operations on it queue until
    /// [`Store::install`]).
    pub fn begin_incoming(
        &self,
        table: TableId,
        block: BlockId,
        from: EvaluatorId,
    ) -> Result<(), StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        match &*slot {
            Slot::Absent
            | Slot::Forwarding {
                in_flight: false, ..
            } => {
                *slot = Slot::Incoming {
                    from,
                    queue: Vec::new(),
                };
                Ok(())
            }
            other => Err(StoreError::BadState {
                table,
                block,
                message: format!("cannot receive a block that is {}", other.name()),
            }),
        }
    }

    /// Destination: the source asks to call the move off (its transfer
    /// failed). Under the block's lock, one of:
    /// - still `Incoming`: answers every queued operation with a retryable
    ///   error (none was applied), forwards later operations to the source,
    ///   and returns [`AbortOutcome::Aborted`];
    /// - `Owned`: the data had already landed (the source lost the answer
    ///   with its connection): nothing changes, [`AbortOutcome::Installed`]
    ///   tells the source that the move took place;
    /// - `Absent` or moved away: the handover never arrived or was already
    ///   called off (the request is idempotent): [`AbortOutcome::Aborted`].
    ///
    /// A source that [recalled](Store::recall) a block uses this too, when the
    /// destination answers `Installed`: its queue goes to the destination.
    pub fn abort_incoming(
        &self,
        table: TableId,
        block: BlockId,
    ) -> Result<AbortOutcome, StoreError> {
        let t = self.table(table)?;
        let queue = {
            let mut slot = lock(Self::slot(&t, table, block)?);
            let from = match &*slot {
                Slot::Incoming { from, .. } => *from,
                Slot::Owned(_) => return Ok(AbortOutcome::Installed),
                Slot::Absent
                | Slot::Forwarding {
                    in_flight: false, ..
                } => return Ok(AbortOutcome::Aborted),
                other => {
                    return Err(StoreError::BadState {
                        table,
                        block,
                        message: format!("cannot abort receiving a block that is {}", other.name()),
                    });
                }
            };
            match std::mem::replace(
                &mut *slot,
                Slot::Forwarding {
                    to: from,
                    in_flight: false,
                },
            ) {
                Slot::Incoming { queue, .. } => queue,
                _ => Vec::new(),
            }
        };
        for q in queue {
            let _ = q.reply.send(Err(RemoteError::retry(format!(
                "the move of block {block} of table {table} was called off; send again"
            ))));
        }
        Ok(AbortOutcome::Aborted)
    }

    /// Destination: the data arrived. Applies the queued operations in order
    /// and owns the block.
    pub fn install(
        &self,
        table: TableId,
        block: BlockId,
        mut data: BlockData,
    ) -> Result<(), StoreError> {
        let t = self.table(table)?;
        let model = if t.keyed { Some(self.model()?) } else { None };
        let replies = {
            let mut slot = lock(Self::slot(&t, table, block)?);
            if !matches!(&*slot, Slot::Incoming { .. }) {
                return Err(StoreError::BadState {
                    table,
                    block,
                    message: format!("data arrived for a block that is {}", slot.name()),
                });
            }
            let Slot::Incoming { queue, .. } = std::mem::replace(&mut *slot, Slot::Absent) else {
                return Err(StoreError::BadState {
                    table,
                    block,
                    message: "changed while installing".into(),
                });
            };
            let mut replies = Vec::with_capacity(queue.len());
            for q in queue {
                let r = match (&mut data, &model) {
                    (BlockData::Keyed(kb), Some(m)) => apply(&**m, kb, &q.op),
                    _ => Err(RemoteError::fatal(format!(
                        "table {table} is not keyed; keyed operation rejected"
                    ))),
                };
                replies.push((q.reply, r));
            }
            *slot = Slot::Owned(data);
            replies
        };
        for (tx, r) in replies {
            let _ = tx.send(r);
        }
        Ok(())
    }

    // ----- migration, source side -----

    /// Source: hands the block over to `to` (from now on operations are
    /// forwarded there) and returns its data to stream. The caller must end
    /// with [`Store::finish_move`] or [`Store::restore`].
    pub fn take_for_move(
        &self,
        table: TableId,
        block: BlockId,
        to: EvaluatorId,
    ) -> Result<BlockData, StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        if !matches!(&*slot, Slot::Owned(_)) {
            return Err(StoreError::BadState {
                table,
                block,
                message: format!("cannot move a block that is {}", slot.name()),
            });
        }
        match std::mem::replace(
            &mut *slot,
            Slot::Forwarding {
                to,
                in_flight: true,
            },
        ) {
            Slot::Owned(d) => Ok(d),
            _ => Err(StoreError::BadState {
                table,
                block,
                message: "changed while handing over".into(),
            }),
        }
    }

    /// Source: the transfer failed without telling whether the destination
    /// installed the block (its answer may have been lost with the
    /// connection). Takes the block `Incoming` here, so operations on it
    /// queue, until the destination says: not installed → [`Store::install`]
    /// the data kept for the move (this evaluator owns the block again and
    /// applies the queue); installed → [`Store::abort_incoming`] (the queue
    /// is answered retryably and later operations are forwarded to the
    /// destination).
    pub fn recall(&self, table: TableId, block: BlockId) -> Result<(), StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        match &*slot {
            Slot::Forwarding {
                to,
                in_flight: true,
            } => {
                *slot = Slot::Incoming {
                    from: *to,
                    queue: Vec::new(),
                };
                Ok(())
            }
            other => Err(StoreError::BadState {
                table,
                block,
                message: format!("recalling a block that is {}", other.name()),
            }),
        }
    }

    /// Source: the destination installed the block.
    pub fn finish_move(&self, table: TableId, block: BlockId) -> Result<(), StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        match &mut *slot {
            Slot::Forwarding { in_flight, .. } => {
                *in_flight = false;
                Ok(())
            }
            other => Err(StoreError::BadState {
                table,
                block,
                message: format!("finishing a move of a block that is {}", other.name()),
            }),
        }
    }

    /// Source: the move failed; own the block again with its data.
    pub fn restore(
        &self,
        table: TableId,
        block: BlockId,
        data: BlockData,
    ) -> Result<(), StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        match &*slot {
            Slot::Forwarding {
                in_flight: true, ..
            } => {
                *slot = Slot::Owned(data);
                Ok(())
            }
            other => Err(StoreError::BadState {
                table,
                block,
                message: format!("restoring a block that is {}", other.name()),
            }),
        }
    }
}

/// Most bytes of values one forwarded request carries (sent or answered).
/// Larger operations go as several requests, in order on the same
/// connection: the owner works on one while the previous answer is on the
/// wire and the one before is being decoded, and no buffer on the way is
/// larger than this.
pub const MAX_REQUEST_VALUE_BYTES: usize = 4 << 20;

/// Splits `positions` (of `op`, going to one owner) into runs of at most
/// [`MAX_REQUEST_VALUE_BYTES`] of values (read: `want` floats per key).
fn split_positions(op: &StoreOp, positions: Vec<usize>, want: usize) -> Vec<Vec<usize>> {
    let bytes_of = |p: usize| {
        4 * if op.kind == OpKind::Get {
            want
        } else {
            op.values.lens[p] as usize
        }
    };
    let total: usize = positions.iter().map(|&p| bytes_of(p)).sum();
    if total <= MAX_REQUEST_VALUE_BYTES {
        return vec![positions];
    }
    let mut out = Vec::with_capacity(total / MAX_REQUEST_VALUE_BYTES + 1);
    let mut cur = Vec::new();
    let mut cur_bytes = 0;
    for p in positions {
        let b = bytes_of(p);
        if !cur.is_empty() && cur_bytes + b > MAX_REQUEST_VALUE_BYTES {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(p);
        cur_bytes += b;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Start of each value in `v.data`.
pub fn value_offsets(v: &ValueBatch) -> Vec<usize> {
    let mut offs = Vec::with_capacity(v.lens.len());
    let mut o = 0;
    for &l in &v.lens {
        offs.push(o);
        o += l as usize;
    }
    offs
}

/// Positions `0..blocks.len()` grouped by their block, in block order and
/// in position order within a block: returns `(block, start)` of each group
/// that has positions, then an end marker `(blocks, len)`, and the
/// positions. A counting sort when the blocks are few for the positions (a
/// pull of a mini-batch: hundreds of keys over tens of blocks), a sort
/// otherwise.
fn group_by_block(blocks: &[BlockId], nblocks: u32) -> (Vec<(BlockId, u32)>, Vec<u32>) {
    let n = blocks.len();
    let mut starts = Vec::new();
    let mut order = Vec::with_capacity(n);
    if (nblocks as usize) <= 4 * n + 16 {
        let mut next = vec![0u32; nblocks as usize + 1];
        for &b in blocks {
            next[b as usize + 1] += 1;
        }
        for b in 0..nblocks as usize {
            if next[b + 1] > 0 {
                starts.push((b as BlockId, next[b]));
            }
            next[b + 1] += next[b];
        }
        order.resize(n, 0);
        for (p, &b) in blocks.iter().enumerate() {
            let at = &mut next[b as usize];
            order[*at as usize] = p as u32;
            *at += 1;
        }
    } else {
        let mut by_block: Vec<(BlockId, u32)> = blocks
            .iter()
            .enumerate()
            .map(|(p, &b)| (b, p as u32))
            .collect();
        by_block.sort_unstable();
        for (i, &(b, p)) in by_block.iter().enumerate() {
            if i == 0 || by_block[i - 1].0 != b {
                starts.push((b, i as u32));
            }
            order.push(p);
        }
    }
    starts.push((nblocks, n as u32));
    (starts, order)
}

/// The part of `op` at `positions` (in that order); `offsets` from [`value_offsets`].
pub fn sub_op(op: &StoreOp, positions: &[usize], offsets: &[usize]) -> StoreOp {
    let keys = positions.iter().map(|&p| op.keys[p]).collect();
    let mut values = ValueBatch::default();
    if op.kind != OpKind::Get {
        let total = positions.iter().map(|&p| op.values.lens[p] as usize).sum();
        values.lens.reserve_exact(positions.len());
        values.data.reserve_exact(total);
        for &p in positions {
            let (o, l) = (offsets[p], op.values.lens[p] as usize);
            values.push(&op.values.data[o..o + l]);
        }
    }
    StoreOp {
        kind: op.kind,
        table: op.table,
        keys,
        values,
    }
}

/// Applies the writes of `op` at `positions` to a block held here; every
/// value's length is checked before anything is applied.
fn apply_write(
    model: &dyn ModelFunctions,
    block: &mut KeyedBlock,
    op: &StoreOp,
    positions: &[usize],
    offsets: &[usize],
) -> PartResult {
    let want = model.value_len();
    if let Some(&p) = positions
        .iter()
        .find(|&&p| op.values.lens[p] as usize != want)
    {
        return Err(RemoteError::fatal(format!(
            "value of length {} for a table whose values have length {want}",
            op.values.lens[p]
        )));
    }
    for &p in positions {
        let k = op.keys[p];
        let v = &op.values.data[offsets[p]..offsets[p] + want];
        if op.kind == OpKind::Put {
            block.values.insert(k, v.to_vec());
        } else {
            let cur = block.values.entry(k).or_insert_with(|| model.init(k));
            model.update(k, cur, v);
        }
    }
    Ok(PeerResponse::Done)
}

fn apply(model: &dyn ModelFunctions, block: &mut KeyedBlock, op: &StoreOp) -> PartResult {
    let want = model.value_len();
    match op.kind {
        OpKind::Get => {
            let mut out = ValueBatch {
                lens: Vec::with_capacity(op.keys.len()),
                data: Vec::with_capacity(op.keys.len() * want),
            };
            for &k in &op.keys {
                let v = block.values.entry(k).or_insert_with(|| model.init(k));
                out.push(v);
            }
            Ok(PeerResponse::Values(out))
        }
        OpKind::Put | OpKind::Update => {
            for (v, _) in op.values.iter().zip(&op.keys) {
                if v.len() != want {
                    return Err(RemoteError::fatal(format!(
                        "value of length {} for a table whose values have length {want}",
                        v.len()
                    )));
                }
            }
            for (&k, v) in op.keys.iter().zip(op.values.iter()) {
                if op.kind == OpKind::Put {
                    block.values.insert(k, v.to_vec());
                } else {
                    let cur = block.values.entry(k).or_insert_with(|| model.init(k));
                    model.update(k, cur, v);
                }
            }
            Ok(PeerResponse::Done)
        }
    }
}

#[cfg(test)]
mod tests;
