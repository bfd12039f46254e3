//! The fetcher's share of the recording of outcomes.
//!
//! The completer records one batch at a time, on its own connection, while the fetcher's
//! connection claims. A fetcher that waits for room, or found the queue empty, would leave
//! its connection (and a core of the server) idle while outcomes pile up behind the
//! completer's batch; instead it takes a batch from the completer's channel and records it.
//! What it cannot record goes back to the completer (through the ride slot, `ride.rs`, which
//! the completer empties and the shutdown's last step reads too).

use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::link::Link;
use super::record::Recorder;
use super::{Outcome, Shared};

/// Outcomes waiting in the completer's channel from which the fetcher, when it has no room
/// to claim or the queue is empty, records a batch of them itself.
const HELP_MIN: usize = 256;

/// How long the fetcher leaves every outcome to the completer after a recording of its own
/// failed.
const HELP_PAUSE: Duration = Duration::from_secs(1);

/// What the fetcher needs to record a share: the completer's channel, and whether it should
/// leave the recording alone for now. Draining 10,000 no-op jobs at concurrency 4 before the
/// fetcher took a share, the last claim came 130 ms after the start and the completer, alone,
/// took 70 ms more to record the 7,000 outcomes left.
///
/// Whatever the fetcher cannot record (the link failed, the database refused a statement, a
/// row was locked past the lock timeout) goes back to the completer, which records it with
/// all its care; the fetcher then leaves the recording alone for [`HELP_PAUSE`].
pub(crate) struct Helper<'r> {
    outcomes: &'r Receiver<Outcome>,
    paused_until: Option<Instant>,
}

pub(crate) enum Help {
    /// The completer keeps up (or helping is paused): nothing recorded.
    Nothing,
    /// A batch was recorded.
    Helped,
    /// The link failed: wait this long before the next round-trip.
    Failed(Duration),
}

impl<'r> Helper<'r> {
    pub(crate) fn new(outcomes: &'r Receiver<Outcome>) -> Helper<'r> {
        Helper {
            outcomes,
            paused_until: None,
        }
    }

    pub(crate) fn help(&mut self, shared: &Shared, link: &mut Link<'_>) -> Help {
        if self.outcomes.len() < HELP_MIN || shared.stopping() {
            return Help::Nothing;
        }
        if let Some(t) = self.paused_until {
            if Instant::now() < t {
                return Help::Nothing;
            }
            self.paused_until = None;
        }
        let batch: Vec<Outcome> = self
            .outcomes
            .try_iter()
            .take(super::complete::MAX_BATCH)
            .collect();
        if batch.is_empty() {
            return Help::Nothing;
        }
        // Busy now: the completer leaves nothing to ride on a claim meanwhile.
        shared.ride.set_idle(false);
        let conn = match link.get() {
            Ok((c, ())) => c,
            Err(wait) => {
                shared.ride.hand_back(batch);
                self.paused_until = Some(Instant::now() + HELP_PAUSE);
                return Help::Failed(wait);
            }
        };
        let n = batch.len();
        match Recorder::new(shared).record_share(conn, batch) {
            Ok(()) => Help::Helped,
            Err((e, left)) => {
                log::debug!(
                    "worker {}: the fetcher's recording of {n} outcomes failed ({e}); the completer records {} of them",
                    shared.name,
                    left.len()
                );
                shared.ride.hand_back(left);
                self.paused_until = Some(Instant::now() + HELP_PAUSE);
                if conn.is_broken() {
                    match link.judge(Err::<(), _>(e)) {
                        Err(wait) => Help::Failed(wait),
                        Ok(()) => Help::Helped,
                    }
                } else {
                    Help::Helped
                }
            }
        }
    }
}
