//! Solvers: choose every container's role and its share of input and model blocks.
//!
//! * [`solve_homogeneous`] — the closed form of Cruise Eq. (5) extended with push
//!   traffic, server processing and whole blocks: O(N), and it prices every split
//!   `(W, S)` so a what-if tool can print them all.
//! * [`solve_for_roles`] — given roles, the best whole-block partitioning. A fast
//!   heuristic first: model blocks go to servers greedily in proportion to their
//!   capacity (the inverse of the largest server-bound cost of a block on it over the
//!   workers, `max(M'/b_j, M·p_j)/L`, which minimises the largest server-bound term),
//!   then single-block moves between servers while they lower the epoch time. Then an
//!   exact branch and bound over the model split (module `split`), pruned by lower
//!   bounds on each worker's communication. Input blocks always go to workers by an
//!   exact greedy (each next block to the worker whose epoch time grows least), which
//!   minimises the slowest worker for the given communication costs. Exact up to
//!   [`SearchOptions::exhaustive_up_to`] containers; above, the branch and bound stops
//!   after [`SearchOptions::split_node_budget`] nodes with the best split found.
//! * [`solve`] — roles too. Uniform containers take the closed form (for them the
//!   proportional model split is exact). Otherwise, up to
//!   [`SearchOptions::exhaustive_up_to`] containers (10), an exact branch and bound over
//!   all `3^N` role assignments: each gets a lower bound, they are taken in order of it,
//!   and each is solved exactly (as above) until the next bound exceeds the best time
//!   found. Above, a search: prefix splits of four orderings (`role_orders`: by a
//!   record's cost as a worker, by compute, by serving cost, by compute over serving
//!   cost) and the current roles are the starting points, then
//!   best-improvement local search over single role changes (worker/server/idle) and
//!   worker↔server swaps, then, from the best, also over changes of two containers at
//!   once; memoised. Ties (within a relative 1e-10) prefer, for an asynchronous job,
//!   the higher throughput ([`crate::cost::Breakdown::throughput_epoch_secs`]: the
//!   epoch is an upper bound of it, and where a slow worker's own link sets the bound,
//!   role assignments far apart share it), then the configuration closest to the
//!   current one; block counts are aligned with the current ones where that costs
//!   nothing, so a job at its optimum gets back its own configuration.
//!
//! Files: the closed form in `homogeneous.rs`, the search over role assignments in
//! `search.rs`, the branch and bound over the model split in `split.rs`.

mod homogeneous;
mod search;
mod split;

pub use homogeneous::{HomogeneousSolution, Split, Uniform, solve_homogeneous};
use search::{Search, distance, exhaustive, finish, prefer, throughput};

use std::cmp::Reverse;

use serde::{Deserialize, Serialize};

use crate::cost::{CostModel, Target};
use crate::error::OptimizerError;
use crate::snapshot::Role;

/// Relative tolerance when comparing epoch times: far above float noise (~1e-15), and
/// under the 1e-9 within which the exact solver must match brute force, so the tie
/// rules can never cost more than that.
const REL_EPS: f64 = 1e-10;

/// Default [`SearchOptions::node_budget`].
const NODE_BUDGET: usize = 500_000;

fn better(a: f64, b: f64) -> bool {
    a < b * (1.0 - REL_EPS)
}

/// A chosen configuration and its predicted epoch time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// Role and block counts of every container of the model.
    pub target: Target,
    /// Predicted epoch time, seconds.
    pub epoch_secs: f64,
    /// Role assignments evaluated by the search (1 for fixed roles).
    pub evaluations: usize,
    /// Whether the search proved this the best configuration of the cost model: false
    /// above [`SearchOptions::exhaustive_up_to`] containers, and when the search ran out
    /// of [`SearchOptions::node_budget`] (it then keeps the best found so far).
    #[serde(default)]
    pub exact: bool,
}

/// Relative tolerance under which [`solve`] treats containers as identical.
pub const UNIFORM_TOLERANCE: f64 = 1e-9;

