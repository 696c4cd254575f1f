//! A running plan: its start, the operations its tracker lets start, its
//! end, and what a slow plan is waiting for.

use std::time::Instant;

use cruise_optimizer::{ExecutorConfig, OpOutcome, Operation, Plan, PlanTracker, Snapshot};

use super::{DeleteStage, OpIndex, PlanRecord, RunningPlan, ready_to_leave};
use crate::am::AmError;
use crate::am::history::{OpRecord, Record};
use crate::am::job::{Driver, plural, split_text};

impl Driver {
    /// Starts `plan`, recording `started` in the history; its first
    /// operations start at the loop's next step ([`Driver::step_plan`]).
    pub(super) fn start_plan(
        &mut self,
        plan: Plan,
        snapshot: Snapshot,
        summary: String,
        started: Record,
    ) {
        let config = ExecutorConfig {
            max_parallel: self.config.optimizer.max_parallel as usize,
        };
        let predicted = match &started {
            Record::PlanStarted {
                predicted_before_secs,
                predicted_after_secs,
                ..
            } => Some((*predicted_before_secs, *predicted_after_secs)),
            _ => None,
        };
        match PlanTracker::new(plan, config) {
            Ok(tracker) => {
                self.links.history.push(started);
                self.rc.plan = Some(RunningPlan {
                    tracker,
                    snapshot,
                    started: Instant::now(),
                    reported_slow: 0,
                    summary,
                    predicted,
                });
            }
            Err(e) => {
                tracing::warn!("the optimizer's plan is malformed, not run: {e}; {summary}");
                self.note_decision(format!("plan not run (malformed: {e}): {summary}"));
            }
        }
    }

    /// Starts every operation of the running plan that may start, and ends
    /// the plan when nothing runs and nothing more can start. The loop calls
    /// it after every event: operations end on the evaluators' messages.
    pub(in crate::am::job) async fn step_plan(&mut self) -> Result<(), AmError> {
        loop {
            let Some(p) = &mut self.rc.plan else {
                return Ok(());
            };
            if let Some((i, op)) = p.tracker.next_ready() {
                self.start_op(OpIndex(i), op).await;
            } else if p.tracker.is_done() {
                return self.on_plan_done().await;
            } else {
                return Ok(());
            }
        }
    }

    /// The last epoch ended: the running plan, if any, starts no more
    /// operations (the stop waits for the ones under way).
    pub(in crate::am::job) fn end_reconfiguration(&mut self) {
        if let Some(p) = &mut self.rc.plan {
            p.tracker.cancel();
        }
    }

    /// Fails the operations of the running plan that have run for longer
    /// than `optimizer.op_timeout_ms`, saying what they were waiting for:
    /// operations wait for evaluators' messages, and none waits forever.
    /// What such an operation had begun may still finish later; the plan
    /// no longer counts on it.
    pub(in crate::am::job) fn expire_ops(&mut self) {
        let limit = std::time::Duration::from_millis(self.config.optimizer.op_timeout_ms);
        let Some(p) = &self.rc.plan else { return };
        let overdue = p.tracker.overdue(limit);
        if overdue.is_empty() {
            return;
        }
        let waiting = self.waiting_operations().join("; ");
        for i in overdue {
            let Some(p) = &self.rc.plan else { return };
            let op = format!("{:?}", p.tracker.plan().ops[i].op);
            let message = format!(
                "did not finish within {:.1} s (optimizer.op_timeout_ms); waiting: {}",
                limit.as_secs_f64(),
                if waiting.is_empty() {
                    "nothing here"
                } else {
                    waiting.as_str()
                }
            );
            tracing::warn!("{op} {message}");
            self.rc
                .op_done(OpIndex(i), Err(cruise_optimizer::OpError::new(message)));
        }
    }

