//! `cruise plan SNAPSHOT.json [--containers N]`: the optimizer as a what-if
//! tool. Reads the snapshot a job writes (`optimizer.snapshot_file`), prints
//! the predicted epoch time of every (workers, servers) split and the plan
//! the optimizer would run from the snapshot's configuration.
//!
//! `cruise plan SNAPSHOT.json --splits e3,e1,e2,…` instead predicts every
//! split of that container order as a job started with it would run it
//! ([`predict_splits`]): the first `W` containers work, the rest serve, and
//! the blocks are dealt as the AM deals them at the start. This is how the
//! model's fidelity is checked against measured runs (`bench-fidelity`).

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::Path;

use cruise_optimizer::{
    Configuration, ContainerMetrics, CostModel, Decision, Holding, Operation, Role, Snapshot,
    TriggerConfig, TriggerPolicy, Uniform, expected_draw, solve, solve_homogeneous,
};

use crate::am::snapshot::UNMEASURED_BANDWIDTH;

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

/// The predicted epoch of one split of a container order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SplitPrediction {
    /// Workers: the first of the order.
    pub workers: usize,
    /// Servers: the rest.
    pub servers: usize,
    /// Predicted epoch seconds.
    pub epoch_secs: f64,
    /// The solvers' epoch seconds: the slowest worker's, every worker's
    /// requests always queued at every server. For an asynchronous job an
    /// upper bound of `epoch_secs`, which the trigger prices targets by;
    /// otherwise the same.
    pub bound_secs: f64,
    /// The bound with the blocks split as the solver splits them for
    /// these roles (unevenly where containers differ), as the trigger
    /// prices a target of them.
    pub solved_bound_secs: f64,
    /// The slowest worker's computation and communication seconds per epoch.
    pub comp_secs: f64,
    /// See `comp_secs`.
    pub comm_secs: f64,
    /// What limits the epoch (the cost model's bottleneck).
    pub bottleneck: String,
}

/// Block counts as the AM deals them when a job starts with `w` workers
/// and `s` servers: input block `b` of `ni` to worker `b·w / ni` (contiguous
/// runs), model block `b` to server `b mod s` (round-robin).
pub fn initial_counts(ni: u32, nm: u32, w: usize, s: usize) -> (Vec<u32>, Vec<u32>) {
    let mut input = vec![0u32; w];
    for b in 0..ni as usize {
        input[b * w / ni as usize] += 1;
    }
    let mut model = vec![0u32; s];
    for b in 0..nm as usize {
        model[b % s] += 1;
    }
    (input, model)
}

/// Predicts, from one snapshot, the epoch time of every split of `order`
/// (container ids of the snapshot, each once, at least two): `W` from 1
/// to `n - 1` first containers work, the others serve, with the blocks
/// dealt as [`initial_counts`]. Containers of the snapshot not in `order`
/// stay idle.
pub fn predict_splits(
    snap: &Snapshot,
    order: &[String],
) -> Result<Vec<SplitPrediction>, cruise_optimizer::OptimizerError> {
    use cruise_optimizer::{OptimizerError, Placement, Target};
    let model = CostModel::including_reclaimed(snap)?;
    let mut seen = BTreeSet::new();
    for id in order {
        if !seen.insert(id.as_str()) {
            return Err(OptimizerError::DuplicateContainer(id.clone()));
        }
    }
    if order.len() < 2 {
        return Err(OptimizerError::InvalidInput {
            field: "--splits".into(),
            reason: "needs at least two containers".into(),
        });
    }
    let n = order.len();
    let mut out = Vec::with_capacity(n - 1);
    for w in 1..n {
        let (input, blocks) =
            initial_counts(snap.job.input_blocks, snap.job.model_blocks, w, n - w);
        let mut target = Target::new();
        for (k, id) in order.iter().enumerate() {
            let p = if k < w {
                Placement {
                    role: Role::Worker,
                    input_blocks: input[k],
                    model_blocks: 0,
                }
            } else {
                Placement {
                    role: Role::Server,
                    input_blocks: 0,
                    model_blocks: blocks[k - w],
                }
            };
            target.insert(id.clone(), p);
        }
        let b = model.evaluate(&target)?;
        let roles: Vec<Role> = model
            .ids()
            .iter()
            .map(|id| target.get(id).map_or(Role::Idle, |p| p.role))
            .collect();
        let solved = cruise_optimizer::solve_for_roles(&model, &roles)?;
        let slowest = b
            .workers
            .iter()
            .max_by(|x, y| x.total_secs.total_cmp(&y.total_secs));
        out.push(SplitPrediction {
            workers: w,
            servers: n - w,
            // An asynchronous job's epoch ends when the workers together
            // have processed the data set, whoever is slowest.
            epoch_secs: if snap.job.asynchronous {
                b.throughput_epoch_secs
            } else {
                b.epoch_secs
            },
            bound_secs: b.epoch_secs,
            solved_bound_secs: solved.epoch_secs,
            comp_secs: slowest.map_or(0.0, |x| x.comp_secs),
            comm_secs: slowest.map_or(0.0, |x| x.comm_secs),
            bottleneck: match &b.bottleneck {
                cruise_optimizer::Bottleneck::Compute { worker } => format!("compute of {worker}"),
                cruise_optimizer::Bottleneck::Communication { worker, bound } => match bound {
                    cruise_optimizer::CommBound::Worker => format!("link of worker {worker}"),
                    cruise_optimizer::CommBound::Server { container } => {
                        format!("server {container} (for worker {worker})")
                    }
                },
            },
        });
    }
    Ok(out)
}

