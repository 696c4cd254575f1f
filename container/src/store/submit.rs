//! Routing an operation: [`Store::submit`] applies what it can here, queues
//! what targets a block in flight, and says what must go to other
//! evaluators; [`assemble`] puts the parts' answers together.

use std::collections::BTreeMap;
use std::ops::Range;

use tokio::sync::oneshot;

use crate::protocol::{BlockId, EvaluatorId, PeerResponse, RemoteError, TableId, ValueBatch};

use super::{
    BlockData, KeyedBlock, MAX_REQUEST_VALUE_BYTES, ModelFunctions, OpKind, PartResult, Queued,
    Slot, Store, StoreError, StoreOp, Table, apply_write, block_of_key, group_by_block, lock,
    split_positions, sub_op, value_offsets,
};

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
        /// Set only by [`Store::submit_ranges`]: `op`'s values are these
        /// of the submitted operation's `values.data`, not copied into `op`
        /// (whose `values.data` is empty; its `values.lens` are set).
        values: Option<Range<usize>>,
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
    if are_runs(&parts, keys) {
        return Ok(PeerResponse::Values(concatenate(parts, keys)));
    }
    gather(parts, keys).map(PeerResponse::Values)
}

/// Whether `parts` (sorted by first position) are values for consecutive
/// runs of positions that cover the `keys` positions of the operation.
fn are_runs(parts: &[(Vec<usize>, PeerResponse)], keys: usize) -> bool {
    let mut next = 0usize;
    let runs = parts.iter().all(|(positions, resp)| {
        let ok = matches!(resp, PeerResponse::Values(b) if b.len() == positions.len())
            && positions.iter().enumerate().all(|(i, &p)| p == next + i);
        next += positions.len();
        ok
    });
    runs && next == keys
}

/// The values of parts that are consecutive runs ([`are_runs`]), one after
/// the other.
fn concatenate(parts: Vec<(Vec<usize>, PeerResponse)>, keys: usize) -> ValueBatch {
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
    out
}

/// The values of parts whose positions interleave, put back in the order
/// of the operation's `keys` positions.
fn gather(parts: Vec<(Vec<usize>, PeerResponse)>, keys: usize) -> Result<ValueBatch, RemoteError> {
    let mut batches = Vec::with_capacity(parts.len());
    if parts
        .iter()
        .any(|(_, r)| !matches!(r, PeerResponse::Values(_)))
    {
        return Err(RemoteError::fatal("a read answered without values"));
    }
    // For each position: its part and its place in that part.
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
    Ok(out)
}

/// Refuses an update or write whose values do not match its keys.
fn check_values(op: &StoreOp) -> Result<(), StoreError> {
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
    Ok(())
}

/// The parts of one operation as [`Store::submit`] goes through its
/// blocks: what it applied or queued here, what it read here, and the
/// owners the rest goes to.
struct Placement<'a> {
    op: &'a StoreOp,
    /// Forwarded parts whose keys are a run of the operation's positions
    /// name their values as a range of `op.values.data` rather than carry
    /// a copy ([`Store::submit_ranges`]).
    by_range: bool,
    /// Floats per value in the table.
    want: usize,
    /// Where each key's value starts in `op.values` (writes only).
    offsets: Vec<usize>,
    /// Parts answered or queued here.
    parts: Vec<Part>,
    /// Writes applied here, answered as one part.
    written: Vec<usize>,
    /// Reads of blocks held here go straight into one buffer laid out like
    /// the answer (a pull served wholly here is then answered without
    /// reassembly); writes are applied from the operation as it is. The
    /// buffer is not cleared first: its capacity is written in place, the
    /// `want` values at `p * want` for each position `p` in
    /// `read_positions`, and its length stays 0 until [`Self::read_batch`].
    read: Option<Vec<f32>>,
    /// The positions read into `read`.
    read_positions: Vec<usize>,
    /// The owner each forwarded block goes to, in block order (the blocks
    /// are placed in block order).
    targets: Vec<(BlockId, EvaluatorId)>,
}

impl<'a> Placement<'a> {
    fn new(op: &'a StoreOp, want: usize, by_range: bool) -> Self {
        let offsets = if op.kind == OpKind::Get {
            Vec::new()
        } else {
            value_offsets(&op.values)
        };
        Placement {
            op,
            by_range,
            want,
            offsets,
            parts: Vec::new(),
            written: Vec::new(),
            read: None,
            read_positions: Vec::new(),
            targets: Vec::new(),
        }
    }

