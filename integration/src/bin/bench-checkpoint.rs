//! Benchmark: what checkpoints cost a training job (issue #18).
//!
//! The default MLR job (4 containers: 3 workers and 1 server, separate
//! processes) with a larger model (`mlr.features`, default 20 000: 200 000
//! floats, 0.8 MB, in 32 blocks) runs `EPOCHS` epochs twice per repetition,
//! alternating: without checkpoints (`checkpoint.enabled = false`) and with
//! one every epoch (`checkpoint.every_epochs = 1`; each writes every model
//! block and publishes a manifest). The figure is the ratio of the median
//! epoch times (the first epoch left out), with and without, in the same
//! invocation.
//!
//! ```text
//! cargo run --release -p cruise-integration --bin bench-checkpoint [-- REPS]
//! ```
//!
//! Target: ≤ 1.03 (Litz pauses the whole job for a checkpoint).

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use cruise_integration::Spawned;
use cruise_integration::bench::{Row, cruise_release_binary, machine_note, median, print_table};

const USAGE: &str = "Usage: bench-checkpoint [REPS]   (default 3)";
const WAIT: Duration = Duration::from_secs(600);
const EPOCHS: &str = "30";
const FEATURES: &str = "mlr.features=20000";

/// One job's epoch times (the first left out) and checkpoints published.
async fn job(cruise: &std::path::Path, checkpoints: bool) -> anyhow::Result<(Vec<f64>, u64)> {
    let dir = tempfile::tempdir()?;
    let mut c = tokio::process::Command::new(cruise);
    c.args(["run", "--json", "--quiet", "--epochs", EPOCHS, "--work-dir"])
        .arg(dir.path())
        .args(["--set", FEATURES, "--set", "store.model_blocks=32"])
        .env_remove("RUST_LOG");
    if checkpoints {
        c.args([
            "--set",
            "checkpoint.every_epochs=1",
            "--set",
            "checkpoint.every_secs=0",
        ]);
    } else {
        c.args(["--set", "checkpoint.enabled=false"]);
    }
    let mut p = Spawned::spawn(c)?;
    let status = p.wait(WAIT).await?;
    if !status.success() {
        bail!("cruise run failed:\n{}", p.stderr());
    }
    let s: Value = serde_json::from_str(&p.stdout()).context("the JSON summary")?;
    let secs: Vec<f64> = s["epochs"]
        .as_array()
        .context("epochs in the summary")?
        .iter()
        .skip(1)
        .filter_map(|e| e["secs"].as_f64())
        .collect();
    Ok((secs, s["checkpoints"].as_u64().unwrap_or(0)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let reps = cruise_integration::bench::reps_arg(3)?;
    println!("## Checkpoint overhead ({})", machine_note());
    let cruise = cruise_release_binary()?;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut published = 0;
    for i in 0..reps {
        let (a, _) = job(&cruise, false).await?;
        let (b, n) = job(&cruise, true).await?;
        let (ma, mb) = (median(&mut a.clone()), median(&mut b.clone()));
        println!(
            "repetition {}: median epoch {:.4} s without checkpoints, {:.4} s with one every epoch ({n} published): {:.3}×",
            i + 1,
            ma,
            mb,
            mb / ma
        );
        without.extend(a);
        with.extend(b);
        published += n;
    }
    let (a, b) = (median(&mut without), median(&mut with));
    let ratio = b / a;
    let rows = vec![
        Row::plain("checkpoints published", published.to_string()),
        Row {
            figure: "median epoch, a checkpoint every epoch".into(),
            value: format!("{b:.4} s"),
            reference: format!("without checkpoints {a:.4} s"),
            ratio: Some(ratio),
            target: "≤ 1.03".into(),
            pass: Some(ratio <= 1.03),
        },
    ];
    print_table(
        &format!("Checkpoint overhead, {reps} repetitions of {EPOCHS} epochs each way"),
        &rows,
    );
    Ok(())
}
