//! Facts about this process and machine (Linux `/proc`; zeros elsewhere), the
//! tuning of its memory allocator, and huge-page advice for large buffers.

/// `(resident set size, peak resident set size)` of this process, bytes.
pub fn memory() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Peak resident set size of a process, bytes (0 if unknown).
pub fn peak_rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Relative CPU speed of this process: units of a fixed integer mixing loop
/// per microsecond, measured over `duration` of wall time. Long enough to
/// span several CPU-quota periods (cgroups' default period is 100 ms), so a
/// throttled container measures its share, not a burst.
///
/// Also records the wall seconds one CPU second took during the run
/// ([`wall_per_cpu`]).
pub fn cpu_speed(duration: std::time::Duration) -> f64 {
    let cpu0 = thread_cpu_secs();
    let start = std::time::Instant::now();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rounds: u64 = 0;
    while start.elapsed() < duration {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        rounds += 1;
    }
    std::hint::black_box(x);
    let secs = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_secs() - cpu0;
    if cpu > 0.0 {
        let _ = WALL_PER_CPU.set((secs / cpu).max(1.0));
    }
    rounds as f64 * 10_000.0 / (secs * 1e6)
}

static WALL_PER_CPU: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// Wall seconds per CPU second of a busy thread here, from the first
/// [`cpu_speed`] run: 1 on a free core, `1 / quota` under a CPU quota of
/// less than a core, more on a core shared with other busy processes. 1
/// before any calibration.
pub fn wall_per_cpu() -> f64 {
    WALL_PER_CPU.get().copied().unwrap_or(1.0)
}

