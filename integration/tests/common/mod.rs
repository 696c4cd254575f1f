//! Shared by the runtime tests: a recorder of resource-manager events that
//! waits for a matching event with a deadline, without losing the others.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use cruise_rm::RmEvent;
use tokio::sync::mpsc;

/// Every event received so far, and the channel for more.
pub struct Events {
    rx: mpsc::UnboundedReceiver<RmEvent>,
    /// Events in arrival order.
    pub seen: Vec<RmEvent>,
    /// Which of them [`Events::next`] has handed out.
    taken: Vec<bool>,
}

impl Events {
    pub fn new(rx: mpsc::UnboundedReceiver<RmEvent>) -> Events {
        Events {
            rx,
            seen: Vec::new(),
            taken: Vec::new(),
        }
    }

    /// Waits for the earliest event not handed out yet for which `f` gives
    /// `Some`, and hands it out. Events that do not match stay available.
    pub async fn next<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&RmEvent) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let mut i = 0;
        loop {
            while i < self.seen.len() {
                if !self.taken[i]
                    && let Some(v) = f(&self.seen[i])
                {
                    self.taken[i] = true;
                    return v;
                }
                i += 1;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(ev)) => {
                    self.seen.push(ev);
                    self.taken.push(false);
                }
                Ok(None) => panic!(
                    "event channel closed while waiting for {what}; seen: {:?}",
                    self.seen
                ),
                Err(_) => panic!(
                    "timed out after {timeout:?} waiting for {what}; seen: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for an event anywhere in the history (handed out or not).
    pub async fn any<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&RmEvent) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let mut i = 0;
        loop {
            while i < self.seen.len() {
                if let Some(v) = f(&self.seen[i]) {
                    return v;
                }
                i += 1;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(ev)) => {
                    self.seen.push(ev);
                    self.taken.push(false);
                }
                Ok(None) => panic!(
                    "event channel closed while waiting for {what}; seen: {:?}",
                    self.seen
                ),
                Err(_) => panic!(
                    "timed out after {timeout:?} waiting for {what}; seen: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Marks every event received so far as handed out.
    pub fn skip_all(&mut self) {
        self.drain();
        self.taken.iter_mut().for_each(|t| *t = true);
    }

    /// Receives whatever is queued now.
    pub fn drain(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            self.seen.push(ev);
            self.taken.push(false);
        }
    }
}

pub fn allocated(ev: &RmEvent) -> Option<(String, String)> {
    match ev {
        RmEvent::Allocated { container, host } => Some((container.clone(), host.clone())),
        _ => None,
    }
}

pub fn running(ev: &RmEvent) -> Option<String> {
    match ev {
        RmEvent::Running { container, .. } => Some(container.clone()),
        _ => None,
    }
}

/// (container, exit, diagnostics, released)
pub fn completed(ev: &RmEvent) -> Option<(String, cruise_rm::ExitStatus, String, bool)> {
    match ev {
        RmEvent::Completed {
            container,
            exit,
            diagnostics,
            released,
        } => Some((container.clone(), *exit, diagnostics.clone(), *released)),
        _ => None,
    }
}
