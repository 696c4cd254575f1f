//! Checkpoints: their layout on the job's file system, and both sides of
//! writing and reading them.
//!
//! A checkpoint is a folder `ckpt-<n>` (`n` counts up from 1, zero-padded)
//! under the checkpoint directory (`checkpoint.dir`), on a local disk or
//! HDFS:
//!
//! ```text
//! <dir>/ckpt-000007/t0-b00003.blk   a model block (BlockData::encode)
//! <dir>/ckpt-000007/t2-b00011.blk   the worker-local state of input block 11
//! <dir>/ckpt-000007/MANIFEST.json   written last: what the checkpoint holds
//! ```
//!
//! Evaluators write the blocks they own ([`write_blocks`]): every model
//! block, and, for apps whose worker-local state checkpoints hold
//! ([`crate::apps::state_in_checkpoints`]: NMF's row factors, LDA's
//! document-topic counts and topic assignments), the state
//! block (table `STATE`) of every input block. Each block is copied under
//! its own lock (training goes on; nothing pauses the job; a state block
//! waits for the mini-batch computing on it), encoded and hashed off the
//! async threads, and written whole. The AM then publishes the checkpoint
//! ([`publish`]): the manifest — the job's progress and every block with
//! its size and SHA-256 — is written beside the blocks under a temporary
//! name and renamed into place, so a checkpoint without its manifest was
//! never published. Older checkpoints beyond the last [`KEEP`] are then
//! deleted.
//!
//! State blocks are listed like model blocks (`tables` names `STATE` with
//! one block per input block, and every one is listed), so the manifest's
//! [`FORMAT`] is unchanged: a manifest without them (an app without
//! checkpointed state, or one written before they were) is read as before,
//! and the input blocks it is used for draw their state afresh. A worker
//! loading input blocks from a checkpoint's state ([`SavedState`], on a
//! resume or when a lost worker's blocks are re-read) restores each
//! block's state from it ([`read_state`]). A resumed LDA job reads no
//! model block ([`crate::apps::model_rebuilt_on_resume`]): its counts are
//! rebuilt from the restored assignments, so the count blocks written
//! beside them are not read back.
//!
//! Reading ([`latest`], [`read_block`]) trusts nothing: a manifest that
//! does not parse, names another job, or lists a block whose file is
//! missing or of another size makes that checkpoint unusable (the error
//! names the file) and the previous one is used; a block whose bytes do
//! not match their checksum is refused when it is read.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use cruise_hdfs::{FileSystem, HdfsError};

use crate::protocol::{BlockId, EvaluatorId, MODEL_TABLE, STATE_TABLE, TableId};
use crate::store::{BlockData, StateBlock, Store, StoreError};

/// Checkpoints kept: the newest and the one before (a torn newest one
/// falls back to it).
pub const KEEP: usize = 2;

/// The manifest's name inside a checkpoint's folder.
pub const MANIFEST: &str = "MANIFEST.json";

/// The manifest's version; a checkpoint of another version is not read.
/// Worker-local state blocks came without a new version: they are listed
/// as another table's blocks, which a manifest of version 1 may hold.
pub const FORMAT: u32 = 1;

/// Errors of writing or reading a checkpoint; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system refused.
    #[error("checkpoint file {uri}: {source}")]
    Io {
        /// The file or folder.
        uri: String,
        /// Why.
        #[source]
        source: Box<HdfsError>,
    },
    /// A file is not what its manifest says, or does not parse.
    #[error("checkpoint file {uri} is corrupt: {message}")]
    Corrupt {
        /// The file.
        uri: String,
        /// What is wrong.
        message: String,
    },
    /// No published checkpoint is usable.
    #[error("no usable checkpoint in {dir}{}", tried_text(.tried))]
    NoneUsable {
        /// The checkpoint directory.
        dir: String,
        /// Why each checkpoint found was not used.
        tried: Vec<String>,
    },
    /// The store refused a restored block.
    #[error("restoring block {block} of table {table}: {source}")]
    Store {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// Encoding or hashing off the async threads failed.
    #[error("encoding a checkpoint block: {0}")]
    Encode(String),
}

