//! Outcomes that ride on the next claim: one commit for both.
//!
//! Every commit that writes waits for a WAL flush, and on a busy worker the completer's
//! commits and the fetcher's claims alternate: two flushes per cycle, each costing the server
//! a system call and a wake-up of its own. When the fetcher is busy (it claimed moments ago,
//! or it waits for free slots), the completer leaves final outcomes (`succeeded`, `failed`,
//! `cancelled`, `aborted`, `delete`) here; the fetcher's next claim takes them and sends
//! `BEGIN`, their recording, the claim and `COMMIT` in one round-trip. If no claim takes them
//! within [`HOLD`], or the recording is refused or fails, they go back to the completer,
//! which records them on its own as before (splitting a refused batch until the refused
//! outcome is alone). Outcomes that put a job back in the queue never ride.
//!
//! Measured (open-loop runs at 1,250 jobs/s, 50% of the measured capacity, on this
//! project's 2-core machine): the completer's backend alone used 57% of a core, mostly in
//! the kernel flushing WAL; without its flushes, p99 went from 6-14 ms to 4-10 ms.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::{Outcome, WorkerBuilder};

/// Longest an outcome waits here for a claim to carry it.
pub(crate) const HOLD: Duration = Duration::from_millis(2);

/// A fetcher that sent a claim this recently is busy: another claim is likely within
/// [`HOLD`].
const BUSY: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Slot {
    outcomes: Vec<Outcome>,
    /// When the completer takes them back (`None`: at once, they were handed back).
    until: Option<Instant>,
}

/// The outcomes waiting for a claim, shared by the completer and the fetcher.
pub(crate) struct Ride {
    slot: Mutex<Slot>,
    /// The worker's epoch, for `last_claim`.
    epoch: Instant,
    /// µs since `epoch` when the fetcher last sent a claim (0: never).
    last_claim: AtomicU64,
    /// True when the fetcher's last claim found less than it asked for: it waits for work.
    idle: std::sync::atomic::AtomicBool,
    /// False while the fetcher's link cannot carry outcomes (a transaction pooler, or
    /// riding turned off): none are left to wait for it.
    possible: std::sync::atomic::AtomicBool,
    /// Fetcher -> completer: outcomes were handed back.
    pub(crate) back: (Sender<()>, Receiver<()>),
}

impl Default for Ride {
    fn default() -> Ride {
        Ride {
            slot: Mutex::default(),
            epoch: Instant::now(),
            last_claim: AtomicU64::new(0),
            idle: Default::default(),
            possible: Default::default(),
            back: crossbeam_channel::bounded(1),
        }
    }
}

impl Ride {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fetcher is sending a claim now, on a link that can (`possible`) carry outcomes.
    pub(crate) fn claiming(&self, possible: bool) {
        self.possible.store(possible, Ordering::Relaxed);
        let us = self.epoch.elapsed().as_micros().max(1) as u64;
        self.last_claim.store(us, Ordering::Relaxed);
    }

    /// The fetcher's last claim found less than it asked for (`true`), or all it asked for.
    pub(crate) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::Relaxed);
    }

    /// Whether the fetcher's last claim found less than it asked for: the queue ran short
    /// (the fetcher now waits for a notification or its poll before it claims again) or the
    /// byte budget cut it (it claims again once a waiting job starts).
    pub(crate) fn fetcher_waits(&self) -> bool {
        self.idle.load(Ordering::Relaxed)
    }

    /// Whether outcomes should wait for the next claim: the fetcher's last claim found less
    /// than it asked for (so its next claim is sent when a job comes, and the completer's
    /// commit would not overlap one) and was sent moments ago (so jobs come often). A
    /// fetcher whose claims fill every slot is draining a backlog: its claims and the
    /// completer's commits overlap, on two connections, and the completer records on its own.
    pub(crate) fn fetcher_busy(&self) -> bool {
        if !self.idle.load(Ordering::Relaxed) || !self.possible.load(Ordering::Relaxed) {
            return false;
        }
        let last = self.last_claim.load(Ordering::Relaxed);
        last != 0
            && (self.epoch.elapsed().as_micros() as u64).saturating_sub(last)
                <= BUSY.as_micros() as u64
    }

    /// Completer: leaves `outcomes` for the next claim (they wait at most [`HOLD`] from the
    /// first of them).
    pub(crate) fn leave(&self, outcomes: impl IntoIterator<Item = Outcome>) {
        let mut s = self.slot();
        let before = s.outcomes.len();
        s.outcomes.extend(outcomes);
        if before == 0 && !s.outcomes.is_empty() {
            s.until = Some(Instant::now() + HOLD);
        }
    }

    /// Fetcher: takes every outcome waiting (at most `max`), to record with its claim.
    pub(crate) fn take(&self, max: usize) -> Vec<Outcome> {
        let mut s = self.slot();
        let n = s.outcomes.len().min(max);
        let taken: Vec<Outcome> = s.outcomes.drain(..n).collect();
        if s.outcomes.is_empty() {
            s.until = None;
        }
        taken
    }

    /// Fetcher: hands outcomes it could not record back to the completer.
    pub(crate) fn hand_back(&self, outcomes: Vec<Outcome>) {
        if outcomes.is_empty() {
            return;
        }
        let mut s = self.slot();
        s.outcomes.extend(outcomes);
        s.until = Some(Instant::now());
        drop(s);
        let _ = self.back.0.try_send(());
    }

    /// Completer: when it should take back what waits (`None`: nothing waits).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let s = self.slot();
        if s.outcomes.is_empty() {
            None
        } else {
            s.until
        }
    }

    /// Completer: takes back what waited past its hold (or was handed back).
    pub(crate) fn take_expired(&self) -> Vec<Outcome> {
        let mut s = self.slot();
        match s.until {
            Some(t) if t <= Instant::now() => {
                s.until = None;
                std::mem::take(&mut s.outcomes)
            }
            _ => Vec::new(),
        }
    }

    /// Everything waiting, whatever its hold (the completer ends; the shutdown's cleanup).
    pub(crate) fn take_all(&self) -> Vec<Outcome> {
        let mut s = self.slot();
        s.until = None;
        std::mem::take(&mut s.outcomes)
    }
}

impl WorkerBuilder {
    /// Whether a busy worker records finished jobs in its next claim's transaction (one
    /// commit, so one WAL flush, for both) rather than in a commit of their own. Defaults to
    /// true. An outcome waits at most 2 ms for a claim to carry it, and only while the
    /// worker's claims come often and find less than they ask for; otherwise it is recorded
    /// at once, as with `false`. Retries and snoozes are always recorded at once.
    pub fn outcomes_ride_claims(mut self, ride: bool) -> Self {
        self.opts.ride_claims = ride;
        self
    }
}
