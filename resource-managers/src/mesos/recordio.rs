//! RecordIO, the framing of the Mesos event stream (`PROTOCOLS.md` §5.2):
//!
//! ```text
//! record = <decimal byte length> "\n" <exactly that many bytes>
//! ```
//!
//! Record boundaries have nothing to do with HTTP chunk boundaries, so the
//! decoder buffers: an incomplete length line or record is "not enough bytes
//! yet", never an error. A length that is not a decimal number, is zero, or
//! is larger than the limit is a [`RecordIoError`], after which the stream
//! cannot be trusted.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// Longest length prefix accepted (a uint64 has at most 20 digits).
const MAX_DIGITS: usize = 20;

/// Errors of the RecordIO decoder.
#[derive(Debug, thiserror::Error)]
pub enum RecordIoError {
    /// The length line is not a decimal number.
    #[error("RecordIO: bad length prefix {0:?}")]
    BadLength(String),
    /// The record is larger than allowed.
    #[error("RecordIO: record of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The stream ended inside a record.
    #[error("RecordIO: stream ended inside a record ({0} bytes left over)")]
    Truncated(usize),
    /// Reading the stream failed.
    #[error("RecordIO: reading the stream: {0}")]
    Io(#[from] std::io::Error),
}

/// Decodes RecordIO records into their payloads.
#[derive(Debug, Clone)]
pub struct RecordIoCodec {
    max_record: usize,
    /// Length of the record being read, once its prefix is parsed.
    pending: Option<usize>,
}

impl RecordIoCodec {
    /// A decoder that refuses records larger than `max_record` bytes.
    pub fn new(max_record: usize) -> Self {
        RecordIoCodec {
            max_record,
            pending: None,
        }
    }
}

impl Decoder for RecordIoCodec {
    type Item = Bytes;
    type Error = RecordIoError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordIoError> {
        let len = match self.pending {
            Some(n) => n,
            None => {
                let Some(nl) = src.iter().take(MAX_DIGITS + 1).position(|&b| b == b'\n') else {
                    if src.len() > MAX_DIGITS {
                        return Err(RecordIoError::BadLength(
                            String::from_utf8_lossy(&src[..MAX_DIGITS.min(src.len())]).into(),
                        ));
                    }
                    if let Some(b) = src.iter().find(|b| !b.is_ascii_digit()) {
                        return Err(RecordIoError::BadLength(format!(
                            "unexpected byte {:?}",
                            char::from(*b)
                        )));
                    }
                    return Ok(None);
                };
                let digits = &src[..nl];
                let text = std::str::from_utf8(digits)
                    .ok()
                    .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| {
                        RecordIoError::BadLength(String::from_utf8_lossy(digits).into())
                    })?;
                let len: u64 = text
                    .parse()
                    .map_err(|_| RecordIoError::BadLength(text.to_string()))?;
                if len == 0 {
                    return Err(RecordIoError::BadLength("0".into()));
                }
                if len > self.max_record as u64 {
                    return Err(RecordIoError::TooLarge {
                        len,
                        max: self.max_record,
                    });
                }
                src.advance(nl + 1);
                let len = len as usize;
                self.pending = Some(len);
                len
            }
        };
        if src.len() < len {
            src.reserve(len - src.len());
            return Ok(None);
        }
        self.pending = None;
        Ok(Some(src.split_to(len).freeze()))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordIoError> {
        match self.decode(src)? {
            Some(r) => Ok(Some(r)),
            None if src.is_empty() && self.pending.is_none() => Ok(None),
            None => Err(RecordIoError::Truncated(src.len())),
        }
    }
}

/// Encodes one record (for tests and tools).
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut v = format!("{}\n", payload.len()).into_bytes();
    v.extend_from_slice(payload);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(chunks: &[&[u8]], max: usize) -> Result<Vec<Bytes>, RecordIoError> {
        let mut c = RecordIoCodec::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for ch in chunks {
            buf.extend_from_slice(ch);
            while let Some(r) = c.decode(&mut buf)? {
                out.push(r);
            }
        }
        while let Some(r) = c.decode_eof(&mut buf)? {
            out.push(r);
        }
        Ok(out)
    }

    #[test]
    fn doc_example() {
        let s = br#"20
{"type":"HEARTBEAT"}5
hello"#;
        let v = decode_all(&[s], 1024).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(&v[0][..], br#"{"type":"HEARTBEAT"}"#);
        assert_eq!(&v[1][..], b"hello");
    }

    #[test]
    fn errors() {
        assert!(matches!(
            decode_all(&[b"x\nabc"], 1024),
            Err(RecordIoError::BadLength(_))
        ));
        assert!(matches!(
            decode_all(&[b"0\n"], 1024),
            Err(RecordIoError::BadLength(_))
        ));
        assert!(matches!(
            decode_all(&[b"2000\n"], 1024),
            Err(RecordIoError::TooLarge { len: 2000, .. })
        ));
        assert!(matches!(
            decode_all(&[b"5\nab"], 1024),
            Err(RecordIoError::Truncated(2))
        ));
        assert!(matches!(
            decode_all(&[b"123456789012345678901234"], 1024),
            Err(RecordIoError::BadLength(_))
        ));
    }

    proptest! {
        /// Any records, split at any points, decode to the same records.
        #[test]
        fn any_chunking(records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..200), 0..20),
                        cuts in proptest::collection::vec(0usize..5000, 0..30)) {
            let mut stream = Vec::new();
            for r in &records {
                stream.extend(encode(r));
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
            cuts.push(0);
            cuts.push(stream.len());
            cuts.sort();
            let chunks: Vec<&[u8]> = cuts.windows(2).map(|w| &stream[w[0]..w[1]]).collect();
            let out = decode_all(&chunks, 1 << 20).unwrap();
            prop_assert_eq!(out.len(), records.len());
            for (a, b) in out.iter().zip(&records) {
                prop_assert_eq!(&a[..], &b[..]);
            }
        }
    }
}