/// `cruise plan SNAPSHOT --splits ORDER [--json]`: [`predict_splits`] as a
/// table, or as JSON (`{"order": [...], "splits": [...]}`).
pub fn splits_report(path: &Path, order: &str, json: bool) -> Result<String, WhatIfError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| WhatIfError::Read {
        path: p.clone(),
        source,
    })?;
    let snap = Snapshot::from_json(&text).map_err(|e| WhatIfError::Snapshot {
        path: p.clone(),
        message: e.to_string(),
    })?;
    let order: Vec<String> = order
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let splits = predict_splits(&snap, &order).map_err(|e| WhatIfError::Snapshot {
        path: p.clone(),
        message: format!("--splits {}: {e}", order.join(",")),
    })?;
    if json {
        let v = serde_json::json!({ "order": order, "splits": splits });
        return Ok(format!("{v}\n"));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "predicted epoch time per split of {} (first W work, the rest serve; blocks dealt as at a job's start):",
        order.join(",")
    );
    let _ = writeln!(
        out,
        "  {:>7} {:>7} {:>10} {:>10} {:>10}  bottleneck",
        "workers", "servers", "epoch s", "compute s", "comm s"
    );
    let best = splits
        .iter()
        .map(|s| s.epoch_secs)
        .fold(f64::INFINITY, f64::min);
    for s in &splits {
        let _ = writeln!(
            out,
            "  {:>7} {:>7} {:>10.4} {:>10.4} {:>10.4}  {}{}",
            s.workers,
            s.servers,
            s.epoch_secs,
            s.comp_secs,
            s.comm_secs,
            s.bottleneck,
            if s.epoch_secs == best {
                "  <- best"
            } else {
                ""
            }
        );
    }
    Ok(out)
}

/// Resizes a snapshot to `n` containers: idle containers drawn like the
/// snapshot's are offered ([`expected_draw`]), or the newest are marked
/// reclaimed.
pub fn resize(s: &mut Snapshot, n: usize) {
    let cur = s.containers.len();
    if n > cur {
        let speed = expected_draw(s.containers.iter().filter_map(|c| c.cpu_speed));
        let bw = expected_draw(s.containers.iter().map(|c| c.bandwidth_bytes_per_sec))
            .unwrap_or(UNMEASURED_BANDWIDTH);
        for k in 0..n - cur {
            s.containers
                .push(ContainerMetrics::offered(format!("offered{k}"), speed, bw));
        }
    } else {
        for c in s.containers.iter_mut().rev().take(cur - n) {
            c.reclaimed = true;
        }
    }
}

/// Workers and servers of a target.
fn split_of(target: &cruise_optimizer::Target) -> (usize, usize) {
    let count = |r: Role| target.values().filter(|p| p.role == r).count();
    (count(Role::Worker), count(Role::Server))
}

