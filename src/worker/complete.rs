//! The completer: records job outcomes in batches, on its own connection.
//!
//! It takes every outcome waiting in its channel (up to [`MAX_BATCH`]) and records them with
//! one statement per kind (final statuses; ways back to the queue), so a busy worker pays one
//! round-trip for many jobs. Each outcome carries its attempt's fence (the worker identity
//! that claimed it and the attempt number): the database applies it only to that attempt.
//!
//! Failures are of two kinds. When the link fails (the connection broke, a deadline fired, the
//! server is shutting down) or the server asks for a retry (deadlock, serialization), the
//! batch is kept whole and retried on a fresh connection with backoff; nothing is dropped
//! while the worker lives. When the database refuses the statement itself (a trigger of the
//! user's, say), the batch is split in halves until the refused outcome is alone: every other
//! outcome is recorded, and that one ends `failed` with the database's reason, or, if even
//! that is refused, is given up with an error in the log. Nothing is retried forever.
//!
//! A job row another session holds locked (an admin's open transaction, say) is not a
//! failure of anything: the recording gives up after its lock timeout (200 ms, the own
//! setting of `postpone_finish` since schema 13), the batch is split until that outcome is
//! alone, the others are recorded, and that one is set aside and tried again after 100 ms,
//! then twice as long each time the row is still held, up to 5 s.
//!
//! An outcome is forgotten by the ledger once recorded (or refused by its guard), which frees
//! its slot for the fetcher: a worker whose outcomes cannot be recorded stops claiming.
//!
//! An idle completer closes its connection once it has been unused for the App's
//! `pool_idle_timeout` (30 s by default), and opens one again for the next outcome: an idle
//! worker holds one connection fewer, and the first outcome after a quiet spell pays for a
//! connect.
//!
//! Ends when every executor has ended and all outcomes are recorded, or at the shutdown's
//! hard deadline; outcomes still unrecorded then are left to the shutdown's last step.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender, TryRecvError};

use super::idhash::IdMap;
use super::link::Link;
use super::{AttemptKey, Outcome, Shared};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::limits;
use crate::store;
use crate::types::RawJson;

/// Most outcomes recorded by one statement.
pub(crate) const MAX_BATCH: usize = 1000;

