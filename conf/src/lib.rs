//! Typed configuration for cruise-rs.
//!
//! This crate owns the *shape* of a job's configuration and the rules for
//! building it from layers, lowest first:
//!
//! 1. built-in defaults ([`CruiseConfig::default`]),
//! 2. a TOML file (`--config FILE`),
//! 3. the environment: `CRUISE_<SECTION>__<KEY>` (double underscore between the
//!    section and the key, e.g. `CRUISE_JOB__EPOCHS=3`),
//! 4. command-line flags (passed in as `key = value` overrides).
//!
//! Unknown keys are rejected in every layer with an error that names the key and
//! where it came from (file, variable or flag) and suggests the closest known key.
//! Values are then checked as a whole by [`CruiseConfig::validate`].
//!
//! The environment is passed in as a map so loading is testable; nothing here
//! reads process-global state except [`Layers::from_process_env`].
//!
//! `conf/examples/local.toml` documents every key; a test keeps it complete.

mod error;
mod load;
mod model;

pub use error::ConfError;
pub use load::{Layers, known_keys, load_file};
pub use model::*;
