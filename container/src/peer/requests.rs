//! Outbound requests: routing a store operation's parts to their owners,
//! one ordered connection per peer, retries, the in-flight marks, and
//! bandwidth probes.
//!
//! # Failures
//!
//! A request that was never written (the connection could not be opened) fails
//! with a retryable error and is sent again, with backoff, after re-routing.
//! A request written on a connection that then broke fails for good: whether
//! it was applied is unknown, and retrying could apply it twice.
//!
//! A request in flight to a peer that then leaves the job (the AM let it
//! go as lost) is the exception: its blocks come back from a checkpoint
//! that cannot hold the request, so it is re-routed and sent again. A
//! request whose connection was lost waits for the next peer directory (up
//! to `store.request_timeout_ms`) to tell; if the peer is still listed, it
//! fails as above.
//!
//! No answer is waited for forever: when the oldest request on a connection
//! has waited longer than [`PeerSettings::request_timeout`](super::PeerSettings::request_timeout)
//! (`store.request_timeout_ms`) the connection is given up like a broken
//! one, and the error names the peer, the request and the wait. Giving up
//! also releases the in-flight marks that an ownership acknowledgement
//! waits for.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, Sink, SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::Framed;

use crate::protocol::frames::Placer;
use crate::protocol::{
    EvaluatorId, FrameCodec, LinkSample, Outgoing, PeerRequest, PeerResponse, Placement, Purpose,
    RemoteError, ToClient, ToOwner, ValueBatch,
};
use crate::store::{self, OpKind, PartResult, Pending, StoreOp};

