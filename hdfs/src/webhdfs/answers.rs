//! What WebHDFS servers answer, and how it is read: the JSON shapes of
//! namenode answers, `RemoteException` decoding into [`HdfsError::Remote`],
//! bodies read as they arrive under a [`BodyLimit`], and transport failures
//! turned into errors that say whether a retry may help.

use bytes::Bytes;
use serde::Deserialize;
use url::Url;

use super::{Idempotence, ListEntry, redact};
use crate::error::{HdfsError, Result};
use crate::fs::FileStatus;

// ---- JSON shapes

#[derive(Deserialize)]
struct RemoteExceptionBody {
    #[serde(rename = "RemoteException")]
    pub(super) remote_exception: RemoteException,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RemoteException {
    pub(super) exception: Option<String>,
    pub(super) java_class_name: Option<String>,
    pub(super) message: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JsonFileStatus {
    pub(super) length: u64,
    pub(super) modification_time: u64,
    pub(super) path_suffix: String,
    pub(super) permission: String,
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) owner: String,
    #[serde(default)]
    pub(super) group: String,
    #[serde(default)]
    pub(super) replication: u16,
    #[serde(default)]
    pub(super) block_size: u64,
}

#[derive(Deserialize)]
pub(super) struct FileStatusBody {
    #[serde(rename = "FileStatus")]
    pub(super) file_status: JsonFileStatus,
}

#[derive(Deserialize)]
pub(super) struct FileStatusesBody {
    #[serde(rename = "FileStatuses")]
    pub(super) file_statuses: FileStatusList,
}

#[derive(Deserialize)]
pub(super) struct FileStatusList {
    #[serde(rename = "FileStatus")]
    pub(super) file_status: Vec<JsonFileStatus>,
}

#[derive(Deserialize)]
pub(super) struct DirectoryListingBody {
    #[serde(rename = "DirectoryListing")]
    pub(super) directory_listing: DirectoryListing,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DirectoryListing {
    pub(super) partial_listing: FileStatusesBody,
    pub(super) remaining_entries: u64,
}

#[derive(Deserialize)]
pub(super) struct BooleanBody {
    pub(super) boolean: bool,
}

#[derive(Deserialize)]
pub(super) struct LocationBody {
    #[serde(rename = "Location")]
    pub(super) location: String,
}

// ---- reading answers

/// Most bytes of an error body read (only its start is quoted).
const MAX_ERROR_BODY: u64 = 64 << 10;

/// The longest file length believed: 2^53 bytes (8 PiB), also the largest
/// integer a JSON number holds exactly.
const MAX_FILE_LENGTH: u64 = 1 << 53;

/// Most bytes of an error body quoted in a message.
const MAX_QUOTED_BODY: usize = 300;

pub(super) fn transport(
    op: &'static str,
    url: &Url,
    e: reqwest::Error,
    idem: Idempotence,
) -> HdfsError {
    let retryable = match idem {
        Idempotence::Idempotent => !e.is_builder(),
        Idempotence::NotIdempotent => e.is_connect(),
    };
    HdfsError::Transport {
        op,
        endpoint: redact(url),
        retryable,
        source: e.without_url(),
    }
}

/// Decodes an error response into [`HdfsError::Remote`].
pub(super) async fn decode_error(
    op: &'static str,
    url: &Url,
    resp: reqwest::Response,
    idem: Idempotence,
    limit: BodyLimit,
) -> HdfsError {
    let status = resp.status().as_u16();
    let retry_after_secs = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after_secs);
    let text = match read_error_body(op, url, resp, limit, idem).await {
        Ok(t) => t,
        Err(e) => return e,
    };
    let (exception, java_class_name, message) =
        match serde_json::from_str::<RemoteExceptionBody>(&text) {
            Ok(b) => {
                let r = b.remote_exception;
                let exception = r
                    .exception
                    .or_else(|| {
                        r.java_class_name
                            .as_deref()
                            .map(|c| c.rsplit('.').next().unwrap_or(c).to_string())
                    })
                    .unwrap_or_else(|| "RemoteException".to_string());
                (exception, r.java_class_name, r.message.unwrap_or_default())
            }
            Err(_) => (
                "HTTP".to_string(),
                None,
                if text.trim().is_empty() {
                    "no RemoteException in the response body (empty body)".to_string()
                } else {
                    format!("no RemoteException in the response body: {}", quote(&text))
                },
            ),
        };
    let server_says_retry = matches!(
        exception.as_str(),
        "StandbyException" | "RetriableException"
    ) || java_class_name
        .as_deref()
        .is_some_and(|c| c.ends_with(".StandbyException") || c.ends_with(".RetriableException"));
    let retryable =
        server_says_retry || (idem == Idempotence::Idempotent && (status >= 500 || status == 429));
    HdfsError::Remote {
        op,
        endpoint: redact(url),
        status,
        exception,
        java_class_name,
        message,
        retryable,
        retry_after_secs,
    }
}

/// A success-range status the step does not expect (e.g. 200 where 201 is
/// due is fine, but a 3xx from a datanode is not).
pub(super) async fn unexpected_status(
    op: &'static str,
    url: &Url,
    resp: reqwest::Response,
    limit: BodyLimit,
) -> HdfsError {
    let status = resp.status().as_u16();
    let text = match read_error_body(op, url, resp, limit, Idempotence::Idempotent).await {
        Ok(t) => t,
        Err(e) => return e,
    };
    HdfsError::MalformedResponse {
        op,
        endpoint: redact(url),
        status,
        detail: format!("unexpected status for this step; body: {}", quote(&text)),
    }
}

pub(super) async fn json_body<T: serde::de::DeserializeOwned>(
    op: &'static str,
    url: &Url,
    resp: reqwest::Response,
    limit: BodyLimit,
) -> Result<T> {
    let status = resp.status().as_u16();
    if status != 200 && status != 201 {
        return Err(HdfsError::MalformedResponse {
            op,
            endpoint: redact(url),
            status,
            detail: "expected 200 with a JSON body".into(),
        });
    }
    let body = read_body(op, url, resp, limit, Idempotence::Idempotent).await?;
    serde_json::from_slice(&body).map_err(|e| HdfsError::MalformedResponse {
        op,
        endpoint: redact(url),
        status,
        detail: format!(
            "invalid JSON ({e}): {}",
            quote(&String::from_utf8_lossy(&body))
        ),
    })
}

/// The seconds a `Retry-After` value asks to wait: a number of seconds, or
/// an HTTP date (the whole seconds until then; 0 when it has passed).
fn retry_after_secs(value: &str) -> Option<u32> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u32>() {
        return Some(secs);
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let wait = at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    Some(u32::try_from(wait.as_secs()).unwrap_or(u32::MAX))
}

/// What bounds a response body.
#[derive(Debug, Clone, Copy)]
pub(super) enum BodyLimit {
    /// The length of the range asked for (`OPEN`).
    Range(u64),
    /// The limit on JSON and error bodies
    /// ([`WebHdfsOptions::max_response_bytes`]).
    Response(u64),
}

impl BodyLimit {
    fn bytes(self) -> u64 {
        match self {
            BodyLimit::Range(n) | BodyLimit::Response(n) => n,
        }
    }

