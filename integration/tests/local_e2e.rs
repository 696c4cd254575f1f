//! Multi-process end-to-end tests on the local runtime: `cruise` and its
//! evaluators are separate OS processes talking over real sockets.

use cruise_container::protocol::{BlockId, EvaluatorId};
use std::time::Duration;

use tokio::process::Command;

use cruise_conf::CruiseConfig;
use cruise_container::apps;
use cruise_container::protocol::{
    AmToEval, EvalToAm, INPUT_TABLE, JobSetup, MODEL_TABLE, OwnershipUpdate, STATE_TABLE, Secret,
    TaskKind, WorkerTask,
};
use cruise_hdfs::Split;
use cruise_integration::fake_am::FakeAm;
use cruise_integration::{
    DEFAULT_JOB_MIN_ACCURACY, Spawned, await_status, binary, blocks_held, finished_evaluating_all,
    members_in_role, mlr_data, status_address,
};

const WAIT: Duration = Duration::from_secs(120);

fn cruise() -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG");
    c
}

/// The default job (generated data, 4 containers) reaches 90% training
/// accuracy, and every evaluator is its own process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_run_trains_mlr_on_separate_processes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["run", "--json", "--quiet", "--work-dir"])
        .arg(dir.path());
    let mut p = Spawned::spawn(c).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "cruise run failed:\n{}", p.stderr());
    let s: serde_json::Value = serde_json::from_str(&p.stdout()).expect("JSON summary on stdout");
    let f = &s["final_stats"];
    let acc = f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap();
    assert!(acc >= DEFAULT_JOB_MIN_ACCURACY, "training accuracy {acc}");
    assert_eq!(s["epochs"].as_array().unwrap().len(), 5);
    let pids: Vec<u64> = s["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 4);
    let mut distinct = pids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "one process per evaluator: {pids:?}");
    let me = p.child.id().map(u64::from);
    assert!(
        pids.iter().all(|&pid| pid > 0 && Some(pid) != me),
        "evaluators are not the AM: {pids:?}"
    );
}

/// A relative `--work-dir` is where `cruise run` was started, for the AM
/// and for the evaluators, which run in directories of their own: the
/// generated input, the job's history and its checkpoints all land there.
/// (It failed the job: the evaluators looked for `rel/data/...` in their
/// own directories.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_work_dir_is_where_cruise_run_started() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.current_dir(dir.path()).args([
        "run",
        "-e",
        "2",
        "--work-dir",
        "rel",
        "--set",
        "checkpoint.every_epochs=1",
        "--set",
        "checkpoint.dir=ckpts",
    ]);
    let mut p = Spawned::spawn(c).unwrap();
    assert!(p.wait(WAIT).await.unwrap().success(), "{}", p.stderr());
    let work = dir.path().join("rel");
    for sub in ["data", "jobs/history"] {
        let d = work.join(sub);
        assert!(
            std::fs::read_dir(&d).is_ok_and(|mut e| e.next().is_some()),
            "nothing in {}",
            d.display()
        );
    }
    let ckpts = dir.path().join("ckpts");
    assert!(
        std::fs::read_dir(&ckpts).is_ok_and(|mut e| e.next().is_some()),
        "no checkpoint in {}",
        ckpts.display()
    );
}

/// The summary says what its final loss is when it differs from the last
/// epoch's: the final model evaluated after training, not the epoch's
/// mean over mini-batches taken before their updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_says_what_the_final_loss_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["run", "-e", "3", "--work-dir"]).arg(dir.path());
    let mut p = Spawned::spawn(c).unwrap();
    assert!(p.wait(WAIT).await.unwrap().success(), "{}", p.stderr());
    let (out, err) = (p.stdout(), p.stderr());
    let last_epoch = err
        .lines()
        .find_map(|l| l.strip_prefix("epoch 3/3  log-loss "))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no line for epoch 3 in:\n{err}"))
        .to_string();
    assert_eq!(
        err.lines().filter(|l| l.starts_with("epoch 3/3")).count(),
        1,
        "{err}"
    );
    let fin = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("final log-loss"))
        .unwrap_or_else(|| panic!("no final log-loss in:\n{out}"))
        .trim();
    if fin.starts_with(&last_epoch) {
        assert!(!fin.contains('('), "{fin}");
    } else {
        assert!(
            fin.contains(&format!(
                "(the final model over all input, after training; epoch 3's training log-loss was {last_epoch})"
            )),
            "{fin}\n{err}"
        );
    }
}

