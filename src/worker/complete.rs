//! The completer: records job outcomes in batches, on its own connection.
//!
//! It takes every outcome waiting in its channel (up to [`MAX_BATCH`]) and records them
//! through the worker's [`Recorder`] (`record.rs`) with one statement per kind (final
//! statuses; ways back to the queue; snoozes), so a busy worker pays one round-trip for many
//! jobs. Each outcome carries its attempt's fence (the worker identity
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
//! It records on the worker's lasting connection, which it takes in turns with the beat
//! thread (`link.rs`): it takes it when outcomes wait, keeps it while more keep coming (and
//! acts on the notifications that arrive on it meanwhile, as the beat would), gives it to
//! the beat between two batches when the beat waits for it, and puts it back before it waits.
//! A worker process thus records, beats and listens on one connection, and holds a second
//! only while its fetcher claims. While the server refuses connections it has no connection
//! of its own to give up; a fetcher put to sleep by refusals (`fetch.rs`) has the beat claim
//! again each time outcomes were recorded (threads are free).
//!
//! Ends when every executor has ended and all outcomes are recorded, or at the shutdown's
//! hard deadline; outcomes still unrecorded then are left to the shutdown's last step.

use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender, TryRecvError};

use super::link::{Link, Party};
use super::record::Recorder;
use super::{AttemptKey, Outcome, Shared};
use crate::store;

/// Most outcomes recorded by one statement.
pub(crate) const MAX_BATCH: usize = 1000;

/// How long the completer keeps the worker's connection after a batch, for the next one,
/// before it goes back to the beat, while the worker drains (its fetcher's last claim filled
/// every free slot). When the fetcher waits for jobs the connection goes back at once: the
/// beat listens on it, and a notification arriving meanwhile would wait up to this long.
const LINGER: Duration = Duration::from_millis(5);

pub(crate) fn run(
    shared: &Shared,
    outcomes: &Receiver<Outcome>,
    hard: &Receiver<()>,
    wake: &Sender<()>,
) {
    let mut pending: Vec<Outcome> = Vec::new();
    let mut link = Link::on_shelf(shared, "recording job outcomes", Party::Completer);
    let mut vacuum = super::vacuum::Check::new(&shared.opts.vacuum);
    let mut senders_gone = false;
    let ride = &shared.ride;
    // Outcomes whose job row someone else held locked, and when to try them again.
    let mut locked: Vec<Outcome> = Vec::new();
    let mut locked_retry = Instant::now();
    let mut locked_wait = LOCKED_RETRY_FIRST;
    // The connection was kept `LINGER` after the last batch: it goes back now.
    let mut lingered = false;
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
                    link.release();
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
                // Nothing to record now. In a drain the connection is kept for a moment
                // (`LINGER`) in case more outcomes come, rather than handed to the beat and
                // taken back (each hand-over waits for the other thread to be scheduled);
                // the beat gets it at once if it waits for it. When the fetcher waits for
                // jobs, it goes back to the beat at once: the next job's notification comes
                // on it.
                let keep = link.holding() && !lingered && !ride.fetcher_waits();
                if !keep {
                    link.release();
                }
                let wait = timeout.unwrap_or(Duration::from_secs(3600));
                let (wait, want) = if keep {
                    (wait.min(LINGER), shared.shelf.want.1.clone())
                } else {
                    (wait, crossbeam_channel::never())
                };
                select! {
                    recv(outcomes) -> o => match o {
                        Ok(o) => pending.push(o),
                        Err(_) => senders_gone = true,
                    },
                    recv(hard) -> _ => return,
                    recv(ride.back.1) -> _ => {},
                    recv(shared.starts_due.1) -> _ => {},
                    recv(want) -> _ => link.release(),
                    default(wait) => lingered = keep,
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
                if let Ok((c, _)) = link.get() {
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
            Ok((c, _)) => {
                let res = Recorder::new(shared)
                    .record(c, &pending[..batch])
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
                lingered = false;
                after_batch(shared, &mut link, wake);
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
                link.release();
                if super::sleep_or_stop(hard, wait) {
                    pending.append(&mut locked);
                    keep(shared, pending);
                    return;
                }
            }
        }
    }
}

/// After a batch was recorded: acts on the notifications that arrived on the connection
/// meanwhile (the beat hears only while the connection is free), has the beat claim for a
/// fetcher that sleeps because the server refuses connections (threads are free now), and
/// gives the connection to the beat if it waits for it.
fn after_batch(shared: &Shared, link: &mut Link<'_, bool>, wake: &Sender<()>) {
    if shared.shelf.listens() {
        if let Ok((c, _)) = link.get() {
            // Only what arrived during the batch's round-trips: no wait, no read (a wait of
            // zero would still run the connection's runtime once per batch).
            while let Some(n) = c.buffered_notification() {
                super::listen::handle(shared, &n, wake);
            }
        }
    }
    if shared.dormancy.refused() {
        shared.dormancy.ask();
        shared.wake_beat();
    }
    link.yield_if_wanted();
}

/// Writes the start of the held jobs that have run for a while (see `ledger.rs`), so
/// that every view shows them running. A failure is only logged: the start is written
/// with the job's outcome anyway.
fn write_starts(shared: &Shared, link: &mut Link<'_, bool>) {
    let due = shared.ledger.due_starts();
    if due.is_empty() {
        return;
    }
    let ids: Vec<i64> = due.iter().map(|(k, _)| k.id.0).collect();
    let workers: Vec<i64> = due.iter().map(|(k, _)| k.worker).collect();
    let attempts: Vec<i32> = due.iter().map(|(k, _)| k.attempt).collect();
    let ran: Vec<i64> = due.iter().map(|(_, r)| *r).collect();
    let res = match link.get() {
        Ok((c, _)) => {
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
                o.kind
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

/// Takes the worker's connection at once, while the fetcher makes its first claim, and runs
/// the completion on no jobs, so that the session has planned it (and compiled the functions
/// behind it) before the first outcomes arrive. Otherwise the first outcome of a fresh worker
/// waited for a connection and those plans, one after the other, after the first claim's
/// reply (measured when the completer had a connection of its own): draining 10,000 jobs at concurrency 4, the first outcome was recorded 27.5-28.6
/// ms after the start (medians of 5, three alternations), and 18.1-23.1 ms with this. A
/// failure here is judged as any other (logged, backoff), and the loop connects again when
/// it needs to.
fn warm_up(link: &mut Link<'_, bool>) {
    let Ok((conn, _)) = link.get() else {
        return;
    };
    let res = Recorder::warm_up(conn);
    let _ = link.judge(res);
    link.release();
}
