//! What the job shows: the live status, its history and the summary at its
//! end.

use cruise_container::os;
use cruise_container::protocol::{INPUT_TABLE, MODEL_TABLE, Stats};

use crate::am::history::{Member, Record};
use crate::am::{AmError, EvaluatorStatus, EvaluatorSummary, JobSummary, Status};

use super::{Driver, role_name};

impl Driver {
    /// Records the job's start in its history.
    pub(super) fn record_start(&self) {
        let started_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
            .saturating_sub(self.started.elapsed().as_millis() as u64);
        self.links.history.push(Record::Job {
            job_id: self.job_id.clone(),
            app: self.config.job.app.as_str().to_string(),
            loss_name: self.loss_name.to_string(),
            has_accuracy: self.has_accuracy,
            epochs: self.config.job.epochs,
            containers: self.config.job.containers,
            runtime: self.config.runtime.kind.as_str().to_string(),
            started_unix_ms,
        });
    }

    /// Records an epoch in the history.
    pub(super) fn record_epoch(&self, e: &crate::am::EpochSummary) {
        self.links.history.push(Record::Epoch {
            epoch: e.epoch,
            at_secs: e.end_secs,
            secs: e.secs,
            loss: e.stats.mean_loss(),
            accuracy: self.has_accuracy.then(|| e.stats.accuracy()),
            derived: self.derived(&e.stats),
            workers: e.workers,
            servers: e.servers,
        });
    }

    /// The app's derived metric of `stats` (RMSE, perplexity), if it has one.
    fn derived(&self, stats: &Stats) -> Option<(String, f64)> {
        self.app
            .as_ref()
            .and_then(|a| a.derived_metric(stats))
            .map(|(name, v)| (name.to_string(), v))
    }

    /// Records the members and their roles when they changed since they
    /// were last recorded.
    fn record_members(&mut self) {
        let members: Vec<Member> = self
            .evaluators
            .values()
            .filter(|e| !e.gone)
            .map(|e| Member {
                id: e.id.0,
                container: e.container.to_string(),
                role: if self.rc.is_deleting(e.id) {
                    "leaving"
                } else {
                    role_name(e.role)
                }
                .to_string(),
            })
            .collect();
        if members != self.recorded_members {
            self.recorded_members = members.clone();
            self.links.history.push(Record::Members {
                at_secs: self.links.history.now(),
                members,
            });
        }
    }

    /// Records the job's end: how it ended and, if it got that far, the
    /// final model's figures.
    pub(super) fn record_end(&mut self, error: Option<&AmError>) {
        self.record_members();
        if !self.rc.last_splits.is_empty() {
            self.links.history.push(Record::Splits {
                at_secs: self.links.history.now(),
                splits: self.rc.last_splits.clone(),
            });
        }
        let rows = crate::ui::container_rows(&self.links.status.borrow());
        self.links.history.push(Record::Containers {
            at_secs: self.links.history.now(),
            rows,
        });
        let evaluated = self.final_stats.records > 0;
        let outcome = match error {
            None => "finished",
            Some(AmError::Cancelled) => "cancelled",
            Some(_) => "failed",
        };
        self.links.history.push(Record::End {
            at_secs: self.links.history.now(),
            outcome: outcome.to_string(),
            error: error.map(|e| e.to_string()),
            final_loss: evaluated.then(|| self.final_stats.mean_loss()),
            final_accuracy: (evaluated && self.has_accuracy).then(|| self.final_stats.accuracy()),
        });
    }

    pub(super) fn publish_status(&mut self, failure: Option<String>) {
        self.record_members();
        let counts = self.owners.counts();
        let status = Status {
            job_id: self.job_id.clone(),
            am_addr: Some(self.am_addr),
            refused: self.refused.clone(),
            phase: self.phase.name().to_string(),
            epochs_done: self.epochs.len() as u32,
            epochs: self.config.job.epochs,
            records_per_epoch: self.records_per_epoch,
            records_processed: self.records_done,
            evaluators: self
                .evaluators
                .values()
                .filter(|e| !e.gone)
                .map(|e| EvaluatorStatus {
                    id: e.id,
                    container: e.container.clone(),
                    role: e.role,
                    pid: e.pid,
                    host: e.host.clone(),
                    data_addr: e.data_addr,
                    rss_bytes: e.rss,
                    store_bytes: e.store_bytes,
                    input_blocks: counts.get(&(INPUT_TABLE, e.id)).copied().unwrap_or(0),
                    model_blocks: counts.get(&(MODEL_TABLE, e.id)).copied().unwrap_or(0),
                    clock: e.clock,
                })
                .collect(),
            last_epoch: self.epochs.last().copied(),
            failure,
            capacity: self.rc.capacity,
            optimizer: self.rc.last_decision.clone(),
            metrics: self.rc.metrics.view(),
            splits: self.rc.last_splits.clone(),
            reconfigurations: self.rc.history.clone(),
            emulation: self.emulation.clone(),
            lost: self.losses().to_vec(),
            clock_rollbacks: self.clock_rollbacks.clone(),
            recounts: self.recounts().to_vec(),
            checkpoint: self.ck.info(&self.config.checkpoint.dir),
            checkpoints: self.ck.count(),
        };
        self.links.status.send_replace(status);
    }

    pub(super) fn summary(&self) -> JobSummary {
        let (w, s) = self.initial_split;
        JobSummary {
            reconfigurations: self.rc.history.clone(),
            emulation: self.emulation.clone(),
            lost: self.losses().to_vec(),
            clock_rollbacks: self.clock_rollbacks.clone(),
            recounts: self.recounts().to_vec(),
            checkpoints: self.ck.count(),
            resumed_from: self.resumed_from(),
            // Set by `run_job` once the job is over.
            checkpoint_dir: None,
            checkpoints_deleted: false,
            job_id: self.job_id.clone(),
            app: self.config.job.app,
            loss_name: self.loss_name.to_string(),
            has_accuracy: self.has_accuracy,
            records: self.records_per_epoch,
            epochs: self.epochs.clone(),
            final_stats: self.final_stats,
            eval_stats: self.outputs.eval_stats(),
            model_out: self.outputs.written(),
            wall_secs: self.started.elapsed().as_secs_f64(),
            train_secs: self.train_secs,
            containers: self.config.job.containers,
            workers: w,
            servers: s,
            am_peak_rss_bytes: os::memory().1,
            evaluators: self
                .evaluators
                .values()
                .map(|e| EvaluatorSummary {
                    id: e.id,
                    container: e.container.clone(),
                    pid: e.pid,
                    role: e.role,
                    peak_rss_bytes: e.peak_rss,
                    max_store_bytes: e.max_store_bytes,
                })
                .collect(),
        }
    }
}