/// A worker that falls far behind does not pull the model towards its own
/// share of the data when the job bounds staleness: with one worker's compute
/// stretched 200× (process emulation, 0.005 of a core), the default job under
/// SSP with staleness 2 ends as accurate as an unhindered one. (Asynchronous,
/// the same job ended at 0.82–0.90: see `DEFAULT_JOB_MIN_ACCURACY`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn straggler_does_not_drift_under_ssp() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["run", "--json", "--quiet", "--staleness", "2"])
        .args(["--set", "optimizer.enabled=false"])
        .args(["--set", "emulation.mechanism=process"])
        .args(["--set", "emulation.containers=0.005,3*-"])
        .arg("--work-dir")
        .arg(dir.path());
    let mut p = Spawned::spawn(c).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "cruise run failed:\n{}", p.stderr());
    let s: serde_json::Value = serde_json::from_str(&p.stdout()).expect("JSON summary on stdout");
    let f = &s["final_stats"];
    let acc = f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap();
    assert!(
        acc >= 0.93,
        "training accuracy {acc} with a straggler under SSP"
    );
}

/// One evaluator process runs a worker task, then a server task, on the
/// same connection and pid, driven by a fake AM over the real protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluator_is_reused_for_worker_then_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = mlr_data(dir.path(), 400, 20, 3, 5).unwrap();
    let len = std::fs::metadata(&data).unwrap().len();
    let am = FakeAm::bind().await.unwrap();
    let mut c = cruise();
    c.arg("evaluator")
        .envs(am.env("container_reuse_000001").unwrap());
    let mut p = Spawned::spawn(c).unwrap();
    let child_pid = p.child.id().unwrap();

    let mut conn = am.accept(WAIT).await.unwrap();
    assert_eq!(conn.identity.peer, "container_reuse_000001");
    let (pid, data_addr) = conn
        .expect(WAIT, "registration", |m| match m {
            EvalToAm::Register { pid, data_addr, .. } => Some((*pid, *data_addr)),
            _ => None,
        })
        .await
        .unwrap();
    assert_eq!(pid, child_pid);

    let mut config = CruiseConfig::default();
    config.mlr.classes = 3;
    config.mlr.features = 20;
    config.job.mini_batch = 20;
    config.store.model_blocks = 2;
    let params = apps::params(&config).unwrap();
    conn.send(AmToEval::Setup(Box::new(JobSetup {
        evaluator: EvaluatorId(1),
        config,
        app: params,
        tables: vec![(MODEL_TABLE, 2), (INPUT_TABLE, 1), (STATE_TABLE, 1)],
    })))
    .await
    .unwrap();
    conn.send(AmToEval::Peers(vec![(EvaluatorId(1), data_addr)]))
        .await
        .unwrap();
    conn.send(AmToEval::Ownership(OwnershipUpdate {
        version: 1,
        owners: vec![
            (MODEL_TABLE, BlockId(0), EvaluatorId(1)),
            (MODEL_TABLE, BlockId(1), EvaluatorId(1)),
            (INPUT_TABLE, BlockId(0), EvaluatorId(1)),
            (STATE_TABLE, BlockId(0), EvaluatorId(1)),
        ],
    }))
    .await
    .unwrap();
    conn.send(AmToEval::CreateBlocks {
        table: MODEL_TABLE,
        blocks: vec![BlockId(0), BlockId(1)],
    })
    .await
    .unwrap();
    conn.expect(WAIT, "blocks created", |m| {
        matches!(m, EvalToAm::BlocksCreated { .. }).then_some(())
    })
    .await
    .unwrap();
    let split = Split {
        uri: data.display().to_string(),
        start: 0,
        end: len,
    };
    conn.send(AmToEval::LoadInput {
        blocks: vec![(BlockId(0), split)],
        state: None,
    })
    .await
    .unwrap();
    let loaded = conn
        .expect(WAIT, "input loaded", |m| match m {
            EvalToAm::InputLoaded { blocks } => Some(blocks.clone()),
            _ => None,
        })
        .await
        .unwrap();
    assert_eq!(loaded[0].1, 400);

    // Task 1: worker.
    conn.send(AmToEval::StartWorker(WorkerTask {
        start_clock: 0,
        staleness: None,
        rollback: 0,
    }))
    .await
    .unwrap();
    conn.expect(WAIT, "worker started", |m| {
        matches!(
            m,
            EvalToAm::TaskStarted {
                task: TaskKind::Worker
            }
        )
        .then_some(())
    })
    .await
    .unwrap();
    let mut batches = 0;
    conn.expect(WAIT, "two local epochs", |m| match m {
        EvalToAm::MiniBatch(r) => {
            assert!(r.stats.records > 0 && r.pull_bytes > 0 && r.push_bytes > 0);
            batches += r.mini_batches;
            None
        }
        EvalToAm::ClockTick { clock } if *clock >= 2 => Some(()),
        _ => None,
    })
    .await
    .unwrap();
    assert!(batches >= 40, "20 mini-batches per epoch: {batches}");
    conn.send(AmToEval::StopWorker).await.unwrap();
    conn.expect(WAIT, "worker stopped", |m| {
        matches!(
            m,
            EvalToAm::TaskStopped {
                task: TaskKind::Worker
            }
        )
        .then_some(())
    })
    .await
    .unwrap();

    // Task 2: server, in the same process, on the same connection.
    conn.send(AmToEval::StartServer).await.unwrap();
    conn.expect(WAIT, "server started", |m| {
        matches!(
            m,
            EvalToAm::TaskStarted {
                task: TaskKind::Server
            }
        )
        .then_some(())
    })
    .await
    .unwrap();
    // The model it trained as a worker is still there and still served.
    conn.send(AmToEval::Evaluate).await.unwrap();
    let stats = conn
        .expect(WAIT, "evaluation", |m| match m {
            EvalToAm::Evaluation(s) => Some(*s),
            _ => None,
        })
        .await
        .unwrap();
    assert_eq!(stats.records, 400);
    assert!(
        stats.accuracy() > 0.5,
        "the model survived the role change: {}",
        stats.accuracy()
    );
    assert_eq!(p.child.id(), Some(child_pid), "same process");

    conn.send(AmToEval::Shutdown {
        reason: "test done".into(),
    })
    .await
    .unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(
        status.success(),
        "evaluator exits 0 on shutdown:\n{}",
        p.stderr()
    );
}

