//! What a reconfiguration costs: [`ReconfigCostModel`] predicts a plan's
//! duration. Per operation kind, `secs = a + b · wire_secs`, learned from
//! the durations of past plans by a least-squares fit shrunk towards a
//! conservative prior, then combined along the plan's DAG as
//! `max(critical path, total work / parallelism)`.
//!
//! A move's `wire_secs` ([`MoveWire`]) is the time the plan's moves keep
//! the busier of its two ends' links busy at their probed speeds: moves
//! that leave one container share its link and end together, so each of
//! them takes about as long as all of them. Only moves have wire time; the
//! other kinds cost `a` alone. Observed durations are fitted against the
//! same quantity that prices a plan, so a model that learned from one
//! large plan off a single link prices a later small plan by its own bytes,
//! and one that learned on a fast link prices a slow link by its speed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::executor::{ExecutionReport, OpOutcome};
use crate::plan::{OpKind, Operation, Plan, Table};
use crate::snapshot::{Job, Snapshot};

/// The speed a move to or from a container of unknown bandwidth is priced
/// at when the snapshot knows no container's (bytes/s; 100 Mbit/s).
const UNKNOWN_LINK_BYTES_PER_SEC: f64 = 12.5e6;

/// Prior guess `secs = per_op + per_wire_sec · wire_secs` for one operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    /// Fixed seconds per operation.
    pub per_op: f64,
    /// Seconds per second of wire time ([`MoveWire`]): 1 for a move at its
    /// links' probed speed, 2 at half of it.
    pub per_wire_sec: f64,
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
    /// Wire seconds at which the per-wire-second prior counts as
    /// `prior_weight` observations.
    prior_wire_secs: f64,
    sums: BTreeMap<OpKind, Sums>,
}

impl Default for ReconfigCostModel {
    /// A conservative prior: add 10 s, delete 5 s, switch 2 s, a move 1 s
    /// plus its wire time at half its links' probed speed, weighted as 2
    /// observations (of 10 ms of wire time for the per-wire-second part), so
    /// a few real plans outweigh it.
    fn default() -> Self {
        let mv = OpCost {
            per_op: 1.0,
            per_wire_sec: 2.0,
        };
        let fixed = |per_op| OpCost {
            per_op,
            per_wire_sec: 0.0,
        };
        let prior = [
            (OpKind::Add, fixed(10.0)),
            (OpKind::Delete, fixed(5.0)),
            (OpKind::Switch, fixed(2.0)),
            (OpKind::Move(Table::Input), mv),
            (OpKind::Move(Table::Model), mv),
        ]
        .into_iter()
        .collect();
        ReconfigCostModel::with_prior(prior, 2.0, 0.01)
    }
}

