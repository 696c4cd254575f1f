//! The Mesos resource manager: a framework speaking the v1 scheduler HTTP
//! API (`PROTOCOLS.md` §5); every evaluator is a command task.
//!
//! One actor task owns the framework: its id (kept for failover), the
//! current `Mesos-Stream-Id`, the tasks, the number of evaluators still
//! wanted, and a view of the agents' free resources from the latest offers.
//! A subscription task reads the event stream ([`recordio`]) and forwards
//! events; a caller task sends the other calls in order. Trait calls map to
//! protocol calls like this:
//!
//! - [`crate::ResourceManager::request`]: the count is added to the evaluators
//!   wanted. Each OFFERS event is packed
//!   with as many evaluators as fit by cpus and mem (ACCEPT with LAUNCH of
//!   command tasks: the evaluator command, the [`LaunchSpec`] environment,
//!   and optionally a URI fetching the evaluator binary); offers not needed
//!   are DECLINEd with a `refuse_seconds` filter (offers keep coming at that
//!   pace, so the capacity view stays fresh); a new request REVIVEs, which
//!   clears the filters. The task id is the container id: a command task
//!   sees it as `MESOS_TASK_ID`.
//! - [`crate::ResourceManager::release`]: KILL; the task's terminal UPDATE becomes
//!   `Completed { released: true }`.
//! - UPDATE events are ACKNOWLEDGEd (when they carry a uuid) and become
//!   `Running` (TASK_RUNNING) and `Completed` (terminal states, with the exit
//!   status parsed from the command executor's message).
//! - [`crate::ResourceManager::capacity`]: held tasks plus how many evaluators fit
//!   in the agents' free resources as last offered; a change is sent as
//!   `CapacityChanged`.
//! - INVERSE_OFFERS (agent maintenance): the tasks on the agent become
//!   `Reclaiming`, deadline the unavailability's start; offers from the
//!   agent are declined; once none of our tasks is left there,
//!   ACCEPT_INVERSE_OFFERS ([`inverse`]).
//! - [`crate::ResourceManager::shutdown`]: KILL every task, wait for their ends (at
//!   most the kill grace), TEARDOWN.
//!
//! Liveness: when no event (HEARTBEAT included) arrives for
//! `missed_heartbeats` heartbeat intervals, or the stream ends, the actor
//! subscribes again with its framework id (failover) and sends RECONCILE for
//! its tasks. Re-subscriptions wait an exponential backoff with jitter
//! (`http.retry`) and give up after `http.retry.attempts` in a row; only a
//! subscription that stayed up for `missed_heartbeats` heartbeat intervals
//! starts the count again (a heartbeat or an offer alone proves nothing).
//! Offers that are malformed or absurd (no id, a negative, non-finite or
//! impossibly large cpus or mem) are declined with a warning saying why. A
//! 307 from a non-leading master is followed. ERROR events and a
//! master that stays unreachable end the framework with `AllocationFailed`.
//! If the actor is dropped without shutdown, [`TeardownGuard`] tears the
//! framework down (re-subscribing first if its stream is gone); the
//! `failover_timeout` is the backstop after that.
//!
//! This file holds the actor (its state, its loop, the trait calls, the
//! call queue); the rest of it lives by concept: the HTTP client
//! [`client`] and the stream's framing [`recordio`]; the subscription and
//! the events it brings `subscription.rs`; offers and launches `offers.rs`;
//! task updates and exit statuses `tasks.rs`; shutdown and the
//! [`TeardownGuard`] `teardown.rs`.

pub mod client;
pub mod inverse;
mod offers;
pub mod recordio;
mod subscription;
mod tasks;
mod teardown;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::actor::{ActorHandle, Cmd};
use crate::http::HttpOptions;
use crate::{Capacity, ContainerId, ContainerRequest, LaunchSpec, RmError, RmEvent};
use client::SchedulerClient;
pub use tasks::{TERMINAL_STATES, parse_exit};
pub use teardown::TeardownGuard;

