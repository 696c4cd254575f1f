//! Surviving a lost evaluator while training. An evaluator whose process
//! ended, whose connection dropped or that fell silent is let go: its
//! container is released (a hung process is killed with it) and the other
//! members learn it has left. The other workers never stop; under SSP the
//! lost worker no longer holds their clocks back.
//!
//! - A lost worker's input blocks are re-read from the job's input by the
//!   surviving workers, the least loaded first. Its worker-local state is
//!   rebuilt as at the start (NMF's row factors are drawn again; state is
//!   not checkpointed).
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
//!
//! What cannot be survived fails the job, and the message says
//! why ([`Driver::unsurvivable`]): a lost server without a published
//! checkpoint, under SSP (its restored blocks would be older than the
//! clocks the workers passed), or of LDA (counts must agree with the
//! workers' assignments); a loss while a plan runs or outside training; an
//! LDA worker (its topic assignments are counted in the model); more
//! losses than `job.max_failures`.

use std::collections::BTreeMap;
use std::time::Instant;

use cruise_conf::{AppKind, SyncMode};
use cruise_container::checkpoint;
use cruise_container::protocol::{AmToEval, BlockId, EvaluatorId, INPUT_TABLE, MODEL_TABLE};

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
        let model = !self.model_blocks_of(id).is_empty();
        if let Some(f) = self.pending_fatal.as_ref().filter(|f| f.eval == id) {
            Some(format!("it failed: {}", f.error))
        } else if self.phase != Phase::Training {
            Some(format!(
                "losses are survived while training, and the job is {}",
                self.phase.name()
            ))
        } else if !model && e.role != Role::Worker {
            Some("only workers and evaluators holding model blocks are survived".into())
        } else if self.rc.plan.is_some() {
            Some("a plan is running".into())
        } else if self.config.job.app == AppKind::Lda {
            Some(if model {
                "an LDA server's word-topic counts must agree with the workers' topic \
                 assignments, which a checkpoint's older counts do not"
                    .into()
            } else {
                "an LDA worker's topic assignments are counted in the model and cannot be re-read"
                    .into()
            })
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
        } else if self.survivors(id).next().is_none() {
            Some("no other worker is left".into())
        } else {
            None
        }
    }

    /// Why the model blocks of `id` cannot be restored; `None` when they can.
    fn model_unrestorable(&self, id: EvaluatorId) -> Option<String> {
        if !self.config.checkpoint.enabled {
            Some(
                "its model blocks have no checkpoint to be restored from \
                 (checkpoint.enabled = false)"
                    .into(),
            )
        } else if self.config.job.sync == SyncMode::Ssp {
            Some(
                "under ssp its blocks restored from a checkpoint would be older than the \
                 clocks the workers have passed (a lost server is survived with job.sync = async)"
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

    /// Who may hold a lost evaluator's model blocks: the other servers, or
    /// the workers when no server is left.
    fn restorers(&self, id: EvaluatorId) -> impl Iterator<Item = EvaluatorId> + '_ {
        let alive = move |e: &&crate::am::job::Evaluator| e.id != id && !e.gone && e.connected;
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

    /// The workers that would remain without `id`.
    fn survivors(&self, id: EvaluatorId) -> impl Iterator<Item = EvaluatorId> + '_ {
        self.evaluators
            .values()
            .filter(move |e| e.id != id && !e.gone && e.connected && e.role == Role::Worker)
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
        self.broadcast_peers().await;
        self.release_clocks().await;
        if !model.is_empty() {
            self.restore_model(id, model, &text).await;
        }

        // Its blocks, and those it was itself re-reading for another loss.
        let mut blocks = self.owners.blocks_of(INPUT_TABLE, id);
        self.rc.recoveries.retain(|r| {
            if r.to == id {
                blocks.extend(&r.blocks);
            }
            r.to != id
        });
        blocks.sort_unstable();
        blocks.dedup();
        if blocks.is_empty() {
            return;
        }
        let load = self
            .survivors(id)
            .map(|w| (self.owners.blocks_of(INPUT_TABLE, w).len(), w))
            .collect();
        for (to, blocks) in deal(load, &blocks) {
            let splits = blocks
                .iter()
                .filter_map(|&b| self.splits.get(b.index()).map(|s| (b, s.clone())))
                .collect();
            self.rc.recoveries.push(Recovery {
                to,
                blocks,
                since: Instant::now(),
            });
            self.send(to, AmToEval::LoadInput { blocks: splits }).await;
        }
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "{text}; its {} re-read by the other workers",
            plural(blocks.len() as u32, "input block")
        )));
    }

    /// Deals the model blocks of the lost `id` to the restorers, the least
    /// loaded first: each is told to restore its share from the newest
    /// checkpoint, and then everyone learns the new owners.
    async fn restore_model(&mut self, id: EvaluatorId, blocks: Vec<BlockId>, text: &str) {
        self.rc.restores.retain(|r| r.to != id);
        let Some(m) = self.ck.newest() else {
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
        self.broadcast_ownership(owners).await;
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "{text}; its {} restored from checkpoint {folder} (epoch {epoch})",
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
    /// that failed; with none left, the job fails naming the file.
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
        let Some(older) = self.ck.before(&dir, &folder).map(|m| m.id) else {
            return Err(AmError::JobFailed(format!(
                "restoring the model blocks {blocks:?} of lost evaluator {} on {}: {error} \
                 (no older checkpoint is kept)",
                r.lost,
                self.describe(id)
            )));
        };
        let older = checkpoint::folder(&dir, older);
        tracing::warn!(
            "restoring model blocks {blocks:?} on {} from {folder} failed: {error}; \
             using the checkpoint before, {older}",
            self.describe(id)
        );
        self.send_restore(r.lost, id, &older, blocks).await;
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
