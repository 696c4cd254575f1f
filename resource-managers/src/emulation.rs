//! An emulated cluster of unequal containers for the local runtime.
//!
//! [`Emulation`] gives each container the local runtime starts a CPU share
//! and a link bandwidth ([`Shape`]), by one of two mechanisms:
//!
//! - **kernel** (root, `ip`, `tc`, a cgroup `cpu` controller): a bridge in
//!   this namespace for the AM, and per container a network namespace joined
//!   to it by a veth pair, a `tc` token-bucket filter on both ends of the
//!   pair (the container's sending and receiving rate), and a cgroup with a
//!   CPU quota (v1 `cpu.cfs_quota_us`, or v2 `cpu.max`) and a high weight, so
//!   that other load on the machine does not take the quota away. The evaluator enters
//!   its namespace and cgroup between fork and exec ([`Placement`]), so its
//!   process id is the one the runtime signals. Everything lives in a private
//!   /24 the configuration names, and nothing is routed anywhere else.
//! - **process**: the evaluator is told its shape in its environment and
//!   throttles itself (`cruise_container::emulate`).
//!
//! This module owns what it creates in the kernel: the bridge, and each live
//! container's namespace and cgroup. A container's are removed when it ends
//! ([`Emulation::release`]), the rest when the runtime shuts down
//! ([`Emulation::shutdown`], or on drop, so also when the runtime fails).
//! Leftovers of a job whose AM was killed (names carry the AM's process id)
//! are removed by the next job that prepares a kernel emulation.
//!
//! The kernel is driven with `ip` and `tc` run synchronously: a handful of
//! short commands per container start and end.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::RmError;

/// Prefix of network namespaces and cgroups: `cruise-<AM pid>-<n>`.
const NAME_PREFIX: &str = "cruise-";
/// Prefix of bridges: `crb<AM pid>`.
const BRIDGE_PREFIX: &str = "crb";
/// The kernel's least CPU quota per period, microseconds.
const MIN_QUOTA_US: u64 = 1_000;
/// CPU weight of a container's cgroup, v1 `cpu.shares` (a process's is 1024)
/// and v2 `cpu.weight` (a process's group's is 100): sixteen times a normal
/// process's, so a busy machine still gives a container its quota.
const CPU_WEIGHT_V1: u64 = 16 * 1024;
const CPU_WEIGHT_V2: u64 = 16 * 100;
/// Token-bucket queue: packets wait at most this long before being dropped.
const TBF_LATENCY: &str = "50ms";

/// One kernel emulation per process at a time (names carry the process id).
static KERNEL_IN_USE: AtomicBool = AtomicBool::new(false);

/// One container's emulated resources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Cores it may use; `None`: unlimited.
    pub cpu: Option<f64>,
    /// Its link's bandwidth in each direction, bits per second; `None`:
    /// unlimited.
    pub bits_per_sec: Option<f64>,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cpu {
            Some(c) => write!(f, "{c} cpu")?,
            None => f.write_str("unlimited cpu")?,
        }
        match self.bits_per_sec {
            Some(b) if b >= 1e9 => write!(f, ", {} Gbit/s", b / 1e9),
            Some(b) if b >= 1e6 => write!(f, ", {} Mbit/s", b / 1e6),
            Some(b) => write!(f, ", {} kbit/s", b / 1e3),
            None => f.write_str(", unlimited bandwidth"),
        }
    }
}

/// Which mechanism the configuration asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Kernel when this machine can, else process.
    Auto,
    /// Kernel, or fail.
    Kernel,
    /// Process.
    Process,
}

/// The mechanism in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Namespaces, `tc` and cgroups.
    Kernel,
    /// Throttling inside the evaluators.
    Process,
}

/// Names of the environment variables that tell an evaluator its shape
/// under the process mechanism (the evaluator defines them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEnv {
    /// CPU share, in cores.
    pub cpu: String,
    /// Bandwidth, bytes per second.
    pub bytes_per_sec: String,
}

/// What to emulate and how.
#[derive(Debug, Clone)]
pub struct EmulationSpec {
    /// Shapes in container start order; the `n`-th container started (from
    /// 1) gets entry `(n - 1) % len`.
    pub shapes: Vec<Shape>,
    /// The mechanism asked for.
    pub choice: Choice,
    /// First three octets of the kernel mechanism's /24.
    pub subnet: [u8; 3],
    /// CPU quota period.
    pub cpu_period: Duration,
    /// The process mechanism's environment variables.
    pub env: ProcessEnv,
}

