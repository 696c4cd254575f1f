//! ResourceManager REST API (`/ws/v1/cluster/...`) and the `GET /cluster`
//! web-UI probe, rendered in Hadoop 3's Jersey "natural" JSON (root-wrapped
//! objects, empty lists as `null`, RemoteException errors).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::Sim;
use super::common::now_ms;
use super::state::{
    AmSpec, App, AppState, Container, LocalResource, NodeState, Owner, Phase, State,
};

/// Content type of Hadoop 3 REST answers.
pub(crate) const JSON_UTF8: &str = "application/json;charset=utf-8";

/// A 2xx JSON answer with Hadoop's content type.
pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static(JSON_UTF8))],
        v.to_string(),
    )
        .into_response()
}

/// An RM error, rendered as a `RemoteException`.
#[derive(Debug)]
pub(crate) struct RmError {
    status: StatusCode,
    exception: &'static str,
    java: &'static str,
    message: String,
}

impl RmError {
    pub fn not_found(msg: impl Into<String>) -> Self {
        RmError {
            status: StatusCode::NOT_FOUND,
            exception: "NotFoundException",
            java: "org.apache.hadoop.yarn.webapp.NotFoundException",
            message: format!("java.lang.Exception: {}", msg.into()),
        }
    }
    pub fn bad_request(msg: impl Into<String>) -> Self {
        RmError {
            status: StatusCode::BAD_REQUEST,
            exception: "BadRequestException",
            java: "org.apache.hadoop.yarn.webapp.BadRequestException",
            message: msg.into(),
        }
    }
    fn unauthorized() -> Self {
        RmError {
            status: StatusCode::UNAUTHORIZED,
            exception: "AuthorizationException",
            java: "org.apache.hadoop.security.authorize.AuthorizationException",
            message: "Unable to obtain user name, user not authenticated".into(),
        }
    }
    fn unsupported_media(msg: impl Into<String>) -> Self {
        RmError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            exception: "WebApplicationException",
            java: "javax.ws.rs.WebApplicationException",
            message: msg.into(),
        }
    }
}

impl IntoResponse for RmError {
    fn into_response(self) -> Response {
        json_response(
            self.status,
            &json!({"RemoteException": {
                "exception": self.exception,
                "message": self.message,
                "javaClassName": self.java,
            }}),
        )
    }
}

type RmResult = Result<Response, RmError>;
type Q = Query<HashMap<String, String>>;

/// Routes of the RM REST API.
pub(crate) fn routes() -> Router<Arc<Sim>> {
    Router::new()
        .route("/cluster", get(web_ui))
        .route("/cluster/", get(web_ui))
        .route("/ws/v1/cluster", get(cluster_info))
        .route("/ws/v1/cluster/", get(cluster_info))
        .route("/ws/v1/cluster/info", get(cluster_info))
        .route("/ws/v1/cluster/metrics", get(cluster_metrics))
        .route("/ws/v1/cluster/scheduler", get(cluster_scheduler))
        .route("/ws/v1/cluster/nodes", get(nodes))
        .route("/ws/v1/cluster/nodes/{node}", get(node))
        .route("/ws/v1/cluster/apps", get(apps).post(submit))
        .route("/ws/v1/cluster/apps/new-application", post(new_application))
        .route("/ws/v1/cluster/apps/{app}", get(app))
        .route(
            "/ws/v1/cluster/apps/{app}/state",
            get(app_state).put(put_app_state),
        )
        .route(
            "/ws/v1/cluster/apps/{app}/queue",
            get(app_queue).put(put_app_queue),
        )
        .route(
            "/ws/v1/cluster/apps/{app}/priority",
            get(app_priority).put(put_app_priority),
        )
        .route("/ws/v1/cluster/apps/{app}/appattempts", get(attempts))
        .route(
            "/ws/v1/cluster/apps/{app}/appattempts/{attempt}",
            get(attempt),
        )
        .route(
            "/ws/v1/cluster/apps/{app}/appattempts/{attempt}/containers",
            get(attempt_containers),
        )
        .route(
            "/ws/v1/cluster/apps/{app}/appattempts/{attempt}/containers/{container}",
            get(attempt_container),
        )
}

async fn web_ui() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html;charset=utf-8")],
        "<html><head><title>cruise-sim ResourceManager</title></head><body>\
         <h1>cruise-sim YARN ResourceManager</h1><p>REST API at <a href=\"/ws/v1/cluster\">/ws/v1/cluster</a></p>\
         </body></html>",
    )
        .into_response()
}

