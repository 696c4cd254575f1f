//! WebHDFS REST client (see `PROTOCOLS.md` §4).
//!
//! Owns the HTTP conversation with namenodes and datanodes:
//! - reads (`OPEN`) follow the namenode's 307 redirect to a datanode by hand,
//!   keeping `user.name`/`doas`/`delegation` on the datanode URL;
//! - writes (`CREATE`, `APPEND`) are two steps: ask the namenode with
//!   `noredirect=true` (a 307 from an older server is accepted too), then send
//!   the data to the returned datanode `Location`;
//! - errors are decoded from the `RemoteException` JSON into
//!   [`HdfsError::Remote`] with a retryable flag; `StandbyException`,
//!   `RetriableException`, 5xx and connection failures are retried with
//!   exponential backoff ([`RetryPolicy`]; at least what a `Retry-After`
//!   asks), and `StandbyException` or an
//!   unreachable namenode rotates to the next configured namenode (HA failover);
//! - `LISTSTATUS_BATCH` is used for listings and falls back to `LISTSTATUS`
//!   when the server does not know it; pages must advance (`startAfter`
//!   grows) and a listing holds at most `max_list_entries` entries;
//! - every body is read as it arrives with a limit: the range asked for
//!   (`OPEN`), `max_response_bytes` (JSON answers), a few KiB (error
//!   bodies); a body that ends early is a [`HdfsError::BodyRead`], retried
//!   like a transport failure;
//! - an operation has a time budget (`deadline`) over all its attempts,
//!   besides the timeouts of one request.
//!
//! Data-carrying steps that are not idempotent (`APPEND`'s upload) are retried
//! only when the request certainly did not reach the server (connect failure)
//! or the server said so (`RetriableException`, `StandbyException`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use reqwest::{Method, StatusCode};
use url::Url;

use crate::error::{HdfsError, Result};
use crate::fs::FileStatus;

mod answers;
use answers::{
    BodyLimit, BooleanBody, DirectoryListingBody, FileStatusBody, FileStatusesBody, LocationBody,
    convert_status, decode_error, entries, json_body, read_body, transport, unexpected_status,
};

/// Characters percent-encoded in a path segment of a WebHDFS URL.
const SEGMENT: &AsciiSet = &CONTROLS
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
    .add(b'/')
    .add(b'\\')
    .add(b'^')
    .add(b'|')
    .add(b'[')
    .add(b']')
    .add(b';');

/// How often a request that has not been answered says so.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How failed requests are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per operation, including the first (at least 1). With several
    /// namenodes, one extra attempt per additional namenode is allowed so that
    /// a failover round does not use up the budget.
    pub max_attempts: u32,
    /// Wait before the first retry; doubles after each retry.
    pub initial_backoff: Duration,
    /// Upper bound of the wait between retries.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Options of a [`WebHdfsClient`].
#[derive(Debug, Clone)]
pub struct WebHdfsOptions {
    /// The `user.name` sent with every request (simple authentication).
    pub user: Option<String>,
    /// The `doas` proxy user, if any.
    pub doas: Option<String>,
    /// A delegation token sent as `delegation=` (never shown in messages).
    pub delegation: Option<String>,
    /// Retry and backoff.
    pub retry: RetryPolicy,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one whole request (including the body), if any.
    pub request_timeout: Option<Duration>,
    /// Longest silence while waiting for the answer or the next bytes of
    /// a body, if any.
    pub read_timeout: Option<Duration>,
    /// Time budget of one operation, all its attempts and backoffs
    /// included: no retry starts that would end after it.
    pub deadline: Option<Duration>,
    /// Most bytes of a JSON answer or an error body; a longer one fails
    /// the operation without being read further. `OPEN` reads at most the
    /// range asked for (this limit when no length is given).
    pub max_response_bytes: u64,
    /// Most entries of one directory listing (over all its
    /// `LISTSTATUS_BATCH` pages).
    pub max_list_entries: u64,
}

