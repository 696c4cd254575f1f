//! In-process emulation of a slower container: the local runtime's
//! `process` emulation mechanism (`[emulation]` in the configuration), for
//! machines where namespaces, `tc` and cgroups are not available.
//!
//! This module owns the process-wide [`Throttle`], installed once when the
//! evaluator starts ([`install`]) from what its resource manager put in its
//! environment ([`ENV_CPU`], [`ENV_BANDWIDTH`]):
//!
//! - **CPU share**: [`stretch_compute`] makes a worker's mini-batch compute
//!   take `1 / share` of its time by sleeping `(1 / share − 1) ×` the compute
//!   time after it (sleeping, so the core is free for others, as under a
//!   cgroup quota); [`cpu_share`] scales the CPU calibration the same way.
//!   Serving requests and moving blocks are not slowed.
//! - **Bandwidth**: [`Throttled`] wraps every data-plane connection; all
//!   reads draw from one token bucket and all writes from another, so the
//!   evaluator receives and sends at most the bandwidth, whatever the number
//!   of connections. The control channel is not limited.
//!
//! Without an installed throttle everything passes through, at the cost of
//! one atomic load per read or write.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Environment variable: this container's CPU share, in cores.
pub const ENV_CPU: &str = "CRUISE_EMULATE_CPU";
/// Environment variable: this container's bandwidth in each direction,
/// bytes per second.
pub const ENV_BANDWIDTH: &str = "CRUISE_EMULATE_BANDWIDTH";

/// Burst of the token buckets: a few frames' worth.
const BURST_BYTES: f64 = 64.0 * 1024.0;
/// Compute stretches shorter than this are owed and added to the next one
/// (the timer's resolution is a millisecond).
const MIN_SLEEP: Duration = Duration::from_millis(2);

/// What this container is limited to.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Throttle {
    /// Cores; `None`: unlimited.
    pub cpu: Option<f64>,
    /// Bytes per second in each direction; `None`: unlimited.
    pub bytes_per_sec: Option<f64>,
}

impl Throttle {
    /// Whether it limits anything.
    pub fn is_limited(&self) -> bool {
        self.cpu.is_some() || self.bytes_per_sec.is_some()
    }
}

struct State {
    throttle: Throttle,
    read: Option<Bucket>,
    write: Option<Bucket>,
    /// Compute stretch owed (nanoseconds; negative: overslept).
    owed_ns: AtomicI64,
}

static STATE: OnceLock<State> = OnceLock::new();

/// Installs this process's throttle. Once per process: a second, different
/// throttle is refused (returns the one in place).
pub fn install(throttle: Throttle) -> Result<(), Throttle> {
    let bucket = |r: Option<f64>| r.filter(|r| *r > 0.0).map(Bucket::new);
    let state = STATE.get_or_init(|| State {
        throttle,
        read: bucket(throttle.bytes_per_sec),
        write: bucket(throttle.bytes_per_sec),
        owed_ns: AtomicI64::new(0),
    });
    if state.throttle == throttle {
        Ok(())
    } else {
        Err(state.throttle)
    }
}

/// The installed throttle (unlimited if none).
pub fn installed() -> Throttle {
    STATE.get().map(|s| s.throttle).unwrap_or_default()
}

/// The CPU share, at most one core (1.0 when unlimited).
pub fn cpu_share() -> f64 {
    installed().cpu.map_or(1.0, |c| c.min(1.0))
}

/// Called after `compute` of work: sleeps so that the work took `1 / share`
/// as long. Short stretches are owed and paid with the next one.
pub async fn stretch_compute(compute: Duration) {
    let Some(state) = STATE.get() else {
        return;
    };
    let share = cpu_share();
    if share >= 1.0 {
        return;
    }
    let extra = compute.as_secs_f64() * (1.0 / share - 1.0);
    let owed = state
        .owed_ns
        .fetch_add((extra * 1e9) as i64, Ordering::Relaxed)
        + (extra * 1e9) as i64;
    if owed < MIN_SLEEP.as_nanos() as i64 {
        return;
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_nanos(owed as u64)).await;
    state
        .owed_ns
        .fetch_sub(t0.elapsed().as_nanos() as i64, Ordering::Relaxed);
}

