//! Lasso: L1-regularised least squares trained with proximal mini-batch SGD.
//!
//! # Input
//!
//! libsvm text, one record per line: `target index:value index:value ...`.
//! The target is any finite number; indices are `0..=features` (libsvm data
//! is 1-based, 0 is accepted too). Blank lines are skipped; anything else is
//! an error naming the token.
//!
//! # Objective
//!
//! `0.5 · mean((y − w·x − b)²) + λ · ‖w‖₁` — scikit-learn's `Lasso` objective
//! with `alpha = λ`; the intercept `b` is not penalised.
//!
//! # Model
//!
//! Coefficients for `features + 2` rows (indices `0..=features`, then the
//! intercept), `features_per_key` consecutive rows per key, so a value is
//! `features_per_key` floats. Values start at zero; the server update adds the
//! delta — nothing else, so every push counts.
//!
//! # Step
//!
//! A mini-batch pulls **all** keys (the proximal step shrinks every
//! coefficient, not just those the batch touches) and computes, with
//! `η = step_size / (1 + decay × epoch)` from the worker's local epoch,
//! `w' = S_{ηλ}(w − η·∇)` (soft-thresholding `S_t(v) = sign(v)·max(|v| − t, 0)`)
//! and `b' = b − η·∂b`, and pushes `w' − w`. With one worker this is exactly
//! proximal SGD, and thresholded coefficients become exactly zero on the
//! server (`w + (0 − w) = 0`); with several asynchronous workers the deltas
//! of stale reads add up, as in any asynchronous SGD. A mini-batch costs
//! `O(features)` besides its records: use large mini-batches for very
//! high-dimensional data.
//!
//! # Statistics
//!
//! `records` = records; `loss_sum` = Σ 0.5·residual² + records·λ‖w‖₁ with the
//! weights pulled for the mini-batch, so the mean is the objective above.

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use cruise_conf::{AppKind, LassoConfig};

use super::{App, AppError, ParseError, Step, auto_rows_per_key, normal};
use crate::protocol::{AppParams, Key, Stats, ValueBatch};
use crate::store::{InputBlock, ModelFunctions, StateBlock};

/// Derives the model layout: `extra = [features, features_per_key]`.
pub fn params(c: &LassoConfig, model_blocks: u32) -> Result<AppParams, AppError> {
    let rows = u64::from(c.features) + 2;
    let fpk = if c.features_per_key == 0 {
        auto_rows_per_key(rows, model_blocks)
    } else {
        u64::from(c.features_per_key)
    };
    let value_len = u32::try_from(fpk).map_err(|_| AppError::Params {
        app: AppKind::Lasso,
        message: format!("features_per_key = {fpk} is too large"),
    })?;
    Ok(AppParams {
        value_len,
        model_keys: rows.div_ceil(fpk),
        extra: vec![u64::from(c.features), fpk],
    })
}

/// The Lasso app.
#[derive(Debug, Clone)]
pub struct Lasso {
    features: u32,
    fpk: usize,
    model_keys: u64,
    lambda: f32,
    step_size: f32,
    decay: f32,
}

impl Lasso {
    /// Builds the app from its configuration and the job's parameters.
    pub fn new(c: &LassoConfig, p: &AppParams) -> Result<Self, AppError> {
        let bad = |m: String| AppError::Params {
            app: AppKind::Lasso,
            message: m,
        };
        let [features, fpk] = p.extra[..] else {
            return Err(bad(format!("expected 2 parameters, got {:?}", p.extra)));
        };
        if features != u64::from(c.features) {
            return Err(bad("parameters disagree with the configuration".into()));
        }
        if fpk == 0 || u64::from(p.value_len) != fpk || p.model_keys != (features + 2).div_ceil(fpk)
        {
            return Err(bad(format!("bad layout: {p:?}")));
        }
        Ok(Lasso {
            features: c.features,
            fpk: fpk as usize,
            model_keys: p.model_keys,
            lambda: c.lambda as f32,
            step_size: c.step_size as f32,
            decay: c.decay as f32,
        })
    }

    /// Row of the intercept.
    fn bias_row(&self) -> usize {
        self.features as usize + 1
    }

