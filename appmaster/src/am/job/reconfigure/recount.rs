//! The recount: an app whose model is the sum of its workers' state (LDA:
//! the word-topic counts of the topic assignments,
//! `apps::model_rebuilt_on_loss`) rebuilds it after a lost worker (whose
//! assignments are counted in the model and gone) or a lost server (whose
//! counts are gone; its blocks are created empty on the survivors,
//! `recovery.rs`). No checkpoint is needed: every worker marks its state
//! uncounted, every holder of model blocks empties them, and each row's
//! next sweep counts its state in again.
//!
//! The order is what keeps the counts exact, in three rounds numbered by
//! the job's recounts so far:
//!
//! 1. `HoldForRecount` to every worker: each stops between two
//!    mini-batches, waits for every push it sent to be answered (a push
//!    lost with a lost server is sent again to its block's new owner
//!    first), marks its state uncounted and answers `RecountHeld`; it
//!    sends no push until step 3.
//! 2. Once every worker has answered, `ZeroModel` to every holder of model
//!    blocks: each waits until no connection of an evaluator that left the
//!    job is still read (a dead worker's last pushes are applied before,
//!    or never), empties its blocks and answers `ModelZeroed`.
//! 3. Once every holder has answered, `ResumeAfterRecount` to every worker.
//!
//! So every push sent before the marks is in the counts before they are
//! emptied, and every push sent after them lands on the emptied counts.
//! The other workers pause only for this: for their pushes in flight to be
//! answered and one round trip of the AM's to the servers and back (about
//! a mini-batch; in one chaos run of real processes on one host, 0.5 ms
//! from a worker's hold to its go; the lost evaluator's blocks are re-read
//! or created while they train). A recount waits for a running plan to end (its moves would
//! carry state or counts past the marks) and holds back plans and
//! checkpoints until it ends; training stops only after it (the workers
//! then count in, before they stop, what was not swept since). A loss
//! during a recount starts it again under the next number: a worker held
//! for the earlier one marks and answers again. Each round is bounded: an
//! evaluator that does not answer within `store.request_timeout_ms` plus
//! `channel.heartbeat_timeout_ms` fails the job, named.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cruise_container::apps::model_rebuilt_on_loss;
use cruise_container::protocol::{AmToEval, EvaluatorId, INPUT_TABLE, MODEL_TABLE};

use crate::am::job::{Driver, Phase, plural};
use crate::am::{AmError, Progress, Role};

/// A recount under way (see the module's doc).
pub(in crate::am::job) struct Recount {
    /// The job's recounts so far, this one included.
    number: u32,
    /// Why (the loss that made it necessary).
    why: String,
    stage: Stage,
    /// When the current round began.
    since: Instant,
}

/// A recount's round.
enum Stage {
    /// Waiting for the running plan to end.
    Due,
    /// Told the workers to hold; these have not answered yet.
    Holding(BTreeSet<EvaluatorId>),
    /// Told the holders of model blocks to empty them; these have not
    /// answered yet.
    Zeroing(BTreeSet<EvaluatorId>),
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::Due => "waiting for the running plan to end",
            Stage::Holding(_) => "HoldForRecount",
            Stage::Zeroing(_) => "ZeroModel",
        }
    }
}

impl Driver {
    /// Whether the job's app rebuilds its model from the workers' state
    /// after a loss.
    pub(in crate::am::job) fn recounts_on_loss(&self) -> bool {
        model_rebuilt_on_loss(self.config.job.app)
    }

    /// A loss (`why`) needs the model recounted: a new recount starts (one
    /// under way is started again under the next number).
    pub(super) fn need_recount(&mut self, why: &str) {
        self.rc.recounts += 1;
        let number = self.rc.recounts;
        tracing::info!(recount = number, "the model is recounted: {why}");
        self.rc.recount = Some(Recount {
            number,
            why: why.to_string(),
            stage: Stage::Due,
            since: Instant::now(),
        });
    }

    /// The recounts done, in words.
    pub(in crate::am::job) fn recounts(&self) -> &[String] {
        &self.rc.recounted
    }

    /// Whether a recount is due or under way.
    pub(in crate::am::job) fn recounting(&self) -> bool {
        self.rc.recount.is_some()
    }

    /// The evaluators that hold for a recount: the workers, and any other
    /// holder of input blocks, alive.
    fn recount_workers(&self) -> BTreeSet<EvaluatorId> {
        self.evaluators
            .values()
            .filter(|e| e.connected && !e.gone)
            .filter(|e| {
                e.role == Role::Worker || !self.owners.blocks_of(INPUT_TABLE, e.id).is_empty()
            })
            .map(|e| e.id)
            .collect()
    }

