//! The data plane: evaluator ⇄ evaluator connections.
//!
//! This module owns the evaluator's data-plane sockets: the listener, one
//! outbound *request* connection per peer, the inbound request connections,
//! and the *bulk* connections that stream blocks during a move. It executes
//! store operations ([`DataPlane::execute`]): the [`Store`] applies the local
//! parts, and the parts owned elsewhere are written to the owner's request
//! connection *before* `execute` returns, so operations arriving on one
//! connection are forwarded in the order they arrived.
//!
//! # Leaving
//!
//! An evaluator that leaves the job ([`DataPlane::shutdown`]) sends `GoAway`
//! on every inbound request connection and keeps serving until each client
//! answers `GoAwayAck` (after which it sends nothing more on that connection)
//! and every request read before it is answered. So no request that reached it
//! is lost, and none is applied twice.
//!
//! # Failures
//!
//! A request that was never written (the connection could not be opened) fails
//! with a retryable error and is sent again, with backoff, after re-routing.
//! A request written on a connection that then broke fails for good: whether
//! it was applied is unknown, and retrying could apply it twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::emulate::Throttled;
use crate::protocol::{
    self, BlockId, BulkToDest, BulkToSource, EvalToAm, EvaluatorId, Faults, FrameCodec,
    FrameOptions, INPUT_TABLE, LinkSample, PeerRequest, PeerResponse, Purpose, RemoteError,
    STATE_TABLE, Secret, TableId, ToClient, ToOwner,
};
use crate::store::{self, BlockData, OpKind, PartResult, Pending, Store, StoreOp};

/// A data-plane connection (paced when an emulated cluster limits this
/// container's bandwidth in-process).
type Stream = Throttled<TcpStream>;

/// Most times a retryable part is sent again before the error is returned.
const MAX_RETRIES: u32 = 30;
/// Requests read from one connection and not yet answered, at most.
const MAX_IN_FLIGHT: usize = 4096;

/// Errors of the data plane.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A peer is not in the directory.
    #[error("evaluator {0} is not in the peer directory")]
    UnknownPeer(EvaluatorId),
    /// Connecting or the handshake failed.
    #[error("cannot connect to evaluator {peer} at {addr}: {source}")]
    Connect {
        /// The peer.
        peer: EvaluatorId,
        /// Its address.
        addr: SocketAddr,
        /// What failed.
        #[source]
        source: protocol::ProtocolError,
    },
    /// The connection failed during a transfer.
    #[error("connection to evaluator {peer} failed: {message}")]
    Connection {
        /// The peer.
        peer: EvaluatorId,
        /// What failed.
        message: String,
    },
    /// The store refused an operation.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The remote side refused.
    #[error("evaluator {peer}: {error}")]
    Remote {
        /// The peer.
        peer: EvaluatorId,
        /// Its answer.
        error: RemoteError,
    },
}

/// Settings of the data plane.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// This job's id.
    pub job_id: String,
    /// The job secret.
    pub secret: Secret,
    /// Frame options.
    pub frames: FrameOptions,
    /// Timeout to connect and authenticate.
    pub connect_timeout: Duration,
    /// Chunk size for block transfers.
    pub chunk_bytes: usize,
    /// How long [`DataPlane::shutdown`] waits for clients to acknowledge.
    pub drain_timeout: Duration,
}

/// Counters of requests served for other evaluators (server metrics).
#[derive(Debug, Default)]
pub struct ServeCounters {
    requests: AtomicU64,
    /// CPU nanoseconds of the inbound connections' tasks (reading,
    /// decoding, applying, encoding, writing), apart from the runtime's own
    /// parking and waking.
    cpu_ns: Arc<AtomicU64>,
    /// CPU nanoseconds of the inbound connections' polls that decoded no
    /// frame and wrote nothing (woken by part of a frame; see
    /// [`crate::os::CpuTimed::with_progress`]), not in `cpu_ns`.
    idle_cpu_ns: Arc<AtomicU64>,
    busy_ns: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// A snapshot of [`ServeCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServeTotals {
    /// Requests served.
    pub requests: u64,
    /// CPU seconds spent applying them and reading the values.
    pub busy_secs: f64,
    /// CPU seconds of the inbound connections' tasks: all the serving,
    /// framing and system calls included, the runtime's waking between
    /// requests not, nor the polls that found only part of a frame.
    pub cpu_secs: f64,
    /// CPU seconds of the inbound connections' polls that found only part
    /// of a frame and had nothing to write.
    pub idle_cpu_secs: f64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes answered.
    pub bytes_out: u64,
}

