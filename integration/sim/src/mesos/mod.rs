//! `cruise-sim mesos`: a Mesos master with simulated agents that speaks the
//! v1 scheduler HTTP API (`POST /api/v1/scheduler`, JSON only) on loopback
//! and really runs the tasks frameworks launch.
//!
//! # What it simulates
//! - SUBSCRIBE answers `200` with `Mesos-Stream-Id` and a chunked RecordIO
//!   stream of events in the nested shapes of `scheduler.proto`: SUBSCRIBED
//!   (framework id, heartbeat interval, master info), HEARTBEAT every
//!   `--heartbeat-interval-secs`, OFFERS (`{"offers":{"offers":[...]}}`) of
//!   each agent's unused cpus/mem/disk/ports every `--allocation-interval-ms`,
//!   RESCIND, UPDATE, FAILURE and ERROR.
//! - Calls on other connections need `Mesos-Stream-Id` and `framework_id`
//!   (400 otherwise, 403 while the framework is disconnected) and answer 202:
//!   ACCEPT with LAUNCH / LAUNCH_GROUP (other operations: 400), DECLINE with
//!   `refuse_seconds` filters (default 5 s; the unused part of an ACCEPT is
//!   declined with its filters too), KILL, SHUTDOWN, ACKNOWLEDGE, RECONCILE
//!   (explicit and implicit), REVIVE/SUPPRESS (role arrays), TEARDOWN (kills
//!   every task, ends the stream), MESSAGE and REQUEST (accepted and dropped:
//!   command tasks have no executor to receive messages), UPDATE_FRAMEWORK
//!   (200).
//! - A launched task runs `command.value` with `sh -c` (or `value` +
//!   `arguments` when `shell` is false) with `command.environment.variables`
//!   and the MESOS_* variables of a command executor, in a sandbox
//!   `<work-dir>/agents/<agent>/frameworks/<fw>/executors/<executor>/runs/<container>/`
//!   with `stdout`/`stderr` files; `command.uris` are fetched into it first
//!   (http(s), file:// or absolute paths; archives extracted). Its updates
//!   TASK_STARTING, TASK_RUNNING, then TASK_FINISHED / TASK_FAILED / TASK_KILLED
//!   with "Command exited with status N" / "Command terminated with signal S"
//!   carry a base64 uuid and are delivered one at a time per task, re-sent
//!   until acknowledged after `--update-retry-secs`, doubling per retry up
//!   to 10 minutes. Invalid tasks get
//!   TASK_ERROR and tasks on invalid offers TASK_LOST (TASK_DROPPED when
//!   PARTITION_AWARE), both from the master and without uuid.
//! - Framework failover: a disconnected framework keeps its tasks for its
//!   `failover_timeout`; re-SUBSCRIBE with `framework_info.id` (and the same
//!   top-level `framework_id`) gets a new stream and the unacknowledged
//!   updates again. After the timeout its tasks are killed and it is removed;
//!   subscribing with a removed id gets an ERROR event.
//! - `--leader-redirect HOST:PORT` runs a non-leading master instead: every
//!   scheduler call gets `307` with `Location: //HOST:PORT/api/v1/scheduler`,
//!   and `/redirect` points at the leader too.
//!
//! # Admin endpoints (not part of Mesos)
//! - `GET /sim/capacity`; `PUT /sim/capacity` with any of `{"agents": n,
//!   "agent_cpus": c, "agent_mem_mb": m, "agent_disk_mb": d}` (aliases
//!   `nodes`, `node_vcores`, `node_memory_mb`). Removed agents rescind their
//!   offers, their tasks end with TASK_LOST (TASK_GONE when PARTITION_AWARE)
//!   `REASON_AGENT_REMOVED`, and every framework gets a FAILURE event for the
//!   agent. Shrunken agents rescind their offers and preempt their newest
//!   tasks (TASK_LOST `REASON_CONTAINER_PREEMPTED`) until the rest fit.
//! - `GET /sim/state`: agents, frameworks, offers and tasks (with pids,
//!   sandboxes and the last status), and the inverse offers sent.
//! - `POST /sim/inverse_offer` with `{"agent_id": id, "start_in_secs": s,
//!   "duration_secs": d?}`: the agent goes into maintenance (offered to
//!   nobody) and every connected framework gets an INVERSE_OFFERS event for
//!   it; ACCEPT_INVERSE_OFFERS and DECLINE_INVERSE_OFFERS are recorded
//!   (see `maintenance.rs`).
//!
//! `--ready-file PATH` receives `{"url", "master", "scheduler_url",
//! "admin_url", "work_dir", "pid", "mode", "leader"}` once listening.

