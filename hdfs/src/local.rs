//! The local-file backend: the same operations as WebHDFS, with HDFS
//! semantics where they differ from POSIX (create makes parents, rename into
//! an existing directory, delete of a missing path returns `false`).

use std::io::SeekFrom;
use std::path::Path;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{HdfsError, Result};
use crate::fs::{FileStatus, is_hidden};

/// Local files. Stateless; every call goes to `tokio::fs`.
#[derive(Debug, Clone, Default)]
pub struct LocalFs;

impl LocalFs {
    /// Status of one path; `uri` is echoed into [`FileStatus::uri`].
    pub async fn status(&self, path: &Path, uri: &str) -> Result<FileStatus> {
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| HdfsError::io("status", path, e))?;
        Ok(status_from_meta(&meta, uri, path))
    }

    /// The visible children of a directory (sorted by name), or the file itself.
    pub async fn list(&self, path: &Path, uri: &str) -> Result<Vec<FileStatus>> {
        let st = self.status(path, uri).await?;
        if !st.is_dir {
            return Ok(vec![st]);
        }
        let mut rd = tokio::fs::read_dir(path)
            .await
            .map_err(|e| HdfsError::io("list", path, e))?;
        let mut out = Vec::new();
        while let Some(entry) = rd
            .next_entry()
            .await
            .map_err(|e| HdfsError::io("list", path, e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_hidden(&name) {
                continue;
            }
            let child = entry.path();
            let meta = match tokio::fs::metadata(&child).await {
                Ok(m) => m,
                // Removed between read_dir and stat, or a dangling symlink.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(HdfsError::io("list", child, e)),
            };
            let child_uri = join_uri(uri, &name);
            out.push(status_from_meta(&meta, &child_uri, &child));
        }
        out.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(out)
    }

    /// Up to `len` bytes from `offset`; fewer at the end of the file.
    pub async fn read_range(&self, path: &Path, offset: u64, len: u64) -> Result<Bytes> {
        let err = |e| HdfsError::io("read_range", path, e);
        let mut f = tokio::fs::File::open(path).await.map_err(err)?;
        let meta = f.metadata().await.map_err(err)?;
        if meta.is_dir() {
            return Err(HdfsError::InvalidOperation {
                op: "read_range",
                uri: path.display().to_string(),
                reason: "is a directory".into(),
            });
        }
        let avail = meta.len().saturating_sub(offset).min(len);
        let cap = usize::try_from(avail).map_err(|_| HdfsError::InvalidOperation {
            op: "read_range",
            uri: path.display().to_string(),
            reason: format!("range of {avail} bytes does not fit in memory"),
        })?;
        f.seek(SeekFrom::Start(offset)).await.map_err(err)?;
        let mut buf = Vec::with_capacity(cap);
        (&mut f)
            .take(avail)
            .read_to_end(&mut buf)
            .await
            .map_err(err)?;
        Ok(Bytes::from(buf))
    }

    /// Writes a whole file, making parent directories.
    pub async fn create(&self, path: &Path, data: &[u8], overwrite: bool) -> Result<()> {
        let err = |e| HdfsError::io("create", path, e);
        if let Ok(meta) = tokio::fs::metadata(path).await {
            if meta.is_dir() {
                return Err(HdfsError::InvalidOperation {
                    op: "create",
                    uri: path.display().to_string(),
                    reason: "is a directory".into(),
                });
            }
            if !overwrite {
                return Err(HdfsError::AlreadyExists {
                    op: "create",
                    uri: path.display().to_string(),
                    detail: String::new(),
                });
            }
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent).await.map_err(err)?;
        }
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .await
            .map_err(err)?;
        f.write_all(data).await.map_err(err)?;
        f.flush().await.map_err(err)?;
        Ok(())
    }

    /// Appends to an existing file.
    pub async fn append(&self, path: &Path, data: &[u8]) -> Result<()> {
        let err = |e| HdfsError::io("append", path, e);
        let mut f = tokio::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .await
            .map_err(err)?;
        f.write_all(data).await.map_err(err)?;
        f.flush().await.map_err(err)?;
        Ok(())
    }

    /// Creates a directory and its parents; fine if it exists.
    pub async fn mkdirs(&self, path: &Path) -> Result<()> {
        tokio::fs::create_dir_all(path).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists
                || e.kind() == std::io::ErrorKind::NotADirectory
            {
                HdfsError::InvalidOperation {
                    op: "mkdirs",
                    uri: path.display().to_string(),
                    reason: "a file is in the way".into(),
                }
            } else {
                HdfsError::io("mkdirs", path, e)
            }
        })
    }

    /// Renames with HDFS semantics: into `dst` if it is an existing directory;
    /// fails if the source is missing, the destination file exists or the
    /// destination's parent is missing.
    pub async fn rename(&self, src: &Path, dst: &Path) -> Result<()> {
        let fail = |reason: String| HdfsError::InvalidOperation {
            op: "rename",
            uri: format!("{} -> {}", src.display(), dst.display()),
            reason,
        };
        if tokio::fs::symlink_metadata(src).await.is_err() {
            return Err(HdfsError::NotFound {
                op: "rename",
                uri: src.display().to_string(),
                detail: String::new(),
            });
        }
        let mut target = dst.to_path_buf();
        if let Ok(meta) = tokio::fs::metadata(dst).await {
            if meta.is_dir() {
                let Some(name) = src.file_name() else {
                    return Err(fail("source has no file name".into()));
                };
                target = dst.join(name);
                if tokio::fs::symlink_metadata(&target).await.is_ok() {
                    return Err(fail(format!("{} already exists", target.display())));
                }
            } else {
                return Err(fail("destination already exists".into()));
            }
        }
        if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty())
            && !tokio::fs::metadata(parent)
                .await
                .map(|m| m.is_dir())
                .unwrap_or(false)
        {
            return Err(fail("destination's parent directory does not exist".into()));
        }
        tokio::fs::rename(src, &target)
            .await
            .map_err(|e| HdfsError::io("rename", src, e))
    }

    /// Deletes a file or directory. `Ok(false)` if it did not exist.
    pub async fn delete(&self, path: &Path, recursive: bool) -> Result<bool> {
        let meta = match tokio::fs::symlink_metadata(path).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(HdfsError::io("delete", path, e)),
        };
        let res = if meta.is_dir() {
            if recursive {
                tokio::fs::remove_dir_all(path).await
            } else {
                tokio::fs::remove_dir(path).await.map_err(|e| {
                    if e.kind() == std::io::ErrorKind::DirectoryNotEmpty {
                        std::io::Error::new(
                            e.kind(),
                            "directory is not empty (use recursive delete)",
                        )
                    } else {
                        e
                    }
                })
            }
        } else {
            tokio::fs::remove_file(path).await
        };
        res.map_err(|e| HdfsError::io("delete", path, e))?;
        Ok(true)
    }
}

fn status_from_meta(meta: &std::fs::Metadata, uri: &str, path: &Path) -> FileStatus {
    use std::os::unix::fs::PermissionsExt;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    FileStatus {
        uri: uri.to_string(),
        path: path.display().to_string(),
        len: if meta.is_dir() { 0 } else { meta.len() },
        is_dir: meta.is_dir(),
        modification_time: mtime,
        permission: (meta.permissions().mode() & 0o7777) as u16,
        owner: String::new(),
        group: String::new(),
        replication: if meta.is_dir() { 0 } else { 1 },
        block_size: 0,
    }
}

/// Joins a child name onto a URI or path string.
pub(crate) fn join_uri(uri: &str, name: &str) -> String {
    if uri.ends_with('/') {
        format!("{uri}{name}")
    } else {
        format!("{uri}/{name}")
    }
}
