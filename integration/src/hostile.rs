//! Hostile HTTP servers and a measured child process, for the tests of how
//! cruise behaves when a namenode, datanode, ResourceManager or Mesos
//! master is slow, broken or malicious.
//!
//! [`HostileServer`] is a small HTTP/1.1 server on a real loopback socket:
//! each request is answered by a test's handler with a [`Reply`], which can
//! be an honest answer or one of the misbehaviours (a body that never ends,
//! a truncated body, a byte at a time, no answer at all). It counts the
//! requests it got and the bytes the client accepted from it.
//!
//! [`Measured`] runs a command (e.g. `cruise run`) in a process group of its
//! own with its output captured, and reaps it with `wait4` so that the peak
//! resident set size of it and of every descendant it waited for (its
//! evaluators) is known exactly. Dropping it kills the group.

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A request as the server parsed it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, percent-encoded as sent.
    pub path: String,
    /// Query parameters in order (names as sent).
    pub query: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A query parameter by name, ignoring case.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the server answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete answer with a `Content-Length`; the connection stays open.
    Full {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// Headers without a length, `prefix`, then `chunk` again and again
    /// until the client goes away (a body delimited by the connection's
    /// close that never closes).
    Endless {
        /// HTTP status.
        status: u16,
        /// The first bytes of the body.
        prefix: Vec<u8>,
        /// What follows, repeated.
        chunk: Vec<u8>,
    },
    /// Announces `length` bytes, sends `body` (shorter) and closes.
    Truncated {
        /// HTTP status.
        status: u16,
        /// The announced `Content-Length`.
        length: u64,
        /// What is sent of it.
        body: Vec<u8>,
    },
    /// Announces `length` bytes and sends one every `every`.
    Trickle {
        /// HTTP status.
        status: u16,
        /// The announced `Content-Length`.
        length: u64,
        /// The pause between two bytes.
        every: Duration,
    },
    /// Headers without a length and `body`, then nothing more: the
    /// connection stays open until the client closes it (an event stream
    /// that goes quiet).
    Open {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body sent.
        body: Vec<u8>,
    },
    /// Reads the request and never answers; the connection stays open
    /// until the client closes it or the server stops.
    Silent,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, value: &serde_json::Value) -> Reply {
        Reply::Full {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: value.to_string().into_bytes(),
        }
    }

    /// An answer with no body.
    pub fn empty(status: u16) -> Reply {
        Reply::Full {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A redirect to `location`.
    pub fn redirect(location: &str) -> Reply {
        Reply::Full {
            status: 307,
            headers: vec![("Location".into(), location.to_string())],
            body: Vec::new(),
        }
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes_sent: AtomicU64,
}

/// A scripted HTTP server on loopback, stopped when dropped.
pub struct HostileServer {
    /// Its address.
    pub addr: SocketAddr,
    counters: Arc<Counters>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HostileServer {
    /// Starts a server that is busy for its first `busy` requests (`503`
    /// with `Retry-After: retry_after()`, taken at each answer) and answers
    /// every later one with `then`.
    pub async fn busy_then(
        busy: u64,
        retry_after: impl Fn() -> String + Send + Sync + 'static,
        then: Reply,
    ) -> anyhow::Result<HostileServer> {
        let answered = AtomicU64::new(0);
        HostileServer::start(move |_: &Request| {
            if answered.fetch_add(1, Ordering::SeqCst) < busy {
                Reply::Full {
                    status: 503,
                    headers: vec![("Retry-After".into(), retry_after())],
                    body: b"busy".to_vec(),
                }
            } else {
                then.clone()
            }
        })
        .await
    }

    /// Starts a server answering every request with `handler`'s reply.
    pub async fn start(
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> anyhow::Result<HostileServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let handler: Arc<Handler> = Arc::new(handler);
        let (c, s) = (Arc::clone(&counters), stop.clone());
        let task = tokio::spawn(async move {
            let tracker = TaskTracker::new();
            loop {
                let conn = tokio::select! {
                    _ = s.cancelled() => break,
                    a = listener.accept() => match a { Ok((conn, _)) => conn, Err(_) => continue },
                };
                let (c, s, h) = (Arc::clone(&c), s.clone(), Arc::clone(&handler));
                tracker.spawn(async move {
                    tokio::select! {
                        _ = s.cancelled() => {}
                        _ = serve(conn, &*h, &c) => {}
                    }
                });
            }
            tracker.close();
            tracker.wait().await;
        });
        Ok(HostileServer {
            addr,
            counters,
            stop,
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Bytes of answers the client's socket accepted so far.
    pub fn bytes_sent(&self) -> u64 {
        self.counters.bytes_sent.load(Ordering::SeqCst)
    }

    /// Stops serving and closes every connection.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Reads one request (headers, then a `Content-Length` body); `None` when
/// the client closed or sent something unparsable.
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        let mut tmp = [0u8; 8192];
        let n = conn.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let target = first.next()?.to_string();
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut tmp = [0u8; 8192];
        let n = conn.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf[head_end..head_end + length].to_vec();
    buf.drain(..head_end + length);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q),
        None => (target.clone(), ""),
    };
    let query = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    Some(Request {
        method,
        path,
        query,
        body,
    })
}

fn head(status: u16, headers: &[(String, String)], length: Option<u64>) -> Vec<u8> {
    let mut h = format!("HTTP/1.1 {status} X\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    match length {
        Some(n) => h.push_str(&format!("Content-Length: {n}\r\n")),
        None => h.push_str("Connection: close\r\n"),
    }
    h.push_str("\r\n");
    h.into_bytes()
}

async fn send(conn: &mut TcpStream, bytes: &[u8], c: &Counters) -> bool {
    match conn.write_all(bytes).await {
        Ok(()) => {
            c.bytes_sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            true
        }
        Err(_) => false,
    }
}

async fn serve(mut conn: TcpStream, handler: &Handler, c: &Counters) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut conn, &mut buf).await {
        c.requests.fetch_add(1, Ordering::SeqCst);
        match handler(&req) {
            Reply::Full {
                status,
                headers,
                body,
            } => {
                let mut out = head(status, &headers, Some(body.len() as u64));
                out.extend_from_slice(&body);
                if !send(&mut conn, &out, c).await {
                    return;
                }
            }
            Reply::Endless {
                status,
                prefix,
                chunk,
            } => {
                let mut out = head(status, &[], None);
                out.extend_from_slice(&prefix);
                if !send(&mut conn, &out, c).await {
                    return;
                }
                while send(&mut conn, &chunk, c).await {}
                return;
            }
            Reply::Truncated {
                status,
                length,
                body,
            } => {
                let mut out = head(status, &[], Some(length));
                out.extend_from_slice(&body);
                let _ = send(&mut conn, &out, c).await;
                return;
            }
            Reply::Trickle {
                status,
                length,
                every,
            } => {
                if !send(&mut conn, &head(status, &[], Some(length)), c).await {
                    return;
                }
                for _ in 0..length {
                    tokio::time::sleep(every).await;
                    if !send(&mut conn, b"x", c).await {
                        return;
                    }
                }
            }
            Reply::Open {
                status,
                headers,
                body,
            } => {
                let mut out = head(status, &headers, None);
                out.extend_from_slice(&body);
                if send(&mut conn, &out, c).await {
                    hold(&mut conn).await;
                }
                return;
            }
            Reply::Silent => {
                hold(&mut conn).await;
                return;
            }
        }
    }
}

/// A `FileStatus` JSON object of WebHDFS.
pub fn webhdfs_status(suffix: &str, kind: &str, length: u64) -> serde_json::Value {
    serde_json::json!({
        "accessTime": 0, "blockSize": 134217728, "childrenNum": 0, "fileId": 16386,
        "group": "supergroup", "length": length, "modificationTime": 1700000000000u64,
        "owner": "cruise", "pathSuffix": suffix, "permission": "644",
        "replication": 1, "storagePolicy": 0, "type": kind
    })
}

/// Keeps a connection open until the client closes it.
async fn hold(conn: &mut TcpStream) {
    let mut tmp = [0u8; 1024];
    while conn.read(&mut tmp).await.is_ok_and(|n| n > 0) {}
}

/// A namenode's redirect of request `r` to the same path and query on
/// `datanode` (`http://host:port`).
pub fn webhdfs_redirect(datanode: &str, r: &Request) -> Reply {
    let q: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Reply::redirect(&format!("{datanode}{}?{}", r.path, q.join("&")))
}

/// A namenode serving one file of `length` bytes at any path: its status,
/// a listing of it, and `OPEN` redirected to `datanode`.
pub fn webhdfs_one_file(
    datanode: String,
    length: u64,
) -> impl Fn(&Request) -> Reply + Send + Sync + 'static {
    move |r: &Request| match r.param("op") {
        Some("OPEN") => webhdfs_redirect(&datanode, r),
        Some("GETFILESTATUS") => Reply::json(
            200,
            &serde_json::json!({"FileStatus": webhdfs_status("", "FILE", length)}),
        ),
        _ => webhdfs_batch(&[webhdfs_status("", "FILE", length)], 0),
    }
}

/// A WebHDFS `LISTSTATUS_BATCH` answer.
pub fn webhdfs_batch(entries: &[serde_json::Value], remaining: u64) -> Reply {
    Reply::json(
        200,
        &serde_json::json!({"DirectoryListing": {
            "partialListing": {"FileStatuses": {"FileStatus": entries}},
            "remainingEntries": remaining
        }}),
    )
}

/// A WebHDFS `LISTSTATUS_BATCH` answer that never ends: file entries
/// without end.
pub fn webhdfs_endless_batch() -> Reply {
    let entry = webhdfs_status("f", "FILE", 10).to_string();
    Reply::Endless {
        status: 200,
        prefix: br#"{"DirectoryListing":{"partialListing":{"FileStatuses":{"FileStatus":["#
            .to_vec(),
        chunk: format!("{entry},").repeat(1000).into_bytes(),
    }
}

/// How a [`Measured`] process ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Peak resident set size of it and of the descendants it waited for,
    /// bytes (`wait4`'s `ru_maxrss`).
    pub peak_rss_bytes: u64,
    /// From the start to the exit.
    pub elapsed: Duration,
}

