//! Live reconfiguration on the in-process cluster: capacity offered and
//! taken back, and a plan whose operation fails.

use std::path::Path;
use std::time::Duration;

use cruise_appmaster::am::{self, JobSummary, Progress};
use cruise_appmaster::harness::{self, Cluster, ClusterOptions};
use cruise_conf::{CruiseConfig, ScaleInInput};
use cruise_container::protocol::EvaluatorId;

const WAIT: Duration = Duration::from_secs(120);

fn data(dir: &Path, samples: u64) -> String {
    harness::mlr_data(dir, samples, 3).unwrap()
}

/// A job that reconsiders its configuration every 100 ms.
fn config(containers: u32, workers: u32, epochs: u32) -> CruiseConfig {
    let mut c = CruiseConfig::default();
    c.job.containers = containers;
    c.job.workers = workers;
    c.job.epochs = epochs;
    c.job.mini_batch = 50;
    c.mlr.classes = 4;
    c.mlr.features = 100;
    // As in cluster.rs: the default step (10) makes this small job's loss spike.
    c.mlr.step_size = 4.0;
    c.store.model_blocks = 16;
    c.store.input_blocks = 16;
    c.status.bind = String::new();
    c.optimizer.interval_ms = 100;
    c.optimizer.min_mini_batches = 3;
    c.optimizer.warmup_mini_batches = 1;
    c.optimizer.confirmations = 1;
    // In-process containers start in a fraction of a second.
    c.optimizer.prior_add_secs = 0.2;
    c.optimizer.prior_delete_secs = 0.1;
    c.validate().unwrap();
    c
}

/// Captures the job's log at info (RUST_LOG overrides); the test harness
/// shows it if the test fails.
fn log_on_failure() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}

/// Every record is evaluated exactly once at the end: no input block was
/// lost or duplicated by the reconfigurations.
fn consistent(s: &JobSummary) {
    assert_eq!(
        s.final_stats.records, s.records,
        "final evaluation covers every record once"
    );
    assert!(
        s.final_stats.accuracy() > 0.7,
        "accuracy {}",
        s.final_stats.accuracy()
    );
}

/// Cancels an endless job and waits for it to end.
async fn stop(cluster: Cluster) {
    cluster.cancel();
    let _ = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang");
}

async fn training(cluster: &mut Cluster) {
    cluster
        .await_status(WAIT, |s| s.phase == "training" && s.records_processed > 0)
        .await
        .unwrap();
}

/// Offers the job a capacity of 4 and waits until a plan has succeeded and
/// the job's members are `grown`; returns the status.
async fn grown_into_4(
    cluster: &mut Cluster,
    grown: impl Fn(&[am::EvaluatorStatus]) -> bool,
) -> Result<am::Status, String> {
    assert!(cluster.set_capacity(4));
    cluster
        .await_status(WAIT, |s| {
            s.reconfigurations
                .iter()
                .any(|r| r.failed.is_empty() && r.succeeded > 0)
                && grown(&s.evaluators)
        })
        .await
}

/// Capacity offered: the job grows into it. The job is endless (cancelled
/// at the end): a plan must pay for itself over the epochs left, and 400
/// epochs of this job take under a second (a worker's requests for one
/// server go whole), so the optimizer rightly stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offered_capacity_is_used() {
    log_on_failure();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(2, 1, 1_000_000);
    // In-process containers are one process on the same cores: what tells
    // them apart is noise, which beside other tests can exceed the default
    // tolerance and price a swap of two of them as a gain (seen in CI on
    // the SSP test: a swap, measured slower, after which the guard
    // against promises that fell short rightly held every plan).
    c.optimizer.noise_tolerance = 1.0;
    c.optimizer.bandwidth_noise_tolerance = 1.0;
    let mut cluster = Cluster::start(c, data(dir.path(), 4000), dir.path().join("w"));
    training(&mut cluster).await;
    let st = grown_into_4(&mut cluster, |evals| {
        evals.iter().filter(|e| e.role != am::Role::Idle).count() > 2
    })
    .await
    .unwrap();
    assert!(st.capacity == 4);
    stop(cluster).await;
}

