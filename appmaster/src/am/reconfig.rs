//! Reconfiguration: the bridge between the optimizer library and the AM.
//!
//! - [`build_snapshot`] turns the AM's measurements and ownership into the
//!   optimizer's [`Snapshot`] and [`Configuration`] (containers are named
//!   `e<id>`; capacity the job may grow into appears as idle `new<k>`).
//! - [`AmRunner`] is the plan executor's [`OperationRunner`]: each operation
//!   becomes an [`Event::PlanOp`] carried out by the job's event loop (the
//!   one owner of job state), which answers when the operation has taken
//!   effect or failed. The executor itself runs in its own task and reports
//!   with [`Event::PlanDone`].

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::{mpsc, oneshot};

use cruise_container::protocol::EvaluatorId;
use cruise_optimizer::{
    Configuration, ContainerMetrics, Holding, Job, Link, OpError, OpReport, Operation,
    OperationRunner, Role as ORole, Snapshot,
};

use super::metrics::Metrics;
use super::{Event, Role};

/// Bandwidth assumed when nothing has been measured yet (loopback-like).
pub const UNMEASURED_BANDWIDTH: f64 = 1e9;

/// The optimizer's name for an evaluator.
pub fn name_of(id: EvaluatorId) -> String {
    format!("e{id}")
}

/// The evaluator an optimizer name refers to, if it is an existing one.
pub fn id_of(name: &str) -> Option<EvaluatorId> {
    name.strip_prefix('e').and_then(|n| n.parse().ok())
}

/// The optimizer's name for the `k`-th container the job may add.
pub fn new_name(k: usize) -> String {
    format!("new{k}")
}

/// What the snapshot needs to know about one evaluator.
#[derive(Debug, Clone)]
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
}

fn orole(r: Role) -> ORole {
    match r {
        Role::Worker => ORole::Worker,
        Role::Server => ORole::Server,
        Role::Idle => ORole::Idle,
    }
}

/// Builds the optimizer's inputs from the AM's state.
pub fn build_snapshot(job: JobFacts, evals: &[EvalFacts], m: &Metrics) -> (Snapshot, Configuration) {
    let workers: Vec<&EvalFacts> = evals.iter().filter(|e| e.role == Role::Worker).collect();
    let bytes: Vec<f64> = workers
        .iter()
        .filter_map(|e| m.get(e.id).and_then(|x| x.bytes_per_batch.mean()))
        .collect();
    let bytes_per_mini_batch = if bytes.is_empty() {
        0.0
    } else {
        bytes.iter().sum::<f64>() / bytes.len() as f64
    };
    let mean_bw = m.mean_bandwidth().unwrap_or(UNMEASURED_BANDWIDTH);
    let speeds: Vec<f64> = evals
        .iter()
        .filter_map(|e| m.get(e.id).and_then(|x| x.cpu_speed))
        .collect();
    let mean_speed = (!speeds.is_empty()).then(|| speeds.iter().sum::<f64>() / speeds.len() as f64);
    let mut containers = Vec::new();
    let mut config = Configuration::default();
    for e in evals {
        let em = m.get(e.id);
        containers.push(ContainerMetrics {
            id: name_of(e.id),
            role: orole(e.role),
            compute_secs_per_record: em.and_then(|x| x.comp_per_record.mean()),
            cpu_speed: em.and_then(|x| x.cpu_speed),
            bandwidth_bytes_per_sec: m.node_bandwidth(e.id).unwrap_or(mean_bw),
            server_secs_per_byte: em.and_then(|x| x.server_secs_per_byte.mean()),
            input_blocks: e.input.len() as u32,
            model_blocks: e.model.len() as u32,
            mini_batches: em.map_or(0, |x| x.batches),
            reclaimed: e.reclaimed,
        });
        config.containers.insert(
            name_of(e.id),
            Holding {
                role: orole(e.role),
                input: e.input.clone(),
                model: e.model.clone(),
            },
        );
    }
    for k in 0..job.spare {
        containers.push(ContainerMetrics {
            id: new_name(k),
            role: ORole::Idle,
            compute_secs_per_record: None,
            cpu_speed: mean_speed,
            bandwidth_bytes_per_sec: mean_bw,
            server_secs_per_byte: None,
            input_blocks: 0,
            model_blocks: 0,
            mini_batches: 0,
            reclaimed: false,
        });
        config.containers.insert(
            new_name(k),
            Holding {
                role: ORole::Idle,
                input: BTreeSet::new(),
                model: BTreeSet::new(),
            },
        );
    }
    let known: BTreeMap<EvaluatorId, ()> = evals.iter().map(|e| (e.id, ())).collect();
    let links = m
        .links()
        .filter(|(a, b, _)| known.contains_key(a) && known.contains_key(b))
        .map(|(a, b, bps)| Link {
            from: name_of(a),
            to: name_of(b),
            bytes_per_sec: bps,
        })
        .collect();
    let snapshot = Snapshot {
        job: Job {
            total_records: job.records,
            mini_batch_size: u64::from(job.mini_batch),
            bytes_per_mini_batch,
            input_blocks: job.input_blocks,
            model_blocks: job.model_blocks,
            remaining_epochs: job.remaining_epochs,
            input_bytes: job.input_bytes,
            model_bytes: job.model_bytes,
        },
        containers,
        links,
    };
    (snapshot, config)
}

