//! The ledger: which attempts this worker holds, and which of them it may start.
//!
//! One lock guards everything the worker's threads share about jobs, so the lock order is
//! this type's methods, not a comment. An attempt is known by its [`AttemptKey`]: the job,
//! the worker identity that claimed it, and the attempt number the claim gave it. That key is
//! the fence every outcome carries to the database, so an attempt of an identity that was
//! presumed dead can never overwrite the attempt a later claim started.
//!
//! An entry lives from the claim's reply until its outcome is recorded (or refused):
//! *waiting* (claimed, prefetched, not started), *running* (on an executor), *done* (its
//! outcome is on its way to the database). The number of entries is what the fetcher counts
//! as in flight, so a worker whose outcomes are not being recorded stops claiming.
//!
//! A waiting attempt starts only if, at that moment:
//! - it still belongs to the worker's current identity (an identity presumed dead by another
//!   worker lost its jobs to a rescue: they are dropped, never started);
//! - the worker's heartbeat lease holds: the last heartbeat the database accepted is recent
//!   enough that no other worker can have presumed this one dead yet;
//! - no abort is suspected: a notification `abort:<id>` is only a hint (any role can send
//!   one), so it holds the start until the beat thread has read the table; an abort the
//!   table confirms ends the attempt `aborted` without running it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::idhash::IdMap;
use crate::job::{AbortFlag, JobId, ABORT_LOST, ABORT_REQUESTED};

/// One attempt of a job, as claimed by one worker identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AttemptKey {
    pub(crate) id: JobId,
    /// The worker identity (row id in `postpone_workers`) that claimed it.
    pub(crate) worker: i64,
    /// The job's `attempts` after the claim.
    pub(crate) attempt: i32,
}

/// A job running on an executor thread.
pub(crate) struct RunningJob {
    pub(crate) abort: Arc<AbortFlag>,
    pub(crate) started: Instant,
    pub(crate) timeout: Option<Duration>,
    pub(crate) thread: Arc<str>,
    pub(crate) task: String,
}

enum Phase {
    Waiting,
    Running(RunningJob),
    Done,
}

struct Entry {
    phase: Phase,
    /// The table says this attempt's abort was requested (read before it started).
    abort_confirmed: bool,
}

struct State {
    entries: IdMap<AttemptKey, Entry>,
    /// Jobs named by an `abort:<id>` notification, with the poll generation they arrived in.
    suspects: IdMap<JobId, u64>,
    generation: u64,
    worker: i64,
    lease_until: Instant,
}

/// What an executor may do with the attempt it took from the board.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Run the task.
    Start,
    /// The table says its abort was requested: end it `aborted` without running it.
    AbortedBeforeStart,
    /// Not this worker's any more (its identity was presumed dead): drop it.
    NotOurs,
    /// Not yet: the heartbeat lease lapsed, or an abort is suspected. Wait and ask again.
    Wait,
}

pub(crate) struct Ledger {
    state: Mutex<State>,
    changed: Condvar,
}

