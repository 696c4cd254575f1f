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

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use crate::RmError;

mod kernel;
use kernel::{Kernel, find_cgroup_cpu, find_program};
pub use kernel::{cgroup_cpu_from, cpu_quota, tbf_params};

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