    /// Whether `keys`/`values` are the whole model in key order (what
    /// [`App::keys`] asks for), so that row `i` is `values.data[i]`.
    fn whole_model(&self, keys: &[Key], values: &ValueBatch) -> bool {
        keys.len() as u64 == self.model_keys
            && keys.iter().enumerate().all(|(i, &k)| k == i as u64)
            && values.len() == keys.len()
            && values.data.len() == keys.len() * self.fpk
    }

    fn l1(&self, w: &[f32]) -> f64 {
        w[..self.bias_row()]
            .iter()
            .map(|x| f64::from(x.abs()))
            .sum::<f64>()
    }

    /// Prediction for one record.
    #[inline]
    fn predict(&self, w: &[f32], idx: &[u32], val: &[f32]) -> f32 {
        let mut p = w[self.bias_row()];
        for (&i, &v) in idx.iter().zip(val) {
            p += w[i as usize] * v;
        }
        p
    }
}

/// Soft-thresholding: the proximal operator of `t·|·|`.
#[inline]
pub fn soft_threshold(v: f32, t: f32) -> f32 {
    if v > t {
        v - t
    } else if v < -t {
        v + t
    } else {
        0.0
    }
}

impl App for Lasso {
    fn kind(&self) -> AppKind {
        AppKind::Lasso
    }

    fn model(&self) -> Arc<dyn ModelFunctions> {
        super::AdditiveModel::shared(self.fpk)
    }

    fn parse(&self, text: &[u8]) -> Result<InputBlock, ParseError> {
        super::parse_records(text, |target_tok, tokens, entries, err| {
            let target: f32 = target_tok
                .parse()
                .ok()
                .filter(|v: &f32| v.is_finite())
                .ok_or_else(|| err(format!("target {target_tok:?} is not a finite number")))?;
            super::libsvm_features(tokens, self.features, "lasso.features", entries, err)?;
            Ok(target)
        })
    }

    fn keys(&self, _input: &InputBlock, _rows: Range<usize>, out: &mut Vec<Key>) {
        out.clear();
        out.extend(0..self.model_keys);
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
        let mut stats = Stats::default();
        if !self.whole_model(keys, values) || rows.is_empty() {
            return (ValueBatch::default(), stats);
        }
        let w = &values.data;
        let mut grad = vec![0f32; w.len()];
        let bias = self.bias_row();
        for r in rows.clone() {
            let (y, idx, val) = input.record(r);
            let res = self.predict(w, idx, val) - y;
            stats.records += 1;
            stats.loss_sum += 0.5 * f64::from(res) * f64::from(res);
            grad[bias] += res;
            for (&i, &v) in idx.iter().zip(val) {
                grad[i as usize] += res * v;
            }
        }
        stats.loss_sum += stats.records as f64 * f64::from(self.lambda) * self.l1(w);
        stats.loss_terms = stats.records;

        let lr = step.learning_rate(self.step_size, self.decay);
        let scale = 1.0 / rows.len() as f32;
        let t = lr * self.lambda;
        let mut delta = grad;
        for (i, d) in delta.iter_mut().enumerate() {
            let stepped = w[i] - lr * *d * scale;
            let next = match i.cmp(&bias) {
                std::cmp::Ordering::Less => soft_threshold(stepped, t),
                std::cmp::Ordering::Equal => stepped,
                std::cmp::Ordering::Greater => w[i], // padding of the last key
            };
            *d = next - w[i];
        }
        (super::deltas_for(values, delta), stats)
    }

    fn evaluate(
        &self,
        input: &InputBlock,
        rows: Range<usize>,
        keys: &[Key],
        values: &ValueBatch,
        _state: Option<&StateBlock>,
    ) -> Stats {
        let mut stats = Stats::default();
        if !self.whole_model(keys, values) {
            return stats;
        }
        let w = &values.data;
        for r in rows {
            let (y, idx, val) = input.record(r);
            let res = self.predict(w, idx, val) - y;
            stats.records += 1;
            stats.loss_sum += 0.5 * f64::from(res) * f64::from(res);
        }
        stats.loss_sum += stats.records as f64 * f64::from(self.lambda) * self.l1(w);
        stats.loss_terms = stats.records;
        stats
    }

    fn loss_name(&self) -> &'static str {
        "objective"
    }
}

