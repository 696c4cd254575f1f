//! A client of the YARN ResourceManager REST API (`/ws/v1/cluster`, see
//! `PROTOCOLS.md` §1): cluster info, metrics and nodes (the capacity the
//! optimizer may use), new-application, submission of an application master
//! container, application reports, attempts and kill.
//!
//! The client follows the servers, not the docs: empty collections arrive as
//! `null`, unknown fields are ignored, maps in request bodies are written as
//! `{"entry":[{"key":..,"value":..}]}`, submission answers 202 and a kill
//! answers 202 until it is done. Several RM addresses (HA) are tried in
//! turn; a standby's 307 is followed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::RmError;
use crate::http::{Http, HttpOptions, Idempotence, Reply, parse_base};

/// Application states after which nothing changes.
pub const FINAL_STATES: [&str; 3] = ["FINISHED", "FAILED", "KILLED"];

/// Every application state (`YarnApplicationState`).
pub const APP_STATES: [&str; 8] = [
    "NEW",
    "NEW_SAVING",
    "SUBMITTED",
    "ACCEPTED",
    "RUNNING",
    "FINISHED",
    "FAILED",
    "KILLED",
];

/// Every final status (`FinalApplicationStatus`).
pub const FINAL_STATUSES: [&str; 5] = ["UNDEFINED", "SUCCEEDED", "FAILED", "KILLED", "ENDED"];

/// `clusterInfo`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterInfo {
    /// Cluster id (its start time).
    pub id: i64,
    /// Service state (`STARTED`, ...).
    pub state: String,
    /// HA state (`ACTIVE`, `STANDBY`, ...).
    pub ha_state: String,
    /// RM version.
    pub resource_manager_version: String,
    /// Hadoop version.
    pub hadoop_version: String,
    /// When the RM started, ms since the epoch.
    pub started_on: i64,
}

/// `clusterMetrics` (the fields this client uses).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterMetrics {
    /// Applications running.
    pub apps_running: i64,
    /// Applications pending.
    pub apps_pending: i64,
    /// Memory not allocated, MB.
    #[serde(rename = "availableMB")]
    pub available_mb: i64,
    /// Memory allocated, MB.
    #[serde(rename = "allocatedMB")]
    pub allocated_mb: i64,
    /// Memory of all active nodes, MB.
    #[serde(rename = "totalMB")]
    pub total_mb: i64,
    /// Virtual cores not allocated.
    pub available_virtual_cores: i64,
    /// Virtual cores of all active nodes.
    pub total_virtual_cores: i64,
    /// Containers allocated.
    pub containers_allocated: i64,
    /// Nodes in service.
    pub active_nodes: i64,
}

/// One node of `GET /nodes`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeReport {
    /// `host:port` of the NodeManager.
    pub id: String,
    /// `RUNNING`, `DECOMMISSIONED`, ...
    pub state: String,
    /// Host name.
    pub node_host_name: String,
    /// NodeManager web address.
    #[serde(rename = "nodeHTTPAddress")]
    pub node_http_address: String,
    /// Memory not allocated, MB (note the RM's spelling `avail...`).
    #[serde(rename = "availMemoryMB")]
    pub avail_memory_mb: i64,
    /// Memory allocated, MB.
    #[serde(rename = "usedMemoryMB")]
    pub used_memory_mb: i64,
    /// Virtual cores not allocated (spelled `available...`).
    pub available_virtual_cores: i64,
    /// Virtual cores allocated.
    pub used_virtual_cores: i64,
    /// Containers on it.
    pub num_containers: i64,
    /// Seconds left before a DECOMMISSIONING node is taken away (Hadoop 3;
    /// optional).
    pub decommissioning_timeout: Option<i64>,
}

/// A resource size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct Resource {
    /// Memory, MB.
    pub memory: i64,
    /// Virtual cores.
    #[serde(rename = "vCores")]
    pub vcores: i64,
}

/// The answer of `POST /apps/new-application`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct NewApplication {
    /// The new application id.
    #[serde(rename = "application-id")]
    pub application_id: String,
    /// The largest container the scheduler grants.
    #[serde(rename = "maximum-resource-capability", default)]
    pub maximum_resource_capability: Resource,
}

