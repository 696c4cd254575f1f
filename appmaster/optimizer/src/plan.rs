//! Reconfiguration plans: the difference between the running configuration and a
//! target, as a DAG of `Add`, `Delete`, `Switch` and `Move` operations.
//!
//! Moves are chosen greedily per table: the container with the largest surplus sends to
//! the one with the largest deficit, as many blocks as the smaller of the two, until all
//! are balanced. Every block that moves is one that must move (the total moved equals
//! the total surplus, the minimum), and each step settles a container, so there are at
//! most `containers − 1` moves per table.
//!
//! Dependencies (an edge `a → b` means `b` starts after `a` succeeded):
//! * `Add(c)` → every move into `c`;
//! * every move out of `c` → `Delete(c)`;
//! * worker→server `Switch(c)`: moves of `c`'s input blocks out → the switch → moves of
//!   model blocks into `c` (server→worker symmetric).
//!
//! The last kind ("move in after the switch") is relaxed when it would close a cycle,
//! which happens when two containers trade roles and blocks directly; the block then
//! lands in the store of a container whose role does not use it yet, which the elastic
//! store allows (a block's owner serves it whatever its role). While another worker
//! keeps training throughout, input moves give way (input waits untrained on a server
//! about to work); otherwise model moves do (a worker about to serve holds the model
//! and trains with it meanwhile). Relaxed edges are listed in [`Plan::relaxed`].
//! Operations are stored in a topological order, so every dependency points to an
//! earlier operation.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use serde::{Deserialize, Serialize};

use crate::cost::{Placement, Target};
use crate::error::OptimizerError;
use crate::snapshot::Role;

/// A table of the elastic store whose blocks a plan moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    /// Training input (with the worker-local state that moves with it).
    Input,
    /// Model parameters.
    Model,
}

/// What one container runs and which blocks it owns.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Holding {
    /// Role.
    pub role: Role,
    /// Input block ids owned.
    pub input: BTreeSet<u32>,
    /// Model block ids owned.
    pub model: BTreeSet<u32>,
}

impl Holding {
    fn table(&self, t: Table) -> &BTreeSet<u32> {
        match t {
            Table::Input => &self.input,
            Table::Model => &self.model,
        }
    }
    fn table_mut(&mut self, t: Table) -> &mut BTreeSet<u32> {
        match t {
            Table::Input => &mut self.input,
            Table::Model => &mut self.model,
        }
    }
}

/// The running configuration: container id → holding. The AM's ownership table.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Configuration {
    /// Containers by id.
    pub containers: BTreeMap<String, Holding>,
}

impl Configuration {
    /// Role and block counts of every container.
    pub fn counts(&self) -> Target {
        self.containers
            .iter()
            .map(|(id, h)| {
                (
                    id.clone(),
                    Placement {
                        role: h.role,
                        input_blocks: h.input.len() as u32,
                        model_blocks: h.model.len() as u32,
                    },
                )
            })
            .collect()
    }

    /// Checks that no block has two owners; returns the number of input and model blocks.
    pub fn validate(&self) -> Result<(u32, u32), OptimizerError> {
        let mut totals = [0u32; 2];
        for (x, t) in [Table::Input, Table::Model].into_iter().enumerate() {
            let mut seen = BTreeSet::new();
            for (id, h) in &self.containers {
                for &b in h.table(t) {
                    if !seen.insert(b) {
                        return Err(OptimizerError::InconsistentBlocks(format!(
                            "{t:?} block {b} has two owners (one is `{id}`)"
                        )));
                    }
                }
            }
            totals[x] = seen.len() as u32;
        }
        Ok((totals[0], totals[1]))
    }

    /// Owner of every block of `table`.
    pub fn owners(&self, table: Table) -> BTreeMap<u32, String> {
        let mut out = BTreeMap::new();
        for (id, h) in &self.containers {
            for &b in h.table(table) {
                out.insert(b, id.clone());
            }
        }
        out
    }
}

/// One reconfiguration step (Cruise's Elastic Runtime interface).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Operation {
    /// Start `role` on a container the resource manager has just allocated.
    Add {
        /// Container id.
        container: String,
        /// Worker or server.
        role: Role,
    },
    /// Stop the container's role and release the container (it holds no block by then).
    Delete {
        /// Container id.
        container: String,
    },
    /// Change a running container from worker to server or back.
    Switch {
        /// Container id.
        container: String,
        /// The new role.
        to_role: Role,
    },
    /// Move blocks of one table between containers.
    Move {
        /// Which table.
        table: Table,
        /// Block ids.
        blocks: Vec<u32>,
        /// Source container.
        from: String,
        /// Destination container.
        to: String,
    },
}

