//! The cruise-rs application master and the `cruise` command line.
//!
//! - [`am`]: the AM: job setup ([`am::run_job`]) and the job's event loop,
//!   the control-channel acceptor, and the types it reports (summary,
//!   progress, status).
//! - [`status`]: the status port: the web UI, `/status`, `/history`,
//!   `/metrics`, container logs.
//! - [`ui`]: the pages of the web UI and of `cruise report`, and their SVG
//!   charts; [`exposition`]: the Prometheus metrics.
//! - [`datagen`]: input preparation (generated data cached in the work dir).
//! - [`cli`]: argument definitions and commands of `cruise`.
//! - [`progress`]: drawing progress on stderr.
//! - [`whatif`]: `cruise plan`, the optimizer as a what-if tool.
//! - [`harness`]: an in-process cluster (AM and evaluators in one process)
//!   with fault verbs, for tests.
//! - [`runtime`]: building the resource manager `runtime.kind` names
//!   (local, YARN, Mesos) and the cluster settings it needs.
//! - [`yarn_app`]: the AM as a YARN application (`submit`, `appmaster`,
//!   `status`, `kill`, `logs`).
//! - [`tarball`]: the tar writer `submit` packs the binary with.

pub mod am;
pub mod cli;
pub mod datagen;
pub mod exposition;
pub mod harness;
pub mod progress;
pub mod runtime;
pub mod status;
pub mod tarball;
pub mod ui;
pub mod whatif;
pub mod yarn_app;
