//! [`FileSystem`]: one handle for every location the job reads or writes.
//!
//! Each call parses its URI ([`Location`]) and dispatches to a backend: local
//! files ([`LocalFs`]) or a WebHDFS client ([`WebHdfsClient`]) for the
//! namenode(s) the URI's authority resolves to through the Hadoop
//! configuration. WebHDFS clients are created on first use and cached per
//! authority, so a `FileSystem` is cheap to clone and share across tasks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::conf::HadoopConf;
use crate::error::{HdfsError, Result};
use crate::local::{LocalFs, join_uri};
use crate::location::{Location, Scheme};
use crate::webhdfs::{WebHdfsClient, WebHdfsOptions};

/// What a file system says about one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStatus {
    /// The URI (or plain path) naming this entry, in the same form as the URI
    /// it was listed under; pass it back to [`FileSystem`] methods.
    pub uri: String,
    /// The path inside its file system (absolute for remote entries).
    pub path: String,
    /// Length in bytes (0 for directories).
    pub len: u64,
    /// Whether this is a directory.
    pub is_dir: bool,
    /// Last modification, milliseconds since the Unix epoch.
    pub modification_time: u64,
    /// Permission bits (e.g. `0o644`).
    pub permission: u16,
    /// Owner (empty for local files).
    pub owner: String,
    /// Group (empty for local files).
    pub group: String,
    /// Replication factor (0 for directories, 1 for local files).
    pub replication: u16,
    /// Block size in bytes (0 when unknown or a directory).
    pub block_size: u64,
}

impl FileStatus {
    /// The last component of the path.
    pub fn name(&self) -> &str {
        let p = self.path.trim_end_matches('/');
        p.rsplit('/').next().unwrap_or(p)
    }
}

/// Hadoop's hidden-file rule for input listing: names starting with `_` or `.`.
pub fn is_hidden(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('.')
}

/// A backend chosen for one call.
#[derive(Debug, Clone)]
enum Backend {
    Local(LocalFs, PathBuf),
    WebHdfs(WebHdfsClient, String),
}

/// Shared state behind a [`FileSystem`].
#[derive(Debug)]
struct Inner {
    conf: HadoopConf,
    options: WebHdfsOptions,
    /// WebHDFS clients per (scheme, authority); created on first use.
    clients: Mutex<HashMap<(Scheme, String), WebHdfsClient>>,
}

/// A cheaply cloneable handle to local files and WebHDFS file systems.
#[derive(Debug, Clone)]
pub struct FileSystem {
    inner: Arc<Inner>,
}

impl Default for FileSystem {
    /// No Hadoop configuration (so `hdfs://host:port` resolves to
    /// `http://host:9870` and nameservices are unknown); the user from
    /// `$HADOOP_USER_NAME` or the OS user. Use [`FileSystem::from_env`] to
    /// read `$HADOOP_CONF_DIR`.
    fn default() -> Self {
        FileSystem::new(HadoopConf::default(), WebHdfsOptions::from_env())
    }
}

