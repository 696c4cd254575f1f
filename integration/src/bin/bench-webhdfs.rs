//! Benchmark: WebHDFS read throughput through `cruise-sim webhdfs` (our
//! client: OPEN on the namenode, the redirect to the datanode, the body
//! streamed back) against reading the same local file directly, in the
//! same run. The file is read the way the job reads its input: as
//! record-sized byte ranges of one split each (`SPLITS` ranges, one after
//! the other), and whole.
//!
//! ```text
//! cargo build --release -p cruise-sim -p cruise-integration
//! cargo run --release -p cruise-integration --bin bench-webhdfs [-- SIZE_MIB]
//! ```
//!
//! With `CRUISE_HADOOP_DIR` set (a real Hadoop started by
//! `integration/hadoop/start.sh DIR`), the same file is also written to real
//! HDFS and read from its NameNode and DataNode the same way, in the same
//! interleaved rounds.

use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;

use cruise_hdfs::FileSystem;
use cruise_integration::Sim;
use cruise_integration::bench::{Row, machine_note, mb_s, median, print_table};

const REPS: usize = 5;
const SPLITS: u64 = 8;

async fn webhdfs_read(fs: &FileSystem, uri: &str, len: u64, splits: u64) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let step = len.div_ceil(splits);
    let mut got = 0u64;
    let mut off = 0;
    while off < len {
        let n = step.min(len - off);
        got += fs.read_range(uri, off, n).await?.len() as u64;
        off += n;
    }
    anyhow::ensure!(got == len, "read {got} of {len} bytes");
    Ok(len as f64 / t0.elapsed().as_secs_f64())
}

fn local_read(path: &std::path::Path, len: u64, splits: u64) -> anyhow::Result<f64> {
    use std::io::{Read, Seek, SeekFrom};
    let t0 = Instant::now();
    let step = len.div_ceil(splits);
    let mut f = std::fs::File::open(path)?;
    let mut got = 0u64;
    let mut off = 0;
    while off < len {
        let n = step.min(len - off);
        let mut buf = vec![0u8; n as usize];
        f.seek(SeekFrom::Start(off))?;
        f.read_exact(&mut buf)?;
        got += buf.len() as u64;
        off += n;
    }
    anyhow::ensure!(got == len, "read {got} of {len} bytes");
    Ok(len as f64 / t0.elapsed().as_secs_f64())
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-webhdfs [SIZE_MIB]

Read throughput from WebHDFS (the cruise-sim namenode and datanode;
build it first: cargo build --release -p cruise-sim -p cruise-integration).

  SIZE_MIB   file size in MiB (default 256)
";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let mib: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse().with_context(|| format!("SIZE_MIB: {a:?}"))?,
        None => 256,
    };
    println!("## WebHDFS read throughput ({})", machine_note());
    let sim = Sim::start("webhdfs", &[]).context("starting cruise-sim webhdfs")?;
    let fs = FileSystem::default();
    let uri = format!("webhdfs://{}/bench/data.bin", sim.address());
    let len = mib << 20;
    // Text-like bytes (the input is text); written through WebHDFS CREATE.
    let data: Vec<u8> = (0..len)
        .map(|i| b"0123456789 :\n"[(i % 13) as usize])
        .collect();
    fs.create(&uri, Bytes::from(data), true)
        .await
        .context("writing the file through WebHDFS")?;
    let local = sim.dir.path().join("root/bench/data.bin");
    let meta = std::fs::metadata(&local)
        .with_context(|| format!("the simulator's file {}", local.display()))?;
    anyhow::ensure!(
        meta.len() == len,
        "{} has {} bytes",
        local.display(),
        meta.len()
    );

    let real = match cruise_integration::hadoop::RealHadoop::from_env("bench-webhdfs (real HDFS)")?
    {
        Some(h) => {
            let real_uri = format!("webhdfs://{}/tmp/cruise-bench/data.bin", h.nn_http);
            let data: Vec<u8> = (0..len)
                .map(|i| b"0123456789 :\n"[(i % 13) as usize])
                .collect();
            fs.create(&real_uri, Bytes::from(data), true)
                .await
                .with_context(|| format!("writing the file to real HDFS at {real_uri}"))?;
            Some(real_uri)
        }
        None => None,
    };

    let mut rows = Vec::new();
    for splits in [SPLITS, 1] {
        // Untimed warm-up (page cache, connection pool), then interleaved runs.
        webhdfs_read(&fs, &uri, len, splits).await?;
        local_read(&local, len, splits)?;
        if let Some(r) = &real {
            webhdfs_read(&fs, r, len, splits).await?;
        }
        let (mut ours, mut theirs, mut hadoop) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..REPS {
            ours.push(webhdfs_read(&fs, &uri, len, splits).await?);
            theirs.push(local_read(&local, len, splits)?);
            if let Some(r) = &real {
                hadoop.push(webhdfs_read(&fs, r, len, splits).await?);
            }
        }
        let (o, t) = (median(&mut ours), median(&mut theirs));
        if !hadoop.is_empty() {
            let hm = median(&mut hadoop);
            rows.push(Row {
                figure: format!(
                    "real HDFS: read {mib} MiB as {splits} range{}",
                    if splits == 1 { "" } else { "s" }
                ),
                value: format!("{:.0} MB/s", mb_s(hm)),
                reference: format!("local file {:.0} MB/s", mb_s(t)),
                ratio: Some(hm / t),
                target: "— (report)".into(),
                pass: None,
            });
        }
        rows.push(Row {
            figure: format!(
                "read {mib} MiB as {splits} range{}",
                if splits == 1 { "" } else { "s" }
            ),
            value: format!("{:.0} MB/s", mb_s(o)),
            reference: format!("local file {:.0} MB/s", mb_s(t)),
            ratio: Some(o / t),
            target: "— (report)".into(),
            pass: None,
        });
    }
    print_table(
        &format!(
            "cruise-hdfs via cruise-sim webhdfs (and real HDFS, if CRUISE_HADOOP_DIR is set) vs the same local file (page cache), median of {REPS}"
        ),
        &rows,
    );
    Ok(())
}