/// The solver's fastest configuration and its plan, priced as the trigger
/// prices it: the decision below goes elsewhere when a target with fewer
/// bytes to move saves more net of its plan (`cruise_optimizer::nearby`).
fn write_fastest(
    out: &mut String,
    snap: &Snapshot,
    best: &cruise_optimizer::Solution,
    config: &Configuration,
    policy: &TriggerPolicy,
) {
    let Ok(plan) = cruise_optimizer::Plan::between(config, &best.target) else {
        return;
    };
    let cost = policy
        .costs
        .plan_secs(&plan, snap, policy.config.max_parallel);
    let (w, s) = split_of(&best.target);
    let (input, model_blocks) = plan.blocks_moved();
    let _ = writeln!(
        out,
        "fastest: {w} workers + {s} servers, predicted epoch {:.4} s; its plan {:.2} s \
         ({} operations, {input} input and {model_blocks} model blocks moved)",
        best.epoch_secs,
        cost,
        plan.ops.len()
    );
}

/// What `cruise plan` is asked, beside the snapshot.
#[derive(Debug, Clone, Default)]
pub struct WhatIf {
    /// Plan for this many containers instead (more: offered; fewer: reclaimed).
    pub containers: Option<usize>,
    /// The least gain worth a reconfiguration (default: the job's, else 5%).
    pub min_gain: Option<f64>,
    /// Decide as if this many epochs remained (default: the snapshot's).
    pub remaining_epochs: Option<f64>,
    /// JSON instead of text: `{"decision": …, "proposed": {id: placement} | null}`.
    pub json: bool,
}

