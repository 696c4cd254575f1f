//! HTTP plumbing shared by the YARN and Mesos clients: a list of server base
//! URLs with failover, bounded retries with exponential backoff, and errors
//! that name the endpoint and the HTTP status.
//!
//! What is retried: connection failures always (the request never reached
//! the server); timeouts, other transport errors, bodies that end early and
//! 429/502/503/504 answers only for requests marked idempotent, waiting
//! at least what a `Retry-After` asks (at most the request timeout). Every
//! other answer is returned to the caller, which decides what a status
//! means. A body is read as it arrives and refused past
//! [`HttpOptions::max_body_bytes`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use url::Url;

use crate::RmError;

/// Most bytes of a response body quoted in an error message.
const MAX_QUOTED_BODY: usize = 400;

/// How a client retries requests that did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per request, including the first (at least 1).
    pub attempts: u32,
    /// Wait before the first retry; doubles after each retry.
    pub initial_backoff: Duration,
    /// Upper bound of the wait between retries.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Settings of an HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOptions {
    /// Retries.
    pub retry: RetryPolicy,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one request (not used for streams).
    pub request_timeout: Duration,
    /// Most bytes of a response body (not of event streams).
    pub max_body_bytes: u64,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 16 << 20,
        }
    }
}

/// Whether a request may be repeated when its outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotence {
    /// Safe to repeat (GET, PUT of a state, DELETE).
    Idempotent,
    /// Repeated only when it certainly did not reach the server.
    Once,
}

/// A server's answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The request, as `METHOD URL`, for messages.
    pub endpoint: String,
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// Response body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON of type `T`, or an error naming the endpoint.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, RmError> {
        serde_json::from_slice(&self.body).map_err(|e| RmError::Malformed {
            endpoint: self.endpoint.clone(),
            status: self.status.as_u16(),
            detail: format!("{e}; body: {}", quote(&self.body)),
        })
    }

    /// An error for an answer the caller did not expect.
    pub fn unexpected(&self) -> RmError {
        RmError::Http {
            endpoint: self.endpoint.clone(),
            status: self.status.as_u16(),
            message: server_message(&self.body),
        }
    }

    /// The answer, if its status is one of `ok`; else the error for an
    /// answer the caller did not expect.
    pub fn expect_status(self, ok: &[StatusCode]) -> Result<Reply, RmError> {
        if ok.contains(&self.status) {
            Ok(self)
        } else {
            Err(self.unexpected())
        }
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The most useful line of an error body: a YARN `RemoteException` message,
/// a Services `diagnostics`, or the (shortened) text itself.
pub fn server_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = v["RemoteException"]["message"].as_str() {
            let ex = v["RemoteException"]["exception"].as_str().unwrap_or("");
            return if ex.is_empty() {
                m.to_string()
            } else {
                format!("{ex}: {m}")
            };
        }
        if let Some(d) = v["diagnostics"].as_str() {
            return d.to_string();
        }
    }
    quote(body)
}

/// A body shortened for a message.
pub fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_string();
    }
    let mut cut = text.len().min(MAX_QUOTED_BODY);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    if cut < text.len() {
        format!("{}…", &text[..cut])
    } else {
        text.to_string()
    }
}

/// Parses `host:port`, `http://host:port` or `https://host:port[/path]`
/// into a base URL (no trailing slash in the path).
pub fn parse_base(address: &str, what: &str) -> Result<Url, RmError> {
    let a = address.trim();
    if a.is_empty() {
        return Err(RmError::BadRequest(format!("{what}: empty address")));
    }
    let text = if a.contains("://") {
        a.to_string()
    } else if let Some(rest) = a.strip_prefix("//") {
        format!("http://{rest}")
    } else {
        format!("http://{a}")
    };
    let url = Url::parse(&text)
        .map_err(|e| RmError::BadRequest(format!("{what}: {address:?} is not an address: {e}")))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(RmError::BadRequest(format!(
            "{what}: {address:?} names no host"
        )));
    }
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(RmError::BadRequest(format!(
            "{what}: {address:?} must be http:// or https://"
        )));
    }
    Ok(url)
}

/// A client for one service reachable at one of several base URLs (HA
/// resource managers, several masters). The active one is used until it
/// cannot be reached; then the next is tried.
#[derive(Debug)]
pub struct Http {
    client: Mutex<reqwest::Client>,
    follow_redirects: bool,
    bases: Mutex<Vec<Url>>,
    active: AtomicUsize,
    options: HttpOptions,
    /// Name of the service for messages ("YARN ResourceManager").
    what: &'static str,
}

impl Http {
    /// A client for `bases` (at least one). Redirects are followed by
    /// reqwest when `follow_redirects` is set; otherwise the caller sees them.
    pub fn new(
        what: &'static str,
        bases: Vec<Url>,
        options: HttpOptions,
        follow_redirects: bool,
    ) -> Result<Http, RmError> {
        if bases.is_empty() {
            return Err(RmError::BadRequest(format!("{what}: no address given")));
        }
        let client = Self::build(what, &options, follow_redirects)?;
        Ok(Http {
            client: Mutex::new(client),
            follow_redirects,
            bases: Mutex::new(bases),
            active: AtomicUsize::new(0),
            options,
            what,
        })
    }

