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
//! An attempt the claim *held* (schema version 20: the table shows it waiting, with no start
//! time) is also subject to the controls an operator sets while it waits: it starts only if
//! what the worker last read of them is recent (the claim that brought it, or the beat's
//! control poll, sent less than [`CONTROL_SPAN`] ago), and never in a queue that read said
//! was paused. A pause waits longer than that span for the held jobs of its queue to go, so
//! no held job starts after a pause returns. Its start is written to the table soon after it
//! starts ([`Ledger::due_starts`]) or with its outcome.
//!
//! A waiting attempt starts only if, at that moment:
//! - it still belongs to the worker's current identity (an identity presumed dead by another
//!   worker lost its jobs to a rescue: they are dropped, never started);
//! - the worker's heartbeat lease holds: the last heartbeat the database accepted is recent
//!   enough that no other worker can have presumed this one dead yet;
//! - no abort is suspected: a notification `abort:<id>` is only a hint (any role can send
//!   one), so it holds the start until the beat thread has read the table; an abort the
//!   table confirms ends the attempt `aborted` without running it.

use std::collections::HashSet;
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

/// How long what a worker read of the controls (pauses, aborts, cancels) lets it start the
/// jobs it holds. A pause waits a little longer for held jobs to go (`PAUSE_WAIT`, in
/// `admin/queues.rs`).
pub(crate) const CONTROL_SPAN: Duration = Duration::from_millis(1500);

enum Phase {
    Waiting,
    Running(RunningJob),
    Done,
}

struct Entry {
    phase: Phase,
    /// The table says this attempt's abort was requested (read before it started).
    abort_confirmed: bool,
    /// The table says an operator cancelled it while it was held.
    cancel_confirmed: bool,
    /// The table has no start for it: held by the claim, and its start not written yet.
    held: bool,
    /// Only locked by the fetcher's open transaction, which writes its start (`locked.rs`):
    /// no start of its own is written while so.
    locked: bool,
    /// When its start is to be written (running and held).
    start_due: Option<Instant>,
    /// When the claim that brought it was sent: what the worker knew of the controls then.
    claimed: Instant,
    queue: Arc<str>,
    /// Its deadline: a held attempt must not start at or after it.
    expires: Option<Instant>,
}

impl Entry {
    /// A held attempt whose deadline has come: it must end without starting.
    fn expired(&self, now: Instant) -> bool {
        self.held && self.expires.is_some_and(|e| now >= e)
    }
}

/// How long without a start makes a worker's held jobs candidates to go back.
pub(crate) const STALLED_STARTS: Duration = Duration::from_millis(100);

impl State {
    /// No attempt started for [`STALLED_STARTS`].
    fn stalled(&self, now: Instant) -> bool {
        self.last_start
            .is_none_or(|t| now.saturating_duration_since(t) >= STALLED_STARTS)
    }
}

/// The pauses the last control poll read.
#[derive(Default)]
pub(crate) struct Paused {
    /// Every queue is paused.
    pub(crate) all: bool,
    pub(crate) queues: HashSet<String>,
}

impl Paused {
    fn covers(&self, queue: &str) -> bool {
        self.all || self.queues.contains(queue)
    }
}

struct State {
    entries: IdMap<AttemptKey, Entry>,
    /// Jobs named by an `abort:<id>` notification, with the poll generation they arrived in.
    suspects: IdMap<JobId, u64>,
    generation: u64,
    worker: i64,
    lease_until: Instant,
    /// When the last control poll that answered was sent.
    control_read: Option<Instant>,
    paused: Paused,
    /// Entries running (kept with every change of phase, so the fetcher need not count).
    running: usize,
    /// Running entries whose start is still to be written.
    starts_pending: usize,
    /// When an attempt last started: a worker whose threads start nothing is stuck.
    last_start: Option<Instant>,
}