use super::{DataPlane, MAX_RETRIES, PeerError, lock};

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

    /// Replaces the peer directory. Evaluators that were known and are no
    /// longer listed have left: forwarding pointers to them are dropped and
    /// their connections closed.
    pub fn set_peers(&self, peers: &[(EvaluatorId, SocketAddr)]) {
        let listed: HashSet<EvaluatorId> = peers.iter().map(|p| p.0).collect();
        let departed: Vec<EvaluatorId> = {
            let mut seen = lock(&self.inner.ever_seen);
            seen.extend(listed.iter().copied());
            seen.difference(&listed).copied().collect()
        };
        *lock(&self.inner.directory) = peers.iter().copied().collect();
        self.inner.store.set_departed(departed.iter().copied());
        {
            let mut conns = lock(&self.inner.conns);
            for d in departed {
                if let Some(c) = conns.remove(&d) {
                    c.closed.store(true, Ordering::SeqCst);
                    // A hung peer answers nothing more: what waits for it is
                    // sent again to the blocks' next owner.
                    c.fail_all(RemoteError::lost_at(
                        d,
                        format!("evaluator {d} left the job with the request in flight"),
                    ));
                }
            }
        }
        self.inner.directory_version.send_modify(|v| *v += 1);
    }

    /// Whether `peer` has left the job: known before, and not in the
    /// directory any more.
    fn departed(&self, peer: EvaluatorId) -> bool {
        let seen = lock(&self.inner.ever_seen).contains(&peer);
        seen && !lock(&self.inner.directory).contains_key(&peer)
    }

    /// Waits up to `wait` for `peer` to leave the job (a new directory
    /// without it); returns whether it did.
    async fn await_departure(&self, peer: EvaluatorId, wait: Duration) -> bool {
        let mut version = self.inner.directory_version.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.departed(peer) {
                return true;
            }
            tokio::select! {
                changed = version.changed() => if changed.is_err() {
                    return false;
                },
                _ = tokio::time::sleep_until(deadline) => return self.departed(peer),
                _ = self.inner.cancel.cancelled() => return false,
            }
        }
    }

    pub(super) fn addr_of(&self, peer: EvaluatorId) -> Option<SocketAddr> {
        lock(&self.inner.directory).get(&peer).copied()
    }

    /// The outbound request connection to `peer`, created (and connected in
    /// the background) if needed. Requests queued on it are sent in order.
    fn conn(&self, peer: EvaluatorId) -> Arc<OutConn> {
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

    /// Executes a keyed store operation wherever its blocks live.
    pub fn execute(&self, op: StoreOp) -> BoxFuture<'static, PartResult> {
        let fut = self.execute_traced(op);
        async move { fut.await.0 }.boxed()
    }

    /// [`DataPlane::execute`], also returning what each remote part moved
    /// and how long its answer took (for bandwidth measurement).
    pub fn execute_traced(&self, op: StoreOp) -> BoxFuture<'static, (PartResult, Vec<LinkSample>)> {
        self.execute_shared(Arc::new(op), 0)
    }

    /// [`DataPlane::execute_traced`] for an operation the caller keeps too
    /// (a worker remembers its pushes until its later pulls reflect them).
    pub fn execute_arc_traced(
        &self,
        op: Arc<StoreOp>,
    ) -> BoxFuture<'static, (PartResult, Vec<LinkSample>)> {
        self.execute_shared(op, 0)
    }

    fn execute_shared(
        &self,
        op: Arc<StoreOp>,
        attempt: u32,
    ) -> BoxFuture<'static, (PartResult, Vec<LinkSample>)> {
        // Counted in flight from before it is routed: an ownership update
        // applied between routing (by the older table) and sending must
        // still wait for it (see `requests_done_before`).
        let routing = self.inner.inflight.begin();
        let sub = match self.inner.store.submit_ranges(&op) {
            Ok(s) => s,
            Err(e) => {
                return futures::future::ready((
                    Err(RemoteError::fatal(e.to_string())),
                    Vec::new(),
                ))
                .boxed();
            }
        };
        let kind = sub.kind;
        let keys = sub.keys;
        let answer = self.answer_buffer(kind, keys, sub.parts.len());
        let sent = Instant::now();
        let waits = self.forward(&op, sub.parts, answer.as_ref(), &routing);
        let this = self.clone();
        async move {
            let answers = wait_for_parts(waits, sent).await;
            let mut links = Vec::new();
            let mut results = Vec::with_capacity(answers.len());
            for (positions, peer, r, secs, place) in answers {
                let placed = place.as_ref().is_some_and(Placement::placed);
                if let (Some((p, out_bytes)), Ok(resp)) = (peer, &r) {
                    links.push(link_sample(
                        p,
                        out_bytes,
                        resp,
                        place.as_ref(),
                        placed,
                        secs,
                    ));
                }
                let (r, placed) = match this
                    .retry_part(&op, attempt, &positions, r, placed, &mut links)
                    .await
                {
                    Ok(rp) => rp,
                    Err(e) => return (Err(e), links),
                };
                match r {
                    Ok(resp) => match &answer {
                        Some(a) => {
                            if let Err(e) = a.fill(&positions, resp, placed) {
                                return (Err(e), links);
                            }
                        }
                        None => results.push((positions, resp)),
                    },
                    Err(e) => return (Err(named_after(peer, e)), links),
                }
            }
            match answer {
                Some(a) => (Ok(a.finish(keys)), links),
                None => (store::assemble(kind, keys, results), links),
            }
        }
        .boxed()
    }

    /// The buffer a read answered in several parts is put together in,
    /// laid out like the answer; the parts that arrive as tails are read
    /// from the socket straight into it (`protocol::frames`). `None` for
    /// anything else.
    fn answer_buffer(&self, kind: OpKind, keys: usize, parts: usize) -> Option<Answer> {
        if kind == OpKind::Get && parts > 1 {
            self.inner.store.value_len().map(|want| Answer {
                want,
                values: Arc::new(Mutex::new(crate::os::zeroed_vec_for_large(keys * want))),
            })
        } else {
            None
        }
    }

    /// Forwards the parts owned elsewhere now, synchronously, to keep
    /// arrival order (each counted in flight with `routing`); returns what
    /// to wait for, part by part.
    fn forward(
        &self,
        op: &Arc<StoreOp>,
        parts: Vec<store::Part>,
        answer: Option<&Answer>,
        routing: &InflightGuard,
    ) -> Vec<(Vec<usize>, Wait)> {
        let forward_start = crate::os::thread_cpu_secs();
        let mut waits = Vec::with_capacity(parts.len());
        // The operation's values as bytes, shared by the parts sent from
        // where they lie.
        let mut shared: Option<Bytes> = None;
        for part in parts {
            let w: Wait = match part.pending {
                Pending::Ready(r) => Wait::Ready(r),
                Pending::Queued(rx) => Wait::Queued(rx),
                Pending::Forward {
                    to,
                    op: sub,
                    values,
                } => {
                    let values = values.map(|r| {
                        shared
                            .get_or_insert_with(|| Bytes::from_owner(OpValues(Arc::clone(op))))
                            .slice(r.start * 4..r.end * 4)
                    });
                    let out_bytes = match (&values, sub.kind) {
                        (Some(v), _) => v.len() as u64,
                        (None, OpKind::Get) => 0,
                        (None, _) => sub.values.byte_len() as u64,
                    };
                    let place = answer.and_then(|a| a.place(&part.positions));
                    let rx = self.conn(to).request_as(
                        sub.into_request(),
                        values,
                        routing.share(),
                        place.clone(),
                    );
                    Wait::Remote(to, out_bytes, rx, place)
                }
            };
            waits.push((part.positions, w));
        }
        crate::os::add_thread_cpu_since(forward_start, &self.inner.forward_cpu_ns);
        waits
    }

    /// A part's result `r`, or, if it may be sent again (`retry`, or lost
    /// with a peer that has since left the job) and attempts remain, the
    /// result of sending it again after a backoff (then not `placed`).
    /// `Err` only if the data plane shuts down meanwhile.
    async fn retry_part(
        &self,
        op: &StoreOp,
        attempt: u32,
        positions: &[usize],
        mut r: PartResult,
        placed: bool,
        links: &mut Vec<LinkSample>,
    ) -> Result<(PartResult, bool), RemoteError> {
        // Lost with a peer that has since left the job: its
        // outcome no longer matters, send it again.
        if let Err(e) = &r
            && let Some(p) = e.lost_at
            && attempt < MAX_RETRIES
            && self
                .await_departure(p, self.inner.settings.request_timeout)
                .await
        {
            tracing::debug!(peer = %p, "a request lost with a departed peer is sent again");
            r = Err(RemoteError::retry(e.message.clone()));
        }
        let mut placed = placed;
        if let Err(e) = &r
            && e.retry
            && attempt < MAX_RETRIES
        {
            let backoff = Duration::from_micros(200 << attempt.min(12));
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.inner.cancel.cancelled() => {
                    return Err(RemoteError::fatal("the data plane is shutting down"));
                }
            }
            let offs = store::value_offsets(&op.values);
            let retry = Arc::new(store::sub_op(op, positions, &offs));
            let (rr, more) = self.execute_shared(retry, attempt + 1).await;
            links.extend(more);
            r = rr;
            placed = false;
        }
        Ok((r, placed))
    }

    /// Sends a non-keyed request (handover, abort) to a peer and waits.
    pub(super) async fn request(
        &self,
        peer: EvaluatorId,
        req: PeerRequest,
    ) -> Result<PeerResponse, PeerError> {
        self.conn(peer)
            .request(req)
            .await
            .map_or_else(
                |_| {
                    Err(RemoteError::fatal(
                        "the request was dropped without an answer",
                    ))
                },
                |(r, _)| r,
            )
            .map_err(|error| PeerError::Remote { peer, error })
    }

    /// Measures the bandwidth to `peer`: the fastest of `tries` transfers of
    /// `bytes` of incompressible data. Returns seconds per transfer.
    pub async fn probe(&self, peer: EvaluatorId, bytes: u64, tries: u32) -> Result<f64, PeerError> {
        let mut best = f64::INFINITY;
        for _ in 0..tries.max(1) {
            let t0 = Instant::now();
            match self.request(peer, PeerRequest::Probe { bytes }).await? {
                PeerResponse::Blob(b) if b.len() as u64 == bytes => {}
                other => {
                    return Err(PeerError::Connection {
                        peer,
                        message: format!(
                            "bad probe answer ({} bytes)",
                            match &other {
                                PeerResponse::Blob(b) => b.len(),
                                _ => 0,
                            }
                        ),
                    });
                }
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        Ok(best)
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

/// A submitted operation's values as bytes (native `f32`s), for parts of
/// it sent from where they lie ([`store::Store::submit_ranges`]).
struct OpValues(Arc<StoreOp>);

impl AsRef<[u8]> for OpValues {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0.values.data)
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

/// A part's answer as [`DataPlane::execute_shared`] waited for it: its
/// positions, the peer it was forwarded to and the bytes sent with it, the
/// result, the round trip in seconds, and where its values were read to.
type PartAnswer = (
    Vec<usize>,
    Option<(EvaluatorId, u64)>,
    PartResult,
    f64,
    Option<Placement>,
);

/// Waits for every part at once. Each remote answer carries the time it
/// arrived, so its round trip (from `sent`) is right even when this future
/// is polled late (a pull prefetched during a compute).
async fn wait_for_parts(waits: Vec<(Vec<usize>, Wait)>, sent: Instant) -> Vec<PartAnswer> {
    let dropped = || {
        Err(RemoteError::fatal(
            "the request was dropped without an answer",
        ))
    };
    futures::future::join_all(waits.into_iter().map(|(positions, w)| async move {
        match w {
            Wait::Ready(r) => (positions, None, r, 0.0, None),
            Wait::Queued(rx) => (
                positions,
                None,
                rx.await.unwrap_or_else(|_| dropped()),
                0.0,
                None,
            ),
            Wait::Remote(peer, out_bytes, rx, place) => {
                let (r, at) = rx.await.unwrap_or_else(|_| (dropped(), Instant::now()));
                let secs = at.saturating_duration_since(sent).as_secs_f64();
                (positions, Some((peer, out_bytes)), r, secs, place)
            }
        }
    }))
    .await
}

/// The link sample of a part answered by `peer`: the bytes sent
/// (`out_bytes`) and received, and the round trip.
fn link_sample(
    peer: EvaluatorId,
    out_bytes: u64,
    resp: &PeerResponse,
    place: Option<&Placement>,
    placed: bool,
    secs: f64,
) -> LinkSample {
    let in_bytes = match resp {
        PeerResponse::Values(_) if placed => place.map_or(0, |pl| pl.len as u64 * 4),
        PeerResponse::Values(v) => v.byte_len() as u64,
        PeerResponse::Done | PeerResponse::HandoverOutcome { .. } => 0,
        PeerResponse::Blob(b) => b.len() as u64,
    };
    LinkSample {
        peer,
        bytes: out_bytes + in_bytes,
        secs,
    }
}

/// A part's error, naming the peer it was forwarded to, if any.
fn named_after(peer: Option<(EvaluatorId, u64)>, e: RemoteError) -> RemoteError {
    match peer {
        Some((p, _)) => RemoteError {
            retry: e.retry,
            message: format!("evaluator {p}: {}", e.message),
            lost_at: e.lost_at,
        },
        None => e,
    }
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

enum Wait {
    Ready(PartResult),
    /// Queued here until the block lands.
    Queued(oneshot::Receiver<PartResult>),
    /// The peer it was forwarded to, bytes sent with it, the answer, and
    /// where its values are read to if they come as a tail.
    Remote(
        EvaluatorId,
        u64,
        oneshot::Receiver<Arrived>,
        Option<Placement>,
    ),
}

/// A peer's answer and when it arrived.
type Arrived = (PartResult, Instant);

/// The answer to a read of several parts, put together in place: `want`
/// values per key, in the order of the operation's keys.
struct Answer {
    want: usize,
    values: Arc<Mutex<Vec<f32>>>,
}

impl Answer {
    /// Where a part's values go, if its positions are one run (a large
    /// read split into requests; the parts of a read spread over owners
    /// are put in place key by key by [`Answer::fill`]).
    fn place(&self, positions: &[usize]) -> Option<Placement> {
        let first = *positions.first()?;
        let run = positions.iter().enumerate().all(|(i, &p)| p == first + i);
        run.then(|| {
            Placement::new(
                Arc::clone(&self.values),
                first * self.want,
                positions.len() * self.want,
            )
        })
    }

    /// Puts a part's answer in place (`placed`: its values already are).
    fn fill(
        &self,
        positions: &[usize],
        resp: PeerResponse,
        placed: bool,
    ) -> Result<(), RemoteError> {
        let PeerResponse::Values(batch) = resp else {
            return Err(RemoteError::fatal("a read answered without values"));
        };
        if placed {
            // As many values as the part's keys take, in place.
            return Ok(());
        }
        let want = self.want;
        if batch.len() != positions.len() {
            return Err(RemoteError::fatal(format!(
                "a read of {} keys answered {} values",
                positions.len(),
                batch.len()
            )));
        }
        if let Some(&l) = batch.lens.iter().find(|&&l| l as usize != want) {
            return Err(RemoteError::fatal(format!(
                "a read answered a value of length {l}; the table's values have length {want}"
            )));
        }
        if batch.data.len() != positions.len() * want {
            return Err(RemoteError::fatal(
                "a read's values do not add up to their lengths",
            ));
        }
        let mut out = lock(&self.values);
        for (&p, v) in positions.iter().zip(batch.data.chunks_exact(want.max(1))) {
            if let Some(dst) = out.get_mut(p * want..(p + 1) * want) {
                dst.copy_from_slice(v);
            }
        }
        Ok(())
    }

    /// The whole answer, every part filled.
    fn finish(self, keys: usize) -> PeerResponse {
        let data = std::mem::take(&mut *lock(&self.values));
        PeerResponse::Values(ValueBatch {
            lens: vec![self.want as u32; keys],
            data,
        })
    }
}

/// One outbound request connection.
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

pub(super) struct OutConn {
    peer: EvaluatorId,
    tx: mpsc::UnboundedSender<Outgoing>,
    pending: Mutex<HashMap<u64, Unanswered>>,
    inflight: Arc<Inflight>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

impl OutConn {
    /// Queues a request; synchronous, so requests go out in call order.
    fn request(&self, req: PeerRequest) -> oneshot::Receiver<Arrived> {
        self.request_as(req, None, self.inflight.begin(), None)
    }

    /// [`OutConn::request`], with the values of a write held apart (see
    /// [`Outgoing`]) if `values` is set, counted in flight as `guard` (taken
    /// before the request was routed), its answer's values read into
    /// `place` if they come as a tail.
    fn request_as(
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
struct InflightGuard {
    seq: u64,
    of: Arc<Inflight>,
}

impl InflightGuard {
    /// Another guard of the same sequence number: an operation routed once
    /// and sent as several requests counts from when it was routed.
    fn share(&self) -> InflightGuard {
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
    fn begin(self: &Arc<Self>) -> InflightGuard {
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
mod answer_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::BytesMut;
    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;

    use super::values_response_id;
    use crate::peer::{DataPlane, PeerSettings};
    use crate::protocol::frames::encode_tail_frame;
    use crate::protocol::{
        BlockId, EvaluatorId, Faults, FrameCodec, FrameOptions, Key, MODEL_TABLE, OwnershipUpdate,
        PeerResponse, RemoteError, ToClient, ValueBatch,
    };
    use crate::store::{ModelFunctions, OpKind, Store, StoreOp};

    /// Rows of 1024 floats (4 KiB) that do not compress, or zeros that do.
    struct Rows {
        zeros: bool,
    }

    impl ModelFunctions for Rows {
        fn value_len(&self) -> usize {
            1024
        }
        fn init(&self, key: Key) -> Vec<f32> {
            if self.zeros {
                return vec![0.0; 1024];
            }
            (0..1024u64)
                .map(|i| ((key * 7919 + i * 104_729) % 1_000_003) as f32 / 1_000_003.0)
                .collect()
        }
        fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
            for (v, d) in value.iter_mut().zip(delta) {
                *v += d;
            }
        }
    }

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

    /// A read of many parts is answered with every key's value in its
    /// place: parts that are runs of the keys (read into place from the
    /// socket), parts that are not (some keys held here), and answers that
    /// were compressed (put in place by the waiter).
    #[tokio::test]
    async fn a_read_of_many_parts_is_put_together_in_place() {
        for zeros in [false, true] {
            let model = Arc::new(Rows { zeros });
            let cancel = CancellationToken::new();
            let settings = PeerSettings::for_tests(Duration::from_secs(30));
            let (me, server) = (EvaluatorId(1), EvaluatorId(2));
            let mut planes = Vec::new();
            for id in [me, server] {
                let store = Store::new(id);
                store.configure(&[(MODEL_TABLE, 16)], model.clone());
                let at = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let (s, f) = (settings.clone(), Faults::default());
                planes.push(DataPlane::start(id, store, at, s, f, &cancel).unwrap());
            }
            let peers: Vec<_> = planes.iter().map(|p| (p.id(), p.local_addr())).collect();
            for p in &planes {
                p.set_peers(&peers);
            }
            // Block 3 is held here, the others by the server.
            let owners: Vec<_> = BlockId::all(16)
                .map(|b| (MODEL_TABLE, b, if b == BlockId(3) { me } else { server }))
                .collect();
            planes[0]
                .store()
                .create_blocks(MODEL_TABLE, &[BlockId(3)])
                .unwrap();
            let theirs: Vec<BlockId> = BlockId::all(16).filter(|&b| b != BlockId(3)).collect();
            planes[1]
                .store()
                .create_blocks(MODEL_TABLE, &theirs)
                .unwrap();
            for p in &planes {
                p.store().apply_ownership(&OwnershipUpdate {
                    version: 1,
                    owners: owners.clone(),
                });
            }
            // 12 MiB of the server's keys (three requests), then the same
            // with keys held here among them.
            let held_here = |k: Key| crate::store::block_of_key(k, 16) == BlockId(3);
            let remote: Vec<Key> = (0..6000u64).filter(|&k| !held_here(k)).take(3072).collect();
            let mixed: Vec<Key> = (0..3072u64).rev().collect();
            assert!(mixed.iter().any(|&k| held_here(k)));
            for keys in [remote, mixed] {
                let got = planes[0]
                    .execute(StoreOp {
                        kind: OpKind::Get,
                        table: MODEL_TABLE,
                        keys: keys.clone(),
                        values: ValueBatch::default(),
                    })
                    .await
                    .unwrap();
                let PeerResponse::Values(v) = got else {
                    panic!("not values: {got:?}");
                };
                assert_eq!(v.lens, vec![1024; keys.len()]);
                let want: Vec<f32> = keys.iter().flat_map(|&k| model.init(k)).collect();
                assert!(v.data == want, "zeros: {zeros}");
            }
            for p in &planes {
                p.stop().await;
            }
        }
    }
}
