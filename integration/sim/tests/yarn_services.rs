//! `cruise-sim yarn`, YARN Services REST API: components whose containers
//! really run, flex up and down, decommission, restart policies, capacity
//! preemption, stop/start and destroy.

mod yarn_mesos_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use yarn_mesos_support::{SimProc, pid_alive, read, wait_dead, wait_for};

const T: Duration = Duration::from_secs(20);

struct Svc {
    sim: SimProc,
    http: reqwest::Client,
}

impl Svc {
    fn start(args: &[&str]) -> Svc {
        Svc {
            sim: SimProc::start("yarn", args),
            http: reqwest::Client::new(),
        }
    }
    fn url(&self, p: &str) -> String {
        format!("{}/app/v1/services{p}", self.sim.url)
    }
    async fn send(&self, m: reqwest::Method, p: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut rb = self.http.request(m, self.url(p));
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let s = r.status();
        let t = r.text().await.unwrap();
        (s, serde_json::from_str(&t).unwrap_or(Value::Null))
    }
    async fn get(&self, name: &str) -> Value {
        let (s, v) = self
            .send(reqwest::Method::GET, &format!("/{name}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        v
    }
    /// Instance name → (container id, state) of component `comp`.
    async fn containers(&self, name: &str, comp: &str) -> BTreeMap<String, (String, String)> {
        let v = self.get(name).await;
        let c = v["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == comp)
            .unwrap()
            .clone();
        c["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["component_instance_name"].as_str().unwrap().to_string(),
                    (
                        x["id"].as_str().unwrap().to_string(),
                        x["state"].as_str().unwrap().to_string(),
                    ),
                )
            })
            .collect()
    }
    async fn wait_ready(
        &self,
        name: &str,
        comp: &str,
        n: usize,
    ) -> BTreeMap<String, (String, String)> {
        wait_for(&format!("{n} READY {comp} containers"), T, || async {
            let c = self.containers(name, comp).await;
            (c.len() == n && c.values().all(|(_, s)| s == "READY")).then_some(c)
        })
        .await
    }
    async fn sim_container(&self, id: &str) -> Value {
        let r = self
            .http
            .get(format!("{}/sim/containers", self.sim.url))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()
            .clone()
    }
    async fn pid(&self, id: &str) -> u32 {
        self.sim_container(id).await["pid"].as_u64().unwrap() as u32
    }
    async fn wait_complete(&self, id: &str) -> Value {
        wait_for(&format!("{id} complete"), T, || async {
            let c = self.sim_container(id).await;
            (c["state"] == "COMPLETE").then_some(c)
        })
        .await
    }
}

fn service(name: &str, n: u64, cmd: &str, policy: &str) -> Value {
    json!({
        "name": name,
        "version": "1.0",
        "configuration": {"env": {"SERVICE_LEVEL": "svc"}},
        "components": [{
            "name": "worker",
            "number_of_containers": n,
            "launch_command": cmd,
            "restart_policy": policy,
            "resource": {"cpus": 1, "memory": "256"},
            "configuration": {"env": {"WHO": "${COMPONENT_INSTANCE_NAME}", "SVC": "${SERVICE_NAME}"}},
        }],
    })
}

const WRITE_ENV: &str =
    "echo \"$WHO $SVC $SERVICE_LEVEL $CONTAINER_ID\" > $LOG_DIR/who; exec sleep 600";

#[tokio::test]
async fn create_flex_decommission_and_destroy() {
    let s = Svc::start(&[
        "--nodes",
        "2",
        "--node-memory-mb",
        "4096",
        "--kill-grace-ms",
        "300",
    ]);
    let (st, v) = s.send(reqwest::Method::GET, "/version", None).await;
    assert_eq!(
        (st, v["hadoop_version"].is_string()),
        (StatusCode::OK, true)
    );
    let (st, v) = s
        .send(
            reqwest::Method::POST,
            "?user.name=alice",
            Some(service("ml", 2, WRITE_ENV, "ALWAYS")),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["uri"], "/v1/services/ml");
    let app_id = v["diagnostics"]
        .as_str()
        .unwrap()
        .trim_start_matches("Application ID: ")
        .to_string();

    let c = s.wait_ready("ml", "worker", 2).await;
    assert_eq!(
        c.keys().cloned().collect::<Vec<_>>(),
        ["worker-0", "worker-1"]
    );
    let svc = s.get("ml").await;
    assert_eq!(
        (svc["state"].as_str(), svc["id"].as_str()),
        (Some("STABLE"), Some(app_id.as_str()))
    );
    let cont = &svc["components"][0]["containers"][0];
    assert_eq!(cont["ip"], "127.0.0.1");
    assert_eq!(cont["bare_host"], "127.0.0.1");
    assert!(
        cont["hostname"]
            .as_str()
            .unwrap()
            .starts_with("worker-0.ml.alice.")
    );
    // The container environment: tokens substituted, service env merged.
    let (cid0, _) = &c["worker-0"];
    let dir = PathBuf::from(s.sim_container(cid0).await["log_dir"].as_str().unwrap());
    let who = wait_for("who file", T, || async {
        Some(read(&dir.join("who"))).filter(|x| !x.is_empty())
    })
    .await;
    assert_eq!(who.trim(), format!("worker-0 ml svc {cid0}"));
    // The RM sees the service's application and its containers.
    let r = s
        .http
        .get(format!("{}/ws/v1/cluster/apps/{app_id}", s.sim.url))
        .send()
        .await
        .unwrap();
    let app: Value = r.json().await.unwrap();
    assert_eq!(app["app"]["applicationType"], "yarn-service");
    assert_eq!(app["app"]["runningContainers"], 2);

    // Flex up to 4: two new processes.
    let (st, v) = s
        .send(
            reqwest::Method::PUT,
            "/ml/components/worker",
            Some(json!({"number_of_containers": 4})),
        )
        .await;
    assert_eq!(
        (st, v["diagnostics"].as_str()),
        (
            StatusCode::OK,
            Some("Updating component (worker) size from 2 to 4")
        )
    );
    let c = s.wait_ready("ml", "worker", 4).await;
    let mut pids = BTreeMap::new();
    for (inst, (cid, _)) in &c {
        let pid = s.pid(cid).await;
        assert!(pid_alive(pid));
        pids.insert(inst.clone(), (cid.clone(), pid));
    }

    // Flex down to 1: the newest three die, worker-0 stays.
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/ml/components/worker",
            Some(json!({"number_of_containers": 1})),
        )
        .await;
    assert_eq!(st, 200);
    for inst in ["worker-1", "worker-2", "worker-3"] {
        wait_dead(pids[inst].1).await;
        assert_eq!(s.wait_complete(&pids[inst].0).await["exit_status"], -100);
    }
    assert!(pid_alive(pids["worker-0"].1));
    let c = s.wait_ready("ml", "worker", 1).await;
    assert!(c.contains_key("worker-0"));

