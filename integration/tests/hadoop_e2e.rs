//! End to end on a real Hadoop: Hadoop's own MiniDFSCluster (NameNode and
//! DataNode, WebHDFS) and MiniYARNCluster (ResourceManager with its REST API
//! and the YARN Services REST API, NodeManagers that launch real containers
//! with the DefaultContainerExecutor), started by
//! `integration/hadoop/start.sh DIR`. The tests use the real binaries, real
//! processes and real HTTP: the input and the staging directory on HDFS
//! through WebHDFS, `cruise submit` to the real RM, the AM in a container of
//! a real NodeManager, its evaluators in the containers of a YARN service run
//! by Hadoop's own service AM, and `cruise status --wait`, `cruise logs`,
//! `cruise kill`. YARN's own record of each application (its state and final
//! status, read from the RM's REST API) must match what happened. One more
//! job runs its AM in the foreground (`cruise run --runtime yarn`) and is
//! grown by the optimizer from 2 to 4 evaluators, flexing its service.
//!
//! The tests are `#[ignore]`d, so a plain `cargo test` lists them as
//! needing a real Hadoop. Run them with `CRUISE_HADOOP_DIR=DIR` (the
//! directory given to start.sh) and `-- --ignored`
//! (`integration/hadoop/ci.sh` does all of it); without `CRUISE_HADOOP_DIR`
//! they print SKIPPED and pass, unless `CRUISE_HADOOP_REQUIRED=1` (as in
//! CI). They take turns: they share the cluster's NodeManagers. Needs
//! `cargo build -p cruise-appmaster`.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use cruise_hdfs::{FileSystem, WebHdfsOptions};
use cruise_integration::hadoop::RealHadoop;
use cruise_integration::{
    DEFAULT_JOB_MIN_ACCURACY, Spawned, await_status, binary, status_address, summary_accuracy,
};
use serde_json::Value;

/// The user the jobs run as: not the cluster's superuser (the user that
/// started it), so HDFS's permission checks apply.
const USER: &str = "alice";
const JOB_TIMEOUT: Duration = Duration::from_secs(300);

/// One job at a time on the shared cluster.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn cruise(args: &[&str], h: &RealHadoop) -> Output {
    tokio::time::timeout(
        Duration::from_secs(120),
        cruise_command(h).args(args).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("cruise {args:?} did not finish in 120 s"))
    .expect("running cruise")
}

/// `cruise` with the cluster's HADOOP_CONF_DIR, as `USER`, with its AM run
/// under the registrar.
fn cruise_command(h: &RealHadoop) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(binary("cruise").expect("the cruise binary"));
    c.env("HADOOP_CONF_DIR", &h.conf_dir)
        .env("HADOOP_USER_NAME", USER)
        .env("CRUISE_YARN__AM_REGISTER_JAR", &h.am_register_jar)
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    c
}

/// `GET` a JSON document from the RM; `None` for a 404.
async fn rm_get(h: &RealHadoop, path: &str) -> Option<Value> {
    rm_get_retrying(h, path, Duration::ZERO).await
}

/// [`rm_get`], asking again every 500 ms while the RM answers with a
/// server error, for up to `patience`: the Services API answers 500 while
/// a service's own AM cannot be reached (starting, or replacing a
/// container).
async fn rm_get_retrying(h: &RealHadoop, path: &str, patience: Duration) -> Option<Value> {
    let url = format!("{}{path}", h.rm_url());
    let deadline = Instant::now() + patience;
    loop {
        let r = reqwest::Client::new()
            .get(&url)
            .header("Accept", "application/json")
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        if r.status() == 404 {
            return None;
        }
        if r.status().is_server_error() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        assert!(r.status().is_success(), "GET {url}: HTTP {}", r.status());
        return Some(
            r.json()
                .await
                .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}")),
        );
    }
}

