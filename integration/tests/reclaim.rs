//! Graceful reclaim on the cluster simulators: the cluster takes a
//! container back with notice (a Mesos inverse offer for its agent, a YARN
//! node decommissioning), the job's forced plan empties and releases it in
//! time, and the job finishes with no loss.
//!
//! The notice is given as soon as every container is launched, before any
//! evaluator can have registered; the AM holds it until training starts and
//! then plans at once, so the test waits on conditions (with deadlines),
//! not on timing (training lasts well beyond the plan).
//!
//! Needs `cargo build -p cruise-appmaster -p cruise-sim` first.

use std::time::Duration;

use cruise_integration::{Sim, binary, text, wait_for};
use serde_json::{Value, json};

async fn get_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// The job every test runs: 4 containers, enough epochs that training
/// outlasts the forced plan, generated input.
fn job_args(work: &std::path::Path) -> Vec<String> {
    [
        "--containers",
        "4",
        "--epochs",
        "20",
        "--set",
        "mlr.generate_samples=20000",
        "--set",
        "optimizer.interval_ms=500",
        "--work-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([work.display().to_string()])
    .collect()
}

/// The summary says a forced plan gave containers back and no loss was
/// survived.
fn assert_reclaimed_without_loss(out: &str, err: &str) {
    assert!(
        out.contains("forced: the resource manager reclaims containers"),
        "no forced plan in the summary:\n{out}\n{err}"
    );
    assert!(
        !out.contains("survived"),
        "a container was lost, not given back:\n{out}\n{err}"
    );
    assert!(
        err.contains("reclaimed by the resource manager"),
        "the reclaimed container's end was not reported as such:\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesos_inverse_offer_is_honoured_without_loss() {
    let mesos = Sim::start(
        "mesos",
        &[
            "--allocation-interval-ms",
            "200",
            "--agents",
            "6",
            "--agent-cpus",
            "1",
            "--agent-mem-mb",
            "1024",
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut run = tokio::process::Command::new(binary("cruise").unwrap());
    run.args(["run", "--runtime", "mesos", "--master", &mesos.address()])
        .args(job_args(&dir.path().join("work")))
        .env("RUST_LOG", "info")
        .kill_on_drop(true);
    let child = run
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let state_url = format!("{}/sim/state", mesos.url);

    // Once the four tasks are launched, the agent of one goes into maintenance.
    let (task, agent) = wait_for("four launched tasks", Duration::from_secs(120), || async {
        let st = get_json(&state_url).await;
        let running: Vec<(String, String)> = st["tasks"]
            .as_array()?
            .iter()
            .filter(|t| t["framework_id"].is_string())
            .filter_map(|t| {
                Some((
                    t["task_id"].as_str()?.to_string(),
                    t["agent_id"].as_str()?.to_string(),
                ))
            })
            .collect();
        (running.len() == 4).then(|| running[0].clone())
    })
    .await
    .unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/sim/inverse_offer", mesos.url))
        .json(&json!({"agent_id": agent, "start_in_secs": 300.0, "duration_secs": 600.0}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());

    let o = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("cruise run did not finish in 300 s")
        .unwrap();
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(
        o.status.success(),
        "cruise run failed:\n{out}\n{err}\nmaster log:\n{}",
        mesos.log()
    );
    assert_reclaimed_without_loss(&out, &err);

    // The inverse offer was accepted once the task on that agent ended on
    // the job's release (the framework's tasks are gone from the state
    // after its teardown; the AM's log names it).
    let st = get_json(&state_url).await;
    let io = &st["inverse_offers"];
    assert_eq!(io.as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(io[0]["status"], "ACCEPTED", "{st}");
    assert_eq!(io[0]["agent_id"], agent.as_str(), "{st}");
    assert!(
        err.contains(&format!(
            "container {task}, reclaimed by the resource manager"
        )),
        "task {task} on agent {agent} was not given back:\n{err}"
    );
}