/// Starts `cruise run` with a practically endless number of epochs and
/// returns it with its status endpoint's address.
async fn endless_job(work: &std::path::Path) -> (Spawned, String) {
    endless_job_with(work, &[]).await
}

/// [`endless_job`] with more `cruise run` arguments.
async fn endless_job_with(work: &std::path::Path, args: &[&str]) -> (Spawned, String) {
    let mut c = cruise();
    c.args(["run", "--epochs", "100000", "--work-dir"])
        .arg(work)
        .args(args);
    let job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    (job, addr)
}

/// An evaluator with the wrong job secret is refused: it exits non-zero, and
/// the AM records the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_rejected_by_a_real_am() {
    let dir = tempfile::tempdir().unwrap();
    let (mut job, addr) = endless_job(dir.path()).await;
    let st = await_status(&addr, WAIT, |s| s["phase"] == "training")
        .await
        .unwrap();
    let am_addr = st["am_addr"].as_str().unwrap().to_string();
    let job_id = st["job_id"].as_str().unwrap().to_string();

    let mut rogue = cruise();
    rogue
        .arg("evaluator")
        .env("CRUISE_AM_ADDR", &am_addr)
        .env("CRUISE_JOB_ID", &job_id)
        .env("CRUISE_JOB_SECRET", Secret::generate().to_hex())
        .env("CRUISE_CONTAINER_ID", "container_rogue");
    let mut rogue = Spawned::spawn(rogue).unwrap();
    let rs = rogue.wait(WAIT).await.unwrap();
    assert!(!rs.success(), "the rogue evaluator must fail");
    assert!(rogue.stderr().contains("job secret"), "{}", rogue.stderr());
    let st = await_status(&addr, WAIT, |s| {
        s["refused"].as_array().is_some_and(|r| {
            r.iter()
                .any(|x| x.as_str().unwrap_or("").contains("secret mismatch"))
        })
    })
    .await
    .unwrap();
    assert_eq!(st["phase"], "training", "the job goes on");

    // Ctrl-C stops the job and its evaluators.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job.child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let s = job.wait(WAIT).await.unwrap();
    assert!(!s.success());
    assert!(job.stderr().contains("cancelled"), "{}", job.stderr());
}

