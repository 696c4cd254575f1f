//! Inverse offers: the master asks for an agent's resources back ahead of
//! its maintenance window (`PROTOCOLS.md` §5.5, `INVERSE_OFFERS`, nested
//! as `{"inverse_offers":{"inverse_offers":[...]}}`). Part of the framework
//! actor (`super::Actor`).
//!
//! The framework's tasks on the agent are announced as
//! [`RmEvent::Reclaiming`], deadline the window's start (never in the past);
//! the AM empties and releases them. Once none of them is left on the agent
//! the inverse offer is answered with ACCEPT_INVERSE_OFFERS; an inverse
//! offer for an agent holding none of our tasks is accepted at once. Offers
//! from an agent under an inverse offer are declined, so nothing new lands
//! there, also after the acceptance (the agent is going away).
//! RESCIND_INVERSE_OFFER drops the interest and lets the agent's offers in
//! again (what was announced stays announced: the AM's plan may already be
//! under way).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::Actor;
use crate::RmEvent;

/// An inverse offer, as parsed from the event.
#[derive(Debug, Clone, PartialEq)]
pub struct InverseOffer {
    /// `id.value`.
    pub id: String,
    /// `agent_id.value`.
    pub agent_id: String,
    /// `unavailability.start.nanoseconds`: when the agent goes away, in
    /// nanoseconds since the Unix epoch.
    pub start_ns: i64,
    /// `unavailability.duration.nanoseconds`, if given.
    pub duration_ns: Option<i64>,
}

/// Why an inverse offer could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InverseOfferError {
    /// A field it needs is missing or of the wrong type.
    #[error("inverse offer {id}: missing or malformed field {field}")]
    Field {
        /// The offer's id, or `?`.
        id: String,
        /// The field's path.
        field: &'static str,
    },
    /// The event does not hold the nested list.
    #[error("INVERSE_OFFERS event without inverse_offers.inverse_offers[]")]
    NoList,
}

/// Parses one inverse offer.
pub fn parse_inverse_offer(v: &Value) -> Result<InverseOffer, InverseOfferError> {
    let id = v["id"]["value"].as_str().filter(|s| !s.is_empty());
    let missing = |field| InverseOfferError::Field {
        id: id.unwrap_or("?").to_string(),
        field,
    };
    let id = id.ok_or_else(|| missing("id.value"))?.to_string();
    let agent_id = v["agent_id"]["value"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| missing("agent_id.value"))?
        .to_string();
    let start_ns = v["unavailability"]["start"]["nanoseconds"]
        .as_i64()
        .ok_or_else(|| missing("unavailability.start.nanoseconds"))?;
    let duration = &v["unavailability"]["duration"];
    let duration_ns = if duration.is_null() {
        None
    } else {
        Some(
            duration["nanoseconds"]
                .as_i64()
                .ok_or_else(|| missing("unavailability.duration.nanoseconds"))?,
        )
    };
    Ok(InverseOffer {
        id,
        agent_id,
        start_ns,
        duration_ns,
    })
}

/// Parses an `INVERSE_OFFERS` event: each offer, or why it is not one.
pub fn parse_inverse_offers(
    event: &Value,
) -> Result<Vec<Result<InverseOffer, InverseOfferError>>, InverseOfferError> {
    let list = event["inverse_offers"]["inverse_offers"]
        .as_array()
        .ok_or(InverseOfferError::NoList)?;
    Ok(list.iter().map(parse_inverse_offer).collect())
}

/// The instant of `start_ns` (nanoseconds since the Unix epoch), never
/// before `now`.
pub fn deadline_of(start_ns: i64, now: Instant, wall_now: SystemTime) -> Instant {
    let now_ns = wall_now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let ahead = start_ns.saturating_sub(now_ns).max(0);
    now + Duration::from_nanos(u64::try_from(ahead).unwrap_or(0))
}

/// An inverse offer still waiting for our tasks to leave its agent.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub agent_id: String,
}

