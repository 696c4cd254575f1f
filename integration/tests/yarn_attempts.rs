//! AM restart on YARN: the application's second attempt resumes the job.
//!
//! An MLR job is submitted with `cruise submit` to the YARN simulator (input
//! and staging on the WebHDFS simulator) with a checkpoint every epoch; its
//! checkpoints go to the staging directory on HDFS. Once a checkpoint of
//! epoch 3 or later is published there, the AM container's processes are
//! `SIGKILL`ed. With `yarn.max_app_attempts = 2` the RM starts a second
//! attempt, whose AM resumes the job from its newest checkpoint (its
//! summary's `resumed_from`, the epochs before it carried over with their
//! figures from the first attempt's history) and finishes it: the
//! application ends FINISHED/SUCCEEDED after two attempts, and no
//! evaluator of the killed AM stopped its service (each asked the RM and
//! found the application not over). With one attempt the application
//! fails, its diagnostics naming the lost AM container, and the evaluator
//! service that no AM destroyed is stopped by its own evaluators (YARN
//! would relaunch them for ever): it ends STOPPED with no evaluator
//! process left, an evaluator saying why. An AM killed before any
//! checkpoint is followed by an attempt that starts the job afresh, saying
//! so.
//!
//! Multi-process: the simulators, the `cruise` client, the AM in a simulated
//! YARN container and its evaluators in the containers of a YARN service.
//! Needs `cargo build -p cruise-appmaster -p cruise-sim` first.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use cruise_appmaster::runtime::service_name_for_app;
use cruise_appmaster::yarn_app::{CHECKPOINT_DIR, job_of_application};
use cruise_integration::{Sim, cruise_on_hadoop, hadoop_conf_dir, pid_alive, text, wait_for};

const WAIT: Duration = Duration::from_secs(300);
/// How long the evaluators of the killed AM may take to exit.
const EVALUATORS_EXIT_WITHIN: Duration = Duration::from_secs(15);
const EPOCHS: u32 = 60;
/// The AM is killed once a checkpoint of at least this epoch is published.
const KILL_AFTER_EPOCH: u32 = 3;
/// How long the evaluator service of an application whose last AM was
/// killed may take to stop, from the application's end: an evaluator
/// relaunched by the service (2 s later in the simulator) tries to reach
/// the AM for `channel.connect_timeout_ms` (10 s), then asks the RM.
const SERVICE_STOPS_WITHIN: Duration = Duration::from_secs(60);

/// One job at a time: each runs four evaluator processes and an AM.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The simulators, and a `HADOOP_CONF_DIR` naming them.
struct Cluster {
    hdfs: Sim,
    yarn: Sim,
    conf: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let hdfs = Sim::start("webhdfs", &[]).unwrap();
        let yarn = Sim::start("yarn", &["--webhdfs", &hdfs.url]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let conf = hadoop_conf_dir(&dir.path().join("hadoop-conf"), &hdfs, Some(&yarn)).unwrap();
        Cluster {
            hdfs,
            yarn,
            conf,
            _dir: dir,
        }
    }

    /// Submits the MLR job with `max_app_attempts`, a checkpoint every
    /// epoch or (`checkpoints` false) none while it runs; returns the
    /// application.
    async fn submit(&self, max_app_attempts: u32, checkpoints: bool, work: &Path) -> String {
        let attempts = format!("yarn.max_app_attempts={max_app_attempts}");
        let epochs = EPOCHS.to_string();
        let (every_epochs, every_secs) = if checkpoints {
            ("checkpoint.every_epochs=1", "checkpoint.every_secs=0")
        } else {
            ("checkpoint.every_epochs=0", "checkpoint.every_secs=3600")
        };
        let o = cruise_on_hadoop(
            &[
                "submit",
                "--containers",
                "4",
                "--workers",
                "2",
                "--epochs",
                &epochs,
                "--set",
                "job.app=mlr",
                "--set",
                "optimizer.enabled=false",
                "--set",
                every_epochs,
                "--set",
                every_secs,
                "--set",
                &attempts,
                "--set",
                "runtime.allocation_timeout_ms=180000",
                // A backstop: the evaluator service of an AM that is
                // never replaced ends on its own.
                "--set",
                "yarn.service_lifetime_secs=600",
                "--work-dir",
                work.to_str().unwrap(),
            ],
            &self.conf,
        )
        .await;
        assert!(
            o.status.success(),
            "submit failed: {}\n{}",
            text(&o.stderr),
            self.yarn.log()
        );
        let app = text(&o.stdout).trim().to_string();
        assert!(app.starts_with("application_"), "{app}");
        app
    }

