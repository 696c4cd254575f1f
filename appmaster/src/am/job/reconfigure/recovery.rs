//! Surviving a lost evaluator while training. An evaluator whose process
//! ended, whose connection dropped or that fell silent is let go: its
//! container is released (a hung process is killed with it) and the other
//! members learn it has left. The other workers never stop; under SSP the
//! lost worker no longer holds their clocks back.
//!
//! - A lost worker's input blocks are re-read from the job's input by the
//!   surviving workers, the least loaded first. Their worker-local state
//!   is restored from the newest published checkpoint where it holds it
//!   (NMF's row factors, as they were then: `LoadInput`'s `state`), and
//!   drawn afresh as at the start otherwise (no checkpoint yet, an app
//!   whose state checkpoints do not hold, a state file that cannot be
//!   read). A job whose last epoch ends meanwhile stops training only
//!   once they have landed: a worker counts in its blocks' state as it
//!   stops, and the final evaluation reads its blocks.
//! - A lost server's model blocks are restored from the newest published
//!   checkpoint onto the surviving servers (workers if none is left), the
//!   least loaded first: each is told `RestoreBlocks` — its slots take the
//!   blocks arriving, so requests for them queue there — and then everyone
//!   learns the new owners. Requests in flight to the lost server are sent
//!   again once it has left (the data plane's `lost_at`). A block whose
//!   file turns out corrupt is restored from the checkpoint before.
//!   The updates since that checkpoint to those blocks are lost (async SGD
//!   tolerates it; the job trains on). The converse is rarer: a push the
//!   lost server applied and checkpointed before its answer was lost is
//!   sent again, and then counts twice (as tolerable to async SGD).
//!   Under SSP the restored blocks are older than the clocks the workers
//!   passed: before anyone learns their new owners, the workers' clocks
//!   and the job's progress roll back to the checkpoint's
//!   ([`Driver::roll_back_clocks`], `from_checkpoint.rs`), and the epochs
//!   after it are trained again; the other blocks keep their newer
//!   updates. A restore tried again from the checkpoint before rolls back
//!   again, to that one's clock; a read the restorer had queued may then
//!   be answered with the older blocks before its worker hears of the
//!   second rollback (that one mini-batch reads them up to the two
//!   checkpoints' distance staler than the bound).
//! - An app whose model is the sum of the workers' state (LDA,
//!   `apps::model_rebuilt_on_loss`) restores no model block: a lost
//!   worker's assignments are counted in the model, and a checkpoint's
//!   counts disagree with the assignments the workers hold. A lost
//!   server's blocks are created empty on the survivors (`CreateBlocks`,
//!   then everyone learns the new owners; no checkpoint is needed), a lost
//!   worker's input blocks are re-read as above (LDA's document state from
//!   the newest checkpoint, marked uncounted, or drawn afresh), and then
//!   the whole model is recounted from the workers' state (`recount.rs`):
//!   every worker holds briefly between two mini-batches while the counts
//!   are emptied, and each row's next sweep counts it in again.
//!
//! A loss while a plan runs stops the plan first ([`Driver::abandon_plan_ops`]);
//! the AM's ownership table stays the one truth, changed only by blocks
//! reported installed, loaded or restored:
//!
//! - Operations not started yet are dropped (the tracker is cancelled:
//!   they are reported skipped).
//! - Operations under way that involve the lost evaluator end as failed
//!   at once ("evaluator N was lost"): a move from or to it, a re-read
//!   from or to it, its delete, its switch, its add still joining.
//! - Operations under way that do not involve it finish as they would
//!   have, each within `optimizer.op_timeout_ms` ([`Driver::expire_ops`]);
//!   they touch no block of the lost evaluator. Cancelling them instead
//!   would leave moves half done on evaluators that are alive, whose end
//!   the AM must hear anyway to know who owns their blocks.
//! - A move from the lost evaluator: the blocks it reported moved belong
//!   to the destination; the others are still the lost one's in the
//!   table, and are recovered with its blocks (input re-read, model
//!   restored from the checkpoint). A block still arriving at the
//!   destination stays so until it is recovered: the destination, if it is
//!   the one chosen, calls that move off to read an input block again, and
//!   restores a model block into the arriving slot (requests queued on it
//!   are applied after the restored data); elsewhere the block's requests
//!   go to its new owner once they are sent again.
//! - A move to the lost evaluator: the blocks it reported moved are the
//!   lost one's, recovered with its own; a block in flight fails its
//!   transfer and stays with the source, which keeps the rest. A block the
//!   source reports installed after the loss was heard of is recovered
//!   when the report comes ([`Driver::landed_at_lost`]); a worker-local
//!   state block landed there is read again with its input block where
//!   that is.
//! - A re-read (scale-in) from the lost evaluator that the destination is
//!   already loading becomes that block's recovery; one to the lost
//!   evaluator is read by a survivor instead (the source has dropped the
//!   blocks, or drops them on the command already sent).
//!
//! Evaluators the stopped plan still deletes or switches take none of the
//! lost evaluator's blocks. The plan ends once what runs has ended; the
//! optimizer looks again after the recovery.
//!
//! What cannot be survived fails the job, and the message says
//! why ([`Driver::unsurvivable`]): a lost server (or the destination of a
//! model move under way) without a published checkpoint (but for LDA,
//! whose counts are rebuilt); a loss outside training; no other worker
//! left to re-read the input blocks (those a running plan deletes or
//! switches do not count), or no other evaluator to hold the model
//! blocks; more losses than `job.max_failures` (a recount is part of
//! surviving its loss, not a failure of its own).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use cruise_conf::SyncMode;
use cruise_container::checkpoint;
use cruise_container::protocol::{
    AmToEval, BlockId, EvaluatorId, INPUT_TABLE, MODEL_TABLE, STATE_TABLE, TableId,
};
use cruise_optimizer::OpError;

