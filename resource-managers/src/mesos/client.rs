//! The HTTP side of the Mesos v1 scheduler API (`POST /api/v1/scheduler`,
//! `PROTOCOLS.md` §5): the SUBSCRIBE stream and the other calls.
//!
//! - SUBSCRIBE keeps its connection open; the answer carries the
//!   `Mesos-Stream-Id` header and a RecordIO body of JSON events, decoded by
//!   [`RecordIoCodec`] over the byte stream.
//! - Every other call goes on another connection with `Mesos-Stream-Id` and
//!   must be answered 202 (200 for some).
//! - A non-leading master answers 307 with a protocol-relative `Location`
//!   (`//host:port/api/v1/scheduler`); the client makes that master the
//!   active one and repeats the request there. 503 (no leader, recovering)
//!   and unreachable masters are retried with backoff, moving through the
//!   configured masters, up to the retry budget; then the error names the
//!   endpoint.

use std::pin::Pin;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;
use url::Url;

use crate::RmError;
use crate::http::{Http, HttpOptions, Idempotence, parse_base, server_message, transport_reason};

use super::recordio::{RecordIoCodec, RecordIoError};

/// Path of the scheduler endpoint.
pub const SCHEDULER_PATH: &str = "/api/v1/scheduler";
/// The stream id header.
pub const STREAM_ID: &str = "Mesos-Stream-Id";
/// Largest event accepted on the stream.
pub const MAX_EVENT_BYTES: usize = 64 << 20;
/// Redirects followed for one request.
const MAX_REDIRECTS: u32 = 4;

/// The events of one subscription, as raw records.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Bytes, RecordIoError>> + Send>>;

/// An open subscription.
pub struct Subscription {
    /// The `Mesos-Stream-Id` to send with calls.
    pub stream_id: String,
    /// The master that answered.
    pub master: Url,
    /// The RecordIO records of the event stream.
    pub events: EventStream,
}

/// A client of the scheduler API of a set of masters.
#[derive(Debug)]
pub struct SchedulerClient {
    http: Http,
    /// SUBSCRIBE gets a connection of its own every time: a pooled
    /// keep-alive connection may be the one that went silent.
    streams: reqwest::Client,
}

/// The master a 307 points at: `Location` may be `//host:port/path`,
/// `http://host:port/path` or `host:port`.
pub fn leader_from_location(location: &str) -> Option<Url> {
    let l = location.trim();
    let l = l.strip_suffix(SCHEDULER_PATH).unwrap_or(l);
    let l = l.strip_suffix("/master").unwrap_or(l);
    parse_base(l, "Mesos leader").ok().map(|mut u| {
        u.set_path("/");
        u
    })
}

