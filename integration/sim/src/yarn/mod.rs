//! `cruise-sim yarn`: a YARN ResourceManager that speaks the RM REST API
//! (`/ws/v1/cluster`) and the YARN Services REST API (`/app/v1/services`) on
//! loopback, and really runs the containers it allocates as local processes.
//!
//! # What it simulates
//! - N NodeManagers (`--nodes`, `--node-memory-mb`, `--node-vcores`), ids
//!   `127.0.0.1:45454`, `127.0.0.1:45455`, ...; a capacity scheduler with the
//!   single queue `default`; requests are normalized up to a multiple of
//!   `--min-allocation-mb` and capped by `--max-allocation-mb/-vcores`.
//! - Applications submitted with `POST /ws/v1/cluster/apps`: the AM container's
//!   local resources are localized (WebHDFS `GETFILESTATUS` + `OPEN`, or
//!   `file://`; length and modification time must equal `size` and
//!   `timestamp`), then its command runs through a NodeManager-style
//!   `launch_container.sh` with `{{VAR}}`, `<LOG_DIR>` and `<CPS>` expanded and
//!   the NM environment (`CONTAINER_ID`, `NM_HOST`, `NM_PORT`,
//!   `NM_HTTP_PORT`, `LOCAL_DIRS`, `LOG_DIRS`, `USER`, `PWD`,
//!   `APP_SUBMIT_TIME_ENV`, `MAX_APP_ATTEMPTS`, ...). Exit 0 finishes the app
//!   (FINISHED/SUCCEEDED); another exit fails the attempt and a new attempt
//!   starts until `max-app-attempts` (capped by `--am-max-attempts`) is used
//!   up, then FAILED with YARN-style diagnostics (exit code, stderr tail).
//!   Preempted (-102) and aborted (-100) AM containers do not count.
//!   The simulated AM has no AM–RM RPC, so "exit 0" stands for "unregistered
//!   with SUCCEEDED", and an AM that ends its job failed gets another
//!   attempt, which real YARN does not give after a FAILED unregister. A new
//!   attempt's AM container has the attempt's number in its id
//!   (`container_<ts>_<seq>_<attempt>_<n>`) and the same application
//!   directory (`LOCAL_DIRS`). Without that RPC an AM cannot allocate
//!   containers of its own, so a failed attempt leaves none for YARN to
//!   kill (`keep-containers-across-application-attempts` has nothing to
//!   keep); the containers of a YARN service belong to the service's own
//!   application and outlive the attempt.
//! - YARN services: each component instance `<component>-<n>` gets a
//!   container running `launch_command` with the component's
//!   `configuration.env` (service-level env merged under it) and the
//!   ServiceMaster's `${TOKEN}` substitutions; instances restart per
//!   `restart_policy` after `--service-restart-delay-ms`; flexing down
//!   removes the newest instances; decommissioned names are never reused.
//!
//! Each container runs in `<work-dir>/yarn/<app>/<container>/` (its `PWD`),
//! with `LOG_DIR` = `<that>/logs`; the process's own stdout/stderr go to
//! `stdout`/`stderr` in the working directory. Every container is a process
//! group; SIGINT/SIGTERM to the simulator kills them all before it exits.
//!
//! # Admin endpoints (not part of YARN)
//! - `GET /sim/capacity` → `{"nodes", "node_memory_mb", "node_vcores",
//!   "total_mb", "total_vcores", "used_mb", "used_vcores"}`.
//! - `PUT /sim/capacity` with any of `{"nodes": n, "node_memory_mb": m,
//!   "node_vcores": c}` (JSON). Nodes beyond `n` become DECOMMISSIONED and
//!   their containers are released with exit status -100 (ABORTED); nodes
//!   that shrink preempt their newest containers until the rest fit, exit
//!   status -102 (PREEMPTED); diagnostics say which node and why. Answers the
//!   new capacity plus `"killed_containers": [...]`.
//! - `POST /sim/decommission` with `{"node": "host:port", "timeout_secs":
//!   n?}` (JSON): the node becomes DECOMMISSIONING (listed so by `GET
//!   /nodes?states=DECOMMISSIONING`, with `decommissioningTimeout` when
//!   given); nothing new is placed on it, its containers run on (the
//!   simulator does not end them at the timeout). `--distinct-node-hosts`
//!   gives nodes hosts of their own (`127.0.0.<n+1>`) so that a node's
//!   containers can be told by host.
//! - `GET /sim/containers` → every container ever allocated (live and
//!   completed) with pid, state, exit status, diagnostics and directories.
//! - `GET /sim/containers/{id}/files/{name}` → a file from the container's
//!   working directory (e.g. `stdout`, `stderr`, `logs/stderr`); `.../files/`
//!   lists them.
//!
//! Every node's web address (`nodeHTTPAddress`, an attempt's
//! `nodeHttpAddress`) is this server, which also answers the NodeManager's
//! `GET /ws/v1/node/containerlogs/{container}/{file}` with a file of the
//! container's log directory (`<LOG_DIR>`), as plain text framed as a
//! Hadoop 3 NodeManager frames it: a header (`Container: <id> on <node>`,
//! `LogAggregationType: LOCAL`, a rule of `=`, `LogType:<file>`,
//! `LogLength:<n>`, `LogContents:`; the real one also has
//! `LogLastModifiedTime`) and a trailer (`End of LogType:<file>.` and a line
//! of 77 `*`).
//!
//! `--ready-file PATH` receives `{"url", "rm_url", "services_url",
//! "admin_url", "work_dir", "pid"}` once the listener is bound.

