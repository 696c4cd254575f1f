//! Checkpoints, as part of the job's event loop: when one is due, the
//! evaluators holding model blocks — and, for apps whose worker-local
//! state checkpoints hold (`apps::state_in_checkpoints`: NMF, LDA), those
//! holding state blocks — are asked to write theirs (`Checkpoint`; each
//! copies each block under its own lock, so training never pauses); once
//! every block is written the manifest is published off the loop, on the
//! job's tracker (`cruise_container::checkpoint::publish`: written,
//! renamed into place, older checkpoints pruned), and the loop hears of it
//! as [`Event::CheckpointPublished`]. This module owns the checkpoint being
//! taken and the published ones, newest last, that a lost server's blocks
//! are restored from, and a lost worker's blocks take their state from
//! (`reconfigure/recovery.rs`).
//!
//! One checkpoint is taken at a time, never while a plan runs, a lost
//! server's blocks are being restored or (apps with checkpointed state) a
//! lost worker's blocks are being re-read (a block moving while
//! checkpoints are written could be written by neither end; a block being
//! re-read has no state to write yet). One that cannot be completed — an
//! evaluator failed to write, was lost, or a block moved meanwhile — is
//! given up with a warning; the next is taken when due.
//!
//! A manifest records the epochs and records done and the workers' clock
//! (the slowest one's) when it was asked for. A clock rollback (SSP,
//! `from_checkpoint.rs`) gives up the checkpoint under way, and one asked
//! for before it that is published after is not restored from: its blocks
//! are of the epochs the rollback abandoned, newer than the ones trained
//! again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cruise_container::apps::state_in_checkpoints;
use cruise_container::checkpoint::{self, BlockFile, MAX_CHECKPOINT_TIME, Manifest};
use cruise_container::protocol::{AmToEval, EvaluatorId, MODEL_TABLE, STATE_TABLE, TableId};
use cruise_hdfs::FileSystem;

use crate::am::{CheckpointInfo, Event};

use super::{Driver, Phase};

/// The job's checkpoints (see the module's doc).
pub(super) struct Checkpoints {
    fs: FileSystem,
    next_id: u64,
    taking: Option<Taking>,
    /// Published, oldest first; at most [`checkpoint::KEEP`].
    published: Vec<Manifest>,
    /// Epochs done when the last checkpoint was asked for.
    last_epoch: u32,
    /// When the last was asked for (or training started).
    last_at: Option<Instant>,
    /// Checkpoints published so far.
    published_total: u64,
    /// Checkpoints numbered below this were asked for before the last
    /// clock rollback: one published after it is not restored from.
    void_below: u64,
}

/// The checkpoint being taken.
struct Taking {
    id: u64,
    epoch: u32,
    records_done: u64,
    clock: u32,
    since: Instant,
    /// Evaluators that have not written their blocks yet.
    waiting: BTreeSet<EvaluatorId>,
    files: Vec<BlockFile>,
    /// Every block written; the manifest is being published.
    publishing: bool,
}

impl Checkpoints {
    /// A new job's checkpoints; a resumed job's are numbered from `next`
    /// on, and the one it resumes from, the newest published, is `m` in
    /// `resumed: (m, next)`.
    pub(super) fn new(fs: FileSystem, resumed: Option<(Manifest, u64)>) -> Self {
        let (resumed, next_id) = match resumed {
            Some((m, next)) => (Some(m), next),
            None => (None, 1),
        };
        Checkpoints {
            fs,
            next_id,
            taking: None,
            last_epoch: resumed.as_ref().map_or(0, |m| m.epoch),
            published: resumed.into_iter().collect(),
            last_at: None,
            published_total: 0,
            void_below: 0,
        }
    }

    /// The newest published checkpoint.
    pub(super) fn newest(&self) -> Option<&Manifest> {
        self.published.last()
    }

    /// The published checkpoint in `folder`.
    pub(super) fn newest_at(&self, dir: &str, folder: &str) -> Option<&Manifest> {
        self.published
            .iter()
            .rev()
            .find(|m| checkpoint::folder(dir, m.id) == folder)
    }

    /// The newest published checkpoint older than the one in `folder`.
    pub(super) fn before(&self, dir: &str, folder: &str) -> Option<&Manifest> {
        let i = self
            .published
            .iter()
            .position(|m| checkpoint::folder(dir, m.id) == folder)?;
        i.checked_sub(1).and_then(|j| self.published.get(j))
    }

