//! Plans: properties over random configurations and hand-checked cases.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use cruise_optimizer::plan::apply_op;
use cruise_optimizer::{Configuration, Holding, Operation, Placement, Plan, Role, Table, Target};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn holding(role: Role, input: &[u32], model: &[u32]) -> Holding {
    Holding {
        role,
        input: input.iter().copied().collect(),
        model: model.iter().copied().collect(),
    }
}

fn place(role: Role, k: u32, l: u32) -> Placement {
    Placement {
        role,
        input_blocks: k,
        model_blocks: l,
    }
}

/// The configuration (by counts) a plan should lead to: target non-idle containers.
fn expected(target: &Target) -> Target {
    target
        .iter()
        .filter(|(_, p)| p.role != Role::Idle)
        .map(|(id, p)| (id.clone(), *p))
        .collect()
}

/// Applies the plan's operations in a random order that respects the dependencies.
fn apply_random_order(
    plan: &Plan,
    start: &Configuration,
    choices: &[usize],
) -> Result<Configuration, cruise_optimizer::OptimizerError> {
    let mut done = vec![false; plan.ops.len()];
    let mut c = start.clone();
    for step in 0..plan.ops.len() {
        let ready: Vec<usize> = (0..plan.ops.len())
            .filter(|&i| !done[i] && plan.ops[i].deps.iter().all(|&d| done[d]))
            .collect();
        let i = ready[choices[step % choices.len()] % ready.len()];
        cruise_optimizer::plan::apply_op(&mut c, i, &plan.ops[i].op)?;
        done[i] = true;
    }
    Ok(c)
}

#[derive(Debug, Clone)]
struct Case {
    current: Configuration,
    target: Target,
    order: Vec<usize>,
}

fn role_of(x: u8) -> Role {
    [Role::Worker, Role::Server, Role::Idle][x as usize % 3]
}

fn cases() -> impl Strategy<Value = Case> {
    (2usize..9, 1u32..24, 1u32..12).prop_flat_map(|(n, k, l)| {
        (
            proptest::collection::vec(0u8..3, n),
            proptest::collection::vec(0u8..3, n),
            proptest::collection::vec(any::<prop::sample::Index>(), k as usize),
            proptest::collection::vec(any::<prop::sample::Index>(), l as usize),
            proptest::collection::vec(any::<prop::sample::Index>(), k as usize),
            proptest::collection::vec(any::<prop::sample::Index>(), l as usize),
            proptest::collection::vec(0usize..1000, 1..40),
        )
            .prop_map(move |(cur, tgt, ci, cm, ti, tm, order)| {
                let mut cur: Vec<Role> = cur.into_iter().map(role_of).collect();
                let mut tgt: Vec<Role> = tgt.into_iter().map(role_of).collect();
                // At least one worker and one server, now and in the target.
                for roles in [&mut cur, &mut tgt] {
                    if !roles.contains(&Role::Worker) {
                        roles[0] = Role::Worker;
                    }
                    if !roles.contains(&Role::Server) {
                        let x = if roles[1] == Role::Worker && roles[0] != Role::Worker {
                            0
                        } else {
                            1
                        };
                        roles[x] = Role::Server;
                        if !roles.contains(&Role::Worker) {
                            roles[1 - x] = Role::Worker;
                        }
                    }
                }
                let ids: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
                let members = |roles: &[Role], r: Role| -> Vec<usize> {
                    (0..n).filter(|&i| roles[i] == r).collect()
                };
                let mut current = Configuration::default();
                for (i, id) in ids.iter().enumerate() {
                    current
                        .containers
                        .insert(id.clone(), holding(cur[i], &[], &[]));
                }
                let (cw, cs) = (members(&cur, Role::Worker), members(&cur, Role::Server));
                for (b, x) in ci.iter().enumerate() {
                    let owner = &ids[cw[x.index(cw.len())]];
                    current
                        .containers
                        .get_mut(owner)
                        .unwrap()
                        .input
                        .insert(b as u32);
                }
                for (b, x) in cm.iter().enumerate() {
                    let owner = &ids[cs[x.index(cs.len())]];
                    current
                        .containers
                        .get_mut(owner)
                        .unwrap()
                        .model
                        .insert(b as u32);
                }
                let (tw, ts) = (members(&tgt, Role::Worker), members(&tgt, Role::Server));
                let mut counts = vec![(0u32, 0u32); n];
                for x in &ti {
                    counts[tw[x.index(tw.len())]].0 += 1;
                }
                for x in &tm {
                    counts[ts[x.index(ts.len())]].1 += 1;
                }
                let mut target = Target::new();
                for (i, id) in ids.iter().enumerate() {
                    // Workers/servers that got no block become idle (deleted).
                    let p = match tgt[i] {
                        Role::Worker if counts[i].0 > 0 => place(Role::Worker, counts[i].0, 0),
                        Role::Server if counts[i].1 > 0 => place(Role::Server, 0, counts[i].1),
                        _ => Placement::IDLE,
                    };
                    target.insert(id.clone(), p);
                }
                Case {
                    current,
                    target,
                    order,
                }
            })
    })
}