pub(crate) mod common;
mod localize;
mod rm;
mod services;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use common::{Running, now_ms};
use rm::json_response;
use state::{CapacityChange, Config, Finish, LaunchJob, NodeState, Owner, Phase, State};

/// Hadoop version the simulator claims to be.
pub(crate) const HADOOP_VERSION: &str = "3.3.6";

/// Command-line arguments of `cruise-sim yarn` (boxed: the options are large).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    opts: Box<Options>,
}

/// The options of `cruise-sim yarn`.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Number of NodeManagers.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Memory of each node, MB.
    #[arg(long, default_value_t = 8192)]
    node_memory_mb: u64,
    /// Virtual cores of each node.
    #[arg(long, default_value_t = 8)]
    node_vcores: u64,
    /// yarn.scheduler.minimum-allocation-mb: requests are rounded up to a multiple of it.
    #[arg(long, default_value_t = 1024)]
    min_allocation_mb: u64,
    /// yarn.scheduler.maximum-allocation-mb (default: the node memory).
    #[arg(long)]
    max_allocation_mb: Option<u64>,
    /// yarn.scheduler.maximum-allocation-vcores (default: the node vcores).
    #[arg(long)]
    max_allocation_vcores: Option<u64>,
    /// yarn.resourcemanager.am.max-attempts (global cap on max-app-attempts).
    #[arg(long, default_value_t = 2)]
    am_max_attempts: u32,
    /// Directory for container working directories (default: a new directory under the system temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Write JSON with the base URLs here once listening.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// User for requests without ?user.name= (Hadoop's static web user).
    #[arg(long, default_value = "dr.who")]
    default_user: String,
    /// Answer 401 to writes that carry no ?user.name=.
    #[arg(long)]
    require_user: bool,
    /// WebHDFS base URL (http://host:port) for hdfs:// resources; by default the URL's own host:port is used.
    #[arg(long)]
    webhdfs: Option<String>,
    /// Grace period between SIGTERM and SIGKILL when killing a container, ms.
    #[arg(long, default_value_t = 2000)]
    kill_grace_ms: u64,
    /// Delay before a service instance's container is relaunched, ms.
    #[arg(long, default_value_t = 2000)]
    service_restart_delay_ms: u64,
    /// Registry DNS domain used in service container hostnames.
    #[arg(long, default_value = "cruise-sim.local")]
    dns_domain: String,
    /// Give each node a host of its own (127.0.0.1, 127.0.0.2, ...), so a
    /// node's containers can be told apart by host.
    #[arg(long)]
    distinct_node_hosts: bool,
}

/// The running simulator: state, tasks and the HTTP client for localization.
pub(crate) struct Sim {
    state: Mutex<State>,
    tracker: TaskTracker,
    http: reqwest::Client,
    kill_grace: Duration,
    webhdfs: Option<String>,
    pub(crate) http_address: String,
    pub(crate) default_user: String,
    pub(crate) require_user: bool,
}

impl Sim {
    /// Lock the state (a poisoned lock is still usable: state is only
    /// mutated through methods that leave it consistent).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run the scheduler and start whatever it allocated.
    pub(crate) fn kick(self: &Arc<Self>) {
        let jobs = self.lock().schedule();
        for job in jobs {
            let sim = Arc::clone(self);
            self.tracker.spawn(async move { sim.run_job(job).await });
        }
    }