    /// Reads the keys at `positions` from `data` (block `block`, held
    /// here) into the answer's buffer, each initialised if new.
    fn read_here(
        &mut self,
        model: &dyn ModelFunctions,
        data: &mut KeyedBlock,
        block: BlockId,
        positions: impl Iterator<Item = usize>,
    ) -> Result<(), StoreError> {
        let (op, want) = (self.op, self.want);
        let out = self
            .read
            .get_or_insert_with(|| Vec::with_capacity(op.keys.len() * want))
            .spare_capacity_mut();
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
            let Some(to) = out.get_mut(p * want..(p + 1) * want) else {
                return Err(StoreError::BadOp(format!("key position {p} out of range")));
            };
            for (o, &x) in to.iter_mut().zip(v.iter()) {
                o.write(x);
            }
            self.read_positions.push(p);
        }
        Ok(())
    }

    /// Applies the writes at `positions` to `data` (held here).
    fn write_here(
        &mut self,
        model: &dyn ModelFunctions,
        data: &mut KeyedBlock,
        positions: Vec<usize>,
    ) {
        match apply_write(model, data, self.op, &positions, &self.offsets) {
            Ok(_) => self.written.extend_from_slice(&positions),
            Err(e) => self.parts.push(Part {
                positions,
                pending: Pending::Ready(Err(e)),
            }),
        }
    }

    /// Queues the keys at `positions` on a block that is arriving.
    fn queue(&mut self, queue: &mut Vec<Queued>, positions: Vec<usize>) {
        let (tx, rx) = oneshot::channel();
        queue.push(Queued {
            op: sub_op(self.op, &positions, &self.offsets),
            reply: tx,
        });
        self.parts.push(Part {
            positions,
            pending: Pending::Queued(rx),
        });
    }

    /// All the parts: those answered or queued here, the writes applied
    /// here, the read, and one request per owner of the blocks routed
    /// elsewhere (`block_of` is the block of each key).
    fn into_parts(mut self, block_of: &[BlockId]) -> Vec<Part> {
        let n = self.op.keys.len();
        if !self.written.is_empty() {
            self.written.sort_unstable();
            self.parts.push(Part {
                positions: std::mem::take(&mut self.written),
                pending: Pending::Ready(Ok(PeerResponse::Done)),
            });
        }
        if let Some(data) = self.read.take() {
            let (positions, batch) = self.read_batch(data, n);
            self.parts.push(Part {
                positions,
                pending: Pending::Ready(Ok(PeerResponse::Values(batch))),
            });
        }
        if !self.targets.is_empty() {
            self.forward(block_of);
        }
        self.parts
    }

    /// The values read here (`data`, see [`Self::read`]), as an answer for
    /// the positions read: the buffer as it is when every key was read here.
    fn read_batch(&mut self, mut data: Vec<f32>, n: usize) -> (Vec<usize>, ValueBatch) {
        let want = self.want;
        let mut read_positions = std::mem::take(&mut self.read_positions);
        let batch = if read_positions.len() == n {
            // SAFETY: `data`'s capacity is `n * want` and `read_here` wrote
            // the `want` values at `p * want` for every position in
            // `read_positions`; positions come from `group_by_block`, each
            // of `0..n` at most once, so `n` of them are all of `0..n` and
            // every value below `n * want` is initialised.
            unsafe { data.set_len(n * want) };
            read_positions = (0..n).collect();
            ValueBatch {
                lens: vec![want as u32; n],
                data,
            }
        } else {
            read_positions.sort_unstable();
            let written = data.spare_capacity_mut();
            let mut b = ValueBatch {
                lens: Vec::with_capacity(read_positions.len()),
                data: Vec::with_capacity(read_positions.len() * want),
            };
            for &p in &read_positions {
                let v = &written[p * want..(p + 1) * want];
                // SAFETY: `read_here` wrote these `want` values: `p` is in
                // `read_positions` (a `MaybeUninit<f32>` has the layout of
                // an `f32`).
                b.push(unsafe { &*(std::ptr::from_ref(v) as *const [f32]) });
            }
            b
        };
        (read_positions, batch)
    }

    /// One request per owner, with its keys in the operation's order (a
    /// pull served by one owner then needs no reassembly), split in pieces
    /// that fit a request.
    fn forward(&mut self, block_of: &[BlockId]) {
        let op = self.op;
        let mut per: BTreeMap<EvaluatorId, Vec<usize>> = BTreeMap::new();
        for (p, b) in block_of.iter().enumerate() {
            if let Ok(t) = self.targets.binary_search_by_key(b, |t| t.0) {
                per.entry(self.targets[t].1).or_default().push(p);
            }
        }
        for (to, positions) in per {
            for piece in split_positions(op, positions, self.want) {
                let (op, range) = match self.run_values(&piece) {
                    Some((run, range)) => (keys_of(op, run), Some(range)),
                    None => (sub_op(op, &piece, &self.offsets), None),
                };
                self.parts.push(Part {
                    positions: piece,
                    pending: Pending::Forward {
                        to,
                        op,
                        values: range,
                    },
                });
            }
        }
    }
}

