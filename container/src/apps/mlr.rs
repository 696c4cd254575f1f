//! Multinomial logistic regression: sparse softmax regression trained with
//! mini-batch SGD and L2 regularisation.
//!
//! # Input
//!
//! libsvm text, one record per line: `label index:value index:value ...`.
//! Labels are integers `0..classes` (a label equal to `classes` is out of range);
//! indices are `0..=features` (libsvm data is 1-based, 0 is accepted too).
//! Blank lines are skipped. Anything else is an error naming the token.
//!
//! # Model
//!
//! Weights for `features + 2` rows (indices `0..=features`, plus a bias row)
//! times `classes`. A model key holds `features_per_key` consecutive rows for
//! all classes, so a value is `features_per_key × classes` floats. Values start
//! at zero; the update function adds the delta.
//!
//! # Step
//!
//! `step = step_size / (1 + decay × epoch)`, computed by the worker from its
//! local epoch; the server only adds, so workers and servers cannot disagree
//! about the schedule.

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use cruise_conf::{AppKind, MlrConfig};

use super::{App, AppError, ParseError, Step, auto_rows_per_key, entry_range, keyindex};
use crate::protocol::{AppParams, Key, Stats, ValueBatch};
use crate::store::{InputBlock, ModelFunctions, StateBlock};

/// Derives the model layout from the configuration.
pub fn params(c: &MlrConfig, model_blocks: u32) -> Result<AppParams, AppError> {
    let rows = u64::from(c.features) + 2;
    let fpk = if c.features_per_key == 0 {
        auto_rows_per_key(rows, model_blocks)
    } else {
        u64::from(c.features_per_key)
    };
    let value_len = fpk * u64::from(c.classes);
    let value_len = u32::try_from(value_len).map_err(|_| AppError::Params {
        app: AppKind::Mlr,
        message: format!("features_per_key × classes = {value_len} is too large"),
    })?;
    Ok(AppParams {
        value_len,
        model_keys: rows.div_ceil(fpk),
        extra: vec![u64::from(c.classes), u64::from(c.features), fpk],
    })
}

/// Division and remainder of 32-bit numbers by a divisor fixed at run time,
/// by multiplication (Lemire, Kaser and Kurz, "Faster remainder by direct
/// computation", 2019): a mini-batch divides every entry's feature index by
/// the features per key, and a hardware division costs several times more.
#[derive(Debug, Clone, Copy)]
struct FastDiv {
    d: u32,
    /// `⌈2⁶⁴ / d⌉` (0 when `d` is 1, which is handled apart).
    m: u64,
}

impl FastDiv {
    fn new(d: u32) -> FastDiv {
        let d = d.max(1);
        FastDiv {
            d,
            m: if d == 1 {
                0
            } else {
                u64::MAX / u64::from(d) + 1
            },
        }
    }

    #[inline]
    fn div(self, n: u32) -> u32 {
        if self.d == 1 {
            return n;
        }
        ((u128::from(self.m) * u128::from(n)) >> 64) as u32
    }

    #[inline]
    fn rem(self, n: u32) -> u32 {
        if self.d == 1 {
            return 0;
        }
        let low = self.m.wrapping_mul(u64::from(n));
        ((u128::from(low) * u128::from(self.d)) >> 64) as u32
    }
}