/// Chooses roles and partitions for the model's containers: the closed form when they
/// are uniform, else the heterogeneous search.
pub fn solve(model: &CostModel) -> Result<Solution, OptimizerError> {
    match model.uniform(UNIFORM_TOLERANCE) {
        Some(u) => {
            let h = solve_homogeneous(model.job(), model.len(), &u)?;
            let w = h.best.workers.min(model.job().input_blocks as usize);
            // Keep current workers as workers and current servers as servers where possible.
            let cur = model.current_placements();
            let mut order: Vec<usize> = (0..model.len()).collect();
            order.sort_by_key(|&i| {
                let rank = match cur[i].role {
                    Role::Worker => 0,
                    Role::Idle => 1,
                    Role::Server => 2,
                };
                (rank, Reverse(cur[i].input_blocks), i)
            });
            // Servers: the last in that order (current servers first), the rest idle.
            let n = model.len();
            let s = h.best.servers.min(n - w);
            let mut roles = vec![Role::Idle; n];
            for &i in &order[..w] {
                roles[i] = Role::Worker;
            }
            for &i in &order[n - s..] {
                roles[i] = Role::Server;
            }
            let search = Search::new(model, 0);
            let part = search.partition(&roles).ok_or_else(|| {
                OptimizerError::Infeasible(format!(
                    "{w} workers and {s} servers cannot hold the blocks"
                ))
            })?;
            // Alike containers: the proportional split is the most even one, which is
            // exact (every worker sees the same costs), so no refinement is needed.
            let bar = part.t * (1.0 + REL_EPS);
            finish(model, &search, &roles, part, bar, h.splits.len(), true)
        }
        None => solve_heterogeneous(model),
    }
}

/// The best whole-block partitioning for fixed roles (`roles` aligned with
/// [`CostModel::ids`]); a server may be left without blocks (it is then idle). Exact up
/// to [`SearchOptions::exhaustive_up_to`] containers within
/// [`SearchOptions::node_budget`] (default options). Fails when there is no worker or
/// no server, or more workers than input blocks.
pub fn solve_for_roles(model: &CostModel, roles: &[Role]) -> Result<Solution, OptimizerError> {
    solve_for_roles_within(model, roles, f64::INFINITY)?
        .ok_or_else(|| OptimizerError::Infeasible("no partition for the roles was found".into()))
}

/// [`solve_for_roles`] for a caller that wants only partitions whose epoch time is at
/// most `cap`: the model-split branch and bound prunes against `cap` from its start,
/// so roles that cannot reach it are ruled out in few nodes. `Ok(None)` when no
/// partition within `cap` was found (none exists when the search was exact).
pub fn solve_for_roles_within(
    model: &CostModel,
    roles: &[Role],
    cap: f64,
) -> Result<Option<Solution>, OptimizerError> {
    if roles.len() != model.len() {
        return Err(OptimizerError::invalid(
            "roles",
            format!("{} roles for {} containers", roles.len(), model.len()),
        ));
    }
    let options = SearchOptions::default();
    let search = Search::new(model, options.node_budget);
    let part = search.partition(roles).ok_or_else(|| {
        OptimizerError::Infeasible(format!(
            "roles need at least one worker, one server, and at most {} workers",
            model.job().input_blocks
        ))
    })?;
    let exhaustive = model.len() <= options.exhaustive_up_to;
    let part = search.refine(roles, part, options.budget_for(model.len()), cap);
    if part.t > cap {
        return Ok(None);
    }
    let exact = exhaustive && search.nodes.get() > 0;
    let bar = (part.t * (1.0 + REL_EPS)).min(cap);
    finish(model, &search, roles, part, bar, 1, exact).map(Some)
}

/// Settings of the heterogeneous search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchOptions {
    /// Up to this many containers the solver is exact: all `3^N` role assignments are
    /// considered (by branch and bound) and every model split is exact. Above it, the
    /// roles come from a local search.
    pub exhaustive_up_to: usize,
    /// Above `exhaustive_up_to` containers, the most nodes the model-split branch and
    /// bound visits for the chosen roles before it keeps the best split found.
    pub split_node_budget: usize,
    /// The most model-split nodes one solve visits in all. It bounds a decision's time
    /// (a node prices a partial split for every worker: about a microsecond for a few
    /// workers on this project's machines); past it the solve keeps the best
    /// configuration found so far. The exact search looks at the most promising role
    /// assignments first and starts from a good heuristic one, so what it gives up is
    /// the proof more often than the answer; [`Solution::exact`] says which.
    #[serde(default = "default_node_budget")]
    pub node_budget: usize,
}