    fn exceeded(self, seen: u64, announced: bool) -> String {
        let (limit, what) = match self {
            BodyLimit::Range(n) => (n, "the length asked for"),
            BodyLimit::Response(n) => (
                n,
                "the limit on JSON and error bodies (hdfs.max_response_bytes)",
            ),
        };
        if announced {
            format!("the body announces {seen} bytes, more than {limit} ({what}); not read")
        } else {
            format!("the body goes on past {limit} bytes ({what}); stopped reading")
        }
    }
}

/// Reads a response body of at most `limit` bytes as it arrives: a
/// `Content-Length` above the limit fails before any of it is read, a body
/// that goes past it fails at the chunk that crosses it, and a body that
/// ends early (closed connection, timeout) is a [`HdfsError::BodyRead`],
/// retryable when the request is.
pub(super) async fn read_body(
    op: &'static str,
    url: &Url,
    mut resp: reqwest::Response,
    limit: BodyLimit,
    idem: Idempotence,
) -> Result<Bytes> {
    let status = resp.status().as_u16();
    let expected = resp.content_length();
    let too_large = |seen, announced| HdfsError::TooLarge {
        op,
        endpoint: redact(url),
        status,
        what: limit.exceeded(seen, announced),
    };
    if let Some(n) = expected
        && n > limit.bytes()
    {
        return Err(too_large(n, true));
    }
    let capacity = expected.unwrap_or(0).min(limit.bytes()).min(1 << 20);
    let mut buf = bytes::BytesMut::with_capacity(usize::try_from(capacity).unwrap_or(0));
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let seen = (buf.len() as u64).saturating_add(chunk.len() as u64);
                if seen > limit.bytes() {
                    return Err(too_large(seen, false));
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(buf.freeze()),
            Err(e) => return Err(body_read(op, url, status, buf.len(), expected, &e, idem)),
        }
    }
}

