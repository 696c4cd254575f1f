//! What the optimizer is told: [`build_snapshot`] turns the AM's
//! measurements and ownership into the optimizer's [`Snapshot`] and
//! [`Configuration`] (containers are named `e<id>`; capacity the job may
//! grow into appears as idle `new<k>`).

use std::collections::BTreeSet;

use cruise_container::protocol::EvaluatorId;
use cruise_optimizer::{
    Configuration, ContainerMetrics, CostModel, Holding, Job, Snapshot, WaitFit, expected_draw,
};

use super::Role;
use super::metrics::Metrics;

/// Bandwidth assumed when nothing has been measured yet (loopback-like).
pub const UNMEASURED_BANDWIDTH: f64 = 1e9;

/// A container as the optimizer names it: an evaluator of the job
/// (`e<id>`) or capacity the job may add (`new<k>`). The optimizer's plans
/// carry the names as strings; they are parsed here, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContainerName {
    /// An evaluator of the job.
    Evaluator(EvaluatorId),
    /// The `k`-th container the job may add.
    Offer(usize),
}

impl ContainerName {
    /// Parses an optimizer name; `None` if it is neither form.
    pub fn parse(name: &str) -> Option<ContainerName> {
        fn digits<T: std::str::FromStr>(s: &str) -> Option<T> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        }
        if let Some(k) = name.strip_prefix("new") {
            digits(k).map(ContainerName::Offer)
        } else {
            name.strip_prefix('e')
                .and_then(digits)
                .map(ContainerName::Evaluator)
        }
    }
}

impl std::fmt::Display for ContainerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContainerName::Evaluator(id) => write!(f, "e{id}"),
            ContainerName::Offer(k) => write!(f, "new{k}"),
        }
    }
}

/// What the snapshot needs to know about one evaluator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalFacts {
    /// Id.
    pub id: EvaluatorId,
    /// Role.
    pub role: Role,
    /// Input blocks it owns.
    pub input: BTreeSet<u32>,
    /// Model blocks it owns.
    pub model: BTreeSet<u32>,
    /// Whether the resource manager wants its container back.
    pub reclaimed: bool,
}

/// Job-level facts for the snapshot.
#[derive(Debug, Clone, Copy)]
pub struct JobFacts {
    /// Records per epoch.
    pub records: u64,
    /// Mini-batch size.
    pub mini_batch: u32,
    /// Input blocks.
    pub input_blocks: u32,
    /// Model blocks.
    pub model_blocks: u32,
    /// Epochs left.
    pub remaining_epochs: f64,
    /// Bytes of input held by workers.
    pub input_bytes: u64,
    /// Bytes of model held by servers.
    pub model_bytes: u64,
    /// Containers the job may add (capacity not used yet).
    pub spare: usize,
    /// Relative spread under which measurements of different containers are
    /// treated as equal (noise, not heterogeneity).
    pub noise_tolerance: f64,
    /// The same for bandwidth (bulk probes on shared hosts vary more).
    pub bandwidth_noise_tolerance: f64,
    /// Mini-batches a worker has in flight, pulled ahead and pushed without
    /// waiting (`job.pipeline_depth`, deeper for a lone worker); 0 for
    /// workers that pull, compute and push one after the other.
    pub pipeline_depth: u32,
    /// Workers are not held together by clocks (`job.sync = "async"`).
    pub asynchronous: bool,
}

/// Replaces values that lie within `tol` of each other by their group's mean:
/// in increasing order, a group runs from its smallest value `v` up to
/// `v·(1 + tol)`. Differences that small are measurement noise, and treating
/// them as real would move blocks back and forth for nothing; a cluster of
/// two kinds of containers keeps its two kinds, each evened out.
fn snap(values: &mut [Option<f64>], tol: f64) {
    let mut order: Vec<usize> = (0..values.len())
        .filter(|&i| values[i].is_some_and(|v| v > 0.0 && v.is_finite()))
        .collect();
    order.sort_by(|&a, &b| {
        values[a]
            .unwrap_or(0.0)
            .total_cmp(&values[b].unwrap_or(0.0))
    });
    let mut start = 0;
    while start < order.len() {
        let low = values[order[start]].unwrap_or(0.0);
        let end = order[start..]
            .iter()
            .position(|&i| values[i].unwrap_or(0.0) > low * (1.0 + tol))
            .map_or(order.len(), |p| start + p);
        let group = &order[start..end];
        let mean = group.iter().filter_map(|&i| values[i]).sum::<f64>() / group.len() as f64;
        for &i in group {
            values[i] = Some(mean);
        }
        start = end;
    }
}

/// Bytes per mini-batch of a worker: all of them (pull + push) and those on the
/// busier direction of a link.
#[derive(Debug, Clone, Copy)]
struct Bytes {
    all: f64,
    link: Option<f64>,
}

