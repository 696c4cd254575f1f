//! Benchmark: peak resident memory of the AM and of each evaluator for the
//! default `cruise run` (4 containers, generated MLR data), from its JSON
//! summary (`am_peak_rss_bytes`, per evaluator `peak_rss_bytes` and
//! `max_store_bytes`, the most bytes of data and model blocks it held).
//!
//! ```text
//! cargo run --release -p cruise-integration --bin bench-rss [-- REPS]
//! ```
//!
//! Targets (issue #2): AM < 100 MiB; each evaluator < 50 MiB + 1.5 × the
//! bytes of the blocks it holds.

use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use cruise_integration::bench::{Row, cruise_release_binary, machine_note, median, print_table};

const MIB: f64 = 1024.0 * 1024.0;

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-rss [REPS]

Peak resident memory of the AM and of each evaluator in a default
`cruise run`, against their allowances.

  REPS   repetitions (default 3)
";

fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let reps = cruise_integration::bench::reps_arg(3)?;
    println!("## Peak RSS, default `cruise run` ({})", machine_note());
    let cruise = cruise_release_binary()?;
    let dir = std::env::temp_dir().join(format!("cruise-bench-rss-{}", std::process::id()));
    let mut am = Vec::new();
    // Per evaluator (by id): peak RSS and its allowance.
    let mut evals: std::collections::BTreeMap<u64, (String, Vec<f64>, Vec<f64>)> =
        Default::default();
    for _ in 0..reps {
        let out = Command::new(&cruise)
            .args(["run", "--json", "--quiet", "--work-dir"])
            .arg(&dir)
            .output()
            .context("running cruise run")?;
        if !out.status.success() {
            bail!(
                "cruise run failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout).context("cruise run --json")?;
        am.push(
            v["am_peak_rss_bytes"]
                .as_f64()
                .context("no am_peak_rss_bytes")?,
        );
        for e in v["evaluators"].as_array().context("no evaluators")? {
            let id = e["id"].as_u64().context("evaluator id")?;
            let rss = e["peak_rss_bytes"].as_f64().context("peak_rss_bytes")?;
            let store = e["max_store_bytes"].as_f64().context("max_store_bytes")?;
            let role = e["role"].as_str().unwrap_or("?").to_string();
            let entry = evals.entry(id).or_insert((role, Vec::new(), Vec::new()));
            entry.1.push(rss);
            entry.2.push(50.0 * MIB + 1.5 * store);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let am = median(&mut am);
    let mut rows = vec![Row {
        figure: "AM peak RSS".into(),
        value: format!("{:.1} MiB", am / MIB),
        reference: "—".into(),
        ratio: None,
        target: "< 100 MiB".into(),
        pass: Some(am < 100.0 * MIB),
    }];
    for (id, (role, mut rss, mut allow)) in evals {
        let (rss, allow) = (median(&mut rss), median(&mut allow));
        rows.push(Row {
            figure: format!("evaluator {id} ({role}) peak RSS"),
            value: format!("{:.1} MiB", rss / MIB),
            reference: format!("blocks held {:.1} MiB", (allow - 50.0 * MIB) / 1.5 / MIB),
            ratio: None,
            target: format!("< {:.1} MiB (50 + 1.5 × blocks)", allow / MIB),
            pass: Some(rss < allow),
        });
    }
    print_table(&format!("Peak RSS, median of {reps} runs"), &rows);
    Ok(())
}
