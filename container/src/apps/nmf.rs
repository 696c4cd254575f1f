//! Non-negative matrix factorisation `X ≈ L·Rᵀ` trained with SGD on the
//! observed entries.
//!
//! # Input
//!
//! One row of the sparse matrix per line: `row: col,val col,val ...` — the
//! row id (an integer below 2^24) followed by a colon, then the row's observed
//! entries as `column,value` pairs (columns `0..columns`, finite values).
//! A row may have no entries. Each row must be on one line: a row id seen
//! twice in one input split is an error (across splits it cannot be checked,
//! and the two lines would train two independent row factors). Blank lines
//! are skipped. `cruise datagen nmf --from-triplets FILE` converts
//! `row col value` triplets (one entry per line) to this format.
//!
//! # Model and state
//!
//! - The column factors `R` live on servers, keyed by column: a value is
//!   `rank` floats, initially uniform in `[0, init_scale)` (deterministic in
//!   the key and the job seed). The server update is `max(0, v + δ)`: the
//!   delta, then the projection onto the non-negative orthant.
//! - The row factors `L` are worker-local state (`StateBlock::floats`,
//!   records × rank, in record order) that lives and moves with its input
//!   block, initially uniform in `[0, init_scale)` (deterministic in the row
//!   id and the job seed). Checkpoints hold them, so a resumed job and a
//!   lost worker's blocks re-read elsewhere take them back from the
//!   newest checkpoint instead of drawing them again.
//!
//! # Step
//!
//! For each observed entry `(i, j, x)` of a mini-batch, in order, with
//! `e = x − Lᵢ·Rⱼ` and `η = step_size / (1 + decay × epoch)`:
//! `Lᵢ ← max(0, Lᵢ + η(e·Rⱼ − λLᵢ))`, `Rⱼ ← max(0, Rⱼ + η(e·Lᵢ − λRⱼ))` on the
//! worker's copy of the pulled `R`; the mini-batch pushes `Rⱼ(new) − Rⱼ(pulled)`.
//! The step size schedule exists only on workers (it is computed from the
//! worker's epoch); servers apply deltas and project, so the two cannot
//! disagree.
//!
//! # Statistics
//!
//! `records` = rows; `loss_sum` = sum of squared errors over the observed
//! entries (during training: each before its own update); `loss_terms` =
//! observed entries. So the mean loss is the MSE and the derived figure is
//! the RMSE.

use std::collections::HashSet;
use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use cruise_conf::{AppKind, NmfConfig};

use super::{
    App, AppError, EntryForm, ParseError, Step, deltas_for, entry_index, entry_keys, finite_value,
    for_each_line, mix, normal, parse_records,
};
use crate::protocol::{AppParams, BlockId, Key, Stats, ValueBatch};
use crate::store::{InputBlock, ModelFunctions, StateBlock};

/// Row ids must be below this (they travel as `f32` labels).
pub const MAX_ROW_ID: u32 = 1 << 24;

/// Salt that separates the row-factor stream from the column-factor stream.
const ROW_SALT: u64 = 0x524f_5753;

/// Derives the model layout: keys are columns, values `rank` floats;
/// `extra = [columns, rank]`.
pub fn params(c: &NmfConfig) -> Result<AppParams, AppError> {
    Ok(AppParams {
        value_len: c.rank,
        model_keys: u64::from(c.columns),
        extra: vec![u64::from(c.columns), u64::from(c.rank)],
    })
}

/// The NMF app.
#[derive(Debug, Clone)]
pub struct Nmf {
    columns: u32,
    rank: usize,
    step_size: f32,
    decay: f32,
    l2: f32,
    init_scale: f32,
    seed: u64,
}

impl Nmf {
    /// Builds the app from its configuration, the job's parameters and seed.
    pub fn new(c: &NmfConfig, p: &AppParams, seed: u64) -> Result<Self, AppError> {
        let bad = |m: String| AppError::Params {
            app: AppKind::Nmf,
            message: m,
        };
        if p.extra != [u64::from(c.columns), u64::from(c.rank)]
            || p.value_len != c.rank
            || p.model_keys != u64::from(c.columns)
        {
            return Err(bad(format!(
                "parameters {p:?} disagree with the configuration"
            )));
        }
        Ok(Nmf {
            columns: c.columns,
            rank: c.rank as usize,
            step_size: c.step_size as f32,
            decay: c.decay as f32,
            l2: c.l2 as f32,
            init_scale: c.init_scale as f32,
            seed,
        })
    }

