//! Inputs of the optimizer: what the AM measured about the job and its containers.
//!
//! A [`Snapshot`] is plain data (serde), so the AM can write one to a JSON file and a
//! what-if tool can read it back. [`Snapshot::from_json`] parses and validates it.

use serde::{Deserialize, Serialize};

use crate::error::OptimizerError;

/// What a container does (or will do) in the job.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Runs a PS worker: holds input blocks, computes, pulls and pushes.
    Worker,
    /// Runs a PS server: holds model blocks, serves pulls, applies pushes.
    Server,
    /// Runs neither. In a current configuration: a container just offered by the
    /// resource manager (needs `Add`). In a target: not used (gets `Delete`d).
    #[default]
    Idle,
}

/// Job-wide parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Total number of training records `D`.
    pub total_records: u64,
    /// Mini-batch size `B` in records.
    pub mini_batch_size: u64,
    /// Bytes one worker exchanges with all servers per mini-batch (pull + push), measured.
    /// This is the model traffic `M`, split across servers in proportion to their model share;
    /// servers process all of it.
    pub bytes_per_mini_batch: f64,
    /// Of those, the bytes on the busier direction of a link (the larger of pull and
    /// push), measured: links carry both directions at once, and bandwidths are measured
    /// in one. `None`: `bytes_per_mini_batch` (as if both directions shared one channel).
    #[serde(default)]
    pub link_bytes_per_mini_batch: Option<f64>,
    /// Number of blocks of the input table (partitions are whole blocks).
    pub input_blocks: u32,
    /// Number of blocks of the model table.
    pub model_blocks: u32,
    /// Epochs left to train; the payback horizon of a reconfiguration.
    pub remaining_epochs: f64,
    /// Size of the input table in bytes (with its worker-local state), for move cost.
    /// 0 when unknown: moves are then priced per operation only.
    #[serde(default)]
    pub input_bytes: u64,
    /// Size of the model table in bytes, for move cost. 0 when unknown.
    #[serde(default)]
    pub model_bytes: u64,
    /// How much of a worker's computation and communication add up rather
    /// than overlap: a worker's epoch is `max(comp, comm) + f · min(comp,
    /// comm)`. 1 is Cruise's Eq. (4) (pull, compute, push, one after the
    /// other); a worker that pulls ahead and pushes without waiting hides
    /// most of the shorter one (`f` near 0). Measured by the AM from the
    /// workers' mini-batch times; default 1.
    #[serde(default = "one")]
    pub serial_fraction: f64,
    /// Per mini-batch communication time the bandwidth does not explain
    /// (request round trips), added to every worker's communication. Measured
    /// by the AM as what the running configuration's communication took
    /// beyond the model's prediction; default 0.
    #[serde(default)]
    pub latency_secs_per_mini_batch: f64,
    /// Workers train asynchronously (no clock holds them together): an
    /// epoch ends when the workers together have processed the data set, so
    /// its time is the data set over their summed throughput, whatever the
    /// split of the input blocks among them. The trigger then prices the
    /// running configuration by that throughput (targets by the solvers'
    /// upper bound of it), and a plan that would only move input between
    /// the same workers gains nothing.
    #[serde(default)]
    pub asynchronous: bool,
    /// The running configuration's epoch time as measured since it began
    /// (the workers' wall time per mini-batch: asynchronous workers share
    /// the data set by their throughput, synchronised ones each process
    /// their own input and the slowest decides), not predicted. The trigger
    /// compares it with what earlier configurations measured
    /// ([`crate::trigger::MeasuredSplit`]). `None` until every worker
    /// holding input has measured.
    #[serde(default)]
    pub measured_epoch_secs: Option<f64>,
    /// For asynchronous workers, the latency and serial fraction fitted
    /// against their communication with each answer queued behind the
    /// requests the others make as they come, which is how
    /// [`crate::CostModel::throughput_epoch`] prices it; the fields above
    /// are fitted against the slowest-worker bound's (every worker's
    /// requests always queued at every server), which the solvers price.
    /// Each view explains the running configuration's waits its own way,
    /// and one's latency added to the other's queues counts them twice.
    /// `None`: the throughput uses the fields above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_fit: Option<WaitFit>,
}

/// A latency and a serial fraction fitted together (see
/// [`Job::queued_fit`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitFit {
    /// As [`Job::latency_secs_per_mini_batch`].
    pub latency_secs_per_mini_batch: f64,
    /// As [`Job::serial_fraction`].
    pub serial_fraction: f64,
}

fn one() -> f64 {
    1.0
}

