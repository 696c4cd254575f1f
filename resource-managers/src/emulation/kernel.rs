//! The kernel mechanism of an emulated cluster: a bridge for the AM and,
//! per container, a network namespace joined to it by a veth pair with a
//! `tc` token-bucket filter on both ends, and a cgroup with a CPU quota.
//! [`Kernel`] owns what it creates and removes it when a container ends, at
//! shutdown and on drop; leftovers of a killed AM are swept by the next job.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{CgroupCpu, EmulationSpec, HostFacts, Placement, Shape};
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

pub(super) struct Live {
    netns: String,
    host_veth: String,
    octet: u8,
    cgroup: Option<PathBuf>,
}

pub(super) struct Kernel {
    ip: PathBuf,
    tc: Option<PathBuf>,
    pub(super) cgroup: Option<CgroupCpu>,
    tag: String,
    subnet: [u8; 3],
    pub(super) bridge: String,
    bridge_made: bool,
    free: BTreeSet<u8>,
    last_octet: u8,
    live: BTreeMap<String, Live>,
}

impl Kernel {
    pub(super) fn create(spec: &EmulationSpec, facts: &HostFacts) -> Result<Kernel, RmError> {
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

    pub(super) fn bridge_ip(&self) -> Ipv4Addr {
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

    pub(super) fn place(
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

    pub(super) fn release(&mut self, id: &str) {
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

    pub(super) fn shutdown(&mut self) {
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

pub(super) fn make_cgroup(
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
pub(super) fn remove_cgroup(dir: &Path) {
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

pub(super) fn enable_v2_cpu(root: &Path) -> Result<(), RmError> {
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
pub(super) fn find_program(name: &str) -> Option<PathBuf> {
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
pub(super) fn find_cgroup_cpu() -> Option<CgroupCpu> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroup_cpu_from(&mountinfo, &own, |p| p.is_dir())
}

/// `find_cgroup_cpu` on given file contents (`exists` checks a directory).
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

pub(super) fn command_text(program: &Path, args: &[impl AsRef<str>]) -> String {
    let mut s = program.display().to_string();
    for a in args {
        s.push(' ');
        s.push_str(a.as_ref());
    }
    s
}

pub(super) fn output(program: &Path, args: &[&str], what: &str) -> Result<String, RmError> {
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

pub(super) fn run(program: &Path, args: &[&str], what: &str) -> Result<(), RmError> {
    output(program, args, what).map(|_| ())
}

pub(super) fn run_owned(program: &Path, args: &[String], what: &str) -> Result<(), RmError> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(program, &args, what)
}

/// Runs `program [global...] -batch -` with `lines` on its stdin.
pub(super) fn batch(
    program: &Path,
    global: &[&str],
    lines: &[String],
    what: &str,
) -> Result<(), RmError> {
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
