//! The emulated cluster through the real path: `cruise run` on the local
//! runtime with `[emulation]`, its evaluators as separate processes. A
//! container emulated slower (a fifth of the CPU, a 20 Mbit/s link) must be
//! measured slower by the job itself, in its CPU calibration, its mini-batch
//! time and its link capacity (and in-process, its compute per record); and
//! under the kernel mechanism its namespace, bridge and cgroup must be gone
//! once the job is stopped.
//!
//! The expected differences are five-fold or more; the checks ask for two-
//! to three-fold, so a loaded machine does not fail them.

use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use tokio::sync::Mutex;

use cruise_integration::{Spawned, await_status, binary, status_address};
use cruise_rm::emulation::{CgroupCpu, Choice, HostFacts, resolve};

const WAIT: Duration = Duration::from_secs(120);

/// Container 2 (a worker, with container 1) is the slow one; container 3
/// serves.
const CLUSTER: &str = "0.5/-, 0.1/20mbit, 0.5/-";
/// 20 Mbit/s in bytes per second.
const SLOW_LINK: f64 = 2.5e6;

/// The tests measure speeds: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

fn job(work: &std::path::Path, mechanism: &str, subnet: &str) -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG")
        .args(["run", "-n", "3", "-w", "2", "-e", "100000"])
        .args(["--set", "mlr.generate_samples=20000"])
        .args(["--set", &format!("emulation.containers={CLUSTER}")])
        .args(["--set", &format!("emulation.mechanism={mechanism}")])
        .args(["--set", &format!("emulation.subnet={subnet}")])
        // Measure (probes, calibration) but never reconfigure.
        .args(["--set", "optimizer.min_gain=0.99"])
        .args(["--set", "optimizer.probe_bytes=1048576"])
        .arg("--work-dir")
        .arg(work);
    c
}

/// The evaluator id of the container started `n`-th (its id ends in `_00000n`).
fn evaluator_of(status: &Value, n: u32) -> Option<u64> {
    let suffix = format!("_{n:06}");
    status["evaluators"]
        .as_array()?
        .iter()
        .find(|e| {
            e["container"]
                .as_str()
                .is_some_and(|c| c.ends_with(&suffix))
        })
        .and_then(|e| e["id"].as_u64())
}

fn metric(status: &Value, id: u64, key: &str) -> Option<f64> {
    status["metrics"]["evaluators"]
        .as_array()?
        .iter()
        .find(|e| e["id"].as_u64() == Some(id))
        .and_then(|e| e[key].as_f64())
}

/// Bulk-measured capacities of the links that do and do not touch `id`.
fn capacities(status: &Value, id: u64) -> (Vec<f64>, Vec<f64>) {
    let (mut touching, mut others) = (Vec::new(), Vec::new());
    for l in status["metrics"]["capacity"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let rate = l["bytes_per_sec"].as_f64().unwrap_or(0.0);
        if l["from"].as_u64() == Some(id) || l["to"].as_u64() == Some(id) {
            touching.push(rate);
        } else {
            others.push(rate);
        }
    }
    (touching, others)
}

/// Everything the checks need has been measured: both workers' compute, all
/// three calibrations, and a capacity on each side of the slow container.
fn measured(s: &Value) -> bool {
    let (Some(fast), Some(slow)) = (evaluator_of(s, 1), evaluator_of(s, 2)) else {
        return false;
    };
    let (touching, others) = capacities(s, slow);
    s["phase"] == "training"
        && metric(s, fast, "comp_secs_per_record").is_some()
        && metric(s, slow, "comp_secs_per_record").is_some()
        && metric(s, fast, "mini_batches").unwrap_or(0.0) >= 20.0
        && metric(s, slow, "mini_batches").unwrap_or(0.0) >= 20.0
        && metric(s, slow, "cpu_speed").is_some()
        && metric(s, fast, "cpu_speed").is_some()
        && !touching.is_empty()
        && !others.is_empty()
}

