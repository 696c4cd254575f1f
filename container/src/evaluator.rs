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
use crate::checkpoint;
use crate::emulate;
use crate::os;
use crate::peer::{DataPlane, PeerSettings};
use crate::protocol::{
    self, AmToEval, EvalToAm, EvaluatorId, Faults, FrameOptions, JobSetup, OwnershipUpdate,
    ProtocolError, Purpose, Secret, TaskKind, WorkerTask,
};
use crate::ps::{self, PsError};
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
/// fatal error, the tracker tasks are spawned on, the clock bound the
/// worker waits on (SSP), and the token that drops pending work when the
/// evaluator ends.
struct Links {
    to_am: mpsc::Sender<EvalToAm>,
    fail: mpsc::Sender<String>,
    tracker: TaskTracker,
    min_clock: watch::Sender<u32>,
    /// Cancelled when the evaluator ends: work still waiting for its
    /// answer (e.g. a read blocked on a datanode) is dropped then.
    stop: CancellationToken,
}

impl Links {
    /// Sends `m` to the AM.
    async fn send(&self, m: EvalToAm) -> Result<(), EvaluatorError> {
        self.to_am
            .send(m)
            .await
            .map_err(|_| EvaluatorError::AmLost("control channel closed".into()))
    }

    /// Runs `work` off the control loop, on the tracker: its answer, if
    /// any, goes to the AM; its error fails the evaluator, after `what`.
    fn answer_later<E: std::fmt::Display>(
        &self,
        what: &'static str,
        work: impl Future<Output = Result<Option<EvalToAm>, E>> + Send + 'static,
    ) {
        let (tx, fail, stop) = (self.to_am.clone(), self.fail.clone(), self.stop.clone());
        self.tracker.spawn(async move {
            let result = tokio::select! {
                r = work => r,
                _ = stop.cancelled() => {
                    tracing::info!("{what}: dropped, the evaluator is ending");
                    return;
                }
            };
            match result.map_err(|e| format!("{what}: {e}")) {
                Ok(Some(answer)) => {
                    let _ = tx.send(answer).await;
                }
                Ok(None) => {}
                Err(error) => {
                    let _ = fail.send(error).await;
                }
            }
        });
    }

    /// Runs a task on the tracker; its error fails the evaluator, after
    /// `what`.
    fn fail_on_error<E: std::fmt::Display>(
        &self,
        what: &'static str,
        task: impl Future<Output = Result<(), E>> + Send + 'static,
    ) -> JoinHandle<()> {
        let fail = self.fail.clone();
        self.tracker.spawn(async move {
            if let Err(error) = task.await.map_err(|e| format!("{what}: {e}")) {
                let _ = fail.send(error).await;
            }
        })
    }
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
    let (framed, listener) = connect_to_am(&env, &defaults).await?;
    let data_addr = listener.local_addr().map_err(|source| EvaluatorError::Io {
        context: "data-plane address".into(),
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
    let (fail_tx, mut fail_rx) = mpsc::channel::<String>(16);
    let links = Links {
        to_am: to_am.clone(),
        fail: fail_tx,
        tracker: tracker.clone(),
        min_clock: watch::channel(0u32).0,
        stop: cancel.clone(),
    };
    register(&links, data_addr).await?;
    tracing::info!(container = %env.container_id, %data_addr, "registered with the AM at {}", env.am_addr);

    let mut ev = Evaluator {
        env: &env,
        opts: &opts,
        listener: Some(listener),
        job: None,
        roles: Roles::default(),
        links,
        liveness: Liveness::new(&defaults),
    };
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
            _ = ev.liveness.interval.tick() => {
                if let Err(e) = ev.liveness.check() {
                    break Err(e);
                }
                let (rss, peak) = os::memory();
                let store_bytes = ev.job.as_ref().map_or(0, |j| j.dp.store().bytes_held());
                let _ = to_am.try_send(EvalToAm::Heartbeat { rss_bytes: rss, peak_rss_bytes: peak, store_bytes });
            }
            frame = stream.next() => {
                let msg = match frame {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => break Err(EvaluatorError::AmLost(format!("control channel error: {e}"))),
                    None => break Err(EvaluatorError::AmLost("the AM closed the control connection".into())),
                };
                ev.liveness.last_heard = Instant::now();
                match ev.on_message(msg).await {
                    Ok(false) => {}
                    Ok(true) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
        }
    };

    let Evaluator {
        job, roles, links, ..
    } = ev;
    stop_roles(roles).await;
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

/// The evaluator's state, owned by its control loop ([`run`]).
struct Evaluator<'a> {
    env: &'a EvaluatorEnv,
    opts: &'a EvaluatorOptions,
    /// The data plane's listener, until the job's setup starts it.
    listener: Option<TcpListener>,
    /// The job, once set up.
    job: Option<Job>,
    roles: Roles,
    links: Links,
    liveness: Liveness,
}

impl Evaluator<'_> {
    /// Acts on a message of the AM; `Ok(true)` when the AM shuts this
    /// evaluator down.
    async fn on_message(&mut self, msg: AmToEval) -> Result<bool, EvaluatorError> {
        match msg {
            AmToEval::Heartbeat => {}
            AmToEval::Setup(setup) => {
                let Some(l) = self.listener.take() else {
                    return Err(EvaluatorError::Protocol("a second Setup".into()));
                };
                match start_job(self.env, *setup, l, self.opts) {
                    Ok(j) => {
                        self.liveness = Liveness::new(&j.config.channel);
                        self.job = Some(j);
                    }
                    Err(e) => {
                        let error = e.to_string();
                        let _ = self.links.send(EvalToAm::Fatal { error }).await;
                        return Err(e);
                    }
                }
            }
            AmToEval::Shutdown { reason } => {
                tracing::info!("shutdown requested by the AM: {reason}");
                return Ok(true);
            }
            other => {
                let Some(j) = self.job.as_ref() else {
                    return Err(EvaluatorError::Protocol(format!("{other:?} before Setup")));
                };
                handle(other, j, &self.links, &mut self.roles).await?;
            }
        }
        Ok(false)
    }
}

/// When to send a heartbeat, and whether the AM is still heard from.
struct Liveness {
    interval: tokio::time::Interval,
    timeout: Duration,
    last_heard: Instant,
}

impl Liveness {
    fn new(channel: &ChannelConfig) -> Liveness {
        Liveness {
            interval: tokio::time::interval(Duration::from_millis(channel.heartbeat_interval_ms)),
            timeout: Duration::from_millis(channel.heartbeat_timeout_ms),
            last_heard: Instant::now(),
        }
    }