/// An application report (`GET /apps/{id}`; the fields this client uses).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AppReport {
    /// Application id.
    pub id: String,
    /// Owner.
    pub user: String,
    /// Name.
    pub name: String,
    /// Queue.
    pub queue: String,
    /// `NEW` … `RUNNING`, `FINISHED`, `FAILED`, `KILLED`.
    pub state: String,
    /// `UNDEFINED`, `SUCCEEDED`, `FAILED`, `KILLED`.
    pub final_status: String,
    /// Progress, 0–100.
    pub progress: f64,
    /// Tracking URL.
    pub tracking_url: String,
    /// Diagnostics.
    pub diagnostics: String,
    /// Application type.
    pub application_type: String,
    /// Start time, ms.
    pub started_time: i64,
    /// Finish time, ms (0 while running).
    pub finished_time: i64,
    /// Elapsed time, ms.
    pub elapsed_time: i64,
    /// The AM container's logs page.
    pub am_container_logs: String,
    /// The AM's node web address.
    pub am_host_http_address: String,
    /// Containers running (−1 once finished).
    pub running_containers: i64,
}

impl AppReport {
    /// Whether the application has ended.
    pub fn is_final(&self) -> bool {
        FINAL_STATES.contains(&self.state.as_str())
    }
}

/// Whether `id` has the form `application_<digits>_<digits>`.
pub fn is_application_id(id: &str) -> bool {
    let mut parts = id.split('_');
    parts.next() == Some("application")
        && parts
            .by_ref()
            .take(2)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .count()
            == 2
        && parts.next().is_none()
}

/// One application attempt.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AttemptReport {
    /// Attempt number.
    pub id: i64,
    /// `appattempt_...` (Hadoop 3).
    pub app_attempt_id: String,
    /// The AM container.
    pub container_id: String,
    /// Its node's web address.
    pub node_http_address: String,
    /// Its node.
    pub node_id: String,
    /// Logs link.
    pub logs_link: String,
    /// Attempt state (Hadoop 3).
    pub app_attempt_state: String,
    /// Diagnostics of a failed attempt.
    pub diagnostics_info: String,
    /// Start time, ms.
    pub start_time: i64,
}

/// Type of a local resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceType {
    /// Copied as is.
    File,
    /// Unpacked into a directory named after its key.
    Archive,
}

/// A file the NodeManager copies into the AM container before starting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResource {
    /// Name in the container's working directory.
    pub key: String,
    /// Where it is (`hdfs://nn:8020/path`).
    pub url: String,
    /// File or archive.
    pub kind: ResourceType,
    /// Its length; must equal the file's length on HDFS.
    pub size: u64,
    /// Its modification time (ms); must equal the file's on HDFS.
    pub timestamp: u64,
}

/// What `POST /apps` submits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// From new-application.
    pub application_id: String,
    /// Name.
    pub name: String,
    /// Queue.
    pub queue: String,
    /// Application type (shown in the RM UI).
    pub application_type: String,
    /// Attempts before the application fails.
    pub max_attempts: u32,
    /// AM container memory, MB.
    pub memory_mb: u32,
    /// AM container cores.
    pub vcores: u32,
    /// Files for the AM container.
    pub local_resources: Vec<LocalResource>,
    /// AM environment.
    pub environment: BTreeMap<String, String>,
    /// AM command line (with `<LOG_DIR>` placeholders).
    pub command: String,
}

impl Submission {
    /// The JSON body (`application-submission-context`).
    pub fn to_json(&self) -> Value {
        let resources: Vec<Value> = self
            .local_resources
            .iter()
            .map(|r| {
                json!({"key": r.key, "value": {
                    "resource": r.url,
                    "type": match r.kind { ResourceType::File => "FILE", ResourceType::Archive => "ARCHIVE" },
                    "visibility": "APPLICATION",
                    "size": r.size,
                    "timestamp": r.timestamp,
                }})
            })
            .collect();
        let env: Vec<Value> = self
            .environment
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        json!({
            "application-id": self.application_id,
            "application-name": self.name,
            "queue": self.queue,
            "application-type": self.application_type,
            "max-app-attempts": self.max_attempts,
            "keep-containers-across-application-attempts": false,
            "unmanaged-AM": false,
            "resource": {"memory": self.memory_mb, "vCores": self.vcores},
            "am-container-spec": {
                "local-resources": {"entry": resources},
                "environment": {"entry": env},
                "commands": {"command": self.command},
            },
        })
    }
}