/// The caller's name from `?user.name=`; writes need one when
/// `--require-user` is set.
pub(crate) fn caller(
    sim: &Sim,
    q: &HashMap<String, String>,
    write: bool,
) -> Result<String, RmError> {
    match q.get("user.name") {
        Some(u) if !u.is_empty() => Ok(u.clone()),
        _ if write && sim.require_user => Err(RmError::unauthorized()),
        _ => Ok(sim.default_user.clone()),
    }
}

/// Reject bodies that are not JSON (XML submission is not simulated).
pub(crate) fn require_json(headers: &HeaderMap, what: &str) -> Result<(), RmError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.to_ascii_lowercase().starts_with("application/json") {
        Ok(())
    } else if ct.to_ascii_lowercase().contains("xml") {
        Err(RmError::unsupported_media(format!(
            "{what}: cruise-sim accepts JSON bodies only (Content-Type: application/json); XML is not simulated"
        )))
    } else {
        Err(RmError::unsupported_media(format!(
            "{what}: unsupported Content-Type {ct:?}; send application/json"
        )))
    }
}

fn parse_body(body: &Bytes, what: &str) -> Result<Value, RmError> {
    serde_json::from_slice(body)
        .map_err(|e| RmError::bad_request(format!("{what}: body is not valid JSON: {e}")))
}

fn check_app_id(id: &str) -> Result<(), RmError> {
    let mut parts = id.split('_');
    let ok = parts.next() == Some("application")
        && parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts.next().is_none();
    if ok {
        Ok(())
    } else {
        Err(RmError::bad_request(format!("Invalid ApplicationId: {id}")))
    }
}

fn find_app<'a>(st: &'a State, id: &str) -> Result<&'a App, RmError> {
    check_app_id(id)?;
    st.apps
        .get(id)
        .ok_or_else(|| RmError::not_found(format!("app with id: {id} not found")))
}

// ---------- cluster ----------

async fn cluster_info(AxState(sim): AxState<Arc<Sim>>) -> Response {
    let st = sim.lock();
    json_response(
        StatusCode::OK,
        &json!({"clusterInfo": {
            "id": st.cluster_ts,
            "startedOn": st.started_ms,
            "state": "STARTED",
            "haState": "ACTIVE",
            "rmStateStoreName": "org.apache.hadoop.yarn.server.resourcemanager.recovery.NullRMStateStore",
            "resourceManagerVersion": super::HADOOP_VERSION,
            "resourceManagerBuildVersion": format!("{} from cruise-sim", super::HADOOP_VERSION),
            "resourceManagerVersionBuiltOn": "2024-01-01T00:00Z",
            "hadoopVersion": super::HADOOP_VERSION,
            "hadoopBuildVersion": format!("{} from cruise-sim", super::HADOOP_VERSION),
            "hadoopVersionBuiltOn": "2024-01-01T00:00Z",
            "haZooKeeperConnectionState": "ResourceManager HA is not enabled.",
        }}),
    )
}

async fn cluster_metrics(AxState(sim): AxState<Arc<Sim>>) -> Response {
    let st = sim.lock();
    let (total_mb, total_vc, used_mb, used_vc, ncont) = st.totals();
    let count = |s: AppState| st.apps.values().filter(|a| a.state == s).count();
    let active = st
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Running)
        .count();
    let decom = st.nodes.len() - active;
    let pending_containers = st
        .apps
        .values()
        .filter(|a| a.state == AppState::Accepted)
        .count();
    json_response(
        StatusCode::OK,
        &json!({"clusterMetrics": {
            "appsSubmitted": st.apps.len(),
            "appsCompleted": count(AppState::Finished) + count(AppState::Failed) + count(AppState::Killed),
            "appsPending": count(AppState::Accepted),
            "appsRunning": count(AppState::Running),
            "appsFailed": count(AppState::Failed),
            "appsKilled": count(AppState::Killed),
            "reservedMB": 0,
            "availableMB": total_mb.saturating_sub(used_mb),
            "allocatedMB": used_mb,
            "totalMB": total_mb,
            "reservedVirtualCores": 0,
            "availableVirtualCores": total_vc.saturating_sub(used_vc),
            "allocatedVirtualCores": used_vc,
            "totalVirtualCores": total_vc,
            "containersAllocated": ncont,
            "containersReserved": 0,
            "containersPending": pending_containers,
            "totalNodes": active,
            "activeNodes": active,
            "lostNodes": 0,
            "unhealthyNodes": 0,
            "decommissioningNodes": 0,
            "decommissionedNodes": decom,
            "rebootedNodes": 0,
            "shutdownNodes": 0,
        }}),
    )
}

