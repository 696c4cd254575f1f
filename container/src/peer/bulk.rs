//! The bytes of block moves: both ends of a bulk connection, each on a
//! thread of its own.
//!
//! A move streams blocks of tens or hundreds of megabytes; requests (pulls,
//! pushes, gets of other blocks) are small and wait on each other's
//! answers. So that a move never makes them wait:
//!
//! - **A thread per bulk connection**, with a current-thread runtime of its
//!   own, at a lower CPU priority (nice `+BULK_NICE`): the evaluator's
//!   runtime thread, which serves requests and the control channel, runs
//!   none of a move's framing, copying or decoding; when the cores are
//!   short the kernel lets the requests' threads run first, and when they
//!   are not the move has them all.
//! - **Short system calls, long slices.** A thread woken by a request
//!   preempts a bulk thread only when the bulk thread leaves the kernel (a
//!   kernel without forced preemption finishes a system call first), so no
//!   read or write of a move passes more than [`BULK_IO_BYTES`]: tens of
//!   microseconds of copying on loopback. And a bulk thread asks for a
//!   scheduler slice of [`BULK_SLICE_NS`], longer than the default: Linux
//!   (6.12 and later, EEVDF) lets a woken thread whose slice is shorter
//!   than the running one's preempt it at once rather than wait for the end
//!   of its slice. The source's thread streams the blocks
//!   handed to it ([`SendJob`]) and completes each with the destination's
//!   answer; the evaluator's side of a move (handover, ownership, reports)
//!   stays in `block_move.rs`.
//! - **No copy of the data in user space on either end.** The source
//!   writes each chunk's frame header and then the block's arrays from
//!   where they lie ([`BlockData::encoded`]), with vectored writes; the
//!   destination reads each chunk's payload from the socket straight into
//!   the arrays being rebuilt ([`BlockDecoder`]). The frames are the
//!   codec's (`protocol::codec`): a reader using [`FrameCodec`] sees
//!   ordinary `BulkToDest::Chunk` messages.
//! - **Compression where it pays**, decided once per block from a sample
//!   of its middle (`channel.compression`), as the codec does per frame;
//!   compressed chunks go through the codec.
//! - **Pipelined**: the source streams the next block while the destination
//!   installs the previous one (`block_move.rs` keeps two in flight).

use std::borrow::Cow;
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{Encoder, FramedRead};
use tokio_util::sync::CancellationToken;

use crate::emulate::Throttled;
use crate::protocol::codec::{COMPRESSION_SAMPLE, bytes_frame_header, compresses, decode_frame};
use crate::protocol::{
    BlockId, BulkToDest, BulkToSource, EvaluatorId, FrameCodec, FrameOptions, Purpose, RemoteError,
    TableId,
};
use crate::store::{BlockData, BlockDecoder};

use super::{DataPlane, PeerError, lock};

/// How much lower a bulk thread's CPU priority is than the process's
/// (`nice` steps; the kernel gives a thread at +10 about a tenth of a
/// contended core against one at 0, and all of an idle one).
pub(super) const BULK_NICE: i32 = 10;

/// Most bytes one read or write of a bulk connection moves (see the
/// module docs).
pub(super) const BULK_IO_BYTES: usize = 256 << 10;

/// The scheduler slice a bulk thread asks for, in nanoseconds (the
/// default is 0.75 ms times 1 + log2 of the cores, at most 8).
const BULK_SLICE_NS: u64 = 20_000_000;

/// `BulkToDest::Chunk`'s variant number on the wire (checked by a test
/// against the codec's own encoding).
const CHUNK_VARIANT: u32 = 1;

/// Length and flags in front of every frame.
const FRAME_HEADER: usize = 5;

