//! Large answer buffers kept for reuse: [`LargeBuffers`], owned by one
//! [`DataPlane`](super::DataPlane).
//!
//! A pull answered in several parts is read into one buffer laid out like
//! the answer (`requests.rs`). glibc serves an allocation above 32 MiB from
//! a mapping of its own and unmaps it when it is freed, so a fresh buffer
//! for every large pull made the kernel fault in and clear its pages anew:
//! for a 64 MiB pull on loopback, the largest user of its time. A caller
//! done with a pulled answer gives its values back
//! ([`DataPlane::recycle`](super::DataPlane::recycle)) and the next large
//! pull is read into them instead. Replacing the global allocator did the
//! same for this path but slowed small allocations everywhere (BENCHMARKS.md,
//! issue #21, the fourth pass), so the reuse is kept to this one buffer.
//!
//! The pool is bounded: only buffers from 32 MiB up are kept (smaller ones
//! come from glibc's heap, which already reuses them), at most
//! [`MAX_BUFFERS`] of them and [`MAX_BYTES`] in all; above that the
//! smallest are freed. A buffer handed out holds the values of an earlier
//! answer until the new answer is written over them: the answer's reader
//! writes every value (each part is checked to be whole), so nothing of
//! the earlier answer is read.

use std::sync::Mutex;

use super::lock;

/// Buffers of fewer bytes are not kept: glibc's heap reuses them (see
/// [`crate::os::tune_allocator`]).
pub(crate) const MIN_BYTES: usize = crate::os::MMAP_THRESHOLD as usize;
/// Most buffers kept.
pub(crate) const MAX_BUFFERS: usize = 4;
/// Most bytes kept, all buffers together.
pub(crate) const MAX_BYTES: usize = 256 << 20;

/// A bounded pool of large `f32` buffers (see the module docs).
#[derive(Debug)]
pub(crate) struct LargeBuffers {
    min_bytes: usize,
    max_buffers: usize,
    max_bytes: usize,
    /// Free buffers, each as long as its capacity.
    free: Mutex<Vec<Vec<f32>>>,
}

impl Default for LargeBuffers {
    fn default() -> Self {
        LargeBuffers::new(MIN_BYTES, MAX_BUFFERS, MAX_BYTES)
    }
}

impl LargeBuffers {
    /// A pool keeping buffers of `min_bytes` to `max_bytes`, at most
    /// `max_buffers` of them and `max_bytes` in all.
    pub(crate) fn new(min_bytes: usize, max_buffers: usize, max_bytes: usize) -> Self {
        LargeBuffers {
            min_bytes,
            max_buffers,
            max_bytes,
            free: Mutex::new(Vec::new()),
        }
    }

