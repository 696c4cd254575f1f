//! Benchmark: the optimizer's choice against a grid search, on an emulated
//! cluster of unequal containers (issue #3): by default 8, two fast and six
//! slow; `--cluster` takes any spec and `--generated SEED/INDEX` one of the
//! clusters `bench-fidelity` draws (issue #16).
//!
//! The cluster is the local runtime's `[emulation]`: each container gets its
//! own CPU share and link bandwidth, by network namespaces, `tc` and cgroups
//! when run as root with the tools (else by throttling inside the evaluators;
//! the output says which). For MLR at three compute/communication ratios
//! (model sizes), real `cruise run` processes (release build):
//!
//! 1. **grid**: every split `W + S = n` with the optimizer off
//!    (`--set optimizer.enabled=false`), each twice:
//!    with the cluster in its start order (its fast containers first, so
//!    they work) and reversed (they serve), since roles are dealt in start
//!    order; data and model are partitioned evenly. A run's epoch time is
//!    the median of its epochs after the first (warm-up), and with
//!    `--reps R` (default 3) the median over the repetitions;
//! 2. **optimizer**: started at 1 worker + n-1 servers and at n-1 + 1 with the
//!    optimizer on; the configuration it reaches is measured by the epochs
//!    that started after its last reconfiguration ended (the first of them
//!    is skipped when there are three or more). A run with fewer than two
//!    such epochs (its job ended during or right after a plan) is
//!    "unsettled": the median is over the other runs, and a case passes
//!    only when most of its runs settled.
//!
//! 3. **steady grid**: the grid's epochs 2 to 4 or 5 come early in a job,
//!    the optimizer's late, and an MLR epoch's cost changes as the model
//!    settles (3-5% on the small case). So the grid's best
//!    [`STEADY_SPLITS`] splits run again, optimizer off, for as many epochs
//!    as the optimizer runs, and are measured by the same number of final
//!    epochs as the optimizer's median run.
//!
//! The figure is reached epoch time / the best grid epoch time (the lower
//! of the grid's and the steady grid's), measured in the same invocation.
//! The ratio to the steady grid's best alone (the same late epochs as the
//! optimizer's) is printed beside it, without a target.
//! Target (issue #3): ≤ 1.03 in every case (Cruise reported up to 1.065).
//! The optimizer may also pick other containers for
//! each role than either grid order, and partition unevenly, so it can beat
//! the grid.
//!
//! Repetitions interleave grid and optimizer runs, so that the machine's
//! load (it is shared) falls on both. About 5 minutes per repetition on 2
//! cores.
//!
//! ```text
//! cargo run --release -p cruise-integration --bin bench-optimizer [-- --reps R]
//!     [--cases small,medium,large] [--cluster SPEC] [--mechanism auto|kernel|process]
//!     [--set KEY=VALUE ...] [--keep DIR]
//! ```

use std::time::Instant;

use anyhow::{Context, bail};

use cruise_integration::bench::{Row, machine_note, median, print_table};
use cruise_integration::clusters;
use cruise_integration::optbench::{
    CASES, NNZ, Run, RunSpec, Settings, datagen, grid_epoch, keep_history, last_epochs, outcome,
    path, reached, reversed, run, split,
};

/// The emulated cluster: 2 fast containers, then 6 at half their CPU and a
/// quarter of their bandwidth (start order; the grid's workers come first).
const CLUSTER: &str = "2*0.3/400mbit, 6*0.15/100mbit";
/// The target ratio.
const TARGET: f64 = 1.03;
/// A CPU share sum above this fraction of the cores makes containers contend.
const CPU_HEADROOM: f64 = 0.9;
/// The grid's best splits measured again in steady state.
const STEADY_SPLITS: usize = 2;

