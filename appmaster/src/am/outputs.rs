//! What a job produces after training besides its training statistics: the
//! objective over held-out input (`job.eval_input`) and the final model
//! written to a file (`job.model_out`).
//!
//! [`Outputs`] holds both while the job's event loop gathers them; the loop
//! owns it and decides when each step runs (after the final evaluation:
//! held-out evaluation, then the model dump, then shutdown).
//!
//! # Model file
//!
//! Text, written atomically (temporary name, then rename):
//!
//! ```text
//! # cruise-rs model
//! # app = lasso
//! # value_len = 1
//! # model_keys = 52
//! # params = 50 1
//! 0 0
//! 1 0.8734
//! ...
//! ```
//!
//! Header lines start with `#` (`params` are the app's layout parameters, see
//! each app's `params`), then one line per key in increasing order: the key
//! and its `value_len` values, shortest round-trip decimal form. Keys that
//! were never read or written hold the app's initial value and are absent.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use cruise_conf::AppKind;
use cruise_container::protocol::{AppParams, EvaluatorId, Key, Stats, ValueBatch};
use cruise_hdfs::Split;

use super::AmError;

/// Held-out evaluation and model output of a job.
#[derive(Debug, Default)]
pub(super) struct Outputs {
    held_out: Vec<Split>,
    eval_stats: Option<Stats>,
    model_out: Option<PathBuf>,
    model: BTreeMap<Key, Vec<f32>>,
    written: Option<String>,
}

impl Outputs {
    /// Outputs for held-out splits (maybe none) and a model path (maybe none).
    pub(super) fn new(held_out: Vec<Split>, model_out: Option<PathBuf>) -> Self {
        Outputs {
            held_out,
            model_out,
            ..Default::default()
        }
    }

    /// Whether there is held-out input to evaluate.
    pub(super) fn has_held_out(&self) -> bool {
        !self.held_out.is_empty()
    }

    /// Whether the model is to be written.
    pub(super) fn wants_model(&self) -> bool {
        self.model_out.is_some()
    }

    /// The held-out splits dealt round-robin to `workers` (only those that
    /// get any).
    pub(super) fn assign(&self, workers: &[EvaluatorId]) -> Vec<(EvaluatorId, Vec<Split>)> {
        let mut out: Vec<(EvaluatorId, Vec<Split>)> =
            workers.iter().map(|&w| (w, Vec::new())).collect();
        if out.is_empty() {
            return out;
        }
        let n = out.len();
        for (i, s) in self.held_out.iter().enumerate() {
            out[i % n].1.push(s.clone());
        }
        out.retain(|(_, s)| !s.is_empty());
        out
    }

    /// Adds one worker's held-out statistics.
    pub(super) fn add_eval(&mut self, s: &Stats) {
        self.eval_stats.get_or_insert_with(Stats::default).add(s);
    }

    /// The held-out statistics, if held-out input was evaluated.
    pub(super) fn eval_stats(&self) -> Option<Stats> {
        self.eval_stats
    }

    /// Adds a part of the model sent by a server.
    pub(super) fn add_part(
        &mut self,
        from: &str,
        keys: Vec<Key>,
        values: ValueBatch,
    ) -> Result<(), AmError> {
        if keys.len() != values.len() {
            return Err(AmError::JobFailed(format!(
                "{from} sent a model part of {} keys with {} values",
                keys.len(),
                values.len()
            )));
        }
        for (k, v) in keys.into_iter().zip(values.iter()) {
            if self.model.contains_key(&k) {
                return Err(AmError::JobFailed(format!(
                    "key {k} of the model was sent twice (the second time by {from})"
                )));
            }
            self.model.insert(k, v.to_vec());
        }
        Ok(())
    }

    /// Writes the gathered model to `job.model_out`. Returns the keys written.
    pub(super) async fn write_model(
        &mut self,
        app: AppKind,
        params: &AppParams,
    ) -> Result<u64, AmError> {
        let Some(path) = self.model_out.clone() else {
            return Ok(0);
        };
        let model = std::mem::take(&mut self.model);
        let keys = model.len() as u64;
        let header = format!(
            "# cruise-rs model\n# app = {app}\n# value_len = {}\n# model_keys = {}\n# params = {}\n",
            params.value_len,
            params.model_keys,
            params
                .extra
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
        let p = path.clone();
        tokio::task::spawn_blocking(move || {
            crate::datagen::write_atomically(&p, |w| {
                w.write_all(header.as_bytes())?;
                let mut line = String::new();
                for (k, v) in &model {
                    line.clear();
                    line.push_str(&k.to_string());
                    for x in v {
                        line.push(' ');
                        line.push_str(&x.to_string());
                    }
                    line.push('\n');
                    w.write_all(line.as_bytes())?;
                }
                Ok(())
            })
        })
        .await
        .map_err(|e| AmError::JobFailed(format!("writing the model panicked: {e}")))??;
        self.written = Some(path.display().to_string());
        Ok(keys)
    }

    /// The model file written, if any.
    pub(super) fn written(&self) -> Option<String> {
        self.written.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(i: u64) -> Split {
        Split {
            uri: format!("file:///x{i}"),
            start: 0,
            end: 10,
        }
    }

    #[test]
    fn held_out_splits_are_dealt_round_robin() {
        let o = Outputs::new((0..5).map(split).collect(), None);
        let a = o.assign(&[EvaluatorId(7), EvaluatorId(9)]);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].0, EvaluatorId(7));
        assert_eq!(a[0].1, vec![split(0), split(2), split(4)]);
        assert_eq!(a[1].1, vec![split(1), split(3)]);
        let o = Outputs::new(vec![split(0)], None);
        assert_eq!(
            o.assign(&[EvaluatorId(1), EvaluatorId(2), EvaluatorId(3)]),
            vec![(EvaluatorId(1), vec![split(0)])]
        );
        assert!(!Outputs::default().has_held_out());
    }

    #[tokio::test]
    async fn model_file_is_sorted_text_with_a_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/model.txt");
        let mut o = Outputs::new(Vec::new(), Some(path.clone()));
        assert!(o.wants_model());
        let mut part = ValueBatch::default();
        part.push(&[1.5, -0.25]);
        part.push(&[0.0, 3.0]);
        o.add_part("evaluator 2", vec![9, 2], part).unwrap();
        let mut dup = ValueBatch::default();
        dup.push(&[1.0, 1.0]);
        let err = o.add_part("evaluator 3", vec![9], dup).unwrap_err();
        assert!(err.to_string().contains("key 9"), "{err}");
        let params = AppParams {
            value_len: 2,
            model_keys: 10,
            extra: vec![3, 4],
        };
        assert_eq!(o.write_model(AppKind::Nmf, &params).await.unwrap(), 2);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "# cruise-rs model\n# app = nmf\n# value_len = 2\n# model_keys = 10\n\
             # params = 3 4\n2 0 3\n9 1.5 -0.25\n"
        );
        assert_eq!(o.written(), Some(path.display().to_string()));
    }
}