/// Under SSP (staleness 1) a worker that starts late starts at the clock
/// the job has released, and hears it: capacity offered once the job has
/// passed epoch 3 brings a plan that starts a worker task on an evaluator
/// that was not a worker (a new container, or a server switched to a
/// worker: on this tiny in-process job both are the optimizer's honest
/// choices), and training goes on for two more epochs after it. (Before,
/// a late worker knew the slowest clock as 0, waited for it to come within
/// its bound, and held it back itself: the job stopped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_joining_an_ssp_job_starts_at_its_clock() {
    log_on_failure();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(2, 1, 1_000_000);
    c.job.sync = cruise_conf::SyncMode::Ssp;
    c.job.staleness = 1;
    let mut cluster = Cluster::start(c, data(dir.path(), 4000), dir.path().join("w"));
    let st = cluster
        .await_status(WAIT, |s| s.phase == "training" && s.epochs_done >= 3)
        .await
        .unwrap();
    let workers_before: Vec<EvaluatorId> = st
        .evaluators
        .iter()
        .filter(|e| e.role == am::Role::Worker)
        .map(|e| e.id)
        .collect();
    let st = grown_into_4(&mut cluster, |evals| {
        evals
            .iter()
            .any(|e| e.role == am::Role::Worker && !workers_before.contains(&e.id))
    })
    .await
    .unwrap_or_else(|e| panic!("no worker started late: {e}"));
    trains_on_then_stop(cluster, &st, "a worker started late").await;
}

/// Waits until the job (4,000 records an epoch) has trained two more
/// epochs than at `st`, taken just after `what`, then stops it.
async fn trains_on_then_stop(mut cluster: Cluster, st: &am::Status, what: &str) {
    let before = st.records_processed;
    cluster
        .await_status(WAIT, |s| s.records_processed > before + 2 * 4000)
        .await
        .unwrap_or_else(|e| panic!("training stopped after {what}: {e}"));
    stop(cluster).await;
}

/// The first member of the status in `role`.
fn first_in_role(st: &am::Status, role: am::Role) -> am::EvaluatorStatus {
    st.evaluators
        .iter()
        .find(|e| e.role == role)
        .unwrap_or_else(|| panic!("no {role:?} in {:?}", st.evaluators))
        .clone()
}

/// An endless bulk-synchronous job (staleness 0) of `containers` and
/// `workers` that makes only forced plans and those asked for, once it has
/// trained an epoch; with the status then.
async fn bulk_synchronous(dir: &Path, containers: u32, workers: u32) -> (Cluster, am::Status) {
    let mut c = config(containers, workers, 1_000_000);
    c.job.sync = cruise_conf::SyncMode::Ssp;
    c.job.staleness = 0;
    // Only the forced plan: no gain is worth a plan of the optimizer's own.
    c.optimizer.min_gain = 0.99;
    c.validate().unwrap();
    let mut cluster = Cluster::start(c, data(dir, 4000), dir.join("w"));
    let st = cluster
        .await_status(WAIT, |s| s.phase == "training" && s.epochs_done >= 1)
        .await
        .unwrap();
    (cluster, st)
}

/// A bulk-synchronous job (staleness 0) whose slowest worker the cluster
/// takes back with notice (as YARN's decommissioning and Mesos's inverse
/// offers do): a forced plan moves its input off and gives it back within
/// the notice, and the other workers, which waited for its clock at every
/// clock, train on without it. Its data plane is slowed (every frame 5 ms)
/// so that it is the one they wait for when its worker task stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_synchronous_job_goes_on_when_its_slowest_worker_is_taken_back() {
    log_on_failure();
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, st) = bulk_synchronous(dir.path(), 4, 3).await;
    let slow = first_in_role(&st, am::Role::Worker);
    cluster
        .rm()
        .and_then(|rm| rm.data_faults(&slow.container))
        .unwrap()
        .set_delay(Duration::from_millis(5));
    let at = cluster.status().epochs_done;
    cluster
        .await_status(WAIT, |s| s.epochs_done > at)
        .await
        .unwrap();
    assert!(cluster.reclaim_with_notice(&slow.container, Duration::from_secs(60)));
    let st = cluster
        .await_status(WAIT, |s| !s.evaluators.iter().any(|e| e.id == slow.id))
        .await
        .unwrap_or_else(|e| panic!("the slow worker was not given back: {e}"));
    assert!(
        st.reconfigurations
            .iter()
            .any(|r| r.summary.contains("forced") && r.failed.is_empty()),
        "{:?}",
        st.reconfigurations
    );
    trains_on_then_stop(cluster, &st, "the slowest worker left").await;
}

