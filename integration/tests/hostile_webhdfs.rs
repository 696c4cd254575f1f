//! The WebHDFS client against namenodes and datanodes that misbehave: each
//! server is a [`HostileServer`] on a real socket. What is checked: the
//! memory a server can make the client use (bounded by what the client
//! accepted off the socket), the time an operation can take, how often it
//! is retried, and that the error names the endpoint and the limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cruise_hdfs::webhdfs::RetryPolicy;
use cruise_hdfs::{HdfsError, WebHdfsClient, WebHdfsOptions};
use cruise_integration::hostile::{
    HostileServer, Reply, Request, webhdfs_batch, webhdfs_endless_batch, webhdfs_redirect,
    webhdfs_status,
};
use serde_json::json;

/// What a client may take off a socket beyond its limit before it stops
/// reading: socket buffers on loopback and the HTTP client's own buffer.
const SOCKET_SLACK: u64 = 32 << 20;

fn options() -> WebHdfsOptions {
    WebHdfsOptions {
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        },
        ..WebHdfsOptions::default()
    }
    .with_user("cruise")
}

/// `f`, failing the test if it is not done within a minute (the client's
/// own bounds are all shorter).
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the client did not give up within 60 s")
}

fn client(nn: &HostileServer, options: WebHdfsOptions) -> WebHdfsClient {
    WebHdfsClient::new(vec![nn.url()], options).expect("client")
}

/// A namenode that redirects every OPEN to `datanode` and answers nothing
/// else.
async fn redirecting_namenode(datanode: String) -> HostileServer {
    HostileServer::start(move |r: &Request| webhdfs_redirect(&datanode, r))
        .await
        .expect("namenode")
}

#[tokio::test]
async fn open_stops_reading_at_the_range_asked_for() {
    let dn = HostileServer::start(|_: &Request| Reply::Endless {
        status: 200,
        prefix: Vec::new(),
        chunk: vec![b'1'; 64 << 10],
    })
    .await
    .unwrap();
    let nn = redirecting_namenode(dn.url()).await;
    let t = Instant::now();
    let err = within(client(&nn, options()).open("/data/x", 0, Some(49_000)))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HdfsError::TooLarge { .. }), "{msg}");
    assert!(msg.contains("past 49000 bytes"), "{msg}");
    assert!(msg.contains("the length asked for"), "{msg}");
    assert!(msg.contains(&dn.url()), "names the datanode: {msg}");
    assert_eq!(dn.requests(), 1, "a body too long is not asked for again");
    assert!(
        dn.bytes_sent() < 49_000 + SOCKET_SLACK,
        "the client took {} bytes off the socket",
        dn.bytes_sent()
    );
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn open_refuses_a_body_announced_longer_than_the_range() {
    let dn = HostileServer::start(|_: &Request| Reply::Truncated {
        status: 200,
        length: 1 << 40,
        body: vec![b'1'; 10],
    })
    .await
    .unwrap();
    let nn = redirecting_namenode(dn.url()).await;
    let msg = within(client(&nn, options()).open("/data/x", 0, Some(1000)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!("announces {} bytes", 1u64 << 40)),
        "{msg}"
    );
    assert_eq!(dn.requests(), 1);
}

#[tokio::test]
async fn a_truncated_body_is_retried_and_named_as_such() {
    let data = b"0123456789".repeat(100);
    let calls = Arc::new(AtomicU64::new(0));
    let (c, d) = (Arc::clone(&calls), data.clone());
    // The first answer closes after 10 of its 1000 bytes; the next is whole.
    let dn = HostileServer::start(move |_: &Request| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::Truncated {
                status: 200,
                length: 1000,
                body: d[..10].to_vec(),
            }
        } else {
            Reply::Full {
                status: 200,
                headers: Vec::new(),
                body: d.clone(),
            }
        }
    })
    .await
    .unwrap();
    let nn = redirecting_namenode(dn.url()).await;
    let got = within(client(&nn, options()).open("/data/x", 0, Some(1000)))
        .await
        .unwrap();
    assert_eq!(&got[..], &data[..]);
    assert_eq!(dn.requests(), 2);

    // Always truncated: retried up to the attempts, then named.
    let dn = HostileServer::start(|_: &Request| Reply::Truncated {
        status: 200,
        length: 1000,
        body: vec![b'1'; 10],
    })
    .await
    .unwrap();
    let nn = redirecting_namenode(dn.url()).await;
    let msg = within(client(&nn, options()).open("/data/x", 0, Some(1000)))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("gave up after 3 attempts"), "{msg}");
    assert!(
        msg.contains("the body ended after 10 of 1000 bytes"),
        "{msg}"
    );
    assert_eq!(dn.requests(), 3);
}

#[tokio::test]
async fn a_json_answer_is_read_up_to_the_limit_only() {
    let nn = HostileServer::start(|_: &Request| webhdfs_endless_batch())
        .await
        .unwrap();
    let opts = WebHdfsOptions {
        max_response_bytes: 1 << 20,
        ..options()
    };
    let msg = within(client(&nn, opts).list_status("/data"))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("hdfs.max_response_bytes"), "{msg}");
    assert!(msg.contains("LISTSTATUS_BATCH"), "{msg}");
    assert_eq!(nn.requests(), 1);
    assert!(
        nn.bytes_sent() < (1 << 20) + SOCKET_SLACK,
        "{}",
        nn.bytes_sent()
    );
}

