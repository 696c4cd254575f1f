//! The heterogeneous solver against exhaustive search on small random instances: up to
//! 10 containers the solver must equal brute force (within 1e-9, relative).
//!
//! The default case counts keep this to a few seconds; for a deeper run, e.g.
//! `PROPTEST_CASES=5000 cargo test --release -p cruise-optimizer --test brute_force`.
//! Failures are saved in `tests/brute_force.proptest-regressions` and replayed first.

mod common;

use common::{Inst, brute_force, instances};
use cruise_optimizer::{CostModel, Role, solve};
use proptest::prelude::*;

fn check(inst: &Inst) -> Result<(), TestCaseError> {
    let model = CostModel::new(&inst.snapshot()).unwrap();
    let sol = solve(&model).unwrap();
    // The crate's prediction for its own target agrees with the independent oracle.
    let kk: Vec<u32> = (0..inst.n())
        .map(|i| sol.target[&format!("c{i}")].input_blocks)
        .collect();
    let ll: Vec<u32> = (0..inst.n())
        .map(|i| sol.target[&format!("c{i}")].model_blocks)
        .collect();
    let oracle = inst.epoch(&kk, &ll);
    prop_assert!(
        (oracle - sol.epoch_secs).abs() <= 1e-9 * oracle,
        "oracle {oracle} vs {}",
        sol.epoch_secs
    );
    for p in sol.target.values() {
        let consistent = match p.role {
            Role::Worker => p.input_blocks > 0 && p.model_blocks == 0,
            Role::Server => p.model_blocks > 0 && p.input_blocks == 0,
            Role::Idle => p.input_blocks == 0 && p.model_blocks == 0,
        };
        prop_assert!(consistent, "inconsistent placement {:?}", p);
    }
    let best = brute_force(inst);
    prop_assert!(
        sol.epoch_secs <= best * (1.0 + 1e-9),
        "solver {} > brute force {} ({:.4}% worse) on {inst:?}",
        sol.epoch_secs,
        best,
        (sol.epoch_secs / best - 1.0) * 100.0
    );
    prop_assert!(sol.epoch_secs >= best * (1.0 - 1e-9), "below the optimum?");
    Ok(())
}

proptest! {
    #![proptest_config(common::proptest_config(256))]

    #[test]
    fn equals_brute_force_up_to_seven_containers(inst in instances(2..=7, 7, 4)) {
        check(&inst)?;
    }
}

proptest! {
    #![proptest_config(common::proptest_config(24))]

    #[test]
    fn equals_brute_force_eight_to_ten_containers(inst in instances(8..=10, 4, 3)) {
        check(&inst)?;
    }
}

/// The instance proptest found where the first search version was 1.5% off.
#[test]
fn regression_nine_containers() {
    let inst = Inst {
        q: Vec::new(),
        fixed: Vec::new(),
        f: 1.0,
        lat: 0.0,
        d: 231,
        b: 41,
        m: 1000000.0,
        ml: 1000000.0,
        k: 3,
        l: 3,
        c: vec![
            0.006569284109258227,
            0.007144985798774926,
            0.004999758916452319,
            0.0032952488910805325,
            0.00685900433660527,
            0.002209792849417459,
            0.004715583012387302,
            0.004186324305723864,
            0.00634847833654943,
        ],
        bw: vec![
            6946876.2893401645,
            3612838.2094968073,
            2097041.609340099,
            4705727.721329295,
            8510724.020828763,
            3582737.840564016,
            9001864.882495325,
            8075319.883333093,
            5956599.4272736125,
        ],
        p: vec![
            8.023392025191041e-8,
            4.543892105329134e-8,
            7.761458696619273e-8,
            4.2455678371075566e-10,
            2.9676765405228754e-8,
            1.1344220562314437e-9,
            4.124089191094228e-8,
            1.808504678645844e-8,
            6.173625617479406e-8,
        ],
        links: vec![],
    };
    let model = CostModel::new(&inst.snapshot()).unwrap();
    let sol = solve(&model).unwrap();
    eprintln!("solver: {:?} {}", sol.target, sol.epoch_secs);
    eprintln!("brute: {:?}", common::brute_force_arg(&inst));
    check(&inst).unwrap();
}

#[test]
fn regression_three_containers_one_block() {
    let inst = Inst {
        q: Vec::new(),
        fixed: Vec::new(),
        f: 1.0,
        lat: 0.0,
        d: 10,
        b: 7,
        m: 1000000.0,
        ml: 1000000.0,
        k: 1,
        l: 2,
        c: vec![
            0.009426781832779525,
            0.008373679884820073,
            0.008831094529286097,
        ],
        bw: vec![5309280.199155351, 5780859.503873785, 8788844.754865598],
        p: vec![
            1.084753751187437e-8,
            2.7428616807582932e-9,
            6.111238365593254e-8,
        ],
        links: vec![],
    };
    let model = CostModel::new(&inst.snapshot()).unwrap();
    let sol = solve(&model).unwrap();
    eprintln!("solver: {:?} {}", sol.target, sol.epoch_secs);
    eprintln!("brute: {:?}", common::brute_force_arg(&inst));
    check(&inst).unwrap();
}

