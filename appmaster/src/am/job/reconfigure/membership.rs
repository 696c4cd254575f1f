//! Adding, deleting and switching evaluators while training: an add's
//! container request and late registration, a delete's drain (every member
//! has applied the ownership that no longer names it) and release, a
//! switch's stop of one task and start of the other.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cruise_container::protocol::{AmToEval, EvaluatorId, INPUT_TABLE, MODEL_TABLE, TaskKind};
use cruise_optimizer::{OpError, OpReport};
use cruise_rm::{ContainerId, ContainerRequest};

use super::{AddOp, DeleteOp, DeleteStage, OpIndex, SwitchOp, ready_to_leave};
use crate::am::Role;
use crate::am::job::Driver;
use crate::am::snapshot::ContainerName;

impl Driver {
    pub(super) async fn start_add(
        &mut self,
        name: String,
        role: Role,
        op: OpIndex,
    ) -> Result<(), OpError> {
        let Some(name @ ContainerName::Offer(_)) = ContainerName::parse(&name) else {
            return Err(OpError::new(format!(
                "cannot add `{name}`: only a container the job was offered (`new<k>`) can be added"
            )));
        };
        let req = ContainerRequest {
            count: 1,
            memory_mb: self.config.runtime.container_memory_mb,
            cores: self.config.runtime.container_cores,
            hosts: Vec::new(),
        };
        if let Err(e) = self.links.rm.request(req).await {
            return Err(OpError::new(format!(
                "requesting a container for `{name}`: {e}"
            )));
        }
        self.rc.adds.push_back(AddOp {
            name,
            role,
            op,
            since: Instant::now(),
        });
        Ok(())
    }

    /// An evaluator registered while the job runs: it is an added container.
    /// Returns false if no add was waiting for it.
    pub(in crate::am::job) async fn on_late_registration(&mut self, id: EvaluatorId) -> bool {
        let Some(add) = self.rc.adds.pop_front() else {
            return false;
        };
        tracing::info!("evaluator {id} joins as `{}` ({:?})", add.name, add.role);
        if let ContainerName::Offer(k) = add.name {
            self.rc.added_offers.insert(k, id);
        }
        if let Some(e) = self.evaluators.get_mut(&id) {
            e.role = add.role;
            e.clock = self.min_clock_sent;
        }
        self.broadcast_peers().await;
        self.send(id, AmToEval::Ownership(self.owners.full())).await;
        self.start_role(id, add.role).await;
        let bytes = self.config.optimizer.probe_bytes;
        if bytes > 0
            && let Some(peer) = self.members().find(|&m| m != id)
        {
            self.send(id, AmToEval::ProbeBandwidth { to: peer, bytes })
                .await;
        }
        self.rc.joining.insert(id, add);
        true
    }

    /// An evaluator applied an ownership version.
    pub(in crate::am::job) async fn on_ownership_applied(&mut self, id: EvaluatorId, version: u64) {
        if let Some(e) = self.evaluators.get_mut(&id) {
            e.acked_version = e.acked_version.max(version);
        }
        // The first ownership a joining evaluator applies is the full table
        // sent when it joined: it can serve and route from now on.
        if let Some(add) = self.rc.joining.remove(&id) {
            self.rc.op_done(add.op, Ok(OpReport::default()));
        }
        self.progress_deletes().await;
    }

    pub(super) async fn start_delete(&mut self, name: &str, op: OpIndex) -> Result<(), OpError> {
        if self.rc.unrealized_offer(name) {
            // A container the resource manager offered that the job never
            // added: the optimizer left it idle, and there is nothing to give
            // back (the solvers may leave containers idle when a worker's
            // requests to more servers cost more than they save).
            tracing::debug!(
                container = name,
                "delete of an offer never taken: nothing to do"
            );
            self.rc.op_done(op, Ok(OpReport::default()));
            return Ok(());
        }
        let id = match self.resolve(name) {
            Ok(id) => id,
            Err(e) => return Err(e),
        };
        let (i, m) = (
            self.owned(INPUT_TABLE, id).len(),
            self.owned(MODEL_TABLE, id).len(),
        );
        if i + m > 0 {
            return Err(OpError::new(format!(
                "evaluator {id} still owns {i} input and {m} model blocks"
            )));
        }
        let task = match self.evaluators[&id].role {
            Role::Worker => Some(AmToEval::StopWorker),
            Role::Server => Some(AmToEval::StopServer),
            Role::Idle => None,
        };
        let stage = if task.is_some() {
            DeleteStage::Stopping
        } else {
            DeleteStage::Draining(self.owners.version())
        };
        tracing::debug!(evaluator = %id, ?stage, "delete started");
        self.rc.deletes.insert(id, DeleteOp { stage, op });
        if let Some(m) = task {
            self.send(id, m).await;
        }
        self.progress_deletes().await;
        Ok(())
    }

    /// What [`ready_to_leave`] decides on: each delete's stage, and each
    /// member's acknowledged ownership version.
    pub(super) fn delete_facts(
        &self,
    ) -> (
        BTreeMap<EvaluatorId, DeleteStage>,
        BTreeMap<EvaluatorId, u64>,
    ) {
        let stages = self
            .rc
            .deletes
            .iter()
            .map(|(&id, d)| (id, d.stage))
            .collect();
        let acked = self
            .members()
            .map(|m| (m, self.evaluators[&m].acked_version))
            .collect();
        (stages, acked)
    }

