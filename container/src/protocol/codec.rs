//! Frame codec shared by the control channel and the data plane.
//!
//! # Frame layout
//!
//! ```text
//! +-------------------+---------+------------------------------------------+
//! | length: u32, BE   | flags   | body                                     |
//! | (= 1 + body len)  | 1 byte  | postcard-encoded message                 |
//! +-------------------+---------+------------------------------------------+
//!
//! flags bit 0 (COMPRESSED): body is an lz4 block preceded by its
//!                           uncompressed size as u32 LE
//! flags bit 1 (TAIL):       body is the message with its values apart:
//!                           meta length (u32 LE), the message encoded
//!                           with empty value bytes, the value bytes
//!                           (request connections, `protocol::frames`;
//!                           never with COMPRESSED)
//! flags bits 2..7:          reserved, must be 0
//! ```
//!
//! `length` is bounded by the connection's maximum frame size, and so is the
//! uncompressed size of a compressed body (checked before decompressing), so a
//! peer cannot make us allocate more than that. An incomplete frame is not an
//! error: the decoder waits for more bytes. An oversize frame, unknown flags, a
//! body that does not decompress or does not decode as the expected message
//! type are typed [`ProtocolError`]s; the connection that produced them is
//! closed, the process carries on.
//!
//! Compression is chosen per payload (`channel.compression`): `never`,
//! `always` above `compress_min_bytes`, or `auto`, which compresses a sample of
//! the body first and compresses the whole only if the sample shrinks to
//! `compress_max_ratio` or less. Random model values do not compress (lz4
//! ratio 1.00) and libsvm text compresses at about 0.33 GB/s, a sixth of
//! one loopback TCP stream on this project's machines (about 2.2 GB/s), so
//! blind compression would cost more than it saves.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, BytesMut};
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::codec::{Decoder, Encoder};

use cruise_conf::{ChannelConfig, Compression};

use super::ProtocolError;

const HEADER: usize = 4;
const FLAG_COMPRESSED: u8 = 1;
/// The body is a message and its values apart (`protocol::frames`).
pub(crate) const FLAG_TAIL: u8 = 2;
const SAMPLE: usize = 64 * 1024;

/// Framing options of one connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameOptions {
    /// Largest frame (and largest uncompressed body) accepted or sent.
    pub max_frame: usize,
    /// Compression policy.
    pub compression: Compression,
    /// Bodies below this size are sent as they are.
    pub compress_min: usize,
    /// With `Auto`, the sample must shrink to this fraction or less.
    pub compress_max_ratio: f64,
}

impl FrameOptions {
    /// Options for the control channel.
    pub fn control(c: &ChannelConfig) -> Self {
        Self::with_max(c, c.control_max_frame_bytes)
    }

    /// Options for the data plane.
    pub fn data(c: &ChannelConfig) -> Self {
        Self::with_max(c, c.data_max_frame_bytes)
    }

    fn with_max(c: &ChannelConfig, max: u64) -> Self {
        FrameOptions {
            max_frame: usize::try_from(max).unwrap_or(usize::MAX),
            compression: c.compression,
            compress_min: usize::try_from(c.compress_min_bytes).unwrap_or(usize::MAX),
            compress_max_ratio: c.compress_max_ratio,
        }
    }
}

impl Default for FrameOptions {
    fn default() -> Self {
        Self::data(&ChannelConfig::default())
    }
}

/// Encodes `Out` messages and decodes `In` messages in the frame layout above.
#[derive(Debug)]
pub struct FrameCodec<Out, In> {
    opts: FrameOptions,
    _types: PhantomData<fn(Out) -> In>,
}

impl<Out, In> FrameCodec<Out, In> {
    /// A codec with the given options.
    pub fn new(opts: FrameOptions) -> Self {
        FrameCodec {
            opts,
            _types: PhantomData,
        }
    }

    /// The options in use.
    pub fn options(&self) -> FrameOptions {
        self.opts
    }
}

impl<Out, In> Clone for FrameCodec<Out, In> {
    fn clone(&self) -> Self {
        Self::new(self.opts)
    }
}

/// postcard flavor that appends straight into the frame buffer, so a large
/// byte payload is copied once.
struct BytesMutFlavor<'a>(&'a mut BytesMut);

