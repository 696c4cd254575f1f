//! The YARN and Mesos clients against a ResourceManager or Mesos master that
//! misbehaves ([`HostileServer`] on a real socket): bounded bodies, bounded
//! and spaced re-subscriptions, `Retry-After`, truncated bodies, absurd
//! offers, and answers missing what they must carry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cruise_integration::hostile::{HostileServer, Measured, Reply, Request};
use cruise_integration::{binary, wait_until};
use cruise_rm::http::{Http, HttpOptions, Idempotence, RetryPolicy, parse_base};
use cruise_rm::mesos::{MesosConfig, MesosRm};
use cruise_rm::yarn::rm::RmClient;
use cruise_rm::yarn::services::ServicesClient;
use cruise_rm::{LaunchSpec, ResourceManager, RmEvent};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::mpsc;

fn fast() -> HttpOptions {
    HttpOptions {
        retry: RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        },
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        ..HttpOptions::default()
    }
}

fn http(server: &HostileServer, options: HttpOptions) -> Http {
    let base = parse_base(&server.url(), "test").unwrap();
    Http::new("test service", vec![base], options, false).unwrap()
}

async fn get(h: &Http) -> Result<cruise_rm::http::Reply, cruise_rm::RmError> {
    tokio::time::timeout(
        Duration::from_secs(60),
        h.send(Method::GET, "/x", &[], None, Idempotence::Idempotent),
    )
    .await
    .expect("the client gave up within 60 s")
}

#[tokio::test]
async fn an_endless_body_is_refused_at_the_limit() {
    let s = HostileServer::start(|_: &Request| Reply::Endless {
        status: 200,
        prefix: b"{".to_vec(),
        chunk: vec![b' '; 64 << 10],
    })
    .await
    .unwrap();
    let options = HttpOptions {
        max_body_bytes: 1 << 20,
        ..fast()
    };
    let msg = get(&http(&s, options)).await.unwrap_err().to_string();
    assert!(msg.contains("runtime.rm_max_response_bytes"), "{msg}");
    assert!(msg.contains(&format!("GET {}/x", s.url())), "{msg}");
    assert_eq!(s.requests(), 1);
    assert!(
        s.bytes_sent() < (1 << 20) + (32 << 20),
        "{}",
        s.bytes_sent()
    );
}

#[tokio::test]
async fn a_truncated_body_is_retried_and_named() {
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let s = HostileServer::start(move |_: &Request| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::Truncated {
                status: 200,
                length: 100,
                body: b"{\"a\":".to_vec(),
            }
        } else {
            Reply::json(200, &json!({"a": 1}))
        }
    })
    .await
    .unwrap();
    let reply = get(&http(&s, fast())).await.unwrap();
    assert_eq!(reply.json::<Value>().unwrap()["a"], 1);
    assert_eq!(s.requests(), 2);

    let s = HostileServer::start(|_: &Request| Reply::Truncated {
        status: 200,
        length: 100,
        body: b"{\"a\":".to_vec(),
    })
    .await
    .unwrap();
    let msg = get(&http(&s, fast())).await.unwrap_err().to_string();
    assert!(msg.contains("the body ended after 5 of 100 bytes"), "{msg}");
    assert_eq!(s.requests(), 3);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let s = HostileServer::busy_then(2, || "1".into(), Reply::json(200, &json!({})))
        .await
        .unwrap();
    let t = Instant::now();
    let reply = get(&http(&s, fast())).await.unwrap();
    assert_eq!(reply.status.as_u16(), 200);
    assert_eq!(s.requests(), 3);
    // Two waits of at least the second asked for, not 20 ms and 40 ms.
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
}

/// `Retry-After` as an HTTP date three seconds ahead: the client waits
/// until then (at least a second, at the date's whole-second resolution),
/// not its own 20 ms.
#[tokio::test]
async fn retry_after_as_a_date_is_honoured() {
    let s = HostileServer::busy_then(
        1,
        || httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3)),
        Reply::json(200, &json!({})),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let reply = get(&http(&s, fast())).await.unwrap();
    assert_eq!(reply.status.as_u16(), 200);
    assert_eq!(s.requests(), 2);
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
}

#[tokio::test]
async fn an_empty_new_application_id_is_refused() {
    let s = HostileServer::start(|_: &Request| {
        Reply::json(
            200,
            &json!({"application-id": "", "maximum-resource-capability": {"memory": 8192, "vCores": 4}}),
        )
    })
    .await
    .unwrap();
    let rm = RmClient::new(&[s.url()], Some("alice".into()), fast()).unwrap();
    let msg = rm.new_application().await.unwrap_err().to_string();
    assert!(msg.contains("application-id \"\""), "{msg}");
    assert!(msg.contains("/ws/v1/cluster/apps/new-application"), "{msg}");
}

