//! End-to-end runs of the apps on an in-process cluster (the AM and its
//! evaluators in this process, with real TCP control channels and data
//! planes): held-out evaluation (`job.eval_input`), the model file
//! (`job.model_out`), and the stateful apps with several workers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cruise_appmaster::am::JobSummary;
use cruise_appmaster::datagen::GenSpec;
use cruise_appmaster::harness::Cluster;
use cruise_conf::{AppKind, CruiseConfig, SyncMode};
use cruise_container::apps::{self, lasso, lda, mlr, nmf};
use cruise_container::protocol::{Key, ValueBatch};

const JOB_TIMEOUT: Duration = Duration::from_secs(120);

fn config(app: AppKind, work: &Path) -> CruiseConfig {
    let mut c = CruiseConfig::default();
    c.job.app = app;
    c.job.containers = 3;
    c.job.workers = 2;
    c.job.work_dir = work.display().to_string();
    c.runtime.max_containers = 3;
    c.store.input_blocks = 6;
    c.store.model_blocks = 8;
    c.status.bind = String::new();
    c
}

fn generate(spec: &GenSpec, path: &Path) -> serde_json::Value {
    let mut out = Vec::new();
    let (_, truth) = spec.write(&mut out).unwrap();
    std::fs::write(path, out).unwrap();
    truth
}

async fn run(config: CruiseConfig, input: &Path, work: &Path) -> Result<JobSummary, String> {
    let cluster = Cluster::start(config, input.display().to_string(), work.join("jobs"));
    match tokio::time::timeout(JOB_TIMEOUT, cluster.join()).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("the job did not finish in time".into()),
    }
}

/// A model file: its header fields and values by key.
fn read_model(path: &Path) -> (BTreeMap<String, String>, BTreeMap<Key, Vec<f32>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut header = BTreeMap::new();
    let mut values = BTreeMap::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix('#') {
            if let Some((k, v)) = h.split_once('=') {
                header.insert(k.trim().to_string(), v.trim().to_string());
            }
            continue;
        }
        let mut it = line.split_ascii_whitespace();
        let key: Key = it.next().unwrap().parse().unwrap();
        let v: Vec<f32> = it.map(|x| x.parse().unwrap()).collect();
        assert!(values.insert(key, v).is_none(), "key {key} written twice");
    }
    (header, values)
}

/// Held-out evaluation over the training file itself must give the training
/// evaluation's figures, and the written model must reproduce them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mlr_eval_input_and_model_out() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("train.libsvm");
    generate(
        &GenSpec::Mlr(mlr::GenParams {
            samples: 600,
            features: 40,
            classes: 3,
            nnz: 8,
            seed: 3,
        }),
        &input,
    );
    let model_path = dir.path().join("out/model.txt");
    let mut c = config(AppKind::Mlr, dir.path());
    c.mlr.features = 40;
    c.mlr.classes = 3;
    c.mlr.step_size = 1.0;
    c.job.epochs = 3;
    c.job.mini_batch = 20;
    c.job.eval_input = input.display().to_string();
    c.job.model_out = model_path.display().to_string();
    let s = run(c.clone(), &input, dir.path()).await.unwrap();

    let e = s.eval_stats.expect("eval_stats with job.eval_input");
    let f = s.final_stats;
    assert_eq!((e.records, e.correct), (f.records, f.correct));
    assert_eq!(e.records, 600);
    assert!(
        (e.loss_sum - f.loss_sum).abs() < 1e-6 * f.loss_sum,
        "{e:?} vs {f:?}"
    );
    assert!(f.accuracy() > 0.6, "it learned something: {f:?}");
    assert_eq!(s.model_out.as_deref(), Some(c.job.model_out.as_str()));

    // The model file holds what the servers held: evaluating with it gives
    // the job's final figures.
    let (header, values) = read_model(&model_path);
    let params = apps::params(&c).unwrap();
    assert_eq!(header["app"], "mlr");
    assert_eq!(header["value_len"], params.value_len.to_string());
    assert_eq!(header["model_keys"], params.model_keys.to_string());
    let app = apps::build(&c, &params).unwrap();
    let data = app.parse(&std::fs::read(&input).unwrap()).unwrap();
    let mut keys = Vec::new();
    app.keys(&data, 0..data.len(), &mut keys);
    let mut batch = ValueBatch::default();
    for k in &keys {
        batch.push(
            &values
                .get(k)
                .cloned()
                .unwrap_or_else(|| app.model().init(*k)),
        );
    }
    let mine = app.evaluate(&data, 0..data.len(), &keys, &batch, None);
    assert_eq!((mine.records, mine.correct), (f.records, f.correct));
    assert!((mine.loss_sum - f.loss_sum).abs() < 1e-6 * f.loss_sum);
}

