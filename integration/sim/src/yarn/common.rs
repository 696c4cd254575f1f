//! Runtime pieces shared by the YARN and the Mesos simulators: launching and
//! supervising real child processes in their own process groups, the ready
//! file, signal handling, the HTTP server loop and small time helpers.
//!
//! It lives under `yarn/` only because the simulators' folders are the places
//! this code may live; `crate::mesos` uses it as `crate::yarn::common`.
//!
//! Process model: every launched container or task is a `bash -c` (or direct
//! exec) child that leads its own process group (`setpgid(0, 0)`), with stdin
//! from /dev/null and stdout/stderr appended to files. A supervisor future
//! ([`Running::supervise`]) waits for it; cancelling its token sends SIGTERM to
//! the whole group, then SIGKILL after a grace period. When the group leader
//! has exited, the rest of the group is SIGKILLed too, so nothing a container
//! started in the background outlives it.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What to run.
#[derive(Debug, Clone)]
pub enum Program {
    /// A shell command line, run as `/bin/sh -c <line>`.
    Shell(String),
    /// An executable and its argv (without argv\[0\]).
    Exec { path: String, args: Vec<String> },
}

/// A process to launch: program, extra environment, working directory and the
/// files that capture stdout and stderr.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub program: Program,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Normal exit with this code.
    Code(i32),
    /// Terminated by this signal number.
    Signal(i32),
}

/// The end of a supervised process.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub exit: Exit,
    /// True when the supervisor killed it because its token was cancelled.
    pub killed: bool,
}

impl Outcome {
    /// Exit code the way a shell or a YARN NodeManager reports it: the code,
    /// or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        match self.exit {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

/// Name of a signal as `strsignal(3)` spells it (used in Mesos messages).
pub fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(Signal::SIGTERM) => "Terminated".into(),
        Ok(Signal::SIGKILL) => "Killed".into(),
        Ok(Signal::SIGINT) => "Interrupt".into(),
        Ok(Signal::SIGHUP) => "Hangup".into(),
        Ok(Signal::SIGSEGV) => "Segmentation fault".into(),
        Ok(Signal::SIGABRT) => "Aborted".into(),
        Ok(Signal::SIGPIPE) => "Broken pipe".into(),
        Ok(Signal::SIGQUIT) => "Quit".into(),
        Ok(Signal::SIGUSR1) => "User defined signal 1".into(),
        Ok(Signal::SIGUSR2) => "User defined signal 2".into(),
        Ok(other) => other.as_str().to_string(),
        Err(_) => format!("Unknown signal {sig}"),
    }
}

/// A launched process that leads its own process group.
pub struct Running {
    child: tokio::process::Child,
    pid: u32,
}

impl Running {
    /// Start the process described by `spec` in a new process group.
    pub fn spawn(spec: &ProcessSpec) -> io::Result<Running> {
        let stdout = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.stdout)
            .map_err(|e| with_path(e, "opening stdout file", &spec.stdout))?;
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.stderr)
            .map_err(|e| with_path(e, "opening stderr file", &spec.stderr))?;
        let mut cmd = match &spec.program {
            Program::Shell(line) => {
                let mut c = tokio::process::Command::new("/bin/sh");
                c.arg("-c").arg(line);
                c
            }
            Program::Exec { path, args } => {
                let mut c = tokio::process::Command::new(path);
                c.args(args);
                c
            }
        };
        cmd.current_dir(&spec.cwd)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .process_group(0)
            .kill_on_drop(false);
        let child = cmd.spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("spawned child has no pid"))?;
        Ok(Running { child, pid })
    }

    /// Process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait for the process to exit, or kill its group (SIGTERM, then SIGKILL
    /// after `grace`) once `kill` is cancelled. Always SIGKILLs what is left of
    /// the group afterwards.
    pub async fn supervise(
        mut self,
        kill: CancellationToken,
        grace: Duration,
    ) -> io::Result<Outcome> {
        let pgid = self.pid as i32;
        let (status, killed) = tokio::select! {
            st = self.child.wait() => (st?, false),
            _ = kill.cancelled() => {
                signal_group(pgid, Signal::SIGTERM);
                match tokio::time::timeout(grace, self.child.wait()).await {
                    Ok(st) => (st?, true),
                    Err(_) => {
                        signal_group(pgid, Signal::SIGKILL);
                        (self.child.wait().await?, true)
                    }
                }
            }
        };
        signal_group(pgid, Signal::SIGKILL);
        let exit = match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Code(-1),
        };
        Ok(Outcome { exit, killed })
    }
}