async fn cluster_scheduler(AxState(sim): AxState<Arc<Sim>>) -> Response {
    let st = sim.lock();
    let (total_mb, _, used_mb, used_vc, ncont) = st.totals();
    let used_pct = if total_mb == 0 {
        0.0
    } else {
        used_mb as f64 * 100.0 / total_mb as f64
    };
    let active = st
        .apps
        .values()
        .filter(|a| a.state == AppState::Running)
        .count();
    let pending = st
        .apps
        .values()
        .filter(|a| a.state == AppState::Accepted)
        .count();
    json_response(
        StatusCode::OK,
        &json!({"scheduler": {"schedulerInfo": {
            "type": "capacityScheduler",
            "capacity": 100.0,
            "usedCapacity": used_pct,
            "maxCapacity": 100.0,
            "queueName": "root",
            "queues": {"queue": [{
                "type": "capacitySchedulerLeafQueueInfo",
                "queueName": "default",
                "queuePath": "root.default",
                "state": "RUNNING",
                "capacity": 100.0,
                "usedCapacity": used_pct,
                "maxCapacity": 100.0,
                "absoluteCapacity": 100.0,
                "absoluteMaxCapacity": 100.0,
                "absoluteUsedCapacity": used_pct,
                "numApplications": active + pending,
                "numActiveApplications": active,
                "numPendingApplications": pending,
                "numContainers": ncont,
                "maxApplications": 10000,
                "maxApplicationsPerUser": 10000,
                "userLimit": 100,
                "userLimitFactor": 1.0,
                "users": null,
                "resourcesUsed": {"memory": used_mb, "vCores": used_vc},
            }]},
        }}}),
    )
}

// ---------- nodes ----------

fn node_json(st: &State, sim: &Sim, i: usize) -> Value {
    let n = &st.nodes[i];
    let (um, uv, nc) = st.node_used(i);
    let (am, av) = if n.state == NodeState::Running {
        (n.memory_mb.saturating_sub(um), n.vcores.saturating_sub(uv))
    } else {
        (0, 0)
    };
    let mut v = json!({
        "rack": "/default-rack",
        "state": n.state.as_str(),
        "id": n.id(),
        "nodeHostName": n.host,
        "nodeHTTPAddress": sim.http_address,
        "lastHealthUpdate": n.last_health_update,
        "version": super::HADOOP_VERSION,
        "healthReport": "",
        "numContainers": nc,
        "usedMemoryMB": um,
        "availMemoryMB": am,
        "usedVirtualCores": uv,
        "availableVirtualCores": av,
        "resourceUtilization": {
            "nodePhysicalMemoryMB": 0, "nodeVirtualMemoryMB": 0, "nodeCPUUsage": 0.0,
            "aggregatedContainersPhysicalMemoryMB": 0, "aggregatedContainersVirtualMemoryMB": 0,
            "containersCPUUsage": 0.0,
        },
        "totalResource": {"memory": n.memory_mb, "vCores": n.vcores},
        "usedResource": {"memory": um, "vCores": uv},
        "availableResource": {"memory": am, "vCores": av},
        "nodeLabels": [],
    });
    if n.state == NodeState::Decommissioning
        && let Some(t) = n.decommissioning_timeout
    {
        v["decommissioningTimeout"] = json!(t);
    }
    v
}

async fn nodes(AxState(sim): AxState<Arc<Sim>>, Query(q): Q) -> RmResult {
    let wanted: Option<Vec<String>> = q.get("states").or_else(|| q.get("state")).map(|s| {
        s.split(',')
            .map(|x| x.trim().to_ascii_uppercase())
            .filter(|x| !x.is_empty())
            .collect()
    });
    const KNOWN: [&str; 8] = [
        "NEW",
        "RUNNING",
        "UNHEALTHY",
        "DECOMMISSIONING",
        "DECOMMISSIONED",
        "LOST",
        "REBOOTED",
        "SHUTDOWN",
    ];
    if let Some(w) = &wanted
        && let Some(bad) = w.iter().find(|s| !KNOWN.contains(&s.as_str()))
    {
        return Err(RmError::bad_request(format!(
            "Invalid node state {bad}; valid states are {}",
            KNOWN.join(", ")
        )));
    }
    let st = sim.lock();
    let list: Vec<Value> = (0..st.nodes.len())
        .filter(|&i| {
            let s = st.nodes[i].state.as_str();
            match &wanted {
                Some(w) => w.iter().any(|x| x == s),
                None => true,
            }
        })
        .map(|i| node_json(&st, &sim, i))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &wrap_list("nodes", "node", list),
    ))
}