/// What a starting container gets: environment variables, and under the
/// kernel mechanism the namespace and cgroup its process enters before exec.
#[derive(Debug, Default)]
pub struct Placement {
    /// Variables to add to its environment.
    pub env: Vec<(String, String)>,
    /// The network namespace (`/run/netns/...`), to `setns` into.
    pub netns: Option<OwnedFd>,
    /// The cgroup's `cgroup.procs`, open for writing (`0` moves the writer).
    pub cgroup_procs: Option<OwnedFd>,
    /// The shape and where it lives, for logs.
    pub note: String,
}

/// Where the machine's cgroup `cpu` controller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupCpu {
    /// cgroup v1: containers' groups are made in this directory of the `cpu`
    /// hierarchy (this process's own group).
    V1(PathBuf),
    /// cgroup v2: containers' groups are made in this directory (the
    /// hierarchy's root), whose `cgroup.subtree_control` gets `+cpu`.
    V2(PathBuf),
}

/// What this machine offers the kernel mechanism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// Running as root.
    pub root: bool,
    /// `ip`, if found.
    pub ip: Option<PathBuf>,
    /// `tc`, if found.
    pub tc: Option<PathBuf>,
    /// The cgroup `cpu` controller, if any.
    pub cgroup: Option<CgroupCpu>,
}

impl HostFacts {
    /// Looks at this machine.
    pub fn probe() -> HostFacts {
        HostFacts {
            root: nix::unistd::geteuid().is_root(),
            ip: find_program("ip"),
            tc: find_program("tc"),
            cgroup: find_cgroup_cpu(),
        }
    }
}

/// The mechanism for `choice` on a machine with `facts`, and why; an error
/// when the kernel mechanism is required and this machine lacks what it
/// needs. `needs_cpu` / `needs_bandwidth`: whether any shape limits them.
pub fn resolve(
    choice: Choice,
    facts: &HostFacts,
    needs_cpu: bool,
    needs_bandwidth: bool,
) -> Result<(Mechanism, String), RmError> {
    if choice == Choice::Process {
        return Ok((
            Mechanism::Process,
            "emulation.mechanism = \"process\"".into(),
        ));
    }
    let mut missing = Vec::new();
    if !facts.root {
        missing.push("root (it creates network namespaces, qdiscs and cgroups)".to_string());
    }
    if facts.ip.is_none() {
        missing.push("`ip` (iproute2) on the PATH".to_string());
    }
    if needs_bandwidth && facts.tc.is_none() {
        missing.push("`tc` (iproute2) on the PATH".to_string());
    }
    if needs_cpu && facts.cgroup.is_none() {
        missing.push("a cgroup `cpu` controller (v1 cpu or v2 cpu.max)".to_string());
    }
    match (choice, missing.is_empty()) {
        (_, true) => Ok((
            Mechanism::Kernel,
            if choice == Choice::Auto {
                "root with ip, tc and a cgroup cpu controller".into()
            } else {
                "emulation.mechanism = \"kernel\"".into()
            },
        )),
        (Choice::Kernel, false) => Err(RmError::Emulation(format!(
            "emulation.mechanism = \"kernel\" needs {}; use \"process\" (or \"auto\") to throttle inside the evaluators instead",
            missing.join(", ")
        ))),
        (_, false) => Ok((Mechanism::Process, format!("no {}", missing.join(", no ")))),
    }
}

/// An emulated cluster: the shapes, the mechanism, and (kernel) what exists
/// in the kernel for it.
pub struct Emulation {
    spec: EmulationSpec,
    mechanism: Mechanism,
    why: String,
    kernel: Option<Kernel>,
}

impl std::fmt::Debug for Emulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Emulation {
    /// Chooses the mechanism for this machine and, for the kernel one,
    /// removes leftovers of killed jobs and creates the bridge.
    pub fn prepare(spec: EmulationSpec) -> Result<Emulation, RmError> {
        Self::prepare_on(spec, &HostFacts::probe())
    }

