//! Benchmark: surviving a lost worker or a lost server (issue #18).
//!
//! A long MLR job (the default data set, separate processes), or with
//! `--lda` an LDA job, trains; one evaluator is killed with `SIGKILL`.
//! Measured from the kill, through the AM's `/status`:
//!
//! - **detected**: the loss is listed (`lost`);
//! - **recovered**: a lost worker's input blocks are owned by the surviving
//!   workers again (re-read from the job's input); a lost server's model
//!   blocks are held by the survivors again (MLR: restored from the newest
//!   checkpoint; LDA: created empty); for LDA also the recount listed
//!   (`recounts`: every worker held, the counts emptied and the workers
//!   told to train on, each row counted in again by its next sweep);
//! - **training again**: the job's records per second over a 0.5 s window
//!   are back to the survivors' share of the rate before the kill: for a
//!   lost worker the rate per worker times the workers left; for a lost
//!   server 0.9 of the rate before (the workers are all there; a server
//!   fewer may legitimately serve a little slower);
//! - **settled**: the rate over 2 s once training again, over the same
//!   before the kill (what the survivors train at, which the 0.5 s
//!   windows above only sample).
//!
//! Worker mode (default): 4 containers, 3 workers and 1 server. Server mode
//! (`--server`): 5 containers, 3 workers and 2 servers, a model of 200 000
//! floats (`mlr.features = 20000`) and a checkpoint every epoch, the kill
//! once one is published; the optimizer is off (a loss while a plan runs
//! is not survived, and on a loaded machine it moves blocks between the
//! servers often). `--ssp`: the same job stale-synchronous (staleness 1).
//! A lost MLR server then also rolls every worker's clock and the job's
//! progress back to the checkpoint's, and "recovered" waits for that
//! rollback too; a lost worker releases the clocks it held back, and the
//! survivors, which wait for the slowest clock, must go on.
//!
//! `--lda` (with or without `--server`): LDA on a corpus written once per
//! invocation by `cruise datagen lda` (5000 documents of about 100 tokens,
//! 2000 words, 20 topics: the defaults) and read by every job of it;
//! checkpoints off (LDA recounts instead of restoring) and the optimizer
//! off (a recount waits for a running plan to end). Worker mode: 4
//! containers, 3 workers and 1 server; with `--server` 5 containers, 3
//! workers and 2 servers. With `--ssp` the job is stale-synchronous as
//! above, and the workers the recount holds wait on each other's clocks.
//!
//! The reference, in the same invocation, is what restarting the job costs
//! (TensorFlow-style and Litz-style recovery restart the job): the time from
//! `cruise run` to the first records trained, with no checkpoint to read
//! (a lower bound on a restart from a checkpoint).
//!
//! ```text
//! cargo run --release -p cruise-integration --bin bench-recovery [-- REPS] [--server] [--ssp] [--lda]
//! ```
//!
//! Target: recovered ≤ 2 s after the kill; for a server, plus its bytes
//! (`store_bytes` before the kill) at half the speed of its slowest link the
//! job measured (`metrics.capacity` in `/status`, else `metrics.links`):
//! milliseconds on loopback.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use cruise_integration::bench::{Row, cruise_release_binary, machine_note, median, print_table};
use cruise_integration::{
    Spawned, await_status, blocks_held, members_in_role, status, status_address,
};

const USAGE: &str = "\
usage: bench-recovery [REPS] [--server] [--ssp] [--lda]

Kills an evaluator of a training MLR job and measures, from the kill, when
the loss is detected, when its blocks are held again and when the job
trains at the survivors' former rate; the reference is a job's restart.

  REPS      repetitions; medians are printed (default 3)
  --server  kill a server (MLR: restored from a checkpoint) instead of a
            worker
  --ssp     a stale-synchronous job (staleness 1): a lost MLR server
            rolls the clocks back to the checkpoint's; a lost worker
            releases the clocks it held back
  --lda     an LDA job (no checkpoint): the loss is survived by a recount
            of the model from the workers' topic assignments";
const WAIT: Duration = Duration::from_secs(120);
/// The window the training rate is measured over.
const WINDOW: Duration = Duration::from_millis(500);

fn records(s: &Value) -> u64 {
    s["records_processed"].as_u64().unwrap_or(0)
}

/// What is killed.
#[derive(Clone, Copy, PartialEq)]
enum Victim {
    Worker,
    Server,
}