/// Settings of the Mesos resource manager.
#[derive(Debug, Clone)]
pub struct MesosConfig {
    /// Master addresses (`host:port` or URLs); a non-leader redirects.
    pub masters: Vec<String>,
    /// Retries and timeouts of calls (and of SUBSCRIBE).
    pub http: HttpOptions,
    /// `framework_info.user`: the user tasks run as.
    pub user: String,
    /// `framework_info.name`.
    pub framework_name: String,
    /// The role offers are made for.
    pub role: String,
    /// `framework_info.failover_timeout`, seconds.
    pub failover_timeout_secs: f64,
    /// `refuse_seconds` of DECLINE filters.
    pub refuse_seconds: f64,
    /// Heartbeats that may be missed before re-subscribing.
    pub missed_heartbeats: u32,
    /// Task ids are `<prefix>-<n>`.
    pub task_prefix: String,
    /// A URI every task fetches (the evaluator binary, made executable);
    /// the command then runs `./<its file name>`.
    pub evaluator_uri: Option<String>,
    /// At shutdown, how long killed tasks get to end before TEARDOWN.
    pub kill_grace: Duration,
    /// Container size assumed for capacity before the first request.
    pub default_size: (u32, u32),
}

/// What the subscription and caller tasks tell the actor.
enum Note {
    Subscribed {
        generation: u64,
        stream_id: String,
    },
    Event {
        generation: u64,
        event: Value,
    },
    Ended {
        generation: u64,
        reason: String,
        /// SUBSCRIBE itself failed after its retries.
        fatal: bool,
    },
    CallFailed {
        what: String,
        tasks: Vec<String>,
        error: RmError,
    },
}

/// The Mesos resource manager (a handle to its actor).
pub struct MesosRm {
    actor: ActorHandle,
    framework: Arc<Mutex<FrameworkIds>>,
}

/// The framework's id and current stream, shared with the guard.
#[derive(Debug, Clone, Default)]
pub struct FrameworkIds {
    /// Framework id, once subscribed.
    pub framework_id: Option<String>,
    /// The current `Mesos-Stream-Id`.
    pub stream_id: Option<String>,
}

impl MesosRm {
    /// Checks the settings and starts the actor, which subscribes at once.
    /// Events go to `events`.
    pub fn start(
        config: MesosConfig,
        launch: LaunchSpec,
        events: mpsc::UnboundedSender<RmEvent>,
    ) -> Result<MesosRm, RmError> {
        if config.user.is_empty() || config.framework_name.is_empty() {
            return Err(RmError::BadRequest(
                "a Mesos framework needs a user and a name".into(),
            ));
        }
        if launch.program.is_empty() {
            return Err(RmError::BadRequest("empty evaluator program".into()));
        }
        let client = Arc::new(SchedulerClient::new(&config.masters, config.http.clone())?);
        let ids = Arc::new(Mutex::new(FrameworkIds::default()));
        let guard = TeardownGuard {
            masters: config.masters.clone(),
            subscribe: Value::Null,
            ids: Arc::clone(&ids),
            armed: false,
        };
        let (note_tx, note_rx) = mpsc::unbounded_channel();
        let (call_tx, call_rx) = mpsc::unbounded_channel();
        let caller = tokio::spawn(caller(Arc::clone(&client), call_rx, note_tx.clone()));
        let actor = Actor {
            cfg: config,
            launch,
            events,
            client,
            ids: Arc::clone(&ids),
            note_tx,
            call_tx: Some(call_tx),
            caller: Some(caller),
            stream: None,
            generation: 0,
            stream_id: None,
            heartbeat: Duration::from_secs(15),
            last_event: Instant::now(),
            subscribed_once: false,
            subscribed_at: None,
            resubscribes: 0,
            dead: false,
            tasks: BTreeMap::new(),
            wanted: 0,
            size: None,
            hosts: Vec::new(),
            filtered: false,
            seq: 0,
            agents: HashMap::new(),
            reported_capacity: None,
            draining: BTreeMap::new(),
            maintenance: BTreeMap::new(),
            guard,
        };
        Ok(MesosRm {
            actor: ActorHandle::spawn("mesos", |cmds| actor.run(cmds, note_rx)),
            framework: ids,
        })
    }