    /// [`Emulation::prepare`] with the machine's facts given.
    pub fn prepare_on(spec: EmulationSpec, facts: &HostFacts) -> Result<Emulation, RmError> {
        if spec.shapes.is_empty() {
            return Err(RmError::Emulation("no container shapes".into()));
        }
        let needs_cpu = spec.shapes.iter().any(|s| s.cpu.is_some());
        let needs_bw = spec.shapes.iter().any(|s| s.bits_per_sec.is_some());
        let (mechanism, why) = resolve(spec.choice, facts, needs_cpu, needs_bw)?;
        let kernel = match mechanism {
            Mechanism::Process => None,
            Mechanism::Kernel => Some(Kernel::create(&spec, facts)?),
        };
        let e = Emulation {
            spec,
            mechanism,
            why,
            kernel,
        };
        tracing::info!("emulated cluster: {}", e.describe());
        Ok(e)
    }

    /// The mechanism in use.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// The address the AM must listen on for evaluators to reach it (the
    /// bridge's), under the kernel mechanism.
    pub fn am_ip(&self) -> Option<Ipv4Addr> {
        self.kernel.as_ref().map(|k| k.bridge_ip())
    }

    /// The shape of the `seq`-th container started (from 1).
    pub fn shape(&self, seq: u64) -> Shape {
        let n = self.spec.shapes.len() as u64;
        self.spec.shapes[(seq.saturating_sub(1) % n) as usize]
    }

    /// What is emulated and how, in words (for logs, status and summaries).
    pub fn describe(&self) -> String {
        let how = match (&self.kernel, self.mechanism) {
            (Some(k), _) => format!(
                "kernel ({}): a network namespace per container on bridge {} ({}/24), tc tbf on both ends of its link, {} quota (period {} ms)",
                self.why,
                k.bridge,
                k.bridge_ip(),
                match k.cgroup {
                    Some(CgroupCpu::V1(_)) => "cgroup v1 cpu",
                    Some(CgroupCpu::V2(_)) => "cgroup v2 cpu.max",
                    None => "no cpu",
                },
                self.spec.cpu_period.as_secs_f64() * 1e3
            ),
            (None, _) => format!(
                "process ({}): worker compute stretched to the CPU share, data-plane reads and writes paced to the bandwidth, inside each evaluator",
                self.why
            ),
        };
        format!(
            "{how}; containers in start order: {}",
            shapes_text(&self.spec.shapes)
        )
    }

    /// Sets up container `id`, the `seq`-th started (from 1).
    pub fn place(&mut self, id: &str, seq: u64) -> Result<Placement, RmError> {
        let shape = self.shape(seq);
        match &mut self.kernel {
            Some(k) => k.place(id, seq, shape, self.spec.cpu_period),
            None => {
                let mut env = Vec::new();
                if let Some(c) = shape.cpu {
                    env.push((self.spec.env.cpu.clone(), c.to_string()));
                }
                if let Some(b) = shape.bits_per_sec {
                    env.push((self.spec.env.bytes_per_sec.clone(), (b / 8.0).to_string()));
                }
                Ok(Placement {
                    env,
                    note: format!("{shape} (in-process)"),
                    ..Placement::default()
                })
            }
        }
    }

    /// Removes what container `id` had (after its process ended).
    pub fn release(&mut self, id: &str) {
        if let Some(k) = &mut self.kernel {
            k.release(id);
        }
    }

    /// Removes everything: every container's namespace and cgroup, then the
    /// bridge. Idempotent.
    pub fn shutdown(&mut self) {
        if let Some(k) = &mut self.kernel {
            k.shutdown();
        }
    }
}