impl Victim {
    fn role(self) -> &'static str {
        match self {
            Victim::Worker => "worker",
            Victim::Server => "server",
        }
    }

    /// The blocks the victim held, which the survivors must hold again.
    fn field(self) -> &'static str {
        match self {
            Victim::Worker => "input_blocks",
            Victim::Server => "model_blocks",
        }
    }
}

/// What is measured: the job and what is killed in it.
#[derive(Clone, Copy)]
struct Mode {
    victim: Victim,
    /// A stale-synchronous job.
    ssp: bool,
    /// An LDA job (its loss survived by a recount) instead of MLR.
    lda: bool,
}

impl Mode {
    /// `cruise run`'s arguments besides the work directory; `corpus`: the
    /// LDA job's input.
    fn args(self, corpus: Option<&std::path::Path>) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = ["run", "--epochs", "1000000"]
            .iter()
            .map(Into::into)
            .collect();
        let mut add = |a: &[&str]| args.extend(a.iter().map(Into::into));
        if self.victim == Victim::Server {
            add(&["--containers", "5", "--workers", "3"]);
        }
        if self.lda || self.victim == Victim::Server {
            add(&["--set", "optimizer.enabled=false"]);
        }
        if self.lda {
            add(&["--app", "lda", "--set", "checkpoint.enabled=false"]);
        } else if self.victim == Victim::Server {
            add(&[
                "--set",
                "mlr.features=20000",
                "--set",
                "checkpoint.every_epochs=1",
                "--set",
                "checkpoint.every_secs=0",
            ]);
        }
        if self.ssp {
            add(&["--staleness", "1"]);
        }
        if let Some(c) = corpus {
            args.push("--input".into());
            args.push(c.into());
        }
        args
    }

    /// The job and the victim, in words.
    fn name(self) -> String {
        format!(
            "{}{}{}",
            if self.lda { "LDA " } else { "" },
            self.victim.role(),
            if self.ssp { ", stale-synchronous" } else { "" }
        )
    }

    /// Whether the loss rolls the clocks back to the checkpoint's: a lost
    /// server of a stale-synchronous MLR job (LDA recounts instead, and a
    /// lost worker loses no model update).
    fn rolls_back(self) -> bool {
        self.ssp && self.victim == Victim::Server && !self.lda
    }

    /// What "recovered" waits for, in words.
    fn recovered(self) -> &'static str {
        match (self.victim, self.lda, self.ssp) {
            (Victim::Worker, false, _) => "input re-read by the survivors (median)",
            (Victim::Worker, true, _) => "input re-read and the model recounted (median)",
            (Victim::Server, true, _) => {
                "model blocks created on the survivors and recounted (median)"
            }
            (Victim::Server, false, true) => {
                "model blocks restored and the clocks rolled back (median)"
            }
            (Victim::Server, false, false) => "model blocks restored from the checkpoint (median)",
        }
    }
}

/// The window the settled rates before and after are measured over.
const SETTLED: Duration = Duration::from_secs(2);

/// Records per second over one window.
async fn rate(addr: &str) -> anyhow::Result<f64> {
    rate_over(addr, WINDOW).await
}

/// Records per second over `window`.
async fn rate_over(addr: &str, window: Duration) -> anyhow::Result<f64> {
    let (t0, r0) = (Instant::now(), records(&status(addr).await?));
    tokio::time::sleep(window).await;
    let r1 = records(&status(addr).await?);
    Ok(r1.saturating_sub(r0) as f64 / t0.elapsed().as_secs_f64())
}

struct Rep {
    restart_secs: f64,
    detected_secs: f64,
    recovered_secs: f64,
    training_again_secs: f64,
    /// `--ssp`: epochs done at the kill beyond the clock the job rolled
    /// back to (trained again).
    rolled_back_epochs: Option<u64>,
    /// The bytes of blocks the victim held before the kill.
    victim_bytes: u64,
    /// The slowest link to or from the victim the job had measured before
    /// the kill, bytes per second.
    link_bytes_per_sec: Option<f64>,
    /// The rate over [`SETTLED`] once training again, over the same
    /// before the kill (taken after the 0.5 s window the target is set
    /// from).
    settled_ratio: f64,
}

impl Rep {
    /// A lost server's allowance beyond 2 s: its bytes at half the
    /// measured link speed (0 when no link was measured).
    fn allowance_secs(&self) -> f64 {
        self.link_bytes_per_sec
            .map_or(0.0, |b| self.victim_bytes as f64 / (0.5 * b))
    }
}