/// Splits `application_<ts>_<seq>` into its numbers.
pub fn parse_application_id(id: &str) -> Option<(u64, u32)> {
    let rest = id.strip_prefix("application_")?;
    let (ts, seq) = rest.split_once('_')?;
    Some((ts.parse().ok()?, seq.parse().ok()?))
}

/// The numbers of a container id,
/// `container_[e<epoch>_]<ts>_<seq>_<attempt>_<n>`, without the epoch.
fn container_parts(container: &str) -> Option<[&str; 4]> {
    let rest = container.strip_prefix("container_")?;
    let mut parts: Vec<&str> = rest.split('_').collect();
    if parts.first().is_some_and(|p| p.starts_with('e')) {
        parts.remove(0);
    }
    if parts.iter().any(|p| p.parse::<u64>().is_err()) {
        return None;
    }
    parts.try_into().ok()
}

/// The application a container belongs to:
/// `container_[e<epoch>_]<ts>_<seq>_<attempt>_<n>` → `application_<ts>_<seq>`.
pub fn application_of_container(container: &str) -> Option<String> {
    let [ts, seq, _, _] = container_parts(container)?;
    Some(format!("application_{ts}_{seq}"))
}

/// The application attempt a container belongs to (1 for the first):
/// `container_[e<epoch>_]<ts>_<seq>_<attempt>_<n>` → `<attempt>`. An AM
/// reads its own `CONTAINER_ID` to learn which attempt it is.
pub fn attempt_of_container(container: &str) -> Option<u32> {
    let [_, _, attempt, _] = container_parts(container)?;
    attempt.parse().ok()
}

/// A client of one ResourceManager (or an HA set of them).
#[derive(Debug)]
pub struct RmClient {
    http: Http,
    user: Option<String>,
}

#[derive(Deserialize)]
struct NodesBody {
    nodes: Option<NodesInner>,
}

#[derive(Deserialize)]
struct NodesInner {
    #[serde(default)]
    node: Vec<NodeReport>,
}

#[derive(Deserialize)]
struct AttemptsBody {
    #[serde(rename = "appAttempts")]
    app_attempts: Option<AttemptsInner>,
}

#[derive(Deserialize)]
struct AttemptsInner {
    #[serde(rename = "appAttempt", default)]
    app_attempt: Vec<AttemptReport>,
}

/// An HTTP client, named `name` in errors, for the RM web addresses
/// (`host:port` or URLs; several for HA, failing over between them).
pub(super) fn rm_http(
    name: &'static str,
    addresses: &[String],
    options: HttpOptions,
) -> Result<Http, RmError> {
    let bases = addresses
        .iter()
        .map(|a| parse_base(a, "YARN ResourceManager address"))
        .collect::<Result<Vec<_>, _>>()?;
    Http::new(name, bases, options, true)
}

impl RmClient {
    /// A client for the RM web addresses (`host:port` or URLs; several for
    /// HA), calling as `user` (`user.name`) when given.
    pub fn new(
        addresses: &[String],
        user: Option<String>,
        options: HttpOptions,
    ) -> Result<RmClient, RmError> {
        Ok(RmClient {
            http: rm_http("YARN ResourceManager", addresses, options)?,
            user: user.filter(|u| !u.is_empty()),
        })
    }

    /// The RM base URL in use.
    pub fn base(&self) -> String {
        self.http
            .active_base()
            .as_str()
            .trim_end_matches('/')
            .to_string()
    }

    fn path(&self, p: &str) -> String {
        let mut s = format!("/ws/v1/cluster{p}");
        if let Some(u) = &self.user {
            s.push(if s.contains('?') { '&' } else { '?' });
            s.push_str("user.name=");
            s.extend(url::form_urlencoded::byte_serialize(u.as_bytes()));
        }
        s
    }

    async fn get(&self, p: &str) -> Result<Reply, RmError> {
        self.http
            .send(
                Method::GET,
                &self.path(p),
                &[("Accept", "application/json".into())],
                None,
                Idempotence::Idempotent,
            )
            .await
    }