impl Drop for Emulation {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `4×(0.3 cpu, 400 Mbit/s), 1×(...)`: runs of equal shapes.
pub fn shapes_text(shapes: &[Shape]) -> String {
    let mut runs: Vec<(usize, Shape)> = Vec::new();
    for s in shapes {
        match runs.last_mut() {
            Some((n, last)) if last == s => *n += 1,
            _ => runs.push((1, *s)),
        }
    }
    runs.iter()
        .map(|(n, s)| format!("{n}×({s})"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct Live {
    netns: String,
    host_veth: String,
    octet: u8,
    cgroup: Option<PathBuf>,
}

struct Kernel {
    ip: PathBuf,
    tc: Option<PathBuf>,
    cgroup: Option<CgroupCpu>,
    tag: String,
    subnet: [u8; 3],
    bridge: String,
    bridge_made: bool,
    free: BTreeSet<u8>,
    last_octet: u8,
    live: BTreeMap<String, Live>,
}

impl Kernel {
    fn create(spec: &EmulationSpec, facts: &HostFacts) -> Result<Kernel, RmError> {
        let ip = facts
            .ip
            .clone()
            .ok_or_else(|| RmError::Emulation("`ip` not found".into()))?;
        if KERNEL_IN_USE.swap(true, Ordering::SeqCst) {
            return Err(RmError::Emulation(
                "this process already runs a kernel emulation (one job at a time)".into(),
            ));
        }
        let tag = std::process::id().to_string();
        let mut k = Kernel {
            ip,
            tc: facts.tc.clone(),
            cgroup: facts.cgroup.clone(),
            bridge: format!("{BRIDGE_PREFIX}{tag}"),
            tag,
            subnet: spec.subnet,
            bridge_made: false,
            free: (2..=254).collect(),
            last_octet: 1,
            live: BTreeMap::new(),
        };
        k.remove_leftovers();
        k.check_subnet_unused()?;
        if let Some(CgroupCpu::V2(root)) = &k.cgroup {
            enable_v2_cpu(root)?;
        }
        let bridge_ip = k.bridge_ip();
        let made = run(
            &k.ip,
            &[
                "link",
                "add",
                "name",
                &k.bridge,
                "address",
                &k.mac(1),
                "type",
                "bridge",
            ],
            "creating the emulation bridge",
        );
        k.bridge_made = made.is_ok();
        made?;
        run(
            &k.ip,
            &["addr", "add", &format!("{bridge_ip}/24"), "dev", &k.bridge],
            "addressing the emulation bridge",
        )?;
        run(
            &k.ip,
            &["link", "set", &k.bridge, "up"],
            "starting the emulation bridge",
        )?;
        Ok(k)
    }

    fn bridge_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The link address of host `octet` of the subnet. Fixed per address:
    /// a bridge otherwise takes the lowest address of its ports and changes
    /// it when a container joins, and a container reusing an address would
    /// bring a new one; either leaves stale neighbour entries behind, and
    /// traffic to them is dropped for seconds.
    fn mac(&self, octet: u8) -> String {
        let [a, b, c] = self.subnet;
        format!("02:63:{a:02x}:{b:02x}:{c:02x}:{octet:02x}")
    }

    /// The next free host address after the last one given (addresses are
    /// reused as late as possible).
    fn take_octet(&mut self) -> Option<u8> {
        let next = self
            .free
            .range(self.last_octet.saturating_add(1)..)
            .next()
            .or_else(|| self.free.first())
            .copied()?;
        self.free.remove(&next);
        self.last_octet = next;
        Some(next)
    }

    /// Fails, naming `emulation.subnet`, if an interface or route of this
    /// namespace already uses the subnet (another emulated job, say).
    fn check_subnet_unused(&self) -> Result<(), RmError> {
        let [a, b, c] = self.subnet;
        let net = format!("{a}.{b}.{c}.");
        for args in [
            &["-o", "-4", "addr", "show"][..],
            &["-4", "route", "show"][..],
        ] {
            let out = output(&self.ip, args, "listing addresses and routes")?;
            if let Some(line) = out
                .lines()
                .find(|l| l.split_whitespace().any(|w| w.starts_with(&net)))
            {
                return Err(RmError::Emulation(format!(
                    "emulation.subnet {net}0/24 is already in use here ({}); another emulated job may be running: choose another private /24 with --set emulation.subnet=...",
                    line.trim()
                )));
            }
        }
        Ok(())
    }

    /// Removes namespaces, bridges and cgroups left by jobs whose AM process
    /// is gone.
    fn remove_leftovers(&self) {
        let dead = |name: &str, prefix: &str| -> bool {
            let Some(rest) = name.strip_prefix(prefix) else {
                return false;
            };
            let pid = rest.split('-').next().unwrap_or("");
            !pid.is_empty()
                && pid.bytes().all(|b| b.is_ascii_digit())
                && pid != self.tag
                && !Path::new(&format!("/proc/{pid}")).exists()
        };
        if let Ok(dir) = std::fs::read_dir("/run/netns") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if dead(&name, NAME_PREFIX) {
                    tracing::warn!("removing network namespace {name} left by a killed job");
                    let _ = run(&self.ip, &["netns", "del", &name], "removing a leftover");
                }
            }
        }
        if let Ok(out) = output(
            &self.ip,
            &["-o", "link", "show", "type", "bridge"],
            "listing bridges",
        ) {
            for line in out.lines() {
                let Some(name) = line.split(':').nth(1).map(str::trim) else {
                    continue;
                };
                if dead(name, BRIDGE_PREFIX) {
                    tracing::warn!("removing bridge {name} left by a killed job");
                    let _ = run(&self.ip, &["link", "del", name], "removing a leftover");
                }
            }
        }
        if let Some(CgroupCpu::V1(root) | CgroupCpu::V2(root)) = &self.cgroup
            && let Ok(dir) = std::fs::read_dir(root)
        {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if dead(&name, NAME_PREFIX) {
                    match std::fs::remove_dir(e.path()) {
                        Ok(()) => tracing::warn!("removed cgroup {name} left by a killed job"),
                        Err(err) => tracing::warn!(
                            "cgroup {} was left by a killed job and cannot be removed yet: {err}",
                            e.path().display()
                        ),
                    }
                }
            }
        }
    }

    fn place(
        &mut self,
        id: &str,
        seq: u64,
        shape: Shape,
        period: Duration,
    ) -> Result<Placement, RmError> {
        let octet = self.take_octet().ok_or_else(|| {
            RmError::Emulation(format!(
                "no address left in emulation.subnet for container {id} (253 at once at most)"
            ))
        })?;
        let [a, b, c] = self.subnet;
        let addr = Ipv4Addr::new(a, b, c, octet);
        let live = Live {
            netns: format!("{NAME_PREFIX}{}-{seq}", self.tag),
            host_veth: format!("crv{}x{octet}", self.tag),
            octet,
            cgroup: None,
        };
        let netns = live.netns.clone();
        self.live.insert(id.to_string(), live);
        match self.build(id, &netns, addr, shape, period) {
            Ok(p) => Ok(p),
            Err(e) => {
                self.release(id);
                Err(e)
            }
        }
    }

    fn build(
        &mut self,
        id: &str,
        netns: &str,
        addr: Ipv4Addr,
        shape: Shape,
        period: Duration,
    ) -> Result<Placement, RmError> {
        let veth = self
            .live
            .get(id)
            .map(|l| l.host_veth.clone())
            .unwrap_or_default();
        batch(
            &self.ip,
            &[],
            &[
                format!("netns add {netns}"),
                format!(
                    "link add {veth} type veth peer name eth0 address {} netns {netns}",
                    self.mac(addr.octets()[3])
                ),
                format!("link set {veth} master {}", self.bridge),
                format!("link set {veth} up"),
            ],
            "creating the container's namespace and link",
        )?;
        batch(
            &self.ip,
            &["-n", netns],
            &[
                format!("addr add {addr}/24 dev eth0"),
                "link set eth0 up".into(),
                "link set lo up".into(),
            ],
            "addressing the container's link",
        )?;
        if let Some(bits) = shape.bits_per_sec {
            let tc = self
                .tc
                .clone()
                .ok_or_else(|| RmError::Emulation("`tc` not found".into()))?;
            let (rate, burst) = tbf_params(bits);
            let qdisc = |dev: &str| {
                vec![
                    "qdisc".to_string(),
                    "add".into(),
                    "dev".into(),
                    dev.to_string(),
                    "root".into(),
                    "tbf".into(),
                    "rate".into(),
                    rate.clone(),
                    "burst".into(),
                    burst.clone(),
                    "latency".into(),
                    TBF_LATENCY.into(),
                ]
            };
            // Sending: on the container's end; receiving: on the bridge's end.
            let mut inside = vec!["-n".to_string(), netns.to_string()];
            inside.extend(qdisc("eth0"));
            run_owned(&tc, &inside, "limiting the container's sending rate")?;
            run_owned(
                &tc,
                &qdisc(&veth),
                "limiting the container's receiving rate",
            )?;
        }
        let netns_fd = std::fs::File::open(format!("/run/netns/{netns}"))
            .map_err(|e| RmError::Emulation(format!("opening /run/netns/{netns}: {e}")))?;
        let cgroup_procs = match (shape.cpu, &self.cgroup) {
            (Some(cpu), Some(cg)) => {
                let (dir, procs) = make_cgroup(cg, netns, cpu, period)?;
                if let Some(l) = self.live.get_mut(id) {
                    l.cgroup = Some(dir);
                }
                Some(procs)
            }
            (Some(_), None) => {
                return Err(RmError::Emulation(
                    "no cgroup cpu controller for a CPU share".into(),
                ));
            }
            (None, _) => None,
        };
        Ok(Placement {
            env: Vec::new(),
            netns: Some(netns_fd.into()),
            cgroup_procs,
            note: format!("{shape}; namespace {netns} at {addr}"),
        })
    }

    fn release(&mut self, id: &str) {
        let Some(l) = self.live.remove(id) else {
            return;
        };
        // The namespace, and the veth end in it, go only once its last
        // process has gone and the kernel has cleaned up after it (later
        // than the evaluator's exit, and a killed one may not have exited
        // yet). Deleting the host's end removes the pair (and its qdiscs) at
        // once: nothing is left behind, and the address, free again, can be
        // given to the next container without its veth name being taken.
        if Path::new("/sys/class/net").join(&l.host_veth).exists()
            && let Err(e) = run(
                &self.ip,
                &["link", "del", &l.host_veth],
                "removing a container's link",
            )
        {
            tracing::warn!("{e}");
        }
        if let Err(e) = run(
            &self.ip,
            &["netns", "del", &l.netns],
            "removing a namespace",
        ) {
            tracing::warn!("{e}");
        }
        if let Some(dir) = &l.cgroup {
            remove_cgroup(dir);
        }
        self.free.insert(l.octet);
    }

    fn shutdown(&mut self) {
        let ids: Vec<String> = self.live.keys().cloned().collect();
        for id in ids {
            self.release(&id);
        }
        if self.bridge_made {
            self.bridge_made = false;
            if let Err(e) = run(
                &self.ip,
                &["link", "del", &self.bridge],
                "removing the emulation bridge",
            ) {
                tracing::warn!("{e}");
            }
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.shutdown();
        KERNEL_IN_USE.store(false, Ordering::SeqCst);
    }
}

/// `tc tbf` rate and burst for `bits` per second: a burst of 4 ms of
/// traffic, at least 64 KiB (a GSO segment must fit).
pub fn tbf_params(bits: f64) -> (String, String) {
    let bytes = bits / 8.0;
    let burst = (bytes / 250.0).max(65_536.0).round() as u64;
    (format!("{}bit", bits.round() as u64), format!("{burst}b"))
}

/// Quota and period (µs) for `cpu` cores: the period is lengthened when the
/// quota would fall below the kernel's least (1 ms).
pub fn cpu_quota(cpu: f64, period: Duration) -> (u64, u64) {
    let mut period_us = period.as_micros().clamp(1_000, 1_000_000) as u64;
    let mut quota = (cpu * period_us as f64).round() as u64;
    if quota < MIN_QUOTA_US {
        period_us = ((MIN_QUOTA_US as f64 / cpu).ceil() as u64).min(1_000_000);
        quota = ((cpu * period_us as f64).round() as u64).max(MIN_QUOTA_US);
    }
    (quota, period_us)
}

fn make_cgroup(
    cg: &CgroupCpu,
    name: &str,
    cpu: f64,
    period: Duration,
) -> Result<(PathBuf, OwnedFd), RmError> {
    let (quota, period_us) = cpu_quota(cpu, period);
    let root = match cg {
        CgroupCpu::V1(r) | CgroupCpu::V2(r) => r,
    };
    let dir = root.join(name);
    let fail = |what: &str, e: std::io::Error| {
        RmError::Emulation(format!("{what} {}: {e}", dir.display()))
    };
    std::fs::create_dir(&dir).map_err(|e| fail("creating cgroup", e))?;
    let write = |file: &str, text: String| {
        std::fs::write(dir.join(file), text).map_err(|e| fail(&format!("writing {file} of"), e))
    };
    // The quota caps the container; the weight makes sure it gets its quota
    // when other processes keep the machine busy (the quotas of all
    // containers stay below the cores, so it cannot take more than that).
    let set = match cg {
        CgroupCpu::V1(_) => write("cpu.cfs_period_us", period_us.to_string())
            .and_then(|()| write("cpu.cfs_quota_us", quota.to_string()))
            .and_then(|()| write("cpu.shares", CPU_WEIGHT_V1.to_string())),
        CgroupCpu::V2(_) => write("cpu.max", format!("{quota} {period_us}"))
            .and_then(|()| write("cpu.weight", CPU_WEIGHT_V2.to_string())),
    };
    let procs = set.and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| fail("opening cgroup.procs of", e))
    });
    match procs {
        Ok(f) => Ok((dir, f.into())),
        Err(e) => {
            remove_cgroup(&dir);
            Err(e)
        }
    }
}