/// A bulk-synchronous job whose only server the cluster takes back, with
/// no capacity to replace it: the forced plan switches a worker to a
/// server (the only way to keep the model, moved onto it from the server
/// given back), and the worker that stays, which waited for the switched
/// worker's clock at every clock, trains on alone. It does not force the
/// case the switch's release of the clocks is for (the worker that stays
/// already waiting at the bound when the other stops): here it usually
/// ticks after the switch, which releases it too, and the reclaimed
/// server's stop some 20 ms later releases the clocks as well
/// (`a_slow_worker_switched_to_a_server_releases_the_workers_waiting_for_it`
/// comes closer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_synchronous_job_goes_on_when_a_worker_becomes_its_server() {
    log_on_failure();
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, st) = bulk_synchronous(dir.path(), 3, 2).await;
    let server = first_in_role(&st, am::Role::Server);
    let workers: Vec<EvaluatorId> = st
        .evaluators
        .iter()
        .filter(|e| e.role == am::Role::Worker)
        .map(|e| e.id)
        .collect();
    assert_eq!(workers.len(), 2, "{:?}", st.evaluators);
    assert!(cluster.reclaim_with_notice(&server.container, Duration::from_secs(60)));
    let st = cluster
        .await_status(WAIT, |s| {
            !s.evaluators.iter().any(|e| e.id == server.id)
                && s.evaluators
                    .iter()
                    .any(|e| e.role == am::Role::Server && workers.contains(&e.id))
                && s.reconfigurations
                    .iter()
                    .any(|r| r.failed.is_empty() && r.succeeded > 0)
        })
        .await
        .unwrap_or_else(|e| panic!("no worker became the server: {e}"));
    assert!(
        st.reconfigurations
            .iter()
            .any(|r| r.summary.contains("forced")
                && r.failed.is_empty()
                && r.op_secs.iter().any(|(k, _)| k == "switch")),
        "{:?}",
        st.reconfigurations
    );
    assert_eq!(
        st.evaluators
            .iter()
            .filter(|e| e.role == am::Role::Worker)
            .count(),
        1,
        "{:?}",
        st.evaluators
    );
    trains_on_then_stop(cluster, &st, "a worker became the server").await;
}

/// A bulk-synchronous job whose slowest worker is made a server by a plan
/// with no container deleted, asked for through the harness: the other
/// workers, waiting at every clock for the slow one's, go on once it
/// serves. Its requests are slowed (60 ms before each write: a local epoch
/// takes it over a second where the others take a hundredth), so that
/// the plan starts while the others wait for its clock.
///
/// When its worker task sees the stop before it sees its input gone, it
/// stops without ticking, and only the switch's release of the clocks
/// (`membership.rs`) lets the others go on. Which it sees first is a race
/// (its input's hand-over, then the stop, come while a mini-batch of it
/// is under way): without that release this test failed in 5 of 10 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_worker_switched_to_a_server_releases_the_workers_waiting_for_it() {
    log_on_failure();
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, st) = bulk_synchronous(dir.path(), 4, 3).await;
    let slow = first_in_role(&st, am::Role::Worker);
    let slow_faults = cluster
        .rm()
        .and_then(|rm| rm.data_faults(&slow.container))
        .unwrap();
    slow_faults.set_request_delay(Duration::from_millis(60));
    // The others are a clock ahead of it, waiting.
    cluster
        .await_status(WAIT, |s| {
            let clock = |e: &am::EvaluatorStatus| (e.role == am::Role::Worker).then_some(e.clock);
            let Some(c) = s
                .evaluators
                .iter()
                .find(|e| e.id == slow.id)
                .and_then(clock)
            else {
                return false;
            };
            s.evaluators
                .iter()
                .filter(|e| e.id != slow.id)
                .filter_map(clock)
                .all(|o| o > c)
        })
        .await
        .unwrap_or_else(|e| panic!("the other workers never waited for the slow one: {e}"));
    let summary = cluster
        .request_roles([(slow.id, am::Role::Server)].into_iter().collect())
        .await
        .unwrap_or_else(|e| panic!("the switch was not planned: {e}"));
    assert!(summary.contains("asked for"), "{summary}");
    let st = cluster
        .await_status(WAIT, |s| {
            s.evaluators
                .iter()
                .any(|e| e.id == slow.id && e.role == am::Role::Server && e.model_blocks > 0)
                && s.reconfigurations
                    .iter()
                    .any(|r| r.summary.contains("asked for") && r.failed.is_empty())
        })
        .await
        .unwrap_or_else(|e| panic!("the slow worker did not become a server: {e}"));
    let plan = st
        .reconfigurations
        .iter()
        .find(|r| r.summary.contains("asked for"))
        .unwrap();
    let ops: Vec<&str> = plan.op_secs.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        ops.contains(&"switch") && !ops.contains(&"delete"),
        "{ops:?}"
    );
    slow_faults.set_request_delay(Duration::ZERO);
    trains_on_then_stop(cluster, &st, "the slow worker became a server").await;
}

