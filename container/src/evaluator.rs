//! The evaluator: its event loop and process entry point.
//!
//! [`run`] owns the evaluator's state: the control connection to the AM, the
//! job (app, store, data plane) once set up, and the running tasks (worker,
//! server, loads, moves, evaluations). One loop handles AM messages, the
//! heartbeat timer and task failures; tasks report to the AM through the
//! control writer's channel.
//!
//! Life: connect → handshake (prove the job secret) → `Register` → `Setup` →
//! whatever the AM asks, any number of times → `Shutdown` (or SIGTERM) →
//! stop tasks, say goodbye on the data plane, close, exit 0. If the AM goes
//! silent for the heartbeat timeout or the connection drops, the evaluator
//! exits with an error: an evaluator never outlives its AM.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::{ChannelConfig, CruiseConfig};
use cruise_hdfs::FileSystem;

use crate::apps::{self, App};
use crate::emulate;
use crate::os;
use crate::peer::{DataPlane, PeerSettings};
use crate::protocol::{
    self, AmToEval, EvalToAm, Faults, FrameOptions, JobSetup, ProtocolError, Purpose, Secret,
    TaskKind,
};
use crate::ps;
use crate::store::Store;

/// Environment variable: the AM's control address (`host:port`).
pub const ENV_AM_ADDR: &str = "CRUISE_AM_ADDR";
/// Environment variable: the job id.
pub const ENV_JOB_ID: &str = "CRUISE_JOB_ID";
/// Environment variable: the job secret (hex).
pub const ENV_JOB_SECRET: &str = "CRUISE_JOB_SECRET";
/// Environment variable: the container id given by the local runtime.
pub const ENV_CONTAINER_ID: &str = "CRUISE_CONTAINER_ID";
/// Container id variables set by other resource managers, tried in order.
pub const CONTAINER_ID_FALLBACKS: [&str; 2] = ["CONTAINER_ID", "MESOS_TASK_ID"];

/// Duration of the CPU calibration at start (several cgroup quota periods).
const CALIBRATION: Duration = Duration::from_millis(300);

/// How long a leaving evaluator lets its worker finish the current
/// mini-batch. Past it the mini-batch is abandoned: once the evaluator leaves,
/// no AM coordinates the job any more (it ended, was cancelled or is gone),
/// and a mini-batch stuck retrying requests to peers that are leaving too
/// would otherwise hold the evaluator until the retries run out.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Errors that end an evaluator.
#[derive(Debug, thiserror::Error)]
pub enum EvaluatorError {
    /// A required environment variable is missing or bad.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The AM could not be reached.
    #[error("cannot connect to the AM at {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The handshake failed (e.g. the wrong job secret).
    #[error("the AM at {addr} did not accept this evaluator: {source}")]
    Handshake {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: ProtocolError,
    },
    /// The AM went away.
    #[error("lost the AM: {0}")]
    AmLost(String),
    /// The AM sent something this evaluator cannot act on.
    #[error("protocol violation by the AM: {0}")]
    Protocol(String),
    /// A task failed.
    #[error("{0}")]
    Task(String),
    /// Local I/O failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Who this evaluator is and where its AM is.
#[derive(Debug, Clone)]
pub struct EvaluatorEnv {
    /// The AM's control address.
    pub am_addr: String,
    /// The job id.
    pub job_id: String,
    /// The job secret.
    pub secret: Secret,
    /// The container id.
    pub container_id: String,
    /// What an emulated cluster limits this container to (`process`
    /// mechanism; unlimited otherwise).
    pub throttle: emulate::Throttle,
}

impl EvaluatorEnv {
    /// Reads the environment of this process.
    pub fn from_env() -> Result<Self, EvaluatorError> {
        Self::from_map(&std::env::vars().collect())
    }

    /// Reads the given environment.
    pub fn from_map(env: &BTreeMap<String, String>) -> Result<Self, EvaluatorError> {
        let get = |var: &'static str| {
            env.get(var)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or(EvaluatorError::Env {
                    var,
                    reason: "not set; an evaluator is started by the AM's resource manager".into(),
                })
        };
        let secret = Secret::from_hex(&get(ENV_JOB_SECRET)?).map_err(|e| EvaluatorError::Env {
            var: ENV_JOB_SECRET,
            reason: e.to_string(),
        })?;
        let container_id = std::iter::once(ENV_CONTAINER_ID)
            .chain(CONTAINER_ID_FALLBACKS)
            .find_map(|v| env.get(v).filter(|s| !s.is_empty()).cloned())
            .ok_or(EvaluatorError::Env {
                var: ENV_CONTAINER_ID,
                reason: "not set (nor CONTAINER_ID or MESOS_TASK_ID)".into(),
            })?;
        let limit = |var: &'static str| -> Result<Option<f64>, EvaluatorError> {
            env.get(var)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x > 0.0)
                        .ok_or(EvaluatorError::Env {
                            var,
                            reason: format!("{v:?} is not a positive number"),
                        })
                })
                .transpose()
        };
        Ok(EvaluatorEnv {
            am_addr: get(ENV_AM_ADDR)?,
            job_id: get(ENV_JOB_ID)?,
            secret,
            container_id,
            throttle: emulate::Throttle {
                cpu: limit(emulate::ENV_CPU)?,
                bytes_per_sec: limit(emulate::ENV_BANDWIDTH)?,
            },
        })
    }
}

