//! The messages on every channel: one enum per direction per channel.
//!
//! | channel | direction | enum |
//! |---|---|---|
//! | any (first frames) | both | [`Handshake`] |
//! | control | AM → evaluator | [`AmToEval`] |
//! | control | evaluator → AM | [`EvalToAm`] |
//! | data plane, requests | client → owner | [`ToOwner`] (carries [`PeerRequest`]) |
//! | data plane, requests | owner → client | [`ToClient`] (carries [`PeerResponse`]) |
//! | data plane, bulk | source → destination | [`BulkToDest`] |
//! | data plane, bulk | destination → source | [`BulkToSource`] |
//!
//! Each channel's messages live in a module of their own, re-exported here:
//! `handshake`, `control` (with the `reports` evaluators send on it), the
//! data plane's `requests` and `bulk`, and `values` (how values travel).
//! The identities and tables every channel names are here.

use serde::{Deserialize, Serialize};

mod bulk;
mod control;
mod handshake;
mod reports;
mod requests;
mod values;

pub use bulk::*;
pub use control::*;
pub use handshake::*;
pub use reports::*;
pub use requests::*;
pub(crate) use values::decode_with_tail;
pub use values::*;

/// Version of this protocol; both ends must agree.
pub const PROTOCOL_VERSION: u32 = 1;

/// An evaluator's id within a job, given by the AM at registration.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct EvaluatorId(pub u32);

impl std::fmt::Display for EvaluatorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for EvaluatorId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(EvaluatorId)
    }
}
/// A table's id.
pub type TableId = u8;
/// A block's index within its table.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    /// Its position in its table's list of blocks.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Blocks `0..n` of a table.
    pub fn all(n: u32) -> impl DoubleEndedIterator<Item = BlockId> + ExactSizeIterator {
        (0..n).map(BlockId)
    }
}

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
/// A key within a table.
pub type Key = u64;

/// The model table (on servers): the shared parameters.
pub const MODEL_TABLE: TableId = 0;
/// The input table (on workers): training records, one block per split.
pub const INPUT_TABLE: TableId = 1;
/// Worker-local state (on workers), co-partitioned with and moving with the input.
pub const STATE_TABLE: TableId = 2;
