//! The Mesos master's state: agents and their resources, frameworks and their
//! subscription streams, outstanding offers, tasks with their status-update
//! streams (sent one at a time, retried until acknowledged), offer filters
//! and the allocator.
//!
//! All of it sits behind one mutex owned by [`super::Sim`]; nothing here
//! awaits. Events reach a subscriber through its stream's unbounded channel
//! (already RecordIO-framed). Tasks to start come back as [`TaskJob`]s that
//! the caller runs outside the lock.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::yarn::common::{Program, now_secs_f64};

/// Simulator configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub agent_cpus: f64,
    pub agent_mem_mb: f64,
    pub agent_disk_mb: f64,
    pub agent_ports: (u64, u64),
    pub heartbeat: Duration,
    pub update_retry: Duration,
    /// A buggy master: terminal task updates are never sent.
    pub drop_terminal_updates: bool,
    pub work_dir: PathBuf,
    pub master_id: String,
    pub host: String,
    pub port: u16,
}

/// Scalar and port resources.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Resources {
    pub cpus: f64,
    pub mem: f64,
    pub disk: f64,
    /// Inclusive, sorted, disjoint ranges.
    pub ports: Vec<(u64, u64)>,
}

const EPS: f64 = 1e-9;

fn merge_ranges(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (b, e) in r {
        match out.last_mut() {
            Some(last) if b <= last.1.saturating_add(1) => last.1 = last.1.max(e),
            _ => out.push((b, e)),
        }
    }
    out
}

fn subtract_ranges(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut cur: Vec<(u64, u64)> = a.to_vec();
    for &(bb, be) in b {
        let mut next = Vec::new();
        for (ab, ae) in cur {
            if be < ab || bb > ae {
                next.push((ab, ae));
                continue;
            }
            if bb > ab {
                next.push((ab, bb - 1));
            }
            if be < ae {
                next.push((be + 1, ae));
            }
        }
        cur = next;
    }
    cur
}

fn ranges_contain(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    b.iter()
        .all(|&(bb, be)| a.iter().any(|&(ab, ae)| ab <= bb && be <= ae))
}

impl Resources {
    pub fn add(&self, o: &Resources) -> Resources {
        let mut ports = self.ports.clone();
        ports.extend(o.ports.iter().copied());
        Resources {
            cpus: self.cpus + o.cpus,
            mem: self.mem + o.mem,
            disk: self.disk + o.disk,
            ports: merge_ranges(ports),
        }
    }
    pub fn sub(&self, o: &Resources) -> Resources {
        Resources {
            cpus: (self.cpus - o.cpus).max(0.0),
            mem: (self.mem - o.mem).max(0.0),
            disk: (self.disk - o.disk).max(0.0),
            ports: subtract_ranges(&self.ports, &o.ports),
        }
    }
    pub fn contains(&self, o: &Resources) -> bool {
        self.cpus + EPS >= o.cpus
            && self.mem + EPS >= o.mem
            && self.disk + EPS >= o.disk
            && ranges_contain(&self.ports, &o.ports)
    }
    /// Enough to be worth offering (the allocator's minimum).
    pub fn offerable(&self) -> bool {
        self.cpus >= 0.01 || self.mem >= 32.0
    }

    /// Resource objects as the master writes them for a framework.
    pub fn to_json(&self, alloc_role: Option<&str>) -> Vec<Value> {
        let mut out = Vec::new();
        let mut push = |mut v: Value| {
            v["role"] = json!("*");
            if let Some(r) = alloc_role {
                v["allocation_info"] = json!({"role": r});
            }
            out.push(v);
        };
        for (name, val) in [("cpus", self.cpus), ("mem", self.mem), ("disk", self.disk)] {
            if val > EPS {
                push(json!({"name": name, "type": "SCALAR", "scalar": {"value": round3(val)}}));
            }
        }
        if !self.ports.is_empty() {
            let r: Vec<Value> = self
                .ports
                .iter()
                .map(|(b, e)| json!({"begin": b, "end": e}))
                .collect();
            push(json!({"name": "ports", "type": "RANGES", "ranges": {"range": r}}));
        }
        out
    }

    /// Parse `Resource` objects (cpus, mem, disk, ports).
    pub fn from_json(list: &Value) -> Result<Resources, String> {
        let mut r = Resources::default();
        let Some(items) = list.as_array() else {
            return Ok(r);
        };
        for it in items {
            let name = it["name"].as_str().unwrap_or("");
            match name {
                "cpus" | "mem" | "disk" => {
                    let v = it["scalar"]["value"]
                        .as_f64()
                        .ok_or_else(|| format!("resource {name} needs scalar.value"))?;
                    if v < 0.0 {
                        return Err(format!("resource {name} is negative"));
                    }
                    match name {
                        "cpus" => r.cpus += v,
                        "mem" => r.mem += v,
                        _ => r.disk += v,
                    }
                }
                "ports" => {
                    for rg in it["ranges"]["range"].as_array().into_iter().flatten() {
                        let (Some(b), Some(e)) = (rg["begin"].as_u64(), rg["end"].as_u64()) else {
                            return Err("ports range needs begin and end".into());
                        };
                        if b > e {
                            return Err(format!("ports range {b}-{e} is empty"));
                        }
                        r.ports.push((b, e));
                    }
                }
                other => {
                    return Err(format!(
                        "resource {other:?} is not offered by cruise-sim agents"
                    ));
                }
            }
        }
        r.ports = merge_ranges(r.ports);
        Ok(r)
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A simulated agent.
#[derive(Debug)]
pub(crate) struct Agent {
    pub id: String,
    pub active: bool,
    pub total: Resources,
    /// Under maintenance (`POST /sim/inverse_offer`): offered to nobody.
    pub draining: bool,
}

/// A subscriber's event stream.
#[derive(Debug)]
pub(crate) struct Stream {
    pub id: String,
    pub tx: UnboundedSender<Bytes>,
    /// Cancelled to end the HTTP response (replaced, torn down, removed).
    pub close: CancellationToken,
}

#[derive(Debug)]
pub(crate) struct Framework {
    pub id: String,
    pub info: Value,
    pub roles: Vec<String>,
    pub capabilities: HashSet<String>,
    pub stream: Option<Stream>,
    pub failover_timeout: Duration,
    pub disconnected_at: Option<Instant>,
    pub suppressed: HashSet<String>,
    /// Agent index → refuse offers from it until then.
    pub filters: BTreeMap<usize, Instant>,
}

impl Framework {
    fn has(&self, cap: &str) -> bool {
        self.capabilities.contains(cap)
    }
    fn offer_role(&self) -> Option<&str> {
        self.roles
            .iter()
            .find(|r| !self.suppressed.contains(*r))
            .map(String::as_str)
    }
}

#[derive(Debug)]
pub(crate) struct Offer {
    pub framework: String,
    pub agent: usize,
    pub res: Resources,
}

/// Status update waiting for an acknowledgement.
#[derive(Debug)]
struct PendingUpdate {
    uuid: String,
    status: Value,
    last_sent: Option<Instant>,
    /// How often it was re-sent (the retry interval doubles each time).
    resends: u32,
}

#[derive(Debug)]
pub(crate) struct Task {
    pub framework: String,
    pub task_id: String,
    pub name: String,
    pub agent: usize,
    pub executor_id: String,
    pub group: Option<String>,
    pub res: Resources,
    pub state: &'static str,
    pub latest: Value,
    pending: VecDeque<PendingUpdate>,
    pub kill: CancellationToken,
    pub kill_requested: bool,
    /// Removed by the master (agent gone, preempted): its exit is not reported.
    pub lost: bool,
    pub pid: Option<u32>,
    pub sandbox: PathBuf,
    pub exit_message: Option<String>,
    pub container_id: String,
    /// Launch order (for preempting the newest first).
    pub seq: u64,
}

/// Is this state terminal (`isTerminalState`)?
pub(crate) fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_FINISHED"
            | "TASK_FAILED"
            | "TASK_KILLED"
            | "TASK_LOST"
            | "TASK_ERROR"
            | "TASK_DROPPED"
            | "TASK_GONE"
            | "TASK_GONE_BY_OPERATOR"
    )
}

