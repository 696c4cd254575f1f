//! Shared pieces of the benchmarks (`src/bin/bench-*.rs`): statistics, the
//! `iperf3` loopback reference, the result table, and the data planes the
//! in-process benchmarks run on.
//!
//! Every benchmark measures its own reference in the same invocation and
//! prints its figures as ratios to it: the machines are shared and noisy,
//! so absolute figures from different runs are not comparable, ratios taken
//! seconds apart are.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use cruise_conf::ChannelConfig;
use cruise_container::peer::{DataPlane, PeerSettings};
use cruise_container::protocol::{
    BlockId, EvaluatorId, Faults, FrameOptions, Key, OwnershipUpdate, Secret, TableId,
};
use cruise_container::store::{ModelFunctions, Store};

use crate::Spawned;

/// Prints `usage` and exits with status 0 when the command line asks for
/// help (`-h` or `--help` anywhere): the benchmarks take positional
/// arguments, which would otherwise read the flag as a bad number. A
/// reader that stops early (`| head`) is not an error.
pub fn exit_on_help(usage: &str) {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{}", usage.trim_end());
        std::process::exit(0);
    }
}

/// The repetitions asked for as the first argument, `default` without one.
pub fn reps_arg(default: usize) -> anyhow::Result<usize> {
    match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .with_context(|| format!("REPS {a:?} is not a number")),
        None => Ok(default),
    }
}

/// The median of `v` (sorted in place; the mean of the middle two when the
/// count is even); NaN if empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`-th percentile of `v` (nearest rank; sorted in place); NaN if empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Bytes per second as MB/s (10^6).
pub fn mb_s(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1e6
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Single-stream TCP throughput on 127.0.0.1 measured by `iperf3` (server
/// `-s -1` on a free port, client `-J` for `secs` seconds), in bytes/s.
pub async fn iperf3_loopback(secs: u32) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let mut server = Command::new("iperf3");
    server.args(["-s", "-1", "-B", "127.0.0.1", "-p", &port]);
    let mut server = Spawned::spawn(server)
        .context("starting `iperf3 -s` (not installed? run integration/bench/setup.sh)")?;
    // The server is ready when it accepts; a refused client is retried.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let bps = loop {
        let out = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                &port,
                "-J",
                "-t",
                &secs.to_string(),
            ])
            .output()
            .await
            .context("running `iperf3 -c`")?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if let Some(bps) = v["end"]["sum_received"]["bits_per_second"].as_f64()
            && out.status.success()
        {
            break bps;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "iperf3 client failed ({}): {text}\nserver stderr: {}",
                out.status,
                server.stderr()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = server.wait(Duration::from_secs(10)).await;
    Ok(bps / 8.0)
}

/// One line of a result table.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub figure: String,
    /// The figure (with its unit).
    pub value: String,
    /// The reference measured in the same run (with its unit), if any.
    pub reference: String,
    /// figure / reference, if meaningful.
    pub ratio: Option<f64>,
    /// The target, in words.
    pub target: String,
    /// Whether the target is met, if there is one.
    pub pass: Option<bool>,
}

impl Row {
    /// A row without a reference or target.
    pub fn plain(figure: impl Into<String>, value: impl Into<String>) -> Row {
        Row {
            figure: figure.into(),
            value: value.into(),
            reference: "—".into(),
            ratio: None,
            target: "—".into(),
            pass: None,
        }
    }
}

/// Prints a Markdown table of rows (the format of `BENCHMARKS.md`).
pub fn print_table(title: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| figure | value | reference (same run) | ratio | target | result |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.figure,
            r.value,
            r.reference,
            r.ratio.map_or("—".to_string(), |x| format!("{x:.2}×")),
            r.target,
            match r.pass {
                Some(true) => "pass",
                Some(false) => "FAIL",
                None => "—",
            }
        );
    }
}

/// What the machine was doing: cores and load average (benchmarks note it,
/// since the machines are shared).
pub fn machine_note() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    format!("{cores} cores, load average {load}")
}

/// The `cruise` release binary beside this benchmark, built first with
/// `cargo build --release` (a no-op when it is up to date).
pub fn cruise_release_binary() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(&cargo)
        .args([
            "build",
            "--release",
            "-q",
            "-p",
            "cruise-appmaster",
            "--bin",
            "cruise",
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
        .status()
        .with_context(|| format!("running {cargo} build"))?;
    if !status.success() {
        bail!("cargo build --release -p cruise-appmaster failed ({status})");
    }
    crate::binary("cruise")
}

/// The app-less model of the in-process benchmarks: values of `len` floats,
/// zero at first, updated by adding.
pub struct AddModel {
    /// Floats per key.
    pub len: usize,
}

impl ModelFunctions for AddModel {
    fn value_len(&self) -> usize {
        self.len
    }
    fn init(&self, _key: Key) -> Vec<f32> {
        vec![0.0; self.len]
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        for (v, d) in value.iter_mut().zip(delta) {
            *v += d;
        }
    }
}

/// Data-plane settings as an evaluator has them with the default
/// configuration.
pub fn default_settings() -> PeerSettings {
    let ch = ChannelConfig::default();
    let store = cruise_conf::StoreConfig::default();
    PeerSettings {
        job_id: "job_bench_0001".into(),
        secret: Secret::generate(),
        frames: FrameOptions::data(&ch),
        connect_timeout: Duration::from_millis(ch.connect_timeout_ms),
        chunk_bytes: store.move_chunk_bytes as usize,
        drain_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_millis(store.request_timeout_ms),
    }
}

/// Several data planes in this process, each with its own store, joined
/// over loopback like evaluators.
pub struct Cluster {
    /// The data planes, evaluator `i + 1` at index `i`.
    pub planes: Vec<DataPlane>,
    cancel: CancellationToken,
    version: u64,
}

impl Cluster {
    /// Starts `n` data planes with the given tables and model.
    pub async fn start(
        n: u32,
        tables: &[(TableId, u32)],
        model: Arc<dyn ModelFunctions>,
        settings: PeerSettings,
    ) -> anyhow::Result<Cluster> {
        let cancel = CancellationToken::new();
        let mut planes = Vec::new();
        for id in (1..=n).map(EvaluatorId) {
            let store = Store::new(id);
            store.configure(tables, Arc::clone(&model));
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            planes.push(DataPlane::start(
                id,
                store,
                listener,
                settings.clone(),
                Faults::default(),
                &cancel,
            )?);
        }
        let peers: Vec<(EvaluatorId, SocketAddr)> = planes
            .iter()
            .map(|p| (p.store().me(), p.local_addr()))
            .collect();
        for p in &planes {
            p.set_peers(&peers);
        }
        Ok(Cluster {
            planes,
            cancel,
            version: 0,
        })
    }

    /// The data plane of evaluator `id`.
    pub fn plane(&self, id: EvaluatorId) -> &DataPlane {
        &self.planes[id.0 as usize - 1]
    }

    /// Records new owners everywhere (the AM's broadcast).
    pub fn set_owners(&mut self, owners: Vec<(TableId, BlockId, EvaluatorId)>) {
        self.version += 1;
        let u = OwnershipUpdate {
            version: self.version,
            owners,
        };
        for p in &self.planes {
            p.store().apply_ownership(&u);
        }
    }

    /// Stops every data plane.
    pub async fn stop(self) {
        for p in &self.planes {
            p.stop().await;
        }
        self.cancel.cancel();
    }
}