impl postcard::ser_flavors::Flavor for BytesMutFlavor<'_> {
    type Output = ();

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.put_u8(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

fn should_compress(opts: &FrameOptions, body: &[u8]) -> bool {
    // Sample from the middle: headers at the start are not typical.
    let start = (body.len() / 2).saturating_sub(SAMPLE / 2);
    compresses(
        opts,
        &body[start..(start + SAMPLE).min(body.len())],
        body.len(),
    )
}

/// Whether a payload of `len` bytes is worth compressing under `opts`,
/// `sample` being a typical part of it (up to 64 KiB from its middle):
/// what the encoder decides for a frame's body, for writers that frame
/// large payloads themselves and decide once per block.
pub fn compresses(opts: &FrameOptions, sample: &[u8], len: usize) -> bool {
    if len < opts.compress_min.max(16) {
        return false;
    }
    match opts.compression {
        Compression::Never => false,
        Compression::Always => true,
        Compression::Auto => {
            let sample = &sample[..sample.len().min(SAMPLE)];
            let packed = lz4_flex::block::compress(sample);
            (packed.len() as f64) <= opts.compress_max_ratio * sample.len() as f64
        }
    }
}

/// How many bytes from the middle of a payload [`compresses`] looks at.
pub const COMPRESSION_SAMPLE: usize = SAMPLE;

/// Appends `v` as postcard's varint (LEB128).
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The bytes that precede `len` raw payload bytes in an uncompressed frame
/// whose message is the enum variant number `variant` holding one byte
/// string (`#[serde(with = "serde_bytes")]`): the frame length, the flags,
/// the variant and the string's length. A writer sends these and then the
/// payload from where it lies, with no copy into a frame buffer; the
/// reader's [`FrameCodec`] cannot tell it from an encoded message.
pub fn bytes_frame_header(
    opts: &FrameOptions,
    variant: u32,
    len: usize,
) -> Result<Vec<u8>, ProtocolError> {
    let mut body = Vec::with_capacity(16);
    put_varint(&mut body, u64::from(variant));
    put_varint(&mut body, len as u64);
    let frame = frame_length(opts, 1 + body.len() + len)?;
    let mut out = Vec::with_capacity(HEADER + 1 + body.len());
    out.extend_from_slice(&frame.to_be_bytes());
    out.push(0);
    out.extend_from_slice(&body);
    Ok(out)
}

/// A frame's length field for `size` bytes after it (flags and body), if
/// the connection allows a frame that large.
pub(crate) fn frame_length(opts: &FrameOptions, size: usize) -> Result<u32, ProtocolError> {
    let too_large = || ProtocolError::FrameTooLarge {
        size,
        max: opts.max_frame,
    };
    if size > opts.max_frame {
        return Err(too_large());
    }
    u32::try_from(size).map_err(|_| too_large())
}

/// Decodes a frame's flags byte and body (what its length counts after the
/// flags), as the decoder does: for readers that take frames off the
/// socket themselves.
pub fn decode_frame<In: DeserializeOwned>(
    opts: &FrameOptions,
    flags: u8,
    body: &[u8],
) -> Result<In, ProtocolError> {
    if flags == FLAG_TAIL {
        let meta_len = body
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .filter(|&m| 4 + m <= body.len())
            .ok_or_else(|| ProtocolError::Malformed("tail frame shorter than its meta".into()))?;
        let tail = &body[4 + meta_len..];
        if !tail.len().is_multiple_of(4) {
            return Err(ProtocolError::Malformed(
                "value bytes not a multiple of 4".into(),
            ));
        }
        let values = super::messages::le_bytes_to_f32s(tail);
        return super::messages::decode_with_tail(values, || decode_body(&body[4..4 + meta_len]));
    }
    if flags & !FLAG_COMPRESSED != 0 {
        return Err(ProtocolError::Malformed(format!(
            "unknown frame flags {flags:#04x}"
        )));
    }
    if flags & FLAG_COMPRESSED != 0 {
        if body.len() < 4 {
            return Err(ProtocolError::Malformed(
                "compressed frame too short".into(),
            ));
        }
        let raw = u32::from_le_bytes([body[0], body[1], body[2], body[3]]) as usize;
        if raw > opts.max_frame {
            return Err(ProtocolError::FrameTooLarge {
                size: raw,
                max: opts.max_frame,
            });
        }
        let plain = lz4_flex::block::decompress(&body[4..], raw)
            .map_err(|e| ProtocolError::Malformed(format!("lz4: {e}")))?;
        decode_body(&plain)
    } else {
        decode_body(body)
    }
}

impl<Out: Serialize, In> Encoder<Out> for FrameCodec<Out, In> {
    type Error = ProtocolError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        let frame_start = dst.len();
        dst.put_u32(0);
        dst.put_u8(0);
        let body_start = dst.len();
        if let Err(e) = postcard::serialize_with_flavor(&item, BytesMutFlavor(dst)) {
            dst.truncate(frame_start);
            return Err(ProtocolError::Encode(e.to_string()));
        }
        let body_len = dst.len() - body_start;
        if body_len + 1 > self.opts.max_frame {
            dst.truncate(frame_start);
            return Err(ProtocolError::FrameTooLarge {
                size: body_len + 1,
                max: self.opts.max_frame,
            });
        }
        if should_compress(&self.opts, &dst[body_start..]) {
            let packed = lz4_flex::block::compress_prepend_size(&dst[body_start..]);
            if packed.len() < body_len {
                dst.truncate(body_start);
                dst.extend_from_slice(&packed);
                dst[frame_start + HEADER] = FLAG_COMPRESSED;
            }
        }
        let len = dst.len() - frame_start - HEADER;
        let len = u32::try_from(len).map_err(|_| ProtocolError::FrameTooLarge {
            size: len,
            max: self.opts.max_frame,
        })?;
        dst[frame_start..frame_start + HEADER].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }
}