    // Decommission worker-0: desired drops to 0, its process dies.
    let (st, v) = s
        .send(
            reqwest::Method::PUT,
            "/ml",
            Some(json!({"components": [{"name": "worker", "decommissioned_instances": ["worker-0"]}]})),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    wait_dead(pids["worker-0"].1).await;
    let svc = s.get("ml").await;
    assert_eq!(svc["components"][0]["number_of_containers"], 0);
    assert_eq!(
        svc["components"][0]["decommissioned_instances"],
        json!(["worker-0"])
    );
    // A decommissioned name is never reused.
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/ml/components/worker",
            Some(json!({"number_of_containers": 2})),
        )
        .await;
    assert_eq!(st, 200);
    let c = s.wait_ready("ml", "worker", 2).await;
    assert!(!c.contains_key("worker-0"), "{c:?}");

    // Bad requests.
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/ml/components/worker",
            Some(json!({"number_of_containers": -1})),
        )
        .await;
    assert_eq!(st, 400);
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/ml",
            Some(json!({"components": [{"name": "worker", "decommissioned_instances": ["other-3"]}]})),
        )
        .await;
    assert_eq!(st, 400);
    let (st, v) = s
        .send(
            reqwest::Method::PUT,
            "/ml",
            Some(json!({"description": "x"})),
        )
        .await;
    assert_eq!((st, v), (StatusCode::NO_CONTENT, Value::Null));
    let (st, _) = s
        .send(
            reqwest::Method::POST,
            "",
            Some(service("ml", 1, "true", "ALWAYS")),
        )
        .await;
    assert_eq!(st, 500, "name already taken");

    // DELETE kills everything and forgets the service.
    let live: Vec<u32> = {
        let mut v = Vec::new();
        for (cid, _) in c.values() {
            v.push(s.pid(cid).await);
        }
        v
    };
    let (st, v) = s.send(reqwest::Method::DELETE, "/ml", None).await;
    assert_eq!(
        (st, v["diagnostics"].as_str()),
        (StatusCode::OK, Some("Successfully destroyed service ml"))
    );
    for p in live {
        wait_dead(p).await;
    }
    let (st, v) = s.send(reqwest::Method::GET, "/ml", None).await;
    assert_eq!(
        (st, v["code"].as_i64()),
        (StatusCode::NOT_FOUND, Some(404004))
    );
    let r = s
        .http
        .get(format!("{}/ws/v1/cluster/apps/{app_id}", s.sim.url))
        .send()
        .await
        .unwrap();
    let app: Value = r.json().await.unwrap();
    assert_eq!(
        (
            app["app"]["state"].as_str(),
            app["app"]["finalStatus"].as_str()
        ),
        (Some("FINISHED"), Some("ENDED"))
    );
}