    /// The initial factor of a row.
    pub fn init_row(&self, row: u32, out: &mut [f32]) {
        uniform_factor(
            mix(self.seed, ROW_SALT, u64::from(row)),
            self.init_scale,
            out,
        );
    }

    fn state_ok(&self, input: &InputBlock, state: &StateBlock) -> bool {
        state.floats.len() == input.len() * self.rank
    }

    fn values_ok(&self, keys: &[Key], values: &ValueBatch) -> bool {
        values.len() == keys.len() && values.data.len() == keys.len() * self.rank
    }
}

fn uniform_factor(seed: u64, scale: f32, out: &mut [f32]) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for v in out.iter_mut() {
        *v = rng.random::<f32>() * scale;
    }
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The column factors' functions: random non-negative start, add-and-project.
struct ColumnModel {
    rank: usize,
    scale: f32,
    seed: u64,
}

impl ModelFunctions for ColumnModel {
    fn value_len(&self) -> usize {
        self.rank
    }
    fn init(&self, key: Key) -> Vec<f32> {
        let mut v = vec![0.0; self.rank];
        uniform_factor(mix(self.seed, 0, key), self.scale, &mut v);
        v
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        for (v, d) in value.iter_mut().zip(delta) {
            *v = (*v + d).max(0.0);
        }
    }
}

impl App for Nmf {
    fn kind(&self) -> AppKind {
        AppKind::Nmf
    }

    fn model(&self) -> Arc<dyn ModelFunctions> {
        Arc::new(ColumnModel {
            rank: self.rank,
            scale: self.init_scale,
            seed: self.seed,
        })
    }

    fn parse(&self, text: &[u8]) -> Result<InputBlock, ParseError> {
        let mut seen: HashSet<u32> = HashSet::new();
        let form = EntryForm {
            sep: ',',
            form: "column,value",
            index: "column",
            named: "column",
            key: "nmf.columns",
            setting: self.columns,
            end: u64::from(self.columns),
        };
        parse_records(text, |row_tok, tokens, entries, err| {
            let row: u32 = row_tok
                .strip_suffix(':')
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| {
                    err(format!(
                        "{row_tok:?} is not a row id followed by ':' (expected `row: col,val col,val ...`)"
                    ))
                })?;
            if row >= MAX_ROW_ID {
                return Err(err(format!(
                    "row id {row} is too large (row ids must be below 2^24 = {MAX_ROW_ID})"
                )));
            }
            if !seen.insert(row) {
                return Err(err(format!(
                    "row {row} appears twice; each row must be on one line"
                )));
            }
            for tok in tokens {
                let (c, v) = entry_index(tok, &form, err)?;
                entries.push((c, finite_value(v, tok, err)?));
            }
            Ok(row as f32)
        })
    }

    fn has_state(&self) -> bool {
        true
    }

    fn init_state(&self, _block: BlockId, input: &InputBlock) -> Option<StateBlock> {
        let mut floats = vec![0f32; input.len() * self.rank];
        for (r, l) in floats.chunks_exact_mut(self.rank).enumerate() {
            self.init_row(input.labels[r] as u32, l);
        }
        Some(StateBlock {
            floats,
            ints: Vec::new(),
        })
    }

    fn restore_state(&self, input: &InputBlock, state: StateBlock) -> Option<StateBlock> {
        (self.state_ok(input, &state) && state.ints.is_empty()).then_some(state)
    }

    fn keys(&self, input: &InputBlock, rows: Range<usize>, out: &mut Vec<Key>) {
        entry_keys(input, rows, None, out);
    }

    fn compute(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        state: Option<&mut StateBlock>,
        step: Step,
    ) -> (ValueBatch, Stats) {
        let mut stats = Stats::default();
        let Some(state) = state else {
            return (ValueBatch::default(), stats);
        };
        if !self.values_ok(keys, values) || !self.state_ok(input, state) || rows.is_empty() {
            return (ValueBatch::default(), stats);
        }
        let k = self.rank;
        let lr = step.learning_rate(self.step_size, self.decay);
        let l2 = self.l2;
        let mut r_local = values.data.clone();
        for r in rows {
            let (_, cols, vals) = input.record(r);
            let l = &mut state.floats[r * k..(r + 1) * k];
            for (&c, &x) in cols.iter().zip(vals) {
                let Ok(p) = keys.binary_search(&Key::from(c)) else {
                    continue;
                };
                let rj = &mut r_local[p * k..(p + 1) * k];
                let e = x - dot(l, rj);
                stats.loss_sum += f64::from(e) * f64::from(e);
                stats.loss_terms += 1;
                for (li, ri) in l.iter_mut().zip(rj.iter_mut()) {
                    let (lo, ro) = (*li, *ri);
                    *li = (lo + lr * (e * ro - l2 * lo)).max(0.0);
                    *ri = (ro + lr * (e * lo - l2 * ro)).max(0.0);
                }
            }
            stats.records += 1;
        }
        for (d, v) in r_local.iter_mut().zip(&values.data) {
            *d -= v;
        }
        (deltas_for(values, r_local), stats)
    }

    fn evaluate(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        state: Option<&StateBlock>,
    ) -> Stats {
        let mut stats = Stats::default();
        let Some(state) = state else {
            return stats;
        };
        if !self.values_ok(keys, values) || !self.state_ok(input, state) {
            return stats;
        }
        let k = self.rank;
        for r in rows {
            let (_, cols, vals) = input.record(r);
            let l = &state.floats[r * k..(r + 1) * k];
            for (&c, &x) in cols.iter().zip(vals) {
                let Ok(p) = keys.binary_search(&Key::from(c)) else {
                    continue;
                };
                let e = x - dot(l, &values.data[p * k..(p + 1) * k]);
                stats.loss_sum += f64::from(e) * f64::from(e);
                stats.loss_terms += 1;
            }
            stats.records += 1;
        }
        stats
    }

    fn loss_name(&self) -> &'static str {
        "mse"
    }

    fn derived_metric(&self, stats: &Stats) -> Option<(&'static str, f64)> {
        Some(("rmse", stats.mean_loss().sqrt()))
    }
}