fn default_node_budget() -> usize {
    SearchOptions::default().node_budget
}

impl SearchOptions {
    /// The model-split node budget for `n` containers: unlimited while exact.
    fn budget_for(&self, n: usize) -> usize {
        if n <= self.exhaustive_up_to {
            usize::MAX
        } else {
            self.split_node_budget
        }
    }
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            exhaustive_up_to: 10,
            split_node_budget: 5_000,
            node_budget: NODE_BUDGET,
        }
    }
}

/// The heterogeneous solver with default [`SearchOptions`] (see the module docs).
/// Deterministic.
pub fn solve_heterogeneous(model: &CostModel) -> Result<Solution, OptimizerError> {
    solve_heterogeneous_with(model, SearchOptions::default())
}

/// The heterogeneous solver with explicit options.
pub fn solve_heterogeneous_with(
    model: &CostModel,
    options: SearchOptions,
) -> Result<Solution, OptimizerError> {
    let n = model.len();
    if n < 2 {
        return Err(OptimizerError::Infeasible(format!(
            "{n} usable container(s): need at least one worker and one server"
        )));
    }
    let mut search = Search::new(model, options.node_budget);
    let current: Vec<Role> = model.current_placements().iter().map(|p| p.role).collect();
    if n <= options.exhaustive_up_to {
        return exhaustive(model, &search, &current);
    }
    let mut starts = greedy_starts(model, &mut search);
    // Local search from the current roles and the distinct starting points (the two
    // best of them above 24 containers).
    starts.sort_by(|a, b| {
        let (va, vb) = (search.value(a), search.value(b));
        va.unwrap_or(f64::INFINITY)
            .total_cmp(&vb.unwrap_or(f64::INFINITY))
    });
    starts.dedup();
    if n > 24 {
        starts.truncate(2);
    }
    if search.value(&current).is_some() {
        starts.insert(0, current.clone());
    }
    // Ties: for an asynchronous job the higher throughput, then the nearer.
    let asynchronous = model.job().asynchronous;
    let tie_key = |search: &Search, roles: &[Role]| {
        let speed = if asynchronous {
            search
                .partition(roles)
                .map_or(f64::INFINITY, |p| throughput(model, roles, &p))
        } else {
            0.0
        };
        (speed, distance(roles, &current))
    };
    let mut best: Option<(f64, (f64, usize), Vec<Role>)> = None;
    let mut seen_starts: Vec<Vec<Role>> = Vec::new();
    for start in starts {
        if seen_starts.contains(&start) {
            continue;
        }
        seen_starts.push(start.clone());
        let (t, roles) = search.local_search(start, false);
        let key = tie_key(&search, &roles);
        let replace = match &best {
            None => true,
            Some((bt, bk, _)) => better(t, *bt) || (!better(*bt, t) && prefer(key, *bk)),
        };
        if replace {
            best = Some((t, key, roles));
        }
    }
    let (_, _, roles) = best.ok_or_else(|| {
        OptimizerError::Infeasible("no role assignment has a worker and a server".into())
    })?;
    // Two-container moves only from the best single-move optimum: they are the
    // expensive part (O(N²) neighbours).
    let (_, roles) = search.local_search(roles, true);
    let part = search
        .partition(&roles)
        .ok_or_else(|| OptimizerError::Infeasible("best roles lost feasibility".into()))?;
    let part = search.refine(&roles, part, options.budget_for(n), f64::INFINITY);
    let evaluations = search.cache.len();
    let bar = part.t * (1.0 + REL_EPS);
    finish(model, &search, &roles, part, bar, evaluations, false)
}

