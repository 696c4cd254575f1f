//! HTTP surface of the Mesos simulator: `POST /api/v1/scheduler` (SUBSCRIBE
//! streams and the other calls), `GET /version`, `GET /redirect`, the
//! non-leading-master redirector, the `/sim` admin endpoints, and the task
//! runner that fetches URIs and supervises task processes.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State as AxState;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use super::Sim;
use super::state::{CapacityChange, TaskJob, is_terminal, new_uuid_string, record};
use crate::yarn::common::{Outcome, ProcessSpec, Running};

const STREAM_ID: &str = "Mesos-Stream-Id";

fn text(status: StatusCode, msg: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg.into(),
    )
        .into_response()
}

fn json_ok(v: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// Routes of the leading master.
pub(crate) fn routes(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/api/v1/scheduler", any(scheduler))
        .route("/master/api/v1/scheduler", any(scheduler))
        .route("/version", get(version))
        .route("/redirect", get(self_redirect))
        .route("/master/redirect", get(self_redirect))
        .route("/sim/capacity", get(get_capacity).put(put_capacity))
        .route("/sim/state", get(sim_state))
        .route("/sim/inverse_offer", post(post_inverse_offer))
        .with_state(sim)
}

/// Routes of a non-leading master that points at `leader` (`host:port`).
pub(crate) fn follower_routes(leader: String) -> Router {
    let to_scheduler = {
        let leader = leader.clone();
        move || {
            let loc = format!("//{leader}/api/v1/scheduler");
            async move {
                let mut r = text(
                    StatusCode::TEMPORARY_REDIRECT,
                    format!("This master is not the leader, redirecting to {loc}"),
                );
                if let Ok(h) = HeaderValue::from_str(&loc) {
                    r.headers_mut().insert(header::LOCATION, h);
                }
                r
            }
        }
    };
    let to_leader = move || {
        let loc = format!("//{leader}");
        async move {
            let mut r = StatusCode::TEMPORARY_REDIRECT.into_response();
            if let Ok(h) = HeaderValue::from_str(&loc) {
                r.headers_mut().insert(header::LOCATION, h);
            }
            r
        }
    };
    Router::new()
        .route("/api/v1/scheduler", any(to_scheduler.clone()))
        .route("/master/api/v1/scheduler", any(to_scheduler))
        .route("/redirect", get(to_leader.clone()))
        .route("/master/redirect", get(to_leader))
        .route("/version", get(version_plain))
}

fn version_json() -> Value {
    json!({
        "version": super::MESOS_VERSION,
        "git_tag": super::MESOS_VERSION,
        "git_sha": "0000000000000000000000000000000000000000",
        "build_date": "2020-11-19 00:00:00",
        "build_time": 1605744000.0,
        "build_user": "cruise-sim",
    })
}

async fn version() -> Response {
    json_ok(&version_json())
}

async fn version_plain() -> Response {
    json_ok(&version_json())
}

async fn self_redirect(AxState(sim): AxState<Arc<Sim>>) -> Response {
    let (h, p) = {
        let st = sim.lock();
        (st.cfg.host.clone(), st.cfg.port)
    };
    let mut r = StatusCode::TEMPORARY_REDIRECT.into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("//{h}:{p}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// `POST /api/v1/scheduler`.
async fn scheduler(
    AxState(sim): AxState<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("Expecting a 'POST' request, received '{method}'"),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let ct = match headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        Some(c) => c.to_ascii_lowercase(),
        None => {
            return text(
                StatusCode::BAD_REQUEST,
                "Expecting 'Content-Type' to be present",
            );
        }
    };
    if !ct.starts_with("application/json") {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Expecting 'Content-Type' of application/json (cruise-sim does not speak application/x-protobuf); got '{ct}'"
            ),
        );
    }
    let call: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse body into JSON: {e}"),
            );
        }
    };
    let Some(ty) = call["type"].as_str() else {
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to validate scheduler::Call: Expecting 'type' to be present",
        );
    };
    if ty == "SUBSCRIBE" {
        return subscribe(sim, &headers, &call);
    }
    handle_call(&sim, &headers, ty, &call)
}