/// A thread running one end of a bulk connection; [`BulkThread::join`]
/// waits for its result and for the thread to end.
pub(super) struct BulkThread<T> {
    result: oneshot::Receiver<Result<T, String>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Starts `work` on a thread of its own (named `name`), in a current-thread
/// runtime, at the bulk priority.
pub(super) fn spawn<T, F, Fut>(name: String, work: F) -> std::io::Result<BulkThread<T>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let handle = std::thread::Builder::new().name(name).spawn(move || {
        lower_priority();
        let out = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => Ok(rt.block_on(work())),
            Err(e) => Err(format!("cannot start a runtime for a bulk transfer: {e}")),
        };
        let _ = tx.send(out);
    })?;
    Ok(BulkThread {
        result: rx,
        handle: Some(handle),
    })
}

impl<T> BulkThread<T> {
    /// The thread's result, once it has ended.
    pub(super) async fn join(mut self) -> Result<T, String> {
        let out = (&mut self.result).await;
        if let Some(h) = self.handle.take() {
            // It has answered (or unwound): it is ending.
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        out.unwrap_or_else(|_| Err("the bulk transfer's thread panicked".into()))
    }
}

/// Lowers the calling thread's CPU priority to the bulk priority, with the
/// bulk slice where the kernel takes one (best effort: a failure leaves it
/// as it was, or at the bulk priority with the default slice).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let attr = libc::sched_attr {
            size: std::mem::size_of::<libc::sched_attr>() as u32,
            sched_policy: libc::SCHED_OTHER as u32,
            sched_flags: 0,
            sched_nice: BULK_NICE,
            sched_priority: 0,
            sched_runtime: BULK_SLICE_NS,
            sched_deadline: 0,
            sched_period: 0,
        };
        // SAFETY: gettid takes nothing; sched_setattr reads `attr` (of the
        // size it says) for the calling thread (pid 0) and keeps no
        // pointer; setpriority takes no pointers, and on Linux
        // PRIO_PROCESS with a thread id changes that thread only.
        unsafe {
            if libc::syscall(
                libc::SYS_sched_setattr,
                0,
                &attr as *const libc::sched_attr,
                0,
            ) != 0
            {
                let tid = libc::gettid();
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BULK_NICE);
            }
        }
    }
}

/// A block for the source's bulk thread to stream.
pub(super) struct SendJob {
    /// The move.
    pub move_id: u64,
    /// The table.
    pub table: TableId,
    /// The block.
    pub block: BlockId,
    /// Its data (the evaluator's side keeps a reference, to put it back if
    /// the transfer fails; the thread drops its own before answering).
    pub data: Arc<BlockData>,
    /// Completed with the bytes streamed once the destination has installed
    /// the block, or with why not.
    pub done: oneshot::Sender<Result<u64, PeerError>>,
}

/// A block streamed (or being streamed) and not answered yet.
struct Expected {
    table: TableId,
    block: BlockId,
    bytes: u64,
    /// Fires when the block's last frame is written (dropped: the write
    /// failed).
    written: oneshot::Receiver<()>,
    done: oneshot::Sender<Result<u64, PeerError>>,
}

/// The destination's answers on a source's bulk connection.
type Answers = FramedRead<ReadHalf<super::Stream>, FrameCodec<BulkToDest, BulkToSource>>;

/// What the two halves of a source's bulk connection share: a token
/// cancelled once either gives up, and why the writing half failed.
struct SourceLink {
    to: EvaluatorId,
    failed: CancellationToken,
    failure: Mutex<Option<String>>,
}

impl SourceLink {
    fn conn_err(&self, message: String) -> PeerError {
        PeerError::Connection {
            peer: self.to,
            message,
        }
    }

    /// Why the connection failed, for a block left unanswered by it.
    fn failed_with(&self) -> String {
        lock(&self.failure)
            .clone()
            .unwrap_or_else(|| "the bulk connection failed".into())
    }
}

