//! The Mesos runtime against `cruise-sim mesos` (real HTTP, a real RecordIO
//! stream, real task processes): launching packed offers with the task id as
//! the container id, the environment, KILL on release, capacity from offers
//! and its changes, TEARDOWN at shutdown and when dropped, the leader
//! redirect, re-subscription when heartbeats stop, inverse offers
//! (the agent's tasks reclaimed, then ACCEPT_INVERSE_OFFERS), and the failure modes
//! (task failure with exit code, unreachable master, ERROR event).
//!
//! Needs `cargo build -p cruise-sim` first (see `cruise_integration::binary`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cruise_integration::{FreezingProxy, Sim, pid_alive, refused_port, wait_for};
use cruise_rm::http::{HttpOptions, RetryPolicy};
use cruise_rm::mesos::{MesosConfig, MesosRm};
use cruise_rm::{ContainerRequest, ExitStatus, LaunchSpec, ResourceManager, RmEvent};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use common::{Events, allocated, completed, running};

const T: Duration = Duration::from_secs(30);

fn config(master: &str) -> MesosConfig {
    MesosConfig {
        masters: vec![master.to_string()],
        http: HttpOptions {
            retry: RetryPolicy {
                attempts: 3,
                initial_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(200),
            },
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            ..HttpOptions::default()
        },
        user: "alice".into(),
        framework_name: "cruise-test".into(),
        role: "*".into(),
        failover_timeout_secs: 60.0,
        refuse_seconds: 1.0,
        missed_heartbeats: 3,
        task_prefix: "job_test".into(),
        evaluator_uri: None,
        kill_grace: Duration::from_secs(3),
        default_size: (1024, 1),
    }
}

fn spec(out: &Path, script: &str) -> LaunchSpec {
    LaunchSpec {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: BTreeMap::from([
            ("GREETING".to_string(), "hello there".to_string()),
            ("OUT".to_string(), out.display().to_string()),
        ]),
        work_dir: out.to_path_buf(),
    }
}

fn req(count: u32) -> ContainerRequest {
    ContainerRequest {
        count,
        memory_mb: 1024,
        cores: 1,
        hosts: vec![],
    }
}

const IDLE: &str = r#"echo "$GREETING $MESOS_TASK_ID" >> "$OUT/seen"; trap 'exit 0' TERM; while true; do sleep 0.1; done"#;

fn start_sim(extra: &[&str]) -> Sim {
    let mut args = vec!["--allocation-interval-ms", "100"];
    args.extend_from_slice(extra);
    Sim::start("mesos", &args).unwrap()
}