fn subscribe(sim: Arc<Sim>, headers: &HeaderMap, call: &Value) -> Response {
    if headers.contains_key(STREAM_ID) {
        return text(
            StatusCode::BAD_REQUEST,
            "Subscribe calls should not include the 'Mesos-Stream-Id' header",
        );
    }
    if let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) {
        let a = accept.to_ascii_lowercase();
        if !(a.contains("application/json") || a.contains("*/*") || a.contains("application/*")) {
            return text(
                StatusCode::NOT_ACCEPTABLE,
                format!(
                    "Expecting 'Accept' to allow application/json (cruise-sim streams JSON only); got '{accept}'"
                ),
            );
        }
    }
    let info = &call["subscribe"]["framework_info"];
    if !info.is_object() {
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to validate scheduler::Call: Expecting 'subscribe' with 'framework_info' to be present",
        );
    }
    if info["user"].as_str().is_none() || info["name"].as_str().is_none() {
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to convert JSON into Call protobuf: Missing required fields: subscribe.framework_info.user, subscribe.framework_info.name",
        );
    }
    let top = call["framework_id"]["value"].as_str();
    let inner = info["id"]["value"].as_str();
    if top != inner {
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to validate scheduler::Call: 'framework_id' differs from 'subscribe.framework_info.id'",
        );
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let close = CancellationToken::new();
    let stream_id = new_uuid_string();
    let subscribed = sim
        .lock()
        .subscribe(info, tx.clone(), close.clone(), &stream_id);
    let fid = match subscribed {
        Ok(fid) => fid,
        Err(msg) => {
            tracing::info!(%msg, "refusing subscription");
            let ev = record(&json!({"type": "ERROR", "error": {"message": msg}}));
            let body = Body::from_stream(futures::stream::iter([Ok::<_, Infallible>(ev)]));
            return stream_response(body, &stream_id);
        }
    };
    tracing::info!(framework = %fid, stream = %stream_id, "framework subscribed");
    // Watch the stream: heartbeats, and notice when the client goes away.
    {
        let sim = Arc::clone(&sim);
        let close = close.clone();
        let stop = sim.stop.clone();
        let stream_id = stream_id.clone();
        let heartbeat = sim.heartbeat;
        sim.tracker.clone().spawn(async move {
            let mut hb =
                tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = close.cancelled() => break,
                    _ = tx.closed() => {
                        sim.lock().disconnected(&fid, &stream_id);
                        break;
                    }
                    _ = hb.tick() => {
                        let _ = tx.send(record(&json!({"type": "HEARTBEAT"})));
                    }
                }
            }
        });
    }
    let stop = sim.stop.clone();
    let events = UnboundedReceiverStream::new(rx)
        .take_until(close.cancelled_owned())
        .take_until(stop.cancelled_owned())
        .map(Ok::<_, Infallible>);
    stream_response(Body::from_stream(events), &stream_id)
}

fn stream_response(body: Body, stream_id: &str) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(stream_id) {
        h.insert(STREAM_ID, v);
    }
    r
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["value"].as_str().map(String::from))
        .collect()
}

fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_str().map(String::from))
        .collect()
}

