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

use cruise_container::apps::model_rebuilt_on_resume;
use cruise_container::checkpoint::SavedState;
use cruise_container::protocol::{AmToEval, BlockId, EvaluatorId, MODEL_TABLE};
use cruise_hdfs::Split;

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

    /// As training starts: a resumed job counts on from its checkpoint's
    /// epochs and records (the epochs before it as its history told them),
    /// and its workers' clocks start at the checkpoint's epoch.
    pub(super) async fn carry_progress_over(&mut self) {
        let Some(r) = self.resume.as_ref() else {
            return;
        };
        if !self.epochs.is_empty() {
            return;
        }
        let m = &r.manifest;
        let epoch = m.epoch.min(self.config.job.epochs);
        let per_epoch = self.records_per_epoch;
        let from = u64::from(epoch) * per_epoch;
        self.records_done = m
            .records_done
            .clamp(from, (from + per_epoch).saturating_sub(1).max(from));
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
        self.min_clock_sent = epoch;
        for id in self.with_role(Role::Worker) {
            self.send(id, AmToEval::Clock { min_clock: epoch }).await;
        }
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
