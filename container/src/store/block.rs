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

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::Key;

use super::StoreError;

/// Hashes model keys (`u64`s chosen by the apps, never by a peer one
/// does not trust) with one multiply and a shift: a server looks keys up
/// for every pull and push, and SipHash's resistance to chosen keys costs
/// several times more (3% of a server's time in an MLR profile) for nothing
/// here.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        // Fibonacci hashing: the high bits of the product mix every key bit.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 ^= k;
    }
}

/// Model values by key, hashed with [`KeyHasher`].
pub type KeyMap = HashMap<Key, Vec<f32>, std::hash::BuildHasherDefault<KeyHasher>>;

/// Model values of one block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyedBlock {
    /// The values by key.
    pub values: KeyMap,
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

    /// Bytes of [`BlockData::encode`], without encoding.
    pub fn encoded_len(&self) -> usize {
        match self {
            BlockData::Keyed(b) => 9 + b.values.values().map(|v| 16 + 4 * v.len()).sum::<usize>(),
            BlockData::Input(b) => 33 + b.byte_size(),
            BlockData::State(b) => 17 + b.byte_size(),
        }
    }

    /// Encodes the block for a move.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_chunks(usize::MAX).concat()
    }

    /// Encodes the block as pieces of at most `chunk` bytes (the last may be
    /// shorter), written straight into them: a move sends each piece as one
    /// frame without copying the block whole first.
    pub fn encode_chunks(&self, chunk: usize) -> Vec<Vec<u8>> {
        let mut w = ChunkWriter::new(chunk.max(1), self.byte_size() + 64);
        match self {
            BlockData::Keyed(b) => {
                w.put(&[KIND_KEYED]);
                w.put(&(b.values.len() as u64).to_le_bytes());
                // A stable order makes encodings comparable in tests.
                let mut keys: Vec<&Key> = b.values.keys().collect();
                keys.sort_unstable();
                for k in keys {
                    w.put(&k.to_le_bytes());
                    put_f32s(&mut w, &b.values[k]);
                }
            }
            BlockData::Input(b) => {
                w.put(&[KIND_INPUT]);
                put_f32s(&mut w, &b.labels);
                put_u32s(&mut w, &b.offsets);
                put_u32s(&mut w, &b.indices);
                put_f32s(&mut w, &b.values);
            }
            BlockData::State(b) => {
                w.put(&[KIND_STATE]);
                put_f32s(&mut w, &b.floats);
                put_u32s(&mut w, &b.ints);
            }
        }
        w.finish()
    }

    /// The encoding of the block as pieces in order: the small headers
    /// owned, the arrays of input and state blocks borrowed where they lie
    /// (on little-endian machines), so a move writes them to its socket with
    /// no copy of its own; model blocks (a map of small values) are encoded
    /// into one piece. Their concatenation is [`BlockData::encode`].
    pub fn encoded(&self) -> Vec<Cow<'_, [u8]>> {
        fn len(n: usize) -> Cow<'static, [u8]> {
            Cow::Owned((n as u64).to_le_bytes().to_vec())
        }
        fn u32s(v: &[u32]) -> Cow<'_, [u8]> {
            if cfg!(target_endian = "little") {
                Cow::Borrowed(bytemuck::cast_slice(v))
            } else {
                Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
        }
        let f32s = crate::protocol::f32s_to_le_bytes;
        match self {
            BlockData::Keyed(_) => vec![Cow::Owned(self.encode())],
            BlockData::Input(b) => vec![
                Cow::Borrowed(&[KIND_INPUT][..]),
                len(b.labels.len()),
                f32s(&b.labels),
                len(b.offsets.len()),
                u32s(&b.offsets),
                len(b.indices.len()),
                u32s(&b.indices),
                len(b.values.len()),
                f32s(&b.values),
            ],
            BlockData::State(b) => vec![
                Cow::Borrowed(&[KIND_STATE][..]),
                len(b.floats.len()),
                f32s(&b.floats),
                len(b.ints.len()),
                u32s(&b.ints),
            ],
        }
    }

    /// Decodes a block encoded by [`BlockData::encode`].
    pub fn decode(bytes: &[u8]) -> Result<BlockData, StoreError> {
        Self::decode_chunks(&[bytes])
    }

    /// Decodes a block from the pieces it arrived in (in order), copying each
    /// array once, straight into place.
    pub fn decode_chunks<B: AsRef<[u8]>>(chunks: &[B]) -> Result<BlockData, StoreError> {
        let mut r = Reader::new(chunks);
        let kind = r.u8()?;
        let data = match kind {
            KIND_KEYED => {
                let n = r.u64()?;
                let mut values =
                    KeyMap::with_capacity_and_hasher(n.min(1 << 20) as usize, Default::default());
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
                check_input(&b)?;
                BlockData::Input(Arc::new(b))
            }
            KIND_STATE => BlockData::State(StateBlock {
                floats: r.f32s()?,
                ints: r.u32s()?,
            }),
            k => return Err(StoreError::Decode(format!("unknown block kind {k}"))),
        };
        let left = r.remaining();
        if left != 0 {
            return Err(StoreError::Decode(format!(
                "{left} trailing bytes after block"
            )));
        }
        Ok(data)
    }
}

