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

use crate::am::{AmError, Progress, Role, control};

use super::{
    ALLOCATION_NOTE_EVERY, Driver, EXIT_STATUS_WAIT, Ended, Evaluator, PendingFatal, Phase,
    role_name, stderr_note,
};

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

    /// The loop's deadlines: a lost evaluator's exit status, heartbeats,
    /// the initial allocation. A loss the job can survive is survived.
    pub(super) async fn check_time(&mut self) -> Result<(), AmError> {
        if let Some(f) = &self.pending_fatal
            && f.since.elapsed() >= EXIT_STATUS_WAIT
        {
            let (eval, error) = (f.eval, f.error.clone());
            self.pending_fatal = None;
            return Err(AmError::JobFailed(format!(
                "{} failed: {error}",
                self.describe(eval)
            )));
        }
        if let Some(loss) = &self.pending_loss
            && loss.since.elapsed() >= EXIT_STATUS_WAIT
        {
            let (eval, reason) = (loss.eval, loss.reason.clone());
            self.pending_loss = None;
            if let Err(why_not) = self.try_survive(eval, &reason).await {
                return Err(AmError::JobFailed(format!(
                    "{} lost: {reason}; the resource manager has not reported its exit status (not survived: {why_not})",
                    self.describe(eval),
                )));
            }
        }
        let timeout = Duration::from_millis(self.config.channel.heartbeat_timeout_ms);
        if self.phase != Phase::Finishing {
            let silent: Vec<(EvaluatorId, f64)> = self
                .evaluators
                .values()
                .filter(|e| e.connected && e.last_heard.elapsed() > timeout)
                .map(|e| (e.id, e.last_heard.elapsed().as_secs_f64()))
                .collect();
            for (id, secs) in silent {
                let cause = format!(
                    "sent nothing for {secs:.1} s (channel.heartbeat_timeout_ms = {})",
                    timeout.as_millis()
                );
                if let Err(why_not) = self.try_survive(id, &cause).await {
                    return Err(AmError::JobFailed(format!(
                        "{} {cause} (not survived: {why_not})",
                        self.describe(id),
                    )));
                }
            }
        }
        if self.phase == Phase::Allocating {
            let limit = Duration::from_millis(self.config.runtime.allocation_timeout_ms);
            let waited = self.started.elapsed();
            if waited > limit {
                return Err(AmError::JobFailed(format!(
                    "only {} of {} containers registered within {:.0} s (runtime.allocation_timeout_ms)",
                    self.evaluators.len(),
                    self.config.job.containers,
                    limit.as_secs_f64()
                )));
            }
            // Say so while the resource manager keeps the job waiting: every
            // 10 s, or every quarter of the limit when that is shorter.
            let every = (limit / 4).min(ALLOCATION_NOTE_EVERY);
            if self
                .allocation_noted
                .map_or(waited >= every, |t| t.elapsed() >= every)
            {
                self.allocation_noted = Some(Instant::now());
                let text = format!(
                    "still waiting for containers from the {} runtime: {} of {} registered after {:.0} s (the job gives up at {:.0} s: runtime.allocation_timeout_ms)",
                    self.links.rm.name(),
                    self.evaluators.len(),
                    self.config.job.containers,
                    waited.as_secs_f64(),
                    limit.as_secs_f64()
                );
                tracing::info!("{text}");
                let _ = self.links.progress.send(Progress::Phase(text));
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
                self.forget_reclaimed(&container);
                self.containers.entry(container.clone()).or_default().ended = Some(Ended {
                    exit,
                    diagnostics: diagnostics.clone(),
                });
                if self.phase == Phase::Finishing || self.on_container_ended(&container).await {
                    return Ok(());
                }
                let evaluator = self.containers.get(&container).and_then(|c| c.evaluator);
                if let Some(id) = evaluator
                    && (self.evaluators.get(&id).is_some_and(|e| e.gone)
                        || self.pending_fatal.as_ref().is_some_and(|f| f.eval == id))
                {
                    // Let go already (a lost worker, an unasked evaluator),
                    // or failed and said why (its failure is pending).
                    tracing::info!(
                        "container {container} of evaluator {id} ended: {exit}{}",
                        stderr_note(&diagnostics)
                    );
                    return Ok(());
                }
                let what = match evaluator {
                    Some(id) => self.describe(id),
                    None => format!("container {container} (before its evaluator registered)"),
                };
                let reason = match self.pending_loss.take() {
                    Some(loss) => format!("{}; ", loss.reason),
                    None => String::new(),
                };
                let cause = format!(
                    "{reason}its process ended: {exit}{}",
                    stderr_note(&diagnostics)
                );
                let why_not = match evaluator {
                    Some(id) => match self.try_survive(id, &cause).await {
                        Ok(()) => return Ok(()),
                        Err(why_not) => why_not,
                    },
                    None => "its evaluator never registered".into(),
                };
                return Err(AmError::JobFailed(format!(
                    "{what} lost: {cause} (not survived: {why_not})"
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
            RmEvent::Reclaiming {
                containers,
                deadline,
                reason,
            } => self.on_reclaiming(containers, deadline, reason),
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
        let conn_cancel = self.links.cancel.child_token();
        let faults = Faults::default();
        let (tx, _writer) = cruise_container::protocol::spawn_writer(
            sink,
            4096,
            faults.clone(),
            conn_cancel.clone(),
            &self.links.tracker,
            format!("control channel to evaluator {id}"),
            None,
        );
        self.links.tracker.spawn(control::read_loop(
            id,
            stream,
            self.links.events.clone(),
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
                host: String::new(),
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
                rollback: 0,
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
        e.host = host.to_string();
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

    /// `id` failed for good; the job fails too, once the loss that may
    /// have caused it had time to be heard of (`check_time`).
    pub(super) fn on_fatal(&mut self, id: EvaluatorId, error: String) {
        tracing::warn!("{} failed: {error}", self.describe(id));
        if self.pending_fatal.is_none() {
            self.pending_fatal = Some(PendingFatal {
                eval: id,
                error,
                since: Instant::now(),
            });
        }
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
        if let Err(e) = self.links.rm.release(&c).await {
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
