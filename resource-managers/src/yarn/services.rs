//! A client of the YARN Services REST API (`/app/v1/services`, see
//! `PROTOCOLS.md` §2): create a service, read it with its live containers,
//! flex a component, decommission instances, stop it, destroy it.
//!
//! Statuses follow `ApiServer.java`: create answers 202, flex of one
//! component 200, decommission 202, stop 200, destroy 200; errors carry a
//! `diagnostics` message. A missing service is 404 (or 400 "doesn't exist"
//! on delete in some releases).

use std::collections::BTreeMap;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::RmError;
use crate::http::{Http, HttpOptions, Idempotence, Reply};

/// Container states after which a container is gone (the ServiceMaster
/// marks a stopped container `STOPPED`; newer releases also use
/// `SUCCEEDED`/`FAILED` for components that do not restart).
pub const ENDED_CONTAINER_STATES: [&str; 3] = ["STOPPED", "SUCCEEDED", "FAILED"];

/// Every container state of the Services API (`ContainerState`).
pub const CONTAINER_STATES: [&str; 8] = [
    "RUNNING_BUT_UNREADY",
    "READY",
    "STOPPED",
    "NEEDS_UPGRADE",
    "UPGRADING",
    "SUCCEEDED",
    "FAILED",
    "FAILED_UPGRADE",
];

/// One container of a component, as `GET /services/{name}` reports it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct ContainerReport {
    /// YARN container id (what `CONTAINER_ID` is inside it).
    pub id: String,
    /// `RUNNING_BUT_UNREADY`, `READY`, `STOPPED`, ...
    pub state: String,
    /// Registry DNS name.
    pub hostname: String,
    /// The node's host name.
    pub bare_host: String,
    /// IP address(es).
    pub ip: String,
    /// `<component>-<n>`.
    pub component_instance_name: String,
    /// Launch time, ms.
    pub launch_time: Option<i64>,
    /// Exit status of an ended container (cruise-sim reports it; the
    /// Services API of Hadoop does not).
    pub exit_status: Option<i32>,
    /// Diagnostics of an ended container (cruise-sim).
    pub diagnostics: Option<String>,
}

/// One component.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct ComponentReport {
    /// Name.
    pub name: String,
    /// Desired containers.
    pub number_of_containers: i64,
    /// `FLEXING`, `STABLE`, ...
    pub state: String,
    /// Live containers.
    pub containers: Vec<ContainerReport>,
    /// Instance names that were decommissioned.
    pub decommissioned_instances: Vec<String>,
}

/// A service, as `GET /services/{name}` reports it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct ServiceReport {
    /// Name.
    pub name: String,
    /// YARN application id of its ServiceMaster.
    pub id: String,
    /// `ACCEPTED`, `STARTED`, `STABLE`, `STOPPED`, `FAILED`, ...
    pub state: String,
    /// Components.
    pub components: Vec<ComponentReport>,
}

impl ServiceReport {
    /// A component by name.
    pub fn component(&self, name: &str) -> Option<&ComponentReport> {
        self.components.iter().find(|c| c.name == name)
    }
}

/// What [`ServicesClient::stop`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// The service was running and is stopped now.
    Stopped,
    /// It was stopped already.
    AlreadyStopped,
    /// There is no such service.
    NotFound,
}

/// Whether an answer says the service does not exist: 404, or 400
/// "doesn't exist" (some releases, see the module's docs).
fn is_missing(status: StatusCode, message: &str) -> bool {
    status == StatusCode::NOT_FOUND
        || (status == StatusCode::BAD_REQUEST && message.contains("doesn't exist"))
}

/// What the evaluator component of a service runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentSpec {
    /// Component name (a DNS label, at most 44 characters).
    pub name: String,
    /// Containers to start with.
    pub count: u32,
    /// The command each container runs (via `bash -c`).
    pub launch_command: String,
    /// Environment of each container.
    pub env: BTreeMap<String, String>,
    /// Memory per container, MB.
    pub memory_mb: u32,
    /// Cores per container.
    pub cpus: u32,
    /// A TARBALL artifact (`hdfs://.../x.tar`) unpacked into `lib/` of each
    /// container, if any.
    pub tarball: Option<String>,
}

/// A service with one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Service name (a DNS label, at most 63 characters).
    pub name: String,
    /// Version.
    pub version: String,
    /// Queue.
    pub queue: String,
    /// Lifetime in seconds (a backstop against leaks), if any.
    pub lifetime_secs: Option<u64>,
    /// The component.
    pub component: ComponentSpec,
}

