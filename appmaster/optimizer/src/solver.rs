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
//!   found. Above, a search: prefix splits of three orderings (by compute cost, by
//!   serving cost, by their ratio) and the current roles are the starting points, then
//!   best-improvement local search over single role changes (worker/server/idle) and
//!   worker↔server swaps, then, from the best, also over changes of two containers at
//!   once; memoised. Ties (within a relative 1e-10) prefer the configuration closest to
//!   the current one, and block counts are aligned with the current ones where that
//!   costs nothing, so a job at its optimum gets back its own configuration.

mod split;

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use serde::{Deserialize, Serialize};

use crate::cost::{CostModel, Placement, Target};
use crate::error::OptimizerError;
use crate::snapshot::{Job, Role};

/// Relative tolerance when comparing epoch times: far above float noise (~1e-15), and
/// under the 1e-9 within which the exact solver must match brute force, so the tie
/// rules can never cost more than that.
const REL_EPS: f64 = 1e-10;

/// Default [`SearchOptions::node_budget`].
const NODE_BUDGET: usize = 500_000;

fn better(a: f64, b: f64) -> bool {
    a < b * (1.0 - REL_EPS)
}

/// Costs shared by all containers of a homogeneous cluster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Uniform {
    /// Compute seconds per record.
    pub compute_secs_per_record: f64,
    /// Bandwidth of every container and link, bytes/s.
    pub bandwidth_bytes_per_sec: f64,
    /// Server processing seconds per byte.
    pub server_secs_per_byte: f64,
    /// A worker's seconds per mini-batch per server it talks to.
    #[serde(default)]
    pub request_secs_per_server: f64,
    /// A server's seconds per mini-batch of each worker beyond its work per
    /// byte ([`crate::snapshot::ContainerMetrics::server_secs_per_mini_batch`]).
    #[serde(default)]
    pub server_secs_per_mini_batch: f64,
}

/// One split of a homogeneous cluster and its predicted epoch time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// Workers `W`.
    pub workers: usize,
    /// Servers `S`: `N − W`, or fewer when workers spend time per server (the rest
    /// idle).
    pub servers: usize,
    /// Predicted epoch time (slowest worker), seconds.
    pub epoch_secs: f64,
    /// Its computation part.
    pub comp_secs: f64,
    /// Its communication part.
    pub comm_secs: f64,
}

/// Result of the homogeneous solver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HomogeneousSolution {
    /// The fastest split (the fewest workers among equals).
    pub best: Split,
    /// Every split `W = 1 … N−1`, in order.
    pub splits: Vec<Split>,
}