mod api;
mod maintenance;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::yarn::common;
use state::{Config, State};

/// Mesos version the simulator claims to be.
pub(crate) const MESOS_VERSION: &str = "1.11.0";

/// Command-line arguments of `cruise-sim mesos` (boxed: the options are large).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    opts: Box<Options>,
}

/// The options of `cruise-sim mesos`.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Number of agents.
    #[arg(long = "nodes", visible_alias = "agents", default_value_t = 2)]
    nodes: usize,
    /// cpus of each agent.
    #[arg(
        long = "node-vcores",
        visible_alias = "agent-cpus",
        default_value_t = 4.0
    )]
    node_vcores: f64,
    /// mem of each agent, MB.
    #[arg(
        long = "node-memory-mb",
        visible_alias = "agent-mem-mb",
        default_value_t = 8192.0
    )]
    node_memory_mb: f64,
    /// disk of each agent, MB.
    #[arg(long, default_value_t = 10240.0)]
    agent_disk_mb: f64,
    /// Port range each agent offers, BEGIN-END.
    #[arg(long, default_value = "31000-32000")]
    agent_ports: String,
    /// Directory for task sandboxes (default: a new directory under the system temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Write JSON with the base URL once listening.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Seconds between HEARTBEAT events (Mesos: 15).
    #[arg(long, default_value_t = 15.0)]
    heartbeat_interval_secs: f64,
    /// Milliseconds between allocation rounds (Mesos --allocation_interval: 1s).
    #[arg(long, default_value_t = 1000)]
    allocation_interval_ms: u64,
    /// Seconds before an unacknowledged status update is sent again, doubling per retry up to 600 (Mesos agent: 10).
    #[arg(long, default_value_t = 10.0)]
    update_retry_secs: f64,
    /// Grace period between SIGTERM and SIGKILL when killing a task, ms.
    #[arg(long, default_value_t = 3000)]
    kill_grace_ms: u64,
    /// Never send terminal task updates (a buggy master), to test a
    /// framework's bound on waiting for them.
    #[arg(long)]
    drop_terminal_updates: bool,
    /// Run as a non-leading master that redirects schedulers to this leader (HOST:PORT).
    #[arg(long)]
    leader_redirect: Option<String>,
}

/// The running master.
pub(crate) struct Sim {
    state: Mutex<State>,
    tracker: TaskTracker,
    stop: CancellationToken,
    http: reqwest::Client,
    kill_grace: Duration,
    heartbeat: Duration,
}

impl Sim {
    /// Lock the master state (poisoning is ignored: state changes are
    /// made by methods that keep it consistent).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn parse_ports(s: &str) -> anyhow::Result<(u64, u64)> {
    let (b, e) = s
        .split_once('-')
        .with_context(|| format!("--agent-ports {s:?}: expected BEGIN-END"))?;
    let b: u64 = b
        .trim()
        .parse()
        .with_context(|| format!("--agent-ports {s:?}: bad begin"))?;
    let e: u64 = e
        .trim()
        .parse()
        .with_context(|| format!("--agent-ports {s:?}: bad end"))?;
    anyhow::ensure!(
        b <= e && e <= 65535,
        "--agent-ports {s:?}: need BEGIN <= END <= 65535"
    );
    Ok((b, e))
}

/// Entry point of `cruise-sim mesos`.
pub fn main(args: Args) -> anyhow::Result<()> {
    common::init_tracing();
    let rt = common::runtime().context("starting the tokio runtime")?;
    rt.block_on(run(*args.opts))
}

