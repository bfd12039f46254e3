//! When the next scheduled job is due: the fetcher's idle wait ends then, not at the next poll.
//!
//! Every claim that comes back short also returns, from the same statement (so with the same
//! `now()`), when the earliest job of the worker's queues that is not due yet will be due
//! (`postpone_next_due`, schema version 9), and the database's `now()`. Both are times of the
//! database's clock; the wait is their difference, counted from the moment the claim was
//! sent on this machine's monotonic clock. No wall clock of this machine is compared with the
//! database's, so a skewed clock changes nothing.
//!
//! A job deferred for later sends `at:<time>:<queue>`; the listener hands it to
//! [`Due::heard`], which moves the fetcher's wait earlier when that time is earlier than the
//! one it waits for (a later one costs nothing: no claim, no query).
//!
//! A wait that ends at a due time and claims nothing (the job was taken by another worker,
//! or its lock, its queue's limits or its task keep it from this worker) makes the next such
//! wait end no sooner than 2, 4, 8 ... ms later (at most [`MAX_HOLD`] or the poll
//! interval), until a claim brings a job again: a long run of jobs this worker cannot take
//! never makes it spin. Notifications of new work are not held back.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};

use super::Shared;

/// Longest hold after waits that claimed nothing.
const MAX_HOLD: Duration = Duration::from_millis(500);

/// What the fetcher knows of the next due job.
#[derive(Debug, Default)]
struct State {
    /// A moment of this machine's monotonic clock and the database's clock then (µs since
    /// the epoch): when the last claim was sent, and its `now()`.
    anchor: Option<(Instant, i64)>,
    /// The database time (µs) the earliest known job not yet due is due at.
    next: Option<i64>,
    /// The earliest `at:` heard since the claim under way was sent (its reply does not know
    /// of the jobs those notifications announce).
    heard: Option<i64>,
    /// The due time the last idle wait ended on, if it ended on one.
    woke_for: Option<i64>,
    /// Waits in a row that ended on a due time and claimed nothing.
    fruitless: u32,
    /// No wait ends on a due time before this.
    hold_until: Option<Instant>,
}

/// The fetcher's knowledge of the next due job, shared with the listener.
pub(crate) struct Due {
    state: Mutex<State>,
    /// Tells an idle fetcher that its wait should end earlier.
    earlier: (Sender<()>, Receiver<()>),
}

impl Default for Due {
    fn default() -> Due {
        Due {
            state: Mutex::new(State::default()),
            earlier: crossbeam_channel::bounded(1),
        }
    }
}

impl Due {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A claim is being sent now: returns the moment, for [`learn`](Self::learn).
    pub(crate) fn sending(&self) -> Instant {
        self.state().heard = None;
        Instant::now()
    }

    /// Takes what a claim sent at `sent` says of the next due job out of its rows: the row
    /// that only carries it (no job: NULL id) is removed. Columns 11 and 12 are the
    /// database's `now()` and the next due time (µs since the epoch; NULL when no job is
    /// due later, or when the claim took every job it asked for and did not look).
    pub(crate) fn learn(&self, rows: &mut Vec<postgres::Row>, sent: Instant, poll: Duration) {
        let info = rows
            .first()
            .map(|r| (r.get::<_, Option<i64>>(11), r.get::<_, Option<i64>>(12)));
        rows.retain(|r| r.get::<_, Option<i64>>(0).is_some());
        let claimed = rows.len();
        let mut s = self.state();
        if let Some((Some(now), next)) = info {
            s.anchor = Some((sent, now));
            s.next = earliest(next, s.heard);
        }
        match s.woke_for.take() {
            _ if claimed > 0 => {
                s.fruitless = 0;
                s.hold_until = None;
            }
            // Woke for a job that was not ours to take: hold the next such wake.
            Some(due) if s.next.is_none_or(|n| n > due) => {
                s.fruitless = s.fruitless.saturating_add(1);
                let hold = Duration::from_millis(1 << s.fruitless.min(16)).min(MAX_HOLD.min(poll));
                s.hold_until = Some(Instant::now() + hold);
            }
            // Nothing taken because nothing was due yet (a wake a little early): no penalty.
            _ => {}
        }
    }

