//! The fetcher: claims due jobs for the worker's free slots and hands them to executors.
//!
//! States: *claiming* (slots free, the last claim filled every slot asked for: claim again at
//! once), *full* (too few free slots: wait for the completer to record outcomes, or for an
//! executor to find no claimed job left to start, whichever comes first), *idle* (the queue gave
//! fewer jobs than asked: wait for a notification, the next due job (see `due.rs`), the
//! poll interval, or stop), *backing off* (the last round-trip failed: wait, reconnect,
//! claim again), *asleep* (nothing to claim and no job held for the App's
//! `pool_idle_timeout`: the connection is closed and the beat thread claims instead, see
//! `dormant.rs`). A claim asks for every
//! free slot at once, so a busy worker claims in batches and an idle one in ones.
//!
//! Bytes: the jobs claimed and not started hold their arguments. Each claim passes the
//! database what is left of the worker's byte budget (`prefetch_bytes`, 64 MiB) beside the
//! arguments waiting on the board, and the claim returns jobs in order while their
//! arguments fit in it (a job larger than the whole budget comes alone, when nothing
//! waits). A claim that left a job for its size says so: the fetcher then claims again
//! once a waiting job has started (the board weighs less), not when news comes.

use crossbeam_channel::{select, Receiver, Sender};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::claim::{claim_keyed, claim_with_riders, hand_out, unkey, Budget};
use super::link::Link;
use super::locked::Locked;
use super::share::{Help, Helper};
use super::split::{claim_split, Second};
use super::{sleep_or_stop, Outcome, Shared};
use crate::conn::Connection;
use crate::error::Result;

pub(crate) fn run(
    shared: &Shared,
    stop: &Receiver<()>,
    wake: &Receiver<()>,
    outcomes: &Receiver<Outcome>,
    out: Sender<Outcome>,
) {
    // The claim is prepared once per connection by query_cached (or sent unnamed through a
    // transaction pooler, where a statement prepared here would not survive).
    let mut link = Link::new(shared, "claiming jobs");
    // Claims whose jobs are written once, with their outcome (`locked.rs`): the transaction
    // they keep open is written and committed before the fetcher waits, and as it ends.
    let mut locked = Locked::new(shared, out);
    claim_loop(shared, stop, wake, outcomes, &mut link, &mut locked);
    locked.end(&mut link);
}

