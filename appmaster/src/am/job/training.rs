//! Training: loading the input, the epochs and their clocks, stopping,
//! evaluating and saving the model, each phase started by the last.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cruise_conf::SyncMode;
use cruise_container::protocol::{
    AmToEval, BlockId, EvaluatorId, INPUT_TABLE, Key, MODEL_TABLE, MiniBatchReport, STATE_TABLE,
    Stats, TaskKind, ValueBatch, WorkerTask,
};
use cruise_hdfs::Split;

use crate::am::{AmError, EpochSummary, Progress, Role};

use super::{Answer, Driver, Phase, plural, reconfigure, split_text, start_order};

impl Driver {
    /// A worker read input blocks: while loading, its share of the first
    /// epoch; while training, blocks re-read for a scale-in.
    pub(super) async fn on_input_loaded(
        &mut self,
        id: EvaluatorId,
        blocks: Vec<(BlockId, u64, u64)>,
    ) -> Result<(), AmError> {
        if self.phase != Phase::Loading {
            // Blocks re-read while training (a scale-in, or a lost worker's).
            if !self.on_input_reloaded(id, &blocks).await
                && !self.on_input_recovered(id, &blocks).await
            {
                tracing::warn!(evaluator = %id, "unexpected InputLoaded");
            }
            return Ok(());
        }
        if !self.answered(id, Answer::InputLoaded) {
            tracing::warn!(evaluator = %id, "unexpected InputLoaded");
            return Ok(());
        }
        let bytes: u64 = blocks.iter().map(|b| b.2).sum();
        if let Some(t) = self.rc.load_started.remove(&id) {
            self.rc.metrics.load(bytes, t.elapsed().as_secs_f64());
        }
        for &(b, records, bytes) in &blocks {
            self.rc.input_bytes.insert(b, bytes);
            self.rc.mini_batches_per_epoch += cruise_container::ps::mini_batch_count(
                usize::try_from(records).unwrap_or(usize::MAX),
                self.config.job.mini_batch as usize,
            ) as u64;
        }
        self.records_per_epoch += blocks.iter().map(|b| b.1).sum::<u64>();
        self.maybe_start_training().await
    }

    pub(super) async fn start_loading(&mut self) {
        let (w, s) = self.initial_split;
        // Roles are dealt in the order the resource manager started the
        // containers, not in the order their evaluators happened to
        // register: the initial configuration is then reproducible (and an
        // emulated cluster's shapes, given in start order, land on the
        // roles they were meant for).
        let mut ids: Vec<EvaluatorId> = self.evaluators.keys().copied().collect();
        ids.sort_by(|a, b| {
            start_order(&self.evaluators[a].container, &self.evaluators[b].container)
        });
        let (workers, servers) = ids.split_at((w as usize).min(ids.len()));
        let (workers, servers) = (
            workers.to_vec(),
            servers[..(s as usize).min(servers.len())].to_vec(),
        );
        for &id in &workers {
            if let Some(e) = self.evaluators.get_mut(&id) {
                e.role = Role::Worker;
            }
        }
        for &id in &servers {
            if let Some(e) = self.evaluators.get_mut(&id) {
                e.role = Role::Server;
            }
        }
        let nm = self.config.store.model_blocks as usize;
        let ni = self.splits.len();
        let model: Vec<EvaluatorId> = (0..nm).map(|b| servers[b % servers.len()]).collect();
        let input: Vec<EvaluatorId> = (0..ni).map(|b| workers[b * workers.len() / ni]).collect();
        let update = self.owners.assign([
            (MODEL_TABLE, model.clone()),
            (INPUT_TABLE, input.clone()),
            (STATE_TABLE, input.clone()),
        ]);
        let peers: Vec<(EvaluatorId, SocketAddr)> = self
            .evaluators
            .values()
            .filter_map(|e| e.data_addr.map(|a| (e.id, a)))
            .collect();
        self.phase(
            Phase::Loading,
            format!(
                "loading: {ni} input blocks on {}, {nm} model blocks on {}",
                plural(workers.len() as u32, "worker"),
                plural(servers.len() as u32, "server"),
            ),
        );
        for &id in &ids {
            self.send(id, AmToEval::Peers(peers.clone())).await;
            self.send(id, AmToEval::Ownership(update.clone())).await;
        }
        for &id in &servers {
            let blocks: Vec<BlockId> = (0..nm)
                .filter(|&b| model[b] == id)
                .map(|b| BlockId(b as u32))
                .collect();
            if self.model_from_checkpoint() {
                self.load_from_checkpoint(id, &blocks).await;
                continue;
            }
            self.ask(
                id,
                AmToEval::CreateBlocks {
                    table: MODEL_TABLE,
                    blocks,
                },
                Answer::BlocksCreated,
            )
            .await;
        }
        for &id in &workers {
            let blocks: Vec<(BlockId, Split)> = (0..ni)
                .filter(|&b| input[b] == id)
                .map(|b| (BlockId(b as u32), self.splits[b].clone()))
                .collect();
            self.rc.load_started.insert(id, Instant::now());
            let state = self.resumed_state(&blocks);
            self.ask(
                id,
                AmToEval::LoadInput { blocks, state },
                Answer::InputLoaded,
            )
            .await;
        }
    }

