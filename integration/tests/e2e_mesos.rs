//! End to end on the Mesos simulator: `cruise run --runtime mesos --master
//! HOST:PORT` with MLR input on the WebHDFS simulator (`hdfs://` through
//! `HADOOP_CONF_DIR`). The AM runs in the foreground, the evaluators as
//! tasks of its framework; the run must reach the accuracy of a local run
//! and leave the framework torn down and no task running.
//!
//! Needs `cargo build -p cruise-appmaster -p cruise-sim` first.

use std::time::{Duration, Instant};

use cruise_integration::{
    DEFAULT_JOB_MIN_ACCURACY, Sim, binary, hadoop_conf_dir, processes_under, summary_accuracy,
};
use serde_json::Value;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlr_on_mesos_reaches_local_accuracy() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let mesos = Sim::start("mesos", &["--allocation-interval-ms", "200"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, None).unwrap();
    let cruise = binary("cruise").unwrap();

    let data = dir.path().join("mlr.libsvm");
    let o = tokio::process::Command::new(&cruise)
        .args(["datagen", "mlr", "--samples", "20000", "--out"])
        .arg(&data)
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let nn = hdfs.address();
    cruise_hdfs::FileSystem::default()
        .create(
            &format!("webhdfs://{nn}/data/mlr.libsvm"),
            bytes::Bytes::from(std::fs::read(&data).unwrap()),
            true,
        )
        .await
        .unwrap();

    let started = Instant::now();
    let run = tokio::process::Command::new(&cruise)
        .args([
            "run",
            "--runtime",
            "mesos",
            "--master",
            &mesos.address(),
            "--input",
            &format!("hdfs://{nn}/data/mlr.libsvm"),
            "--containers",
            "4",
            "--epochs",
            "5",
            "--quiet",
            "--work-dir",
        ])
        .arg(dir.path().join("work"))
        .env("HADOOP_CONF_DIR", &conf)
        .env("HADOOP_USER_NAME", "alice")
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let o = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("cruise run did not finish in 300 s")
        .unwrap();
    let out = text(&o.stdout);
    assert!(
        o.status.success(),
        "cruise run failed:\n{out}\n{}\nmaster log:\n{}",
        text(&o.stderr),
        mesos.log()
    );
    let acc = summary_accuracy(&out).unwrap_or_else(|| panic!("no accuracy in:\n{out}"));
    assert!(acc >= DEFAULT_JOB_MIN_ACCURACY, "accuracy {acc}:\n{out}");
    assert!(out.contains("4 containers"), "{out}");

    // The framework was torn down; no task is left running.
    let st: Value = reqwest::get(format!("{}/sim/state", mesos.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(st["frameworks"].as_array().unwrap().is_empty(), "{st}");
    assert_eq!(
        st["removed_frameworks"].as_array().unwrap().len(),
        1,
        "{st}"
    );
    // Its tasks ran in sandboxes under the master's work dir; none is
    // left running there.
    let fid = st["removed_frameworks"][0].as_str().unwrap().to_string();
    let work = mesos.dir.path().join("work");
    let mut sandboxes = 0;
    for agent in std::fs::read_dir(work.join("agents")).unwrap() {
        let execs = agent
            .unwrap()
            .path()
            .join("frameworks")
            .join(&fid)
            .join("executors");
        if let Ok(rd) = std::fs::read_dir(execs) {
            sandboxes += rd.count();
        }
    }
    assert!(sandboxes >= 4, "{sandboxes} task sandboxes");
    let left = processes_under(&work);
    assert!(
        left.is_empty(),
        "processes still running in sandboxes: {left:?}"
    );
    eprintln!(
        "mesos e2e: done in {:.1} s, accuracy {:.2}%",
        started.elapsed().as_secs_f64(),
        acc * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_master_fails_the_run_with_its_address() {
    let (_refusing, port) = cruise_integration::refused_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let o = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(binary("cruise").unwrap())
            .args([
                "run",
                "--master",
                &format!("127.0.0.1:{port}"),
                "--quiet",
                "--set",
                "runtime.rm_retries=2",
                "--set",
                "runtime.rm_retry_backoff_ms=10",
                "--set",
                "mlr.generate_samples=1000",
                "--work-dir",
            ])
            .arg(dir.path())
            .output(),
    )
    .await
    .expect("the run must fail, not hang")
    .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("Mesos master unreachable"), "{err}");
    assert!(
        err.contains(&format!("http://127.0.0.1:{port}/api/v1/scheduler")),
        "{err}"
    );
}
