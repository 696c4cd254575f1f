//! When to reconfigure: every `optimizer.interval_ms` while training (at
//! once when the resource manager takes capacity back) the loop builds a
//! snapshot of the job's measurements and asks the trigger policy; what it
//! decided, the roles asked for from outside the job (`am::Request`, kept
//! until the job is free to plan them), and the capacity the resource
//! manager offers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use cruise_container::protocol::{EvaluatorId, INPUT_TABLE, MODEL_TABLE};
use cruise_optimizer::{Decision, Snapshot};

use super::{effective_mini_batch, plan_snapshot_path, write_snapshot};
use crate::am::job::{Driver, Phase, plural, split_text};
use crate::am::snapshot::{ContainerName, EvalFacts, JobFacts, build_snapshot};
use crate::am::{Event, Role};

impl Driver {
    // ------------------------------------------------------------------
    // Deciding
    // ------------------------------------------------------------------

    /// On the loop's tick: looks at the metrics and starts a plan if one pays.
    pub(in crate::am::job) fn maybe_reconfigure(&mut self) {
        let rc = &self.rc;
        if !rc.enabled
            || self.phase != Phase::Training
            || rc.plan.is_some()
            || rc.deciding.is_some()
            || rc.stop_deferred
            || rc.requested.is_some()
            || !rc.recoveries.is_empty()
            || !rc.restores.is_empty()
            || rc.recount.is_some()
            || (rc.reclaim.is_none()
                && !self.reclaiming_members()
                && rc.last_check.elapsed() < rc.interval)
        {
            return;
        }
        self.rc.last_check = Instant::now();
        let evals = self.eval_facts();
        // A server that has not reported what serving costs it would be
        // priced at the others' cost per unit of CPU speed, or at nothing
        // when none has: wait for it (forced plans do not).
        if !evals.iter().any(|e| e.reclaimed)
            && let Some(e) = evals.iter().find(|e| {
                !e.model.is_empty()
                    && self
                        .rc
                        .metrics
                        .get(e.id)
                        .is_none_or(|m| m.server_secs_per_byte.is_empty())
            })
        {
            let text = format!(
                "waiting: server {} has not reported what serving costs it yet",
                crate::am::snapshot::ContainerName::Evaluator(e.id)
            );
            self.note_decision(text);
            return;
        }
        let (mut snapshot, current) =
            build_snapshot(self.job_facts(&evals), &evals, &self.rc.metrics);
        snapshot.policy = Some(self.rc.policy.state());
        let file = &self.config.optimizer.snapshot_file;
        if !file.is_empty() {
            write_snapshot(std::path::Path::new(file), &snapshot);
        }
        // The search can take a while (bounded by the solver's node budget):
        // off the loop, which goes on answering evaluators meanwhile.
        let policy = self.rc.policy.clone();
        let events = self.links.events.clone();
        self.rc.deciding = Some(evals);
        self.links.tracker.spawn(async move {
            let looked = tokio::task::spawn_blocking(move || {
                let splits = crate::whatif::split_epochs(&snapshot);
                let decided = policy
                    .decide(&snapshot, &current)
                    .map(|d| (Box::new(snapshot), d))
                    .map_err(|e| e.to_string());
                (decided, splits)
            })
            .await;
            let (decided, splits) = looked.unwrap_or_else(|e| {
                (
                    Err(format!("the optimizer's search failed: {e}")),
                    Vec::new(),
                )
            });
            let _ = events.send(Event::Decided { decided, splits }).await;
        });
    }

    /// What the optimizer is told about the job as a whole, with `evals`
    /// its members.
    fn job_facts(&self, evals: &[EvalFacts]) -> JobFacts {
        let done = self.records_done as f64 / self.records_per_epoch.max(1) as f64;
        let held = evals.len() as u32 + self.rc.adds.len() as u32;
        JobFacts {
            records: self.records_per_epoch,
            // The mean mini-batch the workers run: blocks are cut into
            // near-equal mini-batches, so the cost model's D / (L·B) counts
            // the round trips an epoch really takes.
            mini_batch: effective_mini_batch(
                self.records_per_epoch,
                self.rc.mini_batches_per_epoch,
                self.config.job.mini_batch,
            ),
            input_blocks: self.splits.len() as u32,
            model_blocks: self.config.store.model_blocks,
            remaining_epochs: (f64::from(self.config.job.epochs) - done).max(0.0),
            input_bytes: self.rc.input_bytes.values().sum(),
            model_bytes: self
                .evaluators
                .values()
                .filter(|e| !e.gone && e.role == Role::Server)
                .map(|e| e.store_bytes)
                .sum(),
            spare: self.rc.capacity.saturating_sub(held) as usize,
            noise_tolerance: self.config.optimizer.noise_tolerance,
            bandwidth_noise_tolerance: self.config.optimizer.bandwidth_noise_tolerance,
            pipeline_depth: cruise_container::ps::pipeline_depth(
                self.config.job.in_flight() as usize,
                evals
                    .iter()
                    .filter(|e| e.role == Role::Worker && !e.input.is_empty())
                    .count(),
            ) as u32,
            asynchronous: self.config.job.sync == cruise_conf::SyncMode::Async,
        }
    }