    async fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.yarn.url);
        let r = reqwest::get(&url).await.unwrap();
        assert!(r.status().is_success(), "GET {url}: {}", r.status());
        r.json().await.unwrap()
    }

    /// The newest usable checkpoint of the application's job in its
    /// staging directory (as `cruise submit` places it), if any.
    async fn newest_checkpoint_epoch(&self, app: &str) -> Option<u32> {
        let dir = self.checkpoint_dir(app);
        let job = job_of_application(app)?;
        let fs = cruise_hdfs::FileSystem::default();
        cruise_container::checkpoint::latest(&fs, &dir, &job)
            .await
            .ok()
            .map(|m| m.epoch)
    }

    /// Where `cruise submit` places the checkpoints of `app`'s job: its
    /// staging directory.
    fn checkpoint_dir(&self, app: &str) -> String {
        format!(
            "webhdfs://{}/user/alice/.cruise-staging/{app}/{CHECKPOINT_DIR}",
            self.hdfs.address()
        )
    }

    /// Every container the simulator allocated.
    async fn containers(&self) -> Vec<Value> {
        self.get("/sim/containers").await["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The process ids of the running containers of `app`'s attempt
    /// `attempt` (its AM) and of its evaluator service.
    async fn running_pids(&self, app: &str, attempt: u64) -> (Option<u32>, Vec<u32>) {
        let service = service_name_for_app("cruise", app);
        let running: Vec<Value> = self
            .containers()
            .await
            .into_iter()
            .filter(|c| c["state"] == "RUNNING")
            .collect();
        let pid = |c: &Value| c["pid"].as_u64().map(|p| p as u32);
        let am = running
            .iter()
            .find(|c| c["owner"]["am"]["app"] == app && c["owner"]["am"]["attempt"] == attempt)
            .and_then(pid);
        let evaluators = running
            .iter()
            .filter(|c| c["owner"]["instance"]["service"].as_str() == service.as_deref())
            .filter_map(pid)
            .collect();
        (am, evaluators)
    }

    /// Every container the simulator started for `app`'s evaluator
    /// service (a later attempt's service has the same name).
    async fn service_containers(&self, app: &str) -> Vec<Value> {
        let service = service_name_for_app("cruise", app);
        self.containers()
            .await
            .into_iter()
            .filter(|c| c["owner"]["instance"]["service"].as_str() == service.as_deref())
            .collect()
    }

    /// `app`'s evaluator service as the Services API reports it; `None`
    /// once there is none.
    async fn service(&self, app: &str) -> Option<Value> {
        let name = service_name_for_app("cruise", app).unwrap();
        let url = format!("{}/app/v1/services/{name}", self.yarn.url);
        let r = reqwest::get(&url).await.unwrap();
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return None;
        }
        assert!(r.status().is_success(), "GET {url}: {}", r.status());
        Some(r.json().await.unwrap())
    }

    /// Waits until the application ends; returns its report.
    async fn ended(&self, app: &str) -> Value {
        wait_for(&format!("{app} to end"), WAIT, || async {
            let a = self.get(&format!("/ws/v1/cluster/apps/{app}")).await["app"].clone();
            ["FINISHED", "FAILED", "KILLED"]
                .contains(&a["state"].as_str().unwrap_or_default())
                .then_some(a)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.yarn.log()))
    }

    async fn attempts(&self, app: &str) -> Vec<Value> {
        self.get(&format!("/ws/v1/cluster/apps/{app}/appattempts"))
            .await["appAttempts"]["appAttempt"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// A file of the AM container of `app`'s attempt `attempt`, through
    /// `cruise logs`.
    async fn am_file(&self, app: &str, attempt: u32, file: &str) -> String {
        self.try_am_file(app, attempt, file)
            .await
            .unwrap_or_else(|e| panic!("{file} of attempt {attempt} of {app}: {e}"))
    }

    /// [`Cluster::am_file`], or why `cruise logs` could not read it (the
    /// attempt has no AM container yet).
    async fn try_am_file(&self, app: &str, attempt: u32, file: &str) -> Result<String, String> {
        let attempt = attempt.to_string();
        let o = cruise_on_hadoop(
            &["logs", app, "--attempt", &attempt, "--file", file],
            &self.conf,
        )
        .await;
        if o.status.success() {
            Ok(text(&o.stdout))
        } else {
            Err(text(&o.stderr))
        }
    }
}

/// Waits for a checkpoint of epoch `KILL_AFTER_EPOCH` or later, then kills
/// the first AM ([`kill_first_am`]). Returns the checkpoint's epoch and the
/// evaluators' process ids at the kill.
async fn kill_first_am_after_a_checkpoint(c: &Cluster, app: &str) -> (u32, Vec<u32>) {
    let epoch = wait_for("a checkpoint on HDFS", WAIT, || async {
        c.newest_checkpoint_epoch(app)
            .await
            .filter(|&e| e >= KILL_AFTER_EPOCH)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.yarn.log()));
    eprintln!("the checkpoint of epoch {epoch} is on HDFS");
    (epoch, kill_first_am(c, app).await)
}

/// `SIGKILL`s the processes of the AM container of `app`'s attempt 1 (its
/// process group: the shell YARN launched and the AM under it), which
/// runs four evaluators. Returns the evaluators' process ids.
async fn kill_first_am(c: &Cluster, app: &str) -> Vec<u32> {
    let (am, evaluators) = c.running_pids(app, 1).await;
    let Some(am) = am else {
        panic!("no running AM of {app}: {:?}", c.containers().await)
    };
    assert_eq!(evaluators.len(), 4, "{:?}", c.containers().await);
    eprintln!("killing the AM of {app} (process group {am})");
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(am as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    evaluators
}

/// What a service container's command wrote on stderr (an evaluator's
/// log): the ServiceMaster sends it to `stderr.txt` in the container's
/// log directory.
fn stderr_of(container: &Value) -> String {
    let dir = container["log_dir"].as_str().unwrap_or_default();
    std::fs::read_to_string(Path::new(dir).join("stderr.txt")).unwrap_or_default()
}

/// Waits until none of `pids` runs.
async fn all_exit(pids: &[u32], within: Duration) {
    wait_for("the evaluators of the killed AM to exit", within, || {
        let alive: Vec<u32> = pids.iter().copied().filter(|&p| pid_alive(p)).collect();
        async move { alive.is_empty().then_some(()) }
    })
    .await
    .unwrap_or_else(|e| {
        let alive: Vec<u32> = pids.iter().copied().filter(|&p| pid_alive(p)).collect();
        panic!("{e}: still alive {alive:?}")
    });
}

/// Checks that `app` (its final `report`) succeeded in its second attempt
/// after the first failed; returns the second AM's stderr.
async fn succeeded_in_the_second_attempt(c: &Cluster, app: &str, report: &Value) -> String {
    let attempts = c.attempts(app).await;
    let second = c.am_file(app, 2, "stderr").await;
    assert_eq!(
        (report["state"].as_str(), report["finalStatus"].as_str()),
        (Some("FINISHED"), Some("SUCCEEDED")),
        "{report}\nattempt 2:\n{second}"
    );
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["appAttemptState"], "FAILED", "{attempts:?}");
    second
}

/// A job whose first AM was killed, once the application ended.
struct Killed {
    c: Cluster,
    app: String,
    /// The epoch of the checkpoint seen before the kill.
    epoch: u32,
    /// The YARN application of the evaluator service the killed AM had.
    first_service_app: String,
    /// The application's report at its end.
    report: Value,
    _work: tempfile::TempDir,
}

/// Submits the job with `max_app_attempts`, kills its first AM after a
/// checkpoint, and waits for the evaluators it had to exit and for the
/// application to end.
async fn killed_after_a_checkpoint(max_app_attempts: u32) -> Killed {
    let c = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let app = c.submit(max_app_attempts, true, work.path()).await;
    let (epoch, evaluators) = kill_first_am_after_a_checkpoint(&c, &app).await;
    let first_service_app = c
        .service_containers(&app)
        .await
        .into_iter()
        .find(|x| x["pid"].as_u64() == evaluators.first().map(|&p| u64::from(p)))
        .and_then(|x| x["app"].as_str().map(String::from))
        .expect("the killed AM's evaluators are containers of its service");
    all_exit(&evaluators, EVALUATORS_EXIT_WITHIN).await;
    let report = c.ended(&app).await;
    Killed {
        c,
        app,
        epoch,
        first_service_app,
        report,
        _work: work,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_attempt_resumes_from_the_checkpoint() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Killed {
        c,
        app,
        epoch,
        first_service_app,
        report,
        _work,
    } = killed_after_a_checkpoint(2).await;
    let second = succeeded_in_the_second_attempt(&c, &app, &report).await;

    // The killed AM's evaluators asked the RM, found the application not
    // over (its second attempt coming or running) and left the service
    // to that attempt, which replaced it.
    let service = service_name_for_app("cruise", &app).unwrap();
    let logs: Vec<String> = c
        .service_containers(&app)
        .await
        .iter()
        .filter(|x| x["app"] == first_service_app.as_str())
        .map(stderr_of)
        .collect();
    assert!(
        logs.iter().all(|l| !l.contains("stopping YARN service")),
        "an evaluator of the killed AM stopped the service:\n{}",
        logs.join("\n----\n")
    );
    let said = logs.iter().flat_map(|l| l.lines()).find(|l| {
        l.contains(&format!("application {app} is "))
            && l.contains(&format!(
                "replaces YARN service {service}; leaving the service running"
            ))
    });
    match said {
        Some(line) => eprintln!("an evaluator of the killed AM said: {line}"),
        None => panic!(
            "no evaluator of the killed AM said it left the service running:\n{}",
            logs.join("\n----\n")
        ),
    }

    let job = job_of_application(&app).unwrap();
    let summary: Value = serde_json::from_str(&c.am_file(&app, 2, "summary.json").await).unwrap();
    let s = &summary["summary"];
    assert_eq!(
        s["job_id"],
        job.as_str(),
        "every attempt runs the same job: {s}"
    );
    let from = s["resumed_from"]["epoch"].as_u64().unwrap_or(0);
    assert!(
        from >= u64::from(epoch),
        "attempt 2 resumed from epoch {from}, the checkpoint seen before the kill was of epoch {epoch}: {s}"
    );
    let folder = s["resumed_from"]["folder"].as_str().unwrap();
    assert!(
        second.contains(&format!(
            "attempt 2 of {app}: resuming job {job} from checkpoint {folder}"
        )),
        "{second}"
    );
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), EPOCHS as usize, "{s}");
    // The job succeeded: the checkpoints `cruise submit` placed in its
    // staging directory are deleted, and the AM says so.
    let dir = c.checkpoint_dir(&app);
    // As the AM names it: on `fs.defaultFS` (hdfs://).
    let tail = format!("/user/alice/.cruise-staging/{app}/{CHECKPOINT_DIR}");
    assert!(
        s["checkpoint_dir"]
            .as_str()
            .is_some_and(|d| d.ends_with(&tail)),
        "{s}"
    );
    assert_eq!(s["checkpoints_deleted"], true, "{s}");
    let gone = cruise_hdfs::FileSystem::default()
        .status(&dir)
        .await
        .map(|st| st.uri);
    assert!(
        gone.as_ref().is_err_and(|e| e.is_not_found()),
        "{dir}: {gone:?}"
    );
    assert!(
        second
            .lines()
            .any(|l| l.contains("deleted its") && l.contains(&tail)),
        "{second}"
    );
    // The epochs up to the checkpoint are the first attempt's, from its
    // history in the application's local directory: they have figures.
    for e in &epochs[..from as usize] {
        assert!(e["stats"]["records"].as_u64().unwrap_or(0) > 0, "{e}");
    }
    // Attempt 2 trained only the epochs after the checkpoint.
    let trained = second
        .lines()
        .filter(|l| l.contains(&format!("epoch 1/{EPOCHS}")))
        .count();
    assert_eq!(trained, 0, "attempt 2 began at epoch 1:\n{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_attempt_the_application_fails_naming_the_lost_am() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Killed { c, app, report, .. } = killed_after_a_checkpoint(1).await;
    assert_eq!(
        (report["state"].as_str(), report["finalStatus"].as_str()),
        (Some("FAILED"), Some("FAILED")),
        "{report}"
    );
    let attempts = c.attempts(&app).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let am_container = attempts[0]["containerId"].as_str().unwrap();
    let diagnostics = report["diagnostics"].as_str().unwrap();
    let attempt_id = attempts[0]["appAttemptId"].as_str().unwrap();
    assert!(
        diagnostics.contains(&format!("AM Container for {attempt_id} exited")),
        "{diagnostics}"
    );
    assert!(diagnostics.contains(am_container), "{diagnostics}");
    // No AM ended the job: its checkpoints stay where they were.
    assert!(c.newest_checkpoint_epoch(&app).await.is_some());

    // No AM destroyed the evaluator service: its evaluators, relaunched
    // by YARN, find the application over and stop it.
    let service = service_name_for_app("cruise", &app).unwrap();
    let state = wait_for(
        "the evaluator service to stop",
        SERVICE_STOPS_WITHIN,
        || async {
            match c.service(&app).await {
                None => Some("gone".to_string()),
                Some(s) if s["state"] == "STOPPED" => Some("STOPPED".to_string()),
                Some(_) => None,
            }
        },
    )
    .await;
    let state = match state {
        Ok(s) => s,
        Err(e) => panic!("{e}: {:?}\n{}", c.service(&app).await, c.yarn.log()),
    };
    eprintln!("service {service} is {state}");
    let left = wait_for("no evaluator process of the service", WAIT, || async {
        let left: Vec<Value> = c
            .service_containers(&app)
            .await
            .into_iter()
            .filter(|x| {
                x["state"] != "COMPLETE" || x["pid"].as_u64().is_some_and(|p| pid_alive(p as u32))
            })
            .collect();
        left.is_empty().then_some(())
    })
    .await;
    if let Err(e) = left {
        panic!("{e}: {:?}", c.service_containers(&app).await);
    }
    let logs: Vec<String> = c
        .service_containers(&app)
        .await
        .iter()
        .map(stderr_of)
        .collect();
    let said = logs.iter().flat_map(|l| l.lines()).find(|l| {
        l.contains(&format!("application {app} is FAILED"))
            && l.contains(&format!("stopping YARN service {service}"))
    });
    match said {
        Some(line) => eprintln!("an evaluator said: {line}"),
        None => panic!(
            "no evaluator said it stopped the service, naming the application and its state:\n{}",
            logs.join("\n----\n")
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_checkpoint_the_second_attempt_starts_afresh() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let app = c.submit(2, false, work.path()).await;
    wait_for("attempt 1 to train", WAIT, || async {
        c.try_am_file(&app, 1, "stderr")
            .await
            .is_ok_and(|e| e.contains("cruise: training:"))
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(c.newest_checkpoint_epoch(&app).await, None);
    let evaluators = kill_first_am(&c, &app).await;
    all_exit(&evaluators, EVALUATORS_EXIT_WITHIN).await;

    let report = c.ended(&app).await;
    let second = succeeded_in_the_second_attempt(&c, &app, &report).await;
    let job = job_of_application(&app).unwrap();
    let said = format!("attempt 2 of {app}: starting job {job} afresh");
    let line = second
        .lines()
        .find(|l| l.contains(&said))
        .unwrap_or_else(|| panic!("no {said:?} in:\n{second}"));
    assert!(line.contains("no usable checkpoint"), "{line}");
    let summary: Value = serde_json::from_str(&c.am_file(&app, 2, "summary.json").await).unwrap();
    let s = &summary["summary"];
    assert_eq!(s["job_id"], job.as_str(), "{s}");
    assert!(s["resumed_from"].is_null(), "{s}");
    assert_eq!(
        s["epochs"].as_array().unwrap().len(),
        EPOCHS as usize,
        "{s}"
    );
}
