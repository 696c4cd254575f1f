//! The outbound request connection to one peer ([`OutConn`]): requests are
//! queued on it in call order and written by one task, which completes
//! their answers (reading values that come as tails straight into place),
//! gives the connection up when its oldest request waits longer than
//! `store.request_timeout_ms`, and on a goodbye writes what is queued and
//! acknowledges. What becomes of a lost connection's requests is told in
//! [`super::requests`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Sink, SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::Framed;

use crate::protocol::frames::Placer;
use crate::protocol::{
    EvaluatorId, FrameCodec, Outgoing, PeerRequest, PeerResponse, Placement, Purpose, RemoteError,
    ToClient, ToOwner, ValueBatch,
};
use crate::store::PartResult;

use super::inflight::{Inflight, InflightGuard};
use super::{DataPlane, PeerError, lock};

impl DataPlane {
    /// The outbound request connection to `peer`, created (and connected in
    /// the background) if needed. Requests queued on it are sent in order.
    pub(super) fn conn(&self, peer: EvaluatorId) -> Arc<OutConn> {
        let mut conns = lock(&self.inner.conns);
        if let Some(c) = conns.get(&peer)
            && !c.closed.load(Ordering::SeqCst)
        {
            return Arc::clone(c);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let c = Arc::new(OutConn {
            peer,
            tx,
            pending: Mutex::new(HashMap::new()),
            inflight: Arc::clone(&self.inner.inflight),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        });
        conns.insert(peer, Arc::clone(&c));
        let this = self.clone();
        let conn = Arc::clone(&c);
        let progress = Arc::new(AtomicU64::new(0));
        self.inner.tasks.spawn(crate::os::CpuTimed::with_progress(
            {
                let progress = Arc::clone(&progress);
                async move { this.run_outbound(conn, rx, &progress).await }
            },
            Arc::clone(&self.inner.request_cpu_ns),
            progress,
            Arc::clone(&self.inner.request_idle_cpu_ns),
        ));
        c
    }

    /// The outbound connection's task: writes what is queued on `rx`,
    /// completes the answers; advances `progress` at each.
    async fn run_outbound(
        &self,
        conn: Arc<OutConn>,
        mut rx: mpsc::UnboundedReceiver<Outgoing>,
        progress: &AtomicU64,
    ) {
        let Some(framed) = self.connect_outbound(&conn, &mut rx).await else {
            return;
        };
        let (mut sink, stream) =
            super::split_requests::<Outgoing, ToClient, _>(framed, self.inner.settings.frames);
        let mut stream = stream.with_placement(placer(&conn));
        let mut said_goodbye = false;
        let timeout = self.inner.settings.request_timeout;
        let mut deadlines = tokio::time::interval(
            (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        );
        deadlines.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason = loop {
            tokio::select! {
                biased;
                _ = self.inner.cancel.cancelled() => break "the data plane is shutting down".to_string(),
                _ = self.inner.faults.broken() => break "connection broken (injected fault)".to_string(),
                _ = deadlines.tick() => {
                    if let Some(reason) = overdue(&conn, timeout) {
                        break reason;
                    }
                }
                frame = stream.next() => match frame {
                    Some(Ok(ToClient::Response { id, result })) => {
                        progress.fetch_add(1, Ordering::Relaxed);
                        conn.complete(id, result)
                    }
                    Some(Ok(ToClient::GoAway)) => {
                        progress.fetch_add(1, Ordering::Relaxed);
                        if self.go_away(&conn, &mut rx, &mut sink).await {
                            said_goodbye = true;
                        }
                    }
                    Some(Err(e)) => break format!("connection failed: {e}"),
                    None => {
                        if said_goodbye && conn.pending_count() == 0 {
                            return;
                        }
                        break "connection closed by the peer".to_string();
                    }
                },
                m = rx.recv(), if !said_goodbye => if let Some(m) = m {
                    progress.fetch_add(1, Ordering::Relaxed);
                    let delay = self.inner.faults.request_delay();
                    if !delay.is_zero() {
                        // A test's slow sender (`Faults::set_request_delay`).
                        tokio::time::sleep(delay).await;
                    }
                    if let Err(e) = write_queued(&mut sink, &mut rx, m).await {
                        break format!("write failed: {e}");
                    }
                },
            }
        };
        self.lose_outbound(&conn, &mut rx, &reason);
    }

    /// Opens `conn`'s connection. If it cannot, nothing was written:
    /// everything queued on `rx` may be sent again, and `conn` is closed.
    async fn connect_outbound(
        &self,
        conn: &Arc<OutConn>,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    ) -> Option<Framed<super::Stream, FrameCodec<ToOwner, ToClient>>> {
        let peer = conn.peer;
        let framed = match self.addr_of(peer) {
            None => Err(PeerError::UnknownPeer(peer)),
            Some(addr) => {
                self.open::<ToOwner, ToClient>(peer, addr, Purpose::Requests)
                    .await
            }
        };
        match framed {
            Ok(f) => Some(f),
            Err(e) => {
                rx.close();
                while rx.try_recv().is_ok() {}
                conn.close_and_fail(&self.inner.conns, RemoteError::retry(e.to_string()));
                None
            }
        }
    }

    /// The peer is going away: stops taking requests on `conn`, writes
    /// what is queued on `rx`, then acknowledges. Whether all of it was
    /// written.
    async fn go_away<S>(
        &self,
        conn: &Arc<OutConn>,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        sink: &mut S,
    ) -> bool
    where
        S: Sink<Outgoing> + Unpin,
    {
        conn.closed.store(true, Ordering::SeqCst);
        lock(&self.inner.conns).retain(|_, c| !Arc::ptr_eq(c, conn));
        rx.close();
        while let Some(m) = rx.recv().await {
            if sink.feed(m).await.is_err() {
                return false;
            }
        }
        sink.send(ToOwner::GoAwayAck.into()).await.is_ok()
    }

    /// `conn`'s connection is lost (`reason`): requests still queued on
    /// `rx` were never written and may be sent again; those written have
    /// an unknown outcome.
    fn lose_outbound(
        &self,
        conn: &Arc<OutConn>,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        reason: &str,
    ) {
        let peer = conn.peer;
        rx.close();
        while let Ok(m) = rx.try_recv() {
            if let ToOwner::Request { id, .. } = m.msg {
                conn.complete(
                    id,
                    Err(RemoteError::retry(format!(
                        "connection to evaluator {peer} lost ({reason})"
                    ))),
                );
            }
        }
        conn.close_and_fail(
            &self.inner.conns,
            RemoteError::lost_at(
                peer,
                format!(
                    "connection to evaluator {peer} lost with the request in flight ({reason}); its outcome is unknown"
                ),
            ),
        );
    }
}

/// Reads the values of `conn`'s answers that come as tails straight into
/// where they go (`protocol::frames`).
fn placer(conn: &Arc<OutConn>) -> Placer<ToClient> {
    let conn = Arc::clone(conn);
    Box::new(move |meta: &[u8], n| {
        let id = values_response_id(meta)?;
        let place = conn.placement(id, n)?;
        // The values are in place: the answer says no more.
        let placed = ToClient::Response {
            id,
            result: Ok(PeerResponse::Values(ValueBatch::default())),
        };
        Some((place, placed))
    })
}

/// Why to give up `conn`, if its oldest request has had no answer for
/// longer than `timeout`.
fn overdue(conn: &OutConn, timeout: Duration) -> Option<String> {
    let (id, kind, waited) = conn.oldest_pending()?;
    if waited <= timeout {
        return None;
    }
    tracing::warn!(peer = %conn.peer, request = id, kind, waited_secs = waited.as_secs_f64(), "no answer within store.request_timeout_ms; giving up the connection");
    Some(format!(
        "no answer to {kind} request {id} for {:.1} s (store.request_timeout_ms = {})",
        waited.as_secs_f64(),
        timeout.as_millis()
    ))
}

/// Writes `m` and whatever else is queued on `rx`, then flushes.
async fn write_queued<S>(
    sink: &mut S,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    m: Outgoing,
) -> Result<(), S::Error>
where
    S: Sink<Outgoing> + Unpin,
{
    let mut r = sink.feed(m).await;
    while r.is_ok() {
        match rx.try_recv() {
            Ok(m) => r = sink.feed(m).await,
            Err(_) => break,
        }
    }
    r.and(sink.flush().await)
}

/// The request id of a tail frame's meta (`protocol::frames`) that is a
/// `ToClient::Response` carrying `Ok(PeerResponse::Values(..))`; `None` for
/// any other message. Postcard writes an enum's variant index and then its
/// fields, integers as varints: the response's variant (0), its id, the
/// result's (`Ok`, 0) and the answer's (`Values`, 0). Checked against the
/// encoder by a test.
fn values_response_id(meta: &[u8]) -> Option<u64> {
    match postcard::take_from_bytes::<(u32, u64, u32, u32)>(meta) {
        Ok(((0, id, 0, 0), _)) => Some(id),
        _ => None,
    }
}

/// A request's kind, for messages.
fn request_kind(req: &PeerRequest) -> &'static str {
    match req {
        PeerRequest::Get { .. } => "get",
        PeerRequest::Put { .. } => "put",
        PeerRequest::Update { .. } => "update",
        PeerRequest::Handover { .. } => "handover",
        PeerRequest::Probe { .. } => "probe",
        PeerRequest::AbortHandover { .. } => "call-off",
    }
}

/// A peer's answer and when it arrived.
pub(super) type Arrived = (PartResult, Instant);

/// A request written (or queued) and not answered yet.
struct Unanswered {
    answer: oneshot::Sender<Arrived>,
    _inflight: InflightGuard,
    /// Where the answer's values are read to, if they come as a tail.
    place: Option<Placement>,
    /// When it was queued.
    since: Instant,
    /// What it asks for (`get`, `update`, `handover`...).
    kind: &'static str,
}

/// One outbound request connection.
pub(super) struct OutConn {
    peer: EvaluatorId,
    tx: mpsc::UnboundedSender<Outgoing>,
    pending: Mutex<HashMap<u64, Unanswered>>,
    inflight: Arc<Inflight>,
    next_id: AtomicU64,
    pub(super) closed: AtomicBool,
}

impl OutConn {
    /// Queues a request; synchronous, so requests go out in call order.
    pub(super) fn request(&self, req: PeerRequest) -> oneshot::Receiver<Arrived> {
        self.request_as(req, None, self.inflight.begin(), None)
    }