pub(crate) fn run(
    shared: &Shared,
    outcomes: &Receiver<Outcome>,
    hard: &Receiver<()>,
    wake: &Sender<()>,
) {
    let mut pending: Vec<Outcome> = Vec::new();
    let mut link = Link::new(shared, "recording job outcomes");
    let mut vacuum = super::vacuum::Check::new(&shared.opts.vacuum);
    let mut senders_gone = false;
    let ride = &shared.ride;
    // Outcomes whose job row someone else held locked, and when to try them again.
    let mut locked: Vec<Outcome> = Vec::new();
    let mut locked_retry = Instant::now();
    let mut locked_wait = LOCKED_RETRY_FIRST;
    let idle_close = shared.app.inner.pool.idle_timeout();
    warm_up(&mut link);
    loop {
        if !locked.is_empty() && Instant::now() >= locked_retry {
            pending.append(&mut locked);
        }
        if pending.is_empty() {
            if senders_gone {
                // Whatever still waits for a claim is recorded here before the end.
                pending.extend(ride.take_all());
                if pending.is_empty() && locked.is_empty() {
                    return;
                }
                if pending.is_empty() {
                    // Only rows someone holds locked are left: try again at their time (the
                    // shutdown's hard deadline ends the wait; the shutdown's last step then
                    // has them).
                    let wait = locked_retry.saturating_duration_since(Instant::now());
                    if super::sleep_or_stop(hard, wait) {
                        keep(shared, locked);
                        return;
                    }
                    continue;
                }
            } else {
                let timeout = ride
                    .deadline()
                    .into_iter()
                    .chain((!locked.is_empty()).then_some(locked_retry))
                    .chain(shared.ledger.next_start_due())
                    .min()
                    .map(|d| d.saturating_duration_since(Instant::now()));
                // Wake to close the connection once it has been unused that long.
                let nothing_due = timeout.is_none();
                let close_in = link.idle_for().map(|d| idle_close.saturating_sub(d));
                let timeout = match (timeout, close_in) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let mut woke = false;
                select! {
                    recv(outcomes) -> o => match o {
                        Ok(o) => pending.push(o),
                        Err(_) => senders_gone = true,
                    },
                    recv(hard) -> _ => return,
                    recv(ride.back.1) -> _ => woke = true,
                    recv(shared.starts_due.1) -> _ => woke = true,
                    default(timeout.unwrap_or(Duration::from_secs(3600))) => {}
                }
                if pending.is_empty()
                    && !woke
                    && nothing_due
                    && link.idle_for().is_some_and(|d| d >= idle_close)
                {
                    log::debug!(
                        "worker {}: recording job outcomes: connection unused for {}, closed",
                        shared.name,
                        crate::error::fmt_duration(idle_close)
                    );
                    link.drop_connection();
                    continue;
                }
            }
        }
        write_starts(shared, &mut link);
        while pending.len() < MAX_BATCH {
            match outcomes.try_recv() {
                Ok(o) => pending.push(o),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    senders_gone = true;
                    break;
                }
            }
        }
        // Outcomes no claim took in time, or handed back (the recording failed with the
        // claim), are recorded here, never left to ride again: a refused one would fail
        // every claim it rode on.
        let back = ride.take_expired();
        if shared.opts.ride_claims && !senders_gone && ride.fetcher_busy() {
            let (rest, riders): (Vec<Outcome>, Vec<Outcome>) =
                pending.drain(..).partition(Outcome::requeues);
            pending = rest;
            if !riders.is_empty() {
                ride.leave(riders);
            }
        }
        pending.extend(back);
        if pending.is_empty() {
            // Every outcome rode: the table's counters are still read as often.
            if vacuum.due(shared) {
                if let Ok((c, ())) = link.get() {
                    let res = vacuum.after_record(shared, c);
                    if let Err(e) = &res {
                        log::debug!(
                            "worker {}: reading postpone_jobs' counters: {e}",
                            shared.name
                        );
                    }
                    // A broken link is dropped here; the next recording reconnects.
                    let _ = link.judge(res);
                }
            }
            continue;
        }
        let batch = pending.len().min(MAX_BATCH);
        let res = match link.get() {
            Ok((c, ())) => {
                let res = record(shared, c, &pending[..batch])
                    .map(|held| set_aside(shared, &mut pending, batch, &held, &mut locked));
                // The counters are read once the outcomes are stored (a failure here only
                // delays the check: the outcomes are not recorded twice).
                let res = res.inspect(|_| {
                    if let Err(e) = vacuum.after_record(shared, c) {
                        log::debug!(
                            "worker {}: reading postpone_jobs' counters: {e}",
                            shared.name
                        );
                    }
                });
                link.judge(res)
            }
            Err(wait) => Err(wait),
        };
        match res {
            Ok(set_aside) => {
                pending.drain(..batch - set_aside);
                if locked.is_empty() {
                    locked_wait = LOCKED_RETRY_FIRST;
                } else if Instant::now() >= locked_retry {
                    // Tried again and still held (or newly held): back off.
                    locked_retry = Instant::now() + locked_wait;
                    locked_wait = (locked_wait * 2).min(LOCKED_RETRY_MAX);
                }
                // Slots are free again (and a job retried at once is due): let the fetcher look.
                let _ = wake.try_send(());
            }
            Err(wait) => {
                if super::sleep_or_stop(hard, wait) {
                    pending.append(&mut locked);
                    keep(shared, pending);
                    return;
                }
            }
        }
    }
}

/// Writes the start of the held jobs that have run for a while (see `ledger.rs`), so
/// that every view shows them running. A failure is only logged: the start is written
/// with the job's outcome anyway.
fn write_starts(shared: &Shared, link: &mut Link<'_>) {
    let due = shared.ledger.due_starts();
    if due.is_empty() {
        return;
    }
    let ids: Vec<i64> = due.iter().map(|(k, _)| k.id.0).collect();
    let workers: Vec<i64> = due.iter().map(|(k, _)| k.worker).collect();
    let attempts: Vec<i32> = due.iter().map(|(k, _)| k.attempt).collect();
    let ran: Vec<i64> = due.iter().map(|(_, r)| *r).collect();
    let res = match link.get() {
        Ok((c, ())) => {
            let res = c
                .query_cached(
                    "writing job starts",
                    store::JOB_START,
                    &[&ids, &workers, &attempts, &ran],
                )
                .map(|_| ());
            link.judge(res)
        }
        Err(wait) => Err(wait),
    };
    if res.is_err() {
        log::debug!(
            "worker {}: the start of {} job(s) was not written now; it is written with their outcome",
            shared.name,
            ids.len()
        );
    }
}

/// First wait before an outcome whose job row someone else held locked is tried again; it
/// doubles at each try that finds the row still held, up to [`LOCKED_RETRY_MAX`]. Each try
/// waits at most the recording's lock timeout (200 ms, `postpone_finish`).
const LOCKED_RETRY_FIRST: Duration = Duration::from_millis(100);
const LOCKED_RETRY_MAX: Duration = Duration::from_secs(5);

