//! The plan executor: runs a [`Plan`]'s operations through a caller-supplied
//! [`OperationRunner`], independent ones concurrently up to a bound.
//!
//! * An operation starts once all its dependencies succeeded; ready operations start in
//!   plan order, at most [`ExecutorConfig::max_parallel`] at a time.
//! * A failed operation skips all its transitive dependents (reported with the failure
//!   that caused it); other branches go on.
//! * Cancelling the token stops starting operations; those already running finish, the
//!   rest are reported as cancelled.
//! * One plan at a time per executor; a second concurrent call gets
//!   [`ExecutorError::Busy`].
//!
//! [`PlanTracker`] is the graph alone, stepped by its owner (the AM's event loop
//! runs plans with it); [`PlanExecutor`] drives a tracker with an
//! [`OperationRunner`] inside the calling task (no spawned task outlives the call).
//! The [`ExecutionReport`] tells which operations took effect, so the caller can compute the
//! configuration the job is left in with [`ExecutionReport::resulting_configuration`].

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::OptimizerError;
use crate::plan::{Configuration, Operation, Plan};

/// What the runtime reports about an operation that succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpReport {
    /// Bytes transferred (moves; 0 for other operations or when unknown).
    pub bytes_moved: u64,
    /// A move of input blocks was carried out by re-reading them from the
    /// job's input at the destination instead (scale-in).
    #[serde(default)]
    pub reloaded: bool,
}

/// Why the runtime could not carry out an operation.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct OpError {
    /// What went wrong, with context (container, block, peer).
    pub message: String,
}

impl OpError {
    /// An error with the given message.
    pub fn new(message: impl Into<String>) -> Self {
        OpError {
            message: message.into(),
        }
    }
}

/// Carries out operations on the real system (the AM implements it; tests mock it).
pub trait OperationRunner {
    /// Executes one operation and resolves when it has taken effect (or failed).
    fn execute(&self, op: &Operation) -> impl Future<Output = Result<OpReport, OpError>> + Send;
}

/// Executor settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorConfig {
    /// Most operations in flight at once (at least 1).
    pub max_parallel: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig { max_parallel: 8 }
    }
}

/// Why an operation did not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A (transitive) dependency failed: the index of the failed operation.
    DependencyFailed {
        /// Index of the failed operation.
        failed: usize,
    },
    /// The plan was cancelled before it could start.
    Cancelled,
}

/// How one operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpOutcome {
    /// It took effect.
    Succeeded {
        /// Wall time it took.
        duration: Duration,
        /// What the runtime reported.
        report: OpReport,
    },
    /// The runtime reported an error.
    Failed {
        /// Wall time until the error.
        duration: Duration,
        /// The error.
        error: OpError,
    },
    /// It never started.
    Skipped {
        /// Why.
        reason: SkipReason,
    },
}

/// Outcome of every operation of a plan, in plan order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionReport {
    /// One outcome per operation.
    pub outcomes: Vec<OpOutcome>,
    /// Wall time of the whole plan.
    pub elapsed: Duration,
}

impl ExecutionReport {
    /// Whether every operation succeeded.
    pub fn all_succeeded(&self) -> bool {
        self.outcomes
            .iter()
            .all(|o| matches!(o, OpOutcome::Succeeded { .. }))
    }

    /// Whether operation `i` succeeded.
    pub fn succeeded(&self, i: usize) -> bool {
        matches!(self.outcomes.get(i), Some(OpOutcome::Succeeded { .. }))
    }

    /// Indices of the failed operations.
    pub fn failed(&self) -> Vec<usize> {
        self.outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, OpOutcome::Failed { .. }))
            .map(|(i, _)| i)
            .collect()
    }

    /// The configuration after the operations that succeeded (every block still has
    /// exactly one owner: a failed move leaves its blocks at the source).
    pub fn resulting_configuration(
        &self,
        plan: &Plan,
        before: &Configuration,
    ) -> Result<Configuration, OptimizerError> {
        plan.apply_where(before, |i| self.succeeded(i))
    }
}

/// Errors of the executor itself (operation failures are in the report).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ExecutorError {
    /// Another plan is running on this executor.
    #[error("another plan is already running on this executor")]
    Busy,
    /// The plan's dependencies are malformed.
    #[error(transparent)]
    InvalidPlan(#[from] OptimizerError),
}

/// A running plan's dependency graph, stepped by its owner: the owner asks
/// for the operations that may start ([`PlanTracker::next_ready`]), carries
/// them out however it likes, and reports each one's end
/// ([`PlanTracker::finished`]). It does no I/O and spawns nothing, so an event
/// loop can run a plan inside itself; [`PlanExecutor`] drives one with an
/// [`OperationRunner`].
#[derive(Debug)]
pub struct PlanTracker {
    plan: Plan,
    max_parallel: usize,
    dependents: Vec<Vec<usize>>,
    missing: Vec<usize>,
    state: Vec<State>,
    started: Vec<Option<Instant>>,
    outcomes: Vec<Option<OpOutcome>>,
    ready: BTreeSet<usize>,
    cancelled: bool,
    start: Instant,
}

