//! Block contents and their encoding for migration.
//!
//! Three kinds of block, one per kind of table:
//! - [`KeyedBlock`]: model values, `key → Vec<f32>`, updated with the app's
//!   update function;
//! - [`InputBlock`]: immutable training records in compressed-sparse-row form
//!   (a label or id per record and `(index, value)` pairs);
//! - [`StateBlock`]: a worker's mutable per-block state (e.g. NMF row factors,
//!   LDA assignments), as flat arrays the app interprets.
//!
//! # Encoding
//!
//! A block travels as `kind: u8` followed by little-endian fields; arrays are
//! `len: u64` then the raw elements, so encoding large blocks is a few memcpys.

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::{Key, le_bytes_to_f32s};

use super::StoreError;

/// Model values of one block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyedBlock {
    /// The values by key.
    pub values: HashMap<Key, Vec<f32>>,
}

impl KeyedBlock {
    /// Bytes of values held.
    pub fn byte_size(&self) -> usize {
        self.values.values().map(|v| v.len() * 4 + 8).sum()
    }
}

/// Training records of one input block, in compressed-sparse-row form.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputBlock {
    /// Per record: the label (classification), target (regression) or row id.
    pub labels: Vec<f32>,
    /// Per record `r`, its entries are `offsets[r]..offsets[r + 1]`; `len = records + 1`.
    pub offsets: Vec<u32>,
    /// Entry indices (feature, column or word).
    pub indices: Vec<u32>,
    /// Entry values.
    pub values: Vec<f32>,
}

impl InputBlock {
    /// An empty block.
    pub fn new() -> Self {
        InputBlock {
            offsets: vec![0],
            ..Default::default()
        }
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Appends a record.
    pub fn push(&mut self, label: f32, entries: impl IntoIterator<Item = (u32, f32)>) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        for (i, v) in entries {
            self.indices.push(i);
            self.values.push(v);
        }
        self.labels.push(label);
        self.offsets.push(self.indices.len() as u32);
    }

    /// Record `r`: its label and entries.
    pub fn record(&self, r: usize) -> (f32, &[u32], &[f32]) {
        let a = self.offsets[r] as usize;
        let b = self.offsets[r + 1] as usize;
        (self.labels[r], &self.indices[a..b], &self.values[a..b])
    }

    /// Bytes held.
    pub fn byte_size(&self) -> usize {
        (self.labels.len() + self.offsets.len() + self.indices.len() + self.values.len()) * 4
    }
}

/// A worker's mutable state for one input block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateBlock {
    /// Float state (e.g. NMF row factors).
    pub floats: Vec<f32>,
    /// Integer state (e.g. LDA topic assignments and counts).
    pub ints: Vec<u32>,
}

impl StateBlock {
    /// Bytes held.
    pub fn byte_size(&self) -> usize {
        (self.floats.len() + self.ints.len()) * 4
    }
}

/// The contents of a block.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockData {
    /// Model values.
    Keyed(KeyedBlock),
    /// Input records (shared read-only with the worker loop).
    Input(Arc<InputBlock>),
    /// Worker state.
    State(StateBlock),
}

const KIND_KEYED: u8 = 1;
const KIND_INPUT: u8 = 2;
const KIND_STATE: u8 = 3;

impl BlockData {
    /// Bytes held (approximately, for metrics and cost estimates).
    pub fn byte_size(&self) -> usize {
        match self {
            BlockData::Keyed(b) => b.byte_size(),
            BlockData::Input(b) => b.byte_size(),
            BlockData::State(b) => b.byte_size(),
        }
    }

