//! An evaluator `SIGKILL`ed while a plan runs, across processes: `cruise
//! run` and its evaluators are OS processes on the local runtime, the last
//! container's link paced (the process emulation) so that the forced
//! scale-in's moves of its blocks take seconds. The capacity drops 10 s in (the
//! local runtime's schedule: the only time-set step; a checkpoint every
//! second is published well before). The AM reports the plan still
//! running and names the move under way; its source is killed then. The
//! plan stops, the lost evaluator's blocks are re-read or restored from the
//! checkpoint, and the job finishes every epoch having evaluated every
//! record once.
//!
//! The job gives back its newest evaluator, which is the last container
//! started (the slow one) when the evaluators register in the order they
//! were started, as they do here; were another given back, its moves would
//! be fast and the kill could come after the plan: the test then fails
//! saying that no operation failed with the loss.

use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use cruise_integration::{Spawned, await_status, binary, finished_evaluating_all, status_address};

const WAIT: Duration = Duration::from_secs(300);

/// The source of the move a slow-plan report names ("move of 3 blocks
/// (..) from evaluator 4 to 2: not finished").
fn move_source(line: &str) -> Option<u64> {
    let rest = &line[line.find("move of ")?..];
    let rest = &rest[rest.find("from evaluator ")? + "from evaluator ".len()..];
    rest.split(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluator_killed_while_a_plan_moves_its_blocks_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG");
    c.args(["run", "--json", "-n", "4", "-w", "2", "--epochs", "10"])
        .args(["--set", "mlr.generate_samples=4000"])
        .args(["--set", "mlr.generate_nnz=20"])
        .args(["--set", "mlr.classes=2"])
        .args(["--set", "mlr.features=400000"])
        .args(["--set", "mlr.features_per_key=1"])
        .args(["--set", "mlr.step_size=4"])
        // The last container started (a server) has a 4 Mbit/s link:
        // moving its half of the 3.2 MB model off takes seconds, a
        // mini-batch's few keys do not.
        .args(["--set", "emulation.containers=3*-,-/4mbit"])
        .args(["--set", "emulation.mechanism=process"])
        // A checkpoint every second: one is published before the
        // capacity drops, whichever evaluator is lost then.
        .args(["--set", "checkpoint.every_epochs=0"])
        .args(["--set", "checkpoint.every_secs=1"])
        // The resource manager takes a container back 10 s in; the job
        // gives back its newest, moving its blocks off first.
        .args(["--set", "runtime.capacity_schedule=10:3"])
        .args(["--set", "runtime.reclaim_deadline_ms=120000"])
        // Only the forced plan, reported while it runs.
        .args(["--set", "optimizer.min_gain=0.99"])
        .args(["--set", "optimizer.slow_plan_report_secs=0.2"])
        .arg("--work-dir")
        .arg(dir.path());
    let mut job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    let line = job
        .wait_for_stderr("reconfiguration still running", WAIT)
        .await
        .unwrap_or_else(|e| panic!("no plan reported running: {e}\n{}", job.stderr()));
    let Some(from) = move_source(&line) else {
        panic!("the running plan names no move: {line}");
    };
    let st = await_status(&addr, WAIT, |_| true).await.unwrap();
    let pid = st["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"].as_u64() == Some(from))
        .and_then(|e| e["pid"].as_u64())
        .unwrap_or_else(|| panic!("evaluator {from} is not in {st}"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let s: Value = finished_evaluating_all(&mut job, WAIT).await.unwrap();
    assert_eq!(s["epochs"].as_array().unwrap().len(), 10, "{s}");
    let lost = s["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(
        lost[0]
            .as_str()
            .unwrap()
            .contains(&format!("evaluator {from}")),
        "{lost:?}"
    );
    let failed: Vec<&str> = s["reconfigurations"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["failed"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    assert!(
        failed
            .iter()
            .any(|f| f.contains(&format!("evaluator {from} was lost"))),
        "no operation of a plan failed with the loss of {from} (killed after the plan?): {failed:?}\n{}",
        job.stderr()
    );
}
