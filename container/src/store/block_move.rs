//! A block move, the store's part (Cruise §IV-B2); the transfer itself is
//! [`crate::peer`]'s (`peer/block_move.rs`).
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

use crate::protocol::{BlockId, EvaluatorId, RemoteError, TableId};

use super::{BlockData, Slot, Store, StoreError, apply, lock};

/// The answer of [`Store::abort_incoming`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortOutcome {
    /// The block was not installed here; the source owns it.
    Aborted,
    /// The block had already been installed here: the move took place.
    Installed,
}

/// Whether a block may already be arriving when it is taken arriving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arriving {
    /// Only a block not arriving yet (a move's destination).
    New,
    /// A block already arriving from the same evaluator stays so (a
    /// restore tried again keeps what queued meanwhile).
    AgainFromSame,
}

impl Store {
    /// Destination: takes the block `Incoming` (operations on it queue until
    /// [`Store::install`]).
    pub fn begin_incoming(
        &self,
        table: TableId,
        block: BlockId,
        from: EvaluatorId,
    ) -> Result<(), StoreError> {
        self.take_arriving(table, block, from, Arriving::New, "receive")
    }

    /// Takes the block `Incoming` from `from` (operations on it queue until
    /// [`Store::install`]) when it is absent or was moved away here; with
    /// [`Arriving::AgainFromSame`], a block already arriving from `from`
    /// stays so. Any other state is refused: "cannot `verb` a block that
    /// is ...".
    pub(super) fn take_arriving(
        &self,
        table: TableId,
        block: BlockId,
        from: EvaluatorId,
        arriving: Arriving,
        verb: &str,
    ) -> Result<(), StoreError> {
        self.with_slot(table, block, |slot| match &*slot {
            Slot::Incoming { from: f, .. } if arriving == Arriving::AgainFromSame && *f == from => {
                Ok(())
            }
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
            other => Err(StoreError::not_while(
                table,
                block,
                &format!("cannot {verb}"),
                other,
            )),
        })
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
                    return Err(StoreError::not_while(
                        table,
                        block,
                        "cannot abort receiving",
                        other,
                    ));
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
                return Err(StoreError::not_while(
                    table,
                    block,
                    "data arrived for",
                    &slot,
                ));
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

    /// Source: hands the block over to `to` (from now on operations are
    /// forwarded there) and returns its data to stream. The caller must end
    /// with [`Store::finish_move`] or [`Store::restore`].
    pub fn take_for_move(
        &self,
        table: TableId,
        block: BlockId,
        to: EvaluatorId,
    ) -> Result<BlockData, StoreError> {
        self.with_slot(table, block, |slot| {
            if !matches!(&*slot, Slot::Owned(_)) {
                return Err(StoreError::not_while(table, block, "cannot move", slot));
            }
            match std::mem::replace(
                slot,
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
        })
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
        self.with_slot(table, block, |slot| match &*slot {
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
            other => Err(StoreError::not_while(table, block, "recalling", other)),
        })
    }

    /// Source: the destination installed the block.
    pub fn finish_move(&self, table: TableId, block: BlockId) -> Result<(), StoreError> {
        self.with_slot(table, block, |slot| match slot {
            Slot::Forwarding { in_flight, .. } => {
                *in_flight = false;
                Ok(())
            }
            other => Err(StoreError::not_while(
                table,
                block,
                "finishing a move of",
                other,
            )),
        })
    }

    /// Source: the move failed; own the block again with its data.
    pub fn restore(
        &self,
        table: TableId,
        block: BlockId,
        data: BlockData,
    ) -> Result<(), StoreError> {
        self.with_slot(table, block, |slot| match &*slot {
            Slot::Forwarding {
                in_flight: true, ..
            } => {
                *slot = Slot::Owned(data);
                Ok(())
            }
            other => Err(StoreError::not_while(table, block, "restoring", other)),
        })
    }
}
