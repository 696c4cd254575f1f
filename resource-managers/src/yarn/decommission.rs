//! Decommissioning nodes: YARN takes a node away gracefully, after a
//! notice (`GET /ws/v1/cluster/nodes?states=DECOMMISSIONING`,
//! `PROTOCOLS.md` §1.6). Part of the service actor (`super::Actor`).
//!
//! Every `decommission_poll_interval`, while the job holds containers, the
//! actor reads the decommissioning nodes. Its containers on one (matched by
//! host: the Services API names a container's node by host only) are
//! announced once as [`RmEvent::Reclaiming`], deadline now plus the node's
//! `decommissioningTimeout` (seconds, optional in Hadoop 3) or, without
//! it, `decommission_default_timeout`. The AM's forced plan then empties and
//! releases them. A node that returns to RUNNING cancels nothing already
//! announced: the containers are given back all the same (the job plans
//! with the capacity it is offered again afterwards).

use std::time::{Duration, Instant};

use super::Actor;
use super::rm::NodeReport;
use crate::{ContainerId, RmEvent};

/// A decommissioning node, as the runtime uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decommissioning {
    /// The node's id (`host:port`), for messages.
    pub id: String,
    /// Its host (`nodeHostName`, else the host of `id`).
    pub host: String,
    /// `decommissioningTimeout`, if the node reports one.
    pub timeout: Option<Duration>,
}

/// Why a decommissioning node's report cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// A field it needs is missing or out of range.
    #[error("decommissioning node {node}: {field} {problem}")]
    Field {
        /// The node's id, or `?`.
        node: String,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// The host and notice of a decommissioning node.
pub fn parse_node(n: &NodeReport) -> Result<Decommissioning, NodeError> {
    let node = if n.id.is_empty() { "?" } else { n.id.as_str() };
    let host = if n.node_host_name.is_empty() {
        n.id.rsplit_once(':').map_or("", |(h, _)| h).to_string()
    } else {
        n.node_host_name.clone()
    };
    if host.is_empty() {
        return Err(NodeError::Field {
            node: node.to_string(),
            field: "nodeHostName",
            problem: "is missing (and id names no host)",
        });
    }
    let timeout = match n.decommissioning_timeout {
        None => None,
        Some(t) => Some(Duration::from_secs(u64::try_from(t).map_err(|_| {
            NodeError::Field {
                node: node.to_string(),
                field: "decommissioningTimeout",
                problem: "is negative",
            }
        })?)),
    };
    Ok(Decommissioning {
        id: n.id.clone(),
        host,
        timeout,
    })
}

impl Actor {
    /// Reads the decommissioning nodes and announces the job's containers
    /// on them (each once).
    pub(super) async fn decommission_tick(&mut self) {
        let nodes = match self.rm.decommissioning_nodes().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("reading YARN's decommissioning nodes failed: {e}");
                return;
            }
        };
        for n in &nodes {
            let d = match parse_node(n) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!("ignoring a YARN node report: {e}");
                    continue;
                }
            };
            let ids: Vec<ContainerId> = self
                .known
                .iter()
                .filter(|(_, k)| k.host == d.host && !k.reclaimed && !k.released)
                .map(|(id, _)| id.clone())
                .collect();
            if ids.is_empty() {
                continue;
            }
            for id in &ids {
                if let Some(k) = self.known.get_mut(id) {
                    k.reclaimed = true;
                }
            }
            let notice = d.timeout.unwrap_or(self.cfg.decommission_default_timeout);
            let reason = format!(
                "YARN node {} ({}) is decommissioning, {} s notice{}",
                d.id,
                d.host,
                notice.as_secs(),
                if d.timeout.is_none() {
                    " (yarn.decommission_default_timeout_secs: the node reports no decommissioningTimeout)"
                } else {
                    ""
                }
            );
            tracing::info!(containers = ?ids, "{reason}");
            self.emit(RmEvent::Reclaiming {
                containers: ids,
                deadline: Instant::now() + notice,
                reason,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: serde_json::Value) -> NodeReport {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn host_and_timeout_of_a_decommissioning_node() {
        let n = node(serde_json::json!({
            "id": "nm1.example.com:45454", "state": "DECOMMISSIONING",
            "nodeHostName": "nm1.example.com", "decommissioningTimeout": 120,
        }));
        assert_eq!(
            parse_node(&n),
            Ok(Decommissioning {
                id: "nm1.example.com:45454".into(),
                host: "nm1.example.com".into(),
                timeout: Some(Duration::from_secs(120)),
            })
        );
        // Without a timeout (optional), and without a host name: the id's host.
        let n = node(serde_json::json!({"id": "nm2:45454", "state": "DECOMMISSIONING"}));
        let d = parse_node(&n).unwrap();
        assert_eq!((d.host.as_str(), d.timeout), ("nm2", None));
    }

    #[test]
    fn unusable_reports_name_the_field() {
        let n = node(serde_json::json!({"state": "DECOMMISSIONING"}));
        let e = parse_node(&n).unwrap_err().to_string();
        assert!(e.contains("nodeHostName"), "{e}");
        let n = node(serde_json::json!({
            "id": "nm1:1", "nodeHostName": "nm1", "decommissioningTimeout": -5,
        }));
        let e = parse_node(&n).unwrap_err().to_string();
        assert!(
            e.contains("decommissioningTimeout") && e.contains("nm1:1"),
            "{e}"
        );
        // A timeout of the wrong type fails the whole body, naming it.
        let bad = serde_json::from_value::<NodeReport>(
            serde_json::json!({"id": "nm1:1", "decommissioningTimeout": "soon"}),
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains("invalid type"), "{bad}");
    }
}
