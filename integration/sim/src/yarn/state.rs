//! The YARN simulator's cluster state: nodes, applications and their attempts,
//! containers, YARN services, the pending-request queue and the scheduler.
//!
//! Everything here is synchronous and lives behind one mutex owned by
//! [`super::Sim`]; no method awaits. Methods that decide to start a container
//! return [`LaunchJob`]s, which the caller runs outside the lock; when a
//! container process ends the supervisor calls [`State::container_finished`].

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::common::{Outcome, now_ms, tail_file};

/// `ContainerExitStatus` values used by the RM.
pub(crate) mod exit {
    pub const SUCCESS: i32 = 0;
    pub const INVALID: i32 = -1000;
    pub const ABORTED: i32 = -100;
    pub const PREEMPTED: i32 = -102;
    pub const KILLED_BY_RESOURCEMANAGER: i32 = -106;
}

/// Static configuration of the simulated cluster.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub work_dir: PathBuf,
    pub node_memory_mb: u64,
    pub node_vcores: u64,
    pub min_allocation_mb: u64,
    pub max_allocation_mb: u64,
    pub max_allocation_vcores: u64,
    pub am_max_attempts: u32,
    pub service_restart_delay: Duration,
    pub dns_domain: String,
    /// Nodes get hosts of their own (`127.0.0.<n+1>`) instead of all
    /// `127.0.0.1`, so a node's containers can be told by host.
    pub distinct_node_hosts: bool,
    /// `host:port` of this simulator's HTTP server (known after bind).
    pub http_address: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeState {
    Running,
    /// Being decommissioned gracefully (`POST /sim/decommission`): nothing
    /// new is placed on it; its containers run on.
    Decommissioning,
    Decommissioned,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Running => "RUNNING",
            NodeState::Decommissioning => "DECOMMISSIONING",
            NodeState::Decommissioned => "DECOMMISSIONED",
        }
    }
}

/// A simulated NodeManager. All nodes run their containers on this machine.
#[derive(Debug)]
pub(crate) struct Node {
    pub host: String,
    pub port: u16,
    pub memory_mb: u64,
    pub vcores: u64,
    pub state: NodeState,
    pub last_health_update: u64,
    /// `decommissioningTimeout` (seconds) while DECOMMISSIONING, if given.
    pub decommissioning_timeout: Option<u64>,
}