    fn build(
        what: &str,
        options: &HttpOptions,
        follow_redirects: bool,
    ) -> Result<reqwest::Client, RmError> {
        let policy = if follow_redirects {
            reqwest::redirect::Policy::limited(5)
        } else {
            reqwest::redirect::Policy::none()
        };
        reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .redirect(policy)
            .build()
            .map_err(|e| RmError::Other(format!("{what}: cannot build an HTTP client: {e}")))
    }

    /// The underlying reqwest client.
    pub fn client(&self) -> reqwest::Client {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Drops every pooled connection (e.g. when the path to the server was
    /// found dead): later requests open new ones.
    pub fn reset_connections(&self) {
        match Self::build(self.what, &self.options, self.follow_redirects) {
            Ok(c) => *self.client.lock().unwrap_or_else(|p| p.into_inner()) = c,
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// The options.
    pub fn options(&self) -> &HttpOptions {
        &self.options
    }

    /// The base URL in use.
    pub fn active_base(&self) -> Url {
        let bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        let i = self.active.load(Ordering::Relaxed) % bases.len();
        bases[i].clone()
    }

    /// Every base URL, the active one first.
    pub fn bases(&self) -> Vec<Url> {
        let bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        let i = self.active.load(Ordering::Relaxed) % bases.len();
        bases[i..].iter().chain(&bases[..i]).cloned().collect()
    }

    /// Makes `base` the active one (e.g. the leader a redirect pointed at),
    /// adding it to the list when it is new.
    pub fn set_active(&self, base: Url) {
        let mut bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        let i = match bases.iter().position(|b| *b == base) {
            Some(i) => i,
            None => {
                bases.push(base);
                bases.len() - 1
            }
        };
        self.active.store(i, Ordering::Relaxed);
    }

    fn rotate(&self, from: &Url) {
        let bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        let i = self.active.load(Ordering::Relaxed) % bases.len();
        if bases[i] == *from && bases.len() > 1 {
            self.active.store((i + 1) % bases.len(), Ordering::Relaxed);
        }
    }

    /// The URL of `path_and_query` (starting with `/`) on `base`.
    pub fn url_on(base: &Url, path_and_query: &str) -> String {
        let b = base.as_str().trim_end_matches('/');
        format!("{b}{path_and_query}")
    }

    /// Sends a request to the active base, retrying per the policy and
    /// failing over to the next base when one cannot be reached. Any HTTP
    /// answer that is not retried is returned, success or not.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(&str, String)],
        body: Option<Bytes>,
        idem: Idempotence,
    ) -> Result<Reply, RmError> {
        let policy = &self.options.retry;
        let attempts = policy.attempts.max(1);
        let mut backoff = policy.initial_backoff;
        let mut tried = 0u32;
        loop {
            tried += 1;
            let base = self.active_base();
            let url = Self::url_on(&base, path_and_query);
            let endpoint = format!("{method} {url}");
            let mut rb = self
                .client()
                .request(method.clone(), &url)
                .timeout(self.options.request_timeout);
            for (k, v) in headers {
                if let Ok(v) = HeaderValue::from_str(v) {
                    rb = rb.header(*k, v);
                }
            }
            if let Some(b) = &body {
                rb = rb.body(b.clone());
            }
            let outcome = match rb.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let hdrs = resp.headers().clone();
                    match self.read_body(&endpoint, resp).await? {
                        Ok(body) => Ok(Reply {
                            endpoint: endpoint.clone(),
                            status,
                            headers: hdrs,
                            body,
                        }),
                        Err(reason) => Err((false, reason)),
                    }
                }
                Err(e) => Err((e.is_connect(), transport_reason(&e))),
            };
            let mut wait = backoff;
            let (retry, reason) = match outcome {
                Ok(reply) => {
                    // 500 too: real YARN's Services API answers a read of a
                    // service whose definition is being rewritten in HDFS
                    // with "500 No content to map due to end-of-input".
                    let busy = matches!(
                        reply.status,
                        StatusCode::INTERNAL_SERVER_ERROR
                            | StatusCode::TOO_MANY_REQUESTS
                            | StatusCode::BAD_GATEWAY
                            | StatusCode::SERVICE_UNAVAILABLE
                            | StatusCode::GATEWAY_TIMEOUT
                    );
                    if !(busy && idem == Idempotence::Idempotent) || tried >= attempts {
                        return Ok(reply);
                    }
                    if let Some(after) = retry_after(&reply) {
                        wait = wait.max(after.min(self.options.request_timeout));
                    }
                    (
                        true,
                        format!("{} {}", reply.status, server_message(&reply.body)),
                    )
                }
                Err((connect, reason)) => {
                    if connect {
                        self.rotate(&base);
                    }
                    (connect || idem == Idempotence::Idempotent, reason)
                }
            };
            if !retry || tried >= attempts {
                return Err(RmError::Unreachable {
                    service: self.what,
                    endpoint,
                    attempts: tried,
                    reason,
                });
            }
            tracing::warn!(
                "{} {endpoint}: attempt {tried} of {attempts} failed ({reason}); retrying in {:.1} s",
                self.what,
                wait.as_secs_f64()
            );
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(policy.max_backoff);
        }
    }

    /// Reads a body as it arrives: `Err` (outer) when it goes past
    /// [`HttpOptions::max_body_bytes`], `Ok(Err(reason))` when it ends
    /// early (closed connection, timeout), which is retried like a
    /// transport failure.
    pub(crate) async fn read_body(
        &self,
        endpoint: &str,
        mut resp: reqwest::Response,
    ) -> Result<Result<Bytes, String>, RmError> {
        let limit = self.options.max_body_bytes;
        let status = resp.status().as_u16();
        let too_long = |what: String| RmError::Malformed {
            endpoint: endpoint.to_string(),
            status,
            detail: format!(
                "{what}, more than the limit of {limit} bytes (runtime.rm_max_response_bytes)"
            ),
        };
        let expected = resp.content_length();
        if let Some(n) = expected.filter(|n| *n > limit) {
            return Err(too_long(format!("the body announces {n} bytes")));
        }
        let mut buf = bytes::BytesMut::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    if (buf.len() as u64).saturating_add(c.len() as u64) > limit {
                        return Err(too_long("the body goes on".to_string()));
                    }
                    buf.extend_from_slice(&c);
                }
                Ok(None) => return Ok(Ok(buf.freeze())),
                Err(e) => {
                    let of = expected.map(|n| format!(" of {n}")).unwrap_or_default();
                    return Ok(Err(format!(
                        "the body ended after {}{of} bytes: {}",
                        buf.len(),
                        transport_reason(&e)
                    )));
                }
            }
        }
    }

    /// Sends JSON and returns the reply.
    pub async fn send_json(
        &self,
        method: Method,
        path_and_query: &str,
        body: &serde_json::Value,
        idem: Idempotence,
    ) -> Result<Reply, RmError> {
        let bytes = Bytes::from(body.to_string());
        self.send(
            method,
            path_and_query,
            &[("Content-Type", "application/json".to_string())],
            Some(bytes),
            idem,
        )
        .await
    }
}

