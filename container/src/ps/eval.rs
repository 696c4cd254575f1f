//! The model evaluated over the local input and over held-out splits, and
//! the model's dump to the AM.

use std::sync::Arc;

use cruise_hdfs::{FileSystem, Split};
use tokio::sync::mpsc;

use super::input::read_input;
use super::{PsError, batches, pull};
use crate::apps::App;
use crate::peer::DataPlane;
use crate::protocol::{BlockId, EvalToAm, INPUT_TABLE, Key, MODEL_TABLE, Stats, ValueBatch};
use crate::store::{InputBlock, Store};

/// Rows per evaluation batch: no updates, so fewer round trips are fine.
pub(super) fn eval_batch(mini_batch: usize) -> usize {
    mini_batch.max(1000)
}

/// The objective over one input block with the current model; `state_of`
/// names the block whose worker-local state to use (if the app keeps any).
pub(super) async fn evaluate_block(
    dp: &DataPlane,
    app: &Arc<dyn App>,
    input: &Arc<InputBlock>,
    state_of: Option<BlockId>,
    mini_batch: usize,
) -> Result<Stats, PsError> {
    let store = dp.store().clone();
    let mut total = Stats::default();
    let mut keys = Vec::new();
    for rows in batches(input.len(), eval_batch(mini_batch)) {
        app.keys(input, rows.clone(), &mut keys);
        let values = pull(dp, &keys).await?;
        let (a, inp, st, ks) = (
            Arc::clone(app),
            Arc::clone(input),
            store.clone(),
            keys.clone(),
        );
        let s = tokio::task::spawn_blocking(move || match state_of {
            Some(block) if a.has_state() => st
                .with_state(block, |s| {
                    a.evaluate(&inp, rows.clone(), &ks, &values, Some(s))
                })
                .unwrap_or_default(),
            _ => a.evaluate(&inp, rows, &ks, &values, None),
        })
        .await
        .map_err(|e| PsError::Remote {
            what: "evaluate",
            message: format!("evaluation task failed: {e}"),
        })?;
        total.add(&s);
    }
    Ok(total)
}

/// The objective over all local input blocks with the current model.
pub async fn evaluate(
    dp: &DataPlane,
    app: &Arc<dyn App>,
    mini_batch: usize,
) -> Result<Stats, PsError> {
    let store = dp.store().clone();
    let mut total = Stats::default();
    for block in store.local_blocks(INPUT_TABLE) {
        let Some(input) = store.input_block(block) else {
            continue;
        };
        total.add(&evaluate_block(dp, app, &input, Some(block), mini_batch).await?);
    }
    Ok(total)
}

/// The objective over held-out splits with the current model: each split is
/// read, parsed and evaluated, and nothing is stored. Only for apps without
/// worker-local state (the configuration checks it).
pub async fn evaluate_held_out(
    fs: &FileSystem,
    dp: &DataPlane,
    app: &Arc<dyn App>,
    splits: &[Split],
    mini_batch: usize,
) -> Result<Stats, PsError> {
    let mut total = Stats::default();
    for split in splits {
        let input = Arc::new(read_input(fs, app, split).await?.0);
        total.add(&evaluate_block(dp, app, &input, None, mini_batch).await?);
    }
    Ok(total)
}

/// Sends every model block owned here to the AM in parts of at most about
/// `part_bytes` of values, keys in increasing order within a block. Returns
/// the number of keys sent. Keys never read or written are not in any block:
/// they hold the app's initial value.
pub async fn dump_model(
    store: &Store,
    to_am: &mpsc::Sender<EvalToAm>,
    part_bytes: usize,
) -> Result<u64, PsError> {
    let mut sent = 0u64;
    for block in store.local_blocks(MODEL_TABLE) {
        let Some(b) = store.keyed_snapshot(block) else {
            continue;
        };
        let mut keys: Vec<Key> = b.values.keys().copied().collect();
        keys.sort_unstable();
        let mut part_keys = Vec::new();
        let mut part = ValueBatch::default();
        for (i, k) in keys.iter().enumerate() {
            part_keys.push(*k);
            part.push(&b.values[k]);
            if part.byte_len() + part_keys.len() * 8 >= part_bytes || i + 1 == keys.len() {
                sent += part_keys.len() as u64;
                to_am
                    .send(EvalToAm::ModelPart {
                        keys: std::mem::take(&mut part_keys),
                        values: std::mem::take(&mut part),
                    })
                    .await
                    .map_err(|_| PsError::ChannelClosed)?;
            }
        }
    }
    to_am
        .send(EvalToAm::ModelDumped { keys: sent })
        .await
        .map_err(|_| PsError::ChannelClosed)?;
    Ok(sent)
}