    pub(super) async fn maybe_start_training(&mut self) -> Result<(), AmError> {
        if self.phase != Phase::Loading || !self.all_answered() {
            return Ok(());
        }
        if self.records_per_epoch == 0 {
            return Err(AmError::Input {
                uri: self.config.job.input.clone(),
                message: "the input has no records".into(),
            });
        }
        if self.probe_before_training().await {
            return Ok(());
        }
        self.learn_capacity().await;
        self.carry_progress_over().await;
        let (w, s) = self.role_counts();
        self.phase(
            Phase::Training,
            format!(
                "training: {} records per epoch, {}, {}",
                self.records_per_epoch,
                split_text(w, s),
                match self.config.job.sync {
                    SyncMode::Async => "async".to_string(),
                    SyncMode::Ssp => format!("ssp (staleness {})", self.config.job.staleness),
                }
            ),
        );
        let ids: Vec<(EvaluatorId, Role)> =
            self.evaluators.values().map(|e| (e.id, e.role)).collect();
        for (id, role) in ids {
            self.start_role(id, role).await;
        }
        if matches!(
            self.rc.start_probes,
            reconfigure::StartProbes::WhileTraining
        ) {
            self.probe_ring().await;
        }
        let now = Instant::now();
        self.train_started = Some(now);
        self.epoch_started = now;
        self.checkpoints_start();
        Ok(())
    }

    pub(super) async fn on_minibatch(&mut self, stats: Stats) {
        self.records_done += stats.records;
        self.window.add(&stats);
        let (w, s) = self.role_counts();
        let epoch_no = self.epochs.len() as u32 + 1;
        if self.last_batch_progress.elapsed() >= Duration::from_millis(100) {
            self.last_batch_progress = Instant::now();
            let done = self.records_done - (epoch_no as u64 - 1) * self.records_per_epoch;
            let _ = self.links.progress.send(Progress::Batch {
                epoch: epoch_no,
                done: done.min(self.records_per_epoch),
                total: self.records_per_epoch,
                stats: self.window,
                workers: w,
                servers: s,
            });
        }
        while self.records_done >= (self.epochs.len() as u64 + 1) * self.records_per_epoch
            && (self.epochs.len() as u32) < self.config.job.epochs
        {
            let summary = EpochSummary {
                epoch: self.epochs.len() as u32 + 1,
                stats: std::mem::take(&mut self.window),
                secs: self.epoch_started.elapsed().as_secs_f64(),
                end_secs: self.started.elapsed().as_secs_f64(),
                workers: w,
                servers: s,
            };
            self.epoch_started = Instant::now();
            self.epochs.push(summary);
            self.record_epoch(&summary);
            // A line per epoch goes to stderr through the progress
            // channel; logged at debug, it is not said twice.
            tracing::debug!(
                epoch = summary.epoch,
                loss = summary.stats.mean_loss(),
                secs = summary.secs,
                "epoch done"
            );
            let _ = self.links.progress.send(Progress::Epoch(summary));
        }
        if self.epochs.len() as u32 >= self.config.job.epochs {
            self.end_reconfiguration();
            self.start_stopping().await;
        } else {
            self.maybe_checkpoint().await;
        }
    }