/// The first evaluator in `role` of a training job's status.
async fn training_member(addr: &str, role: &str) -> serde_json::Value {
    let st = await_status(addr, WAIT, |s| {
        s["phase"] == "training" && s["records_processed"].as_u64().unwrap_or(0) > 0
    })
    .await
    .unwrap();
    st["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["role"] == role)
        .unwrap()
        .clone()
}

fn signal(pid: u64, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

/// Without checkpoints, killing a server mid-epoch fails the job with a
/// message naming the evaluator, its exit status and why it was not
/// survived (its model blocks have no checkpoint); nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_fails_the_job_without_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (mut job, addr) =
        endless_job_with(dir.path(), &["--set", "checkpoint.enabled=false"]).await;
    let server = training_member(&addr, "server").await;
    let pid = server["pid"].as_u64().unwrap();
    signal(pid, nix::sys::signal::Signal::SIGKILL);
    let s = job.wait(WAIT).await.unwrap();
    assert!(!s.success(), "the job must fail");
    let err = job.stderr();
    let id = server["id"].as_u64().unwrap();
    assert!(err.contains(&format!("evaluator {id}")), "{err}");
    assert!(err.contains(server["container"].as_str().unwrap()), "{err}");
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");
    assert!(
        err.contains("not survived") && err.contains("checkpoint.enabled = false"),
        "{err}"
    );
}

/// The training accuracy in a `cruise run --json` summary.
fn summary_accuracy(s: &serde_json::Value) -> f64 {
    let f = &s["final_stats"];
    f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap()
}

/// The arguments of the jobs that lose a server: 5 containers (3 workers,
/// 2 servers), 300 epochs of about 0.05 s, a checkpoint every epoch.
const CHECKPOINTED: [&str; 10] = [
    "--containers",
    "5",
    "--workers",
    "3",
    "--epochs",
    "300",
    "--set",
    "checkpoint.every_epochs=1",
    "--set",
    "checkpoint.every_secs=0",
];

/// Asserts that the job summary `s` lists one loss, of evaluator `id`.
fn assert_lost_only(s: &serde_json::Value, id: u64) {
    let lost = s["lost"].as_array().unwrap();
    assert!(
        lost.len() == 1
            && lost[0]
                .as_str()
                .unwrap()
                .contains(&format!("evaluator {id}")),
        "{lost:?}"
    );
}

/// The training accuracy of `cruise run` with `args`, undisturbed.
async fn undisturbed_accuracy(args: &[&str]) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["run", "--json", "--quiet", "--work-dir"])
        .arg(dir.path())
        .args(args);
    let mut p = Spawned::spawn(c).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "cruise run failed:\n{}", p.stderr());
    let s: serde_json::Value = serde_json::from_str(&p.stdout()).expect("JSON summary");
    summary_accuracy(&s)
}

