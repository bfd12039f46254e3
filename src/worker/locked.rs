//! Claims whose jobs are written once (`WorkerBuilder::claim_in_outcome_transaction`).
//!
//! A claim usually writes each job's row (`doing`), and its outcome writes it again. Here
//! the claim only locks the jobs that need no row of their own while they run (no `lock`,
//! no deadline, no abort request, no limited queue), in a transaction the fetcher keeps
//! open on its connection while the executors run them; the next claim's round-trip first
//! writes each of them once (`postpone_settle_locked`) and commits: `succeeded` for those
//! that ended so, `doing` for those still running (or ended otherwise: their outcome is
//! then recorded as any running job's) and, held, for those not started yet. A transaction
//! lives at most [`CYCLE`]: the fetcher commits it before it waits for anything longer.
//!
//! Before any job of such a claim starts, the worker notes the claim on its own row, on a
//! connection of its own (`postpone_note_claim`, committed): the transaction's id and the
//! jobs. A server that loses the transaction (a restart, a failover, a terminated session)
//! leaves the jobs `todo` and unlocked, but while the noted transaction is `aborted` no
//! claim takes them. The worker then writes what became of them itself, by that id, and
//! clears the note in the same transaction ([`Locked::recover`]); a worker presumed dead
//! first has them requeued by the rescue, each with its attempt counted. A transaction
//! whose fate the worker does not know (the link failed during its commit) is asked about
//! on the note's connection; one still open on a session the worker lost (half-open) is
//! ended there first (`pg_terminate_backend`).
//!
//! The outcomes of the locked jobs do not go to the completer: the executors leave them
//! here ([`Absorb`]) until the transaction's fate is known, and those not written with it
//! go to the completer after.
//!
//! When the note cannot be written (its connection fails, the server refuses one), the
//! claim's jobs are written held at once, in a second round-trip, and handed out as any
//! claim's: the worker goes on as without this mode.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::claim::{parse_claim, Budget, Keyed};
use super::idhash::IdMap;
use super::ledger::{AttemptKey, LockedPhase};
use super::link::Link;
use super::outcome::OutcomeKind;
use super::{Outcome, Shared};
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::store;

/// How long a transaction of locked jobs stays open at most: a job running longer is
/// written `doing` then (as a held job's start is written after `exec::START_DELAY`).
pub(crate) const CYCLE: Duration = Duration::from_millis(5);

/// Most jobs the first claim locks; later claims lock more while the executors end them all
/// within the transaction's time, fewer when many were still waiting or running.
const FIRST_CAP: usize = 64;

/// Most jobs a claim ever locks (the adaptive prefetch's own cap).
const MAX_CAP: usize = super::fetch::MAX_PREFETCH;

/// How long after the server refused the note's connection the worker claims as usual.
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// The outcomes of locked jobs, kept from the completer while their transaction is open
/// or its fate unknown.
#[derive(Default)]
pub(crate) struct Absorb {
    keys: Mutex<IdMap<AttemptKey, Option<Outcome>>>,
}

impl Absorb {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdMap<AttemptKey, Option<Outcome>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, keys: impl IntoIterator<Item = AttemptKey>) {
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
    fn peek(&self, key: &AttemptKey) -> Option<(OutcomeKind, bool, Option<Duration>)> {
        self.lock()
            .get(key)
            .and_then(|o| o.as_ref())
            .map(|o| (o.kind, o.output.is_some(), o.ran))
    }

    /// Forgets `key`, returning its outcome if one came.
    fn remove(&self, key: &AttemptKey) -> Option<Outcome> {
        self.lock().remove(key).flatten()
    }
}

/// What a settle writes of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Succeeded,
    /// Running (or ended otherwise), started this many µs ago.
    Running,
    /// Not started.
    Held,
    /// Not written: it goes back to the queue when the transaction ends (given back
    /// unstarted, or no longer this worker's).
    Release,
}

impl Write {
    fn word(self) -> &'static str {
        match self {
            Write::Succeeded => "succeeded",
            Write::Running => "running",
            Write::Held => "held",
            Write::Release => "release",
        }
    }
}

/// The writes of one settle, and their parameters.
struct Plan {
    worker: i64,
    keys: Vec<AttemptKey>,
    writes: Vec<Write>,
    ids: Vec<i64>,
    attempts: Vec<i32>,
    words: Vec<&'static str>,
    outputs: Vec<Option<serde_json::Value>>,
    ran_us: Vec<Option<i64>>,
}