/// The local-search path (enumeration switched off) on random instances: how often it
/// finds the exact optimum and how far off it is otherwise.
#[test]
fn local_search_quality() {
    use cruise_optimizer::{SearchOptions, solve_heterogeneous_with};
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7u8; 32]),
    );
    let strategy = instances(3..=8, 6, 4);
    // Per kind of instance: serial workers (f = 1, Cruise's model) and
    // overlapping ones (f < 1): (exact, total, worst gap).
    let mut stats = [(0, 0, 0.0f64); 2];
    for _ in 0..150 {
        let inst = strategy.new_tree(&mut runner).unwrap().current();
        let model = CostModel::new(&inst.snapshot()).unwrap();
        let opts = SearchOptions {
            exhaustive_up_to: 0,
            ..SearchOptions::default()
        };
        let sol = solve_heterogeneous_with(&model, opts).unwrap();
        let best = brute_force(&inst);
        let gap = sol.epoch_secs / best - 1.0;
        assert!(gap >= -1e-9);
        let s = &mut stats[usize::from(inst.f < 1.0)];
        s.1 += 1;
        if gap <= 1e-9 {
            s.0 += 1;
        }
        s.2 = s.2.max(gap);
    }
    for (kind, (exact, total, worst)) in ["serial", "overlapping"].iter().zip(stats) {
        eprintln!(
            "local search, {kind} workers: {exact}/{total} exact, worst gap {:.3}%",
            worst * 100.0
        );
        // Regression guard near the level measured when this test was written:
        // 146/150 exact and 7.7% worst over serial instances only; with
        // overlapping ones drawn too, serial 51/54 and 12.1%, overlapping 93/96
        // and 12.8% (the exact solver, used up to 10 containers, is checked
        // against brute force above).
        assert!(exact * 100 >= total * 90, "{kind}: {exact}/{total} exact");
        assert!(worst < 0.15, "{kind}: worst gap {worst}");
    }
}

#[test]
fn regression_ten_containers() {
    let inst = Inst {
        q: Vec::new(),
        fixed: Vec::new(),
        f: 1.0,
        lat: 0.0,
        d: 231,
        b: 41,
        m: 1000000.0,
        ml: 1000000.0,
        k: 3,
        l: 3,
        c: vec![
            0.007660952039533974,
            0.009287243543059022,
            0.001,
            0.0051124147815043335,
            0.004067420632599174,
            0.001,
            0.007285754317150373,
            0.008085756738476108,
            0.005713920610810046,
            0.009701069291400691,
        ],
        bw: vec![
            1000000.0,
            1000000.0,
            1000000.0,
            3558860.75777912,
            1000000.0,
            1000000.0,
            1000000.0,
            1000000.0,
            9643240.620312931,
            9645154.57897815,
        ],
        p: vec![
            0.0,
            0.0,
            0.0,
            0.0,
            1.0234749291860253e-8,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
        ],
        links: vec![],
    };
    let model = CostModel::new(&inst.snapshot()).unwrap();
    let sol = solve(&model).unwrap();
    eprintln!("solver: {:?} {}", sol.target, sol.epoch_secs);
    eprintln!("brute: {:?}", common::brute_force_arg(&inst));
    check(&inst).unwrap();
}

/// The instance proptest found where the solver was 10.6% off (six containers, K = 3,
/// L = 4): it ranked role assignments by their proportional model split and refined only
/// the best 64, and the optimal assignment was not among them.
#[test]
fn regression_six_containers_four_model_blocks() {
    let inst = Inst {
        q: Vec::new(),
        fixed: Vec::new(),
        f: 1.0,
        lat: 0.0,
        d: 510,
        b: 49,
        m: 1000000.0,
        ml: 1000000.0,
        k: 3,
        l: 4,
        c: vec![
            0.005657818646353223,
            0.003912066683086042,
            0.006233849429639916,
            0.007433092887838939,
            0.001,
            0.005613709306457073,
        ],
        bw: vec![
            8585195.042058157,
            7788710.094882813,
            4984436.805386418,
            8376879.721750535,
            3596714.8618898205,
            3784665.8176227477,
        ],
        p: vec![
            3.202108195491033e-8,
            5.4938430186801774e-9,
            2.0355155091460923e-8,
            8.409273691503043e-8,
            0.0,
            0.0,
        ],
        links: vec![],
    };
    check(&inst).unwrap();
}

/// The node budget bounds the exact search without making it worse than its
/// start: with no nodes the answer is the heuristic one and marked inexact;
/// every larger budget gives an epoch time no worse; an unbounded one is
/// exact and equals enumeration.
#[test]
fn node_budget_trades_the_proof_not_feasibility() {
    use cruise_optimizer::{SearchOptions, solve_heterogeneous_with};
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[11u8; 32]),
    );
    let strategy = instances(3..=7, 6, 5);
    let mut cut = 0;
    for _ in 0..60 {
        let inst = strategy.new_tree(&mut runner).unwrap().current();
        let model = CostModel::new(&inst.snapshot()).unwrap();
        let best = brute_force(&inst);
        let mut last = f64::INFINITY;
        for node_budget in [0, 3, 30, 300, usize::MAX] {
            let opts = SearchOptions {
                node_budget,
                ..SearchOptions::default()
            };
            let sol = solve_heterogeneous_with(&model, opts).unwrap();
            assert!(
                sol.epoch_secs >= best * (1.0 - 1e-9),
                "budget {node_budget}: {} below the optimum {best}",
                sol.epoch_secs
            );
            assert!(
                sol.epoch_secs <= last * (1.0 + 1e-9),
                "budget {node_budget}: {} worse than a smaller budget's {last}",
                sol.epoch_secs
            );
            if node_budget == usize::MAX {
                assert!(sol.exact);
                assert!((sol.epoch_secs - best).abs() <= 1e-9 * best);
            } else if !sol.exact {
                cut += 1;
            }
            last = sol.epoch_secs;
        }
    }
    // Small budgets do stop searches here (else the test would check nothing).
    assert!(cut > 0);
}
