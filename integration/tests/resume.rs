//! AM restart: `cruise run --resume WORK_DIR` after the AM was killed.
//!
//! An MLR job on the local runtime, a checkpoint every epoch: once a
//! checkpoint's manifest is on disk the AM is `SIGKILL`ed; every evaluator
//! it started must exit within a bounded wait (an evaluator never outlives
//! its AM), and `cruise run --resume` must finish the job from that
//! checkpoint — not from epoch 0 — with its accuracy within the chaos
//! test's tolerance for MLR of the same job run undisturbed. Resuming a
//! finished job runs nothing and succeeds; a work directory without a
//! checkpoint is refused, naming it.
//!
//! An NMF job resumed the same way takes its row factors (worker-local
//! state) back from the checkpoint: the first epoch after the resume
//! trains on from where the checkpoint's epoch ended, not from row factors
//! drawn again. An LDA job resumed so counts every token of its corpus
//! once: its word-topic counts agree with the topic assignments it trains
//! on, and the first epoch after the resume goes on from the checkpoint's
//! assignments.
//!
//! Multi-process: `cruise run` and its evaluators are OS processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use cruise_integration::{
    Spawned, await_status, binary, finished_evaluating_all, pid_alive, status_address, wait_for,
};

const WAIT: Duration = Duration::from_secs(180);
/// How long the evaluators of a killed AM may take to exit.
const EVALUATORS_EXIT_WITHIN: Duration = Duration::from_secs(15);
const EPOCHS: u32 = 30;
/// The AM is killed once a checkpoint of at least this epoch is published.
const KILL_AFTER_EPOCH: u64 = 3;
/// Training accuracy, absolute difference (as `chaos.rs` for MLR).
const ACCURACY_TOLERANCE: f64 = 0.03;

fn cruise() -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG");
    c
}

fn job(work: &Path) -> Command {
    job_of(work, "mlr", EPOCHS)
}

fn job_of(work: &Path, app: &str, epochs: u32) -> Command {
    let mut c = cruise();
    c.args(["run", "--json", "--work-dir"]).arg(work);
    c.args(["--containers", "4", "--workers", "2"])
        .args(["--epochs", &epochs.to_string()])
        .args(["--set", &format!("job.app={app}")])
        .args(["--set", "optimizer.enabled=false"])
        .args(["--set", "checkpoint.every_epochs=1"])
        .args(["--set", "checkpoint.every_secs=0"]);
    c
}

fn resume(work: &Path) -> Command {
    let mut c = cruise();
    c.args(["run", "--json", "--resume"]).arg(work);
    c
}

fn accuracy(s: &Value) -> f64 {
    let f = &s["final_stats"];
    f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap()
}

/// The published checkpoints' manifests under `work` (`<work>/jobs/checkpoints/<job>/ckpt-*/MANIFEST.json`).
fn manifests(work: &Path) -> Vec<PathBuf> {
    let Ok(jobs) = std::fs::read_dir(work.join("jobs").join("checkpoints")) else {
        return Vec::new();
    };
    jobs.filter_map(Result::ok)
        .filter_map(|j| std::fs::read_dir(j.path()).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|c| c.path().join("MANIFEST.json"))
        .filter(|m| m.is_file())
        .collect()
}

/// The newest epoch among the manifests under `work`.
fn newest_checkpoint_epoch(work: &Path) -> Option<u64> {
    manifests(work)
        .iter()
        .filter_map(|m| std::fs::read(m).ok())
        .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
        .filter_map(|v| v["epoch"].as_u64())
        .max()
}

fn sigkill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// Runs `job` in `work` until a checkpoint of at least epoch `after` is
/// on disk, then `SIGKILL`s its AM; returns that checkpoint's epoch.
async fn kill_after_checkpoint(job: Command, work: &Path, after: u64) -> u64 {
    let mut am = Spawned::spawn(job).unwrap();
    let epoch = wait_for("a checkpoint manifest on disk", WAIT, || async {
        newest_checkpoint_epoch(work).filter(|&e| e >= after)
    })
    .await
    .unwrap();
    sigkill(am.child.id().unwrap());
    am.wait(WAIT).await.unwrap();
    epoch
}

/// Resumes the job of `work` and waits for it to finish; returns its
/// summary and the epoch it resumed from, which must be `epoch` or later.
async fn resume_to_the_end(work: &Path, epoch: u64) -> (Value, usize) {
    let mut resumed = Spawned::spawn(resume(work)).unwrap();
    let s = match finished_evaluating_all(&mut resumed, WAIT).await {
        Ok(s) => s,
        Err(e) => panic!("{e:#}: {}", resumed.stderr()),
    };
    let from = s["resumed_from"]["epoch"].as_u64().unwrap_or(0);
    assert!(from >= epoch, "resumed from epoch {from}: {s}");
    (s, from as usize)
}