    async fn run_job(self: Arc<Self>, job: LaunchJob) {
        let cid = job.container_id.clone();
        let finish = self.launch(job).await;
        self.lock().container_finished(&cid, finish);
        self.kick();
    }

    async fn launch(&self, job: LaunchJob) -> Finish {
        let failed = |what: String| Finish::LaunchFailed {
            exit_status: state::exit::INVALID,
            diagnostics: what,
        };
        if let Err(e) = std::fs::create_dir_all(&job.log_dir) {
            return failed(format!(
                "Failed to create container directory {}: {e}",
                job.log_dir.display()
            ));
        }
        if !job.resources.is_empty() {
            tokio::select! {
                r = localize::localize(&self.http, self.webhdfs.as_deref(), &job.user, &job.resources, &job.cwd) => {
                    if let Err(diag) = r {
                        return failed(diag);
                    }
                }
                _ = job.kill.cancelled() => return Finish::NeverStarted,
            }
        }
        if job.kill.is_cancelled() {
            return Finish::NeverStarted;
        }
        let script = job.cwd.join("launch_container.sh");
        if let Err(e) = std::fs::write(&script, &job.script) {
            return failed(format!("Failed to write {}: {e}", script.display()));
        }
        let spec = common::ProcessSpec {
            program: common::Program::Exec {
                path: "/bin/bash".into(),
                args: vec![script.display().to_string()],
            },
            env: Vec::new(),
            cwd: job.cwd.clone(),
            stdout: job.cwd.join("stdout"),
            stderr: job.cwd.join("stderr"),
        };
        let run = match Running::spawn(&spec) {
            Ok(r) => r,
            Err(e) => {
                return Finish::LaunchFailed {
                    exit_status: 1,
                    diagnostics: format!(
                        "Exception from container-launch.\nContainer id: {}\n{e}",
                        job.container_id
                    ),
                };
            }
        };
        self.lock().container_started(&job.container_id, run.pid());
        match run.supervise(job.kill.clone(), self.kill_grace).await {
            Ok(out) => Finish::Exited(out),
            Err(e) => failed(format!("Lost track of container process: {e}")),
        }
    }
}

/// Entry point of `cruise-sim yarn`.
pub fn main(args: Args) -> anyhow::Result<()> {
    common::init_tracing();
    let rt = common::runtime().context("starting the tokio runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let args = *args.opts;
    if args.node_memory_mb == 0 || args.node_vcores == 0 {
        anyhow::bail!("--node-memory-mb and --node-vcores must be positive");
    }
    let work_dir = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("cruise-sim-yarn-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating --work-dir {}", work_dir.display()))?;
    let work_dir = work_dir
        .canonicalize()
        .with_context(|| format!("resolving --work-dir {}", work_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding --bind {}", args.bind))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let http_address = addr.to_string();

    let cfg = Config {
        work_dir: work_dir.clone(),
        node_memory_mb: args.node_memory_mb,
        node_vcores: args.node_vcores,
        min_allocation_mb: args.min_allocation_mb.max(1),
        max_allocation_mb: args.max_allocation_mb.unwrap_or(args.node_memory_mb),
        max_allocation_vcores: args.max_allocation_vcores.unwrap_or(args.node_vcores),
        am_max_attempts: args.am_max_attempts.max(1),
        service_restart_delay: Duration::from_millis(args.service_restart_delay_ms),
        dns_domain: args.dns_domain.clone(),
        distinct_node_hosts: args.distinct_node_hosts,
        http_address: http_address.clone(),
    };
    let root_kill = CancellationToken::new();
    let sim = Arc::new(Sim {
        state: Mutex::new(State::new(cfg, args.nodes, root_kill.clone())),
        tracker: TaskTracker::new(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .context("building the HTTP client for localization")?,
        kill_grace: Duration::from_millis(args.kill_grace_ms),
        webhdfs: args.webhdfs.clone(),
        http_address: http_address.clone(),
        default_user: args.default_user.clone(),
        require_user: args.require_user,
    });

    let app = Router::new()
        .merge(rm::routes())
        .merge(services::routes())
        .route("/sim/capacity", get(get_capacity).put(put_capacity))
        .route("/sim/decommission", post(post_decommission))
        .route("/sim/containers", get(list_containers))
        .route("/sim/containers/{id}/files/", get(list_files))
        .route("/sim/containers/{id}/files/{*name}", get(get_file))
        .route(
            "/ws/v1/node/containerlogs/{id}/{name}",
            get(get_container_log),
        )
        .with_state(Arc::clone(&sim));

    let mut signals =
        common::ShutdownSignals::install().context("installing SIGINT/SIGTERM handlers")?;
    let stop = CancellationToken::new();
    let server = tokio::spawn(common::serve(listener, app, stop.clone()));
    let ticker = {
        let sim = Arc::clone(&sim);
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = every.tick() => {
                        sim.lock().tick();
                        sim.kick();
                    }
                }
            }
        })
    };

    let base = format!("http://{http_address}");
    tracing::info!(url = %base, work_dir = %work_dir.display(), nodes = args.nodes, "cruise-sim yarn listening");
    if let Some(path) = &args.ready_file {
        common::write_ready_file(
            path,
            &json!({
                "url": base,
                "rm_url": format!("{base}/ws/v1/cluster"),
                "services_url": format!("{base}/app/v1/services"),
                "admin_url": format!("{base}/sim"),
                "work_dir": work_dir,
                "pid": std::process::id(),
            }),
        )
        .with_context(|| format!("writing --ready-file {}", path.display()))?;
    }

    let signal = signals.recv().await;
    tracing::info!(signal, "shutting down: killing all containers");
    sim.lock().kill_all();
    root_kill.cancel();
    stop.cancel();
    sim.tracker.close();
    if tokio::time::timeout(Duration::from_secs(30), sim.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("some container supervisors did not finish within 30s");
    }
    let _ = ticker.await;
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!("HTTP server ended with an error: {e}"),
        Ok(Err(e)) => tracing::warn!("HTTP server task failed: {e}"),
        Err(_) => tracing::warn!("HTTP server did not drain within 5s"),
    }
    tracing::info!("cruise-sim yarn stopped");
    Ok(())
}

