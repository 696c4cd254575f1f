//! The local backend through `FileSystem`, with HDFS semantics.

use bytes::Bytes;
use cruise_hdfs::FileSystem;

#[tokio::test]
async fn local_operations_follow_hdfs_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let root = format!("file://{}", dir.path().display());
    let fs = FileSystem::default();

    // create makes parents; no overwrite by default
    let f = format!("{root}/a/b/data.txt");
    fs.create(&f, Bytes::from_static(b"hello"), false)
        .await
        .unwrap();
    let err = fs
        .create(&f, Bytes::from_static(b"x"), false)
        .await
        .unwrap_err();
    assert!(err.is_already_exists(), "{err}");
    fs.append(&f, Bytes::from_static(b" world")).await.unwrap();
    let st = fs.status(&f).await.unwrap();
    assert_eq!(
        (st.len, st.is_dir, st.uri.as_str()),
        (11, false, f.as_str())
    );
    assert!(st.modification_time > 1_600_000_000_000);
    assert_eq!(
        fs.read_range(&f, 6, 100).await.unwrap(),
        Bytes::from_static(b"world")
    );
    assert_eq!(
        fs.read_range(&f, 2, 3).await.unwrap(),
        Bytes::from_static(b"llo")
    );
    assert!(fs.read_range(&f, 50, 3).await.unwrap().is_empty());
    fs.create(&f, Bytes::from_static(b"new"), true)
        .await
        .unwrap();
    assert_eq!(
        fs.read_range(&f, 0, 100).await.unwrap(),
        Bytes::from_static(b"new")
    );

    // append to a missing file fails as not found
    let err = fs
        .append(&format!("{root}/nope"), Bytes::new())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    // list: children sorted, hidden skipped; a file lists as itself
    fs.mkdirs(&format!("{root}/a/b/sub")).await.unwrap();
    fs.mkdirs(&format!("{root}/a/b/sub")).await.unwrap();
    fs.create(&format!("{root}/a/b/_SUCCESS"), Bytes::new(), false)
        .await
        .unwrap();
    fs.create(&format!("{root}/a/b/.hidden"), Bytes::new(), false)
        .await
        .unwrap();
    let names: Vec<(String, bool)> = fs
        .list(&format!("{root}/a/b"))
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.uri, s.is_dir))
        .collect();
    assert_eq!(
        names,
        vec![(f.clone(), false), (format!("{root}/a/b/sub"), true)]
    );
    let one = fs.list(&f).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].uri, f);

    // mkdirs over a file fails
    assert!(fs.mkdirs(&format!("{f}/x")).await.is_err());

    // rename into an existing directory; rename onto an existing file fails
    fs.rename(&f, &format!("{root}/a/b/sub")).await.unwrap();
    let moved = format!("{root}/a/b/sub/data.txt");
    assert_eq!(fs.status(&moved).await.unwrap().len, 3);
    fs.create(&format!("{root}/other"), Bytes::new(), false)
        .await
        .unwrap();
    assert!(fs.rename(&moved, &format!("{root}/other")).await.is_err());
    assert!(
        fs.rename(&moved, &format!("{root}/missing/x"))
            .await
            .is_err()
    );
    let err = fs
        .rename(&format!("{root}/gone"), &format!("{root}/x"))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(fs.rename(&moved, "webhdfs://h:1/x").await.is_err());

    // delete: non-empty directory needs recursive; missing gives false
    assert!(fs.delete(&format!("{root}/a"), false).await.is_err());
    assert!(fs.delete(&format!("{root}/a"), true).await.unwrap());
    assert!(!fs.delete(&format!("{root}/a"), true).await.unwrap());
    let err = fs.status(&format!("{root}/a")).await.unwrap_err();
    assert!(
        err.is_not_found() && err.to_string().contains("/a"),
        "{err}"
    );

    // reading a directory is an error
    assert!(fs.read_range(&root, 0, 1).await.is_err());
    // unsupported schemes are named
    let err = fs.status("s3://b/k").await.unwrap_err();
    assert!(err.to_string().contains("s3://b/k"), "{err}");
}
