//! The cost model: Cruise Eq. (1)–(4) with push traffic and server processing time.
//!
//! For a worker `i` holding `d_i` records, with `w` active workers and servers `j`
//! holding model share `m_j` (fraction of the model blocks), per mini-batch:
//!
//! ```text
//! server_bound_ij = w · max(m_j·M'/b_j, m_j·M·p_j + r_j)   (server j's link or CPU, shared by all workers)
//! worker_bound_i  = Σ_j m_j · M' / b_i  = M' / b_i   (worker i's own link, to all servers at once)
//! comm_i          = max( max_j server_bound_ij, worker_bound_i ) + λ
//! comp_i          = c_i · d_i + ⌈d_i / B⌉ · s · q_i,   comm_i^epoch = ⌈d_i / B⌉ · comm_i
//! C_i             = max(comp_i, comm_i^epoch) + f · min(comp_i, comm_i^epoch)
//! C               = max_i C_i
//! ```
//!
//! With `f = 1` and `λ = 0` this is Cruise's Eq. (4): `C_i = c_i·d_i + ⌈d_i/B⌉·comm_i`,
//! a worker that pulls, computes and pushes one step after the other.
//!
//! A server's link and its CPU (`p_j`: all the CPU serving takes per byte,
//! framing and system calls included, at its CPU share) bound its workers
//! separately, not added up: with several workers' requests in flight it
//! processes one while its link carries another. On a generated cluster
//! (MLR 1,000 features; a 0.05-CPU, 50 Mbit/s server holding 9 of 64
//! blocks for one 0.4-CPU worker) the sum predicted 1.48 ms a mini-batch
//! where 1.07 ms were measured, the link alone 0.95 ms; and for seven
//! workers on one 0.4-CPU, 1 Gbit/s server, 0.171 s an epoch for 0.068 s
//! measured, the larger term alone 0.09 s. Our workers
//! overlap them (`job.pipeline`), so the AM measures how much of the shorter part
//! still adds up (`f`, [`Job::serial_fraction`]) and the round-trip latency the
//! bandwidth does not explain (`λ`, [`Job::latency_secs_per_mini_batch`]).
//!
//! `s` is the number of servers holding model blocks and `q_i` the seconds worker
//! `i` spends per mini-batch on each of them: framing, sending and receiving its
//! requests, on its own CPU ([`crate::snapshot::ContainerMetrics::request_secs_per_server`]).
//! It is the one part of a worker's own time that depends on the split: on a
//! 0.3-CPU worker of a 40 KB model it was about a third of the own time with six
//! servers (measured: the evaluator's runtime thread used 40 µs of CPU per
//! mini-batch with one server and 170 µs with six), and pricing it per record made
//! the same worker look 1.5× slower beside six servers than beside two.
//!
//! `M` is the bytes a worker exchanges per mini-batch (pull + push), which servers
//! process; `M'` the part on the busier direction of a link (the larger of pull and
//! push: links carry both directions at once, and their bandwidth is measured in one;
//! `M` when unknown); `c_i` the compute seconds per record, `p_j` the server's
//! processing seconds per byte and `b_i`, `b_j` each container's own link bandwidth.
//! Where the link between `i` and `j` was measured and is slower, its bandwidth `b_ij`
//! replaces `b_i` and `b_j` for that pair (a link never carries more than either
//! end's own). (With equal containers the link terms are Cruise's. Pricing every pair
//! at `min(b_i, b_j)` would charge a server's link at a slow worker's speed times
//! every worker, and a fast worker's transfers to slow servers as if made one after
//! another.) Records come in whole input blocks of
//! `D / K` records, model shares in whole blocks of `1 / L`. A worker with no block is
//! inactive (it neither computes nor talks), a server with no block is not asked.
//! The [`CostModel`] owns the resolved per-container numbers after the fallbacks for
//! unmeasured containers have been applied.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::OptimizerError;
use crate::snapshot::{Job, Role, Snapshot, WaitFit};

/// The role and block counts of one container in a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Role.
    pub role: Role,
    /// Input blocks held (workers only).
    pub input_blocks: u32,
    /// Model blocks held (servers only).
    pub model_blocks: u32,
}

impl Placement {
    /// An idle container holding nothing.
    pub const IDLE: Placement = Placement {
        role: Role::Idle,
        input_blocks: 0,
        model_blocks: 0,
    };
}

/// A configuration by counts: container id → placement. Missing containers are idle.
pub type Target = BTreeMap<String, Placement>;

/// What bounds a worker's communication time per mini-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommBound {
    /// The named server (its link or its CPU, shared by all workers) is the bottleneck.
    Server {
        /// Server container id.
        container: String,
    },
    /// The worker's own link is the bottleneck.
    Worker,
}

/// Cost of one active worker for one epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerCost {
    /// Worker container id.
    pub container: String,
    /// Records it processes per epoch.
    pub records: f64,
    /// Mini-batches per epoch, `⌈records / B⌉`.
    pub mini_batches: u64,
    /// Computation seconds per epoch.
    pub comp_secs: f64,
    /// Communication seconds per epoch.
    pub comm_secs: f64,
    /// `max(comp, comm) + serial_fraction · min(comp, comm)`: their sum
    /// for a serial worker (Cruise's Eq. 4).
    pub total_secs: f64,
    /// What bounds its communication.
    pub comm_bound: CommBound,
    /// Communication seconds per epoch with its answers queued behind the
    /// other workers' requests as they come (asynchronous workers, see
    /// [`CostModel::throughput_epoch`]), its latency
    /// ([`Job::queued_fit`]) included.
    #[serde(default)]
    pub queued_comm_secs: f64,
}

/// Whether the slowest worker is bound by compute or by communication.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    /// The slowest worker spends more time computing than communicating.
    Compute {
        /// The slowest worker.
        worker: String,
    },
    /// The slowest worker spends more time communicating.
    Communication {
        /// The slowest worker.
        worker: String,
        /// What bounds its communication.
        bound: CommBound,
    },
}

/// Predicted epoch time of a configuration, with its parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// Epoch time `C = max_i C_i` in seconds: every worker charged as many
    /// requests on a server as the one it is priced for makes, always
    /// queued there. For asynchronous workers an upper bound of
    /// [`Breakdown::throughput_epoch_secs`].
    pub epoch_secs: f64,
    /// Active workers (holding at least one input block), in container order.
    pub workers: Vec<WorkerCost>,
    /// Number of servers holding at least one model block.
    pub active_servers: usize,
    /// What limits the epoch time.
    pub bottleneck: Bottleneck,
    /// The epoch of the same configuration with workers that are not held
    /// together by clocks ([`Job::asynchronous`]): each goes at its own
    /// pace through its own input, and the epoch ends when together they
    /// have processed the data set (see [`CostModel::throughput_epoch`]).
    /// [`Breakdown::epoch_secs`] or less.
    pub throughput_epoch_secs: f64,
}

/// Resolved per-container costs for the usable containers of a snapshot.
#[derive(Debug, Clone)]
pub struct CostModel {
    job: Job,
    ids: Vec<String>,
    current: Vec<Placement>,
    compute: Vec<f64>,
    bandwidth: Vec<f64>,
    /// `1 / bandwidth`: each end's own seconds per byte, so that pricing a pair's
    /// sides needs no division.
    inv_bandwidth: Vec<f64>,
    server_proc: Vec<f64>,
    /// `r_j`: server seconds per mini-batch of each worker beyond its work per byte.
    server_fixed: Vec<f64>,
    /// `q_i`: worker seconds per mini-batch per server it talks to.
    per_server: Vec<f64>,
    /// Row-major `n × n` seconds per byte `1 / b_ij` of measured links (0 where not
    /// measured), only when some link was measured.
    inv_links: Option<Vec<f64>>,
    /// Bytes of one model block processed per mini-batch, `M / L`, and carried
    /// over links, `M' / L` (fixed with the job; precomputed for the solvers'
    /// inner loops).
    per_block: f64,
    per_block_link: f64,
}

