//! The solver against an exact MILP (good_lp + the pure-Rust microlp backend).
//!
//! Formulation, for a fixed number of workers `W` (enumerated), containers `i, j`:
//! binaries `r_i` (worker), `s_i` (server), `z_it` (worker `i` holds `t` input blocks),
//! integers `l_j` (model blocks), continuous `g_i` (communication per mini-batch) and `T`:
//!
//! ```text
//! min T
//! r_i + s_i ≤ 1,  Σ r_i = W,  Σ_t z_it = r_i,  Σ_i Σ_t t·z_it = K
//! l_j ≤ L·s_j,  l_j ≤ L·a_j,  a_j ≤ s_j,  Σ l_j = L     (binary a_j: j holds blocks)
//! g_i ≥ W·(l_j/L)·M'/b_j                        for all j   (server-bound: link)
//! g_i ≥ W·((l_j/L)·M·p_j + r_j·a_j)             for all j   (server-bound: CPU)
//! g_i ≥ M'·Σ_j (l_j/L)/b_i                                (worker-bound)
//! with n_t = ⌈D·t/(K·B)⌉, C_it = c_i·D·t/K + n_t·q_i·Σ_j a_j and
//! Q_it = n_t·(g_i + λ), for all t:
//! T ≥ C_it + f·Q_it − BigM_it·(1 − z_it)
//! T ≥ f·C_it + Q_it − BigM_it·(1 − z_it)
//! ```
//!
//! which is exactly the cost model with whole blocks (idle containers allowed): a
//! worker's epoch `max(C, Q) + f·min(C, Q)` is the larger of the two right-hand sides
//! (serial fraction `f`, latency `λ`, `q_i` the worker's cost per server holding
//! blocks and `r_j` the server's per worker's mini-batch, which minimising keeps
//! `a_j` at 0 for a server without; `f = 1` gives
//! Cruise's `C + Q`); where a link was
//! measured and is slower, its bandwidth `b_ij` replaces `b_i` and `b_j`.

#![allow(clippy::needless_range_loop)]

mod common;

use common::{Inst, instances};
use cruise_optimizer::{CostModel, solve};
use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, constraint, microlp, variable,
};
use proptest::prelude::*;

fn milp_for_w(inst: &Inst, w: usize) -> Option<f64> {
    let n = inst.n();
    let (k, l) = (inst.k as usize, inst.l as f64);
    let mut vars = ProblemVariables::new();
    let r: Vec<Variable> = (0..n).map(|_| vars.add(variable().binary())).collect();
    let s: Vec<Variable> = (0..n).map(|_| vars.add(variable().binary())).collect();
    let z: Vec<Vec<Variable>> = (0..n)
        .map(|_| (0..k).map(|_| vars.add(variable().binary())).collect())
        .collect();
    let lj: Vec<Variable> = (0..n)
        .map(|_| vars.add(variable().integer().min(0).max(inst.l)))
        .collect();
    // Whether server j holds blocks (its requests cost every worker `q_i`).
    let a: Vec<Variable> = (0..n).map(|_| vars.add(variable().binary())).collect();
    let g: Vec<Variable> = (0..n).map(|_| vars.add(variable().min(0.0))).collect();
    let t = vars.add(variable().min(0.0));
    let mut model = vars.minimise(t).using(microlp);
    let inv_s = |i: usize, j: usize| 1.0 / inst.link_s(i, j);
    let inv_w = |i: usize, j: usize| 1.0 / inst.link_w(i, j);
    model = model.with(constraint!(
        r.iter().copied().sum::<Expression>() == w as f64
    ));
    model = model.with(constraint!(lj.iter().copied().sum::<Expression>() == l));
    let mut blocks = Expression::from(0.0);
    for i in 0..n {
        model = model.with(constraint!(r[i] + s[i] <= 1.0));
        model = model.with(constraint!(
            z[i].iter().copied().sum::<Expression>() == r[i]
        ));
        model = model.with(constraint!(lj[i] <= l * s[i]));
        model = model.with(constraint!(lj[i] <= l * a[i]));
        model = model.with(constraint!(a[i] <= s[i]));
        for (x, &zi) in z[i].iter().enumerate() {
            blocks += (x + 1) as f64 * zi;
        }
        let mut own = Expression::from(0.0);
        let mut gmax = 0.0f64;
        let mut own_max = 0.0;
        for j in 0..n {
            let link = inst.ml * inv_s(i, j);
            let cpu = inst.m * inst.p[j];
            let fixed = w as f64 * inst.fixed(j);
            model = model.with(constraint!(g[i] >= (w as f64 * link / l) * lj[j]));
            model = model.with(constraint!(
                g[i] >= (w as f64 * cpu / l) * lj[j] + fixed * a[j]
            ));
            own += (inst.ml * inv_w(i, j) / l) * lj[j];
            gmax = gmax.max(w as f64 * link.max(cpu) + fixed);
            own_max += inst.ml * inv_w(i, j);
        }
        model = model.with(constraint!(g[i] >= own));
        let gmax = gmax.max(own_max);
        for (x, &zi) in z[i].iter().enumerate() {
            let tb = (x + 1) as u64;
            let nb = (inst.d * tb).div_ceil(inst.k as u64 * inst.b) as f64;
            let comp = inst.c[i] * inst.d as f64 * tb as f64 / k as f64
                + nb * inst.q(i) * a.iter().copied().sum::<Expression>();
            let big = inst.c[i] * inst.d as f64 * tb as f64 / k as f64
                + nb * inst.q(i) * n as f64
                + nb * (gmax + inst.lat);
            let q = nb * g[i] + nb * inst.lat;
            model = model.with(constraint!(
                t >= comp.clone() + inst.f * q.clone() - big + big * zi
            ));
            model = model.with(constraint!(t >= inst.f * comp + q - big + big * zi));
        }
    }
    model = model.with(constraint!(blocks == k as f64));
    let sol = model.solve().ok()?;
    Some(sol.value(t))
}

fn milp(inst: &Inst) -> f64 {
    (1..inst.n().min(inst.k as usize + 1))
        .filter_map(|w| milp_for_w(inst, w))
        .fold(f64::INFINITY, f64::min)
}

proptest! {
    #![proptest_config(common::proptest_config(64))]

    #[test]
    fn equals_exact_milp(inst in instances(2..=5, 5, 3)) {
        let model = CostModel::new(&inst.snapshot()).unwrap();
        let sol = solve(&model).unwrap();
        let exact = milp(&inst);
        prop_assert!(exact.is_finite(), "MILP infeasible for {inst:?}");
        // The solver is exact up to 10 containers: it matches the MILP within the
        // MILP's own numerical tolerance, from both sides.
        prop_assert!(
            sol.epoch_secs <= exact * (1.0 + 1e-6),
            "solver {} above MILP {} on {inst:?}", sol.epoch_secs, exact
        );
        prop_assert!(sol.epoch_secs >= exact * (1.0 - 1e-6), "solver {} below MILP {}", sol.epoch_secs, exact);
    }
}
