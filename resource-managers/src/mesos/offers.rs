//! Offers: which are usable, how many evaluators each one fits, and the
//! ACCEPT (LAUNCH of command tasks) or DECLINE that answers it. Part of the
//! framework actor ([`super::Actor`]), which owns the agents' view and the
//! evaluators still wanted.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{Actor, AgentView, Task};
use crate::RmEvent;

impl Actor {
    pub(super) fn on_offers(&mut self, offers: &[Value]) {
        let mut decline = Vec::new();
        let mut valid = Vec::new();
        for o in offers {
            let agent = o["agent_id"]["value"].as_str().unwrap_or("");
            if self.draining_agent(agent)
                && let Some(oid) = o["id"]["value"].as_str()
            {
                tracing::debug!(
                    "declining Mesos offer {oid} from agent {agent}: it is going into maintenance (inverse offer)"
                );
                decline.push(json!({"value": oid}));
                continue;
            }
            match check_offer(o) {
                Ok(()) => valid.push(o.clone()),
                Err(why) => {
                    let oid = o["id"]["value"].as_str().unwrap_or("");
                    let agent = o["agent_id"]["value"].as_str().unwrap_or("?");
                    if oid.is_empty() {
                        tracing::warn!("ignoring a Mesos offer from agent {agent}: {why}");
                    } else {
                        tracing::warn!("declining Mesos offer {oid} from agent {agent}: {why}");
                        decline.push(json!({"value": oid}));
                    }
                }
            }
        }
        let offers = valid.as_slice();
        // Replace the view of every agent these offers come from.
        let mut fresh: HashMap<String, AgentView> = HashMap::new();
        for o in offers {
            let agent = o["agent_id"]["value"].as_str().unwrap_or("").to_string();
            let oid = o["id"]["value"].as_str().unwrap_or("").to_string();
            let v = fresh.entry(agent).or_default();
            v.cpus += scalar_sum(&o["resources"], "cpus");
            v.mem += scalar_sum(&o["resources"], "mem");
            v.offers.push(oid);
        }
        for (agent, v) in fresh {
            self.agents.insert(agent, v);
        }
        for o in offers {
            let oid = o["id"]["value"].as_str().unwrap_or("").to_string();
            let agent = o["agent_id"]["value"].as_str().unwrap_or("").to_string();
            let host = o["hostname"].as_str().unwrap_or("").to_string();
            let launched = match self.size {
                Some((mem, cores))
                    if self.wanted > 0 && (self.hosts.is_empty() || self.hosts.contains(&host)) =>
                {
                    self.pack(o, &oid, &agent, &host, f64::from(mem), f64::from(cores))
                }
                _ => false,
            };
            if !launched {
                decline.push(json!({"value": oid}));
            }
        }
        if !decline.is_empty() {
            self.filtered = true;
            self.send(
                self.body(
                    "DECLINE",
                    json!({"offer_ids": decline, "filters": {"refuse_seconds": self.cfg.refuse_seconds}}),
                ),
                vec![],
            );
        }
    }

    /// Launches as many evaluators as fit in one offer. Returns whether the
    /// offer was accepted.
    fn pack(
        &mut self,
        offer: &Value,
        oid: &str,
        agent: &str,
        host: &str,
        mem: f64,
        cores: f64,
    ) -> bool {
        let mut pool = Pool::new(&offer["resources"]);
        let mut infos = Vec::new();
        let mut ids = Vec::new();
        while self.wanted > 0 && pool.has("cpus", cores) && pool.has("mem", mem) {
            let mut resources = pool.take("cpus", cores);
            resources.extend(pool.take("mem", mem));
            self.seq += 1;
            let tid = format!("{}-{:06}", self.cfg.task_prefix, self.seq);
            infos.push(self.task_info(&tid, agent, resources));
            ids.push(tid);
            self.wanted -= 1;
        }
        if infos.is_empty() {
            return false;
        }
        let accept = self.body(
            "ACCEPT",
            json!({
                "offer_ids": [{"value": oid}],
                "operations": [{"type": "LAUNCH", "launch": {"task_infos": infos}}],
                "filters": {"refuse_seconds": self.cfg.refuse_seconds},
            }),
        );
        if !self.send(accept, ids.clone()) {
            self.wanted += ids.len() as u32;
            return false;
        }
        if let Some(v) = self.agents.get_mut(agent) {
            v.cpus -= cores * ids.len() as f64;
            v.mem -= mem * ids.len() as f64;
        }
        for tid in ids {
            tracing::info!(task = %tid, %host, "launching an evaluator task");
            self.tasks.insert(
                tid.clone(),
                Task {
                    agent_id: agent.to_string(),
                    host: host.to_string(),
                    state: "TASK_STAGING".into(),
                    running: false,
                    released: false,
                    cpus: cores,
                    mem,
                },
            );
            self.emit(RmEvent::Allocated {
                container: tid,
                host: host.to_string(),
            });
        }
        true
    }

