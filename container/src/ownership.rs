//! The authoritative ownership table: which evaluator owns each block of
//! each table, at which version, and the [`OwnershipUpdate`]s that tell
//! the evaluators of a change.
//!
//! The AM keeps one; evaluators only apply its updates to their own view
//! ([`crate::store::Store::apply_ownership`]). Every change is a new
//! version, so an evaluator's acknowledged version says which changes it
//! has seen. Tests and benchmarks that play the AM use the same type.

use std::collections::{BTreeMap, BTreeSet};

use crate::protocol::{BlockId, EvaluatorId, OwnershipUpdate, TableId};

/// A change named a block the table does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ownership: table {table} has no block {block}")]
pub struct UnknownBlock {
    /// The table named.
    pub table: TableId,
    /// The block named.
    pub block: BlockId,
}

/// Who owns each block of each table, and the table's version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerTable {
    tables: BTreeMap<TableId, Vec<EvaluatorId>>,
    version: u64,
}

impl OwnerTable {
    /// An empty table at version 0 (nothing was ever sent).
    pub fn new() -> OwnerTable {
        OwnerTable::default()
    }

    /// The version of the last change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The owner of `block` of `table`, if the table has it.
    pub fn owner(&self, table: TableId, block: BlockId) -> Option<EvaluatorId> {
        self.tables.get(&table)?.get(block.index()).copied()
    }

    /// The blocks of `table` that `id` owns, ascending.
    pub fn blocks_of(&self, table: TableId, id: EvaluatorId) -> Vec<BlockId> {
        self.tables
            .get(&table)
            .map(|owners| {
                (0..)
                    .zip(owners)
                    .filter(|&(_, &o)| o == id)
                    .map(|(b, _)| BlockId(b))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The evaluators that own at least one block of `table`.
    pub fn owners_of(&self, table: TableId) -> BTreeSet<EvaluatorId> {
        self.tables
            .get(&table)
            .map(|owners| owners.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many blocks of each table each evaluator owns.
    pub fn counts(&self) -> BTreeMap<(TableId, EvaluatorId), u32> {
        let mut counts = BTreeMap::new();
        for (&t, owners) in &self.tables {
            for &o in owners {
                *counts.entry((t, o)).or_default() += 1;
            }
        }
        counts
    }

    /// Every block's owner: `(table, block, owner)`, by table then block.
    pub fn entries(&self) -> impl Iterator<Item = (TableId, BlockId, EvaluatorId)> + '_ {
        self.tables
            .iter()
            .flat_map(|(&t, owners)| (0..).zip(owners).map(move |(b, &o)| (t, BlockId(b), o)))
    }

    /// Sets whole tables (`owners[b]` owns block `b`) as the next version,
    /// and returns the update that says so: every block of those tables.
    pub fn assign(
        &mut self,
        tables: impl IntoIterator<Item = (TableId, Vec<EvaluatorId>)>,
    ) -> OwnershipUpdate {
        let mut owners = Vec::new();
        for (t, v) in tables {
            owners.extend((0..).zip(&v).map(|(b, &o)| (t, BlockId(b), o)));
            self.tables.insert(t, v);
        }
        self.version += 1;
        OwnershipUpdate {
            version: self.version,
            owners,
        }
    }

    /// Records `changes` (`(table, block, new owner)`) as the next version
    /// and returns the update to broadcast. Nothing changes if one names a
    /// block the table does not have.
    pub fn change(
        &mut self,
        changes: Vec<(TableId, BlockId, EvaluatorId)>,
    ) -> Result<OwnershipUpdate, UnknownBlock> {
        if let Some(&(table, block, _)) = changes
            .iter()
            .find(|&&(t, b, _)| self.owner(t, b).is_none())
        {
            return Err(UnknownBlock { table, block });
        }
        for &(t, b, o) in &changes {
            if let Some(slot) = self.tables.get_mut(&t).and_then(|v| v.get_mut(b.index())) {
                *slot = o;
            }
        }
        self.version += 1;
        Ok(OwnershipUpdate {
            version: self.version,
            owners: changes,
        })
    }

    /// The whole table at the current version: what an evaluator that joins
    /// a running job applies first.
    pub fn full(&self) -> OwnershipUpdate {
        OwnershipUpdate {
            version: self.version,
            owners: self.entries().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, SumModel};

    fn ids(v: &[u32]) -> Vec<EvaluatorId> {
        v.iter().copied().map(EvaluatorId).collect()
    }

    fn entries(v: &[(TableId, BlockId, u32)]) -> Vec<(TableId, BlockId, EvaluatorId)> {
        v.iter().map(|&(t, b, e)| (t, b, EvaluatorId(e))).collect()
    }

    fn configured(me: EvaluatorId) -> Store {
        let s = Store::new(me);
        s.configure(&[(0, 3)], std::sync::Arc::new(SumModel));
        s
    }

    #[test]
    fn every_change_is_a_new_version_and_a_delta() {
        let mut t = OwnerTable::new();
        assert_eq!(t.version(), 0);
        let first = t.assign([(0, ids(&[1, 2, 1])), (1, ids(&[3]))]);
        assert_eq!(first.version, 1);
        assert_eq!(
            first.owners,
            entries(&[
                (0, BlockId(0), 1),
                (0, BlockId(1), 2),
                (0, BlockId(2), 1),
                (1, BlockId(0), 3)
            ])
        );
        assert_eq!(t.blocks_of(0, EvaluatorId(1)), vec![BlockId(0), BlockId(2)]);
        assert_eq!(t.owners_of(0), BTreeSet::from_iter(ids(&[1, 2])));
        let delta = t.change(vec![(0, BlockId(1), EvaluatorId(1))]).unwrap();
        assert_eq!(delta.version, 2);
        assert_eq!(delta.owners, entries(&[(0, BlockId(1), 1)]));
        assert_eq!(t.owners_of(0), BTreeSet::from_iter(ids(&[1])));
        assert_eq!(t.counts()[&(0, EvaluatorId(1))], 3);
        assert_eq!(t.full().owners.len(), 4);
        assert_eq!(t.full().version, 2);
    }

    #[test]
    fn a_change_naming_a_missing_block_changes_nothing() {
        let mut t = OwnerTable::new();
        t.assign([(0, ids(&[1, 2]))]);
        let before = t.clone();
        assert_eq!(
            t.change(vec![
                (0, BlockId(0), EvaluatorId(2)),
                (0, BlockId(5), EvaluatorId(2))
            ]),
            Err(UnknownBlock {
                table: 0,
                block: BlockId(5)
            })
        );
        assert_eq!(
            t.change(vec![(7, BlockId(0), EvaluatorId(2))])
                .unwrap_err()
                .table,
            7
        );
        assert_eq!(t, before);
    }

    /// An evaluator that applies the full table, then the deltas, sees
    /// what the table says.
    #[test]
    fn a_store_that_applies_the_updates_agrees_with_the_table() {
        let mut t = OwnerTable::new();
        let store = configured(EvaluatorId(1));
        store.apply_ownership(&t.assign([(0, ids(&[1, 2, 2]))]));
        assert_eq!(
            store.apply_ownership(&t.change(vec![(0, BlockId(2), EvaluatorId(1))]).unwrap()),
            2
        );
        let late = configured(EvaluatorId(2));
        assert_eq!(late.apply_ownership(&t.full()), 2);
        for s in [&store, &late] {
            for (table, block, owner) in t.entries() {
                assert_eq!(s.owner(table, block), Some(owner));
            }
        }
    }
}
