//! The closed form for alike containers (Cruise Eq. (5) extended with push
//! traffic, server processing and whole blocks): every split `(W, S)` priced in O(N).

use serde::{Deserialize, Serialize};

use crate::cost::CostModel;
use crate::error::OptimizerError;
use crate::snapshot::Job;

use super::better;

/// Costs shared by all containers of a homogeneous cluster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Uniform {
    /// Compute seconds per record.
    pub compute_secs_per_record: f64,
    /// Bandwidth of every container and link, bytes/s.
    pub bandwidth_bytes_per_sec: f64,
    /// Server processing seconds per byte.
    pub server_secs_per_byte: f64,
    /// A worker's seconds per mini-batch per server it talks to.
    #[serde(default)]
    pub request_secs_per_server: f64,
    /// A server's seconds per mini-batch of each worker beyond its work per
    /// byte ([`crate::snapshot::ContainerMetrics::server_secs_per_mini_batch`]).
    #[serde(default)]
    pub server_secs_per_mini_batch: f64,
}

/// One split of a homogeneous cluster and its predicted epoch time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// Workers `W`.
    pub workers: usize,
    /// Servers `S`: `N − W`, or fewer when workers spend time per server (the rest
    /// idle).
    pub servers: usize,
    /// Predicted epoch time (slowest worker), seconds.
    pub epoch_secs: f64,
    /// Its computation part.
    pub comp_secs: f64,
    /// Its communication part.
    pub comm_secs: f64,
}

/// Result of the homogeneous solver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HomogeneousSolution {
    /// The fastest split (the fewest workers among equals).
    pub best: Split,
    /// Every split `W = 1 … N−1`, in order.
    pub splits: Vec<Split>,
}

/// Prices every split of `containers` identical containers into `W` workers and the
/// rest (Eq. 5 with push traffic, server time and whole blocks) and returns the best.
/// O(N) when workers spend nothing per server (then every other container serves);
/// otherwise each `W` also takes its best number of servers `S ≤ N − W` (the rest
/// idle), from the `O(√L)` counts at which the busiest server's share `⌈L / S⌉` drops:
/// more servers cost the workers more requests, so for each share the fewest win.
///
/// With `W` workers only `min(W, K)` can hold input blocks, and the slowest holds
/// `⌈K / w⌉`; the busiest of `min(S, L)` servers holds `⌈L / s⌉` model blocks.
pub fn solve_homogeneous(
    job: &Job,
    containers: usize,
    u: &Uniform,
) -> Result<HomogeneousSolution, OptimizerError> {
    if containers < 2 {
        return Err(OptimizerError::Infeasible(format!(
            "{containers} container(s): need at least one worker and one server"
        )));
    }
    if job.input_blocks == 0 || job.model_blocks == 0 || job.mini_batch_size == 0 {
        return Err(OptimizerError::invalid(
            "job",
            "input_blocks, model_blocks and mini_batch_size must be > 0",
        ));
    }
    let (k_total, l_total) = (job.input_blocks as usize, job.model_blocks as usize);
    let per_byte = 1.0 / u.bandwidth_bytes_per_sec;
    let m_bytes = job.bytes_per_mini_batch;
    let link_bytes = job.link_bytes();
    let mut splits = Vec::with_capacity(containers - 1);
    for workers in 1..containers {
        let w = workers.min(k_total);
        let k = k_total.div_ceil(w) as u32;
        let records = job.total_records as f64 * f64::from(k) / k_total as f64;
        let nb = crate::cost::batches(job, k) as f64;
        let price = |servers: usize| {
            let s = servers.min(l_total);
            let l = l_total.div_ceil(s) as f64;
            let share = l / l_total as f64;
            let server_bound = w as f64
                * (share * link_bytes * per_byte)
                    .max(share * m_bytes * u.server_secs_per_byte + u.server_secs_per_mini_batch);
            let worker_bound = link_bytes * per_byte;
            let comp =
                u.compute_secs_per_record * records + nb * s as f64 * u.request_secs_per_server;
            let comm = nb * (server_bound.max(worker_bound) + job.latency_secs_per_mini_batch);
            Split {
                workers,
                servers,
                epoch_secs: crate::cost::epoch_of(job, comp, comm),
                comp_secs: comp,
                comm_secs: comm,
            }
        };
        let all = containers - workers;
        let mut best = price(all);
        if u.request_secs_per_server > 0.0 {
            // The fewest servers for each share ⌈L / S⌉: S = ⌈L / v⌉.
            let top = all.min(l_total);
            let mut servers = 1;
            while servers <= top {
                let cand = price(servers);
                if better(cand.epoch_secs, best.epoch_secs)
                    || (!better(best.epoch_secs, cand.epoch_secs) && cand.servers < best.servers)
                {
                    best = cand;
                }
                let v = l_total.div_ceil(servers);
                if v <= 1 {
                    break;
                }
                servers = l_total.div_ceil(v - 1);
            }
        }
        splits.push(best);
    }
    let mut best = splits[0];
    for s in &splits[1..] {
        if better(s.epoch_secs, best.epoch_secs) {
            best = *s;
        }
    }
    Ok(HomogeneousSolution { best, splits })
}

impl CostModel {
    /// The shared costs if all containers are alike within relative `tolerance` and no
    /// pairwise links are measured (their means), else `None`.
    pub fn uniform(&self, tolerance: f64) -> Option<Uniform> {
        if self.has_links() || self.is_empty() {
            return None;
        }
        let n = self.len();
        let mean = |f: &dyn Fn(usize) -> f64| (0..n).map(f).sum::<f64>() / n as f64;
        let c = mean(&|i| self.compute_secs_per_record(i));
        let b = mean(&|i| self.bandwidth(i));
        let p = mean(&|i| self.server_secs_per_byte(i));
        let q = mean(&|i| self.request_secs_per_server(i));
        let r = mean(&|i| self.server_secs_per_mini_batch(i));
        let close = |v: f64, m: f64| (v - m).abs() <= tolerance * m.abs().max(f64::MIN_POSITIVE);
        let alike = (0..n).all(|i| {
            close(self.compute_secs_per_record(i), c)
                && close(self.bandwidth(i), b)
                && (close(self.server_secs_per_byte(i), p) || p == 0.0)
                && (close(self.request_secs_per_server(i), q) || q == 0.0)
                && (close(self.server_secs_per_mini_batch(i), r) || r == 0.0)
        });
        alike.then_some(Uniform {
            compute_secs_per_record: c,
            bandwidth_bytes_per_sec: b,
            server_secs_per_byte: p,
            request_secs_per_server: q,
            server_secs_per_mini_batch: r,
        })
    }
}