impl CostModel {
    /// Builds the model over the snapshot's containers that are not reclaimed (the ones a
    /// future configuration may use). Fallbacks for unmeasured containers: see
    /// [`crate::snapshot::ContainerMetrics`].
    pub fn new(snapshot: &Snapshot) -> Result<CostModel, OptimizerError> {
        Self::build(snapshot, false)
    }

    /// Builds the model over all containers, reclaimed ones included (to price the
    /// configuration that runs now).
    pub fn including_reclaimed(snapshot: &Snapshot) -> Result<CostModel, OptimizerError> {
        Self::build(snapshot, true)
    }

    fn build(snapshot: &Snapshot, with_reclaimed: bool) -> Result<CostModel, OptimizerError> {
        snapshot.validate()?;
        let speed = |c: &crate::snapshot::ContainerMetrics| c.cpu_speed.unwrap_or(1.0);
        let reference = |f: &dyn Fn(&crate::snapshot::ContainerMetrics) -> Option<f64>| {
            let measured: Vec<f64> = snapshot
                .containers
                .iter()
                .filter_map(|c| f(c).map(|v| v * speed(c)))
                .collect();
            if measured.is_empty() {
                None
            } else {
                Some(measured.iter().sum::<f64>() / measured.len() as f64)
            }
        };
        let compute_ref = reference(&|c| c.compute_secs_per_record);
        let proc_ref = reference(&|c| c.server_secs_per_byte).unwrap_or(0.0);
        let request_ref = reference(&|c| c.request_secs_per_server).unwrap_or(0.0);
        let fixed_ref = reference(&|c| c.server_secs_per_mini_batch).unwrap_or(0.0);
        let kept: Vec<&crate::snapshot::ContainerMetrics> = snapshot
            .containers
            .iter()
            .filter(|c| with_reclaimed || !c.reclaimed)
            .collect();
        let mut compute = Vec::with_capacity(kept.len());
        for c in &kept {
            compute.push(match (c.compute_secs_per_record, compute_ref) {
                (Some(v), _) => v,
                (None, Some(r)) => r / speed(c),
                (None, None) => return Err(OptimizerError::NoComputeMeasurement),
            });
        }
        let server_proc = kept
            .iter()
            .map(|c| c.server_secs_per_byte.unwrap_or(proc_ref / speed(c)))
            .collect();
        let per_server = kept
            .iter()
            .map(|c| c.request_secs_per_server.unwrap_or(request_ref / speed(c)))
            .collect();
        let server_fixed = kept
            .iter()
            .map(|c| c.server_secs_per_mini_batch.unwrap_or(fixed_ref / speed(c)))
            .collect();
        let bandwidth: Vec<f64> = kept.iter().map(|c| c.bandwidth_bytes_per_sec).collect();
        let ids: Vec<String> = kept.iter().map(|c| c.id.clone()).collect();
        let inv_links = if snapshot.links.is_empty() {
            None
        } else {
            let n = ids.len();
            let index: BTreeMap<&str, usize> = ids
                .iter()
                .enumerate()
                .map(|(i, s)| (s.as_str(), i))
                .collect();
            // 0: not measured (the endpoints' own links apply).
            let mut m = vec![0.0f64; n * n];
            for l in &snapshot.links {
                if let (Some(&i), Some(&j)) = (index.get(l.from.as_str()), index.get(l.to.as_str()))
                {
                    let inv = (1.0 / l.bytes_per_sec).max(m[i * n + j]);
                    m[i * n + j] = inv;
                    m[j * n + i] = inv;
                }
            }
            Some(m)
        };
        let current = kept
            .iter()
            .map(|c| Placement {
                role: c.role,
                input_blocks: c.input_blocks,
                model_blocks: c.model_blocks,
            })
            .collect();
        let inv_bandwidth = bandwidth.iter().map(|b| 1.0 / b).collect();
        let l_total = f64::from(snapshot.job.model_blocks);
        Ok(CostModel {
            per_block: snapshot.job.bytes_per_mini_batch / l_total,
            per_block_link: snapshot.job.link_bytes() / l_total,
            job: snapshot.job.clone(),
            ids,
            current,
            compute,
            bandwidth,
            inv_bandwidth,
            server_proc,
            server_fixed,
            per_server,
            inv_links,
        })
    }

    /// The job parameters.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Container ids, in model order.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The configuration the snapshot reports as running now (by counts).
    pub fn current(&self) -> Target {
        self.ids
            .iter()
            .cloned()
            .zip(self.current.iter().copied())
            .collect()
    }

    pub(crate) fn current_placements(&self) -> &[Placement] {
        &self.current
    }

    /// Resolved compute seconds per record of container `i` (model order).
    pub fn compute_secs_per_record(&self, i: usize) -> f64 {
        self.compute[i]
    }

    /// Resolved seconds per mini-batch that container `i`, as a worker, spends
    /// on each server it talks to (`q_i`).
    pub fn request_secs_per_server(&self, i: usize) -> f64 {
        self.per_server[i]
    }

    /// What worker `i`'s requests to `s` servers cost it per mini-batch, `s · q_i`.
    #[inline]
    pub(crate) fn requests_per_batch(&self, i: usize, s: usize) -> f64 {
        s as f64 * self.per_server[i]
    }

    /// Bandwidth of container `i` in bytes/s.
    pub fn bandwidth(&self, i: usize) -> f64 {
        self.bandwidth[i]
    }

    /// Resolved server processing seconds per byte of container `i`.
    pub fn server_secs_per_byte(&self, i: usize) -> f64 {
        self.server_proc[i]
    }

    /// Resolved seconds container `i`, as a server, spends per mini-batch of
    /// each worker beyond its work per byte (`r_i`).
    pub fn server_secs_per_mini_batch(&self, i: usize) -> f64 {
        self.server_fixed[i]
    }

    /// Whether pairwise link measurements are used.
    pub fn has_links(&self) -> bool {
        self.inv_links.is_some()
    }

    /// Number of containers.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no containers.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The measured seconds per byte between `i` and `j`, if their link was measured.
    #[inline]
    fn measured_inv(&self, i: usize, j: usize) -> Option<f64> {
        self.inv_links
            .as_ref()
            .map(|m| m[i * self.ids.len() + j])
            .filter(|v| *v > 0.0)
    }

    /// What one model block on server `j` costs worker `i` per mini-batch, seconds:
    /// `(server-bound per active worker, worker-bound)` =
    /// `(max(M'/b_srv, M·p_j) / L, M' / (b_wrk·L))`: the server's link and
    /// its CPU work at once (it answers one request while the kernel sends
    /// the last), so the slower of the two bounds it.
    ///
    /// `b_srv` is the server's own link (all its workers share it) and `b_wrk` the
    /// worker's (it talks to all its servers at once, so its link carries the sum),
    /// each replaced by the link measured between the two when that is slower.
    #[inline]
    pub(crate) fn block_costs(&self, i: usize, j: usize) -> (f64, f64) {
        let (own_srv, own_wrk) = (self.inv_bandwidth[j], self.inv_bandwidth[i]);
        let (srv, wrk) = match self.measured_inv(i, j) {
            Some(m) => (m.max(own_srv), m.max(own_wrk)),
            None => (own_srv, own_wrk),
        };
        (
            (self.per_block_link * srv).max(self.per_block * self.server_proc[j]),
            self.per_block_link * wrk,
        )
    }

    /// What server `j` holding `l > 0` model blocks spends per mini-batch of
    /// worker `i`: `max(l·M'/(L·b_srv), l·M·p_j/L + r_j)`, its link or its
    /// CPU (the requests' own cost `r_j` whatever it holds). At least `l`
    /// times [`CostModel::block_costs`]' server part, which the solvers'
    /// bounds use.
    #[inline]
    pub(crate) fn server_load(&self, i: usize, j: usize, l: u32) -> f64 {
        let own_srv = self.inv_bandwidth[j];
        let srv = match self.measured_inv(i, j) {
            Some(m) => m.max(own_srv),
            None => own_srv,
        };
        self.server_work(j, l, srv)
    }

