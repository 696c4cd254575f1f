//! The model keys of each mini-batch, listed once by the app and kept
//! across epochs.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::apps::App;
use crate::protocol::{BlockId, Key};
use crate::store::InputBlock;

/// The model keys of each mini-batch, from the app, kept across epochs: a
/// mini-batch needs the same keys every epoch, and listing them (distinct and
/// sorted, from every entry of every record) cost MLR at B = 100 a tenth of
/// its worker's time. Entries are tied to the block's records (the
/// `Arc<InputBlock>` they were listed from): a block that is moved away and
/// back is listed again, and the keys of blocks no longer here are dropped
/// at the start of each local epoch. At most [`KeyCache::MAX_BYTES`] of
/// keys are kept; beyond that they are listed every time.
#[derive(Default)]
pub(super) struct KeyCache {
    blocks: HashMap<BlockId, CachedBlock>,
    bytes: usize,
}

struct CachedBlock {
    /// The records the keys were listed from.
    input: Arc<InputBlock>,
    /// Keys by the mini-batch's first row.
    batches: HashMap<usize, Vec<Key>>,
}

impl KeyCache {
    const MAX_BYTES: usize = 64 << 20;

    /// The keys of `rows` of `input` (block `block`), sorted and distinct.
    pub(super) fn keys(
        &mut self,
        app: &dyn App,
        block: BlockId,
        input: &Arc<InputBlock>,
        rows: Range<usize>,
    ) -> Vec<Key> {
        let entry = self.blocks.get(&block);
        if let Some(keys) = entry
            .filter(|c| Arc::ptr_eq(&c.input, input))
            .and_then(|c| c.batches.get(&rows.start))
        {
            return keys.clone();
        }
        let mut keys = Vec::new();
        app.keys(input, rows.clone(), &mut keys);
        if entry.is_some_and(|c| !Arc::ptr_eq(&c.input, input)) {
            self.forget(block);
        }
        let size = keys.len() * std::mem::size_of::<Key>();
        if self.bytes + size <= Self::MAX_BYTES {
            self.bytes += size;
            self.blocks
                .entry(block)
                .or_insert_with(|| CachedBlock {
                    input: Arc::clone(input),
                    batches: HashMap::new(),
                })
                .batches
                .insert(rows.start, keys.clone());
        }
        keys
    }

    /// Drops the keys of `block` (moved away).
    fn forget(&mut self, block: BlockId) {
        if let Some(c) = self.blocks.remove(&block) {
            let size: usize = c.batches.values().map(Vec::len).sum();
            self.bytes -= size * std::mem::size_of::<Key>();
        }
    }

    /// Drops the keys of the blocks `held` says are no longer here (and
    /// with them the records they hold on to).
    pub(super) fn retain(&mut self, held: impl Fn(BlockId) -> bool) {
        let gone: Vec<BlockId> = self.blocks.keys().copied().filter(|&b| !held(b)).collect();
        for b in gone {
            self.forget(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cached keys are the app's; records replaced under the same block id
    /// are listed again; forgetting gives the budget back.
    #[test]
    fn key_cache_follows_the_records() {
        use crate::apps::mlr::{Mlr, params};
        let c = cruise_conf::MlrConfig {
            classes: 3,
            features: 10,
            features_per_key: 2,
            ..cruise_conf::MlrConfig::default()
        };
        let app = Mlr::new(&c, &params(&c, 4).unwrap()).unwrap();
        let listed = |input: &InputBlock, rows: Range<usize>| {
            let mut k = Vec::new();
            app.keys(input, rows, &mut k);
            k
        };
        let a = Arc::new(app.parse(b"0 1:1 3:1\n1 2:1\n2 9:1\n").unwrap());
        let b = Arc::new(app.parse(b"0 7:1\n1 8:1\n2 5:1\n").unwrap());
        let mut cache = KeyCache::default();
        for _ in 0..2 {
            assert_eq!(cache.keys(&app, BlockId(0), &a, 0..2), listed(&a, 0..2));
            assert_eq!(cache.keys(&app, BlockId(0), &a, 2..3), listed(&a, 2..3));
        }
        assert!(cache.bytes > 0);
        // Block 0 now holds other records: listed from them.
        assert_ne!(listed(&a, 0..2), listed(&b, 0..2));
        assert_eq!(cache.keys(&app, BlockId(0), &b, 0..2), listed(&b, 0..2));
        assert_eq!(cache.keys(&app, BlockId(1), &a, 0..2), listed(&a, 0..2));
        cache.retain(|block| block == BlockId(1));
        assert_eq!(cache.blocks.len(), 1);
        cache.forget(BlockId(1));
        assert_eq!(cache.bytes, 0);
        assert!(cache.blocks.is_empty());
    }
}