    /// A request from outside the job ([`crate::am::Request`]): kept
    /// until the job is free to plan it ([`Driver::step_request`]).
    pub(in crate::am::job) fn on_request(&mut self, request: crate::am::Request) {
        if self.rc.requested.is_some() {
            let crate::am::Request::Roles { reply, .. } = request;
            let _ = reply.send(Err("another request is waiting".into()));
            return;
        }
        self.rc.requested = Some(request);
    }

    /// Plans the roles asked for once nothing else is under way (a plan,
    /// a look of the optimizer, a recovery, a recount), while the job
    /// trains; refuses them once training is over.
    pub(in crate::am::job) fn step_request(&mut self) {
        if self.rc.requested.is_none() {
            return;
        }
        let over = self.rc.stop_deferred
            || !matches!(
                self.phase,
                Phase::Allocating | Phase::Loading | Phase::Training
            );
        let busy = self.phase != Phase::Training
            || self.rc.plan.is_some()
            || self.rc.deciding.is_some()
            || !self.rc.recoveries.is_empty()
            || !self.rc.restores.is_empty()
            || self.rc.recount.is_some();
        if busy && !over {
            return;
        }
        let Some(crate::am::Request::Roles { roles, reply }) = self.rc.requested.take() else {
            return;
        };
        let answer = if over {
            Err(format!(
                "training is over (the job is {})",
                self.phase.name()
            ))
        } else {
            self.plan_roles(&roles)
        };
        match &answer {
            Ok(summary) => tracing::info!("roles asked for: {summary}"),
            Err(e) => tracing::info!("roles asked for, not planned: {e}"),
        }
        let _ = reply.send(answer);
    }

    /// Starts the plan to `roles`; its summary, or why it did not start.
    fn plan_roles(&mut self, roles: &BTreeMap<EvaluatorId, Role>) -> Result<String, String> {
        let evals = self.eval_facts();
        let (mut snapshot, current) =
            build_snapshot(self.job_facts(&evals), &evals, &self.rc.metrics);
        snapshot.policy = Some(self.rc.policy.state());
        let names = roles
            .iter()
            .map(|(&id, &role)| (ContainerName::Evaluator(id).to_string(), role))
            .collect();
        let p = self
            .rc
            .policy
            .propose_roles(&snapshot, &current, &names)
            .map_err(|e| e.to_string())?;
        if p.plan.is_empty() {
            return Err("the job already has those roles".into());
        }
        Ok(self.reconfigure(p, Box::new(snapshot), true))
    }

    /// What the optimizer is told about each member, the reclaimed ones marked.
    pub(super) fn eval_facts(&self) -> Vec<EvalFacts> {
        let members: Vec<EvaluatorId> = self.members().collect();
        let reclaim = self.rc.reclaim.map_or(0, |r| r.0) as usize;
        // Give back the newest containers: the resource manager preempts those first.
        let mut reclaimed: BTreeSet<EvaluatorId> =
            members.iter().rev().take(reclaim).copied().collect();
        // And those the resource manager named, with notice.
        reclaimed.extend(members.iter().filter(|id| {
            self.rc
                .reclaiming
                .contains_key(&self.evaluators[id].container)
        }));
        members
            .iter()
            .map(|&id| EvalFacts {
                id,
                role: self.evaluators[&id].role,
                input: self.owned(INPUT_TABLE, id),
                model: self.owned(MODEL_TABLE, id),
                reclaimed: reclaimed.contains(&id),
            })
            .collect()
    }

