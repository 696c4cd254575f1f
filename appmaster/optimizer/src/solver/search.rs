//! The search over role assignments: the exact branch and bound up to
//! [`SearchOptions::exhaustive_up_to`](super::SearchOptions::exhaustive_up_to)
//! containers, the local search above, and turning a partition into a
//! [`Solution`].

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use crate::cost::{CostModel, Placement, Target};
use crate::error::OptimizerError;
use crate::snapshot::Role;

use super::{REL_EPS, Solution, better, split};

/// The exact optimum over all `3^N` role assignments, by branch and bound.
///
/// A server without model blocks is the same as an idle container, so each assignment
/// is solved with at least one block per server (and per worker): the assignments then
/// stand for distinct configurations. Each gets a lower bound ([`split::RoleBounds`]); in
/// order of it, each is solved exactly against the best time so far, until the next
/// bound is above it. Then the ties: for an asynchronous job every assignment within
/// [`REL_EPS`] of the optimum, the one of the highest throughput (then the nearest
/// to `current`) winning; otherwise the assignments closer to `current` than the
/// winner, nearest first, for one within [`REL_EPS`].
pub(super) fn exhaustive(
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
    let (part, roles) = if model.job().asynchronous {
        // Every assignment that reaches the optimum, solved exactly: the
        // bound cannot tell them apart, their throughput can.
        let mut tied = vec![(part, roles)];
        for &(lb, code) in &bounded {
            if lb > window {
                break;
            }
            let r = roles_of(code);
            if r != tied[0].1
                && let Some(p) = search.exact(&r, 1, window)
            {
                tied.push((p, r));
            }
        }
        let mut ranked: Vec<(f64, usize, Part, Vec<Role>)> = tied
            .into_iter()
            .map(|(p, r)| (throughput(model, &r, &p), distance(&r, current), p, r))
            .collect();
        let mut chosen = ranked.swap_remove(0);
        for c in ranked {
            if prefer((c.0, c.1), (chosen.0, chosen.1)) {
                chosen = c;
            }
        }
        (chosen.2, chosen.3)
    } else {
        let far = distance(&roles, current);
        let mut closer: Vec<(usize, Vec<Role>)> = bounded
            .iter()
            .filter(|&&(lb, _)| lb <= window)
            .map(|&(_, code)| roles_of(code))
            .map(|r| (distance(&r, current), r))
            .filter(|(d, _)| *d < far)
            .collect();
        closer.sort_by_key(|(d, _)| *d);
        closer
            .into_iter()
            .find_map(|(_, r)| search.exact(&r, 1, window).map(|p| (p, r)))
            .unwrap_or((part, roles))
    };
    finish(model, search, &roles, part, window, total as usize, exact)
}

/// Whether a configuration tied with another on the epoch time is to be
/// preferred, by `(throughput epoch, distance from the running roles)`:
/// the higher throughput (an asynchronous job's expected epoch, within
/// [`REL_EPS`]), then the nearer.
pub(super) fn prefer(a: (f64, usize), b: (f64, usize)) -> bool {
    better(a.0, b.0) || (!better(b.0, a.0) && a.1 < b.1)
}

/// The throughput epoch ([`crate::cost::Breakdown::throughput_epoch_secs`])
/// of `part` for `roles`: what an asynchronous job is expected to run at,
/// where the solvers' epoch is its upper bound. Infinite when it cannot
/// train.
pub(super) fn throughput(model: &CostModel, roles: &[Role], part: &Part) -> f64 {
    model
        .evaluate(&target_of(model, roles, part))
        .map_or(f64::INFINITY, |b| b.throughput_epoch_secs)
}

/// The target of `part` for `roles`: a worker without input blocks and a
/// server without model blocks are idle.
fn target_of(model: &CostModel, roles: &[Role], part: &Part) -> Target {
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
    target
}