impl FileSystem {
    /// A file system resolving `hdfs://` URIs with `conf` and talking WebHDFS
    /// with `options`.
    pub fn new(conf: HadoopConf, options: WebHdfsOptions) -> Self {
        FileSystem {
            inner: Arc::new(Inner {
                conf,
                options,
                clients: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A file system configured from the environment: the Hadoop configuration
    /// in `$HADOOP_CONF_DIR` when set (see [`HadoopConf::from_env`]) and the
    /// user from `$HADOOP_USER_NAME` or the OS user.
    pub fn from_env() -> Result<Self> {
        let conf = HadoopConf::from_env()?;
        Ok(FileSystem::new(conf, WebHdfsOptions::from_env()))
    }

    /// The Hadoop configuration in use.
    pub fn conf(&self) -> &HadoopConf {
        &self.inner.conf
    }

    /// The WebHDFS client serving a remote location's authority.
    fn client_for(&self, scheme: &Scheme, authority: &str) -> Result<WebHdfsClient> {
        let key = (scheme.clone(), authority.to_string());
        {
            let clients = self
                .inner
                .clients
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(c) = clients.get(&key) {
                return Ok(c.clone());
            }
        }
        let namenodes = self.inner.conf.namenode_http_addresses(scheme, authority)?;
        let client = WebHdfsClient::new(namenodes, self.inner.options.clone())?;
        let mut clients = self
            .inner
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(clients.entry(key).or_insert(client).clone())
    }

    fn backend(&self, uri: &str) -> Result<Backend> {
        match Location::parse(uri)? {
            Location::Local { path } => Ok(Backend::Local(LocalFs, path)),
            Location::Remote {
                scheme,
                authority,
                path,
            } => Ok(Backend::WebHdfs(
                self.client_for(&scheme, &authority)?,
                path,
            )),
        }
    }

    /// The status of one path.
    pub async fn status(&self, uri: &str) -> Result<FileStatus> {
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.status(&path, uri).await,
            Backend::WebHdfs(c, path) => Ok(with_uri(c.get_file_status(&path).await?, uri)),
        }
    }

    /// The visible entries of a directory (names starting with `_` or `.` are
    /// skipped, as Hadoop's input formats do), sorted by name; or the file
    /// itself when `uri` names a file. Not recursive.
    pub async fn list(&self, uri: &str) -> Result<Vec<FileStatus>> {
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.list(&path, uri).await,
            Backend::WebHdfs(c, path) => {
                let entries = c.list_status(&path).await?;
                // A file lists as itself with an empty suffix.
                if let [only] = entries.as_slice()
                    && only.suffix.is_empty()
                {
                    return Ok(vec![with_uri(only.status.clone(), uri)]);
                }
                let mut out: Vec<FileStatus> = entries
                    .into_iter()
                    .filter(|e| !is_hidden(&e.suffix))
                    .map(|e| {
                        let child = join_uri(uri, &e.suffix);
                        with_uri(e.status, &child)
                    })
                    .collect();
                out.sort_by(|a, b| a.name().cmp(b.name()));
                Ok(out)
            }
        }
    }

    /// Up to `len` bytes starting at `offset`; fewer at the end of the file,
    /// none at or past it (a datanode's `EOFException` is mapped to empty).
    pub async fn read_range(&self, uri: &str, offset: u64, len: u64) -> Result<Bytes> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.read_range(&path, offset, len).await,
            Backend::WebHdfs(c, path) => match c.open(&path, offset, Some(len)).await {
                // Datanodes refuse to seek past the end; the local backend
                // returns nothing there, and so does this.
                Err(e) if e.remote_exception() == Some("EOFException") => Ok(Bytes::new()),
                other => other,
            },
        }
    }

    /// Writes a whole file (creating parent directories). Fails with an
    /// "already exists" error when the file exists and `overwrite` is false.
    pub async fn create(&self, uri: &str, data: Bytes, overwrite: bool) -> Result<()> {
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.create(&path, &data, overwrite).await,
            Backend::WebHdfs(c, path) => c.create(&path, data, overwrite).await,
        }
    }

    /// Appends to an existing file.
    pub async fn append(&self, uri: &str, data: Bytes) -> Result<()> {
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.append(&path, &data).await,
            Backend::WebHdfs(c, path) => c.append(&path, data).await,
        }
    }

    /// Creates a directory and any missing parents; succeeds if it exists.
    pub async fn mkdirs(&self, uri: &str) -> Result<()> {
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.mkdirs(&path).await,
            Backend::WebHdfs(c, path) => c.mkdirs(&path).await,
        }
    }

    /// Renames `src` to `dst` (both on the same file system). When `dst` is an
    /// existing directory, `src` moves inside it (HDFS semantics). Fails when
    /// the source is missing, the destination exists as a file, or the
    /// destination's parent is missing.
    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        match (self.backend(src)?, Location::parse(dst)?) {
            (Backend::Local(fs, s), Location::Local { path: d }) => fs.rename(&s, &d).await,
            (
                Backend::WebHdfs(c, s),
                Location::Remote {
                    scheme,
                    authority,
                    path: d,
                },
            ) if Location::parse(src).is_ok_and(|l| {
                matches!(l, Location::Remote { scheme: ref s2, authority: ref a2, .. }
                    if *s2 == scheme && *a2 == authority)
            }) =>
            {
                c.rename(&s, &d).await
            }
            _ => Err(HdfsError::InvalidOperation {
                op: "rename",
                uri: format!("{src} -> {dst}"),
                reason: "source and destination are on different file systems".into(),
            }),
        }
    }

    /// Deletes a file, or a directory (non-empty ones only with `recursive`).
    /// Returns `false` when the path did not exist.
    pub async fn delete(&self, uri: &str, recursive: bool) -> Result<bool> {
        match self.backend(uri)? {
            Backend::Local(fs, path) => fs.delete(&path, recursive).await,
            Backend::WebHdfs(c, path) => c.delete(&path, recursive).await,
        }
    }
}

fn with_uri(mut st: FileStatus, uri: &str) -> FileStatus {
    st.uri = uri.to_string();
    st
}