/// Runs `$body` with the const `$k` bound to `$classes` when it is a common
/// class count (2 to 16), else to 0 (the kernels then read the count at run
/// time). With the count known at compile time the per-entry loops over the
/// classes unroll without bounds checks, and the divisions by it become
/// multiplications.
macro_rules! with_classes {
    ($classes:expr, $k:ident => $body:expr) => {
        with_classes!(@arms $classes, $k, $body; 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    };
    (@arms $classes:expr, $k:ident, $body:expr; $($n:literal)*) => {
        match $classes {
            $($n => {
                const $k: usize = $n;
                $body
            })*
            _ => {
                const $k: usize = 0;
                $body
            }
        }
    };
}

/// The MLR app.
#[derive(Debug, Clone)]
pub struct Mlr {
    classes: usize,
    features: u32,
    fpk: usize,
    /// Division by `fpk` of a feature index, by multiplication.
    fpk_div: FastDiv,
    value_len: usize,
    model_keys: u64,
    step_size: f32,
    decay: f32,
    l2: f32,
}

impl Mlr {
    /// Builds the app from its configuration and the job's parameters.
    pub fn new(c: &MlrConfig, p: &AppParams) -> Result<Self, AppError> {
        let bad = |m: String| AppError::Params {
            app: AppKind::Mlr,
            message: m,
        };
        let [classes, features, fpk] = p.extra[..] else {
            return Err(bad(format!("expected 3 parameters, got {:?}", p.extra)));
        };
        if classes != u64::from(c.classes) || features != u64::from(c.features) {
            return Err(bad("parameters disagree with the configuration".into()));
        }
        if fpk == 0 || u64::from(p.value_len) != fpk * classes {
            return Err(bad(format!("bad layout: {p:?}")));
        }
        Ok(Mlr {
            classes: classes as usize,
            features: c.features,
            fpk: fpk as usize,
            fpk_div: FastDiv::new(
                u32::try_from(fpk)
                    .map_err(|_| bad(format!("features_per_key {fpk} is too large")))?,
            ),
            value_len: p.value_len as usize,
            model_keys: p.model_keys,
            step_size: c.step_size as f32,
            decay: c.decay as f32,
            l2: c.l2 as f32,
        })
    }

    fn bias_row(&self) -> u64 {
        u64::from(self.features) + 1
    }

    fn key_of(&self, row: u64) -> Key {
        row / self.fpk as u64
    }

    /// Position of `row`'s weights in a value batch laid out as `keys`.
    #[inline]
    fn slot(&self, keys: &[Key], row: u64) -> Option<usize> {
        let k = self.key_of(row);
        keys.binary_search(&k)
            .ok()
            .map(|p| p * self.value_len + (row as usize % self.fpk) * self.classes)
    }

    /// The weight offsets of every entry of `rows` (in entry order) in a value
    /// batch laid out as `keys`; [`keyindex::ABSENT`] where the key was not
    /// pulled. Computed once per mini-batch, so the passes over the records
    /// index straight into the values.
    fn entry_slots(&self, input: &InputBlock, rows: &Range<usize>, keys: &[Key]) -> Vec<u32> {
        let entries = &input.indices[entry_range(input, rows.clone())];
        let mut pos = Vec::with_capacity(entries.len());
        keyindex::positions(
            keys,
            self.model_keys,
            entries.iter().map(|&i| u64::from(self.fpk_div.div(i))),
            &mut pos,
        );
        for (p, &i) in pos.iter_mut().zip(entries) {
            if *p != keyindex::ABSENT {
                let off =
                    *p as usize * self.value_len + self.fpk_div.rem(i) as usize * self.classes;
                *p = u32::try_from(off).unwrap_or(keyindex::ABSENT);
            }
        }
        pos
    }

    /// Scores of one record into `scores` from its entries' weight offsets
    /// (`slots`, see [`Mlr::entry_slots`]) and the bias row's; returns the
    /// predicted class. `K` is the class count when known at compile time
    /// (see [`with_classes`]), 0 when only at run time.
    #[inline]
    fn scores<const K: usize>(
        &self,
        w: &[f32],
        bias: Option<usize>,
        slots: &[u32],
        val: &[f32],
        scores: &mut [f32],
    ) -> usize {
        let k = if K == 0 { self.classes } else { K };
        let scores = &mut scores[..k];
        match bias {
            Some(b) => scores.copy_from_slice(&w[b..b + k]),
            None => scores.fill(0.0),
        }
        for (&s, &v) in slots.iter().zip(val) {
            if s != keyindex::ABSENT {
                let s = s as usize;
                for (sc, wk) in scores.iter_mut().zip(&w[s..s + k]) {
                    *sc += wk * v;
                }
            }
        }
        let mut best = 0;
        for c in 1..k {
            if scores[c] > scores[best] {
                best = c;
            }
        }
        best
    }

    /// The gradient step of a mini-batch ([`App::compute`]'s work), with the
    /// class count `K` known at compile time where it can be (0: run time).
    fn step<const K: usize>(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        step: Step,
    ) -> (ValueBatch, Stats) {
        let mut stats = Stats::default();
        let k = if K == 0 { self.classes } else { K };
        let w = &values.data;
        let mut grad = vec![0f32; w.len()];
        let mut touched = vec![false; keys.len() * self.fpk];
        let mut p = vec![0f32; k];
        let bias = self.slot(keys, self.bias_row());
        let slots = self.entry_slots(input, &rows, keys);
        let base = input.offsets[rows.start] as usize;
        for r in rows.clone() {
            let (label, _, val) = input.record(r);
            let e = entry_range(input, r..r + 1);
            let slots = &slots[e.start - base..e.end - base];
            let y = label as usize;
            let pred = self.scores::<K>(w, bias, slots, val, &mut p);
            softmax(&mut p);
            stats.records += 1;
            stats.loss_sum += -f64::from(p[y].max(1e-12)).ln();
            stats.correct += u64::from(pred == y);
            p[y] -= 1.0; // p is now the gradient of the loss w.r.t. the scores
            if let Some(b) = bias {
                for (g, d) in grad[b..b + k].iter_mut().zip(&p) {
                    *g += d;
                }
            }
            for (&s, &v) in slots.iter().zip(val) {
                if s != keyindex::ABSENT {
                    let s = s as usize;
                    touched[s / k] = true;
                    for (g, d) in grad[s..s + k].iter_mut().zip(&p) {
                        *g += d * v;
                    }
                }
            }
        }
        let lr = step.learning_rate(self.step_size, self.decay);
        let scale = 1.0 / rows.len() as f32;
        for (row, t) in touched.iter().enumerate() {
            let range = row * k..(row + 1) * k;
            if *t {
                for j in range {
                    grad[j] = -lr * (grad[j] * scale + self.l2 * w[j]);
                }
            } else {
                for j in range {
                    grad[j] *= -lr * scale;
                }
            }
        }
        (super::deltas_for(values, grad), stats)
    }

    /// [`App::evaluate`]'s work, with `K` as in [`Mlr::step`].
    fn eval<const K: usize>(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
    ) -> Stats {
        let mut stats = Stats::default();
        let mut p = vec![0f32; self.classes];
        let bias = self.slot(keys, self.bias_row());
        let slots = self.entry_slots(input, &rows, keys);
        let base = input.offsets[rows.start] as usize;
        for r in rows {
            let (label, _, val) = input.record(r);
            let e = entry_range(input, r..r + 1);
            let y = label as usize;
            let pred = self.scores::<K>(
                &values.data,
                bias,
                &slots[e.start - base..e.end - base],
                val,
                &mut p,
            );
            softmax(&mut p);
            stats.records += 1;
            stats.loss_sum += -f64::from(p[y].max(1e-12)).ln();
            stats.correct += u64::from(pred == y);
        }
        stats
    }

    /// Whether the weight offsets fit the values (a batch too large for
    /// 32-bit offsets is refused rather than misread).
    fn slots_fit(&self, values: &ValueBatch) -> bool {
        values.data.len() < keyindex::ABSENT as usize
    }

    fn check_values(&self, keys: &[Key], values: &ValueBatch) -> bool {
        values.len() == keys.len() && values.data.len() == keys.len() * self.value_len
    }
}

/// A score this far below the largest gets probability 0 in [`softmax`]:
/// `e^-60` is about `1e-26`, twenty orders of magnitude below anything an
/// `f32` gradient sum of probabilities near 1 can hold.
const NEGLIGIBLE_SCORE_GAP: f32 = -60.0;

/// Softmax in place.
///
/// Scores more than [`NEGLIGIBLE_SCORE_GAP`] below the largest get exactly
/// 0, not `exp` of the gap: past about -87 that is a subnormal number, and
/// so are its products in the gradient, which the CPU computes in
/// microcode at many times the cost. As a model grows confident more of
/// its scores fall there. Measured on `bench-optimizer`'s small case (MLR,
/// 10 classes, 7 workers of 0.15-0.3 CPU), seven alternating pairs of runs
/// (cutoffs -80 and -60): the last 20 of 40 epochs took 0.114-0.119 s,
/// against 0.119-0.125 s computing every `exp`.
///
/// `exp` only ever sees the gap clamped to the cutoff. With the class count
/// known at compile time the compiler unrolls this loop, calls `exp` for
/// every score and selects after (branch-free); unclamped, a gap past
/// about -104 then took libm's underflow path (a subnormal product to raise
/// the CPU's underflow flag, then `errno`) however the select came out. On
/// the small case from 7 workers and 1 server that path and subnormal
/// `exp` results were 4–6% of a worker's CPU just after its plan
/// (`perf`), while the model was far from settled.
fn softmax(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        let gap = *s - max;
        // `clamp` keeps a NaN score NaN (a diverged model shows as such).
        let e = gap.clamp(NEGLIGIBLE_SCORE_GAP, 0.0).exp();
        *s = if gap < NEGLIGIBLE_SCORE_GAP { 0.0 } else { e };
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

impl App for Mlr {
    fn kind(&self) -> AppKind {
        AppKind::Mlr
    }

    fn model(&self) -> Arc<dyn ModelFunctions> {
        super::AdditiveModel::shared(self.value_len)
    }

    fn parse(&self, text: &[u8]) -> Result<InputBlock, ParseError> {
        super::parse_records(text, |label_tok, tokens, entries, err| {
            let label: f64 = label_tok
                .parse()
                .map_err(|_| err(format!("label {label_tok:?} is not a number")))?;
            if label.fract() != 0.0 || label < 0.0 || label >= self.classes as f64 {
                return Err(err(format!(
                    "label {label_tok} is out of range: mlr.classes = {} allows labels 0..={}",
                    self.classes,
                    self.classes - 1
                )));
            }
            super::libsvm_features(tokens, self.features, "mlr.features", entries, err)?;
            Ok(label as f32)
        })
    }

    fn keys(&self, input: &InputBlock, rows: Range<usize>, out: &mut Vec<Key>) {
        out.clear();
        let entries = input.indices[entry_range(input, rows)]
            .iter()
            .map(|&i| u64::from(self.fpk_div.div(i)));
        let bias = std::iter::once(self.key_of(self.bias_row()));
        keyindex::distinct_sorted(entries.chain(bias), self.model_keys, out);
    }

    fn compute(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        _state: Option<&mut StateBlock>,
        step: Step,
    ) -> (ValueBatch, Stats) {
        if !self.check_values(keys, values) || !self.slots_fit(values) || rows.is_empty() {
            return (ValueBatch::default(), Stats::default());
        }
        with_classes!(self.classes, K => self.step::<K>(input, rows, keys, values, step))
    }

    fn evaluate(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        _state: Option<&StateBlock>,
    ) -> Stats {
        if !self.check_values(keys, values) || !self.slots_fit(values) || rows.is_empty() {
            return Stats::default();
        }
        with_classes!(self.classes, K => self.eval::<K>(input, rows, keys, values))
    }

    fn loss_name(&self) -> &'static str {
        "log-loss"
    }

    fn has_accuracy(&self) -> bool {
        true
    }
}

/// Parameters of the generated data set.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Records.
    pub samples: u64,
    /// Features (indices 1..=features).
    pub features: u32,
    /// Classes (labels 0..classes).
    pub classes: u32,
    /// Non-zero features per record.
    pub nnz: u32,
    /// Seed.
    pub seed: u64,
}

