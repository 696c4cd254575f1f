//! Values as they travel: [`ValueBatch`] (raw little-endian f32 bytes), and
//! the values a frame carries apart from the rest of its message
//! ([`ValueTail`], `protocol::frames`).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{PeerRequest, PeerResponse, ToClient, ToOwner};
use crate::protocol::ProtocolError;

/// Values of several keys, concatenated. Travels as raw little-endian bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueBatch {
    /// Length of each key's value.
    pub lens: Vec<u32>,
    /// All values, concatenated in key order.
    pub data: Vec<f32>,
}

impl ValueBatch {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Bytes of value data.
    pub fn byte_len(&self) -> usize {
        self.data.len() * 4
    }

    /// Iterates over the values as slices.
    pub fn iter(&self) -> impl Iterator<Item = &[f32]> {
        let mut off = 0usize;
        self.lens.iter().map(move |&l| {
            let s = &self.data[off..off + l as usize];
            off += l as usize;
            s
        })
    }

    /// Appends one value.
    pub fn push(&mut self, v: &[f32]) {
        self.lens.push(v.len() as u32);
        self.data.extend_from_slice(v);
    }
}

impl Serialize for ValueBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&self.lens)?;
        t.serialize_element(serde_bytes::Bytes::new(&f32s_to_le_bytes(&self.data)))?;
        t.end()
    }
}

impl<'de> Deserialize<'de> for ValueBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ValueBatch;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a value batch (lengths, little-endian f32 bytes)")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<ValueBatch, A::Error> {
                use serde::de::Error;
                let lens: Vec<u32> = a
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let F32Bytes(data) = a
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
                if total != data.len() as u64 {
                    return Err(A::Error::custom(format!(
                        "value lengths sum to {total} but {} values were sent",
                        data.len()
                    )));
                }
                Ok(ValueBatch { lens, data })
            }
        }
        d.deserialize_tuple(2, V)
    }
}

/// f32 values decoded straight from a byte string (one copy, no staging buffer).
struct F32Bytes(Vec<f32>);

impl<'de> Deserialize<'de> for F32Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = F32Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("little-endian f32 bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<F32Bytes, E> {
                if !b.len().is_multiple_of(4) {
                    return Err(E::custom("value bytes not a multiple of 4"));
                }
                if b.is_empty()
                    && let Some(tail) = TAIL.with(|t| t.borrow_mut().take())
                {
                    return Ok(F32Bytes(tail));
                }
                Ok(F32Bytes(le_bytes_to_f32s(b)))
            }
        }
        d.deserialize_bytes(V)
    }
}

thread_local! {
    /// Values read apart from their message (a frame's tail, see
    /// `protocol::frames`), for the next value bytes decoded on this thread.
    static TAIL: std::cell::RefCell<Option<Vec<f32>>> = const { std::cell::RefCell::new(None) };
}

/// Decodes a message sent with its values apart (`protocol::frames`): `meta`
/// is the message encoded with empty value bytes; `tail` takes their place.
/// An error if the message has no values to take them.
pub(crate) fn decode_with_tail<T>(
    tail: Vec<f32>,
    decode: impl FnOnce() -> Result<T, ProtocolError>,
) -> Result<T, ProtocolError> {
    TAIL.with(|t| *t.borrow_mut() = Some(tail));
    let out = decode();
    let unused = TAIL.with(|t| t.borrow_mut().take()).is_some();
    match out {
        Ok(_) if unused => Err(ProtocolError::Malformed(
            "a frame's values have no place in its message".into(),
        )),
        other => other,
    }
}

/// Messages whose large values may travel apart, after the rest of the
/// message (a frame's tail): the values are the message's last field.
pub trait ValueTail {
    /// The values' bytes (native `f32`s), if the message carries any.
    fn tail(&self) -> Option<&[u8]>;
    /// Takes the values out as bytes, leaving none in the message.
    fn take_tail(&mut self) -> Bytes;
    /// Puts values held apart from the message into it, to be sent inside
    /// it; nothing for a message that holds its own.
    fn inline_tail(&mut self) {}
}

/// `f32` values as the bytes of a [`Bytes`], without a copy.
pub(crate) struct F32Owner(pub(crate) Vec<f32>);