/// Capacity taken back: a forced plan moves the blocks off the container to
/// give back and deletes it, every block keeps exactly one owner, and
/// training goes on. The job is endless (cancelled at the end): a job that
/// reached its last epoch would cancel the plan, which is right for the job
/// and would leave nothing to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_capacity_is_given_back_and_training_goes_on() {
    let st = shrink(ScaleInInput::Move).await;
    let ops: Vec<&str> = st
        .reconfigurations
        .iter()
        .flat_map(|r| r.op_secs.iter().map(|(k, _)| k.as_str()))
        .collect();
    assert!(!ops.contains(&"reload input"), "{ops:?}");
}

/// The same with the input of the container given back re-read from the
/// job's input by the workers that stay, instead of moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_input_can_be_re_read_instead_of_moved() {
    let st = shrink(ScaleInInput::Reload).await;
    let forced = st
        .reconfigurations
        .iter()
        .find(|r| r.summary.contains("forced"))
        .unwrap();
    assert!(
        forced.op_secs.iter().any(|(k, _)| k == "reload input"),
        "{forced:?}"
    );
    assert!(
        !forced.op_secs.iter().any(|(k, _)| k == "move input"),
        "{forced:?}"
    );
}

/// Runs an endless 4-container job, takes one container back, and checks
/// the shrink; returns the status after it.
async fn shrink(scale_in_input: ScaleInInput) -> cruise_appmaster::am::Status {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(4, 3, 1_000_000);
    c.optimizer.enabled = true;
    c.optimizer.scale_in_input = scale_in_input;
    let mut cluster = Cluster::start(c, data(dir.path(), 4000), dir.path().join("w"));
    training(&mut cluster).await;
    assert!(cluster.set_capacity(3));
    let active = |s: &cruise_appmaster::am::Status| {
        s.evaluators
            .iter()
            .filter(|e| e.role != cruise_appmaster::am::Role::Idle)
            .count()
    };
    // The forced plan keeps at most the 3 containers of the new capacity;
    // it may give back one more that the model has no use for (this job is
    // tiny: one worker and one server can be predicted as fast as more).
    let st = cluster
        .await_status(WAIT, |s| {
            active(s) <= 3
                && s.reconfigurations.iter().any(|r| {
                    r.summary.contains("forced") && r.op_secs.iter().any(|(k, _)| k == "delete")
                })
        })
        .await
        .unwrap();
    for r in &st.reconfigurations {
        assert!(r.failed.is_empty(), "{r:?}");
    }
    assert_eq!(st.failure, None);
    let held = |f: fn(&cruise_appmaster::am::EvaluatorStatus) -> u32| {
        st.evaluators.iter().map(f).sum::<u32>()
    };
    assert_eq!(held(|e| e.input_blocks), 16, "{:?}", st.evaluators);
    assert_eq!(held(|e| e.model_blocks), 16, "{:?}", st.evaluators);
    // Training goes on: another epoch's worth of records after the shrink.
    let records = st.records_processed;
    cluster
        .await_status(WAIT, |s| {
            s.records_processed >= records + s.records_per_epoch && s.failure.is_none()
        })
        .await
        .unwrap();
    stop(cluster).await;
    st
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_operation_leaves_a_consistent_job() {
    let dir = tempfile::tempdir().unwrap();
    // A slow network keeps the job from ending before the plan has run.
    let mut cluster = Cluster::start_with(
        config(2, 1, 80),
        data(dir.path(), 4000),
        dir.path().join("w"),
        ClusterOptions {
            data_delay: Duration::from_micros(500),
            ..ClusterOptions::default()
        },
    );
    training(&mut cluster).await;
    // The next container requested fails: the plan's add fails, the moves
    // into it are skipped, the rest of the plan and the job go on.
    assert!(cluster.fail_allocations(1));
    assert!(cluster.set_capacity(3));
    let st = cluster
        .await_status(WAIT, |s| {
            s.reconfigurations.iter().any(|r| !r.failed.is_empty())
        })
        .await
        .unwrap();
    let r = st
        .reconfigurations
        .iter()
        .find(|r| !r.failed.is_empty())
        .unwrap()
        .clone();
    assert!(r.failed.iter().any(|f| f.contains("injected")), "{r:?}");
    assert!(
        r.skipped > 0,
        "dependents of the failed add are skipped: {r:?}"
    );
    let s = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect("the job survives a failed operation");
    consistent(&s);
}

/// The optimizer is told the mini-batch the workers really run. Workers cut
/// each input block into round(n / B) near-equal mini-batches: 16 blocks of
/// about 250 records at B = 70 make 4 mini-batches of about 62.5 each, so
/// the snapshot the optimizer works from says 63 (4000 / 64), not 70.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optimizer_sees_the_mini_batch_the_workers_run() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snapshot.json");
    let mut c = config(2, 1, 1_000_000);
    c.job.mini_batch = 70;
    c.optimizer.snapshot_file = snapshot.display().to_string();
    let mut cluster = Cluster::start(c, data(dir.path(), 4000), dir.path().join("w"));
    let read = || -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(&snapshot).ok()?).ok()
    };
    cluster
        .await_status(WAIT, |_| read().is_some())
        .await
        .unwrap();
    stop(cluster).await;
    let job = read().unwrap()["job"].clone();
    assert_eq!(job["total_records"], 4000, "{job}");
    assert_eq!(job["input_blocks"], 16, "{job}");
    assert_eq!(job["mini_batch_size"], 63, "{job}");
}