/// Why reading a bulk connection stopped.
enum Stop {
    /// Cancelled, broken by a fault hook, or closed by the other side.
    Quit,
    /// Nothing arrived for the request timeout in the middle of a block.
    Idle,
    /// The socket or a frame failed.
    Failed(String),
}

impl DataPlane {
    /// The source's end (on its bulk thread): connects to `to` and says so
    /// on `ready`, then streams each job's block in order and completes it
    /// with the destination's answer. Ends when the jobs end (every block
    /// answered) or the connection fails (every block not answered fails).
    pub(super) async fn bulk_source(
        self,
        to: EvaluatorId,
        addr: SocketAddr,
        ready: oneshot::Sender<Result<(), PeerError>>,
        mut jobs: mpsc::Receiver<SendJob>,
    ) {
        let framed = match self
            .open::<BulkToDest, BulkToSource>(to, addr, Purpose::Bulk)
            .await
        {
            Ok(f) => {
                let _ = ready.send(Ok(()));
                f
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let parts = framed.into_parts();
        let opts = parts.codec.options();
        let (rd, mut wr) = tokio::io::split(parts.io);
        let mut answers = FramedRead::new(rd, parts.codec);
        answers.read_buffer_mut().extend_from_slice(&parts.read_buf);
        let (expect_tx, expect_rx) = mpsc::unbounded_channel::<Expected>();
        let link = SourceLink {
            to,
            failed: CancellationToken::new(),
            failure: Mutex::new(None),
        };
        tokio::join!(
            self.write_jobs(&mut jobs, expect_tx, &mut wr, &opts, &link),
            self.read_answers(expect_rx, &mut answers, &link),
        );
        let _ = wr.shutdown().await;
    }

    /// The source's writing half: streams each job's block in order and
    /// tells the reading half to expect its answer (`expect`). Ends when
    /// the jobs end or the connection fails (a failed write is recorded in
    /// `link`).
    async fn write_jobs<W: AsyncWrite + Unpin>(
        &self,
        jobs: &mut mpsc::Receiver<SendJob>,
        expect: mpsc::UnboundedSender<Expected>,
        wr: &mut W,
        opts: &FrameOptions,
        link: &SourceLink,
    ) {
        loop {
            let job = tokio::select! {
                j = jobs.recv() => j,
                _ = link.failed.cancelled() => None,
            };
            let Some(SendJob {
                move_id,
                table,
                block,
                data,
                done,
            }) = job
            else {
                break;
            };
            let pieces = data.encoded();
            let bytes: u64 = pieces.iter().map(|p| p.len() as u64).sum();
            let (written_tx, written) = oneshot::channel();
            let _ = expect.send(Expected {
                table,
                block,
                bytes,
                written,
                done,
            });
            let r = self
                .write_block(wr, opts, move_id, table, block, &pieces, bytes)
                .await;
            drop(pieces);
            drop(data);
            match r {
                Ok(()) => {
                    let _ = written_tx.send(());
                }
                Err(message) => {
                    *lock(&link.failure) = Some(message);
                    link.failed.cancel();
                    break;
                }
            }
        }
    }

    /// The source's reading half: completes each block written with the
    /// destination's answer, in order. Once the connection has failed,
    /// every block left fails with it.
    async fn read_answers(
        &self,
        mut expect: mpsc::UnboundedReceiver<Expected>,
        answers: &mut Answers,
        link: &SourceLink,
    ) {
        let mut broken: Option<String> = None;
        while let Some(e) = expect.recv().await {
            if let Some(m) = &broken {
                let _ = e.done.send(Err(link.conn_err(m.clone())));
                continue;
            }
            let written = tokio::select! {
                w = e.written => w.is_ok(),
                _ = link.failed.cancelled() => false,
            };
            let answer = if !written {
                Err(link.conn_err(link.failed_with()))
            } else {
                self.answer_to(e.table, e.block, e.bytes, answers, link)
                    .await
            };
            if let Err(PeerError::Connection { message, .. }) = &answer {
                // Nothing more will be answered: stop the writer too.
                broken = Some(message.clone());
                link.failed.cancel();
            }
            let _ = e.done.send(answer);
        }
    }

    /// Waits for the destination's answer to a block written (`bytes`
    /// streamed). A refused block fails alone; anything else but its
    /// `Installed` fails the connection.
    async fn answer_to(
        &self,
        table: TableId,
        block: BlockId,
        bytes: u64,
        answers: &mut Answers,
        link: &SourceLink,
    ) -> Result<u64, PeerError> {
        let timeout = self.inner.settings.request_timeout;
        let conn_err = |message: String| link.conn_err(message);
        tokio::select! {
            biased;
            _ = link.failed.cancelled() => Err(conn_err(link.failed_with())),
            _ = self.inner.cancel.cancelled() => Err(conn_err("the data plane is shutting down".into())),
            _ = self.inner.faults.broken() => Err(conn_err("connection broken (injected fault)".into())),
            _ = self.inner.bulk_faults.broken() => Err(conn_err("connection broken (injected fault)".into())),
            a = tokio::time::timeout(timeout, answers.next()) => match a {
                Err(_) => Err(conn_err(format!(
                    "no answer after the block was sent for {:.1} s (store.request_timeout_ms)",
                    timeout.as_secs_f64()
                ))),
                Ok(None) => Err(conn_err("closed before the block was installed".into())),
                Ok(Some(Err(err))) => Err(conn_err(err.to_string())),
                Ok(Some(Ok(BulkToSource::Installed { table: t, block: b })))
                    if t == table && b == block => Ok(bytes),
                // The block was refused; the connection is fine.
                Ok(Some(Ok(BulkToSource::Failed { reason, .. }))) => Err(PeerError::Remote {
                    peer: link.to,
                    error: RemoteError::fatal(reason),
                }),
                Ok(Some(Ok(other))) => Err(conn_err(format!("unexpected answer {other:?}"))),
            },
        }
    }

    /// Writes one block: `Begin`, its chunks, `End`. Each write within the
    /// request timeout, so a destination that stops reading does not hold
    /// the move (and the block's queued operations) forever.
    #[allow(clippy::too_many_arguments)]
    async fn write_block<W: AsyncWrite + Unpin>(
        &self,
        wr: &mut W,
        opts: &FrameOptions,
        move_id: u64,
        table: TableId,
        block: BlockId,
        pieces: &[Cow<'_, [u8]>],
        bytes: u64,
    ) -> Result<(), String> {
        let timeout = self.inner.settings.request_timeout;
        let stalled = || {
            format!(
                "the destination took no data for {:.1} s (store.request_timeout_ms)",
                timeout.as_secs_f64()
            )
        };
        let mut codec = FrameCodec::<BulkToDest, BulkToSource>::new(*opts);
        let mut frame = BytesMut::new();
        codec
            .encode(
                BulkToDest::Begin {
                    move_id,
                    table,
                    block,
                    bytes,
                },
                &mut frame,
            )
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(timeout, wr.write_all(&frame))
            .await
            .map_err(|_| stalled())?
            .map_err(|e| e.to_string())?;
        let total = usize::try_from(bytes).map_err(|_| "block too large".to_string())?;
        let chunk = self.inner.settings.chunk_bytes.max(1);
        let compress = {
            let from = (total / 2).saturating_sub(COMPRESSION_SAMPLE / 2);
            let to = (from + COMPRESSION_SAMPLE).min(total);
            let sample = range(pieces, from, to).concat();
            compresses(opts, &sample, chunk.min(total))
        };
        let mut at = 0;
        while at < total {
            if self.bulk_broken() {
                return Err("connection broken (injected fault)".into());
            }
            let end = (at + chunk).min(total);
            let parts = range(pieces, at, end);
            let write = async {
                if compress {
                    frame.clear();
                    codec
                        .encode(BulkToDest::Chunk(parts.concat()), &mut frame)
                        .map_err(|e| e.to_string())?;
                    let mut slices = [IoSlice::new(&frame)];
                    write_all_vectored(wr, &mut slices)
                        .await
                        .map_err(|e| e.to_string())
                } else {
                    let header = bytes_frame_header(opts, CHUNK_VARIANT, end - at)
                        .map_err(|e| e.to_string())?;
                    let mut slices: Vec<IoSlice<'_>> = std::iter::once(&header[..])
                        .chain(parts.iter().copied())
                        .map(IoSlice::new)
                        .collect();
                    write_all_vectored(wr, &mut slices)
                        .await
                        .map_err(|e| e.to_string())
                }
            };
            tokio::time::timeout(timeout, write)
                .await
                .map_err(|_| stalled())??;
            at = end;
        }
        frame.clear();
        codec
            .encode(BulkToDest::End, &mut frame)
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(timeout, async {
            wr.write_all(&frame).await?;
            wr.flush().await
        })
        .await
        .map_err(|_| stalled())?
        .map_err(|e| e.to_string())
    }

    /// The destination's end (on its bulk thread): reads blocks, installs
    /// each and answers. `leftover` is what the handshake's reader had
    /// already taken off the socket.
    pub(super) async fn bulk_destination(
        &self,
        peer: EvaluatorId,
        io: Throttled<TcpStream>,
        leftover: BytesMut,
    ) {
        let opts = self.inner.settings.frames;
        let idle = self.inner.settings.request_timeout;
        let (rd, mut wr) = tokio::io::split(io);
        let mut rd = BufReader::with_capacity(64 << 10, std::io::Cursor::new(leftover).chain(rd));
        let mut codec = FrameCodec::<BulkToSource, BulkToDest>::new(opts);
        let mut current: Option<(TableId, BlockId, BlockDecoder)> = None;
        let stop = loop {
            match self
                .bulk_frame(&mut rd, &opts, &mut current, idle, &mut codec, &mut wr)
                .await
            {
                Ok(()) => {}
                Err(s) => break s,
            }
        };
        match stop {
            Stop::Quit => {}
            Stop::Failed(m) => tracing::warn!("bulk transfer from evaluator {peer} failed: {m}"),
            Stop::Idle => {
                // A source that stops sending mid-block (hung, or cut off)
                // would leave the block arriving, and the operations queued
                // on it, waiting for good: call the move off here, as the
                // source would (the block stays the source's).
                if let Some((table, block, d)) = current.take() {
                    tracing::warn!(
                        "bulk transfer from evaluator {peer}: nothing for {:.1} s (store.request_timeout_ms) with {} bytes of block {block} of table {table} still to come; calling the move off",
                        idle.as_secs_f64(),
                        d.remaining()
                    );
                    if let Err(e) = self.inner.store.abort_incoming(table, block) {
                        tracing::warn!("calling off block {block} of table {table}: {e}");
                    }
                }
            }
        }
    }

    /// Reads and acts on one frame of a bulk connection.
    #[allow(clippy::too_many_arguments)]
    async fn bulk_frame<R, W>(
        &self,
        rd: &mut R,
        opts: &FrameOptions,
        current: &mut Option<(TableId, BlockId, BlockDecoder)>,
        idle: Duration,
        codec: &mut FrameCodec<BulkToSource, BulkToDest>,
        wr: &mut W,
    ) -> Result<(), Stop>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        // The idle deadline holds only in the middle of a block.
        let idle = current.as_ref().map(|_| idle);
        let mut head = [0u8; FRAME_HEADER];
        self.read_exact(rd, &mut head, idle).await?;
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let flags = head[4];
        if len > opts.max_frame {
            return Err(Stop::Failed(format!(
                "frame of {len} bytes exceeds the maximum of {} bytes",
                opts.max_frame
            )));
        }
        if len == 0 {
            return Err(Stop::Failed("empty frame (no flags byte)".into()));
        }
        let mut body = Vec::new();
        if flags == 0 && len >= 2 {
            let mut tag = [0u8; 1];
            self.read_exact(rd, &mut tag, idle).await?;
            if u32::from(tag[0]) == CHUNK_VARIANT {
                return self.bulk_chunk(rd, len - 2, current, idle).await;
            }
            body.push(tag[0]);
        }
        let start = body.len();
        body.resize(len - 1, 0);
        self.read_exact(rd, &mut body[start..], idle).await?;
        let msg: BulkToDest =
            decode_frame(opts, flags, &body).map_err(|e| Stop::Failed(e.to_string()))?;
        match msg {
            BulkToDest::Begin {
                table,
                block,
                bytes,
                ..
            } => {
                *current = Some((table, block, BlockDecoder::new(bytes)));
                Ok(())
            }
            BulkToDest::Chunk(c) => match current {
                Some((_, _, d)) if c.len() as u64 <= d.remaining() => {
                    d.feed(&c).map_err(|e| Stop::Failed(e.to_string()))
                }
                _ => Err(Stop::Failed(
                    "chunk outside a block or beyond its size".into(),
                )),
            },
            BulkToDest::End => {
                let Some((table, block, d)) = current.take() else {
                    return Err(Stop::Failed("end without begin".into()));
                };
                let installed = d
                    .finish()
                    .and_then(|data| self.inner.store.install(table, block, data));
                let answer = match installed {
                    Ok(()) => BulkToSource::Installed { table, block },
                    Err(e) => BulkToSource::Failed {
                        table,
                        block,
                        reason: e.to_string(),
                    },
                };
                let mut frame = BytesMut::new();
                codec
                    .encode(answer, &mut frame)
                    .map_err(|e| Stop::Failed(e.to_string()))?;
                let write = async {
                    wr.write_all(&frame).await?;
                    wr.flush().await
                };
                match tokio::time::timeout(self.inner.settings.request_timeout, write).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) | Err(_) => Err(Stop::Quit),
                }
            }
        }
    }