impl AsRef<[u8]> for F32Owner {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// The values of a response, if it carries some.
fn response_values(m: &mut ToClient) -> Option<&mut ValueBatch> {
    match m {
        ToClient::Response {
            result: Ok(PeerResponse::Values(v)),
            ..
        } => Some(v),
        _ => None,
    }
}

/// The values of a write request, if it carries some.
fn request_values(m: &mut ToOwner) -> Option<&mut ValueBatch> {
    match m {
        ToOwner::Request {
            req: PeerRequest::Put { values: v, .. } | PeerRequest::Update { deltas: v, .. },
            ..
        } => Some(v),
        _ => None,
    }
}

impl ValueTail for ToClient {
    fn tail(&self) -> Option<&[u8]> {
        match self {
            ToClient::Response {
                result: Ok(PeerResponse::Values(v)),
                ..
            } => Some(bytemuck::cast_slice(&v.data)),
            _ => None,
        }
    }
    fn take_tail(&mut self) -> Bytes {
        response_values(self).map_or_else(Bytes::new, |v| {
            Bytes::from_owner(F32Owner(std::mem::take(&mut v.data)))
        })
    }
}

impl ValueTail for ToOwner {
    fn tail(&self) -> Option<&[u8]> {
        match self {
            ToOwner::Request {
                req: PeerRequest::Put { values: v, .. } | PeerRequest::Update { deltas: v, .. },
                ..
            } => Some(bytemuck::cast_slice(&v.data)),
            _ => None,
        }
    }
    fn take_tail(&mut self) -> Bytes {
        request_values(self).map_or_else(Bytes::new, |v| {
            Bytes::from_owner(F32Owner(std::mem::take(&mut v.data)))
        })
    }
}

/// A request to write whose values are held apart from it, shared with
/// whoever submitted them: `values`, when set, are the bytes (native `f32`s)
/// of the request's value batch, whose own `data` is empty meanwhile (its
/// `lens` are set). A frame writer sends them as the frame's tail straight
/// from where they lie, or puts them into the request
/// ([`ValueTail::inline_tail`]) to send it whole.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The message.
    pub msg: ToOwner,
    /// Its values, if held apart.
    pub values: Option<Bytes>,
}

impl From<ToOwner> for Outgoing {
    fn from(msg: ToOwner) -> Self {
        Outgoing { msg, values: None }
    }
}

impl ValueTail for Outgoing {
    fn tail(&self) -> Option<&[u8]> {
        match &self.values {
            Some(b) => Some(b),
            None => self.msg.tail(),
        }
    }
    fn take_tail(&mut self) -> Bytes {
        match self.values.take() {
            Some(b) => b,
            None => self.msg.take_tail(),
        }
    }
    fn inline_tail(&mut self) {
        if let Some(b) = self.values.take()
            && let Some(v) = request_values(&mut self.msg)
        {
            v.data = bytemuck::pod_collect_to_vec(&b);
        }
    }
}

impl Serialize for Outgoing {
    /// The message with its values in it (copied in if they are held apart;
    /// a frame writer puts them in first or sends them as a tail).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.values.is_none() {
            return self.msg.serialize(s);
        }
        let mut whole = self.clone();
        whole.inline_tail();
        whole.msg.serialize(s)
    }
}

/// f32 values as little-endian bytes (borrowed on little-endian machines).
pub fn f32s_to_le_bytes(v: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(v))
    } else {
        std::borrow::Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// Little-endian bytes back to f32 values (one copy).
pub fn le_bytes_to_f32s(b: &[u8]) -> Vec<f32> {
    if cfg!(target_endian = "little") {
        bytemuck::pod_collect_to_vec(b)
    } else {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_batch_round_trip() {
        let mut b = ValueBatch::default();
        b.push(&[1.0, -2.5]);
        b.push(&[]);
        b.push(&[f32::MAX]);
        let bytes = postcard::to_allocvec(&b).unwrap();
        let back: ValueBatch = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, b);
        let vals: Vec<&[f32]> = back.iter().collect();
        assert_eq!(vals, vec![&[1.0, -2.5][..], &[][..], &[f32::MAX][..]]);
    }

    #[test]
    fn value_batch_lengths_checked() {
        let bad = ValueBatch {
            lens: vec![3],
            data: vec![1.0],
        };
        let bytes = postcard::to_allocvec(&bad).unwrap();
        assert!(postcard::from_bytes::<ValueBatch>(&bytes).is_err());
    }
}