    /// The newest published checkpoint, for the status.
    pub(super) fn info(&self, dir: &str) -> Option<CheckpointInfo> {
        self.newest().map(|m| CheckpointInfo {
            id: m.id,
            epoch: m.epoch,
            folder: checkpoint::folder(dir, m.id),
        })
    }

    /// Checkpoints published so far.
    pub(super) fn count(&self) -> u64 {
        self.published_total
    }
}

impl Driver {
    fn checkpoint_dir(&self) -> &str {
        &self.config.checkpoint.dir
    }

    /// The tables a checkpoint holds, with their blocks: the model, and
    /// the worker-local state of apps whose state checkpoints hold.
    fn checkpointed_tables(&self) -> Vec<(TableId, u32)> {
        let mut tables = vec![(MODEL_TABLE, self.config.store.model_blocks)];
        if state_in_checkpoints(self.config.job.app) {
            tables.push((STATE_TABLE, self.splits.len() as u32));
        }
        tables
    }

    /// Training started: the time to the first checkpoint counts from now.
    pub(super) fn checkpoints_start(&mut self) {
        self.ck.last_at = Some(Instant::now());
    }

    /// Takes a checkpoint if one is due (`checkpoint.every_epochs`,
    /// `checkpoint.every_secs`) and none is under way.
    pub(super) async fn maybe_checkpoint(&mut self) {
        let c = &self.config.checkpoint;
        let epochs = self.epochs.len() as u32;
        if !c.enabled
            || self.phase != Phase::Training
            || self.ck.taking.is_some()
            || self.rc.plan_running()
            || self.restoring()
            || self.recounting()
            || (self.rereading() && state_in_checkpoints(self.config.job.app))
            || epochs >= self.config.job.epochs
        {
            return;
        }
        let by_epochs = c.every_epochs > 0 && epochs >= self.ck.last_epoch + c.every_epochs;
        let by_time = c.every_secs > 0
            && self
                .ck
                .last_at
                .is_some_and(|t| t.elapsed() >= Duration::from_secs(c.every_secs));
        if !by_epochs && !by_time {
            return;
        }
        let id = self.ck.next_id;
        self.ck.next_id += 1;
        self.ck.last_epoch = epochs;
        self.ck.last_at = Some(Instant::now());
        let folder = checkpoint::folder(self.checkpoint_dir(), id);
        let holders: BTreeSet<EvaluatorId> = self
            .checkpointed_tables()
            .into_iter()
            .flat_map(|(table, _)| self.owners.owners_of(table))
            .filter(|e| {
                self.evaluators
                    .get(e)
                    .is_some_and(|e| e.connected && !e.gone)
            })
            .collect();
        tracing::debug!(id, %folder, ?holders, "taking a checkpoint");
        for &e in &holders {
            let folder = folder.clone();
            self.send(e, AmToEval::Checkpoint { id, folder }).await;
        }
        self.ck.taking = Some(Taking {
            id,
            epoch: epochs,
            records_done: self.records_done,
            clock: self.min_clock_sent,
            since: Instant::now(),
            waiting: holders,
            files: Vec::new(),
            publishing: false,
        });
    }

    /// Gives the checkpoint under way up, saying why.
    fn give_up_checkpoint(&mut self, why: &str) {
        if let Some(t) = self.ck.taking.take() {
            tracing::warn!("checkpoint {} given up: {why}", t.id);
        }
    }

    /// An evaluator wrote its blocks of checkpoint `id` (or failed to).
    pub(super) fn on_checkpoint_written(
        &mut self,
        from: EvaluatorId,
        id: u64,
        result: Result<Vec<BlockFile>, String>,
    ) {
        if self.ck.taking.as_ref().is_none_or(|t| t.id != id) {
            return;
        }
        let files = match result {
            Ok(files) => files,
            Err(e) => {
                let why = format!("{}: {e}", self.describe(from));
                self.give_up_checkpoint(&why);
                return;
            }
        };
        let Some(t) = self.ck.taking.as_mut() else {
            return;
        };
        t.files.extend(files);
        t.waiting.remove(&from);
        if t.waiting.is_empty() && !t.publishing {
            self.publish_checkpoint();
        }
    }