    /// What server `j` holding `l > 0` model blocks spends per mini-batch of
    /// one worker at `inv_link` seconds per byte on its side:
    /// `max(l·M'·inv_link/L, l·M·p_j/L + r_j)`.
    #[inline]
    fn server_work(&self, j: usize, l: u32, inv_link: f64) -> f64 {
        let (link, cpu) = self.server_parts(j, l, inv_link);
        link.max(cpu)
    }

    /// [`CostModel::server_work`]'s two parts, `(link, CPU)`.
    #[inline]
    fn server_parts(&self, j: usize, l: u32, inv_link: f64) -> (f64, f64) {
        let l = f64::from(l);
        (
            l * self.per_block_link * inv_link,
            l * self.per_block * self.server_proc[j] + self.server_fixed[j],
        )
    }

    /// Records in `k` input blocks.
    #[inline]
    pub(crate) fn records(&self, k: u32) -> f64 {
        self.job.total_records as f64 * f64::from(k) / f64::from(self.job.input_blocks)
    }

    /// Mini-batches for `k` input blocks: `⌈D·k / (K·B)⌉`, computed exactly.
    #[inline]
    pub(crate) fn batches(&self, k: u32) -> u64 {
        batches(&self.job, k)
    }

    /// Epoch time of worker `i` with `k` blocks, per-mini-batch communication `g`
    /// (`g` without the latency, which [`CostModel::parts`] adds) and `s` servers
    /// holding model blocks.
    #[inline]
    pub(crate) fn worker_time(&self, i: usize, k: u32, g: f64, s: usize) -> f64 {
        if k == 0 {
            return 0.0;
        }
        let (comp, comm) = self.parts(i, k, g, s);
        self.epoch_of(comp, comm)
    }

    /// Computation and communication seconds per epoch of worker `i` with `k`
    /// blocks, per-mini-batch communication `g` (plus the job's latency) and `s`
    /// servers (whose requests are part of its computation). Both are
    /// non-decreasing in `k`, `g` and `s`.
    #[inline]
    pub(crate) fn parts(&self, i: usize, k: u32, g: f64, s: usize) -> (f64, f64) {
        let nb = self.batches(k) as f64;
        (
            self.compute[i] * self.records(k) + nb * self.requests_per_batch(i, s),
            nb * (g + self.job.latency_secs_per_mini_batch),
        )
    }

    /// A worker's epoch from its computation and communication:
    /// `max + serial_fraction · min` (their sum for Cruise's serial worker).
    /// Non-decreasing in both, as the solvers' bounds require.
    #[inline]
    pub(crate) fn epoch_of(&self, comp: f64, comm: f64) -> f64 {
        epoch_of(&self.job, comp, comm)
    }

    /// The latency and serial fraction the queued throughput prices with
    /// ([`Job::queued_fit`], else the job's own).
    fn queued_fit(&self) -> WaitFit {
        self.job.queued_fit.unwrap_or(WaitFit {
            latency_secs_per_mini_batch: self.job.latency_secs_per_mini_batch,
            serial_fraction: self.job.serial_fraction,
        })
    }

    /// Per-mini-batch communication seconds of worker `i`, with `w` active workers and
    /// the given servers `(index, model blocks)`; returns the bounding server index
    /// (`None` when the worker's own link bounds it).
    pub(crate) fn comm_per_batch(
        &self,
        i: usize,
        w: usize,
        servers: &[(usize, u32)],
    ) -> (f64, Option<usize>) {
        let mut worst = 0.0f64;
        let mut worst_j = None;
        let mut own = 0.0f64;
        for &(j, l) in servers {
            if l == 0 {
                continue;
            }
            let (_, b) = self.block_costs(i, j);
            let sb = w as f64 * self.server_load(i, j, l);
            if sb > worst || worst_j.is_none() {
                worst = sb;
                worst_j = Some(j);
            }
            own += f64::from(l) * b;
        }
        if own > worst {
            (own, None)
        } else {
            (worst, worst_j)
        }
    }

    /// The epoch of asynchronous workers `(index, input blocks)` with
    /// `servers` `(index, model blocks)`: the data set over the records
    /// the workers process together in a second, each going at its own
    /// pace. Server `j` spends `s_ij` per mini-batch of worker `i` on its
    /// `l_j` blocks (its own link or its CPU, as in
    /// `CostModel::server_load`; a slower link measured between the two
    /// holds the worker's transfer, not the server); a worker's
    /// mini-batch takes its computation and the longer of its own link's
    /// time and its slowest server's answer, overlapped as
    /// `CostModel::epoch_of` says.
    ///
    /// A server's answer waits behind the other workers' requests there.
    /// Each worker is one customer of a closed queueing network (its
    /// requests of a mini-batch out at once, the next mini-batch after
    /// them), servers sharing their link and CPU among the requests they
    /// hold (processor sharing): approximate mean value analysis
    /// (Schweitzer) gives worker `i`'s answer from `j` as
    /// `R_ij = s_ij · (1 + Σ_{k≠i} Q_kj)`, `Q_kj = X_k · R_kj` the mean
    /// number of worker `k`'s requests at `j` and `X_k` its mini-batches a
    /// second, solved by fixed-point iteration
    /// (`CostModel::queued_rates`). A worker whose own link (or the one
    /// measured between the two) is slower than the server's answer is not
    /// queued so: its transfer trickles and takes only its share of the
    /// server, the others served in the rest (`queued_answer`). Without the queues (every answer in
    /// `s_ij`, the servers shared max-min fairly up to their capacity) a
    /// fast worker beside four slow ones on 0.3-CPU, 400 Mbit/s servers was
    /// priced at 61 mini-batches a second where it ran 37 (the queues give
    /// 48), and the job at 0.73 s an epoch where it ran 0.85 s. With every
    /// worker's requests always queued at every server (what the slowest
    /// worker's model charges) two slow-link workers beside a fast one were
    /// priced at 1.02 s where they ran 0.59 s (the queues give 0.70 s).
    ///
    /// No server serves more than one second a second, `Σ_i r_i · s_ij ≤
    /// 1`, which the approximation does not ensure: the epoch is at least
    /// the one of the servers' capacity shared max-min fairly (every worker
    /// at the same rate `λ` unless its own cap is lower, `λ` the largest no
    /// server exceeds).
    pub fn throughput_epoch(&self, workers: &[(usize, u32)], servers: &[(usize, u32)]) -> f64 {
        self.queued(workers, servers).epoch_secs
    }

    /// [`CostModel::throughput_epoch`] with each worker's communication
    /// per mini-batch under the queues.
    fn queued(&self, workers: &[(usize, u32)], servers: &[(usize, u32)]) -> Queued {
        let s = holding(servers);
        let fit = self.queued_fit();
        let mut rows: Vec<QueuedWorker> = Vec::with_capacity(workers.len());
        // Which of `workers` each row is.
        let mut given = Vec::with_capacity(workers.len());
        for (x, &(i, k)) in workers.iter().enumerate() {
            let nb = self.batches(k) as f64;
            if nb == 0.0 {
                continue;
            }
            given.push(x);
            let mut own = 0.0;
            let mut load = Vec::with_capacity(servers.len());
            let mut pair = Vec::with_capacity(servers.len());
            let mut link_bound = Vec::with_capacity(servers.len());
            for &(j, l) in servers {
                let (_, b) = self.block_costs(i, j);
                own += f64::from(l) * b;
                let (link, cpu) = self.server_parts(j, l, self.inv_bandwidth[j]);
                let between = self
                    .measured_inv(i, j)
                    .map_or(0.0, |m| f64::from(l) * self.per_block_link * m);
                load.push(if l > 0 { link.max(cpu) } else { 0.0 });
                pair.push(if l > 0 { between } else { 0.0 });
                link_bound.push(l > 0 && link >= cpu);
            }
            // Per mini-batch: computation (with the requests' own cost),
            // from the epoch's parts with no transfer.
            let (comp, _) = self.parts(i, k, 0.0, s);
            rows.push(QueuedWorker {
                comp: comp / nb,
                latency: fit.latency_secs_per_mini_batch,
                own,
                load,
                pair,
                link_bound,
                records: self.records(k) / nb,
            });
        }
        let (rates, answers) = self.queued_rates(&rows, servers.len());
        let records_per_sec = rates
            .iter()
            .zip(&rows)
            .map(|(x, w)| x * w.records)
            .sum::<f64>()
            .min(self.max_min_records_per_sec(&rows, servers.len()));
        let epoch_secs = if records_per_sec > 0.0 && records_per_sec.is_finite() {
            self.job.total_records as f64 / records_per_sec
        } else {
            f64::INFINITY
        };
        let mut comm_per_batch = vec![0.0; workers.len()];
        for ((&x, answer), w) in given.iter().zip(&answers).zip(&rows) {
            comm_per_batch[x] = w.own.max(*answer) + w.latency;
        }
        Queued {
            epoch_secs,
            comm_per_batch,
        }
    }