/// The data plane of one evaluator. Cheap to clone.
#[derive(Clone)]
pub struct DataPlane {
    inner: Arc<Inner>,
}

struct Inner {
    me: EvaluatorId,
    store: Store,
    settings: PeerSettings,
    directory: Mutex<HashMap<EvaluatorId, SocketAddr>>,
    ever_seen: Mutex<HashSet<EvaluatorId>>,
    conns: Mutex<HashMap<EvaluatorId, Arc<OutConn>>>,
    counters: ServeCounters,
    /// CPU nanoseconds of the outbound request connections' tasks: what
    /// this evaluator's requests cost it besides building them (framing,
    /// writing, reading and decoding the answers).
    request_cpu_ns: Arc<AtomicU64>,
    /// CPU nanoseconds of those connections' polls that completed no
    /// answer and wrote nothing (woken by part of an answer), not in
    /// `request_cpu_ns`.
    request_idle_cpu_ns: Arc<AtomicU64>,
    /// CPU nanoseconds the callers' threads spent handing requests to the
    /// connections (a channel send and a wake-up per server a request goes
    /// to).
    forward_cpu_ns: AtomicU64,
    /// Outbound requests in flight, in issue order (all connections).
    inflight: Arc<Inflight>,
    faults: Faults,
    /// Fault hooks of bulk (move) connections only, on both ends.
    bulk_faults: Faults,
    /// Everything stops.
    cancel: CancellationToken,
    /// Inbound connections say goodbye.
    leaving: CancellationToken,
    tasks: TaskTracker,
    inbound: TaskTracker,
    local_addr: SocketAddr,
}