impl<Out, In: DeserializeOwned> Decoder for FrameCodec<Out, In> {
    type Item = In;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, ProtocolError> {
        if src.len() < HEADER {
            return Ok(None);
        }
        let mut len_bytes = [0u8; HEADER];
        len_bytes.copy_from_slice(&src[..HEADER]);
        let len = u32::from_be_bytes(len_bytes) as usize;
        if len > self.opts.max_frame {
            return Err(ProtocolError::FrameTooLarge {
                size: len,
                max: self.opts.max_frame,
            });
        }
        if len == 0 {
            return Err(ProtocolError::Malformed(
                "empty frame (no flags byte)".into(),
            ));
        }
        if src.len() < HEADER + len {
            src.reserve(HEADER + len - src.len());
            return Ok(None);
        }
        src.advance(HEADER);
        let frame = src.split_to(len);
        decode_frame(&self.opts, frame[0], &frame[1..]).map(Some)
    }
}

pub(crate) fn decode_body<In: DeserializeOwned>(body: &[u8]) -> Result<In, ProtocolError> {
    let (msg, rest) = postcard::take_from_bytes::<In>(body)
        .map_err(|e| ProtocolError::Malformed(format!("undecodable message: {e}")))?;
    if !rest.is_empty() {
        return Err(ProtocolError::Malformed(format!(
            "{} trailing bytes after message",
            rest.len()
        )));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Ping(u64),
        Text(String),
        Blob(#[serde(with = "serde_bytes")] Vec<u8>),
        Many(Vec<(u32, i64)>),
    }

    fn arb_msg() -> impl Strategy<Value = Msg> {
        prop_oneof![
            any::<u64>().prop_map(Msg::Ping),
            ".{0,64}".prop_map(Msg::Text),
            prop::collection::vec(any::<u8>(), 0..4096).prop_map(Msg::Blob),
            // Compressible blobs, to exercise the lz4 path.
            (any::<u8>(), 0usize..200_000).prop_map(|(b, n)| Msg::Blob(vec![b; n])),
            prop::collection::vec(any::<(u32, i64)>(), 0..64).prop_map(Msg::Many),
        ]
    }

    fn opts(compression: Compression) -> FrameOptions {
        FrameOptions {
            max_frame: 1 << 20,
            compression,
            compress_min: 1024,
            compress_max_ratio: 0.5,
        }
    }

    fn codec(c: Compression) -> FrameCodec<Msg, Msg> {
        FrameCodec::new(opts(c))
    }

    proptest! {
        /// Any sequence of messages survives encode → arbitrary re-chunking → decode.
        #[test]
        fn round_trip_split_buffers(
            msgs in prop::collection::vec(arb_msg(), 1..8),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
            comp in prop_oneof![Just(Compression::Auto), Just(Compression::Always), Just(Compression::Never)],
        ) {
            let mut c = codec(comp);
            let mut wire = BytesMut::new();
            for m in &msgs {
                c.encode(m.clone(), &mut wire).unwrap();
            }
            let wire = wire.freeze();
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            points.push(wire.len());
            points.sort_unstable();
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut prev = 0;
            for p in points {
                buf.extend_from_slice(&wire[prev..p]);
                prev = p;
                while let Some(m) = c.decode(&mut buf).unwrap() {
                    out.push(m);
                }
            }
            prop_assert_eq!(out, msgs);
            prop_assert!(buf.is_empty());
        }

        /// Garbage never panics: it decodes to a message, waits for more, or errors.
        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut c = codec(Compression::Auto);
            let mut buf = BytesMut::from(&bytes[..]);
            for _ in 0..8 {
                match c.decode(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// A frame cut short is never decoded: the decoder keeps waiting.
        #[test]
        fn truncated_frames_wait(m in arb_msg(), cut in any::<prop::sample::Index>()) {
            let mut c = codec(Compression::Never);
            let mut wire = BytesMut::new();
            c.encode(m, &mut wire).unwrap();
            let n = cut.index(wire.len());
            let mut buf = BytesMut::from(&wire[..n]);
            prop_assert!(c.decode(&mut buf).unwrap().is_none());
        }
    }

    #[test]
    fn oversize_frame_rejected_before_buffering() {
        let mut c = codec(Compression::Never);
        let mut buf = BytesMut::new();
        buf.put_u32(10 << 20);
        buf.put_u8(0);
        let err = c.decode(&mut buf).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
    }

    #[test]
    fn oversize_message_not_sent() {
        let mut c = codec(Compression::Never);
        let mut buf = BytesMut::new();
        let err = c.encode(Msg::Blob(vec![7; 2 << 20]), &mut buf).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
        assert!(buf.is_empty(), "nothing half-written");
    }

    #[test]
    fn compressed_bomb_rejected() {
        let mut c = codec(Compression::Always);
        let mut buf = BytesMut::new();
        // A compressed frame claiming a 100 MiB body.
        let body = lz4_flex::block::compress_prepend_size(&[0u8; 64]);
        let mut fake = body.clone();
        fake[..4].copy_from_slice(&(100u32 << 20).to_le_bytes());
        buf.put_u32(fake.len() as u32 + 1);
        buf.put_u8(FLAG_COMPRESSED);
        buf.extend_from_slice(&fake);
        let err = c.decode(&mut buf).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
    }

    #[test]
    fn unknown_flags_and_trailing_bytes_rejected() {
        let mut c = codec(Compression::Never);
        let mut buf = BytesMut::new();
        buf.put_u32(2);
        buf.put_u8(0x80);
        buf.put_u8(0);
        assert!(matches!(
            c.decode(&mut buf),
            Err(ProtocolError::Malformed(_))
        ));

        let mut wire = BytesMut::new();
        c.encode(Msg::Ping(1), &mut wire).unwrap();
        let len = u32::from_be_bytes([wire[0], wire[1], wire[2], wire[3]]);
        wire[..4].copy_from_slice(&(len + 3).to_be_bytes());
        wire.extend_from_slice(&[1, 2, 3]);
        assert!(matches!(
            c.decode(&mut wire),
            Err(ProtocolError::Malformed(_))
        ));
    }

    /// A frame written as [`bytes_frame_header`] and the raw payload is
    /// the codec's own encoding of the same message.
    #[test]
    fn bytes_frame_header_matches_the_encoder() {
        for n in [0usize, 1, 127, 128, 300, 70_000] {
            let payload: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let mut c = codec(Compression::Never);
            let mut wire = BytesMut::new();
            c.encode(Msg::Blob(payload.clone()), &mut wire).unwrap();
            let mut ours = bytes_frame_header(&c.options(), 2, n).unwrap();
            ours.extend_from_slice(&payload);
            assert_eq!(&wire[..], &ours[..], "{n} bytes");
        }
        let small = FrameOptions {
            max_frame: 100,
            ..opts(Compression::Never)
        };
        assert!(matches!(
            bytes_frame_header(&small, 2, 100),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn auto_skips_incompressible_payloads() {
        use rand::{RngCore, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut random = vec![0u8; 200_000];
        rng.fill_bytes(&mut random);
        let mut c = codec(Compression::Auto);
        let mut buf = BytesMut::new();
        c.encode(Msg::Blob(random), &mut buf).unwrap();
        assert_eq!(buf[4], 0, "random bytes are sent uncompressed");

        let mut buf = BytesMut::new();
        c.encode(Msg::Blob(vec![3; 200_000]), &mut buf).unwrap();
        assert_eq!(buf[4], FLAG_COMPRESSED, "repetitive bytes are compressed");
        assert!(buf.len() < 10_000);
    }
}
