//! The AM's HTTP endpoint on its status port:
//!
//! | route | answers |
//! |---|---|
//! | `GET /` | the web UI ([`crate::ui::page`]), refreshing itself |
//! | `GET /panels` | the UI's contents, for its refresh |
//! | `GET /status` | the job's current [`Status`] as JSON |
//! | `GET /history` | the job's history so far, a JSON array of records |
//! | `GET /metrics` | Prometheus metrics ([`crate::exposition`]) |
//! | `GET /logs/{container}/{stdout,stderr}` | the end of a local container's log |
//!
//! The event loop publishes status snapshots and the history writer its
//! records on watch channels; this server only reads them (a borrow to
//! clone an `Arc` or a snapshot), and draws pages and metrics on its own
//! tasks, so it never blocks the loop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::{Json, Router, routing::get};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::am::history::Published as History;
use crate::am::{AmError, Status};
use crate::ui;

/// The most of a log `/logs` answers: its end.
const LOG_TAIL_BYTES: u64 = 256 * 1024;

/// What the endpoint serves from.
#[derive(Clone)]
pub struct Published {
    /// The job's status snapshots.
    pub status: watch::Receiver<Status>,
    /// The job's history.
    pub history: watch::Receiver<History>,
    /// Where local containers' logs are (`<dir>/<container>/stderr`), if
    /// the runtime keeps them on this machine.
    pub logs: Option<PathBuf>,
}

/// Binds `bind` and serves until `cancel`. Returns the bound address.
pub async fn serve(
    bind: &str,
    published: Published,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> Result<SocketAddr, AmError> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|source| AmError::Io {
            context: format!("binding the status endpoint (status.bind = {bind})"),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| AmError::Io {
        context: "status endpoint address".into(),
        source,
    })?;
    let app = Router::new()
        .route("/", get(page))
        .route("/panels", get(panels))
        .route("/status", get(current))
        .route("/history", get(history))
        .route("/metrics", get(metrics))
        .route("/logs/{container}/{file}", get(log))
        .with_state(published);
    tracker.spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::warn!("status endpoint stopped: {e}");
        }
    });
    Ok(addr)
}

impl Published {
    /// The current status and history (cheap: a snapshot clone and an `Arc`).
    fn now(&self) -> (Status, History) {
        (
            self.status.borrow().clone(),
            Arc::clone(&self.history.borrow()),
        )
    }

    fn logs(&self) -> ui::Logs<'static> {
        if self.logs.is_some() {
            ui::Logs::Under("/logs")
        } else {
            ui::Logs::None
        }
    }
}

async fn current(State(p): State<Published>) -> Json<Status> {
    Json(p.status.borrow().clone())
}

async fn history(State(p): State<Published>) -> Response {
    let records = Arc::clone(&p.history.borrow());
    match serde_json::to_string(&*records) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the history: {e}"),
        )
            .into_response(),
    }
}

async fn page(State(p): State<Published>) -> Html<String> {
    let (status, history) = p.now();
    Html(ui::page(&history, Some(&status), p.logs(), true))
}

async fn panels(State(p): State<Published>) -> Html<String> {
    let (status, history) = p.now();
    Html(ui::panels(&history, Some(&status), p.logs()))
}

async fn metrics(State(p): State<Published>) -> Response {
    let (status, history) = p.now();
    match crate::exposition::encode(&status, &history) {
        Ok(text) => (
            [(header::CONTENT_TYPE, crate::exposition::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the metrics: {e}"),
        )
            .into_response(),
    }
}

/// The end of a local container's `stdout` or `stderr`.
async fn log(
    State(p): State<Published>,
    Path((container, file)): Path<(String, String)>,
) -> Response {
    let Some(dir) = &p.logs else {
        return (StatusCode::NOT_FOUND, "no local logs on this runtime").into_response();
    };
    let known = p
        .status
        .borrow()
        .evaluators
        .iter()
        .any(|e| e.container == container);
    if !known || !matches!(file.as_str(), "stdout" | "stderr") {
        return (StatusCode::NOT_FOUND, "no such container log").into_response();
    }
    let path = dir.join(&container).join(&file);
    match tail(&path).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{}: {e}", path.display())).into_response(),
    }
}

/// The last [`LOG_TAIL_BYTES`] of a file.
async fn tail(path: &std::path::Path) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = tokio::fs::File::open(path).await?;
    let len = f.metadata().await?.len();
    f.seek(std::io::SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))
        .await?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
