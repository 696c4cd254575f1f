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
//! - [`ResourceManager::request`]: the count is added to the evaluators
//!   wanted. Each OFFERS event is packed
//!   with as many evaluators as fit by cpus and mem (ACCEPT with LAUNCH of
//!   command tasks: the evaluator command, the [`LaunchSpec`] environment,
//!   and optionally a URI fetching the evaluator binary); offers not needed
//!   are DECLINEd with a `refuse_seconds` filter (offers keep coming at that
//!   pace, so the capacity view stays fresh); a new request REVIVEs, which
//!   clears the filters. The task id is the container id: a command task
//!   sees it as `MESOS_TASK_ID`.
//! - [`ResourceManager::release`]: KILL; the task's terminal UPDATE becomes
//!   `Completed { released: true }`.
//! - UPDATE events are ACKNOWLEDGEd (when they carry a uuid) and become
//!   `Running` (TASK_RUNNING) and `Completed` (terminal states, with the exit
//!   status parsed from the command executor's message).
//! - [`ResourceManager::capacity`]: held tasks plus how many evaluators fit
//!   in the agents' free resources as last offered; a change is sent as
//!   `CapacityChanged`.
//! - [`ResourceManager::shutdown`]: KILL every task, wait for their ends (at
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
//! impossibly large cpus or mem) are declined with a warning saying why. A 307 from a non-leading master is followed. ERROR events and a
//! master that stays unreachable end the framework with `AllocationFailed`.
//! If the actor is dropped without shutdown, [`TeardownGuard`] tears the
//! framework down (re-subscribing first if its stream is gone); the
//! `failover_timeout` is the backstop after that.

pub mod client;
mod offers;
pub mod recordio;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::actor::{ActorHandle, Cmd};
use crate::http::HttpOptions;
use crate::{Capacity, ContainerId, ContainerRequest, ExitStatus, LaunchSpec, RmError, RmEvent};
use client::{SchedulerClient, next_event};

/// Terminal task states (`isTerminalState` in the master).
pub const TERMINAL_STATES: [&str; 8] = [
    "TASK_FINISHED",
    "TASK_FAILED",
    "TASK_KILLED",
    "TASK_LOST",
    "TASK_ERROR",
    "TASK_DROPPED",
    "TASK_GONE",
    "TASK_GONE_BY_OPERATOR",
];

/// Task states that are not terminal.
const LIVE_STATES: [&str; 6] = [
    "TASK_STAGING",
    "TASK_STARTING",
    "TASK_RUNNING",
    "TASK_KILLING",
    "TASK_UNREACHABLE",
    "TASK_UNKNOWN",
];

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

/// Tears the framework down when dropped while armed (the actor was dropped
/// without shutdown). Sends TEARDOWN on the last stream; if the master
/// refuses it because that stream is gone, subscribes again with the
/// framework id and tears down on the new stream. Blocks the dropping thread
/// for at most a few seconds.
#[derive(Debug)]
pub struct TeardownGuard {
    masters: Vec<String>,
    subscribe: Value,
    ids: Arc<Mutex<FrameworkIds>>,
    armed: bool,
}

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(fid) = ids.framework_id else {
            return;
        };
        let masters = self.masters.clone();
        let mut subscribe = self.subscribe.clone();
        crate::actor::clean_up_blocking(move |opts| async move {
            let Ok(c) = SchedulerClient::new(&masters, opts) else {
                return;
            };
            let teardown = json!({"type": "TEARDOWN", "framework_id": {"value": fid}});
            let first = match &ids.stream_id {
                Some(s) => c.call(s, &teardown).await,
                None => Err(RmError::Other("no stream".into())),
            };
            let result = match first {
                Ok(()) => Ok(()),
                Err(_) => {
                    subscribe["framework_id"] = json!({"value": fid});
                    subscribe["subscribe"]["framework_info"]["id"] = json!({"value": fid});
                    match tokio::time::timeout(Duration::from_secs(5), c.subscribe(&subscribe))
                        .await
                    {
                        Ok(Ok(sub)) => c.call(&sub.stream_id, &teardown).await,
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(RmError::Other("SUBSCRIBE timed out".into())),
                    }
                }
            };
            match result {
                Ok(()) => {
                    tracing::warn!(framework = %fid, "Mesos framework torn down by its guard (the resource manager was dropped without shutdown)")
                }
                Err(e) => {
                    tracing::error!(framework = %fid, "could not tear the Mesos framework down: {e}")
                }
            }
        });
    }
}

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

