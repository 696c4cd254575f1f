//! A resumed job (`cruise run --resume`, `am/resume.rs`): while loading,
//! each server reads its model blocks from the checkpoint the job resumes
//! from (`RestoreBlocks`, answered by `BlocksRestored`) instead of creating
//! them, and each worker reading its input blocks restores their
//! worker-local state from it where it holds it (NMF's row factors, LDA's
//! document state: the `state` of `LoadInput`) instead of drawing it
//! afresh. LDA's servers create their blocks as at the start instead
//! (`apps::model_rebuilt_on_resume`): the word-topic counts are rebuilt
//! from the restored assignments by the workers' first sweep. When
//! training starts, the epochs, records and clocks the checkpoint had
//! reached are carried over, so the job trains only the epochs that
//! remain.
//!
//! Also the SSP rollback: a lost server's model blocks restored from a
//! checkpoint (`reconfigure/recovery.rs`) hold the updates of the local
//! epochs before the checkpoint's clock, and the workers have passed it.
//! Before anyone learns the blocks' new owners, the job goes back to the
//! checkpoint ([`Driver::roll_back_clocks`]): its epochs done, records done
//! and every worker's clock are the checkpoint's, so the epochs after it
//! are trained again and no worker reads a restored block staler than the
//! staleness bound allows; the blocks that survived keep their newer
//! updates (fresher reads are allowed). Every evaluator is told
//! `RollBackClock` (numbered: the job's rollbacks so far) ahead of the new
//! ownership on its control channel; a worker computes on nothing pulled
//! before it heard it, flushes its pushes, goes back and answers
//! `ClockRolledBack` ([`Driver::on_clock_rolled_back`]). Until then its
//! reports and clock ticks belong to the abandoned epochs and are not
//! counted; a worker started later starts in the current rollback.

use std::time::Instant;

use cruise_container::apps::model_rebuilt_on_resume;
use cruise_container::checkpoint::{Manifest, SavedState};
use cruise_container::protocol::{AmToEval, BlockId, EvaluatorId, MODEL_TABLE, Stats};
use cruise_hdfs::Split;

use crate::am::history::Record;
use crate::am::{AmError, CheckpointInfo, Progress, Role};

use super::{Answer, Driver};

impl Driver {
    /// Whether the servers read their model blocks from the checkpoint the
    /// job resumes from (not for an app whose model its workers rebuild
    /// from their restored state).
    pub(super) fn model_from_checkpoint(&self) -> bool {
        self.resume.is_some() && !model_rebuilt_on_resume(self.config.job.app)
    }

    /// Asks server `id` to load `blocks` of the model from the checkpoint
    /// the job resumes from.
    pub(super) async fn load_from_checkpoint(&mut self, id: EvaluatorId, blocks: &[BlockId]) {
        let Some(r) = self.resume.as_ref() else {
            return;
        };
        let files = blocks
            .iter()
            .filter_map(|&b| r.manifest.file_of(MODEL_TABLE, b).cloned())
            .collect();
        let msg = AmToEval::RestoreBlocks {
            // No evaluator was lost: the blocks arrive from the checkpoint
            // at their first owner.
            lost: id,
            folder: r.folder.clone(),
            files,
        };
        self.ask(id, msg, Answer::BlocksCreated).await;
    }

    /// The worker-local state of input `blocks` in the checkpoint the job
    /// resumes from, if it was resumed and the checkpoint holds it.
    pub(super) fn resumed_state(&self, blocks: &[(BlockId, Split)]) -> Option<SavedState> {
        let r = self.resume.as_ref()?;
        let input_blocks = self.splits.len() as u32;
        r.manifest
            .saved_state(&r.folder, blocks.iter().map(|b| b.0), input_blocks)
    }

    /// While loading, server `id` loaded its model blocks from the
    /// checkpoint (or failed to: the job fails, naming the checkpoint).
    pub(super) async fn on_checkpoint_loaded(
        &mut self,
        id: EvaluatorId,
        folder: &str,
        result: Result<(), String>,
    ) -> Result<(), AmError> {
        if !self.answered(id, Answer::BlocksCreated) {
            tracing::warn!(evaluator = %id, "unexpected BlocksRestored while loading");
            return Ok(());
        }
        if let Err(e) = result {
            return Err(AmError::JobFailed(format!(
                "resuming from checkpoint {folder}: {} could not load its model blocks: {e}",
                self.describe(id)
            )));
        }
        self.maybe_start_training().await
    }