    /// Each worker's mini-batches a second with the servers' queues
    /// (see [`CostModel::throughput_epoch`]): the damped fixed point of
    /// `X_i = 1 / t_i(R_i·)` with each answer `R_ij` as the queues at `j`
    /// give it ([`queued_answer`]); and each worker's slowest answer there,
    /// `max_j max(R_ij, d_ij)` with `d_ij` its transfer over the link
    /// measured between the two.
    fn queued_rates(&self, rows: &[QueuedWorker], servers: usize) -> (Vec<f64>, Vec<f64>) {
        /// Iterations at most, and the relative change that ends them.
        const ROUNDS: usize = 500;
        const SETTLED: f64 = 1e-9;
        /// The share of a round's new rates taken (the map is decreasing:
        /// undamped, it oscillates).
        const DAMPING: f64 = 0.5;
        let f = self.queued_fit().serial_fraction;
        let per_batch =
            |w: &QueuedWorker, answer: f64| overlap(f, w.comp, w.own.max(answer) + w.latency);
        let slowest = |w: &QueuedWorker, r: &[f64]| {
            r.iter()
                .zip(&w.pair)
                .map(|(r, d)| r.max(*d))
                .fold(0.0, f64::max)
        };
        let mut x: Vec<f64> = rows
            .iter()
            .map(|w| 1.0 / per_batch(w, slowest(w, &w.load)))
            .collect();
        let mut r: Vec<Vec<f64>> = rows.iter().map(|w| w.load.clone()).collect();
        // Whether a worker's transfer to a server lasts longer than the
        // server takes to answer it: its own link (or the one between the
        // two) holds it, not the server's queue. Only where the server's
        // link sets its time: its CPU serves each request whole once it has
        // come (a push) or before it goes (a pull), however slowly it moves.
        let capped =
            |w: &QueuedWorker, j: usize, r: f64| w.link_bound[j] && w.own.max(w.pair[j]) >= r;
        let mut held: Vec<Vec<bool>> = rows
            .iter()
            .map(|w| (0..servers).map(|j| capped(w, j, w.load[j])).collect())
            .collect();
        let mut at = vec![ServerQueue::default(); servers];
        for _ in 0..ROUNDS {
            at.iter_mut().for_each(|q| *q = ServerQueue::default());
            for (n, w) in rows.iter().enumerate() {
                for (j, q) in at.iter_mut().enumerate() {
                    q.add(held[n][j], x[n], r[n][j], w.load[j]);
                }
            }
            let mut change: f64 = 0.0;
            for (n, w) in rows.iter().enumerate() {
                for (j, q) in at.iter().enumerate() {
                    let mut others = *q;
                    others.remove(held[n][j], x[n], r[n][j], w.load[j]);
                    r[n][j] = queued_answer(w.load[j], &others);
                    held[n][j] = capped(w, j, r[n][j]);
                }
                let next = 1.0 / per_batch(w, slowest(w, &r[n]));
                let damped = x[n] + DAMPING * (next - x[n]);
                change = change.max((damped - x[n]).abs() / x[n].max(f64::MIN_POSITIVE));
                x[n] = damped;
            }
            if change < SETTLED {
                break;
            }
        }
        let answers = rows.iter().zip(&r).map(|(w, rn)| slowest(w, rn)).collect();
        (x, answers)
    }

    /// Records a second with the servers shared max-min fairly up to
    /// their capacity and no queues (see [`CostModel::throughput_epoch`]).
    fn max_min_records_per_sec(&self, rows: &[QueuedWorker], servers: usize) -> f64 {
        // Per worker: its cap in mini-batches a second (own work and link).
        let caps: Vec<f64> = rows
            .iter()
            .map(|w| {
                let t = overlap(self.queued_fit().serial_fraction, w.comp, w.own + w.latency);
                if t > 0.0 { 1.0 / t } else { f64::INFINITY }
            })
            .collect();
        // The largest common rate each server allows, the workers capped
        // below it at their caps: Σ_i min(λ, cap_i)·s_ij = 1, taken by
        // workers in increasing cap.
        let mut order: Vec<usize> = (0..caps.len()).collect();
        order.sort_by(|&p, &q| caps[p].total_cmp(&caps[q]));
        let mut level = f64::INFINITY;
        for y in 0..servers {
            let mut below = 0.0;
            let mut rest: f64 = order.iter().map(|&x| rows[x].load[y]).sum();
            for &x in &order {
                if rest <= 0.0 {
                    break;
                }
                let lambda = (1.0 - below) / rest;
                if lambda <= caps[x] {
                    level = level.min(lambda);
                    break;
                }
                below += caps[x] * rows[x].load[y];
                rest -= rows[x].load[y];
            }
        }
        caps.iter()
            .zip(rows)
            .map(|(&cap, w)| cap.min(level) * w.records)
            .sum()
    }

    /// Predicted epoch time of `target` (containers of this model that are missing from
    /// it are idle), with a per-worker breakdown.
    pub fn evaluate(&self, target: &Target) -> Result<Breakdown, OptimizerError> {
        let known: std::collections::HashSet<&str> = self.ids.iter().map(String::as_str).collect();
        for id in target.keys() {
            if !known.contains(id.as_str()) {
                return Err(OptimizerError::UnknownContainer {
                    container: id.clone(),
                    context: "target".into(),
                });
            }
        }
        let placements: Vec<Placement> = self
            .ids
            .iter()
            .map(|id| target.get(id).copied().unwrap_or(Placement::IDLE))
            .collect();
        self.evaluate_placements(&placements)
    }

