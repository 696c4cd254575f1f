//! Ending the framework: an orderly shutdown (KILL every task, wait for their
//! ends, TEARDOWN) and [`TeardownGuard`], which tears the framework down when
//! the actor is dropped without one. Part of the framework actor
//! ([`super::Actor`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::client::SchedulerClient;
use super::{Actor, CallJob, FrameworkIds, Note};
use crate::{ExitStatus, RmError};

/// Tears the framework down when dropped while armed (the actor was dropped
/// without shutdown). Sends TEARDOWN on the last stream; if the master
/// refuses it because that stream is gone, subscribes again with the
/// framework id and tears down on the new stream. Blocks the dropping thread
/// for at most a few seconds.
#[derive(Debug)]
pub struct TeardownGuard {
    pub(super) masters: Vec<String>,
    /// The SUBSCRIBE call to send again when the last stream is gone.
    pub(super) subscribe: Value,
    pub(super) ids: Arc<Mutex<FrameworkIds>>,
    /// Set once subscribed; cleared by an orderly teardown.
    pub(super) armed: bool,
}

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(fid) = ids.framework_id else {
            return;
        };
        let masters = self.masters.clone();
        let mut subscribe = self.subscribe.clone();
        crate::actor::clean_up_blocking(move |opts| async move {
            let Ok(c) = SchedulerClient::new(&masters, opts) else {
                return;
            };
            let teardown = json!({"type": "TEARDOWN", "framework_id": {"value": fid}});
            let first = match &ids.stream_id {
                Some(s) => c.call(s, &teardown).await,
                None => Err(RmError::Other("no stream".into())),
            };
            let result = match first {
                Ok(()) => Ok(()),
                Err(_) => {
                    subscribe["framework_id"] = json!({"value": fid});
                    subscribe["subscribe"]["framework_info"]["id"] = json!({"value": fid});
                    match tokio::time::timeout(Duration::from_secs(5), c.subscribe(&subscribe))
                        .await
                    {
                        Ok(Ok(sub)) => c.call(&sub.stream_id, &teardown).await,
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(RmError::Other("SUBSCRIBE timed out".into())),
                    }
                }
            };
            match result {
                Ok(()) => {
                    tracing::warn!(framework = %fid, "Mesos framework torn down by its guard (the resource manager was dropped without shutdown)")
                }
                Err(e) => {
                    tracing::error!(framework = %fid, "could not tear the Mesos framework down: {e}")
                }
            }
        });
    }
}

impl Actor {
    pub(super) async fn shutdown(
        &mut self,
        notes: &mut mpsc::UnboundedReceiver<Note>,
    ) -> Result<(), RmError> {
        self.wanted = 0;
        let result = self.teardown(notes).await;
        let ids: Vec<String> = self.tasks.keys().cloned().collect();
        for id in ids {
            if let Some(t) = self.tasks.get_mut(&id) {
                t.released = true;
            }
            self.finish_task(
                &id,
                ExitStatus::Unknown,
                "framework torn down at shutdown".into(),
            );
        }
        if let Some(s) = self.stream.take() {
            s.abort();
        }
        // Close the call queue and let the caller finish what is queued.
        self.call_tx = None;
        if let Some(c) = self.caller.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), c).await;
        }
        result
    }

    pub(super) async fn teardown(
        &mut self,
        notes: &mut mpsc::UnboundedReceiver<Note>,
    ) -> Result<(), RmError> {
        if self.framework_id().is_none() {
            if let Some(s) = self.stream.take() {
                s.abort();
            }
            return Ok(());
        }
        // Kill every task and wait for their ends (bounded).
        let ids: Vec<String> = self.tasks.keys().cloned().collect();
        for id in &ids {
            let _ = self.release(id);
        }
        let deadline = Instant::now() + self.cfg.kill_grace + Duration::from_secs(2);
        while !self.tasks.is_empty() && self.stream_id.is_some() && Instant::now() < deadline {
            match tokio::time::timeout_at(deadline.into(), notes.recv()).await {
                Ok(Some(n)) => self.on_note(n),
                _ => break,
            }
        }
        let Some(stream_id) = self.stream_id.clone() else {
            // The stream is gone: the guard re-subscribes to tear down.
            return Err(RmError::Other(
                "not subscribed at shutdown; tearing the framework down through its guard".into(),
            ));
        };
        let (done_tx, done_rx) = oneshot::channel();
        let body = self.body("TEARDOWN", Value::Null);
        let queued = self.call_tx.as_ref().is_some_and(|tx| {
            tx.send(CallJob {
                stream_id,
                body,
                tasks: vec![],
                done: Some(done_tx),
            })
            .is_ok()
        });
        if !queued {
            return Err(RmError::Stopped("mesos"));
        }
        match done_rx.await {
            Ok(Ok(())) => {
                self.guard.armed = false;
                tracing::info!(framework = ?self.framework_id(), "Mesos framework torn down");
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RmError::Stopped("mesos")),
        }
    }
}
