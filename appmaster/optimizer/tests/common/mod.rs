//! Shared helpers for the integration tests: random heterogeneous instances and an
//! independent implementation of the cost model used as an oracle.
#![allow(dead_code, clippy::needless_range_loop)]

use cruise_optimizer::{ContainerMetrics, Job, Link, Role, Snapshot};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Proptest settings: `cases` cases unless `PROPTEST_CASES` asks for another number
/// (an explicit `cases` would otherwise override the variable), and failures persisted
/// next to the test file as `tests/<name>.proptest-regressions` (the default looks
/// for a `lib.rs` above the test file, which integration tests do not have, and warns).
pub fn proptest_config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// A problem instance in plain numbers.
#[derive(Debug, Clone)]
pub struct Inst {
    pub d: u64,
    pub b: u64,
    pub m: f64,
    /// Bytes per mini-batch on the busier direction of a link.
    pub ml: f64,
    pub k: u32,
    pub l: u32,
    pub c: Vec<f64>,
    pub bw: Vec<f64>,
    pub p: Vec<f64>,
    /// A worker's seconds per mini-batch per server holding blocks (empty: 0).
    pub q: Vec<f64>,
    /// A server's seconds per mini-batch of each worker beyond its work per
    /// byte (empty: 0).
    pub fixed: Vec<f64>,
    /// Measured links `(i, j, bytes/s)`.
    pub links: Vec<(usize, usize, f64)>,
    /// Serial fraction `f` (1: computation and communication add up).
    pub f: f64,
    /// Latency per mini-batch, seconds.
    pub lat: f64,
}

impl Inst {
    pub fn n(&self) -> usize {
        self.c.len()
    }

    /// Worker `i`'s seconds per mini-batch per server.
    pub fn q(&self, i: usize) -> f64 {
        self.q.get(i).copied().unwrap_or(0.0)
    }

    /// Server `j`'s seconds per mini-batch of each worker beyond its work per byte.
    pub fn fixed(&self, j: usize) -> f64 {
        self.fixed.get(j).copied().unwrap_or(0.0)
    }

    /// The measured bandwidth between `i` and `j` (the slowest measurement), if any.
    pub fn measured(&self, i: usize, j: usize) -> Option<f64> {
        self.links
            .iter()
            .filter(|&&(a, b, _)| (a, b) == (i, j) || (a, b) == (j, i))
            .map(|l| l.2)
            .reduce(f64::min)
    }

    /// Bandwidth of server `j`'s side of its traffic with worker `i`: the server's
    /// own, or the measured link when slower.
    pub fn link_s(&self, i: usize, j: usize) -> f64 {
        self.measured(i, j)
            .map_or(self.bw[j], |m| m.min(self.bw[j]))
    }

    /// Bandwidth of worker `i`'s side of its traffic with server `j`: the worker's
    /// own, or the measured link when slower.
    pub fn link_w(&self, i: usize, j: usize) -> f64 {
        self.measured(i, j)
            .map_or(self.bw[i], |m| m.min(self.bw[i]))
    }

    pub fn snapshot(&self) -> Snapshot {
        let containers = (0..self.n())
            .map(|i| ContainerMetrics {
                id: format!("c{i}"),
                role: Role::Idle,
                compute_secs_per_record: Some(self.c[i]),
                cpu_speed: None,
                bandwidth_bytes_per_sec: self.bw[i],
                server_secs_per_byte: Some(self.p[i]),
                request_secs_per_server: Some(self.q(i)),
                server_secs_per_mini_batch: Some(self.fixed(i)),
                input_blocks: 0,
                model_blocks: 0,
                mini_batches: 0,
                reclaimed: false,
            })
            .collect();
        Snapshot {
            policy: None,
            job: Job {
                total_records: self.d,
                mini_batch_size: self.b,
                bytes_per_mini_batch: self.m,
                link_bytes_per_mini_batch: Some(self.ml),
                input_blocks: self.k,
                model_blocks: self.l,
                remaining_epochs: 10.0,
                input_bytes: 0,
                model_bytes: 0,
                serial_fraction: self.f,
                latency_secs_per_mini_batch: self.lat,
                measured_epoch_secs: None,
                asynchronous: false,
                queued_fit: None,
            },
            containers,
            links: self
                .links
                .iter()
                .map(|&(a, b, v)| Link {
                    from: format!("c{a}"),
                    to: format!("c{b}"),
                    bytes_per_sec: v,
                })
                .collect(),
        }
    }