    pub(crate) fn evaluate_placements(
        &self,
        placements: &[Placement],
    ) -> Result<Breakdown, OptimizerError> {
        let (mut input, mut model) = (0u64, 0u64);
        for (id, p) in self.ids.iter().zip(placements) {
            if p.input_blocks > 0 && p.role != Role::Worker {
                return Err(OptimizerError::InconsistentBlocks(format!(
                    "`{id}` holds input blocks but is not a worker"
                )));
            }
            if p.model_blocks > 0 && p.role != Role::Server {
                return Err(OptimizerError::InconsistentBlocks(format!(
                    "`{id}` holds model blocks but is not a server"
                )));
            }
            input += u64::from(p.input_blocks);
            model += u64::from(p.model_blocks);
        }
        if input != u64::from(self.job.input_blocks) || model != u64::from(self.job.model_blocks) {
            return Err(OptimizerError::InconsistentBlocks(format!(
                "configuration holds {input}/{} input and {model}/{} model blocks",
                self.job.input_blocks, self.job.model_blocks
            )));
        }
        let servers: Vec<(usize, u32)> = placements
            .iter()
            .enumerate()
            .filter(|(_, p)| p.model_blocks > 0)
            .map(|(j, p)| (j, p.model_blocks))
            .collect();
        let workers: Vec<(usize, u32)> = placements
            .iter()
            .enumerate()
            .filter(|(_, p)| p.input_blocks > 0)
            .map(|(i, p)| (i, p.input_blocks))
            .collect();
        let w = workers.len();
        let queued = self.queued(&workers, &servers);
        let mut out = Vec::with_capacity(w);
        for (&(i, k), queued_comm) in workers.iter().zip(&queued.comm_per_batch) {
            let (g, bound) = self.comm_per_batch(i, w, &servers);
            let nb = self.batches(k);
            let (comp, comm) = self.parts(i, k, g, holding(&servers));
            out.push(WorkerCost {
                queued_comm_secs: nb as f64 * queued_comm,
                container: self.ids[i].clone(),
                records: self.records(k),
                mini_batches: nb,
                comp_secs: comp,
                comm_secs: comm,
                total_secs: self.epoch_of(comp, comm),
                comm_bound: match bound {
                    Some(j) => CommBound::Server {
                        container: self.ids[j].clone(),
                    },
                    None => CommBound::Worker,
                },
            });
        }
        let slowest = out
            .iter()
            .max_by(|a, b| a.total_secs.total_cmp(&b.total_secs))
            .ok_or_else(|| OptimizerError::Infeasible("no active worker".into()))?;
        let bottleneck = if slowest.comp_secs >= slowest.comm_secs {
            Bottleneck::Compute {
                worker: slowest.container.clone(),
            }
        } else {
            Bottleneck::Communication {
                worker: slowest.container.clone(),
                bound: slowest.comm_bound.clone(),
            }
        };
        let throughput_epoch_secs = queued.epoch_secs.min(slowest.total_secs);
        Ok(Breakdown {
            epoch_secs: slowest.total_secs,
            workers: out,
            active_servers: servers.len(),
            bottleneck,
            throughput_epoch_secs,
        })
    }
}

/// What [`CostModel::queued`] finds.
struct Queued {
    /// [`CostModel::throughput_epoch`].
    epoch_secs: f64,
    /// Per worker given (0 for one without a mini-batch): its communication
    /// per mini-batch, the longer of its own link's time and its slowest
    /// answer under the queues, and the job's latency.
    comm_per_batch: Vec<f64>,
}

/// One asynchronous worker as [`CostModel::throughput_epoch`] prices it,
/// per mini-batch.
struct QueuedWorker {
    /// Computation, with the requests' own cost, seconds.
    comp: f64,
    /// The job's latency, seconds.
    latency: f64,
    /// Its own link's time, seconds.
    own: f64,
    /// Each server's time for it, `s_ij`, seconds (0: holds nothing): its
    /// own link's or its CPU's.
    load: Vec<f64>,
    /// Each server's transfer over the link measured between the two,
    /// seconds (0: not measured, or holds nothing).
    pair: Vec<f64>,
    /// Whether each server's link, not its CPU, sets its time for it.
    link_bound: Vec<bool>,
    /// Records.
    records: f64,
}

/// What one server's queue holds on average, from the workers' rates `X`
/// and answers `R` there (see [`queued_answer`]).
#[derive(Clone, Copy, Default)]
struct ServerQueue {
    /// `Σ X_k · R_kj` over the workers the server's queue holds back: the
    /// mean number of their requests there.
    queued: f64,
    /// `Σ X_k · s_kj` over the workers their own links hold back: the
    /// share of the server they take.
    trickle: f64,
    /// How many workers their own links hold back.
    trickling: f64,
}

impl ServerQueue {
    fn add(&mut self, held: bool, x: f64, r: f64, s: f64) {
        self.step(held, x, r, s, 1.0);
    }

    fn remove(&mut self, held: bool, x: f64, r: f64, s: f64) {
        self.step(held, x, r, s, -1.0);
    }

    fn step(&mut self, held: bool, x: f64, r: f64, s: f64, sign: f64) {
        if s <= 0.0 {
            return;
        }
        if held {
            self.trickle = (self.trickle + sign * x * s).max(0.0);
            self.trickling = (self.trickling + sign).max(0.0);
        } else {
            self.queued = (self.queued + sign * x * r).max(0.0);
        }
    }
}

/// A worker's answer from a server that spends `s` seconds on it, with
/// `others` the rest of the server's queue: `R = s · (1 + Q) / c`.
///
/// Requests the server itself holds back share it (processor sharing):
/// by approximate mean value analysis (Schweitzer) the answer waits
/// behind the `Q = Σ_k X_k · R_k` requests of the others there. A
/// request whose worker's own link is slower than the server's answer
/// (a 66 Mbit/s worker on a 500 Mbit/s server) is not served that way:
/// its transfer trickles at its own link's rate for as long as that
/// takes and leaves the rest of the server's link to the others (where
/// the server's link, not its CPU, sets its time for that worker). Those
/// take the share `ρ = Σ_k X_k · s_k` of the server they use, and the
/// others are served in the rest, `c = 1 − ρ`, but never in less than
/// an equal share beside them, `1 / (1 + n)` (if they would take more
/// than the server has, the server holds them back too).
fn queued_answer(s: f64, others: &ServerQueue) -> f64 {
    let rest = (1.0 - others.trickle).max(1.0 / (1.0 + others.trickling));
    s * (1.0 + others.queued) / rest
}

/// How many of `servers` (`(index, model blocks)`) hold blocks: the servers a
/// worker sends requests to.
#[inline]
pub(crate) fn holding(servers: &[(usize, u32)]) -> usize {
    servers.iter().filter(|p| p.1 > 0).count()
}

/// A worker's epoch from its computation and communication seconds:
/// `max(comp, comm) + f · min(comp, comm)` with `f = job.serial_fraction`.
#[inline]
pub(crate) fn epoch_of(job: &Job, comp: f64, comm: f64) -> f64 {
    overlap(job.serial_fraction, comp, comm)
}

/// `max(comp, comm) + f · min(comp, comm)`.
#[inline]
fn overlap(f: f64, comp: f64, comm: f64) -> f64 {
    comp.max(comm) + f * comp.min(comm)
}

