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
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::claim::{Budget, Keyed};
use super::ledger::{AttemptKey, LockedPhase};
use super::link::Link;
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
pub(super) const MAX_CAP: usize = 4096;

/// How long after the server refused the note's connection the worker claims as usual.
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

mod plan;
mod recover;
mod round;

pub(crate) use plan::Absorb;
use plan::Plan;
use round::{cycle_once, keep_or_hold, slot_round, Ask, Got, Lost, Open};

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
        let (from, to) = id_ranges(ids);
        let res = match self.notes.get() {
            Ok((c, ())) => c
                .query_cached(
                    "noting claims",
                    store::CLAIM_NOTE,
                    &[&worker, &xids, &from, &to],
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
}

impl<'a> Locked<'a> {
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
    /// them and commits. A drain of short jobs writes 40% less WAL a job, and the server
    /// does a quarter less for each; with
    /// [`delete_finished`](Self::delete_finished) of jobs that succeed, such a job is deleted
    /// in that transaction, never written. What changes for others: for those 5 ms, a job that runs
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

/// `ids` as ranges of consecutive ids: the first and the last id of each (both included),
/// in order. A claim's jobs are mostly consecutive, so a note holds a few ranges where it
/// would hold hundreds of ids.
fn id_ranges(ids: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (mut from, mut to) = (Vec::new(), Vec::<i64>::new());
    for id in sorted {
        match to.last_mut() {
            Some(last) if last.checked_add(1) == Some(id) => *last = id,
            _ => {
                from.push(id);
                to.push(id);
            }
        }
    }
    (from, to)
}

#[cfg(test)]
mod tests {
    use super::id_ranges;

    #[test]
    fn ids_become_ranges_of_consecutive_ids() {
        assert_eq!(id_ranges(&[]), (vec![], vec![]));
        assert_eq!(id_ranges(&[7]), (vec![7], vec![7]));
        assert_eq!(
            id_ranges(&[5, 3, 4, 9, 10, 4, 12, i64::MAX, i64::MAX - 1]),
            (vec![3, 9, 12, i64::MAX - 1], vec![5, 10, 12, i64::MAX])
        );
    }
}
