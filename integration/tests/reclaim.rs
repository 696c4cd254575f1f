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

use cruise_integration::{Sim, binary, hadoop_conf_dir, text, wait_for};
use serde_json::{Value, json};

async fn get_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// `(item[id], item[place])` of the first of `list`'s items that `keep`
/// keeps, once it keeps four (the job's containers).
fn first_of_four(
    list: &Value,
    keep: impl Fn(&Value) -> bool,
    id: &str,
    place: &str,
) -> Option<(String, String)> {
    let kept: Vec<(String, String)> = list
        .as_array()?
        .iter()
        .filter(|v| keep(v))
        .filter_map(|v| Some((v[id].as_str()?.to_string(), v[place].as_str()?.to_string())))
        .collect();
    (kept.len() == 4).then(|| kept[0].clone())
}

/// The job every test runs: 4 containers, enough epochs that training
/// outlasts the forced plan, generated input.
fn job_args(work: &std::path::Path) -> Vec<String> {
    [
        "--containers",
        "4",
        "--epochs",
        "60",
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

/// Starts `cruise` as set up in `cmd`, logging at info (the AM's log says
/// which containers were given back).
fn spawn(cmd: &mut tokio::process::Command) -> tokio::process::Child {
    cmd.env("RUST_LOG", "info")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the job's end: it succeeded, a forced plan gave `container`
/// back, and no loss was survived. Its stdout and stderr.
async fn finish(child: tokio::process::Child, sim: &Sim, container: &str) -> (String, String) {
    let o = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("cruise run did not finish in 300 s")
        .unwrap();
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(
        o.status.success(),
        "cruise run failed:\n{out}\n{err}\nsimulator log:\n{}",
        sim.log()
    );
    assert!(
        out.contains("forced: the resource manager reclaims containers"),
        "no forced plan in the summary:\n{out}\n{err}"
    );
    assert!(
        !out.contains("survived"),
        "a container was lost, not given back:\n{out}\n{err}"
    );
    assert!(
        err.contains(&format!(
            "container {container}, reclaimed by the resource manager"
        )),
        "container {container} was not given back:\n{err}"
    );
    (out, err)
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
    let child = spawn(
        tokio::process::Command::new(binary("cruise").unwrap())
            .args(["run", "--runtime", "mesos", "--master", &mesos.address()])
            .args(job_args(&dir.path().join("work"))),
    );
    let state_url = format!("{}/sim/state", mesos.url);

    // Once the four tasks are launched, the agent of one goes into maintenance.
    let (task, agent) = wait_for("four launched tasks", Duration::from_secs(120), || async {
        let st = get_json(&state_url).await;
        first_of_four(
            &st["tasks"],
            |t| t["framework_id"].is_string(),
            "task_id",
            "agent_id",
        )
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

    finish(child, &mesos, &task).await;

    // The inverse offer was accepted once the task on that agent ended on
    // the job's release (the framework's tasks are gone from the state
    // after its teardown; the AM's log names it).
    let st = get_json(&state_url).await;
    let io = &st["inverse_offers"];
    assert_eq!(io.as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(io[0]["status"], "ACCEPTED", "{st}");
    assert_eq!(io[0]["agent_id"], agent.as_str(), "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yarn_decommissioning_node_is_honoured_without_loss() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let yarn = Sim::start(
        "yarn",
        &[
            "--webhdfs",
            &hdfs.url,
            "--nodes",
            "6",
            "--node-memory-mb",
            "1024",
            "--node-vcores",
            "1",
            "--distinct-node-hosts",
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();
    let child = spawn(
        tokio::process::Command::new(binary("cruise").unwrap())
            .args(["run", "--runtime", "yarn"])
            .args(job_args(&dir.path().join("work")))
            .args(["--set", "yarn.decommission_poll_interval_ms=100"])
            .env("HADOOP_CONF_DIR", &conf)
            .env("HADOOP_USER_NAME", "alice"),
    );
    let containers_url = format!("{}/sim/containers", yarn.url);

    // Once the service's four containers are allocated, the node of one
    // starts decommissioning, with a notice.
    let (container, node) = wait_for(
        "four service containers",
        Duration::from_secs(120),
        || async {
            let v = get_json(&containers_url).await;
            first_of_four(
                &v["containers"],
                |c| c["owner"]["instance"].is_object() && c["state"] != "COMPLETE",
                "id",
                "node",
            )
        },
    )
    .await
    .unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/sim/decommission", yarn.url))
        .json(&json!({"node": node, "timeout_secs": 300}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    // The filter is honoured: the node is listed as decommissioning, with
    // its timeout, and no longer as running.
    let nodes = |states: &str| {
        let url = format!("{}/ws/v1/cluster/nodes?states={states}", yarn.url);
        async move { get_json(&url).await["nodes"]["node"].clone() }
    };
    let d = nodes("DECOMMISSIONING").await;
    assert_eq!(d.as_array().map(Vec::len), Some(1), "{d}");
    assert_eq!(d[0]["id"], node.as_str(), "{d}");
    assert_eq!(d[0]["decommissioningTimeout"], 300, "{d}");
    let running = nodes("RUNNING").await;
    assert_eq!(running.as_array().map(Vec::len), Some(5), "{running}");

    let (_, err) = finish(child, &yarn, &container).await;
    assert!(err.contains("is decommissioning, 300 s notice"), "{err}");
    // Nothing else was placed on the decommissioning node.
    let v = get_json(&containers_url).await;
    let on_node: Vec<&Value> = v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["node"] == node.as_str())
        .collect();
    assert_eq!(on_node.len(), 1, "{v}");
}