fn surplus(current: &Configuration, target: &Target, t: Table) -> (u32, usize, usize) {
    let mut moved = 0;
    let (mut givers, mut takers) = (0, 0);
    for (id, h) in &current.containers {
        let have = match t {
            Table::Input => h.input.len() as u32,
            Table::Model => h.model.len() as u32,
        };
        let p = target.get(id).copied().unwrap_or(Placement::IDLE);
        let want = match t {
            Table::Input => p.input_blocks,
            Table::Model => p.model_blocks,
        };
        if have > want {
            moved += have - want;
            givers += 1;
        } else if want > have {
            takers += 1;
        }
    }
    (moved, givers, takers)
}

fn check(case: &Case) -> Result<(), TestCaseError> {
    let plan = Plan::between(&case.current, &case.target).unwrap();
    prop_assert!(plan.validate().is_ok());
    for (i, p) in plan.ops.iter().enumerate() {
        prop_assert!(
            p.deps.iter().all(|&d| d < i),
            "op {i} depends on a later one"
        );
    }
    let (n_in, n_model) = case.current.validate().unwrap();
    // In plan order and in a random dependency-respecting order, the plan applies
    // cleanly and reaches the target; every block keeps exactly one owner.
    for after in [
        plan.apply(&case.current).unwrap(),
        apply_random_order(&plan, &case.current, &case.order).unwrap(),
    ] {
        prop_assert_eq!(after.counts(), expected(&case.target));
        prop_assert_eq!(after.validate().unwrap(), (n_in, n_model));
        for h in after.containers.values() {
            prop_assert!(h.role != Role::Idle);
            prop_assert!(h.input.is_empty() || h.role == Role::Worker);
            prop_assert!(h.model.is_empty() || h.role == Role::Server);
        }
    }
    // Only the blocks that must move do, in at most givers + takers − 1 moves per table.
    let (moved_in, moved_model) = plan.blocks_moved();
    for (t, moved) in [(Table::Input, moved_in), (Table::Model, moved_model)] {
        let (must, givers, takers) = surplus(&case.current, &case.target, t);
        prop_assert_eq!(moved, must);
        let moves = plan
            .ops
            .iter()
            .filter(|p| matches!(&p.op, Operation::Move { table, .. } if *table == t))
            .count();
        prop_assert!(moves <= (givers + takers).saturating_sub(1));
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::proptest_config(512))]

    #[test]
    fn plan_reaches_target_in_any_valid_order(case in cases()) {
        check(&case)?;
    }
}

fn config(spec: &[(&str, Role, &[u32], &[u32])]) -> Configuration {
    Configuration {
        containers: spec
            .iter()
            .map(|(id, r, i, m)| (id.to_string(), holding(*r, i, m)))
            .collect(),
    }
}

fn index_of(plan: &Plan, f: impl Fn(&Operation) -> bool) -> usize {
    plan.ops.iter().position(|p| f(&p.op)).unwrap()
}

