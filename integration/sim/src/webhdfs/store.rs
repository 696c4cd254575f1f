//! The simulated namespace: a local directory with HDFS semantics.
//!
//! Owns the directory under `--root` and the owners of the entries the
//! simulator created (kept in memory; other entries report `--default-owner`).
//! Namespace changes take one lock so that check-then-act sequences (create
//! without overwrite, rename into a directory) are atomic with respect to
//! each other. Permissions are the real file mode bits.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::UNIX_EPOCH;

use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::RemoteException;

/// Hadoop's root inode id.
const ROOT_INODE: u64 = 16385;
/// Block size reported for files (dfs.blocksize default).
pub const BLOCK_SIZE: u64 = 134_217_728;
/// Group reported for every entry.
const GROUP: &str = "supergroup";

type R<T> = Result<T, RemoteException>;

/// The directory-backed namespace.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    default_owner: String,
    /// Owner of each path the simulator created.
    owners: std::sync::Mutex<HashMap<String, String>>,
    /// Serialises namespace changes.
    ns: Mutex<()>,
}

fn io_err(path: &str, e: std::io::Error) -> RemoteException {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            RemoteException::file_not_found(format!("File does not exist: {path}"))
        }
        _ => RemoteException::io(format!("{path}: {e}")),
    }
}

