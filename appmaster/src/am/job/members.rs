//! Membership: the containers the resource manager reports, the evaluators
//! that connect and register from them, and their liveness (heartbeats, lost
//! evaluators and their exit statuses).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;

use cruise_container::protocol::{
    AmToEval, EvaluatorId, Faults, INPUT_TABLE, JobSetup, MODEL_TABLE, STATE_TABLE,
};
use cruise_rm::{ContainerId, RmEvent};

use crate::am::{AmError, Role, control};

use super::{Driver, EXIT_STATUS_WAIT, Ended, Evaluator, Phase, role_name, stderr_note};

impl Driver {
    pub(super) fn describe(&self, id: EvaluatorId) -> String {
        match self.evaluators.get(&id) {
            Some(e) => format!(
                "evaluator {id} ({}, container {}, pid {})",
                role_name(e.role),
                e.container,
                e.pid
            ),
            None => format!("evaluator {id}"),
        }
    }

    pub(super) fn check_time(&mut self) -> Result<(), AmError> {
        if let Some(loss) = &self.pending_loss
            && loss.since.elapsed() >= EXIT_STATUS_WAIT
        {
            return Err(AmError::JobFailed(format!(
                "{} lost: {}; the resource manager has not reported its exit status",
                self.describe(loss.eval),
                loss.reason
            )));
        }
        let timeout = Duration::from_millis(self.config.channel.heartbeat_timeout_ms);
        if self.phase != Phase::Finishing {
            for e in self.evaluators.values().filter(|e| e.connected) {
                if e.last_heard.elapsed() > timeout {
                    return Err(AmError::JobFailed(format!(
                        "{} sent nothing for {:.1} s (channel.heartbeat_timeout_ms = {})",
                        self.describe(e.id),
                        e.last_heard.elapsed().as_secs_f64(),
                        timeout.as_millis()
                    )));
                }
            }
        }
        if self.phase == Phase::Allocating {
            let limit = Duration::from_millis(self.config.runtime.allocation_timeout_ms);
            if self.started.elapsed() > limit {
                return Err(AmError::JobFailed(format!(
                    "only {} of {} containers registered within {:.0} s (runtime.allocation_timeout_ms)",
                    self.evaluators.len(),
                    self.config.job.containers,
                    limit.as_secs_f64()
                )));
            }
        }
        Ok(())
    }

    pub(super) async fn on_rm(&mut self, ev: RmEvent) -> Result<(), AmError> {
        match ev {
            RmEvent::Allocated { container, host } => {
                tracing::debug!(%container, %host, "container allocated");
                self.containers.entry(container).or_default();
            }
            RmEvent::Running { container, pid } => {
                tracing::debug!(%container, ?pid, "container running");
            }
            RmEvent::Completed {
                container,
                exit,
                diagnostics,
                released: _,
            } => {
                self.containers.entry(container.clone()).or_default().ended = Some(Ended {
                    exit,
                    diagnostics: diagnostics.clone(),
                });
                if self.phase == Phase::Finishing || self.on_container_ended(&container).await {
                    return Ok(());
                }
                let c = self.containers.entry(container.clone()).or_default();
                let what = match c.evaluator {
                    Some(id) => self.describe(id),
                    None => format!("container {container} (before its evaluator registered)"),
                };
                let reason = match self.pending_loss.take() {
                    Some(loss) => format!("{}; ", loss.reason),
                    None => String::new(),
                };
                return Err(AmError::JobFailed(format!(
                    "{what} lost: {reason}its process ended: {exit}{}",
                    stderr_note(&diagnostics)
                )));
            }
            RmEvent::AllocationFailed { reason } => {
                if !self.on_allocation_failed(&reason) {
                    return Err(AmError::JobFailed(format!(
                        "container allocation failed: {reason}"
                    )));
                }
            }
            RmEvent::CapacityChanged { max_containers } => self.on_capacity(max_containers),
        }
        Ok(())
    }

    pub(super) async fn accept(
        &mut self,
        container: ContainerId,
        framed: control::ControlFramed,
        remote: SocketAddr,
    ) -> Result<(), AmError> {
        if self.phase == Phase::Finishing {
            return Ok(());
        }
        if self
            .containers
            .get(&container)
            .is_some_and(|c| c.evaluator.is_some())
        {
            tracing::warn!(
                "container {container} connected twice (from {remote}); ignoring the second"
            );
            return Ok(());
        }
        let id = self.next_eval;
        self.next_eval.0 += 1;
        let (sink, stream) = framed.split();
        let conn_cancel = self.cancel.child_token();
        let faults = Faults::default();
        let (tx, _writer) = cruise_container::protocol::spawn_writer(
            sink,
            4096,
            faults.clone(),
            conn_cancel.clone(),
            &self.tracker,
            format!("control channel to evaluator {id}"),
        );
        self.tracker.spawn(control::read_loop(
            id,
            stream,
            self.events.clone(),
            faults,
            conn_cancel.clone(),
        ));
        self.containers
            .entry(container.clone())
            .or_default()
            .evaluator = Some(id);
        self.evaluators.insert(
            id,
            Evaluator {
                id,
                container,
                tx,
                conn_cancel,
                data_addr: None,
                pid: 0,
                role: Role::Idle,
                last_heard: Instant::now(),
                rss: 0,
                peak_rss: 0,
                store_bytes: 0,
                max_store_bytes: 0,
                clock: 0,
                awaiting: None,
                connected: true,
                gone: false,
                acked_version: 0,
            },
        );
        Ok(())
    }

