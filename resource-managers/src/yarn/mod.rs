//! The YARN resource manager: evaluators are the containers of one YARN
//! service component, managed through the Services REST API; capacity comes
//! from the RM REST API.
//!
//! YARN gives containers only to an ApplicationMaster over the (non-REST)
//! AM–RM protocol (`PROTOCOLS.md` §3), so this runtime lets YARN's own
//! ServiceMaster hold them: the first [`crate::ResourceManager::request`] creates a
//! service with one component whose `launch_command` is the evaluator command
//! and whose environment is the [`LaunchSpec`]'s, later requests flex the
//! component up, [`crate::ResourceManager::release`] decommissions the container's
//! instance (`decommissioned_instances`), and [`crate::ResourceManager::shutdown`]
//! destroys the service.
//!
//! One actor task owns the service. It polls the service every
//! `poll_interval` and turns what changed into [`RmEvent`]s: a new container
//! id → `Allocated` (host = its node), `READY` → `Running`, `STOPPED` or gone
//! → `Completed` (with the exit status and diagnostics when the server
//! reports them). Container ids are YARN's, the same string the evaluator
//! reads from `CONTAINER_ID`. Every `capacity_poll_interval` it reads the
//! running nodes and computes how many containers of the evaluator size the
//! job could hold (`held + Σ_nodes min(free MB / size, free vcores / cores)`);
//! a change seen on two consecutive polls is sent as `CapacityChanged`. Polls
//! are skipped while containers asked for have not all appeared in the
//! service yet (one already allocated but not seen would count nowhere).
//!
//! Every `decommission_poll_interval` (while it holds containers) it reads
//! the DECOMMISSIONING nodes; its containers on them (matched by host) are
//! announced once as `Reclaiming`, deadline the node's
//! `decommissioningTimeout` or `decommission_default_timeout`
//! ([`decommission`]).
//!
//! The service is destroyed on `shutdown`, when every handle is dropped, and
//! — through [`ServiceGuard`] — when the actor itself is dropped (e.g. its
//! runtime shuts down), so no service outlives the job. An AM killed with
//! `SIGKILL` destroys nothing: the evaluators of a `cruise submit`
//! application then stop the service themselves once the RM says the
//! application is over ([`orphan`]; the AM names it in their environment).
//! A service `lifetime` can be set as a last backstop.

pub mod decommission;
pub mod orphan;
pub mod rm;
pub mod services;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::actor::{ActorHandle, Cmd};
use crate::http::HttpOptions;
use crate::{Capacity, ContainerId, ContainerRequest, ExitStatus, LaunchSpec, RmError, RmEvent};
use rm::RmClient;
use services::{ComponentSpec, ENDED_CONTAINER_STATES, ServiceSpec, ServicesClient, valid_name};

/// Where a TARBALL artifact is unpacked in a service container
/// (`YarnServiceConstants.APP_LIB_DIR`).
pub const ARTIFACT_DIR: &str = "lib";

/// Most containers one node is believed to have room for; a node report
/// saying more is counted as this, with a warning naming the node.
const MAX_PER_NODE: i64 = 100_000;

/// Settings of the YARN resource manager.
#[derive(Debug, Clone)]
pub struct YarnConfig {
    /// RM web addresses (`host:port` or URLs; several for HA).
    pub rm_addresses: Vec<String>,
    /// `user.name` for REST calls (simple authentication), if any.
    pub user: Option<String>,
    /// Retries and timeouts of REST calls.
    pub http: HttpOptions,
    /// The service's name (a DNS label of at most 63 characters).
    pub service_name: String,
    /// The evaluator component's name.
    pub component: String,
    /// YARN queue.
    pub queue: String,
    /// A TARBALL artifact unpacked into `lib/` of every container.
    pub tarball: Option<String>,
    /// Service lifetime in seconds (backstop), if any.
    pub lifetime_secs: Option<u64>,
    /// How often the service is polled for container changes.
    pub poll_interval: Duration,
    /// How often nodes are polled for capacity.
    pub capacity_poll_interval: Duration,
    /// How often DECOMMISSIONING nodes are polled ([`decommission`]).
    pub decommission_poll_interval: Duration,
    /// The notice assumed for a decommissioning node that reports no
    /// `decommissioningTimeout`.
    pub decommission_default_timeout: Duration,
    /// `yarn.scheduler.minimum-allocation-mb`: memory requests are rounded
    /// up to a multiple of it.
    pub min_allocation_mb: u32,
    /// Container size assumed for capacity before the first request.
    pub default_size: (u32, u32),
}

