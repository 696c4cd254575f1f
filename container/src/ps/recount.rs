//! A recount of the model from the workers' state (LDA after a lost
//! worker or server, `apps::model_rebuilt_on_loss`): the evaluator's two
//! steps, each under the blocks' own locks.
//!
//! The AM orders it in three rounds, numbered by the job's recounts so far
//! ([`RecountOrder`]): every worker stops between two mini-batches, waits
//! for the pushes it sent to be answered and marks its state uncounted
//! ([`mark_uncounted`]); once every worker has, every holder of model
//! blocks empties them ([`zero_model`]); once every holder has, the
//! workers train on. So every push sent before the marks is in the counts
//! before they are zeroed, and every push sent after them lands on the
//! zeroed counts: the counts are the state counted in since, and each
//! row's next sweep counts its state in again.

use crate::apps::App;
use crate::protocol::{MODEL_TABLE, STATE_TABLE};
use crate::store::{BlockData, KeyedBlock, Store, StoreError};

/// The recounts the AM ordered, as the worker watches them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecountOrder {
    /// The newest recount a worker must hold for (0: none).
    pub hold: u32,
    /// The newest recount after which the workers may train on.
    pub go: u32,
}

/// Marks the state of every input block held here uncounted
/// ([`App::uncount`]), each under its own lock; returns how much was
/// marked. Call only with every push answered and none computed since.
pub fn mark_uncounted(store: &Store, app: &dyn App) -> u64 {
    let mut marked = 0;
    for block in store.local_blocks(STATE_TABLE) {
        let Some(input) = store.input_block(block) else {
            continue;
        };
        marked += store
            .with_state(block, |s| app.uncount(&input, s))
            .unwrap_or(0);
    }
    marked
}

/// Empties every model block owned here (the app's initial values: zero
/// counts); returns how many. A block that is arriving or leaving is not
/// touched: the AM orders a recount only while no block moves.
pub fn zero_model(store: &Store) -> Result<u32, StoreError> {
    let mut zeroed = 0;
    for block in store.local_blocks(MODEL_TABLE) {
        if store.is_owned(MODEL_TABLE, block) {
            store.put_block(MODEL_TABLE, block, BlockData::Keyed(KeyedBlock::default()))?;
            zeroed += 1;
        }
    }
    Ok(zeroed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::apps::lda::{Lda, UNCOUNTED, params};
    use crate::protocol::{BlockId, EvaluatorId, INPUT_TABLE, OwnershipUpdate};

    #[test]
    fn marks_state_and_zeroes_model_blocks_held_here() {
        let c = cruise_conf::LdaConfig {
            topics: 2,
            vocab: 5,
            ..cruise_conf::LdaConfig::default()
        };
        let app = Lda::new(&c, &params(&c).unwrap(), 1).unwrap();
        let me = EvaluatorId(1);
        let store = Store::new(me);
        store.configure(
            &[(MODEL_TABLE, 2), (INPUT_TABLE, 1), (STATE_TABLE, 1)],
            app.model(),
        );
        let input = app.parse(b"0 1:2 3:1\n").unwrap();
        let mut state = app.init_state(BlockId(0), &input).unwrap();
        // Two tokens counted in topics 0 and 1, one not sampled yet.
        let z = state.ints.len() - 3;
        state.ints[z] = 0;
        state.ints[z + 1] = 1;
        let ndk = z - 2;
        state.ints[ndk] = 1;
        state.ints[ndk + 1] = 1;
        store
            .put_block(INPUT_TABLE, BlockId(0), BlockData::Input(Arc::new(input)))
            .unwrap();
        store
            .put_block(STATE_TABLE, BlockId(0), BlockData::State(state))
            .unwrap();
        store.create_blocks(MODEL_TABLE, &[BlockId(0)]).unwrap();
        store.apply_ownership(&OwnershipUpdate {
            version: 1,
            owners: vec![
                (MODEL_TABLE, BlockId(0), me),
                (MODEL_TABLE, BlockId(1), EvaluatorId(2)),
                (INPUT_TABLE, BlockId(0), me),
                (STATE_TABLE, BlockId(0), me),
            ],
        });
        let mut values = crate::protocol::ValueBatch::default();
        values.push(&[3.0, 4.0]);
        // A word whose key is in block 0, held here.
        let key = (0..6)
            .find(|&k| crate::store::block_of_key(k, 2) == BlockId(0))
            .unwrap();
        store
            .submit(&crate::store::StoreOp {
                kind: crate::store::OpKind::Update,
                table: MODEL_TABLE,
                keys: vec![key],
                values,
            })
            .unwrap();
        assert!(!store.keyed_snapshot(BlockId(0)).unwrap().values.is_empty());

        assert_eq!(mark_uncounted(&store, &app), 2);
        let marked = store.with_state(BlockId(0), |s| s.ints.clone()).unwrap();
        assert_eq!(
            &marked[z..],
            &[UNCOUNTED, 1 | UNCOUNTED, crate::apps::lda::UNASSIGNED]
        );
        assert_eq!(&marked[ndk..ndk + 2], &[1, 1], "document counts kept");
        assert_eq!(mark_uncounted(&store, &app), 0, "marked once");

        assert_eq!(zero_model(&store).unwrap(), 1, "only the block held here");
        assert!(store.keyed_snapshot(BlockId(0)).unwrap().values.is_empty());
    }
}
