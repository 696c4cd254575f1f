//! What the AM measures about a running job, for the optimizer.
//!
//! Owned by the job's event loop. Workers report every mini-batch (compute
//! time and records, pull and push time and bytes, and per-peer transfer
//! samples); servers report periodically (requests served, busy time, bytes);
//! every evaluator reports its CPU speed (a calibration at start) and block
//! moves report their bytes and time. Each figure is smoothed over a sliding
//! window. A worker's first mini-batches (warm-up) and its first after each
//! reconfiguration are not counted. Bandwidth between two evaluators is
//! measured from their real transfers, never configured.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use cruise_container::protocol::{EvaluatorId, LinkSample, MiniBatchReport, ServerReport};

/// A sliding window of samples, each with a weight.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// `(value × weight, weight)`.
    samples: VecDeque<(f64, f64)>,
    cap: usize,
}

impl Window {
    /// A window of at most `cap` samples.
    pub fn new(cap: usize) -> Self {
        Window {
            samples: VecDeque::with_capacity(cap),
            cap: cap.max(1),
        }
    }

    /// Adds a sample of weight 1 (non-finite ones are dropped).
    pub fn push(&mut self, v: f64) {
        self.push_weighted(v, 1.0);
    }

    /// Adds a sample that stands for `weight` of what is averaged: a
    /// report's figure per mini-batch, weighted by its mini-batches. The
    /// mean is then the window's total over its total weight. An unweighted
    /// mean of reports' averages counts a report of one slow mini-batch as
    /// much as one of ten fast ones: a lone worker whose reports (every 20
    /// ms) held 1 to 10 pipelined mini-batches read 2.9 ms a mini-batch
    /// where its epochs took 2.3 ms one. Non-finite values and weights that
    /// are not positive are dropped.
    pub fn push_weighted(&mut self, v: f64, weight: f64) {
        if !(v.is_finite() && weight.is_finite() && weight > 0.0) {
            return;
        }
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back((v * weight, weight));
    }

    /// The weighted mean, if any samples.
    pub fn mean(&self) -> Option<f64> {
        let (sum, weight) = self
            .samples
            .iter()
            .fold((0.0, 0.0), |(s, w), &(vw, x)| (s + vw, w + x));
        (weight > 0.0).then(|| sum / weight)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Forgets all samples.
    pub fn clear(&mut self) {
        self.samples.clear();
    }
}

/// A worker's reports over a sliding window, summed in the parts its own
/// time is taken from ([`cruise_container::ps::own_secs`]): its CPU at its
/// share is bounded by its wall time over the window, not per report.
/// Under a CPU quota a worker spends its CPU in bursts at a core's speed,
/// and one report's mini-batches may take less wall time than their CPU
/// costs at the quota while the next report's wait out the quota's period.
#[derive(Debug, Clone, Default)]
pub struct OwnWindow {
    samples: VecDeque<OwnParts>,
    cap: usize,
}

/// Sums of one or more reports (see [`OwnWindow`]), seconds.
#[derive(Debug, Clone, Copy, Default)]
struct OwnParts {
    mini_batches: f64,
    batch: f64,
    wait: f64,
    comp: f64,
    cpu_wall: f64,
    io: f64,
}

impl OwnWindow {
    /// A window of at most `cap` reports.
    pub fn new(cap: usize) -> Self {
        OwnWindow {
            samples: VecDeque::with_capacity(cap),
            cap: cap.max(1),
        }
    }

    /// Adds a report of mini-batches that took wall time.
    pub fn push(&mut self, r: &MiniBatchReport) {
        let parts = OwnParts {
            mini_batches: f64::from(r.mini_batches.max(1)),
            batch: r.batch_secs,
            wait: r.wait_secs,
            comp: r.comp_secs,
            cpu_wall: r.cpu_wall_secs,
            io: r.io_secs,
        };
        let finite = [
            parts.batch,
            parts.wait,
            parts.comp,
            parts.cpu_wall,
            parts.io,
        ]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0);
        if !finite || parts.batch <= 0.0 {
            return;
        }
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back(parts);
    }

    /// Forgets all reports.
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    fn sums(&self) -> Option<OwnParts> {
        let s = self
            .samples
            .iter()
            .fold(OwnParts::default(), |a, p| OwnParts {
                mini_batches: a.mini_batches + p.mini_batches,
                batch: a.batch + p.batch,
                wait: a.wait + p.wait,
                comp: a.comp + p.comp,
                cpu_wall: a.cpu_wall + p.cpu_wall,
                io: a.io + p.io,
            });
        (s.mini_batches > 0.0).then_some(s)
    }

    /// The worker's own seconds per mini-batch over the window.
    pub fn own_secs_per_batch(&self) -> Option<f64> {
        let s = self.sums()?;
        Some(s.own() / s.mini_batches)
    }

    /// Of that, the seconds of its requests that grow with the servers
    /// (`cruise_container::ps::io_secs`), per mini-batch.
    pub fn io_secs_per_batch(&self) -> Option<f64> {
        let s = self.sums()?;
        Some(s.io.min(s.own()) / s.mini_batches)
    }
}

impl OwnParts {
    /// The own seconds of these sums ([`cruise_container::ps::own_secs`]).
    fn own(&self) -> f64 {
        cruise_container::ps::own_secs(self.batch, self.wait, self.comp, self.cpu_wall, 1.0)
    }
}

