//! Log sampling for events a client can cause at will: requests refused
//! for their identity or by `[[authorization]]`, failed TLS handshakes.
//! Each event is counted (the metrics show them all, docs/operating.md#master-metrics), but
//! logged as a sample: one unauthenticated client once wrote 20,257 log
//! lines in 30 s, one per request, past journald's rate limit.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Counts events; the first is logged, then at most one line per
/// [`Sampler::INTERVAL`] carrying how many happened since the last line.
#[derive(Debug)]
pub struct Sampler {
    epoch: Instant,
    total: AtomicU64,
    unlogged: AtomicU64,
    /// Seconds since `epoch` of the last line, plus 1 (0: never).
    last_line: AtomicU64,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            epoch: Instant::now(),
            total: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
            last_line: AtomicU64::new(0),
        }
    }
}

impl Sampler {
    /// At most one log line per this many seconds.
    pub const INTERVAL: u64 = 10;

    /// Counts an event; returns `Some(n)` when this one is to be logged,
    /// `n` being the events since the last line (this one included).
    pub fn note(&self) -> Option<u64> {
        self.total.fetch_add(1, Relaxed);
        self.unlogged.fetch_add(1, Relaxed);
        let now = self.epoch.elapsed().as_secs() + 1;
        let last = self.last_line.load(Relaxed);
        let due = last == 0 || now >= last + Self::INTERVAL;
        if due
            && self
                .last_line
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.unlogged.swap(0, Relaxed))
        } else {
            None
        }
    }

    /// Every event so far.
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_counted_and_logged_as_a_sample() {
        let s = Sampler::default();
        assert_eq!(s.note(), Some(1), "the first event is logged");
        let logged: Vec<_> = (0..10_000).filter_map(|_| s.note()).collect();
        assert!(
            logged.is_empty(),
            "then nothing within the interval: {logged:?}"
        );
        assert_eq!(s.total(), 10_001);
    }
}