/// The slowest link to or from evaluator `id` in the status's
/// measurements: bulk transfers (`metrics.capacity`: probes and moves)
/// where measured, else mini-batch transfers (`metrics.links`).
fn link_speed(st: &Value, id: u64) -> Option<f64> {
    let slowest = |field: &str| {
        st["metrics"][field]
            .as_array()?
            .iter()
            .filter(|l| l["from"].as_u64() == Some(id) || l["to"].as_u64() == Some(id))
            .filter_map(|l| l["bytes_per_sec"].as_f64())
            .filter(|&b| b > 0.0)
            .reduce(f64::min)
    };
    slowest("capacity").or_else(|| slowest("links"))
}

async fn one(
    cruise: &std::path::Path,
    mode: Mode,
    corpus: Option<&std::path::Path>,
) -> anyhow::Result<Rep> {
    let Mode { victim, lda, .. } = mode;
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let mut c = tokio::process::Command::new(cruise);
    c.args(mode.args(corpus))
        .arg("--work-dir")
        .arg(dir.path())
        .env_remove("RUST_LOG");
    let job = Spawned::spawn(c)?;
    let addr = status_address(&job, WAIT).await?;
    await_status(&addr, WAIT, |s| s["phase"] == "training" && records(s) > 0).await?;
    let restart_secs = started.elapsed().as_secs_f64();
    if victim == Victim::Server && !lda {
        await_status(&addr, WAIT, |s| s["checkpoints"].as_u64().unwrap_or(0) > 0)
            .await
            .context("no checkpoint published")?;
    }
    // Let it settle, then take the rate before the kill.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rate(&addr).await?;
    let settled_before = rate_over(&addr, SETTLED).await?;
    let st = status(&addr).await?;
    let blocks = blocks_held(&st, victim.field(), None);
    let workers = members_in_role(&st, "worker").len();
    let candidates = members_in_role(&st, victim.role());
    let chosen = candidates
        .first()
        .with_context(|| format!("no {} in the status", victim.role()))?;
    let (id, pid) = (
        chosen["id"].as_u64().context("evaluator id")?,
        chosen["pid"].as_u64().context("evaluator pid")?,
    );
    let victim_bytes = chosen["store_bytes"].as_u64().unwrap_or(0);
    let link_bytes_per_sec = link_speed(&st, id);
    let target = match victim {
        Victim::Worker => before * (workers - 1) as f64 / workers as f64,
        Victim::Server => before * 0.9,
    };
    let epochs_at_kill = st["epochs_done"].as_u64().unwrap_or(0);
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    await_status(&addr, WAIT, |s| {
        s["lost"].as_array().is_some_and(|l| !l.is_empty())
    })
    .await?;
    let detected_secs = killed.elapsed().as_secs_f64();
    let listed = |s: &Value, field: &str| s[field].as_array().is_some_and(|r| !r.is_empty());
    await_status(&addr, WAIT, |s| {
        let members = s["evaluators"].as_array().map_or(&[][..], Vec::as_slice);
        members.iter().all(|e| e["id"].as_u64() != Some(id))
            && blocks_held(s, victim.field(), Some(id)) == blocks
            && (!mode.rolls_back() || listed(s, "clock_rollbacks"))
            && (!lda || listed(s, "recounts"))
    })
    .await?;
    let recovered_secs = killed.elapsed().as_secs_f64();
    let rolled_back_epochs = if mode.rolls_back() {
        let st = status(&addr).await?;
        let text = st["clock_rollbacks"][0].as_str().unwrap_or_default();
        let clock: u64 = text
            .strip_prefix("clocks rolled back to ")
            .and_then(|t| t.split(',').next())
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("no clock in the rollback {text:?}"))?;
        Some(epochs_at_kill.saturating_sub(clock))
    } else {
        None
    };
    let training_again_secs = loop {
        let r = rate(&addr).await?;
        if r >= target {
            // The window that reached it ended now: count from its start.
            break killed.elapsed().as_secs_f64() - WINDOW.as_secs_f64();
        }
        if killed.elapsed() > WAIT {
            bail!("the rate stayed at {r:.0} records/s, under {target:.0}, for {WAIT:?}");
        }
    };
    let settled_after = rate_over(&addr, SETTLED).await?;
    let s = status(&addr).await?;
    if s["phase"] != "training" {
        bail!("the job left training: {}", s["phase"]);
    }
    if lda && s["recounts"].as_array().map_or(0, Vec::len) != 1 {
        bail!("one loss, one recount expected: {}", s["recounts"]);
    }
    drop(job);
    Ok(Rep {
        restart_secs,
        detected_secs,
        recovered_secs,
        training_again_secs: training_again_secs.max(recovered_secs),
        rolled_back_epochs,
        victim_bytes,
        link_bytes_per_sec,
        settled_ratio: settled_after / settled_before,
    })
}

