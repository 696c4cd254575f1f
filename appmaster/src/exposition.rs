//! `GET /metrics`: the job in the Prometheus text format, encoded by the
//! official client (`prometheus-client`).
//!
//! Every scrape builds a registry from the status snapshot and the history
//! the job published, and encodes it; nothing is registered or counted on
//! the job's loop, so a scrape costs the job nothing. Counters are the
//! job's running totals (records, mini-batches, seconds, bytes, requests
//! per evaluator; plans and their operations by kind and outcome; workers
//! lost and survived); gauges
//! are its state now (phase, epochs, evaluators by role, memory, measured
//! link capacity, the last epoch's figures). Per-evaluator series are
//! labelled `evaluator`; the role is on `cruise_evaluator_info`, so a
//! counter keeps its series when its evaluator switches role.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::am::Status;
use crate::am::history::Record;

/// The `Content-Type` of what [`encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

type Labels = Vec<(&'static str, String)>;
type CounterF = Counter<f64, AtomicU64>;
type GaugeF = Gauge<f64, AtomicU64>;

/// A registry under construction: families registered by name.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn family<M>(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, M>
    where
        M: Default + std::fmt::Debug + Send + Sync + 'static,
        Family<Labels, M>: prometheus_client::registry::Metric + Clone,
    {
        let f = Family::<Labels, M>::default();
        match unit {
            Some(u) => self.registry.register_with_unit(name, help, u, f.clone()),
            None => self.registry.register(name, help, f.clone()),
        }
        f
    }

    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, CounterF> {
        self.family(name, help, unit)
    }

    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, GaugeF> {
        self.family(name, help, unit)
    }
}

fn count(f: &Family<Labels, CounterF>, labels: Labels, v: f64) {
    if v.is_finite() && v >= 0.0 {
        f.get_or_create(&labels).inc_by(v);
    }
}

fn set(f: &Family<Labels, GaugeF>, labels: Labels, v: f64) {
    if v.is_finite() {
        f.get_or_create(&labels).set(v);
    }
}

/// The job's metrics in the Prometheus text format (version 0.0.4).
pub fn encode(status: &Status, history: &[Record]) -> Result<String, std::fmt::Error> {
    let mut b = Builder {
        registry: Registry::with_prefix("cruise"),
    };
    job(&mut b, status, history);
    evaluators(&mut b, status);
    traffic(&mut b, status);
    links(&mut b, status);
    last_epoch(&mut b, status);
    plans(&mut b, history);
    let lost = b.counter(
        "workers_lost",
        "Workers the job lost and went on without (job.max_failures)",
        None,
    );
    count(&lost, vec![], status.lost.len() as f64);
    let mut out = String::new();
    prometheus_text::encode(&mut out, &b.registry)?;
    Ok(out)
}

/// The job's identity, phase, progress and capacity.
fn job(b: &mut Builder, status: &Status, history: &[Record]) {
    let info = b.gauge("job_info", "The job: its id and app (always 1)", None);
    let phase = b.gauge("job_phase", "The job's phase (1 for the current one)", None);
    let epochs = b.gauge("epochs_done", "Epochs trained", None);
    let epochs_target = b.gauge("epochs_target", "Epochs to train", None);
    let records = b.counter("records_processed", "Records trained on", None);
    let capacity = b.gauge(
        "capacity_containers",
        "Containers the job may hold now",
        None,
    );
    set(
        &info,
        vec![("job_id", status.job_id.clone())]
            .into_iter()
            .chain(history.iter().find_map(|r| match r {
                Record::Job { app, .. } => Some(("app", app.clone())),
                _ => None,
            }))
            .collect(),
        1.0,
    );
    set(&phase, vec![("phase", status.phase.clone())], 1.0);
    set(&epochs, Vec::new(), f64::from(status.epochs_done));
    set(&epochs_target, Vec::new(), f64::from(status.epochs));
    count(&records, Vec::new(), status.records_processed as f64);
    set(&capacity, Vec::new(), f64::from(status.capacity));
}