fn claim_loop(
    shared: &Shared,
    stop: &Receiver<()>,
    wake: &Receiver<()>,
    outcomes: &Receiver<Outcome>,
    link: &mut Link<'_, ()>,
    locked: &mut Locked<'_>,
) {
    let task_names: Option<Vec<String>> = shared
        .opts
        .only_registered
        .then(|| shared.tasks.keys().cloned().collect());
    // A second connection for claims of large jobs (`split.rs`), opened when one comes;
    // what decides: the mean size of the last claim's arguments, and whether it brought all
    // it asked for (a backlog; a worker whose claims find a few jobs at a time sends one).
    let mut second = Second::new(shared);
    let mut last_args_bytes = 0usize;
    let mut last_full = false;
    let claim_latency = Ewma::new(Duration::from_millis(1));
    // The mean size of a claimed job's arguments, in bytes (an Ewma of "nanoseconds").
    let args_bytes = Ewma::new(Duration::from_nanos(100));
    let mut helper = Helper::new(outcomes);
    let idle_close = shared.app.inner.pool.idle_timeout();
    let mut empty_since: Option<Instant> = None;
    // What the board weighed when the last claim left a job for its size: no claim until
    // it weighs less.
    let mut cut_at: Option<usize> = None;
    loop {
        if shared.stopping() {
            return;
        }
        if locked.time_left().is_some_and(|t| t.is_zero()) {
            locked.close(link);
        }
        locked.tick();
        // While the open transaction's jobs wait for an executor, the next claim (which
        // writes them) waits for the last of them to start, or for the transaction's time.
        if let Some(left) = locked.time_left().filter(|_| !shared.handoff.is_empty()) {
            shared.handoff.want_room();
            if !shared.handoff.is_empty() {
                select! {
                    recv(stop) -> _ => {
                        shared.handoff.stop_wanting_room();
                        return;
                    }
                    recv(shared.handoff.room()) -> _ => {}
                    default(left) => {}
                }
            }
            shared.handoff.stop_wanting_room();
            continue;
        }
        // While the server refuses connections and the worker's lasting connection (the
        // beat's and the completer's, `link.rs`) is lost, the fetcher hands its own over:
        // heartbeats, outcomes and (while the fetcher sleeps) claims go on on it, and the
        // fetcher connects again after its backoff. (A fleet whose fetchers held every free
        // slot while their completers were refused made no progress at all: 90 processes
        // on max_connections 100.)
        if shared.refusals.under_way() && shared.shelf.is_empty() {
            locked.close(link);
            second.close();
            locked.close_connections();
            if let Some(conn) = link.take_connection() {
                match shared.shelf.offer(conn) {
                    None => log::debug!(
                        "worker {}: claiming jobs: connection handed to the heartbeat while the server refuses connections",
                        shared.name
                    ),
                    Some(conn) => drop(conn),
                }
            }
        }
        // Jobs are held beyond the free threads only while some thread is free or expected
        // to be free soon (within two claims' time): a worker whose threads are all in long
        // jobs holds nothing another worker could run.
        let horizon =
            (claim_latency.get() * 2).clamp(Duration::from_millis(1), Duration::from_millis(200));
        let free_threads = free_threads(shared);
        // Threads not stuck in a job expected to run on: the prefetch is sized for them.
        let available = available_threads(shared, horizon, free_threads > 0);
        let capacity = shared.opts.concurrency
            + if available > 0 {
                prefetch(
                    shared,
                    available,
                    claim_latency.get(),
                    args_bytes.get().as_nanos() as usize,
                )
            } else {
                0
            };
        // Attempts count until their outcome is recorded, so a worker whose outcomes wait
        // stops claiming; but up to `capacity` finished attempts waiting for the completer
        // do not count, so that the next claim's commit overlaps the completer's instead of
        // waiting for it (at most twice the capacity is ever held). While executors still
        // have jobs waiting, claim only when half the capacity is free, so that a busy worker
        // claims in batches rather than one job per round-trip.
        let bytes = byte_room(shared, &mut cut_at);
        let Some(free) = room(shared, capacity).filter(|_| bytes.is_some()) else {
            // When what fills the slots is outcomes waiting for the completer (not jobs
            // waiting for an executor), record some of them.
            let behind = shared.ledger.held_and_finished().1 >= capacity;
            let help = if behind {
                // The helper records on this connection: not inside the open transaction.
                locked.close(link);
                helper.help(shared, link)
            } else {
                Help::Nothing
            };
            match help {
                Help::Nothing => {}
                Help::Helped => continue,
                Help::Failed(wait) => {
                    if sleep_or_stop(stop, wait) {
                        return;
                    }
                    continue;
                }
            }
            // Said before the count is read again: an executor that finishes the last
            // claimed job after that read sees it and wakes us on `room`.
            shared.handoff.want_room();
            if room(shared, capacity).is_none() || byte_room(shared, &mut cut_at).is_none() {
                // An open transaction is written when its time is up, if the fetcher still
                // waits then.
                let recheck = locked
                    .time_left()
                    .map_or(ROOM_RECHECK, |t| t.min(ROOM_RECHECK));
                // The completer signals on `wake` when it has recorded outcomes; an
                // executor on `room` when it found no claimed job left to start.
                // Looks again now and then: a running job nearing its typical end makes
                // room for a job held for its thread.
                select! {
                    recv(stop) -> _ => {
                        shared.handoff.stop_wanting_room();
                        return;
                    }
                    recv(wake) -> _ => {}
                    recv(shared.handoff.room()) -> _ => {}
                    default(recheck) => {}
                }
            }
            shared.handoff.stop_wanting_room();
            continue;
        };
        let budget = bytes.expect("room was found");
        let split = last_full && Second::wanted(shared, free, last_args_bytes);
        let lock_claim = !split && locked.usable();
        if !lock_claim {
            locked.close(link);
        }
        // As many jobs as the executors are expected to end within the transaction's time.
        let free = if lock_claim {
            free.min(locked.cap())
        } else {
            free
        };
        let claimed = match link.get() {
            Ok((c, ())) => {
                let started = Instant::now();
                let res = match second.connection(split) {
                    Some(c2) => {
                        let (res, res2) =
                            claim_split(shared, c, c2, free, free_threads, budget, &task_names);
                        second.judge(shared, res, res2)
                    }
                    None if lock_claim && !c.through_transaction_pooler() => {
                        locked.claim(c, free, free_threads, budget, &task_names)
                    }
                    None => claim_with_riders(shared, c, free, free_threads, budget, &task_names),
                };
                claim_latency.observe(started.elapsed());
                link.judge(res.map(|(claimed, cut)| (unkey(claimed), cut)))
            }
            Err(wait) => Err(wait),
        };
        second.close_if_idle(idle_close);
        let (claimed, cut) = match claimed {
            Ok(claimed) => claimed,
            Err(wait) if link.refused() => {
                locked.close(link);
                // Refused a connection: the beat claims on the worker's connection until
                // the backoff has passed and its claims leave work over (`dormant.rs`).
                let until = Instant::now() + wait;
                if shared
                    .dormancy
                    .sleep_refused(stop, until, || shared.wake_beat())
                {
                    return;
                }
                continue;
            }
            Err(wait) => {
                locked.close(link);
                if sleep_or_stop(stop, wait) {
                    return;
                }
                continue;
            }
        };
        let n = claimed.len();
        let bytes: usize = claimed.iter().map(|c| c.args.0.len()).sum();
        // Weighed before the jobs go on the board: they raise it.
        cut_at = cut.then(|| shared.handoff.waiting_bytes() + bytes);
        last_full = n >= free || cut;
        if let Some(mean) = bytes.checked_div(n) {
            args_bytes.observe(Duration::from_nanos(mean as u64));
            last_args_bytes = mean;
        }
        // Said before the jobs are handed out, so that their outcomes find it said.
        shared.ride.set_idle(n < free);
        hand_out(shared, claimed);
        // Nothing claimed and nothing held since `empty_since`: past the App's
        // pool_idle_timeout, the connection is closed and the beat claims (`dormant.rs`).
        if n > 0 || shared.ledger.held_and_finished().0 > 0 {
            empty_since = None;
        } else if empty_since.is_none() {
            empty_since = Some(Instant::now());
        }
        if n < free && !cut {
            // The queue had less than we could take. While the completer is behind (the
            // end of a drain), record a share of its outcomes, as long as no news came;
            // then wait for news or the next due job. The open transaction's jobs, the last
            // of the queue, are written once they end (within its time), unless news comes.
            locked.close_when_done(link, wake);
            while wake.is_empty() {
                match helper.help(shared, link) {
                    Help::Nothing => break,
                    Help::Helped => {}
                    Help::Failed(wait) => {
                        if sleep_or_stop(stop, wait) {
                            return;
                        }
                        break;
                    }
                }
            }
            if empty_since.is_some_and(|t| t.elapsed() >= idle_close) && wake.is_empty() {
                log::debug!(
                    "worker {}: claiming jobs: nothing to claim for {}; connection closed, the heartbeat's claims in its stead",
                    shared.name,
                    crate::error::fmt_duration(idle_close)
                );
                link.close();
                second.close();
                locked.close_connections();
                if shared.dormancy.sleep(stop, wake) {
                    return;
                }
                empty_since = None;
                continue;
            }
            if super::due::idle_wait(shared, stop, wake) {
                return;
            }
        }
    }
}

