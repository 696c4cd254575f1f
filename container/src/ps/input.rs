//! A worker's input: its splits read, parsed by the app and stored as
//! input blocks (with the app's worker-local state beside them: restored
//! from a checkpoint when the AM names one that holds it and it fits the
//! block, drawn afresh otherwise).

use std::sync::Arc;

use cruise_hdfs::{FileSystem, Split, line_number_at, read_split};

use super::PsError;
use crate::apps::App;
use crate::checkpoint::{self, SavedState};
use crate::protocol::{BlockId, INPUT_TABLE, STATE_TABLE, TableId};
use crate::store::{BlockData, InputBlock, SlotKind, StateBlock, Store};

/// Reads one split and parses it with the app; returns the records and the
/// bytes they came from. Parse errors name the file and line.
pub async fn read_input(
    fs: &FileSystem,
    app: &Arc<dyn App>,
    split: &Split,
) -> Result<(InputBlock, u64), PsError> {
    let data = read_split(fs, split)
        .await
        .map_err(|source| PsError::Read {
            uri: split.uri.clone(),
            source: Box::new(source),
        })?;
    let bytes = data.bytes.len() as u64;
    let text = data.bytes.clone();
    let parser = Arc::clone(app);
    let parsed = tokio::task::spawn_blocking(move || parser.parse(&text))
        .await
        .map_err(|e| PsError::Parse {
            uri: split.uri.clone(),
            line: 0,
            message: format!("parser crashed: {e}"),
        })?;
    match parsed {
        Ok(b) => Ok((b, bytes)),
        Err(e) => {
            let at = data.start_offset + e.offset as u64;
            let line = line_number_at(fs, &split.uri, at).await.unwrap_or(0);
            Err(PsError::Parse {
                uri: split.uri.clone(),
                line,
                message: e.message,
            })
        }
    }
}

/// Loads input blocks from their splits, each block's worker-local state
/// restored from `saved` where it holds it. Returns `(block, records,
/// bytes)` per block.
pub async fn load_input(
    fs: FileSystem,
    app: Arc<dyn App>,
    store: Store,
    blocks: Vec<(BlockId, Split)>,
    saved: Option<SavedState>,
) -> Result<Vec<(BlockId, u64, u64)>, PsError> {
    let mut loaded = Vec::with_capacity(blocks.len());
    let mut restored = Vec::new();
    for (block, split) in blocks {
        let (input, bytes) = read_input(&fs, &app, &split).await?;
        let records = input.len() as u64;
        let state = match saved_state(&fs, &app, saved.as_ref(), block, &input).await {
            Some(s) => {
                restored.push(block);
                Some(s)
            }
            None => app.init_state(block, &input),
        };
        if let Some(state) = state {
            put_read(&store, STATE_TABLE, block, BlockData::State(state))?;
        }
        put_read(
            &store,
            INPUT_TABLE,
            block,
            BlockData::Input(Arc::new(input)),
        )?;
        loaded.push((block, records, bytes));
    }
    if let Some(saved) = saved.filter(|_| !restored.is_empty()) {
        tracing::info!(
            folder = %saved.folder,
            ?restored,
            "worker-local state of input blocks restored from a checkpoint"
        );
    }
    Ok(loaded)
}

/// The worker-local state of input block `block` in `saved`, if it holds
/// it and it fits `input`. A state that cannot be read or does not fit is
/// drawn afresh, with a warning naming the file: the model and the input
/// are intact, only the block's state starts over.
async fn saved_state(
    fs: &FileSystem,
    app: &Arc<dyn App>,
    saved: Option<&SavedState>,
    block: BlockId,
    input: &InputBlock,
) -> Option<StateBlock> {
    let saved = saved.filter(|_| app.has_state())?;
    match checkpoint::read_state(fs, saved, block).await {
        Ok(Some(state)) if app.state_fits(input, &state) => Some(state),
        Ok(Some(_)) => {
            tracing::warn!(
                "the worker-local state of input block {block} in checkpoint {} does not fit \
                 the block read from the input; it is drawn afresh",
                saved.folder
            );
            None
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("input block {block}: {e}; its worker-local state is drawn afresh");
            None
        }
    }
}

/// Stores a block read from the job's input. The AM has this evaluator
/// read a block only when no live evaluator moves it here, so a move of it
/// still arriving is from a source lost meanwhile (its blocks are re-read,
/// `appmaster/src/am/job/reconfigure/recovery.rs`): it is called off first,
/// as the destination does when a source goes silent.
fn put_read(store: &Store, table: TableId, block: BlockId, data: BlockData) -> Result<(), PsError> {
    if store.slot_kind(table, block)? == SlotKind::Incoming {
        tracing::warn!(
            "block {block} of table {table} was arriving from a lost evaluator; \
             calling that move off and reading the block from the job's input"
        );
        store.abort_incoming(table, block)?;
    }
    store.put_block(table, block, data)?;
    Ok(())
}
