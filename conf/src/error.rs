//! Configuration errors. Every variant names the key or input at fault.

use std::path::PathBuf;

/// An error building or checking a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML.
    #[error("configuration file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A key that the configuration does not have.
    #[error("unknown configuration key `{key}` in {origin}{}", suggestion_text(.suggestion))]
    UnknownKey {
        /// The dotted key, e.g. `job.epoch`.
        key: String,
        /// Where it came from: a file, an environment variable or a flag.
        origin: String,
        /// The closest known key, if any is close.
        suggestion: Option<String>,
    },
    /// A flag override was not of the form `key=value`.
    #[error("malformed override {text:?}: expected KEY=VALUE, e.g. job.epochs=3")]
    Override {
        /// The text given.
        text: String,
    },
    /// A value has the wrong type or cannot be parsed.
    #[error("bad configuration value: {message}")]
    Value {
        /// The deserializer's message, naming the key and its origin.
        message: String,
    },
    /// A value is well-typed but not acceptable.
    #[error("invalid configuration: `{key}` {reason}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// Why it is rejected.
        reason: String,
    },
}

fn suggestion_text(s: &Option<String>) -> String {
    match s {
        Some(k) => format!(" (did you mean `{k}`?)"),
        None => String::new(),
    }
}
