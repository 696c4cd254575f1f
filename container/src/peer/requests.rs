//! Outbound requests: routing a store operation's parts to their owners,
//! waiting for the parts and putting a read's answer together, retries, the
//! peer directory, and bandwidth probes. Each peer's connection is an
//! [`OutConn`](super::outbound::OutConn) (`outbound.rs`); the in-flight
//! marks are in `inflight.rs`.
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

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::protocol::{
    EvaluatorId, LinkSample, PeerRequest, PeerResponse, Placement, RemoteError, ValueBatch,
};
use crate::store::{self, OpKind, PartResult, Pending, StoreOp};

use super::inflight::InflightGuard;
use super::outbound::Arrived;
use super::{DataPlane, MAX_RETRIES, PeerError, lock};

impl DataPlane {
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
    pub(super) fn departed(&self, peer: EvaluatorId) -> bool {
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
    /// from the socket straight into it (`protocol::frames`). A large one
    /// is a buffer given back earlier ([`DataPlane::recycle`]) when there
    /// is one. `None` for anything else.
    fn answer_buffer(&self, kind: OpKind, keys: usize, parts: usize) -> Option<Answer> {
        if kind == OpKind::Get && parts > 1 {
            self.inner.store.value_len().map(|want| Answer {
                want,
                values: Arc::new(Mutex::new(self.inner.buffers.take(keys * want))),
            })
        } else {
            None
        }
    }

    /// Gives back the values of a pulled answer the caller is done with:
    /// the next large pull is read into them rather than into fresh
    /// pages, which the kernel would have to fault in and clear (see
    /// `peer/buffers.rs`). Only buffers from 32 MiB up are kept, a few
    /// of them; others are freed here.
    pub fn recycle(&self, values: Vec<f32>) {
        self.inner.buffers.give(values);
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
}

/// A submitted operation's values as bytes (native `f32`s), for parts of
/// it sent from where they lie ([`store::Store::submit_ranges`]).
struct OpValues(Arc<StoreOp>);

impl AsRef<[u8]> for OpValues {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0.values.data)
    }
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

/// What a part of an operation waits for.
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

#[cfg(test)]
mod answer_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;

