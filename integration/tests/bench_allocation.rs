//! Benchmark (not run by CI): time from a container request to the evaluator
//! registered with the AM, for the local runtime, the YARN simulator and the
//! Mesos simulator.
//!
//! Each round requests 4 containers running the real `cruise evaluator`
//! through the `ResourceManager` trait and accepts their control
//! connections with the AM's own acceptor (the handshake proves the job
//! secret: that is registration). Printed: the median over rounds of the
//! time until the first and until the last of the 4 registered.
//!
//! Run it (release binaries make the evaluator start faster; the numbers are
//! dominated by the runtimes' polling and allocation intervals):
//!
//! ```text
//! cargo build --release -p cruise-appmaster -p cruise-sim
//! cargo test --release -p cruise-integration --test bench_allocation -- --ignored --nocapture
//! ```
//!
//! With `CRUISE_HADOOP_DIR` set (a real Hadoop started by
//! `integration/hadoop/start.sh DIR`) it also measures real YARN: the same
//! requests through the Services API of a real RM, whose service AM (Hadoop's
//! ServiceMaster, a JVM) gets the containers and a real NodeManager launches
//! the same `cruise evaluator` binary.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cruise_appmaster::am::Event;
use cruise_appmaster::am::control::{AcceptSettings, accept_loop};
use cruise_conf::ChannelConfig;
use cruise_container::evaluator::{ENV_AM_ADDR, ENV_JOB_ID, ENV_JOB_SECRET};
use cruise_container::protocol::{FrameOptions, Secret};
use cruise_integration::{Sim, binary};
use cruise_rm::http::HttpOptions;
use cruise_rm::local::{LocalConfig, LocalRm};
use cruise_rm::mesos::{MesosConfig, MesosRm};
use cruise_rm::yarn::{YarnConfig, YarnRm};
use cruise_rm::{ContainerRequest, LaunchSpec, ResourceManager, RmEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const ROUNDS: usize = 5;
const COUNT: u32 = 4;

type Factory =
    Box<dyn Fn(LaunchSpec, mpsc::UnboundedSender<RmEvent>, usize) -> Arc<dyn ResourceManager>>;

fn yarn_config(url: &str, i: usize, tag: &str, tarball: Option<String>) -> YarnConfig {
    YarnConfig {
        rm_addresses: vec![url.to_string()],
        user: Some("bench".into()),
        http: HttpOptions::default(),
        service_name: format!("cruise-bench-{tag}-{i}"),
        component: "evaluator".into(),
        queue: "default".into(),
        tarball,
        lifetime_secs: None,
        poll_interval: Duration::from_millis(500),
        capacity_poll_interval: Duration::from_secs(5),
        decommission_poll_interval: Duration::from_secs(5),
        decommission_default_timeout: Duration::from_secs(3600),
        min_allocation_mb: 1024,
        default_size: (1024, 1),
    }
}

async fn round(make: &Factory, i: usize, work: &std::path::Path) -> (Duration, Duration) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let secret = Secret::generate();
    let job = format!("job_bench_{i}");
    let (ev_tx, mut ev_rx) = mpsc::channel::<Event>(64);
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    tracker.spawn(accept_loop(
        listener,
        AcceptSettings {
            job_id: job.clone(),
            secret: secret.clone(),
            frames: FrameOptions::control(&ChannelConfig::default()),
            timeout: Duration::from_secs(10),
        },
        ev_tx,
        tracker.clone(),
        cancel.clone(),
    ));
    let launch = LaunchSpec {
        program: binary("cruise").unwrap().display().to_string(),
        args: vec!["evaluator".into()],
        env: BTreeMap::from([
            (ENV_AM_ADDR.to_string(), addr.to_string()),
            (ENV_JOB_ID.to_string(), job),
            (ENV_JOB_SECRET.to_string(), secret.to_hex()),
            ("RUST_LOG".to_string(), "warn".to_string()),
        ]),
        work_dir: work.to_path_buf(),
    };
    let (tx, _rx) = mpsc::unbounded_channel();
    let rm = make(launch, tx, i);
    let t0 = Instant::now();
    rm.request(ContainerRequest {
        count: COUNT,
        memory_mb: 1024,
        cores: 1,
        hosts: vec![],
    })
    .await
    .unwrap();
    let mut first = None;
    let mut conns = Vec::new();
    while conns.len() < COUNT as usize {
        match tokio::time::timeout(Duration::from_secs(120), ev_rx.recv()).await {
            Ok(Some(Event::Accepted { framed, .. })) => {
                first.get_or_insert(t0.elapsed());
                conns.push(framed);
            }
            Ok(Some(_)) => {}
            other => panic!("no registration: {}", other.is_ok()),
        }
    }
    let last = t0.elapsed();
    drop(conns);
    rm.shutdown().await.unwrap();
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    (first.unwrap_or(last), last)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn measure(name: &str, make: Factory) {
    let work = tempfile::tempdir().unwrap();
    let mut firsts = Vec::new();
    let mut lasts = Vec::new();
    for i in 0..ROUNDS {
        let (f, l) = round(&make, i, work.path()).await;
        firsts.push(f);
        lasts.push(l);
    }
    println!(
        "{name:<14} request -> evaluator registered: first of {COUNT} {:>7.0} ms, all {COUNT} {:>7.0} ms (median of {ROUNDS}; all rounds: {:?})",
        median(firsts).as_secs_f64() * 1e3,
        median(lasts.clone()).as_secs_f64() * 1e3,
        lasts
            .iter()
            .map(|d| (d.as_secs_f64() * 1e3).round() as u64)
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn request_to_registered() {
    println!(
        "runtime        (defaults: YARN service poll 500 ms, sim scheduler tick 200 ms; Mesos allocation interval 1 s)"
    );
    measure(
        "local",
        Box::new(|launch, tx, i| {
            Arc::new(LocalRm::start(
                LocalConfig {
                    max_containers: 8,
                    release_grace: Duration::from_secs(2),
                    id_prefix: format!("container_bench{i}"),
                    capacity_schedule: Vec::new(),
                    reclaim_deadline: Duration::from_secs(30),
                },
                launch,
                tx,
            ))
        }),
    )
    .await;

    if let Some(h) =
        cruise_integration::hadoop::RealHadoop::from_env("bench_allocation (real YARN)").unwrap()
    {
        let url = h.rm_url();
        measure(
            "yarn-real",
            Box::new(move |launch, tx, i| {
                let mut c = yarn_config(&url, i, "real", None);
                c.user = Some("alice".into());
                c.min_allocation_mb = 128;
                c.service_name = format!("cruise-bench-real-{}-{i}", std::process::id());
                Arc::new(YarnRm::start(c, launch, tx).unwrap())
            }),
        )
        .await;
    }

    let yarn = Sim::start("yarn", &[]).unwrap();
    let url = yarn.url.clone();
    measure(
        "yarn-sim",
        Box::new(move |launch, tx, i| {
            Arc::new(YarnRm::start(yarn_config(&url, i, "plain", None), launch, tx).unwrap())
        }),
    )
    .await;

    // As `cruise submit` runs evaluators: the binary comes as a TARBALL
    // artifact from (simulated) HDFS and is unpacked in every container.
    let hdfs = Sim::start("webhdfs", &[]).unwrap();
    let yarn2 = Sim::start("yarn", &["--webhdfs", &hdfs.url]).unwrap();
    let exe = std::fs::read(binary("cruise").unwrap()).unwrap();
    let tar = cruise_appmaster::tarball::build(&[cruise_appmaster::tarball::Entry {
        path: "cruise",
        mode: 0o755,
        mtime: 0,
        data: &exe,
    }])
    .unwrap();
    let nn = hdfs.address();
    cruise_hdfs::FileSystem::default()
        .create(
            &format!("webhdfs://{nn}/bench/cruise.tar"),
            bytes::Bytes::from(tar),
            true,
        )
        .await
        .unwrap();
    let tar_uri = format!("hdfs://{nn}/bench/cruise.tar");
    let url2 = yarn2.url.clone();
    println!(
        "(tarball: {:.0} MB binary)",
        exe.len() as f64 / (1 << 20) as f64
    );
    measure(
        "yarn-sim+tar",
        Box::new(move |mut launch, tx, i| {
            launch.program = "./lib/cruise".into();
            Arc::new(
                YarnRm::start(
                    yarn_config(&url2, i, "tar", Some(tar_uri.clone())),
                    launch,
                    tx,
                )
                .unwrap(),
            )
        }),
    )
    .await;

    let mesos = Sim::start("mesos", &[]).unwrap();
    let master = mesos.address();
    measure(
        "mesos-sim",
        Box::new(move |launch, tx, i| {
            Arc::new(
                MesosRm::start(
                    MesosConfig {
                        masters: vec![master.clone()],
                        http: HttpOptions::default(),
                        user: "bench".into(),
                        framework_name: "cruise-bench".into(),
                        role: "*".into(),
                        failover_timeout_secs: 60.0,
                        refuse_seconds: 5.0,
                        missed_heartbeats: 5,
                        task_prefix: format!("bench{i}"),
                        evaluator_uri: None,
                        kill_grace: Duration::from_secs(2),
                        default_size: (1024, 1),
                    },
                    launch,
                    tx,
                )
                .unwrap(),
            )
        }),
    )
    .await;
}
