//! The ML applications.
//!
//! An app implements [`App`]: how to parse its input into an [`InputBlock`],
//! which model keys a mini-batch needs, how to compute deltas from pulled
//! values, the update function servers apply, and its objective. The PS roles
//! ([`crate::ps`]) drive it; apps never touch sockets.
//!
//! Each app also ships a seeded data generator with a known ground truth
//! (used by `cruise datagen` and when a job has no input).

pub mod mlr;

use std::ops::Range;
use std::sync::Arc;

use cruise_conf::{AppKind, CruiseConfig};

use crate::protocol::{AppParams, BlockId, Key, Stats, ValueBatch};
use crate::store::{InputBlock, ModelFunctions, StateBlock};

/// A bad record in an input split.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    /// Byte offset of the bad record within the text parsed.
    pub offset: usize,
    /// What is wrong, naming the token.
    pub message: String,
}

/// Errors building an app.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AppError {
    /// The parameters do not fit the app.
    #[error("app {app}: {message}")]
    Params {
        /// The app.
        app: AppKind,
        /// What is wrong.
        message: String,
    },
}

/// Where training stands when a mini-batch is computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The worker's local epoch (0-based).
    pub clock: u32,
}

/// An ML application.
pub trait App: Send + Sync + 'static {
    /// Which app.
    fn kind(&self) -> AppKind;

    /// The model's value length, initial values and update function.
    fn model(&self) -> Arc<dyn ModelFunctions>;

    /// Parses the text of one input split.
    fn parse(&self, text: &[u8]) -> Result<InputBlock, ParseError>;

    /// Whether the app keeps worker-local state (then [`App::init_state`]
    /// returns `Some` and [`App::compute`] gets the block's state).
    fn has_state(&self) -> bool {
        false
    }

    /// Worker-local state for a freshly loaded input block, if the app keeps any.
    fn init_state(&self, _block: BlockId, _input: &InputBlock) -> Option<StateBlock> {
        None
    }

    /// The model keys rows `rows` of `input` need, sorted and without duplicates.
    fn keys(&self, input: &InputBlock, rows: Range<usize>, out: &mut Vec<Key>);

    /// Computes on a mini-batch: deltas for `keys` (same order as `keys`) and
    /// the objective of the mini-batch before the update.
    fn compute(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        state: Option<&mut StateBlock>,
        step: Step,
    ) -> (ValueBatch, Stats);

    /// The objective over rows with the current model, without updating.
    fn evaluate(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        state: Option<&StateBlock>,
    ) -> Stats;

    /// Name of the loss (for display).
    fn loss_name(&self) -> &'static str {
        "loss"
    }

    /// Whether [`Stats::correct`] is meaningful (classification accuracy).
    fn has_accuracy(&self) -> bool {
        false
    }
}

/// The model parameters of the job's app, derived from the configuration.
pub fn params(config: &CruiseConfig) -> Result<AppParams, AppError> {
    match config.job.app {
        AppKind::Mlr => mlr::params(&config.mlr, config.store.model_blocks),
    }
}

/// Builds the job's app.
pub fn build(config: &CruiseConfig, params: &AppParams) -> Result<Arc<dyn App>, AppError> {
    match config.job.app {
        AppKind::Mlr => Ok(Arc::new(mlr::Mlr::new(&config.mlr, params)?)),
    }
}
