//! What the optimizer's benchmarks (`bench-optimizer`, `bench-fidelity`)
//! share: the MLR cases at three compute/communication ratios, one real
//! `cruise run` on an emulated cluster and what its summary says, and the
//! epoch-time figures taken from it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::bench::median;

/// One compute/communication ratio: the bytes a mini-batch exchanges grow
/// with the features its records touch, its compute with its records.
pub struct Case {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it is, in words.
    pub what: &'static str,
    /// MLR features.
    pub features: u32,
    /// MLR classes.
    pub classes: u32,
    /// Records.
    pub samples: u64,
    /// Mini-batch size.
    pub mini_batch: u32,
    /// Epochs of a grid run (the first is warm-up).
    pub grid_epochs: u32,
    /// Epochs of an optimizer run.
    pub opt_epochs: u32,
}

/// Each case must train long enough for a plan to pay: the optimizer
/// looks every 500 ms and a plan takes about a second, so a job of a few
/// seconds rightly stays where it started. The small case's 400k samples
/// and 40 epochs give a plan time to pay at a compute/communication ratio
/// that 100k samples had (epoch times scale with the samples); with 100k
/// its whole training took 2 s once workers got faster (BENCHMARKS.md,
/// issue #3).
pub const CASES: [Case; 3] = [
    Case {
        name: "small",
        what: "small model, compute-bound",
        features: 100,
        classes: 10,
        samples: 400_000,
        mini_batch: 1_000,
        grid_epochs: 4,
        opt_epochs: 40,
    },
    Case {
        name: "medium",
        what: "medium model",
        features: 1_000,
        classes: 10,
        samples: 20_000,
        mini_batch: 100,
        grid_epochs: 5,
        opt_epochs: 24,
    },
    Case {
        name: "large",
        what: "large model, communication-bound",
        features: 10_000,
        classes: 10,
        samples: 10_000,
        mini_batch: 100,
        grid_epochs: 4,
        opt_epochs: 14,
    },
];

/// Non-zero features per record.
pub const NNZ: u32 = 40;

/// The case called `name`.
pub fn case(name: &str) -> anyhow::Result<&'static Case> {
    CASES
        .iter()
        .find(|c| c.name == name)
        .with_context(|| format!("unknown case {name:?} (small, medium or large)"))
}

/// Where and how the runs go.
pub struct Settings {
    /// The `cruise` binary.
    pub cruise: PathBuf,
    /// `emulation.mechanism`.
    pub mechanism: String,
    /// Work directory (data, snapshots).
    pub work: PathBuf,
    /// Extra `--set KEY=VALUE` for every run.
    pub sets: Vec<String>,
}

impl Settings {
    /// The release `cruise` (built first if needed) and a fresh work
    /// directory named after the benchmark and this process.
    pub fn new(bench: &str, mechanism: &str, sets: &[String]) -> anyhow::Result<Settings> {
        let cruise = crate::bench::cruise_release_binary()?;
        let work = std::env::temp_dir().join(format!("cruise-{bench}-{}", std::process::id()));
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        Ok(Settings {
            cruise,
            mechanism: mechanism.to_string(),
            work,
            sets: sets.to_vec(),
        })
    }
}

/// A cluster spec with its items in reverse start order.
pub fn reversed(cluster: &str) -> String {
    let mut items: Vec<&str> = cluster.split(',').map(str::trim).collect();
    items.reverse();
    items.join(", ")
}

/// One reconfiguration of a run.
pub struct RunPlan {
    /// When it ended, seconds after the job started.
    pub at_secs: f64,
    /// How long it took, seconds.
    pub secs: f64,
    /// What it did and what it predicted, in words.
    pub summary: String,
    /// The epoch time predicted for where it went.
    pub predicted_after_secs: Option<f64>,
}

