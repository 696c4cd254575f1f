//! WebHDFS client, Hadoop configuration discovery and input splits (work in progress:
//! a placeholder for the split type while the crate is built on its branch).

use serde::{Deserialize, Serialize};

/// A byte range of one input file; the records that start inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The file.
    pub uri: String,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}
