//! A block move, the data plane's part: streaming a block from its source
//! to its destination over a bulk connection.
//!
//! The life of a move: the AM plans it (`appmaster/src/am/job/reconfigure/moves.rs`)
//! and sends `MoveBlocks` to the source evaluator, which calls
//! [`DataPlane::move_blocks`]. For each block the source hands it over to the
//! destination (a `Handover` request on the ordered request connection, so it
//! follows every operation forwarded before it), takes its data out of the
//! store, streams it in chunks (`Begin`, `Chunk`…, `End`) and waits for
//! `Installed`; the bytes are `bulk.rs`'s, both ends on threads of their
//! own, the destination's in `bulk_destination`. The
//! slot changes on both ends, and what happens to operations meanwhile, are
//! described in `store/block_move.rs`. Each installed block is reported
//! to the AM (`BlockMoved`), which publishes the new owner to every member.
//!
//! A failed transfer is called off with the destination (`AbortHandover`),
//! which decides under its block lock whether the block had landed: exactly
//! one of the two owns it afterwards.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::protocol::{
    BlockId, EvalToAm, EvaluatorId, INPUT_TABLE, PeerRequest, PeerResponse, STATE_TABLE, TableId,
};
use crate::store::BlockData;

use super::bulk::{self, SendJob};
use super::{DataPlane, PeerError};

/// Blocks of one move in flight at most: one streaming while the one
/// before is installed at the destination.
const MOVE_WINDOW: usize = 2;

/// A block handed over and given to the bulk thread, not answered yet.
struct InFlight {
    move_id: u64,
    table: TableId,
    block: BlockId,
    to: EvaluatorId,
    /// Encoded size.
    bytes: u64,
    /// The data, to put back if the transfer fails.
    data: Arc<BlockData>,
    done: oneshot::Receiver<Result<u64, PeerError>>,
}