/// A job for the crate's tests: `d` records in mini-batches of `b`, `m`
/// bytes per mini-batch, `k` input and `l` model blocks, ten epochs to go.
#[cfg(test)]
pub(crate) fn test_job(d: u64, b: u64, m: f64, k: u32, l: u32) -> Job {
    Job::new(d, b, m, k, l, 10.0)
}

impl Job {
    /// A job of the figures every job has; the optional ones are what a
    /// snapshot without them reads as (unknown sizes and link bytes, Eq. 4's
    /// serial worker, no extra latency, synchronous, no measured epoch).
    pub fn new(
        total_records: u64,
        mini_batch_size: u64,
        bytes_per_mini_batch: f64,
        input_blocks: u32,
        model_blocks: u32,
        remaining_epochs: f64,
    ) -> Job {
        Job {
            total_records,
            mini_batch_size,
            bytes_per_mini_batch,
            link_bytes_per_mini_batch: None,
            input_blocks,
            model_blocks,
            remaining_epochs,
            input_bytes: 0,
            model_bytes: 0,
            serial_fraction: one(),
            latency_secs_per_mini_batch: 0.0,
            measured_epoch_secs: None,
            asynchronous: false,
            queued_fit: None,
        }
    }

    /// Bytes per mini-batch on the busier direction of a link
    /// ([`Job::link_bytes_per_mini_batch`], else [`Job::bytes_per_mini_batch`]).
    pub fn link_bytes(&self) -> f64 {
        self.link_bytes_per_mini_batch
            .unwrap_or(self.bytes_per_mini_batch)
    }

    /// Bytes of one block of `table` (0 when the table size is unknown).
    pub fn block_bytes(&self, table: crate::plan::Table) -> f64 {
        match table {
            crate::plan::Table::Input if self.input_blocks > 0 => {
                self.input_bytes as f64 / f64::from(self.input_blocks)
            }
            crate::plan::Table::Model if self.model_blocks > 0 => {
                self.model_bytes as f64 / f64::from(self.model_blocks)
            }
            _ => 0.0,
        }
    }
}

/// Measurements of one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerMetrics {
    /// Container id (unique in the snapshot).
    pub id: String,
    /// Current role.
    pub role: Role,
    /// Measured compute seconds per record (moving average over mini-batches):
    /// the worker's own time, its computation and the per-mini-batch work
    /// around it that no server takes off it (the AM's measurement; see
    /// ARCHITECTURE.md, "Snapshot").
    /// `None` for containers that never ran a worker: then it is estimated as
    /// `reference / cpu_speed`, where `reference` is the mean over measured containers
    /// of `compute_secs_per_record * cpu_speed` (their cost at speed 1).
    #[serde(default)]
    pub compute_secs_per_record: Option<f64>,
    /// Relative CPU speed from a calibration run (1.0 = reference; 2.0 = twice as fast).
    /// `None` means 1.0.
    #[serde(default)]
    pub cpu_speed: Option<f64>,
    /// Measured network bandwidth of the container in bytes/s.
    pub bandwidth_bytes_per_sec: f64,
    /// Measured server processing seconds per byte (push apply + pull serve).
    /// `None` for containers that never served: estimated like the compute cost
    /// (`reference / cpu_speed` from the containers that served); 0 when none has served.
    #[serde(default)]
    pub server_secs_per_byte: Option<f64>,
    /// Measured seconds a worker spends per mini-batch on each server it talks
    /// to: framing, sending and receiving its requests and their answers, at
    /// its CPU share (the AM's measurement: the worker's own time off its loop
    /// thread, divided by the servers of the running configuration). It is not
    /// part of `compute_secs_per_record`. `None` for containers that never ran
    /// a worker: estimated like the compute cost; 0 when no worker measured it.
    #[serde(default)]
    pub request_secs_per_server: Option<f64>,
    /// Measured seconds this container, as a server holding model blocks,
    /// spends per mini-batch of each worker beyond its work per byte
    /// (`server_secs_per_byte`): reading, answering and waking for the
    /// requests themselves, at its CPU share. It does not shrink when the
    /// model is spread over more servers: each still gets every worker's
    /// requests. `None` for containers that never served: estimated like
    /// the compute cost; 0 when no server measured it.
    #[serde(default)]
    pub server_secs_per_mini_batch: Option<f64>,
    /// Input blocks held now.
    #[serde(default)]
    pub input_blocks: u32,
    /// Model blocks held now.
    #[serde(default)]
    pub model_blocks: u32,
    /// Mini-batches this container has reported since the last reconfiguration.
    #[serde(default)]
    pub mini_batches: u32,
    /// The resource manager takes this container back: it must be emptied and deleted.
    #[serde(default)]
    pub reclaimed: bool,
}