async fn run(args: Options) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.heartbeat_interval_secs > 0.0 && args.update_retry_secs > 0.0,
        "--heartbeat-interval-secs and --update-retry-secs must be positive"
    );
    anyhow::ensure!(
        args.node_vcores >= 0.0 && args.node_memory_mb >= 0.0 && args.agent_disk_mb >= 0.0,
        "agent resources must not be negative"
    );
    let ports = parse_ports(&args.agent_ports)?;
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding --bind {}", args.bind))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let base = format!("http://{addr}");
    let mut signals =
        common::ShutdownSignals::install().context("installing SIGINT/SIGTERM handlers")?;
    let stop = CancellationToken::new();

    if let Some(leader) = &args.leader_redirect {
        let app = api::follower_routes(leader.clone());
        let server = tokio::spawn(common::serve(listener, app, stop.clone()));
        tracing::info!(url = %base, leader = %leader, "cruise-sim mesos (non-leading master) listening");
        if let Some(path) = &args.ready_file {
            common::write_ready_file(
                path,
                &json!({
                    "url": base, "master": addr.to_string(),
                    "scheduler_url": format!("{base}/api/v1/scheduler"),
                    "mode": "follower", "leader": leader, "pid": std::process::id(),
                }),
            )
            .with_context(|| format!("writing --ready-file {}", path.display()))?;
        }
        let signal = signals.recv().await;
        tracing::info!(signal, "shutting down");
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        return Ok(());
    }

    let work_dir = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("cruise-sim-mesos-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating --work-dir {}", work_dir.display()))?;
    let work_dir = work_dir
        .canonicalize()
        .with_context(|| format!("resolving --work-dir {}", work_dir.display()))?;
    let heartbeat = Duration::from_secs_f64(args.heartbeat_interval_secs);
    let cfg = Config {
        agent_cpus: args.node_vcores,
        agent_mem_mb: args.node_memory_mb,
        agent_disk_mb: args.agent_disk_mb,
        agent_ports: ports,
        heartbeat,
        update_retry: Duration::from_secs_f64(args.update_retry_secs),
        drop_terminal_updates: args.drop_terminal_updates,
        work_dir: work_dir.clone(),
        master_id: state::new_uuid_string(),
        host: addr.ip().to_string(),
        port: addr.port(),
    };
    let root_kill = CancellationToken::new();
    let sim = Arc::new(Sim {
        state: Mutex::new(State::new(cfg, args.nodes, root_kill)),
        tracker: TaskTracker::new(),
        stop: stop.clone(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .context("building the HTTP client for URI fetching")?,
        kill_grace: Duration::from_millis(args.kill_grace_ms),
        heartbeat,
    });
    let app = api::routes(Arc::clone(&sim));
    let server = tokio::spawn(common::serve(listener, app, stop.clone()));
    let ticker = {
        let sim = Arc::clone(&sim);
        let stop = stop.clone();
        let alloc_every = Duration::from_millis(args.allocation_interval_ms.max(10));
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(50).min(alloc_every));
            let mut last_alloc = Instant::now();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = every.tick() => {
                        let mut st = sim.lock();
                        st.tick();
                        if last_alloc.elapsed() >= alloc_every {
                            last_alloc = Instant::now();
                            st.allocate();
                        }
                    }
                }
            }
        })
    };

    tracing::info!(url = %base, work_dir = %work_dir.display(), agents = args.nodes, "cruise-sim mesos listening");
    if let Some(path) = &args.ready_file {
        common::write_ready_file(
            path,
            &json!({
                "url": base,
                "master": addr.to_string(),
                "scheduler_url": format!("{base}/api/v1/scheduler"),
                "admin_url": format!("{base}/sim"),
                "work_dir": work_dir,
                "pid": std::process::id(),
                "mode": "leader",
                "leader": addr.to_string(),
            }),
        )
        .with_context(|| format!("writing --ready-file {}", path.display()))?;
    }

    let signal = signals.recv().await;
    tracing::info!(signal, "shutting down: killing all tasks");
    sim.lock().kill_all();
    stop.cancel();
    sim.tracker.close();
    if tokio::time::timeout(Duration::from_secs(30), sim.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("some task supervisors did not finish within 30s");
    }
    let _ = ticker.await;
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!("HTTP server ended with an error: {e}"),
        Ok(Err(e)) => tracing::warn!("HTTP server task failed: {e}"),
        Err(_) => tracing::warn!("HTTP server did not drain within 5s"),
    }
    tracing::info!("cruise-sim mesos stopped");
    Ok(())
}
