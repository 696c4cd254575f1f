//! The request connections' framing: the codec's frames, with large values
//! written from where they lie and read straight into place.
//!
//! A pull's answer or a push carries megabytes of `f32` values. Through
//! [`FrameCodec`] alone they are copied into the frame buffer before the
//! socket copies them again, and read into a buffer before being copied
//! out of it. Here a message whose values ([`ValueTail`]) are at least
//! [`TAIL_MIN_BYTES`], and do not compress, is sent as a *tail frame*:
//!
//! ```text
//! | length: u32 BE | flags: FLAG_TAIL | meta length: u32 LE | meta | tail |
//! meta: the message, postcard-encoded with its value bytes empty
//! tail: the value bytes (little-endian f32)
//! ```
//!
//! [`FrameWriter`] writes the header and meta and then the values from the
//! message's own vector, in one vectored write; [`FrameReader`] decodes the
//! meta and reads the tail from the socket into the vector the message
//! will hold, or, when its owner has said where the message's values go
//! ([`FrameReader::with_placement`]), straight into that [`Placement`]: a
//! region of a buffer shared with the caller (a large pull's answer, whose
//! parts arrive as separate responses). Every other frame is the codec's,
//! and the codec decodes tail frames too (with a copy), so either end may
//! be a plain `Framed`.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use futures::{Sink, Stream};
use serde::{Serialize, de::DeserializeOwned};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::codec::{Decoder, Encoder};

use super::codec::{COMPRESSION_SAMPLE, FLAG_TAIL, compresses, decode_body, frame_length};
use super::messages::{ValueTail, decode_with_tail};
use super::{FrameCodec, FrameOptions, ProtocolError};

/// Values smaller than this travel inside their message (one copy of a
/// small payload costs less than a second system call).
pub const TAIL_MIN_BYTES: usize = 64 << 10;

/// Queued bytes past which [`FrameWriter`] writes before taking more
/// (the codec's [`super::auth::WRITE_BATCH_BYTES`]).
const BATCH: usize = super::auth::WRITE_BATCH_BYTES;

/// Buffers per vectored write.
const MAX_SLICES: usize = 64;

/// Length, flags and the meta's length.
const TAIL_HEADER: usize = 9;

/// Encodes `item`, as a tail frame if its values are large and do not
/// compress: returns the frame's leading bytes (appended to `head`) and the
/// values' bytes, or `None` with the whole frame in `head` (values held
/// apart from the message put into it first, [`ValueTail::inline_tail`]).
pub fn encode_tail_frame<Out: Serialize + ValueTail>(
    codec: &mut FrameCodec<Out, impl Sized>,
    mut item: Out,
    head: &mut BytesMut,
) -> Result<Option<Bytes>, ProtocolError> {
    let opts = codec.options();
    let tail_bytes = item.tail().map_or(0, <[u8]>::len);
    let worth = tail_bytes >= TAIL_MIN_BYTES && {
        let bytes = item.tail().unwrap_or_default();
        let from = (bytes.len() / 2).saturating_sub(COMPRESSION_SAMPLE / 2);
        let to = (from + COMPRESSION_SAMPLE).min(bytes.len());
        !compresses(&opts, &bytes[from..to], bytes.len())
    };
    if !worth || cfg!(target_endian = "big") {
        item.inline_tail();
        codec.encode(item, head)?;
        return Ok(None);
    }
    let values = item.take_tail();
    let start = head.len();
    head.extend_from_slice(&[0; TAIL_HEADER]);
    let meta = postcard::to_allocvec(&item).map_err(|e| ProtocolError::Encode(e.to_string()))?;
    head.extend_from_slice(&meta);
    let len = match frame_length(&opts, 1 + 4 + meta.len() + tail_bytes) {
        Ok(l) => l,
        Err(e) => {
            head.truncate(start);
            return Err(e);
        }
    };
    head[start..start + 4].copy_from_slice(&len.to_be_bytes());
    head[start + 4] = FLAG_TAIL;
    head[start + 5..start + 9].copy_from_slice(&(meta.len() as u32).to_le_bytes());
    Ok(Some(values))
}