impl Placement<'_> {
    /// When parts are forwarded by range and `positions` is a run of
    /// positions of a write: that run, and where their values lie in
    /// `op.values.data` (one after the other).
    fn run_values(&self, positions: &[usize]) -> Option<(Range<usize>, Range<usize>)> {
        let (&first, &last) = (positions.first()?, positions.last()?);
        let run = self.by_range
            && self.op.kind != OpKind::Get
            && last - first + 1 == positions.len()
            && positions.windows(2).all(|w| w[1] == w[0] + 1);
        run.then(|| {
            let end = self.offsets[last] + self.op.values.lens[last] as usize;
            (first..last + 1, self.offsets[first]..end)
        })
    }
}

/// The part of `op` at the run of positions `run` without its values'
/// data (only their lengths): they are forwarded as a range of
/// `op.values.data`.
fn keys_of(op: &StoreOp, run: Range<usize>) -> StoreOp {
    StoreOp {
        kind: op.kind,
        table: op.table,
        keys: op.keys[run.clone()].to_vec(),
        values: ValueBatch {
            lens: op.values.lens[run].to_vec(),
            data: Vec::new(),
        },
    }
}

impl Store {
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
        // one). Followed longer, it would send requests through an
        // evaluator that had passed the block on, one more hop each, and on
        // to it after it was released: an evaluator acknowledges an update
        // once the requests it routed before it are done, and these would
        // be routed after, so nothing would wait for them.
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
        self.submit_as(op, false)
    }

    /// [`Store::submit`], except that a forwarded part of a write whose
    /// keys are a run of the operation's positions carries no copy of its
    /// values: [`Pending::Forward`] names them as a range of
    /// `op.values.data`, for the caller to send from where they lie.
    pub fn submit_ranges(&self, op: &StoreOp) -> Result<Submission, StoreError> {
        self.submit_as(op, true)
    }

    fn submit_as(&self, op: &StoreOp, by_range: bool) -> Result<Submission, StoreError> {
        let t = self.table(op.table)?;
        if !t.keyed {
            return Err(StoreError::BadOp(format!(
                "table {} is not keyed; it is accessed by block",
                op.table
            )));
        }
        let model = self.model()?;
        check_values(op)?;
        let n = op.keys.len();
        let nblocks = t.slots.len() as u32;
        let want = model.value_len();
        if let Some(to) = self.one_remote_owner(&t, op, want)? {
            let (op, values) = if by_range && op.kind != OpKind::Get {
                (keys_of(op, 0..n), Some(0..op.values.data.len()))
            } else {
                (op.clone(), None)
            };
            return Ok(Submission {
                kind: op.kind,
                keys: n,
                parts: vec![Part {
                    positions: (0..n).collect(),
                    pending: Pending::Forward { to, op, values },
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
        let mut placed = Placement::new(op, want, by_range);
        for (block, positions) in groups {
            self.place(&t, &*model, &mut placed, block, positions)?;
        }
        Ok(Submission {
            kind: op.kind,
            keys: n,
            parts: placed.into_parts(&block_of),
        })
    }

    /// Places the keys at `positions`, all of `block`: read or written if
    /// the block is held here, queued if it is arriving, else routed to its
    /// owner (answered with a retryable error when that is unknown here).
    fn place(
        &self,
        t: &Table,
        model: &dyn ModelFunctions,
        placed: &mut Placement<'_>,
        block: BlockId,
        positions: impl Iterator<Item = usize>,
    ) -> Result<(), StoreError> {
        let op = placed.op;
        let mut slot = lock(Self::slot(t, op.table, block)?);
        let target = match &mut *slot {
            Slot::Owned(BlockData::Keyed(data)) => {
                if op.kind == OpKind::Get {
                    return placed.read_here(model, data, block, positions);
                }
                placed.write_here(model, data, positions.collect());
                return Ok(());
            }
            Slot::Owned(_) => {
                return Err(StoreError::BadState {
                    table: op.table,
                    block,
                    message: "holds block data, not keyed values".into(),
                });
            }
            Slot::Incoming { queue, .. } => {
                placed.queue(queue, positions.collect());
                return Ok(());
            }
            Slot::Forwarding { to, .. } => self.route(op.table, block, Some(*to)),
            Slot::Absent => self.route(op.table, block, None),
        };
        drop(slot);
        match target {
            Some(to) => placed.targets.push((block, to)),
            None => placed.parts.push(Part {
                positions: positions.collect(),
                pending: Pending::Ready(Err(RemoteError::retry(format!(
                    "block {block} of table {} is not on evaluator {} and its owner is unknown here",
                    op.table, self.inner.me
                )))),
            }),
        }
        Ok(())
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
            let (word, bit) = (block.index() / 64, 1u64 << (block.0 % 64));
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
}
