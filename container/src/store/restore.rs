//! A block restored from a checkpoint, the store's part: the slot is taken
//! arriving ([`Store::begin_restore`]) before the new ownership is
//! announced, so operations on the block queue until the block's data is
//! read and [installed](Store::install).

use crate::protocol::{BlockId, EvaluatorId, TableId};

use super::block_move::Arriving;
use super::{Store, StoreError};

impl Store {
    /// Takes the block arriving as a restored block of the lost evaluator
    /// `lost`: operations on it queue until [`Store::install`]. A block
    /// already arriving for a restore stays so (a restore tried again from
    /// an older checkpoint keeps what queued meanwhile). Refused when the
    /// block is held here or is moving.
    pub fn begin_restore(
        &self,
        table: TableId,
        block: BlockId,
        lost: EvaluatorId,
    ) -> Result<(), StoreError> {
        self.take_arriving(table, block, lost, Arriving::AgainFromSame, "restore")
    }
}
