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
/// drawn afresh, with a warning naming the file or the checkpoint: the
/// model and the input are intact, only the block's state starts over.
async fn saved_state(
    fs: &FileSystem,
    app: &Arc<dyn App>,
    saved: Option<&SavedState>,
    block: BlockId,
    input: &InputBlock,
) -> Option<StateBlock> {
    let saved = saved.filter(|_| app.has_state())?;
    match checkpoint::read_state(fs, saved, block).await {
        Ok(Some(state)) => {
            let restored = app.restore_state(input, state);
            if restored.is_none() {
                tracing::warn!(
                    "the worker-local state of input block {block} in checkpoint {} does not \
                     fit the block read from the input; it is drawn afresh",
                    saved.folder
                );
            }
            restored
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

#[cfg(test)]
mod tests {
    use cruise_conf::NmfConfig;

    use super::*;
    use crate::apps::nmf::{self, Nmf};

    /// An NMF worker's store and app, and a split of three rows (rank 2).
    fn setup(dir: &std::path::Path) -> (Arc<dyn App>, Store, Split) {
        let c = NmfConfig {
            columns: 10,
            rank: 2,
            ..NmfConfig::default()
        };
        let app: Arc<dyn App> = Arc::new(Nmf::new(&c, &nmf::params(&c).unwrap(), 5).unwrap());
        let store = Store::new(crate::protocol::EvaluatorId(1));
        store.configure(&[(INPUT_TABLE, 1), (STATE_TABLE, 1)], app.model());
        let text = b"4: 0,1.0 3,2.0\n9: 1,0.5\n2:\n";
        let path = dir.join("rows.txt");
        std::fs::write(&path, text).unwrap();
        let split = Split {
            uri: path.display().to_string(),
            start: 0,
            end: text.len() as u64,
        };
        (app, store, split)
    }

    /// A checkpoint in `dir` holding `state` as input block 0's.
    async fn saved(fs: &FileSystem, dir: &std::path::Path, state: StateBlock) -> SavedState {
        let holder = Store::new(crate::protocol::EvaluatorId(2));
        holder.configure(&[(STATE_TABLE, 1)], Arc::new(crate::store::SumModel));
        holder
            .put_block(STATE_TABLE, BlockId(0), BlockData::State(state))
            .unwrap();
        let folder = checkpoint::folder(&dir.join("ckpt").display().to_string(), 1);
        let files = checkpoint::write_blocks(fs, &holder, &folder, true)
            .await
            .unwrap();
        SavedState { folder, files }
    }

    #[tokio::test]
    async fn a_loaded_block_restores_its_state_from_the_checkpoint_when_it_fits() {
        let t = tempfile::tempdir().unwrap();
        let fs = FileSystem::default();
        let (app, store, split) = setup(t.path());
        let trained = StateBlock {
            floats: vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
            ints: Vec::new(),
        };
        let s = saved(&fs, t.path(), trained.clone()).await;
        let blocks = vec![(BlockId(0), split.clone())];
        load_input(fs.clone(), Arc::clone(&app), store.clone(), blocks, Some(s))
            .await
            .unwrap();
        assert_eq!(store.with_state(BlockId(0), |s| s.clone()), Some(trained));

        // A state of another shape (the input changed) is drawn afresh.
        let (app, store, split) = setup(t.path());
        let short = StateBlock {
            floats: vec![0.1, 0.2],
            ints: Vec::new(),
        };
        let s = saved(&fs, &t.path().join("other"), short).await;
        let input = read_input(&fs, &app, &split).await.unwrap().0;
        let blocks = vec![(BlockId(0), split)];
        load_input(fs, Arc::clone(&app), store.clone(), blocks, Some(s))
            .await
            .unwrap();
        let fresh = app.init_state(BlockId(0), &input);
        assert_eq!(store.with_state(BlockId(0), |s| s.clone()), fresh);
    }
}