/// The YARN resource manager (a handle to its actor).
pub struct YarnRm {
    actor: ActorHandle,
    service: String,
}

impl YarnRm {
    /// Checks the settings and starts the actor. Nothing is created on the
    /// cluster until the first request. Events go to `events`.
    pub fn start(
        config: YarnConfig,
        launch: LaunchSpec,
        events: mpsc::UnboundedSender<RmEvent>,
    ) -> Result<YarnRm, RmError> {
        if !valid_name(&config.service_name, 63) {
            return Err(RmError::BadRequest(format!(
                "YARN service name {:?} must be a lowercase DNS label of at most 63 characters",
                config.service_name
            )));
        }
        if !valid_name(&config.component, 44) {
            return Err(RmError::BadRequest(format!(
                "YARN component name {:?} must be a lowercase DNS label of at most 44 characters",
                config.component
            )));
        }
        if launch.program.is_empty() {
            return Err(RmError::BadRequest("empty evaluator program".into()));
        }
        let service = config.service_name.clone();
        let actor = Actor::new(config, launch, events)?;
        Ok(YarnRm {
            actor: ActorHandle::spawn("yarn", |cmds| actor.run(cmds)),
            service,
        })
    }

    /// The service's name.
    pub fn service_name(&self) -> &str {
        &self.service
    }
}

crate::actor::resource_manager_via_actor!(YarnRm, "yarn");

/// Destroys the service when dropped while armed: the last line of defence
/// against a leaked service when the actor is dropped without shutting down
/// (its runtime stopped, a panic). It blocks the dropping thread for at most
/// a few seconds while a helper thread sends the `DELETE`.
#[derive(Debug)]
pub struct ServiceGuard {
    addresses: Vec<String>,
    user: Option<String>,
    name: String,
    armed: bool,
}

impl ServiceGuard {
    fn destroy_blocking(&self) {
        let addresses = self.addresses.clone();
        let user = self.user.clone();
        let name = self.name.clone();
        crate::actor::clean_up_blocking(move |opts| async move {
            let Ok(c) = ServicesClient::new(&addresses, user, opts) else {
                return;
            };
            match c.destroy(&name).await {
                Ok(_) => {
                    tracing::warn!(service = %name, "YARN service destroyed by its guard (the resource manager was dropped without shutdown)")
                }
                Err(e) => {
                    tracing::error!(service = %name, "could not destroy the YARN service: {e}")
                }
            }
        });
    }
}

impl Drop for ServiceGuard {
    fn drop(&mut self) {
        if self.armed {
            self.destroy_blocking();
        }
    }
}

struct Known {
    instance: String,
    /// The node's host (`bare_host`, else `hostname`).
    host: String,
    running: bool,
    released: bool,
    /// Announced as `Reclaiming` (its node is decommissioning).
    reclaimed: bool,
}

struct Actor {
    cfg: YarnConfig,
    launch: LaunchSpec,
    events: mpsc::UnboundedSender<RmEvent>,
    rm: Arc<RmClient>,
    svc: Arc<ServicesClient>,
    /// Whether the service exists (as far as this job knows).
    created: bool,
    /// The component's count as last set.
    desired: u32,
    /// Evaluator size (memory MB, cores), fixed by the first request.
    size: Option<(u32, u32)>,
    /// Live containers seen in the service.
    known: BTreeMap<ContainerId, Known>,
    /// Containers already reported completed.
    gone: HashSet<ContainerId>,
    reported_capacity: Option<u32>,
    candidate_capacity: Option<u32>,
    /// Polling gave up (the RM stayed unreachable); reported once.
    failed: bool,
    guard: ServiceGuard,
}

