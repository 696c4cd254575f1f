//! Key bookkeeping for MLR (the sparse app that pays for it most): the sorted, distinct model keys
//! a mini-batch needs, and the position of each of its entries' keys among
//! them.
//!
//! A mini-batch of 100 records with 40 features each names its keys 4,000
//! times; sorting them and binary-searching each entry twice (scores, then
//! gradient) cost more than the arithmetic. When the key space is small enough
//! for a dense table (at most [`DENSE_KEYS`] keys), both are done with one
//! table per thread instead: a bitmap marks the keys seen, and a position table
//! is filled for the batch's keys and cleared after. Larger key spaces fall
//! back to sorting and binary search.

use std::cell::RefCell;

use crate::protocol::Key;

/// Key spaces up to this size use dense per-thread tables (4 MiB of
/// positions at the most).
pub const DENSE_KEYS: u64 = 1 << 20;

/// Marks a key as absent from the batch in [`positions`]' output.
pub const ABSENT: u32 = u32::MAX;

thread_local! {
    /// Per-thread scratch: a bitmap of keys seen and a key → position table
    /// (all `ABSENT` between uses).
    static SCRATCH: RefCell<(Vec<u64>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Fills `out` with the distinct keys of `keys`, in increasing order. Keys
/// must be below `key_space` when `key_space <= DENSE_KEYS` (others are then
/// ignored).
pub fn distinct_sorted(keys: impl Iterator<Item = Key>, key_space: u64, out: &mut Vec<Key>) {
    out.clear();
    if key_space > DENSE_KEYS {
        out.extend(keys);
        out.sort_unstable();
        out.dedup();
        return;
    }
    SCRATCH.with(|s| {
        let bits = &mut s.borrow_mut().0;
        let words = key_space.div_ceil(64) as usize;
        if bits.len() < words {
            bits.resize(words, 0);
        }
        for k in keys {
            if k < key_space {
                bits[(k / 64) as usize] |= 1 << (k % 64);
            }
        }
        for (w, word) in bits[..words].iter_mut().enumerate() {
            let mut x = *word;
            while x != 0 {
                out.push(w as u64 * 64 + u64::from(x.trailing_zeros()));
                x &= x - 1;
            }
            *word = 0;
        }
    });
}

/// Writes, for each key of `lookups`, its position in `keys` (sorted and
/// distinct), or [`ABSENT`] when it is not there.
pub fn positions(
    keys: &[Key],
    key_space: u64,
    lookups: impl Iterator<Item = Key>,
    out: &mut Vec<u32>,
) {
    out.clear();
    if key_space > DENSE_KEYS || keys.len() >= ABSENT as usize {
        out.extend(lookups.map(|k| match keys.binary_search(&k) {
            Ok(p) => p as u32,
            Err(_) => ABSENT,
        }));
        return;
    }
    SCRATCH.with(|s| {
        let table = &mut s.borrow_mut().1;
        if table.len() < key_space as usize {
            table.resize(key_space as usize, ABSENT);
        }
        for (p, &k) in keys.iter().enumerate() {
            if k < key_space {
                table[k as usize] = p as u32;
            }
        }
        out.extend(lookups.map(|k| {
            if k < key_space {
                table[k as usize]
            } else {
                ABSENT
            }
        }));
        for &k in keys {
            if k < key_space {
                table[k as usize] = ABSENT;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(keys: &[Key]) -> Vec<Key> {
        let mut v = keys.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    }

    proptest! {
        #[test]
        fn dense_and_sorted_paths_agree(keys in proptest::collection::vec(0u64..300, 0..200),
                                        lookups in proptest::collection::vec(0u64..300, 0..100)) {
            let want = reference(&keys);
            let mut dense = Vec::new();
            distinct_sorted(keys.iter().copied(), 300, &mut dense);
            prop_assert_eq!(&dense, &want);
            let mut sparse = Vec::new();
            distinct_sorted(keys.iter().copied(), DENSE_KEYS + 1, &mut sparse);
            prop_assert_eq!(&sparse, &want);

            let mut a = Vec::new();
            positions(&want, 300, lookups.iter().copied(), &mut a);
            let mut b = Vec::new();
            positions(&want, DENSE_KEYS + 1, lookups.iter().copied(), &mut b);
            prop_assert_eq!(&a, &b);
            for (k, p) in lookups.iter().zip(&a) {
                match want.binary_search(k) {
                    Ok(i) => prop_assert_eq!(*p, i as u32),
                    Err(_) => prop_assert_eq!(*p, ABSENT),
                }
            }
            // The scratch tables are clean again: a second use sees no leftovers.
            let mut again = Vec::new();
            positions(&[], 300, lookups.iter().copied(), &mut again);
            prop_assert!(again.iter().all(|&p| p == ABSENT));
            let mut none = Vec::new();
            distinct_sorted(std::iter::empty(), 300, &mut none);
            prop_assert!(none.is_empty());
        }
    }
}