/// Reads one subscription's events and forwards them.
async fn subscription(
    client: Arc<SchedulerClient>,
    call: Value,
    generation: u64,
    delay: Duration,
    notes: mpsc::UnboundedSender<Note>,
) {
    tokio::time::sleep(delay).await;
    let mut sub = match client.subscribe(&call).await {
        Ok(s) => s,
        Err(e) => {
            let _ = notes.send(Note::Ended {
                generation,
                reason: e.to_string(),
                fatal: true,
            });
            return;
        }
    };
    tracing::info!(master = %sub.master, "subscribed to the Mesos master");
    if notes
        .send(Note::Subscribed {
            generation,
            stream_id: sub.stream_id.clone(),
        })
        .is_err()
    {
        return;
    }
    loop {
        let (reason, stop) = match next_event(&mut sub.events).await {
            Ok(Some(event)) => {
                if notes.send(Note::Event { generation, event }).is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => ("the event stream ended".to_string(), true),
            Err(e) => (e, true),
        };
        if stop {
            let _ = notes.send(Note::Ended {
                generation,
                reason: format!("{reason} (master {})", sub.master),
                fatal: false,
            });
            return;
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

    fn subscribe_call(&self, fid: Option<&str>) -> Value {
        let mut info = json!({
            "user": self.cfg.user,
            "name": self.cfg.framework_name,
            "roles": [self.cfg.role],
            "failover_timeout": self.cfg.failover_timeout_secs,
            "checkpoint": false,
            "capabilities": [{"type": "MULTI_ROLE"}],
        });
        let mut call = json!({"type": "SUBSCRIBE", "subscribe": {"framework_info": info.clone()}});
        if let Some(f) = fid {
            info["id"] = json!({"value": f});
            call = json!({
                "type": "SUBSCRIBE",
                "framework_id": {"value": f},
                "subscribe": {"framework_info": info},
            });
        }
        call
    }

    /// Starts a (new) subscription, replacing the current one.
    fn subscribe(&mut self) {
        self.subscribe_after(Duration::ZERO);
    }

    /// Starts a (new) subscription after `delay`, replacing the current one.
    fn subscribe_after(&mut self, delay: Duration) {
        if let Some(s) = self.stream.take() {
            s.abort();
        }
        self.generation += 1;
        self.subscribed_at = None;
        self.stream_id = None;
        self.set_stream(None);
        let fid = self.framework_id();
        let call = self.subscribe_call(fid.as_deref());
        self.last_event = Instant::now();
        self.stream = Some(tokio::spawn(subscription(
            Arc::clone(&self.client),
            call,
            self.generation,
            delay,
            self.note_tx.clone(),
        )));
    }

    fn set_stream(&self, stream: Option<String>) {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).stream_id = stream;
    }

    fn check_heartbeat(&mut self) {
        if self.dead || self.stream_id.is_none() {
            return;
        }
        let limit = self.heartbeat * self.cfg.missed_heartbeats.max(1);
        if self.last_event.elapsed() > limit {
            tracing::warn!(
                silent_secs = self.last_event.elapsed().as_secs_f64(),
                "no event from the Mesos master for {} heartbeats; subscribing again",
                self.cfg.missed_heartbeats
            );
            self.client.reset_connections();
            self.resubscribe("heartbeats stopped".into());
        }
    }

    /// How long a subscription must stay up to count as working: as long
    /// as the heartbeats it may miss.
    fn stable_for(&self) -> Duration {
        self.heartbeat * self.cfg.missed_heartbeats.max(1)
    }

    fn resubscribe(&mut self, why: String) {
        if self
            .subscribed_at
            .is_some_and(|t| t.elapsed() >= self.stable_for())
        {
            self.resubscribes = 0;
        }
        self.resubscribes += 1;
        let attempts = self.cfg.http.retry.attempts.max(1);
        if self.resubscribes > attempts {
            self.fail(format!(
                "the Mesos master connection keeps failing ({why}); gave up after {} re-subscriptions, none of which stayed up for {:.0} s",
                self.resubscribes - 1,
                self.stable_for().as_secs_f64()
            ));
            return;
        }
        let delay = backoff(&self.cfg.http.retry, self.resubscribes, self.generation);
        tracing::warn!(
            "Mesos subscription lost ({why}); subscribing again in {:.2} s ({} of {attempts})",
            delay.as_secs_f64(),
            self.resubscribes
        );
        self.subscribe_after(delay);
    }

    fn fail(&mut self, reason: String) {
        if self.dead {
            return;
        }
        tracing::error!("Mesos framework failed: {reason}");
        self.dead = true;
        if let Some(s) = self.stream.take() {
            s.abort();
        }
        self.emit(RmEvent::AllocationFailed { reason });
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

    fn on_note(&mut self, note: Note) {
        match note {
            Note::Subscribed {
                generation,
                stream_id,
            } if generation == self.generation => {
                self.stream_id = Some(stream_id.clone());
                self.set_stream(Some(stream_id));
                self.last_event = Instant::now();
                self.subscribed_at = Some(Instant::now());
            }
            Note::Event { generation, event } if generation == self.generation => {
                self.last_event = Instant::now();
                self.on_event(event);
            }
            Note::Ended {
                generation,
                reason,
                fatal,
            } if generation == self.generation => {
                self.stream_id = None;
                self.set_stream(None);
                if self.dead {
                    return;
                }
                if fatal {
                    self.fail(reason);
                } else {
                    self.resubscribe(reason);
                }
            }
            Note::CallFailed { what, tasks, error } => {
                tracing::warn!("Mesos {what} call failed: {error}");
                for t in tasks {
                    self.finish_task(
                        &t,
                        ExitStatus::Unknown,
                        format!("launching the task failed: the {what} call failed: {error}"),
                    );
                }
            }
            _ => {} // a note from an older subscription
        }
    }

    fn on_event(&mut self, ev: Value) {
        let ty = ev["type"].as_str().unwrap_or("");
        match ty {
            "SUBSCRIBED" => {
                let s = &ev["subscribed"];
                let fid = s["framework_id"]["value"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                if let Some(h) = s["heartbeat_interval_seconds"]
                    .as_f64()
                    .filter(|h| *h > 0.0)
                {
                    self.heartbeat = Duration::from_secs_f64(h);
                }
                let again = self.subscribed_once;
                self.subscribed_once = true;
                {
                    let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
                    ids.framework_id = Some(fid.clone());
                }
                self.guard.armed = true;
                tracing::info!(framework = %fid, again, "Mesos framework subscribed");
                if again && !self.tasks.is_empty() {
                    let list: Vec<Value> = self
                        .tasks
                        .iter()
                        .map(|(id, t)| json!({"task_id": {"value": id}, "agent_id": {"value": t.agent_id}}))
                        .collect();
                    self.send(self.body("RECONCILE", json!({"tasks": list})), vec![]);
                }
                if self.wanted > 0 {
                    self.send(
                        self.body("REVIVE", json!({"roles": [self.cfg.role]})),
                        vec![],
                    );
                    self.filtered = false;
                }
            }
            "HEARTBEAT" => {}
            "OFFERS" => {
                let offers = ev["offers"]["offers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                self.on_offers(&offers);
                self.update_capacity();
            }
            "RESCIND" => {
                let oid = ev["rescind"]["offer_id"]["value"].as_str().unwrap_or("");
                self.agents
                    .retain(|_, a| !a.offers.iter().any(|o| o == oid));
                self.update_capacity();
            }
            "UPDATE" => self.on_update(&ev["update"]["status"]),
            "FAILURE" => {
                let f = &ev["failure"];
                let agent = f["agent_id"]["value"].as_str().unwrap_or("");
                if f["executor_id"].is_null() {
                    tracing::warn!(agent, "Mesos agent lost");
                    self.agents.remove(agent);
                    self.update_capacity();
                } else {
                    tracing::info!(agent, executor = %f["executor_id"]["value"], status = %f["status"], "Mesos executor ended");
                }
            }
            "ERROR" => {
                let msg = ev["error"]["message"]
                    .as_str()
                    .or(ev["message"].as_str())
                    .unwrap_or("(no message)");
                self.fail(format!("the Mesos master sent ERROR: {msg}"));
            }
            "MESSAGE" | "INVERSE_OFFERS" | "RESCIND_INVERSE_OFFER" | "UPDATE_OPERATION_STATUS" => {
                tracing::debug!(event = ty, "ignored Mesos event");
            }
            other => tracing::debug!(event = other, "unknown Mesos event"),
        }
    }

    fn on_update(&mut self, status: &Value) {
        let tid = status["task_id"]["value"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let state = status["state"].as_str().unwrap_or("").to_string();
        let agent = status["agent_id"]["value"].as_str().unwrap_or("");
        if let Some(uuid) = status["uuid"].as_str().filter(|u| !u.is_empty())
            && !agent.is_empty()
        {
            self.send(
                self.body(
                    "ACKNOWLEDGE",
                    json!({"agent_id": {"value": agent}, "task_id": {"value": tid}, "uuid": uuid}),
                ),
                vec![],
            );
        }
        if !TERMINAL_STATES.contains(&state.as_str()) && !LIVE_STATES.contains(&state.as_str()) {
            tracing::warn!(
                "Mesos UPDATE for task {tid:?} has state {state:?}, not a Mesos task state; ignored"
            );
            return;
        }
        let Some(t) = self.tasks.get_mut(&tid) else {
            tracing::debug!(task = %tid, %state, "update for a task this framework does not hold");
            return;
        };
        t.state = state.clone();
        if state == "TASK_RUNNING" && !t.running {
            t.running = true;
            let pid = status["container_status"]["executor_pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok());
            self.emit(RmEvent::Running {
                container: tid.clone(),
                pid,
            });
            return;
        }
        if TERMINAL_STATES.contains(&state.as_str()) {
            let message = status["message"].as_str().unwrap_or("");
            let reason = status["reason"].as_str().unwrap_or("");
            let exit = parse_exit(&state, message);
            let mut diag = state.clone();
            if !reason.is_empty() {
                diag.push_str(&format!(" ({reason})"));
            }
            if !message.is_empty() {
                diag.push_str(&format!(": {message}"));
            }
            self.finish_task(&tid, exit, diag);
        } else if matches!(state.as_str(), "TASK_UNREACHABLE" | "TASK_UNKNOWN") {
            tracing::warn!(task = %tid, %state, "Mesos task state unclear");
        }
    }

    fn finish_task(&mut self, tid: &str, exit: ExitStatus, diagnostics: String) {
        let Some(t) = self.tasks.remove(tid) else {
            return;
        };
        if let Some(a) = self.agents.get_mut(&t.agent_id) {
            a.cpus += t.cpus;
            a.mem += t.mem;
        }
        tracing::info!(task = %tid, host = %t.host, %exit, released = t.released, "evaluator task ended");
        self.emit(RmEvent::Completed {
            container: tid.to_string(),
            exit,
            diagnostics,
            released: t.released,
        });
        self.update_capacity();
    }

    async fn shutdown(&mut self, notes: &mut mpsc::UnboundedReceiver<Note>) -> Result<(), RmError> {
        self.wanted = 0;
        let result = self.teardown(notes).await;
        let ids: Vec<String> = self.tasks.keys().cloned().collect();
        for id in ids {
            if let Some(t) = self.tasks.get_mut(&id) {
                t.released = true;
            }
            self.finish_task(
                &id,
                ExitStatus::Unknown,
                "framework torn down at shutdown".into(),
            );
        }
        if let Some(s) = self.stream.take() {
            s.abort();
        }
        // Close the call queue and let the caller finish what is queued.
        self.call_tx = None;
        if let Some(c) = self.caller.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), c).await;
        }
        result
    }

    async fn teardown(&mut self, notes: &mut mpsc::UnboundedReceiver<Note>) -> Result<(), RmError> {
        if self.framework_id().is_none() {
            if let Some(s) = self.stream.take() {
                s.abort();
            }
            return Ok(());
        }
        // Kill every task and wait for their ends (bounded).
        let ids: Vec<String> = self.tasks.keys().cloned().collect();
        for id in &ids {
            let _ = self.release(id);
        }
        let deadline = Instant::now() + self.cfg.kill_grace + Duration::from_secs(2);
        while !self.tasks.is_empty() && self.stream_id.is_some() && Instant::now() < deadline {
            match tokio::time::timeout_at(deadline.into(), notes.recv()).await {
                Ok(Some(n)) => self.on_note(n),
                _ => break,
            }
        }
        let Some(stream_id) = self.stream_id.clone() else {
            // The stream is gone: the guard re-subscribes to tear down.
            return Err(RmError::Other(
                "not subscribed at shutdown; tearing the framework down through its guard".into(),
            ));
        };
        let (done_tx, done_rx) = oneshot::channel();
        let body = self.body("TEARDOWN", Value::Null);
        let queued = self.call_tx.as_ref().is_some_and(|tx| {
            tx.send(CallJob {
                stream_id,
                body,
                tasks: vec![],
                done: Some(done_tx),
            })
            .is_ok()
        });
        if !queued {
            return Err(RmError::Stopped("mesos"));
        }
        match done_rx.await {
            Ok(Ok(())) => {
                self.guard.armed = false;
                tracing::info!(framework = ?self.framework_id(), "Mesos framework torn down");
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RmError::Stopped("mesos")),
        }
    }
}

/// The wait before re-subscription `n` (1-based): the policy's initial
/// backoff doubled per attempt, at most its maximum, with jitter (between
/// half and all of it) so that frameworks do not come back in step.
fn backoff(policy: &crate::http::RetryPolicy, n: u32, seed: u64) -> Duration {
    use std::hash::BuildHasher;
    let base = policy
        .initial_backoff
        .saturating_mul(1u32 << (n.saturating_sub(1)).min(16))
        .min(policy.max_backoff);
    let r = std::collections::hash_map::RandomState::new().hash_one(seed);
    let frac = 0.5 + 0.5 * (r % 1000) as f64 / 1000.0;
    base.mul_f64(frac)
}

/// The exit status in a terminal update, from the command executor's
/// message ("Command exited with status 3", "Command terminated with signal
/// Killed").
pub fn parse_exit(state: &str, message: &str) -> ExitStatus {
    if let Some(rest) = message.split("exited with status ").nth(1) {
        let digits: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-')
            .collect();
        if let Ok(c) = digits.parse() {
            return ExitStatus::Code(c);
        }
    }
    if let Some(rest) = message.split("terminated with signal ").nth(1) {
        let name = rest.trim().trim_end_matches('.');
        if let Some(sig) = signal_number(name) {
            return ExitStatus::Signal(sig);
        }
    }
    if state == "TASK_FINISHED" {
        return ExitStatus::Code(0);
    }
    ExitStatus::Unknown
}

fn signal_number(name: &str) -> Option<i32> {
    let n = match name {
        "Hangup" | "SIGHUP" => 1,
        "Interrupt" | "SIGINT" => 2,
        "Quit" | "SIGQUIT" => 3,
        "Aborted" | "SIGABRT" => 6,
        "Killed" | "SIGKILL" => 9,
        "User defined signal 1" | "SIGUSR1" => 10,
        "Segmentation fault" | "SIGSEGV" => 11,
        "User defined signal 2" | "SIGUSR2" => 12,
        "Broken pipe" | "SIGPIPE" => 13,
        "Terminated" | "SIGTERM" => 15,
        other => return other.parse().ok(),
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits() {
        assert_eq!(
            parse_exit("TASK_FAILED", "Command exited with status 3"),
            ExitStatus::Code(3)
        );
        assert_eq!(
            parse_exit("TASK_KILLED", "Command terminated with signal Killed"),
            ExitStatus::Signal(9)
        );
        assert_eq!(
            parse_exit("TASK_KILLED", "Command terminated with signal Terminated"),
            ExitStatus::Signal(15)
        );
        assert_eq!(parse_exit("TASK_FINISHED", ""), ExitStatus::Code(0));
        assert_eq!(
            parse_exit("TASK_LOST", "Agent removed"),
            ExitStatus::Unknown
        );
    }

    #[test]
    fn backoff_grows_with_jitter_to_its_cap() {
        let p = crate::http::RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        };
        for seed in 0..50 {
            let b1 = backoff(&p, 1, seed);
            assert!(b1 >= Duration::from_millis(100) && b1 <= Duration::from_millis(200));
            let b4 = backoff(&p, 4, seed);
            assert!(b4 >= Duration::from_millis(800) && b4 <= Duration::from_millis(1600));
            let b20 = backoff(&p, 20, seed);
            assert!(b20 >= Duration::from_millis(2500) && b20 <= Duration::from_secs(5));
        }
    }
}