/// The send half of a request connection: a [`Sink`] of `Out` that writes
/// large values from their own vectors (see the module docs). Frames fed
/// together are written together, up to about a megabyte per system call.
pub struct FrameWriter<W, Out> {
    io: W,
    codec: FrameCodec<Out, ()>,
    /// Small frames and the leading bytes of tail frames, not queued yet.
    head: BytesMut,
    /// Bytes to write, in order.
    queue: VecDeque<Bytes>,
    queued: usize,
}

impl<W, Out> FrameWriter<W, Out> {
    /// A writer on `io` with the connection's frame options.
    pub fn new(io: W, opts: FrameOptions) -> Self {
        FrameWriter {
            io,
            codec: FrameCodec::new(opts),
            head: BytesMut::new(),
            queue: VecDeque::new(),
            queued: 0,
        }
    }

    fn pending(&self) -> usize {
        self.queued + self.head.len()
    }
}

impl<W: AsyncWrite + Unpin, Out> FrameWriter<W, Out> {
    /// Writes until at most `keep` bytes are left.
    fn poll_write_down(
        &mut self,
        cx: &mut Context<'_>,
        keep: usize,
    ) -> Poll<Result<(), ProtocolError>> {
        if !self.head.is_empty() {
            let h = self.head.split().freeze();
            self.queued += h.len();
            self.queue.push_back(h);
        }
        while self.queued > keep {
            let slices: Vec<IoSlice<'_>> = self
                .queue
                .iter()
                .take(MAX_SLICES)
                .map(|b| IoSlice::new(b))
                .collect();
            let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(
                    std::io::Error::from(std::io::ErrorKind::WriteZero).into()
                ));
            }
            self.queued -= n;
            let mut n = n;
            while n > 0 {
                let Some(front) = self.queue.front_mut() else {
                    break;
                };
                if front.len() <= n {
                    n -= front.len();
                    self.queue.pop_front();
                } else {
                    front.advance(n);
                    n = 0;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin, Out: Serialize + ValueTail> Sink<Out> for FrameWriter<W, Out> {
    type Error = ProtocolError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ProtocolError>> {
        let this = self.get_mut();
        if this.pending() >= BATCH {
            ready!(this.poll_write_down(cx, BATCH - 1))?;
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: Out) -> Result<(), ProtocolError> {
        let this = self.get_mut();
        if let Some(values) = encode_tail_frame(&mut this.codec, item, &mut this.head)? {
            let h = this.head.split().freeze();
            this.queued += h.len();
            this.queue.push_back(h);
            this.queued += values.len();
            this.queue.push_back(values);
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ProtocolError>> {
        let this = self.get_mut();
        ready!(this.poll_write_down(cx, 0))?;
        Pin::new(&mut this.io).poll_flush(cx).map_err(Into::into)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ProtocolError>> {
        let this = self.get_mut();
        ready!(this.poll_write_down(cx, 0))?;
        ready!(Pin::new(&mut this.io).poll_flush(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx).map_err(Into::into)
    }
}

/// Where a message's values go when they arrive as a tail: `len` values
/// at `at` in a buffer shared with whoever waits for the message. The
/// message delivered is then the one the [`Placer`] gave, and
/// [`Placement::placed`] says the values are in place.
#[derive(Clone)]
pub struct Placement {
    /// The buffer.
    pub buf: Arc<Mutex<Vec<f32>>>,
    /// Where the values start in it.
    pub at: usize,
    /// How many values.
    pub len: usize,
    done: Arc<AtomicBool>,
}

impl Placement {
    /// `len` values at `at` in `buf`.
    pub fn new(buf: Arc<Mutex<Vec<f32>>>, at: usize, len: usize) -> Placement {
        Placement {
            buf,
            at,
            len,
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a message's values were read into place (all of them).
    pub fn placed(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// Says, from a tail frame's meta (the message postcard-encoded with its
/// value bytes empty) and the number of values that follow, where the
/// values go and what message to deliver once they are there
/// ([`FrameReader::with_placement`]); `None`: they go into the message.
pub type Placer<In> = Box<dyn FnMut(&[u8], usize) -> Option<(Placement, In)> + Send>;

/// Where a tail's bytes are going.
enum Dest<In> {
    /// A vector of its own, for the message decoded from `meta` at the end.
    Own { meta: Vec<u8>, values: Vec<f32> },
    /// A placement; `msg`, the placer's, is delivered at the end.
    Placed { msg: Box<In>, place: Placement },
}

/// A tail being read into place.
struct Tail<In> {
    into: Dest<In>,
    /// Bytes read so far (of an own vector: the bytes of its capacity
    /// initialised so far).
    filled: usize,
    /// Bytes in all.
    total: usize,
}

/// The receive half of a request connection: a [`Stream`] of `In`,
/// reading tail frames' values straight into place (see the module docs).
/// Cancel-safe: what was read is kept in the reader between polls.
pub struct FrameReader<R, In> {
    io: R,
    codec: FrameCodec<(), In>,
    buf: BytesMut,
    tail: Option<Tail<In>>,
    placer: Option<Placer<In>>,
    eof: bool,
}

impl<R, In> FrameReader<R, In> {
    /// A reader on `io`; `leftover` is what an earlier reader (the
    /// handshake's) had already taken off the socket.
    pub fn new(io: R, opts: FrameOptions, leftover: BytesMut) -> Self {
        FrameReader {
            io,
            codec: FrameCodec::new(opts),
            buf: leftover,
            tail: None,
            placer: None,
            eof: false,
        }
    }

    /// Asks `placer` where each tail frame's values go, once the frame's
    /// meta has arrived.
    pub fn with_placement(mut self, placer: Placer<In>) -> Self {
        self.placer = Some(placer);
        self
    }
}

impl<R: AsyncRead + Unpin, In: DeserializeOwned> FrameReader<R, In> {
    /// A tail frame's header, meta and the start of its tail, if `buf` holds
    /// them: begins reading the tail. `Ok(false)`: more bytes are needed.
    fn start_tail(&mut self) -> Result<bool, ProtocolError> {
        let max = self.codec.options().max_frame;
        if self.buf.len() < TAIL_HEADER {
            return Ok(false);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        let meta_len =
            u32::from_le_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]) as usize;
        if len > max {
            return Err(ProtocolError::FrameTooLarge { size: len, max });
        }
        let Some(tail_len) = len.checked_sub(5 + meta_len) else {
            return Err(ProtocolError::Malformed(
                "tail frame shorter than its meta".into(),
            ));
        };
        if !tail_len.is_multiple_of(4) {
            return Err(ProtocolError::Malformed(
                "value bytes not a multiple of 4".into(),
            ));
        }
        if self.buf.len() < TAIL_HEADER + meta_len {
            self.buf.reserve(TAIL_HEADER + meta_len - self.buf.len());
            return Ok(false);
        }
        self.buf.advance(TAIL_HEADER);
        let meta = self.buf.split_to(meta_len).to_vec();
        let n = tail_len / 4;
        let mut into = None;
        if let Some(placer) = &mut self.placer
            && let Some((place, msg)) = placer(&meta, n)
            && place.len == n
        {
            into = Some(Dest::Placed {
                msg: Box::new(msg),
                place,
            });
        }
        let into = into.unwrap_or_else(|| Dest::Own {
            meta,
            // Read into the capacity, not zeroed first.
            values: Vec::with_capacity(n),
        });
        self.tail = Some(Tail {
            into,
            filled: 0,
            total: tail_len,
        });
        Ok(true)
    }

    /// Fills the tail being read; the message once it is complete.
    fn poll_tail(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<In>, ProtocolError>> {
        let Some(t) = &mut self.tail else {
            return Poll::Ready(Ok(None));
        };
        while t.filled < t.total {
            let mut shared;
            let mut rb = match &mut t.into {
                Dest::Own { values, .. } => {
                    let spare = values.spare_capacity_mut();
                    // SAFETY: a `MaybeUninit<f32>` is four `MaybeUninit<u8>`
                    // (no padding, any bytes allowed); the view covers the
                    // spare capacity exactly and borrows it mutably.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(
                            spare.as_mut_ptr().cast::<MaybeUninit<u8>>(),
                            spare.len() * 4,
                        )
                    };
                    ReadBuf::uninit(&mut bytes[t.filled..t.total])
                }
                Dest::Placed { place, .. } => {
                    shared = place.buf.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(v) = shared.get_mut(place.at..place.at + place.len) else {
                        return Poll::Ready(Err(ProtocolError::Malformed(
                            "the values' place is gone".into(),
                        )));
                    };
                    ReadBuf::new(&mut bytemuck::cast_slice_mut::<f32, u8>(v)[t.filled..])
                }
            };
            if !self.buf.is_empty() {
                let n = rb.remaining().min(self.buf.len());
                rb.put_slice(&self.buf[..n]);
                self.buf.advance(n);
                t.filled += n;
                continue;
            }
            ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Err(ProtocolError::Malformed(
                    "connection closed in the middle of a frame".into(),
                )));
            }
            t.filled += n;
        }
        let Some(t) = self.tail.take() else {
            return Poll::Ready(Ok(None));
        };
        let msg = match t.into {
            Dest::Own { meta, mut values } => {
                // SAFETY: the capacity's first `total` bytes (`total / 4`
                // values, within the capacity) were written above: `filled`
                // counts what the socket reads and the copies initialised.
                unsafe { values.set_len(t.total / 4) };
                if cfg!(target_endian = "big") {
                    to_native(&mut values);
                }
                decode_with_tail(values, || decode_body::<In>(&meta))?
            }
            Dest::Placed { msg, place } => {
                if cfg!(target_endian = "big") {
                    let mut shared = place.buf.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(v) = shared.get_mut(place.at..place.at + place.len) {
                        to_native(v);
                    }
                }
                place.done.store(true, Ordering::Release);
                *msg
            }
        };
        Poll::Ready(Ok(Some(msg)))
    }
}

/// Little-endian values read off the wire, in the machine's order.
fn to_native(values: &mut [f32]) {
    for x in values {
        *x = f32::from_bits(u32::from_le(x.to_bits()));
    }
}

impl<R: AsyncRead + Unpin, In: DeserializeOwned> Stream for FrameReader<R, In> {
    type Item = Result<In, ProtocolError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.tail.is_some() {
                return match ready!(this.poll_tail(cx)) {
                    Ok(Some(m)) => Poll::Ready(Some(Ok(m))),
                    Ok(None) => continue,
                    Err(e) => Poll::Ready(Some(Err(e))),
                };
            }
            if this.buf.len() > 4 && this.buf[4] == FLAG_TAIL {
                match this.start_tail() {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            } else {
                match this.codec.decode(&mut this.buf) {
                    Ok(Some(m)) => return Poll::Ready(Some(Ok(m))),
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            }
            if this.eof {
                return Poll::Ready(if this.buf.is_empty() {
                    None
                } else {
                    Some(Err(ProtocolError::Malformed(
                        "connection closed in the middle of a frame".into(),
                    )))
                });
            }
            if this.buf.capacity() - this.buf.len() < 8 << 10 {
                this.buf.reserve(64 << 10);
            }
            let mut rb = ReadBuf::uninit(this.buf.spare_capacity_mut());
            if let Err(e) = ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb)) {
                return Poll::Ready(Some(Err(e.into())));
            }
            let n = rb.filled().len();
            // SAFETY: the reader initialized (filled) the first `n` bytes of
            // the spare capacity.
            unsafe { this.buf.set_len(this.buf.len() + n) };
            if n == 0 {
                this.eof = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::ValueTail;
    use crate::protocol::{PeerRequest, PeerResponse, ToClient, ToOwner, ValueBatch};
    use futures::{SinkExt, StreamExt};
    use rand::{Rng, SeedableRng};

    fn values(n: usize, seed: u64) -> ValueBatch {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut v = ValueBatch::default();
        for _ in 0..n {
            let row: Vec<f32> = (0..1024).map(|_| rng.random_range(-1.0..1.0)).collect();
            v.push(&row);
        }
        v
    }

    fn messages() -> Vec<ToClient> {
        vec![
            ToClient::Response {
                id: 1,
                result: Ok(PeerResponse::Values(values(64, 1))),
            },
            ToClient::GoAway,
            ToClient::Response {
                id: 2,
                result: Ok(PeerResponse::Values(values(3, 2))),
            },
            ToClient::Response {
                id: 3,
                result: Ok(PeerResponse::Done),
            },
            // Compressible: sent inside its message, compressed.
            ToClient::Response {
                id: 4,
                result: Ok(PeerResponse::Values(ValueBatch {
                    lens: vec![65_536],
                    data: vec![0.5; 65_536],
                })),
            },
            ToClient::Response {
                id: 5,
                result: Ok(PeerResponse::Values(values(300, 3))),
            },
        ]
    }

    /// Over a real socket, tail frames and plain ones arrive as sent, to
    /// our reader and to the codec alike.
    #[tokio::test]
    async fn tail_frames_round_trip_over_a_socket() {
        let opts = FrameOptions::default();
        for plain_reader in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let send = tokio::spawn(async move {
                let s = tokio::net::TcpStream::connect(addr).await.unwrap();
                let mut w = FrameWriter::<_, ToClient>::new(s, opts);
                for m in messages() {
                    w.feed(m).await.unwrap();
                }
                w.close().await.unwrap();
            });
            let (s, _) = listener.accept().await.unwrap();
            let got: Vec<ToClient> = if plain_reader {
                tokio_util::codec::FramedRead::new(s, FrameCodec::<(), ToClient>::new(opts))
                    .map(|m| m.unwrap())
                    .collect()
                    .await
            } else {
                FrameReader::<_, ToClient>::new(s, opts, BytesMut::new())
                    .map(|m| m.unwrap())
                    .collect()
                    .await
            };
            send.await.unwrap();
            assert_eq!(got, messages(), "plain reader: {plain_reader}");
        }
    }

    /// A push's deltas travel as a tail too; a tail frame whose message has
    /// no values, or that is cut short, is an error.
    #[tokio::test]
    async fn pushes_and_bad_tails() {
        let opts = FrameOptions::default();
        let push = ToOwner::Request {
            id: 9,
            req: PeerRequest::Update {
                table: 0,
                keys: (0..64).collect(),
                deltas: values(64, 4),
            },
        };
        let mut head = BytesMut::new();
        let values = encode_tail_frame(
            &mut FrameCodec::<ToOwner, ()>::new(opts),
            push.clone(),
            &mut head,
        )
        .unwrap()
        .expect("sent as a tail frame");
        let mut wire = head.to_vec();
        wire.extend_from_slice(&values);
        let mut r = FrameReader::<_, ToOwner>::new(&wire[..], opts, BytesMut::new());
        assert_eq!(r.next().await.unwrap().unwrap(), push);
        assert!(r.next().await.is_none());

        let mut cut =
            FrameReader::<_, ToOwner>::new(&wire[..wire.len() - 3], opts, BytesMut::new());
        assert!(cut.next().await.unwrap().is_err());

        // A tail after a message without values.
        let meta = postcard::to_allocvec(&ToOwner::GoAwayAck).unwrap();
        let mut bad = Vec::new();
        bad.extend_from_slice(&((1 + 4 + meta.len() + 8) as u32).to_be_bytes());
        bad.push(FLAG_TAIL);
        bad.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        bad.extend_from_slice(&meta);
        bad.extend_from_slice(&[0; 8]);
        let mut r = FrameReader::<_, ToOwner>::new(&bad[..], opts, BytesMut::new());
        assert!(matches!(
            r.next().await,
            Some(Err(ProtocolError::Malformed(_)))
        ));
    }

    /// A write whose values are held apart ([`Outgoing`]) arrives as the
    /// same request with its values in it, sent as a tail (large) or inside
    /// it (small, or compressible).
    #[tokio::test]
    async fn values_held_apart_arrive_in_their_request() {
        use crate::protocol::Outgoing;
        let opts = FrameOptions::default();
        let whole = |id: u64, deltas: ValueBatch| ToOwner::Request {
            id,
            req: PeerRequest::Update {
                table: 0,
                keys: (0..deltas.len() as u64).collect(),
                deltas,
            },
        };
        let apart = |m: &ToOwner| {
            let mut msg = m.clone();
            let values = msg.take_tail();
            Outgoing {
                msg,
                values: Some(values),
            }
        };
        let compressible = ValueBatch {
            lens: vec![65_536],
            data: vec![0.5; 65_536],
        };
        let sent = vec![
            whole(1, values(64, 7)),
            whole(2, values(1, 8)),
            whole(3, compressible),
            ToOwner::GoAwayAck,
        ];
        let mut wire = Vec::new();
        let mut w = FrameWriter::<_, Outgoing>::new(&mut wire, opts);
        for m in &sent {
            let out = match m {
                ToOwner::Request { .. } => apart(m),
                other => Outgoing::from(other.clone()),
            };
            w.feed(out).await.unwrap();
        }
        w.flush().await.unwrap();
        drop(w);
        let got: Vec<ToOwner> = FrameReader::<_, ToOwner>::new(&wire[..], opts, BytesMut::new())
            .map(|m| m.unwrap())
            .collect()
            .await;
        assert_eq!(got, sent);
        // Encoded whole, an outgoing request is the request.
        assert_eq!(
            postcard::to_allocvec(&apart(&sent[1])).unwrap(),
            postcard::to_allocvec(&sent[1]).unwrap()
        );
    }

    /// With a placer, a tail's values go where it says and the message it
    /// gave is delivered; tails it declines, or whose size does not match,
    /// come in their message as before.
    #[tokio::test]
    async fn tails_are_read_into_place() {
        let opts = FrameOptions::default();
        let mut wire = Vec::new();
        let mut codec = FrameCodec::<ToClient, ()>::new(opts);
        for m in messages() {
            let mut head = BytesMut::new();
            if let Some(tail) = encode_tail_frame(&mut codec, m, &mut head).unwrap() {
                wire.extend_from_slice(&head);
                wire.extend_from_slice(&tail);
            } else {
                wire.extend_from_slice(&head);
            }
        }
        let buf = Arc::new(Mutex::new(vec![0.0f32; 70 * 1024]));
        let place = Placement::new(Arc::clone(&buf), 1024, 64 * 1024);
        let wrong = Placement::new(Arc::clone(&buf), 0, 1024);
        let (p1, p5) = (place.clone(), wrong.clone());
        let placer: Placer<ToClient> = Box::new(move |meta: &[u8], n| {
            // The id is the second varint; ids here are below 128.
            match meta.get(1) {
                Some(1) => Some((p1.clone(), ToClient::GoAway)),
                Some(5) => Some((p5.clone(), ToClient::GoAway)),
                _ => None,
            }
            .filter(|_| n > 0)
        });
        let got: Vec<ToClient> = FrameReader::<_, ToClient>::new(&wire[..], opts, BytesMut::new())
            .with_placement(placer)
            .map(|m| m.unwrap())
            .collect()
            .await;
        let mut want = messages();
        let ToClient::Response {
            result: Ok(PeerResponse::Values(first)),
            ..
        } = std::mem::replace(&mut want[0], ToClient::GoAway)
        else {
            panic!("the first message has values");
        };
        assert_eq!(got, want);
        assert!(place.placed());
        assert!(!wrong.placed(), "300 rows do not fit in 1");
        let buf = buf.lock().unwrap();
        assert!(buf[1024..65 * 1024] == first.data[..]);
        assert!(buf[..1024].iter().all(|&x| x == 0.0));
    }
}