/// Whether an input block's arrays fit together.
fn check_input(b: &InputBlock) -> Result<(), StoreError> {
    let consistent = b.offsets.len() == b.labels.len() + 1
        && b.indices.len() == b.values.len()
        && b.offsets.last().copied() == Some(b.indices.len() as u32)
        && b.offsets.windows(2).all(|w| w[0] <= w[1]);
    if consistent {
        Ok(())
    } else {
        Err(StoreError::Decode(
            "input block arrays are inconsistent".into(),
        ))
    }
}

/// Elements of an array being received that are made ready at a time, just
/// ahead of the bytes read over them (256 KiB, what one read of a move
/// takes at most: `peer::bulk::BULK_IO_BYTES`).
const ZERO_AHEAD: usize = (256 << 10) / 4;

/// Decodes a block as its bytes arrive, into place: the receiving end of a
/// move reads the socket straight into [`BlockDecoder::window`] (the next
/// bytes the block needs: an array's length, or the rest of the array
/// being filled), so an input or state block's arrays are copied once, by
/// the kernel. Model blocks (a map of small values) are gathered and
/// decoded whole at the end.
///
/// An array's memory is made ready `ZERO_AHEAD` elements at a time, just
/// before the socket's bytes are read over them: its pages faulted in with
/// one system call (`populate_for_write`) rather than a fault per 4 KiB
/// page, unless they are all mapped in already (`resident`), and the
/// zeros a `&mut [u8]` window needs written while those pages are still
/// in the cache, where the copy finds them. Faulting each page in on its
/// first write and zeroing the whole array ahead of the copy would take
/// about a third of a destination's time, and populating pages already
/// mapped a sixth (BENCHMARKS.md, #21).
///
/// An array's length is checked against the bytes the block announced
/// before anything is allocated for it, so a peer cannot make us allocate
/// more than it said it would send (and the frames bound what it may
/// announce per chunk, not per block: see `serve_bulk`).
#[derive(Debug)]
pub struct BlockDecoder {
    /// Bytes announced for the block.
    total: u64,
    /// Bytes taken so far.
    got: u64,
    state: Decoding,
}

#[derive(Debug)]
enum Decoding {
    /// The kind byte comes first.
    Kind([u8; 1]),
    /// A model block (or an unknown kind): the bytes, decoded at the end.
    Whole(Vec<u8>),
    /// An input or state block: its arrays, the one being read, and where.
    Arrays {
        kind: u8,
        /// The arrays read so far (as `u32` bits; `f32`s are cast at the end).
        done: Vec<Vec<u32>>,
        /// How many arrays the kind has.
        count: usize,
        /// Reading the current array's length, or its elements.
        at: ArrayAt,
    },
}

#[derive(Debug)]
enum ArrayAt {
    /// The length's bytes, and how many have come.
    Len([u8; 8], usize),
    /// The array's elements: `v` holds those made ready so far (zeros
    /// until the socket's bytes are read over them; its capacity is the
    /// whole array, `len` elements, allocated once), of which the first
    /// `got` bytes have come.
    Elems { v: Vec<u32>, len: usize, got: usize },
}

