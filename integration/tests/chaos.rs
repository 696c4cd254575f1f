//! Chaos: evaluators killed (`SIGKILL`) at random while a job trains. For
//! each app (MLR, NMF, Lasso, LDA; asynchronous, a checkpoint every epoch),
//! the same job is run undisturbed and then with
//! `job.max_failures` evaluators killed one after another: workers and
//! servers drawn at random, each at a random point of the job once the last
//! loss has been recovered from. The disturbed job must finish, having
//! evaluated every record, with every loss in its summary and its quality
//! within the app's tolerance of the undisturbed run. LDA's model, written
//! out (`job.model_out`), must also count every token of the corpus once:
//! its losses are survived by recounting the model from the workers'
//! assignments, one recount per loss.
//!
//! The draws come from a seed printed at the start (`CRUISE_CHAOS_SEED`
//! sets it), so a failing draw can be run again alone. The optimizer is
//! off, so the kills here are outside plans (losses while a plan runs are
//! `appmaster/tests/reconfig.rs`'s `*_lost_as_a_moves_*`).
//!
//! Multi-process: `cruise run` and its evaluators are OS processes.

use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use cruise_integration::{
    Spawned, await_status, binary, blocks_held, finished_evaluating_all, members_in_role,
    status_address,
};

const WAIT: Duration = Duration::from_secs(180);
/// Containers of every job: 3 workers and 3 servers at the start.
const CONTAINERS: u32 = 6;
/// Kills per job: the default `job.max_failures`.
const KILLS: usize = 3;
/// The kills land between these fractions of the job's records.
const KILL_WINDOW: (f64, f64) = (0.1, 0.55);

/// A job of one app and how its quality is compared.
struct App {
    name: &'static str,
    epochs: u32,
    /// More `cruise run` arguments.
    args: &'static [&'static str],
    /// The largest admissible difference of the quality figure.
    tolerance: Quality,
}

enum Quality {
    /// Training accuracy, absolute difference.
    Accuracy(f64),
    /// Final loss, relative increase over the undisturbed run.
    Loss(f64),
}

/// The LDA job's vocabulary (its model's summary row is this key).
const LDA_VOCAB: u64 = 500;

const APPS: [App; 4] = [
    App {
        name: "mlr",
        epochs: 300,
        args: &[],
        tolerance: Quality::Accuracy(0.03),
    },
    App {
        name: "nmf",
        epochs: 1000,
        args: &[],
        tolerance: Quality::Loss(0.15),
    },
    App {
        name: "lasso",
        epochs: 1000,
        args: &[],
        tolerance: Quality::Loss(0.15),
    },
    // nll/token. Runs end in basins of the sampler, disturbed or not:
    // 3.04 and 3.14-3.17 (`lda_loss.rs`), once 3.24 after 3 kills beside an
    // undisturbed 3.14 (three more runs: within 0.03% of theirs).
    App {
        name: "lda",
        epochs: 150,
        args: &[
            "--set",
            "lda.vocab=500",
            "--set",
            "lda.topics=10",
            "--set",
            "lda.generate_docs=2000",
            "--set",
            "lda.generate_doc_len=50",
            "--set",
            "job.mini_batch=50",
        ],
        tolerance: Quality::Loss(0.08),
    },
];

/// A small deterministic generator (SplitMix64) for the draws.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn seed() -> u64 {
    std::env::var("CRUISE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

fn cruise(app: &App, work: &std::path::Path) -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG");
    c.args(["run", "--json", "--work-dir"]).arg(work);
    c.args(["--containers", &CONTAINERS.to_string(), "--workers", "3"])
        .args(["--epochs", &app.epochs.to_string()])
        .args(["--set", &format!("job.app={}", app.name)])
        .args(["--set", "optimizer.enabled=false"])
        .args(["--set", "checkpoint.every_epochs=1"])
        .args(["--set", "checkpoint.every_secs=0"])
        .args(app.args);
    if app.name == "lda" {
        let model = work.join("model.txt");
        c.arg("--set")
            .arg(format!("job.model_out={}", model.display()));
    }
    c
}

/// Whether the job trains with the evaluators `killed` behind it (lost,
/// and no longer listed among its members), every input block held by a
/// live worker and every model block by a live member, and (LDA) the
/// model recounted after each loss.
fn recovered(app: &App, s: &Value, killed: &[u64], input: u64, model: u64) -> bool {
    s["phase"] == "training"
        && s["lost"].as_array().map_or(0, Vec::len) == killed.len()
        && (app.name != "lda" || s["recounts"].as_array().map_or(0, Vec::len) == killed.len())
        && s["evaluators"].as_array().is_some_and(|e| {
            e.iter()
                .all(|e| !killed.iter().any(|&k| e["id"].as_u64() == Some(k)))
        })
        && members_in_role(s, "worker")
            .iter()
            .filter_map(|e| e["input_blocks"].as_u64())
            .sum::<u64>()
            == input
        && blocks_held(s, "model_blocks", None) == model
}

