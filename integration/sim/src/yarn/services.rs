//! YARN Services REST API (`/app/v1/services`): create a service from its
//! components, report it with live containers, flex components, decommission
//! instances, stop/start, change lifetime, destroy. Status codes and bodies
//! follow `ApiServer.java` (see PROTOCOLS.md §2); the ServiceMaster's work
//! (instances, restarts, flexing) is done by [`super::state::State`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::{Value, json};

use super::Sim;
use super::common::now_ms;
use super::rm::{caller, json_response};
use super::state::{
    App, AppState, Attempt, Component, InstPhase, RestartPolicy, Service, ServiceState, State,
};

/// A ServiceStatus answer.
fn status(code: StatusCode, diagnostics: impl Into<String>, extra: Value) -> Response {
    let mut v = json!({"diagnostics": diagnostics.into()});
    if let (Value::Object(m), Value::Object(x)) = (&mut v, extra) {
        m.extend(x);
    }
    json_response(code, &v)
}

fn bad(diag: impl Into<String>) -> Response {
    status(StatusCode::BAD_REQUEST, diag, json!({}))
}

fn not_found(name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        format!("Service {name} not found"),
        json!({"code": 404004}),
    )
}

/// Routes of the Services API.
pub(crate) fn routes() -> Router<Arc<Sim>> {
    Router::new()
        .route("/app/v1/services/version", get(version))
        .route("/app/v1/services", post(create))
        .route(
            "/app/v1/services/{name}",
            get(get_service).put(put_service).delete(delete_service),
        )
        .route(
            "/app/v1/services/{name}/components/{comp}",
            put(put_component),
        )
        .route(
            "/app/v1/services/{name}/component-instances",
            get(component_instances),
        )
}

async fn version() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"hadoop_version": super::HADOOP_VERSION}),
    )
}

/// A failed request body: JSON required (415 otherwise) and well-formed (400).
struct BodyError(Box<Response>);

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        *self.0
    }
}

fn json_body(headers: &HeaderMap, body: &Bytes, what: &str) -> Result<Value, BodyError> {
    super::rm::require_json(headers, what).map_err(|e| BodyError(Box::new(e.into_response())))?;
    serde_json::from_slice(body).map_err(|e| {
        BodyError(Box::new(bad(format!(
            "{what}: body is not valid JSON: {e}"
        ))))
    })
}

fn valid_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.ends_with('-')
}

fn env_map(conf: &Value) -> Vec<(String, String)> {
    match conf["env"].as_object() {
        Some(m) => m
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_str()
                        .map(String::from)
                        .unwrap_or_else(|| v.to_string()),
                )
            })
            .collect(),
        None => Vec::new(),
    }
}

/// A component artifact: only `TARBALL` runs here (unpacked into `lib/` of
/// each container, as `TarballProviderService` does); `DOCKER` (the default
/// type) and `SERVICE` are refused.
fn parse_artifact(a: &Value) -> Result<Option<String>, String> {
    if a.is_null() {
        return Ok(None);
    }
    let ty = a["type"].as_str().unwrap_or("DOCKER");
    let id = a["id"].as_str().unwrap_or("").trim();
    match ty {
        "TARBALL" if !id.is_empty() => Ok(Some(id.to_string())),
        "TARBALL" => Err("artifact id (the tarball's URI) is required".into()),
        other => Err(format!(
            "artifact {a} of type {other} is not supported by cruise-sim (no Docker, no nested services); \
             use a TARBALL artifact or leave artifact out and give a launch_command"
        )),
    }
}