impl ServiceSpec {
    /// The JSON body of `POST /services`.
    pub fn to_json(&self) -> Value {
        let c = &self.component;
        let mut comp = json!({
            "name": c.name,
            "number_of_containers": c.count,
            "launch_command": c.launch_command,
            "restart_policy": "ALWAYS",
            "resource": {"cpus": c.cpus, "memory": c.memory_mb.to_string()},
            "configuration": {"env": c.env, "properties": {}, "files": []},
        });
        if let Some(t) = &c.tarball {
            comp["artifact"] = json!({"id": t, "type": "TARBALL"});
        }
        let mut v = json!({
            "name": self.name,
            "version": self.version,
            "queue": self.queue,
            "components": [comp],
        });
        if let Some(l) = self.lifetime_secs {
            v["lifetime"] = json!(l);
        }
        v
    }
}

/// Whether `s` is a valid service or component name (a lowercase DNS
/// label of at most `max` characters).
pub fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.ends_with('-')
}

/// A client of the Services API of one RM (or an HA set).
#[derive(Debug)]
pub struct ServicesClient {
    http: Http,
    user: Option<String>,
}

impl ServicesClient {
    /// A client for the RM web addresses, calling as `user` when given.
    pub fn new(
        addresses: &[String],
        user: Option<String>,
        options: HttpOptions,
    ) -> Result<ServicesClient, RmError> {
        Ok(ServicesClient {
            http: super::rm::rm_http("YARN Services API", addresses, options)?,
            user: user.filter(|u| !u.is_empty()),
        })
    }

    fn path(&self, p: &str) -> String {
        let mut s = format!("/app/v1/services{p}");
        if let Some(u) = &self.user {
            s.push_str("?user.name=");
            s.extend(url::form_urlencoded::byte_serialize(u.as_bytes()));
        }
        s
    }

    /// `POST /app/v1/services`: creates and starts the service.
    pub async fn create(&self, spec: &ServiceSpec) -> Result<(), RmError> {
        let r = self
            .http
            .send_json(
                Method::POST,
                &self.path(""),
                &spec.to_json(),
                Idempotence::Once,
            )
            .await?;
        Reply::expect_status(r, &[StatusCode::ACCEPTED, StatusCode::OK]).map(|_| ())
    }

    /// `GET /app/v1/services/{name}`; `None` when there is no such service.
    pub async fn get(&self, name: &str) -> Result<Option<ServiceReport>, RmError> {
        let r = self
            .http
            .send(
                Method::GET,
                &self.path(&format!("/{name}")),
                &[("Accept", "application/json".into())],
                None,
                Idempotence::Idempotent,
            )
            .await?;
        if r.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let r = Reply::expect_status(r, &[StatusCode::OK])?;
        let report: ServiceReport = r.json()?;
        // A container with no id or an unknown state would be neither
        // running nor ended: waited on forever.
        for c in report.components.iter().flat_map(|c| &c.containers) {
            if c.id.is_empty() || !CONTAINER_STATES.contains(&c.state.as_str()) {
                return Err(RmError::Malformed {
                    endpoint: r.endpoint.clone(),
                    status: r.status.as_u16(),
                    detail: format!(
                        "container {:?} has state {:?}, not a Services API container state ({})",
                        c.id,
                        c.state,
                        CONTAINER_STATES.join(", ")
                    ),
                });
            }
        }
        Ok(Some(report))
    }

    /// `PUT /app/v1/services/{name}/components/{component}` with
    /// `number_of_containers`.
    pub async fn flex(&self, name: &str, component: &str, count: u32) -> Result<(), RmError> {
        let r = self
            .http
            .send_json(
                Method::PUT,
                &self.path(&format!("/{name}/components/{component}")),
                &json!({"name": component, "number_of_containers": count}),
                Idempotence::Idempotent,
            )
            .await?;
        Reply::expect_status(r, &[StatusCode::OK, StatusCode::ACCEPTED]).map(|_| ())
    }

    /// `PUT /app/v1/services/{name}` with the component's
    /// `decommissioned_instances`: those instances stop and the component's
    /// count drops by one for each.
    pub async fn decommission(
        &self,
        name: &str,
        component: &str,
        instances: &[String],
    ) -> Result<(), RmError> {
        let r = self
            .http
            .send_json(
                Method::PUT,
                &self.path(&format!("/{name}")),
                &json!({"components": [{"name": component, "decommissioned_instances": instances}]}),
                Idempotence::Idempotent,
            )
            .await?;
        Reply::expect_status(r, &[StatusCode::OK, StatusCode::ACCEPTED]).map(|_| ())
    }