/// A task to start: its process and URIs to fetch into the sandbox first.
#[derive(Debug)]
pub(crate) struct TaskJob {
    pub framework: String,
    pub task_id: String,
    pub program: Program,
    pub env: Vec<(String, String)>,
    pub sandbox: PathBuf,
    pub uris: Vec<Value>,
    pub kill: CancellationToken,
}

/// Capacity change requested through `PUT /sim/capacity`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CapacityChange {
    #[serde(alias = "nodes")]
    pub agents: Option<usize>,
    #[serde(alias = "node_vcores")]
    pub agent_cpus: Option<f64>,
    #[serde(alias = "node_memory_mb")]
    pub agent_mem_mb: Option<f64>,
    pub agent_disk_mb: Option<f64>,
}

/// The master.
pub(crate) struct State {
    pub cfg: Config,
    pub agents: Vec<Agent>,
    pub frameworks: BTreeMap<String, Framework>,
    pub removed_frameworks: HashSet<String>,
    pub offers: BTreeMap<String, Offer>,
    pub tasks: BTreeMap<(String, String), Task>,
    /// Inverse offers sent (`POST /sim/inverse_offer`) and their answers.
    pub inverse_offers: Vec<super::maintenance::InverseOfferRec>,
    next_framework: u64,
    next_offer: u64,
    next_task: u64,
    rr: usize,
    root_kill: CancellationToken,
}