/// `⌈D·k / (K·B)⌉` in exact integer arithmetic.
pub(crate) fn batches(job: &Job, k: u32) -> u64 {
    let small = (
        job.total_records.checked_mul(u64::from(k)),
        u64::from(job.input_blocks).checked_mul(job.mini_batch_size),
    );
    if let (Some(num), Some(den)) = small {
        // The common case, without 128-bit division (this is on the solvers' hot path).
        return if den == 0 { 0 } else { num.div_ceil(den) };
    }
    let num = u128::from(job.total_records) * u128::from(k);
    let den = u128::from(job.input_blocks) * u128::from(job.mini_batch_size);
    if den == 0 {
        return 0;
    }
    num.div_ceil(den) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::test_job as job;
    use crate::snapshot::{ContainerMetrics, Link};

    fn container(id: &str, role: Role, c: Option<f64>, b: f64, p: Option<f64>) -> ContainerMetrics {
        ContainerMetrics {
            role,
            compute_secs_per_record: c,
            server_secs_per_byte: p,
            ..ContainerMetrics::offered(id.into(), None, b)
        }
    }

    fn two_by_two(links: Vec<Link>) -> (CostModel, Target) {
        two_by_two_with(links, 1.0, 0.0)
    }

    fn two_by_two_with(links: Vec<Link>, f: f64, latency: f64) -> (CostModel, Target) {
        let (snap, target) = two_by_two_job(links, f, latency);
        (CostModel::new(&snap).unwrap(), target)
    }

    fn two_by_two_job(links: Vec<Link>, f: f64, latency: f64) -> (Snapshot, Target) {
        let snap = Snapshot {
            policy: None,
            job: Job {
                serial_fraction: f,
                latency_secs_per_mini_batch: latency,
                ..job(1000, 100, 1000.0, 10, 4)
            },
            containers: vec![
                container("w1", Role::Worker, Some(0.01), 1000.0, None),
                container("w2", Role::Worker, Some(0.015), 500.0, None),
                container("s1", Role::Server, None, 1000.0, Some(0.001)),
                container("s2", Role::Server, None, 2000.0, Some(0.0)),
            ],
            links,
        };
        let target = target(&[
            ("w1", Role::Worker, 6, 0),
            ("w2", Role::Worker, 4, 0),
            ("s1", Role::Server, 0, 1),
            ("s2", Role::Server, 0, 3),
        ]);
        (snap, target)
    }

    /// The two-by-two case as an idle snapshot with its resolved costs,
    /// each container then edited by `edit(index, container)`, and its target.
    fn two_by_two_snapshot(edit: impl Fn(usize, &mut ContainerMetrics)) -> (Snapshot, Target) {
        let (model, target) = two_by_two(vec![]);
        let snap = Snapshot {
            policy: None,
            job: model.job().clone(),
            containers: ["w1", "w2", "s1", "s2"]
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let mut c = container(
                        id,
                        Role::Idle,
                        Some(model.compute_secs_per_record(i)),
                        model.bandwidth(i),
                        Some(model.server_secs_per_byte(i)),
                    );
                    edit(i, &mut c);
                    c
                })
                .collect(),
            links: vec![],
        };
        (snap, target)
    }

    /// A target from `(id, role, input blocks, model blocks)`.
    fn target(placements: &[(&str, Role, u32, u32)]) -> Target {
        placements
            .iter()
            .map(|&(id, role, k, l)| {
                (
                    id.to_string(),
                    Placement {
                        role,
                        input_blocks: k,
                        model_blocks: l,
                    },
                )
            })
            .collect()
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} != {b}");
    }

    // The case below with latency 0.5 s per mini-batch: w1 comm = 6 · (1.0 + 0.5) = 9,
    // w2 comm = 4 · (2.0 + 0.5) = 10. Fully overlapped (f = 0): w1 max(6, 9) = 9,
    // w2 max(6, 10) = 10 → 10. Half (f = 0.5): w1 9 + 3 = 12, w2 10 + 3 = 13 → 13.
    // Serial (f = 1): w1 15, w2 16 → 16, compute plus communication as in Eq. (4).
    #[test]
    fn overlap_and_latency_hand_computed() {
        for (f, epoch, w1) in [(0.0, 10.0, 9.0), (0.5, 13.0, 12.0), (1.0, 16.0, 15.0)] {
            let (model, target) = two_by_two_with(vec![], f, 0.5);
            let b = model.evaluate(&target).unwrap();
            close(b.epoch_secs, epoch);
            close(b.workers[0].comm_secs, 9.0);
            close(b.workers[0].total_secs, w1);
            close(b.workers[1].comm_secs, 10.0);
        }
    }

    // The throughput prices with its own fit (`Job::queued_fit`), the bound
    // with the job's: the case above at f = 0.5, λ = 0.5 for the bound and
    // f = 0, λ = 0 for the throughput prices the throughput as a job of
    // f = 0, λ = 0 does, and the bound at 13 s as before.
    #[test]
    fn the_throughput_prices_with_its_own_fit() {
        let with_fit = |f: f64, latency: f64, queued_fit: Option<WaitFit>| {
            let (mut snap, target) = two_by_two_job(vec![], f, latency);
            snap.job.queued_fit = queued_fit;
            CostModel::new(&snap).unwrap().evaluate(&target).unwrap()
        };
        let zero = WaitFit {
            latency_secs_per_mini_batch: 0.0,
            serial_fraction: 0.0,
        };
        let own = with_fit(0.5, 0.5, Some(zero));
        let plain = with_fit(0.0, 0.0, None);
        close(own.epoch_secs, 13.0);
        close(own.throughput_epoch_secs, plain.throughput_epoch_secs);
        assert!(own.throughput_epoch_secs < with_fit(0.5, 0.5, None).throughput_epoch_secs);
        close(
            own.workers[0].queued_comm_secs,
            plain.workers[0].queued_comm_secs,
        );
    }

    // The two-by-two case (serial) with a cost per server on the workers: w1
    // 0.25 s and w2 0.5 s per mini-batch per server holding blocks.
    // Both servers hold blocks: w1 comp 6 + 6 batches · 2 · 0.25 = 9, comm 6 → 15;
    //     w2 comp 6 + 4 · 2 · 0.5 = 10, comm 8 → 18 → epoch 18.
    // s2 holds all 4 (s1 none, so it is not asked): w1 g = max(2·1·1000/2000, 1) = 1,
    //     comm 6, comp 6 + 6 · 0.25 = 7.5 → 13.5; w2 g = 2, comm 8,
    //     comp 6 + 4 · 0.5 = 8 → 16 → epoch 16.
    // Without w2's measurement it gets the measured mean (same CPU speed): 0.25.
    #[test]
    fn requests_per_server_hand_computed() {
        let (mut snap, target) = two_by_two_snapshot(|i, c| {
            c.request_secs_per_server = [Some(0.25), Some(0.5), None, None][i];
        });
        let m = CostModel::new(&snap).unwrap();
        let b = m.evaluate(&target).unwrap();
        close(b.workers[0].comp_secs, 9.0);
        close(b.workers[0].total_secs, 15.0);
        close(b.workers[1].comp_secs, 10.0);
        close(b.epoch_secs, 18.0);
        let one_server = super::tests::target(&[
            ("w1", Role::Worker, 6, 0),
            ("w2", Role::Worker, 4, 0),
            ("s1", Role::Server, 0, 0),
            ("s2", Role::Server, 0, 4),
        ]);
        let b = m.evaluate(&one_server).unwrap();
        assert_eq!(b.active_servers, 1);
        close(b.workers[0].total_secs, 13.5);
        close(b.workers[1].comp_secs, 8.0);
        close(b.epoch_secs, 16.0);
        snap.containers[1].request_secs_per_server = None;
        let m = CostModel::new(&snap).unwrap();
        close(m.request_secs_per_server(1), 0.25);
        close(m.request_secs_per_server(2), 0.25);
    }

    // The two-by-two case, asynchronous. Alone (own link only): w1 6 batches
    // of comp 1 + comm 1 → 2 s a batch (cap 0.5/s, 100 records a batch),
    // w2 4 batches of 1.5 + 2 = 3.5 s (cap 0.2857/s). Per batch, s1 spends
    // 1·max(250/1000, 250·0.001) = 0.25 s on either, s2 3·250/2000 = 0.375
    // s: at the caps s2 is busy 0.375·0.7857 = 0.295 of each second, so
    // neither server binds: 78.57 records/s, 12.727 s for 1000 records,
    // below the slowest worker's 14 s.
    // With both links to s2 measured at 20 B/s, each worker's transfer to
    // s2 takes 3·250/20 = 37.5 s a batch over that link while s2's own link
    // spends 0.375 s on it: the workers trickle at their links' rate, s2
    // does not hold them. w1 runs at 1/(1 + 0.25 + 37.5), w2 at 1/(1.5 +
    // 0.5 + 37.5): 100/38.75 + 100/39.5 records/s → 195.61 s. The bound
    // (every worker's requests always at s2, at the measured link's rate)
    // stays above 375 s.
    #[test]
    fn asynchronous_epoch_shares_the_servers() {
        let (model, target) = two_by_two(vec![]);
        let b = model.evaluate(&target).unwrap();
        close(b.epoch_secs, 14.0);
        close(b.throughput_epoch_secs, 1000.0 / (50.0 + 100.0 / 3.5));
        let slow = |to: &str| Link {
            from: "s2".into(),
            to: to.into(),
            bytes_per_sec: 20.0,
        };
        let (model, target) = two_by_two(vec![slow("w1"), slow("w2")]);
        let b = model.evaluate(&target).unwrap();
        close(
            b.throughput_epoch_secs,
            1000.0 / (100.0 / 38.75 + 100.0 / 39.5),
        );
        assert!(b.epoch_secs > 375.0, "{}", b.epoch_secs);
    }

    /// An asynchronous job of 10,000 records, 100 a mini-batch, 1 MB on a
    /// link a mini-batch, on `containers` that spend nothing on requests
    /// themselves and fully overlap computation and communication.
    fn queue_job(containers: Vec<ContainerMetrics>) -> Snapshot {
        Snapshot {
            policy: None,
            job: Job {
                serial_fraction: 0.0,
                link_bytes_per_mini_batch: Some(1e6),
                asynchronous: true,
                ..job(10_000, 100, 2e6, 10, 4)
            },
            containers: containers
                .into_iter()
                .map(|c| ContainerMetrics {
                    request_secs_per_server: Some(0.0),
                    server_secs_per_mini_batch: Some(0.0),
                    ..c
                })
                .collect(),
            links: vec![],
        }
    }

    /// The cost model's breakdown of `snap` with `placements`.
    fn queued_epoch(snap: &Snapshot, placements: &[(&str, Role, u32, u32)]) -> Breakdown {
        CostModel::new(snap)
            .unwrap()
            .evaluate(&target(placements))
            .unwrap()
    }

    /// Two workers on slow links (a, b: 0.1 s of their own link a
    /// mini-batch) and a fast one (f: 0.005 s) on one server that spends
    /// 0.01 s a mini-batch on each, computation negligible and overlapped.
    /// a's and b's transfers last their own links' 0.1 s, longer than the
    /// server takes to answer them: they trickle, taking `ρ = 10 · 0.01`
    /// of the server each, and f is served in the rest: `R_f = 0.01 / (1 −
    /// 0.2) = 0.0125`, 80 mini-batches a second, the job 100 a second, 1 s
    /// for 10,000 records of 100 a mini-batch. Processor sharing would
    /// queue f behind their requests as if each held the whole server
    /// (`R_f = 0.01·(1 + 2·X_s·R_s)`, f at 69.23 a second, 1.1207 s); an
    /// emulated 4-worker job with three such workers ran at what the
    /// trickle prices (0.771 s an epoch; 0.775 s priced, 0.881 s by
    /// processor sharing).
    #[test]
    fn a_fast_workers_answers_wait_behind_slow_workers_requests() {
        let mut snap = queue_job(vec![
            container("a", Role::Worker, Some(1e-12), 1e7, None),
            container("b", Role::Worker, Some(1e-12), 1e7, None),
            container("f", Role::Worker, Some(1e-12), 2e8, None),
            container("s", Role::Server, None, 1e8, Some(0.0)),
        ]);
        let placements = [
            ("a", Role::Worker, 3, 0),
            ("b", Role::Worker, 3, 0),
            ("f", Role::Worker, 4, 0),
            ("s", Role::Server, 0, 4),
        ];
        let b = queued_epoch(&snap, &placements);
        let fast = 1.0 / (0.01 / (1.0 - 0.2));
        let expected = 10_000.0 / (100.0 * (20.0 + fast));
        let t = b.throughput_epoch_secs;
        assert!((t - expected).abs() < 1e-6, "{t} vs {expected}");
        assert!(b.epoch_secs >= t, "{b:?}");

        // The server's 0.01 s from its CPU instead (2e6 bytes at 5 ns, its
        // link ten times faster): it works on a's and b's requests whole,
        // however slowly they came, and f's answers queue behind them:
        // `R_s = 0.01·(1 + X_s·R_s + X_f·R_f)`, `R_f = 0.01·(1 +
        // 2·X_s·R_s)` with `X_s = 10`, `X_f = 1/R_f`: `R_s = 0.02/0.9`,
        // `R_f = 0.01·(1 + 0.4/0.9)`, f at 69.23 a second, 1.1207 s.
        snap.containers[3].bandwidth_bytes_per_sec = 1e9;
        snap.containers[3].server_secs_per_byte = Some(5e-9);
        let b = queued_epoch(&snap, &placements);
        let fast = 1.0 / (0.01 * (1.0 + 2.0 * 10.0 * 0.02 / 0.9));
        let expected = 10_000.0 / (100.0 * (20.0 + fast));
        let t = b.throughput_epoch_secs;
        assert!((t - expected).abs() < 1e-6, "{t} vs {expected}");
    }

    /// A worker slow for its CPU (c: 0.09 s of computation a mini-batch,
    /// its link as fast as f's, 0.005 s) beside a fast one (f) on one
    /// server spending 0.01 s on each. c's requests come in bursts the
    /// server serves at its own pace, so f's answers queue behind them
    /// (processor sharing): `R_c = 0.01·(1 + X_f·R_f)` with `X_f·R_f = 1`
    /// (f always has a request there), `R_c = 0.02`, `X_c = 1/0.09`;
    /// `R_f = 0.01·(1 + X_c·R_c) = 0.012222`, f at 81.82 a second, the job
    /// 92.93, 1.0761 s for 10,000 records. Shared as a fluid (c's 11.1
    /// a second taking 0.111 of the server, f the rest) it would be 1 s.
    #[test]
    fn a_fast_workers_answers_queue_behind_bursts() {
        let snap = queue_job(vec![
            container("c", Role::Worker, Some(9e-4), 2e8, None),
            container("f", Role::Worker, Some(1e-12), 2e8, None),
            container("s", Role::Server, None, 1e8, Some(0.0)),
        ]);
        let b = queued_epoch(
            &snap,
            &[
                ("c", Role::Worker, 5, 0),
                ("f", Role::Worker, 5, 0),
                ("s", Role::Server, 0, 4),
            ],
        );
        let slow = 1.0 / 0.09;
        let fast = 1.0 / (0.01 * (1.0 + slow * 0.02));
        let expected = 10_000.0 / (100.0 * (slow + fast));
        let t = b.throughput_epoch_secs;
        assert!((t - expected).abs() < 1e-6, "{t} vs {expected}");
    }

    // The two-by-two case with s1 spending 0.5 s on each worker's
    // mini-batch besides its bytes: s1-bound = 2·max(1·250/1000, 1·250·0.001
    // + 0.5) = 1.5 > w1's own link (1.0): w1 comm 6·1.5 = 9, total 15; w2's
    // own link (2.0) still bounds it: 14 → epoch 15. Spread or not, the
    // requests' cost stays: with all 4 blocks on s1 it is 2·max(1.0, 1.0 +
    // 0.5) = 3.0 for both.
    #[test]
    fn a_servers_cost_per_mini_batch_does_not_shrink_with_its_share() {
        let (mut snap, target) = two_by_two_snapshot(|i, c| {
            c.server_secs_per_mini_batch = Some(if i == 2 { 0.5 } else { 0.0 });
        });
        let m = CostModel::new(&snap).unwrap();
        let b = m.evaluate(&target).unwrap();
        close(b.workers[0].comm_secs, 9.0);
        assert_eq!(
            b.workers[0].comm_bound,
            CommBound::Server {
                container: "s1".into()
            }
        );
        close(b.epoch_secs, 15.0);
        let all_on_s1 = super::tests::target(&[
            ("w1", Role::Worker, 6, 0),
            ("w2", Role::Worker, 4, 0),
            ("s1", Role::Server, 0, 4),
            ("s2", Role::Server, 0, 0),
        ]);
        let b = m.evaluate(&all_on_s1).unwrap();
        close(b.workers[0].comm_secs, 18.0);
        close(b.workers[1].comm_secs, 12.0);
        // An unmeasured server gets the mean of the measured ones at its
        // speed: (0 + 0 + 0.5) / 3.
        snap.containers[3].server_secs_per_mini_batch = None;
        let m = CostModel::new(&snap).unwrap();
        close(m.server_secs_per_mini_batch(3), 0.5 / 3.0);
    }

    #[test]
    fn serial_fraction_outside_zero_one_is_rejected() {
        for (f, ok) in [(-0.1, false), (1.5, false), (f64::NAN, false), (0.5, true)] {
            let snap = Snapshot {
                policy: None,
                job: Job {
                    serial_fraction: f,
                    ..job(1000, 100, 1000.0, 10, 4)
                },
                containers: vec![
                    container("w1", Role::Worker, Some(0.01), 1000.0, None),
                    container("s1", Role::Server, None, 1000.0, Some(0.001)),
                ],
                links: vec![],
            };
            assert_eq!(CostModel::new(&snap).is_ok(), ok, "f = {f}");
        }
    }

    // Hand computation (w = 2 workers, M = 1000 B; s1 holds 1/4 of the model at
    // 1000 B/s and 0.001 s/B, s2 3/4 at 2000 B/s):
    // w1 (1000 B/s): server-bound s1 = 2·0.25·1000·max(1/1000, 0.001) = 0.5,
    //     s2 = 2·0.75·1000/2000 = 0.75, worker-bound = 1000/1000 = 1.0 → g = 1.0 (own).
    //     600 records: comp 6, 6 batches → comm 6, total 12.
    // w2 (500 B/s): the servers' bounds are theirs (0.5, 0.75), its own link
    //     1000/500 = 2.0 → g = 2.0 (worker-bound).
    //     400 records: comp 6, 4 batches → comm 8, total 14 → epoch 14.
    #[test]
    fn hand_computed_heterogeneous_case() {
        let (model, target) = two_by_two(vec![]);
        let b = model.evaluate(&target).unwrap();
        close(b.epoch_secs, 14.0);
        assert_eq!(b.workers.len(), 2);
        close(b.workers[0].comp_secs, 6.0);
        close(b.workers[0].comm_secs, 6.0);
        assert_eq!(b.workers[0].comm_bound, CommBound::Worker);
        assert_eq!(b.workers[0].mini_batches, 6);
        close(b.workers[1].comp_secs, 6.0);
        close(b.workers[1].comm_secs, 8.0);
        assert_eq!(
            b.bottleneck,
            Bottleneck::Communication {
                worker: "w2".into(),
                bound: CommBound::Worker
            }
        );
        assert_eq!(b.active_servers, 2);
    }

    // A measured link slower than both ends prices that pair: 250 B/s between w2 and
    // s2. s2-bound = 2·0.75·1000/250 = 6.0, s1-bound 0.5, worker-bound =
    // 0.25·1000/500 + 0.75·1000/250 = 3.5 → g = 6.0 (s2), comm 24, total 30; w1 still
    // 12 → epoch 30. A measured link faster than an end changes nothing.
    #[test]
    fn slower_pairwise_link_overrides_own_links() {
        let link = |bytes_per_sec| Link {
            from: "s2".into(),
            to: "w2".into(),
            bytes_per_sec,
        };
        let (model, target) = two_by_two(vec![link(250.0)]);
        let b = model.evaluate(&target).unwrap();
        close(b.workers[1].comm_secs, 24.0);
        close(b.workers[1].total_secs, 30.0);
        assert_eq!(
            b.workers[1].comm_bound,
            CommBound::Server {
                container: "s2".into()
            }
        );
        close(b.epoch_secs, 30.0);
        let (model, target) = two_by_two(vec![link(1e6)]);
        close(model.evaluate(&target).unwrap().epoch_secs, 14.0);
    }

    // A fast worker with slow servers is bound by each server's own link, in
    // parallel, not by the slow links one after another: 1 worker at 1000 B/s, two
    // servers at 100 B/s with half the model each, M = 100 B: server-bound
    // 1·0.5·100/100 = 0.5 each, worker-bound 100/1000 = 0.1 → g = 0.5.
    #[test]
    fn slow_servers_are_paid_in_parallel() {
        let snap = |link_bytes| Snapshot {
            policy: None,
            job: Job {
                link_bytes_per_mini_batch: link_bytes,
                ..job(100, 10, 100.0, 2, 2)
            },
            containers: vec![
                container("w", Role::Worker, Some(0.0), 1000.0, None),
                container("a", Role::Server, None, 100.0, Some(0.001)),
                container("b", Role::Server, None, 100.0, Some(0.001)),
            ],
            links: vec![],
        };
        let t = target(&[
            ("w", Role::Worker, 2, 0),
            ("a", Role::Server, 0, 1),
            ("b", Role::Server, 0, 1),
        ]);
        let epoch = |link_bytes| {
            let model = CostModel::new(&snap(link_bytes)).unwrap();
            model.evaluate(&t).unwrap().epoch_secs
        };
        // Server-bound 1·0.5·max(100/100, 100·0.001) = 0.5, worker-bound 100/1000:
        // 10 batches × 0.5 s.
        close(epoch(None), 5.0);
        // Full duplex: 50 of the 100 bytes on the busier direction; the servers still
        // process all 100. 0.5·max(50/100, 0.1) = 0.25 → 10 × 0.25 s.
        close(epoch(Some(50.0)), 2.5);
    }

    // One worker, two equal servers: server-bound 1·0.5·300/100 = 1.5 < worker-bound
    // 300/100 = 3. 100 records in batches of 30 → ⌈100/30⌉ = 4 batches:
    // comp 0.1 + comm 12 = 12.1, bound by the worker's own link.
    #[test]
    fn worker_bound_and_partial_last_batch() {
        let snap = Snapshot {
            policy: None,
            job: job(100, 30, 300.0, 2, 2),
            containers: vec![
                container("w", Role::Worker, Some(0.001), 100.0, None),
                container("a", Role::Server, None, 100.0, None),
                container("b", Role::Server, None, 100.0, None),
            ],
            links: vec![],
        };
        let model = CostModel::new(&snap).unwrap();
        let mut t = Target::new();
        t.insert(
            "w".into(),
            Placement {
                role: Role::Worker,
                input_blocks: 2,
                model_blocks: 0,
            },
        );
        for s in ["a", "b"] {
            t.insert(
                s.into(),
                Placement {
                    role: Role::Server,
                    input_blocks: 0,
                    model_blocks: 1,
                },
            );
        }
        let b = model.evaluate(&t).unwrap();
        assert_eq!(b.workers[0].mini_batches, 4);
        close(b.epoch_secs, 12.1);
        assert_eq!(b.workers[0].comm_bound, CommBound::Worker);
        // No server timing measured anywhere: processing time is taken as 0.
        assert_eq!(model.server_secs_per_byte(1), 0.0);
    }

    #[test]
    fn compute_fallback_uses_speed_factor() {
        let mut a = container("a", Role::Worker, Some(0.01), 1.0, None);
        a.cpu_speed = Some(1.0);
        let mut b = container("b", Role::Worker, Some(0.03), 1.0, None);
        b.cpu_speed = Some(0.5);
        let mut n = container("n", Role::Idle, None, 1.0, None);
        n.cpu_speed = Some(2.0);
        let plain = container("p", Role::Idle, None, 1.0, None);
        let mut s = container("s", Role::Server, None, 1.0, Some(4e-9));
        s.cpu_speed = Some(2.0);
        let snap = Snapshot {
            policy: None,
            job: job(10, 1, 1.0, 1, 1),
            containers: vec![a, b, n, plain, s],
            links: vec![],
        };
        let m = CostModel::new(&snap).unwrap();
        // Reference at speed 1: mean(0.01·1, 0.03·0.5) = 0.0125.
        close(m.compute_secs_per_record(2), 0.0125 / 2.0);
        close(m.compute_secs_per_record(3), 0.0125);
        // Server reference at speed 1: 4e-9·2 = 8e-9; a speed-1 container gets 8e-9.
        close(m.server_secs_per_byte(0), 8e-9);
        close(m.server_secs_per_byte(4), 4e-9);
    }

    #[test]
    fn no_measurement_at_all_is_an_error() {
        let snap = Snapshot {
            policy: None,
            job: job(10, 1, 1.0, 1, 1),
            containers: vec![container("a", Role::Idle, None, 1.0, None)],
            links: vec![],
        };
        assert_eq!(
            CostModel::new(&snap).unwrap_err(),
            OptimizerError::NoComputeMeasurement
        );
    }

    #[test]
    fn inconsistent_targets_are_rejected() {
        let (model, mut target) = two_by_two(vec![]);
        target.get_mut("w1").unwrap().input_blocks = 5;
        assert!(matches!(
            model.evaluate(&target),
            Err(OptimizerError::InconsistentBlocks(_))
        ));
        let (model, mut target) = two_by_two(vec![]);
        target.insert("zz".into(), Placement::IDLE);
        assert!(matches!(
            model.evaluate(&target),
            Err(OptimizerError::UnknownContainer { .. })
        ));
    }
}
