//! The optimizer's container changes go through the resource manager: a job
//! running on the YARN (or Mesos) simulator with room for 2 evaluators is
//! offered 2 more when a node (agent) joins; the optimizer grows the job to
//! 4, the YARN service is flexed (Mesos tasks are launched) and the
//! simulator shows 4 live containers (tasks) of the job; at the end nothing
//! is left running.
//!
//! Taking capacity back on these clusters kills containers (YARN
//! decommissions the node, Mesos loses the agent); that is evaluator loss,
//! not a reclaim the job can plan for, and is covered by the runtime tests.
//!
//! Needs `cargo build -p cruise-appmaster -p cruise-sim` first.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Command;

use cruise_integration::{Sim, Spawned, await_status, binary, hadoop_conf_dir, status_address};

const WAIT: Duration = Duration::from_secs(180);

/// `cruise run` on a cluster runtime for a practically endless number of
/// epochs, allowed to grow to 4 containers, looking at capacity and
/// metrics several times a second.
fn endless_job(work: &Path, runtime_args: &[&str]) -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.args(["run", "-n", "2", "-w", "1", "--epochs", "100000"])
        .args(runtime_args)
        .args(["--set", "mlr.generate_samples=20000"])
        .args(["--set", "runtime.max_containers=4"])
        .args(["--set", "runtime.allocation_timeout_ms=120000"])
        .args(["--set", "yarn.capacity_poll_interval_ms=300"])
        .args(["--set", "optimizer.interval_ms=300"])
        .arg("--work-dir")
        .arg(work)
        .env("HADOOP_USER_NAME", "alice")
        .env_remove("RUST_LOG");
    c
}

fn active(s: &Value) -> usize {
    s["evaluators"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["role"] != "idle").count())
        .unwrap_or(0)
}

async fn get(url: String) -> Value {
    reqwest::get(&url).await.unwrap().json().await.unwrap()
}

async fn put_capacity(sim: &Sim, body: Value) {
    let r = reqwest::Client::new()
        .put(format!("{}/sim/capacity", sim.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

/// Runs the job until it trains on 2 evaluators, offers 2 more, and waits
/// until the optimizer has used them; returns the job (still running).
async fn grow(job: Spawned, sim: &Sim, more: Value) -> Spawned {
    let addr = status_address(&job, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\nsimulator log:\n{}", job.stderr(), sim.log()));
    let st = await_status(&addr, WAIT, |s| {
        s["phase"] == "training" && s["records_processed"].as_u64().unwrap_or(0) > 0
    })
    .await
    .unwrap();
    assert_eq!(active(&st), 2, "{st}");
    assert_eq!(st["capacity"], 2, "{st}");

    put_capacity(sim, more).await;
    let grown = await_status(&addr, WAIT, |s| {
        active(s) == 4
            && s["reconfigurations"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", job.stderr()));
    assert_eq!(grown["capacity"], 4, "{grown}");
    let plan = &grown["reconfigurations"][0];
    assert!(plan["failed"].as_array().unwrap().is_empty(), "{plan}");
    assert!(
        plan["op_secs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o[0] == "add"),
        "{plan}"
    );
    // Training goes on with 4.
    let records = grown["records_processed"].as_u64().unwrap();
    await_status(&addr, WAIT, |s| {
        s["records_processed"].as_u64().unwrap_or(0) > records + 20_000
    })
    .await
    .unwrap();
    job
}

async fn stop(mut job: Spawned) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job.child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    job.wait(WAIT).await.unwrap();
    let err = job.stderr();
    assert!(err.contains("cancelled"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimizer_grows_the_job_through_the_yarn_service() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    // One node with room for two 1 GiB evaluators.
    let yarn = Sim::start(
        "yarn",
        &[
            "--webhdfs",
            &hdfs.url,
            "--nodes",
            "1",
            "--node-memory-mb",
            "2048",
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();
    let mut c = endless_job(&dir.path().join("work"), &["--runtime", "yarn"]);
    c.env("HADOOP_CONF_DIR", &conf);
    let job = Spawned::spawn(c).unwrap();

    let job = grow(job, &yarn, json!({"nodes": 2})).await;

    // The service was flexed: 4 live containers, on both nodes.
    let v = get(format!("{}/sim/containers", yarn.url)).await;
    let live: Vec<&Value> = v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] != "COMPLETE" && c["owner"]["instance"]["service"].is_string())
        .collect();
    assert_eq!(live.len(), 4, "{v}");
    let service = live[0]["owner"]["instance"]["service"]
        .as_str()
        .unwrap()
        .to_string();
    let svc = get(format!("{}/app/v1/services/{service}", yarn.url)).await;
    assert_eq!(
        svc["components"][0]["number_of_containers"], 4,
        "the component was flexed: {svc}"
    );

    stop(job).await;
    let r = reqwest::get(format!("{}/app/v1/services/{service}", yarn.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "service {service} still exists");
    // Every container ends: the service's are released with it, and an
    // evaluator whose AM has gone exits by itself (the resource manager
    // records that a moment later, so wait for it rather than look once).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(format!("{}/sim/containers", yarn.url)).await;
        let all_done = v["containers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "COMPLETE");
        if all_done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "containers still running 30 s after the job ended: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimizer_grows_the_job_through_mesos_offers() {
    // One agent with room for two 1-cpu evaluators.
    let mesos = Sim::start(
        "mesos",
        &[
            "--allocation-interval-ms",
            "200",
            "--agents",
            "1",
            "--agent-cpus",
            "2",
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job = Spawned::spawn(endless_job(
        &dir.path().join("work"),
        &["--runtime", "mesos", "--master", &mesos.address()],
    ))
    .unwrap();

    let job = grow(job, &mesos, json!({"agents": 2})).await;

    // Two more tasks were launched, on the new agent.
    let st = get(format!("{}/sim/state", mesos.url)).await;
    let running: Vec<&Value> = st["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "TASK_RUNNING")
        .collect();
    assert_eq!(running.len(), 4, "{st}");
    let agents: std::collections::BTreeSet<&str> = running
        .iter()
        .filter_map(|t| t["agent_id"].as_str())
        .collect();
    assert_eq!(agents.len(), 2, "{st}");

    stop(job).await;
    let st = get(format!("{}/sim/state", mesos.url)).await;
    assert!(st["frameworks"].as_array().unwrap().is_empty(), "{st}");
    assert!(
        st["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["state"] != "TASK_RUNNING"),
        "{st}"
    );
}