/// Removes an (empty) cgroup; its last process may take a moment to leave.
fn remove_cgroup(dir: &Path) {
    for attempt in 0..50 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if attempt == 49 => {
                tracing::warn!("cannot remove cgroup {}: {e}", dir.display());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

fn enable_v2_cpu(root: &Path) -> Result<(), RmError> {
    let control = root.join("cgroup.subtree_control");
    let now = std::fs::read_to_string(&control).unwrap_or_default();
    if now.split_whitespace().any(|c| c == "cpu") {
        return Ok(());
    }
    std::fs::write(&control, "+cpu").map_err(|e| {
        RmError::Emulation(format!(
            "enabling the cpu controller in {}: {e}",
            control.display()
        ))
    })
}

/// The first executable `name` on the PATH (or in the sbin directories,
/// which a root shell has but a service's PATH may lack).
fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The cgroup `cpu` controller from `/proc/self/mountinfo` and
/// `/proc/self/cgroup`: v1 (this process's group in the `cpu` hierarchy)
/// when mounted, else v2 (the root of the unified hierarchy) when it offers
/// `cpu`.
fn find_cgroup_cpu() -> Option<CgroupCpu> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroup_cpu_from(&mountinfo, &own, |p| p.is_dir())
}

/// [`find_cgroup_cpu`] on given file contents (`exists` checks a directory).
pub fn cgroup_cpu_from(
    mountinfo: &str,
    own_cgroup: &str,
    exists: impl Fn(&Path) -> bool,
) -> Option<CgroupCpu> {
    let mut v2 = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mountpoint options... - fstype source superoptions
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mountpoint = left.split_whitespace().nth(4)?;
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or("");
        let superopts = r.nth(1).unwrap_or("");
        match fstype {
            "cgroup" if superopts.split(',').any(|o| o == "cpu") => {
                let own = own_cgroup.lines().find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
                    ctrls
                        .split(',')
                        .any(|c| c == "cpu")
                        .then(|| path.to_string())
                });
                let base = PathBuf::from(mountpoint);
                let dir = own
                    .map(|p| base.join(p.trim_start_matches('/')))
                    .filter(|d| exists(d))
                    .unwrap_or(base);
                return Some(CgroupCpu::V1(dir));
            }
            "cgroup2" if v2.is_none() => v2 = Some(PathBuf::from(mountpoint)),
            _ => {}
        }
    }
    let root = v2?;
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    controllers
        .split_whitespace()
        .any(|c| c == "cpu")
        .then_some(CgroupCpu::V2(root))
}

