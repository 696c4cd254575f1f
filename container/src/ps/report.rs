//! A worker's mini-batch reports, summed and sent to the AM periodically.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::PsError;
use crate::protocol::{EvalToAm, LinkSample, MiniBatchReport};

/// How often a worker sends its (summed) mini-batch measurements to the AM.
const REPORT_EVERY: Duration = Duration::from_millis(20);

/// Sums a worker's mini-batch reports and sends them to the AM every
/// [`REPORT_EVERY`] (and when flushed): one control message per mini-batch
/// would cost the AM a wake-up each, thousands a second.
pub(super) struct Reporter {
    to_am: mpsc::Sender<EvalToAm>,
    sum: Option<MiniBatchReport>,
    since: Instant,
}

impl Reporter {
    pub(super) fn new(to_am: mpsc::Sender<EvalToAm>) -> Self {
        Reporter {
            to_am,
            sum: None,
            since: Instant::now(),
        }
    }

    pub(super) fn add(&mut self, r: MiniBatchReport) {
        match &mut self.sum {
            None => self.sum = Some(r),
            Some(s) => s.add(&r),
        }
    }

    pub(super) async fn maybe_send(&mut self) -> Result<(), PsError> {
        if self.since.elapsed() >= REPORT_EVERY {
            self.flush().await?;
        }
        Ok(())
    }

    pub(super) async fn flush(&mut self) -> Result<(), PsError> {
        self.since = Instant::now();
        let Some(mut r) = self.sum.take() else {
            return Ok(());
        };
        r.links = merge_links(std::mem::take(&mut r.links));
        self.send(EvalToAm::MiniBatch(r)).await
    }

    pub(super) async fn send(&self, m: EvalToAm) -> Result<(), PsError> {
        self.to_am.send(m).await.map_err(|_| PsError::ChannelClosed)
    }
}

/// Sums the samples of each peer over a report (the pulls and pushes of its
/// mini-batches to the same server).
fn merge_links(samples: Vec<LinkSample>) -> Vec<LinkSample> {
    let mut out: Vec<LinkSample> = Vec::new();
    for s in samples {
        match out.iter_mut().find(|o| o.peer == s.peer) {
            Some(o) => {
                o.bytes += s.bytes;
                o.secs += s.secs;
            }
            None => out.push(s),
        }
    }
    out
}

/// The round trip of a request from its per-peer samples: until its last
/// answer arrived. Requests served wholly here have no samples and took
/// `waited`.
pub(super) fn round_trip(samples: &[LinkSample], waited: f64) -> f64 {
    samples
        .iter()
        .map(|s| s.secs)
        .reduce(f64::max)
        .unwrap_or(waited)
}
