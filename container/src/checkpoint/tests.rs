use std::sync::Arc;

use super::*;
use crate::protocol::{Key, OwnershipUpdate, ValueBatch};
use crate::store::{OpKind, Pending, StateBlock, StoreOp, SumModel, block_of_key};

const BLOCKS: u32 = 4;
const JOB: &str = "job_test_ckpt";

/// A store owning every model block, each key `k` of the first 200 set to `k`.
fn filled_store() -> Store {
    let s = Store::new(EvaluatorId(1));
    s.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(SumModel));
    let all: Vec<BlockId> = (0..BLOCKS).map(BlockId).collect();
    s.create_blocks(MODEL_TABLE, &all).unwrap();
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: all
            .iter()
            .map(|&b| (MODEL_TABLE, b, EvaluatorId(1)))
            .collect(),
    });
    let keys: Vec<Key> = (0..200).collect();
    let mut values = ValueBatch::default();
    for &k in &keys {
        values.push(&[k as f32]);
    }
    let sub = s
        .submit(&StoreOp {
            kind: OpKind::Update,
            table: MODEL_TABLE,
            keys,
            values,
        })
        .unwrap();
    assert!(
        sub.parts
            .iter()
            .all(|p| matches!(p.pending, Pending::Ready(Ok(_))))
    );
    s
}

/// Writes checkpoint `id` of `store` under `dir` and publishes it.
async fn take(fs: &FileSystem, store: &Store, dir: &str, id: u64) -> Manifest {
    let files = write_blocks(fs, store, &folder(dir, id), false)
        .await
        .unwrap();
    let m = Manifest {
        format: FORMAT,
        job_id: JOB.into(),
        id,
        epoch: id as u32,
        records_done: 100 * id,
        clock: Some(id as u32),
        tables: vec![(MODEL_TABLE, BLOCKS)],
        blocks: files,
        published_unix_secs: 0,
    };
    publish(fs, dir, &m).await.unwrap();
    m
}

fn dir_of(t: &tempfile::TempDir) -> String {
    t.path().join("ckpt").display().to_string()
}

#[tokio::test]
async fn blocks_round_trip_and_only_the_last_two_are_kept() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let store = filled_store();
    for id in 1..=3 {
        take(&fs, &store, &dir, id).await;
    }
    let ids = list_ids(&fs, &dir).await.unwrap();
    assert_eq!(ids, vec![2, 3], "the last two are kept");
    let m = latest(&fs, &dir, JOB).await.unwrap();
    assert_eq!((m.id, m.epoch, m.blocks.len()), (3, 3, BLOCKS as usize));
    for f in &m.blocks {
        let data = read_block(&fs, &folder(&dir, 3), f).await.unwrap();
        let want = store.keyed_snapshot(f.block).unwrap();
        assert_eq!(data, BlockData::Keyed(want));
    }
}

/// A manifest records the workers' clock; one written before it was
/// recorded reads its epoch as its clock.
#[test]
fn a_manifest_without_its_clock_reads_its_epoch_as_its_clock() {
    let mut m = state_manifest(Vec::new());
    m.epoch = 5;
    m.clock = Some(4);
    let json = serde_json::to_value(&m).unwrap();
    let back: Manifest = serde_json::from_value(json.clone()).unwrap();
    assert_eq!((back.clock, back.clock()), (Some(4), 4));
    let mut old = json;
    old.as_object_mut().unwrap().remove("clock");
    let old: Manifest = serde_json::from_value(old).unwrap();
    assert_eq!((old.clock, old.clock()), (None, 5));
}

#[tokio::test]
async fn a_corrupt_newest_manifest_falls_back_to_the_previous() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let store = filled_store();
    take(&fs, &store, &dir, 1).await;
    take(&fs, &store, &dir, 2).await;
    let manifest = join(&folder(&dir, 2), MANIFEST);
    std::fs::write(&manifest, b"{\"format\": 1, \"job_id\": ").unwrap();
    let err = check(&fs, &dir, 2, JOB).await.unwrap_err().to_string();
    assert!(err.contains(&manifest) && err.contains("corrupt"), "{err}");
    assert_eq!(latest(&fs, &dir, JOB).await.unwrap().id, 1);
}

