//! `cruise-sim mesos`, v1 scheduler HTTP API, driven by a small RecordIO
//! client written here: subscribe → offers → launch real processes → updates
//! → acknowledge → kill → teardown, plus retries, filters, reconciliation,
//! failover, capacity changes, leader redirection and protocol errors.

mod yarn_mesos_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use yarn_mesos_support::{SimProc, pid_alive, wait_dead, wait_for};

const T: Duration = Duration::from_secs(20);
const FAST: [&str; 8] = [
    "--allocation-interval-ms",
    "50",
    "--heartbeat-interval-secs",
    "0.3",
    "--update-retry-secs",
    "0.3",
    "--kill-grace-ms",
    "300",
];

struct Master {
    sim: SimProc,
    http: reqwest::Client,
}

struct Sub {
    fid: String,
    stream_id: String,
    rx: mpsc::UnboundedReceiver<Value>,
    heartbeats: Arc<AtomicUsize>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Sub {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Parse RecordIO frames from `buf`, leaving an incomplete tail in place.
fn parse_records(buf: &mut Vec<u8>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
        let len: usize = std::str::from_utf8(&buf[..nl]).unwrap().parse().unwrap();
        if buf.len() < nl + 1 + len {
            break;
        }
        let rec: Vec<u8> = buf.drain(..nl + 1 + len).skip(nl + 1).collect();
        out.push(serde_json::from_slice(&rec).unwrap());
    }
    out
}

impl Master {
    fn start(extra: &[&str]) -> Master {
        let mut args: Vec<&str> = FAST.to_vec();
        args.extend_from_slice(extra);
        Master {
            sim: SimProc::start("mesos", &args),
            http: reqwest::Client::new(),
        }
    }
    fn api(&self) -> String {
        format!("{}/api/v1/scheduler", self.sim.url)
    }
    async fn state(&self) -> Value {
        self.http
            .get(format!("{}/sim/state", self.sim.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
    async fn subscribe_raw(&self, body: &Value) -> reqwest::Response {
        self.http
            .post(self.api())
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .json(body)
            .send()
            .await
            .unwrap()
    }
    async fn subscribe(&self, info: Value) -> Sub {
        let fid = info["id"]["value"].as_str().map(String::from);
        let mut body = json!({"type": "SUBSCRIBE", "subscribe": {"framework_info": info}});
        if let Some(f) = &fid {
            body["framework_id"] = json!({"value": f});
        }
        let resp = self.subscribe_raw(&body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert_eq!(resp.headers()["transfer-encoding"], "chunked");
        let stream_id = resp.headers()["mesos-stream-id"]
            .to_str()
            .unwrap()
            .to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let heartbeats = Arc::new(AtomicUsize::new(0));
        let hb = Arc::clone(&heartbeats);
        let reader = tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                buf.extend_from_slice(&chunk);
                for ev in parse_records(&mut buf) {
                    if ev["type"] == "HEARTBEAT" {
                        hb.fetch_add(1, Ordering::SeqCst);
                    } else if tx.send(ev).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(json!({"type": "__END__"}));
        });
        let mut sub = Sub {
            fid: String::new(),
            stream_id,
            rx,
            heartbeats,
            reader,
        };
        let ev = sub.next_any().await;
        assert_eq!(ev["type"], "SUBSCRIBED", "{ev}");
        assert!(
            ev["subscribed"]["heartbeat_interval_seconds"]
                .as_f64()
                .unwrap()
                > 0.0
        );
        assert_eq!(ev["subscribed"]["master_info"]["version"], "1.11.0");
        sub.fid = ev["subscribed"]["framework_id"]["value"]
            .as_str()
            .unwrap()
            .to_string();
        if let Some(f) = fid {
            assert_eq!(sub.fid, f);
        }
        sub
    }
    async fn call(&self, sub: &Sub, ty: &str, payload: Value) -> StatusCode {
        let mut body = json!({"type": ty, "framework_id": {"value": sub.fid}});
        if !payload.is_null() {
            body[ty.to_ascii_lowercase()] = payload;
        }
        self.http
            .post(self.api())
            .header("content-type", "application/json")
            .header("mesos-stream-id", &sub.stream_id)
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
    }
    async fn ack(&self, sub: &Sub, status: &Value) {
        let st = self
            .call(
                sub,
                "ACKNOWLEDGE",
                json!({"agent_id": status["agent_id"], "task_id": status["task_id"], "uuid": status["uuid"]}),
            )
            .await;
        assert_eq!(st, 202);
    }
    /// Take the next offer, launch one shell task on it.
    async fn launch(&self, sub: &mut Sub, task_id: &str, cmd: &str) -> Value {
        let offers = sub.next("OFFERS").await;
        let offer = offers["offers"][0].clone();
        let st = self
            .call(
                sub,
                "ACCEPT",
                json!({"offer_ids": [offer["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [
                    task(task_id, &offer, cmd)]}}], "filters": {"refuse_seconds": 0.05}}),
            )
            .await;
        assert_eq!(st, 202);
        offer
    }
}

fn task(task_id: &str, offer: &Value, cmd: &str) -> Value {
    json!({
        "name": format!("test {task_id}"),
        "task_id": {"value": task_id},
        "agent_id": offer["agent_id"],
        "command": {"value": cmd, "environment": {"variables": [{"name": "WHO", "value": task_id}]}},
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 64}},
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 31000, "end": 31000}]}},
        ],
    })
}

