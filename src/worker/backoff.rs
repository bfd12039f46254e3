//! Capped exponential backoff with jitter, for reconnecting after a database error.

use std::time::Duration;

use crate::retry::jitter_rand;

/// First wait after an error.
const BASE: Duration = Duration::from_millis(100);

/// Doubles from 100 ms up to `cap`, each wait spread by ±20% so that many workers losing the
/// same database do not reconnect in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    failures: u32,
    cap: Duration,
}

impl Backoff {
    pub(crate) fn new(cap: Duration) -> Backoff {
        Backoff { failures: 0, cap }
    }

    /// The wait after one more failure.
    pub(crate) fn next_wait(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let exp = BASE.saturating_mul(1u32 << (self.failures - 1).min(16));
        let d = exp.min(self.cap);
        d.mul_f64(0.8 + 0.4 * jitter_rand())
    }

    /// Back to the first step after a success.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// Consecutive failures so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(2));
        let first = b.next_wait();
        assert!(first >= Duration::from_millis(80) && first <= Duration::from_millis(120));
        for _ in 0..20 {
            let w = b.next_wait();
            assert!(w <= Duration::from_millis(2400), "{w:?}");
        }
        let late = b.next_wait();
        assert!(late >= Duration::from_millis(1600), "{late:?}");
        assert_eq!(b.failures(), 22);
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(120));
    }
}
