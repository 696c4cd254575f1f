//! Bandwidth probes between evaluators, so the cost model knows the
//! links: a ring before training and on the trigger's request, and before
//! training, fan-out probes of the links the ring leaves open.
//!
//! A transfer between two evaluators runs at the slower end's speed. The
//! ring therefore tells an evaluator's own link only where its partner has
//! shown itself faster; the fastest evaluators, and a fast one between two
//! slow ones, look as fast as their partners. Each of those then sends to
//! every other member at once: that rate is its own link's, or, when
//! its link is faster than the others' together, more than it will ever be
//! asked to carry.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cruise_container::protocol::{AmToEval, EvaluatorId, PROBE_TRIES};

use super::{FanRound, StartProbes};
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
            StartProbes::Waiting { .. } | StartProbes::FanOut { .. } => return true,
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
    /// bandwidth is counted (a fan-out probe's, once its round is complete).
    pub(in crate::am::job) async fn on_probe_measured(
        &mut self,
        from: EvaluatorId,
        to: EvaluatorId,
        bytes: u64,
        secs: f64,
    ) -> Result<(), AmError> {
        tracing::debug!(from = %from, %to, bytes, secs, "bandwidth probe");
        if self.rc.late_fan_out.remove(&(from, to)) {
            return Ok(());
        }
        if self.fan_out_answered(from, to, Some(bytes)) {
            return self.after_fan_out_answer().await;
        }
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
        if self.fan_out_answered(from, to, None) {
            return self.after_fan_out_answer().await;
        }
        self.on_start_probe(from, to).await
    }

    /// Counts an answer (the bytes of each try; `None`: a failure) to the
    /// running fan-out round, if it is one. Returns whether it was.
    fn fan_out_answered(
        &mut self,
        from: EvaluatorId,
        to: EvaluatorId,
        answer: Option<u64>,
    ) -> bool {
        let StartProbes::FanOut { round, .. } = &mut self.rc.start_probes else {
            return false;
        };
        if round.to != to || !round.pending.remove(&from) {
            return false;
        }
        if let Some(bytes) = answer {
            round.bytes += bytes * u64::from(PROBE_TRIES);
        }
        true
    }

    /// After an answer to a fan-out round: when it was the round's last,
    /// counts the round and starts the next (or training, after the last).
    async fn after_fan_out_answer(&mut self) -> Result<(), AmError> {
        let StartProbes::FanOut { round, queue, .. } = &mut self.rc.start_probes else {
            return Ok(());
        };
        if !round.pending.is_empty() {
            return Ok(());
        }
        let (to, bytes, secs) = (round.to, round.bytes, round.started.elapsed().as_secs_f64());
        let next = queue.pop();
        tracing::debug!(%to, bytes, secs, "fan-out probe");
        self.rc.metrics.fan_out(to, bytes, secs);
        match next {
            Some(next) => {
                self.start_fan_out_round(next).await;
                Ok(())
            }
            None => {
                self.rc.start_probes = StartProbes::Done;
                self.maybe_start_training().await
            }
        }
    }

    /// The ring has answered: the links it left open get a fan-out round
    /// each (see the module's documentation), one at a time, within
    /// `optimizer.probe_wait_ms` of their own; then training starts.
    async fn start_fan_out(&mut self) -> Result<(), AmError> {
        let members: Vec<EvaluatorId> = self.members().collect();
        let tolerance = self.config.optimizer.bandwidth_noise_tolerance;
        let mut open = self.rc.metrics.open_capacities(&members, tolerance);
        if members.len() < 3 || open.is_empty() {
            self.rc.start_probes = StartProbes::Done;
            return self.maybe_start_training().await;
        }
        self.phase(
            Phase::Loading,
            format!(
                "measuring the links of {} that the pairs left open, each sending to the \
                 others at once",
                plural(open.len() as u32, "evaluator")
            ),
        );
        // Popped from the back: the fastest-looking first.
        open.reverse();
        let Some(first) = open.pop() else {
            return Ok(());
        };
        self.rc.start_probes = StartProbes::FanOut {
            round: FanRound::new(first, BTreeSet::new()),
            queue: open,
            deadline: Instant::now() + Duration::from_millis(self.config.optimizer.probe_wait_ms),
        };
        self.start_fan_out_round(first).await;
        Ok(())
    }

    /// `to` sends every other member its share of `optimizer.probe_bytes`
    /// at once, in all its tries (a probe asks the other end to send), each
    /// member's share in proportion to its own link as measured so far
    /// ([`fan_out_shares`]). The round is timed whole, so the tries need not
    /// each be long.
    async fn start_fan_out_round(&mut self, to: EvaluatorId) {
        let others: Vec<EvaluatorId> = self.members().filter(|&id| id != to).collect();
        let links: Vec<Option<f64>> = others
            .iter()
            .map(|&id| self.rc.metrics.capacity(id))
            .collect();
        let shares = fan_out_shares(
            &links,
            self.config.optimizer.probe_bytes / u64::from(PROBE_TRIES),
            FAN_OUT_MIN_BYTES,
        );
        if let StartProbes::FanOut { round, .. } = &mut self.rc.start_probes {
            *round = FanRound::new(to, others.iter().copied().collect());
        }
        for (from, bytes) in others.into_iter().zip(shares) {
            self.send(from, AmToEval::ProbeBandwidth { to, bytes })
                .await;
        }
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
                self.start_fan_out().await?;
            }
        }
        Ok(())
    }

    /// On the loop's tick: training starts without the start probes that
    /// have not answered by their deadline (the optimizer then prices those
    /// links by what it measures later).
    pub(in crate::am::job) async fn expire_start_probes(&mut self) -> Result<(), AmError> {
        let wait = self.config.optimizer.probe_wait_ms;
        match &self.rc.start_probes {
            StartProbes::Waiting { links, deadline } if Instant::now() >= *deadline => {
                let missing: Vec<String> = links.iter().map(|(a, b)| format!("{a}→{b}")).collect();
                tracing::warn!(
                    "training starts without {} that did not answer within {wait} ms \
                     (evaluators {})",
                    plural(missing.len() as u32, "link measurement"),
                    missing.join(", ")
                );
            }
            StartProbes::FanOut {
                round,
                queue,
                deadline,
            } if Instant::now() >= *deadline => {
                let unmeasured: Vec<String> = std::iter::once(round.to)
                    .chain(queue.iter().rev().copied())
                    .map(|id| id.to_string())
                    .collect();
                tracing::warn!(
                    "training starts without the fan-out probes of evaluators {} (not done \
                     within {wait} ms); their links are priced by their pairs",
                    unmeasured.join(", ")
                );
                // Answers of the unfinished round that come in while training
                // read the link shared with it: they are not counted.
                self.rc.late_fan_out = round.pending.iter().map(|&from| (from, round.to)).collect();
            }
            _ => return Ok(()),
        }
        self.rc.start_probes = StartProbes::Done;
        self.maybe_start_training().await
    }
}

