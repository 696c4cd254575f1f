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
//! # Files
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the [`Store`], its slots and its view of the owners |
//! | `op.rs` | a keyed operation ([`StoreOp`]): splitting it into requests, applying it to a block |
//! | `submit.rs` | routing an operation ([`Store::submit`]) and assembling the answers |
//! | `block_move.rs` | a block move's slot changes on the source and the destination |
//! | `restore.rs` | a block restored from a checkpoint: its slot while it is read |
//! | `block.rs` | the block contents and their encoding for a move |

mod block;
mod block_move;
mod op;
mod restore;
mod submit;

pub use block::{BlockData, BlockDecoder, InputBlock, KeyedBlock, StateBlock};
pub use block_move::AbortOutcome;
pub use op::{MAX_REQUEST_VALUE_BYTES, OpKind, StoreOp, sub_op, value_offsets};
use op::{apply, apply_write, group_by_block, split_positions};
pub use submit::{Part, Pending, Submission, assemble};

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio::sync::oneshot;

use crate::protocol::{
    BlockId, EvaluatorId, INPUT_TABLE, Key, MODEL_TABLE, OwnershipUpdate, PeerResponse,
    RemoteError, STATE_TABLE, TableId,
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

impl StoreError {
    /// A block not in a state for `doing` ("cannot move", "recalling"):
    /// says which state it is in.
    fn not_while(table: TableId, block: BlockId, doing: &str, slot: &Slot) -> StoreError {
        StoreError::BadState {
            table,
            block,
            message: format!("{doing} a block that is {}", slot.name()),
        }
    }
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
    BlockId((x % u64::from(blocks.max(1))) as u32)
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

    /// The job's model functions, once configured.
    pub fn model_functions(&self) -> Option<Arc<dyn ModelFunctions>> {
        self.model().ok()
    }

    /// The length of every value of the keyed tables, once configured.
    pub fn value_len(&self) -> Option<usize> {
        self.model().ok().map(|m| m.value_len())
    }

    fn slot(t: &Table, table: TableId, block: BlockId) -> Result<&Mutex<Slot>, StoreError> {
        t.slots
            .get(block.index())
            .ok_or(StoreError::NoBlock { table, block })
    }

    /// Runs `f` on the slot of `block` of `table`, under the block's lock.
    fn with_slot<R>(
        &self,
        table: TableId,
        block: BlockId,
        f: impl FnOnce(&mut Slot) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let t = self.table(table)?;
        let mut slot = lock(Self::slot(&t, table, block)?);
        f(&mut slot)
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
                .and_then(|v| v.get_mut(block.index()))
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
            .and_then(|v| v.get(block.index()).copied().flatten())
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

    /// Makes this evaluator the owner of new, empty blocks.
    pub fn create_blocks(&self, table: TableId, blocks: &[BlockId]) -> Result<(), StoreError> {
        let t = self.table(table)?;
        for &b in blocks {
            let mut slot = lock(Self::slot(&t, table, b)?);
            if let Slot::Owned(_) | Slot::Incoming { .. } = &*slot {
                return Err(StoreError::not_while(table, b, "cannot create", &slot));
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
                return Err(StoreError::not_while(INPUT_TABLE, b, "cannot drop", &slot));
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
        self.with_slot(table, block, |slot| {
            if let Slot::Incoming { .. } = &*slot {
                return Err(StoreError::BadState {
                    table,
                    block,
                    message: "cannot overwrite a block that is arriving".into(),
                });
            }
            *slot = Slot::Owned(data);
            Ok(())
        })
    }

    /// The state of one block's slot here (for checks and tests; takes the
    /// block's lock briefly, nothing else).
    pub fn slot_kind(&self, table: TableId, block: BlockId) -> Result<SlotKind, StoreError> {
        self.with_slot(table, block, |slot| {
            Ok(match &*slot {
                Slot::Absent => SlotKind::Absent,
                Slot::Owned(_) => SlotKind::Owned,
                Slot::Incoming { .. } => SlotKind::Incoming,
                Slot::Forwarding {
                    in_flight: true, ..
                } => SlotKind::MovingOut,
                Slot::Forwarding { .. } => SlotKind::MovedAway,
            })
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
            .map(|(i, _)| BlockId(i as u32))
            .collect()
    }

    /// Whether this evaluator owns the block now.
    pub fn is_owned(&self, table: TableId, block: BlockId) -> bool {
        let Ok(t) = self.table(table) else {
            return false;
        };
        t.slots
            .get(block.index())
            .is_some_and(|s| matches!(&*lock(s), Slot::Owned(_)))
    }

    /// An input block owned here (shared, read-only).
    pub fn input_block(&self, block: BlockId) -> Option<Arc<InputBlock>> {
        let t = self.table(INPUT_TABLE).ok()?;
        let slot = lock(t.slots.get(block.index())?);
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
        let mut slot = lock(t.slots.get(block.index())?);
        match &mut *slot {
            Slot::Owned(BlockData::State(s)) => Some(f(s)),
            _ => None,
        }
    }

    /// Reads a whole keyed block owned here (for checks and evaluation).
    pub fn keyed_snapshot(&self, block: BlockId) -> Option<KeyedBlock> {
        let t = self.table(MODEL_TABLE).ok()?;
        let slot = lock(t.slots.get(block.index())?);
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
}

/// A model of one float per key that adds its deltas, for tests.
#[cfg(test)]
pub(crate) struct SumModel;

#[cfg(test)]
impl ModelFunctions for SumModel {
    fn value_len(&self) -> usize {
        1
    }
    fn init(&self, _key: Key) -> Vec<f32> {
        vec![0.0]
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        value[0] += delta[0];
    }
}

#[cfg(test)]
mod tests;
