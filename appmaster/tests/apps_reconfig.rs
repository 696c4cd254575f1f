//! Every app keeps its quality under reconfiguration: the same job is run
//! undisturbed (optimizer off) and disturbed — capacity offered mid-training
//! (the optimizer adds containers, moves input blocks with their
//! worker-local state and model blocks, switches roles), then taken back (a
//! forced plan moves blocks off and deletes containers) — and the disturbed
//! run must end within tolerance of the undisturbed one, with every record
//! evaluated exactly once.
//!
//! In-process cluster (AM and evaluators in this process over real TCP).

use std::path::Path;
use std::time::Duration;

use cruise_appmaster::am::JobSummary;
use cruise_appmaster::datagen::GenSpec;
use cruise_appmaster::harness::{Cluster, ClusterOptions};
use cruise_conf::{AppKind, CruiseConfig};
use cruise_container::apps::{lasso, mlr, nmf};

const WAIT: Duration = Duration::from_secs(120);
/// Delay of every data-plane frame in a disturbed run until its plans have
/// run: a mini-batch (two delayed answers) then takes at least 2 ms.
const DATA_DELAY: Duration = Duration::from_millis(1);

fn config(app: AppKind, work: &Path, epochs: u32, mini_batch: u32) -> CruiseConfig {
    let mut c = CruiseConfig::default();
    c.job.app = app;
    c.job.containers = 3;
    c.job.workers = 2;
    c.job.epochs = epochs;
    c.job.mini_batch = mini_batch;
    c.job.work_dir = work.display().to_string();
    c.store.input_blocks = 12;
    c.store.model_blocks = 8;
    c.status.bind = String::new();
    c.optimizer.interval_ms = 100;
    c.optimizer.min_mini_batches = 3;
    c.optimizer.warmup_mini_batches = 1;
    c.optimizer.confirmations = 1;
    // In-process containers start in milliseconds; with these priors the
    // first plan pays off within the job (the gain per epoch is small: the
    // data sets are small).
    c.optimizer.prior_add_secs = 0.05;
    c.optimizer.prior_delete_secs = 0.02;
    c
}

fn generate(spec: &GenSpec, path: &Path) -> serde_json::Value {
    let mut out = Vec::new();
    let (_, truth) = spec.write(&mut out).unwrap();
    std::fs::write(path, out).unwrap();
    truth
}

/// The undisturbed run and the disturbed one, with their summaries.
async fn both(mut c: CruiseConfig, input: &Path, work: &Path) -> (JobSummary, JobSummary) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let input = input.display().to_string();
    c.optimizer.enabled = false;
    c.validate().unwrap();
    let calm = tokio::time::timeout(
        WAIT,
        Cluster::start(c.clone(), input.clone(), work.join("calm")).join(),
    )
    .await
    .expect("the undisturbed job finishes")
    .expect("the undisturbed job succeeds");

    c.optimizer.enabled = true;
    c.validate().unwrap();
    // A slow network (every data-plane frame delayed) keeps the job from
    // ending before the plans below have run, however fast the machine; it
    // is lifted once they have.
    let mut cluster = Cluster::start_with(
        c,
        input,
        work.join("disturbed"),
        ClusterOptions {
            data_delay: DATA_DELAY,
            ..ClusterOptions::default()
        },
    );
    cluster
        .await_status(WAIT, |s| s.phase == "training" && s.records_processed > 0)
        .await
        .unwrap();
    assert!(cluster.set_capacity(4));
    cluster
        .await_status(WAIT, |s| {
            s.reconfigurations
                .iter()
                .any(|r| r.op_secs.iter().any(|(k, _)| k == "add"))
        })
        .await
        .expect("the job grows into the offered container");
    assert!(cluster.set_capacity(2));
    cluster
        .await_status(WAIT, |s| {
            s.reconfigurations.iter().any(|r| {
                r.summary.contains("forced") && r.op_secs.iter().any(|(k, _)| k == "delete")
            })
        })
        .await
        .expect("the job gives the container back");
    assert!(cluster.delay_data(Duration::ZERO));
    let moved = tokio::time::timeout(WAIT, cluster.join())
        .await
        .expect("the disturbed job finishes")
        .expect("the disturbed job succeeds");

    let forced = moved
        .reconfigurations
        .iter()
        .find(|r| r.summary.contains("forced"))
        .unwrap_or_else(|| panic!("no forced plan: {:#?}", moved.reconfigurations));
    assert!(
        forced.op_secs.iter().any(|(k, _)| k == "delete"),
        "{forced:?}"
    );
    for r in &moved.reconfigurations {
        assert!(r.failed.is_empty(), "{r:?}");
    }
    let last = moved.epochs.last().unwrap();
    assert_eq!(last.workers + last.servers, 2, "{last:?}");
    for s in [&calm, &moved] {
        assert_eq!(s.final_stats.records, s.records, "every record once");
    }
    assert_eq!(calm.final_stats.loss_terms, moved.final_stats.loss_terms);
    (calm, moved)
}