impl Default for WebHdfsOptions {
    fn default() -> Self {
        WebHdfsOptions {
            user: None,
            doas: None,
            delegation: None,
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Some(Duration::from_secs(60)),
            read_timeout: Some(Duration::from_secs(20)),
            deadline: Some(Duration::from_secs(90)),
            max_response_bytes: 64 << 20,
            max_list_entries: 1_000_000,
        }
    }
}

impl WebHdfsOptions {
    /// Defaults with the user from `$HADOOP_USER_NAME`, else the OS user.
    pub fn from_env() -> Self {
        let user = std::env::var("HADOOP_USER_NAME")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(crate::conf::os_user_name);
        WebHdfsOptions {
            user: Some(user),
            ..WebHdfsOptions::default()
        }
    }

    /// These options with `user.name` set.
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// These options with a retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// The child's name; empty when the listed path is a file (the file
    /// lists as itself).
    pub suffix: String,
    /// Its status; `uri` and `path` hold the child's absolute path.
    pub status: FileStatus,
}

/// A WebHDFS client for one file system (one namenode, or the namenodes of an
/// HA nameservice in failover order). Cheap to clone.
#[derive(Debug, Clone)]
pub struct WebHdfsClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    namenodes: Vec<Url>,
    /// Index of the namenode believed active.
    active: AtomicUsize,
    options: WebHdfsOptions,
    /// Set once a server answered LISTSTATUS_BATCH with 400.
    no_batch_listing: AtomicBool,
}

// ---- the client ---------------------------------------------------------

/// How a step's request may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idempotence {
    /// Safe to resend on any transport failure or 5xx.
    Idempotent,
    /// Resend only if the request surely did not take effect.
    NotIdempotent,
}

