//! The YARN clients and the YARN runtime against `cruise-sim yarn` (real
//! HTTP, real processes): every RM REST operation, the evaluator service's
//! life through the `ResourceManager` trait (create, flex, decommission,
//! capacity, destroy), an evaluator's stop of the service once its
//! application is over, TARBALL artifacts from the WebHDFS simulator, and the
//! failure modes (launch failure with exit code and diagnostics, missing
//! artifact, unreachable RM, malformed answers, no leaked service when the
//! resource manager is dropped or its runtime dies).
//!
//! Needs `cargo build -p cruise-sim` first (see `cruise_integration::binary`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use cruise_integration::{Sim, pid_alive, refused_port, wait_for};
use cruise_rm::http::{HttpOptions, RetryPolicy};
use cruise_rm::yarn::orphan::{ServiceOwner, Verdict};
use cruise_rm::yarn::rm::{RmClient, Submission};
use cruise_rm::yarn::services::StopOutcome;
use cruise_rm::yarn::{YarnConfig, YarnRm};
use cruise_rm::{ContainerRequest, ExitStatus, LaunchSpec, ResourceManager, RmError};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use common::{Events, allocated, completed, running};

const T: Duration = Duration::from_secs(30);

fn fast_http() -> HttpOptions {
    HttpOptions {
        retry: RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
        },
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(10),
        ..HttpOptions::default()
    }
}

fn config(sim_url: &str, service: &str) -> YarnConfig {
    YarnConfig {
        rm_addresses: vec![sim_url.to_string()],
        user: Some("alice".into()),
        http: fast_http(),
        service_name: service.into(),
        component: "evaluator".into(),
        queue: "default".into(),
        tarball: None,
        lifetime_secs: None,
        poll_interval: Duration::from_millis(100),
        capacity_poll_interval: Duration::from_millis(150),
        decommission_poll_interval: Duration::from_secs(5),
        decommission_default_timeout: Duration::from_secs(3600),
        min_allocation_mb: 1024,
        default_size: (1024, 1),
    }
}

fn spec(out: &Path, program: &str, script: &str) -> LaunchSpec {
    LaunchSpec {
        program: program.into(),
        args: if script.is_empty() {
            vec![]
        } else {
            vec!["-c".into(), script.into()]
        },
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

/// Records `$GREETING $CONTAINER_ID` and idles until terminated.
const IDLE: &str = r#"echo "$GREETING $CONTAINER_ID" >> "$OUT/seen"; trap 'exit 0' TERM; while true; do sleep 0.1; done"#;

async fn get(url: &str) -> (u16, Value) {
    let r = reqwest::get(url).await.unwrap();
    let s = r.status().as_u16();
    (
        s,
        serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null),
    )
}

async fn service(sim: &Sim, name: &str) -> (u16, Value) {
    get(&format!("{}/app/v1/services/{name}", sim.url)).await
}

/// Live (not COMPLETE) containers of the simulator, by id, with pids.
async fn live_containers(sim: &Sim) -> BTreeMap<String, u32> {
    let (_, v) = get(&format!("{}/sim/containers", sim.url)).await;
    v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] != "COMPLETE")
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["pid"].as_u64().unwrap_or(0) as u32,
            )
        })
        .collect()
}