/// `s` quoted for `bash -c` when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'.' | b'/' | b':' | b'=' | b'@' | b'%' | b'+' | b',' | b'-'
                )
        });
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

impl Actor {
    fn new(
        config: YarnConfig,
        launch: LaunchSpec,
        events: mpsc::UnboundedSender<RmEvent>,
    ) -> Result<Actor, RmError> {
        let rm = RmClient::new(
            &config.rm_addresses,
            config.user.clone(),
            config.http.clone(),
        )?;
        let svc = ServicesClient::new(
            &config.rm_addresses,
            config.user.clone(),
            config.http.clone(),
        )?;
        let guard = ServiceGuard {
            addresses: config.rm_addresses.clone(),
            user: config.user.clone(),
            name: config.service_name.clone(),
            armed: false,
        };
        Ok(Actor {
            cfg: config,
            launch,
            events,
            rm: Arc::new(rm),
            svc: Arc::new(svc),
            created: false,
            desired: 0,
            size: None,
            known: BTreeMap::new(),
            gone: HashSet::new(),
            reported_capacity: None,
            candidate_capacity: None,
            failed: false,
            guard,
        })
    }

    async fn run(mut self, mut cmds: mpsc::Receiver<Cmd>) {
        let mut poll = tokio::time::interval(self.cfg.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cap = tokio::time::interval(self.cfg.capacity_poll_interval);
        cap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut decommissioning = tokio::time::interval(self.cfg.decommission_poll_interval);
        decommissioning.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Request(req, reply)) => {
                        let r = self.request(req).await;
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Release(id, reply)) => {
                        let r = self.release(&id).await;
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Capacity(reply)) => {
                        let r = self.capacity().await;
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Shutdown(reply)) => {
                        let r = self.destroy().await;
                        let _ = reply.send(r);
                        return;
                    }
                    None => {
                        // Every handle is gone: do not leak the service.
                        if let Err(e) = self.destroy().await {
                            tracing::error!("YARN resource manager dropped; destroying the service failed: {e}");
                        }
                        return;
                    }
                },
                _ = poll.tick(), if self.created && !self.failed => self.poll().await,
                _ = cap.tick(), if !self.failed => self.capacity_tick().await,
                _ = decommissioning.tick(), if !self.failed && !self.known.is_empty() => {
                    self.decommission_tick().await
                }
            }
        }
    }

    fn emit(&self, ev: RmEvent) {
        let _ = self.events.send(ev);
    }

    fn launch_command(&self) -> String {
        let mut parts = vec![shell_quote(&self.launch.program)];
        parts.extend(self.launch.args.iter().map(|a| shell_quote(a)));
        parts.join(" ")
    }

    fn normalize(&self, mem: u32) -> u32 {
        let m = self.cfg.min_allocation_mb.max(1);
        mem.div_ceil(m).max(1) * m
    }

    async fn request(&mut self, req: ContainerRequest) -> Result<(), RmError> {
        if req.count == 0 {
            return Ok(());
        }
        let size = req.size()?;
        match self.size {
            None => self.size = Some(size),
            Some(s) if s != size => {
                return Err(RmError::BadRequest(format!(
                    "the YARN runtime runs one evaluator size per job: {} MB, {} cores were asked for first, now {} MB, {} cores",
                    s.0, s.1, req.memory_mb, req.cores
                )));
            }
            Some(_) => {}
        }
        if !req.hosts.is_empty() {
            tracing::debug!(hosts = ?req.hosts, "YARN services place containers themselves; host preferences are ignored");
        }
        let target = self.desired + req.count;
        let name = self.cfg.service_name.clone();
        if self.created {
            self.svc.flex(&name, &self.cfg.component, target).await?;
            tracing::info!(service = %name, from = self.desired, to = target, "flexed the evaluator component");
        } else {
            let spec = ServiceSpec {
                name: name.clone(),
                version: "1".into(),
                queue: self.cfg.queue.clone(),
                lifetime_secs: self.cfg.lifetime_secs,
                component: ComponentSpec {
                    name: self.cfg.component.clone(),
                    count: target,
                    launch_command: self.launch_command(),
                    env: self.launch.env.clone(),
                    memory_mb: req.memory_mb,
                    cpus: req.cores,
                    tarball: self.cfg.tarball.clone(),
                },
            };
            // Arm first: a create that times out may still have happened.
            self.guard.armed = true;
            match self.svc.create(&spec).await {
                Ok(()) => {}
                Err(RmError::Http { message, .. }) if message.contains("already taken") => {
                    tracing::warn!(service = %name, "a service with this name exists (an earlier attempt of this job?); replacing it");
                    self.svc.destroy(&name).await?;
                    self.svc.create(&spec).await?;
                }
                Err(e) => return Err(e),
            }
            self.created = true;
            tracing::info!(service = %name, containers = target, "created the YARN service");
        }
        self.desired = target;
        Ok(())
    }

    async fn release(&mut self, id: &ContainerId) -> Result<(), RmError> {
        let Some(k) = self.known.get(id) else {
            return Err(RmError::UnknownContainer(id.clone()));
        };
        if k.released {
            return Ok(());
        }
        let instance = k.instance.clone();
        self.svc
            .decommission(
                &self.cfg.service_name,
                &self.cfg.component,
                std::slice::from_ref(&instance),
            )
            .await?;
        if let Some(k) = self.known.get_mut(id) {
            k.released = true;
        }
        self.desired = self.desired.saturating_sub(1);
        tracing::info!(container = %id, %instance, "decommissioned");
        Ok(())
    }

    async fn poll(&mut self) {
        match self.svc.get(&self.cfg.service_name).await {
            Ok(Some(report)) => self.apply(&report),
            Ok(None) => {
                let why = format!(
                    "YARN service {} no longer exists (destroyed outside this job, or its lifetime ran out)",
                    self.cfg.service_name
                );
                let ids: Vec<ContainerId> = self.known.keys().cloned().collect();
                for id in ids {
                    self.complete(&id, ExitStatus::Unknown, why.clone());
                }
                self.created = false;
                self.guard.armed = false;
                if self.desired > 0 {
                    self.emit(RmEvent::AllocationFailed { reason: why });
                }
            }
            Err(e) => {
                self.failed = true;
                self.emit(RmEvent::AllocationFailed {
                    reason: format!("polling the YARN service failed: {e}"),
                });
            }
        }
    }

    fn apply(&mut self, report: &services::ServiceReport) {
        let Some(comp) = report.component(&self.cfg.component) else {
            tracing::warn!(service = %self.cfg.service_name, component = %self.cfg.component, "the service has no such component");
            return;
        };
        let mut seen = HashSet::new();
        for c in &comp.containers {
            if c.id.is_empty() || self.gone.contains(&c.id) {
                continue;
            }
            seen.insert(c.id.clone());
            if !self.known.contains_key(&c.id) {
                let host = if c.bare_host.is_empty() {
                    c.hostname.clone()
                } else {
                    c.bare_host.clone()
                };
                self.known.insert(
                    c.id.clone(),
                    Known {
                        instance: c.component_instance_name.clone(),
                        host: host.clone(),
                        running: false,
                        released: false,
                        reclaimed: false,
                    },
                );
                self.emit(RmEvent::Allocated {
                    container: c.id.clone(),
                    host,
                });
            }
            if c.state == "READY"
                && let Some(k) = self.known.get_mut(&c.id)
                && !k.running
            {
                k.running = true;
                self.emit(RmEvent::Running {
                    container: c.id.clone(),
                    pid: None,
                });
            }
            if ENDED_CONTAINER_STATES.contains(&c.state.as_str()) {
                let exit = c.exit_status.map_or(ExitStatus::Unknown, ExitStatus::Code);
                let diag = match &c.diagnostics {
                    Some(d) if !d.trim().is_empty() => d.trim().to_string(),
                    _ => format!(
                        "container {} (instance {}) is {}",
                        c.id, c.component_instance_name, c.state
                    ),
                };
                self.complete(&c.id, exit, diag);
            }
        }
        let vanished: Vec<ContainerId> = self
            .known
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        for id in vanished {
            let instance = self
                .known
                .get(&id)
                .map(|k| k.instance.clone())
                .unwrap_or_default();
            self.complete(
                &id,
                ExitStatus::Unknown,
                format!(
                    "container {id} (instance {instance}) is no longer listed by the YARN Services API"
                ),
            );
        }
    }

    fn complete(&mut self, id: &ContainerId, exit: ExitStatus, diagnostics: String) {
        let Some(k) = self.known.remove(id) else {
            return;
        };
        self.gone.insert(id.clone());
        self.emit(RmEvent::Completed {
            container: id.clone(),
            exit,
            diagnostics,
            released: k.released,
        });
    }

    /// Containers the component's count asks for that the service does not
    /// list yet. Derived, not counted: a container that YARN replaced, or
    /// that came and went between two polls, must not leave it above zero
    /// for good (that would stop capacity reads for the rest of the job).
    fn unseen(&self) -> u32 {
        let live = self.known.values().filter(|k| !k.released).count();
        self.desired
            .saturating_sub(u32::try_from(live).unwrap_or(u32::MAX))
    }

    async fn capacity(&mut self) -> Result<Capacity, RmError> {
        let fit = self.fit().await?;
        let held = u32::try_from(self.known.len()).unwrap_or(u32::MAX);
        Ok(Capacity {
            max_containers: held.saturating_add(fit),
            running: held,
        })
    }

    /// How many more evaluators fit on the running nodes.
    async fn fit(&self) -> Result<u32, RmError> {
        let nodes = self.rm.running_nodes().await?;
        let (mem, cores) = self.size.unwrap_or(self.cfg.default_size);
        let mem = i64::from(self.normalize(mem));
        let cores = i64::from(cores.max(1));
        let fit = nodes
            .iter()
            .map(|n| {
                let fit =
                    (n.avail_memory_mb.max(0) / mem).min(n.available_virtual_cores.max(0) / cores);
                if fit > MAX_PER_NODE {
                    tracing::warn!(
                        "YARN node {} reports room for {fit} containers ({} MB, {} vcores free); counting {MAX_PER_NODE}",
                        n.id,
                        n.avail_memory_mb,
                        n.available_virtual_cores
                    );
                }
                u32::try_from(fit.min(MAX_PER_NODE)).unwrap_or(0)
            })
            .fold(0u32, u32::saturating_add);
        Ok(fit)
    }

    async fn capacity_tick(&mut self) {
        // The nodes' free room and the containers seen in the service are
        // read at different moments: while containers asked for have not all
        // appeared, one already allocated but not seen yet would count
        // nowhere, and the job would be told to give back what it just got
        // (seen in e2e_grow). Read again once they have appeared.
        if self.unseen() > 0 {
            self.candidate_capacity = None;
            return;
        }
        let max = match self.fit().await {
            Ok(fit) => u32::try_from(self.known.len())
                .unwrap_or(u32::MAX)
                .saturating_add(fit),
            Err(e) => {
                tracing::warn!("reading YARN capacity failed: {e}");
                return;
            }
        };
        match self.reported_capacity {
            None => self.reported_capacity = Some(max),
            Some(r) if r == max => self.candidate_capacity = None,
            Some(_) => {
                if self.candidate_capacity == Some(max) {
                    self.reported_capacity = Some(max);
                    self.candidate_capacity = None;
                    tracing::info!(max_containers = max, "YARN capacity changed");
                    self.emit(RmEvent::CapacityChanged {
                        max_containers: max,
                    });
                } else {
                    self.candidate_capacity = Some(max);
                }
            }
        }
    }

    async fn destroy(&mut self) -> Result<(), RmError> {
        if !self.created {
            return Ok(());
        }
        let name = self.cfg.service_name.clone();
        let existed = self.svc.destroy(&name).await?;
        self.created = false;
        self.guard.armed = false;
        tracing::info!(service = %name, existed, "destroyed the YARN service");
        let ids: Vec<ContainerId> = self.known.keys().cloned().collect();
        for id in ids {
            if let Some(k) = self.known.get_mut(&id) {
                k.released = true;
            }
            self.complete(
                &id,
                ExitStatus::Unknown,
                format!("YARN service {name} destroyed at shutdown"),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("./lib/cruise"), "./lib/cruise");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    fn report(containers: &[(&str, &str)]) -> services::ServiceReport {
        services::ServiceReport {
            name: "svc".into(),
            components: vec![services::ComponentReport {
                name: "evaluator".into(),
                containers: containers
                    .iter()
                    .map(|(id, state)| services::ContainerReport {
                        id: (*id).into(),
                        state: (*state).into(),
                        component_instance_name: format!("evaluator-{id}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// Containers asked for and not listed yet are derived from the count,
    /// so one that failed and was replaced between two polls does not hold
    /// capacity reads back for good (it did when they were counted).
    #[test]
    fn unseen_containers_follow_the_service() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cfg = YarnConfig {
            rm_addresses: vec!["127.0.0.1:1".into()],
            user: None,
            http: HttpOptions::default(),
            service_name: "svc".into(),
            component: "evaluator".into(),
            queue: "default".into(),
            tarball: None,
            lifetime_secs: None,
            poll_interval: Duration::from_secs(1),
            capacity_poll_interval: Duration::from_secs(1),
            decommission_poll_interval: Duration::from_secs(5),
            decommission_default_timeout: Duration::from_secs(3600),
            min_allocation_mb: 1024,
            default_size: (1024, 1),
        };
        let launch = LaunchSpec {
            program: "evaluator".into(),
            args: vec![],
            env: BTreeMap::new(),
            work_dir: "/tmp".into(),
        };
        let mut a = Actor::new(cfg, launch, tx).unwrap();
        a.desired = 3;
        assert_eq!(a.unseen(), 3);
        a.apply(&report(&[("c1", "READY"), ("c2", "RUNNING_BUT_UNREADY")]));
        assert_eq!(a.unseen(), 1);
        // c3 came and failed between polls, and YARN already relaunched it
        // as c4: it is never listed, yet nothing is missing.
        a.apply(&report(&[
            ("c1", "READY"),
            ("c2", "READY"),
            ("c4", "READY"),
        ]));
        assert_eq!(a.unseen(), 0);
        // c2 is lost: one is missing until its replacement shows up.
        a.apply(&report(&[("c1", "READY"), ("c4", "READY")]));
        assert_eq!(a.unseen(), 1);
        a.apply(&report(&[
            ("c1", "READY"),
            ("c4", "READY"),
            ("c5", "READY"),
        ]));
        assert_eq!(a.unseen(), 0);
        // A released container no longer counts, and neither does its slot.
        a.known.get_mut("c1").unwrap().released = true;
        a.desired -= 1;
        assert_eq!(a.unseen(), 0);
        let mut allocated = 0;
        while let Ok(e) = rx.try_recv() {
            if matches!(e, RmEvent::Allocated { .. }) {
                allocated += 1;
            }
        }
        assert_eq!(allocated, 4, "c1, c2, c4, c5");
    }
}
