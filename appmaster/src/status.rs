//! The AM's status endpoint: `GET /status` answers the job's current
//! [`Status`] as JSON. The event loop publishes snapshots on a watch channel;
//! this server only reads them, so it never blocks the loop.

use std::net::SocketAddr;

use axum::{Json, Router, extract::State, routing::get};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::am::{AmError, Status};

/// Binds `bind` and serves until `cancel`. Returns the bound address.
pub async fn serve(
    bind: &str,
    status: watch::Receiver<Status>,
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
        .route("/status", get(current))
        .with_state(status);
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

async fn current(State(status): State<watch::Receiver<Status>>) -> Json<Status> {
    Json(status.borrow().clone())
}