fn framework(name: &str) -> Value {
    json!({"user": "tester", "name": name, "failover_timeout": 0})
}

impl Sub {
    async fn next_any(&mut self) -> Value {
        tokio::time::timeout(T, self.rx.recv())
            .await
            .expect("no event within 20 s")
            .expect("reader gone")
    }
    /// Next event of type `ty`, skipping others (offers keep coming).
    async fn next(&mut self, ty: &str) -> Value {
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = tokio::time::timeout(left, self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no {ty} event within 20 s"))
                .expect("reader gone");
            if ev["type"] == ty {
                return ev[ty.to_ascii_lowercase()].clone();
            }
            assert_ne!(ev["type"], "__END__", "stream ended while waiting for {ty}");
        }
    }
    /// Next UPDATE for `task_id`.
    async fn update(&mut self, task_id: &str) -> Value {
        loop {
            let u = self.next("UPDATE").await;
            if u["status"]["task_id"]["value"] == task_id {
                return u["status"].clone();
            }
        }
    }
}

#[tokio::test]
async fn subscribe_offer_launch_update_ack_kill_teardown() {
    let m = Master::start(&[
        "--nodes",
        "1",
        "--node-vcores",
        "2",
        "--node-memory-mb",
        "1024",
    ]);
    let r = m
        .http
        .get(format!("{}/version", m.sim.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["version"], "1.11.0");
    let mut sub = m.subscribe(framework("flow")).await;

    let offers = sub.next("OFFERS").await;
    let offer = &offers["offers"][0];
    assert_eq!(offer["framework_id"]["value"], sub.fid);
    let res = offer["resources"].as_array().unwrap();
    let get = |n: &str| res.iter().find(|r| r["name"] == n).unwrap().clone();
    assert_eq!(get("cpus")["scalar"]["value"], 2.0);
    assert_eq!(get("mem")["scalar"]["value"], 1024.0);
    assert_eq!(get("cpus")["role"], "*");
    assert_eq!(
        get("ports")["ranges"]["range"][0],
        json!({"begin": 31000, "end": 32000})
    );
    assert!(
        offer.get("allocation_info").is_none(),
        "no MULTI_ROLE: allocation_info stripped"
    );

    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [offer["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [
                task("sleeper", offer, "echo started-$WHO; exec sleep 600")]}}]}),
        )
        .await;
    assert_eq!(st, 202);
    let starting = sub.update("sleeper").await;
    assert_eq!(starting["state"], "TASK_STARTING");
    assert_eq!(starting["source"], "SOURCE_EXECUTOR");
    assert_eq!(starting["uuid"].as_str().unwrap().len(), 24);
    m.ack(&sub, &starting).await;
    let running = sub.update("sleeper").await;
    assert_eq!(running["state"], "TASK_RUNNING");
    let pid = running["container_status"]["executor_pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(pid_alive(pid));
    m.ack(&sub, &running).await;
    let state = m.state().await;
    let sandbox = state["tasks"][0]["sandbox"].as_str().unwrap().to_string();
    let out = wait_for("stdout", T, || async {
        Some(std::fs::read_to_string(format!("{sandbox}/stdout")).unwrap_or_default())
            .filter(|s| !s.is_empty())
    })
    .await;
    assert_eq!(out.trim(), "started-sleeper");

    // The next offer lacks what the task holds.
    let offers = sub.next("OFFERS").await;
    let o = &offers["offers"][0];
    let cpus = o["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "cpus")
        .unwrap()["scalar"]["value"]
        .as_f64()
        .unwrap();
    assert!((cpus - 1.5).abs() < 1e-6, "{o}");
    let ports = &o["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "ports")
        .unwrap()["ranges"]["range"];
    assert_eq!(ports, &json!([{"begin": 31001, "end": 32000}]));

    // A failing command on that offer.
    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [o["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [{
                "name": "f", "task_id": {"value": "failer"}, "agent_id": o["agent_id"],
                "command": {"value": "exit 4"},
                "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}}]}]}}]}),
        )
        .await;
    assert_eq!(st, 202);
    let mut last = Value::Null;
    for _ in 0..3 {
        last = sub.update("failer").await;
        m.ack(&sub, &last).await;
    }
    assert_eq!(last["state"], "TASK_FAILED");
    assert_eq!(last["message"], "Command exited with status 4");

    // KILL: TASK_KILLED with the signal, and the process is gone.
    assert_eq!(
        m.call(&sub, "KILL", json!({"task_id": {"value": "sleeper"}}))
            .await,
        202
    );
    let killed = sub.update("sleeper").await;
    assert_eq!(killed["state"], "TASK_KILLED");
    assert_eq!(
        killed["message"],
        "Command terminated with signal Terminated"
    );
    wait_dead(pid).await;
    m.ack(&sub, &killed).await;
    wait_for("acked tasks forgotten", T, || async {
        m.state().await["tasks"]
            .as_array()
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;

    assert!(
        sub.heartbeats.load(Ordering::SeqCst) >= 1,
        "heartbeats arrive"
    );
    // TEARDOWN ends the stream and removes the framework.
    assert_eq!(m.call(&sub, "TEARDOWN", Value::Null).await, 202);
    sub.next("__END__").await;
    let state = m.state().await;
    assert!(state["frameworks"].as_array().unwrap().is_empty());
    assert_eq!(state["removed_frameworks"], json!([sub.fid]));
    assert_eq!(
        m.call(&sub, "REVIVE", Value::Null).await,
        400,
        "framework cannot be found"
    );
}

#[tokio::test]
async fn unacknowledged_updates_are_resent_in_order() {
    let m = Master::start(&["--nodes", "1"]);
    let mut sub = m.subscribe(framework("retry")).await;
    m.launch(&mut sub, "t", "exit 0").await;
    let first = sub.update("t").await;
    assert_eq!(first["state"], "TASK_STARTING");
    // Not acknowledged: the same update (same uuid) comes again, and
    // RUNNING waits behind it.
    let t0 = Instant::now();
    let again = sub.update("t").await;
    assert_eq!(again["uuid"], first["uuid"]);
    assert_eq!(again["state"], "TASK_STARTING");
    // Backoff: the second retry comes after twice the first interval.
    let third = sub.update("t").await;
    assert_eq!(third["uuid"], first["uuid"]);
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "retries after {:?}",
        t0.elapsed()
    );
    m.ack(&sub, &first).await;
    let running = sub.update("t").await;
    assert_eq!(running["state"], "TASK_RUNNING");
    m.ack(&sub, &running).await;
    let fin = sub.update("t").await;
    assert_eq!(fin["state"], "TASK_FINISHED");
    assert_eq!(fin["message"], "Command exited with status 0");
    // A bad uuid is a protocol error.
    let st = m
        .call(
            &sub,
            "ACKNOWLEDGE",
            json!({"agent_id": fin["agent_id"], "task_id": fin["task_id"], "uuid": "!!"}),
        )
        .await;
    assert_eq!(st, 400);
}

#[tokio::test]
async fn decline_filters_revive_and_suppress() {
    let m = Master::start(&["--nodes", "1"]);
    let mut sub = m.subscribe(framework("filters")).await;
    let offers = sub.next("OFFERS").await;
    let t0 = Instant::now();
    let st = m
        .call(
            &sub,
            "DECLINE",
            json!({"offer_ids": [offers["offers"][0]["id"]], "filters": {"refuse_seconds": 1.0}}),
        )
        .await;
    assert_eq!(st, 202);

    // Decline for long, then REVIVE clears the filter at once.
    let offers = sub.next("OFFERS").await;
    assert!(
        t0.elapsed() >= Duration::from_millis(950),
        "re-offered after {:?}",
        t0.elapsed()
    );
    let st = m
        .call(
            &sub,
            "DECLINE",
            json!({"offer_ids": [offers["offers"][0]["id"]], "filters": {"refuse_seconds": 3600}}),
        )
        .await;
    assert_eq!(st, 202);
    let t1 = Instant::now();
    assert_eq!(m.call(&sub, "REVIVE", json!({"roles": []})).await, 202);
    let offers = sub.next("OFFERS").await;
    assert!(t1.elapsed() < Duration::from_secs(5));

    // SUPPRESS: no offers (checked over 20 allocation rounds), then REVIVE.
    assert_eq!(m.call(&sub, "SUPPRESS", json!({"roles": ["*"]})).await, 202);
    assert_eq!(
        m.call(
            &sub,
            "DECLINE",
            json!({"offer_ids": [offers["offers"][0]["id"]], "filters": {"refuse_seconds": 0}})
        )
        .await,
        202
    );
    let quiet = tokio::time::timeout(Duration::from_millis(1000), sub.next("OFFERS")).await;
    assert!(quiet.is_err(), "offers while suppressed");
    assert_eq!(m.call(&sub, "REVIVE", Value::Null).await, 202);
    sub.next("OFFERS").await;
}

#[tokio::test]
async fn reconcile_explicit_and_implicit() {
    let m = Master::start(&["--nodes", "1"]);
    let mut sub = m.subscribe(framework("reconcile")).await;
    m.launch(&mut sub, "r1", "exec sleep 600").await;
    for _ in 0..2 {
        let u = sub.update("r1").await;
        m.ack(&sub, &u).await;
    }
    let st = m
        .call(
            &sub,
            "RECONCILE",
            json!({"tasks": [{"task_id": {"value": "r1"}}, {"task_id": {"value": "ghost"}}]}),
        )
        .await;
    assert_eq!(st, 202);
    let r1 = sub.update("r1").await;
    assert_eq!(
        (r1["state"].as_str(), r1["reason"].as_str()),
        (Some("TASK_RUNNING"), Some("REASON_RECONCILIATION"))
    );
    assert!(
        r1.get("uuid").is_none(),
        "reconciliation answers carry no uuid"
    );
    let ghost = sub.update("ghost").await;
    assert_eq!(ghost["state"], "TASK_LOST");
    assert_eq!(m.call(&sub, "RECONCILE", json!({"tasks": []})).await, 202);
    let r1 = sub.update("r1").await;
    assert_eq!(r1["reason"], "REASON_RECONCILIATION");
}

#[tokio::test]
async fn protocol_errors() {
    let m = Master::start(&["--nodes", "1"]);
    let sub = m.subscribe(framework("errors")).await;
    let post = |body: Value, sid: Option<&str>, ct: Option<&str>| {
        let mut rb = m.http.post(m.api()).body(body.to_string());
        if let Some(c) = ct {
            rb = rb.header("content-type", c);
        }
        if let Some(s) = sid {
            rb = rb.header("mesos-stream-id", s.to_string());
        }
        rb.send()
    };
    let revive = json!({"type": "REVIVE", "framework_id": {"value": sub.fid}});
    let r = post(revive.clone(), None, Some("application/json"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("Mesos-Stream-Id"));
    let r = post(revive.clone(), Some("wrong"), Some("application/json"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("didn't match"));
    let r = post(revive.clone(), Some(&sub.stream_id), None)
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "missing Content-Type");
    let r = post(
        revive.clone(),
        Some(&sub.stream_id),
        Some("application/x-protobuf"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 415);
    let r = post(
        json!({"type": "REVIVE", "framework_id": {"value": "nope"}}),
        Some(&sub.stream_id),
        Some("application/json"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await.unwrap(), "Framework cannot be found");
    let r = post(
        json!({"type": "KILL", "framework_id": {"value": sub.fid}}),
        Some(&sub.stream_id),
        Some("application/json"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400, "KILL without payload");
    let r = post(
        json!({"type": "BOGUS"}),
        Some(&sub.stream_id),
        Some("application/json"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let r = m.http.get(m.api()).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let sub_body = json!({"type": "SUBSCRIBE", "subscribe": {"framework_info": framework("x")}});
    let r = post(sub_body.clone(), Some("abc"), Some("application/json"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "SUBSCRIBE with a stream id");
    let r = post(
        json!({"type": "SUBSCRIBE", "subscribe": {"framework_info": {"name": "x"}}}),
        None,
        Some("application/json"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400, "framework_info without user");
    let r = m
        .http
        .post(m.api())
        .header("content-type", "application/json")
        .header("accept", "application/x-protobuf")
        .body(sub_body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 406);
    // ACCEPT with an operation the simulator does not do.
    assert_eq!(
        m.call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [], "operations": [{"type": "RESERVE"}]})
        )
        .await,
        400
    );
}

#[tokio::test]
async fn invalid_tasks_offers_and_task_groups() {
    let m = Master::start(&["--nodes", "1"]);
    let mut sub = m.subscribe(framework("groups")).await;
    let offers = sub.next("OFFERS").await;
    let offer = offers["offers"][0].clone();
    // A task with neither command nor executor: TASK_ERROR from the master.
    let mut bad = task("bad", &offer, "true");
    bad.as_object_mut().unwrap().remove("command");
    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [offer["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [bad]}}],
                   "filters": {"refuse_seconds": 0}}),
        )
        .await;
    assert_eq!(st, 202);
    let u = sub.update("bad").await;
    assert_eq!(
        (u["state"].as_str(), u["reason"].as_str()),
        (Some("TASK_ERROR"), Some("REASON_TASK_INVALID"))
    );
    assert!(u.get("uuid").is_none());
    // The same offer again is no longer valid: TASK_LOST.
    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [offer["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [task("late", &offer, "true")]}}]}),
        )
        .await;
    assert_eq!(st, 202);
    let u = sub.update("late").await;
    assert_eq!(
        (u["state"].as_str(), u["reason"].as_str()),
        (Some("TASK_LOST"), Some("REASON_INVALID_OFFERS"))
    );

    // LAUNCH_GROUP: two processes; killing one kills both.
    let offers = sub.next("OFFERS").await;
    let offer = offers["offers"][0].clone();
    let mut a = task("ga", &offer, "exec sleep 600");
    let mut b = task("gb", &offer, "exec sleep 600");
    b["resources"].as_array_mut().unwrap().pop(); // ports only on ga
    a["resources"][0]["scalar"]["value"] = json!(0.2);
    b["resources"][0]["scalar"]["value"] = json!(0.2);
    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [offer["id"]], "operations": [{"type": "LAUNCH_GROUP", "launch_group": {
                "executor": {"type": "DEFAULT", "executor_id": {"value": "grp"}, "framework_id": {"value": sub.fid}},
                "task_group": {"tasks": [a, b]}}}]}),
        )
        .await;
    assert_eq!(st, 202);
    let mut pids = Vec::new();
    for _ in 0..4 {
        let u = sub.next("UPDATE").await["status"].clone();
        if u["state"] == "TASK_RUNNING" {
            assert_eq!(u["executor_id"]["value"], "grp");
            pids.push(u["container_status"]["executor_pid"].as_u64().unwrap() as u32);
        }
        m.ack(&sub, &u).await;
    }
    assert_eq!(pids.len(), 2);
    assert_eq!(
        m.call(&sub, "KILL", json!({"task_id": {"value": "ga"}}))
            .await,
        202
    );
    let mut killed = Vec::new();
    while killed.len() < 2 {
        let u = sub.next("UPDATE").await["status"].clone();
        assert_eq!(u["state"], "TASK_KILLED", "{u}");
        killed.push(u["task_id"]["value"].as_str().unwrap().to_string());
        m.ack(&sub, &u).await;
    }
    killed.sort();
    assert_eq!(killed, ["ga", "gb"]);
    for p in pids {
        wait_dead(p).await;
    }
}

#[tokio::test]
async fn failover_keeps_tasks_and_timeout_removes_the_framework() {
    let m = Master::start(&["--nodes", "1"]);
    let mut info = json!({"user": "tester", "name": "fo", "failover_timeout": 60});
    let mut sub = m.subscribe(info.clone()).await;
    m.launch(&mut sub, "keep", "exec sleep 600").await;
    let starting = sub.update("keep").await;
    m.ack(&sub, &starting).await;
    let running = sub.update("keep").await;
    let pid = running["container_status"]["executor_pid"]
        .as_u64()
        .unwrap() as u32;
    // Drop the stream without acknowledging RUNNING.
    let fid = sub.fid.clone();
    let old_stream = sub.stream_id.clone();
    drop(sub);
    wait_for("disconnect noticed", T, || async {
        let s = m.state().await;
        (s["frameworks"][0]["connected"] == false).then_some(())
    })
    .await;
    let r = m
        .http
        .post(m.api())
        .header("content-type", "application/json")
        .header("mesos-stream-id", &old_stream)
        .body(json!({"type": "REVIVE", "framework_id": {"value": fid}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "disconnected framework");
    assert!(pid_alive(pid), "tasks survive a disconnection");

    // Re-subscribe with the same id: same framework, the unacked update again.
    info["id"] = json!({"value": fid});
    let mut sub = m.subscribe(info.clone()).await;
    assert_ne!(sub.stream_id, old_stream);
    let again = sub.update("keep").await;
    assert_eq!(
        (again["state"].as_str(), again["uuid"].as_str()),
        (Some("TASK_RUNNING"), running["uuid"].as_str())
    );
    m.ack(&sub, &again).await;

    // A short failover timeout: the framework and its tasks go away.
    assert_eq!(
        m.call(&sub, "UPDATE_FRAMEWORK", json!({"framework_info": {"user": "tester", "name": "fo", "id": {"value": fid}, "failover_timeout": 0.2}}))
            .await,
        200
    );
    drop(sub);
    wait_dead(pid).await;
    wait_for("framework removed", T, || async {
        let s = m.state().await;
        s["frameworks"].as_array().unwrap().is_empty().then_some(())
    })
    .await;
    // Subscribing as the removed framework gets an ERROR event.
    let resp = m
        .subscribe_raw(&json!({"type": "SUBSCRIBE", "framework_id": {"value": fid},
            "subscribe": {"framework_info": info}}))
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.unwrap().to_vec();
    let mut buf = body;
    let evs = parse_records(&mut buf);
    assert_eq!(evs[0]["type"], "ERROR");
    assert_eq!(evs[0]["error"]["message"], "Framework has been removed");
}

#[tokio::test]
async fn removing_an_agent_rescinds_offers_loses_tasks_and_reports_failure() {
    let m = Master::start(&["--nodes", "2"]);
    let mut sub = m.subscribe(framework("cap")).await;
    // Collect one offer per agent.
    let mut by_agent = std::collections::BTreeMap::new();
    while by_agent.len() < 2 {
        let offers = sub.next("OFFERS").await;
        for o in offers["offers"].as_array().unwrap() {
            by_agent.insert(
                o["agent_id"]["value"].as_str().unwrap().to_string(),
                o.clone(),
            );
        }
    }
    let agents: Vec<String> = by_agent.keys().cloned().collect();
    let a1 = agents.iter().find(|a| a.ends_with("-S1")).unwrap();
    let a0 = agents.iter().find(|a| a.ends_with("-S0")).unwrap();
    let st = m
        .call(
            &sub,
            "DECLINE",
            json!({"offer_ids": [by_agent[a0]["id"]], "filters": {"refuse_seconds": 0}}),
        )
        .await;
    assert_eq!(st, 202);
    // Launch on S1 with one offer; keep another S1 offer outstanding later.
    let o1 = by_agent[a1].clone();
    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [o1["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [
                task("on-s1", &o1, "exec sleep 600")]}}], "filters": {"refuse_seconds": 0}}),
        )
        .await;
    assert_eq!(st, 202);
    let mut pid = 0;
    for _ in 0..2 {
        let u = sub.update("on-s1").await;
        if u["state"] == "TASK_RUNNING" {
            pid = u["container_status"]["executor_pid"].as_u64().unwrap() as u32;
        }
        m.ack(&sub, &u).await;
    }
    assert!(pid_alive(pid));
    let outstanding = wait_for("an outstanding offer on S1", T, || async {
        let s = m.state().await;
        s["offers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["agent_id"] == a1.as_str())
            .map(|o| o["id"].clone())
    })
    .await;
    let r = m
        .http
        .put(format!("{}/sim/capacity", m.sim.url))
        .json(&json!({"agents": 1}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["killed_tasks"], json!(["on-s1"]));
    let resc = sub.next("RESCIND").await;
    assert_eq!(resc["offer_id"]["value"], outstanding);
    let lost = sub.update("on-s1").await;
    assert_eq!(
        (lost["state"].as_str(), lost["reason"].as_str()),
        (Some("TASK_LOST"), Some("REASON_AGENT_REMOVED"))
    );
    let failure = sub.next("FAILURE").await;
    assert_eq!(failure["agent_id"]["value"], a1.as_str());
    assert!(failure.get("executor_id").is_none());
    wait_dead(pid).await;
    // Only S0 is offered from now on.
    for _ in 0..3 {
        let outstanding: Vec<Value> = m.state().await["offers"].as_array().unwrap().clone();
        for o in &outstanding {
            assert_ne!(o["agent_id"], a1.as_str());
            let st = m
                .call(
                    &sub,
                    "DECLINE",
                    json!({"offer_ids": [{"value": o["id"]}], "filters": {"refuse_seconds": 0}}),
                )
                .await;
            assert_eq!(st, 202);
        }
        let offers = sub.next("OFFERS").await;
        for o in offers["offers"].as_array().unwrap() {
            assert_ne!(o["agent_id"]["value"], a1.as_str());
        }
    }
}

#[tokio::test]
async fn non_leading_master_redirects_to_the_leader() {
    let leader = Master::start(&["--nodes", "1"]);
    let leader_addr = leader.sim.ready["master"].as_str().unwrap().to_string();
    let follower = SimProc::start_plain("mesos", &["--leader-redirect", &leader_addr]);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http
        .post(format!("{}/api/v1/scheduler", follower.url))
        .header("content-type", "application/json")
        .body(
            json!({"type": "SUBSCRIBE", "subscribe": {"framework_info": framework("r")}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 307);
    assert_eq!(
        r.headers()["location"],
        format!("//{leader_addr}/api/v1/scheduler").as_str()
    );
    let r = http
        .get(format!("{}/redirect", follower.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["location"].to_str().unwrap()
        ),
        (307, format!("//{leader_addr}").as_str())
    );
    // Following the Location reaches a working leader.
    let sub = leader.subscribe(framework("r")).await;
    assert!(!sub.fid.is_empty());
}

#[tokio::test]
async fn sigterm_kills_every_task() {
    let mut m = Master::start(&["--nodes", "1"]);
    let mut sub = m.subscribe(framework("term")).await;
    m.launch(&mut sub, "bg", "sleep 600 & sleep 600 & wait")
        .await;
    let mut pid = 0;
    for _ in 0..2 {
        let u = sub.update("bg").await;
        if u["state"] == "TASK_RUNNING" {
            pid = u["container_status"]["executor_pid"].as_u64().unwrap() as i32;
        }
        m.ack(&sub, &u).await;
    }
    let members = wait_for("sleeps in the task's process group", T, || async {
        let out = std::process::Command::new("pgrep")
            .arg("-g")
            .arg(pid.to_string())
            .output()
            .unwrap();
        let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() >= 3).then_some(pids)
    })
    .await;
    let st = m.sim.terminate();
    assert!(st.success(), "{st}");
    // Killed as the simulator exits; each is gone within wait_dead's bound
    // (a `sleep 600` the simulator left alive would outlive it by minutes).
    for p in members {
        wait_dead(p).await;
    }
}

#[tokio::test]
async fn multi_role_offers_and_task_killing_state() {
    let m = Master::start(&["--nodes", "1"]);
    let mut sub = m
        .subscribe(json!({"user": "tester", "name": "mr", "roles": ["ml"],
            "capabilities": [{"type": "MULTI_ROLE"}, {"type": "TASK_KILLING_STATE"}]}))
        .await;
    let offers = sub.next("OFFERS").await;
    let o = offers["offers"][0].clone();
    assert_eq!(o["allocation_info"], json!({"role": "ml"}));
    assert!(
        o["resources"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["allocation_info"] == json!({"role": "ml"}))
    );
    let st = m
        .call(
            &sub,
            "ACCEPT",
            json!({"offer_ids": [o["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [
                task("k", &o, "trap 'echo bye; exit 0' TERM; touch trapped; sleep 600 & wait")]}}]}),
        )
        .await;
    assert_eq!(st, 202);
    for _ in 0..2 {
        let u = sub.update("k").await;
        m.ack(&sub, &u).await;
    }
    // KILL only once the shell has installed its TERM trap.
    let sandbox = m.state().await["tasks"][0]["sandbox"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("trap installed", T, || async {
        std::path::Path::new(&sandbox)
            .join("trapped")
            .exists()
            .then_some(())
    })
    .await;
    assert_eq!(
        m.call(&sub, "KILL", json!({"task_id": {"value": "k"}}))
            .await,
        202
    );
    let killing = sub.update("k").await;
    assert_eq!(killing["state"], "TASK_KILLING");
    m.ack(&sub, &killing).await;
    let killed = sub.update("k").await;
    assert_eq!(
        killed["state"], "TASK_KILLED",
        "a killed task is KILLED even if it exits 0 on SIGTERM"
    );
    assert_eq!(killed["message"], "Command exited with status 0");
    m.ack(&sub, &killed).await;
}