/// Smoothed measurements of one evaluator.
#[derive(Debug, Clone)]
pub struct EvalMetrics {
    /// Compute seconds per record (as a worker).
    pub comp_per_record: Window,
    /// Bytes pulled plus pushed per mini-batch.
    pub bytes_per_batch: Window,
    /// Bytes per mini-batch on the busier direction (the larger of pull and push).
    pub link_bytes_per_batch: Window,
    /// Round trip of the pull per mini-batch (what a pipelined worker waits
    /// on: its push's answer is not awaited).
    pub pull_secs_per_batch: Window,
    /// Round trip of the push per mini-batch (0 for one without a push).
    /// Pulls and pushes are timed in different mini-batches (see
    /// `MiniBatchReport::timed_pulls`), so each has its own window.
    pub push_secs_per_batch: Window,
    /// Compute seconds per mini-batch.
    pub comp_secs_per_batch: Window,
    /// Wall seconds per mini-batch in the worker's loop (compute, waits and
    /// the rest): what a mini-batch really costs when communication
    /// overlaps computation.
    pub batch_secs_per_batch: Window,
    /// The worker's own seconds per mini-batch, what it would take with
    /// answers arriving at once, and of that its requests' part that grows
    /// with the servers ([`OwnWindow`]).
    pub own: OwnWindow,
    /// Server seconds per byte served (the part of its work that grows
    /// with the bytes, at its CPU share).
    pub server_secs_per_byte: Window,
    /// Server seconds per mini-batch of each worker beyond its work per
    /// byte: what the requests themselves cost it.
    pub server_secs_per_mini_batch: Window,
    /// The job's worker mini-batches counted when this server last
    /// reported ([`Metrics::server`]).
    pub batches_at_report: Option<u64>,
    /// Mini-batches counted since the last reset.
    pub batches: u32,
    /// Their wall seconds in the worker's loop, summed: what the running
    /// configuration measures (`batches / batch_secs` mini-batches a
    /// second).
    pub batch_secs: f64,
    /// Mini-batches still to skip (warm-up, or after a reconfiguration).
    pub skip: u32,
    /// CPU speed from the calibration (arbitrary units; higher is faster).
    pub cpu_speed: Option<f64>,
}

impl EvalMetrics {
    /// Seconds pulling plus pushing per mini-batch (their round trips).
    pub fn comm_secs_per_batch(&self) -> Option<f64> {
        Some(self.pull_secs_per_batch.mean()? + self.push_secs_per_batch.mean()?)
    }
}

/// Running totals of what one evaluator reported since it joined (the
/// counters of `/metrics`): nothing is smoothed or skipped here.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EvalTotals {
    /// Evaluator id.
    pub id: EvaluatorId,
    /// Mini-batches it ran as a worker.
    pub mini_batches: u64,
    /// Records they trained on.
    pub records: u64,
    /// Seconds computing.
    pub compute_secs: f64,
    /// Seconds of timed pull round trips.
    pub pull_secs: f64,
    /// Seconds of timed push round trips.
    pub push_secs: f64,
    /// Bytes pulled.
    pub pull_bytes: u64,
    /// Bytes pushed.
    pub push_bytes: u64,
    /// Requests it served as a server.
    pub requests: u64,
    /// CPU seconds serving them (at its CPU share).
    pub serve_secs: f64,
    /// Bytes it received in requests.
    pub served_bytes_in: u64,
    /// Bytes it sent in answers.
    pub served_bytes_out: u64,
}

/// All of the job's measurements.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Running totals per evaluator.
    totals: BTreeMap<EvaluatorId, EvalTotals>,
    window: usize,
    warmup: u32,
    evals: BTreeMap<EvaluatorId, EvalMetrics>,
    /// Effective bandwidth per ordered pair (from, to), bytes per second,
    /// from mini-batch transfers (small, often latency-bound).
    links: BTreeMap<(EvaluatorId, EvaluatorId), Window>,
    /// Capacity per ordered pair from bulk transfers (probes and block moves).
    bulk: BTreeMap<(EvaluatorId, EvaluatorId), Window>,
    /// Capacity per evaluator from fan-out probes: it sends to every other
    /// member at once ([`Metrics::fan_out`]).
    fan_out: BTreeMap<EvaluatorId, Window>,
    /// Bytes and seconds of input loads (for the reload-or-move choice).
    load_bytes_per_sec: Window,
    /// Mini-batches all workers have reported, warm-up included.
    worker_batches: u64,
    /// What was measured of the evaluators that left: with those held now,
    /// what the resource manager's containers are like.
    departed: Vec<Departed>,
}

/// What was measured of an evaluator that left the job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Departed {
    /// Its capacity (bulk transfers), else its mini-batch transfers' rate, bytes/s.
    pub bandwidth: Option<f64>,
    /// Its CPU calibration.
    pub cpu_speed: Option<f64>,
}

/// A JSON view of the measurements (status endpoint, snapshot files).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MetricsView {
    /// Per evaluator.
    pub evaluators: Vec<EvalMetricsView>,
    /// Per measured link (mini-batch transfers).
    pub links: Vec<LinkView>,
    /// Per link measured by bulk transfers (probes and block moves).
    pub capacity: Vec<LinkView>,
    /// Per evaluator measured by fan-out probes (it sends to every other
    /// member at once).
    pub fan_out: Vec<FanOutView>,
    /// Running totals per evaluator (also of those that left).
    pub totals: Vec<EvalTotals>,
}