/// A plan that waits on evaluators says so while it waits: on a slow
/// network (every data-plane frame delayed 50 ms) the moves off the
/// container given back wait at least one delayed frame (50 ms), the AM
/// checks for slow plans every 10 ms (the report period asked for), and
/// the plan is reported with what it waits for; then it finishes and
/// training goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_plan_reports_what_it_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(3, 2, 1_000_000);
    c.optimizer.enabled = true;
    c.optimizer.slow_plan_report_secs = 0.01;
    // Only the forced plan: a voluntary one that gave a container back first
    // (in-process evaluators share one process, so their CPU-based own times
    // are the test binary's, and a loaded run can make 1 worker + 1 server
    // look better) would leave nothing for the capacity drop to force.
    c.optimizer.min_gain = 0.99;
    let mut cluster = Cluster::start_with(
        c,
        data(dir.path(), 4000),
        dir.path().join("w"),
        ClusterOptions {
            data_delay: Duration::from_millis(50),
            ..ClusterOptions::default()
        },
    );
    training(&mut cluster).await;
    // The forced plan moves the blocks off the container it gives back, one
    // delayed frame at a time, then deletes it.
    assert!(cluster.set_capacity(2));
    let report = tokio::time::timeout(WAIT, async {
        loop {
            match cluster.progress.recv().await {
                Some(Progress::Phase(p)) if p.starts_with("reconfiguration still running") => {
                    break p;
                }
                Some(_) => {}
                None => panic!("the job ended without reporting the slow plan"),
            }
        }
    })
    .await
    .expect("the slow plan is reported");
    assert!(
        report.contains(": not finished") || report.contains("delete evaluator"),
        "{report}"
    );
    let st = cluster
        .await_status(WAIT, |s| {
            s.reconfigurations.iter().any(|r| {
                r.summary.contains("forced") && r.op_secs.iter().any(|(k, _)| k == "delete")
            })
        })
        .await
        .unwrap();
    assert_eq!(st.failure, None);
    for r in &st.reconfigurations {
        assert!(r.failed.is_empty(), "{r:?}");
    }
    stop(cluster).await;
}