    /// Every holder has written: publishes the manifest off the loop, if
    /// every block of every table it holds is in it.
    fn publish_checkpoint(&mut self) {
        let tables = self.checkpointed_tables();
        let Some(t) = self.ck.taking.as_mut() else {
            return;
        };
        // A block moved between two holders' writes may be written twice.
        let mut by_block: BTreeMap<_, BlockFile> = BTreeMap::new();
        for f in t.files.drain(..) {
            by_block.entry((f.table, f.block)).or_insert(f);
        }
        for &(table, n) in &tables {
            let written = by_block.keys().filter(|k| k.0 == table).count();
            if written != n as usize {
                let what = if table == MODEL_TABLE {
                    "model blocks"
                } else {
                    "worker-local state blocks"
                };
                let why =
                    format!("{written} of the {n} {what} were written (a block moved meanwhile)");
                self.give_up_checkpoint(&why);
                return;
            }
        }
        t.publishing = true;
        let manifest = Manifest {
            format: checkpoint::FORMAT,
            job_id: self.job_id.clone(),
            id: t.id,
            epoch: t.epoch,
            records_done: t.records_done,
            clock: Some(t.clock),
            tables,
            blocks: by_block.into_values().collect(),
            published_unix_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let (fs, dir) = (self.ck.fs.clone(), self.checkpoint_dir().to_string());
        let (events, cancel) = (self.links.events.clone(), self.links.cancel.clone());
        self.links.tracker.spawn(async move {
            let result = tokio::select! {
                r = checkpoint::publish(&fs, &dir, &manifest) => r.map_err(|e| e.to_string()),
                _ = cancel.cancelled() => return,
            };
            let manifest = Box::new(manifest);
            let _ = events
                .send(Event::CheckpointPublished { manifest, result })
                .await;
        });
    }

    /// The manifest of the checkpoint under way was published (or not).
    pub(super) fn on_checkpoint_published(
        &mut self,
        manifest: Manifest,
        result: Result<(), String>,
    ) {
        if self.ck.taking.as_ref().is_some_and(|t| t.id == manifest.id) {
            self.ck.taking = None;
        }
        match result {
            Ok(()) if manifest.id < self.ck.void_below => tracing::warn!(
                "checkpoint {} was asked for before the clocks rolled back; \
                 it is not restored from",
                manifest.id
            ),
            Ok(()) => {
                tracing::info!(
                    id = manifest.id,
                    epoch = manifest.epoch,
                    blocks = manifest.blocks.len(),
                    folder = %checkpoint::folder(self.checkpoint_dir(), manifest.id),
                    "checkpoint published"
                );
                self.ck.published_total += 1;
                self.ck.published.push(manifest);
                let extra = self.ck.published.len().saturating_sub(checkpoint::KEEP);
                self.ck.published.drain(..extra);
            }
            Err(e) => tracing::warn!("checkpoint {} not published: {e}", manifest.id),
        }
    }

    /// The clocks rolled back to a checkpoint of `epoch` epochs: the
    /// checkpoint under way is given up, one asked for before is not
    /// restored from, and the next is due counting from `epoch`.
    pub(super) fn rolled_back_checkpoints(&mut self, epoch: u32) {
        self.give_up_checkpoint("the clocks rolled back");
        self.ck.void_below = self.ck.next_id;
        self.ck.last_epoch = self.ck.last_epoch.min(epoch);
    }

    /// `id` was lost: a checkpoint waiting for its blocks cannot complete.
    pub(super) fn checkpoint_lost(&mut self, id: EvaluatorId) {
        if self
            .ck
            .taking
            .as_ref()
            .is_some_and(|t| t.waiting.contains(&id))
        {
            let why = format!("{} was lost before writing its blocks", self.describe(id));
            self.give_up_checkpoint(&why);
        }
    }

    /// On the loop's tick: a checkpoint under way for longer than
    /// [`MAX_CHECKPOINT_TIME`] is given up, naming who has not written.
    pub(super) fn expire_checkpoint(&mut self) {
        let Some(t) = self.ck.taking.as_ref() else {
            return;
        };
        if t.since.elapsed() > MAX_CHECKPOINT_TIME {
            let why = if t.publishing {
                "its manifest was not published in time".to_string()
            } else {
                format!(
                    "evaluators {:?} did not write their blocks within {} s",
                    t.waiting,
                    MAX_CHECKPOINT_TIME.as_secs()
                )
            };
            self.give_up_checkpoint(&why);
        }
    }
}