    /// A server has created its model blocks: training may start once
    /// every one has.
    pub(super) async fn on_blocks_created(&mut self, id: EvaluatorId) -> Result<(), AmError> {
        if self.answered(id, Answer::BlocksCreated) {
            self.maybe_start_training().await?;
        }
        Ok(())
    }

    /// A task of `id` stopped: in training, a change of roles or a loss;
    /// when stopping, evaluation starts once every worker has stopped.
    pub(super) async fn on_task_stopped(&mut self, id: EvaluatorId, task: TaskKind) {
        if self.phase == Phase::Training {
            self.on_task_stopped_in_training(id, task).await;
        } else if task == TaskKind::Worker
            && self.answered(id, Answer::WorkerStopped)
            && self.all_answered()
        {
            self.start_evaluating().await;
        }
    }

    /// A worker's summed mini-batch measurements: counted while training.
    pub(super) async fn on_mini_batch_report(&mut self, id: EvaluatorId, r: MiniBatchReport) {
        // Reports of local epochs a clock rollback abandoned are not
        // counted: the job's progress went back to the checkpoint's.
        let current = self
            .evaluators
            .get(&id)
            .is_some_and(|e| e.rollback == self.current_rollback());
        if self.phase == Phase::Training && current {
            self.rc.metrics.mini_batch(id, &r, &r.links);
            self.on_minibatch(r.stats).await;
        }
    }

    /// Starts `role`'s task on `id`. A worker starts at the clock the job
    /// has released so far (0 at the start of training), which becomes its
    /// own, in the job's current clock rollback. It hears that clock as the
    /// slowest one's first: an evaluator that joined or switched roles
    /// late was sent no `Clock`, and a worker starting past the staleness
    /// bound of the 0 it would know waits for a clock that it holds back
    /// itself.
    pub(super) async fn start_role(&mut self, id: EvaluatorId, role: Role) {
        match role {
            Role::Server => self.send(id, AmToEval::StartServer).await,
            Role::Worker => {
                let start_clock = self.min_clock_sent;
                let rollback = self.current_rollback();
                if let Some(e) = self.evaluators.get_mut(&id) {
                    e.clock = start_clock;
                    e.rollback = rollback;
                }
                let staleness =
                    (self.config.job.sync == SyncMode::Ssp).then_some(self.config.job.staleness);
                let task = WorkerTask {
                    start_clock,
                    staleness,
                    rollback,
                };
                let min_clock = start_clock;
                self.send(id, AmToEval::Clock { min_clock }).await;
                self.send(id, AmToEval::StartWorker(task)).await
            }
            Role::Idle => {}
        }
    }

    pub(super) async fn release_clocks(&mut self) {
        let min = self
            .evaluators
            .values()
            .filter(|e| e.role == Role::Worker && e.connected)
            .map(|e| e.clock)
            .min()
            .unwrap_or(0);
        if min > self.min_clock_sent {
            self.min_clock_sent = min;
            let workers = self.with_role(Role::Worker);
            for id in workers {
                self.send(id, AmToEval::Clock { min_clock: min }).await;
            }
        }
    }

    /// Training is over: the workers are told to stop, once the running
    /// plan's operations under way, the recount and the re-reads of a lost
    /// worker's input have ended (until then the stop is deferred, see
    /// [`Driver::step_deferred_stop`]). A worker counts in its blocks'
    /// state as it stops and the final evaluation reads its blocks: blocks
    /// that landed after it stopped would be in neither.
    pub(super) async fn start_stopping(&mut self) {
        if self.phase != Phase::Training {
            return;
        }
        let holds: Vec<&str> = [
            (
                self.rc.plan_running(),
                "the running plan's operations under way",
            ),
            (self.recounting(), "the model's recount"),
            (self.rereading(), "the re-reads of a lost worker's input"),
        ]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect();
        if !holds.is_empty() {
            if !self.rc.stop_deferred {
                self.rc.stop_deferred = true;
                self.phase(
                    Phase::Training,
                    format!(
                        "the last epoch ended; waiting for {} before the workers stop",
                        holds.join(" and ")
                    ),
                );
            }
            return;
        }
        self.rc.stop_deferred = false;
        if let Some(t) = self.train_started {
            self.train_secs = t.elapsed().as_secs_f64();
        }
        self.phase(Phase::Stopping, "stopping workers".into());
        let workers = self.with_role(Role::Worker);
        for id in workers {
            self.ask(id, AmToEval::StopWorker, Answer::WorkerStopped)
                .await;
        }
    }

