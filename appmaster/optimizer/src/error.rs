//! The crate's error type: every way the optimizer can reject its input or fail.

use thiserror::Error;

/// Errors of the optimizer library. Each names the offending input.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum OptimizerError {
    /// The snapshot JSON could not be parsed.
    #[error("snapshot JSON, line {line} column {column}: {message}")]
    SnapshotJson {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// What serde_json reported.
        message: String,
    },
    /// A numeric input is missing, negative, zero where it must be positive, or not finite.
    #[error("invalid input `{field}`: {reason}")]
    InvalidInput {
        /// Path of the field, e.g. `containers[3].bandwidth_bytes_per_sec`.
        field: String,
        /// Why it is rejected.
        reason: String,
    },
    /// Two containers share one id.
    #[error("container id `{0}` appears twice")]
    DuplicateContainer(String),
    /// A container id is referenced but not known.
    #[error("unknown container `{container}` in {context}")]
    UnknownContainer {
        /// The id.
        container: String,
        /// Where it was referenced.
        context: String,
    },
    /// No container has a measured compute cost, so none can be estimated.
    #[error(
        "no container has a measured compute_secs_per_record; at least one worker must report metrics before the cost model can be used"
    )]
    NoComputeMeasurement,
    /// Block ownership or block counts are inconsistent.
    #[error("inconsistent blocks: {0}")]
    InconsistentBlocks(String),
    /// No assignment of roles can run the job (e.g. fewer than two usable containers).
    #[error("no feasible configuration: {0}")]
    Infeasible(String),
    /// A plan cannot be applied to a configuration (a precondition of an operation failed).
    #[error("operation {op} cannot be applied: {reason}")]
    PlanApply {
        /// Index of the operation in the plan.
        op: usize,
        /// Which precondition failed.
        reason: String,
    },
    /// The plan's dependency graph has a cycle or a dependency on a later operation.
    #[error("invalid plan graph: {0}")]
    InvalidPlan(String),
    /// The snapshot and the configuration given with it disagree.
    #[error("snapshot and configuration disagree about container `{container}`: {reason}")]
    SnapshotMismatch {
        /// The container.
        container: String,
        /// What differs.
        reason: String,
    },
}

impl OptimizerError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        OptimizerError::InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
