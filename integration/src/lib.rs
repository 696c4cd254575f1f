//! Helpers shared by the end-to-end tests and benchmarks of `integration/`:
//!
//! - [`binary`]: the `cruise` and `cruise-sim` executables, found next to the
//!   test executable (`target/<profile>/`), since they belong to other
//!   packages; a clear error says how to build them when they are missing;
//! - [`Sim`]: a running `cruise-sim` subcommand (ready file parsed; SIGTERM
//!   and wait on drop, so no simulator outlives its test);
//! - [`hadoop_conf_dir`]: a `HADOOP_CONF_DIR` pointing at the simulators;
//!   [`cruise_on_hadoop`]: a `cruise` command run with it as user `alice`;
//!   [`hadoop::RealHadoop`]: the real one-machine Hadoop of `integration/hadoop/`;
//! - [`wait_for`] / [`wait_until`]: polling with a deadline;
//! - [`Spawned`]: a child process with its output captured, [`status`] /
//!   [`await_status`] for the AM's status endpoint, [`mlr_data`];
//! - [`fake_am`]: a scriptable fake AM that drives one real evaluator process
//!   over the real control protocol;
//! - [`mod@bench`]: the shared pieces of the benchmarks; [`optbench`]: those of
//!   the optimizer's (cases, one `cruise run` on an emulated cluster);
//!   [`clusters`]: emulated clusters drawn by a seeded generator;
//! - [`required_tool`]: an external tool a test needs, or why it is skipped;
//! - [`hostile`]: scripted misbehaving HTTP servers (namenode, datanode,
//!   RM, master) and a child process measured for its peak memory;
//! - [`pid_alive`], [`free_port`] and [`FreezingProxy`] (a TCP proxy whose
//!   open connections can be stalled, to starve a client of heartbeats).

pub mod bench;
pub mod clusters;
pub mod fake_am;
pub mod hadoop;
pub mod hostile;
pub mod optbench;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The directory holding the workspace's binaries for this build profile
/// (the parent of the test executable's `deps/`).
pub fn target_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the test executable")?;
    let mut dir = exe
        .parent()
        .context("the test executable has no directory")?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// A workspace binary (`cruise`, `cruise-sim`) of this build profile.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let p = target_dir()?.join(name);
    if !p.is_file() {
        bail!(
            "{} not found: the integration tests run the workspace's binaries; build them first with \
             `cargo build -p cruise-appmaster -p cruise-sim` (same profile as the tests)",
            p.display()
        );
    }
    Ok(p)
}

/// A running `cruise-sim` subcommand, stopped with SIGTERM on drop.
pub struct Sim {
    child: Option<Child>,
    /// The ready file's JSON.
    pub ready: Value,
    /// Its main URL (`url`, or `namenode` for WebHDFS).
    pub url: String,
    /// Temp directory with its log, ready file and work dir.
    pub dir: tempfile::TempDir,
    kind: String,
}

impl Sim {
    /// Starts `cruise-sim <kind> <args> --ready-file ...` and waits (30 s)
    /// until it is listening. `yarn` and `mesos` get a `--work-dir` in the
    /// temp dir, `webhdfs` a `--root`.
    pub fn start(kind: &str, args: &[&str]) -> anyhow::Result<Sim> {
        Sim::start_logging(kind, args, "info")
    }

