//! What a keyed operation is, how it is split into requests, and how it
//! is applied to a block held here.

use crate::protocol::{BlockId, Key, PeerRequest, PeerResponse, RemoteError, TableId, ValueBatch};

use super::{KeyedBlock, ModelFunctions, PartResult};

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

/// Most bytes of values one forwarded request carries (sent or answered).
/// Larger operations go as several requests, in order on the same
/// connection: the owner works on one while the previous answer is on the
/// wire and the one before is being decoded, and no buffer on the way is
/// larger than this.
pub const MAX_REQUEST_VALUE_BYTES: usize = 4 << 20;

/// Splits `positions` (of `op`, going to one owner) into runs of at most
/// [`MAX_REQUEST_VALUE_BYTES`] of values (read: `want` floats per key).
pub(super) fn split_positions(op: &StoreOp, positions: Vec<usize>, want: usize) -> Vec<Vec<usize>> {
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
pub(super) fn group_by_block(blocks: &[BlockId], nblocks: u32) -> (Vec<(BlockId, u32)>, Vec<u32>) {
    let n = blocks.len();
    let mut starts = Vec::new();
    let mut order = Vec::with_capacity(n);
    if (nblocks as usize) <= 4 * n + 16 {
        let mut next = vec![0u32; nblocks as usize + 1];
        for &b in blocks {
            next[b.index() + 1] += 1;
        }
        for b in 0..nblocks as usize {
            if next[b + 1] > 0 {
                starts.push((BlockId(b as u32), next[b]));
            }
            next[b + 1] += next[b];
        }
        order.resize(n, 0);
        for (p, &b) in blocks.iter().enumerate() {
            let at = &mut next[b.index()];
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
    starts.push((BlockId(nblocks), n as u32));
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
pub(super) fn apply_write(
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
        return Err(wrong_length(op.values.lens[p] as usize, want));
    }
    for &p in positions {
        let k = op.keys[p];
        let v = &op.values.data[offsets[p]..offsets[p] + want];
        write_value(model, block, op.kind, k, v);
    }
    Ok(PeerResponse::Done)
}

/// Writes one key's value: a put replaces it, an update applies `v` to it
/// through the model (from the model's initial value if the key is new).
#[inline]
fn write_value(
    model: &dyn ModelFunctions,
    block: &mut KeyedBlock,
    kind: OpKind,
    k: Key,
    v: &[f32],
) {
    if kind == OpKind::Put {
        block.values.insert(k, v.to_vec());
    } else {
        let cur = block.values.entry(k).or_insert_with(|| model.init(k));
        model.update(k, cur, v);
    }
}

/// The error of a written value whose length is not the table's.
fn wrong_length(len: usize, want: usize) -> RemoteError {
    RemoteError::fatal(format!(
        "value of length {len} for a table whose values have length {want}"
    ))
}

pub(super) fn apply(
    model: &dyn ModelFunctions,
    block: &mut KeyedBlock,
    op: &StoreOp,
) -> PartResult {
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
                    return Err(wrong_length(v.len(), want));
                }
            }
            for (&k, v) in op.keys.iter().zip(op.values.iter()) {
                write_value(model, block, op.kind, k, v);
            }
            Ok(PeerResponse::Done)
        }
    }
}
