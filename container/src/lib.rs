//! The cruise-rs evaluator.
//!
//! One evaluator process runs in each container. It connects to the AM,
//! proves it knows the job secret, registers, and from then on does what the
//! AM tells it: load input blocks, become a worker or a server, move blocks,
//! stop. It is reused across tasks: switching role never restarts it.
//!
//! Layout:
//! - [`protocol`]: frames, handshake and messages shared with the AM.
//! - [`store`]: the elastic store (tables, blocks, ownership, migration).
//! - [`peer`]: the data plane (evaluator ⇄ evaluator connections).
//! - [`ps`]: parameter-server roles (the worker loop, server metrics).
//! - [`apps`]: the ML applications and their data generators.
//! - [`checkpoint`]: checkpoints on the job's file system (blocks, manifest).
//! - [`evaluator`]: the evaluator's event loop and process entry point.
//! - [`emulate`]: in-process throttling of an emulated slower container.
//! - [`input_fs`]: the file system input is read through (`[hdfs]`).

pub mod apps;
pub mod checkpoint;
pub mod emulate;
pub mod evaluator;
pub mod input_fs;
pub mod os;
pub mod ownership;
pub mod peer;
pub mod protocol;
pub mod ps;
pub mod store;