/// One job at a time: each runs four evaluator processes.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_am_is_resumed_from_its_checkpoint() {
    let _one = ONE_AT_A_TIME.lock().await;
    let calm = {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Spawned::spawn(job(dir.path())).unwrap();
        finished_evaluating_all(&mut j, WAIT).await.unwrap()
    };

    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let mut am = Spawned::spawn(job(work)).unwrap();
    let addr = status_address(&am, WAIT).await.unwrap();
    let st = await_status(&addr, WAIT, |s| {
        s["phase"] == "training" && s["evaluators"].as_array().is_some_and(|e| e.len() == 4)
    })
    .await
    .unwrap();
    let evaluators: Vec<u32> = st["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pid"].as_u64().unwrap() as u32)
        .collect();
    let epoch = wait_for("a checkpoint manifest on disk", WAIT, || async {
        newest_checkpoint_epoch(work).filter(|&e| e >= KILL_AFTER_EPOCH)
    })
    .await
    .unwrap();
    let am_pid = am.child.id().unwrap();
    eprintln!("killing the AM (pid {am_pid}) after checkpoint of epoch {epoch}");
    sigkill(am_pid);
    am.wait(WAIT).await.unwrap();
    wait_for(
        "every evaluator of the killed AM to exit",
        EVALUATORS_EXIT_WITHIN,
        || {
            let alive: Vec<u32> = evaluators
                .iter()
                .copied()
                .filter(|&p| pid_alive(p))
                .collect();
            async move { alive.is_empty().then_some(()) }
        },
    )
    .await
    .unwrap_or_else(|e| {
        let alive: Vec<u32> = evaluators
            .iter()
            .copied()
            .filter(|&p| pid_alive(p))
            .collect();
        panic!("{e}: still alive {alive:?}")
    });

    let mut resumed = Spawned::spawn(resume(work)).unwrap();
    let s = finished_evaluating_all(&mut resumed, WAIT).await.unwrap();
    let from = s["resumed_from"]["epoch"].as_u64().unwrap_or(0);
    assert!(
        from >= epoch,
        "resumed from epoch {from}, the checkpoint seen before the kill was of epoch {epoch}: {s}"
    );
    assert!(
        resumed.stderr().contains(&format!(
            "from checkpoint {} (epoch {from} of {EPOCHS}",
            s["resumed_from"]["folder"].as_str().unwrap()
        )),
        "{}",
        resumed.stderr()
    );
    let folder = s["resumed_from"]["folder"].as_str().unwrap();
    assert!(
        folder.contains(s["job_id"].as_str().unwrap()),
        "the job id is kept: {s}"
    );
    assert_eq!(s["epochs"].as_array().unwrap().len(), EPOCHS as usize);
    let (q, q0) = (accuracy(&s), accuracy(&calm));
    eprintln!("accuracy {q} resumed from epoch {from}, {q0} undisturbed");
    assert!(
        (q - q0).abs() <= ACCURACY_TOLERANCE,
        "accuracy {q} resumed, {q0} undisturbed"
    );

    // Finished: nothing to resume, and that is not an error.
    let mut again = Spawned::spawn(resume(work)).unwrap();
    let status = again.wait(WAIT).await.unwrap();
    assert!(status.success(), "{}", again.stderr());
    assert!(
        again.stderr().contains("had already finished"),
        "{}",
        again.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_dir_without_a_checkpoint_is_refused_naming_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    // No job at all.
    let dir = tempfile::tempdir().unwrap();
    let mut p = Spawned::spawn(resume(dir.path())).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(!status.success());
    let err = p.stderr();
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(err.contains("no job configuration"), "{err}");

    // A job killed before its first checkpoint: its checkpoint directory
    // is named, and what was looked for in it.
    let mut am = Spawned::spawn(job(dir.path())).unwrap();
    let addr = status_address(&am, WAIT).await.unwrap();
    await_status(&addr, WAIT, |s| s["phase"] == "training")
        .await
        .unwrap();
    sigkill(am.child.id().unwrap());
    am.wait(WAIT).await.unwrap();
    // The AM may have published one between the check and the kill.
    for m in manifests(dir.path()) {
        std::fs::remove_file(m).unwrap();
    }
    let mut p = Spawned::spawn(resume(dir.path())).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(!status.success());
    let err = p.stderr();
    assert!(err.contains("cannot be resumed"), "{err}");
    assert!(err.contains("no usable checkpoint in"), "{err}");
    assert!(err.contains("MANIFEST.json"), "{err}");
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
}

/// The NMF job's epochs (an epoch takes a few tens of milliseconds: far
/// more than it runs before the kill); it is killed once a checkpoint of
/// at least [`NMF_KILL_AFTER_EPOCH`] is published.
const NMF_EPOCHS: u32 = 300;
const NMF_KILL_AFTER_EPOCH: u64 = 5;

