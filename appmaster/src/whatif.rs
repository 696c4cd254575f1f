//! `cruise plan SNAPSHOT.json [--containers N]`: the optimizer as a what-if
//! tool. Reads the snapshot a job writes (`optimizer.snapshot_file`), prints
//! the predicted epoch time of every (workers, servers) split and the plan
//! the optimizer would run from the snapshot's configuration.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::Path;

use cruise_optimizer::{
    Configuration, ContainerMetrics, CostModel, Decision, Holding, Operation, Role, Snapshot,
    TriggerConfig, TriggerPolicy, Uniform, solve_homogeneous,
};

/// Errors of the what-if tool.
#[derive(Debug, thiserror::Error)]
pub enum WhatIfError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command-line argument is out of range.
    #[error("{0}")]
    Argument(String),
    /// The snapshot is not valid.
    #[error("{path}: {message}")]
    Snapshot {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// The snapshot's configuration with block ids dealt in order (a snapshot
/// records block counts, not which blocks).
pub fn configuration_of(s: &Snapshot) -> Configuration {
    let mut c = Configuration::default();
    let (mut next_in, mut next_m) = (0u32, 0u32);
    for m in &s.containers {
        let input: BTreeSet<u32> = (next_in..next_in + m.input_blocks).collect();
        let model: BTreeSet<u32> = (next_m..next_m + m.model_blocks).collect();
        next_in += m.input_blocks;
        next_m += m.model_blocks;
        c.containers.insert(
            m.id.clone(),
            Holding {
                role: m.role,
                input,
                model,
            },
        );
    }
    c
}

/// Resizes a snapshot to `n` containers: idle containers like the average
/// one are offered, or the newest are marked reclaimed.
pub fn resize(s: &mut Snapshot, n: usize) {
    let cur = s.containers.len();
    if n > cur {
        let avg = |f: &dyn Fn(&ContainerMetrics) -> Option<f64>| {
            let v: Vec<f64> = s.containers.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let speed = avg(&|c| c.cpu_speed);
        let bw = avg(&|c| Some(c.bandwidth_bytes_per_sec)).unwrap_or(1e9);
        for k in 0..n - cur {
            s.containers.push(ContainerMetrics {
                id: format!("offered{k}"),
                role: Role::Idle,
                compute_secs_per_record: None,
                cpu_speed: speed,
                bandwidth_bytes_per_sec: bw,
                server_secs_per_byte: None,
                request_secs_per_server: None,
                input_blocks: 0,
                model_blocks: 0,
                mini_batches: 0,
                reclaimed: false,
            });
        }
    } else {
        for c in s.containers.iter_mut().rev().take(cur - n) {
            c.reclaimed = true;
        }
    }
}

/// Runs the what-if analysis and returns the report text. `min_gain`
/// overrides the snapshot's gain threshold (default: the job's, else 5%).
pub fn report(
    path: &Path,
    containers: Option<usize>,
    min_gain: Option<f64>,
) -> Result<String, WhatIfError> {
    let p = path.display().to_string();
    if let Some(g) = min_gain.filter(|g| !(0.0..1.0).contains(g)) {
        return Err(WhatIfError::Argument(format!(
            "--min-gain {g} is not within [0, 1)"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|source| WhatIfError::Read {
        path: p.clone(),
        source,
    })?;
    let mut snap = Snapshot::from_json(&text).map_err(|e| WhatIfError::Snapshot {
        path: p.clone(),
        message: e.to_string(),
    })?;
    if let Some(n) = containers {
        if n < 2 {
            return Err(WhatIfError::Snapshot {
                path: p,
                message: "--containers must be at least 2".into(),
            });
        }
        resize(&mut snap, n);
    }
    let bad = |e: cruise_optimizer::OptimizerError| WhatIfError::Snapshot {
        path: p.clone(),
        message: e.to_string(),
    };
    let model = CostModel::new(&snap).map_err(bad)?;
    let config = configuration_of(&snap);
    let mut out = String::new();
    let j = &snap.job;
    let _ = writeln!(
        out,
        "job: {} records per epoch, mini-batch {}, {:.0} bytes exchanged per mini-batch ({:.0} on a link's busier direction), {} input and {} model blocks, {:.1} epochs left",
        j.total_records,
        j.mini_batch_size,
        j.bytes_per_mini_batch,
        j.link_bytes(),
        j.input_blocks,
        j.model_blocks,
        j.remaining_epochs
    );
    let n = model.len();
    let mean = |f: &dyn Fn(usize) -> f64| (0..n).map(f).sum::<f64>() / n as f64;
    let u = Uniform {
        compute_secs_per_record: mean(&|i| model.compute_secs_per_record(i)),
        bandwidth_bytes_per_sec: mean(&|i| model.bandwidth(i)),
        server_secs_per_byte: mean(&|i| model.server_secs_per_byte(i)),
        request_secs_per_server: mean(&|i| model.request_secs_per_server(i)),
    };
    let _ = writeln!(
        out,
        "containers: {n} (mean compute {:.3} µs/record + {:.1} µs per server per mini-batch, bandwidth {:.1} MB/s, server {:.3} ns/byte)\n",
        u.compute_secs_per_record * 1e6,
        u.request_secs_per_server * 1e6,
        u.bandwidth_bytes_per_sec / 1e6,
        u.server_secs_per_byte * 1e9
    );
    if let Ok(h) = solve_homogeneous(&snap.job, n, &u) {
        let _ = writeln!(
            out,
            "predicted epoch time per split (containers as the mean one):"
        );
        let _ = writeln!(
            out,
            "  {:>7} {:>7} {:>10} {:>10} {:>10}",
            "workers", "servers", "epoch s", "compute s", "comm s"
        );
        for s in &h.splits {
            let mark = if s.workers == h.best.workers {
                "  <- best"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {:>7} {:>7} {:>10.4} {:>10.4} {:>10.4}{mark}",
                s.workers, s.servers, s.epoch_secs, s.comp_secs, s.comm_secs
            );
        }
    }
    if let Ok(now) =
        CostModel::including_reclaimed(&snap).and_then(|m| m.evaluate(&config.counts()))
    {
        let _ = writeln!(
            out,
            "\nrunning configuration: predicted epoch {:.4} s (bottleneck {:?})",
            now.epoch_secs, now.bottleneck
        );
    }
    // Decide as the job did: with its gain threshold and the cost
    // estimates it had (its priors and what its earlier plans taught it),
    // when the snapshot carries them.
    let mut policy = match &snap.policy {
        Some(state) => TriggerPolicy::from_state(state, 0),
        None => TriggerPolicy::new(TriggerConfig {
            min_mini_batches: 0,
            ..TriggerConfig::default()
        }),
    };
    if let Some(g) = min_gain {
        policy.config.min_gain = g;
    }
    let costs: Vec<String> = policy
        .state()
        .op_costs
        .iter()
        .map(|e| {
            let mut t = format!("{} {:.3} s", e.op.name(), e.per_op);
            if e.per_byte > 0.0 {
                let _ = write!(t, " + {:.0} MB/s", 1e-6 / e.per_byte);
            }
            t
        })
        .collect();
    let _ = writeln!(
        out,
        "\npolicy ({}): least gain {:.1}%, reconfiguration costs: {}",
        if snap.policy.is_some() {
            "the job's, from the snapshot"
        } else {
            "defaults: the snapshot has none"
        },
        policy.config.min_gain * 100.0,
        costs.join(", ")
    );
    match policy.decide(&snap, &config).map_err(bad)? {
        Decision::Wait { reason } => {
            let _ = writeln!(out, "decision: wait ({reason})");
        }
        Decision::Stay {
            current_epoch_secs,
            best_epoch_secs,
            gain,
            reason,
        } => {
            let _ = writeln!(
                out,
                "decision: stay (now {current_epoch_secs:.4} s, best {best_epoch_secs:.4} s, gain {:.1}%): {reason}",
                gain * 100.0
            );
        }
        Decision::Reconfigure(p) => {
            let w = p.target.values().filter(|x| x.role == Role::Worker).count();
            let s = p.target.values().filter(|x| x.role == Role::Server).count();
            let _ = writeln!(
                out,
                "decision: reconfigure to {w} workers + {s} servers: {:.4} s -> {:.4} s ({:.1}% gain), predicted cost {:.2} s{}",
                p.current_epoch_secs,
                p.predicted_epoch_secs,
                p.gain * 100.0,
                p.predicted_cost_secs,
                if p.forced {
                    " (forced: containers reclaimed)"
                } else {
                    ""
                }
            );
            let _ = writeln!(out, "plan ({} operations):", p.plan.ops.len());
            for (i, op) in p.plan.ops.iter().enumerate() {
                let what = match &op.op {
                    Operation::Add { container, role } => format!("add {container} as {role:?}"),
                    Operation::Delete { container } => format!("delete {container}"),
                    Operation::Switch { container, to_role } => {
                        format!("switch {container} to {to_role:?}")
                    }
                    Operation::Move {
                        table,
                        blocks,
                        from,
                        to,
                    } => {
                        format!("move {} {table:?} blocks {from} -> {to}", blocks.len())
                    }
                };
                let deps = if op.deps.is_empty() {
                    String::new()
                } else {
                    format!("  (after {:?})", op.deps)
                };
                let _ = writeln!(out, "  {i:>3}. {what}{deps}");
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNAP: &str = r#"{
      "job": {"total_records": 100000, "mini_batch_size": 100, "bytes_per_mini_batch": 80000.0,
              "input_blocks": 8, "model_blocks": 8, "remaining_epochs": 10.0},
      "containers": [
        {"id": "e1", "role": "worker", "compute_secs_per_record": 2e-5, "bandwidth_bytes_per_sec": 1e9, "input_blocks": 8, "mini_batches": 50},
        {"id": "e2", "role": "server", "bandwidth_bytes_per_sec": 1e9, "model_blocks": 3},
        {"id": "e3", "role": "server", "bandwidth_bytes_per_sec": 1e9, "model_blocks": 3},
        {"id": "e4", "role": "server", "bandwidth_bytes_per_sec": 1e9, "model_blocks": 2}
      ]}"#;

    fn write(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("s.json");
        std::fs::write(&p, SNAP).unwrap();
        p
    }

    #[test]
    fn compute_bound_job_gets_more_workers() {
        let dir = tempfile::tempdir().unwrap();
        let r = report(&write(dir.path()), None, Some(0.05)).unwrap();
        assert!(r.contains("predicted epoch time per split"), "{r}");
        assert!(
            r.contains("decision: reconfigure to 3 workers + 1 servers"),
            "{r}"
        );
        assert!(
            r.contains("switch e2 to Worker") || r.contains("switch e3 to Worker"),
            "{r}"
        );
    }

    #[test]
    fn more_containers_are_used_and_fewer_are_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path());
        let r = report(&p, Some(6), Some(0.05)).unwrap();
        assert!(r.contains("add offered"), "{r}");
        let r = report(&p, Some(3), Some(0.05)).unwrap();
        assert!(r.contains("forced") && r.contains("delete e4"), "{r}");
    }

    /// With two epochs left the default prior (a switch 2 s, a move 1 s)
    /// says the plan does not pay; the job's own estimates, carried in the
    /// snapshot, say it does, and `cruise plan` decides as the job would.
    #[test]
    fn the_jobs_policy_in_the_snapshot_is_the_one_used() {
        let dir = tempfile::tempdir().unwrap();
        let short = SNAP.replace("\"remaining_epochs\": 10.0", "\"remaining_epochs\": 2.0");
        let p = dir.path().join("short.json");
        std::fs::write(&p, &short).unwrap();
        let r = report(&p, None, None).unwrap();
        assert!(
            r.contains("policy (defaults: the snapshot has none)"),
            "{r}"
        );
        assert!(
            r.contains("decision: stay") && r.contains("does not pay"),
            "{r}"
        );

        let cheap = r#"{"min_gain": 0.05, "max_parallel": 8, "op_costs": [
            {"op": "switch", "per_op": 0.002, "per_byte": 0.0},
            {"op": {"move": "input"}, "per_op": 0.02, "per_byte": 1e-9},
            {"op": {"move": "model"}, "per_op": 0.02, "per_byte": 1e-9}]}"#;
        let with_policy = short.replacen(
            "\"containers\"",
            &format!("\"policy\": {cheap}, \"containers\""),
            1,
        );
        std::fs::write(&p, &with_policy).unwrap();
        let r = report(&p, None, None).unwrap();
        assert!(r.contains("policy (the job's, from the snapshot)"), "{r}");
        assert!(r.contains("switch 0.002 s"), "{r}");
        assert!(
            r.contains("decision: reconfigure to 3 workers + 1 servers"),
            "{r}"
        );
        // --min-gain still overrides the job's threshold...
        let r = report(&p, None, Some(0.9)).unwrap();
        assert!(
            r.contains("least gain 90.0%") && r.contains("decision: stay"),
            "{r}"
        );
        // ...within range.
        let e = report(&p, None, Some(1.5)).unwrap_err().to_string();
        assert!(e.contains("--min-gain 1.5"), "{e}");
        // A bad policy is named by its field.
        std::fs::write(&p, with_policy.replace("0.002", "-1")).unwrap();
        let e = report(&p, None, None).unwrap_err().to_string();
        assert!(e.contains("policy.op_costs[0].per_op"), "{e}");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.json");
        std::fs::write(&p, "{\"job\": 1}").unwrap();
        let e = report(&p, None, Some(0.05)).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
        let e = report(&dir.path().join("missing.json"), None, Some(0.05))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
    }
}
