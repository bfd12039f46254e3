//! Claims whose jobs are written once (`WorkerBuilder::claim_in_outcome_transaction`).
//!
//! A claim usually writes each job's row (`doing`), and its outcome writes it again. Here
//! the claim only locks the jobs that need no row of their own while they run (no `lock`,
//! queueing lock or unique key, no deadline, no abort request, no limited queue), in a
//! transaction the fetcher keeps
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
use std::sync::{Condvar, Mutex};
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
const FIRST_CAP: usize = 256;

/// Most jobs a claim ever locks (the adaptive prefetch's own cap).
const MAX_CAP: usize = super::fetch::MAX_PREFETCH;

/// How long after the server refused the note's connection the worker claims as usual.
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// The outcomes of locked jobs, kept from the completer while their transaction is open
/// or its fate unknown.
#[derive(Default)]
pub(crate) struct Absorb {
    keys: Mutex<IdMap<AttemptKey, Option<Outcome>>>,
    /// Signalled when a job's row has been written (its key removed).
    written: Condvar,
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
    /// How long each job of `keys` had run.
    ran: Vec<Option<Duration>>,
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
            ran: Vec::with_capacity(keys.len()),
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
    fn rebuilt(&self, f: impl Fn(Write) -> Write, only: Option<usize>) -> Plan {
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

    fn push(&mut self, k: AttemptKey, write: Write, ran: Option<Duration>) {
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

/// A transaction open on one of the claiming connections.
struct Open {
    /// Its id (NULL until it locked a row).
    xid: Option<String>,
    /// The server process of the session.
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

/// What one claiming connection asks for.
struct Ask<'s> {
    id: i64,
    limit: i32,
    start: i32,
    bytes: i64,
    alone: bool,
    queues: &'s Option<Vec<String>>,
    task_names: &'s Option<Vec<String>>,
}

/// One round-trip on one claiming connection: `plan` (of the open transaction `xid`)
/// written and committed, then, with `ask`, a lock-only claim in a new transaction.
fn cycle_once(
    conn: &mut Connection,
    plan: Option<&Plan>,
    xid: &String,
    ask: Option<&Ask<'_>>,
) -> Result<crate::conn::Cycle> {
    let lock_only = true;
    let settle = plan.map(|p| p.params(xid));
    let claim = ask.map(|a| -> [&(dyn postgres::types::ToSql + Sync); 8] {
        [
            &a.id,
            &a.limit,
            a.queues,
            a.task_names,
            &a.start,
            &a.bytes,
            &a.alone,
            &lock_only,
        ]
    });
    conn.query_cached_cycle(
        if ask.is_some() {
            "writing locked jobs and claiming jobs"
        } else {
            "writing locked jobs"
        },
        store::LOCKED_BEGIN,
        settle.as_ref().map(|p| (store::LOCKED_SETTLE, &p[..])),
        claim.as_ref().map(|p| (store::JOB_CLAIM, &p[..])),
    )
}

/// What a claiming connection's round-trip brought, once its old transaction is dealt with.
struct Got {
    keyed: Keyed,
    cut: bool,
    xid: Option<String>,
    pid: Option<i32>,
}

/// What one claiming connection's round-trip brought.
struct Round {
    /// The old transaction's writing (see [`crate::conn::Cycle`]).
    settled: Option<Result<Vec<postgres::Row>>>,
    commit_failed: bool,
    /// The claim's jobs; when none is kept only locked, already committed.
    got: Result<Got>,
    /// The new transaction (its id and session) when it locked jobs and could not be
    /// committed: none of its jobs is handed out, but a session the worker lost may still
    /// hold them (see [`Locked::recover`]).
    abandoned: Option<(String, Option<i32>)>,
}

/// One claiming connection's round-trip (see [`cycle_once`]), its reply parsed, and its new
/// transaction committed at once unless its claim keeps jobs only locked (and nothing else:
/// a claim that took jobs held beside them writes those held too, and commits). `Err`: the
/// link failed.
fn slot_round(
    shared: &Shared,
    conn: &mut Connection,
    plan: Option<&Plan>,
    xid: &String,
    ask: &Ask<'_>,
    sent: Instant,
) -> Result<Round> {
    let cycle = cycle_once(conn, plan, xid, Some(ask))?;
    let mut abandoned = None;
    let got = parse_got(shared, cycle.claimed, sent).and_then(|mut g| {
        let locked: Vec<AttemptKey> = g
            .keyed
            .iter()
            .filter(|(_, c)| c.locked)
            .map(|(_, c)| c.key())
            .collect();
        if locked.is_empty() {
            conn.commit()?;
            g.xid = None;
        } else if locked.len() < g.keyed.len() {
            let Some(x) = g.xid.take() else {
                let _ = conn.rollback();
                return Err(no_xid());
            };
            if let Err(e) = commit_held(conn, &x, &locked) {
                abandoned = Some((x, g.pid));
                return Err(e);
            }
            for (_, c) in g.keyed.iter_mut() {
                c.locked = false;
            }
        } else if g.xid.is_none() {
            let _ = conn.rollback();
            return Err(no_xid());
        }
        Ok(g)
    });
    Ok(Round {
        settled: cycle.settled,
        commit_failed: cycle.commit_failed,
        got,
        abandoned,
    })
}

fn no_xid() -> Error {
    Error::new(
        ErrorKind::Other,
        "claiming jobs: the claim locked jobs but returned no transaction id",
    )
}

/// A reply's jobs parsed, with its transaction's id and session.
fn parse_got(
    shared: &Shared,
    claimed: Option<Result<Vec<postgres::Row>>>,
    sent: Instant,
) -> Result<Got> {
    let mut rows = match claimed {
        Some(Ok(rows)) => rows,
        Some(Err(e)) => return Err(e),
        None => return Err(Error::new(ErrorKind::Other, "claiming jobs: not sent")),
    };
    let xid = rows.first().and_then(|r| r.get::<_, Option<String>>(17));
    let pid = rows.first().and_then(|r| r.get::<_, Option<i32>>(18));
    let (keyed, cut) = parse_claim(shared, &mut rows, sent);
    Ok(Got {
        keyed,
        cut,
        xid,
        pid,
    })
}

/// The jobs a claim keeps only locked on `conn` (all of its jobs, when any): kept in its
/// open transaction when `noted` (returned as the connection's open transaction), else
/// written held and committed now. A claim that kept nothing was committed already.
fn keep_or_hold(
    shared: &Shared,
    conn: &mut Connection,
    g: Got,
    noted: bool,
) -> Result<(Keyed, bool, Option<Open>)> {
    let Some(xid) = g.xid.filter(|_| g.keyed.iter().any(|(_, c)| c.locked)) else {
        return Ok((g.keyed, g.cut, None));
    };
    let locked: Vec<AttemptKey> = g.keyed.iter().map(|(_, c)| c.key()).collect();
    if noted {
        shared.absorb.add(locked.iter().copied());
        let open = Open {
            xid: Some(xid),
            pid: g.pid,
            keys: locked,
            begun: Instant::now(),
        };
        return Ok((g.keyed, g.cut, Some(open)));
    }
    commit_held(conn, &xid, &locked)?;
    let keyed = g
        .keyed
        .into_iter()
        .map(|(t, mut c)| {
            c.locked = false;
            (t, c)
        })
        .collect();
    Ok((keyed, g.cut, None))
}

/// Writes every locked job of the claim just made held, and commits: they are then claimed
/// as without this mode. Fails when the write does not commit (the jobs are not handed out:
/// they go back to the queue with the transaction).
fn commit_held(conn: &mut Connection, xid: &String, keys: &[AttemptKey]) -> Result<()> {
    let plan = Plan::all_held(keys);
    let cycle = cycle_once(conn, Some(&plan), xid, None)?;
    match cycle.settled {
        Some(Ok(rows)) if !cycle.commit_failed && rows.len() == keys.len() => Ok(()),
        Some(Err(e)) => Err(e),
        _ => Err(Error::new(
            ErrorKind::Other,
            "writing claimed jobs held: not every job was written; none is handed out",
        )),
    }
}

/// Writes `plan` for the lost transaction `xid` and takes it off the worker's note, in one
/// transaction. `Ok(Err(_))`: the database refused it (nothing written); `Err`: the link.
fn write_lost(conn: &mut Connection, plan: &Plan, xid: &String) -> Result<Result<IdMap<i64, ()>>> {
    let params = plan.params(xid);
    let worker = plan.worker;
    let pair = conn.query_cached_pair_in_transaction(
        "writing lost jobs",
        "BEGIN",
        (store::LOCKED_SETTLE, &params),
        (store::CLAIM_UNNOTE, &[&worker, xid]),
    )?;
    match (pair.first, pair.second) {
        (Ok(rows), Ok(_)) => Ok(Ok(rows.iter().map(|r| (r.get::<_, i64>(0), ())).collect())),
        (Err(e), _) | (_, Err(e)) if e.sqlstate().is_some() && !conn.is_broken() => Ok(Err(e)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// Claims lock at most this many jobs on one connection; larger ones go half on each of
/// two, so that two server processes write and claim at once.
const ONE_CONNECTION: usize = 64;

/// The fetcher's side of this mode (see the module's comment).
pub(crate) struct Locked<'a> {
    shared: &'a Shared,
    notes: Link<'a, ()>,
    /// The second claiming connection (slot 1; slot 0 is the fetcher's own).
    second: Link<'a, ()>,
    /// No second connection before this (after a failure, or a refusal).
    second_not_before: Option<Instant>,
    open: [Option<Open>; 2],
    lost: Vec<Lost>,
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
            second: Link::new(shared, "claiming jobs (second connection)"),
            second_not_before: None,
            open: [None, None],
            lost: Vec::new(),
            not_before: None,
            out,
            cap: FIRST_CAP.max(shared.opts.concurrency),
        }
    }

    /// Lost transactions wait to be written: try now (the note's connection keeps its own
    /// backoff between failures).
    pub(crate) fn tick(&mut self) {
        if !self.lost.is_empty() {
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
            && self.lost.is_empty()
            && self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// How long the open transactions may stay open yet (`None`: none is open).
    pub(crate) fn time_left(&self) -> Option<Duration> {
        self.open
            .iter()
            .flatten()
            .map(|o| CYCLE.saturating_sub(o.begun.elapsed()))
            .min()
    }

    /// The second claiming connection, when a claim of `limit` jobs goes in two and it can
    /// be had now.
    fn second_connection(&mut self, limit: usize) -> Option<&mut Connection> {
        if limit < 2 * ONE_CONNECTION || self.second_not_before.is_some_and(|t| Instant::now() < t)
        {
            return None;
        }
        self.second_not_before = None;
        match self.second.get().map(|_| ()) {
            Ok(()) => self
                .second
                .get()
                .ok()
                .map(|(c, ())| c)
                .filter(|c| !c.through_transaction_pooler()),
            Err(wait) => {
                let wait = if self.second.refused() {
                    wait.max(REFUSED_PAUSE)
                } else {
                    wait
                };
                self.second_not_before = Some(Instant::now() + wait);
                None
            }
        }
    }

    /// A claim of up to `limit` jobs whose unstarted ones are only locked, in a round-trip
    /// that first writes and commits the open transaction's jobs; a large one goes half on
    /// each claiming connection, at once. Returns the jobs for the caller to hand out, and
    /// whether the claim left a job for its size.
    pub(crate) fn claim(
        &mut self,
        conn: &mut Connection,
        limit: usize,
        start: usize,
        budget: Budget,
        task_names: &Option<Vec<String>>,
    ) -> Result<(Keyed, bool)> {
        let shared = self.shared;
        // Outcomes do not ride on these claims: the completer records them at once.
        shared.ride.claiming(false);
        let two = self.second_connection(limit).is_some();
        if !two && self.open[1].is_some() {
            self.close_second();
        }
        let half = |n: usize| if two { n / 2 } else { 0 };
        let ask = |n: usize, s: usize, bytes: usize, alone: bool| Ask {
            id: shared.id(),
            limit: n.min(i32::MAX as usize) as i32,
            start: s.min(i32::MAX as usize) as i32,
            bytes: bytes.min(i64::MAX as usize) as i64,
            alone,
            queues: &shared.opts.queues,
            task_names,
        };
        let asks = [
            ask(
                limit - half(limit),
                start - half(start),
                budget.bytes - half(budget.bytes),
                budget.alone,
            ),
            ask(half(limit), half(start), half(budget.bytes), false),
        ];
        let olds = [self.open[0].take(), self.open[1].take()];
        let plans: [Option<Plan>; 2] = [0, 1].map(|i| {
            olds[i]
                .as_ref()
                .filter(|o| o.xid.is_some())
                .map(|o| Plan::new(shared, &o.keys))
        });
        let xids: [String; 2] = [0, 1].map(|i| {
            olds[i]
                .as_ref()
                .and_then(|o| o.xid.clone())
                .unwrap_or_default()
        });
        let sent = shared.due.sending();
        let second = if two { self.second.get().ok() } else { None };
        shared
            .stats
            .claims
            .fetch_add(1 + u64::from(second.is_some()), Ordering::Relaxed);
        if second.is_some() {
            shared.stats.split.fetch_add(1, Ordering::Relaxed);
        }
        // Each connection's round-trip, then, on the same thread, the commit of a claim that
        // keeps nothing only locked: neither waits for the other's open transaction.
        let (r0, r1) = std::thread::scope(|s| {
            let h = second.map(|(c2, ())| {
                let (plan, xid, ask) = (plans[1].as_ref(), &xids[1], &asks[1]);
                std::thread::Builder::new()
                    .name("postpone-claim2".into())
                    .spawn_scoped(s, move || slot_round(shared, c2, plan, xid, ask, sent))
            });
            let r0 = slot_round(shared, conn, plans[0].as_ref(), &xids[0], &asks[0], sent);
            let r1 = h.map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Other,
                        "claiming jobs (second connection): its thread panicked",
                    ))
                }),
                Err(e) => Err(Error::with_source(
                    ErrorKind::Other,
                    "claiming jobs (second connection): spawning its thread",
                    e,
                )),
            });
            (r0, r1)
        });
        let [old0, old1] = olds;
        let [plan0, plan1] = plans;
        // The second connection's part: its jobs are handed out whatever the first's fate.
        let got1 = match r1 {
            None => None,
            Some(Err(e)) => {
                if let Some(o) = old1 {
                    self.lose(o, plan1);
                }
                let wait = self.second.judge::<()>(Err(e)).err();
                self.second_not_before = wait.map(|w| Instant::now() + w);
                None
            }
            Some(Ok(round)) => {
                if let Some(o) = old1 {
                    self.after_commit(o, plan1, round.settled, round.commit_failed);
                }
                self.abandon(round.abandoned);
                match round.got {
                    Ok(g) => Some(g),
                    Err(e) => {
                        let wait = self.second.judge::<()>(Err(e)).err();
                        self.second_not_before = wait.map(|w| Instant::now() + w);
                        None
                    }
                }
            }
        };
        let got0 = match r0 {
            Ok(round) => {
                if let Some(o) = old0 {
                    self.after_commit(o, plan0, round.settled, round.commit_failed);
                }
                self.abandon(round.abandoned);
                round.got
            }
            Err(e) => {
                if let Some(o) = old0 {
                    self.lose(o, plan0);
                }
                Err(e)
            }
        };
        // The connections whose claim keeps jobs only locked: noted at once, before any of
        // their jobs starts, or else written held and committed.
        let kept = |g: &Got| g.xid.is_some() && g.keyed.iter().any(|(_, c)| c.locked);
        let keep0 = got0.as_ref().is_ok_and(kept);
        let keep1 = got1.as_ref().is_some_and(kept);
        let noted = (keep0 || keep1) && {
            let mut xids = Vec::new();
            let mut ids = Vec::new();
            for g in [
                got0.as_ref().ok().filter(|_| keep0),
                got1.as_ref().filter(|_| keep1),
            ]
            .into_iter()
            .flatten()
            {
                xids.extend(g.xid.clone());
                ids.extend(g.keyed.iter().map(|(_, c)| c.id.0));
            }
            self.note(shared.id(), &xids, &ids)
        };
        let mut out: Keyed = Vec::new();
        let mut cut = false;
        if let Some(g) = got1 {
            let held = g.xid.clone().map(|x| (x, g.pid));
            let res = match self.second.get() {
                Ok((c2, ())) => keep_or_hold(shared, c2, g, noted),
                Err(_) => Err(Error::new(
                    ErrorKind::Other,
                    "claiming jobs (second connection): the connection is gone",
                )),
            };
            match res {
                Ok((keyed, was_cut, open)) => {
                    out.extend(keyed);
                    cut |= was_cut;
                    self.open[1] = open;
                }
                Err(e) => {
                    self.abandon(held);
                    let wait = self.second.judge::<()>(Err(e)).err();
                    self.second_not_before = wait.map(|w| Instant::now() + w);
                }
            }
        }
        let held = got0
            .as_ref()
            .ok()
            .and_then(|g| g.xid.clone().map(|x| (x, g.pid)));
        let first = got0.and_then(|g| keep_or_hold(shared, conn, g, noted));
        if first.is_err() {
            self.abandon(held);
        }
        let res = match first {
            Ok((keyed, was_cut, open)) => {
                out.extend(keyed);
                self.open[0] = open;
                Ok(was_cut || cut)
            }
            Err(e) => Err(e),
        };
        out.sort_by(super::claim::claim_order);
        match res {
            Ok(cut) => Ok((out, cut)),
            Err(e) => {
                // The first connection failed: what the second brought is handed out here,
                // and the error goes on to the fetcher's link.
                super::claim::hand_out(shared, super::claim::unkey(out));
                Err(e)
            }
        }
    }

    /// Notes the open transactions `xids` and their jobs `ids` (committed, on the note's
    /// connection) before the jobs start; first writes lost transactions' jobs, which the
    /// note would otherwise forget. False: the note was not written (the jobs must not start
    /// only locked).
    fn note(&mut self, worker: i64, xids: &[String], ids: &[i64]) -> bool {
        if !self.lost.is_empty() && !self.recover() {
            return false;
        }
        let shared = self.shared;
        let res = match self.notes.get() {
            Ok((c, ())) => c
                .query_cached("noting claims", store::CLAIM_NOTE, &[&worker, &xids, &ids])
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

    /// Ends the open transactions, writing their jobs (the fetcher waits next). A failure
    /// is logged and left to [`recover`](Self::recover).
    pub(crate) fn close(&mut self, link: &mut Link<'_, ()>) {
        if let Some(open) = self.open[0].take() {
            let res = match link.connection() {
                Ok(conn) if conn.in_transaction() => Ok(conn),
                _ => Err(Error::new(
                    ErrorKind::Other,
                    "writing locked jobs: the claim's connection is gone",
                )),
            };
            let res = res.and_then(|conn| self.close_on(conn, open));
            if let Err(e) = res {
                let _ = link.judge::<()>(Err(e));
                link.drop_connection();
            }
        }
        self.close_second();
        if !self.lost.is_empty() {
            self.recover();
        }
    }

    /// Ends the second connection's open transaction.
    fn close_second(&mut self) {
        let Some(open) = self.open[1].take() else {
            return;
        };
        let mut second = std::mem::replace(
            &mut self.second,
            Link::new(self.shared, "claiming jobs (second connection)"),
        );
        let res = match second.connection() {
            Ok(conn) if conn.in_transaction() => self.close_on(conn, open),
            _ => {
                self.lose(open, None);
                Err(Error::new(
                    ErrorKind::Other,
                    "writing locked jobs: the second claiming connection is gone",
                ))
            }
        };
        if let Err(e) = res {
            let _ = second.judge::<()>(Err(e));
            second.drop_connection();
        }
        self.second = second;
    }

    /// Writes and commits `open` on `conn`; a link failure leaves it lost.
    fn close_on(&mut self, conn: &mut Connection, open: Open) -> Result<()> {
        let plan = open
            .xid
            .is_some()
            .then(|| Plan::new(self.shared, &open.keys));
        let xid = open.xid.clone().unwrap_or_default();
        match cycle_once(conn, plan.as_ref(), &xid, None) {
            Ok(cycle) => {
                self.after_commit(open, plan, cycle.settled, cycle.commit_failed);
                Ok(())
            }
            Err(e) => {
                self.lose(open, plan);
                Err(e)
            }
        }
    }

    /// Like [`close`](Self::close), once every job of the open transactions has ended, or
    /// their time is up, or news came on `wake` (a claim then writes them sooner).
    pub(crate) fn close_when_done(
        &mut self,
        link: &mut Link<'_, ()>,
        wake: &crossbeam_channel::Receiver<()>,
    ) {
        let keys: Vec<AttemptKey> = self
            .open
            .iter()
            .flatten()
            .flat_map(|o| o.keys.iter().copied())
            .collect();
        loop {
            let Some(left) = self.time_left() else {
                return;
            };
            let done = self
                .shared
                .ledger
                .locked_phases(&keys)
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
                self.lost.push(Lost {
                    xid: open.xid.unwrap_or_default(),
                    pid: open.pid,
                    keys: open.keys,
                    sent: None,
                });
            }
        }
    }

    /// A transaction that locked jobs was left uncommitted on a failed link (`xid` and the
    /// session's process): none of its jobs was handed out, but the session may live on
    /// holding them (a half-open link), and the note may name it. It is ended and taken off
    /// the note as a lost one with no jobs.
    fn abandon(&mut self, abandoned: Option<(String, Option<i32>)>) {
        if let Some((xid, pid)) = abandoned {
            self.lost.push(Lost {
                xid,
                pid,
                keys: Vec::new(),
                sent: None,
            });
        }
    }

    /// `open` (with `plan`, when one was sent) may or may not have committed.
    fn lose(&mut self, open: Open, plan: Option<Plan>) {
        let Some(xid) = open.xid else {
            return;
        };
        self.lost.push(Lost {
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
        // at the commit. A few running ones (one per thread) are the cost of any claim. A
        // claim of two connections writes half its jobs on each.
        let twice = plan
            .writes
            .iter()
            .filter(|w| matches!(w, Write::Running | Write::Held))
            .count();
        let c = shared.opts.concurrency;
        if twice * 4 > plan.writes.len() {
            self.cap = (self.cap / 2).max(c);
        } else if twice <= c && plan.writes.len() * 2 >= self.cap {
            self.cap = (self.cap * 2).min(MAX_CAP).max(c);
        }
        shared.ledger.settle(settled);
    }

    /// Writes the jobs of lost transactions (see the module's comment), on the note's
    /// connection. Returns whether nothing is left to write.
    pub(crate) fn recover(&mut self) -> bool {
        let lost = std::mem::take(&mut self.lost);
        for l in lost {
            if !self.lost.is_empty() {
                self.lost.push(l);
                continue;
            }
            match self.try_recover(&l) {
                Ok(true) => {}
                Ok(false) => self.lost.push(l),
                Err(e) => {
                    let _ = self.notes.judge::<()>(Err(e));
                    self.lost.push(l);
                }
            }
        }
        self.lost.is_empty()
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
            if status.as_deref() != Some("in progress") || shared.stopping() {
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
        let refused = match write_lost(conn, &plan, &lost.xid)? {
            Ok(done) => {
                self.written_again(lost, &plan, &done);
                return Ok(true);
            }
            Err(e) => e,
        };
        // The database refused the writing (a trigger of the user's, say): every job is
        // written running instead (the completer records each outcome after, isolating a
        // refused one), and if even that is refused, each job on its own; a job whose row
        // cannot be written at all goes back to its queue when the note is cleared.
        log::warn!(
            "worker {}: writing the jobs of the lost claim transaction {} was refused ({refused}); writing them running",
            shared.name,
            lost.xid
        );
        let running = plan.rebuilt(
            |w| {
                if w == Write::Succeeded {
                    Write::Running
                } else {
                    w
                }
            },
            None,
        );
        if let Ok(done) = write_lost(conn, &running, &lost.xid)? {
            self.written_again(lost, &running, &done);
            return Ok(true);
        }
        let mut done: IdMap<i64, ()> = IdMap::default();
        for i in 0..running.keys.len() {
            let one = running.rebuilt(|w| w, Some(i));
            if one.ids.is_empty() {
                continue;
            }
            let params = one.params(&lost.xid);
            match conn.query_cached("writing lost jobs", store::LOCKED_SETTLE, &params) {
                Ok(rows) => done.extend(rows.iter().map(|r| (r.get::<_, i64>(0), ()))),
                Err(e) if e.sqlstate().is_some() && !conn.is_broken() => log::error!(
                    "worker {}: job {} of the lost claim transaction {} could not be written ({e}); it goes back to its queue",
                    shared.name,
                    one.keys[0].id,
                    lost.xid
                ),
                Err(e) => return Err(e),
            }
        }
        let worker = running.worker;
        conn.query_cached(
            "writing lost jobs",
            store::CLAIM_UNNOTE,
            &[&worker, &lost.xid],
        )?;
        self.written_again(lost, &running, &done);
        Ok(true)
    }

    /// A lost transaction's jobs were written again (`done`, of `plan`).
    fn written_again(&mut self, lost: &Lost, plan: &Plan, done: &IdMap<i64, ()>) {
        let shared = self.shared;
        shared.stats.lost.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "worker {}: the claim's transaction {} was lost; {} of its {} jobs written again",
            shared.name,
            lost.xid,
            done.len(),
            plan.ids.len()
        );
        self.finish(plan, done);
    }

    /// The fetcher ends: the open transaction is written and committed, and a lost one
    /// written if the note's connection allows; what is left then goes to the completer
    /// (which cannot record it: the shutdown gives those jobs back).
    pub(crate) fn end(&mut self, link: &mut Link<'_, ()>) {
        self.close(link);
        self.recover();
        for lost in std::mem::take(&mut self.lost) {
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
        self.second.close();
    }

    /// The fetcher sleeps (nothing to claim for long): the extra connections close.
    pub(crate) fn close_connections(&mut self) {
        if self.open[1].is_none() {
            self.second.close();
        }
        if self.lost.is_empty() {
            self.notes.close();
        }
    }
}

impl super::WorkerBuilder {
    /// Writes each job of a busy worker once, with its outcome, instead of twice (at its
    /// claim, then at its outcome); default off.
    ///
    /// The claim then only locks the jobs that need no row of their own while they run (no
    /// `lock`, queueing lock or unique key, no deadline, no abort request, no queue with a
    /// limit) and keeps its
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
    /// # use std::time::Duration;
    /// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let mut tasks = postpone::Tasks::new();
    /// tasks.register("noop", |_job: &postpone::Job| Ok(()));
    /// let handle = postpone::Worker::builder(&app, tasks)
    ///     .concurrency(4)
    ///     .claim_in_outcome_transaction(true)
    ///     .spawn()?;
    /// // ...
    /// handle.shutdown(Duration::from_secs(10));
    /// # Ok(())
    /// # }
    /// ```
    pub fn claim_in_outcome_transaction(mut self, on: bool) -> Self {
        self.opts.locked_claims = on;
        self
    }
}
