//! The plan executor against a mock runtime, on paused tokio time (no real sleeps).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cruise_optimizer::{
    Configuration, ExecutorConfig, ExecutorError, Holding, OpError, OpOutcome, OpReport, Operation,
    OperationRunner, Placement, Plan, PlanExecutor, PlannedOp, Role, SkipReason, Table, Target,
};
use tokio_util::sync::CancellationToken;

/// A runtime whose operations take a virtual time (paused clock) and can be made to fail.
#[derive(Default)]
struct Mock {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Operations that fail, matched by their debug text containing the key.
    fail: Vec<String>,
    /// Virtual seconds per operation, matched like `fail`; default 1 s.
    secs: Vec<(String, u64)>,
    started: Mutex<Vec<Operation>>,
    /// Cancelled when the operation containing this text starts.
    cancel_on: Option<(String, CancellationToken)>,
}

impl OperationRunner for Mock {
    fn execute(
        &self,
        op: &Operation,
    ) -> impl std::future::Future<Output = Result<OpReport, OpError>> + Send {
        let text = format!("{op:?}");
        let secs = self
            .secs
            .iter()
            .find(|(k, _)| text.contains(k.as_str()))
            .map_or(1, |(_, s)| *s);
        let fails = self.fail.iter().any(|k| text.contains(k.as_str()));
        self.started.lock().unwrap().push(op.clone());
        if let Some((k, token)) = &self.cancel_on
            && text.contains(k.as_str())
        {
            token.cancel();
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if fails {
                Err(OpError::new(format!("injected failure of {text}")))
            } else {
                Ok(OpReport {
                    bytes_moved: 100,
                    reloaded: false,
                })
            }
        }
    }
}

fn independent_moves(n: usize) -> Plan {
    Plan {
        ops: (0..n)
            .map(|i| PlannedOp {
                op: Operation::Move {
                    table: Table::Input,
                    blocks: vec![i as u32],
                    from: format!("src{i}"),
                    to: format!("dst{i}"),
                },
                deps: vec![],
            })
            .collect(),
        relaxed: vec![],
    }
}

