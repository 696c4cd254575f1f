//! Benchmark: MLR single-worker training throughput (samples/s) against
//! scikit-learn's `SGDClassifier(loss="log_loss")` on the same generated
//! data, the same epochs and the same step, measured in the same run.
//!
//! Ours: `cruise run --app mlr --input FILE -n 2 -w 1 --epochs E --json` (one
//! worker and one server, separate processes), samples/s = records × epochs /
//! `train_secs`. Theirs: `fit()` time of the script
//! `integration/bench/sklearn_mlr.py` in the shared venv.
//!
//! Step: cruise averages the gradient over a mini-batch of B records and
//! takes one step of `step_size`; scikit-learn steps once per record with
//! `eta0`. The per-record step is the same when `step_size = eta0 × B`, so
//! the benchmark runs cruise with a constant step (`mlr.decay = 0`) and
//! scikit-learn with `learning_rate="constant"`, that `eta0` and
//! `alpha = mlr.l2`. cruise runs at every mini-batch size given (default 100
//! and 1000: a worker pays a pull and a push round trip per mini-batch,
//! scikit-learn has no mini-batch and is measured once per repetition). scikit-learn trains one-vs-rest binary classifiers
//! (K passes per epoch), cruise a softmax: both accuracies are reported.
//!
//! ```text
//! integration/bench/setup.sh          # scikit-learn in the shared venv (once)
//! cargo run --release -p cruise-integration --bin bench-mlr [-- REPS [B,B...]]
//! ```
//!
//! Target (issue #2): ≥ 1.0× scikit-learn.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use cruise_integration::bench::{Row, cruise_release_binary, machine_note, median, print_table};

const SAMPLES: u64 = 20_000;
const FEATURES: u32 = 1_000;
const CLASSES: u32 = 10;
const NNZ: u32 = 40;
const EPOCHS: u32 = 5;
/// Mini-batch sizes measured by default.
const MINI_BATCHES: [u32; 2] = [100, 1000];
/// scikit-learn's step per record; cruise's is the same.
const ETA0: f64 = 0.1;
const L2: f64 = 1e-5;