impl Ledger {
    pub(crate) fn new(worker: i64, lease_until: Instant) -> Ledger {
        Ledger {
            state: Mutex::new(State {
                entries: IdMap::default(),
                suspects: IdMap::default(),
                generation: 0,
                worker,
                lease_until,
            }),
            changed: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The worker's current identity.
    pub(crate) fn worker(&self) -> i64 {
        self.state().worker
    }

    /// Attempts held: claimed and not yet recorded (the fetcher reads
    /// [`held_and_finished`](Self::held_and_finished)).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.state().entries.len()
    }

    /// Attempts held, and how many of them have finished (their outcome waits to be
    /// recorded), read together.
    pub(crate) fn held_and_finished(&self) -> (usize, usize) {
        let s = self.state();
        let done = s
            .entries
            .values()
            .filter(|e| matches!(e.phase, Phase::Done))
            .count();
        (s.entries.len(), done)
    }

    /// Notes attempts whose claim reply arrived.
    pub(crate) fn hold(&self, keys: impl IntoIterator<Item = AttemptKey>) {
        let mut s = self.state();
        for key in keys {
            s.entries.insert(
                key,
                Entry {
                    phase: Phase::Waiting,
                    abort_confirmed: false,
                },
            );
        }
    }

    /// Decides whether `key` may start now; on `Start`, registers it as running.
    pub(crate) fn begin(&self, key: AttemptKey, running: impl FnOnce() -> RunningJob) -> Begin {
        let mut s = self.state();
        let current = s.worker;
        let lease_ok = Instant::now() < s.lease_until;
        let suspected = s.suspects.contains_key(&key.id);
        let Some(entry) = s.entries.get_mut(&key) else {
            return Begin::NotOurs;
        };
        if !matches!(entry.phase, Phase::Waiting) {
            return Begin::NotOurs;
        }
        if key.worker != current {
            s.entries.remove(&key);
            self.changed.notify_all();
            return Begin::NotOurs;
        }
        if entry.abort_confirmed {
            entry.phase = Phase::Done;
            return Begin::AbortedBeforeStart;
        }
        if suspected || !lease_ok {
            return Begin::Wait;
        }
        entry.phase = Phase::Running(running());
        Begin::Start
    }

    /// Waits until something that [`begin`](Self::begin) depends on changes, or `timeout`.
    pub(crate) fn wait_change(&self, timeout: Duration) {
        let s = self.state();
        let _ = self.changed.wait_timeout(s, timeout);
    }

    /// The task of `key` has returned: its outcome is on its way.
    pub(crate) fn finish(&self, key: AttemptKey) {
        if let Some(e) = self.state().entries.get_mut(&key) {
            e.phase = Phase::Done;
        }
    }

    /// Outcomes recorded (or refused by their guard): forgets the attempts.
    pub(crate) fn settle(&self, keys: impl IntoIterator<Item = AttemptKey>) {
        let mut s = self.state();
        for key in keys {
            s.entries.remove(&key);
        }
        self.changed.notify_all();
    }

    /// An `abort:<id>` notification arrived: hold the job's start until the table is read.
    /// Returns true if the job is held here (worth a look at the table).
    pub(crate) fn suspect(&self, id: JobId) -> bool {
        let mut s = self.state();
        let held = s.entries.keys().any(|k| k.id == id);
        if held {
            let generation = s.generation;
            s.suspects.insert(id, generation);
        }
        held
    }

    /// True when a suspected abort waits for the table.
    pub(crate) fn has_suspects(&self) -> bool {
        !self.state().suspects.is_empty()
    }

    /// A poll of the table's abort requests is about to start; returns its generation.
    pub(crate) fn poll_begins(&self) -> u64 {
        let mut s = self.state();
        s.generation += 1;
        s.generation
    }

    /// The table says the abort of these jobs (held by the current identity) was requested:
    /// raises the flag of running ones, marks waiting ones to end without running. Then
    /// clears the suspicions that arrived before the poll of `generation` began. Returns the
    /// (job, task) of the running jobs whose flag was raised now.
    pub(crate) fn aborts_confirmed(&self, ids: &[JobId], generation: u64) -> Vec<(JobId, String)> {
        let mut s = self.state();
        let current = s.worker;
        let mut raised = Vec::new();
        for (key, entry) in s.entries.iter_mut() {
            if key.worker != current || !ids.contains(&key.id) {
                continue;
            }
            match &entry.phase {
                Phase::Waiting => entry.abort_confirmed = true,
                Phase::Running(r) => {
                    if r.abort.get() & ABORT_REQUESTED == 0 {
                        r.abort.raise(ABORT_REQUESTED);
                        raised.push((key.id, r.task.clone()));
                    }
                }
                Phase::Done => {}
            }
        }
        s.suspects.retain(|_, g| *g >= generation);
        self.changed.notify_all();
        raised
    }

    /// The database accepted a heartbeat: no other worker may presume this one dead before
    /// `until`.
    pub(crate) fn renew_lease(&self, until: Instant) {
        let mut s = self.state();
        if until > s.lease_until {
            s.lease_until = until;
        }
        self.changed.notify_all();
    }

    /// The worker was presumed dead and registered again as `worker`: waiting attempts of
    /// the old identity are dropped (a rescue gave them to the queue), running ones are told
    /// to stop (their outcomes will be refused). Returns (dropped, told to stop).
    pub(crate) fn new_identity(&self, worker: i64, lease_until: Instant) -> (usize, usize) {
        let mut s = self.state();
        s.worker = worker;
        s.lease_until = lease_until;
        let before = s.entries.len();
        s.entries
            .retain(|k, e| k.worker == worker || !matches!(e.phase, Phase::Waiting));
        let dropped = before - s.entries.len();
        let mut stopped = 0;
        for (k, e) in s.entries.iter() {
            if let (true, Phase::Running(r)) = (k.worker != worker, &e.phase) {
                r.abort.raise(ABORT_LOST);
                stopped += 1;
            }
        }
        s.suspects.clear();
        self.changed.notify_all();
        (dropped, stopped)
    }

    /// Job ids of the attempts held under the current identity (for the lost-claims release).
    pub(crate) fn held_ids(&self) -> Vec<i64> {
        let s = self.state();
        s.entries
            .keys()
            .filter(|k| k.worker == s.worker)
            .map(|k| k.id.0)
            .collect()
    }

    /// Calls `f` for every running attempt.
    pub(crate) fn for_each_running(&self, mut f: impl FnMut(&AttemptKey, &RunningJob)) {
        let s = self.state();
        for (k, e) in s.entries.iter() {
            if let Phase::Running(r) = &e.phase {
                f(k, r);
            }
        }
    }

    /// True when some attempt runs.
    pub(crate) fn any_running(&self) -> bool {
        self.state()
            .entries
            .values()
            .any(|e| matches!(e.phase, Phase::Running(_)))
    }

    /// Job ids of the attempts of the current identity that never started.
    pub(crate) fn never_started(&self) -> Vec<i64> {
        let s = self.state();
        s.entries
            .iter()
            .filter(|(k, e)| k.worker == s.worker && matches!(e.phase, Phase::Waiting))
            .map(|(k, _)| k.id.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: i64, worker: i64) -> AttemptKey {
        AttemptKey {
            id: JobId(id),
            worker,
            attempt: 1,
        }
    }

    fn job() -> RunningJob {
        RunningJob {
            abort: Arc::new(AbortFlag::default()),
            started: Instant::now(),
            timeout: None,
            thread: "t".into(),
            task: "task".into(),
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn an_attempt_starts_once_and_counts_until_settled() {
        let l = Ledger::new(1, later());
        l.hold([key(10, 1)]);
        assert_eq!(l.held(), 1);
        assert_eq!(l.begin(key(10, 1), job), Begin::Start);
        assert_eq!(l.begin(key(10, 1), job), Begin::NotOurs);
        l.finish(key(10, 1));
        assert_eq!(
            l.held(),
            1,
            "counted in flight until its outcome is recorded"
        );
        l.settle([key(10, 1)]);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn a_lapsed_lease_holds_every_start() {
        let l = Ledger::new(1, Instant::now());
        l.hold([key(10, 1)]);
        assert_eq!(l.begin(key(10, 1), job), Begin::Wait);
        l.renew_lease(later());
        assert_eq!(l.begin(key(10, 1), job), Begin::Start);
    }

    #[test]
    fn a_new_identity_drops_waiting_attempts_and_stops_running_ones() {
        let l = Ledger::new(1, later());
        l.hold([key(10, 1), key(11, 1)]);
        let flag = Arc::new(AbortFlag::default());
        let f2 = flag.clone();
        assert_eq!(
            l.begin(key(10, 1), || RunningJob { abort: f2, ..job() }),
            Begin::Start
        );
        assert_eq!(l.new_identity(2, later()), (1, 1));
        assert_eq!(flag.get() & ABORT_LOST, ABORT_LOST);
        assert_eq!(l.begin(key(11, 1), job), Begin::NotOurs);
        // The same job claimed again by the new identity is a different attempt.
        l.hold([AttemptKey {
            attempt: 2,
            ..key(10, 2)
        }]);
        assert_eq!(l.held_ids(), vec![10]);
        assert_eq!(l.held(), 2);
    }

    #[test]
    fn a_notification_only_holds_a_start_until_the_table_answers() {
        let l = Ledger::new(1, later());
        l.hold([key(10, 1), key(11, 1)]);
        assert!(l.suspect(JobId(10)));
        assert!(l.suspect(JobId(11)));
        assert!(!l.suspect(JobId(99)), "not held here: nothing to hold");
        assert_eq!(l.begin(key(10, 1), job), Begin::Wait);
        let g = l.poll_begins();
        // The table confirms 11 only.
        assert!(l.aborts_confirmed(&[JobId(11)], g).is_empty());
        assert_eq!(l.begin(key(10, 1), job), Begin::Start);
        assert_eq!(l.begin(key(11, 1), job), Begin::AbortedBeforeStart);
    }

    #[test]
    fn a_suspicion_newer_than_the_poll_survives_it() {
        let l = Ledger::new(1, later());
        l.hold([key(10, 1)]);
        let g = l.poll_begins();
        assert!(l.suspect(JobId(10)));
        l.aborts_confirmed(&[], g);
        assert_eq!(l.begin(key(10, 1), job), Begin::Wait);
        let g = l.poll_begins();
        l.aborts_confirmed(&[], g);
        assert_eq!(l.begin(key(10, 1), job), Begin::Start);
    }
}
