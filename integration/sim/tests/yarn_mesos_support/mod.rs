//! Shared test support for the YARN and Mesos simulator tests: start the real
//! `cruise-sim` binary on 127.0.0.1:0, wait for its ready file, stop it with
//! SIGTERM, poll conditions with deadlines, and check whether a pid lives.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `cruise-sim` subcommand, stopped (SIGTERM) on drop.
pub struct SimProc {
    child: Option<Child>,
    pub ready: Value,
    pub url: String,
    pub work_dir: PathBuf,
    pub dir: tempfile::TempDir,
}

impl SimProc {
    /// Start `cruise-sim <kind> <args>` with a ready file and work dir in a
    /// fresh temp dir and wait (up to 30 s) until it is listening.
    pub fn start(kind: &str, args: &[&str]) -> SimProc {
        let dir = tempfile::tempdir().unwrap();
        let ready_file = dir.path().join("ready.json");
        let work_dir = dir.path().join("work");
        let log = std::fs::File::create(dir.path().join("sim.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_cruise-sim"))
            .arg(kind)
            .arg("--ready-file")
            .arg(&ready_file)
            .arg("--work-dir")
            .arg(&work_dir)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut sim = SimProc {
            child: Some(child),
            ready: Value::Null,
            url: String::new(),
            work_dir,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(&ready_file)
                && let Ok(v) = serde_json::from_str::<Value>(&s)
            {
                sim.url = v["url"].as_str().unwrap().to_string();
                sim.ready = v;
                break;
            }
            if let Some(st) = sim.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("cruise-sim {kind} exited early ({st}): {}", sim.log());
            }
            assert!(
                Instant::now() < deadline,
                "cruise-sim {kind} not ready: {}",
                sim.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sim
    }

    /// Start without `--work-dir` (for modes that take none).
    pub fn start_plain(kind: &str, args: &[&str]) -> SimProc {
        let dir = tempfile::tempdir().unwrap();
        let ready_file = dir.path().join("ready.json");
        let log = std::fs::File::create(dir.path().join("sim.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_cruise-sim"))
            .arg(kind)
            .arg("--ready-file")
            .arg(&ready_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut sim = SimProc {
            child: Some(child),
            ready: Value::Null,
            url: String::new(),
            work_dir: dir.path().join("work"),
            dir,
        };
        let v = wait_sync("ready file", Duration::from_secs(30), || {
            serde_json::from_str::<Value>(&std::fs::read_to_string(&ready_file).ok()?).ok()
        })
        .unwrap();
        sim.url = v["url"].as_str().unwrap().to_string();
        sim.ready = v;
        sim
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sim.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM and wait (up to 30 s) for a clean exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("already terminated");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "cruise-sim did not stop within 30 s after SIGTERM; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SimProc {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if std::thread::panicking() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.terminate();
            }));
        } else {
            // A simulator that does not shut down cleanly fails the test.
            let st = self.terminate();
            assert!(
                st.success(),
                "cruise-sim exited with {st} after SIGTERM; log:\n{}",
                self.log()
            );
        }
    }
}

/// Poll `f` until it yields `Some`, panicking after `timeout`.
pub fn wait_sync<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll an async condition until it yields `Some`, panicking after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Is `pid` a live (non-zombie) process?
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

/// Wait until `pid` is gone.
pub async fn wait_dead(pid: u32) {
    wait_for(
        &format!("process {pid} to die"),
        Duration::from_secs(15),
        || async move { (!pid_alive(pid)).then_some(()) },
    )
    .await
}

/// Read a file, empty if missing.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}