    /// [`OutConn::request`], with the values of a write held apart (see
    /// [`Outgoing`]) if `values` is set, counted in flight as `guard` (taken
    /// before the request was routed), its answer's values read into
    /// `place` if they come as a tail.
    pub(super) fn request_as(
        &self,
        req: PeerRequest,
        values: Option<Bytes>,
        guard: InflightGuard,
        place: Option<Placement>,
    ) -> oneshot::Receiver<Arrived> {
        let (tx, rx) = oneshot::channel();
        if self.closed.load(Ordering::SeqCst) {
            let _ = tx.send((
                Err(RemoteError::retry(format!(
                    "connection to evaluator {} is closing",
                    self.peer
                ))),
                Instant::now(),
            ));
            return rx;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let pending = Unanswered {
            answer: tx,
            _inflight: guard,
            place,
            since: Instant::now(),
            kind: request_kind(&req),
        };
        lock(&self.pending).insert(id, pending);
        let out = Outgoing {
            msg: ToOwner::Request { id, req },
            values,
        };
        if self.tx.send(out).is_err()
            && let Some(p) = lock(&self.pending).remove(&id)
        {
            let _ = p.answer.send((
                Err(RemoteError::retry(format!(
                    "connection to evaluator {} is closed",
                    self.peer
                ))),
                Instant::now(),
            ));
        }
        rx
    }

    /// Where the values of request `id`'s answer go, `n` of them arriving.
    fn placement(&self, id: u64, n: usize) -> Option<Placement> {
        lock(&self.pending)
            .get(&id)
            .and_then(|p| p.place.clone())
            .filter(|p| p.len == n)
    }

    fn complete(&self, id: u64, result: PartResult) {
        if let Some(p) = lock(&self.pending).remove(&id) {
            let _ = p.answer.send((result, Instant::now()));
        }
    }

    /// The request waiting longest for its answer: its id, kind and wait.
    fn oldest_pending(&self) -> Option<(u64, &'static str, Duration)> {
        lock(&self.pending)
            .iter()
            .min_by_key(|(_, p)| p.since)
            .map(|(&id, p)| (id, p.kind, p.since.elapsed()))
    }

    fn pending_count(&self) -> usize {
        lock(&self.pending).len()
    }

    pub(super) fn fail_all(&self, err: RemoteError) {
        let now = Instant::now();
        for (_, p) in lock(&self.pending).drain() {
            let _ = p.answer.send((Err(err.clone()), now));
        }
    }

    fn close_and_fail(
        self: &Arc<Self>,
        conns: &Mutex<HashMap<EvaluatorId, Arc<OutConn>>>,
        err: RemoteError,
    ) {
        self.closed.store(true, Ordering::SeqCst);
        lock(conns).retain(|_, c| !Arc::ptr_eq(c, self));
        self.fail_all(err);
    }
}

#[cfg(test)]
mod deadline_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;
    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;