/// A namenode whose LISTSTATUS_BATCH always has one more entry to give.
fn endless_batches(
    name_after: impl Fn(&str) -> String + Send + Sync + 'static,
) -> impl Fn(&Request) -> Reply + Send + Sync + 'static {
    move |r: &Request| {
        let after = r.param("startAfter").unwrap_or("");
        let name = name_after(after);
        webhdfs_batch(&[webhdfs_status(&name, "FILE", 10)], 1)
    }
}

#[tokio::test]
async fn a_listing_that_never_ends_stops_at_the_entry_limit() {
    let nn = HostileServer::start(endless_batches(|after| format!("{after}a")))
        .await
        .unwrap();
    let opts = WebHdfsOptions {
        max_list_entries: 200,
        ..options()
    };
    let msg = within(client(&nn, opts).list_status("/data"))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("hdfs.max_list_entries"), "{msg}");
    assert!(nn.requests() <= 200, "{} pages asked for", nn.requests());
}

#[tokio::test]
async fn a_listing_that_does_not_advance_fails_at_once() {
    let nn = HostileServer::start(endless_batches(|_| "same".to_string()))
        .await
        .unwrap();
    let msg = within(client(&nn, options()).list_status("/data"))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no entry after \"same\""), "{msg}");
    assert_eq!(nn.requests(), 2);
}

#[tokio::test]
async fn a_listing_announcing_too_many_entries_fails_at_once() {
    let nn = HostileServer::start(|_: &Request| {
        webhdfs_batch(&[webhdfs_status("a", "FILE", 10)], 1_000_000_000_000)
    })
    .await
    .unwrap();
    let msg = within(client(&nn, options()).list_status("/data"))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("remainingEntries 1000000000000"), "{msg}");
    assert_eq!(nn.requests(), 1);
}

#[tokio::test]
async fn a_silent_namenode_is_given_up_at_the_deadline() {
    let nn = HostileServer::start(|_: &Request| Reply::Silent)
        .await
        .unwrap();
    let opts = WebHdfsOptions {
        deadline: Some(Duration::from_millis(1500)),
        ..options()
    };
    let t = Instant::now();
    let err = within(client(&nn, opts).get_file_status("/data/x"))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HdfsError::DeadlineExceeded { .. }), "{msg}");
    assert!(
        msg.contains(&format!("still waiting for {}", nn.url())),
        "{msg}"
    );
    assert!(t.elapsed() >= Duration::from_millis(1500));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_trickling_datanode_is_given_up_at_the_deadline() {
    let dn = HostileServer::start(|_: &Request| Reply::Trickle {
        status: 200,
        length: 1000,
        every: Duration::from_millis(100),
    })
    .await
    .unwrap();
    let nn = redirecting_namenode(dn.url()).await;
    let opts = WebHdfsOptions {
        deadline: Some(Duration::from_secs(2)),
        ..options()
    };
    let t = Instant::now();
    let msg = within(client(&nn, opts).open("/data/x", 0, Some(1000)))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("deadline 2 s"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

#[tokio::test]
async fn an_endless_error_body_is_cut_and_the_status_kept() {
    let nn = HostileServer::start(|_: &Request| Reply::Endless {
        status: 500,
        prefix: b"<html>".to_vec(),
        chunk: vec![b'e'; 64 << 10],
    })
    .await
    .unwrap();
    let msg = within(client(&nn, options()).get_file_status("/data/x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("HTTP 500"), "{msg}");
    assert!(msg.contains("gave up after 3 attempts"), "{msg}");
    assert_eq!(nn.requests(), 3);
    assert!(nn.bytes_sent() < 3 * SOCKET_SLACK, "{}", nn.bytes_sent());
}

#[tokio::test]
async fn an_absurd_file_length_is_rejected() {
    let nn = HostileServer::start(|_: &Request| {
        Reply::json(
            200,
            &json!({"FileStatus": webhdfs_status("", "FILE", 1_000_000_000_000_000_000)}),
        )
    })
    .await
    .unwrap();
    let msg = within(client(&nn, options()).get_file_status("/data/x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("length 1000000000000000000"), "{msg}");
    assert!(msg.contains("GETFILESTATUS"), "{msg}");
}

/// A namenode that answers `503` with `Retry-After: 1` twice is asked
/// again after at least the second it asked for each time, not after the
/// client's own 10 ms and 20 ms.
#[tokio::test]
async fn retry_after_is_honoured() {
    let ok = Reply::json(200, &json!({"FileStatus": webhdfs_status("", "FILE", 7)}));
    let nn = HostileServer::busy_then(2, || "1".into(), ok)
        .await
        .unwrap();
    let t = Instant::now();
    let st = within(client(&nn, options()).get_file_status("/data/x"))
        .await
        .expect("the third answer");
    assert_eq!(st.len, 7);
    assert_eq!(nn.requests(), 3);
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
}

/// `Retry-After` as an HTTP date three seconds ahead: the namenode is asked
/// again when it said (at least a second later, at the date's whole-second
/// resolution), not after the client's own 10 ms.
#[tokio::test]
async fn retry_after_as_a_date_is_honoured() {
    let ok = Reply::json(200, &json!({"FileStatus": webhdfs_status("", "FILE", 7)}));
    let nn = HostileServer::busy_then(
        1,
        || httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3)),
        ok,
    )
    .await
    .unwrap();
    let t = Instant::now();
    let st = within(client(&nn, options()).get_file_status("/data/x"))
        .await
        .expect("the second answer");
    assert_eq!(st.len, 7);
    assert_eq!(nn.requests(), 2);
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
}
