//! The evaluator: its event loop and process entry point.
//!
//! Modules: who the evaluator is (`env`), and what it does for the AM once
//! the job is set up (`commands`: the job, the role tasks, one function per
//! command). Here: the control loop and its state.
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

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::SplitStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::ChannelConfig;

use crate::emulate;
use crate::os;
use crate::protocol::{self, AmToEval, EvalToAm, Faults, FrameOptions, ProtocolError, Purpose};

mod commands;
mod env;

use commands::{Job, Links, Roles, handle, start_job, stop_roles};
pub use env::{
    CONTAINER_ID_FALLBACKS, ENV_AM_ADDR, ENV_CONTAINER_ID, ENV_JOB_ID, ENV_JOB_SECRET, EvaluatorEnv,
};

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

impl EvaluatorError {
    /// Whether this evaluator ended because it could not reach its AM, or
    /// lost it: not connected, not accepted, or the connection dropped or
    /// went silent.
    pub fn am_unreachable(&self) -> bool {
        matches!(
            self,
            EvaluatorError::Connect { .. }
                | EvaluatorError::Handshake { .. }
                | EvaluatorError::AmLost(_)
        )
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

/// Runs an evaluator until the AM shuts it down (`Ok`), `shutdown` is
/// cancelled (`Ok`, after a graceful stop), or something fails.
pub async fn run(
    env: EvaluatorEnv,
    opts: EvaluatorOptions,
    shutdown: CancellationToken,
) -> Result<(), EvaluatorError> {
    let defaults = ChannelConfig::default();
    install_throttle(&env)?;
    let (framed, listener) = connect_to_am(&env, &defaults).await?;
    let data_addr = listener.local_addr().map_err(|source| EvaluatorError::Io {
        context: "data-plane address".into(),
        source,
    })?;
    let (sink, stream) = framed.split();
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
        None,
    );
    let (fail_tx, fail_rx) = mpsc::channel::<String>(16);
    let links = Links {
        to_am: to_am.clone(),
        fail: fail_tx,
        tracker: tracker.clone(),
        min_clock: watch::channel(0u32).0,
        rollback: watch::channel(crate::ps::ClockRollback::default()).0,
        recount: watch::channel(crate::ps::RecountOrder::default()).0,
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
    let result = ev.serve(stream, fail_rx, &cancel, &conn_cancel).await;

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

/// Installs the in-process emulation of a slower container, if `env`
/// asks for one.
fn install_throttle(env: &EvaluatorEnv) -> Result<(), EvaluatorError> {
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
    Ok(())
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
    /// The control loop: the AM's messages, the heartbeat timer and the
    /// tasks' failures, until the AM shuts this evaluator down (`Ok`),
    /// `cancel` is cancelled (`Ok`), or something fails.
    async fn serve(
        &mut self,
        mut stream: SplitStream<ControlChannel>,
        mut fail_rx: mpsc::Receiver<String>,
        cancel: &CancellationToken,
        conn_cancel: &CancellationToken,
    ) -> Result<(), EvaluatorError> {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    tracing::info!("stopping on request (signal)");
                    return Ok(());
                }
                _ = conn_cancel.cancelled() => return Err(EvaluatorError::AmLost("the control connection failed".into())),
                _ = self.opts.control_faults.broken() => return Err(EvaluatorError::AmLost("control connection broken (injected fault)".into())),
                Some(error) = fail_rx.recv() => {
                    let _ = self.links.to_am.send(EvalToAm::Fatal { error: error.clone() }).await;
                    return Err(EvaluatorError::Task(error));
                }
                _ = self.liveness.interval.tick() => self.heartbeat()?,
                frame = stream.next() => {
                    let msg = match frame {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => return Err(EvaluatorError::AmLost(format!("control channel error: {e}"))),
                        None => return Err(EvaluatorError::AmLost("the AM closed the control connection".into())),
                    };
                    self.liveness.last_heard = Instant::now();
                    if self.on_message(msg).await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// On the heartbeat timer: an error if the AM has gone silent, else a
    /// heartbeat to it (dropped if the channel is full).
    fn heartbeat(&self) -> Result<(), EvaluatorError> {
        self.liveness.check()?;
        let (rss, peak) = os::memory();
        let store_bytes = self.job.as_ref().map_or(0, |j| j.dp.store().bytes_held());
        let _ = self.links.to_am.try_send(EvalToAm::Heartbeat {
            rss_bytes: rss,
            peak_rss_bytes: peak,
            store_bytes,
        });
        Ok(())
    }

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
