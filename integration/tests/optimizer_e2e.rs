//! The optimizer end to end on the local runtime: `cruise run` and its
//! evaluators are separate OS processes, the job measures itself and
//! reconfigures while it trains.
//!
//! These jobs decide from the epoch times they measure, so the tests run
//! one at a time (a lock held for the whole test): two jobs sharing the
//! two cores would measure each other.

use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use tokio::sync::Mutex;

use cruise_appmaster::am::history::{self, Record};
use cruise_integration::{Spawned, await_status, binary, status_address};

const WAIT: Duration = Duration::from_secs(300);

/// Held by each test for its whole run.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

fn cruise() -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG");
    c
}

/// MLR on 100k generated samples of 200 features each (the README's
/// self-configuration example), with the optimizer looking every half second
/// once each worker has reported `min_mini_batches`.
///
/// 200 features a record make computation the larger part of a mini-batch,
/// so that the optimum of 4 containers (3 workers, 1 server) is clear:
/// measured there, the cost model puts it 26–27% ahead of the next split
/// (and it is: 0.41–0.45 s an epoch against 0.52 s at 2 + 2). At the default 40
/// features 2 + 2 and 3 + 1 are within a few percent of each other, and the
/// noise of a shared 2-core machine decides between them (a job started at
/// 2 + 2 once measured an 11% gain and moved).
fn job(work: &std::path::Path, workers: u64, epochs: u32, min_mini_batches: u32) -> Command {
    let mut c = cruise();
    c.args(["run", "--json", "--quiet", "-n", "4"])
        .args(["-w", &workers.to_string(), "-e", &epochs.to_string()])
        .args(["--set", "mlr.generate_samples=100000"])
        .args(["--set", "mlr.generate_nnz=200"])
        // At the default step (10) records this dense end near 0.90
        // accuracy; at 4 near 0.96.
        .args(["--set", "mlr.step_size=4"])
        .args(["--set", "optimizer.interval_ms=500"])
        .args([
            "--set",
            &format!("optimizer.min_mini_batches={min_mini_batches}"),
        ])
        .arg("--set")
        .arg(format!(
            "optimizer.snapshot_file={}",
            work.join("snap.json").display()
        ))
        .arg("--work-dir")
        .arg(work);
    c
}

async fn finish(c: Command) -> Value {
    let mut p = Spawned::spawn(c).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "cruise run failed:\n{}", p.stderr());
    serde_json::from_str(&p.stdout()).expect("JSON summary on stdout")
}

/// The optimizer's decisions ("waiting: …", "considering …", "staying …")
/// in the history of the job that ran in `work_dir`, one a line, for a
/// failure message: why the job did or did not reconfigure.
fn decisions(work_dir: &std::path::Path) -> String {
    let records = history::find(work_dir).and_then(|f| history::read(&f));
    match records {
        Ok(records) => records
            .iter()
            .filter_map(|r| match r {
                Record::Decision { at_secs, text } => Some(format!("{at_secs:>7.2}s {text}\n")),
                _ => None,
            })
            .collect(),
        Err(e) => format!("(no history: {e})"),
    }
}

fn accuracy(s: &Value) -> f64 {
    let f = &s["final_stats"];
    f["correct"].as_f64().unwrap() / f["records"].as_f64().unwrap()
}