    /// An error once the AM has been silent for longer than the timeout.
    fn check(&self) -> Result<(), EvaluatorError> {
        let silent = self.last_heard.elapsed();
        if silent > self.timeout {
            return Err(EvaluatorError::AmLost(format!(
                "no message from the AM for {:.1} s (channel.heartbeat_timeout_ms = {})",
                silent.as_secs_f64(),
                self.timeout.as_millis()
            )));
        }
        Ok(())
    }
}

/// The control channel to the AM, authenticated, and the data plane's
/// listener, bound on the interface that reaches the AM.
async fn connect_to_am(
    env: &EvaluatorEnv,
    defaults: &ChannelConfig,
) -> Result<(ControlChannel, TcpListener), EvaluatorError> {
    let connect_timeout = Duration::from_millis(defaults.connect_timeout_ms);
    let stream = connect_with_retry(&env.am_addr, connect_timeout).await?;
    let io = |context: &str| {
        let context = context.to_string();
        move |source| EvaluatorError::Io { context, source }
    };
    let local_ip = stream.local_addr().map_err(io("local address"))?.ip();
    let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
        .await
        .map_err(io("binding the data-plane port"))?;
    let framed = protocol::auth::connect::<_, EvalToAm, AmToEval>(
        stream,
        &env.secret,
        &env.job_id,
        &env.container_id,
        Purpose::Control,
        FrameOptions::control(defaults),
        connect_timeout,
    )
    .await
    .map_err(|source| EvaluatorError::Handshake {
        addr: env.am_addr.clone(),
        source,
    })?;
    Ok((framed, listener))
}

/// The evaluator's side of the control channel.
type ControlChannel =
    tokio_util::codec::Framed<TcpStream, protocol::FrameCodec<EvalToAm, AmToEval>>;

/// Registers with the AM, after a short CPU calibration, so the optimizer
/// can compare containers it has not yet seen compute (scaled to an
/// in-process emulated share, as a cgroup quota would make it measure).
async fn register(links: &Links, data_addr: SocketAddr) -> Result<(), EvaluatorError> {
    let cpu_speed = tokio::task::spawn_blocking(|| os::cpu_speed(CALIBRATION))
        .await
        .unwrap_or(0.0)
        * emulate::cpu_share();
    links
        .send(EvalToAm::Register {
            data_addr,
            pid: std::process::id(),
            host: os::hostname(),
            cpu_speed,
        })
        .await
}

/// Stops the tasks: the worker after its mini-batch, the server at once;
/// one that does not stop within [`STOP_GRACE`] is abandoned.
async fn stop_roles(roles: Roles) {
    for mut t in [roles.worker, roles.server].into_iter().flatten() {
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
        request_timeout: Duration::from_millis(config.store.request_timeout_ms),
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
    tracing::info!(evaluator = %setup.evaluator, app = %config.job.app, "job set up");
    Ok(Job {
        fs: crate::input_fs::file_system(&config.hdfs),
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
    let store = job.dp.store().clone();
    match msg {
        AmToEval::Peers(peers) => job.dp.set_peers(&peers),
        AmToEval::Ownership(u) => apply_ownership(&u, job, links),
        AmToEval::CreateBlocks { table, blocks } => {
            store
                .create_blocks(table, &blocks)
                .map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
            links
                .send(EvalToAm::BlocksCreated { table, blocks })
                .await?;
        }
        AmToEval::DropInput { blocks } => {
            store
                .drop_input(&blocks)
                .map_err(|e| EvaluatorError::Protocol(e.to_string()))?;
            links.send(EvalToAm::InputDropped { blocks }).await?;
        }
        AmToEval::LoadInput { blocks } => {
            let (fs, app) = (job.fs.clone(), Arc::clone(&job.app));
            links.answer_later("loading input", async move {
                let blocks = ps::load_input(fs, app, store, blocks).await?;
                Ok::<_, PsError>(Some(EvalToAm::InputLoaded { blocks }))
            });
        }
        AmToEval::StartWorker(task) => start_worker(task, job, links, roles).await?,
        AmToEval::StopWorker => stop_task(&mut roles.worker, TaskKind::Worker, links).await?,
        AmToEval::StartServer => start_server(job, links, roles).await?,
        AmToEval::StopServer => stop_task(&mut roles.server, TaskKind::Server, links).await?,
        AmToEval::MoveBlocks {
            move_id,
            table,
            blocks,
            to,
        } => {
            let (dp, tx) = (job.dp.clone(), links.to_am.clone());
            links.answer_later("reporting a move", async move {
                let t0 = Instant::now();
                let result = dp.move_blocks(move_id, table, &blocks, to, &tx).await;
                Ok::<_, EvaluatorError>(Some(EvalToAm::MoveFinished {
                    move_id,
                    result: result.map(|_| ()).map_err(|e| e.to_string()),
                    secs: t0.elapsed().as_secs_f64(),
                }))
            });
        }
        AmToEval::ProbeBandwidth { to, bytes } => probe_bandwidth(to, bytes, job, links),
        AmToEval::Clock { min_clock } => {
            links.min_clock.send_replace(min_clock);
        }
        AmToEval::Evaluate => {
            let (dp, app) = (job.dp.clone(), Arc::clone(&job.app));
            let mb = job.config.job.mini_batch as usize;
            links.answer_later("evaluation", async move {
                let stats = ps::evaluate(&dp, &app, mb).await?;
                Ok::<_, PsError>(Some(EvalToAm::Evaluation(stats)))
            });
        }
        AmToEval::EvaluateHeldOut { splits } => {
            let (fs, dp, app) = (job.fs.clone(), job.dp.clone(), Arc::clone(&job.app));
            let mb = job.config.job.mini_batch as usize;
            links.answer_later("held-out evaluation", async move {
                let stats = ps::evaluate_held_out(&fs, &dp, &app, &splits, mb).await?;
                Ok::<_, PsError>(Some(EvalToAm::HeldOutEvaluation(stats)))
            });
        }
        AmToEval::DumpModel => {
            let tx = links.to_am.clone();
            // Parts well below the control channel's frame limit.
            let part_bytes = (job.config.channel.control_max_frame_bytes / 4) as usize;
            links.answer_later("sending the model", async move {
                ps::dump_model(&store, &tx, part_bytes).await?;
                Ok::<_, PsError>(None)
            });
        }
        AmToEval::Checkpoint { id, folder } => {
            let fs = job.fs.clone();
            links.answer_later("writing a checkpoint", async move {
                let result = checkpoint::write_blocks(&fs, &store, &folder)
                    .await
                    .map_err(|e| e.to_string());
                Ok::<_, EvaluatorError>(Some(EvalToAm::CheckpointWritten { id, result }))
            });
        }
        AmToEval::RestoreBlocks {
            lost,
            folder,
            files,
        } => {
            // Arriving before this handler returns: the AM announces the
            // new owner only after this message.
            let blocks: Vec<_> = files.iter().map(|f| f.block).collect();
            if let Err(e) = checkpoint::begin_restore(&store, lost, &files) {
                let result = Err(e.to_string());
                let answer = EvalToAm::BlocksRestored {
                    folder,
                    blocks,
                    result,
                };
                return links.send(answer).await;
            }
            let fs = job.fs.clone();
            links.answer_later("restoring blocks", async move {
                let result = checkpoint::restore_blocks(&fs, &store, &folder, &files)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                Ok::<_, EvaluatorError>(Some(EvalToAm::BlocksRestored {
                    folder,
                    blocks,
                    result,
                }))
            });
        }
        AmToEval::Heartbeat | AmToEval::Setup(_) | AmToEval::Shutdown { .. } => {}
    }
    Ok(())
}

/// Applies an ownership update; acknowledges it once the requests already on
/// their way are done. They were routed by the older table: the update
/// counts as applied here once they are done (an evaluator released after
/// every member acknowledged cannot cut one off). Waited for off the
/// control loop: one of them may be queued on a block that a command to
/// this evaluator moves.
fn apply_ownership(u: &OwnershipUpdate, job: &Job, links: &Links) {
    let version = job.dp.store().apply_ownership(u);
    let mark = job.dp.request_mark();
    tracing::debug!(version, changes = u.owners.len(), "ownership applied");
    let dp = job.dp.clone();
    links.answer_later("acknowledging ownership", async move {
        dp.requests_done_before(mark).await;
        tracing::debug!(version, "ownership acknowledged");
        Ok::<_, EvaluatorError>(Some(EvalToAm::OwnershipApplied { version }))
    });
}

/// Measures the bulk bandwidth to `to` with `bytes`; a failed probe only
/// costs the optimizer a measurement, and is reported as such.
fn probe_bandwidth(to: EvaluatorId, bytes: u64, job: &Job, links: &Links) {
    let dp = job.dp.clone();
    links.answer_later("probing bandwidth", async move {
        Ok::<_, EvaluatorError>(Some(match dp.probe(to, bytes, 3).await {
            Ok(secs) => EvalToAm::BandwidthProbe { to, bytes, secs },
            Err(e) => {
                tracing::warn!("bandwidth probe to evaluator {to}: {e}");
                let error = e.to_string();
                EvalToAm::ProbeFailed { to, error }
            }
        }))
    });
}

/// A protocol error (`what`) if the task in `slot` still runs.
fn refuse_if_running(slot: &Option<Task>, what: &str) -> Result<(), EvaluatorError> {
    match slot {
        Some(t) if !t.handle.is_finished() => Err(EvaluatorError::Protocol(what.into())),
        _ => Ok(()),
    }
}

/// Starts the worker task, which reports `TaskStopped` itself when it ends.
async fn start_worker(
    task: WorkerTask,
    job: &Job,
    links: &Links,
    roles: &mut Roles,
) -> Result<(), EvaluatorError> {
    refuse_if_running(&roles.worker, "StartWorker while a worker runs")?;
    let stop = CancellationToken::new();
    let ctx = ps::WorkerContext {
        dp: job.dp.clone(),
        app: Arc::clone(&job.app),
        to_am: links.to_am.clone(),
        stop: stop.clone(),
        min_clock: links.min_clock.subscribe(),
        mini_batch: job.config.job.mini_batch as usize,
        task,
        pipeline_depth: job.config.job.in_flight() as usize,
    };
    links
        .send(EvalToAm::TaskStarted {
            task: TaskKind::Worker,
        })
        .await?;
    let handle = links.fail_on_error("worker", ps::run_worker(ctx));
    roles.worker = Some(Task { stop, handle });
    Ok(())
}

/// Starts the server task, which reports `TaskStopped` itself when it ends.
async fn start_server(job: &Job, links: &Links, roles: &mut Roles) -> Result<(), EvaluatorError> {
    refuse_if_running(&roles.server, "StartServer while a server runs")?;
    let stop = CancellationToken::new();
    links
        .send(EvalToAm::TaskStarted {
            task: TaskKind::Server,
        })
        .await?;
    let run = ps::run_server(
        job.dp.clone(),
        links.to_am.clone(),
        stop.clone(),
        ps::SERVER_REPORT_PERIOD,
    );
    let handle = links.fail_on_error("server", run);
    roles.server = Some(Task { stop, handle });
    Ok(())
}

/// Stops the task in `slot`, which then reports `TaskStopped` itself; with
/// none running, says so at once.
async fn stop_task(
    slot: &mut Option<Task>,
    kind: TaskKind,
    links: &Links,
) -> Result<(), EvaluatorError> {
    match slot.take() {
        Some(t) => t.stop.cancel(),
        None => links.send(EvalToAm::TaskStopped { task: kind }).await?,
    }
    Ok(())
}