    /// The epochs done, the records done and the workers' clock that
    /// checkpoint `m` holds, within this job's epochs (the records within
    /// its epoch, the clock not past it).
    fn checkpoint_progress(&self, m: &Manifest) -> (u32, u64, u32) {
        let epoch = m.epoch.min(self.config.job.epochs);
        let per_epoch = self.records_per_epoch;
        let from = u64::from(epoch) * per_epoch;
        let records = m
            .records_done
            .clamp(from, (from + per_epoch).saturating_sub(1).max(from));
        (epoch, records, m.clock().min(epoch))
    }

    /// As training starts: a resumed job counts on from its checkpoint's
    /// epochs and records (the epochs before it as its history told them),
    /// and its workers' clocks start at the checkpoint's clock.
    pub(super) async fn carry_progress_over(&mut self) {
        let Some(r) = self.resume.as_ref() else {
            return;
        };
        if !self.epochs.is_empty() {
            return;
        }
        let (epoch, records, clock) = self.checkpoint_progress(&r.manifest);
        self.records_done = records;
        self.epochs = r.epochs.iter().take(epoch as usize).copied().collect();
        let text = format!(
            "resuming job {} from checkpoint {} (epoch {epoch} of {}, {} records done)",
            self.job_id, r.folder, self.config.job.epochs, self.records_done
        );
        tracing::info!("{text}");
        let _ = self.links.progress.send(Progress::Phase(text));
        for e in &self.epochs {
            self.record_epoch(e);
        }
        self.min_clock_sent = clock;
        for id in self.with_role(Role::Worker) {
            self.send(id, AmToEval::Clock { min_clock: clock }).await;
        }
    }

    /// SSP: model blocks of a lost server are being restored from
    /// checkpoint `m` in `folder` (`why` says whose): the job's progress
    /// and every worker's clock go back to the checkpoint's, and every
    /// evaluator is told (see the module's doc). Call before the blocks'
    /// new owners are announced.
    pub(super) async fn roll_back_clocks(&mut self, m: &Manifest, folder: &str, why: &str) {
        let (epoch, records, clock) = self.checkpoint_progress(m);
        let again = self.epochs.len().saturating_sub(epoch as usize);
        let rollback = self.current_rollback() + 1;
        let text = format!(
            "clocks rolled back to {clock}, the job to epoch {epoch} ({records} records done), \
             of checkpoint {folder}: {why}; {again} trained again",
            again = super::plural(again as u32, "epoch"),
        );
        tracing::warn!(rollback, "{text}");
        self.clock_rollbacks.push(text.clone());
        let (from_epoch, from_records) = (self.epochs.len() as u32, self.records_done);
        let from_clock = self.min_clock_sent;
        self.records_done = records;
        self.epochs.truncate(epoch as usize);
        self.window = Stats::default();
        self.epoch_started = Instant::now();
        self.min_clock_sent = clock;
        self.rolled_back_checkpoints(epoch);
        self.links.history.push(Record::Rollback {
            at_secs: self.links.history.now(),
            rollback,
            clock,
            epoch,
            records_done: records,
            from_epoch,
            from_records,
            from_clock,
            checkpoint: folder.to_string(),
        });
        let _ = self.links.progress.send(Progress::Phase(text));
        let ids: Vec<EvaluatorId> = self
            .evaluators
            .values_mut()
            .filter(|e| e.connected && !e.gone)
            .map(|e| {
                e.clock = clock;
                e.id
            })
            .collect();
        for id in ids {
            self.send(id, AmToEval::RollBackClock { rollback, clock })
                .await;
        }
    }

    /// The job's current clock rollback: how many it has had (0: none).
    pub(super) fn current_rollback(&self) -> u32 {
        self.clock_rollbacks.len() as u32
    }

    /// Worker `id` took clock rollback `rollback`: its reports count again
    /// from now on. One a later rollback has overtaken is not counted yet
    /// (the worker takes that one next).
    pub(super) async fn on_clock_rolled_back(
        &mut self,
        id: EvaluatorId,
        rollback: u32,
        clock: u32,
    ) {
        if rollback != self.current_rollback() {
            return;
        }
        let Some(e) = self.evaluators.get_mut(&id) else {
            return;
        };
        e.rollback = rollback;
        e.clock = clock;
        tracing::info!(
            evaluator = %id,
            rollback,
            "{}'s clock rolled back to {clock}",
            self.describe(id)
        );
        self.release_clocks().await;
    }

    /// The checkpoint the job resumed from, if it was resumed.
    pub(super) fn resumed_from(&self) -> Option<CheckpointInfo> {
        self.resume.as_ref().map(|r| CheckpointInfo {
            id: r.manifest.id,
            epoch: r.manifest.epoch,
            folder: r.folder.clone(),
        })
    }
}