    /// A buffer of `n` values to be written over: the smallest kept one
    /// that holds them (its values unspecified: an earlier answer's), or
    /// else a new one of zeros ([`crate::os::zeroed_vec_for_large`]).
    pub(crate) fn take(&self, n: usize) -> Vec<f32> {
        if n.saturating_mul(4) >= self.min_bytes {
            let found = {
                let mut free = lock(&self.free);
                let best = free
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.len() >= n)
                    .min_by_key(|(_, b)| b.len())
                    .map(|(i, _)| i);
                best.map(|i| free.swap_remove(i))
            };
            if let Some(mut b) = found {
                b.truncate(n);
                return b;
            }
        }
        crate::os::zeroed_vec_for_large(n)
    }

    /// Keeps `buf` for a later [`LargeBuffers::take`] if it is large
    /// enough to be worth it and within the bounds; frees it (or a smaller
    /// kept one) otherwise.
    pub(crate) fn give(&self, mut buf: Vec<f32>) {
        let bytes = buf.capacity().saturating_mul(4);
        if bytes < self.min_bytes || bytes > self.max_bytes {
            return;
        }
        // Kept as long as its capacity, so that a later `take` needs no
        // unsafe length: only values never written are set (to zero).
        buf.resize(buf.capacity(), 0.0);
        let freed = {
            let mut free = lock(&self.free);
            free.push(buf);
            let mut freed = Vec::new();
            while free.len() > self.max_buffers
                || free.iter().map(|b| b.len() * 4).sum::<usize>() > self.max_bytes
            {
                let Some(smallest) = free
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, b)| b.len())
                    .map(|(i, _)| i)
                else {
                    break;
                };
                freed.push(free.swap_remove(smallest));
            }
            freed
        };
        // Unmapped outside the lock.
        drop(freed);
    }

    /// Buffers kept, and their bytes in all.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> (usize, usize) {
        let free = lock(&self.free);
        (free.len(), free.iter().map(|b| b.len() * 4).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps buffers from 4 KiB (1024 values), two of them, 64 KiB in all.
    fn small_pool() -> LargeBuffers {
        LargeBuffers::new(4 << 10, 2, 64 << 10)
    }

    #[test]
    fn a_buffer_given_back_is_taken_again() {
        let pool = small_pool();
        let a = pool.take(4096);
        assert_eq!(a.len(), 4096);
        let at = a.as_ptr();
        pool.give(a);
        assert_eq!(pool.kept(), (1, 16 << 10));
        let b = pool.take(4096);
        assert_eq!(b.as_ptr(), at, "the same buffer");
        assert_eq!(pool.kept(), (0, 0));
    }

    #[test]
    fn a_shorter_answer_in_a_reused_buffer_has_its_own_length() {
        let pool = small_pool();
        let mut a = pool.take(8192);
        a.fill(7.0);
        pool.give(a);
        let mut b = pool.take(2048);
        assert_eq!(b.len(), 2048);
        assert_eq!(b.capacity(), 8192, "reused");
        b.copy_from_slice(&vec![1.0; 2048]);
        assert!(b.iter().all(|&x| x == 1.0));
        // Given back shorter: kept at its capacity, the values beyond the
        // short answer are set, and a longer answer gets its own length.
        pool.give(b);
        assert_eq!(pool.kept(), (1, 32 << 10));
        let c = pool.take(8192);
        assert_eq!(c.len(), 8192);
    }

    #[test]
    fn the_smallest_buffer_that_fits_is_taken() {
        let pool = small_pool();
        let (big, small) = (pool.take(8192), pool.take(2048));
        let (big_at, small_at) = (big.as_ptr(), small.as_ptr());
        pool.give(big);
        pool.give(small);
        let (first, second) = (pool.take(1024), pool.take(1024));
        assert_eq!(first.as_ptr(), small_at);
        assert_eq!(second.as_ptr(), big_at);
        // None left that fits: a new buffer of zeros.
        let fresh = pool.take(1024);
        assert!(fresh.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn small_and_oversized_buffers_are_not_kept() {
        let pool = small_pool();
        pool.give(vec![0.0; 1023]);
        pool.give(vec![0.0; (64 << 10) / 4 + 1]);
        assert_eq!(pool.kept(), (0, 0));
        // Below the threshold nothing is taken from the pool either.
        pool.give(vec![3.0; 1024]);
        assert!(pool.take(1023).iter().all(|&x| x == 0.0));
        assert_eq!(pool.kept().0, 1);
    }

    #[test]
    fn the_pool_is_bounded_in_buffers_and_bytes() {
        let pool = small_pool();
        for _ in 0..3 {
            pool.give(vec![0.0; 1024]);
        }
        assert_eq!(pool.kept(), (2, 8 << 10), "at most two buffers");
        // 48 KiB more: over 64 KiB in all, the smallest go first.
        pool.give(vec![0.0; 12 << 10]);
        assert_eq!(pool.kept(), (2, 52 << 10));
        pool.give(vec![0.0; 12 << 10]);
        assert_eq!(pool.kept(), (1, 48 << 10));
    }
}
