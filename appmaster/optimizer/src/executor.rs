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
//! Everything runs inside the calling task (no spawned task outlives the call). The
//! [`ExecutionReport`] tells which operations took effect, so the caller can compute the
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

/// Runs plans, one at a time.
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
        plan.validate()?;
        let n = plan.ops.len();
        let start = Instant::now();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut missing: Vec<usize> = vec![0; n];
        for (i, p) in plan.ops.iter().enumerate() {
            let deps: BTreeSet<usize> = p.deps.iter().copied().collect();
            missing[i] = deps.len();
            for d in deps {
                dependents[d].push(i);
            }
        }
        let mut outcomes: Vec<Option<OpOutcome>> = vec![None; n];
        let mut state = vec![State::Waiting; n];
        let mut ready: BTreeSet<usize> = (0..n).filter(|&i| missing[i] == 0).collect();
        let mut in_flight = FuturesUnordered::new();
        let mut cancelled = cancel.is_cancelled();
        loop {
            if !cancelled {
                while in_flight.len() < self.config.max_parallel {
                    let Some(i) = ready.pop_first() else { break };
                    state[i] = State::Running;
                    let op = &plan.ops[i].op;
                    in_flight.push(async move {
                        let t0 = Instant::now();
                        let r = runner.execute(op).await;
                        (i, r, t0.elapsed())
                    });
                }
            }
            if in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if !cancelled => {
                    cancelled = true;
                }
                Some((i, result, duration)) = in_flight.next() => {
                    state[i] = State::Done;
                    match result {
                        Ok(report) => {
                            outcomes[i] = Some(OpOutcome::Succeeded { duration, report });
                            for &d in &dependents[i] {
                                missing[d] -= 1;
                                if missing[d] == 0 && state[d] == State::Waiting {
                                    ready.insert(d);
                                }
                            }
                        }
                        Err(error) => {
                            outcomes[i] = Some(OpOutcome::Failed { duration, error });
                            for d in plan.dependents(i) {
                                if state[d] == State::Waiting {
                                    state[d] = State::Done;
                                    ready.remove(&d);
                                    outcomes[d] = Some(OpOutcome::Skipped {
                                        reason: SkipReason::DependencyFailed { failed: i },
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        let outcomes = outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or(OpOutcome::Skipped {
                    reason: SkipReason::Cancelled,
                })
            })
            .collect();
        Ok(ExecutionReport {
            outcomes,
            elapsed: start.elapsed(),
        })
    }
}