    /// Epoch time for input blocks `kk` and model blocks `ll` per container, written
    /// from the paper's formula independently of the crate.
    pub fn epoch(&self, kk: &[u32], ll: &[u32]) -> f64 {
        let w = kk.iter().filter(|&&k| k > 0).count() as f64;
        let s = ll.iter().filter(|&&l| l > 0).count() as f64;
        let mut worst = 0.0f64;
        for i in 0..self.n() {
            if kk[i] == 0 {
                continue;
            }
            let mut sb = 0.0f64;
            let mut wb = 0.0;
            for j in 0..self.n() {
                if ll[j] == 0 {
                    continue;
                }
                let share = ll[j] as f64 / self.l as f64;
                let link = share * self.ml / self.link_s(i, j);
                let cpu = share * self.m * self.p[j] + self.fixed(j);
                sb = sb.max(w * link.max(cpu));
                wb += share * self.ml / self.link_w(i, j);
            }
            let recs = self.d as f64 * kk[i] as f64 / self.k as f64;
            let batches = (self.d * kk[i] as u64).div_ceil(self.k as u64 * self.b) as f64;
            let comp = self.c[i] * recs + batches * s * self.q(i);
            let comm = batches * (sb.max(wb) + self.lat);
            worst = worst.max(comp.max(comm) + self.f * comp.min(comm));
        }
        worst
    }
}

/// All ways to write `total` as `parts` ordered parts, each at least `min`.
pub fn compositions(total: u32, parts: usize, min: u32, out: &mut Vec<Vec<u32>>) {
    fn rec(left: u32, parts: usize, min: u32, cur: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
        if parts == 1 {
            if left >= min {
                cur.push(left);
                out.push(cur.clone());
                cur.pop();
            }
            return;
        }
        let mut x = min;
        while x + min * (parts as u32 - 1) <= left {
            cur.push(x);
            rec(left - x, parts - 1, min, cur, out);
            cur.pop();
            x += 1;
        }
    }
    if parts == 0 {
        return;
    }
    rec(total, parts, min, &mut Vec::new(), out);
}

/// Exact optimum by exhaustion: every role in {worker, server, idle} for every
/// container, every model split and every data split (whole blocks).
pub fn brute_force(inst: &Inst) -> f64 {
    let n = inst.n();
    let mut best = f64::INFINITY;
    let mut roles = vec![0u8; n];
    loop {
        let workers: Vec<usize> = (0..n).filter(|&i| roles[i] == 0).collect();
        let servers: Vec<usize> = (0..n).filter(|&i| roles[i] == 1).collect();
        if !workers.is_empty() && !servers.is_empty() && workers.len() <= inst.k as usize {
            let mut ds = Vec::new();
            compositions(inst.k, workers.len(), 1, &mut ds);
            let mut ms = Vec::new();
            compositions(inst.l, servers.len(), 0, &mut ms);
            let mut kk = vec![0u32; n];
            let mut ll = vec![0u32; n];
            for m in &ms {
                for (x, &j) in servers.iter().enumerate() {
                    ll[j] = m[x];
                }
                for d in &ds {
                    for (x, &i) in workers.iter().enumerate() {
                        kk[i] = d[x];
                    }
                    best = best.min(inst.epoch(&kk, &ll));
                }
            }
        }
        // next role vector in base 3
        let mut x = 0;
        loop {
            if x == n {
                return best;
            }
            roles[x] += 1;
            if roles[x] < 3 {
                break;
            }
            roles[x] = 0;
            x += 1;
        }
    }
}

