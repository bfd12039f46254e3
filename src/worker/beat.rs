//! The beat thread: the worker's pulse, its ears, and its care for other workers.
//!
//! Its connection is the one a worker keeps open for as long as it lives. Unless
//! `listen_via` gives the listener a connection elsewhere, it LISTENs on it too: between
//! duties it waits for notifications (at most a tick, so no duty ever waits behind the
//! wait; the shutdown and [`Shared::wake_beat`](super::Shared::wake_beat) cut it short) and
//! acts on them as the listener would (`listen.rs`); after its duties (or after
//! `listen_ping_interval` without any) it sends LISTEN again, a round-trip that proves the
//! link and leaves the connection shown as the listener in `pg_stat_activity`. While the fetcher sleeps (`dormant.rs`), it
//! claims in its stead, on this connection: at every `poll_interval`, when the next
//! scheduled job is due, and at once on news of a job. Each claim is one short statement,
//! as the sweep's are, so a heartbeat never waits long behind one.
//!
//! Every tick (a quarter second) it raises the abort flag of jobs past their task timeout;
//! every half second it polls abort requests for its running jobs (the backstop for a missed
//! notification, and the only path when LISTEN is off); every `poll_interval` it looks
//! whether the stored schedules of its tasks changed (their number and highest revision) and
//! wakes the periodic thread when they did; every `heartbeat_interval` it
//! refreshes its heartbeat and rescues the jobs of workers whose own lease has ended (their
//! last heartbeat plus the `stalled_after` each recorded when it registered: a worker is
//! never judged by this one's setting), and gives back its own `doing` jobs that a claim
//! with a lost reply left behind (`release_lost_claims`). Every second it ends the waiting
//! jobs whose deadline has passed (`expire`, at most [`EXPIRE_BATCH`] a statement), and
//! again at once, without waiting for the tick, while a statement ended a full batch: a
//! backlog of expired jobs is worked off in bounded batches.
//!
//! It keeps beating through a shutdown's graceful wait, until the last executor has ended or
//! the hard deadline comes, so a worker finishing its jobs is never presumed dead.
//!
//! Each heartbeat the database accepts renews the worker's lease in the ledger: until
//! three quarters of `stalled_after` after it was sent, no other worker can presume this one
//! dead, and executors start jobs only while the lease holds. If its own row is gone (another
//! worker presumed it dead: it was paused, or cut off), it registers again under a new
//! identity; the ledger drops the attempts of the old one that had not started (a rescue gave
//! them back to the queue) and tells the running ones to stop (their outcomes are refused).
//!
//! Abort requests are read from the table, never taken from a notification: the listener
//! wakes this thread when an `abort:<id>` arrives, and the poll that follows decides.
//! Database errors are logged and retried on a fresh connection; duties that need the
//! database wait for it, the timeouts do not.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::future::Future;

use crossbeam_channel::{select, Receiver, Sender, TryRecvError};

use super::ledger::{Paused, Unstarted};
use super::link::{Link, Party};
use super::{Outcome, Shared, FLOOD_MUTE, HEAR_AT_MOST};
use crate::conn::Connection;
use crate::error::Result;
use crate::job::{JobId, ABORT_TIMEOUT};
use crate::store;

const TICK: Duration = Duration::from_millis(250);
/// Under a second with the tick, as the abort promise needs when NOTIFY is off or lost:
/// polls come every other tick (~0.5 s), and only while jobs run.
const ABORT_POLL: Duration = Duration::from_millis(400);
/// How often the waiting jobs past their deadline are looked for (an empty index when none
/// has a deadline).
const EXPIRE_EVERY: Duration = Duration::from_secs(1);
/// The most jobs one statement of the sweep ends: a statement of this size takes tens of
/// milliseconds, so the heartbeat and the abort polls never wait long behind it.
pub(crate) const EXPIRE_BATCH: i32 = 5000;
/// How often a stopping worker's beat looks whether its executors are all gone.
const STOPPING_TICK: Duration = Duration::from_millis(10);