#[tokio::test(start_paused = true)]
async fn concurrency_bound_is_respected_and_reached() {
    let plan = independent_moves(20);
    let mock = Mock::default();
    let exec = PlanExecutor::new(ExecutorConfig { max_parallel: 3 });
    let report = exec
        .execute(&plan, &mock, &CancellationToken::new())
        .await
        .unwrap();
    assert!(report.all_succeeded());
    assert_eq!(mock.max_in_flight.load(Ordering::SeqCst), 3);
    // 20 one-second operations, 3 at a time: ⌈20/3⌉ = 7 virtual seconds.
    assert_eq!(report.elapsed, Duration::from_secs(7));
    // Ready operations start in plan order.
    let started = mock.started.lock().unwrap();
    let order: Vec<u32> = started
        .iter()
        .map(|o| match o {
            Operation::Move { blocks, .. } => blocks[0],
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(order, (0..20).collect::<Vec<u32>>());
}

fn scenario() -> (Configuration, Target) {
    let h = |role, input: &[u32], model: &[u32]| Holding {
        role,
        input: input.iter().copied().collect(),
        model: model.iter().copied().collect(),
    };
    let current = Configuration {
        containers: BTreeMap::from([
            ("new".to_string(), h(Role::Idle, &[], &[])),
            ("w1".to_string(), h(Role::Worker, &[0, 1, 2, 3], &[])),
            ("w2".to_string(), h(Role::Worker, &[4, 5, 6, 7], &[])),
            ("s1".to_string(), h(Role::Server, &[], &[0, 1, 2, 3])),
            ("s2".to_string(), h(Role::Server, &[], &[4, 5])),
        ]),
    };
    let p = |role, k, l| Placement {
        role,
        input_blocks: k,
        model_blocks: l,
    };
    // "new" becomes a worker taking 2 blocks from w1; s1 gives a model block to s2;
    // w2 keeps its blocks.
    let target = Target::from([
        ("new".to_string(), p(Role::Worker, 2, 0)),
        ("w1".to_string(), p(Role::Worker, 2, 0)),
        ("w2".to_string(), p(Role::Worker, 4, 0)),
        ("s1".to_string(), p(Role::Server, 0, 3)),
        ("s2".to_string(), p(Role::Server, 0, 3)),
    ]);
    (current, target)
}

#[tokio::test(start_paused = true)]
async fn failure_skips_dependents_and_independent_branches_run() {
    let (current, target) = scenario();
    let plan = Plan::between(&current, &target).unwrap();
    let add = plan
        .ops
        .iter()
        .position(|p| matches!(p.op, Operation::Add { .. }))
        .unwrap();
    let mock = Mock {
        fail: vec!["Add".into()],
        ..Mock::default()
    };
    let exec = PlanExecutor::new(ExecutorConfig { max_parallel: 4 });
    let report = exec
        .execute(&plan, &mock, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.failed(), vec![add]);
    let dependents = plan.dependents(add);
    assert!(!dependents.is_empty());
    for (i, o) in report.outcomes.iter().enumerate() {
        if i == add {
            assert!(
                matches!(o, OpOutcome::Failed { error, .. } if error.message.contains("injected"))
            );
        } else if dependents.contains(&i) {
            assert_eq!(
                o,
                &OpOutcome::Skipped {
                    reason: SkipReason::DependencyFailed { failed: add }
                }
            );
        } else {
            // The model move s1 → s2 does not depend on the add and still ran.
            assert!(matches!(o, OpOutcome::Succeeded { .. }), "op {i}: {o:?}");
        }
    }
    assert!(plan.ops.iter().enumerate().any(|(i, p)| {
        matches!(
            &p.op,
            Operation::Move {
                table: Table::Model,
                ..
            }
        ) && report.succeeded(i)
    }));
    // The job is left consistent: every block has one owner, the failed add left "new" idle.
    let after = report.resulting_configuration(&plan, &current).unwrap();
    assert_eq!(after.validate().unwrap(), (8, 6));
    assert_eq!(after.containers["new"].role, Role::Idle);
    assert_eq!(after.containers["w1"].input.len(), 4);
    assert_eq!(after.containers["s2"].model.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn cancellation_lets_running_operations_finish() {
    let plan = independent_moves(6);
    let token = CancellationToken::new();
    let mock = Mock {
        // Op 0 takes 5 s, op 1 takes 1 s; op 1's start cancels the plan.
        secs: vec![("[0]".into(), 5)],
        cancel_on: Some(("[1]".into(), token.clone())),
        ..Mock::default()
    };
    let exec = PlanExecutor::new(ExecutorConfig { max_parallel: 2 });
    let report = exec.execute(&plan, &mock, &token).await.unwrap();
    assert!(matches!(
        report.outcomes[0],
        OpOutcome::Succeeded { duration, .. } if duration == Duration::from_secs(5)
    ));
    assert!(matches!(report.outcomes[1], OpOutcome::Succeeded { .. }));
    for o in &report.outcomes[2..] {
        assert_eq!(
            o,
            &OpOutcome::Skipped {
                reason: SkipReason::Cancelled
            }
        );
    }
    assert_eq!(mock.started.lock().unwrap().len(), 2);
    assert_eq!(report.elapsed, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn chain_respects_dependencies_and_measures_durations() {
    let (current, target) = scenario();
    let plan = Plan::between(&current, &target).unwrap();
    let mock = Mock {
        secs: vec![("Add".into(), 3)],
        ..Mock::default()
    };
    let exec = PlanExecutor::new(ExecutorConfig::default());
    let report = exec
        .execute(&plan, &mock, &CancellationToken::new())
        .await
        .unwrap();
    assert!(report.all_succeeded());
    // Every operation started only after its dependencies: check the start order.
    let started = mock.started.lock().unwrap();
    let pos: BTreeMap<usize, usize> = plan
        .ops
        .iter()
        .enumerate()
        .map(|(i, p)| (i, started.iter().position(|o| *o == p.op).unwrap()))
        .collect();
    for (i, p) in plan.ops.iter().enumerate() {
        for d in &p.deps {
            assert!(pos[d] < pos[&i]);
        }
    }
    // Add (3 s) then the move into "new" (1 s): 4 s critical path.
    assert_eq!(report.elapsed, Duration::from_secs(4));
    let after = report.resulting_configuration(&plan, &current).unwrap();
    assert_eq!(
        after.counts(),
        target.into_iter().collect::<BTreeMap<String, Placement>>()
    );
}

#[tokio::test(start_paused = true)]
async fn one_plan_at_a_time() {
    let plan = independent_moves(2);
    let mock = Mock::default();
    let exec = PlanExecutor::new(ExecutorConfig { max_parallel: 1 });
    let token = CancellationToken::new();
    let first = exec.execute(&plan, &mock, &token);
    let second = async {
        // Runs after `first` has taken the lock (join polls `first` first).
        exec.execute(&plan, &mock, &token).await
    };
    let (a, b) = tokio::join!(first, second);
    assert!(a.unwrap().all_succeeded());
    assert_eq!(b.unwrap_err(), ExecutorError::Busy);
}

#[tokio::test(start_paused = true)]
async fn malformed_plan_is_rejected() {
    let mut plan = independent_moves(2);
    plan.ops[0].deps = vec![1];
    let exec = PlanExecutor::new(ExecutorConfig::default());
    let err = exec
        .execute(&plan, &Mock::default(), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ExecutorError::InvalidPlan(_)));
}
