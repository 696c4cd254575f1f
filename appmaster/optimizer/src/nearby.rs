//! Move-aware targets: configurations that trade epoch time for the bytes
//! a plan moves.
//!
//! The solvers place blocks for the fastest epoch and ignore what moving
//! them there costs. On a cluster whose best split needs input moved over
//! a poor link, the plan to the solver's best can cost more than it saves
//! over the remaining epochs while a split one role away, or the best split
//! with fewer blocks moved, saves most of it for a fraction of the plan.
//! [`net_best`] looks at both and returns the target with the largest
//! *net saving*: the epoch time it saves over the remaining epochs less its
//! plan's predicted duration.
//!
//! The candidates are the solver's best, the running roles re-partitioned,
//! and every configuration one role change away (each container made a
//! worker, a server or idle), each placed by
//! [`crate::solver::solve_for_roles`] and then with moves taken back
//! ([`fewer_moves`]): a block the placement sends from a container that
//! keeps its role to another stays where it is whenever that raises the
//! net saving. A container left without blocks is idle.
//!
//! The net saving is what the Cruise cost model minimises over a job's
//! life (training time plus reconfiguration time). It picks the fastest
//! target when many epochs remain, and a cheaper one near the end.
//!
//! An asynchronous job is expected to run at its workers' summed
//! throughput, of which the solvers' epoch is an upper bound. Two
//! candidates of different roles whose bounds are within `min_gain` of
//! each other (a difference the job would not reconfigure for) are ranked
//! by the net saving at the throughput instead; every candidate must
//! still gain and pay at its bound. The prefix splits of the containers
//! in the orders of `solver::role_orders` (the best workers work, or the
//! best servers serve) are candidates too. Each candidate's roles are
//! solved under a cap, the most epoch time at which it could still be
//! chosen over the best so far ([`solve_for_roles_within`]): roles that
//! cannot reach it are ruled out early in the model-split search, which
//! leaves the choice as it was and a decision's time to the candidates
//! that can win.
//!
//! The bound is loosest for a server shared by workers of unequal links:
//! it charges each worker every other worker's requests at the server. On
//! a generated cluster (4 containers of 0.34 CPU and 51
//! Mbit/s, 2 of 0.13 CPU and 241 Mbit/s, MLR of 1,000 features) the bound
//! put 4 workers and one server at 0.325 s an epoch and the 5 workers of
//! the measured best at 0.328 s, the throughput the 5 at 0.309 s;
//! measured, 0.325 s and 0.275 s.

use std::collections::HashMap;

use crate::cost::{CostModel, Placement, Target};
use crate::error::OptimizerError;
use crate::plan::{Configuration, Plan};
use crate::snapshot::Role;
use crate::solver::{Solution, role_orders, solve_for_roles_within};

/// The most targets [`fewer_moves`] prices in one decision (each is an
/// epoch evaluation and a plan): it keeps the best found when it runs out.
/// A step prices every pair of a container that gives blocks and one that
/// receives them; eight containers and 80 blocks take a few thousand.
pub const PRICING_BUDGET: usize = 40_000;

/// Up to this many containers the targets one role change away are
/// candidates; above, only the solver's best and the running roles (each
/// is a solve for fixed roles).
pub const NEARBY_UP_TO: usize = 12;

/// Whether `a` exceeds `b` by more than float noise.
fn above(a: f64, b: f64) -> bool {
    a > b + 1e-9 * b.abs() + 1e-12
}

/// A target priced: its predicted epoch, its plan and the plan's duration.
#[derive(Debug, Clone)]
pub struct Priced {
    /// The configuration by counts.
    pub target: Target,
    /// Predicted epoch time (the solvers' [`crate::cost::Breakdown::epoch_secs`]).
    pub epoch_secs: f64,
    /// The epoch time the job is expected to run at: an asynchronous job's
    /// throughput ([`crate::cost::Breakdown::throughput_epoch_secs`]), of
    /// which `epoch_secs` is an upper bound; `epoch_secs` otherwise.
    pub expected_secs: f64,
    /// The plan from the running configuration.
    pub plan: Plan,
    /// The plan's predicted duration, seconds.
    pub cost_secs: f64,
}