async fn node(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> RmResult {
    let st = sim.lock();
    let i = st
        .nodes
        .iter()
        .position(|n| n.id() == id)
        .ok_or_else(|| RmError::not_found(format!("nodeId, {id}, is not found")))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"node": node_json(&st, &sim, i)}),
    ))
}

/// `{"outer":{"inner":[...]}}`, or `{"outer":null}` when empty (Jersey).
pub(crate) fn wrap_list(outer: &str, inner: &str, list: Vec<Value>) -> Value {
    if list.is_empty() {
        json!({ outer: null })
    } else {
        json!({ outer: { inner: list } })
    }
}

// ---------- applications ----------

pub(crate) fn app_json(st: &State, sim: &Sim, a: &App) -> Value {
    let now = now_ms();
    let finished = a.state.is_final();
    let live: Vec<&Container> = st
        .containers
        .values()
        .filter(|c| c.app_id == a.id && c.phase != Phase::Complete)
        .collect();
    let (mut mem_s, mut vc_s) = (0u64, 0u64);
    for c in st.containers.values().filter(|c| c.app_id == a.id) {
        let end = c.finished_ms.unwrap_or(now);
        let secs = end.saturating_sub(c.allocated_ms) / 1000;
        mem_s += c.memory_mb * secs;
        vc_s += c.vcores * secs;
    }
    let (alloc_mb, alloc_vc, running) = if finished {
        (-1i64, -1i64, -1i64)
    } else {
        (
            live.iter().map(|c| c.memory_mb as i64).sum(),
            live.iter().map(|c| c.vcores as i64).sum(),
            live.len() as i64,
        )
    };
    let (total_mb, ..) = st.totals();
    let usage = if total_mb == 0 || finished {
        0.0
    } else {
        alloc_mb.max(0) as f64 * 100.0 / total_mb as f64
    };
    let am = a
        .attempts
        .last()
        .and_then(|t| t.container.as_ref())
        .and_then(|c| st.containers.get(c));
    let am_node = am.map(|c| st.nodes[c.node].id());
    let (tracking_ui, tracking_url) = match a.state {
        AppState::Accepted => ("UNASSIGNED", String::new()),
        AppState::Running => (
            "ApplicationMaster",
            format!("http://{}/proxy/{}/", sim.http_address, a.id),
        ),
        _ => (
            "History",
            format!("http://{}/cluster/app/{}", sim.http_address, a.id),
        ),
    };
    let progress = match a.state {
        AppState::Accepted => 0.0,
        AppState::Running => 10.0,
        _ => 100.0,
    };
    let finished_ms = a.finished_ms.unwrap_or(0);
    let elapsed = a.finished_ms.unwrap_or(now).saturating_sub(a.started_ms);
    let mut v = json!({
        "id": a.id,
        "user": a.user,
        "name": a.name,
        "queue": a.queue,
        "state": a.state.as_str(),
        "finalStatus": a.final_status,
        "progress": progress,
        "trackingUI": tracking_ui,
        "trackingUrl": tracking_url,
        "diagnostics": a.diagnostics,
        "clusterId": st.cluster_ts,
        "applicationType": a.app_type,
        "applicationTags": a.tags.join(","),
        "priority": a.priority,
        "startedTime": a.started_ms,
        "launchTime": a.launch_ms.unwrap_or(0),
        "finishedTime": finished_ms,
        "elapsedTime": elapsed,
    });
    let usage_fields = json!({
        "allocatedMB": alloc_mb,
        "allocatedVCores": alloc_vc,
        "reservedMB": 0,
        "reservedVCores": 0,
        "runningContainers": running,
        "memorySeconds": mem_s,
        "vcoreSeconds": vc_s,
        "queueUsagePercentage": usage,
        "clusterUsagePercentage": usage,
        "preemptedResourceMB": 0,
        "preemptedResourceVCores": 0,
        "numNonAMContainerPreempted": 0,
        "numAMContainerPreempted": 0,
        "preemptedMemorySeconds": 0,
        "preemptedVcoreSeconds": 0,
        "logAggregationStatus": "DISABLED",
        "unmanagedApplication": a.unmanaged,
        "amNodeLabelExpression": "",
        "timeouts": {"timeout": [{"type": "LIFETIME", "expiryTime": "UNLIMITED", "remainingTimeInSeconds": -1}]},
    });
    if let (Value::Object(m), Value::Object(u)) = (&mut v, usage_fields) {
        m.extend(u);
    }
    if let (Some(c), Some(node_id)) = (am, am_node) {
        v["amContainerLogs"] = json!(format!(
            "http://{}/sim/containers/{}/files/",
            sim.http_address, c.id
        ));
        v["amHostHttpAddress"] = json!(sim.http_address);
        v["amRPCAddress"] = json!("N/A");
        v["masterNodeId"] = json!(node_id);
    }
    v
}

