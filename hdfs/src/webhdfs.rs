//! WebHDFS client (placeholder until the client lands).

use bytes::Bytes;

use crate::error::{HdfsError, Result};
use crate::fs::FileStatus;

/// Options of the WebHDFS client.
#[derive(Debug, Clone, Default)]
pub struct WebHdfsOptions {}

impl WebHdfsOptions {
    /// Options from the environment.
    pub fn from_env() -> Self {
        WebHdfsOptions {}
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone)]
pub struct ListEntry {
    /// The child's name (empty when the listed path is a file).
    pub suffix: String,
    /// Its status.
    pub status: FileStatus,
}

/// A WebHDFS client.
#[derive(Debug, Clone)]
pub struct WebHdfsClient {}

fn todo(op: &'static str, path: &str) -> HdfsError {
    HdfsError::InvalidOperation {
        op,
        uri: path.to_string(),
        reason: "the WebHDFS client is not implemented yet".into(),
    }
}

impl WebHdfsClient {
    /// A client for the given namenodes.
    pub fn new(_namenodes: Vec<String>, _options: WebHdfsOptions) -> Result<Self> {
        Ok(WebHdfsClient {})
    }
    /// GETFILESTATUS.
    pub async fn get_file_status(&self, path: &str) -> Result<FileStatus> {
        Err(todo("status", path))
    }
    /// LISTSTATUS.
    pub async fn list_status(&self, path: &str) -> Result<Vec<ListEntry>> {
        Err(todo("list", path))
    }
    /// OPEN.
    pub async fn open(&self, path: &str, _offset: u64, _len: Option<u64>) -> Result<Bytes> {
        Err(todo("read_range", path))
    }
    /// CREATE.
    pub async fn create(&self, path: &str, _data: Bytes, _overwrite: bool) -> Result<()> {
        Err(todo("create", path))
    }
    /// APPEND.
    pub async fn append(&self, path: &str, _data: Bytes) -> Result<()> {
        Err(todo("append", path))
    }
    /// MKDIRS.
    pub async fn mkdirs(&self, path: &str) -> Result<()> {
        Err(todo("mkdirs", path))
    }
    /// RENAME.
    pub async fn rename(&self, src: &str, _dst: &str) -> Result<()> {
        Err(todo("rename", src))
    }
    /// DELETE.
    pub async fn delete(&self, path: &str, _recursive: bool) -> Result<bool> {
        Err(todo("delete", path))
    }
}