impl SchedulerClient {
    /// A client for the masters (`host:port` or URLs).
    pub fn new(masters: &[String], options: HttpOptions) -> Result<SchedulerClient, RmError> {
        let bases = masters
            .iter()
            .map(|a| parse_base(a, "Mesos master address"))
            .collect::<Result<Vec<_>, _>>()?;
        let streams = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| {
                RmError::Other(format!("Mesos master: cannot build an HTTP client: {e}"))
            })?;
        Ok(SchedulerClient {
            http: Http::new("Mesos master", bases, options, false)?,
            streams,
        })
    }

    /// The master in use.
    pub fn master(&self) -> Url {
        self.http.active_base()
    }

    /// Drops the pooled connections of calls (after the stream went
    /// silent, they are likely dead too).
    pub fn reset_connections(&self) {
        self.http.reset_connections();
    }

    /// Sends SUBSCRIBE and returns the open stream.
    pub async fn subscribe(&self, call: &Value) -> Result<Subscription, RmError> {
        let policy = self.http.options().retry.clone();
        let attempts = policy.attempts.max(1);
        let mut backoff = policy.initial_backoff;
        let mut tries = 0u32;
        let mut redirects = 0u32;
        let body = call.to_string();
        loop {
            tries += 1;
            let master = self.http.active_base();
            let url = Http::url_on(&master, SCHEDULER_PATH);
            let endpoint = format!("POST {url} (SUBSCRIBE)");
            // The answer's headers must come within the request timeout; the
            // body is the endless event stream (watched by heartbeats).
            let sent = tokio::time::timeout(
                self.http.options().request_timeout,
                self.streams
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .header("Accept", "application/json")
                    .header("Connection", "close")
                    .body(body.clone())
                    .send(),
            )
            .await;
            let reason = match sent {
                Err(_) => format!("no answer within {:?}", self.http.options().request_timeout),
                Ok(Err(e)) => {
                    if e.is_connect() {
                        let all = self.http.bases();
                        if all.len() > 1 {
                            self.http.set_active(all[1].clone());
                        }
                    }
                    transport_reason(&e)
                }
                Ok(Ok(resp)) => match self.subscribed(&endpoint, master, resp).await? {
                    Answer::Subscribed(s) => return Ok(s),
                    Answer::Redirected(leader) if redirects < MAX_REDIRECTS => {
                        redirects += 1;
                        tries -= 1;
                        self.http.set_active(leader);
                        continue;
                    }
                    Answer::Redirected(leader) => {
                        return Err(RmError::Malformed {
                            endpoint,
                            status: 307,
                            detail: format!(
                                "more than {MAX_REDIRECTS} leader redirects (the last to {leader})"
                            ),
                        });
                    }
                    Answer::Unavailable(reason) => reason,
                },
            };
            if tries >= attempts {
                return Err(RmError::Unreachable {
                    service: "Mesos master",
                    endpoint,
                    attempts: tries,
                    reason,
                });
            }
            tracing::warn!(%endpoint, attempt = tries, "SUBSCRIBE failed ({reason}); retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(policy.max_backoff);
        }
    }

    /// What a SUBSCRIBE's answer means: the event stream, a redirect to
    /// the leading master, or a 503 worth retrying; any other answer is an
    /// error naming `endpoint`.
    async fn subscribed(
        &self,
        endpoint: &str,
        master: Url,
        resp: reqwest::Response,
    ) -> Result<Answer, RmError> {
        match resp.status() {
            StatusCode::OK => {
                let Some(stream_id) = resp
                    .headers()
                    .get(STREAM_ID)
                    .and_then(|v| v.to_str().ok())
                    .map(String::from)
                else {
                    return Err(RmError::Malformed {
                        endpoint: endpoint.to_string(),
                        status: 200,
                        detail: format!("no {STREAM_ID} header"),
                    });
                };
                let bytes = resp.bytes_stream().map_err(std::io::Error::other);
                let reader = StreamReader::new(bytes);
                let events = FramedRead::new(reader, RecordIoCodec::new(MAX_EVENT_BYTES));
                Ok(Answer::Subscribed(Subscription {
                    stream_id,
                    master,
                    events: Box::pin(events),
                }))
            }
            StatusCode::TEMPORARY_REDIRECT => {
                let loc = resp
                    .headers()
                    .get("Location")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let leader = leader_from_location(&loc).ok_or_else(|| RmError::Malformed {
                    endpoint: endpoint.to_string(),
                    status: 307,
                    detail: format!("unusable leader redirect Location {loc:?}"),
                })?;
                tracing::info!(from = %master, to = %leader, "Mesos master is not the leader; following its redirect");
                Ok(Answer::Redirected(leader))
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                let b = self.http.read_body(endpoint, resp).await?;
                Ok(Answer::Unavailable(format!(
                    "503 {}",
                    server_message(&b.unwrap_or_default())
                )))
            }
            status => {
                let b = self
                    .http
                    .read_body(endpoint, resp)
                    .await?
                    .unwrap_or_default();
                Err(RmError::Http {
                    endpoint: endpoint.to_string(),
                    status: status.as_u16(),
                    message: server_message(&b),
                })
            }
        }
    }

    /// Sends a call other than SUBSCRIBE on the stream `stream_id`.
    pub async fn call(&self, stream_id: &str, call: &Value) -> Result<(), RmError> {
        let what = call["type"].as_str().unwrap_or("?").to_string();
        let body = Bytes::from(call.to_string());
        // A repeated ACCEPT would reuse its offers: the master answers that
        // with TASK_LOST for tasks that did launch. Repeat it only when it
        // certainly did not arrive.
        let idem = if what == "ACCEPT" {
            Idempotence::Once
        } else {
            Idempotence::Idempotent
        };
        let mut redirects = 0;
        loop {
            let r = self
                .http
                .send(
                    Method::POST,
                    SCHEDULER_PATH,
                    &[
                        ("Content-Type", "application/json".to_string()),
                        (STREAM_ID, stream_id.to_string()),
                    ],
                    Some(body.clone()),
                    idem,
                )
                .await
                .map_err(|e| match e {
                    RmError::Unreachable {
                        service,
                        endpoint,
                        attempts,
                        reason,
                    } => RmError::Unreachable {
                        service,
                        endpoint: format!("{endpoint} ({what})"),
                        attempts,
                        reason,
                    },
                    other => other,
                })?;
            match r.status {
                StatusCode::ACCEPTED | StatusCode::OK => return Ok(()),
                StatusCode::TEMPORARY_REDIRECT if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    let leader = r.header("Location").and_then(leader_from_location);
                    match leader {
                        Some(l) => {
                            tracing::info!(to = %l, call = %what, "Mesos master redirected a call to the leader");
                            self.http.set_active(l);
                        }
                        None => {
                            return Err(RmError::Malformed {
                                endpoint: format!("{} ({what})", r.endpoint),
                                status: 307,
                                detail: "unusable leader redirect".into(),
                            });
                        }
                    }
                }
                status => {
                    return Err(RmError::Http {
                        endpoint: format!("{} ({what})", r.endpoint),
                        status: status.as_u16(),
                        message: server_message(&r.body),
                    });
                }
            }
        }
    }
}

/// Reads the next JSON event of a stream: `Ok(None)` at its end.
pub async fn next_event(events: &mut EventStream) -> Result<Option<Value>, String> {
    match events.next().await {
        None => Ok(None),
        Some(Err(e)) => Err(e.to_string()),
        Some(Ok(rec)) => serde_json::from_slice(&rec)
            .map(Some)
            .map_err(|e| format!("event is not JSON: {e}")),
    }
}

/// What one SUBSCRIBE attempt's answer means ([`SchedulerClient::subscribed`]).
enum Answer {
    /// The event stream.
    Subscribed(Subscription),
    /// Another master leads: its address.
    Redirected(Url),
    /// The master cannot serve now (503): why, for the retry's log line.
    Unavailable(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders() {
        assert_eq!(
            leader_from_location("//m2:5050/api/v1/scheduler")
                .unwrap()
                .as_str(),
            "http://m2:5050/"
        );
        assert_eq!(
            leader_from_location("http://m2:5050/master/api/v1/scheduler")
                .unwrap()
                .as_str(),
            "http://m2:5050/"
        );
        assert_eq!(
            leader_from_location("m3:5050").unwrap().as_str(),
            "http://m3:5050/"
        );
        assert!(leader_from_location("").is_none());
    }
}