impl DataPlane {
    /// Moves `blocks` of `table` to `to` over one bulk connection, whose
    /// bytes a thread of its own streams (`bulk.rs`), the next block while
    /// the destination installs the previous one. Reports each installed
    /// block with [`EvalToAm::BlockMoved`] on `report`. An input block's
    /// worker-local state (if it has any here) moves with it, first, and
    /// the input is handed over only once the state has landed: a
    /// destination that owns the input then always owns its state. On
    /// failure each block in flight ends up with exactly one owner — here,
    /// or at `to` if it had landed there before the connection failed (then
    /// it is reported too) — and the first error is returned; blocks
    /// already moved stay moved.
    pub async fn move_blocks(
        &self,
        move_id: u64,
        table: TableId,
        blocks: &[BlockId],
        to: EvaluatorId,
        report: &mpsc::Sender<EvalToAm>,
    ) -> Result<u64, PeerError> {
        let (thread, jobs_tx) = self.start_bulk_source(to).await?;
        let mut window: VecDeque<InFlight> = VecDeque::new();
        let mut total = 0u64;
        let mut failure: Option<PeerError> = None;
        'blocks: for &block in blocks {
            let tables = self.tables_to_move(table, block);
            let with_state = tables.len() == 2;
            for t in tables {
                while window.len() >= MOVE_WINDOW
                    || (with_state && t == table && !window.is_empty())
                {
                    let Some(f) = window.pop_front() else { break };
                    match self.land(f, report).await {
                        Ok(b) => total += b,
                        Err(e) => {
                            failure = Some(e);
                            break 'blocks;
                        }
                    }
                }
                match self.send_block(move_id, t, block, to, &jobs_tx).await {
                    Ok(f) => window.push_back(f),
                    Err(e) => {
                        failure = Some(e);
                        break 'blocks;
                    }
                }
            }
        }
        while failure.is_none()
            && let Some(f) = window.pop_front()
        {
            match self.land(f, report).await {
                Ok(b) => total += b,
                Err(e) => failure = Some(e),
            }
        }
        // The thread ends once every job is answered, or at once if the
        // connection failed; then every block left has its answer and its
        // data is only here.
        drop(jobs_tx);
        if let Err(e) = thread.join().await {
            tracing::warn!("bulk transfer to evaluator {to}: {e}");
        }
        for f in window {
            match self.land(f, report).await {
                Ok(b) => total += b,
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Starts the bulk thread that streams a move's blocks to `to`
    /// (`bulk.rs`) and waits for it to connect; returns the thread and the
    /// sender of its jobs.
    async fn start_bulk_source(
        &self,
        to: EvaluatorId,
    ) -> Result<(bulk::BulkThread<()>, mpsc::Sender<SendJob>), PeerError> {
        let addr = self.addr_of(to).ok_or(PeerError::UnknownPeer(to))?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let (jobs_tx, jobs_rx) = mpsc::channel::<SendJob>(MOVE_WINDOW);
        let this = self.clone();
        let thread = bulk::spawn(format!("bulk-to-{to}"), move || {
            this.bulk_source(to, addr, ready_tx, jobs_rx)
        })
        .map_err(|e| PeerError::Connection {
            peer: to,
            message: format!("cannot start the bulk transfer's thread: {e}"),
        })?;
        let connected = ready_rx.await.unwrap_or_else(|_| {
            Err(PeerError::Connection {
                peer: to,
                message: "the bulk transfer's thread ended before connecting".into(),
            })
        });
        if let Err(e) = connected {
            let _ = thread.join().await;
            return Err(e);
        }
        Ok((thread, jobs_tx))
    }

    /// The tables whose `block` moves with one of `table`: an input
    /// block's worker-local state first, if it has any here.
    fn tables_to_move(&self, table: TableId, block: BlockId) -> Vec<TableId> {
        let mut tables = Vec::with_capacity(2);
        if table == INPUT_TABLE && self.inner.store.is_owned(STATE_TABLE, block) {
            tables.push(STATE_TABLE);
        }
        tables.push(table);
        tables
    }

    /// Hands one block over to `to` and gives it to the bulk thread
    /// (`jobs`); returns it in flight.
    async fn send_block(
        &self,
        move_id: u64,
        table: TableId,
        block: BlockId,
        to: EvaluatorId,
        jobs: &mpsc::Sender<SendJob>,
    ) -> Result<InFlight, PeerError> {
        let data = Arc::new(self.hand_over(move_id, table, block, to).await?);
        let (done_tx, done_rx) = oneshot::channel();
        // A thread that has ended drops the job unanswered: the
        // block is then put back like any whose transfer failed.
        let _ = jobs
            .send(SendJob {
                move_id,
                table,
                block,
                data: Arc::clone(&data),
                done: done_tx,
            })
            .await;
        Ok(InFlight {
            move_id,
            table,
            block,
            to,
            bytes: data.encoded_len() as u64,
            data,
            done: done_rx,
        })
    }

    /// Hands one block over to `to` (see the module docs) and takes its
    /// data out of the store; on failure the block stays here.
    async fn hand_over(
        &self,
        move_id: u64,
        table: TableId,
        block: BlockId,
        to: EvaluatorId,
    ) -> Result<BlockData, PeerError> {
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
        match self.inner.store.take_for_move(table, block, to) {
            Ok(d) => Ok(d),
            Err(e) => {
                let _ = self.call_off(to, table, block).await;
                Err(e.into())
            }
        }
    }

    /// Waits for a block's transfer. Installed: the move of the block is
    /// finished and reported. Failed: whether it landed is unknown, so
    /// operations on it are queued here again and the destination is asked,
    /// which decides under its block lock; the block stays where it landed
    /// (reported if there) and the error is returned.
    async fn land(&self, f: InFlight, report: &mpsc::Sender<EvalToAm>) -> Result<u64, PeerError> {
        let InFlight {
            move_id,
            table,
            block,
            to,
            bytes,
            data,
            done,
        } = f;
        let moved = |bytes: u64| EvalToAm::BlockMoved {
            move_id,
            table,
            block,
            to,
            bytes,
        };
        let answer = done.await.unwrap_or_else(|_| {
            Err(PeerError::Connection {
                peer: to,
                message: "the bulk transfer's thread ended without an answer".into(),
            })
        });
        let e = match answer {
            Ok(sent) => {
                self.inner.store.finish_move(table, block)?;
                let _ = report.send(moved(sent)).await;
                return Ok(sent);
            }
            Err(e) => e,
        };
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
                // The thread has let go of it (it drops its reference
                // before answering); a copy otherwise.
                let data = Arc::try_unwrap(data).unwrap_or_else(|d| (*d).clone());
                self.inner.store.install(table, block, data)?;
            }
        }
        Err(e)
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use futures::{SinkExt, StreamExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_util::codec::Framed;
    use tokio_util::sync::CancellationToken;

    use crate::emulate::Throttled;
    use crate::peer::{DataPlane, PeerSettings};
    use crate::protocol::{
        self, BlockId, BulkToDest, BulkToSource, EvaluatorId, Faults, FrameCodec, MODEL_TABLE,
        OwnershipUpdate, PeerRequest, PeerResponse, Purpose, ToClient, ToOwner,
    };
    use crate::store::{SlotKind, Store, SumModel};

    /// A connection as evaluator `source` opens one to `addr`.
    async fn source_connection<Out, In>(
        addr: std::net::SocketAddr,
        s: &PeerSettings,
        source: EvaluatorId,
        purpose: Purpose,
    ) -> Framed<Throttled<TcpStream>, FrameCodec<Out, In>> {
        let stream = Throttled::new(TcpStream::connect(addr).await.unwrap());
        protocol::auth::connect(
            stream,
            &s.secret,
            &s.job_id,
            &source.to_string(),
            purpose,
            s.frames,
            s.connect_timeout,
        )
        .await
        .unwrap()
    }

    /// A source that hands a block over, sends part of it and goes silent
    /// (hung, or cut off) does not leave it arriving for good: after the
    /// request timeout the destination calls the move off, so operations
    /// on the block stop queueing behind data that will not come.
    #[tokio::test]
    async fn a_source_that_goes_silent_mid_block_has_its_move_called_off() {
        let settings = PeerSettings::for_tests(Duration::from_millis(300));
        let (dest, source) = (EvaluatorId(1), EvaluatorId(2));
        let store = Store::new(dest);
        store.configure(&[(MODEL_TABLE, 2)], Arc::new(SumModel));
        store.apply_ownership(&OwnershipUpdate {
            version: 1,
            owners: vec![
                (MODEL_TABLE, BlockId(0), source),
                (MODEL_TABLE, BlockId(1), source),
            ],
        });
        let cancel = CancellationToken::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dp = DataPlane::start(
            dest,
            store.clone(),
            listener,
            settings.clone(),
            Faults::default(),
            &cancel,
        )
        .unwrap();
        // The handover, on the ordered request connection.
        let mut requests: Framed<_, FrameCodec<ToOwner, ToClient>> =
            source_connection(dp.local_addr(), &settings, source, Purpose::Requests).await;
        let handover = PeerRequest::Handover {
            table: MODEL_TABLE,
            block: BlockId(0),
            move_id: 7,
        };
        requests
            .send(ToOwner::Request {
                id: 1,
                req: handover,
            })
            .await
            .unwrap();
        match requests.next().await {
            Some(Ok(ToClient::Response { id: 1, result })) => {
                assert!(matches!(result, Ok(PeerResponse::Done)), "{result:?}")
            }
            other => panic!("no answer to the handover: {other:?}"),
        }
        assert_eq!(
            store.slot_kind(MODEL_TABLE, BlockId(0)).unwrap(),
            SlotKind::Incoming
        );

        // A piece of the block, then silence.
        let mut bulk: Framed<_, FrameCodec<BulkToDest, BulkToSource>> =
            source_connection(dp.local_addr(), &settings, source, Purpose::Bulk).await;
        bulk.send(BulkToDest::Begin {
            move_id: 7,
            table: MODEL_TABLE,
            block: BlockId(0),
            bytes: 1000,
        })
        .await
        .unwrap();
        bulk.send(BulkToDest::Chunk(vec![0; 10])).await.unwrap();

        let deadline = Instant::now() + Duration::from_secs(60);
        while store.slot_kind(MODEL_TABLE, BlockId(0)).unwrap() == SlotKind::Incoming {
            assert!(Instant::now() < deadline, "the block is still arriving");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Called off: the destination does not hold it, and says so to
        // the source's call-off as the protocol has it.
        assert_ne!(
            store.slot_kind(MODEL_TABLE, BlockId(0)).unwrap(),
            SlotKind::Owned
        );
        assert!(matches!(
            store.abort_incoming(MODEL_TABLE, BlockId(0)),
            Ok(crate::store::AbortOutcome::Aborted)
        ));
        // The bulk connection was given up.
        assert!(matches!(bulk.next().await, None | Some(Err(_))));
        dp.stop().await;
    }
}