/// Moves the outcomes among the first `batch` of `pending` that `held` names (their rows
/// were locked by someone else) to `locked`; returns how many moved, so that the recorded
/// ones left at the front are `batch` less that.
fn set_aside(
    shared: &Shared,
    pending: &mut Vec<Outcome>,
    batch: usize,
    held: &[AttemptKey],
    locked: &mut Vec<Outcome>,
) -> usize {
    if held.is_empty() {
        return 0;
    }
    let mut i = 0;
    let mut end = batch;
    while i < end {
        if held.contains(&pending[i].key) {
            let o = pending.remove(i);
            log::info!(
                "worker {}: job {}'s row is locked by another session: its outcome ({}) waits and is tried again",
                shared.name,
                o.key.id,
                o.word
            );
            locked.push(o);
            end -= 1;
        } else {
            i += 1;
        }
    }
    batch - end
}

fn keep(shared: &Shared, pending: Vec<Outcome>) {
    if !pending.is_empty() {
        shared
            .unrecorded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(pending);
    }
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

/// Records a batch of outcomes. Fails only with a transient error (see [`is_transient`]):
/// an outcome the database refuses is isolated and settled on its own. Returns the attempts
/// whose job row another session held locked past the recording's lock timeout
/// (`postpone_finish`, schema version 13): they are not recorded yet, the others are.
pub(crate) fn record(
    shared: &Shared,
    conn: &mut Connection,
    batch: &[Outcome],
) -> Result<Vec<AttemptKey>> {
    let (requeues, finals): (Vec<&Outcome>, Vec<&Outcome>) =
        batch.iter().partition(|o| o.requeues());
    let (snoozes, requeues): (Vec<&Outcome>, Vec<&Outcome>) =
        requeues.into_iter().partition(|o| o.word == "snooze");
    let mut locked = Vec::new();
    for group in [finals, requeues, snoozes] {
        if !group.is_empty() {
            record_isolating(shared, conn, &group, &mut locked)?;
        }
    }
    Ok(locked)
}

/// True when a statement gave up waiting for a row lock (`lock_not_available`) and the link
/// is fine: some other session holds one of the rows.
fn is_lock_wait(e: &Error, conn: &Connection) -> bool {
    !conn.is_broken() && e.sqlstate() == Some("55P03")
}

/// Records `group` (all final, all requeues, or all snoozes); on a refusal, splits it until
/// the refused outcome is alone. A row someone else holds locked is isolated the same way,
/// so that it holds up no other outcome; its attempt goes into `locked`, to be tried again.
fn record_isolating(
    shared: &Shared,
    conn: &mut Connection,
    group: &[&Outcome],
    locked: &mut Vec<AttemptKey>,
) -> Result<()> {
    match record_once(shared, conn, group) {
        Ok(_) => Ok(()),
        // Checked before `is_transient`, which counts a lock wait too.
        Err(e) if is_lock_wait(&e, conn) => match group {
            [one] => {
                locked.push(one.key);
                Ok(())
            }
            _ => record_halves(shared, conn, group, locked),
        },
        Err(e) if is_transient(&e, conn) => Err(e),
        Err(e) if group.len() == 1 => record_refused(shared, conn, group[0], &e),
        Err(_) => record_halves(shared, conn, group, locked),
    }
}

/// [`record_isolating`] of each half of `group`, in order.
fn record_halves(
    shared: &Shared,
    conn: &mut Connection,
    group: &[&Outcome],
    locked: &mut Vec<AttemptKey>,
) -> Result<()> {
    let (a, b) = group.split_at(group.len() / 2);
    record_isolating(shared, conn, a, locked)?;
    record_isolating(shared, conn, b, locked)
}

/// Connects at once, while the fetcher makes its first claim, and runs the completion on no
/// jobs, so that the session has planned it (and compiled the functions behind it) before
/// the first outcomes arrive. Otherwise the first outcome of a fresh worker waited for the
/// completer's connection and those plans, one after the other, after the first claim's
/// reply: draining 10,000 jobs at concurrency 4, the first outcome was recorded 27.5-28.6
/// ms after the start (medians of 5, three alternations), and 18.1-23.1 ms with this. A
/// failure here is judged as any other (logged, backoff), and the loop connects again when
/// it needs to.
fn warm_up(link: &mut Link<'_>) {
    let Ok((conn, ())) = link.get() else {
        return;
    };
    let none = FinishParams::new(&[]);
    let res = conn
        .query_cached(
            "recording job outcomes (planning)",
            store::JOB_FINISH_BATCH,
            &none.params(),
        )
        .map(drop);
    let _ = link.judge(res);
}

/// One statement for `group`; settles the attempts in the ledger when it commits, and
/// returns how many of the outcomes it applied (the others were recorded before, or their
/// attempts are no longer this worker's).
pub(crate) fn record_once(
    shared: &Shared,
    conn: &mut Connection,
    group: &[&Outcome],
) -> Result<usize> {
    let ids: Vec<i64> = group.iter().map(|o| o.key.id.0).collect();
    let workers: Vec<i64> = group.iter().map(|o| o.key.worker).collect();
    let attempts: Vec<i32> = group.iter().map(|o| o.key.attempt).collect();
    let errors: Vec<Option<String>> = group
        .iter()
        .map(|o| o.error.as_deref().map(limits::safe_text))
        .collect();
    let done: IdMap<i64, String> = if group[0].word == "snooze" {
        let delays: Vec<i64> = group
            .iter()
            .map(|o| limits::delay_micros(o.delay))
            .collect();
        conn.query_cached(
            "recording job outcomes (snooze)",
            store::JOB_SNOOZE,
            &[&ids, &workers, &attempts, &delays],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    } else if group[0].requeues() {
        // A released attempt keeps its job's schedule; a retry is due after its delay.
        let delays: Vec<Option<i64>> = group
            .iter()
            .map(|o| (o.word == "retry").then(|| limits::delay_micros(o.delay)))
            .collect();
        let give_back: Vec<bool> = group.iter().map(|o| o.word == "release").collect();
        conn.query_cached(
            "recording job outcomes (requeue)",
            store::JOB_REQUEUE,
            &[&ids, &workers, &attempts, &delays, &errors, &give_back],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    } else {
        let p = FinishParams::new(group);
        conn.query_cached(
            "recording job outcomes",
            store::JOB_FINISH_BATCH,
            &p.params(),
        )?
        .iter()
        .map(|r| (r.get(0), String::new()))
        .collect()
    };
    settle(shared, conn, group, &done);
    Ok(done.len())
}

/// The parameters of [`store::JOB_FINISH_BATCH`] for `group` (final outcomes only).
pub(crate) struct FinishParams<'a> {
    ids: Vec<i64>,
    workers: Vec<i64>,
    attempts: Vec<i32>,
    words: Vec<&'static str>,
    errors: Vec<Option<String>>,
    outputs: Vec<Option<&'a RawJson>>,
    ran_us: Vec<Option<i64>>,
}

impl<'a> FinishParams<'a> {
    pub(crate) fn new(group: &[&'a Outcome]) -> FinishParams<'a> {
        FinishParams {
            ids: group.iter().map(|o| o.key.id.0).collect(),
            workers: group.iter().map(|o| o.key.worker).collect(),
            attempts: group.iter().map(|o| o.key.attempt).collect(),
            words: group.iter().map(|o| o.word).collect(),
            errors: group
                .iter()
                .map(|o| o.error.as_deref().map(limits::safe_text))
                .collect(),
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
            &self.words,
            &self.errors,
            &self.outputs,
            &self.ran_us,
        ]
    }
}

/// After a statement recorded `group` and returned, for each outcome it applied, its
/// job's id and what came of it (`done`): frees the attempts' slots, counts, and says
/// what the log should know.
pub(crate) fn settle(
    shared: &Shared,
    conn: &mut Connection,
    group: &[&Outcome],
    done: &IdMap<i64, String>,
) {
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
        explain_unrecorded(shared, conn, &missing);
    }
}

/// The database refused this outcome alone: the attempt ends `failed` with the reason, or,
/// if even that is refused, the outcome is given up (the job stays `doing` until the
/// lost-claims release or a rescue finds it).
fn record_refused(
    shared: &Shared,
    conn: &mut Connection,
    o: &Outcome,
    refusal: &Error,
) -> Result<()> {
    let text = limits::safe_text(&format!(
        "the outcome {:?} of this attempt could not be recorded ({refusal}); failed instead",
        o.word
    ));
    log::error!(
        "worker {}: job {}: the database refused its outcome {:?} ({refusal}); failing the job instead",
        shared.name,
        o.key.id,
        o.word
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

/// An outcome the guarded update did not apply: either an earlier try of this very batch
/// committed and only its reply was lost (the row already says so), or the attempt is no
/// longer this worker's (it was presumed dead and the job was requeued: it runs again).
fn explain_unrecorded(shared: &Shared, conn: &mut Connection, missing: &[&Outcome]) {
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
        let already = match (o.word, state) {
            ("delete", None) => true,
            ("expired", Some(st)) => st.0 == "cancelled" && st.1 == Some(o.key.worker),
            ("retry" | "release" | "snooze", Some(st)) => st.0 != "doing" && st.1.is_none(),
            (word, Some(st)) => st.0 == word && same_attempt(st),
            _ => false,
        };
        if already {
            log::debug!(
                "worker {}: outcome {:?} of job {} was already recorded (an earlier try committed; its reply was lost)",
                shared.name,
                o.word,
                o.key.id
            );
        } else {
            log::warn!(
                "worker {}: outcome {:?} of job {} (attempt {}) not recorded: that attempt is no longer this worker's (now {}); the worker was presumed dead and the job was requeued",
                shared.name,
                o.word,
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
