//! The exact partition for fixed roles: which server holds how many model blocks
//! (branch and bound), and how many input blocks each worker then takes (min-max
//! greedy); and lower bounds that let the solver skip whole role assignments.
//!
//! For a model split `l`, worker `i`'s communication per mini-batch `g_i(l)` is fixed,
//! and the greedy that gives each next input block to the worker whose epoch time
//! grows least minimises the slowest worker exactly (each worker's time is
//! non-decreasing in its block count). The epoch time is non-decreasing in every
//! `g_i`, so a lower bound on each `g_i` over the splits that extend a partial
//! assignment gives a lower bound on their epoch time. The branch and bound assigns
//! servers one at a time and prunes a partial assignment when, even with those bounds,
//! the workers cannot take all `K` input blocks within the incumbent's time.
//!
//! Bounds for worker `x` when servers `y..` still share `R` blocks, with `a_xy` the
//! server-bound and `b_xy` the worker-bound seconds per block (see [`crate::cost`]):
//!
//! ```text
//! g_x ≥ assigned server-bound  max_{y assigned} a_xy·l_y
//! g_x ≥ min over whole-block splits of R of  max_y a_xy·l_y             (water)
//! g_x ≥ min over fractional splits of R of  max(server-bound, worker-bound)   (joint)
//! ```
//!
//! Each bound takes the split best for worker `x` alone, so they are loose when the
//! workers want different servers (measured links); branching first on the server
//! some worker finds cheapest keeps the search small in practice. Typical solves of 10
//! containers take tens of milliseconds; the slowest seen on random instances (K and L
//! up to 200, several measured links) took about 2 s.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::search::Key;
use crate::cost::CostModel;

/// Relative margin by which the branch and bound must beat its incumbent. It keeps
/// float noise (~1e-15) from letting equal splits look better, so ties are pruned.
pub(super) const SEARCH_EPS: f64 = 1e-12;

/// Above this many servers the server-bound uses the fractional bound only.
const WATER_EXACT_MAX: usize = 12;

/// Per-block communication costs of one role assignment.
pub(super) struct Fixed {
    /// Workers (model indices).
    workers: Vec<usize>,
    /// Servers (model indices), in branching order: cheapest for some worker first.
    servers: Vec<usize>,
    /// Fewest model blocks a server must hold.
    lmin: u32,
    /// `a[x·s + y]`: server-bound seconds per mini-batch that one model block on server
    /// `y` costs worker `x`: `w·max(M'/b_y, M·p_y) / L` (`b_xy` for `b_y` where that
    /// link was measured and is slower).
    a: Vec<f64>,
    /// `1 / a`, same layout.
    ia: Vec<f64>,
    /// `b[x·s + y]`: worker-bound seconds per mini-batch per model block, `M' / (b_x·L)`.
    b: Vec<f64>,
    /// `by_b[x·s ..][..s]`: server positions `y`, cheapest `b[x·s + y]` first.
    by_b: Vec<usize>,
}

impl Fixed {
    /// The costs for these workers and servers, each server holding at least `lmin`
    /// model blocks; `None` when no split or no data partition exists.
    pub(super) fn new(
        m: &CostModel,
        workers: &[usize],
        servers: &[usize],
        lmin: u32,
    ) -> Option<Fixed> {
        if !feasible(m, workers.len(), servers.len(), lmin) {
            return None;
        }
        let w = workers.len();
        let cost = |i: usize, j: usize| {
            let (a, b) = m.block_costs(i, j);
            (w as f64 * a, b)
        };
        // Branch first on the servers that some worker can use most cheaply: their
        // counts decide the most, and the bounds tighten fastest (measured: several
        // times fewer nodes than largest-capacity-first on random instances with links).
        let mut servers = servers.to_vec();
        let best_a = |j: usize| {
            workers
                .iter()
                .map(|&i| cost(i, j).0)
                .fold(f64::INFINITY, f64::min)
        };
        servers.sort_by(|&p, &q| best_a(p).total_cmp(&best_a(q)).then(p.cmp(&q)));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for &i in workers {
            for &j in &servers {
                let (ax, bx) = cost(i, j);
                a.push(ax);
                b.push(bx);
            }
        }
        let ia = a.iter().map(|v| 1.0 / v).collect();
        let s = servers.len();
        let mut by_b = Vec::with_capacity(w * s);
        for x in 0..w {
            let mut order: Vec<usize> = (0..s).collect();
            order.sort_by(|&p, &q| b[x * s + p].total_cmp(&b[x * s + q]).then(p.cmp(&q)));
            by_b.extend(order);
        }
        Some(Fixed {
            workers: workers.to_vec(),
            servers,
            lmin,
            a,
            ia,
            b,
            by_b,
        })
    }

