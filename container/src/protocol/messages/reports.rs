//! What evaluators measure and report to the AM on the control channel:
//! objective statistics, a worker's mini-batches, a server's periods.

use serde::{Deserialize, Serialize};

use super::EvaluatorId;

/// Per-app objective statistics, summed over records.
///
/// `records` counts input records (the AM counts epochs with it); the loss is
/// a sum over `loss_terms` terms, which are records for MLR and Lasso,
/// observed entries for NMF and tokens for LDA (each app documents its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Records counted.
    pub records: u64,
    /// Sum of the loss terms.
    pub loss_sum: f64,
    /// Number of terms in `loss_sum`; 0 means one per record.
    pub loss_terms: u64,
    /// Records predicted correctly (apps without accuracy leave 0).
    pub correct: u64,
}

impl Stats {
    /// Adds another set of sums.
    pub fn add(&mut self, o: &Stats) {
        self.loss_terms = self.terms() + o.terms();
        self.records += o.records;
        self.loss_sum += o.loss_sum;
        self.correct += o.correct;
    }

    /// Number of loss terms (`loss_terms`, or `records` when that is 0).
    pub fn terms(&self) -> u64 {
        if self.loss_terms == 0 {
            self.records
        } else {
            self.loss_terms
        }
    }

    /// Mean loss per term (per record unless the app counts terms).
    pub fn mean_loss(&self) -> f64 {
        let n = self.terms();
        if n == 0 {
            f64::NAN
        } else {
            self.loss_sum / n as f64
        }
    }

    /// Fraction correct.
    pub fn accuracy(&self) -> f64 {
        if self.records == 0 {
            f64::NAN
        } else {
            self.correct as f64 / self.records as f64
        }
    }
}

/// A transfer with one peer during a mini-batch: bytes moved and the time
/// from sending the request to receiving its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkSample {
    /// The other evaluator.
    pub peer: EvaluatorId,
    /// Bytes of values sent or received.
    pub bytes: u64,
    /// Seconds from request to answer.
    pub secs: f64,
}

/// What a worker measured over one or more mini-batches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MiniBatchReport {
    /// Mini-batches summed in this report (a worker reports every few
    /// milliseconds, not every mini-batch); the figures below are totals.
    pub mini_batches: u32,
    /// The worker's local epoch (of the last mini-batch).
    pub clock: u32,
    /// Objective statistics of the mini-batch (before its update).
    pub stats: Stats,
    /// Seconds computing.
    pub comp_secs: f64,
    /// Round trip of the pull: from its request to its last answer.
    pub pull_secs: f64,
    /// Bytes pulled (values received).
    pub pull_bytes: u64,
    /// Round trip of the push: from its request to its last acknowledgement.
    pub push_secs: f64,
    /// Bytes pushed (deltas sent).
    pub push_bytes: u64,
    /// Wall time of the mini-batch in the worker's loop, waits, compute and
    /// reporting included: what the mini-batch cost the worker.
    pub batch_secs: f64,
    /// Of `batch_secs`, the time the worker's loop was blocked waiting for a
    /// pull's answer or for a push's acknowledgement (room in the pipeline).
    /// The rest, `batch_secs - wait_secs`, is the worker's own time: its
    /// computation plus the per-mini-batch work around it (key lists,
    /// applying its own pushes, routing requests), at the speed its CPU
    /// share allows.
    pub wait_secs: f64,
    /// The worker's CPU seconds over its mini-batches (its loop thread's
    /// and its request connections'), at the wall seconds a CPU second
    /// takes here: what they would take if every answer came at once. Not
    /// bounded by `batch_secs` in one mini-batch: under a CPU quota a
    /// worker spends its CPU in bursts at a core's speed, a burst's
    /// mini-batches take less wall time than their CPU costs at the quota,
    /// and the next ones wait out the quota's period. The AM bounds it over
    /// its window of reports (`crate::ps::own_secs`).
    pub cpu_wall_secs: f64,
    /// Of `cpu_wall_secs`, the part that grows with the servers a mini-batch
    /// talks to, not with its records: its requests' CPU beyond encoding
    /// and decoding the values (the request connections' and the loop
    /// thread's hand-offs and wake-ups), at most two empty round trips a
    /// server, at the wall seconds a CPU second takes here (`crate::ps`
    /// says how it is measured).
    pub io_secs: f64,
    /// Per-peer transfers of the pull and the push (local parts excluded),
    /// of the timed ones only.
    pub links: Vec<LinkSample>,
    /// Mini-batches whose pull round trip is in `pull_secs`. A pull that was
    /// on its way while the worker computed on its own thread is not timed:
    /// its answer was read only once the computation ended.
    pub timed_pulls: u32,
    /// Mini-batches whose push round trip is in `push_secs` (a mini-batch
    /// without a push counts, at 0 s); untimed as pulls are.
    pub timed_pushes: u32,
}