/// The labels of an evaluator's series.
fn ev(id: u32) -> Labels {
    vec![("evaluator", format!("e{id}"))]
}

/// Evaluators by role, and each one's container, host, role and memory.
fn evaluators(b: &mut Builder, status: &Status) {
    let by_role = b.gauge("evaluators", "Evaluators by role", None);
    let eval_info = b.gauge(
        "evaluator_info",
        "An evaluator: its container, host and role now (always 1)",
        None,
    );
    let rss = b.gauge(
        "evaluator_resident_memory",
        "An evaluator's resident set size",
        Some(Unit::Bytes),
    );
    let held = b.gauge(
        "evaluator_store",
        "Bytes of blocks an evaluator holds",
        Some(Unit::Bytes),
    );
    for role in ["worker", "server", "idle"] {
        let n = status
            .evaluators
            .iter()
            .filter(|e| crate::am::role_name(e.role) == role)
            .count();
        set(&by_role, vec![("role", role.to_string())], n as f64);
    }
    for e in &status.evaluators {
        set(
            &eval_info,
            vec![
                ("evaluator", format!("e{}", e.id.0)),
                ("container", e.container.clone()),
                ("host", e.host.clone()),
                ("role", crate::am::role_name(e.role).to_string()),
            ],
            1.0,
        );
        set(&rss, ev(e.id.0), e.rss_bytes as f64);
        set(&held, ev(e.id.0), e.store_bytes as f64);
    }
}

/// What each worker computed and exchanged, and what each server served.
fn traffic(b: &mut Builder, status: &Status) {
    let mini_batches = b.counter("worker_mini_batches", "Mini-batches a worker ran", None);
    let worker_records = b.counter("worker_records", "Records a worker trained on", None);
    let compute = b.counter(
        "worker_compute",
        "Seconds a worker computed",
        Some(Unit::Seconds),
    );
    let pull = b.counter(
        "worker_pull",
        "Seconds of a worker's timed pull round trips",
        Some(Unit::Seconds),
    );
    let push = b.counter(
        "worker_push",
        "Seconds of a worker's timed push round trips",
        Some(Unit::Seconds),
    );
    let pulled = b.counter("worker_pulled", "Bytes a worker pulled", Some(Unit::Bytes));
    let pushed = b.counter("worker_pushed", "Bytes a worker pushed", Some(Unit::Bytes));
    let requests = b.counter("server_requests", "Requests a server served", None);
    let serve = b.counter(
        "server_busy",
        "Seconds a server spent serving (at its CPU share)",
        Some(Unit::Seconds),
    );
    let received = b.counter(
        "server_received",
        "Bytes a server received in requests",
        Some(Unit::Bytes),
    );
    let sent = b.counter(
        "server_sent",
        "Bytes a server sent in answers",
        Some(Unit::Bytes),
    );
    for t in &status.metrics.totals {
        let l = || ev(t.id.0);
        if t.mini_batches > 0 {
            count(&mini_batches, l(), t.mini_batches as f64);
            count(&worker_records, l(), t.records as f64);
            count(&compute, l(), t.compute_secs);
            count(&pull, l(), t.pull_secs);
            count(&push, l(), t.push_secs);
            count(&pulled, l(), t.pull_bytes as f64);
            count(&pushed, l(), t.push_bytes as f64);
        }
        if t.requests > 0 {
            count(&requests, l(), t.requests as f64);
            count(&serve, l(), t.serve_secs);
            count(&received, l(), t.served_bytes_in as f64);
            count(&sent, l(), t.served_bytes_out as f64);
        }
    }
}

/// Each measured link's capacity.
fn links(b: &mut Builder, status: &Status) {
    let link = b.gauge(
        "link_capacity_bytes_per_second",
        "A link's capacity as measured by bulk transfers (probes and block moves)",
        None,
    );
    for c in &status.metrics.capacity {
        set(
            &link,
            vec![
                ("from", format!("e{}", c.from.0)),
                ("to", format!("e{}", c.to.0)),
            ],
            c.bytes_per_sec,
        );
    }
}