    /// Lower bound on worker `x`'s communication per mini-batch over all splits in
    /// which servers `..y` are assigned (giving server-bound `sb` and worker-bound `wb`)
    /// and servers `y..` share `left` blocks.
    fn g_lower(&self, x: usize, y: usize, left: u32, sb: f64, wb: f64) -> f64 {
        let s = self.servers.len();
        if y == s {
            return sb.max(wb);
        }
        let row = x * s + y..x * s + s;
        let srv = water(&self.a[row.clone()], &self.ia[row], self.lmin, left);
        sb.max(srv).max(self.joint(x, y, left, sb, wb))
    }

    /// `min max(X, F(X))` over fractional splits of the `left` blocks on servers `y..`,
    /// where `X ≥ sb` is the server-bound level (server `y` then holds at most
    /// `X / a_y` blocks) and `F(X)` the least worker-bound at that level: `wb` plus the
    /// blocks placed cheapest first within those caps. `F` falls as `X` grows, so the
    /// minimum is at the smallest feasible level or where `X = F(X)`; `F` is linear
    /// between the levels at which one more cheap server fills up, so each piece is
    /// solved in closed form. This couples the two terms, which alone give the
    /// fractional level and `wb` plus all spare blocks on the cheapest server.
    fn joint(&self, x: usize, y: usize, left: u32, sb: f64, wb: f64) -> f64 {
        let s = self.servers.len();
        let (a, ia, b) = (&self.a[x * s..], &self.ia[x * s..], &self.b[x * s..]);
        let lmin = f64::from(self.lmin);
        let (mut max_a, mut inv_a, mut sum_b) = (0.0f64, 0.0, 0.0);
        for z in y..s {
            max_a = max_a.max(a[z]);
            inv_a += ia[z];
            sum_b += b[z];
        }
        let r = (s - y) as f64;
        let extra = f64::from(left) - lmin * r;
        let x0 = sb.max(lmin * max_a).max(f64::from(left) / inv_a);
        let base = wb + lmin * sum_b;
        let order = self.by_b[x * s..x * s + s]
            .iter()
            .copied()
            .filter(|&z| z >= y);
        let cheapest_b = order.clone().next().map_or(0.0, |z| b[z]);
        // The separate bounds: what the coupling can only raise.
        let floor = x0.max(base + extra.max(0.0) * cheapest_b);
        if extra <= 0.0 || !x0.is_finite() || !floor.is_finite() {
            return floor;
        }
        // F at x0: fill the extra blocks cheapest first within caps x0/a − lmin.
        let (mut left_x0, mut f0) = (extra, base);
        for z in order.clone() {
            let take = (x0 * ia[z] - lmin).max(0.0).min(left_x0);
            f0 += take * b[z];
            left_x0 -= take;
            if left_x0 <= 0.0 {
                break;
            }
        }
        if f0 <= x0 {
            return floor;
        }
        // The crossing X = F(X) > x0. Piece p: the p cheapest servers full, the next one
        // takes the rest: F = C + D·X with D = Σ_{t<p} (b_t − b_p)·ia_t ≤ 0.
        let (mut full_inv, mut full_b_inv, mut full_count, mut full_b) = (0.0, 0.0, 0.0, 0.0);
        for z in order {
            let (bz, iz) = (b[z], ia[z]);
            // Rest on z: extra − Σ_{t<p}(X·ia_t − lmin); F = base + Σ b_t(X·ia_t − lmin) + bz·rest.
            let c = base - lmin * full_b + bz * (extra + lmin * full_count);
            let d = full_b_inv - bz * full_inv;
            let cross = c / (1.0 - d);
            let used = cross * full_inv - lmin * full_count;
            let cap_z = cross * iz - lmin;
            if cross >= x0 && used <= extra && extra - used <= cap_z {
                return floor.max(cross);
            }
            full_inv += iz;
            full_b_inv += bz * iz;
            full_count += 1.0;
            full_b += bz;
        }
        floor
    }

