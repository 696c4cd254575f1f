//! In-process cluster tests: the AM and evaluators in one process over real
//! loopback sockets, disturbed with the harness's fault verbs.

use std::path::Path;
use std::time::Duration;

use cruise_appmaster::harness::{self, Cluster, ClusterOptions};
use cruise_conf::{CruiseConfig, SyncMode};

const WAIT: Duration = Duration::from_secs(60);

fn data(dir: &Path, samples: u64) -> String {
    harness::mlr_data(dir, samples, 11).unwrap()
}

fn config(epochs: u32) -> CruiseConfig {
    let mut c = CruiseConfig::default();
    c.job.containers = 3;
    c.job.workers = 2;
    c.job.epochs = epochs;
    c.job.mini_batch = 50;
    c.mlr.classes = 4;
    c.mlr.features = 100;
    // The default step (10) is tuned for the 20k x 1000 default job; on this
    // small one it makes the loss spike now and then, and the accuracy after
    // 3 epochs ranged 0.80-0.94 between runs (CI saw 0.796). With 4 it
    // stays within 0.90-0.95.
    c.mlr.step_size = 4.0;
    c.store.model_blocks = 8;
    c.store.input_blocks = 6;
    c.status.bind = String::new();
    c.validate().unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trains_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 3000);
    let cluster = Cluster::start(config(4), input, dir.path().join("work"));
    let s = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect("job succeeds");
    assert_eq!(s.epochs.len(), 4);
    assert_eq!(s.records, 3000);
    assert!(
        s.final_stats.accuracy() > 0.85,
        "accuracy {}",
        s.final_stats.accuracy()
    );
    assert_eq!(
        s.final_stats.records, 3000,
        "evaluation covers every record once"
    );
    assert!(
        s.epochs[3].stats.mean_loss() < s.epochs[0].stats.mean_loss(),
        "loss falls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_synchronous_trains() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 2000);
    let mut c = config(3);
    c.job.sync = SyncMode::Ssp;
    c.job.staleness = 0;
    let cluster = Cluster::start(c, input, dir.path().join("work"));
    let s = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect("job succeeds");
    assert_eq!(s.epochs.len(), 3);
    assert!(
        s.final_stats.accuracy() > 0.8,
        "accuracy {}",
        s.final_stats.accuracy()
    );
}

/// Waits until the job trains, then returns the container of a worker.
async fn training_worker(cluster: &mut Cluster) -> (u32, String) {
    let st = cluster
        .await_status(WAIT, |s| s.phase == "training" && s.records_processed > 0)
        .await
        .unwrap();
    let w = st
        .evaluators
        .iter()
        .find(|e| e.role == cruise_appmaster::am::Role::Worker)
        .unwrap();
    (w.id, w.container.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_evaluator_fails_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 3000);
    let mut cluster = Cluster::start(config(10_000), input, dir.path().join("work"));
    let (id, container) = training_worker(&mut cluster).await;
    assert!(cluster.kill_evaluator(&container));
    let err = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect_err("the job must fail")
        .to_string();
    assert!(err.contains(&format!("evaluator {id}")), "{err}");
    assert!(err.contains(&container), "{err}");
    assert!(err.contains("signal 9"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_control_connection_fails_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 3000);
    let mut cluster = Cluster::start(config(10_000), input, dir.path().join("work"));
    let (id, container) = training_worker(&mut cluster).await;
    assert!(cluster.drop_connection(&container));
    let err = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect_err("the job must fail")
        .to_string();
    assert!(
        err.contains(&format!("evaluator {id}")) && err.contains("lost"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_slow_but_do_not_fail() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 1500);
    let mut cluster = Cluster::start(config(2), input, dir.path().join("work"));
    let st = cluster
        .await_status(WAIT, |s| !s.evaluators.is_empty())
        .await
        .unwrap();
    assert!(cluster.delay_messages(&st.evaluators[0].container, Duration::from_millis(2)));
    let s = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect("job succeeds despite delays");
    assert_eq!(s.epochs.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_evaluator_misses_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 3000);
    let mut c = config(10_000);
    c.channel.heartbeat_interval_ms = 50;
    c.channel.heartbeat_timeout_ms = 500;
    let mut cluster = Cluster::start(c, input, dir.path().join("work"));
    let (id, container) = training_worker(&mut cluster).await;
    // Every message it sends now arrives five seconds late.
    assert!(cluster.delay_messages(&container, Duration::from_secs(5)));
    let err = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect_err("the job must fail")
        .to_string();
    assert!(
        err.contains(&format!("evaluator {id}")) && err.contains("sent nothing"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_allocation_fails_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 500);
    let cluster = Cluster::start_with(
        config(2),
        input,
        dir.path().join("work"),
        ClusterOptions {
            fail_allocations: 1,
            ..ClusterOptions::default()
        },
    );
    let err = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect_err("the job must fail")
        .to_string();
    assert!(err.contains("allocation failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.libsvm");
    std::fs::write(&path, "0 1:1\n1 2:1\n2 3:0.5\n7 4:1\n").unwrap();
    let cluster = Cluster::start(
        config(2),
        path.display().to_string(),
        dir.path().join("work"),
    );
    let err = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .expect_err("the job must fail")
        .to_string();
    assert!(err.contains(&format!("{}:4:", path.display())), "{err}");
    assert!(err.contains("label 7 is out of range"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_job_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(dir.path(), 3000);
    let mut cluster = Cluster::start(config(10_000), input, dir.path().join("work"));
    training_worker(&mut cluster).await;
    cluster.cancel();
    let err = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
}