impl BlockDecoder {
    /// A decoder for a block of `total` bytes.
    pub fn new(total: u64) -> BlockDecoder {
        BlockDecoder {
            total,
            got: 0,
            state: Decoding::Kind([0]),
        }
    }

    /// Bytes still expected.
    pub fn remaining(&self) -> u64 {
        self.total - self.got
    }

    /// Where the next bytes go: never empty while bytes are expected; at
    /// most the bytes still expected.
    pub fn window(&mut self) -> &mut [u8] {
        let left = usize::try_from(self.total - self.got).unwrap_or(usize::MAX);
        let w: &mut [u8] = match &mut self.state {
            Decoding::Kind(k) => &mut k[..],
            Decoding::Whole(buf) => {
                // Grown as bytes come, a megabyte at a time at most.
                let filled = self.got as usize;
                if buf.len() == filled {
                    buf.resize(filled + left.min(1 << 20), 0);
                }
                &mut buf[filled..]
            }
            Decoding::Arrays { at, .. } => match at {
                ArrayAt::Len(b, n) => &mut b[*n..],
                ArrayAt::Elems { v, len, got } => {
                    if *got == v.len() * 4 && v.len() < *len {
                        let more = (*len - v.len()).min(ZERO_AHEAD);
                        let start = v.spare_capacity_mut().as_ptr() as usize;
                        if !resident(start, more * 4) {
                            populate_for_write(start, more * 4);
                        }
                        v.resize(v.len() + more, 0);
                    }
                    &mut bytemuck::cast_slice_mut::<u32, u8>(v)[*got..]
                }
            },
        };
        let n = w.len().min(left);
        &mut w[..n]
    }

    /// Takes the first `n` bytes of the last [`BlockDecoder::window`] as
    /// written.
    pub fn advance(&mut self, n: usize) -> Result<(), StoreError> {
        if n == 0 {
            return Ok(());
        }
        self.got += n as u64;
        let left = self.total - self.got;
        match &mut self.state {
            Decoding::Kind(k) => {
                let kind = k[0];
                let count = match kind {
                    KIND_INPUT => 4,
                    KIND_STATE => 2,
                    _ => 0,
                };
                self.state = if count == 0 {
                    let mut buf = Vec::with_capacity((left as usize).min(1 << 20) + 1);
                    buf.push(kind);
                    Decoding::Whole(buf)
                } else {
                    Decoding::Arrays {
                        kind,
                        done: Vec::with_capacity(count),
                        count,
                        at: ArrayAt::Len([0; 8], 0),
                    }
                };
            }
            Decoding::Whole(_) => {}
            Decoding::Arrays {
                done, count, at, ..
            } => {
                if done.len() == *count {
                    return Err(StoreError::Decode("trailing bytes after block".into()));
                }
                let array_len = match at {
                    ArrayAt::Len(b, got) => {
                        *got += n;
                        if *got == 8 {
                            let len = u64::from_le_bytes(*b);
                            if len.checked_mul(4).is_none_or(|bytes| bytes > left) {
                                return Err(StoreError::Decode("block data truncated".into()));
                            }
                            Some(len as usize)
                        } else {
                            None
                        }
                    }
                    ArrayAt::Elems { got, .. } => {
                        *got += n;
                        None
                    }
                };
                if let Some(len) = array_len {
                    *at = ArrayAt::Elems {
                        v: Vec::with_capacity(len),
                        len,
                        got: 0,
                    };
                }
            }
        }
        // An array complete (also an empty one, at once) moves on to the next.
        if let Decoding::Arrays {
            done, count, at, ..
        } = &mut self.state
            && let ArrayAt::Elems { v, len, got } = at
            && *got == *len * 4
            && done.len() < *count
        {
            done.push(std::mem::take(v));
            *at = ArrayAt::Len([0; 8], 0);
        }
        Ok(())
    }

