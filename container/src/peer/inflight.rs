//! In-flight marks: every outbound request holds a sequence number until it
//! is answered, fails or is abandoned, so that an evaluator can wait for
//! everything routed before a moment (an ownership update) to be done.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{DataPlane, lock};

impl DataPlane {
    /// A mark in the order of outbound requests: everything issued so far
    /// is before it.
    pub fn request_mark(&self) -> u64 {
        self.inner.inflight.mark()
    }

    /// Waits until every outbound request issued before `mark` has been
    /// answered or has failed. An evaluator acknowledges an ownership update
    /// only then: once every member has, no request routed by an older
    /// table is still on its way, and an evaluator that owns nothing in the
    /// new one can leave without cutting a request off.
    pub async fn requests_done_before(&self, mark: u64) {
        self.inner.inflight.done_before(mark).await
    }
}

/// Sequence numbers of the outbound requests in flight.
#[derive(Default)]
pub(super) struct Inflight {
    /// The next sequence number, and the ones not finished yet with how
    /// many guards hold each.
    state: Mutex<(u64, BTreeMap<u64, usize>)>,
    finished: tokio::sync::Notify,
}

/// One request in flight; finished when dropped (answered, failed or
/// abandoned alike) and every guard [`InflightGuard::share`]d from it is.
pub(super) struct InflightGuard {
    seq: u64,
    of: Arc<Inflight>,
}

impl InflightGuard {
    /// Another guard of the same sequence number: an operation routed once
    /// and sent as several requests counts from when it was routed.
    pub(super) fn share(&self) -> InflightGuard {
        *lock(&self.of.state).1.entry(self.seq).or_insert(0) += 1;
        InflightGuard {
            seq: self.seq,
            of: Arc::clone(&self.of),
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        {
            let mut st = lock(&self.of.state);
            if let Some(n) = st.1.get_mut(&self.seq) {
                *n -= 1;
                if *n == 0 {
                    st.1.remove(&self.seq);
                }
            }
        }
        self.of.finished.notify_waiters();
    }
}

impl Inflight {
    pub(super) fn begin(self: &Arc<Self>) -> InflightGuard {
        let mut st = lock(&self.state);
        let seq = st.0;
        st.0 += 1;
        st.1.insert(seq, 1);
        InflightGuard {
            seq,
            of: Arc::clone(self),
        }
    }

    fn mark(&self) -> u64 {
        lock(&self.state).0
    }

    async fn done_before(&self, mark: u64) {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            // Registered before the check: a request finishing in between
            // still wakes us.
            finished.as_mut().enable();
            if lock(&self.state)
                .1
                .first_key_value()
                .is_none_or(|(&first, _)| first >= mark)
            {
                return;
            }
            finished.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Whether `done_before(mark)` has finished, given a moment to run.
    async fn finished(f: &mut std::pin::Pin<Box<impl std::future::Future<Output = ()>>>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), f.as_mut())
            .await
            .is_ok()
    }

    /// An operation's requests count from when it was routed: a mark taken
    /// after its routing guard (an ownership update applied while it was
    /// being sent) waits for every request shared from that guard, even
    /// when the guard itself is gone, and no longer.
    #[tokio::test]
    async fn a_mark_waits_for_requests_routed_before_it() {
        let inflight = Arc::new(Inflight::default());
        let routing = inflight.begin();
        let mark = inflight.mark();
        let later = inflight.begin(); // routed after the mark: not waited for
        let (a, b) = (routing.share(), routing.share());
        drop(routing);
        let mut done = Box::pin({
            let inflight = Arc::clone(&inflight);
            async move { inflight.done_before(mark).await }
        });
        assert!(!finished(&mut done).await, "two requests are still out");
        drop(a);
        assert!(!finished(&mut done).await, "one request is still out");
        drop(b);
        assert!(finished(&mut done).await, "waits for nothing newer");
        drop(later);
        assert!(lock(&inflight.state).1.is_empty());
    }
}