/// One evaluator's smoothed figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalMetricsView {
    /// Evaluator id.
    pub id: EvaluatorId,
    /// Compute seconds per record.
    pub comp_secs_per_record: Option<f64>,
    /// Bytes exchanged per mini-batch.
    pub bytes_per_mini_batch: Option<f64>,
    /// Communication seconds per mini-batch (round trips of pull and push).
    pub comm_secs_per_mini_batch: Option<f64>,
    /// Wall seconds per mini-batch in the worker's loop.
    pub batch_secs_per_mini_batch: Option<f64>,
    /// Of that, the worker's own (not waiting on answers).
    pub own_secs_per_mini_batch: Option<f64>,
    /// Of that, the seconds spent on its requests (off its loop thread).
    pub io_secs_per_mini_batch: Option<f64>,
    /// Server seconds per byte.
    pub server_secs_per_byte: Option<f64>,
    /// Mini-batches counted.
    pub mini_batches: u32,
    /// CPU speed from the calibration.
    pub cpu_speed: Option<f64>,
}

/// One evaluator's fan-out rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FanOutView {
    /// The sending evaluator.
    pub id: EvaluatorId,
    /// Bytes per second, to all members together.
    pub bytes_per_sec: f64,
}

/// One link's measured bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkView {
    /// Sender side of the measurement (the worker or the move source).
    pub from: EvaluatorId,
    /// The other side.
    pub to: EvaluatorId,
    /// Bytes per second.
    pub bytes_per_sec: f64,
}

impl Metrics {
    /// Empty metrics: windows of `window` samples, `warmup` mini-batches skipped.
    pub fn new(window: usize, warmup: u32) -> Self {
        Metrics {
            totals: BTreeMap::new(),
            window,
            warmup,
            evals: BTreeMap::new(),
            links: BTreeMap::new(),
            bulk: BTreeMap::new(),
            fan_out: BTreeMap::new(),
            load_bytes_per_sec: Window::new(window),
            worker_batches: 0,
            departed: Vec::new(),
        }
    }

    fn eval(&mut self, id: EvaluatorId) -> &mut EvalMetrics {
        let (w, warmup) = (self.window, self.warmup);
        self.evals.entry(id).or_insert_with(|| EvalMetrics {
            comp_per_record: Window::new(w),
            bytes_per_batch: Window::new(w),
            link_bytes_per_batch: Window::new(w),
            pull_secs_per_batch: Window::new(w),
            push_secs_per_batch: Window::new(w),
            comp_secs_per_batch: Window::new(w),
            batch_secs_per_batch: Window::new(w),
            own: OwnWindow::new(w),
            server_secs_per_byte: Window::new(w),
            server_secs_per_mini_batch: Window::new(w),
            batches_at_report: None,
            batches: 0,
            batch_secs: 0.0,
            skip: warmup,
            cpu_speed: None,
        })
    }

    /// An evaluator's metrics, if any.
    pub fn get(&self, id: EvaluatorId) -> Option<&EvalMetrics> {
        self.evals.get(&id)
    }

    /// Records the CPU calibration of an evaluator.
    pub fn cpu_speed(&mut self, id: EvaluatorId, speed: f64) {
        if speed.is_finite() && speed > 0.0 {
            self.eval(id).cpu_speed = Some(speed);
        }
    }

    /// Records a worker's report of one or more mini-batches (their totals).
    pub fn mini_batch(&mut self, id: EvaluatorId, r: &MiniBatchReport, links: &[LinkSample]) {
        self.worker_batches += u64::from(r.mini_batches);
        let t = self.totals.entry(id).or_insert_with(|| EvalTotals {
            id,
            ..EvalTotals::default()
        });
        t.mini_batches += u64::from(r.mini_batches);
        t.records += r.stats.records;
        t.compute_secs += r.comp_secs;
        t.pull_secs += r.pull_secs;
        t.push_secs += r.push_secs;
        t.pull_bytes += r.pull_bytes;
        t.push_bytes += r.push_bytes;
        let e = self.eval(id);
        let n = r.mini_batches.max(1);
        if e.skip > 0 {
            e.skip = e.skip.saturating_sub(n);
            return;
        }
        // Each figure is weighted by what it is an average over (see
        // Window::push_weighted).
        if r.stats.records > 0 {
            let records = r.stats.records as f64;
            e.comp_per_record
                .push_weighted(r.comp_secs / records, records);
        }
        let per = f64::from(n);
        e.bytes_per_batch
            .push_weighted((r.pull_bytes + r.push_bytes) as f64 / per, per);
        e.link_bytes_per_batch
            .push_weighted(r.pull_bytes.max(r.push_bytes) as f64 / per, per);
        // Round trips per timed mini-batch (see MiniBatchReport::timed_pulls).
        if r.timed_pulls > 0 {
            let timed = f64::from(r.timed_pulls);
            e.pull_secs_per_batch
                .push_weighted(r.pull_secs / timed, timed);
        }
        if r.timed_pushes > 0 {
            let timed = f64::from(r.timed_pushes);
            e.push_secs_per_batch
                .push_weighted(r.push_secs / timed, timed);
        }
        e.comp_secs_per_batch.push_weighted(r.comp_secs / per, per);
        if r.batch_secs > 0.0 {
            e.batch_secs_per_batch
                .push_weighted(r.batch_secs / per, per);
            e.own.push(r);
        }
        e.batches += n;
        e.batch_secs += r.batch_secs.max(0.0);
        for l in links {
            self.link(id, l.peer, l.bytes, l.secs);
        }
    }