impl PlanTracker {
    /// Tracks `plan` (checked first) with at most `config.max_parallel`
    /// operations running at once (0 is taken as 1).
    pub fn new(plan: Plan, config: ExecutorConfig) -> Result<PlanTracker, OptimizerError> {
        plan.validate()?;
        let n = plan.ops.len();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut missing: Vec<usize> = vec![0; n];
        for (i, p) in plan.ops.iter().enumerate() {
            let deps: BTreeSet<usize> = p.deps.iter().copied().collect();
            missing[i] = deps.len();
            for d in deps {
                dependents[d].push(i);
            }
        }
        let ready = (0..n).filter(|&i| missing[i] == 0).collect();
        Ok(PlanTracker {
            plan,
            max_parallel: config.max_parallel.max(1),
            dependents,
            missing,
            state: vec![State::Waiting; n],
            started: vec![None; n],
            outcomes: vec![None; n],
            ready,
            cancelled: false,
            start: Instant::now(),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The next operation that may start now, in plan order: all its
    /// dependencies succeeded, fewer than `max_parallel` run, and the plan
    /// is not cancelled. It counts as running from now on.
    pub fn next_ready(&mut self) -> Option<(usize, Operation)> {
        if self.cancelled || self.running().count() >= self.max_parallel {
            return None;
        }
        let i = self.ready.pop_first()?;
        self.state[i] = State::Running;
        self.started[i] = Some(Instant::now());
        Some((i, self.plan.ops[i].op.clone()))
    }

    /// Operation `i` ended. A success may let its dependents start; a
    /// failure skips every (transitive) dependent. An operation that is not
    /// running is ignored (returns false).
    pub fn finished(&mut self, i: usize, result: Result<OpReport, OpError>) -> bool {
        if self.state.get(i) != Some(&State::Running) {
            return false;
        }
        self.state[i] = State::Done;
        let duration = self.started[i].map_or(Duration::ZERO, |t| t.elapsed());
        match result {
            Ok(report) => {
                self.outcomes[i] = Some(OpOutcome::Succeeded { duration, report });
                for &d in &self.dependents[i] {
                    self.missing[d] -= 1;
                    if self.missing[d] == 0 && self.state[d] == State::Waiting {
                        self.ready.insert(d);
                    }
                }
            }
            Err(error) => {
                self.outcomes[i] = Some(OpOutcome::Failed { duration, error });
                for d in self.plan.dependents(i) {
                    if self.state[d] == State::Waiting {
                        self.state[d] = State::Done;
                        self.ready.remove(&d);
                        self.outcomes[d] = Some(OpOutcome::Skipped {
                            reason: SkipReason::DependencyFailed { failed: i },
                        });
                    }
                }
            }
        }
        true
    }

    /// Starts nothing more; the running operations may still finish.
    pub fn cancel(&mut self) {
        self.cancelled = true;
    }

    /// Whether the plan has ended: nothing runs and nothing more can start.
    pub fn is_done(&self) -> bool {
        self.running().next().is_none() && (self.cancelled || self.ready.is_empty())
    }

    /// When operation `i` started, after the plan was tracked (`None`:
    /// it has not started).
    pub fn started_after(&self, i: usize) -> Option<Duration> {
        self.started
            .get(i)
            .copied()
            .flatten()
            .map(|t| t.saturating_duration_since(self.start))
    }

    /// The operations that have been running for longer than `limit`.
    pub fn overdue(&self, limit: Duration) -> Vec<usize> {
        self.running()
            .filter(|&i| self.started[i].is_some_and(|t| t.elapsed() > limit))
            .collect()
    }

    /// The operations running now, by index.
    pub fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.state.len()).filter(|&i| self.state[i] == State::Running)
    }

    /// How every operation ended; those that never started are reported
    /// as cancelled.
    pub fn report(&self) -> ExecutionReport {
        let outcomes = self
            .outcomes
            .iter()
            .map(|o| {
                o.clone().unwrap_or(OpOutcome::Skipped {
                    reason: SkipReason::Cancelled,
                })
            })
            .collect();
        ExecutionReport {
            outcomes,
            elapsed: self.start.elapsed(),
        }
    }
}

/// Runs plans, one at a time, with an [`OperationRunner`].
#[derive(Debug, Default)]
pub struct PlanExecutor {
    config: ExecutorConfig,
    running: Mutex<()>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    Done,
}

impl PlanExecutor {
    /// An executor with the given settings (`max_parallel` 0 is taken as 1).
    pub fn new(config: ExecutorConfig) -> Self {
        PlanExecutor {
            config: ExecutorConfig {
                max_parallel: config.max_parallel.max(1),
            },
            running: Mutex::new(()),
        }
    }

    /// The settings.
    pub fn config(&self) -> ExecutorConfig {
        self.config
    }