/// The last epoch's loss, accuracy and duration.
fn last_epoch(b: &mut Builder, status: &Status) {
    let loss = b.gauge(
        "last_epoch_loss",
        "The training loss of the last epoch",
        None,
    );
    let accuracy = b.gauge(
        "last_epoch_accuracy_ratio",
        "The training accuracy of the last epoch (0 to 1)",
        None,
    );
    let epoch_secs = b.gauge(
        "last_epoch_duration",
        "The wall time of the last epoch",
        Some(Unit::Seconds),
    );
    if let Some(e) = &status.last_epoch {
        set(&loss, Vec::new(), e.stats.mean_loss());
        if e.stats.correct > 0 {
            set(&accuracy, Vec::new(), e.stats.accuracy());
        }
        set(&epoch_secs, Vec::new(), e.secs);
    }
}

/// The plans that ended, by outcome, and their operations by kind.
fn plans(b: &mut Builder, history: &[Record]) {
    let plans = b.counter(
        "plans",
        "Reconfiguration plans that ended, by outcome",
        None,
    );
    let ops = b.counter(
        "plan_operations",
        "Operations of the plans that ended, by kind and outcome",
        None,
    );
    let op_secs = b.counter(
        "plan_operation_duration",
        "Seconds the plans' operations ran, by kind",
        Some(Unit::Seconds),
    );
    let moved = b.counter(
        "plan_moved",
        "Bytes the plans' operations moved, by kind",
        Some(Unit::Bytes),
    );
    for r in history {
        let Record::PlanEnded { ops: list, .. } = r else {
            continue;
        };
        let outcome = if list.iter().all(|o| o.outcome == "succeeded") {
            "succeeded"
        } else {
            "partly_failed"
        };
        count(&plans, vec![("outcome", outcome.to_string())], 1.0);
        for o in list {
            let kind = o.kind.replace(' ', "_");
            count(
                &ops,
                vec![("kind", kind.clone()), ("outcome", o.outcome.clone())],
                1.0,
            );
            count(&op_secs, vec![("kind", kind.clone())], o.secs);
            count(&moved, vec![("kind", kind)], o.bytes as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::am::history::OpRecord;

    fn op(kind: &str, outcome: &str) -> OpRecord {
        OpRecord {
            kind: kind.into(),
            what: String::new(),
            outcome: outcome.into(),
            start_secs: Some(0.0),
            secs: 0.5,
            bytes: 10,
            error: None,
        }
    }

    #[test]
    fn plans_and_operations_are_counted_by_kind_and_outcome() {
        let status = Status {
            job_id: "job_1".into(),
            phase: "training".into(),
            records_processed: 42,
            lost: vec!["evaluator 3 lost".into()],
            ..Status::default()
        };
        let history = vec![
            Record::PlanEnded {
                plan: 1,
                at_secs: 1.0,
                secs: 1.0,
                ops: vec![op("move input", "succeeded"), op("add", "succeeded")],
            },
            Record::PlanEnded {
                plan: 2,
                at_secs: 2.0,
                secs: 1.0,
                ops: vec![op("move input", "succeeded"), op("delete", "failed")],
            },
        ];
        let text = encode(&status, &history).unwrap();
        for line in [
            "cruise_records_processed_total 42.0",
            "cruise_workers_lost_total 1.0",
            r#"cruise_plans_total{outcome="succeeded"} 1.0"#,
            r#"cruise_plans_total{outcome="partly_failed"} 1.0"#,
            r#"cruise_plan_operations_total{kind="move_input",outcome="succeeded"} 2.0"#,
            r#"cruise_plan_operations_total{kind="delete",outcome="failed"} 1.0"#,
            r#"cruise_plan_moved_bytes_total{kind="move_input"} 20.0"#,
            r#"cruise_job_phase{phase="training"} 1.0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