/// An operation that waits longer than `optimizer.op_timeout_ms` fails,
/// saying what it waited for, and the job goes on: the container the
/// forced scale-in gives back answers 3 s late, ten times the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_waits_too_long_fails_and_the_job_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(4, 3, 1_000_000);
    c.optimizer.enabled = true;
    c.optimizer.op_timeout_ms = 300;
    let mut cluster = Cluster::start(c, data(dir.path(), 4000), dir.path().join("w"));
    training(&mut cluster).await;
    // The scale-in gives back the newest container.
    let st = cluster.status();
    let newest = st.evaluators.iter().max_by_key(|e| e.id).unwrap();
    assert!(cluster.delay_messages(&newest.container, Duration::from_secs(3)));
    assert!(cluster.set_capacity(3));
    let timed_out = |s: &cruise_appmaster::am::Status| {
        s.reconfigurations
            .iter()
            .flat_map(|r| &r.failed)
            .find(|f| f.contains("optimizer.op_timeout_ms"))
            .cloned()
    };
    let st = cluster
        .await_status(WAIT, |s| timed_out(s).is_some())
        .await
        .unwrap();
    let failure = timed_out(&st).unwrap();
    assert!(
        failure.contains("did not finish within 0.3 s") && failure.contains("waiting: "),
        "{failure}"
    );
    assert_eq!(st.failure, None);
    stop(cluster).await;
}

/// Which end of a running move a test loses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Source,
    Destination,
}

/// The ends of the move a slow-plan report names ("move of 3 blocks (..)
/// from evaluator 4 to 2: not finished").
fn move_ends(report: &str) -> Option<(EvaluatorId, EvaluatorId)> {
    let rest = &report[report.find("move of ")?..];
    let rest = &rest[rest.find("from evaluator ")? + "from evaluator ".len()..];
    let (from, rest) = rest.split_once(" to ")?;
    let to: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((
        EvaluatorId(from.parse().ok()?),
        EvaluatorId(to.parse().ok()?),
    ))
}

/// An evaluator lost while a plan runs is survived: on a network slowed so
/// that the forced scale-in's move is known to be under way (the AM
/// reports it still running, naming the move), the move's `end`, an
/// evaluator in `role`, is killed. The plan stops (its operations with the
/// lost evaluator fail), the lost evaluator's blocks are re-read or
/// restored from the checkpoint, and the job finishes with every record
/// evaluated once.
///
/// The scale-in gives back the newest evaluator, and which container
/// registered last is the in-process cluster's race: `workers` of 4
/// containers makes the wanted role likely, and a job whose move's end is
/// in another role is cancelled and started again (at most six times).
async fn lost_during_a_plan(workers: u32, role: am::Role, end: End) {
    lost_during_a_plan_of(workers, role, end, false).await;
}

/// [`lost_during_a_plan`], of an LDA job when `lda` (no checkpoint needed:
/// its model is recounted from the workers' assignments, and the model it
/// writes counts every token once).
async fn lost_during_a_plan_of(workers: u32, role: am::Role, end: End, lda: bool) {
    for attempt in 1..=6 {
        if let Some(()) = try_lost_during_a_plan(workers, role, end, lda).await {
            return;
        }
        eprintln!("attempt {attempt}: the move's {end:?} is not a {role:?}; again");
    }
    panic!("six jobs in a row gave back no {role:?} at a move's {end:?}");
}

