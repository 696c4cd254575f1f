//! A worker's own pushes applied to what it pulls: the pushes it sent that
//! a pull on its way did not see yet are applied to the pull's answer, so
//! the worker never computes on a model missing its own updates.

use std::sync::Arc;

use crate::protocol::{Key, ValueBatch};
use crate::store::{ModelFunctions, StoreOp};

/// A push this worker sent, kept until every pull on its way reflects it.
pub(super) struct SentPush {
    /// Its place among this worker's pushes (0 for the first).
    pub(super) seq: u64,
    pub(super) op: Arc<StoreOp>,
    /// Where each key's delta starts in `op.values`
    /// ([`value_offsets`](crate::store::value_offsets)).
    pub(super) offsets: Vec<usize>,
}

/// Applies to pulled `values` (laid out as the sorted `keys`) this worker's
/// own pushes that the pull did not see yet (each with its
/// [`value_offsets`](crate::store::value_offsets), oldest first), through
/// the model's update function: the worker then computes on what the
/// servers will hold once those pushes land — its own writes are never
/// stale, however far it pulls ahead. Other workers' pushes in flight are
/// missed as in any asynchronous PS.
///
/// One pass over the pulled keys, merging every push's sorted keys at once:
/// a key's value is updated by all its deltas while it is in cache, with
/// one call of the update function.
pub(super) fn apply_own_pushes(
    model: &dyn ModelFunctions,
    keys: &[Key],
    values: &mut ValueBatch,
    pushes: &[(&StoreOp, &[usize])],
) {
    // A malformed answer (not one value per key) is left for the app's own
    // checks to refuse.
    let total: usize = values.lens.iter().map(|&l| l as usize).sum();
    if values.lens.len() != keys.len() || values.data.len() != total {
        return;
    }
    let mut next = vec![0usize; pushes.len()];
    let mut deltas: Vec<&[f32]> = Vec::with_capacity(pushes.len());
    let mut at = 0usize;
    for (a, &key) in keys.iter().enumerate() {
        let la = values.lens[a] as usize;
        deltas.clear();
        for ((op, offsets), b) in pushes.iter().zip(next.iter_mut()) {
            // Both key lists are sorted.
            while *b < op.keys.len() && op.keys[*b] < key {
                *b += 1;
            }
            if *b < op.keys.len() && op.keys[*b] == key {
                let (o, l) = (offsets[*b], op.values.lens[*b] as usize);
                if l == la {
                    deltas.push(&op.values.data[o..o + l]);
                }
                *b += 1;
            }
        }
        if !deltas.is_empty() {
            model.update_all(key, &mut values.data[at..at + la], &deltas);
        }
        at += la;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MODEL_TABLE;
    use crate::store::{OpKind, value_offsets};

    /// Adds, then clamps at zero: not a plain sum, so the test sees that
    /// the model's own update function is what gets applied.
    struct NonNegative;

    impl ModelFunctions for NonNegative {
        fn value_len(&self) -> usize {
            2
        }
        fn init(&self, _key: Key) -> Vec<f32> {
            vec![0.0; 2]
        }
        fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
            for (v, d) in value.iter_mut().zip(delta) {
                *v = (*v + d).max(0.0);
            }
        }
    }

    fn batch(rows: &[[f32; 2]]) -> ValueBatch {
        let mut b = ValueBatch::default();
        for r in rows {
            b.push(r);
        }
        b
    }

    fn push(keys: &[Key], deltas: &[[f32; 2]]) -> StoreOp {
        StoreOp {
            kind: OpKind::Update,
            table: MODEL_TABLE,
            keys: keys.to_vec(),
            values: batch(deltas),
        }
    }

    #[test]
    fn own_pushes_are_applied_to_the_keys_they_share_in_order() {
        let keys = [1, 3, 5];
        let mut values = batch(&[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]);
        let first = push(
            &[0, 3, 4, 5],
            &[[9.0, 9.0], [1.0, -5.0], [9.0, 9.0], [0.5, 0.5]],
        );
        let second = push(&[1, 3], &[[-2.0, 1.0], [1.0, 1.0]]);
        let offsets = |op: &StoreOp| value_offsets(&op.values);
        let (o1, o2) = (offsets(&first), offsets(&second));
        apply_own_pushes(
            &NonNegative,
            &keys,
            &mut values,
            &[(&first, &o1), (&second, &o2)],
        );
        assert_eq!(
            values.data,
            vec![0.0, 2.0, 4.0, 1.0, 3.5, 3.5],
            "key 1: second only (clamped); key 3: first (clamped) then second; key 5: first"
        );
        // Keys 0 and 4 were not pulled: nothing else changed.
        assert_eq!(values.lens, vec![2, 2, 2]);
    }

    proptest::proptest! {
        /// The one-pass merge gives what applying each push in turn, key by
        /// key, gives.
        #[test]
        fn own_pushes_merged_as_if_applied_one_by_one(
            pulled in proptest::collection::btree_set(0u64..40, 0..20),
            pushes in proptest::collection::vec(
                proptest::collection::btree_map(0u64..40, (-3.0f32..3.0, -3.0f32..3.0), 0..20),
                0..8,
            ),
        ) {
            let keys: Vec<Key> = pulled.into_iter().collect();
            let start: Vec<[f32; 2]> = keys.iter().map(|&k| [k as f32 * 0.1, 1.0]).collect();
            let ops: Vec<StoreOp> = pushes
                .iter()
                .map(|m| {
                    let ks: Vec<Key> = m.keys().copied().collect();
                    let ds: Vec<[f32; 2]> = m.values().map(|&(a, b)| [a, b]).collect();
                    push(&ks, &ds)
                })
                .collect();
            let mut expected = start.clone();
            for op in &ops {
                for (k, d) in op.keys.iter().zip(op.values.iter()) {
                    if let Ok(i) = keys.binary_search(k) {
                        NonNegative.update(*k, &mut expected[i], d);
                    }
                }
            }
            let offsets: Vec<Vec<usize>> = ops.iter().map(|op| value_offsets(&op.values)).collect();
            let with: Vec<(&StoreOp, &[usize])> =
                ops.iter().zip(&offsets).map(|(op, o)| (op, o.as_slice())).collect();
            let mut values = batch(&start);
            apply_own_pushes(&NonNegative, &keys, &mut values, &with);
            proptest::prop_assert_eq!(values.data, expected.concat());
        }
    }
}
