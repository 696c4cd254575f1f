//! The `cruise-hdfs` WebHDFS client against the `cruise-sim webhdfs`
//! simulator, both for real: the simulator binary runs as a child process on
//! loopback port 0 and the client talks HTTP to it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cruise_hdfs::webhdfs::RetryPolicy;
use cruise_hdfs::{
    FileSystem, HadoopConf, HdfsError, Split, WebHdfsClient, WebHdfsOptions, plan_splits,
    read_split_with_read_ahead,
};
use proptest::prelude::*;

/// A running simulator; stopped with SIGTERM (then killed) on drop.
struct Sim {
    child: Child,
    namenode: String,
    datanode: String,
    standby: Option<String>,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sim {
    fn start(extra: &[&str]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let ready = dir.path().join("ready.json");
        let child = Command::new(env!("CARGO_BIN_EXE_cruise-sim"))
            .arg("webhdfs")
            .arg("--root")
            .arg(&root)
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let mut sim = Sim {
            child,
            namenode: String::new(),
            datanode: String::new(),
            standby: None,
            root,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                sim.namenode = v["namenode"].as_str().unwrap().to_string();
                sim.datanode = v["datanode"].as_str().unwrap().to_string();
                sim.standby = v["standby"].as_str().map(str::to_string);
                return sim;
            }
            if let Some(status) = sim.child.try_wait().unwrap() {
                panic!("cruise-sim webhdfs exited early: {status}");
            }
            assert!(Instant::now() < deadline, "simulator not ready in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn authority(&self) -> &str {
        self.namenode.trim_start_matches("http://")
    }

    fn uri(&self, path: &str) -> String {
        format!("webhdfs://{}{}", self.authority(), path)
    }

    /// Sends SIGTERM and waits for a clean exit.
    fn stop(mut self) -> std::process::ExitStatus {
        let st = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(st.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "simulator ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    }
}

fn fs_as(user: &str) -> FileSystem {
    FileSystem::new(
        HadoopConf::new(),
        WebHdfsOptions::default()
            .with_user(user)
            .with_retry(fast_retry(3)),
    )
}

#[tokio::test]
async fn every_operation_round_trips() {
    let sim = Sim::start(&[]);
    let fs = fs_as("alice");
    let f = sim.uri("/data/in/part-0.txt");

    // create (parents made), status, owner survives the datanode redirect
    fs.create(&f, Bytes::from_static(b"hello\nworld\n"), false)
        .await
        .unwrap();
    let st = fs.status(&f).await.unwrap();
    assert_eq!((st.len, st.is_dir), (12, false));
    assert_eq!(st.owner, "alice", "user.name must reach the datanode");
    assert_eq!(st.permission, 0o644);
    assert_eq!(st.uri, f);
    assert_eq!(
        std::fs::read(sim.root.join("data/in/part-0.txt")).unwrap(),
        b"hello\nworld\n"
    );

    // create without overwrite fails, with overwrite replaces
    let err = fs
        .create(&f, Bytes::from_static(b"x"), false)
        .await
        .unwrap_err();
    assert!(err.is_already_exists(), "{err}");
    assert!(!err.is_retryable());
    fs.create(&f, Bytes::from_static(b"0123456789\n"), true)
        .await
        .unwrap();

    // append, then ranged reads
    fs.append(&f, Bytes::from_static(b"abc\n")).await.unwrap();
    assert_eq!(fs.status(&f).await.unwrap().len, 15);
    assert_eq!(
        fs.read_range(&f, 3, 4).await.unwrap(),
        Bytes::from_static(b"3456")
    );
    assert_eq!(
        fs.read_range(&f, 11, 100).await.unwrap(),
        Bytes::from_static(b"abc\n")
    );
    assert!(fs.read_range(&f, 15, 10).await.unwrap().is_empty());
    assert!(fs.read_range(&f, 99, 10).await.unwrap().is_empty());

    // a large file streams through intact
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let bigf = sim.uri("/data/big.bin");
    fs.create(&bigf, Bytes::from(big.clone()), false)
        .await
        .unwrap();
    let back = fs.read_range(&bigf, 1_000_000, 1_500_000).await.unwrap();
    assert_eq!(&back[..], &big[1_000_000..2_500_000]);

    // mkdirs (idempotent), list skips hidden files, a file lists as itself
    fs.mkdirs(&sim.uri("/data/in/sub/deeper")).await.unwrap();
    fs.mkdirs(&sim.uri("/data/in/sub/deeper")).await.unwrap();
    assert_eq!(
        fs.status(&sim.uri("/data/in/sub")).await.unwrap().owner,
        "alice"
    );
    fs.create(&sim.uri("/data/in/_SUCCESS"), Bytes::new(), false)
        .await
        .unwrap();
    fs.create(&sim.uri("/data/in/.crc"), Bytes::new(), false)
        .await
        .unwrap();
    let listed: Vec<(String, bool, u64)> = fs
        .list(&sim.uri("/data/in"))
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.uri, s.is_dir, s.len))
        .collect();
    assert_eq!(
        listed,
        vec![
            (sim.uri("/data/in/part-0.txt"), false, 15),
            (sim.uri("/data/in/sub"), true, 0),
        ]
    );
    let one = fs.list(&f).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!((one[0].uri.as_str(), one[0].len), (f.as_str(), 15));

    // mkdirs through a file fails
    let err = fs
        .mkdirs(&sim.uri("/data/in/part-0.txt/x"))
        .await
        .unwrap_err();
    assert!(err.remote_exception().is_some(), "{err}");

    // rename: to a new name, into a directory, and the failing cases
    let g = sim.uri("/data/renamed.txt");
    fs.rename(&f, &g).await.unwrap();
    assert!(fs.status(&f).await.unwrap_err().is_not_found());
    assert_eq!(fs.status(&g).await.unwrap().len, 15);
    fs.rename(&g, &sim.uri("/data/in/sub")).await.unwrap();
    assert_eq!(
        fs.status(&sim.uri("/data/in/sub/renamed.txt"))
            .await
            .unwrap()
            .owner,
        "alice"
    );
    assert!(fs.rename(&sim.uri("/nope"), &sim.uri("/x")).await.is_err());
    assert!(
        fs.rename(&sim.uri("/data/big.bin"), &sim.uri("/no/parent/x"))
            .await
            .is_err()
    );

    // delete: non-empty without recursive is refused, missing gives false
    let err = fs.delete(&sim.uri("/data"), false).await.unwrap_err();
    assert_eq!(
        err.remote_exception(),
        Some("PathIsNotEmptyDirectoryException")
    );
    assert!(fs.delete(&sim.uri("/data"), true).await.unwrap());
    assert!(!fs.delete(&sim.uri("/data"), true).await.unwrap());
    assert!(!sim.root.join("data").exists());

    // errors: append to a missing file, read a directory
    fs.mkdirs(&sim.uri("/d")).await.unwrap();
    let err = fs
        .append(&sim.uri("/missing"), Bytes::new())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = fs.read_range(&sim.uri("/d"), 0, 1).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");

    assert!(sim.stop().success(), "SIGTERM must shut down cleanly");
}

#[tokio::test]
async fn not_found_is_reported_at_once_and_names_endpoint_op_and_status() {
    let sim = Sim::start(&[]);
    let client = WebHdfsClient::new(
        vec![sim.namenode.clone()],
        WebHdfsOptions::default()
            .with_user("alice")
            .with_retry(RetryPolicy {
                max_attempts: 5,
                initial_backoff: Duration::from_secs(2),
                max_backoff: Duration::from_secs(2),
            }),
    )
    .unwrap();
    let t = Instant::now();
    let err = client.get_file_status("/no/such/file").await.unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "404 must not be retried"
    );
    match &err {
        HdfsError::Remote {
            op,
            endpoint,
            status,
            exception,
            java_class_name,
            message,
            retryable,
            retry_after_secs,
        } => {
            assert_eq!(*retry_after_secs, None);
            assert_eq!(*op, "GETFILESTATUS");
            assert!(endpoint.starts_with(&sim.namenode), "{endpoint}");
            assert!(endpoint.contains("/webhdfs/v1/no/such/file"), "{endpoint}");
            assert_eq!(*status, 404);
            assert_eq!(exception, "FileNotFoundException");
            assert_eq!(
                java_class_name.as_deref(),
                Some("java.io.FileNotFoundException")
            );
            assert!(message.contains("/no/such/file"));
            assert!(!retryable);
        }
        other => panic!("expected a Remote error, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("GETFILESTATUS") && msg.contains("404") && msg.contains(&sim.namenode),
        "{msg}"
    );
    let err = client.open("/no/such/file", 0, None).await.unwrap_err();
    assert!(
        err.is_not_found() && err.to_string().contains("OPEN"),
        "{err}"
    );
}

#[tokio::test]
async fn redirects_keep_user_and_carry_namenode_address() {
    let sim = Sim::start(&[]);
    std::fs::create_dir_all(&sim.root).unwrap();
    std::fs::write(sim.root.join("f.txt"), b"0123456789").unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = http
        .get(format!(
            "{}/webhdfs/v1/f.txt?op=OPEN&user.name=alice&offset=2&length=5",
            sim.namenode
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 307);
    let loc = resp.headers()["location"].to_str().unwrap().to_string();
    assert!(
        loc.starts_with(&format!("{}/webhdfs/v1/f.txt?", sim.datanode)),
        "{loc}"
    );
    for part in [
        "op=OPEN",
        "user.name=alice",
        "namenoderpcaddress=",
        "offset=2",
        "length=5",
    ] {
        assert!(loc.contains(part), "{part} missing from {loc}");
    }
    let body = http.get(&loc).send().await.unwrap();
    assert_eq!(body.status().as_u16(), 200);
    assert_eq!(&body.bytes().await.unwrap()[..], b"23456");
    // noredirect answers 200 with the location in JSON
    let resp = http
        .put(format!(
            "{}/webhdfs/v1/new.txt?op=CREATE&user.name=bob&noredirect=true",
            sim.namenode
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    let loc = v["Location"].as_str().unwrap();
    assert!(
        loc.contains("user.name=bob") && loc.contains("op=CREATE"),
        "{loc}"
    );
    // the datanode refuses requests that did not come through a redirect
    let resp = http
        .get(format!("{}/webhdfs/v1/f.txt?op=OPEN", sim.datanode))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // the client's create through the redirect records the user as owner
    let fs = fs_as("carol");
    fs.create(&sim.uri("/by-carol"), Bytes::from_static(b"x"), false)
        .await
        .unwrap();
    assert_eq!(
        fs.status(&sim.uri("/by-carol")).await.unwrap().owner,
        "carol"
    );
}

#[tokio::test]
async fn fails_over_from_standby_and_dead_namenodes() {
    let sim = Sim::start(&["--standby"]);
    let standby = sim.standby.clone().unwrap();
    // A port nobody listens on: bind, note, close.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut conf = HadoopConf::new();
    conf.set("dfs.nameservices", "mycluster")
        .set("dfs.ha.namenodes.mycluster", "nn1,nn2,nn3")
        .set(
            "dfs.namenode.http-address.mycluster.nn1",
            standby.trim_start_matches("http://"),
        )
        .set(
            "dfs.namenode.http-address.mycluster.nn2",
            dead.trim_start_matches("http://"),
        )
        .set("dfs.namenode.http-address.mycluster.nn3", sim.authority());
    let fs = FileSystem::new(
        conf,
        WebHdfsOptions::default()
            .with_user("alice")
            .with_retry(fast_retry(2)),
    );
    fs.create(
        "hdfs://mycluster/ha.txt",
        Bytes::from_static(b"ha\n"),
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        fs.read_range("hdfs://mycluster/ha.txt", 0, 10)
            .await
            .unwrap(),
        Bytes::from_static(b"ha\n")
    );
    // Only the standby: retries run out and the last error names StandbyException.
    let client = WebHdfsClient::new(
        vec![standby.clone()],
        WebHdfsOptions::default().with_retry(fast_retry(3)),
    )
    .unwrap();
    let err = client.get_file_status("/ha.txt").await.unwrap_err();
    assert!(
        matches!(err, HdfsError::RetriesExhausted { attempts: 3, .. }),
        "{err}"
    );
    assert_eq!(err.remote_exception(), Some("StandbyException"));
    // The active namenode is remembered by the client.
    let c2 = WebHdfsClient::new(
        vec![standby, sim.namenode.clone()],
        WebHdfsOptions::default().with_retry(fast_retry(1)),
    )
    .unwrap();
    assert_eq!(c2.get_file_status("/ha.txt").await.unwrap().len, 3);
    assert_eq!(c2.active_namenode(), sim.namenode);
}

#[tokio::test]
async fn retries_retriable_and_unavailable_errors() {
    for mode in ["retriable", "unavailable"] {
        let sim = Sim::start(&["--fail-first", "3", "--fail-with", mode]);
        let client = WebHdfsClient::new(
            vec![sim.namenode.clone()],
            WebHdfsOptions::default()
                .with_user("alice")
                .with_retry(fast_retry(4)),
        )
        .unwrap();
        // Three injected failures, then success on the fourth attempt.
        client
            .create("/r.txt", Bytes::from_static(b"retried\n"), false)
            .await
            .unwrap();
        assert_eq!(
            client.open("/r.txt", 0, None).await.unwrap(),
            Bytes::from_static(b"retried\n")
        );

        let sim = Sim::start(&["--fail-first", "10", "--fail-with", mode]);
        let client = WebHdfsClient::new(
            vec![sim.namenode.clone()],
            WebHdfsOptions::default().with_retry(fast_retry(3)),
        )
        .unwrap();
        let err = client.get_file_status("/").await.unwrap_err();
        match &err {
            HdfsError::RetriesExhausted { attempts, last, .. } => {
                assert_eq!(*attempts, 3);
                match (mode, last.as_ref()) {
                    (
                        "retriable",
                        HdfsError::Remote {
                            status: 403,
                            exception,
                            ..
                        },
                    ) => {
                        assert_eq!(exception, "RetriableException")
                    }
                    (
                        "unavailable",
                        HdfsError::Remote {
                            status: 503,
                            message,
                            ..
                        },
                    ) => {
                        assert!(message.contains("Service Unavailable"), "{message}")
                    }
                    other => panic!("unexpected last error {other:?}"),
                }
            }
            other => panic!("expected RetriesExhausted, got {other:?}"),
        }
        // The budget was exactly three requests: seven injected failures remain,
        // so the next call fails again rather than succeeding.
        assert!(client.get_file_status("/").await.is_err());
    }
}

#[tokio::test]
async fn listing_pages_through_batches_and_falls_back_to_liststatus() {
    for extra in [&["--list-limit", "2"][..], &["--no-list-batch"][..]] {
        let sim = Sim::start(extra);
        let fs = fs_as("alice");
        for i in 0..7 {
            fs.create(
                &sim.uri(&format!("/dir/f{i}")),
                Bytes::from(vec![b'x'; i]),
                false,
            )
            .await
            .unwrap();
        }
        let names: Vec<(String, u64)> = fs
            .list(&sim.uri("/dir"))
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.path, s.len))
            .collect();
        let want: Vec<(String, u64)> = (0..7).map(|i| (format!("/dir/f{i}"), i as u64)).collect();
        assert_eq!(names, want, "with {extra:?}");
        assert!(
            fs.list(&sim.uri("/dir-missing"))
                .await
                .unwrap_err()
                .is_not_found()
        );
        fs.mkdirs(&sim.uri("/empty")).await.unwrap();
        assert!(fs.list(&sim.uri("/empty")).await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn hadoop_conf_dir_resolves_hdfs_uris() {
    let sim = Sim::start(&[]);
    let conf_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        conf_dir.path().join("core-site.xml"),
        "<configuration><property><name>fs.defaultFS</name><value>hdfs://sandbox</value></property></configuration>",
    )
    .unwrap();
    std::fs::write(
        conf_dir.path().join("hdfs-site.xml"),
        format!(
            r#"<?xml version="1.0"?>
<configuration>
  <property><name>dfs.nameservices</name><value>sandbox</value></property>
  <property><name>dfs.ha.namenodes.sandbox</name><value>nn1</value></property>
  <property><name>sim.nn</name><value>{}</value></property>
  <property><name>dfs.namenode.http-address.sandbox.nn1</name><value>${{sim.nn}}</value></property>
</configuration>"#,
            sim.authority()
        ),
    )
    .unwrap();
    let conf = HadoopConf::from_dir(conf_dir.path()).unwrap();
    let fs = FileSystem::new(conf, WebHdfsOptions::default().with_user("alice"));
    fs.create("hdfs://sandbox/x/y.txt", Bytes::from_static(b"y"), false)
        .await
        .unwrap();
    // hdfs:///path uses fs.defaultFS
    assert_eq!(fs.status("hdfs:///x/y.txt").await.unwrap().len, 1);
}

#[tokio::test]
async fn malformed_responses_are_errors_naming_endpoint_and_status() {
    use axum::Router;
    use axum::http::StatusCode;
    let router = Router::new().fallback(async |uri: axum::http::Uri| {
        let q = uri.query().unwrap_or("");
        if q.contains("op=GETFILESTATUS") {
            (StatusCode::OK, "this is not json")
        } else if q.contains("op=LISTSTATUS_BATCH") {
            (
                StatusCode::OK,
                r#"{"DirectoryListing":{"partialListing":{"FileStatuses":{"FileStatus":[]}},"remainingEntries":3}}"#,
            )
        } else if q.contains("op=OPEN") {
            (StatusCode::TEMPORARY_REDIRECT, "")
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "<html>boom</html>")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let base = format!("http://{addr}");
    let client = WebHdfsClient::new(
        vec![base.clone()],
        WebHdfsOptions::default().with_retry(fast_retry(2)),
    )
    .unwrap();

    let err = client.get_file_status("/x").await.unwrap_err();
    assert!(
        matches!(err, HdfsError::MalformedResponse { status: 200, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&base) && msg.contains("200") && msg.contains("GETFILESTATUS"),
        "{msg}"
    );

    let err = client.list_status("/x").await.unwrap_err();
    assert!(err.to_string().contains("remainingEntries"), "{err}");

    let err = client.open("/x", 0, None).await.unwrap_err();
    assert!(err.to_string().contains("Location"), "{err}");

    // 500 with an HTML body: retried, then reported with the body quoted.
    let err = client.delete("/x", false).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("500") && msg.contains("boom") && msg.contains("DELETE"),
        "{msg}"
    );
    server.abort();
}

// ---- splits over WebHDFS ------------------------------------------------

#[derive(Debug, Clone)]
struct Content {
    lines: Vec<String>,
    crlf: Vec<bool>,
    trailing_newline: bool,
}

impl Content {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, l) in self.lines.iter().enumerate() {
            out.extend_from_slice(l.as_bytes());
            if i + 1 < self.lines.len() || self.trailing_newline {
                out.extend_from_slice(if self.crlf[i] { b"\r\n" } else { b"\n" });
            }
        }
        out
    }

    fn expected(&self) -> Vec<String> {
        let mut lines = self.lines.clone();
        if !self.trailing_newline && lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        lines
    }
}

fn content() -> impl Strategy<Value = Content> {
    (
        prop::collection::vec("[ab é]{0,10}", 0..20),
        prop::collection::vec(any::<bool>(), 20),
        any::<bool>(),
    )
        .prop_map(|(lines, crlf, trailing_newline)| Content {
            lines,
            crlf,
            trailing_newline,
        })
}

fn read_all(
    rt: &tokio::runtime::Runtime,
    fs: &FileSystem,
    splits: &[Split],
    ra: u64,
) -> Vec<String> {
    rt.block_on(async {
        let mut out = Vec::new();
        for s in splits {
            let d = read_split_with_read_ahead(fs, s, ra).await.unwrap();
            for r in d.records() {
                out.push(String::from_utf8(r.to_vec()).unwrap());
            }
        }
        out
    })
}

#[test]
fn splits_over_webhdfs_yield_every_record_once_in_order() {
    let sim = Sim::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fs = fs_as("alice");
    let case = std::sync::atomic::AtomicU32::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(48));
    runner
        .run(
            &(
                content(),
                prop::collection::vec(any::<prop::sample::Index>(), 0..6),
                1u64..6,
            ),
            |(c, cuts, ra)| {
                let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let uri = sim.uri(&format!("/prop/case-{n}.txt"));
                let bytes = c.bytes();
                rt.block_on(fs.create(&uri, Bytes::from(bytes.clone()), true))
                    .unwrap();
                let mut points: Vec<u64> = cuts
                    .iter()
                    .map(|i| i.index(bytes.len() + 1) as u64)
                    .collect();
                points.extend([0, bytes.len() as u64]);
                points.sort_unstable();
                let splits: Vec<Split> = points
                    .windows(2)
                    .map(|w| Split {
                        uri: uri.clone(),
                        start: w[0],
                        end: w[1],
                    })
                    .collect();
                prop_assert_eq!(read_all(&rt, &fs, &splits, ra), c.expected());
                Ok(())
            },
        )
        .unwrap();

    // Planned splits over a listed directory, several files.
    let files = [
        "a\nbb\nccc\n".repeat(50),
        String::new(),
        "x\r\ny\r\nz".repeat(40),
    ];
    let mut expected = Vec::new();
    for (i, text) in files.iter().enumerate() {
        rt.block_on(fs.create(
            &sim.uri(&format!("/multi/part-{i}")),
            Bytes::from(text.clone()),
            false,
        ))
        .unwrap();
        expected.extend(
            Content {
                lines: text
                    .split('\n')
                    .map(|l| l.trim_end_matches('\r').to_string())
                    .collect(),
                crlf: vec![false; 1000],
                trailing_newline: false,
            }
            .expected(),
        );
    }
    let listed = rt.block_on(fs.list(&sim.uri("/multi"))).unwrap();
    for n in [1, 3, 7, 20] {
        let splits = plan_splits(&listed, n);
        assert!(splits.len() >= n);
        assert_eq!(read_all(&rt, &fs, &splits, 16), expected, "n = {n}");
    }
}

/// RENAME with `renameoptions` is Hadoop's rename2, as a real NameNode
/// (3.4.2) answers it: an empty 200 that moved the file, and exceptions, not
/// `{"boolean": false}`, when it cannot.
#[tokio::test]
async fn rename_with_options_is_rename2() {
    let sim = Sim::start(&[]);
    let fs = FileSystem::default();
    fs.create(&sim.uri("/r/a"), Bytes::from_static(b"a"), true)
        .await
        .unwrap();
    fs.create(&sim.uri("/r/b"), Bytes::from_static(b"b"), true)
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let rename = |src: &str, dst: &str, opts: &str| {
        format!(
            "{}/webhdfs/v1{src}?op=RENAME&destination={dst}&renameoptions={opts}&user.name=alice",
            sim.namenode
        )
    };
    let send = |url: String| {
        let http = http.clone();
        async move {
            let r = http.put(&url).send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            (status, body)
        }
    };
    // Moved, empty body.
    assert_eq!(
        send(rename("/r/a", "/r/c", "NONE")).await,
        (200, String::new())
    );
    assert!(sim.root.join("r/c").is_file() && !sim.root.join("r/a").exists());
    // An existing destination: refused without OVERWRITE, replaced with it.
    let (st, body) = send(rename("/r/c", "/r/b", "NONE")).await;
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("FileAlreadyExistsException"), "{body}");
    assert_eq!(send(rename("/r/c", "/r/b", "OVERWRITE")).await.0, 200);
    assert_eq!(std::fs::read(sim.root.join("r/b")).unwrap(), b"a");
    // A missing source, a missing destination parent.
    let (st, body) = send(rename("/r/zz", "/r/q", "NONE")).await;
    assert_eq!(st, 404, "{body}");
    assert!(body.contains("rename source /r/zz is not found."), "{body}");
    let (st, body) = send(rename("/r/b", "/nope/q", "NONE")).await;
    assert_eq!(st, 404, "{body}");
    assert!(
        body.contains("rename destination parent /nope/q not found."),
        "{body}"
    );
    // A directory destination is not moved into: the kinds differ.
    let (st, body) = send(rename("/r/b", "/r", "NONE")).await;
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("IOException"), "{body}");
}
