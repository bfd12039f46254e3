//! Episodes of refused connections: the server is out of connection slots (`53300`,
//! `53400`) or accepts none for now (`57P03`).
//!
//! A refusal is a condition of the server, not a fault of one thread: every thread of the
//! worker that needs a new connection meets it at about the same time. Each thread goes on
//! retrying with its own backoff and jitter (see `link.rs`), and this type makes the whole
//! worker log one warning when an episode starts (the first refusal after a connection
//! succeeded) and one line when it ends (the next connection that succeeds), with the count
//! of refused attempts in between; the refusals themselves go to the debug log.
//!
//! States: no episode -> in an episode (since, refusals) -> no episode. Never fails.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub(crate) struct Refusals {
    episode: Mutex<Option<Episode>>,
}

#[derive(Debug, Clone, Copy)]
struct Episode {
    since: Instant,
    refusals: u64,
}

impl Refusals {
    /// Counts a refused connection at `now`; true when it starts an episode (the caller
    /// logs it at warn level), false when one is under way.
    pub(crate) fn refused(&self, now: Instant) -> bool {
        let mut ep = self.episode.lock().unwrap_or_else(|e| e.into_inner());
        match ep.as_mut() {
            Some(e) => {
                e.refusals += 1;
                false
            }
            None => {
                *ep = Some(Episode {
                    since: now,
                    refusals: 1,
                });
                true
            }
        }
    }

    /// A connection succeeded at `now`: ends the episode under way, if any, and returns
    /// how many attempts it refused and how long it lasted.
    /// True while an episode of refusals is under way (no connection of the worker has
    /// succeeded since the last refusal).
    pub(crate) fn under_way(&self) -> bool {
        self.episode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub(crate) fn accepted(&self, now: Instant) -> Option<(u64, Duration)> {
        let mut ep = self.episode.lock().unwrap_or_else(|e| e.into_inner());
        ep.take()
            .map(|e| (e.refusals, now.saturating_duration_since(e.since)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_is_reported_once_when_it_starts_and_once_when_it_ends() {
        let r = Refusals::default();
        let t0 = Instant::now();
        assert_eq!(r.accepted(t0), None);
        assert!(r.refused(t0));
        for i in 1..50u64 {
            assert!(!r.refused(t0 + Duration::from_millis(i * 100)));
        }
        assert_eq!(
            r.accepted(t0 + Duration::from_secs(7)),
            Some((50, Duration::from_secs(7)))
        );
        assert_eq!(r.accepted(t0 + Duration::from_secs(8)), None);
        assert!(r.refused(t0 + Duration::from_secs(9)), "a new episode");
    }
}