/// One job of [`lost_during_a_plan`]; `None` when the move's end is not in
/// `role` (the job is then cancelled).
async fn try_lost_during_a_plan(workers: u32, role: am::Role, end: End, lda: bool) -> Option<()> {
    log_on_failure();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(4, workers, 12);
    c.optimizer.enabled = true;
    c.optimizer.slow_plan_report_secs = 0.01;
    // Only the forced plan (as in `a_slow_plan_reports_what_it_waits_for`).
    c.optimizer.min_gain = 0.99;
    c.checkpoint.every_epochs = 1;
    c.checkpoint.every_secs = 0;
    let model = dir.path().join("model.txt");
    let input = if lda {
        c.job.app = cruise_conf::AppKind::Lda;
        c.job.mini_batch = 25;
        c.job.model_out = model.display().to_string();
        c.lda.vocab = 100;
        c.lda.topics = 4;
        c.validate().unwrap();
        harness::lda_data(dir.path()).unwrap().0
    } else {
        data(dir.path(), 4000)
    };
    // Every frame delayed from the start: a mini-batch takes at least two
    // delays, so the twelve epochs cannot all end, on a fast machine or
    // behind a slow first checkpoint, before the plan this waits for.
    let faults = ClusterOptions {
        data_delay: Duration::from_millis(10),
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start_with(c, input, dir.path().join("w"), faults);
    cluster
        .await_status(WAIT, |s| s.phase == "training" && s.checkpoints >= 1)
        .await
        .unwrap_or_else(|e| panic!("no checkpoint published: {e}"));
    // Every move of the forced plan then waits for delayed frames.
    assert!(cluster.delay_data(Duration::from_millis(50)));
    assert!(cluster.set_capacity(3));
    let (from, to) = tokio::time::timeout(WAIT, async {
        loop {
            match cluster.progress.recv().await {
                Some(Progress::Phase(p)) if p.starts_with("reconfiguration still running") => {
                    if let Some(ends) = move_ends(&p) {
                        break ends;
                    }
                }
                Some(_) => {}
                None => panic!("the job ended before its plan moved blocks"),
            }
        }
    })
    .await
    .expect("the move is reported under way");
    let lost = match end {
        End::Source => from,
        End::Destination => to,
    };
    let st = cluster.status();
    let e = st.evaluators.iter().find(|e| e.id == lost).unwrap();
    if e.role != role {
        stop(cluster).await;
        return None;
    }
    let container = e.container.clone();
    assert!(cluster.kill_evaluator(&container));
    // The rest of the job at full speed.
    assert!(cluster.delay_data(Duration::ZERO));
    let s = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .unwrap_or_else(|e| panic!("the job must survive losing {lost} during the plan: {e}"));
    if lda {
        let tokens = s.final_stats.loss_terms as f64;
        let sums = harness::lda_model_sums(&model, 100).unwrap();
        eprintln!("LDA, lost {lost} during a plan: {tokens} tokens, the model counts {sums:?}");
        assert_eq!(s.final_stats.records, s.records, "every document once");
        assert_eq!(sums, (tokens, tokens), "every token counted once");
        assert_eq!(s.recounts.len(), 1, "{:?}", s.recounts);
    } else {
        consistent(&s);
    }
    assert_eq!(s.epochs.len(), 12);
    assert_eq!(s.lost.len(), 1, "{:?}", s.lost);
    assert!(
        s.lost[0].contains(&format!("evaluator {lost}")),
        "{:?}",
        s.lost
    );
    let failed: Vec<&String> = s.reconfigurations.iter().flat_map(|r| &r.failed).collect();
    assert!(
        failed
            .iter()
            .any(|f| f.contains(&format!("evaluator {lost} was lost"))),
        "{:?}",
        s.reconfigurations
    );
    Some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_as_a_moves_source_is_survived() {
    lost_during_a_plan(3, am::Role::Worker, End::Source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_as_a_moves_destination_is_survived() {
    lost_during_a_plan(3, am::Role::Worker, End::Destination).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_as_a_moves_source_is_survived_from_a_checkpoint() {
    lost_during_a_plan(1, am::Role::Server, End::Source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_as_a_moves_destination_is_survived_from_a_checkpoint() {
    lost_during_a_plan(1, am::Role::Server, End::Destination).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lda_server_lost_as_a_moves_source_is_survived_by_a_recount() {
    lost_during_a_plan_of(1, am::Role::Server, End::Source, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lda_worker_lost_as_a_moves_source_is_survived_by_a_recount() {
    lost_during_a_plan_of(3, am::Role::Worker, End::Source, true).await;
}