/// Writes a linearly separable data set in libsvm format: a random weight
/// matrix (the ground truth) labels each sparse record with its best class.
/// Returns the number of bytes written.
pub fn generate(p: &GenParams, out: &mut impl Write) -> std::io::Result<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let (f, k) = (p.features as usize, p.classes as usize);
    let normal = |rng: &mut ChaCha8Rng| -> f32 {
        // Box-Muller: exact enough and reproducible across platforms.
        let u1: f64 = rng.random::<f64>().max(1e-300);
        let u2: f64 = rng.random();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    };
    let truth: Vec<f32> = (0..(f + 1) * k).map(|_| normal(&mut rng)).collect();
    let nnz = (p.nnz as usize).clamp(1, f.max(1));
    let mut written = 0u64;
    let mut line = String::new();
    let mut idx: Vec<u32> = Vec::with_capacity(nnz);
    let mut scores = vec![0f32; k];
    for _ in 0..p.samples {
        idx.clear();
        while idx.len() < nnz {
            let i = rng.random_range(1..=p.features);
            if !idx.contains(&i) {
                idx.push(i);
            }
        }
        idx.sort_unstable();
        // Values rounded to what we print, so the labels are exact for the file.
        let vals: Vec<f32> = idx
            .iter()
            .map(|_| (rng.random_range(1..=1000u32) as f32) / 1000.0)
            .collect();
        scores.fill(0.0);
        for (&i, &v) in idx.iter().zip(&vals) {
            let row = &truth[i as usize * k..(i as usize + 1) * k];
            for (s, w) in scores.iter_mut().zip(row) {
                *s += w * v;
            }
        }
        let label = (0..k)
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
            .unwrap_or(0);
        line.clear();
        line.push_str(&label.to_string());
        for (&i, &v) in idx.iter().zip(&vals) {
            line.push_str(&format!(" {i}:{v:.3}"));
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::tests::parse_error;

    /// Far-behind scores get probability 0, never a subnormal number;
    /// the others are the plain softmax.
    #[test]
    fn softmax_gives_negligible_scores_zero() {
        let mut p = [0.0f32, -100.0, -2.0, -59.0];
        softmax(&mut p);
        assert_eq!(p[1], 0.0);
        assert!(p.iter().all(|x| *x == 0.0 || x.is_normal()), "{p:?}");
        let sum = 1.0 + (-2.0f32).exp() + (-59.0f32).exp();
        for (got, gap) in [(p[0], 0.0f32), (p[2], -2.0), (p[3], -59.0)] {
            let want = gap.exp() / sum;
            assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
        }
        // Without the cutoff, exp(-100) would have been subnormal.
        assert!((-100.0f32).exp().is_subnormal());
    }

    /// The x86-64 SSE status and control register (MXCSR).
    #[cfg(target_arch = "x86_64")]
    fn mxcsr() -> u32 {
        let mut csr: u32 = 0;
        // SAFETY: `stmxcsr` stores the 32-bit MXCSR register at the given
        // address, a live, aligned `u32`; it changes no other state.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        csr
    }

    /// MXCSR's underflow flag (bit 4), which stays set once an operation
    /// has raised it.
    #[cfg(target_arch = "x86_64")]
    fn underflow_flag() -> bool {
        mxcsr() & (1 << 4) != 0
    }

    /// Clears MXCSR's six sticky exception flags (bits 0-5); rounding and
    /// masks are unchanged.
    #[cfg(target_arch = "x86_64")]
    fn clear_fp_flags() {
        let csr = mxcsr() & !0x3f;
        // SAFETY: `ldmxcsr` loads MXCSR from a live, aligned `u32` that
        // differs from its current value only in the exception flags.
        unsafe {
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
        }
    }

    /// A mini-batch on a confident model (scores hundreds apart) never
    /// takes libm's underflow path, with the class count compiled in (the
    /// unrolled, branch-free softmax) or not. Without the clamp in
    /// [`softmax`] the compiled class counts raised the CPU's underflow
    /// flag: `exp` ran on every gap and selected after.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_confident_model_raises_no_underflow() {
        for classes in 2..=17 {
            let mut text = Vec::new();
            let g = GenParams {
                samples: 50,
                features: 20,
                classes,
                nnz: 5,
                seed: 3,
            };
            generate(&g, &mut text).unwrap();
            let a = app(classes, 20);
            let (input, rows, keys, mut values) = random_batch(&a, &text, 4);
            // Weights of ±300 per class: score gaps in the thousands.
            for (i, v) in values.data.iter_mut().enumerate() {
                *v = if i % 3 == 0 { 300.0 } else { -300.0 };
            }
            clear_fp_flags();
            let (deltas, stats) = a.compute(&input, rows, &keys, &values, None, Step { clock: 1 });
            let underflowed = underflow_flag();
            assert!(stats.records > 0 && !deltas.data.is_empty());
            assert!(!underflowed, "{classes} classes: underflow raised");
        }
    }

    fn app(classes: u32, features: u32) -> Mlr {
        let c = MlrConfig {
            classes,
            features,
            features_per_key: 2,
            ..MlrConfig::default()
        };
        Mlr::new(&c, &params(&c, 4).unwrap()).unwrap()
    }

    /// `text` parsed as one mini-batch, its keys, and random values for them.
    fn random_batch(
        a: &Mlr,
        text: &[u8],
        seed: u64,
    ) -> (InputBlock, Range<usize>, Vec<Key>, ValueBatch) {
        let input = a.parse(text).unwrap();
        let rows = 0..input.len();
        let mut keys = Vec::new();
        a.keys(&input, rows.clone(), &mut keys);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut values = ValueBatch::default();
        for _ in &keys {
            let v: Vec<f32> = (0..a.value_len)
                .map(|_| rng.random_range(-0.5..0.5))
                .collect();
            values.push(&v);
        }
        (input, rows, keys, values)
    }

    #[test]
    fn compiled_class_counts_compute_what_the_run_time_kernel_does() {
        let mut text = Vec::new();
        let g = GenParams {
            samples: 300,
            features: 50,
            classes: 10,
            nnz: 8,
            seed: 5,
        };
        generate(&g, &mut text).unwrap();
        let a = app(10, 50);
        let (input, rows, keys, values) = random_batch(&a, &text, 9);
        let step = Step { clock: 1 };
        let (fixed, s1) = a.step::<10>(&input, rows.clone(), &keys, &values, step);
        let (generic, s0) = a.step::<0>(&input, rows.clone(), &keys, &values, step);
        assert_eq!(fixed, generic);
        assert_eq!(s1, s0);
        assert!(s1.loss_sum > 0.0 && fixed.data.iter().any(|&d| d != 0.0));
        assert_eq!(
            a.eval::<10>(&input, rows.clone(), &keys, &values),
            a.eval::<0>(&input, rows, &keys, &values)
        );
    }

    #[test]
    fn fast_division_agrees_with_the_hardware() {
        let ns: Vec<u32> = (0..5000)
            .chain([
                u32::MAX,
                u32::MAX - 1,
                1 << 31,
                (1 << 31) - 1,
                65_535,
                65_536,
            ])
            .collect();
        for d in (1..300).chain([1 << 16, 1_000_003, u32::MAX / 3, u32::MAX]) {
            let f = FastDiv::new(d);
            for &n in &ns {
                assert_eq!(f.div(n), n / d, "{n} / {d}");
                assert_eq!(f.rem(n), n % d, "{n} % {d}");
            }
        }
    }

    #[test]
    fn params_layout() {
        let c = MlrConfig {
            classes: 3,
            features: 9,
            features_per_key: 4,
            ..MlrConfig::default()
        };
        let p = params(&c, 64).unwrap();
        assert_eq!(p.value_len, 12);
        assert_eq!(p.model_keys, 3, "11 rows in keys of 4");
        let auto = params(&MlrConfig::default(), 64).unwrap();
        assert_eq!(auto.extra[2], 4, "1002 rows over 256 target keys");
    }

    #[test]
    fn parse_libsvm() {
        let a = app(3, 10);
        let b = a.parse(b"0 1:0.5 3:2\n\n2 10:1\r\n1\n").unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b.record(0), (0.0, &[1u32, 3][..], &[0.5f32, 2.0][..]));
        assert_eq!(b.record(1), (2.0, &[10u32][..], &[1.0f32][..]));
        assert_eq!(b.record(2).1.len(), 0);
    }

    #[test]
    fn parse_errors_name_the_token_and_offset() {
        let a = app(3, 10);
        assert_eq!(
            parse_error(&a, b"0 1:1\n3 1:1\n", "label 3 is out of range").offset,
            6
        );
        parse_error(&a, b"1 11:1\n", "feature index 11");
        parse_error(&a, b"1 x:1\n", "\"x:1\"");
        parse_error(&a, b"1 1:nan\n", "finite");
        parse_error(&a, b"1 1\n", "index:value");
        parse_error(&a, b"-1 1:1\n", "out of range");
    }

    #[test]
    fn keys_cover_features_and_bias() {
        let a = app(3, 10); // fpk 2: rows 0..=11, bias row 11 → key 5
        let b = a.parse(b"0 1:1 3:1\n1 2:1\n").unwrap();
        let mut keys = Vec::new();
        a.keys(&b, 0..2, &mut keys);
        assert_eq!(keys, vec![0, 1, 5]);
    }

    /// The gradient matches a finite-difference estimate of the loss.
    #[test]
    fn gradient_matches_finite_differences() {
        let c = MlrConfig {
            classes: 3,
            features: 4,
            features_per_key: 2,
            step_size: 1.0,
            decay: 0.0,
            l2: 0.0,
            ..MlrConfig::default()
        };
        let a = Mlr::new(&c, &params(&c, 4).unwrap()).unwrap();
        let (input, rows, keys, values) =
            random_batch(&a, b"0 1:0.5 2:1\n2 3:1 4:0.25\n1 1:1\n", 3);
        let (deltas, _) = a.compute(
            &input,
            rows.clone(),
            &keys,
            &values,
            None,
            Step { clock: 0 },
        );
        let loss = |v: &ValueBatch| a.evaluate(&input, rows.clone(), &keys, v, None).loss_sum / 3.0;
        let h = 1e-3f32;
        for j in 0..values.data.len() {
            let mut plus = values.clone();
            plus.data[j] += h;
            let mut minus = values.clone();
            minus.data[j] -= h;
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * f64::from(h));
            let analytic = -f64::from(deltas.data[j]); // delta = -lr * grad with lr = 1
            assert!(
                (numeric - analytic).abs() < 2e-3,
                "component {j}: numeric {numeric} analytic {analytic}"
            );
        }
    }

    #[test]
    fn generated_data_parses_and_is_learnable() {
        let p = GenParams {
            samples: 2000,
            features: 50,
            classes: 4,
            nnz: 10,
            seed: 7,
        };
        let mut buf = Vec::new();
        generate(&p, &mut buf).unwrap();
        let mut again = Vec::new();
        generate(&p, &mut again).unwrap();
        assert_eq!(buf, again, "seeded generation is reproducible");
        let c = MlrConfig {
            classes: 4,
            features: 50,
            features_per_key: 5,
            step_size: 1.0,
            decay: 0.0,
            l2: 0.0,
            ..MlrConfig::default()
        };
        let a = Mlr::new(&c, &params(&c, 4).unwrap()).unwrap();
        let input = a.parse(&buf).unwrap();
        assert_eq!(input.len(), 2000);
        // Plain SGD in one process: the model must fit separable data well.
        let mut model: std::collections::HashMap<Key, Vec<f32>> = Default::default();
        let mut keys = Vec::new();
        for epoch in 0..10 {
            for start in (0..input.len()).step_by(20) {
                let rows = start..(start + 20).min(input.len());
                a.keys(&input, rows.clone(), &mut keys);
                let mut values = ValueBatch::default();
                for k in &keys {
                    values.push(model.entry(*k).or_insert_with(|| vec![0.0; a.value_len]));
                }
                let (d, _) = a.compute(&input, rows, &keys, &values, None, Step { clock: epoch });
                for (k, dv) in keys.iter().zip(d.iter()) {
                    for (w, x) in model.get_mut(k).unwrap().iter_mut().zip(dv) {
                        *w += x;
                    }
                }
            }
        }
        let all = 0..input.len();
        a.keys(&input, all.clone(), &mut keys);
        let mut values = ValueBatch::default();
        for k in &keys {
            values.push(model.entry(*k).or_insert_with(|| vec![0.0; a.value_len]));
        }
        let s = a.evaluate(&input, all, &keys, &values, None);
        assert!(s.accuracy() > 0.9, "training accuracy {}", s.accuracy());
    }
}