/// Prices every split of `containers` identical containers into `W` workers and the
/// rest (Eq. 5 with push traffic, server time and whole blocks) and returns the best.
/// O(N) when workers spend nothing per server (then every other container serves);
/// otherwise each `W` also takes its best number of servers `S ≤ N − W` (the rest
/// idle), from the `O(√L)` counts at which the busiest server's share `⌈L / S⌉` drops:
/// more servers cost the workers more requests, so for each share the fewest win.
///
/// With `W` workers only `min(W, K)` can hold input blocks, and the slowest holds
/// `⌈K / w⌉`; the busiest of `min(S, L)` servers holds `⌈L / s⌉` model blocks.
pub fn solve_homogeneous(
    job: &Job,
    containers: usize,
    u: &Uniform,
) -> Result<HomogeneousSolution, OptimizerError> {
    if containers < 2 {
        return Err(OptimizerError::Infeasible(format!(
            "{containers} container(s): need at least one worker and one server"
        )));
    }
    if job.input_blocks == 0 || job.model_blocks == 0 || job.mini_batch_size == 0 {
        return Err(OptimizerError::invalid(
            "job",
            "input_blocks, model_blocks and mini_batch_size must be > 0",
        ));
    }
    let (k_total, l_total) = (job.input_blocks as usize, job.model_blocks as usize);
    let per_byte = 1.0 / u.bandwidth_bytes_per_sec;
    let m_bytes = job.bytes_per_mini_batch;
    let link_bytes = job.link_bytes();
    let mut splits = Vec::with_capacity(containers - 1);
    for workers in 1..containers {
        let w = workers.min(k_total);
        let k = k_total.div_ceil(w) as u32;
        let records = job.total_records as f64 * f64::from(k) / k_total as f64;
        let nb = crate::cost::batches(job, k) as f64;
        let price = |servers: usize| {
            let s = servers.min(l_total);
            let l = l_total.div_ceil(s) as f64;
            let share = l / l_total as f64;
            let server_bound = w as f64
                * (share * link_bytes * per_byte)
                    .max(share * m_bytes * u.server_secs_per_byte + u.server_secs_per_mini_batch);
            let worker_bound = link_bytes * per_byte;
            let comp =
                u.compute_secs_per_record * records + nb * s as f64 * u.request_secs_per_server;
            let comm = nb * (server_bound.max(worker_bound) + job.latency_secs_per_mini_batch);
            Split {
                workers,
                servers,
                epoch_secs: crate::cost::epoch_of(job, comp, comm),
                comp_secs: comp,
                comm_secs: comm,
            }
        };
        let all = containers - workers;
        let mut best = price(all);
        if u.request_secs_per_server > 0.0 {
            // The fewest servers for each share ⌈L / S⌉: S = ⌈L / v⌉.
            let top = all.min(l_total);
            let mut servers = 1;
            while servers <= top {
                let cand = price(servers);
                if better(cand.epoch_secs, best.epoch_secs)
                    || (!better(best.epoch_secs, cand.epoch_secs) && cand.servers < best.servers)
                {
                    best = cand;
                }
                let v = l_total.div_ceil(servers);
                if v <= 1 {
                    break;
                }
                servers = l_total.div_ceil(v - 1);
            }
        }
        splits.push(best);
    }
    let mut best = splits[0];
    for s in &splits[1..] {
        if better(s.epoch_secs, best.epoch_secs) {
            best = *s;
        }
    }
    Ok(HomogeneousSolution { best, splits })
}

impl CostModel {
    /// The shared costs if all containers are alike within relative `tolerance` and no
    /// pairwise links are measured (their means), else `None`.
    pub fn uniform(&self, tolerance: f64) -> Option<Uniform> {
        if self.has_links() || self.is_empty() {
            return None;
        }
        let n = self.len();
        let mean = |f: &dyn Fn(usize) -> f64| (0..n).map(f).sum::<f64>() / n as f64;
        let c = mean(&|i| self.compute_secs_per_record(i));
        let b = mean(&|i| self.bandwidth(i));
        let p = mean(&|i| self.server_secs_per_byte(i));
        let q = mean(&|i| self.request_secs_per_server(i));
        let r = mean(&|i| self.server_secs_per_mini_batch(i));
        let close = |v: f64, m: f64| (v - m).abs() <= tolerance * m.abs().max(f64::MIN_POSITIVE);
        let alike = (0..n).all(|i| {
            close(self.compute_secs_per_record(i), c)
                && close(self.bandwidth(i), b)
                && (close(self.server_secs_per_byte(i), p) || p == 0.0)
                && (close(self.request_secs_per_server(i), q) || q == 0.0)
                && (close(self.server_secs_per_mini_batch(i), r) || r == 0.0)
        });
        alike.then_some(Uniform {
            compute_secs_per_record: c,
            bandwidth_bytes_per_sec: b,
            server_secs_per_byte: p,
            request_secs_per_server: q,
            server_secs_per_mini_batch: r,
        })
    }
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
    let part = search.refine(roles, part, options.budget_for(model.len()));
    let exact = exhaustive && search.nodes.get() > 0;
    let bar = part.t * (1.0 + REL_EPS);
    finish(model, &search, roles, part, bar, 1, exact)
}