fn handle_call(sim: &Arc<Sim>, headers: &HeaderMap, ty: &str, call: &Value) -> Response {
    const KNOWN: [&str; 18] = [
        "UNKNOWN",
        "TEARDOWN",
        "ACCEPT",
        "DECLINE",
        "ACCEPT_INVERSE_OFFERS",
        "DECLINE_INVERSE_OFFERS",
        "REVIVE",
        "KILL",
        "SHUTDOWN",
        "ACKNOWLEDGE",
        "ACKNOWLEDGE_OPERATION_STATUS",
        "RECONCILE",
        "RECONCILE_OPERATIONS",
        "MESSAGE",
        "REQUEST",
        "SUPPRESS",
        "UPDATE_FRAMEWORK",
        "SUBSCRIBE",
    ];
    if !KNOWN.contains(&ty) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("Failed to convert JSON into Call protobuf: Failed to find enum for '{ty}'"),
        );
    }
    if ty == "UNKNOWN" {
        return text(StatusCode::NOT_IMPLEMENTED, "Received 'UNKNOWN' call");
    }
    let Some(fid) = call["framework_id"]["value"].as_str() else {
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to validate scheduler::Call: Expecting 'framework_id' to be present",
        );
    };
    let payload_key = ty.to_ascii_lowercase();
    let needs_payload = matches!(
        ty,
        "ACCEPT"
            | "DECLINE"
            | "KILL"
            | "SHUTDOWN"
            | "ACKNOWLEDGE"
            | "RECONCILE"
            | "MESSAGE"
            | "REQUEST"
            | "UPDATE_FRAMEWORK"
    );
    let payload = &call[payload_key.as_str()];
    if needs_payload && !payload.is_object() {
        return text(
            StatusCode::BAD_REQUEST,
            format!("Failed to validate scheduler::Call: Expecting '{payload_key}' to be present"),
        );
    }
    let Some(sid) = headers.get(STREAM_ID).and_then(|v| v.to_str().ok()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "All non-subscribe calls should include the 'Mesos-Stream-Id' header",
        );
    };
    let mut st = sim.lock();
    let Some(f) = st.frameworks.get(fid) else {
        return text(StatusCode::BAD_REQUEST, "Framework cannot be found");
    };
    let Some(stream) = &f.stream else {
        return text(StatusCode::FORBIDDEN, "Framework is not subscribed");
    };
    if stream.id != sid {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "The stream ID '{sid}' included in this request didn't match the stream ID currently associated with framework ID {fid}"
            ),
        );
    }
    tracing::debug!(framework = %fid, call = ty, "scheduler call");
    match ty {
        "TEARDOWN" => st.remove_framework(fid, "TEARDOWN call"),
        "ACCEPT" => match st.accept(fid, payload) {
            Ok(jobs) => {
                drop(st);
                for job in jobs {
                    let sim2 = Arc::clone(sim);
                    sim.tracker.spawn(async move { run_task(sim2, job).await });
                }
                return StatusCode::ACCEPTED.into_response();
            }
            Err(e) => return text(StatusCode::BAD_REQUEST, e),
        },
        "DECLINE" => {
            let refuse = payload["filters"]["refuse_seconds"].as_f64().unwrap_or(5.0);
            st.decline(fid, &ids(&payload["offer_ids"]), refuse);
        }
        "ACCEPT_INVERSE_OFFERS" | "DECLINE_INVERSE_OFFERS" => {
            let ids = ids(&call[payload_key.as_str()]["inverse_offer_ids"]);
            st.answer_inverse_offers(fid, &ids, ty == "ACCEPT_INVERSE_OFFERS");
        }
        "REVIVE" => st.revive(fid, &strings(&payload["roles"])),
        "SUPPRESS" => st.suppress(fid, &strings(&payload["roles"])),
        "KILL" => {
            let Some(tid) = payload["task_id"]["value"].as_str() else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Failed to validate scheduler::Call: Expecting 'kill.task_id'",
                );
            };
            st.kill_task(fid, tid);
        }
        "SHUTDOWN" => {
            let Some(eid) = payload["executor_id"]["value"].as_str() else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Failed to validate scheduler::Call: Expecting 'shutdown.executor_id'",
                );
            };
            let tids: Vec<String> = st
                .tasks
                .values()
                .filter(|t| t.framework == fid && t.executor_id == eid && !is_terminal(t.state))
                .map(|t| t.task_id.clone())
                .collect();
            for t in tids {
                st.kill_task(fid, &t);
            }
        }
        "ACKNOWLEDGE" => {
            let (Some(tid), Some(uuid)) = (
                payload["task_id"]["value"].as_str(),
                payload["uuid"].as_str(),
            ) else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Failed to validate scheduler::Call: Expecting 'acknowledge.task_id' and 'acknowledge.uuid'",
                );
            };
            if let Err(e) = st.acknowledge(fid, tid, uuid) {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("Failed to validate scheduler::Call: {e}"),
                );
            }
        }
        "RECONCILE" => {
            let tasks: Vec<(String, Option<String>)> = payload["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| {
                    Some((
                        t["task_id"]["value"].as_str()?.to_string(),
                        t["agent_id"]["value"].as_str().map(String::from),
                    ))
                })
                .collect();
            st.reconcile(fid, &tasks);
        }
        "UPDATE_FRAMEWORK" => {
            let info = &payload["framework_info"];
            if info["id"]["value"].as_str() != Some(fid) {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Failed to validate scheduler::Call: 'framework_id' differs from 'update_framework.framework_info.id'",
                );
            }
            if let Some(f) = st.frameworks.get_mut(fid) {
                if let Some(roles) = info["roles"].as_array() {
                    f.roles = roles
                        .iter()
                        .filter_map(|r| r.as_str().map(String::from))
                        .collect();
                }
                if let Some(t) = info["failover_timeout"].as_f64() {
                    f.failover_timeout = Duration::from_secs_f64(t.clamp(0.0, 1e9));
                }
                f.suppressed = strings(&payload["suppressed_roles"]).into_iter().collect();
                f.info = info.clone();
            }
            return StatusCode::OK.into_response();
        }
        // MESSAGE and REQUEST are accepted and dropped (command tasks have no
        // executor to deliver to; the allocator ignores requests), like the
        // operation and inverse-offer calls that concern nothing simulated.
        _ => {}
    }
    StatusCode::ACCEPTED.into_response()
}