/// `news` is the fetcher's wake channel; `listening`, when this thread LISTENs itself, gets
/// one message after each successful LISTEN (the first tells `spawn` the worker hears
/// notifications).
pub(crate) fn run(
    shared: &Shared,
    stop: &Receiver<()>,
    hard: &Receiver<()>,
    outcomes: &Sender<Outcome>,
    news: &Sender<()>,
    listening: Option<&Sender<()>>,
) {
    let listens = listening.is_some();
    let channel = shared.app.namespace().channel().to_owned();
    // The worker's lasting connection, taken in turns with the completer (`link.rs`); its
    // state: it LISTENs and nobody has said so yet.
    let mut link = Link::on_shelf(shared, "the heartbeat", Party::Beat);
    let mut retry_at = Instant::now();
    // While the fetcher sleeps, the beat claims for it, first at once (`dormant.rs`).
    let mut next_claim = Instant::now();
    let mut next_beat = Instant::now() + shared.opts.heartbeat_interval;
    // Look for stalled workers soon after start, then at every heartbeat.
    let mut next_rescue = Instant::now() + Duration::from_millis(500);
    let mut next_abort_poll = Instant::now() + ABORT_POLL;
    // The stored schedules are looked at every poll interval (a worker with schedules in
    // its code reads them at start itself: see `periodic.rs`).
    let mut next_schedules = Instant::now() + shared.opts.poll_interval;
    let mut next_expire = Instant::now() + Duration::from_millis(200);
    // The last sweep ended a full batch: more may wait, sweep again without the tick, from
    // the deadline it reached.
    let mut expire_more: Option<SystemTime> = None;
    // After a flood of notifications: when the beat listens again (see HEAR_AT_MOST).
    let mut muted_until: Option<Instant> = None;
    loop {
        if muted_until.is_some_and(|t| Instant::now() >= t) {
            // The next duty round LISTENs again on the connection (or a new one does).
            muted_until = None;
            shared.shelf.mute(false);
        }
        let stopping = shared.stopping();
        if stopping {
            // While the shutdown lets running jobs finish, the heartbeat, the task timeouts
            // and the abort polls go on: a worker silent for stalled_after would be presumed
            // dead, and the jobs it is finishing would run again elsewhere. Done once no
            // executor is left, or at the hard deadline.
            link.release();
            if shared.handoff.executors() == 0 || super::sleep_or_stop(hard, STOPPING_TICK) {
                return;
            }
        } else {
            let wait = if expire_more.is_some() {
                Duration::ZERO
            } else {
                claim_wait(shared, next_claim)
            };
            // The completer waits for the connection: its turn first.
            link.yield_if_wanted();
            let listen_now = listens && Instant::now() >= retry_at && muted_until.is_none();
            let heard = if listen_now {
                // Notifications are heard while the connection is free; while the completer
                // records, it acts on those that arrive (`complete.rs`).
                link.try_get()
            } else {
                link.release();
                None
            };
            if let Some(got) = heard {
                match got {
                    Ok((c, fresh)) => {
                        if std::mem::take(fresh) {
                            fresh_listen(shared, listening, news);
                        }
                        let heard = hear(shared, c, wait, news);
                        if heard.is_err() {
                            if shared.stopping() {
                                continue;
                            }
                            // A LISTEN link that failed once is not trusted again.
                            if let Err(wait) = link.judge(heard.map(drop)) {
                                retry_at = Instant::now() + wait;
                            }
                            link.drop_connection();
                            continue;
                        }
                        if heard.is_ok_and(|flood| flood) {
                            // What the server still has to send this session dies with it.
                            log::warn!(
                                "worker {}: more than {HEAR_AT_MOST} notifications at once (a bulk abort, or a flood: any role that can connect can NOTIFY); not listening for {FLOOD_MUTE:?}, the fetcher polls meanwhile",
                                shared.name
                            );
                            shared.shelf.mute(true);
                            muted_until = Some(Instant::now() + FLOOD_MUTE);
                            link.drop_connection();
                            shared.news(news);
                            continue;
                        }
                        while shared.beat_wake.1.try_recv().is_ok() {}
                    }
                    Err(failed) => {
                        retry_at = Instant::now() + failed;
                        select! {
                            recv(stop) -> _ => continue,
                            recv(shared.beat_wake.1) -> _ => {},
                            default(wait.min(failed)) => {},
                        }
                    }
                }
            } else {
                // The connection is the completer's for now: wait for it back (to listen),
                // or for the next duty.
                let freed = if listen_now {
                    shared.shelf.freed.1.clone()
                } else {
                    crossbeam_channel::never()
                };
                select! {
                    recv(stop) -> _ => continue,
                    recv(shared.beat_wake.1) -> _ => {},
                    recv(freed) -> _ => {},
                    default(wait) => {},
                }
            }
        }
        raise_timeouts(shared);
        if !stopping {
            end_unstarted(shared, outcomes);
        }
        let now = Instant::now();
        if now < retry_at {
            continue;
        }
        let due_beat = now >= next_beat;
        // A stopping worker takes on nothing: the shutdown gives back what it holds.
        let due_rescue = now >= next_rescue && !stopping;
        let due_abort = shared.ledger.has_suspects()
            || shared.ledger.needs_control_read()
            || (now >= next_abort_poll && shared.ledger.any_held());
        let due_schedules = now >= next_schedules && !stopping;
        let due_expire = (expire_more.is_some() || now >= next_expire) && !stopping;
        let due_claim = !stopping && claim_due(shared, next_claim, now);
        // Silence proves nothing on a half-open link: a LISTEN link unused that long gets a
        // round-trip (the expiry sweep uses it every second anyway).
        let due_ping = listens
            && muted_until.is_none()
            && link
                .idle_for()
                .is_some_and(|d| d >= shared.opts.listen_ping_interval);
        if !(due_beat
            || due_rescue
            || due_abort
            || due_expire
            || due_schedules
            || due_claim
            || due_ping)
        {
            continue;
        }
        let c = match link.get() {
            Ok((c, fresh)) => {
                if std::mem::take(fresh) {
                    fresh_listen(shared, listening, news);
                }
                c
            }
            Err(wait) => {
                retry_at = Instant::now() + wait;
                continue;
            }
        };
        let result = (|| -> Result<()> {
            if due_beat {
                heartbeat(shared, c)?;
                next_beat = Instant::now() + shared.opts.heartbeat_interval;
            }
            if due_claim {
                claim_for_sleeper(shared, c)?;
                next_claim = Instant::now() + shared.opts.poll_interval;
            }

            if due_abort {
                poll_controls(shared, c)?;
                next_abort_poll = Instant::now() + ABORT_POLL;
                if !stopping {
                    end_unstarted(shared, outcomes);
                }
            }
            if due_expire {
                let from = expire_more.take();
                expire_more = expire(shared, c, from)?;
                next_expire = Instant::now() + EXPIRE_EVERY;
            }
            if due_rescue {
                rescue(shared, c)?;
                release_lost_claims(shared, c)?;
                super::observe::queue_gauges(c);
                next_rescue = Instant::now() + shared.opts.heartbeat_interval;
            }
            if due_schedules {
                super::periodic::check_stored(shared, c)?;
                next_schedules = Instant::now() + shared.opts.poll_interval;
            }
            if listens && muted_until.is_none() && !shared.shelf.flood_muted() {
                // LISTEN again (nothing changes on the server): a round-trip that proves the
                // link (`due_ping`), and pg_stat_activity shows this connection, between
                // duties, as the worker's listener.
                c.listen(&channel)?;
            }
            Ok(())
        })();
        if result.is_err() && hard_deadline_passed(hard) {
            // Severed by the shutdown: not worth a warning.
            return;
        }
        if let Err(wait) = link.judge(result) {
            retry_at = Instant::now() + wait;
        }
    }
}