/// The best input partition for fixed roles and a fixed model split
/// (`model_blocks[i]` on container `i`, aligned with [`CostModel::ids`]): each next
/// input block to the worker whose epoch time grows least. What a running
/// configuration is worth when only its input may be dealt again. Fails when there is
/// no worker or no server holding blocks, or more workers than input blocks.
pub fn solve_input_for(
    model: &CostModel,
    roles: &[Role],
    model_blocks: &[u32],
) -> Result<Solution, OptimizerError> {
    if roles.len() != model.len() || model_blocks.len() != model.len() {
        return Err(OptimizerError::invalid(
            "roles",
            format!(
                "{} roles and {} model counts for {} containers",
                roles.len(),
                model_blocks.len(),
                model.len()
            ),
        ));
    }
    let workers = Search::members(roles, Role::Worker);
    let servers: Vec<usize> = Search::members(roles, Role::Server)
        .into_iter()
        .filter(|&j| model_blocks[j] > 0)
        .collect();
    if workers.is_empty() || servers.is_empty() || workers.len() > model.job().input_blocks as usize
    {
        return Err(OptimizerError::Infeasible(format!(
            "roles need at least one worker, one server holding blocks, and at most {} workers",
            model.job().input_blocks
        )));
    }
    let search = Search::new(model, 0);
    let l = (0..model.len())
        .map(|j| {
            if servers.contains(&j) {
                model_blocks[j]
            } else {
                0
            }
        })
        .collect();
    let part = search.data(&workers, &servers, l);
    let bar = part.t * (1.0 + REL_EPS);
    finish(model, &search, roles, part, bar, 1, true)
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
    let serve_cost: Vec<f64> = (0..n)
        .map(|i| (1.0 / model.bandwidth(i)).max(model.server_secs_per_byte(i)))
        .collect();
    // Seconds per record a container would need as a worker talking to an equal peer.
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
    let mut by_serving: Vec<usize> = (0..n).collect();
    by_serving.sort_by(|&a, &b| serve_cost[a].total_cmp(&serve_cost[b]).then(a.cmp(&b)));
    let mut starts: Vec<Vec<Role>> = Vec::new();
    for key in &keys {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
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
    let mut best: Option<(f64, Vec<Role>)> = None;
    let mut seen_starts: Vec<Vec<Role>> = Vec::new();
    for start in starts {
        if seen_starts.contains(&start) {
            continue;
        }
        seen_starts.push(start.clone());
        let (t, roles) = search.local_search(start, false);
        let replace = match &best {
            None => true,
            Some((bt, br)) => {
                better(t, *bt)
                    || (!better(*bt, t) && distance(&roles, &current) < distance(br, &current))
            }
        };
        if replace {
            best = Some((t, roles));
        }
    }
    let (_, roles) = best.ok_or_else(|| {
        OptimizerError::Infeasible("no role assignment has a worker and a server".into())
    })?;
    // Two-container moves only from the best single-move optimum: they are the
    // expensive part (O(N²) neighbours).
    let (_, roles) = search.local_search(roles, true);
    let part = search
        .partition(&roles)
        .ok_or_else(|| OptimizerError::Infeasible("best roles lost feasibility".into()))?;
    let part = search.refine(&roles, part, options.budget_for(n));
    let evaluations = search.cache.len();
    let bar = part.t * (1.0 + REL_EPS);
    finish(model, &search, &roles, part, bar, evaluations, false)
}

/// The exact optimum over all `3^N` role assignments, by branch and bound.
///
/// A server without model blocks is the same as an idle container, so each assignment
/// is solved with at least one block per server (and per worker): the assignments then
/// stand for distinct configurations. Each gets a lower bound ([`split::RoleBounds`]); in
/// order of it, each is solved exactly against the best time so far, until the next
/// bound is above it. Then the assignments closer to `current` than the winner are
/// checked, nearest first, for one within [`REL_EPS`] of the optimum.
fn exhaustive(
    model: &CostModel,
    search: &Search<'_>,
    current: &[Role],
) -> Result<Solution, OptimizerError> {
    let n = model.len();
    // Assignment `code`: container `i`'s role is base-3 digit `i` (worker, server, idle).
    let roles_of = |mut code: u64| -> Vec<Role> {
        (0..n)
            .map(|_| {
                let r = [Role::Worker, Role::Server, Role::Idle][(code % 3) as usize];
                code /= 3;
                r
            })
            .collect()
    };
    let total = u32::try_from(n)
        .ok()
        .and_then(|n| 3u64.checked_pow(n))
        .filter(|&t| usize::try_from(t).is_ok())
        .ok_or_else(|| {
            OptimizerError::invalid(
                "exhaustive_up_to",
                format!("3^{n} role assignments cannot be enumerated"),
            )
        })?;
    let mut bounds = split::RoleBounds::new(model);
    let mut bounded: Vec<(f64, u64)> = Vec::new();
    let (mut workers, mut servers) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for code in 0..total {
        workers.clear();
        servers.clear();
        let mut c = code;
        for i in 0..n {
            match c % 3 {
                0 => workers.push(i),
                1 => servers.push(i),
                _ => {}
            }
            c /= 3;
        }
        if let Some(lb) = bounds.bound(&workers, &servers) {
            bounded.push((lb, code));
        }
    }
    // Stable: equal bounds keep enumeration order.
    bounded.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best: Option<(Part, Vec<Role>)> = None;
    let mut bar = f64::INFINITY;
    // A good incumbent first, from the fast heuristic partition (it prunes the exact
    // searches below): assignments in order of their bound, while the bound is below it.
    for &(lb, code) in &bounded {
        if lb > bar {
            break;
        }
        let roles = roles_of(code);
        if let Some(part) = search.partition(&roles)
            && part.t <= bar
            && (0..n).all(|j| roles[j] != Role::Server || part.l[j] > 0)
        {
            bar = part.t * (1.0 - split::SEARCH_EPS);
            best = Some((part, roles));
        }
    }
    for &(lb, code) in &bounded {
        if lb > bar || search.nodes.get() == 0 {
            break;
        }
        let roles = roles_of(code);
        if let Some(part) = search.exact(&roles, 1, bar) {
            bar = part.t * (1.0 - split::SEARCH_EPS);
            best = Some((part, roles));
        }
    }
    let exact = search.nodes.get() > 0;
    let (part, roles) = best.ok_or_else(|| {
        OptimizerError::Infeasible("no role assignment has a worker and a server".into())
    })?;
    let optimum = part.t;
    let window = optimum * (1.0 + REL_EPS);
    let far = distance(&roles, current);
    let mut closer: Vec<(usize, Vec<Role>)> = bounded
        .iter()
        .filter(|&&(lb, _)| lb <= window)
        .map(|&(_, code)| roles_of(code))
        .map(|r| (distance(&r, current), r))
        .filter(|(d, _)| *d < far)
        .collect();
    closer.sort_by_key(|(d, _)| *d);
    let (part, roles) = closer
        .into_iter()
        .find_map(|(_, r)| search.exact(&r, 1, window).map(|p| (p, r)))
        .unwrap_or((part, roles));
    finish(model, search, &roles, part, window, total as usize, exact)
}

fn distance(a: &[Role], b: &[Role]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// Turns a partition into a [`Solution`], aligning counts with the current ones where
/// that keeps the epoch time within `bar`.
fn finish(
    model: &CostModel,
    search: &Search<'_>,
    roles: &[Role],
    part: Part,
    bar: f64,
    evaluations: usize,
    exact: bool,
) -> Result<Solution, OptimizerError> {
    let part = search.align(roles, part, bar);
    let mut target = Target::new();
    for (i, id) in model.ids().iter().enumerate() {
        let p = match roles[i] {
            Role::Worker if part.k[i] > 0 => Placement {
                role: Role::Worker,
                input_blocks: part.k[i],
                model_blocks: 0,
            },
            Role::Server if part.l[i] > 0 => Placement {
                role: Role::Server,
                input_blocks: 0,
                model_blocks: part.l[i],
            },
            _ => Placement::IDLE,
        };
        target.insert(id.clone(), p);
    }
    let epoch_secs = model.evaluate(&target)?.epoch_secs;
    Ok(Solution {
        target,
        epoch_secs,
        evaluations,
        exact,
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Key(f64, usize);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

/// A partition for fixed roles: blocks per container (model order) and its epoch time.
#[derive(Debug, Clone)]
struct Part {
    t: f64,
    k: Vec<u32>,
    l: Vec<u32>,
}

struct Search<'a> {
    m: &'a CostModel,
    cache: HashMap<Vec<Role>, Option<f64>>,
    /// Model-split nodes left for this solve ([`SearchOptions::node_budget`]).
    nodes: std::cell::Cell<usize>,
}

impl<'a> Search<'a> {
    fn new(m: &'a CostModel, node_budget: usize) -> Self {
        Search {
            m,
            cache: HashMap::new(),
            nodes: std::cell::Cell::new(node_budget),
        }
    }

    /// The model-split branch and bound of `fixed` within the nodes left.
    fn best_split(
        &self,
        fixed: &split::Fixed,
        bar: f64,
        most: usize,
        hint: &[u32],
    ) -> Option<(f64, Vec<u32>)> {
        let left = self.nodes.get();
        let mut budget = left.min(most);
        let found = fixed.best_split(self.m, bar, &mut budget, hint);
        self.nodes.set(left - (left.min(most) - budget));
        found
    }

    /// Memoised epoch time of the fast partition for `roles`.
    fn value(&mut self, roles: &[Role]) -> Option<f64> {
        if let Some(v) = self.cache.get(roles) {
            return *v;
        }
        let v = self.partition(roles).map(|p| p.t);
        self.cache.insert(roles.to_vec(), v);
        v
    }

    fn members(roles: &[Role], r: Role) -> Vec<usize> {
        roles
            .iter()
            .enumerate()
            .filter(|(_, x)| **x == r)
            .map(|(i, _)| i)
            .collect()
    }

    /// Proportional model split, then the exact data greedy.
    fn partition(&self, roles: &[Role]) -> Option<Part> {
        let m = self.m;
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        let k_total = m.job().input_blocks;
        if workers.is_empty() || servers.is_empty() || workers.len() > k_total as usize {
            return None;
        }
        // Per-block serving cost of each server towards its worst worker.
        let weight: Vec<f64> = servers
            .iter()
            .map(|&j| {
                workers
                    .iter()
                    .map(|&i| m.block_costs(i, j).0)
                    .fold(0.0, f64::max)
            })
            .collect();
        let mut l = vec![0u32; m.len()];
        let mut heap: BinaryHeap<Reverse<Key>> = servers
            .iter()
            .enumerate()
            .map(|(x, _)| Reverse(Key(weight[x], x)))
            .collect();
        for _ in 0..m.job().model_blocks {
            let Some(Reverse(Key(_, x))) = heap.pop() else {
                break;
            };
            let j = servers[x];
            l[j] += 1;
            heap.push(Reverse(Key(f64::from(l[j] + 1) * weight[x], x)));
        }
        Some(self.data(&workers, &servers, l))
    }

    /// Exact min-max greedy of input blocks for the model split `l`.
    fn data(&self, workers: &[usize], servers: &[usize], l: Vec<u32>) -> Part {
        let m = self.m;
        let srv: Vec<(usize, u32)> = servers.iter().map(|&j| (j, l[j])).collect();
        let w = workers.len();
        let g: Vec<f64> = workers
            .iter()
            .map(|&i| m.comm_per_batch(i, w, &srv).0)
            .collect();
        let mut counts = Vec::with_capacity(w);
        let active = crate::cost::holding(&srv);
        let t = split::spread(m, workers, &g, active, &mut counts);
        let mut k = vec![0u32; m.len()];
        for (&i, &c) in workers.iter().zip(&counts) {
            k[i] = c;
        }
        Part { t, k, l }
    }

    /// The per-block costs of `roles` with at least `lmin` model blocks per server, or
    /// `None` when the roles cannot hold the blocks that way.
    fn fixed(&self, roles: &[Role], lmin: u32) -> Option<split::Fixed> {
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        split::Fixed::new(self.m, &workers, &servers, lmin)
    }

    /// The exact best partition for `roles` (at least `lmin` model blocks per server)
    /// if its epoch time is at most `bar`.
    fn exact(&self, roles: &[Role], lmin: u32, bar: f64) -> Option<Part> {
        let fixed = self.fixed(roles, lmin)?;
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        // The heuristic split as the hint, and as a first incumbent when it respects
        // `lmin`.
        let heuristic = self.partition(roles)?;
        let hint = heuristic.l.clone();
        let mut best =
            Some(heuristic).filter(|p| p.t <= bar && servers.iter().all(|&j| p.l[j] >= lmin));
        let bar = best
            .as_ref()
            .map_or(bar, |p| p.t * (1.0 - split::SEARCH_EPS));
        if let Some((_, l)) = self.best_split(&fixed, bar, usize::MAX, &hint) {
            best = Some(self.data(&workers, &servers, l));
        }
        best
    }

    /// Improves a partition for `roles` (servers may end up without blocks): single
    /// block moves between servers while they lower the epoch time, then the model-split
    /// branch and bound for at most `budget` nodes (exact when it finishes).
    fn refine(&self, roles: &[Role], part: Part, budget: usize) -> Part {
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        let part = self.moves(&workers, &servers, part);
        let Some(fixed) = split::Fixed::new(self.m, &workers, &servers, 0) else {
            return part;
        };
        let bar = part.t * (1.0 - split::SEARCH_EPS);
        match self.best_split(&fixed, bar, budget, &part.l) {
            Some((_, l)) => self.data(&workers, &servers, l),
            None => part,
        }
    }

    /// Single-block moves between servers while they lower the epoch time.
    fn moves(&self, workers: &[usize], servers: &[usize], mut part: Part) -> Part {
        let limit = 4 * self.m.job().model_blocks as usize + 16;
        for _ in 0..limit {
            let mut best: Option<Part> = None;
            for &from in servers {
                if part.l[from] == 0 {
                    continue;
                }
                for &to in servers {
                    if to == from {
                        continue;
                    }
                    let mut l = part.l.clone();
                    l[from] -= 1;
                    l[to] += 1;
                    let cand = self.data(workers, servers, l);
                    let bar = best.as_ref().map_or(part.t, |b| b.t);
                    if better(cand.t, bar) {
                        best = Some(cand);
                    }
                }
            }
            match best {
                Some(b) => part = b,
                None => break,
            }
        }
        part
    }

    /// Records `cand` in `best` if it beats both `best` and `t`.
    fn consider(&mut self, cand: Vec<Role>, t: f64, best: &mut Option<(f64, Vec<Role>)>) {
        if let Some(v) = self.value(&cand) {
            let bar = best.as_ref().map_or(t, |b| b.0);
            if better(v, bar) {
                *best = Some((v, cand));
            }
        }
    }

    /// Best-improvement local search over single role changes and worker↔server swaps;
    /// when those are exhausted and `pairs` is set, the first improving change of two
    /// containers at once is taken and the search goes on.
    fn local_search(&mut self, mut roles: Vec<Role>, pairs: bool) -> (f64, Vec<Role>) {
        const ROLES: [Role; 3] = [Role::Worker, Role::Server, Role::Idle];
        let n = roles.len();
        let Some(mut t) = self.value(&roles) else {
            return (f64::INFINITY, roles);
        };
        loop {
            let mut best: Option<(f64, Vec<Role>)> = None;
            for i in 0..n {
                for r in ROLES {
                    if roles[i] != r {
                        let mut c = roles.clone();
                        c[i] = r;
                        self.consider(c, t, &mut best);
                    }
                }
            }
            for i in 0..n {
                if roles[i] != Role::Worker {
                    continue;
                }
                for j in 0..n {
                    if roles[j] == Role::Server {
                        let mut c = roles.clone();
                        c.swap(i, j);
                        self.consider(c, t, &mut best);
                    }
                }
            }
            if best.is_none() && pairs {
                for i in 0..n {
                    for j in (i + 1)..n {
                        for ri in ROLES.into_iter().filter(|&r| r != roles[i]) {
                            for rj in ROLES.into_iter().filter(|&r| r != roles[j]) {
                                if best.is_some() {
                                    break;
                                }
                                let mut c = roles.clone();
                                c[i] = ri;
                                c[j] = rj;
                                self.consider(c, t, &mut best);
                            }
                        }
                    }
                }
            }
            match best {
                Some((v, c)) => {
                    t = v;
                    roles = c;
                }
                None => return (t, roles),
            }
        }
    }

    /// Moves block counts towards the current ones where the epoch time stays within
    /// `bar` (at least `part.t`).
    fn align(&self, roles: &[Role], part: Part, bar: f64) -> Part {
        let m = self.m;
        let cur = m.current_placements();
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        let t_bar = bar.max(part.t);
        // Model: keep the current split if the servers are the same, it is as
        // good, and they hold the whole model now (not so when a container
        // that is given back holds blocks: it is not in this model).
        let same_servers = servers
            .iter()
            .all(|&j| cur[j].role == Role::Server && cur[j].model_blocks > 0)
            && cur.iter().filter(|p| p.model_blocks > 0).count() == servers.len()
            && cur.iter().map(|p| u64::from(p.model_blocks)).sum::<u64>()
                == u64::from(m.job().model_blocks);
        let mut l = part.l.clone();
        if same_servers {
            let cur_l: Vec<u32> = cur.iter().map(|p| p.model_blocks).collect();
            let cand = self.data(&workers, &servers, cur_l.clone());
            if cand.t <= t_bar {
                l = cur_l;
            }
        }
        let srv: Vec<(usize, u32)> = servers.iter().map(|&j| (j, l[j])).collect();
        let active = crate::cost::holding(&srv);
        let w = workers.len();
        // Data: any counts within [1, kmax_i(T)] summing to K are optimal.
        let mut lo = Vec::with_capacity(w);
        let mut hi = Vec::with_capacity(w);
        let mut want = Vec::with_capacity(w);
        for &i in &workers {
            let g = m.comm_per_batch(i, w, &srv).0;
            let (mut a, mut b) = (1u32, m.job().input_blocks);
            if m.worker_time(i, 1, g, active) > t_bar {
                return self.data(&workers, &servers, l);
            }
            while a < b {
                let mid = a + (b - a).div_ceil(2);
                if m.worker_time(i, mid, g, active) <= t_bar {
                    a = mid;
                } else {
                    b = mid - 1;
                }
            }
            lo.push(1);
            hi.push(a);
            want.push(cur[i].input_blocks);
        }
        match align_counts(&want, &lo, &hi, m.job().input_blocks) {
            Some(counts) => {
                let mut k = vec![0u32; m.len()];
                for (x, &i) in workers.iter().enumerate() {
                    k[i] = counts[x];
                }
                let t = workers
                    .iter()
                    .map(|&i| m.worker_time(i, k[i], m.comm_per_batch(i, w, &srv).0, active))
                    .fold(0.0, f64::max);
                Part { t, k, l }
            }
            None => self.data(&workers, &servers, l),
        }
    }
}

/// Counts within `[lo, hi]` summing to `total`, as close to `want` as possible
/// (clamp, then move the difference onto entries with room, in index order).
fn align_counts(want: &[u32], lo: &[u32], hi: &[u32], total: u32) -> Option<Vec<u32>> {
    let lo_sum: u64 = lo.iter().map(|&v| u64::from(v)).sum();
    let hi_sum: u64 = hi.iter().map(|&v| u64::from(v)).sum();
    if u64::from(total) < lo_sum || u64::from(total) > hi_sum {
        return None;
    }
    let mut c: Vec<u32> = (0..want.len())
        .map(|x| want[x].clamp(lo[x], hi[x]))
        .collect();
    let mut sum: u64 = c.iter().map(|&v| u64::from(v)).sum();
    let mut x = 0;
    while sum < u64::from(total) {
        let add = (hi[x] - c[x]).min((u64::from(total) - sum) as u32);
        c[x] += add;
        sum += u64::from(add);
        x += 1;
    }
    x = 0;
    while sum > u64::from(total) {
        let sub = (c[x] - lo[x]).min((sum - u64::from(total)) as u32);
        c[x] -= sub;
        sum -= u64::from(sub);
        x += 1;
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{ContainerMetrics, Snapshot};

    fn job(d: u64, b: u64, m: f64, k: u32, l: u32) -> Job {
        Job {
            total_records: d,
            mini_batch_size: b,
            bytes_per_mini_batch: m,
            link_bytes_per_mini_batch: None,
            input_blocks: k,
            model_blocks: l,
            remaining_epochs: 10.0,
            input_bytes: 0,
            model_bytes: 0,
            serial_fraction: 1.0,
            latency_secs_per_mini_batch: 0.0,
            asynchronous: false,
        }
    }

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
            id: id.into(),
            role: Role::Idle,
            compute_secs_per_record: Some(c),
            cpu_speed: None,
            bandwidth_bytes_per_sec: b,
            server_secs_per_byte: Some(0.0),
            request_secs_per_server: None,
            server_secs_per_mini_batch: None,
            input_blocks: 0,
            model_blocks: 0,
            mini_batches: 0,
            reclaimed: false,
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