fn tried_text(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!(" ({})", tried.join("; "))
    }
}

/// One block's file in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockFile {
    /// The table.
    pub table: TableId,
    /// The block.
    pub block: BlockId,
    /// The file's name inside the checkpoint's folder.
    pub file: String,
    /// Its length.
    pub bytes: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// What a published checkpoint holds (`MANIFEST.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The job that wrote it.
    pub job_id: String,
    /// Its number (the folder is `ckpt-<id>`).
    pub id: u64,
    /// Epochs the job had completed when it was asked for.
    pub epoch: u32,
    /// Records the job had processed then.
    pub records_done: u64,
    /// The slowest worker's clock then (SSP; 0 for asynchronous jobs):
    /// every update of the local epochs before it is in the blocks. A job
    /// resumed from the checkpoint, or rolled back to it for a lost
    /// server, starts its workers' clocks there. Absent from manifests
    /// written before it was recorded: [`Manifest::clock`] takes the epoch.
    #[serde(default)]
    pub clock: Option<u32>,
    /// Blocks per table (every block of each table listed is in `blocks`).
    pub tables: Vec<(TableId, u32)>,
    /// Every block's file.
    pub blocks: Vec<BlockFile>,
    /// Seconds since the Unix epoch when it was published.
    pub published_unix_secs: u64,
}

impl Manifest {
    /// The workers' clock the checkpoint holds the updates before
    /// (`clock`, or the epoch where it is not recorded).
    pub fn clock(&self) -> u32 {
        self.clock.unwrap_or(self.epoch)
    }

    /// The file of `block` of `table`, if listed.
    pub fn file_of(&self, table: TableId, block: BlockId) -> Option<&BlockFile> {
        self.blocks
            .iter()
            .find(|b| b.table == table && b.block == block)
    }

    /// The blocks of `table` the checkpoint holds (`None` when it holds
    /// none of that table).
    pub fn blocks_of(&self, table: TableId) -> Option<u32> {
        self.tables.iter().find(|t| t.0 == table).map(|t| t.1)
    }

    /// The worker-local state the checkpoint, in `folder`, holds of input
    /// `blocks`: `None` when it holds none of them, or holds the state of
    /// another number of input blocks than `input_blocks` (then its blocks
    /// are not this input's).
    pub fn saved_state(
        &self,
        folder: &str,
        blocks: impl IntoIterator<Item = BlockId>,
        input_blocks: u32,
    ) -> Option<SavedState> {
        if self.blocks_of(STATE_TABLE) != Some(input_blocks) {
            return None;
        }
        let files: Vec<BlockFile> = blocks
            .into_iter()
            .filter_map(|b| self.file_of(STATE_TABLE, b).cloned())
            .collect();
        (!files.is_empty()).then(|| SavedState {
            folder: folder.to_string(),
            files,
        })
    }

    /// Checks that every block of every listed table is listed once.
    fn check_complete(&self, uri: &str) -> Result<(), CheckpointError> {
        let corrupt = |message: String| CheckpointError::Corrupt {
            uri: uri.to_string(),
            message,
        };
        if self.format != FORMAT {
            return Err(corrupt(format!(
                "format {} (this build reads {FORMAT})",
                self.format
            )));
        }
        for &(table, n) in &self.tables {
            let mut seen = vec![false; n as usize];
            for b in self.blocks.iter().filter(|b| b.table == table) {
                match seen.get_mut(b.block.index()) {
                    Some(s) if !*s => *s = true,
                    Some(_) => {
                        return Err(corrupt(format!(
                            "block {} of table {table} is listed twice",
                            b.block
                        )));
                    }
                    None => {
                        return Err(corrupt(format!(
                            "block {} of table {table} is out of range (the table has {n})",
                            b.block
                        )));
                    }
                }
            }
            if let Some(missing) = seen.iter().position(|s| !s) {
                return Err(corrupt(format!(
                    "block {missing} of table {table} is missing"
                )));
            }
        }
        Ok(())
    }
}