async fn apps(AxState(sim): AxState<Arc<Sim>>, Query(q): Q) -> RmResult {
    let list_param = |k: &str| -> Option<Vec<String>> {
        q.get(k).map(|s| {
            s.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        })
    };
    let states = list_param("states").or_else(|| list_param("state"));
    const STATES: [&str; 8] = [
        "NEW",
        "NEW_SAVING",
        "SUBMITTED",
        "ACCEPTED",
        "RUNNING",
        "FINISHED",
        "FAILED",
        "KILLED",
    ];
    if let Some(s) = &states
        && let Some(bad) = s
            .iter()
            .find(|x| !STATES.contains(&x.to_ascii_uppercase().as_str()))
    {
        return Err(RmError::bad_request(format!(
            "Invalid application-state {bad} specified. It should be one of {}",
            STATES.join(", ")
        )));
    }
    let types = list_param("applicationTypes");
    let tags = list_param("applicationTags");
    let limit: Option<usize> = match q.get("limit") {
        Some(l) => Some(
            l.parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| RmError::bad_request("limit value must be greater then 0"))?,
        ),
        None => None,
    };
    let num = |k: &str| -> Result<Option<u64>, RmError> {
        match q.get(k) {
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| RmError::bad_request(format!("{k} must be a number, got {v:?}"))),
            None => Ok(None),
        }
    };
    let (sb, se, fb, fe) = (
        num("startedTimeBegin")?,
        num("startedTimeEnd")?,
        num("finishedTimeBegin")?,
        num("finishedTimeEnd")?,
    );
    let st = sim.lock();
    let mut list = Vec::new();
    for a in st.apps.values() {
        if let Some(s) = &states
            && !s.iter().any(|x| x.eq_ignore_ascii_case(a.state.as_str()))
        {
            continue;
        }
        if q.get("queue").is_some_and(|x| x != &a.queue)
            || q.get("user").is_some_and(|x| x != &a.user)
            || q.get("finalStatus")
                .is_some_and(|x| !x.eq_ignore_ascii_case(a.final_status))
        {
            continue;
        }
        if let Some(t) = &types
            && !t.iter().any(|x| x.eq_ignore_ascii_case(&a.app_type))
        {
            continue;
        }
        if let Some(t) = &tags
            && !t
                .iter()
                .any(|x| a.tags.iter().any(|y| y.eq_ignore_ascii_case(x)))
        {
            continue;
        }
        if sb.is_some_and(|b| a.started_ms < b) || se.is_some_and(|e| a.started_ms > e) {
            continue;
        }
        let fin = a.finished_ms.unwrap_or(0);
        if (fb.is_some() || fe.is_some())
            && (a.finished_ms.is_none()
                || fb.is_some_and(|b| fin < b)
                || fe.is_some_and(|e| fin > e))
        {
            continue;
        }
        list.push(app_json(&st, &sim, a));
        if limit.is_some_and(|l| list.len() >= l) {
            break;
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &wrap_list("apps", "app", list),
    ))
}

async fn app(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"app": app_json(&st, &sim, a)}),
    ))
}

async fn new_application(AxState(sim): AxState<Arc<Sim>>, Query(q): Q) -> RmResult {
    caller(&sim, &q, true)?;
    let mut st = sim.lock();
    let id = st.new_application_id();
    let (m, v) = (st.cfg.max_allocation_mb, st.cfg.max_allocation_vcores);
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "application-id": id,
            "maximum-resource-capability": {
                "memory": m,
                "vCores": v,
                "resourceInformations": {"resourceInformation": [
                    {"maximumAllocation": i64::MAX, "minimumAllocation": 0, "name": "memory-mb",
                     "resourceType": "COUNTABLE", "units": "Mi", "value": m},
                    {"maximumAllocation": i64::MAX, "minimumAllocation": 0, "name": "vcores",
                     "resourceType": "COUNTABLE", "units": "", "value": v},
                ]},
            },
        }),
    ))
}

