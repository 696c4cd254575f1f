//! When to reconfigure: the trigger policy.
//!
//! [`TriggerPolicy::decide`] looks at a metrics [`Snapshot`] and the running
//! [`Configuration`] and returns a [`Decision`]:
//!
//! * **Wait** until every active worker has reported
//!   [`TriggerConfig::min_mini_batches`] mini-batches since the last reconfiguration,
//!   or, for a straggler that has reported at least one, until the median active
//!   worker has reported [`STRAGGLER_FACTOR`] times as many.
//! * **Stay** unless the best configuration is faster by at least
//!   [`TriggerConfig::min_gain`] (5% by default) *and* the time it saves over the
//!   remaining epochs exceeds the plan's predicted duration. A job at its optimum
//!   therefore never reconfigures. "Best" is the target with the largest net
//!   saving (time saved over the remaining epochs less the plan): the solver's
//!   fastest, or one near the running configuration with fewer bytes to move
//!   ([`crate::nearby`]); with many epochs left that is the fastest. Of an
//!   asynchronous job's targets that the bound puts within `min_gain` of
//!   each other, the saving at the expected throughput decides.
//! * **Reconfigure** with a plan otherwise, once
//!   [`TriggerConfig::confirmations`] looks in a row have proposed to
//!   reconfigure, to the split the latest of them proposed
//!   ([`TriggerPolicy::confirm`]; until then the decision is **Considering**), so
//!   that one noisy look does not move the job. Containers offered by the resource manager
//!   (role `idle`) are candidates like any other. Containers marked `reclaimed` force a
//!   plan regardless of gain: they are emptied and deleted, and the survivors either
//!   keep their roles (only the partition changes) or get the fully re-optimised
//!   configuration when that is worth its extra cost by the same rule.
//!
//! * **Measured beats predicted.** When the job leaves a configuration for a
//!   plan, the policy remembers its roles and its measured epoch time
//!   ([`TriggerPolicy::leaving`], [`MeasuredSplit`]). A later look judges a
//!   return there by that measurement against the running configuration's
//!   ([`crate::Job::measured_epoch_secs`]), not by the model: a plan that measurably
//!   made the job slower is undone, and the model cannot send the job back to
//!   a split it measured worse.
//! * **A promise that did not deliver discounts the next.** The policy also
//!   remembers what the proposal that left a split promised and where it
//!   went. The model's next gain must exceed, by the threshold, how far the
//!   latest plan's promise, or the last one made from the running roles,
//!   fell short of what the job measured; until measured, the way back to a
//!   measured split is judged against that discounted gain. A model that
//!   overprices the running split makes every split it prices right look
//!   like a gain, and without this the job wanders from split to split.
//!   The first promise is taken on the model's word: a move is measured
//!   and undone if it was worse, a stay never is.
//!
//! What a plan costs is [`ReconfigCostModel`]'s (in `reconfig_cost`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::cost::{CostModel, Target};
use crate::error::OptimizerError;
use crate::executor::ExecutionReport;
use crate::nearby::{Pricer, net_best};
use crate::plan::{Configuration, Plan};
pub use crate::reconfig_cost::{OpCost, OpCostEstimate, ReconfigCostModel};
use crate::snapshot::{Role, Snapshot};
use crate::solver::{solve, solve_for_roles};

/// A worker behind on its mini-batches holds the look back only until the
/// median active worker has reported this many times
/// [`TriggerConfig::min_mini_batches`] (and only if it has reported at
/// least one). On `bench-optimizer`'s emulated cluster, one fast worker
/// behind a saturated slow server took 20 s to report its first five
/// mini-batches while the others reported 40 or more each: the look came
/// 20 s late, most of a 14-epoch job.
pub const STRAGGLER_FACTOR: u32 = 4;

/// Policy settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TriggerConfig {
    /// Mini-batches every active worker must have reported before planning.
    pub min_mini_batches: u32,
    /// Least relative epoch-time gain worth a reconfiguration (0.05 = 5%).
    pub min_gain: f64,
    /// Parallelism of the plan executor, for the plan duration prediction.
    pub max_parallel: usize,
    /// Looks in a row that must propose to reconfigure before a plan runs
    /// (at least 1; a forced plan runs at once).
    pub confirmations: u32,
}

impl Default for TriggerConfig {
    fn default() -> Self {
        TriggerConfig {
            min_mini_batches: 5,
            min_gain: 0.05,
            max_parallel: 8,
            confirmations: 1,
        }
    }
}