/// Writes the LDA jobs' corpus (`cruise datagen lda`, its defaults) into
/// `dir`; returns its path.
fn write_corpus(
    cruise: &std::path::Path,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join("corpus.txt");
    let out = std::process::Command::new(cruise)
        .args(["datagen", "lda", "--out"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .output()?;
    if !out.status.success() {
        bail!(
            "cruise datagen lda failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(path)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let flag = |f: &str| std::env::args().skip(1).any(|a| a == f);
    let mode = Mode {
        victim: if flag("--server") {
            Victim::Server
        } else {
            Victim::Worker
        },
        ssp: flag("--ssp"),
        lda: flag("--lda"),
    };
    if let Some(a) = std::env::args()
        .skip(1)
        .find(|a| a.starts_with("--") && !["--server", "--ssp", "--lda"].contains(&a.as_str()))
    {
        bail!("unknown flag {a:?}\n{USAGE}");
    }
    let reps = match std::env::args().skip(1).find(|a| !a.starts_with("--")) {
        Some(a) => a
            .parse()
            .with_context(|| format!("REPS {a:?} is not a number\n{USAGE}"))?,
        None => 3,
    };
    println!("## Surviving a lost {} ({})", mode.name(), machine_note());
    let cruise = cruise_release_binary()?;
    let data = tempfile::tempdir()?;
    let corpus = if mode.lda {
        Some(write_corpus(&cruise, data.path())?)
    } else {
        None
    };
    let mut runs = Vec::new();
    for i in 0..reps {
        let r = one(&cruise, mode, corpus.as_deref()).await?;
        println!(
            "repetition {}: restart {:.2} s; detected {:.3} s, recovered {:.3} s, training again {:.3} s after the kill ({:.2}× the restart)",
            i + 1,
            r.restart_secs,
            r.detected_secs,
            r.recovered_secs,
            r.training_again_secs,
            r.training_again_secs / r.restart_secs
        );
        println!(
            "  settled rate after / before the kill ({} s windows): {:.2}",
            SETTLED.as_secs(),
            r.settled_ratio
        );
        if let Some(n) = r.rolled_back_epochs {
            println!("  rolled back: {n} epoch(s) done at the kill are trained again");
        }
        if mode.victim == Victim::Server {
            println!(
                "  the lost server held {} bytes; its slowest measured link {}: {:.4} s at half of it",
                r.victim_bytes,
                r.link_bytes_per_sec
                    .map_or("none".into(), |b| format!("{:.0} MB/s", b / 1e6)),
                r.allowance_secs()
            );
        }
        runs.push(r);
    }
    let med = |f: fn(&Rep) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let restart = med(|r| r.restart_secs);
    let recovered = med(|r| r.recovered_secs);
    let again = med(|r| r.training_again_secs);
    // A lost server may take its bytes at half the link's speed beyond 2 s.
    let bound = 2.0
        + match mode.victim {
            Victim::Worker => 0.0,
            Victim::Server => med(Rep::allowance_secs),
        };
    let target = match mode.victim {
        Victim::Worker => "≤ 2 s".to_string(),
        Victim::Server => format!("≤ {bound:.4} s (2 s + its bytes at half the link)"),
    };
    let mut rows = vec![
        Row::plain(
            "loss detected after the kill (median)",
            format!("{:.3} s", med(|r| r.detected_secs)),
        ),
        Row {
            figure: mode.recovered().into(),
            value: format!("{recovered:.3} s"),
            reference: format!("job restart {restart:.2} s"),
            ratio: Some(recovered / restart),
            target: target.clone(),
            pass: Some(recovered <= bound),
        },
        Row {
            figure: "training at the survivors' former rate (median)".into(),
            value: format!("{again:.3} s"),
            reference: format!("job restart {restart:.2} s"),
            ratio: Some(again / restart),
            target,
            pass: Some(again <= bound),
        },
    ];
    rows.push(Row::plain(
        "settled rate after / before the kill (median)",
        format!("{:.2}", med(|r| r.settled_ratio)),
    ));
    print_table(&format!("Lost {}, {reps} repetitions", mode.name()), &rows);
    Ok(())
}