#[test]
fn greedy_pairs_largest_surplus_with_largest_deficit() {
    let current = config(&[
        ("a", Role::Worker, &[0, 1, 2, 3, 4, 5, 6], &[]),
        ("b", Role::Worker, &[7, 8, 9], &[]),
        ("c", Role::Worker, &[], &[]),
        ("d", Role::Worker, &[10], &[]),
        ("s", Role::Server, &[], &[0]),
    ]);
    // a: 7 → 2 (surplus 5), b: 3 → 2 (surplus 1), c: 0 → 4 (deficit 4), d: 1 → 3 (deficit 2).
    let target: Target = [
        ("a", place(Role::Worker, 2, 0)),
        ("b", place(Role::Worker, 2, 0)),
        ("c", place(Role::Worker, 4, 0)),
        ("d", place(Role::Worker, 3, 0)),
        ("s", place(Role::Server, 0, 1)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let plan = Plan::between(&current, &target).unwrap();
    let moves: Vec<(String, String, usize)> = plan
        .ops
        .iter()
        .filter_map(|p| match &p.op {
            Operation::Move {
                from, to, blocks, ..
            } => Some((from.clone(), to.clone(), blocks.len())),
            _ => None,
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            ("a".into(), "c".into(), 4),
            ("a".into(), "d".into(), 1),
            ("b".into(), "d".into(), 1),
        ]
    );
    // a gives its highest block ids and keeps the lowest.
    let after = plan.apply(&current).unwrap();
    assert_eq!(after.containers["a"].input, BTreeSet::from([0, 1]));
}

#[test]
fn dependencies_add_switch_delete() {
    // n is new and becomes a server; w1 switches worker → server; s1 switches server →
    // worker; w2 is reclaimed (absent from the target).
    let current = config(&[
        ("n", Role::Idle, &[], &[]),
        ("w1", Role::Worker, &[0, 1], &[]),
        ("w2", Role::Worker, &[2, 3], &[]),
        ("s1", Role::Server, &[], &[0, 1]),
        ("s2", Role::Server, &[], &[2, 3]),
    ]);
    let target: Target = [
        ("n", place(Role::Server, 0, 1)),
        ("w1", place(Role::Server, 0, 1)),
        ("s1", place(Role::Worker, 4, 0)),
        ("s2", place(Role::Server, 0, 2)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let plan = Plan::between(&current, &target).unwrap();
    let add = index_of(
        &plan,
        |o| matches!(o, Operation::Add { container, role: Role::Server } if container == "n"),
    );
    let del = index_of(
        &plan,
        |o| matches!(o, Operation::Delete { container } if container == "w2"),
    );
    let sw_w1 = index_of(
        &plan,
        |o| matches!(o, Operation::Switch { container, to_role: Role::Server } if container == "w1"),
    );
    let sw_s1 = index_of(
        &plan,
        |o| matches!(o, Operation::Switch { container, to_role: Role::Worker } if container == "s1"),
    );
    let deps = |i: usize| -> BTreeSet<usize> {
        // transitive dependencies
        let mut out = BTreeSet::new();
        let mut stack = vec![i];
        while let Some(x) = stack.pop() {
            for &d in &plan.ops[x].deps {
                if out.insert(d) {
                    stack.push(d);
                }
            }
        }
        out
    };
    for (i, p) in plan.ops.iter().enumerate() {
        if let Operation::Move {
            table, from, to, ..
        } = &p.op
        {
            if to == "n" {
                assert!(deps(i).contains(&add), "move into n before its add");
            }
            if from == "w2" {
                assert!(deps(del).contains(&i), "delete of w2 before its move out");
            }
            if from == "w1" && *table == Table::Input {
                assert!(
                    deps(sw_w1).contains(&i),
                    "w1 switched before its input left"
                );
            }
            if from == "s1" && *table == Table::Model {
                assert!(
                    deps(sw_s1).contains(&i),
                    "s1 switched before its model left"
                );
            }
            let relaxed = plan.relaxed.contains(&(sw_w1, i)) || plan.relaxed.contains(&(sw_s1, i));
            if to == "w1" && *table == Table::Model && !relaxed {
                assert!(
                    deps(i).contains(&sw_w1),
                    "model moved into w1 before it serves"
                );
            }
            if to == "s1" && *table == Table::Input && !relaxed {
                assert!(
                    deps(i).contains(&sw_s1),
                    "input moved into s1 before it works"
                );
            }
        }
    }
    let after = plan.apply(&current).unwrap();
    assert_eq!(after.counts(), expected(&target));
    assert!(!after.containers.contains_key("w2"));
}

/// `a` (a worker) and `b` (a server) trade roles and all their blocks.
fn role_trade() -> (Configuration, Target) {
    let current = config(&[
        ("a", Role::Worker, &[0, 1], &[]),
        ("b", Role::Server, &[], &[0, 1]),
    ]);
    let target: Target = [
        ("a", place(Role::Server, 0, 2)),
        ("b", place(Role::Worker, 2, 0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    (current, target)
}

/// In a trade beside a worker that keeps training, the input waits on the
/// server about to work: no worker ever holds model blocks. Alone, the
/// pair trade the other way, so that someone trains throughout.
#[test]
fn a_trade_beside_a_steady_worker_never_gives_a_worker_the_model() {
    let current = config(&[
        ("a", Role::Worker, &[0, 1], &[]),
        ("b", Role::Server, &[], &[0, 1]),
        ("c", Role::Worker, &[2, 3], &[]),
    ]);
    let target: Target = [
        ("a", place(Role::Server, 0, 2)),
        ("b", place(Role::Worker, 2, 0)),
        ("c", place(Role::Worker, 2, 0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let plan = Plan::between(&current, &target).unwrap();
    assert_eq!(plan.relaxed.len(), 1, "{plan:?}");
    let mut c = current.clone();
    let mut trained_throughout = true;
    for (i, p) in plan.ops.iter().enumerate() {
        apply_op(&mut c, i, &p.op).unwrap();
        for (id, h) in &c.containers {
            assert!(
                h.role != Role::Worker || h.model.is_empty(),
                "after op {i}, worker {id} holds model blocks: {plan:?}"
            );
        }
        trained_throughout &= c.containers["c"].role == Role::Worker;
    }
    assert!(trained_throughout);
    assert_eq!(c.counts(), expected(&target));

    // Without `c`, the model edge gives way: at every step a worker trains.
    let (alone, target) = role_trade();
    let plan = Plan::between(&alone, &target).unwrap();
    let mut c = alone.clone();
    for (i, p) in plan.ops.iter().enumerate() {
        apply_op(&mut c, i, &p.op).unwrap();
        assert!(
            c.containers
                .values()
                .any(|h| h.role == Role::Worker && !h.input.is_empty()),
            "after op {i} nobody trains: {plan:?}"
        );
    }
}

#[test]
fn direct_role_trade_relaxes_an_edge_instead_of_cycling() {
    // a and b trade roles and all their blocks: the strict rules would form a cycle.
    let (current, target) = role_trade();
    let plan = Plan::between(&current, &target).unwrap();
    assert!(!plan.relaxed.is_empty());
    plan.validate().unwrap();
    let after = plan.apply(&current).unwrap();
    assert_eq!(after.counts(), expected(&target));
}

#[test]
fn same_configuration_gives_an_empty_plan() {
    let current = config(&[
        ("a", Role::Worker, &[0, 1], &[]),
        ("b", Role::Server, &[], &[0]),
    ]);
    let plan = Plan::between(&current, &current.counts()).unwrap();
    assert!(plan.is_empty());
}

#[test]
fn bad_targets_are_rejected() {
    let current = config(&[
        ("a", Role::Worker, &[0], &[]),
        ("b", Role::Server, &[], &[0]),
    ]);
    let mut t: BTreeMap<String, Placement> = current.counts();
    t.insert("zz".into(), place(Role::Worker, 1, 0));
    assert!(Plan::between(&current, &t).is_err());
    let mut t = current.counts();
    t.insert("a".into(), place(Role::Worker, 2, 0));
    assert!(Plan::between(&current, &t).is_err());
    let mut t = current.counts();
    t.insert("b".into(), place(Role::Server, 1, 1));
    assert!(Plan::between(&current, &t).is_err());
}