/// Jersey map entries: `{"entry":[{"key":..,"value":..}]}` (a single entry
/// may come as an object rather than a one-element array).
fn entries(v: &Value) -> Vec<(&str, &Value)> {
    let e = &v["entry"];
    let items: Vec<&Value> = match e {
        Value::Array(a) => a.iter().collect(),
        Value::Object(_) => vec![e],
        _ => Vec::new(),
    };
    items
        .into_iter()
        .filter_map(|it| Some((it["key"].as_str()?, &it["value"])))
        .collect()
}

fn as_i64_lenient(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn parse_submission(v: &Value) -> Result<(String, Value), RmError> {
    let id = v["application-id"]
        .as_str()
        .ok_or_else(|| {
            RmError::bad_request("application-id is missing from the submission context")
        })?
        .to_string();
    check_app_id(&id)?;
    Ok((id, v.clone()))
}

fn parse_am_spec(spec: &Value) -> Result<AmSpec, RmError> {
    let cmds = &spec["commands"];
    let command = match &cmds["command"] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => match cmds {
            Value::String(s) => s.clone(),
            _ => String::new(),
        },
    };
    if command.trim().is_empty() {
        return Err(RmError::bad_request(
            "am-container-spec.commands.command is missing or empty; the AM container would have nothing to run",
        ));
    }
    let mut env = Vec::new();
    for (k, val) in entries(&spec["environment"]) {
        let val = match val {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(RmError::bad_request(format!(
                "am-container-spec.environment: invalid variable name {k:?}"
            )));
        }
        env.push((k.to_string(), val));
    }
    let mut resources = Vec::new();
    for (k, val) in entries(&spec["local-resources"]) {
        let url = val["resource"].as_str().ok_or_else(|| {
            RmError::bad_request(format!("local resource {k}: 'resource' (URL) is missing"))
        })?;
        resources.push(LocalResource {
            key: k.to_string(),
            url: url.to_string(),
            kind: val["type"].as_str().unwrap_or("FILE").to_ascii_uppercase(),
            visibility: val["visibility"]
                .as_str()
                .unwrap_or("APPLICATION")
                .to_string(),
            size: as_i64_lenient(&val["size"]).unwrap_or(0),
            timestamp: as_i64_lenient(&val["timestamp"]).unwrap_or(0),
            verify: true,
        });
    }
    Ok(AmSpec {
        command,
        env,
        resources,
    })
}

fn parse_tags(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => s
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect(),
        Value::Object(o) => match o.get("tag") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

async fn submit(
    AxState(sim): AxState<Arc<Sim>>,
    Query(q): Q,
    headers: HeaderMap,
    body: Bytes,
) -> RmResult {
    let user = caller(&sim, &q, true)?;
    require_json(&headers, "POST /ws/v1/cluster/apps")?;
    let v = parse_body(&body, "POST /ws/v1/cluster/apps")?;
    let (id, v) = parse_submission(&v)?;
    if v["unmanaged-AM"].as_bool() == Some(true) {
        return Err(RmError::bad_request(
            "unmanaged-AM is not supported by cruise-sim: an unmanaged AM needs the AM-RM RPC protocol, which is not REST",
        ));
    }
    let am = parse_am_spec(&v["am-container-spec"])?;
    let mem = as_i64_lenient(&v["resource"]["memory"]).unwrap_or(0).max(0) as u64;
    let vc = as_i64_lenient(&v["resource"]["vCores"]).unwrap_or(1).max(0) as u64;
    let mut st = sim.lock();
    let mem = if mem == 0 {
        st.cfg.min_allocation_mb
    } else {
        mem
    };
    let (mem, vc) = st.normalize(mem, vc);
    st.check_max(mem, vc).map_err(RmError::bad_request)?;
    let seq = st.take_issued_id(&id).map_err(RmError::bad_request)?;
    let global = st.cfg.am_max_attempts;
    let max_attempts = match as_i64_lenient(&v["max-app-attempts"]) {
        Some(n) if n > 0 && (n as u32) <= global => n as u32,
        _ => global,
    };
    let queue = v["queue"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    let app_type = v["application-type"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("YARN")
        .to_string();
    let mut app = App {
        id: id.clone(),
        seq,
        user: user.clone(),
        name: v["application-name"].as_str().unwrap_or("N/A").to_string(),
        queue: queue.clone(),
        app_type,
        tags: parse_tags(&v["application-tags"]),
        priority: as_i64_lenient(&v["priority"]).unwrap_or(0),
        unmanaged: false,
        am: Some(am),
        memory_mb: mem,
        vcores: vc,
        max_attempts,
        state: AppState::Accepted,
        final_status: "UNDEFINED",
        diagnostics: String::new(),
        started_ms: now_ms(),
        launch_ms: None,
        finished_ms: None,
        attempts: Vec::new(),
        service: None,
        next_container: 0,
        counted_failures: 0,
    };
    if queue != "default" && queue != "root.default" {
        // The RM accepts the submission and then rejects the app.
        app.state = AppState::Failed;
        app.final_status = "FAILED";
        app.finished_ms = Some(now_ms());
        app.diagnostics = format!(
            "Application {id} submitted by user {user} to unknown queue: {queue} (cruise-sim has only the queue 'default')"
        );
        st.apps.insert(id.clone(), app);
    } else {
        st.submit_app(app);
    }
    drop(st);
    sim.kick();
    let loc = format!("http://{}/ws/v1/cluster/apps/{id}", sim.http_address);
    Ok((
        StatusCode::ACCEPTED,
        [
            (header::LOCATION, loc),
            (header::CONTENT_LENGTH, "0".to_string()),
        ],
    )
        .into_response())
}

async fn app_state(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"state": a.state.as_str()}),
    ))
}