/// The containers in four orders, the best worker first: by the cost of
/// a record as a worker (its compute and its link's time for the record's
/// share of a mini-batch with an equal peer), by compute alone, by serving
/// cost (the worst server first: the best servers serve), and by compute
/// over serving cost. "The first `w` work, the rest serve" of each is a
/// split that gives every container what it is best at by that measure.
pub(crate) fn role_orders(model: &CostModel) -> Vec<Vec<usize>> {
    let n = model.len();
    let serve_cost = serve_costs(model);
    let job = model.job();
    let per_record_comm = job.link_bytes() / job.mini_batch_size as f64;
    let work_cost: Vec<f64> = (0..n)
        .map(|i| model.compute_secs_per_record(i) + per_record_comm / model.bandwidth(i))
        .collect();
    let keys: [Box<dyn Fn(usize) -> f64>; 4] = [
        Box::new(|i| work_cost[i]),
        Box::new(|i| model.compute_secs_per_record(i)),
        Box::new(|i| -serve_cost[i]),
        Box::new(|i| model.compute_secs_per_record(i) / serve_cost[i]),
    ];
    keys.iter()
        .map(|key| {
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
            order
        })
        .collect()
}

/// Each container's seconds per byte served: its link's or its CPU's,
/// whichever is slower.
fn serve_costs(model: &CostModel) -> Vec<f64> {
    (0..model.len())
        .map(|i| (1.0 / model.bandwidth(i)).max(model.server_secs_per_byte(i)))
        .collect()
}