    /// `PUT /app/v1/services/{name}` with `{"state":"STOPPED"}`: the
    /// service's containers end and YARN starts no more of them; its
    /// definition stays until it is destroyed. A service already stopped
    /// (400 "is already stopped") or missing (404, or 400 "doesn't exist")
    /// is an answer, not an error.
    pub async fn stop(&self, name: &str) -> Result<StopOutcome, RmError> {
        let r = self
            .http
            .send_json(
                Method::PUT,
                &self.path(&format!("/{name}")),
                &json!({"state": "STOPPED"}),
                Idempotence::Idempotent,
            )
            .await?;
        let message = crate::http::server_message(&r.body);
        match r.status {
            StatusCode::OK | StatusCode::ACCEPTED | StatusCode::NO_CONTENT => {
                Ok(StopOutcome::Stopped)
            }
            StatusCode::BAD_REQUEST if message.contains("already stopped") => {
                Ok(StopOutcome::AlreadyStopped)
            }
            status
                if is_missing(status, &message)
                    || (status == StatusCode::BAD_REQUEST && message.contains("not found")) =>
            {
                Ok(StopOutcome::NotFound)
            }
            _ => Err(r.unexpected()),
        }
    }

    /// `DELETE /app/v1/services/{name}`: stops and removes the service.
    /// Returns false when there was no such service.
    ///
    /// Real YARN answers "400 Failed to delete public resource dir" when
    /// the service's directory went away under its own delete (the service
    /// AM removing it as it stops): the delete is asked again, with the
    /// client's backoff, until the service is gone or the attempts run out.
    pub async fn destroy(&self, name: &str) -> Result<bool, RmError> {
        let policy = &self.http.options().retry;
        let mut backoff = policy.initial_backoff;
        let mut tried = 1;
        loop {
            let r = self
                .http
                .send(
                    Method::DELETE,
                    &self.path(&format!("/{name}")),
                    &[],
                    None,
                    Idempotence::Idempotent,
                )
                .await?;
            let message = crate::http::server_message(&r.body);
            return match r.status {
                StatusCode::OK | StatusCode::NO_CONTENT | StatusCode::ACCEPTED => Ok(true),
                status if is_missing(status, &message) => Ok(false),
                StatusCode::BAD_REQUEST
                    if message.contains("Failed to delete") && tried < policy.attempts =>
                {
                    tracing::warn!(
                        service = name,
                        attempt = tried,
                        "{}: {message}; asking again",
                        r.endpoint
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(policy.max_backoff);
                    tried += 1;
                    continue;
                }
                _ => Err(r.unexpected()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("cruise-1700000000000-0001", 63));
        assert!(!valid_name("Cruise", 63));
        assert!(!valid_name("1abc", 63));
        assert!(!valid_name("abc-", 63));
        assert!(!valid_name(&"a".repeat(64), 63));
    }

    #[test]
    fn spec_json_shape() {
        let s = ServiceSpec {
            name: "cruise-x".into(),
            version: "1".into(),
            queue: "default".into(),
            lifetime_secs: Some(3600),
            component: ComponentSpec {
                name: "evaluator".into(),
                count: 3,
                launch_command: "./lib/cruise evaluator".into(),
                env: BTreeMap::from([("K".to_string(), "v".to_string())]),
                memory_mb: 512,
                cpus: 2,
                tarball: Some("hdfs://nn/x.tar".into()),
            },
        };
        let v = s.to_json();
        let c = &v["components"][0];
        assert_eq!(c["resource"]["memory"], "512", "memory is a string");
        assert_eq!(c["resource"]["cpus"], 2);
        assert_eq!(c["artifact"]["type"], "TARBALL");
        assert_eq!(c["configuration"]["env"]["K"], "v");
        assert_eq!(c["restart_policy"], "ALWAYS");
        assert_eq!(v["lifetime"], 3600);
    }

    #[test]
    fn reports_parse_leniently() {
        let r: ServiceReport = serde_json::from_str(
            r#"{"name":"s","id":"application_1_0001","state":"STABLE","extra":1,
               "components":[{"name":"evaluator","number_of_containers":1,
                 "containers":[{"id":"container_1_0001_01_000002","state":"READY",
                   "bare_host":"h","component_instance_name":"evaluator-0","launch_time":5}]}]}"#,
        )
        .unwrap();
        let c = r.component("evaluator").unwrap();
        assert_eq!(c.containers[0].component_instance_name, "evaluator-0");
        assert_eq!(c.containers[0].exit_status, None);
    }
}