/// The least a fan-out probe sends each member in a try: fewer bytes than
/// this say more about a connection's start than about the link.
const FAN_OUT_MIN_BYTES: u64 = 256 * 1024;

/// The bytes each member of a fan-out round is sent in a try: `per_try` in
/// all, dealt in proportion to each member's own link (`links`, bytes a
/// second as measured so far; a member without one counts as the mean of
/// the others), and all scaled up together until the smallest share is at
/// least `min`.
///
/// The round is timed whole, from its start to its last answer. With
/// equal shares a member on a slow link finishes last, alone, and the
/// round reads the number of members times that member's speed: three
/// members at 91, 91 and 29 Mbit/s read 87 Mbit/s of a 199 Mbit/s link,
/// less than its pairs with the 91 Mbit/s ones had shown, and the cost
/// model took it for one of them. In proportion they finish together
/// when the measured link is not the narrower, and the round reads what
/// they carried at once (here 199 Mbit/s: the link's own); when it is
/// the narrower, it is busy to the end either way.
fn fan_out_shares(links: &[Option<f64>], per_try: u64, min: u64) -> Vec<u64> {
    let measured = |b: &Option<f64>| b.filter(|b| b.is_finite() && *b > 0.0);
    let known: Vec<f64> = links.iter().filter_map(measured).collect();
    let fallback = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let weights: Vec<f64> = links
        .iter()
        .map(|b| measured(b).unwrap_or(fallback))
        .collect();
    if weights.is_empty() {
        return Vec::new();
    }
    let total: f64 = weights.iter().sum();
    let raw: Vec<f64> = weights.iter().map(|w| per_try as f64 * w / total).collect();
    let smallest = raw.iter().copied().fold(f64::INFINITY, f64::min);
    let scale = (min as f64 / smallest).max(1.0);
    raw.iter().map(|r| (r * scale).round() as u64).collect()
}

#[cfg(test)]
mod tests {
    use super::fan_out_shares;

    const MBIT: f64 = 1e6 / 8.0;

    #[test]
    fn fan_out_shares_follow_the_members_links() {
        // 3 MB a try over links of 91, 91 and 29 Mbit/s (211 in all): each
        // share takes the same time at its member's speed.
        let s = fan_out_shares(
            &[Some(91.0 * MBIT), Some(91.0 * MBIT), Some(29.0 * MBIT)],
            3_000_000,
            1,
        );
        assert_eq!(s, [1_293_839, 1_293_839, 412_322]);
        let t: Vec<f64> = s
            .iter()
            .zip([91.0, 91.0, 29.0])
            .map(|(&b, mbit)| b as f64 / (mbit * MBIT))
            .collect();
        assert!(t.iter().all(|x| (x - t[0]).abs() < 1e-6), "{t:?}");
    }

    #[test]
    fn the_smallest_fan_out_share_is_raised_to_the_least_and_the_others_with_it() {
        // 1 MB over 3:1 would give 250,000 bytes to the slow member; raised
        // to 500,000, the fast one's grows to 1,500,000 (still 3:1).
        let s = fan_out_shares(&[Some(3e6), Some(1e6)], 1_000_000, 500_000);
        assert_eq!(s, [1_500_000, 500_000]);
    }

    #[test]
    fn a_member_without_a_measured_link_counts_as_the_mean_of_the_others() {
        // Unknown = (2 + 4) / 2 = 3 MB/s: shares 2 : 3 : 4 of 900,000.
        let s = fan_out_shares(&[Some(2e6), None, Some(4e6)], 900_000, 1);
        assert_eq!(s, [200_000, 300_000, 400_000]);
        // None measured: equal shares.
        assert_eq!(
            fan_out_shares(&[None, None], 600_000, 1),
            [300_000, 300_000]
        );
        assert!(fan_out_shares(&[], 600_000, 1).is_empty());
    }
}