    /// The model split (per container, model order) with the smallest epoch time not
    /// above `bar`, with that time; `None` when no split reaches `bar`. Visits at most
    /// `budget` search nodes (less what it visits is left there) and then keeps the
    /// best split found so far; the answer is exact when some budget is left. Each
    /// server's counts are tried outwards from its count in `hint` (model order), so a
    /// budgeted search looks around a known good split first.
    pub(super) fn best_split(
        &self,
        m: &CostModel,
        bar: f64,
        budget: &mut usize,
        hint: &[u32],
    ) -> Option<(f64, Vec<u32>)> {
        let (w, s) = (self.workers.len(), self.servers.len());
        let mut dfs = Dfs {
            f: self,
            m,
            hint,
            bar,
            best: None,
            nodes: *budget,
            sb: vec![0.0; (s + 1) * w],
            wb: vec![0.0; (s + 1) * w],
            l: vec![0; m.len()],
            g: vec![0.0; w],
            counts: Vec::with_capacity(w),
            srv: Vec::with_capacity(s),
        };
        dfs.visit(0, m.job().model_blocks);
        *budget = dfs.nodes;
        dfs.best
    }
}

/// Whether `w` workers and `s` servers (each holding at least `lmin` model blocks) can
/// hold the job's blocks.
fn feasible(m: &CostModel, w: usize, s: usize, lmin: u32) -> bool {
    let job = m.job();
    w > 0
        && s > 0
        && w <= job.input_blocks as usize
        && u64::from(lmin) * s as u64 <= u64::from(job.model_blocks)
}

/// `min max_y a_y·l_y` over splits of `left` whole blocks with every `l_y ≥ lmin`
/// (`ia` holds the `1/a_y`): the fractional level, raised block by block to the
/// whole-block one when there are at most [`WATER_EXACT_MAX`] servers. Every level
/// visited is at most the exact answer, so each is a lower bound.
fn water(a: &[f64], ia: &[f64], lmin: u32, left: u32) -> f64 {
    let (inv, max) = a
        .iter()
        .zip(ia)
        .fold((0.0, 0.0f64), |(s, m), (&v, &iv)| (s + iv, m.max(v)));
    let level = (f64::from(lmin) * max).max(f64::from(left) / inv);
    if a.len() > WATER_EXACT_MAX || !level.is_finite() {
        return level;
    }
    // Blocks each server takes at `level`, and the level at which it takes one more.
    let mut next = [0.0f64; WATER_EXACT_MAX];
    let mut fit = 0u64;
    for (y, (&v, &iv)) in a.iter().zip(ia).enumerate() {
        if v <= 0.0 {
            return level;
        }
        let c = (level * iv).floor().min(f64::from(left));
        fit += c as u64;
        next[y] = v * (c + 1.0);
    }
    let next = &mut next[..a.len()];
    let mut level = level;
    // The fractional level leaves fewer than one block per server (plus rounding) out.
    for _ in 0..a.len() + 2 {
        if fit >= u64::from(left) {
            break;
        }
        let (y, &t) = next
            .iter()
            .enumerate()
            .min_by(|p, q| p.1.total_cmp(q.1))
            .unwrap_or((0, &level));
        level = level.max(t);
        next[y] += a[y];
        fit += 1;
    }
    level
}

/// Lower bounds on the epoch time of whole role assignments in which every server
/// holds at least one model block, for the enumeration of all assignments: pairwise
/// per-block costs computed once, scratch space reused. The server-bound is the
/// fractional one (cheaper); the assignments that pass are re-checked by the branch and
/// bound with the whole-block one.
pub(super) struct RoleBounds<'m> {
    m: &'m CostModel,
    /// [`CostModel::block_costs`]: server-bound per active worker, its inverse, and
    /// worker-bound, at `i·n + j`.
    pa: Vec<f64>,
    pia: Vec<f64>,
    pb: Vec<f64>,
    g: Vec<f64>,
    counts: Vec<u32>,
}