/// YARN's own record of an application: (state, final status).
async fn yarn_app(h: &RealHadoop, app_id: &str) -> (String, String) {
    let v = rm_get(h, &format!("/ws/v1/cluster/apps/{app_id}"))
        .await
        .unwrap_or_else(|| panic!("the RM does not know {app_id}"));
    (
        v["app"]["state"].as_str().unwrap_or_default().to_string(),
        v["app"]["finalStatus"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The service's definition from the Services API, `None` once destroyed.
async fn service(h: &RealHadoop, name: &str) -> Option<Value> {
    rm_get_retrying(
        h,
        &format!("/app/v1/services/{name}?user.name={USER}"),
        Duration::from_secs(30),
    )
    .await
}

/// Containers of a service in state READY.
fn ready_containers(svc: &Value) -> usize {
    svc["components"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .flat_map(|c| c["containers"].as_array().cloned().unwrap_or_default())
                .filter(|x| x["state"] == "READY")
                .count()
        })
        .unwrap_or(0)
}

/// How many instances a service's component has had: one more than the
/// highest instance number among its containers and decommissioned
/// instances (`evaluator-N`).
fn instances_made(svc: &Value) -> usize {
    let number = |name: &str| {
        name.rsplit('-')
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .map(|n| n + 1)
    };
    svc["components"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .flat_map(|c| {
                    let running = c["containers"].as_array().cloned().unwrap_or_default();
                    let gone = c["decommissioned_instances"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    running
                        .into_iter()
                        .filter_map(|x| x["component_instance_name"].as_str().and_then(number))
                        .chain(gone.into_iter().filter_map(|x| x.as_str().and_then(number)))
                        .collect::<Vec<_>>()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

#[test]
fn instances_made_counts_running_and_decommissioned_instances() {
    let svc = serde_json::json!({"components": [{
        "containers": [
            {"component_instance_name": "evaluator-1", "state": "READY"},
            {"component_instance_name": "evaluator-0", "state": "READY"}
        ],
        "decommissioned_instances": ["evaluator-3", "evaluator-2", "evaluator-5"]
    }]});
    assert_eq!(instances_made(&svc), 6);
    assert_eq!(ready_containers(&svc), 2);
    assert_eq!(instances_made(&serde_json::json!({"components": []})), 0);
}

fn service_name(app_id: &str) -> String {
    format!(
        "cruise-{}",
        app_id.trim_start_matches("application_").replace('_', "-")
    )
}

/// Polls until the service is gone (the Services API answers 404).
async fn wait_service_gone(h: &RealHadoop, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(v) = service(h, name).await {
        assert!(
            Instant::now() < deadline,
            "service {name} still exists 120 s after its job ended: {v}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls YARN until the application is in a final state; returns it.
async fn wait_app_final(h: &RealHadoop, app_id: &str, timeout: Duration) -> (String, String) {
    let deadline = Instant::now() + timeout;
    loop {
        let (state, fin) = yarn_app(h, app_id).await;
        if ["FINISHED", "FAILED", "KILLED"].contains(&state.as_str()) {
            return (state, fin);
        }
        assert!(
            Instant::now() < deadline,
            "{app_id} still {state} in YARN after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Submits a job of practically endless epochs on 2 evaluators (the
/// generated input is uploaded to the staging directory by submit) and
/// waits until its service runs both. Returns the application id, the
/// service name and the service's view then.
async fn endless_job_with_two_evaluators(h: &RealHadoop, dir: &Path) -> (String, String, Value) {
    let o = cruise(
        &[
            "submit",
            "--epochs",
            "100000",
            "--containers",
            "2",
            "--set",
            "mlr.generate_samples=2000",
            "--set",
            "runtime.container_memory_mb=512",
            "--set",
            "yarn.am_memory_mb=512",
            "--set",
            "runtime.allocation_timeout_ms=180000",
            "--work-dir",
            dir.join("work").to_str().expect("utf-8"),
        ],
        h,
    )
    .await;
    assert!(o.status.success(), "submit: {}", text(&o.stderr));
    let app_id = text(&o.stdout).trim().to_string();
    let name = service_name(&app_id);
    let deadline = Instant::now() + JOB_TIMEOUT;
    loop {
        if let Some(v) = service(h, &name).await
            && ready_containers(&v) == 2
        {
            return (app_id, name, v);
        }
        let (state, _) = yarn_app(h, &app_id).await;
        assert!(
            !["FINISHED", "FAILED", "KILLED"].contains(&state.as_str()),
            "{app_id} ended ({state}) before its service ran 2 evaluators"
        );
        assert!(
            Instant::now() < deadline,
            "service {name} never had 2 READY containers"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Writes a generated MLR data set to real HDFS (as `USER`, under /tmp)
/// and returns its `hdfs://` URI.
async fn mlr_input_on_hdfs(h: &RealHadoop, dir: &Path, samples: u64) -> String {
    let local = dir.join("mlr.libsvm");
    let o = cruise(
        &[
            "datagen",
            "mlr",
            "--samples",
            &samples.to_string(),
            "--out",
            local.to_str().expect("utf-8 path"),
        ],
        h,
    )
    .await;
    assert!(o.status.success(), "datagen: {}", text(&o.stderr));
    let fs = FileSystem::new(
        cruise_hdfs::HadoopConf::from_dir(&h.conf_dir).expect("the cluster's HADOOP_CONF_DIR"),
        WebHdfsOptions::from_env().with_user(USER),
    );
    let uri = format!(
        "hdfs://{}/tmp/cruise-e2e-{}-{samples}/mlr.libsvm",
        h.nn_rpc,
        std::process::id()
    );
    let data = std::fs::read(&local).expect("reading the generated input");
    fs.create(&uri, bytes::Bytes::from(data), true)
        .await
        .unwrap_or_else(|e| panic!("uploading the input to {uri}: {e}"));
    uri
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Hadoop: integration/hadoop/start.sh DIR, then CRUISE_HADOOP_DIR=DIR and --ignored"]
async fn mlr_job_on_real_yarn_succeeds() {
    let Some(h) = RealHadoop::from_env("mlr_job_on_real_yarn_succeeds").expect("the cluster")
    else {
        return;
    };
    let _turn = TURN.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let input = mlr_input_on_hdfs(&h, dir.path(), 20_000).await;

    let started = Instant::now();
    let o = cruise(
        &[
            "submit",
            "--input",
            &input,
            "--containers",
            "3",
            "--epochs",
            "5",
            "--set",
            "runtime.container_memory_mb=512",
            "--set",
            "yarn.am_memory_mb=512",
            "--set",
            "runtime.allocation_timeout_ms=180000",
        ],
        &h,
    )
    .await;
    assert!(
        o.status.success(),
        "submit to the real RM failed: {}\n{}",
        text(&o.stderr),
        h.log_tail(40)
    );
    let app_id = text(&o.stdout).trim().to_string();
    assert!(app_id.starts_with("application_"), "{app_id}");

    // `cruise status --wait` follows it to the end and exits 0 for success.
    let o = tokio::time::timeout(
        JOB_TIMEOUT,
        cruise_command(&h)
            .args(["status", &app_id, "--wait"])
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("cruise status {app_id} --wait did not return in {JOB_TIMEOUT:?}"))
    .expect("running cruise status");
    let waited = text(&o.stdout);
    let job_secs = started.elapsed().as_secs_f64();
    let logs = cruise(&["logs", &app_id], &h).await;
    let log_text = text(&logs.stdout);
    assert!(
        o.status.success(),
        "status --wait: {waited}\n{}\nAM logs:\n{log_text}\n{}",
        text(&o.stderr),
        text(&logs.stderr)
    );
    assert!(waited.contains("SUCCEEDED"), "{waited}");

    // YARN's own record agrees.
    let (state, fin) = yarn_app(&h, &app_id).await;
    assert_eq!(
        (state.as_str(), fin.as_str()),
        ("FINISHED", "SUCCEEDED"),
        "{log_text}"
    );
    // The AM ran in a container of a real NodeManager.
    let attempts = rm_get(&h, &format!("/ws/v1/cluster/apps/{app_id}/appattempts"))
        .await
        .expect("attempts");
    let attempt = &attempts["appAttempts"]["appAttempt"][0];
    let nodes = rm_get(&h, "/ws/v1/cluster/nodes").await.expect("nodes");
    let node_addrs: Vec<&str> = nodes["nodes"]["node"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["nodeHTTPAddress"].as_str())
        .collect();
    let am_node = attempt["nodeHttpAddress"].as_str().unwrap_or_default();
    assert!(
        node_addrs.contains(&am_node),
        "AM on {am_node:?}, nodes {node_addrs:?}"
    );

    // The AM's output, fetched from the NodeManager by `cruise logs`.
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    let acc = summary_accuracy(&log_text).unwrap_or_else(|| panic!("no accuracy in:\n{log_text}"));
    assert!(
        acc >= DEFAULT_JOB_MIN_ACCURACY,
        "accuracy {acc} in:\n{log_text}"
    );
    let summary = cruise(&["logs", &app_id, "--file", "summary.json"], &h).await;
    let s: Value = serde_json::from_slice(&summary.stdout)
        .unwrap_or_else(|e| panic!("summary.json: {e}: {}", text(&summary.stdout)));
    assert_eq!(s["application"], app_id.as_str());
    let evaluators = s["summary"]["evaluators"].as_array().expect("evaluators");
    assert_eq!(evaluators.len(), 3, "{s}");
    // Evaluators ran in containers of the service's own application.
    for e in evaluators {
        let c = e["container"].as_str().unwrap_or_default();
        assert!(c.starts_with("container_"), "{c}");
        assert!(
            !c.contains(app_id.trim_start_matches("application_")),
            "evaluator {c} in the AM's application"
        );
    }
    wait_service_gone(&h, &service_name(&app_id)).await;
    eprintln!(
        "real hadoop e2e: {app_id} SUCCEEDED after {job_secs:.1} s, accuracy {:.2}%",
        acc * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Hadoop: integration/hadoop/start.sh DIR, then CRUISE_HADOOP_DIR=DIR and --ignored"]
async fn killed_job_is_killed_in_yarn_and_its_service_destroyed() {
    let Some(h) = RealHadoop::from_env("killed_job_is_killed_in_yarn_and_its_service_destroyed")
        .expect("the cluster")
    else {
        return;
    };
    let _turn = TURN.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (app_id, name, _) = endless_job_with_two_evaluators(&h, dir.path()).await;
    let o = cruise(&["kill", &app_id], &h).await;
    assert!(o.status.success(), "kill: {}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("KILLED"), "{out}");
    let (state, fin) = wait_app_final(&h, &app_id, Duration::from_secs(60)).await;
    assert_eq!((state.as_str(), fin.as_str()), ("KILLED", "KILLED"));
    wait_service_gone(&h, &name).await;
    let o = cruise(&["status", &app_id], &h).await;
    let out = text(&o.stdout);
    assert!(
        out.contains("KILLED") && out.contains("removed when the job ended"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Hadoop: integration/hadoop/start.sh DIR, then CRUISE_HADOOP_DIR=DIR and --ignored"]
async fn job_whose_evaluators_cannot_start_fails_in_yarn() {
    let Some(h) =
        RealHadoop::from_env("job_whose_evaluators_cannot_start_fails_in_yarn").expect("cluster")
    else {
        return;
    };
    let _turn = TURN.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let o = cruise(
        &[
            "submit",
            "--containers",
            "2",
            "--set",
            "mlr.generate_samples=1000",
            "--set",
            "runtime.container_memory_mb=512",
            "--set",
            "yarn.am_memory_mb=512",
            "--set",
            "yarn.max_app_attempts=1",
            "--set",
            "runtime.allocation_timeout_ms=30000",
            "--set",
            r#"runtime.evaluator_command=["/nonexistent/cruise", "evaluator"]"#,
            "--work-dir",
            dir.path().join("work").to_str().expect("utf-8"),
        ],
        &h,
    )
    .await;
    assert!(o.status.success(), "submit: {}", text(&o.stderr));
    let app_id = text(&o.stdout).trim().to_string();
    let o = tokio::time::timeout(
        JOB_TIMEOUT,
        cruise_command(&h)
            .args(["status", &app_id, "--wait"])
            .output(),
    )
    .await
    .expect("the failed job must end, not hang")
    .expect("running cruise status");
    let out = text(&o.stdout);
    assert!(!o.status.success(), "--wait exits non-zero: {out}");
    let (state, fin) = yarn_app(&h, &app_id).await;
    let logs = text(
        &cruise(&["logs", &app_id, "--file", "stderr"], &h)
            .await
            .stdout,
    );
    assert_eq!(
        (state.as_str(), fin.as_str()),
        ("FINISHED", "FAILED"),
        "{out}\n{logs}"
    );
    // Real YARN's Services API reports no exit status for a service's
    // containers (cruise-sim does): the service AM keeps relaunching them,
    // and the job fails when no evaluator registers in time.
    assert!(logs.contains("registered within"), "{logs}");
    wait_service_gone(&h, &service_name(&app_id)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Hadoop: integration/hadoop/start.sh DIR, then CRUISE_HADOOP_DIR=DIR and --ignored"]
async fn evaluator_killed_by_yarn_fails_the_job_naming_it() {
    let Some(h) =
        RealHadoop::from_env("evaluator_killed_by_yarn_fails_the_job_naming_it").expect("cluster")
    else {
        return;
    };
    let _turn = TURN.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // Once both evaluators run, have YARN kill one: the RM's signal API
    // (FORCEFUL_SHUTDOWN), carried out by its NodeManager.
    let (app_id, name, svc) = endless_job_with_two_evaluators(&h, dir.path()).await;
    let victim = svc["components"][0]["containers"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Kill it once the job is training (the AM's stderr says so).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = text(
            &cruise(&["logs", &app_id, "--file", "stderr"], &h)
                .await
                .stdout,
        );
        if out.contains("training:") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{app_id} never started training:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let url = format!(
        "{}/ws/v1/cluster/containers/{victim}/signal/FORCEFUL_SHUTDOWN?user.name={USER}",
        h.rm_url()
    );
    let r = reqwest::Client::new()
        .post(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert!(r.status().is_success(), "POST {url}: HTTP {}", r.status());

    let (state, fin) = wait_app_final(&h, &app_id, Duration::from_secs(120)).await;
    let logs = text(
        &cruise(&["logs", &app_id, "--file", "stderr"], &h)
            .await
            .stdout,
    );
    assert_eq!(
        (state.as_str(), fin.as_str()),
        ("FINISHED", "FAILED"),
        "{logs}"
    );
    assert!(
        logs.contains("job failed") && logs.contains(&victim),
        "the AM's error must name the killed container {victim}:\n{logs}"
    );
    wait_service_gone(&h, &name).await;
}

/// Evaluators of a job that `cruise run --runtime yarn` runs in the
/// foreground, one a line of (phase, active evaluators, reconfigurations'
/// operations), for failure messages.
fn job_view(s: &Value) -> String {
    let active = s["evaluators"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["role"] != "idle").count())
        .unwrap_or(0);
    format!(
        "phase {} active {active} capacity {} reconfigurations {}",
        s["phase"], s["capacity"], s["reconfigurations"]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Hadoop: integration/hadoop/start.sh DIR, then CRUISE_HADOOP_DIR=DIR and --ignored"]
async fn optimizer_flexes_the_evaluator_service_on_real_yarn() {
    let Some(h) = RealHadoop::from_env("optimizer_flexes_the_evaluator_service_on_real_yarn")
        .expect("cluster")
    else {
        return;
    };
    let _turn = TURN.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // The AM in the foreground (its status endpoint on this machine), its
    // evaluators in a YARN service; 2 to start with, up to 4.
    let mut c = tokio::process::Command::new(binary("cruise").expect("cruise"));
    c.args([
        "run",
        "--runtime",
        "yarn",
        "-n",
        "2",
        "-w",
        "1",
        "--epochs",
        "100000",
    ])
    .args(["--set", "mlr.generate_samples=20000"])
    .args(["--set", "runtime.max_containers=4"])
    .args(["--set", "runtime.container_memory_mb=512"])
    .args(["--set", "runtime.allocation_timeout_ms=180000"])
    .args(["--set", "yarn.capacity_poll_interval_ms=300"])
    .args(["--set", "optimizer.interval_ms=300"])
    .arg("--work-dir")
    .arg(dir.path().join("work"))
    .env("HADOOP_CONF_DIR", &h.conf_dir)
    .env("HADOOP_USER_NAME", USER)
    .env_remove("RUST_LOG");
    let mut job = Spawned::spawn(c).expect("starting cruise run");
    let addr = status_address(&job, JOB_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", job.stderr()));
    // Scale out: 4 active evaluators after a reconfiguration that added
    // some. (The optimizer may also take one away again on a noisy
    // machine: it then scales in, which is reported, not required.)
    await_status(&addr, JOB_TIMEOUT, |s| {
        let active = s["evaluators"]
            .as_array()
            .map(|e| e.iter().filter(|e| e["role"] != "idle").count())
            .unwrap_or(0);
        active == 4
            && s["reconfigurations"].as_array().is_some_and(|r| {
                r.iter().any(|p| {
                    p["op_secs"]
                        .as_array()
                        .is_some_and(|o| o.iter().any(|o| o[0] == "add"))
                })
            })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", job.stderr()));
    // The evaluator service on the real RM: its application, and its
    // component flexed from 2 to 4 with 4 containers READY.
    let apps = rm_get(
        &h,
        &format!("/ws/v1/cluster/apps?states=RUNNING&applicationTypes=yarn-service&user={USER}"),
    )
    .await
    .expect("apps");
    let services: Vec<(String, String)> = apps["apps"]["app"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|a| {
            Some((
                a["name"].as_str()?.to_string(),
                a["id"].as_str()?.to_string(),
            ))
        })
        .filter(|(n, _)| n.starts_with("cruise-"))
        .collect();
    assert_eq!(services.len(), 1, "one running cruise service: {apps}");
    let (name, service_app) = services[0].clone();
    // The service follows the job: as many containers asked for and READY
    // as the job has active evaluators, and at least 4 instances made
    // over its life. The optimizer keeps deciding meanwhile (this job's
    // epochs take milliseconds, so noise can send it back to 2 and up
    // again); the job's count is read again at every poll.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let svc = service(&h, &name).await.expect("the service exists");
        let now = cruise_integration::status(&addr).await.unwrap_or_default();
        let active = now["evaluators"]
            .as_array()
            .map(|e| e.iter().filter(|e| e["role"] != "idle").count())
            .unwrap_or(0);
        let asked = svc["components"][0]["number_of_containers"].as_u64();
        if instances_made(&svc) >= 4
            && asked == Some(active as u64)
            && ready_containers(&svc) == active
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "service {name} does not follow the job ({active} active evaluators, 4 instances made): {svc}\njob: {}",
            job_view(&now)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let last = cruise_integration::status(&addr).await.unwrap_or_default();
    let deletes = last["reconfigurations"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter(|p| {
                    p["op_secs"]
                        .as_array()
                        .is_some_and(|o| o.iter().any(|o| o[0] == "delete"))
                })
                .count()
        })
        .unwrap_or(0);
    eprintln!(
        "real yarn flex: {}; reconfigurations with a delete (scale in): {deletes}",
        job_view(&last)
    );

    // Stopping the job destroys the service, and YARN ends its application.
    let pid = job.child.id().expect("the job's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT to the job");
    job.wait(JOB_TIMEOUT).await.expect("the job ends");
    assert!(job.stderr().contains("cancelled"), "{}", job.stderr());
    wait_service_gone(&h, &name).await;
    let (state, _) = wait_app_final(&h, &service_app, Duration::from_secs(60)).await;
    assert!(
        ["FINISHED", "KILLED"].contains(&state.as_str()),
        "service application {service_app} ended {state}"
    );
}
