//! The WebHDFS simulator: namenode and datanode endpoints over a local
//! directory (`cruise-sim webhdfs --root DIR`).
//!
//! It speaks the wire format of a Hadoop 3 namenode as `PROTOCOLS.md` §4
//! records it, with real redirects: `OPEN`, `CREATE` and `APPEND` on the
//! namenode answer 307 with a `Location` on a separate datanode listener (or
//! 200 `{"Location":...}` with `noredirect=true`), carrying the original
//! parameters plus `namenoderpcaddress`; the datanode serves and stores the
//! bytes. Errors are `RemoteException` JSON with the status codes of
//! Hadoop's `ExceptionHandler`.
//!
//! Layout:
//! - this file: arguments, listeners, ready file, shutdown, request parsing
//!   and the `RemoteException` type;
//! - [`store`]: the directory-backed namespace with HDFS semantics;
//! - [`namenode`]: the namenode operations, a standby namenode, fault injection;
//! - [`datanode`]: the datanode half of `OPEN`, `CREATE`, `APPEND`.
//!
//! Test hooks: `--standby` runs an extra namenode that answers every request
//! with `StandbyException` (for HA failover tests); `--fail-first N` makes the
//! first N namenode requests fail with `RetriableException` (or 503 with
//! `--fail-with unavailable`); `--list-limit` sets `dfs.ls.limit` for
//! `LISTSTATUS_BATCH`; `--no-list-batch` answers `LISTSTATUS_BATCH` as an
//! unknown op, like a Hadoop 2.7 namenode.

mod datanode;
mod namenode;
mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How injected failures look.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailWith {
    /// 403 `RetriableException` JSON (what a namenode in safe mode or under
    /// load sends).
    Retriable,
    /// 503 with a plain-text body (what a proxy or overloaded server sends).
    Unavailable,
}

/// Command-line arguments of `cruise-sim webhdfs`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory served as the root of the file system (created if missing).
    #[arg(long)]
    pub root: PathBuf,
    /// Namenode HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Datanode HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub datanode_bind: SocketAddr,
    /// Write `{"namenode":URL,"datanode":URL[,"standby":URL]}` here once listening.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Also run a standby namenode that answers every request with StandbyException.
    #[arg(long)]
    pub standby: bool,
    /// Standby namenode listen address (with --standby).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub standby_bind: SocketAddr,
    /// Fail the first N namenode requests (fault injection for retry tests).
    #[arg(long, default_value_t = 0)]
    pub fail_first: u64,
    /// How injected failures look.
    #[arg(long, value_enum, default_value_t = FailWith::Retriable)]
    pub fail_with: FailWith,
    /// Entries per LISTSTATUS_BATCH answer (dfs.ls.limit).
    #[arg(long, default_value_t = 1000)]
    pub list_limit: usize,
    /// Answer LISTSTATUS_BATCH as an unknown op (like Hadoop 2.7).
    #[arg(long)]
    pub no_list_batch: bool,
    /// Owner reported for files the simulator did not create.
    #[arg(long, default_value = "hdfs")]
    pub default_owner: String,
}

