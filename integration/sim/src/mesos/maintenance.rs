//! Agent maintenance: `POST /sim/inverse_offer` puts an agent into
//! maintenance (it is offered to nobody from then on) and sends every
//! connected framework an INVERSE_OFFERS event for it, in the nested shape
//! the master uses (`{"inverse_offers":{"inverse_offers":[...]}}`), with
//! `unavailability.start` that many seconds from now. ACCEPT_INVERSE_OFFERS
//! and DECLINE_INVERSE_OFFERS are recorded against the inverse offers;
//! `GET /sim/state` lists them with their status (`PENDING`, `ACCEPTED`,
//! `DECLINED`). The simulator does not take the agent down at the start of
//! the window (a real master does not either; an operator does).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::state::State;

/// An inverse offer sent to a framework.
#[derive(Debug, Clone)]
pub(crate) struct InverseOfferRec {
    pub id: String,
    pub framework: String,
    pub agent: usize,
    pub start_ns: i64,
    pub duration_ns: Option<i64>,
    pub status: &'static str,
}

impl InverseOfferRec {
    pub fn to_json(&self, st: &State) -> Value {
        json!({
            "id": self.id,
            "framework_id": self.framework,
            "agent_id": st.agents[self.agent].id,
            "start_ns": self.start_ns,
            "duration_ns": self.duration_ns,
            "status": self.status,
        })
    }
}

/// What `POST /sim/inverse_offer` takes.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Maintenance {
    pub agent_id: String,
    /// Seconds from now to the start of the unavailability.
    pub start_in_secs: f64,
    /// Its length, seconds (absent: open-ended).
    pub duration_secs: Option<f64>,
}

impl State {
    /// Starts an agent's maintenance; returns the inverse offers sent.
    pub fn start_maintenance(&mut self, m: &Maintenance) -> Result<Vec<Value>, String> {
        if !m.start_in_secs.is_finite() || m.start_in_secs < 0.0 {
            return Err("start_in_secs must be finite and not negative".into());
        }
        if m.duration_secs.is_some_and(|d| !d.is_finite() || d < 0.0) {
            return Err("duration_secs must be finite and not negative".into());
        }
        let Some(agent) = self.agents.iter().position(|a| a.id == m.agent_id) else {
            return Err(format!("no agent {}", m.agent_id));
        };
        self.agents[agent].draining = true;
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let start_ns = now_ns.saturating_add((m.start_in_secs * 1e9) as i64);
        let duration_ns = m.duration_secs.map(|d| (d * 1e9) as i64);
        let fids: Vec<String> = self
            .frameworks
            .values()
            .filter(|f| f.stream.is_some())
            .map(|f| f.id.clone())
            .collect();
        let mut sent = Vec::new();
        for fid in fids {
            let id = format!("{}-IO{}", self.cfg.master_id, self.inverse_offers.len() + 1);
            let mut unavailability = json!({"start": {"nanoseconds": start_ns}});
            if let Some(d) = duration_ns {
                unavailability["duration"] = json!({"nanoseconds": d});
            }
            let offer = json!({
                "id": {"value": id},
                "framework_id": {"value": fid},
                "agent_id": {"value": m.agent_id},
                "url": {"scheme": "http", "address": {"hostname": self.cfg.host, "ip": self.cfg.host, "port": 5051 + agent as u64}, "path": "/slave(1)"},
                "unavailability": unavailability,
                "resources": [],
            });
            self.send(
                &fid,
                &json!({"type": "INVERSE_OFFERS", "inverse_offers": {"inverse_offers": [offer]}}),
            );
            let rec = InverseOfferRec {
                id,
                framework: fid,
                agent,
                start_ns,
                duration_ns,
                status: "PENDING",
            };
            sent.push(rec.to_json(self));
            self.inverse_offers.push(rec);
        }
        Ok(sent)
    }

    /// Records an ACCEPT_INVERSE_OFFERS (`accept`) or DECLINE_INVERSE_OFFERS.
    pub fn answer_inverse_offers(&mut self, fid: &str, ids: &[String], accept: bool) {
        for rec in &mut self.inverse_offers {
            if rec.framework == fid && ids.contains(&rec.id) && rec.status == "PENDING" {
                rec.status = if accept { "ACCEPTED" } else { "DECLINED" };
                tracing::info!(framework = %fid, inverse_offer = %rec.id, status = rec.status, "inverse offer answered");
            }
        }
    }
}