impl Operation {
    /// The kind of operation, for cost accounting.
    pub fn kind(&self) -> OpKind {
        match self {
            Operation::Add { .. } => OpKind::Add,
            Operation::Delete { .. } => OpKind::Delete,
            Operation::Switch { .. } => OpKind::Switch,
            Operation::Move { table, .. } => OpKind::Move(*table),
        }
    }
}

/// Operation kinds, with moves split by table (their per-byte costs differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `Add`.
    Add,
    /// `Delete`.
    Delete,
    /// `Switch`.
    Switch,
    /// `Move` of the given table.
    Move(Table),
}

impl OpKind {
    /// How the kind reads in reports: `add`, `delete`, `switch`, `move
    /// input`, `move model`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Add => "add",
            OpKind::Delete => "delete",
            OpKind::Switch => "switch",
            OpKind::Move(Table::Input) => "move input",
            OpKind::Move(Table::Model) => "move model",
        }
    }

    /// Every kind.
    pub const ALL: [OpKind; 5] = [
        OpKind::Add,
        OpKind::Delete,
        OpKind::Switch,
        OpKind::Move(Table::Input),
        OpKind::Move(Table::Model),
    ];
}

/// An operation and the earlier operations it waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedOp {
    /// The operation.
    pub op: Operation,
    /// Indices (all smaller than this one's) of the operations that must succeed first.
    pub deps: Vec<usize>,
}

/// A reconfiguration plan: operations in topological order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Plan {
    /// Operations; dependencies point backwards.
    pub ops: Vec<PlannedOp>,
    /// "Move in after switch" edges `(switch, move)` left out to avoid a cycle.
    pub relaxed: Vec<(usize, usize)>,
}

impl Plan {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of blocks moved per table `(input, model)`.
    pub fn blocks_moved(&self) -> (u32, u32) {
        let mut out = (0, 0);
        for p in &self.ops {
            if let Operation::Move { table, blocks, .. } = &p.op {
                match table {
                    Table::Input => out.0 += blocks.len() as u32,
                    Table::Model => out.1 += blocks.len() as u32,
                }
            }
        }
        out
    }