/// State shared by the namenode and datanode handlers.
#[derive(Debug)]
pub struct Sim {
    store: store::Store,
    namenode_addr: SocketAddr,
    datanode_addr: SocketAddr,
    fail_remaining: AtomicU64,
    fail_with: FailWith,
    list_limit: usize,
    no_list_batch: bool,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("creating --root {}", args.root.display()))?;
    let root = args
        .root
        .canonicalize()
        .with_context(|| format!("resolving --root {}", args.root.display()))?;
    let nn_listener = TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding the namenode to {}", args.bind))?;
    let dn_listener = TcpListener::bind(args.datanode_bind)
        .await
        .with_context(|| format!("binding the datanode to {}", args.datanode_bind))?;
    let standby_listener = if args.standby {
        Some(
            TcpListener::bind(args.standby_bind)
                .await
                .with_context(|| {
                    format!("binding the standby namenode to {}", args.standby_bind)
                })?,
        )
    } else {
        None
    };
    let namenode_addr = nn_listener.local_addr()?;
    let datanode_addr = dn_listener.local_addr()?;
    let sim = Arc::new(Sim {
        store: store::Store::new(root.clone(), args.default_owner.clone()),
        namenode_addr,
        datanode_addr,
        fail_remaining: AtomicU64::new(args.fail_first),
        fail_with: args.fail_with,
        list_limit: args.list_limit.max(1),
        no_list_batch: args.no_list_batch,
    });

    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let serve = |name: &'static str, listener: TcpListener, router: axum::Router| {
        let token = shutdown.clone();
        tracker.spawn(async move {
            let res = axum::serve(listener, router)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
            if let Err(e) = res {
                tracing::error!(server = name, error = %e, "server failed");
            }
        });
    };
    serve("namenode", nn_listener, namenode::router(sim.clone()));
    serve("datanode", dn_listener, datanode::router(sim.clone()));
    let mut ready = serde_json::json!({
        "namenode": format!("http://{namenode_addr}"),
        "datanode": format!("http://{datanode_addr}"),
    });
    if let Some(l) = standby_listener {
        let addr = l.local_addr()?;
        ready["standby"] = format!("http://{addr}").into();
        serve("standby", l, namenode::standby_router());
    }
    tracing::info!(root = %root.display(), ready = %ready, "WebHDFS simulator listening");
    if let Some(path) = &args.ready_file {
        write_ready_file(path, &ready)?;
    }

    wait_for_signal().await?;
    tracing::info!("shutting down");
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// Writes the ready file atomically (temp file + rename), so a reader never
/// sees it half written.
fn write_ready_file(path: &std::path::Path, ready: &serde_json::Value) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp-ready");
    std::fs::write(&tmp, serde_json::to_vec(ready)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing --ready-file {}", path.display()))
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    Ok(())
}

// ---- requests -------------------------------------------------------------

/// The parts of a WebHDFS request the handlers need.
#[derive(Debug)]
pub struct Request {
    /// The file-system path (decoded, normalised, starting with `/`).
    pub path: String,
    /// Query parameters with lower-cased names (the namenode ignores case).
    pub params: HashMap<String, String>,
}

impl Request {
    /// Parses `/webhdfs/v1/<path>?<query>`.
    pub fn parse(uri: &axum::http::Uri) -> Result<Request, RemoteException> {
        let raw = uri.path();
        let Some(rest) = raw.strip_prefix("/webhdfs/v1") else {
            return Err(RemoteException::new(
                StatusCode::NOT_FOUND,
                "FileNotFoundException",
                "java.io.FileNotFoundException",
                format!("{raw} is not under /webhdfs/v1"),
            ));
        };
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(RemoteException::illegal_argument(format!(
                "Invalid path {raw}"
            )));
        }
        let decoded = percent_encoding::percent_decode_str(rest)
            .decode_utf8()
            .map_err(|_| {
                RemoteException::illegal_argument(format!("Invalid path {raw}: not UTF-8"))
            })?;
        let mut path = String::new();
        for seg in decoded.split('/').filter(|s| !s.is_empty()) {
            if seg == "." || seg == ".." || seg.contains(':') {
                return Err(RemoteException::illegal_argument(format!(
                    "Invalid path name Invalid file name: {decoded}"
                )));
            }
            path.push('/');
            path.push_str(seg);
        }
        if path.is_empty() {
            path.push('/');
        }
        let mut params = HashMap::new();
        if let Some(q) = uri.query() {
            for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
                params.insert(k.to_ascii_lowercase(), v.into_owned());
            }
        }
        Ok(Request { path, params })
    }

    /// A parameter's value.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// The `op`, upper-cased.
    pub fn op(&self) -> Option<String> {
        self.param("op").map(|o| o.to_ascii_uppercase())
    }

    /// A boolean parameter, compared case-insensitively (HdfsCLI sends `True`).
    pub fn bool_param(&self, name: &str, default: bool) -> Result<bool, RemoteException> {
        match self.param(name) {
            None => Ok(default),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => Err(RemoteException::invalid_param(name, v, "true|false")),
        }
    }

    /// A non-negative integer parameter.
    pub fn u64_param(&self, name: &str) -> Result<Option<u64>, RemoteException> {
        match self.param(name) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| RemoteException::invalid_param(name, v, "[0, 9223372036854775807]")),
        }
    }

    /// An octal permission parameter (`644`).
    pub fn permission_param(&self, name: &str, default: u32) -> Result<u32, RemoteException> {
        match self.param(name) {
            None => Ok(default),
            Some(v) => u32::from_str_radix(v, 8)
                .ok()
                .filter(|p| *p <= 0o1777)
                .ok_or_else(|| RemoteException::invalid_param(name, v, "[0, 1777]")),
        }
    }

    /// The user: `user.name`, else Hadoop's static web user `dr.who`.
    pub fn user(&self) -> Result<String, RemoteException> {
        match self.param("user.name") {
            None => Ok("dr.who".to_string()),
            Some(u) if valid_user(u) => Ok(u.to_string()),
            Some(u) => Err(RemoteException::invalid_param(
                "user.name",
                u,
                "^[A-Za-z_][A-Za-z0-9._-]*[$]?$",
            )),
        }
    }
}

