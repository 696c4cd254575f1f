//! The ML applications.
//!
//! An app implements [`App`]: how to parse its input into an [`InputBlock`],
//! which model keys a mini-batch needs, how to compute deltas from pulled
//! values, the update function servers apply, and its objective. The PS roles
//! ([`crate::ps`]) drive it; apps never touch sockets.
//!
//! | app | input record | model (servers) | worker-local state | loss term |
//! |---|---|---|---|---|
//! | [`mlr`] | libsvm `label idx:val ...` | weights, keyed by feature group | — | log-loss per record |
//! | [`lasso`] | libsvm `target idx:val ...` | coefficients, keyed by feature group | — | objective per record |
//! | [`nmf`] | `row: col,val col,val ...` | column factors, keyed by column | row factors | squared error per entry |
//! | [`lda`] | `doc word:count ...` | word-topic counts by word, plus topic totals | document topics, assignments | −log-likelihood per token |
//!
//! Checkpoints hold the worker-local state of NMF (row factors) and LDA
//! (document-topic counts and topic assignments) ([`state_in_checkpoints`]):
//! a resumed job restores it ([`App::restore_state`], when it fits the
//! block), and so do a lost NMF worker's re-read input blocks. LDA's
//! assignments must agree with the word-topic counts on the servers, and
//! a checkpoint copies each block at its own moment (a state block and
//! the count blocks it was counted into disagree by what was sampled in
//! between, and by the pushes still on their way), so a resumed LDA job
//! does not restore the counts ([`model_rebuilt_on_resume`]): its servers
//! start from zero and each input block's first sweep counts its tokens,
//! a restored block with the assignments it was checkpointed with, a
//! block drawn afresh with topics drawn as at the start.
//! Neither does a job that loses an LDA worker or server
//! ([`model_rebuilt_on_loss`]): the counts are emptied and rebuilt from the
//! workers' assignments, marked uncounted ([`App::uncount`]) at the same
//! moment.
//!
//! Each app also ships a seeded data generator with a known ground truth
//! (used by `cruise datagen` and when a job has no input).
//!
//! What the apps share lives here: reading records one a line with sparse
//! entries (`parse_records`, `entry_index`, `libsvm_features`), the keys
//! and entries of a mini-batch's rows (`entry_keys`, `entry_range`), the
//! step size schedule ([`Step::learning_rate`]), deltas shaped as the
//! pulled values (`deltas_for`) and the additive model (`AdditiveModel`).

mod keyindex;
pub mod lasso;
pub mod lda;
pub mod mlr;
pub mod nmf;

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

impl Step {
    /// The step size of this epoch, `step_size / (1 + decay × epoch)`: the
    /// schedule lives on the workers only, so servers just apply deltas.
    pub fn learning_rate(self, step_size: f32, decay: f32) -> f32 {
        step_size / (1.0 + decay * self.clock as f32)
    }
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

    /// The state to train `input` on from `state`, its worker-local state
    /// read back from a checkpoint ([`state_in_checkpoints`]), or `None`
    /// when it does not fit the block (then it is drawn afresh).
    fn restore_state(&self, _input: &InputBlock, _state: StateBlock) -> Option<StateBlock> {
        None
    }

    /// Marks the part of `state` counted in the model as not counted any
    /// more, for a job whose model is rebuilt from the workers' state
    /// ([`model_rebuilt_on_loss`]): the next sweep over each row counts it
    /// in again instead of changing it. Returns how much it marked (LDA:
    /// tokens); nothing for apps whose model is not rebuilt.
    fn uncount(&self, _input: &InputBlock, _state: &mut StateBlock) -> u64 {
        0
    }