#[tokio::test]
async fn a_torn_block_is_detected_and_the_previous_checkpoint_used() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let store = filled_store();
    take(&fs, &store, &dir, 1).await;
    let m = take(&fs, &store, &dir, 2).await;
    let torn = join(&folder(&dir, 2), &m.blocks[1].file);
    let bytes = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() / 2]).unwrap();
    let err = check(&fs, &dir, 2, JOB).await.unwrap_err().to_string();
    assert!(err.contains(&torn), "{err}");
    assert_eq!(latest(&fs, &dir, JOB).await.unwrap().id, 1);
    // Unpublished (no manifest): skipped as well.
    write_blocks(&fs, &store, &folder(&dir, 3), false)
        .await
        .unwrap();
    assert_eq!(latest(&fs, &dir, JOB).await.unwrap().id, 1);
    // A job resumed from 1 numbers its checkpoints after the torn ones.
    assert_eq!(highest_id(&fs, &dir).await.unwrap(), Some(3));
    let empty = join(&dir, "none");
    assert_eq!(highest_id(&fs, &empty).await.unwrap(), None);
}

#[tokio::test]
async fn a_flipped_byte_fails_its_checksum_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let m = take(&fs, &filled_store(), &dir, 1).await;
    let f = &m.blocks[0];
    let uri = join(&folder(&dir, 1), &f.file);
    let mut bytes = std::fs::read(&uri).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&uri, &bytes).unwrap();
    let err = read_block(&fs, &folder(&dir, 1), f)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&uri) && err.contains("SHA-256"), "{err}");
}

#[tokio::test]
async fn none_usable_names_the_directory_and_why() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let err = latest(&fs, &dir, JOB).await.unwrap_err().to_string();
    assert!(err.contains(&dir), "{err}");
    take(&fs, &filled_store(), &dir, 1).await;
    let err = latest(&fs, &dir, "job_other")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not 1 of job_other"), "{err}");
}

/// A restored block queues what arrives before its data, then applies it.
#[tokio::test]
async fn a_restored_block_applies_what_queued_while_it_was_read() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let m = take(&fs, &filled_store(), &dir, 1).await;

    let me = EvaluatorId(2);
    let lost = EvaluatorId(1);
    let s = Store::new(me);
    s.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(SumModel));
    s.apply_ownership(&OwnershipUpdate {
        version: 2,
        owners: (0..BLOCKS).map(|b| (MODEL_TABLE, BlockId(b), me)).collect(),
    });
    begin_restore(&s, lost, &m.blocks).unwrap();
    let key: Key = 7;
    let b = block_of_key(key, BLOCKS);
    let mut values = ValueBatch::default();
    values.push(&[1.0]);
    let mut sub = s
        .submit(&StoreOp {
            kind: OpKind::Update,
            table: MODEL_TABLE,
            keys: vec![key],
            values,
        })
        .unwrap();
    let Pending::Queued(rx) = sub.parts.remove(0).pending else {
        panic!("an update of a block being restored must queue");
    };
    let restored = restore_blocks(&fs, &s, &folder(&dir, 1), &m.blocks)
        .await
        .unwrap();
    assert_eq!(restored.len(), BLOCKS as usize);
    assert!(rx.await.unwrap().is_ok());
    let v = s.keyed_snapshot(b).unwrap().values[&key].clone();
    assert_eq!(v, vec![8.0], "the checkpoint's 7 plus the queued 1");
}

/// Input blocks whose worker-local state a test store holds.
const INPUT_BLOCKS: u32 = 3;

/// The state of input block `b` in a test store.
fn state_of(b: u32) -> StateBlock {
    StateBlock {
        floats: (0..10 * (b + 1))
            .map(|i| i as f32 / 7.0 + b as f32)
            .collect(),
        ints: vec![b, 40 + b],
    }
}

/// [`filled_store`] that also holds the worker-local state of every input
/// block.
fn store_with_state() -> Store {
    let s = filled_store();
    // Adds the state table; the model table filled stays.
    s.configure(&[(STATE_TABLE, INPUT_BLOCKS)], Arc::new(SumModel));
    for b in 0..INPUT_BLOCKS {
        s.put_block(STATE_TABLE, BlockId(b), BlockData::State(state_of(b)))
            .unwrap();
    }
    s
}

