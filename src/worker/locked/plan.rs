//! What a settle writes of each job a claim only locked (`Plan`), and the outcomes the
//! executors leave for it (`Absorb`).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::super::idhash::IdMap;
use super::super::ledger::{AttemptKey, LockedPhase};
use super::super::outcome::OutcomeKind;
use super::super::{Outcome, Shared};

/// The outcomes of locked jobs, kept from the completer while their transaction is open
/// or its fate unknown.
#[derive(Default)]
pub(crate) struct Absorb {
    pub(super) keys: Mutex<IdMap<AttemptKey, Option<Outcome>>>,
    /// Signalled when a job's row has been written (its key removed).
    pub(super) written: Condvar,
}

impl Absorb {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdMap<AttemptKey, Option<Outcome>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn add(&self, keys: impl IntoIterator<Item = AttemptKey>) {
        let mut m = self.lock();
        for k in keys {
            m.insert(k, None);
        }
    }

    /// An executor's outcome: kept when its job is locked (`None`), else given back for
    /// the completer.
    pub(crate) fn absorb(&self, o: Outcome) -> Option<Outcome> {
        let mut m = self.lock();
        match m.get_mut(&o.key) {
            Some(slot) => {
                *slot = Some(o);
                None
            }
            None => Some(o),
        }
    }

    /// What the job of `key` ended with, if it did: its kind, whether it has an output,
    /// and how long it ran.
    pub(super) fn peek(&self, keys: &[AttemptKey]) -> Vec<Option<Ended>> {
        let m = self.lock();
        keys.iter()
            .map(|k| {
                m.get(k).and_then(|o| o.as_ref()).map(|o| Ended {
                    kind: o.kind,
                    output: o.output.is_some(),
                    ran: o.ran,
                })
            })
            .collect()
    }

    /// Forgets `keys` at once, returning the outcome of each that came.
    pub(super) fn remove_all(&self, keys: &[AttemptKey]) -> Vec<Option<Outcome>> {
        let mut m = self.lock();
        let out = keys.iter().map(|k| m.remove(k).flatten()).collect();
        drop(m);
        self.written.notify_all();
        out
    }

    /// Forgets `key`, returning its outcome if one came.
    pub(super) fn remove(&self, key: &AttemptKey) -> Option<Outcome> {
        let o = self.lock().remove(key).flatten();
        self.written.notify_all();
        o
    }

    /// Waits until the row of `key` is written as any claim leaves it (`doing`, or its
    /// outcome), at most `timeout`: a task that writes to its own row (its progress) needs
    /// it so. True when it is (or never was only locked).
    pub(crate) fn wait_written(&self, key: &AttemptKey, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut m = self.lock();
        while m.contains_key(key) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            m = self
                .written
                .wait_timeout(m, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// What an executor said of a locked job it ended.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ended {
    kind: OutcomeKind,
    output: bool,
    ran: Option<Duration>,
}

/// What a settle writes of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Write {
    Succeeded,
    /// Succeeded, and deleted (the worker deletes jobs that succeed).
    Delete,
    /// Running (or ended otherwise), started this many µs ago.
    Running,
    /// Not started.
    Held,
    /// Not written: it goes back to the queue when the transaction ends (given back
    /// unstarted, or no longer this worker's).
    Release,
}

impl Write {
    pub(super) fn word(self) -> &'static str {
        match self {
            Write::Succeeded => "succeeded",
            Write::Delete => "delete",
            Write::Running => "running",
            Write::Held => "held",
            Write::Release => "release",
        }
    }
}

/// The writes of one settle, and their parameters.
pub(super) struct Plan {
    pub(super) worker: i64,
    pub(super) keys: Vec<AttemptKey>,
    pub(super) writes: Vec<Write>,
    /// How long each job of `keys` had run.
    pub(super) ran: Vec<Option<Duration>>,
    pub(super) ids: Vec<i64>,
    pub(super) attempts: Vec<i32>,
    pub(super) words: Vec<&'static str>,
    pub(super) outputs: Vec<Option<serde_json::Value>>,
    pub(super) ran_us: Vec<Option<i64>>,
}