    /// An uncompressed chunk's payload (after its variant byte, `rest`
    /// bytes of the frame left): its length, then the bytes, read straight
    /// into the block being rebuilt.
    async fn bulk_chunk<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        rest: usize,
        current: &mut Option<(TableId, BlockId, BlockDecoder)>,
        idle: Option<Duration>,
    ) -> Result<(), Stop> {
        let mut n: u64 = 0;
        let mut used = 0usize;
        loop {
            if used == rest || used == 10 {
                return Err(Stop::Failed("malformed chunk length".into()));
            }
            let mut b = [0u8; 1];
            self.read_exact(rd, &mut b, idle).await?;
            n |= u64::from(b[0] & 0x7f) << (7 * used);
            used += 1;
            if b[0] & 0x80 == 0 {
                break;
            }
        }
        let payload = rest - used;
        if n != payload as u64 {
            return Err(Stop::Failed(format!(
                "chunk of {n} bytes in a frame with room for {payload}"
            )));
        }
        let Some((_, _, d)) = current.as_mut() else {
            return Err(Stop::Failed("chunk outside a block".into()));
        };
        if n > d.remaining() {
            return Err(Stop::Failed("chunk beyond its block's size".into()));
        }
        let mut left = payload;
        while left > 0 {
            let w = d.window();
            let k = w.len().min(left).min(BULK_IO_BYTES);
            let got = self.read_some(rd, &mut w[..k], idle).await?;
            d.advance(got).map_err(|e| Stop::Failed(e.to_string()))?;
            left -= got;
        }
        Ok(())
    }

    async fn read_exact<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        buf: &mut [u8],
        idle: Option<Duration>,
    ) -> Result<(), Stop> {
        let mut at = 0;
        while at < buf.len() {
            at += self.read_some(rd, &mut buf[at..], idle).await?;
        }
        Ok(())
    }

    /// Reads some bytes (at least one) into `buf` (not empty).
    async fn read_some<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        buf: &mut [u8],
        idle: Option<Duration>,
    ) -> Result<usize, Stop> {
        let read = async {
            match idle {
                Some(d) => tokio::time::timeout(d, rd.read(buf)).await.ok(),
                None => Some(rd.read(buf).await),
            }
        };
        tokio::select! {
            biased;
            _ = self.inner.cancel.cancelled() => Err(Stop::Quit),
            _ = self.inner.faults.broken() => Err(Stop::Quit),
            _ = self.inner.bulk_faults.broken() => Err(Stop::Quit),
            r = read => match r {
                None => Err(Stop::Idle),
                Some(Ok(0)) => Err(Stop::Quit),
                Some(Ok(n)) => Ok(n),
                Some(Err(e)) => Err(Stop::Failed(e.to_string())),
            },
        }
    }
}