    /// Records a transfer of `bytes` in `secs` between two evaluators.
    pub fn link(&mut self, from: EvaluatorId, to: EvaluatorId, bytes: u64, secs: f64) {
        // Tiny transfers measure latency, not bandwidth.
        push_rate(&mut self.links, self.window, (from, to), bytes, 4096, secs);
    }

    /// Records a bulk transfer (a probe or a block move): a measure of the
    /// link's capacity rather than of request latency.
    pub fn bulk(&mut self, from: EvaluatorId, to: EvaluatorId, bytes: u64, secs: f64) {
        push_rate(
            &mut self.bulk,
            self.window,
            (from, to),
            bytes,
            64 * 1024,
            secs,
        );
    }

    /// Records a fan-out probe: `from` sent `bytes` in all to every other
    /// member at once, in `secs`. The rate is at most its own link's and
    /// at most the others' links together, which is as much as its link can
    /// ever be asked to carry.
    pub fn fan_out(&mut self, from: EvaluatorId, bytes: u64, secs: f64) {
        if bytes < 64 * 1024 || secs <= 0.0 {
            return;
        }
        let w = self.window;
        self.fan_out
            .entry(from)
            .or_insert_with(|| Window::new(w))
            .push(bytes as f64 / secs);
    }

    /// An evaluator's capacity: the fastest bulk transfer it took part in,
    /// or its fan-out rate if faster.
    pub fn capacity(&self, id: EvaluatorId) -> Option<f64> {
        self.pair_capacity(id)
            .into_iter()
            .chain(self.fan_out.get(&id).and_then(Window::mean))
            .reduce(f64::max)
    }

    /// The fastest bulk transfer between two evaluators `id` took part in.
    fn pair_capacity(&self, id: EvaluatorId) -> Option<f64> {
        self.bulk
            .iter()
            .filter(|((a, b), _)| *a == id || *b == id)
            .filter_map(|(_, w)| w.mean())
            .reduce(f64::max)
    }

    /// Of `members`, those whose link the transfers between pairs leave
    /// open, fastest-looking first. A transfer between two evaluators runs
    /// at the slower one's speed, so it tells an evaluator's own speed only
    /// when its partner has shown itself faster (by more than `tolerance`,
    /// a fraction) in another transfer; otherwise the evaluator may be
    /// faster than everything it was paired with: the fastest of a cluster
    /// always, and a fast one whose partners were all slow. These are what
    /// a fan-out probe ([`Metrics::fan_out`]) measures. Members no pair
    /// measured are open too; those with a fan-out rate already are not.
    pub fn open_capacities(&self, members: &[EvaluatorId], tolerance: f64) -> Vec<EvaluatorId> {
        let mut open: Vec<(EvaluatorId, f64)> = members
            .iter()
            .filter(|id| !self.fan_out.contains_key(id))
            .filter_map(|&id| {
                let own = self.pair_capacity(id).unwrap_or(0.0);
                let shown_faster = self
                    .bulk
                    .keys()
                    .filter_map(|&(a, b)| match (a == id, b == id) {
                        (true, false) => Some(b),
                        (false, true) => Some(a),
                        _ => None,
                    })
                    .filter_map(|partner| self.pair_capacity(partner))
                    .any(|partner| own > 0.0 && partner > own * (1.0 + tolerance));
                (!shown_faster).then_some((id, own))
            })
            .collect();
        open.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        open.into_iter().map(|(id, _)| id).collect()
    }

