//! The README's sandbox walk-through, as written, through the real scripts
//! and the real `cruise`: `integration/sandbox/start.sh DIR` in a fresh
//! directory (on free ports), `cruise datagen` into its HDFS, `cruise
//! submit`, `cruise status --wait`, `cruise logs`, a second job stopped
//! with `cruise kill` (its application id skips one: the first job's
//! evaluator service was an application of its own), and `stop.sh DIR`,
//! after which no process is left in the sandbox.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use cruise_integration::{binary, free_port, processes_under, wait_for};

const WAIT: Duration = Duration::from_secs(300);

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

async fn run(cmd: &mut tokio::process::Command) -> Output {
    let o = tokio::time::timeout(WAIT, cmd.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("{cmd:?} did not finish in {WAIT:?}"))
        .unwrap();
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The application id's sequence number (`application_<ts>_0003` → 3).
fn seq(app: &str) -> u64 {
    app.rsplit('_')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_through_runs_in_any_directory_and_leaves_nothing() {
    let sbx = tempfile::tempdir().unwrap();
    let dir = sbx.path();
    let script = |name: &str| {
        let mut c = tokio::process::Command::new(repo().join("integration/sandbox").join(name));
        c.arg(dir)
            .env("CRUISE_SIM", binary("cruise-sim").unwrap())
            .env("CRUISE_BIN", binary("cruise").unwrap());
        c
    };
    let mut start = script("start.sh");
    for var in ["NN_PORT", "DN_PORT", "RM_PORT", "MESOS_PORT"] {
        start.env(var, free_port().unwrap().to_string());
    }
    let started = run(&mut start).await;
    assert!(text(&started).contains(&format!("sandbox running in {}", dir.display())));
    let conf = dir.join("hadoop-conf");
    let cruise = |args: &[&str]| {
        let mut c = tokio::process::Command::new(binary("cruise").unwrap());
        c.args(args)
            .env("HADOOP_CONF_DIR", &conf)
            .env_remove("RUST_LOG");
        c
    };

    let data = dir.join("hdfs/data/mlr.libsvm");
    let data = data.to_str().unwrap();
    run(&mut cruise(&[
        "datagen",
        "mlr",
        "--samples",
        "20000",
        "--out",
        data,
    ]))
    .await;
    let first = text(
        &run(&mut cruise(&[
            "submit",
            "--input",
            "hdfs:///data/mlr.libsvm",
        ]))
        .await,
    )
    .trim()
    .to_string();
    assert!(first.starts_with("application_"), "{first}");
    let status = text(&run(&mut cruise(&["status", &first, "--wait"])).await);
    assert!(
        status.contains("FINISHED") && status.contains("final        log-loss"),
        "{status}"
    );
    let logs = text(&run(&mut cruise(&["logs", &first])).await);
    assert!(logs.contains("final accuracy"), "{logs}");

    // A second, endless job, killed.
    let second = text(
        &run(&mut cruise(&[
            "submit",
            "--input",
            "hdfs:///data/mlr.libsvm",
            "--epochs",
            "100000",
        ]))
        .await,
    )
    .trim()
    .to_string();
    assert_eq!(
        seq(&second),
        seq(&first) + 2,
        "the first job's evaluator service took the id between: {first} {second}"
    );
    wait_for("the second job to run", WAIT, || {
        let mut c = cruise(&["status", &second]);
        async move {
            let o = c.output().await.ok()?;
            text(&o).contains("state        RUNNING").then_some(())
        }
    })
    .await
    .unwrap();
    let killed = text(&run(&mut cruise(&["kill", &second])).await);
    assert!(killed.contains("KILLED"), "{killed}");

    let stopped = text(&run(&mut script("stop.sh")).await);
    assert!(stopped.contains("no process left"), "{stopped}");
    let left = processes_under(dir);
    assert!(left.is_empty(), "processes left in the sandbox: {left:?}");
    for name in ["webhdfs", "yarn", "mesos"] {
        assert!(!dir.join(format!("{name}.pid")).exists());
    }
}