/// With checkpoints every epoch, a server killed (`SIGKILL`) mid-training
/// is survived: once a checkpoint is published the server is killed, the
/// other server restores its model blocks from the checkpoint while the
/// workers train on, and the job ends with a training accuracy within 2
/// points of the same job undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_is_survived_with_checkpoints() {
    let undisturbed = undisturbed_accuracy(&CHECKPOINTED).await;

    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["run", "--json", "--work-dir"])
        .arg(dir.path())
        .args(CHECKPOINTED);
    let mut job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    let st = await_status(&addr, WAIT, |s| {
        s["phase"] == "training" && s["checkpoints"].as_u64().unwrap_or(0) >= 1
    })
    .await
    .unwrap_or_else(|e| panic!("no checkpoint published: {e}"));
    let folder = st["checkpoint"]["folder"].as_str().unwrap().to_string();
    assert!(
        std::path::Path::new(&folder)
            .join("MANIFEST.json")
            .is_file(),
        "{folder} has no manifest"
    );
    let members = st["evaluators"].as_array().unwrap();
    let model_blocks: u64 = members
        .iter()
        .map(|e| e["model_blocks"].as_u64().unwrap())
        .sum();
    let server = members.iter().find(|e| e["role"] == "server").unwrap();
    let id = server["id"].as_u64().unwrap();
    signal(
        server["pid"].as_u64().unwrap(),
        nix::sys::signal::Signal::SIGKILL,
    );
    let st = await_status(&addr, WAIT, |s| {
        let servers = members_in_role(s, "server");
        s["lost"].as_array().is_some_and(|l| l.len() == 1)
            && servers.len() == 1
            && servers[0]["id"].as_u64() != Some(id)
            && servers[0]["model_blocks"].as_u64() == Some(model_blocks)
    })
    .await
    .unwrap_or_else(|e| panic!("server {id} was not survived: {e}"));
    assert!(
        st["lost"][0]
            .as_str()
            .unwrap()
            .contains(&format!("evaluator {id}")),
        "{st}"
    );
    let s = finished_evaluating_all(&mut job, WAIT).await.unwrap();
    assert_eq!(s["lost"].as_array().unwrap().len(), 1, "{s}");
    let acc = summary_accuracy(&s);
    assert!(
        (acc - undisturbed).abs() <= 0.02,
        "accuracy {acc} after losing a server, {undisturbed} undisturbed"
    );
}