    /// An evaluator registered: its setup, then the phase's use of it (the
    /// initial configuration, a planned add) or, if nobody asked for it,
    /// its release.
    pub(super) async fn on_registered(
        &mut self,
        id: EvaluatorId,
        data_addr: SocketAddr,
        pid: u32,
        host: &str,
        cpu_speed: f64,
    ) -> Result<(), AmError> {
        self.rc.metrics.cpu_speed(id, cpu_speed);
        let e = self
            .evaluators
            .get_mut(&id)
            .ok_or_else(|| AmError::JobFailed(format!("evaluator {id} vanished")))?;
        e.data_addr = Some(data_addr);
        e.pid = pid;
        tracing::info!(evaluator = %id, container = %e.container, pid, %host, %data_addr, "evaluator registered");
        let setup = JobSetup {
            evaluator: id,
            config: self.config.clone(),
            app: self.params.clone(),
            tables: vec![
                (MODEL_TABLE, self.config.store.model_blocks),
                (INPUT_TABLE, self.splits.len() as u32),
                (STATE_TABLE, self.splits.len() as u32),
            ],
        };
        self.send(id, AmToEval::Setup(Box::new(setup))).await;
        let registered = self
            .evaluators
            .values()
            .filter(|e| e.data_addr.is_some())
            .count() as u32;
        if self.phase == Phase::Allocating {
            if registered >= self.config.job.containers {
                self.start_loading().await;
            }
        } else if !(self.phase == Phase::Training && self.on_late_registration(id).await) {
            self.release_unasked(id).await;
        }
        Ok(())
    }

    /// Gives back an evaluator nobody asked for (e.g. an add that timed
    /// out).
    pub(super) async fn release_unasked(&mut self, id: EvaluatorId) {
        tracing::warn!(
            "{} registered unexpectedly; releasing it",
            self.describe(id)
        );
        self.send(
            id,
            AmToEval::Shutdown {
                reason: "not needed".into(),
            },
        )
        .await;
        let Some(e) = self.evaluators.get_mut(&id) else {
            return;
        };
        e.gone = true;
        let c = e.container.clone();
        if let Err(e) = self.rm.release(&c).await {
            tracing::warn!("releasing container {c}: {e}");
        }
    }

    pub(super) fn all_containers_done(&self) -> bool {
        self.evaluators.values().all(|e| {
            self.containers
                .get(&e.container)
                .is_some_and(|c| c.ended.is_some())
        })
    }

    /// Whether the job has waited long enough for the resource manager to
    /// report its containers' ends after asking the evaluators to leave:
    /// their grace (`runtime.release_grace_ms`) and a heartbeat timeout.
    /// The job's result does not depend on those reports, so it ends
    /// without them, naming the containers whose end was never reported
    /// (the resource manager's shutdown stops them).
    pub(super) fn finishing_overdue(&self) -> bool {
        let limit = Duration::from_millis(
            self.config
                .runtime
                .release_grace_ms
                .saturating_add(self.config.channel.heartbeat_timeout_ms),
        );
        if self.finishing_since.is_none_or(|t| t.elapsed() < limit) {
            return false;
        }
        let missing: Vec<&str> = self
            .evaluators
            .values()
            .filter(|e| {
                self.containers
                    .get(&e.container)
                    .is_none_or(|c| c.ended.is_none())
            })
            .map(|e| e.container.as_str())
            .collect();
        tracing::warn!(
            "the resource manager has not reported the end of {} within {:.1} s of the shutdown; finishing without it",
            missing.join(", "),
            limit.as_secs_f64()
        );
        true
    }

    pub(super) async fn shutdown_all(&mut self, reason: &str) {
        let ids: Vec<EvaluatorId> = self.evaluators.keys().copied().collect();
        for id in ids {
            if let Some(e) = self.evaluators.get(&id) {
                let _ = e.tx.try_send(AmToEval::Shutdown {
                    reason: reason.to_string(),
                });
            }
        }
    }
}