fn millis(t: std::io::Result<std::time::SystemTime>) -> u64 {
    t.ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

fn parent_of(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or("")
}

impl Store {
    pub fn new(root: PathBuf, default_owner: String) -> Self {
        Store {
            root,
            default_owner,
            owners: std::sync::Mutex::new(HashMap::new()),
            ns: Mutex::new(()),
        }
    }

    /// The local path of a file-system path (already validated by the parser).
    pub fn local(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn owner_of(&self, path: &str) -> String {
        self.owners()
            .get(path)
            .cloned()
            .unwrap_or_else(|| self.default_owner.clone())
    }

    fn set_owner(&self, path: &str, owner: &str) {
        self.owners().insert(path.to_string(), owner.to_string());
    }

    /// Moves or drops the owner entries at and under `from`.
    fn move_owners(&self, from: &str, to: Option<&str>) {
        let mut owners = self.owners();
        let prefix = format!("{from}/");
        let keys: Vec<String> = owners
            .keys()
            .filter(|k| *k == from || k.starts_with(&prefix))
            .cloned()
            .collect();
        for k in keys {
            if let (Some(v), Some(to)) = (owners.remove(&k), to) {
                owners.insert(format!("{to}{}", &k[from.len()..]), v);
            }
        }
    }

    async fn metadata(&self, path: &str) -> R<Option<std::fs::Metadata>> {
        match tokio::fs::metadata(self.local(path)).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            // A file in the middle of the path: HDFS says the path does not exist.
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Ok(None),
            Err(e) => Err(io_err(path, e)),
        }
    }

    /// The `FileStatus` JSON object of `path` with the given `pathSuffix`.
    async fn status_json(&self, path: &str, suffix: &str, m: &std::fs::Metadata) -> Value {
        let is_dir = m.is_dir();
        let children = if is_dir {
            match std::fs::read_dir(self.local(path)) {
                Ok(rd) => rd.count(),
                Err(_) => 0,
            }
        } else {
            0
        };
        json!({
            "accessTime": if is_dir { 0 } else { millis(m.accessed()) },
            "blockSize": if is_dir { 0 } else { BLOCK_SIZE },
            "childrenNum": children,
            "fileId": if path == "/" { ROOT_INODE } else { ROOT_INODE + m.ino() },
            "group": GROUP,
            "length": if is_dir { 0 } else { m.len() },
            "modificationTime": millis(m.modified()),
            "owner": self.owner_of(path),
            "pathSuffix": suffix,
            "permission": format!("{:o}", m.permissions().mode() & 0o1777),
            "replication": if is_dir { 0 } else { 1 },
            "storagePolicy": 0,
            "type": if is_dir { "DIRECTORY" } else { "FILE" },
        })
    }

    /// `GETFILESTATUS`.
    pub async fn get_file_status(&self, path: &str) -> R<Value> {
        let m = self.metadata(path).await?.ok_or_else(|| {
            RemoteException::file_not_found(format!("File does not exist: {path}"))
        })?;
        Ok(json!({ "FileStatus": self.status_json(path, "", &m).await }))
    }

    /// The entries of a directory, sorted by name, or the file itself with an
    /// empty suffix.
    pub async fn list(&self, path: &str) -> R<Vec<Value>> {
        let m = self.metadata(path).await?.ok_or_else(|| {
            RemoteException::file_not_found(format!("File {path} does not exist."))
        })?;
        if !m.is_dir() {
            return Ok(vec![self.status_json(path, "", &m).await]);
        }
        let mut names = Vec::new();
        let mut rd = tokio::fs::read_dir(self.local(path))
            .await
            .map_err(|e| io_err(path, e))?;
        while let Some(e) = rd.next_entry().await.map_err(|e| io_err(path, e))? {
            if let Ok(name) = e.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let child = join(path, &name);
            // Skip entries removed since read_dir, or dangling symlinks.
            if let Ok(Some(cm)) = self.metadata(&child).await {
                out.push(self.status_json(&child, &name, &cm).await);
            }
        }
        Ok(out)
    }

    /// `GETCONTENTSUMMARY`.
    pub async fn content_summary(&self, path: &str) -> R<Value> {
        let m = self.metadata(path).await?.ok_or_else(|| {
            RemoteException::file_not_found(format!("File does not exist: {path}"))
        })?;
        let (mut dirs, mut files, mut bytes) = (0u64, 0u64, 0u64);
        if m.is_dir() {
            let mut stack = vec![self.local(path)];
            while let Some(dir) = stack.pop() {
                dirs += 1;
                let rd = std::fs::read_dir(&dir).map_err(|e| io_err(path, e))?;
                for entry in rd.flatten() {
                    match entry.metadata() {
                        Ok(em) if em.is_dir() => stack.push(entry.path()),
                        Ok(em) => {
                            files += 1;
                            bytes += em.len();
                        }
                        Err(_) => {}
                    }
                }
            }
        } else {
            files = 1;
            bytes = m.len();
        }
        Ok(json!({
            "ContentSummary": {
                "directoryCount": dirs,
                "ecPolicy": "",
                "fileCount": files,
                "length": bytes,
                "quota": -1,
                "spaceConsumed": bytes,
                "spaceQuota": -1,
                "typeQuota": {}
            }
        }))
    }

    /// Checks that no existing ancestor of `path` is a file.
    async fn check_ancestors(&self, path: &str) -> R<()> {
        let mut cur = parent_of(path);
        let mut chain = Vec::new();
        while let Some(p) = cur {
            chain.push(p.to_string());
            cur = parent_of(p);
        }
        for p in chain.iter().rev() {
            match self.metadata(p).await? {
                Some(m) if !m.is_dir() => {
                    return Err(RemoteException::parent_not_directory(format!(
                        "{p} (is not a directory)"
                    )));
                }
                Some(_) => {}
                None => break,
            }
        }
        Ok(())
    }

    /// Creates `path` and its missing parents with mode `perm`, owned by `user`.
    async fn make_dirs(&self, path: &str, perm: u32, user: &str) -> R<()> {
        let mut missing = Vec::new();
        let mut cur = Some(path);
        while let Some(p) = cur {
            if self.metadata(p).await?.is_some() {
                break;
            }
            missing.push(p.to_string());
            cur = parent_of(p);
        }
        for p in missing.iter().rev() {
            let local = self.local(p);
            match tokio::fs::create_dir(&local).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(p, e)),
            }
            let _ = tokio::fs::set_permissions(&local, std::fs::Permissions::from_mode(perm)).await;
            self.set_owner(p, user);
        }
        Ok(())
    }

    /// `MKDIRS`: true when the directory exists afterwards.
    pub async fn mkdirs(&self, path: &str, perm: u32, user: &str) -> R<bool> {
        let _ns = self.ns.lock().await;
        self.check_ancestors(path).await?;
        if let Some(m) = self.metadata(path).await? {
            if m.is_dir() {
                return Ok(true);
            }
            return Err(RemoteException::already_exists(format!(
                "Path is not a directory: {path}"
            )));
        }
        self.make_dirs(path, perm, user).await?;
        Ok(true)
    }

    /// `RENAME` with the semantics of `ClientProtocol.rename`: false when the
    /// source is missing, the destination's parent is missing, the
    /// destination exists as a file, or a directory would move under itself.
    pub async fn rename(&self, src: &str, dst: &str) -> R<bool> {
        let _ns = self.ns.lock().await;
        if src == "/" || self.metadata(src).await?.is_none() {
            return Ok(false);
        }
        let mut target = dst.to_string();
        match self.metadata(dst).await? {
            Some(m) if m.is_dir() => {
                target = join(dst, name_of(src));
                if self.metadata(&target).await?.is_some() {
                    return Ok(target == src);
                }
            }
            Some(_) => return Ok(src == dst),
            None => {
                let parent_is_dir = match parent_of(dst) {
                    Some(p) => self.metadata(p).await?.is_some_and(|m| m.is_dir()),
                    None => false,
                };
                if !parent_is_dir {
                    return Ok(false);
                }
            }
        }
        if target == src || target.starts_with(&format!("{src}/")) {
            return Ok(target == src);
        }
        tokio::fs::rename(self.local(src), self.local(&target))
            .await
            .map_err(|e| io_err(src, e))?;
        self.move_owners(src, Some(&target));
        Ok(true)
    }

    /// `RENAME` with `renameoptions` (Hadoop's `rename2`, as the NameNode
    /// answers it): `dst` is the new name itself, never a directory to move
    /// into; an existing `dst` is replaced only with `overwrite`, and only
    /// by the same kind (file or empty directory). Failures are exceptions,
    /// with the NameNode's messages, not `false`.
    pub async fn rename2(&self, src: &str, dst: &str, overwrite: bool) -> R<()> {
        let _ns = self.ns.lock().await;
        let Some(sm) = self.metadata(src).await? else {
            return Err(RemoteException::file_not_found(format!(
                "rename source {src} is not found."
            )));
        };
        if src == dst {
            return Err(RemoteException::already_exists(format!(
                "The source {src} and destination {dst} are the same"
            )));
        }
        if src == "/" || dst.starts_with(&format!("{src}/")) {
            return Err(RemoteException::io(format!(
                "Rename destination {dst} is a directory or file under source {src}"
            )));
        }
        match parent_of(dst) {
            Some(p) => match self.metadata(p).await? {
                None => {
                    return Err(RemoteException::file_not_found(format!(
                        "rename destination parent {dst} not found."
                    )));
                }
                Some(m) if !m.is_dir() => {
                    return Err(RemoteException::parent_not_directory(format!(
                        "rename destination parent {dst} is a file."
                    )));
                }
                Some(_) => {}
            },
            None => {
                return Err(RemoteException::io(format!(
                    "rename destination cannot be the root: {dst}"
                )));
            }
        }
        if let Some(dm) = self.metadata(dst).await? {
            if dm.is_dir() != sm.is_dir() {
                let kind = if sm.is_dir() { "directories" } else { "files" };
                return Err(RemoteException::io(format!(
                    "Source {src} and destination {dst} must both be {kind}"
                )));
            }
            if !overwrite {
                return Err(RemoteException::already_exists(format!(
                    "rename destination {dst} already exists"
                )));
            }
            if dm.is_dir() {
                let mut entries = tokio::fs::read_dir(self.local(dst))
                    .await
                    .map_err(|e| io_err(dst, e))?;
                if entries
                    .next_entry()
                    .await
                    .map_err(|e| io_err(dst, e))?
                    .is_some()
                {
                    return Err(RemoteException::io(format!(
                        "rename destination directory is not empty: {dst}"
                    )));
                }
                tokio::fs::remove_dir(self.local(dst))
                    .await
                    .map_err(|e| io_err(dst, e))?;
            }
            self.move_owners(dst, None);
        }
        tokio::fs::rename(self.local(src), self.local(dst))
            .await
            .map_err(|e| io_err(src, e))?;
        self.move_owners(src, Some(dst));
        Ok(())
    }

    /// `DELETE`: false when missing; a non-empty directory needs `recursive`.
    pub async fn delete(&self, path: &str, recursive: bool) -> R<bool> {
        let _ns = self.ns.lock().await;
        let Some(m) = self.metadata(path).await? else {
            return Ok(false);
        };
        if path == "/" {
            return Ok(false);
        }
        let local = self.local(path);
        if m.is_dir() {
            let empty = std::fs::read_dir(&local)
                .map_err(|e| io_err(path, e))?
                .next()
                .is_none();
            if !empty && !recursive {
                return Err(RemoteException::not_empty(format!(
                    "`{path} is non empty': Directory is not empty"
                )));
            }
            tokio::fs::remove_dir_all(&local)
                .await
                .map_err(|e| io_err(path, e))?;
        } else {
            tokio::fs::remove_file(&local)
                .await
                .map_err(|e| io_err(path, e))?;
        }
        self.move_owners(path, None);
        Ok(true)
    }

    /// `SETPERMISSION`.
    pub async fn set_permission(&self, path: &str, perm: u32) -> R<()> {
        if self.metadata(path).await?.is_none() {
            return Err(RemoteException::file_not_found(format!(
                "File does not exist: {path}"
            )));
        }
        tokio::fs::set_permissions(self.local(path), std::fs::Permissions::from_mode(perm))
            .await
            .map_err(|e| io_err(path, e))
    }

    /// The namenode's check before redirecting `OPEN`: the path is a file.
    /// A missing one gets the NameNode's `OPEN` message (checked against
    /// Hadoop 3.4.2), not `GETFILESTATUS`'s.
    pub async fn check_readable(&self, path: &str) -> R<u64> {
        match self.metadata(path).await? {
            None => Err(RemoteException::file_not_found(format!(
                "File {path} not found."
            ))),
            Some(m) if m.is_dir() => Err(RemoteException::file_not_found(format!(
                "Path is not a file: {path}"
            ))),
            Some(m) => Ok(m.len()),
        }
    }

    /// The namenode's check before redirecting `APPEND`: the path exists.
    pub async fn check_exists(&self, path: &str) -> R<()> {
        match self.metadata(path).await? {
            None => Err(RemoteException::file_not_found(format!(
                "File {path} not found."
            ))),
            Some(_) => Ok(()),
        }
    }

    /// The datanode half of `CREATE`: opens the file for writing.
    pub async fn create(
        &self,
        path: &str,
        overwrite: bool,
        perm: u32,
        user: &str,
    ) -> R<tokio::fs::File> {
        let _ns = self.ns.lock().await;
        if path == "/" {
            return Err(RemoteException::already_exists(
                "/ already exists as a directory",
            ));
        }
        self.check_ancestors(path).await?;
        if let Some(m) = self.metadata(path).await? {
            if m.is_dir() {
                return Err(RemoteException::already_exists(format!(
                    "{path} already exists as a directory"
                )));
            }
            if !overwrite {
                return Err(RemoteException::already_exists(format!(
                    "{path} for client 127.0.0.1 already exists"
                )));
            }
        }
        if let Some(parent) = parent_of(path) {
            self.make_dirs(parent, 0o755, user).await?;
        }
        let local = self.local(path);
        let f = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&local)
            .await
            .map_err(|e| io_err(path, e))?;
        let _ = tokio::fs::set_permissions(&local, std::fs::Permissions::from_mode(perm)).await;
        self.set_owner(path, user);
        Ok(f)
    }

    /// The datanode half of `APPEND`.
    pub async fn open_append(&self, path: &str) -> R<tokio::fs::File> {
        match self.metadata(path).await? {
            None => {
                return Err(RemoteException::file_not_found(format!(
                    "Failed to append to non-existent file {path} for client 127.0.0.1"
                )));
            }
            Some(m) if m.is_dir() => {
                return Err(RemoteException::file_not_found(format!(
                    "Path is not a file: {path}"
                )));
            }
            Some(_) => {}
        }
        tokio::fs::OpenOptions::new()
            .append(true)
            .open(self.local(path))
            .await
            .map_err(|e| io_err(path, e))
    }

    /// The datanode half of `OPEN`: the file positioned at `offset` and the
    /// number of bytes to send.
    pub async fn open_read(
        &self,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> R<(tokio::fs::File, u64)> {
        use tokio::io::AsyncSeekExt;
        let len = self.check_readable(path).await?;
        if offset > len {
            return Err(RemoteException::eof(format!(
                "Cannot seek after EOF (offset {offset}, length {len}) for {path}"
            )));
        }
        let mut f = tokio::fs::File::open(self.local(path))
            .await
            .map_err(|e| io_err(path, e))?;
        f.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(|e| io_err(path, e))?;
        let n = (len - offset).min(length.unwrap_or(u64::MAX));
        Ok((f, n))
    }
}