/// Test hooks and tunables of an evaluator.
#[derive(Debug, Clone, Default)]
pub struct EvaluatorOptions {
    /// Faults on the control connection.
    pub control_faults: Faults,
    /// Faults on the data plane.
    pub data_faults: Faults,
}

struct Job {
    config: CruiseConfig,
    app: Arc<dyn App>,
    dp: DataPlane,
    fs: FileSystem,
}

struct Task {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

/// The role tasks running here, owned by the evaluator's loop.
#[derive(Default)]
struct Roles {
    worker: Option<Task>,
    server: Option<Task>,
}

/// What the handlers of the AM's messages reach the rest of the evaluator
/// by: the control channel to the AM, the loop's channel for a task's
/// fatal error, the tracker tasks are spawned on, and the clock bound the
/// worker waits on (SSP).
struct Links {
    to_am: mpsc::Sender<EvalToAm>,
    fail: mpsc::Sender<String>,
    tracker: TaskTracker,
    min_clock: watch::Sender<u32>,
}

/// Runs an evaluator until the AM shuts it down (`Ok`), `shutdown` is
/// cancelled (`Ok`, after a graceful stop), or something fails.
pub async fn run(
    env: EvaluatorEnv,
    opts: EvaluatorOptions,
    shutdown: CancellationToken,
) -> Result<(), EvaluatorError> {
    let defaults = ChannelConfig::default();
    if env.throttle.is_limited() {
        emulate::install(env.throttle).map_err(|other| EvaluatorError::Env {
            var: emulate::ENV_CPU,
            reason: format!(
                "this process already emulates {other:?}, not {:?}",
                env.throttle
            ),
        })?;
        tracing::info!(throttle = ?env.throttle, "emulating a slower container in-process");
    }
    let connect_timeout = Duration::from_millis(defaults.connect_timeout_ms);
    let stream = connect_with_retry(&env.am_addr, connect_timeout).await?;
    let io = |context: &str| {
        let context = context.to_string();
        move |source| EvaluatorError::Io { context, source }
    };
    // Serve the data plane on the interface that reaches the AM.
    let local_ip = stream.local_addr().map_err(io("local address"))?.ip();
    let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
        .await
        .map_err(io("binding the data-plane port"))?;
    let data_addr = listener.local_addr().map_err(io("data-plane address"))?;
    let framed = protocol::auth::connect::<_, EvalToAm, AmToEval>(
        stream,
        &env.secret,
        &env.job_id,
        &env.container_id,
        Purpose::Control,
        FrameOptions::control(&defaults),
        connect_timeout,
    )
    .await
    .map_err(|source| EvaluatorError::Handshake {
        addr: env.am_addr.clone(),
        source,
    })?;
    let (sink, mut stream) = framed.split();
    let cancel = shutdown.child_token();
    let tracker = TaskTracker::new();
    let conn_cancel = cancel.child_token();
    let (to_am, writer) = protocol::spawn_writer(
        sink,
        4096,
        opts.control_faults.clone(),
        conn_cancel.clone(),
        &tracker,
        "control channel to the AM".to_string(),
    );
    // A short CPU calibration, so the optimizer can compare containers it
    // has not yet seen compute (scaled to an in-process emulated share, as
    // a cgroup quota would make it measure).
    let cpu_speed = tokio::task::spawn_blocking(|| os::cpu_speed(CALIBRATION))
        .await
        .unwrap_or(0.0)
        * emulate::cpu_share();
    to_am
        .send(EvalToAm::Register {
            data_addr,
            pid: std::process::id(),
            host: os::hostname(),
            cpu_speed,
        })
        .await
        .map_err(|_| EvaluatorError::AmLost("control channel closed".into()))?;
    tracing::info!(container = %env.container_id, %data_addr, "registered with the AM at {}", env.am_addr);

    let (fail_tx, mut fail_rx) = mpsc::channel::<String>(16);
    let links = Links {
        to_am: to_am.clone(),
        fail: fail_tx,
        tracker: tracker.clone(),
        min_clock: watch::channel(0u32).0,
    };
    let mut listener = Some(listener);
    let mut job: Option<Job> = None;
    let mut roles = Roles::default();
    let mut hb_interval = Duration::from_millis(defaults.heartbeat_interval_ms);
    let mut hb_timeout = Duration::from_millis(defaults.heartbeat_timeout_ms);
    let mut heartbeat = tokio::time::interval(hb_interval);
    let mut last_heard = Instant::now();

    let result: Result<(), EvaluatorError> = loop {
        tokio::select! {
            _ = cancel.cancelled() => {
                tracing::info!("stopping on request (signal)");
                break Ok(());
            }
            _ = conn_cancel.cancelled() => break Err(EvaluatorError::AmLost("the control connection failed".into())),
            _ = opts.control_faults.broken() => break Err(EvaluatorError::AmLost("control connection broken (injected fault)".into())),
            Some(error) = fail_rx.recv() => {
                let _ = to_am.send(EvalToAm::Fatal { error: error.clone() }).await;
                break Err(EvaluatorError::Task(error));
            }
            _ = heartbeat.tick() => {
                if last_heard.elapsed() > hb_timeout {
                    break Err(EvaluatorError::AmLost(format!(
                        "no message from the AM for {:.1} s (channel.heartbeat_timeout_ms = {})",
                        last_heard.elapsed().as_secs_f64(), hb_timeout.as_millis()
                    )));
                }
                let (rss, peak) = os::memory();
                let store_bytes = job.as_ref().map_or(0, |j| j.dp.store().bytes_held());
                let _ = to_am.try_send(EvalToAm::Heartbeat { rss_bytes: rss, peak_rss_bytes: peak, store_bytes });
            }
            frame = stream.next() => {
                let msg = match frame {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => break Err(EvaluatorError::AmLost(format!("control channel error: {e}"))),
                    None => break Err(EvaluatorError::AmLost("the AM closed the control connection".into())),
                };
                last_heard = Instant::now();
                match msg {
                    AmToEval::Heartbeat => {}
                    AmToEval::Setup(setup) => {
                        let Some(l) = listener.take() else {
                            break Err(EvaluatorError::Protocol("a second Setup".into()));
                        };
                        match start_job(&env, *setup, l, &opts) {
                            Ok(j) => {
                                hb_interval = Duration::from_millis(j.config.channel.heartbeat_interval_ms);
                                hb_timeout = Duration::from_millis(j.config.channel.heartbeat_timeout_ms);
                                heartbeat = tokio::time::interval(hb_interval);
                                job = Some(j);
                            }
                            Err(e) => {
                                let _ = to_am.send(EvalToAm::Fatal { error: e.to_string() }).await;
                                break Err(e);
                            }
                        }
                    }
                    AmToEval::Shutdown { reason } => {
                        tracing::info!("shutdown requested by the AM: {reason}");
                        break Ok(());
                    }
                    other => {
                        let Some(j) = job.as_ref() else {
                            break Err(EvaluatorError::Protocol(format!("{other:?} before Setup")));
                        };
                        if let Err(e) = handle(other, j, &links, &mut roles).await {
                            break Err(e);
                        }
                    }
                }
            }
        }
    };

    // Stop tasks: the worker after its mini-batch, the server at once.
    for mut t in [roles.worker.take(), roles.server.take()]
        .into_iter()
        .flatten()
    {
        t.stop.cancel();
        if tokio::time::timeout(STOP_GRACE, &mut t.handle)
            .await
            .is_err()
        {
            tracing::warn!(
                "a task did not stop within {:.0} s of the request; abandoning it",
                STOP_GRACE.as_secs_f64()
            );
            t.handle.abort();
            let _ = t.handle.await;
        }
    }
    if let Some(j) = &job {
        if result.is_ok() {
            j.dp.shutdown().await;
        } else {
            j.dp.stop().await;
        }
    }
    // The writer ends once every sender is gone.
    drop(links);
    drop(to_am);
    if result.is_ok() {
        // Let the writer flush our last reports.
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    }
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    result
}

async fn connect_with_retry(addr: &str, timeout: Duration) -> Result<TcpStream, EvaluatorError> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(20);
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if Instant::now() + backoff >= deadline => {
                return Err(EvaluatorError::Connect {
                    addr: addr.to_string(),
                    reason: format!("{e} (retried for {timeout:?})"),
                });
            }
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn start_job(
    env: &EvaluatorEnv,
    setup: JobSetup,
    listener: TcpListener,
    opts: &EvaluatorOptions,
) -> Result<Job, EvaluatorError> {
    let config = setup.config;
    let app = apps::build(&config, &setup.app).map_err(|e| EvaluatorError::Task(e.to_string()))?;
    let store = Store::new(setup.evaluator);
    store.configure(&setup.tables, app.model());
    let ch = &config.channel;
    let settings = PeerSettings {
        job_id: env.job_id.clone(),
        secret: env.secret.clone(),
        frames: FrameOptions::data(ch),
        connect_timeout: Duration::from_millis(ch.connect_timeout_ms),
        chunk_bytes: config.store.move_chunk_bytes as usize,
        drain_timeout: Duration::from_millis(ch.heartbeat_timeout_ms),
    };
    // The data plane gets a token of its own, not one derived from the
    // process's shutdown signal: leaving must drain (GoAway until every
    // client acknowledges), so it ends only through `shutdown` or `stop`,
    // which `run` always calls on its way out.
    let dp = DataPlane::start(
        setup.evaluator,
        store,
        listener,
        settings,
        opts.data_faults.clone(),
        &CancellationToken::new(),
    )
    .map_err(|source| EvaluatorError::Io {
        context: "starting the data plane".into(),
        source,
    })?;
    tracing::info!(evaluator = setup.evaluator, app = %config.job.app, "job set up");
    Ok(Job {
        fs: FileSystem::from_env().unwrap_or_default(),
        config,
        app,
        dp,
    })
}

/// Carries out one message of the AM (other than setup and shutdown) for
/// the job set up here.
async fn handle(
    msg: AmToEval,
    job: &Job,
    links: &Links,
    roles: &mut Roles,
) -> Result<(), EvaluatorError> {
    let Links {
        to_am,
        fail,
        tracker,
        min_clock,
    } = links;
    let Roles { worker, server } = roles;
    let send = |m: EvalToAm| async move {
        to_am
            .send(m)
            .await
            .map_err(|_| EvaluatorError::AmLost("control channel closed".into()))
    };
    let store = job.dp.store().clone();
    match msg {
        AmToEval::Peers(peers) => job.dp.set_peers(&peers),
        AmToEval::Ownership(u) => {
            // Requests already on their way were routed by the older table:
            // the update counts as applied here once they are done (an
            // evaluator released after every member acknowledged cannot cut
            // one off). Waited for off the control loop: one of them may be
            // queued on a block that a command to this evaluator moves.
            let version = store.apply_ownership(&u);
            let mark = job.dp.request_mark();
            tracing::debug!(version, changes = u.owners.len(), "ownership applied");
            let (dp, tx) = (job.dp.clone(), to_am.clone());
            tracker.spawn(async move {
                dp.requests_done_before(mark).await;
                tracing::debug!(version, "ownership acknowledged");
                let _ = tx.send(EvalToAm::OwnershipApplied { version }).await;
            });
        }
        AmToEval::CreateBlocks { table, blocks } => {
            store
                .create_blocks(table, &blocks)
                .map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
            send(EvalToAm::BlocksCreated { table, blocks }).await?;
        }
        AmToEval::DropInput { blocks } => {
            store
                .drop_input(&blocks)
                .map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
            send(EvalToAm::InputDropped { blocks }).await?;
        }
        AmToEval::LoadInput { blocks } => {
            let (fs, app, tx, fail) = (
                job.fs.clone(),
                Arc::clone(&job.app),
                to_am.clone(),
                fail.clone(),
            );
            tracker.spawn(async move {
                match ps::load_input(fs, app, store, blocks).await {
                    Ok(blocks) => {
                        let _ = tx.send(EvalToAm::InputLoaded { blocks }).await;
                    }
                    Err(e) => {
                        let _ = fail.send(format!("loading input: {e}")).await;
                    }
                }
            });
        }
        AmToEval::StartWorker(task) => {
            if worker.as_ref().is_some_and(|w| !w.handle.is_finished()) {
                return Err(EvaluatorError::Protocol(
                    "StartWorker while a worker runs".into(),
                ));
            }
            let stop = CancellationToken::new();
            let ctx = ps::WorkerContext {
                dp: job.dp.clone(),
                app: Arc::clone(&job.app),
                to_am: to_am.clone(),
                stop: stop.clone(),
                min_clock: min_clock.subscribe(),
                mini_batch: job.config.job.mini_batch as usize,
                task,
                pipeline_depth: job.config.job.in_flight() as usize,
            };
            send(EvalToAm::TaskStarted {
                task: TaskKind::Worker,
            })
            .await?;
            let fail = fail.clone();
            let handle = tracker.spawn(async move {
                if let Err(e) = ps::run_worker(ctx).await {
                    let _ = fail.send(format!("worker: {e}")).await;
                }
            });
            *worker = Some(Task { stop, handle });
        }
        AmToEval::StopWorker => match worker.take() {
            Some(w) => w.stop.cancel(), // the task reports TaskStopped itself
            None => {
                send(EvalToAm::TaskStopped {
                    task: TaskKind::Worker,
                })
                .await?
            }
        },
        AmToEval::StartServer => {
            if server.as_ref().is_some_and(|s| !s.handle.is_finished()) {
                return Err(EvaluatorError::Protocol(
                    "StartServer while a server runs".into(),
                ));
            }
            let stop = CancellationToken::new();
            send(EvalToAm::TaskStarted {
                task: TaskKind::Server,
            })
            .await?;
            let (dp, tx, st, fail) = (job.dp.clone(), to_am.clone(), stop.clone(), fail.clone());
            let handle = tracker.spawn(async move {
                if let Err(e) = ps::run_server(dp, tx, st, ps::SERVER_REPORT_PERIOD).await {
                    let _ = fail.send(format!("server: {e}")).await;
                }
            });
            *server = Some(Task { stop, handle });
        }
        AmToEval::StopServer => match server.take() {
            Some(s) => s.stop.cancel(),
            None => {
                send(EvalToAm::TaskStopped {
                    task: TaskKind::Server,
                })
                .await?
            }
        },
        AmToEval::MoveBlocks {
            move_id,
            table,
            blocks,
            to,
        } => {
            let (dp, tx) = (job.dp.clone(), to_am.clone());
            tracker.spawn(async move {
                let t0 = Instant::now();
                let result = dp
                    .move_blocks(move_id, table, &blocks, to, &tx)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                let _ = tx
                    .send(EvalToAm::MoveFinished {
                        move_id,
                        result,
                        secs: t0.elapsed().as_secs_f64(),
                    })
                    .await;
            });
        }
        AmToEval::ProbeBandwidth { to, bytes } => {
            let (dp, tx) = (job.dp.clone(), to_am.clone());
            tracker.spawn(async move {
                match dp.probe(to, bytes, 3).await {
                    Ok(secs) => {
                        let _ = tx.send(EvalToAm::BandwidthProbe { to, bytes, secs }).await;
                    }
                    // A failed probe only costs the optimizer a measurement.
                    Err(e) => {
                        tracing::warn!("bandwidth probe to evaluator {to}: {e}");
                        let error = e.to_string();
                        let _ = tx.send(EvalToAm::ProbeFailed { to, error }).await;
                    }
                }
            });
        }
        AmToEval::Clock { min_clock: c } => {
            min_clock.send_replace(c);
        }
        AmToEval::Evaluate => {
            let (dp, app, tx, fail) = (
                job.dp.clone(),
                Arc::clone(&job.app),
                to_am.clone(),
                fail.clone(),
            );
            let mb = job.config.job.mini_batch as usize;
            tracker.spawn(async move {
                match ps::evaluate(&dp, &app, mb).await {
                    Ok(stats) => {
                        let _ = tx.send(EvalToAm::Evaluation(stats)).await;
                    }
                    Err(e) => {
                        let _ = fail.send(format!("evaluation: {e}")).await;
                    }
                }
            });
        }
        AmToEval::EvaluateHeldOut { splits } => {
            let (fs, dp, app, tx, fail) = (
                job.fs.clone(),
                job.dp.clone(),
                Arc::clone(&job.app),
                to_am.clone(),
                fail.clone(),
            );
            let mb = job.config.job.mini_batch as usize;
            tracker.spawn(async move {
                match ps::evaluate_held_out(&fs, &dp, &app, &splits, mb).await {
                    Ok(stats) => {
                        let _ = tx.send(EvalToAm::HeldOutEvaluation(stats)).await;
                    }
                    Err(e) => {
                        let _ = fail.send(format!("held-out evaluation: {e}")).await;
                    }
                }
            });
        }
        AmToEval::DumpModel => {
            let (tx, fail) = (to_am.clone(), fail.clone());
            // Parts well below the control channel's frame limit.
            let part_bytes = (job.config.channel.control_max_frame_bytes / 4) as usize;
            tracker.spawn(async move {
                if let Err(e) = ps::dump_model(&store, &tx, part_bytes).await {
                    let _ = fail.send(format!("sending the model: {e}")).await;
                }
            });
        }
        AmToEval::Heartbeat | AmToEval::Setup(_) | AmToEval::Shutdown { .. } => {}
    }
    Ok(())
}