/// A [`TriggerPolicy`]'s settings and cost estimates at one moment
/// ([`TriggerPolicy::state`]), as a [`Snapshot`] carries them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyState {
    /// Least relative gain worth a reconfiguration.
    pub min_gain: f64,
    /// Parallelism of the plan executor.
    pub max_parallel: usize,
    /// The predicted cost of each operation kind.
    pub op_costs: Vec<OpCostEstimate>,
    /// Looks in a row that must propose to reconfigure.
    #[serde(default = "one")]
    pub confirmations: u32,
    /// The split the latest look proposed, and how many looks in a row
    /// proposed to reconfigure.
    #[serde(default)]
    pub proposed: Option<Looks>,
    /// Configurations the job left, with their measured epoch times.
    #[serde(default)]
    pub measured: Vec<MeasuredSplit>,
}

fn one() -> u32 {
    1
}

/// A split the trigger proposed, and on how many looks in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Looks {
    /// Workers of the split the latest look proposed.
    pub workers: u32,
    /// Servers of the split the latest look proposed.
    pub servers: u32,
    /// Looks in a row that proposed to reconfigure.
    pub looks: u32,
}

/// A configuration the job ran in and left, and its epoch time as measured
/// there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredSplit {
    /// Its workers, by container id.
    pub workers: BTreeSet<String>,
    /// Its servers, by container id.
    pub servers: BTreeSet<String>,
    /// Its epoch time as measured when the job left it
    /// ([`crate::Job::measured_epoch_secs`]), seconds.
    pub epoch_secs: f64,
    /// When the job left it for the policy's proposal: the gain that
    /// proposal was made for (0 otherwise). What it delivered is known once
    /// the job has measured the split it went to ([`MeasuredSplit::went_to`]),
    /// and a later proposal from this split is judged by the shortfall
    /// ([`TriggerPolicy::decide`]).
    #[serde(default)]
    pub promised_gain: f64,
    /// The split the proposal led to, when `promised_gain` is > 0. `None`
    /// with a promise means the same roles re-partitioned (what a policy
    /// state written before this field recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub went_to: Option<SplitIds>,
}

/// A split by container ids: its workers and its servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitIds {
    /// Its workers, by container id.
    pub workers: BTreeSet<String>,
    /// Its servers, by container id.
    pub servers: BTreeSet<String>,
}

impl MeasuredSplit {
    /// The roles of `containers` as a split (idle ones are in neither set).
    fn of<'a>(
        containers: impl IntoIterator<Item = (&'a String, Role)>,
    ) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut workers, mut servers) = (BTreeSet::new(), BTreeSet::new());
        for (id, role) in containers {
            match role {
                Role::Worker => {
                    workers.insert(id.clone());
                }
                Role::Server => {
                    servers.insert(id.clone());
                }
                Role::Idle => {}
            }
        }
        (workers, servers)
    }

    fn is(&self, split: &(BTreeSet<String>, BTreeSet<String>)) -> bool {
        self.workers == split.0 && self.servers == split.1
    }

    fn role_of(&self, id: &str) -> Role {
        role_in(&self.workers, &self.servers, id)
    }

    /// Whether `target` (a split of `snapshot`'s containers) is this split
    /// again, with its containers that have left since replaced by offered
    /// ones in the same roles: the members keep the roles they had here,
    /// and the target takes as many offered workers and servers as this
    /// split had containers that are gone. (A job that added a server,
    /// measured it and gave it back would otherwise try the same again
    /// with the next container offered.)
    fn matches(&self, target: &(BTreeSet<String>, BTreeSet<String>), snapshot: &Snapshot) -> bool {
        let mut offered = (0, 0);
        for c in &snapshot.containers {
            match (c.role, role_in(&target.0, &target.1, &c.id)) {
                (Role::Idle, Role::Worker) => offered.0 += 1,
                (Role::Idle, Role::Server) => offered.1 += 1,
                (Role::Idle, Role::Idle) => {}
                (_, role) if role != self.role_of(&c.id) => return false,
                _ => {}
            }
        }
        let gone = |ids: &BTreeSet<String>| {
            ids.iter()
                .filter(|id| !snapshot.containers.iter().any(|c| &c.id == *id))
                .count()
        };
        (gone(&self.workers), gone(&self.servers)) == offered
    }

    /// "2W+3S", for decisions' reasons.
    fn text(&self) -> String {
        format!("{}W+{}S", self.workers.len(), self.servers.len())
    }
}

/// The role of `id` in a split of `workers` and `servers`.
fn role_in(workers: &BTreeSet<String>, servers: &BTreeSet<String>, id: &str) -> Role {
    if workers.contains(id) {
        Role::Worker
    } else if servers.contains(id) {
        Role::Server
    } else {
        Role::Idle
    }
}