/// A token bucket shared by every connection of one direction.
struct Bucket {
    rate: f64,
    /// (tokens, when last refilled); tokens go negative on debt.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: f64) -> Bucket {
        Bucket {
            rate,
            state: Mutex::new((BURST_BYTES, Instant::now())),
        }
    }

    /// `Ok(n)`: up to `n` bytes may move now (debit them with
    /// [`Bucket::spend`]); `Err(d)`: wait `d` first.
    fn grant(&self, want: usize) -> Result<usize, Duration> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        g.0 = (g.0 + now.duration_since(g.1).as_secs_f64() * self.rate).min(BURST_BYTES);
        g.1 = now;
        if g.0 > 0.0 {
            Ok(want.min(BURST_BYTES as usize).max(1))
        } else {
            Err(Duration::from_secs_f64(-g.0 / self.rate).max(Duration::from_micros(100)))
        }
    }

    fn spend(&self, n: usize) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.0 -= n as f64;
    }
}

/// A connection whose reads and writes are paced by the installed
/// throttle's buckets (passes through when there is none).
pub struct Throttled<S> {
    inner: S,
    read_wait: Option<Pin<Box<Sleep>>>,
    write_wait: Option<Pin<Box<Sleep>>>,
}

impl<S> Throttled<S> {
    /// Wraps a connection.
    pub fn new(inner: S) -> Throttled<S> {
        Throttled {
            inner,
            read_wait: None,
            write_wait: None,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped connection, unwrapped (a bulk transfer moves its
    /// connection to a thread of its own and wraps it again there).
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// Waits in `wait` until `bucket` grants bytes; returns how many.
fn poll_grant(
    bucket: &Bucket,
    wait: &mut Option<Pin<Box<Sleep>>>,
    want: usize,
    cx: &mut Context<'_>,
) -> Poll<usize> {
    loop {
        if let Some(w) = wait {
            ready!(w.as_mut().poll(cx));
            *wait = None;
        }
        match bucket.grant(want) {
            Ok(n) => return Poll::Ready(n),
            Err(d) => *wait = Some(Box::pin(tokio::time::sleep(d))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Throttled<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(bucket) = STATE.get().and_then(|s| s.read.as_ref()) else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let n = ready!(poll_grant(bucket, &mut this.read_wait, buf.remaining(), cx));
        // At most the grant: what waits in the socket's buffer beyond it is
        // read later, at the bucket's pace.
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(n.min(buf.remaining())));
        let r = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut part));
        let got = part.filled().len();
        buf.advance(got);
        bucket.spend(got);
        Poll::Ready(r)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Throttled<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(bucket) = STATE.get().and_then(|s| s.write.as_ref()) else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        let n = ready!(poll_grant(bucket, &mut this.write_wait, buf.len(), cx));
        let r = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..n.min(buf.len())]));
        if let Ok(written) = &r {
            bucket.spend(*written);
        }
        Poll::Ready(r)
    }

    /// Vectored writes pass through when nothing is throttled (a bulk
    /// transfer writes a frame's header and its payload in one system
    /// call); throttled, the first buffer is written as `poll_write` would.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if STATE.get().and_then(|s| s.write.as_ref()).is_none() {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        Pin::new(this).poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_paces_to_its_rate() {
        let b = Bucket::new(1e6);
        // The burst goes at once, then debt makes the caller wait.
        let n = b.grant(1 << 20).unwrap();
        assert_eq!(n, BURST_BYTES as usize);
        b.spend(n);
        b.spend(100_000);
        let wait = b.grant(10).unwrap_err();
        assert!(
            wait > Duration::from_millis(80) && wait <= Duration::from_millis(101),
            "{wait:?}"
        );
    }

    #[test]
    fn throttle_describes_its_limits() {
        assert!(!Throttle::default().is_limited());
        assert!(
            Throttle {
                cpu: Some(0.5),
                bytes_per_sec: None
            }
            .is_limited()
        );
    }
}
