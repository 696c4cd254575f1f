//! Parameter-server roles run inside an evaluator.
//!
//! - [`load_input`]: read input splits, parse them with the app, store them as
//!   input blocks (and the app's worker-local state beside them).
//! - [`run_worker`]: the worker task, on a thread of its own (the
//!   evaluator's runtime thread keeps serving the connections meanwhile). For
//!   each local input block, for each mini-batch: pull the model keys it
//!   needs, compute, push the deltas. With `job.pipeline` the pulls of the
//!   next `job.pipeline_depth` mini-batches are already on their way and
//!   pushes are not awaited until the pipeline is full; measurements are
//!   summed and reported every 20 ms. Between local epochs it ticks its clock
//!   and, under SSP, waits until the slowest worker is within the staleness
//!   bound; a clock rollback ([`ClockRollback`]: a lost server's blocks
//!   restored from a checkpoint) has it abandon the local epoch under way
//!   and go on from the checkpoint's clock. A recount ([`RecountOrder`]:
//!   LDA's counts rebuilt after a lost worker or server) holds it between
//!   two mini-batches with its pushes answered and its state marked
//!   uncounted ([`mark_uncounted`]) until the servers have emptied their
//!   blocks ([`zero_model`]); stopping, it first counts in whatever state
//!   its blocks hold that the model does not count yet.
//! - [`evaluate`]: the objective over all local input with the current model;
//!   [`evaluate_held_out`]: the same over held-out splits, read and dropped.
//! - [`dump_model`]: send the model blocks held here to the AM.
//! - [`run_server`]: the server task: blocks are served by the data plane
//!   whatever the role; this task reports serving metrics periodically.
//!
//! Roles share one [`DataPlane`] and [`crate::store::Store`], so an evaluator switches role
//! without restarting, and blocks stay where they are until moved.
//!
//! Modules: the worker's pipeline in `worker`, with the keys it caches in
//! `key_cache`, its own pushes applied to its pulls in `own_pushes` and its
//! reports in `report`; a recount's steps in `recount`; loading in `input`; evaluation and the model dump
//! in `eval`; the server task in `server`; what a mini-batch costs its
//! worker (the figures the cost model prices it by) in `cost`. Here: the
//! errors, and how a block is cut into mini-batches and pulled.

use std::ops::Range;

use crate::peer::DataPlane;
use crate::protocol::{Key, MODEL_TABLE, PeerResponse, ValueBatch};
use crate::store::{OpKind, PartResult, StoreOp};

mod cost;
mod eval;
mod input;
mod key_cache;
mod own_pushes;
mod recount;
mod report;
mod server;
mod worker;

pub use cost::{codec_cpu_per_byte, io_secs, own_secs};
pub use eval::{dump_model, evaluate, evaluate_held_out};
pub use input::{load_input, read_input};
pub use recount::{RecountOrder, mark_uncounted, zero_model};
pub use server::{SERVER_REPORT_PERIOD, run_server};
pub use worker::{ClockRollback, LONE_WORKER_DEPTH, WorkerContext, pipeline_depth, run_worker};

/// Errors of the PS roles.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// Reading input failed.
    #[error("cannot read input {uri}: {source}")]
    Read {
        /// The file.
        uri: String,
        /// Why.
        #[source]
        source: Box<cruise_hdfs::HdfsError>,
    },
    /// A record is malformed.
    #[error("{uri}:{line}: {message}")]
    Parse {
        /// The file.
        uri: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A pull or push failed.
    #[error("{what} failed: {message}")]
    Remote {
        /// Pull or push.
        what: &'static str,
        /// Why.
        message: String,
    },
    /// The store refused.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The AM's channel is gone.
    #[error("the control channel to the AM is closed")]
    ChannelClosed,
}
/// Mini-batches a block of `n` records is cut into at mini-batch size
/// `size`: `n / size` rounded to the nearest (at least one). The cost model
/// counts communication rounds with it.
pub fn mini_batch_count(n: usize, size: usize) -> usize {
    let size = size.max(1);
    if n == 0 {
        0
    } else {
        ((n + size / 2) / size).max(1)
    }
}

/// A block's rows cut into [`mini_batch_count`] mini-batches whose sizes
/// differ by at most one. Mini-batches do not span blocks, and a short
/// remainder would cost a whole round trip for a few records, so a block
/// of 312 records at `size` 100 makes 3 mini-batches of 104, not 100, 100,
/// 100 and 12.
fn batches(n: usize, size: usize) -> impl Iterator<Item = Range<usize>> {
    let k = mini_batch_count(n, size);
    let base = n.checked_div(k).unwrap_or(0);
    let extra = n.checked_rem(k).unwrap_or(0);
    (0..k).map(move |i| {
        let start = i * base + i.min(extra);
        start..start + base + usize::from(i < extra)
    })
}

async fn pull(dp: &DataPlane, keys: &[Key]) -> Result<ValueBatch, PsError> {
    pulled(dp.execute(pull_op(keys.to_vec())).await)
}

fn pull_op(keys: Vec<Key>) -> StoreOp {
    StoreOp {
        kind: OpKind::Get,
        table: MODEL_TABLE,
        keys,
        values: ValueBatch::default(),
    }
}

fn pulled(r: PartResult) -> Result<ValueBatch, PsError> {
    match r {
        Ok(PeerResponse::Values(v)) => Ok(v),
        Ok(other) => Err(PsError::Remote {
            what: "pull",
            message: format!("unexpected answer {other:?}"),
        }),
        Err(e) => Err(PsError::Remote {
            what: "pull",
            message: e.message,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_cut_into_near_equal_mini_batches() {
        for size in 1..40 {
            for n in 0..200 {
                let b: Vec<Range<usize>> = batches(n, size).collect();
                assert_eq!(b.len(), mini_batch_count(n, size));
                assert_eq!(b.first().map_or(0, |r| r.start), 0);
                assert_eq!(b.last().map_or(0, |r| r.end), n, "{n} rows at {size}");
                assert!(b.windows(2).all(|w| w[0].end == w[1].start));
                let lens: Vec<usize> = b.iter().map(|r| r.len()).collect();
                let (lo, hi) = (lens.iter().min(), lens.iter().max());
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    assert!(hi - lo <= 1, "{lens:?}");
                    // Within half a mini-batch of the size asked for (or
                    // the whole block when it is smaller).
                    assert!(*lo >= (size / 2).min(n), "{n} at {size}: {lens:?}");
                    assert!(*hi <= size + size.div_ceil(2), "{n} at {size}: {lens:?}");
                }
            }
        }
        assert_eq!(
            batches(156, 100).map(|r| r.len()).collect::<Vec<_>>(),
            [78, 78]
        );
        assert_eq!(
            batches(312, 100).map(|r| r.len()).collect::<Vec<_>>(),
            [104, 104, 104]
        );
        assert_eq!(batches(30, 100).count(), 1);
    }
}