impl Priced {
    /// Seconds saved over `remaining` epochs from `current` seconds an epoch,
    /// less the plan.
    pub fn net(&self, current: f64, remaining: f64) -> f64 {
        (current - self.epoch_secs) * remaining - self.cost_secs
    }

    /// [`Priced::net`] at the expected epoch time (`expected_secs`).
    pub fn expected_net(&self, current: f64, remaining: f64) -> f64 {
        (current - self.expected_secs) * remaining - self.cost_secs
    }
}

/// Prices targets and counts what it priced against [`PRICING_BUDGET`].
pub struct Pricer<'a> {
    model: &'a CostModel,
    current: &'a Configuration,
    plan_secs: &'a dyn Fn(&Plan) -> f64,
    priced: std::cell::Cell<usize>,
}

impl<'a> Pricer<'a> {
    /// A pricer of targets from `current` under `model`, plans timed by `plan_secs`.
    pub fn new(
        model: &'a CostModel,
        current: &'a Configuration,
        plan_secs: &'a dyn Fn(&Plan) -> f64,
    ) -> Self {
        Pricer {
            model,
            current,
            plan_secs,
            priced: std::cell::Cell::new(0),
        }
    }

    /// `target` priced; `None` when the model cannot train on it.
    pub fn price(&self, target: Target) -> Result<Option<Priced>, OptimizerError> {
        self.priced.set(self.priced.get() + 1);
        let (epoch_secs, expected_secs) = match self.model.evaluate(&target) {
            Ok(b) if b.epoch_secs.is_finite() => {
                let expected = if self.model.job().asynchronous {
                    b.throughput_epoch_secs.min(b.epoch_secs)
                } else {
                    b.epoch_secs
                };
                (b.epoch_secs, expected)
            }
            _ => return Ok(None),
        };
        let plan = Plan::between(self.current, &target)?;
        let cost_secs = (self.plan_secs)(&plan);
        Ok(Some(Priced {
            target,
            epoch_secs,
            expected_secs,
            plan,
            cost_secs,
        }))
    }

    fn exhausted(&self) -> bool {
        self.priced.get() >= PRICING_BUDGET
    }
}