/// What an executor may do with the attempt it took from the board.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Run the task.
    Start,
    /// The table says its abort (or, `cancel`, its cancel) was requested: end it without
    /// running it.
    AbortedBeforeStart { cancel: bool },
    /// Held in a queue that is paused now: give it back without running it.
    GiveBack,
    /// Held past its deadline: end it expired without running it.
    Expired,
    /// Not this worker's any more (its identity was presumed dead): drop it.
    NotOurs,
    /// Not yet: the heartbeat lease lapsed, an abort is suspected, or what the worker read
    /// of the controls is too old. Wait and ask again.
    Wait,
}

/// Where an attempt only locked by the fetcher's open transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockedPhase {
    Waiting,
    /// Started this long ago.
    Running(Duration),
    /// Its task returned (or it ended without starting).
    Done,
    /// No longer in the ledger (a new identity dropped it).
    Gone,
}

/// A held attempt the beat took out of the board ended without running: why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unstarted {
    Aborted,
    Cancelled,
    /// Its queue was paused, or it waited too long for a thread: back to the queue.
    GivenBack,
    /// Its deadline came before it started.
    Expired,
}

/// A held attempt that claimed at `claimed` about to be noted: see [`Ledger::hold`].
pub(crate) struct Hold {
    pub(crate) key: AttemptKey,
    pub(crate) queue: Arc<str>,
    pub(crate) held: bool,
    /// Only locked, in the fetcher's open transaction (held too).
    pub(crate) locked: bool,
    pub(crate) claimed: Instant,
    pub(crate) expires: Option<Instant>,
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
                control_read: None,
                paused: Paused::default(),
                running: 0,
                starts_pending: 0,
                last_start: None,
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
    pub(crate) fn hold(&self, holds: impl IntoIterator<Item = Hold>) {
        let mut s = self.state();
        for h in holds {
            s.entries.insert(
                h.key,
                Entry {
                    phase: Phase::Waiting,
                    abort_confirmed: false,
                    cancel_confirmed: false,
                    held: h.held,
                    locked: h.locked,
                    start_due: None,
                    claimed: h.claimed,
                    queue: h.queue,
                    expires: h.expires,
                },
            );
        }
    }

    /// Decides whether `key` may start now; on `Start`, registers it as running, its start
    /// to be written `write_start_in` from now if it was held.
    pub(crate) fn begin(
        &self,
        key: AttemptKey,
        write_start_in: Duration,
        running: impl FnOnce() -> RunningJob,
    ) -> Begin {
        let mut s = self.state();
        let current = s.worker;
        let now = Instant::now();
        let lease_ok = now < s.lease_until;
        let suspected = s.suspects.contains_key(&key.id);
        let control_read = s.control_read;
        let st = &mut *s;
        let Some(entry) = st.entries.get_mut(&key) else {
            return Begin::NotOurs;
        };
        if !matches!(entry.phase, Phase::Waiting) {
            return Begin::NotOurs;
        }
        if key.worker != current {
            st.entries.remove(&key);
            self.changed.notify_all();
            return Begin::NotOurs;
        }
        if entry.abort_confirmed || entry.cancel_confirmed {
            entry.phase = Phase::Done;
            return Begin::AbortedBeforeStart {
                cancel: entry.cancel_confirmed && !entry.abort_confirmed,
            };
        }
        if entry.expired(now) {
            entry.phase = Phase::Done;
            return Begin::Expired;
        }
        if entry.held {
            let read = control_read.map_or(entry.claimed, |r| r.max(entry.claimed));
            if st.paused.covers(&entry.queue) && control_read.is_some_and(|r| r >= entry.claimed) {
                entry.phase = Phase::Done;
                return Begin::GiveBack;
            }
            if now.saturating_duration_since(read) >= CONTROL_SPAN {
                return Begin::Wait;
            }
        }
        if suspected || !lease_ok {
            return Begin::Wait;
        }
        let write_start = entry.held && !entry.locked;
        entry.start_due = write_start.then(|| now + write_start_in);
        entry.phase = Phase::Running(running());
        st.running += 1;
        st.starts_pending += usize::from(write_start);
        st.last_start = Some(now);
        Begin::Start
    }