    use crate::emulate::Throttled;
    use crate::peer::{DataPlane, PeerSettings};
    use crate::protocol::{
        self, BlockId, EvaluatorId, Faults, MODEL_TABLE, OwnershipUpdate, ToClient, ToOwner,
        ValueBatch,
    };
    use crate::store::{OpKind, Store, StoreOp, SumModel};

    /// A peer that owns every model block, takes requests and never
    /// answers (a hung process, or a partition the AM cannot see): the
    /// request fails once `request_timeout` has passed, naming the peer,
    /// the request and the wait, and the in-flight mark an ownership
    /// acknowledgement waits for is released.
    #[tokio::test]
    async fn a_peer_that_never_answers_fails_the_request_after_the_timeout() {
        let settings = PeerSettings::for_tests(Duration::from_millis(300));
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap();
        let (secret, job, frames) = (
            settings.secret.clone(),
            settings.job_id.clone(),
            settings.frames,
        );
        let hung = tokio::spawn(async move {
            let (stream, _) = silent.accept().await.unwrap();
            let (_, mut framed) = protocol::auth::accept::<_, ToClient, ToOwner>(
                Throttled::new(stream),
                &secret,
                &job,
                frames,
                Duration::from_secs(10),
                |_| Ok(()),
            )
            .await
            .unwrap();
            // Reads every request, answers none.
            while let Some(Ok(_)) = framed.next().await {}
        });

        let me = EvaluatorId(1);
        let store = Store::new(me);
        store.configure(&[(MODEL_TABLE, 4)], Arc::new(SumModel));
        store.apply_ownership(&OwnershipUpdate {
            version: 1,
            owners: BlockId::all(4)
                .map(|b| (MODEL_TABLE, b, EvaluatorId(2)))
                .collect(),
        });
        let cancel = CancellationToken::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dp =
            DataPlane::start(me, store, listener, settings, Faults::default(), &cancel).unwrap();
        dp.set_peers(&[(me, dp.local_addr()), (EvaluatorId(2), silent_addr)]);

        let get = StoreOp {
            kind: OpKind::Get,
            table: MODEL_TABLE,
            keys: (0..16).collect(),
            values: ValueBatch::default(),
        };
        // The request is written before `execute` returns: the mark
        // taken now waits for it.
        let answer = dp.execute(get);
        let mark = dp.request_mark();
        let answer = tokio::time::timeout(Duration::from_secs(60), answer)
            .await
            .expect("the request was never given up");
        let error = answer.expect_err("a peer that never answers cannot have answered");
        assert!(!error.retry, "it may have been applied: {error:?}");
        for part in [
            "evaluator 2",
            "no answer to get request",
            "store.request_timeout_ms",
        ] {
            assert!(error.message.contains(part), "{part}: {}", error.message);
        }
        tokio::time::timeout(Duration::from_secs(60), dp.requests_done_before(mark))
            .await
            .expect("the mark still waits for the given-up request");
        dp.stop().await;
        hung.abort();
    }
}

#[cfg(test)]
mod response_id_tests {
    use bytes::BytesMut;

