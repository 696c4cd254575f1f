//! Serving: accepting connections, answering requests, and leaving.
//!
//! # Leaving
//!
//! An evaluator that leaves the job ([`DataPlane::shutdown`]) sends `GoAway`
//! on every inbound request connection and keeps serving until each client
//! answers `GoAwayAck` (after which it sends nothing more on that connection)
//! and every request read before it is answered. So no request that reached it
//! is lost, and none is applied twice.
//!
//! # A peer that left
//!
//! An inbound request connection whose peer has left the job (a new peer
//! directory without it: the AM let it go, lost or deleted) reads nothing
//! more from it: frames of a dead process still in the socket are
//! dropped, not applied later. [`DataPlane::departed_requests_done`]
//! waits until every such connection has ended (LDA's recount empties the
//! model blocks only then, so no push of a lost worker lands on the
//! emptied counts).
//!

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

use crate::emulate::Throttled;
use crate::protocol::{
    self, EvaluatorId, FrameCodec, PeerRequest, PeerResponse, Purpose, RemoteError, ToClient,
    ToOwner,
};
use crate::store::{self, PartResult, StoreOp};

use super::{DataPlane, MAX_IN_FLIGHT, Stream};

impl DataPlane {
    pub(super) async fn accept_loop(&self, listener: TcpListener) {
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
            Purpose::Bulk => self.serve_bulk(peer, framed).await,
            Purpose::Control => {}
        }
    }

    /// A bulk connection: its blocks are read, installed and answered on a
    /// thread of its own (`bulk.rs`), which this task waits for.
    async fn serve_bulk(
        &self,
        peer: EvaluatorId,
        framed: Framed<Stream, FrameCodec<ToClient, ToOwner>>,
    ) {
        let parts = framed.into_parts();
        let leftover = parts.read_buf;
        let stream = match parts.io.into_inner().into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("bulk transfer from evaluator {peer}: {e}");
                return;
            }
        };
        let this = self.clone();
        let thread = super::bulk::spawn(format!("bulk-from-{peer}"), move || async move {
            match TcpStream::from_std(stream) {
                Ok(s) => {
                    this.bulk_destination(peer, Throttled::new(s), leftover)
                        .await
                }
                Err(e) => tracing::warn!("bulk transfer from evaluator {peer}: {e}"),
            }
        });
        match thread {
            Ok(t) => {
                if let Err(e) = t.join().await {
                    tracing::warn!("bulk transfer from evaluator {peer}: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("bulk transfer from evaluator {peer}: cannot start its thread: {e}")
            }
        }
    }

    async fn serve_requests(
        &self,
        peer: EvaluatorId,
        framed: Framed<Stream, FrameCodec<ToClient, ToOwner>>,
        progress: &AtomicU64,
    ) {
        let (sink, mut stream) =
            super::split_requests::<ToClient, ToOwner, _>(framed, self.inner.settings.frames);
        let conn_cancel = self.inner.cancel.child_token();
        let (tx, writer) = protocol::spawn_writer(
            sink,
            1024,
            self.inner.faults.clone(),
            conn_cancel.clone(),
            &self.inner.tasks,
            format!("data plane to evaluator {peer}"),
            Some(Arc::clone(&self.inner.counters.cpu_ns)),
        );
        let _open = InboundOpen::new(&self.inner.inbound_from, peer);
        let mut directory = self.inner.directory_version.subscribe();
        let mut in_flight: FuturesUnordered<BoxFuture<'static, (u64, PartResult)>> =
            FuturesUnordered::new();
        let mut sent_goaway = false;
        let mut acked = false;
        // Bytes of values (and probes' blobs) handed to the writer since
        // this task last yielded.
        let mut unwritten = 0usize;
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
                    match &result {
                        Ok(PeerResponse::Values(v)) => {
                            self.inner.counters.bytes_out.fetch_add(v.byte_len() as u64, Ordering::Relaxed);
                            unwritten += v.byte_len();
                        }
                        Ok(PeerResponse::Blob(b)) => unwritten += b.len(),
                        _ => {}
                    }
                    if tx.send(ToClient::Response { id, result }).await.is_err() {
                        return;
                    }
                    // Answers are written by the writer task while this one
                    // reads the next request's values out of the store. Woken
                    // by the send, the writer runs only once this task yields
                    // (on a multi-thread runtime it sits in this thread's
                    // LIFO slot, which no other thread takes), and requests
                    // already read do not make it yield: the 16 parts of a
                    // 64 MiB pull were all read out of the store, 10 ms,
                    // before the first byte was written. Yielding once a
                    // megabyte of values is queued lets the writer start on
                    // them and, on a multi-thread runtime, another thread
                    // take this task's next request meanwhile.
                    if unwritten >= protocol::auth::WRITE_BATCH_BYTES {
                        unwritten = 0;
                        tokio::task::yield_now().await;
                    }
                }
                changed = directory.changed() => {
                    if changed.is_err() || self.departed(peer) {
                        tracing::debug!("data plane: evaluator {peer} left the job; its connection reads no more");
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

    /// Waits until no inbound request connection of a peer that has left
    /// the job is open (see the module's doc), at most
    /// `store.request_timeout_ms`; past it, says which are still open.
    pub async fn departed_requests_done(&self) {
        let mut open = self.inner.inbound_from.subscribe();
        let wait = self.inner.settings.request_timeout;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left: Vec<EvaluatorId> = open
                .borrow_and_update()
                .iter()
                .filter(|&(&p, &n)| n > 0 && self.departed(p))
                .map(|(&p, _)| p)
                .collect();
            if left.is_empty() {
                return;
            }
            tokio::select! {
                changed = open.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(
                        "connections of evaluators {left:?}, which left the job, still open after {:.1} s",
                        wait.as_secs_f64()
                    );
                    return;
                }
            }
        }
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
}

/// An inbound request connection counted open while it lives.
struct InboundOpen<'a> {
    open: &'a tokio::sync::watch::Sender<std::collections::HashMap<EvaluatorId, usize>>,
    peer: EvaluatorId,
}

impl<'a> InboundOpen<'a> {
    fn new(
        open: &'a tokio::sync::watch::Sender<std::collections::HashMap<EvaluatorId, usize>>,
        peer: EvaluatorId,
    ) -> Self {
        open.send_modify(|m| *m.entry(peer).or_default() += 1);
        InboundOpen { open, peer }
    }
}

impl Drop for InboundOpen<'_> {
    fn drop(&mut self) {
        self.open.send_modify(|m| {
            if let Some(n) = m.get_mut(&self.peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&self.peer);
                }
            }
        });
    }
}