/// A grid entry's cluster order (0: listed, 1: reversed) and workers; the
/// grid holds the `n - 1` splits of the listed order, then the reversed.
fn grid_split(i: usize, n: u32) -> (usize, u32) {
    (i / (n as usize - 1), (i % (n as usize - 1)) as u32 + 1)
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-optimizer [--reps R] [--cases small,medium,large]
                       [--cluster SPEC | --generated SEED/INDEX]
                       [--mechanism auto|kernel|process] [--set KEY=VALUE ...]
                       [--keep DIR]

The optimizer's choice against a grid search of every worker/server split
on an emulated cluster of unequal containers (MLR at three model sizes).
Prints the reached epoch time / the grid's best, per case and start.
About 5 minutes per repetition of the default 8 containers on 2 cores.

  --reps R          repetitions; medians are printed (default 3)
  --cases LIST      which cases to run (default small,medium,large)
  --cluster SPEC    the containers, as in [emulation] containers
                    (default \"2*0.3/400mbit, 6*0.15/100mbit\"); the
                    containers are as many as the spec lists
  --generated S/I   cluster I of seed S of the generator bench-fidelity
                    draws from (its spec is printed)
  --mechanism M     kernel (namespaces, tc, cgroups; needs root), process
                    (throttling inside the evaluators) or auto (default)
  --set KEY=VALUE   a configuration override passed to every `cruise run`
  --keep DIR        keep each optimizer run's snapshots (the one of each plan
                    and the last look's; `cruise plan` reads them) and its
                    history (every decision; `cruise report` reads it) in DIR
";

struct Args {
    reps: usize,
    cases: Vec<String>,
    cluster: String,
    mechanism: String,
    sets: Vec<String>,
    keep: Option<std::path::PathBuf>,
}

fn args() -> anyhow::Result<Args> {
    cruise_integration::bench::exit_on_help(USAGE);
    let mut a = Args {
        reps: 3,
        cases: CASES.iter().map(|c| c.name.to_string()).collect(),
        cluster: CLUSTER.to_string(),
        mechanism: "auto".into(),
        sets: Vec::new(),
        keep: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--reps" => {
                let v = value()?;
                a.reps = v
                    .parse()
                    .ok()
                    .filter(|r| *r > 0)
                    .with_context(|| format!("--reps {v:?} is not a positive number"))?;
            }
            "--cases" => a.cases = value()?.split(',').map(str::to_string).collect(),
            "--cluster" => a.cluster = value()?,
            "--generated" => {
                let (seed, index) = clusters::parse_label(&value()?)?;
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
                let c = clusters::generate(seed, index, cores);
                println!(
                    "Generated cluster {} ({}): {}",
                    c.label(),
                    c.correlation.name(),
                    c.spec()
                );
                a.cluster = c.spec();
            }
            "--mechanism" => a.mechanism = value()?,
            "--set" => a.sets.push(value()?),
            "--keep" => a.keep = Some(value()?.into()),
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let started = Instant::now();
    let s = Settings::new("bench-optimizer", &a.mechanism, &a.sets)?;
    let work = s.work.clone();
    let emu = cruise_conf::EmulationConfig {
        containers: a.cluster.clone(),
        ..cruise_conf::EmulationConfig::default()
    };
    let shapes = emu.parsed()?;
    if let Some(dir) = &a.keep {
        std::fs::create_dir_all(dir).with_context(|| format!("--keep {}", dir.display()))?;
    }
    let n = shapes.len() as u32;
    if n < 2 {
        bail!(
            "--cluster {:?} lists {n} containers; a job needs 2 or more",
            a.cluster
        );
    }
    let cpu: f64 = shapes.iter().map(|s| s.cpu.unwrap_or(f64::INFINITY)).sum();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "## Optimizer quality on an emulated cluster ({})",
        machine_note()
    );
    println!(
        "\nCluster: {n} containers `{}` in listed order (grid also reversed: `{}`); CPU shares sum to {cpu:.2} of {cores} cores{}",
        a.cluster,
        reversed(&a.cluster),
        if cpu > CPU_HEADROOM * cores {
            " — WARNING: more than the machine can give at once, containers contend and the emulation does not hold"
        } else {
            ""
        }
    );
    let result = bench(&s, &a, n);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    println!(
        "\nTotal time {:.1} min.",
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

fn bench(s: &Settings, a: &Args, n: u32) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut mechanism: Option<String> = None;
    for case in CASES.iter().filter(|c| a.cases.iter().any(|n| n == c.name)) {
        let input = datagen(s, case)?;
        // Repetitions interleave the grid and the optimizer runs, so that a
        // change in the machine's load lands on both.
        let orders = [a.cluster.clone(), reversed(&a.cluster)];
        let mut grid: Vec<Vec<f64>> = vec![Vec::new(); 2 * (n as usize - 1)];
        let mut opt: Vec<Vec<(Run, u32)>> = vec![Vec::new(), Vec::new()];
        for rep in 0..a.reps {
            for (o, cluster) in orders.iter().enumerate() {
                for w in 1..n {
                    let r = run(
                        s,
                        &RunSpec {
                            cluster,
                            n,
                            case,
                            input: &input,
                            workers: w,
                            optimizer: false,
                            epochs: case.grid_epochs,
                            sets: Vec::new(),
                        },
                    )?;
                    mechanism.get_or_insert_with(|| r.emulation.clone());
                    grid[o * (n as usize - 1) + w as usize - 1].push(grid_epoch(&r));
                }
            }
            for (x, start) in [1, n - 1].into_iter().enumerate() {
                // Kept runs are named by case, start and repetition.
                let kept = a.keep.as_ref().map(|dir| {
                    let name = format!("{}-from{start}w-{}", case.name, rep + 1);
                    (dir.join(&name), name)
                });
                let r = run(
                    s,
                    &RunSpec {
                        cluster: &a.cluster,
                        n,
                        case,
                        input: &input,
                        workers: start,
                        optimizer: true,
                        epochs: case.opt_epochs,
                        sets: kept
                            .iter()
                            .map(|(path, _)| {
                                format!("optimizer.snapshot_file={}.json", path.display())
                            })
                            .collect(),
                    },
                )?;
                if let (Some(dir), Some((_, name))) = (&a.keep, &kept) {
                    let history = keep_history(s, &r, dir, name)?;
                    println!("kept: {} and {name}*.json", history.display());
                }
                opt[x].push((r, start));
            }
        }
        let grid: Vec<f64> = grid.into_iter().map(|mut v| median(&mut v)).collect();
        // The steady grid: the best splits over a job as long as the
        // optimizer's, by as many final epochs as its median run measured.
        let mut measured: Vec<f64> = opt
            .iter()
            .flatten()
            .filter_map(|(r, _)| match reached(r) {
                (_, Some(_), n) => Some(n as f64),
                _ => None,
            })
            .collect();
        let window = if measured.is_empty() {
            case.opt_epochs as usize / 2
        } else {
            median(&mut measured).round() as usize
        };
        let mut ranked: Vec<usize> = (0..grid.len()).collect();
        ranked.sort_by(|&x, &y| grid[x].total_cmp(&grid[y]));
        let steady_splits: Vec<usize> = ranked.into_iter().take(STEADY_SPLITS).collect();
        let mut steady: Vec<Vec<f64>> = vec![Vec::new(); steady_splits.len()];
        for _ in 0..a.reps {
            for (k, &i) in steady_splits.iter().enumerate() {
                let (order, w) = grid_split(i, n);
                let r = run(
                    s,
                    &RunSpec {
                        cluster: &orders[order],
                        n,
                        case,
                        input: &input,
                        workers: w,
                        optimizer: false,
                        epochs: case.opt_epochs,
                        sets: Vec::new(),
                    },
                )?;
                steady[k].push(last_epochs(&r, window));
            }
        }
        let steady: Vec<f64> = steady.into_iter().map(|mut v| median(&mut v)).collect();
        let label = |i: usize| {
            let (order, w) = grid_split(i, n);
            format!(
                "{} ({})",
                split(u64::from(w), u64::from(n - w)),
                if order == 0 {
                    "listed order"
                } else {
                    "reversed"
                }
            )
        };
        let (best_i, best) = grid
            .iter()
            .enumerate()
            .min_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, t)| (i, *t))
            .context("no grid")?;
        let best_label = label(best_i);
        let title = format!(
            "{} ({}): MLR {} samples × {} features, {} classes, {NNZ} nnz, mini-batch {}; grid: median of epochs 2–{}{}",
            case.name,
            case.what,
            case.samples,
            case.features,
            case.classes,
            case.mini_batch,
            case.grid_epochs,
            if a.reps > 1 {
                format!(", median of {} runs", a.reps)
            } else {
                String::new()
            }
        );
        let grid_rows: Vec<Row> = grid
            .iter()
            .enumerate()
            .map(|(i, t)| Row {
                figure: format!("grid {}", label(i)),
                value: format!("{t:.3} s"),
                reference: format!("best {best_label} {best:.3} s"),
                ratio: Some(t / best),
                target: "—".into(),
                pass: None,
            })
            .collect();
        print_table(&title, &grid_rows);
        let steady_rows: Vec<Row> = steady_splits
            .iter()
            .zip(&steady)
            .map(|(&i, t)| Row {
                figure: format!(
                    "steady grid {}: {} epochs, median of the last {window}",
                    label(i),
                    case.opt_epochs
                ),
                value: format!("{t:.3} s"),
                reference: format!("grid {:.3} s", grid[i]),
                ratio: Some(t / grid[i]),
                target: "—".into(),
                pass: None,
            })
            .collect();
        print_table(
            &format!(
                "{}: the grid's best {} splits in steady state (optimizer off)",
                case.name,
                steady_splits.len()
            ),
            &steady_rows,
        );
        // The reference: the lower of the grid's best and the steady grid's.
        let steady_best = steady_splits
            .iter()
            .zip(&steady)
            .filter(|(_, t)| !t.is_nan())
            .min_by(|x, y| x.1.total_cmp(y.1))
            .map(|(&i, &t)| (format!("{} steady", label(i)), t));
        let (best_label, best) = match &steady_best {
            Some((l, t)) if *t < best => (l.clone(), *t),
            _ => (best_label, best),
        };
        for runs in &opt {
            let mut times = Vec::new();
            let mut splits = Vec::new();
            for (r, start) in runs {
                let (end, t, measured) = reached(r);
                println!(
                    "- {} from {}: {} ({} plans); reached {} measured over {measured} epochs: {}",
                    case.name,
                    split(u64::from(*start), u64::from(n - start)),
                    path(r, *start, n),
                    r.plans.len(),
                    split(end.0, end.1),
                    t.map_or("unsettled".to_string(), |t| format!("{t:.3} s"))
                );
                for (i, p) in r.plans.iter().enumerate() {
                    println!(
                        "    ended at {:.1} s after {:.2} s: {}",
                        p.at_secs, p.secs, p.summary
                    );
                    // The promise beside what came of it.
                    let (got, over) = outcome(r, i);
                    println!(
                        "      predicted {} there, measured {}",
                        p.predicted_after_secs
                            .map_or("?".to_string(), |t| format!("{t:.3} s")),
                        match got {
                            Some(t) => format!(
                                "{t:.3} s over {over} epochs{}",
                                p.predicted_after_secs
                                    .map_or(String::new(), |q| format!(" ({:.2}×)", t / q))
                            ),
                            None => "nothing (no epoch ran wholly before the next plan)".into(),
                        }
                    );
                }
                if let Some(t) = t {
                    times.push(t);
                }
                splits.push(split(end.0, end.1));
            }
            let start = runs.first().map_or(0, |r| r.1);
            splits.dedup();
            // A run whose job ended before its last plan did (or right after)
            // reached nothing measurable: the median is over the others, and
            // the case passes only when most runs settled.
            let settled = times.len();
            let t = median(&mut times);
            let ratio = t / best;
            let most_settled = 2 * settled > runs.len();
            rows.push(Row {
                figure: format!(
                    "{}: from {} the optimizer reached {}",
                    case.name,
                    split(u64::from(start), u64::from(n - start)),
                    splits.join(" / ")
                ),
                value: if t.is_nan() {
                    "unsettled".into()
                } else if settled < runs.len() {
                    format!("{t:.3} s ({settled} of {} runs settled)", runs.len())
                } else {
                    format!("{t:.3} s")
                },
                reference: format!("best {best_label} {best:.3} s"),
                ratio: (!t.is_nan()).then_some(ratio),
                target: format!("≤ {TARGET:.2}×, most runs settled"),
                pass: Some(!t.is_nan() && ratio <= TARGET && most_settled),
            });
            // The same figure against the steady grid alone (measured over
            // the same late epochs as the optimizer's run), where the
            // reference above is the grid's.
            if let Some((l, st)) = &steady_best
                && !t.is_nan()
                && *st > best
            {
                rows.push(Row {
                    figure: format!(
                        "{}: from {}, against the steady grid (same epochs)",
                        case.name,
                        split(u64::from(start), u64::from(n - start)),
                    ),
                    value: format!("{t:.3} s"),
                    reference: format!("best {l} {st:.3} s"),
                    ratio: Some(t / st),
                    target: "—".into(),
                    pass: None,
                });
            }
        }
    }
    println!(
        "\nEmulation: {}",
        mechanism.unwrap_or_else(|| "none".to_string())
    );
    print_table(
        &format!(
            "Optimizer's reached configuration vs the best of the grid{}",
            if a.reps > 1 {
                format!(" (median of {} runs)", a.reps)
            } else {
                String::new()
            }
        ),
        &rows,
    );
    Ok(())
}