use crate::am::job::{Driver, Phase, plural, take_first};
use crate::am::{AmError, Role};

/// Input blocks of a lost worker that a survivor is re-reading.
pub(in crate::am::job) struct Recovery {
    to: EvaluatorId,
    blocks: Vec<BlockId>,
    since: Instant,
}

/// Model blocks of a lost server that a survivor is restoring from a
/// checkpoint.
pub(in crate::am::job) struct Restore {
    lost: EvaluatorId,
    to: EvaluatorId,
    folder: String,
    blocks: Vec<BlockId>,
    since: Instant,
}

impl Driver {
    /// Why the job cannot survive losing `id` now; `None` when it can.
    pub(in crate::am::job) fn unsurvivable(&self, id: EvaluatorId) -> Option<String> {
        let Some(e) = self.evaluators.get(&id) else {
            return Some("it is not one of the job's evaluators".into());
        };
        let max = self.config.job.max_failures;
        // A model block moving to it may land there before the move fails.
        let model = !self.model_blocks_of(id).is_empty() || self.model_moving_to(id);
        // One a plan deletes holds nothing by then: losing it loses nothing.
        let deleting = self.rc.is_deleting(id);
        if let Some(f) = self.pending_fatal.as_ref().filter(|f| f.eval == id) {
            Some(format!("it failed: {}", f.error))
        } else if self.phase != Phase::Training {
            Some(format!(
                "losses are survived while training, and the job is {}",
                self.phase.name()
            ))
        } else if !model && e.role != Role::Worker && !deleting {
            Some("only workers and evaluators holding model blocks are survived".into())
        } else if self.rc.losses.len() as u32 >= max {
            Some(format!(
                "job.max_failures = {max}{}",
                if self.rc.losses.is_empty() {
                    String::new()
                } else {
                    format!(" reached (before: {})", self.rc.losses.join("; "))
                }
            ))
        } else if model {
            self.model_unrestorable(id)
        } else if self.holds_input(id) && self.survivors(id).next().is_none() {
            Some(if self.rc.plan_running() {
                "no other worker is left that the running plan does not delete or switch".into()
            } else {
                "no other worker is left".into()
            })
        } else {
            None
        }
    }