impl WebHdfsClient {
    /// A client for the given namenode HTTP base URLs (`http://host:port`),
    /// in failover order.
    pub fn new(namenodes: Vec<String>, options: WebHdfsOptions) -> Result<Self> {
        if namenodes.is_empty() {
            return Err(HdfsError::Config {
                source_name: "namenodes".into(),
                reason: "no namenode HTTP address given".into(),
            });
        }
        let namenodes = namenodes
            .iter()
            .map(|s| {
                let url = Url::parse(s).map_err(|e| HdfsError::Config {
                    source_name: s.clone(),
                    reason: format!("not a namenode HTTP URL: {e}"),
                })?;
                if url.scheme() != "http" || url.host_str().is_none() {
                    return Err(HdfsError::Config {
                        source_name: s.clone(),
                        reason: "namenode URL must be http://host:port".into(),
                    });
                }
                Ok(url)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(options.connect_timeout)
            .user_agent(concat!("cruise-hdfs/", env!("CARGO_PKG_VERSION")));
        if let Some(t) = options.request_timeout {
            builder = builder.timeout(t);
        }
        if let Some(t) = options.read_timeout {
            builder = builder.read_timeout(t);
        }
        let http = builder.build().map_err(|e| HdfsError::Config {
            source_name: "HTTP client".into(),
            reason: e.to_string(),
        })?;
        Ok(WebHdfsClient {
            inner: Arc::new(Inner {
                http,
                namenodes,
                active: AtomicUsize::new(0),
                options,
                no_batch_listing: AtomicBool::new(false),
            }),
        })
    }

    /// The namenode base URLs in failover order.
    pub fn namenodes(&self) -> Vec<String> {
        self.inner
            .namenodes
            .iter()
            .map(|u| u.as_str().trim_end_matches('/').to_string())
            .collect()
    }

    /// The namenode currently believed active.
    pub fn active_namenode(&self) -> String {
        let i = self.inner.active.load(Ordering::Relaxed) % self.inner.namenodes.len();
        self.inner.namenodes[i]
            .as_str()
            .trim_end_matches('/')
            .to_string()
    }

    /// The limit on JSON and error bodies.
    fn limit(&self) -> BodyLimit {
        BodyLimit::Response(self.inner.options.max_response_bytes)
    }

    // ---- operations --------------------------------------------------

    /// `GETFILESTATUS`.
    pub async fn get_file_status(&self, path: &str) -> Result<FileStatus> {
        let op = "GETFILESTATUS";
        self.run(op, path, |nn: Url| async move {
            let url = self.url(&nn, path, op, &[]);
            let resp = self
                .send(op, Method::GET, &url, None, Idempotence::Idempotent)
                .await?;
            let body: FileStatusBody = json_body(op, &url, resp, self.limit()).await?;
            convert_status(op, &url, body.file_status, path)
        })
        .await
    }

    /// The entries of a directory (`LISTSTATUS_BATCH`, or `LISTSTATUS` when
    /// the server lacks it). A file lists as itself with an empty suffix.
    pub async fn list_status(&self, path: &str) -> Result<Vec<ListEntry>> {
        if !self.inner.no_batch_listing.load(Ordering::Relaxed) {
            match self.list_status_batch(path).await {
                Ok(v) => return Ok(v),
                Err(e) if is_unsupported_op(&e) => {
                    let out = self.list_status_plain(path).await?;
                    tracing::debug!("server lacks LISTSTATUS_BATCH; using LISTSTATUS from now on");
                    self.inner.no_batch_listing.store(true, Ordering::Relaxed);
                    return Ok(out);
                }
                Err(e) => return Err(e),
            }
        }
        self.list_status_plain(path).await
    }

    async fn list_status_plain(&self, path: &str) -> Result<Vec<ListEntry>> {
        let op = "LISTSTATUS";
        self.run(op, path, |nn: Url| async move {
            let url = self.url(&nn, path, op, &[]);
            let resp = self
                .send(op, Method::GET, &url, None, Idempotence::Idempotent)
                .await?;
            let body: FileStatusesBody = json_body(op, &url, resp, self.limit()).await?;
            let list = body.file_statuses.file_status;
            let max = self.inner.options.max_list_entries;
            if list.len() as u64 > max {
                return Err(too_many_entries(op, &url, max, list.len().to_string()));
            }
            entries(op, &url, path, list)
        })
        .await
    }

    async fn list_status_batch(&self, path: &str) -> Result<Vec<ListEntry>> {
        let op = "LISTSTATUS_BATCH";
        let mut out: Vec<ListEntry> = Vec::new();
        let mut start_after: Option<String> = None;
        loop {
            let after = &start_after;
            let (batch, remaining, url) = self
                .run(op, path, |nn: Url| async move {
                    let params: Vec<(&str, String)> = match after {
                        Some(s) => vec![("startAfter", s.clone())],
                        None => vec![],
                    };
                    let url = self.url(&nn, path, op, &params);
                    let resp = self
                        .send(op, Method::GET, &url, None, Idempotence::Idempotent)
                        .await?;
                    let body: DirectoryListingBody =
                        json_body(op, &url, resp, self.limit()).await?;
                    let listing = body.directory_listing;
                    let batch = entries(
                        op,
                        &url,
                        path,
                        listing.partial_listing.file_statuses.file_status,
                    )?;
                    Ok((batch, listing.remaining_entries, url))
                })
                .await?;
            let last = batch.last().map(|e| e.suffix.clone());
            let max = self.inner.options.max_list_entries;
            let total = (out.len() as u64)
                .saturating_add(batch.len() as u64)
                .saturating_add(remaining);
            if total > max {
                let count = format!(
                    "at least {total} ({} so far, remainingEntries {remaining})",
                    out.len() + batch.len()
                );
                return Err(too_many_entries(op, &url, max, count));
            }
            out.extend(batch);
            if remaining == 0 {
                return Ok(out);
            }
            match last {
                Some(s) if !s.is_empty() && start_after.as_ref().is_none_or(|a| s > *a) => {
                    start_after = Some(s)
                }
                _ => {
                    return Err(HdfsError::MalformedResponse {
                        op,
                        endpoint: redact(&url),
                        status: 200,
                        detail: format!(
                            "remainingEntries is {remaining} but the batch gave no entry after {:?} to continue from",
                            start_after.as_deref().unwrap_or("")
                        ),
                    });
                }
            }
        }
    }

    /// `OPEN` from `offset`, `len` bytes (to the end when `None`, at most
    /// [`WebHdfsOptions::max_response_bytes`]); fewer at the end of the
    /// file. The body is read as it arrives and the read stops with an
    /// error as soon as the datanode sends more than was asked for.
    pub async fn open(&self, path: &str, offset: u64, len: Option<u64>) -> Result<Bytes> {
        let op = "OPEN";
        self.run(op, path, |nn: Url| async move {
            let mut params = vec![("offset", offset.to_string())];
            if let Some(l) = len {
                params.push(("length", l.to_string()));
            }
            let url = self.url(&nn, path, op, &params);
            let resp = self
                .send(op, Method::GET, &url, None, Idempotence::Idempotent)
                .await?;
            let (resp, url) = if resp.status().is_redirection() {
                let dn = self.redirect_target(op, &url, &resp)?;
                let resp = self
                    .send(op, Method::GET, &dn, None, Idempotence::Idempotent)
                    .await?;
                if !resp.status().is_success() {
                    return Err(unexpected_status(op, &dn, resp, self.limit()).await);
                }
                (resp, dn)
            } else {
                (resp, url)
            };
            let limit = match len {
                Some(l) => BodyLimit::Range(l),
                None => self.limit(),
            };
            let data = read_body(op, &url, resp, limit, Idempotence::Idempotent).await?;
            Ok(data)
        })
        .await
    }

    /// `CREATE`: writes a whole file (the namenode creates parents).
    pub async fn create(&self, path: &str, data: Bytes, overwrite: bool) -> Result<()> {
        let op = "CREATE";
        let data = &data;
        self.run(op, path, |nn: Url| async move {
            let params = [
                ("overwrite", overwrite.to_string()),
                ("noredirect", "true".to_string()),
            ];
            let url = self.url(&nn, path, op, &params);
            let dn = self.write_location(op, Method::PUT, &url).await?;
            let resp = self
                .send(
                    op,
                    Method::PUT,
                    &dn,
                    Some(data.clone()),
                    Idempotence::Idempotent,
                )
                .await?;
            match resp.status() {
                StatusCode::CREATED | StatusCode::OK => Ok(()),
                _ => Err(unexpected_status(op, &dn, resp, self.limit()).await),
            }
        })
        .await
    }

    /// `APPEND` to an existing file.
    pub async fn append(&self, path: &str, data: Bytes) -> Result<()> {
        let op = "APPEND";
        let data = &data;
        self.run(op, path, |nn: Url| async move {
            let url = self.url(&nn, path, op, &[("noredirect", "true".to_string())]);
            let dn = self.write_location(op, Method::POST, &url).await?;
            let resp = self
                .send(
                    op,
                    Method::POST,
                    &dn,
                    Some(data.clone()),
                    Idempotence::NotIdempotent,
                )
                .await?;
            match resp.status() {
                StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
                _ => Err(unexpected_status(op, &dn, resp, self.limit()).await),
            }
        })
        .await
    }

    /// `MKDIRS` (with parents). Fails when the namenode answers `false`.
    pub async fn mkdirs(&self, path: &str) -> Result<()> {
        let op = "MKDIRS";
        let ok = self.boolean_op(op, Method::PUT, path, &[]).await?;
        if ok {
            Ok(())
        } else {
            Err(HdfsError::InvalidOperation {
                op: "mkdirs",
                uri: path.to_string(),
                reason: "the namenode answered {\"boolean\":false}".into(),
            })
        }
    }

    /// `RENAME` to the absolute path `dst` (into it when it is a directory).
    /// Fails when the namenode answers `false` (source missing, destination
    /// file exists, or destination parent missing).
    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        let op = "RENAME";
        let ok = self
            .boolean_op(op, Method::PUT, src, &[("destination", dst.to_string())])
            .await?;
        if ok {
            Ok(())
        } else {
            Err(HdfsError::InvalidOperation {
                op: "rename",
                uri: format!("{src} -> {dst}"),
                reason: "the namenode answered {\"boolean\":false} (source missing, destination exists, or destination's parent missing)".into(),
            })
        }
    }

    /// `DELETE`. `Ok(false)` when the path did not exist.
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<bool> {
        self.boolean_op(
            "DELETE",
            Method::DELETE,
            path,
            &[("recursive", recursive.to_string())],
        )
        .await
    }

    async fn boolean_op(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<bool> {
        let method = &method;
        self.run(op, path, |nn: Url| async move {
            let url = self.url(&nn, path, op, params);
            let resp = self
                .send(op, method.clone(), &url, None, Idempotence::Idempotent)
                .await?;
            let body: BooleanBody = json_body(op, &url, resp, self.limit()).await?;
            Ok(body.boolean)
        })
        .await
    }

    // ---- plumbing ----------------------------------------------------

    /// Step 1 of a write: the datanode URL from a `noredirect` JSON answer or
    /// a 307 `Location`.
    async fn write_location(&self, op: &'static str, method: Method, url: &Url) -> Result<Url> {
        let resp = self
            .send(op, method, url, None, Idempotence::Idempotent)
            .await?;
        if resp.status().is_redirection() {
            return self.redirect_target(op, url, &resp);
        }
        let body: LocationBody = json_body(op, url, resp, self.limit()).await?;
        self.datanode_url(op, url, 200, &body.location)
    }

    fn redirect_target(
        &self,
        op: &'static str,
        url: &Url,
        resp: &reqwest::Response,
    ) -> Result<Url> {
        let status = resp.status().as_u16();
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| HdfsError::MalformedResponse {
                op,
                endpoint: redact(url),
                status,
                detail: "redirect without a Location header".into(),
            })?;
        self.datanode_url(op, url, status, location)
    }

    /// Parses a datanode location and makes sure the authentication
    /// parameters survive the hop.
    fn datanode_url(
        &self,
        op: &'static str,
        from: &Url,
        status: u16,
        location: &str,
    ) -> Result<Url> {
        let mut dn = from
            .join(location)
            .map_err(|e| HdfsError::MalformedResponse {
                op,
                endpoint: redact(from),
                status,
                detail: format!("datanode Location {location:?} is not a URL: {e}"),
            })?;
        if dn.scheme() != "http" {
            return Err(HdfsError::MalformedResponse {
                op,
                endpoint: redact(from),
                status,
                detail: format!(
                    "datanode Location uses {}:// which this client does not speak",
                    dn.scheme()
                ),
            });
        }
        let present: Vec<String> = dn
            .query_pairs()
            .map(|(k, _)| k.to_ascii_lowercase())
            .collect();
        let mut missing = Vec::new();
        for (k, v) in self.auth_params() {
            if !present.iter().any(|p| p == k) {
                missing.push((k, v));
            }
        }
        if !missing.is_empty() {
            let mut q = dn.query_pairs_mut();
            for (k, v) in missing {
                q.append_pair(k, &v);
            }
        }
        Ok(dn)
    }

    fn auth_params(&self) -> Vec<(&'static str, String)> {
        let o = &self.inner.options;
        let mut v = Vec::new();
        if let Some(u) = &o.user {
            v.push(("user.name", u.clone()));
        }
        if let Some(d) = &o.doas {
            v.push(("doas", d.clone()));
        }
        if let Some(t) = &o.delegation {
            v.push(("delegation", t.clone()));
        }
        v
    }

    fn url(&self, namenode: &Url, path: &str, op: &str, params: &[(&str, String)]) -> Url {
        let mut url = namenode.clone();
        let mut p = String::from("/webhdfs/v1");
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            p.push('/');
            p.extend(utf8_percent_encode(seg, SEGMENT));
        }
        if p == "/webhdfs/v1" {
            p.push('/');
        }
        url.set_path(&p);
        {
            let mut q = url.query_pairs_mut();
            q.clear();
            q.append_pair("op", op);
            for (k, v) in self.auth_params() {
                q.append_pair(k, &v);
            }
            for (k, v) in params {
                q.append_pair(k, v);
            }
        }
        url
    }