/// Under SSP (staleness 1) a server killed (`SIGKILL`) once a checkpoint
/// of epoch 3 or later is published and passed is survived by rolling
/// back: its model blocks are restored from the newest checkpoint, and
/// every worker's clock and the job's progress go back to that
/// checkpoint's. The AM says so, and says each of the 3 workers took the
/// rollback at that clock; the summary lists the loss and the rollback and
/// every epoch once; the training accuracy is within 2 points of the same
/// job undisturbed. (The old code failed the job: restored blocks are
/// older than the clocks the workers had passed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_of_an_ssp_job_rolls_its_clocks_back() {
    let args = [&CHECKPOINTED[..], &["--staleness", "1"]].concat();
    let undisturbed = undisturbed_accuracy(&args).await;

    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["-v", "run", "--json", "--work-dir"])
        .arg(dir.path())
        .args(&args);
    let mut job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    let st = await_status(&addr, WAIT, |s| {
        let k = s["checkpoint"]["epoch"].as_u64().unwrap_or(0);
        s["phase"] == "training" && k >= 3 && s["epochs_done"].as_u64().unwrap_or(0) > k
    })
    .await
    .unwrap_or_else(|e| panic!("no checkpoint of epoch 3 or later passed: {e}"));
    let members = st["evaluators"].as_array().unwrap();
    let server = members.iter().find(|e| e["role"] == "server").unwrap();
    let id = server["id"].as_u64().unwrap();
    signal(
        server["pid"].as_u64().unwrap(),
        nix::sys::signal::Signal::SIGKILL,
    );
    let s = finished_evaluating_all(&mut job, WAIT).await.unwrap();
    assert_lost_only(&s, id);
    let rollbacks = s["clock_rollbacks"].as_array().unwrap();
    assert_eq!(rollbacks.len(), 1, "{s}");
    let text = rollbacks[0].as_str().unwrap();
    let clock: u32 = text
        .strip_prefix("clocks rolled back to ")
        .and_then(|t| t.split(',').next())
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no clock in {text:?}"));
    assert!(clock >= 1, "{text}");
    let epochs: Vec<u64> = s["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(epochs, (1..=300).collect::<Vec<_>>(), "every epoch once");
    let err = job.stderr();
    assert!(err.contains(text), "the AM says the rollback:\n{err}");
    let taken = err
        .lines()
        .filter(|l| l.contains(&format!("'s clock rolled back to {clock}")))
        .count();
    assert_eq!(taken, 3, "each worker takes the rollback:\n{err}");
    let acc = summary_accuracy(&s);
    assert!(
        (acc - undisturbed).abs() <= 0.02,
        "accuracy {acc} after the rollback, {undisturbed} undisturbed"
    );
}

/// Waits until the job has let evaluator `id` go and its other workers own
/// every input block and train on; returns the status then.
async fn survived(addr: &str, id: u64, blocks: u64) -> serde_json::Value {
    let st = await_status(addr, WAIT, |s| {
        let workers = members_in_role(s, "worker");
        s["lost"].as_array().is_some_and(|l| l.len() == 1)
            && workers.iter().all(|e| e["id"].as_u64() != Some(id))
            && workers
                .iter()
                .map(|e| e["input_blocks"].as_u64().unwrap())
                .sum::<u64>()
                == blocks
    })
    .await
    .unwrap_or_else(|e| panic!("evaluator {id} was not survived: {e}"));
    assert_eq!(st["phase"], "training", "{st}");
    let lost = st["lost"][0].as_str().unwrap();
    assert!(lost.contains(&format!("evaluator {id}")), "{lost}");
    let before = st["records_processed"].as_u64().unwrap();
    let epoch = st["records_per_epoch"].as_u64().unwrap();
    await_status(addr, WAIT, |s| {
        s["records_processed"].as_u64().unwrap_or(0) > before + epoch
    })
    .await
    .unwrap_or_else(|e| panic!("training stopped after the loss: {e}"));
    st
}

/// A worker killed mid-epoch (`SIGKILL`, its process gone) is survived: the
/// other workers re-read its input blocks and the job trains on, and ends
/// having evaluated every record, with the loss in its summary. (300 epochs
/// of about 0.05 s: the kill lands while it trains.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cruise();
    c.args(["run", "--json", "--epochs", "300", "--work-dir"])
        .arg(dir.path());
    let mut job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    let worker = training_member(&addr, "worker").await;
    let blocks = blocks_held(
        &await_status(&addr, WAIT, |_| true).await.unwrap(),
        "input_blocks",
        None,
    );
    signal(
        worker["pid"].as_u64().unwrap(),
        nix::sys::signal::Signal::SIGKILL,
    );
    let id = worker["id"].as_u64().unwrap();
    survived(&addr, id, blocks).await;
    let s = finished_evaluating_all(&mut job, WAIT).await.unwrap();
    assert_lost_only(&s, id);
    let f = &s["final_stats"];
    let acc = f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap();
    assert!(acc >= DEFAULT_JOB_MIN_ACCURACY, "accuracy {acc}");
}