    /// Runs `plan` with `runner` until every operation has succeeded, failed or been
    /// skipped, or `cancel` fires and the running operations have finished.
    pub async fn execute<R: OperationRunner>(
        &self,
        plan: &Plan,
        runner: &R,
        cancel: &CancellationToken,
    ) -> Result<ExecutionReport, ExecutorError> {
        let _guard = self.running.try_lock().map_err(|_| ExecutorError::Busy)?;
        let mut tracker = PlanTracker::new(plan.clone(), self.config)?;
        if cancel.is_cancelled() {
            tracker.cancel();
        }
        let mut in_flight = FuturesUnordered::new();
        loop {
            while let Some((i, op)) = tracker.next_ready() {
                in_flight.push(async move { (i, runner.execute(&op).await) });
            }
            if tracker.is_done() || in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if !tracker.cancelled => tracker.cancel(),
                Some((i, result)) = in_flight.next() => {
                    tracker.finished(i, result);
                }
            }
        }
        Ok(tracker.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlannedOp;
    use crate::snapshot::Role;

    fn switch(container: &str) -> Operation {
        Operation::Switch {
            container: container.into(),
            to_role: Role::Server,
        }
    }

    /// a; b after a; c after b; d alone.
    fn chain() -> Plan {
        let op = |c: &str, deps: Vec<usize>| PlannedOp {
            op: switch(c),
            deps,
        };
        Plan {
            ops: vec![
                op("a", vec![]),
                op("b", vec![0]),
                op("c", vec![1]),
                op("d", vec![]),
            ],
            relaxed: Vec::new(),
        }
    }

    fn started(t: &mut PlanTracker) -> Vec<usize> {
        std::iter::from_fn(|| t.next_ready().map(|(i, _)| i)).collect()
    }

    #[test]
    fn operations_start_when_their_dependencies_succeeded_within_the_bound() {
        let mut t = PlanTracker::new(chain(), ExecutorConfig { max_parallel: 1 }).unwrap();
        assert_eq!(t.started_after(0), None);
        assert_eq!(started(&mut t), [0], "one at a time, in plan order");
        assert!(t.started_after(0).is_some() && t.started_after(1).is_none());
        assert!(t.finished(0, Ok(OpReport::default())));
        assert!(!t.finished(0, Ok(OpReport::default())), "ended twice");
        assert_eq!(started(&mut t), [1]);
        assert!(t.finished(1, Ok(OpReport::default())));
        assert_eq!(started(&mut t), [2], "c became ready before d was started");
        t.finished(2, Ok(OpReport::default()));
        assert_eq!(started(&mut t), [3]);
        assert!(!t.is_done());
        t.finished(3, Ok(OpReport::default()));
        assert!(t.is_done());
        assert!(t.report().all_succeeded());
    }

    #[test]
    fn a_failure_skips_its_dependents_and_the_rest_goes_on() {
        let mut t = PlanTracker::new(chain(), ExecutorConfig { max_parallel: 8 }).unwrap();
        assert_eq!(started(&mut t), [0, 3]);
        t.finished(0, Err(OpError::new("no")));
        assert!(started(&mut t).is_empty());
        assert!(!t.is_done(), "d still runs");
        t.finished(3, Ok(OpReport::default()));
        assert!(t.is_done());
        let r = t.report();
        assert_eq!(r.failed(), [0]);
        assert!(r.succeeded(3));
        for i in [1, 2] {
            assert_eq!(
                r.outcomes[i],
                OpOutcome::Skipped {
                    reason: SkipReason::DependencyFailed { failed: 0 }
                }
            );
        }
    }

    #[test]
    fn a_cancelled_plan_starts_nothing_more_and_ends_when_the_running_finish() {
        let mut t = PlanTracker::new(chain(), ExecutorConfig { max_parallel: 8 }).unwrap();
        assert_eq!(started(&mut t), [0, 3]);
        t.cancel();
        t.finished(0, Ok(OpReport::default()));
        assert!(
            started(&mut t).is_empty(),
            "b is ready but the plan is cancelled"
        );
        assert!(!t.is_done());
        assert_eq!(t.running().collect::<Vec<_>>(), [3]);
        t.finished(3, Ok(OpReport::default()));
        assert!(t.is_done());
        let r = t.report();
        assert!(r.succeeded(0) && r.succeeded(3));
        assert_eq!(
            r.outcomes[1],
            OpOutcome::Skipped {
                reason: SkipReason::Cancelled
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn operations_running_too_long_are_overdue() {
        let mut t = PlanTracker::new(chain(), ExecutorConfig { max_parallel: 8 }).unwrap();
        assert_eq!(started(&mut t), [0, 3]);
        tokio::time::advance(Duration::from_secs(5)).await;
        t.finished(3, Ok(OpReport::default()));
        assert!(t.overdue(Duration::from_secs(10)).is_empty());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(t.overdue(Duration::from_secs(10)), [0], "d has ended");
        t.finished(0, Err(OpError::new("timed out")));
        assert_eq!(started(&mut t), Vec::<usize>::new(), "b is skipped");
        assert!(t.is_done());
    }

    #[test]
    fn a_malformed_plan_is_refused() {
        let mut plan = chain();
        plan.ops[0].deps = vec![2];
        assert!(PlanTracker::new(plan, ExecutorConfig::default()).is_err());
    }
}