/// Runs the what-if analysis and returns the report (text, or JSON when
/// `what.json`).
pub fn report(path: &Path, what: &WhatIf) -> Result<String, WhatIfError> {
    let &WhatIf {
        containers,
        min_gain,
        remaining_epochs,
        json,
    } = what;
    if let Some(g) = min_gain.filter(|g| !(0.0..1.0).contains(g)) {
        return Err(WhatIfError::Argument(format!(
            "--min-gain {g} is not within [0, 1)"
        )));
    }
    if let Some(e) = remaining_epochs.filter(|e| !(e.is_finite() && *e >= 0.0)) {
        return Err(WhatIfError::Argument(format!(
            "--remaining-epochs {e} is not a finite number of epochs ≥ 0"
        )));
    }
    let mut snap = load(path, containers)?;
    if let Some(e) = remaining_epochs {
        snap.job.remaining_epochs = e;
    }
    let bad = |e: cruise_optimizer::OptimizerError| WhatIfError::Snapshot {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let model = CostModel::new(&snap).map_err(bad)?;
    let config = configuration_of(&snap);
    let mut policy = policy_of(&snap, min_gain);
    if json {
        // The decision alone: the text's tables and its search are not in it.
        let decision = policy.decide(&snap, &config).map_err(bad)?;
        let proposed = proposed_target(&decision);
        let decision = policy.confirm(decision);
        let v = serde_json::json!({ "decision": decision, "proposed": proposed });
        return Ok(format!("{v}\n"));
    }
    let mut out = String::new();
    write_splits(&mut out, &snap, &model);
    if let Ok(now) =
        CostModel::including_reclaimed(&snap).and_then(|m| m.evaluate(&config.counts()))
    {
        let _ = writeln!(
            out,
            "\nrunning configuration: predicted epoch {:.4} s (bottleneck {:?})",
            now.epoch_secs, now.bottleneck
        );
    }
    // The search the decision rests on: proven best, or the best found
    // before it stopped (too many containers, or its node budget).
    let fastest = solve(&model).ok();
    if let Some(best) = &fastest {
        let _ = writeln!(
            out,
            "search: {} role assignments evaluated; {}",
            best.evaluations,
            if best.exact {
                "the best split is proven best under the cost model"
            } else {
                "it stopped early (more containers than the exhaustive search \
                 takes, or its node budget ran out): the best split found so \
                 far, not proven"
            }
        );
    }
    write_policy(&mut out, &snap, &policy);
    if let Some(best) = &fastest {
        write_fastest(&mut out, &snap, best, &config, &policy);
    }
    let decision = policy.decide(&snap, &config).map_err(bad)?;
    if let Some(target) = proposed_target(&decision) {
        write_roles(&mut out, &target);
    }
    // Counted against the looks the job had made, as the job counted it.
    let decision = policy.confirm(decision);
    write_decision(&mut out, &decision);
    Ok(out)
}

/// The target a look proposes, before the looks in a row confirm it (a
/// decision that waits for more looks no longer carries it).
fn proposed_target(decision: &Decision) -> Option<cruise_optimizer::Target> {
    match decision {
        Decision::Reconfigure(p) => Some(p.target.clone()),
        _ => None,
    }
}

/// The roles of a proposed target, each container with the blocks it
/// would hold: what a look proposes whether or not it is the one that
/// reconfigures.
fn write_roles(out: &mut String, target: &cruise_optimizer::Target) {
    let mut ids: Vec<&String> = target.keys().collect();
    ids.sort();
    // A container holding no block of its role's table is idle.
    let (mut workers, mut servers, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for id in ids {
        let p = target[id];
        match p.role {
            Role::Worker if p.input_blocks > 0 => {
                workers.push(format!("{id} ({})", p.input_blocks));
            }
            Role::Server if p.model_blocks > 0 => {
                servers.push(format!("{id} ({})", p.model_blocks));
            }
            _ => idle.push(id.clone()),
        }
    }
    let list = |of: Vec<String>| {
        if of.is_empty() {
            "none".to_string()
        } else {
            of.join(", ")
        }
    };
    let _ = writeln!(
        out,
        "proposed roles: workers {}; servers {}; idle {}",
        list(workers),
        list(servers),
        list(idle)
    );
}

/// Reads the snapshot at `path`, resized to `containers` if given.
fn load(path: &Path, containers: Option<usize>) -> Result<Snapshot, WhatIfError> {
    let p = path.display().to_string();
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
    Ok(snap)
}

/// The job, the mean container, and the predicted epoch time of every
/// split of containers like the mean one.
/// The containers of `model` as one mean container.
fn mean_container(model: &CostModel) -> Uniform {
    let n = model.len();
    let mean = |f: &dyn Fn(usize) -> f64| (0..n).map(f).sum::<f64>() / n as f64;
    Uniform {
        compute_secs_per_record: mean(&|i| model.compute_secs_per_record(i)),
        bandwidth_bytes_per_sec: mean(&|i| model.bandwidth(i)),
        server_secs_per_byte: mean(&|i| model.server_secs_per_byte(i)),
        request_secs_per_server: mean(&|i| model.request_secs_per_server(i)),
        server_secs_per_mini_batch: mean(&|i| model.server_secs_per_mini_batch(i)),
    }
}

/// The predicted epoch time of every workers/servers split of the
/// snapshot's containers taken as the mean one (the closed form, cheap):
/// `(workers, servers, epoch seconds)` by workers. Empty when the
/// snapshot cannot be priced.
pub fn split_epochs(snap: &Snapshot) -> Vec<(u32, u32, f64)> {
    let Ok(model) = CostModel::new(snap) else {
        return Vec::new();
    };
    if model.is_empty() {
        return Vec::new();
    }
    match solve_homogeneous(&snap.job, model.len(), &mean_container(&model)) {
        Ok(h) => h
            .splits
            .iter()
            .map(|s| (s.workers as u32, s.servers as u32, s.epoch_secs))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn write_splits(out: &mut String, snap: &Snapshot, model: &CostModel) {
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
    let u = mean_container(model);
    let _ = writeln!(
        out,
        "containers: {n} (mean compute {:.3} µs/record + {:.1} µs per server per mini-batch, bandwidth {:.1} MB/s, server {:.3} ns/byte)\n",
        u.compute_secs_per_record * 1e6,
        u.request_secs_per_server * 1e6,
        u.bandwidth_bytes_per_sec / 1e6,
        u.server_secs_per_byte * 1e9
    );
    let Ok(h) = solve_homogeneous(&snap.job, n, &u) else {
        return;
    };
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

/// The policy that decides as the job did: with its gain threshold (or
/// `min_gain`) and the cost estimates it had (its priors and what its
/// earlier plans taught it), when the snapshot carries them.
fn policy_of(snap: &Snapshot, min_gain: Option<f64>) -> TriggerPolicy {
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
    policy
}

fn write_policy(out: &mut String, snap: &Snapshot, policy: &TriggerPolicy) {
    let costs: Vec<String> = policy
        .state()
        .op_costs
        .iter()
        .map(|e| {
            let mut t = format!("{} {:.3} s", e.op.name(), e.per_op);
            if e.per_wire_sec > 0.0 {
                let _ = write!(t, " + its links at {:.0}%", 100.0 / e.per_wire_sec);
            }
            t
        })
        .collect();
    let _ = writeln!(
        out,
        "\npolicy ({}): least gain {:.1}%, {}, reconfiguration costs: {}",
        if snap.policy.is_some() {
            "the job's, from the snapshot"
        } else {
            "defaults: the snapshot has none"
        },
        policy.config.min_gain * 100.0,
        match policy.proposed {
            Some(l) if policy.config.confirmations > 1 => format!(
                "{} looks in a row to reconfigure ({} so far; the last proposed {} workers + {} servers)",
                policy.config.confirmations, l.looks, l.workers, l.servers
            ),
            _ => format!(
                "{} look{} in a row to reconfigure",
                policy.config.confirmations,
                if policy.config.confirmations == 1 {
                    ""
                } else {
                    "s"
                }
            ),
        },
        costs.join(", ")
    );
}

fn write_decision(out: &mut String, decision: &Decision) {
    match decision {
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
        Decision::Considering {
            workers,
            servers,
            look,
            of,
            current_epoch_secs,
            predicted_epoch_secs,
        } => {
            let _ = writeln!(
                out,
                "decision: considering {workers} workers + {servers} servers ({current_epoch_secs:.4} s -> {predicted_epoch_secs:.4} s), look {look} of {of}: the job looks again before it reconfigures"
            );
        }
        Decision::Reconfigure(p) => {
            let (w, s) = split_of(&p.target);
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
                let deps = if op.deps.is_empty() {
                    String::new()
                } else {
                    format!("  (after {:?})", op.deps)
                };
                let _ = writeln!(out, "  {i:>3}. {}{deps}", describe(&op.op));
            }
        }
    }
}

/// One operation of a plan, in words.
fn describe(op: &Operation) -> String {
    match op {
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
        } => format!("move {} {table:?} blocks {from} -> {to}", blocks.len()),
    }
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

    fn what(containers: Option<usize>, min_gain: Option<f64>) -> WhatIf {
        WhatIf {
            containers,
            min_gain,
            ..WhatIf::default()
        }
    }

    fn write(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("s.json");
        std::fs::write(&p, SNAP).unwrap();
        p
    }

    #[test]
    fn compute_bound_job_gets_more_workers() {
        let dir = tempfile::tempdir().unwrap();
        let r = report(&write(dir.path()), &what(None, Some(0.05))).unwrap();
        assert!(r.contains("predicted epoch time per split"), "{r}");
        assert!(
            r.contains("decision: reconfigure to 3 workers + 1 servers"),
            "{r}"
        );
        assert!(
            r.contains("switch e2 to Worker") || r.contains("switch e3 to Worker"),
            "{r}"
        );
        // Which container takes which role, with the blocks it would hold.
        let roles = r
            .lines()
            .find_map(|l| l.strip_prefix("proposed roles: "))
            .unwrap_or_else(|| panic!("no proposed roles in {r}"));
        let (workers, rest) = roles.split_once("; servers ").unwrap();
        assert_eq!(workers.matches(" (").count(), 3, "{roles}");
        assert!(workers.starts_with("workers e1 ("), "{roles}");
        assert!(rest.ends_with("(8); idle none"), "{roles}");
    }

    /// `cruise plan` says whether the search proved its best split.
    #[test]
    fn the_search_says_whether_it_finished() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path());
        let r = report(&p, &what(None, Some(0.05))).unwrap();
        assert!(r.contains("proven best"), "{r}");
        // Unequal containers over the exhaustive search's limit (10):
        // local search.
        let servers: Vec<String> = (2..=12)
            .map(|i| {
                format!(
                    r#"{{"id": "e{i}", "role": "server", "bandwidth_bytes_per_sec": {}e6, "model_blocks": {}}}"#,
                    10 * i,
                    u32::from(i <= 9)
                )
            })
            .collect();
        let big = format!(
            r#"{{"job": {{"total_records": 100000, "mini_batch_size": 100, "bytes_per_mini_batch": 80000.0,
                 "input_blocks": 8, "model_blocks": 8, "remaining_epochs": 10.0}},
               "containers": [
                 {{"id": "e1", "role": "worker", "compute_secs_per_record": 2e-5, "bandwidth_bytes_per_sec": 1e9,
                   "input_blocks": 8, "mini_batches": 50}},
                 {}]}}"#,
            servers.join(",\n")
        );
        let p = dir.path().join("big.json");
        std::fs::write(&p, big).unwrap();
        let r = report(&p, &what(None, Some(0.05))).unwrap();
        assert!(r.contains("stopped early"), "{r}");
    }

    #[test]
    fn more_containers_are_used_and_fewer_are_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path());
        // With 10 epochs left, adding two containers (10 s each by the
        // default prior) saves less net of its plan than switching a
        // server to a worker; with 100 left it saves more.
        let r = report(&p, &what(Some(6), Some(0.05))).unwrap();
        assert!(
            r.contains("fastest: 4 workers + 2 servers")
                && r.contains("decision: reconfigure to 2 workers + 2 servers"),
            "{r}"
        );
        let long = SNAP.replace("\"remaining_epochs\": 10.0", "\"remaining_epochs\": 100.0");
        let p6 = dir.path().join("long.json");
        std::fs::write(&p6, long).unwrap();
        let r = report(&p6, &what(Some(6), Some(0.05))).unwrap();
        assert!(r.contains("add offered"), "{r}");
        let r = report(&p, &what(Some(3), Some(0.05))).unwrap();
        assert!(r.contains("forced") && r.contains("delete e4"), "{r}");
    }

    /// `--remaining-epochs` decides as if that many epochs were left (the
    /// long snapshot above), and `--json` says the decision and the roles
    /// it proposes.
    #[test]
    fn the_epochs_left_can_be_set_and_the_decision_read_as_json() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path());
        let w = WhatIf {
            containers: Some(6),
            min_gain: Some(0.05),
            remaining_epochs: Some(100.0),
            json: true,
        };
        let v: serde_json::Value = serde_json::from_str(&report(&p, &w).unwrap()).unwrap();
        let ops = v["decision"]["reconfigure"]["plan"]["ops"]
            .as_array()
            .unwrap();
        assert!(ops.iter().any(|o| o["op"]["op"] == "add"), "{v}");
        let proposed = v["proposed"].as_object().unwrap();
        assert_eq!(proposed.len(), 6, "{v}");
        let workers = proposed
            .values()
            .filter(|x| x["role"] == "worker" && x["input_blocks"].as_u64() > Some(0))
            .count();
        assert_eq!(workers, 4, "{v}");
        // The snapshot's own 10 epochs: no container added.
        let w = WhatIf {
            remaining_epochs: None,
            ..w
        };
        let v: serde_json::Value = serde_json::from_str(&report(&p, &w).unwrap()).unwrap();
        let ops = v["decision"]["reconfigure"]["plan"]["ops"]
            .as_array()
            .unwrap();
        assert!(ops.iter().all(|o| o["op"]["op"] != "add"), "{v}");
        let bad = WhatIf {
            remaining_epochs: Some(-1.0),
            ..WhatIf::default()
        };
        let e = report(&p, &bad).unwrap_err().to_string();
        assert!(e.contains("--remaining-epochs -1"), "{e}");
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
        let r = report(&p, &what(None, None)).unwrap();
        assert!(
            r.contains("policy (defaults: the snapshot has none)"),
            "{r}"
        );
        assert!(
            r.contains("decision: stay") && r.contains("does not pay"),
            "{r}"
        );

        let cheap = r#"{"min_gain": 0.05, "max_parallel": 8, "op_costs": [
            {"op": "switch", "per_op": 0.002, "per_wire_sec": 0.0},
            {"op": {"move": "input"}, "per_op": 0.02, "per_wire_sec": 1.0},
            {"op": {"move": "model"}, "per_op": 0.02, "per_wire_sec": 1.0}]}"#;
        let with_policy = short.replacen(
            "\"containers\"",
            &format!("\"policy\": {cheap}, \"containers\""),
            1,
        );
        std::fs::write(&p, &with_policy).unwrap();
        let r = report(&p, &what(None, None)).unwrap();
        assert!(r.contains("policy (the job's, from the snapshot)"), "{r}");
        assert!(r.contains("switch 0.002 s"), "{r}");
        assert!(
            r.contains("decision: reconfigure to 3 workers + 1 servers"),
            "{r}"
        );
        // --min-gain still overrides the job's threshold...
        let r = report(&p, &what(None, Some(0.9))).unwrap();
        assert!(
            r.contains("least gain 90.0%") && r.contains("decision: stay"),
            "{r}"
        );
        // ...within range.
        let e = report(&p, &what(None, Some(1.5))).unwrap_err().to_string();
        assert!(e.contains("--min-gain 1.5"), "{e}");
        // A bad policy is named by its field.
        std::fs::write(&p, with_policy.replace("0.002", "-1")).unwrap();
        let e = report(&p, &what(None, None)).unwrap_err().to_string();
        assert!(e.contains("policy.op_costs[0].per_op"), "{e}");

        // The job counted its looks: on the first of two it only considers
        // the split; on the second, with the first recorded, it reconfigures.
        let first = with_policy.replace(
            "\"max_parallel\": 8,",
            "\"max_parallel\": 8, \"confirmations\": 2,",
        );
        std::fs::write(&p, &first).unwrap();
        let r = report(&p, &what(None, None)).unwrap();
        assert!(r.contains("2 looks in a row to reconfigure"), "{r}");
        assert!(
            r.contains("decision: considering 3 workers + 1 servers") && r.contains("look 1 of 2"),
            "{r}"
        );
        let second = first.replace(
            "\"confirmations\": 2,",
            "\"confirmations\": 2, \"proposed\": {\"workers\": 3, \"servers\": 1, \"looks\": 1},",
        );
        std::fs::write(&p, &second).unwrap();
        let r = report(&p, &what(None, None)).unwrap();
        assert!(
            r.contains("decision: reconfigure to 3 workers + 1 servers"),
            "{r}"
        );
        // A look that proposed another split counts too: the looks confirm
        // leaving, the latest says where to.
        std::fs::write(&p, second.replace("\"workers\": 3,", "\"workers\": 2,")).unwrap();
        let r = report(&p, &what(None, None)).unwrap();
        assert!(
            r.contains("decision: reconfigure to 3 workers + 1 servers"),
            "{r}"
        );
    }

    #[test]
    fn blocks_are_dealt_as_at_a_jobs_start() {
        // 8 input blocks on 3 workers: b·3/8 = 0,0,0,1,1,1,2,2.
        assert_eq!(initial_counts(8, 5, 3, 2), (vec![3, 3, 2], vec![3, 2]));
        assert_eq!(initial_counts(4, 4, 1, 4), (vec![4], vec![1, 1, 1, 1]));
    }

    // Every split of e1..e4 from SNAP: compute 2e-5 s/record on every
    // container (the measured one's, same speed), 1000 batches per epoch.
    // 1W+3S: compute 2 s; 80 KB per batch over 1 GB/s links, server-bound
    // 1·(3/8)·80e3/1e9 = 3e-5 s vs the worker's own 8e-5 s → comm 0.08 s;
    // serial: 2.08 s. 3W+1S: compute 2·3/8 = 0.75 s on the first worker
    // (3 blocks, 375 batches), the one server carries 3·80e3/1e9 = 2.4e-4
    // s a batch → comm 0.09 s: 0.84 s.
    #[test]
    fn every_split_of_an_order_is_predicted() {
        let snap = Snapshot::from_json(SNAP).unwrap();
        let order: Vec<String> = ["e1", "e2", "e3", "e4"].map(String::from).to_vec();
        let s = predict_splits(&snap, &order).unwrap();
        assert_eq!(s.len(), 3);
        assert!((s[0].epoch_secs - 2.08).abs() < 1e-9, "{s:?}");
        assert!((s[2].epoch_secs - 0.84).abs() < 1e-9, "{s:?}");
        // e1 and e2 hold 3 blocks each and tie.
        assert!(s[2].bottleneck.starts_with("compute of e"), "{s:?}");
        // Alike containers: no split of 8 blocks over 3 workers beats 3, 3, 2,
        // and the solver's split is never worse than the dealt one.
        assert!((s[2].solved_bound_secs - 0.84).abs() < 1e-9, "{s:?}");
        for x in &s {
            assert!(x.solved_bound_secs <= x.bound_secs * (1.0 + 1e-9), "{x:?}");
        }
        let e = predict_splits(&snap, &["e1".into(), "e9".into()]).unwrap_err();
        assert!(e.to_string().contains("e9"), "{e}");
        let e = predict_splits(&snap, &["e1".into(), "e1".into()]).unwrap_err();
        assert!(e.to_string().contains("e1"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let j = splits_report(&write(dir.path()), "e4,e3,e2,e1", true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["splits"].as_array().unwrap().len(), 3);
        assert_eq!(v["order"][0], "e4");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.json");
        std::fs::write(&p, "{\"job\": 1}").unwrap();
        let e = report(&p, &what(None, Some(0.05))).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
        let e = report(&dir.path().join("missing.json"), &what(None, Some(0.05)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
    }
}