/// The manifest of checkpoint 1 holding the model and the worker-local
/// state, its files `blocks`.
fn state_manifest(blocks: Vec<BlockFile>) -> Manifest {
    Manifest {
        format: FORMAT,
        job_id: JOB.into(),
        id: 1,
        epoch: 1,
        records_done: 100,
        clock: None,
        tables: vec![(MODEL_TABLE, BLOCKS), (STATE_TABLE, INPUT_BLOCKS)],
        blocks,
        published_unix_secs: 0,
    }
}

#[tokio::test]
async fn worker_state_round_trips_listed_with_its_size_and_checksum() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let store = store_with_state();
    let f1 = folder(&dir, 1);
    let files = write_blocks(&fs, &store, &f1, true).await.unwrap();
    let state_files: Vec<&BlockFile> = files.iter().filter(|f| f.table == STATE_TABLE).collect();
    assert_eq!(state_files.len(), INPUT_BLOCKS as usize, "{files:?}");
    for f in &state_files {
        let bytes = std::fs::read(join(&f1, &f.file)).unwrap();
        assert_eq!(bytes.len() as u64, f.bytes);
        assert_eq!(sha256_hex(&bytes), f.sha256);
    }
    let m = state_manifest(files);
    publish(&fs, &dir, &m).await.unwrap();
    let read = latest(&fs, &dir, JOB).await.unwrap();
    assert_eq!(read, m);
    assert_eq!(read.blocks_of(STATE_TABLE), Some(INPUT_BLOCKS));

    // A worker loading blocks 2 and 0 restores each one's own state.
    let saved = read
        .saved_state(&f1, [BlockId(2), BlockId(0)], INPUT_BLOCKS)
        .unwrap();
    assert_eq!(saved.files.len(), 2);
    for b in [2, 0] {
        let got = read_state(&fs, &saved, BlockId(b)).await.unwrap();
        assert_eq!(got, Some(state_of(b)), "block {b}");
    }
    assert_eq!(read_state(&fs, &saved, BlockId(1)).await.unwrap(), None);
    // Another input's blocks, or a checkpoint without state: none.
    assert!(read.saved_state(&f1, [BlockId(0)], 4).is_none());
    assert!(
        take(&fs, &store, &dir, 2)
            .await
            .saved_state(&folder(&dir, 2), [BlockId(0)], INPUT_BLOCKS)
            .is_none()
    );
    // Without `state` nothing but the model is written.
    let model_only = write_blocks(&fs, &store, &folder(&dir, 3), false)
        .await
        .unwrap();
    assert!(model_only.iter().all(|f| f.table == MODEL_TABLE));
}

#[tokio::test]
async fn a_missing_or_flipped_state_block_is_detected_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let (fs, dir) = (FileSystem::default(), dir_of(&t));
    let store = store_with_state();
    let f1 = folder(&dir, 1);
    let mut files = write_blocks(&fs, &store, &f1, true).await.unwrap();
    // A manifest listing the state table must list every block of it.
    let last = files.pop().unwrap();
    let mut m = state_manifest(files.clone());
    publish(&fs, &dir, &m).await.unwrap();
    let err = check(&fs, &dir, 1, JOB).await.unwrap_err().to_string();
    assert!(err.contains("block 2 of table 2 is missing"), "{err}");

    files.push(last);
    m.blocks = files;
    std::fs::remove_file(join(&f1, MANIFEST)).unwrap();
    publish(&fs, &dir, &m).await.unwrap();
    assert_eq!(check(&fs, &dir, 1, JOB).await.unwrap(), m);
    let saved = m.saved_state(&f1, [BlockId(1)], INPUT_BLOCKS).unwrap();
    let uri = join(&f1, &saved.files[0].file);
    let mut bytes = std::fs::read(&uri).unwrap();
    bytes[20] ^= 0x01;
    std::fs::write(&uri, &bytes).unwrap();
    let err = read_state(&fs, &saved, BlockId(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&uri) && err.contains("SHA-256"), "{err}");

    // A model block's file listed as state is refused for what it holds.
    let model = m.file_of(MODEL_TABLE, BlockId(0)).unwrap().clone();
    let wrong = SavedState {
        folder: f1.clone(),
        files: vec![BlockFile {
            table: STATE_TABLE,
            block: BlockId(0),
            ..model
        }],
    };
    let err = read_state(&fs, &wrong, BlockId(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds a model block"), "{err}");
}