    /// Takes `bytes` (a chunk that arrived compressed, then inflated).
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), StoreError> {
        while !bytes.is_empty() {
            let w = self.window();
            if w.is_empty() {
                return Err(StoreError::Decode(
                    "more bytes than the block announced".into(),
                ));
            }
            let n = w.len().min(bytes.len());
            w[..n].copy_from_slice(&bytes[..n]);
            self.advance(n)?;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// The block, once every announced byte has been taken.
    pub fn finish(self) -> Result<BlockData, StoreError> {
        if self.got != self.total {
            return Err(StoreError::Decode("block data truncated".into()));
        }
        let (kind, mut done) = match self.state {
            Decoding::Kind(_) => return Err(StoreError::Decode("empty block".into())),
            Decoding::Whole(buf) => return BlockData::decode(&buf),
            Decoding::Arrays {
                kind, done, count, ..
            } => {
                if done.len() != count {
                    return Err(StoreError::Decode("block data truncated".into()));
                }
                (kind, done)
            }
        };
        if cfg!(target_endian = "big") {
            for x in done.iter_mut().flatten() {
                *x = u32::from_le(*x);
            }
        }
        let mut arrays = done.into_iter();
        let mut next = || arrays.next().unwrap_or_default();
        // Same size and alignment: the cast never fails.
        let floats = |v: Vec<u32>| -> Result<Vec<f32>, StoreError> {
            bytemuck::allocation::try_cast_vec(v)
                .map_err(|(e, _)| StoreError::Decode(format!("float array: {e:?}")))
        };
        Ok(if kind == KIND_INPUT {
            let b = InputBlock {
                labels: floats(next())?,
                offsets: next(),
                indices: next(),
                values: floats(next())?,
            };
            check_input(&b)?;
            BlockData::Input(Arc::new(b))
        } else {
            BlockData::State(StateBlock {
                floats: floats(next())?,
                ints: next(),
            })
        })
    }
}

/// Asks the kernel to fault in the whole 4 KiB pages of `[start, start +
/// len)`, memory the caller owns and has not written yet, ready for
/// writing: one system call for all of them instead of a fault taken by
/// the first write to each page. Best effort: where the advice is refused
/// (kernels before 5.14, pages larger than 4 KiB, other systems) the pages
/// fault in as they are written, as they would without it.
fn populate_for_write(start: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let from = start.next_multiple_of(PAGE);
        let to = start.saturating_add(len) & !(PAGE - 1);
        if to > from {
            // SAFETY: `from..to` lies inside an allocation the caller
            // owns; MADV_POPULATE_WRITE only maps its pages in (as a write
            // to each would), never unmaps them or changes what they hold,
            // and nothing here reads them.
            unsafe {
                libc::madvise(
                    from as *mut libc::c_void,
                    to - from,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

/// Whether every whole 4 KiB page of `[start, start + len)` is mapped in
/// already (memory the allocator handed back after an earlier free), asked
/// with one `mincore`, which reads the page tables only:
/// [`populate_for_write`] walks each page of its range, mapped or not, and
/// on pages already there that walk is all it does. `false` where it
/// cannot tell (then the range is populated, as it would be without
/// asking).
fn resident(start: usize, len: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let from = start.next_multiple_of(PAGE);
        let to = start.saturating_add(len) & !(PAGE - 1);
        if to <= from {
            return false;
        }
        // One byte per page; a window is at most 64 pages.
        let mut pages = [0u8; 128];
        let n = (to - from) / PAGE;
        if n > pages.len() {
            return false;
        }
        // SAFETY: `from..to` lies inside an allocation the caller owns
        // (page-aligned, as mincore requires); mincore only reads the page
        // tables and writes one byte per page into `pages`, which has room
        // for `n`.
        let rc = unsafe { libc::mincore(from as *mut libc::c_void, to - from, pages.as_mut_ptr()) };
        rc == 0 && pages[..n].iter().all(|p| p & 1 == 1)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (start, len);
        false
    }
}

/// Writes bytes into pieces of a fixed size.
struct ChunkWriter {
    chunk: usize,
    cur: Vec<u8>,
    done: Vec<Vec<u8>>,
}

impl ChunkWriter {
    fn new(chunk: usize, total_hint: usize) -> Self {
        ChunkWriter {
            chunk,
            cur: Vec::with_capacity(chunk.min(total_hint)),
            done: Vec::new(),
        }
    }

    fn put(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            if self.cur.len() == self.chunk {
                let next = Vec::with_capacity(self.chunk.min(b.len().max(4096)));
                self.done.push(std::mem::replace(&mut self.cur, next));
            }
            let n = (self.chunk - self.cur.len()).min(b.len());
            self.cur.extend_from_slice(&b[..n]);
            b = &b[n..];
        }
    }

    fn finish(mut self) -> Vec<Vec<u8>> {
        if !self.cur.is_empty() || self.done.is_empty() {
            self.done.push(self.cur);
        }
        self.done
    }
}

fn put_f32s(out: &mut ChunkWriter, v: &[f32]) {
    out.put(&(v.len() as u64).to_le_bytes());
    out.put(&crate::protocol::f32s_to_le_bytes(v));
}

fn put_u32s(out: &mut ChunkWriter, v: &[u32]) {
    out.put(&(v.len() as u64).to_le_bytes());
    if cfg!(target_endian = "little") {
        out.put(bytemuck::cast_slice(v));
    } else {
        for x in v {
            out.put(&x.to_le_bytes());
        }
    }
}

/// Reads across the pieces a block arrived in.
struct Reader<'a, B> {
    chunks: &'a [B],
    /// The current piece and the position in it.
    at: usize,
    pos: usize,
    /// Bytes not read yet.
    left: usize,
}

impl<'a, B: AsRef<[u8]>> Reader<'a, B> {
    fn new(chunks: &'a [B]) -> Self {
        Reader {
            chunks,
            at: 0,
            pos: 0,
            left: chunks.iter().map(|c| c.as_ref().len()).sum(),
        }
    }

    fn remaining(&self) -> usize {
        self.left
    }

    /// Fills `dst` from the pieces.
    fn read_into(&mut self, mut dst: &mut [u8]) -> Result<(), StoreError> {
        while !dst.is_empty() {
            let Some(c) = self.chunks.get(self.at) else {
                return Err(StoreError::Decode("block data truncated".into()));
            };
            let c = &c.as_ref()[self.pos..];
            if c.is_empty() {
                self.at += 1;
                self.pos = 0;
                continue;
            }
            let n = c.len().min(dst.len());
            dst[..n].copy_from_slice(&c[..n]);
            dst = &mut dst[n..];
            self.pos += n;
            self.left -= n;
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        let mut a = [0u8; 1];
        self.read_into(&mut a)?;
        Ok(a[0])
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let mut a = [0u8; 8];
        self.read_into(&mut a)?;
        Ok(u64::from_le_bytes(a))
    }

    /// An array length, checked against what is left (so that a corrupt
    /// length cannot make us allocate more than arrived).
    fn len4(&mut self) -> Result<usize, StoreError> {
        let n = self.u64()?;
        let n = usize::try_from(n)
            .ok()
            .filter(|n| n.checked_mul(4).is_some())
            .ok_or_else(|| StoreError::Decode("array length overflows".into()))?;
        if n * 4 > self.remaining() {
            return Err(StoreError::Decode("block data truncated".into()));
        }
        Ok(n)
    }

    fn f32s(&mut self) -> Result<Vec<f32>, StoreError> {
        let n = self.len4()?;
        let mut v = vec![0f32; n];
        self.read_into(bytemuck::cast_slice_mut(&mut v))?;
        if cfg!(target_endian = "big") {
            for x in &mut v {
                *x = f32::from_bits(u32::from_le(x.to_bits()));
            }
        }
        Ok(v)
    }

    fn u32s(&mut self) -> Result<Vec<u32>, StoreError> {
        let n = self.len4()?;
        let mut v = vec![0u32; n];
        self.read_into(bytemuck::cast_slice_mut(&mut v))?;
        if cfg!(target_endian = "big") {
            for x in &mut v {
                *x = u32::from_le(*x);
            }
        }
        Ok(v)
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
            .prop_map(|values| {
                BlockData::Keyed(KeyedBlock {
                    values: values.into_iter().collect(),
                })
            }),
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

    /// Arrays shorter and longer than the part made ready at a time, of
    /// lengths that are not multiples of it, read the way a socket fills
    /// them (pieces that cut elements in two, and whole windows): no window
    /// is longer than that part, and the block comes back whole.
    #[test]
    fn large_arrays_are_rebuilt_a_window_at_a_time() {
        for len in [
            0,
            1,
            ZERO_AHEAD - 1,
            ZERO_AHEAD,
            ZERO_AHEAD + 1,
            3 * ZERO_AHEAD + 7,
            (5 << 20) / 4 + 3,
        ] {
            let b = BlockData::State(StateBlock {
                floats: (0..len).map(|i| i as f32 * 0.5 - 3.0).collect(),
                ints: (0..len / 3 + 2)
                    .map(|i| (i as u32).wrapping_mul(2_654_435_761))
                    .collect(),
            });
            let whole = b.encode();
            for piece in [7usize, 100_003, usize::MAX] {
                let mut d = BlockDecoder::new(whole.len() as u64);
                let mut at = 0;
                while at < whole.len() {
                    let w = d.window();
                    assert!(
                        !w.is_empty() && w.len() <= ZERO_AHEAD * 4,
                        "window of {} bytes",
                        w.len()
                    );
                    let n = w.len().min(piece).min(whole.len() - at);
                    w[..n].copy_from_slice(&whole[at..at + n]);
                    d.advance(n).unwrap();
                    at += n;
                }
                assert_eq!(d.remaining(), 0);
                assert_eq!(d.finish().unwrap(), b, "len {len}, pieces of {piece}");
            }
        }
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(b in arb_block()) {
            let bytes = b.encode();
            prop_assert_eq!(BlockData::decode(&bytes).unwrap(), b);
        }

        /// Any piece size gives the same bytes, and decoding the pieces
        /// gives the block back.
        #[test]
        fn chunked_encoding_round_trips(b in arb_block(), chunk in 1usize..64) {
            let whole = b.encode();
            let pieces = b.encode_chunks(chunk);
            prop_assert!(pieces.iter().all(|p| p.len() <= chunk && !p.is_empty()));
            prop_assert_eq!(pieces.concat(), whole);
            prop_assert_eq!(BlockData::decode_chunks(&pieces).unwrap(), b);
        }

        /// The pieces a move writes are the encoding, and the decoder
        /// fed the bytes in any pieces gives the block back.
        #[test]
        fn streamed_decoding_round_trips(b in arb_block(), cuts in prop::collection::vec(1usize..40, 1..50)) {
            let whole = b.encode();
            prop_assert_eq!(b.encoded().concat(), whole.clone());
            prop_assert_eq!(b.encoded_len(), whole.len());
            let mut d = BlockDecoder::new(whole.len() as u64);
            let mut at = 0;
            for (i, c) in cuts.iter().cycle().enumerate() {
                if at == whole.len() {
                    break;
                }
                let n = (*c).min(whole.len() - at);
                if i % 2 == 0 {
                    d.feed(&whole[at..at + n]).unwrap();
                    at += n;
                } else {
                    // As the socket would: into the window.
                    let w = d.window();
                    prop_assert!(!w.is_empty());
                    let n = n.min(w.len());
                    w[..n].copy_from_slice(&whole[at..at + n]);
                    d.advance(n).unwrap();
                    at += n;
                }
            }
            prop_assert_eq!(d.remaining(), 0);
            prop_assert_eq!(d.finish().unwrap(), b);
        }

        /// A block cut short, or a length beyond what was announced, is an
        /// error, not a panic or a huge allocation.
        #[test]
        fn streamed_decoding_rejects_bad_blocks(b in arb_block(), cut in any::<prop::sample::Index>()) {
            let whole = b.encode();
            let n = cut.index(whole.len());
            let mut d = BlockDecoder::new(n as u64);
            let fed = d.feed(&whole[..n]);
            prop_assert!(fed.is_err() || d.finish().is_err());
        }

        #[test]
        fn truncated_blocks_are_errors(b in arb_block(), cut in any::<prop::sample::Index>()) {
            let bytes = b.encode();
            let n = cut.index(bytes.len());
            prop_assert!(BlockData::decode(&bytes[..n]).is_err());
        }
    }
}