    /// Whether rows `rows` of `input` hold state not counted in the model
    /// yet ([`App::uncount`], [`App::restore_state`]).
    fn uncounted(&self, _input: &InputBlock, _state: &StateBlock, _rows: Range<usize>) -> bool {
        false
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

    /// A figure derived from the statistics, shown beside the loss (e.g. the
    /// RMSE when the loss is the mean squared error), if the app has one.
    fn derived_metric(&self, _stats: &Stats) -> Option<(&'static str, f64)> {
        None
    }
}

/// Whether checkpoints hold the worker-local state of `app`'s input
/// blocks, so that a resumed job, or a lost worker's blocks re-read by
/// another, restore it instead of drawing it afresh: NMF's row factors and
/// LDA's document state; MLR and Lasso have none.
pub fn state_in_checkpoints(app: AppKind) -> bool {
    matches!(app, AppKind::Nmf | AppKind::Lda)
}

/// Whether a resumed job of `app` rebuilds its model from the workers'
/// restored state instead of reading the checkpoint's model blocks: its
/// servers create the blocks afresh (zeros) and every input block's
/// first sweep counts its tokens in. LDA's word-topic counts are a
/// function of the topic assignments, and a checkpoint copies each block
/// at its own moment, so counts restored beside the assignments would
/// disagree with them (see the module's doc).
pub fn model_rebuilt_on_resume(app: AppKind) -> bool {
    matches!(app, AppKind::Lda)
}

/// Whether a job of `app` that loses a worker or a server rebuilds its
/// model from the workers' state rather than restoring model blocks from
/// a checkpoint: LDA's word-topic counts are the sum of the topic
/// assignments, and a lost worker's assignments are counted in them while
/// a lost server's counts are gone. Every worker marks its state uncounted
/// ([`App::uncount`]) and every server zeroes its blocks, in that order
/// (the AM's recount, `reconfigure/recount.rs`), and each row's next sweep
/// counts it in again.
pub fn model_rebuilt_on_loss(app: AppKind) -> bool {
    matches!(app, AppKind::Lda)
}

/// The model parameters of the job's app, derived from the configuration.
pub fn params(config: &CruiseConfig) -> Result<AppParams, AppError> {
    let blocks = config.store.model_blocks;
    match config.job.app {
        AppKind::Mlr => mlr::params(&config.mlr, blocks),
        AppKind::Nmf => nmf::params(&config.nmf),
        AppKind::Lda => lda::params(&config.lda),
        AppKind::Lasso => lasso::params(&config.lasso, blocks),
    }
}

/// Builds the job's app.
pub fn build(config: &CruiseConfig, params: &AppParams) -> Result<Arc<dyn App>, AppError> {
    let seed = config.job.seed;
    Ok(match config.job.app {
        AppKind::Mlr => Arc::new(mlr::Mlr::new(&config.mlr, params)?),
        AppKind::Nmf => Arc::new(nmf::Nmf::new(&config.nmf, params, seed)?),
        AppKind::Lda => Arc::new(lda::Lda::new(&config.lda, params, seed)?),
        AppKind::Lasso => Arc::new(lasso::Lasso::new(&config.lasso, params)?),
    })
}

/// Rows (features) per model key when the configuration leaves it to us:
/// about four keys per model block, so blocks balance and moves are
/// fine-grained.
pub(crate) fn auto_rows_per_key(rows: u64, model_blocks: u32) -> u64 {
    let target_keys = u64::from(model_blocks.max(1)) * 4;
    rows.div_ceil(target_keys).max(1)
}

/// Calls `f` for every line of `text` (without its line ending) with a
/// function that makes a [`ParseError`] at the line's offset. Stops at the
/// first error. Lines that are not UTF-8 are errors.
pub(crate) fn for_each_line(
    text: &[u8],
    mut f: impl FnMut(&str, &dyn Fn(String) -> ParseError) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    let mut offset = 0usize;
    for raw in text.split_inclusive(|&b| b == b'\n') {
        let line_at = offset;
        offset += raw.len();
        let err = move |message: String| ParseError {
            offset: line_at,
            message,
        };
        let line = std::str::from_utf8(raw).map_err(|_| err("not UTF-8 text".into()))?;
        f(line, &err)?;
    }
    Ok(())
}

/// Parses the text of an input split whose records are one a line: a
/// first token (the label, a target or an id), then the record's sparse
/// entries. `record` reads a line's first token and pushes the entries
/// (into the emptied vector it is given) and returns the record's label.
/// Blank lines are skipped.
pub(crate) fn parse_records(
    text: &[u8],
    mut record: impl FnMut(
        &str,
        std::str::SplitAsciiWhitespace<'_>,
        &mut Vec<(u32, f32)>,
        &dyn Fn(String) -> ParseError,
    ) -> Result<f32, ParseError>,
) -> Result<InputBlock, ParseError> {
    let mut block = InputBlock::new();
    let mut entries: Vec<(u32, f32)> = Vec::new();
    for_each_line(text, |line, err| {
        let mut tokens = line.split_ascii_whitespace();
        let Some(first) = tokens.next() else {
            return Ok(()); // blank line
        };
        entries.clear();
        let label = record(first, tokens, &mut entries, err)?;
        block.push(label, entries.iter().copied());
        Ok(())
    })?;
    Ok(block)
}

/// How a sparse entry token of an app's input is written, for
/// [`entry_index`] and the messages it gives.
pub(crate) struct EntryForm<'a> {
    /// Between the index and the value (`:` in `index:value`).
    pub(crate) sep: char,
    /// The token's form, as a message quotes it (`index:value`).
    pub(crate) form: &'a str,
    /// The index's name when it does not parse (`index`).
    pub(crate) index: &'a str,
    /// The index's name when it is out of range (`feature index`).
    pub(crate) named: &'a str,
    /// The configuration key that bounds the index.
    pub(crate) key: &'a str,
    /// The key's value.
    pub(crate) setting: u32,
    /// Indices allowed are below this.
    pub(crate) end: u64,
}