async fn state(sim: &Sim) -> Value {
    reqwest::get(format!("{}/sim/state", sim.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn seen_lines(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("seen"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn capacity_changed(want: u32) -> impl FnMut(&RmEvent) -> Option<()> {
    move |e| match e {
        RmEvent::CapacityChanged { max_containers } if *max_containers == want => Some(()),
        _ => None,
    }
}

#[tokio::test]
async fn tasks_launch_release_capacity_and_teardown() {
    let sim = start_sim(&[]);
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(config(&sim.address()), spec(out.path(), IDLE), tx).unwrap();

    rm.request(req(3)).await.unwrap();
    let mut ids = BTreeSet::new();
    for _ in 0..3 {
        let (id, host) = ev.next("Allocated", T, allocated).await;
        assert!(id.starts_with("job_test-"), "{id}");
        assert!(!host.is_empty());
        ids.insert(id);
    }
    let mut pids = Vec::new();
    for _ in 0..3 {
        let (id, pid) = ev
            .next("Running", T, |e| match e {
                RmEvent::Running { container, pid } => Some((container.clone(), *pid)),
                _ => None,
            })
            .await;
        assert!(ids.contains(&id));
        pids.push(pid.expect("the executor pid"));
    }
    let lines = wait_for("three tasks to write", T, || async {
        let l = seen_lines(out.path());
        (l.len() == 3).then_some(l)
    })
    .await
    .unwrap();
    let seen: BTreeSet<String> = lines
        .iter()
        .map(|l| l.strip_prefix("hello there ").unwrap().to_string())
        .collect();
    assert_eq!(
        seen, ids,
        "MESOS_TASK_ID inside == container ids of the events"
    );
    let st = state(&sim).await;
    let fid = rm.framework_id().unwrap();
    assert_eq!(st["frameworks"][0]["id"], fid);
    let running_tasks: BTreeSet<String> = st["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "TASK_RUNNING")
        .map(|t| t["task_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(running_tasks, ids);
    // Each task got exactly the evaluator size.
    for t in st["tasks"].as_array().unwrap() {
        let res = t["resources"].to_string();
        assert!(res.contains("cpus") && res.contains("mem"), "{res}");
    }

    // Capacity: 2 agents of 4 cpus / 8 GB fit 8 evaluators of 1 core / 1 GB,
    // 3 of them held. Offers keep coming (declined with a filter), so it is
    // known without a new request.
    let cap = wait_for("a capacity from both agents", T, || async {
        let c = rm.capacity().await.unwrap();
        (c.max_containers == 8).then_some(c)
    })
    .await
    .unwrap();
    assert_eq!(cap.running, 3);

    // Release: KILL; the terminal update ends it as released.
    let victim = ids.iter().next().unwrap().clone();
    rm.release(&victim).await.unwrap();
    let (_, _, diag, released) = ev
        .next("the kill", T, |e| completed(e).filter(|c| c.0 == victim))
        .await;
    assert!(released);
    assert!(diag.starts_with("TASK_KILLED"), "{diag}");

    // An agent joins: the change is reported.
    let r = reqwest::Client::new()
        .put(format!("{}/sim/capacity", sim.url))
        .json(&json!({"agents": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    ev.any("CapacityChanged to 12", T, capacity_changed(12))
        .await;
    // It leaves again: the master sends FAILURE for the lost agent and the
    // capacity drops back.
    ev.skip_all();
    let r = reqwest::Client::new()
        .put(format!("{}/sim/capacity", sim.url))
        .json(&json!({"agents": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    ev.next("CapacityChanged to 8", T, capacity_changed(8))
        .await;
    assert_eq!(rm.capacity().await.unwrap().max_containers, 8);

    // Shutdown: the others are killed and the framework torn down.
    rm.shutdown().await.unwrap();
    ev.drain();
    let ended: BTreeSet<String> = ev
        .seen
        .iter()
        .filter_map(completed)
        .filter(|c| c.3)
        .map(|c| c.0)
        .collect();
    assert_eq!(ended, ids, "{:?}", ev.seen);
    let st = state(&sim).await;
    assert!(
        st["removed_frameworks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| *f == fid),
        "{st}"
    );
    for pid in pids {
        wait_for("tasks to die", T, || async {
            (!pid_alive(pid)).then_some(())
        })
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn task_failures_report_exit_codes() {
    let sim = start_sim(&[]);
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(
        config(&sim.address()),
        spec(out.path(), "echo boom >&2; exit 7"),
        tx,
    )
    .unwrap();
    rm.request(req(1)).await.unwrap();
    let (_, exit, diag, released) = ev.next("Completed", T, completed).await;
    assert_eq!(exit, ExitStatus::Code(7));
    assert!(diag.starts_with("TASK_FAILED"), "{diag}");
    assert!(diag.contains("exited with status 7"), "{diag}");
    assert!(!released);
    rm.shutdown().await.unwrap();

    // A program that cannot be executed.
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let mut s = spec(out.path(), "");
    s.program = "/nonexistent/cruise".into();
    s.args = vec!["evaluator".into()];
    let rm = MesosRm::start(config(&sim.address()), s, tx).unwrap();
    rm.request(req(1)).await.unwrap();
    let (_, exit, diag, _) = ev.next("Completed", T, completed).await;
    assert!(!exit.success(), "{exit}");
    assert!(
        diag.contains("TASK_FAILED") || diag.contains("TASK_ERROR"),
        "{diag}"
    );
    rm.shutdown().await.unwrap();
}

#[tokio::test]
async fn framework_torn_down_when_dropped() {
    let sim = start_sim(&[]);
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(config(&sim.address()), spec(out.path(), IDLE), tx).unwrap();
    rm.request(req(1)).await.unwrap();
    let pid = ev
        .next("Running", T, |e| match e {
            RmEvent::Running { pid, .. } => *pid,
            _ => None,
        })
        .await;
    let fid = rm.framework_id().unwrap();
    drop(rm);
    wait_for("the framework to be torn down", T, || async {
        let st = state(&sim).await;
        st["removed_frameworks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| *f == fid)
            .then_some(())
    })
    .await
    .unwrap();
    wait_for("its task to die", T, || async {
        (!pid_alive(pid)).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn follows_the_leader_redirect() {
    let leader = start_sim(&[]);
    let follower = Sim::start("mesos", &["--leader-redirect", &leader.address()]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(config(&follower.address()), spec(out.path(), IDLE), tx).unwrap();
    rm.request(req(1)).await.unwrap();
    let id = ev.next("Running", T, running).await;
    let st = state(&leader).await;
    assert_eq!(st["tasks"][0]["task_id"], id.as_str());
    rm.shutdown().await.unwrap();
}

#[tokio::test]
async fn resubscribes_when_heartbeats_stop() {
    let sim = Sim::start_logging(
        "mesos",
        &[
            "--allocation-interval-ms",
            "100",
            "--heartbeat-interval-secs",
            "0.2",
        ],
        "debug",
    )
    .unwrap();
    let target: SocketAddr = sim.address().parse().unwrap();
    let proxy = FreezingProxy::start(target).await.unwrap();
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(config(&proxy.addr.to_string()), spec(out.path(), IDLE), tx).unwrap();
    rm.request(req(1)).await.unwrap();
    let id = ev.next("Running", T, running).await;
    let fid = rm.framework_id().unwrap();
    let first_stream = state(&sim).await["frameworks"][0]["stream_id"].clone();
    assert!(first_stream.is_string());

    // Stall every open connection: heartbeats stop arriving, the master
    // still thinks the framework is connected.
    proxy.freeze();
    let st = wait_for("a new subscription", T, || async {
        let st = state(&sim).await;
        let f = &st["frameworks"][0];
        (f["stream_id"] != first_stream && f["connected"] == true).then_some(st)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; events {:?}; master log:\n{}", ev.seen, sim.log()));
    assert_eq!(
        st["frameworks"][0]["id"],
        fid.as_str(),
        "failover keeps the framework id"
    );
    assert_eq!(rm.framework_id().unwrap(), fid);
    // After re-subscribing, the framework asks for its tasks' states.
    wait_for("a RECONCILE call", T, || async {
        let log = sim.log();
        let after = log.split("framework subscribed").nth(2)?;
        after.contains("RECONCILE").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; master log:\n{}", sim.log()));

    // The new stream works: a release is killed and reported.
    rm.release(&id).await.unwrap();
    let (_, _, _, released) = ev
        .next("the kill after re-subscribing", T, |e| {
            completed(e).filter(|c| c.0 == id)
        })
        .await;
    assert!(released);
    rm.shutdown().await.unwrap();
    proxy.stop().await;
}

#[tokio::test]
async fn unreachable_master_is_named() {
    let (_refusing, port) = refused_port().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(
        config(&format!("127.0.0.1:{port}")),
        spec(out.path(), IDLE),
        tx,
    )
    .unwrap();
    rm.request(req(1)).await.unwrap();
    let reason = ev
        .next("AllocationFailed", T, |e| match e {
            RmEvent::AllocationFailed { reason } => Some(reason.clone()),
            _ => None,
        })
        .await;
    assert!(reason.contains("Mesos master unreachable"), "{reason}");
    assert!(
        reason.contains(&format!("http://127.0.0.1:{port}/api/v1/scheduler")),
        "{reason}"
    );
    assert!(reason.contains("3 attempts"), "{reason}");
    assert!(rm.request(req(1)).await.is_err());
    rm.shutdown().await.unwrap();
}

/// A fake master that answers SUBSCRIBE with a stream holding one ERROR.
async fn erroring_master() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                let _ = s.read(&mut buf).await;
                let event = r#"{"type":"ERROR","error":{"message":"Framework has been removed"}}"#;
                let record = format!("{}\n{event}", event.len());
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMesos-Stream-Id: s-1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{record}\r\n",
                    record.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                // Keep the stream open, as a master does.
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    addr.to_string()
}

#[tokio::test]
async fn error_event_ends_the_framework() {
    let master = erroring_master().await;
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(config(&master), spec(out.path(), IDLE), tx).unwrap();
    let reason = ev
        .next("AllocationFailed", T, |e| match e {
            RmEvent::AllocationFailed { reason } => Some(reason.clone()),
            _ => None,
        })
        .await;
    assert!(
        reason.contains("ERROR: Framework has been removed"),
        "{reason}"
    );
    rm.shutdown().await.unwrap();
}

#[test]
fn framework_torn_down_when_its_runtime_dies() {
    let sim = start_sim(&[]);
    let out = tempfile::tempdir().unwrap();
    let master = sim.address();
    let out_path = out.path().to_path_buf();
    // The runtime dies with the resource manager still held: its stream
    // closes (the master marks the framework disconnected) and the actor is
    // dropped mid-flight; the guard must subscribe again and tear down.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (rm, pid) = rt.block_on(async {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut ev = Events::new(rx);
        let rm = MesosRm::start(config(&master), spec(&out_path, IDLE), tx).unwrap();
        rm.request(req(1)).await.unwrap();
        let pid = ev
            .next("Running", T, |e| match e {
                RmEvent::Running { pid, .. } => *pid,
                _ => None,
            })
            .await;
        (rm, pid)
    });
    let fid = rm.framework_id().unwrap();
    drop(rt);
    drop(rm);
    let check = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    check
        .block_on(wait_for("the guard's teardown", T, || async {
            let st = state(&sim).await;
            st["removed_frameworks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| *f == fid)
                .then_some(())
        }))
        .unwrap_or_else(|e| panic!("{e}; master log:\n{}", sim.log()));
    check
        .block_on(wait_for("the task to die", T, || async {
            (!pid_alive(pid)).then_some(())
        }))
        .unwrap();
}

/// The inverse offers of one agent, as the simulator recorded them.
async fn inverse_offers(sim: &Sim, agent: &str) -> Vec<Value> {
    state(sim).await["inverse_offers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["agent_id"] == agent)
        .cloned()
        .collect()
}

/// Puts `agent` into maintenance starting in `start_in_secs`.
async fn maintenance(sim: &Sim, agent: &str, start_in_secs: f64) {
    let r = reqwest::Client::new()
        .post(format!("{}/sim/inverse_offer", sim.url))
        .json(&json!({"agent_id": agent, "start_in_secs": start_in_secs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn inverse_offers_reclaim_the_agents_tasks_then_are_accepted() {
    // One evaluator per agent.
    let sim = start_sim(&[
        "--agents",
        "3",
        "--agent-cpus",
        "1",
        "--agent-mem-mb",
        "1024",
    ]);
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = MesosRm::start(config(&sim.address()), spec(out.path(), IDLE), tx).unwrap();
    rm.request(req(2)).await.unwrap();
    for _ in 0..2 {
        ev.next("Running", T, running).await;
    }
    let st = state(&sim).await;
    let tasks: BTreeMap<String, String> = st["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["agent_id"].as_str().unwrap().to_string(),
                t["task_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let idle = st["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .find(|a| !tasks.contains_key(a))
        .unwrap();

    // An agent holding none of our tasks: accepted at once, nothing reclaimed.
    maintenance(&sim, &idle, 60.0).await;
    wait_for("the idle agent's inverse offer accepted", T, || async {
        let io = inverse_offers(&sim, &idle).await;
        (io.len() == 1 && io[0]["status"] == "ACCEPTED").then_some(())
    })
    .await
    .unwrap();

    // The agent of a task: the task is reclaimed, deadline the window's
    // start; the inverse offer waits for the task to be given back.
    let (agent, task) = tasks.iter().next().unwrap();
    maintenance(&sim, agent, 60.0).await;
    let (containers, deadline, reason) = ev
        .next("Reclaiming", T, |e| match e {
            RmEvent::Reclaiming {
                containers,
                deadline,
                reason,
            } => Some((containers.clone(), *deadline, reason.clone())),
            _ => None,
        })
        .await;
    assert_eq!(containers, vec![task.clone()]);
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    assert!(
        left > Duration::from_secs(30) && left <= Duration::from_secs(60),
        "{left:?}"
    );
    assert!(reason.contains(agent.as_str()), "{reason}");
    assert_eq!(inverse_offers(&sim, agent).await[0]["status"], "PENDING");
    rm.release(task).await.unwrap();
    ev.next("the reclaimed task's end", T, |e| {
        completed(e).filter(|c| &c.0 == task)
    })
    .await;
    wait_for("the inverse offer accepted", T, || async {
        (inverse_offers(&sim, agent).await[0]["status"] == "ACCEPTED").then_some(())
    })
    .await
    .unwrap();

    // A window that has started already: the deadline is now, not earlier.
    let (agent2, task2) = tasks.iter().nth(1).unwrap();
    maintenance(&sim, agent2, 0.0).await;
    let (containers, deadline) = ev
        .next("Reclaiming at once", T, |e| match e {
            RmEvent::Reclaiming {
                containers,
                deadline,
                ..
            } => Some((containers.clone(), *deadline)),
            _ => None,
        })
        .await;
    assert_eq!(containers, vec![task2.clone()]);
    assert!(deadline <= std::time::Instant::now());
    rm.shutdown().await.unwrap();
}