    /// [`Sim::start`] with `RUST_LOG=<rust_log>` (e.g. `debug` to see every
    /// scheduler call in [`Sim::log`]).
    pub fn start_logging(kind: &str, args: &[&str], rust_log: &str) -> anyhow::Result<Sim> {
        let exe = binary("cruise-sim")?;
        let dir = tempfile::tempdir().context("creating a temp dir")?;
        let ready_file = dir.path().join("ready.json");
        let log = std::fs::File::create(dir.path().join("sim.log"))?;
        let mut cmd = Command::new(exe);
        cmd.arg(kind).arg("--ready-file").arg(&ready_file);
        if kind == "webhdfs" {
            cmd.arg("--root").arg(dir.path().join("root"));
        } else if !args.contains(&"--leader-redirect") {
            cmd.arg("--work-dir").arg(dir.path().join("work"));
        }
        let child = cmd
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting cruise-sim {kind}"))?;
        let mut sim = Sim {
            child: Some(child),
            ready: Value::Null,
            url: String::new(),
            dir,
            kind: kind.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(&ready_file)
                && let Ok(v) = serde_json::from_str::<Value>(&s)
            {
                sim.url = v["url"]
                    .as_str()
                    .or(v["namenode"].as_str())
                    .unwrap_or_default()
                    .to_string();
                sim.ready = v;
                return Ok(sim);
            }
            if let Some(child) = sim.child.as_mut()
                && let Some(st) = child.try_wait()?
            {
                bail!("cruise-sim {kind} exited early ({st}): {}", sim.log());
            }
            if Instant::now() > deadline {
                bail!("cruise-sim {kind} not ready after 30 s: {}", sim.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `host:port` of the main URL.
    pub fn address(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    }

    /// The simulator's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sim.log")).unwrap_or_default()
    }

    /// SIGTERM and wait (30 s) for the exit.
    pub fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("cruise-sim {} already stopped", self.kind);
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("cruise-sim {} did not stop within 30 s", self.kind);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.terminate();
        }
    }
}

/// Writes `core-site.xml`, `hdfs-site.xml` and (with a YARN simulator)
/// `yarn-site.xml` into `dir` so that `hdfs://` paths and the RM resolve to
/// the simulators. Returns `dir`.
pub fn hadoop_conf_dir(dir: &Path, webhdfs: &Sim, yarn: Option<&Sim>) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let nn = webhdfs.address();
    let prop =
        |k: &str, v: &str| format!("  <property><name>{k}</name><value>{v}</value></property>\n");
    let file = |props: String| {
        format!("<?xml version=\"1.0\"?>\n<configuration>\n{props}</configuration>\n")
    };
    std::fs::write(
        dir.join("core-site.xml"),
        file(prop("fs.defaultFS", &format!("hdfs://{nn}"))),
    )?;
    std::fs::write(
        dir.join("hdfs-site.xml"),
        file(prop("dfs.namenode.http-address", &nn)),
    )?;
    if let Some(y) = yarn {
        std::fs::write(
            dir.join("yarn-site.xml"),
            file(
                prop("yarn.resourcemanager.webapp.address", &y.address())
                    + &prop("yarn.scheduler.minimum-allocation-mb", "1024"),
            ),
        )?;
    }
    Ok(dir.to_path_buf())
}

/// Runs `cruise <args>` with `HADOOP_CONF_DIR=conf_dir` as the Hadoop user
/// `alice`, to its end (at most 120 s, else the test fails).
pub async fn cruise_on_hadoop(args: &[&str], conf_dir: &Path) -> std::process::Output {
    let cruise = binary("cruise").unwrap_or_else(|e| panic!("{e}"));
    tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(cruise)
            .args(args)
            .env("HADOOP_CONF_DIR", conf_dir)
            .env("HADOOP_USER_NAME", "alice")
            .env_remove("RUST_LOG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("cruise {args:?} did not finish in 120 s"))
    .unwrap_or_else(|e| panic!("cruise {args:?}: {e}"))
}

/// A process's output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Polls `f` until it yields `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `pid` is a live (non-zombie) process.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Live processes whose working directory is inside `dir` (e.g. the task
/// sandboxes of a simulator).
pub fn processes_under(dir: &Path) -> Vec<u32> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(&dir))
                && pid_alive(*pid)
        })
        .collect()
}

/// A loopback port nothing listens on (bound, then released).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// What a child's output reader has captured so far (a poisoned lock still
/// holds the text).
pub fn captured(buf: &Mutex<String>) -> String {
    buf.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A loopback port that refuses connections for as long as the returned
/// socket lives: bound, never listening, so nothing else can take the port
/// meanwhile (a port from [`free_port`] can be given to another test's
/// listener before it is used, which then answers instead of refusing).
pub fn refused_port() -> anyhow::Result<(std::os::fd::OwnedFd, u16)> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname, socket,
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, 0),
    )?;
    let addr: SockaddrIn = getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
    Ok((fd, addr.port()))
}

/// A TCP proxy on loopback to `target`. [`FreezingProxy::freeze`] stalls the
/// connections open at that moment (they stay open but forward nothing), the
/// way a half-dead network path does; new connections are forwarded.
pub struct FreezingProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    frozen: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl FreezingProxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<FreezingProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let frozen: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let (f, s) = (Arc::clone(&frozen), stop.clone());
        let task = tokio::spawn(async move {
            let tracker = tokio_util::task::TaskTracker::new();
            loop {
                let (inbound, _) = tokio::select! {
                    _ = s.cancelled() => break,
                    a = listener.accept() => match a { Ok(x) => x, Err(_) => continue },
                };
                let flag = Arc::new(AtomicBool::new(false));
                f.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Arc::clone(&flag));
                let s = s.clone();
                tracker.spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::select! {
                        _ = s.cancelled() => {}
                        _ = pump(ri, wo, Arc::clone(&flag)) => {}
                        _ = pump(ro, wi, flag) => {}
                    }
                });
            }
            tracker.close();
            tracker.wait().await;
        });
        Ok(FreezingProxy {
            addr,
            frozen,
            stop,
            task: Some(task),
        })
    }

    /// Stalls every connection open now.
    pub fn freeze(&self) {
        for f in self.frozen.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            f.store(true, Ordering::SeqCst);
        }
    }

    /// Stops the proxy and closes its connections.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            // Swallow everything from now on, keeping the socket open.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A child process whose stdout and stderr are captured as they arrive.