fn capacity_json(st: &State) -> Value {
    let (total_mb, total_vc, used_mb, used_vc, n) = st.totals();
    json!({
        "nodes": st.nodes.iter().filter(|n| n.state == NodeState::Running).count(),
        "node_memory_mb": st.cfg.node_memory_mb,
        "node_vcores": st.cfg.node_vcores,
        "total_mb": total_mb,
        "total_vcores": total_vc,
        "used_mb": used_mb,
        "used_vcores": used_vc,
        "containers": n,
    })
}

async fn get_capacity(AxState(sim): AxState<Arc<Sim>>) -> Response {
    json_response(StatusCode::OK, &capacity_json(&sim.lock()))
}

/// What `POST /sim/decommission` takes.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Decommission {
    node: String,
    timeout_secs: Option<u64>,
}

async fn post_decommission(
    AxState(sim): AxState<Arc<Sim>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bad = |msg: String| json_response(StatusCode::BAD_REQUEST, &json!({"error": msg}));
    if let Err(e) = rm::require_json(&headers, "POST /sim/decommission") {
        return e.into_response();
    }
    let d: Decommission = match serde_json::from_slice(&body) {
        Ok(d) => d,
        Err(e) => {
            return bad(format!(
                "POST /sim/decommission: expected {{\"node\": \"host:port\", \"timeout_secs\": n?}}: {e}"
            ));
        }
    };
    let r = sim.lock().decommission(&d.node, d.timeout_secs);
    match r {
        Ok(()) => {
            tracing::info!(node = %d.node, timeout_secs = ?d.timeout_secs, "node decommissioning");
            json_response(
                StatusCode::OK,
                &json!({"node": d.node, "state": "DECOMMISSIONING"}),
            )
        }
        Err(e) => bad(format!("POST /sim/decommission: {e}")),
    }
}

async fn put_capacity(
    AxState(sim): AxState<Arc<Sim>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bad = |msg: String| json_response(StatusCode::BAD_REQUEST, &json!({"error": msg}));
    if let Err(e) = rm::require_json(&headers, "PUT /sim/capacity") {
        return e.into_response();
    }
    let ch: CapacityChange = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return bad(format!(
                "PUT /sim/capacity: expected {{\"nodes\": n, \"node_memory_mb\": m, \"node_vcores\": c}}: {e}"
            ));
        }
    };
    if ch.node_memory_mb == Some(0) || ch.node_vcores == Some(0) {
        return bad("PUT /sim/capacity: node_memory_mb and node_vcores must be positive".into());
    }
    let (v, killed) = {
        let mut st = sim.lock();
        let killed = st.change_capacity(&ch);
        (capacity_json(&st), killed)
    };
    tracing::info!(?ch, killed = killed.len(), "capacity changed");
    sim.kick();
    let mut v = v;
    v["killed_containers"] = json!(killed);
    json_response(StatusCode::OK, &v)
}