/// A claim of the beat thread's while the fetcher sleeps (`dormant.rs`), on the beat's
/// connection: for the free threads only, every job started. Returns whether the fetcher
/// should wake: the claim brought all it asked for, or no thread was free.
pub(crate) fn claim_for_sleeper(shared: &Shared, conn: &mut Connection) -> Result<bool> {
    let free = free_threads(shared);
    if free == 0 {
        return Ok(true);
    }
    let task_names: Option<Vec<String>> = shared
        .opts
        .only_registered
        .then(|| shared.tasks.keys().cloned().collect());
    // Jobs for free threads (the board is empty when the fetcher sleeps), in the same
    // byte budget as the fetcher's claims.
    let waiting = shared.handoff.waiting_bytes();
    let budget = Budget {
        bytes: shared.opts.prefetch_bytes.saturating_sub(waiting),
        alone: waiting == 0,
    };
    let (claimed, cut) = claim_keyed(shared, conn, free, free, budget, &task_names, None)?;
    let n = claimed.len();
    hand_out(shared, unkey(claimed));
    Ok(n >= free || cut)
}

/// Threads with nothing to run: neither a running job nor one waiting on the board for them.
fn free_threads(shared: &Shared) -> usize {
    shared
        .opts
        .concurrency
        .saturating_sub(shared.ledger.running() + shared.handoff.waiting())
}

/// How often a fetcher waiting for room looks again whether a thread will soon be free.
const ROOM_RECHECK: Duration = Duration::from_millis(20);

/// How long the fetcher holds no job for a thread only expected to be free soon, after a
/// held job had to be given back (that expectation was wrong).
pub(crate) const QUIET: Duration = Duration::from_secs(2);