/// Starting points for the local search: for each order of
/// [`role_orders`], the best of "the first w work, the rest serve" and,
/// for the three best w, of "only the best s of the rest (by serving
/// cost) serve, the others idle".
fn greedy_starts(model: &CostModel, search: &mut Search) -> Vec<Vec<Role>> {
    let n = model.len();
    let job = model.job();
    let serve_cost = serve_costs(model);
    let mut by_serving: Vec<usize> = (0..n).collect();
    by_serving.sort_by(|&a, &b| serve_cost[a].total_cmp(&serve_cost[b]).then(a.cmp(&b)));
    let mut starts: Vec<Vec<Role>> = Vec::new();
    for order in role_orders(model) {
        let mut best: Option<(f64, Vec<Role>)> = None;
        // The first w of the ordering work, the rest serve; then, for the three best w,
        // only the best s of the rest (by serving cost) serve and the others idle.
        let w_max = n.min(job.input_blocks as usize + 1);
        let mut by_w: Vec<(f64, usize)> = Vec::new();
        for w in 1..w_max {
            let mut roles = vec![Role::Server; n];
            for &i in &order[..w] {
                roles[i] = Role::Worker;
            }
            if let Some(t) = search.value(&roles) {
                by_w.push((t, w));
                if best.as_ref().is_none_or(|(bt, _)| better(t, *bt)) {
                    best = Some((t, roles));
                }
            }
        }
        by_w.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(_, w) in by_w.iter().take(3) {
            let mut roles = vec![Role::Idle; n];
            for &i in &order[..w] {
                roles[i] = Role::Worker;
            }
            let rest: Vec<usize> = by_serving
                .iter()
                .copied()
                .filter(|&i| roles[i] != Role::Worker)
                .collect();
            for &j in rest.iter().take(job.model_blocks as usize) {
                roles[j] = Role::Server;
                if let Some(t) = search.value(&roles)
                    && best.as_ref().is_none_or(|(bt, _)| better(t, *bt))
                {
                    best = Some((t, roles.clone()));
                }
            }
        }
        if let Some((_, r)) = best {
            starts.push(r);
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::search::align_counts;
    use super::*;
    use crate::cost::Placement;
    use crate::snapshot::Job;
    use crate::snapshot::test_job as job;
    use crate::snapshot::{ContainerMetrics, Snapshot};

    fn uniform_snapshot(n: usize, job: Job, u: &Uniform) -> Snapshot {
        let containers = (0..n)
            .map(|i| ContainerMetrics {
                id: format!("c{i:02}"),
                role: Role::Idle,
                compute_secs_per_record: Some(u.compute_secs_per_record),
                cpu_speed: None,
                bandwidth_bytes_per_sec: u.bandwidth_bytes_per_sec,
                server_secs_per_byte: Some(u.server_secs_per_byte),
                request_secs_per_server: Some(u.request_secs_per_server),
                server_secs_per_mini_batch: Some(u.server_secs_per_mini_batch),
                input_blocks: 0,
                model_blocks: 0,
                mini_batches: 0,
                reclaimed: false,
            })
            .collect();
        Snapshot {
            policy: None,
            job,
            containers,
            links: vec![],
        }
    }

    // N = 4, D = 1200, B = 100, K = 12, L = 6, M = 1000 B, b = 1000 B/s, c = 1 ms, p = 0:
    // W=1: 1200 rec, 12 batches, server-bound 1·(2/6)·1 = 0.33 < worker-bound 1 → 1.2 + 12 = 13.2
    // W=2: 600 rec, 6 batches, server-bound 2·(3/6)·1 = 1 → 0.6 + 6 = 6.6
    // W=3: 400 rec, 4 batches, server-bound 3·1·1 = 3 → 0.4 + 12 = 12.4
    #[test]
    fn homogeneous_hand_computed() {
        let u = Uniform {
            compute_secs_per_record: 0.001,
            bandwidth_bytes_per_sec: 1000.0,
            server_secs_per_byte: 0.0,
            request_secs_per_server: 0.0,
            server_secs_per_mini_batch: 0.0,
        };
        let h = solve_homogeneous(&job(1200, 100, 1000.0, 12, 6), 4, &u).unwrap();
        let t: Vec<f64> = h.splits.iter().map(|s| s.epoch_secs).collect();
        for (a, b) in t.iter().zip([13.2, 6.6, 12.4]) {
            assert!((a - b).abs() < 1e-9, "{t:?}");
        }
        assert_eq!((h.best.workers, h.best.servers), (2, 2));
        // A worker's 1 s per mini-batch per server adds batches · S: W=1 with 3
        // servers 12·3 = 36 → 49.2, with 1 (its server-bound 1·1·1 = 1 is its
        // worker-bound) 12·1 → 25.2; W=2 with 2 servers 0.6 + 6·2 + 6 = 18.6, with 1
        // (server-bound 2) 0.6 + 6 + 12 = 18.6, a tie (the fewer servers are kept);
        // W=3 4·1 = 4 → 16.4: fewer servers win.
        let u = Uniform {
            request_secs_per_server: 1.0,
            server_secs_per_mini_batch: 0.0,
            ..u
        };
        let h = solve_homogeneous(&job(1200, 100, 1000.0, 12, 6), 4, &u).unwrap();
        let t: Vec<f64> = h.splits.iter().map(|s| s.epoch_secs).collect();
        for (a, b) in t.iter().zip([25.2, 18.6, 16.4]) {
            assert!((a - b).abs() < 1e-9, "{t:?}");
        }
        assert_eq!(h.splits[0].servers, 1);
        assert_eq!((h.best.workers, h.best.servers), (3, 1));
    }

    #[test]
    fn homogeneous_matches_cost_model_for_every_split() {
        let u = Uniform {
            compute_secs_per_record: 2e-4,
            bandwidth_bytes_per_sec: 1.0e6,
            server_secs_per_byte: 3e-8,
            request_secs_per_server: 3e-3,
            server_secs_per_mini_batch: 0.0,
        };
        let j = job(10_007, 64, 2.0e5, 37, 11);
        let n = 9;
        let h = solve_homogeneous(&j, n, &u).unwrap();
        let model = CostModel::new(&uniform_snapshot(n, j.clone(), &u)).unwrap();
        for s in &h.splits {
            let mut roles = vec![Role::Server; n];
            for r in roles.iter_mut().take(s.workers) {
                *r = Role::Worker;
            }
            let sol = solve_for_roles(&model, &roles).unwrap();
            assert!(
                (sol.epoch_secs - s.epoch_secs).abs() <= 1e-9 * s.epoch_secs,
                "W={} closed form {} vs partition {}",
                s.workers,
                s.epoch_secs,
                sol.epoch_secs
            );
        }
        // And the heterogeneous search agrees with the closed form on uniform input.
        let het = solve_heterogeneous(&model).unwrap();
        assert!((het.epoch_secs - h.best.epoch_secs).abs() <= 1e-9 * h.best.epoch_secs);
        let sol = solve(&model).unwrap();
        assert!((sol.epoch_secs - h.best.epoch_secs).abs() <= 1e-9 * h.best.epoch_secs);
    }

    #[test]
    fn too_few_containers_is_infeasible() {
        let u = Uniform {
            compute_secs_per_record: 1.0,
            bandwidth_bytes_per_sec: 1.0,
            server_secs_per_byte: 0.0,
            request_secs_per_server: 0.0,
            server_secs_per_mini_batch: 0.0,
        };
        assert!(matches!(
            solve_homogeneous(&job(10, 1, 1.0, 1, 1), 1, &u),
            Err(OptimizerError::Infeasible(_))
        ));
    }

    // A fast-compute/slow-network container should work, a slow-compute/fast-network
    // one should serve.
    #[test]
    fn heterogeneous_assigns_roles_by_suitability() {
        let mk = |id: &str, c: f64, b: f64| ContainerMetrics {
            compute_secs_per_record: Some(c),
            server_secs_per_byte: Some(0.0),
            ..ContainerMetrics::offered(id.into(), None, b)
        };
        let snap = Snapshot {
            policy: None,
            job: job(10_000, 100, 1.0e6, 40, 8),
            containers: vec![
                mk("cpu1", 1e-4, 1e7),
                mk("cpu2", 1e-4, 1e7),
                mk("net", 1e-2, 1e9),
            ],
            links: vec![],
        };
        let model = CostModel::new(&snap).unwrap();
        let sol = solve(&model).unwrap();
        assert_eq!(sol.target["net"].role, Role::Server);
        assert_eq!(sol.target["cpu1"].role, Role::Worker);
        assert_eq!(sol.target["cpu2"].role, Role::Worker);
        assert_eq!(sol.target["net"].model_blocks, 8);
        assert_eq!(sol.target["cpu1"].input_blocks, 20);
    }

    // A slow-link worker `a` (1 000 B at 100 B/s: 10 s a mini-batch) sets
    // the bound whichever server serves: D = 200, B = 100, K = 2, L = 1,
    // M = M' = 1 000 B, one block (one mini-batch) per worker. `f`
    // computes 100 records at 45 ms = 4.5 s and waits for two workers'
    // requests at its server: 2 · 1 s on `s1` (1 ms a byte), 2 · 2.5 s on
    // `s2`: 6.5 s or 9.5 s, both under `a`'s 10 s, so both configurations
    // are worth 10 s (alone with both blocks, `f` takes 9 + 2 = 11 s, the
    // others as workers 100 s and as servers 1 000 s). The job runs on
    // `s2`; on `s1`, `f` goes 1.5× as fast.
    fn tied_on_a_slow_worker(asynchronous: bool) -> Snapshot {
        let mk = |id: &str, role, c: f64, b: f64, p: f64, k, l| ContainerMetrics {
            role,
            compute_secs_per_record: Some(c),
            server_secs_per_byte: Some(p),
            request_secs_per_server: Some(0.0),
            server_secs_per_mini_batch: Some(0.0),
            input_blocks: k,
            model_blocks: l,
            mini_batches: 10,
            ..ContainerMetrics::offered(id.into(), None, b)
        };
        Snapshot {
            policy: None,
            job: Job {
                asynchronous,
                ..job(200, 100, 1000.0, 2, 1)
            },
            containers: vec![
                mk("a", Role::Worker, 1e-9, 100.0, 1.0, 1, 0),
                mk("f", Role::Worker, 0.045, 1e6, 1.0, 1, 0),
                mk("s1", Role::Idle, 1.0, 1e6, 1e-3, 0, 0),
                mk("s2", Role::Server, 1.0, 1e6, 2.5e-3, 0, 1),
            ],
            links: vec![],
        }
    }

    #[test]
    fn ties_go_to_the_higher_throughput_when_asynchronous() {
        let server = |sol: &Solution| {
            let s: Vec<&str> = ["s1", "s2"]
                .into_iter()
                .filter(|id| sol.target[*id].role == Role::Server)
                .collect();
            s.join(",")
        };
        for asynchronous in [false, true] {
            let model = CostModel::new(&tied_on_a_slow_worker(asynchronous)).unwrap();
            let sol = solve(&model).unwrap();
            assert!(sol.exact);
            assert!((sol.epoch_secs - 10.0).abs() < 1e-6, "{}", sol.epoch_secs);
            assert_eq!(sol.target["a"].role, Role::Worker);
            assert_eq!(sol.target["f"].role, Role::Worker);
            // Synchronous workers wait for `a` either way: the job stays.
            // Asynchronous ones do not: `f`'s own pace decides.
            assert_eq!(server(&sol), if asynchronous { "s1" } else { "s2" });
            // The local search (above `exhaustive_up_to`) breaks ties alike.
            let local = solve_heterogeneous_with(
                &model,
                SearchOptions {
                    exhaustive_up_to: 0,
                    ..SearchOptions::default()
                },
            )
            .unwrap();
            assert!(!local.exact);
            assert!(
                (local.epoch_secs - 10.0).abs() < 1e-6,
                "{}",
                local.epoch_secs
            );
            assert_eq!(server(&local), server(&sol));
            let on = |srv: &str| {
                let mut t = sol.target.clone();
                for id in ["s1", "s2"] {
                    t.get_mut(id).unwrap().role = Role::Idle;
                    t.get_mut(id).unwrap().model_blocks = 0;
                }
                *t.get_mut(srv).unwrap() = Placement {
                    role: Role::Server,
                    input_blocks: 0,
                    model_blocks: 1,
                };
                model.evaluate(&t).unwrap()
            };
            let (fast, slow) = (on("s1"), on("s2"));
            assert!((fast.epoch_secs - slow.epoch_secs).abs() < 1e-9);
            assert!(fast.throughput_epoch_secs < slow.throughput_epoch_secs);
        }
    }

    // Every role assignment of five unlike containers: under a cap at the
    // exact best's epoch time the capped solve finds it, just below it finds
    // nothing, and without a cap it is `solve_for_roles`.
    #[test]
    fn a_capped_solve_finds_the_best_within_the_cap_and_nothing_below_it() {
        let mk = |i: usize, c: f64, b: f64, p: f64| ContainerMetrics {
            compute_secs_per_record: Some(c),
            server_secs_per_byte: Some(p),
            request_secs_per_server: Some(1e-4 * (i + 1) as f64),
            ..ContainerMetrics::offered(format!("c{i}"), None, b)
        };
        let snap = Snapshot {
            policy: None,
            job: job(20_000, 100, 4.0e4, 16, 12),
            containers: vec![
                mk(0, 2e-5, 8e7, 1e-8),
                mk(1, 5e-5, 2e7, 2e-8),
                mk(2, 3e-5, 1.2e8, 5e-9),
                mk(3, 1e-4, 3e6, 4e-8),
                mk(4, 4e-5, 5e7, 1e-8),
            ],
            links: vec![],
        };
        let model = CostModel::new(&snap).unwrap();
        let mut solved = 0;
        for code in 0..3usize.pow(5) {
            let roles: Vec<Role> = (0..5)
                .map(|i| [Role::Worker, Role::Server, Role::Idle][code / 3usize.pow(i) % 3])
                .collect();
            let Ok(best) = solve_for_roles(&model, &roles) else {
                assert_eq!(
                    solve_for_roles_within(&model, &roles, 1e9).ok().flatten(),
                    None
                );
                continue;
            };
            assert!(best.exact, "{roles:?}");
            let t = best.epoch_secs;
            let at = solve_for_roles_within(&model, &roles, t).unwrap().unwrap();
            assert!((at.epoch_secs - t).abs() <= 1e-12 * t, "{roles:?}");
            let free = solve_for_roles_within(&model, &roles, f64::INFINITY).unwrap();
            assert_eq!(free, Some(best), "{roles:?}");
            let below = solve_for_roles_within(&model, &roles, t * (1.0 - 1e-6)).unwrap();
            assert_eq!(below, None, "{roles:?}");
            solved += 1;
        }
        assert!(solved > 100, "{solved} role assignments solved");
    }

    #[test]
    fn align_counts_stays_close() {
        assert_eq!(
            align_counts(&[3, 3, 2], &[1, 1, 1], &[3, 3, 3], 8),
            Some(vec![3, 3, 2])
        );
        assert_eq!(
            align_counts(&[5, 0, 0], &[1, 1, 1], &[3, 3, 3], 8),
            Some(vec![3, 3, 2])
        );
        assert_eq!(align_counts(&[1, 1], &[1, 1], &[2, 2], 5), None);
    }
}