impl Plan {
    /// What to write of `keys` now, from what the ledger and the executors say.
    fn new(shared: &Shared, keys: &[AttemptKey]) -> Plan {
        let phases = shared.ledger.locked_phases(keys);
        let mut plan = Plan {
            worker: keys.first().map_or(0, |k| k.worker),
            keys: Vec::with_capacity(keys.len()),
            writes: Vec::with_capacity(keys.len()),
            ids: Vec::with_capacity(keys.len()),
            attempts: Vec::with_capacity(keys.len()),
            words: Vec::with_capacity(keys.len()),
            outputs: Vec::with_capacity(keys.len()),
            ran_us: Vec::with_capacity(keys.len()),
        };
        for (k, phase) in keys.iter().zip(phases) {
            let (write, ran) = match (shared.absorb.peek(k), phase) {
                (_, LockedPhase::Gone) => (Write::Release, None),
                (Some((OutcomeKind::Succeeded, false, Some(ran))), _) => {
                    (Write::Succeeded, Some(ran))
                }
                (Some((_, _, Some(ran))), _) => (Write::Running, Some(ran)),
                // Ended without starting: given back.
                (Some((_, _, None)), _) => (Write::Release, None),
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
    fn all_held(keys: &[AttemptKey]) -> Plan {
        let mut plan = Plan {
            worker: keys.first().map_or(0, |k| k.worker),
            keys: Vec::new(),
            writes: Vec::new(),
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

    fn push(&mut self, k: AttemptKey, write: Write, ran: Option<Duration>) {
        self.keys.push(k);
        self.writes.push(write);
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

    fn params<'a>(&'a self, xid: &'a String) -> [&'a (dyn postgres::types::ToSql + Sync); 7] {
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

/// The transaction open on the fetcher's connection.
struct Open {
    /// Its id (NULL until it locked a row).
    xid: Option<String>,
    /// The server process of the fetcher's session.
    pid: Option<i32>,
    keys: Vec<AttemptKey>,
    begun: Instant,
}

/// A transaction whose jobs the worker must still write itself: it was rolled back, or its
/// commit's fate is unknown.
struct Lost {
    xid: String,
    pid: Option<i32>,
    keys: Vec<AttemptKey>,
    /// The plan sent with the commit whose fate is unknown (`None`: it surely did not
    /// commit).
    sent: Option<Plan>,
}

/// The fetcher's side of this mode (see the module's comment).
pub(crate) struct Locked<'a> {
    shared: &'a Shared,
    notes: Link<'a, ()>,
    open: Option<Open>,
    lost: Option<Lost>,
    /// The note's connection was refused: claims go as usual until then.
    not_before: Option<Instant>,
    out: Sender<Outcome>,
    /// Most jobs a claim locks: as many as the executors ended within one transaction's
    /// time, as the last ones found (see `finish`).
    cap: usize,
}

impl<'a> Locked<'a> {
    pub(crate) fn new(shared: &'a Shared, out: Sender<Outcome>) -> Self {
        Locked {
            shared,
            notes: Link::new(shared, "noting claims"),
            open: None,
            lost: None,
            not_before: None,
            out,
            cap: FIRST_CAP.max(shared.opts.concurrency),
        }
    }

    /// A lost transaction waits to be written: try now (the note's connection keeps its
    /// own backoff between failures).
    pub(crate) fn tick(&mut self) {
        if self.lost.is_some() {
            self.recover();
        }
    }

    /// Most jobs the next claim may lock.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Whether the next claim may lock its jobs: the mode is on, no lost transaction waits
    /// to be written, and the note's connection was not refused lately. (Through a
    /// transaction pooler, which keeps no session, the caller claims as usual.)
    pub(crate) fn usable(&mut self) -> bool {
        self.shared.opts.locked_claims
            && self.lost.is_none()
            && self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// How long the open transaction may stay open yet (`None`: none is open).
    pub(crate) fn time_left(&self) -> Option<Duration> {
        self.open
            .as_ref()
            .map(|o| CYCLE.saturating_sub(o.begun.elapsed()))
    }

    /// A claim of up to `limit` jobs whose unstarted ones are only locked, in a round-trip
    /// that first writes and commits the open transaction's jobs. Returns the jobs handed
    /// out by the caller, and whether the claim left a job for its size.
    pub(crate) fn claim(
        &mut self,
        conn: &mut Connection,
        limit: usize,
        start: usize,
        budget: Budget,
        task_names: &Option<Vec<String>>,
    ) -> Result<(Keyed, bool)> {
        let shared = self.shared;
        let id = shared.id();
        let limit = limit.min(i32::MAX as usize) as i32;
        let start = start.min(i32::MAX as usize) as i32;
        let bytes = budget.bytes.min(i64::MAX as usize) as i64;
        let lock_only = true;
        let claim_params: [&(dyn postgres::types::ToSql + Sync); 8] = [
            &id,
            &limit,
            &shared.opts.queues,
            task_names,
            &start,
            &bytes,
            &budget.alone,
            &lock_only,
        ];
        let open = self.open.take();
        let plan = open
            .as_ref()
            .filter(|o| o.xid.is_some())
            .map(|o| Plan::new(shared, &o.keys));
        let xid = open
            .as_ref()
            .and_then(|o| o.xid.clone())
            .unwrap_or_default();
        let settle_params = plan.as_ref().map(|p| p.params(&xid));
        // Outcomes do not ride on these claims: the completer records them at once.
        shared.ride.claiming(false);
        let sent = shared.due.sending();
        shared.stats.claims.fetch_add(1, Ordering::Relaxed);
        let res = conn.query_cached_cycle(
            "writing locked jobs and claiming jobs",
            settle_params
                .as_ref()
                .map(|p| (store::LOCKED_SETTLE, &p[..])),
            Some((store::JOB_CLAIM, &claim_params)),
        );
        let cycle = match res {
            Ok(c) => c,
            Err(e) => {
                // The link failed: the open transaction's fate is unknown, and the new one
                // (if any) dies with the session, its jobs never handed out.
                if let Some(o) = open {
                    self.lose(o, plan);
                }
                return Err(e);
            }
        };
        if let Some(o) = open {
            self.after_commit(o, plan, cycle.settled, cycle.commit_failed);
        }
        let mut rows = match cycle.claimed {
            Some(Ok(rows)) => rows,
            Some(Err(e)) => return Err(e),
            None => return Err(Error::new(ErrorKind::Other, "claiming jobs: not sent")),
        };
        let xid = rows.first().and_then(|r| r.get::<_, Option<String>>(17));
        let pid = rows.first().and_then(|r| r.get::<_, Option<i32>>(18));
        let (claimed, cut) = parse_claim(shared, &mut rows, sent);
        let locked: Vec<AttemptKey> = claimed
            .iter()
            .filter(|(_, c)| c.locked)
            .map(|(_, c)| c.key())
            .collect();
        if locked.is_empty() {
            // Nothing only locked: the transaction stays open until the next round-trip
            // ends it (it holds no lock, and the held jobs it claimed are written but not
            // committed yet: a claim that took some commits now).
            if claimed.iter().any(|(_, c)| !c.locked) {
                conn.commit()?;
            } else {
                self.open = Some(Open {
                    xid: None,
                    pid,
                    keys: Vec::new(),
                    begun: Instant::now(),
                });
            }
            return Ok((claimed, cut));
        }
        let Some(xid) = xid else {
            // Rows locked without a transaction id cannot be: treat it as a failure.
            let _ = conn.rollback();
            return Err(Error::new(
                ErrorKind::Other,
                "claiming jobs: the claim locked jobs but returned no transaction id",
            ));
        };
        // Jobs claimed held beside the locked ones (a `lock`, a deadline): the claim is
        // committed now, every job written as any claim writes it.
        let mixed = claimed.iter().any(|(_, c)| !c.locked);
        if !mixed && self.note(&xid, &locked) {
            self.shared.absorb.add(locked.iter().copied());
            self.open = Some(Open {
                xid: Some(xid),
                pid,
                keys: locked,
                begun: Instant::now(),
            });
            return Ok((claimed, cut));
        }
        self.commit_held(conn, &xid, &locked)?;
        Ok((
            claimed
                .into_iter()
                .map(|(t, mut c)| {
                    c.locked = false;
                    (t, c)
                })
                .collect(),
            cut,
        ))
    }

    /// Writes every locked job of the claim just made held, and commits: they are then
    /// claimed as without this mode. Fails when the write does not commit (the jobs are
    /// not handed out: they go back to the queue with the transaction).
    fn commit_held(
        &mut self,
        conn: &mut Connection,
        xid: &String,
        keys: &[AttemptKey],
    ) -> Result<()> {
        let plan = Plan::all_held(keys);
        let params = plan.params(xid);
        let cycle = conn.query_cached_cycle(
            "writing claimed jobs held",
            Some((store::LOCKED_SETTLE, &params[..])),
            None,
        )?;
        match cycle.settled {
            Some(Ok(rows)) if !cycle.commit_failed && rows.len() == keys.len() => Ok(()),
            Some(Err(e)) => Err(e),
            _ => Err(Error::new(
                ErrorKind::Other,
                "writing claimed jobs held: not every job was written; none is handed out",
            )),
        }
    }

    /// Notes the claim (committed, on the note's connection) before its jobs start; first
    /// writes a lost transaction's jobs, which the note would otherwise forget. False: the
    /// note was not written (the jobs must not start only locked).
    fn note(&mut self, xid: &String, keys: &[AttemptKey]) -> bool {
        if self.lost.is_some() && !self.recover() {
            return false;
        }
        let shared = self.shared;
        let ids: Vec<i64> = keys.iter().map(|k| k.id.0).collect();
        let worker = keys[0].worker;
        let res = match self.notes.get() {
            Ok((c, ())) => c
                .query_cached(
                    "noting claims",
                    store::CLAIM_NOTE,
                    &[&worker, &Some(xid), &ids],
                )
                .map(|rows| rows.first().is_some_and(|r| r.get::<_, bool>(0))),
            Err(_) => {
                if self.notes.refused() {
                    self.not_before = Some(Instant::now() + REFUSED_PAUSE);
                }
                return false;
            }
        };
        match self.notes.judge(res) {
            Ok(true) => true,
            Ok(false) => {
                log::debug!(
                    "worker {}: noting claims: the worker's row is gone; the claim's jobs go back",
                    shared.name
                );
                false
            }
            Err(_) => false,
        }
    }

    /// Ends the open transaction, writing its jobs (the fetcher waits next). A failure is
    /// logged and left to [`recover`](Self::recover).
    pub(crate) fn close(&mut self, link: &mut Link<'_, ()>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let plan = open
            .xid
            .is_some()
            .then(|| Plan::new(self.shared, &open.keys));
        let xid = open.xid.clone().unwrap_or_default();
        let res = match link.connection() {
            Ok(conn) if conn.in_transaction() => {
                let params = plan.as_ref().map(|p| p.params(&xid));
                conn.query_cached_cycle(
                    "writing locked jobs",
                    params.as_ref().map(|p| (store::LOCKED_SETTLE, &p[..])),
                    None,
                )
            }
            Ok(_) | Err(_) => Err(Error::new(
                ErrorKind::Other,
                "writing locked jobs: the claim's connection is gone",
            )),
        };
        match res {
            Ok(cycle) => self.after_commit(open, plan, cycle.settled, cycle.commit_failed),
            Err(e) => {
                let _ = link.judge::<()>(Err(e));
                link.drop_connection();
                self.lose(open, plan);
                self.recover();
            }
        }
    }

    /// Like [`close`](Self::close), once every job of the open transaction has ended, or
    /// its time is up, or news came on `wake` (a claim then writes them sooner).
    pub(crate) fn close_when_done(
        &mut self,
        link: &mut Link<'_, ()>,
        wake: &crossbeam_channel::Receiver<()>,
    ) {
        let Some(open) = &self.open else {
            return;
        };
        loop {
            let left = CYCLE.saturating_sub(open.begun.elapsed());
            let done = self
                .shared
                .ledger
                .locked_phases(&open.keys)
                .iter()
                .all(|p| matches!(p, LockedPhase::Done | LockedPhase::Gone));
            if done || left.is_zero() || !wake.is_empty() || self.shared.stopping() {
                break;
            }
            self.shared
                .ledger
                .wait_change(left.min(Duration::from_millis(1)));
        }
        self.close(link);
    }

    /// What a round-trip that ended `open` (with `plan`) brought back.
    fn after_commit(
        &mut self,
        open: Open,
        plan: Option<Plan>,
        settled: Option<Result<Vec<postgres::Row>>>,
        commit_failed: bool,
    ) {
        let Some(plan) = plan else {
            return;
        };
        match settled {
            Some(Ok(rows)) if !commit_failed => {
                let done: IdMap<i64, ()> = rows.iter().map(|r| (r.get::<_, i64>(0), ())).collect();
                self.finish(&plan, &done);
            }
            other => {
                if let Some(Err(e)) = other {
                    log::warn!(
                        "worker {}: writing locked jobs failed ({e}); their transaction rolled back, and the worker writes them again",
                        self.shared.name
                    );
                }
                // Surely not committed.
                self.lost = Some(Lost {
                    xid: open.xid.unwrap_or_default(),
                    pid: open.pid,
                    keys: open.keys,
                    sent: None,
                });
                self.recover();
            }
        }
    }

    /// `open` (with `plan`, when one was sent) may or may not have committed.
    fn lose(&mut self, open: Open, plan: Option<Plan>) {
        let Some(xid) = open.xid else {
            return;
        };
        self.lost = Some(Lost {
            xid,
            pid: open.pid,
            keys: open.keys,
            sent: plan,
        });
    }

    /// After `plan` was committed, with `done` the ids it wrote: the ledger and the
    /// completer take over.
    fn finish(&mut self, plan: &Plan, done: &IdMap<i64, ()>) {
        let shared = self.shared;
        let mut settled = Vec::new();
        let mut recorded = 0u64;
        for (k, w) in plan.keys.iter().zip(&plan.writes) {
            let outcome = shared.absorb.remove(k);
            let written = done.contains_key(&k.id.0);
            match w {
                Write::Succeeded if written => {
                    recorded += 1;
                    settled.push(*k);
                }
                Write::Running | Write::Held if written => {
                    shared.ledger.unlock(*k, *w == Write::Running);
                    if let Some(o) = outcome {
                        let _ = self.out.send(o);
                    }
                }
                Write::Release => settled.push(*k),
                _ => {
                    // Not written: the row changed meanwhile (the rescue requeued it, an
                    // operator cancelled it) or the worker's row is gone. The attempt is
                    // not this worker's to record.
                    log::debug!(
                        "worker {}: job {} (attempt {}) was not written with its claim's transaction: it is no longer this attempt's",
                        shared.name,
                        k.id,
                        k.attempt
                    );
                    shared.ledger.unlock(*k, false);
                    if let Some(o) = outcome {
                        let _ = self.out.send(o);
                    }
                }
            }
        }
        shared.stats.recorded.fetch_add(recorded, Ordering::Relaxed);
        shared.stats.once.fetch_add(recorded, Ordering::Relaxed);
        // The next claims' size: the jobs written twice are those still running or waiting
        // at the commit. A few running ones (one per thread) are the cost of any claim.
        let twice = plan
            .writes
            .iter()
            .filter(|w| matches!(w, Write::Running | Write::Held))
            .count();
        let c = shared.opts.concurrency;
        if twice * 4 > plan.writes.len() {
            self.cap = (self.cap / 2).max(c);
        } else if twice <= c && plan.writes.len() >= self.cap {
            self.cap = (self.cap + self.cap / 2).min(MAX_CAP).max(c);
        }
        shared.ledger.settle(settled);
    }

    /// Writes the jobs of a lost transaction (see the module's comment), on the note's
    /// connection. Returns whether nothing is left to write.
    pub(crate) fn recover(&mut self) -> bool {
        let Some(lost) = self.lost.take() else {
            return true;
        };
        match self.try_recover(&lost) {
            Ok(true) => true,
            Ok(false) => {
                self.lost = Some(lost);
                false
            }
            Err(e) => {
                let _ = self.notes.judge::<()>(Err(e));
                self.lost = Some(lost);
                false
            }
        }
    }

    fn try_recover(&mut self, lost: &Lost) -> Result<bool> {
        let shared = self.shared;
        let conn = match self.notes.get() {
            Ok((c, ())) => c,
            Err(_) => return Ok(false),
        };
        // The transaction's fate; one still open on a session the fetcher lost is ended.
        let mut status: Option<String> = None;
        for round in 0..20 {
            let rows = conn.query_cached("writing lost jobs", store::XACT_STATUS, &[&lost.xid])?;
            status = rows.first().and_then(|r| r.get(0));
            if status.as_deref() != Some("in progress") {
                break;
            }
            if round == 0 {
                if let Some(pid) = lost.pid {
                    log::info!(
                        "worker {}: the claim's transaction {} is still open on a session the worker lost (server process {pid}): ending it",
                        shared.name,
                        lost.xid
                    );
                    conn.query_cached("writing lost jobs", store::END_SESSION, &[&pid])?;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        match status.as_deref() {
            Some("in progress") => return Ok(false),
            Some("committed") => {
                if let Some(plan) = &lost.sent {
                    // The commit whose answer was lost went through: what it wrote is as sent.
                    let done: IdMap<i64, ()> = plan.ids.iter().map(|i| (*i, ())).collect();
                    log::debug!(
                        "worker {}: the claim's transaction {} committed; its jobs are written",
                        shared.name,
                        lost.xid
                    );
                    self.finish(plan, &done);
                    return Ok(true);
                }
            }
            _ => {}
        }
        // Rolled back: the jobs are `todo`, and the note keeps them from other claims. Each
        // is written as it stands now, and the note cleared, in one transaction.
        let plan = Plan::new(shared, &lost.keys);
        let params = plan.params(&lost.xid);
        let worker = plan.worker;
        let none: Option<&String> = None;
        let empty: Vec<i64> = Vec::new();
        let pair = conn.query_cached_pair_in_transaction(
            "writing lost jobs",
            "BEGIN",
            (store::LOCKED_SETTLE, &params),
            (store::CLAIM_NOTE, &[&worker, &none, &empty]),
        )?;
        match (pair.first, pair.second) {
            (Ok(rows), Ok(_)) => {
                shared.stats.lost.fetch_add(1, Ordering::Relaxed);
                let done: IdMap<i64, ()> = rows.iter().map(|r| (r.get::<_, i64>(0), ())).collect();
                log::info!(
                    "worker {}: the claim's transaction {} was lost; {} of its {} jobs written again",
                    shared.name,
                    lost.xid,
                    done.len(),
                    plan.ids.len()
                );
                self.finish(&plan, &done);
                Ok(true)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    /// The fetcher ends: the open transaction is written and committed, and a lost one
    /// written if the note's connection allows; what is left then goes to the completer
    /// (which cannot record it: the shutdown gives those jobs back).
    pub(crate) fn end(&mut self, link: &mut Link<'_, ()>) {
        self.close(link);
        self.recover();
        if let Some(lost) = self.lost.take() {
            log::warn!(
                "worker {}: the claim's transaction {} could not be written before the worker stopped; its {} jobs go back to the queue when the worker's row goes",
                self.shared.name,
                lost.xid,
                lost.keys.len()
            );
            for k in &lost.keys {
                self.shared.ledger.unlock(*k, false);
                if let Some(o) = self.shared.absorb.remove(k) {
                    let _ = self.out.send(o);
                }
            }
        }
        self.notes.close();
    }
}

impl super::WorkerBuilder {
    /// Writes each job of a busy worker once, with its outcome, instead of twice (at its
    /// claim, then at its outcome); default off.
    ///
    /// The claim then only locks the jobs that need no row of their own while they run (no
    /// `lock`, no deadline, no abort request, no queue with a limit) and keeps its
    /// transaction open while they run, at most 5 ms; the next claim's round-trip writes
    /// them and commits. A drain of short jobs writes about half the WAL a job, and the
    /// server does less for each. What changes for others: for those 5 ms, a job that runs
    /// shows waiting in the dashboard, the CLI and the statistics, and an operator's cancel
    /// or abort of it waits for the commit (then applies to what the job became). The
    /// worker notes each such claim on its own row first (a third connection, see
    /// docs/connections.md), so that a server that loses the transaction leaves the jobs to
    /// no one else; the worker writes them again, or the rescue counts their attempt.
    ///
    /// Through a transaction pooler (which keeps no session) claims go as without it.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let handle = app
    ///     .worker()
    ///     .concurrency(4)
    ///     .claim_in_outcome_transaction(true)
    ///     .task("noop", |_job: &postpone::Job| Ok(()))
    ///     .spawn()?;
    /// # handle.shutdown(std::time::Duration::from_secs(5));
    /// # Ok(())
    /// # }
    /// ```
    pub fn claim_in_outcome_transaction(mut self, on: bool) -> Self {
        self.opts.locked_claims = on;
        self
    }
}