/// An epoch's mean loss in a summary (an epoch carried over from the
/// history has its mean loss times its records, and no terms).
fn epoch_loss(e: &Value) -> f64 {
    let st = &e["stats"];
    let terms = match st["loss_terms"].as_u64().unwrap() {
        0 => st["records"].as_u64().unwrap(),
        n => n,
    };
    st["loss_sum"].as_f64().unwrap() / terms as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_nmf_job_takes_its_row_factors_from_the_checkpoint() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let epoch =
        kill_after_checkpoint(job_of(work, "nmf", NMF_EPOCHS), work, NMF_KILL_AFTER_EPOCH).await;
    // The checkpoint the job resumes from (the resumed job's own
    // checkpoints soon prune it).
    let newest = manifests(work)
        .into_iter()
        .filter_map(|m| std::fs::read(m).ok())
        .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
        .max_by_key(|m| m["id"].as_u64())
        .unwrap();

    let (s, from) = resume_to_the_end(work, epoch).await;
    assert_eq!(
        s["resumed_from"]["id"], newest["id"],
        "resumed from the newest checkpoint: {s}"
    );

    // Row factors drawn again would start the next epoch where the job's
    // first started: its loss far above the checkpoint's epoch's.
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), NMF_EPOCHS as usize);
    let (first, at_checkpoint, next) = (
        epoch_loss(&epochs[0]),
        epoch_loss(&epochs[from - 1]),
        epoch_loss(&epochs[from]),
    );
    eprintln!(
        "NMF loss: epoch 1 {first}, epoch {from} (checkpoint) {at_checkpoint}, \
         epoch {} (first resumed) {next}",
        from + 1
    );
    assert!(
        next <= at_checkpoint + 0.1 * (first - at_checkpoint),
        "the first epoch after the resume has loss {next}; the checkpoint's epoch {at_checkpoint}, \
         the job's first {first}"
    );

    // The checkpoint lists every input block's row factors.
    let tables = newest["tables"].as_array().unwrap();
    let state_blocks = tables
        .iter()
        .find(|t| t[0] == 2)
        .and_then(|t| t[1].as_u64())
        .unwrap_or_else(|| panic!("no worker-local state table in {newest}"));
    let listed = newest["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["table"] == 2)
        .count();
    assert!(
        state_blocks > 0 && listed as u64 == state_blocks,
        "{newest}"
    );
}

/// The LDA job: a corpus small enough for an epoch to take well under a
/// second, and enough epochs that a checkpoint of
/// [`LDA_KILL_AFTER_EPOCH`] is published long before the end.
const LDA_EPOCHS: u32 = 60;
const LDA_KILL_AFTER_EPOCH: u64 = 15;
const LDA_VOCAB: u64 = 500;

/// Per topic, the sum of the word rows (keys `0..vocab`), and the summary
/// row (key `vocab`) of an LDA model written by `job.model_out`.
fn lda_topic_totals(model: &Path) -> (Vec<f64>, Vec<f64>) {
    let text = std::fs::read_to_string(model).unwrap();
    let (mut words, mut summary) = (Vec::new(), Vec::new());
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut it = line.split_ascii_whitespace();
        let key: u64 = it.next().unwrap().parse().unwrap();
        let values: Vec<f64> = it.map(|v| v.parse().unwrap()).collect();
        if key == LDA_VOCAB {
            summary = values;
        } else {
            words.resize(values.len(), 0.0);
            for (s, v) in words.iter_mut().zip(&values) {
                *s += v;
            }
        }
    }
    (words, summary)
}

/// The word-topic counts of a resumed LDA job agree with its topic
/// assignments: the final model counts every token of the corpus once
/// (its topic totals sum to the tokens the final evaluation saw), and the
/// first epoch after the resume trains on from the checkpoint's
/// assignments, its log-likelihood near the checkpoint's epoch's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_lda_job_counts_every_token_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let model = work.join("model.txt");
    let mut job = job_of(work, "lda", LDA_EPOCHS);
    job.args(["--set", &format!("lda.vocab={LDA_VOCAB}")])
        .args(["--set", "lda.topics=10"])
        .args(["--set", "lda.generate_docs=2000"])
        .args(["--set", "lda.generate_doc_len=50"])
        .args(["--set", "job.mini_batch=50"])
        .args(["--set", &format!("job.model_out={}", model.display())]);
    let epoch = kill_after_checkpoint(job, work, LDA_KILL_AFTER_EPOCH).await;

    let (s, from) = resume_to_the_end(work, epoch).await;
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), LDA_EPOCHS as usize);

    let tokens = s["final_stats"]["loss_terms"].as_u64().unwrap() as f64;
    let (words, summary) = lda_topic_totals(&model);
    let (counted, totals) = (words.iter().sum::<f64>(), summary.iter().sum::<f64>());
    let (first, at_checkpoint, next) = (
        epoch_loss(&epochs[0]),
        epoch_loss(&epochs[from - 1]),
        epoch_loss(&epochs[from]),
    );
    eprintln!(
        "LDA: {tokens} tokens; word rows count {counted}, topic totals {totals}; \
         nll/token epoch 1 {first}, epoch {from} (checkpoint) {at_checkpoint}, \
         epoch {} (first resumed) {next}",
        from + 1
    );
    assert!(tokens > 0.0, "{s}");
    assert_eq!(totals, tokens, "the topic totals count every token once");
    assert_eq!(counted, tokens, "the word rows count every token once");
    assert!(
        next <= at_checkpoint + 0.25 * (first - at_checkpoint),
        "the first epoch after the resume has nll/token {next}; the checkpoint's epoch \
         {at_checkpoint}, the job's first {first}"
    );
}