#[tokio::test]
async fn restart_policies_and_validation() {
    let s = Svc::start(&["--service-restart-delay-ms", "100"]);
    // NEVER: the instance ends FAILED with its exit status; flex is refused.
    let (st, _) = s
        .send(
            reqwest::Method::POST,
            "",
            Some(service("once", 1, "echo bad >&2; exit 3", "NEVER")),
        )
        .await;
    assert_eq!(st, 202);
    let v = wait_for("FAILED instance", T, || async {
        let v = s.get("once").await;
        (v["components"][0]["containers"][0]["state"] == "FAILED").then_some(v)
    })
    .await;
    let c = &v["components"][0]["containers"][0];
    assert_eq!(c["exit_status"], 3);
    assert!(c["diagnostics"].as_str().unwrap().contains("bad"), "{c}");
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/once/components/worker",
            Some(json!({"number_of_containers": 2})),
        )
        .await;
    assert_eq!(st, 400);

    // ALWAYS: an exiting process comes back in a new container.
    let (st, _) = s
        .send(
            reqwest::Method::POST,
            "",
            Some(service("again", 1, "sleep 0.2; exit 0", "ALWAYS")),
        )
        .await;
    assert_eq!(st, 202);
    let first = s.wait_ready("again", "worker", 1).await["worker-0"]
        .0
        .clone();
    let second = wait_for("a restarted container", T, || async {
        let c = s.containers("again", "worker").await;
        c.get("worker-0")
            .map(|x| x.0.clone())
            .filter(|id| *id != first)
    })
    .await;
    assert_ne!(first, second);
    assert_eq!(s.sim_container(&first).await["exit_status"], 0);
    let v = s.get("again").await;
    let c = &v["components"][0]["containers"][0];
    assert_eq!(
        (
            c["previous_exit_status"].as_i64(),
            c["restarts"].as_u64().map(|r| r >= 1)
        ),
        (Some(0), Some(true)),
        "{c}"
    );

    // Stop and start again.
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/again",
            Some(json!({"state": "STOPPED"})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(s.get("again").await["state"], "STOPPED");
    let (st, _) = s
        .send(
            reqwest::Method::PUT,
            "/again",
            Some(json!({"state": "STOPPED"})),
        )
        .await;
    assert_eq!(st, 400, "already stopped");
    let (st, v) = s
        .send(
            reqwest::Method::PUT,
            "/again",
            Some(json!({"state": "STARTED"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    s.wait_ready("again", "worker", 1).await;

    // Validation errors are 400 ServiceStatus bodies.
    for bad in [
        json!({"name": "Bad_Name", "version": "1", "components": []}),
        json!({"name": "nover", "components": [{"name": "a", "number_of_containers": 1, "launch_command": "true", "resource": {"cpus": 1, "memory": "128"}}]}),
        json!({"name": "nocmd", "version": "1", "components": [{"name": "a", "number_of_containers": 1, "resource": {"cpus": 1, "memory": "128"}}]}),
        json!({"name": "nores", "version": "1", "components": [{"name": "a", "number_of_containers": 1, "launch_command": "true"}]}),
        json!({"name": "docker", "version": "1", "components": [{"name": "a", "number_of_containers": 1, "launch_command": "true", "artifact": {"id": "img", "type": "DOCKER"}, "resource": {"cpus": 1, "memory": "128"}}]}),
    ] {
        let (st, v) = s.send(reqwest::Method::POST, "", Some(bad.clone())).await;
        assert_eq!(st, 400, "{bad} -> {v}");
        assert!(v["diagnostics"].is_string());
    }
}

#[tokio::test]
async fn shrinking_capacity_preempts_and_reschedules_instances() {
    let s = Svc::start(&[
        "--nodes",
        "1",
        "--node-memory-mb",
        "4096",
        "--node-vcores",
        "4",
        "--kill-grace-ms",
        "300",
        "--service-restart-delay-ms",
        "100",
    ]);
    let (st, _) = s
        .send(
            reqwest::Method::POST,
            "",
            Some(service("cap", 4, "exec sleep 600", "ALWAYS")),
        )
        .await;
    assert_eq!(st, 202);
    let before = s.wait_ready("cap", "worker", 4).await;
    let r = s
        .http
        .put(format!("{}/sim/capacity", s.sim.url))
        .json(&json!({"node_memory_mb": 2048}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let killed: Vec<String> = v["killed_containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().into())
        .collect();
    assert_eq!(killed.len(), 2, "{v}");
    for k in &killed {
        let c = s.wait_complete(k).await;
        assert_eq!(c["exit_status"], -102);
        assert!(c["diagnostics"].as_str().unwrap().contains("preempted"));
    }
    // Two instances keep running, two wait for room: the service is not stable.
    let v = wait_for("service STARTED with 2 ready", T, || async {
        let v = s.get("cap").await;
        let ready = v["components"][0]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["state"] == "READY")
            .count();
        (ready == 2 && v["state"] == "STARTED").then_some(v)
    })
    .await;
    assert_eq!(v["components"][0]["state"], "FLEXING");
    // Room again: the preempted instances come back under their names.
    let r = s
        .http
        .put(format!("{}/sim/capacity", s.sim.url))
        .json(&json!({"nodes": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let after = s.wait_ready("cap", "worker", 4).await;
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    assert_eq!(s.get("cap").await["state"], "STABLE");
}

#[tokio::test]
async fn lifetime_instances_listing_and_container_files() {
    let s = Svc::start(&["--kill-grace-ms", "300"]);
    let mut spec = service("short", 2, "echo out-$WHO; exec sleep 600", "ALWAYS");
    spec["lifetime"] = json!(2);
    let t0 = std::time::Instant::now();
    let (st, v) = s.send(reqwest::Method::POST, "", Some(spec)).await;
    assert_eq!(st, 202, "{v}");
    let app_id = v["diagnostics"]
        .as_str()
        .unwrap()
        .trim_start_matches("Application ID: ")
        .to_string();
    let c = s.wait_ready("short", "worker", 2).await;

    let (st, list) = s
        .send(
            reqwest::Method::GET,
            "/short/component-instances?componentName=worker",
            None,
        )
        .await;
    assert_eq!(st, 200);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["component_instance_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["worker-0", "worker-1"]);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|x| x["component_name"] == "worker")
    );

    // A container's files are served by the admin endpoint (logUrl). As on
    // YARN, the ServiceMaster's `1><LOG_DIR>/stdout.txt` redirection binds to
    // the last command of the launch_command only; `echo` goes to the
    // container process's own stdout, captured as `stdout`.
    let (cid, _) = &c["worker-1"];
    let files = wait_for("container files", T, || async {
        let v: Value = s
            .http
            .get(format!("{}/sim/containers/{cid}/files/", s.sim.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let files: Vec<String> = v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect();
        (files.iter().any(|f| f == "launch_container.sh")
            && files.iter().any(|f| f == "logs/stdout.txt"))
        .then_some(files)
    })
    .await;
    assert!(files.contains(&"stdout".to_string()), "{files:?}");
    let out = wait_for("stdout.txt", T, || async {
        let r = s
            .http
            .get(format!("{}/sim/containers/{cid}/files/stdout", s.sim.url))
            .send()
            .await
            .unwrap();
        Some(r.text().await.unwrap()).filter(|t| !t.is_empty())
    })
    .await;
    assert_eq!(out.trim(), "out-worker-1");
    let r = s
        .http
        .get(format!("{}/sim/containers/{cid}/files/../x", s.sim.url))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 200);

    // The lifetime runs out: the application is killed, the processes die.
    let pids = [s.pid(&c["worker-0"].0).await, s.pid(&c["worker-1"].0).await];
    for p in pids {
        wait_dead(p).await;
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(1900),
        "killed after {:?}",
        t0.elapsed()
    );
    let r = s
        .http
        .get(format!("{}/ws/v1/cluster/apps/{app_id}", s.sim.url))
        .send()
        .await
        .unwrap();
    let app: Value = r.json().await.unwrap();
    assert_eq!(app["app"]["state"], "KILLED");
    assert!(
        app["app"]["diagnostics"]
            .as_str()
            .unwrap()
            .contains("lifetime")
    );
    assert_eq!(s.get("short").await["state"], "STOPPED");
}