    /// Encodes the block for a move.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.byte_size() + 64);
        match self {
            BlockData::Keyed(b) => {
                out.push(KIND_KEYED);
                out.extend_from_slice(&(b.values.len() as u64).to_le_bytes());
                // A stable order makes encodings comparable in tests.
                let mut keys: Vec<&Key> = b.values.keys().collect();
                keys.sort_unstable();
                for k in keys {
                    out.extend_from_slice(&k.to_le_bytes());
                    put_f32s(&mut out, &b.values[k]);
                }
            }
            BlockData::Input(b) => {
                out.push(KIND_INPUT);
                put_f32s(&mut out, &b.labels);
                put_u32s(&mut out, &b.offsets);
                put_u32s(&mut out, &b.indices);
                put_f32s(&mut out, &b.values);
            }
            BlockData::State(b) => {
                out.push(KIND_STATE);
                put_f32s(&mut out, &b.floats);
                put_u32s(&mut out, &b.ints);
            }
        }
        out
    }

    /// Decodes a block encoded by [`BlockData::encode`].
    pub fn decode(bytes: &[u8]) -> Result<BlockData, StoreError> {
        let mut r = Reader { b: bytes, pos: 0 };
        let kind = r.u8()?;
        let data = match kind {
            KIND_KEYED => {
                let n = r.u64()?;
                let mut values = HashMap::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    let k = r.u64()?;
                    values.insert(k, r.f32s()?);
                }
                BlockData::Keyed(KeyedBlock { values })
            }
            KIND_INPUT => {
                let b = InputBlock {
                    labels: r.f32s()?,
                    offsets: r.u32s()?,
                    indices: r.u32s()?,
                    values: r.f32s()?,
                };
                let consistent = b.offsets.len() == b.labels.len() + 1
                    && b.indices.len() == b.values.len()
                    && b.offsets.last().copied() == Some(b.indices.len() as u32)
                    && b.offsets.windows(2).all(|w| w[0] <= w[1]);
                if !consistent {
                    return Err(StoreError::Decode(
                        "input block arrays are inconsistent".into(),
                    ));
                }
                BlockData::Input(Arc::new(b))
            }
            KIND_STATE => BlockData::State(StateBlock {
                floats: r.f32s()?,
                ints: r.u32s()?,
            }),
            k => return Err(StoreError::Decode(format!("unknown block kind {k}"))),
        };
        if r.pos != bytes.len() {
            return Err(StoreError::Decode(format!(
                "{} trailing bytes after block",
                bytes.len() - r.pos
            )));
        }
        Ok(data)
    }
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend_from_slice(&crate::protocol::f32s_to_le_bytes(v));
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(v));
    } else {
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| StoreError::Decode("block data truncated".into()))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    fn len4(&mut self) -> Result<usize, StoreError> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| StoreError::Decode("array length overflows".into()))
    }

    fn f32s(&mut self) -> Result<Vec<f32>, StoreError> {
        let n = self.len4()?;
        Ok(le_bytes_to_f32s(self.take(n)?))
    }

    fn u32s(&mut self) -> Result<Vec<u32>, StoreError> {
        let n = self.len4()?;
        let s = self.take(n)?;
        Ok(if cfg!(target_endian = "little") {
            bytemuck::pod_collect_to_vec(s)
        } else {
            s.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_block() -> impl Strategy<Value = BlockData> {
        prop_oneof![
            prop::collection::hash_map(
                any::<u64>(),
                prop::collection::vec(-1e6f32..1e6, 0..8),
                0..20
            )
            .prop_map(|values| BlockData::Keyed(KeyedBlock { values })),
            prop::collection::vec(
                (
                    any::<u8>(),
                    prop::collection::vec((any::<u32>(), -10f32..10.0), 0..6)
                ),
                0..20
            )
            .prop_map(|rows| {
                let mut b = InputBlock::new();
                for (l, e) in rows {
                    b.push(f32::from(l), e);
                }
                BlockData::Input(Arc::new(b))
            }),
            (
                prop::collection::vec(-1f32..1.0, 0..30),
                prop::collection::vec(any::<u32>(), 0..30)
            )
                .prop_map(|(floats, ints)| BlockData::State(StateBlock { floats, ints })),
        ]
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(b in arb_block()) {
            let bytes = b.encode();
            prop_assert_eq!(BlockData::decode(&bytes).unwrap(), b);
        }

        #[test]
        fn truncated_blocks_are_errors(b in arb_block(), cut in any::<prop::sample::Index>()) {
            let bytes = b.encode();
            let n = cut.index(bytes.len());
            prop_assert!(BlockData::decode(&bytes[..n]).is_err());
        }
    }
}
