//! Checkpoints through WebHDFS: the blocks, the manifest renamed into
//! place, pruning to the last two, the fallback from a corrupt newest
//! checkpoint and deleting a finished job's checkpoints, against the
//! WebHDFS simulator (`cruise-sim webhdfs`), as `checkpoint.dir =
//! webhdfs://...` does.

use std::sync::Arc;

use bytes::Bytes;

use cruise_container::checkpoint::{self, FORMAT, MANIFEST, Manifest};
use cruise_container::protocol::{BlockId, EvaluatorId, Key, MODEL_TABLE};
use cruise_container::store::{BlockData, KeyedBlock, Store};
use cruise_hdfs::FileSystem;
use cruise_integration::Sim;
use cruise_integration::bench::AddModel;

const BLOCKS: u32 = 4;
const JOB: &str = "job_ckpt_webhdfs";

/// A store holding every model block, block `b` with keys `100 b ..
/// 100 b + 50`, each set to its number.
fn filled_store() -> Store {
    let s = Store::new(EvaluatorId(1));
    s.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(AddModel { len: 1 }));
    for b in 0..BLOCKS {
        let values = (0..50u64)
            .map(|i| {
                let k: Key = u64::from(b) * 100 + i;
                (k, vec![k as f32])
            })
            .collect();
        let block = BlockData::Keyed(KeyedBlock { values });
        s.put_block(MODEL_TABLE, BlockId(b), block).unwrap();
    }
    s
}

/// Writes checkpoint `id` of `store`'s blocks under `dir` and publishes it.
async fn take(fs: &FileSystem, store: &Store, dir: &str, id: u64) {
    let folder = checkpoint::folder(dir, id);
    let blocks = checkpoint::write_blocks(fs, store, &folder, false)
        .await
        .unwrap();
    assert_eq!(blocks.len(), BLOCKS as usize);
    let m = Manifest {
        format: FORMAT,
        job_id: JOB.into(),
        id,
        epoch: id as u32,
        records_done: 0,
        clock: None,
        tables: vec![(MODEL_TABLE, BLOCKS)],
        blocks,
        published_unix_secs: 0,
    };
    checkpoint::publish(fs, dir, &m).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_round_trip_through_webhdfs() {
    let sim = Sim::start("webhdfs", &[]).unwrap();
    let dir = format!("webhdfs://{}/jobs/checkpoints/{JOB}", sim.address());
    let fs = FileSystem::default();
    let store = filled_store();
    for id in 1..=3 {
        take(&fs, &store, &dir, id).await;
    }
    let names: Vec<String> = fs
        .list(&dir)
        .await
        .unwrap()
        .iter()
        .map(|e| e.name().to_string())
        .collect();
    assert_eq!(
        names,
        vec!["ckpt-000002", "ckpt-000003"],
        "the last two kept"
    );

    let m = checkpoint::latest(&fs, &dir, JOB).await.unwrap();
    assert_eq!(m.id, 3);
    let folder = checkpoint::folder(&dir, 3);
    for f in &m.blocks {
        let data = checkpoint::read_block(&fs, &folder, f).await.unwrap();
        assert_eq!(
            data,
            BlockData::Keyed(store.keyed_snapshot(f.block).unwrap())
        );
    }

    // A torn newest manifest: the one before is used, the file named.
    let manifest = checkpoint::join(&folder, MANIFEST);
    fs.create(&manifest, Bytes::from_static(b"{\"format\":"), true)
        .await
        .unwrap();
    let err = checkpoint::check(&fs, &dir, 3, JOB)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&manifest), "{err}");
    assert_eq!(checkpoint::latest(&fs, &dir, JOB).await.unwrap().id, 2);
}

/// Deleting a finished job's checkpoints (`checkpoint.delete_on_success`)
/// through WebHDFS: every `ckpt-<n>` folder goes, torn ones too, then the
/// directory when nothing else is in it; a directory holding anything
/// else is kept with it; a directory that is not there deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_checkpoints_are_deleted_through_webhdfs() {
    let sim = Sim::start("webhdfs", &[]).unwrap();
    let fs = FileSystem::default();
    let store = filled_store();
    let staging = format!("webhdfs://{}/staging/application_1_0001", sim.address());
    let dir = format!("{staging}/checkpoints");
    take(&fs, &store, &dir, 1).await;
    take(&fs, &store, &dir, 2).await;
    // A torn checkpoint: blocks written, never published.
    checkpoint::write_blocks(&fs, &store, &checkpoint::folder(&dir, 3), false)
        .await
        .unwrap();
    assert_eq!(checkpoint::delete_all(&fs, &dir).await.unwrap(), 3);
    let gone = fs.status(&dir).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    assert!(
        fs.status(&staging).await.unwrap().is_dir,
        "its parent stays"
    );
    assert_eq!(checkpoint::delete_all(&fs, &dir).await.unwrap(), 0);

    // A directory of the user's, with a file of theirs beside the
    // checkpoints: the checkpoints go, the directory and the file stay.
    let mine = format!("webhdfs://{}/user/alice/ckpts", sim.address());
    take(&fs, &store, &mine, 1).await;
    let notes = checkpoint::join(&mine, "notes.txt");
    fs.create(&notes, Bytes::from_static(b"mine"), true)
        .await
        .unwrap();
    assert_eq!(checkpoint::delete_all(&fs, &mine).await.unwrap(), 1);
    let left: Vec<String> = fs
        .list(&mine)
        .await
        .unwrap()
        .iter()
        .map(|e| e.name().to_string())
        .collect();
    assert_eq!(left, vec!["notes.txt"]);
}