impl Node {
    pub fn id(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Who a container belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    Am {
        app: String,
        attempt: u32,
    },
    Instance {
        service: String,
        component: String,
        instance: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Allocated; being localized and launched.
    Allocated,
    Running,
    Complete,
}

/// One container, live or completed.
#[derive(Debug)]
pub(crate) struct Container {
    pub id: String,
    pub app_id: String,
    pub owner: Owner,
    pub node: usize,
    pub memory_mb: u64,
    pub vcores: u64,
    pub phase: Phase,
    pub pid: Option<u32>,
    pub allocated_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub exit_status: Option<i32>,
    pub diagnostics: String,
    pub kill: CancellationToken,
    /// Set when the simulator kills the container: exit status and reason.
    pub kill_reason: Option<(i32, String)>,
    pub cwd: PathBuf,
    pub log_dir: PathBuf,
}

/// A local resource of an AM container spec.
#[derive(Debug, Clone)]
pub(crate) struct LocalResource {
    pub key: String,
    pub url: String,
    pub kind: String,
    pub visibility: String,
    pub size: i64,
    pub timestamp: i64,
    /// Check `size` and `timestamp` against the source (AM local resources);
    /// a service artifact is taken as the file system has it, the way the
    /// ServiceMaster reads its status before launching.
    pub verify: bool,
}

/// The AM container launch context of a submitted application.
#[derive(Debug, Clone)]
pub(crate) struct AmSpec {
    pub command: String,
    pub env: Vec<(String, String)>,
    pub resources: Vec<LocalResource>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppState {
    Accepted,
    Running,
    Finished,
    Failed,
    Killed,
}

impl AppState {
    pub fn as_str(self) -> &'static str {
        match self {
            AppState::Accepted => "ACCEPTED",
            AppState::Running => "RUNNING",
            AppState::Finished => "FINISHED",
            AppState::Failed => "FAILED",
            AppState::Killed => "KILLED",
        }
    }
    pub fn is_final(self) -> bool {
        matches!(
            self,
            AppState::Finished | AppState::Failed | AppState::Killed
        )
    }
}

#[derive(Debug)]
pub(crate) struct Attempt {
    pub n: u32,
    pub container: Option<String>,
    pub node: Option<usize>,
    pub start_ms: u64,
    pub finish_ms: Option<u64>,
    pub state: &'static str,
    pub diagnostics: String,
}

/// A YARN application (submitted through `/apps`, or the application behind a
/// YARN service).
#[derive(Debug)]
pub(crate) struct App {
    pub id: String,
    pub seq: u32,
    pub user: String,
    pub name: String,
    pub queue: String,
    pub app_type: String,
    pub tags: Vec<String>,
    pub priority: i64,
    pub unmanaged: bool,
    /// `None` for service applications, whose AM is not a real process here.
    pub am: Option<AmSpec>,
    pub memory_mb: u64,
    pub vcores: u64,
    pub max_attempts: u32,
    pub state: AppState,
    pub final_status: &'static str,
    pub diagnostics: String,
    pub started_ms: u64,
    pub launch_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub attempts: Vec<Attempt>,
    pub service: Option<String>,
    pub next_container: u64,
    /// Attempts that counted towards `max_attempts`.
    pub counted_failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "ALWAYS",
            RestartPolicy::OnFailure => "ON_FAILURE",
            RestartPolicy::Never => "NEVER",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InstPhase {
    /// Waiting in the scheduler queue for a container.
    Pending,
    /// Waiting out the restart delay after its container ended.
    Waiting,
    /// Has a container that is being launched.
    Allocated,
    /// Its container's process runs.
    Ready,
    Succeeded,
    Failed,
}

impl InstPhase {
    /// Container state as the Services API reports it.
    pub fn container_state(self) -> &'static str {
        match self {
            InstPhase::Pending | InstPhase::Allocated => "RUNNING_BUT_UNREADY",
            // ComponentInstance marks the ended container STOPPED until a
            // new one replaces it.
            InstPhase::Waiting => "STOPPED",
            InstPhase::Ready => "READY",
            InstPhase::Succeeded => "SUCCEEDED",
            InstPhase::Failed => "FAILED",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Instance {
    pub idx: u64,
    pub name: String,
    pub container: Option<String>,
    pub phase: InstPhase,
    pub launch_ms: Option<u64>,
    pub restart_at: Option<Instant>,
    /// Exit status and diagnostics of its last container.
    pub last_exit: Option<(i32, String)>,
    pub last_container: Option<String>,
    pub restarts: u32,
}

#[derive(Debug)]
pub(crate) struct Component {
    pub name: String,
    pub spec: Value,
    pub launch_command: String,
    /// A TARBALL artifact, localized into `lib/` of every container.
    pub artifact: Option<String>,
    pub env: Vec<(String, String)>,
    pub memory_mb: u64,
    pub vcores: u64,
    pub restart: RestartPolicy,
    pub desired: u64,
    pub counter: u64,
    pub instances: BTreeMap<u64, Instance>,
    pub decommissioned: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServiceState {
    Started,
    Stable,
    Stopped,
}

impl ServiceState {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceState::Started => "STARTED",
            ServiceState::Stable => "STABLE",
            ServiceState::Stopped => "STOPPED",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Service {
    pub name: String,
    pub spec: Value,
    pub user: String,
    pub app_id: String,
    pub state: ServiceState,
    pub launch_ms: u64,
    pub components: Vec<Component>,
    /// When the service's lifetime (seconds from start) runs out.
    pub lifetime_deadline: Option<Instant>,
}

impl Service {
    pub fn component_mut(&mut self, name: &str) -> Option<&mut Component> {
        self.components.iter_mut().find(|c| c.name == name)
    }
}

#[derive(Debug, Clone)]
enum PendingKind {
    Am {
        app: String,
    },
    Instance {
        service: String,
        component: String,
        instance: String,
    },
}

#[derive(Debug, Clone)]
struct Pending {
    kind: PendingKind,
    memory_mb: u64,
    vcores: u64,
}

/// Work for the caller: localize and launch one container.
#[derive(Debug)]
pub(crate) struct LaunchJob {
    pub container_id: String,
    pub cwd: PathBuf,
    pub log_dir: PathBuf,
    /// Contents of `launch_container.sh` (exports + `exec bash -c CMD`).
    pub script: String,
    pub resources: Vec<LocalResource>,
    pub user: String,
    pub kill: CancellationToken,
}

/// How a container's launch ended.
#[derive(Debug)]
pub(crate) enum Finish {
    /// The process ran and exited.
    Exited(Outcome),
    /// Localization or process start failed.
    LaunchFailed {
        exit_status: i32,
        diagnostics: String,
    },
    /// Killed before its process started.
    NeverStarted,
}

/// Capacity change requested through `PUT /sim/capacity`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CapacityChange {
    pub nodes: Option<usize>,
    pub node_memory_mb: Option<u64>,
    pub node_vcores: Option<u64>,
}

/// The whole cluster state.
pub(crate) struct State {
    pub cfg: Config,
    pub cluster_ts: u64,
    pub started_ms: u64,
    next_app_seq: u32,
    issued_ids: HashSet<String>,
    pub nodes: Vec<Node>,
    pub apps: BTreeMap<String, App>,
    pub containers: BTreeMap<String, Container>,
    pending: VecDeque<Pending>,
    pub services: BTreeMap<String, Service>,
    /// Parent of every container's kill token (cancelled at shutdown).
    root_kill: CancellationToken,
    /// Set at shutdown: nothing new is scheduled or retried.
    shutting_down: bool,
}

pub(crate) fn shell_single_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The NodeManager's expansion of `{{VAR}}`, `<LOG_DIR>` and `<CPS>`.
pub(crate) fn expand_nm(s: &str, log_dir: &str) -> String {
    s.replace("<LOG_DIR>", log_dir)
        .replace("<CPS>", ":")
        .replace("{{", "$")
        .replace("}}", "")
}

impl State {
    pub fn new(cfg: Config, nodes: usize, root_kill: CancellationToken) -> State {
        let now = now_ms();
        let mut st = State {
            cluster_ts: now,
            started_ms: now,
            next_app_seq: 1,
            issued_ids: HashSet::new(),
            nodes: Vec::new(),
            apps: BTreeMap::new(),
            containers: BTreeMap::new(),
            pending: VecDeque::new(),
            services: BTreeMap::new(),
            root_kill,
            shutting_down: false,
            cfg,
        };
        for _ in 0..nodes {
            st.add_node();
        }
        st
    }

    fn add_node(&mut self) {
        let i = self.nodes.len();
        let host = if self.cfg.distinct_node_hosts {
            format!("127.0.0.{}", (i % 254) + 1)
        } else {
            "127.0.0.1".into()
        };
        self.nodes.push(Node {
            host,
            port: 45454 + i as u16,
            memory_mb: self.cfg.node_memory_mb,
            vcores: self.cfg.node_vcores,
            state: NodeState::Running,
            last_health_update: now_ms(),
            decommissioning_timeout: None,
        });
    }

    /// Starts decommissioning node `id` (`host:port`) gracefully.
    pub fn decommission(&mut self, id: &str, timeout_secs: Option<u64>) -> Result<(), String> {
        let Some(n) = self.nodes.iter_mut().find(|n| n.id() == id) else {
            return Err(format!("no node {id}"));
        };
        if n.state != NodeState::Running {
            return Err(format!("node {id} is {}, not RUNNING", n.state.as_str()));
        }
        n.state = NodeState::Decommissioning;
        n.decommissioning_timeout = timeout_secs;
        n.last_health_update = now_ms();
        Ok(())
    }

    // ---------- resources ----------

    /// Memory and vcores allocated on node `i` (live containers).
    pub fn node_used(&self, i: usize) -> (u64, u64, usize) {
        self.containers
            .values()
            .filter(|c| c.node == i && c.phase != Phase::Complete)
            .fold((0, 0, 0), |(m, v, n), c| {
                (m + c.memory_mb, v + c.vcores, n + 1)
            })
    }

    /// Normalize a request the way the scheduler does: memory rounded up to a
    /// multiple of the minimum allocation, at least one vcore.
    pub fn normalize(&self, memory_mb: u64, vcores: u64) -> (u64, u64) {
        let min = self.cfg.min_allocation_mb.max(1);
        let mem = memory_mb.max(1).div_ceil(min) * min;
        (mem, vcores.max(1))
    }

    /// Check a request against the maximum allocation.
    pub fn check_max(&self, memory_mb: u64, vcores: u64) -> Result<(), String> {
        if memory_mb > self.cfg.max_allocation_mb || vcores > self.cfg.max_allocation_vcores {
            return Err(format!(
                "Invalid resource request, requested resource <memory:{memory_mb}, vCores:{vcores}> is \
                 greater than the maximum allowed allocation <memory:{}, vCores:{}>",
                self.cfg.max_allocation_mb, self.cfg.max_allocation_vcores
            ));
        }
        Ok(())
    }

    // ---------- ids ----------

    pub fn new_application_id(&mut self) -> String {
        let id = format!("application_{}_{:04}", self.cluster_ts, self.next_app_seq);
        self.next_app_seq += 1;
        self.issued_ids.insert(id.clone());
        id
    }

    /// Consume an id handed out by `new_application_id`.
    pub fn take_issued_id(&mut self, id: &str) -> Result<u32, String> {
        if self.apps.contains_key(id) {
            return Err(format!(
                "Application with id {id} is already present! Cannot add a duplicate!"
            ));
        }
        if !self.issued_ids.remove(id) {
            return Err(format!(
                "Application id {id} was not issued by this ResourceManager (call POST /ws/v1/cluster/apps/new-application first)"
            ));
        }
        id.rsplit('_')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("Invalid ApplicationId: {id}"))
    }

    fn container_id(&mut self, app_id: &str, attempt: u32) -> String {
        let (ts, seq) = match self.apps.get_mut(app_id) {
            Some(app) => {
                app.next_container += 1;
                (app.next_container, app.seq)
            }
            None => (0, 0),
        };
        format!(
            "container_{}_{:04}_{:02}_{:06}",
            self.cluster_ts, seq, attempt, ts
        )
    }

    pub fn attempt_id(&self, seq: u32, n: u32) -> String {
        format!("appattempt_{}_{:04}_{:06}", self.cluster_ts, seq, n)
    }

    // ---------- applications ----------

    /// Register a submitted application and queue its AM container.
    pub fn submit_app(&mut self, app: App) {
        let id = app.id.clone();
        let (mem, vc) = (app.memory_mb, app.vcores);
        let managed = app.am.is_some() && !app.unmanaged;
        self.apps.insert(id.clone(), app);
        if managed {
            self.start_attempt(&id);
            self.pending.push_back(Pending {
                kind: PendingKind::Am { app: id },
                memory_mb: mem,
                vcores: vc,
            });
        }
    }

    fn start_attempt(&mut self, app_id: &str) {
        if let Some(app) = self.apps.get_mut(app_id) {
            let n = app.attempts.len() as u32 + 1;
            app.attempts.push(Attempt {
                n,
                container: None,
                node: None,
                start_ms: now_ms(),
                finish_ms: None,
                state: "SCHEDULED",
                diagnostics: String::new(),
            });
            app.state = AppState::Accepted;
            app.diagnostics = format!(
                "[{}] Application is added to the scheduler and is not yet activated. \
                 Waiting for AM container to be allocated, launched and registered with RM.",
                super::common::iso8601_ms(now_ms() as i64)
            );
        }
    }

    /// Kill an application at the user's request. Returns false when it was
    /// already final.
    pub fn kill_app(&mut self, app_id: &str, user: &str) -> bool {
        let Some(app) = self.apps.get_mut(app_id) else {
            return false;
        };
        if app.state.is_final() {
            return false;
        }
        let diag = format!("Application {app_id} was killed by user {user} at 127.0.0.1");
        app.state = AppState::Killed;
        app.final_status = "KILLED";
        app.finished_ms = Some(now_ms());
        app.diagnostics = diag.clone();
        if let Some(att) = app.attempts.last_mut()
            && att.finish_ms.is_none()
        {
            att.finish_ms = Some(now_ms());
            att.state = "KILLED";
            att.diagnostics = diag;
        }
        let service = app.service.clone();
        let live: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.app_id == app_id && c.phase != Phase::Complete)
            .map(|c| c.id.clone())
            .collect();
        for cid in live {
            self.kill_container(
                &cid,
                exit::KILLED_BY_RESOURCEMANAGER,
                "Container killed by the ResourceManager: the application was killed",
            );
        }
        if let Some(svc) = service.and_then(|s| self.services.get_mut(&s)) {
            svc.state = ServiceState::Stopped;
            for comp in &mut svc.components {
                comp.instances.clear();
            }
        }
        true
    }

    /// Ask a container to die; the exit is reported with `status` and `why`.
    pub fn kill_container(&mut self, cid: &str, status: i32, why: &str) {
        if let Some(c) = self.containers.get_mut(cid)
            && c.phase != Phase::Complete
        {
            if c.kill_reason.is_none() {
                c.kill_reason = Some((status, why.to_string()));
            }
            c.kill.cancel();
        }
    }

    // ---------- scheduling ----------

    /// Allocate containers for queued requests, first fit on the node with
    /// the most free memory. Returns the launches to run.
    pub fn schedule(&mut self) -> Vec<LaunchJob> {
        let mut jobs = Vec::new();
        if self.shutting_down {
            return jobs;
        }
        let mut keep = VecDeque::new();
        while let Some(p) = self.pending.pop_front() {
            if !self.pending_is_live(&p) {
                continue;
            }
            match self.pick_node(p.memory_mb, p.vcores) {
                Some(node) => {
                    if let Some(job) = self.allocate(&p, node) {
                        jobs.push(job);
                    }
                }
                None => keep.push_back(p),
            }
        }
        self.pending = keep;
        jobs
    }

    fn pending_is_live(&self, p: &Pending) -> bool {
        match &p.kind {
            PendingKind::Am { app } => self.apps.get(app).is_some_and(|a| {
                a.state == AppState::Accepted
                    && a.attempts.last().is_some_and(|t| t.container.is_none())
            }),
            PendingKind::Instance {
                service,
                component,
                instance,
            } => self
                .services
                .get(service)
                .and_then(|s| s.components.iter().find(|c| &c.name == component))
                .and_then(|c| c.instances.values().find(|i| &i.name == instance))
                .is_some_and(|i| i.phase == InstPhase::Pending),
        }
    }

    fn pick_node(&self, mem: u64, vcores: u64) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            if n.state != NodeState::Running {
                continue;
            }
            let (um, uv, _) = self.node_used(i);
            let free_m = n.memory_mb.saturating_sub(um);
            let free_v = n.vcores.saturating_sub(uv);
            if free_m >= mem && free_v >= vcores && best.is_none_or(|(_, bm)| free_m > bm) {
                best = Some((i, free_m));
            }
        }
        best.map(|(i, _)| i)
    }

    fn new_container(
        &mut self,
        app_id: &str,
        attempt: u32,
        owner: Owner,
        node: usize,
        mem: u64,
        vc: u64,
    ) -> String {
        let cid = self.container_id(app_id, attempt);
        let cwd = self.cfg.work_dir.join("yarn").join(app_id).join(&cid);
        let log_dir = cwd.join("logs");
        self.containers.insert(
            cid.clone(),
            Container {
                id: cid.clone(),
                app_id: app_id.to_string(),
                owner,
                node,
                memory_mb: mem,
                vcores: vc,
                phase: Phase::Allocated,
                pid: None,
                allocated_ms: now_ms(),
                started_ms: None,
                finished_ms: None,
                exit_status: None,
                diagnostics: String::new(),
                kill: self.root_kill.child_token(),
                kill_reason: None,
                cwd,
                log_dir,
            },
        );
        cid
    }

    /// Environment every container gets from its NodeManager.
    fn nm_env(&self, c: &Container, user: &str, app: &App) -> Vec<(String, String)> {
        let node = &self.nodes[c.node];
        let app_dir = c
            .cwd
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        vec![
            ("CONTAINER_ID".into(), c.id.clone()),
            ("NM_HOST".into(), node.host.clone()),
            ("NM_PORT".into(), node.port.to_string()),
            (
                "NM_HTTP_PORT".into(),
                self.cfg
                    .http_address
                    .rsplit(':')
                    .next()
                    .unwrap_or("0")
                    .to_string(),
            ),
            ("LOCAL_DIRS".into(), app_dir.clone()),
            ("LOCAL_USER_DIRS".into(), app_dir),
            ("LOG_DIRS".into(), c.log_dir.display().to_string()),
            ("USER".into(), user.to_string()),
            ("LOGNAME".into(), user.to_string()),
            ("HADOOP_USER_NAME".into(), user.to_string()),
            ("PWD".into(), c.cwd.display().to_string()),
            ("APP_SUBMIT_TIME_ENV".into(), app.started_ms.to_string()),
        ]
    }

    fn allocate(&mut self, p: &Pending, node: usize) -> Option<LaunchJob> {
        match &p.kind {
            PendingKind::Am { app } => {
                let attempt = self.apps.get(app)?.attempts.last()?.n;
                let cid = self.new_container(
                    app,
                    attempt,
                    Owner::Am {
                        app: app.clone(),
                        attempt,
                    },
                    node,
                    p.memory_mb,
                    p.vcores,
                );
                let node_id = self.nodes[node].id();
                let a = self.apps.get_mut(app)?;
                if let Some(att) = a.attempts.last_mut() {
                    att.container = Some(cid.clone());
                    att.node = Some(node);
                    att.state = "ALLOCATED";
                }
                a.diagnostics = format!(
                    "[{}] AM container {cid} allocated on node {node_id}; launching.",
                    super::common::iso8601_ms(now_ms() as i64)
                );
                let app = self.apps.get(app)?;
                let c = self.containers.get(&cid)?;
                let am = app.am.as_ref()?;
                let log_dir = c.log_dir.display().to_string();
                let mut env = self.nm_env(c, &app.user, app);
                env.push(("MAX_APP_ATTEMPTS".into(), app.max_attempts.to_string()));
                env.push((
                    "APPLICATION_WEB_PROXY_BASE".into(),
                    format!("/proxy/{}", app.id),
                ));
                for (k, v) in &am.env {
                    env.push((k.clone(), expand_nm(v, &log_dir)));
                }
                let command = expand_nm(&am.command, &log_dir);
                Some(LaunchJob {
                    container_id: cid.clone(),
                    cwd: c.cwd.clone(),
                    log_dir: c.log_dir.clone(),
                    script: launch_script(&env, &command),
                    resources: am.resources.clone(),
                    user: app.user.clone(),
                    kill: c.kill.clone(),
                })
            }
            PendingKind::Instance {
                service,
                component,
                instance,
            } => {
                let app_id = self.services.get(service)?.app_id.clone();
                let cid = self.new_container(
                    &app_id,
                    1,
                    Owner::Instance {
                        service: service.clone(),
                        component: component.clone(),
                        instance: instance.clone(),
                    },
                    node,
                    p.memory_mb,
                    p.vcores,
                );
                let domain = self.cfg.dns_domain.clone();
                let svc = self.services.get_mut(service)?;
                let user = svc.user.clone();
                let comp = svc.component_mut(component)?;
                let inst = comp.instances.values_mut().find(|i| &i.name == instance)?;
                inst.container = Some(cid.clone());
                inst.phase = InstPhase::Allocated;
                let comp_id = inst.idx;
                let app = self.apps.get(&app_id)?;
                let c = self.containers.get(&cid)?;
                let svc = self.services.get(service)?;
                let comp = svc.components.iter().find(|x| &x.name == component)?;
                let log_dir = c.log_dir.display().to_string();
                let mut tokens: Vec<(String, String)> = vec![
                    ("${SERVICE_NAME}".into(), service.clone()),
                    ("${SERVICE_NAME.lc}".into(), service.to_lowercase()),
                    ("${USER}".into(), user.clone()),
                    ("${DOMAIN}".into(), domain),
                    ("${COMPONENT_NAME}".into(), component.clone()),
                    ("${COMPONENT_NAME.lc}".into(), component.to_lowercase()),
                    ("${COMPONENT_INSTANCE_NAME}".into(), instance.clone()),
                    ("${CONTAINER_ID}".into(), cid.clone()),
                    ("${COMPONENT_ID}".into(), comp_id.to_string()),
                ];
                let mut env = self.nm_env(c, &user, app);
                // The NodeManager expands {{VAR}} and <LOG_DIR> in every
                // environment value of a launch context, services' included.
                for (k, v) in &comp.env {
                    env.push((k.clone(), expand_nm(&substitute(v, &tokens), &log_dir)));
                }
                env.push(("WORK_DIR".into(), "$PWD".into()));
                env.push(("LOG_DIR".into(), log_dir.clone()));
                env.push(("LANG".into(), "en_US.UTF-8".into()));
                env.push(("LC_ALL".into(), "en_US.UTF-8".into()));
                env.push(("LANGUAGE".into(), "en_US.UTF-8".into()));
                for (k, v) in &env {
                    tokens.push((format!("${{{k}}}"), v.clone()));
                }
                let command = format!(
                    "{} 1><LOG_DIR>/stdout.txt 2><LOG_DIR>/stderr.txt",
                    substitute(&comp.launch_command, &tokens)
                );
                let command = expand_nm(&command, &log_dir);
                // TarballProviderService: the artifact is an ARCHIVE local
                // resource named APP_LIB_DIR ("lib").
                let resources = comp
                    .artifact
                    .iter()
                    .map(|url| LocalResource {
                        key: "lib".into(),
                        url: url.clone(),
                        kind: "ARCHIVE".into(),
                        visibility: "APPLICATION".into(),
                        size: -1,
                        timestamp: -1,
                        verify: false,
                    })
                    .collect();
                Some(LaunchJob {
                    container_id: cid.clone(),
                    cwd: c.cwd.clone(),
                    log_dir: c.log_dir.clone(),
                    script: launch_script(&env, &command),
                    resources,
                    user,
                    kill: c.kill.clone(),
                })
            }
        }
    }

    /// The container's process started.
    pub fn container_started(&mut self, cid: &str, pid: u32) {
        let Some(c) = self.containers.get_mut(cid) else {
            return;
        };
        c.phase = Phase::Running;
        c.pid = Some(pid);
        c.started_ms = Some(now_ms());
        let owner = c.owner.clone();
        let http = self.cfg.http_address.clone();
        match owner {
            Owner::Am { app, .. } => {
                if let Some(a) = self.apps.get_mut(&app)
                    && a.state == AppState::Accepted
                {
                    a.state = AppState::Running;
                    a.launch_ms.get_or_insert(now_ms());
                    a.diagnostics.clear();
                    if let Some(att) = a.attempts.last_mut() {
                        att.state = "RUNNING";
                    }
                    tracing::info!(app = %app, container = %cid, pid, "AM container running; tracking http://{http}/proxy/{app}/");
                }
            }
            Owner::Instance {
                service,
                component,
                instance,
            } => {
                if let Some(inst) = self
                    .services
                    .get_mut(&service)
                    .and_then(|s| s.component_mut(&component))
                    .and_then(|c| c.instances.values_mut().find(|i| i.name == instance))
                {
                    inst.phase = InstPhase::Ready;
                    inst.launch_ms = Some(now_ms());
                }
                self.update_service_state(&service);
            }
        }
    }

    /// A container ended (or never started). Updates its owner.
    pub fn container_finished(&mut self, cid: &str, finish: Finish) {
        let Some(c) = self.containers.get_mut(cid) else {
            return;
        };
        if c.phase == Phase::Complete {
            return;
        }
        let (status, diagnostics) = match (&c.kill_reason, finish) {
            (Some((status, why)), Finish::Exited(out)) => (
                *status,
                format!(
                    "{why}\nContainer killed on request. Exit code is {code}\nContainer exited with a non-zero exit code {code}. ",
                    code = out.shell_code()
                ),
            ),
            (Some((status, why)), _) => (*status, why.clone()),
            (None, Finish::Exited(out)) => {
                let code = out.shell_code();
                if code == 0 {
                    (exit::SUCCESS, String::new())
                } else {
                    (code, failure_diagnostics(&c.id, code, c))
                }
            }
            (
                None,
                Finish::LaunchFailed {
                    exit_status,
                    diagnostics,
                },
            ) => (exit_status, diagnostics),
            (None, Finish::NeverStarted) => (exit::ABORTED, "Container was never started".into()),
        };
        c.phase = Phase::Complete;
        c.finished_ms = Some(now_ms());
        c.exit_status = Some(status);
        c.diagnostics = diagnostics.clone();
        let owner = c.owner.clone();
        tracing::info!(container = %cid, exit_status = status, "container completed");
        match owner {
            Owner::Am { app, attempt } => {
                self.am_finished(&app, attempt, cid, status, &diagnostics)
            }
            Owner::Instance {
                service,
                component,
                instance,
            } => self.instance_finished(&service, &component, &instance, cid, status, diagnostics),
        }
    }

    fn am_finished(&mut self, app_id: &str, attempt: u32, cid: &str, status: i32, diag: &str) {
        let tracking = format!("http://{}/cluster/app/{app_id}", self.cfg.http_address);
        let attempt_id = self
            .apps
            .get(app_id)
            .map(|a| self.attempt_id(a.seq, attempt));
        let Some(app) = self.apps.get_mut(app_id) else {
            return;
        };
        if app.state.is_final() {
            return;
        }
        let now = now_ms();
        if status == exit::SUCCESS {
            app.state = AppState::Finished;
            app.final_status = "SUCCEEDED";
            app.finished_ms = Some(now);
            if let Some(att) = app.attempts.last_mut() {
                att.finish_ms = Some(now);
                att.state = "FINISHED";
            }
            return;
        }
        let attempt_id = attempt_id.unwrap_or_default();
        let counts = status != exit::PREEMPTED && status != exit::ABORTED;
        if counts {
            app.counted_failures += 1;
        }
        let att_diag = format!(
            "AM Container for {attempt_id} exited with  exitCode: {status}\nFailing this attempt.Diagnostics: {diag}\n\
             For more detailed output, check the application tracking page: {tracking} Then click on links to logs of each attempt.\n"
        );
        if let Some(att) = app.attempts.last_mut() {
            att.finish_ms = Some(now);
            att.state = "FAILED";
            att.diagnostics = att_diag.clone();
        }
        tracing::info!(app = %app_id, container = %cid, status, "AM attempt {attempt} failed");
        if app.counted_failures < app.max_attempts {
            let (mem, vc) = (app.memory_mb, app.vcores);
            self.start_attempt(app_id);
            self.pending.push_back(Pending {
                kind: PendingKind::Am {
                    app: app_id.to_string(),
                },
                memory_mb: mem,
                vcores: vc,
            });
        } else {
            app.state = AppState::Failed;
            app.final_status = "FAILED";
            app.finished_ms = Some(now);
            app.diagnostics = format!(
                "Application {app_id} failed {} times (global limit ={}; local limit is ={}) due to {att_diag}. Failing the application.",
                app.counted_failures, self.cfg.am_max_attempts, app.max_attempts
            );
        }
    }

    // ---------- services ----------

    /// Create `n` new instances of a component, skipping decommissioned and
    /// used names, and queue them.
    pub fn add_instances(&mut self, service: &str, component: &str, n: u64) {
        let Some(svc) = self.services.get_mut(service) else {
            return;
        };
        let Some(comp) = svc.component_mut(component) else {
            return;
        };
        let (mem, vc) = (comp.memory_mb, comp.vcores);
        let mut names = Vec::new();
        for _ in 0..n {
            let (idx, name) = loop {
                let idx = comp.counter;
                comp.counter += 1;
                let name = format!("{}-{idx}", comp.name);
                if !comp.decommissioned.contains(&name) && !comp.instances.contains_key(&idx) {
                    break (idx, name);
                }
            };
            comp.instances.insert(
                idx,
                Instance {
                    idx,
                    name: name.clone(),
                    container: None,
                    phase: InstPhase::Pending,
                    launch_ms: None,
                    restart_at: None,
                    last_exit: None,
                    last_container: None,
                    restarts: 0,
                },
            );
            names.push(name);
        }
        for name in names {
            self.pending.push_back(Pending {
                kind: PendingKind::Instance {
                    service: service.into(),
                    component: component.into(),
                    instance: name,
                },
                memory_mb: mem,
                vcores: vc,
            });
        }
        self.update_service_state(service);
    }

    /// Remove one instance (flex down, decommission, stop) and release its
    /// container.
    pub fn remove_instance(&mut self, service: &str, component: &str, idx: u64, why: &str) {
        let cid = self
            .services
            .get_mut(service)
            .and_then(|s| s.component_mut(component))
            .and_then(|c| c.instances.remove(&idx))
            .and_then(|i| i.container);
        if let Some(cid) = cid {
            self.kill_container(&cid, exit::ABORTED, why);
        }
    }

    /// Set a component's desired count, the way the service AM flexes:
    /// up creates instances with new names, down destroys the most recent.
    pub fn flex(&mut self, service: &str, component: &str, desired: u64) -> Option<u64> {
        let svc = self.services.get_mut(service)?;
        let comp = svc.component_mut(component)?;
        let before = comp.desired;
        comp.desired = desired;
        if desired > before {
            self.add_instances(service, component, desired - before);
        } else if desired < before {
            let delta = before - desired;
            let victims: Vec<u64> = comp
                .instances
                .keys()
                .rev()
                .take(delta as usize)
                .copied()
                .collect();
            comp.counter = comp.counter.saturating_sub(delta);
            for idx in victims {
                self.remove_instance(
                    service,
                    component,
                    idx,
                    "Container released by application (component flexed down)",
                );
            }
        }
        if let Some(svc) = self.services.get_mut(service)
            && svc.state != ServiceState::Stopped
        {
            svc.state = ServiceState::Started;
        }
        self.update_service_state(service);
        Some(before)
    }

    fn instance_finished(
        &mut self,
        service: &str,
        component: &str,
        instance: &str,
        cid: &str,
        status: i32,
        diag: String,
    ) {
        let delay = self.cfg.service_restart_delay;
        let mut requeue = None;
        if let Some(comp) = self
            .services
            .get_mut(service)
            .and_then(|s| s.component_mut(component))
            && let Some(inst) = comp.instances.values_mut().find(|i| i.name == instance)
            && inst.container.as_deref() == Some(cid)
        {
            inst.last_container = inst.container.take();
            inst.last_exit = Some((status, diag));
            let restart = match comp.restart {
                RestartPolicy::Always => true,
                RestartPolicy::OnFailure => status != exit::SUCCESS,
                RestartPolicy::Never => false,
            };
            if restart {
                inst.restarts += 1;
                if delay.is_zero() {
                    inst.phase = InstPhase::Pending;
                    requeue = Some((comp.memory_mb, comp.vcores));
                } else {
                    inst.phase = InstPhase::Waiting;
                    inst.restart_at = Some(Instant::now() + delay);
                }
            } else {
                inst.phase = if status == exit::SUCCESS {
                    InstPhase::Succeeded
                } else {
                    InstPhase::Failed
                };
            }
        }
        if let Some((mem, vc)) = requeue {
            self.pending.push_back(Pending {
                kind: PendingKind::Instance {
                    service: service.into(),
                    component: component.into(),
                    instance: instance.into(),
                },
                memory_mb: mem,
                vcores: vc,
            });
        }
        self.update_service_state(service);
    }

    /// Queue instances whose restart delay is over; end services whose
    /// lifetime ran out.
    pub fn tick(&mut self) {
        let now = Instant::now();
        let expired: Vec<(String, String)> = self
            .services
            .values()
            .filter(|s| {
                s.state != ServiceState::Stopped && s.lifetime_deadline.is_some_and(|d| d <= now)
            })
            .map(|s| (s.name.clone(), s.app_id.clone()))
            .collect();
        for (name, app_id) in expired {
            tracing::info!(service = %name, "service lifetime expired");
            self.kill_app(&app_id, "cruise-sim");
            if let Some(app) = self.apps.get_mut(&app_id) {
                app.diagnostics = "Application is killed by ResourceManager as it has exceeded the lifetime period.".into();
            }
            if let Some(s) = self.services.get_mut(&name) {
                s.lifetime_deadline = None;
            }
        }
        let mut queue = Vec::new();
        for svc in self.services.values_mut() {
            for comp in &mut svc.components {
                for inst in comp.instances.values_mut() {
                    if inst.phase == InstPhase::Waiting && inst.restart_at.is_some_and(|t| t <= now)
                    {
                        inst.phase = InstPhase::Pending;
                        inst.restart_at = None;
                        queue.push(Pending {
                            kind: PendingKind::Instance {
                                service: svc.name.clone(),
                                component: comp.name.clone(),
                                instance: inst.name.clone(),
                            },
                            memory_mb: comp.memory_mb,
                            vcores: comp.vcores,
                        });
                    }
                }
            }
        }
        self.pending.extend(queue);
    }

    /// STABLE when every component has as many ready (or finished, for
    /// terminating policies) instances as desired; STARTED otherwise.
    pub fn update_service_state(&mut self, service: &str) {
        let Some(svc) = self.services.get_mut(service) else {
            return;
        };
        if svc.state == ServiceState::Stopped {
            return;
        }
        let stable = svc.components.iter().all(|c| {
            let done = c
                .instances
                .values()
                .filter(|i| {
                    matches!(i.phase, InstPhase::Ready)
                        || (c.restart != RestartPolicy::Always
                            && matches!(i.phase, InstPhase::Succeeded | InstPhase::Failed))
                })
                .count() as u64;
            done == c.desired
        });
        svc.state = if stable {
            ServiceState::Stable
        } else {
            ServiceState::Started
        };
    }

    /// Stop a service: release all containers, finish its application.
    pub fn stop_service(&mut self, service: &str) {
        let Some(svc) = self.services.get_mut(service) else {
            return;
        };
        svc.state = ServiceState::Stopped;
        let app_id = svc.app_id.clone();
        let mut victims = Vec::new();
        for comp in &mut svc.components {
            for (_, inst) in std::mem::take(&mut comp.instances) {
                if let Some(cid) = inst.container {
                    victims.push(cid);
                }
            }
        }
        for cid in victims {
            self.kill_container(
                &cid,
                exit::ABORTED,
                "Container released by application (service stopped)",
            );
        }
        if let Some(app) = self.apps.get_mut(&app_id)
            && !app.state.is_final()
        {
            app.state = AppState::Finished;
            app.final_status = "ENDED";
            app.finished_ms = Some(now_ms());
            app.diagnostics = format!("Service {service} stopped by user");
            if let Some(att) = app.attempts.last_mut() {
                att.finish_ms = Some(now_ms());
                att.state = "FINISHED";
            }
        }
    }

    // ---------- capacity ----------

    /// Apply a capacity change. Containers on removed nodes are aborted, and
    /// containers beyond a shrunken node's size are preempted, newest first.
    /// Returns the ids of the containers being killed.
    pub fn change_capacity(&mut self, ch: &CapacityChange) -> Vec<String> {
        if let Some(m) = ch.node_memory_mb {
            self.cfg.node_memory_mb = m;
        }
        if let Some(v) = ch.node_vcores {
            self.cfg.node_vcores = v;
        }
        let target = ch.nodes.unwrap_or_else(|| {
            self.nodes
                .iter()
                .filter(|n| n.state == NodeState::Running)
                .count()
        });
        while self.nodes.len() < target {
            self.add_node();
        }
        let mut killed = Vec::new();
        for i in 0..self.nodes.len() {
            let node_id = self.nodes[i].id();
            if i >= target {
                if self.nodes[i].state == NodeState::Running {
                    self.nodes[i].state = NodeState::Decommissioned;
                    self.nodes[i].last_health_update = now_ms();
                    let live: Vec<String> = self
                        .containers
                        .values()
                        .filter(|c| c.node == i && c.phase != Phase::Complete)
                        .map(|c| c.id.clone())
                        .collect();
                    for cid in live {
                        self.kill_container(
                            &cid,
                            exit::ABORTED,
                            &format!("Container released on a *decommissioned* node {node_id} (cruise-sim capacity change)"),
                        );
                        killed.push(cid);
                    }
                }
                continue;
            }
            let n = &mut self.nodes[i];
            n.state = NodeState::Running;
            n.decommissioning_timeout = None;
            n.memory_mb = self.cfg.node_memory_mb;
            n.vcores = self.cfg.node_vcores;
            n.last_health_update = now_ms();
            let (cap_m, cap_v) = (n.memory_mb, n.vcores);
            let mut live: Vec<(u64, String, u64, u64)> = self
                .containers
                .values()
                .filter(|c| c.node == i && c.phase != Phase::Complete && c.kill_reason.is_none())
                .map(|c| (c.allocated_ms, c.id.clone(), c.memory_mb, c.vcores))
                .collect();
            live.sort();
            let (mut used_m, mut used_v) = live.iter().fold((0, 0), |(m, v), c| (m + c.2, v + c.3));
            while (used_m > cap_m || used_v > cap_v)
                && let Some((_, cid, m, v)) = live.pop()
            {
                used_m -= m;
                used_v -= v;
                self.kill_container(
                    &cid,
                    exit::PREEMPTED,
                    &format!(
                        "Container preempted by scheduler: node {node_id} shrank to <memory:{cap_m}, vCores:{cap_v}> (cruise-sim capacity change)"
                    ),
                );
                killed.push(cid);
            }
        }
        killed
    }

    /// Totals over RUNNING nodes: (total MB, total vcores, used MB, used vcores, containers).
    pub fn totals(&self) -> (u64, u64, u64, u64, usize) {
        let mut t = (0, 0, 0, 0, 0);
        for (i, n) in self.nodes.iter().enumerate() {
            let (um, uv, nc) = self.node_used(i);
            if n.state == NodeState::Running {
                t.0 += n.memory_mb;
                t.1 += n.vcores;
            }
            t.2 += um;
            t.3 += uv;
            t.4 += nc;
        }
        t
    }

    /// Kill every live container (shutdown).
    pub fn kill_all(&mut self) {
        self.shutting_down = true;
        let live: Vec<String> = self
            .containers
            .values()
            .filter(|c| c.phase != Phase::Complete)
            .map(|c| c.id.clone())
            .collect();
        for cid in live {
            self.kill_container(
                &cid,
                exit::KILLED_BY_RESOURCEMANAGER,
                "Container killed: cruise-sim is shutting down",
            );
        }
    }
}

/// Replace `${TOKEN}`s.
pub(crate) fn substitute(s: &str, tokens: &[(String, String)]) -> String {
    let mut out = s.to_string();
    for (k, v) in tokens {
        if out.contains(k.as_str()) {
            out = out.replace(k.as_str(), v);
        }
    }
    out
}

/// A `launch_container.sh` like the NodeManager writes: exported environment
/// (double-quoted, so `$VAR` references expand) and `exec /bin/bash -c CMD`.
fn launch_script(env: &[(String, String)], command: &str) -> String {
    let mut s =
        String::from("#!/bin/bash\n# written by cruise-sim (YARN NodeManager simulation)\n");
    for (k, v) in env {
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('`', "\\`");
        s.push_str(&format!("export {k}=\"{v}\"\n"));
    }
    s.push_str(&format!(
        "exec /bin/bash -c {}\n",
        shell_single_quote(command)
    ));
    s
}

fn failure_diagnostics(cid: &str, code: i32, c: &Container) -> String {
    let mut tail = String::new();
    for name in ["stderr", "stderr.txt"] {
        let p = c.log_dir.join(name);
        if p.exists() {
            tail = tail_file(&p, 4096);
        }
    }
    if tail.is_empty() {
        tail = tail_file(&c.cwd.join("stderr"), 4096);
    }
    format!(
        "[{}]Exception from container-launch.\nContainer id: {cid}\nExit code: {code}\n\n\
         [{}]Container exited with a non-zero exit code {code}. Error file: stderr.\nLast 4096 bytes of stderr :\n{tail}\n",
        super::common::iso8601_ms(now_ms() as i64),
        super::common::iso8601_ms(now_ms() as i64)
    )
}
