//! Benchmark: control-channel small-message rate. Heartbeat-sized
//! `EvalToAm` frames go through the real codec and the real writer task
//! (`protocol::spawn_writer`, as the evaluator sends them) over loopback TCP
//! and are decoded by a `Framed` reader, as the AM reads them. The reference,
//! measured in the same run on a socket pair made the same way: raw
//! length-prefixed writes of the same number of bytes per message through a
//! buffered writer, read back with `read_exact`.
//!
//! ```text
//! cargo run --release -p cruise-integration --bin bench-control [-- MESSAGES]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{Encoder, Framed};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_conf::ChannelConfig;
use cruise_container::protocol::{
    AmToEval, EvalToAm, Faults, FrameCodec, FrameOptions, spawn_writer,
};
use cruise_integration::bench::{Row, machine_note, median, print_table};

const REPS: usize = 5;

fn heartbeat(i: u64) -> EvalToAm {
    EvalToAm::Heartbeat {
        rss_bytes: 48 << 20 | i & 0xfff,
        peak_rss_bytes: 61 << 20,
        store_bytes: 12 << 20,
    }
}

async fn pair() -> anyhow::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let a = TcpStream::connect(l.local_addr()?).await?;
    let (b, _) = l.accept().await?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

/// Messages per second through codec + writer task + framed reader.
async fn codec_rate(n: u64, opts: FrameOptions) -> anyhow::Result<f64> {
    let (a, b) = pair().await?;
    let tracker = TaskTracker::new();
    let sink = Framed::new(a, FrameCodec::<EvalToAm, AmToEval>::new(opts));
    let (tx, writer) = spawn_writer(
        sink,
        1024,
        Faults::default(),
        CancellationToken::new(),
        &tracker,
        "bench control".into(),
        None,
    );
    let mut reader = Framed::new(b, FrameCodec::<AmToEval, EvalToAm>::new(opts));
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            if tx.send(heartbeat(i)).await.is_err() {
                break;
            }
        }
    });
    for i in 0..n {
        match reader.next().await {
            Some(Ok(EvalToAm::Heartbeat { .. })) => {}
            other => bail!("message {i}: {other:?}"),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    sender.await?;
    writer.await?;
    Ok(n as f64 / secs)
}

/// Messages per second of raw `len + bytes` writes of `frame_len` bytes each.
async fn raw_rate(n: u64, frame: &[u8]) -> anyhow::Result<f64> {
    let (a, b) = pair().await?;
    let body = frame.to_vec();
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        let mut w = BufWriter::new(a);
        for _ in 0..n {
            w.write_all(&body).await?;
        }
        w.flush().await?;
        Ok::<_, std::io::Error>(())
    });
    let mut r = BufReader::new(b);
    let mut buf = vec![0u8; frame.len()];
    for _ in 0..n {
        let mut len = [0u8; 4];
        r.read_exact(&mut len).await?;
        let len = u32::from_be_bytes(len) as usize;
        if len + 4 != frame.len() {
            bail!("raw frame of {len} bytes");
        }
        r.read_exact(&mut buf[..len]).await?;
    }
    let secs = t0.elapsed().as_secs_f64();
    sender.await??;
    Ok(n as f64 / secs)
}

async fn run(n: u64) -> anyhow::Result<()> {
    println!("## Control-channel small-message rate ({})", machine_note());
    let opts = FrameOptions::control(&ChannelConfig::default());
    let mut frame = BytesMut::new();
    FrameCodec::<EvalToAm, AmToEval>::new(opts)
        .encode(heartbeat(0), &mut frame)
        .context("encoding a heartbeat")?;
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    // Untimed warm-up, then interleaved repetitions.
    codec_rate(n / 10, opts).await?;
    for _ in 0..REPS {
        ours.push(codec_rate(n, opts).await?);
        raw.push(raw_rate(n, &frame).await?);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (ours, raw) = (median(&mut ours), median(&mut raw));
    print_table(
        &format!(
            "Heartbeat frames ({} bytes on the wire), {n} messages per run, median of {REPS}",
            frame.len()
        ),
        &[Row {
            figure: "EvalToAm::Heartbeat via codec + writer task → Framed reader".into(),
            value: format!("{:.0} msg/s", ours),
            reference: format!("raw length-prefixed writes {:.0} msg/s", raw),
            ratio: Some(ours / raw),
            target: "— (none set)".into(),
            pass: None,
        }],
    );
    Ok(())
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: bench-control [MESSAGES]

Round trips on the authenticated control channel (framing, lz4, HMAC)
against a plain TCP echo in the same run.

  MESSAGES   messages per run (default 200000)
";

fn main() -> anyhow::Result<()> {
    cruise_integration::bench::exit_on_help(USAGE);
    let n: u64 = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .with_context(|| format!("MESSAGES {a:?} is not a number"))?,
        None => 200_000,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(n))
}
