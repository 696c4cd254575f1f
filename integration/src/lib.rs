//! Support for the end-to-end tests and benchmarks: finding the built
//! binaries, running them with their output captured, waiting on conditions
//! with deadlines, reading the AM's status endpoint, a scriptable fake AM
//! that drives one real evaluator process over the real control protocol, and
//! the shared pieces of the benchmarks ([`bench`]).

pub mod bench;
pub mod fake_am;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A binary built by this workspace (`cruise`, `cruise-sim`), found beside
/// the test executable (`target/<profile>/deps/..` → `target/<profile>/<name>`).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe
        .parent()
        .context("test executable has no directory")?
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is not built; run `cargo build --workspace` (or `cargo test --workspace`, which builds it) first",
            path.display()
        );
    }
    Ok(path)
}

/// A child process whose stdout and stderr are captured as they arrive.
/// Killed when dropped.
pub struct Spawned {
    /// The process.
    pub child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

fn capture<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    r: R,
    into: Arc<Mutex<String>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(r).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            let mut s = into.lock().unwrap_or_else(|p| p.into_inner());
            s.push_str(&l);
            s.push('\n');
        }
    })
}

impl Spawned {
    /// Spawns `cmd` with piped output.
    pub fn spawn(mut cmd: Command) -> anyhow::Result<Spawned> {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("spawning")?;
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(o) = child.stdout.take() {
            readers.push(capture(o, Arc::clone(&stdout)));
        }
        if let Some(e) = child.stderr.take() {
            readers.push(capture(e, Arc::clone(&stderr)));
        }
        Ok(Spawned {
            child,
            stdout,
            stderr,
            readers,
        })
    }

    /// Everything written to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until a stderr line contains `needle`; returns that line.
    pub async fn wait_for_stderr(&self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        let s = Arc::clone(&self.stderr);
        let n = needle.to_string();
        wait_until(timeout, move || {
            s.lock()
                .unwrap_or_else(|p| p.into_inner())
                .lines()
                .find(|l| l.contains(&n))
                .map(str::to_string)
        })
        .await
        .with_context(|| {
            format!(
                "no stderr line with {needle:?}; stderr so far:\n{}",
                self.stderr()
            )
        })
    }

    /// Waits for the process to exit, then for its output to be read.
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| {
                format!(
                    "still running after {timeout:?}; stderr so far:\n{}",
                    self.stderr()
                )
            })??;
        for r in self.readers.drain(..) {
            let _ = r.await;
        }
        Ok(status)
    }
}

/// Polls `f` until it returns `Some` or the timeout passes.
pub async fn wait_until<T>(
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("condition not met within {timeout:?}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Reads the AM's status endpoint (`http://ADDR/status`).
pub async fn status(addr: &str) -> anyhow::Result<serde_json::Value> {
    let url = format!("http://{addr}/status");
    let r = reqwest::get(&url)
        .await
        .with_context(|| format!("GET {url}"))?;
    let code = r.status();
    if !code.is_success() {
        bail!("GET {url}: HTTP {code}");
    }
    r.json()
        .await
        .with_context(|| format!("GET {url}: not JSON"))
}

/// Polls the status endpoint until `pred` holds.
pub async fn await_status(
    addr: &str,
    timeout: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = serde_json::Value::Null;
    while tokio::time::Instant::now() < deadline {
        if let Ok(s) = status(addr).await {
            if pred(&s) {
                return Ok(s);
            }
            last = s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("status never matched within {timeout:?}; last: {last}")
}

/// Writes a generated MLR data set and returns its path.
pub fn mlr_data(
    dir: &std::path::Path,
    samples: u64,
    features: u32,
    classes: u32,
    nnz: u32,
) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("mlr-{samples}-{features}-{classes}.libsvm"));
    let p = cruise_container::apps::mlr::GenParams {
        samples,
        features,
        classes,
        nnz,
        seed: 5,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    cruise_container::apps::mlr::generate(&p, &mut f)?;
    std::io::Write::flush(&mut f)?;
    Ok(path)
}