/// Threads free now or expected to be free within `horizon`: those not running a job that
/// its task's typical run time says will run longer. While a held job had to be given back
/// lately (that guess was wrong then), only the threads free now (`idle`: any).
fn available_threads(shared: &Shared, horizon: Duration, idle: bool) -> usize {
    let quiet = *shared.quiet_until.lock().unwrap_or_else(|e| e.into_inner());
    let (running, ending) = shared
        .ledger
        .running_and_ending_soon(horizon, |task| shared.typical_time(task));
    if quiet.is_some_and(|q| Instant::now() < q) {
        return if idle {
            shared.opts.concurrency.saturating_sub(running)
        } else {
            0
        };
    }
    shared.opts.concurrency.saturating_sub(running - ending)
}

/// The byte budget of the next claim, and whether a job larger than it may come alone:
/// `None` while the jobs waiting on the board fill the budget, or while they weigh as much
/// as when the last claim left a job for its size (`cut_at`, cleared once they weigh less).
fn byte_room(shared: &Shared, cut_at: &mut Option<usize>) -> Option<Budget> {
    let waiting = shared.handoff.waiting_bytes();
    if waiting == 0 {
        *cut_at = None;
        return Some(Budget {
            bytes: shared.opts.prefetch_bytes,
            alone: true,
        });
    }
    match *cut_at {
        Some(at) if waiting >= at => return None,
        Some(_) => *cut_at = None,
        None => {}
    }
    let left = shared.opts.prefetch_bytes.saturating_sub(waiting);
    (left > 0).then_some(Budget {
        bytes: left,
        alone: false,
    })
}

/// The free slots when the worker has room to claim (see the comment in `run`), else `None`.
fn room(shared: &Shared, capacity: usize) -> Option<usize> {
    let (held, finished) = shared.ledger.held_and_finished();
    let free = capacity.saturating_sub(held - finished.min(capacity));
    let threshold = if shared.handoff.is_empty() {
        1
    } else {
        (capacity / 2).max(1)
    };
    (free >= threshold).then_some(free)
}

/// Most jobs an adaptive prefetch holds beyond the executors' own. A claim's fixed costs
/// (its commit, its round-trip, its statements) are shared by the jobs it takes, and a worker
/// whose claims are small spends its fetcher's time on them and waits for its completer:
/// draining no-op jobs at concurrency 4 on this project's 2-core machine, a cap of 256 gave
/// 14,200-16,100 jobs/s and 4,096 gave 24,800-28,400 (alternating runs, finished jobs kept).
pub(crate) const MAX_PREFETCH: usize = 4096;

/// The default byte budget of a worker's jobs claimed and not started (`prefetch_bytes`),
/// enforced by each claim. The adaptive prefetch also asks for no more jobs than the budget
/// holds at the mean size of the jobs claimed so far, so that a claim among large jobs locks
/// and measures few more than it can return.
pub(crate) const MAX_PREFETCH_BYTES: usize = 64 << 20;

/// How many jobs to hold beyond the running ones. Fixed if the builder said so; otherwise
/// enough to keep `threads` executors (those free or soon free) busy for two claim
/// round-trips at the current job duration,
/// at least 1 (so the next claim overlaps the current job), at most [`MAX_PREFETCH`] and at
/// most the byte budget's worth at `args_bytes` each. Fast jobs are claimed in
/// large batches; slow jobs are not hoarded away from other workers.
fn prefetch(shared: &Shared, threads: usize, claim_latency: Duration, args_bytes: usize) -> usize {
    match shared.opts.prefetch {
        Some(p) => p,
        None => bounded_prefetch(
            adaptive_prefetch(threads, shared.job_duration.get(), claim_latency),
            args_bytes,
            shared.opts.prefetch_bytes,
        ),
    }
}

/// `jobs`, or fewer when that many jobs of `args_bytes` each would hold more than `budget`
/// bytes of arguments (at least 1).
pub(crate) fn bounded_prefetch(jobs: usize, args_bytes: usize, budget: usize) -> usize {
    jobs.min((budget / args_bytes.max(1)).max(1))
}

/// The adaptive prefetch as a pure function of the concurrency, the average job duration
/// and the average claim latency.
pub(crate) fn adaptive_prefetch(concurrency: usize, job: Duration, claim: Duration) -> usize {
    let job = job.max(Duration::from_micros(1));
    let per_thread = claim.as_secs_f64() * 2.0 / job.as_secs_f64();
    let want = (per_thread * concurrency as f64).ceil();
    if want.is_finite() {
        (want.min(MAX_PREFETCH as f64) as usize).clamp(1, MAX_PREFETCH)
    } else {
        MAX_PREFETCH
    }
}

/// An exponentially weighted moving average of durations, shareable between threads
/// (updates may race; an average that is slightly off is fine here).
#[derive(Debug)]
pub(crate) struct Ewma {
    nanos: std::sync::atomic::AtomicU64,
    /// Samples still to be averaged in as a plain mean (see [`Ewma::guess`]).
    warming: std::sync::atomic::AtomicU32,
}