/// Of the solver's `best` and the targets near the running configuration
/// (module docs), the one with the largest net saving from `current_epoch`
/// seconds an epoch over `remaining` epochs, among those that gain at
/// least `min_gain` at their bound and pay their plan at it (the solver's
/// best whatever it gains). For an asynchronous job, two targets of other
/// roles whose bounds are within `min_gain` of each other are compared at
/// their expected epoch time ([`Priced::expected_secs`], the throughput),
/// and the splits of `prefix_splits` are candidates too. Ties keep the
/// solver's best, then the earlier candidate. `current_epoch` and
/// `remaining` must be finite.
pub fn net_best(
    pricer: &Pricer<'_>,
    best: &Solution,
    current_epoch: f64,
    remaining: f64,
    min_gain: f64,
) -> Result<Priced, OptimizerError> {
    let model = pricer.model;
    let net = |p: &Priced| p.expected_net(current_epoch, remaining);
    let Some(mut chosen) = pricer.price(best.target.clone())? else {
        return Err(OptimizerError::Infeasible(
            "the solver's best configuration cannot train".into(),
        ));
    };
    // A candidate must gain `min_gain` at its bound, and pay its plan at
    // its bound where the one it would replace does: the bound keeps the
    // choice safe. The expected net saving ranks only targets of other
    // roles whose bounds are within `min_gain` of each other, a difference
    // the job would not act on: the throughput's errors are larger than
    // the bound's where a slow server holds part of the model (a 6W+2S
    // that kept a 16 MB/s server was priced at 0.142 s by the throughput,
    // 0.174 s by the bound, and ran at 0.197 s, against 0.15 s and 0.113 s
    // for two fast servers). Between placements of the same roles the
    // bound decides too: an asynchronous job's throughput does not see how
    // its input is dealt, the bound deals it so that every worker passes
    // its records at the same pace (each record seen as often as the
    // others).
    let bound_net = |p: &Priced| p.net(current_epoch, remaining);
    let consider = |p: Priced, chosen: &mut Priced| {
        let safe = (current_epoch - p.epoch_secs) / current_epoch >= min_gain
            && (bound_net(&p) > 0.0 || bound_net(chosen) <= 0.0);
        let apart = (p.epoch_secs - chosen.epoch_secs).abs()
            > min_gain * p.epoch_secs.min(chosen.epoch_secs);
        let wins = if same_roles(&p.target, &chosen.target) || apart {
            above(bound_net(&p), bound_net(chosen))
        } else {
            above(net(&p), net(chosen))
        };
        if safe && wins {
            *chosen = p;
        }
    };
    // The most epoch time at their bound a target can have and still be
    // chosen over `chosen`: it must gain `min_gain`, and either lie within
    // `min_gain` of `chosen`'s bound or save more at its bound than
    // `chosen` does net of its plan (a plan costs nothing or more). Roles
    // whose best partition is above it are not solved to the end.
    let cap = |chosen: &Priced| {
        let pays = if remaining > 0.0 {
            chosen.epoch_secs + chosen.cost_secs / remaining
        } else {
            f64::INFINITY
        };
        let band = chosen.epoch_secs * (1.0 + min_gain);
        let safe = current_epoch * (1.0 - min_gain);
        safe.min(band.max(pays)) * (1.0 + 1e-9)
    };
    // Solves by roles, each with the cap it was solved under: what was found
    // under a cap serves every lower one (the prefix splits repeat some of
    // the role sets one change away).
    let mut solved: HashMap<Vec<Role>, (f64, Option<Solution>)> = HashMap::new();
    let mut solve_within = |roles: &[Role], cap: f64| -> Option<Solution> {
        if let Some((solved_cap, s)) = solved.get(roles)
            && cap <= *solved_cap
        {
            return s.clone().filter(|s| s.epoch_secs <= cap);
        }
        let s = solve_for_roles_within(model, roles, cap).ok().flatten();
        solved.insert(roles.to_vec(), (cap, s.clone()));
        s
    };
    let pruned = fewer_moves(pricer, chosen.clone(), current_epoch, remaining)?;
    consider(pruned, &mut chosen);
    let running: Vec<Role> = model
        .current_placements()
        .iter()
        .map(|p| match p.role {
            Role::Worker if p.input_blocks == 0 => Role::Idle,
            Role::Server if p.model_blocks == 0 => Role::Idle,
            r => r,
        })
        .collect();
    let mut role_sets = vec![running.clone()];
    for i in 0..running.len() {
        for r in [Role::Worker, Role::Server, Role::Idle] {
            if r != running[i] {
                let mut roles = running.clone();
                roles[i] = r;
                role_sets.push(roles);
            }
        }
    }
    if running.len() > NEARBY_UP_TO {
        role_sets.truncate(1);
    }
    for roles in role_sets {
        if pricer.exhausted() {
            break;
        }
        let Some(s) = solve_within(&roles, cap(&chosen)) else {
            continue;
        };
        let Some(p) = pricer.price(s.target)? else {
            continue;
        };
        let p = fewer_moves(pricer, p, current_epoch, remaining)?;
        consider(p, &mut chosen);
    }
    if model.job().asynchronous {
        for roles in prefix_splits(model) {
            if pricer.exhausted() {
                break;
            }
            let Some(s) = solve_within(&roles, cap(&chosen)) else {
                continue;
            };
            if let Some(p) = pricer.price(s.target)? {
                consider(p, &mut chosen);
            }
        }
    }
    Ok(chosen)
}

