//! Surviving a lost worker while training. A worker whose process ended,
//! whose connection dropped or that fell silent is let go: its container is
//! released (a hung process is killed with it), the other members learn it
//! has left, and the input blocks it owned are re-read from the job's input
//! by the surviving workers, the least loaded first. The other workers never
//! stop; under SSP the lost worker no longer holds their clocks back. Its
//! worker-local state is rebuilt as at the start (NMF's row factors are
//! drawn again). What cannot be survived fails the job, and the message
//! says why ([`Driver::unsurvivable`]): a lost server (its model
//! blocks have no checkpoint), a loss while a plan runs or outside training,
//! an LDA worker (its topic assignments are counted in the model), more
//! losses than `job.max_failures`.

use std::collections::BTreeMap;
use std::time::Instant;

use cruise_conf::AppKind;
use cruise_container::protocol::{AmToEval, BlockId, EvaluatorId, INPUT_TABLE};

use crate::am::Role;
use crate::am::job::{Driver, Phase, plural};

/// Input blocks of a lost worker that a survivor is re-reading.
pub(in crate::am::job) struct Recovery {
    to: EvaluatorId,
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
        if let Some(f) = self.pending_fatal.as_ref().filter(|f| f.eval == id) {
            Some(format!("it failed: {}", f.error))
        } else if self.phase != Phase::Training {
            Some(format!(
                "losses are survived while training, and the job is {}",
                self.phase.name()
            ))
        } else if e.role != Role::Worker {
            Some("a lost server's model blocks have no checkpoint to be restored from".into())
        } else if self.rc.plan.is_some() {
            Some("a plan is running".into())
        } else if self.config.job.app == AppKind::Lda {
            Some(
                "an LDA worker's topic assignments are counted in the model and cannot be re-read"
                    .into(),
            )
        } else if self.rc.losses.len() as u32 >= max {
            Some(format!(
                "job.max_failures = {max}{}",
                if self.rc.losses.is_empty() {
                    String::new()
                } else {
                    format!(" reached (before: {})", self.rc.losses.join("; "))
                }
            ))
        } else if self.survivors(id).next().is_none() {
            Some("no other worker is left".into())
        } else {
            None
        }
    }

    /// The workers that would remain without `id`.
    fn survivors(&self, id: EvaluatorId) -> impl Iterator<Item = EvaluatorId> + '_ {
        self.evaluators
            .values()
            .filter(move |e| e.id != id && !e.gone && e.connected && e.role == Role::Worker)
            .map(|e| e.id)
    }

    /// Lets the lost worker `id` go (see the module's doc); `cause` says how
    /// it was lost. Call only when [`Driver::unsurvivable`] says it can be.
    pub(in crate::am::job) async fn survive_loss(&mut self, id: EvaluatorId, cause: &str) {
        let text = format!("{} lost: {cause}", self.describe(id));
        tracing::warn!("{text}; the job goes on without it");
        self.rc.losses.push(text.clone());
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
        if let Err(e) = self.rm.release(&container).await {
            tracing::warn!("releasing container {container} of a lost worker: {e}");
        }
        self.rc.metrics.forget(id);
        self.broadcast_peers().await;
        self.release_clocks().await;

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
        let mut load: Vec<(usize, EvaluatorId)> = self
            .survivors(id)
            .map(|w| (self.owners.blocks_of(INPUT_TABLE, w).len(), w))
            .collect();
        let mut dealt: BTreeMap<EvaluatorId, Vec<BlockId>> = BTreeMap::new();
        for &b in &blocks {
            load.sort_unstable();
            let Some(least) = load.first_mut() else {
                break;
            };
            least.0 += 1;
            dealt.entry(least.1).or_default().push(b);
        }
        for (to, blocks) in dealt {
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
        let _ = self.progress.send(crate::am::Progress::Phase(format!(
            "{text}; its {} re-read by the other workers",
            plural(blocks.len() as u32, "input block")
        )));
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
        let Some(i) = self
            .rc
            .recoveries
            .iter()
            .position(|r| r.to == id && r.blocks == blocks)
        else {
            return false;
        };
        let r = self.rc.recoveries.swap_remove(i);
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