async fn list_containers(AxState(sim): AxState<Arc<Sim>>) -> Response {
    let st = sim.lock();
    let list: Vec<Value> = st
        .containers
        .values()
        .map(|c| {
            let owner = match &c.owner {
                Owner::Am { app, attempt } => json!({"am": {"app": app, "attempt": attempt}}),
                Owner::Instance { service, component, instance } => {
                    json!({"instance": {"service": service, "component": component, "instance": instance}})
                }
            };
            json!({
                "id": c.id,
                "app": c.app_id,
                "owner": owner,
                "node": st.nodes[c.node].id(),
                "memory_mb": c.memory_mb,
                "vcores": c.vcores,
                "state": match c.phase { Phase::Allocated => "ALLOCATED", Phase::Running => "RUNNING", Phase::Complete => "COMPLETE" },
                "pid": c.pid,
                "allocated_ms": c.allocated_ms,
                "started_ms": c.started_ms,
                "finished_ms": c.finished_ms,
                "exit_status": c.exit_status,
                "diagnostics": c.diagnostics,
                "work_dir": c.cwd,
                "log_dir": c.log_dir,
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"containers": list, "now_ms": now_ms()}),
    )
}

fn container_dir(sim: &Sim, id: &str) -> Option<PathBuf> {
    sim.lock().containers.get(id).map(|c| c.cwd.clone())
}

async fn list_files(AxState(sim): AxState<Arc<Sim>>, Path(id): Path<String>) -> Response {
    let Some(dir) = container_dir(&sim, &id) else {
        return (StatusCode::NOT_FOUND, format!("no container {id}\n")).into_response();
    };
    let mut names = Vec::new();
    for sub in ["", "logs"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let n = e.file_name().to_string_lossy().into_owned();
                    names.push(if sub.is_empty() {
                        n
                    } else {
                        format!("{sub}/{n}")
                    });
                }
            }
        }
    }
    names.sort();
    json_response(StatusCode::OK, &json!({"container": id, "files": names}))
}

/// NodeManager REST: a log file of a container (`NMWebServices.getLogs`).
async fn get_container_log(
    AxState(sim): AxState<Arc<Sim>>,
    Path((id, name)): Path<(String, String)>,
) -> Response {
    let Some(dir) = container_dir(&sim, &id) else {
        return (
            StatusCode::NOT_FOUND,
            format!("Cannot find this log on the local disk: container {id} is unknown\n"),
        )
            .into_response();
    };
    if name.contains('/') || name == ".." || name.is_empty() {
        return (StatusCode::BAD_REQUEST, format!("bad file name {name:?}\n")).into_response();
    }
    match std::fs::read(dir.join("logs").join(&name)) {
        Ok(b) => {
            // A Hadoop 3 NodeManager frames the file with this header and
            // trailer.
            let node = sim
                .lock()
                .containers
                .get(&id)
                .map(|c| format!("127.0.0.1:{}", 45454 + c.node))
                .unwrap_or_default();
            let first = format!("Container: {id} on {node}");
            let mut out = format!(
                "{first}\nLogAggregationType: LOCAL\n{}\nLogType:{name}\nLogLength:{}\nLogContents:\n",
                "=".repeat(first.len()),
                b.len()
            )
            .into_bytes();
            out.extend_from_slice(&b);
            out.extend_from_slice(
                format!("End of LogType:{name}.\n{}\n\n", "*".repeat(77)).as_bytes(),
            );
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response()
        }
        Err(e) => (
            StatusCode::NOT_FOUND,
            format!("Cannot find this log on the local disk: {name}: {e}\n"),
        )
            .into_response(),
    }
}

async fn get_file(
    AxState(sim): AxState<Arc<Sim>>,
    Path((id, name)): Path<(String, String)>,
) -> Response {
    let Some(dir) = container_dir(&sim, &id) else {
        return (StatusCode::NOT_FOUND, format!("no container {id}\n")).into_response();
    };
    if name.split('/').any(|p| p == ".." || p.is_empty()) {
        return (StatusCode::BAD_REQUEST, format!("bad file name {name:?}\n")).into_response();
    }
    match std::fs::read(dir.join(&name)) {
        Ok(b) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], b).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{name}: {e}\n")).into_response(),
    }
}