impl Plan {
    /// What to write of `keys` now, from what the ledger and the executors say.
    pub(super) fn new(shared: &Shared, keys: &[AttemptKey]) -> Plan {
        let phases = shared.ledger.locked_phases(keys);
        let mut plan = Plan {
            worker: keys.first().map_or(0, |k| k.worker),
            keys: Vec::with_capacity(keys.len()),
            writes: Vec::with_capacity(keys.len()),
            ran: Vec::with_capacity(keys.len()),
            ids: Vec::with_capacity(keys.len()),
            attempts: Vec::with_capacity(keys.len()),
            words: Vec::with_capacity(keys.len()),
            outputs: Vec::with_capacity(keys.len()),
            ran_us: Vec::with_capacity(keys.len()),
        };
        let ended = shared.absorb.peek(keys);
        for ((k, phase), ended) in keys.iter().zip(phases).zip(ended) {
            let (write, ran) = match (ended, phase) {
                (_, LockedPhase::Gone) => (Write::Release, None),
                // Ended without starting: given back.
                (Some(e), _) if e.ran.is_none() => (Write::Release, None),
                (Some(e), _) if e.kind == OutcomeKind::Succeeded && !e.output => {
                    (Write::Succeeded, e.ran)
                }
                // A success whose row the worker deletes.
                (Some(e), _) if e.kind == OutcomeKind::Delete => (Write::Delete, e.ran),
                (Some(e), _) => (Write::Running, e.ran),
                (None, LockedPhase::Running(ran)) => (Write::Running, Some(ran)),
                // Its task returned; its outcome is on its way here.
                (None, LockedPhase::Done) => (Write::Running, Some(Duration::ZERO)),
                (None, LockedPhase::Waiting) => (Write::Held, None),
            };
            plan.push(*k, write, ran);
        }
        plan
    }

    /// Every job written held (none started yet: the claim's reply just came).
    pub(super) fn all_held(keys: &[AttemptKey]) -> Plan {
        let mut plan = Plan {
            worker: keys.first().map_or(0, |k| k.worker),
            keys: Vec::new(),
            writes: Vec::new(),
            ran: Vec::new(),
            ids: Vec::new(),
            attempts: Vec::new(),
            words: Vec::new(),
            outputs: Vec::new(),
            ran_us: Vec::new(),
        };
        for k in keys {
            plan.push(*k, Write::Held, None);
        }
        plan
    }

    /// The same jobs with each write changed by `f`, or only the `only`-th job.
    pub(super) fn rebuilt(&self, f: impl Fn(Write) -> Write, only: Option<usize>) -> Plan {
        let mut plan = Plan::all_held(&[]);
        plan.worker = self.worker;
        for (i, ((k, w), ran)) in self
            .keys
            .iter()
            .zip(&self.writes)
            .zip(&self.ran)
            .enumerate()
        {
            if only.is_none_or(|o| o == i) {
                plan.push(*k, f(*w), *ran);
            }
        }
        plan
    }

    pub(super) fn push(&mut self, k: AttemptKey, write: Write, ran: Option<Duration>) {
        self.keys.push(k);
        self.writes.push(write);
        self.ran.push(ran);
        if write == Write::Release {
            return;
        }
        self.ids.push(k.id.0);
        self.attempts.push(k.attempt);
        self.words.push(write.word());
        self.outputs.push(None);
        self.ran_us
            .push(ran.map(|d| d.as_micros().min(i64::MAX as u128) as i64));
    }

    pub(super) fn params<'a>(
        &'a self,
        xid: &'a String,
    ) -> [&'a (dyn postgres::types::ToSql + Sync); 7] {
        [
            &self.worker,
            xid,
            &self.ids,
            &self.attempts,
            &self.words,
            &self.outputs,
            &self.ran_us,
        ]
    }
}