fn epochs(s: &Value) -> Vec<(u64, u64, f64)> {
    s["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["workers"].as_u64().unwrap(),
                e["servers"].as_u64().unwrap(),
                e["secs"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A job started at a bad split (1 worker, 3 servers) is moved by the
/// optimizer to a split with more workers (its epoch time before and
/// after is printed), and nothing is lost on the way; a job started at the optimum (3 workers,
/// 1 server) stays where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_split_is_improved_and_the_optimum_stays() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // One worker runs 1000 mini-batches an epoch: waiting for 2500 leaves
    // two whole epochs at the bad split to compare with, and 30 epochs
    // leave enough after it for the plan to pay its predicted cost (with 14
    // the job sometimes stayed: "does not pay").
    let s = finish(job(dir.path(), 1, 30, 2500)).await;

    let plans = s["reconfigurations"].as_array().unwrap();
    assert!(
        !plans.is_empty(),
        "no reconfiguration; the optimizer's decisions:\n{}\nsummary: {s}",
        decisions(dir.path())
    );
    for p in plans {
        assert!(p["failed"].as_array().unwrap().is_empty(), "{p}");
    }
    let e = epochs(&s);
    let (w_end, s_end, _) = *e.last().unwrap();
    assert!(w_end > 1, "ended with {w_end} workers: {s}");
    // The optimizer may give back a container it has no use for (a server
    // costs every worker's requests whatever it holds); it never adds one.
    assert!(w_end + s_end <= 4, "no container added: {s}");
    assert_eq!(
        s["final_stats"]["records"], s["records"],
        "every record evaluated once after the moves"
    );
    assert!(accuracy(&s) >= 0.9, "accuracy {}", accuracy(&s));
    // The snapshot the first plan was decided from is kept beside the
    // latest one: it shows the bad split the job started at.
    let first: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("snap.plan-1.json"))
            .expect("the first plan's snapshot"),
    )
    .unwrap();
    let roles: Vec<&str> = first["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        (
            roles.iter().filter(|&&r| r == "worker").count(),
            roles.iter().filter(|&&r| r == "server").count()
        ),
        (1, 3),
        "{roles:?}"
    );
    // It carries the job's policy, so `cruise plan` on it decides as the
    // job did: to leave the bad split.
    assert!(first["policy"]["op_costs"].is_array(), "{first}");
    // The bad split's epoch time, as measured there, went with the job:
    // the policy of the latest look remembers it.
    let left = first["job"]["measured_epoch_secs"].as_f64();
    assert!(left.is_some_and(|v| v > 0.0), "{}", first["job"]);
    let latest: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("snap.json")).expect("the latest snapshot"),
    )
    .unwrap();
    let remembered = latest["policy"]["measured"]
        .as_array()
        .expect("measured splits");
    assert!(
        remembered
            .iter()
            .any(|m| m["workers"].as_array().unwrap().len() == 1
                && m["servers"].as_array().unwrap().len() == 3
                && m["epoch_secs"].as_f64().is_some_and(|v| v > 0.0)),
        "{remembered:?}"
    );
    let out = std::process::Command::new(binary("cruise").expect("cruise is built"))
        .arg("plan")
        .arg(dir.path().join("snap.plan-1.json"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cruise plan failed: {text}");
    assert!(
        text.contains("policy (the job's, from the snapshot)")
            && text.contains("decision: reconfigure to"),
        "{text}"
    );

    // Epoch time before (epoch 1 warms up; skipped) and after (the epoch in
    // which the plan ran is skipped) the first reconfiguration.
    let first_after = e.iter().position(|&(w, _, _)| w != 1).unwrap();
    let before: Vec<f64> = e[1..first_after].iter().map(|x| x.2).collect();
    let after: Vec<f64> = e[first_after + 1..].iter().map(|x| x.2).collect();
    assert!(
        !before.is_empty() && after.len() >= 2,
        "reconfigured in epoch {}: too early or too late to compare: {e:?}",
        first_after + 1
    );
    // Reported, not asserted: on a shared 2-core machine another load can
    // make 2 + 2 no faster than 1 + 3 for a while (it once measured 0.363 s
    // → 0.400 s beside a busy loop). That the optimizer's moves pay is
    // `bench-optimizer`'s claim, measured against the grid in one run.
    let (b, a) = (median(before), median(after));
    eprintln!("epoch time: {b:.3} s at 1 worker, 3 servers; {a:.3} s after; epochs {e:?}");

    // Started at the optimum, the job does not move. That is 3 workers and
    // 1 server, whether or not the first job got there: from 1 + 3 the
    // model sometimes prefers 2 + 2 (it charges the one server of 3 + 1 with
    // every worker's requests of a round), and a job at 2 + 2 then finds
    // the move on to 3 + 1 too dear for the epochs it has left.
    let dir = tempfile::tempdir().unwrap();
    let s2 = finish(job(dir.path(), 3, 8, 5)).await;
    assert!(
        s2["reconfigurations"].as_array().unwrap().is_empty(),
        "a job at the optimum reconfigured: {}; the optimizer's decisions:\n{}",
        s2["reconfigurations"],
        decisions(dir.path())
    );
    assert!(
        epochs(&s2).iter().all(|&(w, _, _)| w == 3),
        "{:?}",
        epochs(&s2)
    );
}

/// The local runtime offers 6 containers half a second in, before the
/// optimizer can have looked, and takes 2 back later: the job grows into the
/// offer, gives the containers back (moving their blocks off first), and
/// keeps training. The offer comes first because on this 2-core machine the
/// model may judge the job's first look, at 4 containers, best served by
/// another split of the 4; once moved there, the 2 containers offered after
/// are not worth the plan. It may give them back before the capacity
/// shrinks: six processes here measure slower than four, and what the job
/// measured outranks the model's prediction. The forced scale-in itself is
/// pinned by the in-process
/// `reconfig::reclaimed_capacity_is_given_back_and_training_goes_on`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_schedule_grows_and_shrinks_the_job() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // Shrink at 40 s: well after the optimizer's first looks, even on a
    // loaded machine; the test checks that the growth came first.
    const SHRINK_AT: f64 = 40.0;
    let mut c = cruise();
    c.args(["run", "-n", "4", "-w", "2", "--epochs", "100000"])
        .args(["--set", "mlr.generate_samples=40000"])
        .args(["--set", "optimizer.interval_ms=300"])
        .args([
            "--set",
            &format!("runtime.capacity_schedule=0.5:6,{SHRINK_AT}:4"),
        ])
        .arg("--work-dir")
        .arg(dir.path());
    let mut job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();

    let active = |s: &Value| {
        s["evaluators"]
            .as_array()
            .map(|e| e.iter().filter(|e| e["role"] != "idle").count())
            .unwrap_or(0)
    };
    // The plan is recorded when it has finished; its evaluators take their
    // roles while it runs.
    let grown = await_status(&addr, WAIT, |s| {
        active(s) > 4
            && s["reconfigurations"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
    })
    .await
    .unwrap();
    assert_eq!(grown["capacity"], 6, "{grown}");
    let grown_at = grown["reconfigurations"][0]["at_secs"].as_f64().unwrap();
    assert!(
        grown_at < SHRINK_AT,
        "grew only at {grown_at} s, after the capacity was taken back"
    );

    let shrunk = await_status(&addr, WAIT, |s| s["capacity"] == 4 && active(s) <= 4)
        .await
        .unwrap();
    for p in shrunk["reconfigurations"].as_array().unwrap() {
        assert!(p["failed"].as_array().unwrap().is_empty(), "{p}");
    }
    // Training goes on after the shrink.
    let records = shrunk["records_processed"].as_u64().unwrap();
    let later = await_status(&addr, WAIT, |s| {
        s["records_processed"].as_u64().unwrap_or(0) > records + 40_000
    })
    .await
    .unwrap();
    assert_eq!(later["phase"], "training", "{later}");
    assert!(active(&later) <= 4, "{later}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job.child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let _ = job.wait(WAIT).await.unwrap();
    assert!(job.stderr().contains("cancelled"), "{}", job.stderr());
    assert!(
        !job.stderr().contains("failed"),
        "nothing failed on the way:\n{}",
        job.stderr()
    );
}

/// With `optimizer.advise_only` a job at the bad split measures and
/// decides but does not move; its snapshot, read back by the real `cruise
/// plan --splits`, predicts the measured split within a factor of two and
/// puts more workers ahead of it (the plan the job did not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advise_only_decides_without_moving_and_its_snapshot_predicts_the_splits() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // 30 epochs: long enough that the same job without advise_only
    // reconfigures (twice, when this test was written), so a plan here
    // would be the flag ignored.
    let mut c = job(dir.path(), 1, 30, 20);
    c.args(["--set", "optimizer.advise_only=true"]);
    let s = finish(c).await;
    assert!(
        s["reconfigurations"].as_array().unwrap().is_empty(),
        "advise_only ran a plan: {s}"
    );
    let e = epochs(&s);
    assert!(e.iter().all(|x| (x.0, x.1) == (1, 3)), "{e:?}");
    let measured = median(e.iter().skip(1).map(|x| x.2).collect());

    // The evaluators in container start order: the order roles were dealt.
    let mut evals: Vec<(String, u64)> = s["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["container"].as_str().unwrap().to_string(),
                v["id"].as_u64().unwrap(),
            )
        })
        .collect();
    evals.sort();
    let order: Vec<String> = evals.iter().map(|(_, id)| format!("e{id}")).collect();
    let snap = dir.path().join("snap.json");
    let v = plan_json(&snap, &["--splits", &order.join(","), "--json"]).await;
    let splits: Vec<f64> = v["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["epoch_secs"].as_f64().unwrap())
        .collect();
    assert_eq!(splits.len(), 3, "{v}");
    let one_worker = splits[0];
    assert!(
        one_worker > measured / 2.0 && one_worker < measured * 2.0,
        "1W+3S predicted {one_worker:.3} s, measured {measured:.3} s"
    );
    assert!(splits[2] < one_worker, "3W+1S not ahead: {v}");

    // The decision from that snapshot as if 30 epochs were left, as
    // JSON: the plan the job did not run, to more workers.
    let v = plan_json(&snap, &["--remaining-epochs", "30", "--json"]).await;
    let proposed = v["proposed"]
        .as_object()
        .unwrap_or_else(|| panic!("no proposed roles: {v}"));
    let workers = proposed
        .values()
        .filter(|p| p["role"] == "worker" && p["input_blocks"].as_u64() > Some(0))
        .count();
    assert!(workers > 1, "{v}");
}

/// The real `cruise plan SNAPSHOT ARGS…`, its JSON answer.
async fn plan_json(snap: &std::path::Path, args: &[&str]) -> Value {
    let out = cruise()
        .arg("plan")
        .arg(snap)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