/// Parameters of the generated data set.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Records.
    pub samples: u64,
    /// Features (libsvm indices 1..=features); every record has all of them.
    pub features: u32,
    /// Non-zero coefficients of the ground truth.
    pub support: u32,
    /// Standard deviation of the Gaussian noise on the targets.
    pub noise: f64,
    /// Seed.
    pub seed: u64,
}

/// The ground truth of a generated data set.
#[derive(Debug, Clone, PartialEq)]
pub struct Truth {
    /// The intercept.
    pub intercept: f64,
    /// Coefficient of feature `j` (libsvm index `j + 1`).
    pub coef: Vec<f64>,
}

/// Writes a regression data set in libsvm format: dense standard-normal
/// features, `support` non-zero coefficients (magnitudes in 0.5..2, random
/// signs, at random features), intercept 1, and Gaussian noise on the
/// targets. Returns the bytes written and the ground truth.
pub fn generate(p: &GenParams, out: &mut impl Write) -> std::io::Result<(u64, Truth)> {
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let f = p.features as usize;
    let mut coef = vec![0f64; f];
    let support = (p.support as usize).min(f);
    let mut chosen = 0;
    while chosen < support {
        let j = rng.random_range(0..f);
        if coef[j] == 0.0 {
            let m: f64 = rng.random_range(0.5..2.0);
            coef[j] = if rng.random::<bool>() { m } else { -m };
            chosen += 1;
        }
    }
    let intercept = 1.0;
    let mut written = 0u64;
    let mut line = String::new();
    let mut x = vec![0f64; f];
    for _ in 0..p.samples {
        for v in x.iter_mut() {
            // Rounded to what we print, so the targets are exact for the file.
            *v = (normal(&mut rng) * 1e4).round() / 1e4;
        }
        let y = intercept
            + x.iter().zip(&coef).map(|(a, b)| a * b).sum::<f64>()
            + p.noise * normal(&mut rng);
        line.clear();
        line.push_str(&format!("{y:.6}"));
        for (j, v) in x.iter().enumerate() {
            line.push_str(&format!(" {}:{v:.4}", j + 1));
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
    }
    Ok((written, Truth { intercept, coef }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::tests::{eval_all, parse_error, train_single_process};

    fn app(c: &LassoConfig) -> Lasso {
        Lasso::new(c, &params(c, 4).unwrap()).unwrap()
    }

    fn config(features: u32) -> LassoConfig {
        LassoConfig {
            features,
            features_per_key: 3,
            ..LassoConfig::default()
        }
    }

    #[test]
    fn params_layout() {
        let p = params(&config(10), 64).unwrap();
        assert_eq!(p.value_len, 3);
        assert_eq!(p.model_keys, 4, "12 rows in keys of 3");
        let auto = params(&LassoConfig::default(), 8).unwrap();
        assert_eq!(auto.extra[1], 4, "102 rows over 32 target keys");
    }

    #[test]
    fn parse_and_errors() {
        let a = app(&config(10));
        let b = a.parse(b"1.5 1:0.5 3:2\n\n-2 10:1\r\n0\n").unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b.record(0), (1.5, &[1u32, 3][..], &[0.5f32, 2.0][..]));
        assert_eq!(b.record(1).0, -2.0);
        assert_eq!(parse_error(&a, b"1 1:1\nx 1:1\n", "target \"x\"").offset, 6);
        parse_error(&a, b"1 11:1\n", "feature index 11");
        parse_error(&a, b"1 1:inf\n", "finite");
        parse_error(&a, b"1 2\n", "index:value");
        parse_error(&a, b"nan 1:1\n", "finite");
    }

    #[test]
    fn soft_threshold_is_the_l1_prox() {
        assert_eq!(soft_threshold(3.0, 1.0), 2.0);
        assert_eq!(soft_threshold(-3.0, 1.0), -2.0);
        assert_eq!(soft_threshold(0.5, 1.0), 0.0);
        assert_eq!(soft_threshold(-1.0, 1.0), 0.0);
    }

    /// One step is the proximal gradient step: checked against a direct
    /// computation, and the smooth part's gradient against finite differences.
    #[test]
    fn step_is_prox_of_gradient_step() {
        let c = LassoConfig {
            lambda: 0.3,
            step_size: 0.1,
            decay: 0.0,
            ..config(4)
        };
        let a = app(&c);
        let input = a
            .parse(b"1 1:0.5 2:1\n-2 3:1 4:0.25\n0.5 1:1 4:-1\n")
            .unwrap();
        let rows = 0..input.len();
        let mut keys = Vec::new();
        a.keys(&input, rows.clone(), &mut keys);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut values = ValueBatch::default();
        for _ in &keys {
            let v: Vec<f32> = (0..a.fpk).map(|_| rng.random_range(-1.0..1.0)).collect();
            values.push(&v);
        }
        let (deltas, stats) = a.compute(
            &input,
            rows.clone(),
            &keys,
            &values,
            None,
            Step { clock: 0 },
        );
        assert_eq!(stats.records, 3);
        // The smooth part of the loss, 0.5·mean squared residual.
        let smooth = |v: &ValueBatch| {
            let s = a.evaluate(&input, rows.clone(), &keys, v, None);
            s.loss_sum / 3.0 - f64::from(a.lambda) * a.l1(&v.data)
        };
        let h = 1e-3f32;
        for i in 0..=a.bias_row() {
            let mut plus = values.clone();
            plus.data[i] += h;
            let mut minus = values.clone();
            minus.data[i] -= h;
            let g = (smooth(&plus) - smooth(&minus)) / (2.0 * f64::from(h));
            let w = values.data[i];
            let stepped = w - 0.1 * g as f32;
            let want = if i == a.bias_row() {
                stepped
            } else {
                soft_threshold(stepped, 0.1 * 0.3)
            };
            let got = w + deltas.data[i];
            assert!((got - want).abs() < 1e-3, "row {i}: got {got}, want {want}");
        }
        // Padding rows after the intercept stay unchanged.
        for i in a.bias_row() + 1..values.data.len() {
            assert_eq!(deltas.data[i], 0.0);
        }
    }

    #[test]
    fn generated_data_is_reproducible_and_fits() {
        let p = GenParams {
            samples: 2000,
            features: 20,
            support: 4,
            noise: 0.1,
            seed: 3,
        };
        let mut buf = Vec::new();
        let (_, truth) = generate(&p, &mut buf).unwrap();
        let mut again = Vec::new();
        let (_, truth2) = generate(&p, &mut again).unwrap();
        assert_eq!(buf, again, "seeded generation is reproducible");
        assert_eq!(truth, truth2);
        assert_eq!(truth.coef.iter().filter(|c| **c != 0.0).count(), 4);
        let lambda = 0.05;
        let c = LassoConfig {
            features: 20,
            features_per_key: 4,
            lambda,
            step_size: 0.1,
            decay: 0.2,
            ..LassoConfig::default()
        };
        let a = app(&c);
        let input = a.parse(&buf).unwrap();
        assert_eq!(input.len(), 2000);
        let mut model = train_single_process(&a, &input, 30, 100);
        let s = eval_all(&a, &input, &mut model);
        // The Lasso solution for a near-orthonormal design shrinks each true
        // coefficient by λ; its objective is at most the truth's,
        // 0.5·noise² + λ‖w*‖₁.
        let at_truth = 0.5 * 0.01 + lambda * truth.coef.iter().map(|c| c.abs()).sum::<f64>();
        assert!(
            s.mean_loss() < at_truth,
            "objective {} vs {} at the truth",
            s.mean_loss(),
            at_truth
        );
        // The support is recovered exactly and the coefficients closely.
        let w: Vec<f32> = (0..a.model_keys).flat_map(|k| model[&k].clone()).collect();
        for (j, &cj) in truth.coef.iter().enumerate() {
            let got = f64::from(w[j + 1]);
            if cj == 0.0 {
                assert_eq!(got, 0.0, "coefficient {j} should be 0");
            } else {
                let want = cj.signum() * (cj.abs() - lambda);
                assert!(
                    (got - want).abs() < 0.02,
                    "coefficient {j}: {got} vs {want}"
                );
            }
        }
        assert_eq!(w[0], 0.0, "index 0 is never used");
        assert!((f64::from(w[a.bias_row()]) - 1.0).abs() < 0.02);
    }
}