/// The slow container is measured slower: its CPU calibration, its
/// mini-batches, its links; and, throttled in-process, its compute. (Under a
/// cgroup quota a mini-batch's compute, a fraction of a millisecond, often
/// runs within the period's quota at full speed, and the share shows in the
/// waits between; the calibration spans thirty periods.)
fn check_slow_container(s: &Value, in_process: bool) {
    let (fast, slow) = (
        evaluator_of(s, 1).expect("container 1"),
        evaluator_of(s, 2).expect("container 2"),
    );
    let m = |id, key| metric(s, id, key).unwrap_or(f64::NAN);
    let speed = m(slow, "cpu_speed") / m(fast, "cpu_speed");
    let comp = m(slow, "comp_secs_per_record") / m(fast, "comp_secs_per_record");
    let batch = |id| m(id, "comp_secs_per_record") * 100.0 + m(id, "comm_secs_per_mini_batch");
    let batch = batch(slow) / batch(fast);
    let (touching, others) = capacities(s, slow);
    eprintln!(
        "slow/fast: CPU calibration {speed:.2}, compute per record {comp:.2}, mini-batch {batch:.2}; link capacities touching the slow container {touching:?} B/s, others {others:?} B/s"
    );
    assert!(
        speed < 0.5,
        "CPU calibration slow/fast = {speed:.2} (expected ~0.2): {s}"
    );
    assert!(batch > 2.0, "mini-batch time slow/fast = {batch:.2}: {s}");
    if in_process {
        assert!(
            comp > 2.0,
            "compute per record slow/fast = {comp:.2} (expected ~5): {s}"
        );
    }
    for rate in &touching {
        assert!(
            *rate < 1.5 * SLOW_LINK,
            "a link of the 20 Mbit/s container carried {rate:.0} B/s: {s}"
        );
    }
    for rate in &others {
        assert!(
            *rate > 3.0 * SLOW_LINK,
            "an unlimited link carried only {rate:.0} B/s: {s}"
        );
    }
}

/// Names in the kernel that carry `tag` (the AM's process id).
fn kernel_leftovers(tag: u32) -> Vec<String> {
    let mut out = Vec::new();
    let netns = format!("cruise-{tag}-");
    if let Ok(d) = std::fs::read_dir("/run/netns") {
        out.extend(
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with(&netns)),
        );
    }
    if let Ok(o) = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
    {
        let links = String::from_utf8_lossy(&o.stdout).to_string();
        for name in [format!("crb{tag}:"), format!("crv{tag}x")] {
            if links.contains(&name) {
                out.push(name);
            }
        }
    }
    // Containers' groups are made where the runtime's own probe says (under
    // cgroup v1, this process's group, which need not be the top).
    if let Some(CgroupCpu::V1(root) | CgroupCpu::V2(root)) = HostFacts::probe().cgroup
        && let Ok(d) = std::fs::read_dir(&root)
    {
        out.extend(
            d.flatten()
                .map(|e| e.path().display().to_string())
                .filter(|p| p.contains(&netns)),
        );
    }
    out
}

/// Whether this machine has what the kernel mechanism needs for this
/// cluster's shapes (CPU shares and link rates), as the runtime decides it.
fn kernel_possible() -> Result<(), String> {
    resolve(Choice::Kernel, &HostFacts::probe(), true, true)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_emulation_is_measured_and_removed() {
    if let Err(why) = kernel_possible() {
        eprintln!("skipped: {why}");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut p = Spawned::spawn(job(dir.path(), "kernel", "10.78.9.0/24")).unwrap();
    let am = p.child.id().expect("the AM runs");
    let addr = status_address(&p, WAIT).await.unwrap();
    let s = await_status(&addr, WAIT, measured).await.unwrap();
    assert!(
        s["emulation"]
            .as_str()
            .is_some_and(|e| e.starts_with("kernel")),
        "{}",
        s["emulation"]
    );
    for e in s["evaluators"].as_array().unwrap() {
        let a = e["data_addr"].as_str().unwrap_or("");
        assert!(
            a.starts_with("10.78.9."),
            "evaluator outside its namespace: {a}"
        );
    }
    assert!(
        !kernel_leftovers(am).is_empty(),
        "no namespaces while running"
    );
    check_slow_container(&s, false);

    // Stopped (as by Ctrl-C), the job removes what it created.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(am as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(!status.success(), "a cancelled job exits non-zero");
    let left = kernel_leftovers(am);
    assert!(left.is_empty(), "left behind: {left:?}\n{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_emulation_is_measured() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut p = Spawned::spawn(job(dir.path(), "process", "10.78.9.0/24")).unwrap();
    let addr = status_address(&p, WAIT).await.unwrap();
    let s = await_status(&addr, WAIT, measured).await.unwrap();
    assert!(
        s["emulation"]
            .as_str()
            .is_some_and(|e| e.starts_with("process")),
        "{}",
        s["emulation"]
    );
    check_slow_container(&s, true);
    let am = p.child.id().expect("the AM runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(am as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    p.wait(WAIT).await.unwrap();
}

/// Asking for the kernel mechanism where it cannot work fails the job at
/// once, naming the key (only checkable when not root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_emulation_refused_without_root() {
    if nix::unistd::geteuid().is_root() {
        eprintln!("skipped: running as root, where the kernel mechanism works");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = Spawned::spawn(job(dir.path(), "kernel", "10.78.9.0/24")).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(!status.success());
    let err = p.stderr();
    assert!(
        err.contains("emulation.mechanism") && err.contains("root"),
        "{err}"
    );
}