/// Worker-local state blocks of a checkpoint that a worker loading their
/// input blocks restores instead of drawing them afresh
/// ([`Manifest::saved_state`], [`read_state`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedState {
    /// The checkpoint's folder.
    pub folder: String,
    /// The state blocks' files (table `STATE`).
    pub files: Vec<BlockFile>,
}

/// `dir/name`, whatever `dir` ends with.
pub fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The folder of checkpoint `id` under the checkpoint directory.
pub fn folder(dir: &str, id: u64) -> String {
    join(dir, &format!("ckpt-{id:06}"))
}

/// The number of a checkpoint's folder name (`ckpt-000007` → 7).
fn folder_id(name: &str) -> Option<u64> {
    name.strip_prefix("ckpt-")?.parse().ok()
}

fn io(uri: &str) -> impl FnOnce(HdfsError) -> CheckpointError + '_ {
    move |e| CheckpointError::Io {
        uri: uri.to_string(),
        source: Box::new(e),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Writes the model blocks owned here, and with `state` the worker-local
/// state blocks owned here, into the checkpoint folder `folder` and
/// returns their files. Each block is copied under its own lock, one at a
/// time; a block moved away meanwhile is not written here (its new owner
/// has it).
pub async fn write_blocks(
    fs: &FileSystem,
    store: &Store,
    folder: &str,
    state: bool,
) -> Result<Vec<BlockFile>, CheckpointError> {
    let mut out = Vec::new();
    for block in store.local_blocks(MODEL_TABLE) {
        if let Some(copy) = store.keyed_snapshot(block) {
            out.push(write_block(fs, folder, MODEL_TABLE, block, BlockData::Keyed(copy)).await?);
        }
    }
    if state {
        for block in store.local_blocks(STATE_TABLE) {
            if let Some(copy) = store.with_state(block, |s| s.clone()) {
                out.push(
                    write_block(fs, folder, STATE_TABLE, block, BlockData::State(copy)).await?,
                );
            }
        }
    }
    Ok(out)
}

/// Encodes and hashes one block's copy off the async threads, and writes
/// it whole into `folder`.
async fn write_block(
    fs: &FileSystem,
    folder: &str,
    table: TableId,
    block: BlockId,
    copy: BlockData,
) -> Result<BlockFile, CheckpointError> {
    let (bytes, sha256) = tokio::task::spawn_blocking(move || {
        let bytes = copy.encode();
        let sum = sha256_hex(&bytes);
        (bytes, sum)
    })
    .await
    .map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let file = format!("t{table}-b{:05}.blk", block.0);
    let uri = join(folder, &file);
    let len = bytes.len() as u64;
    fs.create(&uri, Bytes::from(bytes), true)
        .await
        .map_err(io(&uri))?;
    Ok(BlockFile {
        table,
        block,
        file,
        bytes: len,
        sha256,
    })
}

/// Reads the worker-local state of input block `block` from `saved`:
/// `None` when it does not hold that block's. The file is checked as
/// [`read_block`] does, and must hold a state block.
pub async fn read_state(
    fs: &FileSystem,
    saved: &SavedState,
    block: BlockId,
) -> Result<Option<StateBlock>, CheckpointError> {
    let Some(f) = saved
        .files
        .iter()
        .find(|f| f.table == STATE_TABLE && f.block == block)
    else {
        return Ok(None);
    };
    match read_block(fs, &saved.folder, f).await? {
        BlockData::State(s) => Ok(Some(s)),
        other => Err(CheckpointError::Corrupt {
            uri: join(&saved.folder, &f.file),
            message: format!(
                "it holds a {} block where the manifest lists worker-local state",
                kind_name(&other)
            ),
        }),
    }
}

/// The kind of a block, in words.
fn kind_name(data: &BlockData) -> &'static str {
    match data {
        BlockData::Keyed(_) => "model",
        BlockData::Input(_) => "input",
        BlockData::State(_) => "state",
    }
}