    /// Indices of the operations that depend on `op`, directly or transitively.
    pub fn dependents(&self, op: usize) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        out.insert(op);
        for (i, p) in self.ops.iter().enumerate().skip(op + 1) {
            if p.deps.iter().any(|d| out.contains(d)) {
                out.insert(i);
            }
        }
        out.remove(&op);
        out
    }

    /// Checks that every dependency points to an earlier operation (hence no cycle).
    pub fn validate(&self) -> Result<(), OptimizerError> {
        for (i, p) in self.ops.iter().enumerate() {
            for &d in &p.deps {
                if d >= i {
                    return Err(OptimizerError::InvalidPlan(format!(
                        "operation {i} depends on operation {d}, which is not earlier"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The plan that turns `current` into `target` (block counts per container; missing
    /// containers are idle and get deleted).
    pub fn between(current: &Configuration, target: &Target) -> Result<Plan, OptimizerError> {
        check_target(current, target)?;
        let mut draft = Draft::new(current, target);
        draft.role_changes();
        for table in [Table::Input, Table::Model] {
            draft.moves_of(table)?;
        }
        draft.deletes();
        let (edges, relaxed) = draft.edges();
        ordered(draft.ops, &edges, &relaxed)
    }

    /// Applies every operation in plan order to `config`, checking each precondition.
    pub fn apply(&self, config: &Configuration) -> Result<Configuration, OptimizerError> {
        self.apply_where(config, |_| true)
    }

    /// Applies, in plan order, only the operations `i` for which `include(i)` holds
    /// (e.g. those that succeeded), checking each precondition.
    pub fn apply_where(
        &self,
        config: &Configuration,
        include: impl Fn(usize) -> bool,
    ) -> Result<Configuration, OptimizerError> {
        let mut c = config.clone();
        for (i, p) in self.ops.iter().enumerate() {
            if include(i) {
                apply_op(&mut c, i, &p.op)?;
            }
        }
        Ok(c)
    }
}

/// Checks that `target` names only containers of `current`, gives each role
/// only the blocks it may hold, and holds exactly the blocks `current` does.
fn check_target(current: &Configuration, target: &Target) -> Result<(), OptimizerError> {
    let (n_input, n_model) = current.validate()?;
    let (mut t_input, mut t_model) = (0u64, 0u64);
    for (id, p) in target {
        if !current.containers.contains_key(id) {
            return Err(OptimizerError::UnknownContainer {
                container: id.clone(),
                context: "target (not in the current configuration)".into(),
            });
        }
        let ok = match p.role {
            Role::Worker => p.model_blocks == 0,
            Role::Server => p.input_blocks == 0,
            Role::Idle => p.input_blocks == 0 && p.model_blocks == 0,
        };
        if !ok {
            return Err(OptimizerError::InconsistentBlocks(format!(
                "target gives `{id}` ({:?}) {} input and {} model blocks",
                p.role, p.input_blocks, p.model_blocks
            )));
        }
        t_input += u64::from(p.input_blocks);
        t_model += u64::from(p.model_blocks);
    }
    if t_input != u64::from(n_input) || t_model != u64::from(n_model) {
        return Err(OptimizerError::InconsistentBlocks(format!(
            "target holds {t_input} input and {t_model} model blocks, the configuration {n_input} and {n_model}"
        )));
    }
    Ok(())
}

/// A plan's operations before they are ordered: what [`Plan::between`]
/// builds, with the index of each container's add, switch and delete so
/// that the moves can be tied to them.
struct Draft<'a> {
    current: &'a Configuration,
    target: &'a Target,
    ops: Vec<Operation>,
    add_of: BTreeMap<String, usize>,
    switch_of: BTreeMap<String, usize>,
    delete_of: BTreeMap<String, usize>,
    moves: Vec<usize>,
}

impl<'a> Draft<'a> {
    fn new(current: &'a Configuration, target: &'a Target) -> Self {
        Draft {
            current,
            target,
            ops: Vec::new(),
            add_of: BTreeMap::new(),
            switch_of: BTreeMap::new(),
            delete_of: BTreeMap::new(),
            moves: Vec::new(),
        }
    }

    /// Where `id` is to be: idle unless the target names it.
    fn want(&self, id: &str) -> Placement {
        self.target.get(id).copied().unwrap_or(Placement::IDLE)
    }

    /// An add for each idle container that gets a role, a switch for each
    /// worker that becomes a server and each server that becomes a worker.
    fn role_changes(&mut self) {
        for (id, h) in &self.current.containers {
            let to = self.want(id).role;
            match (h.role, to) {
                (Role::Idle, Role::Worker | Role::Server) => {
                    self.add_of.insert(id.clone(), self.ops.len());
                    self.ops.push(Operation::Add {
                        container: id.clone(),
                        role: to,
                    });
                }
                (Role::Worker, Role::Server) | (Role::Server, Role::Worker) => {
                    self.switch_of.insert(id.clone(), self.ops.len());
                    self.ops.push(Operation::Switch {
                        container: id.clone(),
                        to_role: to,
                    });
                }
                _ => {}
            }
        }
    }

    /// The moves of one table: the containers holding more blocks than the
    /// target gives them (each giving away its highest block ids) paired
    /// with those holding fewer, largest surplus with largest deficit.
    fn moves_of(&mut self, table: Table) -> Result<(), OptimizerError> {
        let mut surplus = BinaryHeap::new();
        let mut deficit = BinaryHeap::new();
        let mut pool: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (id, h) in &self.current.containers {
            let have = h.table(table).len() as u32;
            let need = match table {
                Table::Input => self.want(id).input_blocks,
                Table::Model => self.want(id).model_blocks,
            };
            if have > need {
                surplus.push((have - need, std::cmp::Reverse(id.as_str())));
                let give: Vec<u32> = h
                    .table(table)
                    .iter()
                    .rev()
                    .take((have - need) as usize)
                    .copied()
                    .collect();
                pool.insert(id.as_str(), give);
            } else if need > have {
                deficit.push((need - have, std::cmp::Reverse(id.as_str())));
            }
        }
        while let (Some((s, std::cmp::Reverse(src))), Some((d, std::cmp::Reverse(dst)))) =
            (surplus.pop(), deficit.pop())
        {
            let n = s.min(d);
            let give = pool.get_mut(src).ok_or_else(|| {
                OptimizerError::InvalidPlan(format!("no blocks pooled for `{src}`"))
            })?;
            let mut blocks: Vec<u32> = give.drain(..n as usize).collect();
            blocks.sort_unstable();
            self.moves.push(self.ops.len());
            self.ops.push(Operation::Move {
                table,
                blocks,
                from: src.to_string(),
                to: dst.to_string(),
            });
            if s > n {
                surplus.push((s - n, std::cmp::Reverse(src)));
            }
            if d > n {
                deficit.push((d - n, std::cmp::Reverse(dst)));
            }
        }
        if !surplus.is_empty() || !deficit.is_empty() {
            return Err(OptimizerError::InvalidPlan(format!(
                "{table:?} blocks do not balance"
            )));
        }
        Ok(())
    }

    /// A delete for each container the target leaves idle.
    fn deletes(&mut self) {
        for id in self.current.containers.keys() {
            if self.want(id).role == Role::Idle {
                self.delete_of.insert(id.clone(), self.ops.len());
                self.ops.push(Operation::Delete {
                    container: id.clone(),
                });
            }
        }
    }

    /// The dependency edges (`edges[a]` holds what must wait for `a`) and
    /// the soft edges given up to avoid a cycle, as (switch, move).
    ///
    /// Hard edges: a move into an added container after its add; a move out
    /// of a deleted container before its delete; a move of the table a
    /// switching container leaves before its switch. Soft edges (a move of
    /// the table a switching container enters after its switch) are kept
    /// where they form no cycle.
    fn edges(&self) -> (Vec<BTreeSet<usize>>, Vec<(usize, usize)>) {
        let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); self.ops.len()];
        let mut soft = Vec::new();
        for &mv in &self.moves {
            let Operation::Move {
                table, from, to, ..
            } = &self.ops[mv]
            else {
                continue;
            };
            if let Some(&a) = self.add_of.get(to) {
                edges[a].insert(mv);
            }
            if let Some(&d) = self.delete_of.get(from) {
                edges[mv].insert(d);
            }
            if let Some(&s) = self.switch_of.get(from) {
                let leaves = matches!(
                    (table, self.current.containers.get(from).map(|h| h.role)),
                    (Table::Input, Some(Role::Worker)) | (Table::Model, Some(Role::Server))
                );
                if leaves {
                    edges[mv].insert(s);
                }
            }
            if let Some(&s) = self.switch_of.get(to) {
                let enters = matches!(
                    (table, self.want(to).role),
                    (Table::Input, Role::Worker) | (Table::Model, Role::Server)
                );
                if enters {
                    soft.push((s, mv));
                }
            }
        }
        // Which kind gives way in a trade. Relaxing "model in after the
        // switch to server" leaves a worker holding the model for a while:
        // it trains with every pull local, and under `sync = async`, where
        // an epoch is the data set's worth of records from any worker, it
        // alone can finish the job's epochs mid-plan. Relaxing "input in
        // after the switch to worker" instead leaves that input untrained
        // until its new worker switches, which is harmless while another
        // worker trains throughout; without one it would stop training, so
        // then the model edge gives way.
        let steady_worker = self
            .current
            .containers
            .iter()
            .any(|(id, h)| h.role == Role::Worker && self.want(id).role == Role::Worker);
        soft.sort_by_key(|&(_, mv)| {
            let model = matches!(
                self.ops[mv],
                Operation::Move {
                    table: Table::Model,
                    ..
                }
            );
            model != steady_worker
        });
        let mut relaxed = Vec::new();
        for (s, mv) in soft {
            if reaches(&edges, mv, s) {
                relaxed.push((s, mv));
            } else {
                edges[s].insert(mv);
            }
        }
        (edges, relaxed)
    }
}

/// The plan of `ops` in topological order of `edges` (smallest index first
/// among the ready ones), with each operation's dependencies and the
/// relaxed edges renumbered to that order.
fn ordered(
    ops: Vec<Operation>,
    edges: &[BTreeSet<usize>],
    relaxed: &[(usize, usize)],
) -> Result<Plan, OptimizerError> {
    let mut indeg = vec![0usize; ops.len()];
    for e in edges {
        for &b in e {
            indeg[b] += 1;
        }
    }
    let mut ready: BTreeSet<usize> = (0..ops.len()).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(ops.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &b in &edges[i] {
            indeg[b] -= 1;
            if indeg[b] == 0 {
                ready.insert(b);
            }
        }
    }
    if order.len() != ops.len() {
        return Err(OptimizerError::InvalidPlan(
            "dependency graph has a cycle".into(),
        ));
    }
    let mut pos = vec![0usize; ops.len()];
    for (new, &old) in order.iter().enumerate() {
        pos[old] = new;
    }
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    for (a, e) in edges.iter().enumerate() {
        for &b in e {
            deps[pos[b]].push(pos[a]);
        }
    }
    let mut slots: Vec<Option<Operation>> = ops.into_iter().map(Some).collect();
    let mut planned = Vec::with_capacity(order.len());
    for (new, &old) in order.iter().enumerate() {
        let op = slots[old]
            .take()
            .ok_or_else(|| OptimizerError::InvalidPlan("operation ordered twice".into()))?;
        let mut d = std::mem::take(&mut deps[new]);
        d.sort_unstable();
        planned.push(PlannedOp { op, deps: d });
    }
    let plan = Plan {
        ops: planned,
        relaxed: relaxed.iter().map(|&(s, m)| (pos[s], pos[m])).collect(),
    };
    plan.validate()?;
    Ok(plan)
}

fn reaches(edges: &[BTreeSet<usize>], from: usize, to: usize) -> bool {
    let mut stack = vec![from];
    let mut seen = BTreeSet::new();
    while let Some(x) = stack.pop() {
        if x == to {
            return true;
        }
        if seen.insert(x) {
            stack.extend(edges[x].iter().copied());
        }
    }
    false
}

/// Applies one operation, checking its preconditions.
pub fn apply_op(c: &mut Configuration, i: usize, op: &Operation) -> Result<(), OptimizerError> {
    let fail = |reason: String| OptimizerError::PlanApply { op: i, reason };
    match op {
        Operation::Add { container, role } => {
            let h = c
                .containers
                .get_mut(container)
                .ok_or_else(|| fail(format!("add: unknown container `{container}`")))?;
            if h.role != Role::Idle || *role == Role::Idle {
                return Err(fail(format!(
                    "add `{container}` as {role:?}: it is {:?}",
                    h.role
                )));
            }
            h.role = *role;
        }
        Operation::Delete { container } => {
            let h = c
                .containers
                .get(container)
                .ok_or_else(|| fail(format!("delete: unknown container `{container}`")))?;
            if !h.input.is_empty() || !h.model.is_empty() {
                return Err(fail(format!(
                    "delete `{container}`: it still owns {} input and {} model blocks",
                    h.input.len(),
                    h.model.len()
                )));
            }
            c.containers.remove(container);
        }
        Operation::Switch { container, to_role } => {
            let h = c
                .containers
                .get_mut(container)
                .ok_or_else(|| fail(format!("switch: unknown container `{container}`")))?;
            let ok = match (h.role, to_role) {
                (Role::Worker, Role::Server) => h.input.is_empty(),
                (Role::Server, Role::Worker) => h.model.is_empty(),
                _ => false,
            };
            if !ok {
                return Err(fail(format!(
                    "switch `{container}` from {:?} to {to_role:?} holding {} input and {} model blocks",
                    h.role,
                    h.input.len(),
                    h.model.len()
                )));
            }
            h.role = *to_role;
        }
        Operation::Move {
            table,
            blocks,
            from,
            to,
        } => {
            if blocks.is_empty() || from == to {
                return Err(fail(format!("move from `{from}` to `{to}` of no block")));
            }
            match c.containers.get(to) {
                Some(h) if h.role != Role::Idle => {}
                Some(_) => return Err(fail(format!("move into `{to}`, which runs no role yet"))),
                None => return Err(fail(format!("move into unknown container `{to}`"))),
            }
            let src = c
                .containers
                .get_mut(from)
                .ok_or_else(|| fail(format!("move from unknown container `{from}`")))?;
            for b in blocks {
                if !src.table_mut(*table).remove(b) {
                    return Err(fail(format!("`{from}` does not own {table:?} block {b}")));
                }
            }
            let dst = c
                .containers
                .get_mut(to)
                .ok_or_else(|| fail(format!("move into unknown container `{to}`")))?;
            dst.table_mut(*table).extend(blocks.iter().copied());
        }
    }
    Ok(())
}