/// A stopped worker (`SIGSTOP`: hung, alive to the resource manager) is
/// found by its silence, let go and its process killed by the release;
/// the others train on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_worker_is_survived_and_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (_job, addr) = endless_job_with(
        dir.path(),
        &[
            "--set",
            "channel.heartbeat_timeout_ms=3000",
            "--set",
            "runtime.release_grace_ms=500",
        ],
    )
    .await;
    let worker = training_member(&addr, "worker").await;
    let blocks = blocks_held(
        &await_status(&addr, WAIT, |_| true).await.unwrap(),
        "input_blocks",
        None,
    );
    let pid = worker["pid"].as_u64().unwrap();
    signal(pid, nix::sys::signal::Signal::SIGSTOP);
    let st = survived(&addr, worker["id"].as_u64().unwrap(), blocks).await;
    assert!(
        st["lost"][0].as_str().unwrap().contains("sent nothing"),
        "{st}"
    );
    let gone = cruise_integration::wait_until(WAIT, || {
        (!cruise_integration::pid_alive(pid as u32)).then_some(())
    })
    .await;
    if gone.is_err() {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
        panic!("the stopped worker {pid} was not killed by its release");
    }
}

/// A stopped evaluator (`SIGSTOP`: a hung process, alive to the resource
/// manager) is found by its silence within `channel.heartbeat_timeout_ms`;
/// the job fails naming it and the silence, and nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_evaluator_is_detected_by_its_silence() {
    let dir = tempfile::tempdir().unwrap();
    let (mut job, addr) =
        endless_job_with(dir.path(), &["--set", "channel.heartbeat_timeout_ms=3000"]).await;
    let st = await_status(&addr, WAIT, |s| {
        s["phase"] == "training" && s["records_processed"].as_u64().unwrap_or(0) > 0
    })
    .await
    .unwrap();
    let server = st["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["role"] == "server")
        .unwrap()
        .clone();
    let pid = nix::unistd::Pid::from_raw(server["pid"].as_u64().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let s = job.wait(WAIT).await;
    // Whatever happened, do not leave a stopped process behind.
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    let s = s.unwrap();
    assert!(!s.success(), "the job must fail");
    let err = job.stderr();
    let id = server["id"].as_u64().unwrap();
    assert!(err.contains(&format!("evaluator {id}")), "{err}");
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    assert!(
        err.contains("sent nothing for") && err.contains("channel.heartbeat_timeout_ms = 3000"),
        "{err}"
    );
}

#[tokio::test]
async fn bad_configuration_is_named() {
    let mut c = cruise();
    c.args(["run", "--set", "job.epoch=3"]);
    let mut p = Spawned::spawn(c).unwrap();
    assert!(!p.wait(WAIT).await.unwrap().success());
    assert!(
        p.stderr().contains("job.epoch") && p.stderr().contains("job.epochs"),
        "{}",
        p.stderr()
    );

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("job.toml");
    std::fs::write(&f, "[job]\ncontainers = 3\n[mlr]\nclasses = \"ten\"\n").unwrap();
    let mut c = cruise();
    c.args(["run", "--config"]).arg(&f);
    let mut p = Spawned::spawn(c).unwrap();
    assert!(!p.wait(WAIT).await.unwrap().success());
    assert!(
        p.stderr().contains("mlr.classes") && p.stderr().contains(&f.display().to_string()),
        "{}",
        p.stderr()
    );

    let mut c = cruise();
    c.args(["run", "--input", "/nonexistent/data.libsvm"]);
    let mut p = Spawned::spawn(c).unwrap();
    assert!(!p.wait(WAIT).await.unwrap().success());
    assert!(
        p.stderr().contains("/nonexistent/data.libsvm"),
        "{}",
        p.stderr()
    );
}