    /// The optimizer decided on `snapshot`. The decision stands if the job
    /// is as it was then (same members, roles, blocks and containers
    /// reclaimed, no plan started); otherwise the job is looked at again at
    /// the next tick.
    pub(in crate::am::job) fn on_decided(
        &mut self,
        decided: Result<(Box<Snapshot>, Decision), String>,
        splits: Vec<(u32, u32, f64)>,
    ) {
        let Some(asked) = self.rc.deciding.take() else {
            return;
        };
        if !splits.is_empty() {
            self.rc.last_splits = splits;
        }
        if self.phase != Phase::Training
            || self.rc.plan.is_some()
            || self.rc.stop_deferred
            || self.rc.recount.is_some()
        {
            return;
        }
        if self.eval_facts() != asked {
            tracing::debug!("the job changed while the optimizer decided; looking again");
            self.rc.last_check = Instant::now()
                .checked_sub(self.rc.interval)
                .unwrap_or_else(Instant::now);
            return;
        }
        let (snapshot, decision) = match decided {
            Ok(d) => d,
            Err(e) => {
                self.note_decision(format!("not planning: {e}"));
                return;
            }
        };
        match self.rc.policy.confirm(decision) {
            Decision::Wait { reason } => self.note_decision(format!("waiting: {reason}")),
            Decision::Stay {
                current_epoch_secs,
                best_epoch_secs,
                gain,
                reason,
            } => self.note_decision(format!(
                "staying at {}: predicted epoch {current_epoch_secs:.3} s, best {best_epoch_secs:.3} s ({:.1}% gain): {reason}",
                split_text(self.role_counts().0, self.role_counts().1),
                gain * 100.0
            )),
            Decision::Considering {
                workers,
                servers,
                look,
                of,
                current_epoch_secs,
                predicted_epoch_secs,
            } => self.note_decision(format!(
                "considering {} (look {look} of {of}): predicted epoch {current_epoch_secs:.3} s → {predicted_epoch_secs:.3} s",
                split_text(workers, servers),
            )),
            Decision::Reconfigure(p) => {
                self.reconfigure(*p, snapshot, false);
            }
        }
    }