    /// True when a held attempt waits for a control poll (what the worker read is too old
    /// for it to start).
    pub(crate) fn needs_control_read(&self) -> bool {
        let s = self.state();
        let now = Instant::now();
        s.entries.values().any(|e| {
            e.held
                && matches!(e.phase, Phase::Waiting)
                && now.saturating_duration_since(
                    s.control_read.map_or(e.claimed, |r| r.max(e.claimed)),
                ) >= CONTROL_SPAN / 2
        })
    }

    /// A control poll sent at `sent` answered: `aborts` the held jobs whose abort (false)
    /// or cancel (true) was requested, `paused` the pauses. Running attempts whose abort
    /// was requested get their flag raised; waiting ones are marked to end without running
    /// (see [`take_unstarted`](Self::take_unstarted)). Clears the suspicions that arrived
    /// before the poll of `generation` began. Returns the (job, task) of the running jobs
    /// whose flag was raised now.
    pub(crate) fn control_read(
        &self,
        sent: Instant,
        aborts: &[(JobId, bool)],
        paused: Paused,
        generation: u64,
    ) -> Vec<(JobId, String)> {
        let mut s = self.state();
        if s.control_read.is_none_or(|r| r < sent) {
            s.control_read = Some(sent);
            s.paused = paused;
        }
        let current = s.worker;
        let mut raised = Vec::new();
        for (key, entry) in s.entries.iter_mut() {
            if key.worker != current {
                continue;
            }
            let Some(&(_, cancel)) = aborts.iter().find(|(id, _)| *id == key.id) else {
                continue;
            };
            match &entry.phase {
                Phase::Waiting if cancel => entry.cancel_confirmed = true,
                Phase::Waiting => entry.abort_confirmed = true,
                // A cancel is for a job that waits: a running one runs on.
                Phase::Running(r) if !cancel && r.abort.get() & ABORT_REQUESTED == 0 => {
                    r.abort.raise(ABORT_REQUESTED);
                    raised.push((key.id, r.task.clone()));
                }
                _ => {}
            }
        }
        s.suspects.retain(|_, g| *g >= generation);
        self.changed.notify_all();
        raised
    }

    /// Whether the held attempt `key`, waiting on the board, must end without running: its
    /// abort or cancel was read, its queue is paused, or it has waited `give_back_after`
    /// while no attempt started for [`STALLED_STARTS`] (a worker whose threads take one job
    /// after another keeps the jobs it holds: they are on their way).
    /// Marks it done (its outcome is the caller's to send) and says why.
    pub(crate) fn take_unstarted(
        &self,
        key: &AttemptKey,
        give_back_after: Duration,
    ) -> Option<Unstarted> {
        let mut s = self.state();
        let control_read = s.control_read;
        let now = Instant::now();
        let stalled = s.stalled(now);
        let st = &mut *s;
        let entry = st.entries.get_mut(key)?;
        if !matches!(entry.phase, Phase::Waiting) || key.worker != st.worker {
            return None;
        }
        let why = if entry.abort_confirmed {
            Unstarted::Aborted
        } else if entry.cancel_confirmed {
            Unstarted::Cancelled
        } else if entry.expired(now) {
            Unstarted::Expired
        } else if entry.held
            && ((st.paused.covers(&entry.queue)
                && control_read.is_some_and(|r| r >= entry.claimed))
                || (stalled && now.saturating_duration_since(entry.claimed) >= give_back_after))
        {
            Unstarted::GivenBack
        } else {
            return None;
        };
        entry.phase = Phase::Done;
        Some(why)
    }

