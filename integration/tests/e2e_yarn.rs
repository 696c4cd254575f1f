//! End to end on the YARN simulator: MLR input on the WebHDFS simulator,
//! `cruise submit --runtime yarn` with `HADOOP_CONF_DIR` pointing at the
//! simulators, `cruise status` until the application ends, the accuracy in
//! the AM's output read with `cruise logs`, and the evaluator service gone.
//! Everything runs as separate processes: the simulators, the `cruise`
//! client, the AM (in a simulated YARN container) and its evaluators (in
//! the containers of a YARN service, unpacked from the uploaded tarball).
//!
//! Needs `cargo build -p cruise-appmaster -p cruise-sim` first.

use std::time::{Duration, Instant};

use cruise_integration::{
    DEFAULT_JOB_MIN_ACCURACY, Sim, binary, cruise_on_hadoop as cruise, hadoop_conf_dir,
    summary_accuracy, text,
};
use serde_json::Value;

const JOB_TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlr_submitted_to_yarn_reaches_local_accuracy() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let yarn = Sim::start("yarn", &["--webhdfs", &hdfs.url]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();

    // Input: a generated MLR data set, uploaded to the simulated HDFS.
    let data = dir.path().join("mlr.libsvm");
    let o = cruise(
        &[
            "datagen",
            "mlr",
            "--samples",
            "20000",
            "--out",
            data.to_str().unwrap(),
        ],
        &conf,
    )
    .await;
    assert!(o.status.success(), "{}", text(&o.stderr));
    let nn = hdfs.address();
    let fs = cruise_hdfs::FileSystem::default();
    fs.create(
        &format!("webhdfs://{nn}/data/mlr.libsvm"),
        bytes::Bytes::from(std::fs::read(&data).unwrap()),
        true,
    )
    .await
    .unwrap();
    let input = format!("hdfs://{nn}/data/mlr.libsvm");

    let started = Instant::now();
    let o = cruise(
        &[
            "submit",
            "--runtime",
            "yarn",
            "--input",
            &input,
            "--containers",
            "4",
            "--epochs",
            "5",
            "--set",
            "runtime.allocation_timeout_ms=180000",
            "--set",
            "yarn.service_lifetime_secs=600",
        ],
        &conf,
    )
    .await;
    assert!(
        o.status.success(),
        "submit failed: {}\n{}",
        text(&o.stderr),
        yarn.log()
    );
    let app_id = text(&o.stdout).trim().to_string();
    assert!(app_id.starts_with("application_"), "{app_id}");
    let submit_secs = started.elapsed().as_secs_f64();

    // Follow it with `cruise status` until it ends.
    let deadline = Instant::now() + JOB_TIMEOUT;
    let mut states = Vec::new();
    let report = loop {
        let o = cruise(&["status", &app_id, "--json"], &conf).await;
        assert!(o.status.success(), "status failed: {}", text(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let state = v["app"]["state"].as_str().unwrap().to_string();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if ["FINISHED", "FAILED", "KILLED"].contains(&state.as_str()) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "{app_id} still {state} after {JOB_TIMEOUT:?}; states {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let job_secs = started.elapsed().as_secs_f64();
    let logs = cruise(&["logs", &app_id], &conf).await;
    let log_text = text(&logs.stdout);
    assert_eq!(
        report["app"]["finalStatus"],
        "SUCCEEDED",
        "states {states:?}\nreport {report}\nAM logs:\n{log_text}\n{}",
        text(&logs.stderr)
    );
    assert!(states.contains(&"RUNNING".to_string()), "{states:?}");

    // The AM's output: the summary with the accuracy of a local run.
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    assert!(log_text.contains("==> container_"), "{log_text}");
    let acc = summary_accuracy(&log_text).unwrap_or_else(|| panic!("no accuracy in:\n{log_text}"));
    assert!(
        acc >= DEFAULT_JOB_MIN_ACCURACY,
        "accuracy {acc} in:\n{log_text}"
    );
    assert!(log_text.contains("yarn containers"), "{log_text}");
    // Each progress line once: the AM's log does not repeat its phases
    // and epochs.
    for line in ["epoch 1/5", "loading: "] {
        let n = log_text.lines().filter(|l| l.contains(line)).count();
        assert_eq!(n, 1, "{line:?} {n} times in:\n{log_text}");
    }
    assert!(!log_text.contains("epoch done"), "{log_text}");

    // `cruise status` after the job: its result, and nothing that reads
    // like an error.
    let o = cruise(&["status", &app_id], &conf).await;
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        out.contains("removed when the job ended") && !out.contains("does not exist"),
        "{out}"
    );
    for needle in [
        "finished: 5 epochs of",
        "final        log-loss ",
        "(the final model evaluated over all input), accuracy ",
        "configuration started with 4 containers: 3 workers, 1 server",
    ] {
        assert!(out.contains(needle), "no {needle:?} in:\n{out}");
    }
    let summary = cruise(&["logs", &app_id, "--file", "summary.json"], &conf).await;
    let s: Value = serde_json::from_slice(&summary.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&summary.stdout)));
    assert_eq!(s["application"], app_id.as_str());
    assert_eq!(s["summary"]["epochs"].as_array().unwrap().len(), 5);
    assert_eq!(s["summary"]["evaluators"].as_array().unwrap().len(), 4);
    // The evaluators ran in YARN containers of the service (their ids are
    // YARN container ids of another application than the AM's).
    let service = report["service_name"].as_str().unwrap().to_string();
    for e in s["summary"]["evaluators"].as_array().unwrap() {
        let c = e["container"].as_str().unwrap();
        assert!(c.starts_with("container_"), "{c}");
        assert!(
            !c.contains(app_id.trim_start_matches("application_")),
            "{c}"
        );
    }

    // The service was destroyed and nothing is left running.
    let r = reqwest::get(format!("{}/app/v1/services/{service}", yarn.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "service {service} still exists");
    let v: Value = reqwest::get(format!("{}/sim/containers", yarn.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let live: Vec<&Value> = v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] != "COMPLETE")
        .collect();
    assert!(live.is_empty(), "containers still live: {live:?}");
    eprintln!(
        "yarn e2e: submit {submit_secs:.1} s, job done after {job_secs:.1} s, accuracy {:.2}%",
        acc * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_destroys_the_service() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let yarn = Sim::start("yarn", &["--webhdfs", &hdfs.url]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();
    // Many epochs, so that the job is still running when it is killed; the
    // generated input is uploaded by `cruise submit` itself.
    let o = cruise(
        &[
            "submit",
            "--epochs",
            "1000",
            "--containers",
            "2",
            "--set",
            "mlr.generate_samples=2000",
            "--work-dir",
            dir.path().join("work").to_str().unwrap(),
        ],
        &conf,
    )
    .await;
    assert!(o.status.success(), "{}", text(&o.stderr));
    let app_id = text(&o.stdout).trim().to_string();
    let service = format!(
        "cruise-{}",
        app_id.trim_start_matches("application_").replace('_', "-")
    );
    let deadline = Instant::now() + JOB_TIMEOUT;
    loop {
        let r = reqwest::get(format!("{}/app/v1/services/{service}", yarn.url))
            .await
            .unwrap();
        if r.status() == 200 {
            let v: Value = r.json().await.unwrap();
            if v["number_of_running_containers"] == 2 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "service {service} never ran two containers"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // While it runs, `cruise status` says where its web UI is, and it answers.
    let o = cruise(&["status", &app_id], &conf).await;
    let out = text(&o.stdout);
    let ui = out
        .lines()
        .find_map(|l| l.strip_prefix("web UI       "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no web UI in:\n{out}"))
        .to_string();
    let page = reqwest::get(&ui).await.unwrap();
    assert!(page.status().is_success(), "GET {ui}: {}", page.status());
    assert!(page.text().await.unwrap().contains("<svg"), "{ui}");
    let o = cruise(&["kill", &app_id], &conf).await;
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("KILLED"), "{out}");
    let r = reqwest::get(format!("{}/app/v1/services/{service}", yarn.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let o = cruise(&["status", &app_id], &conf).await;
    let out = text(&o.stdout);
    assert!(
        out.contains("KILLED") && out.contains("removed when the job ended"),
        "{out}"
    );
    // `cruise logs` says the output ends where the job was killed.
    let o = cruise(&["logs", &app_id], &conf).await;
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        out.contains(&format!("cruise: {app_id} was killed (KILLED")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_cluster_is_named() {
    let (_refusing, port) = cruise_integration::refused_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let o = tokio::process::Command::new(binary("cruise").unwrap())
        .args([
            "status",
            "application_1_0001",
            "--rm",
            &format!("127.0.0.1:{port}"),
            "--set",
            "runtime.rm_retries=2",
            "--set",
            "runtime.rm_retry_backoff_ms=10",
        ])
        .env("HADOOP_CONF_DIR", dir.path())
        .output()
        .await
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("YARN ResourceManager unreachable"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");

    // No RM configured at all.
    let o = tokio::process::Command::new(binary("cruise").unwrap())
        .args(["kill", "application_1_0001"])
        .env("HADOOP_CONF_DIR", dir.path())
        .output()
        .await
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("yarn.rm_addresses"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_am_with_evaluators_in_a_yarn_service() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let yarn = Sim::start("yarn", &["--webhdfs", &hdfs.url]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();
    let work = dir.path().join("work");
    let o = cruise(
        &[
            "run",
            "--runtime",
            "yarn",
            "--containers",
            "2",
            "--epochs",
            "2",
            "--quiet",
            "--set",
            "mlr.generate_samples=4000",
            "--work-dir",
            work.to_str().unwrap(),
        ],
        &conf,
    )
    .await;
    let out = text(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}\n{}",
        text(&o.stderr),
        yarn.log()
    );
    assert!(summary_accuracy(&out).is_some(), "{out}");
    // Its evaluators were the containers of one service, now destroyed.
    let v: Value = reqwest::get(format!("{}/sim/containers", yarn.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let containers = v["containers"].as_array().unwrap();
    assert!(containers.len() >= 2, "{v}");
    let services: std::collections::BTreeSet<&str> = containers
        .iter()
        .filter_map(|c| c["owner"]["instance"]["service"].as_str())
        .collect();
    assert_eq!(services.len(), 1, "{v}");
    let service = *services.iter().next().unwrap();
    assert!(service.starts_with("cruise-"), "{service}");
    assert!(containers.iter().all(|c| c["state"] == "COMPLETE"), "{v}");
    let r = reqwest::get(format!("{}/app/v1/services/{service}", yarn.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_job_is_recorded_and_its_service_destroyed() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let yarn = Sim::start("yarn", &["--webhdfs", &hdfs.url]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();
    // Evaluators that cannot start: the AM must fail fast, with the exit
    // code and diagnostics, exit non-zero (FAILED in YARN) and destroy the
    // service.
    let o = cruise(
        &[
            "submit",
            "--containers",
            "2",
            "--set",
            "mlr.generate_samples=1000",
            "--set",
            r#"runtime.evaluator_command=["/nonexistent/cruise", "evaluator"]"#,
            "--work-dir",
            dir.path().join("work").to_str().unwrap(),
        ],
        &conf,
    )
    .await;
    assert!(o.status.success(), "{}", text(&o.stderr));
    let app_id = text(&o.stdout).trim().to_string();
    let o = tokio::time::timeout(
        JOB_TIMEOUT,
        tokio::process::Command::new(binary("cruise").unwrap())
            .args(["status", &app_id, "--wait"])
            .env("HADOOP_CONF_DIR", &conf)
            .output(),
    )
    .await
    .expect("the failed job must end, not hang")
    .unwrap();
    let out = text(&o.stdout);
    assert!(
        !o.status.success(),
        "--wait exits non-zero for a failed job: {out}"
    );
    assert!(out.contains("FAILED"), "{out}");
    let logs = text(
        &cruise(&["logs", &app_id, "--file", "stderr"], &conf)
            .await
            .stdout,
    );
    assert!(logs.contains("exit code 127"), "{logs}");
    assert!(logs.contains("/nonexistent/cruise"), "{logs}");
    // The simulator starts a second attempt after the failed AM (it has no
    // unregistering, which ends the application on real YARN); that attempt
    // does not run the failed job again.
    assert!(
        logs.contains("ended failed in an earlier attempt"),
        "{logs}"
    );
    let service = format!(
        "cruise-{}",
        app_id.trim_start_matches("application_").replace('_', "-")
    );
    let r = reqwest::get(format!("{}/app/v1/services/{service}", yarn.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "service {service} leaked");
    let summary = text(
        &cruise(&["logs", &app_id, "--file", "summary.json"], &conf)
            .await
            .stdout,
    );
    let s: Value = serde_json::from_str(&summary).unwrap_or_else(|e| panic!("{e}: {summary}"));
    assert!(
        s["error"].as_str().unwrap().contains("exit code 127"),
        "{s}"
    );
}