/// Builds the optimizer's inputs from the AM's state.
pub fn build_snapshot(
    job: JobFacts,
    evals: &[EvalFacts],
    m: &Metrics,
) -> (Snapshot, Configuration) {
    let workers: Vec<&EvalFacts> = evals.iter().filter(|e| e.role == Role::Worker).collect();
    let over_workers = |f: &dyn Fn(&super::metrics::EvalMetrics) -> Option<f64>| {
        mean(workers.iter().filter_map(|e| m.get(e.id).and_then(f)))
    };
    let bytes_per_mini_batch = over_workers(&|x| x.bytes_per_batch.mean()).unwrap_or(0.0);
    // Links carry pulls and pushes at once, each direction at the measured
    // bandwidth: what takes time is the busier direction.
    let link_bytes = over_workers(&|x| x.link_bytes_per_batch.mean());
    let bytes = Bytes {
        all: bytes_per_mini_batch,
        link: link_bytes,
    };
    let tol = job.noise_tolerance;
    // Bandwidth is each container's capacity, measured by bulk transfers;
    // before any, the effective rate of its mini-batch transfers.
    // A link carries at least what it was seen carrying in training: a
    // probe from a container of little CPU, or one whose partners were all
    // slower, can read below that (a 636 Mbit/s server of 0.1 CPU probed at
    // 51 MB/s while its five workers drew 71 MB/s from it, and the cost
    // model priced its own configuration 40% slower than it ran).
    let carried = carried_bytes_per_sec(&job, evals, m);
    let mut bw: Vec<Option<f64>> = evals
        .iter()
        .zip(&carried)
        .map(|(e, &carried)| {
            m.capacity(e.id)
                .or_else(|| m.node_bandwidth(e.id))
                .map(|b| carried.map_or(b, |c| b.max(c)))
        })
        .collect();
    snap(&mut bw, job.bandwidth_noise_tolerance);
    // A container not measured yet (offered, or just joined) is priced as
    // one drawn like those the job has seen, held now or before.
    let seen_bw = bw
        .iter()
        .flatten()
        .copied()
        .chain(m.departed().iter().filter_map(|d| d.bandwidth));
    let draw_bw = expected_draw(seen_bw)
        .or_else(|| m.mean_capacity())
        .or_else(|| m.mean_bandwidth())
        .unwrap_or(UNMEASURED_BANDWIDTH);
    // CPU: the workers' measured compute cost per record, per unit of
    // calibrated CPU speed, scaled back by each container's speed. Per-worker
    // differences in training come from who shares a core with whom at the
    // moment; the calibration is what tells containers apart.
    let mut speed: Vec<Option<f64>> = evals
        .iter()
        .map(|e| m.get(e.id).and_then(|x| x.cpu_speed))
        .collect();
    snap(&mut speed, tol);
    // A worker's own time per mini-batch beyond its computation comes with
    // every mini-batch, whoever serves. The part on its loop thread (key
    // lists, applying its own pushes, routing) is priced as part of its
    // seconds per record (the mini-batch size is fixed, so per record and
    // per mini-batch are the same up to a block's last one), and so is
    // the part of its request connections' CPU that encodes and decodes
    // the values (as large whoever holds them). The rest of those
    // connections' CPU (`io`: writing, reading, waking, a pull and a push
    // per server) grows with the servers it talks to: it is priced per
    // server, from the servers of the running configuration. A lone
    // worker, 8 deep, measured the same per server as workers 2 deep.
    let servers_now = evals.iter().filter(|e| !e.model.is_empty()).count();
    let (raw, raw_requests) = worker_costs(evals, m, servers_now);
    let comp = by_speed(&raw, &speed);
    let requests = by_speed(&raw_requests, &speed);
    let serve = snapped(evals, m, tol, |x| x.server_secs_per_byte.mean());
    let serve_fixed = snapped(evals, m, tol, |x| x.server_secs_per_mini_batch.mean());
    // Latency: the communication time the cost model does not explain for
    // the running configuration (request round trips, which do not shrink
    // when the model is spread over more servers), per mini-batch. A serial
    // worker waits for its pull and its push. A pipelined one has `d`
    // mini-batches in flight, so a round trip holds it up for 1/d of its
    // length per mini-batch (Little's law): a pull's round trip under a
    // saturated server is mostly the `d - 1` requests queued before it, not
    // latency that another split would keep (charged whole, it doubles the
    // predicted epoch of 7 workers on one server). And
    // the serial fraction: how much of computation and communication add up
    // in a mini-batch's wall time rather than overlap (1 for workers that
    // pull, compute and push one after the other; less for pipelined ones).
    let per_container = PerContainer {
        comp: &comp,
        requests: &requests,
        speed: &speed,
        bw: &bw,
        serve: &serve,
        serve_fixed: &serve_fixed,
    };
    let (mut snapshot, config) = assemble(&job, evals, m, per_container, draw_bw, bytes);
    let (latency, serial_fraction) = fit_latency(&job, m, &snapshot, &config, Waits::Bound);
    snapshot.job.serial_fraction = serial_fraction;
    // Asynchronous workers are priced by their throughput, their answers
    // queued behind the requests the others make as they come: the same
    // waits explained that way leave another latency (and overlap; the
    // queues are taken with the overlap just found).
    if job.asynchronous {
        let (latency, serial_fraction) = fit_latency(&job, m, &snapshot, &config, Waits::Queued);
        snapshot.job.queued_fit = Some(WaitFit {
            latency_secs_per_mini_batch: latency,
            serial_fraction,
        });
    }
    snapshot.job.latency_secs_per_mini_batch = latency;
    snapshot.job.measured_epoch_secs = measured_epoch_secs(&job, evals, m);
    if let Some(measured) = snapshot.job.measured_epoch_secs {
        let share = least_waits_that_explain(&snapshot, &config, measured, job.pipeline_depth > 0);
        scale_waits(&mut snapshot, share, job.pipeline_depth > 0);
    }
    (snapshot, config)
}

/// Scales the fits down as [`least_waits_that_explain`] finds: the job's
/// latency (the solvers' bound) and, for an asynchronous job, its queued
/// fit (the throughput), both fitted to the same waits; each serial
/// fraction too for pipelined workers (a serial worker's is 1 by
/// construction). The bound stays above the throughput, so at the share
/// found it still prices the running configuration at its measured epoch
/// or slower.
fn scale_waits(snapshot: &mut Snapshot, share: f64, pipelined: bool) {
    let job = &mut snapshot.job;
    let fits = std::iter::once((
        &mut job.latency_secs_per_mini_batch,
        &mut job.serial_fraction,
    ))
    .chain(
        job.queued_fit
            .as_mut()
            .map(|q| (&mut q.latency_secs_per_mini_batch, &mut q.serial_fraction)),
    );
    for (latency, serial) in fits {
        *latency *= share;
        if pipelined {
            *serial *= share;
        }
    }
}

