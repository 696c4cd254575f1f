//! Record-aligned input splits over newline-delimited files.
//!
//! [`plan_splits`] cuts the input into byte ranges of about equal size that
//! never cross files. [`read_split`] turns a range into whole records with the
//! rule Hadoop's line reader uses: a record belongs to the split in which it
//! *starts*. A record starts at offset 0 and after every `\n`; the last record
//! of a split may run past the split's end (it is finished by reading ahead in
//! bounded chunks), and the last record of a file may lack its `\n`. A `\r`
//! before the `\n` is not part of the record.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::error::{HdfsError, Result};
use crate::fs::{FileStatus, FileSystem};

/// A byte range `[start, end)` of one file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Split {
    /// The file's URI (as given by [`FileSystem::list`]).
    pub uri: String,
    /// First byte of the range.
    pub start: u64,
    /// One past the last byte of the range.
    pub end: u64,
}

impl Split {
    /// Length of the byte range.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the byte range is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The whole records that start inside a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitData {
    /// The records' bytes, including their `\n` terminators (the final
    /// record of a file may have none).
    pub bytes: Bytes,
    /// Offset in the file of `bytes[0]` (the first record's start).
    pub start_offset: u64,
}

impl SplitData {
    /// The records, without their `\n` or `\r\n` terminators.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.records_with_offsets().map(|(_, r)| r)
    }

    /// The records with the file offset at which each starts (for
    /// [`line_number_at`] on error paths).
    pub fn records_with_offsets(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        let buf: &[u8] = &self.bytes;
        let base = self.start_offset;
        let mut pos = 0usize;
        std::iter::from_fn(move || {
            if pos >= buf.len() {
                return None;
            }
            let start = pos;
            let (mut rec, next) = match memchr(b'\n', &buf[pos..]) {
                Some(i) => (&buf[pos..pos + i], pos + i + 1),
                None => (&buf[pos..], buf.len()),
            };
            if let [head @ .., b'\r'] = rec {
                rec = head;
            }
            pos = next;
            Some((base + start as u64, rec))
        })
    }
}

/// Plans about `n` splits of about equal size over the given files.
///
/// Directories and empty files are skipped; a split never crosses a file. File
/// `i` of length `len_i` gets `ceil(len_i * n / total)` splits (at most one per
/// byte), so every split is at most about `total / n` bytes and there are
/// between `n` and `n + files - 1` of them (fewer when there are fewer bytes
/// than `n`). `n = 0` is treated as 1.
pub fn plan_splits(files: &[FileStatus], n: usize) -> Vec<Split> {
    let n = n.max(1) as u128;
    let inputs: Vec<&FileStatus> = files.iter().filter(|f| !f.is_dir && f.len > 0).collect();
    let total: u128 = inputs.iter().map(|f| f.len as u128).sum();
    let mut out = Vec::new();
    for f in inputs {
        let len = f.len as u128;
        let k = (len * n).div_ceil(total).clamp(1, len);
        for i in 0..k {
            let start = (i * len / k) as u64;
            let end = ((i + 1) * len / k) as u64;
            out.push(Split {
                uri: f.uri.clone(),
                start,
                end,
            });
        }
    }
    out
}

/// First read-ahead chunk when the last record of a split runs past its end.
pub const DEFAULT_READ_AHEAD: u64 = 64 * 1024;
/// Read-ahead chunks double up to this size.
pub const MAX_READ_AHEAD: u64 = 4 * 1024 * 1024;

/// Reads the whole records that start inside `split` (see the module docs).
pub async fn read_split(fs: &FileSystem, split: &Split) -> Result<SplitData> {
    read_split_with_read_ahead(fs, split, DEFAULT_READ_AHEAD).await
}

/// [`read_split`] with a chosen first read-ahead chunk size (doubling up to
/// [`MAX_READ_AHEAD`]); small values exercise the read-ahead loop in tests.
pub async fn read_split_with_read_ahead(
    fs: &FileSystem,
    split: &Split,
    read_ahead: u64,
) -> Result<SplitData> {
    let empty = |at: u64| SplitData {
        bytes: Bytes::new(),
        start_offset: at,
    };
    if split.start > split.end {
        return Err(HdfsError::Split {
            uri: split.uri.clone(),
            reason: format!("split start {} is after its end {}", split.start, split.end),
        });
    }
    let file_len = fs.status(&split.uri).await?.len;
    let end = split.end.min(file_len);
    if split.start >= end {
        return Ok(empty(split.start));
    }
    // Read one byte before the split to see whether a record starts at `start`.
    let read_from = split.start.saturating_sub(1);
    let head = fs
        .read_range(&split.uri, read_from, end - read_from)
        .await?;
    let head_end = read_from + head.len() as u64; // == end unless the file shrank
    let first = if split.start == 0 {
        0usize
    } else {
        // A record starts after each '\n' at positions [start-1, end-1).
        let searchable = head.len().saturating_sub(1);
        match memchr(b'\n', &head[..searchable]) {
            Some(i) => i + 1,
            None => return Ok(empty(split.start)),
        }
    };
    let start_offset = read_from + first as u64;
    if head.last() == Some(&b'\n') || head_end < end || head_end >= file_len {
        // The last record ends exactly at `end`, or the file ends here.
        return Ok(SplitData {
            bytes: head.slice(first..),
            start_offset,
        });
    }
    // The last record runs past `end`: read ahead until its '\n' or EOF.
    let mut buf = BytesMut::from(&head[first..]);
    let mut pos = head_end;
    let mut chunk = read_ahead.max(1);
    while pos < file_len {
        let want = chunk.min(file_len - pos);
        let more = fs.read_range(&split.uri, pos, want).await?;
        if more.is_empty() {
            break;
        }
        if let Some(i) = memchr(b'\n', &more) {
            buf.extend_from_slice(&more[..=i]);
            break;
        }
        buf.extend_from_slice(&more);
        pos += more.len() as u64;
        if (more.len() as u64) < want {
            break; // the file ended early
        }
        chunk = (chunk * 2).min(MAX_READ_AHEAD);
    }
    Ok(SplitData {
        bytes: buf.freeze(),
        start_offset,
    })
}