    /// Sends one request; returns the response when it is a success or a
    /// redirect, else the decoded error.
    async fn send(
        &self,
        op: &'static str,
        method: Method,
        url: &Url,
        body: Option<Bytes>,
        idem: Idempotence,
    ) -> Result<reqwest::Response> {
        let mut req = self.inner.http.request(method.clone(), url.clone());
        if method != Method::GET {
            // Satisfies dfs.webhdfs.rest-csrf.enabled; harmless otherwise.
            req = req.header("X-XSRF-HEADER", "true");
        }
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(b);
        }
        let resp = req.send().await.map_err(|e| transport(op, url, e, idem))?;
        let status = resp.status();
        if status.is_success() || status.is_redirection() {
            return Ok(resp);
        }
        Err(decode_error(op, url, resp, idem, self.limit()).await)
    }

    /// Runs `attempt` against the active namenode, retrying retryable errors
    /// with backoff and rotating namenodes on failover errors.
    async fn run<T, F>(&self, op: &'static str, path: &str, attempt: impl Fn(Url) -> F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let n = self.inner.namenodes.len();
        let policy = &self.inner.options.retry;
        let budget = policy.max_attempts.max(1) + (n as u32 - 1);
        let mut backoff = policy.initial_backoff;
        let mut failovers_in_round = 0usize;
        let mut tries = 0u32;
        let started = tokio::time::Instant::now();
        let deadline = self.inner.options.deadline;
        let out_of_time = |tries: u32, last: String| HdfsError::DeadlineExceeded {
            op,
            path: path.to_string(),
            attempts: tries,
            secs: started.elapsed().as_secs_f64(),
            deadline_secs: deadline.unwrap_or_default().as_secs_f64(),
            last,
        };
        loop {
            tries += 1;
            let idx = self.inner.active.load(Ordering::Relaxed) % n;
            let nn = &self.inner.namenodes[idx];
            let Some(result) = self
                .attempt_with_progress(
                    op,
                    path,
                    nn,
                    deadline.map(|d| started + d),
                    attempt(nn.clone()),
                )
                .await
            else {
                return Err(out_of_time(
                    tries,
                    format!("attempt {tries} was still waiting for {nn}"),
                ));
            };
            let err = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !err.is_retryable() {
                return Err(err);
            }
            if tries >= budget {
                return Err(HdfsError::RetriesExhausted {
                    op,
                    path: path.to_string(),
                    attempts: tries,
                    last: Box::new(err),
                });
            }
            let failover = n > 1 && is_failover(&err, nn);
            if failover {
                let next = (idx + 1) % n;
                let _ = self.inner.active.compare_exchange(
                    idx,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                tracing::info!(
                    op, path, from = %nn, to = %self.inner.namenodes[next], error = %err,
                    "WebHDFS failover to the next namenode"
                );
                failovers_in_round += 1;
                if failovers_in_round < n {
                    continue; // try the next namenode at once
                }
            }
            failovers_in_round = 0;
            // At least what the server asked for with `Retry-After`.
            let wait = err.retry_after().map_or(backoff, |a| a.max(backoff));
            if deadline.is_some_and(|d| started.elapsed() + wait >= d) {
                return Err(out_of_time(tries, err.to_string()));
            }
            tracing::warn!(
                "WebHDFS {op} {path}: attempt {tries} of {budget} failed, retrying in {:.1} s: {err}",
                wait.as_secs_f64()
            );
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(policy.max_backoff);
        }
    }
}