/// Parameters of the generated matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub columns: u32,
    /// Rank of the ground truth.
    pub rank: u32,
    /// Probability that an entry is observed.
    pub density: f64,
    /// Standard deviation of the Gaussian noise.
    pub noise: f64,
    /// Seed.
    pub seed: u64,
}

/// What a generated matrix was made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Truth {
    /// Observed entries written.
    pub entries: u64,
    /// Root mean square of the noise actually added to the written entries
    /// (after rounding to the printed digits): the RMSE of the ground truth.
    pub noise_rms: f64,
}

/// Writes a low-rank non-negative matrix plus noise in the row format:
/// `L` (rows × rank) and `R` (columns × rank) uniform in `[0, 1)`, each entry
/// observed with probability `density`, value `L_i·R_j + noise`.
pub fn generate(p: &GenParams, out: &mut impl Write) -> std::io::Result<(u64, Truth)> {
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let k = p.rank.max(1) as usize;
    let rf: Vec<f64> = (0..p.columns as usize * k)
        .map(|_| rng.random::<f64>())
        .collect();
    let mut l = vec![0f64; k];
    let mut written = 0u64;
    let mut entries = 0u64;
    let mut sq = 0f64;
    let mut line = String::new();
    for i in 0..p.rows {
        for v in l.iter_mut() {
            *v = rng.random::<f64>();
        }
        line.clear();
        line.push_str(&format!("{i}:"));
        for j in 0..p.columns as usize {
            if rng.random::<f64>() >= p.density {
                continue;
            }
            let clean: f64 = l
                .iter()
                .zip(&rf[j * k..(j + 1) * k])
                .map(|(a, b)| a * b)
                .sum();
            let x = ((clean + p.noise * normal(&mut rng)) * 1e4).round() / 1e4;
            sq += (x - clean) * (x - clean);
            entries += 1;
            line.push_str(&format!(" {j},{x:.4}"));
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
    }
    let noise_rms = if entries == 0 {
        0.0
    } else {
        (sq / entries as f64).sqrt()
    };
    Ok((written, Truth { entries, noise_rms }))
}

/// Converts `row col value` triplets (one entry per line, any order; blank
/// lines and lines starting with `#` or `%` skipped) to the row format, rows
/// in increasing order. Errors name the offset of the bad line.
pub fn triplets_to_rows(text: &[u8]) -> Result<String, ParseError> {
    let mut rows: std::collections::BTreeMap<u32, Vec<(u32, String)>> = Default::default();
    for_each_line(text, |line, err| {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            return Ok(());
        }
        let f: Vec<&str> = t.split_ascii_whitespace().collect();
        let [r, c, v] = f[..] else {
            return Err(err(format!(
                "{t:?} is not a `row col value` triplet ({} fields)",
                f.len()
            )));
        };
        let r: u32 = r
            .parse()
            .ok()
            .filter(|&r| r < MAX_ROW_ID)
            .ok_or_else(|| err(format!("row {r:?} is not an integer below 2^24")))?;
        let c: u32 = c
            .parse()
            .map_err(|_| err(format!("column {c:?} is not a non-negative integer")))?;
        if !v.parse::<f64>().is_ok_and(f64::is_finite) {
            return Err(err(format!("value {v:?} is not a finite number")));
        }
        rows.entry(r).or_default().push((c, v.to_string()));
        Ok(())
    })?;
    let mut out = String::new();
    for (r, mut entries) in rows {
        entries.sort_by_key(|e| e.0);
        out.push_str(&format!("{r}:"));
        for (c, v) in entries {
            out.push_str(&format!(" {c},{v}"));
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::tests::{Model, eval_with_state, parse_error, train_with_state};

    fn config(columns: u32, rank: u32) -> NmfConfig {
        NmfConfig {
            columns,
            rank,
            ..NmfConfig::default()
        }
    }

    fn app(c: &NmfConfig) -> Nmf {
        Nmf::new(c, &params(c).unwrap(), 11).unwrap()
    }

    #[test]
    fn parse_rows() {
        let a = app(&config(10, 2));
        let b = a.parse(b"3: 0,1.5 9,2\n\n7:\r\n0: 4,-1\n").unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b.record(0), (3.0, &[0u32, 9][..], &[1.5f32, 2.0][..]));
        assert_eq!(b.record(1).1.len(), 0);
        assert_eq!(b.record(2), (0.0, &[4u32][..], &[-1.0f32][..]));
    }

    #[test]
    fn parse_errors_name_the_token_and_offset() {
        let a = app(&config(10, 2));
        assert_eq!(
            parse_error(&a, b"1: 0,1\n2 0,1\n", "\"2\" is not a row id").offset,
            7
        );
        parse_error(&a, b"1: 10,1\n", "column 10");
        parse_error(&a, b"1: 3:1\n", "column,value");
        parse_error(&a, b"1: 3,x\n", "finite");
        assert_eq!(
            parse_error(&a, b"1: 3,1\n1: 4,1\n", "appears twice").offset,
            7
        );
        parse_error(&a, b"16777216: 3,1\n", "too large");
    }

    #[test]
    fn server_update_projects() {
        let a = app(&config(4, 3));
        let m = a.model();
        let mut v = m.init(2);
        assert_eq!(v, m.init(2), "init is deterministic in the key");
        assert!(v.iter().all(|x| (0.0..0.5).contains(x)));
        let before = v.clone();
        m.update(2, &mut v, &[-10.0, 0.25, 0.0]);
        assert_eq!(v, vec![0.0, before[1] + 0.25, before[2]]);
    }

    /// One entry, one step: the analytic update and the pushed delta.
    #[test]
    fn step_matches_the_sgd_rule() {
        let c = NmfConfig {
            step_size: 0.1,
            decay: 1.0,
            l2: 0.01,
            ..config(4, 2)
        };
        let a = app(&c);
        let input = a.parse(b"5: 1,2.0\n").unwrap();
        let mut state = a.init_state(BlockId(0), &input).unwrap();
        let l0 = state.floats.clone();
        let mut keys = Vec::new();
        a.keys(&input, 0..1, &mut keys);
        assert_eq!(keys, vec![1]);
        let mut values = ValueBatch::default();
        values.push(&[0.5, 0.25]);
        let (d, s) = a.compute(
            &input,
            0..1,
            &keys,
            &values,
            Some(&mut state),
            Step { clock: 1 },
        );
        let lr = 0.1 / 2.0; // decayed once
        let e = 2.0 - (l0[0] * 0.5 + l0[1] * 0.25);
        assert!((s.loss_sum - f64::from(e * e)).abs() < 1e-5);
        assert_eq!((s.records, s.loss_terms), (1, 1));
        for (f, &lf) in l0.iter().enumerate() {
            let r0 = values.data[f];
            let want_l = (lf + lr * (e * r0 - 0.01 * lf)).max(0.0);
            let want_r = (r0 + lr * (e * lf - 0.01 * r0)).max(0.0);
            assert!((state.floats[f] - want_l).abs() < 1e-6);
            assert!((r0 + d.data[f] - want_r).abs() < 1e-6);
        }
    }

    /// Gradient of the squared error w.r.t. both factors matches finite
    /// differences of `evaluate` (one entry, no regularisation).
    #[test]
    fn gradient_matches_finite_differences() {
        let c = NmfConfig {
            step_size: 1e-3,
            decay: 0.0,
            l2: 0.0,
            ..config(3, 3)
        };
        let a = app(&c);
        let input = a.parse(b"0: 2,3.0\n").unwrap();
        let state = StateBlock {
            floats: vec![0.4, 0.7, 0.2],
            ints: Vec::new(),
        };
        let keys = vec![2];
        let mut values = ValueBatch::default();
        values.push(&[0.3, 0.6, 0.9]);
        let mut st = state.clone();
        let (d, _) = a.compute(
            &input,
            0..1,
            &keys,
            &values,
            Some(&mut st),
            Step { clock: 0 },
        );
        let loss = |s: &StateBlock, v: &ValueBatch| {
            0.5 * a.evaluate(&input, 0..1, &keys, v, Some(s)).loss_sum
        };
        let h = 1e-3;
        for f in 0..3 {
            // Column factor: delta = −lr·∂(½e²)/∂R.
            let (mut p, mut m) = (values.clone(), values.clone());
            p.data[f] += h;
            m.data[f] -= h;
            let g = (loss(&state, &p) - loss(&state, &m)) / (2.0 * f64::from(h));
            let analytic = -f64::from(d.data[f]) / 1e-3;
            assert!((g - analytic).abs() < 2e-2, "R[{f}]: {g} vs {analytic}");
            // Row factor.
            let (mut sp, mut sm) = (state.clone(), state.clone());
            sp.floats[f] += h;
            sm.floats[f] -= h;
            let g = (loss(&sp, &values) - loss(&sm, &values)) / (2.0 * f64::from(h));
            let analytic = -f64::from(st.floats[f] - state.floats[f]) / 1e-3;
            assert!((g - analytic).abs() < 2e-2, "L[{f}]: {g} vs {analytic}");
        }
    }

    #[test]
    fn triplets_convert_to_rows() {
        let out = triplets_to_rows(b"# comment\n2 1 0.5\n0 3 1\n2 0 -1.25\n\n").unwrap();
        assert_eq!(out, "0: 3,1\n2: 0,-1.25 1,0.5\n");
        let e = triplets_to_rows(b"1 2 3\n1 2\n").unwrap_err();
        assert_eq!(e.offset, 6);
        assert!(e.message.contains("triplet"), "{}", e.message);
        let e = triplets_to_rows(b"1 2 x\n").unwrap_err();
        assert!(e.message.contains("\"x\""), "{}", e.message);
    }

    /// Generated data trains to the noise level in one process.
    #[test]
    fn generated_data_is_reproducible_and_trains_to_the_noise() {
        let p = GenParams {
            rows: 400,
            columns: 200,
            rank: 4,
            density: 0.3,
            noise: 0.1,
            seed: 9,
        };
        let mut buf = Vec::new();
        let (_, truth) = generate(&p, &mut buf).unwrap();
        let mut again = Vec::new();
        let (_, truth2) = generate(&p, &mut again).unwrap();
        assert_eq!(buf, again, "seeded generation is reproducible");
        assert_eq!(truth, truth2);
        assert!((truth.noise_rms - 0.1).abs() < 0.01, "{truth:?}");
        let c = NmfConfig {
            step_size: 0.05,
            decay: 0.05,
            l2: 1e-3,
            ..config(200, 4)
        };
        let a = app(&c);
        let input = a.parse(&buf).unwrap();
        assert_eq!(input.len(), 400);
        assert_eq!(input.indices.len() as u64, truth.entries);
        let mut state = a.init_state(BlockId(0), &input);
        let mut model = Model::new();
        let epochs = train_with_state(&a, &input, &mut state, 40, 20, &mut model);
        let first = epochs[0].mean_loss().sqrt();
        let s = eval_with_state(&a, &input, state.as_ref(), &mut model);
        let rmse = a.derived_metric(&s).unwrap().1;
        assert!(
            rmse < truth.noise_rms * 1.1 && rmse > truth.noise_rms * 0.8,
            "training RMSE {rmse} (first epoch {first}) vs noise {}",
            truth.noise_rms
        );
        assert!(state.unwrap().floats.iter().all(|&x| x >= 0.0));
        assert!(model.values().flatten().all(|&x| x >= 0.0));
    }
}