    /// Reports a plan that has run for longer than
    /// `optimizer.slow_plan_report_secs` (once per period), naming the
    /// operations still waiting and what for: operations wait for messages
    /// from evaluators, so a plan that stalls says where.
    pub(in crate::am::job) fn report_slow_plan(&mut self) {
        let Some(p) = &self.rc.plan else { return };
        let secs = p.started.elapsed().as_secs_f64();
        let period = self.config.optimizer.slow_plan_report_secs;
        if secs < period * f64::from(p.reported_slow + 1) {
            return;
        }
        let waiting = self.waiting_operations();
        if let Some(p) = &mut self.rc.plan {
            p.reported_slow += 1;
        }
        let text = format!(
            "reconfiguration still running after {secs:.0} s: {}",
            if waiting.is_empty() {
                "no operation is waiting here".to_string()
            } else {
                waiting.join("; ")
            }
        );
        tracing::warn!("{text}");
        let _ = self.links.progress.send(crate::am::Progress::Phase(text));
    }

    /// The operations under way, each with what it waits for.
    pub(super) fn waiting_operations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for a in &self.rc.adds {
            out.push(format!(
                "add `{}`: waiting {:.0} s for a container",
                a.name,
                a.since.elapsed().as_secs_f64()
            ));
        }
        let mut joining: Vec<_> = self.rc.joining.iter().collect();
        joining.sort_by_key(|(id, _)| **id);
        for (id, a) in joining {
            out.push(format!(
                "add `{}`: evaluator {id} has not applied the ownership table yet",
                a.name
            ));
        }
        let (stages, acked) = self.delete_facts();
        let (_, behind) = ready_to_leave(&stages, &acked);
        for (&id, stage) in &stages {
            out.push(match stage {
                DeleteStage::Stopping => format!("delete evaluator {id}: its task has not stopped"),
                DeleteStage::Draining(v) => {
                    let who = behind
                        .iter()
                        .find(|b| b.0 == id)
                        .map(|b| format!("{:?}", b.2))
                        .unwrap_or_default();
                    format!(
                        "delete evaluator {id}: members {who} have not applied ownership version {v}"
                    )
                }
                DeleteStage::Exiting => {
                    format!("delete evaluator {id}: its container has not ended")
                }
            });
        }
        let mut switches: Vec<_> = self.rc.switches.iter().collect();
        switches.sort_by_key(|(id, _)| **id);
        for (id, sw) in switches {
            out.push(format!(
                "switch evaluator {id} to {}: its task has not stopped",
                crate::am::job::role_name(sw.to)
            ));
        }
        let mut moves: Vec<_> = self.rc.moves.values().collect();
        moves.sort_by_key(|m| (m.from, m.to));
        for m in moves {
            out.push(format!(
                "move of {} blocks ({} bytes) from evaluator {} to {}: not finished",
                m.blocks, m.bytes, m.from, m.to
            ));
        }
        for r in &self.rc.reloads {
            out.push(format!(
                "re-read of {} input blocks from evaluator {} at {}: {}",
                r.blocks.len(),
                r.from,
                r.to,
                if r.loading_since.is_some() {
                    "loading"
                } else {
                    "the source has not dropped them"
                }
            ));
        }
        out
    }

    /// The running plan ended: records how, and lets the job go on.
    async fn on_plan_done(&mut self) -> Result<(), AmError> {
        let Some(running) = self.rc.plan.take() else {
            return Ok(());
        };
        let report = running.tracker.report();
        let secs = running.started.elapsed().as_secs_f64();
        let mut record = PlanRecord {
            at_secs: self.started.elapsed().as_secs_f64(),
            summary: running.summary.clone(),
            predicted_before_secs: running.predicted.map(|p| p.0),
            predicted_after_secs: running.predicted.map(|p| p.1),
            succeeded: 0,
            failed: Vec::new(),
            skipped: 0,
            secs,
            op_secs: Vec::new(),
            bytes_moved: 0,
        };
        let plan = running.tracker.plan();
        let mut ops = Vec::with_capacity(report.outcomes.len());
        for (i, o) in report.outcomes.iter().enumerate() {
            let op = &plan.ops[i].op;
            ops.push(op_record(
                op,
                o,
                running.tracker.started_after(i).map(|d| d.as_secs_f64()),
            ));
            match o {
                OpOutcome::Succeeded { duration, report } => {
                    record.succeeded += 1;
                    record.bytes_moved += report.bytes_moved;
                    let kind = if report.reloaded {
                        "reload input"
                    } else {
                        op.kind().name()
                    };
                    record
                        .op_secs
                        .push((kind.to_string(), duration.as_secs_f64()));
                }
                OpOutcome::Failed { error, .. } => {
                    record.failed.push(format!("{op:?}: {error}"));
                }
                OpOutcome::Skipped { .. } => record.skipped += 1,
            }
        }
        self.rc.policy.observe(plan, &report, &running.snapshot);
        if record.failed.is_empty() {
            tracing::info!(
                "reconfiguration done in {secs:.2} s: {} ({} operations, {} bytes moved)",
                running.summary,
                record.succeeded,
                record.bytes_moved
            );
        } else {
            tracing::warn!(
                "reconfiguration partly failed after {secs:.2} s: {} succeeded, {} skipped; failures: {}; the job goes on as {}",
                record.succeeded,
                record.skipped,
                record.failed.join("; "),
                split_text(self.role_counts().0, self.role_counts().1)
            );
        }
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "reconfigured in {secs:.2} s: now {}{}",
            split_text(self.role_counts().0, self.role_counts().1),
            if record.failed.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} failed, {} skipped)",
                    plural(record.failed.len() as u32, "operation"),
                    record.skipped
                )
            }
        )));
        self.rc.history.push(record);
        self.links.history.push(Record::PlanEnded {
            plan: self.rc.history.len(),
            at_secs: self.links.history.now(),
            secs,
            ops,
        });
        self.rc.metrics.reset_after_reconfiguration();
        self.rc.last_check = Instant::now();
        let held = self.members().count() as u32 + self.rc.adds.len() as u32;
        if held <= self.rc.capacity {
            self.rc.reclaim = None;
        } else if let Some((n, since)) = self.rc.reclaim {
            // Still over capacity: plan again at once.
            self.rc.reclaim = Some((
                n.min(held - self.rc.capacity).max(held - self.rc.capacity),
                since,
            ));
        }
        Ok(())
    }

    /// Starts an operation of the running plan; one that cannot start
    /// ends at once as failed.
    async fn start_op(&mut self, i: OpIndex, op: Operation) {
        let started = match op {
            Operation::Move {
                table,
                blocks,
                from,
                to,
            } => self.start_move(table, blocks, &from, &to, i).await,
            Operation::Add { container, role } => self.start_add(container, role, i).await,
            Operation::Delete { container } => self.start_delete(&container, i).await,
            Operation::Switch { container, to_role } => {
                self.start_switch(&container, to_role, i).await
            }
        };
        if let Err(e) = started {
            self.rc.op_done(i, Err(e));
        }
    }
}