/// Killed when dropped.
pub struct Spawned {
    /// The process.
    pub child: tokio::process::Child,
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
    pub fn spawn(mut cmd: tokio::process::Command) -> anyhow::Result<Spawned> {
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
        captured(&self.stdout)
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        captured(&self.stderr)
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

/// An external tool a test needs (e.g. `promtool`, `chromium`), found on
/// `PATH`. Missing, it is `Ok(None)` after printing that `test` is
/// skipped and how to install it, unless `CRUISE_UI_TOOLS_REQUIRED=1` (as
/// in CI's stage for these tests, `integration/ui/ci.sh`): then the test
/// fails, naming the tool.
pub fn required_tool(name: &str, package: &str, test: &str) -> anyhow::Result<Option<PathBuf>> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Ok(Some(p)),
        None if std::env::var_os("CRUISE_UI_TOOLS_REQUIRED").is_some_and(|v| v == "1") => bail!(
            "{test}: CRUISE_UI_TOOLS_REQUIRED=1 but `{name}` is not on PATH \
             (Debian package `{package}`; integration/ui/ci.sh installs it)"
        ),
        None => {
            eprintln!(
                "SKIPPED {test}: `{name}` is not on PATH (apt-get install {package}, \
                 or run integration/ui/ci.sh)"
            );
            Ok(None)
        }
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

/// Waits for a `cruise run` job to print its status endpoint on stderr and
/// returns the endpoint's `host:port`.
pub async fn status_address(job: &Spawned, timeout: Duration) -> anyhow::Result<String> {
    let line = job.wait_for_stderr("status at http://", timeout).await?;
    let addr = line
        .split("http://")
        .nth(1)
        .with_context(|| format!("no address in {line:?}"))?;
    Ok(addr.trim().trim_end_matches("/status").to_string())
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

/// The members of a job's `/status` (its `evaluators`) in `role`:
/// "worker", "server" or "idle".
pub fn members_in_role<'a>(status: &'a Value, role: &str) -> Vec<&'a Value> {
    status["evaluators"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["role"] == role).collect())
        .unwrap_or_default()
}

/// The sum of a member count of a job's `/status` (`input_blocks`,
/// `model_blocks`) over its members other than `except`.
pub fn blocks_held(status: &Value, field: &str, except: Option<u64>) -> u64 {
    status["evaluators"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| except.is_none() || e["id"].as_u64() != except)
                .filter_map(|e| e[field].as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// Waits for a `cruise run --json` job that must succeed and evaluate every
/// record it trained on; returns its JSON summary.
pub async fn finished_evaluating_all(
    job: &mut Spawned,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let status = job.wait(timeout).await?;
    if !status.success() {
        bail!("the job must finish ({status}):\n{}", job.stderr());
    }
    let s: Value = serde_json::from_str(&job.stdout()).context("the job's JSON summary")?;
    if s["final_stats"]["records"] != s["records"] {
        bail!("not every record evaluated: {s}");
    }
    Ok(s)
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

/// The final accuracy (0..1) in a job summary printed by `cruise run` or
/// found in an AM's log: the line `final accuracy  95.19%`.
pub fn summary_accuracy(summary: &str) -> Option<f64> {
    summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("final accuracy"))
        .and_then(|r| r.trim().strip_suffix('%'))
        .and_then(|p| p.trim().parse::<f64>().ok())
        .map(|p| p / 100.0)
}

/// The least final training accuracy that the default job (MLR on the
/// generated 20,000 records, asynchronous, 5 epochs) reaches however its
/// workers are scheduled. Typically it ends near 0.95. Under asynchrony a
/// worker that falls far behind (a busy 2-core machine running other tests)
/// trains its last epochs alone and the model drifts towards its third of the
/// data: a job with one worker stretched 200× ended at 0.82–0.90, and a worker
/// alone on a third of the data reaches 0.73 on the whole. A job with a
/// staleness bound does not drift (`local_e2e::straggler_does_not_drift_under_ssp`).
pub const DEFAULT_JOB_MIN_ACCURACY: f64 = 0.7;
