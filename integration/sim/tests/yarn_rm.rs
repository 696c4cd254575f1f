//! `cruise-sim yarn`, ResourceManager REST API: submissions whose AM commands
//! really run, attempts and retries, kill, localization over a WebHDFS server
//! served by the test, errors, capacity changes, and shutdown.

mod yarn_mesos_support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use yarn_mesos_support::{SimProc, pid_alive, read, wait_dead, wait_for};

const T: Duration = Duration::from_secs(20);

struct Rm {
    sim: SimProc,
    http: reqwest::Client,
}

impl Rm {
    fn start(args: &[&str]) -> Rm {
        Rm {
            sim: SimProc::start("yarn", args),
            http: reqwest::Client::new(),
        }
    }
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sim.url)
    }
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }
    async fn new_app(&self) -> String {
        let r = self
            .http
            .post(self.url("/ws/v1/cluster/apps/new-application?user.name=alice"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        v["application-id"].as_str().unwrap().to_string()
    }
    async fn submit(&self, ctx: Value) -> reqwest::Response {
        self.http
            .post(self.url("/ws/v1/cluster/apps?user.name=alice"))
            .json(&ctx)
            .send()
            .await
            .unwrap()
    }
    async fn submit_cmd(&self, cmd: &str, attempts: u32, extra: Value) -> String {
        let id = self.new_app().await;
        let mut ctx = json!({
            "application-id": id,
            "application-name": "test",
            "max-app-attempts": attempts,
            "resource": {"memory": 256, "vCores": 1},
            "am-container-spec": {
                "environment": {"entry": [{"key": "GREETING", "value": "hi-{{USER}}"}]},
                "commands": {"command": cmd},
            },
        });
        if let (Value::Object(m), Value::Object(x)) = (&mut ctx, extra) {
            for (k, v) in x {
                if k == "local-resources" {
                    m.get_mut("am-container-spec").unwrap()["local-resources"] = v;
                } else {
                    m.insert(k, v);
                }
            }
        }
        let r = self.submit(ctx).await;
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
        id
    }
    async fn app(&self, id: &str) -> Value {
        let (s, v) = self.get(&format!("/ws/v1/cluster/apps/{id}")).await;
        assert_eq!(s, 200, "{v}");
        v["app"].clone()
    }
    async fn wait_state(&self, id: &str, states: &[&str]) -> Value {
        wait_for(&format!("{id} in {states:?}"), T, || async {
            let a = self.app(id).await;
            states.contains(&a["state"].as_str().unwrap()).then_some(a)
        })
        .await
    }
    async fn containers(&self) -> Vec<Value> {
        self.get("/sim/containers").await.1["containers"]
            .as_array()
            .unwrap()
            .clone()
    }
    async fn container(&self, id: &str) -> Value {
        self.containers()
            .await
            .into_iter()
            .find(|c| c["id"] == id)
            .unwrap()
    }
}

#[tokio::test]
async fn am_runs_to_finished_or_fails_after_max_attempts() {
    let rm = Rm::start(&["--nodes", "2", "--node-memory-mb", "4096"]);
    let (s, v) = rm.get("/ws/v1/cluster/apps").await;
    assert_eq!((s, v), (StatusCode::OK, json!({"apps": null})));

    let ok = rm
        .submit_cmd(
            "echo \"$GREETING $CONTAINER_ID $NM_HOST\" > <LOG_DIR>/out; test -n \"$LOCAL_DIRS\"",
            1,
            json!({}),
        )
        .await;
    let a = rm.wait_state(&ok, &["FINISHED", "FAILED"]).await;
    assert_eq!(
        (a["state"].as_str(), a["finalStatus"].as_str()),
        (Some("FINISHED"), Some("SUCCEEDED")),
        "{a}"
    );
    assert_eq!(a["allocatedMB"], -1);
    let atts = rm
        .get(&format!("/ws/v1/cluster/apps/{ok}/appattempts"))
        .await
        .1;
    let cid = atts["appAttempts"]["appAttempt"][0]["containerId"]
        .as_str()
        .unwrap()
        .to_string();
    let c = rm.container(&cid).await;
    assert_eq!(c["exit_status"], 0);
    let out = read(&std::path::Path::new(c["log_dir"].as_str().unwrap()).join("out"));
    assert_eq!(out.trim(), format!("hi-alice {cid} 127.0.0.1"));
    assert_eq!(
        c["memory_mb"], 1024,
        "256 MB is normalized up to the 1024 MB minimum allocation"
    );

    let bad = rm.submit_cmd("echo broken >&2; exit 3", 2, json!({})).await;
    let a = rm.wait_state(&bad, &["FAILED"]).await;
    let diag = a["diagnostics"].as_str().unwrap();
    assert!(
        diag.contains("failed 2 times") && diag.contains("exitCode: 3") && diag.contains("broken"),
        "{diag}"
    );
    let atts = rm
        .get(&format!("/ws/v1/cluster/apps/{bad}/appattempts"))
        .await
        .1;
    let atts = atts["appAttempts"]["appAttempt"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(atts.len(), 2);
    assert!(atts.iter().all(|t| t["appAttemptState"] == "FAILED"));
    assert_ne!(atts[0]["containerId"], atts[1]["containerId"]);

    let (_, m) = rm.get("/ws/v1/cluster/metrics").await;
    let m = &m["clusterMetrics"];
    assert_eq!(
        (m["appsSubmitted"].as_u64(), m["appsFailed"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (m["totalMB"].as_u64(), m["allocatedMB"].as_u64()),
        (Some(8192), Some(0))
    );
    let (_, f) = rm.get("/ws/v1/cluster/apps?states=FINISHED").await;
    assert_eq!(f["apps"]["app"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn kill_moves_app_to_killed_and_stops_the_process() {
    let rm = Rm::start(&["--kill-grace-ms", "500"]);
    let id = rm.submit_cmd("exec sleep 600", 1, json!({})).await;
    let a = rm.wait_state(&id, &["RUNNING"]).await;
    assert_eq!(a["trackingUI"], "ApplicationMaster");
    assert!(
        a["runningContainers"].as_i64() == Some(1) && a["allocatedMB"].as_i64() == Some(1024),
        "{a}"
    );
    let atts = rm
        .get(&format!("/ws/v1/cluster/apps/{id}/appattempts"))
        .await
        .1;
    let cid = atts["appAttempts"]["appAttempt"][0]["containerId"]
        .as_str()
        .unwrap()
        .to_string();
    let pid = rm.container(&cid).await["pid"].as_u64().unwrap() as u32;
    assert!(pid_alive(pid));

    let url = rm.url(&format!("/ws/v1/cluster/apps/{id}/state?user.name=bob"));
    let bad = rm
        .http
        .put(&url)
        .json(&json!({"state": "RUNNING"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let r = rm
        .http
        .put(&url)
        .json(&json!({"state": "KILLED"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert!(
        r.headers()
            .get("location")
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with(&format!("/apps/{id}/state"))
    );
    assert_eq!(r.json::<Value>().await.unwrap()["state"], "RUNNING");
    wait_dead(pid).await;
    wait_for("AM container completion", T, || async {
        (rm.container(&cid).await["state"] == "COMPLETE").then_some(())
    })
    .await;
    let r = rm
        .http
        .put(&url)
        .json(&json!({"state": "KILLED"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"state": "KILLED"}));
    let a = rm.app(&id).await;
    assert_eq!(a["finalStatus"], "KILLED");
    assert!(
        a["diagnostics"]
            .as_str()
            .unwrap()
            .contains("killed by user bob")
    );
    let c = rm.container(&cid).await;
    assert_eq!(c["exit_status"], -106, "{c}");
}

/// A WebHDFS NameNode + DataNode pair good enough for localization:
/// GETFILESTATUS and OPEN (307 to a data URL).
async fn tiny_webhdfs(content: &'static [u8], mtime: i64) -> (String, tokio::task::JoinHandle<()>) {
    use axum::extract::{Path, Query};
    use axum::response::IntoResponse;
    use std::collections::HashMap;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let base2 = base.clone();
    let app = axum::Router::new()
        .route(
            "/webhdfs/v1/{*path}",
            axum::routing::get(move |Path(path): Path<String>, Query(q): Query<HashMap<String, String>>| {
                let base = base2.clone();
                async move {
                    if path != "apps/am.sh" {
                        return (
                            StatusCode::NOT_FOUND,
                            axum::Json(json!({"RemoteException": {"exception": "FileNotFoundException",
                                "message": format!("File does not exist: /{path}")}})),
                        )
                            .into_response();
                    }
                    match q.get("op").map(String::as_str) {
                        Some("GETFILESTATUS") => axum::Json(json!({"FileStatus": {
                            "length": content.len(), "modificationTime": mtime, "type": "FILE",
                            "pathSuffix": "", "permission": "644", "owner": "alice", "group": "supergroup",
                            "accessTime": mtime, "blockSize": 134217728, "replication": 1}}))
                        .into_response(),
                        Some("OPEN") => (
                            StatusCode::TEMPORARY_REDIRECT,
                            [("location", format!("{base}/datanode/apps/am.sh?op=OPEN"))],
                        )
                            .into_response(),
                        _ => StatusCode::BAD_REQUEST.into_response(),
                    }
                }
            }),
        )
        .route("/datanode/apps/am.sh", axum::routing::get(move || async move { content }));
    let h = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (base, h)
}

#[tokio::test]
async fn local_resources_are_localized_and_checked() {
    const SCRIPT: &[u8] = b"#!/bin/sh\necho localized-ok \"$1\"\n";
    let mtime = 1_700_000_000_123;
    let (hdfs, server) = tiny_webhdfs(SCRIPT, mtime).await;
    let rm = Rm::start(&[]);
    let host = hdfs.trim_start_matches("http://");
    let res = |ts: i64, size: usize| {
        json!({"local-resources": {"entry": [{"key": "am.sh", "value": {
            "resource": format!("hdfs://{host}/apps/am.sh"), "type": "FILE",
            "visibility": "APPLICATION", "size": size, "timestamp": ts}}]}})
    };
    let good = rm
        .submit_cmd("./am.sh arg1", 1, res(mtime, SCRIPT.len()))
        .await;
    let a = rm.wait_state(&good, &["FINISHED", "FAILED"]).await;
    assert_eq!(a["state"], "FINISHED", "{a}");
    let cid = rm
        .get(&format!("/ws/v1/cluster/apps/{good}/appattempts"))
        .await
        .1["appAttempts"]["appAttempt"][0]["containerId"]
        .as_str()
        .unwrap()
        .to_string();
    let c = rm.container(&cid).await;
    let wd = std::path::PathBuf::from(c["work_dir"].as_str().unwrap());
    assert_eq!(read(&wd.join("stdout")).trim(), "localized-ok arg1");
    assert_eq!(std::fs::read(wd.join("am.sh")).unwrap(), SCRIPT);

    // The same file through a webhdfs:// URL and a plain WebHDFS http:// URL.
    for url in [
        format!("webhdfs://{host}/apps/am.sh"),
        format!("{hdfs}/webhdfs/v1/apps/am.sh"),
    ] {
        let id = rm
            .submit_cmd(
                "./am.sh again",
                1,
                json!({"local-resources": {"entry": [{"key": "am.sh", "value": {
                    "resource": url, "type": "FILE", "visibility": "PUBLIC",
                    "size": SCRIPT.len(), "timestamp": mtime}}]}}),
            )
            .await;
        let a = rm.wait_state(&id, &["FINISHED", "FAILED"]).await;
        assert_eq!(a["state"], "FINISHED", "{url}: {a}");
    }

    let stale = rm
        .submit_cmd("./am.sh", 1, res(mtime - 1, SCRIPT.len()))
        .await;
    let a = rm.wait_state(&stale, &["FAILED", "FINISHED"]).await;
    let d = a["diagnostics"].as_str().unwrap();
    assert_eq!(a["state"], "FAILED");
    assert!(
        d.contains("changed on src filesystem") && d.contains("exitCode: -1000"),
        "{d}"
    );

    let short = rm
        .submit_cmd("./am.sh", 1, res(mtime, SCRIPT.len() + 1))
        .await;
    let a = rm.wait_state(&short, &["FAILED", "FINISHED"]).await;
    assert!(
        a["diagnostics"].as_str().unwrap().contains("expected size"),
        "{a}"
    );

    let missing = rm
        .submit_cmd(
            "true",
            1,
            json!({"local-resources": {"entry": [{"key": "x", "value": {
                "resource": format!("hdfs://{host}/apps/nope"), "type": "FILE", "size": 1, "timestamp": 1}}]}}),
        )
        .await;
    let a = rm.wait_state(&missing, &["FAILED", "FINISHED"]).await;
    assert!(a["diagnostics"].as_str().unwrap().contains("404"), "{a}");

    // --webhdfs points hdfs:// URLs (whose port is the NameNode RPC port) at
    // the WebHDFS HTTP address.
    let rm2 = Rm::start(&["--webhdfs", &hdfs]);
    let id = rm2
        .submit_cmd(
            "./am.sh",
            1,
            json!({"local-resources": {"entry": [{"key": "am.sh", "value": {
                "resource": "hdfs://namenode.invalid:8020/apps/am.sh", "type": "FILE",
                "size": SCRIPT.len(), "timestamp": mtime}}]}}),
        )
        .await;
    let a = rm2.wait_state(&id, &["FINISHED", "FAILED"]).await;
    assert_eq!(a["state"], "FINISHED", "{a}");
    server.abort();
}

#[tokio::test]
async fn errors_follow_the_rm() {
    let rm = Rm::start(&["--require-user"]);
    let (s, v) = rm.get("/ws/v1/cluster/apps/application_1_0001").await;
    assert_eq!(s, 404);
    assert_eq!(v["RemoteException"]["exception"], "NotFoundException");
    let (s, v) = rm.get("/ws/v1/cluster/apps/app_x").await;
    assert_eq!(s, 400);
    assert_eq!(v["RemoteException"]["exception"], "BadRequestException");

    let r = rm
        .http
        .post(rm.url("/ws/v1/cluster/apps/new-application"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        401,
        "--require-user: writes without user.name are refused"
    );

    // An id that new-application never issued.
    let r = rm
        .submit(json!({"application-id": "application_1_0042",
            "am-container-spec": {"commands": {"command": "true"}}}))
        .await;
    assert_eq!(r.status(), 400);
    let id = rm.new_app().await;
    let r = rm
        .http
        .post(rm.url("/ws/v1/cluster/apps?user.name=alice"))
        .header("content-type", "application/xml")
        .body("<application-submission-context/>")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = rm
        .submit(json!({"application-id": id, "am-container-spec": {}}))
        .await;
    assert_eq!(r.status(), 400, "no command");
    let r = rm
        .submit(
            json!({"application-id": id, "resource": {"memory": 1_000_000, "vCores": 1},
            "am-container-spec": {"commands": {"command": "true"}}}),
        )
        .await;
    assert_eq!(r.status(), 400, "above maximum allocation");
    let r = rm
        .submit(json!({"application-id": id, "queue": "nope",
            "am-container-spec": {"commands": {"command": "true"}}}))
        .await;
    assert_eq!(
        r.status(),
        202,
        "unknown queues are accepted, then the app fails"
    );
    let a = rm.app(&id).await;
    assert_eq!(a["state"], "FAILED");
    assert!(a["diagnostics"].as_str().unwrap().contains("unknown queue"));
    let r = rm.get("/cluster").await;
    assert_eq!(r.0, 200);
}

#[tokio::test]
async fn capacity_shrink_aborts_containers_and_restarts_the_am() {
    let rm = Rm::start(&[
        "--nodes",
        "2",
        "--node-memory-mb",
        "2048",
        "--node-vcores",
        "2",
        "--kill-grace-ms",
        "300",
    ]);
    // Three 1 GB AMs on two 2 GB nodes: spread over both nodes.
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(rm.submit_cmd("exec sleep 600", 2, json!({})).await);
    }
    for id in &apps {
        rm.wait_state(id, &["RUNNING"]).await;
    }
    let on_node2: Vec<Value> = rm
        .containers()
        .await
        .into_iter()
        .filter(|c| c["node"] == "127.0.0.1:45455" && c["state"] == "RUNNING")
        .collect();
    assert!(!on_node2.is_empty());
    let r = rm
        .http
        .put(rm.url("/sim/capacity"))
        .json(&json!({"nodes": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["nodes"], 1);
    assert_eq!(
        v["killed_containers"].as_array().unwrap().len(),
        on_node2.len()
    );
    for c in &on_node2 {
        wait_dead(c["pid"].as_u64().unwrap() as u32).await;
        let after = wait_for("container completion", T, || async {
            let x = rm.container(c["id"].as_str().unwrap()).await;
            (x["state"] == "COMPLETE").then_some(x)
        })
        .await;
        assert_eq!(after["exit_status"], -100);
        assert!(
            after["diagnostics"]
                .as_str()
                .unwrap()
                .contains("decommissioned"),
            "{after}"
        );
    }
    let (_, n) = rm.get("/ws/v1/cluster/nodes?states=DECOMMISSIONED").await;
    assert_eq!(n["nodes"]["node"][0]["id"], "127.0.0.1:45455");
    let (_, m) = rm.get("/ws/v1/cluster/metrics").await;
    assert_eq!(m["clusterMetrics"]["totalMB"], 2048);
    // The aborted AM's app gets a new attempt (not counted against max
    // attempts) that waits for room: 2 GB hold two 1 GB AMs.
    let victim_app = on_node2[0]["app"].as_str().unwrap();
    let a = wait_for("second attempt", T, || async {
        let a = rm.app(victim_app).await;
        let atts = rm
            .get(&format!("/ws/v1/cluster/apps/{victim_app}/appattempts"))
            .await
            .1;
        (atts["appAttempts"]["appAttempt"].as_array().unwrap().len() == 2).then_some(a)
    })
    .await;
    assert!(
        ["ACCEPTED", "RUNNING"].contains(&a["state"].as_str().unwrap()),
        "{a}"
    );

    // Growing back lets everything run again.
    let r = rm
        .http
        .put(rm.url("/sim/capacity"))
        .json(&json!({"nodes": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for id in &apps {
        rm.wait_state(id, &["RUNNING"]).await;
    }
    // Shrinking a node's memory preempts its newest containers.
    let r = rm
        .http
        .put(rm.url("/sim/capacity"))
        .json(&json!({"node_memory_mb": 1024}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["killed_containers"].as_array().unwrap().len(), 1, "{v}");
    let pre = rm
        .container(v["killed_containers"][0].as_str().unwrap())
        .await;
    let pre = wait_for("preempted exit", T, || async {
        let c = rm.container(pre["id"].as_str().unwrap()).await;
        (c["state"] == "COMPLETE").then_some(c)
    })
    .await;
    assert_eq!(pre["exit_status"], -102, "{pre}");
    let r = rm
        .http
        .put(rm.url("/sim/capacity"))
        .json(&json!({"nodes": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn sigterm_kills_every_container() {
    let mut rm = Rm::start(&["--kill-grace-ms", "300"]);
    let id = rm
        .submit_cmd("sleep 600 & sleep 600 & wait", 1, json!({}))
        .await;
    rm.wait_state(&id, &["RUNNING"]).await;
    let cid = rm
        .get(&format!("/ws/v1/cluster/apps/{id}/appattempts"))
        .await
        .1["appAttempts"]["appAttempt"][0]["containerId"]
        .as_str()
        .unwrap()
        .to_string();
    let pid = rm.container(&cid).await["pid"].as_u64().unwrap() as i32;
    // Both background sleeps are in the container's process group.
    let members = wait_for("two sleeps in the group", T, || async {
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
    let st = rm.sim.terminate();
    assert!(st.success(), "{st}");
    // Killed as the simulator exits; each is gone within wait_dead's bound
    // (a process the simulator left alive would outlive it by minutes).
    for p in members {
        wait_dead(p).await;
    }
}
