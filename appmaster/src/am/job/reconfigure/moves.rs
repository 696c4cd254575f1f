//! The AM's side of a block move: `MoveBlocks` to the source, every
//! `BlockMoved` updates and broadcasts ownership, `MoveFinished` ends it;
//! input blocks of a stateless app are re-read from the job's input
//! instead where that is cheaper (a scale-in).

use std::time::Instant;

use cruise_container::protocol::{AmToEval, BlockId, EvaluatorId, INPUT_TABLE, TableId};
use cruise_optimizer::{OpError, OpReport, Operation, Table};

use super::{MoveOp, OpIndex, ReloadOp, measures_capacity, reload_or_move, table_of};
use crate::am::AmError;
use crate::am::job::{Driver, take_first};

impl Driver {
    pub(super) async fn start_move(
        &mut self,
        table: Table,
        blocks: Vec<u32>,
        from: &str,
        to: &str,
        op: OpIndex,
    ) -> Result<(), OpError> {
        let (from, to) = match (self.resolve(from), self.resolve(to)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let t = table_of(table);
        let blocks: Vec<BlockId> = blocks.into_iter().map(BlockId).collect();
        let not_there: Vec<BlockId> = blocks
            .iter()
            .copied()
            .filter(|&b| self.owners.owner(t, b) != Some(from))
            .collect();
        if !not_there.is_empty() {
            return Err(OpError::new(format!(
                "evaluator {from} does not own {table:?} blocks {not_there:?}"
            )));
        }
        if t == INPUT_TABLE && self.reload_instead(from, to, &blocks) {
            self.send(
                from,
                AmToEval::DropInput {
                    blocks: blocks.clone(),
                },
            )
            .await;
            self.rc.reloads.push(ReloadOp {
                from,
                to,
                blocks,
                loading_since: None,
                op,
            });
            return Ok(());
        }
        let move_id = self.rc.next_move;
        self.rc.next_move += 1;
        self.rc.moves.insert(
            move_id,
            MoveOp {
                from,
                to,
                table: t,
                bytes: 0,
                blocks: blocks.len(),
                ids: blocks.clone(),
                op,
            },
        );
        self.send(
            from,
            AmToEval::MoveBlocks {
                move_id,
                table: t,
                blocks,
                to,
            },
        )
        .await;
        Ok(())
    }

    /// Whether input blocks leaving `from` for `to` are re-read from the
    /// job's input at `to` rather than moved (see `optimizer.scale_in_input`):
    /// only in a plan that gives containers back; logs the choice and why.
    pub(super) fn reload_instead(
        &self,
        from: EvaluatorId,
        to: EvaluatorId,
        blocks: &[BlockId],
    ) -> bool {
        let scale_in = self.rc.plan.as_ref().is_some_and(|p| {
            p.tracker
                .plan()
                .ops
                .iter()
                .any(|o| matches!(o.op, Operation::Delete { .. }))
        });
        let bytes: u64 = blocks
            .iter()
            .filter_map(|b| self.rc.input_bytes.get(b))
            .sum();
        let m = &self.rc.metrics;
        let link = match (m.capacity(from), m.capacity(to)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b).or_else(|| m.mean_capacity()),
        };
        let (reload, why) = reload_or_move(
            self.rc.scale_in_input,
            !self.config.job.app.keeps_worker_state(),
            scale_in,
            bytes,
            link,
            m.load_bandwidth(),
        );
        if scale_in {
            tracing::info!(
                %from,
                %to,
                blocks = blocks.len(),
                bytes,
                "scale-in: {} the input blocks: {why}",
                if reload { "re-reading" } else { "moving" }
            );
        }
        reload
    }

    /// An evaluator dropped input blocks a reload asked it to drop: the
    /// destination loads them now.
    pub(in crate::am::job) async fn on_input_dropped(
        &mut self,
        id: EvaluatorId,
        blocks: Vec<BlockId>,
    ) {
        let Some(r) = self
            .rc
            .reloads
            .iter_mut()
            .find(|r| r.from == id && r.loading_since.is_none() && r.blocks == blocks)
        else {
            tracing::warn!(evaluator = %id, ?blocks, "unexpected InputDropped");
            return;
        };
        r.loading_since = Some(Instant::now());
        let to = r.to;
        let splits = blocks
            .iter()
            .filter_map(|&b| self.splits.get(b.index()).map(|s| (b, s.clone())))
            .collect();
        // Only blocks without worker-local state are re-read on a scale-in.
        let msg = AmToEval::LoadInput {
            blocks: splits,
            state: None,
        };
        self.send(to, msg).await;
    }

    /// Input blocks loaded while training: a reload has landed. Returns
    /// whether the message belonged to one.
    pub(in crate::am::job) async fn on_input_reloaded(
        &mut self,
        id: EvaluatorId,
        loaded: &[(BlockId, u64, u64)],
    ) -> bool {
        let blocks: Vec<BlockId> = loaded.iter().map(|l| l.0).collect();
        let Some(r) = take_first(&mut self.rc.reloads, |r| {
            r.to == id && r.loading_since.is_some() && r.blocks == blocks
        }) else {
            return false;
        };
        let bytes: u64 = loaded.iter().map(|l| l.2).sum();
        if let Some(since) = r.loading_since {
            self.rc.metrics.load(bytes, since.elapsed().as_secs_f64());
        }
        self.input_loaded_by(id, &blocks).await;
        tracing::info!(
            from = %r.from,
            to = %id,
            ?blocks,
            bytes,
            "input blocks re-read from the job's input"
        );
        self.rc.op_done(
            r.op,
            Ok(OpReport {
                bytes_moved: 0,
                reloaded: true,
            }),
        );
        true
    }

    /// A block of a move was installed at its destination. A destination
    /// lost meanwhile took the block with it: it is recovered like the
    /// lost evaluator's own blocks ([`Driver::landed_at_lost`]).
    pub(in crate::am::job) async fn on_block_moved(
        &mut self,
        move_id: u64,
        table: TableId,
        block: BlockId,
        to: EvaluatorId,
        bytes: u64,
    ) -> Result<(), AmError> {
        if let Some(m) = self.rc.moves.get_mut(&move_id) {
            m.bytes += bytes;
        }
        if self.evaluators.get(&to).is_none_or(|e| e.gone) {
            return self.landed_at_lost(table, block, to).await;
        }
        self.broadcast_ownership(vec![(table, block, to)]).await;
        Ok(())
    }

    /// A move ended.
    pub(in crate::am::job) fn on_move_finished(
        &mut self,
        move_id: u64,
        result: Result<(), String>,
        secs: f64,
    ) {
        let Some(m) = self.rc.moves.remove(&move_id) else {
            return;
        };
        if measures_capacity(m.bytes, m.blocks) {
            self.rc.metrics.bulk(m.from, m.to, m.bytes, secs);
        }
        let r = match result {
            Ok(()) => Ok(OpReport {
                bytes_moved: m.bytes,
                reloaded: false,
            }),
            Err(e) => Err(OpError::new(format!(
                "move from evaluator {} to {}: {e}",
                m.from, m.to
            ))),
        };
        self.rc.op_done(m.op, r);
    }
}