    fn task_info(&self, tid: &str, agent: &str, resources: Vec<Value>) -> Value {
        let vars: Vec<Value> = self
            .launch
            .env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        let (program, uris) = match &self.cfg.evaluator_uri {
            Some(uri) => {
                let file = uri
                    .rsplit('/')
                    .next()
                    .filter(|f| !f.is_empty())
                    .unwrap_or("evaluator");
                (
                    format!("./{file}"),
                    json!([{"value": uri, "executable": true, "extract": false, "cache": false}]),
                )
            }
            None => (self.launch.program.clone(), json!([])),
        };
        let mut argv = vec![program.clone()];
        argv.extend(self.launch.args.iter().cloned());
        json!({
            "name": format!("{} evaluator {tid}", self.cfg.framework_name),
            "task_id": {"value": tid},
            "agent_id": {"value": agent},
            "resources": resources,
            "command": {
                "shell": false,
                "value": program,
                "arguments": argv,
                "environment": {"variables": vars},
                "uris": uris,
            },
        })
    }
}

/// Most cpus and memory (MB) one agent is believed to offer; more is a
/// malformed offer.
const MAX_OFFER_CPUS: f64 = 1e5;
const MAX_OFFER_MEM_MB: f64 = 1e9;

/// Why an offer cannot be used, if it cannot: no id or agent, or cpus or
/// mem that are negative, not finite, or beyond any machine.
fn check_offer(o: &Value) -> Result<(), String> {
    if o["id"]["value"].as_str().is_none_or(str::is_empty) {
        return Err("it has no id".into());
    }
    if o["agent_id"]["value"].as_str().is_none_or(str::is_empty) {
        return Err("it names no agent".into());
    }
    let Some(resources) = o["resources"].as_array() else {
        return Err("it has no resource list".into());
    };
    for r in resources {
        let name = r["name"].as_str().unwrap_or("");
        let max = match name {
            "cpus" => MAX_OFFER_CPUS,
            "mem" => MAX_OFFER_MEM_MB,
            _ => continue,
        };
        if r["type"].as_str().unwrap_or("SCALAR") != "SCALAR" {
            continue;
        }
        let Some(v) = r["scalar"]["value"].as_f64() else {
            return Err(format!("its {name} has no scalar value: {}", r["scalar"]));
        };
        if !v.is_finite() || v < 0.0 || v > max {
            return Err(format!("{name} {v} is not between 0 and {max}"));
        }
    }
    Ok(())
}

/// Sum of a scalar resource in a resource list.
fn scalar_sum(resources: &Value, name: &str) -> f64 {
    resources
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["name"] == name && r["type"].as_str().unwrap_or("SCALAR") == "SCALAR")
        .filter_map(|r| r["scalar"]["value"].as_f64())
        .sum()
}

/// The scalar resources of one offer, taken piece by piece for tasks. Each
/// piece keeps the role, allocation and reservation fields of the offered
/// resource it comes from.
struct Pool {
    entries: Vec<(Value, String, f64)>,
}

impl Pool {
    fn new(resources: &Value) -> Pool {
        let entries = resources
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| {
                r["type"].as_str().unwrap_or("SCALAR") == "SCALAR" && r["revocable"].is_null()
            })
            .filter_map(|r| {
                let name = r["name"].as_str()?.to_string();
                let v = r["scalar"]["value"].as_f64()?;
                Some((r.clone(), name, v))
            })
            .collect();
        Pool { entries }
    }

    fn has(&self, name: &str, amount: f64) -> bool {
        let total: f64 = self
            .entries
            .iter()
            .filter(|e| e.1 == name)
            .map(|e| e.2)
            .sum();
        total + 1e-9 >= amount
    }

    fn take(&mut self, name: &str, amount: f64) -> Vec<Value> {
        let mut left = amount;
        let mut out = Vec::new();
        for (template, n, avail) in &mut self.entries {
            if n != name || left <= 1e-9 || *avail <= 1e-9 {
                continue;
            }
            let part = left.min(*avail);
            *avail -= part;
            left -= part;
            let mut r = template.clone();
            r["scalar"] = json!({"value": part});
            out.push(r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_offers_are_refused_with_a_reason() {
        let offer = |cpus: Value| {
            json!({"id": {"value": "o1"}, "agent_id": {"value": "a1"}, "hostname": "h",
                "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
                              {"name": "mem", "type": "SCALAR", "scalar": {"value": 4096.0}}]})
        };
        assert!(check_offer(&offer(json!(4.0))).is_ok());
        let e = check_offer(&offer(json!(1e12))).unwrap_err();
        assert!(e.contains("cpus 1000000000000"), "{e}");
        assert!(check_offer(&offer(json!(-1.0))).is_err());
        assert!(check_offer(&offer(json!("4"))).is_err());
        assert!(check_offer(&json!({"agent_id": {"value": "a"}, "resources": []})).is_err());
    }

    #[test]
    fn pool_keeps_roles_and_splits() {
        let res = json!([
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.0}, "role": "ml", "reservations": [{"role": "ml"}]},
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 3.0}, "role": "*"},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 4096.0}, "allocation_info": {"role": "*"}},
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 2}]}},
        ]);
        assert_eq!(scalar_sum(&res, "cpus"), 4.0);
        let mut p = Pool::new(&res);
        assert!(p.has("cpus", 2.0));
        let t = p.take("cpus", 2.0);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0]["role"], "ml");
        assert_eq!(t[0]["scalar"]["value"], 1.0);
        assert_eq!(t[1]["scalar"]["value"], 1.0);
        assert_eq!(t[1]["role"], "*");
        let m = p.take("mem", 1024.0);
        assert_eq!(m[0]["allocation_info"]["role"], "*");
        assert!(p.has("cpus", 2.0));
        assert!(!p.has("cpus", 2.5));
        assert!(p.has("mem", 3072.0));
    }
}