pub(crate) fn new_uuid_bytes() -> [u8; 16] {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// A random UUID in its canonical text form.
pub(crate) fn new_uuid_string() -> String {
    let b = new_uuid_bytes();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// RecordIO framing of one event.
pub(crate) fn record(event: &Value) -> Bytes {
    let body = event.to_string();
    Bytes::from(format!("{}\n{}", body.len(), body))
}

impl State {
    pub fn new(cfg: Config, agents: usize, root_kill: CancellationToken) -> State {
        let mut st = State {
            cfg,
            agents: Vec::new(),
            frameworks: BTreeMap::new(),
            removed_frameworks: HashSet::new(),
            offers: BTreeMap::new(),
            tasks: BTreeMap::new(),
            inverse_offers: Vec::new(),
            next_framework: 0,
            next_offer: 0,
            next_task: 0,
            rr: 0,
            root_kill,
        };
        for _ in 0..agents {
            st.add_agent();
        }
        st
    }

    fn agent_total(&self) -> Resources {
        Resources {
            cpus: self.cfg.agent_cpus,
            mem: self.cfg.agent_mem_mb,
            disk: self.cfg.agent_disk_mb,
            ports: vec![self.cfg.agent_ports],
        }
    }

    fn add_agent(&mut self) {
        let i = self.agents.len();
        let total = self.agent_total();
        self.agents.push(Agent {
            id: format!("{}-S{i}", self.cfg.master_id),
            active: true,
            total,
            draining: false,
        });
    }

    pub fn master_info(&self) -> Value {
        json!({
            "id": self.cfg.master_id,
            "ip": u32::from_le_bytes([127, 0, 0, 1]),
            "port": self.cfg.port,
            "pid": format!("master@{}:{}", self.cfg.host, self.cfg.port),
            "hostname": self.cfg.host,
            "version": super::MESOS_VERSION,
            "address": {"hostname": self.cfg.host, "ip": self.cfg.host, "port": self.cfg.port},
            "capabilities": [{"type": "AGENT_UPDATE"}, {"type": "AGENT_DRAINING"}, {"type": "QUOTA_V2"}],
        })
    }

    // ---------- events ----------

    /// Send an event to a framework if it is connected (otherwise it is
    /// dropped, as the master drops events for disconnected frameworks).
    pub fn send(&self, fid: &str, event: &Value) -> bool {
        match self.frameworks.get(fid).and_then(|f| f.stream.as_ref()) {
            Some(s) => s.tx.send(record(event)).is_ok(),
            None => false,
        }
    }

    fn used_on_agent(&self, i: usize) -> Resources {
        let mut r = Resources::default();
        for t in self.tasks.values() {
            if t.agent == i && !is_terminal(t.state) && !t.lost {
                r = r.add(&t.res);
            }
        }
        for o in self.offers.values() {
            if o.agent == i {
                r = r.add(&o.res);
            }
        }
        r
    }

    // ---------- frameworks ----------

    /// Register or re-register a framework and attach a new stream.
    /// Returns the framework id, or the ERROR message for a removed one.
    pub fn subscribe(
        &mut self,
        info: &Value,
        tx: UnboundedSender<Bytes>,
        close: CancellationToken,
        stream_id: &str,
    ) -> Result<String, String> {
        let requested = info["id"]["value"].as_str().map(String::from);
        if let Some(id) = &requested
            && self.removed_frameworks.contains(id)
        {
            return Err("Framework has been removed".into());
        }
        let fid = match requested {
            Some(id) => id,
            None => {
                let id = format!("{}-{:04}", self.cfg.master_id, self.next_framework);
                self.next_framework += 1;
                id
            }
        };
        let caps: HashSet<String> = info["capabilities"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["type"].as_str().map(String::from))
            .collect();
        let roles: Vec<String> = if caps.contains("MULTI_ROLE") {
            info["roles"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(String::from))
                .collect()
        } else {
            vec![info["role"].as_str().unwrap_or("*").to_string()]
        };
        let failover = info["failover_timeout"]
            .as_f64()
            .unwrap_or(0.0)
            .clamp(0.0, 1e9);
        let mut stored = info.clone();
        stored["id"] = json!({"value": fid});
        let stream = Stream {
            id: stream_id.to_string(),
            tx,
            close,
        };
        match self.frameworks.get_mut(&fid) {
            Some(f) => {
                // A new subscription replaces (and closes) the old stream.
                if let Some(old) = f.stream.replace(stream) {
                    old.close.cancel();
                }
                f.info = stored;
                f.roles = roles;
                f.capabilities = caps;
                f.failover_timeout = Duration::from_secs_f64(failover);
                f.disconnected_at = None;
            }
            None => {
                self.frameworks.insert(
                    fid.clone(),
                    Framework {
                        id: fid.clone(),
                        info: stored,
                        roles,
                        capabilities: caps,
                        stream: Some(stream),
                        failover_timeout: Duration::from_secs_f64(failover),
                        disconnected_at: None,
                        suppressed: HashSet::new(),
                        filters: BTreeMap::new(),
                    },
                );
            }
        }
        // Offers made to an earlier connection are gone.
        self.offers.retain(|_, o| o.framework != fid);
        let ev = json!({"type": "SUBSCRIBED", "subscribed": {
            "framework_id": {"value": fid},
            "heartbeat_interval_seconds": self.cfg.heartbeat.as_secs_f64(),
            "master_info": self.master_info(),
        }});
        self.send(&fid, &ev);
        // Unacknowledged updates go out again on the new stream.
        let keys: Vec<(String, String)> =
            self.tasks.keys().filter(|k| k.0 == fid).cloned().collect();
        for k in keys {
            self.send_head(&k);
        }
        Ok(fid)
    }

    /// The subscription stream `stream_id` of `fid` ended.
    pub fn disconnected(&mut self, fid: &str, stream_id: &str) {
        let Some(f) = self.frameworks.get_mut(fid) else {
            return;
        };
        if f.stream.as_ref().is_none_or(|s| s.id != stream_id) {
            return;
        }
        if let Some(s) = f.stream.take() {
            s.close.cancel();
        }
        f.disconnected_at = Some(Instant::now());
        tracing::info!(framework = %fid, failover_timeout = ?f.failover_timeout, "framework disconnected");
        self.offers.retain(|_, o| o.framework != fid);
    }

    /// Remove a framework: kill its tasks, forget its offers, close its stream.
    pub fn remove_framework(&mut self, fid: &str, why: &str) {
        let Some(f) = self.frameworks.remove(fid) else {
            return;
        };
        if let Some(s) = f.stream {
            s.close.cancel();
        }
        tracing::info!(framework = %fid, why, "removing framework");
        self.removed_frameworks.insert(fid.to_string());
        self.offers.retain(|_, o| o.framework != fid);
        let keys: Vec<(String, String)> =
            self.tasks.keys().filter(|k| k.0 == fid).cloned().collect();
        for k in keys {
            if let Some(mut t) = self.tasks.remove(&k) {
                t.lost = true;
                t.kill.cancel();
            }
        }
    }

    // ---------- status updates ----------

    fn base_status(&self, t: &Task, state: &str) -> Value {
        json!({
            "task_id": {"value": t.task_id},
            "state": state,
            "agent_id": {"value": self.agents[t.agent].id},
            "timestamp": now_secs_f64(),
        })
    }

    /// An executor-generated update: gets a uuid, queued until acknowledged.
    pub fn executor_update(
        &mut self,
        key: &(String, String),
        state: &'static str,
        message: Option<String>,
        extra: Value,
    ) {
        let Some(t) = self.tasks.get(key) else {
            return;
        };
        let uuid = b64(&new_uuid_bytes());
        let mut st = self.base_status(t, state);
        st["source"] = json!("SOURCE_EXECUTOR");
        st["executor_id"] = json!({"value": t.executor_id});
        st["uuid"] = json!(uuid);
        if let Some(m) = message {
            st["message"] = json!(m);
        }
        if let (Value::Object(m), Value::Object(x)) = (&mut st, extra) {
            m.extend(x);
        }
        let Some(t) = self.tasks.get_mut(key) else {
            return;
        };
        t.state = state;
        t.latest = st.clone();
        if self.cfg.drop_terminal_updates && is_terminal(state) {
            tracing::info!(task = %key.1, state, "terminal update dropped (--drop-terminal-updates)");
            return;
        }
        t.pending.push_back(PendingUpdate {
            uuid,
            status: st,
            last_sent: None,
            resends: 0,
        });
        if t.pending.len() == 1 {
            self.send_head(key);
        }
    }

    fn send_head(&mut self, key: &(String, String)) {
        let Some(status) = self
            .tasks
            .get(key)
            .and_then(|t| t.pending.front())
            .map(|p| p.status.clone())
        else {
            return;
        };
        let sent = self.send(
            &key.0,
            &json!({"type": "UPDATE", "update": {"status": status}}),
        );
        if let Some(p) = self.tasks.get_mut(key).and_then(|t| t.pending.front_mut()) {
            p.last_sent = if sent { Some(Instant::now()) } else { None };
        }
    }

    /// A master-generated update (no uuid, not retried).
    fn master_update(
        &self,
        fid: &str,
        task_id: &str,
        agent: Option<usize>,
        state: &str,
        reason: &str,
        message: &str,
    ) {
        let mut st = json!({
            "task_id": {"value": task_id},
            "state": state,
            "source": "SOURCE_MASTER",
            "reason": reason,
            "message": message,
            "timestamp": now_secs_f64(),
        });
        if let Some(a) = agent {
            st["agent_id"] = json!({"value": self.agents[a].id});
        }
        self.send(fid, &json!({"type": "UPDATE", "update": {"status": st}}));
    }

    /// ACKNOWLEDGE: drop the head update if its uuid matches, send the next.
    pub fn acknowledge(&mut self, fid: &str, task_id: &str, uuid: &str) -> Result<(), String> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(uuid)
            .map_err(|e| format!("Failed to parse 'uuid' of ACKNOWLEDGE as base64: {e}"))?;
        if raw.len() != 16 {
            return Err(format!(
                "'uuid' of ACKNOWLEDGE must be 16 bytes, got {}",
                raw.len()
            ));
        }
        let key = (fid.to_string(), task_id.to_string());
        let Some(t) = self.tasks.get_mut(&key) else {
            // Real masters forward to the agent, which ignores unknown acks.
            return Ok(());
        };
        let matches = t.pending.front().is_some_and(|p| p.uuid == uuid);
        if !matches {
            return Ok(());
        }
        let acked = t.pending.pop_front();
        let terminal = acked
            .as_ref()
            .is_some_and(|p| p.status["state"].as_str().is_some_and(is_terminal));
        if terminal && t.pending.is_empty() {
            self.tasks.remove(&key);
        } else {
            self.send_head(&key);
        }
        Ok(())
    }

    // ---------- offers and launches ----------

    /// Make offers of unused resources to connected, unsuppressed frameworks
    /// without a filter on the agent, round-robin per agent.
    pub fn allocate(&mut self) {
        let now = Instant::now();
        for f in self.frameworks.values_mut() {
            f.filters.retain(|_, until| *until > now);
        }
        let fids: Vec<String> = self
            .frameworks
            .values()
            .filter(|f| f.stream.is_some() && f.offer_role().is_some())
            .map(|f| f.id.clone())
            .collect();
        if fids.is_empty() {
            return;
        }
        let mut batches: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for i in 0..self.agents.len() {
            if !self.agents[i].active || self.agents[i].draining {
                continue;
            }
            let free = self.agents[i].total.sub(&self.used_on_agent(i));
            if !free.offerable() {
                continue;
            }
            let n = fids.len();
            let pick = (0..n)
                .map(|k| &fids[(self.rr + k) % n])
                .find(|fid| {
                    self.frameworks
                        .get(*fid)
                        .is_some_and(|f| !f.filters.contains_key(&i))
                })
                .cloned();
            self.rr = self.rr.wrapping_add(1);
            let Some(fid) = pick else {
                continue;
            };
            let oid = format!("{}-O{}", self.cfg.master_id, self.next_offer);
            self.next_offer += 1;
            let f = &self.frameworks[&fid];
            let multi = f.has("MULTI_ROLE");
            let role = f.offer_role().unwrap_or("*").to_string();
            let alloc_role = multi.then_some(role.as_str());
            let agent = &self.agents[i];
            let mut offer = json!({
                "id": {"value": oid},
                "framework_id": {"value": fid},
                "agent_id": {"value": agent.id},
                "hostname": self.cfg.host,
                "url": {
                    "scheme": "http",
                    "address": {"hostname": self.cfg.host, "ip": self.cfg.host, "port": 5051 + i as u64},
                    "path": "/slave(1)",
                },
                "resources": free.to_json(alloc_role),
            });
            if multi {
                offer["allocation_info"] = json!({"role": role});
            }
            batches.entry(fid.clone()).or_default().push(offer);
            self.offers.insert(
                oid,
                Offer {
                    framework: fid,
                    agent: i,
                    res: free,
                },
            );
        }
        for (fid, offers) in batches {
            tracing::debug!(framework = %fid, n = offers.len(), "sending offers");
            self.send(
                &fid,
                &json!({"type": "OFFERS", "offers": {"offers": offers}}),
            );
        }
    }

    /// Decline offers (also used for the unused part of an ACCEPT).
    pub fn decline(&mut self, fid: &str, offer_ids: &[String], refuse: f64) {
        let refuse = if refuse.is_finite() {
            refuse.clamp(0.0, 365.0 * 86_400.0)
        } else {
            5.0
        };
        for oid in offer_ids {
            let Some(o) = self.offers.get(oid) else {
                continue;
            };
            if o.framework != fid {
                continue;
            }
            let agent = o.agent;
            self.offers.remove(oid);
            if refuse > 0.0
                && let Some(f) = self.frameworks.get_mut(fid)
            {
                f.filters
                    .insert(agent, Instant::now() + Duration::from_secs_f64(refuse));
            }
        }
    }

    /// ACCEPT: validate the offers, launch tasks, decline the rest.
    pub fn accept(&mut self, fid: &str, call: &Value) -> Result<Vec<TaskJob>, String> {
        let offer_ids: Vec<String> = call["offer_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["value"].as_str().map(String::from))
            .collect();
        let refuse = call["filters"]["refuse_seconds"].as_f64().unwrap_or(5.0);
        let ops = call["operations"].as_array().cloned().unwrap_or_default();
        for op in &ops {
            match op["type"].as_str().unwrap_or("") {
                "LAUNCH" | "LAUNCH_GROUP" => {}
                other => {
                    return Err(format!(
                        "cruise-sim supports only LAUNCH and LAUNCH_GROUP operations in ACCEPT, got {other:?}"
                    ));
                }
            }
        }
        // Offer validation, as the master does before launching anything.
        let mut invalid: Option<String> = None;
        let mut agent: Option<usize> = None;
        let mut pool = Resources::default();
        if offer_ids.is_empty() {
            invalid = Some("No offers specified".into());
        }
        for oid in &offer_ids {
            match self.offers.get(oid) {
                Some(o) if o.framework == fid => {
                    if agent.is_some_and(|a| a != o.agent) {
                        invalid = Some("Aggregated offers must belong to one single agent".into());
                    }
                    agent = Some(o.agent);
                    pool = pool.add(&o.res);
                }
                _ => invalid = Some(format!("Offer {oid} is no longer valid")),
            }
        }
        let partition_aware = self
            .frameworks
            .get(fid)
            .is_some_and(|f| f.has("PARTITION_AWARE"));
        let all_tasks: Vec<Value> = ops
            .iter()
            .flat_map(|op| match op["type"].as_str() {
                Some("LAUNCH") => op["launch"]["task_infos"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                _ => op["launch_group"]["task_group"]["tasks"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect();
        if let Some(why) = invalid {
            let state = if partition_aware {
                "TASK_DROPPED"
            } else {
                "TASK_LOST"
            };
            for t in &all_tasks {
                let tid = t["task_id"]["value"].as_str().unwrap_or("");
                self.master_update(
                    fid,
                    tid,
                    None,
                    state,
                    "REASON_INVALID_OFFERS",
                    &format!("Task launched with invalid offers: {why}"),
                );
            }
            // Valid offers among them are recovered.
            self.decline(fid, &offer_ids, refuse);
            return Ok(Vec::new());
        }
        let Some(agent) = agent else {
            return Ok(Vec::new());
        };
        for oid in &offer_ids {
            self.offers.remove(oid);
        }
        let mut jobs = Vec::new();
        for op in &ops {
            let (tasks, group) = match op["type"].as_str() {
                Some("LAUNCH") => (
                    op["launch"]["task_infos"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                    None,
                ),
                _ => {
                    let lg = &op["launch_group"];
                    let exec_id = lg["executor"]["executor_id"]["value"]
                        .as_str()
                        .map(String::from);
                    let tasks = lg["task_group"]["tasks"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    match exec_id {
                        Some(e) => (tasks, Some(e)),
                        None => {
                            for t in &tasks {
                                let tid = t["task_id"]["value"].as_str().unwrap_or("");
                                self.master_update(
                                    fid,
                                    tid,
                                    Some(agent),
                                    "TASK_ERROR",
                                    "REASON_TASK_GROUP_INVALID",
                                    "Task group is invalid: 'executor.executor_id' is missing",
                                );
                            }
                            continue;
                        }
                    }
                }
            };
            // A task group launches whole or not at all.
            let mut group_need = Resources::default();
            let mut checked = Vec::new();
            let mut group_error: Option<String> = None;
            for t in &tasks {
                match self.validate_task(fid, agent, t, group.is_some()) {
                    Ok(res) => {
                        group_need = group_need.add(&res);
                        checked.push((t, Ok(res)));
                    }
                    Err(e) => {
                        if group.is_some() {
                            group_error.get_or_insert(e.clone());
                        }
                        checked.push((t, Err(e)));
                    }
                }
            }
            if group.is_some() && group_error.is_none() && !pool.contains(&group_need) {
                group_error =
                    Some("Task group uses more resources than available in the offers".into());
            }
            for (t, res) in checked {
                let tid = t["task_id"]["value"].as_str().unwrap_or("").to_string();
                let res = match (res, &group_error) {
                    (_, Some(e)) if group.is_some() => Err(e.clone()),
                    (r, _) => r,
                };
                let res = res.and_then(|r| {
                    if pool.contains(&r) {
                        Ok(r)
                    } else {
                        Err(format!(
                            "Task uses more resources (cpus:{}; mem:{}; disk:{}; ports:{:?}) than available in the offers (cpus:{}; mem:{}; disk:{}; ports:{:?})",
                            r.cpus, r.mem, r.disk, r.ports, pool.cpus, pool.mem, pool.disk, pool.ports
                        ))
                    }
                });
                match res {
                    Ok(r) => {
                        pool = pool.sub(&r);
                        if let Some(job) = self.create_task(fid, agent, t, r, group.clone()) {
                            jobs.push(job);
                        }
                    }
                    Err(e) => {
                        let reason = if group.is_some() {
                            "REASON_TASK_GROUP_INVALID"
                        } else {
                            "REASON_TASK_INVALID"
                        };
                        self.master_update(
                            fid,
                            &tid,
                            Some(agent),
                            "TASK_ERROR",
                            reason,
                            &format!("Task is invalid: {e}"),
                        );
                    }
                }
            }
        }
        // Unused resources count as declined, with the call's filter.
        if pool.offerable()
            && refuse > 0.0
            && let Some(f) = self.frameworks.get_mut(fid)
        {
            f.filters.insert(
                agent,
                Instant::now() + Duration::from_secs_f64(refuse.min(365.0 * 86_400.0)),
            );
        }
        Ok(jobs)
    }

    fn validate_task(
        &self,
        fid: &str,
        agent: usize,
        t: &Value,
        in_group: bool,
    ) -> Result<Resources, String> {
        let tid = t["task_id"]["value"].as_str().unwrap_or("");
        if tid.is_empty() {
            return Err("'task_id' is missing or empty".into());
        }
        if tid.contains('/') || tid == "." || tid == ".." || tid.chars().any(char::is_control) {
            return Err(format!("Task ID '{tid}' contains invalid characters"));
        }
        if t["name"].as_str().is_none() {
            return Err("'name' is missing".into());
        }
        let aid = t["agent_id"]["value"].as_str().unwrap_or("");
        if aid != self.agents[agent].id {
            return Err(format!("Task uses invalid agent: {aid}"));
        }
        if self
            .tasks
            .get(&(fid.to_string(), tid.to_string()))
            .is_some_and(|x| !is_terminal(x.state))
        {
            return Err(format!("Task has duplicate ID: {tid}"));
        }
        let has_cmd = t.get("command").is_some_and(|c| !c.is_null());
        let has_exec = t.get("executor").is_some_and(|c| !c.is_null());
        if !in_group && has_cmd == has_exec {
            return Err(format!(
                "Task {tid} should have at least one (but not both) of CommandInfo or ExecutorInfo present"
            ));
        }
        if has_exec {
            return Err(format!(
                "Task {tid} uses a custom executor: cruise-sim runs command tasks only (set 'command', not 'executor')"
            ));
        }
        if !has_cmd {
            return Err(format!("Task {tid} in a task group needs a 'command'"));
        }
        if t["container"]["type"].as_str() == Some("DOCKER") || !t["container"]["docker"].is_null()
        {
            return Err(format!(
                "Task {tid} asks for a DOCKER container, which cruise-sim does not run"
            ));
        }
        let cmd = &t["command"];
        let shell = cmd["shell"].as_bool().unwrap_or(true);
        if shell && cmd["value"].as_str().is_none_or(str::is_empty) {
            return Err(format!(
                "Task {tid}: command.value is required when command.shell is true"
            ));
        }
        if !shell && cmd["value"].as_str().is_none_or(str::is_empty) {
            return Err(format!(
                "Task {tid}: command.value (the executable) is required"
            ));
        }
        for v in cmd["environment"]["variables"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if v["type"].as_str().is_some_and(|x| x != "VALUE") {
                return Err(format!(
                    "Task {tid}: environment variable type {} is not supported by cruise-sim",
                    v["type"]
                ));
            }
            if v["name"].as_str().is_none_or(str::is_empty) {
                return Err(format!("Task {tid}: environment variable without a name"));
            }
        }
        let res = Resources::from_json(&t["resources"]).map_err(|e| format!("Task {tid}: {e}"))?;
        if res.cpus < EPS && res.mem < EPS {
            return Err(format!("Task {tid} uses no cpus and no mem"));
        }
        Ok(res)
    }

    fn create_task(
        &mut self,
        fid: &str,
        agent: usize,
        t: &Value,
        res: Resources,
        group: Option<String>,
    ) -> Option<TaskJob> {
        let tid = t["task_id"]["value"].as_str()?.to_string();
        let executor_id = group.clone().unwrap_or_else(|| tid.clone());
        let container_id = new_uuid_string();
        let sandbox = self
            .cfg
            .work_dir
            .join("agents")
            .join(&self.agents[agent].id)
            .join("frameworks")
            .join(fid)
            .join("executors")
            .join(&executor_id)
            .join("runs")
            .join(&container_id);
        let sandbox = if group.is_some() {
            sandbox.join("tasks").join(&tid)
        } else {
            sandbox
        };
        let cmd = &t["command"];
        let program = if cmd["shell"].as_bool().unwrap_or(true) {
            Program::Shell(cmd["value"].as_str().unwrap_or("").to_string())
        } else {
            Program::Exec {
                path: cmd["value"].as_str().unwrap_or("").to_string(),
                args: cmd["arguments"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .skip(1)
                    .filter_map(|a| a.as_str().map(String::from))
                    .collect(),
            }
        };
        let agent_id = self.agents[agent].id.clone();
        let mut env: Vec<(String, String)> = vec![
            ("MESOS_SANDBOX".into(), sandbox.display().to_string()),
            ("MESOS_DIRECTORY".into(), sandbox.display().to_string()),
            ("MESOS_FRAMEWORK_ID".into(), fid.to_string()),
            ("MESOS_EXECUTOR_ID".into(), executor_id.clone()),
            ("MESOS_TASK_ID".into(), tid.clone()),
            ("MESOS_AGENT_ID".into(), agent_id.clone()),
            ("MESOS_SLAVE_ID".into(), agent_id),
            ("MESOS_CONTAINER_IP".into(), self.cfg.host.clone()),
            (
                "MESOS_AGENT_ENDPOINT".into(),
                format!("{}:{}", self.cfg.host, 5051 + agent),
            ),
            ("LIBPROCESS_IP".into(), self.cfg.host.clone()),
        ];
        for v in cmd["environment"]["variables"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(n) = v["name"].as_str() {
                env.push((n.to_string(), v["value"].as_str().unwrap_or("").to_string()));
            }
        }
        let kill = self.root_kill.child_token();
        let key = (fid.to_string(), tid.clone());
        let task = Task {
            framework: fid.to_string(),
            task_id: tid.clone(),
            name: t["name"].as_str().unwrap_or("").to_string(),
            agent,
            executor_id,
            group,
            res,
            state: "TASK_STAGING",
            latest: Value::Null,
            pending: VecDeque::new(),
            kill: kill.clone(),
            kill_requested: false,
            lost: false,
            pid: None,
            sandbox: sandbox.clone(),
            exit_message: None,
            container_id,
            seq: self.next_task,
        };
        self.next_task += 1;
        let latest = self.base_status(&task, "TASK_STAGING");
        self.tasks.insert(key.clone(), Task { latest, ..task });
        Some(TaskJob {
            framework: fid.to_string(),
            task_id: tid,
            program,
            env,
            sandbox,
            uris: cmd["uris"].as_array().cloned().unwrap_or_default(),
            kill,
        })
    }

    fn container_status(&self, t: &Task, pid: Option<u32>) -> Value {
        let mut cs = json!({
            "container_id": {"value": t.container_id},
            "network_infos": [{"ip_addresses": [{"protocol": "IPv4", "ip_address": self.cfg.host}]}],
        });
        if let Some(p) = pid {
            cs["executor_pid"] = json!(p);
        }
        json!({"container_status": cs})
    }

    /// The task's process is about to start (after fetching).
    pub fn task_starting(&mut self, key: &(String, String)) {
        let Some(t) = self.tasks.get(key) else {
            return;
        };
        if t.lost || t.kill_requested {
            return;
        }
        let extra = self.container_status(t, None);
        self.executor_update(key, "TASK_STARTING", None, extra);
    }

    /// The task's process runs.
    pub fn task_running(&mut self, key: &(String, String), pid: u32) {
        let Some(t) = self.tasks.get_mut(key) else {
            return;
        };
        t.pid = Some(pid);
        if t.lost {
            return;
        }
        let t = &self.tasks[key];
        let extra = self.container_status(t, Some(pid));
        self.executor_update(key, "TASK_RUNNING", None, extra);
    }

    /// The task ended: exit (`Ok`) or a launch failure (`Err`).
    pub fn task_finished(
        &mut self,
        key: &(String, String),
        result: Result<crate::yarn::common::Outcome, String>,
    ) {
        let Some(t) = self.tasks.get(key) else {
            return;
        };
        if t.lost || is_terminal(t.state) {
            return;
        }
        let killed = t.kill_requested;
        let extra = self.container_status(t, t.pid);
        let (state, message, reason) = match result {
            Err(e) if killed => ("TASK_KILLED", e, None),
            Err(e) => ("TASK_FAILED", e, Some("REASON_CONTAINER_LAUNCH_FAILED")),
            Ok(out) => {
                let msg = match out.exit {
                    crate::yarn::common::Exit::Code(c) => format!("Command exited with status {c}"),
                    crate::yarn::common::Exit::Signal(s) => {
                        format!(
                            "Command terminated with signal {}",
                            crate::yarn::common::signal_name(s)
                        )
                    }
                };
                if killed || out.killed {
                    ("TASK_KILLED", msg, None)
                } else if out.exit == crate::yarn::common::Exit::Code(0) {
                    ("TASK_FINISHED", msg, None)
                } else {
                    ("TASK_FAILED", msg, None)
                }
            }
        };
        let mut extra = extra;
        if let Some(r) = reason {
            extra["reason"] = json!(r);
        }
        if let Some(t) = self.tasks.get_mut(key) {
            t.exit_message = Some(message.clone());
        }
        tracing::info!(framework = %key.0, task = %key.1, state, %message, "task ended");
        self.executor_update(key, state, Some(message), extra);
        // A task group fails together: kill the rest of the group.
        let group = self.tasks.get(key).and_then(|t| t.group.clone());
        if let Some(g) = group
            && state != "TASK_FINISHED"
        {
            let others: Vec<(String, String)> = self
                .tasks
                .iter()
                .filter(|(k, t)| {
                    k.0 == key.0
                        && t.group.as_deref() == Some(&g)
                        && !is_terminal(t.state)
                        && *k != key
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in others {
                self.kill_task(&k.0, &k.1);
            }
        }
    }

    /// KILL: kill a known task (and its group), or answer TASK_LOST.
    pub fn kill_task(&mut self, fid: &str, task_id: &str) {
        let key = (fid.to_string(), task_id.to_string());
        let Some(t) = self.tasks.get(&key) else {
            let pa = self
                .frameworks
                .get(fid)
                .is_some_and(|f| f.has("PARTITION_AWARE"));
            self.master_update(
                fid,
                task_id,
                None,
                if pa { "TASK_UNKNOWN" } else { "TASK_LOST" },
                "REASON_RECONCILIATION",
                "Reconciliation: Task is unknown",
            );
            return;
        };
        if is_terminal(t.state) || t.kill_requested {
            return;
        }
        let group = t.group.clone();
        let mut keys = vec![key];
        if let Some(g) = group {
            keys.extend(
                self.tasks
                    .iter()
                    .filter(|(k, x)| {
                        k.0 == fid && x.group.as_deref() == Some(&g) && !is_terminal(x.state)
                    })
                    .map(|(k, _)| k.clone()),
            );
            keys.dedup();
        }
        let killing = self
            .frameworks
            .get(fid)
            .is_some_and(|f| f.has("TASK_KILLING_STATE"));
        for k in keys {
            let Some(t) = self.tasks.get_mut(&k) else {
                continue;
            };
            if t.kill_requested {
                continue;
            }
            t.kill_requested = true;
            t.kill.cancel();
            if killing && t.state != "TASK_STAGING" {
                let extra = self.container_status(&self.tasks[&k], self.tasks[&k].pid);
                self.executor_update(&k, "TASK_KILLING", None, extra);
            }
        }
    }

    /// RECONCILE (explicit when `tasks` is non-empty, implicit otherwise).
    pub fn reconcile(&self, fid: &str, tasks: &[(String, Option<String>)]) {
        let pa = self
            .frameworks
            .get(fid)
            .is_some_and(|f| f.has("PARTITION_AWARE"));
        let answer = |t: &Task| {
            let mut st = t.latest.clone();
            if let Value::Object(m) = &mut st {
                m.remove("uuid");
            }
            st["reason"] = json!("REASON_RECONCILIATION");
            st["source"] = json!("SOURCE_MASTER");
            st["timestamp"] = json!(now_secs_f64());
            self.send(fid, &json!({"type": "UPDATE", "update": {"status": st}}));
        };
        if tasks.is_empty() {
            for t in self
                .tasks
                .values()
                .filter(|t| t.framework == fid && !t.lost)
            {
                answer(t);
            }
            return;
        }
        for (tid, _agent) in tasks {
            match self.tasks.get(&(fid.to_string(), tid.clone())) {
                Some(t) if !t.lost => answer(t),
                _ => self.master_update(
                    fid,
                    tid,
                    None,
                    if pa { "TASK_UNKNOWN" } else { "TASK_LOST" },
                    "REASON_RECONCILIATION",
                    "Reconciliation: Task is unknown",
                ),
            }
        }
    }

    pub fn revive(&mut self, fid: &str, roles: &[String]) {
        if let Some(f) = self.frameworks.get_mut(fid) {
            f.filters.clear();
            if roles.is_empty() {
                f.suppressed.clear();
            } else {
                for r in roles {
                    f.suppressed.remove(r);
                }
            }
        }
    }

    pub fn suppress(&mut self, fid: &str, roles: &[String]) {
        if let Some(f) = self.frameworks.get_mut(fid) {
            let all = if roles.is_empty() {
                f.roles.clone()
            } else {
                roles.to_vec()
            };
            f.suppressed.extend(all);
        }
    }

    // ---------- time ----------

    /// Retry unacknowledged updates (after `update_retry`, doubling per
    /// retry up to 10 minutes, like the agent's status update manager) and
    /// expire failover timeouts.
    pub fn tick(&mut self) {
        let now = Instant::now();
        let base = self.cfg.update_retry;
        let retry = |n: u32| (base * 2u32.saturating_pow(n.min(20))).min(Duration::from_secs(600));
        let due: Vec<(String, String)> = self
            .tasks
            .iter()
            .filter(|(k, t)| {
                self.frameworks
                    .get(&k.0)
                    .is_some_and(|f| f.stream.is_some())
                    && t.pending.front().is_some_and(|p| {
                        p.last_sent
                            .is_none_or(|s| now.duration_since(s) >= retry(p.resends))
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            tracing::debug!(framework = %k.0, task = %k.1, "re-sending unacknowledged update");
            if let Some(p) = self.tasks.get_mut(&k).and_then(|t| t.pending.front_mut())
                && p.last_sent.is_some()
            {
                p.resends += 1;
            }
            self.send_head(&k);
        }
        let expired: Vec<String> = self
            .frameworks
            .values()
            .filter(|f| {
                f.disconnected_at
                    .is_some_and(|d| now.duration_since(d) >= f.failover_timeout)
            })
            .map(|f| f.id.clone())
            .collect();
        for fid in expired {
            self.remove_framework(&fid, "failover timeout expired");
        }
    }

    // ---------- capacity ----------

    /// Apply a capacity change: removed agents lose their tasks (TASK_LOST /
    /// TASK_GONE from the master), their offers are rescinded and every
    /// framework gets a FAILURE event; shrunken agents rescind offers and
    /// preempt their newest tasks until the rest fit.
    pub fn change_capacity(&mut self, ch: &CapacityChange) -> Vec<String> {
        if let Some(c) = ch.agent_cpus {
            self.cfg.agent_cpus = c;
        }
        if let Some(m) = ch.agent_mem_mb {
            self.cfg.agent_mem_mb = m;
        }
        if let Some(d) = ch.agent_disk_mb {
            self.cfg.agent_disk_mb = d;
        }
        let target = ch
            .agents
            .unwrap_or_else(|| self.agents.iter().filter(|a| a.active).count());
        while self.agents.len() < target {
            self.add_agent();
        }
        let mut affected = Vec::new();
        let total = self.agent_total();
        let mut removed = Vec::new();
        for i in 0..self.agents.len() {
            if i >= target {
                if self.agents[i].active {
                    self.agents[i].active = false;
                    removed.push(i);
                }
                continue;
            }
            let grew_or_same = total.contains(&self.agents[i].total);
            self.agents[i].active = true;
            if self.agents[i].total != total {
                self.agents[i].total = total.clone();
                if !grew_or_same {
                    affected.push(i);
                }
            }
        }
        let mut killed = Vec::new();
        // Rescind offers on removed and shrunken agents.
        let rescind: Vec<String> = self
            .offers
            .iter()
            .filter(|(_, o)| removed.contains(&o.agent) || affected.contains(&o.agent))
            .map(|(id, _)| id.clone())
            .collect();
        for oid in rescind {
            if let Some(o) = self.offers.remove(&oid) {
                self.send(
                    &o.framework,
                    &json!({"type": "RESCIND", "rescind": {"offer_id": {"value": oid}}}),
                );
            }
        }
        for &i in &removed {
            let host = self.cfg.host.clone();
            let keys: Vec<(String, String)> = self
                .tasks
                .iter()
                .filter(|(_, t)| t.agent == i && !t.lost)
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                self.lose_task(
                    &k,
                    "REASON_AGENT_REMOVED",
                    &format!(
                        "Agent {host} ({}) removed: cruise-sim capacity change",
                        self.agents[i].id
                    ),
                );
                killed.push(k.1);
            }
            let ev =
                json!({"type": "FAILURE", "failure": {"agent_id": {"value": self.agents[i].id}}});
            let fids: Vec<String> = self.frameworks.keys().cloned().collect();
            for fid in fids {
                self.send(&fid, &ev);
            }
        }
        for &i in &affected {
            let cap = self.agents[i].total.clone();
            let mut live: Vec<((String, String), Resources)> = self
                .tasks
                .iter()
                .filter(|(_, t)| t.agent == i && !t.lost && !is_terminal(t.state))
                .map(|(k, t)| (k.clone(), t.res.clone()))
                .collect();
            // Newest last, so they are preempted first.
            live.sort_by_key(|(k, _)| self.tasks.get(k).map(|t| t.seq).unwrap_or(u64::MAX));
            let mut used = live.iter().fold(Resources::default(), |a, (_, r)| a.add(r));
            while !cap.contains(&Resources {
                ports: Vec::new(),
                ..used.clone()
            }) && let Some((k, r)) = live.pop()
            {
                used = used.sub(&r);
                self.lose_task(&k, "REASON_CONTAINER_PREEMPTED", &format!(
                    "Task preempted: agent {} shrank to cpus:{}; mem:{} (cruise-sim capacity change)",
                    self.agents[i].id, cap.cpus, cap.mem
                ));
                killed.push(k.1);
            }
        }
        killed
    }

    /// The master gives up on a task: TASK_LOST (TASK_GONE for
    /// partition-aware frameworks) without uuid, and its process is killed.
    fn lose_task(&mut self, key: &(String, String), reason: &str, message: &str) {
        let pa = self
            .frameworks
            .get(&key.0)
            .is_some_and(|f| f.has("PARTITION_AWARE"));
        let Some(t) = self.tasks.remove(key) else {
            return;
        };
        t.kill.cancel();
        self.master_update(
            &key.0,
            &key.1,
            Some(t.agent),
            if pa { "TASK_GONE" } else { "TASK_LOST" },
            reason,
            message,
        );
    }

    /// Kill every task (shutdown).
    pub fn kill_all(&mut self) {
        for t in self.tasks.values_mut() {
            t.kill_requested = true;
            t.kill.cancel();
        }
        self.root_kill.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_arithmetic() {
        assert_eq!(
            subtract_ranges(&[(31000, 32000)], &[(31000, 31000), (31500, 31600)]),
            vec![(31001, 31499), (31601, 32000)]
        );
        assert!(ranges_contain(&[(1, 10), (20, 30)], &[(2, 3), (25, 30)]));
        assert!(!ranges_contain(&[(1, 10)], &[(9, 11)]));
        assert_eq!(
            merge_ranges(vec![(5, 6), (1, 4), (8, 9)]),
            vec![(1, 6), (8, 9)]
        );
    }

    #[test]
    fn resources_parse_and_compare() {
        let r = Resources::from_json(&json!([
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 64}},
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 31000, "end": 31001}]}},
        ]))
        .unwrap();
        let offer = Resources {
            cpus: 1.0,
            mem: 128.0,
            disk: 0.0,
            ports: vec![(31000, 32000)],
        };
        assert!(offer.contains(&r));
        let left = offer.sub(&r);
        assert_eq!(left.ports, vec![(31002, 32000)]);
        assert!(!left.contains(&r));
        assert!(Resources::from_json(&json!([{"name": "gpus", "scalar": {"value": 1}}])).is_err());
    }

    #[test]
    fn recordio_frames_byte_length() {
        let b = record(&json!({"type": "HEARTBEAT"}));
        assert_eq!(&b[..], b"20\n{\"type\":\"HEARTBEAT\"}");
    }
}