impl WebHdfsClient {
    /// Runs one attempt, saying every [`PROGRESS_EVERY`] what it still
    /// waits for; `None` when `deadline` passes first.
    async fn attempt_with_progress<T>(
        &self,
        op: &'static str,
        path: &str,
        nn: &Url,
        deadline: Option<tokio::time::Instant>,
        attempt: impl std::future::Future<Output = Result<T>>,
    ) -> Option<Result<T>> {
        let started = tokio::time::Instant::now();
        let mut progress = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
        let out_of_time = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(attempt, out_of_time);
        loop {
            tokio::select! {
                r = &mut attempt => return Some(r),
                _ = &mut out_of_time => return None,
                _ = progress.tick() => tracing::warn!(
                    "WebHDFS {op} {path}: no answer yet after {:.0} s (namenode {}, or the datanode it redirected to)",
                    started.elapsed().as_secs_f64(),
                    redact(nn).trim_end_matches('/')
                ),
            }
        }
    }
}

/// Whether an error should move the client to the next namenode: a standby
/// answered, or the namenode itself could not be reached.
fn is_failover(err: &HdfsError, namenode: &Url) -> bool {
    match err {
        HdfsError::Remote {
            exception,
            java_class_name,
            ..
        } => {
            exception == "StandbyException"
                || java_class_name
                    .as_deref()
                    .is_some_and(|c| c.ends_with(".StandbyException"))
        }
        HdfsError::Transport {
            endpoint, source, ..
        } => source.is_connect() && endpoint.starts_with(namenode.as_str()),
        _ => false,
    }
}