/// CPU seconds this process has used, all threads (nanosecond resolution
/// on Linux: the scheduler's run time, the clock [`thread_cpu_secs`] reads
/// per thread); 0 if unknown.
///
/// The same clock as the thread's, so that the process's CPU minus one
/// thread's (`ps::io_secs`, over a mini-batch of a millisecond or less)
/// compares like with like: `getrusage` reports the run time split into
/// user and system time by tick samples, at microsecond resolution.
pub fn process_cpu_secs() -> f64 {
    clock_secs(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU seconds the calling thread has used (nanosecond resolution on
/// Linux); 0 if unknown.
pub fn thread_cpu_secs() -> f64 {
    clock_secs(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_secs(clock: libc::clockid_t) -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct it is given.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return 0.0;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Adds the calling thread's CPU time since `t0` (a [`thread_cpu_secs`]
/// reading) to `ns`, in nanoseconds.
pub fn add_thread_cpu_since(t0: f64, ns: &std::sync::atomic::AtomicU64) {
    let d = ((thread_cpu_secs() - t0).max(0.0) * 1e9) as u64;
    ns.fetch_add(d, std::sync::atomic::Ordering::Relaxed);
}

/// A future whose polls are timed by the polling thread's CPU clock, the
/// nanoseconds added to a shared counter: on a single-threaded runtime, the
/// CPU one task takes (its framing, encoding, decoding and system calls),
/// apart from the runtime's other tasks. Two clock reads per poll (a
/// system call each, some 100 ns).
pub struct CpuTimed<F> {
    inner: std::pin::Pin<Box<F>>,
    ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
    idle: Option<Idle>,
}

/// How a [`CpuTimed`] task tells its productive polls from the others.
struct Idle {
    progress: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<F: std::future::Future> CpuTimed<F> {
    /// Times `inner`'s polls into `ns`.
    pub fn new(inner: F, ns: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        CpuTimed {
            inner: Box::pin(inner),
            ns,
            idle: None,
        }
    }

    /// Times into `ns` only the polls in which `inner` made progress (it
    /// advanced `progress`: a frame decoded, a message written); the others
    /// go to `idle_ns`. Those are a connection woken by part of a frame,
    /// which a slow link delivers a few segments at a time. That CPU goes
    /// on while its task waits for the rest, and is gone once the frames
    /// wait in the socket for it (a worker or server running flat out), so
    /// it is not part of what a request costs there.
    pub fn with_progress(
        inner: F,
        ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
        progress: std::sync::Arc<std::sync::atomic::AtomicU64>,
        idle_ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        CpuTimed {
            inner: Box::pin(inner),
            ns,
            idle: Some(Idle {
                progress,
                ns: idle_ns,
            }),
        }
    }
}

impl<F: std::future::Future> std::future::Future for CpuTimed<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        use std::sync::atomic::Ordering::Relaxed;
        let before = self.idle.as_ref().map(|i| i.progress.load(Relaxed));
        let t0 = thread_cpu_secs();
        let r = self.inner.as_mut().poll(cx);
        match (&self.idle, before) {
            (Some(idle), Some(b)) if r.is_pending() && idle.progress.load(Relaxed) == b => {
                add_thread_cpu_since(t0, &idle.ns)
            }
            _ => add_thread_cpu_since(t0, &self.ns),
        }
        r
    }
}

/// The converse of [`CpuTimed`]: a future whose thread's CPU time between
/// its polls is added to a counter. A future that runs alone on its thread
/// (a worker's loop) spends that time parking and being woken.
pub struct OffPollCpu<F> {
    inner: std::pin::Pin<Box<F>>,
    ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
    last_end: Option<f64>,
}

impl<F: std::future::Future> OffPollCpu<F> {
    /// Times what happens on the thread between `inner`'s polls into `ns`.
    pub fn new(inner: F, ns: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        OffPollCpu {
            inner: Box::pin(inner),
            ns,
            last_end: None,
        }
    }
}

impl<F: std::future::Future> std::future::Future for OffPollCpu<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        if let Some(end) = self.last_end {
            add_thread_cpu_since(end, &self.ns);
        }
        let r = self.inner.as_mut().poll(cx);
        self.last_end = Some(thread_cpu_secs());
        r
    }
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Largest allocation glibc serves from its heap rather than a fresh mapping
/// (its ceiling on 64-bit).
pub(crate) const MMAP_THRESHOLD: i32 = 32 << 20;

/// Tunes glibc's allocator for the data path: buffers up to 32 MiB (frames,
/// value batches, move chunks) come from the heap and freed memory is kept
/// for reuse instead of being unmapped and faulted in again, page by page,
/// by the next request. glibc's defaults adapt the mapping threshold only
/// after a buffer is freed and trim the heap eagerly, which made the kernel
/// clear pages for every large pull and push: with these settings a 64 MiB
/// pull went from 0.26–0.29× to 0.37–0.45× iperf3 on loopback and a push
/// from 0.26–0.31× to 0.40–0.44× (bench-dataplane, two runs each, loaded
/// machine). Memory freed after a peak is not returned until the process
/// ends. Call once, at the start of a process; does nothing on other C
/// libraries.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; called before
        // any other thread exists.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

/// A vector with room for `n` elements. From the allocator's mmap threshold
/// up (32 MiB, see [`tune_allocator`]) the buffer is a fresh mapping of its
/// own, and filling it faults in one 4 KiB page at a time: 16,384 faults
/// for a 64 MiB pull, a third of its time on loopback. Such a buffer is
/// advised to use transparent huge pages (when the kernel's setting is
/// `madvise` or `always`; otherwise the advice does nothing), 512 times
/// fewer faults.
pub fn vec_for_large<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if bytes >= MMAP_THRESHOLD as usize {
        advise_huge_pages(v.as_ptr() as usize, bytes);
    }
    v
}

/// `n` zeros, to be overwritten in place. From the allocator's mmap
/// threshold up the zeros are the kernel's (a fresh mapping, nothing
/// written here), faulted in as the buffer is filled, and advised to use
/// transparent huge pages as [`vec_for_large`]'s are.
pub fn zeroed_vec_for_large(n: usize) -> Vec<f32> {
    let v = vec![0.0f32; n];
    let bytes = n.saturating_mul(4);
    if bytes >= MMAP_THRESHOLD as usize {
        advise_huge_pages(v.as_ptr() as usize, bytes);
    }
    v
}

/// Advises the kernel to back the 2 MiB-aligned part of `[start, start +
/// len)` with huge pages. Best effort: an error only means no advice.
fn advise_huge_pages(start: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let from = start.next_multiple_of(HUGE);
        let to = (start + len) & !(HUGE - 1);
        if to > from {
            // SAFETY: the range lies inside an allocation the caller owns;
            // MADV_HUGEPAGE changes how its pages are backed, never their
            // contents or whether they are mapped.
            unsafe {
                libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

#[cfg(test)]
pub(crate) mod tests {
    /// Spins until the calling thread has used `secs` of CPU.
    pub(crate) fn burn_cpu(secs: f64) {
        let t0 = super::thread_cpu_secs();
        while super::thread_cpu_secs() - t0 < secs {
            std::hint::black_box(0u64);
        }
    }

    #[test]
    fn cpu_clocks_count_work() {
        let (p0, t0) = (super::process_cpu_secs(), super::thread_cpu_secs());
        let start = std::time::Instant::now();
        let mut x = 1u64;
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let (p1, t1) = (super::process_cpu_secs(), super::thread_cpu_secs());
        // Busy for 50 ms of wall time: some CPU time was counted (however
        // loaded the machine), and a thread's own never exceeds the
        // process's beyond the clocks' granularity.
        assert!(t1 - t0 > 0.0, "thread clock did not advance");
        assert!(p1 - p0 > 0.0, "process clock did not advance");
        assert!(t1 - t0 <= (p1 - p0) + 0.011, "{} > {}", t1 - t0, p1 - p0);
    }

    #[test]
    fn large_vectors_are_usable_after_advice() {
        let n = (super::MMAP_THRESHOLD as usize / 4) * 2 + 3;
        let mut v: Vec<f32> = super::vec_for_large(n);
        assert!(v.capacity() >= n);
        v.extend((0..n).map(|i| i as f32));
        assert_eq!(v[n - 1], (n - 1) as f32);
        let small: Vec<u8> = super::vec_for_large(10);
        assert!(small.capacity() >= 10);
    }

    #[test]
    fn cpu_speed_is_positive_and_stable_in_order_of_magnitude() {
        let a = super::cpu_speed(std::time::Duration::from_millis(30));
        let b = super::cpu_speed(std::time::Duration::from_millis(30));
        assert!(a > 0.0 && b > 0.0);
        assert!(a / b < 20.0 && b / a < 20.0, "{a} vs {b}");
    }

    #[test]
    fn memory_is_reported_on_linux() {
        let (rss, peak) = super::memory();
        if cfg!(target_os = "linux") {
            assert!(rss > 0 && peak >= rss, "rss {rss} peak {peak}");
            assert!(super::peak_rss_of(std::process::id()) > 0);
        }
    }

    /// The CPU a timed future burns is counted; time it spends waiting is
    /// not.
    #[test]
    fn timed_futures_count_their_cpu_not_their_waits() {
        let ns = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(super::CpuTimed::new(
            async {
                // 20 ms of this thread's CPU, however long the machine
                // takes to give it.
                let cpu0 = super::thread_cpu_secs();
                let mut x = 0u64;
                while super::thread_cpu_secs() - cpu0 < 0.02 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            },
            std::sync::Arc::clone(&ns),
        ));
        let secs = ns.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9;
        // The 20 ms of spinning, not the 100 ms asleep.
        assert!((0.02..0.08).contains(&secs), "{secs}");
    }

    /// With a progress counter, the polls that did not advance it go to the
    /// idle counter, the others (and the last) to the busy one.
    #[test]
    fn polls_without_progress_are_counted_apart() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        let (busy, idle, progress) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        // Five polls: 10 ms each; the second and fourth make progress, the
        // last completes.
        let mut n = 0;
        let inner = {
            let progress = Arc::clone(&progress);
            std::future::poll_fn(move |cx| {
                n += 1;
                burn_cpu(0.01);
                if n == 2 || n == 4 {
                    progress.fetch_add(1, Relaxed);
                }
                if n == 5 {
                    return std::task::Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            })
        };
        futures::executor::block_on(super::CpuTimed::with_progress(
            inner,
            Arc::clone(&busy),
            progress,
            Arc::clone(&idle),
        ));
        let (busy, idle) = (
            busy.load(Relaxed) as f64 * 1e-9,
            idle.load(Relaxed) as f64 * 1e-9,
        );
        assert!((0.03..0.045).contains(&busy), "busy {busy}");
        assert!((0.02..0.035).contains(&idle), "idle {idle}");
    }

    /// The thread's CPU between polls (parking, being woken) is counted;
    /// its CPU inside polls is not.
    #[test]
    fn off_poll_cpu_counts_only_between_polls() {
        use std::future::Future;
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::task::{Context, Poll};
        let burn = burn_cpu;
        let mut polls = 0;
        let inner = std::future::poll_fn(move |_| {
            polls += 1;
            burn(0.02);
            if polls < 3 {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        });
        let ns = std::sync::Arc::new(AtomicU64::new(0));
        let mut f = super::OffPollCpu::new(inner, std::sync::Arc::clone(&ns));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        burn(0.02); // before the first poll: not the loop's waiting
        loop {
            if std::pin::Pin::new(&mut f).poll(&mut cx).is_ready() {
                break;
            }
            burn(0.01); // between polls
        }
        let off = ns.load(Ordering::Relaxed) as f64 * 1e-9;
        // 2 × 10 ms between polls; the 60 ms inside them and the 20 ms
        // before the first are left out.
        assert!((0.02..0.035).contains(&off), "{off}");
    }
}