impl PolicyState {
    /// Checks ranges; `at` names the field in errors.
    pub fn validate(&self, at: &str) -> Result<(), OptimizerError> {
        if !(0.0..1.0).contains(&self.min_gain) {
            return Err(OptimizerError::invalid(
                format!("{at}.min_gain"),
                format!("{} is not within [0, 1)", self.min_gain),
            ));
        }
        if self.max_parallel == 0 {
            return Err(OptimizerError::invalid(
                format!("{at}.max_parallel"),
                "must be > 0",
            ));
        }
        if self.confirmations == 0 {
            return Err(OptimizerError::invalid(
                format!("{at}.confirmations"),
                "must be > 0",
            ));
        }
        for (i, m) in self.measured.iter().enumerate() {
            if !(m.epoch_secs.is_finite() && m.epoch_secs > 0.0) {
                return Err(OptimizerError::invalid(
                    format!("{at}.measured[{i}].epoch_secs"),
                    format!("{} is not a finite number > 0", m.epoch_secs),
                ));
            }
        }
        for (i, e) in self.op_costs.iter().enumerate() {
            for (name, v) in [("per_op", e.per_op), ("per_wire_sec", e.per_wire_sec)] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(OptimizerError::invalid(
                        format!("{at}.op_costs[{i}].{name}"),
                        format!("{v} is not a finite number >= 0"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A reconfiguration worth doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The operations.
    pub plan: Plan,
    /// The configuration it leads to.
    pub target: Target,
    /// Predicted epoch time now (infinite when the running configuration cannot train).
    pub current_epoch_secs: f64,
    /// Predicted epoch time after the plan.
    pub predicted_epoch_secs: f64,
    /// Relative gain `(current − predicted) / current`.
    pub gain: f64,
    /// Predicted plan duration, seconds.
    pub predicted_cost_secs: f64,
    /// Whether it is forced by reclaimed containers (no gain test).
    pub forced: bool,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Not enough metrics yet.
    Wait {
        /// Why.
        reason: String,
    },
    /// Keep the running configuration.
    Stay {
        /// Predicted epoch time now.
        current_epoch_secs: f64,
        /// Best predicted epoch time found.
        best_epoch_secs: f64,
        /// Relative gain of the best configuration.
        gain: f64,
        /// Why.
        reason: String,
    },
    /// A reconfiguration worth doing, proposed on fewer looks in a row than
    /// [`TriggerConfig::confirmations`] so far.
    Considering {
        /// Workers of the proposed split.
        workers: u32,
        /// Servers of the proposed split.
        servers: u32,
        /// Looks in a row that proposed to reconfigure, this one included.
        look: u32,
        /// Looks it needs.
        of: u32,
        /// Predicted epoch time now.
        current_epoch_secs: f64,
        /// Predicted epoch time after the plan.
        predicted_epoch_secs: f64,
    },
    /// Run this plan.
    Reconfigure(Box<Proposal>),
}

/// The trigger policy and its learned cost model (one per job, owned by the AM loop).
#[derive(Debug, Clone, Default)]
pub struct TriggerPolicy {
    /// Settings.
    pub config: TriggerConfig,
    /// Reconfiguration cost model.
    pub costs: ReconfigCostModel,
    /// The split the previous looks proposed ([`TriggerPolicy::confirm`]).
    pub proposed: Option<Looks>,
    /// Configurations the job left, with their measured epoch times
    /// ([`TriggerPolicy::leaving`]).
    pub measured: Vec<MeasuredSplit>,
}

impl TriggerPolicy {
    /// A policy with the default cost prior.
    pub fn new(config: TriggerConfig) -> Self {
        TriggerPolicy {
            config,
            costs: ReconfigCostModel::default(),
            proposed: None,
            measured: Vec::new(),
        }
    }

    /// Learns from a plan executed from `snapshot` (the one it was decided on).
    pub fn observe(&mut self, plan: &Plan, report: &ExecutionReport, snapshot: &Snapshot) {
        self.costs.observe(plan, report, snapshot);
    }

    /// What this policy decides with beyond a snapshot's measurements: its
    /// gain threshold, parallelism and current cost estimates (priors and
    /// what past plans taught it). A snapshot carries it so that `cruise
    /// plan` decides as the job did.
    pub fn state(&self) -> PolicyState {
        PolicyState {
            min_gain: self.config.min_gain,
            max_parallel: self.config.max_parallel,
            op_costs: self.costs.estimates(),
            confirmations: self.config.confirmations,
            proposed: self.proposed,
            measured: self.measured.clone(),
        }
    }

    /// The policy `state` describes (its estimates as the prior, so they
    /// are what it predicts until it observes plans of its own, and the looks
    /// so far), planning after `min_mini_batches`.
    pub fn from_state(state: &PolicyState, min_mini_batches: u32) -> TriggerPolicy {
        TriggerPolicy {
            config: TriggerConfig {
                min_mini_batches,
                min_gain: state.min_gain,
                max_parallel: state.max_parallel,
                confirmations: state.confirmations,
            },
            costs: ReconfigCostModel::from_estimates(&state.op_costs),
            proposed: state.proposed,
            measured: state.measured.clone(),
        }
    }

    /// The job leaves the running configuration of `snapshot` for a plan
    /// (`to`, when it is the policy's proposal): remembers its roles and
    /// measured epoch time (replacing an earlier measurement of the same
    /// split), and the proposal's gain and the split it leads to.
    /// Nothing is remembered before the configuration has been measured.
    pub fn leaving(&mut self, snapshot: &Snapshot, to: Option<&Proposal>) {
        let Some(epoch_secs) = snapshot.job.measured_epoch_secs else {
            return;
        };
        let split = MeasuredSplit::of(snapshot.containers.iter().map(|c| (&c.id, c.role)));
        let promise = to.filter(|p| p.gain > 0.0).map(|p| {
            let (workers, servers) = MeasuredSplit::of(p.target.iter().map(|(id, t)| (id, t.role)));
            (p.gain, SplitIds { workers, servers })
        });
        self.measured.retain(|m| !m.is(&split));
        self.measured.push(MeasuredSplit {
            workers: split.0,
            servers: split.1,
            epoch_secs,
            promised_gain: promise.as_ref().map_or(0.0, |p| p.0),
            went_to: promise.map(|p| p.1),
        });
    }

    /// Counts a look's decision against [`TriggerConfig::confirmations`]: a
    /// plan that is not forced stands only once that many looks in a row
    /// proposed to reconfigure (the latest look's plan is the one that
    /// runs); before, it becomes [`Decision::Considering`]. Any other
    /// decision starts the count again. Call it once per look, in
    /// order, with what [`TriggerPolicy::decide`] returned.
    pub fn confirm(&mut self, decision: Decision) -> Decision {
        let Decision::Reconfigure(p) = decision else {
            self.proposed = None;
            return decision;
        };
        let count = |role| p.target.values().filter(|x| x.role == role).count() as u32;
        let (workers, servers) = (count(Role::Worker), count(Role::Server));
        // The looks confirm that the running split is worth leaving; where
        // to is the latest look's answer (it has the most measurements).
        // Counting only looks that named the same split let two splits the
        // model puts within noise of each other hold a job at a split both
        // beat by far, look after look.
        let look = self.proposed.map_or(1, |l| l.looks + 1);
        let of = self.config.confirmations.max(1);
        if p.forced || look >= of {
            self.proposed = None;
            return Decision::Reconfigure(p);
        }
        self.proposed = Some(Looks {
            workers,
            servers,
            looks: look,
        });
        Decision::Considering {
            workers,
            servers,
            look,
            of,
            current_epoch_secs: p.current_epoch_secs,
            predicted_epoch_secs: p.predicted_epoch_secs,
        }
    }

    /// The plan that gives the containers `roles` names those roles (the
    /// others keep theirs), whatever it gains: an operator's or a test's
    /// choice, not the policy's. The solver places the blocks for the
    /// roles, every worker and server keeping at least one block of its
    /// table (none is left idle and deleted). The target is priced as the
    /// running configuration is (asynchronous workers by their summed
    /// throughput), the plan as
    /// [`TriggerPolicy::decide`]'s are; the proposal is not forced. Fails on a
    /// container the snapshot does not have, and on roles no partition
    /// fits (no worker, no server, more workers than input blocks).
    pub fn propose_roles(
        &self,
        snapshot: &Snapshot,
        current: &Configuration,
        roles: &BTreeMap<String, Role>,
    ) -> Result<Proposal, OptimizerError> {
        snapshot.validate()?;
        check_agreement(snapshot, current)?;
        let model = CostModel::new(snapshot)?;
        if let Some(id) = roles.keys().find(|id| !model.ids().contains(id)) {
            return Err(OptimizerError::UnknownContainer {
                container: id.clone(),
                context: "the roles asked for".into(),
            });
        }
        let wanted: Vec<Role> = model
            .ids()
            .iter()
            .zip(model.current_placements())
            .map(|(id, p)| roles.get(id).copied().unwrap_or(p.role))
            .collect();
        let mut target = solve_for_roles(&model, &wanted)?.target;
        // The solver may leave a server or a worker without blocks (idle,
        // then deleted); the roles asked for, and those kept, are taken.
        for (id, role) in model.ids().iter().zip(&wanted) {
            give_one_block(&mut target, id, *role);
        }
        let epoch = as_running(&model.evaluate(&target)?, snapshot);
        let plan = Plan::between(current, &target)?;
        let current_epoch = current_epoch_secs(snapshot, current)?;
        let gain = gain_of(current_epoch, epoch);
        Ok(Proposal {
            predicted_cost_secs: self
                .costs
                .plan_secs(&plan, snapshot, self.config.max_parallel),
            plan,
            target,
            current_epoch_secs: current_epoch,
            predicted_epoch_secs: epoch,
            gain,
            forced: false,
        })
    }

    /// Decides whether and how to reconfigure. `current` is the AM's ownership table;
    /// it must agree with the snapshot's roles and block counts.
    pub fn decide(
        &self,
        snapshot: &Snapshot,
        current: &Configuration,
    ) -> Result<Decision, OptimizerError> {
        snapshot.validate()?;
        check_agreement(snapshot, current)?;
        let forced = snapshot.containers.iter().any(|c| c.reclaimed);
        if !forced && let Some(reason) = self.waiting_for(snapshot) {
            return Ok(Decision::Wait { reason });
        }
        let current_epoch = current_epoch_secs(snapshot, current)?;
        let model = CostModel::new(snapshot)?;
        let best = solve(&model)?;
        let job = &snapshot.job;
        let pays = |from: f64, to: f64, extra_cost: f64| {
            gain_of(from, to) >= self.config.min_gain
                && (from.is_infinite() || (from - to) * job.remaining_epochs > extra_cost)
        };
        let propose = |target: Target, epoch: f64, forced: bool| {
            let plan = Plan::between(current, &target)?;
            let cost = self
                .costs
                .plan_secs(&plan, snapshot, self.config.max_parallel);
            Ok::<_, OptimizerError>(Proposal {
                plan,
                target,
                current_epoch_secs: current_epoch,
                predicted_epoch_secs: epoch,
                gain: gain_of(current_epoch, epoch),
                predicted_cost_secs: cost,
                forced,
            })
        };
        if forced {
            let roles: Vec<Role> = model.current_placements().iter().map(|p| p.role).collect();
            let full = propose(best.target, best.epoch_secs, true)?;
            let chosen = match solve_for_roles(&model, &roles) {
                Ok(keep) => {
                    let keep = propose(keep.target, keep.epoch_secs, true)?;
                    let extra = full.predicted_cost_secs - keep.predicted_cost_secs;
                    if pays(keep.predicted_epoch_secs, full.predicted_epoch_secs, extra) {
                        full
                    } else {
                        keep
                    }
                }
                Err(_) => full,
            };
            return Ok(Decision::Reconfigure(Box::new(chosen)));
        }
        // The target with the largest net saving: the solver's best or one
        // near the running configuration with fewer bytes to move.
        let best = if current_epoch.is_finite() && job.remaining_epochs.is_finite() {
            let plan_secs = |p: &Plan| self.costs.plan_secs(p, snapshot, self.config.max_parallel);
            let pricer = Pricer::new(&model, current, &plan_secs);
            let chosen = net_best(
                &pricer,
                &best,
                current_epoch,
                job.remaining_epochs,
                self.config.min_gain,
            )?;
            crate::solver::Solution {
                target: chosen.target,
                epoch_secs: chosen.epoch_secs,
                ..best
            }
        } else {
            best
        };
        let stay = |reason: String| Decision::Stay {
            current_epoch_secs: current_epoch,
            best_epoch_secs: best.epoch_secs,
            gain: gain_of(current_epoch, best.epoch_secs),
            reason,
        };
        if let Some(decision) =
            self.by_measurement(snapshot, &model, &best, current_epoch, &propose)?
        {
            return Ok(decision);
        }
        let gain = gain_of(current_epoch, best.epoch_secs);
        if gain < self.config.min_gain {
            return Ok(stay(format!(
                "predicted gain {:.2}% is below the {:.2}% threshold",
                gain * 100.0,
                self.config.min_gain * 100.0
            )));
        }
        let proposal = propose(best.target.clone(), best.epoch_secs, false)?;
        if proposal.plan.is_empty() {
            return Ok(stay("the best configuration is the running one".into()));
        }
        if !pays(current_epoch, best.epoch_secs, proposal.predicted_cost_secs) {
            return Ok(stay(format!(
                "saving {:.1}s over {} remaining epochs does not pay a {:.1}s reconfiguration",
                (current_epoch - best.epoch_secs) * job.remaining_epochs,
                job.remaining_epochs,
                proposal.predicted_cost_secs
            )));
        }
        Ok(Decision::Reconfigure(Box::new(proposal)))
    }
}

impl TriggerPolicy {
    /// Why a look must wait for more measurements, if it must: no worker
    /// holds input yet, or one has reported fewer than `min_mini_batches`
    /// (a straggler that has reported at least one stops holding the look
    /// once the median worker has reported [`STRAGGLER_FACTOR`] times as
    /// many).
    fn waiting_for(&self, snapshot: &Snapshot) -> Option<String> {
        let active: Vec<_> = snapshot
            .containers
            .iter()
            .filter(|c| c.role == Role::Worker && c.input_blocks > 0)
            .collect();
        if active.is_empty() {
            return Some("no active worker yet".into());
        }
        let min = self.config.min_mini_batches;
        let c = active.iter().find(|c| c.mini_batches < min)?;
        let mut counts: Vec<u32> = active.iter().map(|c| c.mini_batches).collect();
        counts.sort_unstable();
        let median = counts[counts.len() / 2];
        let stragglers_heard = active.iter().all(|c| c.mini_batches >= 1);
        if stragglers_heard && median >= STRAGGLER_FACTOR.saturating_mul(min) {
            return None;
        }
        Some(format!(
            "worker `{}` has reported {} of {} mini-batches",
            c.id, c.mini_batches, min
        ))
    }

    /// What the configurations the job measured say, where it overrules the
    /// model: `None` when they have no say. With the running configuration
    /// measured at `m` seconds an epoch:
    ///
    /// * the best measured split that the job left (all its containers still
    ///   here), measured at `e`, is worth going back to when it gains
    ///   `(m − e) / m` of at least `min_gain`, more than the model's best
    ///   predicts (its gain over `current_epoch`), and saves more than the
    ///   plan costs over the remaining epochs: the plan to its roles, with
    ///   the best partition for them;
    /// * when the model's best split is one the job measured, its
    ///   measurement decides instead of the prediction: stay unless it
    ///   gains `min_gain` and pays.
    fn by_measurement(
        &self,
        snapshot: &Snapshot,
        model: &CostModel,
        best: &crate::solver::Solution,
        current_epoch: f64,
        propose: &dyn Fn(Target, f64, bool) -> Result<Proposal, OptimizerError>,
    ) -> Result<Option<Decision>, OptimizerError> {
        let Some(m) = snapshot.job.measured_epoch_secs else {
            return Ok(None);
        };
        let here = MeasuredSplit::of(snapshot.containers.iter().map(|c| (&c.id, c.role)));
        let present: BTreeSet<&String> = snapshot.containers.iter().map(|c| &c.id).collect();
        let gain = |e: f64| (m - e) / m;
        let remaining = snapshot.job.remaining_epochs;
        let stay = |e: &MeasuredSplit, reason: String| Decision::Stay {
            current_epoch_secs: m,
            best_epoch_secs: e.epoch_secs.min(m),
            gain: gain(e.epoch_secs),
            reason: format!(
                "measured {:.3} s an epoch at {} before, {m:.3} s now: {reason}",
                e.epoch_secs,
                e.text()
            ),
        };
        // The plan to `target`, where the job measured `e`, if it pays.
        let go = |target: Target, e: &MeasuredSplit| -> Result<Option<Decision>, OptimizerError> {
            let mut p = propose(target, e.epoch_secs, false)?;
            if p.plan.is_empty() {
                return Ok(None);
            }
            p.current_epoch_secs = m;
            p.gain = gain(e.epoch_secs);
            let saving = (m - e.epoch_secs) * remaining;
            if saving <= p.predicted_cost_secs {
                return Ok(Some(stay(
                    e,
                    format!(
                        "going there saves {saving:.1}s over {remaining} remaining epochs, less than its {:.1}s reconfiguration",
                        p.predicted_cost_secs
                    ),
                )));
            }
            Ok(Some(Decision::Reconfigure(Box::new(p))))
        };
        let model_gain = if current_epoch.is_finite() && current_epoch > 0.0 {
            (current_epoch - best.epoch_secs) / current_epoch
        } else {
            f64::INFINITY
        };
        let best_split = MeasuredSplit::of(best.target.iter().map(|(id, p)| (id, p.role)));
        let best_is_known = self
            .measured
            .iter()
            .find(|e| e.matches(&best_split, snapshot));
        // How far the model's promises in this job fell short of what was
        // measured: what the model's gain is worth before it is measured.
        let shortfall = self.shortfall(&here, m);
        let discounted = model_gain - shortfall.as_ref().map_or(0.0, |s| s.by);
        // What the model's best is worth: measured if the job has been there.
        let model_claim = best_is_known.map_or(discounted, |e| gain(e.epoch_secs));
        let back = self
            .measured
            .iter()
            .filter(|e| !e.is(&here))
            .filter(|e| {
                e.workers
                    .iter()
                    .chain(&e.servers)
                    .all(|id| present.contains(id))
            })
            .min_by(|a, b| a.epoch_secs.total_cmp(&b.epoch_secs));
        if let Some(e) = back
            && gain(e.epoch_secs) >= self.config.min_gain
            && gain(e.epoch_secs) > model_claim
        {
            let roles: Vec<Role> = model.ids().iter().map(|id| e.role_of(id)).collect();
            let target = crate::solver::solve_for_roles(model, &roles)?.target;
            return go(target, e);
        }
        let e = match best_is_known {
            Some(e) if !e.is(&here) => e,
            _ => {
                let Some(s) = shortfall.filter(|_| discounted < self.config.min_gain) else {
                    return Ok(None);
                };
                let reason = format!(
                    "{} promised {:.1}% and delivered {:.1}%; the model's {:.1}% less \
                     that shortfall is below the {:.1}% threshold",
                    s.what,
                    s.promised * 100.0,
                    s.delivered * 100.0,
                    model_gain * 100.0,
                    self.config.min_gain * 100.0
                );
                return Ok(Some(stay(s.from, reason)));
            }
        };
        if gain(e.epoch_secs) < self.config.min_gain {
            let g = gain(e.epoch_secs);
            let reason = if g <= 0.0 {
                "the model's best split measured slower than this one".to_string()
            } else {
                format!(
                    "the model's best split measured {:.2}% faster, below the {:.2}% threshold",
                    g * 100.0,
                    self.config.min_gain * 100.0
                )
            };
            return Ok(Some(stay(e, reason)));
        }
        go(best.target.clone(), e)
    }
}

/// A promise of the model that fell short of what the job measured
/// ([`TriggerPolicy::shortfall`]).
struct Shortfall<'a> {
    /// The split the promise was made from.
    from: &'a MeasuredSplit,
    /// Which promise, for decisions' reasons.
    what: String,
    /// The gain promised.
    promised: f64,
    /// The gain measured.
    delivered: f64,
    /// `promised − delivered`, > 0.
    by: f64,
}

impl TriggerPolicy {
    /// How far the model's promises in this job fell short of what the
    /// job measured, as the larger of two (`None` when neither fell short
    /// or neither outcome is measured yet):
    ///
    /// * **the latest plan's**: the split the job left last, for a
    ///   proposal that promised a gain, against where it went (here,
    ///   measured at `m` seconds an epoch, or its own measurement);
    /// * **the last promise from these roles**: the job was at the
    ///   running roles before and left them for a proposal; against what
    ///   the split it went to measured (here at `m` when it only
    ///   re-partitioned these roles).
    ///
    /// The model's next gain is discounted by it before the threshold: a
    /// model that overprices the running split (its own measurements
    /// priced in, the other splits' not) makes every split it prices right
    /// look like a gain, and the job would otherwise wander from split to
    /// split, each new one unmeasured, or shuffle blocks look after look.
    /// A gain the model predicts well beyond the shortfall still plans.
    fn shortfall<'a>(
        &'a self,
        here: &(BTreeSet<String>, BTreeSet<String>),
        m: f64,
    ) -> Option<Shortfall<'a>> {
        let outcome = |h: &'a MeasuredSplit, what: String| -> Option<Shortfall<'a>> {
            if h.promised_gain <= 0.0 {
                return None;
            }
            let to = h.went_to.as_ref().map_or_else(
                || (h.workers.clone(), h.servers.clone()),
                |t| (t.workers.clone(), t.servers.clone()),
            );
            let reached = if &to == here {
                m
            } else {
                self.measured.iter().find(|e| e.is(&to))?.epoch_secs
            };
            let delivered = (h.epoch_secs - reached) / h.epoch_secs;
            let by = h.promised_gain - delivered;
            let what = if to == (h.workers.clone(), h.servers.clone()) {
                format!("the last re-partition of {what}")
            } else {
                format!(
                    "the last plan from {what} (to {}W+{}S)",
                    to.0.len(),
                    to.1.len()
                )
            };
            (by > 0.0).then_some(Shortfall {
                from: h,
                what,
                promised: h.promised_gain,
                delivered,
                by,
            })
        };
        let from_here = self
            .measured
            .iter()
            .find(|e| e.is(here))
            .and_then(|h| outcome(h, "these roles".into()));
        let latest = self
            .measured
            .last()
            .filter(|h| !h.is(here))
            .and_then(|h| outcome(h, h.text()));
        match (from_here, latest) {
            (Some(a), Some(b)) => Some(if a.by >= b.by { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

/// Makes `id` a container in `role` holding a block of its role's table
/// if the solver left it without one (and idle), taken from the container
/// of that role holding the most.
fn give_one_block(target: &mut Target, id: &str, role: Role) {
    fn blocks(p: &mut crate::cost::Placement, role: Role) -> Option<&mut u32> {
        match role {
            Role::Worker => Some(&mut p.input_blocks),
            Role::Server => Some(&mut p.model_blocks),
            Role::Idle => None,
        }
    }
    let held = |p: &crate::cost::Placement| match role {
        Role::Worker => p.input_blocks,
        Role::Server => p.model_blocks,
        Role::Idle => 0,
    };
    if role == Role::Idle || target.get(id).is_none_or(|p| p.role == role && held(p) > 0) {
        return;
    }
    let Some(richest) = target
        .iter()
        .filter(|(other, p)| other.as_str() != id && p.role == role && held(p) > 1)
        .max_by_key(|(_, p)| held(p))
        .map(|(other, _)| other.clone())
    else {
        return;
    };
    if let Some(n) = target.get_mut(&richest).and_then(|p| blocks(p, role)) {
        *n -= 1;
    }
    if let Some(p) = target.get_mut(id) {
        // The solver marks a container it left without blocks idle.
        p.role = role;
        if let Some(n) = blocks(p, role) {
            *n += 1;
        }
    }
}

/// The relative gain of going from an epoch of `from` seconds to one of
/// `to`: 1 from a configuration that cannot train (`from` infinite).
fn gain_of(from: f64, to: f64) -> f64 {
    if from.is_infinite() {
        1.0
    } else if from > 0.0 {
        (from - to) / from
    } else {
        0.0
    }
}

/// The running configuration's predicted epoch time (reclaimed containers
/// included: they still run until the plan empties them; infinite when it
/// cannot train). Asynchronous workers each go at their own pace whatever
/// input they hold: the configuration is worth its workers' summed
/// throughput ([`crate::cost::Breakdown::throughput_epoch_secs`]), its
/// roles, model split and input as they are.
///
/// Targets are priced by the solvers' epoch, every worker's requests
/// always queued at every server ([`crate::cost::Breakdown::epoch_secs`]),
/// which for asynchronous workers is an upper bound of their throughput's:
/// a plan must gain even if its target runs as slowly as that, judged
/// against the best estimate of where the job is. A target the model knows
/// only from afar (other roles, another model split) is where its errors
/// lie, and a search for the best-looking one picks the most optimistic;
/// the running configuration is measured. Judged by the bound alone, two
/// workers on 30 Mbit/s links beside one on 848 Mbit/s were priced at 1.02
/// s where they ran at 0.59 s, and the job dropped them for a split that
/// ran at 0.9 s; judged by the throughput without the servers' queues, a
/// 5W+3S priced at 0.73 s ran at 0.85 s and took the job from its best
/// split.
fn current_epoch_secs(snapshot: &Snapshot, current: &Configuration) -> Result<f64, OptimizerError> {
    let now = CostModel::including_reclaimed(snapshot)?;
    Ok(now
        .evaluate(&current.counts())
        .map(|b| as_running(&b, snapshot))
        .unwrap_or(f64::INFINITY))
}

/// A configuration's epoch as [`current_epoch_secs`] prices the running
/// one: its workers' summed throughput when they are asynchronous, else
/// the slowest worker's epoch.
fn as_running(b: &crate::cost::Breakdown, snapshot: &Snapshot) -> f64 {
    if snapshot.job.asynchronous {
        b.throughput_epoch_secs
    } else {
        b.epoch_secs
    }
}

fn check_agreement(snapshot: &Snapshot, current: &Configuration) -> Result<(), OptimizerError> {
    for c in &snapshot.containers {
        let Some(h) = current.containers.get(&c.id) else {
            return Err(OptimizerError::SnapshotMismatch {
                container: c.id.clone(),
                reason: "in the snapshot but not in the configuration".into(),
            });
        };
        if h.role != c.role
            || h.input.len() as u32 != c.input_blocks
            || h.model.len() as u32 != c.model_blocks
        {
            return Err(OptimizerError::SnapshotMismatch {
                container: c.id.clone(),
                reason: format!(
                    "snapshot says {:?} with {}/{} blocks, configuration {:?} with {}/{}",
                    c.role,
                    c.input_blocks,
                    c.model_blocks,
                    h.role,
                    h.input.len(),
                    h.model.len()
                ),
            });
        }
    }
    if let Some(id) = current
        .containers
        .keys()
        .find(|id| !snapshot.containers.iter().any(|c| &c.id == *id))
    {
        return Err(OptimizerError::SnapshotMismatch {
            container: id.clone(),
            reason: "in the configuration but not in the snapshot".into(),
        });
    }
    Ok(())
}