/// A malformed held-out file fails the job with its file and line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_out_parse_error_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("train.libsvm");
    generate(
        &GenSpec::Lasso(lasso::GenParams {
            samples: 100,
            features: 5,
            support: 2,
            noise: 0.1,
            seed: 1,
        }),
        &input,
    );
    let bad = dir.path().join("heldout.libsvm");
    std::fs::write(&bad, "1.0 1:0.5\n2.0 2:0.25\n3.0 9:1\n").unwrap();
    let mut c = config(AppKind::Lasso, dir.path());
    c.lasso.features = 5;
    c.job.epochs = 1;
    c.job.eval_input = bad.display().to_string();
    let err = run(c, &input, dir.path()).await.unwrap_err();
    assert!(err.contains("heldout.libsvm:3"), "{err}");
    assert!(err.contains("feature index 9"), "{err}");
}

/// NMF with two workers: row factors live with their blocks; training
/// reaches the noise level and the written column factors are
/// non-negative. Bulk-synchronous: a worker allowed to run ahead (async, or
/// SSP with any staleness) finishes first on a loaded machine, the other
/// runs its last epochs alone, the column factors drift towards its rows
/// and the first worker's rows end above the noise level however the app
/// computes (seen on a loaded 2-core machine with a staleness of 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nmf_with_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("nmf.txt");
    let truth = generate(
        &GenSpec::Nmf(nmf::GenParams {
            rows: 300,
            columns: 80,
            rank: 3,
            density: 0.4,
            noise: 0.1,
            seed: 2,
        }),
        &input,
    );
    let model_path = dir.path().join("nmf.model");
    let mut c = config(AppKind::Nmf, dir.path());
    c.nmf.columns = 80;
    c.nmf.rank = 3;
    c.nmf.step_size = 0.1;
    c.job.epochs = 40;
    c.job.mini_batch = 20;
    c.job.sync = SyncMode::Ssp;
    c.job.staleness = 0;
    c.job.model_out = model_path.display().to_string();
    let s = run(c, &input, dir.path()).await.unwrap();
    let rmse = s.final_stats.mean_loss().sqrt();
    let first = s.epochs[0].stats.mean_loss().sqrt();
    let noise = truth["noise_rms"].as_f64().unwrap();
    assert_eq!(s.final_stats.records, 300);
    assert_eq!(s.final_stats.loss_terms, truth["entries"].as_u64().unwrap());
    assert!(
        (rmse - noise).abs() < 0.1 * noise,
        "RMSE {rmse} (first epoch {first}), noise {noise}"
    );
    let (_, values) = read_model(&model_path);
    assert!(values.len() <= 80 && !values.is_empty());
    assert!(values.values().flatten().all(|&x| x >= 0.0));
}

/// LDA with two workers on one server: the server's counts stay consistent
/// with the workers' assignments. Every push carries the changed word rows
/// and the summary row together, so the word rows of each topic always add
/// up to the topic's total; and the totals add up to the tokens that have
/// been assigned a topic.
///
/// Asynchronously, that is all there is to check: nothing bounds how far
/// one worker runs ahead, and on a loaded machine a starved worker may not
/// have swept all of its tokens once when the job's epochs are done (seen in
/// CI: one worker at local epoch 20, the other still in its first), so
/// fewer tokens than the corpus holds may be counted. Under SSP with
/// staleness 1 no worker starts its third sweep before the other has
/// finished its first, so by the end every token is counted exactly once.
async fn lda_counts(sync: SyncMode) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lda.txt");
    let truth = generate(
        &GenSpec::Lda(lda::GenParams {
            docs: 300,
            vocab: 100,
            topics: 4,
            doc_len: 30,
            alpha: 0.1,
            beta: 0.05,
            seed: 4,
        }),
        &input,
    );
    let model_path = dir.path().join("lda.model");
    let mut c = config(AppKind::Lda, dir.path());
    c.lda.vocab = 100;
    c.lda.topics = 4;
    c.lda.beta = 0.05;
    c.job.epochs = 10;
    c.job.mini_batch = 25;
    c.job.sync = sync;
    c.job.staleness = 1;
    c.job.model_out = model_path.display().to_string();
    let s = run(c, &input, dir.path()).await.unwrap();
    let tokens = truth["tokens"].as_u64().unwrap();
    assert_eq!(s.final_stats.loss_terms, tokens);
    assert!(s.epochs.last().unwrap().stats.mean_loss() < s.epochs[0].stats.mean_loss());
    let (_, values) = read_model(&model_path);
    let summary = &values[&100];
    let mut per_topic = [0f64; 4];
    for (k, v) in &values {
        if *k < 100 {
            for (t, x) in v.iter().enumerate() {
                assert!(*x >= 0.0 && x.fract() == 0.0, "word {k}: {v:?}");
                per_topic[t] += f64::from(*x);
            }
        }
    }
    for t in 0..4 {
        assert_eq!(per_topic[t], f64::from(summary[t]), "topic {t}");
    }
    let counted = summary.iter().map(|&x| f64::from(x)).sum::<f64>();
    match sync {
        SyncMode::Ssp => assert_eq!(counted, tokens as f64),
        SyncMode::Async => assert!(
            counted > 0.0 && counted <= tokens as f64,
            "{counted} tokens counted of {tokens}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lda_counts_stay_consistent_with_two_async_workers() {
    lda_counts(SyncMode::Async).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lda_counts_every_token_once_with_two_ssp_workers() {
    lda_counts(SyncMode::Ssp).await;
}