/// Random heterogeneous instances with `n` in `ns`, up to `kmax` input and `lmax` model
/// blocks, sometimes measured links, a serial fraction that is 1 (Cruise's
/// serial worker), 0 (full overlap) or in between, with or without latency, and
/// half of them with a cost per server on the workers (up to about a mini-batch's
/// computation), and half with a cost per worker's mini-batch on the servers (up to
/// about the time a slow link takes for the whole model).
pub fn instances(
    ns: std::ops::RangeInclusive<usize>,
    kmax: u32,
    lmax: u32,
) -> impl Strategy<Value = Inst> {
    let overlap = prop_oneof![
        Just((1.0, 0.0)),
        Just((0.0, 0.0)),
        (0.0f64..=1.0, prop_oneof![Just(0.0), 1e-4f64..1e-2]),
    ];
    (
        ns,
        1..=kmax,
        1..=lmax,
        10u64..200,
        5u64..60,
        any::<bool>(),
        0.5f64..=1.0,
        overlap,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(
            move |(
                n,
                k,
                l,
                recs_per_block,
                b,
                with_links,
                link_share,
                (f, lat),
                requests,
                fixed,
            )| {
                let q_max = if requests { 0.1 } else { 0.0 };
                let r_max = if fixed { 0.5 } else { 0.0 };
                let per = (
                    1e-3f64..1e-2,
                    1e6f64..1e7,
                    0.0f64..1e-7,
                    0.0f64..=q_max,
                    0.0f64..=r_max,
                );
                (
                    Just((n, k, l, recs_per_block, b, link_share, f, lat)),
                    proptest::collection::vec(per, n),
                    if with_links {
                        proptest::collection::vec((0..n, 0..n, 5e5f64..2e7), 0..n).boxed()
                    } else {
                        Just(Vec::new()).boxed()
                    },
                )
                    .prop_map(
                        |((_n, k, l, rpb, b, link_share, f, lat), per, links)| Inst {
                            d: rpb * k as u64,
                            b,
                            m: 1.0e6,
                            ml: 1.0e6 * link_share,
                            k,
                            l,
                            c: per.iter().map(|x| x.0).collect(),
                            bw: per.iter().map(|x| x.1).collect(),
                            p: per.iter().map(|x| x.2).collect(),
                            q: per.iter().map(|x| x.3).collect(),
                            fixed: per.iter().map(|x| x.4).collect(),
                            links: links.into_iter().filter(|(a, b, _)| a != b).collect(),
                            f,
                            lat,
                        },
                    )
                    .prop_filter("need two containers", move |i| i.n() == n && n >= 2)
            },
        )
}

/// Like [`brute_force`], also returning the best `(kk, ll)`.
pub fn brute_force_arg(inst: &Inst) -> (f64, Vec<u32>, Vec<u32>) {
    let n = inst.n();
    let mut best = (f64::INFINITY, vec![], vec![]);
    let mut roles = vec![0u8; n];
    loop {
        let workers: Vec<usize> = (0..n).filter(|&i| roles[i] == 0).collect();
        let servers: Vec<usize> = (0..n).filter(|&i| roles[i] == 1).collect();
        if !workers.is_empty() && !servers.is_empty() && workers.len() <= inst.k as usize {
            let mut ds = Vec::new();
            compositions(inst.k, workers.len(), 1, &mut ds);
            let mut ms = Vec::new();
            compositions(inst.l, servers.len(), 0, &mut ms);
            let mut kk = vec![0u32; n];
            let mut ll = vec![0u32; n];
            for m in &ms {
                for (x, &j) in servers.iter().enumerate() {
                    ll[j] = m[x];
                }
                for d in &ds {
                    for (x, &i) in workers.iter().enumerate() {
                        kk[i] = d[x];
                    }
                    let t = inst.epoch(&kk, &ll);
                    if t < best.0 {
                        best = (t, kk.clone(), ll.clone());
                    }
                }
            }
        }
        let mut x = 0;
        loop {
            if x == n {
                return best;
            }
            roles[x] += 1;
            if roles[x] < 3 {
                break;
            }
            roles[x] = 0;
            x += 1;
        }
    }
}