/// The weight of a sample, once warm: the average moves an eighth of the way towards it.
const EWMA_SPAN: u32 = 8;

impl Ewma {
    /// An average that starts at `initial`, as if it had been measured.
    pub(crate) fn new(initial: Duration) -> Ewma {
        Ewma {
            nanos: std::sync::atomic::AtomicU64::new(initial.as_nanos() as u64),
            warming: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// An average that is `initial` until the first sample, a guess rather than a
    /// measurement: the first sample replaces it, and the next ones make a plain mean with it
    /// until there are [`EWMA_SPAN`] of them, so that the guess need not be forgotten an
    /// eighth at a time. (Draining 10,000 no-op jobs at concurrency 1, the worker's first
    /// claims stayed small for tens of milliseconds while a guess of 10 ms per job faded.)
    pub(crate) fn guess(initial: Duration) -> Ewma {
        let e = Ewma::new(initial);
        e.warming.store(EWMA_SPAN, Ordering::Relaxed);
        e
    }

    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Moves the average an eighth of the way towards `sample` (while an average made by
    /// [`Ewma::guess`] warms up: a 1/n of the way, for its n-th sample).
    pub(crate) fn observe(&self, sample: Duration) {
        let sample = sample.as_nanos().min(u64::MAX as u128) as i128;
        let left = self.warming.load(Ordering::Relaxed);
        let weight = if left > 0 {
            self.warming.store(left - 1, Ordering::Relaxed);
            // The n-th sample (n = EWMA_SPAN - left + 1) weighs 1/n.
            (EWMA_SPAN - left + 1) as i128
        } else {
            EWMA_SPAN as i128
        };
        let old = self.nanos.load(Ordering::Relaxed) as i128;
        let new = old + (sample - old) / weight;
        self.nanos.store(new.max(0) as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fast_jobs_are_claimed_in_large_batches_slow_ones_one_ahead() {
        // No-op jobs, 10 ms claims: as many as allowed.
        assert_eq!(
            adaptive_prefetch(1, Duration::from_nanos(100), 10 * MS),
            MAX_PREFETCH
        );
        // 5 µs jobs, 1 ms claims: two claims' worth.
        assert_eq!(adaptive_prefetch(1, Duration::from_micros(5), MS), 400);
        // 1 ms jobs, 1 ms claims, 4 threads: 2 round-trips of work for 4 threads.
        assert_eq!(adaptive_prefetch(4, MS, MS), 8);
        // Slow jobs: one ahead, never more.
        assert_eq!(adaptive_prefetch(16, Duration::from_secs(2), MS), 1);
        assert_eq!(adaptive_prefetch(1, Duration::ZERO, Duration::ZERO), 1);
    }

    #[test]
    fn a_guessed_average_is_replaced_by_the_first_samples_then_moves_by_an_eighth() {
        let e = Ewma::guess(10 * MS);
        assert_eq!(e.get(), 10 * MS);
        e.observe(Duration::from_micros(4));
        assert_eq!(
            e.get(),
            Duration::from_micros(4),
            "the first sample replaces the guess"
        );
        e.observe(Duration::from_micros(8));
        assert_eq!(e.get(), Duration::from_micros(6), "two samples: their mean");
        for _ in 0..6 {
            e.observe(Duration::from_micros(6));
        }
        assert_eq!(
            e.get(),
            Duration::from_micros(6),
            "eight samples: their mean"
        );
        // Warm now: an eighth of the way.
        e.observe(Duration::from_micros(14));
        assert_eq!(e.get(), Duration::from_micros(7));
    }

    #[test]
    fn large_arguments_bound_the_adaptive_prefetch() {
        let fast = adaptive_prefetch(4, Duration::from_nanos(100), 10 * MS);
        let b = MAX_PREFETCH_BYTES;
        assert_eq!(bounded_prefetch(fast, 100, b), MAX_PREFETCH);
        assert_eq!(bounded_prefetch(fast, 1 << 20, b), 64);
        assert_eq!(bounded_prefetch(fast, usize::MAX, b), 1);
        assert_eq!(bounded_prefetch(3, 1 << 20, b), 3);
    }

    #[test]
    fn ewma_moves_an_eighth_of_the_way() {
        let e = Ewma::new(Duration::from_millis(80));
        e.observe(Duration::ZERO);
        assert_eq!(e.get(), Duration::from_millis(70));
        for _ in 0..200 {
            e.observe(Duration::from_millis(8));
        }
        assert!(e.get() < Duration::from_millis(9), "{:?}", e.get());
    }
}
