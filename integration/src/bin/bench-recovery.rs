//! Benchmark: surviving a lost worker (issue #18).
//!
//! A long MLR job (the default data set: 4 containers, 3 workers and 1
//! server, separate processes) trains; one worker is killed with `SIGKILL`.
//! Measured from the kill, through the AM's `/status`:
//!
//! - **detected**: the loss is listed (`lost`);
//! - **recovered**: the surviving workers own every input block again (the
//!   lost worker's blocks re-read from the job's input);
//! - **training again**: the job's records per second over a 0.5 s window
//!   are back to the surviving workers' share of the rate before the kill
//!   (2/3 of it: the measured rate per worker times the workers left).
//!
//! The reference, in the same invocation, is what restarting the job costs
//! (TensorFlow-style and Litz-style recovery restart the job): the time from
//! `cruise run` to the first records trained, with no checkpoint to read.
//!
//! ```text
//! cargo run --release -p cruise-integration --bin bench-recovery [-- REPS]
//! ```
//!
//! Target: recovered ≤ 2 s after the kill.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use cruise_integration::bench::{Row, cruise_release_binary, machine_note, median, print_table};
use cruise_integration::{Spawned, await_status, status, status_address};

const USAGE: &str = "usage: bench-recovery [REPS]   (default 3)";
const WAIT: Duration = Duration::from_secs(120);
/// The window the training rate is measured over.
const WINDOW: Duration = Duration::from_millis(500);

fn records(s: &Value) -> u64 {
    s["records_processed"].as_u64().unwrap_or(0)
}

fn workers(s: &Value) -> Vec<&Value> {
    s["evaluators"]
        .as_array()
        .map(|a| a.iter().filter(|e| e["role"] == "worker").collect())
        .unwrap_or_default()
}

/// Records per second over one window.
async fn rate(addr: &str) -> anyhow::Result<f64> {
    let (t0, r0) = (Instant::now(), records(&status(addr).await?));
    tokio::time::sleep(WINDOW).await;
    let r1 = records(&status(addr).await?);
    Ok(r1.saturating_sub(r0) as f64 / t0.elapsed().as_secs_f64())
}

struct Rep {
    restart_secs: f64,
    detected_secs: f64,
    recovered_secs: f64,
    training_again_secs: f64,
}

async fn one(cruise: &std::path::Path) -> anyhow::Result<Rep> {
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let mut c = tokio::process::Command::new(cruise);
    c.args(["run", "--epochs", "1000000", "--work-dir"])
        .arg(dir.path())
        .env_remove("RUST_LOG");
    let job = Spawned::spawn(c)?;
    let addr = status_address(&job, WAIT).await?;
    await_status(&addr, WAIT, |s| s["phase"] == "training" && records(s) > 0).await?;
    let restart_secs = started.elapsed().as_secs_f64();
    // Let it settle, then take the rate before the kill.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rate(&addr).await?;
    let st = status(&addr).await?;
    let all = workers(&st);
    let blocks: u64 = all
        .iter()
        .map(|e| e["input_blocks"].as_u64().unwrap_or(0))
        .sum();
    let n = all.len();
    let victim = all.first().context("no worker in the status")?;
    let (id, pid) = (
        victim["id"].as_u64().context("worker id")?,
        victim["pid"].as_u64().context("worker pid")?,
    );
    let target = before * (n - 1) as f64 / n as f64;
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
    await_status(&addr, WAIT, |s| {
        let w = workers(s);
        w.iter().all(|e| e["id"].as_u64() != Some(id))
            && w.iter()
                .map(|e| e["input_blocks"].as_u64().unwrap_or(0))
                .sum::<u64>()
                == blocks
    })
    .await?;
    let recovered_secs = killed.elapsed().as_secs_f64();
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
    let s = status(&addr).await?;
    if s["phase"] != "training" {
        bail!("the job left training: {}", s["phase"]);
    }
    drop(job);
    Ok(Rep {
        restart_secs,
        detected_secs,
        recovered_secs,
        training_again_secs: training_again_secs.max(recovered_secs),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let reps = cruise_integration::bench::reps_arg(3)?;
    println!("## Surviving a lost worker ({})", machine_note());
    let cruise = cruise_release_binary()?;
    let mut runs = Vec::new();
    for i in 0..reps {
        let r = one(&cruise).await?;
        println!(
            "repetition {}: restart {:.2} s; detected {:.3} s, recovered {:.3} s, training again {:.3} s after the kill ({:.2}× the restart)",
            i + 1,
            r.restart_secs,
            r.detected_secs,
            r.recovered_secs,
            r.training_again_secs,
            r.training_again_secs / r.restart_secs
        );
        runs.push(r);
    }
    let med = |f: fn(&Rep) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let restart = med(|r| r.restart_secs);
    let recovered = med(|r| r.recovered_secs);
    let again = med(|r| r.training_again_secs);
    let rows = vec![
        Row::plain(
            "loss detected after the kill (median)",
            format!("{:.3} s", med(|r| r.detected_secs)),
        ),
        Row {
            figure: "input re-read by the survivors (median)".into(),
            value: format!("{recovered:.3} s"),
            reference: format!("job restart {restart:.2} s"),
            ratio: Some(recovered / restart),
            target: "≤ 2 s".into(),
            pass: Some(recovered <= 2.0),
        },
        Row {
            figure: "training at the survivors' former rate (median)".into(),
            value: format!("{again:.3} s"),
            reference: format!("job restart {restart:.2} s"),
            ratio: Some(again / restart),
            target: "≤ 2 s".into(),
            pass: Some(again <= 2.0),
        },
    ];
    print_table(&format!("Lost worker, {reps} repetitions"), &rows);
    Ok(())
}
