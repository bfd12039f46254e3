//! The one writer of job outcomes.
//!
//! An executor's decision (or the ledger's, for a held job that ends unstarted) is an
//! [`Outcome`] whose kind is an [`OutcomeKind`] (`outcome.rs`, which converts a kind to its
//! SQL word in one place); this file owns the three statements that record outcomes: final
//! statuses through `postpone_finish` ([`store::JOB_FINISH_BATCH`]), the ways back to the
//! queue through `postpone_requeue` ([`store::JOB_REQUEUE`]) and snoozes
//! ([`store::JOB_SNOOZE`]). Every thread that records goes through [`Recorder`]:
//!
//! - the completer's loop and the shutdown's last step call [`Recorder::record`], which
//!   isolates an outcome the database refuses and sets aside a row someone holds locked;
//! - the fetcher's share (`share.rs`) calls [`Recorder::record_share`], which isolates
//!   nothing and returns what it could not record, for the completer;
//! - a claim that carries outcomes (`ride.rs`, `fetch.rs`) sends [`FinishParams`] in its
//!   transaction, then calls [`Recorder::settle`] once it committed.
//!
//! `testing` records through [`write`], the same statements with no worker's fence.
//!
//! Whoever records, [`Recorder::settle`] then frees the attempts' slots in the ledger,
//! counts them, and explains in the log an outcome whose guard did not apply.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::idhash::IdMap;
use super::ledger::AttemptKey;
use super::outcome::{Outcome, OutcomeKind, Statement};
use super::Shared;
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::limits;
use crate::store;
use crate::types::{array_or_null, RawJson};

/// Whose attempts a [`write`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fence {
    /// A worker's: each outcome only for its attempt (the worker id and attempt number of
    /// its key).
    Attempt,
    /// Jobs run outside any worker (`testing`: `worker_id` NULL): the attempt number only.
    #[cfg(feature = "test-util")]
    NoWorker,
}

/// Records `group`, outcomes recorded by one statement (all final, all requeues, or all
/// snoozes), in one round-trip. Returns, for each outcome applied, its job's id and, for a
/// way back to the queue, what came of it (`todo`, `aborted`, `superseded`, `expired`,
/// `failed`); an outcome missing there was not that attempt's any more.
pub(crate) fn write(
    conn: &mut Connection,
    group: &[&Outcome],
    fence: Fence,
) -> Result<IdMap<i64, String>> {
    let Some(first) = group.first() else {
        return Ok(IdMap::default());
    };
    let ids: Vec<i64> = group.iter().map(|o| o.key.id.0).collect();
    let workers = workers(group, fence);
    let attempts: Vec<i32> = group.iter().map(|o| o.key.attempt).collect();
    let rows = match first.kind.statement() {
        Statement::Snooze => {
            let delays: Vec<i64> = group
                .iter()
                .map(|o| limits::delay_micros(o.delay))
                .collect();
            conn.query_cached(
                "recording job outcomes (snooze)",
                store::JOB_SNOOZE,
                &[&ids, &workers, &attempts, &delays],
            )?
        }
        Statement::Requeue => {
            // A released attempt keeps its job's schedule; a retry is due after its delay.
            let delays: Vec<Option<i64>> = group
                .iter()
                .map(|o| (o.kind == OutcomeKind::Retry).then(|| limits::delay_micros(o.delay)))
                .collect();
            let errors = errors(group);
            let give_back: Vec<bool> = group
                .iter()
                .map(|o| o.kind == OutcomeKind::Release)
                .collect();
            conn.query_cached(
                "recording job outcomes (requeue)",
                store::JOB_REQUEUE,
                &[&ids, &workers, &attempts, &delays, &errors, &give_back],
            )?
        }
        Statement::Finish => {
            let p = FinishParams::with_fence(group, fence);
            return Ok(conn
                .query_cached("recording job outcomes", FinishParams::SQL, &p.params())?
                .iter()
                .map(|r| (r.get(0), String::new()))
                .collect());
        }
    };
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

fn workers(group: &[&Outcome], fence: Fence) -> Vec<Option<i64>> {
    group
        .iter()
        .map(|o| (fence == Fence::Attempt).then_some(o.key.worker))
        .collect()
}

fn errors(group: &[&Outcome]) -> Vec<Option<String>> {
    group
        .iter()
        .map(|o| o.error.as_deref().map(limits::safe_text))
        .collect()
}

/// The parameters of [`store::JOB_FINISH_BATCH`] for `group` (final outcomes only): what a
/// claim that carries outcomes sends in its transaction.
pub(crate) struct FinishParams<'a> {
    ids: Vec<i64>,
    workers: Vec<Option<i64>>,
    attempts: Vec<i32>,
    kinds: Vec<&'static str>,
    errors: Vec<Option<String>>,
    outputs: Vec<Option<&'a RawJson>>,
    ran_us: Vec<Option<i64>>,
}