impl Actor {
    pub(super) fn on_inverse_offers(&mut self, event: &Value) {
        let offers = match parse_inverse_offers(event) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("ignoring a Mesos event: {e}");
                return;
            }
        };
        for o in offers {
            let o = match o {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!("ignoring a Mesos inverse offer: {e}");
                    continue;
                }
            };
            let deadline = deadline_of(o.start_ns, Instant::now(), SystemTime::now());
            let ours: Vec<String> = self
                .tasks
                .iter()
                .filter(|(_, t)| t.agent_id == o.agent_id && !t.released)
                .map(|(id, _)| id.clone())
                .collect();
            tracing::info!(
                inverse_offer = %o.id,
                agent = %o.agent_id,
                tasks = ours.len(),
                in_secs = deadline.saturating_duration_since(Instant::now()).as_secs_f64(),
                "Mesos inverse offer: the agent goes into maintenance"
            );
            self.maintenance.insert(o.id.clone(), o.agent_id.clone());
            self.draining.insert(
                o.id.clone(),
                Pending {
                    agent_id: o.agent_id.clone(),
                },
            );
            if !ours.is_empty() {
                let secs = deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64();
                self.emit(RmEvent::Reclaiming {
                    containers: ours,
                    deadline,
                    reason: format!(
                        "Mesos inverse offer {}: agent {} is unavailable in {secs:.0} s",
                        o.id, o.agent_id
                    ),
                });
            }
        }
        self.settle_inverse_offers();
    }

    pub(super) fn on_rescind_inverse_offer(&mut self, event: &Value) {
        let id = event["rescind_inverse_offer"]["inverse_offer_id"]["value"]
            .as_str()
            .unwrap_or("");
        self.maintenance.remove(id);
        match self.draining.remove(id) {
            Some(p) => tracing::info!(
                inverse_offer = id,
                agent = %p.agent_id,
                "Mesos inverse offer rescinded; containers already being given back stay so"
            ),
            None => tracing::debug!(inverse_offer = id, "rescinded an unknown inverse offer"),
        }
    }

    /// Whether `agent` is under an inverse offer, answered or not (its
    /// offers are declined).
    pub(super) fn draining_agent(&self, agent: &str) -> bool {
        self.maintenance.values().any(|a| a == agent)
    }

    /// Accepts every pending inverse offer whose agent holds none of our
    /// tasks any more.
    pub(super) fn settle_inverse_offers(&mut self) {
        if self.draining.is_empty() || self.stream_id.is_none() {
            return;
        }
        let free: Vec<String> = self
            .draining
            .iter()
            .filter(|(_, p)| !self.tasks.values().any(|t| t.agent_id == p.agent_id))
            .map(|(id, _)| id.clone())
            .collect();
        if free.is_empty() {
            return;
        }
        let ids: Vec<Value> = free.iter().map(|id| json!({"value": id})).collect();
        if self.send(
            self.body("ACCEPT_INVERSE_OFFERS", json!({"inverse_offer_ids": ids})),
            vec![],
        ) {
            for id in &free {
                if let Some(p) = self.draining.remove(id) {
                    tracing::info!(inverse_offer = %id, agent = %p.agent_id, "accepted the Mesos inverse offer: none of our tasks is left on the agent");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_nested_shape() {
        let ev = json!({"type": "INVERSE_OFFERS", "inverse_offers": {"inverse_offers": [
            {"id": {"value": "io-1"}, "framework_id": {"value": "f"}, "agent_id": {"value": "S1"},
             "unavailability": {"start": {"nanoseconds": 1_000_000_000_000i64},
                                "duration": {"nanoseconds": 60_000_000_000i64}}},
            {"id": {"value": "io-2"}, "agent_id": {"value": "S2"},
             "unavailability": {"start": {"nanoseconds": 5}}},
        ]}});
        let got = parse_inverse_offers(&ev).unwrap();
        assert_eq!(
            got[0],
            Ok(InverseOffer {
                id: "io-1".into(),
                agent_id: "S1".into(),
                start_ns: 1_000_000_000_000,
                duration_ns: Some(60_000_000_000),
            })
        );
        assert_eq!(got[1].as_ref().unwrap().duration_ns, None);
        // The flat shape of the docs is not the real one.
        let flat = json!({"type": "INVERSE_OFFERS", "inverse_offers": []});
        assert_eq!(parse_inverse_offers(&flat), Err(InverseOfferError::NoList));
    }

    #[test]
    fn missing_fields_are_named() {
        let cases = [
            (json!({"agent_id": {"value": "S1"}}), "id.value"),
            (
                json!({"id": {"value": "io"}, "unavailability": {"start": {"nanoseconds": 1}}}),
                "agent_id.value",
            ),
            (
                json!({"id": {"value": "io"}, "agent_id": {"value": "S1"}}),
                "unavailability.start.nanoseconds",
            ),
            (
                json!({"id": {"value": "io"}, "agent_id": {"value": "S1"},
                       "unavailability": {"start": {"nanoseconds": "soon"}}}),
                "unavailability.start.nanoseconds",
            ),
            (
                json!({"id": {"value": "io"}, "agent_id": {"value": "S1"},
                       "unavailability": {"start": {"nanoseconds": 1}, "duration": {}}}),
                "unavailability.duration.nanoseconds",
            ),
        ];
        for (v, field) in cases {
            let e = parse_inverse_offer(&v).unwrap_err();
            assert!(e.to_string().contains(field), "{e} should name {field}");
        }
    }

    #[test]
    fn deadline_is_the_start_and_never_past() {
        let now = Instant::now();
        let wall = UNIX_EPOCH + Duration::from_secs(1000);
        let in_30 = deadline_of(1030 * 1_000_000_000, now, wall);
        assert_eq!(in_30 - now, Duration::from_secs(30));
        assert_eq!(deadline_of(999 * 1_000_000_000, now, wall), now);
        assert_eq!(deadline_of(i64::MIN, now, wall), now);
    }
}