async fn put_app_state(
    AxState(sim): AxState<Arc<Sim>>,
    Path(id): Path<String>,
    Query(q): Q,
    headers: HeaderMap,
    body: Bytes,
) -> RmResult {
    let user = caller(&sim, &q, true)?;
    require_json(&headers, "PUT app state")?;
    let v = parse_body(&body, "PUT app state")?;
    let target = v["state"].as_str().unwrap_or("");
    if target != "KILLED" {
        return Err(RmError::bad_request(
            "Only 'KILLED' is allowed as a target state.",
        ));
    }
    let mut st = sim.lock();
    let current = find_app(&st, &id)?.state;
    if current.is_final() {
        return Ok(json_response(
            StatusCode::OK,
            &json!({"state": current.as_str()}),
        ));
    }
    st.kill_app(&id, &user);
    drop(st);
    sim.kick();
    let loc = format!("http://{}/ws/v1/cluster/apps/{id}/state", sim.http_address);
    let mut resp = json_response(StatusCode::ACCEPTED, &json!({"state": current.as_str()}));
    if let Ok(h) = HeaderValue::from_str(&loc) {
        resp.headers_mut().insert(header::LOCATION, h);
    }
    Ok(resp)
}

async fn app_queue(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    Ok(json_response(StatusCode::OK, &json!({"queue": a.queue})))
}

async fn put_app_queue(
    AxState(sim): AxState<Arc<Sim>>,
    Path(id): Path<String>,
    Query(q): Q,
    headers: HeaderMap,
    body: Bytes,
) -> RmResult {
    caller(&sim, &q, true)?;
    require_json(&headers, "PUT app queue")?;
    let v = parse_body(&body, "PUT app queue")?;
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    match v["queue"].as_str() {
        Some(qn) if qn == a.queue || qn == "root.default" => {
            Ok(json_response(StatusCode::OK, &json!({"queue": a.queue})))
        }
        Some(qn) => Err(RmError::bad_request(format!(
            "Failed to move application {id} to queue {qn}: cruise-sim has only the queue 'default'"
        ))),
        None => Err(RmError::bad_request("PUT app queue: body lacks 'queue'")),
    }
}

async fn app_priority(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"priority": a.priority}),
    ))
}

async fn put_app_priority(
    AxState(sim): AxState<Arc<Sim>>,
    Path(id): Path<String>,
    Query(q): Q,
    headers: HeaderMap,
    body: Bytes,
) -> RmResult {
    caller(&sim, &q, true)?;
    require_json(&headers, "PUT app priority")?;
    let v = parse_body(&body, "PUT app priority")?;
    let p = as_i64_lenient(&v["priority"])
        .ok_or_else(|| RmError::bad_request("PUT app priority: body lacks 'priority'"))?;
    let mut st = sim.lock();
    find_app(&st, &id)?;
    if let Some(a) = st.apps.get_mut(&id) {
        a.priority = p;
    }
    Ok(json_response(StatusCode::OK, &json!({"priority": p})))
}