impl MiniBatchReport {
    /// Adds a later report to this one: totals add up, the clock is the
    /// later one's, and transfer samples are kept (merge them per peer
    /// before sending).
    pub fn add(&mut self, o: &MiniBatchReport) {
        self.mini_batches += o.mini_batches;
        self.clock = o.clock;
        self.stats.add(&o.stats);
        self.comp_secs += o.comp_secs;
        self.pull_secs += o.pull_secs;
        self.pull_bytes += o.pull_bytes;
        self.push_secs += o.push_secs;
        self.push_bytes += o.push_bytes;
        self.batch_secs += o.batch_secs;
        self.wait_secs += o.wait_secs;
        self.cpu_wall_secs += o.cpu_wall_secs;
        self.io_secs += o.io_secs;
        self.links.extend_from_slice(&o.links);
        self.timed_pulls += o.timed_pulls;
        self.timed_pushes += o.timed_pushes;
    }
}

/// What a server measured over a period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerReport {
    /// Length of the period, seconds.
    pub period_secs: f64,
    /// Requests served.
    pub requests: u64,
    /// CPU seconds spent applying and reading values.
    pub busy_secs: f64,
    /// Bytes received in requests.
    pub bytes_in: u64,
    /// Bytes sent in responses.
    pub bytes_out: u64,
    /// The CPU seconds of the inbound connections' tasks over the period
    /// (reading, decoding, applying, encoding, writing: framing and system
    /// calls as well as the values), priced at what a CPU second costs
    /// here in wall time (`os::wall_per_cpu`: `1 / quota` under a CPU
    /// quota): the wall time serving takes at this container's CPU share.
    /// The runtime's parking and waking between requests is left out: it
    /// is paid per idle spell, and shrinks as the server nears saturation,
    /// which is when the cost model's server bound matters. Left out, a
    /// 0.09-CPU server's cost per worker mini-batch (MLR, 100 features)
    /// fell by 18–25%; it still falls with load (0.58–1.17 ms beside one
    /// worker, 0.40 ms beside seven).
    pub own_secs: f64,
    /// Of that, the part that grows with the bytes served, at the same
    /// price: applying and reading the values (`busy_secs`, at most the
    /// store's CPU per byte, `ps::store_cpu_per_byte`, times the bytes) and
    /// encoding and decoding them (`ps::codec_cpu_per_byte`). The rest is
    /// the requests' own cost, which spreading the model does not shrink.
    pub values_secs: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_loss_terms() {
        let per_record = Stats {
            records: 2,
            loss_sum: 4.0,
            loss_terms: 0,
            correct: 1,
        };
        assert_eq!(per_record.mean_loss(), 2.0);
        let per_token = Stats {
            records: 1,
            loss_sum: 6.0,
            loss_terms: 6,
            correct: 0,
        };
        let mut sum = Stats::default();
        sum.add(&per_record);
        sum.add(&per_token);
        assert_eq!((sum.records, sum.loss_terms, sum.correct), (3, 8, 1));
        assert_eq!(sum.mean_loss(), 10.0 / 8.0);
        assert!(Stats::default().mean_loss().is_nan());
    }
}
