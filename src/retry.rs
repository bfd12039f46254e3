//! Retry strategies: how many attempts a task gets and how long to wait between them.
//!
//! Everything here is a pure function of the attempt number (and a random number in `[0, 1)`
//! for jitter): the worker computes the delay, the database adds it to its own clock, so
//! retries do not depend on the worker's clock.

use std::time::Duration;

/// How a task's failed attempts are retried.
///
/// `max_attempts` counts every run, the first included: `RetryStrategy::fixed(d, 3)` runs a
/// failing job three times, then fails it.
///
/// ```
/// use std::time::Duration;
/// use postpone::RetryStrategy;
///
/// let r = RetryStrategy::exponential(Duration::from_secs(1), 10)
///     .cap(Duration::from_secs(60))
///     .jitter(0.0);
/// assert_eq!(r.delay(1, 0.5), Duration::from_secs(1));  // after the 1st attempt
/// assert_eq!(r.delay(4, 0.5), Duration::from_secs(8));
/// assert_eq!(r.delay(9, 0.5), Duration::from_secs(60)); // capped
/// assert_eq!(r.next_delay(10, 0.5), None);              // no 11th attempt
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryStrategy {
    max_attempts: u32,
    backoff: Backoff,
    cap: Duration,
    jitter: f64,
}

#[derive(Clone, Debug, PartialEq)]
enum Backoff {
    Fixed(Duration),
    Linear { base: Duration, step: Duration },
    Exponential { base: Duration, factor: f64 },
}

impl Default for RetryStrategy {
    fn default() -> RetryStrategy {
        RetryStrategy::never()
    }
}

impl RetryStrategy {
    /// No retry: the first failure fails the job. The default of every task.
    pub fn never() -> RetryStrategy {
        RetryStrategy {
            max_attempts: 1,
            backoff: Backoff::Fixed(Duration::ZERO),
            cap: Duration::MAX,
            jitter: 0.0,
        }
    }