fn seen_lines(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("seen"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// The YARN runtime on `sim` for service `name`, its evaluators running
/// [`IDLE`] with `out` as their `OUT`, and its events.
fn idle_service(sim: &Sim, out: &Path, name: &str) -> (YarnRm, Events) {
    let (tx, rx) = mpsc::unbounded_channel();
    let rm = YarnRm::start(config(&sim.url, name), spec(out, "/bin/sh", IDLE), tx).unwrap();
    (rm, Events::new(rx))
}

/// An application of one attempt named `name` whose AM runs `command`
/// with `environment`.
fn submission(
    application_id: &str,
    name: &str,
    environment: BTreeMap<String, String>,
    command: &str,
) -> Submission {
    Submission {
        application_id: application_id.to_string(),
        name: name.into(),
        queue: "default".into(),
        application_type: "CRUISE".into(),
        max_attempts: 1,
        memory_mb: 512,
        vcores: 1,
        local_resources: vec![],
        environment,
        command: command.into(),
    }
}

#[tokio::test]
async fn rm_rest_operations() {
    let sim = Sim::start("yarn", &[]).unwrap();
    let rm = RmClient::new(&[sim.address()], Some("alice".into()), fast_http()).unwrap();

    let info = rm.cluster_info().await.unwrap();
    assert_eq!(info.state, "STARTED");
    assert!(!info.hadoop_version.is_empty());
    let m = rm.metrics().await.unwrap();
    assert_eq!(m.total_mb, 2 * 8192);
    assert_eq!(m.active_nodes, 2);
    let nodes = rm.running_nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes
            .iter()
            .all(|n| n.avail_memory_mb == 8192 && n.available_virtual_cores == 8)
    );

    let app = rm.new_application().await.unwrap();
    assert!(app.application_id.starts_with("application_"), "{app:?}");
    assert_eq!(app.maximum_resource_capability.memory, 8192);
    let s = submission(
        &app.application_id,
        "rest-test",
        BTreeMap::from([("WORD".to_string(), "hello-am".to_string())]),
        "{ echo $WORD; exec sleep 60; } 1><LOG_DIR>/stdout 2><LOG_DIR>/stderr",
    );
    rm.submit(&s).await.unwrap();
    let id = app.application_id.clone();
    let report = wait_for("the AM to run", T, || async {
        let r = rm.app(&id).await.unwrap();
        (r.state == "RUNNING").then_some(r)
    })
    .await
    .unwrap();
    assert_eq!(report.name, "rest-test");
    assert_eq!(report.user, "alice");
    let attempts = rm.attempts(&id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert!(a.container_id.starts_with("container_"), "{a:?}");
    // The AM's stdout through the NodeManager's containerlogs endpoint.
    let log = wait_for("AM output", T, || async {
        rm.container_log(&a.node_http_address, &a.container_id, "stdout")
            .await
            .unwrap()
            .filter(|t| !t.is_empty())
    })
    .await
    .unwrap();
    assert_eq!(log, "hello-am\n");
    assert_eq!(
        rm.container_log(&a.node_http_address, &a.container_id, "nope")
            .await
            .unwrap(),
        None
    );

    assert_eq!(rm.kill(&id, T).await.unwrap(), "KILLED");
    assert_eq!(rm.app(&id).await.unwrap().state, "KILLED");
    assert!(rm.app(&id).await.unwrap().is_final());

    match rm.app("application_1_9999").await {
        Err(RmError::Http {
            status, endpoint, ..
        }) => {
            assert_eq!(status, 404);
            assert!(
                endpoint.contains("/ws/v1/cluster/apps/application_1_9999"),
                "{endpoint}"
            );
        }
        other => panic!("expected a 404: {other:?}"),
    }
}

/// An evaluator that lost its AM stops the evaluator service only once the
/// AM's application is over: while it runs the service is left alone;
/// once it is killed the service is stopped (its containers end) and a
/// second stop finds it stopped; a destroyed service is reported gone; an
/// application the RM does not know counts as over.
#[tokio::test]
async fn a_service_is_stopped_once_its_application_is_over() {
    let sim = Sim::start("yarn", &["--service-restart-delay-ms", "200"]).unwrap();
    let rm = RmClient::new(&[sim.address()], Some("alice".into()), fast_http()).unwrap();
    let app = rm.new_application().await.unwrap().application_id;
    rm.submit(&submission(
        &app,
        "owner",
        BTreeMap::new(),
        "exec sleep 60 1><LOG_DIR>/stdout 2><LOG_DIR>/stderr",
    ))
    .await
    .unwrap();
    wait_for("the AM to run", T, || async {
        (rm.app(&app).await.unwrap().state == "RUNNING").then_some(())
    })
    .await
    .unwrap();

    let out = tempfile::tempdir().unwrap();
    let name = "cruise-owned";
    let (yarn, mut ev) = idle_service(&sim, out.path(), name);
    yarn.request(req(2)).await.unwrap();
    for _ in 0..2 {
        ev.next("Running", T, running).await;
    }
    let owner = ServiceOwner {
        application: app.clone(),
        service: name.into(),
        rm_addresses: vec![sim.address()],
        user: Some("alice".into()),
    };
    // As the AM passes it to the evaluators, and as they read it.
    assert_eq!(
        ServiceOwner::from_env(&owner.env()).unwrap().as_ref(),
        Some(&owner)
    );

    let v = owner.stop_if_ended(fast_http()).await.unwrap();
    assert_eq!(
        v,
        Verdict::Live {
            state: "RUNNING".into()
        }
    );
    assert!(
        owner
            .describe(&v)
            .contains(&format!("application {app} is RUNNING"))
    );
    assert_ne!(service(&sim, name).await.1["state"], "STOPPED");

    rm.kill(&app, T).await.unwrap();
    let pids: Vec<u32> = live_containers(&sim).await.values().copied().collect();
    let v = owner.stop_if_ended(fast_http()).await.unwrap();
    assert_eq!(
        v,
        Verdict::Ended {
            state: "KILLED (final status KILLED)".into(),
            stop: StopOutcome::Stopped
        }
    );
    assert_eq!(service(&sim, name).await.1["state"], "STOPPED");
    for pid in pids {
        wait_for("the service's processes to end", T, || async {
            (!pid_alive(pid)).then_some(())
        })
        .await
        .unwrap();
    }
    assert!(
        matches!(
            owner.stop_if_ended(fast_http()).await.unwrap(),
            Verdict::Ended {
                stop: StopOutcome::AlreadyStopped,
                ..
            }
        ),
        "a second stop finds it stopped"
    );

    yarn.shutdown().await.unwrap();
    assert_eq!(service(&sim, name).await.0, 404);
    assert!(matches!(
        owner.stop_if_ended(fast_http()).await.unwrap(),
        Verdict::Ended {
            stop: StopOutcome::NotFound,
            ..
        }
    ));
    let unknown = ServiceOwner {
        application: "application_1_9999".into(),
        ..owner.clone()
    };
    assert_eq!(
        unknown.stop_if_ended(fast_http()).await.unwrap(),
        Verdict::Ended {
            state: "unknown to the ResourceManager".into(),
            stop: StopOutcome::NotFound
        }
    );
}

#[tokio::test]
async fn evaluator_service_lifecycle() {
    let sim = Sim::start("yarn", &["--service-restart-delay-ms", "200"]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let name = "cruise-life";
    let (rm, mut ev) = idle_service(&sim, out.path(), name);

    // Create: two containers, with the LaunchSpec's environment, and the
    // container id the process sees is the one the events carry.
    rm.request(req(2)).await.unwrap();
    let mut ids = BTreeSet::new();
    for _ in 0..2 {
        let (id, host) = ev.next("Allocated", T, allocated).await;
        assert_eq!(host, "127.0.0.1");
        ids.insert(id);
    }
    for _ in 0..2 {
        let id = ev.next("Running", T, running).await;
        assert!(ids.contains(&id));
    }
    let lines = wait_for("both evaluators to write", T, || async {
        let l = seen_lines(out.path());
        (l.len() == 2).then_some(l)
    })
    .await
    .unwrap();
    let seen: BTreeSet<String> = lines
        .iter()
        .map(|l| l.strip_prefix("hello there ").unwrap().to_string())
        .collect();
    assert_eq!(
        seen, ids,
        "CONTAINER_ID inside == container ids of the events"
    );
    let (st, v) = service(&sim, name).await;
    assert_eq!(st, 200);
    assert_eq!(v["components"][0]["number_of_containers"], 2);
    assert_eq!(v["components"][0]["resource"]["memory"], "1024");

    // Capacity: 2 nodes of 8 GB / 8 vcores hold 16 evaluators of 1 GB / 1 core.
    let cap = rm.capacity().await.unwrap();
    assert_eq!((cap.max_containers, cap.running), (16, 2));

    // Flex up by one.
    rm.request(req(1)).await.unwrap();
    let (third, _) = ev.next("a third Allocated", T, allocated).await;
    assert!(!ids.contains(&third));
    ev.next("its Running", T, |e| (running(e)? == third).then_some(()))
        .await;
    assert_eq!(
        service(&sim, name).await.1["components"][0]["number_of_containers"],
        3
    );

    // Decommission one: it ends as released, the count drops, the process dies.
    let victim = ids.iter().next().unwrap().clone();
    let pid = live_containers(&sim).await[&victim];
    assert!(pid_alive(pid));
    rm.release(&victim).await.unwrap();
    let (cid, _, _, released) = ev
        .next("the release", T, |e| completed(e).filter(|c| c.0 == victim))
        .await;
    assert_eq!(cid, victim);
    assert!(released);
    let v = service(&sim, name).await.1;
    assert_eq!(v["components"][0]["number_of_containers"], 2);
    let decom = v["components"][0]["decommissioned_instances"]
        .as_array()
        .unwrap();
    assert_eq!(decom.len(), 1, "{v}");
    wait_for("the released process to die", T, || async {
        (!pid_alive(pid)).then_some(())
    })
    .await
    .unwrap();
    assert!(matches!(
        rm.release(&victim).await,
        Err(RmError::UnknownContainer(_))
    ));
    assert!(matches!(
        rm.request(ContainerRequest {
            count: 1,
            memory_mb: 2048,
            cores: 1,
            hosts: vec![]
        })
        .await,
        Err(RmError::BadRequest(_))
    ));

    // A node joins: the capacity change reaches the AM.
    let r = reqwest::Client::new()
        .put(format!("{}/sim/capacity", sim.url))
        .json(&json!({"nodes": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let max = ev
        .any("CapacityChanged", T, |e| match e {
            cruise_rm::RmEvent::CapacityChanged { max_containers } => Some(*max_containers),
            _ => None,
        })
        .await;
    assert_eq!(max, 24);

    // Shutdown destroys the service and ends every container.
    let live: Vec<u32> = live_containers(&sim).await.values().copied().collect();
    assert_eq!(live.len(), 2);
    rm.shutdown().await.unwrap();
    ev.drain();
    let ended: BTreeSet<String> = ev
        .seen
        .iter()
        .filter_map(completed)
        .filter(|c| c.3)
        .map(|c| c.0)
        .collect();
    assert_eq!(
        ended.len(),
        3,
        "every container ends released: {:?}",
        ev.seen
    );
    assert_eq!(service(&sim, name).await.0, 404);
    for pid in live {
        wait_for("evaluators to die", T, || async {
            (!pid_alive(pid)).then_some(())
        })
        .await
        .unwrap();
    }
    assert!(matches!(rm.request(req(1)).await, Err(RmError::Stopped(_))));
}

#[tokio::test]
async fn launch_failure_reported_with_exit_code_and_diagnostics() {
    let sim = Sim::start("yarn", &["--service-restart-delay-ms", "5000"]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = YarnRm::start(
        config(&sim.url, "cruise-fails"),
        spec(
            out.path(),
            "/bin/sh",
            "echo boom: no such input >&2; exit 7",
        ),
        tx,
    )
    .unwrap();
    rm.request(req(1)).await.unwrap();
    let (id, exit, diag, released) = ev.next("Completed", T, completed).await;
    assert!(id.starts_with("container_"));
    assert_eq!(exit, ExitStatus::Code(7));
    assert!(diag.contains("boom: no such input"), "{diag}");
    assert!(!released);

    // A program that does not exist: bash's 127 and its message.
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev2 = Events::new(rx);
    let rm2 = YarnRm::start(
        config(&sim.url, "cruise-missing"),
        spec(out.path(), "/nonexistent/cruise", ""),
        tx,
    )
    .unwrap();
    rm2.request(req(1)).await.unwrap();
    let (_, exit, diag, _) = ev2.next("Completed", T, completed).await;
    assert_eq!(exit, ExitStatus::Code(127));
    assert!(diag.contains("/nonexistent/cruise"), "{diag}");
    rm.shutdown().await.unwrap();
    rm2.shutdown().await.unwrap();
    assert_eq!(service(&sim, "cruise-fails").await.0, 404);
    assert_eq!(service(&sim, "cruise-missing").await.0, 404);
}

#[tokio::test]
async fn tarball_artifacts_from_webhdfs() {
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let sim = Sim::start(
        "yarn",
        &["--webhdfs", &hdfs.url, "--service-restart-delay-ms", "5000"],
    )
    .unwrap();
    // A tarball with an executable script at its top level.
    let dir = tempfile::tempdir().unwrap();
    let content = dir.path().join("content");
    std::fs::create_dir_all(&content).unwrap();
    std::fs::write(
        content.join("hello.sh"),
        "#!/bin/sh\necho \"from the tarball $CONTAINER_ID\" >> \"$OUT/seen\"\nexec sleep 60\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        content.join("hello.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let tar = dir.path().join("app.tar");
    assert!(
        std::process::Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&content)
            .arg("hello.sh")
            .status()
            .unwrap()
            .success()
    );
    let fs = cruise_hdfs::FileSystem::default();
    let nn = hdfs.address();
    let uri = format!("hdfs://{nn}/apps/app.tar");
    fs.create(
        &format!("webhdfs://{nn}/apps/app.tar"),
        bytes::Bytes::from(std::fs::read(&tar).unwrap()),
        true,
    )
    .await
    .unwrap();

    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let mut cfg = config(&sim.url, "cruise-tarball");
    cfg.tarball = Some(uri);
    let rm = YarnRm::start(cfg, spec(out.path(), "./lib/hello.sh", ""), tx).unwrap();
    rm.request(req(1)).await.unwrap();
    let id = ev.next("Running", T, running).await;
    let lines = wait_for("the script to run", T, || async {
        let l = seen_lines(out.path());
        (!l.is_empty()).then_some(l)
    })
    .await
    .unwrap();
    assert_eq!(lines, vec![format!("from the tarball {id}")]);
    rm.shutdown().await.unwrap();

    // A missing artifact: the container fails to localize, with the path.
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let mut cfg = config(&sim.url, "cruise-no-tarball");
    cfg.tarball = Some(format!("hdfs://{nn}/apps/missing.tar"));
    let rm = YarnRm::start(cfg, spec(out.path(), "./lib/hello.sh", ""), tx).unwrap();
    rm.request(req(1)).await.unwrap();
    let (_, exit, diag, _) = ev.next("Completed", T, completed).await;
    assert_eq!(exit, ExitStatus::Code(-1000), "{diag}");
    assert!(diag.contains("missing.tar"), "{diag}");
    rm.shutdown().await.unwrap();
}

#[tokio::test]
async fn service_destroyed_when_the_handle_is_dropped() {
    let sim = Sim::start("yarn", &[]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut ev = Events::new(rx);
    let rm = YarnRm::start(
        config(&sim.url, "cruise-dropped"),
        spec(out.path(), "/bin/sh", IDLE),
        tx,
    )
    .unwrap();
    rm.request(req(2)).await.unwrap();
    ev.next("Running", T, running).await;
    assert_eq!(service(&sim, "cruise-dropped").await.0, 200);
    drop(rm);
    wait_for("the service to be destroyed", T, || async {
        (service(&sim, "cruise-dropped").await.0 == 404).then_some(())
    })
    .await
    .unwrap();
    wait_for("its containers to end", T, || async {
        live_containers(&sim).await.is_empty().then_some(())
    })
    .await
    .unwrap();
}

#[test]
fn service_destroyed_when_its_runtime_dies() {
    let sim = Sim::start("yarn", &[]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let url = sim.url.clone();
    let out_path = out.path().to_path_buf();
    // A runtime that dies with the resource manager still held: the actor
    // is dropped mid-flight, and its guard must destroy the service.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let rm = rt.block_on(async {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut ev = Events::new(rx);
        let rm = YarnRm::start(
            config(&url, "cruise-orphan"),
            spec(&out_path, "/bin/sh", IDLE),
            tx,
        )
        .unwrap();
        rm.request(req(1)).await.unwrap();
        ev.next("Running", T, running).await;
        rm
    });
    let check = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(check.block_on(service(&sim, "cruise-orphan")).0, 200);
    drop(rt);
    drop(rm);
    check
        .block_on(wait_for("the guard to destroy the service", T, || async {
            (service(&sim, "cruise-orphan").await.0 == 404).then_some(())
        }))
        .unwrap();
}

#[tokio::test]
async fn unreachable_rm_is_named() {
    let (_refusing, port) = refused_port().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let rm = YarnRm::start(
        config(&format!("127.0.0.1:{port}"), "cruise-nowhere"),
        spec(out.path(), "/bin/true", ""),
        tx,
    )
    .unwrap();
    let t = std::time::Instant::now();
    let err = rm.request(req(1)).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, RmError::Unreachable { attempts: 3, .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("POST http://127.0.0.1:{port}/app/v1/services")),
        "{msg}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "bounded: {:?}",
        t.elapsed()
    );
    rm.shutdown().await.unwrap();

    let client = RmClient::new(&[format!("127.0.0.1:{port}")], None, fast_http()).unwrap();
    let msg = client.cluster_info().await.unwrap_err().to_string();
    assert!(msg.contains("YARN ResourceManager unreachable"), "{msg}");
    assert!(
        msg.contains(&format!("127.0.0.1:{port}/ws/v1/cluster/info")),
        "{msg}"
    );
}

/// Serves `responses` (status, body), one per connection, in order.
async fn canned(responses: Vec<(u16, &'static str)>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        for (status, body) in responses {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf).await;
            let resp = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        }
    });
    addr.to_string()
}

#[tokio::test]
async fn malformed_and_unexpected_answers_are_named() {
    let fire =
        r#"{"RemoteException":{"exception":"YarnRuntimeException","message":"disk on fire"}}"#;
    // A 500 to a read is asked again (fast_http: 3 attempts); the last
    // answer is the error.
    let addr = canned(vec![
        (200, "this is not json"),
        (500, fire),
        (500, fire),
        (500, fire),
        (200, r#"{"application-id": 7}"#),
    ])
    .await;
    let rm = RmClient::new(std::slice::from_ref(&addr), None, fast_http()).unwrap();
    match rm.cluster_info().await {
        Err(RmError::Malformed {
            endpoint, status, ..
        }) => {
            assert_eq!(status, 200);
            assert_eq!(endpoint, format!("GET http://{addr}/ws/v1/cluster/info"));
        }
        other => panic!("{other:?}"),
    }
    let msg = rm.metrics().await.unwrap_err().to_string();
    assert!(
        msg.contains("HTTP 500") && msg.contains("disk on fire"),
        "{msg}"
    );
    assert!(msg.contains("/ws/v1/cluster/metrics"), "{msg}");
    let msg = rm.new_application().await.unwrap_err().to_string();
    assert!(
        msg.contains("new-application") && msg.contains("unexpected body"),
        "{msg}"
    );
}