    /// The listener heard `at:<µs>:<queue>` for a queue of this worker: a job is due at
    /// `at` (database time). Moves the fetcher's wait earlier if that job is due before the
    /// job it waits for.
    pub(crate) fn heard(&self, at: i64) {
        let mut s = self.state();
        s.heard = earliest(s.heard, Some(at));
        if s.next.is_none_or(|n| at < n) {
            s.next = Some(at);
            drop(s);
            let _ = self.earlier.0.try_send(());
        }
    }

    /// When the idle wait should end for the next due job (`None`: no job known), and that
    /// job's due time.
    pub(crate) fn deadline(&self) -> Option<(Instant, i64)> {
        let s = self.state();
        let next = s.next?;
        let at = match s.anchor {
            Some((instant, now)) => {
                let ahead = Duration::from_micros(next.saturating_sub(now).max(0) as u64);
                instant.checked_add(ahead).unwrap_or(instant)
            }
            // No claim has answered yet: look now.
            None => Instant::now(),
        };
        Some((s.hold_until.map_or(at, |h| at.max(h)), next))
    }

    pub(crate) fn woke(&self, due: Option<i64>) {
        self.state().woke_for = due;
    }
}

/// Parses the part of an `at:` payload after `at:`: (µs since the epoch, queue).
pub(crate) fn parse(rest: &str) -> Option<(i64, &str)> {
    let (at, queue) = rest.split_once(':')?;
    Some((at.parse().ok()?, queue))
}

fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The fetcher's idle wait: until a notification or a recorded outcome (`wake`), the next
/// due job, the poll interval, or stop. Returns true on stop.
pub(crate) fn idle_wait(shared: &Shared, stop: &Receiver<()>, wake: &Receiver<()>) -> bool {
    let due = &shared.due;
    let poll_end = Instant::now() + shared.opts.poll_interval;
    loop {
        let (until, for_job) = match due.deadline() {
            Some((at, job)) if at < poll_end => (at, Some(job)),
            _ => (poll_end, None),
        };
        let timeout = until.saturating_duration_since(Instant::now());
        select! {
            recv(stop) -> _ => return true,
            recv(wake) -> _ => {
                due.woke(None);
                return false;
            }
            // A job due earlier was announced: wait again, for it.
            recv(due.earlier.1) -> _ => continue,
            default(timeout) => {
                due.woke(for_job);
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_payloads_parse_with_any_queue_name() {
        assert_eq!(
            parse("1700000000000000:emails"),
            Some((1_700_000_000_000_000, "emails"))
        );
        assert_eq!(parse("5:a:b"), Some((5, "a:b")));
        assert_eq!(parse("x:q"), None);
        assert_eq!(parse("12"), None);
    }

    #[test]
    fn a_heard_job_moves_the_wait_earlier_never_later() {
        let d = Due::default();
        let now = 1_000_000_000;
        {
            let mut s = d.state();
            s.anchor = Some((Instant::now(), now));
            s.next = Some(now + 10_000_000);
        }
        d.heard(now + 20_000_000);
        assert_eq!(d.state().next, Some(now + 10_000_000));
        assert!(d.earlier.1.try_recv().is_err(), "a later job does not wake");
        d.heard(now + 1_000_000);
        assert_eq!(d.state().next, Some(now + 1_000_000));
        assert!(d.earlier.1.try_recv().is_ok(), "an earlier job does");
        let (at, job) = d.deadline().unwrap();
        assert_eq!(job, now + 1_000_000);
        assert!(at > Instant::now() + Duration::from_millis(900));
        assert!(at < Instant::now() + Duration::from_millis(1001));
    }
}