/// The least share `a` in `[0, 1]` of the fitted latencies and serial
/// fractions at which the cost model still prices the running
/// configuration at its `measured` epoch or slower (as the trigger
/// prices it: an asynchronous job by its throughput, else by its slowest
/// worker). Both are fitted to the waits each worker saw, and what a fit
/// adds beyond what the epoch needs is charged to every other
/// configuration for nothing.
///
/// Behind a saturated server the waits are mostly that server's queue,
/// which its capacity prices whatever the latency: the running
/// configuration's epoch barely moves with either fit, and whatever the
/// queues' approximation leaves of the waits was taken as latency and
/// overlap. Six workers on one 0.1-CPU, 67 Mbit/s server fitted 2.6 ms a
/// mini-batch and a serial fraction of 0.43; the cost model priced that
/// configuration at 1.14 s (measured 1.12 s) with them and at 1.12 s
/// without, and every other split of its cluster 25–100% slower than
/// they ran with them, within 6% without. Where the fits are what the
/// epoch needs, the share is close to 1; it is 1 where even the whole fit
/// prices the configuration faster than it ran.
fn least_waits_that_explain(
    snapshot: &Snapshot,
    config: &Configuration,
    measured: f64,
    pipelined: bool,
) -> f64 {
    let counts = config.counts();
    let epoch = |share: f64| -> Option<f64> {
        let mut s = snapshot.clone();
        scale_waits(&mut s, share, pipelined);
        let b = CostModel::including_reclaimed(&s)
            .and_then(|model| model.evaluate(&counts))
            .ok()?;
        let e = if s.job.asynchronous {
            b.throughput_epoch_secs
        } else {
            b.epoch_secs
        };
        e.is_finite().then_some(e)
    };
    let explains = |share: f64| epoch(share).is_some_and(|e| e >= measured);
    if !explains(1.0) {
        return 1.0;
    }
    if explains(0.0) {
        return 0.0;
    }
    // The epoch grows with the share: bisect, keeping the end that
    // explains.
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        if explains(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The running configuration's epoch time as its workers measured it since
/// it began: each worker holding input at its mini-batches' summed wall
/// time. Asynchronous workers share the data set by their throughput;
/// synchronised ones each process their own input and the slowest decides.
/// `None` until every such worker has counted a mini-batch.
fn measured_epoch_secs(job: &JobFacts, evals: &[EvalFacts], m: &Metrics) -> Option<f64> {
    let mini_batch = f64::from(job.mini_batch.max(1));
    let records_per_block = job.records as f64 / f64::from(job.input_blocks.max(1));
    let (mut records_per_sec, mut slowest) = (0.0, 0.0f64);
    let mut workers = 0;
    for e in evals
        .iter()
        .filter(|e| e.role == Role::Worker && !e.input.is_empty())
    {
        let batches_per_sec = pace(m.get(e.id)?)?;
        records_per_sec += mini_batch * batches_per_sec;
        let own_records = e.input.len() as f64 * records_per_block;
        slowest = slowest.max(own_records / mini_batch / batches_per_sec);
        workers += 1;
    }
    if workers == 0 {
        return None;
    }
    let secs = if job.asynchronous {
        job.records as f64 / records_per_sec
    } else {
        slowest
    };
    (secs.is_finite() && secs > 0.0).then_some(secs)
}

/// A worker's mini-batches a second since the running configuration
/// began (`None` before its first).
fn pace(x: &super::metrics::EvalMetrics) -> Option<f64> {
    (x.batches > 0 && x.batch_secs > 0.0).then(|| f64::from(x.batches) / x.batch_secs)
}

/// What each evaluator's link carried on its busier direction while the
/// running configuration trained, bytes a second (`None`: nothing yet). A
/// worker carries its link bytes per mini-batch at its mini-batches' pace
/// (the pace [`measured_epoch_secs`] counts); a server holding `l` of the
/// `L` model blocks carries `l / L` of what every worker does, the share
/// the cost model prices it for. Summing each worker's busier direction
/// takes the server's pulls and pushes as busy as each other.
fn carried_bytes_per_sec(job: &JobFacts, evals: &[EvalFacts], m: &Metrics) -> Vec<Option<f64>> {
    let worker = |e: &EvalFacts| {
        let x = m.get(e.id)?;
        let bytes = x.link_bytes_per_batch.mean()?;
        (e.role == Role::Worker && !e.input.is_empty())
            .then(|| pace(x).map(|p| bytes * p))
            .flatten()
            .filter(|r| r.is_finite() && *r > 0.0)
    };
    let per_worker: Vec<Option<f64>> = evals.iter().map(worker).collect();
    let all: f64 = per_worker.iter().flatten().sum();
    let model_blocks = f64::from(job.model_blocks.max(1));
    evals
        .iter()
        .zip(&per_worker)
        .map(|(e, w)| {
            w.or_else(|| {
                (e.role == Role::Server && !e.model.is_empty() && all > 0.0)
                    .then(|| all * e.model.len() as f64 / model_blocks)
            })
        })
        .collect()
}

/// Per worker that trained: its seconds per record (its own time beyond
/// the requests' per-server part, per record) and its seconds per server
/// and mini-batch, `servers_now` being the servers it talked to; `None`
/// for the others.
fn worker_costs(
    evals: &[EvalFacts],
    m: &Metrics,
    servers_now: usize,
) -> (Vec<Option<f64>>, Vec<Option<f64>>) {
    evals
        .iter()
        .map(|e| {
            let Some((x, per_record)) = m
                .get(e.id)
                .and_then(|x| Some((x, x.comp_per_record.mean()?)))
            else {
                return (None, None);
            };
            let io = x.own.io_secs_per_batch();
            let own = match (x.own.own_secs_per_batch(), x.comp_secs_per_batch.mean()) {
                (Some(own), Some(comp)) if comp > 0.0 => {
                    ((own - io.unwrap_or(0.0)) / comp).max(1.0)
                }
                _ => 1.0,
            };
            let per_server = io
                .filter(|_| servers_now > 0)
                .map(|io| io / servers_now as f64);
            (Some(per_record * own), per_server)
        })
        .unzip()
}

/// Which of the cost model's views of a worker's communication a fit
/// explains the measured waits against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// Every worker's requests always queued at every server: what the
    /// solvers price ([`cruise_optimizer::WorkerCost::comm_secs`]).
    Bound,
    /// Each answer queued behind the requests the others make as they
    /// come: what an asynchronous job's throughput prices
    /// ([`cruise_optimizer::WorkerCost::queued_comm_secs`]).
    Queued,
}

/// The latency and the serial fraction of the running configuration
/// (see [`build_snapshot`]), fitted per worker against what the cost model
/// explains of its communication in the view `waits`, and their medians
/// over the workers.
fn fit_latency(
    job: &JobFacts,
    m: &Metrics,
    snapshot: &Snapshot,
    config: &Configuration,
    waits: Waits,
) -> (f64, f64) {
    let mut per_worker = Vec::new();
    if let Ok(b) =
        CostModel::including_reclaimed(snapshot).and_then(|model| model.evaluate(&config.counts()))
    {
        for w in &b.workers {
            let Some(ContainerName::Evaluator(id)) = ContainerName::parse(&w.container) else {
                continue;
            };
            let Some(x) = m.get(id) else {
                continue;
            };
            if w.mini_batches == 0 {
                continue;
            }
            let comm = match waits {
                Waits::Bound => w.comm_secs,
                Waits::Queued => w.queued_comm_secs,
            };
            let predicted = comm / w.mini_batches as f64;
            let waited_on = if job.pipeline_depth > 0 {
                x.pull_secs_per_batch
                    .mean()
                    .map(|rtt| rtt / f64::from(job.pipeline_depth))
            } else {
                x.comm_secs_per_batch()
            };
            let Some(measured) = waited_on else {
                continue;
            };
            tracing::debug!(
                worker = %w.container,
                predicted_comm = predicted,
                measured,
                comp = x.comp_secs_per_batch.mean(),
                batch = x.batch_secs_per_batch.mean(),
                own = x.own.own_secs_per_batch(),
                io = x.own.io_secs_per_batch(),
                "per mini-batch: the cost model's communication and what was measured"
            );
            per_worker.push((
                predicted,
                (measured - predicted).max(0.0),
                x.own
                    .own_secs_per_batch()
                    .or_else(|| x.comp_secs_per_batch.mean()),
                x.batch_secs_per_batch.mean(),
            ));
        }
    }
    // Medians, not means: one starved worker is not the job's latency. A
    // fast worker behind a saturated slow server can wait ten times what
    // the others wait; averaged in, its excess would be charged to every
    // worker of every split.
    let latency = median(per_worker.iter().map(|p| p.1)).unwrap_or(0.0);
    let serial = median(
        per_worker
            .iter()
            .filter_map(|&(g, _, c, b)| serial_fraction(c?, g + latency, b?)),
    )
    .unwrap_or_else(|| unmeasured_serial_fraction(job));
    (latency, serial)
}

/// The serial fraction where no worker's wall times tell it (each one's
/// communication twenty times its computation or more, as behind a
/// starved server): what the worker's loop does by construction. A
/// pipelined worker computes while its pulls and pushes are in flight
/// (0), the CPU both take being priced in its computation already; a
/// serial one pulls, computes and pushes one after the other (1). Taken
/// as 1 for a pipelined job, it priced the fast workers of a
/// configuration that had them all waiting on one 32 Mbit/s server at
/// their computation plus their transfers, 0.88 s an epoch for a split
/// that then ran at 0.54 s.
fn unmeasured_serial_fraction(job: &JobFacts) -> f64 {
    if job.pipeline_depth > 0 { 0.0 } else { 1.0 }
}

/// Per container, a measured figure of its metrics, snapped (see [`snap`]).
fn snapped(
    evals: &[EvalFacts],
    m: &Metrics,
    tol: f64,
    figure: impl Fn(&super::metrics::EvalMetrics) -> Option<f64>,
) -> Vec<Option<f64>> {
    let mut v: Vec<Option<f64>> = evals
        .iter()
        .map(|e| m.get(e.id).and_then(&figure))
        .collect();
    snap(&mut v, tol);
    v
}

/// Per-container costs from measured ones: their mean per unit of CPU speed
/// (`cost · speed`), scaled back by each measured container's speed; `None`
/// where nothing was measured. Differences between workers in training come
/// from who shares a core with whom at the moment; the calibration is what
/// tells containers apart.
fn by_speed(raw: &[Option<f64>], speed: &[Option<f64>]) -> Vec<Option<f64>> {
    let unit = mean(
        raw.iter()
            .zip(speed)
            .filter_map(|(c, s)| Some((*c)? * s.unwrap_or(1.0))),
    );
    raw.iter()
        .zip(speed)
        .map(|(c, s)| c.and(unit).map(|k| k / s.unwrap_or(1.0)))
        .collect()
}

/// The median (the mean of the middle two of an even count); `None` when empty.
fn median(v: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The `f` with `batch = max(comp, comm) + f · min(comp, comm)`, clamped to
/// `[0, 1]`; `None` when one part is too small beside the other (under 5%)
/// to tell how much of it overlaps.
fn serial_fraction(comp: f64, comm: f64, batch: f64) -> Option<f64> {
    let (lo, hi) = (comp.min(comm), comp.max(comm));
    if !(lo > 0.0 && lo >= 0.05 * hi && batch.is_finite()) {
        return None;
    }
    Some(((batch - hi) / lo).clamp(0.0, 1.0))
}

/// Per evaluator (in `evals` order), what the snapshot says of it.
#[derive(Clone, Copy)]
struct PerContainer<'a> {
    comp: &'a [Option<f64>],
    requests: &'a [Option<f64>],
    speed: &'a [Option<f64>],
    bw: &'a [Option<f64>],
    serve: &'a [Option<f64>],
    serve_fixed: &'a [Option<f64>],
}

fn assemble(
    job: &JobFacts,
    evals: &[EvalFacts],
    m: &Metrics,
    per: PerContainer<'_>,
    draw_bw: f64,
    bytes: Bytes,
) -> (Snapshot, Configuration) {
    let PerContainer {
        comp,
        requests,
        speed,
        bw,
        serve,
        serve_fixed,
    } = per;
    let draw_speed = expected_draw(
        speed
            .iter()
            .flatten()
            .copied()
            .chain(m.departed().iter().filter_map(|d| d.cpu_speed)),
    );
    let mut containers = Vec::new();
    let mut config = Configuration::default();
    for (i, e) in evals.iter().enumerate() {
        let em = m.get(e.id);
        containers.push(ContainerMetrics {
            id: ContainerName::Evaluator(e.id).to_string(),
            role: e.role,
            compute_secs_per_record: comp[i],
            cpu_speed: speed[i],
            bandwidth_bytes_per_sec: bw[i].unwrap_or(draw_bw),
            server_secs_per_byte: serve[i],
            request_secs_per_server: requests[i],
            server_secs_per_mini_batch: serve_fixed[i],
            input_blocks: e.input.len() as u32,
            model_blocks: e.model.len() as u32,
            mini_batches: em.map_or(0, |x| x.batches),
            reclaimed: e.reclaimed,
        });
        config.containers.insert(
            ContainerName::Evaluator(e.id).to_string(),
            Holding {
                role: e.role,
                input: e.input.clone(),
                model: e.model.clone(),
            },
        );
    }
    for k in 0..job.spare {
        containers.push(ContainerMetrics::offered(
            ContainerName::Offer(k).to_string(),
            draw_speed,
            draw_bw,
        ));
        config.containers.insert(
            ContainerName::Offer(k).to_string(),
            Holding {
                role: Role::Idle,
                input: BTreeSet::new(),
                model: BTreeSet::new(),
            },
        );
    }
    // Pairwise links are left out: the per-server samples of a mini-batch
    // overlap in time, so each understates its link; the per-node figures
    // above carry what was measured.
    let links = Vec::new();
    let snapshot = Snapshot {
        job: Job {
            total_records: job.records,
            mini_batch_size: u64::from(job.mini_batch),
            bytes_per_mini_batch: bytes.all,
            link_bytes_per_mini_batch: bytes.link,
            input_blocks: job.input_blocks,
            model_blocks: job.model_blocks,
            remaining_epochs: job.remaining_epochs,
            input_bytes: job.input_bytes,
            model_bytes: job.model_bytes,
            serial_fraction: 1.0,
            latency_secs_per_mini_batch: 0.0,
            measured_epoch_secs: None,
            asynchronous: job.asynchronous,
            queued_fit: None,
        },
        containers,
        links,
        // The AM adds its policy (it owns it).
        policy: None,
    };
    (snapshot, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snap_evens_out_noise_only() {
        let mut v = vec![Some(1.0), None, Some(1.2)];
        snap(&mut v, 0.25);
        assert_eq!(v, vec![Some(1.1), None, Some(1.1)]);
        let mut v = vec![Some(1.0), Some(2.0)];
        snap(&mut v, 0.25);
        assert_eq!(v, vec![Some(1.0), Some(2.0)], "a real difference stays");
        // Two kinds of containers, each measured with noise: the kinds stay
        // apart, the noise within each goes.
        let mut v = vec![Some(4.2), Some(1.1), None, Some(0.9), Some(4.0), Some(1.0)];
        snap(&mut v, 0.25);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
        assert!(close(v[0], 4.1) && close(v[4], 4.1), "{v:?}");
        assert!(
            close(v[1], 1.0) && close(v[3], 1.0) && close(v[5], 1.0),
            "{v:?}"
        );
        assert_eq!(v[2], None);
        // A group is anchored at its smallest value: no chain of small steps
        // merges values far apart.
        let mut v = vec![Some(1.0), Some(1.2), Some(1.44), Some(1.73)];
        snap(&mut v, 0.25);
        assert!(close(v[0], 1.1) && close(v[1], 1.1), "{v:?}");
        assert!(close(v[2], 1.585) && close(v[3], 1.585), "{v:?}");
    }

    fn facts(
        id: EvaluatorId,
        role: Role,
        input: &[u32],
        model: &[u32],
        reclaimed: bool,
    ) -> EvalFacts {
        EvalFacts {
            id,
            role,
            input: input.iter().copied().collect(),
            model: model.iter().copied().collect(),
            reclaimed,
        }
    }

    fn job_facts(input_blocks: u32, model_blocks: u32, spare: usize) -> JobFacts {
        JobFacts {
            records: 100,
            mini_batch: 10,
            input_blocks,
            model_blocks,
            remaining_epochs: 4.0,
            input_bytes: 1000,
            model_bytes: 2000,
            spare,
            noise_tolerance: 0.25,
            bandwidth_noise_tolerance: 1.0,
            pipeline_depth: 0,
            asynchronous: false,
        }
    }

    /// Links carry pulls and pushes at once: the snapshot prices the busier
    /// direction, the servers all of it.
    #[test]
    fn link_bytes_are_the_busier_direction() {
        use cruise_container::protocol::{MiniBatchReport, Stats};
        let mut m = Metrics::new(4, 0);
        for (pull, push) in [(300, 100), (500, 100)] {
            let r = MiniBatchReport {
                mini_batches: 1,
                stats: Stats {
                    records: 10,
                    ..Stats::default()
                },
                comp_secs: 0.01,
                pull_secs: 0.01,
                pull_bytes: pull,
                push_secs: 0.01,
                push_bytes: push,
                timed_pulls: 1,
                timed_pushes: 1,
                ..MiniBatchReport::default()
            };
            m.mini_batch(EvaluatorId(1), &r, &[]);
        }
        let s = one_worker_one_server(&m);
        assert_eq!(s.job.bytes_per_mini_batch, 500.0);
        assert_eq!(s.job.link_bytes_per_mini_batch, Some(400.0));
    }

    /// The running configuration's measured epoch: asynchronous workers
    /// share the data set by their throughput, synchronised ones wait for
    /// the slowest; nothing before every worker with input has measured, and
    /// nothing again right after a reconfiguration.
    #[test]
    fn measured_epoch_is_the_workers_throughput_since_the_configuration_began() {
        use cruise_container::protocol::MiniBatchReport;
        let report = |mini_batches: u32, batch_secs: f64| MiniBatchReport {
            mini_batches,
            batch_secs,
            ..MiniBatchReport::default()
        };
        // 100 records in 4 blocks of 25, mini-batches of 10.
        let evals = vec![
            facts(EvaluatorId(1), Role::Worker, &[0, 1, 2], &[], false),
            facts(EvaluatorId(2), Role::Server, &[], &[0], false),
            facts(EvaluatorId(3), Role::Worker, &[3], &[], false),
        ];
        let epoch = |m: &Metrics, asynchronous: bool| {
            let job = JobFacts {
                asynchronous,
                ..job_facts(4, 1, 0)
            };
            build_snapshot(job, &evals, m).0.job.measured_epoch_secs
        };
        let mut m = Metrics::new(4, 0);
        // Worker 1: 0.01 s a mini-batch, 1000 records a second.
        m.mini_batch(EvaluatorId(1), &report(2, 0.02), &[]);
        m.mini_batch(EvaluatorId(1), &report(2, 0.02), &[]);
        assert_eq!(epoch(&m, true), None, "worker 3 has not measured");
        // Worker 3: 0.04 s a mini-batch, 250 records a second.
        m.mini_batch(EvaluatorId(3), &report(2, 0.08), &[]);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
        // 100 records at 1250 a second.
        assert!(close(epoch(&m, true), 0.08), "{:?}", epoch(&m, true));
        // Worker 1: 7.5 mini-batches at 0.01 s; worker 3: 2.5 at 0.04 s.
        assert!(close(epoch(&m, false), 0.1), "{:?}", epoch(&m, false));
        m.reset_after_reconfiguration();
        assert_eq!(
            epoch(&m, true),
            None,
            "a new configuration is measured anew"
        );
    }

    /// A link is priced at no less than it carried in training: a probe
    /// that read 10 MB/s between a worker and its server gives way to the
    /// 20 MB/s the worker's mini-batches drew (1 MB each way in 0.05 s),
    /// for both ends; a faster probe stands.
    #[test]
    fn a_link_is_priced_at_least_at_what_it_carried() {
        use cruise_container::protocol::MiniBatchReport;
        let bandwidths = |probe: f64| {
            let mut m = Metrics::new(4, 0);
            m.bulk(
                EvaluatorId(1),
                EvaluatorId(2),
                10 << 20,
                (10 << 20) as f64 / probe,
            );
            let r = MiniBatchReport {
                mini_batches: 4,
                batch_secs: 0.2,
                pull_bytes: 4_000_000,
                push_bytes: 4_000_000,
                ..MiniBatchReport::default()
            };
            m.mini_batch(EvaluatorId(1), &r, &[]);
            one_worker_one_server(&m)
                .containers
                .iter()
                .map(|c| c.bandwidth_bytes_per_sec)
                .collect::<Vec<_>>()
        };
        let close = |v: Vec<f64>, b: f64| v.iter().all(|x| (x - b).abs() < 1e-6 * b);
        assert!(close(bandwidths(1e7), 2e7), "{:?}", bandwidths(1e7));
        assert!(close(bandwidths(1e8), 1e8), "{:?}", bandwidths(1e8));
    }

    /// A server holding `l` of `L` model blocks carries `l / L` of what
    /// every worker draws.
    #[test]
    fn a_server_carries_its_share_of_every_workers_bytes() {
        use cruise_container::protocol::MiniBatchReport;
        let evals = vec![
            facts(EvaluatorId(1), Role::Worker, &[0], &[], false),
            facts(EvaluatorId(2), Role::Worker, &[1], &[], false),
            facts(EvaluatorId(3), Role::Server, &[], &[0, 1, 2], false),
            facts(EvaluatorId(4), Role::Server, &[], &[3], false),
        ];
        let mut m = Metrics::new(4, 0);
        // 1 MB a mini-batch on the busier direction: 10 and 30 MB/s.
        for (id, secs) in [(1, 0.1), (2, 0.1 / 3.0)] {
            let r = MiniBatchReport {
                mini_batches: 1,
                batch_secs: secs,
                pull_bytes: 1_000_000,
                push_bytes: 400_000,
                ..MiniBatchReport::default()
            };
            m.mini_batch(EvaluatorId(id), &r, &[]);
        }
        let c = carried_bytes_per_sec(&job_facts(2, 4, 0), &evals, &m);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-6 * b);
        assert!(close(c[0], 1e7) && close(c[1], 3e7), "{c:?}");
        assert!(close(c[2], 3e7) && close(c[3], 1e7), "{c:?}");
    }

    /// The snapshot of evaluator 1 working on input block 0 and evaluator 2
    /// serving model block 0.
    fn one_worker_one_server(m: &Metrics) -> Snapshot {
        let evals = vec![
            facts(EvaluatorId(1), Role::Worker, &[0], &[], false),
            facts(EvaluatorId(2), Role::Server, &[], &[0], false),
        ];
        build_snapshot(job_facts(1, 1, 0), &evals, m).0
    }

    /// A worker's own time beyond its computation comes with every
    /// mini-batch whoever serves: it is priced in its seconds per record.
    #[test]
    fn own_time_is_priced_per_record() {
        use cruise_container::protocol::{MiniBatchReport, Stats};
        let per_record = |own: f64| {
            let mut m = Metrics::new(4, 0);
            for _ in 0..4 {
                let r = MiniBatchReport {
                    mini_batches: 2,
                    stats: Stats {
                        records: 20,
                        ..Stats::default()
                    },
                    comp_secs: 0.002,
                    batch_secs: 0.010,
                    wait_secs: 0.008,
                    cpu_wall_secs: own,
                    timed_pulls: 2,
                    timed_pushes: 2,
                    ..MiniBatchReport::default()
                };
                m.mini_batch(EvaluatorId(1), &r, &[]);
            }
            one_worker_one_server(&m).containers[0]
                .compute_secs_per_record
                .unwrap()
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} != {b}");
        // 1 ms of computation per 10-record mini-batch...
        close(per_record(0.002), 1e-4);
        // ...and 3 ms of own time: three times the seconds per record.
        close(per_record(0.006), 3e-4);
        // Own time is never taken as less than the computation.
        close(per_record(0.001), 1e-4);
    }

    #[test]
    fn names_round_trip() {
        for name in [
            ContainerName::Evaluator(EvaluatorId(12)),
            ContainerName::Offer(0),
        ] {
            assert_eq!(ContainerName::parse(&name.to_string()), Some(name));
        }
        assert_eq!(
            ContainerName::parse("e12"),
            Some(ContainerName::Evaluator(EvaluatorId(12)))
        );
        assert_eq!(ContainerName::parse("new3"), Some(ContainerName::Offer(3)));
        for other in ["x1", "e", "e+1", "e1x", "new", "new1x", "renew1", "E1"] {
            assert_eq!(ContainerName::parse(other), None, "{other}");
        }
    }

    #[test]
    fn snapshot_agrees_with_configuration() {
        let mut m = Metrics::new(4, 0);
        m.cpu_speed(EvaluatorId(1), 2.0);
        m.cpu_speed(EvaluatorId(2), 4.0);
        m.link(EvaluatorId(1), EvaluatorId(2), 1 << 20, 0.01);
        let evals = vec![
            facts(EvaluatorId(1), Role::Worker, &[0, 1], &[], false),
            facts(EvaluatorId(2), Role::Server, &[], &[0, 1, 2], true),
        ];
        let (s, c) = build_snapshot(job_facts(2, 3, 1), &evals, &m);
        assert_eq!(s.containers.len(), 3);
        assert_eq!(c.containers.len(), 3);
        let new = &s.containers[2];
        assert_eq!((new.id.as_str(), new.role), ("new0", Role::Idle));
        assert_eq!(
            new.cpu_speed,
            Some(2.0 / (1.0 / 2.0 + 1.0 / 4.0)),
            "a new container costs the mean of the seen containers' costs"
        );
        assert_eq!(
            s.containers[0].cpu_speed,
            Some(2.0),
            "2 and 4 differ by more than noise"
        );
        assert!(s.containers[1].reclaimed);
        assert!(
            s.links.is_empty(),
            "overlapping per-server samples are not links"
        );
        for (name, h) in &c.containers {
            let cm = s.containers.iter().find(|x| &x.id == name).unwrap();
            assert_eq!(
                (cm.role, cm.input_blocks, cm.model_blocks),
                (h.role, h.input.len() as u32, h.model.len() as u32)
            );
        }
    }

    /// A new container is priced as one drawn like every container the job
    /// has seen, also those it released: releasing its slow containers does
    /// not make the next ones fast.
    #[test]
    fn a_new_container_is_drawn_like_the_containers_seen_before() {
        const MB: f64 = 1e6;
        let mut m = Metrics::new(4, 0);
        for id in 1..=3 {
            m.cpu_speed(EvaluatorId(id), 1.0);
        }
        // Bulk transfers: 1 and 2 at 100 MB/s, 3 at 4 MB/s.
        m.bulk(EvaluatorId(1), EvaluatorId(2), 100_000_000, 1.0);
        m.bulk(EvaluatorId(3), EvaluatorId(1), 4_000_000, 1.0);
        m.forget(EvaluatorId(3));
        assert_eq!(m.departed().len(), 1);
        let evals = vec![
            facts(EvaluatorId(1), Role::Worker, &[0, 1], &[], false),
            facts(EvaluatorId(2), Role::Server, &[], &[0, 1, 2], false),
        ];
        let (s, _) = build_snapshot(job_facts(2, 3, 1), &evals, &m);
        let new = &s.containers[2];
        assert_eq!(new.role, Role::Idle);
        // (1/100 + 1/100 + 1/4) / 3 seconds per MB: 11.1 MB/s, not the
        // 100 MB/s of the two held, nor their mean with it (68 MB/s).
        let expected = 3.0 / (2.0 / (100.0 * MB) + 1.0 / (4.0 * MB));
        assert!(
            (new.bandwidth_bytes_per_sec - expected).abs() < 1e-6 * expected,
            "{} vs {expected}",
            new.bandwidth_bytes_per_sec
        );
    }

    #[test]
    fn serial_fraction_from_wall_times() {
        // Serial worker: the mini-batch takes compute plus communication.
        assert_eq!(serial_fraction(1.0, 0.5, 1.5), Some(1.0));
        // Pipelined: the shorter part is hidden but for a little.
        let f = serial_fraction(1.0, 0.5, 1.1).unwrap();
        assert!((f - 0.2).abs() < 1e-12, "{f}");
        assert_eq!(serial_fraction(0.5, 1.0, 1.0), Some(0.0));
        // Clamped: overheads beyond the sum, or a wall time under the longer part.
        assert_eq!(serial_fraction(1.0, 0.5, 2.0), Some(1.0));
        assert_eq!(serial_fraction(1.0, 0.5, 0.9), Some(0.0));
        // One part too small to tell.
        assert_eq!(serial_fraction(1.0, 0.01, 1.0), None);
        assert_eq!(serial_fraction(0.0, 1.0, 1.0), None);
    }

    /// A worker holding input block `block`.
    fn test_worker(id: EvaluatorId, block: u32) -> EvalFacts {
        EvalFacts {
            id,
            role: Role::Worker,
            input: [block].into(),
            model: BTreeSet::new(),
            reclaimed: false,
        }
    }

    /// A server holding model block 0.
    fn test_server(id: EvaluatorId) -> EvalFacts {
        EvalFacts {
            id,
            role: Role::Server,
            input: BTreeSet::new(),
            model: [0].into(),
            reclaimed: false,
        }
    }

    /// A synchronous job of `workers` input blocks of 1000 records, one
    /// model block, mini-batches of 100.
    fn test_job(workers: u32, pipeline_depth: u32) -> JobFacts {
        JobFacts {
            records: 1000 * u64::from(workers),
            mini_batch: 100,
            input_blocks: workers,
            model_blocks: 1,
            remaining_epochs: 4.0,
            input_bytes: 0,
            model_bytes: 0,
            spare: 0,
            noise_tolerance: 0.25,
            bandwidth_noise_tolerance: 1.0,
            pipeline_depth,
            asynchronous: false,
        }
    }

    /// A report of 10 mini-batches of 100 records, each computing for 4 ms
    /// and exchanging 1 MB (half each way) in pull and push round trips of
    /// `rtt` seconds, in `batch` wall seconds.
    fn ten_mini_batches(rtt: f64, batch: f64) -> cruise_container::protocol::MiniBatchReport {
        cruise_container::protocol::MiniBatchReport {
            mini_batches: 10,
            stats: cruise_container::protocol::Stats {
                records: 1000,
                ..Default::default()
            },
            comp_secs: 0.040,
            pull_secs: 10.0 * rtt,
            pull_bytes: 5_000_000,
            push_secs: 10.0 * rtt,
            push_bytes: 5_000_000,
            batch_secs: 10.0 * batch,
            // The worker waits for all but its computation, which is all
            // of its CPU.
            wait_secs: 10.0 * (batch - 0.004).max(0.0),
            cpu_wall_secs: 0.040,
            timed_pulls: 10,
            timed_pushes: 10,
            ..Default::default()
        }
    }

    /// A bulk probe of 100 MiB from evaluator `w` to server 2 at 1 GB/s.
    fn link_to_server_2(m: &mut Metrics, w: u32) {
        m.bulk(
            EvaluatorId(w),
            EvaluatorId(2),
            100 << 20,
            (100 << 20) as f64 / 1e9,
        );
    }

    /// Workers 1, 3 and 4 with an input block each, and server 2.
    fn three_workers_and_a_server() -> Vec<EvalFacts> {
        vec![
            test_worker(EvaluatorId(1), 0),
            test_server(EvaluatorId(2)),
            test_worker(EvaluatorId(3), 1),
            test_worker(EvaluatorId(4), 2),
        ]
    }

    /// Three workers and a server: one starved worker waiting 100 times
    /// longer than the others does not set the latency charged to all.
    #[test]
    fn a_starved_worker_is_not_the_jobs_latency() {
        let evals = three_workers_and_a_server();
        let facts = test_job(3, 0);
        let mut m = Metrics::new(8, 0);
        for w in [1, 3, 4] {
            link_to_server_2(&mut m, w);
        }
        // Round trips of 1.5 ms (pull and push) where 0.5 ms are predicted
        // for both; worker 4 waits 150 ms for each.
        for (w, rtt) in [(1, 0.0015), (3, 0.0015), (4, 0.150)] {
            for _ in 0..8 {
                m.mini_batch(
                    EvaluatorId(w),
                    &ten_mini_batches(rtt, 0.004 + 2.0 * rtt),
                    &[],
                );
            }
        }
        let job = build_snapshot(facts, &evals, &m).0.job;
        // The median worker's excess: 3 ms measured, 1.5 ms predicted (the
        // three workers' megabytes through the server's 1 GB/s). The mean
        // would be 100 ms.
        assert!(
            (job.latency_secs_per_mini_batch - 0.0015).abs() < 1e-6,
            "{job:?}"
        );
        assert!((job.serial_fraction - 1.0).abs() < 1e-9, "{job:?}");
    }

    /// Three alike serial workers and a server, each waiting 3 ms a
    /// mini-batch for its round trips. The solvers' bound charges each all
    /// three workers' megabytes at the server (1.5 ms), so 1.5 ms is
    /// latency. An asynchronous job's throughput queues a worker's answer
    /// only behind the requests the others have there as they come: with
    /// 4 ms of computation and `s` = 0.5 ms at the server, `R = s·(1 +
    /// 2·Q)`, `Q = R / (4 + R)` (ms) gives `R² + 2.5·R − 2 = 0`, R =
    /// 0.6375 ms, and the rest of the 3 ms, 2.3625 ms, is the latency it
    /// prices with: what it does not explain of the configuration.
    #[test]
    fn an_asynchronous_jobs_latency_is_what_its_queues_do_not_explain() {
        let evals = three_workers_and_a_server();
        let latency = |asynchronous: bool| {
            let mut m = Metrics::new(8, 0);
            for w in [1, 3, 4] {
                link_to_server_2(&mut m, w);
                for _ in 0..8 {
                    m.mini_batch(EvaluatorId(w), &ten_mini_batches(0.0015, 0.007), &[]);
                }
            }
            let facts = JobFacts {
                asynchronous,
                ..test_job(3, 0)
            };
            build_snapshot(facts, &evals, &m).0.job
        };
        let clocked = latency(false);
        assert!(
            (clocked.latency_secs_per_mini_batch - 0.0015).abs() < 1e-6,
            "{clocked:?}"
        );
        assert_eq!(clocked.queued_fit, None);
        let free = latency(true);
        assert!(
            (free.latency_secs_per_mini_batch - 0.0015).abs() < 1e-6,
            "{free:?}"
        );
        let queued = free.queued_fit.expect("an asynchronous job's queued fit");
        let r = (-2.5 + (2.5f64 * 2.5 + 8.0).sqrt()) / 2.0 * 1e-3;
        assert!(
            (queued.latency_secs_per_mini_batch - (0.003 - r)).abs() < 1e-6,
            "{free:?}"
        );
        assert!((queued.serial_fraction - 1.0).abs() < 1e-9, "{free:?}");
    }

    /// A worker's request cost off its loop is divided among the servers
    /// holding blocks, however deep it pulls.
    #[test]
    fn request_cost_is_priced_per_server_of_the_running_split() {
        let per_server = |depth: u32, servers: u32| {
            let mut evals = vec![test_worker(EvaluatorId(1), 0), test_server(EvaluatorId(2))];
            evals.extend((1..servers).map(|k| EvalFacts {
                model: BTreeSet::new(),
                ..test_server(EvaluatorId(2 + k))
            }));
            // The model's one block on the first server; the others hold
            // none and are not asked.
            let mut m = Metrics::new(8, 0);
            link_to_server_2(&mut m, 1);
            for _ in 0..8 {
                let mut r = ten_mini_batches(0.0015, 0.007);
                // 5 ms of own time a mini-batch, 1 ms of it for the requests.
                r.cpu_wall_secs = 0.05;
                r.io_secs = 0.01;
                m.mini_batch(EvaluatorId(1), &r, &[]);
            }
            build_snapshot(test_job(1, depth), &evals, &m).0.containers[0]
                .request_secs_per_server
                .unwrap()
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} != {b}");
        close(per_server(2, 1), 0.001);
        close(per_server(8, 1), 0.001);
        close(per_server(8, 3), 0.001);
    }

    /// A worker and a server with measured mini-batches: the snapshot's
    /// latency is the round trip beyond the bandwidth's prediction, and its
    /// serial fraction comes from the mini-batches' wall time.
    #[test]
    fn snapshot_measures_latency_and_overlap() {
        let evals = vec![test_worker(EvaluatorId(1), 0), test_server(EvaluatorId(2))];
        let job = |pipeline_depth| test_job(1, pipeline_depth);
        // 1 MB per mini-batch, half each way, over a 1 GB/s link (each
        // direction): 0.5 ms predicted; measured round trips 1.5 ms for the
        // pull and as much for the push; compute 4 ms per mini-batch.
        let measured = |pipeline_depth: u32, batch_secs: f64| {
            let mut m = Metrics::new(8, 0);
            link_to_server_2(&mut m, 1);
            for _ in 0..8 {
                m.mini_batch(EvaluatorId(1), &ten_mini_batches(0.0015, batch_secs), &[]);
            }
            build_snapshot(job(pipeline_depth), &evals, &m).0.job
        };
        // A serial worker waits for both round trips: 3 ms for a predicted 0.5.
        let serial = measured(0, 0.007);
        assert!(
            (serial.latency_secs_per_mini_batch - 0.0025).abs() < 1e-6,
            "{serial:?}"
        );
        assert!((serial.serial_fraction - 1.0).abs() < 1e-9, "{serial:?}");
        // A pipelined one, 2 deep, for half its pull's round trip: 0.75 ms.
        // Its 4.5 ms a mini-batch are max(4, 0.75) + f · 0.75 with f = 2/3.
        let piped = measured(2, 0.0045);
        assert!(
            (piped.latency_secs_per_mini_batch - 0.00025).abs() < 1e-6,
            "{piped:?}"
        );
        assert!(
            (piped.serial_fraction - 2.0 / 3.0).abs() < 1e-6,
            "{piped:?}"
        );
        // 4 deep: a quarter of 1.5 ms is less than the 0.5 ms the links
        // explain, so no latency is left over.
        let deep = measured(4, 0.0045);
        assert!(deep.latency_secs_per_mini_batch.abs() < 1e-9, "{deep:?}");
    }

    /// The fitted latency is scaled down to what the measured epoch needs:
    /// a serial worker computing 4 ms and moving 0.5 ms a mini-batch, its
    /// fit 2 ms of latency, 10 mini-batches an epoch, is priced at 0.045 s
    /// plus 0.02 s a share. Measured at 0.05 s, a quarter of the latency
    /// explains it; at 0.04 s none is needed; at 0.07 s the whole fit is
    /// kept (what it does not explain is not latency's to explain).
    #[test]
    fn the_fits_are_scaled_to_what_the_epoch_needs() {
        let evals = vec![test_worker(EvaluatorId(1), 0), test_server(EvaluatorId(2))];
        let mut m = Metrics::new(8, 0);
        link_to_server_2(&mut m, 1);
        for _ in 0..8 {
            m.mini_batch(EvaluatorId(1), &ten_mini_batches(0.0, 0.0045), &[]);
        }
        let (mut snapshot, config) = build_snapshot(test_job(1, 0), &evals, &m);
        snapshot.job.latency_secs_per_mini_batch = 0.002;
        snapshot.job.serial_fraction = 1.0;
        let share = |measured| least_waits_that_explain(&snapshot, &config, measured, false);
        assert!((share(0.05) - 0.25).abs() < 1e-6, "{}", share(0.05));
        assert_eq!(share(0.04), 0.0);
        assert_eq!(share(0.07), 1.0);
        let mut scaled = snapshot.clone();
        scale_waits(&mut scaled, 0.25, false);
        assert!((scaled.job.latency_secs_per_mini_batch - 0.0005).abs() < 1e-12);
        assert_eq!(scaled.job.serial_fraction, 1.0, "a serial worker's stays 1");
    }

    /// A worker whose round trips are a hundred times its computation (a
    /// starved server's) cannot tell its overlap: a pipelined one is priced
    /// as overlapping (0), a serial one as adding up (1).
    #[test]
    fn an_unmeasurable_overlap_is_the_workers_own() {
        let evals = vec![test_worker(EvaluatorId(1), 0), test_server(EvaluatorId(2))];
        let fraction = |pipeline_depth: u32| {
            let mut m = Metrics::new(8, 0);
            link_to_server_2(&mut m, 1);
            for _ in 0..8 {
                m.mini_batch(EvaluatorId(1), &ten_mini_batches(0.5, 0.5), &[]);
            }
            let job = build_snapshot(test_job(1, pipeline_depth), &evals, &m)
                .0
                .job;
            (job.serial_fraction, job.latency_secs_per_mini_batch)
        };
        let (piped, latency) = fraction(2);
        assert_eq!(piped, 0.0);
        assert!(latency > 0.2, "the wait is latency: {latency}");
        assert_eq!(fraction(0).0, 1.0);
    }
}