fn signal_group(pgid: i32, sig: Signal) {
    if pgid <= 1 {
        return;
    }
    // ESRCH (group already gone) is the normal case after an exit.
    let _ = killpg(Pid::from_raw(pgid), sig);
}

/// Add the path and what was being done to an I/O error.
pub fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// The last `max` bytes of a file, lossily decoded (empty if unreadable).
pub fn tail_file(path: &Path, max: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(_) => String::new(),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Seconds since the Unix epoch, as a double (Mesos timestamps).
pub fn now_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Format epoch milliseconds as `2023-11-14T22:13:20.000+0000` (Hadoop's
/// `Times.formatISO8601` shape).
pub fn iso8601_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil-from-days (proleptic Gregorian), Howard Hinnant's algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}+0000",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

/// Write `value` as JSON to `path` atomically (temp file + rename), so a
/// reader polling for the file never sees a partial write.
pub fn write_ready_file(path: &Path, value: &serde_json::Value) -> io::Result<()> {
    let tmp = path.with_extension("tmp-ready");
    let body = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    std::fs::write(&tmp, body).map_err(|e| with_path(e, "writing ready file", &tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| with_path(e, "renaming ready file to", path))
}

/// SIGINT/SIGTERM handlers, installed when created (so a signal that arrives
/// before anyone waits is not lost and does not kill the process outright).
pub struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Install the handlers. Needs a running tokio runtime.
    pub fn install() -> io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolve when SIGINT or SIGTERM arrives; returns the signal's name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Serve `app` on `listener` until `cancel` fires, then stop accepting and
/// drain open connections.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    cancel: CancellationToken,
) -> io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

/// Set up logging to stderr (`RUST_LOG` overrides the default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// A multi-threaded tokio runtime sized for a small shared machine.
pub fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_matches_known_instants() {
        assert_eq!(iso8601_ms(0), "1970-01-01T00:00:00.000+0000");
        assert_eq!(
            iso8601_ms(1_700_000_000_123),
            "2023-11-14T22:13:20.123+0000"
        );
        assert_eq!(iso8601_ms(951_782_400_000), "2000-02-29T00:00:00.000+0000");
    }

    #[tokio::test]
    async fn supervise_reports_exit_code_and_kills_group() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ProcessSpec {
            program: Program::Shell("echo hi; exit 7".into()),
            env: vec![],
            cwd: dir.path().to_path_buf(),
            stdout: dir.path().join("stdout"),
            stderr: dir.path().join("stderr"),
        };
        let run = Running::spawn(&spec).unwrap();
        let out = run
            .supervise(CancellationToken::new(), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(out.exit, Exit::Code(7));
        assert!(!out.killed);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("stdout")).unwrap(),
            "hi\n"
        );

        // A background grandchild must die with the group on kill.
        let spec = ProcessSpec {
            program: Program::Shell("sleep 300 & echo $! > bg.pid; wait".into()),
            ..spec
        };
        let run = Running::spawn(&spec).unwrap();
        let kill = CancellationToken::new();
        let pidfile = dir.path().join("bg.pid");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "pid file never appeared"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let bg: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        kill.cancel();
        let out = run.supervise(kill, Duration::from_secs(1)).await.unwrap();
        assert!(out.killed);
        assert_eq!(out.shell_code(), 143);
        // The grandchild was reparented/reaped: signal 0 must fail eventually.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let alive = nix::sys::signal::kill(Pid::from_raw(bg), None).is_ok()
                && !std::fs::read_to_string(format!("/proc/{bg}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true);
            if !alive {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "background process {bg} survived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