pub(super) fn distance(a: &[Role], b: &[Role]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// Turns a partition into a [`Solution`], aligning counts with the current ones where
/// that keeps the epoch time within `bar`.
pub(super) fn finish(
    model: &CostModel,
    search: &Search<'_>,
    roles: &[Role],
    part: Part,
    bar: f64,
    evaluations: usize,
    exact: bool,
) -> Result<Solution, OptimizerError> {
    let part = search.align(roles, part, bar);
    let target = target_of(model, roles, &part);
    let epoch_secs = model.evaluate(&target)?.epoch_secs;
    Ok(Solution {
        target,
        epoch_secs,
        evaluations,
        exact,
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Key(pub(super) f64, pub(super) usize);
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
pub(super) struct Part {
    pub(super) t: f64,
    pub(super) k: Vec<u32>,
    pub(super) l: Vec<u32>,
}

pub(super) struct Search<'a> {
    pub(super) m: &'a CostModel,
    pub(super) cache: HashMap<Vec<Role>, Option<f64>>,
    /// Model-split nodes left for this solve ([`SearchOptions::node_budget`]).
    pub(super) nodes: std::cell::Cell<usize>,
}

impl<'a> Search<'a> {
    pub(super) fn new(m: &'a CostModel, node_budget: usize) -> Self {
        Search {
            m,
            cache: HashMap::new(),
            nodes: std::cell::Cell::new(node_budget),
        }
    }

    /// The model-split branch and bound of `fixed` within the nodes left.
    pub(super) fn best_split(
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
    pub(super) fn value(&mut self, roles: &[Role]) -> Option<f64> {
        if let Some(v) = self.cache.get(roles) {
            return *v;
        }
        let v = self.partition(roles).map(|p| p.t);
        self.cache.insert(roles.to_vec(), v);
        v
    }

    pub(super) fn members(roles: &[Role], r: Role) -> Vec<usize> {
        roles
            .iter()
            .enumerate()
            .filter(|(_, x)| **x == r)
            .map(|(i, _)| i)
            .collect()
    }

    /// Proportional model split, then the exact data greedy.
    pub(super) fn partition(&self, roles: &[Role]) -> Option<Part> {
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
    pub(super) fn data(&self, workers: &[usize], servers: &[usize], l: Vec<u32>) -> Part {
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
    pub(super) fn fixed(&self, roles: &[Role], lmin: u32) -> Option<split::Fixed> {
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        split::Fixed::new(self.m, &workers, &servers, lmin)
    }

    /// The exact best partition for `roles` (at least `lmin` model blocks per server)
    /// if its epoch time is at most `bar`.
    pub(super) fn exact(&self, roles: &[Role], lmin: u32, bar: f64) -> Option<Part> {
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
    /// branch and bound for at most `budget` nodes (exact when it finishes), looking
    /// only below `cap` (the result is above `cap` when nothing below it was found).
    pub(super) fn refine(&self, roles: &[Role], part: Part, budget: usize, cap: f64) -> Part {
        let workers = Self::members(roles, Role::Worker);
        let servers = Self::members(roles, Role::Server);
        let part = self.moves(&workers, &servers, part);
        let Some(fixed) = split::Fixed::new(self.m, &workers, &servers, 0) else {
            return part;
        };
        let bar = (part.t * (1.0 - split::SEARCH_EPS)).min(cap);
        match self.best_split(&fixed, bar, budget, &part.l) {
            Some((_, l)) => self.data(&workers, &servers, l),
            None => part,
        }
    }

    /// Single-block moves between servers while they lower the epoch time.
    pub(super) fn moves(&self, workers: &[usize], servers: &[usize], mut part: Part) -> Part {
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
    pub(super) fn consider(
        &mut self,
        cand: Vec<Role>,
        t: f64,
        best: &mut Option<(f64, Vec<Role>)>,
    ) {
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
    pub(super) fn local_search(&mut self, mut roles: Vec<Role>, pairs: bool) -> (f64, Vec<Role>) {
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
    pub(super) fn align(&self, roles: &[Role], part: Part, bar: f64) -> Part {
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
pub(super) fn align_counts(want: &[u32], lo: &[u32], hi: &[u32], total: u32) -> Option<Vec<u32>> {
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