fn command_text(program: &Path, args: &[impl AsRef<str>]) -> String {
    let mut s = program.display().to_string();
    for a in args {
        s.push(' ');
        s.push_str(a.as_ref());
    }
    s
}

fn output(program: &Path, args: &[&str], what: &str) -> Result<String, RmError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RmError::Emulation(format!("{what}: {}: {e}", command_text(program, args))))?;
    if !out.status.success() {
        return Err(RmError::Emulation(format!(
            "{what}: `{}` failed ({}): {}",
            command_text(program, args),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

fn run(program: &Path, args: &[&str], what: &str) -> Result<(), RmError> {
    output(program, args, what).map(|_| ())
}

fn run_owned(program: &Path, args: &[String], what: &str) -> Result<(), RmError> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(program, &args, what)
}

/// Runs `program [global...] -batch -` with `lines` on its stdin.
fn batch(program: &Path, global: &[&str], lines: &[String], what: &str) -> Result<(), RmError> {
    let mut args: Vec<&str> = global.to_vec();
    args.extend(["-batch", "-"]);
    let text = command_text(program, &args);
    let fail =
        |e: String| RmError::Emulation(format!("{what}: `{text}` ({}): {e}", lines.join("; ")));
    let mut child = Command::new(program)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(format!("{}\n", lines.join("\n")).as_bytes())
            .map_err(|e| fail(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(root: bool, tc: bool, cgroup: bool) -> HostFacts {
        HostFacts {
            root,
            ip: Some("/sbin/ip".into()),
            tc: tc.then(|| "/sbin/tc".into()),
            cgroup: cgroup.then(|| CgroupCpu::V1("/sys/fs/cgroup/cpu".into())),
        }
    }

    #[test]
    fn mechanism_follows_the_machine() {
        let all = facts(true, true, true);
        assert_eq!(
            resolve(Choice::Auto, &all, true, true).unwrap().0,
            Mechanism::Kernel
        );
        assert_eq!(
            resolve(Choice::Process, &all, true, true).unwrap().0,
            Mechanism::Process
        );
        let (m, why) = resolve(Choice::Auto, &facts(false, true, true), true, true).unwrap();
        assert_eq!(m, Mechanism::Process);
        assert!(why.contains("root"), "{why}");
        let (m, why) = resolve(Choice::Auto, &facts(true, false, true), true, true).unwrap();
        assert_eq!(m, Mechanism::Process);
        assert!(why.contains("tc"), "{why}");
        // tc is not needed when no bandwidth is limited.
        assert_eq!(
            resolve(Choice::Auto, &facts(true, false, true), true, false)
                .unwrap()
                .0,
            Mechanism::Kernel
        );
        let err = resolve(Choice::Kernel, &facts(false, true, false), true, true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("emulation.mechanism") && err.contains("root") && err.contains("cgroup"),
            "{err}"
        );
    }

    #[test]
    fn cgroup_found_in_mountinfo() {
        let v1 = "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n\
                  31 25 0:27 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n\
                  32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let own = "2:cpuacct:/\n1:cpu:/jobs/a\n0::/\n";
        assert_eq!(
            cgroup_cpu_from(v1, own, |_| true),
            Some(CgroupCpu::V1("/sys/fs/cgroup/cpu/jobs/a".into()))
        );
        assert_eq!(
            cgroup_cpu_from(v1, own, |_| false),
            Some(CgroupCpu::V1("/sys/fs/cgroup/cpu".into())),
            "falls back to the hierarchy's root"
        );
        let only_acct = "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpuacct\n";
        assert_eq!(cgroup_cpu_from(only_acct, own, |_| true), None);
        let joint = "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        assert_eq!(
            cgroup_cpu_from(joint, "3:cpu,cpuacct:/\n", |_| true),
            Some(CgroupCpu::V1("/sys/fs/cgroup/cpu,cpuacct".into()))
        );
    }

    #[test]
    fn quotas_and_buckets() {
        assert_eq!(cpu_quota(0.25, Duration::from_millis(10)), (2_500, 10_000));
        assert_eq!(cpu_quota(2.0, Duration::from_millis(10)), (20_000, 10_000));
        // 0.05 of 10 ms would be 0.5 ms, below the kernel's least quota.
        assert_eq!(cpu_quota(0.05, Duration::from_millis(10)), (1_000, 20_000));
        assert_eq!(tbf_params(1e8), ("100000000bit".into(), "65536b".into()));
        assert_eq!(tbf_params(8e9).1, "4000000b");
    }

    #[test]
    fn shapes_cycle_and_read_well() {
        let a = Shape {
            cpu: Some(0.3),
            bits_per_sec: Some(4e8),
        };
        let b = Shape {
            cpu: None,
            bits_per_sec: None,
        };
        assert_eq!(
            shapes_text(&[a, a, b]),
            "2×(0.3 cpu, 400 Mbit/s), 1×(unlimited cpu, unlimited bandwidth)"
        );
        let spec = EmulationSpec {
            shapes: vec![a, b],
            choice: Choice::Process,
            subnet: [10, 78, 0],
            cpu_period: Duration::from_millis(10),
            env: ProcessEnv {
                cpu: "CPU".into(),
                bytes_per_sec: "BW".into(),
            },
        };
        let mut e = Emulation::prepare_on(spec, &facts(false, false, false)).unwrap();
        assert_eq!(e.mechanism(), Mechanism::Process);
        assert_eq!(e.am_ip(), None);
        assert_eq!(e.shape(1), a);
        assert_eq!(e.shape(2), b);
        assert_eq!(e.shape(3), a);
        let p = e.place("c1", 1).unwrap();
        assert_eq!(
            p.env,
            vec![
                ("CPU".to_string(), "0.3".to_string()),
                ("BW".to_string(), "50000000".to_string())
            ]
        );
        assert!(p.netns.is_none() && p.cgroup_procs.is_none());
        assert!(e.place("c2", 2).unwrap().env.is_empty());
        assert!(
            e.describe()
                .starts_with("process (emulation.mechanism = \"process\")")
        );
    }
}