fn close(what: &str, calm: f64, moved: f64, rel: f64) {
    eprintln!("{what}: undisturbed {calm:.5}, reconfigured {moved:.5}");
    assert!(
        (moved - calm).abs() <= rel * calm.abs(),
        "{what}: reconfigured {moved} vs undisturbed {calm} (tolerance {:.0}%)",
        rel * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mlr_keeps_its_quality_under_reconfiguration() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("mlr.libsvm");
    generate(
        &GenSpec::Mlr(mlr::GenParams {
            samples: 6000,
            features: 100,
            classes: 4,
            nnz: 10,
            seed: 11,
        }),
        &input,
    );
    let mut c = config(AppKind::Mlr, dir.path(), 200, 50);
    c.mlr.features = 100;
    c.mlr.classes = 4;
    let (calm, moved) = both(c, &input, dir.path()).await;
    close(
        "MLR log-loss",
        calm.final_stats.mean_loss(),
        moved.final_stats.mean_loss(),
        0.10,
    );
    let (a, b) = (calm.final_stats.accuracy(), moved.final_stats.accuracy());
    assert!((a - b).abs() <= 0.02, "accuracy {b} vs {a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nmf_keeps_its_quality_under_reconfiguration() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("nmf.txt");
    let truth = generate(
        &GenSpec::Nmf(nmf::GenParams {
            rows: 600,
            columns: 80,
            rank: 3,
            density: 0.4,
            noise: 0.1,
            seed: 12,
        }),
        &input,
    );
    let mut c = config(AppKind::Nmf, dir.path(), 200, 20);
    c.nmf.columns = 80;
    c.nmf.rank = 3;
    c.nmf.step_size = 0.1;
    let (calm, moved) = both(c, &input, dir.path()).await;
    let noise = truth["noise_rms"].as_f64().unwrap();
    let (a, b) = (
        calm.final_stats.mean_loss().sqrt(),
        moved.final_stats.mean_loss().sqrt(),
    );
    close("NMF RMSE", a, b, 0.10);
    assert!((b - noise).abs() < 0.1 * noise, "RMSE {b}, noise {noise}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lda_keeps_its_quality_under_reconfiguration() {
    let dir = tempfile::tempdir().unwrap();
    // The harness's corpus: documents of 60 tokens. At 30 (seed 13)
    // collapsed Gibbs sampling has a second basin (2.615 nats per token
    // against 2.414) that 3 of 16 disturbed and 1 of 28 undisturbed runs
    // fell into on a loaded machine: the comparison then measured which
    // basin a run found, not what the reconfiguration did. At 60 all of 24
    // disturbed runs under the same load ended within 0.1% of their
    // undisturbed run.
    let (input, tokens) = cruise_appmaster::harness::lda_data(dir.path()).unwrap();
    let input = std::path::PathBuf::from(input);
    let mut c = config(AppKind::Lda, dir.path(), 200, 25);
    c.lda.vocab = 100;
    c.lda.topics = 4;
    c.lda.beta = 0.05;
    let (calm, moved) = both(c, &input, dir.path()).await;
    assert_eq!(
        moved.final_stats.loss_terms, tokens,
        "every token counted once"
    );
    close(
        "LDA negative log-likelihood per token",
        calm.final_stats.mean_loss(),
        moved.final_stats.mean_loss(),
        0.05,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lasso_keeps_its_quality_under_reconfiguration() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lasso.libsvm");
    generate(
        &GenSpec::Lasso(lasso::GenParams {
            samples: 4000,
            features: 50,
            support: 8,
            noise: 0.2,
            seed: 14,
        }),
        &input,
    );
    let mut c = config(AppKind::Lasso, dir.path(), 200, 100);
    c.lasso.features = 50;
    c.lasso.lambda = 0.1;
    c.lasso.step_size = 0.05;
    c.lasso.decay = 0.1;
    let (calm, moved) = both(c, &input, dir.path()).await;
    close(
        "Lasso objective",
        calm.final_stats.mean_loss(),
        moved.final_stats.mean_loss(),
        0.05,
    );
}