    /// `GET /ws/v1/cluster/info`.
    pub async fn cluster_info(&self) -> Result<ClusterInfo, RmError> {
        self.get_object("/info", "clusterInfo").await
    }

    /// `GET /ws/v1/cluster/metrics`.
    pub async fn metrics(&self) -> Result<ClusterMetrics, RmError> {
        self.get_object("/metrics", "clusterMetrics").await
    }

    /// `GET path`, answered 200 with a JSON object whose `field` is read
    /// as a `T` (an error names the endpoint and the field).
    async fn get_object<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        field: &str,
    ) -> Result<T, RmError> {
        let r = Reply::expect_status(self.get(path).await?, &[StatusCode::OK])?;
        let v: Value = r.json()?;
        serde_json::from_value(v[field].clone()).map_err(|e| RmError::Malformed {
            endpoint: r.endpoint.clone(),
            status: 200,
            detail: format!("{field}: {e}"),
        })
    }

    /// `GET /ws/v1/cluster/nodes?states=RUNNING`.
    pub async fn running_nodes(&self) -> Result<Vec<NodeReport>, RmError> {
        let r = Reply::expect_status(self.get("/nodes?states=RUNNING").await?, &[StatusCode::OK])?;
        let b: NodesBody = r.json()?;
        Ok(b.nodes.map(|n| n.node).unwrap_or_default())
    }

    /// `GET /ws/v1/cluster/nodes?states=DECOMMISSIONING`.
    pub async fn decommissioning_nodes(&self) -> Result<Vec<NodeReport>, RmError> {
        let r = Reply::expect_status(
            self.get("/nodes?states=DECOMMISSIONING").await?,
            &[StatusCode::OK],
        )?;
        let b: NodesBody = r.json()?;
        Ok(b.nodes.map(|n| n.node).unwrap_or_default())
    }

    /// `POST /ws/v1/cluster/apps/new-application`.
    pub async fn new_application(&self) -> Result<NewApplication, RmError> {
        let r = self
            .http
            .send(
                Method::POST,
                &self.path("/apps/new-application"),
                &[("Accept", "application/json".into())],
                None,
                Idempotence::Idempotent,
            )
            .await?;
        let r = Reply::expect_status(r, &[StatusCode::OK])?;
        let app: NewApplication = r.json()?;
        if !is_application_id(&app.application_id) {
            return Err(RmError::Malformed {
                endpoint: r.endpoint.clone(),
                status: r.status.as_u16(),
                detail: format!(
                    "application-id {:?} is not an application id (application_<cluster timestamp>_<sequence>)",
                    app.application_id
                ),
            });
        }
        Ok(app)
    }

    /// `POST /ws/v1/cluster/apps` (202 Accepted).
    pub async fn submit(&self, s: &Submission) -> Result<(), RmError> {
        let r = self
            .http
            .send_json(
                Method::POST,
                &self.path("/apps"),
                &s.to_json(),
                Idempotence::Once,
            )
            .await?;
        Reply::expect_status(r, &[StatusCode::ACCEPTED, StatusCode::OK]).map(|_| ())
    }

    /// `GET /ws/v1/cluster/apps/{id}`.
    pub async fn app(&self, id: &str) -> Result<AppReport, RmError> {
        let r = Reply::expect_status(self.get(&format!("/apps/{id}")).await?, &[StatusCode::OK])?;
        let v: Value = r.json()?;
        let bad = |detail: String| RmError::Malformed {
            endpoint: r.endpoint.clone(),
            status: 200,
            detail,
        };
        let app: AppReport =
            serde_json::from_value(v["app"].clone()).map_err(|e| bad(format!("app: {e}")))?;
        // A missing or unknown state would read as "not final yet" forever.
        if !APP_STATES.contains(&app.state.as_str()) {
            return Err(bad(format!(
                "app.state {:?} is not a YARN application state ({})",
                app.state,
                APP_STATES.join(", ")
            )));
        }
        if !FINAL_STATUSES.contains(&app.final_status.as_str()) {
            return Err(bad(format!(
                "app.finalStatus {:?} is not a YARN final status ({})",
                app.final_status,
                FINAL_STATUSES.join(", ")
            )));
        }
        Ok(app)
    }

    /// `GET /ws/v1/cluster/apps/{id}/appattempts`.
    pub async fn attempts(&self, id: &str) -> Result<Vec<AttemptReport>, RmError> {
        let r = Reply::expect_status(
            self.get(&format!("/apps/{id}/appattempts")).await?,
            &[StatusCode::OK],
        )?;
        let b: AttemptsBody = r.json()?;
        Ok(b.app_attempts.map(|a| a.app_attempt).unwrap_or_default())
    }

    /// `PUT /ws/v1/cluster/apps/{id}/state` with `KILLED`, repeated until the
    /// RM answers 200 or the application is in a final state (at most
    /// `wait`). Returns the final state.
    pub async fn kill(&self, id: &str, wait: Duration) -> Result<String, RmError> {
        let deadline = Instant::now() + wait;
        let body = json!({"state": "KILLED"});
        loop {
            let r = self
                .http
                .send_json(
                    Method::PUT,
                    &self.path(&format!("/apps/{id}/state")),
                    &body,
                    Idempotence::Idempotent,
                )
                .await?;
            let r = Reply::expect_status(r, &[StatusCode::OK, StatusCode::ACCEPTED])?;
            let state = r
                .json::<Value>()
                .ok()
                .and_then(|v| v["state"].as_str().map(String::from))
                .unwrap_or_default();
            if r.status == StatusCode::OK || FINAL_STATES.contains(&state.as_str()) {
                return Ok(if state.is_empty() {
                    "KILLED".into()
                } else {
                    state
                });
            }
            if Instant::now() >= deadline {
                return Err(RmError::Other(format!(
                    "{}: application {id} still {state} after {:.0} s of kill requests",
                    r.endpoint,
                    wait.as_secs_f64()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Fetches a text file of a container from its NodeManager
    /// (`GET http://<node>/ws/v1/node/containerlogs/{container}/{file}`).
    pub async fn container_log(
        &self,
        node_http_address: &str,
        container: &str,
        file: &str,
    ) -> Result<Option<String>, RmError> {
        let base = parse_base(node_http_address, "NodeManager address")?;
        let url = Http::url_on(
            &base,
            &format!("/ws/v1/node/containerlogs/{container}/{file}"),
        );
        let endpoint = format!("GET {url}");
        let resp = self
            .http
            .client()
            .get(&url)
            .timeout(self.http.options().request_timeout)
            .send()
            .await
            .map_err(|e| RmError::Unreachable {
                service: "YARN NodeManager",
                endpoint: endpoint.clone(),
                attempts: 1,
                reason: crate::http::transport_reason(&e),
            })?;
        let status = resp.status();
        let body = self
            .http
            .read_body(&endpoint, resp)
            .await?
            .map_err(|reason| RmError::Unreachable {
                service: "YARN NodeManager",
                endpoint: endpoint.clone(),
                attempts: 1,
                reason,
            })?;
        match status {
            StatusCode::OK => Ok(Some(
                strip_log_framing(&String::from_utf8_lossy(&body), file).to_string(),
            )),
            StatusCode::NOT_FOUND => Ok(None),
            s => Err(RmError::Http {
                endpoint,
                status: s.as_u16(),
                message: crate::http::server_message(&body),
            }),
        }
    }
}

/// A NodeManager (Hadoop 3) frames a log file: a header (`Container: ...`,
/// `LogAggregationType: ...`, a rule, `LogType:<file>`, `LogLastModifiedTime`,
/// `LogLength`, `LogContents:`) before its bytes, and the trailer
/// `End of LogType:<file>.` with a line of `*` after them. This returns the
/// file's own bytes; text without that framing is returned as is.
pub fn strip_log_framing<'a>(text: &'a str, file: &str) -> &'a str {
    let mut body = text;
    if body.starts_with("Container: ")
        && let Some(at) = body.find(&format!("\nLogType:{file}\n"))
        && let Some(c) = body[at..].find("\nLogContents:\n")
    {
        body = &body[at + c + "\nLogContents:\n".len()..];
    }
    let marker = format!("End of LogType:{file}");
    match body.rfind(&marker) {
        Some(at) if is_trailer(&body[at + marker.len()..]) => &body[..at],
        _ => body,
    }
}

/// Whether `rest` (what follows `End of LogType:<file>`) is the rest of a
/// NodeManager's trailer: dots, stars and blank space, and for a container
/// still running the note that its log "may not be complete".
fn is_trailer(rest: &str) -> bool {
    const RUNNING: &str = "This log file belongs to a running container";
    let rest = rest.trim_start_matches('.');
    let rest = match rest.strip_prefix(RUNNING) {
        Some(r) => match r.find("may not be complete.") {
            Some(i) => &r[i + "may not be complete.".len()..],
            None => return false,
        },
        None => rest,
    };
    rest.chars()
        .all(|c| c == '.' || c == '*' || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(
            parse_application_id("application_1700000000000_0007"),
            Some((1_700_000_000_000, 7))
        );
        assert_eq!(parse_application_id("app_1_2"), None);
        assert_eq!(
            application_of_container("container_1700000000000_0007_01_000001").as_deref(),
            Some("application_1700000000000_0007")
        );
        assert_eq!(
            application_of_container("container_e17_1700000000000_0007_01_000001").as_deref(),
            Some("application_1700000000000_0007")
        );
        assert_eq!(application_of_container("container_x"), None);
        assert_eq!(
            attempt_of_container("container_e17_1700000000000_0007_02_000001"),
            Some(2)
        );
        assert_eq!(
            attempt_of_container("container_1700000000000_0007_01_000003"),
            Some(1)
        );
        assert_eq!(attempt_of_container("container_1_2_3"), None);
    }

    #[test]
    fn submission_uses_entry_lists() {
        let s = Submission {
            application_id: "application_1_0001".into(),
            name: "n".into(),
            queue: "default".into(),
            application_type: "CRUISE".into(),
            max_attempts: 2,
            memory_mb: 512,
            vcores: 1,
            local_resources: vec![LocalResource {
                key: "lib".into(),
                url: "hdfs://nn:8020/x.tar".into(),
                kind: ResourceType::Archive,
                size: 10,
                timestamp: 20,
            }],
            environment: BTreeMap::from([("A".to_string(), "b".to_string())]),
            command: "./lib/cruise appmaster".into(),
        };
        let v = s.to_json();
        assert_eq!(
            v["am-container-spec"]["local-resources"]["entry"][0]["value"]["type"],
            "ARCHIVE"
        );
        assert_eq!(
            v["am-container-spec"]["environment"]["entry"][0]["key"],
            "A"
        );
        assert_eq!(v["resource"]["vCores"], 1);
        assert_eq!(v["max-app-attempts"], 2);
    }

    #[test]
    fn null_collections_tolerated() {
        let b: NodesBody = serde_json::from_str(r#"{"nodes":null}"#).unwrap();
        assert!(b.nodes.is_none());
        let b: AttemptsBody = serde_json::from_str(r#"{"appAttempts":null}"#).unwrap();
        assert!(b.app_attempts.is_none());
    }

    #[test]
    fn node_manager_log_framing_is_stripped() {
        let stars = "*".repeat(77);
        let real = format!("{{\"a\":1}}End of LogType:summary.json.\n{stars}\n\n");
        let running = format!(
            "{{\"a\":1}}End of LogType:summary.json.This log file belongs to a running container (container_1_0001_01_000001) and so may not be complete.\n{stars}\n\n"
        );
        assert_eq!(strip_log_framing(&running, "summary.json"), "{\"a\":1}");
        assert_eq!(strip_log_framing(&real, "summary.json"), "{\"a\":1}");
        let lines = format!("x\ny\nEnd of LogType:stderr.\n{stars}\n\n");
        assert_eq!(strip_log_framing(&lines, "stderr"), "x\ny\n");
        // A file that mentions the marker in its own text keeps it.
        let own = "End of LogType:stderr. and more\n";
        assert_eq!(strip_log_framing(own, "stderr"), own);
        assert_eq!(strip_log_framing("plain", "stderr"), "plain");
        let framed = format!(
            "Container: container_1_0001_01_000001 on localhost:35183\nLogAggregationType: LOCAL\n{}\n\
             LogType:stdout\nLogLastModifiedTime:Fri Nov 27 00:58:34 +0000 2026\nLogLength:4\n\
             LogContents:\nab\ncEnd of LogType:stdout.\n{stars}\n\n",
            "=".repeat(68)
        );
        assert_eq!(strip_log_framing(&framed, "stdout"), "ab\nc");
    }
}