fn parse_memory(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// Validate a Service definition and build its components
/// (`ServiceApiUtil.validateAndResolveService`, reduced to what runs here).
fn parse_service(st: &State, v: &Value) -> Result<(String, Vec<Component>, Option<u64>), String> {
    let name = v["name"].as_str().unwrap_or("");
    if name.is_empty() {
        return Err("Service name cannot be empty".into());
    }
    if !valid_dns_label(name, 63) {
        return Err(format!(
            "Invalid format for service name {name}: it must be a lowercase DNS label \
             (a-z, 0-9, '-', starting with a letter, at most 63 characters)"
        ));
    }
    if v["version"].as_str().is_none_or(str::is_empty) {
        return Err(format!(
            "Version of service {name} is either empty or not provided"
        ));
    }
    // The service-level artifact is the default of every component.
    let svc_artifact =
        parse_artifact(&v["artifact"]).map_err(|e| format!("Service {name}: {e}"))?;
    let comps = v["components"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("No component specified for service {name}"))?;
    let svc_resource = &v["resource"];
    let svc_env = env_map(&v["configuration"]);
    let mut out: Vec<Component> = Vec::new();
    for c in comps {
        let cname = c["name"].as_str().unwrap_or("");
        if !valid_dns_label(cname, 44) {
            return Err(format!(
                "Invalid format for component name {cname:?}: it must be a lowercase DNS label of at most 44 characters"
            ));
        }
        if out.iter().any(|x| x.name == cname) {
            return Err(format!("Component name {cname} must be unique"));
        }
        if c.get("containers").is_some_and(|x| !x.is_null()) {
            return Err(format!(
                "Component {cname}: 'containers' is output only and must not be submitted"
            ));
        }
        let artifact =
            match parse_artifact(&c["artifact"]).map_err(|e| format!("Component {cname}: {e}"))? {
                Some(a) => Some(a),
                None => svc_artifact.clone(),
            };
        let launch = c["launch_command"]
            .as_str()
            .unwrap_or("")
            .trim()
            .to_string();
        if launch.is_empty() {
            return Err(format!(
                "launch_command is required for component {cname} (no DOCKER artifact)"
            ));
        }
        let n = match &c["number_of_containers"] {
            Value::Number(n) if n.as_i64().is_some_and(|x| x >= 0) => n.as_u64().unwrap_or(0),
            _ => {
                return Err(format!(
                    "Invalid no of containers specified for component {cname}"
                ));
            }
        };
        let res = if c["resource"].is_object() {
            &c["resource"]
        } else {
            svc_resource
        };
        if !res.is_object() {
            return Err(format!(
                "Resource of component {cname} is not specified (and the service has no default)"
            ));
        }
        if res.get("profile").is_some_and(|p| !p.is_null()) {
            return Err(format!(
                "Component {cname}: resource profiles are not supported by cruise-sim; give cpus and memory"
            ));
        }
        let mem = parse_memory(&res["memory"])
            .filter(|m| *m > 0)
            .ok_or_else(|| {
                format!(
                    "Invalid memory specified for component {cname}: {}",
                    res["memory"]
                )
            })?;
        let cpus = res["cpus"].as_u64().filter(|c| *c > 0).ok_or_else(|| {
            format!(
                "Invalid cpus specified for component {cname}: {}",
                res["cpus"]
            )
        })?;
        let (mem, cpus) = st.normalize(mem, cpus);
        st.check_max(mem, cpus)
            .map_err(|e| format!("Component {cname}: {e}"))?;
        let restart = match c["restart_policy"].as_str().unwrap_or("ALWAYS") {
            "ALWAYS" => RestartPolicy::Always,
            "ON_FAILURE" => RestartPolicy::OnFailure,
            "NEVER" => RestartPolicy::Never,
            other => {
                return Err(format!(
                    "Invalid restart_policy {other:?} for component {cname}"
                ));
            }
        };
        let mut env: BTreeMap<String, String> = svc_env.iter().cloned().collect();
        env.extend(env_map(&c["configuration"]));
        let decommissioned: Vec<String> = c["decommissioned_instances"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Component {
            name: cname.to_string(),
            spec: c.clone(),
            launch_command: launch,
            artifact,
            env: env.into_iter().collect(),
            memory_mb: mem,
            vcores: cpus,
            restart,
            desired: n,
            counter: 0,
            instances: BTreeMap::new(),
            decommissioned,
        });
    }
    let lifetime = match &v["lifetime"] {
        Value::Number(n) if n.as_i64().is_some_and(|x| x > 0) => n.as_u64(),
        _ => None,
    };
    Ok((name.to_string(), out, lifetime))
}

/// Start (or restart) a service: a new YARN application and fresh instances.
fn launch_service(st: &mut State, name: &str) -> Option<String> {
    let app_id = st.new_application_id();
    let seq = st.take_issued_id(&app_id).ok()?;
    let svc = st.services.get_mut(name)?;
    svc.app_id = app_id.clone();
    svc.state = ServiceState::Started;
    svc.launch_ms = now_ms();
    let user = svc.user.clone();
    let queue = svc.spec["queue"].as_str().unwrap_or("default").to_string();
    let comps: Vec<(String, u64)> = svc
        .components
        .iter_mut()
        .map(|c| {
            c.instances.clear();
            c.counter = 0;
            (c.name.clone(), c.desired)
        })
        .collect();
    let now = now_ms();
    st.apps.insert(
        app_id.clone(),
        App {
            id: app_id.clone(),
            seq,
            user,
            name: name.to_string(),
            queue,
            app_type: "yarn-service".into(),
            tags: vec![format!("name: {name}")],
            priority: 0,
            unmanaged: false,
            am: None,
            memory_mb: 0,
            vcores: 0,
            max_attempts: 1,
            state: AppState::Running,
            final_status: "UNDEFINED",
            diagnostics: String::new(),
            started_ms: now,
            launch_ms: Some(now),
            finished_ms: None,
            attempts: vec![Attempt {
                n: 1,
                container: None,
                node: None,
                start_ms: now,
                finish_ms: None,
                state: "RUNNING",
                diagnostics: String::new(),
            }],
            service: Some(name.to_string()),
            // Container 1 of a real service app is its ServiceMaster.
            next_container: 1,
            counted_failures: 0,
        },
    );
    for (c, n) in comps {
        st.add_instances(name, &c, n);
    }
    Some(app_id)
}

async fn create(
    AxState(sim): AxState<Arc<Sim>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let user = match caller(&sim, &q, true) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let v = match json_body(&headers, &body, "POST /app/v1/services") {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let mut st = sim.lock();
    let (name, components, lifetime) = match parse_service(&st, &v) {
        Ok(x) => x,
        Err(e) => return bad(e),
    };
    if st.services.contains_key(&name) {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Service name {name} is already taken."),
            json!({}),
        );
    }
    let save_only = v["state"].as_str() == Some("STOPPED");
    st.services.insert(
        name.clone(),
        Service {
            name: name.clone(),
            spec: v.clone(),
            user,
            app_id: String::new(),
            state: ServiceState::Stopped,
            launch_ms: 0,
            components,
            lifetime_deadline: None,
        },
    );
    if save_only {
        let ver = v["version"].as_str().unwrap_or("");
        return status(
            StatusCode::ACCEPTED,
            format!("Service {name} version {ver} saved."),
            json!({"state": "ACCEPTED", "uri": format!("/v1/services/{name}")}),
        );
    }
    let Some(app_id) = launch_service(&mut st, &name) else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to launch service {name}"),
            json!({}),
        );
    };
    if let (Some(l), Some(s)) = (lifetime, st.services.get_mut(&name)) {
        s.lifetime_deadline = Some(Instant::now() + Duration::from_secs(l));
    }
    drop(st);
    sim.kick();
    status(
        StatusCode::ACCEPTED,
        format!("Application ID: {app_id}"),
        json!({"state": "ACCEPTED", "uri": format!("/v1/services/{name}")}),
    )
}