// ---------- attempts ----------

fn attempt_json(st: &State, sim: &Sim, a: &App, n: usize) -> Value {
    let t = &a.attempts[n];
    let node = t.node.map(|i| st.nodes[i].id()).unwrap_or_default();
    let mut v = json!({
        "id": t.n,
        "appAttemptId": st.attempt_id(a.seq, t.n),
        "startTime": t.start_ms,
        "finishedTime": t.finish_ms.unwrap_or(0),
        "containerId": t.container.clone().unwrap_or_default(),
        "nodeHttpAddress": if t.node.is_some() { sim.http_address.clone() } else { String::new() },
        "nodeId": node,
        "logsLink": t.container.as_ref().map(|c| format!("http://{}/sim/containers/{c}/files/", sim.http_address)).unwrap_or_default(),
        "blacklistedNodes": "",
        "nodesBlacklistedBySystem": "",
        "appAttemptState": t.state,
    });
    if !t.diagnostics.is_empty() {
        v["diagnosticsInfo"] = json!(t.diagnostics);
    }
    v
}

async fn attempts(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    let list: Vec<Value> = (0..a.attempts.len())
        .map(|i| attempt_json(&st, &sim, a, i))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &wrap_list("appAttempts", "appAttempt", list),
    ))
}

fn find_attempt(st: &State, a: &App, attempt: &str) -> Result<usize, RmError> {
    a.attempts
        .iter()
        .position(|t| st.attempt_id(a.seq, t.n) == attempt || t.n.to_string() == attempt)
        .ok_or_else(|| RmError::not_found(format!("appattempt with id: {attempt} not found")))
}

async fn attempt(
    AxState(sim): AxState<Arc<Sim>>,
    Path((id, attempt)): Path<(String, String)>,
) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    let i = find_attempt(&st, a, &attempt)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"appAttempt": attempt_json(&st, &sim, a, i)}),
    ))
}

fn container_info(st: &State, sim: &Sim, c: &Container) -> Value {
    let node = st.nodes[c.node].id();
    let now = now_ms();
    json!({
        "containerId": c.id,
        "allocatedMB": c.memory_mb,
        "allocatedVCores": c.vcores,
        "assignedNodeId": node,
        "priority": 0,
        "startedTime": c.started_ms.unwrap_or(c.allocated_ms),
        "finishedTime": c.finished_ms.unwrap_or(0),
        "elapsedTime": c.finished_ms.unwrap_or(now).saturating_sub(c.allocated_ms),
        "logUrl": format!("http://{}/sim/containers/{}/files/", sim.http_address, c.id),
        "containerExitStatus": c.exit_status.unwrap_or(0),
        "containerState": match c.phase { Phase::Allocated => "NEW", Phase::Running => "RUNNING", Phase::Complete => "COMPLETE" },
        "nodeHttpAddress": format!("http://{}", sim.http_address),
        "nodeId": node,
        "diagnosticsInfo": c.diagnostics,
    })
}

fn attempt_live_containers<'a>(st: &'a State, a: &App, n: u32) -> Vec<&'a Container> {
    st.containers
        .values()
        .filter(|c| c.app_id == a.id && c.phase != Phase::Complete)
        .filter(|c| match &c.owner {
            Owner::Am { attempt, .. } => *attempt == n,
            Owner::Instance { .. } => true,
        })
        .collect()
}

async fn attempt_containers(
    AxState(sim): AxState<Arc<Sim>>,
    Path((id, attempt)): Path<(String, String)>,
) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    let i = find_attempt(&st, a, &attempt)?;
    let list = attempt_live_containers(&st, a, a.attempts[i].n)
        .into_iter()
        .map(|c| container_info(&st, &sim, c))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &wrap_list("containers", "container", list),
    ))
}

async fn attempt_container(
    AxState(sim): AxState<Arc<Sim>>,
    Path((id, attempt, cid)): Path<(String, String, String)>,
) -> RmResult {
    let st = sim.lock();
    let a = find_app(&st, &id)?;
    let i = find_attempt(&st, a, &attempt)?;
    let c = attempt_live_containers(&st, a, a.attempts[i].n)
        .into_iter()
        .find(|c| c.id == cid)
        .ok_or_else(|| RmError::not_found(format!("container with id: {cid} not found")))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"container": container_info(&st, &sim, c)}),
    ))
}