impl<'m> RoleBounds<'m> {
    pub(super) fn new(m: &'m CostModel) -> Self {
        let n = m.len();
        let (mut pa, mut pb) = (Vec::with_capacity(n * n), Vec::with_capacity(n * n));
        for i in 0..n {
            for j in 0..n {
                let (a, b) = m.block_costs(i, j);
                pa.push(a);
                pb.push(b);
            }
        }
        let pia = pa.iter().map(|v| 1.0 / v).collect();
        RoleBounds {
            m,
            pa,
            pia,
            pb,
            g: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// A lower bound on the epoch time of every partition of `workers` and `servers`
    /// with at least one model block per server; `None` when there is none.
    pub(super) fn bound(&mut self, workers: &[usize], servers: &[usize]) -> Option<f64> {
        if !feasible(self.m, workers.len(), servers.len(), 1) {
            return None;
        }
        let n = self.m.len();
        let l_total = f64::from(self.m.job().model_blocks);
        let w = workers.len() as f64;
        let spare = l_total - servers.len() as f64;
        self.g.clear();
        for &i in workers {
            let (mut max_a, mut inv_a) = (0.0f64, 0.0);
            let (mut sum_b, mut min_b) = (0.0, f64::INFINITY);
            for &j in servers {
                max_a = max_a.max(self.pa[i * n + j]);
                inv_a += self.pia[i * n + j];
                sum_b += self.pb[i * n + j];
                min_b = min_b.min(self.pb[i * n + j]);
            }
            let sb = w * max_a.max(l_total / inv_a);
            let own = sum_b + if spare > 0.0 { spare * min_b } else { 0.0 };
            self.g.push(sb.max(own));
        }
        // Every server holds a block (the bound's assignments have at least one each).
        Some(spread(
            self.m,
            workers,
            &self.g,
            servers.len(),
            &mut self.counts,
        ))
    }
}

/// Depth-first branch and bound over the servers of a [`Fixed`].
struct Dfs<'f, 'm> {
    f: &'f Fixed,
    m: &'m CostModel,
    /// Counts to try first, model order.
    hint: &'f [u32],
    /// Only splits with epoch time at most this are wanted.
    bar: f64,
    best: Option<(f64, Vec<u32>)>,
    /// Search nodes left.
    nodes: usize,
    /// Row `y` (of `w`): server-bound and worker-bound of servers `..y`.
    sb: Vec<f64>,
    wb: Vec<f64>,
    /// The split being built, model order.
    l: Vec<u32>,
    g: Vec<f64>,
    counts: Vec<u32>,
    srv: Vec<(usize, u32)>,
}

impl Dfs<'_, '_> {
    fn visit(&mut self, y: usize, left: u32) {
        if self.nodes == 0 {
            return;
        }
        self.nodes -= 1;
        let f = self.f;
        let (w, s) = (f.workers.len(), f.servers.len());
        for x in 0..w {
            self.g[x] = f.g_lower(x, y, left, self.sb[y * w + x], self.wb[y * w + x]);
        }
        // The servers that will hold blocks: at least those given some so far, and
        // one more if blocks are left (the requests' cost grows with them).
        let active = if f.lmin > 0 {
            s
        } else {
            f.servers[..y].iter().filter(|&&j| self.l[j] > 0).count()
                + usize::from(y < s && left > 0)
        };
        if !fits(self.m, &f.workers, &self.g, active, self.bar) {
            return;
        }
        if y == s {
            self.leaf();
            return;
        }
        let r = (s - y) as u32;
        let (lo, hi) = if r == 1 {
            (left, left)
        } else {
            (f.lmin, left - f.lmin * (r - 1))
        };
        let j = f.servers[y];
        let h = self.hint.get(j).copied().unwrap_or(hi).clamp(lo, hi);
        // h, h+1, h−1, h+2, h−2, … within [lo, hi].
        let up = (h..=hi).map(Some).chain(std::iter::repeat(None));
        let down = (lo..h).rev().map(Some).chain(std::iter::repeat(None));
        let order = up
            .zip(down)
            .take_while(|p| *p != (None, None))
            .flat_map(|(a, b)| a.into_iter().chain(b));
        for v in order {
            self.l[j] = v;
            let vf = f64::from(v);
            for x in 0..w {
                let (ay, by) = (f.a[x * s + y], f.b[x * s + y]);
                self.sb[(y + 1) * w + x] = self.sb[y * w + x].max(ay * vf);
                self.wb[(y + 1) * w + x] = self.wb[y * w + x] + by * vf;
            }
            self.visit(y + 1, left - v);
            if self.nodes == 0 {
                break;
            }
        }
        self.l[j] = 0;
    }

    /// A complete split: its exact epoch time, computed as the cost model does.
    fn leaf(&mut self) {
        let f = self.f;
        let w = f.workers.len();
        self.srv.clear();
        self.srv.extend(f.servers.iter().map(|&j| (j, self.l[j])));
        self.srv.sort_unstable();
        for (x, &i) in f.workers.iter().enumerate() {
            self.g[x] = self.m.comm_per_batch(i, w, &self.srv).0;
        }
        let active = crate::cost::holding(&self.srv);
        let t = spread(self.m, &f.workers, &self.g, active, &mut self.counts);
        if t <= self.bar {
            self.best = Some((t, self.l.clone()));
            self.bar = t * (1.0 - SEARCH_EPS);
        }
    }
}

/// The largest number of input blocks (at least one, at most `cap`) worker `i` can
/// take within `bar` with communication `g` per mini-batch and `s` servers, or 0.
///
/// With `u` the time per block without the rounding up of mini-batches, the time for
/// `k` blocks is near `[k·u, k·u + g + o]` (`o` the requests to the servers; exactly
/// so for a serial worker without latency), so `(bar − g − o)/u` and `bar/u` are
/// guesses at the answer's bounds, each checked with [`CostModel::worker_time`]
/// before it narrows a binary search.
fn kmax(m: &CostModel, i: usize, g: f64, s: usize, bar: f64, cap: u32) -> u32 {
    if m.worker_time(i, 1, g, s) > bar {
        return 0;
    }
    let job = m.job();
    let o = m.requests_per_batch(i, s);
    let u = (m.compute_secs_per_record(i) + (g + o) / job.mini_batch_size as f64)
        * job.total_records as f64
        / f64::from(job.input_blocks);
    let (mut lo, mut hi) = (1u32, cap);
    if u > 0.0 {
        let clamp = |v: f64| v.floor().clamp(1.0, f64::from(cap)) as u32;
        let (a, b) = (clamp((bar - g - o) / u), clamp(bar / u + 1.0));
        // The estimates hold in exact arithmetic; check them in floating point.
        if a > lo && m.worker_time(i, a, g, s) <= bar {
            lo = a;
        }
        if b < hi && m.worker_time(i, b, g, s) > bar {
            hi = b - 1;
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if m.worker_time(i, mid, g, s) <= bar {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Whether the workers, with communication `g` per mini-batch and `s` servers, can
/// take all input blocks (each at least one) with nobody above `bar`.
fn fits(m: &CostModel, workers: &[usize], g: &[f64], s: usize, bar: f64) -> bool {
    let k_total = m.job().input_blocks;
    let w = workers.len() as u32;
    if w == 0 || w > k_total {
        return false;
    }
    if workers
        .iter()
        .zip(g)
        .any(|(&i, &gi)| m.worker_time(i, 1, gi, s) > bar)
    {
        return false;
    }
    let cap = k_total - (w - 1);
    let mut sum = 0u64;
    for (&i, &gi) in workers.iter().zip(g) {
        sum += u64::from(kmax(m, i, gi, s, bar, cap));
        if sum >= u64::from(k_total) {
            return true;
        }
    }
    false
}

/// Above this many workers the greedy keeps its candidates in a heap.
const HEAP_ABOVE: usize = 16;

/// The exact min-max partition of the input blocks over `workers` (each at least one),
/// whose communication per mini-batch is `g`, with `s` servers: each next block goes
/// to the worker whose
/// epoch time grows least. Returns the slowest worker's time; `counts` gets the blocks
/// per worker (in the order of `workers`).
///
/// The greedy is exact from any start that gives every worker at most the blocks it
/// can take within the optimum `T*`. It starts from what each can take within a lower
/// bound on `T*`: the slowest single block, and `K / Σ 1/u_i` where `u_i ≤` worker
/// `i`'s time per block (its time for `k` blocks is at least `k·u_i`). Only the few
/// blocks left go through the greedy.
pub(super) fn spread(
    m: &CostModel,
    workers: &[usize],
    g: &[f64],
    s: usize,
    counts: &mut Vec<u32>,
) -> f64 {
    let job = m.job();
    let w = workers.len();
    let k_total = job.input_blocks;
    counts.clear();
    if w == 0 {
        return 0.0;
    }
    let per_block = job.total_records as f64 / f64::from(k_total);
    let batch = job.mini_batch_size as f64;
    let (mut single, mut rate) = (0.0f64, 0.0f64);
    for (&i, &gi) in workers.iter().zip(g) {
        single = single.max(m.worker_time(i, 1, gi, s));
        let o = m.requests_per_batch(i, s);
        rate += 1.0 / ((m.compute_secs_per_record(i) + (gi + o) / batch) * per_block);
    }
    let t_lo = single.max(f64::from(k_total) / rate);
    let cap = k_total.saturating_sub(w as u32 - 1).max(1);
    counts.extend(
        workers
            .iter()
            .zip(g)
            .map(|(&i, &gi)| kmax(m, i, gi, s, t_lo, cap).max(1)),
    );
    if counts.iter().map(|&c| u64::from(c)).sum::<u64>() > u64::from(k_total) {
        // Only float rounding at the bound gets here: start from one block each.
        counts.iter_mut().for_each(|c| *c = 1);
    }
    let placed: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    let next = |x: usize, c: u32| m.worker_time(workers[x], c + 1, g[x], s);
    if w <= HEAP_ABOVE {
        for _ in placed..u64::from(k_total) {
            let mut pick = 0;
            let mut pick_t = f64::INFINITY;
            for (x, &c) in counts.iter().enumerate() {
                let t = next(x, c);
                if t < pick_t {
                    (pick, pick_t) = (x, t);
                }
            }
            counts[pick] += 1;
        }
    } else {
        let mut heap: BinaryHeap<Reverse<Key>> = (0..w)
            .map(|x| Reverse(Key(next(x, counts[x]), x)))
            .collect();
        for _ in placed..u64::from(k_total) {
            let Some(Reverse(Key(_, x))) = heap.pop() else {
                break;
            };
            counts[x] += 1;
            heap.push(Reverse(Key(next(x, counts[x]), x)));
        }
    }
    workers
        .iter()
        .enumerate()
        .map(|(x, &i)| m.worker_time(i, counts[x], g[x], s))
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{ContainerMetrics, Job, Link, Role, Snapshot, test_job};
    use proptest::prelude::*;

    /// A random model of 2 to 6 containers (some links measured, half with a cost per
    /// server on the workers) and a job with up to `kmax` input and 9 model blocks.
    fn model(kmax: u32) -> impl Strategy<Value = CostModel> {
        (
            2usize..=6,
            1u32..=kmax,
            1u32..=9,
            10u64..200,
            5u64..60,
            any::<bool>(),
        )
            .prop_flat_map(|(n, k, l, per_block, batch, requests)| {
                let q_max = if requests { 0.1 } else { 0.0 };
                let one = (1e-3f64..1e-2, 1e6f64..1e7, 0.0f64..1e-7, 0.0f64..=q_max);
                (
                    proptest::collection::vec(one, n),
                    proptest::collection::vec((0..n, 0..n, 5e5f64..2e7), 0..n),
                )
                    .prop_map(move |(cs, links)| {
                        let containers = cs
                            .iter()
                            .enumerate()
                            .map(|(i, &(c, b, p, q))| ContainerMetrics {
                                id: format!("c{i}"),
                                role: Role::Idle,
                                compute_secs_per_record: Some(c),
                                cpu_speed: None,
                                bandwidth_bytes_per_sec: b,
                                server_secs_per_byte: Some(p),
                                request_secs_per_server: Some(q),
                                server_secs_per_mini_batch: Some(0.0),
                                input_blocks: 0,
                                model_blocks: 0,
                                mini_batches: 0,
                                reclaimed: false,
                            })
                            .collect();
                        let snapshot = Snapshot {
                            policy: None,
                            job: Job {
                                remaining_epochs: 1.0,
                                ..test_job(per_block * u64::from(k), batch, 1e6, k, l)
                            },
                            containers,
                            links: links
                                .into_iter()
                                .filter(|(a, b, _)| a != b)
                                .map(|(a, b, v)| Link {
                                    from: format!("c{a}"),
                                    to: format!("c{b}"),
                                    bytes_per_sec: v,
                                })
                                .collect(),
                        };
                        CostModel::new(&snapshot).unwrap()
                    })
            })
    }

    /// Splits the containers into workers (digit 0), servers (1) and idle (2).
    fn roles(n: usize, code: u32) -> (Vec<usize>, Vec<usize>) {
        let (mut workers, mut servers, mut c) = (vec![], vec![], code);
        for i in 0..n {
            match c % 3 {
                0 => workers.push(i),
                1 => servers.push(i),
                _ => {}
            }
            c /= 3;
        }
        (workers, servers)
    }

    /// Every split of `total` blocks over `parts` servers, each at least `min`.
    fn splits(total: u32, parts: usize, min: u32) -> Vec<Vec<u32>> {
        if parts == 1 {
            return if total >= min {
                vec![vec![total]]
            } else {
                vec![]
            };
        }
        let mut out = vec![];
        for v in min..=total {
            for mut rest in splits(total - v, parts - 1, min) {
                rest.insert(0, v);
                out.push(rest);
            }
        }
        out
    }

    /// Communication per mini-batch of each worker for split `ls` (aligned with the
    /// `Fixed`'s branching order), as the cost model computes it.
    fn comm(m: &CostModel, f: &Fixed, ls: &[u32]) -> Vec<f64> {
        let mut srv: Vec<(usize, u32)> = f.servers.iter().copied().zip(ls.to_vec()).collect();
        srv.sort_unstable();
        f.workers
            .iter()
            .map(|&i| m.comm_per_batch(i, f.workers.len(), &srv).0)
            .collect()
    }

    /// The plain greedy from one block each, for comparison with [`spread`].
    fn plain_greedy(m: &CostModel, workers: &[usize], g: &[f64], s: usize) -> f64 {
        let mut k = vec![1u32; workers.len()];
        for _ in workers.len()..m.job().input_blocks as usize {
            let x = (0..workers.len())
                .min_by(|&p, &q| {
                    let tp = m.worker_time(workers[p], k[p] + 1, g[p], s);
                    let tq = m.worker_time(workers[q], k[q] + 1, g[q], s);
                    tp.total_cmp(&tq).then(p.cmp(&q))
                })
                .unwrap();
            k[x] += 1;
        }
        (0..workers.len())
            .map(|x| m.worker_time(workers[x], k[x], g[x], s))
            .fold(0.0, f64::max)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The bounds at every node never exceed the communication of any split below
        /// it, and the branch and bound finds the best split that enumeration finds.
        #[test]
        fn bounds_are_valid_and_the_search_is_exact(m in model(9), code in 0u32..729, lmin in 0u32..=1) {
            let n = m.len();
            let (workers, servers) = roles(n, code % 3u32.pow(n as u32));
            let Some(f) = Fixed::new(&m, &workers, &servers, lmin) else {
                return Ok(());
            };
            let s = servers.len();
            let l_total = m.job().model_blocks;
            let all = splits(l_total, s, lmin);
            let mut counts = vec![];
            let mut best = f64::INFINITY;
            for ls in &all {
                let g = comm(&m, &f, ls);
                let active = ls.iter().filter(|&&v| v > 0).count();
                best = best.min(spread(&m, &workers, &g, active, &mut counts));
                // Every prefix `..y` of this split: its bound is below the split's `g`.
                for y in 0..=s {
                    let left = l_total - ls[..y].iter().sum::<u32>();
                    for (x, &gx) in g.iter().enumerate() {
                        let sb = (0..y).map(|z| f.a[x * s + z] * f64::from(ls[z])).fold(0.0, f64::max);
                        let wb: f64 = (0..y).map(|z| f.b[x * s + z] * f64::from(ls[z])).sum();
                        let lower = f.g_lower(x, y, left, sb, wb);
                        prop_assert!(lower <= gx * (1.0 + 1e-12), "bound {lower} > g {gx} at y={y} split {ls:?}");
                    }
                }
            }
            let hint = vec![0; n];
            let found = f.best_split(&m, f64::INFINITY, &mut { usize::MAX }, &hint).map(|b| b.0);
            prop_assert_eq!(found.is_some(), !all.is_empty());
            if let Some(t) = found {
                prop_assert!((t - best).abs() <= 1e-12 * best, "search {t} vs enumeration {best}");
            }
        }

        /// [`spread`] (greedy from a lower-bound start) equals the greedy from one block
        /// each, and [`fits`] agrees with it.
        #[test]
        fn spread_is_the_greedy(m in model(300), code in 0u32..729, gs in proptest::collection::vec(0.0f64..2.0, 6), s in 0usize..4) {
            let n = m.len();
            let (workers, _) = roles(n, code % 3u32.pow(n as u32));
            if workers.is_empty() || workers.len() > m.job().input_blocks as usize {
                return Ok(());
            }
            let g = &gs[..workers.len()];
            let mut counts = vec![];
            let t = spread(&m, &workers, g, s, &mut counts);
            prop_assert_eq!(t, plain_greedy(&m, &workers, g, s));
            prop_assert_eq!(counts.iter().sum::<u32>(), m.job().input_blocks);
            prop_assert!(fits(&m, &workers, g, s, t));
            prop_assert!(!fits(&m, &workers, g, s, t * (1.0 - 1e-12)));
        }

        /// The role-level bound is below the best split of the role assignment.
        #[test]
        fn role_bounds_are_valid(m in model(9), code in 0u32..729) {
            let n = m.len();
            let (workers, servers) = roles(n, code % 3u32.pow(n as u32));
            let Some(f) = Fixed::new(&m, &workers, &servers, 1) else {
                prop_assert!(RoleBounds::new(&m).bound(&workers, &servers).is_none());
                return Ok(());
            };
            let lb = RoleBounds::new(&m).bound(&workers, &servers).unwrap();
            let best = f.best_split(&m, f64::INFINITY, &mut { usize::MAX }, &vec![0; n]).unwrap().0;
            prop_assert!(lb <= best * (1.0 + 1e-12), "bound {lb} > best {best}");
        }

        /// A solve for fixed roles under a cap finds the uncapped solve's epoch time
        /// when the cap is at or above it, and nothing when the cap is below it.
        #[test]
        fn a_capped_solve_agrees_with_the_uncapped_one(m in model(12), code in 0u32..729, below in any::<bool>()) {
            use crate::solver::{solve_for_roles, solve_for_roles_within};
            let n = m.len();
            let (workers, servers) = roles(n, code % 3u32.pow(n as u32));
            let mut r = vec![Role::Idle; n];
            workers.iter().for_each(|&i| r[i] = Role::Worker);
            servers.iter().for_each(|&i| r[i] = Role::Server);
            let Ok(free) = solve_for_roles(&m, &r) else {
                prop_assert!(!matches!(solve_for_roles_within(&m, &r, f64::MAX), Ok(Some(_))));
                return Ok(());
            };
            prop_assert!(free.exact);
            let t = free.epoch_secs;
            let cap = if below { t * (1.0 - 1e-9) } else { t };
            let capped = solve_for_roles_within(&m, &r, cap).unwrap();
            if below {
                prop_assert!(capped.is_none(), "found {capped:?} below {t}");
            } else {
                let capped = capped.expect("the best is within its own epoch time");
                prop_assert!((capped.epoch_secs - t).abs() <= 1e-12 * t, "{} vs {t}", capped.epoch_secs);
            }
        }
    }
}