    /// True when some waiting attempt may have to end without running (see
    /// [`take_unstarted`](Self::take_unstarted)): worth a look at the board.
    pub(crate) fn any_unstarted_to_end(&self, give_back_after: Duration) -> bool {
        let s = self.state();
        let now = Instant::now();
        let stalled = s.stalled(now);
        s.entries.iter().any(|(k, e)| {
            matches!(e.phase, Phase::Waiting)
                && k.worker == s.worker
                && (e.abort_confirmed
                    || e.cancel_confirmed
                    || e.expired(now)
                    || (e.held
                        && ((s.paused.covers(&e.queue)
                            && s.control_read.is_some_and(|r| r >= e.claimed))
                            || (stalled
                                && now.saturating_duration_since(e.claimed) >= give_back_after))))
        })
    }

    /// Running held attempts whose start is due to be written, with how long ago each
    /// started (µs); each is handed out once.
    pub(crate) fn due_starts(&self) -> Vec<(AttemptKey, i64)> {
        let mut s = self.state();
        if s.starts_pending == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        let mut due = Vec::new();
        let st = &mut *s;
        for (k, e) in st.entries.iter_mut() {
            if let (Some(at), Phase::Running(r)) = (e.start_due, &e.phase) {
                if at <= now {
                    e.start_due = None;
                    st.starts_pending -= 1;
                    due.push((
                        *k,
                        r.started.elapsed().as_micros().min(i64::MAX as u128) as i64,
                    ));
                }
            }
        }
        due
    }

    /// When the next start is due to be written, if any.
    pub(crate) fn next_start_due(&self) -> Option<Instant> {
        let s = self.state();
        if s.starts_pending == 0 {
            return None;
        }
        s.entries.values().filter_map(|e| e.start_due).min()
    }

    /// Running attempts.
    pub(crate) fn running(&self) -> usize {
        self.state().running
    }

    /// Running attempts, and those of them expected to end within `horizon`, by
    /// `expected(task)`, the typical run time of a task: one that has run for about that
    /// long. One that ran past twice that may run for long yet, and one far from it will
    /// not end soon.
    pub(crate) fn running_and_ending_soon(
        &self,
        horizon: Duration,
        expected: impl Fn(&str) -> Duration,
    ) -> (usize, usize) {
        let s = self.state();
        if s.running == 0 {
            return (0, 0);
        }
        let ending = s
            .entries
            .values()
            .filter(|e| match &e.phase {
                Phase::Running(r) => {
                    let typical = expected(&r.task);
                    let ran = r.started.elapsed();
                    ran + horizon >= typical && ran <= typical * 2 + horizon
                }
                _ => false,
            })
            .count();
        (s.running, ending)
    }

    /// Waits until something that [`begin`](Self::begin) depends on changes, or `timeout`.
    pub(crate) fn wait_change(&self, timeout: Duration) {
        let s = self.state();
        let _ = self.changed.wait_timeout(s, timeout);
    }

    /// The task of `key` has returned: its outcome is on its way.
    pub(crate) fn finish(&self, key: AttemptKey) {
        let mut s = self.state();
        let st = &mut *s;
        if let Some(e) = st.entries.get_mut(&key) {
            if matches!(e.phase, Phase::Running(_)) {
                st.running -= 1;
            }
            if e.start_due.take().is_some() {
                st.starts_pending -= 1;
            }
            e.phase = Phase::Done;
        }
    }

    /// Where each of `keys` (attempts only locked, `locked.rs`) stands: not started,
    /// running for how long, ended, or gone from the ledger.
    pub(crate) fn locked_phases(&self, keys: &[AttemptKey]) -> Vec<LockedPhase> {
        let s = self.state();
        keys.iter()
            .map(|k| match s.entries.get(k).map(|e| &e.phase) {
                None => LockedPhase::Gone,
                Some(Phase::Waiting) => LockedPhase::Waiting,
                Some(Phase::Running(r)) => LockedPhase::Running(r.started.elapsed()),
                Some(Phase::Done) => LockedPhase::Done,
            })
            .collect()
    }