    /// The same `delay` before every retry, up to `max_attempts` runs in all.
    pub fn fixed(delay: Duration, max_attempts: u32) -> RetryStrategy {
        RetryStrategy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::Fixed(delay),
            ..RetryStrategy::never()
        }
    }

    /// `base`, then `base + step`, `base + 2 step`, ... up to `max_attempts` runs in all.
    pub fn linear(base: Duration, step: Duration, max_attempts: u32) -> RetryStrategy {
        RetryStrategy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::Linear { base, step },
            ..RetryStrategy::never()
        }
    }

    /// `base`, `2 base`, `4 base`, ... up to `max_attempts` runs in all; a 10% jitter and a
    /// one-hour cap by default (change them with [`jitter`](Self::jitter) and
    /// [`cap`](Self::cap)).
    pub fn exponential(base: Duration, max_attempts: u32) -> RetryStrategy {
        RetryStrategy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::Exponential { base, factor: 2.0 },
            cap: Duration::from_secs(3600),
            jitter: 0.1,
        }
    }

    /// Multiplies each exponential step by `factor` instead of 2 (ignored by other shapes).
    pub fn factor(mut self, factor: f64) -> RetryStrategy {
        if let Backoff::Exponential { factor: f, .. } = &mut self.backoff {
            *f = if factor.is_finite() && factor >= 1.0 {
                factor
            } else {
                1.0
            };
        }
        self
    }

    /// The longest delay between two attempts. Defaults to one hour for exponential
    /// strategies, unbounded for the others.
    pub fn cap(mut self, cap: Duration) -> RetryStrategy {
        self.cap = cap;
        self
    }

    /// Spreads each delay by up to `fraction` of itself, up or down (0.1 = ±10%), so that jobs
    /// failing together do not retry together. Clamped to `[0, 1]`. Defaults to 0.1 for
    /// exponential strategies, 0 for the others.
    pub fn jitter(mut self, fraction: f64) -> RetryStrategy {
        self.jitter = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// Changes the number of runs allowed, the first included (at least 1).
    pub fn max_attempts(mut self, max_attempts: u32) -> RetryStrategy {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// How many runs a job gets in all.
    pub fn attempts_allowed(&self) -> u32 {
        self.max_attempts
    }

    /// The wait after attempt number `attempt` (1-based) failed, before jitter is bounded by
    /// the cap. `rand` is a number in `[0, 1)`; 0.5 means no jitter.
    pub fn delay(&self, attempt: u32, rand: f64) -> Duration {
        let n = attempt.max(1) - 1;
        let raw = match &self.backoff {
            Backoff::Fixed(d) => d.as_secs_f64(),
            Backoff::Linear { base, step } => base.as_secs_f64() + step.as_secs_f64() * n as f64,
            Backoff::Exponential { base, factor } => {
                base.as_secs_f64() * factor.powi(n.min(1000) as i32)
            }
        };
        let spread = (rand.clamp(0.0, 1.0) * 2.0 - 1.0) * self.jitter;
        let secs = (raw * (1.0 + spread)).max(0.0);
        let cap = self.cap.as_secs_f64();
        if !secs.is_finite() || secs >= cap {
            self.cap
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The wait before the next attempt after attempt `attempt` failed, or `None` when it was
    /// the last one allowed.
    pub fn next_delay(&self, attempt: u32, rand: f64) -> Option<Duration> {
        (attempt < self.max_attempts).then(|| self.delay(attempt, rand))
    }
}

/// A small, fast pseudo-random number in `[0, 1)` for jitter (not for anything secret).
pub(crate) fn jitter_rand() -> f64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id() as u64);
            h.finish() | 1
        });
    }
    STATE.with(|s| {
        // xorshift64*
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn never_allows_one_attempt() {
        let r = RetryStrategy::never();
        assert_eq!(r.attempts_allowed(), 1);
        assert_eq!(r.next_delay(1, 0.5), None);
    }

    #[test]
    fn fixed_waits_the_same_and_stops_at_max() {
        let r = RetryStrategy::fixed(3 * S, 3);
        assert_eq!(r.next_delay(1, 0.5), Some(3 * S));
        assert_eq!(r.next_delay(2, 0.9), Some(3 * S));
        assert_eq!(r.next_delay(3, 0.5), None);
    }

    #[test]
    fn linear_grows_by_step() {
        let r = RetryStrategy::linear(S, 2 * S, 5);
        let d: Vec<_> = (1..5).map(|a| r.delay(a, 0.5)).collect();
        assert_eq!(d, vec![S, 3 * S, 5 * S, 7 * S]);
    }

    #[test]
    fn exponential_doubles_caps_and_jitters_within_bounds() {
        let r = RetryStrategy::exponential(S, 30).jitter(0.0);
        assert_eq!(r.delay(1, 0.0), S);
        assert_eq!(r.delay(2, 0.0), 2 * S);
        assert_eq!(r.delay(5, 0.0), 16 * S);
        assert_eq!(r.delay(25, 0.0), Duration::from_secs(3600));
        let r = r.cap(10 * S).jitter(0.5);
        assert_eq!(r.delay(20, 0.99), 10 * S);
        let lo = r.delay(3, 0.0);
        let hi = r.delay(3, 0.999_999);
        assert_eq!(lo, 2 * S);
        assert!(hi > Duration::from_millis(5990) && hi <= 6 * S, "{hi:?}");
        let r = RetryStrategy::exponential(S, 3).factor(3.0).jitter(0.0);
        assert_eq!(r.delay(3, 0.5), 9 * S);
    }

    #[test]
    fn odd_inputs_stay_sane() {
        let r = RetryStrategy::fixed(S, 0);
        assert_eq!(r.attempts_allowed(), 1);
        let r = RetryStrategy::exponential(S, 5)
            .jitter(f64::NAN)
            .factor(-2.0);
        assert_eq!(r.delay(3, 0.5), S);
        assert_eq!(r.delay(0, 0.5), S);
    }

    #[test]
    fn jitter_rand_is_in_unit_interval() {
        for _ in 0..10_000 {
            let x = jitter_rand();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