    /// The framework id, once subscribed.
    pub fn framework_id(&self) -> Option<String> {
        self.framework
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .framework_id
            .clone()
    }
}

crate::actor::resource_manager_via_actor!(MesosRm, "mesos");

/// A queued call: its JSON, the stream it belongs to, the tasks it launches
/// (reported back if it fails) and who waits for it.
struct CallJob {
    stream_id: String,
    body: Value,
    tasks: Vec<String>,
    done: Option<oneshot::Sender<Result<(), RmError>>>,
}

/// Sends calls one after the other, in the order the actor made them.
async fn caller(
    client: Arc<SchedulerClient>,
    mut calls: mpsc::UnboundedReceiver<CallJob>,
    notes: mpsc::UnboundedSender<Note>,
) {
    while let Some(job) = calls.recv().await {
        let r = client.call(&job.stream_id, &job.body).await;
        match job.done {
            Some(done) => {
                let _ = done.send(r);
            }
            None => {
                if let Err(error) = r {
                    let what = job.body["type"].as_str().unwrap_or("?").to_string();
                    let _ = notes.send(Note::CallFailed {
                        what,
                        tasks: job.tasks,
                        error,
                    });
                }
            }
        }
    }
}

struct Task {
    agent_id: String,
    host: String,
    state: String,
    running: bool,
    released: bool,
    cpus: f64,
    mem: f64,
}

/// Free resources of an agent, as last offered.
#[derive(Debug, Clone, Default)]
struct AgentView {
    cpus: f64,
    mem: f64,
    offers: Vec<String>,
}

struct Actor {
    cfg: MesosConfig,
    launch: LaunchSpec,
    events: mpsc::UnboundedSender<RmEvent>,
    client: Arc<SchedulerClient>,
    ids: Arc<Mutex<FrameworkIds>>,
    note_tx: mpsc::UnboundedSender<Note>,
    call_tx: Option<mpsc::UnboundedSender<CallJob>>,
    caller: Option<JoinHandle<()>>,
    stream: Option<JoinHandle<()>>,
    /// Generation of the current subscription (older notes are ignored).
    generation: u64,
    stream_id: Option<String>,
    heartbeat: Duration,
    last_event: Instant,
    subscribed_once: bool,
    /// When the current subscription was confirmed.
    subscribed_at: Option<Instant>,
    /// Re-subscriptions since a subscription last stayed up for
    /// [`Actor::stable_for`].
    resubscribes: u32,
    /// The framework ended (ERROR, or the master stayed unreachable).
    dead: bool,
    tasks: BTreeMap<String, Task>,
    wanted: u32,
    size: Option<(u32, u32)>,
    hosts: Vec<String>,
    /// Offers were declined with a filter since the last REVIVE.
    filtered: bool,
    seq: u64,
    agents: HashMap<String, AgentView>,
    reported_capacity: Option<u32>,
    /// Inverse offers waiting for our tasks to leave their agents, by id.
    draining: BTreeMap<String, inverse::Pending>,
    /// Every inverse offer not rescinded → its agent, whose offers are
    /// declined.
    maintenance: BTreeMap<String, String>,
    guard: TeardownGuard,
}

