//! The datanode endpoint: streams file ranges for `OPEN` and stores the
//! (possibly chunked) request bodies of `CREATE` and `APPEND`. Like a real
//! datanode it insists on the `namenoderpcaddress` the namenode's redirect
//! carries, so a client that skips the redirect fails here.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{RemoteException, Request, Sim};

/// The datanode's router.
pub fn router(sim: Arc<Sim>) -> Router {
    Router::new().fallback(handle).with_state(sim)
}

async fn handle(State(sim): State<Arc<Sim>>, method: Method, uri: Uri, body: Body) -> Response {
    tracing::debug!(%method, %uri, "datanode request");
    match dispatch(&sim, &method, &uri, body).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::debug!(%method, %uri, status = %e.status, exception = e.exception, message = %e.message, "datanode error");
            let mut resp = e.into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
    }
}

async fn dispatch(
    sim: &Sim,
    method: &Method,
    uri: &Uri,
    body: Body,
) -> Result<Response, RemoteException> {
    let req = Request::parse(uri)?;
    let op = req.op().unwrap_or_default();
    if req.param("namenoderpcaddress").is_none() {
        return Err(RemoteException::illegal_argument(
            "namenoderpcaddress is not specified.",
        ));
    }
    let user = req.user()?;
    let path = req.path.as_str();
    match (method.clone(), op.as_str()) {
        (Method::GET, "OPEN") => {
            let offset = req.u64_param("offset")?.unwrap_or(0);
            let length = req.u64_param("length")?;
            let (file, n) = sim.store.open_read(path, offset, length).await?;
            // Large reads: each read of a tokio file is a blocking-pool
            // round trip, and the default 4 KiB chunks capped the datanode
            // at ~80 MB/s.
            let stream = tokio_util::io::ReaderStream::with_capacity(file.take(n), 1 << 20);
            let mut resp = Response::new(Body::from_stream(stream));
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
            Ok(resp)
        }
        (Method::PUT, "CREATE") => {
            let overwrite = req.bool_param("overwrite", false)?;
            let perm = req.permission_param("permission", 0o644)?;
            let file = sim.store.create(path, overwrite, perm, &user).await?;
            write_body(path, file, body).await?;
            let location = format!("hdfs://{}{}", sim.namenode_addr, super::encode_path(path));
            let mut resp = StatusCode::CREATED.into_response();
            let h = resp.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&location) {
                h.insert(header::LOCATION, v);
            }
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
            Ok(resp)
        }
        (Method::POST, "APPEND") => {
            let file = sim.store.open_append(path).await?;
            write_body(path, file, body).await?;
            let mut resp = StatusCode::OK.into_response();
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
            Ok(resp)
        }
        (Method::GET, "GETFILECHECKSUM") => Err(RemoteException::unsupported(
            "GETFILECHECKSUM is not implemented by the cruise-sim WebHDFS simulator",
        )),
        (_, other) => Err(RemoteException::illegal_argument(format!(
            "Invalid operation {other}"
        ))),
    }
}

/// Streams a request body (plain or chunked) into `file`.
async fn write_body(
    path: &str,
    mut file: tokio::fs::File,
    body: Body,
) -> Result<(), RemoteException> {
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| RemoteException::io(format!("reading the data for {path}: {e}")))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| RemoteException::io(format!("writing {path}: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| RemoteException::io(format!("writing {path}: {e}")))?;
    Ok(())
}