    /// Tries a stop deferred by [`Driver::start_stopping`] again (called
    /// after every event): it goes ahead once nothing holds it any more.
    pub(super) async fn step_deferred_stop(&mut self) {
        if self.rc.stop_deferred {
            self.start_stopping().await;
        }
    }

    pub(super) async fn start_evaluating(&mut self) {
        self.phase(Phase::Evaluating, "evaluating the final model".into());
        let workers = self.with_role(Role::Worker);
        for id in workers {
            self.ask(id, AmToEval::Evaluate, Answer::Evaluation).await;
        }
    }

    /// A worker's final evaluation over its input.
    pub(super) async fn on_evaluation(
        &mut self,
        id: EvaluatorId,
        stats: &Stats,
    ) -> Result<(), AmError> {
        if self.answered(id, Answer::Evaluation) {
            self.final_stats.add(stats);
            if self.all_answered() {
                return self.after_evaluation().await;
            }
        }
        Ok(())
    }

    /// A worker's evaluation over its splits of the held-out input.
    pub(super) async fn on_held_out_evaluation(
        &mut self,
        id: EvaluatorId,
        stats: &Stats,
    ) -> Result<(), AmError> {
        if self.answered(id, Answer::HeldOutEvaluation) {
            self.outputs.add_eval(stats);
            if self.all_answered() {
                return self.after_held_out().await;
            }
        }
        Ok(())
    }

    /// After the final evaluation: the held-out input, if any, else what
    /// follows it.
    pub(super) async fn after_evaluation(&mut self) -> Result<(), AmError> {
        if !self.outputs.has_held_out() {
            return self.after_held_out().await;
        }
        self.phase(
            Phase::EvaluatingHeldOut,
            format!("evaluating held-out input {}", self.config.job.eval_input),
        );
        let workers = self.with_role(Role::Worker);
        for (id, splits) in self.outputs.assign(&workers) {
            self.ask(
                id,
                AmToEval::EvaluateHeldOut { splits },
                Answer::HeldOutEvaluation,
            )
            .await;
        }
        Ok(())
    }

    /// After the held-out evaluation: the model dump, if asked for, else the end.
    pub(super) async fn after_held_out(&mut self) -> Result<(), AmError> {
        if !self.outputs.wants_model() {
            self.finish().await;
            return Ok(());
        }
        self.phase(
            Phase::SavingModel,
            format!("saving the model to {}", self.config.job.model_out),
        );
        for id in self.owners.owners_of(MODEL_TABLE) {
            self.ask(id, AmToEval::DumpModel, Answer::ModelDumped).await;
        }
        if self.all_answered() {
            self.write_model().await?;
        }
        Ok(())
    }

    /// Every server has sent its part of the model: writes it, and ends.
    pub(super) async fn write_model(&mut self) -> Result<(), AmError> {
        let keys = self
            .outputs
            .write_model(self.config.job.app, &self.params)
            .await?;
        tracing::info!(keys, path = %self.config.job.model_out, "model written");
        self.finish().await;
        Ok(())
    }

    /// A part of the model a server sent, while saving it.
    pub(super) fn on_model_part(
        &mut self,
        id: EvaluatorId,
        keys: Vec<Key>,
        values: ValueBatch,
    ) -> Result<(), AmError> {
        if self.phase == Phase::SavingModel {
            let from = self.describe(id);
            self.outputs.add_part(&from, keys, values)?;
        }
        Ok(())
    }

    /// A server has sent all of its part of the model: the model is
    /// written once every one has.
    pub(super) async fn on_model_dumped(&mut self, id: EvaluatorId) -> Result<(), AmError> {
        if self.answered(id, Answer::ModelDumped) && self.all_answered() {
            self.write_model().await?;
        }
        Ok(())
    }

    pub(super) async fn finish(&mut self) {
        self.phase(Phase::Finishing, "shutting down evaluators".into());
        let ids: Vec<EvaluatorId> = self.evaluators.keys().copied().collect();
        for id in ids {
            self.send(
                id,
                AmToEval::Shutdown {
                    reason: "job finished".into(),
                },
            )
            .await;
        }
    }
}