impl std::fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlane")
            .field("me", &self.inner.me)
            .field("addr", &self.inner.local_addr)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DataPlane {
    /// Starts serving on `listener`. Tasks run until [`DataPlane::shutdown`]
    /// or until `parent` is cancelled.
    pub fn start(
        me: EvaluatorId,
        store: Store,
        listener: TcpListener,
        settings: PeerSettings,
        faults: Faults,
        parent: &CancellationToken,
    ) -> std::io::Result<DataPlane> {
        let local_addr = listener.local_addr()?;
        let dp = DataPlane {
            inner: Arc::new(Inner {
                me,
                store,
                settings,
                directory: Mutex::new(HashMap::new()),
                ever_seen: Mutex::new(HashSet::new()),
                conns: Mutex::new(HashMap::new()),
                counters: ServeCounters::default(),
                request_cpu_ns: Arc::new(AtomicU64::new(0)),
                request_idle_cpu_ns: Arc::new(AtomicU64::new(0)),
                forward_cpu_ns: AtomicU64::new(0),
                inflight: Arc::new(Inflight::default()),
                faults,
                bulk_faults: Faults::default(),
                cancel: parent.child_token(),
                leaving: CancellationToken::new(),
                tasks: TaskTracker::new(),
                inbound: TaskTracker::new(),
                local_addr,
            }),
        };
        let this = dp.clone();
        dp.inner
            .tasks
            .spawn(async move { this.accept_loop(listener).await });
        Ok(dp)
    }

    /// The listening address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Fault hooks of this data plane's bulk (block-move) connections only,
    /// as source and as destination: a test breaks a move with them without
    /// touching request traffic. The hooks given to [`DataPlane::start`]
    /// apply to bulk connections too.
    pub fn bulk_faults(&self) -> &Faults {
        &self.inner.bulk_faults
    }

    fn bulk_broken(&self) -> bool {
        self.inner.faults.is_broken() || self.inner.bulk_faults.is_broken()
    }

    /// The store this data plane serves.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The framing options of this data plane's connections.
    pub fn frame_options(&self) -> crate::protocol::FrameOptions {
        self.inner.settings.frames
    }

    /// CPU seconds this evaluator's outbound request connections have
    /// taken so far (their tasks' polls, on the runtime's thread).
    pub fn request_cpu_secs(&self) -> f64 {
        self.inner.request_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// CPU seconds the outbound request connections have spent so far in
    /// polls that completed no answer and wrote nothing: woken by part of
    /// an answer. Not in [`DataPlane::request_cpu_secs`].
    pub fn request_idle_cpu_secs(&self) -> f64 {
        self.inner.request_idle_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// CPU seconds the callers' threads have spent handing requests to the
    /// outbound connections so far (see [`DataPlane::execute_traced`]).
    pub fn forward_cpu_secs(&self) -> f64 {
        self.inner.forward_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Totals of requests served so far.
    pub fn serve_totals(&self) -> ServeTotals {
        let c = &self.inner.counters;
        ServeTotals {
            requests: c.requests.load(Ordering::Relaxed),
            busy_secs: c.busy_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            cpu_secs: c.cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            idle_cpu_secs: c.idle_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
        }
    }

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
        let mut conns = lock(&self.inner.conns);
        for d in departed {
            if let Some(c) = conns.remove(&d) {
                c.closed.store(true, Ordering::SeqCst);
            }
        }
    }

    /// This evaluator's id.
    pub fn id(&self) -> EvaluatorId {
        self.inner.me
    }

    fn addr_of(&self, peer: EvaluatorId) -> Option<SocketAddr> {
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
        let sub = match self.inner.store.submit(&op) {
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
        let sent = Instant::now();
        // Forward now, synchronously, to keep arrival order.
        let forward_start = crate::os::thread_cpu_secs();
        let mut waits = Vec::with_capacity(sub.parts.len());
        for part in sub.parts {
            let w: Wait = match part.pending {
                Pending::Ready(r) => Wait::Ready(r),
                Pending::Queued(rx) => Wait::Queued(rx),
                Pending::Forward { to, op } => {
                    let out_bytes = if op.kind == OpKind::Get {
                        0
                    } else {
                        op.values.byte_len() as u64
                    };
                    let rx = self.conn(to).request_as(op.into_request(), routing.share());
                    Wait::Remote(to, out_bytes, rx)
                }
            };
            waits.push((part.positions, w));
        }
        crate::os::add_thread_cpu_since(forward_start, &self.inner.forward_cpu_ns);
        let this = self.clone();
        async move {
            // Wait for every part at once. Each remote answer carries the
            // time it arrived, so its round trip is right even when this
            // future is polled late (a pull prefetched during a compute).
            let dropped = || Err(RemoteError::fatal("the request was dropped without an answer"));
            let answers = futures::future::join_all(waits.into_iter().map(|(positions, w)| async move {
                match w {
                    Wait::Ready(r) => (positions, None, r, 0.0),
                    Wait::Queued(rx) => (positions, None, rx.await.unwrap_or_else(|_| dropped()), 0.0),
                    Wait::Remote(peer, out_bytes, rx) => {
                        let (r, at) = rx.await.unwrap_or_else(|_| (dropped(), Instant::now()));
                        let secs = at.saturating_duration_since(sent).as_secs_f64();
                        (positions, Some((peer, out_bytes)), r, secs)
                    }
                }
            }))
            .await;
            let mut links = Vec::new();
            let mut results = Vec::with_capacity(answers.len());
            for (positions, peer, mut r, secs) in answers {
                if let (Some((p, out_bytes)), Ok(resp)) = (peer, &r) {
                    let in_bytes = match resp {
                        PeerResponse::Values(v) => v.byte_len() as u64,
                        PeerResponse::Done | PeerResponse::HandoverOutcome { .. } => 0,
                        PeerResponse::Blob(b) => b.len() as u64,
                    };
                    links.push(LinkSample { peer: p, bytes: out_bytes + in_bytes, secs });
                }
                if let Err(e) = &r
                    && e.retry && attempt < MAX_RETRIES {
                        let backoff = Duration::from_micros(200 << attempt.min(12));
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = this.inner.cancel.cancelled() => {
                                return (Err(RemoteError::fatal("the data plane is shutting down")), links);
                            }
                        }
                        let offs = store::value_offsets(&op.values);
                        let retry = Arc::new(store::sub_op(&op, &positions, &offs));
                        let (rr, more) = this.execute_shared(retry, attempt + 1).await;
                        links.extend(more);
                        r = rr;
                    }
                match r {
                    Ok(resp) => results.push((positions, resp)),
                    Err(e) => {
                        let e = match peer {
                            Some((p, _)) => RemoteError {
                                retry: e.retry,
                                message: format!("evaluator {p}: {}", e.message),
                            },
                            None => e,
                        };
                        return (Err(e), links);
                    }
                }
            }
            (store::assemble(kind, keys, results), links)
        }
        .boxed()
    }

    /// Sends a non-keyed request (handover, abort) to a peer and waits.
    async fn request(
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

    // ------------------------------------------------------------------
    // Moves, source side
    // ------------------------------------------------------------------

    /// Moves `blocks` of `table` to `to`, one block at a time over one bulk
    /// connection. Reports each installed block with [`EvalToAm::BlockMoved`]
    /// on `report`. An input block's worker-local state (if it has any here)
    /// moves with it, first: a destination that owns the input then always
    /// owns its state. On failure the block in flight ends up with exactly
    /// one owner — here, or at `to` if it had landed there before the
    /// connection failed (then it is reported too) — and the error is
    /// returned; blocks already moved stay moved.
    pub async fn move_blocks(
        &self,
        move_id: u64,
        table: TableId,
        blocks: &[BlockId],
        to: EvaluatorId,
        report: &mpsc::Sender<EvalToAm>,
    ) -> Result<u64, PeerError> {
        let addr = self.addr_of(to).ok_or(PeerError::UnknownPeer(to))?;
        let mut bulk: Framed<Stream, FrameCodec<BulkToDest, BulkToSource>> =
            self.open(to, addr, Purpose::Bulk).await?;
        let mut total = 0u64;
        for &block in blocks {
            let mut tables = Vec::with_capacity(2);
            if table == INPUT_TABLE && self.inner.store.is_owned(STATE_TABLE, block) {
                tables.push(STATE_TABLE);
            }
            tables.push(table);
            for t in tables {
                total += self
                    .move_one(&mut bulk, move_id, t, block, to, report)
                    .await?;
            }
        }
        let _ = bulk.close().await;
        Ok(total)
    }

    /// Hands one block over to `to` and streams it (see the module docs).
    /// Reports the block on `report` once `to` owns it, also when the
    /// stream failed after the block had landed (then the error is returned).
    async fn move_one(
        &self,
        bulk: &mut Framed<Stream, FrameCodec<BulkToDest, BulkToSource>>,
        move_id: u64,
        table: TableId,
        block: BlockId,
        to: EvaluatorId,
        report: &mpsc::Sender<EvalToAm>,
    ) -> Result<u64, PeerError> {
        let moved = |bytes: u64| EvalToAm::BlockMoved {
            move_id,
            table,
            block,
            to,
            bytes,
        };
        let handover = PeerRequest::Handover {
            table,
            block,
            move_id,
        };
        if let Err(e) = self.request(to, handover).await {
            // The destination may have taken the handover before the
            // connection failed: let it go (the block never left here).
            let _ = self.call_off(to, table, block).await;
            return Err(e);
        }
        let data = match self.inner.store.take_for_move(table, block, to) {
            Ok(d) => d,
            Err(e) => {
                let _ = self.call_off(to, table, block).await;
                return Err(e.into());
            }
        };
        // Encoding a large block takes milliseconds: off the async threads,
        // so requests on other blocks are served meanwhile.
        let chunk = self.inner.settings.chunk_bytes.max(1);
        let (data, chunks) = tokio::task::spawn_blocking(move || {
            let chunks = data.encode_chunks(chunk);
            (data, chunks)
        })
        .await
        .map_err(|e| PeerError::Connection {
            peer: to,
            message: format!("encoding block {block} failed: {e}"),
        })?;
        let bytes = chunks.iter().map(|c| c.len() as u64).sum();
        match self
            .stream_block(bulk, move_id, table, block, chunks, to)
            .await
        {
            Ok(()) => {
                self.inner.store.finish_move(table, block)?;
                let _ = report.send(moved(bytes)).await;
                Ok(bytes)
            }
            Err(e) => {
                // Whether the block landed is unknown: queue operations on it
                // here and ask the destination, which decides under its
                // block lock.
                self.inner.store.recall(table, block)?;
                match self.call_off(to, table, block).await {
                    Some(true) => {
                        // It landed: the move took place. What queued here
                        // meanwhile goes to the new owner.
                        self.inner.store.abort_incoming(table, block)?;
                        let _ = report.send(moved(bytes)).await;
                    }
                    answer => {
                        if answer.is_none() {
                            tracing::warn!(
                                "evaluator {to} did not answer whether block {block} of table {table} landed; keeping it here"
                            );
                        }
                        self.inner.store.install(table, block, data)?;
                    }
                }
                Err(e)
            }
        }
    }

    /// Asks `to` to call off the handover of a block (idempotent, so it is
    /// sent again if the connection fails). `Some(installed)` is its answer;
    /// `None` if it could not be reached.
    async fn call_off(&self, to: EvaluatorId, table: TableId, block: BlockId) -> Option<bool> {
        let mut backoff = Duration::from_millis(10);
        for _ in 0..8 {
            match self
                .request(to, PeerRequest::AbortHandover { table, block })
                .await
            {
                Ok(PeerResponse::HandoverOutcome { installed }) => return Some(installed),
                Ok(other) => {
                    tracing::warn!("evaluator {to} answered a call-off with {other:?}");
                    return None;
                }
                Err(e) => {
                    tracing::debug!("calling off block {block} of table {table} at {to}: {e}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.inner.cancel.cancelled() => return None,
            }
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
        None
    }

    async fn stream_block(
        &self,
        bulk: &mut Framed<Stream, FrameCodec<BulkToDest, BulkToSource>>,
        move_id: u64,
        table: TableId,
        block: BlockId,
        chunks: Vec<Vec<u8>>,
        to: EvaluatorId,
    ) -> Result<(), PeerError> {
        let bytes = chunks.iter().map(|c| c.len() as u64).sum();
        let conn_err = |e: protocol::ProtocolError| PeerError::Connection {
            peer: to,
            message: e.to_string(),
        };
        bulk.feed(BulkToDest::Begin {
            move_id,
            table,
            block,
            bytes,
        })
        .await
        .map_err(conn_err)?;
        for chunk in chunks {
            if self.bulk_broken() {
                return Err(PeerError::Connection {
                    peer: to,
                    message: "connection broken (injected fault)".into(),
                });
            }
            bulk.send(BulkToDest::Chunk(chunk))
                .await
                .map_err(conn_err)?;
        }
        bulk.send(BulkToDest::End).await.map_err(conn_err)?;
        let answer = tokio::select! {
            a = bulk.next() => a,
            _ = self.inner.cancel.cancelled() => None,
            _ = self.inner.faults.broken() => None,
            _ = self.inner.bulk_faults.broken() => None,
        };
        match answer {
            Some(Ok(BulkToSource::Installed { table: t, block: b }))
                if t == table && b == block =>
            {
                Ok(())
            }
            Some(Ok(BulkToSource::Failed { reason, .. })) => Err(PeerError::Remote {
                peer: to,
                error: RemoteError::fatal(reason),
            }),
            Some(Ok(other)) => Err(PeerError::Connection {
                peer: to,
                message: format!("unexpected answer {other:?}"),
            }),
            Some(Err(e)) => Err(conn_err(e)),
            None => Err(PeerError::Connection {
                peer: to,
                message: "closed before the block was installed".into(),
            }),
        }
    }

    async fn open<Out, In>(
        &self,
        peer: EvaluatorId,
        addr: SocketAddr,
        purpose: Purpose,
    ) -> Result<Framed<Stream, FrameCodec<Out, In>>, PeerError> {
        let s = &self.inner.settings;
        let connect = async {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(Throttled::new(stream))
        };
        let stream = tokio::time::timeout(s.connect_timeout, connect)
            .await
            .map_err(|_| PeerError::Connect {
                peer,
                addr,
                source: protocol::ProtocolError::Handshake("connect timed out".into()),
            })?
            .map_err(|e| PeerError::Connect {
                peer,
                addr,
                source: e.into(),
            })?;
        protocol::auth::connect(
            stream,
            &s.secret,
            &s.job_id,
            &self.inner.me.to_string(),
            purpose,
            s.frames,
            s.connect_timeout,
        )
        .await
        .map_err(|source| PeerError::Connect { peer, addr, source })
    }

    // ------------------------------------------------------------------
    // Outbound request connections
    // ------------------------------------------------------------------

    /// The outbound connection's task: writes what is queued on `rx`,
    /// completes the answers; advances `progress` at each.
    async fn run_outbound(
        &self,
        conn: Arc<OutConn>,
        mut rx: mpsc::UnboundedReceiver<ToOwner>,
        progress: &AtomicU64,
    ) {
        let peer = conn.peer;
        let framed = match self.addr_of(peer) {
            None => Err(PeerError::UnknownPeer(peer)),
            Some(addr) => {
                self.open::<ToOwner, ToClient>(peer, addr, Purpose::Requests)
                    .await
            }
        };
        let framed = match framed {
            Ok(f) => f,
            Err(e) => {
                // Nothing was written: everything queued may be sent again.
                rx.close();
                while rx.try_recv().is_ok() {}
                conn.close_and_fail(&self.inner.conns, RemoteError::retry(e.to_string()));
                return;
            }
        };
        let (mut sink, mut stream) = framed.split();
        let mut said_goodbye = false;
        let reason = loop {
            tokio::select! {
                biased;
                _ = self.inner.cancel.cancelled() => break "the data plane is shutting down".to_string(),
                _ = self.inner.faults.broken() => break "connection broken (injected fault)".to_string(),
                frame = stream.next() => match frame {
                    Some(Ok(ToClient::Response { id, result })) => {
                        progress.fetch_add(1, Ordering::Relaxed);
                        conn.complete(id, result)
                    }
                    Some(Ok(ToClient::GoAway)) => {
                        progress.fetch_add(1, Ordering::Relaxed);
                        // Stop taking requests; flush what is queued, then acknowledge.
                        conn.closed.store(true, Ordering::SeqCst);
                        lock(&self.inner.conns).retain(|_, c| !Arc::ptr_eq(c, &conn));
                        rx.close();
                        let mut ok = true;
                        while let Some(m) = rx.recv().await {
                            if sink.feed(m).await.is_err() {
                                ok = false;
                                break;
                            }
                        }
                        if ok && sink.send(ToOwner::GoAwayAck).await.is_ok() {
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
                    let mut r = sink.feed(m).await;
                    while r.is_ok() {
                        match rx.try_recv() {
                            Ok(m) => r = sink.feed(m).await,
                            Err(_) => break,
                        }
                    }
                    if let Err(e) = r.and(sink.flush().await) {
                        break format!("write failed: {e}");
                    }
                },
            }
        };
        // Requests still queued were never written: they may be sent again.
        rx.close();
        while let Ok(m) = rx.try_recv() {
            if let ToOwner::Request { id, .. } = m {
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
            RemoteError::fatal(format!(
                "connection to evaluator {peer} lost with the request in flight ({reason}); its outcome is unknown"
            )),
        );
    }

    // ------------------------------------------------------------------
    // Inbound
    // ------------------------------------------------------------------

    async fn accept_loop(&self, listener: TcpListener) {
        loop {
            let accepted = tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = self.inner.leaving.cancelled() => return,
                a = listener.accept() => a,
            };
            let (stream, remote) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("data plane accept failed: {e}");
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let this = self.clone();
            let c = &self.inner.counters;
            let progress = Arc::new(AtomicU64::new(0));
            self.inner.inbound.spawn(crate::os::CpuTimed::with_progress(
                {
                    let progress = Arc::clone(&progress);
                    async move { this.serve_connection(stream, remote, &progress).await }
                },
                Arc::clone(&c.cpu_ns),
                progress,
                Arc::clone(&c.idle_cpu_ns),
            ));
        }
    }

    /// An inbound connection's task; advances `progress` at each frame it
    /// decodes and each answer it hands to the writer.
    async fn serve_connection(&self, stream: TcpStream, remote: SocketAddr, progress: &AtomicU64) {
        let s = &self.inner.settings;
        // Both kinds of connection share a handshake; the hello says which.
        let (id, framed) = match protocol::auth::accept::<_, ToClient, ToOwner>(
            Throttled::new(stream),
            &s.secret,
            &s.job_id,
            s.frames,
            s.connect_timeout,
            |id| match id.purpose {
                Purpose::Requests | Purpose::Bulk => Ok(()),
                Purpose::Control => Err("this is a data-plane port, not the AM".into()),
            },
        )
        .await
        {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("data plane: refused connection from {remote}: {e}");
                return;
            }
        };
        let Ok(peer) = id.peer.parse::<EvaluatorId>() else {
            tracing::warn!(
                "data plane: peer {remote} gave a bad evaluator id {:?}",
                id.peer
            );
            return;
        };
        match id.purpose {
            Purpose::Requests => self.serve_requests(peer, framed, progress).await,
            Purpose::Bulk => {
                let framed =
                    framed.map_codec(|c| FrameCodec::<BulkToSource, BulkToDest>::new(c.options()));
                self.serve_bulk(peer, framed, progress).await
            }
            Purpose::Control => {}
        }
    }

    async fn serve_requests(
        &self,
        peer: EvaluatorId,
        framed: Framed<Stream, FrameCodec<ToClient, ToOwner>>,
        progress: &AtomicU64,
    ) {
        let (sink, mut stream) = framed.split();
        let conn_cancel = self.inner.cancel.child_token();
        let (tx, writer) = protocol::spawn_writer(
            crate::os::CpuTimedSink::new(sink, Arc::clone(&self.inner.counters.cpu_ns)),
            1024,
            self.inner.faults.clone(),
            conn_cancel.clone(),
            &self.inner.tasks,
            format!("data plane to evaluator {peer}"),
        );
        let mut in_flight: FuturesUnordered<BoxFuture<'static, (u64, PartResult)>> =
            FuturesUnordered::new();
        let mut sent_goaway = false;
        let mut acked = false;
        loop {
            if acked && in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                _ = conn_cancel.cancelled() => return,
                _ = self.inner.faults.broken() => return,
                Some((id, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    progress.fetch_add(1, Ordering::Relaxed);
                    if let Ok(PeerResponse::Values(v)) = &result {
                        self.inner.counters.bytes_out.fetch_add(v.byte_len() as u64, Ordering::Relaxed);
                    }
                    if tx.send(ToClient::Response { id, result }).await.is_err() {
                        return;
                    }
                }
                _ = self.inner.leaving.cancelled(), if !sent_goaway => {
                    sent_goaway = true;
                    progress.fetch_add(1, Ordering::Relaxed);
                    if tx.send(ToClient::GoAway).await.is_err() {
                        return;
                    }
                }
                frame = stream.next(), if !acked && in_flight.len() < MAX_IN_FLIGHT => match frame {
                    Some(Ok(ToOwner::Request { id, req })) => {
                        progress.fetch_add(1, Ordering::Relaxed);
                        let fut = self.handle_request(peer, req);
                        in_flight.push(async move { (id, fut.await) }.boxed());
                    }
                    Some(Ok(ToOwner::GoAwayAck)) => {
                        progress.fetch_add(1, Ordering::Relaxed);
                        acked = true
                    }
                    Some(Err(e)) => {
                        tracing::warn!("data plane: closing connection from evaluator {peer}: {e}");
                        return;
                    }
                    None => {
                        // The client closed; answer what it asked anyway? It
                        // cannot read the answers, so stop.
                        return;
                    }
                },
            }
        }
        drop(tx);
        // Let the writer flush the last answers before the task ends.
        let _ = writer.await;
    }

    /// Handles one inbound request. The synchronous part (apply, queue or
    /// forward) happens before this returns; the future waits for the answer.
    fn handle_request(
        &self,
        peer: EvaluatorId,
        req: PeerRequest,
    ) -> BoxFuture<'static, PartResult> {
        let c = &self.inner.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        match req {
            PeerRequest::Handover { table, block, .. } => {
                let r = self
                    .inner
                    .store
                    .begin_incoming(table, block, peer)
                    .map(|()| PeerResponse::Done)
                    .map_err(|e| RemoteError::fatal(e.to_string()));
                futures::future::ready(r).boxed()
            }
            PeerRequest::Probe { bytes } => {
                // Random bytes, so compression cannot shortcut the transfer.
                let n = usize::try_from(bytes)
                    .unwrap_or(usize::MAX)
                    .min(self.inner.settings.frames.max_frame / 2);
                let mut blob = vec![0u8; n];
                rand::RngCore::fill_bytes(&mut rand::rng(), &mut blob);
                futures::future::ready(Ok(PeerResponse::Blob(blob))).boxed()
            }
            PeerRequest::AbortHandover { table, block } => {
                let r = self
                    .inner
                    .store
                    .abort_incoming(table, block)
                    .map(|o| PeerResponse::HandoverOutcome {
                        installed: o == store::AbortOutcome::Installed,
                    })
                    .map_err(|e| RemoteError::fatal(e.to_string()));
                futures::future::ready(r).boxed()
            }
            keyed => {
                let Some(op) = StoreOp::from_request(keyed) else {
                    return futures::future::ready(Err(RemoteError::fatal("unsupported request")))
                        .boxed();
                };
                c.bytes_in
                    .fetch_add(op.byte_len() as u64, Ordering::Relaxed);
                // CPU time, not wall time: under a CPU quota a wall clock
                // counts the throttled wait of an operation that hit it.
                let t0 = crate::os::thread_cpu_secs();
                let fut = self.execute(op);
                crate::os::add_thread_cpu_since(t0, &c.busy_ns);
                fut
            }
        }
    }

    async fn serve_bulk(
        &self,
        peer: EvaluatorId,
        framed: Framed<Stream, FrameCodec<BulkToSource, BulkToDest>>,
        progress: &AtomicU64,
    ) {
        let (mut sink, mut stream) = framed.split();
        let mut current: Option<Arriving> = None;
        loop {
            let frame = tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = self.inner.faults.broken() => return,
                _ = self.inner.bulk_faults.broken() => return,
                f = stream.next() => f,
            };
            let frame = match frame {
                Some(Ok(f)) => {
                    progress.fetch_add(1, Ordering::Relaxed);
                    f
                }
                Some(Err(e)) => {
                    tracing::warn!("bulk transfer from evaluator {peer} failed: {e}");
                    return;
                }
                None => return,
            };
            match frame {
                BulkToDest::Begin {
                    table,
                    block,
                    bytes,
                    ..
                } => {
                    current = Some(Arriving {
                        table,
                        block,
                        bytes,
                        got: 0,
                        pieces: Vec::new(),
                    });
                }
                BulkToDest::Chunk(c) => match &mut current {
                    Some(a) if a.got + c.len() as u64 <= a.bytes => {
                        a.got += c.len() as u64;
                        a.pieces.push(c);
                    }
                    _ => {
                        tracing::warn!(
                            "bulk transfer from evaluator {peer}: chunk outside a block or beyond its size"
                        );
                        return;
                    }
                },
                BulkToDest::End => {
                    let Some(Arriving {
                        table,
                        block,
                        pieces,
                        ..
                    }) = current.take()
                    else {
                        tracing::warn!("bulk transfer from evaluator {peer}: end without begin");
                        return;
                    };
                    // Decoding takes milliseconds for a large block: off the
                    // async threads, so requests on other blocks go on.
                    let store = self.inner.store.clone();
                    let installed = tokio::task::spawn_blocking(move || {
                        BlockData::decode_chunks(&pieces)
                            .and_then(|d| store.install(table, block, d))
                    })
                    .await;
                    let answer = match installed {
                        Ok(Ok(())) => BulkToSource::Installed { table, block },
                        Ok(Err(e)) => BulkToSource::Failed {
                            table,
                            block,
                            reason: e.to_string(),
                        },
                        Err(e) => BulkToSource::Failed {
                            table,
                            block,
                            reason: format!("decoding failed: {e}"),
                        },
                    };
                    if sink.send(answer).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Leaves gracefully: says goodbye to every client, serves until each has
    /// acknowledged and every request read is answered (at most the drain
    /// timeout), then stops every task and waits for them.
    pub async fn shutdown(&self) {
        self.inner.leaving.cancel();
        self.inner.inbound.close();
        if tokio::time::timeout(self.inner.settings.drain_timeout, self.inner.inbound.wait())
            .await
            .is_err()
        {
            tracing::warn!("data plane: clients did not acknowledge the goodbye in time");
        }
        self.stop().await;
    }

    /// Stops every task at once (no goodbye) and waits for them.
    pub async fn stop(&self) {
        self.inner.cancel.cancel();
        self.inner.inbound.close();
        self.inner.tasks.close();
        self.inner.inbound.wait().await;
        self.inner.tasks.wait().await;
        for (_, c) in lock(&self.inner.conns).drain() {
            c.fail_all(RemoteError::fatal("the data plane stopped"));
        }
    }
}

/// A block arriving on a bulk connection.
struct Arriving {
    table: TableId,
    block: BlockId,
    /// Bytes announced.
    bytes: u64,
    /// Bytes received so far.
    got: u64,
    /// The pieces, in order.
    pieces: Vec<Vec<u8>>,
}

enum Wait {
    Ready(PartResult),
    /// Queued here until the block lands.
    Queued(oneshot::Receiver<PartResult>),
    /// The peer it was forwarded to, bytes sent with it, the answer.
    Remote(EvaluatorId, u64, oneshot::Receiver<Answer>),
}

/// A peer's answer and when it arrived.
type Answer = (PartResult, Instant);

/// One outbound request connection.
struct OutConn {
    peer: EvaluatorId,
    tx: mpsc::UnboundedSender<ToOwner>,
    pending: Mutex<HashMap<u64, (oneshot::Sender<Answer>, InflightGuard)>>,
    inflight: Arc<Inflight>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

impl OutConn {
    /// Queues a request; synchronous, so requests go out in call order.
    fn request(&self, req: PeerRequest) -> oneshot::Receiver<Answer> {
        self.request_as(req, self.inflight.begin())
    }

    /// [`OutConn::request`], counted in flight as `guard` (taken before the
    /// request was routed).
    fn request_as(&self, req: PeerRequest, guard: InflightGuard) -> oneshot::Receiver<Answer> {
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
        lock(&self.pending).insert(id, (tx, guard));
        if self.tx.send(ToOwner::Request { id, req }).is_err()
            && let Some((tx, _)) = lock(&self.pending).remove(&id)
        {
            let _ = tx.send((
                Err(RemoteError::retry(format!(
                    "connection to evaluator {} is closed",
                    self.peer
                ))),
                Instant::now(),
            ));
        }
        rx
    }

    fn complete(&self, id: u64, result: PartResult) {
        if let Some((tx, _)) = lock(&self.pending).remove(&id) {
            let _ = tx.send((result, Instant::now()));
        }
    }

    fn pending_count(&self) -> usize {
        lock(&self.pending).len()
    }

    fn fail_all(&self, err: RemoteError) {
        let now = Instant::now();
        for (_, (tx, _)) in lock(&self.pending).drain() {
            let _ = tx.send((Err(err.clone()), now));
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
struct Inflight {
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
