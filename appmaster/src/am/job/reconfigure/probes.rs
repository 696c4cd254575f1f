//! Bandwidth probes between evaluators: a ring before training and on
//! the trigger's request, so the cost model knows the links.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cruise_container::protocol::{AmToEval, EvaluatorId};

use super::StartProbes;
use crate::am::AmError;
use crate::am::job::{Driver, Phase, plural};

impl Driver {
    /// Measures link capacity with bulk transfers: each member probes the
    /// next one (a ring), so every container takes part in two transfers.
    /// Returns the `(from, to)` links asked for (none when the optimizer is
    /// off, probing is, or there is no second member).
    pub(in crate::am::job) async fn probe_ring(&mut self) -> BTreeSet<(EvaluatorId, EvaluatorId)> {
        let bytes = self.config.optimizer.probe_bytes;
        let members: Vec<EvaluatorId> = self.members().collect();
        let mut links = BTreeSet::new();
        if bytes == 0 || members.len() < 2 || !self.rc.enabled {
            return links;
        }
        for (i, &id) in members.iter().enumerate() {
            let to = members[(i + 1) % members.len()];
            self.send(id, AmToEval::ProbeBandwidth { to, bytes }).await;
            links.insert((id, to));
        }
        links
    }

    /// Once everything is loaded, before training: probes the links while
    /// they are idle (once). Returns whether training waits for the
    /// answers.
    ///
    /// Why before: probes run while training share the links with it. On
    /// an emulated cluster of 100 and 400 Mbit/s links they read two thirds
    /// of the capacity (8.4 and 33 MB/s of 12.5 and 50), and the cost model
    /// then priced six workers on slow links at 48 ms per mini-batch of
    /// 400 KB each way where they took 34 ms, and kept two fast workers
    /// instead (the large case of `bench-optimizer`).
    pub(in crate::am::job) async fn probe_before_training(&mut self) -> bool {
        match self.rc.start_probes {
            StartProbes::NotYet => {}
            StartProbes::Waiting { .. } => return true,
            StartProbes::WhileTraining | StartProbes::Done => return false,
        }
        let wait = Duration::from_millis(self.config.optimizer.probe_wait_ms);
        if wait.is_zero() {
            self.rc.start_probes = StartProbes::WhileTraining;
            return false;
        }
        let links = self.probe_ring().await;
        if links.is_empty() {
            self.rc.start_probes = StartProbes::Done;
            return false;
        }
        self.phase(
            Phase::Loading,
            format!(
                "measuring {} before training (at most {} ms)",
                plural(links.len() as u32, "link"),
                wait.as_millis()
            ),
        );
        self.rc.start_probes = StartProbes::Waiting {
            links,
            deadline: Instant::now() + wait,
        };
        true
    }

    /// A probe from `from` to `to` measured `bytes` in `secs`: the link's
    /// bandwidth is counted.
    pub(in crate::am::job) async fn on_probe_measured(
        &mut self,
        from: EvaluatorId,
        to: EvaluatorId,
        bytes: u64,
        secs: f64,
    ) -> Result<(), AmError> {
        tracing::debug!(from = %from, %to, bytes, secs, "bandwidth probe");
        self.rc.metrics.bulk(from, to, bytes, secs);
        self.on_start_probe(from, to).await
    }

    /// A probe from `from` to `to` failed: the link stays unmeasured.
    pub(in crate::am::job) async fn on_probe_failed(
        &mut self,
        from: EvaluatorId,
        to: EvaluatorId,
        error: &str,
    ) -> Result<(), AmError> {
        tracing::warn!(from = %from, %to, "bandwidth probe failed: {error}");
        self.on_start_probe(from, to).await
    }

    /// A probe answered or failed: training starts after the last one.
    pub(in crate::am::job) async fn on_start_probe(
        &mut self,
        from: EvaluatorId,
        to: EvaluatorId,
    ) -> Result<(), AmError> {
        if let StartProbes::Waiting { links, .. } = &mut self.rc.start_probes {
            links.remove(&(from, to));
            if links.is_empty() {
                self.rc.start_probes = StartProbes::Done;
                self.maybe_start_training().await?;
            }
        }
        Ok(())
    }

    /// On the loop's tick: training starts without the start probes that
    /// have not answered by their deadline (the optimizer then prices those
    /// links by what it measures later).
    pub(in crate::am::job) async fn expire_start_probes(&mut self) -> Result<(), AmError> {
        let StartProbes::Waiting { links, deadline } = &self.rc.start_probes else {
            return Ok(());
        };
        if Instant::now() < *deadline {
            return Ok(());
        }
        let missing: Vec<String> = links.iter().map(|(a, b)| format!("{a}→{b}")).collect();
        tracing::warn!(
            "training starts without {} that did not answer within {} ms (evaluators {})",
            plural(missing.len() as u32, "link measurement"),
            self.config.optimizer.probe_wait_ms,
            missing.join(", ")
        );
        self.rc.start_probes = StartProbes::Done;
        self.maybe_start_training().await
    }
}