/// A child process in a process group of its own, its output captured,
/// reaped with `wait4` for its peak memory. Dropping it kills the group.
pub struct Measured {
    pid: i32,
    started: Instant,
    reaped: bool,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn drain(
    mut r: impl Read + Send + 'static,
    into: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

impl Measured {
    /// Spawns `cmd` with piped output, in a new process group.
    pub fn spawn(mut cmd: Command) -> anyhow::Result<Measured> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().context("spawning")?;
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(o) = child.stdout.take() {
            readers.push(drain(o, Arc::clone(&stdout)));
        }
        if let Some(e) = child.stderr.take() {
            readers.push(drain(e, Arc::clone(&stderr)));
        }
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        // The process is reaped with wait4 below, not through `child`.
        drop(child);
        Ok(Measured {
            pid,
            started: Instant::now(),
            reaped: false,
            stdout,
            stderr,
            readers,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        crate::captured(&self.stdout)
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        crate::captured(&self.stderr)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), signal)?;
        Ok(())
    }

    /// Waits until stderr contains `needle`.
    pub async fn wait_for_stderr(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let s = Arc::clone(&self.stderr);
        crate::wait_until(timeout, || {
            s.lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(needle)
                .then_some(())
        })
        .await
        .with_context(|| format!("no {needle:?} on stderr; so far:\n{}", self.stderr()))
    }

    /// Waits (at most `timeout`) for the exit and reaps the process; its
    /// output is read to the end.
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<Outcome> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            let mut status = 0;
            // SAFETY: rusage is plain data; wait4 writes it and `status`.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut usage) };
            if r == self.pid {
                self.reaped = true;
                let elapsed = self.started.elapsed();
                for t in self.readers.drain(..) {
                    let _ = tokio::task::spawn_blocking(move || t.join()).await;
                }
                return Ok(Outcome {
                    code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
                    signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
                    peak_rss_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
                    elapsed,
                });
            }
            if r < 0 {
                bail!("wait4({}): {}", self.pid, std::io::Error::last_os_error());
            }
            if Instant::now() >= deadline {
                bail!(
                    "still running after {timeout:?}; stderr so far:\n{}",
                    self.stderr()
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

impl Drop for Measured {
    fn drop(&mut self) {
        if !self.reaped {
            let group = nix::unistd::Pid::from_raw(-self.pid);
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
            let mut status = 0;
            // SAFETY: reaps our own child; no rusage asked for.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
        }
    }
}
