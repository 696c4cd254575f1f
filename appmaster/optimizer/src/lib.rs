//! # cruise-optimizer
//!
//! The Cruise optimizer as a pure, deterministic library: it predicts the epoch time of
//! a parameter-server job for any configuration, finds the best one, turns the change
//! into a plan of elastic-runtime operations, runs plans, and decides when a
//! reconfiguration is worth it. It depends on no other cruise crate; the AM feeds it
//! measurements and carries out its operations.
//!
//! ## Tour
//!
//! | module | owns |
//! |---|---|
//! | [`snapshot`] | the inputs: [`Snapshot`] = [`Job`] + per-container [`ContainerMetrics`] + optional pairwise [`Link`]s (serde, JSON) |
//! | [`cost`] | the cost model (Cruise Eq. 1–4 with push traffic and server time): [`CostModel::evaluate`] → [`Breakdown`] |
//! | [`solver`] | [`solve_homogeneous`] (Eq. 5 closed form, every split), [`solve_for_roles`], [`solve`] (exact branch and bound up to 10 containers, local search above) |
//! | [`plan`] | [`Configuration`] (who owns which block), [`Plan::between`] → a DAG of [`Operation`]s |
//! | [`executor`] | [`PlanExecutor`]: runs a plan through an [`OperationRunner`] with bounded parallelism, failure skipping and cancellation |
//! | [`trigger`] | [`TriggerPolicy::decide`] → [`Decision`] (wait, stay, reconfigure), and the learned [`ReconfigCostModel`] |
//! | [`error`] | [`OptimizerError`] |
//!
//! ## Flow in the AM
//!
//! ```text
//! metrics ─► Snapshot ─► TriggerPolicy::decide(snapshot, ownership) ─► Decision
//!                                                          │ Reconfigure(proposal)
//!                                                          ▼
//!            PlanExecutor::execute(plan, runner, cancel) ─► ExecutionReport
//!                 ├─ report.resulting_configuration(plan, before)  (new ownership)
//!                 └─ policy.observe(plan, report, job)             (learn op costs)
//! ```
//!
//! ## Example
//!
//! ```
//! use cruise_optimizer::{solve_homogeneous, Job, Uniform};
//!
//! let job = Job {
//!     total_records: 1_000_000, mini_batch_size: 1_000,
//!     bytes_per_mini_batch: 8.0e6, link_bytes_per_mini_batch: Some(4.0e6),
//!     input_blocks: 256, model_blocks: 64,
//!     remaining_epochs: 50.0, input_bytes: 0, model_bytes: 0,
//!     serial_fraction: 1.0, latency_secs_per_mini_batch: 0.0, asynchronous: false,
//!     measured_epoch_secs: None, queued_fit: None,
//! };
//! let u = Uniform {
//!     compute_secs_per_record: 1e-4,
//!     bandwidth_bytes_per_sec: 1.25e8,
//!     server_secs_per_byte: 1e-9,
//!     request_secs_per_server: 2e-5,
//!     server_secs_per_mini_batch: 1e-5,
//! };
//! let h = solve_homogeneous(&job, 32, &u).unwrap();
//! assert_eq!(h.splits.len(), 31);
//! assert!(h.splits.iter().all(|s| s.epoch_secs >= h.best.epoch_secs));
//! ```
//!
//! ## Snapshot JSON
//!
//! ```json
//! {
//!   "job": {
//!     "total_records": 100000, "mini_batch_size": 1000,
//!     "bytes_per_mini_batch": 4000000.0, "link_bytes_per_mini_batch": 2000000.0,
//!     "input_blocks": 8, "model_blocks": 4, "remaining_epochs": 20.0,
//!     "input_bytes": 800000000, "model_bytes": 40000000
//!   },
//!   "containers": [
//!     {"id": "e1", "role": "worker", "compute_secs_per_record": 0.0001,
//!      "request_secs_per_server": 0.00002,
//!      "bandwidth_bytes_per_sec": 1.25e8, "input_blocks": 8, "mini_batches": 30},
//!     {"id": "e3", "role": "server", "bandwidth_bytes_per_sec": 1.25e8,
//!      "server_secs_per_byte": 1e-9, "cpu_speed": 1.0, "model_blocks": 4},
//!     {"id": "e4", "role": "idle", "bandwidth_bytes_per_sec": 6.25e8, "cpu_speed": 4.0,
//!      "reclaimed": false}
//!   ],
//!   "links": [{"from": "e1", "to": "e3", "bytes_per_sec": 1.0e8}]
//! }
//! ```
//!
//! Optional per container: `compute_secs_per_record`, `cpu_speed`,
//! `server_secs_per_byte`, `server_secs_per_mini_batch` and
//! `request_secs_per_server` (each estimated from the others via `cpu_speed` when absent),
//! `input_blocks`, `model_blocks`, `mini_batches` (default 0), `reclaimed` (default
//! false). `links` and the job's `input_bytes`/`model_bytes`, `serial_fraction`
//! (default 1: computation and communication add up, as in Cruise) and
//! `latency_secs_per_mini_batch` (default 0) are optional, and so is
//! `queued_fit` (`{"latency_secs_per_mini_batch", "serial_fraction"}`: the
//! pair an asynchronous job's throughput prices with; default: the job's
//! own). Unknown fields are rejected. Parse with [`Snapshot::from_json`].
//!
//! ## What differs from the original Cruise
//!
//! * Bandwidth is measured per container and optionally per pair, not read from a file.
//! * Push traffic is part of the bytes per mini-batch, and a server's processing time
//!   (per byte, and per worker's mini-batch for the requests themselves) bounds it
//!   apart from its link: the slower of the two, not their sum.
//! * An asynchronous job's epoch is the data set over the workers' summed
//!   throughput, each worker's answers waiting behind the others' requests
//!   at the servers (approximate mean value analysis; a worker whose own
//!   link is slower than a server's answer takes only its link's share of
//!   that server, [`Breakdown::throughput_epoch_secs`]); the trigger prices the running
//!   configuration by it, requires of a target a gain at the solvers' upper
//!   bound of it, and ranks by it the targets that bound puts within
//!   `min_gain` of each other (the solvers break their ties by it). Each
//!   view has its own measured latency and overlap ([`Job::queued_fit`]):
//!   what one explains of the running configuration's waits, the other
//!   does not.
//! * Computation and communication may overlap (workers that pull ahead): a worker's
//!   epoch is `max(comp, comm) + f · min(comp, comm)` with `f` measured (`f = 1` is
//!   Cruise's sum), and measured round-trip latency is part of the communication.
//! * The heterogeneous solver is pure Rust (no external MILP solver): an exact branch
//!   and bound up to 10 containers, a local search above; tests check it against brute
//!   force and against an exact MILP.
//! * Plans have a failure path: a failed operation skips its dependents only, and the
//!   report gives the consistent configuration the job is left in.

pub mod cost;
pub mod error;
pub mod executor;
pub mod nearby;
pub mod plan;
pub mod reconfig_cost;
pub mod snapshot;
pub mod solver;
pub mod trigger;

pub use cost::{Bottleneck, Breakdown, CommBound, CostModel, Placement, Target, WorkerCost};
pub use error::OptimizerError;
pub use executor::{
    ExecutionReport, ExecutorConfig, ExecutorError, OpError, OpOutcome, OpReport, OperationRunner,
    PlanExecutor, PlanTracker, SkipReason,
};
pub use plan::{Configuration, Holding, OpKind, Operation, Plan, PlannedOp, Table};
pub use snapshot::{ContainerMetrics, Job, Link, Role, Snapshot, WaitFit, expected_draw};
pub use solver::{
    HomogeneousSolution, SearchOptions, Solution, Split, Uniform, solve, solve_for_roles,
    solve_for_roles_within, solve_heterogeneous, solve_heterogeneous_with, solve_homogeneous,
};
pub use trigger::{
    Decision, Looks, MeasuredSplit, OpCost, OpCostEstimate, PolicyState, Proposal,
    ReconfigCostModel, STRAGGLER_FACTOR, SplitIds, TriggerConfig, TriggerPolicy,
};