#[tokio::test]
async fn an_unknown_or_missing_application_state_is_an_error() {
    for app in [
        json!({"id": "application_1_0001", "state": "DANCING", "finalStatus": "UNDEFINED"}),
        json!({"id": "application_1_0001", "finalStatus": "UNDEFINED"}),
        json!({"id": "application_1_0001", "state": "FINISHED"}),
    ] {
        let body = json!({ "app": app });
        let s = HostileServer::start(move |_: &Request| Reply::json(200, &body))
            .await
            .unwrap();
        let rm = RmClient::new(&[s.url()], Some("alice".into()), fast()).unwrap();
        let msg = rm.app("application_1_0001").await.unwrap_err().to_string();
        assert!(
            msg.contains("/ws/v1/cluster/apps/application_1_0001"),
            "{msg}"
        );
        assert!(
            msg.contains("is not a YARN application state")
                || msg.contains("is not a YARN final status"),
            "{msg}"
        );
    }
}

/// `cruise status --wait` against an RM whose report has no state: an error
/// naming the endpoint, exit 1, at once (not a poll forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_wait_fails_on_a_report_without_a_state() {
    let s = HostileServer::start(|_: &Request| {
        Reply::json(200, &json!({"app": {"id": "application_1_0001"}}))
    })
    .await
    .unwrap();
    let conf = tempfile::tempdir().unwrap();
    std::fs::write(
        conf.path().join("yarn-site.xml"),
        format!(
            "<?xml version=\"1.0\"?>\n<configuration><property><name>yarn.resourcemanager.webapp.address</name><value>{}</value></property></configuration>\n",
            s.addr
        ),
    )
    .unwrap();
    let mut c = std::process::Command::new(binary("cruise").expect("cruise is built"));
    c.env("HADOOP_CONF_DIR", conf.path())
        .env_remove("RUST_LOG")
        .args(["status", "application_1_0001", "--wait"]);
    let mut p = Measured::spawn(c).unwrap();
    let out = p.wait(Duration::from_secs(60)).await.unwrap();
    let stderr = p.stderr();
    assert_eq!(out.code, Some(1), "{out:?}\n{stderr}");
    assert!(stderr.contains("app.state \"\""), "{stderr}");
    assert!(
        stderr.contains("/ws/v1/cluster/apps/application_1_0001"),
        "{stderr}"
    );
    assert!(s.requests() <= 3, "{} requests", s.requests());
}

// ---- Mesos ---------------------------------------------------------------

fn record(v: &Value) -> Vec<u8> {
    let j = v.to_string();
    format!("{}\n{j}", j.len()).into_bytes()
}

fn subscribed() -> Vec<u8> {
    record(&json!({"type": "SUBSCRIBED", "subscribed": {
        "framework_id": {"value": "fw-1"}, "heartbeat_interval_seconds": 15.0}}))
}

/// The type of a scheduler call.
fn call_type(r: &Request) -> String {
    serde_json::from_slice::<Value>(&r.body)
        .ok()
        .and_then(|v| v["type"].as_str().map(String::from))
        .unwrap_or_default()
}

fn mesos_config(master: &HostileServer) -> MesosConfig {
    MesosConfig {
        masters: vec![master.url()],
        http: fast(),
        user: "alice".into(),
        framework_name: "cruise-test".into(),
        role: "*".into(),
        failover_timeout_secs: 60.0,
        refuse_seconds: 1.0,
        missed_heartbeats: 3,
        task_prefix: "job_test".into(),
        evaluator_uri: None,
        kill_grace: Duration::from_secs(1),
        default_size: (1024, 1),
    }
}

fn launch() -> LaunchSpec {
    LaunchSpec {
        program: "/bin/true".into(),
        args: vec![],
        env: Default::default(),
        work_dir: std::env::temp_dir(),
    }
}

/// A master whose every subscription carries `body` (with a stream id)
/// and then ends; other calls are accepted. Returns it and the number of
/// SUBSCRIBE calls.
async fn flapping_master(body: Vec<u8>) -> (HostileServer, Arc<AtomicU64>) {
    let subscribes = Arc::new(AtomicU64::new(0));
    let n = Arc::clone(&subscribes);
    let master = HostileServer::start(move |r: &Request| {
        if call_type(r) == "SUBSCRIBE" {
            n.fetch_add(1, Ordering::SeqCst);
            Reply::Full {
                status: 200,
                headers: vec![("Mesos-Stream-Id".into(), "s-1".into())],
                body: body.clone(),
            }
        } else {
            Reply::empty(202)
        }
    })
    .await
    .unwrap();
    (master, subscribes)
}

async fn allocation_failed(rx: &mut mpsc::UnboundedReceiver<RmEvent>) -> String {
    let deadline = Duration::from_secs(60);
    tokio::time::timeout(deadline, async {
        loop {
            match rx.recv().await {
                Some(RmEvent::AllocationFailed { reason }) => return reason,
                Some(_) => continue,
                None => panic!("event channel closed"),
            }
        }
    })
    .await
    .expect("AllocationFailed within 60 s")
}

