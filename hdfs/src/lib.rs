//! File-system layer of cruise-rs: where input comes from and output goes.
//!
//! - [`location`]: parsing `hdfs://`, `webhdfs://`, `file://` URIs and plain paths.
//! - [`fs`]: [`FileSystem`], one cheaply cloneable handle that dispatches each
//!   call to the local backend ([`local`]) or a WebHDFS client ([`webhdfs`]).
//! - [`conf`]: Hadoop `core-site.xml`/`hdfs-site.xml` discovery and namenode
//!   address resolution (HA nameservices included).
//! - [`split`]: planning byte-range input splits and reading the whole
//!   newline-delimited records that start in a split.
//! - [`error`]: [`HdfsError`], the crate's error type.

pub mod conf;
pub mod error;
pub mod fs;
pub mod local;
pub mod location;
pub mod split;
pub mod webhdfs;

pub use conf::HadoopConf;
pub use error::{HdfsError, Result};
pub use fs::{FileStatus, FileSystem, is_hidden};
pub use local::LocalFs;
pub use location::{Location, Scheme};
pub use split::{
    Split, SplitData, line_number_at, plan_splits, read_split, read_split_with_read_ahead,
};
pub use webhdfs::{WebHdfsClient, WebHdfsOptions};