impl Actor {
    async fn run(
        mut self,
        mut cmds: mpsc::Receiver<Cmd>,
        mut notes: mpsc::UnboundedReceiver<Note>,
    ) {
        self.guard.subscribe = self.subscribe_call(None);
        self.subscribe();
        let mut watchdog = tokio::time::interval(Duration::from_millis(250));
        watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Request(req, reply)) => {
                        let r = self.request(req);
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Release(id, reply)) => {
                        let r = self.release(&id);
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Capacity(reply)) => {
                        let r = self.capacity();
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Shutdown(reply)) => {
                        let r = self.shutdown(&mut notes).await;
                        let _ = reply.send(r);
                        return;
                    }
                    None => {
                        if let Err(e) = self.shutdown(&mut notes).await {
                            tracing::error!("Mesos resource manager dropped; teardown failed: {e}");
                        }
                        return;
                    }
                },
                Some(note) = notes.recv() => self.on_note(note),
                _ = watchdog.tick() => self.check_heartbeat(),
            }
        }
    }

    fn emit(&self, ev: RmEvent) {
        let _ = self.events.send(ev);
    }

    fn framework_id(&self) -> Option<String> {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .framework_id
            .clone()
    }

    /// Queues a call on the current stream (dropped when not subscribed).
    fn send(&self, body: Value, tasks: Vec<String>) -> bool {
        let (Some(stream_id), Some(tx)) = (self.stream_id.clone(), &self.call_tx) else {
            return false;
        };
        tx.send(CallJob {
            stream_id,
            body,
            tasks,
            done: None,
        })
        .is_ok()
    }

    /// A call body for this framework.
    fn body(&self, ty: &str, payload: Value) -> Value {
        let mut v =
            json!({"type": ty, "framework_id": {"value": self.framework_id().unwrap_or_default()}});
        if !payload.is_null() {
            v[ty.to_ascii_lowercase()] = payload;
        }
        v
    }

    fn request(&mut self, req: ContainerRequest) -> Result<(), RmError> {
        if self.dead {
            return Err(RmError::Other(
                "the Mesos framework has failed; see the earlier error".into(),
            ));
        }
        if req.count == 0 {
            return Ok(());
        }
        let size = req.size()?;
        match self.size {
            None => self.size = Some(size),
            Some(s) if s != size && self.wanted > 0 => {
                return Err(RmError::BadRequest(format!(
                    "{} evaluators of {} MB, {} cores are still pending; cannot ask for {} MB, {} cores at the same time",
                    self.wanted, s.0, s.1, req.memory_mb, req.cores
                )));
            }
            Some(_) => self.size = Some(size),
        }
        self.hosts = req.hosts;
        self.wanted += req.count;
        if self.filtered
            && self.send(
                self.body("REVIVE", json!({"roles": [self.cfg.role]})),
                vec![],
            )
        {
            self.filtered = false;
        }
        Ok(())
    }

    fn release(&mut self, id: &ContainerId) -> Result<(), RmError> {
        let Some(t) = self.tasks.get_mut(id) else {
            return Err(RmError::UnknownContainer(id.clone()));
        };
        if t.released {
            return Ok(());
        }
        t.released = true;
        let agent = t.agent_id.clone();
        let kill = self.body(
            "KILL",
            json!({"task_id": {"value": id}, "agent_id": {"value": agent}}),
        );
        if !self.send(kill, vec![]) {
            return Err(RmError::Other(format!(
                "cannot kill task {id}: not subscribed to a Mesos master"
            )));
        }
        Ok(())
    }

    /// Evaluators that fit in the agents' free resources (saturating: an
    /// absurd offer cannot wrap the count).
    fn fit(&self) -> u32 {
        let (mem, cores) = self.size.unwrap_or(self.cfg.default_size);
        let (mem, cores) = (f64::from(mem.max(1)), f64::from(cores.max(1)));
        self.agents
            .values()
            .map(|a| {
                // `as` saturates a float (and maps NaN to 0).
                ((a.cpus + 1e-9) / cores)
                    .floor()
                    .min(((a.mem + 1e-9) / mem).floor())
                    .max(0.0) as u32
            })
            .fold(0u32, u32::saturating_add)
    }

    fn held(&self) -> u32 {
        u32::try_from(self.tasks.len()).unwrap_or(u32::MAX)
    }

    fn capacity(&self) -> Result<Capacity, RmError> {
        let held = self.held();
        Ok(Capacity {
            max_containers: held.saturating_add(self.fit()),
            running: held,
        })
    }

    fn update_capacity(&mut self) {
        let max = self.held().saturating_add(self.fit());
        match self.reported_capacity {
            None => self.reported_capacity = Some(max),
            Some(r) if r != max => {
                self.reported_capacity = Some(max);
                tracing::info!(max_containers = max, "Mesos capacity changed");
                self.emit(RmEvent::CapacityChanged {
                    max_containers: max,
                });
            }
            Some(_) => {}
        }
    }
}