/// `dfs.webhdfs.user.provider.user.pattern`'s default, `^[A-Za-z_][A-Za-z0-9._-]*[$]?$`.
fn valid_user(u: &str) -> bool {
    let body = u.strip_suffix('$').unwrap_or(u);
    let mut chars = body.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

// ---- errors ---------------------------------------------------------------

/// A Hadoop `RemoteException` answer.
#[derive(Debug, Clone)]
pub struct RemoteException {
    pub status: StatusCode,
    pub exception: &'static str,
    pub java_class_name: &'static str,
    pub message: String,
}

impl RemoteException {
    pub fn new(
        status: StatusCode,
        exception: &'static str,
        java_class_name: &'static str,
        message: impl Into<String>,
    ) -> Self {
        RemoteException {
            status,
            exception,
            java_class_name,
            message: message.into(),
        }
    }

    pub fn illegal_argument(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "IllegalArgumentException",
            "java.lang.IllegalArgumentException",
            message,
        )
    }

    pub fn invalid_param(name: &str, value: &str, domain: &str) -> Self {
        Self::illegal_argument(format!(
            "Invalid value for webhdfs parameter \"{name}\": Invalid value: \"{value}\" does not belong to the domain {domain}"
        ))
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "UnsupportedOperationException",
            "java.lang.UnsupportedOperationException",
            message,
        )
    }

    pub fn file_not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "FileNotFoundException",
            "java.io.FileNotFoundException",
            message,
        )
    }

    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "FileAlreadyExistsException",
            "org.apache.hadoop.fs.FileAlreadyExistsException",
            message,
        )
    }

    pub fn parent_not_directory(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "ParentNotDirectoryException",
            "org.apache.hadoop.fs.ParentNotDirectoryException",
            message,
        )
    }

    pub fn not_empty(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "PathIsNotEmptyDirectoryException",
            "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
            message,
        )
    }

    pub fn io(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "IOException",
            "java.io.IOException",
            message,
        )
    }

    pub fn eof(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "EOFException",
            "java.io.EOFException",
            message,
        )
    }

    pub fn standby() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "StandbyException",
            "org.apache.hadoop.ipc.StandbyException",
            "Operation category READ is not supported in state standby. Visit https://s.apache.org/sbnn-error",
        )
    }

    pub fn retriable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "RetriableException",
            "org.apache.hadoop.ipc.RetriableException",
            message,
        )
    }
}

impl IntoResponse for RemoteException {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "RemoteException": {
                "exception": self.exception,
                "javaClassName": self.java_class_name,
                "message": self.message,
            }
        });
        (self.status, Json(body)).into_response()
    }
}

/// A 200 JSON answer.
pub fn json_ok(value: serde_json::Value) -> Response {
    let mut resp = Json(value).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Percent-encodes a file-system path for a URL.
pub fn encode_path(path: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'`')
        .add(b'{')
        .add(b'}')
        .add(b'\\')
        .add(b'^')
        .add(b'|')
        .add(b'[')
        .add(b']')
        .add(b';');
    percent_encoding::utf8_percent_encode(path, SEGMENT).to_string()
}