impl ContainerMetrics {
    /// A container the resource manager offers and the job has not used:
    /// idle, holding nothing, measured by nothing but its CPU speed and
    /// bandwidth (its costs are estimated from the containers measured).
    pub fn offered(id: String, cpu_speed: Option<f64>, bandwidth_bytes_per_sec: f64) -> Self {
        ContainerMetrics {
            id,
            role: Role::Idle,
            compute_secs_per_record: None,
            cpu_speed,
            bandwidth_bytes_per_sec,
            server_secs_per_byte: None,
            request_secs_per_server: None,
            server_secs_per_mini_batch: None,
            input_blocks: 0,
            model_blocks: 0,
            mini_batches: 0,
            reclaimed: false,
        }
    }
}

/// What a container the resource manager has not given yet is expected to
/// be, from the containers the job has seen (held now or before): the
/// harmonic mean of their figures. A container's costs grow with the
/// inverse of its speed and of its bandwidth (seconds per record, per
/// byte), so the expected cost of a container drawn like those seen is the
/// mean of those inverses: pricing it at the arithmetic mean of the speeds
/// would promise, on a cluster of some fast and some slow containers, a
/// container faster than most that come. `None` when nothing was seen.
pub fn expected_draw(seen: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (n, inverse) = seen
        .into_iter()
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((0usize, 0.0), |(n, s), v| (n + 1, s + 1.0 / v));
    (n > 0).then(|| n as f64 / inverse)
}

/// A measured bandwidth between two containers (from real transfers), bytes/s.
/// Looked up in either direction (pulls and pushes use both); when a pair has several
/// entries the slowest is used. A measured link only matters where it is slower than
/// its ends' own bandwidths, which price each end's side of a pair without an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// One end.
    pub from: String,
    /// The other end.
    pub to: String,
    /// Measured bandwidth in bytes/s.
    pub bytes_per_sec: f64,
}

/// Everything the optimizer needs to know about a running job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Job parameters.
    pub job: Job,
    /// All containers the job holds or is offered.
    pub containers: Vec<ContainerMetrics>,
    /// Optional pairwise bandwidth measurements.
    #[serde(default)]
    pub links: Vec<Link>,
    /// The job's trigger policy when the snapshot was taken (its gain
    /// threshold and reconfiguration cost estimates), so that `cruise plan`
    /// decides as the job did; absent in hand-written snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::trigger::PolicyState>,
}

impl Snapshot {
    /// Parses a snapshot from JSON and validates it.
    pub fn from_json(text: &str) -> Result<Snapshot, OptimizerError> {
        let snapshot: Snapshot =
            serde_json::from_str(text).map_err(|e| OptimizerError::SnapshotJson {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })?;
        snapshot.validate()?;
        Ok(snapshot)
    }

    /// Checks ranges, uniqueness of ids, link ends and block totals.
    pub fn validate(&self) -> Result<(), OptimizerError> {
        let j = &self.job;
        j.validate()?;
        if let Some(p) = &self.policy {
            p.validate("policy")?;
        }
        let mut seen = std::collections::BTreeSet::new();
        let (mut input, mut model) = (0u64, 0u64);
        for (i, c) in self.containers.iter().enumerate() {
            if !seen.insert(c.id.as_str()) {
                return Err(OptimizerError::DuplicateContainer(c.id.clone()));
            }
            c.validate(i)?;
            input += u64::from(c.input_blocks);
            model += u64::from(c.model_blocks);
        }
        let any_blocks = input + model > 0;
        if any_blocks && (input != u64::from(j.input_blocks) || model != u64::from(j.model_blocks))
        {
            return Err(OptimizerError::InconsistentBlocks(format!(
                "containers hold {input} input and {model} model blocks, job has {} and {}",
                j.input_blocks, j.model_blocks
            )));
        }
        for (k, l) in self.links.iter().enumerate() {
            for end in [&l.from, &l.to] {
                if !seen.contains(end.as_str()) {
                    return Err(OptimizerError::UnknownContainer {
                        container: end.clone(),
                        context: format!("links[{k}]"),
                    });
                }
            }
            positive(&format!("links[{k}].bytes_per_sec"), l.bytes_per_sec)?;
        }
        Ok(())
    }
}

