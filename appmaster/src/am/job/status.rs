//! What the job shows: the live status and the summary at its end.

use cruise_container::os;
use cruise_container::protocol::{INPUT_TABLE, MODEL_TABLE};

use crate::am::{EvaluatorStatus, EvaluatorSummary, JobSummary, Status};

use super::Driver;

impl Driver {
    pub(super) fn publish_status(&self, failure: Option<String>) {
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
                .map(|e| EvaluatorStatus {
                    id: e.id,
                    container: e.container.clone(),
                    role: e.role,
                    pid: e.pid,
                    data_addr: e.data_addr,
                    rss_bytes: e.rss,
                    store_bytes: e.store_bytes,
                    input_blocks: counts.get(&(INPUT_TABLE, e.id)).copied().unwrap_or(0),
                    model_blocks: counts.get(&(MODEL_TABLE, e.id)).copied().unwrap_or(0),
                })
                .collect(),
            last_epoch: self.epochs.last().copied(),
            failure,
            capacity: self.rc.capacity,
            optimizer: self.rc.last_decision.clone(),
            metrics: self.rc.metrics.view(),
            reconfigurations: self.rc.history.clone(),
            emulation: self.emulation.clone(),
            lost: self.losses().to_vec(),
        };
        self.status.send_replace(status);
    }

    pub(super) fn summary(&self) -> JobSummary {
        let (w, s) = self.initial_split;
        JobSummary {
            reconfigurations: self.rc.history.clone(),
            emulation: self.emulation.clone(),
            lost: self.losses().to_vec(),
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
