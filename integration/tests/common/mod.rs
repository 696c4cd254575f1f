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
    /// Index of the first event not yet consumed by [`Events::next`].
    cursor: usize,
}

impl Events {
    pub fn new(rx: mpsc::UnboundedReceiver<RmEvent>) -> Events {
        Events {
            rx,
            seen: Vec::new(),
            cursor: 0,
        }
    }

    /// Waits for the first event (from the cursor on) for which `f` gives
    /// `Some`, moving the cursor past it.
    pub async fn next<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&RmEvent) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            while self.cursor < self.seen.len() {
                let i = self.cursor;
                self.cursor += 1;
                if let Some(v) = f(&self.seen[i]) {
                    return v;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(ev)) => self.seen.push(ev),
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

    /// Waits for an event anywhere in the history (cursor unchanged).
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
                Ok(Some(ev)) => self.seen.push(ev),
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

    /// Receives whatever is queued now.
    pub fn drain(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            self.seen.push(ev);
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