/// The worker's connection LISTENs (again, or for the first time): `spawn` hears of it, and
/// notifications may have been missed meanwhile.
fn fresh_listen(shared: &Shared, listening: Option<&Sender<()>>, news: &Sender<()>) {
    if let Some(l) = listening {
        let _ = l.try_send(());
    }
    shared.news(news);
}

/// Waits up to `wait` for notifications on the beat's LISTEN connection (the shutdown,
/// [`Shared::wake_beat`] and a completer waiting for the connection interrupt it) and acts
/// on those that came. True when more than [`HEAR_AT_MOST`] came at once: a flood.
fn hear(shared: &Shared, c: &mut Connection, wait: Duration, news: &Sender<()>) -> Result<bool> {
    let interrupt = shared.listen_wake.clone();
    let wanted = shared.shelf.wanted.clone();
    let got = c.wait_notification_or(wait, async move {
        let a = interrupt.notified();
        let b = wanted.notified();
        let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
        std::future::poll_fn(|cx| {
            if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    })?;
    if let Some(n) = got {
        super::listen::handle(shared, &n, news);
        // Whatever else arrived, without waiting: at most HEAR_AT_MOST.
        for _ in 1..HEAR_AT_MOST {
            match c.wait_notification(Duration::ZERO)? {
                Some(n) => super::listen::handle(shared, &n, news),
                None => return Ok(false),
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// How long the beat may wait before its next claim for a sleeping fetcher (at most a
/// tick): at `next_claim` (the poll), at the next scheduled job, at once on news.
fn claim_wait(shared: &Shared, next_claim: Instant) -> Duration {
    if shared.stopping() || !shared.dormancy.is_dormant() {
        return TICK;
    }
    if shared.dormancy.asked() {
        return Duration::ZERO;
    }
    let at = match shared.due.deadline() {
        Some((due, _)) => due.min(next_claim),
        None => next_claim,
    };
    at.saturating_duration_since(Instant::now()).min(TICK)
}

/// Whether the beat claims now for a sleeping fetcher.
fn claim_due(shared: &Shared, next_claim: Instant, now: Instant) -> bool {
    shared.dormancy.is_dormant()
        && (shared.dormancy.asked()
            || now >= next_claim
            || shared.due.deadline().is_some_and(|(at, _)| at <= now))
}

/// A claim for the sleeping fetcher (`dormant.rs`): wakes it when the claim brought all it
/// asked for. A claim that failed is asked for again.
fn claim_for_sleeper(shared: &Shared, c: &mut Connection) -> Result<()> {
    let asked = shared.dormancy.take_asked();
    if !shared.dormancy.begin_claim() {
        // The fetcher woke meanwhile: the claim is its own again.
        return Ok(());
    }
    if !asked {
        // A wait that ends on a scheduled job (or the poll): as the fetcher's idle wait.
        let due = shared
            .due
            .deadline()
            .filter(|(at, _)| *at <= Instant::now());
        shared.due.woke(due.map(|(_, job)| job));
    }
    let res = super::fetch::claim_for_sleeper(shared, c);
    shared.dormancy.end_claim(matches!(res, Ok(true)));
    if res.is_err() && asked {
        shared.dormancy.ask();
    }
    res.map(|_| ())
}

fn hard_deadline_passed(hard: &Receiver<()>) -> bool {
    matches!(hard.try_recv(), Ok(()) | Err(TryRecvError::Disconnected))
}

fn raise_timeouts(shared: &Shared) {
    shared.ledger.for_each_running(|key, job| {
        if let Some(t) = job.timeout {
            if job.started.elapsed() >= t && job.abort.get() & ABORT_TIMEOUT == 0 {
                log::warn!(
                    "worker {}: job {} ({}) ran past its {} timeout: should_abort() is now true",
                    shared.name,
                    key.id,
                    job.task,
                    crate::error::fmt_duration(t)
                );
                job.abort.raise(ABORT_TIMEOUT);
            }
        }
    });
}

/// How long after a heartbeat was sent no other worker can have presumed this one dead: a
/// rescuer needs the heartbeat's database time plus `stalled_after`, and that time is after
/// the sending. A quarter is kept as a margin.
pub(crate) fn lease_span(stalled_after: Duration) -> Duration {
    stalled_after.mul_f64(0.75)
}

fn heartbeat(shared: &Shared, conn: &mut Connection) -> Result<()> {
    let id = shared.id();
    let sent = Instant::now();
    let n = conn.execute_cached("refreshing the heartbeat", store::WORKER_HEARTBEAT, &[&id])?;
    if n > 0 {
        shared
            .ledger
            .renew_lease(sent + lease_span(shared.opts.stalled_after));
        return Ok(());
    }
    let who = &shared.identity;
    let sent = Instant::now();
    let new_id: i64 = conn
        .query_one(
            store::WORKER_INSERT,
            &[
                &who.name,
                &who.host,
                &who.pid,
                &who.queues,
                &who.concurrency,
                &who.heartbeat_interval_ms,
                &who.stalled_after_ms,
                &who.tasks,
            ],
        )
        .map_err(|e| e.context("registering the worker again"))?
        .get(0);
    let (dropped, stopped) = shared
        .ledger
        .new_identity(new_id, sent + lease_span(shared.opts.stalled_after));
    log::warn!(
        "worker {} (id {id}) was presumed dead by another worker (its heartbeat went stale) and its jobs were requeued; registered again as id {new_id}: {dropped} claimed job(s) not started are dropped, {stopped} running job(s) told to stop (their outcomes will not be recorded)",
        shared.name
    );
    Ok(())
}

/// How long a held job may wait for a thread before it goes back to the queue, where an
/// idle thread of any worker can take it.
pub(crate) const HOLD_LIMIT: Duration = Duration::from_millis(500);

/// Takes out of the board the held jobs that must not wait for a thread: their abort or
/// cancel was read, their queue is paused, or they waited past [`HOLD_LIMIT`]; their
/// outcomes go to the completer. A job given back for waiting too long makes the fetcher
/// hold nothing for threads only expected to be free, for a while.
fn end_unstarted(shared: &Shared, outcomes: &Sender<Outcome>) {
    if !shared.ledger.any_unstarted_to_end(HOLD_LIMIT) {
        return;
    }
    let mut ended = Vec::new();
    let taken = shared.handoff.board().remove_if(|c| {
        match shared.ledger.take_unstarted(&c.key(), HOLD_LIMIT) {
            Some(why) => {
                ended.push(why);
                true
            }
            None => false,
        }
    });
    let mut given_back = 0;
    for (claimed, why) in taken.iter().zip(ended) {
        match why {
            Unstarted::GivenBack => given_back += 1,
            Unstarted::Aborted => {
                shared.stats.aborted.fetch_add(1, Ordering::Relaxed);
            }
            Unstarted::Cancelled => {
                shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            Unstarted::Expired => {
                shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                crate::metrics::expired(1);
            }
        }
        log::debug!(
            "worker {}: job {} ({}) ends unstarted: {why:?}",
            shared.name,
            claimed.id,
            claimed.task
        );
        // The channel holds as many outcomes as the worker can hold attempts: never full.
        let _ = outcomes.send(Outcome::unstarted(claimed.key(), why));
    }
    if given_back > 0 {
        *shared.quiet_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + super::fetch::QUIET);
        log::debug!(
            "worker {}: gave back {given_back} held job(s) no thread could start",
            shared.name
        );
    }
}

/// Reads the controls (abort and cancel requests of held jobs, paused queues).
fn poll_controls(shared: &Shared, conn: &mut Connection) -> Result<()> {
    let id = shared.id();
    let generation = shared.ledger.poll_begins();
    let sent = Instant::now();
    let rows = conn.query_cached("polling the controls", store::WORKER_CONTROL_POLL, &[&id])?;
    let mut aborts = Vec::new();
    let mut paused = Paused::default();
    for r in &rows {
        match r.get::<_, Option<i64>>(0) {
            Some(job) => aborts.push((JobId(job), r.get::<_, Option<bool>>(1).unwrap_or(false))),
            None => match r.get::<_, Option<String>>(2) {
                Some(q) => {
                    paused.queues.insert(q);
                }
                None => paused.all = true,
            },
        }
    }
    for (job, task) in shared
        .ledger
        .control_read(sent, &aborts, paused, generation)
    {
        log::info!(
            "worker {}: abort requested for job {job} ({task})",
            shared.name
        );
    }
    Ok(())
}

/// Gives back jobs claimed for this worker by a statement whose reply never arrived.
///
/// A claim's reply comes back within `io_timeout` of its sending, or the fetcher gives up
/// on it; a job it brought is held from then until its outcome is recorded. The cutoff is
/// the database's clock read *before* the held set is taken, minus `io_timeout` and a
/// margin: a row claimed before it is either in that set or was claimed by a lost reply,
/// however late the release statement itself reaches the server.
fn release_lost_claims(shared: &Shared, conn: &mut Connection) -> Result<()> {
    let margin = shared.app.io_timeout() + Duration::from_secs(1);
    let margin_ms = margin.as_millis().min(i64::MAX as u128) as i64;
    let cutoff: SystemTime = conn
        .query_cached(
            "reading the clock for lost claims",
            store::LOST_CLAIMS_CUTOFF,
            &[&margin_ms],
        )?
        .first()
        .map(|r| r.get(0))
        .unwrap_or(UNIX_EPOCH);
    let held = shared.ledger.held_ids();
    let id = shared.id();
    let rows = conn.query_cached(
        "giving back jobs of lost claims",
        store::JOB_LOST_CLAIMS_RELEASE,
        &[&id, &held, &cutoff],
    )?;
    let lost: Vec<i64> = rows.first().map(|r| r.get(0)).unwrap_or_default();
    if !lost.is_empty() {
        log::warn!(
            "worker {}: gave back {} job(s) claimed by a statement whose reply was lost: {lost:?}",
            shared.name,
            lost.len()
        );
    }
    Ok(())
}

/// Ends a batch of waiting jobs past their deadline, from deadline `from` on; when the batch
/// was full (more may wait), the deadline it reached, for the next batch.
fn expire(
    shared: &Shared,
    conn: &mut Connection,
    from: Option<SystemTime>,
) -> Result<Option<SystemTime>> {
    let rows = conn.query_cached(
        "ending jobs past their deadline",
        store::JOB_EXPIRE,
        &[&EXPIRE_BATCH, &from],
    )?;
    let (n, reached): (i32, Option<SystemTime>) =
        rows.first().map_or((0, None), |r| (r.get(0), r.get(1)));
    if n > 0 {
        shared.stats.expired.fetch_add(n as u64, Ordering::Relaxed);
        crate::metrics::expired(n as u64);
        log::debug!(
            "worker {}: {n} waiting job(s) reached their deadline before they started; ended expired",
            shared.name
        );
    }
    Ok(if n >= EXPIRE_BATCH { reached } else { None })
}

fn rescue(shared: &Shared, conn: &mut Connection) -> Result<()> {
    let stalled_ms = shared.opts.stalled_after.as_millis().min(i64::MAX as u128) as i64;
    let id = shared.id();
    let rows = conn.query_cached(
        "rescuing jobs of stalled workers",
        store::WORKER_RESCUE,
        &[&stalled_ms, &id],
    )?;
    let row = &rows[0];
    let dead: i64 = row.get(0);
    let jobs: Vec<i64> = row.get(1);
    let outcomes: Vec<String> = row.get(2);
    crate::metrics::rescued(jobs.len());
    if dead > 0 || !jobs.is_empty() {
        let count = |what: &str| outcomes.iter().filter(|o| *o == what).count();
        log::warn!(
            "worker {}: removed {dead} stalled worker(s) (no heartbeat for their own stalled_after) and took back {} job(s): {} requeued, {} aborted (their abort was requested), {} superseded by a waiting job of their queueing lock, {} expired (past their deadline): {:?}",
            shared.name,
            jobs.len(),
            count("todo"),
            count("aborted"),
            count("superseded"),
            count("expired"),
            jobs
        );
    }
    Ok(())
}
