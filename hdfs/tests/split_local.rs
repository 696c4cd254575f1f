//! Split reading over real local files: unit cases and the property that any
//! content cut at any points yields every record exactly once, in order.

use bytes::Bytes;
use cruise_hdfs::{
    FileSystem, Split, line_number_at, plan_splits, read_split, read_split_with_read_ahead,
};
use proptest::prelude::*;

/// A file as generated: its lines and how each is terminated.
#[derive(Debug, Clone)]
struct Content {
    lines: Vec<String>,
    crlf: Vec<bool>,
    trailing_newline: bool,
}

impl Content {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, l) in self.lines.iter().enumerate() {
            out.extend_from_slice(l.as_bytes());
            let last = i + 1 == self.lines.len();
            if !last || self.trailing_newline {
                out.extend_from_slice(if self.crlf[i] { b"\r\n" } else { b"\n" });
            }
        }
        out
    }

    /// The records a reader must produce, computed from the generator's lines.
    fn expected(&self) -> Vec<String> {
        let mut lines = self.lines.clone();
        if !self.trailing_newline && lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop(); // an unterminated empty last line is no record
        }
        lines
    }
}

fn content() -> impl Strategy<Value = Content> {
    (
        prop::collection::vec("[ab é\t]{0,12}", 0..25),
        prop::collection::vec(any::<bool>(), 25),
        any::<bool>(),
    )
        .prop_map(|(lines, crlf, trailing_newline)| Content {
            lines,
            crlf,
            trailing_newline,
        })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Reads all splits and returns the records in split order.
async fn read_all(fs: &FileSystem, splits: &[Split], read_ahead: u64) -> Vec<String> {
    let mut out = Vec::new();
    for s in splits {
        let data = read_split_with_read_ahead(fs, s, read_ahead).await.unwrap();
        for (off, r) in data.records_with_offsets() {
            assert!(
                off >= s.start && off < s.end.max(s.start + 1),
                "record at {off} outside {s:?}"
            );
            out.push(String::from_utf8(r.to_vec()).unwrap());
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_record_once_in_order(
        c in content(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        read_ahead in 1u64..9,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        let bytes = c.bytes();
        std::fs::write(&path, &bytes).unwrap();
        let uri = path.display().to_string();
        let len = bytes.len() as u64;
        let mut points: Vec<u64> = cuts.iter().map(|i| i.index(bytes.len() + 1) as u64).collect();
        points.push(0);
        points.push(len);
        points.sort_unstable();
        let splits: Vec<Split> = points
            .windows(2)
            .map(|w| Split { uri: uri.clone(), start: w[0], end: w[1] })
            .collect();
        let fs = FileSystem::default();
        let got = rt().block_on(read_all(&fs, &splits, read_ahead));
        prop_assert_eq!(got, c.expected());
    }

    #[test]
    fn planned_splits_cover_several_files(
        files in prop::collection::vec(content(), 1..4),
        n in 1usize..12,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        for (i, c) in files.iter().enumerate() {
            std::fs::write(dir.path().join(format!("part-{i:05}")), c.bytes()).unwrap();
            expected.extend(c.expected());
        }
        std::fs::write(dir.path().join("_SUCCESS"), b"hidden\n").unwrap();
        std::fs::write(dir.path().join(".part-0.crc"), b"hidden\n").unwrap();
        let fs = FileSystem::default();
        let got = rt().block_on(async {
            let listed = fs.list(&dir.path().display().to_string()).await.unwrap();
            assert_eq!(listed.len(), files.len());
            let splits = plan_splits(&listed, n);
            read_all(&fs, &splits, 4096).await
        });
        prop_assert_eq!(got, expected);
    }
}

#[tokio::test]
async fn long_record_crossing_many_splits_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.txt");
    let long = "x".repeat(300_000);
    std::fs::write(&path, format!("a\n{long}\r\nb")).unwrap();
    let uri = format!("file://{}", path.display());
    let fs = FileSystem::default();
    let len = fs.status(&uri).await.unwrap().len;
    let splits: Vec<Split> = (0..10)
        .map(|i| Split {
            uri: uri.clone(),
            start: len * i / 10,
            end: len * (i + 1) / 10,
        })
        .collect();
    let mut recs = Vec::new();
    let mut nonempty = 0;
    for s in &splits {
        let d = read_split(&fs, s).await.unwrap();
        if !d.bytes.is_empty() {
            nonempty += 1;
        }
        recs.extend(d.records().map(|r| r.len()));
    }
    assert_eq!(recs, vec![1, 300_000, 1]);
    assert_eq!(
        nonempty, 2,
        "only the first split and the one holding 'b' have records"
    );
}

#[tokio::test]
async fn split_data_offsets_and_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.txt");
    std::fs::write(&path, "l1\nl2\r\n\nl4\nl5").unwrap();
    let uri = path.display().to_string();
    let fs = FileSystem::default();
    let d = read_split(
        &fs,
        &Split {
            uri: uri.clone(),
            start: 4,
            end: 9,
        },
    )
    .await
    .unwrap();
    // Records starting in [4, 9): "\n" at 7 (empty line 3) and "l4" at 8.
    assert_eq!(d.start_offset, 7);
    assert_eq!(d.bytes, Bytes::from_static(b"\nl4\n"));
    let lines: Vec<u64> = {
        let mut v = Vec::new();
        for (off, _) in d.records_with_offsets() {
            v.push(line_number_at(&fs, &uri, off).await.unwrap());
        }
        v
    };
    assert_eq!(lines, vec![3, 4]);
    assert_eq!(line_number_at(&fs, &uri, 0).await.unwrap(), 1);
    assert_eq!(line_number_at(&fs, &uri, 12).await.unwrap(), 5);
    // A split past the end of the file is empty, not an error.
    let d = read_split(
        &fs,
        &Split {
            uri: uri.clone(),
            start: 100,
            end: 200,
        },
    )
    .await
    .unwrap();
    assert!(d.bytes.is_empty());
    // A reversed split is an error naming the file.
    let err = read_split(
        &fs,
        &Split {
            uri: uri.clone(),
            start: 5,
            end: 2,
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains(&uri), "{err}");
    // A missing file is a not-found error naming the path.
    let err = read_split(
        &fs,
        &Split {
            uri: format!("{uri}.missing"),
            start: 0,
            end: 1,
        },
    )
    .await
    .unwrap_err();
    assert!(
        err.is_not_found() && err.to_string().contains("f.txt.missing"),
        "{err}"
    );
}