fn component_state(c: &Component) -> &'static str {
    let ready = c
        .instances
        .values()
        .filter(|i| {
            i.phase == InstPhase::Ready
                || (c.restart != RestartPolicy::Always
                    && matches!(i.phase, InstPhase::Succeeded | InstPhase::Failed))
        })
        .count() as u64;
    if ready == c.desired {
        "STABLE"
    } else {
        "FLEXING"
    }
}

fn service_json(st: &State, s: &Service) -> Value {
    let mut v = s.spec.clone();
    let running: usize = s
        .components
        .iter()
        .map(|c| {
            c.instances
                .values()
                .filter(|i| i.phase == InstPhase::Ready)
                .count()
        })
        .sum();
    v["state"] = json!(s.state.as_str());
    if !s.app_id.is_empty() {
        v["id"] = json!(s.app_id);
        v["launch_time"] = json!(s.launch_ms);
    }
    v["number_of_running_containers"] = json!(running);
    if v["lifetime"].is_null() {
        v["lifetime"] = json!(-1);
    }
    if !v["configuration"].is_object() {
        v["configuration"] = json!({"properties": {}, "env": {}, "files": []});
    }
    if v["queue"].is_null() {
        v["queue"] = json!("default");
    }
    v["components"] = Value::Array(
        s.components
            .iter()
            .map(|c| {
                let mut cv = c.spec.clone();
                cv["number_of_containers"] = json!(c.desired);
                cv["restart_policy"] = json!(c.restart.as_str());
                cv["state"] = json!(if s.state == ServiceState::Stopped {
                    "STOPPED"
                } else {
                    component_state(c)
                });
                cv["decommissioned_instances"] = json!(c.decommissioned);
                if !cv["configuration"].is_object() {
                    cv["configuration"] = json!({"properties": {}, "env": {}, "files": []});
                }
                let containers: Vec<Value> = c
                    .instances
                    .values()
                    .filter_map(|i| {
                        let cid = i.container.as_ref().or(match i.phase {
                            InstPhase::Succeeded | InstPhase::Failed | InstPhase::Waiting => {
                                i.last_container.as_ref()
                            }
                            _ => None,
                        })?;
                        let live = st.containers.get(cid);
                        let mut o = json!({
                            "id": cid,
                            "ip": "127.0.0.1",
                            "hostname": format!("{}.{}.{}.{}", i.name, s.name, s.user, st.cfg.dns_domain),
                            "bare_host": live.map(|x| st.nodes[x.node].host.clone()).unwrap_or_else(|| "127.0.0.1".into()),
                            "state": i.phase.container_state(),
                            "component_instance_name": i.name,
                            "resource": {"cpus": c.vcores, "memory": c.memory_mb.to_string()},
                            "privileged_container": false,
                        });
                        if let Some(t) = i.launch_ms {
                            o["launch_time"] = json!(t);
                        }
                        // Not in YARN's schema (clients ignore unknown fields):
                        // how a terminal instance's container ended, or how
                        // the previous container of a restarted one did.
                        if let Some((code, diag)) = &i.last_exit {
                            let terminal = matches!(
                                i.phase,
                                InstPhase::Succeeded | InstPhase::Failed | InstPhase::Waiting
                            );
                            let (k_code, k_diag) = if terminal {
                                ("exit_status", "diagnostics")
                            } else {
                                ("previous_exit_status", "previous_diagnostics")
                            };
                            o[k_code] = json!(code);
                            o[k_diag] = json!(diag);
                            o["restarts"] = json!(i.restarts);
                        }
                        Some(o)
                    })
                    .collect();
                cv["containers"] = Value::Array(containers);
                cv
            })
            .collect(),
    );
    v
}