/// An error body as text, at most [`MAX_ERROR_BODY`] bytes of it (and at
/// most the response limit): a longer one is cut there, since only its
/// start is quoted.
async fn read_error_body(
    op: &'static str,
    url: &Url,
    mut resp: reqwest::Response,
    limit: BodyLimit,
    idem: Idempotence,
) -> Result<String> {
    let cap = limit.bytes().min(MAX_ERROR_BODY) as usize;
    let status = resp.status().as_u16();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - buf.len();
                if chunk.len() > room {
                    buf.extend_from_slice(&chunk[..room]);
                    let mut text = String::from_utf8_lossy(&buf).into_owned();
                    text.push_str(&format!(" ... (cut at {cap} bytes)"));
                    return Ok(text);
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(String::from_utf8_lossy(&buf).into_owned()),
            Err(e) => {
                let expected = resp.content_length();
                return Err(body_read(op, url, status, buf.len(), expected, &e, idem));
            }
        }
    }
}

/// A body that ended after `received` bytes with `e`.
fn body_read(
    op: &'static str,
    url: &Url,
    status: u16,
    received: usize,
    expected: Option<u64>,
    e: &reqwest::Error,
    idem: Idempotence,
) -> HdfsError {
    HdfsError::BodyRead {
        op,
        endpoint: redact(url),
        status,
        received: received as u64,
        expected,
        reason: error_chain(e),
        retryable: idem == Idempotence::Idempotent,
    }
}

/// An error and its causes on one line (reqwest's own message hides the
/// cause, e.g. that the connection closed mid-body).
fn error_chain(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut s = if e.is_timeout() {
        "timed out".to_string()
    } else {
        e.to_string()
    };
    let mut src = e.source();
    let mut depth = 0;
    while let Some(inner) = src
        && depth < 5
    {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
        depth += 1;
    }
    s
}

fn quote(text: &str) -> String {
    if text.len() <= MAX_QUOTED_BODY {
        format!("{text:?}")
    } else {
        let mut end = MAX_QUOTED_BODY;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{:?}... ({} bytes)", &text[..end], text.len())
    }
}

pub(super) fn entries(
    op: &'static str,
    url: &Url,
    dir: &str,
    list: Vec<JsonFileStatus>,
) -> Result<Vec<ListEntry>> {
    list.into_iter()
        .map(|js| {
            let suffix = js.path_suffix.clone();
            let child = if suffix.is_empty() {
                dir.to_string()
            } else {
                crate::local::join_uri(dir, &suffix)
            };
            Ok(ListEntry {
                suffix,
                status: convert_status(op, url, js, &child)?,
            })
        })
        .collect()
}

pub(super) fn convert_status(
    op: &'static str,
    url: &Url,
    js: JsonFileStatus,
    path: &str,
) -> Result<FileStatus> {
    let bad = |detail: String| HdfsError::MalformedResponse {
        op,
        endpoint: redact(url),
        status: 200,
        detail,
    };
    let is_dir = match js.kind.as_str() {
        "DIRECTORY" => true,
        "FILE" | "SYMLINK" => false,
        other => {
            return Err(bad(format!(
                "FileStatus type {other:?} is not FILE, DIRECTORY or SYMLINK"
            )));
        }
    };
    let permission = u16::from_str_radix(&js.permission, 8)
        .ok()
        .filter(|p| *p <= 0o7777)
        .ok_or_else(|| {
            bad(format!(
                "FileStatus permission {:?} is not an octal string",
                js.permission
            ))
        })?;
    if js.length > MAX_FILE_LENGTH {
        return Err(bad(format!(
            "FileStatus length {} is beyond any real file (more than 2^53 bytes)",
            js.length
        )));
    }
    Ok(FileStatus {
        uri: path.to_string(),
        path: path.to_string(),
        len: js.length,
        is_dir,
        modification_time: js.modification_time,
        permission,
        owner: js.owner,
        group: js.group,
        replication: js.replication,
        block_size: js.block_size,
    })
}