    /// Why the model blocks of `id` cannot be restored (or, for a model
    /// rebuilt from the workers' state, created empty elsewhere); `None`
    /// when they can.
    fn model_unrestorable(&self, id: EvaluatorId) -> Option<String> {
        if self.recounts_on_loss() {
            self.restorers(id)
                .next()
                .is_none()
                .then(|| "no other evaluator is left to hold its model blocks".into())
        } else if !self.config.checkpoint.enabled {
            Some(
                "its model blocks have no checkpoint to be restored from \
                 (checkpoint.enabled = false)"
                    .into(),
            )
        } else if self.ck.newest().is_none() {
            Some(format!(
                "no checkpoint has been published yet to restore its model blocks from \
                 (checkpoint.every_epochs = {}, checkpoint.every_secs = {})",
                self.config.checkpoint.every_epochs, self.config.checkpoint.every_secs
            ))
        } else if self.restorers(id).next().is_none() {
            Some("no other evaluator is left to hold its model blocks".into())
        } else {
            None
        }
    }

    /// The model blocks `id` owns or is restoring.
    fn model_blocks_of(&self, id: EvaluatorId) -> Vec<BlockId> {
        let mut blocks = self.owners.blocks_of(MODEL_TABLE, id);
        for r in self.rc.restores.iter().filter(|r| r.to == id) {
            blocks.extend(&r.blocks);
        }
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    }

    /// Whether a move of model blocks to `id` is under way.
    fn model_moving_to(&self, id: EvaluatorId) -> bool {
        self.rc
            .moves
            .values()
            .any(|m| m.to == id && m.table == MODEL_TABLE)
    }

    /// Whether `id` holds input blocks, is re-reading some, or is an end
    /// of a re-read of the running plan.
    fn holds_input(&self, id: EvaluatorId) -> bool {
        !self.owners.blocks_of(INPUT_TABLE, id).is_empty()
            || self.rc.recoveries.iter().any(|r| r.to == id)
            || self.rc.reloads.iter().any(|r| r.from == id || r.to == id)
            || self
                .rc
                .moves
                .values()
                .any(|m| m.to == id && m.table == INPUT_TABLE)
    }