/// One `cruise run`'s summary.
pub struct Run {
    /// `(secs, end_secs, workers, servers)` per epoch.
    pub epochs: Vec<(f64, f64, u64, u64)>,
    /// The reconfigurations, in order.
    pub plans: Vec<RunPlan>,
    /// How the cluster was emulated.
    pub emulation: String,
    /// The optimizer's names of the evaluators (`e<id>`) in container start
    /// order: the order roles are dealt in.
    pub start_order: Vec<String>,
    /// The job's id (its history is `jobs/history/<id>.jsonl` in the work directory).
    pub job_id: String,
}

/// One run: `n` containers of `cluster`, `workers` of them working first.
pub struct RunSpec<'a> {
    /// The `[emulation] containers` spec.
    pub cluster: &'a str,
    /// Containers.
    pub n: u32,
    /// The case.
    pub case: &'a Case,
    /// Its data.
    pub input: &'a Path,
    /// Workers at the start.
    pub workers: u32,
    /// Whether the optimizer runs.
    pub optimizer: bool,
    /// Epochs.
    pub epochs: u32,
    /// Further `--set`s for this run.
    pub sets: Vec<String>,
}

/// Runs `cruise run --json` and reads its summary.
pub fn run(s: &Settings, r: &RunSpec<'_>) -> anyhow::Result<Run> {
    let mut cmd = Command::new(&s.cruise);
    cmd.args(["run", "--json", "--quiet", "--input"])
        .arg(r.input)
        .args(["-n", &r.n.to_string(), "-w", &r.workers.to_string()])
        .args(["-e", &r.epochs.to_string()])
        .args(["-b", &r.case.mini_batch.to_string()])
        .arg("--work-dir")
        .arg(&s.work);
    for set in [
        format!("mlr.features={}", r.case.features),
        format!("mlr.classes={}", r.case.classes),
        format!("emulation.containers={}", r.cluster),
        format!("emulation.mechanism={}", s.mechanism),
        format!("optimizer.enabled={}", r.optimizer),
        "optimizer.interval_ms=500".to_string(),
    ]
    .iter()
    .chain(&r.sets)
    .chain(&s.sets)
    {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().context("running cruise run")?;
    if !out.status.success() {
        bail!(
            "cruise run -n {} -w {} on `{}` (optimizer {}) failed ({}):\n{}",
            r.n,
            r.workers,
            r.cluster,
            r.optimizer,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value =
        serde_json::from_slice(&out.stdout).context("cruise run did not print its summary")?;
    let epochs = v["epochs"]
        .as_array()
        .context("no epochs")?
        .iter()
        .map(|e| {
            (
                e["secs"].as_f64().unwrap_or(f64::NAN),
                e["end_secs"].as_f64().unwrap_or(f64::NAN),
                e["workers"].as_u64().unwrap_or(0),
                e["servers"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let plans = v["reconfigurations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| RunPlan {
                    at_secs: p["at_secs"].as_f64().unwrap_or(f64::NAN),
                    secs: p["secs"].as_f64().unwrap_or(f64::NAN),
                    summary: p["summary"].as_str().unwrap_or("").to_string(),
                    predicted_after_secs: p["predicted_after_secs"].as_f64(),
                })
                .collect()
        })
        .unwrap_or_default();
    // Local containers are named with their start number last.
    let mut evals: Vec<(u128, String, String)> = v["evaluators"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    let container = e["container"].as_str()?.to_string();
                    let digits: String = container
                        .chars()
                        .rev()
                        .take_while(char::is_ascii_digit)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    Some((
                        digits.parse().unwrap_or(0),
                        container,
                        format!("e{}", e["id"].as_u64()?),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    evals.sort();
    Ok(Run {
        epochs,
        plans,
        emulation: v["emulation"].as_str().unwrap_or("none").to_string(),
        start_order: evals.into_iter().map(|e| e.2).collect(),
        job_id: v["job_id"].as_str().unwrap_or("").to_string(),
    })
}

/// Keeps a run's history in `dir` as `<name>.jsonl` (what the optimizer
/// decided at each look, its plans and epochs; `cruise report` reads it).
pub fn keep_history(s: &Settings, r: &Run, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    // The local runtime's jobs live in `jobs/` under the work directory.
    let from = s
        .work
        .join("jobs")
        .join("history")
        .join(format!("{}.jsonl", r.job_id));
    let to = dir.join(format!("{name}.jsonl"));
    std::fs::copy(&from, &to)
        .with_context(|| format!("keeping {} as {}", from.display(), to.display()))?;
    Ok(to)
}

/// The median epoch time of a grid run, first epoch (warm-up) left out.
pub fn grid_epoch(r: &Run) -> f64 {
    let mut v: Vec<f64> = r.epochs.iter().skip(1).map(|e| e.0).collect();
    median(&mut v)
}

/// The median time of a run's last `n` epochs (at least 2, first left out).
pub fn last_epochs(r: &Run, n: usize) -> f64 {
    let skip = r.epochs.len().saturating_sub(n.max(2)).max(1);
    let mut v: Vec<f64> = r.epochs.iter().skip(skip).map(|e| e.0).collect();
    median(&mut v)
}

/// What an optimizer run reached: its last split and the median epoch time
/// after its last reconfiguration (`None` when fewer than two epochs ran
/// wholly after it), and over how many epochs.
pub fn reached(r: &Run) -> ((u64, u64), Option<f64>, usize) {
    let last = r.epochs.last().map_or((0, 0), |e| (e.2, e.3));
    let settled = r.plans.iter().map(|p| p.at_secs).fold(0.0, f64::max);
    let (t, n) = median_between(r, settled, f64::INFINITY);
    ((last.0, last.1), t.filter(|_| n >= 2), n)
}

/// The median time of the epochs after the first that began at `from` or
/// later and ended by `until` (the first of them left out when there are
/// three or more), and over how many.
fn median_between(r: &Run, from: f64, until: f64) -> (Option<f64>, usize) {
    let after: Vec<f64> = r
        .epochs
        .iter()
        .skip(1)
        .filter(|e| e.1 - e.0 >= from && e.1 <= until)
        .map(|e| e.0)
        .collect();
    let mut v = if after.len() >= 3 {
        after[1..].to_vec()
    } else {
        after
    };
    let n = v.len();
    ((n >= 1).then(|| median(&mut v)), n)
}

/// What plan `i` of a run led to: the median time of the epochs that
/// began after it ended and ended before the next plan began (the first
/// of them left out when there are three or more), and over how many.
pub fn outcome(r: &Run, i: usize) -> (Option<f64>, usize) {
    let Some(p) = r.plans.get(i) else {
        return (None, 0);
    };
    let until = r
        .plans
        .get(i + 1)
        .map_or(f64::INFINITY, |next| next.at_secs - next.secs);
    median_between(r, p.at_secs, until)
}

/// `3W+5S`.
pub fn split(w: u64, s: u64) -> String {
    format!("{w}W+{s}S")
}

/// The path a run took: `1W+7S → 2W+6S → 4W+4S`.
pub fn path(r: &Run, start: u32, n: u32) -> String {
    let mut out = split(u64::from(start), u64::from(n - start));
    let mut last = (u64::from(start), u64::from(n - start));
    for e in &r.epochs {
        if (e.2, e.3) != last {
            last = (e.2, e.3);
            out.push_str(&format!(" → {}", split(e.2, e.3)));
        }
    }
    out
}

/// Generates the case's data into the work directory (once per file name).
pub fn datagen(s: &Settings, case: &Case) -> anyhow::Result<PathBuf> {
    let file = s.work.join(format!("{}.libsvm", case.name));
    if file.exists() {
        return Ok(file);
    }
    let st = Command::new(&s.cruise)
        .args(["datagen", "mlr", "--samples", &case.samples.to_string()])
        .args(["--features", &case.features.to_string()])
        .args(["--classes", &case.classes.to_string()])
        .args(["--nnz", &NNZ.to_string(), "--out"])
        .arg(&file)
        .status()
        .context("running cruise datagen")?;
    if !st.success() {
        bail!("cruise datagen failed ({st})");
    }
    Ok(file)
}
