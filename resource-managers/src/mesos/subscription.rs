//! The subscription: the task reading one SUBSCRIBE's event stream, the
//! SUBSCRIBE call itself, liveness (heartbeats, re-subscribing with backoff,
//! giving up), and the handling of every event the master sends. Part of
//! the framework actor ([`super::Actor`]); offers are packed in
//! [`super::offers`], task updates handled in [`super::tasks`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::client::{SchedulerClient, next_event};
use super::{Actor, Note};
use crate::{ExitStatus, RmEvent};

/// Reads one subscription's events and forwards them.
async fn subscription(
    client: Arc<SchedulerClient>,
    call: Value,
    generation: u64,
    delay: Duration,
    notes: mpsc::UnboundedSender<Note>,
) {
    tokio::time::sleep(delay).await;
    let mut sub = match client.subscribe(&call).await {
        Ok(s) => s,
        Err(e) => {
            let _ = notes.send(Note::Ended {
                generation,
                reason: e.to_string(),
                fatal: true,
            });
            return;
        }
    };
    tracing::info!(master = %sub.master, "subscribed to the Mesos master");
    if notes
        .send(Note::Subscribed {
            generation,
            stream_id: sub.stream_id.clone(),
        })
        .is_err()
    {
        return;
    }
    loop {
        let (reason, stop) = match next_event(&mut sub.events).await {
            Ok(Some(event)) => {
                if notes.send(Note::Event { generation, event }).is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => ("the event stream ended".to_string(), true),
            Err(e) => (e, true),
        };
        if stop {
            let _ = notes.send(Note::Ended {
                generation,
                reason: format!("{reason} (master {})", sub.master),
                fatal: false,
            });
            return;
        }
    }
}

impl Actor {
    pub(super) fn subscribe_call(&self, fid: Option<&str>) -> Value {
        let mut info = json!({
            "user": self.cfg.user,
            "name": self.cfg.framework_name,
            "roles": [self.cfg.role],
            "failover_timeout": self.cfg.failover_timeout_secs,
            "checkpoint": false,
            "capabilities": [{"type": "MULTI_ROLE"}],
        });
        let mut call = json!({"type": "SUBSCRIBE", "subscribe": {"framework_info": info.clone()}});
        if let Some(f) = fid {
            info["id"] = json!({"value": f});
            call = json!({
                "type": "SUBSCRIBE",
                "framework_id": {"value": f},
                "subscribe": {"framework_info": info},
            });
        }
        call
    }

    /// Starts a (new) subscription, replacing the current one.
    pub(super) fn subscribe(&mut self) {
        self.subscribe_after(Duration::ZERO);
    }

    /// Starts a (new) subscription after `delay`, replacing the current one.
    pub(super) fn subscribe_after(&mut self, delay: Duration) {
        if let Some(s) = self.stream.take() {
            s.abort();
        }
        self.generation += 1;
        self.subscribed_at = None;
        self.stream_id = None;
        self.set_stream(None);
        let fid = self.framework_id();
        let call = self.subscribe_call(fid.as_deref());
        self.last_event = Instant::now();
        self.stream = Some(tokio::spawn(subscription(
            Arc::clone(&self.client),
            call,
            self.generation,
            delay,
            self.note_tx.clone(),
        )));
    }

    pub(super) fn set_stream(&self, stream: Option<String>) {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).stream_id = stream;
    }

    pub(super) fn check_heartbeat(&mut self) {
        if self.dead || self.stream_id.is_none() {
            return;
        }
        let limit = self.heartbeat * self.cfg.missed_heartbeats.max(1);
        if self.last_event.elapsed() > limit {
            tracing::warn!(
                silent_secs = self.last_event.elapsed().as_secs_f64(),
                "no event from the Mesos master for {} heartbeats; subscribing again",
                self.cfg.missed_heartbeats
            );
            self.client.reset_connections();
            self.resubscribe("heartbeats stopped".into());
        }
    }

    /// How long a subscription must stay up to count as working: as long
    /// as the heartbeats it may miss.
    pub(super) fn stable_for(&self) -> Duration {
        self.heartbeat * self.cfg.missed_heartbeats.max(1)
    }

    pub(super) fn resubscribe(&mut self, why: String) {
        if self
            .subscribed_at
            .is_some_and(|t| t.elapsed() >= self.stable_for())
        {
            self.resubscribes = 0;
        }
        self.resubscribes += 1;
        let attempts = self.cfg.http.retry.attempts.max(1);
        if self.resubscribes > attempts {
            self.fail(format!(
                "the Mesos master connection keeps failing ({why}); gave up after {} re-subscriptions, none of which stayed up for {:.0} s",
                self.resubscribes - 1,
                self.stable_for().as_secs_f64()
            ));
            return;
        }
        let delay = backoff(&self.cfg.http.retry, self.resubscribes, self.generation);
        tracing::warn!(
            "Mesos subscription lost ({why}); subscribing again in {:.2} s ({} of {attempts})",
            delay.as_secs_f64(),
            self.resubscribes
        );
        self.subscribe_after(delay);
    }

    pub(super) fn fail(&mut self, reason: String) {
        if self.dead {
            return;
        }
        tracing::error!("Mesos framework failed: {reason}");
        self.dead = true;
        if let Some(s) = self.stream.take() {
            s.abort();
        }
        self.emit(RmEvent::AllocationFailed { reason });
    }
    pub(super) fn on_note(&mut self, note: Note) {
        match note {
            Note::Subscribed {
                generation,
                stream_id,
            } if generation == self.generation => {
                self.stream_id = Some(stream_id.clone());
                self.set_stream(Some(stream_id));
                self.last_event = Instant::now();
                self.subscribed_at = Some(Instant::now());
            }
            Note::Event { generation, event } if generation == self.generation => {
                self.last_event = Instant::now();
                self.on_event(event);
            }
            Note::Ended {
                generation,
                reason,
                fatal,
            } if generation == self.generation => {
                self.stream_id = None;
                self.set_stream(None);
                if self.dead {
                    return;
                }
                if fatal {
                    self.fail(reason);
                } else {
                    self.resubscribe(reason);
                }
            }
            Note::CallFailed { what, tasks, error } => {
                tracing::warn!("Mesos {what} call failed: {error}");
                for t in tasks {
                    self.finish_task(
                        &t,
                        ExitStatus::Unknown,
                        format!("launching the task failed: the {what} call failed: {error}"),
                    );
                }
            }
            _ => {} // a note from an older subscription
        }
    }

    pub(super) fn on_event(&mut self, ev: Value) {
        let ty = ev["type"].as_str().unwrap_or("");
        match ty {
            "SUBSCRIBED" => {
                let s = &ev["subscribed"];
                let fid = s["framework_id"]["value"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                if let Some(h) = s["heartbeat_interval_seconds"]
                    .as_f64()
                    .filter(|h| *h > 0.0)
                {
                    self.heartbeat = Duration::from_secs_f64(h);
                }
                let again = self.subscribed_once;
                self.subscribed_once = true;
                {
                    let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
                    ids.framework_id = Some(fid.clone());
                }
                self.guard.armed = true;
                tracing::info!(framework = %fid, again, "Mesos framework subscribed");
                if again && !self.tasks.is_empty() {
                    let list: Vec<Value> = self
                        .tasks
                        .iter()
                        .map(|(id, t)| json!({"task_id": {"value": id}, "agent_id": {"value": t.agent_id}}))
                        .collect();
                    self.send(self.body("RECONCILE", json!({"tasks": list})), vec![]);
                }
                if self.wanted > 0 {
                    self.send(
                        self.body("REVIVE", json!({"roles": [self.cfg.role]})),
                        vec![],
                    );
                    self.filtered = false;
                }
            }
            "HEARTBEAT" => {}
            "OFFERS" => {
                let offers = ev["offers"]["offers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                self.on_offers(&offers);
                self.update_capacity();
            }
            "RESCIND" => {
                let oid = ev["rescind"]["offer_id"]["value"].as_str().unwrap_or("");
                self.agents
                    .retain(|_, a| !a.offers.iter().any(|o| o == oid));
                self.update_capacity();
            }
            "UPDATE" => {
                self.on_update(&ev["update"]["status"]);
                self.settle_inverse_offers();
            }
            "INVERSE_OFFERS" => self.on_inverse_offers(&ev),
            "RESCIND_INVERSE_OFFER" => self.on_rescind_inverse_offer(&ev),
            "FAILURE" => {
                let f = &ev["failure"];
                let agent = f["agent_id"]["value"].as_str().unwrap_or("");
                if f["executor_id"].is_null() {
                    tracing::warn!(agent, "Mesos agent lost");
                    self.agents.remove(agent);
                    self.update_capacity();
                    self.settle_inverse_offers();
                } else {
                    tracing::info!(agent, executor = %f["executor_id"]["value"], status = %f["status"], "Mesos executor ended");
                }
            }
            "ERROR" => {
                let msg = ev["error"]["message"]
                    .as_str()
                    .or(ev["message"].as_str())
                    .unwrap_or("(no message)");
                self.fail(format!("the Mesos master sent ERROR: {msg}"));
            }
            "MESSAGE" | "UPDATE_OPERATION_STATUS" => {
                tracing::debug!(event = ty, "ignored Mesos event");
            }
            other => tracing::debug!(event = other, "unknown Mesos event"),
        }
    }
}

/// The wait before re-subscription `n` (1-based): the policy's initial
/// backoff doubled per attempt, at most its maximum, with jitter (between
/// half and all of it) so that frameworks do not come back in step.
fn backoff(policy: &crate::http::RetryPolicy, n: u32, seed: u64) -> Duration {
    use std::hash::BuildHasher;
    let base = policy
        .initial_backoff
        .saturating_mul(1u32 << (n.saturating_sub(1)).min(16))
        .min(policy.max_backoff);
    let r = std::collections::hash_map::RandomState::new().hash_one(seed);
    let frac = 0.5 + 0.5 * (r % 1000) as f64 / 1000.0;
    base.mul_f64(frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_to_its_cap() {
        let p = crate::http::RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        };
        for seed in 0..50 {
            let b1 = backoff(&p, 1, seed);
            assert!(b1 >= Duration::from_millis(100) && b1 <= Duration::from_millis(200));
            let b4 = backoff(&p, 4, seed);
            assert!(b4 >= Duration::from_millis(800) && b4 <= Duration::from_millis(1600));
            let b20 = backoff(&p, 20, seed);
            assert!(b20 >= Duration::from_millis(2500) && b20 <= Duration::from_secs(5));
        }
    }
}