/// The wait a `Retry-After` header asks for: seconds, or an HTTP date
/// (the time until then; none when it has passed).
fn retry_after(reply: &Reply) -> Option<Duration> {
    let v = reply.header("retry-after")?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// A short reason for a transport error (reqwest's messages hide the cause).
pub fn transport_reason(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut s = if e.is_connect() {
        "cannot connect".to_string()
    } else if e.is_timeout() {
        "timed out".to_string()
    } else {
        e.to_string()
    };
    let mut src = e.source();
    let mut depth = 0;
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
        depth += 1;
        if depth > 4 {
            break;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_parse() {
        assert_eq!(
            parse_base("rm:8088", "x").unwrap().as_str(),
            "http://rm:8088/"
        );
        assert_eq!(
            parse_base("//m:5050", "x").unwrap().as_str(),
            "http://m:5050/"
        );
        assert_eq!(
            parse_base("https://rm:8090", "x").unwrap().as_str(),
            "https://rm:8090/"
        );
        assert!(parse_base("", "x").is_err());
        assert!(parse_base("ftp://rm", "x").is_err());
    }

    #[test]
    fn messages_from_bodies() {
        let ex =
            br#"{"RemoteException":{"exception":"NotFoundException","message":"app not found"}}"#;
        assert_eq!(server_message(ex), "NotFoundException: app not found");
        assert_eq!(
            server_message(br#"{"diagnostics":"Service x not found","code":404004}"#),
            "Service x not found"
        );
        assert_eq!(server_message(b"plain text\n"), "plain text");
        assert_eq!(server_message(b""), "(empty body)");
        let long = vec![b'a'; 1000];
        assert!(server_message(&long).ends_with('…'));
    }

    #[tokio::test]
    async fn unreachable_names_endpoint_after_bounded_retries() {
        // A port nothing listens on: bind, read the port, close.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let http = Http::new(
            "test service",
            vec![parse_base(&format!("127.0.0.1:{port}"), "x").unwrap()],
            HttpOptions {
                retry: RetryPolicy {
                    attempts: 3,
                    initial_backoff: Duration::from_millis(10),
                    max_backoff: Duration::from_millis(20),
                },
                ..HttpOptions::default()
            },
            true,
        )
        .unwrap();
        let t = std::time::Instant::now();
        let err = http
            .send(Method::GET, "/x", &[], None, Idempotence::Idempotent)
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("GET http://127.0.0.1:{port}/x")),
            "{msg}"
        );
        assert!(msg.contains("3 attempts"), "{msg}");
        assert!(msg.contains("test service"), "{msg}");
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