/// Splits a sparse entry token written as `form` into its index (a
/// non-negative integer below `form.end`) and its value's text.
pub(crate) fn entry_index<'t>(
    tok: &'t str,
    form: &EntryForm<'_>,
    err: &dyn Fn(String) -> ParseError,
) -> Result<(u32, &'t str), ParseError> {
    let (i, v) = tok
        .split_once(form.sep)
        .ok_or_else(|| err(format!("token {tok:?} is not {}", form.form)))?;
    let i: u32 = i.parse().map_err(|_| {
        err(format!(
            "{} in {tok:?} is not a non-negative integer",
            form.index
        ))
    })?;
    if u64::from(i) >= form.end {
        return Err(err(format!(
            "{} {i} in {tok:?} is out of range: {} = {} allows 0..={}",
            form.named,
            form.key,
            form.setting,
            form.end.saturating_sub(1)
        )));
    }
    Ok((i, v))
}

/// A finite number: the value `v` of entry token `tok`.
pub(crate) fn finite_value(
    v: &str,
    tok: &str,
    err: &dyn Fn(String) -> ParseError,
) -> Result<f32, ParseError> {
    v.parse()
        .ok()
        .filter(|v: &f32| v.is_finite())
        .ok_or_else(|| err(format!("value in {tok:?} is not a finite number")))
}

/// The positions in `input.indices` (and `input.values`) of the entries of
/// records `rows`.
pub(crate) fn entry_range(input: &InputBlock, rows: Range<usize>) -> Range<usize> {
    input.offsets[rows.start] as usize..input.offsets[rows.end] as usize
}

/// The distinct keys of the entries of records `rows`, sorted, for apps
/// keyed by entry index; `extra` is a key every mini-batch needs besides.
pub(crate) fn entry_keys(
    input: &InputBlock,
    rows: Range<usize>,
    extra: Option<Key>,
    out: &mut Vec<Key>,
) {
    out.clear();
    out.extend(
        input.indices[entry_range(input, rows)]
            .iter()
            .map(|&i| Key::from(i)),
    );
    out.extend(extra);
    out.sort_unstable();
    out.dedup();
}

/// Deltas laid out as the pulled `values` they are for.
pub(crate) fn deltas_for(values: &ValueBatch, data: Vec<f32>) -> ValueBatch {
    ValueBatch {
        lens: values.lens.clone(),
        data,
    }
}

/// A standard normal variate (Box-Muller: reproducible across platforms).
pub(crate) fn normal(rng: &mut impl rand::Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Mixes a seed with two numbers into a new seed (SplitMix64 finaliser), for
/// per-key and per-row random streams that do not depend on who draws them.
pub(crate) fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut x = seed
        ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(17);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Reads a libsvm line's `index:value` tokens into `entries` (cleared
/// first). An index above `features` is out of range of `key`, the
/// configuration key that sets it; values must be finite.
pub(crate) fn libsvm_features<'a>(
    tokens: impl Iterator<Item = &'a str>,
    features: u32,
    key: &str,
    entries: &mut Vec<(u32, f32)>,
    err: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    let form = EntryForm {
        sep: ':',
        form: "index:value",
        index: "index",
        named: "feature index",
        key,
        setting: features,
        end: u64::from(features) + 1,
    };
    entries.clear();
    for tok in tokens {
        let (i, v) = entry_index(tok, &form, err)?;
        entries.push((i, finite_value(v, tok, err)?));
    }
    Ok(())
}