impl Job {
    /// Checks the job's own fields (see [`Snapshot::validate`]).
    fn validate(&self) -> Result<(), OptimizerError> {
        let j = self;
        if j.total_records == 0 {
            return Err(OptimizerError::invalid("job.total_records", "must be > 0"));
        }
        if j.mini_batch_size == 0 {
            return Err(OptimizerError::invalid(
                "job.mini_batch_size",
                "must be > 0",
            ));
        }
        non_negative("job.bytes_per_mini_batch", j.bytes_per_mini_batch)?;
        if let Some(v) = j.link_bytes_per_mini_batch {
            non_negative("job.link_bytes_per_mini_batch", v)?;
        }
        non_negative("job.remaining_epochs", j.remaining_epochs)?;
        let fits = std::iter::once(("job", j.serial_fraction, j.latency_secs_per_mini_batch))
            .chain(j.queued_fit.map(|q| {
                (
                    "job.queued_fit",
                    q.serial_fraction,
                    q.latency_secs_per_mini_batch,
                )
            }));
        for (at, serial_fraction, latency) in fits {
            if !(0.0..=1.0).contains(&serial_fraction) {
                return Err(OptimizerError::invalid(
                    format!("{at}.serial_fraction"),
                    format!("{serial_fraction} is not within [0, 1]"),
                ));
            }
            non_negative(&format!("{at}.latency_secs_per_mini_batch"), latency)?;
        }
        if let Some(v) = j.measured_epoch_secs {
            positive("job.measured_epoch_secs", v)?;
        }
        if j.input_blocks == 0 {
            return Err(OptimizerError::invalid("job.input_blocks", "must be > 0"));
        }
        if j.model_blocks == 0 {
            return Err(OptimizerError::invalid("job.model_blocks", "must be > 0"));
        }
        Ok(())
    }
}

impl ContainerMetrics {
    /// Checks one container's figures and that its blocks fit its role;
    /// `i` is its index in the snapshot, for the error.
    fn validate(&self, i: usize) -> Result<(), OptimizerError> {
        let c = self;
        positive(
            &format!("containers[{i}].bandwidth_bytes_per_sec"),
            c.bandwidth_bytes_per_sec,
        )?;
        let optional = [
            ("compute_secs_per_record", c.compute_secs_per_record),
            ("request_secs_per_server", c.request_secs_per_server),
            ("server_secs_per_byte", c.server_secs_per_byte),
            ("server_secs_per_mini_batch", c.server_secs_per_mini_batch),
        ];
        for (field, v) in optional {
            if let Some(v) = v {
                non_negative(&format!("containers[{i}].{field}"), v)?;
            }
        }
        if let Some(v) = c.cpu_speed {
            positive(&format!("containers[{i}].cpu_speed"), v)?;
        }
        if c.input_blocks > 0 && c.role != Role::Worker {
            return Err(OptimizerError::invalid(
                format!("containers[{i}].input_blocks"),
                format!(
                    "container `{}` holds input blocks but is not a worker",
                    c.id
                ),
            ));
        }
        if c.model_blocks > 0 && c.role != Role::Server {
            return Err(OptimizerError::invalid(
                format!("containers[{i}].model_blocks"),
                format!(
                    "container `{}` holds model blocks but is not a server",
                    c.id
                ),
            ));
        }
        Ok(())
    }
}

fn non_negative(field: &str, v: f64) -> Result<(), OptimizerError> {
    if !v.is_finite() || v < 0.0 {
        return Err(OptimizerError::invalid(
            field,
            format!("must be finite and >= 0, got {v}"),
        ));
    }
    Ok(())
}

fn positive(field: &str, v: f64) -> Result<(), OptimizerError> {
    if !v.is_finite() || v <= 0.0 {
        return Err(OptimizerError::invalid(
            field,
            format!("must be finite and > 0, got {v}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::expected_draw;

    #[test]
    fn an_expected_draw_costs_what_a_random_container_costs() {
        // Two containers at 4 MB/s and two at 100 MB/s: a byte costs
        // (1/4 + 1/100) / 2 s per MB on average, so 1 / 0.13 = 7.69 MB/s,
        // where the arithmetic mean (52 MB/s) would promise a fast one.
        let v = expected_draw([4.0, 4.0, 100.0, 100.0]).unwrap();
        assert!((v - 1.0 / 0.13).abs() < 1e-9, "{v}");
        assert_eq!(expected_draw([5.0]), Some(5.0));
        assert_eq!(expected_draw([0.0, f64::NAN]), None);
        assert_eq!(expected_draw(std::iter::empty()), None);
    }
}