    /// The table now has `key` as any claim leaves a job (`locked.rs` wrote it): started
    /// (`started`, its start written), or held. A held one that started meanwhile has its
    /// start written soon, as any held job's.
    pub(crate) fn unlock(&self, key: AttemptKey, started: bool) {
        let mut s = self.state();
        let st = &mut *s;
        let Some(e) = st.entries.get_mut(&key) else {
            return;
        };
        if !e.locked {
            return;
        }
        e.locked = false;
        if started {
            e.held = false;
        } else if let Phase::Running(_) = e.phase {
            if e.start_due.is_none() {
                e.start_due = Some(Instant::now());
                st.starts_pending += 1;
            }
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

    /// True when some attempt runs or waits to start.
    pub(crate) fn any_held(&self) -> bool {
        self.state()
            .entries
            .values()
            .any(|e| matches!(e.phase, Phase::Running(_) | Phase::Waiting))
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

    fn h(k: AttemptKey) -> Hold {
        Hold {
            locked: false,
            key: k,
            queue: Arc::from("q"),
            held: false,
            claimed: Instant::now(),
            expires: None,
        }
    }

    fn held(k: AttemptKey) -> Hold {
        Hold { held: true, ..h(k) }
    }

    const D0: Duration = Duration::ZERO;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn an_attempt_starts_once_and_counts_until_settled() {
        let l = Ledger::new(1, later());
        l.hold([h(key(10, 1))]);
        assert_eq!(l.held(), 1);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Start);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::NotOurs);
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
    fn a_held_attempt_past_its_deadline_ends_expired_and_never_starts() {
        let l = Ledger::new(1, later());
        let past = Instant::now();
        l.hold([
            Hold {
                expires: Some(past),
                ..held(key(10, 1))
            },
            Hold {
                expires: Some(later()),
                ..held(key(11, 1))
            },
            // Started at its claim (a limited queue): it has started, the deadline is moot.
            Hold {
                expires: Some(past),
                ..h(key(12, 1))
            },
            Hold {
                expires: Some(past),
                ..held(key(13, 1))
            },
        ]);
        l.control_read(Instant::now(), &[], Paused::default(), 0);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Expired);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::NotOurs);
        assert_eq!(l.begin(key(11, 1), D0, job), Begin::Start);
        assert_eq!(l.begin(key(12, 1), D0, job), Begin::Start);
        assert!(l.any_unstarted_to_end(Duration::from_secs(60)));
        assert_eq!(
            l.take_unstarted(&key(13, 1), Duration::from_secs(60)),
            Some(Unstarted::Expired)
        );
    }