    /// Sends `Shutdown` to every draining evaluator whose members have all
    /// acknowledged its ownership version (see [`ready_to_leave`]).
    pub(super) async fn progress_deletes(&mut self) {
        let (stages, acked) = self.delete_facts();
        let (leaving, waiting) = ready_to_leave(&stages, &acked);
        for (id, version, behind) in waiting {
            tracing::debug!(
                evaluator = %id,
                version,
                ?behind,
                "delete waits for members to acknowledge the ownership"
            );
        }
        for id in leaving {
            if let Some(d) = self.rc.deletes.get_mut(&id) {
                d.stage = DeleteStage::Exiting;
            }
            tracing::info!("evaluator {id} leaves the job");
            self.send(
                id,
                AmToEval::Shutdown {
                    reason: "released by the optimizer".into(),
                },
            )
            .await;
            let container = self.evaluators[&id].container.clone();
            if let Err(e) = self.links.rm.release(&container).await {
                tracing::warn!("releasing container {container}: {e}");
            }
        }
    }

    /// An evaluator's task stopped during training (a delete or a switch).
    pub(in crate::am::job) async fn on_task_stopped_in_training(
        &mut self,
        id: EvaluatorId,
        task: TaskKind,
    ) {
        if let Some(d) = self.rc.deletes.get_mut(&id)
            && d.stage == DeleteStage::Stopping
        {
            d.stage = DeleteStage::Draining(self.owners.version());
            // No longer training: not counted as a worker (nor waited for by
            // SSP's clock) while it drains.
            if let Some(e) = self.evaluators.get_mut(&id) {
                e.role = Role::Idle;
            }
            // Its clock no longer holds the others back.
            self.release_clocks().await;
            self.progress_deletes().await;
            return;
        }
        if let Some(sw) = self.rc.switches.remove(&id) {
            let stopped = match task {
                TaskKind::Worker => Role::Worker,
                TaskKind::Server => Role::Server,
            };
            if stopped == sw.to {
                self.rc.switches.insert(id, sw);
                return;
            }
            self.start_role(id, sw.to).await;
            if let Some(e) = self.evaluators.get_mut(&id) {
                e.role = sw.to;
            }
            if stopped == Role::Worker {
                // Under SSP the workers ahead of it may be waiting for its
                // clock, which no longer counts: nothing else would
                // release them (they tick no more until released).
                self.release_clocks().await;
            }
            tracing::info!(
                "evaluator {id} is now a {}",
                crate::am::job::role_name(sw.to)
            );
            self.rc.op_done(sw.op, Ok(OpReport::default()));
        }
    }

    pub(super) async fn start_switch(
        &mut self,
        name: &str,
        to: Role,
        op: OpIndex,
    ) -> Result<(), OpError> {
        let id = match self.resolve(name) {
            Ok(id) => id,
            Err(e) => return Err(e),
        };
        let from = self.evaluators[&id].role;
        if from == to {
            self.rc.op_done(op, Ok(OpReport::default()));
            return Ok(());
        }
        let stop = match from {
            Role::Worker => AmToEval::StopWorker,
            Role::Server => AmToEval::StopServer,
            Role::Idle => {
                return Err(OpError::new(format!(
                    "evaluator {id} has no role to switch from"
                )));
            }
        };
        self.rc.switches.insert(id, SwitchOp { to, op });
        self.send(id, stop).await;
        Ok(())
    }

    /// A container ended while the job runs. Returns true if it was expected
    /// (a delete).
    pub(in crate::am::job) async fn on_container_ended(&mut self, container: &ContainerId) -> bool {
        let Some(id) = self.containers.get(container).and_then(|c| c.evaluator) else {
            return false;
        };
        let Some(d) = self.rc.deletes.remove(&id) else {
            return false;
        };
        if let Some(e) = self.evaluators.get_mut(&id) {
            e.gone = true;
            e.connected = false;
            e.role = Role::Idle;
        }
        self.rc.metrics.forget(id);
        self.broadcast_peers().await;
        self.rc.op_done(d.op, Ok(OpReport::default()));
        true
    }

    /// A container request failed: fail the oldest add waiting for one.
    /// Returns false if none was waiting (then the failure is the job's).
    pub(in crate::am::job) fn on_allocation_failed(&mut self, reason: &str) -> bool {
        match self.rc.adds.pop_front() {
            Some(add) => {
                self.rc.op_done(
                    add.op,
                    Err(OpError::new(format!(
                        "no container for `{}`: {reason}",
                        add.name
                    ))),
                );
                true
            }
            None => false,
        }
    }

    /// Fails adds that waited longer than the allocation timeout.
    pub(in crate::am::job) fn expire_adds(&mut self) {
        let limit = Duration::from_millis(self.config.runtime.allocation_timeout_ms);
        while self
            .rc
            .adds
            .front()
            .is_some_and(|a| a.since.elapsed() > limit)
        {
            if let Some(add) = self.rc.adds.pop_front() {
                self.rc.op_done(
                    add.op,
                    Err(OpError::new(format!(
                        "no container for `{}` within {:.0} s (runtime.allocation_timeout_ms)",
                        add.name,
                        limit.as_secs_f64()
                    ))),
                );
            }
        }
    }
}