    /// Mean capacity over every bulk-measured link.
    pub fn mean_capacity(&self) -> Option<f64> {
        let v: Vec<f64> = self.bulk.values().filter_map(Window::mean).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    /// Records a server's report. Its work is all of its CPU over the
    /// period at its CPU share (`own_secs`), in two parts: what grows with
    /// the bytes (`values_secs`: applying, reading, encoding and decoding
    /// the values), priced per byte, and the rest (reading, answering and
    /// waking for the requests), priced per mini-batch of the workers,
    /// counted over the same period, since every worker's mini-batch asks
    /// every server holding its keys whatever they hold. Without a CPU
    /// figure (an older evaluator) the values' time (`busy_secs`) is its
    /// cost per byte.
    ///
    /// Priced by the values alone a 0.05-CPU server looked as good as a fast
    /// one with the same link; priced all per byte, a server measured
    /// holding a fifth of a 4 KB model for one worker looked three times as
    /// costly holding all of it for five (MLR 100 features: 0.47 s epochs
    /// predicted, 0.16 s measured), the requests' cost being most of it.
    pub fn server(&mut self, id: EvaluatorId, r: &ServerReport) {
        let all = self.worker_batches;
        let bytes = r.bytes_in + r.bytes_out;
        let t = self.totals.entry(id).or_insert_with(|| EvalTotals {
            id,
            ..EvalTotals::default()
        });
        t.requests += r.requests;
        t.serve_secs += r.own_secs.max(r.busy_secs);
        t.served_bytes_in += r.bytes_in;
        t.served_bytes_out += r.bytes_out;
        let e = self.eval(id);
        let since = e
            .batches_at_report
            .replace(all)
            .map(|b| all.saturating_sub(b));
        if bytes == 0 {
            return;
        }
        if r.own_secs > 0.0 {
            e.server_secs_per_byte.push(r.values_secs / bytes as f64);
            if let Some(n) = since.filter(|n| *n > 0) {
                e.server_secs_per_mini_batch
                    .push((r.own_secs - r.values_secs).max(0.0) / n as f64);
            }
        } else if r.busy_secs > 0.0 {
            e.server_secs_per_byte.push(r.busy_secs / bytes as f64);
        }
    }

    /// Records an input load.
    pub fn load(&mut self, bytes: u64, secs: f64) {
        if bytes > 0 && secs > 0.0 {
            self.load_bytes_per_sec.push(bytes as f64 / secs);
        }
    }

    /// Measured input-load throughput, bytes per second.
    pub fn load_bandwidth(&self) -> Option<f64> {
        self.load_bytes_per_sec.mean()
    }

    /// After a reconfiguration: every worker skips its next mini-batch and
    /// its counts restart, so the optimizer waits for fresh measurements.
    /// Its own time and the requests' part of it restart too: the requests
    /// grow with the servers a mini-batch talks to, which the plan may have
    /// changed, and the optimizer prices them per server of the running
    /// configuration.
    pub fn reset_after_reconfiguration(&mut self) {
        for e in self.evals.values_mut() {
            e.skip = e.skip.max(1);
            e.batches = 0;
            e.batch_secs = 0.0;
            e.own.clear();
        }
    }

    /// Forgets an evaluator that left, keeping what it was like
    /// ([`Metrics::departed`]).
    pub fn forget(&mut self, id: EvaluatorId) {
        let departed = Departed {
            bandwidth: self.capacity(id).or_else(|| self.node_bandwidth(id)),
            cpu_speed: self.get(id).and_then(|e| e.cpu_speed),
        };
        if departed.bandwidth.is_some() || departed.cpu_speed.is_some() {
            self.departed.push(departed);
        }
        self.evals.remove(&id);
        self.links.retain(|&(a, b), _| a != id && b != id);
        self.bulk.retain(|&(a, b), _| a != id && b != id);
    }

    /// What was measured of the evaluators that left, in the order they left.
    pub fn departed(&self) -> &[Departed] {
        &self.departed
    }

    /// Measured bandwidth between two evaluators (either direction; the
    /// slower when both are measured).
    pub fn bandwidth(&self, a: EvaluatorId, b: EvaluatorId) -> Option<f64> {
        let ab = self.links.get(&(a, b)).and_then(Window::mean);
        let ba = self.links.get(&(b, a)).and_then(Window::mean);
        match (ab, ba) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }

    /// An evaluator's effective bandwidth in mini-batch transfers: the best
    /// of its measured links (small transfers measure latency as much as
    /// bandwidth; see [`Metrics::capacity`] for bulk measurements).
    pub fn node_bandwidth(&self, id: EvaluatorId) -> Option<f64> {
        self.links
            .iter()
            .filter(|((a, b), _)| *a == id || *b == id)
            .filter_map(|(_, w)| w.mean())
            .fold(None, |acc: Option<f64>, v| {
                Some(acc.map_or(v, |a| a.max(v)))
            })
    }

    /// Mean of every measured link, bytes per second.
    pub fn mean_bandwidth(&self) -> Option<f64> {
        let v: Vec<f64> = self.links.values().filter_map(Window::mean).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    /// Every measured link.
    pub fn links(&self) -> impl Iterator<Item = (EvaluatorId, EvaluatorId, f64)> + '_ {
        self.links
            .iter()
            .filter_map(|(&(a, b), w)| w.mean().map(|m| (a, b, m)))
    }

    /// The JSON view.
    pub fn view(&self) -> MetricsView {
        MetricsView {
            evaluators: self
                .evals
                .iter()
                .map(|(&id, e)| EvalMetricsView {
                    id,
                    comp_secs_per_record: e.comp_per_record.mean(),
                    bytes_per_mini_batch: e.bytes_per_batch.mean(),
                    comm_secs_per_mini_batch: e.comm_secs_per_batch(),
                    batch_secs_per_mini_batch: e.batch_secs_per_batch.mean(),
                    own_secs_per_mini_batch: e.own.own_secs_per_batch(),
                    io_secs_per_mini_batch: e.own.io_secs_per_batch(),
                    server_secs_per_byte: e.server_secs_per_byte.mean(),
                    mini_batches: e.batches,
                    cpu_speed: e.cpu_speed,
                })
                .collect(),
            links: self
                .links()
                .map(|(from, to, bytes_per_sec)| LinkView {
                    from,
                    to,
                    bytes_per_sec,
                })
                .collect(),
            capacity: self
                .bulk
                .iter()
                .filter_map(|(&(from, to), w)| {
                    w.mean().map(|bytes_per_sec| LinkView {
                        from,
                        to,
                        bytes_per_sec,
                    })
                })
                .collect(),
            fan_out: self
                .fan_out
                .iter()
                .filter_map(|(&id, w)| {
                    w.mean()
                        .map(|bytes_per_sec| FanOutView { id, bytes_per_sec })
                })
                .collect(),
            totals: self.totals.values().cloned().collect(),
        }
    }
}

/// Adds the rate of a transfer of `bytes` in `secs` over `link` to its
/// window (of `window` samples) in `rates`; transfers smaller than
/// `min_bytes`, untimed, or from an evaluator to itself are left out.
fn push_rate(
    rates: &mut BTreeMap<(EvaluatorId, EvaluatorId), Window>,
    window: usize,
    link: (EvaluatorId, EvaluatorId),
    bytes: u64,
    min_bytes: u64,
    secs: f64,
) {
    if bytes < min_bytes || secs <= 0.0 || link.0 == link.1 {
        return;
    }
    rates
        .entry(link)
        .or_insert_with(|| Window::new(window))
        .push(bytes as f64 / secs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use cruise_container::protocol::Stats;

    fn report(records: u64, comp: f64, bytes: u64) -> MiniBatchReport {
        MiniBatchReport {
            mini_batches: 1,
            clock: 0,
            stats: Stats {
                records,
                ..Stats::default()
            },
            comp_secs: comp,
            pull_secs: 0.001,
            pull_bytes: bytes,
            push_secs: 0.001,
            push_bytes: bytes,
            batch_secs: comp + 0.002,
            wait_secs: 0.001,
            cpu_wall_secs: comp + 0.0005,
            io_secs: 0.0002,
            links: Vec::new(),
            timed_pulls: 1,
            timed_pushes: 1,
        }
    }

    #[test]
    fn totals_count_every_mini_batch_warm_up_and_reconfigurations_included() {
        let mut m = Metrics::new(4, 2);
        let e = EvaluatorId(1);
        for _ in 0..3 {
            m.mini_batch(e, &report(100, 0.01, 1000), &[]);
        }
        m.reset_after_reconfiguration();
        m.mini_batch(e, &report(100, 0.01, 1000), &[]);
        let t = &m.view().totals[0];
        assert_eq!((t.id, t.mini_batches, t.records), (e, 4, 400));
        assert_eq!((t.pull_bytes, t.push_bytes), (4000, 4000));
        assert!((t.compute_secs - 0.04).abs() < 1e-12);
        // The smoothed figures skipped the warm-up and the first after the
        // reconfiguration.
        assert_eq!(m.get(e).map(|x| x.batches), Some(0));
    }

    #[test]
    fn window_is_a_sliding_mean() {
        let mut w = Window::new(3);
        assert_eq!(w.mean(), None);
        for v in [1.0, 2.0, 3.0, 4.0, f64::NAN] {
            w.push(v);
        }
        assert_eq!(w.mean(), Some(3.0));
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn warmup_and_reconfiguration_batches_are_skipped() {
        let mut m = Metrics::new(10, 2);
        let links = [LinkSample {
            peer: EvaluatorId(9),
            bytes: 1 << 20,
            secs: 0.01,
        }];
        m.mini_batch(EvaluatorId(1), &report(100, 100.0, 10), &links); // warm-up
        m.mini_batch(EvaluatorId(1), &report(100, 100.0, 10), &links); // warm-up
        m.mini_batch(EvaluatorId(1), &report(100, 0.1, 10), &links);
        let e = m.get(EvaluatorId(1)).unwrap();
        assert_eq!(e.batches, 1);
        assert!((e.comp_per_record.mean().unwrap() - 0.001).abs() < 1e-12);
        assert!((m.bandwidth(EvaluatorId(1), EvaluatorId(9)).unwrap() - 104_857_600.0).abs() < 1.0);
        m.reset_after_reconfiguration();
        m.mini_batch(EvaluatorId(1), &report(100, 50.0, 10), &[]); // first after reconfiguration
        assert_eq!(m.get(EvaluatorId(1)).unwrap().batches, 0);
        assert!(
            (m.get(EvaluatorId(1))
                .unwrap()
                .comp_per_record
                .mean()
                .unwrap()
                - 0.001)
                .abs()
                < 1e-12
        );
    }

    /// Round trips are averaged over the mini-batches that timed them; a
    /// report with none timed says nothing about them.
    #[test]
    fn round_trips_count_timed_mini_batches_only() {
        let mut m = Metrics::new(10, 0);
        let mut r = report(800, 0.8, 10);
        r.mini_batches = 8;
        (r.pull_secs, r.timed_pulls) = (0.002, 1);
        (r.push_secs, r.timed_pushes) = (0.006, 2);
        m.mini_batch(EvaluatorId(1), &r, &[]);
        (r.timed_pulls, r.timed_pushes) = (0, 0);
        (r.pull_secs, r.push_secs) = (0.0, 0.0);
        m.mini_batch(EvaluatorId(1), &r, &[]);
        let e = m.get(EvaluatorId(1)).unwrap();
        assert_eq!(e.batches, 16);
        assert_eq!(e.pull_secs_per_batch.len(), 1);
        assert!((e.pull_secs_per_batch.mean().unwrap() - 0.002).abs() < 1e-12);
        assert!((e.comm_secs_per_batch().unwrap() - 0.005).abs() < 1e-12);
        assert!((e.comp_secs_per_batch.mean().unwrap() - 0.1).abs() < 1e-12);
    }

    // A server that spent 20 ms of wall time on all its work (its CPU at its
    // share), 4 ms of it on the values, for 10 kB while the workers ran 40
    // mini-batches is priced 0.4 µs a byte and 0.4 ms a mini-batch; without
    // a CPU figure, by its values' time alone: 0.1 µs a byte.
    #[test]
    fn a_servers_cost_is_all_its_work_at_its_share() {
        let report = |own_secs, values_secs| ServerReport {
            period_secs: 0.5,
            requests: 80,
            busy_secs: 0.001,
            bytes_in: 4_000,
            bytes_out: 6_000,
            own_secs,
            values_secs,
        };
        let mut m = Metrics::new(4, 0);
        let batches = |m: &mut Metrics, n: u32| {
            let r = MiniBatchReport {
                mini_batches: n,
                ..MiniBatchReport::default()
            };
            m.mini_batch(EvaluatorId(9), &r, &[]);
        };
        // The first report only marks where the count starts.
        m.server(EvaluatorId(1), &report(0.02, 0.004));
        m.server(EvaluatorId(2), &report(0.0, 0.0));
        batches(&mut m, 40);
        m.server(EvaluatorId(1), &report(0.02, 0.004));
        m.server(EvaluatorId(2), &report(0.0, 0.0));
        let w = |m: &Metrics, id, f: fn(&EvalMetrics) -> &Window| f(m.get(id).unwrap()).mean();
        let close = |a: Option<f64>, b: f64| {
            assert!(a.is_some_and(|a| (a - b).abs() < 1e-12), "{a:?} != {b}")
        };
        close(w(&m, EvaluatorId(1), |e| &e.server_secs_per_byte), 4e-7);
        close(
            w(&m, EvaluatorId(1), |e| &e.server_secs_per_mini_batch),
            0.016 / 40.0,
        );
        close(w(&m, EvaluatorId(2), |e| &e.server_secs_per_byte), 1e-7);
        assert!(w(&m, EvaluatorId(2), |e| &e.server_secs_per_mini_batch).is_none());
    }

    #[test]
    fn a_window_of_reports_weighs_each_by_its_mini_batches() {
        let mut w = Window::new(8);
        // One report of a mini-batch of 10 ms, one of nine of 2 ms each:
        // 28 ms over 10 mini-batches.
        w.push_weighted(0.010, 1.0);
        w.push_weighted(0.002, 9.0);
        assert!((w.mean().unwrap() - 0.0028).abs() < 1e-12);
        w.push_weighted(1.0, 0.0);
        w.push_weighted(f64::NAN, 1.0);
        assert_eq!(w.len(), 2, "no weight or no value: dropped");
        // The oldest sample leaves with its weight.
        let mut w = Window::new(2);
        w.push_weighted(5.0, 100.0);
        w.push(1.0);
        w.push(3.0);
        assert_eq!(w.mean(), Some(2.0));
    }

    /// A worker under a CPU quota spends its CPU in bursts: a report of two
    /// mini-batches that took 1 ms of wall time for 5 ms of CPU at the quota
    /// (their answers were there), then one of two that took 9 ms, 8 of
    /// them waiting for answers, for 1 ms. Its own time is its
    /// CPU over both, 6 ms in 10 (1.5 ms a mini-batch), where bounding each
    /// report by its wall time would give 1 + 1 ms (0.5 ms a mini-batch).
    /// Beside its waits, the loop's time outside them is the floor, and the
    /// wall time the ceiling.
    #[test]
    fn own_time_is_bounded_over_the_window_not_per_report() {
        let report = |batch: f64, wait: f64, cpu_wall: f64, io: f64| MiniBatchReport {
            mini_batches: 2,
            comp_secs: 0.0002,
            batch_secs: batch,
            wait_secs: wait,
            cpu_wall_secs: cpu_wall,
            io_secs: io,
            ..MiniBatchReport::default()
        };
        let close = |a: Option<f64>, b: f64| {
            let a = a.expect("a figure");
            assert!((a - b).abs() < 1e-12, "{a} != {b}");
        };
        let mut w = OwnWindow::new(4);
        w.push(&report(0.001, 0.0, 0.005, 0.002));
        w.push(&report(0.009, 0.008, 0.001, 0.0));
        close(w.own_secs_per_batch(), 0.0015);
        close(w.io_secs_per_batch(), 0.0005);
        // Waiting 9.5 of 10 ms with 0.1 ms of CPU: the loop's 0.5 ms.
        let mut w = OwnWindow::new(4);
        w.push(&report(0.010, 0.0095, 0.0001, 0.0));
        close(w.own_secs_per_batch(), 0.00025);
        // More CPU at the quota than wall time (threads on free cores):
        // the wall time, and the requests' part no more than that.
        let mut w = OwnWindow::new(4);
        w.push(&report(0.004, 0.003, 0.006, 0.005));
        close(w.own_secs_per_batch(), 0.002);
        close(w.io_secs_per_batch(), 0.002);
        // The oldest report leaves the window; one without wall time, or
        // with a figure that is not one, never enters it.
        let mut w = OwnWindow::new(1);
        w.push(&report(0.001, 0.0, 0.005, 0.0));
        w.push(&report(0.009, 0.0, 0.001, 0.0));
        w.push(&report(0.0, 0.0, 0.001, 0.0));
        w.push(&report(0.004, f64::NAN, 0.001, 0.0));
        close(w.own_secs_per_batch(), 0.0045);
        w.clear();
        assert_eq!(w.own_secs_per_batch(), None);
    }

    /// A ring of probes over three fast (18 MB/s) and five slow (10 MB/s)
    /// links, in an order that puts one fast evaluator (5) between two slow
    /// ones: every pair runs at its slower end.
    fn ring_of_pairs(m: &mut Metrics, fast: &[u32]) {
        let speed = |id: u32| if fast.contains(&id) { 18e6_f64 } else { 10e6 };
        for a in 1..=8u32 {
            let b = a % 8 + 1;
            let rate = speed(a).min(speed(b));
            let bytes = 4u64 << 20;
            m.bulk(EvaluatorId(a), EvaluatorId(b), bytes, bytes as f64 / rate);
        }
    }

    #[test]
    fn pairs_leave_open_the_fastest_and_those_with_only_slower_partners() {
        let members: Vec<EvaluatorId> = (1..=8).map(EvaluatorId).collect();
        let mut m = Metrics::new(4, 0);
        ring_of_pairs(&mut m, &[1, 2, 5]);
        // 1 and 2 are the fastest (nothing shown faster); 5 reads 10 MB/s
        // with both its partners (4 and 6), as do 4, 6 and 7 with theirs; 3
        // and 8 each have a partner shown faster (2 and 1), so their 10 MB/s
        // is their own.
        let open = m.open_capacities(&members, 0.25);
        assert_eq!(
            open,
            [1, 2, 4, 5, 6, 7].map(EvaluatorId).to_vec(),
            "fastest-looking first, then by id"
        );
        assert!((m.capacity(EvaluatorId(5)).unwrap() - 10e6).abs() < 1.0);
        // 5 sending 4 MiB to the others at once in 0.233 s reads its own 18 MB/s.
        m.fan_out(EvaluatorId(5), 4 << 20, (4u64 << 20) as f64 / 18e6);
        assert!((m.capacity(EvaluatorId(5)).unwrap() - 18e6).abs() < 1.0);
        assert!(!m.open_capacities(&members, 0.25).contains(&EvaluatorId(5)));
        // A fan-out slower than a pair does not lower the capacity.
        m.fan_out(EvaluatorId(1), 4 << 20, (4u64 << 20) as f64 / 5e6);
        assert!((m.capacity(EvaluatorId(1)).unwrap() - 18e6).abs() < 1.0);
        // Within the tolerance a partner is not shown faster: 11 MB/s
        // beside 10 MB/s leaves both open.
        let mut m = Metrics::new(4, 0);
        m.bulk(
            EvaluatorId(1),
            EvaluatorId(2),
            1 << 20,
            (1u64 << 20) as f64 / 11e6,
        );
        m.bulk(
            EvaluatorId(2),
            EvaluatorId(3),
            1 << 20,
            (1u64 << 20) as f64 / 10e6,
        );
        let three: Vec<EvaluatorId> = (1..=4).map(EvaluatorId).collect();
        assert_eq!(
            m.open_capacities(&three, 0.25),
            [1, 2, 3, 4].map(EvaluatorId).to_vec(),
            "4 has no measurement at all"
        );
    }

    #[test]
    fn capacity_comes_from_bulk_transfers_only() {
        let mut m = Metrics::new(4, 0);
        m.link(EvaluatorId(1), EvaluatorId(2), 1 << 20, 0.1);
        assert_eq!(
            m.capacity(EvaluatorId(1)),
            None,
            "mini-batch transfers are not capacity"
        );
        m.bulk(EvaluatorId(1), EvaluatorId(2), 4 << 20, 0.004);
        m.bulk(EvaluatorId(3), EvaluatorId(1), 4 << 20, 0.008);
        m.bulk(EvaluatorId(3), EvaluatorId(4), 1000, 0.1); // too small
        assert!((m.capacity(EvaluatorId(1)).unwrap() - 1_048_576_000.0).abs() < 1.0);
        assert!((m.capacity(EvaluatorId(3)).unwrap() - 524_288_000.0).abs() < 1.0);
        assert_eq!(m.capacity(EvaluatorId(4)), None);
        assert_eq!(m.view().capacity.len(), 2);
    }

    #[test]
    fn links_take_the_slower_direction_and_ignore_tiny_transfers() {
        let mut m = Metrics::new(4, 0);
        m.link(EvaluatorId(1), EvaluatorId(2), 1_000_000, 0.01); // 100 MB/s
        m.link(EvaluatorId(2), EvaluatorId(1), 1_000_000, 0.02); // 50 MB/s
        m.link(EvaluatorId(1), EvaluatorId(3), 100, 0.5); // too small to say
        assert_eq!(m.bandwidth(EvaluatorId(1), EvaluatorId(2)), Some(5e7));
        assert_eq!(m.bandwidth(EvaluatorId(1), EvaluatorId(3)), None);
        assert_eq!(m.node_bandwidth(EvaluatorId(1)), Some(1e8));
        m.forget(EvaluatorId(2));
        assert_eq!(m.bandwidth(EvaluatorId(1), EvaluatorId(2)), None);
    }
}