impl ReconfigCostModel {
    /// A model with the given prior per kind (kinds left out cost 0), weighted as
    /// `weight` observations (at `wire_secs_scale` wire seconds for the
    /// per-wire-second part).
    pub fn with_prior(prior: BTreeMap<OpKind, OpCost>, weight: f64, wire_secs_scale: f64) -> Self {
        ReconfigCostModel {
            prior,
            prior_weight: weight.max(1e-9),
            prior_wire_secs: wire_secs_scale.max(1e-9),
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
                    per_wire_sec: e.per_wire_sec,
                },
            );
        }
        ReconfigCostModel::with_prior(prior, defaults.prior_weight, defaults.prior_wire_secs)
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
                    per_wire_sec: c.per_wire_sec,
                }
            })
            .collect()
    }

    /// Current estimate for `kind`.
    ///
    /// The slope comes from the centred data, shrunk towards the prior
    /// slope; then the intercept from the means, shrunk towards the prior
    /// intercept (centring keeps the intercept's prior from tilting the
    /// slope). Where the data cannot place the slope (every observation of
    /// one size, as when all moves of a plan shared one link) the prior slope
    /// stands; if the intercept that leaves is below 0, the fit goes through
    /// the origin instead and the slope is the data's.
    pub fn estimate(&self, kind: OpKind) -> OpCost {
        let p = self.prior.get(&kind).copied().unwrap_or(OpCost {
            per_op: 0.0,
            per_wire_sec: 0.0,
        });
        let s = self.sums.get(&kind).copied().unwrap_or_default();
        if s.n == 0.0 {
            return p;
        }
        let la = self.prior_weight;
        let lb = self.prior_weight * self.prior_wire_secs * self.prior_wire_secs;
        let (mx, my) = (s.x / s.n, s.y / s.n);
        let sxx = (s.xx - s.n * mx * mx).max(0.0);
        let sxy = s.xy - s.n * mx * my;
        let b = ((sxy + lb * p.per_wire_sec) / (sxx + lb)).max(0.0);
        let a = s.n * (my - b * mx) + la * p.per_op;
        if a >= 0.0 {
            return OpCost {
                per_op: a / (s.n + la),
                per_wire_sec: b,
            };
        }
        OpCost {
            per_op: 0.0,
            per_wire_sec: ((s.xy + lb * p.per_wire_sec) / (s.xx + lb)).max(0.0),
        }
    }

    /// Records one observed duration of an operation of `wire_secs`.
    pub fn observe_op(&mut self, kind: OpKind, wire_secs: f64, secs: f64) {
        if !secs.is_finite() || secs < 0.0 || !wire_secs.is_finite() || wire_secs < 0.0 {
            return;
        }
        let s = self.sums.entry(kind).or_default();
        s.n += 1.0;
        s.x += wire_secs;
        s.y += secs;
        s.xx += wire_secs * wire_secs;
        s.xy += wire_secs * secs;
    }

    /// Learns from the succeeded operations of a plan executed from
    /// `snapshot`. A move's bytes come from the runtime's report, or from the
    /// job's block sizes when it reported none. Input moves carried out by
    /// re-reading the input are left out, of the fit and of the links'
    /// load: their speed is the input source's, not the links'.
    pub fn observe(&mut self, plan: &Plan, report: &ExecutionReport, snapshot: &Snapshot) {
        let bytes: Vec<f64> = plan
            .ops
            .iter()
            .zip(&report.outcomes)
            .map(|(p, o)| match o {
                OpOutcome::Succeeded { report, .. } if !report.reloaded => {
                    if report.bytes_moved > 0 {
                        report.bytes_moved as f64
                    } else {
                        op_bytes(&p.op, &snapshot.job)
                    }
                }
                _ => 0.0,
            })
            .collect();
        let wire = MoveWire::of(plan, snapshot, &bytes);
        for (i, (p, o)) in plan.ops.iter().zip(&report.outcomes).enumerate() {
            if let OpOutcome::Succeeded { duration, report } = o {
                if report.reloaded {
                    continue;
                }
                self.observe_op(p.op.kind(), wire.shared[i], duration.as_secs_f64());
            }
        }
    }

    /// Predicted seconds for an operation of `kind` whose moves keep its
    /// links busy for `wire_secs`.
    pub fn op_secs(&self, kind: OpKind, wire_secs: f64) -> f64 {
        let c = self.estimate(kind);
        c.per_op + c.per_wire_sec * wire_secs
    }

    /// Predicted seconds for a whole plan run from `snapshot` with
    /// `max_parallel` operations at a time: `max(critical path, total /
    /// max_parallel)`. The critical path prices each move with its links'
    /// shared wire time; the total counts each move's own bytes once.
    pub fn plan_secs(&self, plan: &Plan, snapshot: &Snapshot, max_parallel: usize) -> f64 {
        let bytes: Vec<f64> = plan
            .ops
            .iter()
            .map(|p| op_bytes(&p.op, &snapshot.job))
            .collect();
        let wire = MoveWire::of(plan, snapshot, &bytes);
        let mut finish = vec![0.0f64; plan.ops.len()];
        let mut total = 0.0;
        for (i, p) in plan.ops.iter().enumerate() {
            let kind = p.op.kind();
            total += self.op_secs(kind, wire.own[i]);
            let start = p
                .deps
                .iter()
                .filter_map(|&x| finish.get(x).copied())
                .fold(0.0, f64::max);
            finish[i] = start + self.op_secs(kind, wire.shared[i]);
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

/// The wire time of each operation of a plan, in seconds (0 for all but moves).
///
/// A move of `bytes` from `a` to `b` is on the wire for `own = bytes /
/// min(speed(a), speed(b), link(a, b))`, where `speed` is a container's
/// probed bandwidth and `link` a measured pair's, where the snapshot has
/// one. Run with the plan's other moves, its ends' links carry everything
/// `a` sends and everything `b` receives: `shared = max(own, sent(a) /
/// speed(a), received(b) / speed(b))`. A container the snapshot does not
/// know is priced at the slowest known speed.
#[derive(Debug, Clone, PartialEq)]
pub struct MoveWire {
    /// Each operation alone on its links.
    pub own: Vec<f64>,
    /// Each operation with the plan's other moves on the same links.
    pub shared: Vec<f64>,
}

impl MoveWire {
    /// Wire times of `plan`'s operations moving `bytes[i]` each (a move's
    /// blocks' bytes; 0 leaves an operation off the links).
    pub fn of(plan: &Plan, snapshot: &Snapshot, bytes: &[f64]) -> MoveWire {
        let usable = |b: f64| b.is_finite() && b > 0.0;
        let slowest = snapshot
            .containers
            .iter()
            .map(|c| c.bandwidth_bytes_per_sec)
            .filter(|&b| usable(b))
            .fold(f64::INFINITY, f64::min);
        let fallback = if slowest.is_finite() {
            slowest
        } else {
            UNKNOWN_LINK_BYTES_PER_SEC
        };
        let speed = |id: &str| {
            snapshot
                .containers
                .iter()
                .find(|c| c.id == id)
                .map(|c| c.bandwidth_bytes_per_sec)
                .filter(|&b| usable(b))
                .unwrap_or(fallback)
        };
        let link = |a: &str, b: &str| {
            snapshot
                .links
                .iter()
                .filter(|l| (l.from == a && l.to == b) || (l.from == b && l.to == a))
                .map(|l| l.bytes_per_sec)
                .filter(|&b| usable(b))
                .fold(f64::INFINITY, f64::min)
        };
        let mut sent: BTreeMap<&str, f64> = BTreeMap::new();
        let mut received: BTreeMap<&str, f64> = BTreeMap::new();
        for (p, &b) in plan.ops.iter().zip(bytes) {
            if let Some((from, to)) = ends(&p.op) {
                *sent.entry(from).or_default() += b.max(0.0);
                *received.entry(to).or_default() += b.max(0.0);
            }
        }
        let mut own = vec![0.0; plan.ops.len()];
        let mut shared = vec![0.0; plan.ops.len()];
        for (i, (p, &b)) in plan.ops.iter().zip(bytes).enumerate() {
            let Some((from, to)) = ends(&p.op) else {
                continue;
            };
            if !usable(b) {
                continue;
            }
            let (sa, sb) = (speed(from), speed(to));
            own[i] = b / sa.min(sb).min(link(from, to));
            let out = sent.get(from).copied().unwrap_or(0.0) / sa;
            let inn = received.get(to).copied().unwrap_or(0.0) / sb;
            shared[i] = own[i].max(out).max(inn);
        }
        MoveWire { own, shared }
    }
}

/// A move's source and destination.
fn ends(op: &Operation) -> Option<(&str, &str)> {
    match op {
        Operation::Move { from, to, .. } => Some((from.as_str(), to.as_str())),
        _ => None,
    }
}

/// The predicted cost of one operation kind: `per_op + per_wire_sec ·
/// wire_secs` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpCostEstimate {
    /// The operation kind.
    pub op: OpKind,
    /// Fixed seconds per operation.
    pub per_op: f64,
    /// Seconds per second of wire time ([`MoveWire`]).
    pub per_wire_sec: f64,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::executor::OpReport;
    use crate::plan::PlannedOp;
    use crate::snapshot::{ContainerMetrics, Link};

    const MB: f64 = 1e6;

    /// A job of 10 input blocks of 1 MB and 10 model blocks of 1 MB.
    fn job() -> Job {
        Job {
            total_records: 1000,
            mini_batch_size: 10,
            bytes_per_mini_batch: 1e4,
            link_bytes_per_mini_batch: None,
            input_blocks: 10,
            model_blocks: 10,
            remaining_epochs: 10.0,
            input_bytes: 10_000_000,
            model_bytes: 10_000_000,
            serial_fraction: 1.0,
            latency_secs_per_mini_batch: 0.0,
            asynchronous: false,
            measured_epoch_secs: None,
            queued_fit: None,
        }
    }

    /// Containers `(id, MB/s)`, no block counts (a plan's prices do not read them).
    fn snap(speeds: &[(&str, f64)]) -> Snapshot {
        Snapshot {
            job: job(),
            containers: speeds
                .iter()
                .map(|&(id, s)| ContainerMetrics::offered(id.into(), None, s * MB))
                .collect(),
            links: vec![],
            policy: None,
        }
    }

    fn mv(table: Table, n: u32, from: &str, to: &str) -> PlannedOp {
        PlannedOp {
            op: Operation::Move {
                table,
                blocks: (0..n).collect(),
                from: from.into(),
                to: to.into(),
            },
            deps: vec![],
        }
    }

    fn plan(ops: Vec<PlannedOp>) -> Plan {
        Plan {
            ops,
            relaxed: vec![],
        }
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9 * b.abs().max(1.0), "{a} vs {b}");
    }

    fn succeeded(secs: f64) -> OpOutcome {
        OpOutcome::Succeeded {
            duration: Duration::from_secs_f64(secs),
            report: OpReport::default(),
        }
    }

    /// Three moves off one container share its link: each is on the wire
    /// for all their bytes at its speed, alone for its own.
    #[test]
    fn moves_off_one_container_share_its_link() {
        let s = snap(&[("w0", 10.0), ("w1", 100.0), ("w2", 100.0), ("w3", 100.0)]);
        let p = plan(vec![
            mv(Table::Input, 1, "w0", "w1"),
            mv(Table::Input, 2, "w0", "w2"),
            mv(Table::Input, 3, "w0", "w3"),
        ]);
        let bytes = [MB, 2.0 * MB, 3.0 * MB];
        let w = MoveWire::of(&p, &s, &bytes);
        // 1, 2 and 3 MB at w0's 10 MB/s alone; 6 MB through w0 together.
        for (i, own) in [0.1, 0.2, 0.3].into_iter().enumerate() {
            close(w.own[i], own);
            close(w.shared[i], 0.6);
        }
    }

    /// Moves into one container share its link; a slow destination is the
    /// bottleneck of a move from a fast source; moves of both tables count.
    #[test]
    fn moves_into_one_container_share_its_link() {
        let s = snap(&[("a", 100.0), ("b", 100.0), ("n", 20.0)]);
        let p = plan(vec![
            mv(Table::Input, 2, "a", "n"),
            mv(Table::Model, 4, "b", "n"),
        ]);
        let w = MoveWire::of(&p, &s, &[2.0 * MB, 4.0 * MB]);
        close(w.own[0], 0.1);
        close(w.own[1], 0.2);
        // n receives 6 MB at 20 MB/s.
        close(w.shared[0], 0.3);
        close(w.shared[1], 0.3);
    }

    /// A measured pair slower than both ends prices the move; a container the
    /// snapshot does not know is priced at the slowest known speed; other
    /// operations have no wire time.
    #[test]
    fn pairs_unknown_containers_and_other_operations() {
        let mut s = snap(&[("a", 100.0), ("b", 50.0)]);
        s.links.push(Link {
            from: "b".into(),
            to: "a".into(),
            bytes_per_sec: 5.0 * MB,
        });
        let p = plan(vec![
            mv(Table::Model, 1, "a", "b"),
            mv(Table::Input, 1, "a", "new0"),
            PlannedOp {
                op: Operation::Delete {
                    container: "b".into(),
                },
                deps: vec![0],
            },
        ]);
        let w = MoveWire::of(&p, &s, &[MB, MB, 0.0]);
        close(w.own[0], 0.2); // 1 MB at the pair's 5 MB/s
        close(w.shared[0], 0.2); // a sends 2 MB at 100 MB/s: 0.02
        close(w.own[1], 0.02); // new0 at b's 50 MB/s
        close(w.shared[1], 0.02);
        close(w.own[2], 0.0);
        close(w.shared[2], 0.0);
    }

    /// The case that motivated pricing by shared wire time: a first plan
    /// moved many blocks off one worker's slow link at once, each of its
    /// moves taking as long as all of them. The model learns the link's
    /// speed from it, not a per-operation cost, and prices a later single
    /// small move by its own bytes.
    #[test]
    fn one_large_plan_off_one_link_prices_a_small_plan_by_its_bytes() {
        let s = snap(&[("w0", 10.0), ("w1", 100.0), ("w2", 100.0), ("w3", 100.0)]);
        let big = plan(vec![
            mv(Table::Input, 2, "w0", "w1"),
            mv(Table::Input, 3, "w0", "w2"),
            mv(Table::Input, 4, "w0", "w3"),
        ]);
        // 9 MB through w0 at 10 MB/s: 0.9 s of wire time; each took 0.93 s.
        let report = ExecutionReport {
            outcomes: vec![succeeded(0.93); 3],
            elapsed: Duration::from_secs_f64(0.93),
        };
        let mut m = ReconfigCostModel::default();
        m.observe(&big, &report, &s);
        // Every observation at x = 0.9: the prior slope 2 leaves an
        // intercept of (3 (0.93 − 1.8) + 2 · 1) / 5 < 0, so the fit goes
        // through the origin: (3 · 0.9 · 0.93 + λ · 2) / (3 · 0.81 + λ), the
        // prior's λ = 2 · 0.01².
        let e = m.estimate(OpKind::Move(Table::Input));
        close(e.per_op, 0.0);
        close(e.per_wire_sec, (2.511 + 0.0004) / 2.4302);
        // One block off w1 to w2: 0.01 s of wire time.
        let small = plan(vec![mv(Table::Input, 1, "w1", "w2")]);
        let predicted = m.plan_secs(&small, &s, 4);
        close(predicted, 0.01 * e.per_wire_sec);
        assert!(predicted < 0.02, "{predicted}");
        // The same plan again is priced at what it took.
        let again = m.plan_secs(&big, &s, 4);
        assert!((again / 0.93 - 1.0).abs() < 0.05, "{again}");
    }

    /// Learned on a fast link, a move over a link ten times slower is
    /// priced ten times higher.
    #[test]
    fn a_slower_link_prices_the_same_bytes_higher() {
        let s = snap(&[("a", 100.0), ("b", 100.0), ("c", 10.0)]);
        // The AM's default prior: 0.05 s plus the wire time at half speed.
        let mut m = ReconfigCostModel::with_prior(
            [(
                OpKind::Move(Table::Input),
                OpCost {
                    per_op: 0.05,
                    per_wire_sec: 2.0,
                },
            )]
            .into_iter()
            .collect(),
            2.0,
            0.01,
        );
        // Moves a→b of 1..=8 MB taking 0.05 s + their wire time.
        let ops: Vec<PlannedOp> = (1..=8).map(|n| mv(Table::Input, n, "a", "b")).collect();
        for op in ops {
            let n = match &op.op {
                Operation::Move { blocks, .. } => blocks.len() as f64,
                _ => unreachable!(),
            };
            let p = plan(vec![op]);
            let report = ExecutionReport {
                outcomes: vec![succeeded(0.05 + n * MB / (100.0 * MB))],
                elapsed: Duration::ZERO,
            };
            m.observe(&p, &report, &s);
        }
        let fast = m.plan_secs(&plan(vec![mv(Table::Input, 5, "a", "b")]), &s, 4);
        let slow = m.plan_secs(&plan(vec![mv(Table::Input, 5, "a", "c")]), &s, 4);
        // 0.05 + 0.05 and 0.05 + 0.5, within the prior's pull.
        assert!((fast / 0.10 - 1.0).abs() < 0.1, "{fast}");
        assert!((slow / 0.55 - 1.0).abs() < 0.1, "{slow}");
    }

    /// The total of a plan counts each move's own bytes once: eight moves off
    /// one link, four at a time, take about the link's time for all of them,
    /// not twice it.
    #[test]
    fn a_plans_total_counts_each_move_once() {
        let s = snap(&[
            ("w0", 10.0),
            ("a", 100.0),
            ("b", 100.0),
            ("c", 100.0),
            ("d", 100.0),
            ("e", 100.0),
            ("f", 100.0),
            ("g", 100.0),
            ("h", 100.0),
        ]);
        let p = plan(
            ["a", "b", "c", "d", "e", "f", "g", "h"]
                .into_iter()
                .map(|to| mv(Table::Input, 1, "w0", to))
                .collect(),
        );
        let m = ReconfigCostModel::with_prior(
            [(
                OpKind::Move(Table::Input),
                OpCost {
                    per_op: 0.0,
                    per_wire_sec: 1.0,
                },
            )]
            .into_iter()
            .collect(),
            2.0,
            0.01,
        );
        // 8 MB through w0 at 10 MB/s.
        close(m.plan_secs(&p, &s, 4), 0.8);
    }
}