#[tokio::test]
async fn a_master_closing_each_subscription_gets_few_spaced_subscribes() {
    // SUBSCRIBED, one heartbeat, then the stream ends: each time.
    let mut body = subscribed();
    body.extend(record(&json!({"type": "HEARTBEAT"})));
    let (master, subscribes) = flapping_master(body).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let t = Instant::now();
    let rm = MesosRm::start(mesos_config(&master), launch(), tx).unwrap();
    let reason = allocation_failed(&mut rx).await;
    let secs = t.elapsed().as_secs_f64();
    assert!(
        reason.contains("gave up after 3 re-subscriptions"),
        "{reason}"
    );
    // The first subscription and 3 more, each after a backoff of at least
    // half of 20, 40 and 80 ms.
    assert_eq!(subscribes.load(Ordering::SeqCst), 4);
    assert!(secs >= 0.07, "{secs} s");
    let _ = rm.shutdown().await;
}

#[tokio::test]
async fn garbage_record_lengths_get_few_spaced_subscribes() {
    let mut body = subscribed();
    body.extend_from_slice(b"99999999999999999999999999\n{}");
    let (master, subscribes) = flapping_master(body).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let rm = MesosRm::start(mesos_config(&master), launch(), tx).unwrap();
    let reason = allocation_failed(&mut rx).await;
    assert!(
        reason.contains("gave up after 3 re-subscriptions"),
        "{reason}"
    );
    assert_eq!(subscribes.load(Ordering::SeqCst), 4);
    let _ = rm.shutdown().await;
}

#[tokio::test]
async fn an_absurd_offer_is_declined_and_does_not_count() {
    let offer = |id: &str, agent: &str, cpus: f64| {
        json!({"id": {"value": id}, "agent_id": {"value": agent}, "hostname": agent,
               "framework_id": {"value": "fw-1"},
               "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
                             {"name": "mem", "type": "SCALAR", "scalar": {"value": 8192.0}}]})
    };
    let mut body = subscribed();
    body.extend(record(&json!({"type": "OFFERS", "offers": {"offers": [
        offer("o-absurd", "a1", 1e12),
        offer("o-fine", "a2", 4.0),
    ]}})));
    let declined: Arc<Mutex<Vec<String>>> = Arc::default();
    let d = Arc::clone(&declined);
    // The stream stays open after the offers (no re-subscription).
    let master = HostileServer::start(move |r: &Request| match call_type(r).as_str() {
        "SUBSCRIBE" => Reply::Open {
            status: 200,
            headers: vec![("Mesos-Stream-Id".into(), "s-1".into())],
            body: body.clone(),
        },
        _ => {
            d.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&r.body).into_owned());
            Reply::empty(202)
        }
    })
    .await
    .unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let rm = MesosRm::start(mesos_config(&master), launch(), tx).unwrap();
    wait_until(Duration::from_secs(30), || {
        declined
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.contains("DECLINE") && c.contains("o-absurd"))
            .then_some(())
    })
    .await
    .expect("the absurd offer is declined");
    let cap = rm.capacity().await.unwrap();
    assert_eq!(cap.max_containers, 4, "{cap:?}");
    let _ = rm.shutdown().await;
}

/// `cruise run --runtime mesos` against a master that closes every
/// subscription after one heartbeat: a handful of spaced SUBSCRIBE calls
/// with the default settings, then a failure naming the cause, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cruise_run_gives_up_on_a_flapping_master() {
    let mut body = subscribed();
    body.extend(record(&json!({"type": "HEARTBEAT"})));
    let (master, subscribes) = flapping_master(body).await;
    let work = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG")
        .env_remove("HADOOP_CONF_DIR")
        .args(["run", "-n", "2", "-e", "1", "--runtime", "mesos"])
        .args(["--master", &master.addr.to_string()])
        .arg("--work-dir")
        .arg(work.path());
    let mut job = Measured::spawn(c).unwrap();
    let out = job.wait(Duration::from_secs(120)).await.unwrap();
    let stderr = job.stderr();
    let n = subscribes.load(Ordering::SeqCst);
    eprintln!(
        "flapping master: {n} SUBSCRIBE calls in {:.1} s",
        out.elapsed.as_secs_f64()
    );
    assert_eq!(out.code, Some(1), "{out:?}\n{stderr}");
    assert!(
        stderr.contains("gave up after 5 re-subscriptions"),
        "{stderr}"
    );
    // runtime.rm_retries = 5: the first subscription, 5 more, and the one
    // the shutdown makes to tear the framework down.
    assert_eq!(n, 7, "{stderr}");
    // Backoffs of at least half of 0.2, 0.4, 0.8, 1.6 and 3.2 s.
    assert!(out.elapsed >= Duration::from_millis(3100), "{out:?}");
}

#[tokio::test]
async fn an_unknown_container_state_is_an_error() {
    let s = HostileServer::start(|_: &Request| {
        Reply::json(
            200,
            &json!({"name": "svc", "id": "application_1_0001", "state": "STABLE",
                "components": [{"name": "evaluator", "number_of_containers": 1,
                    "containers": [{"id": "container_1_0001_01_000002", "state": "EXPLODED"}]}]}),
        )
    })
    .await
    .unwrap();
    let services = ServicesClient::new(&[s.url()], Some("alice".into()), fast()).unwrap();
    let msg = services.get("svc").await.unwrap_err().to_string();
    assert!(msg.contains("/app/v1/services/svc"), "{msg}");
    assert!(msg.contains("state \"EXPLODED\""), "{msg}");
}