/// Reads one block of the checkpoint in `folder`, checking its size and
/// checksum.
pub async fn read_block(
    fs: &FileSystem,
    folder: &str,
    f: &BlockFile,
) -> Result<BlockData, CheckpointError> {
    let uri = join(folder, &f.file);
    // One byte more than expected: a longer file is as wrong as a shorter.
    let bytes = fs
        .read_range(&uri, 0, f.bytes + 1)
        .await
        .map_err(io(&uri))?;
    if bytes.len() as u64 != f.bytes {
        return Err(CheckpointError::Corrupt {
            uri,
            message: format!("{} bytes where the manifest says {}", bytes.len(), f.bytes),
        });
    }
    let want = f.sha256.clone();
    let decoded = tokio::task::spawn_blocking(move || {
        let got = sha256_hex(&bytes);
        if got != want {
            return Err(format!("SHA-256 {got} where the manifest says {want}"));
        }
        BlockData::decode(&bytes).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| CheckpointError::Encode(e.to_string()))?;
    decoded.map_err(|message| CheckpointError::Corrupt { uri, message })
}

/// Restores blocks that `lost` owned from the checkpoint in `folder`.
/// Each block's slot is taken arriving first ([`Store::begin_restore`],
/// done by the caller before anything else can reach this evaluator with
/// the new ownership), so operations on it queue; each is installed as it
/// is read, and its queue applied. Returns the blocks restored.
pub async fn restore_blocks(
    fs: &FileSystem,
    store: &Store,
    folder: &str,
    files: &[BlockFile],
) -> Result<Vec<BlockId>, CheckpointError> {
    let mut done = Vec::with_capacity(files.len());
    for f in files {
        let data = read_block(fs, folder, f).await?;
        store
            .install(f.table, f.block, data)
            .map_err(store_error(f))?;
        done.push(f.block);
    }
    Ok(done)
}

/// Takes the slots of `files`' blocks arriving, as restored blocks of the
/// lost evaluator `lost` (see [`restore_blocks`]).
pub fn begin_restore(
    store: &Store,
    lost: EvaluatorId,
    files: &[BlockFile],
) -> Result<(), CheckpointError> {
    for f in files {
        store
            .begin_restore(f.table, f.block, lost)
            .map_err(store_error(f))?;
    }
    Ok(())
}

/// The store's refusal of `f`'s block, named.
fn store_error(f: &BlockFile) -> impl FnOnce(StoreError) -> CheckpointError {
    let (table, block) = (f.table, f.block);
    move |source| CheckpointError::Store {
        table,
        block,
        source,
    }
}

/// Publishes checkpoint `m.id` under `dir`, whose blocks are written: its
/// manifest is written under a temporary name and renamed into place; then
/// checkpoints older than the last [`KEEP`] are deleted (a failure to
/// delete is logged, not returned).
pub async fn publish(fs: &FileSystem, dir: &str, m: &Manifest) -> Result<(), CheckpointError> {
    let folder = folder(dir, m.id);
    let tmp = join(&folder, &format!("_{MANIFEST}.tmp"));
    let target = join(&folder, MANIFEST);
    let text = serde_json::to_vec_pretty(m).map_err(|e| CheckpointError::Corrupt {
        uri: target.clone(),
        message: e.to_string(),
    })?;
    fs.create(&tmp, Bytes::from(text), true)
        .await
        .map_err(io(&tmp))?;
    fs.rename(&tmp, &target).await.map_err(io(&target))?;
    prune(fs, dir, m.id).await;
    Ok(())
}

/// Deletes the checkpoints older than the last [`KEEP`] up to `newest`
/// (and unpublished ones older than it).
async fn prune(fs: &FileSystem, dir: &str, newest: u64) {
    let ids = match list_ids(fs, dir).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!("listing checkpoints to delete old ones: {e}");
            return;
        }
    };
    let keep_from = newest.saturating_sub(KEEP as u64 - 1);
    for id in ids.into_iter().filter(|&id| id < keep_from) {
        let f = folder(dir, id);
        if let Err(e) = fs.delete(&f, true).await {
            tracing::warn!("deleting old checkpoint {f}: {e}");
        }
    }
}