// ---------- tasks ----------

async fn run_task(sim: Arc<Sim>, job: TaskJob) {
    let key = (job.framework.clone(), job.task_id.clone());
    let result = launch_task(&sim, &key, job).await;
    sim.lock().task_finished(&key, result);
}

async fn launch_task(sim: &Sim, key: &(String, String), job: TaskJob) -> Result<Outcome, String> {
    std::fs::create_dir_all(&job.sandbox).map_err(|e| {
        format!(
            "Failed to launch container: cannot create sandbox {}: {e}",
            job.sandbox.display()
        )
    })?;
    if !job.uris.is_empty() {
        tokio::select! {
            r = fetch_uris(&sim.http, &job.uris, &job.sandbox) => r.map_err(|e| format!("Failed to launch container: Failed to fetch all URIs for container: {e}"))?,
            _ = job.kill.cancelled() => return Err("Task killed before it was launched".into()),
        }
    }
    if job.kill.is_cancelled() {
        return Err("Task killed before it was launched".into());
    }
    sim.lock().task_starting(key);
    let spec = ProcessSpec {
        program: job.program,
        env: job.env,
        cwd: job.sandbox.clone(),
        stdout: job.sandbox.join("stdout"),
        stderr: job.sandbox.join("stderr"),
    };
    let run = Running::spawn(&spec).map_err(|e| format!("Failed to launch container: {e}"))?;
    sim.lock().task_running(key, run.pid());
    run.supervise(job.kill, sim.kill_grace)
        .await
        .map_err(|e| format!("Lost track of the task's process: {e}"))
}

/// The Mesos fetcher, reduced: download each URI into the sandbox, make it
/// executable if asked, extract archives unless `extract` is false.
async fn fetch_uris(http: &reqwest::Client, uris: &[Value], sandbox: &Path) -> Result<(), String> {
    for u in uris {
        let value = u["value"].as_str().ok_or("a URI has no 'value'")?;
        let base = value
            .rsplit('/')
            .next()
            .unwrap_or("")
            .split('?')
            .next()
            .unwrap_or("");
        let name = u["output_file"].as_str().unwrap_or(base);
        if name.is_empty() || name.contains("..") {
            return Err(format!("cannot derive a file name from URI {value}"));
        }
        let dest = sandbox.join(name);
        if value.starts_with("http://") || value.starts_with("https://") {
            let resp = http
                .get(value)
                .send()
                .await
                .map_err(|e| format!("GET {value}: {e}"))?;
            let code = resp.status();
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| format!("GET {value}: {e}"))?;
            if !code.is_success() {
                return Err(format!("GET {value} answered {code}"));
            }
            std::fs::write(&dest, &bytes)
                .map_err(|e| format!("writing {}: {e}", dest.display()))?;
        } else {
            let src = value.strip_prefix("file://").unwrap_or(value);
            if !src.starts_with('/') {
                return Err(format!(
                    "unsupported URI {value} (use http(s)://, file:// or an absolute path)"
                ));
            }
            std::fs::copy(src, &dest).map_err(|e| format!("copying {src}: {e}"))?;
        }
        if u["executable"].as_bool() == Some(true) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("chmod {}: {e}", dest.display()))?;
        }
        let lower = name.to_ascii_lowercase();
        let archive = [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"]
            .iter()
            .any(|s| lower.ends_with(s));
        if archive && u["extract"].as_bool().unwrap_or(true) {
            let out = tokio::process::Command::new("tar")
                .arg("-xf")
                .arg(&dest)
                .arg("-C")
                .arg(sandbox)
                .output()
                .await
                .map_err(|e| format!("running tar for {value}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "extracting {value}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    Ok(())
}

// ---------- admin ----------

fn capacity_json(st: &super::state::State) -> Value {
    let active = st.agents.iter().filter(|a| a.active).count();
    json!({
        "agents": active,
        "agent_cpus": st.cfg.agent_cpus,
        "agent_mem_mb": st.cfg.agent_mem_mb,
        "agent_disk_mb": st.cfg.agent_disk_mb,
        "total_cpus": st.cfg.agent_cpus * active as f64,
        "total_mem_mb": st.cfg.agent_mem_mb * active as f64,
    })
}

async fn get_capacity(AxState(sim): AxState<Arc<Sim>>) -> Response {
    json_ok(&capacity_json(&sim.lock()))
}

async fn put_capacity(AxState(sim): AxState<Arc<Sim>>, body: Bytes) -> Response {
    let ch: CapacityChange = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "PUT /sim/capacity: expected {{\"agents\": n, \"agent_cpus\": c, \"agent_mem_mb\": m}}: {e}"
                ),
            );
        }
    };
    if [ch.agent_cpus, ch.agent_mem_mb, ch.agent_disk_mb]
        .iter()
        .flatten()
        .any(|v| *v < 0.0 || !v.is_finite())
    {
        return text(
            StatusCode::BAD_REQUEST,
            "PUT /sim/capacity: resources must be finite and not negative",
        );
    }
    let mut st = sim.lock();
    let killed = st.change_capacity(&ch);
    tracing::info!(?ch, killed = killed.len(), "capacity changed");
    let mut v = capacity_json(&st);
    v["killed_tasks"] = json!(killed);
    json_ok(&v)
}