    /// Starts the plan a confirmed decision proposed, or one `asked` for
    /// from outside (under `optimizer.advise_only` the optimizer's own only
    /// says what it would do): the summary to the log and the user, the
    /// snapshot it was decided from beside the latest, the split being left
    /// to the policy's memory, the history. Returns the summary.
    fn reconfigure(
        &mut self,
        p: cruise_optimizer::Proposal,
        snapshot: Box<Snapshot>,
        asked: bool,
    ) -> String {
        let (w, s) = self.role_counts();
        let tw = p.target.values().filter(|x| x.role == Role::Worker).count() as u32;
        let ts = p.target.values().filter(|x| x.role == Role::Server).count() as u32;
        if !p.forced && !asked && self.config.optimizer.advise_only {
            let text = format!(
                "would reconfigure to {} (optimizer.advise_only): predicted epoch {:.3} s → {:.3} s ({:.1}% gain)",
                split_text(tw, ts),
                p.current_epoch_secs,
                p.predicted_epoch_secs,
                p.gain * 100.0
            );
            self.note_decision(text.clone());
            return text;
        }
        let (bi, bm) = p.plan.blocks_moved();
        let summary = format!(
            "{} → {}: predicted epoch {:.3} s → {:.3} s ({:.1}% gain{}), {} ({} input and {} model blocks moved), predicted cost {:.1} s",
            split_text(w, s),
            split_text(tw, ts),
            p.current_epoch_secs,
            p.predicted_epoch_secs,
            p.gain * 100.0,
            if p.forced {
                "; forced: the resource manager reclaims containers"
            } else if asked {
                "; asked for"
            } else {
                ""
            },
            plural(p.plan.ops.len() as u32, "operation"),
            bi,
            bm,
            p.predicted_cost_secs
        );
        self.note_decision(format!("reconfiguring: {summary}"));
        let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
            "reconfiguring: {summary}"
        )));
        let file = &self.config.optimizer.snapshot_file;
        if !file.is_empty() {
            // What the optimizer saw when it decided, for `cruise plan`.
            let n = self.rc.history.len() + 1;
            write_snapshot(
                &plan_snapshot_path(std::path::Path::new(file), n),
                &snapshot,
            );
        }
        self.rc.policy.leaving(&snapshot, Some(&p));
        self.links.history.push(crate::am::history::Record::Splits {
            at_secs: self.links.history.now(),
            splits: self.rc.last_splits.clone(),
        });
        let started = crate::am::history::Record::PlanStarted {
            plan: self.rc.history.len() + 1,
            at_secs: self.links.history.now(),
            summary: summary.clone(),
            predicted_before_secs: p.current_epoch_secs,
            predicted_after_secs: p.predicted_epoch_secs,
            forced: p.forced,
        };
        self.start_plan(p.plan, *snapshot, summary.clone(), started);
        summary
    }

    pub(super) fn note_decision(&mut self, text: String) {
        if self.rc.last_decision.as_deref() != Some(text.as_str()) {
            tracing::info!("optimizer: {text}");
            self.links
                .history
                .push(crate::am::history::Record::Decision {
                    at_secs: self.links.history.now(),
                    text: text.clone(),
                });
        }
        self.rc.last_decision = Some(text);
    }

    /// The resource manager's capacity changed.
    /// Asks a cluster's resource manager what the job may hold when training
    /// starts: until it reports a change, the optimizer plans with that, not
    /// with the configured ceiling (a cluster with room for fewer would
    /// leave the plan's adds waiting for containers that never come).
    pub(in crate::am::job) async fn learn_capacity(&mut self) {
        if self.config.runtime.kind == cruise_conf::RuntimeKind::Local {
            return;
        }
        let held = self.members().count() as u32;
        match self.links.rm.capacity().await {
            Ok(c) => {
                let ceiling = self.config.runtime.capacity_ceiling(&self.config.job);
                self.rc.capacity = c.max_containers.min(ceiling).max(held);
                tracing::info!(
                    capacity = self.rc.capacity,
                    offered = c.max_containers,
                    ceiling,
                    "resource manager capacity at the start of training"
                );
            }
            Err(e) => tracing::warn!(
                "reading the resource manager's capacity failed ({e}); planning with {}",
                self.rc.capacity
            ),
        }
    }

    /// Whether a member's container is being taken back with notice.
    fn reclaiming_members(&self) -> bool {
        !self.rc.reclaiming.is_empty()
            && self.members().any(|id| {
                self.rc
                    .reclaiming
                    .contains_key(&self.evaluators[&id].container)
            })
    }

    /// The resource manager takes `containers` back at `deadline`: they are
    /// marked reclaimed, so the next look (at once, while training) forces
    /// a plan that empties and deletes them, which releases them. Until
    /// training, they wait; a container whose deadline passes first is taken
    /// by the cluster, and its end is a loss like any other.
    pub(in crate::am::job) fn on_reclaiming(
        &mut self,
        containers: Vec<cruise_rm::ContainerId>,
        deadline: Instant,
        reason: String,
    ) {
        let secs = deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        let text = format!(
            "the resource manager takes back {} within {secs:.0} s ({reason}): {}",
            plural(containers.len() as u32, "container"),
            containers.join(", ")
        );
        tracing::info!("{text}");
        let _ = self.links.progress.send(crate::am::Progress::Phase(text));
        for c in containers {
            if self.containers.get(&c).is_some_and(|c| c.ended.is_some()) {
                continue;
            }
            self.rc.reclaiming.insert(c, (deadline, reason.clone()));
        }
    }

    /// A container ended: it is no longer waiting to be taken back.
    pub(in crate::am::job) fn forget_reclaimed(&mut self, container: &str) {
        if let Some((deadline, reason)) = self.rc.reclaiming.remove(container) {
            let early = deadline.saturating_duration_since(Instant::now());
            tracing::info!(
                "container {container}, reclaimed by the resource manager ({reason}), ended {:.1} s before its deadline",
                early.as_secs_f64()
            );
        }
    }

    pub(in crate::am::job) fn on_capacity(&mut self, offered: u32) {
        // A cluster may offer more than the job is allowed to hold; the local
        // runtime's capacity is the job's own setting already.
        let max = if self.config.runtime.kind == cruise_conf::RuntimeKind::Local {
            offered
        } else {
            offered.min(self.config.runtime.capacity_ceiling(&self.config.job))
        };
        let held = self.members().count() as u32 + self.rc.adds.len() as u32;
        tracing::info!(capacity = max, held, "resource manager capacity changed");
        self.rc.capacity = max;
        if held > max {
            self.rc.reclaim = Some((held - max, Instant::now()));
            let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
                "the resource manager takes back {}",
                plural(held - max, "container")
            )));
        } else {
            self.rc.reclaim = None;
            // Plan with the new total at the next look.
            self.rc.last_check = Instant::now() - self.rc.interval;
            if max > held {
                let _ = self.links.progress.send(crate::am::Progress::Phase(format!(
                    "the resource manager offers {} more",
                    plural(max - held, "container")
                )));
            }
        }
    }
}