    use crate::peer::{DataPlane, PeerSettings};
    use crate::protocol::{
        BlockId, EvaluatorId, Faults, Key, MODEL_TABLE, OwnershipUpdate, PeerResponse, ValueBatch,
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

    /// Two data planes on loopback that know each other, 16 model blocks
    /// of `model` configured on both (none created): evaluator 1, the
    /// reader, and 2, the server. They run until the token is cancelled.
    async fn two_planes(model: &Arc<Rows>) -> (Vec<DataPlane>, CancellationToken) {
        let cancel = CancellationToken::new();
        let settings = PeerSettings::for_tests(Duration::from_secs(30));
        let mut planes = Vec::new();
        for id in [EvaluatorId(1), EvaluatorId(2)] {
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
        (planes, cancel)
    }

    /// [`two_planes`] with every block created on the server (evaluator
    /// 2) and owned by it in both planes' tables.
    async fn two_planes_server_owns_all(model: &Arc<Rows>) -> (Vec<DataPlane>, CancellationToken) {
        let (planes, cancel) = two_planes(model).await;
        let server = planes[1].id();
        let all: Vec<BlockId> = BlockId::all(16).collect();
        planes[1].store().create_blocks(MODEL_TABLE, &all).unwrap();
        let owners: Vec<_> = all.iter().map(|&b| (MODEL_TABLE, b, server)).collect();
        for p in &planes {
            p.store().apply_ownership(&OwnershipUpdate {
                version: 1,
                owners: owners.clone(),
            });
        }
        (planes, cancel)
    }

    /// The values of `keys` read through `plane`.
    async fn read(plane: &DataPlane, keys: &[Key]) -> ValueBatch {
        let got = plane
            .execute(StoreOp {
                kind: OpKind::Get,
                table: MODEL_TABLE,
                keys: keys.to_vec(),
                values: ValueBatch::default(),
            })
            .await
            .unwrap();
        let PeerResponse::Values(v) = got else {
            panic!("not values: {got:?}");
        };
        v
    }

    /// A read of many parts is answered with every key's value in its
    /// place: parts that are runs of the keys (read into place from the
    /// socket), parts that are not (some keys held here), and answers that
    /// were compressed (put in place by the waiter).
    #[tokio::test]
    async fn a_read_of_many_parts_is_put_together_in_place() {
        for zeros in [false, true] {
            let model = Arc::new(Rows { zeros });
            let (planes, _cancel) = two_planes(&model).await;
            let (me, server) = (planes[0].id(), planes[1].id());
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
                let v = read(&planes[0], &keys).await;
                assert_eq!(v.lens, vec![1024; keys.len()]);
                let want: Vec<f32> = keys.iter().flat_map(|&k| model.init(k)).collect();
                assert!(v.data == want, "zeros: {zeros}");
            }
            for p in &planes {
                p.stop().await;
            }
        }
    }

    /// A large pull's buffer given back is read into by the next large
    /// pull, and that answer is its own: its length, and every value
    /// the new keys' (none left of the earlier, longer answer).
    #[tokio::test]
    async fn a_given_back_buffer_holds_the_next_answer_alone() {
        let model = Arc::new(Rows { zeros: false });
        let (planes, _cancel) = two_planes_server_owns_all(&model).await;
        // 36 MiB, then 33 MiB of other keys: both above the 32 MiB from
        // which buffers are kept.
        let first: Vec<Key> = (0..9216u64).collect();
        let second: Vec<Key> = (20_000..28_448u64).collect();
        let mut given_back = None;
        for keys in [first, second] {
            let v = read(&planes[0], &keys).await;
            if let Some(at) = given_back {
                assert_eq!(v.data.as_ptr(), at, "the buffer given back");
            }
            assert_eq!(v.lens, vec![1024; keys.len()]);
            assert_eq!(v.data.len(), keys.len() * 1024);
            let want: Vec<f32> = keys.iter().flat_map(|&k| model.init(k)).collect();
            assert!(v.data == want);
            given_back = Some(v.data.as_ptr());
            planes[0].recycle(v.data);
        }
        for p in &planes {
            p.stop().await;
        }
    }

    /// Pushes (updates and overwrites) of one or several 4 MiB parts, sent
    /// without waiting for their answers and followed at once by small
    /// pushes and pulls of the same keys from the same caller, are applied
    /// in the order they were sent: each pull reads every push issued
    /// before it and none issued after it, and a small overwrite behind a
    /// large one is the one that stays. The owner reads, applies and
    /// answers one connection's requests in order; a change that applies a
    /// part apart from its connection's task while reading the next must
    /// keep this.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pushes_of_many_parts_are_applied_in_order_with_the_requests_around_them() {
        let model = Arc::new(Rows { zeros: true });
        let (planes, _cancel) = two_planes_server_owns_all(&model).await;
        // 12 MiB of keys: three parts of 4 MiB; the first 1024 keys, one.
        let keys: Vec<Key> = (0..3072u64).collect();
        let (all, one_part, few) = (&keys[..], &keys[..1024], &keys[..4]);
        let mut ops: Vec<(OpKind, &[Key], f32)> = Vec::new();
        for round in 0..4 {
            let r = (round + 1) as f32;
            ops.extend([
                (OpKind::Update, all, r),
                (OpKind::Get, few, 0.0),
                (OpKind::Update, one_part, 0.5),
                (OpKind::Get, few, 0.0),
                (OpKind::Put, one_part, 10.0 * r),
                (OpKind::Put, few, -r),
                (OpKind::Get, all, 0.0),
            ]);
        }
        // Each key's value (all 1024 floats alike) as the ops are issued,
        // and what each pull must read.
        let mut model_now = vec![0.0f32; keys.len()];
        let mut waits = Vec::new();
        let mut expected = Vec::new();
        for (kind, ks, x) in ops {
            let mut values = ValueBatch::default();
            if kind != OpKind::Get {
                for &k in ks {
                    values.push(&[x; 1024]);
                    let v = &mut model_now[k as usize];
                    *v = if kind == OpKind::Put { x } else { *v + x };
                }
            }
            waits.push(planes[0].execute(StoreOp {
                kind,
                table: MODEL_TABLE,
                keys: ks.to_vec(),
                values,
            }));
            expected.push((kind == OpKind::Get).then(|| model_now[..ks.len()].to_vec()));
        }
        let answers = futures::future::join_all(waits).await;
        for (n, (got, want)) in answers.into_iter().zip(expected).enumerate() {
            let got = got.unwrap();
            let Some(want) = want else {
                assert_eq!(got, PeerResponse::Done);
                continue;
            };
            let PeerResponse::Values(v) = got else {
                panic!("not values: {got:?}");
            };
            assert_eq!(v.lens, vec![1024; want.len()]);
            for (i, (row, &w)) in v.data.chunks(1024).zip(&want).enumerate() {
                assert!(
                    row.iter().all(|&x| x == w),
                    "op {n}, key {i}: {} not {w}",
                    row[0]
                );
            }
        }
        for p in &planes {
            p.stop().await;
        }
    }
}