    /// The evaluators that hold model blocks, alive.
    fn model_holders(&self) -> BTreeSet<EvaluatorId> {
        self.evaluators
            .values()
            .filter(|e| e.connected && !e.gone)
            .filter(|e| !self.owners.blocks_of(MODEL_TABLE, e.id).is_empty())
            .map(|e| e.id)
            .collect()
    }

    /// Moves the recount on as far as it can (called after every event).
    pub(in crate::am::job) async fn step_recount(&mut self) {
        loop {
            let Some(r) = &self.rc.recount else { return };
            let number = r.number;
            match &r.stage {
                Stage::Due => {
                    if self.phase != Phase::Training || self.rc.plan.is_some() {
                        return;
                    }
                    let workers = self.recount_workers();
                    tracing::info!(
                        recount = number,
                        ?workers,
                        "recount: the workers hold, their pushes answered, their state marked uncounted"
                    );
                    for &id in &workers {
                        self.send(id, AmToEval::HoldForRecount { recount: number })
                            .await;
                    }
                    self.set_stage(Stage::Holding(workers));
                }
                Stage::Holding(waiting) => {
                    if !waiting.is_empty() {
                        return;
                    }
                    let holders = self.model_holders();
                    tracing::info!(
                        recount = number,
                        ?holders,
                        "recount: every worker holds; the model blocks are emptied"
                    );
                    for &id in &holders {
                        self.send(id, AmToEval::ZeroModel { recount: number }).await;
                    }
                    self.set_stage(Stage::Zeroing(holders));
                }
                Stage::Zeroing(waiting) => {
                    if !waiting.is_empty() {
                        return;
                    }
                    let Some(r) = self.rc.recount.take() else {
                        return;
                    };
                    let workers = self.recount_workers();
                    for &id in &workers {
                        self.send(id, AmToEval::ResumeAfterRecount { recount: number })
                            .await;
                    }
                    let text = format!(
                        "the model's counts emptied and rebuilt from the workers' state \
                         (recount {number}, {}; {}), each row counted in again by its next sweep",
                        r.why,
                        plural(workers.len() as u32, "worker")
                    );
                    tracing::warn!("{text}");
                    self.rc.recounted.push(text.clone());
                    let _ = self.links.progress.send(Progress::Phase(text));
                    return;
                }
            }
        }
    }

    fn set_stage(&mut self, stage: Stage) {
        if let Some(r) = &mut self.rc.recount {
            r.stage = stage;
            r.since = Instant::now();
        }
    }

    /// `id` was lost: the round under way no longer waits for it (the loss
    /// starts the recount again anyway).
    pub(super) fn recount_lost(&mut self, id: EvaluatorId) {
        if let Some(r) = &mut self.rc.recount
            && let Stage::Holding(w) | Stage::Zeroing(w) = &mut r.stage
        {
            w.remove(&id);
        }
    }

    /// Worker `id` holds for recount `recount`.
    pub(in crate::am::job) async fn on_recount_held(&mut self, id: EvaluatorId, recount: u32) {
        if let Some(r) = &mut self.rc.recount
            && r.number == recount
            && let Stage::Holding(w) = &mut r.stage
        {
            w.remove(&id);
        }
        self.step_recount().await;
    }

    /// `id` emptied its `blocks` model blocks for recount `recount`.
    pub(in crate::am::job) async fn on_model_zeroed(
        &mut self,
        id: EvaluatorId,
        recount: u32,
        blocks: u32,
    ) {
        if let Some(r) = &mut self.rc.recount
            && r.number == recount
            && let Stage::Zeroing(w) = &mut r.stage
        {
            tracing::debug!(evaluator = %id, recount, blocks, "model blocks emptied");
            w.remove(&id);
        }
        self.step_recount().await;
    }

    /// Fails the job when a round of the recount has waited longer than
    /// `store.request_timeout_ms` plus `channel.heartbeat_timeout_ms`,
    /// naming who has not answered.
    pub(in crate::am::job) fn expire_recount(&mut self) -> Result<(), AmError> {
        let Some(r) = &self.rc.recount else {
            return Ok(());
        };
        let waiting = match &r.stage {
            Stage::Due => return Ok(()),
            Stage::Holding(w) | Stage::Zeroing(w) => w,
        };
        let limit = Duration::from_millis(
            self.config.store.request_timeout_ms + self.config.channel.heartbeat_timeout_ms,
        );
        if r.since.elapsed() < limit {
            return Ok(());
        }
        let names: Vec<String> = waiting.iter().map(|&id| self.describe(id)).collect();
        Err(AmError::JobFailed(format!(
            "recount {} of the model ({}): {} did not answer {} within {:.1} s \
             (store.request_timeout_ms + channel.heartbeat_timeout_ms)",
            r.number,
            r.why,
            names.join(", "),
            r.stage.name(),
            limit.as_secs_f64()
        )))
    }
}
