//! A block move, the data plane's part: streaming a block from its source
//! to its destination over a bulk connection.
//!
//! The life of a move: the AM plans it (`appmaster/src/am/job/reconfigure/moves.rs`)
//! and sends `MoveBlocks` to the source evaluator, which calls
//! [`DataPlane::move_blocks`]. For each block the source hands it over to the
//! destination (a `Handover` request on the ordered request connection, so it
//! follows every operation forwarded before it), takes its data out of the
//! store, streams it in chunks (`Begin`, `Chunk`…, `End`) and waits for
//! `Installed`; the destination's side is `serve_bulk`. The
//! slot changes on both ends, and what happens to operations meanwhile, are
//! described in `store/block_move.rs`. Each installed block is reported
//! to the AM (`BlockMoved`), which publishes the new owner to every member.
//!
//! A failed transfer is called off with the destination (`AbortHandover`),
//! which decides under its block lock whether the block had landed: exactly
//! one of the two owns it afterwards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use crate::protocol::{
    self, BlockId, BulkToDest, BulkToSource, EvalToAm, EvaluatorId, FrameCodec, INPUT_TABLE,
    PeerRequest, PeerResponse, Purpose, RemoteError, STATE_TABLE, TableId,
};
use crate::store::BlockData;

use super::{DataPlane, PeerError, Stream};

impl DataPlane {
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
        // Each write, and the destination's answer, within the request
        // timeout: a destination that stops reading or answering does not
        // hold the move (and the block's queued operations) forever.
        let timeout = self.inner.settings.request_timeout;
        let stalled = |what: &str| PeerError::Connection {
            peer: to,
            message: format!(
                "{what} for {:.1} s (store.request_timeout_ms)",
                timeout.as_secs_f64()
            ),
        };
        let begin = BulkToDest::Begin {
            move_id,
            table,
            block,
            bytes,
        };
        tokio::time::timeout(timeout, bulk.feed(begin))
            .await
            .map_err(|_| stalled("the destination took no data"))?
            .map_err(conn_err)?;
        for chunk in chunks {
            if self.bulk_broken() {
                return Err(PeerError::Connection {
                    peer: to,
                    message: "connection broken (injected fault)".into(),
                });
            }
            tokio::time::timeout(timeout, bulk.send(BulkToDest::Chunk(chunk)))
                .await
                .map_err(|_| stalled("the destination took no data"))?
                .map_err(conn_err)?;
        }
        tokio::time::timeout(timeout, bulk.send(BulkToDest::End))
            .await
            .map_err(|_| stalled("the destination took no data"))?
            .map_err(conn_err)?;
        let answer = tokio::select! {
            a = tokio::time::timeout(timeout, bulk.next()) => match a {
                Ok(a) => a,
                Err(_) => return Err(stalled("no answer after the block was sent")),
            },
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

    pub(super) async fn serve_bulk(
        &self,
        peer: EvaluatorId,
        framed: Framed<Stream, FrameCodec<BulkToSource, BulkToDest>>,
        progress: &AtomicU64,
    ) {
        let (mut sink, mut stream) = framed.split();
        let mut current: Option<Arriving> = None;
        loop {
            let idle = self.inner.settings.request_timeout;
            let frame = tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = self.inner.faults.broken() => return,
                _ = self.inner.bulk_faults.broken() => return,
                f = stream.next() => f,
                // A source that stops sending mid-block (hung, or cut off)
                // would leave the block arriving, and the operations queued
                // on it, waiting for good: call the move off here, as the
                // source would (the block stays the source's).
                _ = tokio::time::sleep(idle), if current.is_some() => {
                    if let Some(a) = current.take() {
                        tracing::warn!(
                            "bulk transfer from evaluator {peer}: nothing for {:.1} s (store.request_timeout_ms) with {} of {} bytes of block {} of table {} received; calling the move off",
                            idle.as_secs_f64(), a.got, a.bytes, a.block, a.table
                        );
                        if let Err(e) = self.inner.store.abort_incoming(a.table, a.block) {
                            tracing::warn!("calling off block {} of table {}: {e}", a.block, a.table);
                        }
                    }
                    return;
                }
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