/// Whether two targets give every container the same role (a container
/// a target leaves out is idle).
fn same_roles(a: &Target, b: &Target) -> bool {
    let role = |t: &Target, id: &String| t.get(id).map_or(Role::Idle, |p| p.role);
    a.keys()
        .chain(b.keys())
        .all(|id| role(a, id) == role(b, id))
}

/// The splits "the first `w` work, the rest serve" (`w` = 1 … n−1) of the
/// containers in each order of `solver::role_orders` (the best workers
/// work, or the best servers serve): where an asynchronous job's
/// throughput and the solvers' bound disagree, the throughput's best is
/// usually one of them, far from the running roles and from the bound's
/// best.
fn prefix_splits(model: &CostModel) -> Vec<Vec<Role>> {
    let n = model.len();
    let mut out: Vec<Vec<Role>> = Vec::new();
    for order in role_orders(model) {
        for w in 1..n {
            let mut roles = vec![Role::Server; n];
            for &i in &order[..w] {
                roles[i] = Role::Worker;
            }
            if !out.contains(&roles) {
                out.push(roles);
            }
        }
    }
    out
}

/// `start` with the moves of its plan taken back while that raises the net
/// saving: in each step, of every container that gives blocks of a table
/// and keeps holding some and every container that receives them, the
/// pair whose one block, or whose whole difference, left where it is
/// raises the net saving most. Ends when no step raises it or the pricing
/// budget is spent.
pub fn fewer_moves(
    pricer: &Pricer<'_>,
    start: Priced,
    current_epoch: f64,
    remaining: f64,
) -> Result<Priced, OptimizerError> {
    let now = pricer.current.counts();
    let held = |t: &Target, id: &str, input: bool| {
        t.get(id).map_or(0, |p| {
            if input {
                p.input_blocks
            } else {
                p.model_blocks
            }
        })
    };
    let mut best = start;
    loop {
        let mut step: Option<Priced> = None;
        for input in [true, false] {
            let role = if input { Role::Worker } else { Role::Server };
            let ids: Vec<&String> = pricer.model.ids().iter().collect();
            // Givers keep the role and some blocks; receivers hold more than now.
            let givers: Vec<&String> = ids
                .iter()
                .copied()
                .filter(|id| {
                    let t = held(&best.target, id, input);
                    t > 0 && t < held(&now, id, input)
                })
                .collect();
            let receivers: Vec<&String> = ids
                .iter()
                .copied()
                .filter(|id| held(&best.target, id, input) > held(&now, id, input))
                .collect();
            for a in &givers {
                for b in &receivers {
                    let gap = (held(&now, a, input) - held(&best.target, a, input))
                        .min(held(&best.target, b, input) - held(&now, b, input));
                    let steps: &[u32] = if gap > 1 { &[1, gap] } else { &[1] };
                    for &k in steps {
                        if pricer.exhausted() {
                            return Ok(best);
                        }
                        let mut t = best.target.clone();
                        shift(&mut t, a, role, input, k as i64);
                        shift(&mut t, b, role, input, -(k as i64));
                        let Some(p) = pricer.price(t)? else {
                            continue;
                        };
                        let bar = step.as_ref().unwrap_or(&best).net(current_epoch, remaining);
                        if above(p.net(current_epoch, remaining), bar) {
                            step = Some(p);
                        }
                    }
                }
            }
        }
        match step {
            Some(p) => best = p,
            None => return Ok(best),
        }
    }
}

/// Adds `by` blocks of one table to `id`'s count; a container left without
/// blocks is idle, one given its first holds `role`.
fn shift(t: &mut Target, id: &str, role: Role, input: bool, by: i64) {
    let p = t.entry(id.to_string()).or_insert(Placement::IDLE);
    let count = if input {
        &mut p.input_blocks
    } else {
        &mut p.model_blocks
    };
    *count = (i64::from(*count) + by).max(0) as u32;
    let left = p.input_blocks + p.model_blocks;
    if left == 0 {
        *p = Placement::IDLE;
    } else {
        p.role = role;
    }
}