async fn post_inverse_offer(AxState(sim): AxState<Arc<Sim>>, body: Bytes) -> Response {
    let m: super::maintenance::Maintenance = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "POST /sim/inverse_offer: expected {{\"agent_id\": id, \"start_in_secs\": s, \"duration_secs\": d?}}: {e}"
                ),
            );
        }
    };
    let mut st = sim.lock();
    match st.start_maintenance(&m) {
        Ok(sent) => json_ok(&json!({"inverse_offers": sent})),
        Err(e) => text(
            StatusCode::BAD_REQUEST,
            format!("POST /sim/inverse_offer: {e}"),
        ),
    }
}

async fn sim_state(AxState(sim): AxState<Arc<Sim>>) -> Response {
    let st = sim.lock();
    let agents: Vec<Value> = st
        .agents
        .iter()
        .map(|a| json!({"id": a.id, "active": a.active, "draining": a.draining, "resources": a.total.to_json(None)}))
        .collect();
    let frameworks: Vec<Value> = st
        .frameworks
        .values()
        .map(|f| {
            json!({
                "id": f.id,
                "name": f.info["name"],
                "connected": f.stream.is_some(),
                "stream_id": f.stream.as_ref().map(|s| s.id.clone()),
                "failover_timeout": f.failover_timeout.as_secs_f64(),
                "roles": f.roles,
                "suppressed_roles": f.suppressed.iter().collect::<Vec<_>>(),
                "filtered_agents": f.filters.keys().map(|i| st.agents[*i].id.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let offers: Vec<Value> = st
        .offers
        .iter()
        .map(|(id, o)| json!({"id": id, "framework_id": o.framework, "agent_id": st.agents[o.agent].id, "resources": o.res.to_json(None)}))
        .collect();
    let tasks: Vec<Value> = st
        .tasks
        .values()
        .map(|t| {
            json!({
                "framework_id": t.framework,
                "task_id": t.task_id,
                "name": t.name,
                "agent_id": st.agents[t.agent].id,
                "executor_id": t.executor_id,
                "state": t.state,
                "pid": t.pid,
                "sandbox": t.sandbox,
                "message": t.exit_message,
                "kill_requested": t.kill_requested,
                "latest_status": t.latest,
                "resources": t.res.to_json(None),
            })
        })
        .collect();
    json_ok(&json!({
        "agents": agents,
        "frameworks": frameworks,
        "removed_frameworks": st.removed_frameworks.iter().collect::<Vec<_>>(),
        "offers": offers,
        "tasks": tasks,
        "inverse_offers": st.inverse_offers.iter().map(|r| r.to_json(&st)).collect::<Vec<_>>(),
    }))
}