/// How operation `op` ended, for the history: its kind, what it did, its
/// outcome and its times.
fn op_record(op: &Operation, outcome: &OpOutcome, start_secs: Option<f64>) -> OpRecord {
    let what = match op {
        Operation::Add { container, role } => format!("{container} as {role:?}").to_lowercase(),
        Operation::Delete { container } => container.clone(),
        Operation::Switch { container, to_role } => {
            format!("{container} to {}", format!("{to_role:?}").to_lowercase())
        }
        Operation::Move {
            blocks, from, to, ..
        } => format!("{} blocks {from} → {to}", blocks.len()),
    };
    let kind = op.kind().name().to_string();
    let (kind, outcome, secs, bytes, error) = match outcome {
        OpOutcome::Succeeded { duration, report } => (
            if report.reloaded {
                "reload input".to_string()
            } else {
                kind
            },
            "succeeded",
            duration.as_secs_f64(),
            report.bytes_moved,
            None,
        ),
        OpOutcome::Failed { duration, error } => (
            kind,
            "failed",
            duration.as_secs_f64(),
            0,
            Some(error.to_string()),
        ),
        OpOutcome::Skipped { reason } => (kind, "skipped", 0.0, 0, Some(format!("{reason:?}"))),
    };
    OpRecord {
        kind,
        what,
        outcome: outcome.to_string(),
        start_secs,
        secs,
        bytes,
        error,
    }
}