/// The bytes `from..to` of the concatenation of `pieces`, as slices of them.
fn range<'a>(pieces: &'a [Cow<'_, [u8]>], from: usize, to: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    for p in pieces {
        let end = start + p.len();
        if end > from && start < to {
            let a = from.max(start) - start;
            let b = to.min(end) - start;
            out.push(&p[a..b]);
        }
        if end >= to {
            break;
        }
        start = end;
    }
    out
}

/// Writes every buffer, at most [`BULK_IO_BYTES`] per system call.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut bufs: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = w.write_vectored(&at_most(bufs, BULK_IO_BYTES)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// The first `max` bytes of `bufs` (all of them if fewer).
fn at_most<'s>(bufs: &'s [IoSlice<'_>], max: usize) -> Vec<IoSlice<'s>> {
    let mut out = Vec::with_capacity(bufs.len());
    let mut left = max;
    for b in bufs {
        if left == 0 {
            break;
        }
        let bytes: &'s [u8] = b;
        let take = bytes.len().min(left);
        out.push(IoSlice::new(&bytes[..take]));
        left -= take;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunk frames written from the block's arrays are the codec's
    /// encoding of `BulkToDest::Chunk`.
    #[test]
    fn chunk_frames_are_the_codecs() {
        let opts = FrameOptions::default();
        let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut wire = BytesMut::new();
        FrameCodec::<BulkToDest, BulkToSource>::new(opts)
            .encode(BulkToDest::Chunk(payload.clone()), &mut wire)
            .unwrap();
        let mut ours = bytes_frame_header(&opts, CHUNK_VARIANT, payload.len()).unwrap();
        ours.extend_from_slice(&payload);
        assert_eq!(&wire[..], &ours[..]);
    }

    #[test]
    fn ranges_cut_across_pieces() {
        let pieces: Vec<Cow<'_, [u8]>> = vec![
            Cow::Owned(vec![0, 1, 2]),
            Cow::Owned(vec![]),
            Cow::Owned(vec![3, 4]),
            Cow::Owned(vec![5, 6, 7, 8]),
        ];
        let whole: Vec<u8> = (0..9).collect();
        for from in 0..=9 {
            for to in from..=9 {
                assert_eq!(range(&pieces, from, to).concat(), whole[from..to].to_vec());
            }
        }
    }

    /// A bulk write takes at most the first `BULK_IO_BYTES`, across buffers.
    #[test]
    fn writes_are_cut_at_the_limit() {
        let (a, b, c) = (vec![1u8; 5], vec![2u8; 3], vec![3u8; 4]);
        let bufs = [IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)];
        for max in 0..=13 {
            let cut: Vec<u8> = at_most(&bufs, max)
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect();
            let whole = [&a[..], &b[..], &c[..]].concat();
            assert_eq!(cut, whole[..max.min(12)].to_vec(), "max {max}");
        }
    }
}