impl<'a> FinishParams<'a> {
    /// The statement these parameters go with.
    pub(crate) const SQL: &'static str = store::JOB_FINISH_BATCH;

    pub(crate) fn new(group: &[&'a Outcome]) -> FinishParams<'a> {
        FinishParams::with_fence(group, Fence::Attempt)
    }

    fn with_fence(group: &[&'a Outcome], fence: Fence) -> FinishParams<'a> {
        FinishParams {
            ids: group.iter().map(|o| o.key.id.0).collect(),
            workers: workers(group, fence),
            attempts: group.iter().map(|o| o.key.attempt).collect(),
            kinds: group.iter().map(|o| o.kind.as_sql()).collect(),
            errors: errors(group),
            outputs: group.iter().map(|o| o.output.as_ref()).collect(),
            ran_us: group
                .iter()
                .map(|o| o.ran.map(|d| d.as_micros().min(i64::MAX as u128) as i64))
                .collect(),
        }
    }

    pub(crate) fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 7] {
        [
            &self.ids,
            &self.workers,
            &self.attempts,
            &self.kinds,
            array_or_null(&self.errors),
            array_or_null(&self.outputs),
            &self.ran_us,
        ]
    }
}

/// The worker's recorder of outcomes (see the module's header for who calls what).
#[derive(Clone, Copy)]
pub(crate) struct Recorder<'s> {
    shared: &'s Shared,
}

impl<'s> Recorder<'s> {
    pub(crate) fn new(shared: &'s Shared) -> Recorder<'s> {
        Recorder { shared }
    }

    /// Runs the finish on no jobs, so that the session has planned it (and compiled the
    /// functions behind it) before the first outcomes arrive.
    pub(crate) fn warm_up(conn: &mut Connection) -> Result<()> {
        let none = FinishParams::new(&[]);
        conn.query_cached(
            "recording job outcomes (planning)",
            FinishParams::SQL,
            &none.params(),
        )
        .map(drop)
    }

    /// Records a batch of outcomes. Fails only with a transient error (see
    /// [`is_transient`]): an outcome the database refuses is isolated and settled on its
    /// own. Returns the attempts whose job row another session held locked past the
    /// recording's lock timeout (`postpone_finish`'s own setting): they are not recorded
    /// yet, the others are.
    pub(crate) fn record(
        &self,
        conn: &mut Connection,
        batch: &[Outcome],
    ) -> Result<Vec<AttemptKey>> {
        let mut locked = Vec::new();
        for group in groups(batch.iter()) {
            if !group.is_empty() {
                self.record_isolating(conn, &group, &mut locked)?;
            }
        }
        Ok(locked)
    }

    /// Records `batch` for the fetcher, when the completer is behind (`share.rs`): one
    /// statement per kind, as [`record`](Self::record), but nothing is isolated or waited
    /// for, and what it applies counts as the fetcher's help. On the first statement that
    /// fails, its outcomes and those of the statements after it are returned with the error,
    /// unrecorded, for the completer to record with all its care.
    pub(crate) fn record_share(
        &self,
        conn: &mut Connection,
        batch: Vec<Outcome>,
    ) -> std::result::Result<(), (Error, Vec<Outcome>)> {
        let mut parts: [Vec<Outcome>; 3] = Default::default();
        for o in batch {
            parts[o.kind.statement() as usize].push(o);
        }
        let mut parts = parts.into_iter();
        while let Some(group) = parts.next() {
            if group.is_empty() {
                continue;
            }
            let refs: Vec<&Outcome> = group.iter().collect();
            match self.once(conn, &refs) {
                Ok(applied) => {
                    self.shared
                        .stats
                        .helped
                        .fetch_add(applied as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    drop(refs);
                    let mut left = group;
                    left.extend(parts.flatten());
                    return Err((e, left));
                }
            }
        }
        Ok(())
    }

    /// Records `group` (all final, all requeues, or all snoozes); on a refusal, splits it
    /// until the refused outcome is alone. A row someone else holds locked is isolated the
    /// same way, so that it holds up no other outcome; its attempt goes into `locked`, to be
    /// tried again.
    fn record_isolating(
        &self,
        conn: &mut Connection,
        group: &[&Outcome],
        locked: &mut Vec<AttemptKey>,
    ) -> Result<()> {
        match self.once(conn, group) {
            Ok(_) => Ok(()),
            // Checked before `is_transient`, which counts a lock wait too.
            Err(e) if is_lock_wait(&e, conn) => match group {
                [one] => {
                    locked.push(one.key);
                    Ok(())
                }
                _ => self.record_halves(conn, group, locked),
            },
            Err(e) if is_transient(&e, conn) => Err(e),
            Err(e) if group.len() == 1 => self.record_refused(conn, group[0], &e),
            Err(_) => self.record_halves(conn, group, locked),
        }
    }

    /// [`record_isolating`](Self::record_isolating) of each half of `group`, in order.
    fn record_halves(
        &self,
        conn: &mut Connection,
        group: &[&Outcome],
        locked: &mut Vec<AttemptKey>,
    ) -> Result<()> {
        let (a, b) = group.split_at(group.len() / 2);
        self.record_isolating(conn, a, locked)?;
        self.record_isolating(conn, b, locked)
    }

    /// One statement for `group`; settles the attempts when it commits, and returns how
    /// many of the outcomes it applied (the others were recorded before, or their attempts
    /// are no longer this worker's).
    fn once(&self, conn: &mut Connection, group: &[&Outcome]) -> Result<usize> {
        let done = write(conn, group, Fence::Attempt)?;
        self.settle(conn, group, &done);
        Ok(done.len())
    }

    /// After a statement recorded `group` and returned, for each outcome it applied, its
    /// job's id and what came of it (`done`): frees the attempts' slots, counts, and says
    /// what the log should know.
    pub(crate) fn settle(
        &self,
        conn: &mut Connection,
        group: &[&Outcome],
        done: &IdMap<i64, String>,
    ) {
        let shared = self.shared;
        shared.ledger.settle(group.iter().map(|o| o.key));
        shared
            .stats
            .recorded
            .fetch_add(done.len() as u64, Ordering::Relaxed);
        for o in group {
            match done.get(&o.key.id.0).map(String::as_str) {
                Some("superseded") => log::warn!(
                    "worker {}: job {} was not requeued: another job with its queueing lock already waits and does the work; it ends cancelled",
                    shared.name,
                    o.key.id
                ),
                Some("failed") => log::error!(
                    "worker {}: job {} could not be put back in the queue (the database refused it); it ends failed with the reason",
                    shared.name,
                    o.key.id
                ),
                Some(e) if e.starts_with("error") => log::error!(
                    "worker {}: job {} could not be put back in the queue nor failed ({e}); it stays running until a lost-claims release takes it",
                    shared.name,
                    o.key.id
                ),
                Some("aborted") => log::info!(
                    "worker {}: job {} ends aborted instead of running again: its abort was requested",
                    shared.name,
                    o.key.id
                ),
                Some("expired") => {
                    shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::expired(1);
                    log::info!(
                        "worker {}: job {} ends expired instead of running again: its next run would come after its deadline",
                        shared.name,
                        o.key.id
                    );
                }
                _ => {}
            }
        }
        if done.len() < group.len() {
            let missing: Vec<&Outcome> = group
                .iter()
                .filter(|o| !done.contains_key(&o.key.id.0))
                .copied()
                .collect();
            self.explain_unrecorded(conn, &missing);
        }
    }

    /// The database refused this outcome alone: the attempt ends `failed` with the reason,
    /// or, if even that is refused, the outcome is given up (the job stays `doing` until the
    /// lost-claims release or a rescue finds it).
    fn record_refused(&self, conn: &mut Connection, o: &Outcome, refusal: &Error) -> Result<()> {
        let shared = self.shared;
        let text = limits::safe_text(&format!(
            "the outcome \"{}\" of this attempt could not be recorded ({refusal}); failed instead",
            o.kind
        ));
        log::error!(
            "worker {}: job {}: the database refused its outcome \"{}\" ({refusal}); failing the job instead",
            shared.name,
            o.key.id,
            o.kind
        );
        let res = conn.query_cached(
            "failing a job whose outcome was refused",
            store::JOB_FAIL_UNRECORDABLE,
            &[&o.key.id.0, &o.key.worker, &o.key.attempt, &text],
        );
        match res {
            Ok(rows) => {
                if !rows.is_empty() {
                    shared.stats.recorded.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if is_transient(&e, conn) => return Err(e),
            Err(e) => log::error!(
                "worker {}: job {}: failing it was refused too ({e}); its outcome is given up, and the job will be put back in the queue as a lost claim",
                shared.name,
                o.key.id
            ),
        }
        shared.ledger.settle([o.key]);
        Ok(())
    }

    /// An outcome the guarded update did not apply: either an earlier try of this very
    /// batch committed and only its reply was lost (the row already says so), or the
    /// attempt is no longer this worker's (it was presumed dead and the job was requeued:
    /// it runs again).
    fn explain_unrecorded(&self, conn: &mut Connection, missing: &[&Outcome]) {
        let shared = self.shared;
        let ids: Vec<i64> = missing.iter().map(|o| o.key.id.0).collect();
        type State = (String, Option<i64>, i32);
        let now: HashMap<i64, State> =
            match conn.query_cached("reading unrecorded outcomes", store::JOB_STATES, &[&ids]) {
                Ok(rows) => rows
                    .iter()
                    .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
                    .collect(),
                Err(e) => {
                    log::warn!(
                    "worker {}: {} outcome(s) not recorded, and their jobs could not be read: {e}",
                    shared.name,
                    missing.len()
                );
                    return;
                }
            };
        for o in missing {
            let state = now.get(&o.key.id.0);
            let same_attempt = |st: &State| st.1 == Some(o.key.worker) && st.2 == o.key.attempt;
            let already = match (o.kind, state) {
                (k, None) if k.deletes() => true,
                (OutcomeKind::Expired, Some(st)) => {
                    st.0 == "cancelled" && st.1 == Some(o.key.worker)
                }
                (k, Some(st)) if k.requeues() => st.0 != "doing" && st.1.is_none(),
                (k, Some(st)) => st.0 == k.as_sql() && same_attempt(st),
                _ => false,
            };
            if already {
                log::debug!(
                    "worker {}: outcome \"{}\" of job {} was already recorded (an earlier try committed; its reply was lost)",
                    shared.name,
                    o.kind,
                    o.key.id
                );
            } else {
                log::warn!(
                    "worker {}: outcome \"{}\" of job {} (attempt {}) not recorded: that attempt is no longer this worker's (now {}); the worker was presumed dead and the job was requeued",
                    shared.name,
                    o.kind,
                    o.key.id,
                    o.key.attempt,
                    match state {
                        Some((st, Some(w), a)) => format!("{st}, attempt {a} under worker {w}"),
                        Some((st, None, a)) => format!("{st}, attempt {a}"),
                        None => "deleted".to_owned(),
                    }
                );
            }
        }
    }
}

/// `batch` split by the statement that records each outcome: final ones, requeues, snoozes
/// (in that order).
fn groups<'a>(batch: impl Iterator<Item = &'a Outcome>) -> [Vec<&'a Outcome>; 3] {
    let mut parts: [Vec<&Outcome>; 3] = Default::default();
    for o in batch {
        parts[o.kind.statement() as usize].push(o);
    }
    parts
}

/// True when a statement gave up waiting for a row lock (`lock_not_available`) and the link
/// is fine: some other session holds one of the rows.
fn is_lock_wait(e: &Error, conn: &Connection) -> bool {
    !conn.is_broken() && e.sqlstate() == Some("55P03")
}

/// True when an error says nothing about the outcomes themselves: the link failed, or the
/// server asks to try again. The whole batch is then retried later.
pub(crate) fn is_transient(e: &Error, conn: &Connection) -> bool {
    if conn.is_broken() {
        return true;
    }
    match e.sqlstate() {
        // No answer from the server at all: a deadline, a closed socket.
        None => true,
        Some(code) => {
            // Connection exceptions, transaction rollbacks (deadlock, serialization),
            // insufficient resources, operator intervention (shutdown, cancel), system
            // errors, a lock not available, a read-only server (a standby after failover).
            ["08", "40", "53", "57", "58"]
                .iter()
                .any(|class| code.starts_with(class))
                || code == "55P03"
                || code == "25006"
        }
    }
}
