//! The data plane's bulk connections: a block's data, chunked, from its
//! source to its destination ([`BulkToDest`]), and the destination's answer
//! ([`BulkToSource`]).

use serde::{Deserialize, Serialize};

use super::{BlockId, TableId};

/// Source → destination frames on a bulk connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BulkToDest {
    /// A block's data begins.
    Begin {
        /// The move.
        move_id: u64,
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// Total bytes that follow in chunks.
        bytes: u64,
    },
    /// A piece of the current block's encoded data.
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The current block is complete; install it and answer.
    End,
}

/// Destination → source frames on a bulk connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BulkToSource {
    /// The block is installed and owned by the destination.
    Installed {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
    },
    /// The block could not be installed.
    Failed {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// Why.
        reason: String,
    },
}
