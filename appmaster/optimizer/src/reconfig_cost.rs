//! What a reconfiguration costs: [`ReconfigCostModel`] predicts a plan's
//! duration. Per operation kind, `secs = a + b · bytes` (bytes only for
//! moves), learned from the durations of past plans by a least-squares fit
//! shrunk towards a conservative prior, then combined along the plan's DAG
//! as `max(critical path, total work / parallelism)`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::executor::{ExecutionReport, OpOutcome};
use crate::plan::{OpKind, Operation, Plan, Table};
use crate::snapshot::Job;

/// Prior guess `secs = per_op + per_byte · bytes` for one operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    /// Fixed seconds per operation.
    pub per_op: f64,
    /// Seconds per byte moved.
    pub per_byte: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct Sums {
    n: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

/// Predicts plan durations from past plans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReconfigCostModel {
    prior: BTreeMap<OpKind, OpCost>,
    /// Weight of the prior in pseudo-observations.
    prior_weight: f64,
    /// Byte scale at which the per-byte prior counts as `prior_weight` observations.
    prior_bytes: f64,
    sums: BTreeMap<OpKind, Sums>,
}

impl Default for ReconfigCostModel {
    /// A conservative prior: add 10 s, delete 5 s, switch 2 s, a move 1 s plus
    /// 10 MB/s, weighted as 2 observations (of 1 MiB for the per-byte part), so a few
    /// real plans outweigh it.
    fn default() -> Self {
        let mv = OpCost {
            per_op: 1.0,
            per_byte: 1.0e-7,
        };
        let prior = [
            (
                OpKind::Add,
                OpCost {
                    per_op: 10.0,
                    per_byte: 0.0,
                },
            ),
            (
                OpKind::Delete,
                OpCost {
                    per_op: 5.0,
                    per_byte: 0.0,
                },
            ),
            (
                OpKind::Switch,
                OpCost {
                    per_op: 2.0,
                    per_byte: 0.0,
                },
            ),
            (OpKind::Move(Table::Input), mv),
            (OpKind::Move(Table::Model), mv),
        ]
        .into_iter()
        .collect();
        ReconfigCostModel::with_prior(prior, 2.0, 1024.0 * 1024.0)
    }
}

impl ReconfigCostModel {
    /// A model with the given prior per kind (kinds left out cost 0), weighted as
    /// `weight` observations (at `bytes_scale` bytes for the per-byte part).
    pub fn with_prior(prior: BTreeMap<OpKind, OpCost>, weight: f64, bytes_scale: f64) -> Self {
        ReconfigCostModel {
            prior,
            prior_weight: weight.max(1e-9),
            prior_bytes: bytes_scale.max(1.0),
            sums: BTreeMap::new(),
        }
    }

    /// The default model with `estimates` as its prior (kinds they do not
    /// name keep the default prior): a model that predicts what the one
    /// that wrote them did, until it observes plans of its own.
    pub fn from_estimates(estimates: &[OpCostEstimate]) -> Self {
        let defaults = ReconfigCostModel::default();
        let mut prior = defaults.prior;
        for e in estimates {
            prior.insert(
                e.op,
                OpCost {
                    per_op: e.per_op,
                    per_byte: e.per_byte,
                },
            );
        }
        ReconfigCostModel::with_prior(prior, defaults.prior_weight, defaults.prior_bytes)
    }

    /// The current estimate of every operation kind.
    pub fn estimates(&self) -> Vec<OpCostEstimate> {
        OpKind::ALL
            .into_iter()
            .map(|op| {
                let c = self.estimate(op);
                OpCostEstimate {
                    op,
                    per_op: c.per_op,
                    per_byte: c.per_byte,
                }
            })
            .collect()
    }

    /// Current estimate for `kind`.
    pub fn estimate(&self, kind: OpKind) -> OpCost {
        let p = self.prior.get(&kind).copied().unwrap_or(OpCost {
            per_op: 0.0,
            per_byte: 0.0,
        });
        let s = self.sums.get(&kind).copied().unwrap_or_default();
        if s.n == 0.0 {
            return p;
        }
        // Slope from the centred data, shrunk towards the prior slope; then the
        // intercept from the means, shrunk towards the prior intercept. Centring keeps
        // the intercept's prior from tilting the slope.
        let la = self.prior_weight;
        let lb = self.prior_weight * self.prior_bytes * self.prior_bytes;
        let (mx, my) = (s.x / s.n, s.y / s.n);
        let sxx = (s.xx - s.n * mx * mx).max(0.0);
        let sxy = s.xy - s.n * mx * my;
        let b = ((sxy + lb * p.per_byte) / (sxx + lb)).max(0.0);
        let a = ((s.n * (my - b * mx) + la * p.per_op) / (s.n + la)).max(0.0);
        OpCost {
            per_op: a,
            per_byte: b,
        }
    }

    /// Records one observed duration.
    pub fn observe_op(&mut self, kind: OpKind, bytes: f64, secs: f64) {
        if !secs.is_finite() || secs < 0.0 || !bytes.is_finite() || bytes < 0.0 {
            return;
        }
        let s = self.sums.entry(kind).or_default();
        s.n += 1.0;
        s.x += bytes;
        s.y += secs;
        s.xx += bytes * bytes;
        s.xy += bytes * secs;
    }

    /// Learns from the succeeded operations of an executed plan. Bytes come from the
    /// runtime's report, or from the job's block sizes when it reported none.
    /// Input moves carried out by re-reading the input are left out: their
    /// speed is the input source's, not the links' a move is priced by.
    pub fn observe(&mut self, plan: &Plan, report: &ExecutionReport, job: &Job) {
        for (p, o) in plan.ops.iter().zip(&report.outcomes) {
            if let OpOutcome::Succeeded { duration, report } = o {
                if report.reloaded {
                    continue;
                }
                let bytes = if report.bytes_moved > 0 {
                    report.bytes_moved as f64
                } else {
                    op_bytes(&p.op, job)
                };
                self.observe_op(p.op.kind(), bytes, duration.as_secs_f64());
            }
        }
    }

    /// Predicted seconds for one operation.
    pub fn op_secs(&self, op: &Operation, job: &Job) -> f64 {
        let c = self.estimate(op.kind());
        c.per_op + c.per_byte * op_bytes(op, job)
    }

    /// Predicted seconds for a whole plan run with `max_parallel` operations at a time:
    /// `max(critical path, total / max_parallel)`.
    pub fn plan_secs(&self, plan: &Plan, job: &Job, max_parallel: usize) -> f64 {
        let mut finish = vec![0.0f64; plan.ops.len()];
        let mut total = 0.0;
        for (i, p) in plan.ops.iter().enumerate() {
            let d = self.op_secs(&p.op, job);
            total += d;
            let start = p
                .deps
                .iter()
                .filter_map(|&x| finish.get(x).copied())
                .fold(0.0, f64::max);
            finish[i] = start + d;
        }
        let critical = finish.iter().copied().fold(0.0, f64::max);
        critical.max(total / max_parallel.max(1) as f64)
    }
}

fn op_bytes(op: &Operation, job: &Job) -> f64 {
    match op {
        Operation::Move { table, blocks, .. } => blocks.len() as f64 * job.block_bytes(*table),
        _ => 0.0,
    }
}

/// The predicted cost of one operation kind: `per_op + per_byte · bytes`
/// seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpCostEstimate {
    /// The operation kind.
    pub op: OpKind,
    /// Fixed seconds per operation.
    pub per_op: f64,
    /// Seconds per byte moved.
    pub per_byte: f64,
}