/// The job's quality figure for `q`, from its final evaluation.
fn quality(s: &Value, q: &Quality) -> f64 {
    let f = &s["final_stats"];
    match q {
        Quality::Accuracy(_) => f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap(),
        Quality::Loss(_) => {
            let terms = f["loss_terms"].as_f64().unwrap();
            let terms = if terms == 0.0 {
                f["records"].as_f64().unwrap()
            } else {
                terms
            };
            f["loss_sum"].as_f64().unwrap() / terms
        }
    }
}

/// One job at a time: each runs six evaluator processes.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn chaos(app: &App) {
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = seed();
    eprintln!("{}: CRUISE_CHAOS_SEED={seed}", app.name);
    let mut draws = Draws(seed);

    let calm = {
        let dir = tempfile::tempdir().unwrap();
        let mut job = Spawned::spawn(cruise(app, dir.path())).unwrap();
        finished_evaluating_all(&mut job, WAIT).await.unwrap()
    };

    let dir = tempfile::tempdir().unwrap();
    let mut job = Spawned::spawn(cruise(app, dir.path())).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    let st = await_status(&addr, WAIT, |s| {
        s["phase"] == "training" && s["checkpoints"].as_u64().unwrap_or(0) >= 1
    })
    .await
    .unwrap_or_else(|e| panic!("{}: no checkpoint published: {e}", app.name));
    let (input, model) = (
        blocks_held(&st, "input_blocks", None),
        blocks_held(&st, "model_blocks", None),
    );
    let total = st["records_per_epoch"].as_u64().unwrap() * u64::from(app.epochs);
    let mut at: Vec<f64> = (0..KILLS)
        .map(|_| draws.between(KILL_WINDOW.0, KILL_WINDOW.1))
        .collect();
    at.sort_by(f64::total_cmp);

    let mut killed = Vec::new();
    for (k, fraction) in at.into_iter().enumerate() {
        let threshold = (fraction * total as f64) as u64;
        let st = await_status(&addr, WAIT, |s| {
            recovered(app, s, &killed, input, model)
                && s["records_processed"].as_u64().unwrap_or(0) >= threshold
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{} (seed {seed}): not recovered after {} kills: {e}",
                app.name, k
            )
        });
        // A worker only while another is left to take its input.
        let workers = members_in_role(&st, "worker");
        let servers = members_in_role(&st, "server");
        let role = if workers.len() < 2 || (!servers.is_empty() && draws.between(0.0, 1.0) < 0.5) {
            "server"
        } else {
            "worker"
        };
        let pick = if role == "server" { &servers } else { &workers };
        let victim = pick[(draws.next() % pick.len() as u64) as usize];
        let (id, pid) = (
            victim["id"].as_u64().unwrap(),
            victim["pid"].as_u64().unwrap(),
        );
        eprintln!(
            "{}: kill {} ({role} evaluator {id}, pid {pid}) at {} of {total} records",
            app.name,
            k + 1,
            st["records_processed"]
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        killed.push(id);
    }
    let s = finished_evaluating_all(&mut job, WAIT).await.unwrap();
    let lost: Vec<&str> = s["lost"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(lost.len(), KILLS, "{}: {lost:?}", app.name);
    for id in killed {
        let name = format!("evaluator {id}");
        assert!(
            lost.iter().any(|l| l.contains(&name)),
            "{}: {name} is not among the losses {lost:?}",
            app.name
        );
    }
    if app.name == "lda" {
        let tokens = s["final_stats"]["loss_terms"].as_u64().unwrap() as f64;
        let sums =
            cruise_appmaster::harness::lda_model_sums(&dir.path().join("model.txt"), LDA_VOCAB)
                .unwrap();
        eprintln!(
            "lda: {tokens} tokens, the model's word rows and topic totals count {sums:?}; \
             recounts {}",
            s["recounts"]
        );
        assert_eq!(
            sums,
            (tokens, tokens),
            "lda (seed {seed}): every token once"
        );
        assert_eq!(s["recounts"].as_array().unwrap().len(), KILLS, "{s}");
    }
    let (q, q0) = (quality(&s, &app.tolerance), quality(&calm, &app.tolerance));
    eprintln!(
        "{}: quality {q} after {KILLS} kills, {q0} undisturbed",
        app.name
    );
    match app.tolerance {
        Quality::Accuracy(d) => assert!(
            (q - q0).abs() <= d,
            "{} (seed {seed}): accuracy {q} after the kills, {q0} undisturbed",
            app.name
        ),
        Quality::Loss(r) => assert!(
            q <= q0 * (1.0 + r),
            "{} (seed {seed}): loss {q} after the kills, {q0} undisturbed",
            app.name
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlr_survives_random_kills() {
    chaos(&APPS[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nmf_survives_random_kills() {
    chaos(&APPS[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lasso_survives_random_kills() {
    chaos(&APPS[2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lda_survives_random_kills_counting_every_token_once() {
    chaos(&APPS[3]).await;
}