/// Whether a LISTSTATUS_BATCH error means the server does not know the op.
fn is_unsupported_op(err: &HdfsError) -> bool {
    matches!(err, HdfsError::Remote { status: 400, .. })
        || matches!(err, HdfsError::RetriesExhausted { last, .. } if is_unsupported_op(last))
}

/// A listing longer than [`WebHdfsOptions::max_list_entries`]; `count`
/// says how long.
fn too_many_entries(op: &'static str, url: &Url, max: u64, count: String) -> HdfsError {
    HdfsError::TooLarge {
        op,
        endpoint: redact(url),
        status: 200,
        what: format!("the listing has {count} entries, more than {max} (hdfs.max_list_entries)"),
    }
}

/// The URL with secrets (`delegation`) redacted, for messages.
pub fn redact(url: &Url) -> String {
    if !url.query_pairs().any(|(k, _)| k == "delegation") {
        return url.to_string();
    }
    let mut u = url.clone();
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| {
            let v = if k == "delegation" {
                "<redacted>".to_string()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    u.query_pairs_mut().clear().extend_pairs(pairs);
    u.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_paths_and_carry_auth() {
        let opts = WebHdfsOptions {
            user: Some("alice".into()),
            delegation: Some("SECRET".into()),
            ..WebHdfsOptions::default()
        };
        let c = WebHdfsClient::new(vec!["http://127.0.0.1:9870".into()], opts).unwrap();
        let nn = Url::parse("http://127.0.0.1:9870").unwrap();
        let u = c.url(&nn, "/a b/c%d?#", "OPEN", &[("offset", "5".into())]);
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:9870/webhdfs/v1/a%20b/c%25d%3F%23?op=OPEN&user.name=alice&delegation=SECRET&offset=5"
        );
        assert!(!redact(&u).contains("SECRET"));
        assert!(redact(&u).contains("user.name=alice"));
        let root = c.url(&nn, "/", "LISTSTATUS", &[]);
        assert!(
            root.as_str()
                .starts_with("http://127.0.0.1:9870/webhdfs/v1/?op=LISTSTATUS")
        );
        // a datanode location without the auth params gets them added
        let dn = c
            .datanode_url(
                "OPEN",
                &u,
                307,
                "http://127.0.0.1:9864/webhdfs/v1/x?op=OPEN&offset=5",
            )
            .unwrap();
        let q: Vec<(String, String)> = dn
            .query_pairs()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        assert!(q.contains(&("user.name".into(), "alice".into())));
        assert!(q.contains(&("delegation".into(), "SECRET".into())));
        // ... but not twice
        let dn2 = c.datanode_url("OPEN", &u, 307, dn.as_str()).unwrap();
        assert_eq!(dn2, dn);
    }

    #[test]
    fn rejects_bad_namenode_urls() {
        assert!(WebHdfsClient::new(vec![], WebHdfsOptions::default()).is_err());
        let e =
            WebHdfsClient::new(vec!["ftp://x:1".into()], WebHdfsOptions::default()).unwrap_err();
        assert!(e.to_string().contains("ftp://x:1"));
    }
}
