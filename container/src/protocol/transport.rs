//! Connection plumbing: the writer task that owns a connection's send half, and
//! fault hooks for tests.
//!
//! Every connection has exactly one writer task, fed by a channel, so that the
//! owner of the connection's state (an event loop) never blocks on a slow socket.
//! The writer stops when its channel closes, when the connection's cancellation
//! token fires, or when [`Faults::break_now`] is called; on a write error it
//! cancels the connection token so the reading side notices at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::{Sink, SinkExt};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ProtocolError;

/// Fault hooks on a connection: tests use them to delay every frame a side
/// sends, or to break the connection abruptly. Production code never sets them;
/// checking them costs a few atomic loads per frame.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    delay_us: AtomicU64,
    request_delay_us: AtomicU64,
    held: AtomicBool,
    broken: AtomicBool,
    notify: Notify,
}

/// `d` in whole microseconds, saturating.
fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

impl Faults {
    /// Delays every frame sent from now on by `d` (zero to stop delaying).
    pub fn set_delay(&self, d: Duration) {
        self.inner.delay_us.store(micros(d), Ordering::Relaxed);
    }

    /// The current delay.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.inner.delay_us.load(Ordering::Relaxed))
    }

    /// Delays the requests this side sends on the data plane (its pulls
    /// and pushes; not the answers it serves, which [`Faults::set_delay`]
    /// delays) by `d` before each write from now on, the requests queued
    /// meanwhile going out with it: a slow worker.
    pub fn set_request_delay(&self, d: Duration) {
        self.inner
            .request_delay_us
            .store(micros(d), Ordering::Relaxed);
    }

    /// The current request delay ([`Faults::set_request_delay`]).
    pub fn request_delay(&self) -> Duration {
        Duration::from_micros(self.inner.request_delay_us.load(Ordering::Relaxed))
    }

    /// Holds every frame not sent yet until [`Faults::release`], as a
    /// partition that heals does: nothing is lost, and the frames go out in
    /// order once released.
    pub fn hold(&self) {
        self.inner.held.store(true, Ordering::SeqCst);
    }

    /// Ends [`Faults::hold`]: the frames held go out.
    pub fn release(&self) {
        self.inner.held.store(false, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Whether frames are held ([`Faults::hold`]).
    pub fn is_held(&self) -> bool {
        self.inner.held.load(Ordering::SeqCst)
    }

    /// Resolves once frames are not held.
    async fn released(&self) {
        self.until(|f| !f.is_held()).await
    }

    /// Resolves once `done` holds; checked again whenever the hooks notify
    /// (a break or a release).
    async fn until(&self, done: impl Fn(&Faults) -> bool) {
        loop {
            let notified = self.inner.notify.notified();
            if done(self) {
                return;
            }
            notified.await;
        }
    }

    /// Breaks every connection using these hooks: they stop reading and
    /// writing as if the network failed.
    pub fn break_now(&self) {
        self.inner.broken.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Undoes [`Faults::break_now`]: connections opened from now on work
    /// (those already broken stay closed). Lets a test fail one transfer and
    /// then carry on.
    pub fn heal(&self) {
        self.inner.broken.store(false, Ordering::SeqCst);
    }

    /// Whether [`Faults::break_now`] was called.
    pub fn is_broken(&self) -> bool {
        self.inner.broken.load(Ordering::SeqCst)
    }

    /// Resolves once the connection is broken.
    pub async fn broken(&self) {
        self.until(Faults::is_broken).await
    }
}

/// Spawns the writer task of a connection on `tracker`. Messages sent on the
/// returned channel are written in order; the task ends (after writing what
/// was queued) when every sender is dropped. `what` names the connection in logs.
///
/// With `cpu`, the CPU the task takes (encoding, writing, taking messages
/// off the queue) is added to it ([`crate::os::CpuTimed`]): two CPU-clock
/// reads each time the task wakes, and it writes everything queued before
/// it sleeps again. Per wake-up and not per call of the sink (three calls
/// a message): the clock is a system call that takes a lock in the
/// kernel, and on a 0.06-CPU server its reads are the container's CPU
/// (BENCHMARKS.md, issue #16, twenty-first pass).
pub fn spawn_writer<S, M>(
    sink: S,
    capacity: usize,
    faults: Faults,
    cancel: CancellationToken,
    tracker: &TaskTracker,
    what: String,
    cpu: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
) -> (mpsc::Sender<M>, tokio::task::JoinHandle<()>)
where
    S: Sink<M, Error = ProtocolError> + Unpin + Send + 'static,
    M: Send + 'static,
{
    let (tx, rx) = mpsc::channel::<M>(capacity);
    let task = write_queued(sink, rx, faults, cancel, what);
    let handle = match cpu {
        Some(ns) => tracker.spawn(crate::os::CpuTimed::new(task, ns)),
        None => tracker.spawn(task),
    };
    (tx, handle)
}

/// A writer task's body: writes what `rx` brings, in order, batching what
/// is already queued into one flush, until every sender is dropped.
async fn write_queued<S, M>(
    mut sink: S,
    mut rx: mpsc::Receiver<M>,
    faults: Faults,
    cancel: CancellationToken,
    what: String,
) where
    S: Sink<M, Error = ProtocolError> + Unpin + Send + 'static,
    M: Send + 'static,
{
    loop {
        let first = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = faults.broken() => break,
            m = rx.recv() => match m {
                Some(m) => m,
                None => break,
            },
        };
        if faults.is_held() {
            tokio::select! {
                _ = faults.released() => {}
                _ = faults.broken() => break,
                _ = cancel.cancelled() => break,
            }
        }
        let delay = faults.delay();
        if !delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => break,
            }
        }
        if let Err(e) = sink.feed(first).await {
            tracing::debug!("{what}: write failed: {e}");
            cancel.cancel();
            return;
        }
        // Batch what is already queued into one flush (not when every
        // frame must be delayed or held on its own).
        while faults.delay().is_zero() && !faults.is_held() {
            let Ok(m) = rx.try_recv() else { break };
            if let Err(e) = sink.feed(m).await {
                tracing::debug!("{what}: write failed: {e}");
                cancel.cancel();
                return;
            }
        }
        if let Err(e) = sink.flush().await {
            tracing::debug!("{what}: flush failed: {e}");
            cancel.cancel();
            return;
        }
    }
    if faults.is_broken() {
        // Simulated network failure: drop the socket without a goodbye.
        cancel.cancel();
        return;
    }
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{FrameCodec, FrameOptions};
    use futures::StreamExt;
    use tokio_util::codec::Framed;

    /// Every message arrives, in order, whether frames are batched or delayed
    /// one by one.
    #[tokio::test]
    async fn writer_delivers_everything_in_order_with_and_without_delay() {
        for delay in [Duration::ZERO, Duration::from_micros(50)] {
            let (a, b) = tokio::io::duplex(1 << 20);
            let tracker = TaskTracker::new();
            let faults = Faults::default();
            faults.set_delay(delay);
            let sink = Framed::new(a, FrameCodec::<u32, u32>::new(FrameOptions::default()));
            let (tx, handle) = spawn_writer(
                sink,
                8,
                faults,
                CancellationToken::new(),
                &tracker,
                "test".into(),
                None,
            );
            let mut rx = Framed::new(b, FrameCodec::<u32, u32>::new(FrameOptions::default()));
            let sender = tokio::spawn(async move {
                for i in 0..500u32 {
                    tx.send(i).await.unwrap();
                }
            });
            for i in 0..500u32 {
                assert_eq!(rx.next().await.unwrap().unwrap(), i, "delay {delay:?}");
            }
            sender.await.unwrap();
            handle.await.unwrap();
            assert!(rx.next().await.is_none(), "closed after the last message");
        }
    }

    /// A timed writer counts the CPU its task spends writing (here a sink
    /// that burns 10 ms a message), and not the sender's.
    #[tokio::test(flavor = "current_thread")]
    async fn a_timed_writer_counts_the_cpu_of_its_writes() {
        use futures::SinkExt;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let tracker = TaskTracker::new();
        let ns = Arc::new(AtomicU64::new(0));
        let sink = futures::sink::drain::<u32>()
            .sink_map_err(|e| -> ProtocolError { match e {} })
            .with(|x: u32| {
                crate::os::tests::burn_cpu(0.01);
                futures::future::ready(Ok::<_, ProtocolError>(x))
            });
        let (tx, handle) = spawn_writer(
            sink,
            8,
            Faults::default(),
            CancellationToken::new(),
            &tracker,
            "test".into(),
            Some(Arc::clone(&ns)),
        );
        for i in 0..3u32 {
            tx.send(i).await.unwrap();
            crate::os::tests::burn_cpu(0.01); // the sender's: not counted
        }
        drop(tx);
        handle.await.unwrap();
        let secs = ns.load(Ordering::Relaxed) as f64 * 1e-9;
        assert!((0.03..0.045).contains(&secs), "{secs}");
    }

    /// Held frames wait (the clock is paused: a timeout fires only when
    /// nothing else can run) and go out in order once released.
    #[tokio::test(start_paused = true)]
    async fn held_frames_go_out_in_order_once_released() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let tracker = TaskTracker::new();
        let faults = Faults::default();
        let sink = Framed::new(a, FrameCodec::<u32, u32>::new(FrameOptions::default()));
        let (tx, handle) = spawn_writer(
            sink,
            8,
            faults.clone(),
            CancellationToken::new(),
            &tracker,
            "test".into(),
            None,
        );
        let mut rx = Framed::new(b, FrameCodec::<u32, u32>::new(FrameOptions::default()));
        tx.send(1).await.unwrap();
        assert_eq!(rx.next().await.unwrap().unwrap(), 1);
        faults.hold();
        for i in 2..5u32 {
            tx.send(i).await.unwrap();
        }
        let held = tokio::time::timeout(Duration::from_secs(3600), rx.next()).await;
        assert!(held.is_err(), "nothing arrives while held: {held:?}");
        faults.release();
        for i in 2..5u32 {
            assert_eq!(rx.next().await.unwrap().unwrap(), i);
        }
        drop(tx);
        handle.await.unwrap();
    }

    #[tokio::test]
    async fn break_now_closes_without_flushing() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let tracker = TaskTracker::new();
        let faults = Faults::default();
        let cancel = CancellationToken::new();
        let sink = Framed::new(a, FrameCodec::<u32, u32>::new(FrameOptions::default()));
        let (tx, handle) = spawn_writer(
            sink,
            8,
            faults.clone(),
            cancel.clone(),
            &tracker,
            "test".into(),
            None,
        );
        let mut rx = Framed::new(b, FrameCodec::<u32, u32>::new(FrameOptions::default()));
        tx.send(1).await.unwrap();
        assert_eq!(rx.next().await.unwrap().unwrap(), 1);
        faults.break_now();
        handle.await.unwrap();
        assert!(cancel.is_cancelled(), "the connection's token fires");
        assert!(rx.next().await.is_none());
    }
}
