//! Resource managers: where containers come from.
//!
//! One async trait, [`ResourceManager`]: request containers (count, memory,
//! cores, optional hosts), release a given container, ask for capacity, shut
//! down. What happens to containers arrives as [`RmEvent`]s on the channel the
//! implementation was built with, so the AM's event loop sees them in order
//! with everything else. Each container runs the evaluator command given in a
//! [`LaunchSpec`]; the resource manager adds the container's id to its
//! environment.
//!
//! Implementations:
//! - [`local`]: evaluator processes on this machine (the embedded default),
//!   optionally on an emulated cluster of unequal containers ([`emulation`]).
//! - [`yarn`]: the YARN RM REST API (submission, capacity, application
//!   state) and the YARN Services REST API (the evaluator component: create,
//!   flex, decommission, destroy).
//! - [`mesos`]: the Mesos v1 scheduler HTTP API (subscribe, offers, launch,
//!   kill, acknowledge, reconcile, teardown, inverse offers).
//!
//! Capacity taken back without naming containers comes as
//! [`RmEvent::CapacityChanged`] (the AM gives back its newest); taken back
//! with notice — a Mesos inverse offer, a YARN node decommissioning — as
//! [`RmEvent::Reclaiming`], naming the containers and the deadline.
//!
//! [`http`] holds the HTTP plumbing both remote clients share: failover
//! between several server addresses, bounded retries with backoff, and
//! errors naming the endpoint and status.

mod actor;
pub mod emulation;
pub mod http;
pub mod local;
pub mod mesos;
pub mod yarn;

use std::collections::BTreeMap;
use std::path::PathBuf;

/// A container's id, as the resource manager names it.
pub type ContainerId = String;

/// How to start an evaluator in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables (AM address, job id, job secret, logging).
    pub env: BTreeMap<String, String>,
    /// Where containers keep their logs and scratch files.
    pub work_dir: PathBuf,
}

/// A request for containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRequest {
    /// How many.
    pub count: u32,
    /// Memory per container, MiB.
    pub memory_mb: u32,
    /// Cores per container.
    pub cores: u32,
    /// Preferred hosts (empty: anywhere).
    pub hosts: Vec<String>,
}

impl ContainerRequest {
    /// The request's size, `(memory_mb, cores)`, or why a cluster cannot
    /// grant it: containers need memory and cores.
    pub fn size(&self) -> Result<(u32, u32), RmError> {
        if self.memory_mb == 0 || self.cores == 0 {
            return Err(RmError::BadRequest(format!(
                "containers need memory and cores (asked for {} MB, {} cores)",
                self.memory_mb, self.cores
            )));
        }
        Ok((self.memory_mb, self.cores))
    }
}

/// How a container's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Not known (the resource manager did not say).
    Unknown,
}

impl ExitStatus {
    /// Whether the process exited with status 0.
    pub fn success(&self) -> bool {
        matches!(self, ExitStatus::Code(0))
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit code {c}"),
            ExitStatus::Signal(s) => write!(f, "killed by signal {s} ({})", signal_name(*s)),
            ExitStatus::Unknown => f.write_str("unknown exit status"),
        }
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// Something that happened to containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RmEvent {
    /// A container was allocated and its evaluator is being started.
    Allocated {
        /// The container.
        container: ContainerId,
        /// Where.
        host: String,
    },
    /// The evaluator process is running.
    Running {
        /// The container.
        container: ContainerId,
        /// Its process id, if the resource manager knows it.
        pid: Option<u32>,
    },
    /// The container ended.
    Completed {
        /// The container.
        container: ContainerId,
        /// How its process ended.
        exit: ExitStatus,
        /// What the resource manager knows: the tail of stderr, a reason.
        diagnostics: String,
        /// Whether it ended because it was released.
        released: bool,
    },
    /// A request could not be satisfied.
    AllocationFailed {
        /// Why.
        reason: String,
    },
    /// The number of containers this job may hold changed.
    CapacityChanged {
        /// The new maximum.
        max_containers: u32,
    },
    /// The cluster takes these containers back, with notice: the job should
    /// move their blocks off and release them before `deadline`. Past it the
    /// cluster may take them anyway (their end is then a loss). Sent by the
    /// Mesos runtime for inverse offers (agent maintenance) and by the YARN
    /// runtime for decommissioning nodes.
    Reclaiming {
        /// The containers to give back.
        containers: Vec<ContainerId>,
        /// When the cluster takes them regardless (never in the past).
        deadline: std::time::Instant,
        /// Why, in words (the agent or node and its notice).
        reason: String,
    },
}

/// What the resource manager can give this job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Most containers the job may hold.
    pub max_containers: u32,
    /// Containers held now.
    pub running: u32,
}

/// Errors of resource managers.
#[derive(Debug, thiserror::Error)]
pub enum RmError {
    /// The resource manager is not running any more.
    #[error("the {0} resource manager has shut down")]
    Stopped(&'static str),
    /// No such container.
    #[error("unknown container {0}")]
    UnknownContainer(ContainerId),
    /// A request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Starting a process failed.
    #[error("cannot launch {program:?}: {source}")]
    Launch {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A server could not be reached, or kept failing, after bounded retries.
    #[error("{service} unreachable: {endpoint} failed after {attempts} attempts: {reason}")]
    Unreachable {
        /// Which service ("YARN ResourceManager", "Mesos master").
        service: &'static str,
        /// The last request tried, as `METHOD URL`.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// A server answered with a status the client did not expect.
    #[error("{endpoint} answered HTTP {status}: {message}")]
    Http {
        /// The request, as `METHOD URL`.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// A server's answer could not be understood.
    #[error("{endpoint} answered HTTP {status} with an unexpected body: {detail}")]
    Malformed {
        /// The request, as `METHOD URL`.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// What is wrong with it.
        detail: String,
    },
    /// The emulated cluster (`[emulation]`) could not be set up.
    #[error("emulated cluster: {0}")]
    Emulation(String),
    /// Anything else, with context.
    #[error("{0}")]
    Other(String),
}

/// A cluster resource manager, as the AM sees it.
#[async_trait::async_trait]
pub trait ResourceManager: Send + Sync {
    /// Short name for messages ("local", "yarn", "mesos").
    fn name(&self) -> &'static str;

    /// Asks for containers. Answers arrive as events.
    async fn request(&self, req: ContainerRequest) -> Result<(), RmError>;

    /// Releases a container: its evaluator is asked to stop, then killed.
    async fn release(&self, container: &ContainerId) -> Result<(), RmError>;

    /// What this job may hold now.
    async fn capacity(&self) -> Result<Capacity, RmError>;

    /// Releases every container, waits for them to end, and stops.
    async fn shutdown(&self) -> Result<(), RmError>;

    /// The emulated cluster its containers run on, in words (mechanism and
    /// shapes), if any. Only the local runtime emulates.
    fn emulation(&self) -> Option<String> {
        None
    }
}