fn python() -> anyhow::Result<String> {
    let cache = std::env::var("CRUISE_CACHE_DIR").unwrap_or_else(|_| {
        format!(
            "{}/.cache/cruise-rs",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let py = format!("{cache}/venv/bin/python");
    if !Path::new(&py).exists() {
        bail!("{py} not found: run integration/bench/setup.sh");
    }
    Ok(py)
}

fn run_json(cmd: &mut Command, what: &str) -> anyhow::Result<Value> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{what} did not print JSON"))
}

struct Ours {
    samples_per_sec: f64,
    accuracy: f64,
    loss: f64,
}

fn ours(cruise: &Path, input: &Path, work: &Path, mini_batch: u32) -> anyhow::Result<Ours> {
    let step = ETA0 * f64::from(mini_batch);
    let v = run_json(
        Command::new(cruise)
            .arg("run")
            .args(["--app", "mlr", "--input"])
            .arg(input)
            .args(["-n", "2", "-w", "1", "--epochs", &EPOCHS.to_string()])
            .args(["--mini-batch", &mini_batch.to_string(), "--json", "--quiet"])
            .arg("--work-dir")
            .arg(work)
            .args(["--set", &format!("mlr.features={FEATURES}")])
            .args(["--set", &format!("mlr.classes={CLASSES}")])
            .args(["--set", &format!("mlr.step_size={step}")])
            .args(["--set", "mlr.decay=0"])
            .args(["--set", &format!("mlr.l2={L2}")]),
        "cruise run",
    )?;
    let records = v["records"].as_f64().context("no records")?;
    let secs = v["train_secs"].as_f64().context("no train_secs")?;
    let epochs = v["epochs"].as_array().map_or(0, Vec::len) as f64;
    let f = &v["final_stats"];
    let n = f["records"].as_f64().context("no final_stats.records")?;
    Ok(Ours {
        samples_per_sec: records * epochs / secs,
        accuracy: f["correct"].as_f64().unwrap_or(0.0) / n,
        loss: f["loss_sum"].as_f64().unwrap_or(f64::NAN) / n,
    })
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-mlr [REPS [B,B...]]

MLR training throughput of `cruise run` against scikit-learn on the same
data in the same run (install scikit-learn once with
integration/bench/setup.sh).

  REPS   repetitions; medians are printed (default 3)
  B,B    mini-batch sizes to measure, comma-separated (default 100,1000)
";

fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let reps = cruise_integration::bench::reps_arg(3)?;
    let batches: Vec<u32> = match std::env::args().nth(2) {
        Some(a) => a
            .split(',')
            .map(|b| {
                b.trim()
                    .parse()
                    .ok()
                    .filter(|&b: &u32| b > 0)
                    .with_context(|| format!("mini-batch size {b:?} is not a positive number"))
            })
            .collect::<anyhow::Result<_>>()?,
        None => MINI_BATCHES.to_vec(),
    };
    println!("## MLR training throughput ({})", machine_note());
    let cruise = cruise_release_binary()?;
    let py = python()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/sklearn_mlr.py");
    let dir = std::env::temp_dir().join(format!("cruise-bench-mlr-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("mlr.libsvm");
    let st = Command::new(&cruise)
        .args(["datagen", "mlr", "--samples", &SAMPLES.to_string()])
        .args([
            "--features",
            &FEATURES.to_string(),
            "--classes",
            &CLASSES.to_string(),
        ])
        .args(["--nnz", &NNZ.to_string(), "--out"])
        .arg(&input)
        .status()?;
    if !st.success() {
        bail!("cruise datagen failed ({st})");
    }
    let mut o_rate: Vec<Vec<f64>> = vec![Vec::new(); batches.len()];
    let mut o_last: Vec<Option<Ours>> = batches.iter().map(|_| None).collect();
    let (mut s_rate, mut s_last) = (Vec::new(), None);
    for _ in 0..reps {
        for (i, &b) in batches.iter().enumerate() {
            let o = ours(&cruise, &input, &dir.join("work"), b)?;
            o_rate[i].push(o.samples_per_sec);
            o_last[i] = Some(o);
        }
        let s = run_json(
            Command::new(&py)
                .arg(&script)
                .arg(&input)
                .arg(FEATURES.to_string())
                .arg(EPOCHS.to_string())
                .arg(ETA0.to_string())
                .arg(L2.to_string()),
            "scikit-learn",
        )?;
        s_rate.push(
            s["samples_per_sec"]
                .as_f64()
                .context("no samples_per_sec")?,
        );
        s_last = Some(s);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let s = s_last.context("no run")?;
    let sk_rate = median(&mut s_rate);
    let mut rows = Vec::new();
    for (i, &b) in batches.iter().enumerate() {
        let o = o_last[i].take().context("no run")?;
        let ours_rate = median(&mut o_rate[i]);
        let ratio = ours_rate / sk_rate;
        rows.push(Row {
            figure: format!("training throughput, 1 worker + 1 server, B = {b}"),
            value: format!("{ours_rate:.0} samples/s"),
            reference: format!("scikit-learn SGDClassifier {sk_rate:.0} samples/s"),
            ratio: Some(ratio),
            target: "≥ 1.00×".into(),
            pass: Some(ratio >= 1.0),
        });
        rows.push(Row::plain(
            format!("training accuracy / mean log loss, cruise (softmax), B = {b}"),
            format!("{:.3} / {:.3}", o.accuracy, o.loss),
        ));
    }
    rows.push(Row::plain(
        "training accuracy / mean log loss, scikit-learn (one-vs-rest)",
        format!(
            "{:.3} / {:.3}",
            s["accuracy"].as_f64().unwrap_or(f64::NAN),
            s["log_loss"].as_f64().unwrap_or(f64::NAN)
        ),
    ));
    print_table(
        &format!(
            "MLR, {SAMPLES} samples × {FEATURES} features, {CLASSES} classes, {NNZ} nnz, {EPOCHS} epochs, \
             step per record {ETA0} (cruise: {ETA0} × B on the mean gradient), L2 {L2}; median of {reps}"
        ),
        &rows,
    );
    Ok(())
}
