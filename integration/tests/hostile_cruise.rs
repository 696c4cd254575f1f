//! `cruise run` against a namenode or datanode that misbehaves: the whole
//! program in its own process, its peak memory (and its evaluators') taken
//! from `wait4`, its exit code, the message it ends with, and that no
//! process of the job is left.

use std::process::Command;
use std::time::{Duration, Instant};

use cruise_integration::hostile::{
    HostileServer, Measured, Reply, Request, webhdfs_endless_batch, webhdfs_one_file,
};
use cruise_integration::{Sim, binary, processes_under, wait_until};
use nix::sys::signal::Signal;

/// The most memory a job against a hostile server may take: the response
/// limit (64 MiB by default) and the program itself, with room to spare,
/// and far below what an unbounded read reaches.
const MAX_PEAK_RSS: u64 = 256 << 20;

fn cruise(input: &str, work: &std::path::Path) -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG")
        .env_remove("HADOOP_CONF_DIR")
        .args(["run", "-n", "2", "-w", "1", "-e", "1", "--input", input])
        .arg("--work-dir")
        .arg(work);
    c
}

/// Waits until nothing of the job runs in its work directory.
async fn nothing_left(work: &std::path::Path) {
    wait_until(Duration::from_secs(10), || {
        processes_under(work).is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("processes left behind: {:?}", processes_under(work)));
}

/// Starts a job on a namenode that never answers, waits until it is asked
/// (and, with `progress`, until the job says it still waits), sends
/// `signal` and checks that the job stops at once, naming the wait.
async fn signal_stops_input_planning(signal: Signal, progress: bool) {
    let nn = HostileServer::start(|_: &Request| Reply::Silent)
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let input = format!("webhdfs://{}/data", nn.addr);
    let mut c = cruise(&input, work.path());
    // Only the signal may end the wait.
    c.args(["--set", "hdfs.deadline_ms=600000"]);
    c.args(["--set", "hdfs.request_timeout_ms=600000"]);
    c.args(["--set", "hdfs.read_timeout_ms=600000"]);
    let mut job = Measured::spawn(c).unwrap();
    wait_until(Duration::from_secs(60), || {
        (nn.requests() >= 1).then_some(())
    })
    .await
    .expect("the namenode is asked");
    if progress {
        job.wait_for_stderr(
            &format!(
                "WebHDFS LISTSTATUS_BATCH /data: no answer yet after 10 s (namenode http://{}",
                nn.addr
            ),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    }
    let signalled = Instant::now();
    job.signal(signal).unwrap();
    let out = job.wait(Duration::from_secs(30)).await.unwrap();
    let stderr = job.stderr();
    eprintln!(
        "stopped {:.2} s after {signal}, peak RSS {} KiB",
        signalled.elapsed().as_secs_f64(),
        out.peak_rss_bytes >> 10
    );
    assert_eq!(out.code, Some(1), "{out:?}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "job cancelled while planning the input: waiting for the WebHDFS namenode of webhdfs://{} to list {input}",
            nn.addr
        )),
        "{stderr}"
    );
    nothing_left(work.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_input_planning_on_a_silent_namenode() {
    // Progress is printed while it waits.
    signal_stops_input_planning(Signal::SIGTERM, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_input_planning_on_a_silent_namenode() {
    signal_stops_input_planning(Signal::SIGINT, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_namenode_fails_the_job_at_its_deadline() {
    let nn = HostileServer::start(|_: &Request| Reply::Silent)
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut c = cruise(&format!("webhdfs://{}/data", nn.addr), work.path());
    c.args(["--set", "hdfs.deadline_ms=2000"]);
    let mut job = Measured::spawn(c).unwrap();
    let out = job.wait(Duration::from_secs(60)).await.unwrap();
    let stderr = job.stderr();
    assert_eq!(out.code, Some(1), "{out:?}\n{stderr}");
    assert!(stderr.contains("deadline 2 s"), "{stderr}");
    assert!(
        stderr.contains(&format!("still waiting for http://{}", nn.addr)),
        "{stderr}"
    );
    nothing_left(work.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_listing_is_read_up_to_the_limit() {
    let nn = HostileServer::start(|_: &Request| webhdfs_endless_batch())
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut job =
        Measured::spawn(cruise(&format!("webhdfs://{}/data", nn.addr), work.path())).unwrap();
    let out = job.wait(Duration::from_secs(120)).await.unwrap();
    let stderr = job.stderr();
    eprintln!(
        "endless listing: peak RSS {} KiB, {} bytes taken off the socket, {:.2} s",
        out.peak_rss_bytes >> 10,
        nn.bytes_sent(),
        out.elapsed.as_secs_f64()
    );
    assert_eq!(out.code, Some(1), "{out:?}\n{stderr}");
    assert!(stderr.contains("hdfs.max_response_bytes"), "{stderr}");
    assert!(out.peak_rss_bytes < MAX_PEAK_RSS, "{out:?}");
    assert!(out.peak_rss_bytes > 0, "{out:?}");
    nothing_left(work.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_datanode_fails_the_job_with_bounded_memory() {
    let dn = HostileServer::start(|_: &Request| Reply::Endless {
        status: 200,
        prefix: Vec::new(),
        chunk: b"1 1:1\n".repeat(10_000),
    })
    .await
    .unwrap();
    let nn = HostileServer::start(webhdfs_one_file(dn.url(), 49_000))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut job = Measured::spawn(cruise(
        &format!("webhdfs://{}/data/x", nn.addr),
        work.path(),
    ))
    .unwrap();
    let out = job.wait(Duration::from_secs(120)).await.unwrap();
    let stderr = job.stderr();
    eprintln!(
        "endless datanode: peak RSS {} KiB, {} bytes taken off the socket, {:.2} s",
        out.peak_rss_bytes >> 10,
        dn.bytes_sent(),
        out.elapsed.as_secs_f64()
    );
    assert_eq!(out.code, Some(1), "{out:?}\n{stderr}");
    assert!(stderr.contains("the length asked for"), "{stderr}");
    assert!(stderr.contains(&dn.url()), "names the datanode: {stderr}");
    assert!(out.peak_rss_bytes < MAX_PEAK_RSS, "{out:?}");
    nothing_left(work.path()).await;
}

/// A Mesos master that never sends terminal task updates: the finished job
/// waits a bounded time for them, then ends with its summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_terminal_updates_does_not_hold_the_summary() {
    let mesos = Sim::start(
        "mesos",
        &["--allocation-interval-ms", "200", "--drop-terminal-updates"],
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG")
        .env_remove("HADOOP_CONF_DIR")
        .args(["run", "-n", "2", "-w", "1", "-e", "1", "--runtime", "mesos"])
        .args(["--master", &mesos.address()])
        .args(["--set", "runtime.release_grace_ms=1000"])
        .args(["--set", "channel.heartbeat_timeout_ms=3000"])
        .arg("--work-dir")
        .arg(work.path());
    let mut job = Measured::spawn(c).unwrap();
    let out = job.wait(Duration::from_secs(180)).await.unwrap();
    let (stdout, stderr) = (job.stdout(), job.stderr());
    assert_eq!(out.code, Some(0), "{out:?}\n{stderr}\n{}", mesos.log());
    assert!(stdout.contains("final accuracy"), "{stdout}");
    assert!(stderr.contains("has not reported the end of"), "{stderr}");
    nothing_left(&mesos.dir.path().join("work")).await;
}

/// An evaluator blocked on a datanode that sends a byte a second leaves
/// when its AM is killed, not when the read gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluators_blocked_on_input_leave_with_their_am() {
    let dn = HostileServer::start(|_: &Request| Reply::Trickle {
        status: 200,
        length: 1000,
        every: Duration::from_secs(1),
    })
    .await
    .unwrap();
    let nn = HostileServer::start(webhdfs_one_file(dn.url(), 1_000_000))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut c = cruise(&format!("webhdfs://{}/data/x", nn.addr), work.path());
    c.args(["--set", "hdfs.deadline_ms=600000"]);
    c.args(["--set", "hdfs.request_timeout_ms=600000"]);
    let mut job = Measured::spawn(c).unwrap();
    wait_until(Duration::from_secs(60), || {
        (dn.requests() >= 1).then_some(())
    })
    .await
    .expect("an evaluator reads from the datanode");
    assert!(
        !processes_under(work.path()).is_empty(),
        "the evaluators run in the work dir; stderr:\n{}",
        job.stderr()
    );
    job.signal(Signal::SIGKILL).unwrap();
    let out = job.wait(Duration::from_secs(30)).await.unwrap();
    assert_eq!(out.signal, Some(9), "{out:?}");
    let left = Instant::now();
    nothing_left(work.path()).await;
    eprintln!(
        "evaluators gone {:.2} s after their AM was killed",
        left.elapsed().as_secs_f64()
    );
}