    use super::values_response_id;
    use crate::protocol::frames::encode_tail_frame;
    use crate::protocol::{
        FrameCodec, FrameOptions, PeerResponse, RemoteError, ToClient, ValueBatch,
    };

    /// The ids `values_response_id` reads from a tail frame's meta are the
    /// encoder's, and only answers with values have one.
    #[test]
    fn the_response_id_is_read_from_the_meta() {
        let opts = FrameOptions::default();
        let values = |n: usize| {
            use rand::{Rng, SeedableRng};
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(n as u64);
            ValueBatch {
                lens: vec![1024; n],
                data: (0..n * 1024).map(|_| rng.random_range(-1.0..1.0)).collect(),
            }
        };
        for id in [0, 1, 127, 128, 300, u64::MAX] {
            let msg = ToClient::Response {
                id,
                result: Ok(PeerResponse::Values(values(32))),
            };
            let mut head = BytesMut::new();
            let tail =
                encode_tail_frame(&mut FrameCodec::<ToClient, ()>::new(opts), msg, &mut head)
                    .unwrap()
                    .expect("a tail frame");
            assert_eq!(tail.len(), 32 * 1024 * 4);
            let meta_len = u32::from_le_bytes([head[5], head[6], head[7], head[8]]) as usize;
            assert_eq!(values_response_id(&head[9..9 + meta_len]), Some(id));
        }
        for other in [
            ToClient::GoAway,
            ToClient::Response {
                id: 5,
                result: Ok(PeerResponse::Done),
            },
            ToClient::Response {
                id: 6,
                result: Err(RemoteError::fatal("no")),
            },
        ] {
            let meta = postcard::to_allocvec(&other).unwrap();
            assert_eq!(values_response_id(&meta), None, "{other:?}");
        }
    }
}