/// Deletes every checkpoint folder (`ckpt-<n>`, published or torn) under
/// `dir`, then `dir` itself if nothing else is left in it (a directory
/// that holds other files is kept, with them). Returns how many folders
/// were deleted; a directory that does not exist deletes nothing.
pub async fn delete_all(fs: &FileSystem, dir: &str) -> Result<usize, CheckpointError> {
    let ids = list_ids(fs, dir).await?;
    for &id in &ids {
        let f = folder(dir, id);
        fs.delete(&f, true).await.map_err(io(&f))?;
    }
    let left = match fs.list(dir).await {
        Ok(entries) => entries.len(),
        Err(e) if e.is_not_found() => return Ok(ids.len()),
        Err(e) => return Err(io(dir)(e)),
    };
    if left == 0 {
        fs.delete(dir, false).await.map_err(io(dir))?;
    }
    Ok(ids.len())
}

/// The highest checkpoint number a folder under `dir` has, published or
/// torn (`None` when there is none): a resumed job numbers its own
/// checkpoints after it, so that none is written into a torn one's folder.
pub async fn highest_id(fs: &FileSystem, dir: &str) -> Result<Option<u64>, CheckpointError> {
    Ok(list_ids(fs, dir).await?.last().copied())
}

/// The checkpoint numbers found under `dir`, ascending (none when the
/// directory does not exist).
async fn list_ids(fs: &FileSystem, dir: &str) -> Result<Vec<u64>, CheckpointError> {
    let entries = match fs.list(dir).await {
        Ok(e) => e,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut ids: Vec<u64> = entries
        .iter()
        .filter(|e| e.is_dir)
        .filter_map(|e| folder_id(e.name()))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Reads and checks the manifest of checkpoint `id`: it parses, is of job
/// `job_id`, lists every block once, and each block's file has the listed
/// size.
pub async fn check(
    fs: &FileSystem,
    dir: &str,
    id: u64,
    job_id: &str,
) -> Result<Manifest, CheckpointError> {
    let folder = folder(dir, id);
    let uri = join(&folder, MANIFEST);
    let bytes = fs.read_range(&uri, 0, 256 << 20).await.map_err(io(&uri))?;
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Corrupt {
        uri: uri.clone(),
        message: e.to_string(),
    })?;
    if m.id != id || m.job_id != job_id {
        return Err(CheckpointError::Corrupt {
            uri,
            message: format!(
                "it is checkpoint {} of job {}, not {id} of {job_id}",
                m.id, m.job_id
            ),
        });
    }
    m.check_complete(&uri)?;
    for b in &m.blocks {
        let file = join(&folder, &b.file);
        let st = fs.status(&file).await.map_err(io(&file))?;
        if st.len != b.bytes {
            return Err(CheckpointError::Corrupt {
                uri: file,
                message: format!("{} bytes where the manifest says {}", st.len, b.bytes),
            });
        }
    }
    Ok(m)
}

/// The newest usable checkpoint of job `job_id` under `dir`: checkpoints
/// are tried newest first ([`check`]); one that fails is logged, naming
/// the file and what is wrong, and the one before is tried.
pub async fn latest(fs: &FileSystem, dir: &str, job_id: &str) -> Result<Manifest, CheckpointError> {
    let mut tried = Vec::new();
    for id in list_ids(fs, dir).await?.into_iter().rev() {
        match check(fs, dir, id, job_id).await {
            Ok(m) => return Ok(m),
            Err(e) => {
                tracing::warn!("checkpoint {id} not used: {e}");
                tried.push(e.to_string());
            }
        }
    }
    Err(CheckpointError::NoneUsable {
        dir: dir.to_string(),
        tried,
    })
}

/// How long one checkpoint may take, at most, before the AM gives it up
/// and takes the next one when it is due.
pub const MAX_CHECKPOINT_TIME: Duration = Duration::from_secs(600);

#[cfg(test)]
mod tests;