/// The plan executor's runner: forwards each operation to the event loop.
pub struct AmRunner {
    events: mpsc::Sender<Event>,
}

impl AmRunner {
    /// A runner that sends operations to the loop's event channel.
    pub fn new(events: mpsc::Sender<Event>) -> Self {
        AmRunner { events }
    }
}

impl OperationRunner for AmRunner {
    async fn execute(&self, op: &Operation) -> Result<OpReport, OpError> {
        let (reply, rx) = oneshot::channel();
        self.events
            .send(Event::PlanOp {
                op: op.clone(),
                reply,
            })
            .await
            .map_err(|_| OpError::new("the AM stopped"))?;
        rx.await
            .map_err(|_| OpError::new("the AM dropped the operation (job ending)"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(id_of(&name_of(12)), Some(12));
        assert_eq!(id_of(&new_name(0)), None);
        assert_eq!(id_of("x1"), None);
    }

    #[test]
    fn snapshot_agrees_with_configuration() {
        let mut m = Metrics::new(4, 0);
        m.cpu_speed(1, 2.0);
        m.cpu_speed(2, 4.0);
        m.link(1, 2, 1 << 20, 0.01);
        let evals = vec![
            EvalFacts {
                id: 1,
                role: Role::Worker,
                input: [0, 1].into(),
                model: BTreeSet::new(),
                reclaimed: false,
            },
            EvalFacts {
                id: 2,
                role: Role::Server,
                input: BTreeSet::new(),
                model: [0, 1, 2].into(),
                reclaimed: true,
            },
        ];
        let job = JobFacts {
            records: 100,
            mini_batch: 10,
            input_blocks: 2,
            model_blocks: 3,
            remaining_epochs: 4.0,
            input_bytes: 1000,
            model_bytes: 2000,
            spare: 1,
        };
        let (s, c) = build_snapshot(job, &evals, &m);
        assert_eq!(s.containers.len(), 3);
        assert_eq!(c.containers.len(), 3);
        let new = &s.containers[2];
        assert_eq!((new.id.as_str(), new.role), ("new0", ORole::Idle));
        assert_eq!(new.cpu_speed, Some(3.0), "new containers get the mean speed");
        assert!(s.containers[1].reclaimed);
        assert_eq!(s.links.len(), 1);
        for (name, h) in &c.containers {
            let cm = s.containers.iter().find(|x| &x.id == name).unwrap();
            assert_eq!((cm.role, cm.input_blocks, cm.model_blocks), (h.role, h.input.len() as u32, h.model.len() as u32));
        }
    }
}