async fn get_service(AxState(sim): AxState<Arc<Sim>>, Path(name): Path<String>) -> Response {
    let st = sim.lock();
    match st.services.get(&name) {
        Some(s) => json_response(StatusCode::OK, &service_json(&st, s)),
        None => not_found(&name),
    }
}

async fn component_instances(
    AxState(sim): AxState<Arc<Sim>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let st = sim.lock();
    let Some(s) = st.services.get(&name) else {
        return not_found(&name);
    };
    let v = service_json(&st, s);
    let mut out = Vec::new();
    for c in v["components"].as_array().into_iter().flatten() {
        let cname = c["name"].as_str().unwrap_or("");
        if q.get("componentName").is_some_and(|n| n != cname) {
            continue;
        }
        for ct in c["containers"].as_array().into_iter().flatten() {
            if q.get("containerState")
                .is_some_and(|s| Some(s.as_str()) != ct["state"].as_str())
            {
                continue;
            }
            let mut ct = ct.clone();
            ct["component_name"] = json!(cname);
            out.push(ct);
        }
    }
    json_response(StatusCode::OK, &Value::Array(out))
}

async fn put_service(
    AxState(sim): AxState<Arc<Sim>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = caller(&sim, &q, true) {
        return e.into_response();
    }
    let v = match json_body(&headers, &body, "PUT /app/v1/services/{name}") {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let resp = {
        let mut st = sim.lock();
        if !st.services.contains_key(&name) {
            return not_found(&name);
        }
        update_service(&mut st, &name, &v)
    };
    sim.kick();
    resp
}

/// `ApiServer.updateService`, in the order it checks the body.
fn update_service(st: &mut State, name: &str, v: &Value) -> Response {
    let state = v["state"].as_str().unwrap_or("");
    let running = st
        .services
        .get(name)
        .is_some_and(|s| s.state != ServiceState::Stopped);
    match state {
        "FLEX" => {
            let Some(comps) = v["components"].as_array() else {
                return bad("FLEX needs components with number_of_containers");
            };
            if !running {
                return bad(format!("Service {name} is not running"));
            }
            let mut plan = Vec::new();
            for c in comps {
                let cname = c["name"].as_str().unwrap_or("");
                let Some(n) = c["number_of_containers"].as_i64().filter(|n| *n >= 0) else {
                    return bad(format!(
                        "Invalid number of containers specified for component {cname}"
                    ));
                };
                if let Err(e) = check_flexible(st, name, cname) {
                    return bad(e);
                }
                plan.push((cname.to_string(), n as u64));
            }
            for (c, n) in plan {
                st.flex(name, &c, n);
            }
            return status(
                StatusCode::ACCEPTED,
                format!("Service {name} is successfully flexed."),
                json!({"state": "ACCEPTED"}),
            );
        }
        "STOPPED" => {
            if !running {
                return bad(format!("Service {name} is already stopped"));
            }
            st.stop_service(name);
            return status(
                StatusCode::OK,
                format!("Successfully stopped service {name}"),
                json!({}),
            );
        }
        "STARTED" => {
            if running {
                return bad(format!("Service {name} is already running"));
            }
            return match launch_service(st, name) {
                Some(app) => status(
                    StatusCode::OK,
                    format!("Service {name} is successfully started with ApplicationId: {app}"),
                    json!({"state": "ACCEPTED"}),
                ),
                None => status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Failed to start service {name}"),
                    json!({}),
                ),
            };
        }
        "UPGRADING" | "UPGRADING_AUTO_FINALIZE" | "EXPRESS_UPGRADING" | "CANCEL_UPGRADING" => {
            return status(
                StatusCode::NOT_IMPLEMENTED,
                format!("Service upgrade ({state}) is not implemented by cruise-sim"),
                json!({}),
            );
        }
        _ => {}
    }
    if let Some(l) = v["lifetime"].as_i64().filter(|l| *l > 0) {
        if let Some(s) = st.services.get_mut(name) {
            s.lifetime_deadline = Some(Instant::now() + Duration::from_secs(l as u64));
            s.spec["lifetime"] = json!(l);
        }
        return status(
            StatusCode::OK,
            format!("Service ({name})'s lifeTime is updated to {l} seconds."),
            json!({}),
        );
    }
    let decom: Vec<(String, Vec<String>)> = v["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let list: Vec<String> = c["decommissioned_instances"]
                .as_array()?
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect();
            (!list.is_empty()).then(|| (c["name"].as_str().unwrap_or("").to_string(), list))
        })
        .collect();
    if !decom.is_empty() {
        if !running {
            return bad(format!("Service {name} is not running"));
        }
        // Validate everything before changing anything.
        for (cname, list) in &decom {
            let known = st
                .services
                .get(name)
                .is_some_and(|s| s.components.iter().any(|c| &c.name == cname));
            if !known {
                return bad(format!(
                    "Component {cname} does not exist in service {name}"
                ));
            }
            for inst in list {
                let ok = inst
                    .strip_prefix(cname.as_str())
                    .and_then(|r| r.strip_prefix('-'))
                    .is_some_and(|n| n.parse::<u64>().is_ok());
                if !ok {
                    return bad(format!(
                        "Decommissioned instance {inst} does not match the component {cname} (expected {cname}-<number>)"
                    ));
                }
            }
        }
        for (cname, list) in decom {
            for inst in list {
                decommission(st, name, &cname, &inst);
            }
        }
        st.update_service_state(name);
        return status(
            StatusCode::ACCEPTED,
            format!("Service {name} has successfully decommissioned instances."),
            json!({}),
        );
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `DecommissionInstanceTransition`: record the name, drop the instance and
/// one from the desired count.
fn decommission(st: &mut State, service: &str, cname: &str, inst: &str) {
    let Some(comp) = st
        .services
        .get_mut(service)
        .and_then(|s| s.component_mut(cname))
    else {
        return;
    };
    if comp.decommissioned.iter().any(|d| d == inst) {
        return;
    }
    comp.decommissioned.push(inst.to_string());
    let Some(idx) = comp
        .instances
        .values()
        .find(|i| i.name == inst)
        .map(|i| i.idx)
    else {
        return;
    };
    comp.desired = comp.desired.saturating_sub(1);
    st.remove_instance(
        service,
        cname,
        idx,
        "Container released by application (instance decommissioned)",
    );
}

fn check_flexible(st: &State, service: &str, cname: &str) -> Result<(), String> {
    let comp = st
        .services
        .get(service)
        .and_then(|s| s.components.iter().find(|c| c.name == cname))
        .ok_or_else(|| format!("Component {cname} does not exist in service {service}"))?;
    if comp.restart != RestartPolicy::Always {
        return Err(format!(
            "Flexing is not supported for components which have restart_policy=ON_FAILURE/NEVER \
             (component {cname} has {})",
            comp.restart.as_str()
        ));
    }
    Ok(())
}

async fn put_component(
    AxState(sim): AxState<Arc<Sim>>,
    Path((name, comp)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = caller(&sim, &q, true) {
        return e.into_response();
    }
    let v = match json_body(
        &headers,
        &body,
        "PUT /app/v1/services/{name}/components/{comp}",
    ) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if let Some(n) = v["name"].as_str()
        && n != comp
    {
        return bad(format!(
            "Component name in the request object ({n}) does not match that in the URI path ({comp})"
        ));
    }
    let Some(n) = v["number_of_containers"].as_i64().filter(|n| *n >= 0) else {
        return bad(format!(
            "Invalid number of containers specified {}",
            v["number_of_containers"]
        ));
    };
    let resp = {
        let mut st = sim.lock();
        let Some(svc) = st.services.get(&name) else {
            return not_found(&name);
        };
        if svc.state == ServiceState::Stopped {
            return bad(format!("Service {name} is not running"));
        }
        if let Err(e) = check_flexible(&st, &name, &comp) {
            return bad(e);
        }
        let before = st.flex(&name, &comp, n as u64).unwrap_or(0);
        status(
            StatusCode::OK,
            format!("Updating component ({comp}) size from {before} to {n}"),
            json!({}),
        )
    };
    sim.kick();
    resp
}

async fn delete_service(
    AxState(sim): AxState<Arc<Sim>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = caller(&sim, &q, true) {
        return e.into_response();
    }
    {
        let mut st = sim.lock();
        if !st.services.contains_key(&name) {
            // As Hadoop 3.4's ApiServer answers it (checked against a real
            // RM): 400 with the diagnostics only.
            return bad(format!("Service {name} doesn't exist"));
        }
        st.stop_service(&name);
        st.services.remove(&name);
    }
    sim.kick();
    status(
        StatusCode::OK,
        format!("Successfully destroyed service {name}"),
        json!({}),
    )
}