/// A model whose values start at zero and add the deltas pushed to them:
/// the weights of MLR and Lasso, LDA's word-topic counts.
pub(crate) struct AdditiveModel {
    /// Floats per key.
    pub(crate) value_len: usize,
}

impl AdditiveModel {
    /// The functions of an additive model of `value_len` floats per key.
    pub(crate) fn shared(value_len: usize) -> Arc<dyn ModelFunctions> {
        Arc::new(AdditiveModel { value_len })
    }
}

impl ModelFunctions for AdditiveModel {
    fn value_len(&self) -> usize {
        self.value_len
    }
    fn init(&self, _key: Key) -> Vec<f32> {
        vec![0.0; self.value_len]
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        for (v, d) in value.iter_mut().zip(delta) {
            *v += d;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Single-process training helpers shared by the apps' tests: a model in
    //! a hash map, updated with the app's own update function, driven like
    //! the worker loop drives it.

    use std::collections::HashMap;

    use super::*;
    use crate::store::StateBlock;

    /// The model of a single-process run.
    pub type Model = HashMap<Key, Vec<f32>>;

    fn pull(app: &dyn App, model: &mut Model, keys: &[Key]) -> ValueBatch {
        let f = app.model();
        let mut values = ValueBatch::default();
        for k in keys {
            values.push(model.entry(*k).or_insert_with(|| f.init(*k)));
        }
        values
    }

    /// Trains `epochs` passes over `input` in mini-batches of `batch`,
    /// returning the model; `state` is the block's state (if the app keeps
    /// any). Returns the per-epoch training statistics too.
    pub fn train_with_state(
        app: &dyn App,
        input: &InputBlock,
        state: &mut Option<StateBlock>,
        epochs: u32,
        batch: usize,
        model: &mut Model,
    ) -> Vec<Stats> {
        let f = app.model();
        let mut keys = Vec::new();
        let mut per_epoch = Vec::new();
        for epoch in 0..epochs {
            let mut total = Stats::default();
            for start in (0..input.len()).step_by(batch) {
                let rows = start..(start + batch).min(input.len());
                app.keys(input, rows.clone(), &mut keys);
                let values = pull(app, model, &keys);
                let (d, s) = app.compute(
                    input,
                    rows,
                    &keys,
                    &values,
                    state.as_mut(),
                    Step { clock: epoch },
                );
                total.add(&s);
                for (k, dv) in keys.iter().zip(d.iter()) {
                    if let Some(v) = model.get_mut(k) {
                        f.update(*k, v, dv);
                    }
                }
            }
            per_epoch.push(total);
        }
        per_epoch
    }

    /// Trains a stateless app; returns the model.
    pub fn train_single_process(
        app: &dyn App,
        input: &InputBlock,
        epochs: u32,
        batch: usize,
    ) -> Model {
        let mut model = Model::new();
        train_with_state(app, input, &mut None, epochs, batch, &mut model);
        model
    }

    /// Evaluates the whole block with the model.
    pub fn eval_with_state(
        app: &dyn App,
        input: &InputBlock,
        state: Option<&StateBlock>,
        model: &mut Model,
    ) -> Stats {
        let mut keys = Vec::new();
        let all = 0..input.len();
        app.keys(input, all.clone(), &mut keys);
        let values = pull(app, model, &keys);
        app.evaluate(input, all, &keys, &values, state)
    }

    /// Parses `text`, which must fail with a message containing `needle`;
    /// returns the error.
    pub fn parse_error(app: &dyn App, text: &[u8], needle: &str) -> ParseError {
        let e = app.parse(text).unwrap_err();
        assert!(e.message.contains(needle), "{}", e.message);
        e
    }

    /// Evaluates a stateless app over the whole block.
    pub fn eval_all(app: &dyn App, input: &InputBlock, model: &mut Model) -> Stats {
        eval_with_state(app, input, None, model)
    }
}