/// The 1-based line number of the record at `byte_offset` in `uri`, found by
/// counting `\n` bytes before it. Meant for error messages, so it reads the
/// file up to that offset.
pub async fn line_number_at(fs: &FileSystem, uri: &str, byte_offset: u64) -> Result<u64> {
    const CHUNK: u64 = 1024 * 1024;
    let mut line = 1u64;
    let mut pos = 0u64;
    while pos < byte_offset {
        let want = CHUNK.min(byte_offset - pos);
        let data = fs.read_range(uri, pos, want).await?;
        if data.is_empty() {
            break;
        }
        line += data.iter().filter(|&&b| b == b'\n').count() as u64;
        pos += data.len() as u64;
    }
    Ok(line)
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(uri: &str, len: u64) -> FileStatus {
        FileStatus {
            uri: uri.into(),
            path: uri.into(),
            len,
            is_dir: false,
            modification_time: 0,
            permission: 0o644,
            owner: String::new(),
            group: String::new(),
            replication: 1,
            block_size: 0,
        }
    }

    fn check_cover(files: &[FileStatus], splits: &[Split]) {
        for f in files.iter().filter(|f| f.len > 0 && !f.is_dir) {
            let mut mine: Vec<&Split> = splits.iter().filter(|s| s.uri == f.uri).collect();
            mine.sort_by_key(|s| s.start);
            assert_eq!(mine.first().unwrap().start, 0);
            assert_eq!(mine.last().unwrap().end, f.len);
            for w in mine.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(mine.iter().all(|s| s.end > s.start));
        }
    }

    #[test]
    fn plans_equal_splits_within_files() {
        let mut dir = file("d", 0);
        dir.is_dir = true;
        let files = vec![file("a", 1000), file("empty", 0), dir, file("b", 3000)];
        let splits = plan_splits(&files, 4);
        assert_eq!(
            splits,
            vec![
                Split {
                    uri: "a".into(),
                    start: 0,
                    end: 1000
                },
                Split {
                    uri: "b".into(),
                    start: 0,
                    end: 1000
                },
                Split {
                    uri: "b".into(),
                    start: 1000,
                    end: 2000
                },
                Split {
                    uri: "b".into(),
                    start: 2000,
                    end: 3000
                },
            ]
        );
        for n in 1..40 {
            let files = vec![file("a", 1001), file("b", 17), file("c", 5000)];
            let splits = plan_splits(&files, n);
            check_cover(&files, &splits);
            let total = 6018u64;
            let max = total.div_ceil(n as u64) + 1;
            assert!(splits.iter().all(|s| s.len() <= max), "n={n}: {splits:?}");
            assert!(
                splits.len() >= n && splits.len() < n + 3,
                "n={n}: {}",
                splits.len()
            );
        }
    }

    #[test]
    fn plans_tiny_and_degenerate_inputs() {
        assert!(plan_splits(&[], 3).is_empty());
        assert!(plan_splits(&[file("e", 0)], 3).is_empty());
        let s = plan_splits(&[file("a", 2)], 10);
        assert_eq!(s.len(), 2);
        let s = plan_splits(&[file("a", 10)], 0);
        assert_eq!(
            s,
            vec![Split {
                uri: "a".into(),
                start: 0,
                end: 10
            }]
        );
        let big = plan_splits(&[file("a", u64::MAX / 2), file("b", u64::MAX / 3)], 7);
        check_cover(&[file("a", u64::MAX / 2), file("b", u64::MAX / 3)], &big);
    }

    #[test]
    fn records_strip_terminators() {
        let d = SplitData {
            bytes: Bytes::from_static(b"a\r\n\nbc\r\nlast"),
            start_offset: 10,
        };
        let recs: Vec<(u64, &[u8])> = d.records_with_offsets().collect();
        assert_eq!(
            recs,
            vec![
                (10, &b"a"[..]),
                (13, &b""[..]),
                (14, &b"bc"[..]),
                (18, &b"last"[..])
            ]
        );
        let d = SplitData {
            bytes: Bytes::from_static(b"x\n"),
            start_offset: 0,
        };
        assert_eq!(d.records().collect::<Vec<_>>(), vec![&b"x"[..]]);
    }
}