    /// Who may hold a lost evaluator's model blocks: the other servers, or
    /// the workers when no server is left; never one the running plan
    /// deletes or switches.
    fn restorers(&self, id: EvaluatorId) -> impl Iterator<Item = EvaluatorId> + '_ {
        let alive = move |e: &&crate::am::job::Evaluator| {
            e.id != id && !e.gone && e.connected && !self.rc.is_changing(e.id)
        };
        let servers = self
            .evaluators
            .values()
            .filter(alive)
            .any(|e| e.role == Role::Server);
        let role = if servers { Role::Server } else { Role::Worker };
        self.evaluators
            .values()
            .filter(alive)
            .filter(move |e| e.role == role)
            .map(|e| e.id)
    }

    /// Whether a lost server's blocks are being restored.
    pub(in crate::am::job) fn restoring(&self) -> bool {
        !self.rc.restores.is_empty()
    }

    /// Whether a lost worker's input blocks are being re-read (their
    /// worker-local state has no live owner until they land).
    pub(in crate::am::job) fn rereading(&self) -> bool {
        !self.rc.recoveries.is_empty()
    }

    /// The workers that would remain without `id`, but for those the
    /// running plan deletes or switches.
    fn survivors(&self, id: EvaluatorId) -> impl Iterator<Item = EvaluatorId> + '_ {
        self.evaluators
            .values()
            .filter(move |e| {
                e.id != id
                    && !e.gone
                    && e.connected
                    && e.role == Role::Worker
                    && !self.rc.is_changing(e.id)
            })
            .map(|e| e.id)
    }

    /// Survives the loss of `id` (`cause` says how it was lost) if
    /// [`Driver::unsurvivable`] allows; else returns why it cannot be.
    pub(in crate::am::job) async fn try_survive(
        &mut self,
        id: EvaluatorId,
        cause: &str,
    ) -> Result<(), String> {
        match self.unsurvivable(id) {
            None => {
                self.survive_loss(id, cause).await;
                Ok(())
            }
            Some(why_not) => Err(why_not),
        }
    }

    /// Lets the lost evaluator `id` go (see the module's doc); `cause` says how
    /// it was lost. Call only when [`Driver::unsurvivable`] says it can be.
    async fn survive_loss(&mut self, id: EvaluatorId, cause: &str) {
        let text = format!("{} lost: {cause}", self.describe(id));
        tracing::warn!("{text}; the job goes on without it");
        self.rc.losses.push(text.clone());
        // Its model blocks still moving stay arriving at their destination
        // until the move is called off there: one created empty goes to
        // another evaluator.
        let arriving: BTreeMap<BlockId, EvaluatorId> = self
            .rc
            .moves
            .values()
            .filter(|m| m.from == id && m.table == MODEL_TABLE)
            .flat_map(|m| m.ids.iter().map(move |&b| (b, m.to)))
            .filter(|&(b, _)| self.owners.owner(MODEL_TABLE, b) == Some(id))
            .collect();
        let abandoned = self.abandon_plan_ops(id);
        let model = self.model_blocks_of(id);
        self.checkpoint_lost(id);
        let Some(e) = self.evaluators.get_mut(&id) else {
            return;
        };
        e.gone = true;
        e.connected = false;
        e.role = Role::Idle;
        e.awaiting = None;
        e.conn_cancel.cancel();
        let container = e.container.clone();
        if self.pending_loss.as_ref().is_some_and(|l| l.eval == id) {
            self.pending_loss = None;
        }
        if let Err(e) = self.links.rm.release(&container).await {
            tracing::warn!("releasing container {container} of a lost evaluator: {e}");
        }
        self.rc.metrics.forget(id);
        self.recount_lost(id);
        self.broadcast_peers().await;
        self.release_clocks().await;
        if !model.is_empty() {
            self.restore_model(id, model, &text, &arriving).await;
        }
        if self.recounts_on_loss() {
            self.need_recount(&text);
        }

        // Its blocks, those it was itself re-reading for another loss, and
        // those of a re-read to it that the plan gave up; not those a
        // survivor is already reading in their place.
        let mut blocks = self.owners.blocks_of(INPUT_TABLE, id);
        self.rc.recoveries.retain(|r| {
            if r.to == id {
                blocks.extend(&r.blocks);
            }
            r.to != id
        });
        blocks.extend(&abandoned.reread);
        blocks.retain(|b| !abandoned.covered.contains(b));
        blocks.sort_unstable();
        blocks.dedup();
        if blocks.is_empty() {
            return;
        }
        self.reread_input(id, &blocks).await;
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "{text}; its {} re-read by the other workers",
            plural(blocks.len() as u32, "input block")
        )));
    }

    /// Deals input `blocks` of the lost `lost` to the surviving workers, the
    /// least loaded first, each told to re-read its share from the job's
    /// input.
    async fn reread_input(&mut self, lost: EvaluatorId, blocks: &[BlockId]) {
        let load = self
            .survivors(lost)
            .map(|w| (self.owners.blocks_of(INPUT_TABLE, w).len(), w))
            .collect();
        for (to, blocks) in deal(load, blocks) {
            self.send_reread(to, blocks).await;
        }
    }

    /// Tells `to` to re-read input `blocks` of a lost worker, their
    /// worker-local state restored from the newest published checkpoint
    /// where it holds it, and remembers it.
    async fn send_reread(&mut self, to: EvaluatorId, blocks: Vec<BlockId>) {
        let splits = blocks
            .iter()
            .filter_map(|&b| self.splits.get(b.index()).map(|s| (b, s.clone())))
            .collect();
        let state = self.ck.newest().and_then(|m| {
            let folder = checkpoint::folder(&self.config.checkpoint.dir, m.id);
            m.saved_state(&folder, blocks.iter().copied(), self.splits.len() as u32)
        });
        self.rc.recoveries.push(Recovery {
            to,
            blocks,
            since: Instant::now(),
        });
        let msg = AmToEval::LoadInput {
            blocks: splits,
            state,
        };
        self.send(to, msg).await;
    }

    /// Stops the running plan because `lost` was lost (see the module's
    /// doc): nothing more starts; its operations involving `lost` end as
    /// failed, the rest may finish. Returns what the recovery must still
    /// do for the blocks those operations were carrying.
    fn abandon_plan_ops(&mut self, lost: EvaluatorId) -> Abandoned {
        let mut out = Abandoned::default();
        let Some(p) = &mut self.rc.plan else {
            return out;
        };
        p.tracker.cancel();
        let failed = |what: String| Err(OpError::new(format!("{what}: evaluator {lost} was lost")));
        let moves: Vec<u64> = self
            .rc
            .moves
            .iter()
            .filter(|(_, m)| m.from == lost || m.to == lost)
            .map(|(&k, _)| k)
            .collect();
        for k in moves {
            let Some(m) = self.rc.moves.remove(&k) else {
                continue;
            };
            // Blocks not reported moved from a lost source are still its
            // own in the table, recovered with its blocks. A block still
            // moving from a live source to the lost one stays with the
            // source (its transfer fails, the source keeps it); one
            // reported landed later is recovered then
            // ([`Driver::landed_at_lost`]).
            let what = format!(
                "move of {} blocks from evaluator {} to {}",
                m.blocks, m.from, m.to
            );
            self.rc.op_done(m.op, failed(what));
        }
        for r in std::mem::take(&mut self.rc.reloads) {
            if r.from != lost && r.to != lost {
                self.rc.reloads.push(r);
                continue;
            }
            let what = format!(
                "re-read of {} input blocks from evaluator {} at {}",
                r.blocks.len(),
                r.from,
                r.to
            );
            self.rc.op_done(r.op, failed(what));
            if r.from == lost && r.loading_since.is_some() {
                // The destination is reading them already: that is their
                // recovery.
                out.covered.extend(&r.blocks);
                self.rc.recoveries.push(Recovery {
                    to: r.to,
                    blocks: r.blocks,
                    since: Instant::now(),
                });
            } else if r.to == lost {
                // The source has dropped them, or drops them on the
                // command already sent: a survivor reads them.
                out.reread.extend(r.blocks);
            }
        }
        if let Some(d) = self.rc.deletes.remove(&lost) {
            self.rc
                .op_done(d.op, failed(format!("delete of evaluator {lost}")));
        }
        if let Some(sw) = self.rc.switches.remove(&lost) {
            self.rc
                .op_done(sw.op, failed(format!("switch of evaluator {lost}")));
        }
        if let Some(a) = self.rc.joining.remove(&lost) {
            self.rc.op_done(a.op, failed(format!("add `{}`", a.name)));
        }
        let running = self
            .rc
            .plan
            .as_ref()
            .map_or(0, |p| p.tracker.running().count());
        tracing::warn!(
            "the running plan stops: evaluator {lost} was lost; {} still under way may finish",
            plural(running as u32, "operation")
        );
        out
    }

    /// A moved block landed at `lost` after it was lost (the source
    /// reported it late): recovered like the lost evaluator's own blocks.
    /// A worker's state block is read again with its input block, where
    /// that input block is now.
    pub(super) async fn landed_at_lost(
        &mut self,
        table: TableId,
        block: BlockId,
        lost: EvaluatorId,
    ) -> Result<(), AmError> {
        let text = format!("block {block} of table {table} landed at the lost evaluator {lost}");
        if table == MODEL_TABLE {
            if let Some(why) = self.model_unrestorable(lost) {
                return Err(AmError::JobFailed(format!(
                    "{text}, and cannot be restored: {why}"
                )));
            }
            tracing::warn!("{text}; it is recovered as the lost evaluator's own");
            self.restore_model(lost, vec![block], &text, &BTreeMap::new())
                .await;
            if self.recounts_on_loss() {
                self.need_recount(&text);
            }
            return Ok(());
        }
        let at = self.owners.owner(INPUT_TABLE, block);
        if table == STATE_TABLE {
            // Its input block stayed at the source (alive: it reads both
            // again) or is the lost one's (re-read with its blocks).
            let Some(at) = at.filter(|&w| self.survivors(lost).any(|s| s == w)) else {
                return Ok(());
            };
            tracing::warn!("{text}; evaluator {at} reads its input block again");
            self.send_reread(at, vec![block]).await;
            return Ok(());
        }
        if table != INPUT_TABLE {
            return Ok(());
        }
        if self.survivors(lost).next().is_none() {
            return Err(AmError::JobFailed(format!(
                "{text}, and no worker is left to read it again"
            )));
        }
        tracing::warn!("{text}; a surviving worker reads it again");
        self.reread_input(lost, &[block]).await;
        Ok(())
    }

    /// Deals the model blocks of the lost `id` to the restorers, the least
    /// loaded first: each is told to restore its share from the newest
    /// checkpoint, and then everyone learns the new owners; under SSP the
    /// clocks roll back to the checkpoint's before that. A model rebuilt
    /// from the workers' state is created empty instead, each block where
    /// it is not `arriving`.
    async fn restore_model(
        &mut self,
        id: EvaluatorId,
        blocks: Vec<BlockId>,
        text: &str,
        arriving: &BTreeMap<BlockId, EvaluatorId>,
    ) {
        self.rc.restores.retain(|r| r.to != id);
        if self.recounts_on_loss() {
            self.create_model(id, blocks, text, arriving).await;
            return;
        }
        let Some(m) = self.ck.newest().cloned() else {
            return;
        };
        let folder = checkpoint::folder(&self.config.checkpoint.dir, m.id);
        let epoch = m.epoch;
        let load = self
            .restorers(id)
            .map(|e| (self.owners.blocks_of(MODEL_TABLE, e).len(), e))
            .collect();
        let mut owners = Vec::new();
        for (to, blocks) in deal(load, &blocks) {
            owners.extend(blocks.iter().map(|&b| (MODEL_TABLE, b, to)));
            self.send_restore(id, to, &folder, blocks).await;
        }
        if self.config.job.sync == SyncMode::Ssp {
            let why = format!("the model blocks of lost evaluator {id} restored from it");
            self.roll_back_clocks(&m, &folder, &why).await;
        }
        self.broadcast_ownership(owners).await;
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "{text}; its {} restored from checkpoint {folder} (epoch {epoch})",
            plural(blocks.len() as u32, "model block")
        )));
    }

    /// Deals the model blocks of the lost `id` to the restorers, the least
    /// loaded first, each told to create its share empty, and then
    /// everyone learns the new owners: a model rebuilt from the workers'
    /// state, whose recount fills them. A block a move of the lost
    /// evaluator was carrying (`arriving`: block → destination) may still
    /// be arriving at its destination, where it cannot be created: it goes
    /// to another restorer while there is one.
    async fn create_model(
        &mut self,
        id: EvaluatorId,
        blocks: Vec<BlockId>,
        text: &str,
        arriving: &BTreeMap<BlockId, EvaluatorId>,
    ) {
        let mut load: Vec<(usize, EvaluatorId)> = self
            .restorers(id)
            .map(|e| (self.owners.blocks_of(MODEL_TABLE, e).len(), e))
            .collect();
        let mut dealt: BTreeMap<EvaluatorId, Vec<BlockId>> = BTreeMap::new();
        for &b in &blocks {
            load.sort_unstable();
            let avoid = arriving.get(&b);
            let Some(i) = load
                .iter()
                .position(|(_, e)| Some(e) != avoid)
                .or((!load.is_empty()).then_some(0))
            else {
                break;
            };
            load[i].0 += 1;
            dealt.entry(load[i].1).or_default().push(b);
        }
        let mut owners = Vec::new();
        for (to, dealt) in dealt {
            owners.extend(dealt.iter().map(|&b| (MODEL_TABLE, b, to)));
            let msg = AmToEval::CreateBlocks {
                table: MODEL_TABLE,
                blocks: dealt,
            };
            self.send(to, msg).await;
        }
        self.broadcast_ownership(owners).await;
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "{text}; its {} created empty on the other evaluators, to be recounted",
            plural(blocks.len() as u32, "model block")
        )));
    }

    /// Tells `to` to restore `blocks` of the lost `lost` from the
    /// checkpoint in `folder`, and remembers it.
    async fn send_restore(
        &mut self,
        lost: EvaluatorId,
        to: EvaluatorId,
        folder: &str,
        blocks: Vec<BlockId>,
    ) {
        let Some(m) = self.ck.newest_at(&self.config.checkpoint.dir, folder) else {
            return;
        };
        let files = blocks
            .iter()
            .filter_map(|&b| m.file_of(MODEL_TABLE, b).cloned())
            .collect();
        self.send(
            to,
            AmToEval::RestoreBlocks {
                lost,
                folder: folder.to_string(),
                files,
            },
        )
        .await;
        self.rc.restores.push(Restore {
            lost,
            to,
            folder: folder.to_string(),
            blocks,
            since: Instant::now(),
        });
    }

    /// A survivor restored (or failed to restore) model blocks of a lost
    /// server. A failure is retried from the checkpoint before the one
    /// that failed (under SSP the clocks roll back to that one's first);
    /// with none left, the job fails naming the file.
    pub(in crate::am::job) async fn on_blocks_restored(
        &mut self,
        id: EvaluatorId,
        folder: String,
        blocks: Vec<BlockId>,
        result: Result<(), String>,
    ) -> Result<(), AmError> {
        let Some(r) = take_first(&mut self.rc.restores, |r| {
            r.to == id && r.folder == folder && r.blocks == blocks
        }) else {
            return Ok(());
        };
        let error = match result {
            Ok(()) => {
                tracing::info!(
                    to = %id,
                    lost = %r.lost,
                    ?blocks,
                    %folder,
                    secs = r.since.elapsed().as_secs_f64(),
                    "a lost server's model blocks restored"
                );
                return Ok(());
            }
            Err(e) => e,
        };
        let dir = self.config.checkpoint.dir.clone();
        let Some(older) = self.ck.before(&dir, &folder).cloned() else {
            return Err(AmError::JobFailed(format!(
                "restoring the model blocks {blocks:?} of lost evaluator {} on {}: {error} \
                 (no older checkpoint is kept)",
                r.lost,
                self.describe(id)
            )));
        };
        let older_folder = checkpoint::folder(&dir, older.id);
        let text = format!(
            "restoring model blocks {blocks:?} on {} from {folder} failed: {error}; \
             using the checkpoint before, {older_folder}",
            self.describe(id)
        );
        tracing::warn!("{text}");
        if self.config.job.sync == SyncMode::Ssp {
            let why = format!("model blocks {blocks:?} restored from it instead");
            self.roll_back_clocks(&older, &older_folder, &why).await;
        }
        self.send_restore(r.lost, id, &older_folder, blocks).await;
        Ok(())
    }

    /// Input blocks loaded while training: blocks of a lost worker have
    /// landed at a survivor, which owns them from now on. Returns whether
    /// the message belonged to a recovery.
    pub(in crate::am::job) async fn on_input_recovered(
        &mut self,
        id: EvaluatorId,
        loaded: &[(BlockId, u64, u64)],
    ) -> bool {
        let blocks: Vec<BlockId> = loaded.iter().map(|l| l.0).collect();
        let Some(r) = take_first(&mut self.rc.recoveries, |r| {
            r.to == id && r.blocks == blocks
        }) else {
            return false;
        };
        self.input_loaded_by(id, &blocks).await;
        tracing::info!(
            to = %id,
            ?blocks,
            secs = r.since.elapsed().as_secs_f64(),
            "a lost worker's input blocks re-read"
        );
        true
    }

    /// The losses survived so far, in words.
    pub(in crate::am::job) fn losses(&self) -> &[String] {
        &self.rc.losses
    }
}

/// What stopping a running plan for a loss leaves the recovery to do.
#[derive(Default)]
struct Abandoned {
    /// Input blocks of re-reads to the lost evaluator: a survivor reads them.
    reread: Vec<BlockId>,
    /// The lost evaluator's input blocks a survivor already reads.
    covered: BTreeSet<BlockId>,
}

/// Deals `blocks` one at a time to the evaluator holding the fewest, given
/// how many each holds (`load`).
fn deal(
    mut load: Vec<(usize, EvaluatorId)>,
    blocks: &[BlockId],
) -> BTreeMap<EvaluatorId, Vec<BlockId>> {
    let mut dealt: BTreeMap<EvaluatorId, Vec<BlockId>> = BTreeMap::new();
    for &b in blocks {
        load.sort_unstable();
        let Some(least) = load.first_mut() else {
            break;
        };
        least.0 += 1;
        dealt.entry(least.1).or_default().push(b);
    }
    dealt
}