    #[test]
    fn a_lapsed_lease_holds_every_start() {
        let l = Ledger::new(1, Instant::now());
        l.hold([h(key(10, 1))]);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Wait);
        l.renew_lease(later());
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Start);
    }

    #[test]
    fn a_new_identity_drops_waiting_attempts_and_stops_running_ones() {
        let l = Ledger::new(1, later());
        l.hold([h(key(10, 1)), h(key(11, 1))]);
        let flag = Arc::new(AbortFlag::default());
        let f2 = flag.clone();
        assert_eq!(
            l.begin(key(10, 1), D0, || RunningJob { abort: f2, ..job() }),
            Begin::Start
        );
        assert_eq!(l.new_identity(2, later()), (1, 1));
        assert_eq!(flag.get() & ABORT_LOST, ABORT_LOST);
        assert_eq!(l.begin(key(11, 1), D0, job), Begin::NotOurs);
        // The same job claimed again by the new identity is a different attempt.
        l.hold([h(AttemptKey {
            attempt: 2,
            ..key(10, 2)
        })]);
        assert_eq!(l.held_ids(), vec![10]);
        assert_eq!(l.held(), 2);
    }

    #[test]
    fn a_notification_only_holds_a_start_until_the_table_answers() {
        let l = Ledger::new(1, later());
        l.hold([h(key(10, 1)), h(key(11, 1))]);
        assert!(l.suspect(JobId(10)));
        assert!(l.suspect(JobId(11)));
        assert!(!l.suspect(JobId(99)), "not held here: nothing to hold");
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Wait);
        let g = l.poll_begins();
        // The table confirms 11 only.
        assert!(l
            .control_read(Instant::now(), &[(JobId(11), false)], Paused::default(), g)
            .is_empty());
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Start);
        assert_eq!(
            l.begin(key(11, 1), D0, job),
            Begin::AbortedBeforeStart { cancel: false }
        );
    }

    #[test]
    fn a_suspicion_newer_than_the_poll_survives_it() {
        let l = Ledger::new(1, later());
        l.hold([h(key(10, 1))]);
        let g = l.poll_begins();
        assert!(l.suspect(JobId(10)));
        l.control_read(Instant::now(), &[], Paused::default(), g);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Wait);
        let g = l.poll_begins();
        l.control_read(Instant::now(), &[], Paused::default(), g);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Start);
    }

    #[test]
    fn a_held_attempt_starts_only_on_a_recent_read_of_the_controls() {
        let l = Ledger::new(1, later());
        let old = Instant::now() - CONTROL_SPAN * 2;
        l.hold([Hold {
            claimed: old,
            ..held(key(10, 1))
        }]);
        assert!(l.needs_control_read());
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Wait);
        let g = l.poll_begins();
        l.control_read(Instant::now(), &[], Paused::default(), g);
        assert!(!l.needs_control_read());
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Start);
        // Its start is written once, when due.
        assert_eq!(l.due_starts().len(), 1);
        assert!(l.due_starts().is_empty());
        assert_eq!(l.running(), 1);
    }

    #[test]
    fn a_pause_read_after_the_claim_gives_a_held_attempt_back() {
        let l = Ledger::new(1, later());
        l.hold([held(key(10, 1)), held(key(11, 1)), h(key(12, 1))]);
        let g = l.poll_begins();
        let paused = Paused {
            all: false,
            queues: ["q".to_owned()].into_iter().collect(),
        };
        l.control_read(Instant::now(), &[(JobId(11), true)], paused, g);
        assert!(l.any_unstarted_to_end(Duration::from_secs(60)));
        assert_eq!(
            l.take_unstarted(&key(11, 1), Duration::from_secs(60)),
            Some(Unstarted::Cancelled)
        );
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::GiveBack);
        // Started by its claim (a limited queue), not held: a pause does not reach it.
        assert_eq!(l.begin(key(12, 1), D0, job), Begin::Start);
    }

    #[test]
    fn a_held_attempt_that_waited_too_long_is_given_back() {
        let l = Ledger::new(1, later());
        l.hold([held(key(10, 1))]);
        assert_eq!(l.take_unstarted(&key(10, 1), Duration::from_secs(60)), None);
        assert_eq!(
            l.take_unstarted(&key(10, 1), Duration::ZERO),
            Some(Unstarted::GivenBack)
        );
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::NotOurs);
    }

    #[test]
    fn ending_soon_counts_jobs_near_their_typical_time() {
        let l = Ledger::new(1, later());
        l.hold([h(key(10, 1)), h(key(11, 1))]);
        assert_eq!(l.begin(key(10, 1), D0, job), Begin::Start);
        let ms = Duration::from_millis(1);
        // "task" typically takes 1 ms: just started, it ends soon.
        assert_eq!(l.running_and_ending_soon(ms, |_| ms), (1, 1));
        // Typically 20 s: not soon.
        assert_eq!(
            l.running_and_ending_soon(ms, |_| Duration::from_secs(20)),
            (1, 0)
        );
    }
}
