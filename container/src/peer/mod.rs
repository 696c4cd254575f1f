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
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the [`DataPlane`] handle, its settings and counters, opening an authenticated connection, stopping |
//! | `requests.rs` | outbound requests: routing a store operation's parts to their owners, waiting for the parts, retries, the peer directory, probes |
//! | `buffers.rs` | the large buffers that pulls of several parts are read into, kept for reuse once their callers give them back ([`DataPlane::recycle`]) |
//! | `outbound.rs` | one ordered outbound request connection per peer: queueing, writing, answers, the request timeout, the goodbye, a lost connection |
//! | `inflight.rs` | in-flight marks: waiting for every request routed before a moment (an ownership update) |
//! | `serve.rs` | inbound connections: accepting, answering requests, the goodbye when leaving |
//! | `block_move.rs` | a block move, the evaluator's side of both ends (the slot changes are [`crate::store`]'s) |
//! | `bulk.rs` | a move's bytes: both ends of a bulk connection, each on a thread of its own at a lower CPU priority |

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::emulate::Throttled;
use crate::protocol::{
    self, EvaluatorId, Faults, FrameCodec, FrameOptions, FrameReader, FrameWriter, Purpose,
    RemoteError, Secret,
};
use crate::store::{self, Store};

mod block_move;
mod buffers;
mod bulk;
mod inflight;
mod outbound;
mod requests;
mod serve;

use buffers::LargeBuffers;
use inflight::Inflight;
use outbound::OutConn;

/// A data-plane connection (paced when an emulated cluster limits this
/// container's bandwidth in-process).
type Stream = Throttled<TcpStream>;

/// A request connection's halves, each paced like the connection: a writer
/// that sends large values from their own vectors and a reader that reads
/// them straight into place (`protocol::frames`).
fn split_requests<Out, In, C>(
    framed: Framed<Stream, C>,
    opts: FrameOptions,
) -> (
    FrameWriter<Throttled<OwnedWriteHalf>, Out>,
    FrameReader<Throttled<OwnedReadHalf>, In>,
) {
    let parts = framed.into_parts();
    let (rd, wr) = parts.io.into_inner().into_split();
    (
        FrameWriter::new(Throttled::new(wr), opts),
        FrameReader::new(Throttled::new(rd), opts, parts.read_buf),
    )
}

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
    /// Longest wait for a peer's answer to a request, or for a moved block
    /// to be installed: past it the connection is given up and what it
    /// carried fails with an error naming the peer and the wait.
    pub request_timeout: Duration,
}

impl PeerSettings {
    /// Settings for tests on loopback: a fresh secret, the default frames,
    /// and the given request timeout.
    #[cfg(test)]
    pub(crate) fn for_tests(request_timeout: Duration) -> PeerSettings {
        PeerSettings {
            job_id: "job_test_0001".into(),
            secret: Secret::generate(),
            frames: FrameOptions::data(&cruise_conf::ChannelConfig::default()),
            connect_timeout: Duration::from_secs(10),
            chunk_bytes: 1 << 20,
            drain_timeout: Duration::from_secs(1),
            request_timeout,
        }
    }
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
    /// Bumped on every new peer directory: a request lost with a peer's
    /// connection waits on it to learn whether the peer has left.
    directory_version: tokio::sync::watch::Sender<u64>,
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
    /// Large answer buffers given back by callers, for the next large pull.
    buffers: LargeBuffers,
    faults: Faults,
    /// Fault hooks of bulk (move) connections only, on both ends.
    bulk_faults: Faults,
    /// Everything stops.
    cancel: CancellationToken,
    /// Inbound connections say goodbye.
    leaving: CancellationToken,
    tasks: TaskTracker,
    inbound: TaskTracker,
    /// Inbound request connections open, by the evaluator at their other
    /// end (`serve.rs`: one from a peer that left the job reads no more).
    inbound_from: tokio::sync::watch::Sender<HashMap<EvaluatorId, usize>>,
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
                directory_version: tokio::sync::watch::Sender::new(0),
                conns: Mutex::new(HashMap::new()),
                counters: ServeCounters::default(),
                request_cpu_ns: Arc::new(AtomicU64::new(0)),
                request_idle_cpu_ns: Arc::new(AtomicU64::new(0)),
                forward_cpu_ns: AtomicU64::new(0),
                inflight: Arc::new(Inflight::default()),
                buffers: LargeBuffers::default(),
                faults,
                bulk_faults: Faults::default(),
                cancel: parent.child_token(),
                leaving: CancellationToken::new(),
                tasks: TaskTracker::new(),
                inbound: TaskTracker::new(),
                inbound_from: tokio::sync::watch::Sender::new(HashMap::new()),
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

    /// This evaluator's id.
    pub fn id(&self) -> EvaluatorId {
        self.inner.me
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
